//! The lock-free halves of the readiness layer (its model is in `mod.rs`), each with a
//! loom model:
//!
//! - [`Parker`]: one sleeper, woken through the waker it stored. The loopback pair (a side
//!   waiting for completions), a connection's returned receive slots and its senders'
//!   queue arm one each for the connection's waiter.
//! - [`SleepHandshake`]: a table's sleeper (a thread in
//!   [`ConnectionTable::wait_ready`](crate::connection::ConnectionTable::wait_ready), or
//!   the table's progress thread) and the threads that queue connections for it; `set.rs`
//!   keeps one per ready set and adds the doorbell, an `eventfd` that a ring leaves
//!   readable until the sleeper reads it.
//! - [`SpinWord`]: the claim on a process's one spin, which an async connection's task
//!   takes before it spins (`task.rs`) and gives back.
//!
//! # Invariants
//!
//! - **No lost wake (both handshakes).** The sleeper writes that it sleeps (the parker's
//!   `parked` with its waker stored, the handshake's `sleeping`), fences (`SeqCst`) and
//!   only then looks for what it waits for, sleeping only if it finds nothing
//!   ([`Parker::arm`] and the caller's look, [`SleepHandshake::begin_sleep`]). The waking
//!   side makes its change (its event, the id pushed), fences (`SeqCst`) and then looks
//!   at the sleeper's flag, waking it if set ([`Parker::wake`], [`SleepHandshake::queue`]
//!   and the doorbell's ring). In the single order of the two fences, the side whose
//!   fence comes later sees the other's write: the sleeper finds the change, or the waker
//!   finds the flag. A wake may be needless (the sleeper found the change itself): it
//!   costs one empty wake.
//! - **A parker's wake is taken once.** `parked` is cleared by a swap, so of several
//!   wakers only one wakes the sleeper; the others find the flag clear.
//! - **Nothing outlives the wait.** [`Parker::disarm`] clears `parked` and drops the
//!   stored waker. A waker may hold its thread's resources (a thread's doorbell
//!   descriptor, `mod.rs`), so a parker left idle holds none of them: a connection waited
//!   on by a thread that has since exited keeps nothing of it.
//! - **One spin claim in force at a time.** A [`SpinWord`] holds the end of the claim in
//!   force, in nanoseconds on a clock its users share (0 when there is none). A task takes
//!   the claim only when the word's end has passed, with a compare-and-swap from the end
//!   it read, so of two tasks that read the same lapsed end at most one replaces it. A
//!   task whose swap fails does not spin: it parks, which costs it a wake, never a wrong
//!   answer. A claim lapses by itself, so a task that stops polling mid-spin (its future
//!   dropped, say) keeps the others from spinning until its end at most.
//! - **Giving up clears only one's own claim.** [`SpinClaim::give_up`] swaps the word from
//!   the claim's own end to 0, so a claim that lapsed and was replaced by another task's
//!   is left alone (unless the two end on the same nanosecond: then a third task may spin
//!   beside the second, which costs a core for a while, never a wrong answer). Only
//!   whether a task spins depends on the word, never what a call returns, so it orders
//!   nothing else: `Relaxed` throughout.
//!
//! The loom models of `readiness_models` check these on this code:
//! `a_queued_connection_is_never_slept_through` (broken twin
//! `Bug::ReadyQueueLookBeforePush`), `one_spin_at_a_time` (`Bug::SpinClaimCheckThenSet`)
//! and `giving_up_a_lapsed_claim_keeps_the_next` (`Bug::SpinGiveUpUnconditional`); the
//! parker is checked inside the models of the loopback pair and the senders' queue.

use std::sync::PoisonError;
use std::task::Waker;

use super::super::table::ConnectionId;
#[cfg(any(loom, feature = "tokio"))]
use crate::sync::AtomicU64;
use crate::sync::{AtomicBool, Mutex, Ordering, UnboundedQueue, fence};

/// One sleeper's request to be woken (module invariants).
#[derive(Debug, Default)]
pub(crate) struct Parker {
    parked: AtomicBool,
    waker: Mutex<Option<Waker>>,
}

impl Parker {
    /// Asks for `waker` to be woken at the next [`Parker::wake`]. The caller looks for
    /// what it waits for after this returns and sleeps only if it finds nothing.
    pub(crate) fn arm(&self, waker: &Waker) {
        // Every arm is followed by a disarm, which drops the waker: none is kept to reuse.
        *self.waker.lock().unwrap_or_else(PoisonError::into_inner) = Some(waker.clone());
        self.parked.store(true, Ordering::SeqCst);
        fence(Ordering::SeqCst);
    }

    /// Withdraws the request and drops the waker it kept.
    pub(crate) fn disarm(&self) {
        self.parked.store(false, Ordering::Relaxed);
        let kept = self
            .waker
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        drop(kept);
    }

