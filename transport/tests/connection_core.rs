//! Two `ConnectionCore`s on the test pair (`transport/src/test_pair.rs`), which keeps the
//! verbs rules (receives consumed in posting order, a send waits for a posted receive, a
//! frame longer than the receive is an error): delivery in order byte for byte,
//! promotion, segmentation, refusal for budget, and every byte of memory back at the end.

use std::io::IoSlice;
use std::sync::Arc;
use std::time::Duration;

use proptest::prelude::*;
use tierbuf_tiers::ladder::TierLadder;
use tierbuf_transport::CallerCopies;
use tierbuf_transport::connection::{
    ConnectionConfig, ConnectionError, DataPath, Fault, FrameKind, Message, SendError, WouldBlock,
};
use tierbuf_transport::test_pair::{Pair, Posted, Reading};

/// What the budget charges a region of `len` bytes: the whole pages it maps.
fn charged(len: u64) -> u64 {
    len.next_multiple_of(tierbuf_pool::page_size() as u64)
}

fn ladder() -> Arc<TierLadder> {
    Arc::new(
        TierLadder::builder()
            .tier(128, 4, 112)
            .tier(1024, 4, 1008)
            .tier(8192, 4, 8176)
            .build()
            .unwrap(),
    )
}

fn config() -> ConnectionConfig {
    ConnectionConfig::new(ladder()).unwrap()
}

/// [`config`] with messages too large for the tier in force sent in segments.
fn segmented() -> ConnectionConfig {
    config().with_data_path(DataPath::TwoSided)
}

/// Sends `message` from side 0 while the frames of side `stalled` stay in flight, until
/// side 0 has given its promotion up (still stalled on return).
fn send_until_promotion_given_up(pair: &mut Pair, stalled: usize, message: &[u8]) {
    pair.hold(stalled, true);
    pair.send(0, message);
    for _ in 0..2_000 {
        pair.step();
    }
    assert_eq!(pair.stats(0).tiers.timeouts, 1);
}

