//! [`SetupError`]: why the front door could not build a transport, listen, accept or
//! connect.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tierbuf_pool::PoolError;
use tierbuf_tiers::TierError;
use tierbuf_tiers::ladder::{LadderError, LoadError};

use crate::connection::{ConfigError, ConnectionError, Fault};
use crate::error::TransportError;

/// Why the front door ([`Transport`](super::Transport)) could not build, listen, accept
/// or connect. [`SetupError::fault`] says whose doing it was; every variant keeps the
/// error it came from as its `source`.
///
/// ```
/// use tierbuf_transport::connection::Fault;
/// use tierbuf_transport::{SetupError, Transport};
/// let error = Transport::loopback().ladder_preset("tiny").budget_bytes(1 << 20).build().unwrap_err();
/// assert!(matches!(error, SetupError::UnknownPreset { .. }));
/// assert_eq!(error.fault(), Fault::Caller);
/// ```
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SetupError {
    /// No preset ladder has this name.
    #[error("no preset ladder is called {name:?}")]
    UnknownPreset {
        /// The name given.
        name: String,
        /// The ladder loader's error.
        #[source]
        source: LoadError,
    },
    /// The ladder file could not be read, parsed or validated.
    #[error("the ladder file {} cannot be used", path.display())]
    LadderFile {
        /// The file given.
        path: PathBuf,
        /// The ladder loader's error (it names the line and column of a bad value).
        #[source]
        source: LoadError,
    },
    /// The ladder with the builder's overrides (demotion timing, reservoir regions)
    /// breaks a rule of the ladder's validation.
    #[error("the ladder with the builder's overrides is not valid")]
    Ladder {
        /// The rule broken.
        #[source]
        source: LadderError,
    },
    /// A connection could not be set up: the ladder is valid but connections cannot run
    /// on it (its smallest tier cannot carry a control frame, say), or the memory budget
    /// refused a new connection the buffers of its first tier.
    #[error("a connection could not be set up")]
    Config {
        /// The connection layer's error.
        #[source]
        source: ConfigError,
    },
    /// The ladder needs deeper queues than the provider's endpoints have.
    #[error(
        "the ladder needs queues {needed} deep, past the {provider} provider's {max}: \
         give its tiers fewer slots"
    )]
    QueueTooDeep {
        /// The provider's name.
        provider: &'static str,
        /// The depth the ladder needs (`ConnectionConfig::queue_depth`).
        needed: u32,
        /// The deepest queue the provider takes.
        max: u32,
    },
    /// No memory budget could be made from the system's limits.
    #[error("no memory budget could be made from this system's limits")]
    Budget {
        /// The pool's error.
        #[source]
        source: PoolError,
    },
    /// The memory budget cannot hold the reservoir's spare regions and one connection on
    /// the smallest tier.
    #[error(
        "a memory budget of {cap} bytes cannot hold the ladder's reservoir and one \
         connection, which need {needed} bytes"
    )]
    BudgetTooSmall {
        /// The budget's cap.
        cap: u64,
        /// What the ladder needs at least, in whole pages.
        needed: u64,
    },
    /// Filling the reservoir failed.
    #[error("filling the reservoir failed")]
    Reservoir {
        /// The reservoir's error.
        #[source]
        source: TierError,
    },
    /// This process cannot open the files the connections it expects would hold.
    #[error(
        "{connections} connections over {provider} need up to {needed} open files per \
         process ({holding}), but the limit is {limit}: expect {fit} connections or fewer, \
         or raise the hard limit (ulimit -Hn)"
    )]
    OpenFiles {
        /// The provider's name.
        provider: &'static str,
        /// The connections expected.
        connections: usize,
        /// What each connection holds open.
        holding: &'static str,
        /// The open files needed.
        needed: u64,
        /// The hard limit.
        limit: u64,
        /// The most connections the limit holds.
        fit: u64,
    },
    /// Raising this process's open-file limit failed.
    #[error("raising the open-file limit from {from} to {to} failed")]
    RaiseOpenFiles {
        /// The soft limit.
        from: u64,
        /// The hard limit, asked for as the soft one.
        to: u64,
        /// What the system said.
        #[source]
        source: std::io::Error,
    },
    /// Another listener listens at this address already (over shm: a file exists at
    /// the socket path).
    #[error("a listener is already listening at {address}")]
    AddressInUse {
        /// The address.
        address: String,
    },
    /// Nothing listens at the address connected to.
    #[error("nothing listens at {address}")]
    NoListener {
        /// The address.
        address: String,
        /// What the provider said, where it said something.
        #[source]
        source: Option<TransportError>,
    },
    /// `accept_timeout` or `connect_timeout` ran out of time.
    #[error("{operation} did not complete within {timeout:?}")]
    TimedOut {
        /// What waited: accepting or connecting.
        operation: &'static str,
        /// The timeout given.
        timeout: Duration,
    },
    /// The provider failed: opening it, listening, or connecting an endpoint (a peer that
    /// failed its handshake is reported here, and the listener goes on).
    #[error("the {provider} provider failed in {operation}")]
    Provider {
        /// The provider's name.
        provider: &'static str,
        /// What the front door was doing.
        operation: &'static str,
        /// The provider's error.
        #[source]
        source: TransportError,
    },
    /// The verbs provider failed: opening the device, a memlock limit too low for the
    /// connections expected, listening, or connecting.
    #[cfg(feature = "verbs")]
    #[error("the verbs provider failed in {operation}")]
    Verbs {
        /// What the front door was doing.
        operation: &'static str,
        /// The provider's error.
        #[source]
        source: Box<crate::verbs::VerbsError>,
    },
    /// An endpoint was connected, but the connection over it failed at once (the peer
    /// hung up, say).
    #[error("the connection over a new endpoint failed at once")]
    Connection {
        /// The connection's error.
        #[source]
        source: Arc<ConnectionError>,
    },
    /// The thread that accepts for a listener is gone (it panicked).
    #[error("the listener's accepting thread is gone")]
    ListenerGone,
    /// A peer came from a host that had its handshakes running and its queue of peers
    /// waiting full ([`MAX_HANDSHAKES_PER_HOST`](super::MAX_HANDSHAKES_PER_HOST),
    /// [`MAX_WAITING_PER_HOST`](super::MAX_WAITING_PER_HOST)): it was closed unheard. The
    /// listener goes on.
    #[error(
        "a peer from {host} was refused: {running} of its host's handshakes ran and {waiting} of its peers waited"
    )]
    HostBusy {
        /// The peer's host: its IPv4 address, or its IPv6 address's /64 network (the low
        /// 64 bits zero; [`MAX_HANDSHAKES_PER_HOST`](super::MAX_HANDSHAKES_PER_HOST)).
        host: std::net::IpAddr,
        /// The host's handshakes running.
        running: usize,
        /// The host's peers waiting for a turn.
        waiting: usize,
    },
    /// A thread to accept or connect on could not be started.
    #[error("no thread could be started for {purpose}")]
    Thread {
        /// What the thread was for.
        purpose: &'static str,
        /// What the system said.
        #[source]
        source: std::io::Error,
    },
}

