//! The readiness model (`mod.rs`) across the connections of a
//! [`ConnectionTable`](crate::connection::ConnectionTable): which ones to look at, and how
//! a waiting thread sleeps until one of them may have work, so that a table of thousands
//! of idle connections costs nothing while they stay idle. `docs/connection.md` ("Waiting
//! on many connections") gives the design.
//!
//! A table has up to two ready sets: one for the users' waits
//! ([`ConnectionTable::wait_ready`](crate::connection::ConnectionTable::wait_ready)), and
//! one for its progress thread. Each connection has a [`Doorway`] into each, and its
//! waker ([`Doorways`]) queues it in both; its descriptor is registered in both `epoll`
//! sets.
//! The invariants below hold for each set on its own.
//!
//! # Invariants
//!
//! - **Every connection is armed or queued.** Outside a look, a connection in the table
//!   is armed ([`Endpoint::arm`] said it parked, so its next event wakes it), queued in
//!   `look` (so the next wait looks at it), due to be looked at by a timer a polling
//!   sleep ahead, held by a user (whose guard queues it when dropped), or was handed out
//!   by the last wait (which queues it again at the next; in the progress thread's set,
//!   handed to the waiters because it failed, and queued again by its user's unlock). A
//!   look disarms, progresses and re-arms it, or hands it out, or, when the arm finds
//!   work pending, queues it again: at once if its progress moved something, else by
//!   a timer. So no event of any connection goes unseen by the next wait.
//! - **A wake reaches the sleeper.** An endpoint's wake comes through its descriptor
//!   (registered in the set's `epoll` instance, with the connection's id as its token)
//!   or through the connection's waker, which queues the id and rings the doorbell (an
//!   `eventfd` in the same set) if a waiter is sleeping. Whether to ring, and whether to
//!   sleep, is the [`SleepHandshake`]'s (`handshake.rs`, and its loom model), so
//!   the waiter never sleeps with an id queued and no doorbell rung.
//! - **Each id is queued once.** `queued` is set by whoever pushes the id and cleared by
//!   the look that pops it, before it looks: a wake during the look queues it again.
//! - **Timers are kept, once per connection.** After a connection is armed, its next
//!   timer (a promotion that may time out, a demotion falling due) goes into `timers`;
//!   the sleep ends at the earliest, and a due timer queues its connection. A timer is
//!   kept only if it falls before the one the connection has pending already (the look
//!   that one causes keeps the next), so a busy connection, looked at thousands of times
//!   a second with a demotion a minute ahead, holds one entry, not one per look. Entries
//!   of connections that have moved on are harmless: the look finds nothing to do and
//!   re-arms. A timer already past when it is added (one the look's progress did not
//!   move) is put a [`LONGEST_SLEEP`] ahead, so a connection whose timer does not move is
//!   polled, not spun on.
//! - **Wakes are never starved.** Every wait reads the `epoll` set, without waiting when
//!   connections are queued already, so a queue that refills itself (timers due back to
//!   back) cannot keep a descriptor's wake unread.
//! - **A wake the look could not take is not lost.** In the waiters' set descriptors are
//!   level-triggered: one still readable is reported again. In the progress thread's set
//!   they are edge-triggered, so that a connection its user holds, whose wake record
//!   stays unread, does not make the thread spin: each new record is reported once, and
//!   a look that finds the connection held queues it for after a polling sleep; the
//!   user's unlock queues it too.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::task::Wake;
use std::time::{Duration, Instant};

use rustix::event::epoll;
use rustix::event::{EventfdFlags, Timespec};

use super::super::table::ConnectionId;
use super::LONGEST_SLEEP;
use super::handshake::SleepHandshake;

/// The token of the doorbell in the `epoll` set; connection ids start at 1.
const DOORBELL: u64 = 0;

/// Events taken from the `epoll` set per wait.
const EVENTS_PER_WAIT: usize = 256;

/// The descriptors of a table's readiness, made at its first wait.
#[derive(Debug)]
struct Descriptors {
    epoll: OwnedFd,
    doorbell: OwnedFd,
}

/// The connections' timers in one ready set (module invariants).
#[derive(Debug, Default)]
struct Timers {
    by_time: BinaryHeap<Reverse<(Instant, ConnectionId)>>,
    /// Each connection's earliest timer in `by_time`.
    pending: HashMap<ConnectionId, Instant>,
}

/// What a table's waiters (or its progress thread) and its connections' wakers share.
#[derive(Debug, Default)]
pub(crate) struct ReadySet {
    descriptors: OnceLock<Descriptors>,
    /// Whether descriptors are registered edge-triggered (module invariants).
    edge_triggered: bool,
    /// Connections to look at in the next wait, and whether a waiter sleeps.
    look: SleepHandshake,
    timers: Mutex<Timers>,
}

