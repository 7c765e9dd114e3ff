//! Readiness across the connections of a [`ConnectionTable`](super::ConnectionTable):
//! which ones to look at, and how a waiting thread sleeps until one of them may have
//! work, so that a table of thousands of idle connections costs nothing while they stay
//! idle. `docs/connection.md` ("Waiting on many connections") gives the design.
//!
//! # Invariants
//!
//! - **Every connection is armed or queued.** Outside a look, a connection in the table
//!   is armed ([`Endpoint::arm`] said it parked, so its next event wakes it), queued in
//!   `look` (so the next wait looks at it), held by a user (whose guard queues it when
//!   dropped), or was handed out ready by the last wait (which queues it again at the
//!   next). A look disarms, progresses and re-arms it, or hands it out, or queues it
//!   again when the arm finds work pending. So no event of any connection goes unseen by
//!   the next wait.
//! - **A wake reaches the sleeper.** An endpoint's wake comes through its descriptor
//!   (registered level-triggered in the table's `epoll` set, with the connection's id as
//!   its token) or through the connection's waker, which queues the id and rings the
//!   doorbell (an `eventfd` in the same set) if a waiter is sleeping. A queuer pushes the
//!   id, fences (`SeqCst`) and then looks at `sleeping`; a waiter sets `sleeping`,
//!   fences, and then looks at the queue: one of the two sees the other, so the waiter
//!   never sleeps with an id queued and no doorbell rung.
//! - **Each id is queued once.** `queued` is set by whoever pushes the id and cleared by
//!   the look that pops it, before it looks: a wake during the look queues it again.
//! - **Timers are kept.** After a connection is armed, its next timer (a promotion that
//!   may time out, a demotion falling due) goes into `timers`; the sleep ends at the
//!   earliest, and a due timer queues its connection. Entries of connections that have
//!   moved on are harmless: the look finds nothing to do and re-arms. A timer already
//!   past when it is added (one the look's progress did not move) is put a
//!   [`POLLING_SLEEP`] ahead, so a connection whose timer does not move is polled, not
//!   spun on.
//! - **Wakes are never starved.** Every wait reads the `epoll` set, without waiting when
//!   connections are queued already, so a queue that refills itself (timers due back to
//!   back) cannot keep a descriptor's wake unread. Registration is level-triggered: a
//!   descriptor still readable is reported again, so a look that could not drain it
//!   (its connection held by a user) loses nothing.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering, fence};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::task::Wake;
use std::time::{Duration, Instant};

use crossbeam_queue::SegQueue;
use rustix::event::epoll;
use rustix::event::{EventfdFlags, Timespec};

use super::table::ConnectionId;

/// The token of the doorbell in the `epoll` set; connection ids start at 1.
const DOORBELL: u64 = 0;

/// Events taken from the `epoll` set per wait.
const EVENTS_PER_WAIT: usize = 256;

/// The longest a wait sleeps while some connection cannot wake it
/// ([`Readiness::Polling`](crate::Readiness::Polling)): how late such a connection's work
/// is seen at worst.
pub(super) const POLLING_SLEEP: Duration = Duration::from_millis(1);

/// The descriptors of a table's readiness, made at its first wait.
#[derive(Debug)]
struct Descriptors {
    epoll: OwnedFd,
    doorbell: OwnedFd,
}

/// What a table's waiters and its connections' wakers share.
#[derive(Debug, Default)]
pub(super) struct ReadySet {
    descriptors: OnceLock<Descriptors>,
    /// Connections to look at in the next wait.
    look: SegQueue<ConnectionId>,
    /// Connections to look at again after a short sleep: held by somebody, or with work
    /// pending that no wake announces.
    later: SegQueue<ConnectionId>,
    /// Set while a waiter sleeps (or is about to).
    sleeping: AtomicBool,
    timers: Mutex<BinaryHeap<Reverse<(Instant, ConnectionId)>>>,
}

/// One connection's place in the ready set: its id, whether it is queued, and the waker
/// its endpoint calls.
#[derive(Debug)]
pub(super) struct Doorway {
    pub(super) id: ConnectionId,
    queued: AtomicBool,
    ready: Arc<ReadySet>,
}

impl Doorway {
    pub(super) fn new(id: ConnectionId, ready: Arc<ReadySet>) -> Doorway {
        Doorway {
            id,
            queued: AtomicBool::new(false),
            ready,
        }
    }

    /// Queues the connection for the next look, waking a sleeping waiter.
    pub(super) fn queue(&self) {
        if !self.queued.swap(true, Ordering::AcqRel) {
            self.ready.push(self.id);
        }
    }

    /// The look at the connection begins: a wake from now on queues it again.
    pub(super) fn take(&self) {
        self.queued.store(false, Ordering::Release);
    }

    /// Queues the connection for a look after the next short sleep (at most
    /// [`POLLING_SLEEP`]). A wake meanwhile queues it at once as well.
    pub(super) fn queue_later(&self) {
        self.ready.later.push(self.id);
    }
}

impl Wake for Doorway {
    fn wake(self: Arc<Self>) {
        self.queue();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.queue();
    }
}

/// What one sleep found.
#[derive(Debug, Default)]
pub(super) struct Woken {
    /// Whether the sleep ended by its timeout with nothing queued.
    pub(super) timed_out: bool,
}

impl ReadySet {
    /// Pushes `id` and rings the doorbell if a waiter sleeps (module invariants).
    fn push(&self, id: ConnectionId) {
        self.look.push(id);
        fence(Ordering::SeqCst);
        if self.sleeping.load(Ordering::Relaxed)
            && let Some(descriptors) = self.descriptors.get()
        {
            // A doorbell already rung stays readable; a full counter is rung enough.
            let _rung_or_full = rustix::io::write(&descriptors.doorbell, &1u64.to_ne_bytes());
        }
    }

