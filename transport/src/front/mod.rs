//! The front door: one entry point per provider that assembles and checks everything a
//! connection needs, then listens, accepts and connects.
//!
//! ```
//! use tierbuf_transport::Transport;
//! let node = Transport::loopback().ladder_preset("rpc").budget_bytes(64 << 20).build()?;
//! let listener = node.listen("echo")?;
//! let mut client = node.connect("echo")?;
//! let mut server = listener.accept()?;
//! client.send(b"ping")?;
//! assert_eq!(&server.recv()?[..], b"ping");
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # Shape
//!
//! - [`Transport::loopback`], [`Transport::shm`] and `Transport::verbs` (feature
//!   `verbs`) each start a [`TransportBuilder`] for one provider. The builder takes the
//!   ladder (a preset name, a TOML file or a
//!   [`TierLadder`](tierbuf_tiers::ladder::TierLadder) value), the memory
//!   budget (bytes, a [`MemoryBudget`](tierbuf_pool::MemoryBudget), or by default one
//!   from the system's limits), and what a run may want to change of the ladder's policy
//!   (demotion timing, spare regions in the reservoir).
//! - [`TransportBuilder::build`] checks everything once, in one place, and reports the
//!   first failure as a [`SetupError`] that says whose fault it is: the ladder loads and
//!   connections can run on it, the queue depth it needs
//!   ([`ConnectionConfig::queue_depth`](crate::connection::ConnectionConfig::queue_depth))
//!   fits the provider's queues, the budget holds the reservoir and a connection, the
//!   open-file limit (and on verbs the memlock limit) holds the connections expected.
//!   Then it opens the provider and fills the reservoir.
//! - The built [`Transport`] is a cheap handle (cloning shares it) to send to other
//!   threads. `listen(address)` gives a [`Listener`] whose `accept` and
//!   `accept_timeout` return connections; `connect(address)` and
//!   `connect_timeout(address, timeout)` return the other end. Every connection returned
//!   is a ready [`Connection`](crate::connection::Connection) (its first receives
//!   posted), `Send`, drawing its tiers from the transport's one reservoir.
//!
//! The transport is generic over its provider ([`Kind`]) rather than one type with the
//! provider chosen at run time: each provider's connection keeps its own endpoint type,
//! so the data path pays no dispatch, and an address has the type its provider needs (a
//! name, a socket path, a TCP address), checked at compile time.
//!
//! # Addresses
//!
//! - loopback: a name, local to the transport value it was listened on (and its clones);
//!   `connect` pairs two endpoints ([`LoopbackProvider::pair`](crate::LoopbackProvider::pair))
//!   and hands one to the listener's queue.
//! - shm: the path of a Unix-domain socket, which must not exist yet; the listener
//!   removes it when dropped ([`ShmProvider::listen`](crate::ShmProvider::listen)).
//! - verbs: the TCP address the two sides exchange their queue pairs over
//!   (`VerbsProvider::listen`).
//!
//! # Waiting
//!
//! A listener of shm or verbs accepts on a thread of its own, which completes each
//! peer's handshake and hands the endpoint to `accept` through a queue of
//! [`ACCEPT_BACKLOG`] endpoints: so `accept_timeout` can wait with a deadline on a
//! provider whose own `accept` has none, and one slow peer's handshake holds up no
//! `accept` call. A verbs handshake goes on after the peer has spoken (queue pairs
//! exchanged, then connected, then ready), so each runs on a thread of its own, at most
//! [`MAX_HANDSHAKES`] at once and [`MAX_HANDSHAKES_PER_HOST`] of one host (its further
//! peers wait for that host's turns, [`MAX_WAITING_PER_HOST`] at most): a peer that
//! stalls in its handshake holds up no other, and a host that stalls all of its holds up
//! no other host. Dropping the listener stops the thread (waking it with a connection of
//! its own that says nothing) and joins it. Where that connection cannot be made (an shm
//! socket's path removed by someone else while it listens) the thread is left waiting in
//! the provider's `accept`, holding the listening socket, until a peer comes or the
//! process ends: the providers' listeners have no way to stop a waiting `accept` from
//! another thread (an `accept` with a deadline in `ShmListener` would remove this, and
//! the thread). `connect_timeout` of shm and verbs connects
//! on a thread of its own and waits for it at most the timeout; a connection completed
//! after that is closed. On loopback nothing waits: `connect` returns at once.

mod builder;
mod error;
mod listener;
mod loopback;
mod shm;
#[cfg(feature = "verbs")]
mod verbs;

use std::fmt;

use tierbuf_pool::{MemlockPolicy, MemoryBudget};
use tierbuf_tiers::ladder::TierLadder;

use crate::connection::Connection;
use crate::provider::{Endpoint, Provider};

pub use builder::{Transport, TransportBuilder};
pub use error::SetupError;
pub use listener::{
    ACCEPT_BACKLOG, Listener, MAX_HANDSHAKES, MAX_HANDSHAKES_PER_HOST, MAX_WAITING_PER_HOST,
};
pub use loopback::Loopback;
pub use shm::Shm;
#[cfg(feature = "verbs")]
pub use verbs::Verbs;

/// A connection the front door of provider kind `K` returns.
pub type ConnectionOf<K> = Connection<<K as Kind>::Endpoint>;

/// A provider the front door serves: [`Loopback`], [`Shm`] or `Verbs` (feature
/// `verbs`). Sealed: the hidden methods are the front door's glue for each provider.
pub trait Kind: sealed::Sealed + fmt::Debug + Send + Sync + Sized + 'static {
    /// The provider's endpoint, which its connections run over.
    type Endpoint: Endpoint + 'static;
    /// The provider.
    type Provider: Provider<Endpoint = Self::Endpoint> + 'static;

    /// The provider's name.
    #[doc(hidden)]
    const NAME: &'static str;

    /// Whether `RLIMIT_MEMLOCK` bounds the budget made from the system's limits: only a
    /// provider that pins its memory is bound by it.
    #[doc(hidden)]
    const MEMLOCK: MemlockPolicy;

    /// The deepest send and receive queues the provider's endpoints take.
    #[doc(hidden)]
    fn max_depth(&self) -> u32;

    /// The deepest queues `provider`'s endpoints take once it is open: less than
    /// [`Kind::max_depth`] where its device says so.
    #[doc(hidden)]
    fn opened_max_depth(&self, _provider: &Self::Provider) -> u32 {
        self.max_depth()
    }

    /// Opens the provider, charging what it registers to `budget`.
    #[doc(hidden)]
    fn open(&self, budget: &MemoryBudget) -> Result<Self::Provider, SetupError>;

    /// What one connection holds open (files per connection, what they are) and the
    /// files the process needs besides; `None` for a provider that opens no file per
    /// connection.
    #[doc(hidden)]
    fn open_files(&self) -> Option<OpenFiles>;

    /// Checks a limit of the provider's own for `connections` connections on `ladder`.
    #[doc(hidden)]
    fn check_connections(
        &self,
        _ladder: &TierLadder,
        _connections: usize,
    ) -> Result<(), SetupError> {
        Ok(())
    }
}

/// The open files a provider's connections hold.
#[doc(hidden)]
#[derive(Debug)]
pub struct OpenFiles {
    per_connection: u64,
    holding: &'static str,
    others: u64,
}

mod sealed {
    /// Only the front door's provider kinds are [`Kind`](super::Kind)s.
    pub trait Sealed {}
}
