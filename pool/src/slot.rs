//! [`SlotPool`]: fixed-size slots carved from one registered region, handed out as RAII
//! handles without locks.
//!
//! # Invariants
//!
//! - Each slot has one state word, alone on its cache line: `FREE`, `HELD` or `RETIRED`.
//!   A slot is taken only by a compare-and-swap from `FREE` to `HELD`, so at most one
//!   handle holds it; only that handle's drop stores `FREE` again.
//! - [`SlotPool::try_retire`] claims every slot by a compare-and-swap from `FREE` to
//!   `RETIRED`, and gives back the ones it claimed if any slot is held. So retirement and
//!   acquisition meet on the same words: once a retire succeeds no slot is held and none
//!   can be taken again, and a slot taken first makes the retire fail.
//! - The release store is `Release` and the taking compare-and-swap is `Acquire`, so
//!   everything the previous owner wrote to a slot happens before the next owner sees it.
//! - The region outlives every handle: borrowed handles borrow the pool, owned handles hold
//!   a reference count on it.
//! - Acquire and release take no lock and make no system call. A thread first tries the
//!   slot it released last in this pool (a thread-local hint, never trusted beyond being
//!   an index to try), so a thread that cycles buffers touches one cache line of its own
//!   and two threads do not share lines. When the hint misses, acquire scans the states
//!   from there; failing on an exhausted pool therefore costs one pass over the states.

use std::cell::Cell;
use std::fmt;
use std::ops::{Deref, DerefMut};
use std::ptr::NonNull;

use crate::error::PoolError;
use crate::region::{Region, RegionKeys, Registrar};
use crate::sync::{Arc, AtomicU32, Ordering};

const FREE: u32 = 0;
const HELD: u32 = 1;
const RETIRED: u32 = 2;
/// The most slots one pool holds (slot indices are `u32`).
pub const MAX_SLOTS: usize = u32::MAX as usize;

/// One slot's state, alone on its cache line so that threads cycling different slots do
/// not contend.
#[repr(align(64))]
struct SlotState(AtomicU32);

#[cfg(not(loom))]
std::thread_local! {
    /// The pool (by address) and slot this thread released last: where it looks first.
    static LAST_RELEASED: Cell<(usize, u32)> = const { Cell::new((0, 0)) };
}
#[cfg(loom)]
loom::thread_local! {
    /// The pool (by address) and slot this thread released last: where it looks first.
    static LAST_RELEASED: Cell<(usize, u32)> = Cell::new((0, 0));
}

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
    states: Box<[SlotState]>,
    base: NonNull<u8>,
    slot_size: usize,
    keys: RegionKeys,
    #[cfg(loom)]
    tracking: Box<[loom_tracking::SlotTracking]>,
    /// Owns the memory `base` points into; dropped last.
    region: Box<dyn Region>,
}

