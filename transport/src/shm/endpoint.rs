//! [`ShmEndpoint`]: one side of a shared-memory connection.
//!
//! # Invariants
//!
//! - **Sends are copied by their sender, in order.** A posted send waits in `pending`
//!   until the peer has posted a receive for it (receiver not ready waits); the endpoint's
//!   own `progress` then writes it into the ring entry (a message of at most
//!   [`INLINE_CAPACITY`] bytes, which the receiver copies into its buffer) or straight
//!   into the peer's buffer through the peer's announced memory file, and reports the
//!   delivery in the ring (see `segment`). Sends are matched with the peer's receives
//!   strictly in posting order on both sides.
//! - **Receives are reaped in order.** `posted` holds this side's receives in posting
//!   order with the regions they name; the front one is reaped (turned into a completion)
//!   once the peer reports it delivered, or flushed once the connection is down and the
//!   peer cannot be delivering any more.
//! - **Every buffer a request names stays mapped until the request completes**: the
//!   request holds a strong reference to its region (see `registry`). The peer's mapping
//!   of an announced region is undone only on a `Forget`, which this side sends once the
//!   region's memory is gone here, so after every request naming it has completed.
//! - **A receive region serves one peer.** Its memory file is made at its first
//!   announcement (`SharedHostRegion::expose_memory_file`), passed, and closed here; a
//!   receive posted in a region already exposed to another endpoint is refused
//!   ([`PostError::SharedWithAnotherPeer`]) and nothing is posted, so no peer maps memory
//!   that receives for another.
//! - **The peer is untrusted input.** Every word of the segment the peer writes, and
//!   every record, is checked before use, each by one function: the ring's `posted` count
//!   by `Ring::is_posted` (it never goes back, nor passes the receives filled plus the
//!   ring's size); the `announced` count by `catch_up_with_announcements` (the socket
//!   holds every record counted); an entry's buffer by `peer_buffer` (inside a region the
//!   peer announced) and `fill` (long enough); an entry's result and length by
//!   `reap_receives` (against this side's own record of the buffer, `Ring::delivered` for
//!   the code); the state word by `StateWord` (any value reads as a state). `short_posted`
//!   and the gate's bits need none: a wrong `short_posted` only makes the sender read a
//!   buffer it could have skipped, or deliver inline into a receive the peer checks
//!   itself, and a held gate is bounded by the peer timeout. Past a check the connection
//!   breaks with a protocol error naming the word; the
//!   peer's memory is written only within a mapping this side made and checked, and an
//!   announced region is mapped only within the endpoint's mapping limit and the
//!   provider's total, whose ledger each mapping holds a charge of until it is undone
//!   (`limits`). A mapping the kernel refuses (out of mappings or address space) is this
//!   process's resource exhausted, not the peer's violation.
//! - **No wait on the peer outlasts the peer timeout.** What only the peer can do (leave
//!   its copy gate, so that a close or a flush may give this side's buffers back) is
//!   waited for without blocking or for `peer_timeout` at most; past it the endpoint fails with [`TransportError::PeerStalled`], and `close`
//!   and drop return. A peer that stalls inside a copy may still write into the buffers
//!   given back afterwards, as a hostile peer can write any region announced to it at any
//!   time: the gate orders an honest peer's copies, it does not fence a hostile one.
//! - **A parked side is woken.** [`Endpoint::arm`] asks the peer to wake this side
//!   (`Segment::park_incoming`) and then looks for a delivery; a sender whose delivery
//!   finds the request sends [`Record::Wake`] on the socket, which is this side's
//!   [`Readiness::Fd`] (see `segment` for why no wake is lost). Closing or failing wakes
//!   the peer unasked, and a peer process that dies leaves the socket at end of file,
//!   readable too. [`Endpoint::disarm`] reads what the socket holds, so it is quiet again
//!   until the next wake.
//! - **Outstanding counts** are requests posted and not yet returned by `poll`; they never
//!   pass the queue depths. Each direction's ring is its receiver's receive depth rounded
//!   up to a power of two (`RingSize`, from the depths the handshake exchanged, kept by
//!   each side, never read from the segment), so the receiver never rewrites a ring entry
//!   the sender may still read, and the entries past it are never touched: a connection
//!   with shallow queues has only the first pages of its segment's memory file allocated.

use std::collections::VecDeque;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::{Arc, Weak};
use std::task::Waker;
use std::time::{Duration, Instant};

// Looked up on every post and every copy: foldhash, not the default SipHash.
use foldhash::HashMap;
use tierbuf_pool::{PoolError, Region, SharedHostRegion};

use super::bootstrap::{
    FileMapping, Incoming, MapError, Received, Record, SOCKET_TIMEOUT, SocketError, receive_record,
    send_record, send_wake,
};
use super::limits::{MappingCharge, PeerBounds};
use super::segment::{
    Filled, INLINE_CAPACITY, PairState, PostedBuffer, PostedView, RING_CAPACITY, Ring, RingSize,
    SharedSegment, prefetch,
};
use crate::error::{PostError, QueueKind, TransportError};
use crate::exposure::{Access, Exposures, Window};
use crate::provider::{
    Armed, BufferRef, CallerCopies, Completion, CompletionStatus, Endpoint, EndpointLimits,
    EndpointState, Opcode, Outstanding, Readiness, RemoteBuffer,
};
use crate::registry::{RegionCache, Registered, Resolved};

/// The most buffers in one shared-memory send's gather list.
pub(crate) const MAX_GATHER: usize = 4;

/// The shortest send not carried inline that is better copied from the caller's memory
/// ([`Endpoint::caller_copies`]). A send carried inline (at most [`INLINE_CAPACITY`]
/// bytes) is always better copied from the caller: its bytes go into the ring entry
/// either way, and from the caller's memory the send skips the copy into a registered
/// buffer, the buffer's lookup and the queued request. Between the two bounds a send
/// through a registered send slot was the faster (at 1 KiB), and from 8 KiB up the copy
/// straight from the caller's memory into the peer's buffer was, so the bound lies
/// between them. The benches that decide both bounds are in `benches/benches/transport.rs`:
/// the connection's `transport/pingpong/shm` at 64 B and `transport/stream/shm` at 1 KiB,
/// 8 KiB and 64 KiB, each run with and without the caller's copy.
const LARGE_CALLER_COPIES: usize = 4096;

/// Polls that find nothing to do between two looks at the bootstrap socket (for a peer
/// that has gone, or forgotten regions).
const IDLE_POLLS_PER_SOCKET_CHECK: u32 = 256;

/// Records one look at the socket reads at most: a peer that floods it with records costs
/// this side reads, never a loop it cannot leave.
const RECORDS_PER_SOCKET_CHECK: usize = 64;

/// A posted send waiting for the peer's receive.
#[derive(Debug)]
struct PendingSend {
    wr_id: u64,
    gather: [Option<Resolved<SharedHostRegion>>; MAX_GATHER],
    len: u32,
    work: Work,
}

/// What a request of the send queue does.
#[derive(Debug, Clone, Copy)]
enum Work {
    /// Sends the gather list into the peer's oldest receive.
    Send,
    /// Writes the gather list into the peer's exposed `remote`, then, with `imm`,
    /// completes the peer's oldest receive with it.
    Write {
        remote: RemoteBuffer,
        imm: Option<u32>,
    },
    /// Reads the peer's exposed `remote` into the first gather buffer.
    Read { remote: RemoteBuffer },
}

