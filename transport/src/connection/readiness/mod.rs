//! Readiness: how every wait on connections goes, whoever waits. A thread in a blocking
//! call of a [`Connection`](super::Connection) (`Waiter`, in this file), a thread in
//! [`ConnectionTable::wait_ready`](super::ConnectionTable::wait_ready) or a table's
//! progress thread (`set.rs`), and a tokio task of an `AsyncConnection` (`task.rs`,
//! feature `tokio`) all wait by one model:
//!
//! 1. **Look.** The waiter makes progress ([`Connection::progress`](super::Connection::progress)
//!    or a call that makes it) and looks for what it waits for: a message, a credit, a
//!    completion, a connection with work. Found, the wait is over.
//! 2. **Spin, if it pays.** It looks again back to back for a while: an answer that comes
//!    that soon is taken without a wake (a system call on each side). The spin pays only
//!    where answers come that soon and burns a core where they do not, so it is adaptive:
//!    a connection's waits spin only while its last wait ended soon (`Pace`); a task
//!    also spins only while no other task of the process does (a claim on a
//!    `SpinWord`). A table's waits do not spin: their looks are their passes.
//! 3. **Arm.** It asks the connection to wake it at its next event (`Parkable::arm`):
//!    the core (a receive slot given back), the senders' queue (a message queued) and the
//!    endpoint each arm a wake, or say [`Armed::Pending`] when such an event is there
//!    already, and then it looks again instead of sleeping.
//! 4. **Sleep** on what the endpoint's [`Readiness`] names: its descriptor (watched with
//!    the thread's doorbell, in the table's `epoll` set, or by tokio's reactor) or the
//!    waker it was armed with (the thread's unpark, the table's doorway, the task's
//!    waker). An endpoint that cannot wake anybody ([`Readiness::Polling`]) is never
//!    slept on: the waiter sleeps `Backoff`'s sleeps between looks. No sleep outlasts
//!    the core's next timer (a promotion timing out, a demotion falling due) or the
//!    waiter's deadline.
//! 5. **Disarm**, woken or not, and look again.
//!
//! A listener that takes peers before they speak (`unheard.rs`) waits by the same model
//! with nothing to arm: it sleeps in `poll(2)` on its socket and the peers not yet heard.
//!
//! Who wakes whom: the endpoint wakes the armed waiter at its next event, through its
//! descriptor or the waker; a thread that gives a receive slot back or a
//! [`Sender`](super::Sender) that queues a message wakes it through the core's or the
//! queue's `Parker`; a connection kept in a table is armed with its doorways, which queue
//! it in the table's ready sets and ring their doorbells (`set.rs`); an async connection
//! is armed with the waker of its tasks and its driver (`tokio.rs`).
//!
//! # Invariants
//!
//! - **A wait sleeps only after an arm said [`Armed::Parked`]**, so nothing a look would
//!   act on was there when the wake was asked for, and whatever comes later wakes it.
//!   Every arm is followed by a disarm, woken or not (a task's next poll disarms first).
//!   The handshakes under the arms (`handshake.rs`) make sure that an event racing with
//!   the arm is either seen by the look or wakes the sleeper.
//! - **A waiter looks after each progress of its own and before each wait**: a progress
//!   may take the event it waits for (the last send's completion, say), and a wait after
//!   it may sleep until an event that never comes.
//! - **Timers fire while nothing else happens**: no sleep outlasts the connection's next
//!   timer. A timer already past (the progress did not move it) is polled, not spun on:
//!   it counts as a sleep ahead (`FIRST_SLEEP` for a blocking wait, `LONGEST_SLEEP`
//!   in a table).
//! - **A polling endpoint costs at most `LONGEST_SLEEP` of latency**: its sleeps double
//!   from `FIRST_SLEEP` to `LONGEST_SLEEP` and start short again after a look that
//!   did something.
//! - **The spin follows the answers** (`Pace`): a wait that slept long makes the
//!   connection's next wait sleep at once, with no spin, until a wait ends soon again; a
//!   wait that ends within its spin leaves the spin paying. A blocking wait judges by
//!   its sleep on the endpoint's wake (`Waiter::SPIN_PAYS_WITHIN`), a task's by the
//!   whole wait of its call (its spin's length).
//! - **A sleep on a descriptor also hears the process.** A blocking wait watches the
//!   thread's own doorbell (an `eventfd`, one per thread, made at its first such sleep)
//!   beside the endpoint's descriptor, and its waker rings it, so a wake from this
//!   process (a [`Sender`](super::Sender) queueing a message) ends the sleep too; a
//!   thread that cannot make one sleeps `LONGEST_SLEEP` at most. A table's doorbell sits
//!   in its `epoll` set beside the descriptors; a task's waker is its own.

