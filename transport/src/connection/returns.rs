//! Receive slots lent to delivered zero-copy messages, and their way back to the
//! connection's thread to be reposted. This is the only connection state that crosses
//! threads: credits, the slot tables and the negotiation stay with the thread that drives
//! the connection.
//!
//! # Invariants
//!
//! - A receive slot delivered as a zero-copy message is owned by its [`LentSlot`] until the
//!   message is dropped, on any thread. The drop pushes the slot onto the connection's
//!   queue exactly once ([`LentSlot`]'s `Drop`), and only the connection's thread takes it
//!   off ([`ReturnedSlots::take_returned`]) to repost it. So a slot is always in exactly
//!   one place — a message, the queue, or the connection's posted receives — and is never
//!   reposted while a message can still read it.
//! - The queue (crossbeam's `SegQueue`, a loom stand-in under `cfg(loom)`, both behind
//!   `crate::sync`) hands a slot over with happens-before, so its repost, and the peer's
//!   next write into it, are ordered after the message's last read.
//! - [`ReturnedSlots::given_back`] counts the slots that dropped messages gave back, ever.
//!   Drops on any thread raise it, each by one atomic read-modify-write, so no update is
//!   lost; the connection's thread counts the slots it lent itself, so lending takes no
//!   atomic operation, and the slots held by messages are the difference. A drop raises
//!   the count *before* queuing the slot, and the queue orders the two for the thread that
//!   takes the slot off, so that thread never counts a slot both as posted and as lent:
//!   posted receives plus lent slots never pass the slots of the tier. Nothing else is
//!   ordered by the count: `Relaxed` suffices.
//! - Every [`LentSlot`] holds a reference to the queue, so a message outlives its
//!   connection safely. [`ReturnedSlots::lend`] takes that reference ready-made: the
//!   connection clones it when it posts the receive, off the path of a delivery.
//!
//! - A reassembled message's buffer comes back the same way ([`LentBuffer`]), into
//!   `spare_buffer` under its mutex, for the next segmented message to reuse: so a stream
//!   of large messages does not allocate (and fault in) a fresh buffer for each. At most
//!   one buffer is kept, of at most `spare_limit` bytes.
//!
//! - A slot given back while the connection's thread is parked wakes it, so a message
//!   dropped on another thread gets its receive reposted (and granted to the peer) without
//!   waiting for another event: the connection's thread arms its `Parker`
//!   (`connection::readiness`) and then looks at the queue; a give-back pushes, fences
//!   (`SeqCst`), and then wakes the parker, whose invariants make sure one of the two
//!   looks sees the other's write.
//!
//! The loom model `connection_models::returned_slots_across_threads` checks these on the
//! shipped code, with the planted bug `Bug::LentCountLoadThenStore` as its broken variant.

use std::fmt;
use std::ops::Deref;
use std::task::Waker;

use tierbuf_tiers::{OwnedTierSlot, TierIndex};

use crate::connection::readiness::Parker;
use crate::provider::Armed;
use crate::sync::{Arc, AtomicUsize, Mutex, Ordering, UnboundedQueue, fence};

/// The queue of receive slots that messages gave back, the count of slots lent out, and
/// a spare buffer for reassembly.
#[derive(Debug)]
pub(super) struct ReturnedSlots {
    queue: UnboundedQueue<OwnedTierSlot>,
    given_back: AtomicUsize,
    /// Empty (no capacity) when there is none.
    spare_buffer: Mutex<Vec<u8>>,
    spare_limit: usize,
    /// The connection's thread's request to be woken by a give-back (module invariants).
    parker: Parker,
}

impl ReturnedSlots {
    /// Returns for a connection that keeps a reassembly buffer of up to `spare_limit`
    /// bytes for reuse.
    pub(super) fn new(spare_limit: usize) -> Arc<ReturnedSlots> {
        Arc::new(ReturnedSlots {
            queue: UnboundedQueue::new(),
            given_back: AtomicUsize::new(0),
            spare_buffer: Mutex::new(Vec::new()),
            spare_limit,
            parker: Parker::default(),
        })
    }

    /// Asks for `waker` to be woken at the next give-back; [`Armed::Pending`] when a slot
    /// waits already (module invariants).
    pub(super) fn arm(&self, waker: &Waker) -> Armed {
        self.parker.arm(waker);
        if self.queue.is_empty() {
            Armed::Parked
        } else {
            Armed::Pending
        }
    }

    /// Withdraws the request to be woken.
    pub(super) fn disarm(&self) {
        self.parker.disarm();
    }

