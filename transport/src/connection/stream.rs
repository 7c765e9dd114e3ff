//! [`ByteStream`]: tokio's `AsyncRead`, `AsyncBufRead` and `AsyncWrite` over an
//! [`AsyncConnection`] (feature `tokio`), for protocols that speak bytes (HTTP, TLS, a
//! framed codec of their own).
//!
//! # Invariants
//!
//! - A write with any bytes returns at least one of them, or `Pending`, or an error:
//!   never `Ok(0)`, which `write_all` would take for a closed stream. Empty elements
//!   before the first byte are skipped; a write of no bytes returns `Ok(0)` and sends
//!   nothing. So the only empty message a stream sends is its shutdown's.
//! - The bytes a write returns went as one message, by the byte-stream rule of
//!   [`ConnectionCore::try_write_vectored`](super::ConnectionCore::try_write_vectored) (the prefix rule, `docs/policy.md`): the leading whole elements that fit
//!   the tier in force together, or, when the first does not fit, that element, sent at
//!   once in segments while a larger tier is asked for. An element longer than the top
//!   tier's whole message (or the connection's longest message) is offered only a part
//!   that long, so every message a write makes is at most one top-tier frame.
//! - Bytes are read in the order they were written. The message being read is held with
//!   the count of its bytes read, and dropped (its receive slot given back to the
//!   connection) as soon as the last of them is consumed.
//! - **Half close.** A shutdown flushes what was written, then sends one empty message,
//!   the end of this side's writing, and flushes it (a peer that closed meanwhile needs
//!   no telling); the stream goes on reading. The peer's stream reads the end of the
//!   stream (a read of nothing) at that message, after every byte written before it,
//!   and can go on writing. The end of the stream also comes at the peer's orderly
//!   close ([`ConnectionError::PeerClosed`]), after every byte sent before it; once it
//!   has come, no message is read again. Any other failure of the connection is an
//!   [`io::Error`] whose inner error is the connection's.
//! - Each poll goes through one [`AsyncConnection`] call, a read through a receive and a
//!   write, flush or shutdown through a send, so its invariants hold as they are: the
//!   halves of `tokio::io::split` may be polled from two tasks, and the connection keeps
//!   the wakes of both.

use std::io::{self, IoSlice};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use futures_core::Stream;
use futures_sink::Sink;
use tokio::io::{AsyncBufRead, AsyncRead, AsyncWrite, ReadBuf};

use super::core::ConnectionStats;
use super::driver::Connection;
use super::errors::{ConnectionError, SendError};
use super::receive::Message;
use super::tokio::{AsyncConnection, AsyncConnectionGuard};
use crate::provider::Endpoint;

