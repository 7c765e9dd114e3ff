//! `service/tarpc`: the time per call of a tarpc echo of 64 B, with 4 calls in flight on
//! each connection, over tierbuf's shared memory (`tierbuf-tarpc`) and over what tarpc
//! users run today: its serde transports on TCP and Unix sockets, with the same codec
//! (postcard), and its in-process channel.
//!
//! - `tierbuf_shm_c1`, `tcp_c1`, `unix_c1`, `channel_c1`: one connection;
//!   `tierbuf_shm_c64`, `tcp_c64`: 64.
//! - The server of `tierbuf_shm`, `tcp` and `unix` is a child process (this bench binary
//!   again, as for `service/echo_64B`); that of `channel`, which cannot leave the
//!   process, a thread. Each server runs tarpc as its users write one: every connection's
//!   channel under `BaseChannel::execute` in a task of its own, every call handled in a
//!   task spawned for it, on a tokio runtime of one worker. The clients run on another
//!   runtime of one worker, in the bench's process.

use std::io::{self, Write};
use std::marker::PhantomData;
use std::path::Path;
use std::pin::Pin;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use criterion::{Criterion, Throughput};
use futures_util::StreamExt;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_bytes::ByteBuf;
use tarpc::context::Context;
use tarpc::serde_transport;
use tarpc::server::{BaseChannel, Channel};
use tarpc::tokio_serde;
use tierbuf_tarpc::TierbufTransport;
use tierbuf_transport::Transport;
use tokio::runtime::Runtime;

use super::{Server, socket_path};

/// Calls in flight on each connection.
const IN_FLIGHT: usize = 4;
/// Each request's payload, and each reply's.
const PAYLOAD: usize = 64;
/// The ladder of the tierbuf connections: the one for RPC.
const LADDER: &str = "rpc";

#[tarpc::service]
trait Echo {
    async fn echo(payload: ByteBuf) -> ByteBuf;
}

#[derive(Clone)]
struct EchoServer;

impl Echo for EchoServer {
    async fn echo(self, _: Context, payload: ByteBuf) -> ByteBuf {
        payload
    }
}

/// postcard as a tokio-serde codec, for tarpc's serde transports over sockets.
struct Postcard<Item, SinkItem>(PhantomData<fn(SinkItem) -> Item>);

impl<Item, SinkItem> Postcard<Item, SinkItem> {
    fn new() -> Self {
        Postcard(PhantomData)
    }
}

impl<Item, SinkItem: Serialize> tokio_serde::Serializer<SinkItem> for Postcard<Item, SinkItem> {
    type Error = io::Error;

    fn serialize(self: Pin<&mut Self>, item: &SinkItem) -> io::Result<Bytes> {
        postcard::to_allocvec(item)
            .map(Bytes::from)
            .map_err(io::Error::other)
    }
}

impl<Item: DeserializeOwned, SinkItem> tokio_serde::Deserializer<Item>
    for Postcard<Item, SinkItem>
{
    type Error = io::Error;

    fn deserialize(self: Pin<&mut Self>, src: &BytesMut) -> io::Result<Item> {
        postcard::from_bytes(src).map_err(io::Error::other)
    }
}

fn runtime() -> Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("a tokio runtime")
}

fn shm_transport(connections: usize) -> Transport<tierbuf_transport::Shm> {
    Transport::shm()
        .ladder_preset(LADDER)
        .connections(connections)
        .build()
        .expect("an shm transport")
}

/// Serves the connections of `transports`, each call in a task of its own, until their
/// clients hang up.
async fn serve_all<T>(transports: Vec<T>)
where
    T: tarpc::Transport<tarpc::Response<EchoResponse>, tarpc::ClientMessage<EchoRequest>>
        + Send
        + 'static,
{
    let channels: Vec<_> = transports
        .into_iter()
        .map(|transport| {
            tokio::spawn(
                BaseChannel::with_defaults(transport)
                    .execute(EchoServer.serve())
                    .for_each(|call| async {
                        tokio::spawn(call);
                    }),
            )
        })
        .collect();
    for channel in channels {
        channel.await.expect("a channel");
    }
}

