//! The shared-memory provider across two real processes: this test binary starts itself
//! again as the peer (chosen by `TIERBUF_SHM_ROLE`), so each test is one parent process
//! and one child process connected through a Unix-domain socket and shared memory.
//!
//! - random sizes from empty to four times the top tier, across promotions, demotions
//!   and segmentation, echoed back: every message arrives once, in order, byte for byte;
//! - a peer whose budget refuses promotion (a nack): messages still arrive, segmented;
//! - a table's progress thread driving 16 connections to the peer process, four
//!   messages in flight on each, its users calling only `try_send` and `next_delivered`:
//!   every echo arrives in order, byte for byte, and every registered byte comes back;
//! - batches of messages (`send_batch`, `try_send_batch`) both ways, up to 64 in flight,
//!   small ones sharing packed frames: every echo arrives once, in order, byte for byte;
//! - a peer whose worker threads send through `Sender`s while its own thread drives the
//!   connection, small messages among promoted and segmented ones: each worker's
//!   messages arrive once, in order, byte for byte, and small ones queued together
//!   shared packed frames (the peer reports its count);
//! - a peer that dies in the middle of a promotion: the survivor gets a clear error;
//! - a message longer than the posted receive: an error on both sides, nothing written;
//! - one-sided writes with immediates and a read into and out of ranges the peer process
//!   exposed (their keys sent in a message): the bytes land where written, before each
//!   immediate completes at the peer, and a write with a key the peer revoked is refused
//!   on both sides and touches nothing;
//! - a process at its limit of open files, handed a memory file by its peer (a region
//!   announced, or the hello of a connection it accepts): a local-resource error, not a
//!   protocol violation of the peer.

mod errors;
mod pairs;
mod traffic;

use errors::chain;
use pairs::Shared;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::sync::Arc;
use std::time::{Duration, Instant};
use traffic::{pattern, sizes};

use libtest_mimic::{Arguments, Failed, Trial};
use tierbuf_pool::{MemoryBudget, SlotPool};
use tierbuf_tiers::ladder::TierLadder;
use tierbuf_transport::connection::{Connection, ConnectionTable, ProgressConfig, SendError};
use tierbuf_transport::{
    Access, BufferRef, Completion, CompletionStatus, Endpoint, EndpointState, Opcode, Provider,
    RemoteBuffer, ShmEndpoint, ShmProvider, TransportError,
};

const ROLE: &str = "TIERBUF_SHM_ROLE";
const SOCKET: &str = "TIERBUF_SHM_SOCKET";
const MESSAGES: usize = 300;

fn main() {
    if let Ok(role) = std::env::var(ROLE) {
        let socket = PathBuf::from(std::env::var(SOCKET).expect("the socket path"));
        run_peer(&role, &socket);
        return;
    }
    let trials = vec![
        Trial::test(
            "random_sizes_across_promotions_and_demotions_arrive_once_in_order",
            random_sizes_arrive_once_in_order,
        ),
        Trial::test(
            "a_peer_that_refuses_promotion_still_gets_every_message",
            a_peer_that_refuses_promotion_still_gets_every_message,
        ),
        Trial::test(
            "a_progress_thread_serves_many_connections_to_another_process",
            a_progress_thread_serves_many_connections_to_another_process,
        ),
        Trial::test(
            "batches_in_flight_both_ways_arrive_once_in_order",
            batches_in_flight_both_ways_arrive_once_in_order,
        ),
        Trial::test(
            "messages_from_a_peers_worker_threads_arrive_in_order_per_worker",
            messages_from_a_peers_worker_threads_arrive_in_order_per_worker,
        ),
        Trial::test(
            "a_peer_that_dies_mid_promotion_is_reported",
            a_peer_that_dies_mid_promotion_is_reported,
        ),
        Trial::test(
            "a_message_longer_than_the_posted_receive_is_a_length_error",
            a_message_longer_than_the_posted_receive_is_a_length_error,
        ),
        Trial::test(
            "one_sided_writes_and_reads_reach_the_peer_processs_exposures_while_in_force",
            one_sided_writes_and_reads_reach_the_peer_processs_exposures_while_in_force,
        ),
        Trial::test(
            "a_region_announced_to_a_process_out_of_files_is_a_local_resource_error",
            a_region_announced_to_a_process_out_of_files_is_a_local_resource_error,
        ),
        Trial::test(
            "a_hello_accepted_by_a_process_out_of_files_is_a_local_resource_error",
            a_hello_accepted_by_a_process_out_of_files_is_a_local_resource_error,
        ),
    ];
    libtest_mimic::run(&Arguments::from_args(), trials).exit();
}

