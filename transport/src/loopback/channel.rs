//! The shared state of a loopback pair: one [`Channel`] per direction and the
//! connection state, and the matching that carries messages from posted sends into
//! posted receives.
//!
//! # Invariants
//!
//! - A channel carries messages from one side (the sender) to the other (the receiver).
//!   Only the sender pushes `sends`, only the receiver pushes `recvs`; both are popped
//!   only by the holder of the channel's `matching` claim. So while the claim is held, a
//!   queue seen non-empty stays non-empty until the holder pops it, and sends and
//!   receives are paired strictly in posting order.
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
//!   its `Parker` (`crate::parker`) and then looks for completions and state; a claim
//!   holder that has pushed completions, or a closer that changed the state, fences
//!   (`SeqCst`) and then wakes both sides' parkers. The parker's invariants make sure no
//!   wake is lost; a spurious one costs the woken side one empty poll.

use std::task::Waker;

use crate::pair_state::{PairState, StateWord};
use crate::parker::Parker;
use crate::provider::{Armed, Completion, CompletionStatus, Opcode};
use crate::sync::{AtomicBool, BoundedQueue, Ordering, fence, yield_now};

use super::HostRegion;
use crate::registry::Resolved;

/// The most buffers in one loopback send's gather list.
pub(crate) const MAX_GATHER: usize = 4;

/// A posted send, checked and holding its regions.
#[derive(Debug)]
pub(crate) struct SendRequest {
    pub(crate) wr_id: u64,
    pub(crate) gather: [Option<Resolved<HostRegion>>; MAX_GATHER],
    /// The sum of the gather buffers' lengths.
    pub(crate) len: u32,
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

    fn complete_send(&self, wr_id: u64, status: CompletionStatus) {
        let completion = Completion {
            wr_id,
            byte_len: 0,
            status,
            opcode: Opcode::Send,
        };
        expect_room(self.send_completions.push(completion).is_ok());
    }

    fn complete_recv(&self, wr_id: u64, byte_len: u32, status: CompletionStatus) {
        let completion = Completion {
            wr_id,
            byte_len,
            status,
            opcode: Opcode::Recv,
        };
        expect_room(self.recv_completions.push(completion).is_ok());
    }

    /// Completes every queued request as flushed. Claim held. Returns whether there was
    /// any.
    fn flush(&self) -> bool {
        let mut flushed = false;
        while let Some(send) = self.sends.pop() {
            self.complete_send(send.wr_id, CompletionStatus::Flushed);
            flushed = true;
        }
        while let Some(recv) = self.recvs.pop() {
            self.complete_recv(recv.wr_id, 0, CompletionStatus::Flushed);
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
            state: StateWord::new(),
            parkers: [Parker::default(), Parker::default()],
        }
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
            let completed = self.run_claimed(channel);
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

    fn has_work(&self, channel: &Channel) -> bool {
        let sends = !channel.sends.is_empty();
        let recvs = !channel.recvs.is_empty();
        (sends && recvs) || ((sends || recvs) && !self.state.is_open())
    }

    /// Pairs sends with receives while the connection is open, then flushes. Claim held.
    /// Returns whether it completed anything.
    fn run_claimed(&self, channel: &Channel) -> bool {
        let mut completed = false;
        loop {
            if !self.state.is_open() {
                return channel.flush() || completed;
            }
            if channel.sends.is_empty() || channel.recvs.is_empty() {
                return completed;
            }
            completed = true;
            // Both queues were seen non-empty and only the claim holder pops them.
            let (Some(send), Some(recv)) = (channel.sends.pop(), channel.recvs.pop()) else {
                unreachable!("a queue seen non-empty by the claim holder emptied");
            };
            let delivery = deliver(&send, &recv);
            if !delivery.send_status.is_success() {
                self.state.break_connection();
            }
            // The receive's completion first: whoever sees the send complete (and closes,
            // say) finds the message's completion queued on the receiving side.
            channel.complete_recv(recv.wr_id, delivery.byte_len, delivery.recv_status);
            channel.complete_send(send.wr_id, delivery.send_status);
        }
    }
}

/// How one send met one receive.
struct Delivery {
    send_status: CompletionStatus,
    recv_status: CompletionStatus,
    byte_len: u32,
}

/// Copies `send`'s message into `recv`'s buffer if it fits and every region is still
/// registered; otherwise writes nothing and says why, as verbs would.
fn deliver(send: &SendRequest, recv: &RecvRequest) -> Delivery {
    let failed = |send_status, recv_status| Delivery {
        send_status,
        recv_status,
        byte_len: 0,
    };
    if send.len > recv.buffer.len {
        return failed(
            CompletionStatus::RemoteInvalidRequest,
            CompletionStatus::LocalLengthError,
        );
    }
    if !send.gather.iter().flatten().all(|s| s.region.is_live()) {
        return failed(
            CompletionStatus::LocalProtectionError,
            CompletionStatus::Flushed,
        );
    }
    if !recv.buffer.region.is_live() {
        return failed(
            CompletionStatus::RemoteOperationError,
            CompletionStatus::LocalProtectionError,
        );
    }
    // SAFETY: `resolve` checked `offset + len <= region length` for every buffer, so the
    // start pointers are in bounds.
    let destination = unsafe { recv.buffer.region.byte_at(recv.buffer.offset) };
    let mut written = 0usize;
    for segment in send.gather.iter().flatten() {
        // SAFETY: both regions are mapped while the requests hold them (registry
        // invariants). The source range lies inside its region (checked when posted) and
        // the destination range `written .. written + segment.len` lies inside the receive
        // buffer, because the segments add up to `send.len <= recv.buffer.len`. The
        // posters promised that nothing else touches the receive buffer and nothing writes
        // the send buffers until the completions are polled or the endpoints closed, and
        // closing waits for this claim. `copy` tolerates overlap should the ranges share
        // bytes regardless.
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
    Delivery {
        send_status: CompletionStatus::Success,
        recv_status: CompletionStatus::Success,
        byte_len: send.len,
    }
}
