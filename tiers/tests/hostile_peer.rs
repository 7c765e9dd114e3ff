//! What a peer can make a tier controller register: its receive region holds the tier in
//! force and at most one replaced tier still draining, however the peer asks
//! (`docs/policy.md`, "What a peer can make this side hold"). A peer that asks for tier
//! after tier and never sends into the receives posted for it gets `Busy` until the
//! replaced tier's receives come back.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tierbuf_pool::{HostRegistrar, MemoryBudget};
use tierbuf_tiers::controller::TierController;
use tierbuf_tiers::ladder::TierLadder;
use tierbuf_tiers::negotiator::{InMemoryNegotiator, Negotiator};
use tierbuf_tiers::policy::FrameCapacity;
use tierbuf_tiers::wire::{self, ControlMessage, Epoch, NackReason};
use tierbuf_tiers::{NegotiationConfig, OwnedTierSlot, Reservoir, TierIndex};

fn ladder() -> Arc<TierLadder> {
    Arc::new(
        TierLadder::builder()
            .tier(4096, 4, 4000)
            .tier(16_384, 4, 16_000)
            .tier(65_536, 4, 65_000)
            .build()
            .unwrap(),
    )
}

fn victim(ladder: &Arc<TierLadder>, now: Instant) -> TierController {
    let capacity = Arc::new(FrameCapacity::new(Arc::clone(ladder), 16).unwrap());
    let negotiation = NegotiationConfig::for_ladder(ladder, Duration::from_millis(100), 5).unwrap();
    let registrar = Arc::new(HostRegistrar::new(MemoryBudget::with_cap(1 << 30)));
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

fn send(peer: &mut InMemoryNegotiator, message: ControlMessage) {
    let mut frame = [0u8; wire::MAX_FRAME_LEN];
    let len = wire::encode(&message, &mut frame).unwrap();
    peer.send_frame(&frame[..len]).unwrap();
}

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

#[test]
fn a_peer_that_asks_tier_after_tier_and_never_drains_holds_at_most_two_receive_tiers() {
    let ladder = ladder();
    let region_len = |tier: u8| ladder.tier(TierIndex::new(tier)).unwrap().region_len() as u64;
    // The most the receive side may hold: the top tier and the next largest, draining;
    // the send side stays on tier 0.
    let bound = region_len(2) + region_len(1) + region_len(0);
    let now = Instant::now();
    let mut victim = victim(&ladder, now);
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
