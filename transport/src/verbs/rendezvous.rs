//! The TCP side of connection setup, free of any device: a [`RendezvousListener`] that
//! accepts many peers, the [`Rendezvous`] stream each handshake runs on, and the
//! [`PeerWatch`] that the connected endpoint keeps to learn when its peer goes away.
//!
//! # Invariants
//!
//! - A listener hands out a peer only once the peer has sent something (the first bytes
//!   of its hello, or its end): both sides of a handshake send their hello before they
//!   read the other's, so a peer that has said nothing yet is not waited on while others
//!   speak. Peers taken from the kernel but not yet heard wait in the listener's
//!   `unheard` list (`connection::readiness`, shared with the shm listener), each for the
//!   handshake timeout at most; the `accept` that finds one silent past it drops it and
//!   returns the timeout.
//!
//! Verbs has no way to tell a queue pair that its peer closed (a destroyed peer shows
//! only as a send's retries running out, and not at all to a side that only receives),
//! so the TCP connection the handshake ran on stays open for the life of the endpoint:
//! closing an endpoint shuts it down, and the peer reads the end of the stream, as
//! `rdma_cm` uses its own connection for the same purpose.

use std::io::{self, Read};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::os::fd::{AsFd, BorrowedFd};
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use super::handshake::{self, HandshakeError, Hello};
use crate::connection::readiness::UnheardPeers;

/// Listens for peers that want to connect and hands out one [`Rendezvous`] per peer, in
/// the order their hellos come.
///
/// ```
/// use std::net::TcpStream;
/// use std::time::Duration;
/// use tierbuf_tiers::TierIndex;
/// use tierbuf_transport::verbs::handshake::{Hello, QueuePairAddress};
/// use tierbuf_transport::verbs::rendezvous::{Rendezvous, RendezvousListener};
/// let hello = |num| Hello {
///     queue_pair: QueuePairAddress { num, lid: 1, gid: None },
///     initial_tier: TierIndex::SMALLEST,
/// };
/// let listener = RendezvousListener::bind("127.0.0.1:0", Duration::from_secs(5))?;
/// let addr = listener.local_addr()?;
/// let _silent = TcpStream::connect(addr)?; // connects first, never speaks
/// let client = std::thread::spawn(move || {
///     let mut rendezvous = Rendezvous::connect(addr, Duration::from_secs(5))?;
///     rendezvous.exchange_hello(hello(1))?;
///     Ok::<_, tierbuf_transport::verbs::handshake::HandshakeError>(rendezvous)
/// });
/// let mut accepted = listener.accept()?; // the peer that spoke
/// assert_eq!(accepted.exchange_hello(hello(2))?.queue_pair.num, 1);
/// let connected = client.join().unwrap()?;
/// assert_eq!(accepted.peer_addr()?, connected.local_addr()?);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug)]
pub struct RendezvousListener {
    /// Non-blocking: peers are taken as they come, between waits in `poll(2)`.
    listener: TcpListener,
    timeout: Duration,
    /// Peers taken from the kernel that have sent nothing yet.
    unheard: Mutex<UnheardPeers<TcpStream>>,
}

impl RendezvousListener {
    /// Listens on `addr`; every accepted handshake waits at most `timeout` for each of the
    /// peer's frames, the first included.
    pub fn bind(addr: impl ToSocketAddrs, timeout: Duration) -> Result<Self, HandshakeError> {
        let listener = TcpListener::bind(addr).map_err(|source| HandshakeError::Io {
            operation: "binding the listening socket",
            source,
        })?;
        listener
            .set_nonblocking(true)
            .map_err(|source| HandshakeError::Io {
                operation: "making the listening socket non-blocking",
                source,
            })?;
        Ok(RendezvousListener {
            listener,
            timeout,
            unheard: Mutex::new(UnheardPeers::new()),
        })
    }

    /// The address peers connect to.
    pub fn local_addr(&self) -> Result<SocketAddr, HandshakeError> {
        self.listener
            .local_addr()
            .map_err(|source| HandshakeError::Io {
                operation: "reading the listening address",
                source,
            })
    }

