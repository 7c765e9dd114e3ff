//! The sans-IO promotion protocol: a state machine per direction of a connection.
//!
//! A connection carries data both ways, and each direction has its own tier: the size of the
//! receive buffers the receiving side has provisioned for it. [`Negotiation`] holds the two
//! machines of one side of a connection:
//!
//! - the *outbound* machine asks the peer to provision a tier for the data this side sends
//!   (`Negotiation::request_tier`) and switches only on a valid ack;
//! - the *inbound* machine answers the peer's requests for the data this side receives: it asks
//!   its owner to provision (`Event::ProvisionRequested`, answered with
//!   `Negotiation::provisioned`), acks or nacks, and tells its owner when a region may be
//!   freed (`Event::Retire`).
//!
//! Nothing here reads a clock, a socket or a thread: the owner feeds in messages
//! (`Negotiation::handle_message`) and the time (`Negotiation::handle_timeout`) and takes
//! out messages to send (`Negotiation::poll_transmit`), events
//! (`Negotiation::poll_event`) and the next deadline (`Negotiation::poll_timeout`).
//! `docs/protocol.md` has the state diagrams and the reasoning.
//!
//! # Invariants
//!
//! - **The sender writes only into what the peer acked.** The outbound machine switches to a
//!   tier only on an ack of its pending epoch whose tier, slot size, slot count and region
//!   length match its own ladder; anything else is ignored (stale, duplicate) or reported as a
//!   [`ProtocolViolation`], never applied.
//! - **A region is retired only when the peer can no longer reach it.** The inbound machine
//!   emits `Event::Retire` for the region in force only after the sender confirmed it
//!   switched away ([`ControlMessage::Released`], or a later request naming the new grant as
//!   its `current`), and for an offered region only after the sender confirmed it will never
//!   use it ([`ControlMessage::Abandon`], or a later request naming the old grant as its
//!   `current`). The sender never accepts an ack of an epoch it abandoned or superseded.
//! - **Nothing leaks.** Every region the owner provisions ends either in force or retired: an
//!   offered region is re-acked every `request_timeout` until the sender resolves it, and the
//!   sender answers a repeated ack of an abandoned epoch with another abandon and of its
//!   in-force epoch with another release. A region provisioned for a request that was given up
//!   meanwhile is retired as soon as the owner hands it in.
//! - **Nothing past the ladder is provisioned.** A request for a tier the inbound side's
//!   ladder lacks is nacked without asking the owner; budget refusals are the owner's
//!   ([`NackReason::OverBudget`]). A peer can never make us provision twice for one epoch:
//!   a repeated request is answered with the same ack or nack.
//! - **Epochs only grow.** Each direction's epochs are allocated by its sender, one per
//!   request; the inbound side remembers the highest it has seen, so late, duplicate and
//!   reordered messages are recognised and counted in `NegotiationStats`.
//! - **What waits to be sent is bounded by the protocol, not by the peer.** A message
//!   queued while a copy of it still waits is not queued again, and an answer takes the
//!   place of the older answers still waiting ([`enqueue_control`]): a peer that repeats a
//!   request, or asks again and again, leaves at most one answer waiting however often it
//!   does. Dropping a waiting message is safe because the protocol survives the loss of
//!   any message (timers resend what matters), and keeping the earlier copy of a repeat
//!   reorders nothing.

mod inbound;
mod outbound;

#[cfg(test)]
mod examples;
#[cfg(test)]
mod tests;

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use crate::wire::{ControlMessage, Epoch, NackReason};
use crate::{RegionDescriptor, TierIndex};

use inbound::Inbound;
use outbound::Outbound;

/// The shape of one tier's receive buffers: `slot_count` registered slots of `slot_size`
/// bytes each (for a ladder's tier, [`TierSpec::slot_len`](crate::ladder::TierSpec::slot_len):
/// the tier's size and the headroom for the frame header).
///
/// ```
/// use tierbuf_tiers::negotiation::TierShape;
/// let shape = TierShape { slot_size: 8192, slot_count: 64 };
/// assert_eq!(shape.region_len(), 524_288);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TierShape {
    /// The length of one registered slot in bytes.
    pub slot_size: u32,
    /// How many slots the tier has.
    pub slot_count: u32,
}

