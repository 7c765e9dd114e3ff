//! The one-sided data path's rendezvous at the sans-IO level, on the test pair
//! (`transport/src/test_pair.rs`, whose endpoints expose ranges and carry out reads as the
//! providers do): a message past the ladder's top tier is exposed by its sender and read
//! by the receiver, with one small frame each way (one the top tier carries goes in
//! segments while its promotion lands); messages behind it keep their order; a receiver
//! without memory for it asks for segments; a hostile or stalled peer fails the
//! connection, blamed, and nothing is left registered. `docs/protocol.md`, "Rendezvous".

use std::io::IoSlice;
use std::sync::Arc;
use std::time::Duration;

use tierbuf_tiers::ladder::TierLadder;
use tierbuf_transport::connection::{
    ConnectionConfig, ConnectionError, DataPath, EXPOSED_LEN, Fault, FrameKind, HEADER_LEN,
    PeerViolation, SendError, WorkKind, WouldBlock,
};
use tierbuf_transport::test_pair::{Pair, Posted, Reading};

/// Tiers of 128 B, 1 KiB and 8 KiB, four slots each, demoted after two idle seconds.
fn ladder() -> Arc<TierLadder> {
    Arc::new(
        TierLadder::builder()
            .tier(128, 4, 112)
            .tier(1024, 4, 1008)
            .tier(8192, 4, 8176)
            .demote_after(Duration::from_secs(2))
            .build()
            .unwrap(),
    )
}

fn config() -> ConnectionConfig {
    ConnectionConfig::new(ladder()).unwrap()
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(29).wrapping_add(seed))
        .collect()
}

/// One frame as a peer would write it (`header.rs`: kind, grant tier, grant count,
/// payload length, message length, little endian).
fn frame(kind: FrameKind, payload: &[u8], message_len: u64) -> Vec<u8> {
    let mut bytes = vec![kind as u8, 0, 0, 0];
    bytes.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    bytes.extend_from_slice(&message_len.to_le_bytes());
    assert_eq!(bytes.len(), HEADER_LEN);
    bytes.extend_from_slice(payload);
    bytes
}

/// An `Exposed` frame's descriptor: key, length, address.
fn descriptor(key: u32, len: u32, addr: u64) -> Vec<u8> {
    let mut bytes = key.to_le_bytes().to_vec();
    bytes.extend_from_slice(&len.to_le_bytes());
    bytes.extend_from_slice(&addr.to_le_bytes());
    assert_eq!(bytes.len(), EXPOSED_LEN);
    bytes
}

/// Steps until both cores are idle, then for ten seconds of idle time, past every timer
/// but the read timeout, and past `demote_after`.
fn settle_and_idle(pair: &mut Pair) {
    pair.settle();
    pair.tick = Duration::from_millis(50);
    for _ in 0..200 {
        pair.step();
    }
}

#[test]
fn a_message_past_the_top_tier_is_read_by_the_peer_with_one_frame_each_way() {
    let mut pair = Pair::new(config(), [1 << 20, 1 << 20]);
    pair.settle();
    let at_rest = pair.in_use();
    pair.record_posts(0);
    let big = pattern(20_000, 1);
    pair.try_send(0, &[IoSlice::new(&big)])
        .expect("taken at once");
    pair.settle();
    assert_eq!(pair.users[1].received, vec![big]);
    let kinds: Vec<u8> = pair
        .take_posts(0)
        .into_iter()
        .filter_map(|posted| match posted {
            Posted::Send(frame) => Some(frame[0]),
            Posted::Recv(_) => None,
        })
        .collect();
    assert_eq!(
        kinds
            .iter()
            .filter(|&&kind| kind == FrameKind::Exposed as u8)
            .count(),
        1,
        "{kinds:?}"
    );
    assert!(
        !kinds
            .iter()
            .any(|&kind| kind <= FrameKind::Last as u8 && kind >= FrameKind::First as u8),
        "no segment: {kinds:?}"
    );
    let (sender, receiver) = (pair.stats(0), pair.stats(1));
    assert_eq!(
        (sender.messages_exposed, sender.messages_segmented),
        (1, 0),
        "{sender:?}"
    );
    assert_eq!(receiver.messages_read, 1, "{receiver:?}");
    assert_eq!(
        sender.send_tier, 2,
        "the promotion to the top tier went on meanwhile"
    );
    settle_and_idle(&mut pair);
    assert_eq!(
        pair.in_use(),
        at_rest,
        "staging and landing regions freed when idle: {:?} {:?}",
        pair.stats(0),
        pair.stats(1)
    );
}

