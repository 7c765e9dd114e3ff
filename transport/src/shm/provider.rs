//! [`ShmProvider`], its registrar and listener, and the connection handshake.
//!
//! # Invariants
//!
//! - The connecting side creates the segment and sends it in its hello; the accepting
//!   side maps it only after checking its length and seals, and uses it only after
//!   checking its stamp. Either side fails the handshake with a
//!   [`TransportError::Handshake`] that says what the peer did wrong; the accepting side
//!   tells the connecting side why with a refusal first.
//! - Side 0 is the connecting side, side 1 the accepting side (the segment's directions
//!   are indexed by the side that sends).
//! - A listener is never held by one client: [`ShmListener::accept`] takes every
//!   connection the kernel has queued, answers the first client whose hello has come, and
//!   waits (in `poll(2)`, on the listening socket and every client not yet heard) for the
//!   next hello, connection or deadline; a client silent for the peer timeout is refused
//!   on its own. Clients not yet heard wait in the listener between calls.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use rustix::net::{AddressFamily, SocketAddrUnix, SocketFlags, SocketType};
use tierbuf_pool::{HostRegistrar, MemoryBudget, PoolError, Region, Registrar, SharedHostRegion};

use super::bootstrap::{
    FileMapping, Incoming, MapError, Record, Refusal, SOCKET_TIMEOUT, SocketError, receive_record,
    send_record,
};
use super::endpoint::{MAX_GATHER, MappedSegment, ShmEndpoint};
use super::limits::{MappingCharge, MappingLedger, PeerBounds, PeerMappingLimit};
use super::segment::{RING_CAPACITY, SharedSegment};
use crate::connection::readiness::UnheardPeers;
use crate::error::{QueueKind, TransportError};
use crate::provider::{EndpointLimits, Provider};
use crate::registry::{RegionCache, RegionTable};

/// The deepest send queue of a shared-memory endpoint (receive queues are bounded by
/// [`RING_CAPACITY`]).
const MAX_SEND_DEPTH: u32 = 1 << 16;

/// The shared-memory provider: registered shared memory and connections to another
/// process through a Unix-domain socket.
///
/// ```
/// use tierbuf_pool::{MemoryBudget, SlotPool};
/// use tierbuf_transport::{BufferRef, Completion, Endpoint, Provider, ShmProvider};
/// let provider = ShmProvider::new(MemoryBudget::with_cap(1 << 20));
/// let pool = SlotPool::new(&*provider.registrar(), 256, 2)?;
/// // Two endpoints in one process; across processes use `listen` and `connect`.
/// let (mut client, mut server) = provider.pair(4, 4)?;
/// let mut request = pool.try_acquire_owned().unwrap();
/// let inbox = pool.try_acquire_owned().unwrap();
/// request[..4].copy_from_slice(b"ping");
/// // SAFETY: neither slot is touched again until its completion is polled.
/// unsafe {
///     server.post_recv(BufferRef::from(&inbox), 1)?;
///     client.post_send(&[BufferRef::from(&request).prefix(4).unwrap()], 2)?;
/// }
/// let mut completions = [Completion::default(); 4];
/// assert_eq!(server.poll(&mut completions)?, 1);
/// assert_eq!((completions[0].wr_id, completions[0].byte_len), (1, 4));
/// assert_eq!(&inbox[..4], b"ping");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug)]
pub struct ShmProvider {
    registrar: Arc<ShmRegistrar>,
    peer: PeerBounds,
}

/// The shared-memory provider's registrar: sealed memory files from a
/// [`HostRegistrar`], recorded by remote key so that endpoints can check every buffer
/// and hand the memory file to the peer.
///
/// ```
/// use tierbuf_pool::{MemoryBudget, Registrar};
/// use tierbuf_transport::{Provider, ShmProvider};
/// let provider = ShmProvider::new(MemoryBudget::with_cap(1 << 20));
/// let region = provider.registrar().register(8192, 4096)?;
/// assert_eq!(region.keys().remote_addr, region.base().as_ptr() as u64);
/// assert_eq!(provider.registrar().budget().in_use(), 8192);
/// # Ok::<(), tierbuf_pool::PoolError>(())
/// ```
#[derive(Debug)]
pub struct ShmRegistrar {
    host: HostRegistrar,
    table: Arc<RegionTable<SharedHostRegion>>,
}

