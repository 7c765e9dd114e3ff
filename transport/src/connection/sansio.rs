//! [`ConnectionCore`]: one side of a connection, sans-IO. It owns the tiered send and
//! receive regions, the credits, the negotiation and the reassembly; it takes completions
//! and the time as inputs and hands out work requests (post this slot as a receive, post
//! these bytes as a send) for a provider endpoint to execute. `docs/connection.md` gives
//! the rules it follows.
//!
//! # Invariants
//!
//! - Every frame is posted against a credit, and is no longer than the receive that credit
//!   stands for (`Credits`, rule 1): a frame can never overrun the peer's buffer.
//! - Every posted receive holds its slot in `posted` until its completion; every posted
//!   send holds its slot in `sending` until its completion. A send the provider copied
//!   straight from the caller's message ([`ConnectionCore::try_send_copied`]) holds no
//!   slot there, only its place until its completion. A slot of a replaced tier is
//!   never reposted, so the tier retires once its last slot comes back. Over SEND/RECV a
//!   peer can write only into posted receives, so "every slot back" is also "the peer can no
//!   longer reach it": the receive region installs a new tier without waiting for a release.
//! - `send_tier_in_force` and `recv_tier_in_force` are the tiers in force of `send_region` and
//!   `recv_region`: the core alone changes those regions' tiers, and takes the new tier
//!   right after each install. Slots are taken from them directly, so the hot path does
//!   not load the regions' swap cells.
//! - `reserved` holds the send slot of a message being built in place, with its length;
//!   the slot is neither posted nor spare, and no credit is taken for it until it is
//!   committed. The core never writes its payload.
//! - `copied_from` is set only during [`ConnectionCore::try_send_copied`]: a data frame
//!   whose payload lies in that message, of a length the provider takes from the caller's
//!   memory, is handed out as
//!   [`WorkRequest::PostSendCopied`] with its send slot reserved in `sending` and unwritten,
//!   and the driver settles it ([`ConnectionCore::settle_copied`]) before the message is
//!   gone: the slot goes back to the spares, or the frame is written into it and posted.
//! - `returns_to_lend` holds at least one reference to `returned` per posted receive
//!   (topped up as receives are posted), so a delivery lends its slot to the message
//!   without touching a reference count; `lent` counts the slots lent, and those held by
//!   messages now are `lent` less the count `returned` keeps of those given back.
//! - `spare_send_slots` holds send slots whose sends completed, all of the send tier in
//!   force, for the next frames: a slot goes back to its pool only when the send tier
//!   changes, which empties the list, so a replaced tier can still retire.
//! - A message is delivered whole or not at all, in the order it was sent; a malformed
//!   frame fails the connection with an error that names it, and nothing after it is
//!   delivered.

use std::collections::VecDeque;
use std::fmt;
use std::io::IoSlice;
use std::ops::Deref;
use std::sync::Arc;
use std::time::{Duration, Instant};

use slab::Slab;
use tierbuf_tiers::ladder::TierLadder;
use tierbuf_tiers::negotiation::{FailureCause, RequestStatus};
use tierbuf_tiers::policy::DemotionTracker;
use tierbuf_tiers::wire::{self, ControlMessage, NackReason, WireError};
use tierbuf_tiers::{
    Event, Negotiation, NegotiationConfig, OwnedTierSlot, Reservoir, Tier, TierError, TierIndex,
    TieredRegion,
};

use super::credits::{Credits, PendingGrants};
use super::header::{FrameHeader, FrameKind, Grant, HEADER_LEN, HeaderError};
use super::reassembly::{Reassembly, ReassemblyError};
use super::returns::{LentBuffer, LentSlot, ReturnedSlots};
use crate::provider::{BufferRef, CallerCopies};
use crate::sync;

/// How a connection is set up; both sides must use the same ladder.
#[derive(Debug, Clone)]
pub struct ConnectionConfig {
    ladder: Arc<TierLadder>,
    negotiation: NegotiationConfig,
    max_message_len: u64,
    spare_buffer_limit: usize,
}

