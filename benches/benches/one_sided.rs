//! One-sided provider operations against two-sided ones, the provider alone (no
//! connection layer), in one harness so that the figures compare like with like: two
//! endpoints of one provider, the bench on this thread and its peer on another, each
//! side reading every byte it receives.
//!
//! - `transport/one_sided/send/{loopback,shm}/{64,65536,1048576}`: one-way time (round
//!   trip / 2) of a message sent into a posted receive and echoed back from the buffer
//!   it arrived in.
//! - `transport/one_sided/write_imm/...`: the same with a write with an immediate into a
//!   range the other side exposed (each side posts a zero-length receive for the
//!   immediate), echoed back by a write from the range it arrived in.
//! - `transport/one_sided/read/{loopback,shm}/{65536,1048576}`: the time of one read of
//!   the peer's exposed range into a local buffer, then checked; the peer's thread does
//!   nothing meanwhile (a read takes no work of the side read from). It is a round trip,
//!   so it compares with twice a `send` one-way time.
//!
//! The shm pair here is two endpoints of one process (`ShmProvider::pair`), so the
//! figures differ from `transport/pingpong_endpoint`'s, whose peer is another process.
//! Readings go to `docs/benchmarks.md`.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use tierbuf_pool::{MemoryBudget, OwnedSlot, SlotPool};
use tierbuf_transport::{
    Access, BufferRef, Completion, Endpoint, LoopbackProvider, Provider, QueueKind, RemoteBuffer,
    ShmProvider,
};

const SIZES: [usize; 3] = [64, 64 * 1024, 1024 * 1024];
const READ_SIZES: [usize; 2] = [64 * 1024, 1024 * 1024];
const BUDGET: u64 = 1 << 30;
const DEPTH: u32 = 16;

/// How a session carries its message.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Way {
    Send,
    WriteImm,
    Read,
}

/// One side: its endpoint, the slot messages arrive in (exposed for writes and reads in
/// the one-sided ways), and the slot it sends from.
struct Side<E> {
    endpoint: E,
    inbox: OwnedSlot,
    /// A zero-length buffer for the immediates' receives.
    signal: OwnedSlot,
    completions: [Completion; 8],
    /// This side's completed requests, not yet waited for.
    done: std::collections::VecDeque<Completion>,
    /// The byte counts of the messages arrived, not yet waited for.
    arrived: std::collections::VecDeque<u32>,
}

impl<E: Endpoint> Side<E> {
    fn new(endpoint: E, pool: &SlotPool) -> Side<E> {
        Side {
            endpoint,
            inbox: pool.try_acquire_owned().expect("a slot"),
            signal: pool.try_acquire_owned().expect("a slot"),
            completions: [Completion::default(); 8],
            done: Default::default(),
            arrived: Default::default(),
        }
    }

    /// Posts the receive the next message (or immediate) lands in.
    fn post_receive(&mut self, way: Way) {
        let buffer = match way {
            Way::Send => BufferRef::from(&self.inbox),
            _ => BufferRef::from(&self.signal).prefix(0).expect("empty"),
        };
        // SAFETY: the buffer is read only after its completion is polled.
        unsafe { self.endpoint.post_recv(buffer, 0) }.expect("post a receive");
    }

    /// Sends (or writes into `peer`) the first `len` bytes of the inbox.
    fn echo(&mut self, way: Way, len: usize, peer: RemoteBuffer, imm: u32) {
        let message = BufferRef::from(&self.inbox)
            .prefix(len as u32)
            .expect("the message fits");
        // SAFETY: the inbox is not written until the send's completion is polled.
        unsafe {
            match way {
                Way::Send => self.endpoint.post_send(&[message], 1),
                _ => self.endpoint.post_write(
                    &[message],
                    peer.slice(0, len as u32).expect("the range fits"),
                    Some(imm),
                    1,
                ),
            }
        }
        .expect("post the message");
    }

    /// Polls once, counting this side's completed requests and queueing what arrived.
    fn poll_once(&mut self) {
        let ready = self.endpoint.poll(&mut self.completions).expect("poll");
        for done in &self.completions[..ready] {
            assert!(done.status.is_success(), "{done:?}");
            match done.opcode.queue() {
                QueueKind::Send => self.done.push_back(*done),
                QueueKind::Recv => self.arrived.push_back(done.byte_len),
            }
        }
    }

    /// Polls until a message has arrived (or `stop` is set); returns its byte count.
    fn wait_arrival(&mut self, stop: Option<&AtomicBool>) -> Option<u32> {
        loop {
            if let Some(len) = self.arrived.pop_front() {
                return Some(len);
            }
            if stop.is_some_and(|stop| stop.load(Ordering::Relaxed)) {
                return None;
            }
            self.poll_once();
        }
    }

    /// Polls until this side's oldest request outstanding has completed.
    fn wait_done(&mut self) -> Completion {
        loop {
            if let Some(done) = self.done.pop_front() {
                return done;
            }
            self.poll_once();
        }
    }
}

/// Checks the first `len` bytes against `expected` with `seq` in its first eight: every
/// byte is read, as the receiver of an MPI ping-pong that checks its data reads them.
fn check(bytes: &[u8], seq: u64, expected: &[u8]) {
    debug_assert_eq!(bytes.len(), expected.len());
    let stamp = bytes.len().min(8);
    assert_eq!(bytes[..stamp], seq.to_le_bytes()[..stamp], "stale message");
    assert!(bytes[stamp..] == expected[stamp..], "corrupt message");
}

