//! [`TieredRegion`]: one direction of one connection's registered buffers, on the tier in
//! force behind a swap cell, with promotion, demotion and retirement of replaced tiers.
//!
//! # Invariants
//!
//! - Exactly one tier is in force. Readers reach it through a per-thread [`TierCache`],
//!   whose load is one atomic read while the tier has not changed, and take slots from its
//!   pool without locks.
//! - At most one tier change is under way: [`TieredRegion::begin_change`] claims it by a
//!   compare-and-swap, and only the holder of the claim provisions and installs a tier.
//! - A replaced tier stays referenced by the region until (a) the peer has confirmed it
//!   stopped using it, when the change asked for that, and (b) its slot pool *retired*:
//!   every slot claimed from free to retired, which fails while any local handle holds a
//!   slot and makes every later acquire from that tier fail. Only then does the region drop
//!   its reference. A cache may still point at the tier until its next load; the tier's
//!   region goes back to the reservoir (or is deregistered) when the last reference drops,
//!   and by then no slot of it is held or can be taken.
//! - When the ladder's policy retains replaced tiers, the region keeps registered only
//!   those *below* the tier in force. A promotion retains the tier it replaces; a demotion
//!   sends the tier it replaces, and every retained tier at or above its target, to retire
//!   as above (the retained tier equal to the target is the one put in force). A retained
//!   tier keeps whether it still waits for the peer's release, so it retires under the
//!   same rule when it leaves. An install holds the retained list's lock, then the
//!   replaced list's, while it swaps the tier in force and moves tiers between them, and
//!   [`TieredRegion::peer_released`] looks at the retained list before the replaced one,
//!   so a release is never lost on a tier on its way from one to the other. No other
//!   code holds both locks.
//! - The reservoir is shared with `std::sync::Arc` in every build: it takes no part in a
//!   lock-free protocol (tiers hold it only to give their region back).
//! - A [`TierSlot`] borrows the region. The tier it lies in stays referenced by the region
//!   while the slot is held (previous invariant), and the region outlives the borrow, so
//!   the slot's memory outlives the handle.

use std::fmt;
use std::mem::ManuallyDrop;
use std::ops::{Deref, DerefMut};

use tierbuf_pool::{OwnedSlot, RegionKeys, Slot, SlotPool};

use crate::reservoir::{Provenance, Reservoir, TierError};
use crate::sync::{
    Arc, AtomicU8, AtomicU16, AtomicUsize, Mutex, Ordering, SwapCache, SwapCell, lock,
};
use crate::{RegionDescriptor, TierIndex};

/// `pending` when no change is under way; otherwise it holds the target's index plus one.
const NO_CHANGE: u16 = 0;

/// One registered tier: a slot pool of the tier's shape, returned to the reservoir when
/// the last reference to it drops.
pub struct Tier {
    index: TierIndex,
    pool: ManuallyDrop<SlotPool>,
    reservoir: std::sync::Arc<Reservoir>,
}

impl Tier {
    /// The tier's position in the ladder.
    pub fn index(&self) -> TierIndex {
        self.index
    }

    /// The tier's slot pool.
    pub fn pool(&self) -> &SlotPool {
        &self.pool
    }

    /// Takes a slot of `tier` as a handle that keeps the tier alive and may cross
    /// threads; `None` when its slots are all held or the tier has retired. For an owner
    /// that keeps the tier in force at hand (it made the change itself), this is
    /// [`TieredRegion::try_acquire_owned`] without the load of the tier in force.
    ///
    /// ```
    /// use std::sync::Arc;
    /// use tierbuf_pool::{HostRegistrar, MemoryBudget};
    /// use tierbuf_tiers::{Reservoir, Tier, TierIndex, TieredRegion, ladder::TierLadder};
    ///
    /// let budget = MemoryBudget::with_cap(64 << 20);
    /// let ladder = Arc::new(TierLadder::preset("two-tier")?);
    /// let reservoir = Arc::new(Reservoir::new(Arc::new(HostRegistrar::new(budget)), ladder));
    /// let region = TieredRegion::new(reservoir)?;
    /// let tier = region.current();
    /// let slot = Tier::try_acquire_owned(&tier).unwrap();
    /// assert_eq!(slot.tier(), TierIndex::SMALLEST);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn try_acquire_owned(tier: &Arc<Tier>) -> Option<OwnedTierSlot> {
        let slot = tier.pool.try_acquire_owned()?;
        Some(OwnedTierSlot {
            slot,
            tier: Arc::clone(tier),
        })
    }

    /// Where the peer finds this tier's region: what an ack carries.
    pub fn descriptor(&self) -> RegionDescriptor {
        let keys = self.pool.keys();
        RegionDescriptor {
            addr: keys.remote_addr,
            len: self.pool.region_len() as u64,
            remote_key: keys.remote_key,
        }
    }
}

