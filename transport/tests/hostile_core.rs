//! A `ConnectionCore` against a hostile peer, at the sans-IO level: the peer is nothing but
//! the frames the test writes into the core's posted receives, built by hand from the
//! frame header's layout (`transport/src/connection/header.rs`: kind, grant tier, grant
//! count, payload length, message length, little-endian). Whatever the peer sends, the
//! core must neither panic nor grow without bound: it fails the connection with an error
//! that blames the peer and names what it did.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tierbuf_pool::{HostRegistrar, MemoryBudget};
use tierbuf_tiers::ladder::TierLadder;
use tierbuf_tiers::wire::{self, ControlMessage, Epoch};
use tierbuf_tiers::{Reservoir, TierIndex};
use tierbuf_transport::BufferRef;
use tierbuf_transport::connection::{
    ConnectionConfig, ConnectionCore, ConnectionError, Fault, FrameKind, HEADER_LEN, PeerViolation,
    WorkKind, WorkRequest,
};

/// The two-tier ladder: 16 slots of 512 B, 16 of 8 KiB.
fn ladder() -> Arc<TierLadder> {
    Arc::new(TierLadder::preset("two-tier").unwrap())
}

/// One frame as a peer would write it.
fn frame(kind: FrameKind, grant: (u8, u16), payload: &[u8], message_len: u64) -> Vec<u8> {
    let mut bytes = vec![kind as u8, grant.0];
    bytes.extend_from_slice(&grant.1.to_le_bytes());
    bytes.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    bytes.extend_from_slice(&message_len.to_le_bytes());
    assert_eq!(bytes.len(), HEADER_LEN);
    bytes.extend_from_slice(payload);
    bytes
}

/// The side under attack: its core and the receives it has posted, oldest first. Its
/// sends are never carried out (the peer does not read), so it holds them, unless
/// `complete_sends` is set: then each is completed as soon as it is posted, and its
/// frame's kind kept in `sent`.
struct Victim {
    core: ConnectionCore,
    recvs: VecDeque<(u64, BufferRef)>,
    sends_posted: usize,
    complete_sends: bool,
    sent: Vec<u8>,
    now: Instant,
}

impl Victim {
    fn new() -> Victim {
        let config = Arc::new(ConnectionConfig::new(ladder()).unwrap());
        let registrar = Arc::new(HostRegistrar::new(MemoryBudget::with_cap(1 << 20)));
        let reservoir = Arc::new(Reservoir::new(registrar, Arc::clone(config.ladder())));
        let now = Instant::now();
        let core = ConnectionCore::new(config, Arc::clone(&reservoir), reservoir, now).unwrap();
        let mut victim = Victim {
            core,
            recvs: VecDeque::new(),
            sends_posted: 0,
            complete_sends: false,
            sent: Vec::new(),
            now,
        };
        victim.collect();
        victim
    }

    /// Takes the work the core handed out.
    fn collect(&mut self) {
        while let Some(work) = self.core.poll_work() {
            match work {
                WorkRequest::PostRecv { wr_id, buffer } => self.recvs.push_back((wr_id, buffer)),
                WorkRequest::PostSend { wr_id, buffer } => {
                    self.sends_posted += 1;
                    if self.complete_sends {
                        // SAFETY: the send buffer is a slot the core holds, with at least
                        // a frame header in it, until the send completes below.
                        self.sent.push(unsafe { *(buffer.addr as *const u8) });
                        self.core
                            .handle_completion(self.now, WorkKind::Send, wr_id, buffer.len)
                            .expect("a send completes");
                        self.core.progress(self.now);
                    }
                }
                other => panic!("unexpected work {other:?}"),
            }
        }
    }

    /// How many frames of `kind` the victim sent (with `complete_sends`).
    fn sent_of(&self, kind: FrameKind) -> usize {
        self.sent.iter().filter(|&&sent| sent == kind as u8).count()
    }

    /// Writes the peer's `frame` into the oldest posted receive and completes it, as a
    /// provider would; then lets the core make progress.
    fn deliver(&mut self, frame: &[u8]) -> Result<(), Arc<ConnectionError>> {
        self.collect();
        let (wr_id, buffer) = self.recvs.pop_front().expect("a posted receive");
        assert!(
            frame.len() <= buffer.len as usize,
            "the test overran a receive"
        );
        // SAFETY: the receive buffer is a slot the core holds while the receive is posted,
        // at least `frame.len()` bytes long, and nothing else touches it meanwhile.
        unsafe {
            std::ptr::copy_nonoverlapping(frame.as_ptr(), buffer.addr as *mut u8, frame.len());
        }
        self.now += Duration::from_micros(1);
        let delivered =
            self.core
                .handle_completion(self.now, WorkKind::Recv, wr_id, frame.len() as u32);
        self.core.progress(self.now);
        self.collect();
        delivered
    }
}

