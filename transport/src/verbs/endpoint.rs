//! [`VerbsEndpoint`]: one side of a reliable-connected queue pair, with a completion
//! queue per direction.
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
//! - `ibverbs` 0.9 cannot move a queue pair to the error state, so closing (or learning
//!   that the peer closed) destroys the queue pair: first every completion already made
//!   is taken, then the queue pair and its completion queues are destroyed, after which
//!   the device touches none of the endpoint's buffers, then every request still listed
//!   completes as `Flushed`.
//! - The queue pair borrows its completion queues and the protection domain, the
//!   completion queues borrow the context; one [`ConnectedQueuePair`] cell owns them all
//!   (with the device's `Arc`), and drops the queue pair first, then the completion
//!   queues, then its share of the device.

use std::collections::VecDeque;
use std::io;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ibverbs::{
    CompletionQueue, QueuePair, QueuePairEndpoint, ibv_access_flags, ibv_qp_type, ibv_wc,
    ibv_wc_status,
};
use tierbuf_tiers::TierIndex;

use super::device::OpenDevice;
use super::error::VerbsError;
use super::handshake::Hello;
use super::registrar::DeviceMemory;
use super::rendezvous::{PeerWatch, Rendezvous};
use super::status::DeviceFailure;
use crate::error::{PostError, QueueKind, TransportError};
use crate::provider::{
    BufferRef, Completion, CompletionStatus, Endpoint, EndpointLimits, EndpointState, Opcode,
    Outstanding,
};
use crate::registry::{RegionCache, RegionTable, Resolved};

/// The deepest queue a verbs endpoint asks the device for. Devices differ (`ibv_devinfo
/// -v` shows `max_qp_wr`); one that takes fewer refuses when the endpoint is connected.
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
    /// Checks the depths.
    pub(crate) fn check(&self) -> Result<(), VerbsError> {
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
        }
        Ok(())
    }
}

/// An endpoint's two completion queues.
struct CompletionQueues<'device> {
    send: CompletionQueue<'device>,
    recv: CompletionQueue<'device>,
}

self_cell::self_cell!(
    /// The device and the completion queues created on it.
    struct DeviceQueues {
        owner: Arc<OpenDevice>,
        #[covariant]
        dependent: CompletionQueues,
    }
);

/// A queue pair connected to its peer's, and the hellos that connected them.
struct Connected<'queues> {
    queue_pair: QueuePair<'queues>,
    local: Hello,
    remote: Hello,
}

