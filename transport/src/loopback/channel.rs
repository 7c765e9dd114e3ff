//! The shared state of a loopback pair: one [`Channel`] per direction and the
//! connection state, and the matching that carries messages from posted sends into
//! posted receives.
//!
//! # Invariants
//!
//! - A channel carries messages from one side (the sender) to the other (the receiver),
//!   and the sender's one-sided writes and reads of the receiver's exposures, in one
//!   queue with its sends. Only the sender pushes `sends`, only the receiver pushes
//!   `recvs`; both are popped only by the holder of the channel's `matching` claim, which
//!   also alone pushes and pops `held`: the oldest send request, taken off `sends`, that
//!   waits for a receive (a send, or a write with an immediate). So while the claim is
//!   held, a queue seen non-empty stays non-empty until the holder pops it; requests are
//!   carried out strictly in posting order (`held` first), and sends and receives are
//!   paired in posting order. A request that needs no receive is carried out as soon as
//!   the holder reaches it.
//! - Completions are pushed only by the claim holder, in the order requests are paired
//!   or flushed, so each completion queue is in posting order. A pair's receive
//!   completion is pushed before its send completion, so a sender that has seen its send
//!   complete, and closes, leaves the message's completion already queued for the
//!   receiver, ahead of the flushes its close adds. A completion queue is as
//!   deep as its work queue, and an endpoint counts a request outstanding from its post
//!   until its completion is polled, refusing posts past the depth: so queued requests
//!   plus queued completions never pass the depth, and no push can fail.
//! - The claim is taken with a compare-and-swap and released with a store; both, the
//!   queue pushes and emptiness checks (crossbeam's are `SeqCst`) and the state word are
//!   sequentially consistent. A poster pushes, then tries the claim; a holder releases,
//!   then checks for work. In the single order of these operations either the poster's
//!   claim comes after the release (and it does the work itself) or its push comes before
//!   the holder's check (and the holder goes round again). So work is never stranded
//!   between a failed claim and a release: nobody ever waits for the claim on the data
//!   path, and nothing posted is left unmatched while both sides keep calling in.
//! - Once the state leaves `OPEN` it never returns, no request is paired again, and every
//!   claim holder flushes what it finds. Closing waits for each claim in turn (never
//!   holding two), so when it returns no copy involving its buffers is in progress.
//! - A queued request holds strong references to the regions it names, so the memory a
//!   copy touches is mapped for the whole copy (see `registry`).
//! - A parked side is woken by the next completion for it: a side about to sleep arms
//!   its `Parker` (`connection::readiness`) and then looks for completions and state; a claim
//!   holder that has pushed completions, or a closer that changed the state, fences
//!   (`SeqCst`) and then wakes both sides' parkers. The parker's invariants make sure no
//!   wake is lost; a spurious one costs the woken side one empty poll.

use std::sync::OnceLock;
use std::task::Waker;

use crate::connection::readiness::Parker;
use crate::exposure::{Access, ExposureTable};
use crate::pair_state::{PairState, StateWord};
use crate::provider::{Armed, Completion, CompletionStatus, Opcode, RemoteBuffer};
use crate::sync::{AtomicBool, BoundedQueue, Ordering, fence, yield_now};

use super::HostRegion;
use crate::registry::Resolved;

/// The most buffers in one loopback send's gather list.
pub(crate) const MAX_GATHER: usize = 4;

/// A request of the send queue, checked and holding its regions: a send, or a one-sided
/// write from the gather list or read into its first buffer.
#[derive(Debug)]
pub(crate) struct SendRequest {
    pub(crate) wr_id: u64,
    pub(crate) gather: [Option<Resolved<HostRegion>>; MAX_GATHER],
    /// The sum of the gather buffers' lengths.
    pub(crate) len: u32,
    pub(crate) work: Work,
}

/// What a request of the send queue does.
#[derive(Debug)]
pub(crate) enum Work {
    /// Sends the gather list into the peer's oldest receive.
    Send,
    /// Writes the gather list into the peer's exposed `remote`, then, with `imm`,
    /// completes the peer's oldest receive with it.
    Write {
        remote: RemoteBuffer,
        imm: Option<u32>,
        /// The region `remote` lay in when posted, looked up by the poster (so the memory
        /// stays mapped); the exposure is checked again when the write is carried out.
        target: Option<Resolved<HostRegion>>,
    },
    /// Reads the peer's exposed `remote` into the first gather buffer.
    Read {
        remote: RemoteBuffer,
        target: Option<Resolved<HostRegion>>,
    },
}

