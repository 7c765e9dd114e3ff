//! [`AsyncConnection`]: a [`Connection`] for tokio tasks (feature `tokio`), woken by its
//! endpoint rather than polled: an idle connection costs its task nothing. A task of its
//! own, the driver, runs its timers and answers its peer while no call of the user's
//! waits on it, so a connection nobody polls still demotes. Every wait, a call's or the
//! driver's, is a step of the readiness model, polled (`readiness/task.rs`): look, spin
//! if it pays (for as long as [`AsyncConnection::set_spin`] sets), arm, sleep on the
//! endpoint's descriptor, waker or timer, disarm at the next poll.
//!
//! # Invariants
//!
//! - The connection and the state of its waits are shared by the user's handle and the
//!   driver (spawned by [`AsyncConnection::new`], holding them weakly, ending once they
//!   are dropped or taken back), behind one lock. Every call of the user's holds it while
//!   it is polled, and so does [`AsyncConnection::get_mut`]'s guard; the driver only
//!   tries it, and looks again a polling sleep later if a call has it.
//! - The driver makes the progress a call would (its look: [`State::drive`], which arms
//!   the connection as a call's wait does). It looks when a sleep until its plan ends:
//!   the plan, made at each look, is the connection's next timer and, while a tier above
//!   the smallest is held, a look `demote_after` later (in case a call of the user's
//!   left the connection unarmed) or, over an endpoint that cannot wake anybody, a
//!   polling sleep later. A call of the user's wakes it where it planned nothing and the
//!   connection now has a timer or a larger tier ([`Tasks::driver_at`]): a promotion
//!   made in a call reaches it that way. A look that finds no call of the user's
//!   waiting *engages* the driver: from then on the connection's events and timer wake
//!   it too, through the waker every call polls with, until a call of the user's is
//!   polled. So a connection nobody polls demotes its send direction when that falls
//!   due and answers its peer's demotion, and one in use costs the driver a look per
//!   plan, not a wake per event: between two calls of a request and its reply the
//!   driver is not engaged.
//! - The driver takes nothing once a message waits for the user: unread messages keep
//!   their receive slots, so the peer stops for want of credit as it would with no
//!   driver, rather than this side reassembling what it sends into memory without
//!   bound. It is woken again by the call that reads the last of them. A waiting call of
//!   the user's is woken whenever the driver's progress may have taken its event.
//! - A call of the user's left `Pending` and never polled again (a `recv` given up at a
//!   timeout) still counts as waiting: the driver's looks then make the progress at its
//!   plan without engaging it (test: `a_receive_given_up_leaves_the_connection_to_its_driver`).
//! - One task may poll the stream and the sink in the same poll (tarpc's dispatch reads,
//!   then writes and flushes): a call that finds the endpoint armed and returns `Ready`
//!   arms it again before it returns, so the `Pending` an earlier call of that poll
//!   returned still has its wake. Unless the call took what that earlier call waits for:
//!   every call makes progress, so a flush may take the message a receive left pending
//!   waits for (it arrived while the flush had the endpoint disarmed, so no wake came for
//!   it), and a receive may take the credit or completion a send left pending waits for.
//!   Arming then would sleep on an event already taken; the task is woken instead, to poll
//!   the pending call again. A receive or a send left pending counts until a call of its
//!   own kind is polled again.
//! - The receives and the sends may be polled from two tasks (the halves of
//!   `StreamExt::split`, or a [`ByteStream`](super::ByteStream)'s in `tokio::io::split`).
//!   Every call records its task as the receiver's or the sender's and polls the
//!   connection with one waker that wakes both, so whichever task arms the endpoint, a
//!   sleep, or the timer last, the wake reaches the other too; the task's own waker
//!   would replace the other's. And a call that returns `Pending` after its progress took
//!   what a pending call of the other kind waits for (a receive that took a credit, a
//!   send that took a message) wakes it: its wake was spent on the task that took it,
//!   and the other would wait for the connection's next event or timer.
//! - A message given to the [`Sink`] or to [`AsyncConnection::send`] is taken whole or
//!   not at all, as far as the peer can tell: a send future dropped after part of its
//!   message was posted fails the connection
//!   ([`ConnectionError::AbandonedMidMessage`]), and one dropped before withdraws it.
//!   [`AsyncConnection::send_gather`] offers its message whole each time, so its future
//!   has nothing begun to drop.
//! - The sink takes a message at once when it can post it; while earlier ones wait for
//!   credit it keeps a copy behind them, up to [`Sinking::MAX_MESSAGES`] messages or
//!   [`Sinking::MAX_BYTES`] bytes, and `poll_ready` waits past that. What it keeps is
//!   posted oldest first: a front that was offered already as `send` offers it (the core
//!   may hold it as a message begun), the rest with one `try_send_batch`, so small
//!   messages that waited together share packed frames. `poll_flush`, `poll_close`, and
//!   every send call ([`AsyncConnection::send`], [`AsyncConnection::send_gather`],
//!   [`AsyncConnection::send_batch`], the byte stream's writes) post all of it first, so
//!   messages leave in the order they were given.

use std::future::{Future, poll_fn};
use std::io::{self, IoSlice};
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError, TryLockError, Weak};
use std::task::{Context, Poll, Wake, Waker, ready};
use std::time::{Duration, Instant};

use futures_core::Stream;
use futures_sink::Sink;

use super::core::ConnectionStats;
use super::driver::Connection;
use super::errors::{ConnectionError, SendError, WouldBlock};
use super::readiness::{Alarm, LONGEST_SLEEP, Parkable, TaskWait, Wait, clock_nanos};
use super::receive::Message;
use super::senders::{MAX_HELD, batch_parts};
use crate::provider::{Endpoint, Readiness};

