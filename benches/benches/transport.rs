//! Connections over a provider: latency, bandwidth and the cost of a promotion.
//!
//! Two providers run side by side in `transport/pingpong` and `transport/stream`, one
//! function per provider with the message size as parameter, each size's `shm` right
//! after its `loopback` (`transport/pingpong/loopback/64`, `transport/pingpong/shm/64`):
//! `loopback` between two threads of this process, and `shm` (shared memory) between
//! this process and a peer process, with the same ladder, connection layer and messages,
//! so the figures compare. The `shm` figures are the ones to hold against Open MPI's and
//! UCX's shared-memory transports (`benches/run-comparison` runs `pingpong_consumed/shm`
//! beside them and writes `docs/benchmarks.md`); `transport/pingpong_endpoint` has the shm
//! provider alone.
//!
//! - `transport/pingpong`: one-way latency (round trip / 2) of a message echoed back,
//!   64 B to 1 MiB; the echo side runs on the other core.
//! - `transport/pingpong_endpoint`: the `shm` provider's own one-way latency, 64 B and
//!   64 KiB, with no connection layer: the bench and its peer process post sends and
//!   receives of registered slots on a `ShmEndpoint` and poll it directly (the peer
//!   echoes from the buffer the message arrived in), so the difference to
//!   `transport/pingpong/shm` is what the connection layer costs. This is the figure to
//!   hold against an MPI or UCX shared-memory pingpong; its throughput is the size over
//!   the one-way time, with one message in flight. `transport/pingpong_endpoint/shm_copied/64`
//!   is the floor under a connection's 64 B one-way time: the provider alone carrying
//!   what a connection's frame of a 64 B message is (a 16-byte header and the 64 bytes,
//!   two parts) as the connection sends it, copied by the provider from the sender's
//!   bytes (`Endpoint::try_post_send_copied`, inline in the ring entry), each side
//!   reaping its completions and posting its receive again, and nothing else.
//! - `transport/stream`: bandwidth of a stream of messages (a window of them in flight,
//!   bounded by the receiver's credits: the slot count of the tier, less the one credit
//!   kept back), receiver on the other core; the time runs from the first `send` to the
//!   last delivery (for `shm`, on the monotonic clock both processes share: the peer
//!   reads it after checking the last message and sends it back).
//!   `transport/stream/shm_in_place` (8 KiB and 64 KiB) sends the same messages
//!   built in their registered send slots (`Connection::reserve`), so the only copy is
//!   the provider's into the peer's receive. The message is written whole into a slot the
//!   first time the bench meets that slot; after that each send rewrites the slot's first
//!   64 bytes (which control and command frames may have used meanwhile) and restamps
//!   the sequence number, leaving the rest as it stands, as an MPI or UCX bandwidth bench
//!   sends an unchanged buffer. The peer checks every message as in `stream/shm`.
//!   `transport/stream/shm_batched` and `transport/stream_consumed/shm_batched` (64 B)
//!   send the same messages 64 at a time with one `Connection::send_batch`, as Open MPI's
//!   bandwidth bench posts a window of 64 `MPI_Isend`s before it waits: the messages of
//!   a call share packed frames (`docs/connection.md`, rule 12), and the peer still
//!   receives and checks each one as a message of its own. A batch of 64 is more than a
//!   tier-0 frame holds, so batches promote the connection to the 8 KiB tier, where a
//!   frame carries a whole batch; the function warms up with batches until neither
//!   side's tier changes, and the tiers are checked as for the others.
//! - `transport/pingpong_consumed` and `transport/stream_consumed`: the same as
//!   `transport/pingpong` and `transport/stream`, but every receiver reads every byte of
//!   every message (sums it as 64-bit words and compares the sum with the sender's), so
//!   the messages end read by the receiving core, as an MPI receive ends with the bytes
//!   in the receiver's buffer. These are the figures to hold against MPI and UCX
//!   bandwidth and latency; `transport/stream` and `transport/pingpong` measure delivery
//!   into a registered receive slot (zero-copy), whose receiver checks only a message's
//!   length, sequence number, middle and last bytes, so most of a large message's cache
//!   lines may never reach the receiving core there.
//! - `transport/promotion`: from the first `send` of an 8 KiB message on a fresh tier-0
//!   connection to its delivery, against the same message on an already-promoted
//!   connection, over loopback and over shm within one process. The first message goes
//!   out in segments on tier 0 while the promotion is negotiated in band beside it (the new
//!   receives posted from the reservoir); the promotion's landing is waited for
//!   outside the timed part. One thread drives both sides in both functions, so the ratio
//!   is the protocol's cost, not a cross-core one; a fresh pair is built for every
//!   `first_oversize` message, outside the timed part, from one provider and reservoir
//!   for the whole group, as a service's connections are: the send regions a dropped pair
//!   gives back are the next pair's, and the reservoir is refilled (untimed) where an shm
//!   pair's receive regions, which its peer mapped, were deregistered. `first_fitting`
//!   is the like-for-like reference: the same message as the first of a fresh pair whose
//!   only tier holds it whole, so no promotion is needed; a fresh pair's first message
//!   pays for what its first use touches, whatever its size. `promotion_lands` is the
//!   part `first_oversize` leaves out: from that message's delivery until the sender's
//!   promotion has landed (the peer provisioned the tier and the sender installed it), so
//!   what waiting for the promotion before sending would have cost at the least.
//!
//! The ladder's top tier holds 64 KiB whole, so 1 MiB is exposed by its sender and read by
//! the receiver (the one-sided data path's rendezvous). Every connection is warmed first, so the measured messages
//! run on the tier their size needs; that the tiers of both sides did not change while
//! measuring is checked after each size. Every delivered message is checked (length, a
//! sequence number stamped into its first 8 bytes, its middle and last bytes), so a
//! transport that loses, repeats, truncates or mixes up messages cannot produce a fast
//! figure.
//!
//! The two sides of a two-thread bench each own their connection: if either side panics,
//! its connection is dropped, the other side's next call fails instead of waiting
//! forever, and the panic reaches criterion. No thread outlives a measurement.
//!
//! The `shm` peer is this binary started again (`TIERBUF_BENCH_PEER` names its role,
//! checked first in `main`), once per function and size, pinned to core 1 while the
//! bench runs on core 0; it lives only while its function runs, so it never competes with
//! a loopback measurement. Before each batch of criterion's the bench tells the peer what
//! to do with the batch's messages (echo them or take them) and waits for its answer, so
//! neither is timed. The peer exits when the bench closes the connection, and with an
//! error if the bench process dies (the shm provider reports a peer whose socket closed),
//! so it never outlives the bench.
//!
//! Run: `cargo bench -p tierbuf-benches --bench transport`; only the shm functions:
//! `... -- /shm/`.

