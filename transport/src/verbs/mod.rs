//! The verbs provider: InfiniBand, RoCE and iWARP hardware (or soft-RoCE) through the
//! `sideway` crate, behind the `verbs` cargo feature.
//!
//! - [`VerbsProvider::open`] opens a device by name (with a port, and a GID index for
//!   RoCE) and its protection domain; its [`VerbsRegistrar`] registers memory there, for
//!   local access only: a peer writes or reads memory one-sidedly only through an
//!   exposure (`Endpoint::expose`), a type 2 memory window bound to the connection's
//!   queue pair, or a registration of the range where the device has no such windows
//!   ([`Exposures`]).
//! - Endpoints are reliable-connected queue pairs with a completion queue per direction
//!   and a completion channel a caller can sleep on, connected over TCP:
//!   [`VerbsProvider::listen`] accepts any number of peers, [`VerbsProvider::connect`]
//!   dials one, and [`VerbsProvider::pair`] connects two on one device. The TCP part
//!   ([`rendezvous`], [`handshake`]) works without a device.
//! - [`completion_status`] maps `ibv_wc_status` values to [`CompletionStatus`](crate::CompletionStatus),
//!   and [`check_memlock`] with [`ladder_pinned_bytes`] tells whether `RLIMIT_MEMLOCK` lets
//!   a ladder's connections pin what they may need.
//!
//! `docs/verbs.md` says what the provider does not do and what that costs, and how to run
//! the device tests.
//!
//! ```no_run
//! use tierbuf_pool::{MemoryBudget, SlotPool};
//! use tierbuf_transport::{BufferRef, Completion, Endpoint, Provider};
//! use tierbuf_transport::verbs::{EndpointOptions, VerbsConfig, VerbsProvider};
//! let provider = VerbsProvider::open(&VerbsConfig::new("rxe0"), MemoryBudget::with_cap(64 << 20))?;
//! let pool = SlotPool::new(&*provider.registrar(), 4096, 4)?;
//! let (mut a, mut b) = provider.pair(&EndpointOptions::default())?;
//! let mut message = pool.try_acquire_owned().unwrap();
//! let inbox = pool.try_acquire_owned().unwrap();
//! message[..5].copy_from_slice(b"hello");
//! // SAFETY: neither slot is touched until its completion is polled.
//! unsafe {
//!     b.post_recv(BufferRef::from(&inbox), 1)?;
//!     a.post_send(&[BufferRef::from(&message).prefix(5).unwrap()], 2)?;
//! }
//! let mut completions = [Completion::default(); 4];
//! while b.poll(&mut completions)? == 0 {}
//! assert_eq!(completions[0].byte_len, 5);
//! assert_eq!(&inbox[..5], b"hello");
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod device;
mod endpoint;
mod error;
pub mod handshake;
mod memlock;
mod registrar;
pub mod rendezvous;
mod status;
mod window;

use std::fmt;
use std::net::{Ipv4Addr, SocketAddr, ToSocketAddrs};
use std::sync::Arc;

use tierbuf_pool::{MemoryBudget, Registrar};

use crate::provider::Provider;
use device::OpenDevice;
pub use device::{Exposures, GidKind, PortPath, RoutingGid};
pub use endpoint::{EndpointOptions, MAX_MESSAGE_LEN, MAX_QUEUE_DEPTH, VerbsEndpoint};
pub use error::VerbsError;
pub use memlock::{MemlockFacts, check_memlock, ladder_pinned_bytes, region_pinned_bytes};
/// The values of `verbs.h`'s `enum ibv_wc_status`, as [`DeviceFailure::device_status`]
/// holds them.
pub use rdma_mummy_sys::ibv_wc_status;
pub use registrar::VerbsRegistrar;
use rendezvous::{Rendezvous, RendezvousListener};
pub use status::{DeviceFailure, completion_status, status_name};

/// Which device and port to open, and how its queue pairs route.
///
/// ```
/// use tierbuf_transport::verbs::VerbsConfig;
/// let roce = VerbsConfig::new("mlx5_0").with_gid_index(3);
/// assert_eq!((roce.device(), roce.port()), ("mlx5_0", 1));
/// assert_eq!(roce.gid_index(), Some(3));
/// assert_eq!(VerbsConfig::new("mlx5_0").with_port(2).port(), 2);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VerbsConfig {
    device: String,
    port: u8,
    gid_index: Option<u32>,
    exposures: Exposures,
}

