//! The client: [`KvClient`] makes one request at a time on a connection, and
//! [`run_workload`] drives a [`Workload`] over many: it writes a mixed set of values,
//! reads every key back and checks every byte, deletes some and checks they are gone,
//! then stays idle while the tiers come down, sampling registered memory throughout.

use std::ops::Deref;
use std::time::{Duration, Instant};

use tierbuf_pool::MemoryBudget;
use tierbuf_transport::Endpoint;
use tierbuf_transport::connection::{Connection, Message};

use super::KvError;
use super::memory::{Sampler, Series, now_micros};
use super::server::SAMPLE_PERIOD;
use super::wire::{self, REPLY_HEADER_LEN, Reply, Request, Status};

/// A value read from the server, in place in the reply's receive slot.
#[derive(Debug)]
pub struct Value {
    reply: Message,
}

impl Deref for Value {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        &self.reply[REPLY_HEADER_LEN..]
    }
}

/// One connection's client: a request, then its reply, at a time.
#[derive(Debug)]
pub struct KvClient<E: Endpoint> {
    index: usize,
    connection: Connection<E>,
    request: Vec<u8>,
    timeout: Duration,
    /// When each promotion of this connection, either way, was first seen (after the
    /// call that saw it), in microseconds since the Unix epoch.
    promoted_at: Vec<u64>,
    /// This side's promotions and receive tier as last seen.
    seen: (u64, u8),
}

impl<E: Endpoint> KvClient<E> {
    /// A client on `connection` (connection `index` of its run, for errors), waiting up to
    /// `timeout` for each reply.
    pub fn new(index: usize, connection: Connection<E>, timeout: Duration) -> KvClient<E> {
        KvClient {
            index,
            connection,
            request: Vec::new(),
            timeout,
            promoted_at: Vec::new(),
            seen: (0, 0),
        }
    }

    /// The connection, for its counters.
    pub fn connection(&self) -> &Connection<E> {
        &self.connection
    }

    /// Stores `value` under `key`.
    ///
    /// # Errors
    ///
    /// Sending, receiving or reading the reply; [`KvError::Refused`] unless it is OK.
    pub fn put(&mut self, key: &[u8], value: &[u8]) -> Result<(), KvError> {
        let reply = self.call(Request::Put { key, value })?;
        self.expect("PUT", key, &reply, &[Status::Ok]).map(drop)
    }

    /// The value under `key`, if there is one.
    ///
    /// # Errors
    ///
    /// As [`KvClient::put`].
    pub fn get(&mut self, key: &[u8]) -> Result<Option<Value>, KvError> {
        let reply = self.call(Request::Get { key })?;
        match self.expect("GET", key, &reply, &[Status::Ok, Status::NotFound])? {
            Status::Ok => Ok(Some(Value { reply })),
            _ => Ok(None),
        }
    }

    /// Removes `key`; whether it was there.
    ///
    /// # Errors
    ///
    /// As [`KvClient::put`].
    pub fn delete(&mut self, key: &[u8]) -> Result<bool, KvError> {
        let reply = self.call(Request::Delete { key })?;
        let status = self.expect("DELETE", key, &reply, &[Status::Ok, Status::NotFound])?;
        Ok(status == Status::Ok)
    }

    /// The server's samples of its registered memory so far.
    ///
    /// # Errors
    ///
    /// As [`KvClient::put`].
    pub fn stats(&mut self) -> Result<Series, KvError> {
        let reply = self.call(Request::Stats)?;
        self.expect("STATS", b"", &reply, &[Status::Ok])?;
        let samples =
            wire::decode_samples(&reply[REPLY_HEADER_LEN..]).map_err(|source| KvError::Wire {
                connection: self.index,
                source,
            })?;
        Ok(Series { samples })
    }

    /// Keeps the connection going, receiving nothing, until `until`: its tiers come down
    /// meanwhile.
    ///
    /// # Errors
    ///
    /// [`KvError::Receive`] when it fails; [`KvError::Wire`] for a message nobody asked
    /// for.
    pub fn idle(&mut self, until: Instant) -> Result<(), KvError> {
        match self.connection.recv_deadline(until) {
            Ok(None) => Ok(()),
            Ok(Some(message)) => Err(KvError::Wire {
                connection: self.index,
                source: Reply::decode(&message)
                    .err()
                    .unwrap_or(wire::WireError::Unexpected {
                        operation: 0,
                        what: "reply",
                    }),
            }),
            Err(source) => Err(KvError::Receive {
                connection: self.index,
                source,
            }),
        }
    }

