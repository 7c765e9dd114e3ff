//! `ConnectionTable` over the loopback provider: removing, clearing or dropping a table of
//! many connections returns every registered byte, promoted tiers included; connections
//! progress through the table's thread when their users never call `progress`; the
//! thread stops when asked and never waits on a user that holds a connection.

mod pairs;
mod traffic;

use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};
use traffic::pattern;

use crossbeam_utils::Backoff;
use tierbuf_pool::MemoryBudget;
use tierbuf_transport::connection::{
    Connection, ConnectionConfig, ConnectionTable, Message, ProgressConfig, SendError,
    SharedConnection, TableError,
};
use tierbuf_transport::{LoopbackEndpoint, LoopbackProvider};

type Shared = SharedConnection<LoopbackEndpoint>;

/// The three tiers ([`pairs::three_tiers`]), one spare region of each kept.
fn config() -> Arc<ConnectionConfig> {
    let ladder = pairs::three_tiers().reservoir_regions(1).build().unwrap();
    Arc::new(ConnectionConfig::new(Arc::new(ladder)).unwrap())
}

/// A connected pair with its own reservoir, which only the two cores keep.
fn pair(
    provider: &LoopbackProvider,
    config: &Arc<ConnectionConfig>,
) -> (Connection<LoopbackEndpoint>, Connection<LoopbackEndpoint>) {
    let shared = pairs::Shared::with_config(provider, Arc::clone(config));
    let (a, b) = provider.pair(32, 32).unwrap();
    (shared.connection(a), shared.connection(b))
}

/// Inserts `count` connected pairs into `table`.
fn insert_pairs(
    table: &ConnectionTable<LoopbackEndpoint>,
    provider: &LoopbackProvider,
    count: usize,
) -> Vec<(Shared, Shared)> {
    let config = config();
    (0..count)
        .map(|_| {
            let (a, b) = pair(provider, &config);
            (table.insert(a), table.insert(b))
        })
        .collect()
}

/// Waits for `condition`, yielding; fails the test if it does not hold within a minute
/// (a guard against hanging, not a measurement).
fn wait_until(what: &str, mut condition: impl FnMut() -> bool) {
    let give_up = Instant::now() + Duration::from_secs(60);
    while !condition() {
        assert!(Instant::now() < give_up, "gave up waiting: {what}");
        thread::yield_now();
    }
}

/// Offers `message` through `try_send` until it is accepted, never calling `progress`;
/// backs off between tries so that the progress thread finds the connection unlocked.
fn try_send_until_accepted(connection: &Shared, message: &[u8]) {
    let backoff = Backoff::new();
    loop {
        // The guard goes before the back-off: a user that spins holding its connection
        // keeps the progress thread out of it.
        let offered = connection.lock().unwrap().try_send(message);
        match offered {
            Ok(()) => return,
            Err(SendError::WouldBlock(_)) => backoff.snooze(),
            Err(other) => panic!("try_send failed: {other}"),
        }
    }
}

/// Takes the next delivered message, never calling `progress`.
fn next_message(connection: &Shared) -> Message {
    let backoff = Backoff::new();
    loop {
        let delivered = connection.lock().unwrap().next_delivered();
        if let Some(message) = delivered {
            return message;
        }
        backoff.snooze();
    }
}

/// Sends `message` on `from` and takes it on `to`, both driven by the table's thread.
fn exchange(from: &Shared, to: &Shared, message: &[u8]) {
    try_send_until_accepted(from, message);
    let received = next_message(to);
    assert!(received[..] == message[..], "the message differs");
}

#[test]
fn dropping_a_table_of_many_connections_returns_every_byte_promoted_tiers_included() {
    let budget = MemoryBudget::with_cap(256 << 20);
    let provider = LoopbackProvider::new(budget.clone());
    let table = ConnectionTable::with_progress_thread(ProgressConfig::default()).unwrap();
    let pairs = insert_pairs(&table, &provider, 32);
    assert_eq!(table.len(), 64);
    let on_tier_zero = budget.in_use();
    // Every fourth pair is promoted to tier 1 and every eighth to tier 2, both ways.
    for (index, (a, b)) in pairs.iter().enumerate().step_by(4) {
        let len = if index % 8 == 0 { 30_000 } else { 3_000 };
        exchange(a, b, &pattern(len, index as u64));
        exchange(b, a, &pattern(len, index as u64 + 1));
        // The promotions land after the messages that asked for them.
        wait_until("both ends promoted", || {
            a.lock().unwrap().stats().send_tier >= 1 && b.lock().unwrap().stats().send_tier >= 1
        });
    }
    assert!(
        budget.in_use() > on_tier_zero,
        "the promoted tiers are registered"
    );
    drop(table);
    assert_eq!(budget.in_use(), 0, "every registered byte back");
    for (a, _) in &pairs {
        assert!(matches!(a.lock(), Err(TableError::Closed { id }) if id == a.id()));
    }
}

