//! [`VerbsEndpoint`]: one side of a reliable-connected queue pair, with a completion
//! queue per direction and a completion channel to sleep on.
//!
//! # Invariants
//!
//! - Every request the device holds is listed, per queue and in posting order, in
//!   `in_device`; a completion taken from a completion queue is the oldest request of its
//!   queue (a reliable connection completes each queue in order, errors included). So
//!   each request completes exactly once: from its completion queue while the queue pair
//!   lives, or as `Flushed` when the queue pair is destroyed with the request still
//!   listed.
//! - `outstanding` counts requests posted and not yet handed to the caller, wherever
//!   they wait (in the device, or in `ready`); posting stops at the depths, and each
//!   completion queue has room for its queue's depth, so a completion queue never
//!   overruns.
//! - Closing (or learning that the peer closed) destroys the queue pair: first every
//!   completion already made is taken, then the queue pair and its completion queues are
//!   destroyed, after which the device touches none of the endpoint's buffers, then every
//!   request still listed completes as `Flushed`.
//! - **Waking.** Both completion queues report to the endpoint's one completion channel.
//!   `arm` asks each queue for an event at its next completion (`ibv_req_notify_cq`) and
//!   only then looks at both queues: a completion made before the request is found by
//!   the look, one made after it raises an event. `disarm` reads every event and
//!   acknowledges it at once, so destroying a queue never waits on an unacknowledged
//!   event (`ibv_destroy_cq` would). The endpoint's descriptor is an `epoll` set holding
//!   the channel and the handshake socket, so the peer's close or death wakes a sleeper
//!   too; both live as long as the endpoint, the channel beyond its queues.

use std::collections::VecDeque;
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::Arc;
use std::task::Waker;
use std::time::{Duration, Instant};

use rdma_mummy_sys::{
    ibv_ack_cq_events, ibv_cq, ibv_get_cq_event, ibv_poll_cq, ibv_post_recv, ibv_post_send,
    ibv_recv_wr, ibv_req_notify_cq, ibv_send_flags, ibv_send_wr, ibv_sge, ibv_wc, ibv_wc_status,
    ibv_wr_opcode,
};
use rustix::event::epoll;
use sideway::ibverbs::AccessFlags;
use sideway::ibverbs::address::{AddressHandleAttribute, Gid};
use sideway::ibverbs::completion::{
    BasicCompletionQueue, CompletionChannel, CompletionQueue, CompletionQueueBuilder,
};
use sideway::ibverbs::queue_pair::{
    BasicQueuePair, QueuePair, QueuePairAttribute, QueuePairBuilder, QueuePairState, QueuePairType,
};
use tierbuf_tiers::TierIndex;

use super::device::OpenDevice;
use super::error::VerbsError;
use super::handshake::{Hello, QueuePairAddress};
use super::registrar::DeviceMemory;
use super::rendezvous::{PeerWatch, Rendezvous};
use super::status::DeviceFailure;
use crate::error::{PostError, QueueKind, TransportError};
use crate::provider::{
    Armed, BufferRef, Completion, CompletionStatus, Endpoint, EndpointLimits, EndpointState,
    Opcode, Outstanding, Readiness,
};
use crate::registry::{RegionCache, RegionTable, Resolved};

/// The deepest queue a verbs endpoint asks the device for. Devices differ (`ibv_devinfo
/// -v` shows `max_qp_wr` and `max_cqe`); a depth past the device's own is refused before
/// anything is created ([`VerbsError::DepthPastDevice`],
/// [`VerbsProvider::max_queue_depth`](super::VerbsProvider::max_queue_depth)).
///
/// ```
/// use tierbuf_transport::verbs::{EndpointOptions, MAX_QUEUE_DEPTH};
/// assert!(EndpointOptions::default().recv_depth <= MAX_QUEUE_DEPTH);
/// ```
pub const MAX_QUEUE_DEPTH: u32 = 1 << 15;

/// The longest message a reliable connection carries (InfiniBand's `max_msg_sz` of 2 GiB).
///
/// ```
/// assert_eq!(tierbuf_transport::verbs::MAX_MESSAGE_LEN, 2 << 30);
/// ```
pub const MAX_MESSAGE_LEN: u32 = 1 << 31;

