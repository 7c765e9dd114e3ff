//! [`FrameCapacity`]: how many bytes of a message one frame carries on each tier of a
//! ladder, once the transport's per-frame overhead (its frame header) is taken from the
//! slot. It is the one measure of "does it fit": the planners decide promotion and
//! segmentation with it, and the [`DemotionTracker`](super::DemotionTracker) decides which
//! tier a message needed with it, so the two can never disagree.
//!
//! # Invariants
//!
//! - Every tier's slot is longer than the overhead, so every tier carries at least one
//!   byte per frame ([`FrameCapacity::new`] refuses a ladder where one does not).
//! - `whole(tier) <= frame(tier)`: a message sent whole on a tier fits one frame of it.

use std::sync::Arc;

use crate::TierIndex;
use crate::ladder::TierLadder;

/// Why a ladder cannot carry the transport's frames.
///
/// ```
/// use std::sync::Arc;
/// use tierbuf_tiers::ladder::TierLadder;
/// use tierbuf_tiers::policy::{CapacityError, FrameCapacity};
/// let ladder = Arc::new(TierLadder::builder().tier(64, 4, 64).build()?);
/// let err = FrameCapacity::new(ladder, 64).unwrap_err();
/// assert!(matches!(err, CapacityError::NoRoomAfterOverhead { slot_size: 64, overhead: 64, .. }));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CapacityError {
    /// A tier's slot holds nothing beyond the per-frame overhead: a configuration error.
    #[error(
        "{tier} slots of {slot_size} bytes leave no room after the {overhead}-byte frame overhead"
    )]
    NoRoomAfterOverhead {
        /// The tier.
        tier: TierIndex,
        /// Its slot size.
        slot_size: usize,
        /// The transport's bytes per frame.
        overhead: usize,
    },
}

/// The bytes of a message one frame carries on each tier of a ladder.
///
/// - [`whole`](FrameCapacity::whole): the longest message sent whole on the tier: its slot
///   less the overhead, and no more than its promotion threshold.
/// - [`frame`](FrameCapacity::frame): the most payload one frame carries into a receive of
///   the tier (a segment's bound): the slot less the overhead.
///
/// ```
/// use std::sync::Arc;
/// use tierbuf_tiers::TierIndex;
/// use tierbuf_tiers::ladder::TierLadder;
/// use tierbuf_tiers::policy::FrameCapacity;
/// // A 4 KiB slot whose threshold is the whole slot: a 16-byte header leaves 4080 bytes.
/// let ladder = TierLadder::builder().tier(4096, 8, 4096).tier(65_536, 4, 65_536).build()?;
/// let capacity = FrameCapacity::new(Arc::new(ladder), 16)?;
/// assert_eq!(capacity.whole(TierIndex::SMALLEST), Some(4080));
/// assert_eq!(capacity.tier_for(4096), Some(TierIndex::new(1)), "4 KiB needs tier 1");
/// assert_eq!(capacity.tier_for(65_536), None, "past the top: segmented");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FrameCapacity {
    ladder: Arc<TierLadder>,
    overhead: usize,
    /// Per tier: `(whole, frame)`.
    tiers: Vec<(usize, usize)>,
}

impl FrameCapacity {
    /// The capacities of `ladder`'s tiers when every frame spends `overhead` bytes of its
    /// slot on the transport's header.
    ///
    /// # Errors
    ///
    /// [`CapacityError::NoRoomAfterOverhead`] when a tier's slot is no longer than
    /// `overhead`.
    pub fn new(ladder: Arc<TierLadder>, overhead: usize) -> Result<FrameCapacity, CapacityError> {
        let tiers = ladder
            .iter()
            .map(|(tier, spec)| {
                let frame = spec
                    .slot_size()
                    .checked_sub(overhead)
                    .filter(|&room| room > 0);
                let frame = frame.ok_or(CapacityError::NoRoomAfterOverhead {
                    tier,
                    slot_size: spec.slot_size(),
                    overhead,
                })?;
                Ok((frame.min(spec.promote_threshold()), frame))
            })
            .collect::<Result<Vec<_>, CapacityError>>()?;
        Ok(FrameCapacity {
            ladder,
            overhead,
            tiers,
        })
    }

    /// The ladder measured.
    pub fn ladder(&self) -> &Arc<TierLadder> {
        &self.ladder
    }

    /// The transport's bytes per frame.
    pub fn overhead(&self) -> usize {
        self.overhead
    }

    /// The longest message sent whole on `tier`; `None` when `tier` is not on the ladder.
    #[inline]
    pub fn whole(&self, tier: TierIndex) -> Option<usize> {
        self.tiers
            .get(usize::from(tier.get()))
            .map(|&(whole, _)| whole)
    }

    /// The most payload one frame carries into a receive of `tier`; `None` when `tier` is
    /// not on the ladder.
    #[inline]
    pub fn frame(&self, tier: TierIndex) -> Option<usize> {
        self.tiers
            .get(usize::from(tier.get()))
            .map(|&(_, frame)| frame)
    }

    /// The smallest tier on which a message of `len` bytes is sent whole; `None` when none
    /// is (the message is segmented on the top tier).
    pub fn tier_for(&self, len: usize) -> Option<TierIndex> {
        self.tiers
            .iter()
            .position(|&(whole, _)| whole >= len)
            // A ladder has at most 256 tiers, so every position fits a `u8`.
            .map(|position| TierIndex::new(position as u8))
    }

    /// The smallest tier whose frames carry `len` bytes whole, or the top tier for a message
    /// past every tier: the tier a message of `len` bytes *needs*.
    pub fn needed_tier(&self, len: usize) -> TierIndex {
        self.tier_for(len).unwrap_or(self.ladder.top())
    }
}
