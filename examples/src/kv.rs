//! A key-value store served over tierbuf: a [`redb`] database behind a small binary
//! protocol ([`wire`]) of PUT, GET, DELETE and STATS, one request and one reply per tierbuf
//! message, values from 16 B to 4 MiB (those past the ladder's top tier travel segmented).
//!
//! - [`server`] serves connections from a [`store::Store`], one thread per connection, and
//!   [`server::run_shm_server`] is the whole server process of a run over shm.
//! - [`client`] is the client ([`client::KvClient`]) and the workload that writes a mixed
//!   set, reads every key back byte for byte and deletes some ([`client::Workload`]).
//! - [`process`] starts the server process and reads its `listening` line.
//! - [`run`] runs the workload over shm, the server in a process of its own, or over
//!   loopback in this one.
//! - [`memory`] samples a budget's registered bytes over time, on both sides.
//!
//! Both sides of a run agree on a [`Setup`]: which ladder ([`LadderChoice`]: the
//! `storage` preset, or a static one-tier ladder of its top tier), how many connections,
//! and the demotion timing.

pub mod client;
pub mod memory;
pub mod process;
pub mod run;
pub mod server;
pub mod store;
pub mod wire;

use std::sync::Arc;
use std::time::Duration;

use tierbuf_pool::MemoryBudget;
use tierbuf_tiers::ladder::{LadderError, LoadError, TierLadder};
use tierbuf_transport::connection::{ConnectionError, SendError};
use tierbuf_transport::{Kind, SetupError, Transport, TransportBuilder};

/// The ladder of a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LadderChoice {
    /// The `storage` preset: 4 KiB, 64 KiB and 1 MiB slots, a connection promoted only
    /// while it needs to be.
    Tiered,
    /// One tier, the `storage` preset's top one (1 MiB slots), registered up front for
    /// every connection: what a system without tiers registers.
    Static,
}

impl LadderChoice {
    /// Both, tiered first.
    pub const ALL: [LadderChoice; 2] = [LadderChoice::Tiered, LadderChoice::Static];

    /// Its name on the command line and in reports: `tiered` or `static`.
    pub fn name(self) -> &'static str {
        match self {
            LadderChoice::Tiered => "tiered",
            LadderChoice::Static => "static",
        }
    }

    /// The choice called `name`, if any.
    pub fn from_name(name: &str) -> Option<LadderChoice> {
        LadderChoice::ALL
            .into_iter()
            .find(|choice| choice.name() == name)
    }

    /// The ladder itself.
    ///
    /// # Errors
    ///
    /// [`KvError::Preset`] or [`KvError::Ladder`]; neither happens with the presets this
    /// build carries.
    pub fn ladder(self) -> Result<TierLadder, KvError> {
        let storage = TierLadder::preset("storage").map_err(|source| KvError::Preset { source })?;
        match self {
            LadderChoice::Tiered => Ok(storage),
            LadderChoice::Static => {
                let top = storage.tiers().last().expect("a ladder has a tier");
                TierLadder::builder()
                    .policy(*storage.policy())
                    .tier(top.slot_size(), top.slot_count(), top.promote_threshold())
                    .build()
                    .map_err(|source| KvError::Ladder { source })
            }
        }
    }
}

/// What both sides of a run agree on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Setup {
    /// The ladder.
    pub ladder: LadderChoice,
    /// The connections the client makes and the server accepts.
    pub connections: usize,
    /// Idle time before a connection steps down a tier (the preset's 60 s is for streams
    /// of blocks; a run shows demotion within seconds).
    pub demote_after: Duration,
    /// Least time on a tier before stepping down.
    pub hysteresis: Duration,
    /// Each process's budget of registered memory.
    pub budget_bytes: u64,
}

