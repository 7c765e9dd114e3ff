//! Connections over a provider: latency, bandwidth and the cost of a promotion.
//!
//! - `transport/pingpong`: one-way latency (round trip / 2) of a message echoed back,
//!   64 B to 1 MiB; the echo side runs on a second thread pinned to the other core.
//! - `transport/stream`: bandwidth of a stream of messages (a window of them in flight,
//!   bounded by the receiver's credits), receiver on the other core.
//! - `transport/promotion`: from the first `send` of an 8 KiB message on a fresh tier-0
//!   connection to its delivery (the promotion negotiated in-band, the new receives posted,
//!   the old ones drained), against the same message on an already-promoted connection.
//!
//! The ladder's top tier holds 64 KiB whole; 1 MiB travels segmented and is reassembled.
//! Functions are named by provider with the size as parameter, so the `shm` provider
//! (the one to race against Open MPI's and UCX's shared-memory transports,
//! `shared/peers/mpi` and `shared/peers/ucx`) slots in beside `loopback` once it exists.
//!
//! Run: `cargo bench -p tierbuf-benches --bench transport`.

use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use tierbuf_benches::pin_to_core;
use tierbuf_pool::MemoryBudget;
use tierbuf_tiers::Reservoir;
use tierbuf_tiers::ladder::TierLadder;
use tierbuf_transport::connection::{Connection, ConnectionConfig, ConnectionCore, SendError};
use tierbuf_transport::{LoopbackEndpoint, LoopbackProvider, Provider};

const SIZES: [usize; 5] = [64, 1024, 8 * 1024, 64 * 1024, 1024 * 1024];

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

/// A connected pair over a fresh loopback provider.
fn pair() -> (Loopback, Loopback) {
    let provider = LoopbackProvider::new(MemoryBudget::with_cap(1 << 30));
    let config = Arc::new(ConnectionConfig::new(ladder()).expect("a connection config"));
    let reservoir = Arc::new(Reservoir::new(
        provider.registrar(),
        Arc::clone(config.ladder()),
    ));
    reservoir.fill().expect("register the spares");
    let (a, b) = provider.pair(64, 64).expect("a loopback pair");
    let connect = |endpoint| {
        let core = ConnectionCore::new(
            Arc::clone(&config),
            Arc::clone(&reservoir),
            Arc::clone(&reservoir),
            Instant::now(),
        )
        .expect("a connection");
        Connection::new(core, endpoint).expect("post the first receives")
    };
    (connect(a), connect(b))
}

/// Receives one message and checks its length and its edges (so a broken transport
/// cannot produce a fast figure).
fn receive_checked(connection: &mut Loopback, message: &[u8]) {
    let received = connection.recv().expect("a message");
    assert_eq!(received.len(), message.len(), "length");
    if let (Some(first), Some(last)) = (received.first(), received.last()) {
        assert_eq!(
            (*first, *last),
            (message[0], message[message.len() - 1]),
            "bytes"
        );
    }
}

fn message(size: usize) -> Vec<u8> {
    (0..size).map(|i| (i * 7 + 3) as u8).collect()
}

/// Sends `message` from `a` to `b` and back once, so both directions are on the tier the
/// size needs before timing starts.
fn warm(a: &mut Loopback, b: &mut Loopback, message: &[u8]) {
    std::thread::scope(|scope| {
        scope.spawn(|| {
            receive_checked(b, message);
            b.send(message).expect("echo");
            b.flush().expect("flush");
        });
        a.send(message).expect("send");
        receive_checked(a, message);
    });
}

/// A pair already on the tier `size` needs, and the message it carries.
fn warmed_pair(size: usize) -> (Vec<u8>, Loopback, Loopback) {
    let bytes = message(size);
    let (mut a, mut b) = pair();
    warm(&mut a, &mut b, &bytes);
    (bytes, a, b)
}

fn pingpong(c: &mut Criterion) {
    let mut group = c.benchmark_group("transport/pingpong");
    for size in SIZES {
        let (bytes, mut a, mut b) = warmed_pair(size);
        group.bench_with_input(
            BenchmarkId::new("loopback", size),
            &bytes,
            |bench, bytes| {
                bench.iter_custom(|iters| {
                    std::thread::scope(|scope| {
                        let echo = &mut b;
                        scope.spawn(move || {
                            pin_to_core(1);
                            for _ in 0..iters {
                                let received = echo.recv().expect("a message");
                                assert_eq!(received.len(), bytes.len());
                                echo.send(&received).expect("echo");
                            }
                            echo.flush().expect("flush");
                        });
                        pin_to_core(0);
                        let start = Instant::now();
                        for _ in 0..iters {
                            a.send(bytes).expect("send");
                            receive_checked(&mut a, bytes);
                        }
                        start.elapsed() / 2
                    })
                })
            },
        );
    }
    group.finish();
}

fn stream(c: &mut Criterion) {
    let mut group = c.benchmark_group("transport/stream");
    for size in SIZES {
        let (bytes, mut a, mut b) = warmed_pair(size);
        group.throughput(Throughput::Bytes(size as u64));
        group.bench_with_input(
            BenchmarkId::new("loopback", size),
            &bytes,
            |bench, bytes| {
                bench.iter_custom(|iters| {
                    std::thread::scope(|scope| {
                        let receiver = &mut b;
                        let done = scope.spawn(move || {
                            pin_to_core(1);
                            for _ in 0..iters {
                                receive_checked(receiver, bytes);
                            }
                            Instant::now()
                        });
                        pin_to_core(0);
                        let start = Instant::now();
                        for _ in 0..iters {
                            a.send(bytes).expect("send");
                        }
                        a.flush().expect("flush");
                        done.join().expect("the receiver") - start
                    })
                })
            },
        );
    }
    group.finish();
}

/// Sends `message` from `a` and waits for it at `b`, driving both from this thread.
fn deliver(a: &mut Loopback, b: &mut Loopback, message: &[u8]) {
    loop {
        match a.try_send(&[std::io::IoSlice::new(message)]) {
            Ok(accepted) => {
                assert_eq!(accepted, message.len());
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
            assert_eq!(received.len(), message.len());
            black_box(&received[..]);
            return;
        }
    }
}

fn promotion(c: &mut Criterion) {
    pin_to_core(0);
    let mut group = c.benchmark_group("transport/promotion");
    let bytes = message(8 * 1024);
    group.bench_function(BenchmarkId::new("first_oversize", "loopback"), |bench| {
        bench.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                let (mut a, mut b) = pair();
                let start = Instant::now();
                deliver(&mut a, &mut b, &bytes);
                total += start.elapsed();
                assert_eq!(a.stats().promotions, 1);
            }
            total
        })
    });
    let (mut a, mut b) = pair();
    deliver(&mut a, &mut b, &bytes);
    group.bench_function(BenchmarkId::new("already_promoted", "loopback"), |bench| {
        bench.iter(|| deliver(&mut a, &mut b, &bytes))
    });
    group.finish();
}

criterion_group!(benches, pingpong, stream, promotion);
criterion_main!(benches);