/// The peer's side of each test.
fn run_peer(role: &str, socket: &Path) {
    match role {
        "echo" => echo(socket, 64 << 20),
        "echo-small-budget" => echo(socket, SMALL_BUDGET),
        "echo-many" => echo_many(socket),
        "echo-batched" => echo_batched(socket),
        "send-from-workers" => send_from_workers(socket),
        "die-mid-promotion" => die_mid_promotion(socket),
        "short-receive" => short_receive(socket),
        "one-sided-target" => one_sided_target(socket),
        "send-out-of-files" => send_out_of_files(socket),
        "accept-out-of-files" => accept_out_of_files(socket),
        other => panic!("unknown role {other}"),
    }
}

/// Room for tier 0 (receive and send slots, 2 KiB each, charged a page each) and nothing
/// larger.
const SMALL_BUDGET: u64 = 2 * 4096;

fn ladder() -> Arc<TierLadder> {
    Arc::new(
        pairs::three_tiers()
            .reservoir_regions(1)
            .demote_after(Duration::from_millis(5))
            .hysteresis(Duration::from_millis(1))
            .build()
            .expect("a valid ladder"),
    )
}

fn connection(provider: &ShmProvider, endpoint: ShmEndpoint) -> Connection<ShmEndpoint> {
    Shared::new(provider, ladder()).connection(endpoint)
}

/// A listener at a fresh path and the peer process started against it.
struct Session {
    provider: ShmProvider,
    listener: tierbuf_transport::ShmListener,
    child: Child,
}

impl Session {
    fn start(role: &str, budget: u64) -> Session {
        let path =
            std::env::temp_dir().join(format!("tierbuf-test-{}-{role}.sock", std::process::id()));
        let _ = std::fs::remove_file(&path);
        let provider = ShmProvider::new(MemoryBudget::with_cap(budget));
        let listener = provider.listen(&path).expect("listen");
        let child = Command::new(std::env::current_exe().expect("this test binary"))
            .env(ROLE, role)
            .env(SOCKET, &path)
            .spawn()
            .expect("start the peer process");
        Session {
            provider,
            listener,
            child,
        }
    }

    fn accept(&self) -> ShmEndpoint {
        self.listener.accept(32, 32).expect("accept the peer")
    }

    /// Waits for the peer and fails unless it exited as `expected` says.
    fn finish(mut self, succeeded: bool) -> Result<(), Failed> {
        let status = self.child.wait().map_err(|e| e.to_string())?;
        if status.success() != succeeded {
            return Err(format!("the peer process exited with {status}").into());
        }
        Ok(())
    }

    /// Waits for the peer to exit cleanly, then fails unless every byte this side
    /// registered came back (call it once this side's connections are dropped).
    fn finish_with_every_byte_back(self) -> Result<(), Failed> {
        let budget = self.provider.registrar().budget().clone();
        self.finish(true)?;
        if budget.in_use() != 0 {
            return Err(format!("{} registered bytes left", budget.in_use()).into());
        }
        Ok(())
    }
}

/// Sends the peer its goodbye (an empty message) and flushes, so that it can close.
fn say_goodbye(connection: &mut Connection<ShmEndpoint>) -> Result<(), Failed> {
    connection.send(&[]).map_err(|e| e.to_string())?;
    connection.flush().map_err(|e| e.to_string())?;
    Ok(())
}

fn echo(socket: &Path, budget: u64) {
    let provider = ShmProvider::new(MemoryBudget::with_cap(budget));
    let endpoint = provider.connect(socket, 32, 32).expect("connect");
    echo_on(connection(&provider, endpoint), MESSAGES);
}

/// Echoes `count` messages of `sizes(count, 65536)` on `connection`, then waits for the
/// parent's goodbye and close.
fn echo_on(mut connection: Connection<ShmEndpoint>, count: usize) {
    for (index, &len) in sizes(count, 65536).iter().enumerate() {
        let message = connection.recv().expect("a message");
        assert_eq!(message.len(), len, "message {index}");
        assert!(
            message[..] == pattern(len, index as u64)[..],
            "message {index} differs"
        );
        let copy = message.to_vec();
        drop(message);
        connection.send(&copy).expect("echo");
    }
    flush_until_goodbye(connection);
}