impl Work {
    /// Whether the request consumes a receive of the peer's.
    fn needs_recv(&self) -> bool {
        match self {
            Work::Send => true,
            Work::Write { imm, .. } => imm.is_some(),
            Work::Read { .. } => false,
        }
    }

    fn opcode(&self) -> Opcode {
        match self {
            Work::Send => Opcode::Send,
            Work::Write { .. } => Opcode::Write,
            Work::Read { .. } => Opcode::Read,
        }
    }
}

/// A posted receive, checked and holding its region.
#[derive(Debug)]
pub(crate) struct RecvRequest {
    pub(crate) wr_id: u64,
    pub(crate) buffer: Resolved<HostRegion>,
}

/// One direction of a pair.
#[derive(Debug)]
pub(crate) struct Channel {
    sends: BoundedQueue<SendRequest>,
    /// The oldest request taken off `sends` that waits for a receive; at most one.
    held: BoundedQueue<SendRequest>,
    recvs: BoundedQueue<RecvRequest>,
    send_completions: BoundedQueue<Completion>,
    recv_completions: BoundedQueue<Completion>,
    /// Held while pairing or flushing this channel's queues.
    matching: AtomicBool,
}

impl Channel {
    fn new(send_depth: u32, recv_depth: u32) -> Channel {
        Channel {
            sends: BoundedQueue::new(send_depth as usize),
            held: BoundedQueue::new(1),
            recvs: BoundedQueue::new(recv_depth as usize),
            send_completions: BoundedQueue::new(send_depth as usize),
            recv_completions: BoundedQueue::new(recv_depth as usize),
            matching: AtomicBool::new(false),
        }
    }

    fn try_claim(&self) -> bool {
        self.matching
            .compare_exchange(false, true, Ordering::SeqCst, Ordering::SeqCst)
            .is_ok()
    }

    fn release(&self) {
        self.matching.store(false, Ordering::SeqCst);
    }

    /// Queues a send. The caller has counted it outstanding within its depth.
    pub(crate) fn push_send(&self, request: SendRequest) {
        expect_room(self.sends.push(request).is_ok());
    }

    /// Queues a receive. The caller has counted it outstanding within its depth.
    pub(crate) fn push_recv(&self, request: RecvRequest) {
        expect_room(self.recvs.push(request).is_ok());
    }

    /// Takes the oldest completion of this channel's sends.
    pub(crate) fn pop_send_completion(&self) -> Option<Completion> {
        self.send_completions.pop()
    }

    /// Takes the oldest completion of this channel's receives.
    pub(crate) fn pop_recv_completion(&self) -> Option<Completion> {
        self.recv_completions.pop()
    }

    fn complete_send(&self, wr_id: u64, opcode: Opcode, byte_len: u32, status: CompletionStatus) {
        let completion = Completion {
            wr_id,
            byte_len,
            status,
            opcode,
        };
        expect_room(self.send_completions.push(completion).is_ok());
    }

    fn complete_recv(&self, wr_id: u64, opcode: Opcode, byte_len: u32, status: CompletionStatus) {
        let completion = Completion {
            wr_id,
            byte_len,
            status,
            opcode,
        };
        expect_room(self.recv_completions.push(completion).is_ok());
    }

    /// Completes every queued request as flushed. Claim held. Returns whether there was
    /// any.
    fn flush(&self) -> bool {
        let mut flushed = false;
        while let Some(send) = self.held.pop().or_else(|| self.sends.pop()) {
            let opcode = send.work.opcode();
            self.complete_send(send.wr_id, opcode, 0, CompletionStatus::Flushed);
            flushed = true;
        }
        while let Some(recv) = self.recvs.pop() {
            self.complete_recv(recv.wr_id, Opcode::Recv, 0, CompletionStatus::Flushed);
            flushed = true;
        }
        flushed
    }
}

/// A queue push that the depth accounting guarantees to have room (see the invariants).
fn expect_room(pushed: bool) {
    assert!(
        pushed,
        "loopback queue overflow: outstanding requests passed the queue depth"
    );
}

/// The state two loopback endpoints share.
#[derive(Debug)]
pub(crate) struct PairShared {
    /// `channels[side]` carries messages from `side` to the other side.
    channels: [Channel; 2],
    /// `exposures[side]`: the ranges `side` exposed to the other side; made at its first
    /// exposure, so that a pair that never exposes anything carries no table.
    exposures: [OnceLock<Box<ExposureTable>>; 2],
    state: StateWord,
    parkers: [Parker; 2],
}

