//! [`Connection`]: a [`ConnectionCore`] driven over a provider [`Endpoint`].
//!
//! # Invariants
//!
//! - Every buffer posted to the endpoint is a slot the core holds in its `posted` or
//!   `sending` table until the completion that names it has been handed back to the core;
//!   the core writes a send slot only before posting it and reads a receive slot only
//!   after its completion. That is the contract `Endpoint::post_recv` and
//!   `Endpoint::post_send` ask of their callers.
//! - The core's work goes to the endpoint through [`ConnectionCore::transmit`] (or the
//!   sends that post before they return), after every call that may queue some: what the
//!   endpoint refuses for a full queue stays queued, in order, in the core; anything else
//!   it refuses fails the connection (`transmit.rs`).
//! - A failure is reported only after the completions the endpoint held when it was
//!   found have been taken: a pass that finds one (a post the closed peer refused, a
//!   flushed receive) polls the endpoint again, so the frames that landed ahead of the
//!   peer's close are delivered before the close is reported, however the endpoint split
//!   its completions between polls.
//! - A completion with an error status is handed to the core as any other; a flush after
//!   the peer's close fails the connection as [`ConnectionError::PeerClosed`] first.

use std::fmt;
use std::io::IoSlice;
use std::ops::{Deref, DerefMut};
use std::sync::Arc;
use std::task::Waker;
use std::time::Instant;

use super::core::{ConnectionCore, ConnectionStats};
use super::errors::{ConfigError, ConnectionError, SendError, WouldBlock};
use super::header::HEADER_LEN;
use super::readiness::{Expired, Pace, Parkable, Waiter};
use super::receive::Message;
use super::reserve::FilledOutcome;
use super::senders::{Front, Held, Queued, SendQueue, Sender};
use crate::error::QueueKind;
use crate::provider::{Armed, Completion, CompletionStatus, Endpoint, EndpointState, Readiness};

/// Completions taken from the endpoint per poll.
const POLL_BATCH: usize = 32;

/// One side of a connection over a provider endpoint.
///
/// It makes progress whenever its owner calls [`Connection::progress`] or one of the
/// blocking calls ([`Connection::send`], [`Connection::recv`], [`Connection::flush`] and
/// their `_deadline` forms), which poll back to back for a few hundred microseconds, then
/// sleep until the endpoint wakes them ([`Endpoint::arm`]), a timer of the connection
/// falls due, or the deadline passes (once a sleep has lasted longer than that, the next
/// waits sleep at once, until a sleep ends soon again); or, kept in a
/// [`ConnectionTable`](super::ConnectionTable), whenever its progress thread or
/// [`ConnectionTable::wait_ready`](super::ConnectionTable::wait_ready) reaches it.
pub struct Connection<E: Endpoint> {
    core: ConnectionCore,
    endpoint: E,
    completions: [Completion; POLL_BATCH],
    /// The last time read from the clock, passed to the core where it does not read it
    /// ([`ConnectionCore::needs_clock`]).
    last_now: Instant,
    /// The queue of this connection's [`Sender`]s, once it has one.
    senders: Option<Arc<SendQueue<Queued>>>,
    /// What it took off its senders' queue and has not posted yet.
    held: Held,
    /// What its waits remember between them (`readiness`, module invariants).
    pace: Pace,
}

impl<E: Endpoint> Connection<E> {
    /// Drives `core` over `endpoint`, posting the core's first receives at once. A failure
    /// of that first progress (a peer already gone) fails the connection, and its first
    /// call reports it as a [`ConnectionError`].
    ///
    /// # Errors
    ///
    /// [`ConfigError::QueueTooShallow`] when either of the endpoint's queues is shallower
    /// than the ladder needs (`ConnectionConfig::queue_depth`).
    pub fn new(core: ConnectionCore, endpoint: E) -> Result<Connection<E>, ConfigError> {
        let needed = core.config().queue_depth();
        let limits = endpoint.limits();
        for (queue, depth) in [
            (QueueKind::Send, limits.send_depth),
            (QueueKind::Recv, limits.recv_depth),
        ] {
            if depth < needed {
                return Err(ConfigError::QueueTooShallow {
                    queue,
                    depth,
                    needed,
                });
            }
        }
        let mut connection = Connection {
            core,
            endpoint,
            completions: [Completion::default(); POLL_BATCH],
            last_now: Instant::now(),
            senders: None,
            held: Held::default(),
            pace: Pace::new(),
        };
        // A failure stays with the core: the connection's next call reports it.
        let _ = connection.progress();
        Ok(connection)
    }

    /// Posts pending work, takes every completion ready, and runs the core's own work.
    pub fn progress(&mut self) -> Result<(), Arc<ConnectionError>> {
        self.progress_counted().map(drop)
    }