/// Why a configuration, or a connection, failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConnectionError {
    /// The smallest tier cannot carry a control frame and its header.
    #[error("tier 0 slots of {slot_size} bytes cannot carry a {needed}-byte control frame")]
    SmallestTierTooSmall {
        /// Tier 0's slot size.
        slot_size: usize,
        /// Header plus the largest control frame.
        needed: usize,
    },
    /// A tier has fewer than two slots: one credit is always kept back, so a tier of one
    /// slot could carry no data.
    #[error("{tier} has {slot_count} slot(s); a connection needs at least 2 per tier")]
    TooFewSlots {
        /// The tier.
        tier: TierIndex,
        /// Its slot count.
        slot_count: usize,
    },
    /// The ladder cannot be negotiated (see the source).
    #[error("the ladder cannot be negotiated")]
    Negotiation(#[source] tierbuf_tiers::negotiation::ConfigError),
    /// Registering a tier failed while setting up.
    #[error("registering the connection's buffers failed")]
    Tier(#[source] TierError),
    /// A frame's header was malformed.
    #[error("malformed frame header")]
    Header(#[source] HeaderError),
    /// Segments arrived out of order or with wrong lengths.
    #[error("malformed segmented message")]
    Reassembly(#[source] ReassemblyError),
    /// A control frame was malformed.
    #[error("malformed control frame")]
    Wire(#[source] WireError),
    /// The peer granted receives of a tier past the ladder.
    #[error("the peer granted receives of tier {tier}, past the ladder's {len} tiers")]
    GrantBeyondLadder {
        /// The tier named.
        tier: u8,
        /// Tiers on the ladder.
        len: usize,
    },
    /// A completion named a work request that is not outstanding.
    #[error("completion for unknown {kind:?} work request {wr_id}")]
    UnknownWorkRequest {
        /// The kind of work request.
        kind: WorkKind,
        /// Its id.
        wr_id: u64,
    },
    /// The peer broke the negotiation protocol.
    #[error("the peer broke the negotiation protocol: {0}")]
    ProtocolViolation(String),
    /// The provider reported a failed work request or a dead peer.
    #[error("the provider failed: {0}")]
    Provider(String),
    /// The connection was closed.
    #[error("the connection is closed")]
    Closed,
}

impl ConnectionConfig {
    /// A configuration for `ladder`: requests re-sent every 100 ms, given up after 5 sends,
    /// messages up to 64 MiB.
    ///
    /// ```
    /// use std::sync::Arc;
    /// use tierbuf_tiers::ladder::TierLadder;
    /// use tierbuf_transport::connection::ConnectionConfig;
    /// let config = ConnectionConfig::new(Arc::new(TierLadder::preset("patent")?))?;
    /// assert_eq!(config.max_message_len(), 64 << 20);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn new(ladder: Arc<TierLadder>) -> Result<ConnectionConfig, ConnectionError> {
        let needed = HEADER_LEN + wire::MAX_FRAME_LEN;
        let smallest = ladder.tiers()[0].slot_size();
        if smallest < needed {
            return Err(ConnectionError::SmallestTierTooSmall {
                slot_size: smallest,
                needed,
            });
        }
        if let Some((tier, spec)) = ladder.iter().find(|(_, spec)| spec.slot_count() < 2) {
            return Err(ConnectionError::TooFewSlots {
                tier,
                slot_count: spec.slot_count(),
            });
        }
        let negotiation = NegotiationConfig::for_ladder(&ladder, Duration::from_millis(100), 5)
            .map_err(ConnectionError::Negotiation)?;
        Ok(ConnectionConfig {
            ladder,
            negotiation,
            max_message_len: 64 << 20,
            spare_buffer_limit: DEFAULT_SPARE_BUFFER_LIMIT,
        })
    }

    /// Sets the largest heap buffer a connection keeps, per direction, for reuse by the
    /// next segmented message (the sender's copy of it, the receiver's reassembly); a
    /// larger one is allocated for its message and freed after it. Kept buffers are freed
    /// once the connection has seen no segmented message for the ladder's `demote_after`.
    /// Default 4 MiB; 0 keeps none.
    pub fn with_spare_buffer_limit(mut self, bytes: usize) -> ConnectionConfig {
        self.spare_buffer_limit = bytes;
        self
    }

    /// The largest heap buffer kept for reuse per direction.
    pub fn spare_buffer_limit(&self) -> usize {
        self.spare_buffer_limit
    }

    /// Sets the longest message either side may send.
    pub fn with_max_message_len(mut self, max_message_len: u64) -> ConnectionConfig {
        self.max_message_len = max_message_len;
        self
    }

    /// Sets how often an unanswered tier request is re-sent and how many sends it gets.
    pub fn with_request_timeout(
        mut self,
        request_timeout: Duration,
        max_attempts: u32,
    ) -> Result<ConnectionConfig, ConnectionError> {
        self.negotiation =
            NegotiationConfig::for_ladder(&self.ladder, request_timeout, max_attempts)
                .map_err(ConnectionError::Negotiation)?;
        Ok(self)
    }

    /// The ladder.
    pub fn ladder(&self) -> &Arc<TierLadder> {
        &self.ladder
    }

    /// The longest message either side may send.
    pub fn max_message_len(&self) -> u64 {
        self.max_message_len
    }

    /// The largest message payload one frame carries on `tier`: the slot less the header,
    /// and no more than the tier's promotion threshold.
    fn whole_capacity(&self, tier: TierIndex) -> usize {
        self.ladder.tier(tier).map_or(0, |spec| {
            (spec.slot_size() - HEADER_LEN).min(spec.promote_threshold())
        })
    }

    /// The payload one frame can carry into a receive of `tier`.
    fn frame_capacity(&self, tier: u8) -> usize {
        self.ladder
            .tier(TierIndex::new(tier))
            .map_or(0, |spec| spec.slot_size() - HEADER_LEN)
    }

    /// The smallest tier whose frames carry `len` bytes whole.
    fn tier_for(&self, len: usize) -> Option<TierIndex> {
        self.ladder
            .iter()
            .map(|(tier, _)| tier)
            .find(|&tier| self.whole_capacity(tier) >= len)
    }
}

/// [`ConnectionConfig::spare_buffer_limit`] unless set.
const DEFAULT_SPARE_BUFFER_LIMIT: usize = 4 << 20;

/// Which queue a work request went to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WorkKind {
    /// The send queue.
    Send,
    /// The receive queue.
    Recv,
}

/// What the core asks its provider endpoint to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum WorkRequest {
    /// Post `buffer` as a receive.
    PostRecv {
        /// The id its completion will carry.
        wr_id: u64,
        /// The receive buffer.
        buffer: BufferRef,
    },
    /// Post `buffer` as a send.
    PostSend {
        /// The id its completion will carry.
        wr_id: u64,
        /// The bytes to send.
        buffer: BufferRef,
    },
    /// Send the frame, copied by the provider from the message given to
    /// [`ConnectionCore::try_send_copied`] (`Endpoint::try_post_send_copied`); then settle
    /// it with [`ConnectionCore::settle_copied`], before that message is gone, whether or
    /// not the provider took it. Only `try_send_copied` hands these out.
    PostSendCopied(CopiedFrame),
}

/// A frame whose payload lies in the caller's message ([`WorkRequest::PostSendCopied`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CopiedFrame {
    /// The id its completion will carry.
    pub wr_id: u64,
    /// The frame's header, to send first.
    pub header: [u8; HEADER_LEN],
    payload_at: usize,
    payload_len: usize,
}

impl CopiedFrame {
    /// The frame's payload in `message`, the message given to
    /// [`ConnectionCore::try_send_copied`].
    ///
    /// # Panics
    ///
    /// If `message` is shorter than that message.
    pub fn payload<'m>(&self, message: &'m [u8]) -> &'m [u8] {
        &message[self.payload_at..self.payload_at + self.payload_len]
    }
}

/// Why `try_send` accepted nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum WouldBlock {
    /// The message needs a larger tier and its promotion is under way: the patent's
    /// "0 bytes transferred". Retry after progress.
    PromotionPending,
    /// No credit (posted receive on the peer) or no send buffer is free now.
    NoCredit,
    /// A segmented message is still being sent.
    SegmentedInFlight,
    /// A message built in place needs a larger tier, which the peer refused for now:
    /// retry later, or send it with `try_send`, which segments it.
    PromotionRefused,
    /// A message is already being built in place: commit or cancel it first.
    AlreadyReserved,
}

/// Why a send was not accepted.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SendError {
    /// Nothing was accepted now; retry after progress.
    #[error("would block: {0:?}")]
    WouldBlock(WouldBlock),
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
    /// [`ConnectionCore::commit_reserved`] was called with no message reserved.
    #[error("no message is reserved")]
    NothingReserved,
    /// [`ConnectionCore::try_send_borrowed`] was offered something other than the rest of
    /// the segmented message it is posting.
    #[error("{offered} bytes offered where the rest of a segmented message is {expected}")]
    NotTheRest {
        /// The bytes of the message not yet posted.
        expected: usize,
        /// The bytes offered.
        offered: usize,
    },
    /// The connection failed or was closed.
    #[error("the connection failed")]
    Failed(#[source] Arc<ConnectionError>),
}

/// Counters and the state of one side of a connection.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ConnectionStats {
    /// The tier this side sends on.
    pub send_tier: u8,
    /// The tier of the receives this side posts.
    pub recv_tier: u8,
    /// Changes to a higher send tier.
    pub promotions: u64,
    /// Changes to a lower send tier.
    pub demotions: u64,
    /// Tier requests the peer refused.
    pub nacks: u64,
    /// Tier requests that timed out.
    pub timeouts: u64,
    /// Messages accepted for sending.
    pub messages_sent: u64,
    /// Bytes of accepted messages.
    pub bytes_sent: u64,
    /// Messages delivered.
    pub messages_received: u64,
    /// Bytes of delivered messages.
    pub bytes_received: u64,
    /// Frames posted (data, control, credit and drain).
    pub frames_sent: u64,
    /// Bytes registered for this side's send and receive regions now.
    pub registered_bytes: u64,
    /// Receives this side has posted whose completions have not come back.
    pub posted_receives: u64,
    /// Receive slots held by delivered zero-copy messages not yet dropped: they are
    /// reposted (and granted to the peer) only once their messages are dropped.
    pub receives_lent: u64,
    /// Receives the peer has granted this side and it has not yet sent into.
    pub send_credits: u64,
    /// Heap bytes kept for reuse by the next segmented message (this side's copy of one
    /// it sends, its reassembly buffer for one it receives); see
    /// [`ConnectionConfig::with_spare_buffer_limit`].
    pub spare_buffer_bytes: u64,
}

