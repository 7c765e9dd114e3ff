//! Connections over a provider endpoint: the frame header, credits, reassembly, the
//! sans-IO [`ConnectionCore`] that `docs/connection.md` describes (which asks the
//! `tiers` crate's `TierController` for everything about tiers), and the
//! [`ConnectionTable`] that keeps connections by id and can drive them from a progress
//! thread.

mod config;
mod control;
mod core;
mod credits;
mod driver;
mod errors;
// Crate-visible for the `fuzzing` module's frame-header wrappers.
pub(crate) mod header;
mod packed;
// Public for the loom models of its handshakes and of the async connection's spin.
#[doc(hidden)]
pub mod readiness;
mod reassembly;
mod receive;
mod rendezvous;
mod reserve;
mod returns;
mod send;
// Public for the loom models' `SendQueue`; `Sender` is re-exported below.
#[doc(hidden)]
pub mod senders;
#[cfg(all(feature = "tokio", not(loom)))]
mod stream;
mod table;
#[cfg(all(feature = "tokio", not(loom)))]
mod tokio;
mod transmit;

#[cfg(all(feature = "tokio", not(loom)))]
pub use self::tokio::{AsyncConnection, AsyncConnectionGuard};
pub use config::{ConnectionConfig, DataPath};
pub use core::{ConnectionCore, ConnectionStats};
pub use driver::{Connection, SendBuffer};
pub use errors::{
    ConfigError, ConnectionError, Fault, PeerViolation, SendError, WorkKind, WouldBlock,
};
pub use header::{
    EXPOSED_LEN, FrameKind, HEADER_LEN, HeaderError, PACKED_ENTRY_HEAD, READ_ANSWER_LEN,
};
pub use packed::PackedError;
pub use reassembly::ReassemblyError;
pub use receive::Message;
pub use senders::Sender;
#[cfg(all(feature = "tokio", not(loom)))]
pub use stream::ByteStream;
pub use table::{
    ConnectionGuard, ConnectionId, ConnectionTable, ProgressConfig, ProgressStats,
    SharedConnection, TableError,
};
pub use transmit::{Exposure, Post, Transmit};
