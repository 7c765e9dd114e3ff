//! How long an `AsyncConnection`'s task spins before it parks (feature `tokio`): a wait
//! spins only while spinning pays, and only one task of the process spins at a time (a
//! claim that lapses at the end of its spin, so a task that stops polling mid-spin does
//! not keep the others from spinning), so a service of many connections does not burn
//! the cores its peers need.
//!
//! A task spins by waking itself and returning `Pending`; it parks by returning `Pending`
//! with its wake left to the endpoint. The tests poll by hand with a waker that counts
//! its wakes, so each poll says which it did. Their own binary: the count of spinning
//! tasks is the process's.
#![cfg(feature = "tokio")]

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll, Wake, Waker};
use std::time::{Duration, Instant};

use futures_core::Stream;
use tierbuf_transport::connection::{AsyncConnection, Connection};
use tierbuf_transport::{Loopback, LoopbackEndpoint, Transport};

/// Counts its wakes.
#[derive(Default)]
struct Wakes(AtomicUsize);

impl Wake for Wakes {
    fn wake(self: Arc<Self>) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

/// An async connection to be polled by hand, and its peer.
struct Watched {
    connection: AsyncConnection<LoopbackEndpoint>,
    peer: Connection<LoopbackEndpoint>,
    wakes: Arc<Wakes>,
    waker: Waker,
}

/// What one poll of the stream did.
#[derive(Debug, PartialEq)]
enum Look {
    Received,
    Spun,
    Parked,
}

impl Watched {
    fn new(node: &Transport<Loopback>, name: &str) -> Watched {
        let listener = node.listen(name).expect("listen");
        let connection = node.connect(name).expect("connect");
        let peer = listener.accept().expect("accept");
        let wakes = Arc::new(Wakes::default());
        Watched {
            connection: AsyncConnection::new(connection).expect("in tokio"),
            peer,
            waker: Waker::from(Arc::clone(&wakes)),
            wakes,
        }
    }

    /// Polls the stream once; if it is pending, gives the runtime a turn (a spinning
    /// task yields as tokio's `yield_now` does, woken once the runtime has looked at
    /// its reactor) and tells a spin from a park by whether the waker was woken.
    async fn look(&mut self) -> Look {
        let before = self.wakes.0.load(Ordering::SeqCst);
        let mut cx = Context::from_waker(&self.waker);
        match Pin::new(&mut self.connection).poll_next(&mut cx) {
            Poll::Ready(received) => {
                received.expect("a message").expect("received");
                Look::Received
            }
            Poll::Pending => {
                tokio::task::yield_now().await;
                if self.wakes.0.load(Ordering::SeqCst) > before {
                    Look::Spun
                } else {
                    Look::Parked
                }
            }
        }
    }

    /// Looks until the task parks; how many looks spun first.
    async fn spin_until_parked(&mut self) -> usize {
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut spun = 0;
        loop {
            match self.look().await {
                Look::Spun => spun += 1,
                Look::Parked => return spun,
                Look::Received => panic!("nothing was sent"),
            }
            assert!(Instant::now() < deadline, "still spinning after 10 s");
        }
    }
}

#[tokio::test(flavor = "current_thread")]
async fn a_wait_spins_only_while_spinning_pays_and_one_task_at_a_time() {
    let node = Transport::loopback()
        .ladder_preset("rpc")
        .budget_bytes(32 << 20)
        .build()
        .expect("a loopback transport");
    // A fresh connection's wait spins; while it does, no other task of the process may.
    // The claim on the spin lapses at the spin's end, so a machine that stalls this
    // thread between the two looks may let the second spin too: tried until one pair of
    // looks lands within the spin.
    let mut one_at_a_time = false;
    for round in 0..100 {
        let mut spinning = Watched::new(&node, &format!("spinning-{round}"));
        let mut other = Watched::new(&node, &format!("other-{round}"));
        let (first_look, second_look) = (spinning.look().await, other.look().await);
        if (first_look, second_look) == (Look::Spun, Look::Parked) {
            one_at_a_time = true;
            break;
        }
    }
    assert!(
        one_at_a_time,
        "a second task spun beside the first in every round"
    );

    let mut first = Watched::new(&node, "first");
    first.spin_until_parked().await;

    // A wait that parked for longer than a spin lasts: the next wait parks at once.
    std::thread::sleep(Duration::from_millis(5));
    first.peer.send(b"late").expect("send");
    assert_eq!(first.look().await, Look::Received);
    assert_eq!(
        first.look().await,
        Look::Parked,
        "a spin would not have paid"
    );

    // A wait that ends soon after it parked brings the spin back (tried until one such
    // wait is seen, as a loaded machine may stretch any one of them).
    let mut spins_again = false;
    for _ in 0..1000 {
        first.peer.send(b"soon").expect("send");
        assert_eq!(first.look().await, Look::Received);
        match first.look().await {
            Look::Spun => {
                spins_again = true;
                break;
            }
            Look::Parked => {}
            Look::Received => panic!("one message was sent"),
        }
    }
    assert!(
        spins_again,
        "a wait ending within the spin never brought it back"
    );

    // A claim whose task stops polling mid-spin (its future dropped, say) lapses at the
    // spin's end: it keeps no other task from spinning after that.
    let mut kept = Vec::new();
    let mut abandoned_a_spin = false;
    for round in 0..100 {
        let mut abandoned = Watched::new(&node, &format!("abandoned-{round}"));
        abandoned_a_spin = abandoned.look().await == Look::Spun;
        // Kept open and never polled again.
        kept.push(abandoned);
        if abandoned_a_spin {
            break;
        }
    }
    assert!(abandoned_a_spin, "no fresh connection's wait spun");
    std::thread::sleep(Duration::from_millis(5));
    let mut next = Watched::new(&node, "next");
    assert_eq!(next.look().await, Look::Spun, "the abandoned claim lapsed");
}
