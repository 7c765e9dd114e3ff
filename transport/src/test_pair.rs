//! [`Pair`]: two [`ConnectionCore`]s on simulated provider endpoints and a virtual clock,
//! for the tests in `transport/tests/` and the fuzz target `core_frames` (feature
//! `test-pair`). This is not an API: nothing but those tests enables the feature. Every
//! call that drives a core in them goes through this module, so that a change of the
//! core's methods is made here and nowhere else.
//!
//! # What it simulates
//!
//! Each side is a core, its own memory budget (a `HostRegistrar` and a `Reservoir` of the
//! ladder), its user ([`User`]: what a step does with the messages delivered), and an
//! endpoint that carries out the core's work requests as the verbs rules say:
//!
//! - a work request is taken as soon as the core hands it out;
//! - a sent frame waits on the wire until the peer has a receive posted, and lands in the
//!   oldest one: receives are filled in posting order, frames leave the wire in sending
//!   order (a reliable connection), and a frame longer than its receive is a failed test;
//! - a send completes when its frame lands, a receive with the length of the frame that
//!   landed in it; completions wait in the side's queue, in the order the frames moved,
//!   until a step or a [`Pair::pass`] hands them to the core.
//!
//! How frames move is the pair's [`Wire`]: in `Stepped` (the default) only in
//! [`Pair::step`], after both cores' progress; in `AtPost` as soon as they are posted and
//! the peer has a receive for them, as the loopback provider moves them. Time is the
//! pair's `now`, which moves only when the test moves it ([`Pair::advance`]) or a step
//! does (by the tick, 1 ms unless set).
//!
//! A scripted pair ([`Pair::scripted`]) has a core on side 0 only: side 1 is the test,
//! playing a peer that writes whatever bytes it likes into the core's posted receives
//! ([`Pair::forge`]) and takes the core's frames off the wire when it likes
//! ([`Pair::take`]); it posts no receives, so nothing the core sends lands anywhere.
//!
//! Hooks on the frames in flight: hold a direction ([`Pair::hold`]), delay it
//! ([`Pair::set_latency`]), look at its frames ([`Pair::in_flight`]), reorder them
//! ([`Pair::swap_in_flight`]), drop one ([`Pair::take_at`]: its send completes, nothing
//! lands), change one or add one of the test's own ([`Pair::edit_in_flight`],
//! [`Pair::insert_in_flight`]), and a journal of each side's work requests
//! ([`Pair::record_posts`]).
//!
//! # Invariants
//!
//! - Every buffer of a work request is a slot its core holds until the pair hands it the
//!   completion naming that request. The pair reads a send slot and writes a receive slot
//!   only before handing that completion, and a frame on the wire still in its send slot
//!   is only read while on the wire (a hook that edits it edits a copy), so the pair never
//!   touches memory its core has taken back.
//! - No buffer a side posts overlaps another it has outstanding (receives posted and not
//!   filled, sends on the wire): checked at each post.
//! - A frame never lands in a receive shorter than itself: checked as it lands.
//! - A completion handed over in a step or a pass never fails its core, unless the test
//!   changed what that side receives (a frame forged, edited, reordered or dropped on its
//!   way): a failure there panics, naming it. What [`Pair::forge`] and [`Pair::take`] hand
//!   over is returned to the test instead.
//! - Every loop that waits for the cores is bounded: [`Pair::run_until_idle`] reports a
//!   [`Stall`], and [`Pair::send`] panics, rather than spinning for ever.

#![doc(hidden)]

use std::collections::VecDeque;
use std::fmt;
use std::io::IoSlice;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tierbuf_pool::{HostRegistrar, MemoryBudget};
use tierbuf_tiers::Reservoir;

use crate::connection::{
    ConnectionConfig, ConnectionCore, ConnectionError, ConnectionStats, Message, SendError,
    WorkKind, WorkRequest,
};
use crate::{BufferRef, CallerCopies};

