//! Messages built in place in a registered send slot: [`ConnectionCore::try_reserve`],
//! [`ConnectionCore::reserved_mut`], [`ConnectionCore::commit_reserved`]. Such a message
//! must fit one frame, so it is the one send that waits for a promotion.

use std::time::Instant;

use tierbuf_tiers::OwnedTierSlot;
use tierbuf_tiers::controller::ReservePlan;

use super::core::ConnectionCore;
use super::errors::{ConnectionError, SendError, WouldBlock};
use super::header::{FrameHeader, HEADER_LEN};

/// What became of a message a sender filled in place
/// ([`ConnectionCore::try_post_filled`]).
#[derive(Debug)]
pub(crate) enum FilledOutcome {
    /// Posted from its slot.
    Posted,
    /// Not now (no credit, a segmented message ahead): offer it again later.
    Blocked(OwnedTierSlot),
    /// It does not fit one frame of the tier in force (the tier changed under the
    /// sender): send its bytes as any message.
    NotOneFrame(OwnedTierSlot),
    /// The connection failed (its failure is the core's).
    Failed,
}

impl ConnectionCore {
    /// Reserves a registered send slot for a message of `len` bytes to be built in place
    /// ([`ConnectionCore::reserved_mut`]) and sent by [`ConnectionCore::commit_reserved`],
    /// saving the copy `try_send` makes. It succeeds when the message fits one frame of
    /// the send tier in force and a data credit and a send slot are free; the credit is
    /// taken only at the commit. A message that needs a larger tier asks for it and
    /// reports [`WouldBlock::PromotionPending`], or [`WouldBlock::PromotionRefused`] while
    /// a refusal holds; one past the top tier's frame is refused
    /// ([`SendError::BeyondOneFrame`]).
    ///
    /// # Errors
    ///
    /// As above, and [`SendError::Failed`].
    pub fn try_reserve(&mut self, now: Instant, len: usize) -> Result<(), SendError> {
        self.check_failed()?;
        if self.reserved.is_some() {
            return Err(SendError::WouldBlock(WouldBlock::AlreadyReserved));
        }
        let plan = self
            .tiers
            .plan_reserve(now, len)
            .map_err(|error| self.fail_send(ConnectionError::of_controller(error)))?;
        if self.tiers.has_transmit() {
            self.pump_control(now);
            self.check_failed()?;
        }
        match plan {
            ReservePlan::Fits => {}
            ReservePlan::PromotionPending => {
                return Err(SendError::WouldBlock(WouldBlock::PromotionPending));
            }
            ReservePlan::BeyondOneFrame { max } => {
                return Err(SendError::BeyondOneFrame { len, max });
            }
            _ => return Err(SendError::WouldBlock(WouldBlock::PromotionRefused)),
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
    ///
    /// # Errors
    ///
    /// [`SendError::NothingReserved`], [`SendError::WouldBlock`], [`SendError::Failed`].
    pub fn commit_reserved(&mut self) -> Result<usize, SendError> {
        self.check_failed()?;
        let Some(len) = self.reserved.as_ref().map(|&(_, len)| len) else {
            return Err(SendError::NothingReserved);
        };
        if self.outbox.is_some() {
            return Err(SendError::WouldBlock(WouldBlock::SegmentedInFlight));
        }
        if self.frame_credit(len, true).is_none() {
            return Err(SendError::WouldBlock(WouldBlock::NoCredit));
        }
        let Some((slot, len)) = self.reserved.take() else {
            return Err(SendError::NothingReserved);
        };
        self.post_slot(FrameHeader::whole(len), slot);
        self.stats.messages_sent += 1;
        self.stats.bytes_sent += len as u64;
        Ok(len)
    }

    /// Posts a message a [`Sender`](super::Sender) wrote in place in `slot` (`len` bytes
    /// after the header room), taken from the send region on another thread: as it is
    /// when it fits one frame of the send tier in force and a data credit is free.
    pub(crate) fn try_post_filled(
        &mut self,
        now: Instant,
        slot: OwnedTierSlot,
        len: usize,
    ) -> FilledOutcome {
        if self.check_failed().is_err() {
            return FilledOutcome::Failed;
        }
        if self.outbox.is_some() || self.reserved.is_some() {
            return FilledOutcome::Blocked(slot);
        }
        let plan = match self.tiers.plan_reserve(now, len) {
            Ok(plan) => plan,
            Err(error) => {
                self.fail(ConnectionError::of_controller(error));
                return FilledOutcome::Failed;
            }
        };
        if self.tiers.has_transmit() {
            self.pump_control(now);
            if self.check_failed().is_err() {
                return FilledOutcome::Failed;
            }
        }
        if !matches!(plan, ReservePlan::Fits) {
            return FilledOutcome::NotOneFrame(slot);
        }
        if self.frame_credit(len, true).is_none() {
            return FilledOutcome::Blocked(slot);
        }
        self.post_slot(FrameHeader::whole(len), slot);
        self.stats.messages_sent += 1;
        self.stats.bytes_sent += len as u64;
        FilledOutcome::Posted
    }

    /// Gives the reserved message's slot back unsent.
    pub fn cancel_reserved(&mut self) {
        if let Some((slot, _)) = self.reserved.take() {
            self.keep_send_slot(slot);
        }
    }
}
