//! The device-free part of verbs connection setup: the handshake codec, and the exchange
//! over TCP on 127.0.0.1 with well-behaved, malformed, truncated, silent and vanishing
//! peers. Needs no RDMA device.
#![cfg(feature = "verbs")]

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::thread;
use std::time::{Duration, Instant};

use tierbuf_tiers::TierIndex;
use tierbuf_transport::verbs::handshake::{
    HEADER_LEN, HandshakeError, HandshakeMessage, Hello, MAGIC, MAX_PAYLOAD_LEN, QueuePairAddress,
    VERSION, check_header, decode_frame, decode_payload, encode_frame,
};
use tierbuf_transport::verbs::rendezvous::{Rendezvous, RendezvousListener};

const TIMEOUT: Duration = Duration::from_secs(10);

fn hello(num: u32) -> Hello {
    Hello {
        queue_pair: QueuePairAddress {
            num,
            lid: (num % 0xffff) as u16,
            gid: None,
        },
        initial_tier: TierIndex::SMALLEST,
    }
}

fn roce_hello(num: u32) -> Hello {
    let with_gid = endpoint_with_gid();
    Hello {
        queue_pair: QueuePairAddress { num, ..with_gid },
        initial_tier: TierIndex::new(2),
    }
}

/// An endpoint with a GID, decoded from a frame whose GID bytes are set by hand: the
/// bytes every version of this handshake has sent for a RoCE queue pair.
fn endpoint_with_gid() -> QueuePairAddress {
    let plain = encode_frame(&HandshakeMessage::Hello(Hello {
        queue_pair: QueuePairAddress {
            num: 0,
            lid: 0,
            gid: None,
        },
        initial_tier: TierIndex::SMALLEST,
    }));
    // Payload: variant 0, num 0, lid 0, gid None (0), tier 0. Replace the `None` with
    // `Some` and sixteen bytes.
    let payload = &plain[HEADER_LEN..];
    assert_eq!(payload, [0, 0, 0, 0, 0]);
    let mut gid_payload = vec![0, 0, 0, 1];
    gid_payload.extend(0xf0..=0xffu8);
    gid_payload.push(0);
    match decode_payload(&gid_payload).unwrap() {
        HandshakeMessage::Hello(hello) => {
            let expected: [u8; 16] = std::array::from_fn(|byte| 0xf0 + byte as u8);
            assert_eq!(hello.queue_pair.gid, Some(expected.into()));
            hello.queue_pair
        }
        other => panic!("decoded {other:?}"),
    }
}

fn frame_with_payload(payload: &[u8]) -> Vec<u8> {
    let mut frame = MAGIC.to_vec();
    frame.extend_from_slice(&VERSION.to_be_bytes());
    frame.extend_from_slice(&(payload.len() as u16).to_be_bytes());
    frame.extend_from_slice(payload);
    frame
}

#[test]
fn every_message_survives_a_round_trip() {
    for message in [
        HandshakeMessage::Hello(hello(0)),
        HandshakeMessage::Hello(hello(u32::MAX)),
        HandshakeMessage::Hello(roce_hello(77)),
        HandshakeMessage::Ready,
    ] {
        let frame = encode_frame(&message);
        assert_eq!(frame[..4], MAGIC);
        assert_eq!(u16::from_be_bytes([frame[4], frame[5]]), VERSION);
        assert_eq!(
            usize::from(u16::from_be_bytes([frame[6], frame[7]])),
            frame.len() - HEADER_LEN
        );
        assert_eq!(decode_frame(&frame).unwrap(), message);
    }
}

#[test]
fn a_wrong_magic_is_refused_and_named() {
    let mut frame = encode_frame(&HandshakeMessage::Ready);
    frame[..4].copy_from_slice(b"GET ");
    let error = decode_frame(&frame).unwrap_err();
    assert!(matches!(error, HandshakeError::BadMagic { found } if &found == b"GET "));
    assert!(error.to_string().contains("not a tierbuf verbs endpoint"));
}