/// Tells the client where the server listens.
fn say_listening(address: impl std::fmt::Display) {
    println!("listening {address}");
    std::io::stdout().flush().expect("the listening line");
}

/// The server process of `tierbuf_shm`: `count` connections at `path`.
pub(super) fn serve_shm(count: usize, path: &Path) {
    let listener = shm_transport(count).listen(path).expect("listen");
    say_listening(path.display());
    let connections: Vec<_> = (0..count)
        .map(|_| listener.accept().expect("accept"))
        .collect();
    runtime().block_on(async {
        let transports = connections
            .into_iter()
            .map(|connection| TierbufTransport::from_connection(connection).expect("in tokio"))
            .collect();
        serve_all(transports).await;
    });
}

/// The server process of `tcp`: `count` connections on 127.0.0.1.
pub(super) fn serve_tcp(count: usize) {
    runtime().block_on(async {
        let mut listener = serde_transport::tcp::listen("127.0.0.1:0", Postcard::new)
            .await
            .expect("a TCP listener");
        say_listening(listener.local_addr());
        let mut transports = Vec::new();
        for _ in 0..count {
            let transport = listener.next().await.expect("a peer").expect("accept");
            // As the echo group's TCP peer: small messages go out at once.
            transport.get_ref().set_nodelay(true).expect("TCP_NODELAY");
            transports.push(transport);
        }
        serve_all(transports).await;
    });
}

/// The server process of `unix`: `count` connections at `path`.
pub(super) fn serve_unix(count: usize, path: &Path) {
    runtime().block_on(async {
        let mut listener = serde_transport::unix::listen(path, Postcard::new)
            .await
            .expect("a Unix listener");
        say_listening(path.display());
        let mut transports = Vec::new();
        for _ in 0..count {
            transports.push(listener.next().await.expect("a peer").expect("accept"));
        }
        drop(listener);
        let _ = std::fs::remove_file(path);
        serve_all(transports).await;
    });
}

/// Where a bench function's server runs: a child process, waited for when this is
/// dropped ([`Server`]), or a thread of this process, joined then.
struct ServerSide {
    _process: Option<Server>,
    thread: Option<JoinHandle<()>>,
}

impl ServerSide {
    fn process(server: Server) -> ServerSide {
        ServerSide {
            _process: Some(server),
            thread: None,
        }
    }

    fn thread(thread: JoinHandle<()>) -> ServerSide {
        ServerSide {
            _process: None,
            thread: Some(thread),
        }
    }
}

impl Drop for ServerSide {
    fn drop(&mut self) {
        if let Some(thread) = self.thread.take() {
            thread.join().expect("the server's thread");
        }
    }
}

/// One bench function's clients, their runtime and their server, dropped in that order:
/// the clients hang up before their server is waited for.
struct Setup {
    clients: Vec<EchoClient>,
    runtime: Runtime,
    _server: ServerSide,
}

impl Setup {
    /// `connections` clients, each made by `connect` in the clients' runtime.
    fn new<F, Fut>(connections: usize, server: ServerSide, connect: F) -> Setup
    where
        F: Fn() -> Fut,
        Fut: Future<Output = EchoClient>,
    {
        let runtime = runtime();
        let clients = (0..connections)
            .map(|_| runtime.block_on(connect()))
            .collect();
        Setup {
            clients,
            runtime,
            _server: server,
        }
    }

