//! [`Listener`]: the connections coming in at one address, handed out by `accept` and
//! `accept_timeout`; and the threads that accept and connect for providers whose own
//! calls have no deadline.

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::net::{IpAddr, Ipv6Addr};
use std::panic::{self, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::Duration;

use super::builder::Shared;
use super::error::SetupError;
use super::{ConnectionOf, Kind};

/// How many endpoints whose handshake is complete a listener of shm or verbs holds for
/// `accept`; past them its accepting thread waits, and later peers wait in the kernel's
/// backlog.
pub const ACCEPT_BACKLOG: usize = 16;

/// How many handshakes a listener runs at once, each on a thread of its own, for
/// providers whose handshake waits on the peer after it has spoken (verbs): past them its
/// accepting thread waits for one to end. A peer that stalls in its handshake holds one
/// of them for the provider's handshake timeout at most, and no other peer's.
pub const MAX_HANDSHAKES: usize = 16;

/// How many of a listener's [`MAX_HANDSHAKES`] the peers of one host run at once. A host
/// is an IPv4 address, or an IPv6 /64 network: a machine or subscriber is handed a whole
/// /64, so its peers could otherwise take a fresh address each. A host's further peers
/// wait, [`MAX_WAITING_PER_HOST`] at most, for that host's own handshakes to end, while
/// other hosts' peers go on: a host whose peers stall their handshakes holds four turns,
/// not all of them.
pub const MAX_HANDSHAKES_PER_HOST: usize = 4;

/// How many peers of one host wait for a handshake turn of their host; a peer past them
/// is closed, and [`Listener::accept`] reports [`SetupError::HostBusy`].
pub const MAX_WAITING_PER_HOST: usize = 16;

/// An endpoint that came in, or why one failed to.
pub(super) type Incoming<K> = Result<<K as Kind>::Endpoint, SetupError>;

/// The host whose turns a peer at `addr` counts against ([`MAX_HANDSHAKES_PER_HOST`]): an
/// IPv4 address, also one mapped into IPv6, as it is; an IPv6 address's /64 network, its
/// low 64 bits zero.
fn host_of(addr: IpAddr) -> IpAddr {
    match addr.to_canonical() {
        IpAddr::V6(v6) => IpAddr::V6(Ipv6Addr::from_bits(v6.to_bits() & !u128::from(u64::MAX))),
        v4 => v4,
    }
}

/// What an accepting call came back with: an endpoint, or why none came; or a peer whose
/// handshake is still to run, which the listener runs on a thread of its own.
pub(super) enum Arrival<K: Kind> {
    Ready(Incoming<K>),
    #[cfg_attr(
        not(feature = "verbs"),
        allow(
            dead_code,
            reason = "only the verbs handshake waits on the peer after accept"
        )
    )]
    Handshake {
        /// The peer's address, whose host ([`host_of`]) the handshake's turn counts
        /// against (`None`: no host's).
        host: Option<IpAddr>,
        run: Box<dyn FnOnce() -> Incoming<K> + Send>,
    },
}

/// Connections coming in at one address of a [`Transport`](super::Transport); made by
/// its `listen`. Dropping it stops listening: the address is free again, and endpoints
/// not yet accepted are closed.
///
/// ```
/// use std::time::Duration;
/// use tierbuf_transport::{SetupError, Transport};
/// let node = Transport::loopback().budget_bytes(64 << 20).build()?;
/// let listener = node.listen("svc")?;
/// let waited = listener.accept_timeout(Duration::from_millis(10));
/// assert!(matches!(waited, Err(SetupError::TimedOut { .. })));
/// let _client = node.connect("svc")?;
/// let _server = listener.accept_timeout(Duration::from_secs(1))?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct Listener<K: Kind> {
    // Dropped before `_open`: an accepting thread waiting to hand over an endpoint then
    // stops waiting, so that `_open` can join it.
    incoming: Mutex<Receiver<Incoming<K>>>,
    _open: Open,
    shared: Arc<Shared<K>>,
    address: String,
}

/// What keeps a listener's address open (a loopback name, an [`Acceptor`]); dropping it
/// closes the address.
pub(super) type Open = Box<dyn Send + Sync>;

