//! The shared-memory provider against a hostile peer: the peer is this test, speaking the
//! bootstrap socket's records by hand and writing the connection segment's words through
//! the segment's own (hidden) public type. Whatever it does, the endpoint under attack
//! must not wait on it past its peer timeout: not in `poll`, `close` or drop, not in a
//! `try_` call, not in `accept`; and when the peer dies, the error says so.

mod errors;

use std::io::IoSliceMut;
use std::mem::MaybeUninit;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, mpsc};
use std::time::{Duration, Instant};

use errors::chain;
use rustix::net::{
    AddressFamily, RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, SendFlags, SocketAddrUnix,
    SocketFlags, SocketType,
};
use tierbuf_pool::{MemoryBudget, OwnedSlot, SlotPool};
use tierbuf_tiers::Reservoir;
use tierbuf_tiers::ladder::TierLadder;
use tierbuf_transport::connection::{
    Connection, ConnectionConfig, ConnectionCore, ConnectionError, Fault, SendError,
};
use tierbuf_transport::shm_segment::{Direction, Filled, PostedBuffer, RingSize, Segment};
use tierbuf_transport::{
    Access, BufferRef, Completion, Endpoint, PeerMappingLimit, PostError, Provider, RING_CAPACITY,
    ShmEndpoint, ShmProvider, TransportError,
};

/// The bootstrap records' magic (`transport/src/shm/bootstrap.rs`): `"tierbu"`, the `S` of
/// the shm provider and the record layout's version, little-endian on the wire.
const RECORD_MAGIC: u64 = u64::from_be_bytes(*b"tierbu\x53\x01");
const KIND_WELCOME: u32 = 2;
const KIND_ANNOUNCE: u32 = 4;
const KIND_FORGET: u32 = 5;
const RECORD_LEN: usize = 32;

/// The peer timeout the endpoints under attack are given.
const PEER_TIMEOUT: Duration = Duration::from_millis(300);
/// How long a call may take before the test calls it held hostage: far below the
/// bootstrap socket's 10 s timeout, far above the peer timeout.
const HOSTAGE: Duration = Duration::from_secs(5);

/// A socket path of its own for each test.
fn socket_path(name: &str) -> PathBuf {
    let path = std::env::temp_dir().join(format!(
        "tierbuf-hostile-{}-{name}.sock",
        std::process::id()
    ));
    let _ = std::fs::remove_file(&path);
    path
}

fn provider() -> ShmProvider {
    ShmProvider::new(MemoryBudget::with_cap(4 << 20)).with_peer_timeout(PEER_TIMEOUT)
}

/// A shared mapping of the connection segment the endpoint under attack created.
struct Mapping {
    base: NonNull<u8>,
    len: usize,
}

impl Mapping {
    fn segment(&self) -> &Segment<RING_CAPACITY> {
        assert!(self.len >= std::mem::size_of::<Segment<RING_CAPACITY>>());
        // SAFETY: the mapping is page-aligned and at least as long as the segment, and
        // lives as long as the borrow; every field of the segment is an atomic integer,
        // valid for any bit pattern, and atomics may be shared with the other process.
        unsafe { self.base.cast::<Segment<RING_CAPACITY>>().as_ref() }
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: exactly the range `mmap` returned; the borrows of it have ended.
        let _ = unsafe { rustix::mm::munmap(self.base.as_ptr().cast(), self.len) };
    }
}

/// The test as the accepting side of a connection: its socket and the segment it was sent.
struct RawPeer {
    /// Held open for the peer's life: closing it is what the peer's death looks like.
    socket: OwnedFd,
    segment: Mapping,
    /// The receive depth it welcomed with: its ring's size.
    depth: u32,
}

impl RawPeer {
    /// Accepts the endpoint `connect` makes against a listening socket at `path`, playing
    /// the listener's part of the handshake by hand.
    fn accept_from(
        path: &Path,
        depth: u32,
        connect: impl FnOnce(&Path) -> ShmEndpoint + Send,
    ) -> (ShmEndpoint, RawPeer) {
        let listening = rustix::net::socket_with(
            AddressFamily::UNIX,
            SocketType::SEQPACKET,
            SocketFlags::CLOEXEC,
            None,
        )
        .unwrap();
        rustix::net::bind(&listening, &SocketAddrUnix::new(path).unwrap()).unwrap();
        rustix::net::listen(&listening, 8).unwrap();
        std::thread::scope(|scope| {
            let victim = scope.spawn(|| connect(path));
            let socket = rustix::net::accept_with(&listening, SocketFlags::CLOEXEC).unwrap();
            let segment = receive_hello(&socket);
            let welcome = record(KIND_WELCOME, depth, u64::from(std::process::id()), 0);
            rustix::net::send(&socket, &welcome, SendFlags::NOSIGNAL).unwrap();
            let endpoint = victim.join().unwrap();
            let _ = std::fs::remove_file(path);
            (
                endpoint,
                RawPeer {
                    socket,
                    segment,
                    depth,
                },
            )
        })
    }

