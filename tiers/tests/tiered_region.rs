//! `TieredRegion` through its public API: changes of tier, retirement only after the last
//! local slot and the peer's release, the reservoir, budget refusals, retained tiers, and a
//! stress test with the real arc-swap cell.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use tierbuf_pool::{HostRegistrar, MemoryBudget};
use tierbuf_tiers::ladder::TierLadder;
use tierbuf_tiers::{Provenance, Reservoir, TierError, TierIndex, TieredRegion};

const T0: TierIndex = TierIndex::SMALLEST;
const T1: TierIndex = TierIndex::new(1);
const T2: TierIndex = TierIndex::new(2);

/// The regions' lengths: 4 slots of each tier's size and 64 bytes of headroom.
const T0_REGION: u64 = 4 * (512 + 64);
const T1_REGION: u64 = 4 * (4096 + 64);
const T2_REGION: u64 = 4 * (8192 + 64);

/// What each region is charged to the budget: the whole pages it maps (2304 bytes in one
/// page, 16 640 in five, 33 024 in nine).
const T0_CHARGED: u64 = 4096;
const T1_CHARGED: u64 = 5 * 4096;
const T2_CHARGED: u64 = 9 * 4096;

fn ladder(spares: usize, retain: bool) -> Arc<TierLadder> {
    Arc::new(
        TierLadder::builder()
            .tier(512, 4, 512)
            .tier(4096, 4, 4096)
            .tier(8192, 4, 8192)
            .reservoir_regions(spares)
            .retain_replaced(retain)
            .build()
            .expect("a valid ladder"),
    )
}

fn setup(cap: u64, spares: usize, retain: bool) -> (MemoryBudget, Arc<Reservoir>) {
    let budget = MemoryBudget::with_cap(cap);
    let registrar = Arc::new(HostRegistrar::new(budget.clone()));
    (
        budget,
        Arc::new(Reservoir::new(registrar, ladder(spares, retain))),
    )
}

#[test]
fn promotion_switches_new_acquisitions_and_retires_only_after_slots_and_peer() {
    let (budget, reservoir) = setup(1 << 20, 0, false);
    let region = TieredRegion::new(Arc::clone(&reservoir)).unwrap();
    assert_eq!(region.tier(), T0);
    assert_eq!(region.registered_bytes(), T0_REGION);

    let mut cache = region.cache();
    let mut small = cache.try_acquire().unwrap();
    small.fill(0xAB);
    assert_eq!((small.tier(), small.len()), (T0, 512 + 64));

    let mut change = region.begin_change(T2).unwrap();
    let descriptor = change.provision().unwrap();
    assert_eq!(descriptor.len, T2_REGION);
    assert_eq!(change.provenance(), Some(Provenance::Registered));
    assert_eq!(change.install(true).unwrap(), T0);
    assert_eq!(region.tier(), T2);

    let big = cache.try_acquire().unwrap();
    assert_eq!((big.tier(), big.len()), (T2, 8192 + 64));
    assert_eq!(region.current().descriptor(), descriptor);

    // The small tier waits for the peer and for its slot.
    assert_eq!(region.reclaim(), 0);
    assert!(region.peer_released(T0));
    assert_eq!(region.reclaim(), 0, "a local slot of tier 0 is still held");
    assert!(small.iter().all(|&b| b == 0xAB), "held slot overwritten");
    drop(small);
    assert_eq!(region.reclaim(), 1);
    assert_eq!(region.replaced_tiers(), 0);
    drop(big);
    drop(cache);
    assert_eq!(budget.in_use(), T2_CHARGED, "tier 0 deregistered");
    drop(region);
    assert_eq!(budget.in_use(), 0, "every byte back");
}

#[test]
fn a_tier_the_peer_still_uses_is_never_retired() {
    let (_budget, reservoir) = setup(1 << 20, 0, false);
    let region = TieredRegion::new(reservoir).unwrap();
    region.begin_change(T1).unwrap().install(true).unwrap();
    for _ in 0..3 {
        assert_eq!(region.reclaim(), 0);
    }
    assert!(!region.peer_released(T2), "no replaced tier 2 waits");
    assert!(region.peer_released(T0));
    assert_eq!(region.reclaim(), 1);
}

