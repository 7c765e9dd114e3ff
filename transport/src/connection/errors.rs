//! Why a connection could not be set up, why a live one or one send on it failed, and
//! whose fault that was.

use std::sync::Arc;

use tierbuf_tiers::controller::ControllerError;
use tierbuf_tiers::{TierError, negotiation::NegotiationConfigError};

use super::header::HeaderError;
use super::packed::PackedError;
use super::reassembly::ReassemblyError;
use crate::error::{PostError, QueueKind, TransportError};
use crate::provider::CompletionStatus;

/// Whose doing an error was, and so who can act on it.
///
/// ```
/// use tierbuf_transport::connection::{ConnectionError, Fault};
/// assert_eq!(ConnectionError::PeerClosed.fault(), Fault::Peer);
/// assert_eq!(ConnectionError::Closed.fault(), Fault::Caller);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Fault {
    /// The caller's configuration or use of the API.
    Caller,
    /// This side's resources (memory, budget, file descriptors) or its provider.
    Local,
    /// The peer: it closed, died, or broke the protocol.
    Peer,
}

/// Which queue a work request went to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WorkKind {
    /// The send queue.
    Send,
    /// The receive queue.
    Recv,
    /// A one-sided read of a message the peer exposed (on the send queue).
    Read,
}

/// Why a connection could not be set up: its configuration
/// ([`ConnectionConfig::new`](super::ConnectionConfig::new)), the memory for its first
/// tier ([`ConnectionCore::new`](super::ConnectionCore::new)), or the endpoint it was
/// given ([`Connection::new`](super::Connection::new)). [`ConfigError::fault`] says whose
/// fault it was. Once a connection is running, its failures are [`ConnectionError`]s.
///
/// ```
/// use std::sync::Arc;
/// use std::time::Duration;
/// use tierbuf_tiers::ladder::TierLadder;
/// use tierbuf_transport::connection::{ConfigError, ConnectionConfig, Fault};
/// let config = ConnectionConfig::new(Arc::new(TierLadder::preset("two-tier")?))?;
/// let error = config.with_request_timeout(Duration::ZERO, 5).unwrap_err();
/// assert!(matches!(error, ConfigError::Negotiation(_)));
/// assert_eq!(error.fault(), Fault::Caller);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// The ladder, or the request timeout and attempts given, cannot be negotiated (the
    /// caller's).
    #[error("the ladder cannot be negotiated")]
    Negotiation(#[source] NegotiationConfigError),
    /// The endpoint's queue is shallower than the ladder needs
    /// ([`ConnectionConfig::queue_depth`](super::ConnectionConfig::queue_depth)): the
    /// caller made the endpoint.
    #[error("the endpoint's {queue} queue holds {depth} requests; this ladder needs {needed}")]
    QueueTooShallow {
        /// The queue.
        queue: QueueKind,
        /// Its depth.
        depth: u32,
        /// The depth the ladder needs.
        needed: u32,
    },
    /// Registering the first tier's buffers failed (this side's budget or memory).
    #[error("registering the connection's buffers failed")]
    Register(#[source] TierError),
}

impl ConfigError {
    /// Whose doing the error was: the caller's configuration, or this side's memory.
    pub fn fault(&self) -> Fault {
        match self {
            ConfigError::Negotiation(_) | ConfigError::QueueTooShallow { .. } => Fault::Caller,
            ConfigError::Register(_) => Fault::Local,
        }
    }
}

/// Why a running connection failed. [`ConnectionError::fault`] says whose fault it was.
/// Why one could not be set up is a [`ConfigError`].
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConnectionError {
    /// A completion named a work request that is not outstanding: the driver handed the
    /// core a completion it did not ask for (the caller's).
    #[error("completion for unknown {kind:?} work request {wr_id}")]
    UnknownWorkRequest {
        /// The kind of work request.
        kind: WorkKind,
        /// Its id.
        wr_id: u64,
    },
    /// This side closed the connection.
    #[error("the connection is closed")]
    Closed,
    /// This side's provider failed, or ran out of a resource (this side's).
    #[error("the provider failed")]
    Provider(#[source] TransportError),
    /// The provider refused a work request for a reason of this side's.
    #[error("the provider refused a work request")]
    Post(#[source] PostError),
    /// A work request completed with an error status (whose fault the status says:
    /// [`ConnectionError::fault`]).
    #[error("{kind:?} work request {wr_id} completed with {status:?}")]
    CompletionFailed {
        /// The kind of work request.
        kind: WorkKind,
        /// Its id.
        wr_id: u64,
        /// The status it completed with.
        status: CompletionStatus,
    },
    /// The peer closed the connection; messages not yet delivered to it are lost, and this
    /// side's calls report it.
    #[error("the peer closed the connection")]
    PeerClosed,
    /// A message given to an [`AsyncConnection`](super::AsyncConnection)'s sink could not
    /// be sent for its own sake (too long, say); the sink reports it as its error.
    #[cfg(feature = "tokio")]
    #[error("the sink could not send a message")]
    SinkRefused(#[source] SendError),
    /// A send's deadline passed after part of its message had been posted
    /// ([`Connection::send_deadline`](super::Connection::send_deadline)): the peer took
    /// no more of it in time, and a message cannot be taken back, so the connection
    /// failed rather than leave the peer waiting for the rest.
    #[error("the peer took {sent} of {len} bytes of a message before the send's deadline")]
    AbandonedMidMessage {
        /// Bytes of the message posted.
        sent: usize,
        /// The message's length.
        len: usize,
    },
    /// The peer went away without closing (its process died).
    #[error("the peer died")]
    PeerDied(#[source] TransportError),
    /// The peer broke the protocol; what it sent was not applied.
    #[error("the peer broke the protocol")]
    PeerProtocol(#[source] PeerViolation),
    /// The channel of a user's negotiator failed, or the tier controller found its own
    /// state inconsistent.
    #[error("the tier negotiation failed")]
    Tiers(#[source] ControllerError),
    /// Registering a buffer for a message too large for the tier in force failed: this
    /// side's copy of one it sends for the peer to read, or the buffer it reads one the
    /// peer exposed into (`docs/protocol.md`, "Rendezvous"). The source names the limit
    /// (usually the memory budget) and the setting that raises it.
    #[error("registering {len} bytes for a message read by one side from the other failed")]
    RendezvousBuffer {
        /// The bytes asked for.
        len: usize,
        /// Why the registrar refused.
        #[source]
        source: tierbuf_pool::PoolError,
    },
}

/// What a peer sent that breaks the protocol, with the offending field in each source.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PeerViolation {
    /// A malformed frame header.
    #[error("malformed frame header")]
    Header(#[source] HeaderError),
    /// Segments out of order or with wrong lengths.
    #[error("malformed segmented message")]
    Reassembly(#[source] ReassemblyError),
    /// A packed frame whose entries break the format.
    #[error("malformed packed frame")]
    Packed(#[source] PackedError),
    /// Receives granted of a tier past the ladder.
    #[error("the peer granted receives of tier {tier}, past the ladder's {len} tiers")]
    GrantBeyondLadder {
        /// The tier named.
        tier: u8,
        /// Tiers on the ladder.
        len: usize,
    },
    /// A frame's grant would take this side's credits past every receive the peer could
    /// have posted
    /// ([`ConnectionConfig::max_send_credits`](super::ConnectionConfig::max_send_credits)).
    #[error(
        "the peer granted {count} receives of tier {tier} on top of {held}, past the {limit} it can have posted"
    )]
    GrantBeyondReceives {
        /// The grant's tier.
        tier: u8,
        /// The grant's count.
        count: u16,
        /// The credits held before it.
        held: u32,
        /// The most the peer can have granted.
        limit: u32,
    },
    /// A malformed or out-of-protocol control message.
    #[error("the tier negotiation")]
    Negotiation(#[source] ControllerError),
    /// In-band control frames piled up past the limit waiting for a credit the peer did
    /// not grant: it took none of them for a long time while this side kept asking
    /// (`docs/threats.md`).
    #[error(
        "{waiting} control frames wait for a credit the peer does not grant (the limit is {limit})"
    )]
    ControlBacklog {
        /// Control frames waiting.
        waiting: usize,
        /// The most that may wait.
        limit: usize,
    },
    /// A control frame on a connection that negotiates over a channel of its own.
    #[error("a control frame on a connection whose negotiation runs elsewhere")]
    UnexpectedControlFrame,
    /// The provider's own protocol (a bad record, a delivery longer than the buffer, a
    /// peer that stalled past the provider's deadline).
    #[error("the provider's protocol")]
    Provider(#[source] TransportError),
    /// An exposed message while one the peer exposed earlier is still being read: an
    /// honest peer exposes one at a time.
    #[error("the peer exposed a second message while its first was still being read")]
    SecondExposure,
    /// A message exposed for reading whose descriptor is malformed: not the
    /// [`EXPOSED_LEN`](super::header::EXPOSED_LEN) bytes of one, or a range of another
    /// length than the message.
    #[error("an exposed message's descriptor names {range} bytes for a message of {len}")]
    ExposedRange {
        /// The range's length in the descriptor (0 when there was none).
        range: u64,
        /// The message's length in the frame header.
        len: u64,
    },
    /// A frame saying the peer read a message that this side did not expose to it, or
    /// not under that key and length.
    #[error("the peer said it read {len} bytes under key {key:#x}, which this side did not expose")]
    UnexposedReadDone {
        /// The key the frame named.
        key: u32,
        /// The length it named.
        len: u32,
    },
    /// The peer did not read a message this side exposed to it within the read timeout
    /// ([`ConnectionConfig::with_read_timeout`](super::ConnectionConfig::with_read_timeout)).
    #[error("the peer did not read a {len}-byte message within {timeout:?}")]
    ReadNotDone {
        /// The message's length.
        len: usize,
        /// The timeout.
        timeout: std::time::Duration,
    },
}

impl ConnectionError {
    /// Whose doing the error was.
    pub fn fault(&self) -> Fault {
        match self {
            ConnectionError::UnknownWorkRequest { .. } | ConnectionError::Closed => Fault::Caller,
            #[cfg(feature = "tokio")]
            ConnectionError::SinkRefused(_) => Fault::Caller,
            ConnectionError::Provider(_)
            | ConnectionError::Post(_)
            | ConnectionError::Tiers(_)
            | ConnectionError::RendezvousBuffer { .. } => Fault::Local,
            ConnectionError::PeerClosed
            | ConnectionError::AbandonedMidMessage { .. }
            | ConnectionError::PeerDied(_)
            | ConnectionError::PeerProtocol(_) => Fault::Peer,
            ConnectionError::CompletionFailed { status, .. } => match status {
                // The buffers or regions were this side's.
                CompletionStatus::LocalProtectionError => Fault::Local,
                // A peer's frame longer than the receive its credit stood for, a peer that
                // refused or could not take a send, or one gone from the fabric.
                _ => Fault::Peer,
            },
        }
    }

    /// The error for a failure of the tier controller: the peer's when it sent something
    /// that breaks the protocol.
    pub(super) fn of_controller(error: ControllerError) -> ConnectionError {
        match error {
            ControllerError::PeerProtocol(_) | ControllerError::MalformedFrame(_) => {
                ConnectionError::PeerProtocol(PeerViolation::Negotiation(error))
            }
            other => ConnectionError::Tiers(other),
        }
    }

    /// The error for a provider that failed while polling.
    pub(super) fn of_transport(error: TransportError) -> ConnectionError {
        match error {
            TransportError::PeerDied { .. } => ConnectionError::PeerDied(error),
            TransportError::ProtocolViolation { .. } | TransportError::PeerStalled { .. } => {
                ConnectionError::PeerProtocol(PeerViolation::Provider(error))
            }
            other => ConnectionError::Provider(other),
        }
    }

    /// The error for a work request the provider refused.
    pub(super) fn of_post(error: PostError) -> ConnectionError {
        match error {
            PostError::PeerClosed => ConnectionError::PeerClosed,
            PostError::Closed => ConnectionError::Closed,
            other => ConnectionError::Post(other),
        }
    }
}

/// Why a send accepted nothing now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum WouldBlock {
    /// A message built in place needs a larger tier and its promotion is under way:
    /// retry after progress. Messages sent by copy
    /// never wait for a promotion; they go out in segments meanwhile.
    PromotionPending,
    /// No credit (posted receive on the peer) or no send buffer is free now.
    NoCredit,
    /// A segmented message is still being sent.
    SegmentedInFlight,
    /// The last message too large for the tier in force is exposed and the peer has not
    /// read it yet: one is exposed at a time (`docs/protocol.md`, "Rendezvous").
    ExposedUnread,
    /// A message built in place needs a larger tier, which the peer refused for now:
    /// retry later, or send it with `try_send`, which segments it.
    PromotionRefused,
    /// A message is already being built in place: commit or cancel it first.
    AlreadyReserved,
    /// A [`Sender`](super::Sender)'s queue is full: the connection's thread has not taken
    /// what its senders queued yet.
    SendersQueueFull,
    /// An `AsyncConnection`'s sink holds messages it has not
    /// posted yet, which go first: await a send, or flush.
    SinkBacklog,
}

/// Why a send was not accepted.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SendError {
    /// Nothing was accepted now; retry after progress.
    #[error("would block: {0:?}")]
    WouldBlock(WouldBlock),
    /// The deadline of a blocking send passed before any of the message was taken; the
    /// reason it waited is kept. Nothing was sent.
    #[error("the deadline passed while the send waited: {0:?}")]
    TimedOut(WouldBlock),
    /// The message passes the configured maximum.
    #[error("a {len}-byte message passes the maximum of {max} bytes")]
    TooLong {
        /// The message's length.
        len: u64,
        /// The maximum.
        max: u64,
    },
    /// A message built in place must fit one frame of the top tier.
    #[error("a {len}-byte message built in place passes the largest frame payload, {max} bytes")]
    BeyondOneFrame {
        /// The length asked for.
        len: usize,
        /// The top tier's frame payload.
        max: usize,
    },
    /// [`ConnectionCore::commit_reserved`](super::ConnectionCore::commit_reserved) was
    /// called with no message reserved.
    #[error("no message is reserved")]
    NothingReserved,
    /// [`ConnectionCore::try_send_some`](super::ConnectionCore::try_send_some) was
    /// offered something other than the rest of the segmented message it is posting.
    #[error("{offered} bytes offered where the rest of a segmented message is {expected}")]
    NotTheRest {
        /// The bytes of the message not yet posted.
        expected: usize,
        /// The bytes offered.
        offered: usize,
    },
    /// The connection failed or was closed; the source says why and whose fault it was.
    #[error("the connection failed")]
    Failed(#[source] Arc<ConnectionError>),
}
