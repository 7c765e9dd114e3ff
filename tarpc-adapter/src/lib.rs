//! A [tarpc] transport over tierbuf connections.
//!
//! tarpc runs its clients and servers over any [`Stream`] + [`Sink`] of its request and
//! response types. [`TierbufTransport`] is one over an [`AsyncConnection`]: each item
//! is serialised with [postcard] into one tierbuf message (promoted, or segmented past
//! the top tier, as the connection decides), and each message received is deserialised
//! straight from the connection's [`Message`](tierbuf_transport::connection::Message),
//! in its registered receive slot where the connection kept it there: nothing copies the
//! frame first, and only the owned fields of the item (a `Vec<u8>` payload, a `String`)
//! copy out of it.
//!
//! ```
//! use futures_util::StreamExt;
//! use tarpc::server::{BaseChannel, Channel};
//! use tierbuf_tarpc::TierbufTransport;
//! use tierbuf_transport::Transport;
//!
//! #[tarpc::service]
//! trait Echo {
//!     async fn echo(bytes: Vec<u8>) -> Vec<u8>;
//! }
//!
//! #[derive(Clone)]
//! struct Server;
//!
//! impl Echo for Server {
//!     async fn echo(self, _: tarpc::context::Context, bytes: Vec<u8>) -> Vec<u8> {
//!         bytes
//!     }
//! }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let node = Transport::loopback().ladder_preset("rpc").budget_bytes(64 << 20).build()?;
//! let listener = node.listen("echo")?;
//! let client = TierbufTransport::from_connection(node.connect("echo")?)?;
//! let server = TierbufTransport::from_connection(listener.accept()?)?;
//! tokio::spawn(
//!     BaseChannel::with_defaults(server)
//!         .execute(Server.serve())
//!         .for_each(|call| async { tokio::spawn(call); }),
//! );
//! let client = EchoClient::new(tarpc::client::Config::default(), client).spawn();
//! for len in [64, 4 << 10, 200 << 10] { // promoted, then segmented past the top tier
//!     let request = vec![len as u8; len];
//!     assert_eq!(client.echo(tarpc::context::current(), request.clone()).await?, request);
//! }
//! # Ok(())
//! # }
//! ```
//!
//! Over shared memory the server is another process: it listens with
//! `Transport::shm().listen(path)` and the client connects to the same path; nothing
//! else changes.

use std::fmt;
use std::io;
use std::marker::PhantomData;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll, ready};

use futures_core::Stream;
use futures_sink::Sink;
use serde::Serialize;
use serde::de::DeserializeOwned;
use tierbuf_transport::Endpoint;
use tierbuf_transport::connection::{
    AsyncConnection, Connection, ConnectionError, ConnectionStats,
};

/// The scratch buffer items are serialised into is kept between sends up to this
/// capacity; a larger one (a rare bulk item) is given back after its send.
const KEPT_SCRATCH: usize = 64 << 10;

/// The transport a tarpc client runs on: requests out, responses in.
pub type ClientTransport<E, Req, Resp> =
    TierbufTransport<E, tarpc::Response<Resp>, tarpc::ClientMessage<Req>>;

/// The transport a tarpc server runs on: requests in, responses out.
pub type ServerTransport<E, Req, Resp> =
    TierbufTransport<E, tarpc::ClientMessage<Req>, tarpc::Response<Resp>>;