impl TierShape {
    /// The bytes a region needs to hold every slot.
    pub const fn region_len(self) -> u64 {
        self.slot_size as u64 * self.slot_count as u64
    }
}

/// The longest request timeout: an hour. Every deadline of the negotiation is the time now
/// plus the timeout, which then never overflows an `Instant`; and a request unanswered for
/// an hour is one no connection is waiting for.
pub const MAX_REQUEST_TIMEOUT: Duration = Duration::from_secs(60 * 60);

/// What the negotiation needs to know of a ladder and of its timers.
///
/// ```
/// use std::time::Duration;
/// use tierbuf_tiers::negotiation::{NegotiationConfig, TierShape};
/// let config = NegotiationConfig::new(
///     vec![
///         TierShape { slot_size: 512, slot_count: 32 },
///         TierShape { slot_size: 65_536, slot_count: 16 },
///     ],
///     Duration::from_millis(50),
///     4,
/// )?;
/// assert_eq!(config.tiers().len(), 2);
/// # Ok::<(), tierbuf_tiers::negotiation::NegotiationConfigError>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NegotiationConfig {
    tiers: Vec<TierShape>,
    request_timeout: Duration,
    max_attempts: u32,
}

/// Why a [`NegotiationConfig`] was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum NegotiationConfigError {
    /// The ladder has no tier.
    #[error("a ladder needs at least one tier")]
    NoTiers,
    /// The ladder has more tiers than a [`TierIndex`] can name.
    #[error("{count} tiers; a ladder has at most 256")]
    TooManyTiers {
        /// How many tiers were given.
        count: usize,
    },
    /// A tier has slots of zero bytes or no slots.
    #[error("{tier} is empty: {shape:?}")]
    EmptyTier {
        /// The tier.
        tier: TierIndex,
        /// Its shape.
        shape: TierShape,
    },
    /// The request timeout is zero.
    #[error("the request timeout must be longer than zero")]
    ZeroTimeout,
    /// The request timeout is past [`MAX_REQUEST_TIMEOUT`].
    #[error("a request timeout of {timeout:?} passes the maximum of {max:?}")]
    TimeoutTooLong {
        /// The timeout given.
        timeout: Duration,
        /// The longest allowed, [`MAX_REQUEST_TIMEOUT`].
        max: Duration,
    },
    /// Zero attempts would never send a request.
    #[error("max_attempts must be at least 1")]
    ZeroAttempts,
    /// A ladder tier's slot size or count does not fit the wire's 32-bit fields.
    #[error("{tier} has {slot_size}-byte slots x {slot_count}; the wire carries 32-bit sizes")]
    TierTooLarge {
        /// The tier.
        tier: TierIndex,
        /// The length of its registered slots.
        slot_size: usize,
        /// Its slot count.
        slot_count: usize,
    },
}

impl NegotiationConfig {
    /// A configuration for a ladder of `tiers` (tier 0 first), re-sending an unanswered request
    /// every `request_timeout` (at most [`MAX_REQUEST_TIMEOUT`]) and giving up after
    /// `max_attempts` sends.
    pub fn new(
        tiers: Vec<TierShape>,
        request_timeout: Duration,
        max_attempts: u32,
    ) -> Result<NegotiationConfig, NegotiationConfigError> {
        if tiers.is_empty() {
            return Err(NegotiationConfigError::NoTiers);
        }
        if tiers.len() > usize::from(u8::MAX) + 1 {
            return Err(NegotiationConfigError::TooManyTiers { count: tiers.len() });
        }
        for (index, shape) in (0..=u8::MAX).zip(&tiers) {
            if shape.region_len() == 0 {
                return Err(NegotiationConfigError::EmptyTier {
                    tier: TierIndex::new(index),
                    shape: *shape,
                });
            }
        }
        if request_timeout.is_zero() {
            return Err(NegotiationConfigError::ZeroTimeout);
        }
        if request_timeout > MAX_REQUEST_TIMEOUT {
            return Err(NegotiationConfigError::TimeoutTooLong {
                timeout: request_timeout,
                max: MAX_REQUEST_TIMEOUT,
            });
        }
        if max_attempts == 0 {
            return Err(NegotiationConfigError::ZeroAttempts);
        }
        Ok(NegotiationConfig {
            tiers,
            request_timeout,
            max_attempts,
        })
    }

