//! [`Pair`]: two [`ConnectionCore`]s on simulated provider endpoints and a virtual clock,
//! for the tests in `transport/tests/` and the fuzz target `core_frames` (feature
//! `test-pair`; not an API). Every call that drives a core in them goes through here, so a
//! change of the core's methods is made in this file alone.
//!
//! Each side is a core with a memory budget of its own, its [`User`], and an endpoint that
//! takes each work request as soon as the core hands it out and keeps the verbs rules: a
//! sent frame waits on the wire until the peer has a receive posted and lands in the
//! oldest one, frames leave the wire in sending order, a send completes when its frame
//! lands and a receive with that frame's length. Completions wait, in the order the frames
//! moved, for a step or a [`Pair::pass`] to hand them over. Frames move in [`Pair::step`]
//! ([`Wire::Stepped`]) or as soon as they can, as the loopback provider moves them
//! ([`Wire::AtPost`]). The clock moves only when the test or a step (by `tick`) moves it.
//! A scripted pair ([`Pair::scripted`]) has a core on side 0 only: side 1 is the test,
//! writing any bytes into the core's receives ([`Pair::forge`]) and taking its frames off
//! the wire when it likes ([`Pair::take`]). Hooks: hold (delay) a direction, look at its
//! frames, reorder, drop or change one ([`Pair::hold`], [`Pair::in_flight`],
//! [`Pair::swap_in_flight`], [`Pair::take_at`], [`Pair::edit_in_flight`]), and a journal of
//! a side's work requests ([`Pair::record_posts`]).
//!
//! # Invariants
//!
//! - Every buffer of a work request is a slot its core holds until the pair hands it the
//!   completion naming that request. The pair reads a send slot and writes a receive slot
//!   only before that, and reads a frame in its send slot only while it is on the wire (an
//!   edit changes a copy), so it never touches memory its core has taken back.
//! - No buffer a side posts overlaps another it has outstanding (receives not filled, sends
//!   on the wire), and no frame lands in a receive shorter than itself: both are checked.
//! - A completion handed over in a step or a pass never fails its core unless the test
//!   changed what that side receives (forged, edited, reordered or dropped a frame): such
//!   a failure panics. [`Pair::forge`] and [`Pair::take`] return the core's answer instead.
//! - Every loop that waits for the cores is bounded: [`Pair::run_until_idle`] reports a
//!   [`Stall`] and [`Pair::send`] panics, rather than spinning for ever.

#![doc(hidden)]

use std::collections::VecDeque;
use std::io::IoSlice;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tierbuf_pool::{HostRegistrar, MemoryBudget};
use tierbuf_tiers::Reservoir;

use crate::connection::{
    ConnectionConfig, ConnectionCore, ConnectionError, ConnectionStats, Exposure, Message, Post,
    SendError, Transmit, WorkKind,
};
use crate::{
    Access, BufferRef, CallerCopies, Completion, CompletionStatus, Opcode, PostError, RemoteBuffer,
};

/// How frames move from one side to the other (module documentation).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wire {
    /// Only in [`Pair::step`].
    Stepped,
    /// As soon as they are posted and the peer has a receive for them.
    AtPost,
}

/// What a side's user does with the messages delivered to it, in each step.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Reading {
    /// Copies each into [`User::received`].
    #[default]
    Copies,
    /// Keeps each, holding its receive slot, in [`User::held`].
    Holds,
    /// Leaves them in the core (for [`Pair::try_recv`], or a user busy elsewhere).
    Nothing,
}

/// How a [`Pair::pass`] takes the completions waiting.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Polling {
    /// Polls of up to `batch`, until one comes back short (as `Connection` polls).
    Drain {
        /// The most one poll takes.
        batch: usize,
    },
    /// One completion (a peer on another thread posting its frames one by one).
    One,
}