/// Flushes the echoes, then waits for the parent's goodbye (an empty message) and its
/// close: the parent closes first, so that no echo is cut off by this side's close.
fn flush_until_goodbye(mut connection: Connection<ShmEndpoint>) {
    connection.flush().expect("flush");
    assert_eq!(connection.recv().expect("goodbye").len(), 0);
    while connection.progress().is_ok() {}
    assert_eq!(connection.endpoint().state(), EndpointState::PeerClosed);
}

/// Connections the progress-thread test opens, and messages each one echoes.
const MANY_CONNECTIONS: usize = 16;
const MANY_MESSAGES: usize = 100;
const IN_FLIGHT: usize = 4;

/// `MANY_CONNECTIONS` connections, each echoed on a thread of its own.
fn echo_many(socket: &Path) {
    let provider = ShmProvider::new(MemoryBudget::with_cap(256 << 20));
    let echoes: Vec<_> = (0..MANY_CONNECTIONS)
        .map(|_| {
            let endpoint = provider.connect(socket, 32, 32).expect("connect");
            let connection = connection(&provider, endpoint);
            std::thread::spawn(move || echo_on(connection, MANY_MESSAGES))
        })
        .collect();
    for echo in echoes {
        echo.join().expect("an echo thread");
    }
}

fn a_progress_thread_serves_many_connections_to_another_process() -> Result<(), Failed> {
    let session = Session::start("echo-many", 256 << 20);
    let table = ConnectionTable::with_progress_thread(ProgressConfig::default())
        .map_err(|e| e.to_string())?;
    let served: Vec<_> = (0..MANY_CONNECTIONS)
        .map(|_| table.insert(connection(&session.provider, session.accept())))
        .collect();
    let sizes = sizes(MANY_MESSAGES, 65536);
    let (mut sent, mut received) = (vec![0; MANY_CONNECTIONS], vec![0; MANY_CONNECTIONS]);
    let deadline = Instant::now() + Duration::from_secs(60);
    while received.iter().any(|&count| count < MANY_MESSAGES) {
        if Instant::now() > deadline {
            return Err(format!("stalled: sent {sent:?}, received {received:?}").into());
        }
        for (index, shared) in served.iter().enumerate() {
            // Only `try_send` and `next_delivered`: the table's thread does the progress.
            let mut connection = shared.lock().map_err(|e| e.to_string())?;
            while sent[index] < MANY_MESSAGES && sent[index] - received[index] < IN_FLIGHT {
                let message = pattern(sizes[sent[index]], sent[index] as u64);
                match connection.try_send(&message) {
                    Ok(_) => sent[index] += 1,
                    Err(SendError::WouldBlock(_)) => break,
                    Err(error) => return Err(chain(&error).into()),
                }
            }
            while let Some(echoed) = connection.next_delivered() {
                let at = received[index];
                if echoed[..] != pattern(sizes[at], at as u64)[..] {
                    return Err(format!("connection {index}: echo {at} differs").into());
                }
                received[index] += 1;
            }
        }
        std::thread::yield_now();
    }
    for shared in &served {
        let mut connection = shared.lock().map_err(|e| e.to_string())?;
        say_goodbye(&mut connection)?;
    }
    drop((served, table));
    session.finish_with_every_byte_back()
}

/// Echoes `MESSAGES` messages of `sizes(MESSAGES, 65536)`, each batch of them that has
/// arrived sent back with one `send_batch`; then waits for the goodbye and the close.
fn echo_batched(socket: &Path) {
    let provider = ShmProvider::new(MemoryBudget::with_cap(64 << 20));
    let endpoint = provider.connect(socket, 32, 32).expect("connect");
    let mut connection = connection(&provider, endpoint);
    let sizes = sizes(MESSAGES, 65536);
    let mut index = 0;
    while index < MESSAGES {
        let mut batch = vec![connection.recv().expect("a message").to_vec()];
        while index + batch.len() < MESSAGES {
            match connection.next_delivered() {
                Some(message) => batch.push(message.to_vec()),
                None => break,
            }
        }
        for message in &batch {
            assert!(
                message[..] == pattern(sizes[index], index as u64)[..],
                "message {index} differs"
            );
            index += 1;
        }
        let refs: Vec<&[u8]> = batch.iter().map(Vec::as_slice).collect();
        connection.send_batch(&refs).expect("echo the batch");
    }
    flush_until_goodbye(connection);
}

/// Messages the parent lets be in flight in the batch test.
const BATCH_WINDOW: usize = 64;