    /// The configuration for `ladder`'s tiers, so that both machines and the regions they
    /// provision agree on one shape per tier.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tierbuf_tiers::{ladder::TierLadder, negotiation::NegotiationConfig};
    /// let ladder = TierLadder::preset("two-tier")?;
    /// let config = NegotiationConfig::for_ladder(&ladder, Duration::from_millis(50), 5)?;
    /// assert_eq!(config.tiers().len(), ladder.len());
    /// assert_eq!(config.tiers()[1].slot_size as usize, ladder.tiers()[1].slot_len());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn for_ladder(
        ladder: &crate::ladder::TierLadder,
        request_timeout: Duration,
        max_attempts: u32,
    ) -> Result<NegotiationConfig, NegotiationConfigError> {
        let shapes = ladder
            .iter()
            .map(|(tier, spec)| {
                let too_large = || NegotiationConfigError::TierTooLarge {
                    tier,
                    slot_size: spec.slot_len(),
                    slot_count: spec.slot_count(),
                };
                Ok(TierShape {
                    slot_size: u32::try_from(spec.slot_len()).map_err(|_| too_large())?,
                    slot_count: u32::try_from(spec.slot_count()).map_err(|_| too_large())?,
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        NegotiationConfig::new(shapes, request_timeout, max_attempts)
    }

    /// The ladder's tiers, smallest first.
    pub fn tiers(&self) -> &[TierShape] {
        &self.tiers
    }

    /// The shape of `tier`, or `None` past the ladder's top.
    pub fn shape(&self, tier: TierIndex) -> Option<TierShape> {
        self.tiers.get(usize::from(tier.get())).copied()
    }

    /// How long to wait for an answer before sending again.
    pub fn request_timeout(&self) -> Duration {
        self.request_timeout
    }

    /// When a timer started at `now` fires: `now` plus the request timeout. The timeout is
    /// at most [`MAX_REQUEST_TIMEOUT`], so the sum fits any `Instant` a clock gives; were it
    /// not to, the timer fires at once rather than the arithmetic panicking.
    pub fn deadline_after(&self, now: Instant) -> Instant {
        now.checked_add(self.request_timeout).unwrap_or(now)
    }

    /// How many times a request is sent before it is given up.
    pub fn max_attempts(&self) -> u32 {
        self.max_attempts
    }
}

/// A tier granted in one direction, named by the epoch of the request that got it
/// ([`Epoch::INITIAL`] for the tier a connection starts on).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct TierGrant {
    /// The epoch of the request that got the grant.
    pub epoch: Epoch,
    /// The tier granted.
    pub tier: TierIndex,
}

impl TierGrant {
    /// The grant every direction starts with: the smallest tier, provisioned at connect time.
    pub(crate) const INITIAL: TierGrant = TierGrant {
        epoch: Epoch::INITIAL,
        tier: TierIndex::SMALLEST,
    };
}

/// The outbound machine's request that awaits an answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PendingRequest {
    /// The request's epoch.
    pub epoch: Epoch,
    /// The tier asked for.
    pub target: TierIndex,
    /// How many times the request has been sent.
    pub attempts: u32,
    /// When it is sent again, or given up.
    pub deadline: Instant,
}

/// What [`Negotiation::request_tier`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RequestStatus {
    /// The tier is already in force: send on it.
    InForce,
    /// A request went out; the tier is not usable until [`Event::Switched`].
    Requested {
        /// The request's epoch.
        epoch: Epoch,
    },
    /// A request for this tier was already under way; nothing new was sent.
    AlreadyPending {
        /// The pending request's epoch.
        epoch: Epoch,
    },
}

/// Why `Negotiation::request_tier` refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RequestError {
    /// The tier is not on this side's ladder.
    #[error("{tier} is beyond the ladder of {ladder_len} tiers")]
    BeyondLadder {
        /// The tier asked for.
        tier: TierIndex,
        /// How many tiers the ladder has.
        ladder_len: usize,
    },
}

