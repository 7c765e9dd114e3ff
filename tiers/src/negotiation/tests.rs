//! Unit tests of each path, and proptests over random schedules with lossy queues.

mod harness;

use std::time::{Duration, Instant};

use proptest::prelude::*;

use super::*;
use harness::{Faults, Pair};

const TIMEOUT: Duration = Duration::from_millis(10);
const ATTEMPTS: u32 = 3;

/// Tier `i` has slots of `256 << 2i` bytes, 8 of them.
fn ladder(len: u8) -> NegotiationConfig {
    let tiers = (0..len)
        .map(|i| TierShape {
            slot_size: 256 << (2 * u32::from(i)),
            slot_count: 8,
        })
        .collect();
    NegotiationConfig::new(tiers, TIMEOUT, ATTEMPTS).expect("valid ladder")
}

fn tier(index: u8) -> TierIndex {
    TierIndex::new(index)
}

fn grant(epoch: u64, tier_index: u8) -> TierGrant {
    TierGrant {
        epoch: Epoch::new(epoch),
        tier: tier(tier_index),
    }
}

fn region_for(shape: TierShape) -> RegionDescriptor {
    RegionDescriptor {
        addr: 0x4000,
        len: shape.region_len(),
        remote_key: 9,
    }
}

fn retired(events: &[Event]) -> Vec<Epoch> {
    events
        .iter()
        .filter_map(|event| match event {
            Event::Retire { epoch, .. } => Some(*epoch),
            _ => None,
        })
        .collect()
}

fn failures(events: &[Event]) -> Vec<FailureCause> {
    events
        .iter()
        .filter_map(|event| match event {
            Event::RequestFailed { cause, .. } => Some(*cause),
            _ => None,
        })
        .collect()
}

fn drain(negotiation: &mut Negotiation) -> (Vec<ControlMessage>, Vec<Event>) {
    let transmits = std::iter::from_fn(|| negotiation.poll_transmit()).collect();
    let events = std::iter::from_fn(|| negotiation.poll_event()).collect();
    (transmits, events)
}

#[test]
fn config_rejects_empty_and_degenerate_ladders() {
    let shape = TierShape {
        slot_size: 64,
        slot_count: 1,
    };
    assert_eq!(
        NegotiationConfig::new(vec![], TIMEOUT, 1),
        Err(NegotiationConfigError::NoTiers)
    );
    assert_eq!(
        NegotiationConfig::new(vec![shape; 257], TIMEOUT, 1),
        Err(NegotiationConfigError::TooManyTiers { count: 257 })
    );
    let empty = TierShape {
        slot_size: 64,
        slot_count: 0,
    };
    assert_eq!(
        NegotiationConfig::new(vec![shape, empty], TIMEOUT, 1),
        Err(NegotiationConfigError::EmptyTier {
            tier: tier(1),
            shape: empty
        })
    );
    assert_eq!(
        NegotiationConfig::new(vec![shape], Duration::ZERO, 1),
        Err(NegotiationConfigError::ZeroTimeout)
    );
    assert_eq!(
        NegotiationConfig::new(vec![shape], TIMEOUT, 0),
        Err(NegotiationConfigError::ZeroAttempts)
    );
    assert_eq!(
        NegotiationConfig::new(vec![shape], Duration::MAX, 1),
        Err(NegotiationConfigError::TimeoutTooLong {
            timeout: Duration::MAX,
            max: MAX_REQUEST_TIMEOUT
        })
    );
    assert!(NegotiationConfig::new(vec![shape], MAX_REQUEST_TIMEOUT, 1).is_ok());
}