impl Work {
    fn opcode(self) -> Opcode {
        match self {
            Work::Send => Opcode::Send,
            Work::Write { .. } => Opcode::Write,
            Work::Read { .. } => Opcode::Read,
        }
    }
}

/// The bytes of a send: a posted send's gather list, or the caller's own memory for a
/// send copied at once ([`Endpoint::try_post_send_copied`]).
#[derive(Clone, Copy)]
enum Source<'a> {
    Posted(&'a PendingSend),
    Caller(&'a [&'a [u8]]),
}

impl Source<'_> {
    /// Whether every region the bytes lie in is still registered.
    fn is_live(self) -> bool {
        match self {
            Source::Posted(send) => send.gather.iter().flatten().all(|s| s.region.is_live()),
            Source::Caller(_) => true,
        }
    }

    /// Copies the bytes, in order, to `destination`.
    ///
    /// # Safety
    ///
    /// `destination` is valid for writes of the source's length (what `try_match` was
    /// given) that nothing else reads or writes meanwhile. The sources need nothing more:
    /// a posted send's buffers lie inside their live local regions (checked when posted,
    /// and the request holds the regions), and the poster promised not to write them
    /// until the send's completion; the caller's parts are borrowed for the call.
    unsafe fn copy_to(self, destination: *mut u8) {
        let mut written = 0usize;
        let mut copy = |from: *const u8, len: usize| {
            // SAFETY: the source as the function's doc says; the parts add up to the
            // source's length, so `written .. written + len` stays within what the
            // caller promised.
            unsafe { std::ptr::copy_nonoverlapping(from, destination.add(written), len) };
            written += len;
        };
        match self {
            Source::Posted(send) => {
                for segment in send.gather.iter().flatten() {
                    // SAFETY: `offset` lies within the region (checked when posted).
                    let from = unsafe { segment.region.byte_at(segment.offset) };
                    copy(from.as_ptr(), segment.len as usize);
                }
            }
            Source::Caller(parts) => {
                // The first cache line goes whole, gathered on the stack, so that the bulk
                // after it is stored line by line: a connection's parts are a frame
                // header and a payload, and a payload copied 16 bytes into a line would
                // split every store over two lines of the peer's buffer.
                let mut head = [0u8; HEAD];
                let mut gathered = 0;
                for part in parts.iter() {
                    let take = (HEAD - gathered).min(part.len());
                    head[gathered..gathered + take].copy_from_slice(&part[..take]);
                    gathered += take;
                }
                copy(head.as_ptr(), gathered);
                let mut at = 0;
                for part in parts.iter() {
                    let skip = gathered.saturating_sub(at).min(part.len());
                    copy(part[skip..].as_ptr(), part.len() - skip);
                    at += part.len();
                }
            }
        }
    }
}

/// The bytes a copy from the caller's memory gathers before the rest: one cache line.
const HEAD: usize = 64;

/// A posted receive, holding its region.
#[derive(Debug)]
struct PostedRecv {
    wr_id: u64,
    buffer: Resolved<SharedHostRegion>,
}

/// A region this side announced to the peer.
#[derive(Debug)]
struct Announced {
    region: Weak<Registered<SharedHostRegion>>,
    remote_addr: u64,
}

/// A region of the peer that this side may fill.
#[derive(Debug)]
struct PeerRegion {
    remote_addr: u64,
    mapping: FileMapping,
    /// Counts the mapping in the provider's total until it is undone.
    _charge: MappingCharge,
}

/// The connection segment as one side maps it: the connecting side's own memory file,
/// or on the accepting side the peer's, whose mapping is charged to the provider's total
/// (`limits`) until it is undone.
#[derive(Debug)]
pub(crate) struct MappedSegment {
    /// The mapping, of at least `size_of::<SharedSegment>()` bytes.
    pub(crate) mapping: FileMapping,
    /// The charge of a mapping of the peer's file; `None` for this side's own.
    pub(crate) _charge: Option<MappingCharge>,
}

impl MappedSegment {
    fn segment(&self) -> &SharedSegment {
        // SAFETY: `mapping` maps at least `size_of::<SharedSegment>()` bytes, page-aligned
        // (so aligned for the segment), for as long as `self` lives; the handshake checked
        // the stamp. Every field of the segment is an atomic integer, for which any bit
        // pattern the peer writes is a valid value, and atomics may be shared.
        unsafe { self.mapping.base().cast::<SharedSegment>().as_ref() }
    }
}

/// One side of a shared-memory connection; see [`Endpoint`] for the rules it keeps and
/// [`ShmProvider`](super::ShmProvider) for how to make one. Dropping it closes it.
#[derive(Debug)]
pub struct ShmEndpoint {
    /// 0 for the connecting side, 1 for the accepting side.
    side: usize,
    socket: OwnedFd,
    segment: MappedSegment,
    limits: EndpointLimits,
    /// The ring of the direction this side sends on: the peer's receive depth's.
    send_ring: RingSize,
    /// The ring of the direction this side receives on: its own receive depth's.
    recv_ring: RingSize,
    local: RegionCache<SharedHostRegion>,
    outstanding: Outstanding,
    closed: bool,
    // Sending.
    pending: VecDeque<PendingSend>,
    send_completions: VecDeque<Completion>,
    /// Peer receives filled, ever.
    sends_matched: u64,
    /// The peer's posts as this side last read them.
    peer_posts: PostedView,
    peer_regions: HashMap<u32, PeerRegion>,
    /// Announcements of the peer read from the socket, ever.
    announcements_read: u64,
    // Receiving.
    posted: VecDeque<PostedRecv>,
    recv_completions: VecDeque<Completion>,
    /// Receives posted, ever.
    recvs_posted: u64,
    /// Receives reaped or flushed, ever.
    recvs_reaped: u64,
    /// Regions announced to the peer and not yet forgotten, by remote key.
    announced: HashMap<u32, Announced>,
    /// The ranges exposed to the peer, each holding its region.
    exposures: Exposures<SharedHostRegion>,
    // Liveness.
    idle_polls: u32,
    peer_gone: bool,
    /// How long to wait for what only the peer can do (module invariants), and how much
    /// of its memory to map.
    peer: PeerBounds,
    /// An error to report from the next `poll`, once.
    failure: Option<TransportError>,
}

impl ShmEndpoint {
    /// An endpoint over a finished handshake. `segment` maps a stamped segment; the peer
    /// keeps at most `peer_recv_depth` receives outstanding; what only the peer can do is
    /// waited for `peer.timeout` at most, and at most `peer.mapping` of its memory is
    /// mapped.
    pub(crate) fn new(
        side: usize,
        socket: OwnedFd,
        segment: MappedSegment,
        limits: EndpointLimits,
        peer_recv_depth: u32,
        local: RegionCache<SharedHostRegion>,
        peer: PeerBounds,
    ) -> ShmEndpoint {
        ShmEndpoint {
            side,
            socket,
            segment,
            limits,
            send_ring: RingSize::of_depth(peer_recv_depth),
            recv_ring: RingSize::of_depth(limits.recv_depth),
            local,
            outstanding: Outstanding::default(),
            closed: false,
            pending: VecDeque::new(),
            send_completions: VecDeque::new(),
            sends_matched: 0,
            peer_posts: PostedView::default(),
            peer_regions: HashMap::default(),
            announcements_read: 0,
            posted: VecDeque::new(),
            recv_completions: VecDeque::new(),
            recvs_posted: 0,
            recvs_reaped: 0,
            announced: HashMap::default(),
            exposures: Exposures::default(),
            idle_polls: 0,
            peer_gone: false,
            peer,
            failure: None,
        }
    }