impl PairShared {
    pub(crate) fn new(send_depth: u32, recv_depth: u32) -> PairShared {
        PairShared {
            channels: [
                Channel::new(send_depth, recv_depth),
                Channel::new(send_depth, recv_depth),
            ],
            exposures: [OnceLock::new(), OnceLock::new()],
            state: StateWord::new(),
            parkers: [Parker::default(), Parker::default()],
        }
    }

    /// The ranges `side` exposed to the other side, if it ever exposed any.
    pub(crate) fn exposures(&self, side: usize) -> Option<&ExposureTable> {
        self.exposures[side].get().map(|table| &**table)
    }

    /// The table of `side`'s exposures, made now if it had none (`side`'s own call).
    pub(crate) fn own_exposures(&self, side: usize) -> &ExposureTable {
        self.exposures[side].get_or_init(|| Box::new(ExposureTable::default()))
    }

    /// Asks for `waker` to be woken at the next completion for `side` or change of state
    /// (module invariants); [`Armed::Pending`] if there is something for it already.
    pub(crate) fn arm(&self, side: usize, waker: &Waker) -> Armed {
        self.parkers[side].arm(waker);
        let (outgoing, incoming) = (&self.channels[side], &self.channels[1 - side]);
        let pending = !outgoing.send_completions.is_empty()
            || !incoming.recv_completions.is_empty()
            || self.has_work(outgoing)
            || self.has_work(incoming)
            || !self.state.is_open();
        if pending {
            Armed::Pending
        } else {
            Armed::Parked
        }
    }

    /// Withdraws `side`'s request to be woken.
    pub(crate) fn disarm(&self, side: usize) {
        self.parkers[side].disarm();
    }

    /// Wakes whichever side parked, after completions were pushed or the state changed.
    fn wake_parked(&self) {
        fence(Ordering::SeqCst);
        self.parkers[0].wake();
        self.parkers[1].wake();
    }

    /// The channel carrying messages from `side`.
    pub(crate) fn channel(&self, side: usize) -> &Channel {
        &self.channels[side]
    }

    pub(crate) fn state(&self) -> PairState {
        self.state.load()
    }

    /// Pairs and copies what the channel from `side` holds, or flushes it once the
    /// connection is down; returns at once if another thread holds the claim (that thread
    /// then sees this caller's work, see the invariants).
    pub(crate) fn progress(&self, side: usize) {
        self.drive(side, false);
    }

    /// [`PairShared::progress`] for a poll: tries the claim only if the channel has work
    /// now, so that a thread polling an idle channel only reads it (trying the claim
    /// takes its cache line from a thread copying on the other side). Work that arrives
    /// after the look is matched by its poster, who tries the claim after pushing, or by
    /// the holder's look after releasing (module invariants).
    pub(crate) fn poll_progress(&self, side: usize) {
        if self.has_work(&self.channels[side]) {
            self.drive(side, false);
        }
    }

    /// Closes the connection on behalf of `side` and flushes both channels, waiting for
    /// a copy in progress to finish.
    pub(crate) fn close(&self, side: usize) {
        self.state.close(side);
        self.drive(0, true);
        self.drive(1, true);
        self.wake_parked();
    }

    fn drive(&self, side: usize, wait_for_claim: bool) {
        let channel = &self.channels[side];
        let mut wait = wait_for_claim;
        loop {
            if !channel.try_claim() {
                if !wait {
                    return;
                }
                yield_now();
                continue;
            }
            let completed = self.run_claimed(side);
            channel.release();
            if completed {
                self.wake_parked();
            }
            wait = false;
            #[cfg(loom)]
            if tierbuf_pool::sync::planted::is_planted(
                tierbuf_pool::sync::planted::Bug::LoopbackNoRecheckAfterRelease,
            ) {
                return;
            }
            if !self.has_work(channel) {
                return;
            }
        }
    }

    /// Whether the claim holder of `channel` has something to do: a request waiting for a
    /// receive and one there, or a request not yet looked at (it is carried out, or held
    /// for a receive), or anything to flush once the connection is down.
    fn has_work(&self, channel: &Channel) -> bool {
        let held = !channel.held.is_empty();
        let sends = !channel.sends.is_empty();
        let recvs = !channel.recvs.is_empty();
        if !self.state.is_open() {
            return held || sends || recvs;
        }
        if held { recvs } else { sends }
    }