    /// Sends `request` and waits for its reply.
    fn call(&mut self, request: Request<'_>) -> Result<Message, KvError> {
        request.encode(&mut self.request);
        let connection = self.index;
        self.connection
            .send(&self.request)
            .map_err(|source| KvError::Send { connection, source })?;
        let replied = self.connection.recv_deadline(Instant::now() + self.timeout);
        self.note_promotions();
        match replied {
            Ok(Some(reply)) => Ok(reply),
            Ok(None) => Err(KvError::NoReply {
                connection,
                waited: self.timeout,
            }),
            Err(source) => Err(KvError::Receive { connection, source }),
        }
    }

    /// Notes the time of the promotions since the last look: this side's sends promoted,
    /// or its receive tier raised for the peer's.
    fn note_promotions(&mut self) {
        let stats = self.connection.stats();
        let (promotions, recv_tier) = self.seen;
        let new = stats.tiers.promotions.saturating_sub(promotions)
            + u64::from(stats.recv_tier.saturating_sub(recv_tier));
        let now = now_micros();
        self.promoted_at
            .extend(std::iter::repeat_n(now, new as usize));
        self.seen = (stats.tiers.promotions, stats.recv_tier);
    }

    /// The status of `reply` to `request` of `key`, if it is one of `allowed`.
    fn expect(
        &self,
        request: &'static str,
        key: &[u8],
        reply: &[u8],
        allowed: &[Status],
    ) -> Result<Status, KvError> {
        let reply = Reply::decode(reply).map_err(|source| KvError::Wire {
            connection: self.index,
            source,
        })?;
        if allowed.contains(&reply.status) {
            return Ok(reply.status);
        }
        Err(KvError::Refused {
            request,
            key: String::from_utf8_lossy(key).into_owned(),
            status: reply.status,
            message: String::from_utf8_lossy(reply.body).into_owned(),
        })
    }
}

/// What the client writes, reads back and deletes, on each connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Workload {
    /// Keys written on each connection.
    pub keys: usize,
    /// Every this many keys, one is large: past the top tier, up to `max_value`.
    pub large_every: usize,
    /// Every this many keys, one is medium: 4 KiB to 1 MiB.
    pub medium_every: usize,
    /// The largest value, at least 16 bytes and at most [`wire::MAX_VALUE_LEN`].
    pub max_value: usize,
    /// Every this many keys, one is deleted (and checked gone).
    pub delete_every: usize,
    /// How long the client stays idle at the end, for the tiers to come down.
    pub idle: Duration,
    /// Chooses the sizes and the bytes.
    pub seed: u64,
    /// How long the client waits for each reply.
    pub reply_timeout: Duration,
}

/// The smallest value.
pub const MIN_VALUE: usize = 16;
/// Values this large or smaller are small.
pub const SMALL_MAX: usize = 4 << 10;
/// Values larger than this are large: the `storage` ladder's top tier's slot.
pub const MEDIUM_MAX: usize = 1 << 20;

impl Workload {
    /// The key of value `index` on connection `connection`.
    pub fn key(connection: usize, index: usize) -> Vec<u8> {
        format!("c{connection:03}/k{index:06}").into_bytes()
    }

    /// The length of value `index` on connection `connection`.
    pub fn len(&self, connection: usize, index: usize) -> usize {
        let random = mix(self.seed ^ ((connection as u64) << 32) ^ index as u64);
        let (low, high) =
            if self.large_every > 0 && index % self.large_every == self.large_every / 2 {
                (MEDIUM_MAX + 1, self.max_value)
            } else if self.medium_every > 0 && index % self.medium_every == 1 {
                (SMALL_MAX + 1, MEDIUM_MAX)
            } else {
                (MIN_VALUE, SMALL_MAX)
            };
        let high = high.min(self.max_value);
        let low = low.min(high);
        low + (random % (high - low + 1) as u64) as usize
    }