use std::collections::HashSet;
use std::hint::black_box;
use std::panic::resume_unwind;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Barrier, mpsc};
use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group};
use tierbuf_benches::messages::{Reading, check, message, rest_sum, stamp};
use tierbuf_benches::{clock, connect, pin_to_core};
use tierbuf_pool::{MemoryBudget, OwnedSlot, Registrar, SlotPool};
use tierbuf_tiers::Reservoir;
use tierbuf_tiers::ladder::TierLadder;
use tierbuf_transport::connection::{
    Connection, ConnectionConfig, ConnectionError, ConnectionStats, DataPath, HEADER_LEN, SendError,
};
use tierbuf_transport::{
    BufferRef, Completion, CompletionStatus, Endpoint, EndpointState, LoopbackEndpoint,
    LoopbackProvider, Opcode, Provider, QueueKind, ShmEndpoint, ShmProvider,
};

const SIZES: [usize; 5] = [64, 1024, 8 * 1024, 64 * 1024, 1024 * 1024];

/// Messages a `shm_batched` stream hands over in one `send_batch`: the window of Open
/// MPI's bandwidth bench (`MPI_Isend`s posted before it waits).
const BATCH_WINDOW: usize = 64;

/// The largest size of `shm_batched`: messages whose entries, two or more, fit a tier-0
/// frame of the bench ladder (480 bytes), so that they share frames.
const BATCHED_MAX: usize = 232;

/// The sizes of `transport/pingpong_endpoint`.
const ENDPOINT_SIZES: [usize; 2] = [64, 64 * 1024];

/// The size of `transport/pingpong_endpoint/shm_copied`.
const ENDPOINT_COPIED_SIZE: usize = 64;

/// How `transport/pingpong_endpoint` sends a message.
#[derive(Clone, Copy, PartialEq, Eq)]
enum EndpointSend {
    /// Posted from the registered slot that holds it (`shm`).
    Registered,
    /// A frame's header and the message, copied by the provider from the sender's bytes
    /// (`shm_copied`).
    Copied,
}

impl EndpointSend {
    /// The peer process's role for sessions that send this way.
    fn role(self) -> &'static str {
        match self {
            EndpointSend::Registered => "endpoint",
            EndpointSend::Copied => "endpoint_copied",
        }
    }

    /// The bytes on the wire for a message of `size` bytes.
    fn wire_len(self, size: usize) -> usize {
        match self {
            EndpointSend::Registered => size,
            EndpointSend::Copied => HEADER_LEN + size,
        }
    }
}

/// The receives each side of `transport/pingpong_endpoint` keeps posted: one takes the
/// next message while the other's buffer is being echoed.
const ENDPOINT_RECEIVES: usize = 2;

/// The messages `transport/stream/shm_in_place` builds in a send slot: from where a copy
/// costs more than the bench's own bookkeeping, to what one frame of the ladder's top
/// tier carries.
const IN_PLACE_MIN: usize = 8 * 1024;
const IN_PLACE_MAX: usize = 64 * 1024;

/// The bytes at the head of a send slot that other frames (control, credit, commands)
/// may have overwritten since the slot last carried a bench message: rewritten before
/// every message built in place. Control frames are at most 64 bytes.
const IN_PLACE_HEAD: usize = 64;

/// Exchanges at most made to warm a connection up to the tier of its message.
const WARM_EXCHANGES: usize = 8;

/// The size of the `transport/promotion` message: past tier 0, within tier 1.
const PROMOTION_SIZE: usize = 8 * 1024;

/// The registration cap of each provider: far above what the ladder needs.
const BUDGET: u64 = 1 << 30;

/// The send and receive queue depth of every endpoint.
const DEPTH: u32 = 64;

type Loopback = Connection<LoopbackEndpoint>;
type Shm = Connection<ShmEndpoint>;

fn ladder() -> Arc<TierLadder> {
    // Every slot registers 64 bytes past its tier's size for the 16-byte frame header, so
    // the 8 KiB and 64 KiB tiers carry messages of 8 KiB and 64 KiB whole.
    Arc::new(
        TierLadder::builder()
            .tier(512, 16, 480)
            .tier(8192, 16, 8192)
            .tier(65536, 8, 65536)
            // Four spares a tier: enough for a pair's tier-0 regions to come back to the
            // shelf when it is dropped, so `transport/promotion` reuses warm regions.
            .reservoir_regions(4)
            .build()
            .expect("a valid ladder"),
    )
}

/// The connection settings of every bench, and a reservoir of spare tier regions
/// registered through `registrar`, already filled (so no registration is timed).
fn config_and_reservoir(registrar: Arc<dyn Registrar>) -> (Arc<ConnectionConfig>, Arc<Reservoir>) {
    config_and_reservoir_for(ladder(), registrar)
}

/// [`config_and_reservoir`] for `ladder`.
fn config_and_reservoir_for(
    ladder: Arc<TierLadder>,
    registrar: Arc<dyn Registrar>,
) -> (Arc<ConnectionConfig>, Arc<Reservoir>) {
    let config = Arc::new(ConnectionConfig::new(ladder).expect("a connection config"));
    let reservoir = Arc::new(Reservoir::new(registrar, Arc::clone(config.ladder())));
    reservoir.fill().expect("register the spares");
    (config, reservoir)
}

/// A connected pair over a fresh loopback provider, both sides on tier 0.
fn pair() -> (Loopback, Loopback) {
    let provider = LoopbackProvider::new(MemoryBudget::with_cap(BUDGET));
    let (config, reservoir) = config_and_reservoir(provider.registrar());
    let (a, b) = provider.pair(DEPTH, DEPTH).expect("a loopback pair");
    (
        connect(&config, &reservoir, a),
        connect(&config, &reservoir, b),
    )
}

/// Runs `peer` with `b` on a second thread pinned to core 1 and `main` with `a` on this
/// thread pinned to core 0, both starting behind a barrier (so neither the thread's start
/// nor its pinning is in `main`'s timing). Each side owns its connection while it runs:
/// a side that panics drops its connection, which fails the other side's next call, so a
/// failure ends the bench instead of hanging it. Returns both results and both
/// connections.
fn on_two_cores<T, U: Send>(
    mut a: Loopback,
    b: Loopback,
    peer: impl FnOnce(&mut Loopback) -> U + Send,
    main: impl FnOnce(&mut Loopback) -> T,
) -> (T, U, Loopback, Loopback) {
    let barrier = Barrier::new(2);
    std::thread::scope(|scope| {
        let barrier = &barrier;
        let peer_thread = scope.spawn(move || {
            let mut b = b;
            pin_to_core(1);
            barrier.wait();
            let result = peer(&mut b);
            (result, b)
        });
        pin_to_core(0);
        barrier.wait();
        let result = main(&mut a);
        let (peer_result, b) = peer_thread
            .join()
            .unwrap_or_else(|panic| resume_unwind(panic));
        (result, peer_result, a, b)
    })
}

