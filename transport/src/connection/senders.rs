//! [`Sender`]: a handle that sends on a [`Connection`](super::Connection) from any thread.
//! Each sender takes its send slot from the connection's send region through the
//! region's lock-free cache (`arc-swap`, [`OwnedTierCache`]), writes its message into it,
//! and hands the filled slot to the connection's [`SendQueue`], which the connection posts
//! in order at its next progress.
//!
//! # Invariants
//!
//! - **In order, once.** Items enter the queue in the order their senders pushed them and
//!   the connection takes them in that order, each once; an item the connection cannot
//!   post yet (no credit, a promotion pending) is kept at the front, so a sender's
//!   messages go out in the order it sent them.
//! - **A tier swap under a sender is safe.** A slot is an [`OwnedTierSlot`]: it keeps its
//!   tier's registration alive, whichever tier is in force by the time it is posted. The
//!   connection posts it as it is only when the message fits one frame of the send tier
//!   in force then; otherwise it sends the message's bytes as any other message (through
//!   a promotion or in segments) and the slot goes back to its pool.
//! - **A queued item wakes a parked connection.** The connection's thread arms the
//!   queue's `Parker` (`crate::parker`) before it sleeps and then looks at the queue; a
//!   sender pushes, fences (`SeqCst`) and then wakes the parker. By the parker's
//!   invariants one of the two looks sees the other's write, so an item is never left
//!   queued while the connection sleeps.
//! - **The queue is bounded.** At most `limit` items wait; past that a sender waits (or
//!   [`Sender::try_send`] reports [`WouldBlock::SendersQueueFull`]) until the connection
//!   takes some, so senders faster than the peer cannot grow memory without bound.
//! - **Senders leave the connection slots of its own.** Queued items hold at most half of
//!   a tier's send slots (`slots_held`, counted from a sender's take to the connection's
//!   pop); past that a sender copies its message instead. The connection needs send slots
//!   for its control and credit frames and for the message at the front of the queue: a
//!   queue holding every slot behind a message waiting for one would never move.

use std::fmt;
use std::sync::{Arc, Condvar, PoisonError};
use std::task::Waker;
use std::time::Duration;

use tierbuf_tiers::{OwnedTierCache, OwnedTierSlot};

use super::errors::{ConnectionError, SendError, WouldBlock};
use super::header::HEADER_LEN;
use crate::parker::Parker;
use crate::provider::Armed;
use crate::sync::{AtomicUsize, Ordering, UnboundedQueue, fence};

/// How long a sender that found the queue full waits for room before it looks again,
/// at most: the connection's thread wakes it sooner when it takes items.
const ROOM_WAIT: Duration = Duration::from_millis(1);

/// A message handed from a [`Sender`] to its connection.
#[derive(Debug)]
pub(crate) enum Queued {
    /// Written in place after the header room of a send slot: `len` bytes.
    Filled {
        /// The slot.
        slot: OwnedTierSlot,
        /// The message's length.
        len: usize,
    },
    /// Copied, when no slot of the tier in force could hold it or none was free.
    Owned(Vec<u8>),
}

/// The queue between a connection's senders and the connection (module invariants).
/// Public for the loom models of `tierbuf-loom-tests`, not an API.
#[doc(hidden)]
pub struct SendQueue<T> {
    items: UnboundedQueue<T>,
    /// Items pushed and not yet taken.
    len: AtomicUsize,
    limit: usize,
    /// Send slots held by queued items (module invariants).
    slots_held: AtomicUsize,
    /// The connection's thread's request to be woken by a push.
    parker: Parker,
    /// The connection's failure, once it has one or is gone; senders report it.
    closed: std::sync::Mutex<Option<Arc<ConnectionError>>>,
    /// Where senders wait for room.
    room: Condvar,
}

impl<T> SendQueue<T> {
    /// An empty queue holding at most `limit` items.
    pub fn new(limit: usize) -> SendQueue<T> {
        SendQueue {
            items: UnboundedQueue::new(),
            len: AtomicUsize::new(0),
            limit: limit.max(1),
            slots_held: AtomicUsize::new(0),
            parker: Parker::default(),
            closed: std::sync::Mutex::new(None),
            room: Condvar::new(),
        }
    }