fn batches_in_flight_both_ways_arrive_once_in_order() -> Result<(), Failed> {
    let session = Session::start("echo-batched", 64 << 20);
    let mut connection = connection(&session.provider, session.accept());
    let messages: Vec<Vec<u8>> = sizes(MESSAGES, 65536)
        .into_iter()
        .enumerate()
        .map(|(index, len)| pattern(len, index as u64))
        .collect();
    let (mut sent, mut received) = (0, 0);
    let deadline = Instant::now() + Duration::from_secs(60);
    while received < MESSAGES {
        if Instant::now() > deadline {
            return Err(format!("stalled: sent {sent}, received {received}").into());
        }
        let end = MESSAGES.min(received + BATCH_WINDOW);
        if sent < end {
            let batch: Vec<&[u8]> = messages[sent..end].iter().map(Vec::as_slice).collect();
            match connection.try_send_batch(&batch) {
                Ok(taken) => sent += taken,
                Err(SendError::WouldBlock(_)) => {}
                Err(error) => return Err(chain(&error).into()),
            }
        }
        while let Some(echoed) = connection.try_recv().map_err(|e| chain(&*e))? {
            if echoed[..] != messages[received][..] {
                return Err(format!("echo {received} differs").into());
            }
            received += 1;
        }
    }
    let stats = connection.stats();
    if stats.messages_packed == 0 {
        return Err(format!("no message shared a frame: {stats:?}").into());
    }
    say_goodbye(&mut connection)?;
    drop(connection);
    session.finish_with_every_byte_back()
}

/// Worker threads of the peer in the senders test, and the messages each sends.
const WORKERS: u8 = 3;
const WORKER_MESSAGES: u32 = 200;

/// Worker `worker`'s message `index`: mostly small, every 25th past the smallest tier
/// (a promotion), every 100th past the top tier (segmented); its index in its first four
/// bytes, the worker in the rest.
fn worker_message(worker: u8, index: u32) -> Vec<u8> {
    let len = match index % 100 {
        99 => 70_000,
        n if n % 25 == 24 => 1000,
        n => 8 + (n % 40) as usize,
    };
    let mut bytes = vec![worker; len];
    bytes[..4].copy_from_slice(&index.to_le_bytes());
    bytes
}

/// `WORKERS` threads send `WORKER_MESSAGES` each through `Sender`s while this thread
/// drives the connection (waiting for messages that never come, waking for what the
/// workers queue); then this thread sends how many messages shared a frame, and waits for
/// the goodbye and the close.
fn send_from_workers(socket: &Path) {
    let provider = ShmProvider::new(MemoryBudget::with_cap(64 << 20));
    let endpoint = provider.connect(socket, 32, 32).expect("connect");
    let mut connection = connection(&provider, endpoint);
    let workers: Vec<_> = (0..WORKERS)
        .map(|worker| {
            let mut sender = connection.sender();
            std::thread::spawn(move || {
                for index in 0..WORKER_MESSAGES {
                    sender
                        .send(&worker_message(worker, index))
                        .expect("queue a message");
                }
            })
        })
        .collect();
    while workers.iter().any(|worker| !worker.is_finished()) {
        let nothing = connection
            .recv_deadline(Instant::now() + Duration::from_millis(5))
            .expect("drive the connection");
        assert!(
            nothing.is_none(),
            "the parent sends nothing before its goodbye"
        );
    }
    for worker in workers {
        worker.join().expect("a worker");
    }
    connection.flush().expect("flush what the workers queued");
    let packed = connection.stats().messages_packed;
    connection.send(&packed.to_le_bytes()).expect("the report");
    flush_until_goodbye(connection);
}

fn messages_from_a_peers_worker_threads_arrive_in_order_per_worker() -> Result<(), Failed> {
    let session = Session::start("send-from-workers", 64 << 20);
    let mut connection = connection(&session.provider, session.accept());
    let mut next = [0u32; WORKERS as usize];
    let deadline = Instant::now() + Duration::from_secs(60);
    for _ in 0..u32::from(WORKERS) * WORKER_MESSAGES {
        let received = connection
            .recv_deadline(deadline)
            .map_err(|e| chain(&*e))?
            .ok_or_else(|| format!("stalled: {next:?} came"))?;
        let worker = received[received.len() - 1];
        let Some(&index) = next.get(usize::from(worker)) else {
            return Err(format!("a message of {} bytes from no worker", received.len()).into());
        };
        if received[..] != worker_message(worker, index)[..] {
            return Err(
                format!("worker {worker}'s message {index} is not the one that came").into(),
            );
        }
        next[usize::from(worker)] += 1;
    }
    let report = connection
        .recv_deadline(deadline)
        .map_err(|e| chain(&*e))?
        .ok_or("no report")?;
    let packed = u64::from_le_bytes(report[..].try_into().map_err(|_| "a report of 8 bytes")?);
    // Its receive slot keeps its region registered while it lives.
    drop(report);
    if packed == 0 {
        return Err("no message of the peer's workers shared a frame".into());
    }
    say_goodbye(&mut connection)?;
    drop(connection);
    session.finish_with_every_byte_back()
}