impl VerbsConfig {
    /// The device named `device` (as `ibv_devices` lists it). Queue pairs route by the
    /// first IPv4-mapped RoCE v2 entry of its GID table, else its first RoCE v2 entry
    /// (else RoCE v1) where it has one, as RoCE needs, and by LID on InfiniBand. Its queue
    /// pairs go out by port 1.
    pub fn new(device: impl Into<String>) -> VerbsConfig {
        VerbsConfig {
            device: device.into(),
            port: 1,
            gid_index: None,
            exposures: Exposures::Windows,
        }
    }

    /// Goes out by port `port` of the device (ports count from 1; `ibv_devinfo` lists
    /// them), for a NIC with several. A port the device does not have is refused when the
    /// provider opens ([`VerbsError::PortOutOfRange`]).
    pub fn with_port(mut self, port: u8) -> VerbsConfig {
        self.port = port;
        self
    }

    /// Routes by the GID at `gid_index` of the device's GID table (`ibv_devinfo -v`
    /// lists the table; `show_gids` names each entry's RoCE version), for example a
    /// global IPv6 RoCE v2 entry where peers reach each other by IPv6 only. Both sides of
    /// a connection must route the same way.
    pub fn with_gid_index(mut self, gid_index: u32) -> VerbsConfig {
        self.gid_index = Some(gid_index);
        self
    }

    /// Makes exposures ([`Endpoint::expose`](crate::Endpoint::expose)) as `exposures`
    /// says where the device allows: [`Exposures::Windows`], the default, falls back to
    /// [`Exposures::Registrations`] on a device without type 2 memory windows;
    /// [`Exposures::Registrations`] is taken everywhere (to compare the two, or to test
    /// the fallback on a device that has windows).
    ///
    /// ```
    /// use tierbuf_transport::verbs::{Exposures, VerbsConfig};
    /// let config = VerbsConfig::new("rxe0").with_exposures(Exposures::Registrations);
    /// assert_eq!(config.exposures(), Exposures::Registrations);
    /// assert_eq!(VerbsConfig::new("rxe0").exposures(), Exposures::Windows);
    /// ```
    pub fn with_exposures(mut self, exposures: Exposures) -> VerbsConfig {
        self.exposures = exposures;
        self
    }

    /// The device's name.
    pub fn device(&self) -> &str {
        &self.device
    }

    /// How exposures are asked to be made.
    pub fn exposures(&self) -> Exposures {
        self.exposures
    }

    /// The port the queue pairs go out by.
    pub fn port(&self) -> u8 {
        self.port
    }

    /// The GID index asked for, if any.
    pub fn gid_index(&self) -> Option<u32> {
        self.gid_index
    }
}

/// The verbs provider: one device's protection domain, the memory registered in it, and
/// the endpoints connected through it. Cloning gives another handle onto the same device.
///
/// ```no_run
/// use tierbuf_pool::MemoryBudget;
/// use tierbuf_transport::verbs::{VerbsConfig, VerbsError, VerbsProvider};
/// match VerbsProvider::open(&VerbsConfig::new("rxe0"), MemoryBudget::with_cap(64 << 20)) {
///     Ok(provider) => println!("opened {}", provider.device_name()),
///     Err(error @ VerbsError::DeviceNotFound { .. }) => eprintln!("{error}"),
///     Err(error) => return Err(error.into()),
/// }
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone)]
pub struct VerbsProvider {
    device: Arc<OpenDevice>,
    registrar: Arc<VerbsRegistrar>,
}

impl VerbsProvider {
    /// Opens the device `config` names and allocates its protection domain; memory
    /// registered through the provider is charged to `budget`.
    ///
    /// Fails with [`VerbsError::DevicesUnavailable`] where libibverbs cannot be loaded or
    /// the kernel has no RDMA support, [`VerbsError::NoDevices`] or
    /// [`VerbsError::DeviceNotFound`] (listing the devices present),
    /// [`VerbsError::PortOutOfRange`], [`VerbsError::PortDown`],
    /// [`VerbsError::GidIndexOutOfRange`], or [`VerbsError::Device`] for a failing verbs
    /// call.
    pub fn open(config: &VerbsConfig, budget: MemoryBudget) -> Result<VerbsProvider, VerbsError> {
        let device = Arc::new(OpenDevice::open(
            &config.device,
            config.port,
            config.gid_index,
            config.exposures,
        )?);
        Ok(VerbsProvider {
            registrar: Arc::new(VerbsRegistrar::new(Arc::clone(&device), budget)),
            device,
        })
    }

    /// The name of the opened device.
    pub fn device_name(&self) -> &str {
        self.device.name()
    }

    /// The device, port, GID and MTU this provider's queue pairs go out by.
    pub fn path(&self) -> &PortPath {
        self.device.path()
    }

    /// How this provider's endpoints make exposures: with type 2 memory windows where the
    /// device has them (and the configuration did not ask otherwise), else with a
    /// registration per exposure.
    pub fn exposures(&self) -> Exposures {
        self.device.exposures()
    }

