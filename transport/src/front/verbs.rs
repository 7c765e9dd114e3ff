//! The front door's verbs glue: addresses are the TCP addresses the two sides exchange
//! their queue pairs over.

use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, TcpStream, ToSocketAddrs};
use std::sync::Arc;
use std::time::Duration;

use tierbuf_pool::{MemlockPolicy, MemoryBudget};
use tierbuf_tiers::ladder::TierLadder;

use super::builder::{Shared, Transport, TransportBuilder};
use super::error::SetupError;
use super::listener::{Acceptor, Arrival, Incoming, Listener, connect_within};
use super::{ConnectionOf, Kind, OpenFiles, sealed};
use crate::verbs::{
    EndpointOptions, MAX_QUEUE_DEPTH, MemlockFacts, VerbsConfig, VerbsEndpoint, VerbsError,
    VerbsProvider, check_memlock, ladder_pinned_bytes,
};

/// The verbs provider as a front-door [`Kind`]: connections between machines with RDMA
/// devices; a listener's address is the TCP address of the queue-pair exchange.
#[derive(Debug)]
pub struct Verbs {
    config: VerbsConfig,
}

impl sealed::Sealed for Verbs {}

impl Kind for Verbs {
    type Endpoint = VerbsEndpoint;
    type Provider = VerbsProvider;
    const NAME: &'static str = "verbs";
    // The provider pins what it registers.
    const MEMLOCK: MemlockPolicy = MemlockPolicy::Auto;

    fn max_depth(&self) -> u32 {
        MAX_QUEUE_DEPTH
    }

    fn opened_max_depth(&self, provider: &VerbsProvider) -> u32 {
        provider.max_queue_depth()
    }

    fn open(&self, budget: &MemoryBudget) -> Result<VerbsProvider, SetupError> {
        VerbsProvider::open(&self.config, budget.clone()).map_err(verbs("opening the device"))
    }

    fn open_files(&self) -> Option<OpenFiles> {
        // Per connection its handshake socket, its completion channel and the epoll set
        // of the two that a sleeper waits on; besides, the standard streams, the device,
        // listeners, and room to spare.
        Some(OpenFiles::new(
            3,
            "a socket, a completion channel and an epoll set per connection",
            64,
        ))
    }

    fn check_connections(&self, ladder: &TierLadder, connections: usize) -> Result<(), SetupError> {
        let required = ladder_pinned_bytes(ladder, connections, tierbuf_pool::page_size());
        check_memlock(required, MemlockFacts::current()).map_err(verbs(
            "checking RLIMIT_MEMLOCK for the connections expected",
        ))
    }
}

impl Transport<Verbs> {
    /// A builder for a transport over the RDMA device `config` names.
    pub fn verbs(config: VerbsConfig) -> TransportBuilder<Verbs> {
        TransportBuilder::new(Verbs { config })
    }

    /// Listens for the queue-pair exchange at `addr` (port 0 picks one:
    /// [`Listener::address`] says which).
    ///
    /// # Errors
    ///
    /// [`SetupError::Verbs`] when the address cannot be listened at.
    pub fn listen(&self, addr: impl ToSocketAddrs) -> Result<Listener<Verbs>, SetupError> {
        let listener = self
            .shared
            .provider
            .listen(addr, options(&self.shared, None))
            .map_err(verbs("listening"))?;
        let local = listener.local_addr().map_err(verbs("listening"))?;
        let address = local.to_string();
        let (incoming, acceptor) = Acceptor::start::<Verbs>(
            &address,
            // Each handshake runs apart: a peer that stalls in one holds up no other.
            move || match listener.accept_peer() {
                Ok(peer) => Arrival::Handshake {
                    // A peer whose address cannot be read counts against no host.
                    host: peer.peer_addr().ok().map(|addr| addr.ip()),
                    run: Box::new(move || peer.complete().map_err(verbs("accepting a connection"))),
                },
                Err(error) => Arrival::Ready(Err(verbs("accepting a connection")(error))),
            },
            move || knock(local),
        )?;
        Ok(Listener::new(
            Arc::clone(&self.shared),
            address,
            incoming,
            Box::new(acceptor),
        ))
    }

    /// Connects to the listener at `addr`; each step of the exchange waits at most the
    /// provider's handshake timeout (ten seconds).
    ///
    /// # Errors
    ///
    /// [`SetupError::Verbs`] when the exchange or the queue pair's setup fails;
    /// [`SetupError::Config`] or [`SetupError::Connection`] when the connection over the
    /// endpoint could not start.
    pub fn connect(&self, addr: SocketAddr) -> Result<ConnectionOf<Verbs>, SetupError> {
        let endpoint = connect_endpoint(&self.shared, addr, None)?;
        self.shared.connection(endpoint)
    }

    /// `connect`, waiting at most `timeout` for the listener's side
    /// ([`SetupError::TimedOut`] then).
    pub fn connect_timeout(
        &self,
        addr: SocketAddr,
        timeout: Duration,
    ) -> Result<ConnectionOf<Verbs>, SetupError> {
        let shared = Arc::clone(&self.shared);
        let endpoint = connect_within::<Verbs>(timeout, move || {
            connect_endpoint(&shared, addr, Some(timeout))
        })?;
        self.shared.connection(endpoint)
    }
}

/// The endpoint options of every connection: the ladder's queue depth each way, and
/// `timeout` for each step of the exchange where one is given.
fn options(shared: &Shared<Verbs>, timeout: Option<Duration>) -> EndpointOptions {
    let defaults = EndpointOptions::default();
    EndpointOptions {
        send_depth: shared.depth(),
        recv_depth: shared.depth(),
        handshake_timeout: timeout.unwrap_or(defaults.handshake_timeout),
        ..defaults
    }
}

/// An endpoint connected to the listener at `addr`.
fn connect_endpoint(
    shared: &Shared<Verbs>,
    addr: SocketAddr,
    timeout: Option<Duration>,
) -> Incoming<Verbs> {
    shared
        .provider
        .connect(addr, &options(shared, timeout))
        .map_err(verbs("connecting"))
}

/// The error of a verbs call made while doing `operation`.
fn verbs(operation: &'static str) -> impl FnOnce(VerbsError) -> SetupError {
    move |source| SetupError::Verbs {
        operation,
        source: Box::new(source),
    }
}

/// Connects to the listener at `local` and hangs up at once: its accepting thread wakes
/// and finds a peer gone before its hello. False when it could not connect.
fn knock(local: SocketAddr) -> bool {
    let mut target = local;
    if target.ip().is_unspecified() {
        target.set_ip(match local {
            SocketAddr::V4(_) => Ipv4Addr::LOCALHOST.into(),
            SocketAddr::V6(_) => Ipv6Addr::LOCALHOST.into(),
        });
    }
    TcpStream::connect_timeout(&target, Duration::from_secs(1)).is_ok()
}
