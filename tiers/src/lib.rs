//! Tier ladders, lock-free tier swapping and the sans-IO promotion protocol.
//!
//! A connection starts on the smallest tier of its [`ladder::TierLadder`] and is promoted,
//! for that connection only, to a larger tier when a message needs it.
//!
//! What a user of `tierbuf-transport` reaches for here:
//!
//! - [`ladder`]: the [`TierLadder`](ladder::TierLadder) both sides agree on, from a
//!   preset, a TOML file or a builder, and the bounds its validation enforces;
//! - [`Reservoir`], which holds the registered regions connections draw their tiers from,
//!   and [`TieredRegion`], one direction's region swapped lock-free;
//! - [`negotiator::Negotiator`], the seam through which a connection can carry its tier
//!   negotiation over a channel of the user's own, with the control messages of [`wire`];
//! - [`TierStats`], what a connection's tier negotiation did.
//!
//! The rest is the machinery the transport drives: a connection's
//! [`controller::TierController`] plans each message with [`policy`], negotiates with the
//! peer through the state machines of [`negotiation`], and swaps each direction's region.

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

pub use reservoir::{Provenance, Reservoir, TierError};
pub use stats::TierStats;
pub use tiered::{
    OwnedTierCache, OwnedTierSlot, Tier, TierCache, TierChange, TierSlot, TieredRegion,
};

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
