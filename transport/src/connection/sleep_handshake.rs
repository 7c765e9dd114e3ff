//! [`SleepHandshake`]: how a table's sleeper (a thread in
//! [`ConnectionTable::wait_ready`](super::ConnectionTable::wait_ready), or the table's
//! progress thread) and the threads that queue connections for it make sure that no
//! queued connection is slept through. Module `ready` keeps one per ready set and adds
//! the doorbell, an `eventfd` that a ring leaves readable until the sleeper reads it.
//!
//! # Invariants
//!
//! - A queuer pushes the connection's id, fences (`SeqCst`), then looks at `sleeping`,
//!   and rings the doorbell if it is set ([`SleepHandshake::queue`]).
//! - A sleeper sets `sleeping`, fences (`SeqCst`), then looks at the queue, and sleeps
//!   only if it is empty ([`SleepHandshake::begin_sleep`]).
//! - In the single order of the two fences, the side whose fence comes later sees the
//!   other's write: either the sleeper finds the id queued and does not sleep, or the
//!   queuer finds `sleeping` set and rings, and the ring ends the sleep (now, or at once
//!   when it begins, since the doorbell stays readable). So a sleeper never sleeps
//!   through a queued connection. A ring may be needless (the sleeper found the id
//!   itself): it costs one empty wake.
//!
//! The loom model `connection_models::a_queued_connection_is_never_slept_through`
//! checks this on this code, with `Bug::ReadyQueueLookBeforePush` as its broken twin.

use super::table::ConnectionId;
use crate::sync::{AtomicBool, Ordering, UnboundedQueue, fence};

/// The ids queued for a sleeper, and whether it sleeps (module invariants).
///
/// ```
/// use tierbuf_transport::connection::ConnectionId;
/// use tierbuf_transport::connection::sleep_handshake::SleepHandshake;
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