impl Registrar for ShmRegistrar {
    fn register(&self, len: usize, align: usize) -> Result<Box<dyn Region>, PoolError> {
        let region = self.host.register_shared(len, align)?;
        Ok(Box::new(self.table.add(region)))
    }

    fn budget(&self) -> &MemoryBudget {
        self.host.budget()
    }
}

impl ShmProvider {
    /// How long an endpoint waits, unless told otherwise
    /// ([`ShmProvider::with_peer_timeout`]), for what only its peer can do: finish a copy
    /// it started into this side's buffers (before a close or a flush can give them
    /// back), say its hello to a listener. An honest peer does each in microseconds (a copy of the largest slot in
    /// milliseconds), so five seconds only runs out for a peer that stopped, or holds
    /// this side hostage; then the endpoint fails with [`TransportError::PeerStalled`],
    /// and a close or a drop returns.
    pub const DEFAULT_PEER_TIMEOUT: Duration = Duration::from_secs(5);

    /// A provider registering unpinned shared memory charged to `budget`.
    pub fn new(budget: MemoryBudget) -> ShmProvider {
        ShmProvider::with_host_registrar(HostRegistrar::new(budget))
    }

    /// A provider registering shared memory through `host` (to pin it, or to ask for
    /// huge pages).
    ///
    /// ```
    /// use tierbuf_pool::{HostRegistrar, MemoryBudget};
    /// use tierbuf_transport::{Provider, ShmProvider};
    /// let host = HostRegistrar::new(MemoryBudget::with_cap(1 << 20)).lock_memory(false);
    /// let provider = ShmProvider::with_host_registrar(host);
    /// assert_eq!(provider.registrar().budget().cap(), 1 << 20);
    /// ```
    pub fn with_host_registrar(host: HostRegistrar) -> ShmProvider {
        ShmProvider {
            registrar: Arc::new(ShmRegistrar {
                host,
                table: Arc::new(RegionTable::new()),
            }),
            peer: PeerBounds {
                timeout: ShmProvider::DEFAULT_PEER_TIMEOUT,
                mapping: PeerMappingLimit::DEFAULT,
                total: MappingLedger::new(PeerMappingLimit::DEFAULT_TOTAL),
            },
        }
    }

    /// Sets how long the endpoints and listeners made from now on wait for what only
    /// their peer can do ([`ShmProvider::DEFAULT_PEER_TIMEOUT`] says what, and why five
    /// seconds by default). A zero timeout is taken as one millisecond.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tierbuf_pool::MemoryBudget;
    /// use tierbuf_transport::ShmProvider;
    /// let provider = ShmProvider::new(MemoryBudget::with_cap(1 << 20));
    /// assert_eq!(provider.peer_timeout(), ShmProvider::DEFAULT_PEER_TIMEOUT);
    /// let provider = provider.with_peer_timeout(Duration::from_millis(500));
    /// assert_eq!(provider.peer_timeout(), Duration::from_millis(500));
    /// ```
    pub fn with_peer_timeout(mut self, timeout: Duration) -> ShmProvider {
        self.peer.timeout = timeout.max(Duration::from_millis(1));
        self
    }

    /// How long endpoints and listeners wait for what only their peer can do.
    pub fn peer_timeout(&self) -> Duration {
        self.peer.timeout
    }

