//! `tierbuf demo`: many connection pairs over the in-process loopback provider carrying an
//! RPC-like mix (mostly small requests, now and then a large one, rarely one past the top
//! tier), then a report of what tiering registered against a static top-tier
//! configuration, the tier changes seen, the traffic moved and its latency.
//!
//! Every figure printed is measured in the run, except the static configuration's memory,
//! which is computed from the ladder (and labelled so).

use std::io::{IoSlice, IsTerminal};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::builder::PossibleValuesParser;
use clap::{Args, ValueEnum};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use tierbuf_pool::{BudgetConfig, MemlockPolicy, MemoryBudget};
use tierbuf_tiers::Reservoir;
use tierbuf_tiers::ladder::{PRESET_NAMES, TierLadder};
use tierbuf_transport::connection::{
    Connection, ConnectionConfig, ConnectionCore, ConnectionStats, SendError,
};
use tierbuf_transport::{LoopbackEndpoint, LoopbackProvider, MAX_QUEUE_DEPTH, Provider};

/// The providers the demo can run on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum ProviderKind {
    /// In-process, both sides in this process (no RDMA hardware needed).
    Loopback,
}

/// Flags of `tierbuf demo`.
#[derive(Debug, Args)]
pub(crate) struct DemoArgs {
    /// A ready-made ladder (used unless `--ladder` is given).
    #[arg(long, default_value = "patent", value_parser = PossibleValuesParser::new(PRESET_NAMES))]
    preset: String,
    /// A ladder file (TOML) instead of a preset.
    #[arg(long)]
    ladder: Option<PathBuf>,
    /// Connection pairs.
    #[arg(long, default_value_t = 2000)]
    connections: usize,
    /// Requests each client sends (each is answered with a reply of the same size).
    #[arg(long, default_value_t = 20)]
    messages: usize,
    /// One request in this many is large (up to the top tier); one in ten of those is past
    /// the top tier and travels segmented.
    #[arg(long, default_value_t = 10)]
    large_every: usize,
    /// Overrides the ladder's idle time before demotion, so the run shows demotions.
    #[arg(long, default_value = "300ms", value_parser = humantime::parse_duration)]
    demote_after: Duration,
    /// Overrides the ladder's minimum time on a tier before demotion.
    #[arg(long, default_value = "100ms", value_parser = humantime::parse_duration)]
    hysteresis: Duration,
    /// The provider.
    #[arg(long, value_enum, default_value_t = ProviderKind::Loopback)]
    provider: ProviderKind,
    /// Seed of the message sizes.
    #[arg(long, default_value_t = 1)]
    seed: u64,
}

/// Size classes of the latency report, by the tier a message fits whole.
const CLASSES: usize = 3;

/// One client or server side: its connections, and per connection the request in flight.
struct Side {
    connections: Vec<Connection<LoopbackEndpoint>>,
}

/// Runs the demo; the report goes to stdout, an error to stderr.
pub(crate) fn run(args: DemoArgs) -> ExitCode {
    match demo(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("tierbuf demo: {error}");
            ExitCode::FAILURE
        }
    }
}

type DemoError = Box<dyn std::error::Error + Send + Sync>;