/// Why `Negotiation::provisioned` refused the owner's answer. Nothing changed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ProvisionError {
    /// No provisioning of this epoch is outstanding.
    #[error("no provisioning outstanding for {epoch}")]
    UnknownEpoch {
        /// The epoch named.
        epoch: Epoch,
    },
    /// The region cannot hold the tier's slots.
    #[error("region of {len} bytes for {tier} ({epoch}) needs {needed}")]
    RegionTooShort {
        /// The provisioning's epoch.
        epoch: Epoch,
        /// The tier provisioned.
        tier: TierIndex,
        /// The bytes the tier needs.
        needed: u64,
        /// The region's length.
        len: u64,
    },
}

/// Why a request of the outbound machine failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FailureCause {
    /// The peer refused.
    Nacked(NackReason),
    /// No valid answer came after this many sends; the request was abandoned.
    TimedOut {
        /// How many times it was sent.
        attempts: u32,
    },
}

/// A message from the peer that breaks the protocol. It was not applied.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ProtocolViolation {
    /// An ack names another tier than the one requested.
    #[error("ack of {epoch} grants {acked}, {requested} was requested")]
    AckWrongTier {
        /// The epoch acked.
        epoch: Epoch,
        /// The tier requested.
        requested: TierIndex,
        /// The tier the ack names.
        acked: TierIndex,
    },
    /// An ack's slot size or count differs from the ladder's.
    #[error("ack of {epoch} for {tier} announces {found:?}, the ladder says {expected:?}")]
    AckShapeMismatch {
        /// The epoch acked.
        epoch: Epoch,
        /// The tier acked.
        tier: TierIndex,
        /// The shape of the tier on this side's ladder.
        expected: TierShape,
        /// The shape the ack announces.
        found: TierShape,
    },
    /// An ack's region cannot hold the slots it announces.
    #[error("ack of {epoch} for {tier}: region of {len} bytes, slots need {needed}")]
    AckRegionTooShort {
        /// The epoch acked.
        epoch: Epoch,
        /// The tier acked.
        tier: TierIndex,
        /// The bytes the slots need.
        needed: u64,
        /// The region's length.
        len: u64,
    },
    /// A nack names another tier than the one requested.
    #[error("nack of {epoch} names {nacked}, {requested} was requested")]
    NackWrongTier {
        /// The epoch nacked.
        epoch: Epoch,
        /// The tier requested.
        requested: TierIndex,
        /// The tier the nack names.
        nacked: TierIndex,
    },
    /// An ack or nack answers an epoch this side never requested.
    #[error("answer to {epoch}, which was never requested")]
    AnswerToUnrequestedEpoch {
        /// The epoch named.
        epoch: Epoch,
    },
    /// A request names as `current` a grant the sender cannot be using.
    #[error("request of {epoch} claims to use {current}, which is neither in force nor offered")]
    UnknownCurrentGrant {
        /// The request's epoch.
        epoch: Epoch,
        /// The grant it claims to use.
        current: Epoch,
    },
    /// A release confirms a switch to a grant that was never offered.
    #[error("release of {epoch}, which was never offered")]
    ReleaseOfUnofferedEpoch {
        /// The epoch named.
        epoch: Epoch,
    },
}

/// What a [`Negotiation`] tells its owner.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub(crate) enum Event {
    /// Outbound: the peer provisioned `to`; send on it from now on. The peer's region of the
    /// previous grant is released (a [`ControlMessage::Released`] is queued).
    Switched {
        /// The epoch of the grant now in force.
        epoch: Epoch,
        /// The tier used before.
        from: TierIndex,
        /// The tier in force now.
        to: TierIndex,
        /// Its slot size and count.
        shape: TierShape,
        /// The peer's region for it.
        region: RegionDescriptor,
    },
    /// Outbound: a request failed; the tier in force is unchanged.
    RequestFailed {
        /// The request's epoch.
        epoch: Epoch,
        /// The tier asked for.
        tier: TierIndex,
        /// Why.
        cause: FailureCause,
    },
    /// Inbound: provision receive buffers of `shape` for the peer's data and answer with
    /// [`Negotiation::provisioned`].
    ProvisionRequested {
        /// The provisioning's epoch.
        epoch: Epoch,
        /// The tier asked for.
        tier: TierIndex,
        /// Its slot size and count.
        shape: TierShape,
    },
    /// Inbound: the peer sends on the grant of `epoch` now.
    PeerSwitched {
        /// The epoch of the grant in force.
        epoch: Epoch,
        /// The tier the peer used before.
        from: TierIndex,
        /// The tier in force now.
        to: TierIndex,
    },
    /// Inbound: the peer can no longer reach the region provisioned for `epoch`; free it.
    Retire {
        /// The epoch the region was provisioned for ([`Epoch::INITIAL`]: the initial region).
        epoch: Epoch,
        /// Its tier.
        tier: TierIndex,
    },
    /// The peer sent a message that breaks the protocol; it was ignored.
    ProtocolViolation(ProtocolViolation),
}

