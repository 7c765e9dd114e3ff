//! A pair of endpoints joined by lossy queues, stepped in virtual time.
//!
//! Every control message travels encoded by the wire codec. The queues drop, duplicate and
//! delay (hence reorder) messages by [`Faults`]; each side's provisioning is played by an
//! [`Owner`] with a byte budget. After every step the harness checks the safety invariants:
//! no region is provisioned twice, past the ladder or past the budget; no region is retired
//! while the peer's sender uses it or may still accept it; a sender switches only to a region
//! the receiver holds.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use crate::negotiation::{
    Event, Negotiation, NegotiationConfig, RequestError, RequestStatus, TierShape,
};
use crate::wire::{self, ControlMessage, Epoch, MAX_FRAME_LEN, NackReason};
use crate::{RegionDescriptor, TierIndex};

/// What the queues do to messages sent while they are in force.
#[derive(Debug, Clone, Copy)]
pub(super) struct Faults {
    pub(super) drop_percent: u32,
    pub(super) duplicate_percent: u32,
    pub(super) max_delay: Duration,
}

impl Faults {
    pub(super) const NONE: Faults = Faults {
        drop_percent: 0,
        duplicate_percent: 0,
        max_delay: Duration::ZERO,
    };
}

/// Plays the side that provisions receive buffers: a byte budget and a map of regions.
#[derive(Debug)]
pub(super) struct Owner {
    budget: u64,
    used: u64,
    answer_delay: Duration,
    pub(super) regions: HashMap<Epoch, (TierIndex, RegionDescriptor)>,
    ever_provisioned: HashSet<Epoch>,
    answers_due: Vec<(Instant, Epoch, TierIndex, TierShape)>,
    next_addr: u64,
}

impl Owner {
    fn new(budget: u64, answer_delay: Duration, initial: TierShape) -> Owner {
        assert!(
            budget >= initial.region_len(),
            "the initial tier fits the budget"
        );
        let initial_region = RegionDescriptor {
            addr: 0x1000,
            len: initial.region_len(),
            remote_key: 0,
        };
        Owner {
            budget,
            used: initial.region_len(),
            answer_delay,
            regions: HashMap::from([(Epoch::INITIAL, (TierIndex::SMALLEST, initial_region))]),
            ever_provisioned: HashSet::from([Epoch::INITIAL]),
            answers_due: Vec::new(),
            next_addr: 0x1000 + initial.region_len(),
        }
    }

    /// Provisions a region if the budget allows.
    fn provision(
        &mut self,
        epoch: Epoch,
        tier: TierIndex,
        shape: TierShape,
    ) -> Result<RegionDescriptor, NackReason> {
        assert!(
            self.ever_provisioned.insert(epoch),
            "{epoch} provisioned twice"
        );
        let len = shape.region_len();
        if self.used + len > self.budget {
            return Err(NackReason::OverBudget);
        }
        self.used += len;
        let region = RegionDescriptor {
            addr: self.next_addr,
            len,
            remote_key: u32::try_from(epoch.get()).expect("few epochs in a test"),
        };
        self.next_addr += len;
        self.regions.insert(epoch, (tier, region));
        Ok(region)
    }

    fn retire(&mut self, epoch: Epoch, tier: TierIndex) {
        let (held_tier, region) = self
            .regions
            .remove(&epoch)
            .unwrap_or_else(|| panic!("retired {epoch}, which is not held"));
        assert_eq!(held_tier, tier, "retired {epoch} under another tier");
        self.used -= region.len;
    }
}

/// One endpoint of the pair.
#[derive(Debug)]
pub(super) struct Side {
    pub(super) negotiation: Negotiation,
    pub(super) owner: Owner,
    /// Every event the side emitted, in order.
    pub(super) events: Vec<Event>,
}

#[derive(Debug)]
struct InFlight {
    deliver_at: Instant,
    sent_order: u64,
    to: usize,
    frame: Vec<u8>,
}

/// Two endpoints, the queues between them and a virtual clock.
#[derive(Debug)]
pub(super) struct Pair {
    pub(super) now: Instant,
    pub(super) sides: [Side; 2],
    pub(super) faults: Faults,
    in_flight: Vec<InFlight>,
    sent_count: u64,
    rng: u64,
}