fn exchange(session: &Session) -> Result<Connection<ShmEndpoint>, Failed> {
    let mut connection = connection(&session.provider, session.accept());
    for (index, &len) in sizes(MESSAGES, 65536).iter().enumerate() {
        let message = pattern(len, index as u64);
        connection.send(&message).map_err(|e| e.to_string())?;
        let echoed = connection.recv().map_err(|e| e.to_string())?;
        if echoed[..] != message[..] {
            return Err(format!("echo {index} of {len} bytes differs").into());
        }
        if index % 50 == 49 {
            // Quiet for longer than `demote_after`, so the connection steps down.
            let quiet = Instant::now() + Duration::from_millis(20);
            while Instant::now() < quiet {
                connection.progress().map_err(|e| e.to_string())?;
            }
        }
    }
    say_goodbye(&mut connection)?;
    Ok(connection)
}

fn random_sizes_arrive_once_in_order() -> Result<(), Failed> {
    let session = Session::start("echo", 64 << 20);
    let connection = exchange(&session)?;
    let stats = connection.stats();
    if stats.tiers.promotions == 0 || stats.tiers.demotions == 0 {
        return Err(format!("expected promotions and demotions: {stats:?}").into());
    }
    drop(connection);
    session.finish_with_every_byte_back()
}

fn a_peer_that_refuses_promotion_still_gets_every_message() -> Result<(), Failed> {
    let session = Session::start("echo-small-budget", 64 << 20);
    let connection = exchange(&session)?;
    let stats = connection.stats();
    if stats.tiers.nacks == 0 {
        return Err(format!("expected the peer to refuse promotion: {stats:?}").into());
    }
    drop(connection);
    session.finish(true)
}

fn die_mid_promotion(socket: &Path) {
    let provider = ShmProvider::new(MemoryBudget::with_cap(64 << 20));
    let endpoint = provider.connect(socket, 32, 32).expect("connect");
    let mut connection = connection(&provider, endpoint);
    assert_eq!(&connection.recv().expect("hello")[..], b"hello");
    // The parent's large message asks this side to provision a larger tier; die as
    // soon as it has, before the message arrives.
    loop {
        connection.progress().expect("progress");
        if connection.stats().recv_tier > 0 {
            std::process::abort();
        }
    }
}

fn a_peer_that_dies_mid_promotion_is_reported() -> Result<(), Failed> {
    let session = Session::start("die-mid-promotion", 64 << 20);
    let mut connection = connection(&session.provider, session.accept());
    connection.send(b"hello").map_err(|e| e.to_string())?;
    let large = pattern(10_000, 1);
    let deadline = Instant::now() + Duration::from_secs(30);
    let error = loop {
        let step = connection
            .send(&large)
            .map_err(|e| chain(&e))
            .and_then(|()| connection.recv().map(drop).map_err(|e| chain(&*e)));
        if let Err(error) = step {
            break error;
        }
        if Instant::now() > deadline {
            return Err("the dead peer was never reported".into());
        }
    };
    if !error.contains("peer process died") {
        return Err(format!("unclear error: {error}").into());
    }
    drop(connection);
    session.finish(false)
}

fn short_receive(socket: &Path) {
    let provider = ShmProvider::new(MemoryBudget::with_cap(1 << 20));
    let pool = SlotPool::new(&*provider.registrar(), 256, 1).expect("a pool");
    let mut inbox = pool.try_acquire_owned().expect("a slot");
    inbox.fill(0xEE);
    let mut endpoint = provider.connect(socket, 4, 4).expect("connect");
    let buffer = BufferRef::from(&inbox).prefix(100).expect("100 bytes");
    // SAFETY: `inbox` is read only after its completion has been polled.
    unsafe { endpoint.post_recv(buffer, 1) }.expect("post the receive");
    let completion = poll_one(&mut endpoint);
    assert_eq!(completion.status, CompletionStatus::LocalLengthError);
    assert_eq!(endpoint.state(), EndpointState::Broken);
    assert!(
        inbox.iter().all(|&byte| byte == 0xEE),
        "the buffer was written"
    );
}

