//! [`ConnectionTable`]: connections kept by id in a concurrent map (`dashmap`), and an
//! optional progress thread that looks at those that had an event, so that every
//! connection makes progress even when its owner does not call it, and idle connections
//! cost nothing. `docs/connection.md` ("Connection tables and the progress thread") gives
//! the design.
//!
//! # Invariants
//!
//! - Each connection sits in its own entry behind its own mutex. Users lock it
//!   ([`SharedConnection::lock`]); the progress thread and the waits only ever *try* the
//!   lock and pass over a connection that is held, so they never wait on a user, and a
//!   user waits on them for at most one look at that one connection.
//! - A map shard's lock is held only to insert, look up or remove an entry, or to copy
//!   the handles of the entries; never while a connection makes progress, and never
//!   while a connection's mutex is taken. So no lock is ever taken under another and
//!   nothing can deadlock.
//! - Removing a connection (or clearing or dropping the table) takes it out of its entry
//!   and drops it: its endpoint is closed first, then its buffers are released, so every
//!   registered byte goes back to the budget, except receive slots still held by
//!   undropped messages, which go back when those are dropped. Handles to a removed
//!   connection report [`TableError::Closed`].
//! - The progress thread is driven by readiness, as the waits are: it sleeps on its own
//!   ready set (`readiness`, whose invariants make sure no wake is lost) and looks
//!   only at the connections queued there. A look that made progress queues the
//!   connection for the waiters too, since its user may have work now; the thread then
//!   arms it again, whatever its user has left untaken, so a connection whose messages
//!   wait for their user costs the thread nothing.
//! - Stopping the thread ([`ConnectionTable::shutdown`], or dropping the table) sets
//!   `stop`, rings the thread's doorbell and joins it; it touches nothing of the table
//!   afterwards.
//! - The table's part in readiness is to queue a connection for a look in both sets
//!   whenever it may have changed outside a look: when it is inserted, when a user's
//!   guard is dropped, and when a sweep ([`ConnectionTable::sweep`]) did work on it; and
//!   in the waiters' set when the last wait handed it out.

use std::collections::HashSet;
use std::fmt;
use std::ops::{Deref, DerefMut};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, TryLockError};
use std::task::Waker;
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use dashmap::DashMap;

use super::driver::Connection;
use super::readiness::{Doorway, Doorways, LONGEST_SLEEP, Parkable, ReadySet};
use crate::provider::{Armed, Endpoint, Readiness};

/// The name of a connection in its [`ConnectionTable`]; a table never gives one out
/// twice.
///
/// ```
/// # use tierbuf_transport::connection::ConnectionTable;
/// # use tierbuf_transport::LoopbackEndpoint;
/// let table = ConnectionTable::<LoopbackEndpoint>::new();
/// assert!(table.get(tierbuf_transport::connection::ConnectionId::new(7)).is_none());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ConnectionId(u64);

impl ConnectionId {
    /// The id with number `id` (ids a table gives out count up from 1).
    pub const fn new(id: u64) -> ConnectionId {
        ConnectionId(id)
    }

    /// The number.
    pub const fn get(self) -> u64 {
        self.0
    }
}

impl fmt::Display for ConnectionId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "connection {}", self.0)
    }
}