/// A byte stream over a connection: tokio's [`AsyncRead`], [`AsyncBufRead`] and
/// [`AsyncWrite`], for a protocol that reads and writes bytes rather than messages.
///
/// - **Writes** follow the prefix rule ([`ConnectionCore::try_write_vectored`](super::ConnectionCore::try_write_vectored)): a vectored write
///   sends the leading whole elements that fit the tier in force as one message and
///   returns their length; when the first element does not fit, it goes at once, in
///   segments on the tier in force, while a larger tier is asked for, and the writes after
///   it go whole once the peer grants it. An element longer than the top tier's whole
///   message is written a top-tier message at a time. A write waits (`Pending`) only for
///   credits and send slots, or while a segmented message holds the send order.
/// - **Reads** come from the connection's receive slots: [`AsyncBufRead::poll_fill_buf`]
///   lends the unread rest of the current message without copying it, and
///   [`AsyncRead::poll_read`] copies from it. A message's slot goes back to the connection
///   once all of it has been read.
/// - **The end**: [`AsyncWrite::poll_shutdown`] is a half close, as a TCP socket's
///   `shutdown(Write)`: it waits until everything written has been posted and has
///   completed, tells the peer that this side writes no more, and refuses writes after
///   it, while this side goes on reading. A read returns nothing once the peer shut
///   down or closed, after every byte it wrote before. Dropping the stream closes the
///   connection; dropping it without a shutdown may lose bytes written and not yet
///   posted, as an unflushed buffer would. Any other failure of the connection (the peer
///   died, broke the protocol) is an [`io::Error`] whose
///   [`get_ref`](io::Error::get_ref) is the connection's `Arc<ConnectionError>`.
///
/// ```
/// use tokio::io::{AsyncReadExt, AsyncWriteExt};
/// # use std::io::IoSlice;
/// # use std::sync::Arc;
/// # use std::time::Instant;
/// # use tierbuf_pool::MemoryBudget;
/// # use tierbuf_tiers::{Reservoir, ladder::TierLadder};
/// # use tierbuf_transport::connection::{ByteStream, Connection, ConnectionConfig, ConnectionCore};
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
/// let mut client = ByteStream::new(connect(a)?)?;
/// let mut server = ByteStream::new(connect(b)?)?;
/// let serving = tokio::spawn(async move {
///     let mut received = Vec::new();
///     // Ends at the client's shutdown, while the client still reads.
///     server.read_to_end(&mut received).await?;
///     server.write_all(b"HTTP/1.1 204 No Content\r\n\r\n").await?;
///     server.shutdown().await?;
///     Ok::<_, std::io::Error>(received)
/// });
/// // The two-tier ladder's smallest tier takes 480 bytes a message: the two small elements
/// // go as one message, and the large one is left for the next write.
/// let large = vec![7u8; 4000];
/// let parts = [IoSlice::new(b"GET / "), IoSlice::new(b"HTTP/1.1\r\n"), IoSlice::new(&large)];
/// assert_eq!(client.write_vectored(&parts).await?, 16);
/// client.write_all(&large).await?;
/// client.shutdown().await?; // the peer reads the end; this side still reads
/// let mut reply = String::new();
/// client.read_to_string(&mut reply).await?;
/// assert_eq!(reply, "HTTP/1.1 204 No Content\r\n\r\n");
/// let received = serving.await??;
/// assert_eq!(&received[..16], b"GET / HTTP/1.1\r\n");
/// assert!(received[16..] == large[..]);
/// # Ok(())
/// # }
/// ```
#[derive(Debug)]
pub struct ByteStream<E: Endpoint> {
    connection: AsyncConnection<E>,
    /// The message being read, and how many of its bytes have been read.
    reading: Option<(Message, usize)>,
    /// Whether the peer shut down or closed and every byte before has been read.
    ended: bool,
    /// How far this side's shutdown has gone.
    shutdown: Shutdown,
    /// The longest message a write makes: the top tier's whole message, or the
    /// connection's longest message if that is shorter.
    longest_write: usize,
}

impl<E: Endpoint + Unpin> ByteStream<E> {
    /// A byte stream over `connection`, driven by the tokio runtime it is made in.
    ///
    /// # Errors
    ///
    /// As [`AsyncConnection::new`].
    ///
    /// # Panics
    ///
    /// Outside a tokio runtime with IO enabled, as [`AsyncConnection::new`].
    pub fn new(connection: Connection<E>) -> io::Result<ByteStream<E>>
    where
        E: 'static,
    {
        let config = connection.config();
        let top = config.capacity().whole(config.ladder().top());
        let max = usize::try_from(config.max_message_len()).unwrap_or(usize::MAX);
        let longest_write = top.map_or(max, |top| top.min(max)).max(1);
        Ok(ByteStream {
            connection: AsyncConnection::new(connection)?,
            reading: None,
            ended: false,
            shutdown: Shutdown::Writing,
            longest_write,
        })
    }

    /// Counters and state of the connection under the stream ([`Connection::stats`]),
    /// through a shared reference.
    pub fn stats(&self) -> ConnectionStats {
        self.connection.stats()
    }

    /// The connection, for its state and non-blocking calls
    /// ([`AsyncConnection::get_mut`]).
    pub fn get_mut(&mut self) -> AsyncConnectionGuard<'_, E> {
        self.connection.get_mut()
    }

    /// The unread rest of the current message, waiting for the next message with any
    /// bytes when it is all read; empty at the end of the stream.
    fn poll_unread(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<&[u8]>> {
        loop {
            if self.ended || matches!(&self.reading, Some((message, read)) if *read < message.len())
            {
                break;
            }
            // A message read to its end (or empty) gives its receive slot back.
            self.reading = None;
            match ready!(Pin::new(&mut self.connection).poll_next(cx)) {
                // The peer's shutdown (module invariants).
                Some(Ok(message)) if message.is_empty() => self.ended = true,
                Some(Ok(message)) => self.reading = Some((message, 0)),
                None => self.ended = true,
                Some(Err(failure)) => return Poll::Ready(Err(io_error(failure))),
            }
        }
        Poll::Ready(Ok(self
            .reading
            .as_ref()
            .map_or(&[][..], |(message, read)| &message[*read..])))
    }

    /// Marks `amount` more bytes of the current message read; drops it once all are.
    fn advance(&mut self, amount: usize) {
        if let Some((message, read)) = &mut self.reading {
            *read = (*read + amount).min(message.len());
            if *read == message.len() {
                self.reading = None;
            }
        }
    }

    /// Polls everything written until it has been posted and has completed. A peer that
    /// closed after every byte written reached it leaves nothing unflushed.
    fn poll_flushed(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let connection = Pin::new(&mut self.connection);
        match ready!(Sink::<&[u8]>::poll_flush(connection, cx)) {
            Err(failure)
                if matches!(*failure, ConnectionError::PeerClosed)
                    && self.connection.get_mut().is_flushed() =>
            {
                Poll::Ready(Ok(()))
            }
            flushed => Poll::Ready(flushed.map_err(io_error)),
        }
    }
}