/// A [`Connection`] driven by a tokio runtime (IO and time enabled): `send(..).await`,
/// `recv().await`, a [`Stream`] of the messages it receives and a [`Sink`] of messages
/// to send.
///
/// ```
/// use futures_util::{SinkExt, StreamExt};
/// # use std::sync::Arc;
/// # use std::time::Instant;
/// # use tierbuf_pool::MemoryBudget;
/// # use tierbuf_tiers::{Reservoir, ladder::TierLadder};
/// # use tierbuf_transport::connection::{AsyncConnection, Connection, ConnectionConfig, ConnectionCore};
/// # use tierbuf_transport::{ShmProvider, Provider};
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let provider = ShmProvider::new(MemoryBudget::with_cap(64 << 20));
/// # let config = Arc::new(ConnectionConfig::new(Arc::new(TierLadder::preset("two-tier")?))?);
/// # let reservoir = Arc::new(Reservoir::new(provider.registrar(), Arc::clone(config.ladder())));
/// # let (a, b) = provider.pair(config.queue_depth(), config.queue_depth())?;
/// # let connect = |endpoint| {
/// #     let core = ConnectionCore::new(
/// #         Arc::clone(&config), Arc::clone(&reservoir), Arc::clone(&reservoir), Instant::now(),
/// #     )?;
/// #     Ok::<_, Box<dyn std::error::Error>>(Connection::new(core, endpoint)?)
/// # };
/// let mut client = AsyncConnection::new(connect(a)?)?;
/// let mut server = AsyncConnection::new(connect(b)?)?;
/// let echo = tokio::spawn(async move {
///     while let Some(request) = server.next().await {
///         let reply = request?.to_vec();
///         server.send(&reply).await?;
///     }
///     Ok::<_, Box<dyn std::error::Error + Send + Sync>>(())
/// });
/// client.send(b"ping").await?;
/// assert_eq!(&client.recv().await?[..], b"ping");
/// client.feed(b"pong".to_vec()).await?;
/// client.flush().await?;
/// assert_eq!(&client.next().await.expect("a reply")?[..], b"pong");
/// drop(client);
/// echo.await?.map_err(|error| error.to_string())?;
/// # Ok(())
/// # }
/// ```
#[derive(Debug)]
pub struct AsyncConnection<E: Endpoint> {
    shared: Arc<Shared<E>>,
}

/// What an [`AsyncConnection`] shares with its driver (module invariants).
#[derive(Debug)]
struct Shared<E: Endpoint> {
    /// The connection and its waits; `None` once taken back or dropped.
    state: Mutex<Option<State<E>>>,
    tasks: Arc<Tasks>,
}

/// An [`AsyncConnection`]'s connection and its waits.
#[derive(Debug)]
struct State<E: Endpoint> {
    connection: Connection<E>,
    /// Its waits' state: the endpoint's descriptor in tokio's reactor, the spin, the
    /// sleeps (`readiness/task.rs`).
    wait: TaskWait,
    /// What the sink took and has not posted, oldest first (module invariants).
    sinking: Sinking,
    /// Why the last send offered found nothing taken: what a deadline that passes reports.
    blocked_by: WouldBlock,
    /// Whether a receive returned `Pending` and none has been polled since.
    recv_waits: bool,
    /// Whether a send, the sink's readiness or a flush returned `Pending` and none of
    /// these has been polled since.
    send_waits: bool,
    /// The tasks that last polled a receive and a send, and the waker that wakes them
    /// (and the driver), which every call polls the connection with (module invariants).
    tasks: Arc<Tasks>,
    waker: Waker,
    /// What `tasks` holds, read without its lock: a call whose task is the one recorded
    /// for its kind already takes no lock.
    registered: [Option<Waker>; 2],
}

/// The tasks waiting on a connection: the one that last polled a receive, the one that
/// last polled a send (the same task, unless the connection was split), and its driver.
/// A wake wakes the first two and keeps them, so recording a task again costs nothing;
/// it wakes the driver only while the driver is engaged.
#[derive(Debug)]
struct Tasks {
    wakers: Mutex<[Option<Waker>; 3]>,
    /// Whether the driver took the connection over, finding no call of the user's
    /// waiting at a look, and no call of the user's has been polled since (module
    /// invariants).
    engaged: AtomicBool,
    /// When the driver plans to look at the connection unwoken ([`clock_nanos`], or
    /// [`Look::NEVER`] or [`Look::AFTER_READ`]; module invariants).
    driver_at: AtomicU64,
}

impl Default for Tasks {
    fn default() -> Tasks {
        Tasks {
            wakers: Mutex::default(),
            engaged: AtomicBool::new(false),
            driver_at: AtomicU64::new(Look::NEVER),
        }
    }
}

/// The driver's place in [`Tasks::wakers`], after the calls' ([`Call`]).
const DRIVER: usize = 2;

impl Tasks {
    /// Records `waker` at `index`, if another is there.
    fn register(&self, index: usize, waker: &Waker) {
        let mut wakers = self.wakers.lock().unwrap_or_else(PoisonError::into_inner);
        match &mut wakers[index] {
            Some(kept) if kept.will_wake(waker) => {}
            slot => *slot = Some(waker.clone()),
        }
    }

    /// Wakes the driver, whatever the user's calls do: to find the connection gone.
    fn wake_driver(&self) {
        let driver = self.wakers.lock().unwrap_or_else(PoisonError::into_inner)[DRIVER].clone();
        if let Some(driver) = driver {
            driver.wake();
        }
    }
}

impl Wake for Tasks {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        // Woken outside the lock: a waker may run code that records a task again. The
        // sender is the receiver unless the connection was split: one clone then.
        let [recv, send, driver] = {
            let wakers = self.wakers.lock().unwrap_or_else(PoisonError::into_inner);
            let [recv, send, driver] = &*wakers;
            let send = match (recv, send) {
                (Some(recv), Some(send)) if recv.will_wake(send) => None,
                (_, send) => send.clone(),
            };
            let driver = driver
                .as_ref()
                .filter(|_| self.engaged.load(Ordering::Acquire))
                .cloned();
            [recv.clone(), send, driver]
        };
        for waker in [recv, send, driver].into_iter().flatten() {
            waker.wake();
        }
    }
}