/// RNR retry count 7 means "retry forever": a send meeting no posted receive waits, as
/// the provider contract requires.
const RNR_RETRY_FOREVER: u8 = 7;
/// How long a receiver tells a sender to back off when no receive is posted: 0.64 ms.
const MIN_RNR_TIMER: u8 = 12;
/// How long a sender waits for an acknowledgement before retransmitting:
/// 4.096 µs × 2^14, about 67 ms.
const ACK_TIMEOUT: u8 = 14;
/// Retransmissions before a send fails with `RetryExceeded`.
const RETRY_COUNT: u8 = 7;
/// Work completions taken from a completion queue per call.
const POLL_BATCH: usize = 32;
/// How often an idle `poll` checks whether the peer went away.
const PEER_CHECK_INTERVAL: Duration = Duration::from_millis(1);

/// How an endpoint is connected.
///
/// ```
/// use std::time::Duration;
/// use tierbuf_transport::verbs::EndpointOptions;
/// let options = EndpointOptions { recv_depth: 128, handshake_timeout: Duration::from_secs(2), ..EndpointOptions::default() };
/// assert_eq!(options.send_depth, 64);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EndpointOptions {
    /// Most sends outstanding (`max_send_wr`), in `1..=`[`MAX_QUEUE_DEPTH`].
    pub send_depth: u32,
    /// Most receives outstanding (`max_recv_wr`), in `1..=`[`MAX_QUEUE_DEPTH`].
    pub recv_depth: u32,
    /// The tier the connection starts on; the peer must start on the same.
    pub initial_tier: TierIndex,
    /// How long connecting waits for the peer, and for each of its handshake frames.
    pub handshake_timeout: Duration,
}

impl Default for EndpointOptions {
    /// 64 sends and 64 receives, tier 0, and a 10-second handshake timeout.
    fn default() -> EndpointOptions {
        EndpointOptions {
            send_depth: 64,
            recv_depth: 64,
            initial_tier: TierIndex::SMALLEST,
            handshake_timeout: Duration::from_secs(10),
        }
    }
}

impl EndpointOptions {
    /// Checks the depths against the provider's bound and `device`'s own.
    pub(crate) fn check(&self, device: &OpenDevice) -> Result<(), VerbsError> {
        self.check_against(device.name(), device.max_queue_depth())
    }

    /// Checks the depths against the provider's bound and `device_max`, the deepest
    /// queue the device named `device` takes.
    fn check_against(&self, device: &str, device_max: u32) -> Result<(), VerbsError> {
        for (queue, depth) in [
            (QueueKind::Send, self.send_depth),
            (QueueKind::Recv, self.recv_depth),
        ] {
            if !(1..=MAX_QUEUE_DEPTH).contains(&depth) {
                return Err(VerbsError::InvalidDepth {
                    queue,
                    depth,
                    max: MAX_QUEUE_DEPTH,
                });
            }
            if depth > device_max {
                return Err(VerbsError::DepthPastDevice {
                    device: device.to_owned(),
                    queue,
                    depth,
                    max: device_max,
                });
            }
        }
        Ok(())
    }
}

/// A queue pair connected to its peer's, and the completion queues it reports to.
struct Connected {
    /// Declared first: destroyed before the completion queues.
    queue_pair: BasicQueuePair,
    send: Arc<BasicCompletionQueue>,
    recv: Arc<BasicCompletionQueue>,
}

impl Connected {
    fn queue(&self, opcode: Opcode) -> &BasicCompletionQueue {
        match opcode {
            Opcode::Send => &self.send,
            Opcode::Recv => &self.recv,
        }
    }
}

/// Requests the device holds, by queue, in posting order.
#[derive(Debug, Default)]
struct InDevice {
    sends: VecDeque<u64>,
    recvs: VecDeque<u64>,
}

impl InDevice {
    fn queue(&mut self, opcode: Opcode) -> &mut VecDeque<u64> {
        match opcode {
            Opcode::Send => &mut self.sends,
            Opcode::Recv => &mut self.recvs,
        }
    }
}

