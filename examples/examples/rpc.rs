//! A tarpc service over tierbuf (`tierbuf-tarpc`): a server process and a client process
//! over shared memory (the client runs this binary again as the server), over an RDMA
//! device (`--provider verbs --device NAME`, in a build with the `verbs` feature; the
//! server process opens the same device), or both in this process over loopback
//! (`--provider loopback`).
//!
//! ```sh
//! cargo run --release -p tierbuf-examples --example rpc
//! cargo run --release -p tierbuf-examples --features verbs --example rpc -- --provider verbs --device rxe0
//! ```
//!
//! Many connections carry several calls in flight each; most requests are small and one
//! in `--large-every` is large (64 KiB to 4 MiB), so the connections' tiers rise and fall.
//! Every reply is checked byte for byte. At the end a table gives calls per second, the
//! 50th and 99th percentile latency of each size class, the registered memory at start,
//! at the peak of traffic and after an idle phase, and the tier changes. The exit status
//! is non-zero when a call fails or a reply differs from its request.
//!
//! `--fault corrupt|exit` makes the server change one byte of a reply or exit mid-run,
//! which the client must report as a failure (the tests use it).

use std::collections::BTreeMap;
use std::error::Error;
use std::process::{Command, ExitCode};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use clap::{Parser, ValueEnum};
use futures_util::StreamExt;
use serde_bytes::ByteBuf;
use tarpc::client::NewClient;
use tarpc::context::Context;
use tarpc::server::{BaseChannel, Channel};
use tierbuf_examples::process::ChildProcess;
use tierbuf_pool::MemoryBudget;
use tierbuf_tarpc::{StatsWatch, TierbufTransport};
use tierbuf_transport::connection::Connection;
use tierbuf_transport::{Endpoint, Transport, TransportBuilder};

type BoxError = Box<dyn Error + Send + Sync>;

/// The service: an echo, and the server's own figures.
#[tarpc::service]
trait Bench {
    /// The payload, back.
    async fn echo(payload: ByteBuf) -> ByteBuf;
    /// The server's registered memory and tier changes.
    async fn report() -> ServerReport;
}

/// What the server process reports of itself.
#[derive(Debug, Clone, Copy, Default, serde::Serialize, serde::Deserialize)]
struct ServerReport {
    in_use: u64,
    /// The most bytes the server's process registered at once since its previous report.
    peak: u64,
    promotions: u64,
    demotions: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Provider {
    Loopback,
    Shm,
    /// An RDMA device (`--device`), the server in a second process on this host.
    #[cfg(feature = "verbs")]
    Verbs,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Fault {
    /// Change one byte of the 10th reply.
    Corrupt,
    /// Exit at the 10th call.
    Exit,
}

#[derive(Debug, Clone, Parser)]
#[command(about = "A tarpc service over tierbuf connections")]
struct Args {
    /// Where the server runs: in a second process over shared memory, or in this one.
    #[arg(long, value_enum, default_value_t = Provider::Shm)]
    provider: Provider,
    /// Connections from the client to the server.
    #[arg(long, default_value_t = 16)]
    connections: usize,
    /// Calls in flight on each connection.
    #[arg(long, default_value_t = 4)]
    in_flight: usize,
    /// Calls on each connection.
    #[arg(long, default_value_t = 1000)]
    calls: usize,
    /// One call in this many carries a large payload.
    #[arg(long, default_value_t = 40)]
    large_every: usize,
    /// The largest payload, in KiB (large ones run from 64 KiB up to it, by fours).
    #[arg(long, default_value_t = 4096)]
    max_large_kib: usize,
    /// How long a connection stays on a tier it no longer uses.
    #[arg(long, default_value = "100ms", value_parser = humantime::parse_duration)]
    demote_after: Duration,
    /// How long each connection's task may spin before it parks, in both processes
    /// (`AsyncConnection::set_spin`; 0 never spins).
    #[arg(long, default_value = "50us", value_parser = humantime::parse_duration)]
    spin: Duration,
    /// Make the server misbehave once (for the tests).
    #[arg(long, value_enum)]
    fault: Option<Fault>,
    /// The RDMA device, with `--provider verbs`.
    #[cfg(feature = "verbs")]
    #[arg(long)]
    device: Option<String>,
    /// The device's port, with `--provider verbs` (1 unless given).
    #[cfg(feature = "verbs")]
    #[arg(long)]
    ib_port: Option<u8>,
    /// The device port's GID index, with `--provider verbs` (RoCE).
    #[cfg(feature = "verbs")]
    #[arg(long)]
    gid_index: Option<u32>,
    /// Run as the server process, listening at this address (a socket path over shm; over
    /// verbs an IP address and port), and say `listening ADDRESS` on stdout once it does.
    #[arg(long, hide = true)]
    serve: Option<String>,
}

fn main() -> ExitCode {
    let args = Args::parse();
    let outcome = match &args.serve {
        Some(address) => serve_process(&args, address),
        None => run_client(&args),
    };
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("rpc: {error}");
            let mut source = error.source();
            while let Some(cause) = source {
                eprintln!("  caused by: {cause}");
                source = cause.source();
            }
            ExitCode::FAILURE
        }
    }
}

