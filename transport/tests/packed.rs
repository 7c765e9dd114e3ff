//! Batches of messages (`Connection::send_batch`, `try_send_batch`) over loopback and
//! shared memory: small messages given together share packed frames, and each still
//! arrives as a message of its own, in order, byte for byte, whatever the receiver does
//! with them (reads and drops them, holds every one, drops them on another thread).

mod pairs;
mod traffic;

use std::sync::mpsc;
use std::time::{Duration, Instant};

use pairs::{PairProvider, connections, demoting_ladder};
use tierbuf_tiers::ladder::TierLadder;
use tierbuf_transport::connection::{Connection, Message, SendError};
use tierbuf_transport::{LoopbackProvider, ShmProvider};
use traffic::{pattern, sizes};

/// The `two-tier` ladder's tiers: 16 receives of 512 bytes, 16 of 8 KiB.
fn ladder() -> TierLadder {
    TierLadder::preset("two-tier").unwrap()
}

/// Batch lengths that cycle through 1 to 40 messages.
fn batches(count: usize) -> Vec<std::ops::Range<usize>> {
    let mut ranges = Vec::new();
    let mut start = 0;
    while start < count {
        let end = (start + 1 + ranges.len() % 40).min(count);
        ranges.push(start..end);
        start = end;
    }
    ranges
}

/// Sends `messages` in batches from `a` on another thread while `b` receives them, with
/// `take` deciding what becomes of each message received; returns both connections.
fn send_in_batches<E: tierbuf_transport::Endpoint + 'static>(
    mut a: Connection<E>,
    mut b: Connection<E>,
    messages: &[Vec<u8>],
    mut take: impl FnMut(usize, Message),
) -> (Connection<E>, Connection<E>) {
    std::thread::scope(|scope| {
        let sender = scope.spawn(move || {
            for range in batches(messages.len()) {
                let batch: Vec<&[u8]> = messages[range].iter().map(Vec::as_slice).collect();
                a.send_batch(&batch).expect("send a batch");
            }
            a.flush().expect("flush");
            a
        });
        let deadline = Instant::now() + Duration::from_secs(60);
        for (index, expected) in messages.iter().enumerate() {
            let message = b
                .recv_deadline(deadline)
                .expect("a message")
                .unwrap_or_else(|| panic!("message {index} of {} stalled", messages.len()));
            assert_eq!(message.len(), expected.len(), "message {index}");
            assert!(message[..] == expected[..], "message {index} differs");
            take(index, message);
        }
        (sender.join().expect("the sender"), b)
    })
}

fn mixed_messages(count: usize) -> Vec<Vec<u8>> {
    sizes(count, 8192)
        .into_iter()
        .enumerate()
        .map(|(index, len)| pattern(len, index as u64))
        .collect()
}

fn batches_arrive_message_by_message<P: PairProvider>() {
    let provider = P::make();
    let (a, b) = connections(&provider, ladder());
    let messages = mixed_messages(3000);
    let (a, b) = send_in_batches(a, b, &messages, |_, message| drop(message));
    let sent = a.stats();
    assert_eq!(sent.messages_sent, messages.len() as u64);
    assert!(
        sent.messages_packed > 1000,
        "small ones shared frames: {sent:?}"
    );
    assert!(
        sent.messages_segmented > 0,
        "large ones were segmented: {sent:?}"
    );
    assert!(
        sent.tiers.promotions > 0,
        "and promoted the connection: {sent:?}"
    );
    assert!(
        sent.frames_sent < sent.messages_sent,
        "fewer frames than messages: {sent:?}"
    );
    let received = b.stats();
    assert_eq!(received.messages_received, messages.len() as u64);
    assert_eq!(received.receives_lent, 0, "every slot given back");
}

#[test]
fn batches_arrive_message_by_message_over_loopback() {
    batches_arrive_message_by_message::<LoopbackProvider>();
}

#[test]
fn batches_arrive_message_by_message_over_shm() {
    batches_arrive_message_by_message::<ShmProvider>();
}

/// A receiver that holds every message it gets: the receive slots that packed messages
/// share are never posted again while one of them is held (the bytes are checked again
/// once all have arrived), and the sender is never left without credit for good.
fn held_packed_messages_keep_their_bytes<P: PairProvider>() {
    let provider = P::make();
    let (a, b) = connections(&provider, ladder());
    let messages: Vec<Vec<u8>> = (0..2000)
        .map(|index| pattern(8 + index % 120, index as u64))
        .collect();
    let mut held = Vec::new();
    let (_a, b) = send_in_batches(a, b, &messages, |_, message| held.push(message));
    for (index, (message, expected)) in held.iter().zip(&messages).enumerate() {
        assert!(message[..] == expected[..], "held message {index} changed");
    }
    let stats = b.stats();
    assert!(
        stats.messages_copied_to_keep_receives > 0,
        "a receiver holding everything has messages copied to keep receives: {stats:?}"
    );
    // Dropped on another thread, the shared slots still come back.
    std::thread::spawn(move || drop(held)).join().unwrap();
    let mut b = b;
    b.progress().expect("progress");
    assert_eq!(b.stats().receives_lent, 0, "every shared slot given back");
}