fn poll_one(endpoint: &mut ShmEndpoint) -> Completion {
    let mut completions = [Completion::default(); 1];
    let deadline = Instant::now() + Duration::from_secs(30);
    while Instant::now() < deadline {
        if endpoint.poll(&mut completions).expect("poll") == 1 {
            return completions[0];
        }
        std::thread::yield_now();
    }
    panic!("no completion");
}

fn a_message_longer_than_the_posted_receive_is_a_length_error() -> Result<(), Failed> {
    let session = Session::start("short-receive", 1 << 20);
    let pool = SlotPool::new(&*session.provider.registrar(), 256, 1).map_err(|e| e.to_string())?;
    let message = pool.try_acquire_owned().ok_or("a slot")?;
    let mut endpoint = session.accept();
    let buffer = BufferRef::from(&message).prefix(101).ok_or("101 bytes")?;
    // SAFETY: `message` is left alone until its completion has been polled.
    unsafe { endpoint.post_send(&[buffer], 7) }.map_err(|e| e.to_string())?;
    let completion = poll_one(&mut endpoint);
    let expected = Completion {
        wr_id: 7,
        byte_len: 0,
        status: CompletionStatus::RemoteInvalidRequest,
        opcode: Opcode::Send,
    };
    if completion != expected {
        return Err(format!("{completion:?}").into());
    }
    session.finish(true)
}

/// The pieces the one-sided test writes: each `PIECE` bytes at `index * PIECE` of the
/// target's window, the immediate its index.
const PIECES: u32 = 4;
const PIECE: u32 = 1000;
/// The seed of the bytes the target exposes for reading.
const READABLE_SEED: u64 = 99;

/// Writes `remote` into the first 16 bytes of `out`: key, length, address.
fn encode(remote: RemoteBuffer, out: &mut [u8]) {
    out[..4].copy_from_slice(&remote.key.to_le_bytes());
    out[4..8].copy_from_slice(&remote.len.to_le_bytes());
    out[8..16].copy_from_slice(&remote.addr.to_le_bytes());
}

fn decode(bytes: &[u8]) -> RemoteBuffer {
    RemoteBuffer {
        key: u32::from_le_bytes(bytes[..4].try_into().expect("4 bytes")),
        len: u32::from_le_bytes(bytes[4..8].try_into().expect("4 bytes")),
        addr: u64::from_le_bytes(bytes[8..16].try_into().expect("8 bytes")),
    }
}

/// The target of `one_sided_writes_and_reads_...`: exposes a window for writing and a
/// range for reading, sends their descriptors, checks each written piece when its
/// immediate arrives, revokes the window, says so, and checks that the write the
/// parent then tries breaks the connection and leaves the window as it was.
fn one_sided_target(socket: &Path) {
    let provider = ShmProvider::new(MemoryBudget::with_cap(1 << 20));
    let pool = SlotPool::new(&*provider.registrar(), 4096, 4).expect("a pool");
    let mut slots = std::iter::from_fn(|| pool.try_acquire_owned());
    let (window, mut readable, mut out, signal) = (
        slots.next().expect("a slot"),
        slots.next().expect("a slot"),
        slots.next().expect("a slot"),
        slots.next().expect("a slot"),
    );
    readable.copy_from_slice(&pattern(4096, READABLE_SEED));
    let mut endpoint = provider.connect(socket, 8, 8).expect("connect");
    // SAFETY: the window is read only once the immediate of each write into it has
    // completed, or the connection is broken; `readable` is not written while exposed.
    let (to_write, to_read) = unsafe {
        (
            endpoint.expose(BufferRef::from(&window), Access::Write),
            endpoint.expose(BufferRef::from(&readable), Access::Read),
        )
    };
    let to_write = to_write.expect("expose the window");
    encode(to_write, &mut out[..16]);
    encode(
        to_read.expect("expose the readable range"),
        &mut out[16..32],
    );
    let zero = BufferRef::from(&signal).prefix(0).expect("empty");
    // SAFETY: the receives are empty; `out` is not written until its send completes.
    unsafe {
        for index in 0..PIECES {
            endpoint
                .post_recv(zero, u64::from(index))
                .expect("post a receive");
        }
        endpoint
            .post_send(&[BufferRef::from(&out).prefix(32).expect("32 bytes")], 100)
            .expect("send the descriptors");
    }
    let mut arrived = 0;
    while arrived < PIECES {
        let done = poll_one(&mut endpoint);
        assert!(done.status.is_success(), "{done:?}");
        if let Opcode::RecvWithImm(imm) = done.opcode {
            assert_eq!((imm, done.byte_len), (arrived, PIECE), "{done:?}");
            let at = (imm * PIECE) as usize;
            let expected = pattern(PIECE as usize, u64::from(imm));
            assert!(
                window[at..at + PIECE as usize] == expected[..],
                "piece {imm}"
            );
            arrived += 1;
        }
    }
    endpoint.revoke(to_write).expect("revoke the window");
    // SAFETY: as above.
    unsafe { endpoint.post_send(&[BufferRef::from(&out).prefix(1).expect("1 byte")], 101) }
        .expect("say the window is revoked");
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut completions = [Completion::default(); 4];
    while endpoint.state() != EndpointState::Broken {
        assert!(
            Instant::now() < deadline,
            "the refused write did not break the connection"
        );
        let _ = endpoint.poll(&mut completions);
        std::thread::yield_now();
    }
    let first = pattern(PIECE as usize, 0);
    assert!(
        window[..PIECE as usize] == first[..],
        "the refused write touched the window"
    );
}

