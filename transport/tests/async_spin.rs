//! How long an `AsyncConnection`'s task spins before it parks (feature `tokio`): a wait
//! spins only while spinning pays, and only one task of the process spins at a time, so
//! a service of many connections does not burn the cores its peers need.
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
    let mut first = Watched::new(&node, "first");
    let mut second = Watched::new(&node, "second");

    // A fresh connection's wait spins; while it does, no other task of the process may.
    assert_eq!(first.look().await, Look::Spun, "a first wait spins");
    assert_eq!(
        second.look().await,
        Look::Parked,
        "one task spins at a time"
    );
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
}