/// One connection's place in the ready set: its id, whether it is queued, and the waker
/// its endpoint calls.
#[derive(Debug)]
pub(crate) struct Doorway {
    id: ConnectionId,
    queued: AtomicBool,
    ready: Arc<ReadySet>,
}

impl Doorway {
    pub(crate) fn new(id: ConnectionId, ready: Arc<ReadySet>) -> Doorway {
        Doorway {
            id,
            queued: AtomicBool::new(false),
            ready,
        }
    }

    /// Queues the connection for the next look, waking a sleeping waiter.
    pub(crate) fn queue(&self) {
        if !self.queued.swap(true, Ordering::AcqRel) {
            self.ready.push(self.id);
        }
    }

    /// The look at the connection begins: a wake from now on queues it again.
    pub(crate) fn take(&self) {
        self.queued.store(false, Ordering::Release);
    }

    /// Queues the connection for a look [`LONGEST_SLEEP`] from now, as a timer: held by
    /// somebody, or with work pending that no wake announces. A wake meanwhile queues it
    /// at once as well.
    pub(crate) fn queue_later(&self) {
        let now = Instant::now();
        self.ready.add_timer(now, now, self.id);
    }
}

/// One connection's doorways into its table's ready sets: the waiters' and, while the
/// table has a progress thread, the thread's. It is the waker the connection is armed
/// with, so every event queues the connection in both.
#[derive(Debug)]
pub(crate) struct Doorways {
    pub(crate) waiter: Doorway,
    pub(crate) progress: Option<Doorway>,
}

impl Doorways {
    /// Queues the connection in every set.
    pub(crate) fn queue(&self) {
        self.waiter.queue();
        if let Some(progress) = &self.progress {
            progress.queue();
        }
    }
}

impl Wake for Doorways {
    fn wake(self: Arc<Self>) {
        self.queue();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.queue();
    }
}

/// What one sleep found.
#[derive(Debug, Default)]
pub(crate) struct Woken {
    /// Whether the sleep ended by its timeout with nothing queued.
    pub(crate) timed_out: bool,
}

impl ReadySet {
    /// The set of a table's progress thread, with its descriptors made: they register
    /// edge-triggered (module invariants).
    ///
    /// # Errors
    ///
    /// The operating system's, when it cannot make them (its limit of open files).
    pub(crate) fn for_progress_thread() -> std::io::Result<ReadySet> {
        let set = ReadySet {
            edge_triggered: true,
            ..ReadySet::default()
        };
        set.descriptors()?;
        Ok(set)
    }

    /// Pushes `id` and rings the doorbell if a waiter sleeps (module invariants).
    fn push(&self, id: ConnectionId) {
        if self.look.queue(id) {
            self.ring();
        }
    }

    /// Rings the doorbell: a sleeper wakes (now, or at once when it next sleeps).
    pub(crate) fn ring(&self) {
        if let Some(descriptors) = self.descriptors.get() {
            // A doorbell already rung stays readable; a full counter is rung enough.
            let _rung_or_full = rustix::io::write(&descriptors.doorbell, &1u64.to_ne_bytes());
        }
    }

    /// The next connection to look at.
    pub(crate) fn pop(&self) -> Option<ConnectionId> {
        self.look.pop()
    }

    /// Queues a connection that cannot wake anybody, for this wait's look.
    pub(crate) fn push_polled(&self, id: ConnectionId) {
        self.look.queue_awake(id);
    }