#[test]
fn one_change_at_a_time_and_only_within_the_ladder() {
    let (budget, reservoir) = setup(1 << 20, 0, false);
    let region = TieredRegion::new(reservoir).unwrap();
    assert!(matches!(
        region.begin_change(TierIndex::new(3)),
        Err(TierError::BeyondLadder { tier, top }) if tier == TierIndex::new(3) && top == T2
    ));
    assert!(matches!(
        region.begin_change(T0),
        Err(TierError::AlreadyOn { tier: T0 })
    ));
    let mut first = region.begin_change(T1).unwrap();
    assert!(matches!(
        region.begin_change(T2),
        Err(TierError::ChangePending { pending: T1 })
    ));
    first.provision().unwrap();
    assert_eq!(budget.in_use(), T0_CHARGED + T1_CHARGED);
    drop(first); // abandoned: the claim and the provisioned region are given back
    assert_eq!(budget.in_use(), T0_CHARGED);
    assert_eq!(region.tier(), T0);
    region.begin_change(T2).unwrap().install(false).unwrap();
    assert_eq!(region.tier(), T2);
}

#[test]
fn promotion_takes_a_spare_from_the_reservoir_and_returns_it_after_retirement() {
    let (budget, reservoir) = setup(1 << 20, 1, false);
    assert_eq!(reservoir.fill().unwrap(), 3);
    let spare_bytes = T0_CHARGED + T1_CHARGED + T2_CHARGED;
    assert_eq!(budget.in_use(), spare_bytes);
    let region = TieredRegion::new(Arc::clone(&reservoir)).unwrap();
    assert_eq!(reservoir.spare(T0), 0);
    let mut change = region.begin_change(T1).unwrap();
    change.provision().unwrap();
    assert_eq!(change.provenance(), Some(Provenance::Reservoir));
    change.install(false).unwrap();
    assert_eq!(region.reclaim(), 1);
    assert_eq!(reservoir.spare(T0), 1, "tier 0's region went back");
    assert_eq!(budget.in_use(), spare_bytes, "no registration happened");
    drop(region);
    assert_eq!(reservoir.spare(T1), 1);
    assert_eq!(budget.in_use(), spare_bytes);
    drop(reservoir);
    assert_eq!(budget.in_use(), 0);
}

#[test]
fn over_budget_promotion_is_refused_and_loses_nothing() {
    let (budget, reservoir) = setup(T0_CHARGED + T1_CHARGED, 0, false);
    let region = TieredRegion::new(reservoir).unwrap();
    let mut change = region.begin_change(T2).unwrap();
    let err = change.provision().unwrap_err();
    assert!(err.is_over_budget(), "{err}");
    drop(change);
    assert_eq!(region.tier(), T0);
    assert_eq!(budget.in_use(), T0_CHARGED);
    // A smaller step still fits.
    region.begin_change(T1).unwrap().install(false).unwrap();
    assert_eq!(region.tier(), T1);
}

#[test]
fn retained_tiers_come_back_without_registering() {
    let (budget, reservoir) = setup(1 << 20, 0, true);
    let region = TieredRegion::new(reservoir).unwrap();
    region.begin_change(T2).unwrap().install(false).unwrap();
    assert_eq!(region.reclaim(), 0, "retained, not replaced");
    let held = budget.in_use();
    assert_eq!(held, T0_CHARGED + T2_CHARGED);
    let mut demote = region.begin_change(T0).unwrap();
    demote.provision().unwrap();
    assert_eq!(budget.in_use(), held, "tier 0 was kept registered");
    demote.install(false).unwrap();
    assert_eq!(region.tier(), T0);
    assert_eq!(
        region.registered_bytes(),
        T0_REGION + T2_REGION,
        "the two regions' lengths"
    );
}