    /// An empty buffer with room for `len` bytes: the spare one if it is large enough.
    pub(super) fn take_buffer(&self, len: usize) -> Vec<u8> {
        let mut spare = std::mem::take(&mut *self.lock_spare());
        if spare.capacity() >= len {
            spare.clear();
            spare
        } else {
            Vec::with_capacity(len)
        }
    }

    /// Frees the spare buffer (the connection has been idle).
    pub(super) fn drop_spare_buffer(&self) {
        drop(std::mem::take(&mut *self.lock_spare()));
    }

    /// The capacity of the spare buffer kept (0 for none).
    pub(super) fn spare_buffer_capacity(&self) -> usize {
        self.lock_spare().capacity()
    }

    /// Lends a reassembled message's `buffer` to the message; its drop gives it back.
    pub(super) fn lend_buffer(returns: &Arc<ReturnedSlots>, buffer: Vec<u8>) -> LentBuffer {
        LentBuffer {
            buffer,
            returns: Arc::clone(returns),
        }
    }

    fn lock_spare(&self) -> impl std::ops::DerefMut<Target = Vec<u8>> + '_ {
        // Every critical section leaves the buffer whole before anything can panic.
        self.spare_buffer
            .lock()
            .unwrap_or_else(|poison| poison.into_inner())
    }

    /// Lends `slot` to a message being delivered, which gives it back through `returns`,
    /// a reference to these returns; called on the connection's thread, which counts the
    /// slots it lends.
    pub(super) fn lend(returns: Arc<ReturnedSlots>, slot: OwnedTierSlot) -> LentSlot {
        LentSlot {
            slot: Some(slot),
            returns,
        }
    }

    /// The next slot a message gave back, to be reposted; called on the connection's
    /// thread. A slot whose give-back is under way at this moment may be found only by
    /// the next call.
    pub(super) fn take_returned(&self) -> Option<OwnedTierSlot> {
        // `is_empty` is two loads; `pop` on an empty queue also pays a fence, and this is
        // asked at every progress.
        if self.queue.is_empty() {
            return None;
        }
        self.queue.pop()
    }

    /// Slots given back by dropped messages, ever.
    pub(super) fn given_back(&self) -> usize {
        self.given_back.load(Ordering::Relaxed)
    }

    /// Takes a slot back from a dropped message; called on the thread that drops it.
    fn give_back(&self, slot: OwnedTierSlot) {
        // Counted before it is queued: the connection's thread, once it has taken the slot
        // off the queue, never counts it both as posted and as lent.
        #[cfg(loom)]
        if tierbuf_pool::sync::planted::is_planted(
            tierbuf_pool::sync::planted::Bug::LentCountLoadThenStore,
        ) {
            let given_back = self.given_back.load(Ordering::Relaxed);
            self.given_back.store(given_back + 1, Ordering::Relaxed);
            self.queue.push(slot);
            return;
        }
        self.given_back.fetch_add(1, Ordering::Relaxed);
        self.queue.push(slot);
        fence(Ordering::SeqCst);
        self.parker.wake();
    }
}

/// A reassembled message's buffer; dropping it offers the buffer back to its connection
/// for the next segmented message.
pub(super) struct LentBuffer {
    buffer: Vec<u8>,
    returns: Arc<ReturnedSlots>,
}

impl Deref for LentBuffer {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        &self.buffer
    }
}

impl Drop for LentBuffer {
    fn drop(&mut self) {
        if self.buffer.capacity() <= self.returns.spare_limit {
            *self.returns.lock_spare() = std::mem::take(&mut self.buffer);
        }
    }
}

impl fmt::Debug for LentBuffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LentBuffer")
            .field("len", &self.len())
            .finish_non_exhaustive()
    }
}

/// A receive slot lent to a delivered message; dropping it gives the slot back to its
/// connection.
pub(super) struct LentSlot {
    /// `Some` until the drop gives it back.
    slot: Option<OwnedTierSlot>,
    returns: Arc<ReturnedSlots>,
}

impl LentSlot {
    /// The tier of the slot lent.
    pub(super) fn tier(&self) -> Option<TierIndex> {
        self.slot.as_ref().map(OwnedTierSlot::tier)
    }
}

impl Deref for LentSlot {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        self.slot.as_deref().unwrap_or_default()
    }
}

impl Drop for LentSlot {
    fn drop(&mut self) {
        if let Some(slot) = self.slot.take() {
            self.returns.give_back(slot);
        }
    }
}

impl fmt::Debug for LentSlot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LentSlot")
            .field("len", &self.len())
            .finish_non_exhaustive()
    }
}
