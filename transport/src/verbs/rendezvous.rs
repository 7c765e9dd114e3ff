//! The TCP side of connection setup, free of any device: a [`RendezvousListener`] that
//! accepts many peers, the [`Rendezvous`] stream each handshake runs on, and the
//! [`PeerWatch`] that the connected endpoint keeps to learn when its peer goes away.
//!
//! Verbs has no way to tell a queue pair that its peer closed (the `ibverbs` 0.9 crate
//! cannot even move a queue pair to the error state), so the TCP connection the
//! handshake ran on stays open for the life of the endpoint: closing an endpoint shuts
//! it down, and the peer reads the end of the stream, as `rdma_cm` uses its own
//! connection for the same purpose.

use std::io::{self, Read};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::time::Duration;

use super::handshake::{self, HandshakeError, Hello};

/// Listens for peers that want to connect and hands out one [`Rendezvous`] per peer.
///
/// ```
/// use std::time::Duration;
/// use tierbuf_transport::verbs::rendezvous::{Rendezvous, RendezvousListener};
/// let listener = RendezvousListener::bind("127.0.0.1:0", Duration::from_secs(5))?;
/// let addr = listener.local_addr()?;
/// let client = std::thread::spawn(move || Rendezvous::connect(addr, Duration::from_secs(5)));
/// let accepted = listener.accept()?;
/// let connected = client.join().unwrap()?;
/// assert_eq!(accepted.peer_addr()?, connected.local_addr()?);
/// # Ok::<(), tierbuf_transport::verbs::handshake::HandshakeError>(())
/// ```
#[derive(Debug)]
pub struct RendezvousListener {
    listener: TcpListener,
    timeout: Duration,
}

impl RendezvousListener {
    /// Listens on `addr`; every accepted handshake waits at most `timeout` for each of the
    /// peer's frames.
    pub fn bind(addr: impl ToSocketAddrs, timeout: Duration) -> Result<Self, HandshakeError> {
        let listener = TcpListener::bind(addr).map_err(|source| HandshakeError::Io {
            operation: "binding the listening socket",
            source,
        })?;
        Ok(RendezvousListener { listener, timeout })
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

    /// Waits for the next peer. A failed handshake with one peer leaves the listener
    /// usable for the next.
    pub fn accept(&self) -> Result<Rendezvous, HandshakeError> {
        let (stream, _) = self
            .listener
            .accept()
            .map_err(|source| HandshakeError::Io {
                operation: "accepting a connection",
                source,
            })?;
        Rendezvous::new(stream, self.timeout)
    }
}

/// One peer's handshake stream.
///
/// ```
/// use std::time::Duration;
/// use ibverbs::QueuePairEndpoint;
/// use tierbuf_tiers::TierIndex;
/// use tierbuf_transport::verbs::handshake::Hello;
/// use tierbuf_transport::verbs::rendezvous::{Rendezvous, RendezvousListener};
/// let timeout = Duration::from_secs(5);
/// let hello = |num| Hello {
///     queue_pair: QueuePairEndpoint { num, lid: 1, gid: None },
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
/// use tierbuf_transport::verbs::rendezvous::{Rendezvous, RendezvousListener};
/// let listener = RendezvousListener::bind("127.0.0.1:0", Duration::from_secs(5))?;
/// let addr = listener.local_addr()?;
/// let client = std::thread::spawn(move || Rendezvous::connect(addr, Duration::from_secs(5)));
/// let mut watch = listener.accept()?.into_watch()?;
/// let mut peer = client.join().unwrap()?.into_watch()?;
/// assert!(!watch.peer_gone());
/// peer.close();
/// while !watch.peer_gone() {
///     std::thread::yield_now();
/// }
/// # Ok::<(), tierbuf_transport::verbs::handshake::HandshakeError>(())
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

    /// Tells the peer this side closed. Closing twice does nothing more.
    pub fn close(&mut self) {
        // The socket may already be shut down or reset by the peer; either way the peer
        // learns (or has learnt) that this side is gone, which is all this call is for.
        let _ = self.stream.shutdown(Shutdown::Both);
    }
}
