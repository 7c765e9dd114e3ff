//! [`ConnectionTable`]: connections kept by id in a concurrent map (`dashmap`), and an
//! optional progress thread that sweeps them, so that every connection makes progress
//! even when its owner does not call it. `docs/connection.md` ("Connection tables and the
//! progress thread") gives the design.
//!
//! # Invariants
//!
//! - Each connection sits in its own entry behind its own mutex. Users lock it
//!   ([`SharedConnection::lock`]); the progress thread only ever *tries* the lock and skips
//!   a connection that is held, so it never waits on a user, and a user waits on it for at
//!   most one [`Connection::progress`] of that one connection.
//! - A map shard's lock is held only to insert, look up or remove an entry, or to copy
//!   the handles of the entries; never while a connection makes progress, and never
//!   while a connection's mutex is taken. So no lock is ever taken under another and
//!   nothing can deadlock.
//! - Removing a connection (or clearing or dropping the table) takes it out of its entry
//!   and drops it: its endpoint is closed first, then its buffers are released, so every
//!   registered byte goes back to the budget, except receive slots still held by
//!   undropped messages, which go back when those are dropped. Handles to a removed
//!   connection report [`TableError::Closed`].
//! - A wake is never lost: a waker that sets `pending` (from clear) unparks the progress
//!   thread, and `std::thread`'s park token makes a park that comes after that unpark
//!   return at once; the thread takes `pending` before each sweep, so the sweep after the
//!   wake sees the work. `pending` only spares the unpark of wakes that come while one is
//!   already pending, and the park of a thread that is already woken. Sleeps are bounded
//!   all the same
//!   ([`ProgressConfig::with_max_park`]): work also arrives from peers, which cannot wake
//!   this process's thread.
//! - Stopping the thread ([`ConnectionTable::shutdown`], or dropping the table) sets
//!   `stop`, wakes the thread and joins it; it touches nothing of the table afterwards.
//! - Readiness ([`ConnectionTable::wait_ready`]) keeps its own invariants (module
//!   `ready`); the table's part is to queue a connection for a look whenever it may have
//!   changed outside a look: when it is inserted, when a user's guard is dropped, when a
//!   sweep did work on it, and when the last wait handed it out.

use std::collections::HashSet;
use std::fmt;
use std::ops::{Deref, DerefMut};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError, TryLockError};
use std::task::Waker;
use std::thread::{self, JoinHandle, Thread};
use std::time::{Duration, Instant};

use crossbeam_utils::Backoff;
use dashmap::DashMap;

use super::driver::Connection;
use super::ready::{Doorway, ReadySet};
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
    /// Making or waiting on the readiness set (`epoll`, `eventfd`) failed: a limit of
    /// this process (open files) or of the system.
    #[error("waiting for ready connections failed")]
    Readiness(#[source] std::io::Error),
}

/// How the progress thread backs off when a sweep finds nothing to do: it spins, then
/// yields (crossbeam's `Backoff`, sweeping again after each step), then sleeps for
/// `first_park`, doubling each time up to `max_park`, until it is woken or a sweep finds
/// work.
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
    first_park: Duration,
    max_park: Duration,
}

impl Default for ProgressConfig {
    /// Sleeps from 20 µs up to 1 ms.
    fn default() -> ProgressConfig {
        ProgressConfig {
            first_park: Duration::from_micros(20),
            max_park: Duration::from_millis(1),
        }
    }
}

impl ProgressConfig {
    /// Sets the longest sleep: how late, at worst, an idle table notices work that nothing
    /// in this process announced (a message from a peer, a timer).
    pub fn with_max_park(mut self, max_park: Duration) -> ProgressConfig {
        self.max_park = max_park;
        self.first_park = self.first_park.min(max_park);
        self
    }

    /// The longest sleep.
    pub fn max_park(&self) -> Duration {
        self.max_park
    }
}

/// Counters of a table's sweeps, by its progress thread or by [`ConnectionTable::sweep`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ProgressStats {
    /// Sweeps over the whole table completed.
    pub sweeps: u64,
    /// Connections a sweep made progress on.
    pub progressed: u64,
    /// Connections a sweep skipped because a user held them.
    pub skipped_busy: u64,
    /// Times the progress thread went to sleep after finding no work.
    pub parks: u64,
}

/// Wakes the progress thread and tells it to stop.
#[derive(Debug, Default)]
struct ProgressSignal {
    /// Set by wakers, taken by the thread before each sweep.
    pending: AtomicBool,
    stop: AtomicBool,
    /// The progress thread, once started.
    thread: OnceLock<Thread>,
}

impl ProgressSignal {
    /// Tells the progress thread there may be work, waking it if it sleeps.
    fn wake(&self) {
        if !self.pending.swap(true, Ordering::AcqRel)
            && let Some(thread) = self.thread.get()
        {
            thread.unpark();
        }
    }

