//! [`TierController`]: the tiers of one side of one connection, sans-IO.
//!
//! A connection's transport keeps framing, credits, reassembly and work requests; for
//! everything about tiers it asks the controller. The controller owns both directions'
//! [`Negotiation`], the send and receive [`TieredRegion`]s, the `DemotionTracker` and the
//! back-off after a refusal. It plans each message with the policy's planners and measures
//! with one [`FrameCapacity`], so promotion and demotion agree on what fits. Control
//! messages travel through a [`Negotiator`] the owner hands to [`TierController::pump`]:
//! frames of the connection itself (in band), or a channel of the user's own.
//!
//! Nothing here reads a clock or touches a queue pair: the owner passes the time in, takes
//! out the tier changes to apply ([`TierController::poll_change`]) and arms a timer at
//! [`TierController::poll_timeout`].
//!
//! # Invariants
//!
//! - **Only the controller changes its regions' tiers, one change each at a time.** The
//!   send region changes when the peer acked a tier (`Event::Switched`), the receive
//!   region when this side provisions a tier the peer asked for. Each change is reported
//!   once, in order, by [`TierController::poll_change`]. Slots are taken through the
//!   regions' lock-free caches ([`OwnedTierCache`]), so the tier a slot comes from is the
//!   tier in force, never a copy of it.
//! - **A message is planned on a tier both sides carry**: the smaller of the tier the peer
//!   granted and the send region's tier (this side's budget may have refused to follow a
//!   grant).
//! - **A message never waits for a promotion.** One that does not fit is planned as
//!   segments on the tier in force while the promotion is asked for; the messages after it
//!   go whole once the peer's ack lands.
//! - **A refusal holds for its back-off**: after a nack for budget or ladder, a timed-out
//!   request, or this side's own budget refusing its send buffers, the refused tier and
//!   those above it are not asked for again until the back-off (the ladder's hysteresis,
//!   at least `MIN_BACKOFF`) ends. A `Busy` nack is no refusal: the next message may ask
//!   again.
//! - **Demotion is asked only while no request is pending**, to the tier the tracker
//!   suggests, which is below the tier granted.
//! - **A peer's request is provisioned only on the ladder** (the negotiation nacks the rest
//!   without asking) and within the reservoir's budget (a refusal is a nack, not an error).
//! - **The receive region holds the tier in force and at most one replaced tier** (besides
//!   retained tiers below the one in force): a request for a tier that needs a new
//!   registration while a replaced one still has slots out is answered `Busy` (a request
//!   for the replaced tier itself puts it back in force), so no peer can make this side
//!   register more by asking tier after tier without sending into what was posted for it.
//! - **A pending demotion is never superseded.** The peer installs the smaller receives
//!   when it provisions them; a promotion asked meanwhile would leave them in force while
//!   this side sends on its larger grant, which they cannot take. A message that needs a
//!   larger tier goes out on the tier in force, and the promotion is asked once the
//!   demotion lands.

use std::collections::VecDeque;
use std::io::IoSlice;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::negotiation::{Event, Negotiation};
use crate::negotiation::{
    FailureCause, NegotiationConfig, ProtocolViolation, ProvisionError, RequestError,
};
use crate::negotiator::{Negotiator, PumpError, pump};
use crate::policy::{
    DemotionTracker, FrameCapacity, IoVecPlan, MessagePlan, PolicyError, Promotion, plan_io_vector,
    plan_message,
};
use crate::wire::{NackReason, WireError};
use crate::{
    OwnedTierCache, OwnedTierSlot, RegionDescriptor, Reservoir, TierError, TierIndex, TierStats,
    TieredRegion,
};

/// The shortest back-off after a refusal, for ladders whose hysteresis is shorter.
pub(crate) const MIN_BACKOFF: Duration = Duration::from_millis(100);

/// How a planned message goes out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Framing {
    /// In one frame.
    Whole,
    /// In segments, reassembled by the peer into one message.
    Segmented,
}

