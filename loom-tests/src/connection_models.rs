//! Models of the `transport` crate's connections, shared by the clean and the planted-bug
//! test binaries: the receive slots that delivered messages give back across threads.

use std::sync::Arc;
use std::time::Instant;

use loom::thread;
use tierbuf_pool::MemoryBudget;
use tierbuf_tiers::Reservoir;
use tierbuf_tiers::ladder::TierLadder;
use tierbuf_transport::connection::{Connection, ConnectionConfig, ConnectionCore};
use tierbuf_transport::{LoopbackEndpoint, LoopbackProvider, Provider};

/// Receives each side posts: the model's one tier has this many slots, enough for the
/// user to hold two messages zero-copy while the connection keeps its `MIN_POSTED` (3)
/// receives posted.
const RECEIVES: u64 = 5;

fn pair(budget: &MemoryBudget) -> (Connection<LoopbackEndpoint>, Connection<LoopbackEndpoint>) {
    let ladder = TierLadder::builder()
        .tier(64, RECEIVES as usize, 48)
        .build()
        .expect("a valid ladder");
    let provider = LoopbackProvider::new(budget.clone());
    let config = Arc::new(ConnectionConfig::new(Arc::new(ladder)).expect("a valid config"));
    let reservoir = Arc::new(Reservoir::new(
        provider.registrar(),
        Arc::clone(config.ladder()),
    ));
    let depth = config.queue_depth();
    let (a, b) = provider.pair(depth, depth).expect("a pair");
    let core = || {
        ConnectionCore::new(
            Arc::clone(&config),
            Arc::clone(&reservoir),
            Arc::clone(&reservoir),
            Instant::now(),
        )
        .expect("a core")
    };
    (
        Connection::new(core(), a).expect("a connection"),
        Connection::new(core(), b).expect("a connection"),
    )
}

/// Two delivered zero-copy messages are dropped at once, one on another thread and one
/// on the receiving connection's thread, which then makes progress on its own: it
/// reposts what came back so far and reports its counts. Whatever the interleaving, the
/// receiver never counts more receives than it has slots, every slot comes back exactly
/// once and is posted again, no give-back is lost from the count (it ends at zero lent),
/// and the sender ends holding a credit for every receive: none was lost.
pub fn returned_slots_across_threads() {
    let budget = MemoryBudget::with_cap(1 << 20);
    let (mut sender, mut receiver) = pair(&budget);
    sender.send(b"first").expect("send the first message");
    let first = receiver.recv().expect("the first message");
    assert!(first.is_zero_copy());
    sender.send(b"second").expect("send the second message");
    let second = receiver.recv().expect("the second message");
    assert!(second.is_zero_copy());
    let dropper = thread::spawn(move || {
        assert_eq!(&first[..], b"first");
        drop(first);
    });
    assert_eq!(&second[..], b"second");
    drop(second);
    receiver.progress().expect("progress");
    let during = receiver.stats();
    assert!(
        during.posted_receives + during.receives_lent <= RECEIVES,
        "more receives posted or lent than slots: {during:?}"
    );
    dropper.join().unwrap();
    receiver.progress().expect("progress");
    let after = receiver.stats();
    assert_eq!(
        after.receives_lent, 0,
        "the lent-slot count lost an update: {after:?}"
    );
    assert_eq!(
        after.posted_receives, RECEIVES,
        "a returned slot was not posted again: {after:?}"
    );
    sender.progress().expect("progress");
    assert_eq!(
        sender.stats().send_credits,
        RECEIVES,
        "the sender did not get a credit back for every receive"
    );
    drop((sender, receiver));
    assert_eq!(budget.in_use(), 0, "every registered byte back");
}
