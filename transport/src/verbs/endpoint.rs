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
//! - **Exposures.** Each exposure in force holds its grant (a window over a registration
//!   of the range, or a registration with the remote right; `super::window`) and a strong
//!   reference to its region. A window's bind is listed in `in_device.sends` as the
//!   endpoint's own request, counted in no caller's `outstanding`; it is posted only with
//!   a send-queue entry to spare and waited for before `expose` returns, so at most one
//!   is in the device and the send queue and its completion queue never hold more than
//!   the depth. Teardown deallocates the windows (a bound window holds its queue pair),
//!   destroys the queue pair, then deregisters the ranges, and lets go of the regions
//!   last.

use std::collections::VecDeque;
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, OwnedFd};
use std::ptr::NonNull;
use std::sync::Arc;
use std::task::Waker;
use std::time::{Duration, Instant};

use rdma_mummy_sys::{
    ibv_ack_cq_events, ibv_cq, ibv_get_cq_event, ibv_poll_cq, ibv_post_recv, ibv_qp_ex,
    ibv_qp_to_qp_ex, ibv_recv_wr, ibv_req_notify_cq, ibv_sge, ibv_wc, ibv_wc_opcode, ibv_wc_status,
};
use rustix::event::epoll;
use sideway::ibverbs::AccessFlags;
use sideway::ibverbs::address::{AddressHandleAttribute, Gid};
use sideway::ibverbs::completion::{
    BasicCompletionQueue, CompletionChannel, CompletionQueue, CompletionQueueBuilder,
};
use sideway::ibverbs::queue_pair::{
    ExtendedQueuePair, QueuePair, QueuePairAttribute, QueuePairAttributeMask, QueuePairBuilder,
    QueuePairState, QueuePairType, SendOperationFlags,
};
use tierbuf_tiers::TierIndex;

use super::device::{Exposures, OpenDevice};
use super::error::VerbsError;
use super::handshake::{Hello, QueuePairAddress};
use super::registrar::DeviceMemory;
use super::rendezvous::{PeerWatch, Rendezvous};
use super::status::DeviceFailure;
use super::window::{self, Data, MemoryWindow, Purpose, RangeRegistration, SendWork};
use crate::error::{PostError, QueueKind, TransportError};
use crate::exposure::{Access, EXPOSURE_SLOTS};
use crate::provider::{
    Armed, BufferRef, CallerCopies, Completion, CompletionStatus, Endpoint, EndpointLimits,
    EndpointState, Opcode, Outstanding, Readiness, RemoteBuffer,
};
use crate::registry::{RegionCache, RegionTable, Registered, Resolved};

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
/// The inline data a queue pair asks for (`max_inline_data`): sends of up to this many
/// bytes go from the caller's memory, copied into the work request
/// ([`Endpoint::try_post_send_copied`]). A device that takes less says so when the queue
/// pair is made, and its figure is used; one that refuses any is asked for none.
const INLINE_REQUEST: u32 = 128;
/// The most parts of a send copied from the caller's memory: the connection layer gives
/// a frame's header and payload. Copied by the CPU into the request, they are not limited
/// by the scatter-gather elements of [`EndpointLimits::max_gather`].
const INLINE_PARTS: usize = 4;
/// How long `expose` waits for its window's bind to complete. The bind is carried out in
/// order on the send queue, so it waits behind sends that wait for the peer's receives;
/// past this the connection fails rather than leave a window half made.
const BIND_DEADLINE: Duration = Duration::from_secs(30);
/// The id of a window bind on the send queue. Never handed to the caller: requests are
/// known by their place in `InDevice::sends`, the id only cross-checks it.
const BIND_WR_ID: u64 = u64::MAX;

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
    queue_pair: ExtendedQueuePair,
    /// The queue pair's extended handle, through which the send queue is posted to.
    extended: NonNull<ibv_qp_ex>,
    send: Arc<BasicCompletionQueue>,
    recv: Arc<BasicCompletionQueue>,
}

// SAFETY: `extended` is a second handle of `queue_pair` (which is `Send`), used only
// through the endpoint that owns both.
unsafe impl Send for Connected {}

impl Connected {
    fn queue(&self, queue: QueueKind) -> &BasicCompletionQueue {
        match queue {
            QueueKind::Send => &self.send,
            QueueKind::Recv => &self.recv,
        }
    }
}