/// Steps for ten seconds of idle time, past every timer and `demote_after`, and checks
/// that both directions are back on tier 0 with `registered` registered.
fn idle_back_to(pair: &mut Pair, registered: [u64; 2], why: &str) {
    pair.tick = Duration::from_millis(50);
    for _ in 0..200 {
        pair.step();
    }
    let (sender, receiver) = (pair.stats(0), pair.stats(1));
    assert_eq!(
        (receiver.recv_tier, sender.send_tier),
        (0, 0),
        "the receiver posts receives of the tier the sender sends on"
    );
    assert_eq!(pair.in_use(), registered, "{why}");
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

#[test]
fn small_messages_both_ways_arrive_in_order() {
    let mut pair = Pair::new(config(), [1 << 20, 1 << 20]);
    for i in 0..50u8 {
        pair.send(0, &pattern(i as usize, i));
        pair.send(1, &pattern(100 - i as usize, i));
    }
    pair.settle();
    for i in 0..50u8 {
        assert_eq!(pair.users[1].received[i as usize], pattern(i as usize, i));
        assert_eq!(
            pair.users[0].received[i as usize],
            pattern(100 - i as usize, i)
        );
    }
    assert_eq!(pair.stats(0).tiers.promotions, 0);
}

#[test]
fn a_first_large_message_goes_in_segments_while_the_promotion_lands_then_whole() {
    let mut pair = Pair::new(segmented(), [1 << 20, 1 << 20]);
    let big = pattern(5000, 7);
    let first = pair.try_send(0, &[IoSlice::new(&big)]);
    first.expect("taken at once, not held for the promotion");
    pair.settle();
    pair.send(0, &big);
    pair.settle();
    assert_eq!(pair.users[1].received, vec![big.clone(), big]);
    let stats = pair.stats(0);
    assert_eq!((stats.send_tier, stats.tiers.promotions), (2, 1));
    assert_eq!(stats.messages_segmented, 1, "only the first: {stats:?}");
    assert_eq!(pair.stats(1).recv_tier, 2);
    // The receiver's tier-0 receives were drained and retired: it holds tier 2 receives
    // and tier 0 send buffers only, each slot with its 64 bytes of headroom.
    assert_eq!(
        pair.budget(1).in_use(),
        charged(4 * (8192 + 64)) + charged(4 * (128 + 64))
    );
}

/// A first oversize message whose rest the receives posted can take is delivered
/// before its promotion is provisioned (`docs/connection.md`, rule 9).
#[test]
fn a_first_large_message_is_delivered_before_the_peer_provisions_its_promotion() {
    let mut pair = Pair::new(segmented(), [1 << 20, 1 << 20]);
    // The clock stands still: nothing is released by time.
    pair.tick = Duration::ZERO;
    // Six frames of tier 0: three go before the request, three after it.
    assert_eq!(
        recv_tier_at_delivery(&mut pair, &pattern(600, 3)),
        0,
        "the promotion asked for with the message was answered after it"
    );
    pair.settle();
    assert_eq!(pair.stats(0).send_tier, 1, "then promoted");
    assert_eq!(pair.stats(1).recv_tier, 1);
}

/// A message whose rest needs more than the receives posted is not held up for: the
/// promotion goes ahead while it arrives, and its later frames are of the new tier.
#[test]
fn a_message_longer_than_the_receives_posted_does_not_hold_up_its_promotion() {
    let mut pair = Pair::new(config(), [1 << 20, 1 << 20]);
    pair.tick = Duration::ZERO;
    assert_eq!(
        recv_tier_at_delivery(&mut pair, &pattern(5000, 5)),
        2,
        "provisioned while the message arrived"
    );
}

/// Sends `message` from side 0, steps until side 1 has it (and checks it), and returns
/// side 1's receive tier at that moment.
fn recv_tier_at_delivery(pair: &mut Pair, message: &[u8]) -> u8 {
    pair.send(0, message);
    while pair.users[1].received.is_empty() {
        assert!(pair.step(), "the segments stopped");
    }
    assert_eq!(pair.users[1].received, vec![message.to_vec()]);
    pair.stats(1).recv_tier
}

#[test]
fn control_held_behind_an_unread_message_is_answered_once_the_hold_is_up() {
    let mut pair = Pair::new(segmented(), [1 << 20, 1 << 20]);
    pair.tick = Duration::ZERO;
    pair.users[1].reading = Reading::Nothing;
    pair.send(0, &pattern(600, 4));
    for _ in 0..200 {
        pair.step();
    }
    assert_eq!(
        pair.stats(0).tiers.promotions,
        0,
        "held while the message waits to be taken"
    );
    pair.tick = Duration::from_micros(100);
    for _ in 0..200 {
        pair.step();
    }
    assert_eq!(
        pair.stats(0).send_tier,
        1,
        "answered once the hold was up, the message still unread"
    );
    assert!(pair.users[1].received.is_empty());
    pair.users[1].reading = Reading::Copies;
    pair.settle();
    assert_eq!(pair.users[1].received, vec![pattern(600, 4)]);
}

#[test]
fn the_io_vector_prefix_that_fits_goes_first() {
    let mut pair = Pair::new(config(), [1 << 20, 1 << 20]);
    let (a, b, c) = (pattern(50, 1), pattern(50, 2), pattern(50, 3));
    let accepted = pair
        .try_write_vectored(0, &[IoSlice::new(&a), IoSlice::new(&b), IoSlice::new(&c)])
        .unwrap();
    assert_eq!(accepted, 100, "a and b fit 112 bytes together, c does not");
    pair.settle();
    assert_eq!(pair.users[1].received, vec![[a, b].concat()]);
}

#[test]
fn messages_past_the_top_tier_are_segmented_and_arrive_as_one() {
    let mut pair = Pair::new(segmented(), [1 << 20, 1 << 20]);
    let huge = pattern(100_000, 9);
    pair.send(0, &huge);
    pair.settle();
    assert_eq!(pair.users[1].received.len(), 1);
    assert!(
        pair.users[1].received[0] == huge,
        "reassembled bytes differ"
    );
}

#[test]
fn a_refused_promotion_falls_back_to_segments_on_the_current_tier() {
    // The receiver's budget holds its tier-0 buffers and nothing larger.
    let mut pair = Pair::new(segmented(), [1 << 20, charged(128 * 4) * 2]);
    let big = pattern(3000, 4);
    pair.send(0, &big);
    pair.settle();
    assert_eq!(pair.users[1].received, vec![big]);
    let stats = pair.stats(0);
    assert_eq!((stats.send_tier, stats.tiers.nacks), (0, 1));
}

#[test]
fn every_registered_byte_comes_back() {
    let mut pair = Pair::new(config(), [1 << 20, 1 << 20]);
    pair.send(0, &pattern(6000, 1));
    pair.send(1, &pattern(600, 2));
    pair.settle();
    let budgets = [0, 1].map(|side| pair.budget(side).clone());
    assert!(budgets.iter().all(|b| b.in_use() > 0));
    drop(pair);
    assert_eq!(budgets.map(|b| b.in_use()), [0, 0]);
}

/// Sends messages of `sizes` (each with its direction: `true` from side 1) through `send`
/// on a fresh pair whose messages too large for the tier in force go as `data_path`
/// says, and checks that each side received the other's once, in order, byte for byte.
/// Returns the pair, settled.
fn exchange(
    data_path: DataPath,
    sizes: &[(usize, bool)],
    mut send: impl FnMut(&mut Pair, usize, &[u8]),
) -> Result<Pair, TestCaseError> {
    let mut pair = Pair::new(config().with_data_path(data_path), [4 << 20, 4 << 20]);
    let mut expected: [Vec<Vec<u8>>; 2] = [Vec::new(), Vec::new()];
    for (i, &(len, backwards)) in sizes.iter().enumerate() {
        let from = usize::from(backwards);
        let message = pattern(len, i as u8);
        send(&mut pair, from, &message);
        expected[1 - from].push(message);
    }
    pair.settle();
    for (side, expected) in expected.iter().enumerate() {
        prop_assert_eq!(pair.users[side].received.len(), expected.len());
        for (got, want) in pair.users[side].received.iter().zip(expected) {
            prop_assert!(
                got == want,
                "message differs: {} vs {} bytes",
                got.len(),
                want.len()
            );
        }
    }
    Ok(pair)
}

fn data_path(two_sided: bool) -> DataPath {
    if two_sided {
        DataPath::TwoSided
    } else {
        DataPath::OneSided
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    /// Random sizes from empty to three times the top tier, both ways, interleaved, on
    /// either data path: every message once, in order, byte for byte.
    #[test]
    fn random_sizes_arrive_once_in_order(
        sizes in prop::collection::vec((0usize..3 * 8192, any::<bool>()), 1..40),
        two_sided in any::<bool>(),
    ) {
        exchange(data_path(two_sided), &sizes, Pair::send)?;
    }

    /// The same with the senders' data frames, at the lengths a "provider" takes from the
    /// caller's memory, copied from their messages by it or, as it decides frame by frame,
    /// written into send slots after all, each message offered whole (`try_send`, whose
    /// small messages may go at once) or resumably (`try_send_some`), as `whole` says:
    /// every message once, in order, byte for byte, and every send slot comes back.
    #[test]
    fn copied_sends_arrive_once_in_order_whether_taken_or_not(
        sizes in prop::collection::vec((0usize..3 * 8192, any::<bool>()), 1..40),
        small_up_to in prop::option::of(0usize..300),
        large_from in prop::option::of(0usize..3 * 8192),
        taken in prop::collection::vec(any::<bool>(), 1..16),
        whole in prop::collection::vec(any::<bool>(), 1..8),
        two_sided in any::<bool>(),
    ) {
        let copies = CallerCopies::new(small_up_to, large_from);
        let mut decisions = taken.iter().copied().cycle();
        let mut takes = || decisions.next().unwrap_or(true);
        let mut calls = whole.iter().copied().cycle();
        let pair = exchange(data_path(two_sided), &sizes, |pair, from, message| {
            let whole = calls.next().unwrap_or(false);
            pair.send_copied(from, message, copies, &mut takes, whole);
        })?;
        let budgets = [0, 1].map(|side| pair.budget(side).clone());
        drop(pair);
        prop_assert_eq!(budgets.map(|b| b.in_use()), [0, 0]);
    }
}

#[test]
fn only_frames_of_the_lengths_the_provider_takes_are_handed_out_to_be_copied() {
    // Frames of at most a 64-byte payload, and of at least a 1000-byte one.
    let copies = CallerCopies::new(Some(16 + 64), Some(16 + 1000));
    let mut pair = Pair::new(config(), [1 << 20, 1 << 20]);
    // On the top tier already, so the 8000-byte message goes whole.
    pair.send(0, &pattern(8000, 99));
    pair.settle();
    pair.users[1].received.clear();
    let sent = [(64, 1), (65, 0), (999, 0), (1000, 1), (0, 1), (8000, 1)];
    for (seq, &(len, handed_out)) in sent.iter().enumerate() {
        let mut count = 0;
        let mut takes = || {
            count += 1;
            true
        };
        pair.send_copied(0, &pattern(len, seq as u8), copies, &mut takes, false);
        pair.settle();
        assert_eq!(count, handed_out, "frames of a {len}-byte message copied");
    }
    let expected: Vec<Vec<u8>> = sent
        .iter()
        .enumerate()
        .map(|(seq, &(len, _))| pattern(len, seq as u8))
        .collect();
    assert_eq!(pair.users[1].received, expected);
}

#[test]
fn a_peer_that_vanishes_mid_promotion_times_out_and_loses_nothing() {
    let mut pair = Pair::new(segmented(), [1 << 20, 1 << 20]);
    pair.send(0, &pattern(40, 1));
    pair.settle();
    let before = pair.budget(0).in_use();
    let big = pattern(5000, 2);
    pair.try_send(0, &[IoSlice::new(&big)])
        .expect("taken at once, in segments, while the promotion is asked for");
    // From now on side 1 is gone: nothing it posted is consumed and it never answers.
    pair.hold(0, true);
    for _ in 0..2_000 {
        pair.now += Duration::from_millis(1);
        pair.progress(0);
    }
    let stats = pair.stats(0);
    assert_eq!((stats.tiers.timeouts, stats.send_tier), (1, 0), "{stats:?}");
    assert!(pair.failure(0).is_none(), "a timeout is not a failure");
    assert_eq!(
        pair.budget(0).in_use(),
        before,
        "the sender registered nothing for it"
    );
}

#[test]
fn a_promotion_given_up_before_the_peer_answered_leaves_the_peer_on_the_senders_tier() {
    let mut pair = Pair::new(segmented(), [1 << 20, 1 << 20]);
    pair.send(0, &pattern(40, 1));
    pair.settle();
    let registered = pair.in_use();
    // Side 0's frames stall until it gives the promotion up; then side 1 reads the
    // request, provisions the tier and acks it, too late: side 0 abandons it.
    let big = pattern(5000, 2);
    send_until_promotion_given_up(&mut pair, 0, &big);
    pair.hold(0, false);
    pair.settle();
    assert_eq!(pair.users[1].received, [pattern(40, 1), big]);
    // Long after: both idle, nothing asked since.
    idle_back_to(
        &mut pair,
        registered,
        "the tier provisioned for the abandoned request is registered no more",
    );
    pair.send(0, &pattern(100, 3));
    pair.settle();
    assert_eq!(pair.users[1].received.last(), Some(&pattern(100, 3)));
}

#[test]
fn receives_posted_for_a_promotion_given_up_are_drained_on_an_idle_connection() {
    // Tier 0 deep enough that a two-segment message and its request go on the credits
    // the sender holds.
    let ladder = TierLadder::builder()
        .tier(128, 16, 112)
        .tier(1024, 4, 1008)
        .build()
        .unwrap();
    let config = ConnectionConfig::new(Arc::new(ladder))
        .unwrap()
        .with_data_path(DataPath::TwoSided);
    let mut pair = Pair::new(config, [1 << 20, 1 << 20]);
    pair.send(0, &pattern(40, 1));
    pair.settle();
    let registered = pair.in_use();
    // Side 1's frames stall: it takes the two segments and the request, provisions tier
    // 1 and posts its receives, but its grants and ack reach side 0 only after side 0
    // gave the request up, with nothing more to send.
    let message = pattern(200, 2);
    send_until_promotion_given_up(&mut pair, 1, &message);
    assert!(
        pair.budget(1).in_use() > registered[1],
        "side 1 provisioned tier 1 and posted its receives"
    );
    pair.hold(1, false);
    idle_back_to(
        &mut pair,
        registered,
        "the receives of the abandoned tier were consumed, and the tier retired",
    );
    assert_eq!(pair.users[1].received, [pattern(40, 1), message]);
}

#[test]
fn an_idle_connection_steps_down_and_the_receiver_frees_the_large_tier() {
    let mut pair = Pair::new(config(), [1 << 20, 1 << 20]);
    pair.send(0, &pattern(5000, 1));
    pair.settle();
    assert_eq!(pair.stats(1).recv_tier, 2);
    let promoted = pair.budget(1).in_use();
    // Small traffic only, then quiet past the ladder's `demote_after`.
    pair.send(0, &pattern(10, 2));
    pair.now += Duration::from_secs(60);
    pair.settle();
    let sender = pair.stats(0);
    assert_eq!(
        (sender.send_tier, sender.tiers.demotions),
        (0, 1),
        "{sender:?}"
    );
    let receiver = pair.stats(1);
    assert_eq!(receiver.recv_tier, 0);
    // The large receives were drained and their tier retired: the receiver holds its
    // tier-0 receives and tier-0 send buffers again.
    assert_eq!(
        pair.budget(1).in_use(),
        charged(128 * 4) * 2,
        "was {promoted}"
    );
    // And the connection still works both ways, promoting again when needed.
    pair.send(0, &pattern(3000, 3));
    pair.send(1, &pattern(20, 4));
    pair.settle();
    assert_eq!(pair.users[1].received.last().unwrap(), &pattern(3000, 3));
    assert_eq!(pair.users[0].received.last().unwrap(), &pattern(20, 4));
}

#[test]
fn a_tier_replaced_while_a_message_holds_one_of_its_slots_comes_back_in_force() {
    let mut pair = Pair::new(segmented(), [1 << 20, 1 << 20]);
    pair.send(0, &pattern(5000, 0)); // promotes, going in segments itself
    pair.settle();
    // A message on tier 2 is held, so its receive slot stays out...
    pair.users[1].reading = Reading::Holds;
    pair.send(0, &pattern(5000, 1));
    pair.settle();
    pair.users[1].reading = Reading::Copies;
    let held = pair.users[1].held.pop().expect("the message");
    assert!(held.is_zero_copy());
    // ...while the connection steps down to tier 0: tier 2 is replaced, and cannot
    // retire while that slot is out.
    pair.now += Duration::from_secs(60);
    pair.settle();
    assert_eq!(pair.stats(1).recv_tier, 0);
    // Asked for tier 2 again, the receiver puts that registration back in force rather
    // than registering a second one beside it.
    let before = pair.budget(1).in_use();
    pair.send(0, &pattern(5000, 2));
    pair.settle();
    let receiver = pair.stats(1);
    assert_eq!(receiver.recv_tier, 2, "{receiver:?}");
    assert_eq!(receiver.tiers.recv_requests_busy, 0, "{receiver:?}");
    assert!(
        pair.budget(1).in_use() <= before,
        "no second registration of tier 2"
    );
    // The held slot is of the tier in force again: once dropped it is posted, and tier
    // 0's receives, drained, retire.
    assert_eq!(&held[..], &pattern(5000, 1)[..]);
    drop(held);
    pair.settle();
    let receiver = pair.stats(1);
    assert_eq!(receiver.posted_receives, 4, "{receiver:?}");
    assert_eq!(
        receiver.registered_bytes,
        4 * (8192 + 64) + 4 * (128 + 64),
        "tier-2 receives and tier-0 send buffers only: {receiver:?}"
    );
    assert_eq!(pair.users[1].received.last().unwrap(), &pattern(5000, 2));
}

#[test]
fn a_side_that_cannot_afford_a_larger_send_tier_still_sends_large_messages() {
    // Side 1's budget holds its tier-0 buffers and nothing larger, so it can neither
    // provision larger receives nor register larger send buffers.
    let mut pair = Pair::new(config(), [1 << 20, charged(128 * 4) * 2]);
    let big = pattern(3000, 5);
    pair.send(1, &big);
    pair.settle();
    pair.send(1, &big);
    pair.settle();
    assert_eq!(pair.users[0].received, vec![big.clone(), big]);
    let stats = pair.stats(1);
    assert_eq!(stats.messages_sent, 2);
    assert_eq!(stats.messages_segmented, 2, "{stats:?}");
    // The stats say why both went in segments: the first's promotion was granted and
    // this side's budget refused the send buffers; the second did not ask again.
    assert_eq!(stats.tiers.send_buffers_refused, 1, "{stats:?}");
    assert_eq!(stats.tiers.held_back_by_refusal, 1, "{stats:?}");
}

#[test]
fn a_reservation_waits_for_its_credit_and_keeps_its_bytes() {
    let mut pair = Pair::new(config(), [1 << 20, 1 << 20]);
    assert!(matches!(
        pair.commit_reserved(0),
        Err(SendError::NothingReserved)
    ));
    pair.try_reserve(0, 50).unwrap();
    assert!(matches!(
        pair.try_reserve(0, 50),
        Err(SendError::WouldBlock(WouldBlock::AlreadyReserved))
    ));
    pair.reserved_mut(0)
        .unwrap()
        .copy_from_slice(&pattern(50, 9));
    // Other sends spend the data credits (tier 0 has four receives, one kept back).
    for seed in 0..3 {
        pair.try_send(0, &[IoSlice::new(&pattern(10, seed))])
            .unwrap();
    }
    assert!(matches!(
        pair.commit_reserved(0),
        Err(SendError::WouldBlock(WouldBlock::NoCredit))
    ));
    assert_eq!(
        pair.core(0).reserved().unwrap(),
        &pattern(50, 9)[..],
        "still reserved"
    );
    // Once the peer returns credits, the reserved message goes, after the others.
    for _ in 0..10 {
        pair.step();
    }
    pair.commit_reserved(0).unwrap();
    pair.settle();
    let received = &pair.users[1].received;
    assert_eq!(received.len(), 4);
    assert_eq!(received[3], pattern(50, 9));
    // A cancelled reservation sends nothing.
    pair.try_reserve(0, 20).unwrap();
    pair.cancel_reserved(0);
    assert!(pair.core(0).reserved().is_none());
    pair.settle();
    assert_eq!(pair.users[1].received.len(), 4);
}

/// A tier carries a message of its size whole (issue #40): on the two-tier preset, whose
/// top tier is 8 KiB, an 8192-byte message promotes the connection to that tier (going in
/// segments on tier 0 meanwhile), and the next one goes in one frame of a 16-byte header
/// and its 8192 bytes; a reservation of 8 KiB fits one frame; one byte more is segmented.
#[test]
fn a_message_the_size_of_the_top_tier_goes_whole_in_one_frame() {
    let ladder = Arc::new(TierLadder::preset("two-tier").unwrap());
    assert_eq!(ladder.tiers()[1].slot_size(), 8192);
    let mut pair = Pair::new(
        ConnectionConfig::new(ladder)
            .unwrap()
            .with_data_path(DataPath::TwoSided),
        [1 << 20, 1 << 20],
    );
    pair.send(0, &pattern(8192, 2));
    pair.settle();
    let promoted = pair.stats(0);
    assert_eq!((promoted.send_tier, promoted.tiers.promotions), (1, 1));
    pair.record_posts(0);
    let message = pattern(8192, 3);
    pair.send(0, &message);
    pair.settle();
    assert_eq!(pair.users[1].received, vec![pattern(8192, 2), message]);
    let stats = pair.stats(0);
    assert_eq!((stats.send_tier, stats.tiers.promotions), (1, 1));
    assert_eq!(
        stats.messages_segmented, promoted.messages_segmented,
        "sent whole"
    );
    let data: Vec<(u8, usize)> = pair
        .take_posts(0)
        .into_iter()
        .filter_map(|posted| match posted {
            Posted::Send(frame) if frame[0] <= FrameKind::Last as u8 => {
                Some((frame[0], frame.len()))
            }
            _ => None,
        })
        .collect();
    assert_eq!(
        data,
        [(FrameKind::Whole as u8, 16 + 8192)],
        "one data frame"
    );

    pair.try_reserve(0, 8192).expect("8 KiB fits one frame");
    pair.cancel_reserved(0);
    assert!(matches!(
        pair.try_reserve(0, 8193),
        Err(SendError::BeyondOneFrame {
            len: 8193,
            max: 8192
        })
    ));
    pair.send(0, &pattern(8193, 4));
    pair.settle();
    assert_eq!(
        pair.stats(0).messages_segmented,
        promoted.messages_segmented + 1,
        "one byte past the top"
    );
}

#[test]
fn a_reservation_past_the_tier_asks_for_a_promotion() {
    let mut pair = Pair::new(config(), [1 << 20, 1 << 20]);
    assert!(matches!(
        pair.try_reserve(0, 3000),
        Err(SendError::WouldBlock(WouldBlock::PromotionPending))
    ));
    let mut reserved = false;
    for _ in 0..100 {
        pair.step();
        if pair.try_reserve(0, 3000).is_ok() {
            reserved = true;
            break;
        }
    }
    assert!(reserved, "the promotion never came");
    pair.reserved_mut(0)
        .unwrap()
        .copy_from_slice(&pattern(3000, 5));
    pair.commit_reserved(0).unwrap();
    pair.settle();
    assert_eq!(pair.users[1].received, vec![pattern(3000, 5)]);
    assert_eq!(pair.stats(0).send_tier, 2);
    assert!(matches!(
        pair.try_reserve(0, 8177),
        Err(SendError::BeyondOneFrame {
            len: 8177,
            max: 8176
        })
    ));
}

#[test]
fn segmented_messages_reuse_one_buffer_per_side_until_idle() {
    let mut pair = Pair::new(segmented(), [1 << 20, 1 << 20]);
    let spare = |pair: &Pair, side: usize| pair.stats(side).spare_buffer_bytes;
    assert_eq!((spare(&pair, 0), spare(&pair, 1)), (0, 0));
    pair.send(0, &pattern(20_000, 1));
    pair.settle();
    let (sender, receiver) = (spare(&pair, 0), spare(&pair, 1));
    assert!(
        sender >= 20_000,
        "the sender keeps its copy's buffer: {sender}"
    );
    assert!(
        receiver >= 20_000,
        "the receiver keeps its reassembly buffer: {receiver}"
    );
    // The next messages of that size or less reuse them instead of growing.
    pair.send(0, &pattern(20_000, 2));
    pair.send(0, &pattern(15_000, 3));
    pair.settle();
    assert_eq!((spare(&pair, 0), spare(&pair, 1)), (sender, receiver));
    assert_eq!(pair.users[1].received.len(), 3);
    assert_eq!(pair.users[1].received[1], pattern(20_000, 2));
    assert_eq!(pair.users[1].received[2], pattern(15_000, 3));
    // Idle past the ladder's `demote_after`: both are freed.
    pair.now += Duration::from_secs(60);
    pair.settle();
    assert_eq!((spare(&pair, 0), spare(&pair, 1)), (0, 0));
}

#[test]
fn a_borrowed_segmented_message_is_posted_from_the_callers_bytes() {
    let mut pair = Pair::new(segmented(), [1 << 20, 1 << 20]);
    // Promotion refused is not needed: past the top tier (8176 bytes a frame) a message
    // is segmented; on tier 0 the first offer asks for tier 2 first.
    let message = pattern(40_000, 7);
    let mut offset = 0;
    let mut rounds = 0;
    while offset < message.len() {
        rounds += 1;
        assert!(rounds < 10_000, "never posted");
        match pair.try_send_some(0, &message[offset..]) {
            Ok(accepted) => {
                assert!(accepted > 0);
                offset += accepted;
                if offset < message.len() {
                    // While it is being posted, nothing else may go.
                    let other = pair.try_send(0, &[IoSlice::new(b"x")]);
                    assert!(
                        matches!(
                            other,
                            Err(SendError::WouldBlock(WouldBlock::SegmentedInFlight))
                        ),
                        "{other:?}"
                    );
                    let wrong = pair.try_send_some(0, &message);
                    assert!(
                        matches!(wrong, Err(SendError::NotTheRest { .. })),
                        "{wrong:?}"
                    );
                }
            }
            Err(SendError::WouldBlock(_)) => {}
            Err(other) => panic!("{other}"),
        }
        // Progress on both sides in between must not lose the half-posted message.
        pair.step();
    }
    assert!(rounds > 1, "the message took several offers");
    pair.send(0, b"after");
    pair.settle();
    assert_eq!(pair.users[1].received, vec![message, b"after".to_vec()]);
    // Nothing was copied to the heap on the sending side.
    assert_eq!(pair.stats(0).spare_buffer_bytes, 0);
}

#[test]
fn a_reservation_whose_promotion_the_peer_refused_is_reported() {
    // The receiver's budget holds its tier-0 buffers and nothing larger.
    let mut pair = Pair::new(config(), [1 << 20, charged(128 * 4) * 2]);
    assert!(matches!(
        pair.try_reserve(0, 3000),
        Err(SendError::WouldBlock(WouldBlock::PromotionPending))
    ));
    pair.settle();
    assert_eq!(pair.stats(0).tiers.nacks, 1);
    assert!(matches!(
        pair.try_reserve(0, 3000),
        Err(SendError::WouldBlock(WouldBlock::PromotionRefused))
    ));
    // A message the tier in force carries is still reserved and sent.
    pair.try_reserve(0, 100).unwrap();
    pair.reserved_mut(0)
        .unwrap()
        .copy_from_slice(&pattern(100, 1));
    pair.commit_reserved(0).unwrap();
    pair.settle();
    assert_eq!(pair.users[1].received, vec![pattern(100, 1)]);
}

#[test]
fn an_empty_element_before_a_large_one_does_not_make_an_empty_message() {
    let mut pair = Pair::new(config(), [1 << 20, 1 << 20]);
    let big = pattern(5000, 3);
    let vector = [IoSlice::new(&[]), IoSlice::new(&big)];
    let accepted = pair.try_write_vectored(0, &vector).unwrap();
    assert_eq!(
        accepted,
        big.len(),
        "the large element is taken, not a zero-byte prefix"
    );
    pair.settle();
    assert_eq!(pair.users[1].received, vec![big]);
}

#[test]
fn a_gather_send_is_one_message_where_the_stream_send_takes_a_prefix() {
    let mut pair = Pair::new(config(), [1 << 20, 1 << 20]);
    let (header, body) = (pattern(50, 1), pattern(5000, 2));
    let parts = [IoSlice::new(&header), IoSlice::new(&body)];
    assert_eq!(
        pair.try_write_vectored(0, &parts).unwrap(),
        50,
        "the prefix"
    );
    pair.settle();
    pair.try_send(0, &parts).expect("the whole message");
    pair.settle();
    assert_eq!(
        pair.users[1].received,
        vec![header.clone(), [header, body].concat()]
    );
}

/// Both users hold every message they receive while they go on sending, as RPC servers
/// that keep requests until their replies are out: the receives their tier has left would
/// give each peer one credit, which data frames never take, so before the connection kept
/// receives posted the two sides traded credit-only frames for ever and no data moved
/// (until a demotion, `demote_after` later, posted a new tier's receives).
#[test]
fn users_that_hold_every_message_while_sending_both_ways_still_get_everything() {
    let mut pair = Pair::new(config(), [1 << 20, 1 << 20]);
    pair.users[0].reading = Reading::Holds;
    pair.users[1].reading = Reading::Holds;
    for i in 0..12u8 {
        pair.send(0, &pattern(60, i));
        pair.send(1, &pattern(70, i));
    }
    pair.settle();
    for (side, len) in [(1, 60), (0, 70)] {
        let held: Vec<Vec<u8>> = pair.users[side].held.iter().map(|m| m.to_vec()).collect();
        let expected: Vec<Vec<u8>> = (0..12u8).map(|i| pattern(len, i)).collect();
        assert_eq!(held, expected, "side {side} got every message, in order");
        let stats = pair.stats(side);
        assert!(stats.messages_copied_to_keep_receives > 0, "{stats:?}");
        assert!(
            stats.posted_receives >= 2,
            "receives kept posted: {stats:?}"
        );
    }
}

/// Both users send at once without reading what arrives meanwhile (two blocking `send`s),
/// so delivered messages wait in the core holding their receive slots: a side that runs
/// out of credits copies them out of their slots, so the peer gets receives to send into.
#[test]
fn users_that_send_at_once_without_reading_still_get_everything() {
    let outgoing = |side: usize| (0..12u8).map(|i| pattern(60 + 10 * side, i)).collect();
    let pair = sent_both_ways_without_reading(outgoing, |pair, side, queue| {
        pair.try_send(side, &[IoSlice::new(&queue[0])]).map(|_| 1)
    });
    let copied: u64 = (0..2)
        .map(|side| pair.stats(side).messages_copied_to_keep_receives)
        .sum();
    assert!(copied > 0, "the queued messages were copied out");
}

/// As above, with batches of small messages that share packed frames: the messages of
/// one frame share its receive slot, which relief frees only by copying all of them out
/// of it; both sides still get every message.
#[test]
fn users_that_send_batches_at_once_without_reading_still_get_everything() {
    let outgoing = |side: usize| (0..96u8).map(|i| pattern(20 + 4 * side, i)).collect();
    let pair = sent_both_ways_without_reading(outgoing, |pair, side, queue| {
        let batch: Vec<&[u8]> = queue.iter().take(8).map(Vec::as_slice).collect();
        pair.try_send_batch(side, &batch)
    });
    for side in 0..2 {
        let stats = pair.stats(side);
        assert!(stats.messages_packed > 80, "{stats:?}");
        assert!(stats.messages_copied_to_keep_receives > 0, "{stats:?}");
    }
}

/// A pair whose users both send their `outgoing(side)` messages without reading, each
/// step offering the front of its queue with `offer` (which returns how many messages it
/// took), until both queues are empty; then both read, and each side must have the
/// other's messages, in order.
fn sent_both_ways_without_reading(
    outgoing: impl Fn(usize) -> Vec<Vec<u8>>,
    offer: impl Fn(&mut Pair, usize, &[Vec<u8>]) -> Result<usize, SendError>,
) -> Pair {
    let mut pair = Pair::new(config(), [1 << 20, 1 << 20]);
    pair.users[0].reading = Reading::Nothing;
    pair.users[1].reading = Reading::Nothing;
    let mut queues = [outgoing(0), outgoing(1)];
    for _ in 0..10_000 {
        for (side, queue) in queues.iter_mut().enumerate() {
            if queue.is_empty() {
                continue;
            }
            match offer(&mut pair, side, queue) {
                Ok(taken) => drop(queue.drain(..taken)),
                Err(SendError::WouldBlock(_)) => {}
                Err(other) => panic!("side {side}: {other}"),
            }
        }
        if queues.iter().all(Vec::is_empty) {
            break;
        }
        pair.step();
    }
    assert!(queues.iter().all(Vec::is_empty), "both sends finished");
    pair.users[0].reading = Reading::Copies;
    pair.users[1].reading = Reading::Copies;
    pair.settle();
    for side in 0..2 {
        assert_eq!(pair.users[side].received, outgoing(1 - side), "side {side}");
    }
    pair
}

/// A peer that sends and sends while it never reads, and so never gives this side a
/// credit back: this side's user, blocked in its own send, reads nothing either. Relief
/// copies queued messages out of their slots only up to the unread-copy limit, so the
/// peer cannot make this side queue copies without end.
#[test]
fn relief_queues_a_bounded_number_of_copies_for_a_peer_that_never_reads() {
    let config = ConnectionConfig::new(ladder())
        .unwrap()
        .with_unread_copy_limit(400);
    let mut pair = Pair::new(config, [1 << 20, 1 << 20]);
    pair.users[0].reading = Reading::Nothing;
    pair.users[1].reading = Reading::Nothing;
    let mut from_peer = 0u32;
    for _ in 0..2_000 {
        // This side's user is stuck in a send the peer never makes room for.
        let _ = pair.try_send(0, &[IoSlice::new(&pattern(60, 0))]);
        let next = pattern(50, from_peer as u8);
        if pair.try_send(1, &[IoSlice::new(&next)]).is_ok() {
            from_peer += 1;
        }
        pair.step();
    }
    // Relief stops once 400 bytes (eight 50-byte messages) are queued as copies; the four
    // slots of tier 0 then hold four more, zero-copy.
    let queued = pair.stats(0).messages_received;
    assert!(
        queued <= 12,
        "{queued} messages queued for a user that reads none"
    );
    assert!(
        u64::from(from_peer) <= queued + 4,
        "the peer was held back: {from_peer} sent"
    );
}

/// As above, with a peer that sends empty messages, 14 to a packed frame: copies of
/// empty messages hold no bytes, but each is a message queued for the user, and the
/// limit counts it so; relief stops and the peer is held back.
#[test]
fn relief_bounds_the_copies_of_empty_messages_too() {
    let config = ConnectionConfig::new(ladder())
        .unwrap()
        .with_unread_copy_limit(400);
    let mut pair = Pair::new(config, [1 << 20, 1 << 20]);
    pair.users[0].reading = Reading::Nothing;
    pair.users[1].reading = Reading::Nothing;
    let empties = [&[][..]; 14];
    for _ in 0..2_000 {
        let _ = pair.try_send(0, &[IoSlice::new(&pattern(60, 0))]);
        let _ = pair.try_send_batch(1, &empties);
        pair.step();
    }
    // Each copy counts its place in the queue (a `Message`), so 400 bytes hold a few,
    // and the pass that reaches the limit may copy the rest of one frame's 14; the four
    // slots of tier 0 hold 14 more each, zero-copy.
    let copies = 400 / std::mem::size_of::<Message>() + 1 + 14;
    let queued = pair.stats(0).messages_received;
    assert!(
        queued <= (copies + 4 * 14) as u64,
        "{queued} messages queued for a user that reads none"
    );
}

/// Found by `copied_sends_arrive_once_in_order_whether_taken_or_not`: both sides spent
/// their last credits at once on control frames that granted nothing, and each was left
/// with none, holding receives it could never grant.
#[test]
fn last_credits_crossing_in_frames_that_grant_nothing_leave_no_side_stranded() {
    let sizes = [(113, true), (1009, false), (8177, false), (1009, true)];
    let copies = CallerCopies::new(None, None);
    for two_sided in [true, false] {
        exchange(data_path(two_sided), &sizes, |pair, from, message| {
            pair.send_copied(from, message, copies, &mut || true, false)
        })
        .unwrap();
    }
}

/// A message's segments tampered with on the wire, in each way the pair's hooks allow
/// (two swapped, one dropped, one changed into a frame of another kind), make a stream
/// the rules refuse: the receiver fails, blaming the peer, and delivers nothing.
#[test]
fn segments_tampered_with_in_flight_fail_the_receiver_for_the_peer() {
    /// Changes the frames in flight, given where the first and the middle segment are.
    type Tamper<'a> = &'a dyn Fn(&mut Pair, usize, usize);
    let tamperings: [(&str, Tamper<'_>); 3] = [
        ("swapped", &|pair, first, middle| {
            pair.swap_in_flight(0, first, middle)
        }),
        ("dropped", &|pair, _, middle| {
            let taken = pair.take_at(0, middle).expect("the middle segment");
            taken.result.expect("its send completes");
        }),
        ("changed", &|pair, _, middle| {
            pair.edit_in_flight(0, middle, |bytes| bytes[0] = FrameKind::Whole as u8)
        }),
    ];
    for (what, tamper) in tamperings {
        let mut pair = Pair::new(segmented(), [1 << 20, 1 << 20]);
        pair.hold(0, true);
        // Three segments of tier 0, sent at once while the promotion is asked for.
        let accepted = pair.try_send(0, &[IoSlice::new(&pattern(300, 1))]);
        accepted.expect("taken whole");
        pair.step();
        let at = |kind: FrameKind| {
            pair.in_flight(0)
                .iter()
                .position(|frame| frame.bytes()[0] == kind as u8)
                .unwrap_or_else(|| panic!("no {kind:?} frame in flight"))
        };
        let (first, middle) = (at(FrameKind::First), at(FrameKind::Middle));
        tamper(&mut pair, first, middle);
        pair.hold(0, false);
        for _ in 0..100 {
            pair.step();
        }
        let error = pair
            .failure(1)
            .unwrap_or_else(|| panic!("{what}: the receiver took it"));
        assert_eq!(error.fault(), Fault::Peer, "{what}: {error}");
        assert!(
            matches!(**error, ConnectionError::PeerProtocol(_)),
            "{what}: {error:?}"
        );
        assert!(
            pair.users[1].received.is_empty(),
            "{what}: nothing delivered"
        );
        assert!(
            pair.failure(0).is_none(),
            "{what}: the sender knows nothing of it"
        );
    }
}