/// The tier state and tier-change counters of one side.
fn tiers(stats: ConnectionStats) -> (u8, u8, u64, u64) {
    (
        stats.send_tier,
        stats.recv_tier,
        stats.tiers.promotions,
        stats.tiers.demotions,
    )
}

/// A pair of connections already on the tier a message needs, carried across the calls
/// criterion makes, with the next sequence number. The tiers seen after warming are kept
/// so that [`Warmed::finish`] can check they did not change while measuring.
struct Warmed {
    pair: Option<(Loopback, Loopback)>,
    message: Vec<u8>,
    next_seq: u64,
    tiers: [(u8, u8, u64, u64); 2],
}

impl Warmed {
    /// Sends a message of `size` bytes from one side to the other and back until neither
    /// side's tier changes from one exchange to the next, so both directions are on the
    /// tier it needs (the first oversize message goes out in segments while its promotion
    /// lands, so one exchange may leave a promotion in flight).
    fn new(size: usize) -> Warmed {
        let mut message = message(size);
        stamp(&mut message, 0);
        let (mut a, mut b) = pair();
        let expected = &message;
        let mut tiers_seen = [tiers(a.stats()), tiers(b.stats())];
        for _ in 0..WARM_EXCHANGES {
            let exchanged = on_two_cores(
                a,
                b,
                |b| {
                    let received = b.recv().expect("a message");
                    check(&received, 0, expected);
                    b.send(&received).expect("echo");
                    b.flush().expect("flush");
                },
                |a| {
                    a.send(expected).expect("send");
                    check(&a.recv().expect("the echo"), 0, expected);
                },
            );
            (a, b) = (exchanged.2, exchanged.3);
            let now = [tiers(a.stats()), tiers(b.stats())];
            if now == tiers_seen {
                break;
            }
            tiers_seen = now;
        }
        let tiers = tiers_seen;
        Warmed {
            pair: Some((a, b)),
            message,
            next_seq: 1,
            tiers,
        }
    }

    /// Takes the pair and reserves `iters` sequence numbers, the first of which it
    /// returns.
    fn take(&mut self, iters: u64) -> (Loopback, Loopback, u64) {
        let (a, b) = self
            .pair
            .take()
            .expect("the pair (lost to an earlier failure)");
        let first = self.next_seq;
        self.next_seq += iters;
        (a, b, first)
    }

    /// Checks that neither side changed tier since warming.
    fn finish(self) {
        if let Some((a, b)) = self.pair {
            assert_eq!(
                [tiers(a.stats()), tiers(b.stats())],
                self.tiers,
                "tiers (send, receive, promotions, demotions) changed while measuring"
            );
        }
    }
}

fn pingpong(c: &mut Criterion) {
    pingpong_reading(c, "transport/pingpong", Reading::Spot);
}

fn pingpong_consumed(c: &mut Criterion) {
    pingpong_reading(c, "transport/pingpong_consumed", Reading::Whole);
}

/// The pingpong group `name`, each side reading what it receives as `reading` says.
fn pingpong_reading(c: &mut Criterion, name: &str, reading: Reading) {
    let mut group = c.benchmark_group(name);
    for size in SIZES {
        let mut warmed = Warmed::new(size);
        let rest = rest_sum(&warmed.message);
        group.bench_function(BenchmarkId::new("loopback", size), |bench| {
            bench.iter_custom(|iters| {
                let (a, b, first) = warmed.take(iters);
                let mut message = warmed.message.clone();
                let expected = &warmed.message;
                let (elapsed, (), a, b) = on_two_cores(
                    a,
                    b,
                    |echo| {
                        for seq in first..first + iters {
                            let received = echo.recv().expect("a message");
                            reading.check(&received, seq, expected, rest);
                            echo.send(&received).expect("echo");
                        }
                        echo.flush().expect("flush");
                    },
                    |a| {
                        let start = Instant::now();
                        for seq in first..first + iters {
                            stamp(&mut message, seq);
                            a.send(&message).expect("send");
                            reading.check(&a.recv().expect("the echo"), seq, expected, rest);
                        }
                        start.elapsed() / 2
                    },
                );
                warmed.pair = Some((a, b));
                elapsed
            })
        });
        warmed.finish();
        let mut session = ShmSession::new(size);
        group.bench_function(BenchmarkId::new("shm", size), |bench| {
            bench.iter_custom(|iters| {
                let first = session.start_batch(PeerCommand::Echo(reading), iters);
                let ShmSession {
                    connection,
                    outgoing,
                    expected,
                    ..
                } = &mut session;
                let start = Instant::now();
                for seq in first..first + iters {
                    stamp(outgoing, seq);
                    connection.send(outgoing).expect("send");
                    let echo = connection.recv().expect("the echo");
                    reading.check(&echo, seq, expected, rest);
                }
                start.elapsed() / 2
            })
        });
        session.finish();
    }
    group.finish();
}

fn pingpong_endpoint(c: &mut Criterion) {
    let mut group = c.benchmark_group("transport/pingpong_endpoint");
    let runs = ENDPOINT_SIZES
        .map(|size| ("shm", EndpointSend::Registered, size))
        .into_iter()
        .chain([("shm_copied", EndpointSend::Copied, ENDPOINT_COPIED_SIZE)]);
    for (name, send, size) in runs {
        let mut session = EndpointSession::new(send, size);
        group.throughput(Throughput::Bytes(size as u64));
        group.bench_function(BenchmarkId::new(name, size), |bench| {
            bench.iter_custom(|iters| {
                let first = session.next_seq;
                session.next_seq += iters;
                let start = Instant::now();
                for seq in first..first + iters {
                    session.round_trip(seq);
                }
                start.elapsed() / 2
            })
        });
        session.finish();
    }
    group.finish();
}

fn stream(c: &mut Criterion) {
    stream_reading(c, "transport/stream", Reading::Spot);
}

fn stream_consumed(c: &mut Criterion) {
    stream_reading(c, "transport/stream_consumed", Reading::Whole);
}