fn demo(args: &DemoArgs) -> Result<(), DemoError> {
    let ProviderKind::Loopback = args.provider;
    if args.connections == 0 || args.messages == 0 || args.large_every == 0 {
        return Err("--connections, --messages and --large-every must be at least 1".into());
    }
    let (name, ladder) = match &args.ladder {
        Some(path) => (path.display().to_string(), TierLadder::from_file(path)?),
        None => (
            format!("preset {}", args.preset),
            TierLadder::preset(&args.preset)?,
        ),
    };
    let ladder = Arc::new(with_demotion(&ladder, args.demote_after, args.hysteresis)?);
    let config = Arc::new(ConnectionConfig::new(Arc::clone(&ladder))?);

    // Loopback memory is not pinned, so RLIMIT_MEMLOCK does not bound it.
    let budget = MemoryBudget::from_system(BudgetConfig {
        memlock: MemlockPolicy::Ignore,
        ..BudgetConfig::default()
    })?;
    let provider = LoopbackProvider::new(budget.clone());
    let reservoirs =
        [0, 1].map(|_| Arc::new(Reservoir::new(provider.registrar(), Arc::clone(&ladder))));
    for reservoir in &reservoirs {
        reservoir.fill()?;
    }
    let largest_count = ladder
        .tiers()
        .iter()
        .map(|t| t.slot_count())
        .max()
        .unwrap_or(1);
    let depth = u32::try_from(2 * largest_count + 8)
        .ok()
        .filter(|&depth| depth <= MAX_QUEUE_DEPTH)
        .ok_or("the ladder's slot counts pass the loopback queue depth")?;

    let now = Instant::now();
    let mut clients = Side {
        connections: Vec::with_capacity(args.connections),
    };
    let mut servers = Side {
        connections: Vec::with_capacity(args.connections),
    };
    for _ in 0..args.connections {
        let (a, b) = provider.pair(depth, depth)?;
        let core = |reservoir: &Arc<Reservoir>| {
            ConnectionCore::new(
                Arc::clone(&config),
                Arc::clone(reservoir),
                Arc::clone(reservoir),
                now,
            )
        };
        clients
            .connections
            .push(Connection::new(core(&reservoirs[0])?, a).map_err(|e| e.to_string())?);
        servers
            .connections
            .push(Connection::new(core(&reservoirs[1])?, b).map_err(|e| e.to_string())?);
    }
    let registered_at_start = budget.in_use();

    let total = (args.connections * args.messages) as u64;
    let bar = ProgressBar::with_draw_target(
        Some(total),
        if std::io::stdout().is_terminal() {
            ProgressDrawTarget::stdout()
        } else {
            ProgressDrawTarget::hidden()
        },
    );
    bar.set_style(ProgressStyle::with_template(
        "{bar:40} {pos}/{len} round trips {elapsed}",
    )?);

    let sizes = MessageSizes::new(&ladder, args.large_every, args.seed);
    let started = Instant::now();
    let peak = std::sync::atomic::AtomicU64::new(budget.in_use());
    let (client_result, server_result) = std::thread::scope(|scope| {
        let server = scope.spawn(|| serve(&mut servers, args.messages, &budget, &peak));
        let client = run_clients(&mut clients, args.messages, &sizes, &bar, &budget, &peak);
        (client, server.join())
    });
    let latencies = client_result?;
    server_result.map_err(|_| "the server thread panicked")??;
    let elapsed = started.elapsed();
    bar.finish_and_clear();

    let mut busy = sum_stats(&clients, &servers);
    busy.registered_bytes = budget.in_use();
    // Quiet: keep progressing until every connection has stepped back down and its old
    // tiers are retired (memory back where it started), or the deadline passes.
    let quiet_until = Instant::now() + (args.demote_after + args.hysteresis) * 3;
    while Instant::now() < quiet_until && budget.in_use() > registered_at_start {
        for connection in clients
            .connections
            .iter_mut()
            .chain(servers.connections.iter_mut())
        {
            connection.progress().map_err(|e| e.to_string())?;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let quiet = sum_stats(&clients, &servers);
    let registered_quiet = budget.in_use();

    report(Report {
        name: &name,
        args,
        ladder: &ladder,
        elapsed,
        busy,
        quiet,
        registered_at_start,
        registered_peak: peak.load(std::sync::atomic::Ordering::Relaxed),
        registered_quiet,
        reservoir_bytes: reservoirs.iter().map(|r| r.spare_bytes()).sum(),
        latencies,
    });
    drop((clients, servers, reservoirs));
    if budget.in_use() != 0 {
        return Err(format!("{} registered bytes were not returned", budget.in_use()).into());
    }
    Ok(())
}

/// `ladder` with its demotion timing replaced.
fn with_demotion(
    ladder: &TierLadder,
    demote_after: Duration,
    hysteresis: Duration,
) -> Result<TierLadder, DemoError> {
    let mut builder = TierLadder::builder().policy(*ladder.policy());
    for spec in ladder.tiers() {
        builder = builder.tier(
            spec.slot_size(),
            spec.slot_count(),
            spec.promote_threshold(),
        );
    }
    Ok(builder
        .demote_after(demote_after)
        .hysteresis(hysteresis)
        .build()?)
}

/// The request sizes: small (tier 0), large (up to the top tier), huge (past it).
struct MessageSizes {
    small_max: usize,
    top: usize,
    large_every: usize,
    seed: u64,
}

impl MessageSizes {
    fn new(ladder: &TierLadder, large_every: usize, seed: u64) -> MessageSizes {
        let thresholds: Vec<usize> = ladder
            .tiers()
            .iter()
            .map(|t| t.promote_threshold())
            .collect();
        MessageSizes {
            small_max: thresholds[0] / 2,
            top: *thresholds.last().unwrap_or(&thresholds[0]),
            large_every,
            seed,
        }
    }

    /// The size of request `sequence` of connection `connection`.
    fn size(&self, connection: usize, sequence: usize) -> usize {
        let draw = mix(self.seed ^ ((connection as u64) << 32) ^ sequence as u64);
        let pick = draw as usize;
        if pick % self.large_every != 0 {
            1 + (pick >> 8) % self.small_max
        } else if (pick >> 4) % 10 == 0 {
            self.top + 1 + (pick >> 8) % (2 * self.top)
        } else {
            self.small_max + 1 + (pick >> 8) % (self.top - self.small_max)
        }
    }

    /// The latency class of a size: 0 small, 1 large, 2 segmented.
    fn class(&self, len: usize) -> usize {
        match len {
            len if len <= self.small_max => 0,
            len if len <= self.top => 1,
            _ => 2,
        }
    }
}

fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

/// The bytes of message `sequence` of connection `connection`, `len` long; a reply uses
/// `reply = true`.
fn fill(buffer: &mut Vec<u8>, connection: usize, sequence: usize, reply: bool, len: usize) {
    let seed = mix((connection as u64) << 20 ^ (sequence as u64) << 1 ^ u64::from(reply));
    buffer.clear();
    buffer.extend((0..len).map(|i| (seed as usize).wrapping_add(i * 131) as u8));
}

fn check(
    message: &[u8],
    connection: usize,
    sequence: usize,
    reply: bool,
    scratch: &mut Vec<u8>,
) -> Result<(), DemoError> {
    fill(scratch, connection, sequence, reply, message.len());
    if message != &scratch[..] {
        return Err(format!(
            "connection {connection}: {} {sequence} arrived with wrong bytes",
            if reply { "reply" } else { "request" }
        )
        .into());
    }
    Ok(())
}

/// Sends `bytes` on `connection` if it is accepted now; `Ok(false)` when it would block.
fn offer(connection: &mut Connection<LoopbackEndpoint>, bytes: &[u8]) -> Result<bool, DemoError> {
    match connection.try_send(&[IoSlice::new(bytes)]) {
        Ok(accepted) if accepted == bytes.len() => Ok(true),
        Ok(accepted) => {
            Err(format!("a single-element message was split at {accepted} bytes").into())
        }
        Err(SendError::WouldBlock(_)) => Ok(false),
        Err(error) => Err(error.into()),
    }
}

fn note_peak(budget: &MemoryBudget, peak: &std::sync::atomic::AtomicU64) {
    peak.fetch_max(budget.in_use(), std::sync::atomic::Ordering::Relaxed);
}

/// The client side: one request in flight per connection; returns round-trip times in
/// nanoseconds per size class.
fn run_clients(
    side: &mut Side,
    messages: usize,
    sizes: &MessageSizes,
    bar: &ProgressBar,
    budget: &MemoryBudget,
    peak: &std::sync::atomic::AtomicU64,
) -> Result<[Vec<u64>; CLASSES], DemoError> {
    let count = side.connections.len();
    let mut next = vec![0usize; count];
    let mut in_flight: Vec<Option<(usize, Instant, bool)>> = vec![None; count];
    let mut latencies: [Vec<u64>; CLASSES] = Default::default();
    let (mut buffer, mut scratch) = (Vec::new(), Vec::new());
    let mut done = 0;
    let mut round = 0u64;
    while done < count {
        done = 0;
        for (index, connection) in side.connections.iter_mut().enumerate() {
            if let Some((sequence, started, false)) = in_flight[index] {
                let len = sizes.size(index, sequence);
                fill(&mut buffer, index, sequence, false, len);
                if offer(connection, &buffer)? {
                    in_flight[index] = Some((sequence, started, true));
                } else {
                    connection.progress().map_err(|e| e.to_string())?;
                }
            }
            if let Some((sequence, started, true)) = in_flight[index]
                && let Some(reply) = connection.try_recv().map_err(|e| e.to_string())?
            {
                let len = sizes.size(index, sequence);
                if reply.len() != len {
                    return Err(format!(
                        "connection {index}: reply {sequence} is {} bytes, not {len}",
                        reply.len()
                    )
                    .into());
                }
                check(&reply, index, sequence, true, &mut scratch)?;
                latencies[sizes.class(len)].push(started.elapsed().as_nanos() as u64);
                in_flight[index] = None;
                bar.inc(1);
            }
            if in_flight[index].is_none() {
                if next[index] == messages {
                    done += 1;
                    connection.progress().map_err(|e| e.to_string())?;
                    continue;
                }
                in_flight[index] = Some((next[index], Instant::now(), false));
                next[index] += 1;
            }
        }
        round += 1;
        if round % 64 == 0 {
            note_peak(budget, peak);
        }
    }
    Ok(latencies)
}

/// The server side: answers every request with a reply of the same size.
fn serve(
    side: &mut Side,
    messages: usize,
    budget: &MemoryBudget,
    peak: &std::sync::atomic::AtomicU64,
) -> Result<(), DemoError> {
    let count = side.connections.len();
    let mut answered = vec![0usize; count];
    let mut pending: Vec<Option<Vec<u8>>> = vec![None; count];
    let mut scratch = Vec::new();
    let mut round = 0u64;
    while answered.iter().any(|&n| n < messages) || pending.iter().any(Option::is_some) {
        for (index, connection) in side.connections.iter_mut().enumerate() {
            if let Some(reply) = &pending[index] {
                if offer(connection, reply)? {
                    pending[index] = None;
                } else {
                    connection.progress().map_err(|e| e.to_string())?;
                    continue;
                }
            }
            if let Some(request) = connection.try_recv().map_err(|e| e.to_string())? {
                let sequence = answered[index];
                check(&request, index, sequence, false, &mut scratch)?;
                let mut reply = Vec::new();
                fill(&mut reply, index, sequence, true, request.len());
                drop(request);
                answered[index] += 1;
                if !offer(connection, &reply)? {
                    pending[index] = Some(reply);
                }
            }
        }
        round += 1;
        if round % 64 == 0 {
            note_peak(budget, peak);
        }
    }
    for connection in &mut side.connections {
        connection.flush().map_err(|e| e.to_string())?;
    }
    Ok(())
}

/// Sums over every connection of both sides.
#[derive(Debug, Default)]
struct Totals {
    promotions: u64,
    demotions: u64,
    nacks: u64,
    messages: u64,
    bytes: u64,
    send_tier_sum: u64,
    recv_tier_sum: u64,
    registered_bytes: u64,
}

fn sum_stats(clients: &Side, servers: &Side) -> Totals {
    let mut totals = Totals::default();
    for connection in clients.connections.iter().chain(&servers.connections) {
        let stats: ConnectionStats = connection.stats();
        totals.promotions += stats.promotions;
        totals.demotions += stats.demotions;
        totals.nacks += stats.nacks;
        totals.messages += stats.messages_sent;
        totals.bytes += stats.bytes_sent;
        totals.send_tier_sum += u64::from(stats.send_tier);
        totals.recv_tier_sum += u64::from(stats.recv_tier);
        totals.registered_bytes += stats.registered_bytes;
    }
    totals
}

struct Report<'a> {
    name: &'a str,
    args: &'a DemoArgs,
    ladder: &'a TierLadder,
    elapsed: Duration,
    busy: Totals,
    quiet: Totals,
    registered_at_start: u64,
    registered_peak: u64,
    registered_quiet: u64,
    reservoir_bytes: u64,
    latencies: [Vec<u64>; CLASSES],
}

fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / f64::from(1 << 20))
}