impl Drop for Tier {
    fn drop(&mut self) {
        // SAFETY: `drop` runs once and `pool` is not used after this line.
        let pool = unsafe { ManuallyDrop::take(&mut self.pool) };
        #[cfg(any(loom, debug_assertions))]
        assert!(
            pool.is_retired() || pool.free_slots() == pool.slot_count(),
            "{} dropped while one of its slots is held",
            self.index
        );
        // Owned slots hold their own reference to the pool; with none left the region can
        // be recycled, otherwise it is deregistered when the last of them drops.
        if let Ok(region) = pool.into_region() {
            self.reservoir.give_back(self.index, region);
        }
    }
}

impl fmt::Debug for Tier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Tier")
            .field("index", &self.index)
            .field("slot_size", &self.pool.slot_size())
            .field("slot_count", &self.pool.slot_count())
            .finish()
    }
}

/// A replaced tier, waiting for retirement or retained.
struct Replaced {
    tier: Arc<Tier>,
    awaiting_peer: bool,
}

impl Replaced {
    /// Whether a change to `tier` may put this registration back in force: it is of that
    /// tier, and nothing waits on the peer's release of it (taken back and then abandoned,
    /// it would be freed without that release).
    fn can_come_back(&self, tier: TierIndex) -> bool {
        self.tier.index == tier && !self.awaiting_peer
    }
}

/// One direction of a connection's registered buffers, tiered.
///
/// ```
/// use std::sync::Arc;
/// use tierbuf_pool::{HostRegistrar, MemoryBudget};
/// use tierbuf_tiers::{Reservoir, TierIndex, TieredRegion, ladder::TierLadder};
///
/// let budget = MemoryBudget::with_cap(64 << 20);
/// let ladder = Arc::new(TierLadder::preset("two-tier")?);
/// let reservoir = Arc::new(Reservoir::new(Arc::new(HostRegistrar::new(budget)), ladder));
/// let region = TieredRegion::new(reservoir)?;
///
/// let mut cache = region.cache();
/// let small = cache.try_acquire().unwrap();
/// assert_eq!(small.tier(), TierIndex::SMALLEST);
///
/// // Promote: claim the change, provision (the ack's descriptor), install.
/// let mut change = region.begin_change(TierIndex::new(1))?;
/// let _descriptor = change.provision()?;
/// change.install(false)?;
/// assert_eq!(cache.try_acquire().unwrap().tier(), TierIndex::new(1));
///
/// // The small tier retires only once its last slot is back.
/// assert_eq!(region.reclaim(), 0);
/// drop(small);
/// assert_eq!(region.reclaim(), 1);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct TieredRegion {
    /// Shared with the region's [`OwnedTierCache`]s, which outlive no borrow.
    current: std::sync::Arc<SwapCell<Tier>>,
    current_index: AtomicU8,
    pending: AtomicU16,
    replaced: Mutex<Vec<Replaced>>,
    replaced_len: AtomicUsize,
    /// Replaced tiers below the one in force, kept registered when the ladder's policy
    /// retains them.
    retained: Mutex<Vec<Replaced>>,
    reservoir: std::sync::Arc<Reservoir>,
}

impl TieredRegion {
    /// A region on the smallest tier of the reservoir's ladder.
    pub fn new(reservoir: std::sync::Arc<Reservoir>) -> Result<TieredRegion, TierError> {
        let smallest = provision_tier(&reservoir, TierIndex::SMALLEST)?.0;
        Ok(TieredRegion {
            current: std::sync::Arc::new(SwapCell::new(smallest)),
            current_index: AtomicU8::new(0),
            pending: AtomicU16::new(NO_CHANGE),
            replaced: Mutex::new(Vec::new()),
            replaced_len: AtomicUsize::new(0),
            retained: Mutex::new(Vec::new()),
            reservoir,
        })
    }

    /// The tier in force.
    pub fn tier(&self) -> TierIndex {
        TierIndex::new(self.current_index.load(Ordering::Acquire))
    }

