//! The front door's shm glue: addresses are Unix-domain socket paths.

use std::io::ErrorKind;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use rustix::net::{AddressFamily, SocketAddrUnix, SocketFlags, SocketType};
use tierbuf_pool::{MemlockPolicy, MemoryBudget};

use super::builder::{Shared, Transport, TransportBuilder};
use super::error::SetupError;
use super::listener::{Acceptor, Arrival, Incoming, Listener, connect_within};
use super::{ConnectionOf, Kind, OpenFiles, sealed};
use crate::error::TransportError;
use crate::shm::{PeerMappingLimit, RING_CAPACITY, ShmEndpoint, ShmProvider};

/// The shared-memory provider as a front-door [`Kind`]: connections between processes
/// of one host; a listener's address is the path of a Unix-domain socket.
#[derive(Debug)]
pub struct Shm {
    peer_timeout: Option<Duration>,
    peer_mapping_limit: PeerMappingLimit,
    peer_mapping_total: PeerMappingLimit,
}

impl sealed::Sealed for Shm {}

impl Kind for Shm {
    type Endpoint = ShmEndpoint;
    type Provider = ShmProvider;
    const NAME: &'static str = "shm";
    const MEMLOCK: MemlockPolicy = MemlockPolicy::Ignore;

    fn max_depth(&self) -> u32 {
        // Send queues go deeper; receive queues are bounded by a direction's ring.
        RING_CAPACITY as u32
    }

    fn open(&self, budget: &MemoryBudget) -> Result<ShmProvider, SetupError> {
        let provider = ShmProvider::new(budget.clone())
            .with_peer_mapping_limit(self.peer_mapping_limit)
            .with_peer_mapping_total(self.peer_mapping_total);
        Ok(match self.peer_timeout {
            Some(timeout) => provider.with_peer_timeout(timeout),
            None => provider,
        })
    }

    fn open_files(&self) -> Option<OpenFiles> {
        // A socket per connection: a region's memory file is open only while it is
        // passed to the peer. Besides, the standard streams, the listener, the files
        // being passed, and room to spare.
        Some(OpenFiles::new(1, "a socket per connection", 64))
    }
}

impl TransportBuilder<Shm> {
    /// How long endpoints and listeners wait for what only their peer can do
    /// ([`ShmProvider::with_peer_timeout`]).
    pub fn peer_timeout(mut self, timeout: Duration) -> TransportBuilder<Shm> {
        self.kind_mut().peer_timeout = Some(timeout);
        self
    }

    /// How much of its peer's memory each connection maps at once
    /// ([`ShmProvider::with_peer_mapping_limit`]; [`PeerMappingLimit::DEFAULT`] unless
    /// set).
    pub fn peer_mapping_limit(mut self, limit: PeerMappingLimit) -> TransportBuilder<Shm> {
        self.kind_mut().peer_mapping_limit = limit;
        self
    }

    /// How much of their peers' memory all the transport's connections map together
    /// ([`ShmProvider::with_peer_mapping_total`]; [`PeerMappingLimit::DEFAULT_TOTAL`]
    /// unless set).
    ///
    /// ```
    /// use tierbuf_transport::{PeerMappingLimit, Transport};
    /// let path = std::env::temp_dir().join(format!("tierbuf-total-{}.sock", std::process::id()));
    /// let node = Transport::shm()
    ///     .budget_bytes(64 << 20)
    ///     .peer_mapping_limit(PeerMappingLimit::new(8, 1 << 30))
    ///     .peer_mapping_total(PeerMappingLimit::new(1024, 64 << 30))
    ///     .build()?;
    /// let listener = node.listen(&path)?;
    /// let mut client = node.connect(&path)?;
    /// let mut server = listener.accept()?;
    /// client.send(b"within the limits")?;
    /// assert_eq!(&server.recv()?[..], b"within the limits");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn peer_mapping_total(mut self, total: PeerMappingLimit) -> TransportBuilder<Shm> {
        self.kind_mut().peer_mapping_total = total;
        self
    }
}

impl Transport<Shm> {
    /// A builder for a transport over the [`ShmProvider`]: to another process of this
    /// host, or to this one.
    pub fn shm() -> TransportBuilder<Shm> {
        TransportBuilder::new(Shm {
            peer_timeout: None,
            peer_mapping_limit: PeerMappingLimit::DEFAULT,
            peer_mapping_total: PeerMappingLimit::DEFAULT_TOTAL,
        })
    }

