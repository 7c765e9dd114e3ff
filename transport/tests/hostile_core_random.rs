//! A hostile peer against one `ConnectionCore`, sans-IO, drawn at random (the hand-written
//! attacks are in `hostile_core.rs`), on a scripted test pair (`transport/src/test_pair.rs`):
//! the peer writes whatever frames
//! it likes into the receives the core posts (valid ones, lying headers, credit floods,
//! negotiation messages of any kind, any tier, any epoch, garbage), and never reads what
//! the core sends beyond completing it. Whatever it does, the core
//!
//! - never panics;
//! - never holds more registered memory than the tier in force and one draining tier in
//!   each direction allow (`docs/policy.md`, "What a peer can make this side hold");
//! - fails, when it fails, with an error that says the peer is at fault;
//! - gives every registered byte back when dropped.

use std::io::IoSlice;
use std::sync::Arc;
use std::time::Duration;

use proptest::prelude::*;
use tierbuf_tiers::TierIndex;
use tierbuf_tiers::ladder::TierLadder;
use tierbuf_tiers::wire::{self, ControlMessage, Epoch, NackReason};
use tierbuf_transport::connection::{ConnectionConfig, Fault};
use tierbuf_transport::test_pair::Pair;

/// The frame header's length and layout (`docs/connection.md`, "Frame header").
const HEADER_LEN: usize = 16;

/// The kind byte of a control frame.
const CONTROL: u8 = 5;

fn ladder() -> Arc<TierLadder> {
    Arc::new(
        TierLadder::builder()
            .tier(256, 4, 240)
            .tier(4096, 4, 4080)
            .tier(16_384, 3, 16_368)
            .demote_after(Duration::from_millis(50))
            .hysteresis(Duration::from_millis(5))
            .build()
            .unwrap(),
    )
}

/// What the peer writes into the core's next posted receive: a header whose fields say
/// what the peer claims (a payload length of its own, or the payload's), and a payload.
#[derive(Debug, Clone)]
struct Frame {
    kind: u8,
    grant_tier: u8,
    grant_count: u16,
    claimed_payload: Option<u32>,
    message_len: u64,
    payload: Vec<u8>,
}

fn control_message() -> impl Strategy<Value = ControlMessage> {
    let epoch = (1u64..6).prop_map(Epoch::new);
    let tier = (0u8..4).prop_map(TierIndex::new);
    let reason = prop_oneof![
        Just(NackReason::Busy),
        Just(NackReason::OverBudget),
        Just(NackReason::BeyondLadder)
    ];
    prop_oneof![
        (epoch.clone(), tier.clone(), epoch.clone()).prop_map(|(epoch, tier, current)| {
            ControlMessage::Request {
                epoch,
                tier,
                current,
            }
        }),
        (epoch.clone(), tier, reason).prop_map(|(epoch, tier, reason)| ControlMessage::Nack {
            epoch,
            tier,
            reason
        }),
        epoch
            .clone()
            .prop_map(|epoch| ControlMessage::Released { epoch }),
        epoch.prop_map(|epoch| ControlMessage::Abandon { epoch }),
    ]
}

fn frame() -> impl Strategy<Value = Frame> {
    let raw = (
        prop_oneof![4 => 1u8..=8, 1 => any::<u8>()],
        prop_oneof![4 => 0u8..3, 1 => any::<u8>()],
        prop_oneof![4 => 0u16..4, 1 => any::<u16>()],
        prop_oneof![4 => Just(None), 1 => any::<u32>().prop_map(Some)],
        prop_oneof![2 => 0u64..20_000, 1 => any::<u64>()],
        prop::collection::vec(any::<u8>(), 0..300),
    )
        .prop_map(
            |(kind, grant_tier, grant_count, claimed_payload, message_len, payload)| Frame {
                kind,
                grant_tier,
                grant_count,
                claimed_payload,
                message_len,
                payload,
            },
        );
    let control = (0u16..4, control_message())
        .prop_map(|(grant_count, message)| Frame::control(grant_count, &message));
    prop_oneof![3 => raw, 2 => control]
}

impl Frame {
    /// A well-formed control frame carrying `message`, granting `grant_count` receives of
    /// tier 0.
    fn control(grant_count: u16, message: &ControlMessage) -> Frame {
        let mut bytes = [0u8; wire::MAX_FRAME_LEN];
        let len = wire::encode(message, &mut bytes).unwrap();
        Frame {
            kind: CONTROL,
            grant_tier: 0,
            grant_count,
            claimed_payload: None,
            message_len: 0,
            payload: bytes[..len].to_vec(),
        }
    }

