//! What a blocking server thread costs between requests that come apart: a client sends a
//! 64 B request every `GAP` microseconds (sleeping between them) and waits for its echo;
//! the server thread answers with `Connection::recv` and `Connection::send`, as a
//! thread-per-connection service does. Both threads are in this process, over the front
//! door's shm (`--shm`, the default) or loopback (`--loopback`). Prints the server
//! thread's CPU time as a share of the run's wall time, and the mean time of each
//! direction (request: client's send to server's `recv`; reply: server's send to client's
//! `recv`) and of the round trip. Where the gap is longer than a blocking call's passes,
//! those passes are wasted, and the figures show what they cost (`docs/connection.md`,
//! "Waiting").
//!
//! `cargo run --release -p tierbuf-benches --example gapped_echo -- GAP [ROUNDS]
//! [--loopback]` (`GAP` 2000 and `ROUNDS` 1000 unless given). Timings, not a test: run it
//! on a machine with nothing else busy, and compare runs of the same minutes.

use std::sync::OnceLock;
use std::time::{Duration, Instant};

use tierbuf_benches::clock;
use tierbuf_transport::{ConnectionOf, Kind, Listener, Transport};

/// Nanoseconds since the first call, on a clock both threads read.
fn nanos() -> u64 {
    static START: OnceLock<Instant> = OnceLock::new();
    let elapsed = START.get_or_init(Instant::now).elapsed();
    u64::try_from(elapsed.as_nanos()).expect("a run shorter than 584 years")
}

/// This thread's CPU time.
fn thread_cpu() -> Duration {
    clock(libc::CLOCK_THREAD_CPUTIME_ID)
}

/// The mean of `total` nanoseconds over `count`.
fn mean(total: u64, count: u64) -> Duration {
    Duration::from_nanos(total / count.max(1))
}

/// What the run measured.
struct Figures {
    server_cpu: Duration,
    wall: Duration,
    request: Duration,
    reply: Duration,
    round_trip: Duration,
}

/// The server: echoes every request, stamping the reply with its send time, until the
/// client hangs up; returns its CPU time and the mean request time.
fn serve<K: Kind>(listener: &Listener<K>) -> (Duration, Duration) {
    let mut connection = listener.accept().expect("the client");
    let start = thread_cpu();
    let (mut requests, mut request_nanos) = (0, 0);
    while let Ok(request) = connection.recv() {
        let sent = u64::from_le_bytes(request[..8].try_into().expect("a stamp"));
        request_nanos += nanos() - sent;
        requests += 1;
        let mut reply = request.to_vec();
        reply[..8].copy_from_slice(&nanos().to_le_bytes());
        connection.send(&reply).expect("the echo");
    }
    (thread_cpu() - start, mean(request_nanos, requests))
}

/// `rounds` requests `gap` apart, from a client `connect` makes to the server on
/// `listener`.
fn run<K: Kind>(
    listener: Listener<K>,
    connect: impl FnOnce() -> ConnectionOf<K>,
    gap: Duration,
    rounds: u32,
) -> Figures {
    nanos();
    std::thread::scope(|scope| {
        let server = scope.spawn(|| serve(&listener));
        let mut client = connect();
        let mut request = [7u8; 64];
        let (mut reply_nanos, mut round_trips) = (0, Duration::ZERO);
        let begun = Instant::now();
        for _ in 0..rounds {
            std::thread::sleep(gap);
            let start = Instant::now();
            request[..8].copy_from_slice(&nanos().to_le_bytes());
            client.send(&request).expect("the request");
            let reply = client.recv().expect("the echo");
            reply_nanos += nanos() - u64::from_le_bytes(reply[..8].try_into().expect("a stamp"));
            round_trips += start.elapsed();
        }
        let wall = begun.elapsed();
        drop(client);
        let (server_cpu, request) = server.join().expect("the server");
        Figures {
            server_cpu,
            wall,
            request,
            reply: mean(reply_nanos, u64::from(rounds)),
            round_trip: round_trips / rounds,
        }
    })
}

fn main() {
    let loopback = std::env::args().any(|arg| arg == "--loopback");
    let mut numbers = std::env::args()
        .skip(1)
        .filter(|arg| !arg.starts_with("--"));
    let gap = numbers
        .next()
        .map_or(2000, |n| n.parse().expect("a gap in microseconds"));
    let rounds = numbers
        .next()
        .map_or(1000, |n| n.parse().expect("a count of rounds"));
    let gap_of = Duration::from_micros(gap);
    let (provider, figures) = if loopback {
        let node = Transport::loopback()
            .ladder_preset("rpc")
            .budget_bytes(64 << 20)
            .build()
            .expect("a loopback transport");
        let listener = node.listen("gapped-echo").expect("listening");
        let figures = run(
            listener,
            || node.connect("gapped-echo").expect("connected"),
            gap_of,
            rounds,
        );
        ("loopback", figures)
    } else {
        let path = std::env::temp_dir().join(format!("gapped-echo-{}.sock", std::process::id()));
        let node = Transport::shm()
            .ladder_preset("rpc")
            .budget_bytes(64 << 20)
            .build()
            .expect("an shm transport");
        let listener = node.listen(&path).expect("listening");
        let figures = run(
            listener,
            || node.connect(&path).expect("connected"),
            gap_of,
            rounds,
        );
        ("shm", figures)
    };
    let share = figures.server_cpu.as_secs_f64() / figures.wall.as_secs_f64();
    println!(
        "{provider}, {rounds} requests {gap} µs apart: server thread CPU {:.1} % of {:.2?}; \
         request {:.1?}, reply {:.1?}, round trip {:.1?} (means)",
        100.0 * share,
        figures.wall,
        figures.request,
        figures.reply,
        figures.round_trip,
    );
}