// SAFETY: `base` points into `region`, which is `Send + Sync`; a slot's bytes are reached
// only through the one handle that holds it (see the invariants), so no two threads reach
// them at once.
unsafe impl Send for PoolShared {}
// SAFETY: as for `Send`; the slot states are atomics.
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
        let region = registrar.register(len, crate::page_size())?;
        SlotPool::from_region(region, slot_size)
    }

    /// Carves an already registered region into slots of `slot_size` bytes; the region's
    /// length must be a whole number of slots.
    pub fn from_region(region: Box<dyn Region>, slot_size: usize) -> Result<SlotPool, PoolError> {
        if slot_size == 0 {
            return Err(PoolError::ZeroSlotSize);
        }
        let region_len = region.len();
        if !region_len.is_multiple_of(slot_size) {
            return Err(PoolError::SlotSizeDoesNotDivide {
                region_len,
                slot_size,
            });
        }
        let slot_count = region_len / slot_size;
        check_shape(slot_size, slot_count)?;
        Ok(SlotPool {
            shared: Arc::new(PoolShared {
                states: (0..slot_count)
                    .map(|_| SlotState(AtomicU32::new(FREE)))
                    .collect(),
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

    /// Takes a free slot, or `None` when every slot is held; never blocks.
    ///
    /// The handle borrows the pool; see [`SlotPool::try_acquire_owned`] for one that does not.
    #[inline]
    pub fn try_acquire(&self) -> Option<Slot<'_>> {
        let index = self.shared.take()?;
        Some(Slot {
            pool: &self.shared,
            index,
        })
    }

    /// Takes a free slot as a handle that owns a reference to the pool, so it can move to
    /// another thread and outlive this borrow; `None` when every slot is held.
    #[inline]
    pub fn try_acquire_owned(&self) -> Option<OwnedSlot> {
        let index = self.shared.take()?;
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
        self.shared.states.len()
    }

    /// Bytes of the registered region behind the pool.
    pub fn region_len(&self) -> usize {
        self.shared.region.len()
    }

    /// The keys of the region behind the pool.
    pub fn keys(&self) -> RegionKeys {
        self.shared.keys
    }

    /// Retires the pool if no slot is held: every slot is marked retired, so that no
    /// acquire succeeds from now on, and `true` is returned. If a slot is held, nothing
    /// changes and `false` is returned.
    ///
    /// This is how an owner that can still be raced by acquirers (a tier being replaced)
    /// learns that the pool is idle for good before it frees or recycles the region.
    ///
    /// ```
    /// use tierbuf_pool::{HostRegistrar, MemoryBudget, SlotPool};
    /// let registrar = HostRegistrar::new(MemoryBudget::with_cap(1 << 20));
    /// let pool = SlotPool::new(&registrar, 512, 4)?;
    /// let slot = pool.try_acquire_owned().unwrap();
    /// assert!(!pool.try_retire(), "a slot is held");
    /// drop(slot);
    /// assert!(pool.try_retire());
    /// assert!(pool.try_acquire().is_none() && pool.is_retired());
    /// # Ok::<(), tierbuf_pool::PoolError>(())
    /// ```
    pub fn try_retire(&self) -> bool {
        let states = &self.shared.states;
        for (claimed, state) in states.iter().enumerate() {
            if state
                .0
                .compare_exchange(FREE, RETIRED, Ordering::Acquire, Ordering::Relaxed)
                .is_err()
            {
                for earlier in &states[..claimed] {
                    earlier.0.store(FREE, Ordering::Release);
                }
                return false;
            }
        }
        true
    }

    /// Whether [`SlotPool::try_retire`] succeeded on this pool.
    pub fn is_retired(&self) -> bool {
        self.shared
            .states
            .iter()
            .all(|state| state.0.load(Ordering::Acquire) == RETIRED)
    }

    /// Gives the region back for reuse (a new pool can be carved from it), when this is
    /// the last handle onto the pool and no slot is held; otherwise hands the pool back.
    ///
    /// ```
    /// use tierbuf_pool::{HostRegistrar, MemoryBudget, SlotPool};
    /// let registrar = HostRegistrar::new(MemoryBudget::with_cap(1 << 20));
    /// let pool = SlotPool::new(&registrar, 512, 4)?;
    /// let other = pool.clone();
    /// let pool = pool.into_region().expect_err("another handle exists");
    /// drop(other);
    /// let region = pool.into_region().expect("last handle");
    /// let pool = SlotPool::from_region(region, 1024)?;
    /// assert_eq!(pool.slot_count(), 2);
    /// # Ok::<(), tierbuf_pool::PoolError>(())
    /// ```
    pub fn into_region(self) -> Result<Box<dyn Region>, SlotPool> {
        // A held slot is either a borrowed handle (which borrows a `SlotPool`, so `self`
        // could not have been moved here if it were the last) or an owned handle (which
        // holds a reference count): so a unique `Arc` means no slot is held.
        match Arc::try_unwrap(self.shared) {
            Ok(PoolShared { region, .. }) => Ok(region),
            Err(shared) => Err(SlotPool { shared }),
        }
    }

    /// Free slots now. Exact when no other thread acquires or releases meanwhile (a test's
    /// or a teardown's view); under concurrent use a snapshot.
    pub fn free_slots(&self) -> usize {
        self.shared
            .states
            .iter()
            .filter(|state| state.0.load(Ordering::Acquire) == FREE)
            .count()
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

impl PoolShared {
    /// This pool's identity in [`LAST_RELEASED`].
    #[inline]
    fn id(&self) -> usize {
        self as *const PoolShared as usize
    }

    #[inline]
    fn take(&self) -> Option<u32> {
        let count = self.states.len();
        let (pool, hint) = LAST_RELEASED.with(Cell::get);
        let first = if pool == self.id() && (hint as usize) < count {
            hint as usize
        } else {
            0
        };
        let mut index = first;
        loop {
            if self.try_take(index) {
                #[cfg(loom)]
                self.tracking[index].take();
                return Some(index as u32);
            }
            index += 1;
            if index == count {
                index = 0;
            }
            if index == first {
                return None;
            }
        }
    }

    /// Takes slot `index` if it is free: test first, so held slots cost a plain load.
    #[inline(always)]
    fn try_take(&self, index: usize) -> bool {
        let state = &self.states[index].0;
        #[cfg(loom)]
        if crate::sync::planted::is_planted(crate::sync::planted::Bug::SlotTakeCheckThenSet) {
            if state.load(Ordering::Acquire) != FREE {
                return false;
            }
            state.store(HELD, Ordering::Relaxed);
            return true;
        }
        state.load(Ordering::Relaxed) == FREE
            && state
                .compare_exchange(FREE, HELD, Ordering::Acquire, Ordering::Relaxed)
                .is_ok()
    }

    #[inline]
    fn give_back(&self, index: u32) {
        #[cfg(loom)]
        self.tracking[index as usize].give_back();
        self.states[index as usize]
            .0
            .store(FREE, release_ordering());
        LAST_RELEASED.with(|last| last.set((self.id(), index)));
    }

    #[inline]
    fn slot_ptr(&self, index: u32) -> NonNull<u8> {
        // SAFETY: `index < slot_count` (handles are made only from indices `take` found
        // in range), so the offset stays inside the region.
        unsafe { self.base.add(index as usize * self.slot_size) }
    }
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
                self.pool.give_back(self.index);
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
/// use tierbuf_pool::{HostRegistrar, MemoryBudget, Registrar, SlotPool};
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