    /// A per-thread view for the hot path; see [`TierCache::try_acquire`].
    pub fn cache(&self) -> TierCache<'_> {
        TierCache {
            cache: SwapCell::cache(&*self.current),
        }
    }

    /// A view of the tier in force for an owner that keeps it beside the region (a
    /// connection's tier controller); see [`OwnedTierCache`].
    pub fn owned_cache(&self) -> OwnedTierCache {
        OwnedTierCache {
            cache: SwapCell::cache(std::sync::Arc::clone(&self.current)),
        }
    }

    /// Takes a slot of the tier in force as a handle that can cross threads and outlive
    /// the borrow of the region; `None` when the tier's slots are all held. Costs a
    /// reference count more than [`TierCache::try_acquire`].
    pub fn try_acquire_owned(&self) -> Option<OwnedTierSlot> {
        Tier::try_acquire_owned(&self.current.load_full())
    }

    /// The tier in force, as a reference that keeps it alive.
    pub fn current(&self) -> Arc<Tier> {
        self.current.load_full()
    }

    /// Claims the one change of tier this region allows at a time. Fails when `target` is
    /// past the ladder, is the tier in force, or another change is under way.
    pub fn begin_change(&self, target: TierIndex) -> Result<TierChange<'_>, TierError> {
        let top = self.reservoir.ladder().top();
        if target > top {
            return Err(TierError::BeyondLadder { tier: target, top });
        }
        let claim = u16::from(target.get()) + 1;
        self.claim_change(claim)?;
        let change = TierChange {
            region: self,
            target,
            provisioned: None,
        };
        let tier = self.tier();
        if tier == target {
            return Err(TierError::AlreadyOn { tier });
        }
        Ok(change)
    }

    fn claim_change(&self, claim: u16) -> Result<(), TierError> {
        let pending_error = |pending: u16| TierError::ChangePending {
            pending: TierIndex::new((pending - 1) as u8),
        };
        #[cfg(loom)]
        if tierbuf_pool::sync::planted::is_planted(
            tierbuf_pool::sync::planted::Bug::ChangeClaimCheckThenSet,
        ) {
            let pending = self.pending.load(Ordering::Acquire);
            if pending != NO_CHANGE {
                return Err(pending_error(pending));
            }
            self.pending.store(claim, Ordering::Release);
            return Ok(());
        }
        self.pending
            .compare_exchange(NO_CHANGE, claim, Ordering::AcqRel, Ordering::Acquire)
            .map(drop)
            .map_err(pending_error)
    }

    /// Records that the peer has stopped using every replaced tier at `tier`; they retire
    /// at the next [`TieredRegion::reclaim`] once their local slots are back (a retained
    /// one, once a demotion gives it back). Returns whether any replaced tier was waiting
    /// for that.
    pub fn peer_released(&self, tier: TierIndex) -> bool {
        let mut released = false;
        let mut release = |waiting: &mut [Replaced]| {
            for replaced in waiting {
                if replaced.tier.index == tier && replaced.awaiting_peer {
                    replaced.awaiting_peer = false;
                    released = true;
                }
            }
        };
        // Retained first: a tier that `install` moves from retained to replaced meanwhile
        // is then seen in one of the two (module invariants).
        release(&mut lock(&self.retained));
        release(&mut lock(&self.replaced));
        released
    }

    /// Retires every replaced tier that the peer no longer uses and whose slots are all
    /// back; returns how many it retired. Their regions go back to the reservoir (or are
    /// deregistered) once no cache points at them either.
    #[inline]
    pub fn reclaim(&self) -> usize {
        // Asked at every progress of a connection, nearly always with nothing replaced.
        if self.replaced_len.load(Ordering::Acquire) == 0 {
            return 0;
        }
        self.retire_replaced()
    }

    /// [`TieredRegion::reclaim`]'s work once some tier is replaced.
    fn retire_replaced(&self) -> usize {
        let mut retired = Vec::new();
        let mut replaced = lock(&self.replaced);
        replaced.retain(|replaced| {
            let retire = !replaced.awaiting_peer && retire_pool(&replaced.tier.pool);
            if retire {
                retired.push(Arc::clone(&replaced.tier));
            }
            !retire
        });
        self.replaced_len.store(replaced.len(), Ordering::Release);
        drop(replaced);
        // Dropped outside the lock: the last reference recycles or deregisters the region.
        let count = retired.len();
        drop(retired);
        count
    }

    /// Bytes registered for this region now: the lengths of the tier in force, the
    /// replaced tiers not yet retired and the retained ones (all below the tier in force).
    /// The budget charges each region the whole pages it maps, so a region shorter than a
    /// page costs the budget more than its length.
    ///
    /// ```
    /// use std::sync::Arc;
    /// use tierbuf_pool::{HostRegistrar, MemoryBudget};
    /// use tierbuf_tiers::{Reservoir, TierIndex, TieredRegion, ladder::TierLadder};
    ///
    /// let ladder = TierLadder::builder()
    ///     .tier(512, 4, 512)
    ///     .tier(4096, 4, 4096)
    ///     .retain_replaced(true)
    ///     .build()?;
    /// let budget = MemoryBudget::with_cap(64 << 20);
    /// let reservoir =
    ///     Arc::new(Reservoir::new(Arc::new(HostRegistrar::new(budget)), Arc::new(ladder)));
    /// let region = TieredRegion::new(reservoir)?;
    /// region.begin_change(TierIndex::new(1))?.install(false)?;
    /// let (tier_0, tier_1) = (4 * (512 + 64), 4 * (4096 + 64)); // slots with their headroom
    /// assert_eq!(region.registered_bytes(), tier_0 + tier_1, "tier 0 retained below tier 1");
    /// region.begin_change(TierIndex::SMALLEST)?.install(false)?;
    /// assert_eq!(region.reclaim(), 1, "tier 1 is above the tier in force: it retires");
    /// assert_eq!(region.registered_bytes(), tier_0);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn registered_bytes(&self) -> u64 {
        let region_len = |tier: &Tier| tier.pool.region_len() as u64;
        let held = |tiers: &[Replaced]| tiers.iter().map(|r| region_len(&r.tier)).sum::<u64>();
        // One lock at a time (module invariants).
        let current = region_len(&self.current.load_full());
        let replaced = held(&lock(&self.replaced));
        let retained = held(&lock(&self.retained));
        current + replaced + retained
    }

    /// Replaced tiers not yet retired.
    pub fn replaced_tiers(&self) -> usize {
        lock(&self.replaced).len()
    }

    /// Whether a replaced registration of `tier` has not retired yet and waits for no word
    /// of the peer's, so that changing to `tier` puts it back in force instead of
    /// registering anew.
    pub fn has_replaced(&self, tier: TierIndex) -> bool {
        lock(&self.replaced).iter().any(|r| r.can_come_back(tier))
    }

    fn install(&self, tier: Arc<Tier>, replaced_awaits_peer: bool) -> TierIndex {
        let index = tier.index;
        // Both lists stay locked while tiers move between them (module invariants).
        let mut retained = lock(&self.retained);
        let mut replaced = lock(&self.replaced);
        let old = Replaced {
            tier: self.current.swap(tier),
            awaiting_peer: replaced_awaits_peer,
        };
        self.current_index.store(index.get(), Ordering::Release);
        let from = old.tier.index;
        if self.reservoir.ladder().policy().retain_replaced() {
            // Only tiers below the one in force stay retained.
            let (below, above): (Vec<_>, Vec<_>) =
                retained.drain(..).partition(|r| r.tier.index < index);
            *retained = below;
            replaced.extend(above);
            if from < index {
                retained.push(old);
            } else {
                replaced.push(old);
            }
        } else {
            replaced.push(old);
        }
        self.replaced_len.store(replaced.len(), Ordering::Release);
        drop((replaced, retained));
        tracing::debug!(%from, to = %index, "tier installed");
        from
    }

    /// The target tier: a retained one if the policy kept it, else the newest replaced
    /// registration of it that has not retired and waits for no word of the peer's (put
    /// back in force: a change back to a tier whose receives still drain, or whose slots a
    /// user still holds, needs no registration), else a reservoir spare or a new
    /// registration.
    fn provision_target(&self, target: TierIndex) -> Result<(Arc<Tier>, Provenance), TierError> {
        let mut retained = lock(&self.retained);
        if let Some(position) = retained.iter().position(|r| r.tier.index == target) {
            return Ok((retained.swap_remove(position).tier, Provenance::Reservoir));
        }
        drop(retained);
        let mut replaced = lock(&self.replaced);
        if let Some(position) = replaced.iter().rposition(|r| r.can_come_back(target)) {
            let tier = replaced.remove(position).tier;
            self.replaced_len.store(replaced.len(), Ordering::Release);
            return Ok((tier, Provenance::Reservoir));
        }
        drop(replaced);
        provision_tier(&self.reservoir, target)
    }
}