    /// Whether a wake came since the last call.
    fn take_pending(&self) -> bool {
        self.pending.swap(false, Ordering::AcqRel)
    }

    /// Sleeps for at most `timeout`, unless a wake or a stop came first.
    fn sleep(&self, timeout: Duration) {
        if !self.pending.load(Ordering::Acquire) && !self.stop.load(Ordering::SeqCst) {
            thread::park_timeout(timeout);
        }
    }
}

/// One connection of a table.
struct Entry<E: Endpoint> {
    id: ConnectionId,
    /// `None` once removed from the table.
    connection: Mutex<Option<Connection<E>>>,
    signal: Arc<ProgressSignal>,
    doorway: Arc<Doorway>,
    /// The waker its endpoint calls: queues it for a look.
    waker: Waker,
}

impl<E: Endpoint> Entry<E> {
    /// Takes the connection out and drops it, closing it and releasing its buffers; its
    /// wake descriptor leaves `ready` first.
    fn close(&self, ready: &ReadySet) {
        let connection = self
            .connection
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let Some(connection) = &connection
            && let Readiness::Fd(fd) = connection.endpoint().readiness()
        {
            ready.deregister(fd);
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

/// What the table and its progress thread share.
struct Shared<E: Endpoint> {
    connections: DashMap<ConnectionId, Arc<Entry<E>>>,
    next_id: AtomicU64,
    signal: Arc<ProgressSignal>,
    counters: Counters,
    ready: Arc<ReadySet>,
    /// Connections that cannot wake a waiter: looked at by every wait.
    polled: Mutex<HashSet<ConnectionId>>,
    /// Connections the last wait handed out, queued again by the next.
    handed_out: Mutex<Vec<ConnectionId>>,
}

/// What a look at one connection found (module `ready`).
enum Look {
    /// It may have work for its user: hand it out.
    Ready,
    /// Held by somebody, or with work no wake announces: looked at again after a short
    /// sleep.
    Later,
    /// Nothing to do: armed to wake a waiter.
    Armed,
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

    /// Queues connection `id` for a look, if it is still in the table.
    fn queue(&self, id: ConnectionId) {
        if let Some(entry) = self.connections.get(&id) {
            entry.doorway.queue();
        }
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

    /// Looks at one connection: disarms it, makes progress, and hands it out if it has
    /// work for its user, else arms it again (module `ready`).
    fn look(&self, entry: &Entry<E>) -> Look {
        entry.doorway.take();
        let mut guard = match entry.connection.try_lock() {
            Ok(guard) => guard,
            Err(TryLockError::WouldBlock) => {
                // Looked at again after a short sleep: the holder may be the progress
                // thread, whose unlock queues nothing when it found nothing to do.
                entry.doorway.queue_later();
                return Look::Later;
            }
            Err(TryLockError::Poisoned(poisoned)) => poisoned.into_inner(),
        };
        let Some(connection) = guard.as_mut() else {
            return Look::Armed;
        };
        // Work that lands between the progress and the arm makes the arm pending: a few
        // more passes take it, before the connection is left for a later look.
        for _ in 0..Shared::<E>::PASSES_PER_LOOK {
            connection.disarm();
            let did = connection.progress_counted();
            if !matches!(did, Ok(0)) || connection.has_delivered() {
                return Look::Ready;
            }
            if connection.arm(&entry.waker) == Armed::Parked {
                if let Some(at) = connection.next_timer() {
                    self.ready.add_timer(at, Instant::now(), entry.id);
                }
                return Look::Armed;
            }
        }
        connection.disarm();
        entry.doorway.queue_later();
        Look::Later
    }

    /// Tries every connection once; returns how much the progress calls did (completions
    /// taken plus work requests posted). `entries` is scratch space, left empty.
    fn sweep(&self, entries: &mut Vec<Arc<Entry<E>>>) -> usize {
        entries.extend(
            self.connections
                .iter()
                .map(|entry| Arc::clone(entry.value())),
        );
        let (mut done, mut progressed, mut skipped_busy) = (0, 0, 0);
        for entry in entries.drain(..) {
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
                    entry.doorway.queue();
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

    /// The progress thread: sweeps until stopped, backing off while sweeps find nothing.
    fn run_progress(&self, config: ProgressConfig) {
        let backoff = Backoff::new();
        let mut park = config.first_park;
        let mut entries = Vec::new();
        while !self.signal.stop.load(Ordering::SeqCst) {
            let woken = self.signal.take_pending();
            if self.sweep(&mut entries) > 0 || woken {
                backoff.reset();
                park = config.first_park;
            } else if !backoff.is_completed() {
                backoff.snooze();
            } else {
                self.counters.parks.fetch_add(1, Ordering::Relaxed);
                self.signal.sleep(park);
                park = (park * 2).min(config.max_park);
            }
        }
    }
}

/// Connections by id, over endpoints of type `E`, optionally with a progress thread that
/// sweeps them.
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
/// let config = Arc::new(ConnectionConfig::new(Arc::new(TierLadder::preset("patent")?))?);
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
/// while sender.lock()?.try_send(&[std::io::IoSlice::new(b"hello")]).is_err() {
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
    progress: Option<JoinHandle<()>>,
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
        ConnectionTable {
            shared: Arc::new(Shared {
                connections: DashMap::new(),
                next_id: AtomicU64::new(1),
                signal: Arc::default(),
                counters: Counters::default(),
                ready: Arc::default(),
                polled: Mutex::default(),
                handed_out: Mutex::default(),
            }),
            progress: None,
        }
    }

    /// An empty table with a progress thread that sweeps its connections, backing off as
    /// `config` says while there is nothing to do.
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
    pub fn with_progress_thread(config: ProgressConfig) -> Result<ConnectionTable<E>, TableError> {
        let mut table = ConnectionTable::new();
        let shared = Arc::clone(&table.shared);
        let handle = thread::Builder::new()
            .name("tierbuf-progress".into())
            .spawn(move || shared.run_progress(config))
            .map_err(TableError::Spawn)?;
        // Wakes before this are not lost: they leave `pending` set for the first sweep.
        let _ = table.shared.signal.thread.set(handle.thread().clone());
        table.progress = Some(handle);
        Ok(table)
    }

    /// Adds `connection` under a new id and returns its handle.
    ///
    /// See [`ConnectionTable`] for an example.
    pub fn insert(&self, connection: Connection<E>) -> SharedConnection<E> {
        let id = ConnectionId(self.shared.next_id.fetch_add(1, Ordering::Relaxed));
        let doorway = Arc::new(Doorway::new(id, Arc::clone(&self.shared.ready)));
        let polled = match connection.endpoint().readiness() {
            Readiness::Fd(fd) => self.shared.ready.register(id, fd).is_err(),
            Readiness::Waker => false,
            _ => true,
        };
        if polled {
            self.shared.polled().insert(id);
        }
        let entry = Arc::new(Entry {
            id,
            connection: Mutex::new(Some(connection)),
            signal: Arc::clone(&self.shared.signal),
            waker: Waker::from(Arc::clone(&doorway)),
            doorway,
        });
        self.shared.connections.insert(id, Arc::clone(&entry));
        self.shared.signal.wake();
        entry.doorway.queue();
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
    /// # let config = Arc::new(ConnectionConfig::new(Arc::new(TierLadder::preset("patent")?))?);
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
                entry.doorway.queue();
            }
        }
        for id in std::mem::take(&mut *shared.handed_out()) {
            shared.queue(id);
        }
        loop {
            for id in shared.polled().iter().copied() {
                shared.ready.push_polled(id);
            }
            let mut later = shared.ready.requeue_later();
            while let Some(id) = shared.ready.pop() {
                let Some(entry) = shared.connections.get(&id).map(|e| Arc::clone(e.value())) else {
                    continue;
                };
                match shared.look(&entry) {
                    Look::Ready => ready.push(SharedConnection { entry }),
                    Look::Later => later = true,
                    Look::Armed => {}
                }
            }
            if !ready.is_empty() {
                shared
                    .handed_out()
                    .extend(ready.iter().map(SharedConnection::id));
                return Ok(ready.len());
            }
            let polling = later || !shared.polled().is_empty();
            let woken = shared
                .ready
                .sleep(until, polling)
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
                entry.close(&self.shared.ready);
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
    /// thread: what the progress thread does in each sweep. Returns how much it did
    /// (completions taken plus work requests posted); 0 means there was nothing to do.
    ///
    /// See [`ConnectionTable::new`] for an example.
    pub fn sweep(&self) -> usize {
        self.shared.sweep(&mut Vec::new())
    }

    /// Counters of the sweeps so far.
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

    /// Stops the progress thread, if one runs, and waits for it to finish its sweep. The
    /// connections stay in the table and progress when their users call them. Reports a
    /// panic of the thread.
    ///
    /// See [`ConnectionTable::with_progress_thread`] for an example.
    pub fn shutdown(&mut self) -> Result<(), TableError> {
        let Some(handle) = self.progress.take() else {
            return Ok(());
        };
        self.shared.signal.stop.store(true, Ordering::SeqCst);
        handle.thread().unpark();
        handle
            .join()
            .map_err(|payload| TableError::ProgressThreadPanicked {
                message: payload
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| payload.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_else(|| "a non-string panic".to_string()),
            })
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
        self.entry.signal.wake();
        self.entry.doorway.queue();
    }
}

impl<E: Endpoint> fmt::Debug for ConnectionGuard<'_, E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("ConnectionGuard").field(&**self).finish()
    }
}