    /// Value `index` on connection `connection`: its length's worth of bytes that depend
    /// on the seed, the connection and the index.
    pub fn value(&self, connection: usize, index: usize) -> Vec<u8> {
        let len = self.len(connection, index);
        let mut state = mix(!self.seed ^ ((connection as u64) << 40) ^ index as u64) | 1;
        let mut value = Vec::with_capacity(len.next_multiple_of(8));
        while value.len() < len {
            // xorshift64
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            value.extend_from_slice(&state.to_le_bytes());
        }
        value.truncate(len);
        value
    }

    /// Whether value `index` is one of those deleted.
    pub fn deleted(&self, index: usize) -> bool {
        self.delete_every > 0 && index.is_multiple_of(self.delete_every)
    }
}

/// splitmix64's finaliser: a well-mixed 64-bit value from any.
fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// One phase's figures, over every connection.
#[derive(Debug, Clone, PartialEq)]
pub struct Phase {
    /// Its name: `put`, `get`, `delete` or `idle`.
    pub name: &'static str,
    /// When it began, in microseconds since the Unix epoch.
    pub from_micros: u64,
    /// When it ended, likewise.
    pub to_micros: u64,
    /// Requests made.
    pub ops: u64,
    /// Value bytes carried (written for `put`, read for `get`).
    pub bytes: u64,
}

impl Phase {
    /// Its length.
    pub fn elapsed(&self) -> Duration {
        Duration::from_micros(self.to_micros - self.from_micros)
    }

    /// Requests a second.
    pub fn ops_per_second(&self) -> f64 {
        self.ops as f64 / self.elapsed().as_secs_f64().max(1e-9)
    }

    /// Value megabytes (10^6 bytes) a second.
    pub fn megabytes_per_second(&self) -> f64 {
        self.bytes as f64 / 1e6 / self.elapsed().as_secs_f64().max(1e-9)
    }
}

/// What a run of the workload measured.
#[derive(Debug, Clone)]
pub struct Outcome {
    /// The phases, in order: put, get, delete, idle.
    pub phases: Vec<Phase>,
    /// Registered memory over the run, both sides added where they are two processes.
    pub memory: Series,
    /// Promotions over every client connection.
    pub promotions: u64,
    /// When the client connections' promotions, either way, were seen, in microseconds
    /// since the Unix epoch, earliest first.
    pub promoted_at: Vec<u64>,
    /// Demotions over every client connection.
    pub demotions: u64,
}

impl Outcome {
    /// Registered bytes when the first phase began.
    pub fn start(&self) -> u64 {
        self.memory.at(self.phases[0].from_micros)
    }

    /// The most registered bytes at once over the run.
    pub fn peak(&self) -> u64 {
        let last = self.phases.last().expect("a run has phases");
        self.memory.peak(self.phases[0].from_micros, last.to_micros)
    }

    /// Registered bytes at the end of the idle phase.
    pub fn after_idle(&self) -> u64 {
        let last = self.phases.last().expect("a run has phases");
        self.memory.at(last.to_micros)
    }
}

/// Runs `workload` over `connections`, each on a thread of its own, phase by phase. The
/// server's registered memory comes from its STATS; `local` is this side's budget where it
/// is not the server's (two processes), sampled here and added.
///
/// # Errors
///
/// The first failure of a call, or of a check: a value missing or differing, a deleted key
/// still there ([`KvError::Mismatch`]).
pub fn run_workload<E: Endpoint>(
    connections: Vec<Connection<E>>,
    workload: &Workload,
    local: Option<MemoryBudget>,
) -> Result<Outcome, KvError> {
    let sampler = local.map(|budget| Sampler::start(budget, SAMPLE_PERIOD));
    // The first sample is taken: the start of the first phase has one.
    std::thread::sleep(SAMPLE_PERIOD * 2);
    let mut clients: Vec<KvClient<E>> = connections
        .into_iter()
        .enumerate()
        .map(|(index, connection)| KvClient::new(index, connection, workload.reply_timeout))
        .collect();
    let mut phases = Vec::new();
    phases.push(phase(&mut clients, "put", |c, client| {
        put_all(c, client, workload)
    })?);
    phases.push(phase(&mut clients, "get", |c, client| {
        get_all(c, client, workload)
    })?);
    phases.push(phase(&mut clients, "delete", |c, client| {
        delete_some(c, client, workload)
    })?);
    let until = Instant::now() + workload.idle;
    phases.push(phase(&mut clients, "idle", |_, client| {
        client.idle(until).map(|()| (0, 0))
    })?);
    let server = clients[0].stats()?;
    let memory = match &sampler {
        Some(sampler) => server.sum(&Series {
            samples: sampler.samples(),
        }),
        None => server,
    };
    let (promotions, demotions) = clients.iter().fold((0, 0), |(up, down), client| {
        let stats = client.connection().stats();
        (up + stats.tiers.promotions, down + stats.tiers.demotions)
    });
    let mut promoted_at: Vec<u64> = clients
        .iter()
        .flat_map(|client| client.promoted_at.iter().copied())
        .collect();
    promoted_at.sort_unstable();
    Ok(Outcome {
        phases,
        memory,
        promotions,
        promoted_at,
        demotions,
    })
}