fn retire_pool(pool: &SlotPool) -> bool {
    #[cfg(loom)]
    if tierbuf_pool::sync::planted::is_planted(
        tierbuf_pool::sync::planted::Bug::ReclaimWithoutRetire,
    ) {
        return true;
    }
    pool.try_retire()
}

fn provision_tier(
    reservoir: &std::sync::Arc<Reservoir>,
    index: TierIndex,
) -> Result<(Arc<Tier>, Provenance), TierError> {
    let spec = reservoir
        .ladder()
        .tier(index)
        .ok_or(TierError::BeyondLadder {
            tier: index,
            top: reservoir.ladder().top(),
        })?;
    let (region, provenance) = reservoir.take(index)?;
    let pool =
        SlotPool::from_region(region, spec.slot_len()).map_err(|source| TierError::Register {
            tier: index,
            source,
        })?;
    let tier = Tier {
        index,
        pool: ManuallyDrop::new(pool),
        reservoir: std::sync::Arc::clone(reservoir),
    };
    Ok((Arc::new(tier), provenance))
}

impl fmt::Debug for TieredRegion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TieredRegion")
            .field("tier", &self.tier())
            .field("replaced", &self.replaced_tiers())
            .finish_non_exhaustive()
    }
}

/// The claim on a region's one tier change; dropping it without installing gives the
/// claim back and returns a provisioned region to the reservoir.
pub struct TierChange<'region> {
    region: &'region TieredRegion,
    target: TierIndex,
    provisioned: Option<(Arc<Tier>, Provenance)>,
}

