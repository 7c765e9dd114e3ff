//! [`Parker`]: how a thread that is about to sleep asks another to wake it, without a
//! wake being lost between its last look and its sleep. Used by the loopback pair (a
//! side waiting for completions), a connection's returned receive slots and its
//! senders' queue (the connection's thread waiting for a give-back or a queued message).
//!
//! # Invariants
//!
//! - **No lost wake.** The sleeper stores its waker, sets `parked`, fences (`SeqCst`)
//!   and only then looks for what it waits for ([`Parker::arm`] is the first half; the
//!   caller's look is the second). The waking side makes its change, fences (`SeqCst`)
//!   and then takes `parked` ([`Parker::wake`]), waking the stored waker if it was set.
//!   With a fence between each side's write and its look, at least one of the two sees
//!   the other's write: the sleeper finds the change, or the waker finds the flag.
//! - **A wake is taken once.** `parked` is cleared by a swap, so of several wakers only
//!   one wakes the sleeper; the others find the flag clear.
//! - **Nothing outlives the wait.** [`Parker::disarm`] clears `parked` and drops the
//!   stored waker. A waker may hold its thread's resources (a thread's doorbell
//!   descriptor, `connection::wait`), so a parker left idle holds none of them: a
//!   connection waited on by a thread that has since exited keeps nothing of it.

use std::sync::PoisonError;
use std::task::Waker;

use crate::sync::{AtomicBool, Mutex, Ordering, fence};

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
}
