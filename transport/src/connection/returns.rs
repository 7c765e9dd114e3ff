//! Receive slots lent to delivered zero-copy messages, and their way back to the
//! connection's thread to be reposted. This is the only connection state that crosses
//! threads: credits, the slot tables and the negotiation stay with the thread that drives
//! the connection.
//!
//! # Invariants
//!
//! - A receive slot delivered as a zero-copy message is owned by its [`LentSlot`] until the
//!   message is dropped, on any thread. The drop pushes the slot onto the connection's
//!   stack exactly once ([`LentSlot`]'s `Drop`), and only the connection's thread takes it
//!   off ([`ReturnedSlots::take_returned`]) to repost it. So a slot is always in exactly
//!   one place — a message, the stack, or the connection's posted receives — and is never
//!   reposted while a message can still read it.
//! - The slots given back wait in a stack of nodes, one node to a slot, each lent with its
//!   slot ([`Node`]): a drop writes its slot into its node and pushes the node with one
//!   compare-and-swap (`Release`); the connection's thread takes the whole stack with one
//!   swap (`Acquire`) and only then reads the nodes, and keeps them to lend again
//!   ([`TakenSlots`]). The push's `Release` and the swap's `Acquire` hand each slot over
//!   with happens-before, so its repost, and the peer's next write into it, are ordered
//!   after the message's last read. A node is owned by one side at a time: its
//!   [`LentSlot`], then the stack, then the connection's thread; only a push that found
//!   the stack unchanged publishes it, and nothing but the swap-all takes nodes off, so no
//!   node is seen twice (no ABA). A give-back allocates nothing once a connection has
//!   lent as many slots at once as it will, and a pass with nothing given back costs one
//!   load (`benches/examples/message_instructions` counts both, `docs/transport.md`).
//! - [`ReturnedSlots::given_back`] counts the slots that dropped messages gave back, ever.
//!   Drops on any thread raise it, each by one atomic read-modify-write, so no update is
//!   lost; the connection's thread counts the slots it lent itself, so lending takes no
//!   atomic operation, and the slots held by messages are the difference. A drop raises
//!   the count *before* pushing the slot, and the push orders the two for the thread that
//!   takes the slot, so that thread never counts a slot both as posted and as lent:
//!   posted receives plus lent slots never pass the slots of the tier. Nothing else is
//!   ordered by the count: `Relaxed` suffices.
//! - Every [`LentSlot`] holds a reference to the stack, so a message outlives its
//!   connection safely. [`ReturnedSlots::lend`] takes that reference ready-made: the
//!   connection clones it when it posts the receive, off the path of a delivery.
//!
//! - A reassembled message's buffer comes back the same way ([`LentBuffer`]), into
//!   `spare_buffer` under its mutex, for the next segmented message to reuse: so a stream
//!   of large messages does not allocate (and fault in) a fresh buffer for each. At most
//!   one buffer is kept, of at most `spare_limit` bytes. A message read from the peer
//!   (`rendezvous.rs`) lends its registered landing region the same way ([`LentLanding`],
//!   into `spare_landing`), on the same terms.
//!
//! - A slot given back while the connection's thread is parked wakes it, so a message
//!   dropped on another thread gets its receive reposted (and granted to the peer) without
//!   waiting for another event: the connection's thread arms its `Parker`
//!   (`connection::readiness`) and then looks at the stack; a give-back pushes, fences
//!   (`SeqCst`), and then wakes the parker, whose invariants make sure one of the two
//!   looks sees the other's write.
//!
//! The loom model `connection_models::returned_slots_across_threads` checks these on the
//! shipped code, with the planted bugs `Bug::LentCountLoadThenStore` and
//! `Bug::ReturnedPushRelaxed` as its broken variants.

use std::fmt;
use std::ops::Deref;
use std::task::Waker;

use tierbuf_pool::Region;
use tierbuf_tiers::{OwnedTierSlot, TierIndex};

use crate::connection::readiness::Parker;
use crate::provider::Armed;
use crate::sync::{Arc, AtomicPtr, AtomicUsize, Mutex, Ordering, UnsafeCell, fence};

/// A lent receive slot's way back: the slot, written by the drop that gives it back, and
/// the next node of the stack it is pushed onto (module invariants).
pub(super) struct Node {
    slot: UnsafeCell<Option<OwnedTierSlot>>,
    next: *mut Node,
}

impl Node {
    /// A node for lending slots with, holding none.
    pub(super) fn new() -> Box<Node> {
        Box::new(Node {
            slot: UnsafeCell::new(None),
            next: std::ptr::null_mut(),
        })
    }
}

