//! What a connection makes of its peer's orderly close, whatever order its endpoint
//! hands the close's completions out in: every message that landed before the close is
//! delivered, then the close is reported; and a side whose only sends the close refused
//! were frames of its own (credits), not message bytes, has nothing unflushed.

mod holding;
mod pairs;

use std::collections::VecDeque;

use pairs::PairProvider;
use tierbuf_tiers::ladder::TierLadder;
use tierbuf_transport::connection::{Connection, ConnectionError, SendError};
use tierbuf_transport::{
    BufferRef, Completion, Endpoint, EndpointLimits, EndpointState, LoopbackEndpoint,
    LoopbackProvider, Outstanding, PostError, TransportError,
};

/// An endpoint that hands out the completions of the one it wraps sorted by outcome:
/// the failed ones first (or last), the others only at a later poll. A provider may
/// split a poll's completions any way it likes.
#[derive(Debug)]
struct Reordering<E> {
    inner: E,
    held: VecDeque<Completion>,
    failures_first: bool,
}

impl<E> Reordering<E> {
    fn new(inner: E, failures_first: bool) -> Reordering<E> {
        Reordering {
            inner,
            held: VecDeque::new(),
            failures_first,
        }
    }
}

impl<E: Endpoint> Endpoint for Reordering<E> {
    fn limits(&self) -> EndpointLimits {
        self.inner.limits()
    }

    fn state(&self) -> EndpointState {
        self.inner.state()
    }

    fn outstanding(&self) -> Outstanding {
        holding::with_held(self.inner.outstanding(), &self.held)
    }

    unsafe fn post_recv(&mut self, buffer: BufferRef, wr_id: u64) -> Result<(), PostError> {
        // SAFETY: the caller keeps `Endpoint::post_recv`'s contract, passed on as is.
        unsafe { self.inner.post_recv(buffer, wr_id) }
    }

    unsafe fn post_send(&mut self, gather: &[BufferRef], wr_id: u64) -> Result<(), PostError> {
        // SAFETY: the caller keeps `Endpoint::post_send`'s contract, passed on as is.
        unsafe { self.inner.post_send(gather, wr_id) }
    }

    fn poll(&mut self, completions: &mut [Completion]) -> Result<usize, TransportError> {
        holding::take_all(&mut self.inner, |completion| {
            self.held.push_back(completion)
        })?;
        let failed = |held: &Completion| !held.status.is_success();
        let failures_now = if self.failures_first {
            self.held.iter().any(failed)
        } else {
            self.held.iter().all(failed)
        };
        let mut filled = 0;
        let mut kept = VecDeque::new();
        while let Some(held) = self.held.pop_front() {
            if filled < completions.len() && failed(&held) == failures_now {
                completions[filled] = held;
                filled += 1;
            } else {
                kept.push_back(held);
            }
        }
        self.held = kept;
        Ok(filled)
    }

    fn close(&mut self) {
        self.inner.close();
    }
}

/// A pair on one small tier, the receiving end over `wrap` of its endpoint.
fn pair<W: Endpoint>(
    wrap: impl FnOnce(LoopbackEndpoint) -> W,
) -> (Connection<W>, Connection<LoopbackEndpoint>) {
    let ladder = TierLadder::builder()
        .tier(256, 8, 240)
        .reservoir_regions(1)
        .build()
        .unwrap();
    pairs::connections_wrapping(&LoopbackProvider::make(), ladder, wrap)
}

/// Sends `count` messages on `sending`, waits until they are through, and closes it.
fn send_then_close(
    mut sending: Connection<tierbuf_transport::LoopbackEndpoint>,
    count: u8,
) -> Vec<Vec<u8>> {
    let messages: Vec<Vec<u8>> = (0..count).map(|seq| vec![seq; 100]).collect();
    for message in &messages {
        sending.send(message).unwrap();
    }
    sending.flush().unwrap();
    drop(sending);
    messages
}

/// Takes messages from `receiving` until it reports the close, which it checks.
fn receive_until_closed<E: Endpoint>(receiving: &mut Connection<E>) -> Vec<Vec<u8>> {
    let mut received = Vec::new();
    let error = loop {
        match receiving.try_recv() {
            Ok(Some(message)) => received.push(message.to_vec()),
            Ok(None) => {}
            Err(error) => break error,
        }
    };
    assert!(matches!(*error, ConnectionError::PeerClosed), "{error:?}");
    received
}

#[test]
fn messages_that_landed_before_the_close_are_delivered_before_it_in_any_completion_order() {
    let (mut receiving, sending) = pair(|endpoint| Reordering::new(endpoint, true));
    // Fewer than the receiver's credits: all of them land before it looks.
    let messages = send_then_close(sending, 7);
    assert_eq!(receive_until_closed(&mut receiving), messages);
}

#[test]
fn credits_the_close_refused_leave_nothing_unflushed() {
    // The messages come first: the receiver owes credits for them and posts a credit
    // frame, which the closed peer refuses, before the close's flushes come.
    let (mut receiving, sending) = pair(|endpoint| Reordering::new(endpoint, false));
    let messages = send_then_close(sending, 7);
    assert_eq!(receive_until_closed(&mut receiving), messages);
    receiving
        .flush()
        .expect("it accepted nothing, so nothing is unflushed");
}

#[test]
fn a_flush_after_the_peer_took_every_message_and_closed_succeeds() {
    // The close's flushes and the sends' completions come in one pass, either order
    // first: everything accepted reached the peer, so the flush has nothing to report.
    for failures_first in [true, false] {
        let (mut sending, mut receiving) =
            pair(|endpoint| Reordering::new(endpoint, failures_first));
        let messages: Vec<Vec<u8>> = (0..7u8).map(|seq| vec![seq; 100]).collect();
        for message in &messages {
            sending.send(message).unwrap();
        }
        let received: Vec<Vec<u8>> = messages
            .iter()
            .map(|_| receiving.recv().unwrap().to_vec())
            .collect();
        assert_eq!(received, messages);
        drop(receiving);
        sending
            .flush()
            .expect("every message reached the peer before it closed");
        let error = sending.send(b"after").unwrap_err();
        assert!(
            matches!(&error, SendError::Failed(failure) if matches!(**failure, ConnectionError::PeerClosed)),
            "{error:?}"
        );
    }
}