    /// The next connection to look at.
    pub(super) fn pop(&self) -> Option<ConnectionId> {
        self.look.pop()
    }

    /// Queues a connection that cannot wake anybody, for this wait's look.
    pub(super) fn push_polled(&self, id: ConnectionId) {
        self.look.push(id);
    }

    /// Moves the connections queued for later into the look queue; returns whether there
    /// were any.
    pub(super) fn requeue_later(&self) -> bool {
        let mut any = false;
        while let Some(id) = self.later.pop() {
            self.look.push(id);
            any = true;
        }
        any
    }

    /// The `epoll` set and doorbell, made at the first call.
    ///
    /// # Errors
    ///
    /// The operating system's, when it cannot make them (its limit of open files).
    pub(super) fn descriptors(&self) -> std::io::Result<bool> {
        if self.descriptors.get().is_some() {
            return Ok(false);
        }
        let epoll = epoll::create(epoll::CreateFlags::CLOEXEC)?;
        let doorbell = rustix::event::eventfd(0, EventfdFlags::CLOEXEC | EventfdFlags::NONBLOCK)?;
        epoll::add(
            &epoll,
            &doorbell,
            epoll::EventData::new_u64(DOORBELL),
            epoll::EventFlags::IN,
        )?;
        Ok(self
            .descriptors
            .set(Descriptors { epoll, doorbell })
            .is_ok())
    }

    /// Registers a connection's wake descriptor, if the set exists yet (otherwise the
    /// first wait registers every connection).
    pub(super) fn register(&self, id: ConnectionId, fd: BorrowedFd<'_>) -> std::io::Result<()> {
        let Some(descriptors) = self.descriptors.get() else {
            return Ok(());
        };
        let flags = epoll::EventFlags::IN | epoll::EventFlags::RDHUP;
        match epoll::add(
            &descriptors.epoll,
            fd,
            epoll::EventData::new_u64(id.get()),
            flags,
        ) {
            // Registered by the first wait and by the insert that raced with it.
            Err(rustix::io::Errno::EXIST) => Ok(()),
            other => other.map_err(Into::into),
        }
    }

    /// Takes a connection's wake descriptor out of the set, before it is closed.
    pub(super) fn deregister(&self, fd: BorrowedFd<'_>) {
        if let Some(descriptors) = self.descriptors.get() {
            // Not registered (the set was made after) is the only failure: nothing to undo.
            let _ = epoll::delete(&descriptors.epoll, fd);
        }
    }

    /// Keeps `at` as a time to look at `id` again; a time already past (a timer the
    /// look just made did not move) counts as [`POLLING_SLEEP`] from `now`, so that such
    /// a connection is polled, not spun on.
    pub(super) fn add_timer(&self, at: Instant, now: Instant, id: ConnectionId) {
        let at = if at <= now { now + POLLING_SLEEP } else { at };
        self.timers
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(Reverse((at, id)));
    }

    /// Queues the connections whose timers are due by `now`; returns the earliest timer
    /// left.
    fn queue_due_timers(&self, now: Instant) -> Option<Instant> {
        let mut timers = self.timers.lock().unwrap_or_else(PoisonError::into_inner);
        while let Some(&Reverse((at, id))) = timers.peek() {
            if at > now {
                return Some(at);
            }
            timers.pop();
            self.look.push(id);
        }
        None
    }

    /// Sleeps until a wake, a due timer, or `until`, unless a connection is queued
    /// already; queues the connections whose descriptors fired. `polling` caps the sleep
    /// at [`POLLING_SLEEP`].
    ///
    /// # Errors
    ///
    /// The operating system's, from `epoll_wait`.
    pub(super) fn sleep(&self, until: Instant, polling: bool) -> std::io::Result<Woken> {
        let now = Instant::now();
        let mut wake_at = until;
        if let Some(timer) = self.queue_due_timers(now) {
            wake_at = wake_at.min(timer);
        }
        if polling {
            wake_at = wake_at.min(now + POLLING_SLEEP);
        }
        let descriptors = self
            .descriptors
            .get()
            .expect("a waiter makes the descriptors before it sleeps");
        self.sleeping.store(true, Ordering::Relaxed);
        fence(Ordering::SeqCst);
        // With connections queued already the set is still read, without waiting: a
        // queue that never empties (timers falling due back to back) must not starve the
        // descriptors' wakes.
        let timeout = if self.look.is_empty() {
            wake_at.saturating_duration_since(now)
        } else {
            Duration::ZERO
        };
        let timeout = Timespec::try_from(timeout).expect("a wait's timeout is a valid timespec");
        let mut events = Vec::with_capacity(EVENTS_PER_WAIT);
        let waited = epoll::wait(
            &descriptors.epoll,
            rustix::buffer::spare_capacity(&mut events),
            Some(&timeout),
        );
        self.sleeping.store(false, Ordering::Relaxed);
        match waited {
            Ok(_) | Err(rustix::io::Errno::INTR) => {}
            Err(errno) => return Err(errno.into()),
        }
        for event in &events {
            match event.data.u64() {
                DOORBELL => {
                    let mut count = [0u8; 8];
                    // Read to quiet it; nothing to learn from the count.
                    let _ = rustix::io::read(descriptors.doorbell.as_fd(), &mut count);
                }
                id => self.look.push(ConnectionId::new(id)),
            }
        }
        let timed_out = events.is_empty() && self.look.is_empty() && Instant::now() >= until;
        Ok(Woken { timed_out })
    }
}