    /// The deepest send or receive queue an endpoint of this provider may ask for: the
    /// least of [`MAX_QUEUE_DEPTH`] and the device's `max_qp_wr` and `max_cqe`. A deeper
    /// one is refused with [`VerbsError::DepthPastDevice`] before anything is created.
    ///
    /// ```no_run
    /// use tierbuf_pool::MemoryBudget;
    /// use tierbuf_transport::verbs::{EndpointOptions, VerbsConfig, VerbsProvider, MAX_QUEUE_DEPTH};
    /// let provider = VerbsProvider::open(&VerbsConfig::new("rxe0"), MemoryBudget::with_cap(64 << 20))?;
    /// assert!(provider.max_queue_depth() <= MAX_QUEUE_DEPTH);
    /// let options = EndpointOptions { recv_depth: provider.max_queue_depth(), ..EndpointOptions::default() };
    /// let listener = provider.listen("0.0.0.0:0", options)?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn max_queue_depth(&self) -> u32 {
        self.device.max_queue_depth().min(MAX_QUEUE_DEPTH)
    }

    /// Connects to the peer listening at `addr` ([`VerbsProvider::listen`]).
    ///
    /// ```no_run
    /// use tierbuf_pool::MemoryBudget;
    /// use tierbuf_transport::Endpoint;
    /// use tierbuf_transport::verbs::{EndpointOptions, VerbsConfig, VerbsProvider};
    /// let provider = VerbsProvider::open(&VerbsConfig::new("rxe0"), MemoryBudget::with_cap(64 << 20))?;
    /// let endpoint = provider.connect("192.0.2.7:7471".parse()?, &EndpointOptions::default())?;
    /// assert_eq!(endpoint.limits().max_gather, 1);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn connect(
        &self,
        addr: SocketAddr,
        options: &EndpointOptions,
    ) -> Result<VerbsEndpoint, VerbsError> {
        options.check(&self.device)?;
        let rendezvous = Rendezvous::connect(addr, options.handshake_timeout)?;
        VerbsEndpoint::establish(&self.device, self.registrar.table(), rendezvous, options)
    }

    /// Listens on `addr` for peers that [`connect`](VerbsProvider::connect); each accepted
    /// peer gets an endpoint made with `options`.
    ///
    /// ```no_run
    /// use tierbuf_pool::MemoryBudget;
    /// use tierbuf_transport::verbs::{EndpointOptions, VerbsConfig, VerbsProvider};
    /// let provider = VerbsProvider::open(&VerbsConfig::new("rxe0"), MemoryBudget::with_cap(64 << 20))?;
    /// let listener = provider.listen("0.0.0.0:7471", EndpointOptions::default())?;
    /// loop {
    ///     match listener.accept() {
    ///         Ok(endpoint) => println!("connected to {:?}", endpoint.peer_queue_pair()),
    ///         Err(error) => eprintln!("a peer failed to connect: {error}"),
    ///     }
    /// }
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn listen(
        &self,
        addr: impl ToSocketAddrs,
        options: EndpointOptions,
    ) -> Result<VerbsListener, VerbsError> {
        options.check(&self.device)?;
        Ok(VerbsListener {
            provider: self.clone(),
            rendezvous: RendezvousListener::bind(addr, options.handshake_timeout)?,
            options,
        })
    }

    /// Two endpoints connected to each other on this device, through a rendezvous on
    /// `127.0.0.1`.
    ///
    /// ```no_run
    /// use tierbuf_pool::MemoryBudget;
    /// use tierbuf_transport::{Endpoint, EndpointState};
    /// use tierbuf_transport::verbs::{EndpointOptions, VerbsConfig, VerbsProvider};
    /// let provider = VerbsProvider::open(&VerbsConfig::new("rxe0"), MemoryBudget::with_cap(64 << 20))?;
    /// let (a, b) = provider.pair(&EndpointOptions::default())?;
    /// assert_eq!(a.peer_queue_pair(), b.local_queue_pair());
    /// assert_eq!(a.state(), EndpointState::Open);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn pair(
        &self,
        options: &EndpointOptions,
    ) -> Result<(VerbsEndpoint, VerbsEndpoint), VerbsError> {
        let listener = self.listen((Ipv4Addr::LOCALHOST, 0), *options)?;
        let addr = listener.local_addr()?;
        std::thread::scope(|scope| {
            let accepting = scope.spawn(|| listener.accept());
            let connected = self.connect(addr, options);
            let accepted = accepting
                .join()
                .unwrap_or_else(|panic| std::panic::resume_unwind(panic));
            Ok((connected?, accepted?))
        })
    }
}

