//! The verbs provider on an RDMA device: a NIC, or soft-RoCE (`rdma link add rxe0 type
//! rxe netdev eth0`). The tests that need one are ignored by default; run them with
//!
//! ```text
//! TIERBUF_VERBS_DEVICE=rxe0 cargo test -p tierbuf-transport --features verbs -- --ignored
//! ```
//!
//! (`TIERBUF_VERBS_GID_INDEX` picks a GID entry; unset, the provider takes the first RoCE
//! v2 entry, or routes by LID on InfiniBand). Where no device can be found, each prints
//! why it skips and passes.
#![cfg(feature = "verbs")]

mod pairs;

use pairs::Shared;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use sideway::ibverbs::device::{DeviceInfo, DeviceList};
use tierbuf_pool::{MemoryBudget, OwnedSlot, SlotPool};
use tierbuf_transport::verbs::{
    EndpointOptions, Exposures, MAX_QUEUE_DEPTH, VerbsConfig, VerbsEndpoint, VerbsError,
    VerbsProvider, ibv_wc_status,
};
use tierbuf_transport::{
    Access, BufferRef, Completion, CompletionStatus, Endpoint, EndpointState, Opcode, PostError,
    Provider, QueueKind,
};

const DEVICE_VARIABLE: &str = "TIERBUF_VERBS_DEVICE";
const GID_INDEX_VARIABLE: &str = "TIERBUF_VERBS_GID_INDEX";
/// How long a test waits for completions it expects: far longer than a device takes,
/// soft-RoCE under an emulated CPU (`.ci/verbs-rxe`) included, so only a lost request
/// fails a test.
const WAIT: Duration = Duration::from_secs(120);

/// The names of the devices present, or `None` (with the reason printed) when no device
/// can be found here.
fn devices_present() -> Option<Vec<String>> {
    let list = match DeviceList::new() {
        Ok(list) => list,
        Err(error) => {
            println!(
                "skipped: no RDMA devices can be listed on this machine ({error}); \
                 see docs/verbs.md for soft-RoCE"
            );
            return None;
        }
    };
    let names: Vec<String> = list.iter().map(|device| device.name()).collect();
    if names.is_empty() {
        println!("skipped: no RDMA device found; see docs/verbs.md for soft-RoCE");
        return None;
    }
    Some(names)
}

/// A provider on the device `TIERBUF_VERBS_DEVICE` names (else the first one present),
/// or `None` when there is none.
fn provider(budget: &MemoryBudget) -> Option<VerbsProvider> {
    let names = devices_present()?;
    let name = std::env::var(DEVICE_VARIABLE).unwrap_or_else(|_| {
        println!(
            "{DEVICE_VARIABLE} is not set; using {} of {names:?}",
            names[0]
        );
        names[0].clone()
    });
    let mut config = VerbsConfig::new(name);
    if let Ok(index) = std::env::var(GID_INDEX_VARIABLE) {
        let index = index
            .parse()
            .unwrap_or_else(|_| panic!("{GID_INDEX_VARIABLE}={index:?} is not a number"));
        config = config.with_gid_index(index);
    }
    match VerbsProvider::open(&config, budget.clone()) {
        Ok(provider) => Some(provider),
        Err(error) => panic!("opening {}: {error}", config.device()),
    }
}

fn options() -> EndpointOptions {
    EndpointOptions {
        send_depth: 16,
        recv_depth: 16,
        ..EndpointOptions::default()
    }
}

/// Polls `endpoint` until it has returned `count` completions.
fn wait_for(endpoint: &mut VerbsEndpoint, count: usize) -> Vec<Completion> {
    let deadline = Instant::now() + WAIT;
    let mut buffer = [Completion::default(); 16];
    let mut taken = Vec::new();
    while taken.len() < count {
        let ready = endpoint.poll(&mut buffer).expect("poll");
        taken.extend_from_slice(&buffer[..ready]);
        assert!(
            Instant::now() < deadline,
            "only {taken:?} of {count} completions came"
        );
    }
    assert_eq!(
        taken.len(),
        count,
        "more completions than requests: {taken:?}"
    );
    taken
}

fn slot(pool: &SlotPool) -> OwnedSlot {
    pool.try_acquire_owned().expect("a free slot")
}