/// The stream group `name`, the receiver reading each message as `reading` says; with
/// [`Reading::Spot`] it also has `shm_in_place`.
fn stream_reading(c: &mut Criterion, name: &str, reading: Reading) {
    let mut group = c.benchmark_group(name);
    for size in SIZES {
        let mut warmed = Warmed::new(size);
        let rest = rest_sum(&warmed.message);
        group.throughput(Throughput::Bytes(size as u64));
        group.bench_function(BenchmarkId::new("loopback", size), |bench| {
            bench.iter_custom(|iters| {
                let (a, b, first) = warmed.take(iters);
                let mut message = warmed.message.clone();
                let expected = &warmed.message;
                let (start, done, a, b) = on_two_cores(
                    a,
                    b,
                    |receiver| {
                        for seq in first..first + iters {
                            let received = receiver.recv().expect("a message");
                            reading.check(&received, seq, expected, rest);
                        }
                        Instant::now()
                    },
                    |a| {
                        let start = Instant::now();
                        for seq in first..first + iters {
                            stamp(&mut message, seq);
                            a.send(&message).expect("send");
                        }
                        a.flush().expect("flush");
                        start
                    },
                );
                warmed.pair = Some((a, b));
                done - start
            })
        });
        warmed.finish();
        let mut session = ShmSession::new(size);
        group.bench_function(BenchmarkId::new("shm", size), |bench| {
            bench.iter_custom(|iters| {
                session.time_sink(reading, iters, |connection, outgoing, seqs| {
                    for seq in seqs {
                        stamp(outgoing, seq);
                        connection.send(outgoing).expect("send");
                    }
                })
            })
        });
        if size <= BATCHED_MAX {
            let mut window = vec![session.outgoing.clone(); BATCH_WINDOW];
            // A batch is more than a tier-0 frame holds, so batches promote the connection
            // (`docs/connection.md`, rule 12): warm up with batches until neither side's
            // tier changes, and measure on that tier.
            for _ in 0..WARM_EXCHANGES {
                session.time_sink(reading, 4 * BATCH_WINDOW as u64, |connection, _, seqs| {
                    send_batched(connection, &mut window, seqs)
                });
                let now = session.tier_states();
                if now == session.tiers {
                    break;
                }
                session.tiers = now;
            }
            group.bench_function(BenchmarkId::new("shm_batched", size), |bench| {
                bench.iter_custom(|iters| {
                    session.time_sink(reading, iters, |connection, _, seqs| {
                        send_batched(connection, &mut window, seqs)
                    })
                })
            });
        }
        if reading == Reading::Spot && (IN_PLACE_MIN..=IN_PLACE_MAX).contains(&size) {
            // Messages built in their send slots: see the module documentation.
            let mut built = HashSet::new();
            group.bench_function(BenchmarkId::new("shm_in_place", size), |bench| {
                bench.iter_custom(|iters| {
                    let first = session.start_batch(PeerCommand::Sink(Reading::Spot), iters);
                    let ShmSession {
                        connection,
                        expected,
                        ..
                    } = &mut session;
                    let start = monotonic_now();
                    for seq in first..first + iters {
                        let mut buffer = connection.reserve(size).expect("reserve");
                        if built.insert(buffer.as_ptr() as usize) {
                            buffer.copy_from_slice(expected);
                        } else {
                            let head = size.min(IN_PLACE_HEAD);
                            buffer[..head].copy_from_slice(&expected[..head]);
                        }
                        stamp(&mut buffer, seq);
                        buffer.send().expect("send");
                    }
                    let done = session.report().clock;
                    done - start
                })
            });
        }
        session.finish();
    }
    group.finish();
}

/// Sends the messages numbered `seqs` on `connection`, [`BATCH_WINDOW`] to a
/// `send_batch`, each a copy of `window`'s message restamped.
fn send_batched(connection: &mut Shm, window: &mut [Vec<u8>], mut seqs: std::ops::Range<u64>) {
    while !seqs.is_empty() {
        let count = BATCH_WINDOW.min((seqs.end - seqs.start) as usize);
        for (message, seq) in window[..count].iter_mut().zip(seqs.by_ref()) {
            stamp(message, seq);
        }
        let batch: [&[u8]; BATCH_WINDOW] = std::array::from_fn(|k| &window[k][..]);
        connection
            .send_batch(&batch[..count])
            .expect("send a batch");
    }
}

/// Sends `message` from `a` and waits for it at `b`, driving both from this thread, and
/// checks it on arrival as message number `seq`.
fn deliver<E: Endpoint>(a: &mut Connection<E>, b: &mut Connection<E>, message: &[u8], seq: u64) {
    loop {
        match a.try_send(message) {
            Ok(()) => break,
            Err(SendError::WouldBlock(_)) => {
                a.progress().expect("progress");
                b.progress().expect("progress");
            }
            Err(error) => panic!("send failed: {error}"),
        }
    }
    loop {
        a.progress().expect("progress");
        if let Some(received) = b.try_recv().expect("receive") {
            check(&received, seq, message);
            black_box(&received[..]);
            return;
        }
    }
}

fn promotion(c: &mut Criterion) {
    pin_to_core(0);
    let mut group = c.benchmark_group("transport/promotion");
    let loopback = LoopbackProvider::new(MemoryBudget::with_cap(BUDGET));
    let configs = [ladder(), tier_alone(0), tier_alone(1)]
        .map(|ladder| config_and_reservoir_for(ladder, loopback.registrar()));
    promotion_over(&mut group, "loopback", &configs, |config, reservoir| {
        let (a, b) = loopback.pair(DEPTH, DEPTH).expect("a loopback pair");
        (connect(config, reservoir, a), connect(config, reservoir, b))
    });
    let shm = ShmProvider::new(MemoryBudget::with_cap(BUDGET));
    let configs = [ladder(), tier_alone(0), tier_alone(1)]
        .map(|ladder| config_and_reservoir_for(ladder, shm.registrar()));
    promotion_over(&mut group, "shm", &configs, |config, reservoir| {
        let (a, b) = shm.pair(DEPTH, DEPTH).expect("a shm pair");
        (connect(config, reservoir, a), connect(config, reservoir, b))
    });
    group.finish();
}

/// The bench ladder's tier `index` alone: on tier 0, a connection sends in segments what
/// a promoted one sends whole; on tier 1, a fresh connection sends the promotion bench's
/// message whole from its first message on.
fn tier_alone(index: usize) -> Arc<TierLadder> {
    let ladder = ladder();
    let tier = &ladder.tiers()[index];
    Arc::new(
        TierLadder::builder()
            .tier(
                tier.slot_size(),
                tier.slot_count(),
                tier.promote_threshold(),
            )
            .reservoir_regions(4)
            .build()
            .expect("a valid ladder"),
    )
}

