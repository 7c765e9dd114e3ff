//! The loopback provider: two endpoints in one process, connected by lock-free queues.
//!
//! # Progress
//!
//! A message is copied as soon as both its send and a receive for it are posted, by
//! whichever side notices first: `post_send` and `post_recv` try to pair the channel they
//! just fed (eager), and `poll` tries both channels of the endpoint. So, as with a NIC, a
//! message moves once both sides have posted, whichever of them calls in next; neither
//! side depends on the other polling. The copy happens on the calling thread while it
//! holds the channel's matching claim; a caller that finds the claim taken returns at
//! once, and the holder picks up its work before it lets go (see `channel`).
//!
//! # Locks
//!
//! Posting and polling take no lock: the queues are crossbeam `ArrayQueue`s, the claim is
//! one atomic flag that is tried, never waited for. Two places do lock or wait, off the
//! data path: resolving a remote key this endpoint has not met before takes the
//! provider's region-table mutex once (then it is cached), and [`Endpoint::close`] waits
//! for a copy in progress on the connection to finish, so that it can promise that no
//! buffer of the closed endpoint is touched afterwards.

mod channel;

use std::sync::Arc as StdArc;
use std::task::Waker;

use tierbuf_pool::{HostRegistrar, MemoryBudget, PoolError, Region, Registrar};

use crate::error::{PostError, QueueKind, TransportError};
use crate::exposure::{Access, Exposures};
use crate::provider::{
    Armed, BufferRef, Completion, Endpoint, EndpointLimits, EndpointState, Outstanding, Provider,
    Readiness, RemoteBuffer,
};
use crate::registry::{RegionCache, RegionTable, Resolved};
use crate::sync::Arc;
use channel::{MAX_GATHER, PairShared, RecvRequest, SendRequest, Work};

/// The deepest queue a loopback endpoint takes.
pub const MAX_QUEUE_DEPTH: u32 = 1 << 16;

/// The in-process provider: registered host memory and connected endpoint pairs.
///
/// ```
/// use tierbuf_pool::{MemoryBudget, SlotPool};
/// use tierbuf_transport::{BufferRef, Completion, Endpoint, LoopbackProvider, Provider};
/// let provider = LoopbackProvider::new(MemoryBudget::with_cap(1 << 20));
/// let pool = SlotPool::new(&*provider.registrar(), 256, 2)?;
/// let (mut client, mut server) = provider.pair(4, 4)?;
/// let mut request = pool.try_acquire_owned().unwrap();
/// let inbox = pool.try_acquire_owned().unwrap();
/// request[..4].copy_from_slice(b"ping");
/// // SAFETY: neither slot is touched again until its completion is polled.
/// unsafe {
///     server.post_recv(BufferRef::from(&inbox), 1)?;
///     client.post_send(&[BufferRef::from(&request).prefix(4).unwrap()], 2)?;
/// }
/// let mut completions = [Completion::default(); 4];
/// assert_eq!(server.poll(&mut completions)?, 1);
/// assert_eq!((completions[0].wr_id, completions[0].byte_len), (1, 4));
/// assert_eq!(&inbox[..4], b"ping");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug)]
pub struct LoopbackProvider {
    registrar: StdArc<LoopbackRegistrar>,
}

impl LoopbackProvider {
    /// A provider registering unpinned host memory charged to `budget`.
    pub fn new(budget: MemoryBudget) -> LoopbackProvider {
        LoopbackProvider::with_host_registrar(HostRegistrar::new(budget))
    }

    /// A provider registering memory through `host` (for pinned or huge-page memory).
    ///
    /// ```
    /// use tierbuf_pool::{HostRegistrar, MemoryBudget};
    /// use tierbuf_transport::{LoopbackProvider, Provider};
    /// let host = HostRegistrar::new(MemoryBudget::with_cap(1 << 20)).lock_memory(false);
    /// let provider = LoopbackProvider::with_host_registrar(host);
    /// assert_eq!(provider.registrar().budget().cap(), 1 << 20);
    /// ```
    pub fn with_host_registrar(host: HostRegistrar) -> LoopbackProvider {
        LoopbackProvider {
            registrar: StdArc::new(LoopbackRegistrar::new(host)),
        }
    }