/// Looks the driver makes at a connection that has work each time, before it looks
/// again after a polling sleep.
const DRIVER_PASSES: usize = 4;

/// The kinds of call an [`AsyncConnection`] may leave pending (module invariants).
#[derive(Clone, Copy)]
enum Call {
    /// A receive: waits for a message.
    Recv = 0,
    /// A send, the sink's readiness or a flush: waits for room, credit or completions.
    Send = 1,
}

impl<E: Endpoint + 'static> AsyncConnection<E> {
    /// Drives `connection` from tokio tasks, and from a task of its own while no call of
    /// theirs waits on it (module invariants).
    ///
    /// # Errors
    ///
    /// The operating system's, when the endpoint's descriptor cannot be duplicated or
    /// registered (its limit of open files).
    ///
    /// # Panics
    ///
    /// Outside a tokio runtime with IO enabled, as tokio's `AsyncFd` does.
    pub fn new(connection: Connection<E>) -> io::Result<AsyncConnection<E>> {
        let wait = TaskWait::new(connection.endpoint().readiness())?;
        let tasks = Arc::new(Tasks::default());
        let state = State {
            waker: Waker::from(Arc::clone(&tasks)),
            tasks: Arc::clone(&tasks),
            registered: [None, None],
            connection,
            wait,
            sinking: Sinking::default(),
            blocked_by: WouldBlock::NoCredit,
            recv_waits: false,
            send_waits: false,
        };
        let shared = Arc::new(Shared {
            state: Mutex::new(Some(state)),
            tasks,
        });
        tokio::spawn(Driver {
            shared: Arc::downgrade(&shared),
            sleep: Alarm::default(),
        });
        Ok(AsyncConnection { shared })
    }
}

impl<E: Endpoint> AsyncConnection<E> {
    /// Runs `f` on the state, locked: the driver waits meanwhile (module invariants).
    fn with<T>(&self, f: impl FnOnce(&mut State<E>) -> T) -> T {
        let mut state = self
            .shared
            .state
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        f(state.as_mut().expect(TAKEN_AT_THE_END))
    }

    /// Takes the state out, ending the driver (module invariants).
    fn take(&self) -> Option<State<E>> {
        let state = self
            .shared
            .state
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        self.shared.tasks.wake_driver();
        state
    }

    /// Polls a call of kind `call` until it is ready, locking the state for each poll.
    async fn waiting<T>(
        &self,
        call: Call,
        mut poll: impl FnMut(&mut State<E>, &mut Context<'_>) -> Poll<T>,
    ) -> T {
        poll_fn(|cx| self.with(|state| state.keeping_armed(cx, call, &mut poll))).await
    }

    /// Sets how long a wait may spin before the task parks (50 µs unless set; the
    /// module's invariants say when it spins). Zero never spins: for a process whose
    /// cores are all spoken for, where a spinning task takes time a peer on the same
    /// machine needs.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tierbuf_transport::Transport;
    /// use tierbuf_transport::connection::AsyncConnection;
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let node = Transport::loopback().ladder_preset("rpc").budget_bytes(16 << 20).build()?;
    /// let listener = node.listen("calm")?;
    /// let mut a = AsyncConnection::new(node.connect("calm")?)?;
    /// let mut b = AsyncConnection::new(listener.accept()?)?;
    /// b.set_spin(Duration::ZERO);
    /// assert_eq!(b.spin(), Duration::ZERO);
    /// a.send(b"parked, not spinning").await?;
    /// assert_eq!(&b.recv().await?[..], b"parked, not spinning");
    /// # Ok(())
    /// # }
    /// ```
    pub fn set_spin(&mut self, spin: Duration) {
        self.with(|state| state.wait.spin = spin);
    }

    /// How long a wait may spin before the task parks ([`AsyncConnection::set_spin`]).
    pub fn spin(&self) -> Duration {
        self.with(|state| state.wait.spin)
    }

    /// Counters and state of this side ([`Connection::stats`]), through a shared
    /// reference: a task that holds the connection elsewhere (in a `Mutex`, an `Arc`
    /// with the halves of a split) can read them.
    pub fn stats(&self) -> ConnectionStats {
        self.with(|state| state.connection.stats())
    }

    /// How many times the connection's progress did something (took a completion,
    /// posted work), ever: whoever saw it unchanged across a call knows the call took no
    /// event, so a watcher of [`AsyncConnection::stats`] can skip reading them.
    ///
    /// ```
    /// use tierbuf_transport::Transport;
    /// use tierbuf_transport::connection::AsyncConnection;
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let node = Transport::loopback().ladder_preset("rpc").budget_bytes(16 << 20).build()?;
    /// let listener = node.listen("counted")?;
    /// let mut a = AsyncConnection::new(node.connect("counted")?)?;
    /// let mut b = AsyncConnection::new(listener.accept()?)?;
    /// let before = b.progress_made();
    /// a.send(b"ping").await?;
    /// assert_eq!(&b.recv().await?[..], b"ping");
    /// assert!(b.progress_made() > before, "taking the message was progress");
    /// # Ok(())
    /// # }
    /// ```
    pub fn progress_made(&self) -> u64 {
        self.with(|state| state.connection.pace().progress_made())
    }

    /// The connection, for its non-blocking calls; the driver waits while it is held. A
    /// message sent through it goes ahead of any the sink still holds: flush the sink
    /// first to keep their order.
    pub fn get_mut(&mut self) -> AsyncConnectionGuard<'_, E> {
        AsyncConnectionGuard {
            state: self
                .shared
                .state
                .lock()
                .unwrap_or_else(PoisonError::into_inner),
        }
    }

