//! How a [`Connection`](super::Connection)'s blocking calls wait: a few hundred
//! microseconds of back-to-back passes, so a message is seen within one pass of landing,
//! then a sleep until the endpoint wakes the thread ([`Endpoint::arm`]), its next timer
//! is due, or the caller's deadline passes.
//!
//! # Invariants
//!
//! - The passes pay only where answers come within them, and burn a core where they do
//!   not, so they are adaptive, as the async connection's spin is: a wait makes them only
//!   while its connection's spin pays ([`Parkable::spin_pays`]). A wait that sleeps on
//!   its endpoint's wake says, when the sleep ends, whether it ended within
//!   [`Waiter::SPIN_PAYS_WITHIN`] of its start, and that is what the connection's next
//!   wait goes by: a thread whose peer answers only after long gaps sleeps at once, with
//!   no passes, until a sleep ends soon again. A wait that ends within its passes leaves
//!   the spin paying.
//! - A sleep starts only after [`Endpoint::arm`] said [`Armed::Parked`], so nothing that
//!   a poll would act on was there when the wake was asked for; the endpoint wakes the
//!   thread at the next such event. Every arm is followed by a disarm, woken or not.
//! - So a caller looks at what it waits for after each progress of its own and before
//!   each wait: a progress may take the event it waits for (the last send's completion,
//!   say), and a wait after it may sleep until an event that never comes. A wait whose
//!   passes are skipped (above) sleeps at its first call.
//! - No sleep outlasts the earlier of the deadline and the core's own timer (a promotion
//!   timing out, a demotion falling due): the caller passes the timer in, and the sleep
//!   ends at it, so timers fire while nothing else happens.
//! - An endpoint that cannot wake anybody ([`Readiness::Polling`]) is polled between
//!   sleeps that double from [`Waiter::FIRST_SLEEP`] to [`Waiter::LONGEST_SLEEP`]: the
//!   latency a wait adds there is at most the longest sleep.
//! - A sleep on an endpoint's descriptor also watches the thread's own doorbell (an
//!   `eventfd`, one per thread, made at its first such sleep) that the thread's waker
//!   rings, so a wake from this process (a [`Sender`](super::Sender) queueing a message)
//!   ends it too. A thread that cannot make one sleeps [`Waiter::LONGEST_SLEEP`] at most.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::Arc;
use std::task::{Wake, Waker};
use std::thread::{self, Thread};
use std::time::{Duration, Instant};

use rustix::event::{EventfdFlags, PollFd, PollFlags, Timespec};

use crate::provider::{Armed, Readiness};

/// What a [`Waiter`] waits on: a connection's endpoint and its senders' queue.
pub(super) trait Parkable {
    /// How the endpoint wakes a sleeper.
    fn readiness(&self) -> Readiness<'_>;
    /// Asks for a wake at the next event ([`Endpoint::arm`](crate::Endpoint::arm)).
    fn arm(&mut self, waker: &Waker) -> Armed;
    /// Ends the wait begun by `arm`.
    fn disarm(&mut self);
    /// When progress is due with no event.
    fn next_timer(&self) -> Option<Instant>;
    /// Whether a wait should make its back-to-back passes first (module invariants).
    fn spin_pays(&self) -> bool;
    /// Records whether the last sleep on the endpoint's wake ended soon.
    fn set_spin_pays(&mut self, pays: bool);
}

thread_local! {
    /// This thread's doorbell (module invariants); `None` if it could not be made.
    static DOORBELL: Option<Arc<OwnedFd>> =
        rustix::event::eventfd(0, EventfdFlags::CLOEXEC | EventfdFlags::NONBLOCK)
            .ok()
            .map(Arc::new);
}

/// The deadline of a blocking call passed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Expired;

/// Wakes a thread sleeping in [`Waiter::wait`]: rings its doorbell and unparks it.
#[derive(Debug)]
struct ThreadWake {
    thread: Thread,
    doorbell: Option<Arc<OwnedFd>>,
}

impl Wake for ThreadWake {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        if let Some(doorbell) = &self.doorbell {
            // A full counter is rung enough.
            let _rung = rustix::io::write(doorbell.as_fd(), &1u64.to_ne_bytes());
        }
        self.thread.unpark();
    }
}

/// The state of one blocking call's wait.
#[derive(Debug)]
pub(super) struct Waiter {
    deadline: Option<Instant>,
    passes: u32,
    /// The thread's waker and doorbell, made at the first sleep.
    waker: Option<(Waker, Option<Arc<OwnedFd>>)>,
    /// The next sleep of a polling endpoint.
    polling_sleep: Duration,
    /// [`Waiter::SPIN_PAYS_WITHIN`] (another length in tests).
    spin_pays_within: Duration,
}