#[test]
fn a_message_the_top_tier_carries_goes_in_segments_while_its_promotion_lands() {
    let mut pair = Pair::new(config(), [1 << 20, 1 << 20]);
    let first = pattern(5000, 12);
    pair.send(0, &first);
    pair.settle();
    pair.send(0, &first);
    pair.settle();
    assert_eq!(pair.users[1].received, vec![first.clone(), first]);
    let sender = pair.stats(0);
    assert_eq!(
        (
            sender.messages_segmented,
            sender.messages_exposed,
            sender.send_tier
        ),
        (1, 0, 2),
        "the first in segments, the second whole on the tier it asked for"
    );
}

#[test]
fn messages_past_the_top_tier_are_read_whole_not_segmented() {
    let mut pair = Pair::new(config(), [4 << 20, 4 << 20]);
    let big = pattern(100_000, 2);
    pair.send(0, &big);
    pair.send(0, &pattern(300_000, 3));
    pair.settle();
    assert_eq!(pair.users[1].received, vec![big, pattern(300_000, 3)]);
    let sender = pair.stats(0);
    assert_eq!((sender.messages_exposed, sender.messages_segmented), (2, 0));
    // One staging region kept for the next, of the larger message's pages.
    let page = tierbuf_pool::page_size() as u64;
    assert_eq!(sender.rendezvous_bytes, 300_000u64.next_multiple_of(page));
}

#[test]
fn messages_sent_behind_an_exposed_one_are_delivered_after_it() {
    for wire_first in [false, true] {
        // Sixteen tier-0 slots: credits for the small ones behind the large one.
        let two_tier = Arc::new(TierLadder::preset("two-tier").unwrap());
        let mut pair = Pair::new(ConnectionConfig::new(two_tier).unwrap(), [1 << 20, 1 << 20]);
        let big = pattern(20_000, 4);
        pair.try_send(0, &[IoSlice::new(&big)]).unwrap();
        let smalls: Vec<Vec<u8>> = (0..3).map(|i| pattern(40 + i, i as u8)).collect();
        for small in &smalls {
            pair.try_send(0, &[IoSlice::new(small)]).unwrap();
        }
        if wire_first {
            // The small frames overtake nothing on the wire, but land before the read
            // completes: the receiver holds them behind it.
            pair.step();
        }
        pair.settle();
        let mut expected = vec![big];
        expected.extend(smalls);
        assert_eq!(pair.users[1].received, expected, "in sending order");
    }
}

#[test]
fn a_second_large_message_waits_for_the_first_to_be_read() {
    let mut pair = Pair::new(config(), [1 << 20, 1 << 20]);
    let (first, second) = (pattern(20_000, 5), pattern(30_000, 6));
    pair.try_send(0, &[IoSlice::new(&first)]).unwrap();
    assert!(matches!(
        pair.try_send(0, &[IoSlice::new(&second)]),
        Err(SendError::WouldBlock(WouldBlock::ExposedUnread))
    ));
    pair.send(0, &second);
    pair.settle();
    assert_eq!(pair.users[1].received, vec![first, second]);
}

#[test]
fn a_receiver_that_cannot_register_a_landing_region_gets_the_message_in_segments() {
    // The receiver's budget holds its tiers and not a 64 KiB region more.
    let mut pair = Pair::new(config(), [1 << 20, 48 << 10]);
    let big = pattern(64 << 10, 7);
    pair.send(0, &big);
    let small = pattern(30, 8);
    pair.send(0, &small);
    pair.settle();
    assert_eq!(pair.users[1].received, vec![big, small]);
    let (sender, receiver) = (pair.stats(0), pair.stats(1));
    assert_eq!(receiver.reads_refused, 1, "{receiver:?}");
    assert_eq!(receiver.messages_read, 0);
    assert_eq!(
        (sender.messages_exposed, sender.messages_segmented),
        (1, 1),
        "exposed, then sent in segments from its copy"
    );
    assert!(pair.failure(0).is_none() && pair.failure(1).is_none());
}

#[test]
fn a_sender_that_cannot_register_a_staging_region_sends_segments() {
    let mut pair = Pair::new(config(), [48 << 10, 1 << 20]);
    let big = pattern(64 << 10, 9);
    pair.send(0, &big);
    pair.settle();
    assert_eq!(pair.users[1].received, vec![big]);
    let sender = pair.stats(0);
    assert_eq!((sender.messages_exposed, sender.messages_segmented), (0, 1));
}

