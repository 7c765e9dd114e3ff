//! Shared helpers for the criterion benches in `benches/`.

#![warn(missing_docs)]

pub mod messages;

use std::sync::{Arc, Barrier, Mutex};
use std::time::{Duration, Instant};

use tierbuf_tiers::Reservoir;
use tierbuf_transport::Endpoint;
use tierbuf_transport::connection::{Connection, ConnectionConfig, ConnectionCore};

/// A connection over `endpoint` on its ladder's first tier, its tiers drawn from
/// `reservoir` (send and receive alike), as every bench's connections are made.
///
/// ```
/// use std::sync::Arc;
/// use tierbuf_pool::MemoryBudget;
/// use tierbuf_tiers::{Reservoir, ladder::TierLadder};
/// use tierbuf_transport::connection::ConnectionConfig;
/// use tierbuf_transport::{LoopbackProvider, Provider};
///
/// let provider = LoopbackProvider::new(MemoryBudget::with_cap(1 << 24));
/// let config = Arc::new(ConnectionConfig::new(Arc::new(TierLadder::preset("two-tier")?))?);
/// let reservoir = Arc::new(Reservoir::new(provider.registrar(), Arc::clone(config.ladder())));
/// let (a, b) = provider.pair(64, 64)?;
/// let a = tierbuf_benches::connect(&config, &reservoir, a);
/// let b = tierbuf_benches::connect(&config, &reservoir, b);
/// assert_eq!((a.stats().send_tier, b.stats().send_tier), (0, 0));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn connect<E: Endpoint>(
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

/// The time on clock `id` (`libc::CLOCK_MONOTONIC`, which two processes share;
/// `libc::CLOCK_THREAD_CPUTIME_ID`, the calling thread's CPU time).
///
/// ```
/// let cpu = tierbuf_benches::clock(libc::CLOCK_THREAD_CPUTIME_ID);
/// assert!(tierbuf_benches::clock(libc::CLOCK_THREAD_CPUTIME_ID) >= cpu);
/// ```
pub fn clock(id: libc::clockid_t) -> Duration {
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `now` is a valid `timespec` for the call to write.
    let result = unsafe { libc::clock_gettime(id, &mut now) };
    assert_eq!(result, 0, "reading clock {id}");
    Duration::new(
        u64::try_from(now.tv_sec).expect("a clock past zero"),
        u32::try_from(now.tv_nsec).expect("nanoseconds below one second"),
    )
}

/// Pins the calling thread to `core`, so two-thread figures do not depend on the
/// scheduler's placement; returns whether the kernel accepted it.
///
/// ```
/// let _ = tierbuf_benches::pin_to_core(0);
/// ```
pub fn pin_to_core(core: usize) -> bool {
    // SAFETY: `cpu_set_t` is plain bits for which all-zeroes is the empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: `set` is a valid `cpu_set_t` and `CPU_SET` ignores cores past its size.
    unsafe { libc::CPU_SET(core, &mut set) };
    // SAFETY: `set` is a valid, initialised `cpu_set_t` of the size passed.
    unsafe { libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) == 0 }
}

/// Runs `op` `iters` times on each of two threads pinned to cores 0 and 1, started
/// together behind a barrier, and returns the wall time from the first start to the last
/// finish: per-thread time per operation is the result divided by `iters`.
///
/// ```
/// use std::sync::atomic::{AtomicU64, Ordering};
/// let count = AtomicU64::new(0);
/// let _ = tierbuf_benches::two_threads(1000, || { count.fetch_add(1, Ordering::Relaxed); });
/// assert_eq!(count.load(Ordering::Relaxed), 2 * (1000 + tierbuf_benches::WARMUP));
/// ```
pub fn two_threads<F: Fn() + Sync>(iters: u64, op: F) -> Duration {
    let barrier = Barrier::new(2);
    let spans: Mutex<Vec<(Instant, Instant)>> = Mutex::new(Vec::with_capacity(2));
    std::thread::scope(|scope| {
        for core in 0..2 {
            let (barrier, spans, op) = (&barrier, &spans, &op);
            scope.spawn(move || {
                pin_to_core(core);
                for _ in 0..WARMUP {
                    op();
                }
                barrier.wait();
                let start = Instant::now();
                for _ in 0..iters {
                    op();
                }
                let end = Instant::now();
                spans.lock().unwrap().push((start, end));
            });
        }
    });
    let spans = spans.into_inner().unwrap();
    let first_start = spans.iter().map(|s| s.0).min().unwrap();
    let last_end = spans.iter().map(|s| s.1).max().unwrap();
    last_end - first_start
}

/// Operations each thread of [`two_threads`] runs before the barrier, to warm caches.
pub const WARMUP: u64 = 1000;