impl TierChange<'_> {
    /// The tier this change goes to.
    pub fn target(&self) -> TierIndex {
        self.target
    }

    /// Makes the target tier's region ready (a retained tier, a reservoir spare, or a new
    /// registration) and returns its descriptor, which the ack to the peer carries.
    /// Calling it again returns the same region.
    pub fn provision(&mut self) -> Result<RegionDescriptor, TierError> {
        if let Some((tier, _)) = &self.provisioned {
            return Ok(tier.descriptor());
        }
        let provisioned = self.region.provision_target(self.target)?;
        let descriptor = provisioned.0.descriptor();
        self.provisioned = Some(provisioned);
        Ok(descriptor)
    }

    /// Where the provisioned region came from, once provisioned.
    pub fn provenance(&self) -> Option<Provenance> {
        self.provisioned.as_ref().map(|(_, provenance)| *provenance)
    }

    /// Puts the target in force (provisioning it first if [`TierChange::provision`] was
    /// not called) and returns the tier it replaced, which retires once its slots are back
    /// and, if `replaced_awaits_peer`, once [`TieredRegion::peer_released`] says the peer
    /// stopped using it.
    pub fn install(mut self, replaced_awaits_peer: bool) -> Result<TierIndex, TierError> {
        let tier = match self.provisioned.take() {
            Some((tier, _)) => tier,
            None => self.region.provision_target(self.target)?.0,
        };
        Ok(self.region.install(tier, replaced_awaits_peer))
    }
}

impl Drop for TierChange<'_> {
    fn drop(&mut self) {
        self.region.pending.store(NO_CHANGE, Ordering::Release);
    }
}

impl fmt::Debug for TierChange<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TierChange")
            .field("target", &self.target)
            .field("provenance", &self.provenance())
            .finish()
    }
}

/// A thread's view of a [`TieredRegion`] for the hot path.
pub struct TierCache<'region> {
    cache: SwapCache<&'region SwapCell<Tier>, Tier>,
}

impl<'region> TierCache<'region> {
    /// Takes a slot of the tier in force, or `None` when its slots are all held; no lock,
    /// no reference count, and one atomic read beyond the slot pool's own work while the
    /// tier has not changed.
    #[inline]
    pub fn try_acquire(&mut self) -> Option<TierSlot<'region>> {
        let tier = self.cache.load();
        let index = tier.index;
        let slot = tier.pool.try_acquire()?;
        // SAFETY: the slot borrows the tier through this cache, but the tier stays
        // referenced by the region for as long as the slot is held (a held slot makes the
        // tier's retirement fail, module invariants), and the region outlives 'region.
        // So the borrow may be widened to 'region.
        let slot = unsafe { std::mem::transmute::<Slot<'_>, Slot<'region>>(slot) };
        Some(TierSlot { slot, tier: index })
    }

    /// The tier in force as this cache sees it now.
    pub fn tier(&mut self) -> TierIndex {
        self.cache.load().index
    }
}

impl fmt::Debug for TierCache<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TierCache").finish_non_exhaustive()
    }
}

