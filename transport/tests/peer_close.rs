//! What a connection makes of its peer's orderly close, whatever order its endpoint
//! hands the close's completions out in: every message that landed before the close is
//! delivered, then the close is reported; a side whose only sends the close refused
//! were frames of its own (credits), not message bytes, has nothing unflushed; and a send
//! whose every byte was posted before the peer hung up is reported sent; and over shm, a
//! receiver whose peer asked for a promotion and then closed takes the peer's last
//! message; and a close right after a flush, while the peer receives on a thread of its
//! own, loses nothing whatever the peer was doing when it came.

mod holding;
mod pairs;

use std::collections::VecDeque;
use std::io::IoSlice;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use pairs::PairProvider;
use tierbuf_tiers::ladder::TierLadder;
use tierbuf_transport::connection::{Connection, ConnectionError, DataPath, SendError};
use tierbuf_transport::{
    BufferRef, Completion, Endpoint, EndpointLimits, EndpointState, LoopbackEndpoint,
    LoopbackProvider, Outstanding, PostError, QueueKind, ShmProvider, TransportError,
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

    holding::forward_one_sided!();

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

/// An endpoint that passes its first `refuse_from` sends and refuses every later one with
/// `refusal` (`ConnectionBroken`: as an endpoint whose peer hung up does); `passed` counts
/// the sends it passed.
#[derive(Debug)]
struct RefusingFrom<E> {
    inner: E,
    passed: Arc<AtomicUsize>,
    refuse_from: usize,
    refusal: Arc<Mutex<PostError>>,
}

impl<E: Endpoint> Endpoint for RefusingFrom<E> {
    fn limits(&self) -> EndpointLimits {
        self.inner.limits()
    }

    fn state(&self) -> EndpointState {
        self.inner.state()
    }

    fn outstanding(&self) -> Outstanding {
        self.inner.outstanding()
    }

    unsafe fn post_recv(&mut self, buffer: BufferRef, wr_id: u64) -> Result<(), PostError> {
        // SAFETY: the caller keeps `Endpoint::post_recv`'s contract, passed on as is.
        unsafe { self.inner.post_recv(buffer, wr_id) }
    }

    unsafe fn post_send(&mut self, gather: &[BufferRef], wr_id: u64) -> Result<(), PostError> {
        if self.passed.load(Ordering::Relaxed) >= self.refuse_from {
            return Err(self.refusal.lock().unwrap().clone());
        }
        self.passed.fetch_add(1, Ordering::Relaxed);
        // SAFETY: the caller keeps `Endpoint::post_send`'s contract, passed on as is.
        unsafe { self.inner.post_send(gather, wr_id) }
    }

    holding::forward_one_sided!();

    fn poll(&mut self, completions: &mut [Completion]) -> Result<usize, TransportError> {
        self.inner.poll(completions)
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

#[test]
fn a_message_posted_whole_is_sent_though_a_frame_behind_it_finds_the_peer_gone() {
    // Past the first tier: the message goes out in segments, its promotion request
    // behind them, all in the call that takes it.
    let ladder = || {
        TierLadder::builder()
            .tier(256, 8, 240)
            .tier(4096, 8, 4096)
            .reservoir_regions(1)
            .build()
            .unwrap()
    };
    let message: Vec<u8> = (0..1000u32).map(|byte| byte as u8).collect();
    let pair = |refuse_from| {
        let passed = Arc::new(AtomicUsize::new(0));
        let wrap = |inner| RefusingFrom {
            inner,
            passed: Arc::clone(&passed),
            refuse_from,
            refusal: Arc::new(Mutex::new(PostError::ConnectionBroken)),
        };
        let pair = pairs::connections_wrapping_on(
            &LoopbackProvider::make(),
            ladder(),
            DataPath::TwoSided,
            wrap,
        );
        (pair, passed)
    };
    let ((mut sending, _receiving), passed) = pair(usize::MAX);
    sending.send_gather(&[IoSlice::new(&message)]).unwrap();
    let sends = passed.load(Ordering::Relaxed);
    assert!(sends >= 2, "segments and a request: {sends} sends");
    // The same send, its last frame refused: the peer took the message and hung up.
    let ((mut sending, mut receiving), _) = pair(sends - 1);
    sending
        .send_gather(&[IoSlice::new(&message)])
        .expect("every byte of the message was posted");
    assert_eq!(&*receiving.recv().unwrap(), &message[..]);
    let error = sending.send(b"after").unwrap_err();
    assert!(matches!(error, SendError::Failed(_)), "{error:?}");
    // Refused before its last segment was posted, it is reported failed.
    for refuse_from in 0..sends - 1 {
        let ((mut sending, _receiving), _) = pair(refuse_from);
        let error = sending
            .send_gather(&[IoSlice::new(&message)])
            .expect_err(&format!("refused from send {refuse_from} of {sends}"));
        assert!(matches!(error, SendError::Failed(_)), "{error:?}");
    }
}

#[test]
fn a_message_accepted_and_then_refused_is_reported_by_flush() {
    // The endpoint's queue is full when the message is offered: it is accepted and waits
    // to be posted; then the peer hangs up, and the post is refused.
    let refusal = Arc::new(Mutex::new(PostError::QueueFull {
        queue: QueueKind::Send,
        depth: 8,
    }));
    let wrap = |inner| RefusingFrom {
        inner,
        passed: Arc::new(AtomicUsize::new(0)),
        refuse_from: 0,
        refusal: Arc::clone(&refusal),
    };
    let ladder = TierLadder::builder()
        .tier(256, 8, 240)
        .reservoir_regions(1)
        .build()
        .unwrap();
    let (mut sending, _receiving) =
        pairs::connections_wrapping(&LoopbackProvider::make(), ladder, wrap);
    sending
        .try_send(b"accepted")
        .expect("taken, to be posted when the queue has room");
    *refusal.lock().unwrap() = PostError::ConnectionBroken;
    let error = sending
        .flush()
        .expect_err("the accepted message never reached the peer");
    assert!(matches!(*error, ConnectionError::Post(_)), "{error:?}");
}

#[test]
fn a_promotion_asked_for_by_a_peer_that_then_closed_loses_none_of_its_message_over_shm() {
    // Past tier 0: the message goes out in three segments with a promotion request, all
    // of them copied into the receiver's posted receives before the flush returns; then
    // the sender closes. The receiver takes the segments, which are the message, and then
    // reports the close, whatever became of the request. (A receiver that posts the new
    // tier's receives as the close comes meets the closed socket when it announces their
    // region: `shm::endpoint`'s unit tests check that this is the peer's close too, and
    // the rounds below meet it now and then.)
    let provider = ShmProvider::make();
    let (mut sending, mut receiving) = pairs::connections_on(
        &provider,
        pairs::demoting_ladder(Duration::from_secs(60)),
        DataPath::TwoSided,
    );
    let message: Vec<u8> = (0..1000u32).map(|byte| byte as u8).collect();
    sending.send(&message).unwrap();
    sending.flush().unwrap();
    assert_eq!(sending.stats().messages_segmented, 1, "sent in segments");
    drop(sending);
    assert_eq!(receive_until_closed(&mut receiving), vec![message]);
}

/// Rounds of a sender that sends messages of every kind (small, needing a promotion,
/// past the top tier), flushes and closes, while its peer takes them as they come on a
/// thread of its own: whatever the close meets on the receiving side (a promotion being
/// answered, receives being reposted, a region being announced), every message the flush
/// saw through arrives, in order, before the close.
fn a_close_right_after_a_flush_loses_nothing_while_the_peer_receives<P: PairProvider>() {
    const ROUNDS: u64 = 60;
    let provider = P::make();
    for round in 0..ROUNDS {
        let (mut sending, mut receiving) =
            pairs::connections(&provider, pairs::demoting_ladder(Duration::from_secs(60)));
        let lens = [16, 3000, 100, 9000, 700, 16, 5000, 64];
        let count = 4 + (round % 5) as usize;
        let messages: Vec<Vec<u8>> = (0..count)
            .map(|index| {
                let len = lens[(index + round as usize) % lens.len()];
                (0..len).map(|byte| (byte + index) as u8).collect()
            })
            .collect();
        let expected = messages.clone();
        let receiver = std::thread::spawn(move || {
            let mut received = Vec::new();
            let error = loop {
                match receiving.recv() {
                    Ok(message) => received.push(message.to_vec()),
                    Err(error) => break error,
                }
            };
            (received, error, receiving.stats())
        });
        for message in &messages {
            sending.send(message).unwrap();
        }
        sending.flush().unwrap();
        drop(sending);
        let (received, error, stats) = receiver.join().unwrap();
        assert!(
            matches!(*error, ConnectionError::PeerClosed),
            "round {round}: {error:?} after {} of {count}: {stats:?}",
            received.len()
        );
        assert!(
            received == expected,
            "round {round}: {} of {count} came: {stats:?}",
            received.len()
        );
    }
}

#[test]
fn a_close_right_after_a_flush_loses_nothing_while_the_peer_receives_over_loopback() {
    a_close_right_after_a_flush_loses_nothing_while_the_peer_receives::<LoopbackProvider>();
}

#[test]
fn a_close_right_after_a_flush_loses_nothing_while_the_peer_receives_over_shm() {
    a_close_right_after_a_flush_loses_nothing_while_the_peer_receives::<ShmProvider>();
}

/// Over verbs where `TIERBUF_VERBS_DEVICE` names a device (`.ci/verbs-rxe` runs it on
/// soft-RoCE): the close travels on the handshake socket, the messages on the fabric.
#[cfg(feature = "verbs")]
#[test]
fn a_close_right_after_a_flush_loses_nothing_while_the_peer_receives_over_verbs() {
    if pairs::skipped_without_a_verbs_device() {
        return;
    }
    a_close_right_after_a_flush_loses_nothing_while_the_peer_receives::<
        tierbuf_transport::verbs::VerbsProvider,
    >();
}