/// Credit frames that each grant 65 535 receives: more than the peer could ever have
/// posted. Summed they passed 32 bits and the addition panicked; now the first grant past
/// what the ladder lets the peer post fails the connection, naming the grant.
#[test]
fn grants_past_the_receives_a_peer_can_post_are_a_violation_not_an_overflow() {
    let mut victim = Victim::new();
    let credit = frame(FrameKind::Credit, (0, u16::MAX), &[], 0);
    let mut outcome = Ok(());
    for _ in 0..70_000 {
        outcome = victim.deliver(&credit);
        if outcome.is_err() {
            break;
        }
    }
    let error = outcome.expect_err("a peer granting without end is refused");
    assert_eq!(error.fault(), Fault::Peer, "{error}");
    let ConnectionError::PeerProtocol(PeerViolation::GrantBeyondReceives {
        tier,
        count,
        limit,
        ..
    }) = &*error
    else {
        panic!("not a grant violation: {error:?}");
    };
    assert_eq!((*tier, *count), (0, u16::MAX));
    // Every slot of every tier posted at once, twice over.
    assert_eq!(*limit, 2 * (16 + 16));
    assert!(victim.core.stats().send_credits <= u64::from(*limit));
}

/// Grants alternating between two tiers, one receive each, would make a run per frame; the
/// same bound stops them before the list of runs grows past it.
#[test]
fn alternating_small_grants_are_bounded_too() {
    let mut victim = Victim::new();
    let mut outcome = Ok(());
    for index in 0..1000u32 {
        let credit = frame(FrameKind::Credit, ((index % 2) as u8, 1), &[], 0);
        outcome = victim.deliver(&credit);
        if outcome.is_err() {
            break;
        }
    }
    let error = outcome.expect_err("refused once past the bound");
    assert!(
        matches!(
            &*error,
            ConnectionError::PeerProtocol(PeerViolation::GrantBeyondReceives { .. })
        ),
        "{error:?}"
    );
    assert!(victim.core.stats().send_credits <= 2 * (16 + 16));
}

/// A grant the peer could have made is still taken: the bound is not a cap on honest
/// credits.
#[test]
fn grants_within_what_the_peer_can_post_are_taken() {
    let mut victim = Victim::new();
    let before = victim.core.stats();
    victim
        .deliver(&frame(FrameKind::Credit, (1, 4), &[], 0))
        .unwrap();
    victim
        .deliver(&frame(FrameKind::Credit, (0, 4), &[], 0))
        .unwrap();
    let after = victim.core.stats();
    // Each frame the victim sent meanwhile (a credit frame of its own) took one.
    let spent = after.frames_sent - before.frames_sent;
    assert_eq!(after.send_credits, before.send_credits + 8 - spent);
}

/// One control frame carrying `message`, granting nothing.
fn control(message: ControlMessage) -> Vec<u8> {
    let mut encoded = [0u8; wire::MAX_FRAME_LEN];
    let len = wire::encode(&message, &mut encoded).unwrap();
    frame(FrameKind::Control, (0, 0), &encoded[..len], 0)
}

/// A valid promotion request, repeated 100 000 times by a peer that grants no credit:
/// every repeat used to queue one more answer for a credit that never came (about 47 MB
/// for a million). A repeat of a request already answered queues nothing: the answer
/// still waiting stands for it. The connection keeps working.
#[test]
fn a_request_repeated_without_credit_queues_one_answer() {
    let mut victim = Victim::new();
    let request = control(ControlMessage::Request {
        epoch: Epoch::new(1),
        tier: TierIndex::new(1),
        current: Epoch::INITIAL,
    });
    let mut most_waiting = 0;
    for _ in 0..100_000 {
        victim
            .deliver(&request)
            .expect("a repeated request is no violation");
        most_waiting = most_waiting.max(victim.core.stats().control_frames_waiting);
    }
    let stats = victim.core.stats();
    assert_eq!(stats.recv_tier, 1, "the request was provisioned once");
    assert_eq!(stats.send_credits, 0, "the peer granted nothing");
    assert!(most_waiting <= 1, "{most_waiting} control frames waited");
    assert!(victim.core.failure().is_none());
}

/// Requests of ever newer epochs, each refused (a tier past the ladder), from a peer that
/// grants no credit: each answer makes the one before it moot, so one waits at most.
#[test]
fn answers_to_newer_requests_replace_the_ones_still_waiting() {
    let mut victim = Victim::new();
    let mut most_waiting = 0;
    for epoch in 1..=20_000 {
        let request = control(ControlMessage::Request {
            epoch: Epoch::new(epoch),
            tier: TierIndex::new(9),
            current: Epoch::INITIAL,
        });
        victim
            .deliver(&request)
            .expect("a request past the ladder is nacked");
        most_waiting = most_waiting.max(victim.core.stats().control_frames_waiting);
    }
    assert!(most_waiting <= 1, "{most_waiting} control frames waited");
    assert!(victim.core.failure().is_none());
}

