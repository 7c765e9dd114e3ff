//! Connections over a provider endpoint: the frame header, credits, reassembly, the
//! sans-IO [`ConnectionCore`] that `docs/connection.md` describes, and the
//! [`ConnectionTable`] that keeps connections by id and can drive them from a progress
//! thread.

mod credits;
mod driver;
mod header;
mod reassembly;
mod returns;
mod sansio;
mod table;

pub use driver::{Connection, SendBuffer};
pub use header::{FrameKind, HEADER_LEN, HeaderError};
pub use reassembly::ReassemblyError;
pub use sansio::{
    ConnectionConfig, ConnectionCore, ConnectionError, ConnectionStats, CopiedFrame, Message,
    SendError, WorkKind, WorkRequest, WouldBlock,
};
pub use table::{
    ConnectionGuard, ConnectionId, ConnectionTable, ProgressConfig, ProgressStats,
    SharedConnection, TableError,
};