fn builder<K: tierbuf_transport::Kind>(
    args: &Args,
    builder: TransportBuilder<K>,
) -> TransportBuilder<K> {
    builder
        .ladder_preset("rpc")
        .demote_after(args.demote_after)
        .connections(args.connections)
}

fn runtime() -> std::io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
}

/// The server's state, shared by its connections.
#[derive(Clone)]
struct Server {
    budget: MemoryBudget,
    watches: Arc<std::sync::Mutex<Vec<StatsWatch>>>,
    calls: Arc<AtomicUsize>,
    fault: Option<Fault>,
}

impl Bench for Server {
    async fn echo(self, _: Context, mut payload: ByteBuf) -> ByteBuf {
        let call = self.calls.fetch_add(1, Ordering::Relaxed);
        match self.fault {
            Some(Fault::Corrupt) if call == 9 && !payload.is_empty() => payload[0] ^= 1,
            Some(Fault::Exit) if call == 9 => std::process::exit(3),
            _ => {}
        }
        payload
    }

    async fn report(self, _: Context) -> ServerReport {
        let watches = self.watches.lock().unwrap_or_else(|e| e.into_inner());
        let stats = watches.iter().map(StatsWatch::latest);
        ServerReport {
            in_use: self.budget.in_use(),
            peak: self.budget.reset_peak(),
            promotions: stats.clone().map(|s| s.tiers.promotions).sum(),
            demotions: stats.map(|s| s.tiers.demotions).sum(),
        }
    }
}

/// Serves `connections` until their clients hang up (tokio runtime context).
async fn serve<E: Endpoint + Unpin + Send + 'static>(
    connections: Vec<Connection<E>>,
    budget: MemoryBudget,
    fault: Option<Fault>,
    spin: Duration,
) -> Result<(), BoxError> {
    let server = Server {
        budget,
        watches: Arc::default(),
        calls: Arc::default(),
        fault,
    };
    let mut channels = Vec::new();
    for connection in connections {
        let mut transport = TierbufTransport::from_connection(connection)?;
        transport.get_mut().set_spin(spin);
        server
            .watches
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(transport.watch_stats());
        let serving = BaseChannel::with_defaults(transport)
            .execute(server.clone().serve())
            .for_each(|call| async {
                tokio::spawn(call);
            });
        channels.push(tokio::spawn(serving));
    }
    for channel in channels {
        channel.await?;
    }
    Ok(())
}

fn serve_process(args: &Args, address: &str) -> Result<(), BoxError> {
    match args.provider {
        Provider::Shm => {
            let node = builder(args, Transport::shm()).build()?;
            let listener = node.listen(address)?;
            say_listening(address)?;
            serve_listener(args, node.budget(), listener)
        }
        #[cfg(feature = "verbs")]
        Provider::Verbs => {
            let node = builder(args, Transport::verbs(verbs_config(args)?)).build()?;
            let listener = node.listen(address)?;
            say_listening(listener.address())?;
            serve_listener(args, node.budget(), listener)
        }
        Provider::Loopback => Err("--serve is for a server process: shm or verbs".into()),
    }
}