    /// The provider with `limit` on how much of its peer's memory each endpoint maps at
    /// once ([`PeerMappingLimit::DEFAULT`] unless set): a peer that announces regions
    /// past it breaks its connection with
    /// [`TransportError::ProtocolViolation`](crate::TransportError), and nothing of them
    /// is mapped.
    ///
    /// ```
    /// use tierbuf_pool::MemoryBudget;
    /// use tierbuf_transport::{PeerMappingLimit, ShmProvider};
    /// let provider = ShmProvider::new(MemoryBudget::with_cap(1 << 20));
    /// assert_eq!(provider.peer_mapping_limit(), PeerMappingLimit::DEFAULT);
    /// let limit = PeerMappingLimit::new(16, 1 << 30);
    /// assert_eq!(provider.with_peer_mapping_limit(limit).peer_mapping_limit(), limit);
    /// ```
    pub fn with_peer_mapping_limit(mut self, limit: PeerMappingLimit) -> ShmProvider {
        self.peer.mapping = limit;
        self
    }

    /// How much of its peer's memory each endpoint maps at once.
    pub fn peer_mapping_limit(&self) -> PeerMappingLimit {
        self.peer.mapping
    }

    /// The provider with `total` on how much of their peers' memory all the endpoints
    /// made from now on (by [`ShmProvider::pair`], [`ShmProvider::connect`] and the
    /// listeners it makes) map together ([`PeerMappingLimit::DEFAULT_TOTAL`] unless set),
    /// so that many connections, each within its own
    /// [limit](ShmProvider::with_peer_mapping_limit), cannot take this process's mappings
    /// or address space together. What counts: every region a peer announced and this
    /// side mapped, and on the accepting side of each connection (a listener's, or the
    /// second of a [pair](ShmProvider::pair)) the connection segment, whose memory file
    /// the connecting peer made. An announcement past it fails its connection with
    /// [`TransportError::LocalResource`] (this process's resource, not that peer's
    /// fault), and a connection past it is refused with the same error, telling the
    /// connecting side why; nothing of either is mapped. The endpoints made before keep
    /// the total they were made with.
    ///
    /// ```
    /// use tierbuf_pool::MemoryBudget;
    /// use tierbuf_transport::{PeerMappingLimit, ShmProvider};
    /// let provider = ShmProvider::new(MemoryBudget::with_cap(1 << 20));
    /// assert_eq!(provider.peer_mapping_total(), PeerMappingLimit::DEFAULT_TOTAL);
    /// let total = PeerMappingLimit::new(4096, 1 << 40);
    /// let provider = provider.with_peer_mapping_total(total);
    /// assert_eq!(provider.peer_mapping_total(), total);
    /// assert_eq!(provider.peer_regions_mapped(), (0, 0));
    /// ```
    pub fn with_peer_mapping_total(mut self, total: PeerMappingLimit) -> ShmProvider {
        self.peer.total = MappingLedger::new(total);
        self
    }

    /// How much of their peers' memory the endpoints made from now on map together.
    pub fn peer_mapping_total(&self) -> PeerMappingLimit {
        self.peer.total.limit()
    }

    /// The mappings of their peers' memory (regions, and accepted connections' segments)
    /// that the endpoints counted in [`ShmProvider::peer_mapping_total`] hold now, and
    /// their bytes.
    pub fn peer_regions_mapped(&self) -> (usize, u64) {
        self.peer.total.in_use()
    }

    /// Listens for connections on a Unix-domain socket at `path`, which must not exist
    /// yet; the listener removes it when dropped. `path` appears only once the socket
    /// listens, so a client that waits for the file to exist is not refused.
    ///
    /// ```
    /// use tierbuf_pool::MemoryBudget;
    /// use tierbuf_transport::ShmProvider;
    /// let path = std::env::temp_dir().join(format!("tierbuf-doc-{}.sock", std::process::id()));
    /// let provider = ShmProvider::new(MemoryBudget::with_cap(1 << 20));
    /// let listener = provider.listen(&path)?;
    /// assert_eq!(listener.path(), path);
    /// drop(listener);
    /// assert!(!path.exists());
    /// # Ok::<(), tierbuf_transport::TransportError>(())
    /// ```
    pub fn listen(&self, path: impl AsRef<Path>) -> Result<ShmListener, TransportError> {
        let path = path.as_ref().to_path_buf();
        let socket = rustix::net::socket_with(
            AddressFamily::UNIX,
            SocketType::SEQPACKET,
            SocketFlags::CLOEXEC | SocketFlags::NONBLOCK,
            None,
        )
        .map_err(os_error("creating a socket"))?;
        listen_at(&socket, &path)?;
        Ok(ShmListener {
            socket,
            path,
            registrar: Arc::clone(&self.registrar),
            peer: self.peer.clone(),
            unheard: Mutex::new(UnheardPeers::new()),
        })
    }

