//! Connections over a provider: latency, bandwidth and the cost of a promotion.
//!
//! - `transport/pingpong`: one-way latency (round trip / 2) of a message echoed back,
//!   64 B to 1 MiB; the echo side runs on a second thread pinned to the other core.
//! - `transport/stream`: bandwidth of a stream of messages (a window of them in flight,
//!   bounded by the receiver's credits: the slot count of the tier, less the one credit
//!   kept back), receiver on the other core; the time runs from the first `send` to the
//!   last delivery.
//! - `transport/promotion`: from the first `send` of an 8 KiB message on a fresh tier-0
//!   connection to its delivery (the promotion negotiated in-band, the new receives posted
//!   from a filled reservoir, the old ones drained), against the same message on an
//!   already-promoted connection. One thread drives both sides in both functions, so the
//!   ratio is the protocol's cost, not a cross-core one; a fresh pair is built for every
//!   `first_oversize` message, outside the timed part.
//!
//! The ladder's top tier holds 64 KiB whole, so 1 MiB travels as 16+ frames and is
//! reassembled (segmentation). Every connection is warmed first, so the measured messages
//! run on the tier their size needs; that the tiers did not change while measuring is
//! checked after each size. Every delivered message is checked (length, a sequence number
//! stamped into its first 8 bytes, its middle and last bytes), so a transport that loses,
//! repeats, truncates or mixes up messages cannot produce a fast figure.
//!
//! The two sides of a two-thread bench each own their connection: if either side panics,
//! its connection is dropped, the other side's next call fails instead of waiting
//! forever, and the panic reaches criterion. No thread outlives a measurement.
//!
//! Functions are named by provider with the size as parameter, so the `shm` provider
//! (the one to race against Open MPI's and UCX's shared-memory transports,
//! `shared/peers/mpi` and `shared/peers/ucx`) slots in beside `loopback` once it exists;
//! it does not yet.
//!
//! Run: `cargo bench -p tierbuf-benches --bench transport`.

use std::hint::black_box;
use std::io::IoSlice;
use std::panic::resume_unwind;
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use tierbuf_benches::pin_to_core;
use tierbuf_pool::{MemoryBudget, Registrar};
use tierbuf_tiers::Reservoir;
use tierbuf_tiers::ladder::TierLadder;
use tierbuf_transport::connection::{
    Connection, ConnectionConfig, ConnectionCore, ConnectionStats, SendError,
};
use tierbuf_transport::{Endpoint, LoopbackEndpoint, LoopbackProvider, Provider};

const SIZES: [usize; 5] = [64, 1024, 8 * 1024, 64 * 1024, 1024 * 1024];

/// The size of the `transport/promotion` message: past tier 0, within tier 1.
const PROMOTION_SIZE: usize = 8 * 1024;

/// The registration cap of each provider: far above what the ladder needs.
const BUDGET: u64 = 1 << 30;

/// The send and receive queue depth of every endpoint.
const DEPTH: u32 = 64;

type Loopback = Connection<LoopbackEndpoint>;

fn ladder() -> Arc<TierLadder> {
    // Slot sizes leave room for the 16-byte frame header (and stay multiples of 64).
    Arc::new(
        TierLadder::builder()
            .tier(512, 16, 480)
            .tier(8192 + 64, 16, 8192 + 48)
            .tier(65536 + 64, 8, 65536 + 48)
            .reservoir_regions(2)
            .build()
            .expect("a valid ladder"),
    )
}

/// The connection settings of every bench, and a reservoir of spare tier regions
/// registered through `registrar`, already filled (so no registration is timed).
fn config_and_reservoir(registrar: Arc<dyn Registrar>) -> (Arc<ConnectionConfig>, Arc<Reservoir>) {
    let config = Arc::new(ConnectionConfig::new(ladder()).expect("a connection config"));
    let reservoir = Arc::new(Reservoir::new(registrar, Arc::clone(config.ladder())));
    reservoir.fill().expect("register the spares");
    (config, reservoir)
}