/// A tarpc transport over a tierbuf connection: a [`Stream`] of the `Item`s it
/// receives and a [`Sink`] of the `SinkItem`s it sends, one tierbuf message each,
/// serialised with postcard.
///
/// tarpc's clients want a [`ClientTransport`] and its servers a [`ServerTransport`];
/// the type parameters are inferred from the service where the transport is used. The
/// stream ends when the peer closes the connection.
///
/// ```
/// use futures_util::{SinkExt, StreamExt};
/// use tierbuf_tarpc::TierbufTransport;
/// use tierbuf_transport::Transport;
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let node = Transport::loopback().ladder_preset("rpc").budget_bytes(16 << 20).build()?;
/// let listener = node.listen("words")?;
/// let mut a = TierbufTransport::<_, String, String>::from_connection(node.connect("words")?)?;
/// let mut b = TierbufTransport::<_, String, String>::from_connection(listener.accept()?)?;
/// a.send("hello".to_string()).await?;
/// assert_eq!(b.next().await.expect("a message")?, "hello");
/// drop(a);
/// assert!(b.next().await.is_none(), "the stream ends when the peer closes");
/// # Ok(())
/// # }
/// ```
pub struct TierbufTransport<E: Endpoint, Item, SinkItem> {
    connection: AsyncConnection<E>,
    /// Where the sink serialises an item before handing it to the connection.
    scratch: Vec<u8>,
    /// Where the connection's stats are published, once someone watches them.
    stats: Option<Arc<Mutex<ConnectionStats>>>,
    /// The connection's [`progress_made`](AsyncConnection::progress_made) when the stream last
    /// published its stats.
    published_at: u64,
    items: PhantomData<fn(SinkItem) -> Item>,
}

impl<E: Endpoint, Item, SinkItem> TierbufTransport<E, Item, SinkItem> {
    /// A transport over `connection`.
    pub fn new(connection: AsyncConnection<E>) -> TierbufTransport<E, Item, SinkItem> {
        TierbufTransport {
            connection,
            scratch: Vec::new(),
            stats: None,
            published_at: 0,
            items: PhantomData,
        }
    }

    /// A transport over `connection`, driven by the tokio runtime it is called in (a
    /// [`Connection`] from the front door's `connect` or `accept`, say).
    ///
    /// # Errors
    ///
    /// As [`AsyncConnection::new`]: the endpoint's descriptor could not be duplicated or
    /// registered with tokio's reactor.
    ///
    /// # Panics
    ///
    /// Outside a tokio runtime with IO enabled.
    pub fn from_connection(
        connection: Connection<E>,
    ) -> io::Result<TierbufTransport<E, Item, SinkItem>>
    where
        E: 'static,
    {
        Ok(TierbufTransport::new(AsyncConnection::new(connection)?))
    }

    /// The connection, for its stats and its calls.
    pub fn get_mut(&mut self) -> &mut AsyncConnection<E> {
        &mut self.connection
    }

    /// A handle on the connection's stats that outlives handing the transport to
    /// tarpc (which keeps it): they are published as they are now, after every poll of
    /// the stream that received an item or made progress (one woken by a timer that
    /// changed the tier with nothing received, say), and when the stream ends or the
    /// transport is dropped.
    ///
    /// ```
    /// use futures_util::{SinkExt, StreamExt};
    /// use tierbuf_tarpc::TierbufTransport;
    /// use tierbuf_transport::Transport;
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let node = Transport::loopback().ladder_preset("rpc").budget_bytes(16 << 20).build()?;
    /// let listener = node.listen("bulk")?;
    /// let mut a = TierbufTransport::<_, Vec<u8>, Vec<u8>>::from_connection(node.connect("bulk")?)?;
    /// let mut b = TierbufTransport::<_, Vec<u8>, Vec<u8>>::from_connection(listener.accept()?)?;
    /// let watch = a.watch_stats();
    /// a.send(vec![7; 4 << 10]).await?; // past the rpc ladder's first tier
    /// assert_eq!(b.next().await.expect("a message")?.len(), 4 << 10);
    /// b.send(vec![1]).await?; // after the tier's ack
    /// assert_eq!(a.next().await.expect("a reply")?, [1]);
    /// assert_eq!(watch.latest().tiers.promotions, 1);
    /// # Ok(())
    /// # }
    /// ```
    pub fn watch_stats(&mut self) -> StatsWatch {
        let cell = Arc::clone(
            self.stats
                .get_or_insert_with(|| Arc::new(Mutex::new(ConnectionStats::default()))),
        );
        self.publish_stats();
        StatsWatch { cell }
    }

    fn publish_stats(&mut self) {
        if let Some(cell) = &self.stats {
            *cell.lock().unwrap_or_else(PoisonError::into_inner) = self.connection.stats();
        }
    }
}