    /// Connects to the listener at `path`: an endpoint with `send_depth` sends (at most
    /// 65 536) and `recv_depth` receives (at most [`RING_CAPACITY`]) outstanding.
    pub fn connect(
        &self,
        path: impl AsRef<Path>,
        send_depth: u32,
        recv_depth: u32,
    ) -> Result<ShmEndpoint, TransportError> {
        let limits = limits(send_depth, recv_depth)?;
        let socket = seqpacket_socket()?;
        let address = SocketAddrUnix::new(path.as_ref()).map_err(os_error("naming the socket"))?;
        rustix::net::connect(&socket, &address).map_err(os_error("connecting"))?;
        set_timeouts(&socket)?;
        let segment = offer(socket.as_fd(), recv_depth)?;
        let peer_depth = conclude(socket.as_fd())?;
        Ok(self.endpoint(0, socket, segment, None, limits, peer_depth))
    }

    /// Two connected endpoints in this process (over a socket pair), each with
    /// `send_depth` sends and `recv_depth` receives outstanding at most.
    ///
    /// ```
    /// use tierbuf_pool::MemoryBudget;
    /// use tierbuf_transport::{Endpoint, ShmProvider, TransportError};
    /// let provider = ShmProvider::new(MemoryBudget::with_cap(1 << 20));
    /// let (a, _b) = provider.pair(8, 32)?;
    /// assert_eq!((a.limits().send_depth, a.limits().recv_depth), (8, 32));
    /// assert!(matches!(provider.pair(8, 5000), Err(TransportError::InvalidDepth { .. })));
    /// # Ok::<(), TransportError>(())
    /// ```
    pub fn pair(
        &self,
        send_depth: u32,
        recv_depth: u32,
    ) -> Result<(ShmEndpoint, ShmEndpoint), TransportError> {
        let limits = limits(send_depth, recv_depth)?;
        let (connecting, accepting) = rustix::net::socketpair(
            AddressFamily::UNIX,
            SocketType::SEQPACKET,
            SocketFlags::CLOEXEC,
            None,
        )
        .map_err(os_error("creating a socket pair"))?;
        set_timeouts(&connecting)?;
        set_timeouts(&accepting)?;
        let offered = offer(connecting.as_fd(), recv_depth)?;
        let hello = receive_record(accepting.as_fd(), true);
        let (accepted, charge, connecting_depth) =
            answer(accepting.as_fd(), hello, recv_depth, &self.peer.total)?;
        let accepting_depth = conclude(connecting.as_fd())?;
        Ok((
            self.endpoint(0, connecting, offered, None, limits, accepting_depth),
            self.endpoint(
                1,
                accepting,
                accepted,
                Some(charge),
                limits,
                connecting_depth,
            ),
        ))
    }

    fn endpoint(
        &self,
        side: usize,
        socket: OwnedFd,
        mapping: FileMapping,
        charge: Option<MappingCharge>,
        limits: EndpointLimits,
        peer_recv_depth: u32,
    ) -> ShmEndpoint {
        let local = RegionCache::new(Arc::clone(&self.registrar.table));
        ShmEndpoint::new(
            side,
            socket,
            MappedSegment {
                mapping,
                _charge: charge,
            },
            limits,
            peer_recv_depth,
            local,
            self.peer.clone(),
        )
    }
}