#[test]
#[ignore = "needs an RDMA device (TIERBUF_VERBS_DEVICE)"]
fn a_port_the_device_lacks_is_refused_with_the_ports_it_has() {
    let budget = MemoryBudget::with_cap(1 << 20);
    let Some(provider) = provider(&budget) else {
        return;
    };
    let device = provider.device_name().to_owned();
    let error = VerbsProvider::open(&VerbsConfig::new(&device).with_port(200), budget.clone())
        .expect_err("no device here has 200 ports");
    println!("{error}");
    match error {
        VerbsError::PortOutOfRange {
            device: named,
            port,
            ports,
        } => {
            assert_eq!((named, port), (device.clone(), 200));
            assert!((1..200).contains(&ports), "{ports} ports");
        }
        other => panic!("{other:?}"),
    }
    assert!(matches!(
        VerbsProvider::open(&VerbsConfig::new(&device).with_port(0), budget),
        Err(VerbsError::PortOutOfRange { port: 0, .. })
    ));
    assert_eq!(provider.path().port, 1);
}

#[test]
#[ignore = "needs an RDMA device (TIERBUF_VERBS_DEVICE)"]
fn a_queue_deeper_than_the_device_takes_is_refused_and_its_deepest_is_taken() {
    let budget = MemoryBudget::with_cap(16 << 20);
    let Some(provider) = provider(&budget) else {
        return;
    };
    let device = provider.device_name().to_owned();
    let max = provider.max_queue_depth();
    assert!((1..=MAX_QUEUE_DEPTH).contains(&max), "{max}");
    if max < MAX_QUEUE_DEPTH {
        let past = |options: EndpointOptions, queue: QueueKind, error: VerbsError| {
            println!("{error}");
            assert!(error.to_string().contains("max_qp_wr"), "{error}");
            match error {
                VerbsError::DepthPastDevice {
                    device: named,
                    queue: refused,
                    depth,
                    max: said,
                } => {
                    assert_eq!((named, refused, said), (device.clone(), queue, max));
                    let asked = match queue {
                        QueueKind::Send => options.send_depth,
                        QueueKind::Recv => options.recv_depth,
                    };
                    assert_eq!(depth, asked);
                }
                other => panic!("{other:?}"),
            }
        };
        let deep_receives = EndpointOptions {
            recv_depth: max + 1,
            ..options()
        };
        let error = provider
            .listen((Ipv4Addr::LOCALHOST, 0), deep_receives)
            .expect_err("a receive queue past the device's");
        past(deep_receives, QueueKind::Recv, error);
        // Refused before any connection is tried: nothing listens at this address.
        let deep_sends = EndpointOptions {
            send_depth: max + 1,
            ..options()
        };
        let nowhere = SocketAddr::from((Ipv4Addr::LOCALHOST, 9));
        let error = provider
            .connect(nowhere, &deep_sends)
            .expect_err("a send queue past the device's");
        past(deep_sends, QueueKind::Send, error);
    } else {
        println!("{device} takes queues of {MAX_QUEUE_DEPTH}: no depth of ours is past it");
    }
    let deepest = EndpointOptions {
        send_depth: max,
        recv_depth: max,
        ..options()
    };
    let (a, b) = provider
        .pair(&deepest)
        .expect("queues as deep as the device takes");
    for endpoint in [&a, &b] {
        let limits = endpoint.limits();
        assert_eq!((limits.send_depth, limits.recv_depth), (max, max));
    }
}

#[test]
fn opening_a_missing_device_says_what_is_there() {
    let budget = MemoryBudget::with_cap(1 << 20);
    let error = VerbsProvider::open(&VerbsConfig::new("tierbuf-no-such-device"), budget)
        .expect_err("no device has this name");
    println!("{error}");
    match DeviceList::new() {
        Err(_) => assert!(
            matches!(error, VerbsError::DevicesUnavailable { .. }),
            "{error:?}"
        ),
        Ok(list) if list.is_empty() => assert!(matches!(error, VerbsError::NoDevices)),
        Ok(list) => match error {
            VerbsError::DeviceNotFound { name, found } => {
                assert_eq!(name, "tierbuf-no-such-device");
                assert_eq!(found.len(), list.len());
            }
            other => panic!("{other:?}"),
        },
    }
}