    fn segment(&self) -> &SharedSegment {
        self.segment.segment()
    }

    fn peer(&self) -> usize {
        1 - self.side
    }

    /// The direction this side sends on, through the peer's ring.
    fn outgoing(&self) -> Ring<'_, RING_CAPACITY> {
        self.segment().ring(self.side, self.send_ring)
    }

    /// The direction this side receives on, through its own ring.
    fn incoming(&self) -> Ring<'_, RING_CAPACITY> {
        self.segment().ring(self.peer(), self.recv_ring)
    }

    /// Breaks the connection and records `error` as the error the next poll reports,
    /// unless one is recorded already.
    fn fail(&mut self, error: TransportError) {
        self.segment().break_connection();
        send_wake(self.socket.as_fd());
        if self.failure.is_none() {
            self.failure = Some(error);
        }
    }

    /// Breaks the connection and records the peer's violation, `detail`.
    fn violation(&mut self, detail: String) {
        self.fail(TransportError::ProtocolViolation {
            provider: "shm",
            detail,
        });
    }

    /// Breaks the connection for a peer that left this side waiting past its deadline
    /// for `waiting_for`.
    fn stalled(&mut self, waiting_for: &'static str, timeout: Duration) {
        self.fail(TransportError::PeerStalled {
            provider: "shm",
            waiting_for,
            timeout,
        });
    }

    /// Fails the connection for what the socket said, keeping it as the cause: a socket
    /// the peer's side closed is the peer gone; a send that timed out, a peer that does
    /// not read; a record that does not parse, the peer's violation; anything else, the
    /// socket's error as it came.
    fn socket_failed(&mut self, error: SocketError) {
        use rustix::io::Errno;
        match error {
            SocketError::LocalResource { operation, source } => {
                self.fail(TransportError::LocalResource {
                    provider: "shm",
                    operation,
                    source,
                })
            }
            SocketError::Io { source, .. }
                if [
                    Errno::PIPE,
                    Errno::CONNRESET,
                    Errno::NOTCONN,
                    Errno::CONNREFUSED,
                ]
                .iter()
                .any(|gone| source.raw_os_error() == Some(gone.raw_os_error())) =>
            {
                self.peer_vanished()
            }
            SocketError::Io { source, .. }
                if source.raw_os_error() == Some(Errno::AGAIN.raw_os_error()) =>
            {
                self.stalled("the peer's read of its bootstrap socket", SOCKET_TIMEOUT)
            }
            SocketError::Io { operation, source } => self.fail(TransportError::Provider {
                provider: "shm",
                operation,
                source,
            }),
            error => self.violation(format!("bootstrap socket: {error}")),
        }
    }

    /// Handles one record of the peer's from the socket.
    fn handle_record(&mut self, received: Received) {
        match (received.record, received.descriptor) {
            (
                Record::Announce {
                    remote_key,
                    remote_addr,
                    file_len,
                },
                Some(file),
            ) => {
                self.announcements_read += 1;
                if let Err(detail) = self.admit_peer_region(remote_key, file_len) {
                    self.violation(detail);
                    return;
                }
                // A region the key named already is unmapped first: its charge makes room.
                self.peer_regions.remove(&remote_key);
                let charge = match self.peer.total.charge(file_len) {
                    Ok(charge) => charge,
                    Err(reached) => {
                        return self.fail(TransportError::LocalResource {
                            provider: "shm",
                            operation: "mapping a region the peer announced: this provider's \
                                        endpoints map their peers' memory up to a total",
                            source: std::io::Error::other(reached),
                        });
                    }
                };
                match FileMapping::map(&file, file_len) {
                    Ok(mapping) => {
                        self.peer_regions.insert(
                            remote_key,
                            PeerRegion {
                                remote_addr,
                                mapping,
                                _charge: charge,
                            },
                        );
                    }
                    Err(MapError::NotAsSaid(reason)) => {
                        self.violation(format!("announced region {remote_key:#x}: {reason}"))
                    }
                    Err(MapError::Refused { operation, source }) => {
                        self.fail(TransportError::LocalResource {
                            provider: "shm",
                            operation,
                            source,
                        })
                    }
                }
            }
            (
                Record::Forget {
                    remote_key,
                    remote_addr,
                },
                None,
            ) => {
                self.announcements_read += 1;
                if self
                    .peer_regions
                    .get(&remote_key)
                    .is_some_and(|region| region.remote_addr == remote_addr)
                {
                    self.peer_regions.remove(&remote_key);
                }
            }
            (Record::Wake, None) => {}
            (record, _) => self.violation(format!("unexpected {record:?} record")),
        }
    }

    /// Whether a region of `file_len` bytes the peer announces under `remote_key` may be
    /// mapped: with it (in place of one the key names already), the peer's regions stay
    /// within the mapping limit (`limits`' invariants). Otherwise, what the peer did.
    fn admit_peer_region(&self, remote_key: u32, file_len: u64) -> Result<(), String> {
        let replaced = self.peer_regions.get(&remote_key);
        let regions = self.peer_regions.len() + usize::from(replaced.is_none());
        let bytes = self
            .peer_regions
            .values()
            .map(|region| region.mapping.len() as u64)
            .sum::<u64>()
            .saturating_sub(replaced.map_or(0, |region| region.mapping.len() as u64))
            .saturating_add(file_len);
        let limit = self.peer.mapping;
        if limit.admits(regions, bytes) {
            return Ok(());
        }
        Err(format!(
            "announced region {remote_key:#x} of {file_len} bytes, which would make {regions} \
             regions of {bytes} bytes mapped, past the mapping limit of {} regions of {} bytes",
            limit.regions(),
            limit.bytes()
        ))
    }

    /// Reads the socket, without waiting, until the first `needed` announcements of the
    /// peer's are handled; returns whether they are. The peer sends each record before it
    /// counts it, and a record sent on a Unix socket is in this side's queue when the send
    /// returns (segment invariants), so a socket drained short of the count proves the peer
    /// counted records it never sent: its violation, found at once.
    fn catch_up_with_announcements(&mut self, needed: u64) -> bool {
        while self.announcements_read < needed {
            if self.failure.is_some() {
                return false;
            }
            match receive_record(self.socket.as_fd(), false) {
                Ok(Incoming::Record(received)) => self.handle_record(received),
                Ok(Incoming::Nothing) => {
                    let read = self.announcements_read;
                    self.violation(format!(
                        "the peer counted {needed} region announcements as sent, and its \
                         socket held {read}"
                    ));
                    return false;
                }
                Ok(Incoming::Closed) => {
                    self.peer_vanished();
                    return false;
                }
                Err(error) => {
                    self.socket_failed(error);
                    return false;
                }
            }
        }
        true
    }

    /// Looks at the socket without waiting: handles what the peer sent (at most
    /// [`RECORDS_PER_SOCKET_CHECK`] records) and notices a peer that is gone.
    fn check_socket(&mut self) {
        for _ in 0..RECORDS_PER_SOCKET_CHECK {
            if self.failure.is_some() || self.peer_gone {
                return;
            }
            match receive_record(self.socket.as_fd(), false) {
                Ok(Incoming::Record(received)) => self.handle_record(received),
                Ok(Incoming::Nothing) => return,
                Ok(Incoming::Closed) => self.peer_vanished(),
                Err(error) => self.socket_failed(error),
            }
        }
    }

    /// Fails the connection for a post whose announcement the socket refused with
    /// `error`, and says why the post was refused. A peer that closes in order shuts its
    /// side of the segment before its socket, so a socket that fails between a post's look
    /// at the state and its announcement (the peer closing meanwhile) finds the state
    /// saying so: that post is refused as the peer's close, after which what the peer
    /// delivered before it is still reaped, not as a broken connection.
    fn refused_by_socket(&mut self, error: SocketError) -> PostError {
        self.socket_failed(error);
        self.state()
            .admits_posts()
            .err()
            .unwrap_or(PostError::ConnectionBroken)
    }

    /// The peer's socket closed. After a close that is the end of the connection; while
    /// it is open, the peer process died.
    fn peer_vanished(&mut self) {
        self.peer_gone = true;
        if self.segment().state() == PairState::Open {
            self.segment().break_connection();
            if self.failure.is_none() {
                self.failure = Some(TransportError::PeerDied { provider: "shm" });
            }
        }
    }

    /// Queues a one-sided request of `len` bytes from (or, for a read, into) `gather`, in
    /// order behind the sends, and carries out what it can.
    fn post_one_sided(
        &mut self,
        gather: &[BufferRef],
        len: u32,
        work: Work,
        wr_id: u64,
    ) -> Result<(), PostError> {
        self.state().admits_posts()?;
        self.outstanding.check_room(QueueKind::Send, self.limits)?;
        let resolved = self.local.resolve_gather::<MAX_GATHER>(gather)?;
        self.outstanding.sends += 1;
        self.pending.push_back(PendingSend {
            wr_id,
            gather: resolved,
            len,
            work,
        });
        self.progress_sends();
        Ok(())
    }

    /// Copies pending sends into the peer's posted receives, in order, while both exist.
    /// Returns whether any send completed.
    fn progress_sends(&mut self) -> bool {
        let mut progressed = false;
        while let Some(send) = self.pending.pop_front() {
            let Some(done) = self.carry_out(&send) else {
                self.pending.push_front(send);
                break;
            };
            self.complete(send.wr_id, done);
            progressed = true;
        }
        progressed
    }

    /// Carries out `send`, a request of the send queue, unless it waits for a receive of
    /// the peer's or the connection is down (`None`): how it ended.
    fn carry_out(&mut self, send: &PendingSend) -> Option<Done> {
        match send.work {
            Work::Send => Some(Done::send(self.try_match(Source::Posted(send), send.len)?)),
            Work::Write { remote, imm } => self.one_sided(send, remote, Access::Write, imm),
            Work::Read { remote } => self.one_sided(send, remote, Access::Read, None),
        }
    }

    /// Queues the completion of send-queue request `wr_id` as `done`.
    fn complete(&mut self, wr_id: u64, done: Done) {
        self.send_completions.push_back(Completion {
            wr_id,
            byte_len: done.byte_len,
            status: done.status,
            opcode: done.opcode,
        });
    }

    /// Queues the completion of send `wr_id` with `status`.
    fn complete_send(&mut self, wr_id: u64, status: CompletionStatus) {
        self.complete(wr_id, Done::send(status));
    }

    /// Carries out a one-sided write (`access` [`Access::Write`], with `imm` consuming the
    /// peer's oldest receive) or read of the peer's exposure `remote` for `send`; `None`
    /// while a write with an immediate waits for a receive, or the connection is down.
    ///
    /// The peer's exposure is checked before any byte moves, in this order: the key in
    /// force for the access (`ExposureTable::begin_access`, which marks it accessed so
    /// the peer does not revoke it meanwhile), `remote` inside the range exposed, and
    /// inside a region the peer announced (`peer_buffer`, after the announcements the
    /// exposure's publication covers are read). A check that fails touches nothing and
    /// breaks the connection with [`CompletionStatus::RemoteAccessError`]; the copy gate
    /// (`Segment::begin_copy`) orders the copy with the peer's close as for a send.
    fn one_sided(
        &mut self,
        send: &PendingSend,
        remote: RemoteBuffer,
        access: Access,
        imm: Option<u32>,
    ) -> Option<Done> {
        let opcode = send.work.opcode();
        if self.segment().state() != PairState::Open {
            return None;
        }
        let count = self.sends_matched;
        if imm.is_some() && !self.peer_posted(count) {
            return None;
        }
        if !Source::Posted(send).is_live() {
            self.segment().break_connection();
            return Some(Done::of(opcode, CompletionStatus::LocalProtectionError));
        }
        let table = self.segment().exposures(self.peer());
        let Ok(window) = table.begin_access(remote.key, access) else {
            return Some(self.refused(opcode));
        };
        let outcome = self.access_window(send, remote, access, window);
        self.segment().exposures(self.peer()).end_access(remote.key);
        let status = match outcome {
            Some(true) => CompletionStatus::Success,
            Some(false) => return Some(self.refused(opcode)),
            // Down meanwhile, or the peer's announcements missing: nothing was touched,
            // and the connection has failed or is closing.
            None => return None,
        };
        if let Some(imm) = imm {
            let len = send.len;
            if self.outgoing().deliver(count, Filled::Written { len, imm }) {
                send_wake(self.socket.as_fd());
            }
            self.sends_matched += 1;
        } else {
            self.segment().end_copy(self.side);
        }
        let byte_len = if access == Access::Read { send.len } else { 0 };
        Some(Done {
            opcode,
            status,
            byte_len,
        })
    }

    /// Copies for a one-sided `access` of `remote` through the peer's exposure `window`,
    /// which this side marked accessed: `Some(true)` when done (with the copy gate passed,
    /// for the caller to reopen), `Some(false)` when `remote` lies outside the window or
    /// outside what the peer announced (nothing touched), `None` when the connection went
    /// down or the announcements the exposure needs are missing (the connection failed).
    fn access_window(
        &mut self,
        send: &PendingSend,
        remote: RemoteBuffer,
        access: Access,
        window: Window,
    ) -> Option<bool> {
        if window
            .offset_of(remote.addr, u64::from(remote.len))
            .is_none()
        {
            return Some(false);
        }
        let announced = self.segment().direction(self.side).announced();
        if self.announcements_read < announced && !self.catch_up_with_announcements(announced) {
            return None;
        }
        let Some(at) = self.peer_buffer(PostedBuffer {
            remote_key: window.region_key,
            addr: remote.addr,
            len: remote.len,
        }) else {
            return Some(false);
        };
        if !self.segment().begin_copy(self.side) {
            return None;
        }
        match access {
            // SAFETY: `at` starts `remote.len == send.len` bytes (checked when posted)
            // inside a mapping of the peer's announced region, exposed to this side for
            // writing and marked accessed; the peer's close waits for the copy gate.
            Access::Write => unsafe { Source::Posted(send).copy_to(at.as_ptr()) },
            // SAFETY: the same range, exposed for reading, which the peer does not write
            // while exposed; the destination is the request's one buffer of `send.len`
            // bytes, which its poster promised to the provider until the completion.
            Access::Read => unsafe { copy_into_first(send, at) },
        }
        Some(true)
    }

    /// Breaks the connection for a one-sided request the peer's exposure refused.
    fn refused(&mut self, opcode: Opcode) -> Done {
        self.segment().break_connection();
        Done::of(opcode, CompletionStatus::RemoteAccessError)
    }

    /// Whether the peer has posted its `count`-th receive, reading its ring's counters
    /// when this side's view is used up; a count out of bounds fails the connection as
    /// the peer's violation (and answers `false`).
    fn peer_posted(&mut self, count: u64) -> bool {
        let mut view = self.peer_posts;
        let posted = self.outgoing().is_posted(count, &mut view);
        self.peer_posts = view;
        posted.unwrap_or_else(|bad| {
            self.violation(bad.to_string());
            false
        })
    }

    /// Delivers `source`, `len` bytes of the oldest send not yet matched, into the peer's
    /// oldest unfilled receive and returns the status its completion gets; `None`
    /// (nothing done) while there is no such receive or the connection is down.
    fn try_match(&mut self, source: Source<'_>, len: u32) -> Option<CompletionStatus> {
        if self.segment().state() != PairState::Open {
            return None;
        }
        let count = self.sends_matched;
        if !self.peer_posted(count) {
            return None;
        }
        // A message short enough for any receive the view shows long leaves the entry's
        // buffer unread: its stores then wait for no line the peer wrote (`segment`).
        let buffer = (len as usize > INLINE_CAPACITY || !self.peer_posts.holds_inline(count))
            .then(|| self.outgoing().posted_buffer(count));
        // Inline where the message is short enough for the receive; a copy otherwise.
        let copy_into = buffer.filter(|buffer| len as usize > INLINE_CAPACITY || len > buffer.len);
        // Only a copy looks the peer's region up: an inline delivery needs none of the
        // peer's announcements, which are read when a copy does.
        if copy_into.is_some()
            && self.announcements_read < self.peer_posts.announced()
            && !self.catch_up_with_announcements(self.peer_posts.announced())
        {
            // The peer counted announcements it never sent: the connection has failed,
            // and a non-blocking send takes nothing.
            return None;
        }
        let status = match self.fill(source, len, copy_into) {
            Ok(filled) => {
                let parked = if let Filled::Inline(len) = filled {
                    self.deliver_inline(count, source, len)
                } else {
                    self.outgoing().deliver(count, filled)
                };
                if parked {
                    send_wake(self.socket.as_fd());
                }
                match filled {
                    Filled::Delivered(_) | Filled::Inline(_) | Filled::Written { .. } => {
                        CompletionStatus::Success
                    }
                    Filled::TooLong => {
                        self.segment().break_connection();
                        CompletionStatus::RemoteInvalidRequest
                    }
                    Filled::Unreachable => {
                        // An honest peer posts only buffers inside regions it announced
                        // before the post: this entry's words name none, so it wrote them.
                        self.violation(unreachable_receive(count, copy_into));
                        CompletionStatus::RemoteOperationError
                    }
                }
            }
            Err(NotCopied::LocalRegionGone) => {
                self.segment().break_connection();
                CompletionStatus::LocalProtectionError
            }
            Err(NotCopied::ConnectionDown) => return None,
        };
        self.sends_matched += 1;
        Some(status)
    }

    /// Copies `source`, `len` bytes, into the peer's buffer `copy_into` if it fits and
    /// can be reached; with `copy_into` `None` (a message short enough for the receive:
    /// the sender's view showed it to hold any inline message,
    /// [`PostedView::holds_inline`], or its buffer was read and is long enough), the send
    /// travels inline: it is left to [`ShmEndpoint::deliver_inline`] and reported as
    /// [`Filled::Inline`]. The peer checks an inline message against its buffer when it
    /// reaps it (it is the one that writes it). Either way the gate is passed, and the
    /// delivery reopens it.
    fn fill(
        &self,
        source: Source<'_>,
        len: u32,
        copy_into: Option<PostedBuffer>,
    ) -> Result<Filled, NotCopied> {
        let destination = match copy_into {
            Some(buffer) => {
                let Some(destination) = self.peer_buffer(buffer) else {
                    return Ok(Filled::Unreachable);
                };
                if len > buffer.len {
                    return Ok(Filled::TooLong);
                }
                Some(destination)
            }
            None => None,
        };
        if !source.is_live() {
            return Err(NotCopied::LocalRegionGone);
        }
        if !self.segment().begin_copy(self.side) {
            return Err(NotCopied::ConnectionDown);
        }
        let Some(destination) = destination else {
            return Ok(Filled::Inline(len));
        };
        // SAFETY: `destination` starts the peer's buffer, which `peer_buffer` found inside
        // a mapping of ours with `len <= buffer.len` bytes to spare. The peer promised the
        // buffer to this send (it is the oldest posted receive) and, closing, shuts its
        // gate and waits for the copy `begin_copy` admitted.
        unsafe { source.copy_to(destination.as_ptr()) };
        Ok(Filled::Delivered(len))
    }

    /// Delivers `source`, `len` bytes that [`ShmEndpoint::fill`] found short enough (and
    /// passed the gate for), inline in the ring entry of the peer's `count`-th receive:
    /// the caller's parts go into the entry as they are, word by word; a posted send's
    /// buffers are copied out of their regions first. Returns whether the peer had parked.
    fn deliver_inline(&self, count: u64, source: Source<'_>, len: u32) -> bool {
        match source {
            Source::Caller(parts) => self.outgoing().deliver_inline(count, parts),
            Source::Posted(_) => {
                let mut message = [0u8; INLINE_CAPACITY];
                // SAFETY: the source is `len <= INLINE_CAPACITY` bytes, the length of
                // `message`, which nothing else reaches.
                unsafe { source.copy_to(message.as_mut_ptr()) };
                self.outgoing()
                    .deliver_inline(count, &[&message[..len as usize]])
            }
        }
    }

    /// The first byte of the peer's `buffer` in this process, if it lies inside a region
    /// the peer announced.
    fn peer_buffer(&self, buffer: PostedBuffer) -> Option<std::ptr::NonNull<u8>> {
        let region = self.peer_regions.get(&buffer.remote_key)?;
        let offset = usize::try_from(buffer.addr.checked_sub(region.remote_addr)?).ok()?;
        let end = offset.checked_add(buffer.len as usize)?;
        if end > region.mapping.len() {
            return None;
        }
        // SAFETY: `offset + len <= mapping length`, so the pointer stays in the mapping.
        Some(unsafe { region.mapping.base().add(offset) })
    }

    /// Asks the core to fetch what the peer's delivery into `front`, the receive polled
    /// for, will write, while this side polls its result word: the tail of an inline
    /// message, and the head of the buffer, which a copied message fills. The lines then
    /// travel alongside the result word instead of after it.
    fn prefetch_delivery(&self, front: &PostedRecv) {
        self.incoming().prefetch_inline_tail(self.recvs_reaped);
        // SAFETY: `offset` lies within the region (checked when the receive was posted, and
        // the request holds the region), so the pointer is in bounds.
        let head = unsafe { front.buffer.region.byte_at(front.buffer.offset) };
        prefetch(head.as_ptr());
        if front.buffer.len as usize > INLINE_CAPACITY {
            prefetch(head.as_ptr().wrapping_add(64));
        }
    }

    /// Turns the peer's reports on this side's receives into completions, in order.
    /// Returns whether any receive completed.
    fn reap_receives(&mut self) -> bool {
        let mut progressed = false;
        while let Some(front) = self.posted.front() {
            let Some(report) = self.incoming().delivered(self.recvs_reaped) else {
                self.prefetch_delivery(front);
                break;
            };
            let mut opcode = Opcode::Recv;
            let (status, byte_len) = match report {
                Ok(Filled::Delivered(len)) if len <= front.buffer.len => {
                    if front.buffer.region.is_live() {
                        (CompletionStatus::Success, len)
                    } else {
                        self.segment().break_connection();
                        (CompletionStatus::LocalProtectionError, 0)
                    }
                }
                Ok(Filled::Inline(len))
                    if len <= front.buffer.len && len as usize <= INLINE_CAPACITY =>
                {
                    if front.buffer.region.is_live() {
                        // SAFETY: the buffer `offset .. offset + len` lies inside the
                        // live region the receive holds (checked when posted), and it is
                        // this side's alone while the slice lives: the peer does not
                        // write a buffer it delivered to inline, and the poster reads it
                        // only after this completion.
                        let buffer = unsafe {
                            std::slice::from_raw_parts_mut(
                                front.buffer.region.byte_at(front.buffer.offset).as_ptr(),
                                len as usize,
                            )
                        };
                        self.incoming().inline_message(self.recvs_reaped, buffer);
                        (CompletionStatus::Success, len)
                    } else {
                        self.segment().break_connection();
                        (CompletionStatus::LocalProtectionError, 0)
                    }
                }
                Ok(Filled::Delivered(len) | Filled::Inline(len)) => {
                    let posted = front.buffer.len;
                    self.violation(format!(
                        "the peer delivered {len} bytes into a receive of {posted}"
                    ));
                    (CompletionStatus::LocalProtectionError, 0)
                }
                Ok(Filled::TooLong) => {
                    self.segment().break_connection();
                    (CompletionStatus::LocalLengthError, 0)
                }
                // The bytes went into a range this side exposed, not into the receive's
                // buffer: its length is the peer's report, which this side does not use
                // to read anything.
                Ok(Filled::Written { len, imm }) => {
                    opcode = Opcode::RecvWithImm(imm);
                    (CompletionStatus::Success, len)
                }
                Ok(Filled::Unreachable) => {
                    self.segment().break_connection();
                    (CompletionStatus::LocalProtectionError, 0)
                }
                Err(code) => {
                    self.violation(format!("the peer reported unknown result code {code}"));
                    (CompletionStatus::LocalProtectionError, 0)
                }
            };
            let receive = self
                .posted
                .pop_front()
                .expect("the front receive was just seen");
            self.recvs_reaped += 1;
            self.recv_completions.push_back(Completion {
                wr_id: receive.wr_id,
                byte_len,
                status,
                opcode,
            });
            progressed = true;
        }
        progressed
    }

    /// Once the connection is down: completes every request left with `Flushed`, after
    /// the peer can no longer be copying into this side's buffers.
    fn flush(&mut self) {
        if self.pending.is_empty() && self.posted.is_empty() {
            return;
        }
        self.reap_receives();
        let mut wait = PeerWait::new(self.peer_gone, self.peer.timeout);
        let socket = self.socket.as_fd();
        // Records that arrive now are dropped (closing their descriptors): the connection
        // is down, so nothing will be sent into an announced region again.
        self.segment()
            .shut_incoming(self.side, || wait.keep_waiting(socket));
        self.peer_gone = wait.peer_gone;
        if wait.stalled {
            self.stalled(
                "the end of the peer's copy into this side's buffers (it holds its copy gate)",
                self.peer.timeout,
            );
        }
        // A delivery that was in progress has been made meanwhile.
        self.reap_receives();
        let flushed = |wr_id, opcode| Completion {
            wr_id,
            byte_len: 0,
            status: CompletionStatus::Flushed,
            opcode,
        };
        for send in self.pending.drain(..) {
            self.send_completions
                .push_back(flushed(send.wr_id, send.work.opcode()));
        }
        for receive in self.posted.drain(..) {
            self.recvs_reaped += 1;
            self.recv_completions
                .push_back(flushed(receive.wr_id, Opcode::Recv));
        }
    }

    /// Tells the peer to unmap the regions announced to it whose memory is gone here.
    fn forget_dead_regions(&mut self) -> Result<(), SocketError> {
        let dead: Vec<(u32, u64)> = self
            .announced
            .iter()
            .filter(|(_, announced)| announced.region.strong_count() == 0)
            .map(|(&key, announced)| (key, announced.remote_addr))
            .collect();
        for (remote_key, remote_addr) in dead {
            self.announced.remove(&remote_key);
            send_record(
                self.socket.as_fd(),
                Record::Forget {
                    remote_key,
                    remote_addr,
                },
                None,
            )?;
            self.segment().direction(self.peer()).announce();
        }
        Ok(())
    }

    /// Announces the region `buffer` lies in to the peer, unless it already knows it.
    ///
    /// # Safety
    ///
    /// Nothing writes any byte of that region while this call runs (its first
    /// announcement moves its memory into the file the peer maps).
    // Inlined, with the first announcement out of line: a steady connection's every
    // receive asks this, and the answer is a lookup (`benches/examples/message_instructions`).
    #[inline]
    unsafe fn announce(&mut self, buffer: &Resolved<SharedHostRegion>) -> Result<(), NotAnnounced> {
        let keys = buffer.region.region().keys();
        if self
            .announced
            .get(&keys.remote_key)
            .is_some_and(|announced| announced.region.as_ptr() == Arc::as_ptr(&buffer.region))
        {
            return Ok(());
        }
        // SAFETY: this function's contract.
        unsafe { self.announce_first(buffer) }
    }

    /// [`ShmEndpoint::announce`] of a region the peer does not know yet.
    ///
    /// # Safety
    ///
    /// As [`ShmEndpoint::announce`].
    #[cold]
    unsafe fn announce_first(
        &mut self,
        buffer: &Resolved<SharedHostRegion>,
    ) -> Result<(), NotAnnounced> {
        let keys = buffer.region.region().keys();
        let region = buffer.region.region();
        let shared_elsewhere =
            NotAnnounced::SharedWithAnotherPeer(PostError::SharedWithAnotherPeer {
                remote_key: keys.remote_key,
            });
        if region.exposed_to_peer() {
            return Err(shared_elsewhere);
        }
        // A region under a reused key must be forgotten before its successor is announced.
        self.forget_dead_regions()?;
        // SAFETY: this function's contract.
        let file = match unsafe { region.expose_memory_file() } {
            Ok(file) => file,
            Err(PoolError::AlreadyExposed { .. }) => return Err(shared_elsewhere),
            Err(error) => {
                return Err(NotAnnounced::Socket(SocketError::LocalResource {
                    operation: "sharing a receive region with the peer",
                    source: std::io::Error::other(error),
                }));
            }
        };
        send_record(
            self.socket.as_fd(),
            Record::Announce {
                remote_key: keys.remote_key,
                remote_addr: keys.remote_addr,
                file_len: region.file_len() as u64,
            },
            Some(file.as_fd()),
        )?;
        self.segment().direction(self.peer()).announce();
        self.announced.insert(
            keys.remote_key,
            Announced {
                region: Arc::downgrade(&buffer.region),
                remote_addr: keys.remote_addr,
            },
        );
        Ok(())
    }
}