/// One side of a verbs connection; see [`Endpoint`] for the rules it keeps. Dropping it
/// closes it, and the peer learns of it through the connection socket.
///
/// ```no_run
/// use tierbuf_pool::{MemoryBudget, SlotPool};
/// use tierbuf_transport::{BufferRef, Completion, CompletionStatus, Endpoint, EndpointState, Provider};
/// use tierbuf_transport::verbs::{EndpointOptions, VerbsConfig, VerbsProvider};
/// let provider = VerbsProvider::open(&VerbsConfig::new("rxe0"), MemoryBudget::with_cap(64 << 20))?;
/// let pool = SlotPool::new(&*provider.registrar(), 4096, 2)?;
/// let (mut a, mut b) = provider.pair(&EndpointOptions::default())?;
/// println!("{} connected to queue pair {}", a.device_name(), a.peer_queue_pair().num);
/// let inbox = pool.try_acquire_owned().unwrap();
/// // SAFETY: the slot is left alone until its completion is polled or `a` is closed.
/// unsafe { a.post_recv(BufferRef::from(&inbox), 1)? };
/// drop(b);
/// let mut completions = [Completion::default(); 1];
/// while a.poll(&mut completions)? == 0 {}
/// assert_eq!(completions[0].status, CompletionStatus::Flushed);
/// assert_eq!(a.state(), EndpointState::PeerClosed);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct VerbsEndpoint {
    /// `None` once closed or once the peer is gone. Declared before `channel`: the
    /// completion queues are destroyed before their channel.
    connected: Option<Connected>,
    channel: Arc<CompletionChannel>,
    /// The `epoll` set of the channel and the peer socket: the endpoint's descriptor.
    wake: OwnedFd,
    device: Arc<OpenDevice>,
    regions: RegionCache<DeviceMemory>,
    limits: EndpointLimits,
    in_device: InDevice,
    outstanding: Outstanding,
    /// Completions taken from the device, or made for the requests it still held at
    /// teardown, not yet handed to the caller.
    ready: VecDeque<Completion>,
    state: EndpointState,
    /// The first error completion, as the device reported it.
    failure: Option<DeviceFailure>,
    peer: PeerWatch,
    next_peer_check: Instant,
    local: Hello,
    remote: Hello,
    work_completions: [MaybeUninit<ibv_wc>; POLL_BATCH],
}

impl VerbsEndpoint {
    /// Creates a queue pair on `device`, runs the handshake over `rendezvous`, and connects
    /// the queue pair to the peer's.
    pub(crate) fn establish(
        device: &Arc<OpenDevice>,
        table: &Arc<RegionTable<DeviceMemory>>,
        mut rendezvous: Rendezvous,
        options: &EndpointOptions,
    ) -> Result<VerbsEndpoint, VerbsError> {
        let channel = CompletionChannel::new(device.context()).map_err(|source| {
            device.error(
                "creating the completion channel (ibv_create_comp_channel)",
                source,
            )
        })?;
        channel
            .set_nonblocking(true)
            .map_err(|source| device.error("making the completion channel non-blocking", source))?;
        let completion_queue = |depth: u32, operation| {
            CompletionQueueBuilder::new(device.context())
                .setup_cqe(depth)
                .setup_comp_channel(&channel, 0)
                .build()
                .map_err(|source| device.error(operation, source))
        };
        let send = completion_queue(
            options.send_depth,
            "creating the send completion queue (ibv_create_cq)",
        )?;
        let recv = completion_queue(
            options.recv_depth,
            "creating the receive completion queue (ibv_create_cq)",
        )?;
        let mut queue_pair = QueuePairBuilder::new(device.domain())
            .setup_qp_type(QueuePairType::ReliableConnection)
            .setup_max_send_wr(options.send_depth)
            .setup_max_recv_wr(options.recv_depth)
            .setup_max_send_sge(1)
            .setup_max_recv_sge(1)
            .setup_send_cq(Arc::clone(&send))
            .setup_recv_cq(Arc::clone(&recv))
            .build()
            .map_err(|source| device.error("creating the queue pair (ibv_create_qp)", source))?;
        let mut init = QueuePairAttribute::new();
        // Local write only: no RDMA READ, WRITE or atomic of the peer's is carried out on
        // this side's memory, whatever keys it was told (its regions refuse them too).
        init.setup_state(QueuePairState::Init)
            .setup_pkey_index(0)
            .setup_port(device.port())
            .setup_access_flags(AccessFlags::LocalWrite);
        queue_pair.modify(&init).map_err(|source| {
            device.error("preparing the queue pair (ibv_modify_qp to INIT)", source)
        })?;
        let local = Hello {
            queue_pair: QueuePairAddress {
                num: queue_pair.qp_number(),
                lid: device.lid(),
                gid: device.path().gid.map(|gid| gid.value),
            },
            initial_tier: options.initial_tier,
        };
        let remote = rendezvous.exchange_hello(local)?;
        connect(device, &mut queue_pair, &remote.queue_pair)?;
        rendezvous.exchange_ready()?;
        let peer = rendezvous.into_watch()?;
        let wake = wake_set(&channel, &peer).map_err(|source| {
            device.error("making the endpoint's wake descriptor (epoll)", source)
        })?;
        Ok(VerbsEndpoint {
            connected: Some(Connected {
                queue_pair,
                send,
                recv,
            }),
            channel,
            wake,
            device: Arc::clone(device),
            regions: RegionCache::new(Arc::clone(table)),
            limits: EndpointLimits {
                send_depth: options.send_depth,
                recv_depth: options.recv_depth,
                max_gather: 1,
                max_message: MAX_MESSAGE_LEN,
            },
            in_device: InDevice::default(),
            outstanding: Outstanding::default(),
            ready: VecDeque::new(),
            state: EndpointState::Open,
            failure: None,
            peer,
            next_peer_check: Instant::now(),
            local,
            remote,
            work_completions: [MaybeUninit::uninit(); POLL_BATCH],
        })
    }