/// Why a table operation failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TableError {
    /// The connection was removed from its table (and closed).
    #[error("{id} was removed from its table")]
    Closed {
        /// The connection.
        id: ConnectionId,
    },
    /// The operating system refused to start the progress thread.
    #[error("starting the progress thread failed")]
    Spawn(#[source] std::io::Error),
    /// The progress thread panicked; the table has no progress thread any more.
    #[error("the progress thread panicked: {message}")]
    ProgressThreadPanicked {
        /// The panic's message.
        message: String,
    },
    /// The progress thread could not wait on its ready set (`epoll_wait` failed) and
    /// stopped; the table has no progress thread any more.
    #[error("the progress thread stopped: waiting for ready connections failed")]
    ProgressThreadFailed(#[source] std::io::Error),
    /// Making or waiting on the readiness set (`epoll`, `eventfd`) failed: a limit of
    /// this process (open files) or of the system.
    #[error("waiting for ready connections failed")]
    Readiness(#[source] std::io::Error),
}

/// How the progress thread sleeps. It sleeps until a connection has an event (a frame
/// from its peer, a message dropped, a user's unlock) or a timer of one falls due, and
/// then looks only at those. While some connection cannot wake it (an endpoint that
/// must be polled, such as verbs), it sleeps at most `max_park` at a time. A connection
/// its user held when the thread came to it is looked at again a millisecond later (and
/// when the user unlocks it), whatever `max_park` says.
///
/// ```
/// use std::time::Duration;
/// use tierbuf_transport::connection::ProgressConfig;
/// let config = ProgressConfig::default().with_max_park(Duration::from_millis(5));
/// assert_eq!(config.max_park(), Duration::from_millis(5));
/// assert_eq!(ProgressConfig::default().max_park(), Duration::from_millis(1));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProgressConfig {
    max_park: Duration,
}

impl Default for ProgressConfig {
    /// Polls at most a millisecond apart.
    fn default() -> ProgressConfig {
        ProgressConfig {
            max_park: LONGEST_SLEEP,
        }
    }
}

impl ProgressConfig {
    /// Sets the longest sleep while some connection must be polled: how late, at worst,
    /// the thread notices the work of a connection that cannot wake it.
    pub fn with_max_park(mut self, max_park: Duration) -> ProgressConfig {
        self.max_park = max_park;
        self
    }

    /// The longest sleep while some connection must be polled.
    pub fn max_park(&self) -> Duration {
        self.max_park
    }
}

/// Counters of a table's progress: its progress thread's looks, and the sweeps by
/// [`ConnectionTable::sweep`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ProgressStats {
    /// Sweeps over the whole table by [`ConnectionTable::sweep`] (the progress thread
    /// does not sweep: it looks at the connections that had an event).
    pub sweeps: u64,
    /// Connections a sweep or the progress thread made progress on.
    pub progressed: u64,
    /// Connections a sweep or the progress thread passed over because a user held them.
    pub skipped_busy: u64,
    /// Times the progress thread went to sleep: once per round of looks.
    pub parks: u64,
}

/// One connection of a table.
struct Entry<E: Endpoint> {
    id: ConnectionId,
    /// `None` once removed from the table.
    connection: Mutex<Option<Connection<E>>>,
    doorways: Arc<Doorways>,
    /// The waker its endpoint calls: `doorways`, queueing it in every ready set.
    waker: Waker,
}

impl<E: Endpoint> Entry<E> {
    /// Takes the connection out and drops it, closing it and releasing its buffers; its
    /// wake descriptor leaves the ready sets first.
    fn close(&self, waiters: &ReadySet, progress: Option<&ReadySet>) {
        let connection = self
            .connection
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let Some(connection) = &connection
            && let Readiness::Fd(fd) = connection.endpoint().readiness()
        {
            waiters.deregister(fd);
            if let Some(progress) = progress {
                progress.deregister(fd);
            }
        }
        drop(connection);
    }
}

#[derive(Default)]
struct Counters {
    sweeps: AtomicU64,
    progressed: AtomicU64,
    skipped_busy: AtomicU64,
    parks: AtomicU64,
}

/// Who looks at a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Looker {
    /// A user's [`ConnectionTable::wait_ready`]: hands out connections with work for
    /// their users.
    Waiter,
    /// The progress thread: makes progress, and tells the waiters where it did.
    ProgressThread,
}

/// The progress thread's ready set and its stop flag.
struct ProgressSet {
    ready: Arc<ReadySet>,
    stop: AtomicBool,
}

/// What the table and its progress thread share.
struct Shared<E: Endpoint> {
    connections: DashMap<ConnectionId, Arc<Entry<E>>>,
    next_id: AtomicU64,
    counters: Counters,
    /// The waiters' ready set.
    ready: Arc<ReadySet>,
    /// The progress thread's, while the table has one.
    progress: Option<Arc<ProgressSet>>,
    /// Connections that cannot wake a waiter: looked at by every wait.
    polled: Mutex<HashSet<ConnectionId>>,
    /// Connections the last wait handed out, queued again by the next.
    handed_out: Mutex<Vec<ConnectionId>>,
}

impl<E: Endpoint> Shared<E> {
    /// Progress passes one look makes at most while arming finds work pending.
    const PASSES_PER_LOOK: usize = 3;