/// What a peer did that posted its `count`-th receive as `buffer`, in no region it
/// announced.
fn unreachable_receive(count: u64, buffer: Option<PostedBuffer>) -> String {
    let named = buffer.map_or_else(
        || "no buffer".to_owned(),
        |buffer| {
            format!(
                "{:#x}+{} under key {:#x}",
                buffer.addr, buffer.len, buffer.remote_key
            )
        },
    );
    format!("the peer posted receive {count} as {named}, which lies in no region it announced")
}

/// A wait for what only the peer can do (leave its copy gate, end an access to an
/// exposure), bounded by the peer timeout and ended early by the peer's socket closing.
/// Records read from the socket meanwhile are dropped: the waits come when the connection
/// is going down, or the peer has stopped.
struct PeerWait {
    deadline: Option<Instant>,
    peer_gone: bool,
    stalled: bool,
}

impl PeerWait {
    fn new(peer_gone: bool, timeout: Duration) -> PeerWait {
        PeerWait {
            deadline: Instant::now().checked_add(timeout),
            peer_gone,
            stalled: false,
        }
    }

    /// Whether to look again: the peer is still there and within its deadline.
    fn keep_waiting(&mut self, socket: BorrowedFd<'_>) -> bool {
        if !self.peer_gone {
            self.peer_gone = matches!(receive_record(socket, false), Ok(Incoming::Closed) | Err(_));
        }
        self.stalled = !self.peer_gone
            && self
                .deadline
                .is_none_or(|deadline| Instant::now() >= deadline);
        !self.peer_gone && !self.stalled
    }
}