/// A side's user: what the steps took for it.
#[derive(Debug, Default)]
pub struct User {
    /// What it does with delivered messages.
    pub reading: Reading,
    /// Copies of the messages taken with [`Reading::Copies`], in order.
    pub received: Vec<Vec<u8>>,
    /// The messages taken with [`Reading::Holds`], in order.
    pub held: Vec<Message>,
}

/// A frame on the wire.
#[derive(Debug)]
pub struct Frame {
    /// The send its landing completes.
    send: u64,
    bytes: FrameBytes,
    /// Whether the test made, changed or moved it.
    forged: bool,
}

#[derive(Debug)]
enum FrameBytes {
    /// In its sender's send slot (module invariants).
    Slot(BufferRef),
    /// The pair's own: copied from a caller's message, or edited by the test.
    Owned(Vec<u8>),
}

impl Frame {
    /// The frame's bytes.
    pub fn bytes(&self) -> &[u8] {
        match &self.bytes {
            // SAFETY: this frame, borrowed from the pair, is on the wire, so its core
            // holds its send slot unchanged (module invariants).
            FrameBytes::Slot(slot) => unsafe {
                std::slice::from_raw_parts(slot.addr as *const u8, slot.len as usize)
            },
            FrameBytes::Owned(bytes) => bytes,
        }
    }
}

/// A work request a side's core handed out ([`Pair::record_posts`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Posted {
    /// A receive, with its buffer.
    Recv(BufferRef),
    /// A frame sent, with its bytes.
    Send(Vec<u8>),
}

/// A frame the test put into a receive ([`Pair::forge`]) or took off the wire
/// ([`Pair::take`]), and what the core made of the completion.
#[derive(Debug)]
pub struct Handed {
    /// The frame's bytes: for [`Pair::forge`], those the completion reported, as the
    /// receive slot holds them.
    pub frame: Vec<u8>,
    /// The core's answer to the completion.
    pub result: Result<(), Arc<ConnectionError>>,
}

/// A pair that did not settle within its bound ([`Pair::run_until_idle`]).
#[derive(Debug, Clone)]
pub struct Stall {
    /// The steps taken.
    pub steps: usize,
    /// Each side's counters at the end (`None` for the test's side).
    pub stats: [Option<ConnectionStats>; 2],
}

/// A successful completion of `kind` for request `wr_id`, of `len` bytes.
fn completed(kind: WorkKind, wr_id: u64, len: u32) -> Completion {
    Completion {
        wr_id,
        byte_len: len,
        status: CompletionStatus::Success,
        opcode: match kind {
            WorkKind::Send => Opcode::Send,
            WorkKind::Recv => Opcode::Recv,
            WorkKind::Read => Opcode::Read,
        },
    }
}

/// Keys of the ranges a pair's endpoint exposes start here, each one more, never reused.
const FIRST_EXPOSURE_KEY: u32 = 0xe000_0000;

/// One side's simulated endpoint.
#[derive(Debug, Default)]
struct Endpoint {
    /// Receives posted and not filled, oldest first.
    recvs: VecDeque<(u64, BufferRef)>,
    /// Frames sent and not landed, oldest first.
    wire: VecDeque<Frame>,
    held: bool,
    completions: VecDeque<Completion>,
    /// Ranges exposed to the peer and not revoked, each a range of a region its core holds
    /// until it revokes it (`connection/rendezvous.rs`); keys from [`FIRST_EXPOSURE_KEY`].
    exposed: Vec<RemoteBuffer>,
    /// Exposures made, ever.
    exposures: u32,
    /// Reads posted and not carried out, oldest first: each into a region its core holds
    /// until the read's completion.
    reads: VecDeque<(u64, BufferRef, RemoteBuffer)>,
    /// Work requests taken, ever.
    posts: u64,
    /// Whether the test changed what this side receives.
    tampered: bool,
    journal: Option<Vec<Posted>>,
}