/// Retaining keeps only the tiers below the one in force: a demotion gives back the tiers
/// above it once their slots are back, and keeps retaining the ones below.
#[test]
fn retained_tiers_above_the_tier_in_force_retire_after_a_demotion() {
    let (budget, reservoir) = setup(1 << 20, 0, true);
    let region = TieredRegion::new(reservoir).unwrap();
    let mut cache = region.cache();
    region.begin_change(T1).unwrap().install(false).unwrap();
    region.begin_change(T2).unwrap().install(false).unwrap();
    assert_eq!(
        region.reclaim(),
        0,
        "tiers 0 and 1 are retained below tier 2"
    );
    assert_eq!(region.registered_bytes(), T0_REGION + T1_REGION + T2_REGION);
    let top_slot = cache.try_acquire().unwrap();
    assert_eq!(top_slot.tier(), T2);

    let mut demote = region.begin_change(T0).unwrap();
    demote.provision().unwrap();
    assert_eq!(
        demote.provenance(),
        Some(Provenance::Reservoir),
        "tier 0 was retained"
    );
    assert_eq!(demote.install(false).unwrap(), T2);
    assert_eq!(region.replaced_tiers(), 2, "tiers 1 and 2 wait to retire");
    assert_eq!(
        region.reclaim(),
        1,
        "tier 1 retires, tier 2 still has a slot out"
    );
    drop(top_slot);
    assert_eq!(region.reclaim(), 1);
    assert_eq!(region.replaced_tiers(), 0);
    assert_eq!(region.registered_bytes(), T0_REGION, "tier 0's region only");
    assert_eq!(cache.tier(), T0);
    assert_eq!(budget.in_use(), T0_CHARGED, "tiers 1 and 2 deregistered");

    // Up again and down to the middle: tier 0 stays retained, tier 2 retires.
    region.begin_change(T1).unwrap().install(false).unwrap();
    region.begin_change(T2).unwrap().install(false).unwrap();
    assert_eq!(region.replaced_tiers(), 0);
    region.begin_change(T1).unwrap().install(false).unwrap();
    assert_eq!(region.reclaim(), 1);
    assert_eq!(region.registered_bytes(), T0_REGION + T1_REGION);
    let mut demote = region.begin_change(T0).unwrap();
    demote.provision().unwrap();
    assert_eq!(
        demote.provenance(),
        Some(Provenance::Reservoir),
        "tier 0 still retained"
    );
    demote.install(false).unwrap();
    assert_eq!(region.reclaim(), 1);
    assert_eq!(region.registered_bytes(), T0_REGION);
    assert_eq!(budget.in_use(), T0_CHARGED);
}

/// A retained tier that a demotion gives back still waits for the peer's release when its
/// change asked for one, whether the release came while it was retained or after.
#[test]
fn retained_tiers_given_back_by_a_demotion_still_wait_for_the_peer() {
    let (budget, reservoir) = setup(1 << 20, 0, true);
    let region = TieredRegion::new(reservoir).unwrap();
    region.begin_change(T1).unwrap().install(true).unwrap();
    region.begin_change(T2).unwrap().install(true).unwrap();
    assert!(
        region.peer_released(T0),
        "retained tier 0 waits for the peer"
    );
    region.begin_change(T0).unwrap().install(true).unwrap();
    assert_eq!(
        region.reclaim(),
        0,
        "the peer has released neither tier 1 nor tier 2"
    );
    assert!(region.peer_released(T2));
    assert_eq!(region.reclaim(), 1);
    assert!(region.peer_released(T1));
    assert_eq!(region.reclaim(), 1);
    assert_eq!(budget.in_use(), T0_CHARGED);
}

#[test]
fn owned_slots_cross_threads_and_hold_their_tier() {
    let (budget, reservoir) = setup(1 << 20, 0, false);
    let region = TieredRegion::new(reservoir).unwrap();
    let mut slot = region.try_acquire_owned().unwrap();
    region.begin_change(T1).unwrap().install(false).unwrap();
    assert_eq!(region.reclaim(), 0);
    let worker = std::thread::spawn(move || {
        slot.fill(7);
        assert_eq!(slot.tier(), T0);
    });
    worker.join().unwrap();
    assert_eq!(region.reclaim(), 1);
    assert_eq!(budget.in_use(), T1_CHARGED);
}

#[test]
fn stress_many_threads_across_thousands_of_changes() {
    stress(false);
}