/// How a request of the send queue ended.
#[derive(Debug, Clone, Copy)]
struct Done {
    opcode: Opcode,
    status: CompletionStatus,
    /// A read's bytes; 0 otherwise.
    byte_len: u32,
}

impl Done {
    fn send(status: CompletionStatus) -> Done {
        Done::of(Opcode::Send, status)
    }

    /// A request that moved no bytes this side counts: a send, or one that failed.
    fn of(opcode: Opcode, status: CompletionStatus) -> Done {
        Done {
            opcode,
            status,
            byte_len: 0,
        }
    }
}

/// Copies `send.len` bytes from `source` into `send`'s first buffer (a read's).
///
/// # Safety
///
/// `source` is valid for reads of `send.len` bytes that nothing writes meanwhile.
unsafe fn copy_into_first(send: &PendingSend, source: std::ptr::NonNull<u8>) {
    if let Some(buffer) = send.gather.iter().flatten().next() {
        // SAFETY: the buffer lies inside its region, mapped while the request holds it,
        // and is `send.len` bytes long (checked when posted); its poster promised it to
        // the provider until the completion; the caller vouches for the source.
        unsafe {
            std::ptr::copy(
                source.as_ptr(),
                buffer.region.byte_at(buffer.offset).as_ptr(),
                send.len as usize,
            );
        }
    }
}

