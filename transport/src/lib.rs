//! tierbuf's transport: connections that apply tiers to two-sided send/receive, the
//! front door that builds them ([`Transport`]), and the verbs-shaped provider interface
//! under them ([`Provider`], [`Endpoint`]) with its providers.
//!
//! ```
//! use tierbuf_transport::Transport;
//! type Error = Box<dyn std::error::Error + Send + Sync>;
//! let node = Transport::loopback().ladder_preset("rpc").budget_bytes(64 << 20).build()?;
//! let listener = node.listen("echo")?;
//! let server = std::thread::spawn(move || -> Result<(), Error> {
//!     let mut connection = listener.accept()?;
//!     while let Ok(request) = connection.recv() { // until the client hangs up
//!         connection.send(&request)?;
//!     }
//!     Ok(())
//! });
//! let mut client = node.connect("echo")?;
//! for len in [64, 4 << 10, 200 << 10] { // 4 KiB is promoted, 200 KiB read by the peer
//!     let request = vec![len as u8; len];
//!     client.send(&request)?;
//!     assert_eq!(&client.recv()?[..], &request[..]);
//! }
//! drop(client);
//! server.join().unwrap()?;
//! # Ok::<(), Error>(())
//! ```
//!
//! [`Transport::loopback`] keeps both ends in this process; [`Transport::shm`] connects
//! processes of one host through shared memory (a socket path as the address); the
//! `verbs` provider (feature `verbs`) drives RDMA hardware, with `Transport::verbs` (a TCP
//! address for the exchange). `docs/connection.md` ("Front door") says what the builder
//! checks; `docs/transport.md` and `docs/verbs.md` describe the providers.
//!
//! # The provider interface
//!
//! Under the connections, a provider registers memory and connects endpoint pairs whose
//! posts and completions follow verbs' rules; the in-process [`LoopbackProvider`] needs
//! nothing but memory:
//!
//! ```
//! use tierbuf_pool::{MemoryBudget, SlotPool};
//! use tierbuf_transport::{BufferRef, Completion, CompletionStatus, Endpoint, LoopbackProvider, Provider};
//! let provider = LoopbackProvider::new(MemoryBudget::with_cap(1 << 20));
//! let pool = SlotPool::new(&*provider.registrar(), 64, 4)?;
//! let (mut a, mut b) = provider.pair(2, 2)?;
//! let (mut message, inbox) = (pool.try_acquire_owned().unwrap(), pool.try_acquire_owned().unwrap());
//! message.fill(7);
//! // SAFETY: the slots are left alone until their completions are polled.
//! unsafe {
//!     a.post_send(&[BufferRef::from(&message)], 10)?; // waits: no receive posted yet
//!     b.post_recv(BufferRef::from(&inbox), 20)?;
//! }
//! let mut completions = [Completion::default(); 2];
//! assert_eq!(a.poll(&mut completions)?, 1);
//! assert_eq!((completions[0].wr_id, completions[0].status), (10, CompletionStatus::Success));
//! assert_eq!(b.poll(&mut completions)?, 1);
//! assert_eq!(completions[0].byte_len, 64);
//! assert!(inbox.iter().all(|&byte| byte == 7));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

#![warn(missing_docs)]

pub mod connection;
mod error;
/// The exposure table's protocol, public for the loom models of `tierbuf-loom-tests`.
#[doc(hidden)]
pub mod exposure;
#[cfg(not(loom))]
mod front;
#[cfg(all(feature = "fuzzing", not(loom)))]
pub mod fuzzing;
mod loopback;
mod pair_state;
mod provider;
mod registry;
mod shm;
mod sync;
#[cfg(all(feature = "test-pair", not(loom)))]
pub mod test_pair;
#[cfg(feature = "verbs")]
pub mod verbs;

pub use error::{PostError, QueueKind, TransportError};
pub use exposure::{Access, EXPOSURE_SLOTS};
#[cfg(feature = "verbs")]
#[cfg(not(loom))]
pub use front::Verbs;
#[cfg(not(loom))]
pub use front::{
    ACCEPT_BACKLOG, ConnectionOf, Kind, Listener, Loopback, MAX_HANDSHAKES,
    MAX_HANDSHAKES_PER_HOST, MAX_WAITING_PER_HOST, SetupError, Shm, Transport, TransportBuilder,
};
pub use loopback::{LoopbackEndpoint, LoopbackProvider, LoopbackRegistrar, MAX_QUEUE_DEPTH};
pub use provider::{
    Armed, BufferRef, CallerCopies, Completion, CompletionStatus, Endpoint, EndpointLimits,
    EndpointState, Opcode, Outstanding, Provider, Readiness, RemoteBuffer,
};
pub use shm::RING_CAPACITY;
/// The shared-memory provider's queue protocol, public for the loom models of
/// `tierbuf-loom-tests` (which check it with two threads standing in for the processes).
#[doc(hidden)]
pub use shm::segment as shm_segment;
#[cfg(not(loom))]
pub use shm::{PeerMappingLimit, ShmEndpoint, ShmListener, ShmProvider, ShmRegistrar};