    /// The connection back, leaving tokio (its driver ends). What the sink took and has
    /// not posted is dropped with it, as a `Sink` may drop what was never flushed: flush
    /// first.
    pub fn into_inner(self) -> Connection<E> {
        let mut state = self.take().expect(TAKEN_AT_THE_END);
        state.disarm();
        state.connection
    }

    /// Sends `message` whole (segmented or through a promotion if it needs one), waiting
    /// for credits and tiers without blocking the thread.
    ///
    /// `connection.send(m)` calls this even where `futures::SinkExt` is in scope: it takes
    /// what the [`Sink`] takes (`AsRef<[u8]>`) and means what `SinkExt::send` means, the
    /// message taken whole, but returns once the message is posted, where
    /// `SinkExt::send` also waits for every send to complete (`send(m).await` then
    /// `flush().await` is that).
    ///
    /// # Errors
    ///
    /// As [`Connection::send`]. Dropping the future after part of the message was posted
    /// fails the connection (module invariants).
    pub async fn send(&mut self, message: impl AsRef<[u8]>) -> Result<(), SendError> {
        let message = message.as_ref();
        // What the sink took goes first (module invariants), before this message is
        // offered: a drop while it waits has nothing of this message to abandon.
        self.waiting(Call::Send, State::poll_sinking)
            .await
            .map_err(SendError::Failed)?;
        let mut sending = Sending {
            connection: self,
            len: message.len(),
            offset: 0,
        };
        let connection = sending.connection;
        connection
            .waiting(Call::Send, |state, cx| {
                state.poll_send(cx, message, &mut sending.offset)
            })
            .await
    }

    /// [`AsyncConnection::send`], giving up at `deadline`, as [`Connection::send_deadline`]
    /// does: [`SendError::TimedOut`] if nothing of the message was posted by then (nothing
    /// was sent); if part of it was, the connection fails with
    /// [`ConnectionError::AbandonedMidMessage`], and that is the error.
    ///
    /// ```
    /// use std::time::{Duration, Instant};
    /// use tierbuf_transport::Transport;
    /// use tierbuf_transport::connection::{AsyncConnection, SendError};
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let node = Transport::loopback().ladder_preset("rpc").budget_bytes(16 << 20).build()?;
    /// let listener = node.listen("deadline")?;
    /// let mut a = AsyncConnection::new(node.connect("deadline")?)?;
    /// let mut b = AsyncConnection::new(listener.accept()?)?;
    /// // `b` does not read: `a` sends until its credits run out, then the deadline passes.
    /// let deadline = Instant::now() + Duration::from_millis(20);
    /// let outcome = loop {
    ///     if let Err(error) = a.send_deadline(b"ping", deadline).await {
    ///         break error;
    ///     }
    /// };
    /// assert!(matches!(outcome, SendError::TimedOut(_)), "{outcome:?}");
    /// assert_eq!(&b.recv().await?[..], b"ping");
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// As [`AsyncConnection::send`], and [`SendError::TimedOut`].
    pub async fn send_deadline(
        &mut self,
        message: impl AsRef<[u8]>,
        deadline: Instant,
    ) -> Result<(), SendError> {
        let message = message.as_ref();
        match tokio::time::timeout_at(deadline.into(), self.send(message)).await {
            Ok(sent) => sent,
            // The send's future is dropped: a message of which nothing was posted is
            // withdrawn, one begun failed the connection (module invariants).
            Err(_elapsed) => Err(self.with(|state| match state.connection.failure() {
                Some(failure) => SendError::Failed(Arc::clone(failure)),
                None => SendError::TimedOut(state.blocked_by),
            })),
        }
    }

    /// Sends `message` without waiting: all of it is taken as one message, or none of it
    /// ([`Connection::try_send`]). Behind messages the [`Sink`] took and has not posted it
    /// is not taken ([`WouldBlock::SinkBacklog`]): messages leave in the order they were
    /// given.
    ///
    /// # Errors
    ///
    /// As [`Connection::try_send`].
    pub fn try_send(&mut self, message: &[u8]) -> Result<(), SendError> {
        self.with(|state| {
            if !state.sinking.messages.is_empty() {
                return Err(SendError::WouldBlock(WouldBlock::SinkBacklog));
            }
            state.connection.try_send(message)
        })
    }

