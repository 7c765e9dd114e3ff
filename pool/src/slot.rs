//! [`SlotPool`]: fixed-size slots carved from one registered region, handed out through a
//! lock-free free list as RAII handles.
//!
//! # Invariants
//!
//! - The free list is a Treiber stack of slot indices: `head` holds the top index (or
//!   `EMPTY`) in its low 32 bits and an ABA tag in its high 32 bits, and `next[i]` links
//!   free slot `i` to the one below it. Every successful compare-and-swap on `head` bumps
//!   the tag, so a head that was popped and pushed back in between never compares equal.
//! - A slot index is either on the free list or held by exactly one handle, never both
//!   and never by two handles. Only a handle's drop pushes its index back.
//! - Releasing publishes with `Release` and acquiring takes with `Acquire` on `head`, so
//!   everything the previous owner wrote to a slot happens before the next owner sees it.
//! - The region outlives every handle: borrowed handles borrow the pool, owned handles hold
//!   a reference count on it.
//! - Acquire and release take no lock and make no system call.

use std::fmt;
use std::ops::{Deref, DerefMut};
use std::ptr::NonNull;

use crossbeam_utils::CachePadded;

use crate::error::PoolError;
use crate::region::{Region, RegionKeys, Registrar};
use crate::sync::{Arc, AtomicU32, AtomicU64, Ordering};

/// The `head` index meaning "no free slot".
const EMPTY: u32 = u32::MAX;
/// The most slots one pool holds: every index must differ from [`EMPTY`].
pub const MAX_SLOTS: usize = EMPTY as usize;

/// A lock-free pool of fixed-size slots in one registered region.
///
/// Cloning gives another handle onto the same pool.
///
/// ```
/// use tierbuf_pool::{HostRegistrar, MemoryBudget, SlotPool};
/// let registrar = HostRegistrar::new(MemoryBudget::with_cap(1 << 20));
/// let pool = SlotPool::new(&registrar, 8192, 4)?;
/// let mut slot = pool.try_acquire().expect("a free slot");
/// slot[..5].copy_from_slice(b"hello");
/// assert_eq!(slot.len(), 8192);
/// assert_eq!(pool.free_slots(), 3);
/// drop(slot);
/// assert_eq!(pool.free_slots(), 4);
/// # Ok::<(), tierbuf_pool::PoolError>(())
/// ```
#[derive(Clone)]
pub struct SlotPool {
    shared: Arc<PoolShared>,
}

struct PoolShared {
    /// The free-list head: tag in the high half, top index in the low half.
    head: CachePadded<AtomicU64>,
    /// `next[i]`: the free slot below `i` on the free list (meaningful while `i` is free).
    next: Box<[AtomicU32]>,
    base: NonNull<u8>,
    slot_size: usize,
    keys: RegionKeys,
    #[cfg(loom)]
    tracking: Box<[loom_tracking::SlotTracking]>,
    /// Owns the memory `base` points into; dropped last.
    region: Box<dyn Region>,
}

// SAFETY: `base` points into `region`, which is `Send + Sync`; slots are handed to one
// handle at a time by the free list, so no two threads reach a slot's bytes at once.
unsafe impl Send for PoolShared {}
// SAFETY: as for `Send`; the free list itself is made of atomics.
unsafe impl Sync for PoolShared {}

impl SlotPool {
    /// Registers `slot_size * slot_count` bytes with `registrar` (page-aligned) and carves
    /// them into `slot_count` slots.
    pub fn new(
        registrar: &dyn Registrar,
        slot_size: usize,
        slot_count: usize,
    ) -> Result<SlotPool, PoolError> {
        check_shape(slot_size, slot_count)?;
        let len = slot_size
            .checked_mul(slot_count)
            .ok_or(PoolError::SizeOverflow {
                slot_size,
                slot_count,
            })?;
        let region = registrar.register(len, page_size())?;
        SlotPool::from_region(region, slot_size)
    }

    /// Carves an already registered region into slots of `slot_size` bytes; the region's
    /// length must be a whole number of slots.
    pub fn from_region(region: Box<dyn Region>, slot_size: usize) -> Result<SlotPool, PoolError> {
        if slot_size == 0 {
            return Err(PoolError::ZeroSlotSize);
        }
        let region_len = region.len();
        if region_len % slot_size != 0 {
            return Err(PoolError::SlotSizeDoesNotDivide {
                region_len,
                slot_size,
            });
        }
        let slot_count = region_len / slot_size;
        check_shape(slot_size, slot_count)?;
        // Initially every slot is free, in index order: 0 on top, then 1, 2, ...
        let next = (0..slot_count)
            .map(|i| AtomicU32::new(if i + 1 == slot_count { EMPTY } else { i as u32 + 1 }))
            .collect();
        Ok(SlotPool {
            shared: Arc::new(PoolShared {
                head: CachePadded::new(AtomicU64::new(0)),
                next,
                base: region.base(),
                slot_size,
                keys: region.keys(),
                #[cfg(loom)]
                tracking: (0..slot_count)
                    .map(|_| loom_tracking::SlotTracking::default())
                    .collect(),
                region,
            }),
        })
    }

