//! `Connection` end to end over the loopback provider, each side on its own thread:
//! random sizes across promotions and segmentation arrive once, in order, byte for byte;
//! every registered byte comes back; a peer that vanishes mid-promotion is reported.

mod pairs;
mod traffic;

use pairs::Shared;
use std::sync::Arc;
use std::time::{Duration, Instant};
use traffic::{pattern, sizes};

use tierbuf_pool::MemoryBudget;
use tierbuf_tiers::ladder::TierLadder;
use tierbuf_transport::connection::{
    ConfigError, Connection, ConnectionConfig, ConnectionError, DataPath, Fault, SendError,
};
use tierbuf_transport::{LoopbackEndpoint, LoopbackProvider};

fn ladder() -> Arc<TierLadder> {
    Arc::new(pairs::three_tiers().reservoir_regions(1).build().unwrap())
}

fn pair(budget: &MemoryBudget) -> (Connection<LoopbackEndpoint>, Connection<LoopbackEndpoint>) {
    pair_on(budget, DataPath::default())
}

/// [`pair`], its messages too large for the tier in force sent as `data_path` says.
fn pair_on(
    budget: &MemoryBudget,
    data_path: DataPath,
) -> (Connection<LoopbackEndpoint>, Connection<LoopbackEndpoint>) {
    let provider = LoopbackProvider::new(budget.clone());
    let config = ConnectionConfig::new(ladder())
        .unwrap()
        .with_data_path(data_path);
    let shared = Shared::with_config(&provider, Arc::new(config));
    let (a, b) = provider.pair(32, 32).unwrap();
    (shared.connection(a), shared.connection(b))
}

/// Receives on a thread of its own a message of each of `sizes`, in order, and checks
/// each against `pattern(len, index)` (and, with `zero_copy`, that it was not copied);
/// hands the connection back.
fn check_on_another_thread(
    mut receiver: Connection<LoopbackEndpoint>,
    sizes: Vec<usize>,
    zero_copy: bool,
) -> std::thread::JoinHandle<Connection<LoopbackEndpoint>> {
    std::thread::spawn(move || {
        for (index, &len) in sizes.iter().enumerate() {
            let message = receiver.recv().expect("a message");
            assert_eq!(message.len(), len, "message {index}");
            assert!(
                message[..] == pattern(len, index as u64)[..],
                "message {index} differs"
            );
            assert!(
                !zero_copy || message.is_zero_copy(),
                "message {index} was copied"
            );
        }
        receiver
    })
}

#[test]
fn random_sizes_across_promotions_arrive_once_in_order_from_another_thread() {
    for data_path in [DataPath::OneSided, DataPath::TwoSided] {
        random_sizes_from_another_thread(data_path);
    }
}

fn random_sizes_from_another_thread(data_path: DataPath) {
    let budget = MemoryBudget::with_cap(64 << 20);
    let (mut sender, receiver) = pair_on(&budget, data_path);
    let sizes = sizes(400, 65536);
    let reader = check_on_another_thread(receiver, sizes.clone(), false);
    for (index, &len) in sizes.iter().enumerate() {
        sender.send(&pattern(len, index as u64)).expect("send");
    }
    sender.flush().unwrap();
    let receiver = reader.join().unwrap();
    let stats = sender.stats();
    assert!(stats.tiers.promotions >= 1, "{stats:?}");
    assert_eq!(stats.messages_sent, 400);
    // Sizes up to four times the top tier: on the one-sided path those past it are read
    // by the peer, and the others wait for no promotion in segments.
    let exposed = stats.messages_exposed;
    match data_path {
        DataPath::TwoSided => assert_eq!(exposed, 0, "{stats:?}"),
        _ => assert!(exposed > 0, "{stats:?}"),
    }
    assert_eq!(receiver.stats().messages_received, 400);
    drop((sender, receiver));
    assert_eq!(
        budget.in_use(),
        0,
        "every registered byte back, spares included"
    );
}

#[test]
fn a_peer_that_vanishes_mid_promotion_is_reported() {
    let budget = MemoryBudget::with_cap(64 << 20);
    let (mut sender, receiver) = pair(&budget);
    sender.send(b"hello").unwrap();
    let big = pattern(10_000, 1);
    let first = sender.try_send(&big);
    first.expect("taken at once, in segments");
    drop(receiver);
    let deadline = Instant::now() + Duration::from_secs(10);
    let outcome = loop {
        match sender.send(&big) {
            Err(SendError::Failed(error)) => break error,
            Ok(()) => {
                if let Err(error) = sender.flush() {
                    break error;
                }
            }
            Err(other) => panic!("unexpected {other}"),
        }
        assert!(
            Instant::now() < deadline,
            "the vanished peer was never reported"
        );
    };
    assert!(
        matches!(*outcome, ConnectionError::PeerClosed),
        "{outcome:?}"
    );
    assert_eq!(outcome.fault(), Fault::Peer);
    drop(sender);
}

#[test]
fn messages_built_in_place_arrive_once_in_order_across_promotions() {
    let budget = MemoryBudget::with_cap(64 << 20);
    let (mut sender, receiver) = pair(&budget);
    // Up to the top tier's frame payload: its 65536-byte slots less the 16-byte header.
    let sizes: Vec<usize> = sizes(300, 65520)
        .into_iter()
        .map(|len| len % 65521)
        .collect();
    let reader = check_on_another_thread(receiver, sizes.clone(), true);
    for (index, &len) in sizes.iter().enumerate() {
        let mut buffer = sender.reserve(len).expect("reserve");
        assert_eq!(buffer.len(), len);
        buffer.copy_from_slice(&pattern(len, index as u64));
        buffer.send().expect("send");
    }
    sender.flush().unwrap();
    let receiver = reader.join().unwrap();
    let stats = sender.stats();
    assert!(stats.tiers.promotions >= 1, "{stats:?}");
    assert_eq!(stats.messages_sent, 300);
    assert_eq!(receiver.stats().messages_received, 300);
    drop((sender, receiver));
    assert_eq!(budget.in_use(), 0, "every registered byte back");
}

