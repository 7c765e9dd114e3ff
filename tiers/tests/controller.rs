//! The tier controller a connection ships with, driven through its public API with an
//! in-memory channel: what a nack does to the next message, what a message needs when its
//! frame overhead is counted, a pending or refused demotion, and what a peer asking for
//! tier after tier can make it hold.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tierbuf_pool::{HostRegistrar, MemoryBudget};
use tierbuf_tiers::controller::{Change, Framing, TierController};
use tierbuf_tiers::ladder::TierLadder;
use tierbuf_tiers::negotiation::NegotiationConfig;
use tierbuf_tiers::negotiator::{InMemoryNegotiator, Negotiator};
use tierbuf_tiers::policy::FrameCapacity;
use tierbuf_tiers::wire::{self, ControlMessage, Epoch, NackReason};
use tierbuf_tiers::{OwnedTierSlot, Reservoir, TierIndex};

const HEADER: usize = 16;

fn controller(ladder: &Arc<TierLadder>, now: Instant) -> TierController {
    let capacity = Arc::new(FrameCapacity::new(Arc::clone(ladder), HEADER).unwrap());
    let negotiation = NegotiationConfig::for_ladder(ladder, Duration::from_millis(100), 5).unwrap();
    let registrar = Arc::new(HostRegistrar::new(MemoryBudget::with_cap(64 << 20)));
    let reservoir = Arc::new(Reservoir::new(registrar, Arc::clone(ladder)));
    TierController::new(
        capacity,
        negotiation,
        Arc::clone(&reservoir),
        reservoir,
        now,
    )
    .unwrap()
}

/// The request `a` sent, read off the channel as its peer would.
fn request_sent(peer: &mut InMemoryNegotiator) -> ControlMessage {
    let mut frame = [0u8; wire::MAX_FRAME_LEN];
    let len = peer.recv_frame(&mut frame).unwrap().expect("a request");
    wire::decode(&frame[..len]).unwrap()
}

fn nack(peer: &mut InMemoryNegotiator, request: ControlMessage, reason: NackReason) {
    let ControlMessage::Request { epoch, tier, .. } = request else {
        panic!("expected a request, got {request:?}");
    };
    let mut frame = [0u8; wire::MAX_FRAME_LEN];
    let len = wire::encode(
        &ControlMessage::Nack {
            epoch,
            tier,
            reason,
        },
        &mut frame,
    )
    .unwrap();
    peer.send_frame(&frame[..len]).unwrap();
}

#[test]
fn a_busy_nack_lets_the_next_message_ask_again_and_an_over_budget_one_does_not() {
    let ladder = Arc::new(TierLadder::preset("two-tier").unwrap());
    let now = Instant::now();
    for (reason, asks_again) in [(NackReason::Busy, true), (NackReason::OverBudget, false)] {
        let mut a = controller(&ladder, now);
        let (mut channel, mut peer) = InMemoryNegotiator::pair();
        assert_eq!(
            a.plan_message(now, 4000).unwrap().framing,
            Framing::Segmented
        );
        a.pump(&mut channel, now).unwrap();
        let request = request_sent(&mut peer);
        nack(&mut peer, request, reason);
        a.pump(&mut channel, now).unwrap();
        assert_eq!(a.stats().nacks, 1);
        assert_eq!(
            a.plan_message(now, 4000).unwrap().framing,
            Framing::Segmented
        );
        a.pump(&mut channel, now).unwrap();
        let mut frame = [0u8; wire::MAX_FRAME_LEN];
        let asked = peer.recv_frame(&mut frame).unwrap().is_some();
        assert_eq!(asked, asks_again, "after a {reason:?} nack");
    }
}

/// Two controllers joined by an in-memory channel, pumped until quiet.
fn settle(
    sides: &mut [(TierController, InMemoryNegotiator); 2],
    now: Instant,
) -> Vec<(usize, Change)> {
    let mut changes = Vec::new();
    for _ in 0..4 {
        for (index, (controller, channel)) in sides.iter_mut().enumerate() {
            controller.pump(channel, now).unwrap();
            while let Some(change) = controller.poll_change() {
                changes.push((index, change));
            }
        }
    }
    changes
}