    /// Posts a receive in the ring the endpoint sends on, naming a region never announced,
    /// and counts one announcement it never sends.
    fn post_without_announcing(&self) {
        let segment = self.segment.segment();
        let buffer = PostedBuffer {
            remote_key: 0x7e57,
            addr: 0x10_0000,
            len: 4096,
        };
        segment
            .ring(0, RingSize::of_depth(self.depth))
            .post(0, buffer);
        let direction: *const Direction<RING_CAPACITY> = segment.direction(0);
        // SAFETY: `Direction` is `repr(C)`: `posted`, then `announced`, each an `AtomicU64`,
        // so the second word is the announcement count, inside the mapping.
        let announced = unsafe { &*direction.cast::<AtomicU64>().add(1) };
        announced.fetch_add(1, Ordering::Release);
    }
}

impl RawPeer {
    /// Announces a region of `len` bytes under `remote_key`: a fresh memory file of that
    /// length (sparse: it allocates nothing), sealed against shrinking as the endpoint
    /// requires, sent with its record.
    fn announce(&self, remote_key: u32, len: u64) {
        use rustix::fs::{MemfdFlags, SealFlags};
        use rustix::net::{SendAncillaryBuffer, SendAncillaryMessage};
        let file = rustix::fs::memfd_create(
            "hostile-region",
            MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING,
        )
        .unwrap();
        rustix::fs::ftruncate(&file, len).unwrap();
        rustix::fs::fcntl_add_seals(&file, SealFlags::SHRINK).unwrap();
        let record = record(KIND_ANNOUNCE, remote_key, 0x7f00_0000_0000, len);
        let files = [rustix::fd::AsFd::as_fd(&file)];
        let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
        let mut control = SendAncillaryBuffer::new(&mut space);
        assert!(control.push(SendAncillaryMessage::ScmRights(&files)));
        rustix::net::sendmsg(
            &self.socket,
            &[std::io::IoSlice::new(&record)],
            &mut control,
            SendFlags::NOSIGNAL,
        )
        .unwrap();
    }

    /// Says the region announced under `remote_key` is gone.
    fn forget(&self, remote_key: u32) {
        let record = record(KIND_FORGET, remote_key, 0x7f00_0000_0000, 0);
        rustix::net::send(&self.socket, &record, SendFlags::NOSIGNAL).unwrap();
    }
}

/// A bootstrap record: magic, kind, then its three fields.
fn record(kind: u32, a: u32, b: u64, c: u64) -> [u8; RECORD_LEN] {
    let mut bytes = [0u8; RECORD_LEN];
    bytes[0..8].copy_from_slice(&RECORD_MAGIC.to_le_bytes());
    bytes[8..12].copy_from_slice(&kind.to_le_bytes());
    bytes[12..16].copy_from_slice(&a.to_le_bytes());
    bytes[16..24].copy_from_slice(&b.to_le_bytes());
    bytes[24..32].copy_from_slice(&c.to_le_bytes());
    bytes
}

/// Polls `endpoint` until it fails or has made `polls` polls (past its idle polls between
/// two looks at the socket many times over); returns the failure, if any.
fn poll_for_failure(endpoint: &mut ShmEndpoint, polls: usize) -> Option<TransportError> {
    let mut completions = [Completion::default(); 4];
    (0..polls).find_map(|_| endpoint.poll(&mut completions).err())
}

