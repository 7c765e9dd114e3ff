//! The inbound machine: this side receives data and provisions receive buffers for the peer.
//!
//! ```text
//! idle --request(e), tier past the ladder--> nacked(e)        [send Nack BeyondLadder]
//! idle --request(e)--> provisioning(e)                        [Event::ProvisionRequested]
//! provisioning(e) --provisioned(e, Ok)--> acked(e, deadline)  [send Ack]
//! provisioning(e) --provisioned(e, Err)--> nacked(e)          [send Nack]
//! acked(e) --Released(e)--> idle, e in force                  [Event::PeerSwitched, Retire old]
//! acked(e) --Abandon(e)--> idle                               [Event::Retire e]
//! acked(e) --timeout--> acked(e)                              [send the same Ack again]
//! provisioning(e) --Abandon(e)--> idle; e retired when the owner hands it in
//! any --request(e' > e, current)--> the offer of e resolved by `current`, then as idle
//! ```
//!
//! Invariants kept here: the region in force is retired only after the peer confirmed it
//! switched away from it; an offered region only after the peer confirmed it will never use
//! it; each epoch is provisioned at most once (a repeated request gets the same answer);
//! nothing past this side's ladder reaches the owner.

use std::time::Instant;

use super::{
    Event, NegotiationConfig, Outputs, ProtocolViolation, ProvisionError, TierGrant, TierShape,
};
use crate::wire::{ControlMessage, Epoch, NackReason};
use crate::{RegionDescriptor, TierIndex};

/// What the inbound machine has done about the latest request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Offer {
    /// Nothing outstanding.
    Idle,
    /// The owner is provisioning.
    Provisioning { epoch: Epoch, tier: TierIndex },
    /// Provisioned and acked; waiting for the peer to switch or to abandon.
    Acked {
        epoch: Epoch,
        tier: TierIndex,
        shape: TierShape,
        region: RegionDescriptor,
        deadline: Instant,
    },
    /// Refused; kept to answer a repeated request alike.
    Nacked {
        epoch: Epoch,
        tier: TierIndex,
        reason: NackReason,
    },
}

#[derive(Debug)]
pub(super) struct Inbound {
    grant: TierGrant,
    offer: Offer,
    /// The highest epoch the peer has named in a request or an abandon.
    highest_epoch: Epoch,
    /// Provisionings the peer gave up while the owner was at work: retired on arrival.
    given_up_provisionings: Vec<TierGrant>,
}

impl Inbound {
    pub(super) fn new() -> Inbound {
        Inbound {
            grant: TierGrant::INITIAL,
            offer: Offer::Idle,
            highest_epoch: Epoch::INITIAL,
            given_up_provisionings: Vec::new(),
        }
    }

    pub(super) fn grant(&self) -> TierGrant {
        self.grant
    }

    #[cfg(test)]
    pub(super) fn offer(&self) -> Option<TierGrant> {
        match self.offer {
            Offer::Provisioning { epoch, tier } | Offer::Acked { epoch, tier, .. } => {
                Some(TierGrant { epoch, tier })
            }
            Offer::Idle | Offer::Nacked { .. } => None,
        }
    }

    pub(super) fn poll_timeout(&self) -> Option<Instant> {
        match self.offer {
            Offer::Acked { deadline, .. } => Some(deadline),
            _ => None,
        }
    }

