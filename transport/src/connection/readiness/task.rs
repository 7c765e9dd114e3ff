//! The readiness model (`mod.rs`) for a tokio task (feature `tokio`): [`TaskWait`] is how
//! an `AsyncConnection`'s calls and its driver wait on the connection, each step of the
//! model a step of a poll. `tokio.rs` says who polls and with which waker.
//!
//! # Invariants
//!
//! - A task is left pending armed only with the wake wired to it: the endpoint's
//!   descriptor (a duplicate in tokio's reactor, [`AsyncFd`]) or its waker, and the next
//!   timer as a tokio sleep. Its next poll disarms first ([`TaskWait::disarm`]). Over an
//!   endpoint that cannot wake anybody an idle connection costs a look a millisecond
//!   (tokio's timer rounds shorter sleeps up to that).
//! - The polling sleep and the timer's sleep are one each per connection, and every call
//!   of a poll that waits registers on them, so none is dropped before it is over: the
//!   call that finds one over drops it and wakes the task, so a call of the same poll
//!   left `Pending` on it is polled again and sleeps anew, rather than left with no
//!   wake. (A timer that moved replaces its sleep; a call waiting on that still has the
//!   endpoint's wake or the polling sleep.)
//! - A call's spin is a yield (`Pending`, woken at once) for up to the spin's length from
//!   its wait's first empty look, while the connection's spin pays and the task holds the
//!   process's one spin ([`SPIN_WORD`]); the wait ends when the call returns `Ready`
//!   ([`TaskWait::end`]). So an idle connection spins once, then parks at once until a
//!   wait ends soon again, and the tasks of a service of many connections do not burn the
//!   cores their peers need.

use std::future::Future;
use std::io;
use std::os::fd::OwnedFd;
use std::pin::Pin;
use std::sync::OnceLock;
use std::task::{Context, Poll, ready};
use std::time::{Duration, Instant};

use tokio::io::Interest;
use tokio::io::unix::AsyncFd;
use tokio::time::Sleep;

use super::super::driver::Connection;
use super::handshake::{SpinClaim, SpinWord};
use super::{Backoff, Parkable};
use crate::provider::{Armed, Endpoint, Readiness};

/// How long a call's wait yields, looking for an event, before it arms the endpoint and
/// parks (module invariants), unless set otherwise: about a round trip of a small RPC
/// between two processes.
pub(crate) const SPIN: Duration = Duration::from_micros(50);

/// The process's one spin at a time (module invariants; `handshake.rs` has the protocol).
static SPIN_WORD: SpinWord = SpinWord::new();

/// The nanoseconds of `at` since this module first looked at the clock, on which
/// [`SPIN_WORD`] and the async driver's plan count (never 0, which means no claim to the
/// spin).
pub(crate) fn clock_nanos(at: Instant) -> u64 {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    let since = at.saturating_duration_since(*EPOCH.get_or_init(Instant::now));
    u64::try_from(since.as_nanos()).unwrap_or(u64::MAX).max(1)
}

/// Whose wait [`TaskWait::poll`] serves.
#[derive(Clone, Copy)]
pub(crate) enum Wait {
    /// The wait of the call being polled.
    Call,
    /// An earlier call's, left pending, whose wake is armed again.
    Rearm,
    /// The async driver's, for the user: no spin; work that arming finds and an endpoint
    /// that cannot wake anybody are the driver's to look at again.
    Drive,
}

/// A tokio sleep until an instant, kept across polls while the instant stays.
#[derive(Debug, Default)]
pub(crate) struct Alarm(Option<(tokio::time::Instant, Pin<Box<Sleep>>)>);

impl Alarm {
    /// Polls the sleep until `at` (made anew if the one kept is for another instant, or
    /// dropped if `at` is `None`); `Ready` once it is over, and dropped.
    pub(crate) fn poll_until(&mut self, cx: &mut Context<'_>, at: Option<Instant>) -> Poll<()> {
        let Some(at) = at else {
            self.0 = None;
            return Poll::Pending;
        };
        self.poll_at(cx, tokio::time::Instant::from_std(at))
    }

    /// Polls the sleep kept, or one of `length()` from now if none is.
    fn poll_kept_or(
        &mut self,
        cx: &mut Context<'_>,
        length: impl FnOnce() -> Duration,
    ) -> Poll<()> {
        let at = match &self.0 {
            Some((at, _)) => *at,
            None => tokio::time::Instant::now() + length(),
        };
        self.poll_at(cx, at)
    }

    fn poll_at(&mut self, cx: &mut Context<'_>, at: tokio::time::Instant) -> Poll<()> {
        let sleep = match &mut self.0 {
            Some((kept, sleep)) if *kept == at => sleep,
            slot => &mut slot.insert((at, Box::pin(tokio::time::sleep_until(at)))).1,
        };
        ready!(sleep.as_mut().poll(cx));
        self.0 = None;
        Poll::Ready(())
    }
}

/// The state of a task's waits on one connection (module invariants).
#[derive(Debug)]
pub(crate) struct TaskWait {
    /// A duplicate of the endpoint's wake descriptor in tokio's reactor, if it has one.
    descriptor: Option<AsyncFd<OwnedFd>>,
    /// Whether the endpoint was armed by the last poll.
    armed: bool,
    /// When the wait of the call being polled first found nothing; kept while it yields
    /// and while it is parked, until the call returns.
    waiting_since: Option<Instant>,
    /// How long a wait may spin ([`SPIN`] unless set).
    pub(crate) spin: Duration,
    /// This connection's claim on the process's one spin, while it spins.
    spin_claim: Option<SpinClaim>,
    /// The connection's next timer.
    timer: Alarm,
    /// The sleep between looks at an endpoint that cannot wake anybody, while one runs.
    polling: Alarm,
    /// How long the next such sleep lasts.
    backoff: Backoff,
}

