//! Slot pool behaviour through the public API: argument errors, exclusivity, release on
//! drop from any thread, region lifetime, and random acquire/release sequences against a
//! model, from one and from two threads.

use std::collections::BTreeSet;
use std::sync::Arc;

use proptest::prelude::*;
use tierbuf_pool::{HostRegistrar, MemoryBudget, OwnedSlot, PoolError, Registrar, SlotPool};

fn registrar() -> HostRegistrar {
    HostRegistrar::new(MemoryBudget::with_cap(1 << 30))
}

#[test]
fn bad_shapes_are_errors_not_panics() {
    let registrar = registrar();
    assert!(matches!(
        SlotPool::new(&registrar, 0, 4),
        Err(PoolError::ZeroSlotSize)
    ));
    assert!(matches!(
        SlotPool::new(&registrar, 64, 0),
        Err(PoolError::ZeroSlotCount)
    ));
    assert!(matches!(
        SlotPool::new(&registrar, usize::MAX / 2, 3),
        Err(PoolError::SizeOverflow { .. })
    ));
    assert!(matches!(
        SlotPool::new(&registrar, 1, u32::MAX as usize + 1),
        Err(PoolError::TooManySlots { .. })
    ));
    let region = registrar.register(1000, 4096).unwrap();
    assert!(matches!(
        SlotPool::from_region(region, 300),
        Err(PoolError::SlotSizeDoesNotDivide {
            region_len: 1000,
            slot_size: 300
        })
    ));
    assert_eq!(registrar.budget().in_use(), 0);
}

#[test]
fn slots_are_disjoint_and_exhaustion_does_not_block() {
    let registrar = registrar();
    let pool = SlotPool::new(&registrar, 100, 5).unwrap();
    let mut held: Vec<_> = std::iter::from_fn(|| pool.try_acquire()).collect();
    assert_eq!(held.len(), 5);
    assert!(pool.try_acquire().is_none());
    assert!(pool.try_acquire_owned().is_none());
    for (i, slot) in held.iter_mut().enumerate() {
        slot.fill(i as u8);
    }
    for (i, slot) in held.iter().enumerate() {
        assert!(
            slot.iter().all(|&b| b == i as u8),
            "slot {i} was overwritten"
        );
        let offset = slot.remote_addr() - pool.keys().remote_addr;
        assert_eq!(offset, u64::from(slot.index()) * 100);
    }
    let indices: BTreeSet<u32> = held.iter().map(|s| s.index()).collect();
    assert_eq!(indices, (0..5).collect());
    held.truncate(2);
    assert_eq!(pool.free_slots(), 3);
}

#[test]
fn a_slot_keeps_what_its_previous_owner_wrote_until_overwritten() {
    let registrar = registrar();
    let pool = SlotPool::new(&registrar, 64, 1).unwrap();
    let mut slot = pool.try_acquire().unwrap();
    slot[..3].copy_from_slice(b"abc");
    drop(slot);
    let slot = pool.try_acquire().unwrap();
    assert_eq!(&slot[..3], b"abc");
}

#[test]
fn owned_slots_release_from_other_threads_and_keep_the_region_alive() {
    let registrar = Arc::new(registrar());
    let pool = SlotPool::new(&*registrar, 4096, 8).unwrap();
    let slots: Vec<OwnedSlot> = std::iter::from_fn(|| pool.try_acquire_owned()).collect();
    drop(pool);
    assert_eq!(registrar.budget().in_use(), 4096 * 8);
    let handles: Vec<_> = slots
        .into_iter()
        .map(|mut slot| {
            std::thread::spawn(move || {
                slot.fill(0x5A);
                assert!(slot.iter().all(|&b| b == 0x5A));
            })
        })
        .collect();
    for handle in handles {
        handle.join().unwrap();
    }
    assert_eq!(
        registrar.budget().in_use(),
        0,
        "region outlived its last slot"
    );
}

#[derive(Debug, Clone)]
enum Op {
    Acquire,
    AcquireOwned,
    /// Release the held slot at this position (modulo the number held).
    Release(usize),
}

fn ops() -> impl Strategy<Value = Vec<Op>> {
    prop::collection::vec(
        prop_oneof![
            Just(Op::Acquire),
            Just(Op::AcquireOwned),
            any::<usize>().prop_map(Op::Release)
        ],
        0..200,
    )
}