/// What this side asks on its own account still needs credits: a peer that never grants
/// one while this side keeps asking for a promotion (each request given up after its
/// attempts and asked again later) fails the connection once the waiting control frames
/// pass the limit, blaming the peer, instead of queueing them without end.
#[test]
fn control_frames_waiting_past_the_limit_fail_the_connection() {
    let mut victim = Victim::new();
    let mut most_waiting = 0;
    let error = loop {
        // A message built in place needs tier 1: it asks for it (or the refusal holds).
        let _ = victim.core.try_reserve(victim.now, 4000);
        for _ in 0..8 {
            victim.now += Duration::from_secs(1);
            victim.core.progress(victim.now);
            victim.collect();
        }
        most_waiting = most_waiting.max(victim.core.stats().control_frames_waiting);
        if let Some(error) = victim.core.failure() {
            break Arc::clone(error);
        }
        assert!(most_waiting < 1000, "{most_waiting} control frames wait");
    };
    assert_eq!(error.fault(), Fault::Peer);
    assert!(
        matches!(
            &*error,
            ConnectionError::PeerProtocol(PeerViolation::ControlBacklog { limit: 256, .. })
        ),
        "{error:?}"
    );
    assert!(most_waiting <= 258, "{most_waiting} control frames waited");
}

/// The peer's control frames that arrive while one of its segmented messages is half
/// received wait behind the message (so a first oversize message is not held up by the
/// promotion it asked for), but a peer that leaves a message open cannot use that to
/// park its control, or pile it up: the hold ends when its time is up, or once 16 frames
/// wait, whichever comes first.
#[test]
fn control_held_behind_a_message_left_open_is_answered_in_bounded_time_and_count() {
    let request = control(ControlMessage::Request {
        epoch: Epoch::new(1),
        tier: TierIndex::new(1),
        current: Epoch::INITIAL,
    });
    let open_a_message = frame(FrameKind::First, (0, 0), &[7; 100], 2_000);

    // Bounded in time: one request, then silence.
    let mut victim = Victim::new();
    victim.deliver(&open_a_message).expect("a first segment");
    victim.deliver(&request).expect("a request");
    assert_eq!(victim.core.stats().recv_tier, 0, "held behind the message");
    let due = victim
        .core
        .poll_timeout()
        .expect("the hold's end is a timer");
    assert!(due <= victim.now + Duration::from_micros(250), "{due:?}");
    victim.now = due;
    victim.core.progress(victim.now);
    assert_eq!(
        victim.core.stats().recv_tier,
        1,
        "answered when the hold was up"
    );

    // Bounded in count: requests repeated within the hold's time.
    let mut victim = Victim::new();
    victim.deliver(&open_a_message).expect("a first segment");
    for held in 1..16 {
        victim.deliver(&request).expect("a request");
        assert_eq!(victim.core.stats().recv_tier, 0, "{held} held");
    }
    victim.deliver(&request).expect("a request");
    assert_eq!(victim.core.stats().recv_tier, 1, "answered once 16 waited");
    assert!(victim.core.failure().is_none());
}

/// A peer cannot keep this side draining. Receives the peer posted for a tier this side
/// does not send on are drained (consumed by empty frames) only within an allowance of
/// `max_send_credits` frames, refilled by this side's own tier changes and given-up
/// requests, never by anything the peer sends. Here the victim's promotion request is
/// never answered, so it gives the request up and drains; the peer then grants receive
/// after receive of that tier, for ever: the victim drains no more than its allowance,
/// and the grants that pile up past what the peer could have posted fail the connection,
/// the peer's fault.
#[test]
fn a_peer_granting_a_tier_this_side_does_not_send_on_gets_a_bounded_number_of_drains() {
    let mut victim = Victim::new();
    victim.complete_sends = true;
    let allowance = ConnectionConfig::new(ladder()).unwrap().max_send_credits() as usize;
    // An 8 KiB message needs tier 1: it asks for it and goes out in segments on tier 0,
    // on the tier-0 receives the peer grants as they are used.
    let message = vec![3u8; 8 << 10];
    let mut accepted = 0;
    while accepted < message.len() {
        accepted += victim
            .core
            .try_send(victim.now, &[std::io::IoSlice::new(&message[accepted..])])
            .expect("a send the credits allow");
        victim.collect();
        victim
            .deliver(&frame(FrameKind::Credit, (0, 4), &[], 0))
            .expect("a tier-0 grant");
    }
    // The peer never answers: the request is given up.
    let deadline = victim.now + Duration::from_secs(600);
    while victim.core.stats().tiers.timeouts == 0 {
        assert!(victim.now < deadline, "the request was never given up");
        victim.now += Duration::from_millis(100);
        victim.core.progress(victim.now);
        victim.collect();
    }
    assert_eq!(victim.core.stats().send_tier, 0);
    let drains_before = victim.sent_of(FrameKind::Drain);

    let mut outcome = Ok(());
    for _ in 0..1000 {
        outcome = victim.deliver(&frame(FrameKind::Credit, (1, 1), &[], 0));
        if outcome.is_err() {
            break;
        }
    }
    let drains = victim.sent_of(FrameKind::Drain) - drains_before;
    assert!(drains > 0, "receives of a tier given up are drained");
    assert!(
        drains <= allowance,
        "{drains} drains for one request given up, past the allowance of {allowance}"
    );
    let error = outcome.expect_err("endless grants are refused in the end");
    assert_eq!(error.fault(), Fault::Peer, "{error}");
    assert!(
        matches!(
            &*error,
            ConnectionError::PeerProtocol(PeerViolation::GrantBeyondReceives { tier: 1, .. })
        ),
        "{error:?}"
    );
}