/// `first_oversize/PROVIDER`, `promotion_lands/PROVIDER`, `already_promoted/PROVIDER`,
/// `read/PROVIDER`, `segmented/PROVIDER` and `first_fitting/PROVIDER` over pairs from
/// `connect_pair`, all drawn from one provider and reservoir per ladder, as a service's
/// connections are: the first two on the bench ladder (`configs[0]`), `read` and
/// `segmented` on its smallest tier alone (`configs[1]`), which the message never fits:
/// `read` exposes it for the peer to read every time (the one-sided data path), `segmented`
/// sends it in segments every time (the two-sided one); and `first_fitting` on its 8 KiB tier alone
/// (`configs[2]`): the first message of a fresh connection that needs no promotion, the
/// like-for-like reference of `first_oversize`.
fn promotion_over<E: Endpoint>(
    group: &mut criterion::BenchmarkGroup<'_, criterion::measurement::WallTime>,
    provider: &str,
    configs: &[(Arc<ConnectionConfig>, Arc<Reservoir>); 3],
    connect_pair: impl Fn(&Arc<ConnectionConfig>, &Arc<Reservoir>) -> (Connection<E>, Connection<E>),
) {
    let [
        (tiered, tiered_reservoir),
        (one_tier, one_tier_reservoir),
        (fitting, fitting_reservoir),
    ] = configs;
    let make_pair = || connect_pair(tiered, tiered_reservoir);
    let mut bytes = message(PROMOTION_SIZE);
    stamp(&mut bytes, 0);
    group.bench_function(BenchmarkId::new("first_oversize", provider), |bench| {
        bench.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                // Receive regions an shm peer mapped are never spares again: a service
                // refills its reservoir off the critical path, as this does untimed.
                tiered_reservoir.fill().expect("refill the reservoir");
                let (mut a, mut b) = make_pair();
                assert_eq!(a.stats().send_tier, 0, "a fresh pair starts on tier 0");
                let start = Instant::now();
                deliver(&mut a, &mut b, &bytes, 0);
                total += start.elapsed();
                // The promotion is asked for with the first message and lands after it.
                while a.stats().tiers.promotions == 0 {
                    a.progress().expect("progress");
                    b.progress().expect("progress");
                }
            }
            total
        })
    });
    group.bench_function(BenchmarkId::new("promotion_lands", provider), |bench| {
        bench.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                tiered_reservoir.fill().expect("refill the reservoir");
                let (mut a, mut b) = make_pair();
                deliver(&mut a, &mut b, &bytes, 0);
                let start = Instant::now();
                while a.stats().tiers.promotions == 0 {
                    a.progress().expect("progress");
                    b.progress().expect("progress");
                }
                total += start.elapsed();
            }
            total
        })
    });
    group.bench_function(BenchmarkId::new("first_fitting", provider), |bench| {
        bench.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                fitting_reservoir.fill().expect("refill the reservoir");
                let (mut a, mut b) = connect_pair(fitting, fitting_reservoir);
                let start = Instant::now();
                deliver(&mut a, &mut b, &bytes, 0);
                total += start.elapsed();
                assert_eq!(a.stats().messages_segmented, 0, "sent whole");
            }
            total
        })
    });
    let (mut a, mut b) = make_pair();
    deliver(&mut a, &mut b, &bytes, 0);
    while a.stats().tiers.promotions == 0 {
        a.progress().expect("progress");
        b.progress().expect("progress");
    }
    let mut seq = 0;
    steady(
        group,
        "already_promoted",
        provider,
        (&mut a, &mut b),
        &mut bytes,
        &mut seq,
    );
    let stats = a.stats();
    assert_eq!(
        (stats.tiers.promotions, stats.tiers.demotions),
        (1, 0),
        "already_promoted stayed on its tier"
    );
    let two_sided = Arc::new(ConnectionConfig::clone(one_tier).with_data_path(DataPath::TwoSided));
    for (name, config) in [("read", one_tier), ("segmented", &two_sided)] {
        let (mut a, mut b) = connect_pair(config, one_tier_reservoir);
        steady(
            group,
            name,
            provider,
            (&mut a, &mut b),
            &mut bytes,
            &mut seq,
        );
        let stats = a.stats();
        let (exposed, segmented) = (stats.messages_exposed, stats.messages_segmented);
        let every = if name == "read" { exposed } else { segmented };
        assert_eq!(every, stats.messages_sent, "{name}: {stats:?}");
    }
}

/// `NAME/PROVIDER`: `bytes` delivered from `a` to `b` over and over, each restamped with the
/// next number of `seq`.
fn steady<E: Endpoint>(
    group: &mut criterion::BenchmarkGroup<'_, criterion::measurement::WallTime>,
    name: &str,
    provider: &str,
    (a, b): (&mut Connection<E>, &mut Connection<E>),
    bytes: &mut [u8],
    seq: &mut u64,
) {
    group.bench_function(BenchmarkId::new(name, provider), |bench| {
        bench.iter(|| {
            *seq += 1;
            stamp(bytes, *seq);
            deliver(a, b, bytes, *seq);
        })
    });
}

/// The environment variable that makes this binary the peer process of a shm bench; its
/// value is the peer's role (`connection` or `endpoint`).
const PEER_ROLE: &str = "TIERBUF_BENCH_PEER";
/// The environment variable naming the socket the peer process connects to.
const PEER_SOCKET: &str = "TIERBUF_BENCH_SOCKET";
/// The environment variable giving the size of the messages the peer process checks.
const PEER_SIZE: &str = "TIERBUF_BENCH_SIZE";

/// How long the bench waits for its peer process to connect.
const PEER_CONNECT_TIMEOUT: Duration = Duration::from_secs(30);

/// The time on the system-wide monotonic clock, comparable between the two processes
/// (an [`Instant`] cannot be sent to the other one).
fn monotonic_now() -> Duration {
    clock(libc::CLOCK_MONOTONIC)
}

/// A peer process started from this binary, connected to a listener of the bench's own
/// shm provider; it runs on the other core.
///
/// The peer exits when the bench closes its endpoint (successfully) or dies (with an
/// error: the shm provider reports a peer whose socket closed), so it never outlives the
/// bench process.
struct PeerProcess {
    child: Child,
}

impl PeerProcess {
    /// Starts a peer process in `role` for messages of `size` bytes and returns it with
    /// this side's endpoint. Fails if the peer exits before it has connected.
    fn start(provider: &ShmProvider, role: &str, size: usize) -> (PeerProcess, ShmEndpoint) {
        static SOCKETS: AtomicU64 = AtomicU64::new(0);
        let path = std::env::temp_dir().join(format!(
            "tierbuf-bench-{}-{}.sock",
            std::process::id(),
            SOCKETS.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_file(&path);
        let listener = provider.listen(&path).expect("listen for the peer");
        let mut child = Command::new(std::env::current_exe().expect("this bench binary"))
            .env(PEER_ROLE, role)
            .env(PEER_SOCKET, &path)
            .env(PEER_SIZE, size.to_string())
            .spawn()
            .expect("start the peer process");
        // Accepting blocks; a peer that dies before connecting must end the wait.
        let (accepted, endpoint) = mpsc::channel();
        std::thread::spawn(move || {
            let _ = accepted.send(listener.accept(DEPTH, DEPTH));
        });
        let deadline = Instant::now() + PEER_CONNECT_TIMEOUT;
        loop {
            match endpoint.recv_timeout(Duration::from_millis(10)) {
                Ok(endpoint) => {
                    let endpoint = endpoint.expect("accept the peer");
                    return (PeerProcess { child }, endpoint);
                }
                Err(mpsc::RecvTimeoutError::Timeout) => {}
                Err(mpsc::RecvTimeoutError::Disconnected) => panic!("the accepting thread died"),
            }
            if let Some(status) = child.try_wait().expect("look at the peer process") {
                panic!("the peer process exited with {status} before connecting");
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                panic!("the peer process did not connect in {PEER_CONNECT_TIMEOUT:?}");
            }
        }
    }

    /// Waits for the peer to exit, which it does once this side's endpoint is closed, and
    /// fails unless it exited successfully.
    fn finish(mut self) {
        let status = self.child.wait().expect("wait for the peer process");
        assert!(status.success(), "the peer process exited with {status}");
    }
}

/// What the bench asks of the peer process of a connection bench, ahead of each batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum PeerCommand {
    /// Echo the next `count` messages back, reading each as the [`Reading`] says.
    Echo(Reading),
    /// Take the next `count` messages, reading each as the [`Reading`] says, and report
    /// once the last has arrived.
    Sink(Reading),
    /// Report and do nothing else.
    Report,
}

impl PeerCommand {
    /// The length of a command message: tag, first sequence number, count. Shorter than
    /// any measured message, so one cannot be taken for the other.
    const LEN: usize = 24;