/// Runs `ops` on `pool`, checking against a model of which indices are held: never the
/// same index twice, and acquire fails exactly when the model says every slot is held.
/// Each slot is stamped with its owner's tag and checked before release. `alone` says no
/// other thread uses the pool, so an empty pool must mean the model holds every slot.
fn run_against_model(
    pool: &SlotPool,
    ops: &[Op],
    tag: u8,
    alone: bool,
) -> Result<(), TestCaseError> {
    let mut held: Vec<OwnedSlot> = Vec::new();
    let mut model: BTreeSet<u32> = BTreeSet::new();
    for op in ops {
        match op {
            Op::Acquire | Op::AcquireOwned => {
                let slot = match op {
                    // A borrowed handle is checked and released at once; it cannot be kept
                    // in `held` beyond the borrow, and its drop is the point being tested.
                    Op::Acquire => {
                        if let Some(mut slot) = pool.try_acquire() {
                            prop_assert!(!model.contains(&slot.index()));
                            slot[0] = tag;
                            prop_assert_eq!(slot[0], tag);
                        } else if alone {
                            prop_assert_eq!(model.len(), pool.slot_count());
                        }
                        continue;
                    }
                    _ => pool.try_acquire_owned(),
                };
                match slot {
                    Some(mut slot) => {
                        prop_assert!(model.insert(slot.index()), "index handed out twice");
                        slot.fill(tag);
                        held.push(slot);
                    }
                    None if alone => prop_assert_eq!(model.len(), pool.slot_count()),
                    None => {}
                }
            }
            Op::Release(position) if !held.is_empty() => {
                let slot = held.swap_remove(position % held.len());
                prop_assert!(
                    slot.iter().all(|&b| b == tag),
                    "another owner wrote my slot"
                );
                model.remove(&slot.index());
            }
            Op::Release(_) => {}
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    #[test]
    fn random_sequences_match_the_model(slot_count in 1usize..12, ops in ops()) {
        let registrar = registrar();
        let pool = SlotPool::new(&registrar, 32, slot_count).unwrap();
        run_against_model(&pool, &ops, 1, true)?;
        prop_assert_eq!(pool.free_slots(), slot_count, "a slot did not come back");
    }

    #[test]
    fn two_threads_never_share_a_slot(slot_count in 1usize..6, a in ops(), b in ops()) {
        let registrar = registrar();
        let pool = SlotPool::new(&registrar, 32, slot_count).unwrap();
        std::thread::scope(|scope| {
            let first = scope.spawn(|| run_against_model(&pool, &a, 1, false));
            let second = scope.spawn(|| run_against_model(&pool, &b, 2, false));
            first.join().unwrap()?;
            second.join().unwrap()
        })?;
        prop_assert_eq!(pool.free_slots(), slot_count, "a slot did not come back");
        drop(pool);
        prop_assert_eq!(registrar.budget().in_use(), 0);
    }
}

#[test]
fn hammering_from_two_threads_returns_every_slot() {
    let registrar = registrar();
    let pool = SlotPool::new(&registrar, 64, 3).unwrap();
    std::thread::scope(|scope| {
        for tag in [1u8, 2] {
            let pool = &pool;
            scope.spawn(move || {
                for _ in 0..200_000 {
                    if let Some(mut slot) = pool.try_acquire() {
                        slot.fill(tag);
                        assert!(slot.iter().all(|&b| b == tag), "slot shared by two owners");
                    }
                }
            });
        }
    });
    assert_eq!(pool.free_slots(), 3);
}

#[test]
fn a_failed_retire_changes_nothing_and_a_successful_one_is_final() {
    let registrar = registrar();
    let pool = SlotPool::new(&registrar, 64, 4).unwrap();
    let first = pool.try_acquire().unwrap();
    let last = {
        let mut taken: Vec<_> = std::iter::from_fn(|| pool.try_acquire()).collect();
        let last = taken.pop().unwrap();
        drop(taken);
        last
    };
    drop(first);
    // Slots before the held one get claimed, then given back when the held one is met.
    assert!(!pool.try_retire());
    assert!(!pool.is_retired());
    assert_eq!(pool.free_slots(), 3);
    drop(last);
    assert!(pool.try_retire());
    assert!(pool.is_retired());
    assert_eq!(pool.free_slots(), 0);
    assert!(pool.try_acquire().is_none());
    assert!(!pool.try_retire(), "a retired pool is not retired twice");
    let region = pool.into_region().unwrap();
    assert_eq!(region.len(), 256);
    assert_eq!(
        registrar.budget().in_use(),
        tierbuf_pool::page_size() as u64,
        "charged the page it maps"
    );
    drop(region);
    assert_eq!(registrar.budget().in_use(), 0);
}

#[test]
fn retire_races_acquirers_without_ever_retiring_a_held_slot() {
    let registrar = registrar();
    for _ in 0..200 {
        let pool = SlotPool::new(&registrar, 64, 4).unwrap();
        let retired = std::thread::scope(|scope| {
            let acquirer = scope.spawn(|| {
                let mut took = 0;
                for _ in 0..50 {
                    if let Some(mut slot) = pool.try_acquire() {
                        slot.fill(1);
                        took += 1;
                    }
                }
                took
            });
            let retired = loop {
                if pool.try_retire() {
                    break true;
                }
                if acquirer.is_finished() {
                    break pool.try_retire();
                }
            };
            acquirer.join().unwrap();
            retired
        });
        assert!(retired, "an idle pool must retire");
        assert!(pool.is_retired());
    }
}