    fn polled(&self) -> MutexGuard<'_, HashSet<ConnectionId>> {
        self.polled.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn handed_out(&self) -> MutexGuard<'_, Vec<ConnectionId>> {
        self.handed_out
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    fn entries(&self) -> Vec<Arc<Entry<E>>> {
        self.connections
            .iter()
            .map(|entry| Arc::clone(entry.value()))
            .collect()
    }

    /// Queues connection `id` for a waiter's look, if it is still in the table.
    fn queue_for_waiters(&self, id: ConnectionId) {
        if let Some(entry) = self.connections.get(&id) {
            entry.doorways.waiter.queue();
        }
    }

    /// The entry of connection `id`, if it is still in the table.
    fn entry(&self, id: ConnectionId) -> Option<Arc<Entry<E>>> {
        self.connections
            .get(&id)
            .map(|entry| Arc::clone(entry.value()))
    }

    /// Registers the descriptor of a connection inserted before the readiness set was
    /// made; one that cannot be registered is polled.
    fn register_existing(&self, entry: &Entry<E>) {
        let connection = entry
            .connection
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(connection) = connection.as_ref()
            && let Readiness::Fd(fd) = connection.endpoint().readiness()
            && self.ready.register(entry.id, fd).is_err()
        {
            self.polled().insert(entry.id);
        }
    }

    /// Looks at one connection for `looker`: disarms it, makes progress, and arms it
    /// again (`readiness/set.rs`). A waiter's look hands it out instead if it has work for
    /// its user; the progress thread's queues it for the waiters when it made progress,
    /// and goes on. Returns whether the connection may have work for its user, or
    /// failed: a waiter hands it out (the progress thread has queued it for the waiters
    /// already). Otherwise it is armed, or queued to be looked at again: at once if it is
    /// still busy, after a polling sleep if it is held or has work no wake announces.
    fn look(&self, entry: &Entry<E>, looker: Looker, set: &ReadySet) -> bool {
        let doorway = match looker {
            Looker::Waiter => &entry.doorways.waiter,
            Looker::ProgressThread => entry
                .doorways
                .progress
                .as_ref()
                .expect("the progress thread looks at connections with its doorway"),
        };
        doorway.take();
        let mut guard = match entry.connection.try_lock() {
            Ok(guard) => guard,
            Err(TryLockError::WouldBlock) => {
                // Looked at again after a short sleep: the holder may be another looker,
                // whose unlock queues nothing here when it found nothing to do.
                doorway.queue_later();
                if looker == Looker::ProgressThread {
                    self.counters.skipped_busy.fetch_add(1, Ordering::Relaxed);
                }
                return false;
            }
            Err(TryLockError::Poisoned(poisoned)) => poisoned.into_inner(),
        };
        let Some(connection) = guard.as_mut() else {
            return false;
        };
        if looker == Looker::ProgressThread {
            self.counters.progressed.fetch_add(1, Ordering::Relaxed);
        }
        // Work that lands between the progress and the arm makes the arm pending: a few
        // more passes take it, before the connection is left for a later look.
        let mut progressed = false;
        for _ in 0..Shared::<E>::PASSES_PER_LOOK {
            connection.disarm();
            let Ok(did) = connection.progress_counted() else {
                // Failed for good: the error is its user's. The thread has nothing more
                // to do on it until the user acts, and the user's unlock queues it.
                if looker == Looker::ProgressThread {
                    entry.doorways.waiter.queue();
                }
                return true;
            };
            let changed = did > 0;
            progressed |= changed;
            match looker {
                Looker::Waiter if changed || connection.has_delivered() => return true,
                Looker::ProgressThread if changed => entry.doorways.waiter.queue(),
                _ => {}
            }
            if connection.arm(&entry.waker) == Armed::Parked {
                if let Some(at) = connection.next_timer() {
                    set.add_timer(at, Instant::now(), entry.id);
                }
                return false;
            }
        }
        connection.disarm();
        if progressed {
            // Still busy: looked at again in the next round, without a sleep.
            doorway.queue();
        } else {
            doorway.queue_later();
        }
        false
    }