#[test]
fn removing_and_clearing_return_every_byte_and_a_held_message_keeps_only_its_slot() {
    let budget = MemoryBudget::with_cap(256 << 20);
    let provider = LoopbackProvider::new(budget.clone());
    let table = ConnectionTable::new();
    let pairs = insert_pairs(&table, &provider, 16);
    // Without a progress thread, sweeps by hand drive both sides.
    let (a, b) = &pairs[0];
    let promoted = pattern(3_000, 7);
    // The first goes in segments and its promotion lands after it; the second lands whole
    // in a receive slot of the promoted tier.
    let exchange = || {
        loop {
            table.sweep();
            match a.lock().unwrap().try_send(&promoted) {
                Ok(_) => break,
                Err(SendError::WouldBlock(_)) => {}
                Err(other) => panic!("try_send failed: {other}"),
            }
        }
        loop {
            table.sweep();
            if let Some(message) = b.lock().unwrap().next_delivered() {
                break message;
            }
        }
    };
    assert!(!exchange().is_zero_copy());
    wait_until("promoted", || {
        table.sweep();
        a.lock().unwrap().stats().send_tier >= 1
    });
    let held = exchange();
    assert!(held.is_zero_copy() && held[..] == promoted[..]);

    let (c, d) = &pairs[1];
    let one_pair =
        c.lock().unwrap().stats().registered_bytes + d.lock().unwrap().stats().registered_bytes;
    let before = budget.in_use();
    assert!(table.remove(c.id()) && table.remove(d.id()));
    assert!(!table.remove(c.id()), "already removed");
    assert!(table.get(d.id()).is_none());
    assert!(matches!(d.lock(), Err(TableError::Closed { .. })));
    // Their reservoir goes too, with any spare regions it kept.
    assert!(budget.in_use() <= before - one_pair);

    table.clear();
    assert!(table.is_empty());
    assert!(
        budget.in_use() > 0,
        "the held message's receive tier stays registered"
    );
    drop(held);
    assert_eq!(budget.in_use(), 0, "every registered byte back");
}

#[test]
fn a_sender_that_never_calls_progress_gets_everything_delivered_in_order() {
    let budget = MemoryBudget::with_cap(256 << 20);
    let provider = LoopbackProvider::new(budget.clone());
    let table = ConnectionTable::with_progress_thread(ProgressConfig::default()).unwrap();
    let (sender, receiver) = insert_pairs(&table, &provider, 1).remove(0);
    // Small, tier-1, tier-2 and segmented (past the top tier) sizes, in a fixed order.
    let sizes: Vec<usize> = (0..300)
        .map(|index| match index % 10 {
            3 => 1_000 + index * 7,
            6 => 20_000 + index * 31,
            9 => 70_000 + index * 101,
            _ => index % 240,
        })
        .collect();
    let expected = sizes.clone();
    let reader = thread::spawn(move || {
        for (index, &len) in expected.iter().enumerate() {
            let message = next_message(&receiver);
            assert_eq!(message.len(), len, "message {index}");
            assert!(
                message[..] == pattern(len, index as u64)[..],
                "message {index} differs"
            );
        }
        receiver
    });
    for (index, &len) in sizes.iter().enumerate() {
        try_send_until_accepted(&sender, &pattern(len, index as u64));
    }
    let receiver = reader.join().unwrap();
    let sent = sender.lock().unwrap().stats();
    // Promoted past tier 1: to tier 2 at once, or through tier 1 when its promotion
    // landed before the first message past it.
    assert!(
        sent.tiers.promotions >= 1 && sent.send_tier >= 2,
        "{sent:?}"
    );
    assert_eq!(sent.messages_sent, 300);
    assert_eq!(receiver.lock().unwrap().stats().messages_received, 300);
    assert!(table.progress_stats().progressed > 0);
    drop(table);
    assert_eq!(budget.in_use(), 0);
}

#[test]
fn shutdown_joins_the_progress_thread_and_leaves_the_connections_to_their_users() {
    let budget = MemoryBudget::with_cap(64 << 20);
    let provider = LoopbackProvider::new(budget.clone());
    let mut table = ConnectionTable::with_progress_thread(ProgressConfig::default()).unwrap();
    let (a, b) = insert_pairs(&table, &provider, 1).remove(0);
    exchange(&a, &b, b"through the progress thread");
    table.shutdown().unwrap();
    assert!(!table.has_progress_thread());
    let stopped = table.progress_stats();
    assert!(stopped.progressed > 0);
    // The users drive the connections now; the joined thread looks at them no more.
    a.lock().unwrap().send(b"by the users").unwrap();
    let message = b.lock().unwrap().recv().unwrap();
    assert_eq!(&message[..], b"by the users");
    assert_eq!(table.progress_stats(), stopped);
    table.shutdown().unwrap();
    drop((message, table));
    assert_eq!(budget.in_use(), 0);
}

#[test]
fn the_progress_thread_passes_over_a_connection_its_user_holds_and_serves_the_others() {
    let budget = MemoryBudget::with_cap(64 << 20);
    let provider = LoopbackProvider::new(budget.clone());
    let table = ConnectionTable::with_progress_thread(ProgressConfig::default()).unwrap();
    let mut pairs = insert_pairs(&table, &provider, 2);
    let (c, d) = pairs.pop().unwrap();
    let (a, b) = pairs.pop().unwrap();
    let held = a.lock().unwrap();
    let before = table.progress_stats();
    // A message for `a` wakes the thread, which finds `a` held and comes back to it after
    // each polling sleep.
    try_send_until_accepted(&b, b"while held");
    // While `a` is held, the other pair still gets its messages through the thread.
    for round in 0..20u64 {
        exchange(&c, &d, &pattern(100, round));
    }
    wait_until(
        "the thread to find the held connection held ten times",
        || table.progress_stats().skipped_busy >= before.skipped_busy + 10,
    );
    assert_eq!(held.stats().messages_received, 0, "nothing moved `a`");
    drop(held);
    // Released, it is looked at and works through the thread.
    assert_eq!(&next_message(&a)[..], b"while held");
    exchange(&a, &b, b"after the release");
    // Nothing is held any more: no look finds a connection held.
    let settled = table.progress_stats();
    thread::sleep(Duration::from_millis(50));
    assert_eq!(table.progress_stats().skipped_busy, settled.skipped_busy);
}