mod handshake;
mod set;
#[cfg(all(feature = "tokio", not(loom)))]
mod task;
#[cfg(not(loom))]
mod unheard;

pub(crate) use handshake::Parker;
pub use handshake::SleepHandshake;
#[cfg(any(loom, feature = "tokio"))]
pub use handshake::{SpinClaim, SpinWord};
pub(super) use set::{Doorway, Doorways, ReadySet};
#[cfg(all(feature = "tokio", not(loom)))]
pub(super) use task::{Alarm, TaskWait, Wait, clock_nanos};
#[cfg(not(loom))]
pub(crate) use unheard::UnheardPeers;

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::Arc;
use std::task::{Wake, Waker};
use std::thread::{self, Thread};
use std::time::{Duration, Instant};

use rustix::event::{EventfdFlags, PollFd, PollFlags, Timespec};

use crate::provider::{Armed, Readiness};

/// The first sleep between looks at an endpoint that cannot wake anybody, and the
/// least a blocking wait sleeps for a timer already past.
pub(crate) const FIRST_SLEEP: Duration = Duration::from_micros(20);

/// The longest sleep between looks at an endpoint that cannot wake anybody: how late
/// such an endpoint's work is seen at worst, by any waiter (module invariants).
pub(crate) const LONGEST_SLEEP: Duration = Duration::from_millis(1);

/// What a wait arms and sleeps on: a connection's endpoint, core and senders' queue.
pub(crate) trait Parkable {
    /// How the endpoint wakes a sleeper.
    fn readiness(&self) -> Readiness<'_>;
    /// Asks for `waker` to be woken at the next event (module invariants); pending while
    /// work of this side waits to be done.
    fn arm(&mut self, waker: &Waker) -> Armed;
    /// Ends the wait begun by `arm`.
    fn disarm(&mut self);
    /// When progress is due with no event.
    fn next_timer(&self) -> Option<Instant>;
    /// What the connection's waits remember between them.
    fn pace(&mut self) -> &mut Pace;
}

/// What one connection's waits remember between them: whether its spin pays (module
/// invariants), and, for a task's waits (feature `tokio`), how many of its progress calls
/// did something.
#[derive(Debug)]
pub(crate) struct Pace {
    spin_pays: bool,
    #[cfg(feature = "tokio")]
    progress_made: u64,
}

impl Pace {
    /// A new connection's: its first wait spins.
    pub(crate) fn new() -> Pace {
        Pace {
            spin_pays: true,
            #[cfg(feature = "tokio")]
            progress_made: 0,
        }
    }

    /// Counts a progress call that took `done` completions and posted requests.
    pub(crate) fn progressed(&mut self, done: usize) {
        #[cfg(feature = "tokio")]
        if done > 0 {
            self.progress_made += 1;
        }
        #[cfg(not(feature = "tokio"))]
        let _ = done;
    }

    /// How many progress calls did something, ever: whoever saw it unchanged across a
    /// call knows the call took no event, and a wake it left pending may be owed.
    #[cfg(feature = "tokio")]
    pub(crate) fn progress_made(&self) -> u64 {
        self.progress_made
    }

    /// Whether the next wait spins before it arms.
    pub(crate) fn spin_pays(&self) -> bool {
        self.spin_pays
    }

    /// A wait (or its sleep) that began at `since` ended: the next wait spins if this one
    /// ended within `soon`.
    pub(crate) fn ended(&mut self, since: Instant, soon: Duration) {
        self.spin_pays = since.elapsed() <= soon;
    }
}

/// The sleeps between looks at an endpoint that cannot wake anybody: [`FIRST_SLEEP`],
/// doubling up to [`LONGEST_SLEEP`], short again after a look that did something.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Backoff(Duration);

impl Backoff {
    /// Starts short.
    pub(crate) const fn new() -> Backoff {
        Backoff(FIRST_SLEEP)
    }

    /// The next sleep; the one after is twice as long, up to [`LONGEST_SLEEP`].
    pub(crate) fn next(&mut self) -> Duration {
        let sleep = self.0;
        self.0 = (sleep * 2).min(LONGEST_SLEEP);
        sleep
    }
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
    /// The sleeps over a polling endpoint.
    polling: Backoff,
    /// [`Waiter::SPIN_PAYS_WITHIN`] (another length in tests).
    spin_pays_within: Duration,
}