/// The endpoint takes every request; it copies no frame from the caller's memory, so the
/// core offers it none ([`Copier`] does).
impl Transmit for Endpoint {
    fn post(&mut self, post: Post<'_>) -> Result<bool, PostError> {
        match post {
            Post::Recv { wr_id, buffer, .. } => {
                self.assert_apart(&buffer);
                self.posts += 1;
                if let Some(journal) = &mut self.journal {
                    journal.push(Posted::Recv(buffer));
                }
                self.recvs.push_back((wr_id, buffer));
            }
            Post::Send { wr_id, buffer, .. } => {
                self.assert_apart(&buffer);
                self.send(wr_id, FrameBytes::Slot(buffer));
            }
            Post::Read {
                wr_id,
                buffer,
                remote,
                ..
            } => {
                self.assert_apart(&buffer);
                assert_eq!(
                    buffer.len, remote.len,
                    "a read into a buffer of another length"
                );
                self.posts += 1;
                self.reads.push_back((wr_id, buffer, remote));
            }
            other => panic!("{other:?} offered to an endpoint that takes none"),
        }
        Ok(true)
    }

    fn expose(&mut self, exposure: Exposure<'_>) -> Result<RemoteBuffer, PostError> {
        assert_eq!(
            exposure.access(),
            Access::Read,
            "the connection exposes for reading"
        );
        let buffer = exposure.buffer();
        self.assert_apart(&buffer);
        let remote = RemoteBuffer {
            key: FIRST_EXPOSURE_KEY + self.exposures,
            addr: buffer.addr,
            len: buffer.len,
        };
        self.exposures += 1;
        self.exposed.push(remote);
        Ok(remote)
    }

    fn revoke(&mut self, exposed: RemoteBuffer) -> Result<(), PostError> {
        let at = self
            .exposed
            .iter()
            .position(|&remote| remote == exposed)
            .ok_or(PostError::UnknownKey {
                remote_key: exposed.key,
            })?;
        self.exposed.swap_remove(at);
        Ok(())
    }
}

/// An endpoint that copies frames of the lengths `copies` names from the caller's
/// memory, taking each or leaving it to its send slot as `takes` says, frame by frame.
struct Copier<'a, T: FnMut() -> bool> {
    endpoint: &'a mut Endpoint,
    copies: CallerCopies,
    takes: &'a mut T,
}

impl<T: FnMut() -> bool> Transmit for Copier<'_, T> {
    fn post(&mut self, post: Post<'_>) -> Result<bool, PostError> {
        let Post::SendFrom {
            wr_id,
            header,
            payload,
            ..
        } = post
        else {
            return self.endpoint.post(post);
        };
        assert!(
            self.copies.takes(header.len() + payload.len()),
            "a frame offered to be copied at a length not taken"
        );
        if !(self.takes)() {
            return Ok(false);
        }
        self.endpoint
            .send(wr_id, FrameBytes::Owned([header, payload].concat()));
        Ok(true)
    }

    fn takes_from_caller(&self) -> CallerCopies {
        self.copies
    }

    fn expose(&mut self, exposure: Exposure<'_>) -> Result<RemoteBuffer, PostError> {
        self.endpoint.expose(exposure)
    }

    fn revoke(&mut self, exposed: RemoteBuffer) -> Result<(), PostError> {
        self.endpoint.revoke(exposed)
    }
}

impl Endpoint {
    fn send(&mut self, wr_id: u64, bytes: FrameBytes) {
        let frame = Frame {
            send: wr_id,
            bytes,
            forged: false,
        };
        self.posts += 1;
        if let Some(journal) = &mut self.journal {
            journal.push(Posted::Send(frame.bytes().to_vec()));
        }
        self.wire.push_back(frame);
    }

    /// Checks that `buffer` shares no byte with a receive or send outstanding.
    fn assert_apart(&self, buffer: &BufferRef) {
        let sends = self.wire.iter().filter_map(|frame| match &frame.bytes {
            FrameBytes::Slot(slot) => Some(slot),
            FrameBytes::Owned(_) => None,
        });
        for other in self.recvs.iter().map(|(_, recv)| recv).chain(sends) {
            let apart = buffer.addr >= other.addr + u64::from(other.len)
                || other.addr >= buffer.addr + u64::from(buffer.len);
            assert!(apart, "{buffer:?} overlaps {other:?}, outstanding");
        }
    }
}