/// What to send of an offered message or I/O vector: its first `elements` elements,
/// `bytes` bytes together, as one message framed as `framing`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SendPlan {
    /// Leading elements the message carries (1 for a message given as one slice).
    pub elements: usize,
    /// Their total length.
    pub bytes: usize,
    /// One frame or segments.
    pub framing: Framing,
}

/// Whether a message to be built in place in one send buffer can be, now.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ReservePlan {
    /// It fits one frame of the tier in force.
    Fits,
    /// It needs a larger tier, asked for now or before: try again once it lands.
    PromotionPending,
    /// It needs a larger tier that was refused (by the peer, or by this side's budget),
    /// and the refusal holds.
    PromotionRefused,
    /// It is longer than one frame of the top tier carries.
    BeyondOneFrame {
        /// The top tier's whole capacity.
        max: usize,
    },
}

/// A change of tier the transport applies, in the order they happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Change {
    /// The peer granted `to` for this side's data: the peer's receives of earlier tiers
    /// ahead of `to`'s are to be drained, and send buffers kept of the old tier dropped.
    SendTier {
        /// The tier granted before.
        from: TierIndex,
        /// The tier granted now.
        to: TierIndex,
    },
    /// The receive region is on `to` now, for the peer's request (or back on the tier
    /// the peer sends on, after it gave up a request this side had provisioned): post its
    /// receives.
    RecvTier {
        /// The receive tier before.
        from: TierIndex,
        /// The receive tier now.
        to: TierIndex,
    },
    /// This side gave up its request for `tier` (it timed out, or a request for another
    /// tier superseded it). The peer may have posted receives of `tier` for it already,
    /// or may still post them before it hears: those are to be drained, since no frame of
    /// this side's will ask for them, and their tier retires only once they are consumed.
    Abandoned {
        /// The tier that was asked for.
        tier: TierIndex,
    },
}