    /// Carries out the requests of the channel from `side` in order while the connection
    /// is open, pairing those that need a receive with the receives; then flushes. Claim
    /// held. Returns whether it completed anything.
    fn run_claimed(&self, side: usize) -> bool {
        let channel = &self.channels[side];
        let mut completed = false;
        loop {
            if !self.state.is_open() {
                return channel.flush() || completed;
            }
            let Some(request) = channel.held.pop().or_else(|| channel.sends.pop()) else {
                return completed;
            };
            let recv = if request.work.needs_recv() {
                let Some(recv) = channel.recvs.pop() else {
                    // `held` was just emptied (or was empty), and only the holder fills it.
                    expect_room(channel.held.push(request).is_ok());
                    return completed;
                };
                Some(recv)
            } else {
                None
            };
            completed = true;
            let peer_exposures = self.exposures(1 - side);
            let outcome = match (&request.work, &recv) {
                (
                    Work::Write {
                        remote,
                        imm,
                        target,
                    },
                    _,
                ) => {
                    let written = access(
                        peer_exposures,
                        &request,
                        *remote,
                        Access::Write,
                        target.as_ref(),
                        // SAFETY: `at` starts `request.len` bytes (the remote range's
                        // length, checked when posted) inside the target region, exposed
                        // to this side for writing and marked accessed, so its owner
                        // neither reads them nor takes them back meanwhile.
                        |at| unsafe { copy_gather(&request, at) },
                    );
                    Delivery::of_one_sided(
                        written,
                        request.len,
                        Opcode::Write,
                        imm.map(Opcode::RecvWithImm),
                    )
                }
                (Work::Read { remote, target }, _) => {
                    let read = access(
                        peer_exposures,
                        &request,
                        *remote,
                        Access::Read,
                        target.as_ref(),
                        // SAFETY: as for a write: `at` starts `request.len` bytes exposed
                        // for reading, which its owner does not write while exposed.
                        |at| unsafe { copy_from(&request, at) },
                    );
                    Delivery::of_one_sided(read, request.len, Opcode::Read, None)
                }
                (Work::Send, Some(recv)) => deliver(&request, recv),
                (Work::Send, None) => unreachable!("a send is carried out with a receive"),
            };
            if !outcome.send_status.is_success() {
                self.state.break_connection();
            }
            // The receive's completion first: whoever sees the send complete (and closes,
            // say) finds the message's completion queued on the receiving side.
            if let Some(recv) = recv {
                channel.complete_recv(
                    recv.wr_id,
                    outcome.recv_opcode,
                    outcome.byte_len,
                    outcome.recv_status,
                );
            }
            channel.complete_send(
                request.wr_id,
                request.work.opcode(),
                outcome.send_byte_len,
                outcome.send_status,
            );
        }
    }
}

/// How one request of the send queue ended, and the receive it consumed if any.
struct Delivery {
    send_status: CompletionStatus,
    /// The byte count of the request's own completion (a read's bytes).
    send_byte_len: u32,
    recv_status: CompletionStatus,
    recv_opcode: Opcode,
    /// The byte count of the receive's completion.
    byte_len: u32,
}

impl Delivery {
    fn failed(send_status: CompletionStatus, recv_status: CompletionStatus) -> Delivery {
        Delivery {
            send_status,
            send_byte_len: 0,
            recv_status,
            recv_opcode: Opcode::Recv,
            byte_len: 0,
        }
    }

    /// The end of a one-sided write or read of `len` bytes: `done` says whether it was
    /// carried out, or why not; a write with an immediate completes the receive it
    /// consumed as `recv_opcode`, with the bytes written, or flushes it when the write
    /// failed (the connection breaks).
    fn of_one_sided(
        done: Result<(), CompletionStatus>,
        len: u32,
        opcode: Opcode,
        recv_opcode: Option<Opcode>,
    ) -> Delivery {
        match done {
            Ok(()) => Delivery {
                send_status: CompletionStatus::Success,
                send_byte_len: if opcode == Opcode::Read { len } else { 0 },
                recv_status: CompletionStatus::Success,
                recv_opcode: recv_opcode.unwrap_or(Opcode::Recv),
                byte_len: len,
            },
            Err(status) => Delivery::failed(status, CompletionStatus::Flushed),
        }
    }
}

