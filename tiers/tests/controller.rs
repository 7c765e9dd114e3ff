//! The tier controller a connection ships with, driven through its public API with an
//! in-memory channel: what a nack does to the next message, and what a message needs
//! when its frame overhead is counted.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tierbuf_pool::{HostRegistrar, MemoryBudget};
use tierbuf_tiers::controller::{Change, Framing, TierController};
use tierbuf_tiers::ladder::TierLadder;
use tierbuf_tiers::negotiator::{InMemoryNegotiator, Negotiator};
use tierbuf_tiers::policy::FrameCapacity;
use tierbuf_tiers::wire::{self, ControlMessage, NackReason};
use tierbuf_tiers::{NegotiationConfig, Reservoir, TierIndex};

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
    let ladder = Arc::new(TierLadder::preset("patent").unwrap());
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
fn a_stream_of_messages_the_size_of_a_slot_stays_promoted_once_the_header_is_counted() {
    // Tier 0's threshold is its whole slot: a 4096-byte message fits the threshold but
    // not the slot once the header is in it, so it needs tier 1, for the tracker too.
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
    let (a_end, b_end) = InMemoryNegotiator::pair();
    let mut sides = [
        (controller(&ladder, start), a_end),
        (controller(&ladder, start), b_end),
    ];
    let mut now = start;
    for _ in 0..100 {
        sides[0].0.plan_message(now, 4096).unwrap();
        settle(&mut sides, now);
        now += Duration::from_millis(100);
    }
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