    /// Listens on a Unix-domain socket at `path`, which must not exist yet; the listener
    /// removes it when dropped.
    ///
    /// ```
    /// use tierbuf_transport::Transport;
    /// let path = std::env::temp_dir().join(format!("tierbuf-front-{}.sock", std::process::id()));
    /// let node = Transport::shm().budget_bytes(64 << 20).build()?;
    /// let listener = node.listen(&path)?;
    /// let mut client = node.connect(&path)?;
    /// let mut server = listener.accept()?;
    /// server.send(b"pong")?;
    /// assert_eq!(&client.recv()?[..], b"pong");
    /// drop(listener);
    /// assert!(!path.exists());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`SetupError::AddressInUse`] when something exists at `path` already;
    /// [`SetupError::Provider`] when the socket cannot be bound or listen otherwise.
    pub fn listen(&self, path: impl AsRef<Path>) -> Result<Listener<Shm>, SetupError> {
        let path = path.as_ref().to_path_buf();
        let listener = self
            .shared
            .provider
            .listen(&path)
            .map_err(|source| match &source {
                TransportError::Provider { source: io, .. }
                    if io.kind() == ErrorKind::AddrInUse =>
                {
                    SetupError::AddressInUse {
                        address: path.display().to_string(),
                    }
                }
                _ => SetupError::Provider {
                    provider: Shm::NAME,
                    operation: "listening",
                    source,
                },
            })?;
        let depth = self.shared.depth();
        let address = path.display().to_string();
        let (incoming, acceptor) = Acceptor::start::<Shm>(
            &address,
            // The shm handshake ends within `accept`: nothing is left to run apart.
            move || {
                Arrival::Ready(listener.accept(depth, depth).map_err(|source| {
                    SetupError::Provider {
                        provider: Shm::NAME,
                        operation: "accepting a connection",
                        source,
                    }
                }))
            },
            move || knock(&path),
        )?;
        Ok(Listener::new(
            Arc::clone(&self.shared),
            address,
            incoming,
            Box::new(acceptor),
        ))
    }

    /// Connects to the listener at `path`. It waits for the listener's side of the
    /// handshake, at most the provider's peer timeout (five seconds unless
    /// [`TransportBuilder::peer_timeout`] says otherwise) for each step.
    ///
    /// # Errors
    ///
    /// [`SetupError::NoListener`] when nothing listens at `path`;
    /// [`SetupError::Provider`] when the handshake fails; [`SetupError::Config`] or
    /// [`SetupError::Connection`] when the connection over the endpoint could not start.
    pub fn connect(&self, path: impl AsRef<Path>) -> Result<ConnectionOf<Shm>, SetupError> {
        let endpoint = connect_endpoint(&self.shared, path.as_ref())?;
        self.shared.connection(endpoint)
    }

    /// `connect`, waiting at most `timeout` for the listener's side
    /// ([`SetupError::TimedOut`] then).
    pub fn connect_timeout(
        &self,
        path: impl AsRef<Path>,
        timeout: Duration,
    ) -> Result<ConnectionOf<Shm>, SetupError> {
        let shared = Arc::clone(&self.shared);
        let path = path.as_ref().to_path_buf();
        let endpoint = connect_within::<Shm>(timeout, move || connect_endpoint(&shared, &path))?;
        self.shared.connection(endpoint)
    }
}

/// An endpoint connected to the listener at `path`.
fn connect_endpoint(shared: &Shared<Shm>, path: &Path) -> Incoming<Shm> {
    let depth = shared.depth();
    shared
        .provider
        .connect(path, depth, depth)
        .map_err(|source| match &source {
            TransportError::Provider { source: io, .. }
                if matches!(
                    io.kind(),
                    ErrorKind::NotFound | ErrorKind::ConnectionRefused
                ) =>
            {
                SetupError::NoListener {
                    address: path.display().to_string(),
                    source: Some(source),
                }
            }
            _ => SetupError::Provider {
                provider: Shm::NAME,
                operation: "connecting",
                source,
            },
        })
}

/// Connects to the socket at `path` and hangs up at once: a listener's accepting thread
/// wakes and finds a peer gone before its hello. False when the path no longer leads to
/// the listener (removed by someone else, as the demo removes its run directory once
/// connected): then nothing can wake the thread.
fn knock(path: &Path) -> bool {
    let Ok(socket) = rustix::net::socket_with(
        AddressFamily::UNIX,
        SocketType::SEQPACKET,
        SocketFlags::CLOEXEC | SocketFlags::NONBLOCK,
        None,
    ) else {
        return false;
    };
    let Ok(address) = SocketAddrUnix::new(path) else {
        return false;
    };
    match rustix::net::connect(&socket, &address) {
        // A full backlog: the thread has peers to take, and stops after the next one.
        Ok(()) | Err(rustix::io::Errno::AGAIN) => true,
        Err(_) => false,
    }
}