/// A peer that repeats a request while this side's owner does not send (the channel holds
/// its frames back): one answer waits, however many repeats, and so does one answer to
/// ever newer requests.
#[test]
fn repeated_and_newer_requests_leave_one_answer_waiting() {
    let now = Instant::now();
    let mut receiver = Negotiation::new(ladder(3));
    let request = |epoch, tier_index| ControlMessage::Request {
        epoch: Epoch::new(epoch),
        tier: tier(tier_index),
        current: Epoch::INITIAL,
    };
    receiver.handle_message(now, request(1, 1));
    let (_, events) = drain(&mut receiver);
    assert_eq!(events.len(), 1, "asked to provision once");
    receiver
        .provisioned(now, Epoch::new(1), Ok(region_for(config_shape(1))))
        .expect("outstanding");
    for _ in 0..100_000 {
        receiver.handle_message(now, request(1, 1));
    }
    let (acks, events) = drain(&mut receiver);
    assert_eq!(acks.len(), 1, "{acks:?}");
    assert!(events.is_empty());
    assert_eq!(receiver.stats().duplicates, 100_000);
    // Newer requests past the ladder, each refused: the newest answer alone waits.
    for epoch in 2..10_000 {
        receiver.handle_message(now, request(epoch, 9));
    }
    let (nacks, _) = drain(&mut receiver);
    assert_eq!(
        nacks,
        [ControlMessage::Nack {
            epoch: Epoch::new(9_999),
            tier: tier(9),
            reason: NackReason::BeyondLadder
        }]
    );
}

#[test]
fn happy_promotion_switches_both_ends_and_retires_the_small_region() {
    let mut pair = Pair::reliable(ladder(3), 1 << 20);
    assert_eq!(
        pair.request(0, 1),
        Ok(RequestStatus::Requested {
            epoch: Epoch::new(1)
        })
    );
    assert_eq!(
        pair.request(0, 1),
        Ok(RequestStatus::AlreadyPending {
            epoch: Epoch::new(1)
        })
    );
    pair.drive();
    pair.assert_settled();
    assert_eq!(pair.sides[0].negotiation.outbound_grant(), grant(1, 1));
    assert_eq!(pair.sides[1].negotiation.inbound_grant(), grant(1, 1));
    assert_eq!(retired(&pair.sides[1].events), [Epoch::INITIAL]);
    assert!(matches!(
        pair.sides[0].events.as_slice(),
        [Event::Switched { from, to, .. }] if *from == tier(0) && *to == tier(1)
    ));
    // The other direction is untouched.
    assert_eq!(
        pair.sides[1].negotiation.outbound_grant(),
        TierGrant::INITIAL
    );
    assert_eq!(pair.request(0, 1), Ok(RequestStatus::InForce));
}

#[test]
fn promotion_may_skip_tiers() {
    let mut pair = Pair::reliable(ladder(4), 1 << 20);
    pair.request(1, 3).expect("on the ladder");
    pair.drive();
    pair.assert_settled();
    assert_eq!(pair.sides[1].negotiation.outbound_grant(), grant(1, 3));
    assert_eq!(
        pair.sides[1].events.len(),
        1,
        "one switch, straight to tier 3"
    );
}

#[test]
fn demotion_keeps_the_large_region_until_the_sender_released_it() {
    let config = ladder(3);
    let now = Instant::now();
    let mut sender = Negotiation::new(config.clone());
    let mut receiver = Negotiation::new(config.clone());
    let exchange = |sender: &mut Negotiation, receiver: &mut Negotiation, target: u8| {
        sender
            .request_tier(now, tier(target))
            .expect("on the ladder");
        let (requests, _) = drain(sender);
        receiver.handle_message(now, requests[0]);
        let (_, events) = drain(receiver);
        let Event::ProvisionRequested { epoch, shape, .. } = events[0] else {
            panic!("expected a provisioning request, got {events:?}")
        };
        receiver
            .provisioned(now, epoch, Ok(region_for(shape)))
            .expect("outstanding");
        let (acks, _) = drain(receiver);
        sender.handle_message(now, acks[0]);
        let (releases, _) = drain(sender);
        releases[0]
    };
    let release = exchange(&mut sender, &mut receiver, 2);
    receiver.handle_message(now, release);
    drain(&mut receiver);
    assert_eq!(receiver.inbound_grant(), grant(1, 2));

    let release = exchange(&mut sender, &mut receiver, 0);
    assert_eq!(sender.outbound_grant(), grant(2, 0));
    // The ack is out, the sender switched, but its release has not arrived: data it sent on
    // tier 2 may still be on the way, so the tier-2 region stays.
    assert_eq!(receiver.inbound_grant(), grant(1, 2));
    assert_eq!(receiver.inbound_offer(), Some(grant(2, 0)));
    receiver.handle_message(now, release);
    let (_, events) = drain(&mut receiver);
    assert_eq!(
        events,
        [
            Event::PeerSwitched {
                epoch: Epoch::new(2),
                from: tier(2),
                to: tier(0)
            },
            Event::Retire {
                epoch: Epoch::new(1),
                tier: tier(2)
            }
        ]
    );
}

