//! [`ConnectionCore`]: one side of a connection, sans-IO. It keeps framing, credits,
//! reassembly and the work requests for a provider endpoint; everything about tiers
//! (planning, negotiation, the tiered regions, demotion) it asks of its
//! [`TierController`]. It takes completions and the time as inputs and hands out work
//! requests (post this slot as a receive, post these bytes as a send).
//! `docs/connection.md` gives the rules it follows; the sending side is in `send.rs` and
//! `reserve.rs`, the receiving side in `receive.rs`.
//!
//! # Invariants
//!
//! - Every frame is posted against a credit, and is no longer than the receive that credit
//!   stands for (`Credits`, rule 1): a frame can never overrun the peer's buffer.
//! - Every posted receive holds its slot in `posted` until its completion; every posted
//!   send holds its slot in `sending` until its completion. A send the provider copied
//!   straight from the caller's message holds no slot there, only its place until its
//!   completion. A slot of a replaced tier is never reposted, so the tier retires once its
//!   last slot comes back. Over SEND/RECV a peer can write only into posted receives, so
//!   "every slot back" is also "the peer can no longer reach it": the receive region
//!   installs a new tier without waiting for a release.
//! - Slots come from the controller's regions through their lock-free caches, so a slot is
//!   of the tier in force when taken; `spare_send_slots` holds send slots whose sends
//!   completed, all of the send tier in force: a completed slot is kept only while its
//!   tier is in force, and a change of send tier empties the list, so a replaced tier can
//!   still retire. Once the connection has [`Sender`](super::Sender)s
//!   (`shares_send_slots`) the list stays empty: completed slots go back to their pool,
//!   where the senders' caches find them.
//! - `reserved` holds the send slot of a message being built in place, with its length;
//!   the slot is neither posted nor spare, and no credit is taken for it until it is
//!   committed. The core never writes its payload.
//! - `returns_to_lend` holds at least one reference to `returned` per posted receive
//!   (topped up as receives are posted), so a delivery lends its slot to the message
//!   without touching a reference count; `lent` counts the slots lent, and those held by
//!   messages now are `lent` less the count `returned` keeps of those given back.
//! - Tier changes are applied as the controller reports them, right after the call that
//!   made them: a new receive tier's receives are posted, a new send tier's old receives
//!   on the peer are drained.
//! - A message is delivered whole or not at all, in the order it was sent; a malformed
//!   frame fails the connection with an error that names it, and nothing after it is
//!   delivered.

use std::collections::VecDeque;
use std::fmt;
use std::sync::Arc;
use std::time::Instant;

use slab::Slab;
use tierbuf_tiers::controller::{Change, TierController};
use tierbuf_tiers::negotiator::Negotiator;
use tierbuf_tiers::{OwnedTierSlot, Reservoir, TierIndex, TierStats};

use super::config::ConnectionConfig;
use super::control::{
    ControlPath, HOLD_BEHIND_MESSAGE, InBand, MAX_HELD_CONTROL_FRAMES, MAX_WAITING_CONTROL_FRAMES,
};
use super::credits::{Credits, MIN_POSTED, PendingGrants};
use super::errors::{ConfigError, ConnectionError, PeerViolation};
use super::header::{FrameHeader, Grant};
use super::reassembly::Reassembly;
use super::receive::Message;
use super::rendezvous::Rendezvous;
use super::returns::{Node, ReturnedSlots};
use super::send::{Outbox, Payload};
use super::transmit::{Queued, Transmit};
use crate::sync;