fn one_sided_writes_and_reads_reach_the_peer_processs_exposures_while_in_force()
-> Result<(), Failed> {
    let session = Session::start("one-sided-target", 1 << 20);
    let pool = SlotPool::new(&*session.provider.registrar(), 4096, 6).map_err(|e| e.to_string())?;
    let mut slots = std::iter::from_fn(|| pool.try_acquire_owned());
    let inbox = slots.next().ok_or("a slot")?;
    let mut endpoint = session.accept();
    // SAFETY: every buffer posted below is left alone until its completion is polled.
    unsafe { endpoint.post_recv(BufferRef::from(&inbox), 1) }.map_err(|e| e.to_string())?;
    let done = poll_one(&mut endpoint);
    if done.byte_len != 32 {
        return Err(format!("the descriptors: {done:?}").into());
    }
    let (window, readable) = (decode(&inbox[..16]), decode(&inbox[16..32]));
    let mut pieces = Vec::new();
    for index in 0..PIECES {
        let mut piece = slots.next().ok_or("a slot")?;
        piece[..PIECE as usize].copy_from_slice(&pattern(PIECE as usize, u64::from(index)));
        let at = window
            .slice(index * PIECE, PIECE)
            .ok_or("inside the window")?;
        let gather = [BufferRef::from(&piece).prefix(PIECE).ok_or("a piece")?];
        // SAFETY: as above.
        unsafe { endpoint.post_write(&gather, at, Some(index), u64::from(10 + index)) }
            .map_err(|e| e.to_string())?;
        pieces.push(piece);
    }
    for index in 0..PIECES {
        let done = poll_one(&mut endpoint);
        if (done.wr_id, done.opcode, done.status)
            != (
                u64::from(10 + index),
                Opcode::Write,
                CompletionStatus::Success,
            )
        {
            return Err(format!("write {index}: {done:?}").into());
        }
    }
    let into = pieces.pop().ok_or("a slot")?;
    // SAFETY: as above.
    unsafe { endpoint.post_read(BufferRef::from(&into), readable, 20) }
        .map_err(|e| e.to_string())?;
    let done = poll_one(&mut endpoint);
    if (done.opcode, done.byte_len) != (Opcode::Read, 4096)
        || into[..] != pattern(4096, READABLE_SEED)[..]
    {
        return Err(format!("the read: {done:?}").into());
    }
    // SAFETY: as above.
    unsafe { endpoint.post_recv(BufferRef::from(&inbox), 2) }.map_err(|e| e.to_string())?;
    poll_one(&mut endpoint);
    let late = BufferRef::from(&pieces[1]).prefix(PIECE).ok_or("a piece")?;
    let first = window.slice(0, PIECE).ok_or("inside the window")?;
    // SAFETY: as above.
    unsafe { endpoint.post_write(&[late], first, None, 30) }.map_err(|e| e.to_string())?;
    let done = poll_one(&mut endpoint);
    if done.status != CompletionStatus::RemoteAccessError {
        return Err(format!("a write with a revoked key: {done:?}").into());
    }
    drop(endpoint);
    session.finish(true)
}