#[test]
fn over_budget_is_nacked_and_nothing_changes() {
    let mut pair = Pair::reliable(ladder(3), ladder(3).tiers()[0].region_len() + 10);
    pair.request(0, 2).expect("on the ladder");
    pair.drive();
    pair.assert_settled();
    assert_eq!(
        failures(&pair.sides[0].events),
        [FailureCause::Nacked(NackReason::OverBudget)]
    );
    assert_eq!(
        pair.sides[0].negotiation.outbound_grant(),
        TierGrant::INITIAL
    );
}

#[test]
fn beyond_the_peers_ladder_is_nacked_without_asking_its_owner() {
    let mut pair = Pair::new([ladder(4), ladder(2)], [1 << 20; 2], Duration::ZERO, 1);
    pair.request(0, 3).expect("on the sender's ladder");
    pair.drive();
    pair.assert_settled();
    assert_eq!(
        failures(&pair.sides[0].events),
        [FailureCause::Nacked(NackReason::BeyondLadder)]
    );
    assert!(pair.sides[1].events.is_empty(), "the owner was never asked");
    assert_eq!(
        pair.request(0, 4),
        Err(RequestError::BeyondLadder {
            tier: tier(4),
            ladder_len: 4
        })
    );
}

#[test]
fn busy_owner_is_nacked_and_a_repeated_request_gets_the_same_nack() {
    let config = ladder(2);
    let now = Instant::now();
    let mut sender = Negotiation::new(config.clone());
    let mut receiver = Negotiation::new(config);
    sender.request_tier(now, tier(1)).expect("on the ladder");
    let (requests, _) = drain(&mut sender);
    receiver.handle_message(now, requests[0]);
    drain(&mut receiver);
    receiver
        .provisioned(now, Epoch::new(1), Err(NackReason::Busy))
        .expect("outstanding");
    let (nacks, _) = drain(&mut receiver);
    receiver.handle_message(now, requests[0]);
    let (again, events) = drain(&mut receiver);
    assert_eq!(again, nacks, "the same answer, no second provisioning");
    assert!(events.is_empty());
    sender.handle_message(now, nacks[0]);
    let (_, events) = drain(&mut sender);
    assert_eq!(failures(&events), [FailureCause::Nacked(NackReason::Busy)]);
    sender.handle_message(now, again[0]);
    assert_eq!(
        sender.stats().stale,
        1,
        "the second nack is recognised as late"
    );
    assert_eq!(
        receiver.provisioned(now, Epoch::new(1), Err(NackReason::Busy)),
        Err(ProvisionError::UnknownEpoch {
            epoch: Epoch::new(1)
        })
    );
}

#[test]
fn a_lost_request_is_sent_again_with_the_same_epoch() {
    let config = ladder(2);
    let start = Instant::now();
    let mut sender = Negotiation::new(config.clone());
    let mut receiver = Negotiation::new(config);
    sender.request_tier(start, tier(1)).expect("on the ladder");
    let (lost, _) = drain(&mut sender);
    assert_eq!(sender.poll_timeout(), Some(start + TIMEOUT));
    sender.handle_timeout(start + TIMEOUT / 2);
    assert!(sender.poll_transmit().is_none(), "not due yet");
    let later = start + TIMEOUT;
    sender.handle_timeout(later);
    let (retry, _) = drain(&mut sender);
    assert_eq!(retry, lost);
    assert_eq!(sender.stats().retransmissions, 1);
    // The retry arrives twice; the owner is asked once, both get the same ack.
    receiver.handle_message(later, retry[0]);
    receiver.handle_message(later, retry[0]);
    let (_, events) = drain(&mut receiver);
    assert_eq!(events.len(), 1);
    receiver
        .provisioned(later, Epoch::new(1), Ok(region_for(config_shape(1))))
        .expect("outstanding");
    receiver.handle_message(later, retry[0]);
    let (acks, _) = drain(&mut receiver);
    assert_eq!(
        acks.len(),
        1,
        "the ack still waiting answers the repeat too"
    );
    // Once the ack has gone, a repeat is answered again, alike.
    receiver.handle_message(later, retry[0]);
    let (again, _) = drain(&mut receiver);
    assert_eq!(again, acks);
    sender.handle_message(later, acks[0]);
    let (releases, events) = drain(&mut sender);
    assert_eq!(events.len(), 1, "switched once");
    sender.handle_message(later, again[0]);
    let (released_again, events) = drain(&mut sender);
    assert!(events.is_empty());
    assert_eq!(
        [releases, released_again].concat(),
        [ControlMessage::Released {
            epoch: Epoch::new(1)
        }; 2],
        "the repeated ack is answered with a repeated release"
    );
    assert_eq!(sender.stats().duplicates, 1);
    assert_eq!(sender.poll_timeout(), None);
}

