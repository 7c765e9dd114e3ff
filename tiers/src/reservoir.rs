//! [`Reservoir`]: registered regions kept ready for each tier of a ladder and shared by
//! every connection of a process, so that a promotion normally takes a region that is
//! already registered instead of registering on its critical path.
//!
//! # Invariants
//!
//! - Every spare region was registered through the reservoir's registrar, so it stays
//!   charged to that registrar's budget while it waits.
//! - A shelf holds at most the ladder's `reservoir_regions` spares; a region given back to
//!   a full shelf is dropped, which deregisters it.
//! - A region on shelf `k` is exactly tier `k`'s length, `slot_size * slot_count`.
//! - **A region exposed to a peer never goes back on a shelf** ([`Region::exposed_to_peer`]:
//!   an shm peer was handed its memory file and may keep it mapped): it is deregistered
//!   when given back, so the next connection, whoever its peer, never gets memory another
//!   peer can still read or write.
//!
//! The registrar and the ladder are shared with `std::sync::Arc` in every build: they
//! take no part in a lock-free protocol, and a trait object cannot sit in loom's `Arc`.

use std::fmt;
use std::sync::Arc;

use tierbuf_pool::{PoolError, Region, Registrar};

use crate::TierIndex;
use crate::ladder::TierLadder;
use crate::sync::{Mutex, lock};

/// Where a provisioned region came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Provenance {
    /// Taken from the reservoir, or a retained or replaced registration of the region put
    /// back in force: no registration on the critical path.
    Reservoir,
    /// Registered on the spot because the shelf was empty.
    Registered,
}

/// Why a tier could not be provisioned or changed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TierError {
    /// The tier asked for is past the ladder's top.
    #[error("{tier} is beyond the ladder, whose top is {top}")]
    BeyondLadder {
        /// The tier asked for.
        tier: TierIndex,
        /// The ladder's top tier.
        top: TierIndex,
    },
    /// Registering the tier's region failed (over budget, out of memory, ...).
    #[error("registering {tier} failed")]
    Register {
        /// The tier being registered.
        tier: TierIndex,
        /// What the registrar said.
        #[source]
        source: PoolError,
    },
    /// Another change of this region's tier is under way.
    #[error("a change to {pending} is already under way")]
    ChangePending {
        /// The target of the change under way.
        pending: TierIndex,
    },
    /// The region is on the tier asked for already.
    #[error("already on {tier}")]
    AlreadyOn {
        /// The tier in force.
        tier: TierIndex,
    },
}

impl TierError {
    /// Whether the failure was the memory budget refusing the registration: the case in
    /// which a peer's request is refused as over budget.
    pub fn is_over_budget(&self) -> bool {
        matches!(
            self,
            TierError::Register {
                source: PoolError::BudgetExceeded { .. },
                ..
            }
        )
    }
}

/// The spare regions of one tier.
type Shelf = Mutex<Vec<Box<dyn Region>>>;

/// Spare registered regions for every tier of one ladder.
///
/// ```
/// use std::sync::Arc;
/// use tierbuf_pool::{HostRegistrar, MemoryBudget};
/// use tierbuf_tiers::{Provenance, Reservoir, TierIndex, ladder::TierLadder};
///
/// let budget = MemoryBudget::with_cap(64 << 20);
/// let ladder = Arc::new(TierLadder::preset("rpc")?); // keeps spares of every tier
/// let reservoir = Reservoir::new(Arc::new(HostRegistrar::new(budget.clone())), ladder);
/// reservoir.fill()?;
/// let (region, provenance) = reservoir.take(TierIndex::new(1))?;
/// assert_eq!(provenance, Provenance::Reservoir);
/// reservoir.give_back(TierIndex::new(1), region);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct Reservoir {
    registrar: Arc<dyn Registrar>,
    ladder: Arc<TierLadder>,
    shelves: Box<[Shelf]>,
}

impl Reservoir {
    /// An empty reservoir for `ladder`'s tiers, registering through `registrar`; each
    /// shelf keeps up to the ladder's `reservoir_regions` spares.
    pub fn new(registrar: Arc<dyn Registrar>, ladder: Arc<TierLadder>) -> Reservoir {
        let shelves = ladder
            .tiers()
            .iter()
            .map(|_| Mutex::new(Vec::new()))
            .collect();
        Reservoir {
            registrar,
            ladder,
            shelves,
        }
    }

    /// The ladder this reservoir serves.
    pub fn ladder(&self) -> &Arc<TierLadder> {
        &self.ladder
    }

    /// The registrar regions are registered with (and whose budget they are charged to).
    pub fn registrar(&self) -> &Arc<dyn Registrar> {
        &self.registrar
    }