/// A message in flight as segments.
struct Outbox {
    message: OutboxBytes,
    /// Bytes of it already posted.
    sent: usize,
}

/// Where a segmented message's bytes are.
enum OutboxBytes {
    /// Copied by `try_send`; the core posts the segments as credits allow.
    Owned(Vec<u8>),
    /// Left with the caller of `try_send_borrowed`, who offers the rest of this many
    /// bytes again until all are posted.
    Borrowed(usize),
}

impl Outbox {
    fn len(&self) -> usize {
        match &self.message {
            OutboxBytes::Owned(bytes) => bytes.len(),
            OutboxBytes::Borrowed(len) => *len,
        }
    }
}

/// The message [`ConnectionCore::try_send_copied`] is sending: where it lies, and which
/// frames the provider takes from the caller's memory.
#[derive(Debug, Clone, Copy)]
struct CopiedFrom {
    addr: usize,
    len: usize,
    copies: CallerCopies,
}

/// One side of a connection, driven by its owner.
pub struct ConnectionCore {
    config: Arc<ConnectionConfig>,
    send_region: TieredRegion,
    recv_region: TieredRegion,
    /// `send_region`'s tier in force (module invariants).
    send_tier_in_force: sync::Arc<Tier>,
    /// `recv_region`'s tier in force (module invariants).
    recv_tier_in_force: sync::Arc<Tier>,
    negotiation: Negotiation,
    credits: Credits,
    grants: PendingGrants,
    reassembly: Reassembly,
    posted: Slab<OwnedTierSlot>,
    /// The slot of each send posted and not completed; `None` for one copied from the
    /// caller's message (module invariants).
    sending: Slab<Option<OwnedTierSlot>>,
    /// The message `try_send_copied` is sending (module invariants).
    copied_from: Option<CopiedFrom>,
    /// Send slots of the tier in force whose sends completed (module invariants).
    spare_send_slots: Vec<OwnedTierSlot>,
    /// The slot and length of a message being built in place (module invariants).
    reserved: Option<(OwnedTierSlot, usize)>,
    work: VecDeque<WorkRequest>,
    delivered: VecDeque<Message>,
    returned: sync::Arc<ReturnedSlots>,
    /// References to `returned` for the messages of the receives posted: one per posted
    /// receive, cloned when it is posted (module invariants).
    returns_to_lend: Vec<sync::Arc<ReturnedSlots>>,
    /// Receive slots lent to messages, ever.
    lent: usize,
    control: VecDeque<ControlMessage>,
    outbox: Option<Outbox>,
    /// A finished outbox's buffer, empty, kept for the next segmented message.
    spare_outbox: Vec<u8>,
    /// When a segmented message was last sent or received; spare buffers are freed after
    /// the ladder's `demote_after` without one.
    segmented_at: Option<Instant>,
    drains_owed: u32,
    refused: Option<(TierIndex, Instant)>,
    /// When the send tier may step down (`tiers::policy`).
    demotion: DemotionTracker,
    failed: Option<Arc<ConnectionError>>,
    stats: ConnectionStats,
}

impl ConnectionCore {
    /// One side of a new connection on tier 0, its send buffers from `send_reservoir` and
    /// its receive buffers from `recv_reservoir` (both for `config`'s ladder). Posts every
    /// tier-0 receive at once (see [`ConnectionCore::poll_work`]); the peer's tier-0
    /// receives are this side's first credits.
    pub fn new(
        config: Arc<ConnectionConfig>,
        send_reservoir: Arc<Reservoir>,
        recv_reservoir: Arc<Reservoir>,
        now: Instant,
    ) -> Result<ConnectionCore, ConnectionError> {
        let send_region = TieredRegion::new(send_reservoir).map_err(ConnectionError::Tier)?;
        let recv_region = TieredRegion::new(recv_reservoir).map_err(ConnectionError::Tier)?;
        let spare_buffer_limit = config.spare_buffer_limit;
        let smallest = &config.ladder.tiers()[0];
        let mut credits = Credits::default();
        credits.grant(Grant {
            tier: 0,
            count: u16::try_from(smallest.slot_count()).unwrap_or(u16::MAX),
        });
        let mut core = ConnectionCore {
            demotion: DemotionTracker::new(Arc::clone(&config.ladder), now),
            negotiation: Negotiation::new(config.negotiation.clone()),
            reassembly: Reassembly::new(config.max_message_len),
            config,
            send_tier_in_force: send_region.current(),
            recv_tier_in_force: recv_region.current(),
            send_region,
            recv_region,
            credits,
            grants: PendingGrants::default(),
            posted: Slab::new(),
            sending: Slab::new(),
            copied_from: None,
            spare_send_slots: Vec::new(),
            reserved: None,
            work: VecDeque::new(),
            delivered: VecDeque::new(),
            returned: ReturnedSlots::new(spare_buffer_limit),
            returns_to_lend: Vec::new(),
            lent: 0,
            control: VecDeque::new(),
            outbox: None,
            spare_outbox: Vec::new(),
            segmented_at: None,
            drains_owed: 0,
            refused: None,
            failed: None,
            stats: ConnectionStats::default(),
        };
        core.post_receives();
        // The peer counts our tier-0 receives as its initial credits: they are not granted.
        core.grants = PendingGrants::default();
        Ok(core)
    }

    /// The next work request for the provider endpoint, in order.
    pub fn poll_work(&mut self) -> Option<WorkRequest> {
        self.work.pop_front()
    }

    /// The next delivered message, in the order the peer sent them.
    pub fn try_recv(&mut self) -> Option<Message> {
        self.delivered.pop_front()
    }