#[test]
fn the_two_sided_data_path_segments_as_before() {
    let mut pair = Pair::new(
        config().with_data_path(DataPath::TwoSided),
        [1 << 20, 1 << 20],
    );
    let big = pattern(5000, 10);
    pair.send(0, &big);
    pair.settle();
    assert_eq!(pair.users[1].received, vec![big]);
    let sender = pair.stats(0);
    assert_eq!((sender.messages_exposed, sender.messages_segmented), (0, 1));
    assert_eq!(pair.stats(1).messages_read, 0);
}

#[test]
fn a_peer_that_never_reads_fails_the_connection_at_the_read_timeout() {
    let config = config().with_read_timeout(Duration::from_secs(2));
    let mut pair = Pair::new(config, [1 << 20, 1 << 20]);
    pair.settle();
    // The receiver is gone: nothing the sender posts is taken.
    pair.hold(0, true);
    pair.try_send(0, &[IoSlice::new(&pattern(20_000, 11))])
        .unwrap();
    pair.tick = Duration::from_millis(100);
    for _ in 0..15 {
        pair.step();
    }
    assert!(pair.failure(0).is_none(), "not before the timeout");
    assert!(
        pair.core(0).poll_timeout().is_some(),
        "the deadline is a timer"
    );
    for _ in 0..10 {
        pair.step();
    }
    let error = pair.failure(0).expect("failed at the timeout");
    assert!(
        matches!(
            **error,
            ConnectionError::PeerProtocol(PeerViolation::ReadNotDone { len: 20_000, .. })
        ),
        "{error}"
    );
    assert_eq!(error.fault(), Fault::Peer);
}

/// The side under attack, side 0 of a scripted pair: the peer is the test.
fn victim() -> Pair {
    Pair::scripted(config(), 1 << 20)
}

/// Writes the peer's `frame` into the victim's oldest receive, then lets it step (which
/// carries out any read it posts).
fn deliver(victim: &mut Pair, frame: &[u8]) -> Result<(), Arc<ConnectionError>> {
    let landed = victim.forge(0, frame, None).expect("a posted receive");
    victim.step();
    landed.result?;
    match victim.failure(0) {
        Some(error) => Err(Arc::clone(error)),
        None => Ok(()),
    }
}

#[test]
fn an_exposed_message_past_the_limit_is_refused_before_anything_is_registered() {
    let mut victim = victim();
    let before = victim.budget(0).in_use();
    let len = 64u64 << 20;
    let exposed = frame(
        FrameKind::Exposed,
        &descriptor(7, u32::MAX, 0x1000),
        len + 1,
    );
    let error = deliver(&mut victim, &exposed).unwrap_err();
    assert!(
        matches!(
            *error,
            ConnectionError::PeerProtocol(PeerViolation::Reassembly(_))
        ),
        "{error}"
    );
    assert_eq!(error.fault(), Fault::Peer);
    assert_eq!(victim.budget(0).in_use(), before);
}

#[test]
fn a_descriptor_of_another_length_than_its_message_is_refused() {
    let mut victim = victim();
    let exposed = frame(FrameKind::Exposed, &descriptor(7, 4096, 0x1000), 5000);
    let error = deliver(&mut victim, &exposed).unwrap_err();
    assert!(
        matches!(
            *error,
            ConnectionError::PeerProtocol(PeerViolation::ExposedRange {
                range: 4096,
                len: 5000
            })
        ),
        "{error}"
    );
}

#[test]
fn a_read_of_a_range_never_exposed_fails_the_connection_as_the_peers_fault() {
    let mut victim = victim();
    let exposed = frame(FrameKind::Exposed, &descriptor(7, 5000, 0x1000), 5000);
    let error = deliver(&mut victim, &exposed).unwrap_err();
    assert!(
        matches!(
            *error,
            ConnectionError::CompletionFailed {
                kind: WorkKind::Read,
                ..
            }
        ),
        "{error}"
    );
    assert_eq!(error.fault(), Fault::Peer);
}

#[test]
fn a_second_exposure_while_the_first_is_read_is_a_violation() {
    let mut victim = victim();
    // Held: the read waits, so the second exposure finds the first still being read.
    victim.hold(0, true);
    let exposed = frame(FrameKind::Exposed, &descriptor(7, 5000, 0x1000), 5000);
    deliver(&mut victim, &exposed).expect("the first is taken on");
    let error = deliver(&mut victim, &exposed).unwrap_err();
    assert!(
        matches!(
            *error,
            ConnectionError::PeerProtocol(PeerViolation::SecondExposure)
        ),
        "{error}"
    );
}