/// Why a controller failed. The connection it belongs to cannot go on.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ControllerError {
    /// The peer sent a control message that breaks the protocol (the peer's fault).
    #[error("the peer broke the tier negotiation")]
    PeerProtocol(#[source] ProtocolViolation),
    /// A control frame from the peer does not decode (the peer's fault).
    #[error("the peer sent a malformed control frame")]
    MalformedFrame(#[source] WireError),
    /// The channel that carries control frames failed (the channel's owner's to judge).
    #[error("the negotiation channel failed")]
    Channel(#[source] Box<dyn std::error::Error + Send + Sync>),
    /// This side's own state refused an operation: a bug in this crate, not the peer's
    /// doing.
    #[error("the tier controller's own state is inconsistent")]
    Internal(#[source] InternalError),
}

/// The local inconsistencies [`ControllerError::Internal`] reports.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum InternalError {
    /// A plan named a tier off the ladder.
    #[error(transparent)]
    Policy(PolicyError),
    /// A request named a tier off the ladder.
    #[error(transparent)]
    Request(RequestError),
    /// An answer to a provisioning request was refused.
    #[error(transparent)]
    Provision(ProvisionError),
    /// The negotiation produced a message its codec refuses.
    #[error("encoding a control message failed")]
    Encode(#[source] WireError),
}

impl From<PolicyError> for ControllerError {
    fn from(error: PolicyError) -> ControllerError {
        ControllerError::Internal(InternalError::Policy(error))
    }
}

/// The tiers of one side of one connection: see the module documentation.
///
/// ```
/// use std::sync::Arc;
/// use std::time::Instant;
/// use tierbuf_pool::{HostRegistrar, MemoryBudget};
/// use tierbuf_tiers::controller::{Change, Framing, TierController};
/// use tierbuf_tiers::negotiator::InMemoryNegotiator;
/// use tierbuf_tiers::policy::FrameCapacity;
/// use tierbuf_tiers::{Reservoir, TierIndex, ladder::TierLadder, negotiation::NegotiationConfig};
///
/// let ladder = Arc::new(TierLadder::preset("two-tier")?); // 480 B, then 8 KiB
/// let capacity = Arc::new(FrameCapacity::new(Arc::clone(&ladder), 16)?);
/// let negotiation = NegotiationConfig::for_ladder(&ladder, std::time::Duration::from_millis(100), 5)?;
/// let registrar = Arc::new(HostRegistrar::new(MemoryBudget::with_cap(16 << 20)));
/// let reservoir = Arc::new(Reservoir::new(registrar, ladder));
/// let side = || TierController::new(Arc::clone(&capacity), negotiation.clone(), Arc::clone(&reservoir), Arc::clone(&reservoir), Instant::now());
/// let (mut a, mut b) = (side()?, side()?);
/// let (mut a_channel, mut b_channel) = InMemoryNegotiator::pair();
/// let now = Instant::now();
///
/// // A 4 KiB message does not fit tier 0: it goes out segmented now, and tier 1 is asked for.
/// assert_eq!(a.plan_message(now, 4096)?.framing, Framing::Segmented);
/// a.pump(&mut a_channel, now)?; // the request
/// b.pump(&mut b_channel, now)?; // b provisions tier 1 and acks
/// assert_eq!(b.poll_change(), Some(Change::RecvTier { from: TierIndex::SMALLEST, to: TierIndex::new(1) }));
/// a.pump(&mut a_channel, now)?; // a switches
/// assert_eq!(a.poll_change(), Some(Change::SendTier { from: TierIndex::SMALLEST, to: TierIndex::new(1) }));
/// assert_eq!(a.plan_message(now, 4096)?.framing, Framing::Whole);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct TierController {
    capacity: Arc<FrameCapacity>,
    negotiation: Negotiation,
    demotion: DemotionTracker,
    send_region: TieredRegion,
    recv_region: TieredRegion,
    send_cache: OwnedTierCache,
    recv_cache: OwnedTierCache,
    /// The smallest tier refused, and until when the refusal holds.
    refused: Option<(TierIndex, Instant)>,
    /// Until when no demotion is asked for, after one failed.
    demotion_held_until: Option<Instant>,
    changes: VecDeque<Change>,
    stats: TierStats,
}

impl TierController {
    /// A controller on the smallest tier both ways, with send buffers from `send_reservoir`
    /// and receive buffers from `recv_reservoir` (both for `capacity`'s ladder, which
    /// `negotiation` must describe too).
    ///
    /// # Errors
    ///
    /// The [`TierError`] of registering either region's smallest tier.
    pub fn new(
        capacity: Arc<FrameCapacity>,
        negotiation: NegotiationConfig,
        send_reservoir: Arc<Reservoir>,
        recv_reservoir: Arc<Reservoir>,
        now: Instant,
    ) -> Result<TierController, TierError> {
        let send_region = TieredRegion::new(send_reservoir)?;
        let recv_region = TieredRegion::new(recv_reservoir)?;
        Ok(TierController {
            demotion: DemotionTracker::new(Arc::clone(&capacity), now),
            negotiation: Negotiation::new(negotiation),
            capacity,
            send_cache: send_region.owned_cache(),
            recv_cache: recv_region.owned_cache(),
            send_region,
            recv_region,
            refused: None,
            demotion_held_until: None,
            changes: VecDeque::new(),
            stats: TierStats::default(),
        })
    }

    /// The measure of what fits each tier.
    pub fn capacity(&self) -> &Arc<FrameCapacity> {
        &self.capacity
    }

    /// The tier the peer has granted this side to send on.
    #[inline]
    pub fn send_tier(&self) -> TierIndex {
        self.negotiation.outbound_grant().tier
    }

    /// The tier of the receive region, the one the peer sends into.
    pub fn recv_tier(&self) -> TierIndex {
        self.recv_region.tier()
    }

    /// The tier of this side's send buffers: the granted tier, or a smaller one while this
    /// side's budget keeps them there.
    #[inline]
    pub fn send_buffers_tier(&mut self) -> TierIndex {
        self.send_cache.tier()
    }

    /// The tier messages are planned on: the granted tier, or the send region's when this
    /// side's budget kept it lower.
    #[inline]
    pub fn usable_tier(&mut self) -> TierIndex {
        self.send_tier().min(self.send_cache.tier())
    }

    /// Whether planning a message of `len` bytes reads its `now`. It does not for one that
    /// the smallest tier carries whole: that fits every tier, starts no promotion and tells
    /// the demotion tracker nothing, so a caller may pass the last time it read.
    #[inline]
    pub fn needs_clock(&self, len: usize) -> bool {
        self.capacity
            .whole(TierIndex::SMALLEST)
            .is_none_or(|smallest| len > smallest)
    }

    /// Plans one message of `len` bytes: whole on the tier in force if it fits; otherwise
    /// segmented on it, asking for the tier that fits (or the top) unless a refusal holds.
    /// Records the message's need for the demotion tracker.
    ///
    /// # Errors
    ///
    /// [`ControllerError::Internal`] only.
    pub fn plan_message(&mut self, now: Instant, len: usize) -> Result<SendPlan, ControllerError> {
        let current = self.usable_tier();
        let plan = plan_message(&self.capacity, current, len, Promotion::Allowed)?;
        self.record(now, len);
        let framing = self.apply(now, plan)?;
        Ok(SendPlan {
            elements: 1,
            bytes: len,
            framing,
        })
    }

    /// Plans the next message of an I/O vector (the prefix rule, `docs/policy.md`, "I/O vectors"): the longest
    /// prefix of whole elements that fits the tier in force, sent whole; or, when the first
    /// element with any bytes does not fit on its own, that element (with the empty ones
    /// before it) segmented, asking for a larger tier as [`TierController::plan_message`]
    /// does. The caller sends the rest with later calls.
    ///
    /// # Errors
    ///
    /// [`ControllerError::Internal`] only.
    pub fn plan_io_vector(
        &mut self,
        now: Instant,
        elements: &[IoSlice<'_>],
    ) -> Result<SendPlan, ControllerError> {
        let current = self.usable_tier();
        match plan_io_vector(&self.capacity, current, elements, Promotion::Allowed)? {
            IoVecPlan::SendPrefix {
                elements: count,
                bytes,
                ..
            } => {
                self.record(now, bytes);
                Ok(SendPlan {
                    elements: count,
                    bytes,
                    framing: Framing::Whole,
                })
            }
            IoVecPlan::Oversized { element, plan } => {
                let bytes = elements[element].len();
                self.record(now, bytes);
                let framing = self.apply(now, plan)?;
                Ok(SendPlan {
                    elements: element + 1,
                    bytes,
                    framing,
                })
            }
        }
    }

    /// Whether a message of `len` bytes can be built in place in one send buffer now;
    /// asks for the tier it needs when it cannot yet. Records its need when it fits.
    ///
    /// # Errors
    ///
    /// [`ControllerError::Internal`] only.
    pub fn plan_reserve(
        &mut self,
        now: Instant,
        len: usize,
    ) -> Result<ReservePlan, ControllerError> {
        let current = self.usable_tier();
        match plan_message(&self.capacity, current, len, Promotion::Allowed)? {
            MessagePlan::Send { .. } => {
                self.record(now, len);
                Ok(ReservePlan::Fits)
            }
            MessagePlan::Promote { to } => Ok(match self.promote(now, to)? {
                true => ReservePlan::PromotionPending,
                false => ReservePlan::PromotionRefused,
            }),
            _ => Ok(ReservePlan::BeyondOneFrame {
                max: self.whole(self.capacity.ladder().top()),
            }),
        }
    }

    /// Tells the demotion tracker a message of `len` bytes went out at `now` (a message
    /// the smallest tier carries tells it nothing).
    fn record(&mut self, now: Instant, len: usize) {
        if self.needs_clock(len) {
            self.demotion.record(now, len);
        }
    }

    /// The framing of a message planned as `plan`, after asking for the tier it names.
    fn apply(&mut self, now: Instant, plan: MessagePlan) -> Result<Framing, ControllerError> {
        match plan {
            MessagePlan::Send { .. } => return Ok(Framing::Whole),
            MessagePlan::Promote { to } | MessagePlan::PromoteThenSegment { to, .. } => {
                self.promote(now, to)?;
            }
            _ => {}
        }
        Ok(Framing::Segmented)
    }

    /// Asks for `target` unless a refusal of it holds or it is asked for already; when the
    /// peer granted it already and only this side's send buffers lag, tries them again.
    /// Returns whether the tier is coming (asked for, or in force).
    fn promote(&mut self, now: Instant, target: TierIndex) -> Result<bool, ControllerError> {
        if self
            .refused
            .is_some_and(|(refused, until)| refused <= target && now < until)
        {
            self.stats.held_back_by_refusal += 1;
            return Ok(false);
        }
        if target <= self.send_tier() {
            // Granted, but this side's budget kept its send buffers lower: try them again.
            return Ok(self.follow_grant(now, self.send_tier()));
        }
        if let Some(pending) = self.negotiation.pending_request() {
            if pending.target >= target {
                return Ok(true);
            }
            if pending.target < self.send_tier() {
                // A demotion is pending, and the peer may have put the smaller receives in
                // force already. Superseding it would leave them there while this side
                // goes on sending on its larger grant, which they cannot take: ask once
                // the demotion lands.
                self.stats.held_back_by_demotion += 1;
                return Ok(false);
            }
            // The request for `target` supersedes (abandons) the pending one.
            self.changes.push_back(Change::Abandoned {
                tier: pending.target,
            });
        }
        self.negotiation
            .request_tier(now, target)
            .map_err(|error| ControllerError::Internal(InternalError::Request(error)))?;
        Ok(true)
    }

    /// Puts the send region on `granted`; on a refusal of this side's budget, starts the
    /// back-off and returns false.
    fn follow_grant(&mut self, now: Instant, granted: TierIndex) -> bool {
        let installed = match self.send_region.begin_change(granted) {
            Ok(change) => change.install(false).map(drop),
            Err(TierError::AlreadyOn { .. }) => Ok(()),
            Err(error) => Err(error),
        };
        match installed {
            Ok(()) => true,
            Err(error) => {
                self.stats.send_buffers_refused += 1;
                tracing::warn!(%error, tier = %granted, "send buffers stay on a smaller tier");
                self.refuse(now, granted);
                false
            }
        }
    }

    fn refuse(&mut self, now: Instant, tier: TierIndex) {
        self.refused = now.checked_add(self.backoff()).map(|until| (tier, until));
    }

    /// How long a refusal, or a failed demotion, holds: the ladder's hysteresis, at least
    /// [`MIN_BACKOFF`].
    fn backoff(&self) -> Duration {
        self.capacity
            .ladder()
            .policy()
            .hysteresis()
            .max(MIN_BACKOFF)
    }

    /// Moves control messages through `channel` at `now`: lets due timers fire, takes in the
    /// peer's messages, provisions what the peer asked for, acts on its answers, asks for a
    /// demotion when the tracker suggests one, and sends what is queued.
    ///
    /// # Errors
    ///
    /// A [`ControllerError`]; the connection cannot go on. What it says is whose fault.
    pub fn pump<N: Negotiator>(
        &mut self,
        channel: &mut N,
        now: Instant,
    ) -> Result<(), ControllerError> {
        self.pump_once(channel, now)?;
        self.handle_events(now)?;
        if self.negotiation.pending_request().is_none()
            && self.send_tier() > TierIndex::SMALLEST
            && self.demotion_held_until.is_none_or(|until| now >= until)
            && let Some(target) = self.demotion.poll(now)
            && target < self.send_tier()
        {
            self.negotiation
                .request_tier(now, target)
                .map_err(|error| ControllerError::Internal(InternalError::Request(error)))?;
        }
        // Answers and requests queued since go out now, not at the next pump.
        if self.negotiation.has_transmits() {
            self.pump_once(channel, now)?;
            self.handle_events(now)?;
        }
        Ok(())
    }

    fn pump_once<N: Negotiator>(
        &mut self,
        channel: &mut N,
        now: Instant,
    ) -> Result<(), ControllerError> {
        pump(&mut self.negotiation, channel, now)
            .map(drop)
            .map_err(|error| match error {
                PumpError::Decode(source) => ControllerError::MalformedFrame(source),
                PumpError::Encode { source, .. } => {
                    ControllerError::Internal(InternalError::Encode(source))
                }
                PumpError::Send { source, .. } | PumpError::Recv(source) => {
                    ControllerError::Channel(Box::new(source))
                }
            })
    }

    /// Whether a control message waits to be sent ([`TierController::pump`] sends it).
    pub fn has_transmit(&self) -> bool {
        self.negotiation.has_transmits()
    }

    fn handle_events(&mut self, now: Instant) -> Result<(), ControllerError> {
        while let Some(event) = self.negotiation.poll_event() {
            match event {
                Event::Switched { from, to, .. } => {
                    if to > from {
                        self.stats.promotions += 1;
                    } else {
                        self.stats.demotions += 1;
                    }
                    self.refused = None;
                    self.demotion.tier_changed(now, to)?;
                    self.follow_grant(now, to);
                    self.changes.push_back(Change::SendTier { from, to });
                    tracing::info!(%from, %to, "send tier changed");
                }
                Event::RequestFailed { tier, cause, .. } => {
                    let refused = match cause {
                        FailureCause::Nacked(reason) => {
                            self.stats.nacks += 1;
                            Promotion::after_nack(reason) == Promotion::Refused
                        }
                        FailureCause::TimedOut { .. } => {
                            self.stats.timeouts += 1;
                            // Given up unanswered: the peer may have provisioned it.
                            self.changes.push_back(Change::Abandoned { tier });
                            true
                        }
                    };
                    // A failed demotion refuses nothing: the tiers above stay askable. It
                    // holds the next demotion back, so a peer that cannot provision the
                    // smaller tier is not asked again at every pass.
                    if refused && tier > self.send_tier() {
                        self.refuse(now, tier);
                    }
                    if tier < self.send_tier() {
                        self.demotion_held_until = now.checked_add(self.backoff());
                    }
                    tracing::info!(%tier, ?cause, refused, "tier request failed");
                }
                Event::ProvisionRequested { epoch, tier, .. } => {
                    let answer = self.provision(tier);
                    self.negotiation
                        .provisioned(now, epoch, answer)
                        .map_err(|error| {
                            ControllerError::Internal(InternalError::Provision(error))
                        })?;
                }
                Event::ProtocolViolation(violation) => {
                    return Err(ControllerError::PeerProtocol(violation));
                }
                // Over two-sided send/receive a replaced receive tier retires when its
                // posted receives come back, whatever the peer says of it; but a tier put
                // in force for an offer the peer gave up must make way again.
                Event::Retire { tier, .. } => self.follow_inbound_grant(tier),
                other => tracing::debug!(?other, "negotiation event"),
            }
        }
        Ok(())
    }

    /// After the peer gave up a request this side had provisioned, and so put in force
    /// (`retired`), puts the receive region back on the tier the peer still sends on:
    /// left in force, the abandoned tier would keep its registration, and have receives
    /// of a size the peer does not send posted, until the peer's next request. Its
    /// receives already posted drain as the peer consumes them ([`Change::Abandoned`]).
    /// A retired tier that is not in force (the old one after a switch) needs nothing.
    fn follow_inbound_grant(&mut self, retired: TierIndex) {
        let granted = self.negotiation.inbound_grant().tier;
        if retired != self.recv_cache.tier() || granted == retired {
            return;
        }
        let back = match self.recv_region.begin_change(granted) {
            Ok(mut change) => change.provision().and_then(|_| change.install(false)),
            Err(error) => Err(error),
        };
        match back {
            Ok(_) => self.changes.push_back(Change::RecvTier {
                from: retired,
                to: granted,
            }),
            Err(error) => {
                tracing::warn!(%error, tier = %granted, "receives stay on an abandoned tier");
            }
        }
    }

    /// Puts the receive region on `tier` for the peer's request: `Busy` while a tier it
    /// replaced still has receives out (the peer has not sent into them) and `tier` would
    /// need a new registration, so the region holds the tier in force and at most one
    /// draining tier, besides the retained ones below the tier in force (module
    /// invariants). A replaced registration of `tier` itself is put back in force.
    fn provision(&mut self, tier: TierIndex) -> Result<RegionDescriptor, NackReason> {
        let from = self.recv_cache.tier();
        self.recv_region.reclaim();
        if tier != from
            && self.recv_region.replaced_tiers() > 0
            && !self.recv_region.has_replaced(tier)
        {
            self.stats.recv_requests_busy += 1;
            tracing::info!(%tier, "the peer asked for a tier while the last one drains");
            return Err(NackReason::Busy);
        }
        let descriptor = match self.recv_region.begin_change(tier) {
            Ok(mut change) => change
                .provision()
                .and_then(|descriptor| change.install(false).map(|_| descriptor)),
            Err(TierError::AlreadyOn { .. }) => return Ok(self.recv_cache.descriptor()),
            Err(error) => Err(error),
        };
        match descriptor {
            Ok(descriptor) => {
                self.changes.push_back(Change::RecvTier { from, to: tier });
                Ok(descriptor)
            }
            Err(error) => {
                self.stats.recv_buffers_refused += 1;
                tracing::info!(%error, %tier, "refused the peer's tier");
                Err(match error {
                    TierError::BeyondLadder { .. } => NackReason::BeyondLadder,
                    TierError::ChangePending { .. } => NackReason::Busy,
                    _ => NackReason::OverBudget,
                })
            }
        }
    }

    /// The next tier change for the transport to apply.
    pub fn poll_change(&mut self) -> Option<Change> {
        self.changes.pop_front()
    }

    /// When [`TierController::pump`] must run even if nothing arrives: a negotiation
    /// timer, or the moment the send tier may step down.
    pub fn poll_timeout(&self) -> Option<Instant> {
        let demotion = match (self.demotion.next_deadline(), self.demotion_held_until) {
            (Some(due), Some(held)) => Some(due.max(held)),
            (due, _) => due,
        };
        match (self.negotiation.poll_timeout(), demotion) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// A view of the send region for another thread, taking send buffers of the tier in
    /// force without the controller ([`OwnedTierCache::try_acquire`]).
    pub fn send_cache(&self) -> OwnedTierCache {
        self.send_cache.clone()
    }

    /// A send buffer of the send region's tier in force, or `None` when all are held.
    #[inline]
    pub fn send_slot(&mut self) -> Option<OwnedTierSlot> {
        self.send_cache.try_acquire()
    }

    /// Whether `slot` lies in the send region's tier in force (a slot of a replaced tier
    /// goes back to its pool instead of being kept).
    #[inline]
    pub fn holds_send_slot(&mut self, slot: &OwnedTierSlot) -> bool {
        self.send_cache.holds(slot)
    }

    /// A receive buffer of the receive region's tier in force, or `None` when all are held.
    #[inline]
    pub fn recv_slot(&mut self) -> Option<OwnedTierSlot> {
        self.recv_cache.try_acquire()
    }

    /// Whether `slot` lies in the receive region's tier in force (a slot of a replaced tier
    /// is never posted again, so that tier retires).
    #[inline]
    pub fn holds_recv_slot(&mut self, slot: &OwnedTierSlot) -> bool {
        self.recv_cache.holds(slot)
    }

    /// Retires replaced tiers whose slots are all back; returns how many.
    #[inline]
    pub fn reclaim(&self) -> usize {
        self.send_region.reclaim() + self.recv_region.reclaim()
    }

    /// Bytes registered for both regions now.
    pub fn registered_bytes(&self) -> u64 {
        self.send_region.registered_bytes() + self.recv_region.registered_bytes()
    }

    /// The longest message sent whole on `tier` (0 off the ladder).
    #[inline]
    pub fn whole(&self, tier: TierIndex) -> usize {
        self.capacity.whole(tier).unwrap_or(0)
    }

    /// Counters now.
    pub fn stats(&self) -> TierStats {
        self.stats
    }

    /// The negotiation, for its grants and counters.
    pub fn negotiation(&self) -> &Negotiation {
        &self.negotiation
    }
}

impl std::fmt::Debug for TierController {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TierController")
            .field("send_tier", &self.send_tier())
            .field("refused", &self.refused)
            .field("stats", &self.stats)
            .finish_non_exhaustive()
    }
}