#[derive(Debug)]
struct Side {
    /// `None` on the test's side of a scripted pair.
    core: Option<ConnectionCore>,
    budget: MemoryBudget,
    endpoint: Endpoint,
}

/// Two connection cores on simulated endpoints and a virtual clock (module
/// documentation). Sides are 0 and 1; a method that needs a core on the test's side of a
/// scripted pair panics.
#[derive(Debug)]
pub struct Pair {
    sides: [Side; 2],
    /// Each side's user.
    pub users: [User; 2],
    /// The time now.
    pub now: Instant,
    /// How far the clock moves in a step (1 ms unless set).
    pub tick: Duration,
    /// How frames move ([`Wire::Stepped`] unless set).
    pub wire: Wire,
    /// Work requests both sides had taken when the last step looked.
    posts_seen: u64,
}

impl Pair {
    /// Two cores of `config`, side `i` registering within `caps[i]` bytes; both users copy
    /// what they receive.
    pub fn new(config: impl Into<Arc<ConnectionConfig>>, caps: [u64; 2]) -> Pair {
        Pair::with_cores(config.into(), caps, [true, true])
    }

    /// One core of `config`, side 0, registering within `cap` bytes, against the test;
    /// its user reads nothing by itself.
    pub fn scripted(config: impl Into<Arc<ConnectionConfig>>, cap: u64) -> Pair {
        let mut pair = Pair::with_cores(config.into(), [cap, 0], [true, false]);
        pair.users[0].reading = Reading::Nothing;
        pair
    }

    fn with_cores(config: Arc<ConnectionConfig>, caps: [u64; 2], cores: [bool; 2]) -> Pair {
        let now = Instant::now();
        let side = |cap: u64, with_core: bool| {
            let budget = MemoryBudget::with_cap(cap);
            let core = with_core.then(|| {
                let registrar = Arc::new(HostRegistrar::new(budget.clone()));
                let reservoir = Arc::new(Reservoir::new(registrar, Arc::clone(config.ladder())));
                ConnectionCore::new(Arc::clone(&config), Arc::clone(&reservoir), reservoir, now)
                    .expect("the core registers its first tier")
            });
            Side {
                core,
                budget,
                endpoint: Endpoint::default(),
            }
        };
        let mut pair = Pair {
            sides: [side(caps[0], cores[0]), side(caps[1], cores[1])],
            users: Default::default(),
            now,
            tick: Duration::from_millis(1),
            wire: Wire::Stepped,
            posts_seen: 0,
        };
        pair.collect(0);
        pair.collect(1);
        pair
    }

    /// `side`'s core, to look at.
    pub fn core(&self, side: usize) -> &ConnectionCore {
        self.sides[side].core.as_ref().expect("a side with a core")
    }

    /// `side`'s counters and state now.
    pub fn stats(&self, side: usize) -> ConnectionStats {
        self.core(side).stats()
    }

    /// The error `side`'s core failed with, if it did.
    pub fn failure(&self, side: usize) -> Option<&Arc<ConnectionError>> {
        self.core(side).failure()
    }

    /// `side`'s memory budget.
    pub fn budget(&self, side: usize) -> &MemoryBudget {
        &self.sides[side].budget
    }

    /// The bytes each side's budget holds now.
    pub fn in_use(&self) -> [u64; 2] {
        self.sides.each_ref().map(|side| side.budget.in_use())
    }