/// Offers a send may make before [`Pair::send`] gives up on it.
const SEND_ATTEMPTS: usize = 10_000;

/// Steps [`Pair::settle`] may take.
const SETTLE_STEPS: usize = 10_000;

/// How frames move from one side to the other.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wire {
    /// Only in [`Pair::step`], after both cores' progress.
    Stepped,
    /// As soon as they are posted and the peer has a receive for them, as the loopback
    /// provider moves them; their completions wait for a [`Pair::pass`] (or a step).
    AtPost,
}

/// What a side's user does with the messages delivered to it, in each step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reading {
    /// Copies each into [`User::received`] and drops it.
    Copies,
    /// Keeps each, holding its receive slot, in [`User::held`].
    Holds,
    /// Leaves them in the core: its user is busy elsewhere, or takes them itself
    /// ([`Pair::try_recv`]).
    Nothing,
}

/// How a [`Pair::pass`] takes the completions waiting.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Polling {
    /// Polls of up to `batch` completions, until one comes back short (as
    /// `Connection` polls an endpoint).
    Drain {
        /// The most completions one poll takes.
        batch: usize,
    },
    /// One completion at most (a peer on another thread posting its frames one by one).
    One,
}

/// A side's user: the messages the steps took for it.
#[derive(Debug)]
pub struct User {
    /// What it does with delivered messages.
    pub reading: Reading,
    /// Copies of the messages taken with [`Reading::Copies`], in order.
    pub received: Vec<Vec<u8>>,
    /// The messages taken with [`Reading::Holds`], in order.
    pub held: Vec<Message>,
}

/// A frame on the wire.
pub struct Frame {
    /// The send it completes when it leaves the wire; `None` for one the test added.
    send: Option<u64>,
    bytes: FrameBytes,
    /// When it may land.
    due: Instant,
    /// Whether the test made, changed or moved it.
    forged: bool,
}

enum FrameBytes {
    /// In its sender's send slot (module invariants).
    Slot(BufferRef),
    /// The pair's own: copied from a caller's message, made or edited by the test.
    Owned(Vec<u8>),
}

impl Frame {
    /// The frame's bytes.
    pub fn bytes(&self) -> &[u8] {
        match &self.bytes {
            // SAFETY: a frame in its send slot is on the wire (this one is borrowed from
            // the pair), and its core holds the slot, unchanged, until the frame leaves
            // the wire (module invariants).
            FrameBytes::Slot(buffer) => unsafe {
                std::slice::from_raw_parts(buffer.addr as *const u8, buffer.len as usize)
            },
            FrameBytes::Owned(bytes) => bytes,
        }
    }
}

impl fmt::Debug for Frame {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Frame")
            .field("send", &self.send)
            .field("len", &self.bytes().len())
            .field("kind", &self.bytes().first())
            .field("forged", &self.forged)
            .finish()
    }
}

/// A work request a side's core handed out ([`Pair::record_posts`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Posted {
    /// A receive posted.
    Recv {
        /// Its work request id.
        wr_id: u64,
        /// The receive buffer.
        buffer: BufferRef,
    },
    /// A frame sent.
    Send {
        /// Its work request id.
        wr_id: u64,
        /// The frame's bytes as posted.
        frame: Vec<u8>,
    },
}

/// What [`Pair::forge`] did.
#[derive(Debug)]
pub struct Landed {
    /// What the core made of the receive's completion.
    pub result: Result<(), Arc<ConnectionError>>,
    /// The bytes the completion reported, as the receive slot held them.
    pub frame: Vec<u8>,
    /// Whether the bytes given were cut to the receive's length.
    pub cut: bool,
}

/// A frame [`Pair::take`] took off the wire.
#[derive(Debug)]
pub struct Taken {
    /// Its bytes.
    pub frame: Vec<u8>,
    /// What its sender made of the send's completion (`Ok` for a frame the test added).
    pub result: Result<(), Arc<ConnectionError>>,
}