self_cell::self_cell!(
    /// A connected queue pair with the completion queues and device it borrows.
    struct ConnectedQueuePair {
        owner: DeviceQueues,
        #[covariant]
        dependent: Connected,
    }
);

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
    /// `None` once closed or once the peer is gone.
    queue_pair: Option<ConnectedQueuePair>,
    device: Arc<OpenDevice>,
    regions: RegionCache<DeviceMemory>,
    limits: EndpointLimits,
    in_device: InDevice,
    outstanding: Outstanding,
    /// Completions taken from the device at teardown, or made for the requests it still
    /// held, not yet handed to the caller.
    ready: VecDeque<Completion>,
    state: EndpointState,
    /// The first error completion, as the device reported it.
    failure: Option<DeviceFailure>,
    peer: PeerWatch,
    next_peer_check: Instant,
    local: Hello,
    remote: Hello,
    work_completions: [ibv_wc; POLL_BATCH],
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
        // Depths were checked by `connect` or `listen`, so they are at most
        // MAX_QUEUE_DEPTH and fit an i32.
        let (send_entries, recv_entries) = (options.send_depth as i32, options.recv_depth as i32);
        let queues = DeviceQueues::try_new(Arc::clone(device), |device| {
            let context = device.context();
            let send = context.create_cq(send_entries, 0).map_err(|source| {
                device.error("creating the send completion queue (ibv_create_cq)", source)
            })?;
            let recv = context.create_cq(recv_entries, 0).map_err(|source| {
                device.error(
                    "creating the receive completion queue (ibv_create_cq)",
                    source,
                )
            })?;
            Ok::<_, VerbsError>(CompletionQueues { send, recv })
        })?;
        let queue_pair = ConnectedQueuePair::try_new(queues, |queues| {
            let device = queues.borrow_owner();
            let completion_queues = queues.borrow_dependent();
            let mut builder = device.domain().create_qp(
                &completion_queues.send,
                &completion_queues.recv,
                ibv_qp_type::IBV_QPT_RC,
            );
            // `ibverbs` registers every region with remote read, write and atomic rights,
            // and a promotion's answer tells the peer a region's address and remote key:
            // the queue pair's own access flags, local write only, are what refuse the
            // peer any RDMA READ, WRITE or atomic on this side's memory (two-sided sends
            // are all the provider uses). Set here rather than left to the crate's default.
            builder
                .set_access(ibv_access_flags::IBV_ACCESS_LOCAL_WRITE)
                .set_max_send_wr(options.send_depth)
                .set_max_recv_wr(options.recv_depth)
                .set_rnr_retry(RNR_RETRY_FOREVER)
                .set_min_rnr_timer(MIN_RNR_TIMER)
                .set_timeout(ACK_TIMEOUT)
                .set_retry_count(RETRY_COUNT);
            if let Some(gid_index) = device.gid_index() {
                // Checked against the GID table when the device was opened.
                builder.set_gid_index(gid_index);
            }
            let prepared = builder.build().map_err(|source| {
                device.error(
                    "creating the queue pair (ibv_create_qp; lower the queue depths if the \
                     device takes fewer)",
                    source,
                )
            })?;
            let local = Hello {
                queue_pair: prepared.endpoint(),
                initial_tier: options.initial_tier,
            };
            let remote = rendezvous.exchange_hello(local)?;
            let (local_has_gid, peer_has_gid) = (
                local.queue_pair.gid.is_some(),
                remote.queue_pair.gid.is_some(),
            );
            if local_has_gid != peer_has_gid {
                return Err(VerbsError::RoutingMismatch {
                    local_has_gid,
                    peer_has_gid,
                });
            }
            let queue_pair = prepared.handshake(remote.queue_pair).map_err(|source| {
                device.error(
                    "connecting the queue pair to the peer's (ibv_modify_qp to RTR and RTS)",
                    source,
                )
            })?;
            Ok(Connected {
                queue_pair,
                local,
                remote,
            })
        })?;
        rendezvous.exchange_ready()?;
        let Connected { local, remote, .. } = *queue_pair.borrow_dependent();
        Ok(VerbsEndpoint {
            queue_pair: Some(queue_pair),
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
            peer: rendezvous.into_watch()?,
            next_peer_check: Instant::now(),
            local,
            remote,
            work_completions: [ibv_wc::default(); POLL_BATCH],
        })
    }

    /// This side's queue pair: number, LID and, for RoCE, GID.
    pub fn local_queue_pair(&self) -> QueuePairEndpoint {
        self.local.queue_pair
    }

    /// The peer's queue pair, as its handshake gave it.
    pub fn peer_queue_pair(&self) -> QueuePairEndpoint {
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

    /// Posts `range` of `resolved`'s region (or the empty message when `None`) to the
    /// queue of `opcode`.
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
        let Some(queue_pair) = self.queue_pair.as_mut() else {
            return Err(PostError::Closed);
        };
        let posted = queue_pair.with_dependent_mut(|_, connected| {
            let queue_pair = &mut connected.queue_pair;
            let (mut memory, range) = match &resolved {
                Some(resolved) => (
                    resolved.region.region().memory(),
                    DeviceMemory::range_of(resolved),
                ),
                None => (self.device.empty_message(), 0..0),
            };
            // SAFETY: `ibverbs` asks that the posted bytes be left to the device until the
            // request's completion has been polled. The caller promises exactly that for
            // the bytes the buffer names (this function's contract), until the completion
            // is handed back or the endpoint is closed; closing destroys the queue pair
            // first, after which the device touches nothing. The owner may deregister the
            // region earlier: the device then fails the request with a protection error
            // and no longer reaches the memory (verbs semantics), so freeing it is sound.
            // The empty message's range is empty. `range` lies inside the memory region
            // (checked by `resolve`), so `ibverbs`' own indexing cannot panic.
            unsafe {
                match opcode {
                    Opcode::Send => queue_pair.post_send(&mut *memory, range, wr_id),
                    Opcode::Recv => queue_pair.post_receive(&mut *memory, range, wr_id),
                }
            }
        });
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

    /// The post error for a request the device refused. A device short of queue entries
    /// is a full queue; anything else means the queue pair is unusable.
    fn refused(&mut self, opcode: Opcode, error: io::Error) -> PostError {
        let queue = match opcode {
            Opcode::Send => QueueKind::Send,
            Opcode::Recv => QueueKind::Recv,
        };
        if error.kind() == io::ErrorKind::OutOfMemory {
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

    /// Moves completions waiting in `ready` into `completions`.
    fn take_ready(&mut self, completions: &mut [Completion]) -> usize {
        let ready = &mut self.ready;
        self.outstanding.hand_out(completions, || ready.pop_front())
    }

    /// Takes up to `wanted` (at most one batch of) completions from the completion queue
    /// of `opcode` into `ready`, returning how many it took.
    fn fetch(&mut self, opcode: Opcode, wanted: usize) -> Result<usize, TransportError> {
        let Some(queue_pair) = &self.queue_pair else {
            return Ok(0);
        };
        let queues = queue_pair.borrow_owner().borrow_dependent();
        let queue = match opcode {
            Opcode::Send => &queues.send,
            Opcode::Recv => &queues.recv,
        };
        let batch = wanted.min(POLL_BATCH);
        let taken = queue
            .poll(&mut self.work_completions[..batch])
            .map_err(|source| TransportError::Provider {
                provider: "verbs",
                operation: "polling a completion queue (ibv_poll_cq)",
                source,
            })?;
        for work_completion in taken.iter() {
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
        Ok(taken.len())
    }

    /// Takes every completion the device has made for this endpoint into `ready`.
    fn drain(&mut self) {
        for opcode in [Opcode::Send, Opcode::Recv] {
            loop {
                match self.fetch(opcode, POLL_BATCH) {
                    Ok(taken) if taken == POLL_BATCH => {}
                    Ok(_) => break,
                    Err(error) => {
                        // The requests left behind complete as flushed below.
                        tracing::warn!(device = self.device.name(), %error, "draining a completion queue at teardown failed");
                        break;
                    }
                }
            }
        }
    }

    /// Destroys the queue pair, so that the device no longer touches any buffer of this
    /// endpoint; every request it held completes, as the device finished it or flushed.
    fn tear_down(&mut self) {
        if self.queue_pair.is_none() {
            return;
        }
        self.drain();
        // Destroys the queue pair, then its completion queues.
        self.queue_pair = None;
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
        if self.queue_pair.is_none() {
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
    let wr_id = work_completion.wr_id();
    let oldest = in_device.queue(opcode).pop_front();
    debug_assert_eq!(
        oldest,
        Some(wr_id),
        "a reliable connection completes each queue in posting order"
    );
    let (raw_status, vendor_error) = work_completion
        .error()
        .unwrap_or((ibv_wc_status::IBV_WC_SUCCESS, 0));
    let failed = DeviceFailure::new(wr_id, opcode, raw_status, vendor_error);
    let status = failed.status;
    if work_completion.error().is_some() {
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
        // A message is at most MAX_MESSAGE_LEN bytes, which fits a u32.
        (Opcode::Recv, CompletionStatus::Success) => work_completion.len() as u32,
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
            loop {
                let wanted = completions.len().saturating_sub(self.ready.len());
                if wanted == 0 || self.fetch(opcode, wanted)? < wanted.min(POLL_BATCH) {
                    break;
                }
            }
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