/// Counters and the state of one side of a connection; what its tier negotiation did is
/// [`ConnectionStats::tiers`] (`stats.tiers.promotions`, say).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ConnectionStats {
    /// The tier this side sends on.
    pub send_tier: u8,
    /// The tier of the receives this side posts.
    pub recv_tier: u8,
    /// What this side's tier negotiation did: promotions, demotions, requests refused,
    /// messages that went out without waiting for a tier.
    pub tiers: TierStats,
    /// Messages accepted for sending.
    pub messages_sent: u64,
    /// Bytes of accepted messages.
    pub bytes_sent: u64,
    /// Messages accepted and sent in segments.
    pub messages_segmented: u64,
    /// Messages accepted and sent in a packed frame with others
    /// ([`ConnectionCore::try_send_batch`]).
    pub messages_packed: u64,
    /// Messages accepted and exposed for the peer to read, being too large for the tier
    /// in force ([`DataPath::OneSided`](super::DataPath::OneSided)).
    pub messages_exposed: u64,
    /// Messages delivered.
    pub messages_received: u64,
    /// Messages handed over as a copy rather than in their receive slot, because the user
    /// held so many others that too few receives would have stayed posted
    /// ([`ConnectionCore::try_recv`]).
    pub messages_copied_to_keep_receives: u64,
    /// Bytes of delivered messages.
    pub bytes_received: u64,
    /// Messages delivered after reading them from the peer, which exposed them.
    pub messages_read: u64,
    /// Messages the peer exposed that this side could not register a buffer to read
    /// into (its budget was spent): it asked for them in segments instead.
    pub reads_refused: u64,
    /// Frames posted (data, packed, control, credit and drain).
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
    /// Bytes registered for messages read by one side from the other, in use or kept for
    /// the next: this side's staging copy of one it exposes, the region it reads one
    /// into (`docs/protocol.md`, "Rendezvous").
    pub rendezvous_bytes: u64,
    /// In-band control frames waiting for a credit to be posted with (bounded: see
    /// `docs/threats.md`).
    pub control_frames_waiting: u64,
}