    /// Two connected endpoints, each with `send_depth` sends and `recv_depth` receives
    /// outstanding at most (both in `1..=`[`MAX_QUEUE_DEPTH`]).
    ///
    /// ```
    /// use tierbuf_pool::MemoryBudget;
    /// use tierbuf_transport::{Endpoint, LoopbackProvider, TransportError};
    /// let provider = LoopbackProvider::new(MemoryBudget::with_cap(1 << 20));
    /// let (a, _b) = provider.pair(8, 32)?;
    /// assert_eq!((a.limits().send_depth, a.limits().recv_depth), (8, 32));
    /// assert!(matches!(provider.pair(0, 1), Err(TransportError::InvalidDepth { .. })));
    /// # Ok::<(), TransportError>(())
    /// ```
    pub fn pair(
        &self,
        send_depth: u32,
        recv_depth: u32,
    ) -> Result<(LoopbackEndpoint, LoopbackEndpoint), TransportError> {
        for (queue, depth) in [(QueueKind::Send, send_depth), (QueueKind::Recv, recv_depth)] {
            if !(1..=MAX_QUEUE_DEPTH).contains(&depth) {
                return Err(TransportError::InvalidDepth {
                    queue,
                    depth,
                    max: MAX_QUEUE_DEPTH,
                });
            }
        }
        let shared = Arc::new(PairShared::new(send_depth, recv_depth));
        let limits = EndpointLimits {
            send_depth,
            recv_depth,
            max_gather: MAX_GATHER,
            max_message: u32::MAX,
        };
        let endpoint = |side| LoopbackEndpoint {
            shared: Arc::clone(&shared),
            side,
            limits,
            regions: RegionCache::new(StdArc::clone(&self.registrar.table)),
            outstanding: Outstanding::default(),
            closed: false,
            exposures: Exposures::default(),
        };
        Ok((endpoint(0), endpoint(1)))
    }
}

impl Provider for LoopbackProvider {
    type Endpoint = LoopbackEndpoint;

    fn name(&self) -> &'static str {
        "loopback"
    }

    fn registrar(&self) -> StdArc<dyn Registrar> {
        StdArc::clone(&self.registrar) as StdArc<dyn Registrar>
    }
}

/// The regions the loopback provider registers: host memory behind the pool's region
/// trait.
pub(crate) type HostRegion = Box<dyn Region>;

/// The loopback provider's registrar: host memory from a [`HostRegistrar`], recorded by
/// remote key so that endpoints can check every buffer they are given.
///
/// ```
/// use tierbuf_pool::{MemoryBudget, Registrar};
/// use tierbuf_transport::LoopbackProvider;
/// let provider = LoopbackProvider::new(MemoryBudget::with_cap(1 << 20));
/// let region = tierbuf_transport::Provider::registrar(&provider).register(8192, 4096)?;
/// assert_eq!(region.keys().remote_addr, region.base().as_ptr() as u64);
/// # Ok::<(), tierbuf_pool::PoolError>(())
/// ```
#[derive(Debug)]
pub struct LoopbackRegistrar {
    host: HostRegistrar,
    table: StdArc<RegionTable<HostRegion>>,
}

impl LoopbackRegistrar {
    fn new(host: HostRegistrar) -> LoopbackRegistrar {
        LoopbackRegistrar {
            host,
            table: StdArc::new(RegionTable::new()),
        }
    }
}

impl Registrar for LoopbackRegistrar {
    fn register(&self, len: usize, align: usize) -> Result<Box<dyn Region>, PoolError> {
        let region = self.host.register(len, align)?;
        Ok(Box::new(self.table.add(region)))
    }

    fn budget(&self) -> &MemoryBudget {
        self.host.budget()
    }
}

/// One side of a loopback pair; see [`Endpoint`] for the rules it keeps and
/// [`LoopbackProvider`] for an example. Dropping it closes it.
#[derive(Debug)]
pub struct LoopbackEndpoint {
    shared: Arc<PairShared>,
    /// 0 or 1: this endpoint sends on `shared.channel(side)` and receives on the other.
    side: usize,
    limits: EndpointLimits,
    regions: RegionCache<HostRegion>,
    outstanding: Outstanding,
    closed: bool,
    /// The ranges exposed to the peer, each holding its region.
    exposures: Exposures<HostRegion>,
}

impl LoopbackEndpoint {
    fn peer(&self) -> usize {
        1 - self.side
    }

    /// Queues `request` on the send queue (counted outstanding) and carries out what it
    /// can.
    fn push_send(&mut self, request: SendRequest) {
        self.outstanding.sends += 1;
        self.shared.channel(self.side).push_send(request);
        self.shared.progress(self.side);
    }

    /// The region the peer's exposure `remote` lies in, as far as this side can tell
    /// before the access: looked up now, so that its memory stays mapped for the request,
    /// and checked against the exposure again when the request is carried out.
    fn peer_target(&mut self, remote: RemoteBuffer) -> Option<Resolved<HostRegion>> {
        let region_key = self.shared.exposures(self.peer())?.region_hint(remote.key);
        self.regions
            .resolve(BufferRef {
                remote_key: region_key,
                addr: remote.addr,
                len: remote.len,
            })
            .ok()
    }
}