/// Why a receive region was not announced.
enum NotAnnounced {
    /// It receives for another peer already; the post is refused, the connection stands.
    SharedWithAnotherPeer(PostError),
    /// The socket or a resource of this process failed; the connection is broken.
    Socket(SocketError),
}

impl From<SocketError> for NotAnnounced {
    fn from(error: SocketError) -> Self {
        NotAnnounced::Socket(error)
    }
}

/// Why a send was not copied.
enum NotCopied {
    /// A region of the send's gather list was deregistered.
    LocalRegionGone,
    /// The connection went down before the copy.
    ConnectionDown,
}

impl Endpoint for ShmEndpoint {
    fn limits(&self) -> EndpointLimits {
        self.limits
    }

    fn state(&self) -> EndpointState {
        if self.closed {
            return EndpointState::Closed;
        }
        self.segment().state().seen_by(self.side)
    }

    fn outstanding(&self) -> Outstanding {
        self.outstanding
    }

    unsafe fn post_recv(&mut self, buffer: BufferRef, wr_id: u64) -> Result<(), PostError> {
        self.state().admits_posts()?;
        self.outstanding.check_room(QueueKind::Recv, self.limits)?;
        let buffer = self.local.resolve(buffer)?;
        // SAFETY: `post_recv`'s contract keeps every writer off the buffer's region while
        // it runs.
        match unsafe { self.announce(&buffer) } {
            Ok(()) => {}
            Err(NotAnnounced::SharedWithAnotherPeer(error)) => return Err(error),
            Err(NotAnnounced::Socket(error)) => return Err(self.refused_by_socket(error)),
        }
        let keys = buffer.region.region().keys();
        let posted = PostedBuffer {
            remote_key: keys.remote_key,
            addr: keys.remote_addr + buffer.offset as u64,
            len: buffer.len,
        };
        self.incoming().post(self.recvs_posted, posted);
        self.recvs_posted += 1;
        self.outstanding.recvs += 1;
        self.posted.push_back(PostedRecv { wr_id, buffer });
        Ok(())
    }