    /// Makes `calls` calls (at least), `IN_FLIGHT` at a time on each connection, each
    /// reply checked, and returns the time they took scaled to `calls`.
    fn time(&self, calls: u64) -> Duration {
        let lanes = (self.clients.len() * IN_FLIGHT) as u64;
        let per_lane = calls.div_ceil(lanes);
        self.runtime.block_on(async {
            let started = Instant::now();
            let tasks: Vec<_> = self
                .clients
                .iter()
                .flat_map(|client| std::iter::repeat_n(client, IN_FLIGHT))
                .map(|client| {
                    let client = client.clone();
                    tokio::spawn(async move {
                        let payload = ByteBuf::from(vec![7; PAYLOAD]);
                        for _ in 0..per_lane {
                            let reply = client
                                .echo(tarpc::context::current(), payload.clone())
                                .await
                                .expect("a reply");
                            assert_eq!(reply, payload, "the echo differs");
                        }
                    })
                })
                .collect();
            for task in tasks {
                task.await.expect("a lane of calls");
            }
            started
                .elapsed()
                .mul_f64(calls as f64 / (per_lane * lanes) as f64)
        })
    }
}

fn tierbuf_shm(connections: usize) -> Setup {
    let path = socket_path(&format!("tarpc-shm{connections}"));
    let server = Server::start(&format!("tarpc-shm:{connections}:{}", path.display()));
    let node = shm_transport(connections);
    let address = server.address.clone();
    Setup::new(connections, ServerSide::process(server), || async {
        let connection = node.connect(Path::new(&address)).expect("connect");
        let transport = TierbufTransport::from_connection(connection).expect("in tokio");
        EchoClient::new(tarpc::client::Config::default(), transport).spawn()
    })
}

fn tcp(connections: usize) -> Setup {
    let server = Server::start(&format!("tarpc-tcp:{connections}"));
    let address: std::net::SocketAddr = server.address.parse().expect("the server's address");
    Setup::new(connections, ServerSide::process(server), || async move {
        let transport = serde_transport::tcp::connect(address, Postcard::new)
            .await
            .expect("connect");
        transport.get_ref().set_nodelay(true).expect("TCP_NODELAY");
        EchoClient::new(tarpc::client::Config::default(), transport).spawn()
    })
}

fn unix(connections: usize) -> Setup {
    let path = socket_path(&format!("tarpc-unix{connections}"));
    let server = Server::start(&format!("tarpc-unix:{connections}:{}", path.display()));
    let address = server.address.clone();
    Setup::new(connections, ServerSide::process(server), || async {
        let transport = serde_transport::unix::connect(&address, Postcard::new)
            .await
            .expect("connect");
        EchoClient::new(tarpc::client::Config::default(), transport).spawn()
    })
}

fn channel() -> Setup {
    let (client, server) = tarpc::transport::channel::unbounded();
    let server = std::thread::spawn(move || runtime().block_on(serve_all(vec![server])));
    let transport = std::sync::Mutex::new(Some(client));
    Setup::new(1, ServerSide::thread(server), || async {
        let transport = transport.lock().expect("one").take().expect("one client");
        EchoClient::new(tarpc::client::Config::default(), transport).spawn()
    })
}

/// Makes a bench function's setup.
type MakeSetup = fn() -> Setup;

pub(super) fn service_tarpc(c: &mut Criterion) {
    let mut group = c.benchmark_group("service/tarpc");
    group.throughput(Throughput::Elements(1));
    let setups: [(&str, MakeSetup); 6] = [
        ("tierbuf_shm_c1", || tierbuf_shm(1)),
        ("tcp_c1", || tcp(1)),
        ("unix_c1", || unix(1)),
        ("channel_c1", channel),
        ("tierbuf_shm_c64", || tierbuf_shm(64)),
        ("tcp_c64", || tcp(64)),
    ];
    for (name, make) in setups {
        // Made when the function runs first, so one that a filter leaves out starts no
        // server; dropped (its clients hung up, its server waited for) after it.
        let mut setup = None;
        group.bench_function(name, |b| {
            let setup = setup.get_or_insert_with(make);
            b.iter_custom(|calls| setup.time(calls))
        });
    }
    group.finish();
}