/// What a request on the send queue is: one of the caller's, or a window bind the
/// endpoint made for an exposure, whose completion nobody is handed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SendKind {
    Send,
    Write,
    /// A read of this many bytes: what its completion reports read.
    Read(u32),
    Bind,
}

/// A request on the send queue.
#[derive(Debug, Clone, Copy)]
struct SendRequest {
    wr_id: u64,
    kind: SendKind,
}

/// Requests the device holds, by queue, in posting order.
#[derive(Debug, Default)]
struct InDevice {
    sends: VecDeque<SendRequest>,
    recvs: VecDeque<u64>,
}

/// How an exposure's key was made, and undone at revocation.
enum Grant {
    /// A window over a registration of the range (`window` module); the window, declared
    /// first, is deallocated first, since the device keeps a registration a window lies
    /// in.
    Window {
        window: MemoryWindow,
        range: RangeRegistration,
    },
    Registration(RangeRegistration),
}

impl Grant {
    /// The key the peer names the exposure by.
    fn key(&self) -> u32 {
        match self {
            Grant::Window { window, .. } => window.key(),
            Grant::Registration(registration) => registration.key(),
        }
    }

    /// Deallocates the grant's window, if it has one: its key is refused from then on. A
    /// failure is reported, and left to the queue pair's destruction, which ends every
    /// access through the window.
    fn deallocate_window(&mut self) {
        if let Grant::Window { window, .. } = self
            && let Err(error) = window.deallocate()
        {
            tracing::warn!(%error, "deallocating a memory window (ibv_dealloc_mw) at teardown failed");
        }
    }

    /// Undoes the grant: when this returns `Ok`, the device refuses the key and no access
    /// through it touches memory.
    fn undo(&mut self) -> std::io::Result<()> {
        match self {
            Grant::Window { window, range } => {
                window.deallocate()?;
                // The key is refused already; a registration with no remote right that
                // fails to go is left to the drop, which reports it.
                if let Err(error) = range.deregister() {
                    tracing::warn!(%error, "deregistering a revoked window's range (ibv_dereg_mr) failed");
                }
                Ok(())
            }
            Grant::Registration(registration) => registration.deregister(),
        }
    }
}

/// An exposure in force.
struct Exposure {
    key: u32,
    /// Declared before `_region`: the range's registration is undone before the region
    /// it lies in can go.
    grant: Grant,
    /// Keeps the region registered and mapped while the peer may reach it.
    _region: Arc<Registered<DeviceMemory>>,
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
    /// The first error completion of a caller's request, as the device reported it.
    failure: Option<DeviceFailure>,
    /// The exposures in force, at most [`EXPOSURE_SLOTS`].
    exposures: Vec<Exposure>,
    /// The keys of the exposures the teardown ended, which `revoke` still takes.
    ended: Vec<u32>,
    /// The status of the window bind last completed, until `expose` takes it.
    bind_outcome: Option<ibv_wc_status::Type>,
    /// The most bytes a send copied into its work request carries (`max_inline_data`).
    max_inline: u32,
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
        let mut operations = SendOperationFlags::Send
            | SendOperationFlags::Write
            | SendOperationFlags::WriteWithImmediate
            | SendOperationFlags::Read;
        if device.exposures() == Exposures::Windows {
            operations |= SendOperationFlags::BindMemoryWindow;
        }
        let build = |inline: u32| {
            QueuePairBuilder::new(device.domain())
                .setup_qp_type(QueuePairType::ReliableConnection)
                .setup_max_send_wr(options.send_depth)
                .setup_max_recv_wr(options.recv_depth)
                .setup_max_send_sge(1)
                .setup_max_recv_sge(1)
                .setup_max_inline_data(inline)
                .setup_send_ops_flags(operations)
                .setup_send_cq(Arc::clone(&send))
                .setup_recv_cq(Arc::clone(&recv))
                .build_ex()
        };
        // A device that takes no inline data at all may refuse the request for some.
        let mut queue_pair = build(INLINE_REQUEST)
            .or_else(|_| build(0))
            .map_err(|source| device.error("creating the queue pair (ibv_create_qp_ex)", source))?;
        let (_, capabilities) = queue_pair
            .query(QueuePairAttributeMask::Capabilities)
            .map_err(|source| {
                device.error("reading the queue pair's limits (ibv_query_qp)", source)
            })?;
        // A device may give more than asked; the copy is made through a buffer of the size
        // asked for.
        let max_inline = capabilities.max_inline_data().min(INLINE_REQUEST);
        // SAFETY: the handle is used only while `queue_pair` lives (both are kept in
        // `Connected`); the queue pair was made by `ibv_create_qp_ex`, so it has one.
        let extended = NonNull::new(unsafe { ibv_qp_to_qp_ex(queue_pair.qp().as_ptr()) })
            .expect("a queue pair made by ibv_create_qp_ex has an extended handle");
        let mut init = QueuePairAttribute::new();
        // The peer's RDMA WRITEs and READs are carried out only through the keys of
        // exposures (memory windows or remote registrations of one range each): regions
        // are registered with no remote right, so a region's own key reaches nothing. No
        // atomic is carried out at all.
        init.setup_state(QueuePairState::Init)
            .setup_pkey_index(0)
            .setup_port(device.port())
            .setup_access_flags(
                AccessFlags::LocalWrite | AccessFlags::RemoteWrite | AccessFlags::RemoteRead,
            );
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
                extended,
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
            exposures: Vec::new(),
            ended: Vec::new(),
            bind_outcome: None,
            max_inline,
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