    unsafe fn post_send(&mut self, gather: &[BufferRef], wr_id: u64) -> Result<(), PostError> {
        self.state().admits_posts()?;
        self.outstanding.check_room(QueueKind::Send, self.limits)?;
        let len = self.limits.message_len(gather)?;
        let resolved = self.local.resolve_gather::<MAX_GATHER>(gather)?;
        self.outstanding.sends += 1;
        let send = PendingSend {
            wr_id,
            gather: resolved,
            len,
            work: Work::Send,
        };
        // Sends are matched in order: this one goes at once only with none queued ahead.
        if self.pending.is_empty() {
            match self.try_match(Source::Posted(&send), len) {
                Some(status) => self.complete_send(wr_id, status),
                None => self.pending.push_back(send),
            }
        } else {
            self.pending.push_back(send);
            self.progress_sends();
        }
        Ok(())
    }

    unsafe fn expose(
        &mut self,
        buffer: BufferRef,
        access: Access,
    ) -> Result<RemoteBuffer, PostError> {
        self.state().admits_posts()?;
        let slot = self.exposures.free_slot()?;
        let resolved = self.local.resolve(buffer)?;
        // The peer reaches the range through its mapping of the region: announced first,
        // and counted before the exposure is published (`Segment::exposures`).
        // SAFETY: `expose`'s contract keeps every writer off the region while it runs.
        match unsafe { self.announce(&resolved) } {
            Ok(()) => {}
            Err(NotAnnounced::SharedWithAnotherPeer(error)) => return Err(error),
            Err(NotAnnounced::Socket(error)) => return Err(self.refused_by_socket(error)),
        }
        let key = self.local.exposure_key(slot);
        let table = self.segment.segment().exposures(self.side);
        Ok(self.exposures.publish(table, key, access, buffer, resolved))
    }

    fn revoke(&mut self, exposed: RemoteBuffer) -> Result<(), PostError> {
        self.exposures.check(exposed)?;
        let mut wait = PeerWait::new(self.peer_gone, self.peer.timeout);
        let socket = self.socket.as_fd();
        let revoked = self
            .segment()
            .exposures(self.side)
            .revoke(exposed.key, || wait.keep_waiting(socket));
        if revoked {
            self.exposures.remove(exposed.key);
            return Ok(());
        }
        // The exposure stays recorded, holding its region, until the endpoint goes.
        if wait.stalled {
            self.stalled(
                "the end of the peer's access to an exposure being revoked",
                self.peer.timeout,
            );
        } else {
            self.peer_vanished();
        }
        Err(PostError::ConnectionBroken)
    }

    unsafe fn post_write(
        &mut self,
        gather: &[BufferRef],
        remote: RemoteBuffer,
        imm: Option<u32>,
        wr_id: u64,
    ) -> Result<(), PostError> {
        let len = self.limits.message_len(gather)?;
        remote.check_len(len)?;
        self.post_one_sided(gather, len, Work::Write { remote, imm }, wr_id)
    }

