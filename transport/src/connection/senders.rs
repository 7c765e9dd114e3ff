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
//!   queue's `Parker` (`connection::readiness`) before it sleeps and then looks at the queue; a
//!   sender pushes, fences (`SeqCst`) and then wakes the parker. By the parker's
//!   invariants one of the two looks sees the other's write, so an item is never left
//!   queued while the connection sleeps.
//! - **The queue is bounded.** At most `limit` items wait; past that a sender waits (or
//!   [`Sender::try_send`] reports [`WouldBlock::SendersQueueFull`]) until the connection
//!   takes some, so senders faster than the peer cannot grow memory without bound.
//! - **Senders leave the connection slots of its own.** Queued items hold at most half of
//!   a tier's send slots (`slots_held`, counted from a sender's take until the connection
//!   takes the item to post it, or drops it posted, out of those it holds, `Held`); past that a
//!   sender copies its message instead. The connection needs send slots for its control
//!   and credit frames, for the packed frames it copies held messages into, and for the
//!   message at the front of the queue: a queue holding every slot behind a message
//!   waiting for one would never move.
//! - **Small messages that wait together share frames.** The connection takes up to
//!   `MAX_HELD` items off the queue at a time; a run of two or more small ones at the
//!   front (those the smallest tier carries whole, none begun) goes out through
//!   `ConnectionCore::try_send_batch`, copied into packed frames, in order, each a
//!   message of its own at the peer. A message that waits alone is posted from its slot
//!   as before.

use std::collections::VecDeque;
use std::fmt;
use std::io::IoSlice;
use std::sync::{Arc, Condvar, PoisonError};
use std::task::Waker;
use std::time::{Duration, Instant};

use tierbuf_tiers::{OwnedTierCache, OwnedTierSlot};

use super::errors::{ConnectionError, SendError, WouldBlock};
use super::header::HEADER_LEN;
use crate::connection::readiness::Parker;
use crate::provider::Armed;
use crate::sync::{AtomicU64, AtomicUsize, Ordering, UnboundedQueue, fence};

/// The most items the connection takes off its senders' queue to hold at once: what one
/// call of `ConnectionCore::try_send_batch` is given, as the async sink holds at most as
/// many.
pub(crate) const MAX_HELD: usize = 64;