impl SetupError {
    /// Whose doing the failure was: the caller's arguments or use, this process's
    /// resources, or the peer.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tierbuf_transport::connection::Fault;
    /// use tierbuf_transport::SetupError;
    /// let timeout = SetupError::TimedOut { operation: "accepting", timeout: Duration::ZERO };
    /// assert_eq!(timeout.fault(), Fault::Peer);
    /// ```
    pub fn fault(&self) -> Fault {
        match self {
            SetupError::UnknownPreset { .. }
            | SetupError::LadderFile { .. }
            | SetupError::Ladder { .. }
            | SetupError::QueueTooDeep { .. }
            | SetupError::BudgetTooSmall { .. }
            | SetupError::AddressInUse { .. }
            | SetupError::NoListener { .. } => Fault::Caller,
            SetupError::Budget { .. }
            | SetupError::Reservoir { .. }
            | SetupError::OpenFiles { .. }
            | SetupError::RaiseOpenFiles { .. }
            | SetupError::ListenerGone
            | SetupError::Thread { .. } => Fault::Local,
            // No peer came, or none answered in time; a host that sent more peers than
            // it may have waiting.
            SetupError::TimedOut { .. } | SetupError::HostBusy { .. } => Fault::Peer,
            SetupError::Provider { source, .. } => match source {
                TransportError::Handshake { .. }
                | TransportError::PeerDied { .. }
                | TransportError::PeerStalled { .. } => Fault::Peer,
                TransportError::InvalidDepth { .. } => Fault::Caller,
                _ => Fault::Local,
            },
            #[cfg(feature = "verbs")]
            SetupError::Verbs { source, .. } => match **source {
                crate::verbs::VerbsError::InvalidDepth { .. }
                | crate::verbs::VerbsError::DepthPastDevice { .. } => Fault::Caller,
                _ => Fault::Local,
            },
            SetupError::Config { source } => source.fault(),
            SetupError::Connection { source } => source.fault(),
        }
    }
}

impl From<ConfigError> for SetupError {
    /// [`SetupError::Config`].
    fn from(source: ConfigError) -> SetupError {
        SetupError::Config { source }
    }
}

#[cfg(all(test, feature = "verbs"))]
mod tests {
    use super::*;
    use crate::error::QueueKind;
    use crate::verbs::{MAX_QUEUE_DEPTH, VerbsError};

    fn verbs(source: VerbsError) -> SetupError {
        SetupError::Verbs {
            operation: "listening",
            source: Box::new(source),
        }
    }

    #[test]
    fn a_verbs_queue_depth_refused_is_the_callers_and_a_missing_device_is_local() {
        let past_device = VerbsError::DepthPastDevice {
            device: "nic0".to_owned(),
            queue: QueueKind::Recv,
            depth: 4064,
            max: 4063,
        };
        assert_eq!(verbs(past_device).fault(), Fault::Caller);
        let past_provider = VerbsError::InvalidDepth {
            queue: QueueKind::Send,
            depth: MAX_QUEUE_DEPTH + 1,
            max: MAX_QUEUE_DEPTH,
        };
        assert_eq!(verbs(past_provider).fault(), Fault::Caller);
        assert_eq!(verbs(VerbsError::NoDevices).fault(), Fault::Local);
    }
}