impl Endpoint for LoopbackEndpoint {
    fn limits(&self) -> EndpointLimits {
        self.limits
    }

    fn state(&self) -> EndpointState {
        if self.closed {
            return EndpointState::Closed;
        }
        self.shared.state().seen_by(self.side)
    }

    fn outstanding(&self) -> Outstanding {
        self.outstanding
    }

    unsafe fn post_recv(&mut self, buffer: BufferRef, wr_id: u64) -> Result<(), PostError> {
        self.state().admits_posts()?;
        self.outstanding.check_room(QueueKind::Recv, self.limits)?;
        let buffer = self.regions.resolve(buffer)?;
        self.outstanding.recvs += 1;
        let incoming = self.peer();
        self.shared
            .channel(incoming)
            .push_recv(RecvRequest { wr_id, buffer });
        self.shared.progress(incoming);
        Ok(())
    }

    unsafe fn post_send(&mut self, gather: &[BufferRef], wr_id: u64) -> Result<(), PostError> {
        self.state().admits_posts()?;
        self.outstanding.check_room(QueueKind::Send, self.limits)?;
        let len = self.limits.message_len(gather)?;
        let resolved = self.regions.resolve_gather::<MAX_GATHER>(gather)?;
        self.push_send(SendRequest {
            wr_id,
            gather: resolved,
            len,
            work: Work::Send,
        });
        Ok(())
    }

    unsafe fn expose(
        &mut self,
        buffer: BufferRef,
        access: Access,
    ) -> Result<RemoteBuffer, PostError> {
        self.state().admits_posts()?;
        let slot = self.exposures.free_slot()?;
        let resolved = self.regions.resolve(buffer)?;
        let key = self.regions.exposure_key(slot);
        let table = self.shared.own_exposures(self.side);
        Ok(self.exposures.publish(table, key, access, buffer, resolved))
    }

    fn revoke(&mut self, exposed: RemoteBuffer) -> Result<(), PostError> {
        self.exposures.check(exposed)?;
        // The peer's access in flight is a copy on a thread of this process: it ends.
        self.shared
            .own_exposures(self.side)
            .revoke(exposed.key, || true);
        self.exposures.remove(exposed.key);
        Ok(())
    }

    unsafe fn post_write(
        &mut self,
        gather: &[BufferRef],
        remote: RemoteBuffer,
        imm: Option<u32>,
        wr_id: u64,
    ) -> Result<(), PostError> {
        self.state().admits_posts()?;
        self.outstanding.check_room(QueueKind::Send, self.limits)?;
        let len = self.limits.message_len(gather)?;
        remote.check_len(len)?;
        let resolved = self.regions.resolve_gather::<MAX_GATHER>(gather)?;
        let target = self.peer_target(remote);
        self.push_send(SendRequest {
            wr_id,
            gather: resolved,
            len,
            work: Work::Write {
                remote,
                imm,
                target,
            },
        });
        Ok(())
    }

    unsafe fn post_read(
        &mut self,
        buffer: BufferRef,
        remote: RemoteBuffer,
        wr_id: u64,
    ) -> Result<(), PostError> {
        self.state().admits_posts()?;
        self.outstanding.check_room(QueueKind::Send, self.limits)?;
        remote.check_len(buffer.len)?;
        let resolved = self.regions.resolve_gather::<MAX_GATHER>(&[buffer])?;
        let target = self.peer_target(remote);
        self.push_send(SendRequest {
            wr_id,
            gather: resolved,
            len: buffer.len,
            work: Work::Read { remote, target },
        });
        Ok(())
    }

    fn poll(&mut self, completions: &mut [Completion]) -> Result<usize, TransportError> {
        self.shared.poll_progress(self.side);
        self.shared.poll_progress(self.peer());
        let sends = self.shared.channel(self.side);
        let recvs = self.shared.channel(self.peer());
        let filled = self.outstanding.hand_out(completions, || {
            sends
                .pop_send_completion()
                .or_else(|| recvs.pop_recv_completion())
        });
        Ok(filled)
    }

    fn close(&mut self) {
        if !self.closed {
            self.closed = true;
            self.shared.close(self.side);
        }
    }

    fn readiness(&self) -> Readiness<'_> {
        Readiness::Waker
    }

    fn arm(&mut self, waker: &Waker) -> Armed {
        if self.closed {
            return Armed::Pending;
        }
        self.shared.arm(self.side, waker)
    }

    fn disarm(&mut self) {
        self.shared.disarm(self.side);
    }
}

impl Drop for LoopbackEndpoint {
    fn drop(&mut self) {
        self.close();
    }
}