/// The first [`MAX_HELD`] of `messages` as the parts of one batch, and how many there
/// are; the places past them are empty.
pub(crate) fn batch_parts<'a>(
    messages: impl IntoIterator<Item = &'a [u8]>,
) -> ([&'a [u8]; MAX_HELD], usize) {
    let mut parts: [&[u8]; MAX_HELD] = [&[]; MAX_HELD];
    let mut count = 0;
    for (part, message) in parts.iter_mut().zip(messages) {
        *part = message;
        count += 1;
    }
    (parts, count)
}

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
    /// Items ever accepted: counted before the push, so an item whose push returned is
    /// counted before any item accepted after that (`Connection::flush`).
    accepted: AtomicU64,
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
            accepted: AtomicU64::new(0),
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
            tierbuf_pool::sync::planted::Bug::SendQueueCountAfterPush,
        ) {
            self.items.push(item);
            self.accepted.fetch_add(1, Ordering::AcqRel);
            fence(Ordering::SeqCst);
            self.wake_parked();
            return Ok(());
        }
        self.accepted.fetch_add(1, Ordering::AcqRel);
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

    /// How many items were ever accepted (module invariants).
    pub fn accepted(&self) -> u64 {
        self.accepted.load(Ordering::Acquire)
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

    /// The connection took a held item that held a send slot out to post it.
    fn slot_taken(&self) {
        self.slots_held.fetch_sub(1, Ordering::AcqRel);
    }

    /// The connection put an item it took out back as the oldest it holds: its slot is
    /// counted again, as it was before it was taken.
    fn slot_put_back(&self) {
        self.slots_held.fetch_add(1, Ordering::AcqRel);
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

    /// Waits for room (or a close) for [`ROOM_WAIT`] at most, and not past `deadline`.
    fn wait_for_room(&self, deadline: Option<Instant>) {
        let closed = self.closed.lock().unwrap_or_else(PoisonError::into_inner);
        if closed.is_none() && self.len.load(Ordering::Acquire) >= self.limit {
            let wait = deadline.map_or(ROOM_WAIT, |deadline| {
                ROOM_WAIT.min(deadline.saturating_duration_since(Instant::now()))
            });
            let _waited = self.room.wait_timeout(closed, wait);
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
/// # let config = Arc::new(ConnectionConfig::new(Arc::new(TierLadder::preset("two-tier")?))?);
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
    /// The longest message the connection sends.
    max_message_len: u64,
}

impl Sender {
    /// A sender queueing on `queue`, taking slots through `slots` of a ladder whose tiers
    /// have `slot_counts` slots each, for messages of up to `max_message_len` bytes.
    pub(crate) fn new(
        queue: Arc<SendQueue<Queued>>,
        slots: OwnedTierCache,
        slot_counts: impl IntoIterator<Item = usize>,
        max_message_len: u64,
    ) -> Sender {
        let slot_limits = slot_counts.into_iter().map(|count| count / 2).collect();
        Sender {
            queue,
            slots,
            slot_limits,
            max_message_len,
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

    /// Queues `message` for the connection without waiting: all of it, as one message,
    /// or nothing.
    ///
    /// # Errors
    ///
    /// [`WouldBlock::SendersQueueFull`] while the connection has not taken what its
    /// senders queued; [`SendError::TooLong`]; [`SendError::Failed`] once the connection
    /// failed or is gone.
    pub fn try_send(&mut self, message: &[u8]) -> Result<(), SendError> {
        self.try_send_gather(&[IoSlice::new(message)])
    }

    /// [`Sender::try_send`] of one message given in parts, as one message whatever its
    /// parts.
    ///
    /// # Errors
    ///
    /// As [`Sender::try_send`].
    pub fn try_send_gather(&mut self, parts: &[IoSlice<'_>]) -> Result<(), SendError> {
        if let Some(failure) = self.queue.failure() {
            return Err(SendError::Failed(failure));
        }
        let len: usize = parts.iter().map(|part| part.len()).sum();
        if len as u64 > self.max_message_len {
            return Err(SendError::TooLong {
                len: len as u64,
                max: self.max_message_len,
            });
        }
        let item = match self.take_slot(len) {
            Some(mut slot) => {
                let mut at = HEADER_LEN;
                for part in parts {
                    slot[at..at + part.len()].copy_from_slice(part);
                    at += part.len();
                }
                Queued::Filled { slot, len }
            }
            None => Queued::Owned(parts.iter().flat_map(|part| part.iter().copied()).collect()),
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
    /// As [`Sender::try_send`], but for [`SendError::WouldBlock`].
    pub fn send(&mut self, message: &[u8]) -> Result<(), SendError> {
        self.send_until(&[IoSlice::new(message)], None)
    }

    /// [`Sender::send`], giving up at `deadline` with [`SendError::TimedOut`] (nothing of
    /// the message was queued then): a queue stays full for as long as nobody drives the
    /// connection.
    ///
    /// # Errors
    ///
    /// As [`Sender::send`], and [`SendError::TimedOut`].
    pub fn send_deadline(&mut self, message: &[u8], deadline: Instant) -> Result<(), SendError> {
        self.send_until(&[IoSlice::new(message)], Some(deadline))
    }

    /// [`Sender::send`] of one message given in parts, as one message whatever its parts.
    ///
    /// # Errors
    ///
    /// As [`Sender::send`].
    pub fn send_gather(&mut self, parts: &[IoSlice<'_>]) -> Result<(), SendError> {
        self.send_until(parts, None)
    }

    fn send_until(
        &mut self,
        parts: &[IoSlice<'_>],
        deadline: Option<Instant>,
    ) -> Result<(), SendError> {
        loop {
            match self.try_send_gather(parts) {
                Err(SendError::WouldBlock(reason)) => {
                    if deadline.is_some_and(|deadline| Instant::now() >= deadline) {
                        return Err(SendError::TimedOut(reason));
                    }
                    self.queue.wait_for_room(deadline);
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
            max_message_len: self.max_message_len,
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

/// A message the connection took off its senders' queue and has not posted yet.
#[derive(Debug)]
pub(crate) enum Front {
    /// Filled in place in a send slot; posted from it as one frame, or copied into a
    /// packed frame.
    Filled {
        /// The slot, the message after its header room.
        slot: OwnedTierSlot,
        /// The message's length.
        len: usize,
    },
    /// Its bytes, `sent` of them posted.
    Owned {
        /// The message.
        bytes: Vec<u8>,
        /// How many of its leading bytes are posted.
        sent: usize,
    },
}

impl Front {
    /// The bytes not posted yet.
    fn rest(&self) -> &[u8] {
        match self {
            Front::Filled { slot, len } => &slot[HEADER_LEN..HEADER_LEN + len],
            Front::Owned { bytes, sent } => &bytes[*sent..],
        }
    }

    /// Whether some of it is posted: the rest of a segmented message, which nothing may
    /// overtake.
    fn is_begun(&self) -> bool {
        matches!(self, Front::Owned { sent: 1.., .. })
    }

    /// Whether it is in a send slot counted in the queue's `slots_held` while held.
    fn holds_slot(&self) -> bool {
        matches!(self, Front::Filled { .. })
    }
}

/// The messages the connection took off its senders' queue and has not posted, oldest
/// first. A held message's slot stays counted in the queue's `slots_held` until it leaves
/// (module invariants).
#[derive(Debug, Default)]
pub(crate) struct Held {
    fronts: VecDeque<Front>,
    /// Items ever taken off the queue.
    taken: u64,
    /// While a flush waits for the items accepted before it: how many may be taken, so
    /// that items queued since keep no send in flight under it.
    take_up_to: Option<u64>,
}

impl Held {
    /// Takes queued items behind those held, until [`MAX_HELD`] are held or the queue is
    /// empty.
    pub(crate) fn refill(&mut self, queue: &SendQueue<Queued>) {
        while self.fronts.len() < MAX_HELD && self.takes_more() {
            let Some(item) = queue.pop() else {
                break;
            };
            self.taken += 1;
            self.fronts.push_back(match item {
                Queued::Filled { slot, len } => Front::Filled { slot, len },
                Queued::Owned(bytes) => Front::Owned { bytes, sent: 0 },
            });
        }
    }

    /// Whether it takes more items off the queue: not while a flush has all it waits for.
    pub(crate) fn takes_more(&self) -> bool {
        self.take_up_to.is_none_or(|up_to| self.taken < up_to)
    }

    /// Takes no more than the first `count` items the queue accepted, until called again
    /// with `None`.
    pub(crate) fn take_up_to(&mut self, count: Option<u64>) {
        self.take_up_to = count;
    }

    /// Whether the first `count` items the queue accepted have all been taken off it and
    /// none is held: all are posted. Items leave the queue in the order they were
    /// accepted, except for pushes under way at once, and an item whose push returned
    /// precedes every item accepted after it, so once `count` are taken, every item
    /// accepted before `count` was read is among them.
    pub(crate) fn posted_all(&self, count: u64) -> bool {
        self.fronts.is_empty() && self.taken >= count
    }

    /// How many of the oldest, none begun, are of a length `small` takes: the run to pack.
    pub(crate) fn small_run(&self, small: impl Fn(usize) -> bool) -> usize {
        self.fronts
            .iter()
            .take_while(|front| !front.is_begun() && small(front.rest().len()))
            .count()
    }

    /// The bytes of the oldest held messages, in order, as many as are held (at most
    /// [`MAX_HELD`]); the places past them are empty.
    pub(crate) fn oldest(&self) -> [&[u8]; MAX_HELD] {
        batch_parts(self.fronts.iter().map(Front::rest)).0
    }

    /// Drops the oldest `count`, whose bytes were copied into frames posted: their slots go
    /// back to their pool.
    pub(crate) fn copied(&mut self, count: usize, queue: &SendQueue<Queued>) {
        for front in self.fronts.drain(..count) {
            if front.holds_slot() {
                queue.slot_taken();
            }
        }
    }

    /// Takes the oldest out, to post it alone.
    pub(crate) fn take(&mut self, queue: &SendQueue<Queued>) -> Option<Front> {
        let front = self.fronts.pop_front()?;
        if front.holds_slot() {
            queue.slot_taken();
        }
        Some(front)
    }

    /// Puts `front`, taken out and not posted (or not all of it), back as the oldest.
    pub(crate) fn put_back(&mut self, front: Front, queue: &SendQueue<Queued>) {
        if front.holds_slot() {
            queue.slot_put_back();
        }
        self.fronts.push_front(front);
    }
}