/// One side of a connection, sans-IO: framing, credits, reassembly and the tiers, with
/// no provider, clock or thread of its own. A driver feeds it completions and the time and
/// hands its work to an endpoint; [`Connection`](super::Connection) is the driver this
/// crate offers, and any other (a test's virtual network, an event loop of the user's)
/// drives it through the same methods.
///
/// # The contract
///
/// Its methods are of four kinds:
///
/// - **Getters**, any time: [`stats`](ConnectionCore::stats),
///   [`failure`](ConnectionCore::failure), [`send_tier`](ConnectionCore::send_tier),
///   [`is_idle`](ConnectionCore::is_idle), [`lost_data`](ConnectionCore::lost_data),
///   [`has_unsent_message`](ConnectionCore::has_unsent_message),
///   [`needs_clock`](ConnectionCore::needs_clock),
///   [`owes_credit`](ConnectionCore::owes_credit), [`config`](ConnectionCore::config).
/// - **`handle_*`**, the inputs: [`handle_completion`](ConnectionCore::handle_completion)
///   for every completion the endpoint reports for a request this core posted, whatever
///   its status, in the order the endpoint reports them.
/// - **Commands**, the user's calls: the sends ([`try_send`](ConnectionCore::try_send),
///   [`try_send_some`](ConnectionCore::try_send_some),
///   [`try_send_batch`](ConnectionCore::try_send_batch),
///   [`try_write_vectored`](ConnectionCore::try_write_vectored),
///   [`try_reserve`](ConnectionCore::try_reserve) and
///   [`commit_reserved`](ConnectionCore::commit_reserved)),
///   [`withdraw_unsent`](ConnectionCore::withdraw_unsent),
///   [`try_recv`](ConnectionCore::try_recv) and [`fail`](ConnectionCore::fail).
/// - **[`progress`](ConnectionCore::progress), `poll_*` and
///   [`transmit`](ConnectionCore::transmit)**, the outputs: `progress` runs the core's
///   own work (reposts, timers, credit and control frames) and hands it to a
///   [`Transmit`](super::Transmit) (every [`Endpoint`](crate::Endpoint) is one; a message
///   past the top tier needs one that exposes and reads, or
///   [`DataPath::TwoSided`](super::DataPath::TwoSided) on both sides);
///   `transmit` hands it the work queued, in order;
///   [`poll_timeout`](ConnectionCore::poll_timeout) says when `progress` must run if
///   nothing arrives; and [`arm`](ConnectionCore::arm) asks to be woken for work no
///   endpoint event announces (a message dropped on another thread gave its receive
///   back).
///
/// A driver's pass, in this order: hand every completion to `handle_completion` (and,
/// when [`owes_credit`](ConnectionCore::owes_credit) says so between completions, run
/// `progress`, so a peer sending a long message is granted receives as they free); run
/// [`progress`](ConnectionCore::progress) with the time and the transmitter. After every
/// command, `transmit` (the sends whose frames may lie in the caller's message,
/// `try_send` and `try_send_some`, take the transmitter and post before they return).
/// Then wait for the endpoint's next event, a wake of `arm`, or `poll_timeout`, whichever
/// comes first. Time is only what the driver passes: the core reads no clock, and a
/// driver may pass the last time it read where [`needs_clock`](ConnectionCore::needs_clock)
/// says the call does not look.
pub struct ConnectionCore {
    pub(super) config: Arc<ConnectionConfig>,
    pub(super) tiers: TierController,
    pub(super) control: ControlPath,
    pub(super) credits: Credits,
    pub(super) grants: PendingGrants,
    pub(super) reassembly: Reassembly,
    pub(super) posted: Slab<OwnedTierSlot>,
    /// The slot of each send posted and not completed; `None` for one copied from the
    /// caller's message (module invariants).
    pub(super) sending: Slab<Option<OwnedTierSlot>>,
    /// Send slots of the tier in force whose sends completed (module invariants).
    pub(super) spare_send_slots: Vec<OwnedTierSlot>,
    /// Whether senders on other threads take slots of the send region too: completed
    /// slots then go back to their pool at once, not into `spare_send_slots`.
    pub(super) shares_send_slots: bool,
    /// The slot and length of a message being built in place (module invariants).
    pub(super) reserved: Option<(OwnedTierSlot, usize)>,
    pub(super) work: VecDeque<Queued>,
    pub(super) delivered: VecDeque<Message>,
    pub(super) returned: sync::Arc<ReturnedSlots>,
    /// References to `returned` for the messages of the receives posted: one per posted
    /// receive, cloned when it is posted (module invariants).
    pub(super) returns_to_lend: Vec<sync::Arc<ReturnedSlots>>,
    /// Receive slots lent to messages, ever.
    pub(super) lent: usize,
    /// Nodes to lend slots with (`returns.rs`), kept from the slots given back.
    #[expect(
        clippy::vec_box,
        reason = "a node is lent out and pushed by its address, so it lives in a box of its own"
    )]
    pub(super) spare_nodes: Vec<Box<Node>>,
    pub(super) outbox: Option<Outbox>,
    /// A finished outbox's buffer, empty, kept for the next segmented message.
    pub(super) spare_outbox: Vec<u8>,
    /// When a message too large for the tier in force (segmented or exposed) was last
    /// sent or received; spare buffers are freed after the ladder's `demote_after`
    /// without one.
    pub(super) oversize_at: Option<Instant>,
    /// Messages read by one side from the other (`rendezvous.rs`).
    pub(super) rendezvous: Rendezvous,
    /// The peer's receives of a replaced tier still to consume after a send-tier change.
    pub(super) drains_owed: u32,
    /// Drain frames that may still go for the peer's receives of tiers this side does not
    /// send on ([`ConnectionCore::drain_foreign`]): refilled to the most credits the peer
    /// can grant ([`ConnectionConfig::max_send_credits`]) at each send-tier change and
    /// each request given up, so a peer that went on posting such receives could not keep
    /// this side draining.
    pub(super) foreign_drains_left: u32,
    /// Until when the peer's in-band control frames wait behind a segmented message
    /// ([`HOLD_BEHIND_MESSAGE`]); `None` when they are answered as they come.
    pub(super) control_held_until: Option<Instant>,
    /// Whether a send that carried message bytes completed with an error.
    pub(super) lost_data: bool,
    pub(super) failed: Option<Arc<ConnectionError>>,
    pub(super) stats: ConnectionStats,
}

impl ConnectionCore {
    /// One side of a new connection on tier 0, its send buffers from `send_reservoir` and
    /// its receive buffers from `recv_reservoir` (both for `config`'s ladder), negotiating
    /// tiers in band (control frames of the connection itself). Posts every tier-0 receive
    /// at once (see [`ConnectionCore::transmit`]); the peer's tier-0 receives are this
    /// side's first credits.
    ///
    /// # Errors
    ///
    /// [`ConfigError::Register`] when the first tier's buffers cannot be registered.
    pub fn new(
        config: Arc<ConnectionConfig>,
        send_reservoir: Arc<Reservoir>,
        recv_reservoir: Arc<Reservoir>,
        now: Instant,
    ) -> Result<ConnectionCore, ConfigError> {
        ConnectionCore::with_control(
            config,
            send_reservoir,
            recv_reservoir,
            ControlPath::InBand(InBand::default()),
            now,
        )
    }