    /// Sends `parts` as one message, whatever their number and lengths (segmented, or
    /// through a promotion, if it needs one), waiting for credits and tiers without
    /// blocking the thread; the peer receives their bytes together. The message is taken
    /// whole or not at all ([`Connection::try_send_gather`]: it is copied if it must be
    /// segmented), so dropping the future leaves nothing half-sent.
    ///
    /// ```
    /// use std::io::IoSlice;
    /// use tierbuf_transport::Transport;
    /// use tierbuf_transport::connection::AsyncConnection;
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let node = Transport::loopback().ladder_preset("rpc").budget_bytes(16 << 20).build()?;
    /// let listener = node.listen("gathered")?;
    /// let mut a = AsyncConnection::new(node.connect("gathered")?)?;
    /// let mut b = AsyncConnection::new(listener.accept()?)?;
    /// let body = vec![7u8; 3000];
    /// a.send_gather(&[IoSlice::new(b"header:"), IoSlice::new(&body)]).await?;
    /// let message = b.recv().await?;
    /// assert_eq!(message.len(), 3007);
    /// assert_eq!(&message[..7], b"header:");
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// As [`Connection::send_gather`].
    pub async fn send_gather(&mut self, parts: &[IoSlice<'_>]) -> Result<(), SendError> {
        self.waiting(Call::Send, |state, cx| state.poll_send_gather(cx, parts))
            .await
    }

    /// Sends every one of `messages`, each as a message of its own, waiting for credits
    /// without blocking the thread; small ones given together share frames
    /// ([`Connection::send_batch`]). Every message it takes is the connection's to send
    /// (one that must be segmented is copied), so dropping the future leaves a prefix of
    /// the batch sent and nothing half-sent.
    ///
    /// # Errors
    ///
    /// As [`Connection::send_batch`].
    pub async fn send_batch(&mut self, messages: &[&[u8]]) -> Result<(), SendError> {
        self.with(|state| state.connection.check_batch_lengths(messages))?;
        let mut sent = 0;
        self.waiting(Call::Send, |state, cx| {
            state.poll_send_batch(cx, messages, &mut sent)
        })
        .await
    }

    /// The next message.
    ///
    /// # Errors
    ///
    /// As [`Connection::recv`]: the connection's failure, after every message delivered
    /// before it.
    pub async fn recv(&mut self) -> Result<Message, Arc<ConnectionError>> {
        self.waiting(Call::Recv, State::poll_recv).await
    }

    /// Waits until everything taken has been posted and every send has completed.
    ///
    /// # Errors
    ///
    /// As [`Connection::flush`].
    pub async fn flush(&mut self) -> Result<(), Arc<ConnectionError>> {
        self.waiting(Call::Send, State::poll_flushed).await
    }

    /// Offers an I/O vector by the byte-stream rule of [`ConnectionCore::try_write_vectored`](super::ConnectionCore::try_write_vectored), after
    /// the rest of anything the sink took: `Ready` with the bytes of the leading elements
    /// taken as one message (at least one byte of a vector that has any), `Pending` while
    /// nothing can be taken (no credit or send slot, or a segmented message holds the
    /// send order).
    pub(super) fn poll_try_send(
        &mut self,
        cx: &mut Context<'_>,
        parts: &[IoSlice<'_>],
    ) -> Poll<Result<usize, SendError>> {
        self.with(|state| state.poll_try_send(cx, parts))
    }

    /// Sends an empty message, after the rest of anything the sink took, as
    /// [`AsyncConnection::send`] does; `Ready` once the connection has taken it (there is
    /// nothing of it to take in parts, so nothing to resume).
    pub(super) fn poll_send_empty(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), SendError>> {
        self.with(|state| state.poll_send_empty(cx))
    }
}

/// The connection under an [`AsyncConnection`], lent by [`AsyncConnection::get_mut`]: its
/// driver waits while this is held.
#[derive(Debug)]
pub struct AsyncConnectionGuard<'a, E: Endpoint> {
    state: MutexGuard<'a, Option<State<E>>>,
}

impl<E: Endpoint> std::ops::Deref for AsyncConnectionGuard<'_, E> {
    type Target = Connection<E>;

    fn deref(&self) -> &Connection<E> {
        &self.state.as_ref().expect(TAKEN_AT_THE_END).connection
    }
}

impl<E: Endpoint> std::ops::DerefMut for AsyncConnectionGuard<'_, E> {
    fn deref_mut(&mut self) -> &mut Connection<E> {
        &mut self.state.as_mut().expect(TAKEN_AT_THE_END).connection
    }
}

/// Why the state is there whenever a user's call runs.
const TAKEN_AT_THE_END: &str =
    "the state is taken only by `into_inner` and by the drop, which end the connection";

impl<E: Endpoint> Drop for AsyncConnection<E> {
    fn drop(&mut self) {
        // Dropped outside the lock, the connection closes; the driver wakes and ends.
        drop(self.take());
    }
}