/// A connection over `endpoint` on tier 0, its tiers drawn from `reservoir`.
fn connect<E: Endpoint>(
    config: &Arc<ConnectionConfig>,
    reservoir: &Arc<Reservoir>,
    endpoint: E,
) -> Connection<E> {
    let core = ConnectionCore::new(
        Arc::clone(config),
        Arc::clone(reservoir),
        Arc::clone(reservoir),
        Instant::now(),
    )
    .expect("a connection");
    Connection::new(core, endpoint).expect("post the first receives")
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

/// A message of `size` bytes (at least 8): a sequence number in the first 8 bytes, a
/// pattern after it.
fn message(size: usize) -> Vec<u8> {
    assert!(size >= 8, "room for the sequence number");
    (0..size).map(|i| (i * 7 + 3) as u8).collect()
}

/// Writes sequence number `seq` into `message`.
fn stamp(message: &mut [u8], seq: u64) {
    message[..8].copy_from_slice(&seq.to_le_bytes());
}

/// Checks that `received` is message number `seq` built like `expected`: its length, its
/// sequence number, its middle and last bytes.
fn check(received: &[u8], seq: u64, expected: &[u8]) {
    assert_eq!(received.len(), expected.len(), "length of message {seq}");
    let got = u64::from_le_bytes(received[..8].try_into().expect("8 bytes"));
    assert_eq!(got, seq, "sequence number");
    let (middle, last) = (expected.len() / 2, expected.len() - 1);
    assert_eq!(
        (received[middle], received[last]),
        (expected[middle], expected[last]),
        "middle and last bytes of message {seq}"
    );
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
        stats.promotions,
        stats.demotions,
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
    /// Sends a message of `size` bytes from one side to the other and back once, so both
    /// directions are on the tier it needs.
    fn new(size: usize) -> Warmed {
        let mut message = message(size);
        stamp(&mut message, 0);
        let (a, b) = pair();
        let expected = &message;
        let ((), (), a, b) = on_two_cores(
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
        let tiers = [tiers(a.stats()), tiers(b.stats())];
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
    let mut group = c.benchmark_group("transport/pingpong");
    for size in SIZES {
        let mut warmed = Warmed::new(size);
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
                            check(&received, seq, expected);
                            echo.send(&received).expect("echo");
                        }
                        echo.flush().expect("flush");
                    },
                    |a| {
                        let start = Instant::now();
                        for seq in first..first + iters {
                            stamp(&mut message, seq);
                            a.send(&message).expect("send");
                            check(&a.recv().expect("the echo"), seq, expected);
                        }
                        start.elapsed() / 2
                    },
                );
                warmed.pair = Some((a, b));
                elapsed
            })
        });
        warmed.finish();
    }
    group.finish();
}

fn stream(c: &mut Criterion) {
    let mut group = c.benchmark_group("transport/stream");
    for size in SIZES {
        let mut warmed = Warmed::new(size);
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
                            check(&receiver.recv().expect("a message"), seq, expected);
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
    }
    group.finish();
}

/// Sends `message` from `a` and waits for it at `b`, driving both from this thread, and
/// checks it on arrival as message number `seq`.
fn deliver(a: &mut Loopback, b: &mut Loopback, message: &[u8], seq: u64) {
    loop {
        match a.try_send(&[IoSlice::new(message)]) {
            Ok(accepted) => {
                assert_eq!(accepted, message.len(), "accepted whole");
                break;
            }
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
    let mut bytes = message(PROMOTION_SIZE);
    stamp(&mut bytes, 0);
    group.bench_function(BenchmarkId::new("first_oversize", "loopback"), |bench| {
        bench.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                let (mut a, mut b) = pair();
                assert_eq!(a.stats().send_tier, 0, "a fresh pair starts on tier 0");
                let start = Instant::now();
                deliver(&mut a, &mut b, &bytes, 0);
                total += start.elapsed();
                assert_eq!(a.stats().promotions, 1, "one promotion");
            }
            total
        })
    });
    let (mut a, mut b) = pair();
    deliver(&mut a, &mut b, &bytes, 0);
    let mut seq = 0;
    group.bench_function(BenchmarkId::new("already_promoted", "loopback"), |bench| {
        bench.iter(|| {
            seq += 1;
            stamp(&mut bytes, seq);
            deliver(&mut a, &mut b, &bytes, seq);
        })
    });
    let stats = a.stats();
    assert_eq!(
        (stats.promotions, stats.demotions),
        (1, 0),
        "already_promoted stayed on its tier"
    );
    group.finish();
}

criterion_group!(benches, pingpong, stream, promotion);
criterion_main!(benches);