/// Runs `work` on every client, each on a thread of its own; its figures are the sum of
/// each client's (requests, bytes).
fn phase<E: Endpoint>(
    clients: &mut [KvClient<E>],
    name: &'static str,
    work: impl Fn(usize, &mut KvClient<E>) -> Result<(u64, u64), KvError> + Sync,
) -> Result<Phase, KvError> {
    let from_micros = now_micros();
    let work = &work;
    let results: Vec<Result<(u64, u64), KvError>> = std::thread::scope(|scope| {
        let threads: Vec<_> = clients
            .iter_mut()
            .enumerate()
            .map(|(index, client)| scope.spawn(move || work(index, client)))
            .collect();
        threads
            .into_iter()
            .map(|thread| thread.join().unwrap_or(Err(KvError::Panicked("client"))))
            .collect()
    });
    let to_micros = now_micros();
    let (mut ops, mut bytes) = (0, 0);
    for result in results {
        let (o, b) = result?;
        ops += o;
        bytes += b;
    }
    Ok(Phase {
        name,
        from_micros,
        to_micros,
        ops,
        bytes,
    })
}

fn put_all<E: Endpoint>(
    connection: usize,
    client: &mut KvClient<E>,
    workload: &Workload,
) -> Result<(u64, u64), KvError> {
    let mut bytes = 0;
    for index in 0..workload.keys {
        let value = workload.value(connection, index);
        client.put(&Workload::key(connection, index), &value)?;
        bytes += value.len() as u64;
    }
    Ok((workload.keys as u64, bytes))
}

fn get_all<E: Endpoint>(
    connection: usize,
    client: &mut KvClient<E>,
    workload: &Workload,
) -> Result<(u64, u64), KvError> {
    let mut bytes = 0;
    for index in 0..workload.keys {
        let key = Workload::key(connection, index);
        let got = client.get(&key)?.ok_or_else(|| mismatch(&key, "missing"))?;
        let want = workload.value(connection, index);
        if got.len() != want.len() {
            return Err(mismatch(
                &key,
                &format!("{} bytes read, {} written", got.len(), want.len()),
            ));
        }
        if let Some(at) = got.iter().zip(&want).position(|(a, b)| a != b) {
            return Err(mismatch(&key, &format!("byte {at} differs")));
        }
        bytes += got.len() as u64;
    }
    Ok((workload.keys as u64, bytes))
}

fn delete_some<E: Endpoint>(
    connection: usize,
    client: &mut KvClient<E>,
    workload: &Workload,
) -> Result<(u64, u64), KvError> {
    let mut ops = 0;
    for index in (0..workload.keys).filter(|&index| workload.deleted(index)) {
        let key = Workload::key(connection, index);
        if !client.delete(&key)? {
            return Err(mismatch(&key, "not there to delete"));
        }
        if client.get(&key)?.is_some() {
            return Err(mismatch(&key, "still there after DELETE"));
        }
        ops += 2;
    }
    Ok((ops, 0))
}

fn mismatch(key: &[u8], problem: &str) -> KvError {
    KvError::Mismatch {
        key: String::from_utf8_lossy(key).into_owned(),
        problem: problem.to_owned(),
    }
}