    /// The next time [`ConnectionCore::progress`] must run even if nothing arrives: a
    /// negotiation timer, or the moment the send tier may step down.
    pub fn poll_timeout(&self) -> Option<Instant> {
        match (
            self.negotiation.poll_timeout(),
            self.demotion.next_deadline(),
        ) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Counters and state now.
    pub fn stats(&self) -> ConnectionStats {
        ConnectionStats {
            send_tier: self.send_tier().get(),
            recv_tier: self.recv_tier_in_force.index().get(),
            registered_bytes: self.send_region.registered_bytes()
                + self.recv_region.registered_bytes(),
            posted_receives: self.posted.len() as u64,
            receives_lent: (self.lent - self.returned.given_back()) as u64,
            send_credits: u64::from(self.credits.total()),
            spare_buffer_bytes: (self.spare_outbox.capacity()
                + self.returned.spare_buffer_capacity()) as u64,
            ..self.stats
        }
    }

    /// The error the connection failed with, if it did.
    pub fn failure(&self) -> Option<&Arc<ConnectionError>> {
        self.failed.as_ref()
    }

    /// Fails the connection with `error` (a provider failure, say): sends and receives
    /// report it from now on.
    pub fn fail(&mut self, error: ConnectionError) {
        if self.failed.is_none() {
            tracing::warn!(%error, "connection failed");
            self.failed = Some(Arc::new(error));
        }
    }

    /// The tier the peer has granted this side to send on.
    pub fn send_tier(&self) -> TierIndex {
        self.negotiation.outbound_grant().tier
    }

    /// Whether everything accepted has been posted and every posted send completed.
    pub fn is_idle(&self) -> bool {
        self.outbox.is_none() && self.control.is_empty() && self.sending.is_empty()
    }

    /// Offers a message given as an I/O vector, without blocking. Returns the bytes
    /// accepted: all of them; or, when the message does not fit the tier in force but its
    /// first element does, the longest prefix of whole elements that fits (patent Figure
    /// 5; send the rest with another call). When the first element does not fit, a
    /// promotion is asked for and [`WouldBlock::PromotionPending`] returned. A message
    /// larger than the top tier, or one whose promotion the peer refused, is sent in
    /// segments and delivered as one message.
    pub fn try_send(&mut self, now: Instant, message: &[IoSlice<'_>]) -> Result<usize, SendError> {
        let accepted = self.offer(now, message, false)?;
        self.record_need(now, accepted);
        Ok(accepted)
    }

    /// [`ConnectionCore::try_send`] for a message in one slice that is not copied if it
    /// has to be segmented: the segments are posted straight from `message` as credits
    /// and send slots allow, and the bytes posted are returned; the caller offers the rest
    /// (`&message[accepted..]`) in later calls until all of it is posted. Until then the
    /// message holds the send order: [`ConnectionCore::try_send`] and
    /// [`ConnectionCore::try_reserve`] report [`WouldBlock::SegmentedInFlight`], and the
    /// core's progress does not post its segments (it does not have the bytes). A call
    /// that offers anything but the rest fails with [`SendError::NotTheRest`]; one that
    /// can post nothing now reports [`WouldBlock::NoCredit`] (offer the same rest again).
    /// A message sent in one frame is posted whole, as by `try_send`.
    pub fn try_send_borrowed(&mut self, now: Instant, message: &[u8]) -> Result<usize, SendError> {
        if let Some(error) = &self.failed {
            return Err(SendError::Failed(Arc::clone(error)));
        }
        let accepted = match &self.outbox {
            Some(Outbox {
                message: OutboxBytes::Borrowed(len),
                sent,
            }) => {
                let rest = len - sent;
                if message.len() != rest {
                    return Err(SendError::NotTheRest {
                        expected: rest,
                        offered: message.len(),
                    });
                }
                self.post_borrowed_segments(message)
            }
            _ => {
                let accepted = self.offer(now, &[IoSlice::new(message)], true)?;
                // The need is the whole message's, recorded once, however it is posted.
                self.record_need(now, message.len());
                accepted
            }
        };
        if accepted == 0 && !message.is_empty() {
            // A segmented message taken on with no segment posted yet: offer it again.
            return Err(SendError::WouldBlock(WouldBlock::NoCredit));
        }
        Ok(accepted)
    }

    /// Whether sending or reserving a message of `len` bytes needs the time. It does not
    /// for a message that a frame of the smallest tier carries whole, while no negotiation
    /// event waits: such a send starts no promotion and tells the demotion policy nothing
    /// (every tier fits it), so [`ConnectionCore::try_send`],
    /// [`ConnectionCore::try_reserve`] and [`ConnectionCore::commit_reserved`] do not read
    /// their `now`, and a driver may pass the last time it read instead of reading the
    /// clock again.
    pub fn needs_clock(&self, len: usize) -> bool {
        self.negotiation.has_events() || len > self.config.whole_capacity(TierIndex::SMALLEST)
    }

    /// Tells the demotion tracker that the send tier was needed for `len` bytes, so it can
    /// step down later; a length the smallest tier carries tells it nothing.
    fn record_need(&mut self, now: Instant, len: usize) {
        if len > self.config.whole_capacity(TierIndex::SMALLEST) {
            self.demotion.record(now, len);
        }
    }

    /// Reserves a registered send slot for a message of `len` bytes to be built in place
    /// ([`ConnectionCore::reserved_mut`]) and sent by [`ConnectionCore::commit_reserved`],
    /// saving the copy `try_send` makes. It succeeds when the message fits one frame of
    /// the send tier in force and a data credit and a send slot are free; the credit is
    /// taken only at the commit. A message that needs a larger tier asks for it, as
    /// `try_send` does, and reports [`WouldBlock::PromotionPending`]; one past the top
    /// tier's frame is refused ([`SendError::BeyondOneFrame`]).
    pub fn try_reserve(&mut self, now: Instant, len: usize) -> Result<(), SendError> {
        if let Some(error) = &self.failed {
            return Err(SendError::Failed(Arc::clone(error)));
        }
        if self.reserved.is_some() {
            return Err(SendError::WouldBlock(WouldBlock::AlreadyReserved));
        }
        self.handle_events(now);
        let negotiated = self.send_tier();
        let tier = negotiated.min(self.send_tier_in_force.index());
        if len > self.config.whole_capacity(tier) {
            let top = self.config.ladder.top();
            let Some(target) = self.config.tier_for(len) else {
                return Err(SendError::BeyondOneFrame {
                    len,
                    max: self.config.whole_capacity(top),
                });
            };
            if self.refusal_holds(now, target) || target <= negotiated {
                // Refused by the peer, or granted but this side's own send buffers could
                // not follow (its budget refused them).
                return Err(SendError::WouldBlock(WouldBlock::PromotionRefused));
            }
            self.request_promotion(now, target)?;
            return self.try_reserve(now, len);
        }
        if self.outbox.is_some() {
            return Err(SendError::WouldBlock(WouldBlock::SegmentedInFlight));
        }
        if self.frame_credit(len, true).is_none() {
            return Err(SendError::WouldBlock(WouldBlock::NoCredit));
        }
        let slot = self
            .acquire_send_slot(HEADER_LEN + len)
            .ok_or(SendError::WouldBlock(WouldBlock::NoCredit))?;
        self.reserved = Some((slot, len));
        Ok(())
    }

    /// The payload of the message reserved by [`ConnectionCore::try_reserve`]; `None`
    /// when none is reserved.
    pub fn reserved(&self) -> Option<&[u8]> {
        let (slot, len) = self.reserved.as_ref()?;
        Some(&slot[HEADER_LEN..HEADER_LEN + *len])
    }

    /// The payload of the message reserved by [`ConnectionCore::try_reserve`], to be
    /// written in place; `None` when none is reserved.
    pub fn reserved_mut(&mut self) -> Option<&mut [u8]> {
        let (slot, len) = self.reserved.as_mut()?;
        Some(&mut slot[HEADER_LEN..HEADER_LEN + *len])
    }

    /// Sends the reserved message as it stands in its slot: takes the credit, writes the
    /// header and posts it. Returns its length. The message stays reserved when the
    /// credit was spent meanwhile ([`WouldBlock::NoCredit`]; a caller that sends nothing
    /// else between reserving and committing never sees it).
    pub fn commit_reserved(&mut self, now: Instant) -> Result<usize, SendError> {
        if let Some(error) = &self.failed {
            return Err(SendError::Failed(Arc::clone(error)));
        }
        let Some((_, len)) = self.reserved else {
            return Err(SendError::NothingReserved);
        };
        if self.outbox.is_some() {
            return Err(SendError::WouldBlock(WouldBlock::SegmentedInFlight));
        }
        if self.frame_credit(len, true).is_none() {
            return Err(SendError::WouldBlock(WouldBlock::NoCredit));
        }
        let (slot, len) = self.reserved.take().expect("checked above");
        let header = FrameHeader {
            kind: FrameKind::Whole,
            grant: Grant { tier: 0, count: 0 },
            payload_len: len as u32,
            message_len: len as u64,
        };
        self.post_slot(header, slot);
        self.stats.messages_sent += 1;
        self.stats.bytes_sent += len as u64;
        self.record_need(now, len);
        Ok(len)
    }

    /// Gives the reserved message's slot back unsent.
    pub fn cancel_reserved(&mut self) {
        if let Some((slot, _)) = self.reserved.take() {
            self.keep_send_slot(slot);
        }
    }

    /// The send decision of `try_send` (`borrow` false) and `try_send_borrowed` (`borrow`
    /// true, `message` one slice): whole, a prefix, a promotion, or segments.
    fn offer(
        &mut self,
        now: Instant,
        message: &[IoSlice<'_>],
        borrow: bool,
    ) -> Result<usize, SendError> {
        if let Some(error) = &self.failed {
            return Err(SendError::Failed(Arc::clone(error)));
        }
        // Act on what arrived since the last progress (a nack, an ack) before deciding.
        self.handle_events(now);
        let total: usize = message.iter().map(|part| part.len()).sum();
        if total as u64 > self.config.max_message_len {
            return Err(SendError::TooLong {
                len: total as u64,
                max: self.config.max_message_len,
            });
        }
        // Frames are bounded by the negotiated tier (the peer's receives) and by this
        // side's send slots, which stay smaller when its own budget refused to follow.
        let negotiated = self.send_tier();
        let tier = negotiated.min(self.send_tier_in_force.index());
        let capacity = self.config.whole_capacity(tier);
        if total <= capacity {
            return self.send_whole(message, total);
        }
        let first = message.first().map_or(0, |part| part.len());
        if first <= capacity {
            let mut prefix = 0;
            let mut elements = 0;
            for part in message {
                if prefix + part.len() > capacity {
                    break;
                }
                prefix += part.len();
                elements += 1;
            }
            return self.send_whole(&message[..elements], prefix);
        }
        let target = self
            .config
            .tier_for(first)
            .unwrap_or(self.config.ladder.top());
        if target > negotiated && !self.refusal_holds(now, target) {
            self.request_promotion(now, target)?;
            return self.offer(now, message, borrow);
        }
        if self.negotiation.pending_request().is_some() {
            return Err(SendError::WouldBlock(WouldBlock::PromotionPending));
        }
        if self.outbox.is_some() {
            return Err(SendError::WouldBlock(WouldBlock::SegmentedInFlight));
        }
        self.segmented_at = Some(now);
        self.stats.messages_sent += 1;
        self.stats.bytes_sent += total as u64;
        if borrow {
            self.outbox = Some(Outbox {
                message: OutboxBytes::Borrowed(total),
                sent: 0,
            });
            let whole = message.first().map_or(&[][..], |part| &part[..]);
            return Ok(self.post_borrowed_segments(whole));
        }
        let mut copy = std::mem::take(&mut self.spare_outbox);
        copy.reserve(total);
        for part in message {
            copy.extend_from_slice(part);
        }
        self.outbox = Some(Outbox {
            message: OutboxBytes::Owned(copy),
            sent: 0,
        });
        self.send_segments();
        Ok(total)
    }

    /// Whether the peer's refusal of `target` (or a smaller tier) still holds at `now`.
    fn refusal_holds(&self, now: Instant, target: TierIndex) -> bool {
        self.refused
            .is_some_and(|(refused, until)| refused <= target && now < until)
    }

    /// Asks the peer for `target` to send on. `Ok` when it is in force already (offer the
    /// message again); [`WouldBlock::PromotionPending`] once asked; a request the
    /// negotiation rejects fails the connection.
    fn request_promotion(&mut self, now: Instant, target: TierIndex) -> Result<(), SendError> {
        match self.negotiation.request_tier(now, target) {
            Ok(RequestStatus::InForce) => Ok(()),
            Ok(_) => Err(SendError::WouldBlock(WouldBlock::PromotionPending)),
            Err(error) => {
                let error = Arc::new(ConnectionError::ProtocolViolation(error.to_string()));
                self.failed = Some(Arc::clone(&error));
                Err(SendError::Failed(error))
            }
        }
    }

    /// Sends `len` bytes of `parts` as one whole frame, if a data credit whose receive
    /// holds it and a send slot are free.
    fn send_whole(&mut self, parts: &[IoSlice<'_>], len: usize) -> Result<usize, SendError> {
        if self.outbox.is_some() {
            return Err(SendError::WouldBlock(WouldBlock::SegmentedInFlight));
        }
        let header = FrameHeader {
            kind: FrameKind::Whole,
            grant: Grant { tier: 0, count: 0 },
            payload_len: len as u32,
            message_len: len as u64,
        };
        if !self.post_frame(header, parts, true) {
            return Err(SendError::WouldBlock(WouldBlock::NoCredit));
        }
        self.stats.messages_sent += 1;
        self.stats.bytes_sent += len as u64;
        Ok(len)
    }

    /// Posts one frame: takes a send slot and a credit (a data credit when `data`), writes
    /// the header (with the oldest pending grant) and the payload, and queues the send.
    /// Returns false, consuming nothing, when no slot or credit is free or the payload does
    /// not fit.
    fn post_frame(&mut self, header: FrameHeader, payload: &[IoSlice<'_>], data: bool) -> bool {
        let len = header.payload_len as usize;
        if self.frame_credit(len, data).is_none() {
            return false;
        }
        let Some(mut slot) = self.acquire_send_slot(HEADER_LEN + len) else {
            return false;
        };
        if let Some(payload_at) = self.copied_range(payload) {
            self.post_copied(header, slot, payload_at);
            return true;
        }
        let mut at = HEADER_LEN;
        for part in payload {
            let take = part.len().min(HEADER_LEN + len - at);
            slot[at..at + take].copy_from_slice(&part[..take]);
            at += take;
        }
        self.post_slot(header, slot);
        true
    }

    /// The tier of the credit a frame of `len` payload bytes would take (a data credit
    /// when `data`), if one is free and its receive holds the frame.
    fn frame_credit(&self, len: usize, data: bool) -> Option<u8> {
        let usable = if data {
            self.credits.has_data_credit()
        } else {
            self.credits.total() > 0
        };
        self.credits
            .next_tier()
            .filter(|&tier| usable && len <= self.config.frame_capacity(tier))
    }

    /// Takes the credit [`ConnectionCore::frame_credit`] found, writes `header` (with the
    /// oldest pending grant) into `slot`, whose payload is in place, and queues the send.
    fn post_slot(&mut self, mut header: FrameHeader, mut slot: OwnedTierSlot) {
        let len = header.payload_len as usize;
        self.credits.take();
        header.grant = self.grants.take();
        header.encode(&mut slot[..HEADER_LEN]);
        let buffer = BufferRef {
            remote_key: slot.keys().remote_key,
            addr: slot.remote_addr(),
            len: (HEADER_LEN + len) as u32,
        };
        let wr_id = self.sending.insert(Some(slot)) as u64;
        self.work.push_back(WorkRequest::PostSend { wr_id, buffer });
        self.stats.frames_sent += 1;
    }

    /// Where `payload` starts in the message `try_send_copied` is sending, if it is one
    /// part of it and its frame has a length the provider takes from the caller's memory.
    fn copied_range(&self, payload: &[IoSlice<'_>]) -> Option<usize> {
        let copied = self.copied_from?;
        let [part] = payload else {
            return None;
        };
        if !copied.copies.takes(HEADER_LEN + part.len()) {
            return None;
        }
        let start = (part.as_ptr() as usize).checked_sub(copied.addr)?;
        (start.checked_add(part.len())? <= copied.len).then_some(start)
    }

    /// [`ConnectionCore::post_slot`] for a frame whose payload the provider may copy from
    /// the caller's message, where it starts at `payload_at`: takes the credit, encodes
    /// the header, and reserves `slot` (unwritten) until [`ConnectionCore::settle_copied`].
    fn post_copied(&mut self, mut header: FrameHeader, slot: OwnedTierSlot, payload_at: usize) {
        self.credits.take();
        header.grant = self.grants.take();
        let mut encoded = [0u8; HEADER_LEN];
        header.encode(&mut encoded);
        let wr_id = self.sending.insert(Some(slot)) as u64;
        self.work
            .push_back(WorkRequest::PostSendCopied(CopiedFrame {
                wr_id,
                header: encoded,
                payload_at,
                payload_len: header.payload_len as usize,
            }));
        self.stats.frames_sent += 1;
    }

    /// Sends `message` as [`ConnectionCore::try_send_borrowed`] does, but hands out its
    /// data frames whose length (header and payload) `copies` takes as
    /// [`WorkRequest::PostSendCopied`], for a provider that can copy them straight from
    /// `message` into the peer's receives (saving the copy into a send slot):
    /// `copies` is the provider's `Endpoint::caller_copies`. The caller settles every one
    /// of them ([`ConnectionCore::settle_copied`]) before it lets go of `message`.
    ///
    /// ```
    /// use std::sync::Arc;
    /// use std::time::Instant;
    /// use tierbuf_pool::{HostRegistrar, MemoryBudget};
    /// use tierbuf_tiers::{Reservoir, ladder::TierLadder};
    /// use tierbuf_transport::CallerCopies;
    /// use tierbuf_transport::connection::{ConnectionConfig, ConnectionCore, WorkRequest};
    ///
    /// let ladder = TierLadder::builder().tier(8192, 4, 8000).build()?;
    /// let config = Arc::new(ConnectionConfig::new(Arc::new(ladder))?);
    /// let registrar = Arc::new(HostRegistrar::new(MemoryBudget::with_cap(1 << 20)));
    /// let reservoir = Arc::new(Reservoir::new(registrar, Arc::clone(config.ladder())));
    /// let now = Instant::now();
    /// let mut core =
    ///     ConnectionCore::new(config, Arc::clone(&reservoir), reservoir, now)?;
    /// while core.poll_work().is_some() {} // the first receives, posted elsewhere
    ///
    /// let copies = CallerCopies::new(None, Some(4096));
    /// let message = vec![7u8; 4096];
    /// assert_eq!(core.try_send_copied(now, &message, copies)?, message.len());
    /// let Some(WorkRequest::PostSendCopied(frame)) = core.poll_work() else {
    ///     panic!("a frame to copy from the message");
    /// };
    /// assert_eq!(frame.payload(&message), &message[..]);
    /// // The provider could not take it now: the frame goes through its send slot.
    /// let send = core.settle_copied(&frame, &message, false);
    /// assert!(matches!(send, Some(WorkRequest::PostSend { .. })));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn try_send_copied(
        &mut self,
        now: Instant,
        message: &[u8],
        copies: CallerCopies,
    ) -> Result<usize, SendError> {
        // With no length taken from the caller's memory this is `try_send_borrowed`.
        self.copied_from = (copies != CallerCopies::NONE).then_some(CopiedFrom {
            addr: message.as_ptr() as usize,
            len: message.len(),
            copies,
        });
        let accepted = self.try_send_borrowed(now, message);
        self.copied_from = None;
        accepted
    }

    /// Settles a [`WorkRequest::PostSendCopied`] of `frame`, with `message` the message
    /// given to [`ConnectionCore::try_send_copied`]: when the provider `copied` it, its
    /// reserved send slot goes back to the spares; when it did not, the frame is written
    /// into that slot, and the send to post instead is returned.
    ///
    /// # Panics
    ///
    /// If `frame` was already settled, or `message` is not the one its payload lies in.
    pub fn settle_copied(
        &mut self,
        frame: &CopiedFrame,
        message: &[u8],
        copied: bool,
    ) -> Option<WorkRequest> {
        let wr_id = frame.wr_id;
        let reserved = self
            .sending
            .get_mut(wr_id as usize)
            .and_then(Option::take)
            .expect("a copied send settled once, while outstanding");
        if copied {
            self.keep_send_slot(reserved);
            return None;
        }
        let mut slot = reserved;
        let payload = frame.payload(message);
        let len = HEADER_LEN + payload.len();
        slot[..HEADER_LEN].copy_from_slice(&frame.header);
        slot[HEADER_LEN..len].copy_from_slice(payload);
        let buffer = BufferRef {
            remote_key: slot.keys().remote_key,
            addr: slot.remote_addr(),
            len: len as u32,
        };
        self.sending[wr_id as usize] = Some(slot);
        Some(WorkRequest::PostSend { wr_id, buffer })
    }

    /// Keeps a send slot for the next frame if it lies in the send tier in force; gives it
    /// back to its pool otherwise.
    fn keep_send_slot(&mut self, slot: OwnedTierSlot) {
        if slot.lies_in(&self.send_tier_in_force) {
            self.spare_send_slots.push(slot);
        }
    }

    /// A send slot of at least `len` bytes: from the send tier in force, or, while that is
    /// too small (its promotion refused for memory), none.
    fn acquire_send_slot(&mut self, len: usize) -> Option<OwnedTierSlot> {
        let slot = match self.spare_send_slots.pop() {
            Some(slot) => slot,
            None => Tier::try_acquire_owned(&self.send_tier_in_force)?,
        };
        (slot.len() >= len).then_some(slot)
    }

    /// Sends as many segments of an owned outbox as credits allow.
    fn send_segments(&mut self) {
        if !matches!(
            self.outbox,
            Some(Outbox {
                message: OutboxBytes::Owned(_),
                ..
            })
        ) {
            return;
        }
        let Some(Outbox {
            message: OutboxBytes::Owned(bytes),
            sent,
        }) = self.outbox.take()
        else {
            unreachable!("an owned outbox was just seen");
        };
        let sent = sent + self.post_segments(&bytes[sent..], sent, bytes.len());
        if sent < bytes.len() {
            self.outbox = Some(Outbox {
                message: OutboxBytes::Owned(bytes),
                sent,
            });
        } else if bytes.capacity() <= self.config.spare_buffer_limit {
            let mut spare = bytes;
            spare.clear();
            self.spare_outbox = spare;
        }
    }

    /// Posts segments of the borrowed outbox from `rest`, its bytes not yet posted, as
    /// credits allow; returns how many bytes were posted.
    fn post_borrowed_segments(&mut self, rest: &[u8]) -> usize {
        let Some(outbox) = &self.outbox else {
            return 0;
        };
        let (sent, total) = (outbox.sent, outbox.len());
        let posted = self.post_segments(rest, sent, total);
        if sent + posted == total {
            self.outbox = None;
        } else if let Some(outbox) = &mut self.outbox {
            outbox.sent += posted;
        }
        posted
    }

    /// Posts segments of a `total`-byte message of which `sent` bytes are posted, from
    /// `rest` (the bytes after those), while credits and send slots allow; returns how
    /// many bytes it posted.
    fn post_segments(&mut self, rest: &[u8], sent: usize, total: usize) -> usize {
        let mut posted = 0;
        while sent + posted < total {
            let Some(credit_tier) = self.credits.next_tier() else {
                break;
            };
            let send_slot_len = self
                .config
                .ladder
                .tier(self.send_tier_in_force.index())
                .map_or(0, |spec| spec.slot_size());
            let room = self
                .config
                .frame_capacity(credit_tier)
                .min(send_slot_len - HEADER_LEN);
            let remaining = total - sent - posted;
            let first = sent + posted == 0;
            // A first segment leaves at least one byte for a later one: a message that
            // fits one frame goes out whole, never as a lone first segment.
            let chunk = if first {
                remaining.min(room).min(remaining - 1)
            } else {
                remaining.min(room)
            };
            let kind = match (first, chunk == remaining) {
                (true, _) => FrameKind::First,
                (false, true) => FrameKind::Last,
                (false, false) => FrameKind::Middle,
            };
            let header = FrameHeader {
                kind,
                grant: Grant { tier: 0, count: 0 },
                payload_len: chunk as u32,
                message_len: if first { total as u64 } else { 0 },
            };
            let segment = &rest[posted..posted + chunk];
            if !self.post_frame(header, &[IoSlice::new(segment)], true) {
                break;
            }
            posted += chunk;
        }
        posted
    }

    /// Runs the connection's own work: reposts returned receive slots, fires timers, acts
    /// on negotiation events, and sends control, drain, segment and credit frames.
    pub fn progress(&mut self, now: Instant) {
        if self.failed.is_some() {
            return;
        }
        // Free receive slots of the tier in force are posted when it is installed and
        // reposted as they come back, so nothing else needs posting here.
        while let Some(slot) = self.returned.take_returned() {
            self.recycle(slot);
        }
        if self.negotiation.poll_timeout().is_some_and(|at| at <= now) {
            self.negotiation.handle_timeout(now);
        }
        self.handle_events(now);
        if self.negotiation.pending_request().is_none()
            && self.send_tier() > TierIndex::SMALLEST
            && let Some(target) = self.demotion.poll(now)
            && target < self.send_tier()
            && let Err(error) = self.negotiation.request_tier(now, target)
        {
            self.fail(ConnectionError::ProtocolViolation(error.to_string()));
        }
        while let Some(message) = self.negotiation.poll_transmit() {
            self.control.push_back(message);
        }
        self.send_control();
        while self.drains_owed > 0 && self.credits.total() > 0 {
            let header = FrameHeader {
                kind: FrameKind::Drain,
                grant: Grant { tier: 0, count: 0 },
                payload_len: 0,
                message_len: 0,
            };
            if !self.post_frame(header, &[], false) {
                break;
            }
            self.drains_owed -= 1;
        }
        self.send_segments();
        while self.owes_credit() {
            let header = FrameHeader {
                kind: FrameKind::Credit,
                grant: Grant { tier: 0, count: 0 },
                payload_len: 0,
                message_len: 0,
            };
            if !self.post_frame(header, &[], false) {
                break;
            }
        }
        self.send_region.reclaim();
        self.recv_region.reclaim();
        let idle_for = self.config.ladder.policy().demote_after();
        if self
            .segmented_at
            .is_some_and(|at| now.saturating_duration_since(at) >= idle_for)
        {
            self.segmented_at = None;
            self.spare_outbox = Vec::new();
            self.returned.drop_spare_buffer();
        }
    }

    /// Whether receives posted since the peer last heard of them are enough to send a
    /// credit frame for: half the receives posted (at least two), or any while this
    /// side's last credit is the one the frame would take. [`ConnectionCore::progress`]
    /// sends it; a driver that takes many completions in a row (segments of a large
    /// message) runs `progress` as soon as this says so, so the peer can go on sending
    /// while this side reassembles.
    pub fn owes_credit(&self) -> bool {
        let threshold = (self.posted.len() as u32 / 2).max(2);
        self.grants.total() >= threshold || (self.grants.total() > 0 && self.credits.total() == 1)
    }

    fn send_control(&mut self) {
        while let Some(message) = self.control.front() {
            let mut frame = [0u8; wire::MAX_FRAME_LEN];
            let len = match wire::encode(message, &mut frame) {
                Ok(len) => len,
                Err(error) => {
                    self.fail(ConnectionError::Wire(error));
                    return;
                }
            };
            let header = FrameHeader {
                kind: FrameKind::Control,
                grant: Grant { tier: 0, count: 0 },
                payload_len: len as u32,
                message_len: 0,
            };
            if !self.post_frame(header, &[IoSlice::new(&frame[..len])], false) {
                return;
            }
            self.control.pop_front();
        }
    }

    fn handle_events(&mut self, now: Instant) {
        while let Some(event) = self.negotiation.poll_event() {
            match event {
                Event::Switched { from, to, .. } => {
                    if to > from {
                        self.stats.promotions += 1;
                    } else {
                        self.stats.demotions += 1;
                    }
                    self.refused = None;
                    self.drains_owed = self.credits.ahead_of(to.get());
                    if let Err(error) = self.demotion.tier_changed(now, to) {
                        self.fail(ConnectionError::ProtocolViolation(error.to_string()));
                    }
                    match self.send_region.begin_change(to) {
                        Ok(change) => {
                            if let Err(error) = change.install(false) {
                                tracing::warn!(%error, "send buffers stay on {from}");
                            }
                            self.send_tier_in_force = self.send_region.current();
                            self.spare_send_slots.clear();
                        }
                        Err(error) => tracing::warn!(%error, "send buffers stay on {from}"),
                    }
                    tracing::info!(%from, %to, drains = self.drains_owed, "send tier changed");
                }
                Event::RequestFailed { tier, cause, .. } => {
                    match cause {
                        FailureCause::Nacked(_) => self.stats.nacks += 1,
                        FailureCause::TimedOut { .. } => self.stats.timeouts += 1,
                    }
                    let backoff = self
                        .config
                        .ladder
                        .policy()
                        .hysteresis()
                        .max(Duration::from_millis(100));
                    self.refused = Some((tier, now + backoff));
                    tracing::info!(%tier, ?cause, "tier request failed; segmenting instead");
                }
                Event::ProvisionRequested { epoch, tier, .. } => {
                    let answer = self.provision(tier);
                    if let Err(error) = self.negotiation.provisioned(now, epoch, answer) {
                        self.fail(ConnectionError::ProtocolViolation(error.to_string()));
                    }
                }
                Event::PeerSwitched { from, to, .. } => {
                    tracing::debug!(%from, %to, "peer sends on a new tier");
                }
                Event::Retire { tier, .. } => {
                    // Over SEND/RECV the old tier retires when its posted receives come
                    // back (module invariants); nothing to free here.
                    tracing::debug!(%tier, "peer released a receive tier");
                }
                Event::ProtocolViolation(violation) => {
                    self.fail(ConnectionError::ProtocolViolation(format!("{violation:?}")));
                }
                other => tracing::debug!(?other, "negotiation event"),
            }
        }
    }

    /// Puts the receive region on `tier` and posts its receives, for a peer's request.
    fn provision(
        &mut self,
        tier: TierIndex,
    ) -> Result<tierbuf_tiers::RegionDescriptor, NackReason> {
        let descriptor = match self.recv_region.begin_change(tier) {
            Ok(mut change) => {
                let descriptor = change.provision().map_err(|error| nack_for(&error))?;
                change.install(false).map_err(|error| nack_for(&error))?;
                self.recv_tier_in_force = self.recv_region.current();
                descriptor
            }
            Err(TierError::AlreadyOn { .. }) => self.recv_tier_in_force.descriptor(),
            Err(error) => return Err(nack_for(&error)),
        };
        self.post_receives();
        Ok(descriptor)
    }

    /// Posts every free slot of the receive tier in force as a receive.
    fn post_receives(&mut self) {
        while let Some(slot) = Tier::try_acquire_owned(&self.recv_tier_in_force) {
            self.post_receive(slot);
        }
    }

    fn post_receive(&mut self, slot: OwnedTierSlot) {
        let tier = slot.tier().get();
        let buffer = BufferRef {
            remote_key: slot.keys().remote_key,
            addr: slot.remote_addr(),
            len: slot.len() as u32,
        };
        let wr_id = self.posted.insert(slot) as u64;
        if self.returns_to_lend.len() < self.posted.len() {
            self.returns_to_lend.push(sync::Arc::clone(&self.returned));
        }
        self.work.push_back(WorkRequest::PostRecv { wr_id, buffer });
        self.grants.posted(tier, 1);
    }

    /// Reposts a receive slot that came back, unless its tier was replaced (even by a
    /// new registration of the same index).
    fn recycle(&mut self, slot: OwnedTierSlot) {
        if slot.lies_in(&self.recv_tier_in_force) {
            self.post_receive(slot);
        }
    }

    /// Takes one successful completion from the provider endpoint.
    pub fn handle_completion(
        &mut self,
        now: Instant,
        kind: WorkKind,
        wr_id: u64,
        byte_len: u32,
    ) -> Result<(), Arc<ConnectionError>> {
        if let Some(error) = &self.failed {
            return Err(Arc::clone(error));
        }
        let outcome = match kind {
            WorkKind::Send => match self.sending.try_remove(wr_id as usize) {
                Some(slot) => {
                    // A send copied from the caller's message holds no slot.
                    if let Some(slot) = slot {
                        self.keep_send_slot(slot);
                    }
                    Ok(())
                }
                None => Err(ConnectionError::UnknownWorkRequest { kind, wr_id }),
            },
            WorkKind::Recv => match self.posted.try_remove(wr_id as usize) {
                Some(slot) => self.receive(now, slot, byte_len as usize),
                None => Err(ConnectionError::UnknownWorkRequest { kind, wr_id }),
            },
        };
        if let Err(error) = outcome {
            self.fail(error);
        }
        match &self.failed {
            Some(error) => Err(Arc::clone(error)),
            None => Ok(()),
        }
    }

    fn receive(
        &mut self,
        now: Instant,
        slot: OwnedTierSlot,
        len: usize,
    ) -> Result<(), ConnectionError> {
        let frame = &slot[..len.min(slot.len())];
        let header = FrameHeader::decode(frame).map_err(ConnectionError::Header)?;
        if usize::from(header.grant.tier) >= self.config.ladder.len() {
            return Err(ConnectionError::GrantBeyondLadder {
                tier: header.grant.tier,
                len: self.config.ladder.len(),
            });
        }
        self.credits.grant(header.grant);
        let payload_len = header.payload_len as usize;
        let payload = &frame[HEADER_LEN..HEADER_LEN + payload_len];
        match header.kind {
            FrameKind::Whole => {
                self.reassembly
                    .check_whole(header.message_len)
                    .map_err(ConnectionError::Reassembly)?;
                self.stats.messages_received += 1;
                self.stats.bytes_received += payload_len as u64;
                let returns = self
                    .returns_to_lend
                    .pop()
                    .expect("a reference to lend for every posted receive");
                self.lent += 1;
                self.delivered.push_back(Message {
                    body: Body::Slot {
                        slot: ReturnedSlots::lend(returns, slot),
                        len: payload_len,
                    },
                });
                return Ok(());
            }
            FrameKind::First | FrameKind::Middle | FrameKind::Last => {
                self.segmented_at = Some(now);
                let returned = &self.returned;
                let done = self
                    .reassembly
                    .segment(header.kind, header.message_len, payload, |len| {
                        returned.take_buffer(len)
                    })
                    .map_err(ConnectionError::Reassembly)?;
                if let Some(message) = done {
                    self.stats.messages_received += 1;
                    self.stats.bytes_received += message.len() as u64;
                    self.delivered.push_back(Message {
                        body: Body::Copied(ReturnedSlots::lend_buffer(&self.returned, message)),
                    });
                }
            }
            FrameKind::Control => {
                let message = wire::decode(payload).map_err(ConnectionError::Wire)?;
                self.negotiation.handle_message(now, message);
            }
            FrameKind::Credit | FrameKind::Drain => {}
        }
        self.recycle(slot);
        Ok(())
    }
}

impl fmt::Debug for ConnectionCore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ConnectionCore")
            .field("stats", &self.stats())
            .field("credits", &self.credits.total())
            .field("failed", &self.failed)
            .finish_non_exhaustive()
    }
}

fn nack_for(error: &TierError) -> NackReason {
    match error {
        TierError::BeyondLadder { .. } => NackReason::BeyondLadder,
        TierError::ChangePending { .. } => NackReason::Busy,
        _ => NackReason::OverBudget,
    }
}

enum Body {
    /// The payload's `len` bytes after the header, in the receive slot it landed in.
    Slot {
        slot: LentSlot,
        len: usize,
    },
    Copied(LentBuffer),
}

/// A delivered message. One that arrived in one frame is a view onto the registered
/// receive slot it landed in (zero-copy); dropping it returns the slot to be reposted. A
/// segmented one was reassembled into its own buffer.
pub struct Message {
    body: Body,
}

impl Message {
    /// Whether the bytes are still in the registered receive slot (not copied).
    pub fn is_zero_copy(&self) -> bool {
        matches!(self.body, Body::Slot { .. })
    }
}

impl Deref for Message {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        match &self.body {
            Body::Slot { slot, len } => &slot[HEADER_LEN..HEADER_LEN + len],
            Body::Copied(bytes) => bytes,
        }
    }
}

impl fmt::Debug for Message {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Message")
            .field("len", &self.len())
            .field("zero_copy", &self.is_zero_copy())
            .finish()
    }
}