impl<E: Endpoint> State<E> {
    /// Offers an I/O vector by the byte-stream rule of [`ConnectionCore::try_write_vectored`](super::ConnectionCore::try_write_vectored), after
    /// the rest of anything the sink took: `Ready` with the bytes of the leading elements
    /// taken as one message (at least one byte of a vector that has any), `Pending` while
    /// nothing can be taken (no credit or send slot, or a segmented message holds the
    /// send order).
    fn poll_try_send(
        &mut self,
        cx: &mut Context<'_>,
        parts: &[IoSlice<'_>],
    ) -> Poll<Result<usize, SendError>> {
        self.keeping_armed(cx, Call::Send, |this, cx| {
            ready!(this.poll_sinking(cx)).map_err(SendError::Failed)?;
            loop {
                this.disarm();
                match this.connection.try_write_vectored(parts) {
                    Err(SendError::WouldBlock(_)) => ready!(this.poll_event(cx)),
                    taken => return Poll::Ready(taken),
                }
            }
        })
    }

    /// Runs `poll`, a call of kind `call`, with the waker of both of the connection's
    /// tasks, having recorded the caller's task as `call`'s (module invariants). Then
    /// keeps the wake a call of the other kind left pending is owed: wakes it if `poll`
    /// took what it waits for; else, if `poll` is ready after finding the endpoint
    /// armed, arms the endpoint again.
    fn keeping_armed<T>(
        &mut self,
        cx: &mut Context<'_>,
        call: Call,
        poll: impl FnOnce(&mut Self, &mut Context<'_>) -> Poll<T>,
    ) -> Poll<T> {
        self.register(call, cx.waker());
        // A call of the user's takes the connection back from the driver.
        if self.tasks.engaged.load(Ordering::Relaxed) {
            self.tasks.engaged.store(false, Ordering::Relaxed);
        }
        let waker = self.waker.clone();
        let cx = &mut Context::from_waker(&waker);
        let was_armed = self.wait.is_armed();
        let progress_made = self.connection.pace().progress_made();
        let waits = match call {
            Call::Recv => &mut self.recv_waits,
            Call::Send => &mut self.send_waits,
        };
        *waits = false;
        let polled = poll(self, cx);
        let progressed = self.connection.pace().progress_made() != progress_made;
        // What `poll` took that a pending call of the other kind waits for: a message
        // for a receive, a credit or completion (any progress) for a send.
        let taken = match call {
            Call::Send => self.recv_waits && self.connection.has_delivered(),
            Call::Recv => self.send_waits && progressed,
        };
        if polled.is_pending() {
            match call {
                Call::Recv => self.recv_waits = true,
                Call::Send => self.send_waits = true,
            }
            // The other call may be another task's, which this one's progress took the
            // event from without a wake: it would wait for the next one.
            if taken && progressed {
                cx.waker().wake_by_ref();
            }
        } else {
            self.wait.end(&mut self.connection);
            if was_armed {
                if taken {
                    cx.waker().wake_by_ref();
                } else {
                    self.rearm(cx);
                }
            }
        }
        self.plan_driver();
        polled
    }

    /// Wakes the driver if it plans no look and the connection now needs one (module
    /// invariants): a timer, or a larger tier held, where it planned nothing; every
    /// message read, where it stopped for them. A driver with a plan looks by it.
    fn plan_driver(&self) {
        let woken = match self.tasks.driver_at.load(Ordering::Relaxed) {
            Look::AFTER_READ => !self.connection.has_delivered(),
            Look::NEVER => {
                self.connection.next_timer().is_some() || self.connection.above_smallest_tier()
            }
            // It looks by its plan, and plans anew then.
            _ => false,
        };
        if woken {
            self.tasks.driver_at.store(Look::SOON, Ordering::Relaxed);
            self.tasks.wake_driver();
        }
    }

    /// The driver's look (module invariants): makes the progress the connection's events
    /// and timers ask for and leaves it armed with the tasks' waker, so its next event or
    /// timer wakes the driver again while no call of the user's waits (or that call, if
    /// one does). Takes nothing more once a message waits for the user. Says when to look
    /// again unwoken.
    fn drive(&mut self) -> Look {
        let waker = self.waker.clone();
        let cx = &mut Context::from_waker(&waker);
        let progress_made = self.connection.pace().progress_made();
        let user_waits = self.recv_waits || self.send_waits;
        // With no call of the user's waiting, the connection's events and timer wake the
        // driver from now on, until a call of the user's is polled.
        self.tasks.engaged.store(!user_waits, Ordering::Release);
        let mut busy = false;
        for _ in 0..DRIVER_PASSES {
            if self.connection.has_delivered() {
                self.tasks.engaged.store(false, Ordering::Relaxed);
                if user_waits {
                    // Its call takes the message, or arms again for what it waits for.
                    waker.wake_by_ref();
                }
                return Look::AfterRead;
            }
            self.disarm();
            busy = self
                .wait
                .poll(&mut self.connection, cx, Wait::Drive)
                .is_ready();
            if !busy {
                break;
            }
        }
        if busy {
            self.disarm();
        }
        if user_waits && (busy || self.connection.pace().progress_made() != progress_made) {
            // A pending call of the user's may have waited for what this progress took,
            // or for the arm it left undone.
            waker.wake_by_ref();
        }
        let now = Instant::now();
        if busy {
            return Look::At(now + LONGEST_SLEEP);
        }
        let check = if !self.connection.above_smallest_tier() {
            None
        } else if matches!(self.connection.endpoint().readiness(), Readiness::Polling) {
            // Nothing wakes it: it is looked at as a blocking wait polls, while it holds
            // a larger tier.
            Some(now + LONGEST_SLEEP)
        } else {
            // Armed, so woken by its events; looked at again in case a call of the
            // user's disarmed it and returned without arming it again.
            Some(now + self.connection.config().ladder().policy().demote_after())
        };
        match (self.connection.next_timer(), check) {
            (Some(timer), Some(check)) => Look::At(timer.min(check)),
            (Some(at), None) | (None, Some(at)) => Look::At(at),
            (None, None) => Look::Woken,
        }
    }

    /// Records `waker` as the task of `call`'s kind (module invariants).
    fn register(&mut self, call: Call, waker: &Waker) {
        let kept = &mut self.registered[call as usize];
        if kept.as_ref().is_some_and(|kept| kept.will_wake(waker)) {
            return;
        }
        *kept = Some(waker.clone());
        self.tasks
            .wakers
            .lock()
            .unwrap_or_else(PoisonError::into_inner)[call as usize] = Some(waker.clone());
    }

    /// Arms the endpoint again after a call that disarmed it returned `Ready`; if there
    /// is work already, wakes the task instead, to poll again.
    fn rearm(&mut self, cx: &mut Context<'_>) {
        if !self.wait.is_armed()
            && self
                .wait
                .poll(&mut self.connection, cx, Wait::Rearm)
                .is_ready()
        {
            self.disarm();
            cx.waker().wake_by_ref();
        }
    }

    /// Posts `message` from `offset` on, advancing `offset`; on a failure, moves `offset`
    /// to the end (nothing is left to abandon).
    fn poll_send(
        &mut self,
        cx: &mut Context<'_>,
        message: &[u8],
        offset: &mut usize,
    ) -> Poll<Result<(), SendError>> {
        loop {
            self.disarm();
            match self.connection.try_send_some(&message[*offset..]) {
                Ok(taken) => {
                    *offset += taken;
                    if *offset == message.len() {
                        return Poll::Ready(Ok(()));
                    }
                }
                Err(SendError::WouldBlock(reason)) => {
                    self.blocked_by = reason;
                    ready!(self.poll_event(cx));
                }
                Err(error) => {
                    *offset = message.len();
                    return Poll::Ready(Err(error));
                }
            }
        }
    }

    /// Sends an empty message, after the rest of anything the sink took, as
    /// [`AsyncConnection::send`] does; `Ready` once the connection has taken it (there is
    /// nothing of it to take in parts, so nothing to resume).
    fn poll_send_empty(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), SendError>> {
        self.keeping_armed(cx, Call::Send, |this, cx| {
            ready!(this.poll_sinking(cx)).map_err(SendError::Failed)?;
            this.poll_send(cx, &[], &mut 0)
        })
    }

    /// Offers `parts` as one message, after everything the sink took, until it is taken.
    fn poll_send_gather(
        &mut self,
        cx: &mut Context<'_>,
        parts: &[IoSlice<'_>],
    ) -> Poll<Result<(), SendError>> {
        ready!(self.poll_sinking(cx)).map_err(SendError::Failed)?;
        loop {
            self.disarm();
            match self.connection.try_send_gather(parts) {
                Ok(()) => return Poll::Ready(Ok(())),
                Err(SendError::WouldBlock(_)) => ready!(self.poll_event(cx)),
                Err(error) => return Poll::Ready(Err(error)),
            }
        }
    }

    /// Posts `messages` from `sent` on, advancing `sent`.
    fn poll_send_batch(
        &mut self,
        cx: &mut Context<'_>,
        messages: &[&[u8]],
        sent: &mut usize,
    ) -> Poll<Result<(), SendError>> {
        ready!(self.poll_sinking(cx)).map_err(SendError::Failed)?;
        loop {
            self.disarm();
            if *sent == messages.len() {
                return Poll::Ready(Ok(()));
            }
            match self.connection.try_send_batch(&messages[*sent..]) {
                Ok(taken) => *sent += taken,
                Err(SendError::WouldBlock(_)) => ready!(self.poll_event(cx)),
                Err(error) => return Poll::Ready(Err(error)),
            }
        }
    }

    fn poll_recv(&mut self, cx: &mut Context<'_>) -> Poll<Result<Message, Arc<ConnectionError>>> {
        loop {
            self.disarm();
            if let Some(message) = self.connection.try_recv()? {
                return Poll::Ready(Ok(message));
            }
            ready!(self.poll_event(cx));
        }
    }

    /// Posts everything the sink took, waiting for credits as it must.
    fn poll_sinking(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Arc<ConnectionError>>> {
        loop {
            self.disarm();
            if self.post_sunk().map_err(failure_of)? {
                return Poll::Ready(Ok(()));
            }
            ready!(self.poll_event(cx));
        }
    }

    /// Posts what it can of what the sink took, oldest first: the rest of a message begun
    /// as `send` posts it, the messages after it with one `try_send_batch` (so small ones
    /// share frames). Returns whether all of it is posted.
    fn post_sunk(&mut self) -> Result<bool, SendError> {
        loop {
            let Some(front) = self.sinking.messages.front() else {
                return Ok(true);
            };
            if self.sinking.begun || self.sinking.messages.len() == 1 {
                match self.connection.try_send_some(front) {
                    Ok(taken) if taken == front.len() => self.sinking.pop(1),
                    Ok(taken) => {
                        let rest = front[taken..].to_vec();
                        self.sinking.replace_front(rest);
                    }
                    Err(SendError::WouldBlock(_)) => {
                        // The core may hold it as begun with nothing posted: it is
                        // offered the same way again.
                        self.sinking.begun = true;
                        return Ok(false);
                    }
                    Err(error) => return Err(error),
                }
            } else {
                let (batch, count) = batch_parts(self.sinking.messages.iter().map(Vec::as_slice));
                match self.connection.try_send_batch(&batch[..count]) {
                    Ok(taken) => self.sinking.pop(taken),
                    Err(SendError::WouldBlock(_)) => return Ok(false),
                    Err(error) => return Err(error),
                }
            }
        }
    }

    fn poll_flushed(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Arc<ConnectionError>>> {
        loop {
            self.disarm();
            if self.post_sunk().map_err(failure_of)? {
                let progressed = self.connection.progress();
                // Everything accepted reached the peer, even if it closed since.
                if self.connection.is_flushed() {
                    return Poll::Ready(Ok(()));
                }
                progressed?;
            }
            ready!(self.poll_event(cx));
        }
    }

    /// Waits for the next event of the connection, as a call's wait
    /// ([`TaskWait::poll`]): `Ready` when there may be work, `Pending` when the task will
    /// be woken.
    fn poll_event(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        self.wait.poll(&mut self.connection, cx, Wait::Call)
    }

    fn disarm(&mut self) {
        self.wait.disarm(&mut self.connection);
    }
}

/// A send in progress ([`AsyncConnection::send`]): gives its message up when dropped
/// unfinished.
struct Sending<'a, E: Endpoint> {
    connection: &'a AsyncConnection<E>,
    len: usize,
    offset: usize,
}

impl<E: Endpoint> Drop for Sending<'_, E> {
    fn drop(&mut self) {
        if self.offset < self.len {
            // Withdrawn, or the connection fails: either way nothing is left half-sent.
            let _failure = self
                .connection
                .with(|state| state.connection.abandon_message(self.len));
        }
    }
}

/// When the driver looks at a connection again unwoken.
enum Look {
    /// At this time.
    At(Instant),
    /// Never: only the connection's events and timers wake it.
    Woken,
    /// Once the user has read every message delivered.
    AfterRead,
}

impl Look {
    /// [`Tasks::driver_at`] for [`Look::Woken`].
    const NEVER: u64 = u64::MAX;
    /// [`Tasks::driver_at`] for [`Look::AfterRead`] ([`clock_nanos`] is never 0).
    const AFTER_READ: u64 = 0;
    /// [`Tasks::driver_at`] for a look a call asked for and the driver has not made.
    const SOON: u64 = 1;
}

/// The task that drives an [`AsyncConnection`] while no call of the user's waits on it
/// (module invariants): it holds the connection only weakly, and ends once the
/// connection is dropped or taken back.
struct Driver<E: Endpoint> {
    shared: Weak<Shared<E>>,
    /// The sleep until it looks at the connection again unwoken.
    sleep: Alarm,
}

impl<E: Endpoint> Future for Driver<E> {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let this = &mut *self;
        let Some(shared) = this.shared.upgrade() else {
            return Poll::Ready(());
        };
        shared.tasks.register(DRIVER, cx.waker());
        let look = match shared.state.try_lock() {
            Ok(mut state) => match state.as_mut() {
                Some(state) => state.drive(),
                None => return Poll::Ready(()),
            },
            Err(TryLockError::Poisoned(poisoned)) => match poisoned.into_inner().as_mut() {
                Some(state) => state.drive(),
                None => return Poll::Ready(()),
            },
            // A call of the user's has the connection: look again soon, as it may leave
            // it unarmed.
            Err(TryLockError::WouldBlock) => Look::At(Instant::now() + LONGEST_SLEEP),
        };
        let (planned, at) = match look {
            Look::At(at) => (clock_nanos(at), Some(at)),
            Look::Woken => (Look::NEVER, None),
            Look::AfterRead => (Look::AFTER_READ, None),
        };
        shared.tasks.driver_at.store(planned, Ordering::Relaxed);
        drop(shared);
        if this.sleep.poll_until(cx, at).is_ready() {
            // Due: looked at in the next poll.
            cx.waker().wake_by_ref();
        }
        Poll::Pending
    }
}

/// What the sink took and has not posted, oldest first (module invariants).
#[derive(Default)]
struct Sinking {
    messages: std::collections::VecDeque<Vec<u8>>,
    /// Whether the front was offered with `try_send_some` and may be held by the core as
    /// a message begun: it is offered the same way until it is all posted.
    begun: bool,
}

impl std::fmt::Debug for Sinking {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sinking")
            .field("messages", &self.messages.len())
            .field("bytes", &self.bytes())
            .field("begun", &self.begun)
            .finish()
    }
}

impl Sinking {
    /// Bytes past which the sink takes nothing more until what it holds is posted.
    const MAX_BYTES: usize = 64 << 10;
    /// Messages past which the sink takes nothing more until what it holds is posted.
    const MAX_MESSAGES: usize = MAX_HELD;