/// Carries out a one-sided access of `remote` in `table` (the peer's exposures): marks
/// the exposure accessed if its key is in force for `access`, checks that `remote` lies
/// inside it and inside `target` (the region the poster found it in), and calls `copy`
/// with the address of `remote`'s first byte; then ends the access. Touches nothing and
/// says why when a check fails: the key, the bounds ([`CompletionStatus::RemoteAccessError`]),
/// or a local region deregistered meanwhile ([`CompletionStatus::LocalProtectionError`]).
fn access(
    table: Option<&ExposureTable>,
    request: &SendRequest,
    remote: RemoteBuffer,
    access: Access,
    target: Option<&Resolved<HostRegion>>,
    copy: impl FnOnce(std::ptr::NonNull<u8>),
) -> Result<(), CompletionStatus> {
    if !request.gather.iter().flatten().all(|s| s.region.is_live()) {
        return Err(CompletionStatus::LocalProtectionError);
    }
    let Some(table) = table else {
        return Err(CompletionStatus::RemoteAccessError);
    };
    let Ok(window) = table.begin_access(remote.key, access) else {
        return Err(CompletionStatus::RemoteAccessError);
    };
    let inside = |target: &Resolved<HostRegion>| {
        let region_key = target.region.region().keys().remote_key;
        window.region_key == region_key
            && window
                .offset_of(remote.addr, u64::from(remote.len))
                .is_some()
            && target.region.is_live()
    };
    let outcome = match target.filter(|target| inside(target)) {
        Some(target) => {
            // SAFETY: `resolve` checked `offset + len <= region length`.
            copy(unsafe { target.region.byte_at(target.offset) });
            Ok(())
        }
        None => Err(CompletionStatus::RemoteAccessError),
    };
    table.end_access(remote.key);
    outcome
}

/// Copies `request`'s gather list, in order, to `destination`.
///
/// # Safety
///
/// `destination` is valid for writes of `request.len` bytes that nothing else reads or
/// writes meanwhile (or only through `ptr::copy`'s tolerance of overlap).
unsafe fn copy_gather(request: &SendRequest, destination: std::ptr::NonNull<u8>) {
    let mut written = 0usize;
    for segment in request.gather.iter().flatten() {
        // SAFETY: both regions are mapped while the request holds them (registry
        // invariants); the source range lies inside its region (checked when posted) and
        // the destination range inside what the caller vouched for, because the segments
        // add up to `request.len`. The poster promised not to write the source until the
        // completion. `copy` tolerates overlap should the ranges share bytes regardless.
        unsafe {
            let source = segment.region.byte_at(segment.offset);
            std::ptr::copy(
                source.as_ptr(),
                destination.as_ptr().add(written),
                segment.len as usize,
            );
        }
        written += segment.len as usize;
    }
}

/// Copies `request.len` bytes from `source` into `request`'s first buffer (a read's).
///
/// # Safety
///
/// `source` is valid for reads of `request.len` bytes that nothing writes meanwhile.
unsafe fn copy_from(request: &SendRequest, source: std::ptr::NonNull<u8>) {
    if let Some(buffer) = request.gather.iter().flatten().next() {
        // SAFETY: the buffer lies inside its region, mapped while the request holds it,
        // and is `request.len` bytes long (checked when posted); the poster promised it to
        // the provider until the completion; the caller vouches for the source.
        unsafe {
            std::ptr::copy(
                source.as_ptr(),
                buffer.region.byte_at(buffer.offset).as_ptr(),
                request.len as usize,
            );
        }
    }
}

/// Copies `send`'s message into `recv`'s buffer if it fits and every region is still
/// registered; otherwise writes nothing and says why, as verbs would.
fn deliver(send: &SendRequest, recv: &RecvRequest) -> Delivery {
    if send.len > recv.buffer.len {
        return Delivery::failed(
            CompletionStatus::RemoteInvalidRequest,
            CompletionStatus::LocalLengthError,
        );
    }
    if !send.gather.iter().flatten().all(|s| s.region.is_live()) {
        return Delivery::failed(
            CompletionStatus::LocalProtectionError,
            CompletionStatus::Flushed,
        );
    }
    if !recv.buffer.region.is_live() {
        return Delivery::failed(
            CompletionStatus::RemoteOperationError,
            CompletionStatus::LocalProtectionError,
        );
    }
    // SAFETY: `resolve` checked `offset + len <= region length` for the receive buffer,
    // so the start pointer is in bounds, and `send.len <= recv.buffer.len`: the range is
    // the receive's, which its poster promised to the provider until its completion, and
    // closing waits for this claim.
    unsafe { copy_gather(send, recv.buffer.region.byte_at(recv.buffer.offset)) };
    Delivery {
        send_status: CompletionStatus::Success,
        send_byte_len: 0,
        recv_status: CompletionStatus::Success,
        recv_opcode: Opcode::Recv,
        byte_len: send.len,
    }
}
