//! The outbound machine: this side sends data and asks the peer to provision its receive
//! buffers.
//!
//! ```text
//! stable(grant) --request_tier--> requested(epoch, target, attempts, deadline)
//! requested --valid ack of epoch--> stable(new grant)      [send Released, Event::Switched]
//! requested --nack of epoch--> stable(grant)               [Event::RequestFailed]
//! requested --timeout, attempts < max--> requested         [send the same Request again]
//! requested --timeout, attempts = max--> stable(grant)     [send Abandon, Event::RequestFailed]
//! requested --request_tier(other)--> requested(new epoch)  [send Abandon, send Request]
//! ```
//!
//! Invariants kept here: the grant changes only on an ack of the pending epoch that matches
//! the ladder; an epoch, once abandoned, is never pending again (epochs only grow), so an ack
//! of it is answered with another abandon and never applied.

use std::time::Instant;

use super::{
    Event, FailureCause, NegotiationConfig, Outputs, PendingRequest, ProtocolViolation,
    RequestError, RequestStatus, TierGrant, TierShape,
};
use crate::wire::{ControlMessage, Epoch, NackReason};
use crate::{RegionDescriptor, TierIndex};

#[derive(Debug)]
pub(super) struct Outbound {
    grant: TierGrant,
    pending: Option<PendingRequest>,
    next_epoch: Epoch,
}

impl Outbound {
    pub(super) fn new() -> Outbound {
        Outbound {
            grant: TierGrant::INITIAL,
            pending: None,
            next_epoch: Epoch::INITIAL.next(),
        }
    }

    pub(super) fn grant(&self) -> TierGrant {
        self.grant
    }

    pub(super) fn pending(&self) -> Option<PendingRequest> {
        self.pending
    }

    pub(super) fn poll_timeout(&self) -> Option<Instant> {
        self.pending.map(|pending| pending.deadline)
    }

    pub(super) fn request_tier(
        &mut self,
        config: &NegotiationConfig,
        now: Instant,
        target: TierIndex,
        outputs: &mut Outputs,
    ) -> Result<RequestStatus, RequestError> {
        if config.shape(target).is_none() {
            return Err(RequestError::BeyondLadder {
                tier: target,
                ladder_len: config.tiers().len(),
            });
        }
        if let Some(pending) = self.pending {
            if pending.target == target {
                return Ok(RequestStatus::AlreadyPending {
                    epoch: pending.epoch,
                });
            }
            tracing::debug!(epoch = %pending.epoch, tier = %pending.target, "request superseded");
            self.abandon(outputs);
        }
        if target == self.grant.tier {
            return Ok(RequestStatus::InForce);
        }
        let epoch = self.next_epoch;
        self.next_epoch = epoch.next();
        self.pending = Some(PendingRequest {
            epoch,
            target,
            attempts: 1,
            deadline: config.deadline_after(now),
        });
        tracing::debug!(%epoch, from = %self.grant.tier, to = %target, "tier requested");
        outputs.send(self.request_message(epoch, target));
        Ok(RequestStatus::Requested { epoch })
    }

    fn request_message(&self, epoch: Epoch, tier: TierIndex) -> ControlMessage {
        ControlMessage::Request {
            epoch,
            tier,
            current: self.grant.epoch,
        }
    }

    /// Gives up the pending request and tells the peer it will never be used.
    fn abandon(&mut self, outputs: &mut Outputs) {
        if let Some(pending) = self.pending.take() {
            outputs.send(ControlMessage::Abandon {
                epoch: pending.epoch,
            });
        }
    }

    pub(super) fn handle_ack(
        &mut self,
        config: &NegotiationConfig,
        epoch: Epoch,
        tier: TierIndex,
        shape: TierShape,
        region: RegionDescriptor,
        outputs: &mut Outputs,
    ) {
        let Some(pending) = self.pending.filter(|pending| pending.epoch == epoch) else {
            self.answer_unexpected_ack(epoch, outputs);
            return;
        };
        if let Err(violation) = validate_ack(config, pending, tier, shape, region) {
            outputs.violation(violation);
            return;
        }
        let from = self.grant.tier;
        self.grant = TierGrant { epoch, tier };
        self.pending = None;
        tracing::info!(%epoch, %from, to = %tier, "outbound tier switched");
        outputs.send(ControlMessage::Released { epoch });
        outputs.emit(Event::Switched {
            epoch,
            from,
            to: tier,
            shape,
            region,
        });
    }