    /// Bytes of the messages it holds.
    fn bytes(&self) -> usize {
        self.messages.iter().map(Vec::len).sum()
    }

    fn has_room(&self) -> bool {
        self.messages.len() < Sinking::MAX_MESSAGES && self.bytes() < Sinking::MAX_BYTES
    }

    fn push(&mut self, message: Vec<u8>) {
        self.messages.push_back(message);
    }

    /// Keeps `rest`, what is left to post of a message offered as `send` offers it, as
    /// the only message held: it is offered that way again.
    fn push_begun(&mut self, rest: &[u8]) {
        self.messages.push_back(rest.to_vec());
        self.begun = true;
    }

    /// Drops the `count` oldest messages, all posted.
    fn pop(&mut self, count: usize) {
        self.messages.drain(..count);
        self.begun = false;
    }

    /// Replaces the front message by `rest`, what is left of it to post.
    fn replace_front(&mut self, rest: Vec<u8>) {
        if let Some(front) = self.messages.front_mut() {
            *front = rest;
        }
        self.begun = true;
    }
}

/// The connection's failure behind a send's error; a send refused for its own sake
/// (too long, say) counts as the connection's misuse.
fn failure_of(error: SendError) -> Arc<ConnectionError> {
    match error {
        SendError::Failed(failure) => failure,
        other => Arc::new(ConnectionError::SinkRefused(other)),
    }
}

/// The messages the connection receives, in order; the stream ends when the peer
/// closes, and yields the connection's failure, if any, once.
impl<E: Endpoint + Unpin> Stream for AsyncConnection<E> {
    type Item = Result<Message, Arc<ConnectionError>>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let received = self
            .get_mut()
            .with(|state| state.keeping_armed(cx, Call::Recv, State::poll_recv));
        match ready!(received) {
            Ok(message) => Poll::Ready(Some(Ok(message))),
            Err(error) if matches!(*error, ConnectionError::PeerClosed) => Poll::Ready(None),
            Err(error) => Poll::Ready(Some(Err(error))),
        }
    }
}