// SAFETY: a node is owned by one side at a time (module invariants), which alone
// touches its cell and its link; what it holds, `OwnedTierSlot`, is `Send`.
unsafe impl Send for Node {}

// SAFETY: a shared reference to a node (through a `LentSlot` behind a `&Message`) reads
// neither its cell nor its link: only the node's owner does (module invariants).
unsafe impl Sync for Node {}

/// The stack of receive slots that messages gave back, the count of those given back,
/// and a spare buffer for reassembly.
pub(super) struct ReturnedSlots {
    /// The top of the stack of nodes given back and not yet taken (null when empty).
    head: AtomicPtr<Node>,
    given_back: AtomicUsize,
    /// Empty (no capacity) when there is none.
    spare_buffer: Mutex<Vec<u8>>,
    /// The registered region of the last message read from the peer, given back, for the
    /// next one to be read into.
    spare_landing: Mutex<Option<Box<dyn Region>>>,
    spare_limit: usize,
    /// The connection's thread's request to be woken by a give-back (module invariants).
    parker: Parker,
}

impl ReturnedSlots {
    /// Returns for a connection that keeps a reassembly buffer of up to `spare_limit`
    /// bytes for reuse.
    pub(super) fn new(spare_limit: usize) -> Arc<ReturnedSlots> {
        Arc::new(ReturnedSlots {
            head: AtomicPtr::new(std::ptr::null_mut()),
            given_back: AtomicUsize::new(0),
            spare_buffer: Mutex::new(Vec::new()),
            spare_landing: Mutex::new(None),
            spare_limit,
            parker: Parker::default(),
        })
    }

    /// Asks for `waker` to be woken at the next give-back; [`Armed::Pending`] when a slot
    /// waits already (module invariants).
    pub(super) fn arm(&self, waker: &Waker) -> Armed {
        self.parker.arm(waker);
        if self.head.load(Ordering::SeqCst).is_null() {
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

    /// Takes the spare landing region, for the next message read or to give it back to
    /// its reservoir (the connection has been idle).
    pub(super) fn take_spare_landing(&self) -> Option<Box<dyn Region>> {
        self.lock_landing().take()
    }

    /// Bytes of the spare landing region kept (0 for none).
    pub(super) fn spare_landing_len(&self) -> usize {
        self.lock_landing()
            .as_ref()
            .map_or(0, |region| region.len())
    }

    /// Lends `region`, into whose first `len` bytes a message was read, to the message;
    /// its drop gives it back.
    pub(super) fn lend_landing(
        returns: &Arc<ReturnedSlots>,
        region: Box<dyn Region>,
        len: usize,
    ) -> LentLanding {
        LentLanding {
            region: Some(region),
            len,
            returns: Arc::clone(returns),
        }
    }

    fn lock_landing(&self) -> impl std::ops::DerefMut<Target = Option<Box<dyn Region>>> + '_ {
        // Every critical section leaves the option whole before anything can panic.
        self.spare_landing
            .lock()
            .unwrap_or_else(|poison| poison.into_inner())
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
    pub(super) fn lend(
        returns: Arc<ReturnedSlots>,
        slot: OwnedTierSlot,
        node: Box<Node>,
    ) -> LentSlot {
        LentSlot {
            slot: Some(slot),
            node: Some(node),
            returns,
        }
    }

    /// The slots messages gave back, to be reposted, with their nodes; called on the
    /// connection's thread. A slot whose give-back is under way at this moment may be
    /// found only by the next call.
    pub(super) fn take_returned(&self) -> TakenSlots {
        // A look first: the swap is a locked instruction, and this is asked at every pass.
        if self.head.load(Ordering::Relaxed).is_null() {
            return TakenSlots {
                next: std::ptr::null_mut(),
            };
        }
        TakenSlots {
            next: self.head.swap(std::ptr::null_mut(), Ordering::Acquire),
        }
    }

    /// Slots given back by dropped messages, ever.
    pub(super) fn given_back(&self) -> usize {
        self.given_back.load(Ordering::Relaxed)
    }

    /// Takes `slot` back from a dropped message, in `node`; called on the thread that
    /// drops it.
    fn give_back(&self, slot: OwnedTierSlot, node: Box<Node>) {
        // Counted before it is pushed: the connection's thread, once it has taken the
        // slot, never counts it both as posted and as lent.
        count_given_back(&self.given_back);
        // SAFETY: the node is this drop's alone until the push below publishes it
        // (module invariants).
        node.slot.with_mut(|held| unsafe { *held = Some(slot) });
        let node = Box::into_raw(node);
        let mut head = self.head.load(Ordering::Relaxed);
        loop {
            // SAFETY: `node` is unpublished, so this thread alone touches it.
            unsafe { (*node).next = head };
            match self
                .head
                .compare_exchange_weak(head, node, push_ordering(), Ordering::Relaxed)
            {
                Ok(_) => break,
                Err(now) => head = now,
            }
        }
        fence(Ordering::SeqCst);
        self.parker.wake();
    }
}

impl Drop for ReturnedSlots {
    fn drop(&mut self) {
        // The nodes given back and never taken, with their slots.
        drop(TakenSlots {
            next: self.head.swap(std::ptr::null_mut(), Ordering::Acquire),
        });
    }
}

impl fmt::Debug for ReturnedSlots {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ReturnedSlots")
            .field("given_back", &self.given_back())
            .finish_non_exhaustive()
    }
}

/// Raises the count of slots given back by one.
#[cfg(not(loom))]
fn count_given_back(given_back: &AtomicUsize) {
    given_back.fetch_add(1, Ordering::Relaxed);
}

/// Raises the count of slots given back by one; with the planted bug
/// `LentCountLoadThenStore`, by a load and a separate store, which can lose an update.
#[cfg(loom)]
fn count_given_back(given_back: &AtomicUsize) {
    use tierbuf_pool::sync::planted::{Bug, is_planted};
    if is_planted(Bug::LentCountLoadThenStore) {
        let count = given_back.load(Ordering::Relaxed);
        given_back.store(count + 1, Ordering::Relaxed);
    } else {
        given_back.fetch_add(1, Ordering::Relaxed);
    }
}

/// How a give-back publishes its node.
#[cfg(not(loom))]
fn push_ordering() -> Ordering {
    Ordering::Release
}

/// How a give-back publishes its node; with the planted bug `ReturnedPushRelaxed`,
/// `Relaxed`, so the connection's thread may read the node before the slot is in it.
#[cfg(loom)]
fn push_ordering() -> Ordering {
    use tierbuf_pool::sync::planted::{Bug, is_planted};
    if is_planted(Bug::ReturnedPushRelaxed) {
        Ordering::Relaxed
    } else {
        Ordering::Release
    }
}

/// The slots a [`ReturnedSlots::take_returned`] took, each with its node, newest first.
/// Nodes left when it is dropped are freed, with their slots.
pub(super) struct TakenSlots {
    next: *mut Node,
}

impl Iterator for TakenSlots {
    type Item = (OwnedTierSlot, Box<Node>);

