//! The error types of the `transport` crate.

/// Which queue of an endpoint an error is about.
///
/// ```
/// use tierbuf_transport::QueueKind;
/// assert_eq!(QueueKind::Send.to_string(), "send");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum QueueKind {
    /// The send queue.
    Send,
    /// The receive queue.
    Recv,
}

impl std::fmt::Display for QueueKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            QueueKind::Send => "send",
            QueueKind::Recv => "receive",
        })
    }
}

/// Why a work request was not posted. Nothing was queued: the caller still owns the
/// buffer and may retry or give it back.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PostError {
    /// The queue already holds its depth of outstanding requests; poll completions first.
    #[error("the {queue} queue is full ({depth} requests outstanding)")]
    QueueFull {
        /// The full queue.
        queue: QueueKind,
        /// Its depth.
        depth: u32,
    },
    /// No live region registered with this provider has this remote key.
    #[error("no live region registered with this provider has remote key {remote_key:#x}")]
    UnknownKey {
        /// The key named.
        remote_key: u32,
    },
    /// The buffer does not lie inside the region its key names.
    #[error(
        "buffer {addr:#x}+{len} lies outside region {remote_key:#x} \
         ({region_addr:#x}+{region_len})"
    )]
    OutOfBounds {
        /// The key named.
        remote_key: u32,
        /// The buffer's first byte.
        addr: u64,
        /// The buffer's length.
        len: u32,
        /// The region's first byte.
        region_addr: u64,
        /// The region's length.
        region_len: usize,
    },
    /// A send's gather list has more buffers than the endpoint takes.
    #[error("a gather list of {given} buffers passes the endpoint's limit of {max}")]
    TooManyBuffers {
        /// Buffers given.
        given: usize,
        /// The endpoint's limit.
        max: usize,
    },
    /// A send's buffers add up to more than one message can carry.
    #[error("a message of {len} bytes passes the limit of {max} bytes")]
    MessageTooLong {
        /// The message's length.
        len: u64,
        /// The most one message carries.
        max: u32,
    },
    /// A one-sided write's message and the remote range it names differ in length, or a
    /// read's local buffer and remote range do: the caller's mistake.
    #[error("a local length of {local} bytes against a remote range of {remote}")]
    LengthMismatch {
        /// The message's or the local buffer's length.
        local: u64,
        /// The remote range's length.
        remote: u32,
    },
    /// The endpoint already has its most exposures in force
    /// ([`EXPOSURE_SLOTS`](crate::EXPOSURE_SLOTS)); revoke one first.
    #[error("{max} exposures are in force already, the most one endpoint holds")]
    TooManyExposures {
        /// The most exposures in force at once.
        max: usize,
    },
    /// A receive was posted in a region this process already shared with another peer
    /// (a region receives for one peer only, which alone can see its bytes); the caller's
    /// mistake. Nothing was posted.
    #[error(
        "region {remote_key:#x} is already shared with another peer; a receive region serves one"
    )]
    SharedWithAnotherPeer {
        /// The region's key.
        remote_key: u32,
    },
    /// The device refused what an exposure needs (the verbs provider's memory window or
    /// registration of the range), `errno` saying why: usually a limit of this process or
    /// of the device (`RLIMIT_MEMLOCK`, the device's memory windows), not the peer's
    /// fault. Nothing was exposed.
    #[error(
        "the device refused {operation} (errno {errno}): a limit of this process or of the \
         device, not the peer's fault; nothing was exposed"
    )]
    ExposureRefused {
        /// The verbs call refused.
        operation: &'static str,
        /// What it failed with.
        errno: i32,
    },
    /// The transmitter does not do one-sided operations (a test's or driver's own
    /// [`Transmit`](crate::connection::Transmit) that keeps the default); every provider
    /// endpoint does. Nothing was posted.
    #[error(
        "this transmitter does not {operation}; a connection over it needs \
         ConnectionConfig::with_data_path(DataPath::TwoSided) on both sides"
    )]
    Unsupported {
        /// What was asked: `"expose"`, `"revoke"` or `"read"`.
        operation: &'static str,
    },
    /// This endpoint was closed.
    #[error("the endpoint is closed")]
    Closed,
    /// The peer closed its endpoint.
    #[error("the peer closed the connection")]
    PeerClosed,
    /// The connection is broken (an error completion, or a failure of the peer's that the
    /// endpoint's next `poll` reports); every request is flushed from then on.
    #[error("the connection is broken")]
    ConnectionBroken,
}

/// Failures of providers and endpoints outside posting.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TransportError {
    /// A queue depth outside `1..=max` was asked for.
    #[error("a {queue} queue depth of {depth} is outside 1..={max}")]
    InvalidDepth {
        /// Which queue.
        queue: QueueKind,
        /// The depth asked for.
        depth: u32,
        /// The most a queue of this provider holds.
        max: u32,
    },
    /// The provider's device or channel failed (a verbs call, a shared-memory peer that
    /// vanished); the connection is unusable.
    #[error("the {provider} provider failed in {operation}")]
    Provider {
        /// The provider's name.
        provider: &'static str,
        /// What it was doing.
        operation: &'static str,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// This side ran out of a resource of its own (open files, say); not the peer's
    /// fault. The connection is unusable; raising the limit the source names lets a new
    /// one work.
    ///
    /// ```
    /// use tierbuf_transport::TransportError;
    /// let error = TransportError::LocalResource {
    ///     provider: "shm",
    ///     operation: "taking a memory file the peer passed",
    ///     source: rustix::io::Errno::MFILE.into(),
    /// };
    /// assert!(error.to_string().contains("not the peer's fault"), "{error}");
    /// ```
    #[error(
        "the {provider} provider ran out of a resource of this process \
         (not the peer's fault): {operation}"
    )]
    LocalResource {
        /// The provider's name.
        provider: &'static str,
        /// What it was doing, and what the resource was where that is known.
        operation: &'static str,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// Connecting failed: the peer refused, or answered what a peer of this provider
    /// and version would not.
    #[error("the {provider} handshake failed: {detail}")]
    Handshake {
        /// The provider's name.
        provider: &'static str,
        /// What went wrong, and what to do about it where that is known.
        detail: String,
    },
    /// The peer process ended (or closed its socket) without closing the connection;
    /// every outstanding request is flushed.
    #[error(
        "the {provider} peer process died without closing the connection; \
         outstanding requests are flushed"
    )]
    PeerDied {
        /// The provider's name.
        provider: &'static str,
    },
    /// The peer left this side waiting, past the provider's deadline, for something only
    /// it can do (finish a copy it started into this side's buffers, read the records
    /// sent to it, say its hello); the connection is broken. A live peer that stalls
    /// this long is treated as one that broke the protocol: waits on it are bounded.
    #[error("the {provider} peer stalled: {waiting_for} did not come within {timeout:?}")]
    PeerStalled {
        /// The provider's name.
        provider: &'static str,
        /// What this side waited for.
        waiting_for: &'static str,
        /// How long it waited.
        timeout: std::time::Duration,
    },
    /// The peer broke the provider's protocol (a malformed record, a buffer it never
    /// registered, a delivery longer than the buffer); the connection is broken.
    #[error("the {provider} peer broke the protocol: {detail}")]
    ProtocolViolation {
        /// The provider's name.
        provider: &'static str,
        /// What the peer did.
        detail: String,
    },
}
