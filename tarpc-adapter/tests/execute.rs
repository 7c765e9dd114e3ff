//! A tarpc server as its users write one, over tierbuf's shared memory: its channel run
//! by `BaseChannel::execute` in a task of its own, each request handled in a task
//! spawned for it, on multi-thread runtimes, with four calls in flight on the
//! connection. Responses reach the channel's task through tarpc's own queue while the
//! channel reads, so the connection is read and written from one task woken by others.
//! Every call must be answered: a lost wake shows as a call past its deadline.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use tarpc::context::Context;
use tarpc::server::{BaseChannel, Channel};
use tierbuf_tarpc::TierbufTransport;
use tierbuf_transport::Transport;

#[tarpc::service]
trait Echo {
    async fn echo(payload: Vec<u8>) -> Vec<u8>;
}

#[derive(Clone)]
struct EchoServer;

impl Echo for EchoServer {
    async fn echo(self, _: Context, payload: Vec<u8>) -> Vec<u8> {
        payload
    }
}

const IN_FLIGHT: usize = 4;
const CALLS_PER_LANE: usize = 2500;
/// Far past any call's time on a loaded machine, yet short enough to fail a stall soon.
const DEADLINE: Duration = Duration::from_secs(5);

fn runtime(workers: usize) -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(workers)
        .enable_all()
        .build()
        .expect("a tokio runtime")
}

fn socket_path(name: &str) -> PathBuf {
    let name = format!("tierbuf-tarpc-execute-{}-{name}.sock", std::process::id());
    std::env::temp_dir().join(name)
}

/// Serves one shm connection with `execute` and spawned handlers on a runtime of
/// `workers` threads, and calls it from another: `IN_FLIGHT` lanes of calls, each reply
/// checked, each call with a deadline of its own.
fn executed_handlers_answer_every_call(name: &str, workers: usize) {
    let path = socket_path(name);
    let build = || {
        Transport::shm()
            .ladder_preset("rpc")
            .build()
            .expect("an shm transport")
    };
    let listener = build().listen(&path).expect("listen");
    let server = std::thread::spawn(move || {
        let connection = listener.accept().expect("accept");
        runtime(workers).block_on(async move {
            let transport = TierbufTransport::from_connection(connection).expect("in tokio");
            BaseChannel::with_defaults(transport)
                .execute(EchoServer.serve())
                .for_each(|call| async {
                    tokio::spawn(call);
                })
                .await;
        });
    });
    let node = build();
    let clients = runtime(workers);
    clients.block_on(async {
        let connection = node.connect(&path).expect("connect");
        let transport = TierbufTransport::from_connection(connection).expect("in tokio");
        let client = EchoClient::new(tarpc::client::Config::default(), transport).spawn();
        let lanes: Vec<_> = (0..IN_FLIGHT)
            .map(|lane| {
                let client = client.clone();
                tokio::spawn(async move {
                    for call in 0..CALLS_PER_LANE {
                        let payload = vec![(lane * 7 + call) as u8; 64];
                        let mut context = tarpc::context::current();
                        context.deadline = Instant::now() + DEADLINE;
                        let reply = client.echo(context, payload.clone()).await;
                        let reply = reply
                            .unwrap_or_else(|error| panic!("lane {lane}, call {call}: {error}"));
                        assert_eq!(reply, payload, "lane {lane}, call {call}");
                    }
                })
            })
            .collect();
        for lane in lanes {
            lane.await.expect("a lane of calls");
        }
    });
    drop(clients);
    server.join().expect("the server's thread");
}

#[test]
fn executed_handlers_on_one_worker_answer_every_call() {
    executed_handlers_answer_every_call("one", 1);
}

#[test]
fn executed_handlers_on_two_workers_answer_every_call() {
    executed_handlers_answer_every_call("two", 2);
}