/// Lowers this process's limit of open files (`RLIMIT_NOFILE`) so that `room` more can be
/// opened: every descriptor below the new limit but those is in use.
fn limit_open_files(room: u64) {
    use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};
    let lowest_free = rustix::io::fcntl_dupfd_cloexec(std::io::stderr(), 0).expect("a descriptor");
    let in_use = lowest_free.as_raw_fd() as u64;
    drop(lowest_free);
    let limit = Rlimit {
        current: Some(in_use + room),
        maximum: getrlimit(Resource::Nofile).maximum,
    };
    setrlimit(Resource::Nofile, limit).expect("a lower limit of open files");
}

/// Fails unless `error` is a local-resource error whose source is `EMFILE`.
fn assert_out_of_files(error: &TransportError) {
    let text = chain(error);
    let TransportError::LocalResource { source, .. } = error else {
        panic!("not a local-resource error: {text}");
    };
    assert_eq!(
        source.raw_os_error(),
        Some(rustix::io::Errno::MFILE.raw_os_error()),
        "{text}"
    );
    assert!(text.contains("RLIMIT_NOFILE"), "{text}");
}

/// Connects, then runs out of open files and sends: the peer's receive lies in a region
/// it announces with its memory file, which this process cannot take.
fn send_out_of_files(socket: &Path) {
    let provider = ShmProvider::new(MemoryBudget::with_cap(1 << 20));
    let pool = SlotPool::new(&*provider.registrar(), 4096, 1).expect("a pool");
    let message = pool.try_acquire_owned().expect("a slot");
    let mut endpoint = provider.connect(socket, 4, 4).expect("connect");
    limit_open_files(0);
    // SAFETY: `message` is left alone until the endpoint is gone.
    unsafe { endpoint.post_send(&[BufferRef::from(&message)], 1) }.expect("post the send");
    let mut completions = [Completion::default(); 1];
    let deadline = Instant::now() + Duration::from_secs(30);
    let error = loop {
        match endpoint.poll(&mut completions) {
            Err(error) => break error,
            Ok(_) if Instant::now() > deadline => panic!("no error"),
            Ok(_) => std::thread::yield_now(),
        }
    };
    assert_out_of_files(&error);
    assert_eq!(endpoint.state(), EndpointState::Broken);
}

fn a_region_announced_to_a_process_out_of_files_is_a_local_resource_error() -> Result<(), Failed> {
    let session = Session::start("send-out-of-files", 1 << 20);
    let pool = SlotPool::new(&*session.provider.registrar(), 4096, 1).map_err(|e| e.to_string())?;
    let inbox = pool.try_acquire_owned().ok_or("a slot")?;
    let mut endpoint = session.accept();
    // SAFETY: `inbox` is not read; the endpoint is dropped before it.
    unsafe { endpoint.post_recv(BufferRef::from(&inbox), 1) }.map_err(|e| e.to_string())?;
    let finished = session.finish(true);
    drop(endpoint);
    finished
}

/// Listens at `socket`, then runs out of open files but the one the connection takes:
/// the peer's hello carries the connection segment's memory file.
fn accept_out_of_files(socket: &Path) {
    let provider = ShmProvider::new(MemoryBudget::with_cap(1 << 20));
    let listener = provider.listen(socket).expect("listen");
    limit_open_files(1);
    let error = listener
        .accept(4, 4)
        .expect_err("a handshake without its segment");
    assert_out_of_files(&error);
}

fn a_hello_accepted_by_a_process_out_of_files_is_a_local_resource_error() -> Result<(), Failed> {
    let path = std::env::temp_dir().join(format!(
        "tierbuf-test-{}-accept-out-of-files.sock",
        std::process::id()
    ));
    let _ = std::fs::remove_file(&path);
    let mut child = Command::new(std::env::current_exe().map_err(|e| e.to_string())?)
        .env(ROLE, "accept-out-of-files")
        .env(SOCKET, &path)
        .spawn()
        .map_err(|e| e.to_string())?;
    let provider = ShmProvider::new(MemoryBudget::with_cap(1 << 20));
    let deadline = Instant::now() + Duration::from_secs(30);
    // Until the peer listens, connecting finds no socket.
    let refused = loop {
        match provider.connect(&path, 4, 4) {
            Err(TransportError::Provider { .. }) if Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(10));
            }
            Err(error) => break chain(&error),
            Ok(_) => return Err("the peer accepted without the segment".into()),
        }
    };
    if !refused.contains("closed the socket before its welcome") {
        return Err(format!("unexpected error: {refused}").into());
    }
    let status = child.wait().map_err(|e| e.to_string())?;
    if !status.success() {
        return Err(format!("the peer process exited with {status}").into());
    }
    Ok(())
}
