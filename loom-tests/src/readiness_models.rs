//! Models of the `transport` crate's readiness layer (`connection::readiness`, its
//! `handshake.rs`), shared by the clean and the planted-bug test binaries: the async
//! connection's one spin at a time, and a connection table's sleeper against the wakers
//! that queue connections for it. (Its parkers are checked in the models of the loopback
//! pair and of the senders' queue, which arm them.)

use std::sync::Arc;

use loom::thread;
use tierbuf_transport::connection::ConnectionId;
use tierbuf_transport::connection::readiness::{SleepHandshake, SpinWord};

/// Two tasks of one process ask for the process's one spin at the same instant, with no
/// claim in force: at most one of them may spin. loom reports two claims granted.
pub fn one_spin_at_a_time() {
    let word = Arc::new(SpinWord::new());
    let other = {
        let word = Arc::clone(&word);
        thread::spawn(move || word.take(5, 10).is_some())
    };
    let mine = word.take(5, 10).is_some();
    let theirs = other.join().unwrap();
    assert!(!(mine && theirs), "two tasks spin at once");
    assert!(
        mine || theirs,
        "nobody spins although no claim was in force"
    );
}

/// A task gives up a claim that lapsed while another task takes the next one: once taken,
/// the next one must stay in force, so a third task finds it and does not spin. (The next
/// one may also be refused, when the give-up changes the word between its look and its
/// swap: that task parks instead of spinning, which costs a wake, not a wrong answer.)
/// loom reports a third claim granted while the second was in force.
pub fn giving_up_a_lapsed_claim_keeps_the_next() {
    let word = Arc::new(SpinWord::new());
    let lapsed = word.take(1, 10).expect("no claim in force");
    let next = {
        let word = Arc::clone(&word);
        thread::spawn(move || word.take(11, 20))
    };
    lapsed.give_up(&word);
    if next.join().unwrap().is_some() {
        assert!(
            word.take(12, 30).is_none(),
            "a lapsed claim given up cleared the claim in force"
        );
    }
}

/// A connection table's waker queues a connection while the table's sleeper (a waiter or
/// the progress thread) prepares to sleep: the sleeper must find the connection queued,
/// or the waker must ring its doorbell. loom reports a sleep with a connection queued and
/// no ring.
pub fn a_queued_connection_is_never_slept_through() {
    let handshake = Arc::new(SleepHandshake::new());
    let waker = {
        let handshake = Arc::clone(&handshake);
        thread::spawn(move || handshake.queue(ConnectionId::new(1)))
    };
    let sleeps = handshake.begin_sleep();
    let rang = waker.join().unwrap();
    assert!(
        !sleeps || rang,
        "the sleeper slept with a connection queued and no ring"
    );
    handshake.end_sleep();
    assert_eq!(handshake.pop(), Some(ConnectionId::new(1)));
}