fn config_shape(index: u8) -> TierShape {
    ladder(4).tiers()[usize::from(index)]
}

#[test]
fn a_request_given_up_after_provisioning_retires_the_unused_region() {
    let mut pair = Pair::reliable(ladder(2), 1 << 20);
    // Every ack is lost while the sender tries.
    pair.faults = Faults {
        drop_percent: 100,
        ..Faults::NONE
    };
    pair.sides[0]
        .negotiation
        .request_tier(pair.now, tier(1))
        .expect("on the ladder");
    let request = pair.sides[0]
        .negotiation
        .poll_transmit()
        .expect("a request");
    let now = pair.now;
    pair.sides[1].negotiation.handle_message(now, request);
    pair.drive_until(now + TIMEOUT * (ATTEMPTS + 1));
    assert_eq!(
        failures(&pair.sides[0].events),
        [FailureCause::TimedOut { attempts: ATTEMPTS }]
    );
    assert!(
        pair.sides[1].owner.regions.contains_key(&Epoch::new(1)),
        "provisioned, acked, unconfirmed"
    );
    // The queues heal; the receiver's next ack is answered with an abandon.
    pair.faults = Faults::NONE;
    pair.drive();
    pair.assert_settled();
    assert_eq!(retired(&pair.sides[1].events), [Epoch::new(1)]);
    assert!(pair.sides[1].negotiation.stats().retransmissions >= 1);
}

#[test]
fn a_provisioning_the_sender_abandoned_is_retired_when_it_arrives() {
    let mut pair = Pair::new([ladder(2), ladder(2)], [1 << 20; 2], TIMEOUT * 10, 1);
    pair.request(0, 1).expect("on the ladder");
    pair.drive_until(pair.now + TIMEOUT * (ATTEMPTS + 1));
    assert_eq!(
        failures(&pair.sides[0].events),
        [FailureCause::TimedOut { attempts: ATTEMPTS }]
    );
    assert_eq!(
        pair.sides[1].negotiation.inbound_offer(),
        None,
        "abandoned while provisioning"
    );
    pair.drive();
    pair.assert_settled();
    assert_eq!(retired(&pair.sides[1].events), [Epoch::new(1)]);
    assert_eq!(
        pair.sides[0].negotiation.outbound_grant(),
        TierGrant::INITIAL
    );
}

#[test]
fn a_new_target_supersedes_the_pending_request() {
    let mut pair = Pair::new([ladder(4), ladder(4)], [1 << 20; 2], TIMEOUT / 2, 1);
    pair.request(0, 1).expect("on the ladder");
    assert_eq!(
        pair.request(0, 3),
        Ok(RequestStatus::Requested {
            epoch: Epoch::new(2)
        })
    );
    pair.drive();
    pair.assert_settled();
    assert_eq!(pair.sides[0].negotiation.outbound_grant(), grant(2, 3));
    assert_eq!(
        retired(&pair.sides[1].events),
        [Epoch::new(1), Epoch::INITIAL]
    );
    // Asking for the tier in force while a request is pending cancels the request.
    pair.request(0, 0).expect("on the ladder");
    assert_eq!(pair.request(0, 3), Ok(RequestStatus::InForce));
    pair.drive();
    pair.assert_settled();
    assert_eq!(pair.sides[0].negotiation.outbound_grant(), grant(2, 3));
}