/// The server's line for the client, which waits for it and connects to `address`.
fn say_listening(address: impl std::fmt::Display) -> Result<(), BoxError> {
    println!("listening {address}");
    std::io::Write::flush(&mut std::io::stdout())?;
    Ok(())
}

/// Accepts the client's connections at `listener` and serves them.
fn serve_listener<K: tierbuf_transport::Kind>(
    args: &Args,
    budget: &MemoryBudget,
    listener: tierbuf_transport::Listener<K>,
) -> Result<(), BoxError>
where
    K::Endpoint: Unpin + Send,
{
    let connections = (0..args.connections)
        .map(|_| listener.accept_timeout(Duration::from_secs(30)))
        .collect::<Result<Vec<_>, _>>()?;
    runtime()?.block_on(serve(connections, budget.clone(), args.fault, args.spin))
}

/// The device, port and GID entry `--device`, `--ib-port` and `--gid-index` name.
#[cfg(feature = "verbs")]
fn verbs_config(args: &Args) -> Result<tierbuf_transport::verbs::VerbsConfig, BoxError> {
    let device = args
        .device
        .as_deref()
        .ok_or("--provider verbs needs --device NAME")?;
    let mut config = tierbuf_transport::verbs::VerbsConfig::new(device);
    if let Some(port) = args.ib_port {
        config = config.with_port(port);
    }
    Ok(match args.gid_index {
        Some(index) => config.with_gid_index(index),
        None => config,
    })
}

/// How long the client waits for the server process to listen, and to exit once the
/// client has hung up.
const SERVER_PATIENCE: Duration = Duration::from_secs(30);

fn run_client(args: &Args) -> Result<(), BoxError> {
    if args.connections == 0 || args.in_flight == 0 || args.calls == 0 || args.large_every == 0 {
        return Err(
            "--connections, --in-flight, --calls and --large-every must be at least 1".into(),
        );
    }
    let runtime = runtime()?;
    match args.provider {
        Provider::Loopback => {
            let node = builder(args, Transport::loopback()).build()?;
            let listener = node.listen("rpc")?;
            let clients = (0..args.connections)
                .map(|_| node.connect("rpc"))
                .collect::<Result<Vec<_>, _>>()?;
            let servers = (0..args.connections)
                .map(|_| listener.accept())
                .collect::<Result<Vec<_>, _>>()?;
            let budget = node.budget().clone();
            runtime.block_on(async {
                let serving = tokio::spawn(serve(servers, budget.clone(), args.fault, args.spin));
                let report = traffic(args, clients, &budget, false).await?;
                serving.await??;
                print!("{report}");
                Ok(())
            })
        }
        Provider::Shm => {
            let path =
                std::env::temp_dir().join(format!("tierbuf-rpc-{}.sock", std::process::id()));
            // The name is this process's: a file there is one an earlier process of the
            // same number left.
            let _ = std::fs::remove_file(&path);
            let mut command = server_command(args)?;
            command.arg("--serve").arg(&path);
            // A server that is killed, or exits without its destructors, leaves the
            // socket's file behind.
            let mut server = ChildProcess::start(command)?;
            server.remove_on_drop(path.clone());
            server.wait_for_line("listening ", SERVER_PATIENCE)?;
            let node = builder(args, Transport::shm()).build()?;
            let clients = (0..args.connections)
                .map(|_| node.connect_timeout(&path, Duration::from_secs(10)))
                .collect::<Result<Vec<_>, _>>()?;
            against_server_process(args, &runtime, node.budget(), clients, server)
        }
        #[cfg(feature = "verbs")]
        Provider::Verbs => {
            let config = verbs_config(args)?;
            let mut command = server_command(args)?;
            command.args(["--serve", "127.0.0.1:0"]);
            let mut server = ChildProcess::start(command)?;
            let address: std::net::SocketAddr = server
                .wait_for_line("listening ", SERVER_PATIENCE)?
                .parse()?;
            let node = builder(args, Transport::verbs(config)).build()?;
            let clients = (0..args.connections)
                .map(|_| node.connect_timeout(address, Duration::from_secs(10)))
                .collect::<Result<Vec<_>, _>>()?;
            against_server_process(args, &runtime, node.budget(), clients, server)
        }
    }
}

