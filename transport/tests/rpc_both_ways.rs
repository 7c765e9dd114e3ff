//! Two RPC peers on one connection over loopback, each sending requests to the other and
//! answering the other's, several in flight each way, on the `storage` ladder, with
//! messages from 512 B to 4 MiB so tiers rise and fall. Each user reads nothing while it
//! is sending a message (as a blocking `send` does), so delivered messages wait in the
//! connection, holding their receive slots. Both sides are driven from this thread, one
//! non-blocking step each per round, and every message is checked byte for byte; a run of
//! rounds with no delivery at all fails it, so a stall cannot pass for a slow run.
//! (`transport/tests/connection_core.rs` has the two smaller schedules that did stall:
//! users holding what they receive, and users sending at once without reading.)

mod traffic;

use std::collections::VecDeque;
use std::io::IoSlice;
use std::sync::Arc;
use std::time::Instant;

use tierbuf_pool::MemoryBudget;
use tierbuf_tiers::Reservoir;
use tierbuf_tiers::ladder::TierLadder;
use tierbuf_transport::connection::{Connection, ConnectionConfig, ConnectionCore, SendError};
use tierbuf_transport::{LoopbackEndpoint, LoopbackProvider, Provider};
use traffic::pattern;

const REQUEST: u8 = 1;
const REPLY: u8 = 2;

/// The length of message `index` of `kind` from side `from`: 512 B to 4 MiB, mostly small.
fn len_of(from: usize, kind: u8, index: u64) -> usize {
    const LENS: [usize; 8] = [512, 3000, 700, 70_000, 1500, 1 << 20, 900, 4 << 20];
    LENS[(index as usize * 3 + from * 5 + usize::from(kind)) % LENS.len()]
}

/// Message `index` of `kind` from side `from`: its kind and index in the first 9 bytes.
fn message(from: usize, kind: u8, index: u64) -> Vec<u8> {
    let mut bytes = pattern(
        len_of(from, kind, index),
        index * 4 + from as u64 * 2 + u64::from(kind),
    );
    bytes[0] = kind;
    bytes[1..9].copy_from_slice(&index.to_le_bytes());
    bytes
}

/// One user: requests it sends, replies it owes, the message it is sending.
struct Peer {
    connection: Connection<LoopbackEndpoint>,
    sending: Option<(Vec<u8>, usize)>,
    replies_owed: VecDeque<u64>,
    next_request: u64,
    in_flight: usize,
    replies_received: u64,
}

#[test]
fn rpc_peers_that_do_not_read_while_sending_never_stall() {
    const REQUESTS: u64 = 24;
    const WINDOW: usize = 3;
    let provider = LoopbackProvider::new(MemoryBudget::with_cap(256 << 20));
    let config =
        Arc::new(ConnectionConfig::new(Arc::new(TierLadder::preset("storage").unwrap())).unwrap());
    let reservoir = Arc::new(Reservoir::new(
        provider.registrar(),
        Arc::clone(config.ladder()),
    ));
    let (a, b) = provider
        .pair(config.queue_depth(), config.queue_depth())
        .unwrap();
    let peer = |endpoint| Peer {
        connection: Connection::new(
            ConnectionCore::new(
                Arc::clone(&config),
                Arc::clone(&reservoir),
                Arc::clone(&reservoir),
                Instant::now(),
            )
            .unwrap(),
            endpoint,
        )
        .unwrap(),
        sending: None,
        replies_owed: VecDeque::new(),
        next_request: 0,
        in_flight: 0,
        replies_received: 0,
    };
    let mut peers = [peer(a), peer(b)];
    let mut quiet_rounds = 0u32;
    while peers
        .iter()
        .any(|p| p.replies_received < REQUESTS || !p.replies_owed.is_empty())
    {
        let mut delivered = false;
        for (side, peer) in peers.iter_mut().enumerate() {
            if peer.sending.is_none() {
                while let Some(received) = peer.connection.try_recv().unwrap() {
                    let kind = received[0];
                    let index = u64::from_le_bytes(received[1..9].try_into().unwrap());
                    assert!(
                        received[..] == message(1 - side, kind, index)[..],
                        "side {side}: {kind} {index}"
                    );
                    delivered = true;
                    match kind {
                        REQUEST => peer.replies_owed.push_back(index),
                        _ => {
                            peer.replies_received += 1;
                            peer.in_flight -= 1;
                        }
                    }
                }
                if let Some(index) = peer.replies_owed.pop_front() {
                    peer.sending = Some((message(side, REPLY, index), 0));
                } else if peer.in_flight < WINDOW && peer.next_request < REQUESTS {
                    peer.sending = Some((message(side, REQUEST, peer.next_request), 0));
                    peer.next_request += 1;
                    peer.in_flight += 1;
                }
            }
            if let Some((bytes, offset)) = &mut peer.sending {
                match peer.connection.try_send(&[IoSlice::new(&bytes[*offset..])]) {
                    Ok(accepted) => *offset += accepted,
                    Err(SendError::WouldBlock(_)) => {}
                    Err(error) => panic!("side {side}: {error}"),
                }
                if *offset == bytes.len() {
                    peer.sending = None;
                }
            }
            peer.connection.progress().unwrap();
        }
        quiet_rounds = if delivered { 0 } else { quiet_rounds + 1 };
        assert!(
            quiet_rounds < 200_000,
            "stalled: {:?} / {:?}",
            peers[0].connection.stats(),
            peers[1].connection.stats()
        );
    }
    for peer in &peers {
        assert_eq!(peer.replies_received, REQUESTS);
    }
}