#[test]
fn a_stream_of_messages_the_size_of_a_tier_stays_on_it_and_one_past_it_stays_promoted() {
    // Tier 0 is 4 KiB with its threshold at its size: the header goes in the slot's
    // headroom, so a 4096-byte message fits tier 0, for the planner and the tracker alike,
    // and a 4097-byte one needs tier 1 for both.
    let ladder = Arc::new(
        TierLadder::builder()
            .tier(4096, 8, 4096)
            .tier(65_536, 4, 65_536)
            .demote_after(Duration::from_secs(1))
            .hysteresis(Duration::from_millis(100))
            .build()
            .unwrap(),
    );
    let start = Instant::now();
    let stream = |len: usize| {
        let (a_end, b_end) = InMemoryNegotiator::pair();
        let mut sides = [
            (controller(&ladder, start), a_end),
            (controller(&ladder, start), b_end),
        ];
        let mut now = start;
        for _ in 0..100 {
            sides[0].0.plan_message(now, len).unwrap();
            settle(&mut sides, now);
            now += Duration::from_millis(100);
        }
        (sides, now)
    };

    let (sides, _) = stream(4096);
    let stats = sides[0].0.stats();
    assert_eq!((stats.promotions, stats.demotions), (0, 0), "{stats:?}");
    assert_eq!(sides[0].0.send_tier(), TierIndex::SMALLEST);

    let (mut sides, now) = stream(4097);
    let stats = sides[0].0.stats();
    assert_eq!((stats.promotions, stats.demotions), (1, 0), "{stats:?}");
    assert_eq!(sides[0].0.send_tier(), TierIndex::new(1));
    // Once the stream stops, the connection steps down after `demote_after`.
    let changes = settle(&mut sides, now + Duration::from_secs(2));
    assert!(changes.contains(&(
        0,
        Change::SendTier {
            from: TierIndex::new(1),
            to: TierIndex::SMALLEST
        }
    )));
}

/// Tiers of 512 B, 4 KiB and 64 KiB, demoted after a second idle.
fn three_tiers() -> Arc<TierLadder> {
    Arc::new(
        TierLadder::builder()
            .tier(512, 4, 512)
            .tier(4096, 4, 4096)
            .tier(65_536, 4, 65_536)
            .demote_after(Duration::from_secs(1))
            .hysteresis(Duration::from_millis(100))
            .build()
            .unwrap(),
    )
}

/// A controller `a` promoted to tier 1 over `peer`, idle long enough that its next pump
/// asks to step down; returns the demotion request it sent, unanswered.
fn promoted_then_demoting(
    ladder: &Arc<TierLadder>,
    start: Instant,
) -> (
    TierController,
    InMemoryNegotiator,
    InMemoryNegotiator,
    ControlMessage,
) {
    let (a_end, b_end) = InMemoryNegotiator::pair();
    let mut sides = [
        (controller(ladder, start), a_end),
        (controller(ladder, start), b_end),
    ];
    sides[0].0.plan_message(start, 4000).unwrap();
    settle(&mut sides, start);
    assert_eq!(sides[0].0.send_tier(), TierIndex::new(1));
    let [(mut a, mut channel), (_, mut peer)] = sides;
    a.pump(&mut channel, start + Duration::from_secs(120))
        .unwrap();
    let request = request_sent(&mut peer);
    assert!(
        matches!(request, ControlMessage::Request { tier, .. } if tier == TierIndex::SMALLEST),
        "a demotion: {request:?}"
    );
    (a, channel, peer, request)
}

#[test]
fn a_pending_demotion_is_not_superseded_by_a_promotion() {
    // The peer puts the smaller receives in force when it provisions them; a promotion
    // asked meanwhile would leave them there while this side sends on its larger grant.
    let ladder = three_tiers();
    let start = Instant::now();
    let (mut a, mut channel, mut peer, _demotion) = promoted_then_demoting(&ladder, start);
    let later = start + Duration::from_secs(120) + Duration::from_millis(1);
    assert_eq!(
        a.plan_message(later, 20_000).unwrap().framing,
        Framing::Segmented
    );
    a.pump(&mut channel, later).unwrap();
    let mut frame = [0u8; wire::MAX_FRAME_LEN];
    assert_eq!(
        peer.recv_frame(&mut frame).unwrap(),
        None,
        "nothing asked while the demotion is pending"
    );
    assert_eq!(a.stats().held_back_by_demotion, 1);
}