    fn bytes(&self) -> Vec<u8> {
        let payload_len = self.claimed_payload.unwrap_or(self.payload.len() as u32);
        let mut bytes = Vec::with_capacity(HEADER_LEN + self.payload.len());
        bytes.push(self.kind);
        bytes.push(self.grant_tier);
        bytes.extend_from_slice(&self.grant_count.to_le_bytes());
        bytes.extend_from_slice(&payload_len.to_le_bytes());
        bytes.extend_from_slice(&self.message_len.to_le_bytes());
        bytes.extend_from_slice(&self.payload);
        bytes
    }
}

/// One step of the hostile peer's script.
#[derive(Debug, Clone)]
enum Step {
    /// Writes a frame into the core's oldest posted receive and completes it.
    Deliver(Frame),
    /// Asks for a tier as a well-behaved peer would (the next epoch, naming the grant the
    /// core acked last), then never sends into what the core posts for it.
    Ask(u8),
    /// The core's user sends a message of this length.
    Send(usize),
    /// Time passes.
    Wait(u64),
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        6 => frame().prop_map(Step::Deliver),
        3 => (0u8..3).prop_map(Step::Ask),
        2 => prop_oneof![0usize..200, 0usize..40_000].prop_map(Step::Send),
        1 => (1u64..100).prop_map(Step::Wait),
    ]
}

/// The negotiation message in `frame`, one the core sent, if it is a control frame.
fn control_in(frame: &[u8]) -> Option<ControlMessage> {
    let payload_len = u32::from_le_bytes(frame.get(4..8)?.try_into().ok()?) as usize;
    if frame[0] != CONTROL {
        return None;
    }
    wire::decode(frame.get(HEADER_LEN..HEADER_LEN + payload_len)?).ok()
}

/// The most a core on [`ladder`] may hold registered: in each direction the tier in force
/// and one draining tier, at most the two largest.
fn bound(ladder: &TierLadder) -> u64 {
    let mut regions: Vec<u64> = ladder
        .tiers()
        .iter()
        .map(|t| t.region_len() as u64)
        .collect();
    regions.sort_unstable();
    2 * regions.iter().rev().take(2).sum::<u64>()
}

fn run(steps: Vec<Step>) -> Result<(), TestCaseError> {
    let ladder = ladder();
    let mut pair = Pair::scripted(
        ConnectionConfig::new(Arc::clone(&ladder)).unwrap(),
        64 << 20,
    );
    let budget = pair.budget(0).clone();
    let bound = bound(&ladder);
    // The peer's side of the negotiation: its next request's epoch, the last it had acked.
    let (mut next_epoch, mut acked) = (1, Epoch::new(0));
    for step in steps {
        pair.progress(0);
        // The peer takes every send at once, and reads none of them but the acks.
        while let Some(taken) = pair.take(0) {
            if let Some(ControlMessage::Ack { epoch, .. }) = control_in(&taken.frame) {
                acked = epoch;
            }
        }
        let step = match step {
            Step::Ask(tier) => {
                let epoch = Epoch::new(next_epoch);
                next_epoch += 1;
                Step::Deliver(Frame::control(
                    1,
                    &ControlMessage::Request {
                        epoch,
                        tier: TierIndex::new(tier),
                        current: acked,
                    },
                ))
            }
            other => other,
        };
        match step {
            Step::Deliver(frame) => {
                // Into the oldest posted receive; what does not fit it is cut off, as a
                // provider would refuse it.
                if pair.forge(0, &frame.bytes(), None).is_none() {
                    continue;
                }
                while pair.try_recv(0).is_some() {}
            }
            Step::Send(len) => {
                let message = vec![0xA5; len];
                let _ = pair.try_send(0, &[IoSlice::new(&message)]);
            }
            Step::Wait(ms) => pair.now += Duration::from_millis(ms),
            Step::Ask(_) => unreachable!("made a delivery above"),
        }
        let stats = pair.stats(0);
        prop_assert!(
            stats.registered_bytes <= bound,
            "{} bytes registered, bound {bound}: {stats:?}",
            stats.registered_bytes
        );
        if let Some(error) = pair.failure(0) {
            prop_assert_eq!(error.fault(), Fault::Peer, "{:?}", error);
            break;
        }
    }
    drop(pair);
    prop_assert_eq!(budget.in_use(), 0, "every registered byte came back");
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn a_hostile_peer_can_neither_panic_nor_bloat_the_core(
        steps in prop::collection::vec(step(), 1..200)
    ) {
        run(steps)?;
    }
}