/// The descriptors this process has open.
fn open_descriptors() -> usize {
    std::fs::read_dir("/proc/self/fd")
        .expect("/proc/self/fd")
        .count()
}

/// What the front door counts against the open-file limit for a verbs connection
/// (`transport/src/front/verbs.rs`): its handshake socket, its completion channel and the
/// `epoll` set of the two. Run alone (`--test-threads=1`, as `.ci/verbs-rxe` does), since
/// other tests' descriptors would count too.
#[test]
#[ignore = "needs an RDMA device (TIERBUF_VERBS_DEVICE)"]
fn an_endpoint_holds_three_descriptors_and_gives_them_back() {
    let budget = MemoryBudget::with_cap(16 << 20);
    let Some(provider) = provider(&budget) else {
        return;
    };
    let before = open_descriptors();
    let (a, b) = provider.pair(&options()).unwrap();
    assert_eq!(open_descriptors(), before + 2 * 3);
    drop((a, b));
    assert_eq!(open_descriptors(), before);
}

#[test]
#[ignore = "needs an RDMA device (TIERBUF_VERBS_DEVICE)"]
fn a_pair_on_one_device_is_connected_queue_pair_to_queue_pair() {
    let budget = MemoryBudget::with_cap(16 << 20);
    let Some(provider) = provider(&budget) else {
        return;
    };
    let (a, b) = provider.pair(&options()).unwrap();
    assert_eq!(a.peer_queue_pair(), b.local_queue_pair());
    assert_eq!(b.peer_queue_pair(), a.local_queue_pair());
    assert_ne!(a.local_queue_pair().num, b.local_queue_pair().num);
    for endpoint in [&a, &b] {
        assert_eq!(endpoint.state(), EndpointState::Open);
        assert_eq!(endpoint.device_name(), provider.device_name());
        let limits = endpoint.limits();
        assert_eq!(
            (limits.send_depth, limits.recv_depth, limits.max_gather),
            (16, 16, 1)
        );
    }
}

#[test]
#[ignore = "needs an RDMA device (TIERBUF_VERBS_DEVICE)"]
fn a_message_goes_there_and_an_answer_comes_back() {
    let budget = MemoryBudget::with_cap(16 << 20);
    let Some(provider) = provider(&budget) else {
        return;
    };
    let pool = SlotPool::new(&*provider.registrar(), 4096, 4).unwrap();
    let (mut client, mut server) = provider.pair(&options()).unwrap();
    let (mut request, server_inbox) = (slot(&pool), slot(&pool));
    let (mut answer, client_inbox) = (slot(&pool), slot(&pool));
    request[..4].copy_from_slice(b"ping");
    // SAFETY: no slot is touched until its completion is polled.
    unsafe {
        server.post_recv(BufferRef::from(&server_inbox), 1).unwrap();
        client.post_recv(BufferRef::from(&client_inbox), 2).unwrap();
        client
            .post_send(&[BufferRef::from(&request).prefix(4).unwrap()], 3)
            .unwrap();
    }
    let received = wait_for(&mut server, 1)[0];
    assert_eq!(
        (
            received.wr_id,
            received.byte_len,
            received.status,
            received.opcode
        ),
        (1, 4, CompletionStatus::Success, Opcode::Recv)
    );
    assert_eq!(&server_inbox[..4], b"ping");
    answer[..4].copy_from_slice(b"pong");
    answer[4..4096].fill(0x5a);
    // SAFETY: as above.
    unsafe { server.post_send(&[BufferRef::from(&answer)], 4).unwrap() };
    let mut at_client = wait_for(&mut client, 2);
    at_client.sort_by_key(|completion| completion.wr_id);
    assert_eq!((at_client[0].wr_id, at_client[0].byte_len), (2, 4096));
    assert_eq!((at_client[1].wr_id, at_client[1].opcode), (3, Opcode::Send));
    assert!(
        at_client
            .iter()
            .all(|completion| completion.status.is_success())
    );
    assert_eq!(&client_inbox[..4], b"pong");
    assert!(client_inbox[4..].iter().all(|&byte| byte == 0x5a));
    let sent = wait_for(&mut server, 1)[0];
    assert_eq!((sent.wr_id, sent.status), (4, CompletionStatus::Success));
    assert_eq!(client.outstanding().sends + client.outstanding().recvs, 0);
}