    /// Waits for the next peer to speak, and hands out its stream. A peer that connects
    /// and says nothing never holds the others up: whichever peer's hello comes first is
    /// handed out first, and one silent for the timeout is dropped, its
    /// [`HandshakeError::TimedOut`] returned by the call that finds it so. A failed
    /// handshake with one peer leaves the listener usable for the next; calls from
    /// several threads take turns.
    pub fn accept(&self) -> Result<Rendezvous, HandshakeError> {
        let mut unheard = self.unheard.lock().unwrap_or_else(PoisonError::into_inner);
        loop {
            let out_of_files = self.take_new_peers(&mut unheard)?;
            if let Some((stream, ())) = unheard.take_heard(|peer| has_spoken(peer).then_some(())) {
                return Rendezvous::new(stream, self.timeout);
            }
            if unheard.drop_silent(self.timeout) {
                return Err(HandshakeError::TimedOut {
                    part: "hello",
                    timeout: self.timeout,
                });
            }
            unheard
                .wait((!out_of_files).then_some(&self.listener), self.timeout)
                .map_err(|errno| HandshakeError::Io {
                    operation: "waiting for peers to connect and speak",
                    source: errno.into(),
                })?;
        }
    }

    /// Takes every connection the kernel has queued; returns whether it stopped for want
    /// of a descriptor, with connections still queued.
    fn take_new_peers(
        &self,
        unheard: &mut UnheardPeers<TcpStream>,
    ) -> Result<bool, HandshakeError> {
        loop {
            match self.listener.accept() {
                Ok((stream, _)) => unheard.push(stream),
                Err(error) if error.kind() == io::ErrorKind::WouldBlock => return Ok(false),
                // A peer that went away before it was taken, or a signal: look again.
                Err(error)
                    if matches!(
                        error.kind(),
                        io::ErrorKind::ConnectionAborted | io::ErrorKind::Interrupted
                    ) => {}
                // Out of descriptors: serve the peers taken so far, and take more later.
                Err(error) if is_out_of_files(&error) && !unheard.is_empty() => return Ok(true),
                Err(source) => {
                    return Err(HandshakeError::Io {
                        operation: "accepting a connection",
                        source,
                    });
                }
            }
        }
    }
}

/// Whether `stream`'s peer has sent something or gone: a byte waits, or the stream has
/// ended or failed (the handshake then reports how). Never blocks.
fn has_spoken(stream: &TcpStream) -> bool {
    let mut byte = [0u8; 1];
    match rustix::net::recv(
        stream,
        &mut byte,
        rustix::net::RecvFlags::PEEK | rustix::net::RecvFlags::DONTWAIT,
    ) {
        Ok(_) => true,
        Err(rustix::io::Errno::AGAIN | rustix::io::Errno::INTR) => false,
        Err(_) => true,
    }
}

/// Whether `error` says this process (or the system) can open no more files.
fn is_out_of_files(error: &io::Error) -> bool {
    matches!(
        rustix::io::Errno::from_io_error(error),
        Some(rustix::io::Errno::MFILE | rustix::io::Errno::NFILE)
    )
}

/// One peer's handshake stream.
///
/// ```
/// use std::time::Duration;
/// use tierbuf_tiers::TierIndex;
/// use tierbuf_transport::verbs::handshake::{Hello, QueuePairAddress};
/// use tierbuf_transport::verbs::rendezvous::{Rendezvous, RendezvousListener};
/// let timeout = Duration::from_secs(5);
/// let hello = |num| Hello {
///     queue_pair: QueuePairAddress { num, lid: 1, gid: None },
///     initial_tier: TierIndex::SMALLEST,
/// };
/// let listener = RendezvousListener::bind("127.0.0.1:0", timeout)?;
/// let addr = listener.local_addr()?;
/// let client = std::thread::spawn(move || {
///     let mut rendezvous = Rendezvous::connect(addr, timeout)?;
///     let peer = rendezvous.exchange_hello(hello(1))?;
///     rendezvous.exchange_ready()?;
///     Ok::<_, tierbuf_transport::verbs::handshake::HandshakeError>(peer)
/// });
/// let mut server = listener.accept()?;
/// assert_eq!(server.exchange_hello(hello(2))?.queue_pair.num, 1);
/// server.exchange_ready()?;
/// assert_eq!(client.join().unwrap()?.queue_pair.num, 2);
/// # Ok::<(), tierbuf_transport::verbs::handshake::HandshakeError>(())
/// ```
#[derive(Debug)]
pub struct Rendezvous {
    stream: TcpStream,
    timeout: Duration,
}

impl Rendezvous {
    /// Connects to a listening peer, giving up after `timeout`; the handshake then waits
    /// at most `timeout` for each of the peer's frames.
    pub fn connect(addr: SocketAddr, timeout: Duration) -> Result<Rendezvous, HandshakeError> {
        let stream =
            TcpStream::connect_timeout(&addr, timeout).map_err(|source| HandshakeError::Io {
                operation: "connecting to the peer",
                source,
            })?;
        Rendezvous::new(stream, timeout)
    }

