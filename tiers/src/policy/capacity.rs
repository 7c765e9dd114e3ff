//! [`FrameCapacity`]: how many bytes of a message one frame carries on each tier of a
//! ladder. It is the one measure of "does it fit": the planners decide promotion and
//! segmentation with it, and the [`DemotionTracker`](super::DemotionTracker) decides which
//! tier a message needed with it, so the two can never disagree.
//!
//! A tier's size is its frames' payload: the transport's per-frame overhead (its frame
//! header) goes in the [`SLOT_HEADROOM`] every registered slot holds past the size, not in
//! the size (`docs/ladders.md`, "Tier sizes").
//!
//! # Invariants
//!
//! - The overhead fits the headroom ([`FrameCapacity::new`] refuses a transport whose
//!   header does not), so `frame(tier)` is the tier's size, never less.
//! - `whole(tier) <= frame(tier)`: a message sent whole on a tier fits one frame of it.

use std::sync::Arc;

use crate::TierIndex;
use crate::ladder::{SLOT_HEADROOM, TierLadder};

/// Why a ladder cannot carry the transport's frames.
///
/// ```
/// use std::sync::Arc;
/// use tierbuf_tiers::ladder::TierLadder;
/// use tierbuf_tiers::policy::{CapacityError, FrameCapacity};
/// let ladder = Arc::new(TierLadder::builder().tier(64, 4, 64).build()?);
/// let err = FrameCapacity::new(ladder, 65).unwrap_err();
/// assert_eq!(err, CapacityError::OverheadPastHeadroom { overhead: 65, headroom: 64 });
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CapacityError {
    /// The transport's per-frame overhead is longer than the headroom every slot registers
    /// past its tier's size, so a frame would not carry the size it is labelled.
    #[error(
        "a {overhead}-byte frame overhead does not fit the {headroom} bytes each slot holds past its tier's size"
    )]
    OverheadPastHeadroom {
        /// The transport's bytes per frame.
        overhead: usize,
        /// The headroom, [`SLOT_HEADROOM`].
        headroom: usize,
    },
}

/// The bytes of a message one frame carries on each tier of a ladder.
///
/// - [`whole`](FrameCapacity::whole): the longest message sent whole on the tier: its
///   promotion threshold.
/// - [`frame`](FrameCapacity::frame): the most payload one frame carries into a receive of
///   the tier (a segment's bound): the tier's size.
///
/// ```
/// use std::sync::Arc;
/// use tierbuf_tiers::TierIndex;
/// use tierbuf_tiers::ladder::TierLadder;
/// use tierbuf_tiers::policy::FrameCapacity;
/// // A 4 KiB tier carries a 4 KiB message whole: the 16-byte header is in the slot's headroom.
/// let ladder = TierLadder::builder().tier(4096, 8, 4096).tier(65_536, 4, 65_536).build()?;
/// let capacity = FrameCapacity::new(Arc::new(ladder), 16)?;
/// assert_eq!(capacity.whole(TierIndex::SMALLEST), Some(4096));
/// assert_eq!(capacity.tier_for(4096), Some(TierIndex::SMALLEST));
/// assert_eq!(capacity.tier_for(4097), Some(TierIndex::new(1)), "past 4 KiB needs tier 1");
/// assert_eq!(capacity.tier_for(65_537), None, "past the top: segmented");
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
    /// slot on the transport's header, ahead of the payload.
    ///
    /// # Errors
    ///
    /// [`CapacityError::OverheadPastHeadroom`] when `overhead` is longer than
    /// [`SLOT_HEADROOM`].
    pub fn new(ladder: Arc<TierLadder>, overhead: usize) -> Result<FrameCapacity, CapacityError> {
        if overhead > SLOT_HEADROOM {
            return Err(CapacityError::OverheadPastHeadroom {
                overhead,
                headroom: SLOT_HEADROOM,
            });
        }
        // Validation keeps every threshold within its tier's size.
        let tiers = ladder
            .tiers()
            .iter()
            .map(|spec| (spec.promote_threshold(), spec.slot_size()))
            .collect();
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