    /// Takes a free slot, or `None` at once when every slot is held.
    ///
    /// The handle borrows the pool; see [`SlotPool::try_acquire_owned`] for one that does not.
    #[inline]
    pub fn try_acquire(&self) -> Option<Slot<'_>> {
        let index = self.shared.pop()?;
        Some(Slot {
            pool: &self.shared,
            index,
        })
    }

    /// Takes a free slot as a handle that owns a reference to the pool, so it can move to
    /// another thread and outlive this borrow; `None` at once when every slot is held.
    #[inline]
    pub fn try_acquire_owned(&self) -> Option<OwnedSlot> {
        let index = self.shared.pop()?;
        Some(OwnedSlot {
            pool: Arc::clone(&self.shared),
            index,
        })
    }

    /// Bytes per slot.
    pub fn slot_size(&self) -> usize {
        self.shared.slot_size
    }

    /// Slots in the pool, free or held.
    pub fn slot_count(&self) -> usize {
        self.shared.next.len()
    }

    /// Bytes of the registered region behind the pool.
    pub fn region_len(&self) -> usize {
        self.shared.region.len()
    }

    /// The keys of the region behind the pool.
    pub fn keys(&self) -> RegionKeys {
        self.shared.keys
    }

    /// Free slots, counted by walking the free list.
    ///
    /// Exact when no other thread acquires or releases meanwhile (a test's or a teardown's
    /// view); under concurrent use it is a snapshot that may be off. Never loops forever.
    pub fn free_slots(&self) -> usize {
        let shared = &*self.shared;
        let mut index = shared.head.load(Ordering::Acquire) as u32;
        let mut count = 0;
        while index != EMPTY && count < shared.next.len() {
            count += 1;
            index = shared.next[index as usize].load(Ordering::Relaxed);
        }
        count
    }
}

impl fmt::Debug for SlotPool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SlotPool")
            .field("slot_size", &self.slot_size())
            .field("slot_count", &self.slot_count())
            .field("keys", &self.keys())
            .finish_non_exhaustive()
    }
}

fn check_shape(slot_size: usize, slot_count: usize) -> Result<(), PoolError> {
    if slot_size == 0 {
        return Err(PoolError::ZeroSlotSize);
    }
    if slot_count == 0 {
        return Err(PoolError::ZeroSlotCount);
    }
    if slot_count > MAX_SLOTS {
        return Err(PoolError::TooManySlots {
            requested: slot_count,
            max: MAX_SLOTS,
        });
    }
    Ok(())
}

fn page_size() -> usize {
    rustix::param::page_size()
}

/// The tag increment of one successful compare-and-swap on `head`.
#[inline(always)]
fn tag_step() -> u64 {
    #[cfg(loom)]
    if crate::sync::planted::is_planted(crate::sync::planted::Bug::SlotPoolNoAbaTag) {
        return 0;
    }
    1 << 32
}

/// The ordering with which a release publishes the slot.
#[inline(always)]
fn release_ordering() -> Ordering {
    #[cfg(loom)]
    if crate::sync::planted::is_planted(crate::sync::planted::Bug::SlotReleaseRelaxed) {
        return Ordering::Relaxed;
    }
    Ordering::Release
}

impl PoolShared {
    #[inline]
    fn pop(&self) -> Option<u32> {
        let mut head = self.head.load(Ordering::Acquire);
        loop {
            let index = head as u32;
            if index == EMPTY {
                return None;
            }
            let below = self.next[index as usize].load(Ordering::Relaxed);
            let new_head = ((head & !0xFFFF_FFFF).wrapping_add(tag_step())) | u64::from(below);
            match self.head.compare_exchange_weak(
                head,
                new_head,
                Ordering::Acquire,
                Ordering::Acquire,
            ) {
                Ok(_) => {
                    #[cfg(loom)]
                    self.tracking[index as usize].take();
                    return Some(index);
                }
                Err(current) => head = current,
            }
        }
    }

    #[inline]
    fn push(&self, index: u32) {
        #[cfg(loom)]
        self.tracking[index as usize].give_back();
        let mut head = self.head.load(Ordering::Relaxed);
        loop {
            self.next[index as usize].store(head as u32, Ordering::Relaxed);
            let new_head = ((head & !0xFFFF_FFFF).wrapping_add(tag_step())) | u64::from(index);
            match self.head.compare_exchange_weak(
                head,
                new_head,
                release_ordering(),
                Ordering::Relaxed,
            ) {
                Ok(_) => return,
                Err(current) => head = current,
            }
        }
    }