    /// [`Connection::progress`], telling how much it did: completions taken plus work
    /// requests posted. Zero means the connection had nothing to do.
    pub(crate) fn progress_counted(&mut self) -> Result<usize, Arc<ConnectionError>> {
        let now = Instant::now();
        self.last_now = now;
        let was_failed = self.core.failure().is_some();
        let (taken, posted) = self.take_completions(now);
        // One pass of the core's own work, after the completions: it reposts what they
        // and the messages given back since the last pass freed, and sends what is owed.
        let mut done = taken + posted + self.core.progress(now, &mut self.endpoint);
        if self.senders.is_some() {
            done += self.post_queued(now);
        }
        // A failure found in this pass may have come before completions the endpoint
        // still holds (module invariants).
        if !was_failed && self.core.failure().is_some() {
            done += self.take_completions(now).0;
        }
        self.pace.progressed(done);
        match self.core.failure() {
            Some(error) => Err(Arc::clone(error)),
            None => Ok(done),
        }
    }

    /// Takes every completion the endpoint has ready and hands each to the core; returns
    /// how many it took and how many work requests it posted meanwhile.
    fn take_completions(&mut self, now: Instant) -> (usize, usize) {
        let (mut taken, mut posted) = (0, 0);
        loop {
            let ready = match self.endpoint.poll(&mut self.completions) {
                Ok(ready) => ready,
                Err(error) => {
                    self.core.fail(ConnectionError::of_transport(error));
                    break;
                }
            };
            taken += ready;
            for index in 0..ready {
                let completion = &self.completions[index];
                // A flush after the peer's close is the close: said before the core
                // names the completion's status (module invariants).
                if completion.status == CompletionStatus::Flushed
                    && self.endpoint.state() == EndpointState::PeerClosed
                {
                    self.core.fail(ConnectionError::PeerClosed);
                }
                // A failure is recorded in the core and reported by the caller.
                let _ = self.core.handle_completion(now, completion);
                // Receives reposted while reassembling a large message are granted back
                // at once, not after the whole batch: the peer goes on sending while this
                // side copies.
                if completion.opcode.queue() == QueueKind::Recv
                    && completion.status.is_success()
                    && self.core.owes_credit()
                {
                    posted += self.core.progress(now, &mut self.endpoint);
                }
            }
            if ready < POLL_BATCH {
                break;
            }
        }
        (taken, posted)
    }

    /// Posts the work the core has queued, while the endpoint takes it; returns how many
    /// requests were posted.
    fn post_work(&mut self) -> usize {
        self.core.transmit(&mut self.endpoint)
    }

    /// Sends `message` without blocking: all of it is accepted as one message, or none of
    /// it ([`SendError::WouldBlock`] says why, and nothing was sent). Accepted, it is on
    /// its way: whole, or, if it does not fit the tier in force, copied and sent in
    /// segments by this connection's progress while a larger tier is asked for. It is
    /// delivered, or a later call reports the connection's failure.
    ///
    /// ```
    /// use tierbuf_transport::Transport;
    /// use tierbuf_transport::connection::SendError;
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let node = Transport::loopback().ladder_preset("rpc").budget_bytes(16 << 20).build()?;
    /// let listener = node.listen("try")?;
    /// let mut a = node.connect("try")?;
    /// let mut b = listener.accept()?;
    /// // `b` does not read: `a` sends until its credits run out, and is told so.
    /// let refused = loop {
    ///     if let Err(error) = a.try_send(b"ping") {
    ///         break error;
    ///     }
    /// };
    /// assert!(matches!(refused, SendError::WouldBlock(_)), "{refused:?}");
    /// assert_eq!(&b.recv()?[..], b"ping");
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// [`SendError::WouldBlock`]; [`SendError::TooLong`]; [`SendError::Failed`], also
    /// when posting what was taken failed (the peer closed, say), so nothing accepted is
    /// lost silently. A failure found after every frame of the message was posted (a
    /// frame behind it refused) leaves the message sent: the next call reports it.
    pub fn try_send(&mut self, message: &[u8]) -> Result<(), SendError> {
        self.try_send_gather(&[IoSlice::new(message)])
    }