#[test]
fn a_buffer_dropped_unsent_sends_nothing_and_one_past_the_top_frame_is_refused() {
    let budget = MemoryBudget::with_cap(64 << 20);
    let (mut sender, mut receiver) = pair(&budget);
    let mut buffer = sender.reserve(100).expect("reserve");
    buffer.fill(0xAA);
    drop(buffer);
    let refused = sender.try_reserve(65521).map(drop);
    assert!(
        matches!(
            refused,
            Err(SendError::BeyondOneFrame {
                len: 65521,
                max: 65520
            })
        ),
        "{refused:?}"
    );
    sender.send(b"after").unwrap();
    assert_eq!(&receiver.recv().unwrap()[..], b"after");
    assert_eq!(sender.stats().messages_sent, 1);
    drop((sender, receiver));
    assert_eq!(budget.in_use(), 0);
}

#[test]
fn an_endpoint_shallower_than_the_ladder_needs_is_refused_with_the_depth_needed() {
    let provider = LoopbackProvider::new(MemoryBudget::with_cap(64 << 20));
    let shared = Shared::new(&provider, ladder());
    assert_eq!(
        shared.config.queue_depth(),
        16,
        "8 + 8: the two largest slot counts"
    );
    let (shallow, _peer) = provider.pair(32, 8).unwrap();
    let error = Connection::new(shared.core(), shallow).unwrap_err();
    assert!(
        matches!(
            error,
            ConfigError::QueueTooShallow {
                depth: 8,
                needed: 16,
                ..
            }
        ),
        "{error:?}"
    );
    assert_eq!(error.fault(), Fault::Caller);
}

#[test]
fn a_send_after_the_peer_closed_reports_it_instead_of_losing_the_message() {
    let budget = MemoryBudget::with_cap(64 << 20);
    let (mut sender, receiver) = pair(&budget);
    sender.send(b"before").unwrap();
    drop(receiver);
    let error = sender.send(b"after").unwrap_err();
    let SendError::Failed(error) = error else {
        panic!("expected the connection's failure, got {error:?}");
    };
    assert!(matches!(*error, ConnectionError::PeerClosed), "{error:?}");
    assert!(
        sender.send(&pattern(10_000, 1)).is_err(),
        "and every send after it"
    );
}

/// A peer that sends, flushes and closes before this side reads: every message it sent
/// is delivered, then the close. A message segmented while its promotion was asked for
/// was lost: the close was found (a send of this side's flushed by it) before the
/// completions of the receives its segments landed in, and those were dropped. Segments
/// only: a message exposed for reading needs this side to read it before the sender's
/// flush returns (the next test).
#[test]
fn every_message_flushed_before_the_peer_closed_is_delivered_before_the_close() {
    let budget = MemoryBudget::with_cap(64 << 20);
    // As many as the receives posted on tier 0 hold: this side reads only after the close.
    for lens in [&[100][..], &[1000], &[100, 1000], &[1000, 100]] {
        let (mut sender, mut receiver) = pair_on(&budget, DataPath::TwoSided);
        let messages: Vec<Vec<u8>> = lens.iter().map(|&len| pattern(len, len as u64)).collect();
        for message in &messages {
            sender.send(message).unwrap();
        }
        sender.flush().unwrap();
        drop(sender);
        for (index, message) in messages.iter().enumerate() {
            let received = receiver
                .recv()
                .unwrap_or_else(|error| panic!("{lens:?}: message {index}: {error}"));
            assert!(received[..] == message[..], "{lens:?}: message {index}");
        }
        let error = receiver.recv().unwrap_err();
        assert!(matches!(*error, ConnectionError::PeerClosed), "{error:?}");
    }
}

/// On the one-sided data path a sender's flush returns once the peer has read every
/// message it exposed: a sender that flushes and closes loses nothing to a receiver that
/// reads on its own thread, however large its messages.
#[test]
fn a_flush_waits_for_the_peer_to_read_what_was_exposed_so_a_close_loses_nothing() {
    let budget = MemoryBudget::with_cap(64 << 20);
    let (mut sender, receiver) = pair_on(&budget, DataPath::OneSided);
    let sizes = [100, 300_000, 5000, 1 << 20, 40];
    let reader = std::thread::spawn(move || {
        let mut receiver = receiver;
        let mut got = Vec::new();
        loop {
            match receiver.recv() {
                Ok(message) => got.push(message.to_vec()),
                Err(error) => {
                    assert!(matches!(*error, ConnectionError::PeerClosed), "{error:?}");
                    return (got, receiver.stats());
                }
            }
        }
    });
    for (index, &len) in sizes.iter().enumerate() {
        sender.send(&pattern(len, index as u64)).unwrap();
    }
    sender.flush().unwrap();
    let exposed = sender.stats().messages_exposed;
    drop(sender);
    let (got, stats) = reader.join().unwrap();
    let expected: Vec<Vec<u8>> = sizes
        .iter()
        .enumerate()
        .map(|(index, &len)| pattern(len, index as u64))
        .collect();
    assert!(got == expected, "every message, in order, before the close");
    assert!(exposed >= 2 && stats.messages_read == exposed, "{stats:?}");
}