fn stamp(slot: &mut [u8], seq: u64) {
    let stamp = slot.len().min(8);
    slot[..stamp].copy_from_slice(&seq.to_le_bytes()[..stamp]);
}

/// Runs one session of `way` and `len` bytes between two endpoints of `provider`.
fn session<P: Provider>(
    c: &mut criterion::BenchmarkGroup<'_, criterion::measurement::WallTime>,
    provider: &P,
    pair: impl FnOnce() -> (P::Endpoint, P::Endpoint),
    way: Way,
    len: usize,
) where
    P::Endpoint: 'static,
{
    // A pool per side: an shm region is shared with one peer only.
    let pool = || SlotPool::new(&*provider.registrar(), SIZES[2], 3).expect("slots");
    let (near_pool, far_pool) = (pool(), pool());
    let (near, far) = pair();
    let (mut near, mut far) = (Side::new(near, &near_pool), Side::new(far, &far_pool));
    let expected = expected_of(len);
    let access = if way == Way::Read {
        Access::Read
    } else {
        Access::Write
    };
    // SAFETY: each side reads its inbox only after the immediate of the write into it
    // has completed, and the read's target is written only before it is exposed.
    let (near_remote, far_remote) = unsafe {
        (
            near.endpoint
                .expose(BufferRef::from(&near.inbox), access)
                .expect("expose"),
            far.endpoint
                .expose(BufferRef::from(&far.inbox), access)
                .expect("expose"),
        )
    };
    let provider_name = provider.name();
    let name = match way {
        Way::Send => "send",
        Way::WriteImm => "write_imm",
        Way::Read => "read",
    };
    let stop = Arc::new(AtomicBool::new(false));
    let echo = if way == Way::Read {
        far.inbox[..len].copy_from_slice(&expected);
        None
    } else {
        far.post_receive(way);
        let stop = Arc::clone(&stop);
        Some(std::thread::spawn(move || {
            let expected = expected_of(len);
            while let Some(byte_len) = far.wait_arrival(Some(&stop)) {
                assert_eq!(byte_len as usize, len);
                let mut word = [0u8; 8];
                let stamped = len.min(8);
                word[..stamped].copy_from_slice(&far.inbox[..stamped]);
                let seq = u64::from_le_bytes(word);
                check(&far.inbox[..len], seq, &expected);
                far.post_receive(way);
                far.echo(way, len, near_remote, seq as u32);
                far.wait_done();
            }
            far
        }))
    };
    let mut into = near_pool.try_acquire_owned().expect("a slot");
    let mut seq = 1u64;
    // The message's bytes after its stamp: the echo brings them back unchanged.
    near.inbox[..len].copy_from_slice(&expected);
    near.post_receive(way);
    c.throughput(Throughput::Bytes(len as u64));
    c.bench_function(
        BenchmarkId::new(format!("{name}/{provider_name}"), len),
        |bench| {
            bench.iter_custom(|iters| {
                let start = Instant::now();
                for _ in 0..iters {
                    seq += 1;
                    match way {
                        Way::Read => {
                            let part = far_remote.slice(0, len as u32).expect("fits");
                            let local = BufferRef::from(&into).prefix(len as u32).expect("fits");
                            // SAFETY: `into` is read only after the read's completion.
                            unsafe { near.endpoint.post_read(local, part, 2) }.expect("read");
                            let done = near.wait_done();
                            assert_eq!(done.byte_len as usize, len);
                            assert!(into[..len] == expected[..], "corrupt read");
                        }
                        _ => {
                            stamp(&mut near.inbox[..len], seq);
                            near.echo(way, len, far_remote, seq as u32);
                            near.wait_done();
                            let byte_len = near.wait_arrival(None).expect("the echo");
                            assert_eq!(byte_len as usize, len);
                            check(&near.inbox[..len], seq, &expected);
                            near.post_receive(way);
                        }
                    }
                }
                let elapsed = start.elapsed();
                if way == Way::Read {
                    elapsed
                } else {
                    elapsed / 2
                }
            })
        },
    );
    stop.store(true, Ordering::Relaxed);
    if let Some(echo) = echo {
        drop(echo.join().expect("the echo thread"));
    }
    into.fill(0);
}

/// The bytes after the stamp of a message of `len` bytes.
fn expected_of(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i * 7 + 3) as u8).collect()
}

fn one_sided(c: &mut Criterion) {
    let mut group = c.benchmark_group("transport/one_sided");
    group.measurement_time(Duration::from_secs(3));
    let loopback = LoopbackProvider::new(MemoryBudget::with_cap(BUDGET));
    let shm = ShmProvider::new(MemoryBudget::with_cap(BUDGET));
    for len in SIZES {
        for way in [Way::Send, Way::WriteImm] {
            session(
                &mut group,
                &loopback,
                || loopback.pair(DEPTH, DEPTH).unwrap(),
                way,
                len,
            );
            session(
                &mut group,
                &shm,
                || shm.pair(DEPTH, DEPTH).unwrap(),
                way,
                len,
            );
        }
    }
    for len in READ_SIZES {
        session(
            &mut group,
            &loopback,
            || loopback.pair(DEPTH, DEPTH).unwrap(),
            Way::Read,
            len,
        );
        session(
            &mut group,
            &shm,
            || shm.pair(DEPTH, DEPTH).unwrap(),
            Way::Read,
            len,
        );
    }
    group.finish();
}

criterion_group!(benches, one_sided);
criterion_main!(benches);