    #[inline]
    fn slot_ptr(&self, index: u32) -> NonNull<u8> {
        // SAFETY: `index < slot_count` (only valid indices are ever on the free list or in
        // a handle), so the offset stays inside the region.
        unsafe { self.base.add(index as usize * self.slot_size) }
    }
}

macro_rules! slot_handle_methods {
    () => {
        /// The slot's index in its pool.
        #[inline]
        pub fn index(&self) -> u32 {
            self.index
        }

        /// The slot's length in bytes (the pool's slot size).
        #[inline]
        #[allow(clippy::len_without_is_empty)] // a slot is never empty
        pub fn len(&self) -> usize {
            self.pool.slot_size
        }

        /// The keys of the region the slot lies in.
        #[inline]
        pub fn keys(&self) -> RegionKeys {
            self.pool.keys
        }

        /// The address a peer names for the slot's first byte.
        #[inline]
        pub fn remote_addr(&self) -> u64 {
            self.pool.keys.remote_addr + (self.index as u64 * self.pool.slot_size as u64)
        }

        /// The slot's first byte.
        #[inline]
        pub fn as_ptr(&self) -> NonNull<u8> {
            self.pool.slot_ptr(self.index)
        }
    };
}

macro_rules! slot_handle_impls {
    ($handle:ty) => {
        impl Deref for $handle {
            type Target = [u8];

            #[inline]
            fn deref(&self) -> &[u8] {
                // SAFETY: this handle holds the slot exclusively (free-list invariant) and
                // the region outlives it; the slot's bytes are initialised (mapped memory).
                unsafe { std::slice::from_raw_parts(self.as_ptr().as_ptr(), self.len()) }
            }
        }

        impl DerefMut for $handle {
            #[inline]
            fn deref_mut(&mut self) -> &mut [u8] {
                // SAFETY: as for `deref`, and `&mut self` makes this the only live view.
                unsafe { std::slice::from_raw_parts_mut(self.as_ptr().as_ptr(), self.len()) }
            }
        }

        impl Drop for $handle {
            #[inline]
            fn drop(&mut self) {
                self.pool.push(self.index);
            }
        }

        impl fmt::Debug for $handle {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.debug_struct(stringify!($handle))
                    .field("index", &self.index)
                    .field("len", &self.len())
                    .field("remote_addr", &format_args!("{:#x}", self.remote_addr()))
                    .finish()
            }
        }
    };
}

/// A slot held exclusively until dropped; borrows its pool.
pub struct Slot<'pool> {
    pool: &'pool PoolShared,
    index: u32,
}

impl Slot<'_> {
    slot_handle_methods!();
}

slot_handle_impls!(Slot<'_>);

/// A slot held exclusively until dropped; keeps its pool (and region) alive, and may move
/// to and drop on any thread.
///
/// ```
/// use tierbuf_pool::{HostRegistrar, MemoryBudget, SlotPool};
/// let registrar = HostRegistrar::new(MemoryBudget::with_cap(1 << 20));
/// let pool = SlotPool::new(&registrar, 4096, 2)?;
/// let mut slot = pool.try_acquire_owned().unwrap();
/// drop(pool); // the slot keeps the region alive
/// std::thread::spawn(move || slot.fill(7)).join().unwrap();
/// assert_eq!(registrar.budget().in_use(), 0);
/// # Ok::<(), tierbuf_pool::PoolError>(())
/// ```
pub struct OwnedSlot {
    pool: Arc<PoolShared>,
    index: u32,
}

impl OwnedSlot {
    slot_handle_methods!();
}

slot_handle_impls!(OwnedSlot);

#[cfg(loom)]
mod loom_tracking {
    //! Under loom, each slot records its ownership so that the models catch two owners of
    //! one slot (`owned`) and a hand-over without happens-before (`witness`).

    use loom::cell::UnsafeCell;
    use loom::sync::atomic::{AtomicBool, Ordering};

    #[derive(Debug, Default)]
    pub(super) struct SlotTracking {
        owned: AtomicBool,
        witness: UnsafeCell<u64>,
    }

    impl SlotTracking {
        pub(super) fn take(&self) {
            assert!(
                !self.owned.swap(true, Ordering::Relaxed),
                "slot handed to a second owner"
            );
            // SAFETY: loom checks that this access is ordered after the previous owner's.
            self.witness.with_mut(|w| unsafe { *w += 1 });
        }

        pub(super) fn give_back(&self) {
            // SAFETY: loom checks that this access is ordered after the taker's.
            self.witness.with_mut(|w| unsafe { *w += 1 });
            assert!(
                self.owned.swap(false, Ordering::Relaxed),
                "slot released without an owner"
            );
        }
    }
}