#[test]
fn stress_many_threads_across_thousands_of_changes_retaining_replaced_tiers() {
    stress(true);
}

/// Four threads cycle slots through their own caches, each stamping every slot with its
/// own pattern and checking it just before release, while a fifth thread changes the tier
/// back and forth thousands of times and reclaims. A tier freed, recycled or handed to
/// another owner while a slot of it is held would break a pattern, or crash on unmapped
/// memory; the debug assertion in `Tier`'s drop also fails if any tier is dropped with a
/// slot held.
fn stress(retain: bool) {
    const CHANGES: usize = 20_000;
    const WORK_EVERY: usize = 100;
    let (budget, reservoir) = setup(64 << 20, 2, retain);
    reservoir.fill().unwrap();
    let region = TieredRegion::new(Arc::clone(&reservoir)).unwrap();
    let stop = AtomicBool::new(false);
    let acquired = AtomicUsize::new(0);
    std::thread::scope(|scope| {
        for worker in 1..=4u8 {
            let (region, stop, acquired) = (&region, &stop, &acquired);
            scope.spawn(move || {
                let mut cache = region.cache();
                let mut held = Vec::new();
                let mut round = 0usize;
                while !stop.load(Ordering::Relaxed) {
                    if let Some(mut slot) = cache.try_acquire() {
                        slot.fill(worker);
                        held.push(slot);
                        acquired.fetch_add(1, Ordering::Relaxed);
                    }
                    if held.len() > 2 || (round.is_multiple_of(3) && !held.is_empty()) {
                        let slot = held.remove(0);
                        assert!(
                            slot.iter().all(|&b| b == worker),
                            "slot of {} changed under its holder",
                            slot.tier()
                        );
                    }
                    round += 1;
                }
            });
        }
        let (region, stop, acquired) = (&region, &stop, &acquired);
        scope.spawn(move || {
            let targets = [T1, T2, T0, T2, T1, T0];
            for change in 0..CHANGES {
                if change % WORK_EVERY == 0 {
                    // The workers take a slot between every `WORK_EVERY` changes, however
                    // the threads are scheduled, so the changes meet slots in use.
                    let seen = acquired.load(Ordering::Relaxed);
                    while acquired.load(Ordering::Relaxed) == seen {
                        std::thread::yield_now();
                    }
                }
                let target = targets[change % targets.len()];
                match region.begin_change(target) {
                    Ok(change) => {
                        change.install(false).unwrap();
                    }
                    Err(TierError::AlreadyOn { .. }) => {}
                    Err(other) => panic!("unexpected {other}"),
                }
                region.reclaim();
            }
            stop.store(true, Ordering::Relaxed);
        });
    });
    assert!(
        acquired.load(Ordering::Relaxed) >= CHANGES / WORK_EVERY,
        "workers made progress"
    );
    while region.reclaim() > 0 {}
    assert_eq!(region.replaced_tiers(), 0, "every replaced tier retired");
    drop(region);
    drop(reservoir);
    assert_eq!(budget.in_use(), 0, "every byte back");
}

#[test]
fn a_replaced_tier_not_yet_retired_is_put_back_in_force_instead_of_registered_again() {
    let (budget, reservoir) = setup(1 << 20, 0, false);
    let region = TieredRegion::new(reservoir).unwrap();
    let mut cache = region.cache();
    let held = cache.try_acquire().unwrap(); // keeps tier 0 from retiring
    region.begin_change(T1).unwrap().install(false).unwrap();
    assert_eq!(region.replaced_tiers(), 1);
    let charged = budget.in_use();
    let mut back = region.begin_change(T0).unwrap();
    back.provision().unwrap();
    assert_eq!(back.provenance(), Some(Provenance::Reservoir));
    back.install(false).unwrap();
    assert_eq!(
        budget.in_use(),
        charged,
        "tier 0's registration came back, no new one"
    );
    assert_eq!(
        held.tier(),
        region.tier(),
        "the held slot is of the tier in force again"
    );
    drop(held);
    assert_eq!(region.reclaim(), 1, "tier 1 retires");
    assert_eq!(budget.in_use(), T0_CHARGED);
}
