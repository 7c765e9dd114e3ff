//! An `AsyncConnection` over an endpoint that cannot wake anybody (feature `tokio`;
//! `Readiness::Polling`, as verbs' is): its task sleeps between looks, the sleep doubling
//! up to a millisecond, instead of waking itself at once for ever; a message still
//! arrives, and both sides of an exchange still make progress.
#![cfg(feature = "tokio")]

mod pairs;

use std::future::poll_fn;
use std::pin::Pin;
use std::time::Duration;

use futures_core::Stream;
use tierbuf_transport::connection::AsyncConnection;
use tierbuf_transport::{
    BufferRef, Completion, Endpoint, EndpointLimits, EndpointState, LoopbackProvider, Outstanding,
    PostError, TransportError,
};

use pairs::{PairProvider, connections_wrapping, preset};

/// An endpoint that forwards everything to `inner` but keeps the trait's default
/// readiness: it cannot wake a sleeper, so it must be polled.
#[derive(Debug)]
struct Polled<E>(E);

impl<E: Endpoint> Endpoint for Polled<E> {
    fn limits(&self) -> EndpointLimits {
        self.0.limits()
    }

    fn state(&self) -> EndpointState {
        self.0.state()
    }

    fn outstanding(&self) -> Outstanding {
        self.0.outstanding()
    }

    unsafe fn post_recv(&mut self, buffer: BufferRef, wr_id: u64) -> Result<(), PostError> {
        // SAFETY: the caller keeps `Endpoint::post_recv`'s contract, passed on as is.
        unsafe { self.0.post_recv(buffer, wr_id) }
    }

    unsafe fn post_send(&mut self, gather: &[BufferRef], wr_id: u64) -> Result<(), PostError> {
        // SAFETY: the caller keeps `Endpoint::post_send`'s contract, passed on as is.
        unsafe { self.0.post_send(gather, wr_id) }
    }

    fn poll(&mut self, completions: &mut [Completion]) -> Result<usize, TransportError> {
        self.0.poll(completions)
    }

    fn close(&mut self) {
        self.0.close();
    }
}

#[tokio::test(flavor = "current_thread")]
async fn an_idle_connection_over_a_polled_endpoint_sleeps_between_looks() {
    let provider = LoopbackProvider::make();
    let (polled, mut peer) = connections_wrapping(&provider, preset("rpc"), Polled);
    let mut polled = AsyncConnection::new(polled).expect("in tokio");

    // 200 ms idle: count the polls of a receive that finds nothing.
    let mut polls = 0u32;
    let idle = tokio::time::timeout(
        Duration::from_millis(200),
        poll_fn(|cx| {
            polls += 1;
            Pin::new(&mut polled).poll_next(cx)
        }),
    )
    .await;
    assert!(idle.is_err(), "nothing was sent");
    // A spin of 50 µs, then sleeps of a millisecond or more: a few hundred looks at most.
    // Waking itself at once, the task looked tens of thousands of times.
    assert!(
        polls < 2_000,
        "{polls} looks at an idle connection in 200 ms"
    );

    // A message is still taken, and an exchange still runs both ways.
    for round in 0..20u8 {
        peer.send(&[round; 700]).expect("send");
        let message = polled.recv().await.expect("a message");
        assert_eq!(&message[..], &[round; 700][..]);
        polled.send(&[round; 3]).await.expect("the answer");
        assert_eq!(&peer.recv().expect("the answer")[..], &[round; 3][..]);
    }
}