#[test]
fn a_refused_demotion_is_not_asked_again_until_the_back_off_ends() {
    let ladder = three_tiers();
    let start = Instant::now();
    let (mut a, mut channel, mut peer, demotion) = promoted_then_demoting(&ladder, start);
    let mut now = start + Duration::from_secs(120);
    nack(&mut peer, demotion, NackReason::OverBudget);
    a.pump(&mut channel, now).unwrap();
    assert_eq!(a.send_tier(), TierIndex::new(1), "still on the larger tier");
    let mut frame = [0u8; wire::MAX_FRAME_LEN];
    for _ in 0..10 {
        now += Duration::from_millis(1);
        a.pump(&mut channel, now).unwrap();
        assert_eq!(
            peer.recv_frame(&mut frame).unwrap(),
            None,
            "not asked again at once"
        );
    }
    let held_until = a.poll_timeout().expect("a timer for the next demotion");
    assert!(
        held_until >= now,
        "the timer is not in the past, so no pass spins"
    );
    a.pump(&mut channel, held_until).unwrap();
    assert!(
        peer.recv_frame(&mut frame).unwrap().is_some(),
        "asked again after it"
    );
}

/// Three tiers of four slots, for the hostile peer.
fn four_slot_tiers() -> Arc<TierLadder> {
    Arc::new(
        TierLadder::builder()
            .tier(4096, 4, 4000)
            .tier(16_384, 4, 16_000)
            .tier(65_536, 4, 65_000)
            .build()
            .unwrap(),
    )
}

/// Writes `message` on the channel as the peer.
fn send(peer: &mut InMemoryNegotiator, message: ControlMessage) {
    let mut frame = [0u8; wire::MAX_FRAME_LEN];
    let len = wire::encode(&message, &mut frame).unwrap();
    peer.send_frame(&frame[..len]).unwrap();
}

/// Every message the controller sent the peer, oldest first.
fn answers(peer: &mut InMemoryNegotiator) -> Vec<ControlMessage> {
    let mut frame = [0u8; wire::MAX_FRAME_LEN];
    let mut answers = Vec::new();
    while let Some(len) = peer.recv_frame(&mut frame).unwrap() {
        answers.push(wire::decode(&frame[..len]).unwrap());
    }
    answers
}

/// Posts every receive the tier in force has, as the transport does; the peer never
/// sends into them, so they never come back.
fn post_all(victim: &mut TierController, posted: &mut Vec<OwnedTierSlot>) {
    while let Some(slot) = victim.recv_slot() {
        posted.push(slot);
    }
}

/// What a peer can make a tier controller register (`docs/policy.md`, "What a peer can
/// make this side hold"): a peer that asks for tier after tier and never sends into the
/// receives posted for it gets `Busy` until the replaced tier's receives come back.
#[test]
fn a_peer_that_asks_tier_after_tier_and_never_drains_holds_at_most_two_receive_tiers() {
    let ladder = four_slot_tiers();
    let region_len = |tier: u8| ladder.tier(TierIndex::new(tier)).unwrap().region_len() as u64;
    // The most the receive side may hold: the top tier and the next largest, draining;
    // the send side stays on tier 0.
    let bound = region_len(2) + region_len(1) + region_len(0);
    let now = Instant::now();
    let mut victim = controller(&ladder, now);
    let (mut channel, mut peer) = InMemoryNegotiator::pair();
    let mut posted = Vec::new();
    post_all(&mut victim, &mut posted);

    let mut current = Epoch::new(0);
    let mut busy = 0;
    for round in 1..=40u64 {
        let epoch = Epoch::new(round);
        let tier = TierIndex::new(if round % 2 == 1 { 2 } else { 1 });
        send(
            &mut peer,
            ControlMessage::Request {
                epoch,
                tier,
                current,
            },
        );
        victim.pump(&mut channel, now).unwrap();
        victim.reclaim();
        for answer in answers(&mut peer) {
            match answer {
                ControlMessage::Ack { epoch: acked, .. } if acked == epoch => current = epoch,
                ControlMessage::Nack {
                    reason: NackReason::Busy,
                    ..
                } => busy += 1,
                other => panic!("round {round}: unexpected answer {other:?}"),
            }
        }
        post_all(&mut victim, &mut posted);
        assert!(
            victim.registered_bytes() <= bound,
            "round {round}: {} bytes registered, bound {bound}",
            victim.registered_bytes()
        );
    }
    // Every request for a third tier was told to wait; the others asked for the tier in
    // force, which is acked again and costs nothing.
    assert_eq!(busy, 20, "the peer was told to wait");

    // Once the replaced tier's receives come back, the next request is provisioned.
    let recv_tier = victim.recv_tier();
    posted.retain(|slot| slot.tier() == recv_tier);
    victim.reclaim();
    let epoch = Epoch::new(41);
    let other = TierIndex::new(if recv_tier.get() == 2 { 1 } else { 2 });
    send(
        &mut peer,
        ControlMessage::Request {
            epoch,
            tier: other,
            current,
        },
    );
    victim.pump(&mut channel, now).unwrap();
    assert!(
        matches!(answers(&mut peer)[..], [ControlMessage::Ack { epoch: acked, .. }] if acked == epoch),
        "provisioned once the replaced tier drained"
    );
}