    /// Posts a receive into `resolved`'s bytes.
    ///
    /// # Safety
    ///
    /// The caller keeps the promise of [`Endpoint::post_recv`] for the bytes posted.
    unsafe fn post_receive(
        &mut self,
        resolved: Resolved<DeviceMemory>,
        wr_id: u64,
    ) -> Result<(), PostError> {
        let Some(connected) = self.connected.as_mut() else {
            return Err(PostError::Closed);
        };
        let mut element = element_of(&resolved);
        let mut request = ibv_recv_wr {
            wr_id,
            next: std::ptr::null_mut(),
            sg_list: &mut element,
            num_sge: 1,
        };
        let mut refused = std::ptr::null_mut();
        // SAFETY: the queue pair is alive (`connected` holds it); the request and its
        // element are valid for the call, which copies them. The device writes the bytes
        // until the request's completion has been polled; the caller promises to leave
        // them alone that long (this function's contract), or until the endpoint is
        // closed, which destroys the queue pair first, after which the device touches
        // nothing. The owner may deregister the region earlier: the device then fails the
        // request with a protection error and no longer reaches the memory (verbs
        // semantics), so unmapping it is sound. The address and length lie inside the
        // registered region (checked by `resolve`).
        let errno = unsafe {
            ibv_post_recv(
                connected.queue_pair.qp().as_ptr(),
                &mut request,
                &mut refused,
            )
        };
        if errno != 0 {
            return Err(self.refused(QueueKind::Recv, errno));
        }
        self.in_device.recvs.push_back(wr_id);
        self.outstanding.recvs += 1;
        Ok(())
    }

    /// Posts one request of the caller's (`kind` is not [`SendKind::Bind`]) to the send
    /// queue: `work` over `data`.
    ///
    /// # Safety
    ///
    /// The caller keeps the promise of the [`Endpoint`] method it posts for (`post_send`,
    /// `post_write`, `post_read`) for the bytes `data`'s elements name; those lie inside
    /// registered regions (checked by `resolve`). Inline data is read in the call only.
    unsafe fn post_to_send_queue(
        &mut self,
        wr_id: u64,
        kind: SendKind,
        work: SendWork,
        data: Data<'_>,
    ) -> Result<(), PostError> {
        let Some(connected) = self.connected.as_mut() else {
            return Err(PostError::Closed);
        };
        // SAFETY: the queue pair is alive (`connected` holds it), was made with every
        // operation `SendWork` names, and this endpoint alone posts to it (`&mut self`).
        // The device reaches the elements' bytes until the request's completion has been
        // polled; the caller promises to leave them alone that long, or until the
        // endpoint is closed, which destroys the queue pair first. A region deregistered
        // earlier fails the request with a protection error, after which the device no
        // longer reaches its memory. The empty message names no bytes at all.
        let errno = unsafe { window::post_send_work(connected.extended, wr_id, work, data) };
        if errno != 0 {
            return Err(self.refused(QueueKind::Send, errno));
        }
        self.in_device.sends.push_back(SendRequest { wr_id, kind });
        self.outstanding.sends += 1;
        Ok(())
    }