/// Receives the connecting side's hello and maps the segment its memory file holds.
fn receive_hello(socket: &OwnedFd) -> Mapping {
    let mut bytes = [0u8; RECORD_LEN];
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
    let mut control = RecvAncillaryBuffer::new(&mut space);
    let received = rustix::net::recvmsg(
        socket,
        &mut [IoSliceMut::new(&mut bytes)],
        &mut control,
        RecvFlags::CMSG_CLOEXEC,
    )
    .unwrap();
    assert_eq!(received.bytes, RECORD_LEN);
    let file: OwnedFd = control
        .drain()
        .find_map(|message| match message {
            RecvAncillaryMessage::ScmRights(mut fds) => fds.next(),
            _ => None,
        })
        .expect("the hello carries the segment");
    let len = rustix::fs::fstat(&file).unwrap().st_size as usize;
    // SAFETY: a fresh shared mapping at an address of the kernel's choosing aliases nothing
    // of this process; the file is sealed against shrinking, so every page stays backed.
    let base = unsafe {
        rustix::mm::mmap(
            std::ptr::null_mut(),
            len,
            rustix::mm::ProtFlags::READ | rustix::mm::ProtFlags::WRITE,
            rustix::mm::MapFlags::SHARED,
            &file,
            0,
        )
    }
    .unwrap();
    Mapping {
        base: NonNull::new(base.cast()).unwrap(),
        len,
    }
}

/// Runs `work` on a thread of its own and returns what it returned and how long it took,
/// or fails the test if it has not returned within [`HOSTAGE`].
fn within_bound<T: Send + 'static>(
    what: &str,
    work: impl FnOnce() -> T + Send + 'static,
) -> (T, Duration) {
    let (done, finished) = mpsc::channel();
    std::thread::spawn(move || {
        let started = Instant::now();
        let outcome = work();
        let _ = done.send((outcome, started.elapsed()));
    });
    finished
        .recv_timeout(HOSTAGE)
        .unwrap_or_else(|_| panic!("{what} was held hostage by the peer for {HOSTAGE:?}"))
}

/// An endpoint connected to a peer played by hand that has passed its copy gate (as if it
/// had started a copy into the endpoint's receive) and never leaves it. The endpoint has a
/// receive posted, in a slot of the pool also returned, which outlives it.
fn victim_of_a_held_gate(name: &str) -> (ShmEndpoint, RawPeer, OwnedSlot) {
    let provider = provider();
    let pool = SlotPool::new(&*provider.registrar(), 256, 1).unwrap();
    let inbox = pool.try_acquire_owned().unwrap();
    let path = socket_path(name);
    let (mut endpoint, peer) =
        RawPeer::accept_from(&path, 8, |path| provider.connect(path, 8, 8).unwrap());
    // SAFETY: the inbox is not touched until the endpoint has gone; the caller drops it
    // after the endpoint.
    unsafe { endpoint.post_recv(BufferRef::from(&inbox), 1) }.unwrap();
    assert!(
        peer.segment.segment().begin_copy(1),
        "the peer passes its gate"
    );
    (endpoint, peer, inbox)
}

/// A peer that passes its copy gate and never leaves it, then marks the connection broken
/// (so the endpoint flushes, which waits for the copy to end): `poll` reports the stall
/// within the peer timeout, and the drop that follows returns.
#[test]
fn a_peer_holding_its_copy_gate_cannot_hang_poll_or_drop() {
    let (mut endpoint, peer, inbox) = victim_of_a_held_gate("gate-poll");
    peer.segment.segment().break_connection();
    let (polled, took) = within_bound("poll", move || {
        let mut completions = [Completion::default(); 4];
        let polled = endpoint.poll(&mut completions);
        drop(endpoint);
        polled.map(|_| ())
    });
    let error = polled.expect_err("the stall is reported");
    assert!(
        matches!(error, TransportError::PeerStalled { .. }),
        "{error}"
    );
    assert!(error.to_string().contains("copy"), "{error}");
    assert!(took >= PEER_TIMEOUT, "gave up after {took:?}");
    drop((peer, inbox));
}

/// The same peer, with the connection still open: closing the endpoint shuts the gate and
/// waits for the peer's copy, for the peer timeout at most.
#[test]
fn a_peer_holding_its_copy_gate_cannot_hang_close() {
    let (mut endpoint, peer, inbox) = victim_of_a_held_gate("gate-close");
    let ((), took) = within_bound("close", move || {
        endpoint.close();
        drop(endpoint);
    });
    assert!(took >= PEER_TIMEOUT, "gave up after {took:?}");
    drop((peer, inbox));
}