mod properties {
    use proptest::prelude::*;

    use super::*;

    /// Ladders of 2 to 4 tiers (sizes 128 B to 1 MiB), measured with the 16-byte header.
    fn ladders() -> impl Strategy<Value = Arc<TierLadder>> {
        (prop::collection::vec(1usize..=3, 1..=3), 1u64..50, 0u64..20).prop_map(
            |(steps, demote_ms, hysteresis_ms)| {
                let mut builder = TierLadder::builder();
                let mut slot_size = 128;
                builder = builder.tier(slot_size, 4, slot_size);
                for step in steps {
                    slot_size <<= 2 * step;
                    builder = builder.tier(slot_size, 4, slot_size - 16 * step);
                }
                Arc::new(
                    builder
                        .demote_after(Duration::from_millis(demote_ms))
                        .hysteresis(Duration::from_millis(hysteresis_ms))
                        .build()
                        .unwrap(),
                )
            },
        )
    }

    proptest! {
        /// Two controllers joined by a channel, fed random messages at random times: every
        /// message planned whole fits a tier both sides carry, each side's tier changes are
        /// reported once and in order, the receiving side's tier follows the sending side's
        /// grant once the channel is quiet, and nothing is registered past each side's tier
        /// in force once replaced tiers have retired.
        #[test]
        fn the_controller_plans_within_the_tiers_both_sides_carry(
            ladder in ladders(),
            steps in prop::collection::vec((0u64..30, 0usize..2, 0usize..300_000), 1..80),
        ) {
            let start = Instant::now();
            let (a_end, b_end) = InMemoryNegotiator::pair();
            let mut sides = [(controller(&ladder, start), a_end), (controller(&ladder, start), b_end)];
            let capacity = FrameCapacity::new(Arc::clone(&ladder), HEADER).unwrap();
            let mut send_tiers = [TierIndex::SMALLEST; 2];
            let mut recv_tiers = [TierIndex::SMALLEST; 2];
            let mut now = start;
            for (advance, from, len) in steps {
                now += Duration::from_millis(advance);
                let controller = &mut sides[from].0;
                let usable = controller.usable_tier();
                let plan = controller.plan_message(now, len).unwrap();
                if plan.framing == Framing::Whole {
                    prop_assert!(len <= capacity.whole(usable).unwrap(), "{len} whole on {usable}");
                    prop_assert!(usable <= recv_tiers[1 - from], "the peer receives on {}", recv_tiers[1 - from]);
                } else {
                    prop_assert!(len > capacity.whole(usable).unwrap());
                }
                for (side, change) in settle(&mut sides, now) {
                    match change {
                        Change::SendTier { from: old, to } => {
                            prop_assert_eq!(old, send_tiers[side]);
                            send_tiers[side] = to;
                        }
                        Change::RecvTier { from: old, to } => {
                            prop_assert_eq!(old, recv_tiers[side]);
                            recv_tiers[side] = to;
                        }
                        other => prop_assert!(false, "unexpected {other:?}"),
                    }
                }
                for side in 0..2 {
                    prop_assert_eq!(sides[side].0.send_tier(), send_tiers[side]);
                    prop_assert_eq!(sides[side].0.recv_tier(), recv_tiers[side]);
                    prop_assert_eq!(recv_tiers[1 - side], send_tiers[side], "quiet channel: the grant is the receive tier");
                }
            }
            for (controller, _) in &sides {
                controller.reclaim();
                let in_force = |tier: TierIndex| {
                    let spec = ladder.tier(tier).unwrap();
                    spec.region_len() as u64
                };
                let bound = in_force(controller.send_tier()) + in_force(controller.recv_tier());
                prop_assert!(controller.registered_bytes() <= bound, "{} > {bound}", controller.registered_bytes());
            }
        }
    }
}