/// This binary again as the server process, with the flags both sides must agree on;
/// the caller adds where it listens.
fn server_command(args: &Args) -> Result<Command, BoxError> {
    let mut command = Command::new(std::env::current_exe()?);
    command
        .args([
            "--provider",
            args.provider.to_possible_value().expect("named").get_name(),
        ])
        .args(["--connections", &args.connections.to_string()])
        .args([
            "--demote-after",
            &humantime::format_duration(args.demote_after).to_string(),
        ])
        .args(["--spin", &humantime::format_duration(args.spin).to_string()]);
    if let Some(fault) = args.fault {
        command.args([
            "--fault",
            fault.to_possible_value().expect("named").get_name(),
        ]);
    }
    #[cfg(feature = "verbs")]
    {
        if let Some(device) = &args.device {
            command.args(["--device", device]);
        }
        if let Some(port) = args.ib_port {
            command.args(["--ib-port", &port.to_string()]);
        }
        if let Some(index) = args.gid_index {
            command.args(["--gid-index", &index.to_string()]);
        }
    }
    Ok(command)
}

/// Runs the calls on `clients` against the server process and prints the report once
/// the server has exited cleanly.
fn against_server_process<E: Endpoint + Unpin + Send + 'static>(
    args: &Args,
    runtime: &tokio::runtime::Runtime,
    budget: &MemoryBudget,
    clients: Vec<Connection<E>>,
    mut server: ChildProcess,
) -> Result<(), BoxError> {
    let report = runtime.block_on(traffic(args, clients, budget, true))?;
    server.finish(SERVER_PATIENCE)?;
    print!("{report}");
    Ok(())
}

/// The size class of a payload of `len` bytes, for the latency table.
fn class_of(len: usize) -> usize {
    if len < 64 << 10 { 0 } else { len }
}

/// The payload of call `call` on connection `connection`: small ones cycle through
/// 16 B to 2 KiB; one in `large_every` is large, 64 KiB times a power of four up to the
/// largest.
fn payload(args: &Args, connection: usize, call: usize) -> Vec<u8> {
    let len = if call % args.large_every == args.large_every - 1 {
        let sizes: Vec<usize> = std::iter::successors(Some(64 << 10), |len| Some(len * 4))
            .take_while(|&len| len <= (args.max_large_kib << 10).max(64 << 10))
            .collect();
        sizes[(call / args.large_every + connection) % sizes.len()]
    } else {
        [16, 64, 200, 700, 2048][(call + connection) % 5]
    };
    (0..len)
        .map(|at| (at * 131 + call * 7 + connection) as u8)
        .collect()
}