    unsafe fn post_read(
        &mut self,
        buffer: BufferRef,
        remote: RemoteBuffer,
        wr_id: u64,
    ) -> Result<(), PostError> {
        remote.check_len(buffer.len)?;
        self.post_one_sided(&[buffer], buffer.len, Work::Read { remote }, wr_id)
    }

    fn caller_copies(&self) -> CallerCopies {
        CallerCopies::new(Some(INLINE_CAPACITY), Some(LARGE_CALLER_COPIES))
    }

    fn try_post_send_copied(&mut self, parts: &[&[u8]], wr_id: u64) -> Result<bool, PostError> {
        self.state().admits_posts()?;
        self.outstanding.check_room(QueueKind::Send, self.limits)?;
        let len = self
            .limits
            .checked_len(parts.iter().map(|part| part.len() as u64))?;
        // Sends are matched in order: one queued ahead goes first.
        if !self.pending.is_empty() {
            return Ok(false);
        }
        let Some(status) = self.try_match(Source::Caller(parts), len) else {
            return Ok(false);
        };
        self.outstanding.sends += 1;
        self.complete_send(wr_id, status);
        Ok(true)
    }

    fn poll(&mut self, completions: &mut [Completion]) -> Result<usize, TransportError> {
        let progressed = self.progress_sends() | self.reap_receives();
        if progressed {
            self.idle_polls = 0;
        } else {
            self.idle_polls += 1;
            if self.idle_polls >= IDLE_POLLS_PER_SOCKET_CHECK {
                self.idle_polls = 0;
                self.check_socket();
                if let Err(error) = self.forget_dead_regions() {
                    self.socket_failed(error);
                }
            }
        }
        if self.segment().state() != PairState::Open {
            self.flush();
        }
        if let Some(error) = self.failure.take() {
            return Err(error);
        }
        let (sends, recvs) = (&mut self.send_completions, &mut self.recv_completions);
        let filled = self.outstanding.hand_out(completions, || {
            sends.pop_front().or_else(|| recvs.pop_front())
        });
        Ok(filled)
    }

    fn close(&mut self) {
        if self.closed {
            return;
        }
        self.closed = true;
        self.segment().close(self.side);
        send_wake(self.socket.as_fd());
        self.flush();
    }

    fn readiness(&self) -> Readiness<'_> {
        Readiness::Fd(self.socket.as_fd())
    }

    fn arm(&mut self, _waker: &Waker) -> Armed {
        let has_work = !self.send_completions.is_empty()
            || !self.recv_completions.is_empty()
            || !self.pending.is_empty()
            || self.failure.is_some()
            || self.state() != EndpointState::Open;
        if has_work {
            return Armed::Pending;
        }
        self.segment().park_incoming(self.side);
        // Looked at after the request (module invariants); an entry is this lap's only
        // while a receive is posted for it.
        if !self.posted.is_empty() && self.incoming().delivered(self.recvs_reaped).is_some() {
            return Armed::Pending;
        }
        Armed::Parked
    }

    fn disarm(&mut self) {
        self.segment().unpark_incoming(self.side);
        self.check_socket();
    }
}

impl Drop for ShmEndpoint {
    fn drop(&mut self) {
        self.close();
    }
}

#[cfg(test)]
mod tests {
    use tierbuf_pool::{MemoryBudget, SlotPool};

    use super::*;
    use crate::{Provider, ShmProvider};

    /// The resident size, in KiB, of this process's mapping that starts at `base`.
    fn resident_kib(base: usize) -> u64 {
        let smaps = std::fs::read_to_string("/proc/self/smaps").expect("this process's maps");
        let mut lines = smaps.lines();
        while let Some(line) = lines.next() {
            let start = line.split(['-', ' ']).next().unwrap_or_default();
            if usize::from_str_radix(start, 16) != Ok(base) {
                continue;
            }
            let rss = lines
                .find_map(|field| field.strip_prefix("Rss:"))
                .expect("the mapping's resident size");
            return rss
                .trim()
                .trim_end_matches("kB")
                .trim()
                .parse()
                .expect("a size in kB");
        }
        panic!("no mapping starts at {base:#x}");
    }

    /// Sends `count` small messages from `a` to `b`, which keeps `depth` receives posted;
    /// returns the resident size of `a`'s mapping of the segment.
    fn segment_resident_after(depth: u32, count: u32) -> u64 {
        let provider = ShmProvider::new(MemoryBudget::with_cap(1 << 20));
        let pool = SlotPool::new(&*provider.registrar(), 64, depth as usize).expect("a pool");
        let inboxes: Vec<_> = std::iter::from_fn(|| pool.try_acquire_owned()).collect();
        let (mut a, mut b) = provider.pair(depth, depth).expect("a pair");
        for (wr_id, inbox) in (0u64..).zip(&inboxes) {
            // SAFETY: the inbox is read only after its completion, and reposted after.
            unsafe { b.post_recv(BufferRef::from(inbox), wr_id) }.expect("posted");
        }
        let mut completions = [Completion::default(); 8];
        for sent in 0..count {
            let message = sent.to_ne_bytes();
            while !a.try_post_send_copied(&[&message], 0).expect("a send") {
                let ready = b.poll(&mut completions).expect("a poll");
                for completion in &completions[..ready] {
                    let inbox = &inboxes[completion.wr_id as usize];
                    // SAFETY: as above; the message in it was read.
                    unsafe { b.post_recv(BufferRef::from(inbox), completion.wr_id) }
                        .expect("reposted");
                }
            }
            a.poll(&mut completions).expect("a poll");
        }
        resident_kib(a.segment.mapping.base().as_ptr() as usize)
    }

    #[test]
    fn a_post_the_socket_refuses_as_the_peer_closes_is_refused_as_the_close() {
        let provider = ShmProvider::new(MemoryBudget::with_cap(1 << 20));
        let (a, mut b) = provider.pair(4, 4).expect("a pair");
        // The peer's close lands between `b`'s look at the state and its announcement.
        drop(a);
        let pipe = || SocketError::Io {
            operation: "sending a record",
            source: std::io::Error::from_raw_os_error(rustix::io::Errno::PIPE.raw_os_error()),
        };
        assert_eq!(b.refused_by_socket(pipe()), PostError::PeerClosed);
        let mut completions = [Completion::default(); 4];
        assert_eq!(
            b.poll(&mut completions).map_err(|error| error.to_string()),
            Ok(0)
        );
        // A peer gone without closing is a broken connection, and its death the cause.
        let (_a, mut b) = provider.pair(4, 4).expect("a pair");
        assert_eq!(b.refused_by_socket(pipe()), PostError::ConnectionBroken);
        assert!(matches!(
            b.poll(&mut completions),
            Err(TransportError::PeerDied { .. })
        ));
    }

    #[test]
    fn a_shallow_ring_leaves_the_rest_of_its_segment_untouched() {
        let file_kib = std::mem::size_of::<SharedSegment>() / 1024;
        let shallow = segment_resident_after(4, 3000);
        assert!(
            shallow <= 16,
            "{shallow} KiB of a {file_kib} KiB segment resident with rings of 4"
        );
        // The deepest rings go round every entry: the check above can fail.
        let deep = segment_resident_after(RING_CAPACITY as u32, 3000);
        assert!(
            deep >= 128,
            "{deep} KiB of a {file_kib} KiB segment resident with rings of {RING_CAPACITY}"
        );
    }
}