/// A peer that counts an announcement it never sends. It sends each record before it
/// counts it, and a record sent on a Unix socket is queued when the send returns, so a
/// drained socket with the count ahead proves the violation: it is found at the first
/// send that needs the announcement, not after the peer timeout (here an hour, so a test
/// that waited for it would be held hostage). The non-blocking send takes nothing.
#[test]
fn announcements_counted_but_never_sent_are_found_at_once() {
    let provider = ShmProvider::new(MemoryBudget::with_cap(4 << 20))
        .with_peer_timeout(Duration::from_secs(3600));
    let path = socket_path("announce");
    let (mut endpoint, peer) =
        RawPeer::accept_from(&path, 8, |path| provider.connect(path, 8, 8).unwrap());
    peer.post_without_announcing();
    let ((endpoint, first, error), _) = within_bound("finding the missing record", move || {
        // Longer than travels inline: a copy into the announced region it names.
        let first = endpoint.try_post_send_copied(&[&[7u8; 512]], 1);
        let error = poll_for_failure(&mut endpoint, 1).expect("the violation is reported");
        (endpoint, first, error)
    });
    assert_eq!(first, Ok(false), "nothing taken");
    assert!(
        matches!(error, TransportError::ProtocolViolation { .. }),
        "{error}"
    );
    assert!(
        error.to_string().contains("counted 1 region announcements"),
        "{error}"
    );
    drop((endpoint, peer));
}

/// A peer that begins an access to an exposure of this side's (marks it accessed, as if
/// it were copying into it) and never ends it: `revoke` waits for the peer timeout at
/// most, then fails the connection as the peer's stall, keeping the region.
#[test]
fn a_peer_that_never_ends_an_access_cannot_hang_revoke() {
    let provider = provider();
    let pool = SlotPool::new(&*provider.registrar(), 256, 1).unwrap();
    let window = pool.try_acquire_owned().unwrap();
    let path = socket_path("held-access");
    let (mut endpoint, peer) =
        RawPeer::accept_from(&path, 8, |path| provider.connect(path, 8, 8).unwrap());
    // SAFETY: the window is not touched until the endpoint has gone.
    let exposed = unsafe { endpoint.expose(BufferRef::from(&window), Access::Write) }.unwrap();
    let table = peer.segment.segment().exposures(0);
    assert!(table.begin_access(exposed.key, Access::Write).is_ok());
    let ((revoked, error), took) = within_bound("revoke", move || {
        let revoked = endpoint.revoke(exposed);
        let error = poll_for_failure(&mut endpoint, 1);
        (revoked, error)
    });
    assert_eq!(revoked, Err(PostError::ConnectionBroken));
    let error = error.expect("the stall is reported");
    assert!(
        matches!(error, TransportError::PeerStalled { .. }),
        "{error}"
    );
    assert!(error.to_string().contains("exposure"), "{error}");
    assert!(took >= PEER_TIMEOUT, "gave up after {took:?}");
    drop((peer, window));
}

/// A peer that raises its ring's `posted` count past anything it could have posted: the
/// word is bounded by the ring's size before it is used, so no message goes into an entry
/// the peer never posted and is counted as sent; the peer is blamed, naming the word.
#[test]
fn a_posted_count_past_the_ring_is_refused_and_nothing_counted_sent() {
    let provider = provider();
    let path = socket_path("posted-count");
    let (mut endpoint, peer) =
        RawPeer::accept_from(&path, 8, |path| provider.connect(path, 8, 8).unwrap());
    let direction: *const Direction<RING_CAPACITY> = peer.segment.segment().direction(0);
    // SAFETY: `Direction` is `repr(C)` and starts with `posted`, an `AtomicU64`, inside
    // the mapping.
    let posted = unsafe { &*direction.cast::<AtomicU64>() };
    posted.store(1 << 40, Ordering::Release);
    // Short enough to travel inline in the ring entry, with nothing else to check.
    assert_eq!(
        endpoint.try_post_send_copied(&[&[7u8; 16]], 1),
        Ok(false),
        "a message went into a ring entry the peer never posted"
    );
    let error = poll_for_failure(&mut endpoint, 1).expect("the violation is reported");
    assert!(
        matches!(error, TransportError::ProtocolViolation { .. }),
        "{error}"
    );
    assert!(error.to_string().contains("posted count"), "{error}");
    drop((endpoint, peer));
}