    /// This side's queue pair: number, LID and, for RoCE, GID.
    pub fn local_queue_pair(&self) -> QueuePairAddress {
        self.local.queue_pair
    }

    /// The peer's queue pair, as its handshake gave it.
    pub fn peer_queue_pair(&self) -> QueuePairAddress {
        self.remote.queue_pair
    }

    /// The name of the device this endpoint's queue pair is on.
    pub fn device_name(&self) -> &str {
        self.device.name()
    }

    /// The error completion that broke this endpoint, with the device's own status and
    /// vendor syndrome; `None` while no request has failed (flushes aside).
    pub fn failure(&self) -> Option<DeviceFailure> {
        self.failure
    }

    /// Posts `resolved`'s bytes (or the empty message when `None`) to the queue of
    /// `opcode`.
    ///
    /// # Safety
    ///
    /// The caller keeps the promise of [`Endpoint::post_recv`] (for a receive) or
    /// [`Endpoint::post_send`] (for a send) for the bytes posted.
    unsafe fn post(
        &mut self,
        opcode: Opcode,
        resolved: Option<Resolved<DeviceMemory>>,
        wr_id: u64,
    ) -> Result<(), PostError> {
        let Some(connected) = self.connected.as_mut() else {
            return Err(PostError::Closed);
        };
        let mut element = resolved.as_ref().map(|resolved| ibv_sge {
            addr: DeviceMemory::address_of(resolved),
            length: resolved.len,
            lkey: resolved.region.region().local_key(),
        });
        // One request of at most one element, built on the stack: `sideway`'s post guards
        // would allocate their request lists on every post.
        let (sg_list, num_sge) = match element.as_mut() {
            Some(element) => (element as *mut ibv_sge, 1),
            None => (std::ptr::null_mut(), 0),
        };
        // SAFETY: the queue pair is alive (`connected` holds it).
        let queue_pair = unsafe { connected.queue_pair.qp() }.as_ptr();
        // SAFETY: the requests and their element are valid for the call, which copies
        // them. The device reaches the posted bytes until the request's completion has
        // been polled. The caller promises to leave them alone that long (this function's
        // contract), or until the endpoint is closed; closing destroys the queue pair
        // first, after which the device touches nothing. The owner may deregister the
        // region earlier: the device then fails the request with a protection error and
        // no longer reaches the memory (verbs semantics), so unmapping it is sound. The
        // address and length lie inside the registered region (checked by `resolve`).
        // The empty message names no bytes at all.
        let errno = unsafe {
            match opcode {
                Opcode::Send => {
                    let mut request: ibv_send_wr = MaybeUninit::zeroed().assume_init();
                    request.wr_id = wr_id;
                    request.sg_list = sg_list;
                    request.num_sge = num_sge;
                    request.opcode = ibv_wr_opcode::IBV_WR_SEND;
                    request.send_flags = ibv_send_flags::IBV_SEND_SIGNALED.0;
                    let mut refused = std::ptr::null_mut();
                    ibv_post_send(queue_pair, &mut request, &mut refused)
                }
                Opcode::Recv => {
                    let mut request = ibv_recv_wr {
                        wr_id,
                        next: std::ptr::null_mut(),
                        sg_list,
                        num_sge,
                    };
                    let mut refused = std::ptr::null_mut();
                    ibv_post_recv(queue_pair, &mut request, &mut refused)
                }
            }
        };
        let posted = if errno == 0 {
            Ok(())
        } else {
            // `ENOMEM` is a queue out of entries; anything else breaks the queue pair.
            let error = std::io::Error::from_raw_os_error(errno);
            Err((error.kind() != std::io::ErrorKind::OutOfMemory).then_some(error))
        };
        match posted {
            Ok(()) => {
                self.in_device.queue(opcode).push_back(wr_id);
                match opcode {
                    Opcode::Send => self.outstanding.sends += 1,
                    Opcode::Recv => self.outstanding.recvs += 1,
                }
                Ok(())
            }
            Err(error) => Err(self.refused(opcode, error)),
        }
    }

