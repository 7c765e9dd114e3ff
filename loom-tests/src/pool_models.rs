//! Models of the `pool` crate, shared by the clean and the planted-bug test binaries.

use loom::thread;
use tierbuf_pool::{HostRegistrar, MemoryBudget, PoolError, SlotPool};

fn pool(slots: usize) -> SlotPool {
    let registrar = HostRegistrar::new(MemoryBudget::with_cap(1 << 20));
    SlotPool::new(&registrar, 64, slots).expect("register the model's pool")
}

/// Two threads each take a slot, write through it, and give it back, from a pool of one
/// slot (a hand-over) or two (a race for the same first slot). The pool's loom tracking
/// panics on a second owner or on a hand-over without happens-before; afterwards every
/// slot is free and loom's `Arc` tracking sees the region released.
pub fn slots_hand_over(slots: usize) {
    let pool = pool(slots);
    let other = pool.clone();
    let racer = thread::spawn(move || {
        if let Some(mut slot) = other.try_acquire_owned() {
            slot[0] = 1;
        }
    });
    if let Some(mut slot) = pool.try_acquire() {
        slot[0] = 2;
    }
    racer.join().unwrap();
    assert_eq!(pool.free_slots(), slots, "a slot did not come back");
}

/// Two threads each hold a 600-byte reservation on a budget of 1000: exactly one gets it,
/// the cap is never passed, and every byte comes back.
pub fn budget_admission() {
    let budget = MemoryBudget::with_cap(1000);
    let other = budget.clone();
    let racer = thread::spawn(move || other.reserve(600).ok());
    let mine = budget.reserve(600);
    let theirs = racer.join().unwrap();
    assert!(
        budget.in_use() <= budget.cap(),
        "budget passed its cap: {} in use",
        budget.in_use()
    );
    assert!(
        mine.is_ok() != theirs.is_some(),
        "exactly one of two reservations fits"
    );
    if let Err(err) = &mine {
        assert!(matches!(err, PoolError::BudgetExceeded { .. }), "{err}");
    }
    drop((mine, theirs));
    assert_eq!(budget.in_use(), 0);
}

/// Two threads each reserve 300 bytes and keep them until both are done: at some point
/// 600 bytes were in use at once, so the budget's peak must say 600, whichever
/// reservation made that total and in whatever order the two raised the peak.
pub fn budget_peak() {
    let budget = MemoryBudget::with_cap(1000);
    let other = budget.clone();
    let racer = thread::spawn(move || other.reserve(300).expect("room for both"));
    let mine = budget.reserve(300).expect("room for both");
    let theirs = racer.join().unwrap();
    assert_eq!(budget.in_use(), 600);
    assert_eq!(budget.peak(), 600, "the peak lost the larger total");
    drop((mine, theirs));
    assert_eq!(budget.peak(), 600, "a peak outlives what made it");
}