impl<K: Kind> Listener<K> {
    pub(super) fn new(
        shared: Arc<Shared<K>>,
        address: String,
        incoming: Receiver<Incoming<K>>,
        open: Open,
    ) -> Listener<K> {
        Listener {
            incoming: Mutex::new(incoming),
            _open: open,
            shared,
            address,
        }
    }

    /// The address listened at: the loopback name, the socket path, the TCP address.
    pub fn address(&self) -> &str {
        &self.address
    }

    /// Waits for the next connection. Calls from several threads take turns.
    ///
    /// # Errors
    ///
    /// A peer that failed its handshake ([`SetupError::Provider`]; the listener goes on,
    /// and the next call waits for the next peer), a connection that could not start over
    /// its endpoint ([`SetupError::Config`], [`SetupError::Connection`]), or
    /// [`SetupError::ListenerGone`].
    pub fn accept(&self) -> Result<ConnectionOf<K>, SetupError> {
        let incoming = self.incoming.lock().unwrap_or_else(PoisonError::into_inner);
        let endpoint = incoming.recv().map_err(|_| SetupError::ListenerGone)??;
        drop(incoming);
        self.shared.connection(endpoint)
    }

    /// [`Listener::accept`], waiting at most `timeout` for a connection to come
    /// ([`SetupError::TimedOut`] then). The time counts from the call's turn: calls from
    /// several threads take turns.
    pub fn accept_timeout(&self, timeout: Duration) -> Result<ConnectionOf<K>, SetupError> {
        let incoming = self.incoming.lock().unwrap_or_else(PoisonError::into_inner);
        let endpoint = match incoming.recv_timeout(timeout) {
            Ok(endpoint) => endpoint?,
            Err(RecvTimeoutError::Timeout) => {
                return Err(SetupError::TimedOut {
                    operation: "accepting a connection",
                    timeout,
                });
            }
            Err(RecvTimeoutError::Disconnected) => return Err(SetupError::ListenerGone),
        };
        drop(incoming);
        self.shared.connection(endpoint)
    }
}

impl<K: Kind> fmt::Debug for Listener<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Listener")
            .field("provider", &K::NAME)
            .field("address", &self.address)
            .finish_non_exhaustive()
    }
}

/// A thread that accepts endpoints and hands them to a listener's queue, until told to
/// stop; handshakes still to run each run on a thread of their own, at most
/// [`MAX_HANDSHAKES`] at once and [`MAX_HANDSHAKES_PER_HOST`] from one host.
pub(super) struct Acceptor {
    stop: Arc<AtomicBool>,
    handshakes: Arc<Handshakes>,
    /// Makes the thread's accept return (a connection that says nothing); false when it
    /// could not.
    wake: Box<dyn Fn() -> bool + Send + Sync>,
    thread: Option<JoinHandle<()>>,
}

impl Acceptor {
    /// Starts a thread that calls `accept` and queues what it returns, at most
    /// [`ACCEPT_BACKLOG`] ahead of the listener, a handshake once it has run; `wake` must
    /// make a call of `accept` in progress return, or say that it could not.
    pub(super) fn start<K: Kind>(
        address: &str,
        mut accept: impl FnMut() -> Arrival<K> + Send + 'static,
        wake: impl Fn() -> bool + Send + Sync + 'static,
    ) -> Result<(Receiver<Incoming<K>>, Acceptor), SetupError> {
        let (queue, incoming) = mpsc::sync_channel(ACCEPT_BACKLOG);
        let stop = Arc::new(AtomicBool::new(false));
        let handshakes = Arc::new(Handshakes::default());
        let (stopped, running) = (Arc::clone(&stop), Arc::clone(&handshakes));
        let thread = std::thread::Builder::new()
            .name(format!("tierbuf-accept {address}"))
            .spawn(move || {
                while !stopped.load(Ordering::Acquire) {
                    let arrived = accept();
                    // A stopping listener's own wake-up connection, or a peer that came
                    // as it stopped: dropped.
                    if stopped.load(Ordering::Acquire) {
                        return;
                    }
                    let endpoint = match arrived {
                        Arrival::Ready(endpoint) => endpoint,
                        Arrival::Handshake { host, run } => {
                            let queue = queue.clone();
                            let job = Job {
                                host: host.map(host_of),
                                run: Box::new(move || drop(queue.send(run()))),
                            };
                            match running.admit(job, &stopped) {
                                Admission::Run(job) => match Handshakes::start(&running, job) {
                                    Ok(()) => continue,
                                    Err(error) => Err(error),
                                },
                                Admission::Waiting => continue,
                                Admission::Refused(error) => Err(error),
                                Admission::Stopped => return,
                            }
                        }
                    };
                    if queue.send(endpoint).is_err() {
                        return;
                    }
                }
            })
            .map_err(|source| SetupError::Thread {
                purpose: "accepting",
                source,
            })?;
        Ok((
            incoming,
            Acceptor {
                stop,
                handshakes,
                wake: Box::new(wake),
                thread: Some(thread),
            },
        ))
    }
}

