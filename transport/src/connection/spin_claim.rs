//! The claim on a process's one spin: the async connection lets one task of the process
//! spin at a time before it parks (`tokio.rs`, module invariants), and this is how a task
//! takes that turn and gives it back.
//!
//! # Invariants
//!
//! - **One claim in force at a time.** A [`SpinWord`] holds the end of the claim in force,
//!   in nanoseconds on a clock its users share (0 when there is none). A task takes the
//!   claim only when the word's end has passed, with a compare-and-swap from the end it
//!   read, so of two tasks that read the same lapsed end at most one replaces it. A task
//!   whose swap fails (another claim, or a give-up, changed the word after its look)
//!   does not spin: it parks, which costs it a wake, never a wrong answer.
//! - **A claim lapses by itself.** A task that stops polling mid-spin (its future
//!   dropped, say) keeps the others from spinning until its end at most.
//! - **Giving up clears only one's own claim.** [`SpinClaim::give_up`] swaps the word from
//!   the claim's own end to 0, so a claim that lapsed and was replaced by another task's
//!   is left alone (unless the two end on the same nanosecond: then a third task may spin
//!   beside the second, which costs a core for a while, never a wrong answer).
//!
//! Only whether a task spins depends on the word, never what a call returns, so it
//! orders nothing else: `Relaxed` throughout. The loom models
//! `connection_models::{one_spin_at_a_time, giving_up_a_lapsed_claim_keeps_the_next}` check
//! these, with the planted bugs `SpinClaimCheckThenSet` and `SpinGiveUpUnconditional`.

use crate::sync::{AtomicU64, Ordering};

/// The word holding the end of the claim in force (module invariants).
///
/// ```
/// use tierbuf_transport::connection::spin_claim::SpinWord;
/// let word = SpinWord::new();
/// let claim = word.take(100, 150).expect("no claim in force");
/// assert!(word.take(120, 170).is_none(), "one spin at a time");
/// claim.give_up(&word);
/// assert!(word.take(120, 170).is_some());
/// ```
#[derive(Debug)]
pub struct SpinWord(AtomicU64);

/// A task's claim on the spin, until its end.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SpinClaim {
    until: u64,
}

impl SpinWord {
    /// A word with no claim in force.
    #[cfg(not(loom))]
    pub const fn new() -> SpinWord {
        SpinWord(AtomicU64::new(0))
    }

    /// A word with no claim in force.
    #[cfg(loom)]
    pub fn new() -> SpinWord {
        SpinWord(AtomicU64::new(0))
    }

    /// The claim until `until`, unless another claim is in force at `now` (both in
    /// nanoseconds on the users' clock, `until` past `now`).
    pub fn take(&self, now: u64, until: u64) -> Option<SpinClaim> {
        let claimed = self.0.load(Ordering::Relaxed);
        if claimed > now {
            return None;
        }
        #[cfg(loom)]
        if tierbuf_pool::sync::planted::is_planted(
            tierbuf_pool::sync::planted::Bug::SpinClaimCheckThenSet,
        ) {
            self.0.store(until, Ordering::Relaxed);
            return Some(SpinClaim { until });
        }
        self.0
            .compare_exchange(claimed, until, Ordering::Relaxed, Ordering::Relaxed)
            .ok()
            .map(|_| SpinClaim { until })
    }
}

impl Default for SpinWord {
    fn default() -> SpinWord {
        SpinWord::new()
    }
}

impl SpinClaim {
    /// Gives the claim up before its end, unless it lapsed and another took its place.
    pub fn give_up(self, word: &SpinWord) {
        #[cfg(loom)]
        if tierbuf_pool::sync::planted::is_planted(
            tierbuf_pool::sync::planted::Bug::SpinGiveUpUnconditional,
        ) {
            word.0.store(0, Ordering::Relaxed);
            return;
        }
        // Failing means the claim lapsed and another task's is in force: left alone.
        let _ = word
            .0
            .compare_exchange(self.until, 0, Ordering::Relaxed, Ordering::Relaxed);
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn a_claim_keeps_others_out_until_it_lapses_or_is_given_up() {
        let word = SpinWord::new();
        let first = word.take(100, 150).expect("no claim in force");
        assert_eq!(word.take(120, 170), None, "the first is in force");
        first.give_up(&word);
        let second = word.take(120, 170).expect("given up");
        assert_eq!(word.take(169, 200), None, "the second is in force");
        let third = word.take(170, 220).expect("the second lapsed");
        second.give_up(&word);
        assert_eq!(
            word.take(180, 230),
            None,
            "giving up a lapsed claim leaves the third in force"
        );
        third.give_up(&word);
        assert!(word.take(180, 230).is_some());
    }
}
