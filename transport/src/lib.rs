//! tierbuf's transport: a verbs-shaped provider interface ([`Provider`], [`Endpoint`]), its
//! providers, and [`connection`]s that apply tiers to two-sided send/receive over them.
//! The in-process [`LoopbackProvider`] is the default for examples and tests;
//! [`ShmProvider`] connects two processes through shared memory; the `verbs` module
//! (feature `verbs`) drives RDMA hardware (see `docs/transport.md` and `docs/verbs.md`).
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
#[cfg(all(feature = "fuzzing", not(loom)))]
pub mod fuzzing;
mod loopback;
mod pair_state;
mod provider;
mod registry;
mod shm;
mod sync;
#[cfg(feature = "verbs")]
pub mod verbs;

pub use error::{PostError, QueueKind, TransportError};
pub use loopback::{LoopbackEndpoint, LoopbackProvider, LoopbackRegistrar, MAX_QUEUE_DEPTH};
pub use provider::{
    Armed, BufferRef, CallerCopies, Completion, CompletionStatus, Endpoint, EndpointLimits,
    EndpointState, Opcode, Outstanding, Provider, Readiness,
};
pub use shm::RING_CAPACITY;
/// The shared-memory provider's queue protocol, public for the loom models of
/// `tierbuf-loom-tests` (which check it with two threads standing in for the processes).
#[doc(hidden)]
pub use shm::segment as shm_segment;
#[cfg(not(loom))]
pub use shm::{ShmEndpoint, ShmListener, ShmProvider, ShmRegistrar};