#[test]
fn another_version_is_refused_with_both_versions() {
    let mut frame = encode_frame(&HandshakeMessage::Ready);
    frame[4..6].copy_from_slice(&(VERSION + 1).to_be_bytes());
    let error = decode_frame(&frame).unwrap_err();
    assert!(matches!(
        error,
        HandshakeError::UnsupportedVersion { found, supported }
            if found == VERSION + 1 && supported == VERSION
    ));
    assert!(error.to_string().contains("same tierbuf release"));
}

#[test]
fn an_overlong_payload_is_refused_before_it_is_read() {
    let mut header = [0u8; HEADER_LEN];
    header[..4].copy_from_slice(&MAGIC);
    header[4..6].copy_from_slice(&VERSION.to_be_bytes());
    header[6..8].copy_from_slice(&(MAX_PAYLOAD_LEN + 1).to_be_bytes());
    assert!(matches!(
        check_header(header),
        Err(HandshakeError::PayloadTooLong { len, max })
            if len == MAX_PAYLOAD_LEN + 1 && max == MAX_PAYLOAD_LEN
    ));
    // Only the header is there: the length is refused, not waited for.
    assert!(matches!(
        decode_frame(&header),
        Err(HandshakeError::PayloadTooLong { .. })
    ));
}

#[test]
fn malformed_payloads_are_refused() {
    // An unknown message variant.
    assert!(matches!(
        decode_frame(&frame_with_payload(&[7])),
        Err(HandshakeError::Malformed { .. })
    ));
    // A hello cut short inside its queue-pair number.
    assert!(matches!(
        decode_frame(&frame_with_payload(&[0, 0x80])),
        Err(HandshakeError::Malformed { .. })
    ));
    // An empty payload.
    assert!(matches!(
        decode_frame(&frame_with_payload(&[])),
        Err(HandshakeError::Malformed { .. })
    ));
    // A GID option tag that is neither 0 nor 1.
    assert!(matches!(
        decode_frame(&frame_with_payload(&[0, 0, 0, 2, 0])),
        Err(HandshakeError::Malformed { .. })
    ));
}

#[test]
fn trailing_bytes_in_a_payload_or_after_a_frame_are_refused() {
    assert!(matches!(
        decode_frame(&frame_with_payload(&[1, 0])),
        Err(HandshakeError::TrailingBytes { extra: 1 })
    ));
    let mut two = encode_frame(&HandshakeMessage::Ready);
    two.extend(encode_frame(&HandshakeMessage::Ready));
    assert!(matches!(
        decode_frame(&two),
        Err(HandshakeError::TrailingBytes { .. })
    ));
}

#[test]
fn every_truncation_of_a_frame_is_a_peer_that_closed_mid_frame() {
    let frame = encode_frame(&HandshakeMessage::Hello(roce_hello(5)));
    for cut in 0..frame.len() {
        let error = decode_frame(&frame[..cut]).unwrap_err();
        match error {
            HandshakeError::PeerClosed {
                part,
                received,
                expected,
            } => {
                if cut < HEADER_LEN {
                    assert_eq!((part, received, expected), ("header", cut, HEADER_LEN));
                } else {
                    assert_eq!(
                        (part, received, expected),
                        ("payload", cut - HEADER_LEN, frame.len() - HEADER_LEN)
                    );
                }
            }
            other => panic!("cut at {cut}: {other:?}"),
        }
    }
}

/// A listener and a raw client socket connected to it.
fn raw_peer(timeout: Duration) -> (RendezvousListener, TcpStream) {
    let listener = RendezvousListener::bind("127.0.0.1:0", timeout).unwrap();
    let client = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
    (listener, client)
}

#[test]
fn two_sides_exchange_hellos_and_ready_over_tcp() {
    let listener = RendezvousListener::bind("127.0.0.1:0", TIMEOUT).unwrap();
    let addr = listener.local_addr().unwrap();
    let client = thread::spawn(move || {
        let mut rendezvous = Rendezvous::connect(addr, TIMEOUT).unwrap();
        let peer = rendezvous.exchange_hello(roce_hello(10)).unwrap();
        rendezvous.exchange_ready().unwrap();
        peer
    });
    let mut server = listener.accept().unwrap();
    let peer = server.exchange_hello(roce_hello(20)).unwrap();
    server.exchange_ready().unwrap();
    assert_eq!(peer, roce_hello(10));
    assert_eq!(client.join().unwrap(), roce_hello(20));
}