#[test]
fn an_answer_for_nothing_exposed_is_a_violation() {
    for kind in [FrameKind::ReadDone, FrameKind::ReadRefused] {
        let mut victim = victim();
        let mut answer = 7u32.to_le_bytes().to_vec();
        answer.extend_from_slice(&5000u32.to_le_bytes());
        let error = deliver(&mut victim, &frame(kind, &answer, 0)).unwrap_err();
        assert!(
            matches!(
                *error,
                ConnectionError::PeerProtocol(PeerViolation::UnexposedReadDone {
                    key: 7,
                    len: 5000
                })
            ),
            "{error}"
        );
    }
}

/// Both users send without reading while one side's first message is read by the peer
/// (each reads only once its own sends are done, as a socket's user would): the messages
/// that arrive behind the read hold their receive slots, and the read's answer needs a
/// credit of the peer's. Every message still arrives, in order.
#[test]
fn users_that_send_both_ways_without_reading_behind_a_read_still_get_everything() {
    let two_tier = Arc::new(TierLadder::preset("two-tier").unwrap());
    let mut pair = Pair::new(ConnectionConfig::new(two_tier).unwrap(), [4 << 20, 4 << 20]);
    pair.users[0].reading = Reading::Nothing;
    pair.users[1].reading = Reading::Nothing;
    let outgoing = |side: usize| -> Vec<Vec<u8>> {
        let mut messages = Vec::new();
        if side == 0 {
            messages.push(pattern(20_000, 100));
        }
        messages.extend((0..60u8).map(|i| pattern(100 + side, i)));
        messages
    };
    let mut queues = [outgoing(0), outgoing(1)];
    for _ in 0..10_000 {
        for (side, queue) in queues.iter_mut().enumerate() {
            if let Some(next) = queue.first() {
                match pair.try_send(side, &[IoSlice::new(next)]) {
                    Ok(()) => drop(queue.remove(0)),
                    Err(SendError::WouldBlock(_)) => {}
                    Err(other) => panic!("side {side}: {other}"),
                }
            }
        }
        if queues.iter().all(Vec::is_empty) {
            break;
        }
        for (side, queue) in queues.iter().enumerate() {
            if queue.is_empty() {
                pair.users[side].reading = Reading::Copies;
            }
        }
        pair.step();
    }
    assert!(
        queues.iter().all(Vec::is_empty),
        "both sends finished: {:?} {:?}",
        pair.stats(0),
        pair.stats(1)
    );
    pair.users[0].reading = Reading::Copies;
    pair.users[1].reading = Reading::Copies;
    pair.settle();
    for side in 0..2 {
        assert_eq!(pair.users[side].received, outgoing(1 - side), "side {side}");
    }
    assert_eq!(pair.stats(1).messages_read, 1);
}

/// On a ladder of one tier, where no promotion or demotion ever sets a timer, the regions
/// a message past that tier left are still given back when their time is up: the
/// connection has a timer for it, which wakes a connection that nothing else wakes.
#[test]
fn the_regions_kept_for_the_next_read_are_given_back_by_a_timer() {
    let one_tier = TierLadder::builder()
        .tier(512, 4, 480)
        .demote_after(Duration::from_secs(2))
        .build()
        .unwrap();
    let mut pair = Pair::new(
        ConnectionConfig::new(Arc::new(one_tier)).unwrap(),
        [1 << 20, 1 << 20],
    );
    pair.settle();
    let at_rest = pair.in_use();
    assert!(pair.core(0).poll_timeout().is_none() && pair.core(1).poll_timeout().is_none());
    pair.send(0, &pattern(2000, 13));
    pair.settle();
    assert_eq!(pair.users[1].received, vec![pattern(2000, 13)]);
    for side in 0..2 {
        assert!(
            pair.stats(side).rendezvous_bytes > 0,
            "side {side} keeps a region"
        );
        let timer = pair
            .core(side)
            .poll_timeout()
            .expect("a timer for its region");
        pair.now = timer;
        pair.progress(side);
        assert_eq!(
            pair.stats(side).rendezvous_bytes,
            0,
            "side {side} gave it back"
        );
    }
    assert_eq!(pair.in_use(), at_rest);
}