impl Setup {
    /// A setup of `connections` connections on `ladder`, demoting after 300 ms idle.
    pub fn new(ladder: LadderChoice, connections: usize) -> Setup {
        Setup {
            ladder,
            connections,
            demote_after: Duration::from_millis(300),
            hysteresis: Duration::from_millis(100),
            budget_bytes: 1 << 30,
        }
    }

    /// A transport built by `builder` for this setup.
    ///
    /// # Errors
    ///
    /// The ladder's, or [`KvError::Setup`].
    pub fn transport<K: Kind>(
        &self,
        builder: TransportBuilder<K>,
    ) -> Result<Transport<K>, KvError> {
        builder
            .ladder(Arc::new(self.ladder.ladder()?))
            .demote_after(self.demote_after)
            .hysteresis(self.hysteresis)
            .budget_bytes(self.budget_bytes)
            .connections(self.connections)
            .build()
            .map_err(|source| KvError::Setup {
                source: Box::new(source),
            })
    }
}

/// What can go wrong in the key-value service, on either side.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum KvError {
    /// The `storage` preset did not load.
    #[error("loading the storage preset")]
    Preset {
        /// Why.
        #[source]
        source: LoadError,
    },
    /// The static ladder is not valid.
    #[error("building the static ladder")]
    Ladder {
        /// Why.
        #[source]
        source: LadderError,
    },
    /// The transport could not be built, listen, accept or connect.
    #[error("setting up the transport")]
    Setup {
        /// Why.
        #[source]
        source: Box<SetupError>,
    },
    /// Sending a request or a reply failed.
    #[error("sending on connection {connection}")]
    Send {
        /// The connection's index.
        connection: usize,
        /// Why.
        #[source]
        source: SendError,
    },
    /// Receiving failed: the peer is gone, or broke the connection's rules.
    #[error("receiving on connection {connection}")]
    Receive {
        /// The connection's index.
        connection: usize,
        /// Why.
        #[source]
        source: Arc<ConnectionError>,
    },
    /// No reply came in time.
    #[error("no reply on connection {connection} within {waited:?}")]
    NoReply {
        /// The connection's index.
        connection: usize,
        /// How long the client waited.
        waited: Duration,
    },
    /// A reply that does not follow the protocol.
    #[error("a malformed reply on connection {connection}")]
    Wire {
        /// The connection's index.
        connection: usize,
        /// What is wrong with it.
        #[source]
        source: wire::WireError,
    },
    /// The server answered with an error, or with a status the request cannot have.
    #[error("the server answered {status:?} to {request} of key {key:?}: {message}")]
    Refused {
        /// The request, by name.
        request: &'static str,
        /// The key, as text where it is.
        key: String,
        /// The status.
        status: wire::Status,
        /// The server's message.
        message: String,
    },
    /// A value read back differs from the one written.
    #[error("key {key:?}: {problem}")]
    Mismatch {
        /// The key.
        key: String,
        /// What differs.
        problem: String,
    },
    /// The store failed.
    #[error("the store failed")]
    Store {
        /// Why.
        #[source]
        source: store::StoreError,
    },
    /// The server process could not be started, did not listen, or failed.
    #[error("the server process")]
    ServerProcess {
        /// What went wrong with it.
        #[source]
        source: crate::process::ProcessError,
    },
    /// This process could not do what it was asked (its arguments, its output).
    #[error("the server process: {what}")]
    Process {
        /// What happened.
        what: String,
        /// The I/O error behind it, if one.
        #[source]
        source: Option<std::io::Error>,
    },
    /// A thread of this side panicked.
    #[error("a {0} thread panicked")]
    Panicked(&'static str),
    /// Registered memory was left in use after every connection closed.
    #[error("{0} registered bytes were not returned")]
    Leaked(u64),
}

/// `Ok` when no byte registered through `budget` is left in use.
fn returned(budget: &MemoryBudget) -> Result<(), KvError> {
    match budget.in_use() {
        0 => Ok(()),
        left => Err(KvError::Leaked(left)),
    }
}