#[test]
fn a_listener_accepts_many_peers_each_with_its_own_hello() {
    const PEERS: u32 = 16;
    let listener = RendezvousListener::bind("127.0.0.1:0", TIMEOUT).unwrap();
    let addr = listener.local_addr().unwrap();
    let clients: Vec<_> = (0..PEERS)
        .map(|peer| {
            thread::spawn(move || {
                let mut rendezvous = Rendezvous::connect(addr, TIMEOUT).unwrap();
                let answer = rendezvous.exchange_hello(hello(peer)).unwrap();
                rendezvous.exchange_ready().unwrap();
                answer
            })
        })
        .collect();
    let mut seen = Vec::new();
    for _ in 0..PEERS {
        let mut accepted = listener.accept().unwrap();
        // The answer goes out before the peer is known, so every peer gets the same one;
        // the listener checks that it met every peer exactly once.
        let from = accepted.exchange_hello(hello(1000)).unwrap();
        accepted.exchange_ready().unwrap();
        seen.push(from.queue_pair.num);
    }
    for client in clients {
        assert_eq!(client.join().unwrap(), hello(1000));
    }
    seen.sort_unstable();
    assert_eq!(seen, (0..PEERS).collect::<Vec<_>>());
}

#[test]
fn a_peer_closing_mid_header_is_reported_with_the_bytes_received() {
    let (listener, mut client) = raw_peer(TIMEOUT);
    client.write_all(&MAGIC[..3]).unwrap();
    client.shutdown(Shutdown::Write).unwrap();
    let mut accepted = listener.accept().unwrap();
    let error = accepted.exchange_hello(hello(1)).unwrap_err();
    assert!(
        matches!(
            error,
            HandshakeError::PeerClosed {
                part: "header",
                received: 3,
                expected: HEADER_LEN
            }
        ),
        "{error:?}"
    );
    assert!(
        error
            .to_string()
            .contains("closed the connection during the handshake")
    );
}

#[test]
fn a_peer_closing_mid_payload_is_reported() {
    let (listener, mut client) = raw_peer(TIMEOUT);
    let frame = encode_frame(&HandshakeMessage::Hello(hello(9)));
    client.write_all(&frame[..frame.len() - 1]).unwrap();
    drop(client);
    let mut accepted = listener.accept().unwrap();
    assert!(matches!(
        accepted.exchange_hello(hello(1)),
        Err(HandshakeError::PeerClosed {
            part: "payload",
            ..
        })
    ));
}

#[test]
fn a_peer_closing_between_hello_and_ready_is_reported() {
    let (listener, mut client) = raw_peer(TIMEOUT);
    client
        .write_all(&encode_frame(&HandshakeMessage::Hello(hello(3))))
        .unwrap();
    let mut accepted = listener.accept().unwrap();
    assert_eq!(accepted.exchange_hello(hello(1)).unwrap(), hello(3));
    // The client reads the server's hello and leaves without saying it is ready.
    let mut answer = vec![0u8; encode_frame(&HandshakeMessage::Hello(hello(1))).len()];
    client.read_exact(&mut answer).unwrap();
    drop(client);
    assert!(matches!(
        accepted.exchange_ready(),
        Err(HandshakeError::PeerClosed {
            part: "header",
            received: 0,
            ..
        }) | Err(HandshakeError::Io { .. })
    ));
}

#[test]
fn a_peer_speaking_another_protocol_is_refused() {
    let (listener, mut client) = raw_peer(TIMEOUT);
    client.write_all(b"GET / HTTP/1.1\r\n\r\n").unwrap();
    let mut accepted = listener.accept().unwrap();
    assert!(matches!(
        accepted.exchange_hello(hello(1)),
        Err(HandshakeError::BadMagic { found }) if &found == b"GET "
    ));
}