/// A handshake to run: it queues the endpoint it makes (dropped if the listener is gone).
struct Job {
    host: Option<IpAddr>,
    run: Box<dyn FnOnce() + Send>,
}

/// What [`Handshakes::admit`] did with a job.
enum Admission {
    /// It has a turn: start it.
    Run(Job),
    /// It waits for a turn of its host, which the end of one of that host's handshakes
    /// gives it.
    Waiting,
    /// Its host has [`MAX_WAITING_PER_HOST`] peers waiting already: the job was dropped.
    Refused(SetupError),
    /// The listener is stopping.
    Stopped,
}

/// The handshakes of a listener: at most [`MAX_HANDSHAKES`] run, each on a thread of its
/// own, at most [`MAX_HANDSHAKES_PER_HOST`] of them from one host.
///
/// # Invariants
///
/// - `running` counts the turns taken and not ended; `by_host` counts them by host and
///   holds no zero.
/// - A job waits only while its host has all [`MAX_HANDSHAKES_PER_HOST`] of its turns
///   (a job of a host with a turn free takes it, or the accepting thread waits for one
///   of [`MAX_HANDSHAKES`]). The thread that ends a turn takes, under the same lock, the
///   oldest waiting job that may run then, and runs it; so every end of a turn of a host
///   with jobs waiting starts one of them, and no waiting job is left without a turn to
///   come.
#[derive(Default)]
struct Handshakes {
    turns: Mutex<Turns>,
    changed: Condvar,
}

/// The state behind [`Handshakes`]' lock.
#[derive(Default)]
struct Turns {
    running: usize,
    by_host: HashMap<IpAddr, usize>,
    waiting: VecDeque<Job>,
}

impl Turns {
    /// Whether `host` has all its turns.
    fn host_is_full(&self, host: Option<IpAddr>) -> bool {
        host.is_some_and(|host| {
            self.by_host.get(&host).copied().unwrap_or(0) >= MAX_HANDSHAKES_PER_HOST
        })
    }

    /// Takes a turn for `host`.
    fn take(&mut self, host: Option<IpAddr>) {
        self.running += 1;
        if let Some(host) = host {
            *self.by_host.entry(host).or_insert(0) += 1;
        }
    }

    /// Ends a turn of `host`.
    fn end(&mut self, host: Option<IpAddr>) {
        self.running -= 1;
        if let Some(host) = host
            && let Some(count) = self.by_host.get_mut(&host)
        {
            *count -= 1;
            if *count == 0 {
                self.by_host.remove(&host);
            }
        }
    }

    /// The oldest waiting job that may run now, its turn taken.
    fn next_runnable(&mut self) -> Option<Job> {
        if self.running >= MAX_HANDSHAKES {
            return None;
        }
        let index = self
            .waiting
            .iter()
            .position(|job| !self.host_is_full(job.host))?;
        let job = self.waiting.remove(index)?;
        self.take(job.host);
        Some(job)
    }
}