#[test]
#[ignore = "needs an RDMA device (TIERBUF_VERBS_DEVICE)"]
fn a_send_with_no_receive_waits_and_an_empty_message_arrives() {
    let budget = MemoryBudget::with_cap(16 << 20);
    let Some(provider) = provider(&budget) else {
        return;
    };
    let pool = SlotPool::new(&*provider.registrar(), 4096, 2).unwrap();
    let (mut sender, mut receiver) = provider.pair(&options()).unwrap();
    // SAFETY: nothing is written to the empty message.
    unsafe { sender.post_send(&[], 7).unwrap() };
    let mut completions = [Completion::default(); 4];
    for _ in 0..1000 {
        // Without a posted receive the send cannot complete: it waits (RNR retry forever).
        assert_eq!(sender.poll(&mut completions).unwrap(), 0);
    }
    let inbox = slot(&pool);
    // SAFETY: the slot is not touched until its completion is polled.
    unsafe { receiver.post_recv(BufferRef::from(&inbox), 8).unwrap() };
    let received = wait_for(&mut receiver, 1)[0];
    assert_eq!(
        (received.wr_id, received.byte_len, received.status),
        (8, 0, CompletionStatus::Success)
    );
    let sent = wait_for(&mut sender, 1)[0];
    assert_eq!((sent.wr_id, sent.status), (7, CompletionStatus::Success));
}

#[test]
#[ignore = "needs an RDMA device (TIERBUF_VERBS_DEVICE)"]
fn keys_bounds_gathers_and_depths_are_checked_when_posting() {
    let budget = MemoryBudget::with_cap(16 << 20);
    let Some(provider) = provider(&budget) else {
        return;
    };
    let pool = SlotPool::new(&*provider.registrar(), 4096, 4).unwrap();
    let (mut a, _b) = provider
        .pair(&EndpointOptions {
            send_depth: 1,
            recv_depth: 2,
            ..EndpointOptions::default()
        })
        .unwrap();
    let buffer = slot(&pool);
    let whole = BufferRef::from(&buffer);
    let region = pool.keys();
    let region_len = pool.region_len();
    // SAFETY: every post below that succeeds names a slot left alone until the endpoint
    // is dropped; the refused ones post nothing.
    unsafe {
        let unknown = BufferRef {
            remote_key: whole.remote_key ^ 0x5a5a_0000,
            ..whole
        };
        assert_eq!(
            a.post_recv(unknown, 1),
            Err(PostError::UnknownKey {
                remote_key: unknown.remote_key
            })
        );
        let before = BufferRef {
            addr: region.remote_addr - 1,
            len: 1,
            ..whole
        };
        assert!(matches!(
            a.post_recv(before, 1),
            Err(PostError::OutOfBounds { .. })
        ));
        let past = BufferRef {
            addr: region.remote_addr + region_len as u64 - 8,
            len: 9,
            ..whole
        };
        assert!(matches!(
            a.post_send(&[past], 1),
            Err(PostError::OutOfBounds { region_len: len, .. }) if len == region_len
        ));
        assert_eq!(
            a.post_send(&[whole, whole], 1),
            Err(PostError::TooManyBuffers { given: 2, max: 1 })
        );
        assert_eq!(a.outstanding().sends + a.outstanding().recvs, 0);

        let second = slot(&pool);
        a.post_recv(whole, 1).unwrap();
        a.post_recv(BufferRef::from(&second), 2).unwrap();
        let third = slot(&pool);
        assert!(matches!(
            a.post_recv(BufferRef::from(&third), 3),
            Err(PostError::QueueFull { depth: 2, .. })
        ));
        let fourth = slot(&pool);
        a.post_send(&[BufferRef::from(&fourth)], 4).unwrap();
        assert!(matches!(
            a.post_send(&[BufferRef::from(&third)], 5),
            Err(PostError::QueueFull { depth: 1, .. })
        ));
        drop(a);
    }
}