    /// The post error for a request the device refused: `None` for a device short of
    /// queue entries (a full queue), else what it said, which means the queue pair is
    /// unusable.
    fn refused(&mut self, opcode: Opcode, error: Option<std::io::Error>) -> PostError {
        let queue = match opcode {
            Opcode::Send => QueueKind::Send,
            Opcode::Recv => QueueKind::Recv,
        };
        let Some(error) = error else {
            let depth = match queue {
                QueueKind::Send => self.outstanding.sends,
                QueueKind::Recv => self.outstanding.recvs,
            };
            return PostError::QueueFull { queue, depth };
        };
        tracing::error!(
            device = self.device.name(),
            %queue,
            %error,
            "the device refused a post; the connection is broken"
        );
        self.state = EndpointState::Broken;
        PostError::ConnectionBroken
    }

    /// Moves completions waiting in `ready` into `completions`.
    fn take_ready(&mut self, completions: &mut [Completion]) -> usize {
        let ready = &mut self.ready;
        self.outstanding.hand_out(completions, || ready.pop_front())
    }

    /// Takes up to one batch of completions from the completion queue of `opcode` into
    /// `ready`, returning how many it took.
    fn fetch(&mut self, opcode: Opcode) -> Result<usize, TransportError> {
        let Some(connected) = &self.connected else {
            return Ok(0);
        };
        let queue = raw_queue(connected.queue(opcode));
        // SAFETY: the queue is alive (`connected` holds it) and polled by this endpoint
        // alone; the array has room for `POLL_BATCH` work completions, which is what the
        // device may write.
        let taken = unsafe {
            ibv_poll_cq(
                queue,
                POLL_BATCH as i32,
                self.work_completions.as_mut_ptr().cast(),
            )
        };
        if taken < 0 {
            return Err(TransportError::Provider {
                provider: "verbs",
                operation: "polling a completion queue (ibv_poll_cq)",
                source: std::io::Error::from_raw_os_error(-taken),
            });
        }
        let taken = taken as usize;
        for slot in &self.work_completions[..taken] {
            // SAFETY: `ibv_poll_cq` wrote the first `taken` entries.
            let work_completion = unsafe { slot.assume_init_ref() };
            let completion = complete(
                work_completion,
                opcode,
                &mut self.in_device,
                &mut self.state,
                &mut self.failure,
                self.device.name(),
            );
            self.ready.push_back(completion);
        }
        Ok(taken)
    }

    /// Takes every completion the device has made for this endpoint into `ready`.
    fn drain(&mut self) -> Result<(), TransportError> {
        for opcode in [Opcode::Send, Opcode::Recv] {
            while self.fetch(opcode)? == POLL_BATCH {}
        }
        Ok(())
    }