    /// Tries every connection once; returns how much the progress calls did (completions
    /// taken plus work requests posted).
    fn sweep(&self) -> usize {
        let (mut done, mut progressed, mut skipped_busy) = (0, 0, 0);
        for entry in self.entries() {
            let mut guard = match entry.connection.try_lock() {
                Ok(guard) => guard,
                Err(TryLockError::WouldBlock) => {
                    skipped_busy += 1;
                    continue;
                }
                Err(TryLockError::Poisoned(poisoned)) => poisoned.into_inner(),
            };
            if let Some(connection) = guard.as_mut() {
                progressed += 1;
                // A failed connection keeps its error for its users, and is looked at.
                let did = connection.progress_counted().unwrap_or(1);
                if did > 0 {
                    entry.doorways.queue();
                }
                done += did;
            }
        }
        let counters = &self.counters;
        counters.sweeps.fetch_add(1, Ordering::Relaxed);
        counters.progressed.fetch_add(progressed, Ordering::Relaxed);
        counters
            .skipped_busy
            .fetch_add(skipped_busy, Ordering::Relaxed);
        done
    }

    /// The progress thread: looks at the connections queued in its set, then sleeps
    /// until more are, until stopped.
    ///
    /// # Errors
    ///
    /// The operating system's, from `epoll_wait`.
    fn run_progress(&self, progress: &ProgressSet, config: ProgressConfig) -> std::io::Result<()> {
        /// How far ahead an idle thread's sleep ends (it is woken for any work sooner).
        const IDLE_SLEEP: Duration = Duration::from_secs(3600);
        let set = &*progress.ready;
        let mut round = Vec::new();
        while !progress.stop.load(Ordering::SeqCst) {
            for id in self.polled().iter().copied() {
                set.push_polled(id);
            }
            // A round takes what is queued now: a connection that queues itself again
            // (still busy) waits for the next, after the `epoll` set is read.
            round.extend(std::iter::from_fn(|| set.pop()));
            for id in round.drain(..) {
                if let Some(entry) = self.entry(id) {
                    self.look(&entry, Looker::ProgressThread, set);
                }
            }
            let polling = !self.polled().is_empty();
            self.counters.parks.fetch_add(1, Ordering::Relaxed);
            set.sleep(
                Instant::now() + IDLE_SLEEP,
                polling.then_some(config.max_park),
            )?;
        }
        Ok(())
    }
}

/// Connections by id, over endpoints of type `E`, optionally with a progress thread that
/// serves them as they have events.
///
/// Users [`insert`](ConnectionTable::insert) connections and get a [`SharedConnection`]
/// handle back, which any thread can [`lock`](SharedConnection::lock) to use the
/// connection; [`get`](ConnectionTable::get) finds the handle by id. Keep the handle
/// rather than looking it up for every message: the lookup takes a map shard's lock.
/// [`remove`](ConnectionTable::remove), [`clear`](ConnectionTable::clear) and dropping the
/// table close the connections and release their buffers.
///
/// ```
/// use std::sync::Arc;
/// use std::time::Instant;
/// use tierbuf_pool::MemoryBudget;
/// use tierbuf_tiers::{Reservoir, ladder::TierLadder};
/// use tierbuf_transport::connection::{
///     Connection, ConnectionConfig, ConnectionCore, ConnectionTable, ProgressConfig,
/// };
/// use tierbuf_transport::{LoopbackProvider, Provider};
///
/// let budget = MemoryBudget::with_cap(16 << 20);
/// let provider = LoopbackProvider::new(budget.clone());
/// let config = Arc::new(ConnectionConfig::new(Arc::new(TierLadder::preset("two-tier")?))?);
/// let reservoir = Arc::new(Reservoir::new(provider.registrar(), Arc::clone(config.ladder())));
/// let core = || {
///     let reservoir = Arc::clone(&reservoir);
///     ConnectionCore::new(Arc::clone(&config), Arc::clone(&reservoir), reservoir, Instant::now())
/// };
/// let (a, b) = provider.pair(64, 64)?;
///
/// let table = ConnectionTable::with_progress_thread(ProgressConfig::default())?;
/// let sender = table.insert(Connection::new(core()?, a)?);
/// let receiver = table.insert(Connection::new(core()?, b)?);
/// // Neither side calls `progress`: the table's thread does.
/// while sender.lock()?.try_send(b"hello").is_err() {
///     std::thread::yield_now();
/// }
/// let message = loop {
///     if let Some(message) = receiver.lock()?.next_delivered() {
///         break message;
///     }
///     std::thread::yield_now();
/// };
/// assert_eq!(&message[..], b"hello");
/// drop(message);
/// assert!(table.remove(receiver.id()));
/// assert!(receiver.lock().is_err(), "removed connections are closed");
/// drop(table);
/// assert_eq!(budget.in_use(), 0);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct ConnectionTable<E: Endpoint + 'static> {
    shared: Arc<Shared<E>>,
    progress: Option<JoinHandle<std::io::Result<()>>>,
}

