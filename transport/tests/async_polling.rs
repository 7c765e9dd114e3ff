//! An `AsyncConnection` over an endpoint that cannot wake anybody (feature `tokio`;
//! `Readiness::Polling`, as verbs' is): its task sleeps between looks, the sleep doubling
//! up to a millisecond, instead of waking itself at once for ever; a message still
//! arrives, and both sides of an exchange still make progress.
#![cfg(feature = "tokio")]

mod holding;
mod pairs;

use std::collections::VecDeque;
use std::future::poll_fn;
use std::pin::Pin;
use std::task::Poll;
use std::time::{Duration, Instant};

use futures_core::Stream;
use futures_sink::Sink;
use tierbuf_transport::connection::AsyncConnection;
use tierbuf_transport::{
    BufferRef, Completion, Endpoint, EndpointLimits, EndpointState, LoopbackProvider, Outstanding,
    PostError, TransportError,
};

use pairs::{PairProvider, connections_wrapping, preset};

/// An endpoint that forwards everything to `inner` but keeps the trait's default
/// readiness: it cannot wake a sleeper, so it must be polled. Its completions show
/// [`COMPLETION_DELAY`] after the inner endpoint made them, as a NIC's come some time
/// after the post: a look may find none where a later look finds some. A close shows
/// only after the completions made before it.
#[derive(Debug)]
struct Polled<E> {
    inner: E,
    seen: VecDeque<(Instant, Completion)>,
}

/// How long a completion of [`Polled`] waits before it shows.
const COMPLETION_DELAY: Duration = Duration::from_micros(200);

impl<E> Polled<E> {
    fn new(inner: E) -> Polled<E> {
        Polled {
            inner,
            seen: VecDeque::new(),
        }
    }
}

impl<E: Endpoint> Endpoint for Polled<E> {
    fn limits(&self) -> EndpointLimits {
        self.inner.limits()
    }

    fn state(&self) -> EndpointState {
        // What completed before a close is seen before the close, as on a NIC: the peer
        // learns its sends completed only after this side's completions were made.
        if self.seen.is_empty() {
            self.inner.state()
        } else {
            EndpointState::Open
        }
    }

    fn outstanding(&self) -> Outstanding {
        holding::with_held(self.inner.outstanding(), self.seen.iter().map(|(_, c)| c))
    }

    unsafe fn post_recv(&mut self, buffer: BufferRef, wr_id: u64) -> Result<(), PostError> {
        // SAFETY: the caller keeps `Endpoint::post_recv`'s contract, passed on as is.
        unsafe { self.inner.post_recv(buffer, wr_id) }
    }

    unsafe fn post_send(&mut self, gather: &[BufferRef], wr_id: u64) -> Result<(), PostError> {
        // SAFETY: the caller keeps `Endpoint::post_send`'s contract, passed on as is.
        unsafe { self.inner.post_send(gather, wr_id) }
    }

    holding::forward_one_sided!();

    fn poll(&mut self, completions: &mut [Completion]) -> Result<usize, TransportError> {
        let now = Instant::now();
        holding::take_all(&mut self.inner, |completion| {
            self.seen.push_back((now, completion));
        })?;
        // Once the connection is over, everything made before shows at once.
        let over = !matches!(self.inner.state(), EndpointState::Open);
        let mut filled = 0;
        while filled < completions.len()
            && self
                .seen
                .front()
                .is_some_and(|(at, _)| over || at.elapsed() >= COMPLETION_DELAY)
        {
            completions[filled] = self.seen.pop_front().expect("looked at").1;
            filled += 1;
        }
        Ok(filled)
    }

    fn close(&mut self) {
        self.inner.close();
    }
}

#[tokio::test(flavor = "current_thread")]
async fn an_idle_connection_over_a_polled_endpoint_sleeps_between_looks() {
    let provider = LoopbackProvider::make();
    let (polled, mut peer) = connections_wrapping(&provider, preset("rpc"), Polled::new);
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

/// One task reads and writes in each poll, as tarpc's dispatch does, over a polled
/// endpoint, with four messages in flight and a peer thread echoing them: every call of
/// a poll waits on the same polling sleep, and none may be left without a wake. (The
/// stall this guards against was seen over soft-RoCE, `.ci/verbs-rxe`'s `rpc` step; this
/// loopback form has not reproduced it.)
#[tokio::test(flavor = "current_thread")]
async fn a_task_reading_and_writing_in_one_poll_over_a_polled_endpoint_is_never_stranded() {
    const MESSAGES: usize = 300;
    let provider = LoopbackProvider::make();
    let (polled, mut peer) = connections_wrapping(&provider, preset("rpc"), Polled::new);
    let mut connection = AsyncConnection::new(polled).expect("in tokio");
    let echo = std::thread::spawn(move || {
        for _ in 0..MESSAGES {
            let message = peer.recv().expect("a message");
            // The peer answers late now and then, so the task's waits outlast its spin.
            if message[0] % 7 == 0 {
                std::thread::sleep(Duration::from_millis(2));
            }
            peer.send(&message).expect("the echo");
        }
        peer.flush().expect("flushed");
    });
    let (mut sent, mut received) = (0usize, 0usize);
    let exchange = poll_fn(|cx| {
        while received < MESSAGES {
            match Pin::new(&mut connection).poll_next(cx) {
                Poll::Ready(Some(echoed)) => {
                    let echoed = echoed.expect("an echo");
                    assert_eq!(echoed[0], received as u8, "in order");
                    received += 1;
                }
                Poll::Ready(None) => {
                    panic!("the peer closed after {received} of {MESSAGES} echoes")
                }
                Poll::Pending => break,
            }
        }
        while sent < MESSAGES && sent - received < 4 {
            match Sink::<&[u8]>::poll_ready(Pin::new(&mut connection), cx) {
                Poll::Ready(ready) => ready.expect("room to send"),
                Poll::Pending => break,
            }
            Sink::<&[u8]>::start_send(Pin::new(&mut connection), &[sent as u8; 100][..])
                .expect("taken");
            sent += 1;
        }
        if let Poll::Ready(flushed) = Sink::<&[u8]>::poll_flush(Pin::new(&mut connection), cx) {
            flushed.expect("flushed");
        }
        if received == MESSAGES {
            Poll::Ready(())
        } else {
            Poll::Pending
        }
    });
    tokio::time::timeout(Duration::from_secs(60), exchange)
        .await
        .expect("every echo came back within 60 s: no call was left without a wake");
    echo.join().expect("the echoing peer");
}