#[test]
#[ignore = "needs an RDMA device (TIERBUF_VERBS_DEVICE)"]
fn a_message_longer_than_its_receive_fails_both_sides_and_breaks_the_connection() {
    let budget = MemoryBudget::with_cap(16 << 20);
    let Some(provider) = provider(&budget) else {
        return;
    };
    let pool = SlotPool::new(&*provider.registrar(), 4096, 4).unwrap();
    let (mut sender, mut receiver) = provider.pair(&options()).unwrap();
    let (mut message, mut inbox) = (slot(&pool), slot(&pool));
    message.fill(0x11);
    inbox.fill(0xEE);
    // SAFETY: neither slot is touched until its completion is polled.
    unsafe {
        receiver
            .post_recv(BufferRef::from(&inbox).prefix(100).unwrap(), 1)
            .unwrap();
        sender
            .post_send(&[BufferRef::from(&message).prefix(200).unwrap()], 2)
            .unwrap();
    }
    // Both sides fail. NICs report a length error at the receiver and an invalid request
    // at the sender; soft-RoCE fails the receive as a local operation error, and the
    // sender sees the peer's operation fail. Either way the device's own status is kept.
    let received = wait_for(&mut receiver, 1)[0];
    assert_eq!((received.wr_id, received.byte_len), (1, 0));
    let failure = receiver.failure().expect("the receive's failure is kept");
    println!("receiver: {failure}");
    assert_eq!((failure.wr_id, failure.status), (1, received.status));
    match failure.status {
        CompletionStatus::LocalLengthError => {
            assert_eq!(failure.device_status, ibv_wc_status::IBV_WC_LOC_LEN_ERR)
        }
        CompletionStatus::LocalOperationError => {
            assert_eq!(failure.device_status, ibv_wc_status::IBV_WC_LOC_QP_OP_ERR)
        }
        other => panic!("the receive failed with {other:?}: {failure}"),
    }
    let sent = wait_for(&mut sender, 1)[0];
    let failure = sender.failure().expect("the send's failure is kept");
    println!("sender: {failure}");
    assert_eq!((sent.wr_id, sent.status), (2, failure.status));
    assert!(
        matches!(
            failure.status,
            CompletionStatus::RemoteInvalidRequest | CompletionStatus::RemoteOperationError
        ),
        "the send failed with {failure}"
    );
    // The connection is broken on both sides.
    assert_eq!(receiver.state(), EndpointState::Broken);
    assert_eq!(sender.state(), EndpointState::Broken);
    // SAFETY: refused, nothing is posted.
    unsafe {
        assert_eq!(
            sender.post_send(&[BufferRef::from(&message)], 3),
            Err(PostError::ConnectionBroken)
        );
        assert_eq!(
            receiver.post_recv(BufferRef::from(&inbox), 4),
            Err(PostError::ConnectionBroken)
        );
    }
    drop((sender, receiver));
    // Memory is not corrupted: nothing past the receive buffer was written, and the
    // message is as it was sent.
    assert!(
        inbox[100..].iter().all(|&byte| byte == 0xEE),
        "bytes past the receive buffer were written"
    );
    assert!(message.iter().all(|&byte| byte == 0x11));
}

#[test]
#[ignore = "needs an RDMA device (TIERBUF_VERBS_DEVICE)"]
fn closing_flushes_both_sides_and_refuses_later_posts() {
    let budget = MemoryBudget::with_cap(16 << 20);
    let Some(provider) = provider(&budget) else {
        return;
    };
    let pool = SlotPool::new(&*provider.registrar(), 4096, 4).unwrap();
    let (mut a, mut b) = provider.pair(&options()).unwrap();
    let slots: Vec<OwnedSlot> = (0..4).map(|_| slot(&pool)).collect();
    // SAFETY: the slots are left alone until their completions come back or the
    // endpoints are closed.
    unsafe {
        a.post_recv(BufferRef::from(&slots[0]), 10).unwrap();
        a.post_recv(BufferRef::from(&slots[1]), 11).unwrap();
        b.post_recv(BufferRef::from(&slots[2]), 20).unwrap();
        b.post_recv(BufferRef::from(&slots[3]), 21).unwrap();
    }
    a.close();
    assert_eq!(a.state(), EndpointState::Closed);
    let flushed = wait_for(&mut a, 2);
    assert_eq!(
        flushed
            .iter()
            .map(|completion| (completion.wr_id, completion.status))
            .collect::<Vec<_>>(),
        [
            (10, CompletionStatus::Flushed),
            (11, CompletionStatus::Flushed)
        ]
    );
    // The peer learns of the close through the connection socket while it polls.
    let flushed = wait_for(&mut b, 2);
    assert!(
        flushed
            .iter()
            .all(|completion| completion.status == CompletionStatus::Flushed)
    );
    assert_eq!(b.state(), EndpointState::PeerClosed);
    // SAFETY: refused, nothing is posted.
    unsafe {
        assert_eq!(
            a.post_recv(BufferRef::from(&slots[0]), 12),
            Err(PostError::Closed)
        );
        assert_eq!(
            b.post_recv(BufferRef::from(&slots[2]), 22),
            Err(PostError::PeerClosed)
        );
    }
    a.close();
    assert_eq!(a.state(), EndpointState::Closed);
}