/// A peer that posts a receive naming a region it never announced (and counts no
/// announcement): a connection's send copied into it fails the connection as the peer's
/// fault, naming the receive, not as a refusal of this side's.
#[test]
fn a_receive_in_no_announced_region_is_the_peer_s_fault() {
    let provider = provider();
    let path = socket_path("unreachable");
    let (endpoint, peer) =
        RawPeer::accept_from(&path, 64, |path| provider.connect(path, 64, 64).unwrap());
    peer.segment.segment().ring(0, RingSize::of_depth(64)).post(
        0,
        PostedBuffer {
            remote_key: 0x7e57,
            addr: 0x10_0000,
            len: 4096,
        },
    );
    // Longer than travels inline: copied into the buffer the receive names.
    let error = failure_of_a_connection(&provider, endpoint, &[1u8; 200]);
    let text = chain(&*error);
    assert_eq!(error.fault(), Fault::Peer, "{text}");
    assert!(text.contains("key 0x7e57"), "the cause is lost: {text}");
    drop(peer);
}

/// The same peer: a message short enough to travel inline goes into the ring entry, not
/// into the region the receive names, so it is delivered at once without the
/// announcement the peer counted and never sent.
#[test]
fn an_inline_message_waits_for_no_announcement() {
    let provider = provider();
    let path = socket_path("inline-unannounced");
    let (mut endpoint, peer) =
        RawPeer::accept_from(&path, 8, |path| provider.connect(path, 8, 8).unwrap());
    peer.post_without_announcing();
    assert_eq!(endpoint.try_post_send_copied(&[&[7u8; 16]], 1), Ok(true));
    let delivered = peer
        .segment
        .segment()
        .ring(0, RingSize::of_depth(peer.depth))
        .delivered(0);
    assert_eq!(delivered, Some(Ok(Filled::Inline(16))));
    drop((endpoint, peer));
}

/// A peer that announces a memory file of a terabyte: mapping it would take that much of
/// this process's address space, and a few such peers all of it, for every connection and
/// every allocation of the process. The endpoint refuses it as a violation instead.
#[test]
fn a_region_past_the_mapping_limit_is_refused_not_mapped() {
    let provider = provider();
    let path = socket_path("huge-region");
    let (mut endpoint, peer) =
        RawPeer::accept_from(&path, 8, |path| provider.connect(path, 8, 8).unwrap());
    peer.announce(0x7e57, 1 << 40);
    let error = poll_for_failure(&mut endpoint, 10_000).expect("the endpoint failed");
    assert_past_the_mapping_limit(&error);
    drop((endpoint, peer));
}

/// A peer that announces region after region and forgets none: each is a mapping of this
/// process's, and enough of them take its last (`vm.max_map_count`), for every
/// connection. The endpoint keeps as many as its limit allows, and no more; a region the
/// peer forgets makes room for another.
#[test]
fn regions_past_the_count_limit_are_refused_and_forgotten_ones_make_room() {
    let limit = PeerMappingLimit::new(4, 1 << 20);
    let provider = provider().with_peer_mapping_limit(limit);
    let path = socket_path("many-regions");
    let (mut endpoint, peer) =
        RawPeer::accept_from(&path, 8, |path| provider.connect(path, 8, 8).unwrap());
    for key in 1..=4 {
        peer.announce(key, 4096);
    }
    peer.forget(1);
    peer.announce(5, 4096);
    assert!(
        poll_for_failure(&mut endpoint, 10_000).is_none(),
        "four regions mapped at once, within the limit"
    );
    assert_eq!(
        provider.peer_regions_mapped(),
        (4, 4 * 4096),
        "the forgotten region's mapping is undone and uncounted"
    );
    peer.announce(6, 4096);
    let error = poll_for_failure(&mut endpoint, 10_000).expect("the fifth region refused");
    assert_past_the_mapping_limit(&error);
    drop((endpoint, peer));
}