impl Provider for ShmProvider {
    type Endpoint = ShmEndpoint;

    fn name(&self) -> &'static str {
        "shm"
    }

    fn registrar(&self) -> Arc<dyn Registrar> {
        Arc::clone(&self.registrar) as Arc<dyn Registrar>
    }
}

/// A listening Unix-domain socket accepting shared-memory connections; see
/// [`ShmProvider::listen`].
#[derive(Debug)]
pub struct ShmListener {
    /// Non-blocking: [`ShmListener::accept`] waits in `poll(2)`, not in `accept(2)`.
    socket: OwnedFd,
    path: PathBuf,
    registrar: Arc<ShmRegistrar>,
    peer: PeerBounds,
    /// Clients connected and not yet heard from.
    unheard: Mutex<UnheardPeers<OwnedFd>>,
}

impl ShmListener {
    /// Where the listener listens.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Waits for the next connection and completes its handshake: an endpoint with
    /// `send_depth` sends and `recv_depth` receives outstanding at most. A peer that
    /// fails the handshake is refused and its error returned; the listener stays usable.
    ///
    /// No client holds up another: clients are answered in the order their hellos come,
    /// and one that connects and says nothing for the provider's peer timeout
    /// ([`ShmProvider::with_peer_timeout`]) is refused (its error returned by the call
    /// that finds it so) while the others go on. Calls from several threads take turns.
    pub fn accept(&self, send_depth: u32, recv_depth: u32) -> Result<ShmEndpoint, TransportError> {
        let limits = limits(send_depth, recv_depth)?;
        let mut unheard = self.unheard.lock().unwrap_or_else(PoisonError::into_inner);
        loop {
            let out_of_files = self.take_new_clients(&mut unheard)?;
            let heard = unheard.take_heard(|client| match receive_record(client.as_fd(), false) {
                Ok(Incoming::Nothing) => None,
                heard => Some(heard),
            });
            if let Some((client, heard)) = heard {
                return self.welcome(client, heard, limits);
            }
            if unheard.drop_silent(self.peer.timeout) {
                return Err(handshake_error(format!(
                    "the peer connected and sent no hello within {:?}",
                    self.peer.timeout
                )));
            }
            unheard
                .wait((!out_of_files).then_some(&self.socket), self.peer.timeout)
                .map_err(os_error("waiting for clients"))?;
        }
    }

    /// Takes every connection the kernel has queued; returns whether it stopped for want
    /// of a descriptor, with connections still queued.
    fn take_new_clients(
        &self,
        unheard: &mut UnheardPeers<OwnedFd>,
    ) -> Result<bool, TransportError> {
        loop {
            match rustix::net::accept_with(&self.socket, SocketFlags::CLOEXEC) {
                Ok(socket) => {
                    set_timeouts(&socket)?;
                    unheard.push(socket);
                }
                Err(rustix::io::Errno::AGAIN) => return Ok(false),
                // A client that went away before it was taken, or a signal: look again.
                Err(rustix::io::Errno::CONNABORTED | rustix::io::Errno::INTR) => {}
                // `accept(2)` wants a descriptor for a client before it looks for one: out
                // of them, serve the clients taken so far, and take more later.
                Err(rustix::io::Errno::MFILE | rustix::io::Errno::NFILE) if !unheard.is_empty() => {
                    return Ok(true);
                }
                Err(errno @ (rustix::io::Errno::MFILE | rustix::io::Errno::NFILE)) => {
                    return Err(TransportError::LocalResource {
                        provider: "shm",
                        operation: "accepting a connection: this process can open no more files",
                        source: errno.into(),
                    });
                }
                Err(errno) => return Err(os_error("accepting")(errno)),
            }
        }
    }