    /// [`ConnectionCore::new`], negotiating tiers through `negotiator`, a channel of the
    /// caller's own (a TCP connection beside the data path, say), instead of in band. Both
    /// sides must use one. The channel must deliver frames in order; it need not be
    /// ordered with the connection's data. Every progress pass polls it (`recv_frame`), so
    /// it should answer "nothing waiting" cheaply. `transport/tests/negotiator_tcp.rs` runs one
    /// over a TCP side channel; here the two ends of an in-process channel:
    ///
    /// ```
    /// use std::sync::Arc;
    /// use std::time::Instant;
    /// use tierbuf_pool::MemoryBudget;
    /// use tierbuf_tiers::{Reservoir, ladder::TierLadder, negotiator::InMemoryNegotiator};
    /// use tierbuf_transport::connection::{Connection, ConnectionConfig, ConnectionCore};
    /// use tierbuf_transport::{LoopbackProvider, Provider};
    ///
    /// let provider = LoopbackProvider::new(MemoryBudget::with_cap(64 << 20));
    /// let config = Arc::new(ConnectionConfig::new(Arc::new(TierLadder::preset("two-tier")?))?);
    /// let reservoir = Arc::new(Reservoir::new(provider.registrar(), Arc::clone(config.ladder())));
    /// let (a, b) = provider.pair(config.queue_depth(), config.queue_depth())?;
    /// let (a_channel, b_channel) = InMemoryNegotiator::pair();
    /// let connect = |endpoint, channel| {
    ///     let core = ConnectionCore::with_negotiator(
    ///         Arc::clone(&config), Arc::clone(&reservoir), Arc::clone(&reservoir), channel, Instant::now(),
    ///     )?;
    ///     Ok::<_, Box<dyn std::error::Error>>(Connection::new(core, endpoint)?)
    /// };
    /// let (mut a, mut b) = (connect(a, a_channel)?, connect(b, b_channel)?);
    /// for _ in 0..2 {
    ///     a.send(&[7u8; 4000])?; // past tier 0: promoted over the channel
    ///     assert_eq!(b.recv()?.len(), 4000);
    /// }
    /// assert_eq!(a.stats().send_tier, 1);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`ConfigError::Register`] when the first tier's buffers cannot be registered.
    pub fn with_negotiator<N: Negotiator + Send + 'static>(
        config: Arc<ConnectionConfig>,
        send_reservoir: Arc<Reservoir>,
        recv_reservoir: Arc<Reservoir>,
        negotiator: N,
        now: Instant,
    ) -> Result<ConnectionCore, ConfigError> {
        ConnectionCore::with_control(
            config,
            send_reservoir,
            recv_reservoir,
            ControlPath::External(Box::new(negotiator)),
            now,
        )
    }

    fn with_control(
        config: Arc<ConnectionConfig>,
        send_reservoir: Arc<Reservoir>,
        recv_reservoir: Arc<Reservoir>,
        control: ControlPath,
        now: Instant,
    ) -> Result<ConnectionCore, ConfigError> {
        let rendezvous = Rendezvous::new(Arc::clone(&send_reservoir), Arc::clone(&recv_reservoir));
        let tiers = TierController::new(
            Arc::clone(config.capacity()),
            config.negotiation().clone(),
            send_reservoir,
            recv_reservoir,
            now,
        )
        .map_err(ConfigError::Register)?;
        let spare_buffer_limit = config.spare_buffer_limit();
        let smallest = &config.ladder().tiers()[0];
        let credits = Credits::starting_with(
            config.max_send_credits(),
            Grant {
                tier: 0,
                count: u16::try_from(smallest.slot_count()).unwrap_or(u16::MAX),
            },
        );
        let mut core = ConnectionCore {
            reassembly: Reassembly::new(config.max_message_len()),
            config,
            tiers,
            control,
            credits,
            grants: PendingGrants::default(),
            posted: Slab::new(),
            sending: Slab::new(),
            spare_send_slots: Vec::new(),
            shares_send_slots: false,
            reserved: None,
            work: VecDeque::new(),
            delivered: VecDeque::new(),
            returned: ReturnedSlots::new(spare_buffer_limit),
            returns_to_lend: Vec::new(),
            lent: 0,
            spare_nodes: Vec::new(),
            outbox: None,
            spare_outbox: Vec::new(),
            oversize_at: None,
            rendezvous,
            drains_owed: 0,
            foreign_drains_left: 0,
            control_held_until: None,
            lost_data: false,
            failed: None,
            stats: ConnectionStats::default(),
        };
        core.post_receives();
        // The peer counts our tier-0 receives as its initial credits: they are not granted.
        core.grants = PendingGrants::default();
        Ok(core)
    }

    /// The next time [`ConnectionCore::progress`] must run even if nothing arrives: a
    /// negotiation timer, the moment the send tier may step down, the end of a hold of
    /// the peer's control behind a message, the deadline of a message exposed to the peer,
    /// or the moment the spare buffers of the last message too large for its tier go.
    pub fn poll_timeout(&self) -> Option<Instant> {
        // The spares a message too large for its tier left (registered regions among
        // them) go when their time is up, whether or not anything else wakes the
        // connection then.
        let spares_go = self
            .oversize_at
            .filter(|_| self.failed.is_none())
            .map(|at| at + self.config.ladder().policy().demote_after());
        [
            self.tiers.poll_timeout(),
            self.control_held_until,
            self.rendezvous.deadline(),
            spares_go,
        ]
        .into_iter()
        .flatten()
        .min()
    }

    /// Counters and state now.
    pub fn stats(&self) -> ConnectionStats {
        ConnectionStats {
            send_tier: self.send_tier().get(),
            recv_tier: self.tiers.recv_tier().get(),
            tiers: self.tiers.stats(),
            registered_bytes: self.tiers.registered_bytes(),
            posted_receives: self.posted.len() as u64,
            receives_lent: (self.lent - self.returned.given_back()) as u64,
            send_credits: u64::from(self.credits.total()),
            control_frames_waiting: self.control.waiting() as u64,
            spare_buffer_bytes: (self.spare_outbox.capacity()
                + self.returned.spare_buffer_capacity()) as u64,
            rendezvous_bytes: (self.rendezvous.registered_bytes()
                + self.returned.spare_landing_len()) as u64,
            ..self.stats
        }
    }

    /// The configuration this side was made with.
    pub fn config(&self) -> &Arc<ConnectionConfig> {
        &self.config
    }

    /// The error the connection failed with, if it did.
    pub fn failure(&self) -> Option<&Arc<ConnectionError>> {
        self.failed.as_ref()
    }

    /// Fails the connection with `error` (a provider failure, say): sends and receives
    /// report it from now on. The first failure stays: the one in force is returned.
    pub fn fail(&mut self, error: ConnectionError) -> &Arc<ConnectionError> {
        self.failed.get_or_insert_with(|| {
            tracing::warn!(%error, fault = ?error.fault(), "connection failed");
            Arc::new(error)
        })
    }

    /// The tier the peer has granted this side to send on.
    pub fn send_tier(&self) -> TierIndex {
        self.tiers.send_tier()
    }

    /// Whether either direction is on a tier above the smallest: whether this side holds
    /// registered memory that demotions would give back.
    #[cfg(feature = "tokio")]
    pub(super) fn above_smallest_tier(&self) -> bool {
        self.tiers.send_tier().get() > 0 || self.tiers.recv_tier().get() > 0
    }

    /// Whether a message taken on has not all reached the peer: a segmented one with
    /// bytes still to post, or one exposed for the peer to read that it has not read.
    pub fn has_unsent_message(&self) -> bool {
        self.outbox.is_some() || self.rendezvous.is_unread()
    }

    /// Whether everything accepted has been posted and every posted send completed, no
    /// message is exposed to the peer or being read from it, and no frame saying one was
    /// read waits for a credit.
    pub fn is_idle(&self) -> bool {
        self.outbox.is_none()
            && self.control.is_idle()
            && self.sending.is_empty()
            && !self.rendezvous.is_busy()
    }

    /// Whether sending or reserving a message of `len` bytes needs the time. It does not
    /// for a message that a frame of the smallest tier carries whole: such a send starts no
    /// promotion and tells the demotion policy nothing (every tier fits it), so
    /// [`ConnectionCore::try_send`], [`ConnectionCore::try_reserve`] and
    /// [`ConnectionCore::commit_reserved`] do not read their `now`, and a driver may pass
    /// the last time it read instead of reading the clock again.
    pub fn needs_clock(&self, len: usize) -> bool {
        self.tiers.needs_clock(len)
    }

    /// Runs the connection's own work and hands it to `to`: reposts returned receive
    /// slots, pumps the negotiation (timers, a demotion the policy suggests), and sends
    /// control, drain, segment and credit frames; then [`ConnectionCore::transmit`]s what
    /// is queued. A returned slot is posted straight through `to` while nothing is queued
    /// ahead of it. Returns how many requests it posted.
    pub fn progress(&mut self, now: Instant, to: &mut impl Transmit) -> usize {
        if self.failed.is_some() {
            return self.transmit(to);
        }
        // Free receive slots of the tier in force are posted when it is installed and
        // reposted as they come back, so nothing else needs posting here.
        let reposted = self.repost_returned_through(to);
        // A pass with no control work (most passes of a steady connection) costs one look.
        if self.control.has_work(&self.tiers, now) {
            self.pump_control(now);
        } else if self.control.waiting() > 0 {
            self.send_control();
        }
        if self.foreign_drains_left > 0 && !self.credits.only_of(self.tiers.send_tier().get()) {
            self.drain_foreign();
        }
        while self.drains_owed > 0 && self.credits.total() > 0 {
            if !self.post_frame(FrameHeader::drain(), Payload::Empty, false) {
                break;
            }
            self.drains_owed -= 1;
        }
        if self.outbox.is_some() {
            self.send_segments();
        }
        if self.rendezvous.is_busy() {
            self.check_read_deadline(now);
            self.send_answer();
        }
        while self.owes_credit() {
            if !self.post_frame(FrameHeader::credit(), Payload::Empty, false) {
                break;
            }
        }
        self.tiers.reclaim();
        let idle_for = self.config.ladder().policy().demote_after();
        if self
            .oversize_at
            .is_some_and(|at| now.saturating_duration_since(at) >= idle_for)
        {
            self.oversize_at = None;
            self.spare_outbox = Vec::new();
            self.returned.drop_spare_buffer();
            if let Some(landing) = self.returned.take_spare_landing() {
                super::rendezvous::give_back(self.rendezvous.recv_reservoir(), landing);
            }
            self.rendezvous.drop_spare();
        }
        reposted + self.transmit(to)
    }

    /// Asks for `waker` to be woken when the core has work no endpoint event announces: a
    /// receive slot given back by a message dropped on another thread. Pending when its
    /// own progress has work now: slots given back and not yet reposted, credit owed, or
    /// work requests not yet handed out.
    pub fn arm(&self, waker: &std::task::Waker) -> crate::provider::Armed {
        if self.owes_credit() || !self.work.is_empty() {
            return crate::provider::Armed::Pending;
        }
        self.returned.arm(waker)
    }

    /// Ends a wait begun with [`ConnectionCore::arm`].
    pub fn disarm(&self) {
        self.returned.disarm();
    }

    /// Whether receives posted since the peer last heard of them are enough to send a
    /// credit frame for: half the receives posted (at least two); or any freed by data,
    /// control or a dropped message while this side's last credit is the one the frame
    /// would take, or while the receives the peer knows of are fewer than `MIN_POSTED`. Receives that credit and drain
    /// frames consumed are granted with the next frame, never urgently: otherwise two sides
    /// left one credit each would answer each other's credit frames for ever.
    /// [`ConnectionCore::progress`] sends it; a driver that takes many completions in a row
    /// (segments of a large message) runs `progress` as soon as this says so, so the peer
    /// can go on sending while this side reassembles.
    pub fn owes_credit(&self) -> bool {
        let pending = self.grants.total();
        let threshold = (self.posted.len() as u32 / 2).max(2);
        let known_to_peer = (self.posted.len() as u32).saturating_sub(pending);
        pending >= threshold
            || (self.grants.is_urgent()
                && (self.credits.total() == 1 || known_to_peer < MIN_POSTED))
    }

    /// Pumps the negotiation through the control path, applies the tier changes it made,
    /// and posts the control frames it sent (in band). While the peer's control is held
    /// behind a message it only posts the frames already waiting.
    pub(super) fn pump_control(&mut self, now: Instant) {
        if self.control_held(now) {
            self.send_control();
            return;
        }
        if let Err(error) = self.control.pump(&mut self.tiers, now) {
            self.fail(ConnectionError::of_controller(error));
            return;
        }
        self.apply_changes();
        self.send_control();
    }

    /// Holds the peer's in-band control frames behind the segmented message being
    /// received ([`HOLD_BEHIND_MESSAGE`]), if one is half received, none is held yet, and
    /// the receives posted now can take the rest of it: a message that needs more credit
    /// turns than that would outlast the hold, and is better served by the promotion
    /// going ahead (its later frames grow with the new tier).
    pub(super) fn hold_control_behind_message(&mut self, now: Instant) {
        let Some(remaining) = self.reassembly.remaining() else {
            return;
        };
        let frame = self
            .config
            .capacity()
            .frame(self.tiers.recv_tier())
            .unwrap_or(0);
        let window = (self.posted.len() * frame) as u64;
        if remaining <= window && self.control_held_until.is_none() {
            self.control_held_until = Some(now + HOLD_BEHIND_MESSAGE);
        }
    }

    /// Owes a drain for each credit up to the last one of a tier this side does not send
    /// on, while no request of its own is pending (whose tier's receives it will want),
    /// within [`ConnectionCore::foreign_drains_left`]. A switch drains the credits ahead of
    /// the new tier's; this also drains what a switch could not see: receives the peer
    /// posted for a request this side gave up (they may come after it gave up), or of an
    /// old tier behind the new tier's first ones. Until they are consumed their tier
    /// cannot retire on the peer's side, and an idle connection consumes nothing.
    fn drain_foreign(&mut self) {
        if self.tiers.negotiation().pending_request().is_some() {
            return;
        }
        let through = self
            .credits
            .through_last_not_of(self.tiers.send_tier().get());
        let more = through
            .saturating_sub(self.drains_owed)
            .min(self.foreign_drains_left);
        self.drains_owed += more;
        self.foreign_drains_left -= more;
    }

    /// Whether the peer's control frames are held behind a message now: until no message
    /// is half received or waits to be taken, the hold's time is up, or
    /// [`MAX_HELD_CONTROL_FRAMES`] wait.
    fn control_held(&mut self, now: Instant) -> bool {
        let Some(until) = self.control_held_until else {
            return false;
        };
        if now < until
            && (self.reassembly.remaining().is_some() || !self.delivered.is_empty())
            && self.control.received() < MAX_HELD_CONTROL_FRAMES
        {
            return true;
        }
        self.control_held_until = None;
        false
    }

    fn apply_changes(&mut self) {
        while let Some(change) = self.tiers.poll_change() {
            match change {
                Change::SendTier { to, .. } => {
                    self.drains_owed = self.credits.ahead_of(to.get());
                    self.spare_send_slots.clear();
                    self.foreign_drains_left = self.config.max_send_credits();
                }
                Change::RecvTier { .. } => self.post_receives(),
                Change::Abandoned { .. } => {
                    self.foreign_drains_left = self.config.max_send_credits();
                }
                other => tracing::debug!(?other, "tier change"),
            }
        }
    }

    /// Posts the in-band control frames waiting, in order, as credits allow; fails the
    /// connection if more than [`MAX_WAITING_CONTROL_FRAMES`] are left waiting.
    fn send_control(&mut self) {
        loop {
            let ControlPath::InBand(in_band) = &mut self.control else {
                return;
            };
            let Some(outgoing) = in_band.outgoing.pop_front() else {
                return;
            };
            let bytes = outgoing.frame.bytes();
            let header = FrameHeader::control(bytes.len());
            if !self.post_frame(header, Payload::Bytes(bytes), false) {
                if let ControlPath::InBand(in_band) = &mut self.control {
                    in_band.outgoing.push_front(outgoing);
                }
                break;
            }
        }
        let waiting = self.control.waiting();
        if waiting > MAX_WAITING_CONTROL_FRAMES {
            self.fail(ConnectionError::PeerProtocol(
                PeerViolation::ControlBacklog {
                    waiting,
                    limit: MAX_WAITING_CONTROL_FRAMES,
                },
            ));
        }
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
