//! [`ConnectionConfig`]: what both sides of a connection agree on (the ladder, and what it
//! takes of the transport), checked once when it is made.

use std::sync::Arc;
use std::time::Duration;

use tierbuf_tiers::ladder::{SLOT_ALIGN, SLOT_HEADROOM, TierLadder};
use tierbuf_tiers::negotiation::NegotiationConfig;
use tierbuf_tiers::policy::FrameCapacity;
use tierbuf_tiers::wire;

use super::errors::ConfigError;
use super::header::HEADER_LEN;

/// How a message past the ladder's top tier travels (`docs/protocol.md`, "Rendezvous").
/// Each side chooses for the messages it sends, and reads what its peer exposes whichever
/// it chose, so the two may differ (a side whose transmitter has no one-sided operations
/// must send two-sided, and its peer too). A message that a larger tier carries goes in
/// segments while its promotion lands, on either path.
///
/// ```
/// use tierbuf_transport::connection::DataPath;
/// assert_eq!(DataPath::default(), DataPath::OneSided);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum DataPath {
    /// The sender exposes its copy of the message and the receiver reads it with one
    /// one-sided read into a buffer of its own: one small frame each way, one read.
    #[default]
    OneSided,
    /// The message is cut into frames of the peer's posted receives and reassembled:
    /// sends and receives only, for a transmitter without one-sided operations.
    TwoSided,
}

/// How a connection is set up; both sides must use the same ladder.
#[derive(Debug, Clone)]
pub struct ConnectionConfig {
    capacity: Arc<FrameCapacity>,
    data_path: DataPath,
    read_timeout: Duration,
    negotiation: NegotiationConfig,
    max_message_len: u64,
    spare_buffer_limit: usize,
    unread_copy_limit: usize,
    max_send_credits: u32,
}

// Every slot registers `SLOT_HEADROOM` bytes past its tier's size for the frame header, so
// a tier's size is what one of its frames carries (`docs/ladders.md`, "Tier sizes"); and a
// tier is at least `SLOT_ALIGN` bytes, so even tier 0 carries the largest control frame.
const _: () = assert!(HEADER_LEN <= SLOT_HEADROOM);
const _: () = assert!(wire::MAX_FRAME_LEN <= SLOT_ALIGN);

/// [`ConnectionConfig::unread_copy_limit`] unless set.
const DEFAULT_UNREAD_COPY_LIMIT: usize = 4 << 20;

/// [`ConnectionConfig::spare_buffer_limit`] unless set.
const DEFAULT_SPARE_BUFFER_LIMIT: usize = 4 << 20;

/// [`ConnectionConfig::read_timeout`] unless set.
const DEFAULT_READ_TIMEOUT: Duration = Duration::from_secs(30);

impl ConnectionConfig {
    /// A configuration for `ladder`: requests re-sent every 100 ms, given up after 5 sends,
    /// messages up to 64 MiB, a message past the top tier read by the peer
    /// ([`DataPath::OneSided`]) within 30 s.
    ///
    /// ```
    /// use std::sync::Arc;
    /// use tierbuf_tiers::ladder::TierLadder;
    /// use tierbuf_transport::connection::ConnectionConfig;
    /// let config = ConnectionConfig::new(Arc::new(TierLadder::preset("two-tier")?))?;
    /// assert_eq!(config.max_message_len(), 64 << 20);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`ConfigError::Negotiation`] when the ladder cannot be negotiated. Every bound on
    /// the ladder itself (at least three slots a tier, slot, region and policy maxima) is
    /// the ladder's own validation ([`TierLadder::builder`], and so the ladder loader and
    /// `tierbuf ladder check`): a `TierLadder` that exists has passed it, and every tier of
    /// it carries a control frame and, in one frame, a message of its size.
    pub fn new(ladder: Arc<TierLadder>) -> Result<ConnectionConfig, ConfigError> {
        let negotiation = NegotiationConfig::for_ladder(&ladder, Duration::from_millis(100), 5)
            .map_err(ConfigError::Negotiation)?;
        // The ladder bounds every tier's slots, so the sum fits easily.
        let every_slot: usize = ladder.tiers().iter().map(|spec| spec.slot_count()).sum();
        let max_send_credits = u32::try_from(every_slot.saturating_mul(2)).unwrap_or(u32::MAX);
        let capacity = FrameCapacity::new(ladder, HEADER_LEN)
            .expect("the frame header fits the slots' headroom (asserted above)");
        Ok(ConnectionConfig {
            capacity: Arc::new(capacity),
            data_path: DataPath::default(),
            read_timeout: DEFAULT_READ_TIMEOUT,
            negotiation,
            max_message_len: 64 << 20,
            spare_buffer_limit: DEFAULT_SPARE_BUFFER_LIMIT,
            unread_copy_limit: DEFAULT_UNREAD_COPY_LIMIT,
            max_send_credits,
        })
    }