impl Pair {
    /// Side 0 has `configs[0]` and an owner with `budgets[0]`, side 1 likewise.
    pub(super) fn new(
        configs: [NegotiationConfig; 2],
        budgets: [u64; 2],
        answer_delay: Duration,
        seed: u64,
    ) -> Pair {
        let [config_0, config_1] = configs;
        let side = |config: NegotiationConfig, budget: u64| Side {
            owner: Owner::new(budget, answer_delay, config.tiers()[0]),
            negotiation: Negotiation::new(config),
            events: Vec::new(),
        };
        Pair {
            now: Instant::now(),
            sides: [side(config_0, budgets[0]), side(config_1, budgets[1])],
            faults: Faults::NONE,
            in_flight: Vec::new(),
            sent_count: 0,
            rng: seed | 1,
        }
    }

    /// Both sides on the same ladder, reliable queues, owners answering at once.
    pub(super) fn reliable(config: NegotiationConfig, budget: u64) -> Pair {
        Pair::new([config.clone(), config], [budget; 2], Duration::ZERO, 1)
    }

    pub(super) fn request(&mut self, side: usize, tier: u8) -> Result<RequestStatus, RequestError> {
        let status = self.sides[side]
            .negotiation
            .request_tier(self.now, TierIndex::new(tier));
        self.flush();
        status
    }

    /// Runs until no message is in flight, no owner answer is due and no timer runs.
    pub(super) fn drive(&mut self) {
        for _ in 0..100_000 {
            if !self.step(None) {
                return;
            }
        }
        panic!("the pair did not settle");
    }

    /// Runs everything due up to `until`, then sets the clock to it.
    pub(super) fn drive_until(&mut self, until: Instant) {
        while self.step(Some(until)) {}
        self.now = self.now.max(until);
    }

    /// Does the earliest due thing (no later than `limit`); false if there is none.
    fn step(&mut self, limit: Option<Instant>) -> bool {
        self.flush();
        let next_message = self
            .in_flight
            .iter()
            .map(|m| (m.deliver_at, m.sent_order))
            .min();
        let next_answer = self
            .sides
            .iter()
            .flat_map(|s| s.owner.answers_due.iter().map(|a| a.0))
            .min();
        let next_timer = self
            .sides
            .iter()
            .filter_map(|s| s.negotiation.poll_timeout())
            .min();
        let Some(next) = [next_message.map(|m| m.0), next_answer, next_timer]
            .into_iter()
            .flatten()
            .min()
        else {
            return false;
        };
        if limit.is_some_and(|limit| next > limit) {
            return false;
        }
        self.now = self.now.max(next);
        let now = self.now;
        if let Some((at, order)) = next_message.filter(|m| m.0 <= now) {
            let index = self
                .in_flight
                .iter()
                .position(|m| m.deliver_at == at && m.sent_order == order)
                .expect("found above");
            let message = self.in_flight.remove(index);
            let decoded = wire::decode(&message.frame).expect("frames in flight are whole");
            self.sides[message.to]
                .negotiation
                .handle_message(now, decoded);
        } else if next_answer.is_some_and(|at| at <= now) {
            for side in &mut self.sides {
                let due: Vec<_> = side
                    .owner
                    .answers_due
                    .iter()
                    .copied()
                    .filter(|a| a.0 <= now)
                    .collect();
                side.owner.answers_due.retain(|a| a.0 > now);
                for (_, epoch, tier, shape) in due {
                    let result = side.owner.provision(epoch, tier, shape);
                    side.negotiation
                        .provisioned(now, epoch, result)
                        .expect("answers name outstanding provisionings");
                }
            }
        } else {
            for side in &mut self.sides {
                side.negotiation.handle_timeout(now);
            }
        }
        self.flush();
        true
    }