#[test]
fn held_packed_messages_keep_their_bytes_over_loopback() {
    held_packed_messages_keep_their_bytes::<LoopbackProvider>();
}

#[test]
fn held_packed_messages_keep_their_bytes_over_shm() {
    held_packed_messages_keep_their_bytes::<ShmProvider>();
}

/// Messages of one packed frame dropped in any order, some of them on other threads:
/// the slot goes back once, after the last.
#[test]
fn a_packed_frame_gives_its_slot_back_after_its_last_message() {
    let provider = <LoopbackProvider as PairProvider>::make();
    let (mut a, mut b) = connections(&provider, ladder());
    let batch: Vec<Vec<u8>> = (0..6).map(|index| pattern(40, index)).collect();
    let refs: Vec<&[u8]> = batch.iter().map(Vec::as_slice).collect();
    assert_eq!(a.try_send_batch(&refs).expect("credit for one frame"), 6);
    assert_eq!(a.stats().messages_packed, 6);
    let mut received: Vec<Message> = (0..6).map(|_| b.recv().expect("a message")).collect();
    assert_eq!(b.stats().receives_lent, 1, "six messages, one slot");
    let (give, gone) = mpsc::channel();
    let last = received.pop().unwrap();
    let first = received.remove(0);
    for message in received {
        let give = give.clone();
        std::thread::spawn(move || {
            drop(message);
            give.send(()).unwrap();
        });
    }
    for _ in 0..4 {
        gone.recv().unwrap();
    }
    drop(last);
    b.progress().expect("progress");
    assert_eq!(b.stats().receives_lent, 1, "the first still holds the slot");
    assert!(first[..] == batch[0][..]);
    drop(first);
    b.progress().expect("progress");
    assert_eq!(b.stats().receives_lent, 0);
}

/// `try_send_batch` takes what credits allow and says how many; the rest goes with a
/// later call, and a length past the limit is refused before anything is sent.
#[test]
fn a_batch_past_the_credits_is_taken_in_part_and_a_long_message_refused_whole() {
    let provider = <LoopbackProvider as PairProvider>::make();
    let (mut a, mut b) = connections(&provider, ladder());
    let messages: Vec<Vec<u8>> = (0..400).map(|index| pattern(100, index)).collect();
    let refs: Vec<&[u8]> = messages.iter().map(Vec::as_slice).collect();
    let taken = a.try_send_batch(&refs).expect("some taken");
    assert!(
        0 < taken && taken < refs.len(),
        "16 credits of 480 bytes take {taken} of 400"
    );
    assert!(matches!(
        a.try_send_batch(&refs[taken..]),
        Err(SendError::WouldBlock(_))
    ));
    for expected in &messages[..taken] {
        assert!(b.recv().expect("a message")[..] == expected[..]);
    }
    let long = vec![0u8; (64 << 20) + 1];
    let outcome = a.send_batch(&[b"short", &long]);
    assert!(
        matches!(outcome, Err(SendError::TooLong { .. })),
        "{outcome:?}"
    );
    b.progress().expect("progress");
    assert!(
        b.try_recv().expect("no failure").is_none(),
        "nothing of it sent"
    );
}

/// Batches of 64 small messages are more than a 512-byte frame holds: the connection asks
/// for the 8 KiB tier, as it would for one message of the batch's packed length, and its
/// frames then carry whole batches. Once batches stop it steps down again.
fn large_batches_move_to_a_larger_tier<P: PairProvider>() {
    let provider = P::make();
    let (a, b) = connections(&provider, demoting_ladder(Duration::from_millis(50)));
    let messages: Vec<Vec<u8>> = (0..64 * 40).map(|index| pattern(64, index)).collect();
    let sent = std::thread::scope(|scope| {
        let sender = scope.spawn(move || {
            let mut a = a;
            for batch in messages.chunks(64) {
                let refs: Vec<&[u8]> = batch.iter().map(Vec::as_slice).collect();
                a.send_batch(&refs).expect("send a batch");
            }
            a.flush().expect("flush");
            a
        });
        let mut b = b;
        for index in 0..64 * 40 {
            let message = b.recv().expect("a message");
            assert!(
                message[..] == pattern(64, index as u64)[..],
                "message {index}"
            );
        }
        let a = sender.join().expect("the sender");
        (a, b)
    });
    let (mut a, mut b) = sent;
    let stats = a.stats();
    assert_eq!(
        (stats.tiers.promotions, stats.send_tier),
        (1, 1),
        "{stats:?}"
    );
    assert!(
        stats.frames_sent < 64 * 40 / 20,
        "most frames carried a whole batch: {stats:?}"
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    while a.stats().send_tier != 0 {
        assert!(
            Instant::now() < deadline,
            "never stepped down: {:?}",
            a.stats()
        );
        a.progress().expect("progress");
        b.progress().expect("progress");
    }
    assert_eq!(a.stats().tiers.demotions, 1);
}

#[test]
fn large_batches_move_to_a_larger_tier_over_loopback() {
    large_batches_move_to_a_larger_tier::<LoopbackProvider>();
}

#[test]
fn large_batches_move_to_a_larger_tier_over_shm() {
    large_batches_move_to_a_larger_tier::<ShmProvider>();
}
