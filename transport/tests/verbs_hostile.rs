//! A hostile verbs peer: one that was told a region's address and remote key (as every
//! promotion's answer tells it), or keys of exposures (`Endpoint::expose`), and tries to
//! reach memory with one-sided operations beyond what it was given. The verbs provider
//! registers memory for local access only and carries out a peer's RDMA WRITE or READ only
//! through an exposure's key, within its range, for the access it gave, while it is in
//! force, and (with memory windows) on the connection it was given to; its queue pairs
//! refuse atomics. So an RDMA WRITE, READ or atomic under a region's key, a key never
//! exposed, revoked, given to another connection, or past an exposure's range fails on the
//! peer's side, breaks the connection on the endpoint's side too, and leaves every guard
//! byte as it was; one within an exposure is carried out.
//!
//! The hostile peer is written here with `sideway` directly: it speaks the provider's
//! handshake (`verbs::rendezvous`) and connects a queue pair of its own to the endpoint's.
//! The tests need the RDMA device `TIERBUF_VERBS_DEVICE` names (soft-RoCE will do;
//! `.ci/verbs-rxe` runs them so); without it each prints why it skips and passes.
#![cfg(feature = "verbs")]

use std::net::Ipv6Addr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use sideway::ibverbs::AccessFlags;
use sideway::ibverbs::address::{AddressHandleAttribute, Gid};
use sideway::ibverbs::completion::{BasicCompletionQueue, CompletionQueueBuilder};
use sideway::ibverbs::device::{DeviceInfo, DeviceList};
use sideway::ibverbs::device_context::DeviceContext;
use sideway::ibverbs::memory_region::MemoryRegion;
use sideway::ibverbs::queue_pair::{
    BasicQueuePair, PostSendGuard, QueuePair, QueuePairAttribute, QueuePairBuilder, QueuePairState,
    QueuePairType, SetScatterGatherEntry, WorkRequestFlags,
};
use tierbuf_pool::{MemoryBudget, OwnedSlot, SlotPool};
use tierbuf_tiers::TierIndex;
use tierbuf_transport::verbs::handshake::{Hello, QueuePairAddress};
use tierbuf_transport::verbs::rendezvous::{PeerWatch, Rendezvous};
use tierbuf_transport::verbs::{
    EndpointOptions, Exposures, VerbsConfig, VerbsEndpoint, VerbsProvider, ibv_wc_status,
    status_name,
};
use tierbuf_transport::{
    Access, BufferRef, Completion, Endpoint, EndpointState, Provider, RemoteBuffer,
};

const DEVICE_VARIABLE: &str = "TIERBUF_VERBS_DEVICE";
/// `registrations` runs the tests with the fallback's exposures (`docs/verbs.md`).
const EXPOSURES_VARIABLE: &str = "TIERBUF_VERBS_EXPOSURES";
/// Far longer than a device takes to fail a request, soft-RoCE under an emulated CPU
/// included.
const WAIT: Duration = Duration::from_secs(120);

/// What the hostile peer tries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Attack {
    Write,
    Read,
    FetchAdd,
}

/// The byte every victim slot starts with.
const GUARD: u8 = 0x5a;
/// The byte the hostile peer's buffer holds, which its writes carry.
const HOSTILE: u8 = 0xee;
/// The bytes each attempt moves.
const LEN: u32 = 8;

/// The hostile side: its own context, buffer and queue pair on the device.
struct HostilePeer {
    queue_pair: BasicQueuePair,
    completions: Arc<BasicCompletionQueue>,
    buffer: Box<[u8; 64]>,
    registration: Arc<MemoryRegion>,
    _context: Arc<DeviceContext>,
    /// Open while the peer attacks: its end would tell the endpoint that the peer left.
    _rendezvous: PeerWatch,
}