    /// Moves every transmit into the queues and handles every event, checking invariants.
    pub(super) fn flush(&mut self) {
        loop {
            let mut moved = false;
            for from in 0..2 {
                while let Some(message) = self.sides[from].negotiation.poll_transmit() {
                    moved = true;
                    self.enqueue(from, &message);
                }
                while let Some(event) = self.sides[from].negotiation.poll_event() {
                    moved = true;
                    self.handle_event(from, event);
                }
            }
            if !moved {
                return;
            }
        }
    }

    fn enqueue(&mut self, from: usize, message: &ControlMessage) {
        let mut frame = vec![0; MAX_FRAME_LEN];
        let len = wire::encode(message, &mut frame).expect("the machines send valid messages");
        frame.truncate(len);
        if self.chance(self.faults.drop_percent) {
            return;
        }
        let copies = if self.chance(self.faults.duplicate_percent) {
            2
        } else {
            1
        };
        for _ in 0..copies {
            let delay = self.random_delay();
            self.sent_count += 1;
            self.in_flight.push(InFlight {
                deliver_at: self.now + delay,
                sent_order: self.sent_count,
                to: 1 - from,
                frame: frame.clone(),
            });
        }
    }

    fn handle_event(&mut self, side: usize, event: Event) {
        let now = self.now;
        let peer = 1 - side;
        match &event {
            Event::ProvisionRequested { epoch, tier, shape } => {
                let own = &mut self.sides[side];
                assert!(
                    own.negotiation.config().shape(*tier) == Some(*shape),
                    "asked to provision past the ladder"
                );
                let at = now + own.owner.answer_delay;
                own.owner.answers_due.push((at, *epoch, *tier, *shape));
            }
            Event::Retire { epoch, tier } => {
                let sender = &self.sides[peer].negotiation;
                assert_ne!(
                    sender.outbound_grant().epoch,
                    *epoch,
                    "retired the region the peer sends on"
                );
                assert!(
                    sender.pending_request().is_none_or(|p| p.epoch != *epoch),
                    "retired {epoch} while the peer may still accept it"
                );
                self.sides[side].owner.retire(*epoch, *tier);
            }
            Event::Switched {
                epoch, to, region, ..
            } => {
                let held = self.sides[peer].owner.regions.get(epoch);
                assert_eq!(
                    held,
                    Some(&(*to, *region)),
                    "switched to a region the receiver does not hold"
                );
            }
            Event::RequestFailed { .. } | Event::PeerSwitched { .. } => {}
            Event::ProtocolViolation(violation) => {
                panic!("honest peers violated the protocol: {violation}")
            }
        }
        self.sides[side].events.push(event);
    }

    /// Checks that both directions settled: one grant each, agreed, and nothing else held.
    pub(super) fn assert_settled(&self) {
        for sender in 0..2 {
            let receiver = &self.sides[1 - sender];
            let outbound = &self.sides[sender].negotiation;
            assert_eq!(
                outbound.pending_request(),
                None,
                "side {sender} still waits"
            );
            assert_eq!(
                outbound.outbound_grant(),
                receiver.negotiation.inbound_grant(),
                "direction {sender} disagrees"
            );
            assert_eq!(receiver.negotiation.inbound_offer(), None);
            let held: Vec<_> = receiver.owner.regions.keys().copied().collect();
            assert_eq!(
                held,
                [outbound.outbound_grant().epoch],
                "regions leaked on side {}",
                1 - sender
            );
            assert!(receiver.owner.answers_due.is_empty());
        }
        assert!(self.in_flight.is_empty());
    }

    fn next_random(&mut self) -> u64 {
        // xorshift64: reproducible from the seed, good enough to pick faults.
        self.rng ^= self.rng << 13;
        self.rng ^= self.rng >> 7;
        self.rng ^= self.rng << 17;
        self.rng
    }

    fn chance(&mut self, percent: u32) -> bool {
        percent > 0 && self.next_random() % 100 < u64::from(percent)
    }

    fn random_delay(&mut self) -> Duration {
        let max = u64::try_from(self.faults.max_delay.as_micros()).unwrap_or(u64::MAX);
        if max == 0 {
            return Duration::ZERO;
        }
        Duration::from_micros(self.next_random() % (max + 1))
    }
}