    /// The receives `side` has posted and no frame has filled, oldest first.
    pub fn posted_recvs(&self, side: usize) -> impl ExactSizeIterator<Item = BufferRef> + '_ {
        self.sides[side]
            .endpoint
            .recvs
            .iter()
            .map(|&(_, buffer)| buffer)
    }

    /// Runs `side`'s core with the time now and its endpoint, for a call that posts
    /// through it; then takes the work it left queued.
    fn drive_posting<R>(
        &mut self,
        side: usize,
        run: impl FnOnce(&mut ConnectionCore, Instant, &mut Endpoint) -> R,
    ) -> R {
        let Side {
            core: Some(core),
            endpoint,
            ..
        } = &mut self.sides[side]
        else {
            panic!("side {side} has no core");
        };
        let result = run(core, self.now, endpoint);
        self.collect(side);
        result
    }

    /// Runs `side`'s core with the time now, then takes the work it handed out.
    fn drive<R>(&mut self, side: usize, run: impl FnOnce(&mut ConnectionCore, Instant) -> R) -> R {
        let result = run(
            self.sides[side].core.as_mut().expect("a side with a core"),
            self.now,
        );
        self.collect(side);
        result
    }

    /// Takes the work `side`'s core handed out; with [`Wire::AtPost`], moves what can move.
    fn collect(&mut self, side: usize) {
        if let Side {
            core: Some(core),
            endpoint,
            ..
        } = &mut self.sides[side]
        {
            core.transmit(endpoint);
        }
        if self.wire == Wire::AtPost {
            self.transfer();
        }
    }

    /// Lands every frame that can land, both ways, and carries out every read posted;
    /// returns how many moved.
    fn transfer(&mut self) -> usize {
        let mut moved = 0;
        for from in 0..2 {
            let [a, b] = &mut self.sides;
            let (out, into) = if from == 0 { (a, b) } else { (b, a) };
            let (out, into) = (&mut out.endpoint, &mut into.endpoint);
            while !out.held
                && let Some((wr_id, buffer, remote)) = out.reads.pop_front()
            {
                // A read of a range the peer exposes now, whole, as a provider checks it.
                let inside = into.exposed.iter().any(|exposed| {
                    exposed.key == remote.key
                        && remote.addr >= exposed.addr
                        && remote.addr + u64::from(remote.len)
                            <= exposed.addr + u64::from(exposed.len)
                });
                let mut completion = completed(WorkKind::Read, wr_id, remote.len);
                if inside {
                    // SAFETY: the range lies in a region the peer's core holds, and writes
                    // none of, until it revokes the exposure; the buffer is a region this
                    // side's core holds, untouched, until the completion queued below, as
                    // long as the range.
                    unsafe {
                        std::ptr::copy_nonoverlapping(
                            remote.addr as *const u8,
                            buffer.addr as *mut u8,
                            remote.len as usize,
                        );
                    }
                } else {
                    completion.status = CompletionStatus::RemoteAccessError;
                    completion.byte_len = 0;
                }
                out.completions.push_back(completion);
                moved += 1;
            }
            while !out.held
                && let Some(frame) = out.wire.front()
                && let Some(&(recv_id, recv)) = into.recvs.front()
            {
                let bytes = frame.bytes();
                let len = bytes.len() as u32;
                assert!(
                    len <= recv.len,
                    "a {len}-byte frame overran a {}-byte receive",
                    recv.len
                );
                // SAFETY: the receive is a slot its core holds until the completion queued
                // below, at least `len` bytes long; the frame's bytes are the pair's own or
                // a send slot held the same way, of the other side's budget.
                unsafe {
                    std::ptr::copy_nonoverlapping(
                        bytes.as_ptr(),
                        recv.addr as *mut u8,
                        bytes.len(),
                    );
                }
                let frame = out.wire.pop_front().expect("the frame landed");
                into.recvs.pop_front();
                into.tampered |= frame.forged;
                out.completions
                    .push_back(completed(WorkKind::Send, frame.send, len));
                into.completions
                    .push_back(completed(WorkKind::Recv, recv_id, len));
                moved += 1;
            }
        }
        moved
    }

    /// Hands `side`'s core a completion (module invariants).
    fn complete(&mut self, side: usize, completion: Completion) {
        let result = self.drive(side, |core, now| core.handle_completion(now, &completion));
        if let Err(error) = result
            && !self.sides[side].endpoint.tampered
        {
            panic!(
                "side {side}: a {:?} completion failed the core: {error}",
                completion.opcode
            );
        }
    }

    /// Takes the messages delivered to `side` as its user reads; returns whether any.
    fn read(&mut self, side: usize) -> bool {
        let (Some(core), user) = (&mut self.sides[side].core, &mut self.users[side]) else {
            return false;
        };
        let mut read = false;
        while user.reading != Reading::Nothing
            && let Some(message) = core.try_recv()
        {
            read = true;
            match user.reading {
                Reading::Holds => user.held.push(message),
                _ => user.received.push(message.to_vec()),
            }
        }
        self.collect(side);
        read
    }

    /// Runs `side`'s core's own work ([`ConnectionCore::progress`]).
    pub fn progress(&mut self, side: usize) {
        self.drive_posting(side, |core, now, endpoint| core.progress(now, endpoint));
    }

    /// A progress pass of `side` as `Connection` makes one: progress; the completions
    /// waiting, taken as `polling` says, each followed by progress while the core owes
    /// the peer a credit; progress again if it took any.
    pub fn pass(&mut self, side: usize, polling: Polling) {
        self.progress(side);
        let batch = match polling {
            Polling::Drain { batch } => batch,
            Polling::One => 1,
        };
        let mut taken = 0;
        loop {
            // A poll: what is waiting now; what its handling makes waits for the next.
            let waiting = &mut self.sides[side].endpoint.completions;
            let ready = batch.min(waiting.len());
            let polled: Vec<_> = waiting.drain(..ready).collect();
            taken += ready;
            for completion in polled {
                self.complete(side, completion);
                if self.core(side).owes_credit() {
                    self.progress(side);
                }
            }
            if ready < batch || polling == Polling::One {
                break;
            }
        }
        if taken > 0 {
            self.progress(side);
        }
    }

    /// One step: the clock moves by the tick; each core makes progress; the frames that
    /// can land do; each core takes its completions; each user takes what was delivered.
    /// Returns whether anything moved: a work request posted (since the last step looked),
    /// a frame landed, or a message taken.
    pub fn step(&mut self) -> bool {
        self.now += self.tick;
        for side in 0..2 {
            if self.sides[side].core.is_some() {
                self.progress(side);
            }
        }
        let posts = self.sides[0].endpoint.posts + self.sides[1].endpoint.posts;
        let mut moved = posts > self.posts_seen;
        self.posts_seen = posts;
        moved |= self.transfer() > 0;
        for side in 0..2 {
            while let Some(completion) = self.sides[side].endpoint.completions.pop_front() {
                self.complete(side, completion);
            }
        }
        for side in 0..2 {
            moved |= self.read(side);
        }
        moved
    }

    /// Steps until a step moves nothing and every core is idle; returns the steps taken.
    ///
    /// # Errors
    ///
    /// A [`Stall`] after `max_steps` steps.
    pub fn run_until_idle(&mut self, max_steps: usize) -> Result<usize, Box<Stall>> {
        for steps in 1..=max_steps {
            let idle = |side: &Side| side.core.as_ref().is_none_or(ConnectionCore::is_idle);
            if !self.step() && self.sides.iter().all(idle) {
                return Ok(steps);
            }
        }
        let stats = self
            .sides
            .each_ref()
            .map(|side| side.core.as_ref().map(ConnectionCore::stats));
        Err(Box::new(Stall {
            steps: max_steps,
            stats,
        }))
    }

    /// [`Pair::run_until_idle`] within 10 000 steps, panicking on a stall.
    pub fn settle(&mut self) {
        if let Err(stall) = self.run_until_idle(10_000) {
            panic!("the pair never settled: {stall:?}");
        }
    }

    // The users' calls: the core's, with the time now.

    /// [`ConnectionCore::try_send`].
    pub fn try_send(&mut self, side: usize, parts: &[IoSlice<'_>]) -> Result<(), SendError> {
        self.drive_posting(side, |core, now, endpoint| {
            core.try_send(now, parts, endpoint)
        })
    }

    /// [`ConnectionCore::try_write_vectored`].
    pub fn try_write_vectored(
        &mut self,
        side: usize,
        parts: &[IoSlice<'_>],
    ) -> Result<usize, SendError> {
        self.drive(side, |core, now| core.try_write_vectored(now, parts))
    }

    /// [`ConnectionCore::try_send_batch`].
    pub fn try_send_batch(&mut self, side: usize, messages: &[&[u8]]) -> Result<usize, SendError> {
        self.drive(side, |core, now| core.try_send_batch(now, messages))
    }

    /// [`ConnectionCore::try_send_some`], over an endpoint that copies nothing from the
    /// caller's memory.
    pub fn try_send_some(&mut self, side: usize, rest: &[u8]) -> Result<usize, SendError> {
        self.drive_posting(side, |core, now, endpoint| {
            core.try_send_some(now, rest, endpoint)
        })
    }

    /// [`ConnectionCore::try_send_some`] (or, when `whole`, [`ConnectionCore::try_send`]
    /// of the whole of `rest`), over an endpoint that copies frames of the lengths
    /// `copies` takes from the caller's memory: `takes` says, frame by frame, whether it
    /// took one (its bytes are copied out of the message) or left it to its send slot.
    /// Returns the bytes accepted.
    pub fn try_send_copied(
        &mut self,
        side: usize,
        rest: &[u8],
        copies: CallerCopies,
        takes: &mut impl FnMut() -> bool,
        whole: bool,
    ) -> Result<usize, SendError> {
        self.drive_posting(side, |core, now, endpoint| {
            let mut copier = Copier {
                endpoint,
                copies,
                takes,
            };
            if whole {
                core.try_send(now, &[IoSlice::new(rest)], &mut copier)
                    .map(|()| rest.len())
            } else {
                core.try_send_some(now, rest, &mut copier)
            }
        })
    }

    /// Sends `message` from `side`, stepping until it is wholly accepted (panics if a send
    /// fails or 10 000 steps pass).
    pub fn send(&mut self, side: usize, message: &[u8]) {
        self.send_by(message, |pair, rest| {
            pair.try_send(side, &[IoSlice::new(rest)])
                .map(|()| rest.len())
        });
    }

    /// [`Pair::send`] through [`Pair::try_send_copied`].
    pub fn send_copied(
        &mut self,
        side: usize,
        message: &[u8],
        copies: CallerCopies,
        takes: &mut impl FnMut() -> bool,
        whole: bool,
    ) {
        self.send_by(message, |pair, rest| {
            pair.try_send_copied(side, rest, copies, takes, whole)
        });
    }

    fn send_by(
        &mut self,
        message: &[u8],
        mut offer: impl FnMut(&mut Pair, &[u8]) -> Result<usize, SendError>,
    ) {
        let mut offset = 0;
        for _ in 0..10_000 {
            match offer(self, &message[offset..]) {
                Ok(accepted) if offset + accepted == message.len() => return,
                Ok(accepted) => offset += accepted,
                Err(SendError::WouldBlock(_)) => {}
                Err(other) => panic!("send failed: {other}"),
            }
            self.step();
        }
        panic!("message of {} bytes never accepted", message.len());
    }

    /// [`ConnectionCore::try_reserve`].
    pub fn try_reserve(&mut self, side: usize, len: usize) -> Result<(), SendError> {
        self.drive(side, |core, now| core.try_reserve(now, len))
    }

    /// [`ConnectionCore::reserved_mut`].
    pub fn reserved_mut(&mut self, side: usize) -> Option<&mut [u8]> {
        self.sides[side].core.as_mut()?.reserved_mut()
    }

    /// [`ConnectionCore::commit_reserved`].
    pub fn commit_reserved(&mut self, side: usize) -> Result<usize, SendError> {
        self.drive(side, |core, _| core.commit_reserved())
    }

    /// [`ConnectionCore::cancel_reserved`].
    pub fn cancel_reserved(&mut self, side: usize) {
        self.drive(side, |core, _| core.cancel_reserved());
    }

    /// [`ConnectionCore::try_recv`].
    pub fn try_recv(&mut self, side: usize) -> Option<Message> {
        self.drive(side, |core, _| core.try_recv())
    }

    // Hooks.

    /// Holds `from`'s frames on the wire while `held`: a stalled path, or a peer gone.
    pub fn hold(&mut self, from: usize, held: bool) {
        self.sides[from].endpoint.held = held;
    }

    /// The frames `from` sent that have not landed, oldest first.
    pub fn in_flight(&self, from: usize) -> &VecDeque<Frame> {
        &self.sides[from].endpoint.wire
    }

    /// Swaps two of `from`'s frames on the wire.
    pub fn swap_in_flight(&mut self, from: usize, a: usize, b: usize) {
        let wire = &mut self.sides[from].endpoint.wire;
        wire.swap(a, b);
        wire[a].forged = true;
        wire[b].forged = true;
    }

    /// Changes the bytes of `from`'s frame at `index` (a copy: its send slot is left as
    /// it is); it still completes its send when it lands.
    pub fn edit_in_flight(&mut self, from: usize, index: usize, edit: impl FnOnce(&mut Vec<u8>)) {
        let frame = &mut self.sides[from].endpoint.wire[index];
        let mut bytes = frame.bytes().to_vec();
        edit(&mut bytes);
        frame.bytes = FrameBytes::Owned(bytes);
        frame.forged = true;
    }

    /// Takes `from`'s oldest frame off the wire, as a peer that reads it into no receive:
    /// its send completes at once.
    pub fn take(&mut self, from: usize) -> Option<Handed> {
        self.take_at(from, 0)
    }

    /// [`Pair::take`] of the frame at `index`: a frame dropped in flight.
    pub fn take_at(&mut self, from: usize, index: usize) -> Option<Handed> {
        let frame = self.sides[from].endpoint.wire.remove(index)?;
        self.sides[1 - from].endpoint.tampered = true;
        let bytes = frame.bytes().to_vec();
        let len = bytes.len() as u32;
        let result = self.drive(from, |core, now| {
            core.handle_completion(now, &completed(WorkKind::Send, frame.send, len))
        });
        Some(Handed {
            frame: bytes,
            result,
        })
    }

    /// Writes `bytes`, cut to its length, into `to`'s oldest posted receive and completes
    /// it reporting `reported` bytes (those written when `None`; never more than the
    /// receive holds, as no provider reports more); `None` when no receive is posted.
    pub fn forge(&mut self, to: usize, bytes: &[u8], reported: Option<u32>) -> Option<Handed> {
        let endpoint = &mut self.sides[to].endpoint;
        let (wr_id, buffer) = endpoint.recvs.pop_front()?;
        endpoint.tampered = true;
        let written = bytes.len().min(buffer.len as usize);
        let len = reported.unwrap_or(written as u32).min(buffer.len);
        // SAFETY: the receive is a slot its core holds, untouched by anything else, until
        // the completion below; `written` and `len` are at most its length.
        let frame = unsafe {
            let slot = buffer.addr as *mut u8;
            std::ptr::copy_nonoverlapping(bytes.as_ptr(), slot, written);
            std::slice::from_raw_parts(slot, len as usize).to_vec()
        };
        let result = self.drive(to, |core, now| {
            core.handle_completion(now, &completed(WorkKind::Recv, wr_id, len))
        });
        Some(Handed { frame, result })
    }

    /// Keeps a journal of the work requests `side`'s core hands out from now on.
    pub fn record_posts(&mut self, side: usize) {
        self.sides[side].endpoint.journal = Some(Vec::new());
    }

    /// The work requests `side`'s core handed out since the last call, in order.
    pub fn take_posts(&mut self, side: usize) -> Vec<Posted> {
        self.sides[side]
            .endpoint
            .journal
            .as_mut()
            .map(std::mem::take)
            .unwrap_or_default()
    }
}
