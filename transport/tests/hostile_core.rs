//! A `ConnectionCore` against a hostile peer, at the sans-IO level, on a scripted test pair
//! (`transport/src/test_pair.rs`): the peer is nothing but the frames the test writes
//! into the core's posted receives, built by hand from the frame header's layout (`transport/src/connection/header.rs`: kind, grant tier, grant
//! count, payload length, message length, little-endian). Whatever the peer sends, the
//! core must neither panic nor grow without bound: it fails the connection with an error
//! that blames the peer and names what it did.

use std::io::IoSlice;
use std::sync::Arc;
use std::time::Duration;

use tierbuf_tiers::TierIndex;
use tierbuf_tiers::ladder::TierLadder;
use tierbuf_tiers::wire::{self, ControlMessage, Epoch};
use tierbuf_transport::connection::{
    ConnectionConfig, ConnectionError, Fault, FrameKind, HEADER_LEN, PeerViolation,
};
use tierbuf_transport::test_pair::Pair;

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

/// The side under attack, side 0 of a scripted pair, within a budget of 1 MiB. Its sends
/// are never carried out (the peer does not read) unless the test takes them off the wire.
fn new_victim() -> Pair {
    Pair::scripted(ConnectionConfig::new(ladder()).unwrap(), 1 << 20)
}

/// Writes the peer's `frame` into the victim's oldest posted receive and completes it, a
/// microsecond on, as a provider would; then lets the core make progress.
fn deliver(victim: &mut Pair, frame: &[u8]) -> Result<(), Arc<ConnectionError>> {
    let receive = victim.posted_recvs(0).next().expect("a posted receive");
    assert!(
        frame.len() <= receive.len as usize,
        "the test overran a receive"
    );
    victim.now += Duration::from_micros(1);
    let landed = victim.forge(0, frame, None).expect("a posted receive");
    victim.progress(0);
    landed.result
}

/// The peer takes every frame the victim sent, completing its sends, and lets the victim
/// make progress after each; returns how many of them were drains.
fn take_sent(victim: &mut Pair) -> usize {
    let mut drains = 0;
    while let Some(taken) = victim.take(0) {
        taken.result.expect("a send completes");
        drains += usize::from(taken.frame[0] == FrameKind::Drain as u8);
        victim.progress(0);
    }
    drains
}

