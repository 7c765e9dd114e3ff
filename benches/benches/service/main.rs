//! A service's view: one server thread echoing 64 B requests to clients in another
//! process, as a user builds it with the front door and readiness, against the same echo
//! over tokio's TCP and Unix stream sockets.
//!
//! - `service/echo_64B/connections_1`: one shm connection, one request in flight; time
//!   per round trip (request sent to reply received).
//! - `service/echo_64B/connections_64`: 64 shm connections, one request in flight on
//!   each; time per round of 64 requests and their replies (throughput in requests).
//! - `service/echo_64B/idle_10000_busy_1`: 10 000 shm connections open, one of them
//!   busy; time per round trip on the busy one. The server's thread waits on its table's
//!   readiness (`ConnectionTable::wait_ready`), so the idle connections should cost it
//!   nothing: the goal is within 1.5× of `connections_1`. Each process holds a socket
//!   per connection and no other descriptor for it, so 10 000 fit under a hard limit of
//!   20 000 open files.
//! - `service/echo_64B/tcp_connections_1`, `unix_connections_1`: the same echo over
//!   tokio's `TcpStream` on 127.0.0.1 and a Unix stream socket, each side a tokio
//!   current-thread runtime.
//!
//! The server is a child process (this bench binary again, started with
//! `TIERBUF_SERVICE_BENCH_SERVER` set), one thread, serving every connection it accepts
//! until its clients hang up. Every reply is checked against its request.
//!
//! The group `service/tarpc` (module `tarpc_echo`) times tarpc calls over tierbuf against
//! tarpc's own transports, its servers started the same way.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use criterion::{Criterion, Throughput, criterion_group};
use tierbuf_transport::connection::{Connection, ConnectionTable};
use tierbuf_transport::{ShmEndpoint, Transport};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

mod tarpc_echo;

/// Set in the server process: what it serves (`shm:COUNT:PATH`, `tcp`, `unix:PATH`;
/// for `service/tarpc`, `tarpc-shm:COUNT:PATH`, `tarpc-tcp:COUNT`, `tarpc-unix:COUNT:PATH`).
const SERVER_ROLE: &str = "TIERBUF_SERVICE_BENCH_SERVER";

/// The request and reply size.
const PAYLOAD: usize = 64;

/// The idle connections beside the busy one in `idle_10000_busy_1`.
const IDLE_CONNECTIONS: usize = 10_000;

/// The ladder every shm connection uses: small tiers first, as a service's would.
const LADDER: &str = "two-tier";

/// Registered memory each process may hold: 10 000 connections on the `two-tier` ladder
/// take about 160 MiB a side.
const BUDGET: u64 = 1 << 30;

fn transport(connections: usize) -> Transport<tierbuf_transport::Shm> {
    Transport::shm()
        .ladder_preset(LADDER)
        .budget_bytes(BUDGET)
        .connections(connections)
        .build()
        .expect("an shm transport")
}

/// The server process and the way to reach it.
struct Server {
    child: Child,
    /// The address it printed once listening.
    address: String,
}

impl Server {
    /// Starts this binary as a server for `role` and waits for its `listening ADDRESS`.
    fn start(role: &str) -> Server {
        let mut child = Command::new(std::env::current_exe().expect("this bench binary"))
            .env(SERVER_ROLE, role)
            .stdout(Stdio::piped())
            .stdin(Stdio::piped())
            .spawn()
            .expect("the server process");
        let mut line = String::new();
        BufReader::new(child.stdout.as_mut().expect("its stdout"))
            .read_line(&mut line)
            .expect("its listening line");
        let address = line
            .trim()
            .strip_prefix("listening ")
            .unwrap_or_else(|| panic!("the server said {line:?}"))
            .to_string();
        Server { child, address }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        drop(self.child.stdin.take());
        let _ = self.child.wait();
    }
}

/// A socket path of this run.
fn socket_path(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!(
        "tierbuf-bench-service-{}-{name}",
        std::process::id()
    ))
}

/// One round trip on `connection`: sends `request`, waits for its echo and checks it.
fn round_trip(connection: &mut Connection<ShmEndpoint>, request: &[u8]) {
    connection.send(request).expect("a request");
    let reply = connection.recv().expect("a reply");
    assert_eq!(&reply[..], request, "the echo differs");
}

/// `count` shm connections to a fresh server.
fn shm_clients(count: usize, name: &str) -> (Server, Vec<Connection<ShmEndpoint>>) {
    let path = socket_path(name);
    let server = Server::start(&format!("shm:{count}:{}", path.display()));
    let transport = transport(count);
    let connections = (0..count)
        .map(|_| {
            transport
                .connect(Path::new(&server.address))
                .expect("connect")
        })
        .collect();
    (server, connections)
}