    /// The `epoll` set and doorbell, made at the first call.
    ///
    /// # Errors
    ///
    /// The operating system's, when it cannot make them (its limit of open files).
    pub(crate) fn descriptors(&self) -> std::io::Result<bool> {
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
    pub(crate) fn register(&self, id: ConnectionId, fd: BorrowedFd<'_>) -> std::io::Result<()> {
        let Some(descriptors) = self.descriptors.get() else {
            return Ok(());
        };
        let mut flags = epoll::EventFlags::IN | epoll::EventFlags::RDHUP;
        if self.edge_triggered {
            flags |= epoll::EventFlags::ET;
        }
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
    pub(crate) fn deregister(&self, fd: BorrowedFd<'_>) {
        if let Some(descriptors) = self.descriptors.get() {
            // Not registered (the set was made after) is the only failure: nothing to undo.
            let _ = epoll::delete(&descriptors.epoll, fd);
        }
    }

    /// Keeps `at` as a time to look at `id` again; a time already past (a timer the
    /// look just made did not move) counts as [`LONGEST_SLEEP`] from `now`, so that such
    /// a connection is polled, not spun on.
    /// Kept only if it falls before the connection's pending timer (module invariants).
    pub(crate) fn add_timer(&self, at: Instant, now: Instant, id: ConnectionId) {
        let at = if at <= now { now + LONGEST_SLEEP } else { at };
        let mut timers = self.timers.lock().unwrap_or_else(PoisonError::into_inner);
        if timers
            .pending
            .get(&id)
            .is_some_and(|&pending| pending <= at)
        {
            return;
        }
        timers.pending.insert(id, at);
        timers.by_time.push(Reverse((at, id)));
    }

    /// How many timers the set keeps.
    #[cfg(test)]
    fn timers_kept(&self) -> usize {
        self.timers
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .by_time
            .len()
    }

    /// Queues the connections whose timers are due by `now`; returns the earliest timer
    /// left.
    fn queue_due_timers(&self, now: Instant) -> Option<Instant> {
        let mut timers = self.timers.lock().unwrap_or_else(PoisonError::into_inner);
        while let Some(&Reverse((at, id))) = timers.by_time.peek() {
            if at > now {
                return Some(at);
            }
            timers.by_time.pop();
            // A later entry of a connection that has an earlier one pending is stale.
            if timers.pending.get(&id) == Some(&at) {
                timers.pending.remove(&id);
            }
            self.look.queue_awake(id);
        }
        None
    }

    /// Sleeps until a wake, a due timer, or `until`, unless a connection is queued
    /// already; queues the connections whose descriptors fired. `poll_within` caps the
    /// sleep while some connection must be polled.
    ///
    /// # Errors
    ///
    /// The operating system's, from `epoll_wait`.
    pub(crate) fn sleep(
        &self,
        until: Instant,
        poll_within: Option<Duration>,
    ) -> std::io::Result<Woken> {
        let now = Instant::now();
        let mut wake_at = until;
        if let Some(timer) = self.queue_due_timers(now) {
            wake_at = wake_at.min(timer);
        }
        if let Some(poll_within) = poll_within {
            wake_at = wake_at.min(now + poll_within);
        }
        let descriptors = self
            .descriptors
            .get()
            .expect("a waiter makes the descriptors before it sleeps");
        // With connections queued already the set is still read, without waiting: a
        // queue that never empties (timers falling due back to back) must not starve the
        // descriptors' wakes.
        let timeout = if self.look.begin_sleep() {
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
        self.look.end_sleep();
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
                id => self.look.queue_awake(ConnectionId::new(id)),
            }
        }
        // A sleep that no wake ended ended for a timer (or `until`): the connections whose
        // timers fell due are looked at now. After a wake, the next sleep queues them.
        let timed_out = events.is_empty() && {
            let now = Instant::now();
            self.queue_due_timers(now);
            self.look.is_empty() && now >= until
        };
        Ok(Woken { timed_out })
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;
    use std::os::fd::AsFd;
    use std::os::unix::net::UnixStream;

    use super::*;

    const ID: ConnectionId = ConnectionId::new(7);

    /// Sleeps on `set` for at most 20 ms; returns the connections queued.
    fn queued_after_sleep(set: &ReadySet) -> Vec<ConnectionId> {
        set.sleep(Instant::now() + Duration::from_millis(20), None)
            .expect("epoll_wait");
        std::iter::from_fn(|| set.pop()).collect()
    }

    #[test]
    fn a_busy_connection_keeps_one_timer_however_often_it_is_looked_at() {
        let set = ReadySet::default();
        let now = Instant::now();
        // A look a microsecond apart, each with the demotion a minute ahead.
        for look in 0..10_000u64 {
            let at = now + Duration::from_secs(60) + Duration::from_micros(look);
            set.add_timer(at, now, ID);
        }
        assert_eq!(set.timers_kept(), 1);
        // An earlier timer (a promotion that may time out) is kept beside it, and falls
        // due first.
        set.add_timer(now + Duration::from_millis(1), now, ID);
        assert_eq!(set.timers_kept(), 2);
        let later = now + Duration::from_millis(2);
        assert_eq!(
            set.queue_due_timers(later),
            Some(now + Duration::from_secs(60))
        );
        assert_eq!(set.pop(), Some(ID));
        // Once it fell due, the look it caused keeps the next timer.
        set.add_timer(now + Duration::from_secs(61), later, ID);
        assert_eq!(set.timers_kept(), 2);
    }

    #[test]
    fn an_unread_wake_is_reported_again_to_waiters_and_once_to_the_progress_thread() {
        let (mut peer, wake) = UnixStream::pair().expect("a socket pair");
        let waiters = ReadySet::default();
        waiters.descriptors().expect("epoll");
        let progress = ReadySet::for_progress_thread().expect("epoll");
        for set in [&waiters, &progress] {
            set.register(ID, wake.as_fd()).expect("registered");
        }
        peer.write_all(&[1]).expect("a wake record");
        assert_eq!(queued_after_sleep(&waiters), [ID]);
        assert_eq!(queued_after_sleep(&progress), [ID]);
        // Nobody read the record (its connection was held).
        assert_eq!(queued_after_sleep(&waiters), [ID], "level-triggered");
        assert_eq!(queued_after_sleep(&progress), [], "edge-triggered");
        // A new record is a new edge.
        peer.write_all(&[1]).expect("a wake record");
        assert_eq!(queued_after_sleep(&progress), [ID]);
    }
}