    /// The most credits (receives the peer has posted and granted, not yet sent into) a
    /// side can hold: every slot of every tier of the ladder posted at once, twice over (a
    /// tier in force and a replaced registration of it still draining). A peer's grant
    /// past it is a protocol violation
    /// ([`PeerViolation::GrantBeyondReceives`](super::PeerViolation::GrantBeyondReceives)),
    /// so credits never overflow and their bookkeeping stays bounded.
    ///
    /// ```
    /// use std::sync::Arc;
    /// use tierbuf_tiers::ladder::TierLadder;
    /// use tierbuf_transport::connection::ConnectionConfig;
    /// let config = ConnectionConfig::new(Arc::new(TierLadder::preset("two-tier")?))?;
    /// assert_eq!(config.max_send_credits(), 2 * (16 + 16));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn max_send_credits(&self) -> u32 {
        self.max_send_credits
    }

    /// Sets how a message past the ladder's top tier travels.
    pub fn with_data_path(mut self, data_path: DataPath) -> ConnectionConfig {
        self.data_path = data_path;
        self
    }

    /// How a message past the ladder's top tier travels.
    pub fn data_path(&self) -> DataPath {
        self.data_path
    }

    /// Sets how long a message exposed for the peer to read ([`DataPath::OneSided`]) may
    /// wait for the peer to say it read it; past it the connection fails as the peer's
    /// fault ([`PeerViolation::ReadNotDone`](super::PeerViolation::ReadNotDone)). A
    /// peer whose user does not poll it still reads (its connection's timers and
    /// readiness run), so this bounds a stalled or hostile peer. Default 30 s.
    pub fn with_read_timeout(mut self, timeout: Duration) -> ConnectionConfig {
        self.read_timeout = timeout;
        self
    }

    /// How long an exposed message waits for the peer's read.
    pub fn read_timeout(&self) -> Duration {
        self.read_timeout
    }

    /// Sets the largest buffer a connection keeps, per direction, for reuse by the next
    /// message too large for the tier in force: the sender's copy of it (a heap buffer
    /// for segments, a registered region to expose for reading) and the receiver's
    /// (reassembly, or the registered region it reads into). A larger one is made for its
    /// message and freed after it. Kept buffers are freed once the connection has seen no
    /// such message for the ladder's `demote_after`. Default 4 MiB; 0 keeps none.
    pub fn with_spare_buffer_limit(mut self, bytes: usize) -> ConnectionConfig {
        self.spare_buffer_limit = bytes;
        self
    }

    /// The largest buffer kept for reuse per direction.
    pub fn spare_buffer_limit(&self) -> usize {
        self.spare_buffer_limit
    }

    /// Sets how many bytes of delivered, unread messages a connection may hold as copies
    /// when it copies messages out of their receive slots so that the peer has receives to
    /// send into while this side's user is busy sending (`docs/connection.md`, rule 8).
    /// Past it the peer waits for the user to read, as a socket's peer waits on a full
    /// buffer; so it also bounds what a peer that never gives credits back can make this
    /// side copy. Each copy counts its bytes and the size of a [`Message`](super::Message),
    /// so that a peer sending empty messages is bounded too. Default 4 MiB.
    pub fn with_unread_copy_limit(mut self, bytes: usize) -> ConnectionConfig {
        self.unread_copy_limit = bytes;
        self
    }

    /// The most bytes of unread messages held as copies.
    pub fn unread_copy_limit(&self) -> usize {
        self.unread_copy_limit
    }

    /// Sets the longest message either side may send.
    pub fn with_max_message_len(mut self, max_message_len: u64) -> ConnectionConfig {
        self.max_message_len = max_message_len;
        self
    }

    /// Sets how often an unanswered tier request is re-sent and how many sends it gets.
    ///
    /// # Errors
    ///
    /// [`ConfigError::Negotiation`] for a zero timeout, one past
    /// [`MAX_REQUEST_TIMEOUT`](tierbuf_tiers::negotiation::MAX_REQUEST_TIMEOUT) (an hour),
    /// or zero attempts.
    pub fn with_request_timeout(
        mut self,
        request_timeout: Duration,
        max_attempts: u32,
    ) -> Result<ConnectionConfig, ConfigError> {
        self.negotiation =
            NegotiationConfig::for_ladder(self.ladder(), request_timeout, max_attempts)
                .map_err(ConfigError::Negotiation)?;
        Ok(self)
    }

    /// The ladder.
    pub fn ladder(&self) -> &Arc<TierLadder> {
        self.capacity.ladder()
    }

    /// What one frame of each tier carries: the tier's size, the frame header being in the
    /// slot's headroom.
    pub fn capacity(&self) -> &Arc<FrameCapacity> {
        &self.capacity
    }

    /// The negotiation's configuration.
    pub(super) fn negotiation(&self) -> &NegotiationConfig {
        &self.negotiation
    }

    /// The longest message either side may send.
    pub fn max_message_len(&self) -> u64 {
        self.max_message_len
    }

    /// The queue depth, each way, an endpoint needs for a connection on this ladder: the
    /// receives of the tier in force and those of the tier it replaced, which stay posted
    /// until the peer drains them (the two largest slot counts together); sends are bounded
    /// by the same receives, as credits. [`Connection::new`](super::Connection::new)
    /// refuses an endpoint whose queues are shallower.
    ///
    /// ```
    /// use std::sync::Arc;
    /// use tierbuf_tiers::ladder::TierLadder;
    /// use tierbuf_transport::connection::ConnectionConfig;
    /// let config = ConnectionConfig::new(Arc::new(TierLadder::preset("storage")?))?;
    /// assert_eq!(config.queue_depth(), 32 + 16); // 4 KiB x 32, 64 KiB x 16, 1 MiB x 4
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn queue_depth(&self) -> u32 {
        let mut counts: Vec<usize> = self
            .ladder()
            .tiers()
            .iter()
            .map(|spec| spec.slot_count())
            .collect();
        counts.sort_unstable_by(|a, b| b.cmp(a));
        let depth: usize = counts.iter().take(2).sum();
        u32::try_from(depth).unwrap_or(u32::MAX)
    }
}