fn echo_64b(c: &mut Criterion) {
    let mut group = c.benchmark_group("service/echo_64B");
    let request = [7u8; PAYLOAD];

    let (server, mut connections) = shm_clients(1, "c1");
    group.throughput(Throughput::Elements(1));
    group.bench_function("connections_1", |b| {
        b.iter(|| round_trip(&mut connections[0], &request))
    });
    drop((connections, server));

    let (server, mut connections) = shm_clients(64, "c64");
    group.throughput(Throughput::Elements(64));
    group.bench_function("connections_64", |b| {
        b.iter(|| {
            for connection in connections.iter_mut() {
                connection.send(&request).expect("a request");
            }
            for connection in connections.iter_mut() {
                let reply = connection.recv().expect("a reply");
                assert_eq!(&reply[..], &request[..], "the echo differs");
            }
        })
    });
    drop((connections, server));

    let (server, mut connections) = shm_clients(IDLE_CONNECTIONS + 1, "idle");
    group.throughput(Throughput::Elements(1));
    group.bench_function("idle_10000_busy_1", |b| {
        b.iter(|| round_trip(&mut connections[0], &request))
    });
    drop((connections, server));

    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    let server = Server::start("tcp");
    let mut tcp = runtime
        .block_on(tokio::net::TcpStream::connect(&server.address))
        .expect("connect");
    tcp.set_nodelay(true).expect("TCP_NODELAY");
    group.bench_function("tcp_connections_1", |b| {
        b.iter(|| runtime.block_on(stream_round_trip(&mut tcp, &request)))
    });
    drop((tcp, server));

    let path = socket_path("unix");
    let server = Server::start(&format!("unix:{}", path.display()));
    let mut unix = runtime
        .block_on(tokio::net::UnixStream::connect(&server.address))
        .expect("connect");
    group.bench_function("unix_connections_1", |b| {
        b.iter(|| runtime.block_on(stream_round_trip(&mut unix, &request)))
    });
    drop((unix, server));
    group.finish();
}

/// One echo of `request` over a byte stream.
async fn stream_round_trip<S: AsyncReadExt + AsyncWriteExt + Unpin>(
    stream: &mut S,
    request: &[u8],
) {
    stream.write_all(request).await.expect("a request");
    let mut reply = [0u8; PAYLOAD];
    stream.read_exact(&mut reply).await.expect("a reply");
    assert_eq!(&reply[..], request, "the echo differs");
}

/// The server process: serves `role` until its clients hang up (or its stdin closes).
fn serve(role: &str) {
    let mut fields = role.splitn(3, ':');
    match (fields.next(), fields.next(), fields.next()) {
        (Some("shm"), Some(count), Some(path)) => {
            serve_shm(count.parse().expect("a count"), Path::new(path))
        }
        (Some("tcp"), None, None) => serve_stream_tcp(),
        (Some("unix"), Some(path), None) => serve_stream_unix(Path::new(path)),
        (Some("tarpc-shm"), Some(count), Some(path)) => {
            tarpc_echo::serve_shm(count.parse().expect("a count"), Path::new(path))
        }
        (Some("tarpc-tcp"), Some(count), None) => {
            tarpc_echo::serve_tcp(count.parse().expect("a count"))
        }
        (Some("tarpc-unix"), Some(count), Some(path)) => {
            tarpc_echo::serve_unix(count.parse().expect("a count"), Path::new(path))
        }
        _ => panic!("unknown server role {role:?}"),
    }
}

/// One thread serving `count` shm connections through its table's readiness.
fn serve_shm(count: usize, path: &Path) {
    let transport = transport(count);
    let listener = transport.listen(path).expect("listen");
    println!("listening {}", path.display());
    std::io::stdout().flush().expect("the listening line");
    let table = ConnectionTable::new();
    let mut open = 0;
    for _ in 0..count {
        match listener.accept() {
            Ok(connection) => {
                table.insert(connection);
                open += 1;
            }
            // A client that hung up before its connection was accepted (its bench was
            // filtered out, say) is one fewer to serve.
            Err(tierbuf_transport::SetupError::Connection { .. }) => {}
            Err(error) => panic!("accept: {error}"),
        }
    }
    let mut ready = Vec::new();
    while open > 0 {
        table
            .wait_ready(&mut ready, Duration::from_secs(60))
            .expect("readiness");
        for shared in &ready {
            let mut connection = shared.lock().expect("a connection");
            loop {
                match connection.try_recv() {
                    Ok(Some(request)) => {
                        let echo = request.to_vec();
                        drop(request);
                        connection.send(&echo).expect("an echo");
                    }
                    Ok(None) => break,
                    // The client hung up: this connection is done.
                    Err(_) => {
                        drop(connection);
                        table.remove(shared.id());
                        open -= 1;
                        break;
                    }
                }
            }
        }
    }
}

fn serve_stream_tcp() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    runtime.block_on(async {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        println!("listening {}", listener.local_addr().expect("an address"));
        std::io::stdout().flush().expect("the listening line");
        let (mut stream, _) = listener.accept().await.expect("accept");
        stream.set_nodelay(true).expect("TCP_NODELAY");
        echo_stream(&mut stream).await;
    });
}

fn serve_stream_unix(path: &Path) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    runtime.block_on(async {
        let listener = tokio::net::UnixListener::bind(path).expect("bind");
        println!("listening {}", path.display());
        std::io::stdout().flush().expect("the listening line");
        let (mut stream, _) = listener.accept().await.expect("accept");
        echo_stream(&mut stream).await;
        let _ = std::fs::remove_file(path);
    });
}

/// Echoes 64 B requests until the client hangs up.
async fn echo_stream<S: AsyncReadExt + AsyncWriteExt + Unpin>(stream: &mut S) {
    let mut request = [0u8; PAYLOAD];
    while stream.read_exact(&mut request).await.is_ok() {
        stream.write_all(&request).await.expect("an echo");
    }
}

criterion_group!(benches, echo_64b, tarpc_echo::service_tarpc);

/// Runs as the server process when started as one; otherwise runs the benches.
fn main() {
    if let Ok(role) = std::env::var(SERVER_ROLE) {
        serve(&role);
        return;
    }
    benches();
    Criterion::default().configure_from_args().final_summary();
}