#[test]
fn late_and_reordered_messages_are_ignored_and_counted() {
    let config = ladder(3);
    let now = Instant::now();
    let mut sender = Negotiation::new(config.clone());
    let mut receiver = Negotiation::new(config);
    sender.request_tier(now, tier(1)).expect("on the ladder");
    let (first_request, _) = drain(&mut sender);
    receiver.handle_message(now, first_request[0]);
    drain(&mut receiver);
    receiver
        .provisioned(now, Epoch::new(1), Ok(region_for(config_shape(1))))
        .expect("outstanding");
    let (first_ack, _) = drain(&mut receiver);
    sender.handle_message(now, first_ack[0]);
    let (first_release, _) = drain(&mut sender);
    // The sender asks again before its release arrives; the request, naming epoch 1 as its
    // current grant, tells the receiver that the sender switched.
    sender.request_tier(now, tier(2)).expect("on the ladder");
    let (second_request, _) = drain(&mut sender);
    receiver.handle_message(now, second_request[0]);
    let (_, events) = drain(&mut receiver);
    assert_eq!(receiver.inbound_grant(), grant(1, 1));
    assert_eq!(retired(&events), [Epoch::INITIAL]);
    // The overtaken release, the first request and the first ack arrive late.
    receiver.handle_message(now, first_release[0]);
    receiver.handle_message(now, first_request[0]);
    sender.handle_message(now, first_ack[0]);
    let (sender_out, sender_events) = drain(&mut sender);
    let (receiver_out, receiver_events) = drain(&mut receiver);
    assert!(sender_events.is_empty() && receiver_events.is_empty());
    assert!(receiver_out.is_empty());
    assert_eq!(
        sender_out,
        [ControlMessage::Released {
            epoch: Epoch::new(1)
        }]
    );
    assert_eq!(receiver.stats().duplicates, 1);
    assert_eq!(receiver.stats().stale, 1);
    assert_eq!(sender.stats().duplicates, 1);
}

#[test]
fn malformed_acks_are_violations_and_never_applied() {
    let config = ladder(3);
    let now = Instant::now();
    let mut sender = Negotiation::new(config);
    sender.request_tier(now, tier(1)).expect("on the ladder");
    drain(&mut sender);
    let shape = config_shape(1);
    let ack = |tier_index: u8, shape: TierShape, len: u64| ControlMessage::Ack {
        epoch: Epoch::new(1),
        tier: tier(tier_index),
        shape,
        region: RegionDescriptor {
            addr: 0x4000,
            len,
            remote_key: 1,
        },
    };
    let bigger_slots = TierShape {
        slot_size: shape.slot_size * 2,
        ..shape
    };
    for bad in [
        ack(2, config_shape(2), config_shape(2).region_len()),
        ack(1, bigger_slots, bigger_slots.region_len()),
        ack(1, shape, shape.region_len() - 1),
        ControlMessage::Ack {
            epoch: Epoch::new(5),
            tier: tier(1),
            shape,
            region: region_for(shape),
        },
        ControlMessage::Nack {
            epoch: Epoch::new(1),
            tier: tier(2),
            reason: NackReason::Busy,
        },
    ] {
        sender.handle_message(now, bad);
    }
    let (transmits, events) = drain(&mut sender);
    assert!(transmits.is_empty());
    assert!(
        matches!(
            events.as_slice(),
            [
                Event::ProtocolViolation(ProtocolViolation::AckWrongTier { .. }),
                Event::ProtocolViolation(ProtocolViolation::AckShapeMismatch { .. }),
                Event::ProtocolViolation(ProtocolViolation::AckRegionTooShort { .. }),
                Event::ProtocolViolation(ProtocolViolation::AnswerToUnrequestedEpoch { .. }),
                Event::ProtocolViolation(ProtocolViolation::NackWrongTier { .. }),
            ]
        ),
        "{events:?}"
    );
    assert_eq!(sender.stats().protocol_violations, 5);
    assert_eq!(sender.outbound_grant(), TierGrant::INITIAL);
    assert_eq!(
        sender.pending_request().map(|p| p.epoch),
        Some(Epoch::new(1))
    );
    sender.handle_message(now, ack(1, shape, shape.region_len()));
    assert_eq!(
        sender.outbound_grant(),
        grant(1, 1),
        "the valid ack still applies"
    );
}

