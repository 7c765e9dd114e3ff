//! The shared-memory provider: two processes on one host, connected through memory both
//! map.
//!
//! # How a connection works
//!
//! - **Regions** are sealed memory files ([`SharedHostRegion`]) mapped by their owner;
//!   a region is announced to the peer (its memory file passed with `SCM_RIGHTS` on the
//!   connection's bootstrap socket) the first time a receive is posted in it, and the
//!   peer maps it once and keeps it mapped until the owner deregisters it, within its
//!   [`PeerMappingLimit`] of regions and bytes, and the provider's endpoints all
//!   together within its total (`limits`).
//! - **Bootstrap.** A [`ShmListener`] listens on a Unix-domain `SOCK_SEQPACKET` socket;
//!   [`ShmProvider::connect`] creates the connection segment (a memory file holding one
//!   ring per direction), sends it with a hello, and the listener's
//!   [`ShmListener::accept`] checks and maps it and answers. The socket stays open for
//!   the connection's life to carry announcements and to tell each side when the other
//!   process is gone.
//! - **Data** moves without the kernel: the receiver publishes its posted receive
//!   buffers in its ring; the sender copies each message straight into the oldest one
//!   (one copy, like a NIC's DMA into the posted buffer) and publishes the delivery
//!   (see `segment` for the protocol and its invariants).
//! - **Progress** is made by each side's own calls, busy-polling: posting a send copies
//!   it at once if a receive is posted; `poll` copies what waits and reaps deliveries.
//! - **A peer that dies** is noticed when its socket closes while the connection is
//!   open: the next `poll` fails with [`TransportError::PeerDied`], and every
//!   outstanding request is flushed.
//! - **A peer that stalls** (holds its copy gate, says no hello) is waited for the provider's peer timeout at most
//!   ([`ShmProvider::with_peer_timeout`]); then the endpoint fails with
//!   [`TransportError::PeerStalled`], and `close` and drop return.
//!
//! Everything else follows the verbs rules of [`Endpoint`], with one difference: a
//! receive whose region is deregistered while the peer fills it completes with a
//! protection error here, but the peer's send may already have completed successfully.

#[cfg(not(loom))]
mod bootstrap;
// The bootstrap record codec, for the `fuzzing` module's wrappers.
#[cfg(all(feature = "fuzzing", not(loom)))]
pub(crate) use bootstrap::{RECORD_LEN, Record, RecordError};
#[cfg(not(loom))]
mod endpoint;
#[cfg(not(loom))]
mod limits;
pub mod segment;

#[cfg(not(loom))]
pub use endpoint::ShmEndpoint;
#[cfg(not(loom))]
pub use limits::PeerMappingLimit;
#[cfg(not(loom))]
pub use provider::{ShmListener, ShmProvider, ShmRegistrar};
pub use segment::RING_CAPACITY;

#[cfg(not(loom))]
mod provider;