/// Many peers, each within its own limit: what they make this process map together is
/// bounded too, by the provider's total, so connections enough cannot take the process's
/// mappings or address space either. Past the total a connection fails as this process's
/// resource exhausted, maps nothing, and a connection dropped gives its share back.
#[test]
fn the_regions_of_all_connections_together_stay_within_the_provider_total() {
    let provider = provider().with_peer_mapping_total(PeerMappingLimit::new(3, 1 << 20));
    let hostile = |name: &str| {
        RawPeer::accept_from(&socket_path(name), 8, |path| {
            provider.connect(path, 8, 8).unwrap()
        })
    };
    let (mut first, first_peer) = hostile("total-first");
    let (mut second, second_peer) = hostile("total-second");
    first_peer.announce(1, 4096);
    first_peer.announce(2, 4096);
    second_peer.announce(1, 4096);
    assert!(poll_for_failure(&mut first, 10_000).is_none());
    assert!(poll_for_failure(&mut second, 10_000).is_none());
    assert_eq!(provider.peer_regions_mapped(), (3, 3 * 4096));
    second_peer.announce(2, 4096);
    let error = poll_for_failure(&mut second, 10_000).expect("the fourth region refused");
    assert!(
        matches!(error, TransportError::LocalResource { .. }),
        "{error}"
    );
    let text = chain(&error);
    assert!(text.contains("not the peer's fault"), "{text}");
    assert!(text.contains("with_peer_mapping_total"), "{text}");
    assert_eq!(
        provider.peer_regions_mapped(),
        (3, 3 * 4096),
        "nothing more mapped"
    );
    drop((first, first_peer));
    assert_eq!(
        provider.peer_regions_mapped(),
        (1, 4096),
        "the dropped share is back"
    );
    let (mut third, third_peer) = hostile("total-third");
    third_peer.announce(1, 4096);
    third_peer.announce(2, 4096);
    assert!(poll_for_failure(&mut third, 10_000).is_none());
    assert_eq!(provider.peer_regions_mapped(), (3, 3 * 4096));
    drop((second, second_peer, third, third_peer));
    assert_eq!(provider.peer_regions_mapped(), (0, 0));
}

/// A peer that opens connection after connection makes the listener map one more of its
/// memory files (the connection's segment) each time: the segments of accepted
/// connections count in the provider's total with the regions, so past it a connection is
/// refused, the listener goes on, the connecting side hears why, and a closed
/// connection's share comes back.
#[test]
fn the_segments_of_accepted_connections_count_in_the_provider_total() {
    let listening = provider().with_peer_mapping_total(PeerMappingLimit::new(2, 1 << 30));
    let path = socket_path("total-segments");
    let listener = listening.listen(&path).unwrap();
    let client = Arc::new(provider());
    let connect = || {
        let (path, client) = (path.clone(), Arc::clone(&client));
        std::thread::spawn(move || client.connect(path, 8, 8))
    };
    let mut accepted = Vec::new();
    let mut connecting = Vec::new();
    for _ in 0..2 {
        let client = connect();
        accepted.push(listener.accept(8, 8).expect("within the total"));
        connecting.push(client.join().unwrap().expect("welcomed"));
    }
    let (regions, bytes) = listening.peer_regions_mapped();
    assert_eq!(regions, 2, "a segment an accepted connection");
    assert!(bytes > 0);
    let client = connect();
    let error = listener.accept(8, 8).expect_err("past the total");
    assert!(
        matches!(error, TransportError::LocalResource { .. }),
        "{error}"
    );
    let text = chain(&error);
    assert!(text.contains("with_peer_mapping_total"), "{text}");
    let refused = client.join().unwrap().expect_err("refused");
    let text = chain(&refused);
    assert!(text.contains("with_peer_mapping_total"), "{text}");
    assert_eq!(
        listening.peer_regions_mapped(),
        (2, bytes),
        "nothing more mapped"
    );
    drop((accepted.pop(), connecting.pop()));
    assert_eq!(
        listening.peer_regions_mapped(),
        (1, bytes / 2),
        "the share is back"
    );
    let client = connect();
    accepted.push(listener.accept(8, 8).expect("room again"));
    connecting.push(client.join().unwrap().expect("welcomed"));
    drop((accepted, connecting));
    assert_eq!(listening.peer_regions_mapped(), (0, 0));
}

/// A region the kernel will not map for this process (here: 4 PiB, past the address
/// space, with both limits raised out of the way) is this process's resource exhausted,
/// not the peer's violation: the error says so and keeps the kernel's answer.
#[test]
fn a_region_the_kernel_cannot_map_is_this_process_s_resource_not_the_peer_s() {
    let unbounded = PeerMappingLimit::new(256, u64::MAX);
    let provider = provider()
        .with_peer_mapping_limit(unbounded)
        .with_peer_mapping_total(unbounded);
    let path = socket_path("unmappable");
    let (mut endpoint, peer) =
        RawPeer::accept_from(&path, 8, |path| provider.connect(path, 8, 8).unwrap());
    peer.announce(0x7e57, 1 << 52);
    let error = poll_for_failure(&mut endpoint, 10_000).expect("the endpoint failed");
    assert!(
        matches!(error, TransportError::LocalResource { .. }),
        "{error}"
    );
    let text = chain(&error);
    assert!(text.contains("mapping a memory file"), "{text}");
    assert!(
        text.contains("os error"),
        "the kernel's answer kept: {text}"
    );
    assert_eq!(
        provider.peer_regions_mapped(),
        (0, 0),
        "the charge given back"
    );
    drop((endpoint, peer));
}