fn report(mut r: Report<'_>) {
    let endpoints = 2 * r.args.connections as u64;
    let table = r.ladder.memory_table(1);
    let static_per_endpoint = table.static_per_connection();
    println!(
        "tierbuf demo: {} connection pairs on loopback, ladder {}",
        r.args.connections, r.name
    );
    println!(
        "  {} requests each (1 in {} large), demotion after {:?} idle with {:?} hysteresis (overridden for the demo)",
        r.args.messages, r.args.large_every, r.args.demote_after, r.args.hysteresis
    );
    println!("  traffic took {:.2?}\n", r.elapsed);
    println!("registered memory, both sides of every connection ({endpoints} endpoints):");
    println!("  {:<44} {:>14} {:>14}", "", "per endpoint", "total");
    let row = |label: &str, total: u64| {
        println!(
            "  {label:<44} {:>14} {:>14}",
            format!("{} B", total / endpoints),
            mib(total)
        );
    };
    row(
        "tiered, at start (measured)",
        r.registered_at_start - r.reservoir_bytes,
    );
    row(
        "tiered, peak during traffic (measured)",
        r.registered_peak - r.reservoir_bytes,
    );
    row(
        "tiered, after the quiet phase (measured)",
        r.registered_quiet - r.reservoir_bytes,
    );
    row(
        "static top tier up front (from the ladder)",
        static_per_endpoint * endpoints,
    );
    println!(
        "  {:<44} {:>14} {:>14}\n",
        "reservoir spares (measured, shared)",
        "",
        mib(r.reservoir_bytes)
    );
    println!("tier changes (both directions of every connection):");
    println!(
        "  promotions {}   demotions {}   nacks {}",
        r.quiet.promotions, r.quiet.demotions, r.quiet.nacks
    );
    println!(
        "  still above tier 0 after the quiet phase: {} send directions (was {} tier steps at the end of traffic)\n",
        r.quiet.send_tier_sum, r.busy.send_tier_sum
    );
    println!(
        "traffic: {} messages, {} moved (requests and replies)\n",
        r.quiet.messages,
        mib(r.quiet.bytes)
    );
    println!("round-trip latency by request size (measured, request sent to reply received;");
    println!("  each side is one thread sweeping all its connections, so a round trip includes");
    println!(
        "  waiting for both sweeps: this is the demo's scheduling, not the transport's latency,"
    );
    println!("  which `cargo bench -p tierbuf-benches` measures):");
    println!(
        "  {:<28} {:>8} {:>10} {:>10} {:>10} {:>10}",
        "class", "count", "p50", "p99", "p99.9", "max"
    );
    let names = [
        "small (tier 0)",
        "large (up to the top tier)",
        "segmented (past the top)",
    ];
    for (class, samples) in r.latencies.iter_mut().enumerate() {
        if samples.is_empty() {
            println!("  {:<28} {:>8}", names[class], 0);
            continue;
        }
        samples.sort_unstable();
        let at = |q: f64| {
            let index = ((samples.len() as f64 * q).ceil() as usize).clamp(1, samples.len()) - 1;
            format!("{:.1?}", Duration::from_nanos(samples[index]))
        };
        println!(
            "  {:<28} {:>8} {:>10} {:>10} {:>10} {:>10}",
            names[class],
            samples.len(),
            at(0.5),
            at(0.99),
            at(0.999),
            at(1.0)
        );
    }
}
