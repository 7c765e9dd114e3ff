//! Connections over a provider endpoint: the frame header, credits, reassembly and the
//! sans-IO [`ConnectionCore`] that `docs/connection.md` describes.

mod credits;
mod driver;
mod header;
mod reassembly;
mod returns;
mod sansio;

pub use driver::Connection;
pub use header::{FrameKind, HEADER_LEN, HeaderError};
pub use reassembly::ReassemblyError;
pub use sansio::{
    ConnectionConfig, ConnectionCore, ConnectionError, ConnectionStats, Message, SendError,
    WorkKind, WorkRequest, WouldBlock,
};