/// `error` is the peer's violation of the endpoint's mapping limit.
fn assert_past_the_mapping_limit(error: &TransportError) {
    assert!(
        matches!(error, TransportError::ProtocolViolation { .. }),
        "{error}"
    );
    assert!(error.to_string().contains("mapping limit"), "{error}");
}

/// A client that connects and says nothing does not keep `accept` from the client behind
/// it; it is refused, on its own, once the peer timeout has passed.
#[test]
fn a_silent_client_does_not_hold_up_accept() {
    let provider = Arc::new(provider());
    let path = socket_path("silent");
    let listener = provider.listen(&path).unwrap();
    let silent = rustix::net::socket_with(
        AddressFamily::UNIX,
        SocketType::SEQPACKET,
        SocketFlags::CLOEXEC,
        None,
    )
    .unwrap();
    rustix::net::connect(&silent, &SocketAddrUnix::new(&path).unwrap()).unwrap();
    let client = {
        let (provider, path) = (Arc::clone(&provider), path.clone());
        std::thread::spawn(move || provider.connect(&path, 8, 8))
    };
    let ((accepted, listener), took) =
        within_bound("accept", move || (listener.accept(8, 8), listener));
    assert!(
        accepted.is_ok(),
        "the talking client was not accepted first: {:?}",
        accepted.err()
    );
    assert!(took < PEER_TIMEOUT, "accept took {took:?}");
    let connected = client.join().unwrap();
    assert!(connected.is_ok(), "{:?}", connected.err());
    // The silent one is refused once its time is up; the listener stays usable.
    let (refused, took) = within_bound("accept", move || listener.accept(8, 8));
    let error = refused.expect_err("a client that never says hello");
    assert!(error.to_string().contains("hello"), "{error}");
    assert!(took <= PEER_TIMEOUT + HOSTAGE, "{took:?}");
    drop(silent);
}

/// A peer process killed (its socket closed, the segment left open) while this side is
/// about to announce its first receive buffers: the connection's error says the peer died,
/// down its `source()` chain, instead of only that the connection failed.
#[test]
fn a_peer_that_dies_is_named_as_the_cause() {
    let provider = provider();
    let path = socket_path("died");
    let (endpoint, peer) =
        RawPeer::accept_from(&path, 64, |path| provider.connect(path, 64, 64).unwrap());
    drop(peer);
    // Found at the first post or poll that meets the closed socket.
    let error = failure_of_a_connection(&provider, endpoint, b"anyone there?");
    assert_eq!(error.fault(), Fault::Peer, "{}", chain(&*error));
    let text = chain(&*error);
    assert!(text.contains("died"), "the cause is lost: {text}");
}

/// The error a connection over `endpoint` (on the two-tier ladder) fails with, sending
/// `message` again and again and making progress until it does; the test fails if that
/// takes longer than [`HOSTAGE`].
fn failure_of_a_connection(
    provider: &ShmProvider,
    endpoint: ShmEndpoint,
    message: &'static [u8],
) -> Arc<ConnectionError> {
    let ladder = Arc::new(TierLadder::preset("two-tier").unwrap());
    let config = Arc::new(ConnectionConfig::new(ladder).unwrap());
    let reservoir = Arc::new(Reservoir::new(
        provider.registrar(),
        Arc::clone(config.ladder()),
    ));
    let core =
        ConnectionCore::new(config, Arc::clone(&reservoir), reservoir, Instant::now()).unwrap();
    let (error, _) = within_bound("the connection's failure", move || {
        // A failure of its first progress is reported by its first call.
        let mut connection =
            Connection::new(core, endpoint).expect("the endpoint suits the ladder");
        loop {
            let step = connection
                .send(message)
                .and_then(|()| connection.progress().map_err(SendError::Failed));
            if let Err(SendError::Failed(error)) = step {
                return error;
            }
        }
    });
    error
}