    /// The post error for a request the device refused with `errno`: `ENOMEM` is a queue
    /// out of entries (a full queue); anything else means the queue pair is unusable.
    fn refused(&mut self, queue: QueueKind, errno: i32) -> PostError {
        let error = std::io::Error::from_raw_os_error(errno);
        if error.kind() == std::io::ErrorKind::OutOfMemory {
            let depth = match queue {
                QueueKind::Send => self.outstanding.sends,
                QueueKind::Recv => self.outstanding.recvs,
            };
            return PostError::QueueFull { queue, depth };
        }
        tracing::error!(
            device = self.device.name(),
            %queue,
            %error,
            "the device refused a post; the connection is broken"
        );
        self.state = EndpointState::Broken;
        PostError::ConnectionBroken
    }

    /// The scatter-gather element of a gather list of at most one buffer (none for the
    /// empty message), checked against the registered regions.
    fn gather_element(&mut self, gather: &[BufferRef]) -> Result<Option<ibv_sge>, PostError> {
        match gather.first() {
            Some(buffer) => Ok(Some(element_of(&self.regions.resolve(*buffer)?))),
            None => Ok(None),
        }
    }

    /// The error of a verbs call an exposure needed that the device refused, saying which
    /// call and why (usually a resource the device ran out of).
    fn device_refused(&self, operation: &'static str, source: std::io::Error) -> PostError {
        tracing::warn!(device = self.device.name(), %source, "{operation} failed");
        PostError::ExposureRefused {
            operation,
            errno: source.raw_os_error().unwrap_or(0),
        }
    }

    /// Registers `len` bytes at `addr` of a region the caller holds for `purpose`.
    fn register_range(
        &self,
        addr: u64,
        len: u32,
        purpose: Purpose,
    ) -> Result<RangeRegistration, PostError> {
        // SAFETY: the range lies inside a region (checked by `resolve`) that the exposure
        // holds, so it stays mapped while the registration lives.
        let registered =
            unsafe { RangeRegistration::register(self.device.domain(), addr, len, purpose) };
        registered.map_err(|error| {
            self.device_refused("registering the exposed range (ibv_reg_mr)", error)
        })
    }

    /// A type 2 memory window over `len` bytes at `addr` for `access`, bound to this
    /// endpoint's queue pair over a registration of that range alone (`window` module
    /// says why), with that registration. The bind is posted on the send queue and waited
    /// for, since the key works only once it is carried out.
    fn bind_window(
        &mut self,
        addr: u64,
        len: u32,
        access: Access,
    ) -> Result<(MemoryWindow, RangeRegistration), PostError> {
        // The bind is a request on the send queue, which has room for the depth.
        self.outstanding.check_room(QueueKind::Send, self.limits)?;
        if self.connected.is_none() {
            return Err(PostError::Closed);
        }
        let range = self.register_range(addr, len, Purpose::Window)?;
        let mut window = MemoryWindow::allocate(self.device.domain()).map_err(|error| {
            self.device_refused("allocating a memory window (ibv_alloc_mw)", error)
        })?;
        let key = window.next_key();
        let Some(connected) = self.connected.as_ref() else {
            return Err(PostError::Closed);
        };
        // SAFETY: the queue pair is alive, made with the bind operation (exposures are
        // windows on this device), and posted to by this endpoint alone; the window was
        // just allocated; `range` was just registered for a window at `addr` for `len`
        // bytes and is kept with the window, which is deallocated first.
        let errno = unsafe {
            window::post_bind(
                connected.extended,
                BIND_WR_ID,
                &window,
                key,
                (&range, addr, len),
                access,
            )
        };
        if errno != 0 {
            return Err(self.refused(QueueKind::Send, errno));
        }
        self.in_device.sends.push_back(SendRequest {
            wr_id: BIND_WR_ID,
            kind: SendKind::Bind,
        });
        self.bind_outcome = None;
        let deadline = Instant::now() + BIND_DEADLINE;
        let status = loop {
            if let Some(status) = self.bind_outcome.take() {
                break status;
            }
            let taken = self.fetch(QueueKind::Send).map_err(|error| {
                tracing::error!(device = self.device.name(), %error, "waiting for a window bind failed");
                self.tear_down();
                self.state = EndpointState::Broken;
                PostError::ConnectionBroken
            })?;
            if taken == 0 {
                if Instant::now() >= deadline {
                    tracing::error!(
                        device = self.device.name(),
                        "a window bind did not complete within {BIND_DEADLINE:?} (sends ahead of it wait for receives the peer does not post); the connection is closed"
                    );
                    self.tear_down();
                    self.state = EndpointState::Broken;
                    return Err(PostError::ConnectionBroken);
                }
                std::thread::yield_now();
            }
        };
        if status != ibv_wc_status::IBV_WC_SUCCESS {
            // `bound` broke the connection and said why.
            return Err(PostError::ConnectionBroken);
        }
        window.bound(key);
        Ok((window, range))
    }