/// Counters of what a [`Negotiation`] saw and ignored.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct NegotiationStats {
    /// Repeats of a message already handled (answered again where the peer needs it).
    pub duplicates: u64,
    /// Messages of an epoch already superseded.
    pub stale: u64,
    /// Messages sent again after a timeout.
    pub retransmissions: u64,
    /// Messages that broke the protocol (each also an [`Event::ProtocolViolation`]).
    pub protocol_violations: u64,
}

/// Adds `item`, which carries the control message `message_of(&item)`, to the back of
/// `waiting`, a queue of control messages not yet sent, unless it is redundant: when a copy
/// of the message waits already, that copy stands for it and nothing is queued; an answer
/// (an ack or a nack, which only the inbound side sends) takes the place of every answer
/// of the same or an older epoch still waiting, since at most one request of the peer's is
/// outstanding and a newer one resolved the older. Returns whether `item` was queued.
///
/// The negotiation keeps its own queue this way, and so does a channel that holds frames
/// back (the connection's in-band control frames while the peer grants no credit): a peer
/// repeating a request cannot make either grow.
///
/// ```
/// use std::collections::VecDeque;
/// use tierbuf_tiers::negotiation::enqueue_control;
/// use tierbuf_tiers::wire::{ControlMessage, Epoch, NackReason};
/// use tierbuf_tiers::TierIndex;
///
/// let nack = |epoch| ControlMessage::Nack {
///     epoch: Epoch::new(epoch),
///     tier: TierIndex::new(3),
///     reason: NackReason::BeyondLadder,
/// };
/// let released = ControlMessage::Released { epoch: Epoch::new(1) };
/// let mut waiting = VecDeque::new();
/// for message in [nack(1), released, nack(1), nack(2), released] {
///     enqueue_control(&mut waiting, message, |message| message);
/// }
/// assert_eq!(waiting, [released, nack(2)]);
/// ```
pub fn enqueue_control<T>(
    waiting: &mut VecDeque<T>,
    item: T,
    message_of: impl Fn(&T) -> &ControlMessage,
) -> bool {
    let message = *message_of(&item);
    if waiting.iter().any(|queued| *message_of(queued) == message) {
        return false;
    }
    if let Some(epoch) = answered_epoch(&message) {
        waiting.retain(|queued| answered_epoch(message_of(queued)).is_none_or(|old| old > epoch));
    }
    waiting.push_back(item);
    true
}

/// The epoch an answer (ack or nack) answers; `None` for any other message.
fn answered_epoch(message: &ControlMessage) -> Option<Epoch> {
    match *message {
        ControlMessage::Ack { epoch, .. } | ControlMessage::Nack { epoch, .. } => Some(epoch),
        ControlMessage::Request { .. }
        | ControlMessage::Released { .. }
        | ControlMessage::Abandon { .. } => None,
    }
}

/// The queues both machines write into.
#[derive(Debug, Default)]
struct Outputs {
    transmits: VecDeque<ControlMessage>,
    events: VecDeque<Event>,
    stats: NegotiationStats,
}

impl Outputs {
    /// Queues `message` to send, unless it is redundant ([`enqueue_control`]).
    fn send(&mut self, message: ControlMessage) {
        enqueue_control(&mut self.transmits, message, |message| message);
    }

    fn emit(&mut self, event: Event) {
        self.events.push_back(event);
    }

    fn violation(&mut self, violation: ProtocolViolation) {
        tracing::warn!(%violation, "protocol violation ignored");
        self.stats.protocol_violations += 1;
        self.events.push_back(Event::ProtocolViolation(violation));
    }
}

/// The negotiation of one side of a connection: an outbound and an inbound machine.
#[derive(Debug)]
pub struct Negotiation {
    config: NegotiationConfig,
    outbound: Outbound,
    inbound: Inbound,
    outputs: Outputs,
}