impl Waiter {
    /// Passes made back to back before the wait sleeps: a few hundred microseconds of
    /// polling. The passes have no spin hint between them: a pass is a few dozen
    /// nanoseconds of work, not a loop on one load, and a hint (`pause` on x86, about 140
    /// cycles on recent cores) only delays the look that finds the message; it measured
    /// about 10 ns more of the 64 B shm pingpong's one-way time.
    pub(super) const TIGHT_POLLS: u32 = 1 << 12;
    /// Passes between two looks at the clock while passes are back to back.
    const PASSES_PER_CLOCK: u32 = 64;
    /// The first sleep between polls of an endpoint that cannot wake anybody.
    pub(super) const FIRST_SLEEP: Duration = Duration::from_micros(20);
    /// The longest.
    pub(super) const LONGEST_SLEEP: Duration = Duration::from_millis(1);
    /// A sleep on the endpoint's wake that ends within this says that answers come soon:
    /// the connection's next wait makes its passes again (module invariants). About twice
    /// as long as the passes take, since the sleep's length includes the time the thread
    /// takes to wake (hundreds of microseconds on a loaded VM): a shorter bound kept a
    /// thread whose peer answered every 0.3 ms from spinning, each answer then paying a
    /// slow wake.
    pub(super) const SPIN_PAYS_WITHIN: Duration = Duration::from_millis(1);

    /// A wait that gives up at `deadline` (`None`: never).
    pub(super) fn new(deadline: Option<Instant>) -> Waiter {
        Waiter {
            deadline,
            passes: 0,
            waker: None,
            polling_sleep: Waiter::FIRST_SLEEP,
            spin_pays_within: Waiter::SPIN_PAYS_WITHIN,
        }
    }

    /// Starts the back-to-back passes again: the call made headway.
    pub(super) fn reset(&mut self) {
        self.passes = 0;
        self.polling_sleep = Waiter::FIRST_SLEEP;
    }

    /// Waits before the next pass over `endpoint`: returns at once while passes are back
    /// to back, then sleeps until a wake, `timer`, or the deadline.
    ///
    /// # Errors
    ///
    /// [`Expired`] once the deadline has passed.
    pub(super) fn wait<P: Parkable>(&mut self, parked: &mut P) -> Result<(), Expired> {
        if self.passes == 0 && !parked.spin_pays() {
            self.passes = Waiter::TIGHT_POLLS;
        }
        if self.passes < Waiter::TIGHT_POLLS {
            self.passes += 1;
            if self.deadline.is_some() && self.passes.is_multiple_of(Waiter::PASSES_PER_CLOCK) {
                self.check_deadline(Instant::now())?;
            }
            return Ok(());
        }
        let now = Instant::now();
        self.check_deadline(now)?;
        // A timer already past (progress did not move it) is polled, not spun on.
        let timer = parked
            .next_timer()
            .map(|at| at.max(now + Waiter::FIRST_SLEEP));
        let wake_at = match (self.deadline, timer) {
            (Some(deadline), Some(timer)) => Some(deadline.min(timer)),
            (deadline, timer) => deadline.or(timer),
        };
        let timeout = wake_at.map(|at| at.saturating_duration_since(now));
        if matches!(parked.readiness(), Readiness::Polling) {
            let sleep = timeout.map_or(self.polling_sleep, |t| t.min(self.polling_sleep));
            thread::sleep(sleep);
            self.polling_sleep = (self.polling_sleep * 2).min(Waiter::LONGEST_SLEEP);
            return Ok(());
        }
        let (waker, doorbell) = self.waker.get_or_insert_with(|| {
            let doorbell = DOORBELL.with(Clone::clone);
            let wake = ThreadWake {
                thread: thread::current(),
                doorbell: doorbell.clone(),
            };
            (Waker::from(Arc::new(wake)), doorbell)
        });
        let slept = match parked.arm(waker) {
            Armed::Pending => {
                thread::yield_now();
                false
            }
            Armed::Parked => {
                match parked.readiness() {
                    Readiness::Fd(fd) => match doorbell {
                        Some(doorbell) => sleep_on(fd, doorbell.as_fd(), timeout),
                        None => {
                            let longest = timeout
                                .map_or(Waiter::LONGEST_SLEEP, |t| t.min(Waiter::LONGEST_SLEEP));
                            let flags = PollFlags::IN | PollFlags::RDHUP;
                            poll_for(&mut [PollFd::from_borrowed_fd(fd, flags)], Some(longest));
                        }
                    },
                    _ => match timeout {
                        Some(timeout) => thread::park_timeout(timeout),
                        None => thread::park(),
                    },
                }
                true
            }
        };
        parked.disarm();
        if slept {
            parked.set_spin_pays(now.elapsed() <= self.spin_pays_within);
        }
        Ok(())
    }