impl TaskWait {
    /// Waits on an endpoint that wakes by `readiness`.
    ///
    /// # Errors
    ///
    /// The operating system's, when the endpoint's descriptor cannot be duplicated or
    /// registered (its limit of open files).
    pub(crate) fn new(readiness: Readiness<'_>) -> io::Result<TaskWait> {
        let descriptor = match readiness {
            Readiness::Fd(fd) => {
                let duplicate = rustix::io::fcntl_dupfd_cloexec(fd, 0)?;
                // SAFETY: `duplicate` is an open descriptor owned by the `AsyncFd` for its
                // whole life: nothing else can close or replace it, and `OwnedFd`'s
                // `as_raw_fd` always returns it.
                let registered =
                    unsafe { AsyncFd::register_with_interest(duplicate, Interest::READABLE) };
                Some(registered.map_err(|error| error.into_parts().1)?)
            }
            _ => None,
        };
        Ok(TaskWait {
            descriptor,
            armed: false,
            waiting_since: None,
            spin: SPIN,
            spin_claim: None,
            timer: Alarm::default(),
            polling: Alarm::default(),
            backoff: Backoff::new(),
        })
    }

    /// Whether the endpoint is armed.
    pub(crate) fn is_armed(&self) -> bool {
        self.armed
    }

    /// One step of the model for `wait`: looks (progress), then spins, arms and sleeps
    /// as the module invariants say. `Ready` when there may be work (the progress did
    /// something, a timer fell due, a wake came); `Pending` when the task will be woken:
    /// armed, yielding, or, where arming found work pending, woken again at once.
    pub(crate) fn poll<E: Endpoint>(
        &mut self,
        connection: &mut Connection<E>,
        cx: &mut Context<'_>,
        wait: Wait,
    ) -> Poll<()> {
        // Progress that did anything (a credit came back, say) may be what the caller
        // waits for; a failure is reported by its next call.
        if !matches!(connection.progress_counted(), Ok(0)) {
            // The next polling sleep starts short again; one that runs is left to run,
            // as a call of this poll may be `Pending` on it (module invariants).
            self.backoff = Backoff::new();
            return Poll::Ready(());
        }
        let driving = matches!(wait, Wait::Drive);
        if self
            .timer
            .poll_until(cx, connection.next_timer())
            .is_ready()
        {
            // A call of this poll left `Pending` on this timer is polled again (module
            // invariants); the driver looks again by its own plan.
            if !driving {
                cx.waker().wake_by_ref();
            }
            return Poll::Ready(());
        }
        if let Wait::Call = wait {
            let now = Instant::now();
            let since = *self.waiting_since.get_or_insert(now);
            if connection.pace().spin_pays() && now.duration_since(since) < self.spin {
                if self.spin_claim.is_none() {
                    self.spin_claim =
                        SPIN_WORD.take(clock_nanos(now), clock_nanos(since + self.spin));
                }
                if self.spin_claim.is_some() {
                    // Yielded as tokio's own `yield_now` does: the task is woken after the
                    // worker has looked at its reactor, so the wakes of other tasks are
                    // not held up behind the spin.
                    let yielded = std::pin::pin!(tokio::task::yield_now()).poll(cx);
                    debug_assert!(yielded.is_pending(), "a fresh yield is pending");
                    return Poll::Pending;
                }
            }
            self.give_up_spin();
        }
        if matches!(connection.readiness(), Readiness::Polling) {
            if driving {
                return Poll::Pending;
            }
            ready!(self.polling.poll_kept_or(cx, || self.backoff.next()));
            // Another call of this poll may have left `Pending` on this same sleep, which
            // is gone now: the task polls again, so that call sleeps anew.
            cx.waker().wake_by_ref();
            return Poll::Ready(());
        }
        if connection.arm(cx.waker()) == Armed::Pending {
            connection.disarm();
            if driving {
                return Poll::Ready(());
            }
            cx.waker().wake_by_ref();
            return Poll::Pending;
        }
        self.armed = true;
        let Some(descriptor) = &self.descriptor else {
            return Poll::Pending;
        };
        match descriptor.poll_read_ready(cx) {
            Poll::Ready(Ok(mut guard)) => {
                guard.clear_ready();
                Poll::Ready(())
            }
            // The reactor failed: poll again, at once, rather than sleep for ever.
            Poll::Ready(Err(_)) => {
                cx.waker().wake_by_ref();
                Poll::Pending
            }
            Poll::Pending => Poll::Pending,
        }
    }

    /// Disarms the connection if the last poll armed it.
    pub(crate) fn disarm<E: Endpoint>(&mut self, connection: &mut Connection<E>) {
        if std::mem::take(&mut self.armed) {
            connection.disarm();
        }
    }

    /// Ends the wait of a call that returned `Ready`, if it had one: the next wait spins
    /// only if this one ended within the spin's length of its start (module invariants).
    pub(crate) fn end<E: Endpoint>(&mut self, connection: &mut Connection<E>) {
        if let Some(since) = self.waiting_since.take() {
            connection.pace().ended(since, self.spin);
        }
        self.give_up_spin();
    }

    fn give_up_spin(&mut self) {
        if let Some(claim) = self.spin_claim.take() {
            claim.give_up(&SPIN_WORD);
        }
    }
}