    fn encode(self, first: u64, count: u64) -> [u8; PeerCommand::LEN] {
        let tag: u64 = match self {
            PeerCommand::Echo(Reading::Spot) => 1,
            PeerCommand::Sink(Reading::Spot) => 2,
            PeerCommand::Report => 3,
            PeerCommand::Echo(Reading::Whole) => 4,
            PeerCommand::Sink(Reading::Whole) => 5,
        };
        let mut bytes = [0; PeerCommand::LEN];
        for (field, value) in bytes.chunks_exact_mut(8).zip([tag, first, count]) {
            field.copy_from_slice(&value.to_le_bytes());
        }
        bytes
    }

    /// The command, first sequence number and count in `bytes`.
    fn decode(bytes: &[u8]) -> (PeerCommand, u64, u64) {
        assert_eq!(bytes.len(), PeerCommand::LEN, "length of a command");
        let field =
            |index: usize| u64::from_le_bytes(bytes[index * 8..][..8].try_into().expect("8 bytes"));
        let command = match field(0) {
            1 => PeerCommand::Echo(Reading::Spot),
            2 => PeerCommand::Sink(Reading::Spot),
            3 => PeerCommand::Report,
            4 => PeerCommand::Echo(Reading::Whole),
            5 => PeerCommand::Sink(Reading::Whole),
            tag => panic!("unknown command {tag}"),
        };
        (command, field(1), field(2))
    }
}

/// The peer process's answer to a command: its tier state and its monotonic clock when
/// it answered (for [`PeerCommand::Sink`], right after the last message arrived).
#[derive(Debug, Clone, Copy)]
struct PeerReport {
    tiers: (u8, u8, u64, u64),
    clock: Duration,
}

impl PeerReport {
    /// The length of a report message: send tier, receive tier, promotions, demotions,
    /// clock in nanoseconds.
    const LEN: usize = 40;

    fn now(stats: ConnectionStats) -> PeerReport {
        PeerReport {
            tiers: tiers(stats),
            clock: monotonic_now(),
        }
    }

    fn encode(&self) -> [u8; PeerReport::LEN] {
        let (send_tier, recv_tier, promotions, demotions) = self.tiers;
        let clock = u64::try_from(self.clock.as_nanos()).expect("a clock within 584 years");
        let fields = [
            u64::from(send_tier),
            u64::from(recv_tier),
            promotions,
            demotions,
            clock,
        ];
        let mut bytes = [0; PeerReport::LEN];
        for (field, value) in bytes.chunks_exact_mut(8).zip(fields) {
            field.copy_from_slice(&value.to_le_bytes());
        }
        bytes
    }

    fn decode(bytes: &[u8]) -> PeerReport {
        assert_eq!(bytes.len(), PeerReport::LEN, "length of a report");
        let field =
            |index: usize| u64::from_le_bytes(bytes[index * 8..][..8].try_into().expect("8 bytes"));
        let tier = |index| u8::try_from(field(index)).expect("a tier index");
        PeerReport {
            tiers: (tier(0), tier(1), field(2), field(3)),
            clock: Duration::from_nanos(field(4)),
        }
    }
}

/// A connection to a peer process for one message size, on the tier that size needs:
/// the shm counterpart of [`Warmed`]. The bench pins itself to core 0, the peer to
/// core 1.
struct ShmSession {
    connection: Shm,
    peer: PeerProcess,
    /// The message, restamped with each sequence number before it is sent.
    outgoing: Vec<u8>,
    /// The message as built, for checking what arrives.
    expected: Vec<u8>,
    next_seq: u64,
    /// Tier state of this side and of the peer after warming (again, for batches).
    tiers: [(u8, u8, u64, u64); 2],
}

impl ShmSession {
    /// Starts a peer process for messages of `size` bytes, connects to it, and sends a
    /// message there and back until neither side's tier changes from one exchange to the
    /// next, so both directions are on the tier it needs.
    fn new(size: usize) -> ShmSession {
        pin_to_core(0);
        let provider = ShmProvider::new(MemoryBudget::with_cap(BUDGET));
        let (config, reservoir) = config_and_reservoir(provider.registrar());
        let (peer, endpoint) = PeerProcess::start(&provider, "connection", size);
        let expected = message(size);
        let mut session = ShmSession {
            connection: connect(&config, &reservoir, endpoint),
            peer,
            outgoing: expected.clone(),
            expected,
            next_seq: 0,
            tiers: Default::default(),
        };
        session.tiers = session.tier_states();
        for _ in 0..WARM_EXCHANGES {
            let first = session.start_batch(PeerCommand::Echo(Reading::Spot), 1);
            stamp(&mut session.outgoing, first);
            session.connection.send(&session.outgoing).expect("send");
            let echo = session.connection.recv().expect("the echo");
            check(&echo, first, &session.expected);
            drop(echo);
            let now = session.tier_states();
            if now == session.tiers {
                break;
            }
            session.tiers = now;
        }
        session
    }

    /// Reserves `count` sequence numbers and tells the peer what to do with the messages
    /// that carry them; returns the first once the peer has answered, so that neither
    /// the command nor the answer is in the timing of the batch.
    fn start_batch(&mut self, command: PeerCommand, count: u64) -> u64 {
        let first = self.next_seq;
        self.next_seq += count;
        self.command(command, first, count);
        first
    }

    /// Sends `command` and waits for the peer's answer.
    fn command(&mut self, command: PeerCommand, first: u64, count: u64) -> PeerReport {
        self.connection
            .send(&command.encode(first, count))
            .expect("send a command");
        self.report()
    }

    /// The time to send `count` messages to the peer, which takes them as `reading`
    /// says: `send` gets the connection, the outgoing message and the messages' sequence
    /// numbers; the time runs from before its first send to the peer's clock after the
    /// last message arrived.
    fn time_sink(
        &mut self,
        reading: Reading,
        count: u64,
        send: impl FnOnce(&mut Shm, &mut Vec<u8>, std::ops::Range<u64>),
    ) -> Duration {
        let first = self.start_batch(PeerCommand::Sink(reading), count);
        let start = monotonic_now();
        send(
            &mut self.connection,
            &mut self.outgoing,
            first..first + count,
        );
        self.report().clock - start
    }

