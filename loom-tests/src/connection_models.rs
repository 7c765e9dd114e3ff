//! Models of the `transport` crate's connections, shared by the clean and the planted-bug
//! test binaries: the receive slots that delivered messages give back across threads,
//! a sender's queue across a tier swap, and a flush against the senders that queue
//! before it. The readiness layer's models are in `readiness_models`.

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
    crate::harness::on_deep_stack(returned_slots_on_a_deep_stack);
}

fn returned_slots_on_a_deep_stack() {
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

/// A sender on another thread takes a send slot through the send region's lock-free
/// cache while the connection's thread swaps the region's tier, writes its message into
/// the slot and queues it; the connection's thread parks on the queue and looks. Whatever
/// the interleaving: if the connection's thread found nothing queued after parking, the
/// sender's push woke it; the slot it pops holds the sender's message, on whichever tier;
/// and the tier the sender took it from is not reclaimed while the slot is queued.
pub fn a_sender_queues_a_filled_slot_across_a_tier_swap() {
    use std::task::{Wake, Waker};

    use loom::sync::atomic::{AtomicBool, Ordering};
    use tierbuf_tiers::{TierIndex, TieredRegion};
    use tierbuf_transport::connection::senders::SendQueue;

    struct Flag(AtomicBool);
    impl Wake for Flag {
        fn wake(self: std::sync::Arc<Self>) {
            self.0.store(true, Ordering::SeqCst);
        }
    }

    let budget = MemoryBudget::with_cap(1 << 20);
    let provider = LoopbackProvider::new(budget.clone());
    let ladder = TierLadder::builder()
        .tier(64, 3, 48)
        .tier(128, 3, 112)
        .build()
        .expect("a valid ladder");
    let reservoir = Arc::new(Reservoir::new(provider.registrar(), Arc::new(ladder)));
    let region = TieredRegion::new(reservoir).expect("the first tier");
    let queue = Arc::new(SendQueue::new(2));
    let sender = {
        let queue = Arc::clone(&queue);
        let mut slots = region.owned_cache();
        thread::spawn(move || {
            let mut slot = slots.try_acquire().expect("a free slot");
            slot[..4].copy_from_slice(b"sent");
            assert!(queue.push(slot).is_ok(), "room in the queue");
        })
    };
    let mut change = region.begin_change(TierIndex::new(1)).expect("a change");
    change.provision().expect("the new tier");
    change.install(false).expect("installed");
    let flag = std::sync::Arc::new(Flag(AtomicBool::new(false)));
    let waker = Waker::from(std::sync::Arc::clone(&flag));
    let parked = queue.arm(&waker) == tierbuf_transport::Armed::Parked;
    let found = queue.pop();
    sender.join().unwrap();
    if parked && found.is_none() {
        assert!(
            flag.0.load(Ordering::SeqCst),
            "the connection's thread parked, found nothing, and the sender did not wake it"
        );
    }
    queue.disarm();
    let slot = found.or_else(|| queue.pop()).expect("the queued slot");
    region.reclaim();
    assert_eq!(&slot[..4], b"sent", "the slot holds the sender's message");
    drop(slot);
    region.reclaim();
}

/// A flush counts the messages its connection's senders queued before it
/// (`SendQueue::accepted`) and waits until that many are taken off the queue
/// (`Connection::flush`). One sender queues a message while another, on the flushing
/// thread, queues its own and then flushes: whatever the interleaving, the flushing
/// thread's message is among those the flush takes, since it was queued before the flush
/// began. loom reports the flush stopping short of it.
pub fn a_flush_takes_every_message_queued_before_it() {
    use tierbuf_transport::connection::senders::SendQueue;

    let queue = Arc::new(SendQueue::new(4));
    let other = {
        let queue = Arc::clone(&queue);
        thread::spawn(move || assert!(queue.push(2u32).is_ok(), "room in the queue"))
    };
    assert!(queue.push(1u32).is_ok(), "room in the queue");
    let counted = queue.accepted();
    let mut taken = Vec::new();
    while (taken.len() as u64) < counted {
        match queue.pop() {
            Some(message) => taken.push(message),
            None => thread::yield_now(),
        }
    }
    assert!(
        taken.contains(&1),
        "the flush stopped short of the message queued before it: took {taken:?} of {counted}"
    );
    other.join().unwrap();
}
