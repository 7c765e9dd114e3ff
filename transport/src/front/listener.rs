//! [`Listener`]: the connections coming in at one address, handed out by `accept` and
//! `accept_timeout`; and the threads that accept and connect for providers whose own
//! calls have no deadline.

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, SyncSender};
use std::sync::{Arc, Condvar, Mutex, PoisonError};
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

/// An endpoint that came in, or why one failed to.
pub(super) type Incoming<K> = Result<<K as Kind>::Endpoint, SetupError>;

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
    Handshake(Box<dyn FnOnce() -> Incoming<K> + Send>),
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
    /// its endpoint ([`SetupError::Connection`]), or [`SetupError::ListenerGone`].
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
/// [`MAX_HANDSHAKES`] at once.
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
                        Arrival::Handshake(handshake) => {
                            if !running.begin(&stopped) {
                                return;
                            }
                            match run_handshake::<K>(handshake, queue.clone(), Arc::clone(&running))
                            {
                                Ok(()) => continue,
                                Err(error) => Err(error),
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

/// Runs `handshake` on a thread of its own, which queues the endpoint it makes (dropped
/// if the listener is gone) and then ends its turn in `running`.
fn run_handshake<K: Kind>(
    handshake: Box<dyn FnOnce() -> Incoming<K> + Send>,
    queue: SyncSender<Incoming<K>>,
    running: Arc<Handshakes>,
) -> Result<(), SetupError> {
    let turn = Turn(running);
    std::thread::Builder::new()
        .name("tierbuf-handshake".to_owned())
        .spawn(move || {
            // Ends the turn however the handshake ends, a panic included.
            let _turn = turn;
            let _ = queue.send(handshake());
        })
        .map(drop)
        .map_err(|source| SetupError::Thread {
            purpose: "running a handshake",
            source,
        })
}

/// A turn taken with [`Handshakes::begin`], ended when dropped (with the closure that
/// holds it, if its thread could not start).
struct Turn(Arc<Handshakes>);

impl Drop for Turn {
    fn drop(&mut self) {
        self.0.end();
    }
}

/// The handshakes running on threads of their own: at most [`MAX_HANDSHAKES`].
#[derive(Default)]
struct Handshakes {
    running: Mutex<usize>,
    changed: Condvar,
}

impl Handshakes {
    /// Takes a turn, waiting while [`MAX_HANDSHAKES`] run; false (no turn taken) once
    /// `stopped` is set.
    fn begin(&self, stopped: &AtomicBool) -> bool {
        let mut running = self.running.lock().unwrap_or_else(PoisonError::into_inner);
        loop {
            if stopped.load(Ordering::Acquire) {
                return false;
            }
            if *running < MAX_HANDSHAKES {
                *running += 1;
                return true;
            }
            running = self
                .changed
                .wait(running)
                .unwrap_or_else(PoisonError::into_inner);
        }
    }

    /// Ends a turn.
    fn end(&self) {
        *self.running.lock().unwrap_or_else(PoisonError::into_inner) -= 1;
        self.changed.notify_all();
    }

    /// Wakes a wait for a turn, to see the stop.
    fn stop(&self) {
        // Taken so that the wake cannot fall between a waiter's look at the stop and its
        // wait.
        drop(self.running.lock().unwrap_or_else(PoisonError::into_inner));
        self.changed.notify_all();
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
        let (wake, woken) = mpsc::channel::<()>();
        let mut arrivals = vec![
            Arrival::<Loopback>::Handshake(Box::new(move || {
                let _ = stalled.recv();
                Err(SetupError::ListenerGone)
            })),
            Arrival::Handshake(Box::new(move || Ok(endpoint))),
        ]
        .into_iter();
        let (incoming, acceptor) = Acceptor::start::<Loopback>(
            "test",
            // After the two peers, an accept that waits until the listener is dropped.
            move || {
                arrivals.next().unwrap_or_else(|| {
                    let _ = woken.recv();
                    Arrival::Ready(Err(SetupError::ListenerGone))
                })
            },
            move || wake.send(()).is_ok(),
        )
        .expect("an accepting thread");
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
}