impl Provider for VerbsProvider {
    type Endpoint = VerbsEndpoint;

    fn name(&self) -> &'static str {
        "verbs"
    }

    fn registrar(&self) -> Arc<dyn Registrar> {
        Arc::clone(&self.registrar) as Arc<dyn Registrar>
    }
}

impl fmt::Debug for VerbsProvider {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("VerbsProvider")
            .field("device", &self.device)
            .field("registrar", &self.registrar)
            .finish()
    }
}

/// Accepts peers for a [`VerbsProvider`]; see [`VerbsProvider::listen`].
///
/// ```no_run
/// use tierbuf_pool::MemoryBudget;
/// use tierbuf_transport::verbs::{EndpointOptions, VerbsConfig, VerbsProvider};
/// let provider = VerbsProvider::open(&VerbsConfig::new("mlx5_0"), MemoryBudget::with_cap(64 << 20))?;
/// let listener = provider.listen("0.0.0.0:0", EndpointOptions::default())?;
/// println!("listening on {}", listener.local_addr()?);
/// let endpoint = listener.accept()?;
/// println!("peer queue pair {}", endpoint.peer_queue_pair().num);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug)]
pub struct VerbsListener {
    provider: VerbsProvider,
    rendezvous: RendezvousListener,
    options: EndpointOptions,
}

impl VerbsListener {
    /// The address peers connect to.
    pub fn local_addr(&self) -> Result<SocketAddr, VerbsError> {
        Ok(self.rendezvous.local_addr()?)
    }

    /// Waits for the next peer and connects an endpoint to it. A peer whose handshake
    /// fails is reported and dropped; the listener goes on accepting. The handshake runs
    /// in this call, so a peer that stalls in it holds the next call back for up to the
    /// handshake timeout per step; [`VerbsListener::accept_peer`] lets the caller run
    /// each handshake apart.
    pub fn accept(&self) -> Result<VerbsEndpoint, VerbsError> {
        self.accept_peer()?.complete()
    }

    /// Waits for the next peer to speak (peers that connect and say nothing do not hold
    /// it up) and returns its handshake, to be completed on any thread: a peer that
    /// stalls in its handshake then holds up no other.
    ///
    /// ```no_run
    /// use tierbuf_pool::MemoryBudget;
    /// use tierbuf_transport::verbs::{EndpointOptions, VerbsConfig, VerbsProvider};
    /// let provider = VerbsProvider::open(&VerbsConfig::new("rxe0"), MemoryBudget::with_cap(64 << 20))?;
    /// let listener = provider.listen("0.0.0.0:7471", EndpointOptions::default())?;
    /// loop {
    ///     match listener.accept_peer() {
    ///         Ok(peer) => {
    ///             let from = peer.peer_addr()?;
    ///             drop(std::thread::spawn(move || match peer.complete() {
    ///                 Ok(endpoint) => println!("{from}: {:?}", endpoint.peer_queue_pair()),
    ///                 Err(error) => eprintln!("{from} failed to connect: {error}"),
    ///             }))
    ///         }
    ///         Err(error) => eprintln!("no peer to connect: {error}"),
    ///     }
    /// }
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn accept_peer(&self) -> Result<PeerHandshake, VerbsError> {
        Ok(PeerHandshake {
            device: Arc::clone(&self.provider.device),
            table: Arc::clone(self.provider.registrar.table()),
            rendezvous: self.rendezvous.accept()?,
            options: self.options,
        })
    }
}

/// A peer that has spoken to a [`VerbsListener`], its handshake not yet run.
#[derive(Debug)]
pub struct PeerHandshake {
    device: Arc<OpenDevice>,
    table: Arc<crate::registry::RegionTable<registrar::DeviceMemory>>,
    rendezvous: Rendezvous,
    options: EndpointOptions,
}

impl PeerHandshake {
    /// The peer's address: the front door's listener counts a handshake against its host
    /// ([`MAX_HANDSHAKES_PER_HOST`](crate::MAX_HANDSHAKES_PER_HOST)). The example of
    /// [`VerbsListener::accept_peer`] calls it.
    ///
    /// # Errors
    ///
    /// What reading the TCP connection's peer address failed with.
    pub fn peer_addr(&self) -> Result<std::net::SocketAddr, VerbsError> {
        self.rendezvous.peer_addr().map_err(VerbsError::from)
    }

    /// Runs the handshake and connects an endpoint to the peer: each step waits at most
    /// the listener's handshake timeout.
    pub fn complete(self) -> Result<VerbsEndpoint, VerbsError> {
        VerbsEndpoint::establish(&self.device, &self.table, self.rendezvous, &self.options)
    }
}