    /// Destroys the queue pair, so that the device no longer touches any buffer of this
    /// endpoint; every request it held completes, as the device finished it or flushed.
    fn tear_down(&mut self) {
        if self.connected.is_none() {
            return;
        }
        if let Err(error) = self.drain() {
            // The requests left behind complete as flushed below.
            tracing::warn!(device = self.device.name(), %error, "draining a completion queue at teardown failed");
        }
        self.take_events();
        // Destroys the queue pair, then its completion queues.
        self.connected = None;
        for (opcode, queue) in [
            (Opcode::Send, &mut self.in_device.sends),
            (Opcode::Recv, &mut self.in_device.recvs),
        ] {
            self.ready.extend(queue.drain(..).map(|wr_id| Completion {
                wr_id,
                byte_len: 0,
                status: CompletionStatus::Flushed,
                opcode,
            }));
        }
    }

    /// Checks, at most once per [`PEER_CHECK_INTERVAL`], whether the peer went away; if it
    /// did, tears this side down too.
    fn watch_peer(&mut self) {
        if self.connected.is_none() {
            return;
        }
        let now = Instant::now();
        if now < self.next_peer_check {
            return;
        }
        self.next_peer_check = now + PEER_CHECK_INTERVAL;
        if self.peer.peer_gone() {
            self.tear_down();
            if self.state == EndpointState::Open {
                self.state = EndpointState::PeerClosed;
            }
        }
    }

    /// Asks both completion queues for an event at their next completion. `false` if the
    /// device refused (the caller then polls instead of sleeping).
    fn request_events(&self) -> bool {
        let Some(connected) = &self.connected else {
            return false;
        };
        [Opcode::Send, Opcode::Recv].into_iter().all(|opcode| {
            // SAFETY: the queue is alive (`connected` holds it).
            let requested = unsafe { ibv_req_notify_cq(raw_queue(connected.queue(opcode)), 0) };
            if requested != 0 {
                tracing::warn!(
                    device = self.device.name(),
                    errno = requested,
                    "requesting a completion event (ibv_req_notify_cq) failed"
                );
            }
            requested == 0
        })
    }

    /// Reads every completion event the channel holds and acknowledges each at once.
    fn take_events(&mut self) {
        // SAFETY: the channel lives as long as this endpoint.
        let channel = unsafe { self.channel.comp_channel() };
        loop {
            let mut queue: *mut ibv_cq = std::ptr::null_mut();
            let mut context = std::ptr::null_mut();
            // SAFETY: the channel is non-blocking, so this returns at once; `queue` and
            // `context` are valid places for what it reports.
            let got = unsafe { ibv_get_cq_event(channel.as_ptr(), &mut queue, &mut context) };
            if got != 0 {
                // No event left (EAGAIN), or none readable: either way nothing to ack.
                break;
            }
            // SAFETY: `queue` is one of this endpoint's completion queues, alive: an event
            // is read only while they live (`tear_down` reads before destroying them).
            unsafe { ibv_ack_cq_events(queue, 1) };
        }
    }
}

/// The raw handle of `queue`, for the calls `sideway` leaves to the C API.
fn raw_queue(queue: &BasicCompletionQueue) -> *mut ibv_cq {
    // SAFETY: the handle is used only while `queue` lives (every caller holds it).
    unsafe { queue.cq() }.as_ptr()
}