impl Handshakes {
    fn lock(&self) -> MutexGuard<'_, Turns> {
        self.turns.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Gives `job` a turn, waiting while [`MAX_HANDSHAKES`] run; or has it wait for a
    /// turn of its host, or refuses it, when its host has all its turns.
    fn admit(&self, job: Job, stopped: &AtomicBool) -> Admission {
        let mut turns = self.lock();
        loop {
            if stopped.load(Ordering::Acquire) {
                return Admission::Stopped;
            }
            if let Some(host) = job.host
                && turns.host_is_full(job.host)
            {
                let waiting = turns.waiting.iter().filter(|j| j.host == job.host).count();
                if waiting >= MAX_WAITING_PER_HOST {
                    return Admission::Refused(SetupError::HostBusy {
                        host,
                        running: MAX_HANDSHAKES_PER_HOST,
                        waiting,
                    });
                }
                turns.waiting.push_back(job);
                return Admission::Waiting;
            }
            if turns.running < MAX_HANDSHAKES {
                turns.take(job.host);
                return Admission::Run(job);
            }
            turns = self
                .changed
                .wait(turns)
                .unwrap_or_else(PoisonError::into_inner);
        }
    }

    /// Runs `job`, which has its turn, on a thread of its own; that thread then runs the
    /// waiting jobs that the end of each turn lets run. If the thread cannot start, the
    /// job is dropped and its turn ended.
    fn start(handshakes: &Arc<Handshakes>, job: Job) -> Result<(), SetupError> {
        let host = job.host;
        let worker = Arc::clone(handshakes);
        let started = std::thread::Builder::new()
            .name("tierbuf-handshake".to_owned())
            .spawn(move || worker.work(job));
        started.map(drop).map_err(|source| {
            handshakes.lock().end(host);
            handshakes.changed.notify_all();
            SetupError::Thread {
                purpose: "running a handshake",
                source,
            }
        })
    }

    /// Runs `job`, then each waiting job that its turn's end lets run, until none may.
    fn work(&self, mut job: Job) {
        loop {
            let host = job.host;
            // A handshake that panics ends its turn as any other does (the panic is
            // reported by the hook); the thread goes on to the next.
            let _ = panic::catch_unwind(AssertUnwindSafe(job.run));
            let mut turns = self.lock();
            turns.end(host);
            let next = turns.next_runnable();
            drop(turns);
            self.changed.notify_all();
            match next {
                Some(next) => job = next,
                None => return,
            }
        }
    }

    /// Wakes a wait for a turn, to see the stop, and drops the waiting jobs (closing their
    /// peers).
    fn stop(&self) {
        // Taken so that the wake cannot fall between a waiter's look at the stop and its
        // wait.
        let waiting = std::mem::take(&mut self.lock().waiting);
        self.changed.notify_all();
        drop(waiting);
    }
}

impl Drop for Acceptor {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        self.handshakes.stop();
        let woken = (self.wake)();
        if let (true, Some(thread)) = (woken, self.thread.take()) {
            // The thread only queues endpoints; a panic there has nothing left to report
            // to, and the listener's calls reported `ListenerGone` already.
            let _ = thread.join();
        }
        // Not woken (the socket's path was removed, say): the thread is left waiting,
        // and stops with the next peer that comes, if any does.
    }
}