#[test]
fn a_peer_of_another_version_is_refused() {
    let (listener, mut client) = raw_peer(TIMEOUT);
    let mut frame = encode_frame(&HandshakeMessage::Hello(hello(3)));
    frame[4..6].copy_from_slice(&2u16.to_be_bytes());
    client.write_all(&frame).unwrap();
    let mut accepted = listener.accept().unwrap();
    assert!(matches!(
        accepted.exchange_hello(hello(1)),
        Err(HandshakeError::UnsupportedVersion { found: 2, .. })
    ));
}

#[test]
fn a_ready_where_a_hello_is_due_is_refused() {
    let (listener, mut client) = raw_peer(TIMEOUT);
    client
        .write_all(&encode_frame(&HandshakeMessage::Ready))
        .unwrap();
    let mut accepted = listener.accept().unwrap();
    let error = accepted.exchange_hello(hello(1)).unwrap_err();
    assert!(matches!(
        error,
        HandshakeError::UnexpectedMessage {
            expected: "hello",
            found: "ready"
        }
    ));
}

#[test]
fn sides_starting_on_different_tiers_both_refuse() {
    let listener = RendezvousListener::bind("127.0.0.1:0", TIMEOUT).unwrap();
    let addr = listener.local_addr().unwrap();
    let client = thread::spawn(move || {
        let mut rendezvous = Rendezvous::connect(addr, TIMEOUT).unwrap();
        rendezvous.exchange_hello(hello(1))
    });
    let mut server = listener.accept().unwrap();
    let on_tier_two = roce_hello(2);
    let server_error = server.exchange_hello(on_tier_two).unwrap_err();
    assert!(matches!(
        server_error,
        HandshakeError::InitialTierMismatch { local, peer }
            if local == TierIndex::new(2) && peer == TierIndex::SMALLEST
    ));
    assert!(matches!(
        client.join().unwrap(),
        Err(HandshakeError::InitialTierMismatch { .. })
    ));
}

#[test]
fn a_silent_peer_times_out_with_the_timeout_named() {
    let timeout = Duration::from_millis(200);
    let (listener, _silent) = raw_peer(timeout);
    let started = Instant::now();
    let error = listener.accept().unwrap_err();
    assert!(started.elapsed() >= timeout);
    assert!(
        matches!(error, HandshakeError::TimedOut { part: "hello", timeout: named } if named == timeout),
        "{error:?}"
    );
    // The next peer is served.
    exchange_hellos_with_a_good_peer(&listener);
}

/// A well-behaved peer connects to `listener` and both sides exchange hellos.
fn exchange_hellos_with_a_good_peer(listener: &RendezvousListener) {
    let addr = listener.local_addr().unwrap();
    let good = thread::spawn(move || {
        let mut rendezvous = Rendezvous::connect(addr, TIMEOUT).unwrap();
        rendezvous.exchange_hello(hello(5)).unwrap()
    });
    let mut accepted = listener.accept().unwrap();
    assert_eq!(accepted.exchange_hello(hello(6)).unwrap(), hello(5));
    assert_eq!(good.join().unwrap(), hello(6));
}

#[test]
fn a_peer_that_stops_mid_hello_times_out_with_the_part_named() {
    let timeout = Duration::from_millis(200);
    let (listener, mut client) = raw_peer(timeout);
    client.write_all(&MAGIC[..3]).unwrap();
    let mut accepted = listener.accept().unwrap();
    let error = accepted.exchange_hello(hello(1)).unwrap_err();
    assert!(
        matches!(error, HandshakeError::TimedOut { part: "header", timeout: named } if named == timeout),
        "{error:?}"
    );
}