    /// Wakes the sleeper if it is parked, taking its request. The caller has made its
    /// change and fenced (`SeqCst`) before.
    pub(crate) fn wake(&self) {
        if self.parked.load(Ordering::Relaxed) && self.parked.swap(false, Ordering::AcqRel) {
            let waker = self
                .waker
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .take();
            if let Some(waker) = waker {
                waker.wake();
            }
        }
    }
}

/// The ids queued for a table's sleeper, and whether it sleeps (module invariants).
///
/// ```
/// use tierbuf_transport::connection::ConnectionId;
/// use tierbuf_transport::connection::readiness::SleepHandshake;
/// let handshake = SleepHandshake::new();
/// assert!(handshake.begin_sleep(), "nothing queued: it may sleep");
/// assert!(handshake.queue(ConnectionId::new(1)), "it sleeps: ring");
/// handshake.end_sleep();
/// assert!(!handshake.begin_sleep(), "something queued: do not sleep");
/// handshake.end_sleep();
/// assert_eq!(handshake.pop(), Some(ConnectionId::new(1)));
/// ```
#[derive(Debug)]
pub struct SleepHandshake {
    queue: UnboundedQueue<ConnectionId>,
    sleeping: AtomicBool,
}

impl Default for SleepHandshake {
    fn default() -> SleepHandshake {
        SleepHandshake::new()
    }
}

impl SleepHandshake {
    /// Nothing queued, nobody asleep.
    pub fn new() -> SleepHandshake {
        SleepHandshake {
            queue: UnboundedQueue::new(),
            sleeping: AtomicBool::new(false),
        }
    }

    /// Queues `id` from any thread; whether the sleeper must be rung.
    pub fn queue(&self, id: ConnectionId) -> bool {
        #[cfg(loom)]
        if tierbuf_pool::sync::planted::is_planted(
            tierbuf_pool::sync::planted::Bug::ReadyQueueLookBeforePush,
        ) {
            let sleeping = self.sleeping.load(Ordering::Relaxed);
            self.queue.push(id);
            return sleeping;
        }
        self.queue.push(id);
        fence(Ordering::SeqCst);
        self.sleeping.load(Ordering::Relaxed)
    }

    /// Queues `id` from the sleeper's own thread, which is awake: no ring is needed.
    pub fn queue_awake(&self, id: ConnectionId) {
        self.queue.push(id);
    }

    /// The next id queued.
    pub fn pop(&self) -> Option<ConnectionId> {
        self.queue.pop()
    }

    /// Whether nothing is queued now.
    pub fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }

    /// The sleeper is about to sleep: from now on queuers ring. Whether it may sleep
    /// (nothing queued); it calls [`SleepHandshake::end_sleep`] either way.
    pub fn begin_sleep(&self) -> bool {
        self.sleeping.store(true, Ordering::Relaxed);
        fence(Ordering::SeqCst);
        self.queue.is_empty()
    }

    /// The sleep is over: queuers stop ringing.
    pub fn end_sleep(&self) {
        self.sleeping.store(false, Ordering::Relaxed);
    }
}

/// The word holding the end of the spin claim in force (module invariants).
///
/// ```
/// use tierbuf_transport::connection::readiness::SpinWord;
/// let word = SpinWord::new();
/// let claim = word.take(100, 150).expect("no claim in force");
/// assert!(word.take(120, 170).is_none(), "one spin at a time");
/// claim.give_up(&word);
/// assert!(word.take(120, 170).is_some());
/// ```
#[cfg(any(loom, feature = "tokio"))]
#[derive(Debug)]
pub struct SpinWord(AtomicU64);

/// A task's claim on the spin, until its end.
#[cfg(any(loom, feature = "tokio"))]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SpinClaim {
    until: u64,
}

#[cfg(any(loom, feature = "tokio"))]
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

#[cfg(any(loom, feature = "tokio"))]
impl Default for SpinWord {
    fn default() -> SpinWord {
        SpinWord::new()
    }
}

#[cfg(any(loom, feature = "tokio"))]
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
    use std::sync::Arc;
    use std::sync::atomic::AtomicUsize;
    use std::task::Wake;

    use super::*;

    /// Counts its wakes; its strong count says whether a parker still holds it.
    #[derive(Default)]
    struct Counting(AtomicUsize);

    impl Wake for Counting {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
    }

    #[test]
    fn an_armed_parker_wakes_once_and_a_disarmed_one_keeps_nothing() {
        let counting = Arc::new(Counting::default());
        let waker = Waker::from(counting.clone());
        let parker = Parker::default();

        parker.arm(&waker);
        parker.wake();
        parker.wake();
        assert_eq!(counting.0.load(std::sync::atomic::Ordering::Relaxed), 1);

        parker.arm(&waker);
        parker.disarm();
        parker.wake();
        assert_eq!(counting.0.load(std::sync::atomic::Ordering::Relaxed), 1);
        drop(waker);
        assert_eq!(
            Arc::strong_count(&counting),
            1,
            "the disarmed parker dropped its waker"
        );
    }

    #[cfg(feature = "tokio")]
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