/// The stats of a [`TierbufTransport`]'s connection as it last published them
/// ([`TierbufTransport::watch_stats`]).
#[derive(Debug, Clone)]
pub struct StatsWatch {
    cell: Arc<Mutex<ConnectionStats>>,
}

impl StatsWatch {
    /// The stats last published.
    pub fn latest(&self) -> ConnectionStats {
        *self.cell.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Why a [`TierbufTransport`] failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The connection failed (the peer's process died, say, or broke the protocol).
    #[error("the tierbuf connection failed")]
    Connection(#[source] Arc<ConnectionError>),
    /// An item could not be serialised.
    #[error("an item could not be serialised")]
    Serialise(#[source] postcard::Error),
    /// A message received is not an item of the type expected.
    #[error("a message of {len} bytes is not an item of the type expected")]
    Deserialise {
        /// The message's length.
        len: usize,
        /// What postcard found wrong.
        #[source]
        source: postcard::Error,
    },
}

/// The items the connection receives, in order, each deserialised from its message in
/// place; the stream ends when the peer closes.
impl<E, Item, SinkItem> Stream for TierbufTransport<E, Item, SinkItem>
where
    E: Endpoint + Unpin,
    Item: DeserializeOwned,
{
    type Item = Result<Item, Error>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        // Published after a poll that received, and after one that received nothing
        // but made progress: a timer's demotion is seen by the poll it wakes. A poll that
        // did nothing (a spin before parking, say) changed nothing to publish.
        let received = Pin::new(&mut this.connection).poll_next(cx);
        let progress_made = this.connection.progress_made();
        if received.is_ready() || progress_made != this.published_at {
            this.published_at = progress_made;
            this.publish_stats();
        }
        let received = ready!(received);
        Poll::Ready(received.map(|message| {
            let message = message.map_err(Error::Connection)?;
            postcard::from_bytes(&message).map_err(|source| Error::Deserialise {
                len: message.len(),
                source,
            })
        }))
    }
}

/// Items to send, each serialised into one message taken whole by the connection
/// ([`AsyncConnection`]'s sink); flushing waits until every send has completed.
impl<E, Item, SinkItem> Sink<SinkItem> for TierbufTransport<E, Item, SinkItem>
where
    E: Endpoint + Unpin,
    SinkItem: Serialize,
{
    type Error = Error;

    fn poll_ready(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<(), Error>> {
        let connection = Pin::new(&mut self.get_mut().connection);
        Sink::<&[u8]>::poll_ready(connection, cx).map_err(Error::Connection)
    }

    fn start_send(self: Pin<&mut Self>, item: SinkItem) -> Result<(), Error> {
        let this = self.get_mut();
        let mut scratch = std::mem::take(&mut this.scratch);
        scratch.clear();
        let scratch = postcard::to_extend(&item, scratch).map_err(Error::Serialise)?;
        let sent = Pin::new(&mut this.connection).start_send(&scratch[..]);
        if scratch.capacity() <= KEPT_SCRATCH {
            this.scratch = scratch;
        }
        sent.map_err(Error::Connection)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<(), Error>> {
        let connection = Pin::new(&mut self.get_mut().connection);
        Sink::<&[u8]>::poll_flush(connection, cx).map_err(Error::Connection)
    }

    fn poll_close(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<(), Error>> {
        let this = self.get_mut();
        let closed = Sink::<&[u8]>::poll_close(Pin::new(&mut this.connection), cx);
        this.publish_stats();
        closed.map_err(Error::Connection)
    }
}

impl<E: Endpoint, Item, SinkItem> Drop for TierbufTransport<E, Item, SinkItem> {
    fn drop(&mut self) {
        self.publish_stats();
    }
}

impl<E: Endpoint, Item, SinkItem> fmt::Debug for TierbufTransport<E, Item, SinkItem> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TierbufTransport")
            .field("connection", &self.connection)
            .field("watched", &self.stats.is_some())
            .finish_non_exhaustive()
    }
}