    /// Waits for the peer's next report.
    fn report(&mut self) -> PeerReport {
        PeerReport::decode(&self.connection.recv().expect("the peer's report"))
    }

    /// The tier state of this side and of the peer.
    fn tier_states(&mut self) -> [(u8, u8, u64, u64); 2] {
        let peer = self.command(PeerCommand::Report, 0, 0).tiers;
        [tiers(self.connection.stats()), peer]
    }

    /// Checks that neither side changed tier since warming, closes the connection and
    /// waits for the peer process to exit.
    fn finish(mut self) {
        assert_eq!(
            self.tier_states(),
            self.tiers,
            "tiers (send, receive, promotions, demotions) changed while measuring"
        );
        drop(self.connection);
        self.peer.finish();
    }
}

/// A shm endpoint connected to a peer process that echoes every message back, with no
/// connection layer: buffers from a slot pool, posted and polled directly.
struct EndpointSession {
    endpoint: ShmEndpoint,
    peer: PeerProcess,
    send: EndpointSend,
    /// Copied sends posted from the slot instead ([`post_message`]).
    uncopied: u64,
    /// The message, restamped with each sequence number before it is sent.
    ping: OwnedSlot,
    /// The receive buffers, each posted with its index as work-request id.
    inboxes: Vec<OwnedSlot>,
    /// The message as built, for checking what arrives.
    expected: Vec<u8>,
    next_seq: u64,
    completions: [Completion; 4],
}

impl EndpointSession {
    /// The work-request id of the ping's send.
    const PING: u64 = u64::MAX;

    /// Starts a peer process echoing messages of `size` bytes sent as `send` says,
    /// connects to it, posts the receives, and sends one message there and back (so both
    /// sides have mapped each other's buffers).
    fn new(send: EndpointSend, size: usize) -> EndpointSession {
        pin_to_core(0);
        let provider = ShmProvider::new(MemoryBudget::with_cap(BUDGET));
        let wire_len = send.wire_len(size);
        let pool = SlotPool::new(&*provider.registrar(), wire_len, ENDPOINT_RECEIVES + 1)
            .expect("a slot pool");
        let mut slots = std::iter::from_fn(|| pool.try_acquire_owned());
        let expected = message(wire_len);
        let mut ping = slots.next().expect("a slot for the ping");
        ping.copy_from_slice(&expected);
        let inboxes: Vec<OwnedSlot> = slots.collect();
        let (peer, mut endpoint) = PeerProcess::start(&provider, send.role(), size);
        for (wr_id, inbox) in inboxes.iter().enumerate() {
            // SAFETY: the inbox is read only once its completion has been polled.
            unsafe { endpoint.post_recv(BufferRef::from(inbox), wr_id as u64) }
                .expect("post a receive");
        }
        let mut session = EndpointSession {
            endpoint,
            peer,
            send,
            uncopied: 0,
            ping,
            inboxes,
            expected,
            next_seq: 1,
            completions: [Completion::default(); 4],
        };
        session.round_trip(0);
        session
    }

    /// Sends the message stamped `seq`, waits for the send's completion and the echo,
    /// checks the echo and posts its buffer again.
    fn round_trip(&mut self, seq: u64) {
        stamp(&mut self.ping, seq);
        let len = self.ping.len();
        if post_message(
            &mut self.endpoint,
            self.send,
            &self.ping,
            len,
            EndpointSession::PING,
        ) {
            self.uncopied += 1;
        }
        let (mut sent, mut echo) = (false, None);
        while !sent || echo.is_none() {
            let ready = self.endpoint.poll(&mut self.completions).expect("poll");
            for completion in &self.completions[..ready] {
                assert!(completion.status.is_success(), "{completion:?}");
                match completion.opcode.queue() {
                    QueueKind::Send => sent = true,
                    QueueKind::Recv => {
                        assert!(echo.replace(*completion).is_none(), "one echo per ping");
                    }
                }
            }
        }
        let echo = echo.expect("the echo");
        let inbox = &self.inboxes[echo.wr_id as usize];
        check(&inbox[..echo.byte_len as usize], seq, &self.expected);
        // SAFETY: the inbox is read again only once this receive's completion is polled.
        unsafe { self.endpoint.post_recv(BufferRef::from(inbox), echo.wr_id) }
            .expect("post the receive again");
    }