impl<E: Endpoint + Unpin> AsyncRead for ByteStream<E> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if buf.remaining() == 0 {
            return Poll::Ready(Ok(()));
        }
        let this = self.get_mut();
        let unread = ready!(this.poll_unread(cx))?;
        let amount = unread.len().min(buf.remaining());
        buf.put_slice(&unread[..amount]);
        this.advance(amount);
        Poll::Ready(Ok(()))
    }
}

/// The buffer lent is the unread rest of the current message, in its receive slot when
/// the connection delivered it there.
impl<E: Endpoint + Unpin> AsyncBufRead for ByteStream<E> {
    fn poll_fill_buf(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<&[u8]>> {
        self.get_mut().poll_unread(cx)
    }

    fn consume(self: Pin<&mut Self>, amount: usize) {
        self.get_mut().advance(amount);
    }
}

impl<E: Endpoint + Unpin> AsyncWrite for ByteStream<E> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.poll_write_vectored(cx, &[IoSlice::new(buf)])
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let Some(first) = bufs.iter().position(|part| !part.is_empty()) else {
            return Poll::Ready(Ok(0));
        };
        if this.shutdown != Shutdown::Writing {
            return Poll::Ready(Err(io::Error::new(
                io::ErrorKind::BrokenPipe,
                "the byte stream was shut down",
            )));
        }
        let bufs = &bufs[first..];
        // Elements past the longest message can never join the one this write makes;
        // a first element longer than it is offered a part that long (module invariants).
        let part;
        let offered = if bufs[0].len() > this.longest_write {
            part = [IoSlice::new(&bufs[0][..this.longest_write])];
            &part[..]
        } else {
            let mut total = 0;
            let fitting = bufs
                .iter()
                .take_while(|element| {
                    total += element.len();
                    total <= this.longest_write
                })
                .count();
            &bufs[..fitting]
        };
        this.connection
            .poll_try_send(cx, offered)
            .map_err(|error| match error {
                SendError::Failed(failure) => io_error(failure),
                other => io::Error::new(io::ErrorKind::InvalidInput, other),
            })
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.get_mut().poll_flushed(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        loop {
            match this.shutdown {
                Shutdown::Writing => {
                    ready!(this.poll_flushed(cx))?;
                    this.shutdown = Shutdown::Telling;
                }
                Shutdown::Telling => {
                    let told = ready!(this.connection.poll_send_empty(cx));
                    // Refused or not, nothing more is written.
                    this.shutdown = Shutdown::Told;
                    match told {
                        Ok(()) => {}
                        // A peer that closed needs no telling: the flush below says
                        // whether everything written reached it.
                        Err(SendError::Failed(failure))
                            if matches!(*failure, ConnectionError::PeerClosed) => {}
                        Err(SendError::Failed(failure)) => {
                            return Poll::Ready(Err(io_error(failure)));
                        }
                        Err(other) => return Poll::Ready(Err(io::Error::other(other))),
                    }
                }
                Shutdown::Told => return this.poll_flushed(cx),
            }
        }
    }
}

/// How far a stream's shutdown has gone (module invariants).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Shutdown {
    /// Writes are taken.
    Writing,
    /// Everything written was flushed; the empty message that ends it is to be sent.
    Telling,
    /// The empty message was sent (or refused): writes are refused.
    Told,
}

/// The I/O error for the connection's failure, keeping it as the inner error.
fn io_error(failure: Arc<ConnectionError>) -> io::Error {
    let kind = match &*failure {
        ConnectionError::PeerClosed => io::ErrorKind::BrokenPipe,
        ConnectionError::PeerDied(_) => io::ErrorKind::ConnectionReset,
        ConnectionError::AbandonedMidMessage { .. } => io::ErrorKind::ConnectionAborted,
        ConnectionError::Closed => io::ErrorKind::NotConnected,
        _ => io::ErrorKind::Other,
    };
    io::Error::new(kind, failure)
}