    pub(super) fn handle_request(
        &mut self,
        config: &NegotiationConfig,
        now: Instant,
        epoch: Epoch,
        tier: TierIndex,
        current: Epoch,
        outputs: &mut Outputs,
    ) {
        if epoch < self.highest_epoch {
            outputs.stats.stale += 1;
            return;
        }
        if epoch == self.highest_epoch {
            outputs.stats.duplicates += 1;
            self.answer_again(config, now, epoch, outputs);
            return;
        }
        if let Err(violation) = self.resolve_offer_by(epoch, current, outputs) {
            outputs.violation(violation);
            return;
        }
        self.highest_epoch = epoch;
        match config.shape(tier) {
            None => {
                tracing::info!(%epoch, %tier, "tier request past the ladder refused");
                self.nack(epoch, tier, NackReason::BeyondLadder, outputs);
            }
            Some(shape) => {
                tracing::debug!(%epoch, %tier, "provisioning requested");
                self.offer = Offer::Provisioning { epoch, tier };
                outputs.emit(Event::ProvisionRequested { epoch, tier, shape });
            }
        }
    }

    /// Answers a repeated request the way the first one was answered, if it was. A repeated
    /// ack restarts its timer: the peer has just been answered.
    fn answer_again(
        &mut self,
        config: &NegotiationConfig,
        now: Instant,
        epoch: Epoch,
        outputs: &mut Outputs,
    ) {
        match &mut self.offer {
            Offer::Acked {
                epoch: offered,
                tier,
                shape,
                region,
                deadline,
            } if *offered == epoch => {
                *deadline = config.deadline_after(now);
                outputs.send(ControlMessage::Ack {
                    epoch,
                    tier: *tier,
                    shape: *shape,
                    region: *region,
                });
            }
            Offer::Nacked {
                epoch: refused,
                tier,
                reason,
            } if *refused == epoch => outputs.send(ControlMessage::Nack {
                epoch,
                tier: *tier,
                reason: *reason,
            }),
            // Still provisioning (the ack will follow), or already resolved.
            _ => {}
        }
    }

    /// A request of a new epoch ends the previous one: `current` tells whether the peer
    /// switched to what we offered or left it.
    fn resolve_offer_by(
        &mut self,
        epoch: Epoch,
        current: Epoch,
        outputs: &mut Outputs,
    ) -> Result<(), ProtocolViolation> {
        let unknown = ProtocolViolation::UnknownCurrentGrant { epoch, current };
        match self.offer {
            Offer::Acked { epoch: offered, .. } if current == offered => self.commit_offer(outputs),
            _ if current != self.grant.epoch => return Err(unknown),
            Offer::Acked { .. } => self.retire_offer(outputs),
            Offer::Provisioning {
                epoch: offered,
                tier,
            } => {
                self.given_up_provisionings.push(TierGrant {
                    epoch: offered,
                    tier,
                });
                self.offer = Offer::Idle;
            }
            Offer::Idle | Offer::Nacked { .. } => self.offer = Offer::Idle,
        }
        Ok(())
    }

    /// The peer switched to the acked offer: it comes in force and the old region goes.
    fn commit_offer(&mut self, outputs: &mut Outputs) {
        let Offer::Acked { epoch, tier, .. } = self.offer else {
            return;
        };
        let old = self.grant;
        self.grant = TierGrant { epoch, tier };
        self.offer = Offer::Idle;
        tracing::info!(%epoch, from = %old.tier, to = %tier, "inbound tier switched by the peer");
        outputs.emit(Event::PeerSwitched {
            epoch,
            from: old.tier,
            to: tier,
        });
        retire(old, outputs);
    }

    /// The peer will never use the acked offer: its region goes.
    fn retire_offer(&mut self, outputs: &mut Outputs) {
        if let Offer::Acked { epoch, tier, .. } = self.offer {
            self.offer = Offer::Idle;
            retire(TierGrant { epoch, tier }, outputs);
        }
    }

    fn nack(&mut self, epoch: Epoch, tier: TierIndex, reason: NackReason, outputs: &mut Outputs) {
        self.offer = Offer::Nacked {
            epoch,
            tier,
            reason,
        };
        outputs.send(ControlMessage::Nack {
            epoch,
            tier,
            reason,
        });
    }

