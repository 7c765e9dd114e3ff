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
//! - All the endpoints of one provider (and of the listeners it made) map no more of
//!   their peers together than the provider's total ([`PeerMappingLimit::DEFAULT_TOTAL`]
//!   unless set): each mapping of a peer's region holds a [`MappingCharge`] of its
//!   length from the provider's [`MappingLedger`], taken before the region is mapped and
//!   given back when the mapping is undone. So many connections, each within its own
//!   limit, cannot take the process's mappings or address space together either; past
//!   the total an announcement fails its connection as this process's resource
//!   exhausted, and nothing of it is mapped.
//! - The connection segment counts in that total on the side that maps the peer's file:
//!   the accepting side charges it before mapping it, and its endpoint holds the charge
//!   until it is dropped. So connections accepted from peers, which each map one more
//!   file of the peer's, cannot take the process's mappings either: past the total a
//!   connection is refused (`Refusal::Full`) and nothing of it is mapped. The connecting
//!   side maps a file it made itself, at its own user's asking, and charges nothing.

use std::sync::{Arc, Mutex, PoisonError};
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

    /// What all the endpoints of one provider map of their peers together, unless set
    /// ([`ShmProvider::with_peer_mapping_total`](crate::ShmProvider::with_peer_mapping_total)):
    /// 16 384 regions, a quarter of Linux's default `vm.max_map_count` (65 530), which
    /// the process's own regions, connection segments and allocations share; and 4 TiB,
    /// a thirty-second of the 128 TiB of address space a process has on x86-64. An honest
    /// connection maps one or two regions of its peer, and an accepted one its segment
    /// too, so the count leaves room for thousands of connections (5 461 accepted ones
    /// with two regions each); 64 hostile ones at their own count limit, or 256 at their
    /// byte limit, or 16 384 connections opened and left idle, reach the total, not the
    /// process's end.
    pub const DEFAULT_TOTAL: PeerMappingLimit = PeerMappingLimit::new(16_384, 4 << 40);

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

/// What an endpoint and a listener allow their peer: the peer timeout, the mapping
/// limit, and the provider's ledger of what all its endpoints map, as the provider was
/// given them.
#[derive(Debug, Clone)]
pub(crate) struct PeerBounds {
    /// How long to wait for what only the peer can do.
    pub(crate) timeout: Duration,
    /// How much of the peer's memory to map at once.
    pub(crate) mapping: PeerMappingLimit,
    /// What the provider's endpoints map of their peers together.
    pub(crate) total: Arc<MappingLedger>,
}

/// What the endpoints of one provider have mapped of their peers, against the
/// provider's total (module invariants). Mapping a peer's region is rare (a connection's
/// setup, a promotion), so a mutex keeps the two counts together.
#[derive(Debug)]
pub(crate) struct MappingLedger {
    limit: PeerMappingLimit,
    mapped: Mutex<Mapped>,
}

/// Regions mapped and their bytes.
#[derive(Debug, Default, Clone, Copy)]
struct Mapped {
    regions: usize,
    bytes: u64,
}

impl MappingLedger {
    /// A ledger with nothing mapped, allowing `limit` in all.
    pub(crate) fn new(limit: PeerMappingLimit) -> Arc<MappingLedger> {
        Arc::new(MappingLedger {
            limit,
            mapped: Mutex::new(Mapped::default()),
        })
    }

    /// The total allowed.
    pub(crate) fn limit(&self) -> PeerMappingLimit {
        self.limit
    }

    /// Regions mapped now, and their bytes.
    pub(crate) fn in_use(&self) -> (usize, u64) {
        let mapped = *self.mapped.lock().unwrap_or_else(PoisonError::into_inner);
        (mapped.regions, mapped.bytes)
    }

    /// Charges one region of `bytes` before it is mapped, if the total allows it; the
    /// charge is given back when dropped.
    pub(crate) fn charge(
        self: &Arc<MappingLedger>,
        bytes: u64,
    ) -> Result<MappingCharge, PeerMappingTotalReached> {
        let mut mapped = self.mapped.lock().unwrap_or_else(PoisonError::into_inner);
        let regions = mapped.regions + 1;
        let total = mapped.bytes.saturating_add(bytes);
        if !self.limit.admits(regions, total) {
            return Err(PeerMappingTotalReached {
                regions: mapped.regions,
                bytes: mapped.bytes,
                asked: bytes,
                limit: self.limit,
            });
        }
        *mapped = Mapped {
            regions,
            bytes: total,
        };
        Ok(MappingCharge {
            ledger: Arc::clone(self),
            bytes,
        })
    }
}

/// One mapped region of a peer's, counted in its provider's ledger until dropped.
#[derive(Debug)]
pub(crate) struct MappingCharge {
    ledger: Arc<MappingLedger>,
    bytes: u64,
}

impl Drop for MappingCharge {
    fn drop(&mut self) {
        let mut mapped = self
            .ledger
            .mapped
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        mapped.regions -= 1;
        mapped.bytes -= self.bytes;
    }
}

/// A region a peer announced was not mapped: the provider's endpoints map as much of
/// their peers as its total allows. Not this peer's fault alone (it is within its own
/// limit): the process's connections together took it.
#[derive(Debug, thiserror::Error)]
#[error(
    "{regions} regions of {bytes} bytes of peers' memory are mapped by this provider's \
     endpoints, and one more of {asked} bytes would pass their total of {} regions of {} \
     bytes (ShmProvider::with_peer_mapping_total)",
    limit.regions(),
    limit.bytes()
)]
pub(crate) struct PeerMappingTotalReached {
    regions: usize,
    bytes: u64,
    asked: u64,
    limit: PeerMappingLimit,
}
