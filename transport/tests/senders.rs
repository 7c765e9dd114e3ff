//! `Sender`s: many threads sending on one connection through the tier's lock-free slots,
//! while the connection's own thread sleeps until they queue something, with tier changes
//! under them; over loopback and shared memory, and over verbs where
//! `TIERBUF_VERBS_DEVICE` names a device.

mod pairs;

use std::io::IoSlice;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use tierbuf_transport::connection::{ConnectionError, SendError, WouldBlock};
use tierbuf_transport::{LoopbackProvider, ShmProvider};

use pairs::{PairProvider, connections, demoting_ladder};

/// Long enough that only a lost wake runs into it.
const BOUND: Duration = Duration::from_secs(60);

/// Worker `worker`'s message `index`: mostly small, every tenth past the smallest tier
/// (a promotion), every fiftieth past the largest (segmented).
fn message(worker: u8, index: u32) -> Vec<u8> {
    let len = match index % 50 {
        49 => 20_000,
        n if n % 10 == 9 => 3000,
        n => 8 + n as usize,
    };
    let mut bytes = vec![worker; len];
    bytes[..4].copy_from_slice(&index.to_le_bytes());
    bytes
}

fn workers_send_in_order_while_the_connection_sleeps_between<P: PairProvider>() {
    const WORKERS: u8 = 4;
    const MESSAGES: u32 = 300;
    let provider = P::make();
    let (mut driven, mut receiving) =
        connections(&provider, demoting_ladder(Duration::from_millis(5)));
    let workers: Vec<_> = (0..WORKERS)
        .map(|worker| {
            let mut sender = driven.sender();
            thread::spawn(move || {
                for index in 0..MESSAGES {
                    sender.send(&message(worker, index)).unwrap();
                    if index % 64 == 63 {
                        // Long enough for the tier to be demoted under the senders.
                        thread::sleep(Duration::from_millis(10));
                    }
                }
            })
        })
        .collect();
    // The connection's thread only waits for messages, which never come to it: it wakes
    // for what its senders queue, posts it, and sleeps again.
    let driving = thread::spawn(move || {
        let deadline = Instant::now() + BOUND;
        while Instant::now() < deadline {
            match driven.recv_deadline(Instant::now() + Duration::from_millis(50)) {
                Ok(None) => {}
                Ok(Some(_)) => panic!("nothing is sent this way"),
                Err(error) if matches!(*error, ConnectionError::PeerClosed) => return driven,
                Err(error) => panic!("{error}"),
            }
        }
        panic!("the receiver never closed: {:?}", driven.stats());
    });
    let mut next = [0u32; WORKERS as usize];
    let deadline = Instant::now() + BOUND;
    for _ in 0..u32::from(WORKERS) * MESSAGES {
        let received = receiving
            .recv_deadline(deadline)
            .unwrap()
            .unwrap_or_else(|| panic!("messages lost: {next:?} came, {:?}", receiving.stats()));
        let worker = received[received.len() - 1];
        let index = next[worker as usize];
        assert!(
            received[..] == message(worker, index)[..],
            "worker {worker}'s message {index} is not the one that came"
        );
        next[worker as usize] += 1;
    }
    for worker in workers {
        worker.join().unwrap();
    }
    let stats = receiving.stats();
    assert!(stats.messages_received >= u64::from(WORKERS) * u64::from(MESSAGES));
    drop(receiving);
    let driven = driving.join().unwrap();
    let stats = driven.stats();
    assert!(
        stats.tiers.promotions > 0,
        "the tier changed under the senders: {stats:?}"
    );
}

fn a_full_queue_refuses_and_a_closed_connection_fails_its_senders<P: PairProvider>() {
    let provider = P::make();
    let (mut connection, peer) = connections(&provider, demoting_ladder(Duration::from_secs(60)));
    let mut sender = connection.sender();
    // Nobody drives the connection: the queue fills.
    let mut queued = 0;
    let refused = loop {
        match sender.try_send(b"queued") {
            Ok(()) => queued += 1,
            Err(error) => break error,
        }
        assert!(queued < 100_000, "the queue never filled");
    };
    assert!(
        matches!(refused, SendError::WouldBlock(WouldBlock::SendersQueueFull)),
        "{refused:?}"
    );
    // Nobody drives the connection: a deadline is the way out of a full queue, and
    // nothing of the message was queued.
    let deadline = Instant::now() + Duration::from_millis(20);
    let timed_out = sender.send_deadline(b"waits", deadline).unwrap_err();
    assert!(Instant::now() >= deadline);
    assert!(
        matches!(timed_out, SendError::TimedOut(WouldBlock::SendersQueueFull)),
        "{timed_out:?}"
    );
    let gathered = [IoSlice::new(b"gath"), IoSlice::new(b"ered")];
    assert!(matches!(
        sender.try_send_gather(&gathered),
        Err(SendError::WouldBlock(WouldBlock::SendersQueueFull))
    ));
    // Driven, the connection takes the queue; the gathered message then goes as one, and
    // the timed-out one never arrives.
    let mut peer = peer;
    let mut take = |count: usize, connection: &mut tierbuf_transport::connection::Connection<_>| {
        let mut received = Vec::new();
        let deadline = Instant::now() + BOUND;
        while received.len() < count {
            assert!(Instant::now() < deadline, "the queued messages never came");
            connection.progress().unwrap();
            if let Some(message) = peer.try_recv().unwrap() {
                received.push(message.to_vec());
            }
        }
        received
    };
    assert!(take(queued, &mut connection).iter().all(|m| m == b"queued"));
    sender.send_gather(&gathered).unwrap();
    assert_eq!(take(1, &mut connection), [b"gathered".to_vec()]);
    drop(connection);
    let error = sender.send(b"late").unwrap_err();
    assert!(matches!(error, SendError::Failed(_)), "{error:?}");
    drop(peer);
}