impl Negotiation {
    /// Both directions on the smallest tier, nothing pending.
    pub(crate) fn new(config: NegotiationConfig) -> Negotiation {
        Negotiation {
            config,
            outbound: Outbound::new(),
            inbound: Inbound::new(),
            outputs: Outputs::default(),
        }
    }

    /// The configuration.
    #[cfg(test)]
    pub(crate) fn config(&self) -> &NegotiationConfig {
        &self.config
    }

    /// Asks the peer to provision `target` for the data this side sends: a promotion or a
    /// demotion to any tier of the ladder. A pending request for another tier is abandoned.
    pub(crate) fn request_tier(
        &mut self,
        now: Instant,
        target: TierIndex,
    ) -> Result<RequestStatus, RequestError> {
        self.outbound
            .request_tier(&self.config, now, target, &mut self.outputs)
    }

    /// The owner's answer to [`Event::ProvisionRequested`]: the region it provisioned, or why
    /// it refused. An error leaves everything as it was.
    pub(crate) fn provisioned(
        &mut self,
        now: Instant,
        epoch: Epoch,
        result: Result<RegionDescriptor, NackReason>,
    ) -> Result<(), ProvisionError> {
        self.inbound
            .provisioned(&self.config, now, epoch, result, &mut self.outputs)
    }

    /// Takes in a control message from the peer.
    pub(crate) fn handle_message(&mut self, now: Instant, message: ControlMessage) {
        let outputs = &mut self.outputs;
        match message {
            ControlMessage::Request {
                epoch,
                tier,
                current,
            } => self
                .inbound
                .handle_request(&self.config, now, epoch, tier, current, outputs),
            ControlMessage::Released { epoch } => self.inbound.handle_released(epoch, outputs),
            ControlMessage::Abandon { epoch } => self.inbound.handle_abandon(epoch, outputs),
            ControlMessage::Ack {
                epoch,
                tier,
                shape,
                region,
            } => self
                .outbound
                .handle_ack(&self.config, epoch, tier, shape, region, outputs),
            ControlMessage::Nack {
                epoch,
                tier,
                reason,
            } => self.outbound.handle_nack(epoch, tier, reason, outputs),
        }
    }

    /// Lets the timers due at `now` fire. Call it when [`Negotiation::poll_timeout`] has passed.
    pub(crate) fn handle_timeout(&mut self, now: Instant) {
        self.outbound
            .handle_timeout(&self.config, now, &mut self.outputs);
        self.inbound
            .handle_timeout(&self.config, now, &mut self.outputs);
    }

    /// The next control message to send to the peer, in order.
    pub(crate) fn poll_transmit(&mut self) -> Option<ControlMessage> {
        self.outputs.transmits.pop_front()
    }

    /// Whether a control message waits for [`Negotiation::poll_transmit`].
    pub(crate) fn has_transmits(&self) -> bool {
        !self.outputs.transmits.is_empty()
    }

    /// The next event for the owner.
    pub(crate) fn poll_event(&mut self) -> Option<Event> {
        self.outputs.events.pop_front()
    }

    /// When [`Negotiation::handle_timeout`] should be called next, if a timer runs.
    pub(crate) fn poll_timeout(&self) -> Option<Instant> {
        match (self.outbound.poll_timeout(), self.inbound.poll_timeout()) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// The grant this side sends on.
    pub(crate) fn outbound_grant(&self) -> TierGrant {
        self.outbound.grant()
    }

    /// The outbound request awaiting an answer, if any.
    pub fn pending_request(&self) -> Option<PendingRequest> {
        self.outbound.pending()
    }

    /// The grant the peer sends on, as far as this side knows: the region it must keep.
    pub(crate) fn inbound_grant(&self) -> TierGrant {
        self.inbound.grant()
    }

    /// The inbound grant being provisioned or offered and not yet confirmed or abandoned.
    #[cfg(test)]
    pub(crate) fn inbound_offer(&self) -> Option<TierGrant> {
        self.inbound.offer()
    }

    /// What was ignored or sent again so far.
    #[cfg(test)]
    pub(crate) fn stats(&self) -> NegotiationStats {
        self.outputs.stats
    }
}
