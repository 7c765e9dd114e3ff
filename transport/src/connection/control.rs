//! How a connection's control messages reach the peer: as control frames of the
//! connection itself ([`InBand`]), or through a [`Negotiator`] of the user's own. Either
//! way the connection's [`TierController`] moves them with
//! [`TierController::pump`]: the in-band path is one more negotiator, not a second
//! mechanism.
//!
//! # Invariants
//!
//! - [`InBand`] holds whole encoded frames only: what the controller sends waits in
//!   `outgoing` until the connection posts it as a control frame (in order, against any
//!   credit); a received control frame waits in `incoming` only until the next pump, which
//!   the connection runs as soon as the frame arrives, unless it holds the peer's control
//!   behind a message ([`HOLD_BEHIND_MESSAGE`]).
//! - `outgoing` holds no repeat and at most one answer
//!   ([`enqueue_control`](tierbuf_tiers::negotiation::enqueue_control)): a frame whose copy
//!   still waits is not queued again, and an answer takes the place of the older ones. So a
//!   peer that repeats a request, or keeps asking, while it grants no credit leaves at
//!   most one answer waiting. What this side asks on its own account may still pile up
//!   while the peer grants nothing; past [`MAX_WAITING_CONTROL_FRAMES`] the connection
//!   fails, blaming the peer (`PeerViolation::ControlBacklog`).

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use tierbuf_tiers::controller::{ControllerError, TierController};
use tierbuf_tiers::negotiation::enqueue_control;
use tierbuf_tiers::negotiator::Negotiator;
use tierbuf_tiers::wire::{self, ControlMessage, MAX_FRAME_LEN};

/// The most in-band control frames that may wait for a credit. Repeats and superseded
/// answers are never queued, so an honest peer, which grants a credit back for every
/// control frame it takes (`docs/connection.md`, rule 3), leaves a handful waiting at
/// most; this many means it has granted nothing for a long time while this side kept
/// asking (each request given up and asked again adds two frames), and the connection
/// fails rather than queue without end.
pub(super) const MAX_WAITING_CONTROL_FRAMES: usize = 256;

/// The longest the peer's in-band control frames wait behind a segmented message that
/// was half received when they arrived, with no more to come than the receives posted
/// can take (`docs/connection.md`, rule 9). A peer asks for a promotion after the first
/// segments of the message that needs it; answering at once would put the new tier's
/// provisioning (registration, and on shm a memory file passed and mapped) between those
/// segments and the rest, so the message would pay for the promotion it was sent
/// segmented to avoid. The connection answers once the message has been taken, or when
/// this much time has passed, so a receiver that is not reading, or a peer that leaves a
/// message open, delays the answers by no more.
pub(super) const HOLD_BEHIND_MESSAGE: Duration = Duration::from_micros(250);

/// The most peer control frames held behind a message: an honest peer sends one or two
/// per message (a request, a release), so more means it is sending them to be held, and
/// the hold ends, keeping what waits small whatever the peer sends.
pub(super) const MAX_HELD_CONTROL_FRAMES: usize = 16;

/// One encoded control frame.
#[derive(Debug, Clone, Copy)]
pub(super) struct ControlFrame {
    bytes: [u8; MAX_FRAME_LEN],
    len: usize,
}

impl ControlFrame {
    pub(super) fn new(frame: &[u8]) -> ControlFrame {
        let mut bytes = [0u8; MAX_FRAME_LEN];
        let len = frame.len().min(MAX_FRAME_LEN);
        bytes[..len].copy_from_slice(&frame[..len]);
        ControlFrame { bytes, len }
    }

    pub(super) fn bytes(&self) -> &[u8] {
        &self.bytes[..self.len]
    }
}

/// A frame the controller sent, with the message it encodes.
#[derive(Debug, Clone, Copy)]
pub(super) struct Outgoing {
    pub(super) message: ControlMessage,
    pub(super) frame: ControlFrame,
}