impl<E: Endpoint + 'static> Default for ConnectionTable<E> {
    fn default() -> ConnectionTable<E> {
        ConnectionTable::new()
    }
}

impl<E: Endpoint + 'static> ConnectionTable<E> {
    /// An empty table without a progress thread: its connections progress when their
    /// users call them, or when someone calls [`ConnectionTable::sweep`].
    ///
    /// ```
    /// use tierbuf_transport::LoopbackEndpoint;
    /// use tierbuf_transport::connection::ConnectionTable;
    /// let table = ConnectionTable::<LoopbackEndpoint>::new();
    /// assert!(table.is_empty());
    /// assert_eq!(table.sweep(), 0);
    /// ```
    pub fn new() -> ConnectionTable<E> {
        ConnectionTable::with_progress_set(None)
    }

    fn with_progress_set(progress: Option<Arc<ProgressSet>>) -> ConnectionTable<E> {
        ConnectionTable {
            shared: Arc::new(Shared {
                connections: DashMap::new(),
                next_id: AtomicU64::new(1),
                counters: Counters::default(),
                ready: Arc::default(),
                progress,
                polled: Mutex::default(),
                handed_out: Mutex::default(),
            }),
            progress: None,
        }
    }

    /// An empty table with a progress thread that makes progress on its connections as
    /// they have events, sleeping as `config` says while none has.
    ///
    /// ```
    /// use tierbuf_transport::LoopbackEndpoint;
    /// use tierbuf_transport::connection::{ConnectionTable, ProgressConfig};
    /// let mut table = ConnectionTable::<LoopbackEndpoint>::with_progress_thread(ProgressConfig::default())?;
    /// assert!(table.has_progress_thread());
    /// table.shutdown()?;
    /// assert!(!table.has_progress_thread());
    /// # Ok::<(), tierbuf_transport::connection::TableError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`TableError::Readiness`] when the thread's `epoll` set cannot be made,
    /// [`TableError::Spawn`] when the thread cannot be started.
    pub fn with_progress_thread(config: ProgressConfig) -> Result<ConnectionTable<E>, TableError> {
        let progress = Arc::new(ProgressSet {
            ready: Arc::new(ReadySet::for_progress_thread().map_err(TableError::Readiness)?),
            stop: AtomicBool::new(false),
        });
        let mut table = ConnectionTable::with_progress_set(Some(Arc::clone(&progress)));
        let shared = Arc::clone(&table.shared);
        let handle = thread::Builder::new()
            .name("tierbuf-progress".into())
            .spawn(move || {
                let ran = shared.run_progress(&progress, config);
                // Stopped for good: connections inserted from now on skip its set.
                progress.stop.store(true, Ordering::SeqCst);
                ran
            })
            .map_err(TableError::Spawn)?;
        table.progress = Some(handle);
        Ok(table)
    }

    /// The progress thread's set, while it runs.
    fn running_progress_set(&self) -> Option<&Arc<ReadySet>> {
        let progress = self.shared.progress.as_ref()?;
        (!progress.stop.load(Ordering::SeqCst)).then_some(&progress.ready)
    }

    /// Adds `connection` under a new id and returns its handle.
    ///
    /// See [`ConnectionTable`] for an example.
    pub fn insert(&self, connection: Connection<E>) -> SharedConnection<E> {
        let id = ConnectionId(self.shared.next_id.fetch_add(1, Ordering::Relaxed));
        let progress = self.running_progress_set();
        let doorways = Arc::new(Doorways {
            waiter: Doorway::new(id, Arc::clone(&self.shared.ready)),
            progress: progress.map(|set| Doorway::new(id, Arc::clone(set))),
        });
        let polled = match connection.endpoint().readiness() {
            Readiness::Fd(fd) => {
                self.shared.ready.register(id, fd).is_err()
                    || progress.is_some_and(|set| set.register(id, fd).is_err())
            }
            Readiness::Waker => false,
            _ => true,
        };
        if polled {
            self.shared.polled().insert(id);
        }
        let entry = Arc::new(Entry {
            id,
            connection: Mutex::new(Some(connection)),
            waker: Waker::from(Arc::clone(&doorways)),
            doorways,
        });
        self.shared.connections.insert(id, Arc::clone(&entry));
        entry.doorways.queue();
        SharedConnection { entry }
    }

    /// Waits until at least one connection may have work for its user, or `timeout`
    /// passes, and puts the handles of those that may into `ready` (cleared first);
    /// returns how many. Such a connection has a message delivered, made progress (a
    /// credit came back: send room), or failed; lock it and take its messages. Idle
    /// connections cost nothing while the thread sleeps: each is armed to wake it
    /// ([`Endpoint::arm`]), by its descriptor in an `epoll` set (shared memory) or its
    /// waker (loopback), and only the connections that woke are looked at. One that
    /// cannot wake anybody (verbs) is looked at in every wait, and a wait over such
    /// connections sleeps at most a millisecond at a time.
    ///
    /// A connection handed out is looked at again by the next wait, and whenever a
    /// guard of it is dropped; several threads may wait at once, each getting a share.
    ///
    /// ```
    /// use std::time::Duration;
    /// # use std::sync::Arc;
    /// # use std::time::Instant;
    /// # use tierbuf_pool::MemoryBudget;
    /// # use tierbuf_tiers::{Reservoir, ladder::TierLadder};
    /// # use tierbuf_transport::connection::{Connection, ConnectionConfig, ConnectionCore, ConnectionTable};
    /// # use tierbuf_transport::{LoopbackProvider, Provider};
    /// # let provider = LoopbackProvider::new(MemoryBudget::with_cap(64 << 20));
    /// # let config = Arc::new(ConnectionConfig::new(Arc::new(TierLadder::preset("two-tier")?))?);
    /// # let reservoir = Arc::new(Reservoir::new(provider.registrar(), Arc::clone(config.ladder())));
    /// # let connect = |endpoint| {
    /// #     let core = ConnectionCore::new(
    /// #         Arc::clone(&config), Arc::clone(&reservoir), Arc::clone(&reservoir), Instant::now(),
    /// #     )?;
    /// #     Ok::<_, Box<dyn std::error::Error>>(Connection::new(core, endpoint)?)
    /// # };
    /// let server = ConnectionTable::new();
    /// let mut clients = Vec::new();
    /// for _ in 0..100 {
    ///     let (client, served) = provider.pair(config.queue_depth(), config.queue_depth())?;
    ///     clients.push(connect(client)?);
    ///     server.insert(connect(served)?);
    /// }
    /// clients[42].send(b"hello")?;
    /// let mut ready = Vec::new();
    /// let message = 'found: loop {
    ///     server.wait_ready(&mut ready, Duration::from_secs(5))?;
    ///     for connection in &ready {
    ///         if let Some(message) = connection.lock()?.try_recv()? {
    ///             break 'found message;
    ///         }
    ///     }
    /// };
    /// assert_eq!(&message[..], b"hello");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`TableError::Readiness`] when the `epoll` set cannot be made or waited on.
    pub fn wait_ready(
        &self,
        ready: &mut Vec<SharedConnection<E>>,
        timeout: Duration,
    ) -> Result<usize, TableError> {
        ready.clear();
        let shared = &*self.shared;
        let until = Instant::now() + timeout;
        if shared.ready.descriptors().map_err(TableError::Readiness)? {
            // The set is new: every connection's descriptor goes in, and each is looked at.
            for entry in shared.entries() {
                shared.register_existing(&entry);
                entry.doorways.waiter.queue();
            }
        }
        for id in std::mem::take(&mut *shared.handed_out()) {
            shared.queue_for_waiters(id);
        }
        loop {
            for id in shared.polled().iter().copied() {
                shared.ready.push_polled(id);
            }
            while let Some(id) = shared.ready.pop() {
                let Some(entry) = shared.entry(id) else {
                    continue;
                };
                if shared.look(&entry, Looker::Waiter, &shared.ready) {
                    ready.push(SharedConnection { entry });
                }
            }
            if !ready.is_empty() {
                shared
                    .handed_out()
                    .extend(ready.iter().map(SharedConnection::id));
                return Ok(ready.len());
            }
            let polling = !shared.polled().is_empty();
            let woken = shared
                .ready
                .sleep(until, polling.then_some(LONGEST_SLEEP))
                .map_err(TableError::Readiness)?;
            if woken.timed_out || Instant::now() >= until {
                return Ok(0);
            }
        }
    }

    /// The handle of connection `id`, if it is in the table.
    ///
    /// See [`ConnectionTable`] for an example.
    pub fn get(&self, id: ConnectionId) -> Option<SharedConnection<E>> {
        self.shared
            .connections
            .get(&id)
            .map(|entry| SharedConnection {
                entry: Arc::clone(entry.value()),
            })
    }

    /// Removes connection `id` and closes it: its endpoint is closed and its buffers go
    /// back to their budget (receive slots held by messages when those are dropped).
    /// Waits for a user that holds the connection locked, so a thread must not call it
    /// while it holds that connection's guard. Returns whether it was there.
    ///
    /// See [`ConnectionTable`] for an example.
    pub fn remove(&self, id: ConnectionId) -> bool {
        // The shard lock is released before the connection's lock is taken.
        let removed = self.shared.connections.remove(&id);
        match removed {
            Some((_, entry)) => {
                self.shared.polled().remove(&id);
                let progress = self.shared.progress.as_ref().map(|set| &*set.ready);
                entry.close(&self.shared.ready, progress);
                true
            }
            None => false,
        }
    }

    /// Removes and closes every connection, as [`ConnectionTable::remove`] does (and
    /// dropping the table does).
    ///
    /// ```
    /// use tierbuf_transport::LoopbackEndpoint;
    /// use tierbuf_transport::connection::ConnectionTable;
    /// let table = ConnectionTable::<LoopbackEndpoint>::new();
    /// table.clear();
    /// assert_eq!(table.len(), 0);
    /// ```
    pub fn clear(&self) {
        for id in self.ids() {
            self.remove(id);
        }
    }

    /// The ids of the connections in the table now, in no particular order.
    ///
    /// ```
    /// use tierbuf_transport::LoopbackEndpoint;
    /// use tierbuf_transport::connection::ConnectionTable;
    /// assert!(ConnectionTable::<LoopbackEndpoint>::new().ids().is_empty());
    /// ```
    pub fn ids(&self) -> Vec<ConnectionId> {
        self.shared
            .connections
            .iter()
            .map(|entry| *entry.key())
            .collect()
    }

    /// How many connections the table holds.
    ///
    /// ```
    /// use tierbuf_transport::LoopbackEndpoint;
    /// use tierbuf_transport::connection::ConnectionTable;
    /// assert_eq!(ConnectionTable::<LoopbackEndpoint>::new().len(), 0);
    /// ```
    pub fn len(&self) -> usize {
        self.shared.connections.len()
    }

    /// Whether the table holds no connection.
    ///
    /// ```
    /// use tierbuf_transport::LoopbackEndpoint;
    /// use tierbuf_transport::connection::ConnectionTable;
    /// assert!(ConnectionTable::<LoopbackEndpoint>::new().is_empty());
    /// ```
    pub fn is_empty(&self) -> bool {
        self.shared.connections.is_empty()
    }

    /// Makes progress on every connection no one holds locked, once, on the calling
    /// thread: for a table without a progress thread. Returns how much it did
    /// (completions taken plus work requests posted, and one for each failed connection,
    /// whose user has an error to take); 0 means there was nothing to do.
    ///
    /// See [`ConnectionTable::new`] for an example.
    pub fn sweep(&self) -> usize {
        self.shared.sweep()
    }

    /// Counters of the sweeps and of the progress thread's looks so far.
    ///
    /// ```
    /// use tierbuf_transport::LoopbackEndpoint;
    /// use tierbuf_transport::connection::ConnectionTable;
    /// let table = ConnectionTable::<LoopbackEndpoint>::new();
    /// table.sweep();
    /// assert_eq!(table.progress_stats().sweeps, 1);
    /// ```
    pub fn progress_stats(&self) -> ProgressStats {
        let counters = &self.shared.counters;
        ProgressStats {
            sweeps: counters.sweeps.load(Ordering::Relaxed),
            progressed: counters.progressed.load(Ordering::Relaxed),
            skipped_busy: counters.skipped_busy.load(Ordering::Relaxed),
            parks: counters.parks.load(Ordering::Relaxed),
        }
    }

    /// Whether a progress thread runs for this table.
    ///
    /// See [`ConnectionTable::with_progress_thread`] for an example.
    pub fn has_progress_thread(&self) -> bool {
        self.progress.is_some()
    }

    /// Stops the progress thread, if one runs, and waits for it to finish its round of
    /// looks. The connections stay in the table and progress when their users call them.
    /// Reports a panic of the thread, or the failure that stopped it.
    ///
    /// See [`ConnectionTable::with_progress_thread`] for an example.
    pub fn shutdown(&mut self) -> Result<(), TableError> {
        let Some(handle) = self.progress.take() else {
            return Ok(());
        };
        if let Some(progress) = &self.shared.progress {
            progress.stop.store(true, Ordering::SeqCst);
            progress.ready.ring();
        }
        handle
            .join()
            .map_err(|payload| TableError::ProgressThreadPanicked {
                message: payload
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| payload.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_else(|| "a non-string panic".to_string()),
            })?
            .map_err(TableError::ProgressThreadFailed)
    }
}