fn small_messages_queued_together_share_frames<P: PairProvider>() {
    let provider = P::make();
    let (mut driven, mut receiving) =
        connections(&provider, demoting_ladder(Duration::from_secs(60)));
    let mut sender = driven.sender();
    // Small ones around one past the smallest tier, which goes alone (through a
    // promotion) and keeps its place.
    let messages: Vec<Vec<u8>> = (0..30u32)
        .map(|index| {
            let len = if index == 12 {
                3000
            } else {
                8 + index as usize
            };
            let mut bytes = vec![index as u8; len];
            bytes[..4].copy_from_slice(&index.to_le_bytes());
            bytes
        })
        .collect();
    // Nobody drives the connection while they are queued: they wait together.
    for message in &messages {
        sender.try_send(message).unwrap();
    }
    let deadline = Instant::now() + BOUND;
    let mut next = 0;
    while next < messages.len() {
        assert!(
            Instant::now() < deadline,
            "{next} came: {:?}",
            driven.stats()
        );
        driven.progress().unwrap();
        if let Some(received) = receiving.try_recv().unwrap() {
            assert!(
                received[..] == messages[next][..],
                "message {next} is not the one that came"
            );
            next += 1;
        }
    }
    let stats = driven.stats();
    assert!(
        stats.messages_packed >= 20,
        "the small messages waiting together shared frames: {stats:?}"
    );
    assert_eq!(receiving.stats().messages_received, messages.len() as u64);
}

fn flush_posts_what_the_senders_queued<P: PairProvider>() {
    let provider = P::make();
    let (mut driven, mut receiving) =
        connections(&provider, demoting_ladder(Duration::from_secs(60)));
    let mut sender = driven.sender();
    for index in 0..10u8 {
        sender.try_send(&[index; 16]).unwrap();
    }
    // Nothing was posted yet: the flush must post what the senders queued, not find the
    // connection idle and return.
    driven.flush().unwrap();
    for index in 0..10u8 {
        let received = receiving
            .recv_deadline(Instant::now() + BOUND)
            .unwrap()
            .unwrap_or_else(|| panic!("message {index} never came: {:?}", driven.stats()));
        assert_eq!(received[..], [index; 16]);
    }
}

fn a_flush_ends_while_other_senders_go_on_queueing<P: PairProvider>() {
    let provider = P::make();
    let (mut driven, mut receiving) =
        connections(&provider, demoting_ladder(Duration::from_secs(60)));
    // The peer reads everything, a little more slowly than the producer below queues.
    let reader = thread::spawn(move || {
        let mut received = 0u64;
        loop {
            match receiving.recv_deadline(Instant::now() + BOUND) {
                Ok(Some(_)) => {
                    received += 1;
                    thread::sleep(Duration::from_micros(20));
                }
                Ok(None) => return Err(format!("{received} came, then none for {BOUND:?}")),
                Err(error) if matches!(*error, ConnectionError::PeerClosed) => return Ok(received),
                Err(error) => {
                    return Err(format!(
                        "{received} came, then {error:?}: {:?}",
                        receiving.stats()
                    ));
                }
            }
        }
    });
    let mut busy = driven.sender();
    let producing = Arc::new(AtomicU64::new(0));
    let producer = thread::spawn({
        let producing = Arc::clone(&producing);
        move || {
            while busy.send(&[1; 16]).is_ok() {
                producing.fetch_add(1, Ordering::Relaxed);
            }
            producing.load(Ordering::Relaxed)
        }
    });
    let deadline = Instant::now() + BOUND;
    while producing.load(Ordering::Relaxed) < 4 {
        assert!(Instant::now() < deadline, "the producer never queued");
        thread::yield_now();
    }
    let mut sender = driven.sender();
    let mut queued = 0;
    while queued < 10 {
        assert!(Instant::now() < deadline, "{queued} queued");
        match sender.try_send(&[2; 16]) {
            Ok(()) => queued += 1,
            Err(SendError::WouldBlock(_)) => driven.progress().unwrap(),
            Err(error) => panic!("{error}"),
        }
    }
    // A flush waits for what was queued before it, not for the producer to stop.
    let ended = driven.flush_deadline(Instant::now() + BOUND).unwrap();
    assert!(ended, "the flush ended: {:?}", driven.stats());
    drop(driven);
    let produced = producer.join().unwrap();
    let received = reader.join().unwrap().unwrap();
    assert!(
        received >= 10 + 4 && produced >= 4,
        "{received} received, {produced} queued by the producer"
    );
}

macro_rules! on_each_provider {
    ($($test:ident),* $(,)?) => {
        mod loopback {
            use super::*;
            $(#[test] fn $test() { super::$test::<LoopbackProvider>(); })*
        }
        mod shm {
            use super::*;
            $(#[test] fn $test() { super::$test::<ShmProvider>(); })*
        }
        /// Where `TIERBUF_VERBS_DEVICE` names a device (`.ci/verbs-rxe` runs them on
        /// soft-RoCE).
        #[cfg(feature = "verbs")]
        mod verbs {
            use super::*;
            $(#[test] fn $test() {
                if pairs::skipped_without_a_verbs_device() {
                    return;
                }
                super::$test::<tierbuf_transport::verbs::VerbsProvider>();
            })*
        }
    };
}

on_each_provider!(
    a_flush_ends_while_other_senders_go_on_queueing,
    flush_posts_what_the_senders_queued,
    small_messages_queued_together_share_frames,
    workers_send_in_order_while_the_connection_sleeps_between,
    a_full_queue_refuses_and_a_closed_connection_fails_its_senders,
);