/// Messages to send, each taken whole: `start_send` posts what it can at once and keeps
/// only the rest (a copy), which `poll_ready` and `poll_flush` post before anything else.
impl<E: Endpoint + Unpin, B: AsRef<[u8]>> Sink<B> for AsyncConnection<E> {
    type Error = Arc<ConnectionError>;

    fn poll_ready(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.get_mut().with(|state| {
            state.keeping_armed(cx, Call::Send, |this, cx| {
                loop {
                    this.disarm();
                    if this.post_sunk().map_err(failure_of)? || this.sinking.has_room() {
                        return Poll::Ready(Ok(()));
                    }
                    ready!(this.poll_event(cx));
                }
            })
        })
    }

    fn start_send(self: Pin<&mut Self>, item: B) -> Result<(), Self::Error> {
        self.get_mut().with(|state| state.start_send(item.as_ref()))
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.get_mut()
            .with(|state| state.keeping_armed(cx, Call::Send, State::poll_flushed))
    }

    fn poll_close(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.get_mut()
            .with(|state| state.keeping_armed(cx, Call::Send, State::poll_flushed))
    }
}

impl<E: Endpoint> State<E> {
    /// [`Sink::start_send`] of `message`.
    fn start_send(&mut self, message: &[u8]) -> Result<(), Arc<ConnectionError>> {
        let this = self;
        if !this.sinking.messages.is_empty() {
            // Behind messages waiting for credit: it waits with them, to share their
            // frames if it is small.
            this.sinking.push(message.to_vec());
            return Ok(());
        }
        match this.connection.try_send_some(message) {
            Ok(taken) if taken == message.len() => {}
            Ok(taken) => this.sinking.push_begun(&message[taken..]),
            // Not taken, or taken on with nothing posted: offered whole again either way.
            Err(SendError::WouldBlock(_)) => this.sinking.push_begun(message),
            Err(error) => return Err(failure_of(error)),
        }
        Ok(())
    }
}