impl HostilePeer {
    /// Connects to the endpoint `listener` accepts, through the provider's handshake.
    fn connect(
        device: &str,
        port: u8,
        gid_index: Option<u32>,
        addr: std::net::SocketAddr,
    ) -> HostilePeer {
        let list = DeviceList::new().unwrap();
        let context = list
            .iter()
            .find(|candidate| candidate.name() == device)
            .expect("the device")
            .open()
            .unwrap();
        let domain = context.alloc_pd().unwrap();
        let mut buffer = Box::new([HOSTILE; 64]);
        // SAFETY: the buffer lives, boxed in place, as long as the registration (both are
        // fields of the peer, and the queue pair is destroyed first).
        let registration = unsafe {
            domain
                .reg_mr(
                    buffer.as_mut_ptr() as usize,
                    buffer.len(),
                    AccessFlags::LocalWrite,
                )
                .unwrap()
        };
        let completions = CompletionQueueBuilder::new(&context)
            .setup_cqe(4)
            .build()
            .unwrap();
        let mut queue_pair = QueuePairBuilder::new(&domain)
            .setup_qp_type(QueuePairType::ReliableConnection)
            .setup_max_send_wr(4)
            .setup_max_recv_wr(4)
            .setup_max_send_sge(1)
            .setup_max_recv_sge(1)
            .setup_send_cq(Arc::clone(&completions))
            .setup_recv_cq(Arc::clone(&completions))
            .build()
            .unwrap();
        let mut init = QueuePairAttribute::new();
        init.setup_state(QueuePairState::Init)
            .setup_pkey_index(0)
            .setup_port(port)
            .setup_access_flags(AccessFlags::LocalWrite);
        queue_pair.modify(&init).unwrap();
        let gid = gid_index.map(|index| Ipv6Addr::from(context.query_gid(port, index).unwrap()));
        let port_number = port;
        let port = context.query_port(port_number).unwrap();
        let mut rendezvous = Rendezvous::connect(addr, WAIT).unwrap();
        let remote = rendezvous
            .exchange_hello(Hello {
                queue_pair: QueuePairAddress {
                    num: queue_pair.qp_number(),
                    lid: port.lid(),
                    gid,
                },
                initial_tier: TierIndex::SMALLEST,
            })
            .unwrap();
        let mut path = AddressHandleAttribute::new();
        path.setup_dest_lid(remote.queue_pair.lid)
            .setup_port(port_number);
        if let (Some(index), Some(peer_gid)) = (gid_index, remote.queue_pair.gid) {
            path.setup_grh(&Gid::from(peer_gid), 0, index as u8, 0xff, 0);
        }
        let mut ready_to_receive = QueuePairAttribute::new();
        ready_to_receive
            .setup_state(QueuePairState::ReadyToReceive)
            .setup_path_mtu(port.active_mtu())
            .setup_dest_qp_num(remote.queue_pair.num)
            .setup_rq_psn(0)
            .setup_max_dest_read_atomic(1)
            .setup_min_rnr_timer(12)
            .setup_address_vector(&path);
        queue_pair.modify(&ready_to_receive).unwrap();
        let mut ready_to_send = QueuePairAttribute::new();
        ready_to_send
            .setup_state(QueuePairState::ReadyToSend)
            .setup_sq_psn(0)
            .setup_timeout(14)
            .setup_retry_cnt(7)
            .setup_rnr_retry(7)
            .setup_max_read_atomic(1);
        queue_pair.modify(&ready_to_send).unwrap();
        rendezvous.exchange_ready().unwrap();
        HostilePeer {
            _rendezvous: rendezvous.into_watch().unwrap(),
            queue_pair,
            completions,
            buffer,
            registration,
            _context: context,
        }
    }