    /// Queues `item` unless the queue is full (then hands it back), waking the
    /// connection's thread if it parked.
    ///
    /// # Errors
    ///
    /// The item, when `limit` items wait already.
    pub fn push(&self, item: T) -> Result<(), T> {
        if self.len.fetch_add(1, Ordering::AcqRel) >= self.limit {
            self.len.fetch_sub(1, Ordering::AcqRel);
            return Err(item);
        }
        #[cfg(loom)]
        if tierbuf_pool::sync::planted::is_planted(
            tierbuf_pool::sync::planted::Bug::SendQueueWakeBeforePush,
        ) {
            self.wake_parked();
            self.items.push(item);
            return Ok(());
        }
        self.items.push(item);
        fence(Ordering::SeqCst);
        self.wake_parked();
        Ok(())
    }

    /// Wakes the connection's thread if it parked, taking its request.
    fn wake_parked(&self) {
        self.parker.wake();
    }

    /// The oldest item.
    pub fn pop(&self) -> Option<T> {
        let item = self.items.pop()?;
        self.len.fetch_sub(1, Ordering::AcqRel);
        Some(item)
    }

    /// Asks for `waker` to be woken at the next push; [`Armed::Pending`] when an item is
    /// queued already (module invariants).
    pub fn arm(&self, waker: &Waker) -> Armed {
        self.parker.arm(waker);
        if self.items.is_empty() {
            Armed::Parked
        } else {
            Armed::Pending
        }
    }

    /// Withdraws the request to be woken.
    pub fn disarm(&self) {
        self.parker.disarm();
    }

    /// Counts a send slot taken for a queued item, if fewer than `limit` are held.
    fn hold_slot(&self, limit: usize) -> bool {
        if self.slots_held.fetch_add(1, Ordering::AcqRel) >= limit {
            self.slots_held.fetch_sub(1, Ordering::AcqRel);
            return false;
        }
        true
    }

    /// The connection took a queued item that held a send slot.
    pub(crate) fn slot_taken(&self) {
        self.slots_held.fetch_sub(1, Ordering::AcqRel);
    }

    /// Tells waiting senders that items were taken.
    pub(crate) fn made_room(&self) {
        // Under the lock a waiting sender checks the count under, so no wake falls between
        // its check and its wait.
        let _checks_wait = self.closed.lock().unwrap_or_else(PoisonError::into_inner);
        self.room.notify_all();
    }

    /// Records the connection's failure (or its end) for the senders, and wakes them.
    pub(crate) fn close(&self, failure: Arc<ConnectionError>) {
        let mut closed = self.closed.lock().unwrap_or_else(PoisonError::into_inner);
        if closed.is_none() {
            *closed = Some(failure);
        }
        drop(closed);
        self.room.notify_all();
    }

    fn failure(&self) -> Option<Arc<ConnectionError>> {
        self.closed
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Waits for room (or a close) for [`ROOM_WAIT`] at most.
    fn wait_for_room(&self) {
        let closed = self.closed.lock().unwrap_or_else(PoisonError::into_inner);
        if closed.is_none() && self.len.load(Ordering::Acquire) >= self.limit {
            let _waited = self.room.wait_timeout(closed, ROOM_WAIT);
        }
    }
}

impl<T> fmt::Debug for SendQueue<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SendQueue")
            .field("len", &self.len.load(Ordering::Relaxed))
            .field("limit", &self.limit)
            .finish_non_exhaustive()
    }
}