/// A pair that did not settle within its bound ([`Pair::run_until_idle`]).
#[derive(Debug, Clone)]
pub struct Stall {
    /// The steps taken.
    pub steps: usize,
    /// Each side's counters at the end (`None` for a scripted side).
    pub stats: [Option<ConnectionStats>; 2],
    /// Frames each side left on the wire.
    pub in_flight: [usize; 2],
    /// Receives each side left posted.
    pub posted: [usize; 2],
}

impl fmt::Display for Stall {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "the pair never settled in {} steps ({:?} frames in flight, {:?} receives \
             posted): {:?} / {:?}",
            self.steps, self.in_flight, self.posted, self.stats[0], self.stats[1]
        )
    }
}

impl std::error::Error for Stall {}

/// A completion waiting to be handed to a core.
#[derive(Debug, Clone, Copy)]
struct Completed {
    kind: WorkKind,
    wr_id: u64,
    len: u32,
}

/// One side's simulated provider endpoint.
#[derive(Debug)]
struct Endpoint {
    /// Receives posted and not filled, oldest first.
    recvs: VecDeque<(u64, BufferRef)>,
    /// Frames sent and not landed, oldest first.
    wire: VecDeque<Frame>,
    /// Whether its frames stay on the wire.
    held: bool,
    /// How long after being posted its frames may land.
    latency: Duration,
    completions: VecDeque<Completed>,
    /// Work requests taken, ever.
    posts: u64,
    /// Whether the test changed what this side receives.
    tampered: bool,
    journal: Option<Vec<Posted>>,
}

impl Endpoint {
    fn new() -> Endpoint {
        Endpoint {
            recvs: VecDeque::new(),
            wire: VecDeque::new(),
            held: false,
            latency: Duration::ZERO,
            completions: VecDeque::new(),
            posts: 0,
            tampered: false,
            journal: None,
        }
    }

    fn post(&mut self, work: WorkRequest, now: Instant) {
        match work {
            WorkRequest::PostRecv { wr_id, buffer } => {
                self.assert_apart(&buffer);
                if let Some(journal) = &mut self.journal {
                    journal.push(Posted::Recv { wr_id, buffer });
                }
                self.posts += 1;
                self.recvs.push_back((wr_id, buffer));
            }
            WorkRequest::PostSend { wr_id, buffer } => {
                self.assert_apart(&buffer);
                self.send(wr_id, FrameBytes::Slot(buffer), now);
            }
            other => panic!("{other:?} outside the call that gave its message"),
        }
    }

    fn send(&mut self, wr_id: u64, bytes: FrameBytes, now: Instant) {
        let frame = Frame {
            send: Some(wr_id),
            bytes,
            due: now + self.latency,
            forged: false,
        };
        if let Some(journal) = &mut self.journal {
            let frame = frame.bytes().to_vec();
            journal.push(Posted::Send { wr_id, frame });
        }
        self.posts += 1;
        self.wire.push_back(frame);
    }

    /// Checks that `buffer` shares no byte with a receive or send outstanding.
    fn assert_apart(&self, buffer: &BufferRef) {
        let overlap = |other: &BufferRef| {
            buffer.addr < other.addr + u64::from(other.len)
                && other.addr < buffer.addr + u64::from(buffer.len)
        };
        let sends = self.wire.iter().filter_map(|frame| match &frame.bytes {
            FrameBytes::Slot(slot) => Some(slot),
            FrameBytes::Owned(_) => None,
        });
        for other in self.recvs.iter().map(|(_, recv)| recv).chain(sends) {
            assert!(
                !overlap(other),
                "{buffer:?} overlaps {other:?}, outstanding"
            );
        }
    }
}

#[derive(Debug)]
struct Side {
    /// `None` on the test's side of a scripted pair.
    core: Option<ConnectionCore>,
    budget: MemoryBudget,
    endpoint: Endpoint,
    user: User,
}