/// Runs the calls on `connections`, then the idle phase, and returns the report.
async fn traffic<E: Endpoint + Unpin + Send + 'static>(
    args: &Args,
    connections: Vec<Connection<E>>,
    budget: &MemoryBudget,
    remote: bool,
) -> Result<String, BoxError> {
    let mut clients = Vec::new();
    let mut watches = Vec::new();
    let mut dispatches = Vec::new();
    for connection in connections {
        let mut transport = TierbufTransport::from_connection(connection)?;
        transport.get_mut().set_spin(args.spin);
        watches.push(transport.watch_stats());
        let NewClient { client, dispatch } =
            BenchClient::new(tarpc::client::Config::default(), transport);
        dispatches.push(tokio::spawn(dispatch));
        clients.push(client);
    }
    let deadline = || {
        let mut context = tarpc::context::current();
        context.deadline = Instant::now() + Duration::from_secs(30);
        context
    };
    let server_at_start = clients[0].report(deadline()).await?;
    let client_at_start = budget.in_use();
    let at_start = client_at_start + if remote { server_at_start.in_use } else { 0 };
    // The server's next report has its peak since this one; this process's starts now.
    // (One process: the budget is the server's too, so this side reads its peak before
    // the server's report starts another.)
    budget.reset_peak();

    let args = Arc::new(args.clone());
    let started = Instant::now();
    let mut tasks = Vec::new();
    for (index, client) in clients.iter().enumerate() {
        for lane in 0..args.in_flight {
            let (client, args) = (client.clone(), Arc::clone(&args));
            tasks.push(tokio::spawn(async move {
                let mut latencies: Vec<(usize, Duration)> = Vec::new();
                for call in (lane..args.calls).step_by(args.in_flight) {
                    let sent = payload(&args, index, call);
                    let began = Instant::now();
                    let reply = client
                        .echo(deadline(), ByteBuf::from(sent.clone()))
                        .await
                        .map_err(|error| format!("call {call} on connection {index}: {error}"))?;
                    latencies.push((class_of(sent.len()), began.elapsed()));
                    if reply[..] != sent[..] {
                        return Err(format!(
                            "call {call} on connection {index}: the reply of {} bytes differs from the request of {} bytes",
                            reply.len(),
                            sent.len()
                        ));
                    }
                }
                Ok(latencies)
            }));
        }
    }
    let mut classes: BTreeMap<usize, Vec<Duration>> = BTreeMap::new();
    for task in tasks {
        for (class, latency) in task.await?? {
            classes.entry(class).or_default().push(latency);
        }
    }
    let elapsed = started.elapsed();
    let client_peak = budget.peak();
    let server_peak = clients[0].report(deadline()).await?;
    let peak = client_peak + if remote { server_peak.peak } else { 0 };

    // Idle: every connection steps back down to its first tier. The phase ends once each
    // process is back at its own starting figure (the server asked over connection 0,
    // whose small calls let it demote too), or after 10 s.
    let quiet = Instant::now() + (args.demote_after * 4).max(Duration::from_millis(500));
    let idle_deadline = Instant::now() + Duration::from_secs(10);
    let server_idle = loop {
        tokio::time::sleep(Duration::from_millis(20)).await;
        let now = Instant::now();
        if now < quiet {
            continue;
        }
        let server = clients[0].report(deadline()).await?;
        let server_rested = !remote || server.in_use <= server_at_start.in_use;
        if (budget.in_use() <= client_at_start && server_rested) || now >= idle_deadline {
            break server;
        }
    };
    let after_idle = budget.in_use() + if remote { server_idle.in_use } else { 0 };

    drop(clients);
    for dispatch in dispatches {
        dispatch.await??;
    }
    let stats: Vec<_> = watches.iter().map(StatsWatch::latest).collect();
    let promotions: u64 = stats.iter().map(|s| s.tiers.promotions).sum();
    let demotions: u64 = stats.iter().map(|s| s.tiers.demotions).sum();

    let calls = args.connections * args.calls;
    let mut report = format!(
        "\ntarpc over tierbuf ({}): {} connections, {} calls in flight each, {calls} calls, every reply checked\n",
        match args.provider {
            Provider::Loopback => "loopback, one process".to_string(),
            provider => format!(
                "{}, server in a second process",
                provider.to_possible_value().expect("named").get_name()
            ),
        },
        args.connections,
        args.in_flight,
    );
    report += &format!(
        "  calls/s                    {:.0} ({calls} calls in {:.2} s)\n",
        calls as f64 / elapsed.as_secs_f64(),
        elapsed.as_secs_f64()
    );
    report += "  latency by request size    calls      p50        p99\n";
    for (class, mut latencies) in classes {
        latencies.sort_unstable();
        let at = |q: f64| latencies[((latencies.len() - 1) as f64 * q) as usize];
        let name = if class == 0 {
            "< 64 KiB".to_string()
        } else {
            format!("{} KiB", class >> 10)
        };
        report += &format!(
            "    {name:<24} {:>7} {:>10.1?} {:>10.1?}\n",
            latencies.len(),
            at(0.5),
            at(0.99)
        );
    }
    let mib = |bytes: u64| bytes as f64 / f64::from(1 << 20);
    let both = if remote { " (both processes)" } else { "" };
    report += &format!(
        "  registered at start        {:.1} MiB{both}\n",
        mib(at_start)
    );
    report += &format!("  registered at peak         {:.1} MiB{both}\n", mib(peak));
    report += &format!(
        "  registered after idle      {:.1} MiB{both}\n",
        mib(after_idle)
    );
    report += &format!(
        "  tier changes               requests: {promotions} promotions, {demotions} demotions; replies: {} promotions, {} demotions (as the server counted them)\n",
        server_idle.promotions, server_idle.demotions
    );
    Ok(report)
}
