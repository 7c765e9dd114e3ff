//! The cost of tiering on the hot path and of a promotion.
//!
//! - `tiers/acquire_8KiB`: acquire and release one 8 KiB buffer through a `TieredRegion`'s
//!   per-thread cache, beside the same through a bare `SlotPool` of the same shape.
//! - `tiers/promote`: one promotion from 512 B to 8 KiB slots (claim, provision, install),
//!   served from the reservoir's spare region, beside one that must register (and pin,
//!   as a NIC registration would) its region on the spot.
//!
//! Run: `cargo bench -p tierbuf-benches --bench tiers`.

use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group, criterion_main};
use tierbuf_benches::pin_to_core;
use tierbuf_pool::{HostRegistrar, MemoryBudget, SlotPool};
use tierbuf_tiers::ladder::{SLOT_HEADROOM, TierLadder};
use tierbuf_tiers::{Provenance, Reservoir, TierIndex, TieredRegion};

const SMALL: TierIndex = TierIndex::SMALLEST;
const LARGE: TierIndex = TierIndex::new(1);

fn reservoir(spares: usize, pin: bool) -> Arc<Reservoir> {
    let ladder = TierLadder::builder()
        .tier(512, 16, 480)
        .tier(8192, 16, 8192)
        .reservoir_regions(spares)
        .build()
        .expect("a valid ladder");
    let registrar = HostRegistrar::new(MemoryBudget::with_cap(1 << 30)).lock_memory(pin);
    let reservoir = Arc::new(Reservoir::new(Arc::new(registrar), Arc::new(ladder)));
    reservoir.fill().expect("register the spares");
    reservoir
}

fn acquire(c: &mut Criterion) {
    pin_to_core(0);
    let mut group = c.benchmark_group("tiers/acquire_8KiB");

    let region = TieredRegion::new(reservoir(0, false)).expect("the smallest tier");
    region
        .begin_change(LARGE)
        .expect("no change under way")
        .install(false)
        .expect("register the 8 KiB tier");
    let mut cache = region.cache();
    group.bench_function("tiered_region", |b| {
        b.iter(|| {
            let slot = cache.try_acquire().expect("a free slot");
            black_box(slot.as_ptr());
        })
    });

    let registrar = HostRegistrar::new(MemoryBudget::with_cap(1 << 30));
    // The shape of the 8 KiB tier: 16 slots of 8 KiB and the headroom for a frame header.
    let pool = SlotPool::new(&registrar, 8192 + SLOT_HEADROOM, 16).expect("register the pool");
    group.bench_function("slot_pool", |b| {
        b.iter(|| {
            let slot = pool.try_acquire().expect("a free slot");
            black_box(slot.as_ptr());
        })
    });
    group.finish();
}

/// Times `iters` promotions from the small to the large tier; each is undone (demote,
/// retire) outside the timed part.
fn time_promotions(region: &TieredRegion, iters: u64, expect: Provenance) -> Duration {
    let mut total = Duration::ZERO;
    for _ in 0..iters {
        let start = Instant::now();
        let mut change = region.begin_change(LARGE).expect("no change under way");
        black_box(change.provision().expect("provision the large tier"));
        let provenance = change.provenance();
        change.install(false).expect("install");
        total += start.elapsed();
        assert_eq!(provenance, Some(expect));
        region
            .begin_change(SMALL)
            .expect("no change under way")
            .install(false)
            .expect("demote");
        while region.reclaim() > 0 {}
    }
    total
}

fn promote(c: &mut Criterion) {
    pin_to_core(0);
    let mut group = c.benchmark_group("tiers/promote");

    let from_reservoir = TieredRegion::new(reservoir(1, true)).expect("the smallest tier");
    group.bench_function("from_reservoir", |b| {
        b.iter_custom(|iters| time_promotions(&from_reservoir, iters, Provenance::Reservoir))
    });

    let registering = TieredRegion::new(reservoir(0, true)).expect("the smallest tier");
    group.bench_function("register_and_pin", |b| {
        b.iter_custom(|iters| time_promotions(&registering, iters, Provenance::Registered))
    });
    group.finish();
}

criterion_group!(benches, acquire, promote);
criterion_main!(benches);