#[test]
#[ignore = "needs an RDMA device (TIERBUF_VERBS_DEVICE)"]
fn a_listener_accepts_many_endpoints() {
    const PEERS: u64 = 4;
    let budget = MemoryBudget::with_cap(16 << 20);
    let Some(provider) = provider(&budget) else {
        return;
    };
    let pool = SlotPool::new(&*provider.registrar(), 4096, 2 * PEERS as usize).unwrap();
    let listener = provider.listen("127.0.0.1:0", options()).unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::scope(|scope| {
        for peer in 0..PEERS {
            let (provider, pool) = (&provider, &pool);
            scope.spawn(move || {
                let mut endpoint = provider.connect(addr, &options()).unwrap();
                let mut message = slot(pool);
                message[..8].copy_from_slice(&peer.to_le_bytes());
                // SAFETY: the slot is left alone until its completion is polled.
                unsafe {
                    endpoint
                        .post_send(&[BufferRef::from(&message).prefix(8).unwrap()], peer)
                        .unwrap()
                };
                assert!(wait_for(&mut endpoint, 1)[0].status.is_success());
            });
        }
        let mut seen = Vec::new();
        for _ in 0..PEERS {
            let mut endpoint = listener.accept().unwrap();
            let inbox = slot(&pool);
            // SAFETY: the slot is left alone until its completion is polled.
            unsafe { endpoint.post_recv(BufferRef::from(&inbox), 0).unwrap() };
            let received = wait_for(&mut endpoint, 1)[0];
            assert_eq!(
                (received.status, received.byte_len),
                (CompletionStatus::Success, 8)
            );
            seen.push(u64::from_le_bytes(inbox[..8].try_into().unwrap()));
        }
        seen.sort_unstable();
        assert_eq!(seen, (0..PEERS).collect::<Vec<_>>());
    });
}

#[test]
#[ignore = "needs an RDMA device (TIERBUF_VERBS_DEVICE)"]
fn a_connection_promotes_segments_and_reads_over_verbs() {
    let budget = MemoryBudget::with_cap(64 << 20);
    let Some(provider) = provider(&budget) else {
        return;
    };
    let ladder = Arc::new(pairs::three_tiers().build().unwrap());
    let shared = Shared::new(&provider, ladder);
    let (a, b) = provider
        .pair(&EndpointOptions {
            send_depth: 32,
            recv_depth: 32,
            ..EndpointOptions::default()
        })
        .unwrap();
    let mut sender = shared.connection(a);
    let mut receiver = shared.connection(b);
    let messages: Vec<Vec<u8>> = [10usize, 200, 3000, 60_000, 200_000, 5]
        .iter()
        .enumerate()
        .map(|(index, &len)| (0..len).map(|byte| (byte * 31 + index) as u8).collect())
        .collect();
    let expected = messages.clone();
    let reader = std::thread::spawn(move || {
        for (index, message) in expected.iter().enumerate() {
            let received = receiver.recv().expect("a message");
            assert!(received[..] == message[..], "message {index} differs");
        }
        receiver
    });
    for message in &messages {
        sender.send(message).expect("send");
    }
    sender.flush().unwrap();
    let receiver = reader.join().unwrap();
    let stats = sender.stats();
    // Asked for and answered: a request for the top tier that supersedes the one for
    // tier 1 may be refused as busy while the receiver drains tier 1, and the messages
    // may all be through before the back-off lets it ask again.
    assert!(stats.tiers.promotions + stats.tiers.nacks >= 1, "{stats:?}");
    // 3000 and 60 000 bytes in segments while the tier is asked for, 200 000 past the
    // top tier read by the receiver.
    assert!(stats.messages_segmented >= 1, "{stats:?}");
    assert_eq!(stats.messages_exposed, 1, "{stats:?}");
    assert_eq!(stats.messages_sent, messages.len() as u64);
    assert_eq!(receiver.stats().messages_received, messages.len() as u64);
    assert_eq!(receiver.stats().messages_read, 1);
    drop((sender, receiver, shared));
    assert_eq!(budget.in_use(), 0, "every registered byte comes back");
}