    fn check_deadline(&self, now: Instant) -> Result<(), Expired> {
        match self.deadline {
            Some(deadline) if now >= deadline => Err(Expired),
            _ => Ok(()),
        }
    }
}

/// Sleeps until `fd` is readable or hung up, `doorbell` rings, or `timeout` passes (an
/// hour at most: the caller waits again); takes the doorbell's ring. An interrupted or
/// failed `poll(2)` ends the sleep early: the caller polls the endpoint, which reports
/// any error of its own.
fn sleep_on(fd: BorrowedFd<'_>, doorbell: BorrowedFd<'_>, timeout: Option<Duration>) {
    let mut fds = [
        PollFd::from_borrowed_fd(fd, PollFlags::IN | PollFlags::RDHUP),
        PollFd::from_borrowed_fd(doorbell, PollFlags::IN),
    ];
    poll_for(&mut fds, timeout);
    if !fds[1].revents().is_empty() {
        let mut count = [0u8; 8];
        // Read to quiet it; nothing to learn from the count.
        let _ = rustix::io::read(doorbell, &mut count);
    }
}

/// `poll(2)` on `fds` for `timeout` (an hour at most; `None`: until one fires).
fn poll_for(fds: &mut [PollFd<'_>], timeout: Option<Duration>) {
    const LONGEST: Duration = Duration::from_secs(3600);
    let timeout =
        timeout.map(|t| Timespec::try_from(t.min(LONGEST)).expect("an hour is a valid timespec"));
    let _woken_or_interrupted = rustix::event::poll(fds, timeout.as_ref());
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An endpoint that sleeps on `fd` and counts its arms, with a timer `timer` ahead.
    struct Sleeper {
        fd: OwnedFd,
        arms: u32,
        timer: Duration,
        spin_pays: bool,
    }

    impl Sleeper {
        /// `ready`: the descriptor reads as ready, so a sleep on it ends at once.
        fn new(ready: bool, spin_pays: bool) -> Sleeper {
            let fd = rustix::event::eventfd(u32::from(ready), EventfdFlags::CLOEXEC)
                .expect("an eventfd");
            Sleeper {
                fd,
                arms: 0,
                timer: Duration::from_millis(50),
                spin_pays,
            }
        }
    }

    impl Parkable for Sleeper {
        fn readiness(&self) -> Readiness<'_> {
            Readiness::Fd(self.fd.as_fd())
        }
        fn arm(&mut self, _waker: &Waker) -> Armed {
            self.arms += 1;
            Armed::Parked
        }
        fn disarm(&mut self) {}
        fn next_timer(&self) -> Option<Instant> {
            Some(Instant::now() + self.timer)
        }
        fn spin_pays(&self) -> bool {
            self.spin_pays
        }
        fn set_spin_pays(&mut self, pays: bool) {
            self.spin_pays = pays;
        }
    }

    #[test]
    fn a_wait_whose_spin_pays_makes_its_passes_first() {
        let mut endpoint = Sleeper::new(false, true);
        let mut waiter = Waiter::new(None);
        waiter.wait(&mut endpoint).expect("no deadline");
        assert_eq!(endpoint.arms, 0, "the first wait slept instead of passing");
    }

    #[test]
    fn a_long_sleep_makes_the_next_wait_sleep_at_once() {
        let mut endpoint = Sleeper::new(false, true);
        let mut waiter = Waiter::new(None);
        while endpoint.arms == 0 {
            waiter.wait(&mut endpoint).expect("no deadline");
        }
        // The sleep lasted the timer, far past `SPIN_PAYS_WITHIN`.
        assert!(!endpoint.spin_pays);
        let mut next = Waiter::new(None);
        next.wait(&mut endpoint).expect("no deadline");
        assert_eq!(endpoint.arms, 2, "the next wait passed before it slept");
    }

    #[test]
    fn a_sleep_that_ends_soon_makes_the_next_wait_pass_again() {
        let mut endpoint = Sleeper::new(true, false);
        endpoint.timer = Duration::from_secs(3600);
        // However long the thread is kept off its core: "soon" is any time short of this.
        let mut waiter = Waiter {
            spin_pays_within: Duration::from_secs(3600),
            ..Waiter::new(None)
        };
        waiter.wait(&mut endpoint).expect("no deadline");
        assert_eq!(
            endpoint.arms, 1,
            "a wait whose spin does not pay sleeps at once"
        );
        assert!(
            endpoint.spin_pays,
            "the descriptor was ready: the sleep ended at once"
        );
    }
}