    /// Tries `attack` on the [`LEN`] bytes at `remote_addr` under `remote_key`; returns the
    /// status its completion reports.
    fn attempt(&mut self, attack: Attack, remote_addr: u64, remote_key: u32) -> u32 {
        let (local_key, local) = (self.registration.lkey(), self.buffer.as_ptr() as u64);
        let mut guard = self.queue_pair.start_post_send();
        let request = guard.construct_wr(7, WorkRequestFlags::Signaled);
        let request = match attack {
            Attack::Write => request.setup_write(remote_key, remote_addr),
            Attack::Read => request.setup_read(remote_key, remote_addr),
            Attack::FetchAdd => request.setup_atomic_fetch_add(remote_key, remote_addr, 1),
        };
        // SAFETY: the buffer is registered and left alone until the completion is polled.
        unsafe { request.setup_sge(local_key, local, LEN) };
        guard.post().unwrap();
        let deadline = Instant::now() + WAIT;
        loop {
            // One request is outstanding, so the first completion is its.
            if let Ok(mut poller) = self.completions.start_poll()
                && let Some(completion) = poller.next()
            {
                return completion.status();
            }
            assert!(Instant::now() < deadline, "{attack:?} never completed");
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}

/// A provider on the device `TIERBUF_VERBS_DEVICE` names, an endpoint of it connected to a
/// hostile peer, and a pool of guarded slots; `None` (having said why) without a device.
struct Scene {
    peer: HostilePeer,
    endpoint: VerbsEndpoint,
    pool: SlotPool,
    provider: VerbsProvider,
}

impl Scene {
    fn new() -> Option<Scene> {
        let Ok(device) = std::env::var(DEVICE_VARIABLE) else {
            println!("skipped: {DEVICE_VARIABLE} names no RDMA device; see docs/verbs.md");
            return None;
        };
        let gid_index: Option<u32> = std::env::var("TIERBUF_VERBS_GID_INDEX")
            .ok()
            .map(|index| index.parse().expect("a GID index"));
        let mut config = VerbsConfig::new(&device);
        if let Some(index) = gid_index {
            config = config.with_gid_index(index);
        }
        if std::env::var(EXPOSURES_VARIABLE).as_deref() == Ok("registrations") {
            config = config.with_exposures(Exposures::Registrations);
        }
        let provider = VerbsProvider::open(&config, MemoryBudget::with_cap(1 << 20)).unwrap();
        println!("exposures by {:?}", provider.exposures());
        // The same port and GID the provider goes out by, so that the two queue pairs
        // reach each other.
        let (port, gid_index) = (
            provider.path().port,
            provider.path().gid.map(|gid| gid.index),
        );
        let pool = SlotPool::new(&*provider.registrar(), 4096, 3).unwrap();
        let listener = provider
            .listen("127.0.0.1:0", EndpointOptions::default())
            .unwrap();
        let addr = listener.local_addr().unwrap();
        let accepting = std::thread::spawn(move || listener.accept().unwrap());
        let peer = HostilePeer::connect(&device, port, gid_index, addr);
        let endpoint = accepting.join().unwrap();
        Some(Scene {
            peer,
            endpoint,
            pool,
            provider,
        })
    }

    /// A slot filled with [`GUARD`].
    fn victim(&self) -> OwnedSlot {
        let mut slot = self.pool.try_acquire_owned().unwrap();
        slot.fill(GUARD);
        slot
    }

    /// Exposes the [`LEN`] bytes at `offset` of `slot` to the hostile peer for `access`.
    fn expose(&mut self, slot: &OwnedSlot, offset: u32, access: Access) -> RemoteBuffer {
        let buffer = BufferRef::from(slot);
        let range = BufferRef {
            addr: buffer.addr + u64::from(offset),
            len: LEN,
            ..buffer
        };
        // SAFETY: the tests read an exposed slot only once the peer's request completed.
        unsafe { self.endpoint.expose(range, access) }.unwrap()
    }

    /// Tries `attack` at `addr` under `key` and checks that it was refused, that the
    /// endpoint's side of the connection broke too, and that `victim` is untouched.
    fn refused(&mut self, attack: Attack, addr: u64, key: u32, victim: &OwnedSlot) {
        let status = self.peer.attempt(attack, addr, key);
        assert_ne!(
            status,
            ibv_wc_status::IBV_WC_SUCCESS,
            "the peer's {attack:?} was carried out"
        );
        println!(
            "{attack:?} refused with {}",
            status_name(status).unwrap_or("an unknown status")
        );
        assert!(
            victim.iter().all(|&byte| byte == GUARD),
            "the slot changed under the peer's refused {attack:?}"
        );
        assert!(
            self.peer.buffer.iter().all(|&byte| byte == HOSTILE),
            "the peer's refused {attack:?} delivered bytes"
        );
        let deadline = Instant::now() + WAIT;
        let mut completions = [Completion::default(); 4];
        while self.endpoint.state() == EndpointState::Open {
            let _ = self.endpoint.poll(&mut completions);
            assert!(
                Instant::now() < deadline,
                "the endpoint did not learn of the refused {attack:?}"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(self.endpoint.state(), EndpointState::Broken);
    }
}

fn one_sided_operations_on_a_told_region_fail(attack: Attack) {
    let Some(mut scene) = Scene::new() else {
        return;
    };
    let victim = scene.victim();
    let key = scene.pool.keys().remote_key;
    scene.refused(attack, victim.remote_addr(), key, &victim);
}

#[test]
fn a_peer_s_rdma_write_into_a_region_it_was_told_of_fails() {
    one_sided_operations_on_a_told_region_fail(Attack::Write);
}

#[test]
fn a_peer_s_rdma_read_of_a_region_it_was_told_of_fails() {
    one_sided_operations_on_a_told_region_fail(Attack::Read);
}

#[test]
fn a_peer_s_atomic_on_a_region_it_was_told_of_fails() {
    one_sided_operations_on_a_told_region_fail(Attack::FetchAdd);
}

#[test]
fn an_exposed_range_is_written_and_read_and_nothing_around_it() {
    let Some(mut scene) = Scene::new() else {
        return;
    };
    let victim = scene.victim();
    let writable = scene.expose(&victim, 64, Access::Write);
    let status = scene
        .peer
        .attempt(Attack::Write, writable.addr, writable.key);
    assert_eq!(status_name(status), Some("IBV_WC_SUCCESS"));
    let written = 64..64 + LEN as usize;
    assert!(victim[written.clone()].iter().all(|&byte| byte == HOSTILE));
    assert!(
        victim
            .iter()
            .enumerate()
            .all(|(at, &byte)| written.contains(&at) || byte == GUARD),
        "a byte outside the exposed range changed"
    );
    let mut readable_slot = scene.pool.try_acquire_owned().unwrap();
    for (at, byte) in readable_slot.iter_mut().enumerate() {
        *byte = at as u8;
    }
    let readable = scene.expose(&readable_slot, 128, Access::Read);
    let status = scene
        .peer
        .attempt(Attack::Read, readable.addr, readable.key);
    assert_eq!(status_name(status), Some("IBV_WC_SUCCESS"));
    assert_eq!(
        &scene.peer.buffer[..LEN as usize],
        &readable_slot[128..128 + LEN as usize]
    );
    assert_eq!(scene.endpoint.state(), EndpointState::Open);
    scene.endpoint.revoke(writable).unwrap();
    scene.endpoint.revoke(readable).unwrap();
}

#[test]
fn a_key_never_exposed_is_refused() {
    let Some(mut scene) = Scene::new() else {
        return;
    };
    let victim = scene.victim();
    let exposed = scene.expose(&victim, 0, Access::Write);
    // A key next to one in force: the next key a window of the device would take.
    let guessed = exposed.key.wrapping_add(1);
    scene.refused(Attack::Write, exposed.addr, guessed, &victim);
}

#[test]
fn a_revoked_key_is_refused() {
    let Some(mut scene) = Scene::new() else {
        return;
    };
    let victim = scene.victim();
    let exposed = scene.expose(&victim, 0, Access::Write);
    scene.endpoint.revoke(exposed).unwrap();
    scene.refused(Attack::Write, exposed.addr, exposed.key, &victim);
}

#[test]
fn a_write_past_the_exposed_range_is_refused() {
    let Some(mut scene) = Scene::new() else {
        return;
    };
    let victim = scene.victim();
    let exposed = scene.expose(&victim, 0, Access::Write);
    // The last byte falls one past the range.
    scene.refused(Attack::Write, exposed.addr + 1, exposed.key, &victim);
}

#[test]
fn a_read_past_the_exposed_range_is_refused() {
    let Some(mut scene) = Scene::new() else {
        return;
    };
    let victim = scene.victim();
    let exposed = scene.expose(&victim, 8, Access::Read);
    scene.refused(Attack::Read, exposed.addr + 1, exposed.key, &victim);
}

#[test]
fn a_write_under_a_read_exposure_and_an_atomic_under_a_write_one_are_refused() {
    let Some(mut scene) = Scene::new() else {
        return;
    };
    let victim = scene.victim();
    let readable = scene.expose(&victim, 0, Access::Read);
    scene.refused(Attack::Write, readable.addr, readable.key, &victim);
    let Some(mut scene) = Scene::new() else {
        return;
    };
    let victim = scene.victim();
    let writable = scene.expose(&victim, 0, Access::Write);
    scene.refused(Attack::FetchAdd, writable.addr, writable.key, &victim);
}

/// A key exposed on another connection of the same provider: with memory windows it is
/// bound to that connection's queue pair, and refused on this one. The fallback's
/// registrations are the protection domain's, so there the write is carried out: the
/// weaker guarantee `docs/threats.md` states, checked here so that it stays known.
#[test]
fn another_connection_s_key_is_refused_with_windows() {
    let Some(mut scene) = Scene::new() else {
        return;
    };
    let victim = scene.victim();
    let (mut other, _its_peer) = scene.provider.pair(&EndpointOptions::default()).unwrap();
    let range = BufferRef::from(&victim).prefix(LEN).unwrap();
    // SAFETY: the slot is read only once the peer's request completed.
    let exposed = unsafe { other.expose(range, Access::Write) }.unwrap();
    match scene.provider.exposures() {
        Exposures::Windows => scene.refused(Attack::Write, exposed.addr, exposed.key, &victim),
        Exposures::Registrations => {
            let status = scene.peer.attempt(Attack::Write, exposed.addr, exposed.key);
            assert_eq!(status_name(status), Some("IBV_WC_SUCCESS"));
            println!("registrations: another connection's key was carried out, as documented");
        }
    }
    other.revoke(exposed).unwrap();
}