impl<E: Endpoint + 'static> Drop for ConnectionTable<E> {
    fn drop(&mut self) {
        if let Err(error) = self.shutdown() {
            tracing::error!(%error, "the connection table's progress thread failed");
        }
        self.clear();
    }
}

impl<E: Endpoint + 'static> fmt::Debug for ConnectionTable<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ConnectionTable")
            .field("connections", &self.len())
            .field("progress_thread", &self.has_progress_thread())
            .field("stats", &self.progress_stats())
            .finish()
    }
}

/// A handle to one connection of a [`ConnectionTable`]; clones name the same connection.
///
/// See [`ConnectionTable`] for an example.
pub struct SharedConnection<E: Endpoint> {
    entry: Arc<Entry<E>>,
}

impl<E: Endpoint> Clone for SharedConnection<E> {
    fn clone(&self) -> SharedConnection<E> {
        SharedConnection {
            entry: Arc::clone(&self.entry),
        }
    }
}

impl<E: Endpoint> SharedConnection<E> {
    /// The connection's id in its table.
    ///
    /// See [`ConnectionTable`] for an example.
    pub fn id(&self) -> ConnectionId {
        self.entry.id
    }

    /// Locks the connection for this thread, waiting for another user that holds it (the
    /// progress thread holds it for at most one progress call). Unlocking it (dropping
    /// the guard) wakes the table's progress thread for the work it may have queued.
    /// A connection that a panic left locked is handed over as it is.
    ///
    /// See [`ConnectionTable`] for an example.
    pub fn lock(&self) -> Result<ConnectionGuard<'_, E>, TableError> {
        let guard = self
            .entry
            .connection
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if guard.is_none() {
            return Err(TableError::Closed { id: self.entry.id });
        }
        Ok(ConnectionGuard {
            guard: Some(guard),
            entry: &self.entry,
        })
    }
}