/// Two connection cores on simulated endpoints and a virtual clock (module
/// documentation). Sides are `0` and `1`; every method taking a side panics, naming it,
/// when that side has no core and needs one.
#[derive(Debug)]
pub struct Pair {
    config: Arc<ConnectionConfig>,
    sides: [Side; 2],
    now: Instant,
    tick: Duration,
    wire: Wire,
    /// Work requests both sides had taken when the last step looked.
    posts_seen: u64,
}

impl Pair {
    /// Two cores of `config`, side `i` registering within a budget of `caps[i]` bytes;
    /// each user copies what it receives ([`Reading::Copies`]).
    pub fn new(config: impl Into<Arc<ConnectionConfig>>, caps: [u64; 2]) -> Pair {
        Pair::with_cores(config.into(), caps, [true, true])
    }

    /// One core of `config`, side 0, registering within `cap` bytes, against the test
    /// playing its peer (module documentation). Its user takes nothing by itself.
    pub fn scripted(config: impl Into<Arc<ConnectionConfig>>, cap: u64) -> Pair {
        let mut pair = Pair::with_cores(config.into(), [cap, 0], [true, false]);
        pair.set_reading(0, Reading::Nothing);
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
                endpoint: Endpoint::new(),
                user: User {
                    reading: Reading::Copies,
                    received: Vec::new(),
                    held: Vec::new(),
                },
            }
        };
        let mut pair = Pair {
            sides: [side(caps[0], cores[0]), side(caps[1], cores[1])],
            config,
            now,
            tick: Duration::from_millis(1),
            wire: Wire::Stepped,
            posts_seen: 0,
        };
        pair.collect(0);
        pair.collect(1);
        pair
    }

    // The clock and the settings.

    /// The time now.
    pub fn now(&self) -> Instant {
        self.now
    }

    /// Moves the clock by `by`.
    pub fn advance(&mut self, by: Duration) {
        self.now += by;
    }

    /// Moves the clock to `to`.
    ///
    /// # Panics
    ///
    /// If `to` is before now.
    pub fn advance_to(&mut self, to: Instant) {
        assert!(to >= self.now, "the clock never goes back");
        self.now = to;
    }

    /// Sets how far the clock moves in each step.
    pub fn set_tick(&mut self, tick: Duration) {
        self.tick = tick;
    }

    /// Sets how frames move.
    pub fn set_wire(&mut self, wire: Wire) {
        self.wire = wire;
    }

    /// Sets what `side`'s user does with delivered messages.
    pub fn set_reading(&mut self, side: usize, reading: Reading) {
        self.sides[side].user.reading = reading;
    }

    // What the test reads.

    /// The configuration both cores share.
    pub fn config(&self) -> &Arc<ConnectionConfig> {
        &self.config
    }

    /// `side`'s core, to look at.
    pub fn core(&self, side: usize) -> &ConnectionCore {
        self.sides[side]
            .core
            .as_ref()
            .unwrap_or_else(|| panic!("side {side} is the test's: it has no core"))
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

    /// `side`'s user.
    pub fn user(&self, side: usize) -> &User {
        &self.sides[side].user
    }

    /// `side`'s user, to change.
    pub fn user_mut(&mut self, side: usize) -> &mut User {
        &mut self.sides[side].user
    }

    /// The messages `side`'s user copied ([`Reading::Copies`]), in order.
    pub fn received(&self, side: usize) -> &[Vec<u8>] {
        &self.sides[side].user.received
    }

    /// The receives `side` has posted and no frame has filled, oldest first.
    pub fn posted_recvs(&self, side: usize) -> impl ExactSizeIterator<Item = BufferRef> + '_ {
        self.sides[side]
            .endpoint
            .recvs
            .iter()
            .map(|&(_, buffer)| buffer)
    }

    // Driving the cores.

    /// Runs `side`'s core with the time now, then takes the work it handed out.
    fn drive<R>(&mut self, side: usize, run: impl FnOnce(&mut ConnectionCore, Instant) -> R) -> R {
        let now = self.now;
        let core = self.sides[side]
            .core
            .as_mut()
            .unwrap_or_else(|| panic!("side {side} is the test's: it has no core"));
        let result = run(core, now);
        self.collect(side);
        result
    }

    /// Takes the work `side`'s core handed out; with [`Wire::AtPost`], moves the frames
    /// that can move.
    fn collect(&mut self, side: usize) {
        let now = self.now;
        if let Side {
            core: Some(core),
            endpoint,
            ..
        } = &mut self.sides[side]
        {
            while let Some(work) = core.poll_work() {
                endpoint.post(work, now);
            }
        }
        if self.wire == Wire::AtPost {
            self.transfer();
        }
    }

    /// Moves every frame that can land, both ways; returns how many moved.
    fn transfer(&mut self) -> usize {
        let mut moved = 0;
        for from in 0..2 {
            let [first, second] = &mut self.sides;
            let (sender, receiver) = if from == 0 {
                (first, second)
            } else {
                (second, first)
            };
            if sender.endpoint.held {
                continue;
            }
            while let Some(frame) = sender.endpoint.wire.front()
                && frame.due <= self.now
                && let Some(&(recv_id, recv)) = receiver.endpoint.recvs.front()
            {
                let bytes = frame.bytes();
                let len = bytes.len() as u32;
                assert!(
                    len <= recv.len,
                    "a frame of {len} bytes overran a {}-byte receive",
                    recv.len
                );
                // SAFETY: the receive buffer is a slot its core holds until the completion
                // queued below is handed to it, and at least `len` bytes long; the frame's
                // bytes are the pair's own or its sender's send slot, held the same way
                // while the frame is on the wire (module invariants). They are distinct
                // memory: the receiver's slots are of its own budget.
                unsafe {
                    std::ptr::copy_nonoverlapping(
                        bytes.as_ptr(),
                        recv.addr as *mut u8,
                        bytes.len(),
                    );
                }
                let frame = sender.endpoint.wire.pop_front().expect("the frame landed");
                receiver.endpoint.recvs.pop_front();
                receiver.endpoint.tampered |= frame.forged;
                if let Some(wr_id) = frame.send {
                    sender.endpoint.completions.push_back(Completed {
                        kind: WorkKind::Send,
                        wr_id,
                        len,
                    });
                }
                receiver.endpoint.completions.push_back(Completed {
                    kind: WorkKind::Recv,
                    wr_id: recv_id,
                    len,
                });
                moved += 1;
            }
        }
        moved
    }

    /// Hands `completed` to `side`'s core (module invariants).
    fn complete(&mut self, side: usize, completed: Completed) {
        let Completed { kind, wr_id, len } = completed;
        let result = self.drive(side, |core, now| {
            core.handle_completion(now, kind, wr_id, len)
        });
        if let Err(error) = result
            && !self.sides[side].endpoint.tampered
        {
            panic!("side {side}: a {kind:?} completion failed the core: {error}");
        }
    }

    /// Hands `side`'s core the completions waiting for it, every one.
    fn complete_all(&mut self, side: usize) {
        while let Some(completed) = self.sides[side].endpoint.completions.pop_front() {
            self.complete(side, completed);
        }
    }

    /// Takes the messages delivered to `side` as its user reads them; returns whether it
    /// took any.
    fn read(&mut self, side: usize) -> bool {
        let Side {
            core: Some(core),
            user,
            ..
        } = &mut self.sides[side]
        else {
            return false;
        };
        if user.reading == Reading::Nothing {
            return false;
        }
        let mut read = false;
        while let Some(message) = core.try_recv() {
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
        self.drive(side, |core, now| core.progress(now));
    }

    /// A progress pass of `side` as `Connection` makes one: progress; the completions
    /// waiting, taken as `polling` says, each handed over and followed by progress while
    /// the core owes the peer a credit; progress again if it took any.
    pub fn pass(&mut self, side: usize, polling: Polling) {
        self.progress(side);
        let batch = match polling {
            Polling::Drain { batch } => batch,
            Polling::One => 1,
        };
        let mut taken = 0;
        loop {
            let queue = &mut self.sides[side].endpoint.completions;
            let ready: Vec<Completed> = queue.drain(..batch.min(queue.len())).collect();
            taken += ready.len();
            for completed in &ready {
                self.complete(side, *completed);
                if self.core(side).owes_credit() {
                    self.progress(side);
                }
            }
            if ready.len() < batch || polling == Polling::One {
                break;
            }
        }
        if taken > 0 {
            self.progress(side);
        }
    }

    /// One step: the clock moves by the tick; each core makes progress; the frames that
    /// can land do; each side's core takes its completions; each user takes what was
    /// delivered to it ([`Reading`]). Returns whether anything moved: a work request
    /// posted (since the last step looked), a frame landed, or a message taken.
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
            self.complete_all(side);
        }
        for side in 0..2 {
            moved |= self.read(side);
        }
        moved
    }

    /// Steps until a step moves nothing and every core is idle
    /// ([`ConnectionCore::is_idle`]); returns the steps taken.
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
        Err(Box::new(Stall {
            steps: max_steps,
            stats: self
                .sides
                .each_ref()
                .map(|side| side.core.as_ref().map(ConnectionCore::stats)),
            in_flight: self.sides.each_ref().map(|side| side.endpoint.wire.len()),
            posted: self.sides.each_ref().map(|side| side.endpoint.recvs.len()),
        }))
    }

    /// [`Pair::run_until_idle`] within 10 000 steps.
    ///
    /// # Panics
    ///
    /// On a stall, with its report.
    pub fn settle(&mut self) {
        if let Err(stall) = self.run_until_idle(SETTLE_STEPS) {
            panic!("{stall}");
        }
    }

    // The users' calls.

    /// `side`'s user offers `message` ([`ConnectionCore::try_send`]: the I/O vector's
    /// prefix that fits, or its first element in segments).
    ///
    /// # Errors
    ///
    /// The core's.
    pub fn try_send(&mut self, side: usize, message: &[IoSlice<'_>]) -> Result<usize, SendError> {
        self.drive(side, |core, now| core.try_send(now, message))
    }

    /// `side`'s user offers the I/O vector as one message
    /// ([`ConnectionCore::try_send_gather`]).
    ///
    /// # Errors
    ///
    /// The core's.
    pub fn try_send_gather(
        &mut self,
        side: usize,
        message: &[IoSlice<'_>],
    ) -> Result<usize, SendError> {
        self.drive(side, |core, now| core.try_send_gather(now, message))
    }

    /// `side`'s user offers a batch of messages ([`ConnectionCore::try_send_batch`]);
    /// returns how many were taken.
    ///
    /// # Errors
    ///
    /// The core's.
    pub fn try_send_batch(&mut self, side: usize, messages: &[&[u8]]) -> Result<usize, SendError> {
        self.drive(side, |core, now| core.try_send_batch(now, messages))
    }

    /// `side`'s user offers (the rest of) a message it keeps until it is posted
    /// ([`ConnectionCore::try_send_borrowed`]).
    ///
    /// # Errors
    ///
    /// The core's.
    pub fn try_send_borrowed(&mut self, side: usize, message: &[u8]) -> Result<usize, SendError> {
        self.drive(side, |core, now| core.try_send_borrowed(now, message))
    }

    /// `side`'s user offers `message` over an endpoint that copies frames of the lengths
    /// `copies` takes from the caller's memory ([`ConnectionCore::try_send_copied`]). Each
    /// frame handed out to be copied is settled at once: `takes` says, frame by frame,
    /// whether the endpoint took it (its bytes are copied out of the message) or left it
    /// to be written into its send slot.
    ///
    /// # Errors
    ///
    /// The core's.
    ///
    /// # Panics
    ///
    /// If a frame is handed out at a length `copies` does not take, a frame taken posts
    /// anything more, or one not taken is not posted from its slot.
    pub fn try_send_copied(
        &mut self,
        side: usize,
        message: &[u8],
        copies: CallerCopies,
        takes: &mut impl FnMut() -> bool,
    ) -> Result<usize, SendError> {
        let now = self.now;
        let Side {
            core: Some(core),
            endpoint,
            ..
        } = &mut self.sides[side]
        else {
            panic!("side {side} is the test's: it has no core");
        };
        let accepted = core.try_send_copied(now, message, copies);
        while let Some(work) = core.poll_work() {
            let WorkRequest::PostSendCopied(frame) = work else {
                endpoint.post(work, now);
                continue;
            };
            assert!(
                copies.takes(frame.header.len() + frame.payload(message).len()),
                "a frame handed out to be copied at a length not taken"
            );
            if takes() {
                let settled = core.settle_copied(&frame, message, true);
                assert_eq!(settled, None, "a copied send posts nothing more");
                let bytes = [&frame.header[..], frame.payload(message)].concat();
                endpoint.send(frame.wr_id, FrameBytes::Owned(bytes), now);
            } else {
                let settled = core.settle_copied(&frame, message, false);
                assert!(
                    matches!(settled, Some(WorkRequest::PostSend { wr_id, .. }) if wr_id == frame.wr_id),
                    "a send not copied is posted from its slot: {settled:?}"
                );
                endpoint.post(settled.expect("a send posted from its slot"), now);
            }
        }
        self.collect(side);
        accepted
    }

    /// Sends `message` from `side`, stepping until it is wholly accepted.
    ///
    /// # Panics
    ///
    /// If a send fails, or it is not accepted within 10 000 steps.
    pub fn send(&mut self, side: usize, message: &[u8]) {
        self.send_by(message, |pair, rest| {
            pair.try_send(side, &[IoSlice::new(rest)])
        });
    }

    /// [`Pair::send`] through [`Pair::try_send_copied`].
    ///
    /// # Panics
    ///
    /// As both.
    pub fn send_copied(
        &mut self,
        side: usize,
        message: &[u8],
        copies: CallerCopies,
        takes: &mut impl FnMut() -> bool,
    ) {
        self.send_by(message, |pair, rest| {
            pair.try_send_copied(side, rest, copies, takes)
        });
    }

    /// Offers the rest of `message` with `offer`, stepping until it is wholly accepted.
    fn send_by(
        &mut self,
        message: &[u8],
        mut offer: impl FnMut(&mut Pair, &[u8]) -> Result<usize, SendError>,
    ) {
        let mut offset = 0;
        for _ in 0..SEND_ATTEMPTS {
            match offer(self, &message[offset..]) {
                Ok(accepted) => {
                    offset += accepted;
                    if offset == message.len() {
                        return;
                    }
                }
                Err(SendError::WouldBlock(_)) => {}
                Err(other) => panic!("send failed: {other}"),
            }
            self.step();
        }
        panic!("message of {} bytes never accepted", message.len());
    }

    /// `side`'s user reserves a send slot for a message of `len` bytes
    /// ([`ConnectionCore::try_reserve`]).
    ///
    /// # Errors
    ///
    /// The core's.
    pub fn try_reserve(&mut self, side: usize, len: usize) -> Result<(), SendError> {
        self.drive(side, |core, now| core.try_reserve(now, len))
    }

    /// The reserved message's bytes, to write ([`ConnectionCore::reserved_mut`]).
    pub fn reserved_mut(&mut self, side: usize) -> Option<&mut [u8]> {
        self.sides[side].core.as_mut()?.reserved_mut()
    }

    /// Sends the reserved message ([`ConnectionCore::commit_reserved`]).
    ///
    /// # Errors
    ///
    /// The core's.
    pub fn commit_reserved(&mut self, side: usize) -> Result<usize, SendError> {
        self.drive(side, |core, _| core.commit_reserved())
    }

    /// Gives the reservation up ([`ConnectionCore::cancel_reserved`]).
    pub fn cancel_reserved(&mut self, side: usize) {
        self.drive(side, |core, _| core.cancel_reserved());
    }

    /// The next message delivered to `side` ([`ConnectionCore::try_recv`]).
    pub fn try_recv(&mut self, side: usize) -> Option<Message> {
        self.drive(side, |core, _| core.try_recv())
    }

    // Hooks.

    /// Holds `from`'s frames on the wire while `held`: a stalled path, or a peer gone.
    pub fn hold(&mut self, from: usize, held: bool) {
        self.sides[from].endpoint.held = held;
    }

    /// Delays the frames `from` posts from now on: each lands no sooner than `latency`
    /// after it was posted (and after the frames before it).
    pub fn set_latency(&mut self, from: usize, latency: Duration) {
        self.sides[from].endpoint.latency = latency;
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

    /// Puts a frame of the test's own among `from`'s at `index`: it lands as theirs do,
    /// and completes nothing.
    pub fn insert_in_flight(&mut self, from: usize, index: usize, bytes: Vec<u8>) {
        let frame = Frame {
            send: None,
            bytes: FrameBytes::Owned(bytes),
            due: self.now,
            forged: true,
        };
        self.sides[from].endpoint.wire.insert(index, frame);
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

    /// Takes `from`'s oldest frame off the wire, as a peer that reads it and lands it in
    /// no receive; its send completes at once.
    pub fn take(&mut self, from: usize) -> Option<Taken> {
        self.take_at(from, 0)
    }

    /// [`Pair::take`] of the frame at `index`: a frame dropped in flight.
    pub fn take_at(&mut self, from: usize, index: usize) -> Option<Taken> {
        let frame = self.sides[from].endpoint.wire.remove(index)?;
        self.sides[1 - from].endpoint.tampered = true;
        let bytes = frame.bytes().to_vec();
        let result = match frame.send {
            Some(wr_id) => {
                let len = bytes.len() as u32;
                self.drive(from, |core, now| {
                    core.handle_completion(now, WorkKind::Send, wr_id, len)
                })
            }
            None => Ok(()),
        };
        Some(Taken {
            frame: bytes,
            result,
        })
    }

    /// Writes `bytes` into `to`'s oldest posted receive, cut to its length, and completes
    /// it reporting `reported` bytes (the bytes written when `None`; never more than the
    /// receive holds, as a provider never reports more); `None` when no receive is posted.
    pub fn forge(&mut self, to: usize, bytes: &[u8], reported: Option<u32>) -> Option<Landed> {
        let endpoint = &mut self.sides[to].endpoint;
        let (wr_id, buffer) = endpoint.recvs.pop_front()?;
        endpoint.tampered = true;
        let written = bytes.len().min(buffer.len as usize);
        let len = reported.unwrap_or(written as u32).min(buffer.len);
        // SAFETY: the receive buffer is a slot its core holds, untouched by anything else,
        // until the completion below; `written` and `len` are at most its length, and
        // `bytes` is the test's own memory.
        let frame = unsafe {
            let slot = buffer.addr as *mut u8;
            std::ptr::copy_nonoverlapping(bytes.as_ptr(), slot, written);
            std::slice::from_raw_parts(slot, len as usize).to_vec()
        };
        let result = self.drive(to, |core, now| {
            core.handle_completion(now, WorkKind::Recv, wr_id, len)
        });
        Some(Landed {
            result,
            frame,
            cut: written < bytes.len(),
        })
    }

    /// Keeps a journal of the work requests `side`'s core hands out from now on.
    pub fn record_posts(&mut self, side: usize) {
        self.sides[side].endpoint.journal = Some(Vec::new());
    }

    /// The work requests `side`'s core handed out since the last call, in order (none
    /// unless [`Pair::record_posts`]).
    pub fn take_posts(&mut self, side: usize) -> Vec<Posted> {
        self.sides[side]
            .endpoint
            .journal
            .as_mut()
            .map(std::mem::take)
            .unwrap_or_default()
    }
}