    pub(super) fn handle_released(&mut self, epoch: Epoch, outputs: &mut Outputs) {
        match self.offer {
            Offer::Acked { epoch: offered, .. } if offered == epoch => self.commit_offer(outputs),
            _ if epoch <= self.grant.epoch => outputs.stats.duplicates += 1,
            _ => outputs.violation(ProtocolViolation::ReleaseOfUnofferedEpoch { epoch }),
        }
    }

    pub(super) fn handle_abandon(&mut self, epoch: Epoch, outputs: &mut Outputs) {
        match self.offer {
            Offer::Acked { epoch: offered, .. } if offered == epoch => {
                tracing::debug!(%epoch, "offer abandoned by the peer");
                self.retire_offer(outputs);
            }
            Offer::Provisioning {
                epoch: offered,
                tier,
            } if offered == epoch => {
                tracing::debug!(%epoch, "provisioning abandoned by the peer");
                self.given_up_provisionings.push(TierGrant { epoch, tier });
                self.offer = Offer::Idle;
            }
            Offer::Nacked { epoch: refused, .. } if refused == epoch => self.offer = Offer::Idle,
            _ if epoch > self.highest_epoch => {
                // Overtook its own request: the request, when it comes, is a repeat.
                self.highest_epoch = epoch;
            }
            _ => outputs.stats.stale += 1,
        }
    }

    pub(super) fn provisioned(
        &mut self,
        config: &NegotiationConfig,
        now: Instant,
        epoch: Epoch,
        result: Result<RegionDescriptor, NackReason>,
        outputs: &mut Outputs,
    ) -> Result<(), ProvisionError> {
        if let Some(position) = self
            .given_up_provisionings
            .iter()
            .position(|given_up| given_up.epoch == epoch)
        {
            let given_up = self.given_up_provisionings.swap_remove(position);
            if result.is_ok() {
                retire(given_up, outputs);
            }
            return Ok(());
        }
        let Offer::Provisioning {
            epoch: provisioning,
            tier,
        } = self.offer
        else {
            return Err(ProvisionError::UnknownEpoch { epoch });
        };
        if provisioning != epoch {
            return Err(ProvisionError::UnknownEpoch { epoch });
        }
        let region = match result {
            Ok(region) => region,
            Err(reason) => {
                tracing::info!(%epoch, %tier, %reason, "provisioning refused by the owner");
                self.nack(epoch, tier, reason, outputs);
                return Ok(());
            }
        };
        let shape = config
            .shape(tier)
            .ok_or(ProvisionError::UnknownEpoch { epoch })?;
        if region.len < shape.region_len() {
            return Err(ProvisionError::RegionTooShort {
                epoch,
                tier,
                needed: shape.region_len(),
                len: region.len,
            });
        }
        tracing::debug!(%epoch, %tier, "provisioned and acked");
        self.offer = Offer::Acked {
            epoch,
            tier,
            shape,
            region,
            deadline: config.deadline_after(now),
        };
        outputs.send(ControlMessage::Ack {
            epoch,
            tier,
            shape,
            region,
        });
        Ok(())
    }

    pub(super) fn handle_timeout(
        &mut self,
        config: &NegotiationConfig,
        now: Instant,
        outputs: &mut Outputs,
    ) {
        let Offer::Acked {
            epoch,
            tier,
            shape,
            region,
            deadline,
        } = &mut self.offer
        else {
            return;
        };
        if *deadline > now {
            return;
        }
        *deadline = config.deadline_after(now);
        outputs.stats.retransmissions += 1;
        tracing::debug!(%epoch, %tier, "unconfirmed offer acked again");
        outputs.send(ControlMessage::Ack {
            epoch: *epoch,
            tier: *tier,
            shape: *shape,
            region: *region,
        });
    }
}

fn retire(grant: TierGrant, outputs: &mut Outputs) {
    tracing::debug!(epoch = %grant.epoch, tier = %grant.tier, "inbound region retired");
    outputs.emit(Event::Retire {
        epoch: grant.epoch,
        tier: grant.tier,
    });
}