    /// An ack of an epoch that is not pending: a repeat the peer sends because our answer got
    /// lost, a late copy, or nonsense.
    fn answer_unexpected_ack(&mut self, epoch: Epoch, outputs: &mut Outputs) {
        if epoch >= self.next_epoch {
            outputs.violation(ProtocolViolation::AnswerToUnrequestedEpoch { epoch });
        } else if epoch == self.grant.epoch {
            // The peer still offers what we use: our release got lost.
            outputs.stats.duplicates += 1;
            outputs.send(ControlMessage::Released { epoch });
        } else if epoch > self.grant.epoch {
            // An epoch we gave up: our abandon got lost, or crossed this ack.
            outputs.stats.stale += 1;
            outputs.send(ControlMessage::Abandon { epoch });
        } else {
            outputs.stats.stale += 1;
        }
    }

    pub(super) fn handle_nack(
        &mut self,
        epoch: Epoch,
        tier: TierIndex,
        reason: NackReason,
        outputs: &mut Outputs,
    ) {
        let Some(pending) = self.pending.filter(|pending| pending.epoch == epoch) else {
            if epoch >= self.next_epoch {
                outputs.violation(ProtocolViolation::AnswerToUnrequestedEpoch { epoch });
            } else {
                outputs.stats.stale += 1;
            }
            return;
        };
        if tier != pending.target {
            outputs.violation(ProtocolViolation::NackWrongTier {
                epoch,
                requested: pending.target,
                nacked: tier,
            });
            return;
        }
        self.pending = None;
        tracing::info!(%epoch, %tier, %reason, "tier request refused by the peer");
        outputs.emit(Event::RequestFailed {
            epoch,
            tier,
            cause: FailureCause::Nacked(reason),
        });
    }

    pub(super) fn handle_timeout(
        &mut self,
        config: &NegotiationConfig,
        now: Instant,
        outputs: &mut Outputs,
    ) {
        let Some(pending) = self.pending.filter(|pending| pending.deadline <= now) else {
            return;
        };
        if pending.attempts < config.max_attempts() {
            self.pending = Some(PendingRequest {
                attempts: pending.attempts + 1,
                deadline: config.deadline_after(now),
                ..pending
            });
            outputs.stats.retransmissions += 1;
            tracing::debug!(epoch = %pending.epoch, attempt = pending.attempts + 1, "tier request sent again");
            outputs.send(self.request_message(pending.epoch, pending.target));
        } else {
            tracing::info!(epoch = %pending.epoch, tier = %pending.target, attempts = pending.attempts, "tier request given up");
            self.abandon(outputs);
            outputs.emit(Event::RequestFailed {
                epoch: pending.epoch,
                tier: pending.target,
                cause: FailureCause::TimedOut {
                    attempts: pending.attempts,
                },
            });
        }
    }
}

/// Checks an ack of the pending request against the request and this side's ladder.
fn validate_ack(
    config: &NegotiationConfig,
    pending: PendingRequest,
    tier: TierIndex,
    shape: TierShape,
    region: RegionDescriptor,
) -> Result<(), ProtocolViolation> {
    let epoch = pending.epoch;
    if tier != pending.target {
        return Err(ProtocolViolation::AckWrongTier {
            epoch,
            requested: pending.target,
            acked: tier,
        });
    }
    // A pending target was checked against the ladder when it was requested.
    if let Some(expected) = config.shape(tier).filter(|expected| *expected != shape) {
        return Err(ProtocolViolation::AckShapeMismatch {
            epoch,
            tier,
            expected,
            found: shape,
        });
    }
    if region.len < shape.region_len() {
        return Err(ProtocolViolation::AckRegionTooShort {
            epoch,
            tier,
            needed: shape.region_len(),
            len: region.len,
        });
    }
    Ok(())
}