    /// Moves completions waiting in `ready` into `completions`.
    fn take_ready(&mut self, completions: &mut [Completion]) -> usize {
        let ready = &mut self.ready;
        self.outstanding.hand_out(completions, || ready.pop_front())
    }

    /// Takes up to one batch of completions from the completion queue of `queue` into
    /// `ready` (a window bind's into `bind_outcome`), returning how many it took.
    fn fetch(&mut self, queue: QueueKind) -> Result<usize, TransportError> {
        let Some(connected) = &self.connected else {
            return Ok(0);
        };
        let completion_queue = raw_queue(connected.queue(queue));
        // SAFETY: the queue is alive (`connected` holds it) and polled by this endpoint
        // alone; the array has room for `POLL_BATCH` work completions, which is what the
        // device may write.
        let taken = unsafe {
            ibv_poll_cq(
                completion_queue,
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
        for index in 0..taken {
            // SAFETY: `ibv_poll_cq` wrote the first `taken` entries, plain data.
            let work_completion = &unsafe { self.work_completions[index].assume_init_read() };
            // The oldest request of its queue (module invariants): on the send queue, its
            // listing says what it was, whatever the device leaves undefined.
            let (listed, kind) = match queue {
                QueueKind::Send => {
                    let request = self.in_device.sends.pop_front();
                    (
                        request.map(|request| request.wr_id),
                        request.map(|request| request.kind),
                    )
                }
                QueueKind::Recv => (self.in_device.recvs.pop_front(), None),
            };
            debug_assert_eq!(
                listed,
                Some(work_completion.wr_id),
                "a reliable connection completes each queue in posting order"
            );
            let opcode = match kind {
                Some(SendKind::Bind) => {
                    self.bound(work_completion);
                    continue;
                }
                Some(SendKind::Write) => Opcode::Write,
                Some(SendKind::Read(_)) => Opcode::Read,
                Some(SendKind::Send) => Opcode::Send,
                None => match queue {
                    QueueKind::Send => Opcode::Send,
                    QueueKind::Recv => receive_opcode(work_completion),
                },
            };
            let completion = complete(
                work_completion,
                opcode,
                &mut self.state,
                &mut self.failure,
                self.device.name(),
            );
            // A read's byte count is what it asked for: verbs leaves `byte_len` to the
            // receive queue.
            let completion = match kind {
                Some(SendKind::Read(len)) if completion.status.is_success() => Completion {
                    byte_len: len,
                    ..completion
                },
                _ => completion,
            };
            self.ready.push_back(completion);
        }
        Ok(taken)
    }

    /// Records how a window bind ended: a failed one broke the connection, as any failed
    /// request does.
    fn bound(&mut self, work_completion: &ibv_wc) {
        let status = work_completion.status;
        if status != ibv_wc_status::IBV_WC_SUCCESS {
            let name = super::status_name(status).unwrap_or("an unknown status");
            if status == ibv_wc_status::IBV_WC_WR_FLUSH_ERR {
                tracing::debug!(device = self.device.name(), "a window bind was flushed");
            } else {
                tracing::warn!(
                    device = self.device.name(),
                    vendor_error = work_completion.vendor_err,
                    "binding a memory window failed with {name}; the connection is broken"
                );
            }
            if self.state == EndpointState::Open {
                self.state = EndpointState::Broken;
            }
        }
        self.bind_outcome = Some(status);
    }

    /// Takes every completion the device has made for this endpoint into `ready`.
    fn drain(&mut self) -> Result<(), TransportError> {
        for queue in [QueueKind::Send, QueueKind::Recv] {
            while self.fetch(queue)? == POLL_BATCH {}
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
        // Windows first (deallocating one ends every access through it, as `revoke`
        // does): a bound window holds its queue pair, which the device would wait on when
        // destroying it.
        for exposure in &mut self.exposures {
            exposure.grant.deallocate_window();
        }
        // Destroys the queue pair, then its completion queues: from here no peer reaches
        // any exposure. Then the registrations are undone, and the regions they held let
        // go.
        self.connected = None;
        self.ended
            .extend(self.exposures.drain(..).map(|exposure| exposure.key));
        let flushed = |wr_id, opcode| Completion {
            wr_id,
            byte_len: 0,
            status: CompletionStatus::Flushed,
            opcode,
        };
        for request in self.in_device.sends.drain(..) {
            let opcode = match request.kind {
                SendKind::Send => Opcode::Send,
                SendKind::Write => Opcode::Write,
                SendKind::Read(_) => Opcode::Read,
                SendKind::Bind => continue,
            };
            self.ready.push_back(flushed(request.wr_id, opcode));
        }
        self.ready.extend(
            self.in_device
                .recvs
                .drain(..)
                .map(|wr_id| flushed(wr_id, Opcode::Recv)),
        );
    }

    /// Checks, at most once per [`PEER_CHECK_INTERVAL`], whether the peer went away (if it
    /// did, tears this side down too), and, with no receive posted, whether the device
    /// moved the queue pair to the error state with no request of this side's to say so:
    /// the peer's RDMA WRITE or READ was refused here (a key not in force, bytes out of
    /// range), which breaks the connection on this side too. A posted receive's flush
    /// says so by itself, so an endpoint with one (every connection's) pays no query.
    fn watch_peer(&mut self) {
        let Some(connected) = &self.connected else {
            return;
        };
        let now = Instant::now();
        if now < self.next_peer_check {
            return;
        }
        self.next_peer_check = now + PEER_CHECK_INTERVAL;
        if self.state == EndpointState::Open
            && self.in_device.recvs.is_empty()
            && connected
                .queue_pair
                .query(QueuePairAttributeMask::State)
                .is_ok_and(|(attributes, _)| attributes.state() == QueuePairState::Error)
        {
            tracing::warn!(
                device = self.device.name(),
                "the queue pair is in the error state: the peer's one-sided request was refused \
                 (a key not in force here, or bytes outside an exposure); the connection is broken"
            );
            self.state = EndpointState::Broken;
        }
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
        [QueueKind::Send, QueueKind::Recv].into_iter().all(|queue| {
            // SAFETY: the queue is alive (`connected` holds it).
            let requested = unsafe { ibv_req_notify_cq(raw_queue(connected.queue(queue)), 0) };
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

/// The scatter-gather element of `resolved`'s bytes.
fn element_of(resolved: &Resolved<DeviceMemory>) -> ibv_sge {
    ibv_sge {
        addr: DeviceMemory::address_of(resolved),
        length: resolved.len,
        lkey: resolved.region.region().local_key(),
    }
}

/// What a receive's work completion completed: a send's message, or a write with an
/// immediate (`IBV_WC_RECV_RDMA_WITH_IMM`, its immediate in network byte order). The
/// opcode of a failed completion is undefined in verbs: a plain receive.
fn receive_opcode(work_completion: &ibv_wc) -> Opcode {
    if work_completion.status == ibv_wc_status::IBV_WC_SUCCESS
        && work_completion.opcode == ibv_wc_opcode::IBV_WC_RECV_RDMA_WITH_IMM
    {
        // SAFETY: a completion of a write with an immediate holds the immediate in this
        // field of the union.
        let imm = unsafe { work_completion.imm_data_invalidated_rkey_union.imm_data };
        Opcode::RecvWithImm(u32::from_be(imm))
    } else {
        Opcode::Recv
    }
}

/// Moves `queue_pair`, in INIT, to RTR and RTS, connected to the peer at `remote`.
fn connect(
    device: &OpenDevice,
    queue_pair: &mut ExtendedQueuePair,
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
        .setup_max_dest_read_atomic(device.reads_in_flight())
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
        .setup_max_read_atomic(device.reads_in_flight());
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

/// The completion of `work_completion`, a request of the caller's that `opcode`
/// describes. An error completion breaks the connection; the first one that is not a
/// flush is kept in `failure`.
fn complete(
    work_completion: &ibv_wc,
    opcode: Opcode,
    state: &mut EndpointState,
    failure: &mut Option<DeviceFailure>,
    device: &str,
) -> Completion {
    let wr_id = work_completion.wr_id;
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
    let byte_len = match (opcode.queue(), status) {
        (QueueKind::Recv, CompletionStatus::Success) => work_completion.byte_len,
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
        unsafe { self.post_receive(resolved, wr_id) }
    }

    unsafe fn post_send(&mut self, gather: &[BufferRef], wr_id: u64) -> Result<(), PostError> {
        self.state.admits_posts()?;
        self.outstanding.check_room(QueueKind::Send, self.limits)?;
        // At most one buffer (`max_gather` is 1) of at most `max_message` bytes.
        self.limits.message_len(gather)?;
        let element = self.gather_element(gather)?;
        // SAFETY: the caller keeps `post_send`'s promise for the gather list's bytes.
        unsafe {
            self.post_to_send_queue(
                wr_id,
                SendKind::Send,
                SendWork::Send,
                Data::Elements(element.as_slice()),
            )
        }
    }

    fn caller_copies(&self) -> CallerCopies {
        match self.max_inline {
            0 => CallerCopies::NONE,
            max_inline => CallerCopies::new(Some(max_inline as usize), None),
        }
    }

    /// Sends a message of at most the queue pair's `max_inline_data` bytes (128 asked for;
    /// [`Endpoint::caller_copies`] says what the device gave) copied into the work request
    /// as it is posted (`IBV_SEND_INLINE`), so from any memory, registered or not; a longer
    /// one is not taken. Once taken it is a send like any other: it waits for the peer's
    /// next receive, in order with the sends posted before it. The parts (at most four,
    /// since they are copied by the CPU rather than named to the device, the gather limit
    /// does not apply) are read in the call only.
    fn try_post_send_copied(&mut self, parts: &[&[u8]], wr_id: u64) -> Result<bool, PostError> {
        self.state.admits_posts()?;
        self.outstanding.check_room(QueueKind::Send, self.limits)?;
        if parts.len() > INLINE_PARTS {
            return Err(PostError::TooManyBuffers {
                given: parts.len(),
                max: INLINE_PARTS,
            });
        }
        let len: usize = parts.iter().map(|part| part.len()).sum();
        if len > self.max_inline as usize {
            return Ok(false);
        }
        // The parts are joined here and handed over as one buffer (`Data::Inline` says
        // why): at most `INLINE_REQUEST` bytes.
        let mut joined = [0u8; INLINE_REQUEST as usize];
        let mut at = 0;
        for part in parts {
            joined[at..at + part.len()].copy_from_slice(part);
            at += part.len();
        }
        // SAFETY: inline data names no registered memory: the device copies it into the
        // request in the call, and it is no longer than `max_inline_data`.
        unsafe {
            self.post_to_send_queue(
                wr_id,
                SendKind::Send,
                SendWork::Send,
                Data::Inline(&joined[..len]),
            )
        }?;
        Ok(true)
    }

    unsafe fn expose(
        &mut self,
        buffer: BufferRef,
        access: Access,
    ) -> Result<RemoteBuffer, PostError> {
        self.state.admits_posts()?;
        if self.exposures.len() >= EXPOSURE_SLOTS {
            return Err(PostError::TooManyExposures {
                max: EXPOSURE_SLOTS,
            });
        }
        let resolved = self.regions.resolve(buffer)?;
        let addr = DeviceMemory::address_of(&resolved);
        let grant = match self.device.exposures() {
            Exposures::Windows => {
                let (window, range) = self.bind_window(addr, buffer.len, access)?;
                Grant::Window { window, range }
            }
            Exposures::Registrations => Grant::Registration(self.register_range(
                addr,
                buffer.len,
                Purpose::Remote(access),
            )?),
        };
        let key = grant.key();
        resolved.region.mark_exposed();
        self.exposures.push(Exposure {
            key,
            grant,
            _region: resolved.region,
        });
        Ok(RemoteBuffer {
            key,
            addr,
            len: buffer.len,
        })
    }

    fn revoke(&mut self, exposed: RemoteBuffer) -> Result<(), PostError> {
        let Some(index) = self
            .exposures
            .iter()
            .position(|exposure| exposure.key == exposed.key)
        else {
            // Ended already by the teardown, when the queue pair went.
            if let Some(ended) = self.ended.iter().position(|&key| key == exposed.key) {
                self.ended.swap_remove(ended);
                return Ok(());
            }
            return Err(PostError::UnknownKey {
                remote_key: exposed.key,
            });
        };
        let mut exposure = self.exposures.swap_remove(index);
        match exposure.grant.undo() {
            Ok(()) => Ok(()),
            Err(error) => {
                // The key may still work: destroying the queue pair ends every access
                // through this connection (a window works on it alone). The exposure is
                // kept, to be undone again at teardown with the region held till then.
                tracing::error!(
                    device = self.device.name(),
                    %error,
                    "revoking an exposure failed; the connection is closed so that its peer reaches nothing"
                );
                self.exposures.push(exposure);
                self.tear_down();
                // The teardown ended it; `revoke` has answered for it.
                self.ended.retain(|&key| key != exposed.key);
                self.state = EndpointState::Broken;
                Err(PostError::ConnectionBroken)
            }
        }
    }

    unsafe fn post_write(
        &mut self,
        gather: &[BufferRef],
        remote: RemoteBuffer,
        imm: Option<u32>,
        wr_id: u64,
    ) -> Result<(), PostError> {
        self.state.admits_posts()?;
        self.outstanding.check_room(QueueKind::Send, self.limits)?;
        let len = self.limits.message_len(gather)?;
        remote.check_len(len)?;
        let element = self.gather_element(gather)?;
        let work = SendWork::Write {
            key: remote.key,
            addr: remote.addr,
            imm,
        };
        // SAFETY: the caller keeps `post_write`'s promise (that of `post_send`) for the
        // gather list's bytes.
        unsafe {
            self.post_to_send_queue(
                wr_id,
                SendKind::Write,
                work,
                Data::Elements(element.as_slice()),
            )
        }
    }

    unsafe fn post_read(
        &mut self,
        buffer: BufferRef,
        remote: RemoteBuffer,
        wr_id: u64,
    ) -> Result<(), PostError> {
        self.state.admits_posts()?;
        self.outstanding.check_room(QueueKind::Send, self.limits)?;
        remote.check_len(buffer.len)?;
        let element = element_of(&self.regions.resolve(buffer)?);
        let work = SendWork::Read {
            key: remote.key,
            addr: remote.addr,
        };
        // SAFETY: the caller keeps `post_read`'s promise (that of `post_recv`) for
        // `buffer`'s bytes, which the device writes.
        unsafe {
            self.post_to_send_queue(
                wr_id,
                SendKind::Read(buffer.len),
                work,
                Data::Elements(std::slice::from_ref(&element)),
            )
        }
    }

    fn poll(&mut self, completions: &mut [Completion]) -> Result<usize, TransportError> {
        for queue in [QueueKind::Send, QueueKind::Recv] {
            while self.ready.len() < completions.len() && self.fetch(queue)? == POLL_BATCH {}
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
        for queue in [QueueKind::Send, QueueKind::Recv] {
            if self.fetch(queue).map_or(true, |taken| taken > 0) {
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

    fn work_completion(status: ibv_wc_status::Type, opcode: ibv_wc_opcode::Type) -> ibv_wc {
        ibv_wc {
            wr_id: 7,
            status,
            opcode,
            vendor_err: 0,
            byte_len: 5,
            imm_data_invalidated_rkey_union: rdma_mummy_sys::imm_data_invalidated_rkey_union_t {
                imm_data: 0xfeed_beef_u32.to_be(),
            },
            qp_num: 0,
            src_qp: 0,
            wc_flags: 0,
            pkey_index: 0,
            slid: 0,
            sl: 0,
            dlid_path_bits: 0,
        }
    }

    #[test]
    fn a_receive_a_write_consumed_carries_its_immediate_in_host_order() {
        let written = work_completion(
            ibv_wc_status::IBV_WC_SUCCESS,
            ibv_wc_opcode::IBV_WC_RECV_RDMA_WITH_IMM,
        );
        assert_eq!(receive_opcode(&written), Opcode::RecvWithImm(0xfeed_beef));
        let sent = work_completion(ibv_wc_status::IBV_WC_SUCCESS, ibv_wc_opcode::IBV_WC_RECV);
        assert_eq!(receive_opcode(&sent), Opcode::Recv);
        // A failed completion's opcode is undefined: a plain receive.
        let failed = work_completion(
            ibv_wc_status::IBV_WC_WR_FLUSH_ERR,
            ibv_wc_opcode::IBV_WC_RECV_RDMA_WITH_IMM,
        );
        assert_eq!(receive_opcode(&failed), Opcode::Recv);
    }

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
