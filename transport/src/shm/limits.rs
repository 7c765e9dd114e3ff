//! What an shm peer can make an endpoint of this process hold: how long it waits for
//! the peer, and how much of the peer's memory it maps.
//!
//! # Invariants
//!
//! - An endpoint maps a region its peer announces only if, with it, the regions the peer
//!   announced and has not forgotten stay within [`PeerMappingLimit`]: in count (each is
//!   a mapping of this process, and a process has `vm.max_map_count` of them for all its
//!   connections and allocations) and in bytes (each takes its length of this process's
//!   address space, whatever the peer keeps in memory). An announcement past it is the
//!   peer's violation; nothing of it is mapped.

use std::time::Duration;

/// How much of its peer's memory one shm endpoint maps at once: the regions the peer
/// announced and has not forgotten, counted and summed (module invariants). Past it, the
/// endpoint fails with [`TransportError::ProtocolViolation`](crate::TransportError) and
/// maps nothing more.
///
/// An honest tierbuf peer announces the receive regions of its tiers: at most one a tier
/// in force or kept, each at most `tierbuf_tiers::ladder::MAX_REGION_LEN` (4 GiB), and on
/// the ladders of the presets a few MiB in all. [`PeerMappingLimit::DEFAULT`] leaves room
/// for a tier of every index a ladder may have, and for four regions of the largest size
/// a ladder allows; a service whose ladders need more raises it
/// ([`ShmProvider::with_peer_mapping_limit`](crate::ShmProvider::with_peer_mapping_limit)).
///
/// ```
/// use tierbuf_transport::PeerMappingLimit;
/// let limit = PeerMappingLimit::new(8, 1 << 30);
/// assert_eq!((limit.regions(), limit.bytes()), (8, 1 << 30));
/// assert!(PeerMappingLimit::DEFAULT.regions() >= 256);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PeerMappingLimit {
    regions: usize,
    bytes: u64,
}

impl PeerMappingLimit {
    /// 256 regions (a tier of every index a ladder may have, and one more), 16 GiB.
    pub const DEFAULT: PeerMappingLimit = PeerMappingLimit::new(256, 16 << 30);

    /// At most `regions` regions of the peer mapped at once, of at most `bytes` in all.
    pub const fn new(regions: usize, bytes: u64) -> PeerMappingLimit {
        PeerMappingLimit { regions, bytes }
    }

    /// The most regions of the peer mapped at once.
    pub fn regions(self) -> usize {
        self.regions
    }

    /// The most bytes of the peer's regions mapped at once.
    pub fn bytes(self) -> u64 {
        self.bytes
    }

    /// Whether `regions` regions of `bytes` in all are within the limit.
    pub(crate) fn admits(self, regions: usize, bytes: u64) -> bool {
        regions <= self.regions && bytes <= self.bytes
    }
}

impl Default for PeerMappingLimit {
    fn default() -> PeerMappingLimit {
        PeerMappingLimit::DEFAULT
    }
}

/// What an endpoint and a listener allow their peer: the peer timeout and the mapping
/// limit, as the provider was given them.
#[derive(Debug, Clone, Copy)]
pub(crate) struct PeerBounds {
    /// How long to wait for what only the peer can do.
    pub(crate) timeout: Duration,
    /// How much of the peer's memory to map at once.
    pub(crate) mapping: PeerMappingLimit,
}
