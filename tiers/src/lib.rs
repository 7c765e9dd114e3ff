//! Tier ladders, lock-free tier swapping and the sans-IO promotion protocol.
//!
//! A connection starts on the smallest tier of its [`ladder::TierLadder`] and is promoted,
//! for that connection only, to a larger tier when a message needs it. The promotion is
//! negotiated with the peer by the state machines of [`negotiation`], whose control
//! messages are encoded by [`wire`] and carried by a [`negotiator::Negotiator`]. A
//! connection's [`controller::TierController`] ties them together: it plans each message
//! with [`policy`], negotiates through the negotiator, and swaps each direction's
//! [`TieredRegion`] lock-free.

#![warn(missing_docs)]

pub mod controller;
pub mod ladder;
pub mod negotiation;
pub mod negotiator;
pub mod policy;
mod reservoir;
mod stats;
mod sync;
mod tiered;
pub mod wire;

pub use controller::{Change, ControllerError, Framing, SendPlan, TierController};
pub use negotiation::{Event, Negotiation, NegotiationConfig, TierShape};
pub use negotiator::{InMemoryNegotiator, Negotiator, pump};
pub use policy::{DemotionTracker, IoVecPlan, MessagePlan, PolicyError, Promotion};
pub use reservoir::{Provenance, Reservoir, TierError};
pub use stats::TierStats;
pub use tiered::{
    OwnedTierCache, OwnedTierSlot, Tier, TierCache, TierChange, TierSlot, TieredRegion,
};
pub use wire::{ControlMessage, Epoch, NackReason};

/// The position of a tier in a ladder: 0 is the smallest.
///
/// ```
/// use tierbuf_tiers::TierIndex;
/// assert!(TierIndex::new(2) > TierIndex::SMALLEST);
/// assert_eq!(TierIndex::new(2).get(), 2);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct TierIndex(u8);

impl TierIndex {
    /// The smallest tier, where every connection starts.
    pub const SMALLEST: TierIndex = TierIndex(0);

    /// The tier at position `index`.
    pub const fn new(index: u8) -> TierIndex {
        TierIndex(index)
    }

    /// The position as a number.
    pub const fn get(self) -> u8 {
        self.0
    }
}

impl std::fmt::Display for TierIndex {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "tier {}", self.0)
    }
}

/// Where a peer finds a registered region: what a promotion ack carries.
///
/// ```
/// use tierbuf_tiers::RegionDescriptor;
/// let region = RegionDescriptor { addr: 0x7f00_0000, len: 8192 * 64, remote_key: 0x0101 };
/// assert_eq!(region.len, 524_288);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RegionDescriptor {
    /// The address of the region's first byte, as the peer names it.
    pub addr: u64,
    /// The region's length in bytes.
    pub len: u64,
    /// The remote key that grants the peer access.
    pub remote_key: u32,
}