impl<E: Endpoint> fmt::Debug for SharedConnection<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SharedConnection")
            .field("id", &self.entry.id)
            .finish_non_exhaustive()
    }
}

/// A connection locked by [`SharedConnection::lock`]; unlocks when dropped.
pub struct ConnectionGuard<'a, E: Endpoint> {
    /// `Some` holding `Some` until dropped: the lock is released before the wake.
    guard: Option<MutexGuard<'a, Option<Connection<E>>>>,
    entry: &'a Entry<E>,
}

impl<E: Endpoint> Deref for ConnectionGuard<'_, E> {
    type Target = Connection<E>;

    fn deref(&self) -> &Connection<E> {
        self.guard
            .as_deref()
            .and_then(Option::as_ref)
            .expect("a guard holds a present connection until it is dropped")
    }
}

impl<E: Endpoint> DerefMut for ConnectionGuard<'_, E> {
    fn deref_mut(&mut self) -> &mut Connection<E> {
        self.guard
            .as_deref_mut()
            .and_then(Option::as_mut)
            .expect("a guard holds a present connection until it is dropped")
    }
}

impl<E: Endpoint> Drop for ConnectionGuard<'_, E> {
    fn drop(&mut self) {
        drop(self.guard.take());
        self.entry.doorways.queue();
    }
}

impl<E: Endpoint> fmt::Debug for ConnectionGuard<'_, E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("ConnectionGuard").field(&**self).finish()
    }
}