    /// Registers regions until every shelf holds its quota of spares; returns how many it
    /// registered. Stops at the first registration that fails (over budget, say) and
    /// reports it; the regions registered until then stay on their shelves.
    pub fn fill(&self) -> Result<usize, TierError> {
        let quota = self.ladder.policy().reservoir_regions();
        let mut registered = 0;
        for (index, shelf) in self.shelves.iter().enumerate() {
            let tier = TierIndex::new(index as u8);
            while lock(shelf).len() < quota {
                let region = self.register(tier)?;
                lock(shelf).push(region);
                registered += 1;
            }
        }
        Ok(registered)
    }

    /// A registered region of `tier`'s length: a spare when there is one, else registered
    /// now.
    pub fn take(&self, tier: TierIndex) -> Result<(Box<dyn Region>, Provenance), TierError> {
        let shelf = self.shelf(tier)?;
        if let Some(region) = lock(shelf).pop() {
            return Ok((region, Provenance::Reservoir));
        }
        Ok((self.register(tier)?, Provenance::Registered))
    }

    /// Puts a region of `tier` back on its shelf, or deregisters it when the shelf is full,
    /// the region is not of that tier, or it was [exposed to a
    /// peer](Region::exposed_to_peer).
    pub fn give_back(&self, tier: TierIndex, region: Box<dyn Region>) {
        let quota = self.ladder.policy().reservoir_regions();
        let fits = !region.exposed_to_peer()
            && self
                .ladder
                .tier(tier)
                .is_some_and(|spec| spec.region_len() == region.len());
        if let (true, Some(shelf)) = (fits, self.shelves.get(usize::from(tier.get()))) {
            let mut spares = lock(shelf);
            if spares.len() < quota {
                spares.push(region);
                return;
            }
        }
        drop(region);
    }

    /// Spare regions of `tier` now.
    pub fn spare(&self, tier: TierIndex) -> usize {
        self.shelves
            .get(usize::from(tier.get()))
            .map_or(0, |shelf| lock(shelf).len())
    }

    /// Bytes registered in spares, all tiers together.
    pub fn spare_bytes(&self) -> u64 {
        self.shelves
            .iter()
            .map(|shelf| lock(shelf).iter().map(|r| r.len() as u64).sum::<u64>())
            .sum()
    }

    fn shelf(&self, tier: TierIndex) -> Result<&Shelf, TierError> {
        self.shelves
            .get(usize::from(tier.get()))
            .ok_or(TierError::BeyondLadder {
                tier,
                top: self.ladder.top(),
            })
    }

    fn register(&self, tier: TierIndex) -> Result<Box<dyn Region>, TierError> {
        let spec = self.ladder.tier(tier).ok_or(TierError::BeyondLadder {
            tier,
            top: self.ladder.top(),
        })?;
        self.registrar
            .register(spec.region_len(), tierbuf_pool::page_size())
            .map_err(|source| TierError::Register { tier, source })
    }
}

impl fmt::Debug for Reservoir {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let spares: Vec<usize> = self.shelves.iter().map(|s| lock(s).len()).collect();
        f.debug_struct("Reservoir")
            .field("spares_per_tier", &spares)
            .finish_non_exhaustive()
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use tierbuf_pool::{HostRegistrar, MemoryBudget};

    use super::*;

    fn reservoir() -> (Reservoir, HostRegistrar) {
        let budget = MemoryBudget::with_cap(64 << 20);
        let ladder = Arc::new(TierLadder::preset("rpc").expect("the rpc preset"));
        let registrar = HostRegistrar::new(budget.clone());
        let reservoir = Reservoir::new(Arc::new(HostRegistrar::new(budget)), ladder);
        (reservoir, registrar)
    }

    #[test]
    fn a_region_exposed_to_a_peer_is_deregistered_instead_of_kept_as_a_spare() {
        let (reservoir, registrar) = reservoir();
        let tier = TierIndex::new(1);
        let len = reservoir.ladder().tier(tier).unwrap().region_len();
        let kept = registrar.register_shared(len, 4096).unwrap();
        reservoir.give_back(tier, Box::new(kept));
        assert_eq!(reservoir.spare(tier), 1, "a region no peer saw is a spare");

        let exposed = registrar.register_shared(len, 4096).unwrap();
        // SAFETY: nothing else touches the region's bytes.
        let _file = unsafe { exposed.expose_memory_file() }.unwrap();
        let charged = registrar.budget().in_use();
        reservoir.give_back(tier, Box::new(exposed));
        assert_eq!(reservoir.spare(tier), 1, "an exposed region is not a spare");
        // The budget charges a region its whole pages.
        assert_eq!(
            registrar.budget().in_use(),
            charged - (len as u64).next_multiple_of(4096),
            "an exposed region given back is deregistered"
        );
    }
}