    /// Completes the handshake of a client whose socket said `heard` (its hello, its end,
    /// or an error).
    fn welcome(
        &self,
        socket: OwnedFd,
        heard: Result<Incoming, SocketError>,
        limits: EndpointLimits,
    ) -> Result<ShmEndpoint, TransportError> {
        let (mapping, charge, peer_depth) =
            answer(socket.as_fd(), heard, limits.recv_depth, &self.peer.total)?;
        let local = RegionCache::new(Arc::clone(&self.registrar.table));
        Ok(ShmEndpoint::new(
            1,
            socket,
            MappedSegment {
                mapping,
                _charge: Some(charge),
            },
            limits,
            peer_depth,
            local,
            self.peer.clone(),
        ))
    }
}

impl Drop for ShmListener {
    fn drop(&mut self) {
        // The socket file is ours; a failure to remove it leaves only a stale name.
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Binds `socket` and listens on it under a staging name beside `path`, then links the
/// socket file to `path`: `path` names a socket only once it listens, so a client that
/// sees the file can connect (bound at `path` itself, the file would refuse clients
/// between `bind` and `listen`). Where the staging name is too long for a socket
/// address, the socket is bound at `path` directly.
fn listen_at(socket: &OwnedFd, path: &Path) -> Result<(), TransportError> {
    static STAGED: AtomicU64 = AtomicU64::new(0);
    let staging = path.file_name().map(|_| {
        path.with_file_name(format!(
            ".tierbuf-{}-{}",
            std::process::id(),
            STAGED.fetch_add(1, Ordering::Relaxed)
        ))
    });
    let staged = staging.and_then(|staging| Some((SocketAddrUnix::new(&staging).ok()?, staging)));
    let Some((address, staging)) = staged else {
        let address = SocketAddrUnix::new(path).map_err(os_error("naming the socket"))?;
        rustix::net::bind(socket, &address).map_err(os_error("binding the socket"))?;
        return rustix::net::listen(socket, 128).map_err(os_error("listening"));
    };
    // The name is this process's own (its PID, and a count no other listener of it
    // takes): a file of that name is a stale one, left by a process of the same PID that
    // died between its `bind` and its link.
    let _ = std::fs::remove_file(&staging);
    rustix::net::bind(socket, &address).map_err(os_error("binding the socket"))?;
    let published = rustix::net::listen(socket, 128)
        .map_err(os_error("listening"))
        .and_then(|()| {
            std::fs::hard_link(&staging, path).map_err(|error| TransportError::Provider {
                provider: "shm",
                operation: "binding the socket",
                source: if error.kind() == std::io::ErrorKind::AlreadyExists {
                    rustix::io::Errno::ADDRINUSE.into()
                } else {
                    error
                },
            })
        });
    // The staging name served its turn (or the listen failed): only `path` stays.
    let _ = std::fs::remove_file(&staging);
    published
}

fn os_error(operation: &'static str) -> impl FnOnce(rustix::io::Errno) -> TransportError {
    move |errno| TransportError::Provider {
        provider: "shm",
        operation,
        source: errno.into(),
    }
}

fn handshake_error(detail: impl Into<String>) -> TransportError {
    TransportError::Handshake {
        provider: "shm",
        detail: detail.into(),
    }
}

fn socket_error(error: SocketError) -> TransportError {
    match error {
        SocketError::Io { operation, source } => TransportError::Provider {
            provider: "shm",
            operation,
            source,
        },
        SocketError::LocalResource { operation, source } => TransportError::LocalResource {
            provider: "shm",
            operation,
            source,
        },
        record => handshake_error(record.to_string()),
    }
}

fn limits(send_depth: u32, recv_depth: u32) -> Result<EndpointLimits, TransportError> {
    let recv_max = RING_CAPACITY as u32;
    for (queue, depth, max) in [
        (QueueKind::Send, send_depth, MAX_SEND_DEPTH),
        (QueueKind::Recv, recv_depth, recv_max),
    ] {
        if !(1..=max).contains(&depth) {
            return Err(TransportError::InvalidDepth { queue, depth, max });
        }
    }
    Ok(EndpointLimits {
        send_depth,
        recv_depth,
        max_gather: MAX_GATHER,
        max_message: u32::MAX,
    })
}

fn seqpacket_socket() -> Result<OwnedFd, TransportError> {
    rustix::net::socket_with(
        AddressFamily::UNIX,
        SocketType::SEQPACKET,
        SocketFlags::CLOEXEC,
        None,
    )
    .map_err(os_error("creating a socket"))
}

/// Bounds how long a handshake or a blocked record send waits for the peer.
fn set_timeouts(socket: &OwnedFd) -> Result<(), TransportError> {
    use rustix::net::sockopt::{Timeout, set_socket_timeout};
    for kind in [Timeout::Recv, Timeout::Send] {
        set_socket_timeout(socket, kind, Some(SOCKET_TIMEOUT))
            .map_err(os_error("setting the socket timeouts"))?;
    }
    Ok(())
}

/// The length of a segment's memory file: the segment rounded up to whole pages.
fn segment_file_len() -> usize {
    std::mem::size_of::<SharedSegment>().next_multiple_of(rustix::param::page_size())
}

/// The connecting side's opening: creates, maps and stamps the segment, and sends it.
fn offer(socket: BorrowedFd<'_>, recv_depth: u32) -> Result<FileMapping, TransportError> {
    use rustix::fs::{MemfdFlags, SealFlags};
    let len = segment_file_len();
    let file = rustix::fs::memfd_create(
        "tierbuf-connection",
        MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING,
    )
    .map_err(os_error("creating the connection segment"))?;
    rustix::fs::ftruncate(&file, len as u64).map_err(os_error("sizing the connection segment"))?;
    rustix::fs::fcntl_add_seals(&file, SealFlags::SHRINK | SealFlags::GROW | SealFlags::SEAL)
        .map_err(os_error("sealing the connection segment"))?;
    let mapping = FileMapping::map(&file, len as u64).map_err(|error| match error {
        MapError::Refused { operation, source } => TransportError::LocalResource {
            provider: "shm",
            operation,
            source,
        },
        MapError::NotAsSaid(reason) => {
            handshake_error(format!("mapping the new segment: {reason}"))
        }
    })?;
    segment_of(&mapping).stamp();
    let hello = Record::Hello {
        recv_depth,
        pid: std::process::id(),
    };
    send_record(socket, hello, Some(file.as_fd())).map_err(socket_error)?;
    Ok(mapping)
}

/// The accepting side's part: checks `hello`, what the peer's socket said first, and the
/// segment it carries, and welcomes or refuses. The peer's segment is mapped within
/// `total`, the provider's ledger of its peers' memory mapped (`limits.rs`): a connection
/// past it is refused, as this process's resource exhausted. Returns the segment, its
/// charge and the peer's receive depth.
fn answer(
    socket: BorrowedFd<'_>,
    hello: Result<Incoming, SocketError>,
    recv_depth: u32,
    total: &Arc<MappingLedger>,
) -> Result<(FileMapping, MappingCharge, u32), TransportError> {
    let received = match hello.map_err(socket_error)? {
        Incoming::Record(received) => received,
        Incoming::Nothing | Incoming::Closed => {
            return Err(handshake_error(
                "the peer closed the socket before its hello",
            ));
        }
    };
    let (
        Record::Hello {
            recv_depth: peer_depth,
            ..
        },
        Some(file),
    ) = (received.record, received.descriptor)
    else {
        return Err(handshake_error(format!(
            "expected a hello, received {:?}",
            received.record
        )));
    };
    let refuse = |refusal: Refusal| {
        // The refusal is a courtesy to the peer; the error below is what counts here.
        let _ = send_record(socket, Record::Refuse(refusal), None);
        handshake_error(format!("refused the peer: {}", refusal.describe()))
    };
    if !fits_the_ring(peer_depth) {
        return Err(refuse(Refusal::BadDepth));
    }
    let charge = total.charge(segment_file_len() as u64).map_err(|reached| {
        // As above, a courtesy.
        let _ = send_record(socket, Record::Refuse(Refusal::Full), None);
        TransportError::LocalResource {
            provider: "shm",
            operation: "mapping a connecting peer's segment: this provider's endpoints \
                        map their peers' memory up to a total",
            source: std::io::Error::other(reached),
        }
    })?;
    let mapping = match FileMapping::map(&file, segment_file_len() as u64) {
        Ok(mapping) if segment_of(&mapping).is_stamped() => mapping,
        Err(MapError::Refused { operation, source }) => {
            return Err(TransportError::LocalResource {
                provider: "shm",
                operation,
                source,
            });
        }
        Ok(_) | Err(MapError::NotAsSaid(_)) => return Err(refuse(Refusal::BadSegment)),
    };
    let welcome = Record::Welcome {
        recv_depth,
        pid: std::process::id(),
    };
    send_record(socket, welcome, None).map_err(socket_error)?;
    Ok((mapping, charge, peer_depth))
}

/// The connecting side's last step: waits for the welcome, and returns the peer's receive
/// depth.
fn conclude(socket: BorrowedFd<'_>) -> Result<u32, TransportError> {
    match receive_record(socket, true).map_err(socket_error)? {
        Incoming::Record(received) => match received.record {
            Record::Welcome { recv_depth, .. } if fits_the_ring(recv_depth) => Ok(recv_depth),
            Record::Welcome { recv_depth, .. } => Err(handshake_error(format!(
                "the listener's receive depth {recv_depth} is outside 1..=RING_CAPACITY"
            ))),
            Record::Refuse(refusal) => Err(handshake_error(format!(
                "the listener refused: {}",
                refusal.describe()
            ))),
            other => Err(handshake_error(format!(
                "expected a welcome, received {other:?}"
            ))),
        },
        Incoming::Nothing | Incoming::Closed => Err(handshake_error(
            "the listener closed the socket before its welcome",
        )),
    }
}

/// Whether a peer's receive depth is one a direction's ring can hold.
fn fits_the_ring(depth: u32) -> bool {
    (1..=RING_CAPACITY as u32).contains(&depth)
}

/// The segment a mapping of [`segment_file_len`] bytes holds.
fn segment_of(mapping: &FileMapping) -> &SharedSegment {
    // SAFETY: the mapping is page-aligned and at least `size_of::<SharedSegment>()`
    // long, and lives as long as the borrow; every field is an atomic integer, valid for
    // any bit pattern (a fresh file is all zeroes, an empty segment).
    unsafe { mapping.base().cast::<SharedSegment>().as_ref() }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A listener that welcomes with a receive depth past the ring is refused by the
    /// connecting side, which would otherwise size its sending ring from it.
    #[test]
    fn a_welcome_with_a_depth_past_the_ring_is_refused() {
        for bad_depth in [0, RING_CAPACITY as u32 + 1] {
            let (connecting, listening) = rustix::net::socketpair(
                AddressFamily::UNIX,
                SocketType::SEQPACKET,
                SocketFlags::CLOEXEC,
                None,
            )
            .expect("a socket pair");
            let listener = std::thread::spawn(move || {
                let hello = receive_record(listening.as_fd(), true).expect("the hello");
                assert!(matches!(hello, Incoming::Record(_)));
                let welcome = Record::Welcome {
                    recv_depth: bad_depth,
                    pid: std::process::id(),
                };
                send_record(listening.as_fd(), welcome, None).expect("the welcome");
            });
            let _segment = offer(connecting.as_fd(), 8).expect("the hello sent");
            let error = conclude(connecting.as_fd()).expect_err("a bad depth refused");
            assert!(
                error
                    .to_string()
                    .contains(&format!("receive depth {bad_depth}")),
                "{error}"
            );
            listener.join().expect("the listener");
        }
    }
}