/// What an exposure costs in each of the provider's two ways of making one, and what
/// the device gave for inline sends: printed for `docs/verbs.md` (under an emulated CPU
/// only the counts mean anything; the times are the emulator's). Each way exposes a range
/// to the peer, which writes it with an immediate, and revokes it; the write lands, and
/// a write under the revoked key breaks the connection.
#[test]
#[ignore = "needs an RDMA device (TIERBUF_VERBS_DEVICE)"]
fn exposures_by_windows_and_by_registrations_work_and_say_what_they_cost() {
    const ROUNDS: u32 = 64;
    let budget = MemoryBudget::with_cap(64 << 20);
    let Some(windows) = provider(&budget) else {
        return;
    };
    let name = windows.device_name().to_owned();
    let registrations = VerbsProvider::open(
        &VerbsConfig::new(&name)
            .with_port(windows.path().port)
            .with_exposures(Exposures::Registrations),
        budget.clone(),
    )
    .expect("the same device");
    println!("{name}: the device's own way is {:?}", windows.exposures());
    for provider in [windows, registrations] {
        let pool = SlotPool::new(&*provider.registrar(), 4096, 4).unwrap();
        let (mut writer, mut target) = provider.pair(&options()).unwrap();
        println!(
            "{:?}: sends copied inline up to {:?} bytes",
            provider.exposures(),
            (1..=4096)
                .take_while(|&len| writer.caller_copies().takes(len))
                .last()
        );
        let window = slot(&pool);
        let started = Instant::now();
        for _ in 0..ROUNDS {
            // SAFETY: nothing writes to the slot while it is exposed.
            let exposed =
                unsafe { target.expose(BufferRef::from(&window), Access::Write) }.unwrap();
            target.revoke(exposed).unwrap();
        }
        let per_round = started.elapsed() / ROUNDS;
        println!(
            "{:?}: {ROUNDS} exposures and revocations of a 4 KiB slot, {per_round:?} each \
             (an emulated CPU's figure where the guest is emulated)",
            provider.exposures()
        );
        let mut source = slot(&pool);
        source[..5].copy_from_slice(b"hello");
        let signal = slot(&pool);
        // SAFETY: the window is read only after the immediate's receive completes; the
        // source and signal are left alone until their completions.
        let exposed = unsafe { target.expose(BufferRef::from(&window), Access::Write) }.unwrap();
        // SAFETY: as above.
        unsafe {
            target
                .post_recv(BufferRef::from(&signal).prefix(0).unwrap(), 1)
                .unwrap();
            writer
                .post_write(
                    &[BufferRef::from(&source).prefix(5).unwrap()],
                    exposed.slice(100, 5).unwrap(),
                    Some(0xfeed_beef),
                    2,
                )
                .unwrap();
        }
        assert_eq!(wait_for(&mut writer, 1)[0].opcode, Opcode::Write);
        let received = wait_for(&mut target, 1);
        assert_eq!(received[0].opcode, Opcode::RecvWithImm(0xfeed_beef));
        assert_eq!(received[0].byte_len, 5);
        assert_eq!(&window[100..105], b"hello");
        target.revoke(exposed).unwrap();
        // SAFETY: as above.
        unsafe {
            writer
                .post_write(
                    &[BufferRef::from(&source).prefix(5).unwrap()],
                    exposed.slice(0, 5).unwrap(),
                    None,
                    3,
                )
                .unwrap();
        }
        let refused = wait_for(&mut writer, 1);
        assert_eq!(refused[0].status, CompletionStatus::RemoteAccessError);
        assert_eq!(writer.state(), EndpointState::Broken);
        assert_eq!(&window[..5], &[0; 5], "the revoked key wrote");
    }
}