    /// Closes the endpoint and waits for the peer process to exit.
    fn finish(self) {
        report_uncopied("the pinging side", self.uncopied, self.next_seq);
        drop(self.endpoint);
        self.peer.finish();
    }
}

/// The peer process: connects to the bench at `PEER_SOCKET` and serves it in `role`.
fn run_peer(role: &str) {
    pin_to_core(1);
    let socket = PathBuf::from(std::env::var(PEER_SOCKET).expect("the socket path"));
    let size: usize = std::env::var(PEER_SIZE)
        .expect("the message size")
        .parse()
        .expect("a message size");
    match role {
        "connection" => serve_connection(&socket, size),
        "endpoint" => serve_endpoint(&socket, EndpointSend::Registered, size),
        "endpoint_copied" => serve_endpoint(&socket, EndpointSend::Copied, size),
        other => panic!("unknown peer role {other}"),
    }
}

/// Serves a [`ShmSession`]: answers each command with a report, then echoes or takes
/// the batch it announces, checking every message. Returns once the bench has closed
/// the connection.
fn serve_connection(socket: &Path, size: usize) {
    let provider = ShmProvider::new(MemoryBudget::with_cap(BUDGET));
    let (config, reservoir) = config_and_reservoir(provider.registrar());
    let endpoint = provider.connect(socket, DEPTH, DEPTH).expect("connect");
    let mut connection = connect(&config, &reservoir, endpoint);
    let expected = message(size);
    let rest = rest_sum(&expected);
    loop {
        let (command, first, count) = match connection.recv() {
            Ok(command) => PeerCommand::decode(&command),
            Err(error) => {
                assert_eq!(
                    connection.endpoint().state(),
                    EndpointState::PeerClosed,
                    "the connection failed: {error}"
                );
                return;
            }
        };
        let report = PeerReport::now(connection.stats());
        connection.send(&report.encode()).expect("report");
        match command {
            PeerCommand::Echo(reading) => {
                for seq in first..first + count {
                    let received = connection.recv().expect("a message");
                    reading.check(&received, seq, &expected, rest);
                    connection.send(&received).expect("echo");
                }
            }
            PeerCommand::Sink(reading) => {
                for seq in first..first + count {
                    let received = connection.recv().expect("a message");
                    reading.check(&received, seq, &expected, rest);
                }
                let report = PeerReport::now(connection.stats());
                connection.send(&report.encode()).expect("acknowledge");
            }
            PeerCommand::Report => {}
        }
    }
}

/// Serves an [`EndpointSession`]: echoes every message back from the buffer it arrived
/// in, sent as `send` says, checking each, and posts the buffer again once the echo has
/// left. Returns once the bench has closed the connection.
fn serve_endpoint(socket: &Path, send: EndpointSend, size: usize) {
    let provider = ShmProvider::new(MemoryBudget::with_cap(BUDGET));
    let wire_len = send.wire_len(size);
    let pool = SlotPool::new(&*provider.registrar(), wire_len, ENDPOINT_RECEIVES).expect("a pool");
    let inboxes: Vec<OwnedSlot> = std::iter::from_fn(|| pool.try_acquire_owned()).collect();
    let mut endpoint = provider.connect(socket, DEPTH, DEPTH).expect("connect");
    for (wr_id, inbox) in inboxes.iter().enumerate() {
        // SAFETY: the inbox is read only once its completion has been polled.
        unsafe { endpoint.post_recv(BufferRef::from(inbox), wr_id as u64) }
            .expect("post a receive");
    }
    let expected = message(wire_len);
    let mut next_seq = 0;
    let mut uncopied = 0;
    let mut completions = [Completion::default(); 4];
    loop {
        let ready = endpoint.poll(&mut completions).expect("poll");
        for completion in &completions[..ready] {
            let inbox = &inboxes[completion.wr_id as usize];
            match (completion.status, completion.opcode) {
                (CompletionStatus::Success, Opcode::Recv) => {
                    let len = completion.byte_len;
                    check(&inbox[..len as usize], next_seq, &expected);
                    next_seq += 1;
                    if post_message(&mut endpoint, send, inbox, len as usize, completion.wr_id) {
                        uncopied += 1;
                    }
                }
                (CompletionStatus::Success, Opcode::Send) => {
                    // SAFETY: the inbox is read again only once this receive's completion
                    // is polled.
                    unsafe { endpoint.post_recv(BufferRef::from(inbox), completion.wr_id) }
                        .expect("post the receive again");
                }
                (CompletionStatus::Flushed, _) if endpoint.state() == EndpointState::PeerClosed => {
                    report_uncopied("the echoing peer", uncopied, next_seq);
                    return;
                }
                _ => panic!("{completion:?} on a connection {:?}", endpoint.state()),
            }
        }
    }
}

/// Sends the first `len` bytes of `slot` as `send` says: from the slot, or as a frame's
/// header and the rest copied by the provider (from the slot after all, where no receive
/// of the peer's is posted yet to copy into). Returns whether a copied send had to be
/// posted from the slot.
fn post_message(
    endpoint: &mut ShmEndpoint,
    send: EndpointSend,
    slot: &OwnedSlot,
    len: usize,
    wr_id: u64,
) -> bool {
    if send == EndpointSend::Copied {
        let (header, rest) = slot[..len].split_at(HEADER_LEN);
        if endpoint
            .try_post_send_copied(&[header, rest], wr_id)
            .expect("post a copied send")
        {
            return false;
        }
    }
    let buffer = BufferRef::from(slot)
        .prefix(len as u32)
        .expect("within the slot");
    // SAFETY: the caller neither writes `slot` nor posts it as a receive before this
    // send's completion has been polled.
    unsafe { endpoint.post_send(&[buffer], wr_id) }.expect("post a send");
    send == EndpointSend::Copied
}

/// Says on stderr how many of `sent` copied sends of `side` were posted from a slot
/// instead, which would make `shm_copied` read slower than the path it stands for.
fn report_uncopied(side: &str, uncopied: u64, sent: u64) {
    if uncopied > 0 {
        eprintln!("{side}: {uncopied} of {sent} copied sends were posted from a slot");
    }
}

/// Messages each of the two replying threads sends per iteration of `transport/senders`.
const SENDER_MESSAGES: u64 = 1000;

/// `transport/senders`: two threads reply on one loopback connection, 64 B each message,
/// while a receiver thread reads them off the other side: through cloned `Sender`s (each
/// takes its slot from the tier's lock-free cache and queues it; the connection's own
/// thread posts), against the same two threads taking turns on a `Mutex<Connection>`.
/// Time per message.
fn senders(c: &mut Criterion) {
    let mut group = c.benchmark_group("transport/senders");
    group.throughput(Throughput::Elements(2 * SENDER_MESSAGES));
    group.bench_function("sender_clones", |b| {
        b.iter_custom(|iterations| {
            let (mut driven, receiving) = pair();
            let senders = [driven.sender(), driven.sender()];
            let started = Instant::now();
            let receiver = receive_all(receiving, 2 * SENDER_MESSAGES * iterations);
            let workers = senders.map(|mut sender| {
                std::thread::spawn(move || {
                    for _ in 0..SENDER_MESSAGES * iterations {
                        sender.send(&[7; 64]).expect("a reply");
                    }
                })
            });
            while !receiver.is_finished() {
                drive(driven.progress());
            }
            for worker in workers {
                worker.join().expect("a replying thread");
            }
            receiver.join().expect("the receiver");
            started.elapsed()
        })
    });
    group.bench_function("mutex_connection", |b| {
        b.iter_custom(|iterations| {
            let (driven, receiving) = pair();
            let driven = std::sync::Mutex::new(driven);
            let started = Instant::now();
            let receiver = receive_all(receiving, 2 * SENDER_MESSAGES * iterations);
            std::thread::scope(|scope| {
                for _ in 0..2 {
                    scope.spawn(|| {
                        for _ in 0..SENDER_MESSAGES * iterations {
                            driven
                                .lock()
                                .expect("the connection")
                                .send(&[7; 64])
                                .expect("a reply");
                        }
                    });
                }
                while !receiver.is_finished() {
                    drive(driven.lock().expect("the connection").progress());
                }
            });
            receiver.join().expect("the receiver");
            started.elapsed()
        })
    });
    group.finish();
}

/// Checks a progress of the replying side: the receiver closes its side only once it
/// has every message, so its close is no error.
fn drive(progressed: Result<(), Arc<ConnectionError>>) {
    if let Err(error) = progressed
        && !matches!(*error, ConnectionError::PeerClosed)
    {
        panic!("progress: {error}");
    }
}

/// A thread that receives `count` 64 B messages on `connection`, checking each.
fn receive_all(mut connection: Loopback, count: u64) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        for _ in 0..count {
            let message = connection.recv().expect("a message");
            assert_eq!(message.len(), 64);
        }
    })
}

criterion_group!(
    benches,
    pingpong,
    pingpong_consumed,
    pingpong_endpoint,
    stream,
    stream_consumed,
    promotion,
    senders
);

/// Runs as the peer process of a shm bench when started as one (see [`PeerProcess`]);
/// otherwise runs the benches.
fn main() {
    if let Ok(role) = std::env::var(PEER_ROLE) {
        run_peer(&role);
        return;
    }
    benches();
    Criterion::default().configure_from_args().final_summary();
}