/// A packed frame's payload of `entries`, each `(length in its head, reserved, bytes)`.
fn packed_payload(entries: &[(u32, u32, &[u8])]) -> Vec<u8> {
    let mut payload = Vec::new();
    for (len, reserved, bytes) in entries {
        payload.extend_from_slice(&len.to_le_bytes());
        payload.extend_from_slice(&reserved.to_le_bytes());
        payload.extend_from_slice(bytes);
        payload.resize(payload.len().next_multiple_of(8), 0);
    }
    payload
}

/// A well-formed packed frame delivers each of its messages; one that breaks the entry
/// format, in any of the ways a peer can, fails the connection as the peer's fault and
/// delivers none of its messages, not even those before the bad entry.
#[test]
fn malformed_packed_frames_deliver_nothing_and_blame_the_peer() {
    let mut victim = Victim::new();
    let good = packed_payload(&[(3, 0, b"abc"), (0, 0, b""), (8, 0, b"12345678")]);
    victim
        .deliver(&frame(FrameKind::Packed, (0, 0), &good, 3))
        .expect("a well-formed packed frame");
    let delivered: Vec<Vec<u8>> = std::iter::from_fn(|| victim.core.try_recv())
        .map(|message| message.to_vec())
        .collect();
    assert_eq!(delivered, [&b"abc"[..], b"", b"12345678"]);

    let past = packed_payload(&[(3, 0, b"abc"), (300, 0, b"xyz")]);
    let reserved = packed_payload(&[(3, 0, b"abc"), (3, 7, b"xyz")]);
    let trailing = packed_payload(&[(3, 0, b"abc"), (3, 0, b"xyz")]);
    for (payload, count, what) in [
        (&past, 2, "an entry past the frame"),
        (&reserved, 2, "reserved bytes set"),
        (&trailing, 1, "bytes after the counted entries"),
        (&trailing, 3, "fewer entries than counted"),
    ] {
        let mut victim = Victim::new();
        let error = victim
            .deliver(&frame(FrameKind::Packed, (0, 0), payload, count))
            .expect_err(what);
        assert_eq!(error.fault(), Fault::Peer, "{what}: {error}");
        assert!(
            matches!(
                &*error,
                ConnectionError::PeerProtocol(PeerViolation::Packed(_))
            ),
            "{what}: {error:?}"
        );
        assert!(
            victim.core.try_recv().is_none(),
            "{what}: nothing delivered"
        );
    }
    // A count the payload cannot hold is refused by the header.
    let mut victim = Victim::new();
    let error = victim
        .deliver(&frame(FrameKind::Packed, (0, 0), &trailing, 5))
        .expect_err("five entries in 24 bytes");
    assert!(
        matches!(
            &*error,
            ConnectionError::PeerProtocol(PeerViolation::Header(_))
        ),
        "{error:?}"
    );
}

/// A packed frame in the middle of a segmented message is out of order, as a whole one is.
#[test]
fn a_packed_frame_inside_a_segmented_message_is_refused() {
    let mut victim = Victim::new();
    victim
        .deliver(&frame(FrameKind::First, (0, 0), &[1; 100], 1000))
        .expect("a first segment");
    let payload = packed_payload(&[(3, 0, b"abc")]);
    let error = victim
        .deliver(&frame(FrameKind::Packed, (0, 0), &payload, 1))
        .expect_err("out of order");
    assert!(
        matches!(
            &*error,
            ConnectionError::PeerProtocol(PeerViolation::Reassembly(_))
        ),
        "{error:?}"
    );
    assert!(victim.core.try_recv().is_none());
}