/// Moves `queue_pair`, in INIT, to RTR and RTS, connected to the peer at `remote`.
fn connect(
    device: &OpenDevice,
    queue_pair: &mut BasicQueuePair,
    remote: &QueuePairAddress,
) -> Result<(), VerbsError> {
    let (local_has_gid, peer_has_gid) = (device.gid_index().is_some(), remote.gid.is_some());
    let mut path = AddressHandleAttribute::new();
    path.setup_dest_lid(remote.lid).setup_port(device.port());
    match (device.gid_index(), remote.gid) {
        (Some(gid_index), Some(gid)) => {
            // The index was checked against the GID table when the device was opened;
            // tables hold far fewer than 256 entries.
            path.setup_grh(&Gid::from(gid), 0, gid_index as u8, 0xff, 0);
        }
        (None, None) => {}
        _ => {
            return Err(VerbsError::RoutingMismatch {
                local_has_gid,
                peer_has_gid,
            });
        }
    }
    let mut ready_to_receive = QueuePairAttribute::new();
    ready_to_receive
        .setup_state(QueuePairState::ReadyToReceive)
        .setup_path_mtu(device.path_mtu())
        .setup_dest_qp_num(remote.num)
        .setup_rq_psn(0)
        .setup_max_dest_read_atomic(0)
        .setup_min_rnr_timer(MIN_RNR_TIMER)
        .setup_address_vector(&path);
    queue_pair.modify(&ready_to_receive).map_err(|source| {
        device.error(
            "connecting the queue pair to the peer's (ibv_modify_qp to RTR)",
            source,
        )
    })?;
    let mut ready_to_send = QueuePairAttribute::new();
    ready_to_send
        .setup_state(QueuePairState::ReadyToSend)
        .setup_sq_psn(0)
        .setup_timeout(ACK_TIMEOUT)
        .setup_retry_cnt(RETRY_COUNT)
        .setup_rnr_retry(RNR_RETRY_FOREVER)
        .setup_max_read_atomic(0);
    queue_pair.modify(&ready_to_send).map_err(|source| {
        device.error(
            "readying the queue pair to send (ibv_modify_qp to RTS)",
            source,
        )
    })
}

/// An `epoll` set of `channel` and `peer`'s socket: readable when a completion event
/// comes, or when the peer closes or dies.
fn wake_set(channel: &CompletionChannel, peer: &PeerWatch) -> std::io::Result<OwnedFd> {
    use std::os::fd::{AsRawFd, BorrowedFd};
    let set = epoll::create(epoll::CreateFlags::CLOEXEC)?;
    // SAFETY: the channel's descriptor stays open while `channel` lives, and the set is
    // only read while the endpoint holding both lives.
    let channel_fd = unsafe { BorrowedFd::borrow_raw(channel.as_raw_fd()) };
    for fd in [channel_fd, peer.as_fd()] {
        epoll::add(
            &set,
            fd,
            epoll::EventData::new_u64(0),
            epoll::EventFlags::IN | epoll::EventFlags::RDHUP,
        )?;
    }
    Ok(set)
}

/// The completion of `work_completion`, taken from the queue of `opcode`: the oldest
/// request of that queue. An error completion breaks the connection; the first one that
/// is not a flush is kept in `failure`.
fn complete(
    work_completion: &ibv_wc,
    opcode: Opcode,
    in_device: &mut InDevice,
    state: &mut EndpointState,
    failure: &mut Option<DeviceFailure>,
    device: &str,
) -> Completion {
    let wr_id = work_completion.wr_id;
    let oldest = in_device.queue(opcode).pop_front();
    debug_assert_eq!(
        oldest,
        Some(wr_id),
        "a reliable connection completes each queue in posting order"
    );
    let failed = DeviceFailure::new(
        wr_id,
        opcode,
        work_completion.status,
        work_completion.vendor_err,
    );
    let status = failed.status;
    if work_completion.status != ibv_wc_status::IBV_WC_SUCCESS {
        if status == CompletionStatus::Flushed {
            tracing::debug!(device, wr_id, ?opcode, "request flushed");
        } else {
            tracing::warn!(device, "{failed}; the connection is broken");
            failure.get_or_insert(failed);
        }
        if *state == EndpointState::Open {
            *state = EndpointState::Broken;
        }
    }
    let byte_len = match (opcode, status) {
        (Opcode::Recv, CompletionStatus::Success) => work_completion.byte_len,
        _ => 0,
    };
    Completion {
        wr_id,
        byte_len,
        status,
        opcode,
    }
}

impl Endpoint for VerbsEndpoint {
    fn limits(&self) -> EndpointLimits {
        self.limits
    }

    fn state(&self) -> EndpointState {
        self.state
    }

    fn outstanding(&self) -> Outstanding {
        self.outstanding
    }

    unsafe fn post_recv(&mut self, buffer: BufferRef, wr_id: u64) -> Result<(), PostError> {
        self.state.admits_posts()?;
        self.outstanding.check_room(QueueKind::Recv, self.limits)?;
        let resolved = self.regions.resolve(buffer)?;
        // SAFETY: the caller keeps `post_recv`'s promise for `buffer`'s bytes.
        unsafe { self.post(Opcode::Recv, Some(resolved), wr_id) }
    }