/// Sends on a connection from any thread: clone it for each thread
/// ([`Connection::sender`](super::Connection::sender)). A message goes into a send slot
/// the sender takes from the connection's send tier in force through the tier's
/// lock-free cache, and is posted by the connection's own thread (whichever drives it:
/// its owner, a [`ConnectionTable`](super::ConnectionTable), or an async task) at its
/// next progress, in the order senders queued their messages.
///
/// ```
/// use std::thread;
/// # use std::sync::Arc;
/// # use std::time::Instant;
/// # use tierbuf_pool::MemoryBudget;
/// # use tierbuf_tiers::{Reservoir, ladder::TierLadder};
/// # use tierbuf_transport::connection::{Connection, ConnectionConfig, ConnectionCore};
/// # use tierbuf_transport::{LoopbackProvider, Provider};
/// # let provider = LoopbackProvider::new(MemoryBudget::with_cap(64 << 20));
/// # let config = Arc::new(ConnectionConfig::new(Arc::new(TierLadder::preset("patent")?))?);
/// # let reservoir = Arc::new(Reservoir::new(provider.registrar(), Arc::clone(config.ladder())));
/// # let (a, b) = provider.pair(config.queue_depth(), config.queue_depth())?;
/// # let connect = |endpoint| {
/// #     let core = ConnectionCore::new(
/// #         Arc::clone(&config), Arc::clone(&reservoir), Arc::clone(&reservoir), Instant::now(),
/// #     )?;
/// #     Ok::<_, Box<dyn std::error::Error>>(Connection::new(core, endpoint)?)
/// # };
/// # let (mut a, mut b) = (connect(a)?, connect(b)?);
/// let workers: Vec<_> = (0..2u8)
///     .map(|worker| {
///         let mut sender = a.sender();
///         thread::spawn(move || {
///             for round in 0..10u8 {
///                 sender.send(&[worker, round]).unwrap();
///             }
///         })
///     })
///     .collect();
/// // `a`'s thread posts what the workers queue; `b` gets each worker's in order.
/// let mut next = [0u8; 2];
/// for _ in 0..20 {
///     let message = loop {
///         a.progress()?;
///         if let Some(message) = b.try_recv()? {
///             break message;
///         }
///     };
///     let [worker, round] = message[..] else { panic!("two bytes") };
///     assert_eq!(round, next[worker as usize]);
///     next[worker as usize] += 1;
/// }
/// for worker in workers {
///     worker.join().unwrap();
/// }
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct Sender {
    queue: Arc<SendQueue<Queued>>,
    slots: OwnedTierCache,
    /// By tier: the most send slots queued items may hold (module invariants).
    slot_limits: Arc<[usize]>,
}

impl Sender {
    /// A sender queueing on `queue`, taking slots through `slots` of a ladder whose tiers
    /// have `slot_counts` slots each.
    pub(crate) fn new(
        queue: Arc<SendQueue<Queued>>,
        slots: OwnedTierCache,
        slot_counts: impl IntoIterator<Item = usize>,
    ) -> Sender {
        let slot_limits = slot_counts.into_iter().map(|count| count / 2).collect();
        Sender {
            queue,
            slots,
            slot_limits,
        }
    }

    /// A send slot of the tier in force for a message of `len` bytes, if one is free,
    /// holds it, and the queue may hold one more.
    fn take_slot(&mut self, len: usize) -> Option<OwnedTierSlot> {
        let slot = self.slots.try_acquire()?;
        let limit = self
            .slot_limits
            .get(usize::from(slot.tier().get()))
            .copied()
            .unwrap_or(0);
        (slot.len() >= HEADER_LEN + len && self.queue.hold_slot(limit)).then_some(slot)
    }

    /// Queues `message` for the connection without waiting.
    ///
    /// # Errors
    ///
    /// [`WouldBlock::SendersQueueFull`] while the connection has not taken what its
    /// senders queued; [`SendError::Failed`] once the connection failed or is gone.
    pub fn try_send(&mut self, message: &[u8]) -> Result<(), SendError> {
        if let Some(failure) = self.queue.failure() {
            return Err(SendError::Failed(failure));
        }
        let item = match self.take_slot(message.len()) {
            Some(mut slot) => {
                slot[HEADER_LEN..HEADER_LEN + message.len()].copy_from_slice(message);
                Queued::Filled {
                    slot,
                    len: message.len(),
                }
            }
            None => Queued::Owned(message.to_vec()),
        };
        self.queue.push(item).map_err(|refused| {
            if matches!(refused, Queued::Filled { .. }) {
                self.queue.slot_taken();
            }
            SendError::WouldBlock(WouldBlock::SendersQueueFull)
        })
    }

    /// Queues `message` for the connection, waiting while its queue is full.
    ///
    /// # Errors
    ///
    /// [`SendError::Failed`] once the connection failed or is gone.
    pub fn send(&mut self, message: &[u8]) -> Result<(), SendError> {
        loop {
            match self.try_send(message) {
                Err(SendError::WouldBlock(WouldBlock::SendersQueueFull)) => {
                    self.queue.wait_for_room();
                }
                other => return other,
            }
        }
    }
}

impl Clone for Sender {
    fn clone(&self) -> Sender {
        Sender {
            queue: Arc::clone(&self.queue),
            slots: self.slots.clone(),
            slot_limits: Arc::clone(&self.slot_limits),
        }
    }
}

impl fmt::Debug for Sender {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Sender")
            .field("queue", &self.queue)
            .finish_non_exhaustive()
    }
}