/// Runs `connect` on a thread of its own and waits for it at most `timeout`; an endpoint
/// it makes after that is dropped, which closes it.
pub(super) fn connect_within<K: Kind>(
    timeout: Duration,
    connect: impl FnOnce() -> Incoming<K> + Send + 'static,
) -> Incoming<K> {
    let (done, result) = mpsc::sync_channel(1);
    std::thread::Builder::new()
        .name("tierbuf-connect".to_owned())
        .spawn(move || {
            // The caller may have stopped waiting; then the endpoint is dropped here.
            let _ = done.send(connect());
        })
        .map_err(|source| SetupError::Thread {
            purpose: "connecting",
            source,
        })?;
    match result.recv_timeout(timeout) {
        Ok(endpoint) => endpoint,
        Err(_) => Err(SetupError::TimedOut {
            operation: "connecting",
            timeout,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::LoopbackProvider;
    use crate::front::Loopback;
    use tierbuf_pool::MemoryBudget;

    /// A handshake that stalls holds up no other: the endpoint of a handshake that came
    /// after it is queued while it still waits. Run one after another, as they were, the
    /// second waited for the first.
    #[test]
    fn a_stalled_handshake_holds_up_no_other() {
        let provider = LoopbackProvider::new(MemoryBudget::with_cap(1 << 20));
        let (endpoint, _peer) = provider.pair(4, 4).expect("a pair");
        let (release, stalled) = mpsc::channel::<()>();
        let (incoming, acceptor) = accepting(vec![
            Arrival::Handshake {
                host: None,
                run: Box::new(move || {
                    let _ = stalled.recv();
                    Err(SetupError::ListenerGone)
                }),
            },
            Arrival::Handshake {
                host: None,
                run: Box::new(move || Ok(endpoint)),
            },
        ]);
        let first = incoming.recv_timeout(Duration::from_secs(60));
        assert!(
            matches!(first, Ok(Ok(_))),
            "the second peer's endpoint did not come while the first stalled"
        );
        release.send(()).expect("the stalled handshake waits");
        let second = incoming.recv_timeout(Duration::from_secs(60));
        assert!(matches!(second, Ok(Err(SetupError::ListenerGone))));
        drop(acceptor);
    }

    /// An accepting thread over `arrivals`, then an accept that waits until the listener
    /// is dropped.
    fn accepting(arrivals: Vec<Arrival<Loopback>>) -> (Receiver<Incoming<Loopback>>, Acceptor) {
        let (wake, woken) = mpsc::channel::<()>();
        let mut arrivals = arrivals.into_iter();
        Acceptor::start::<Loopback>(
            "test",
            move || {
                arrivals.next().unwrap_or_else(|| {
                    let _ = woken.recv();
                    Arrival::Ready(Err(SetupError::ListenerGone))
                })
            },
            move || wake.send(()).is_ok(),
        )
        .expect("an accepting thread")
    }

    /// A handshake from `host` that waits for `release`, then fails with `ListenerGone`.
    fn stalled(host: IpAddr, release: &Arc<Mutex<Receiver<()>>>) -> Arrival<Loopback> {
        let release = Arc::clone(release);
        Arrival::Handshake {
            host: Some(host),
            run: Box::new(move || {
                let _ = release.lock().expect("the release").recv();
                Err(SetupError::ListenerGone)
            }),
        }
    }

    /// A host whose handshakes all stall holds its own turns, not another host's; its
    /// peers past its turns wait, and those past its waiting room are refused.
    #[test]
    fn a_host_that_stalls_its_handshakes_holds_up_no_other_host() {
        let stalling: IpAddr = "192.0.2.1".parse().expect("an address");
        stalling_host_holds_up_no_other(|_| stalling, stalling, "192.0.2.2");
    }

    /// A host on IPv6 is its /64: its peers, each from an address of its own there, share
    /// its turns; a peer of the next /64 is another host's.
    #[test]
    fn an_ipv6_host_is_its_64_network_whatever_addresses_its_peers_take() {
        let network: IpAddr = "2001:db8:1:2::".parse().expect("an address");
        stalling_host_holds_up_no_other(
            |peer| {
                format!("2001:db8:1:2:{peer:x}::1")
                    .parse()
                    .expect("an address")
            },
            network,
            "2001:db8:1:3::1",
        );
    }

    /// IPv4 addresses, mapped into IPv6 or not, are hosts of their own; IPv6 addresses
    /// count by their /64.
    #[test]
    fn a_host_is_an_ipv4_address_or_an_ipv6_64_network() {
        let host = |addr: &str| host_of(addr.parse().expect("an address")).to_string();
        assert_eq!(host("192.0.2.7"), "192.0.2.7");
        assert_eq!(host("::ffff:192.0.2.7"), "192.0.2.7");
        assert_eq!(host("2001:db8:1:2:aaaa:bbbb:cccc:dddd"), "2001:db8:1:2::");
        assert_eq!(host("fe80::1"), "fe80::");
    }

    /// Peers from `peer_address(n)` (of `host`) stall every handshake they start, then one
    /// from `other` comes: it is accepted, and the stalling host's peer past its turns
    /// and its waiting room is refused.
    fn stalling_host_holds_up_no_other(
        peer_address: impl Fn(usize) -> IpAddr,
        host: IpAddr,
        other: &str,
    ) {
        let provider = LoopbackProvider::new(MemoryBudget::with_cap(1 << 20));
        let (endpoint, _peer) = provider.pair(4, 4).expect("a pair");
        let (release, released) = mpsc::channel::<()>();
        let released = Arc::new(Mutex::new(released));
        let mut arrivals: Vec<_> = (0..MAX_HANDSHAKES_PER_HOST + MAX_WAITING_PER_HOST + 1)
            .map(|peer| stalled(peer_address(peer), &released))
            .collect();
        arrivals.push(Arrival::Handshake {
            host: Some(other.parse().expect("an address")),
            run: Box::new(move || Ok(endpoint)),
        });
        let (incoming, acceptor) = accepting(arrivals);
        let refused = incoming.recv_timeout(Duration::from_secs(60));
        assert!(
            matches!(
                refused,
                Ok(Err(SetupError::HostBusy { host: refused, running: MAX_HANDSHAKES_PER_HOST, waiting: MAX_WAITING_PER_HOST }))
                    if refused == host
            ),
            "the stalling host's peer past its waiting room: {refused:?}"
        );
        let other = incoming.recv_timeout(Duration::from_secs(60));
        assert!(
            matches!(other, Ok(Ok(_))),
            "the other host's peer was held up: {other:?}"
        );
        // Every stalled handshake, the waiting ones included, runs once released.
        for _ in 0..MAX_HANDSHAKES_PER_HOST + MAX_WAITING_PER_HOST {
            release.send(()).expect("a stalled handshake waits");
            let ended = incoming.recv_timeout(Duration::from_secs(60));
            assert!(
                matches!(ended, Ok(Err(SetupError::ListenerGone))),
                "{ended:?}"
            );
        }
        // A handshake's thread ends its turn after it queued its endpoint.
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        while acceptor.handshakes.lock().running > 0 && std::time::Instant::now() < deadline {
            std::thread::yield_now();
        }
        let turns = acceptor.handshakes.lock();
        assert_eq!((turns.running, turns.waiting.len()), (0, 0));
        assert!(turns.by_host.is_empty());
        drop(turns);
        drop(acceptor);
    }

    /// A handshake that panics ends its turn, and its thread runs the host's next one.
    #[test]
    fn a_panicking_handshake_ends_its_turn() {
        let host: IpAddr = "192.0.2.3".parse().expect("an address");
        let provider = LoopbackProvider::new(MemoryBudget::with_cap(1 << 20));
        let (endpoint, _peer) = provider.pair(4, 4).expect("a pair");
        let mut arrivals: Vec<_> = (0..MAX_HANDSHAKES_PER_HOST)
            .map(|_| Arrival::<Loopback>::Handshake {
                host: Some(host),
                run: Box::new(|| panic!("a handshake that panics")),
            })
            .collect();
        arrivals.push(Arrival::Handshake {
            host: Some(host),
            run: Box::new(move || Ok(endpoint)),
        });
        let (incoming, acceptor) = accepting(arrivals);
        let last = incoming.recv_timeout(Duration::from_secs(60));
        assert!(matches!(last, Ok(Ok(_))), "{last:?}");
        drop(acceptor);
    }

    /// Dropping the listener closes the peers still waiting for a turn: their handshakes
    /// never run.
    #[test]
    fn a_dropped_listener_closes_its_waiting_peers() {
        let host: IpAddr = "192.0.2.4".parse().expect("an address");
        let (release, released) = mpsc::channel::<()>();
        let released = Arc::new(Mutex::new(released));
        let (ran, probe) = mpsc::channel::<()>();
        let mut arrivals: Vec<_> = (0..MAX_HANDSHAKES_PER_HOST)
            .map(|_| stalled(host, &released))
            .collect();
        arrivals.push(Arrival::Handshake {
            host: Some(host),
            run: Box::new(move || {
                let _ = ran.send(());
                Err(SetupError::ListenerGone)
            }),
        });
        let (_incoming, acceptor) = accepting(arrivals);
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        while acceptor.handshakes.lock().waiting.is_empty() && std::time::Instant::now() < deadline
        {
            std::thread::yield_now();
        }
        assert_eq!(acceptor.handshakes.lock().waiting.len(), 1);
        drop(acceptor);
        assert_eq!(
            probe.recv_timeout(Duration::from_secs(60)),
            Err(mpsc::RecvTimeoutError::Disconnected),
            "the waiting handshake ran, or was kept"
        );
        drop(release);
    }
}