    fn new(stream: TcpStream, timeout: Duration) -> Result<Rendezvous, HandshakeError> {
        let configure = || {
            stream.set_nodelay(true)?;
            stream.set_read_timeout(Some(timeout))?;
            stream.set_write_timeout(Some(timeout))
        };
        configure().map_err(|source| HandshakeError::Io {
            operation: "configuring the handshake socket",
            source,
        })?;
        Ok(Rendezvous { stream, timeout })
    }

    /// The address of this side of the stream.
    pub fn local_addr(&self) -> Result<SocketAddr, HandshakeError> {
        self.stream
            .local_addr()
            .map_err(|source| HandshakeError::Io {
                operation: "reading the local address",
                source,
            })
    }

    /// The peer's address.
    pub fn peer_addr(&self) -> Result<SocketAddr, HandshakeError> {
        self.stream
            .peer_addr()
            .map_err(|source| HandshakeError::Io {
                operation: "reading the peer's address",
                source,
            })
    }

    /// Sends `local` and returns the peer's hello; see [`handshake::exchange_hello`].
    pub fn exchange_hello(&mut self, local: Hello) -> Result<Hello, HandshakeError> {
        handshake::exchange_hello(&mut self.stream, local, self.timeout)
    }

    /// Says this side is ready and waits for the peer; see [`handshake::exchange_ready`].
    pub fn exchange_ready(&mut self) -> Result<(), HandshakeError> {
        handshake::exchange_ready(&mut self.stream, self.timeout)
    }

    /// Ends the handshake: the stream becomes a [`PeerWatch`].
    pub fn into_watch(self) -> Result<PeerWatch, HandshakeError> {
        self.stream
            .set_nonblocking(true)
            .map_err(|source| HandshakeError::Io {
                operation: "making the connection socket non-blocking",
                source,
            })?;
        Ok(PeerWatch {
            stream: self.stream,
        })
    }
}

/// The connection socket kept after the handshake, through which each side learns that
/// the other closed: nothing more is sent on it, so the end of the stream (or a reset)
/// means the peer closed or died.
///
/// ```
/// use std::time::Duration;
/// use tierbuf_tiers::TierIndex;
/// use tierbuf_transport::verbs::handshake::{HandshakeError, Hello, QueuePairAddress};
/// use tierbuf_transport::verbs::rendezvous::{Rendezvous, RendezvousListener};
/// let hello = |num| Hello {
///     queue_pair: QueuePairAddress { num, lid: 1, gid: None },
///     initial_tier: TierIndex::SMALLEST,
/// };
/// let listener = RendezvousListener::bind("127.0.0.1:0", Duration::from_secs(5))?;
/// let addr = listener.local_addr()?;
/// let client = std::thread::spawn(move || {
///     let mut rendezvous = Rendezvous::connect(addr, Duration::from_secs(5))?;
///     rendezvous.exchange_hello(hello(1))?;
///     rendezvous.exchange_ready()?;
///     rendezvous.into_watch()
/// });
/// let mut accepted = listener.accept()?;
/// accepted.exchange_hello(hello(2))?;
/// accepted.exchange_ready()?;
/// let mut watch = accepted.into_watch()?;
/// let mut peer = client.join().unwrap()?;
/// assert!(!watch.peer_gone());
/// peer.close();
/// while !watch.peer_gone() {
///     std::thread::yield_now();
/// }
/// # Ok::<(), HandshakeError>(())
/// ```
#[derive(Debug)]
pub struct PeerWatch {
    stream: TcpStream,
}

impl PeerWatch {
    /// Whether the peer closed the connection or can no longer be reached. Never blocks:
    /// one non-blocking read.
    pub fn peer_gone(&mut self) -> bool {
        let mut byte = [0u8; 1];
        loop {
            return match self.stream.read(&mut byte) {
                // Nothing is sent after the handshake: any byte is a peer off the protocol,
                // which is treated like one that left.
                Ok(_) => true,
                Err(error) if error.kind() == io::ErrorKind::Interrupted => continue,
                Err(error) if error.kind() == io::ErrorKind::WouldBlock => false,
                Err(_) => true,
            };
        }
    }

    /// The connection's socket: readable (or hung up) once the peer closes or dies, so a
    /// sleeper can wait on it.
    pub fn as_fd(&self) -> BorrowedFd<'_> {
        self.stream.as_fd()
    }

    /// Tells the peer this side closed. Closing twice does nothing more.
    pub fn close(&mut self) {
        // The socket may already be shut down or reset by the peer; either way the peer
        // learns (or has learnt) that this side is gone, which is all this call is for.
        let _ = self.stream.shutdown(Shutdown::Both);
    }
}