    /// [`Connection::try_send`] of one message given in parts, as one message whatever
    /// its parts: all of it, or nothing.
    ///
    /// # Errors
    ///
    /// As [`Connection::try_send`].
    pub fn try_send_gather(&mut self, parts: &[IoSlice<'_>]) -> Result<(), SendError> {
        let total = parts.iter().map(|part| part.len()).sum();
        let now = self.clock_for(total);
        let accepted = self.core.try_send(now, parts, &mut self.endpoint);
        self.posted(accepted)
    }

    /// Writes an I/O vector as a byte stream writes, without blocking, by the prefix rule
    /// of [`ConnectionCore::try_write_vectored`]: returns the bytes of the leading
    /// elements taken as one message (a [`ByteStream`](super::ByteStream)'s vectored
    /// write).
    #[cfg(all(feature = "tokio", not(loom)))]
    pub(super) fn try_write_vectored(&mut self, parts: &[IoSlice<'_>]) -> Result<usize, SendError> {
        let total = parts.iter().map(|part| part.len()).sum();
        let now = self.clock_for(total);
        let accepted = self.core.try_write_vectored(now, parts);
        self.post_work();
        self.posted(accepted)
    }

    /// Offers several messages at once without blocking, each to arrive as a message of
    /// its own; returns how many of them, from the first, were taken. Small messages given
    /// together share frames ([`ConnectionCore::try_send_batch`]), so the peer takes many
    /// for the price of one receive: for a stream of small messages, hand over what is at
    /// hand in one call rather than one call each.
    ///
    /// ```
    /// # use std::sync::Arc;
    /// # use std::time::Instant;
    /// # use tierbuf_pool::MemoryBudget;
    /// # use tierbuf_tiers::{Reservoir, ladder::TierLadder};
    /// # use tierbuf_transport::connection::{Connection, ConnectionConfig, ConnectionCore};
    /// # use tierbuf_transport::{LoopbackProvider, Provider};
    /// # let provider = LoopbackProvider::new(MemoryBudget::with_cap(64 << 20));
    /// # let config = Arc::new(ConnectionConfig::new(Arc::new(TierLadder::preset("two-tier")?))?);
    /// # let reservoir = Arc::new(Reservoir::new(provider.registrar(), Arc::clone(config.ladder())));
    /// # let (a, b) = provider.pair(config.queue_depth(), config.queue_depth())?;
    /// # let connect = |endpoint| {
    /// #     let core = ConnectionCore::new(
    /// #         Arc::clone(&config), Arc::clone(&reservoir), Arc::clone(&reservoir), Instant::now(),
    /// #     )?;
    /// #     Ok::<_, Box<dyn std::error::Error>>(Connection::new(core, endpoint)?)
    /// # };
    /// # let (mut a, mut b) = (connect(a)?, connect(b)?);
    /// let batch: [&[u8]; 3] = [b"one", b"two", b"three"];
    /// let taken = a.try_send_batch(&batch)?;
    /// assert_eq!(taken, 3);
    /// assert_eq!(a.stats().frames_sent, 1, "one frame carried all three");
    /// for expected in batch {
    ///     assert_eq!(&b.recv()?[..], expected);
    /// }
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Errors
    ///
    /// As [`Connection::try_send`], for the first message; an error met after it is the
    /// next call's to report.
    pub fn try_send_batch(&mut self, messages: &[&[u8]]) -> Result<usize, SendError> {
        // As long as the largest need it may plan: its longest message, or all of them in
        // one packed run.
        let need = messages
            .iter()
            .map(|message| super::packed::entry_len(message.len()))
            .sum();
        let now = self.clock_for(need);
        let accepted = self.core.try_send_batch(now, messages);
        self.post_work();
        self.posted(accepted)
    }

    /// Sends every one of `messages`, each as a message of its own, making progress until
    /// all are taken ([`Connection::try_send_batch`]). Lengths are checked first: one past
    /// [`ConnectionConfig::max_message_len`](super::ConnectionConfig::max_message_len)
    /// fails the call before anything is sent.
    ///
    /// # Errors
    ///
    /// [`SendError::TooLong`] before anything is sent; [`SendError::Failed`] when the
    /// connection fails, after which nothing more can be sent on it (the messages taken
    /// before the failure were posted, and each reaches the peer or is lost with it).
    pub fn send_batch(&mut self, messages: &[&[u8]]) -> Result<(), SendError> {
        self.check_batch_lengths(messages)?;
        let mut waiter = Waiter::new(None);
        let mut sent = 0;
        while sent < messages.len() {
            match self.try_send_batch(&messages[sent..]) {
                Ok(taken) => {
                    sent += taken;
                    waiter.reset();
                }
                Err(SendError::WouldBlock(reason)) => self
                    .wait(&mut waiter)
                    .map_err(|Expired| SendError::TimedOut(reason))?,
                Err(other) => return Err(other),
            }
            if sent < messages.len() {
                self.progress().map_err(SendError::Failed)?;
            }
        }
        Ok(())
    }

    /// [`SendError::TooLong`] for the first of `messages` past the configured maximum.
    pub(crate) fn check_batch_lengths(&self, messages: &[&[u8]]) -> Result<(), SendError> {
        let max = self.core.config().max_message_len();
        match messages.iter().find(|message| message.len() as u64 > max) {
            Some(long) => Err(SendError::TooLong {
                len: long.len() as u64,
                max,
            }),
            None => Ok(()),
        }
    }

    /// Sends one message given in parts, as one message whatever its parts, making
    /// progress until it is taken. It is copied if it has to be segmented.
    ///
    /// # Errors
    ///
    /// As [`Connection::send`].
    pub fn send_gather(&mut self, parts: &[IoSlice<'_>]) -> Result<(), SendError> {
        self.send_gather_until(parts, None)
    }

    /// [`Connection::send_gather`], giving up at `deadline` with
    /// [`SendError::TimedOut`]; nothing of the message was sent then.
    ///
    /// # Errors
    ///
    /// As [`Connection::send`].
    pub fn send_gather_deadline(
        &mut self,
        parts: &[IoSlice<'_>],
        deadline: Instant,
    ) -> Result<(), SendError> {
        self.send_gather_until(parts, Some(deadline))
    }

    fn send_gather_until(
        &mut self,
        parts: &[IoSlice<'_>],
        deadline: Option<Instant>,
    ) -> Result<(), SendError> {
        let mut waiter = Waiter::new(deadline);
        loop {
            match self.try_send_gather(parts) {
                Ok(()) => return Ok(()),
                Err(SendError::WouldBlock(reason)) => self
                    .wait(&mut waiter)
                    .map_err(|Expired| SendError::TimedOut(reason))?,
                Err(other) => return Err(other),
            }
            self.progress().map_err(SendError::Failed)?;
        }
    }

    /// Waits before the next pass (module `wait`), up to the core's next timer at most.
    fn wait(&mut self, waiter: &mut Waiter) -> Result<(), Expired> {
        waiter.wait(self)
    }

    /// `accepted`, unless posting the work failed the connection before all of the
    /// message was posted: then the failure, so a send whose frames could not be posted is
    /// never reported as sent. A failure found behind the message (its promotion request
    /// or a credit frame refused because the peer, having taken the message, hung up) is
    /// the next call's to report: the message is on its way.
    fn posted<T>(&self, accepted: Result<T, SendError>) -> Result<T, SendError> {
        let accepted = accepted?;
        match self.core.failure() {
            // A failure from before this call refused the message (`accepted` was its
            // error), so this call's posting found this one: it lost the message only if
            // data was taken back unposted, or a segmented rest is left.
            Some(error) if self.core.lost_data() || self.core.has_unsent_message() => {
                Err(SendError::Failed(Arc::clone(error)))
            }
            _ => Ok(accepted),
        }
    }

    /// Sends `message` whole, making progress until it is posted (through promotion or
    /// segments). It is then on its way; [`Connection::flush`] waits for it to leave. A
    /// segmented message is posted straight from `message`
    /// ([`ConnectionCore::try_send_some`]), not copied to the heap first as
    /// [`Connection::try_send`] must. Over an endpoint that copies from the caller's
    /// memory (`Endpoint::caller_copies`, the shared-memory provider), each frame of a
    /// length it takes that way, for which the peer has a receive posted, is copied by
    /// the provider straight from `message` ([`ConnectionCore::try_send_some`]), so this
    /// side makes no copy of its own; any other frame is written into a send slot and
    /// posted as usual.
    pub fn send(&mut self, message: &[u8]) -> Result<(), SendError> {
        self.send_until(message, None)
    }

    /// [`Connection::send`], giving up at `deadline`. Before the first byte of `message`
    /// is posted that is [`SendError::TimedOut`], and nothing was sent. After it, the
    /// message cannot be taken back and the peer would wait for its rest for ever: the
    /// connection fails with [`ConnectionError::AbandonedMidMessage`] (the peer took no
    /// more of it within the deadline), and that is the error.
    ///
    /// ```
    /// use std::time::{Duration, Instant};
    /// # use std::sync::Arc;
    /// # use tierbuf_pool::MemoryBudget;
    /// # use tierbuf_tiers::{Reservoir, ladder::TierLadder};
    /// # use tierbuf_transport::connection::{Connection, ConnectionConfig, ConnectionCore, SendError};
    /// # use tierbuf_transport::{LoopbackProvider, Provider};
    /// # let provider = LoopbackProvider::new(MemoryBudget::with_cap(64 << 20));
    /// # let config = Arc::new(ConnectionConfig::new(Arc::new(TierLadder::preset("two-tier")?))?);
    /// # let reservoir = Arc::new(Reservoir::new(provider.registrar(), Arc::clone(config.ladder())));
    /// # let (a, b) = provider.pair(config.queue_depth(), config.queue_depth())?;
    /// # let connect = |endpoint| {
    /// #     let core = ConnectionCore::new(
    /// #         Arc::clone(&config), Arc::clone(&reservoir), Arc::clone(&reservoir), Instant::now(),
    /// #     )?;
    /// #     Ok::<_, Box<dyn std::error::Error>>(Connection::new(core, endpoint)?)
    /// # };
    /// # let (mut a, mut b) = (connect(a)?, connect(b)?);
    /// // `b` never reads: `a` sends until its credits run out, then the deadline passes.
    /// let deadline = Instant::now() + Duration::from_millis(20);
    /// let outcome = loop {
    ///     if let Err(error) = a.send_deadline(b"ping", deadline) {
    ///         break error;
    ///     }
    /// };
    /// assert!(matches!(outcome, SendError::TimedOut(_)), "{outcome:?}");
    /// assert!(b.recv_deadline(Instant::now())?.is_some(), "what was sent is there");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Errors
    ///
    /// As [`Connection::send`], and [`SendError::TimedOut`].
    pub fn send_deadline(&mut self, message: &[u8], deadline: Instant) -> Result<(), SendError> {
        self.send_until(message, Some(deadline))
    }

    fn send_until(&mut self, message: &[u8], deadline: Option<Instant>) -> Result<(), SendError> {
        let mut waiter = Waiter::new(deadline);
        let mut offset = 0;
        loop {
            match self.try_send_some(&message[offset..]) {
                Ok(accepted) => {
                    offset += accepted;
                    if offset == message.len() {
                        return Ok(());
                    }
                    waiter.reset();
                }
                Err(SendError::WouldBlock(reason)) => {
                    if self.wait(&mut waiter).is_err() {
                        return Err(self.abandon(reason, offset, message.len()));
                    }
                }
                Err(other) => return Err(other),
            }
            self.progress().map_err(SendError::Failed)?;
        }
    }

    /// Offers a message without blocking, as one step of [`Connection::send`]: returns
    /// how many of its leading bytes were posted (through promotion or segments, copied
    /// as `send` copies them). Unless that is all of them, call it again with the rest of
    /// the same message, and nothing else, until it is: a segmented message is on its
    /// way, and the peer waits for its rest. This is the step `send` (and the async
    /// connection's send) makes between its waits: it resumes a message where
    /// [`Connection::try_send`] takes it whole or not at all.
    ///
    /// # Errors
    ///
    /// As [`Connection::try_send`]; [`SendError::NotTheRest`] for bytes that are not the
    /// rest of a message begun.
    pub(crate) fn try_send_some(&mut self, rest: &[u8]) -> Result<usize, SendError> {
        let now = self.clock_for(rest.len());
        let accepted = self.core.try_send_some(now, rest, &mut self.endpoint);
        self.posted(accepted)
    }

    /// The error of a send whose deadline passed with `sent` bytes of its `len` posted
    /// ([`Connection::send_deadline`]): a message the core took on and posted nothing of
    /// is withdrawn; one begun fails the connection.
    fn abandon(&mut self, reason: WouldBlock, sent: usize, len: usize) -> SendError {
        match self.abandon_message(len) {
            None => SendError::TimedOut(reason),
            Some(error) => {
                debug_assert!(sent > 0);
                SendError::Failed(error)
            }
        }
    }

    /// Gives up a message of `len` bytes offered by [`Connection::try_send_some`] and not
    /// all taken: withdrawn if none of it was posted (`None`); otherwise the connection
    /// fails with [`ConnectionError::AbandonedMidMessage`], returned, since the peer
    /// would wait for the rest for ever.
    pub(crate) fn abandon_message(&mut self, len: usize) -> Option<Arc<ConnectionError>> {
        match self.core.withdraw_unsent() {
            None | Some(0) => None,
            Some(sent) => Some(Arc::clone(
                self.core
                    .fail(ConnectionError::AbandonedMidMessage { sent, len }),
            )),
        }
    }

    /// Reserves a registered send buffer for a message of `len` bytes that the caller
    /// builds in place, without blocking; sending it ([`SendBuffer::send`]) then copies
    /// nothing on this side. Fails as [`ConnectionCore::try_reserve`] does: the message
    /// must fit one frame of the top tier, and a larger tier is asked for and reported as
    /// [`WouldBlock::PromotionPending`](super::WouldBlock::PromotionPending).
    ///
    /// ```
    /// use std::sync::Arc;
    /// use std::time::Instant;
    /// use tierbuf_pool::MemoryBudget;
    /// use tierbuf_tiers::{Reservoir, ladder::TierLadder};
    /// use tierbuf_transport::connection::{Connection, ConnectionConfig, ConnectionCore};
    /// use tierbuf_transport::{LoopbackProvider, Provider};
    ///
    /// let provider = LoopbackProvider::new(MemoryBudget::with_cap(64 << 20));
    /// let config = Arc::new(ConnectionConfig::new(Arc::new(TierLadder::preset("two-tier")?))?);
    /// let reservoir = Arc::new(Reservoir::new(provider.registrar(), Arc::clone(config.ladder())));
    /// let (a, b) = provider.pair(config.queue_depth(), config.queue_depth())?;
    /// let connect = |endpoint| {
    ///     let core = ConnectionCore::new(
    ///         Arc::clone(&config), Arc::clone(&reservoir), Arc::clone(&reservoir), Instant::now(),
    ///     )?;
    ///     Ok::<_, Box<dyn std::error::Error>>(Connection::new(core, endpoint)?)
    /// };
    /// let (mut a, mut b) = (connect(a)?, connect(b)?);
    ///
    /// let mut buffer = a.reserve(5)?;
    /// buffer.copy_from_slice(b"hello");
    /// buffer.send()?;
    /// assert_eq!(&b.recv()?[..], b"hello");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn try_reserve(&mut self, len: usize) -> Result<SendBuffer<'_, E>, SendError> {
        let now = self.clock_for(len);
        self.core.try_reserve(now, len)?;
        Ok(SendBuffer { connection: self })
    }

    /// [`Connection::try_reserve`], making progress until a buffer is free (through a
    /// promotion if the message needs one). A promotion the peer refused (or this side's
    /// budget could not follow) is reported, not waited out:
    /// [`WouldBlock::PromotionRefused`](super::WouldBlock::PromotionRefused); send such a
    /// message with [`Connection::send`], which segments it.
    pub fn reserve(&mut self, len: usize) -> Result<SendBuffer<'_, E>, SendError> {
        self.reserve_until(len, None)
    }

    /// [`Connection::reserve`], giving up at `deadline` with [`SendError::TimedOut`].
    ///
    /// # Errors
    ///
    /// As [`Connection::reserve`].
    pub fn reserve_deadline(
        &mut self,
        len: usize,
        deadline: Instant,
    ) -> Result<SendBuffer<'_, E>, SendError> {
        self.reserve_until(len, Some(deadline))
    }

    fn reserve_until(
        &mut self,
        len: usize,
        deadline: Option<Instant>,
    ) -> Result<SendBuffer<'_, E>, SendError> {
        let mut waiter = Waiter::new(deadline);
        loop {
            let now = self.clock_for(len);
            match self.core.try_reserve(now, len) {
                Ok(()) => return Ok(SendBuffer { connection: self }),
                Err(
                    error @ SendError::WouldBlock(
                        WouldBlock::PromotionRefused | WouldBlock::AlreadyReserved,
                    ),
                ) => return Err(error),
                Err(SendError::WouldBlock(reason)) => self
                    .wait(&mut waiter)
                    .map_err(|Expired| SendError::TimedOut(reason))?,
                Err(other) => return Err(other),
            }
            self.progress().map_err(SendError::Failed)?;
        }
    }

    /// The time for the core's send of `len` bytes: the clock's, or the last read when
    /// the core does not read it.
    fn clock_for(&mut self, len: usize) -> Instant {
        if self.core.needs_clock(len) {
            self.last_now = Instant::now();
        }
        self.last_now
    }

    /// The next delivered message, if one has arrived; makes progress first. Messages
    /// delivered before the connection failed are still returned, then the failure.
    pub fn try_recv(&mut self) -> Result<Option<Message>, Arc<ConnectionError>> {
        if let Some(message) = self.core.try_recv() {
            return Ok(Some(message));
        }
        let progressed = self.progress();
        // Messages that arrived before a failure (a peer that sent, then closed) are
        // still handed out; the failure is reported once none is left.
        match self.core.try_recv() {
            Some(message) => Ok(Some(message)),
            None => progressed.map(|()| None),
        }
    }

    /// The next delivered message, if one has arrived, without making progress: for a
    /// connection that a [`ConnectionTable`](super::ConnectionTable)'s progress thread
    /// drives, where taking a message should not also do the thread's work. See
    /// [`ConnectionTable`](super::ConnectionTable) for an example.
    pub fn next_delivered(&mut self) -> Option<Message> {
        self.core.try_recv()
    }

    /// Waits for the next message.
    pub fn recv(&mut self) -> Result<Message, Arc<ConnectionError>> {
        let mut waiter = Waiter::new(None);
        loop {
            if let Some(message) = self.try_recv()? {
                return Ok(message);
            }
            let Ok(()) = self.wait(&mut waiter) else {
                unreachable!("a wait without a deadline does not expire")
            };
        }
    }

    /// Waits for the next message until `deadline`: `Ok(None)` if none came by then.
    ///
    /// ```
    /// use std::time::{Duration, Instant};
    /// # use std::sync::Arc;
    /// # use tierbuf_pool::MemoryBudget;
    /// # use tierbuf_tiers::{Reservoir, ladder::TierLadder};
    /// # use tierbuf_transport::connection::{Connection, ConnectionConfig, ConnectionCore};
    /// # use tierbuf_transport::{LoopbackProvider, Provider};
    /// # let provider = LoopbackProvider::new(MemoryBudget::with_cap(64 << 20));
    /// # let config = Arc::new(ConnectionConfig::new(Arc::new(TierLadder::preset("two-tier")?))?);
    /// # let reservoir = Arc::new(Reservoir::new(provider.registrar(), Arc::clone(config.ladder())));
    /// # let (a, b) = provider.pair(config.queue_depth(), config.queue_depth())?;
    /// # let connect = |endpoint| {
    /// #     let core = ConnectionCore::new(
    /// #         Arc::clone(&config), Arc::clone(&reservoir), Arc::clone(&reservoir), Instant::now(),
    /// #     )?;
    /// #     Ok::<_, Box<dyn std::error::Error>>(Connection::new(core, endpoint)?)
    /// # };
    /// # let (mut a, mut b) = (connect(a)?, connect(b)?);
    /// let soon = Instant::now() + Duration::from_millis(5);
    /// assert!(b.recv_deadline(soon)?.is_none(), "nothing was sent");
    /// a.send(b"hello")?;
    /// let message = b.recv_deadline(Instant::now() + Duration::from_secs(5))?;
    /// assert_eq!(&message.expect("sent")[..], b"hello");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Errors
    ///
    /// As [`Connection::recv`].
    pub fn recv_deadline(
        &mut self,
        deadline: Instant,
    ) -> Result<Option<Message>, Arc<ConnectionError>> {
        let mut waiter = Waiter::new(Some(deadline));
        loop {
            if let Some(message) = self.try_recv()? {
                return Ok(Some(message));
            }
            if self.wait(&mut waiter).is_err() {
                return Ok(None);
            }
        }
    }

    /// Waits until everything accepted has been posted and every send has completed,
    /// the messages this connection's [`Sender`]s queued before the call included.
    ///
    /// # Errors
    ///
    /// The connection's failure, unless everything accepted reached the peer before it:
    /// a peer that took every message and then closed leaves nothing to report.
    pub fn flush(&mut self) -> Result<(), Arc<ConnectionError>> {
        let Ok(()) = self.flush_until(None)? else {
            unreachable!("a wait without a deadline does not expire")
        };
        Ok(())
    }

    /// [`Connection::flush`] until `deadline`: `Ok(false)` if sends were still
    /// outstanding then.
    ///
    /// # Errors
    ///
    /// As [`Connection::flush`].
    pub fn flush_deadline(&mut self, deadline: Instant) -> Result<bool, Arc<ConnectionError>> {
        Ok(self.flush_until(Some(deadline))?.is_ok())
    }

    fn flush_until(
        &mut self,
        deadline: Option<Instant>,
    ) -> Result<Result<(), Expired>, Arc<ConnectionError>> {
        // What the senders queued before this call; not what they go on queueing, which
        // would keep a send in flight, and the flush from ending, for as long as they do.
        let senders_accepted = self.senders_accepted();
        self.held.take_up_to(Some(senders_accepted));
        let flushed = self.flush_since(senders_accepted, deadline);
        self.held.take_up_to(None);
        flushed
    }

    /// [`Connection::flush_until`], once the senders' messages it waits for are counted.
    fn flush_since(
        &mut self,
        senders_accepted: u64,
        deadline: Option<Instant>,
    ) -> Result<Result<(), Expired>, Arc<ConnectionError>> {
        let mut waiter = Waiter::new(deadline);
        while !self.is_flushed_since(senders_accepted) {
            let progressed = self.progress();
            // The pass may have completed the last send (also the one that found a
            // failure): looked at before the wait, which may sleep until an event that
            // then never comes.
            if self.is_flushed_since(senders_accepted) {
                break;
            }
            progressed?;
            if let Err(expired) = self.wait(&mut waiter) {
                return Ok(Err(expired));
            }
        }
        Ok(Ok(()))
    }

    /// A handle that sends on this connection from another thread; see [`Sender`]. Its
    /// messages are posted by whichever thread drives this connection, at its next
    /// progress (a blocking call or a wait of this connection wakes for them); small
    /// messages that were queued together by then share packed frames, as
    /// [`Connection::try_send_batch`] sends them.
    pub fn sender(&mut self) -> Sender {
        let limit = self.core.config().queue_depth() as usize;
        let queue = self
            .senders
            .get_or_insert_with(|| Arc::new(SendQueue::new(limit)));
        let queue = Arc::clone(queue);
        let slots = self.core.share_send_slots();
        let ladder = self.core.config().ladder();
        let max_message_len = self.core.config().max_message_len();
        Sender::new(
            queue,
            slots,
            ladder.tiers().iter().map(|t| t.slot_count()),
            max_message_len,
        )
    }

    /// Posts what the senders queued, in order, while the core takes it; returns how
    /// many messages were taken. A run of small messages held together goes out in packed
    /// frames (`senders.rs`, module invariants).
    fn post_queued(&mut self, now: Instant) -> usize {
        let Some(queue) = self.senders.take() else {
            return 0;
        };
        let mut taken = 0;
        loop {
            self.held.refill(&queue);
            let run = self.held.small_run(|len| !self.core.needs_clock(len));
            if run >= 2 {
                let oldest = self.held.oldest();
                match self.core.try_send_batch(now, &oldest[..run]) {
                    Ok(count) => {
                        self.held.copied(count, &queue);
                        taken += count;
                        if count < run {
                            break;
                        }
                        continue;
                    }
                    // The oldest may still go alone, from its own slot.
                    Err(SendError::WouldBlock(_)) => {}
                    Err(_) => break,
                }
            }
            let Some(front) = self.held.take(&queue) else {
                break;
            };
            match front {
                Front::Filled { slot, len } => match self.core.try_post_filled(now, slot, len) {
                    FilledOutcome::Posted => taken += 1,
                    FilledOutcome::Blocked(slot) => {
                        self.held.put_back(Front::Filled { slot, len }, &queue);
                        break;
                    }
                    FilledOutcome::NotOneFrame(slot) => {
                        let bytes = slot[HEADER_LEN..HEADER_LEN + len].to_vec();
                        self.held.put_back(Front::Owned { bytes, sent: 0 }, &queue);
                    }
                    FilledOutcome::Failed => break,
                },
                // Sent as `send` sends: through a promotion, or segmented while none comes.
                Front::Owned { bytes, mut sent } => match self.try_send_some(&bytes[sent..]) {
                    Ok(accepted) => {
                        sent += accepted;
                        if sent < bytes.len() {
                            self.held.put_back(Front::Owned { bytes, sent }, &queue);
                            break;
                        }
                        taken += 1;
                    }
                    Err(SendError::WouldBlock(_)) => {
                        self.held.put_back(Front::Owned { bytes, sent }, &queue);
                        break;
                    }
                    Err(_) => break,
                },
            }
        }
        if taken > 0 {
            self.post_work();
            queue.made_room();
        }
        if let Some(failure) = self.core.failure() {
            queue.close(Arc::clone(failure));
        }
        self.senders = Some(queue);
        taken
    }

    /// Whether everything accepted through this connection's own calls has been posted
    /// and every send has completed, none that carried message bytes with an error:
    /// everything accepted reached the peer. What its senders queued is not counted here
    /// (an async flush is of what went through the sink); [`Connection::flush`] counts it.
    pub(super) fn is_flushed(&self) -> bool {
        self.core.is_idle() && !self.core.lost_data()
    }

    /// [`Connection::is_flushed`], and the first `senders_accepted` messages the senders
    /// queued posted too (their sends then completed with the rest).
    fn is_flushed_since(&self, senders_accepted: u64) -> bool {
        self.is_flushed() && self.held.posted_all(senders_accepted)
    }

    /// How many messages the senders ever queued.
    fn senders_accepted(&self) -> u64 {
        self.senders.as_ref().map_or(0, |queue| queue.accepted())
    }

    /// Whether a delivered message waits to be taken.
    pub(super) fn has_delivered(&self) -> bool {
        self.core.has_delivered()
    }

    /// Whether either direction is on a tier above the smallest.
    #[cfg(feature = "tokio")]
    pub(super) fn above_smallest_tier(&self) -> bool {
        self.core.above_smallest_tier()
    }

    /// The error the connection failed with, if it did (the async connection's deadline
    /// sends read it after dropping a send).
    #[cfg(all(feature = "tokio", not(loom)))]
    pub(super) fn failure(&self) -> Option<&Arc<ConnectionError>> {
        self.core.failure()
    }

    /// Counters and state of this side.
    pub fn stats(&self) -> ConnectionStats {
        self.core.stats()
    }

    /// The endpoint, for its limits and state.
    pub fn endpoint(&self) -> &E {
        &self.endpoint
    }

    /// The configuration the connection was made with (for the byte stream's bounds).
    #[cfg(all(feature = "tokio", not(loom)))]
    pub(super) fn config(&self) -> &super::ConnectionConfig {
        self.core.config()
    }
}

/// A registered send buffer reserved on a [`Connection`] for a message built in place:
/// it dereferences to the message's bytes. [`SendBuffer::send`] sends them; dropping it
/// unsent gives the buffer back.
pub struct SendBuffer<'c, E: Endpoint> {
    connection: &'c mut Connection<E>,
}