/// A view of a [`TieredRegion`]'s tier in force that borrows nothing, for an owner that
/// keeps it beside the region: its load is one atomic read while the tier has not
/// changed, and it hands out slots that keep their tier alive. Like any cache it may keep
/// a replaced tier referenced until its next load.
///
/// ```
/// use std::sync::Arc;
/// use tierbuf_pool::{HostRegistrar, MemoryBudget};
/// use tierbuf_tiers::{Reservoir, TierIndex, TieredRegion, ladder::TierLadder};
///
/// let budget = MemoryBudget::with_cap(64 << 20);
/// let ladder = Arc::new(TierLadder::preset("two-tier")?);
/// let region = TieredRegion::new(Arc::new(Reservoir::new(Arc::new(HostRegistrar::new(budget)), ladder)))?;
/// let mut cache = region.owned_cache();
/// let small = cache.try_acquire().unwrap();
/// region.begin_change(TierIndex::new(1))?.install(false)?;
/// assert!(!cache.holds(&small), "the slot lies in the replaced tier");
/// assert_eq!(cache.try_acquire().unwrap().tier(), TierIndex::new(1));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct OwnedTierCache {
    cache: SwapCache<std::sync::Arc<SwapCell<Tier>>, Tier>,
}

impl OwnedTierCache {
    /// Takes a slot of the tier in force, or `None` when its slots are all held.
    #[inline]
    pub fn try_acquire(&mut self) -> Option<OwnedTierSlot> {
        Tier::try_acquire_owned(self.cache.load())
    }

    /// Whether `slot` lies in the tier in force itself (not in a replaced registration of
    /// the same index).
    #[inline]
    pub fn holds(&mut self, slot: &OwnedTierSlot) -> bool {
        slot.lies_in(self.cache.load())
    }

    /// The tier in force.
    #[inline]
    pub fn tier(&mut self) -> TierIndex {
        self.cache.load().index
    }

    /// Where the peer finds the tier in force's region.
    pub fn descriptor(&mut self) -> RegionDescriptor {
        self.cache.load().descriptor()
    }
}

/// Another view of the same region, for another thread: it loads the tier in force
/// independently.
impl Clone for OwnedTierCache {
    fn clone(&self) -> OwnedTierCache {
        OwnedTierCache {
            cache: self.cache.clone(),
        }
    }
}

impl fmt::Debug for OwnedTierCache {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OwnedTierCache").finish_non_exhaustive()
    }
}

/// A slot of a tiered region, held until dropped; borrows the region.
pub struct TierSlot<'region> {
    slot: Slot<'region>,
    tier: TierIndex,
}

/// A slot of a tiered region that keeps its tier alive and may cross threads.
pub struct OwnedTierSlot {
    slot: OwnedSlot,
    /// Keeps the tier (and so its region) alive while the slot is held.
    tier: Arc<Tier>,
}

macro_rules! tier_slot_impls {
    ($handle:ty, $tier:ident => $index:expr) => {
        impl $handle {
            /// The tier the slot lies in.
            pub fn tier(&self) -> TierIndex {
                let $tier = &self.tier;
                $index
            }

            /// The keys of the tier's region.
            pub fn keys(&self) -> RegionKeys {
                self.slot.keys()
            }

            /// The address a peer names for the slot's first byte.
            pub fn remote_addr(&self) -> u64 {
                self.slot.remote_addr()
            }

            /// The slot's index in its tier's pool.
            pub fn index(&self) -> u32 {
                self.slot.index()
            }
        }

        impl Deref for $handle {
            type Target = [u8];

            #[inline]
            fn deref(&self) -> &[u8] {
                &self.slot
            }
        }

        impl DerefMut for $handle {
            #[inline]
            fn deref_mut(&mut self) -> &mut [u8] {
                &mut self.slot
            }
        }

        impl fmt::Debug for $handle {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.debug_struct(stringify!($handle))
                    .field("tier", &self.tier())
                    .field("slot", &self.slot)
                    .finish()
            }
        }
    };
}

tier_slot_impls!(TierSlot<'_>, tier => *tier);
tier_slot_impls!(OwnedTierSlot, tier => tier.index);

impl OwnedTierSlot {
    /// Whether the slot lies in `tier` itself, not merely in a tier of the same index (a
    /// region that left a tier and came back holds a new registration of it).
    pub fn lies_in(&self, tier: &Tier) -> bool {
        std::ptr::eq(&*self.tier, tier)
    }
}