/// Peers that connect and say nothing come first; a peer behind them that says its hello
/// is handed out, not one of them. Handing out peers in the order they connected, a
/// listener gave the first silent one, whose handshake then waited for the whole timeout
/// (here an hour) while the others waited behind it.
#[test]
fn silent_peers_do_not_hold_up_one_that_speaks() {
    let listener = RendezvousListener::bind("127.0.0.1:0", Duration::from_secs(3600)).unwrap();
    let addr = listener.local_addr().unwrap();
    let silent: Vec<TcpStream> = (0..3).map(|_| TcpStream::connect(addr).unwrap()).collect();
    let speaker = thread::spawn(move || {
        let mut rendezvous = Rendezvous::connect(addr, TIMEOUT).unwrap();
        let answer = rendezvous.exchange_hello(hello(7)).unwrap();
        (rendezvous.local_addr().unwrap(), answer)
    });
    let mut accepted = listener.accept().unwrap();
    let peer = accepted.peer_addr().unwrap();
    assert!(
        silent
            .iter()
            .all(|stream| stream.local_addr().unwrap() != peer),
        "a silent peer was handed out"
    );
    assert_eq!(accepted.exchange_hello(hello(8)).unwrap(), hello(7));
    let (speaker_addr, answer) = speaker.join().unwrap();
    assert_eq!((speaker_addr, answer), (peer, hello(8)));
    // A silent peer that closes is handed out too: its handshake reports the close.
    drop(silent);
    let mut closed = listener.accept().unwrap();
    assert!(closed.exchange_hello(hello(9)).is_err());
}

#[test]
fn connecting_where_nobody_listens_fails_clearly() {
    // Bind and drop a listener so the port is (almost certainly) closed.
    let addr: SocketAddr = {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap()
    };
    let error = Rendezvous::connect(addr, TIMEOUT).unwrap_err();
    assert!(matches!(
        error,
        HandshakeError::Io {
            operation: "connecting to the peer",
            ..
        }
    ));
}

#[test]
fn a_failed_handshake_leaves_the_listener_accepting() {
    let listener = RendezvousListener::bind("127.0.0.1:0", TIMEOUT).unwrap();
    let addr = listener.local_addr().unwrap();
    let mut bad = TcpStream::connect(addr).unwrap();
    bad.write_all(b"junkjunk").unwrap();
    let mut first = listener.accept().unwrap();
    assert!(first.exchange_hello(hello(1)).is_err());
    exchange_hellos_with_a_good_peer(&listener);
}

/// Both sides of a handshake on `listener`, to its end: the accepted side and the
/// connected one.
fn handshake(listener: &RendezvousListener) -> (Rendezvous, Rendezvous) {
    let addr = listener.local_addr().unwrap();
    let client = thread::spawn(move || {
        let mut rendezvous = Rendezvous::connect(addr, TIMEOUT).unwrap();
        rendezvous.exchange_hello(hello(1)).unwrap();
        rendezvous.exchange_ready().unwrap();
        rendezvous
    });
    let mut accepted = listener.accept().unwrap();
    accepted.exchange_hello(hello(2)).unwrap();
    accepted.exchange_ready().unwrap();
    (accepted, client.join().unwrap())
}

#[test]
fn the_watch_sees_the_peer_close_or_vanish() {
    let listener = RendezvousListener::bind("127.0.0.1:0", TIMEOUT).unwrap();
    let (accepted, connected) = handshake(&listener);
    let mut watch = accepted.into_watch().unwrap();
    let mut peer = connected.into_watch().unwrap();
    assert!(!watch.peer_gone());
    assert!(!peer.peer_gone());

    peer.close();
    let deadline = Instant::now() + TIMEOUT;
    while !watch.peer_gone() {
        assert!(Instant::now() < deadline, "the close was never seen");
        thread::yield_now();
    }
    // Once gone, it stays gone; closing this side too is harmless.
    assert!(watch.peer_gone());
    watch.close();
    watch.close();

    // A peer that simply drops its socket is seen the same way.
    let (accepted, connected) = handshake(&listener);
    let mut watch = accepted.into_watch().unwrap();
    drop(connected);
    let deadline = Instant::now() + TIMEOUT;
    while !watch.peer_gone() {
        assert!(Instant::now() < deadline, "the drop was never seen");
        thread::yield_now();
    }
}