impl<E: Endpoint> SendBuffer<'_, E> {
    /// Sends the message as written; it is then on its way, as after
    /// [`Connection::send`].
    pub fn send(self) -> Result<(), SendError> {
        let connection = &mut *self.connection;
        let committed = connection.core.commit_reserved();
        connection.post_work();
        connection.posted(committed).map(drop)
    }
}

impl<E: Endpoint> Deref for SendBuffer<'_, E> {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        self.connection.core.reserved().unwrap_or_default()
    }
}

impl<E: Endpoint> DerefMut for SendBuffer<'_, E> {
    fn deref_mut(&mut self) -> &mut [u8] {
        self.connection.core.reserved_mut().unwrap_or_default()
    }
}

impl<E: Endpoint> Drop for SendBuffer<'_, E> {
    fn drop(&mut self) {
        // After `send` nothing is reserved and this does nothing.
        self.connection.core.cancel_reserved();
    }
}

impl<E: Endpoint> fmt::Debug for SendBuffer<'_, E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SendBuffer")
            .field("len", &self.len())
            .finish_non_exhaustive()
    }
}

impl<E: Endpoint> Parkable for Connection<E> {
    fn readiness(&self) -> Readiness<'_> {
        self.endpoint.readiness()
    }

    fn arm(&mut self, waker: &Waker) -> Armed {
        if self.core.arm(waker) == Armed::Pending {
            return Armed::Pending;
        }
        // A flush that takes no more of the queue waits for completions, not for pushes.
        if let Some(queue) = &self.senders
            && self.held.takes_more()
            && queue.arm(waker) == Armed::Pending
        {
            return Armed::Pending;
        }
        self.endpoint.arm(waker)
    }

    fn disarm(&mut self) {
        self.endpoint.disarm();
        self.core.disarm();
        if let Some(queue) = &self.senders {
            queue.disarm();
        }
    }

    fn next_timer(&self) -> Option<Instant> {
        self.core.poll_timeout()
    }

    fn pace(&mut self) -> &mut Pace {
        &mut self.pace
    }
}

impl<E: Endpoint> Drop for Connection<E> {
    fn drop(&mut self) {
        // Closing first makes the provider give up every buffer before the core's slots
        // (and so the registered memory) are released.
        self.endpoint.close();
        if let Some(queue) = &self.senders {
            queue.close(Arc::new(ConnectionError::Closed));
        }
    }
}

impl<E: Endpoint> fmt::Debug for Connection<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Connection")
            .field("core", &self.core)
            .field("endpoint", &self.endpoint)
            .finish_non_exhaustive()
    }
}
