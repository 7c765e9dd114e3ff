//! A hostile verbs peer: one that was told a region's address and remote key (as every
//! promotion's answer tells it) and tries to reach the region with one-sided operations
//! instead of sending into a posted receive. The verbs provider registers memory for local
//! access only and connects its queue pairs with local write only, so an RDMA WRITE, an
//! RDMA READ and an atomic all fail on the peer's side and leave the region as it was.
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
use tierbuf_pool::{MemoryBudget, SlotPool};
use tierbuf_tiers::TierIndex;
use tierbuf_transport::Provider;
use tierbuf_transport::verbs::handshake::{Hello, QueuePairAddress};
use tierbuf_transport::verbs::rendezvous::{PeerWatch, Rendezvous};
use tierbuf_transport::verbs::{
    EndpointOptions, VerbsConfig, VerbsEndpoint, VerbsProvider, ibv_wc_status, status_name,
};

const DEVICE_VARIABLE: &str = "TIERBUF_VERBS_DEVICE";
/// Far longer than a device takes to fail a request, soft-RoCE under an emulated CPU
/// included.
const WAIT: Duration = Duration::from_secs(120);

/// What the hostile peer tries on the region.
#[derive(Debug, Clone, Copy)]
enum Attack {
    Write,
    Read,
    FetchAdd,
}

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
        let mut buffer = Box::new([0xee_u8; 64]);
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

    /// Tries `attack` on the 8 bytes at `remote_addr` under `remote_key`; returns the
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
        unsafe { request.setup_sge(local_key, local, 8) };
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

fn one_sided_operations_on_a_told_region_fail(attack: Attack) {
    let Ok(device) = std::env::var(DEVICE_VARIABLE) else {
        println!("skipped: {DEVICE_VARIABLE} names no RDMA device; see docs/verbs.md");
        return;
    };
    let gid_index: Option<u32> = std::env::var("TIERBUF_VERBS_GID_INDEX")
        .ok()
        .map(|index| index.parse().expect("a GID index"));
    let mut config = VerbsConfig::new(&device);
    if let Some(index) = gid_index {
        config = config.with_gid_index(index);
    }
    let provider = VerbsProvider::open(&config, MemoryBudget::with_cap(1 << 20)).unwrap();
    // The same port and GID the provider goes out by, so that the two queue pairs reach
    // each other.
    let (port, gid_index) = (
        provider.path().port,
        provider.path().gid.map(|gid| gid.index),
    );
    let pool = SlotPool::new(&*provider.registrar(), 4096, 1).unwrap();
    let mut victim = pool.try_acquire_owned().unwrap();
    victim.fill(0x5a);
    let listener = provider
        .listen("127.0.0.1:0", EndpointOptions::default())
        .unwrap();
    let addr = listener.local_addr().unwrap();
    let accepting = std::thread::spawn(move || listener.accept().unwrap());
    let mut peer = HostilePeer::connect(&device, port, gid_index, addr);
    let endpoint: VerbsEndpoint = accepting.join().unwrap();
    let keys = pool.keys();
    let status = peer.attempt(attack, victim.remote_addr(), keys.remote_key);
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
        victim.iter().all(|&byte| byte == 0x5a),
        "the region changed under the peer's {attack:?}"
    );
    drop(endpoint);
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