#[test]
fn inconsistent_requests_and_releases_are_violations() {
    let now = Instant::now();
    let mut receiver = Negotiation::new(ladder(2));
    receiver.handle_message(
        now,
        ControlMessage::Request {
            epoch: Epoch::new(2),
            tier: tier(1),
            current: Epoch::new(1),
        },
    );
    receiver.handle_message(
        now,
        ControlMessage::Released {
            epoch: Epoch::new(3),
        },
    );
    let (transmits, events) = drain(&mut receiver);
    assert!(transmits.is_empty());
    assert_eq!(
        events,
        [
            Event::ProtocolViolation(ProtocolViolation::UnknownCurrentGrant {
                epoch: Epoch::new(2),
                current: Epoch::new(1)
            }),
            Event::ProtocolViolation(ProtocolViolation::ReleaseOfUnofferedEpoch {
                epoch: Epoch::new(3)
            })
        ]
    );
    assert_eq!(
        receiver.provisioned(now, Epoch::new(2), Ok(region_for(config_shape(1)))),
        Err(ProvisionError::UnknownEpoch {
            epoch: Epoch::new(2)
        })
    );
}

#[test]
fn a_short_region_from_the_owner_is_refused_and_changes_nothing() {
    let now = Instant::now();
    let mut receiver = Negotiation::new(ladder(2));
    receiver.handle_message(
        now,
        ControlMessage::Request {
            epoch: Epoch::new(1),
            tier: tier(1),
            current: Epoch::INITIAL,
        },
    );
    drain(&mut receiver);
    let shape = config_shape(1);
    let short = RegionDescriptor {
        len: shape.region_len() - 1,
        ..region_for(shape)
    };
    assert!(matches!(
        receiver.provisioned(now, Epoch::new(1), Ok(short)),
        Err(ProvisionError::RegionTooShort { .. })
    ));
    assert_eq!(receiver.poll_transmit(), None);
    receiver
        .provisioned(now, Epoch::new(1), Ok(region_for(shape)))
        .expect("still outstanding");
    assert!(matches!(
        receiver.poll_transmit(),
        Some(ControlMessage::Ack { .. })
    ));
}

/// One request of a random schedule: after `wait`, side `side` asks for `tier`.
#[derive(Debug, Clone)]
struct ScheduledRequest {
    wait: Duration,
    side: usize,
    tier: u8,
}

fn schedule() -> impl Strategy<Value = Vec<ScheduledRequest>> {
    proptest::collection::vec(
        (0u64..25, 0usize..2, 0u8..6).prop_map(|(wait_ms, side, tier)| ScheduledRequest {
            wait: Duration::from_millis(wait_ms),
            side,
            tier,
        }),
        0..24,
    )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn random_schedules_settle_in_agreement_without_leaks(
        requests in schedule(),
        ladder_lens in (1u8..=5, 1u8..=5),
        budgets in (0u64..40_000, 0u64..40_000),
        drop_percent in 0u32..40,
        duplicate_percent in 0u32..40,
        max_delay_ms in 0u64..30,
        answer_delay_ms in 0u64..25,
        seed in any::<u64>(),
    ) {
        let configs = [ladder(ladder_lens.0), ladder(ladder_lens.1)];
        let base = ladder(1).tiers()[0].region_len();
        let mut pair = Pair::new(
            configs,
            [base + budgets.0, base + budgets.1],
            Duration::from_millis(answer_delay_ms),
            seed,
        );
        pair.faults = Faults {
            drop_percent,
            duplicate_percent,
            max_delay: Duration::from_millis(max_delay_ms),
        };
        for request in &requests {
            let until = pair.now + request.wait;
            pair.drive_until(until);
            let ladder_len = pair.sides[request.side].negotiation.config().tiers().len();
            match pair.request(request.side, request.tier) {
                Ok(_) => prop_assert!(usize::from(request.tier) < ladder_len),
                Err(RequestError::BeyondLadder { .. }) => {
                    prop_assert!(usize::from(request.tier) >= ladder_len)
                }
            }
        }
        pair.faults = Faults::NONE;
        pair.drive();
        pair.assert_settled();
        for side in 0..2 {
            let peer_ladder = pair.sides[1 - side].negotiation.config().tiers().len();
            let granted = pair.sides[side].negotiation.outbound_grant().tier;
            prop_assert!(usize::from(granted.get()) < peer_ladder);
        }
    }
}