/// Control frames carried by the connection's own frames.
#[derive(Debug, Default)]
pub(super) struct InBand {
    /// Frames the controller sent, to post as control frames, oldest first (module
    /// invariants).
    pub(super) outgoing: VecDeque<Outgoing>,
    /// Frames the peer's control frames carried, for the next pump.
    pub(super) incoming: VecDeque<ControlFrame>,
}

impl Negotiator for InBand {
    type Error = wire::WireError;

    fn send_frame(&mut self, frame: &[u8]) -> Result<(), wire::WireError> {
        // The controller's own encoding: it decodes, or the controller has a bug, which
        // the error reports.
        let message = wire::decode(frame)?;
        let outgoing = Outgoing {
            message,
            frame: ControlFrame::new(frame),
        };
        enqueue_control(&mut self.outgoing, outgoing, |outgoing| &outgoing.message);
        Ok(())
    }

    fn recv_frame(&mut self, buf: &mut [u8]) -> Result<Option<usize>, wire::WireError> {
        Ok(self.incoming.pop_front().map(|frame| {
            let len = frame.len.min(buf.len());
            buf[..len].copy_from_slice(&frame.bytes[..len]);
            len
        }))
    }
}

/// A user's negotiator, behind one object type whatever its error type.
pub(super) trait Channel: Send {
    /// [`TierController::pump`] through this channel.
    fn pump(
        &mut self,
        controller: &mut TierController,
        now: Instant,
    ) -> Result<(), ControllerError>;
}

impl<N: Negotiator + Send> Channel for N {
    fn pump(
        &mut self,
        controller: &mut TierController,
        now: Instant,
    ) -> Result<(), ControllerError> {
        controller.pump(self, now)
    }
}

/// The way a connection's control messages travel.
pub(super) enum ControlPath {
    /// As the connection's own control frames.
    InBand(InBand),
    /// Over a channel of the user's.
    External(Box<dyn Channel>),
}

impl ControlPath {
    /// Pumps the controller through this path.
    pub(super) fn pump(
        &mut self,
        controller: &mut TierController,
        now: Instant,
    ) -> Result<(), ControllerError> {
        match self {
            ControlPath::InBand(in_band) => controller.pump(in_band, now),
            ControlPath::External(channel) => channel.pump(controller, now),
        }
    }

    /// Whether [`ControlPath::pump`] has anything to do at `now`: a frame of the peer's
    /// waits, the controller has a message to send, or one of its timers is due. A user's
    /// channel may hold frames this side cannot see, so it is always pumped.
    pub(super) fn has_work(&self, controller: &TierController, now: Instant) -> bool {
        match self {
            ControlPath::InBand(in_band) => {
                !in_band.incoming.is_empty()
                    || controller.has_transmit()
                    || controller.poll_timeout().is_some_and(|due| due <= now)
            }
            ControlPath::External(_) => true,
        }
    }

    /// The peer's control frames waiting for the next pump (in band; none over a user's
    /// channel).
    pub(super) fn received(&self) -> usize {
        match self {
            ControlPath::InBand(in_band) => in_band.incoming.len(),
            ControlPath::External(_) => 0,
        }
    }

    /// Control frames waiting to be posted (in band; none over a user's channel).
    pub(super) fn waiting(&self) -> usize {
        match self {
            ControlPath::InBand(in_band) => in_band.outgoing.len(),
            ControlPath::External(_) => 0,
        }
    }

    /// Whether nothing waits to be posted as a control frame.
    pub(super) fn is_idle(&self) -> bool {
        match self {
            ControlPath::InBand(in_band) => in_band.outgoing.is_empty(),
            ControlPath::External(_) => true,
        }
    }
}

impl std::fmt::Debug for ControlPath {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ControlPath::InBand(in_band) => f.debug_tuple("InBand").field(in_band).finish(),
            ControlPath::External(_) => f.write_str("External"),
        }
    }
}