    unsafe fn post_send(&mut self, gather: &[BufferRef], wr_id: u64) -> Result<(), PostError> {
        self.state.admits_posts()?;
        self.outstanding.check_room(QueueKind::Send, self.limits)?;
        // At most one buffer (`max_gather` is 1) of at most `max_message` bytes.
        self.limits.message_len(gather)?;
        let resolved = match gather.first() {
            Some(buffer) => Some(self.regions.resolve(*buffer)?),
            None => None,
        };
        // SAFETY: the caller keeps `post_send`'s promise for the gather list's bytes.
        unsafe { self.post(Opcode::Send, resolved, wr_id) }
    }

    fn poll(&mut self, completions: &mut [Completion]) -> Result<usize, TransportError> {
        for opcode in [Opcode::Send, Opcode::Recv] {
            while self.ready.len() < completions.len() && self.fetch(opcode)? == POLL_BATCH {}
        }
        if self.ready.is_empty() {
            self.watch_peer();
        }
        Ok(self.take_ready(completions))
    }

    fn close(&mut self) {
        if self.state == EndpointState::Closed {
            return;
        }
        self.tear_down();
        self.peer.close();
        self.state = EndpointState::Closed;
    }

    fn readiness(&self) -> Readiness<'_> {
        Readiness::Fd(self.wake.as_fd())
    }

    fn arm(&mut self, _waker: &Waker) -> Armed {
        self.watch_peer();
        if !self.ready.is_empty() || self.state != EndpointState::Open || !self.request_events() {
            return Armed::Pending;
        }
        // Looked at after the requests (module invariants).
        for opcode in [Opcode::Send, Opcode::Recv] {
            if self.fetch(opcode).map_or(true, |taken| taken > 0) {
                return Armed::Pending;
            }
        }
        Armed::Parked
    }

    fn disarm(&mut self) {
        self.take_events();
        // A wake may have been the peer's close: look at the socket at the next idle poll.
        self.next_peer_check = Instant::now();
    }
}

impl Drop for VerbsEndpoint {
    fn drop(&mut self) {
        self.close();
    }
}

impl std::fmt::Debug for VerbsEndpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VerbsEndpoint")
            .field("device", &self.device.name())
            .field("local", &self.local)
            .field("remote", &self.remote)
            .field("limits", &self.limits)
            .field("state", &self.state)
            .field("outstanding", &self.outstanding)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn depths(send_depth: u32, recv_depth: u32) -> EndpointOptions {
        EndpointOptions {
            send_depth,
            recv_depth,
            ..EndpointOptions::default()
        }
    }

    #[test]
    fn depths_past_the_provider_or_the_device_are_refused_and_say_which() {
        assert!(depths(4063, 4063).check_against("nic0", 4063).is_ok());
        assert!(matches!(
            depths(0, 16).check_against("nic0", 4063),
            Err(VerbsError::InvalidDepth {
                queue: QueueKind::Send,
                depth: 0,
                ..
            })
        ));
        assert!(matches!(
            depths(16, MAX_QUEUE_DEPTH + 1).check_against("mlx5_0", u32::MAX),
            Err(VerbsError::InvalidDepth {
                queue: QueueKind::Recv,
                max: MAX_QUEUE_DEPTH,
                ..
            })
        ));
        let error = depths(16, 4064)
            .check_against("nic0", 4063)
            .expect_err("one past the device's max_qp_wr");
        assert!(matches!(
            &error,
            VerbsError::DepthPastDevice { device, queue: QueueKind::Recv, depth: 4064, max: 4063 }
                if device == "nic0"
        ));
        assert_eq!(
            error.to_string(),
            "RDMA device \"nic0\" takes receive queues of at most 4063 work requests (the \
             least of its max_qp_wr and max_cqe), not 4064: ask for fewer"
        );
        assert!(matches!(
            depths(4064, 16).check_against("nic0", 4063),
            Err(VerbsError::DepthPastDevice {
                queue: QueueKind::Send,
                ..
            })
        ));
    }
}