impl Waiter {
    /// Passes made back to back before the wait sleeps: a few hundred microseconds of
    /// polling. The passes have no spin hint between them: a pass is a few dozen
    /// nanoseconds of work, not a loop on one load, and a hint (`pause` on x86) only
    /// delays the look that finds the message (the `transport` bench's shm pingpong shows
    /// its cost).
    pub(super) const TIGHT_POLLS: u32 = 1 << 12;
    /// Passes between two looks at the clock while passes are back to back.
    const PASSES_PER_CLOCK: u32 = 64;
    /// A sleep on the endpoint's wake that ends within this says that answers come soon:
    /// the connection's next wait makes its passes again (module invariants). About twice
    /// as long as the passes take, since the sleep's length includes the time the thread
    /// takes to wake: a bound as short as the passes would keep a thread whose peer
    /// answers within a fraction of a millisecond from spinning, each answer then paying
    /// a slow wake.
    pub(super) const SPIN_PAYS_WITHIN: Duration = Duration::from_millis(1);

    /// A wait that gives up at `deadline` (`None`: never).
    pub(super) fn new(deadline: Option<Instant>) -> Waiter {
        Waiter {
            deadline,
            passes: 0,
            waker: None,
            polling: Backoff::new(),
            spin_pays_within: Waiter::SPIN_PAYS_WITHIN,
        }
    }

    /// Starts the back-to-back passes again: the call made headway.
    pub(super) fn reset(&mut self) {
        self.passes = 0;
        self.polling = Backoff::new();
    }

    /// Waits before the next pass over `endpoint`: returns at once while passes are back
    /// to back, then sleeps until a wake, `timer`, or the deadline.
    ///
    /// # Errors
    ///
    /// [`Expired`] once the deadline has passed.
    pub(super) fn wait<P: Parkable>(&mut self, parked: &mut P) -> Result<(), Expired> {
        if self.passes == 0 && !parked.pace().spin_pays() {
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
        let timer = parked.next_timer().map(|at| at.max(now + FIRST_SLEEP));
        let wake_at = match (self.deadline, timer) {
            (Some(deadline), Some(timer)) => Some(deadline.min(timer)),
            (deadline, timer) => deadline.or(timer),
        };
        let timeout = wake_at.map(|at| at.saturating_duration_since(now));
        if matches!(parked.readiness(), Readiness::Polling) {
            let sleep = self.polling.next();
            thread::sleep(timeout.map_or(sleep, |t| t.min(sleep)));
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
                            let longest = timeout.map_or(LONGEST_SLEEP, |t| t.min(LONGEST_SLEEP));
                            let flags = PollFlags::IN | PollFlags::RDHUP;
                            let fds = &mut [PollFd::from_borrowed_fd(fd, flags)];
                            let _woken_or_failed = poll_for(fds, Some(longest));
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
            parked.pace().ended(now, self.spin_pays_within);
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
    let _woken_or_failed = poll_for(&mut fds, timeout);
    if !fds[1].revents().is_empty() {
        let mut count = [0u8; 8];
        // Read to quiet it; nothing to learn from the count.
        let _ = rustix::io::read(doorbell, &mut count);
    }
}

/// `poll(2)` on `fds` for `timeout` (an hour at most: the caller waits again; `None`:
/// until one fires); an interruption counts as a wake.
///
/// # Errors
///
/// What `poll(2)` fails with, but an interruption.
fn poll_for(fds: &mut [PollFd<'_>], timeout: Option<Duration>) -> rustix::io::Result<()> {
    const LONGEST: Duration = Duration::from_secs(3600);
    let timeout =
        timeout.map(|t| Timespec::try_from(t.min(LONGEST)).expect("an hour is a valid timespec"));
    match rustix::event::poll(fds, timeout.as_ref()) {
        Ok(_) | Err(rustix::io::Errno::INTR) => Ok(()),
        Err(errno) => Err(errno),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An endpoint that sleeps on `fd` and counts its arms, with a timer `timer` ahead.
    struct Sleeper {
        fd: OwnedFd,
        arms: u32,
        timer: Duration,
        pace: Pace,
    }

    impl Sleeper {
        /// `ready`: the descriptor reads as ready, so a sleep on it ends at once.
        fn new(ready: bool, spin_pays: bool) -> Sleeper {
            let fd = rustix::event::eventfd(u32::from(ready), EventfdFlags::CLOEXEC)
                .expect("an eventfd");
            let mut pace = Pace::new();
            pace.spin_pays = spin_pays;
            Sleeper {
                fd,
                arms: 0,
                timer: Duration::from_millis(50),
                pace,
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
        fn pace(&mut self) -> &mut Pace {
            &mut self.pace
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
        assert!(!endpoint.pace.spin_pays());
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
            endpoint.pace.spin_pays(),
            "the descriptor was ready: the sleep ended at once"
        );
    }
}