/// Credit frames that each grant 65 535 receives: more than the peer could ever have
/// posted. Summed they passed 32 bits and the addition panicked; now the first grant past
/// what the ladder lets the peer post fails the connection, naming the grant.
#[test]
fn grants_past_the_receives_a_peer_can_post_are_a_violation_not_an_overflow() {
    let mut victim = new_victim();
    let credit = frame(FrameKind::Credit, (0, u16::MAX), &[], 0);
    let mut outcome = Ok(());
    for _ in 0..70_000 {
        outcome = deliver(&mut victim, &credit);
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
    assert!(victim.stats(0).send_credits <= u64::from(*limit));
}

/// Grants alternating between two tiers, one receive each, would make a run per frame; the
/// same bound stops them before the list of runs grows past it.
#[test]
fn alternating_small_grants_are_bounded_too() {
    let mut victim = new_victim();
    let mut outcome = Ok(());
    for index in 0..1000u32 {
        let credit = frame(FrameKind::Credit, ((index % 2) as u8, 1), &[], 0);
        outcome = deliver(&mut victim, &credit);
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
    assert!(victim.stats(0).send_credits <= 2 * (16 + 16));
}

/// A grant the peer could have made is still taken: the bound is not a cap on honest
/// credits.
#[test]
fn grants_within_what_the_peer_can_post_are_taken() {
    let mut victim = new_victim();
    let before = victim.stats(0);
    deliver(&mut victim, &frame(FrameKind::Credit, (1, 4), &[], 0)).unwrap();
    deliver(&mut victim, &frame(FrameKind::Credit, (0, 4), &[], 0)).unwrap();
    let after = victim.stats(0);
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
    let mut victim = new_victim();
    let request = control(ControlMessage::Request {
        epoch: Epoch::new(1),
        tier: TierIndex::new(1),
        current: Epoch::INITIAL,
    });
    let mut most_waiting = 0;
    for _ in 0..100_000 {
        deliver(&mut victim, &request).expect("a repeated request is no violation");
        most_waiting = most_waiting.max(victim.stats(0).control_frames_waiting);
    }
    let stats = victim.stats(0);
    assert_eq!(stats.recv_tier, 1, "the request was provisioned once");
    assert_eq!(stats.send_credits, 0, "the peer granted nothing");
    assert!(most_waiting <= 1, "{most_waiting} control frames waited");
    assert!(victim.failure(0).is_none());
}

/// Requests of ever newer epochs, each refused (a tier past the ladder), from a peer that
/// grants no credit: each answer makes the one before it moot, so one waits at most.
#[test]
fn answers_to_newer_requests_replace_the_ones_still_waiting() {
    let mut victim = new_victim();
    let mut most_waiting = 0;
    for epoch in 1..=20_000 {
        let request = control(ControlMessage::Request {
            epoch: Epoch::new(epoch),
            tier: TierIndex::new(9),
            current: Epoch::INITIAL,
        });
        deliver(&mut victim, &request).expect("a request past the ladder is nacked");
        most_waiting = most_waiting.max(victim.stats(0).control_frames_waiting);
    }
    assert!(most_waiting <= 1, "{most_waiting} control frames waited");
    assert!(victim.failure(0).is_none());
}

/// What this side asks on its own account still needs credits: a peer that never grants
/// one while this side keeps asking for a promotion (each request given up after its
/// attempts and asked again later) fails the connection once the waiting control frames
/// pass the limit, blaming the peer, instead of queueing them without end.
#[test]
fn control_frames_waiting_past_the_limit_fail_the_connection() {
    let mut victim = new_victim();
    let mut most_waiting = 0;
    let error = loop {
        // A message built in place needs tier 1: it asks for it (or the refusal holds).
        let _ = victim.try_reserve(0, 4000);
        for _ in 0..8 {
            victim.now += Duration::from_secs(1);
            victim.progress(0);
        }
        most_waiting = most_waiting.max(victim.stats(0).control_frames_waiting);
        if let Some(error) = victim.failure(0) {
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
    let mut victim = new_victim();
    deliver(&mut victim, &open_a_message).expect("a first segment");
    deliver(&mut victim, &request).expect("a request");
    assert_eq!(victim.stats(0).recv_tier, 0, "held behind the message");
    let due = victim
        .core(0)
        .poll_timeout()
        .expect("the hold's end is a timer");
    assert!(due <= victim.now + Duration::from_micros(250), "{due:?}");
    victim.now = due;
    victim.progress(0);
    assert_eq!(
        victim.stats(0).recv_tier,
        1,
        "answered when the hold was up"
    );

    // Bounded in count: requests repeated within the hold's time.
    let mut victim = new_victim();
    deliver(&mut victim, &open_a_message).expect("a first segment");
    for held in 1..16 {
        deliver(&mut victim, &request).expect("a request");
        assert_eq!(victim.stats(0).recv_tier, 0, "{held} held");
    }
    deliver(&mut victim, &request).expect("a request");
    assert_eq!(victim.stats(0).recv_tier, 1, "answered once 16 waited");
    assert!(victim.failure(0).is_none());
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
    let mut victim = new_victim();
    let allowance = ConnectionConfig::new(ladder()).unwrap().max_send_credits() as usize;
    // The peer takes (completes) every frame the victim sends; `drains` counts the drains.
    let mut drains = 0;
    // An 8 KiB message needs tier 1: it asks for it and goes out in segments on tier 0,
    // on the tier-0 receives the peer grants as they are used.
    let message = vec![3u8; 8 << 10];
    victim
        .try_send(0, &[IoSlice::new(&message)])
        .expect("a send the credits allow");
    drains += take_sent(&mut victim);
    deliver(&mut victim, &frame(FrameKind::Credit, (0, 4), &[], 0)).expect("a tier-0 grant");
    drains += take_sent(&mut victim);
    // The peer never answers: the request is given up.
    let deadline = victim.now + Duration::from_secs(600);
    while victim.stats(0).tiers.timeouts == 0 {
        assert!(victim.now < deadline, "the request was never given up");
        victim.now += Duration::from_millis(100);
        victim.progress(0);
        drains += take_sent(&mut victim);
    }
    assert_eq!(victim.stats(0).send_tier, 0);
    let drains_before = drains;

    let mut outcome = Ok(());
    for _ in 0..1000 {
        outcome = deliver(&mut victim, &frame(FrameKind::Credit, (1, 1), &[], 0));
        drains += take_sent(&mut victim);
        if outcome.is_err() {
            break;
        }
    }
    let drains = drains - drains_before;
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
    let mut victim = new_victim();
    let good = packed_payload(&[(3, 0, b"abc"), (0, 0, b""), (8, 0, b"12345678")]);
    deliver(&mut victim, &frame(FrameKind::Packed, (0, 0), &good, 3))
        .expect("a well-formed packed frame");
    let delivered: Vec<Vec<u8>> = std::iter::from_fn(|| victim.try_recv(0))
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
        let mut victim = new_victim();
        let error = deliver(
            &mut victim,
            &frame(FrameKind::Packed, (0, 0), payload, count),
        )
        .expect_err(what);
        assert_eq!(error.fault(), Fault::Peer, "{what}: {error}");
        assert!(
            matches!(
                &*error,
                ConnectionError::PeerProtocol(PeerViolation::Packed(_))
            ),
            "{what}: {error:?}"
        );
        assert!(victim.try_recv(0).is_none(), "{what}: nothing delivered");
    }
    // A count the payload cannot hold is refused by the header.
    let mut victim = new_victim();
    let error = deliver(&mut victim, &frame(FrameKind::Packed, (0, 0), &trailing, 5))
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
    let mut victim = new_victim();
    deliver(
        &mut victim,
        &frame(FrameKind::First, (0, 0), &[1; 100], 1000),
    )
    .expect("a first segment");
    let payload = packed_payload(&[(3, 0, b"abc")]);
    let error = deliver(&mut victim, &frame(FrameKind::Packed, (0, 0), &payload, 1))
        .expect_err("out of order");
    assert!(
        matches!(
            &*error,
            ConnectionError::PeerProtocol(PeerViolation::Reassembly(_))
        ),
        "{error:?}"
    );
    assert!(victim.try_recv(0).is_none());
}