    fn next(&mut self) -> Option<(OwnedTierSlot, Box<Node>)> {
        while !self.next.is_null() {
            // SAFETY: the swap that took the stack (`Acquire`) made every node on it this
            // thread's, after the pushes (`Release`) that published them; each was made by
            // `Box::into_raw` and is taken back once.
            let node = unsafe { Box::from_raw(self.next) };
            self.next = node.next;
            // SAFETY: as above: the node is this thread's.
            if let Some(slot) = node.slot.with_mut(|held| unsafe { (*held).take() }) {
                return Some((slot, node));
            }
        }
        None
    }
}

impl Drop for TakenSlots {
    fn drop(&mut self) {
        for _ in self.by_ref() {}
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

/// The registered region a message was read into from the peer (`rendezvous.rs`);
/// dropping it offers the region back to its connection for the next such message.
pub(super) struct LentLanding {
    /// `Some` until the drop gives it back.
    region: Option<Box<dyn Region>>,
    len: usize,
    returns: Arc<ReturnedSlots>,
}

impl Deref for LentLanding {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        match &self.region {
            // SAFETY: the read that filled the region's first `len` bytes has completed,
            // no request names the region any more and nothing else holds it
            // (`rendezvous.rs`, module invariants), so they are initialised and only read
            // through this message until it is dropped.
            Some(region) => unsafe { std::slice::from_raw_parts(region.base().as_ptr(), self.len) },
            None => &[],
        }
    }
}

impl Drop for LentLanding {
    fn drop(&mut self) {
        if let Some(region) = self.region.take()
            && region.len() <= self.returns.spare_limit
        {
            *self.returns.lock_landing() = Some(region);
        }
    }
}

impl fmt::Debug for LentLanding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LentLanding")
            .field("len", &self.len)
            .finish_non_exhaustive()
    }
}

/// A receive slot lent to a delivered message; dropping it gives the slot back to its
/// connection, in its node.
pub(super) struct LentSlot {
    /// `Some` until the drop gives it back.
    slot: Option<OwnedTierSlot>,
    /// `Some` until the drop gives it back.
    node: Option<Box<Node>>,
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
        if let (Some(slot), Some(node)) = (self.slot.take(), self.node.take()) {
            self.returns.give_back(slot, node);
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
