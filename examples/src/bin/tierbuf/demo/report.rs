//! The report a run prints on stdout: what ran, the registered memory against a static
//! top-tier configuration, the tier changes and traffic, and the round-trip latency by
//! request size. Every figure is measured in the run, except the static configuration's
//! memory, which is computed from the ladder (and labelled so).

use std::time::Duration;

use super::args::DemoArgs;
use super::figures::{Figures, Registered};
use super::messages::CLASSES;
use super::setup::Setup;

/// What the report is made of.
pub(super) struct Report<'a> {
    pub(super) setup: &'a Setup,
    pub(super) args: &'a DemoArgs,
    /// How long the traffic took.
    pub(super) elapsed: Duration,
    /// This process's figures: of both sides on loopback, of the clients on shm and verbs.
    pub(super) here: Figures,
    /// The figures of the process that ran the servers, on shm and verbs.
    pub(super) peer: Option<PeerFigures>,
    /// Round-trip times in nanoseconds, per size class.
    pub(super) latencies: [Vec<u64>; CLASSES],
}

/// The figures of the process that ran the servers, where that is not this one.
pub(super) struct PeerFigures {
    /// Where the clients and the servers ran, a line of the report's header.
    pub(super) placement: String,
    pub(super) figures: Figures,
}

/// Prints the report.
pub(super) fn report(mut r: Report<'_>) {
    print_header(&r);
    print_registered_memory(&r);
    print_tier_changes_and_traffic(&r);
    print_latencies(&mut r.latencies);
}

/// `bytes` in MiB, one decimal.
fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / f64::from(1 << 20))
}

/// A line of the memory table: the label, then right-aligned columns.
fn table_line(label: &str, columns: &[String]) {
    let mut line = format!("  {label:<44}");
    for column in columns {
        line += &format!(" {column:>14}");
    }
    println!("{}", line.trim_end());
}

/// What ran: the connection pairs, provider and ladder, where each side ran, the traffic
/// asked for, and how long it took.
fn print_header(r: &Report<'_>) {
    println!(
        "tierbuf demo: {} connection pairs on {}, ladder {}",
        r.args.connections,
        r.args.provider.name(),
        r.setup.name
    );
    if let Some(peer) = &r.peer {
        println!("  {}", peer.placement);
    }
    println!(
        "  {} requests each (1 in {} large), demotion after {:?} idle with {:?} hysteresis (overridden for the demo)",
        r.args.messages, r.args.large_every, r.args.demote_after, r.args.hysteresis
    );
    println!("  traffic took {:.2?}\n", r.elapsed);
}

/// The registered memory of both sides of every connection, per endpoint, per process
/// where there are two, and in all; against the static top-tier configuration.
fn print_registered_memory(r: &Report<'_>) {
    let pairs = r.args.connections as u64;
    let endpoints = 2 * pairs;
    let static_per_endpoint = r.setup.ladder.memory_table(1).static_per_connection();
    let processes: Vec<Registered> = std::iter::once(r.here.registered)
        .chain(r.peer.as_ref().map(|peer| peer.figures.registered))
        .collect();
    let split = r.peer.is_some();
    if split {
        println!(
            "registered memory, both sides of every connection ({endpoints} endpoints, {pairs} in each process):"
        );
        table_line(
            "",
            &["per endpoint", "this process", "peer process", "total"].map(String::from),
        );
    } else {
        println!("registered memory, both sides of every connection ({endpoints} endpoints):");
        table_line("", &["per endpoint", "total"].map(String::from));
    }
    // A row: the `first` column, then each process's bytes where there are two, then
    // their total.
    let row = |label: &str, first: String, per_process: &[u64]| {
        let mut columns = vec![first];
        if split {
            columns.extend(per_process.iter().map(|&bytes| mib(bytes)));
        }
        columns.push(mib(per_process.iter().sum()));
        table_line(label, &columns);
    };
    // A row with the bytes per endpoint first.
    let endpoint_row = |label: &str, per_process: &[u64]| {
        let total: u64 = per_process.iter().sum();
        row(label, format!("{} B", total / endpoints), per_process);
    };
    let tiered = |figure: fn(&Registered) -> u64| -> Vec<u64> {
        processes.iter().map(|p| figure(p) - p.reservoir).collect()
    };
    endpoint_row("tiered, at start (measured)", &tiered(|p| p.at_start));
    endpoint_row(
        "tiered, peak during traffic (measured)",
        &tiered(|p| p.peak),
    );
    endpoint_row(
        "tiered, after the quiet phase (measured)",
        &tiered(|p| p.quiet),
    );
    let static_total = static_per_endpoint * endpoints;
    endpoint_row(
        "static top tier up front (from the ladder)",
        &processes
            .iter()
            .map(|_| static_total / processes.len() as u64)
            .collect::<Vec<_>>(),
    );
    row(
        if split {
            "reservoir spares (measured, one per process)"
        } else {
            "reservoir spares (measured, shared)"
        },
        String::new(),
        &processes.iter().map(|p| p.reservoir).collect::<Vec<_>>(),
    );
    if split {
        println!("  (each process measures its own peak; the total adds the two)");
    }
    println!();
}

/// The tier changes and the traffic moved, of both processes where there are two.
fn print_tier_changes_and_traffic(r: &Report<'_>) {
    let (busy_tier_steps, quiet) = match &r.peer {
        Some(peer) => (
            r.here.busy_tier_steps + peer.figures.busy_tier_steps,
            r.here.quiet + peer.figures.quiet,
        ),
        None => (r.here.busy_tier_steps, r.here.quiet),
    };
    println!("tier changes (both directions of every connection):");
    println!(
        "  promotions {}   demotions {}   nacks {}",
        quiet.promotions, quiet.demotions, quiet.nacks
    );
    println!(
        "  still above tier 0 after the quiet phase: {} send directions (was {} tier steps at the end of traffic)\n",
        quiet.send_tier_sum, busy_tier_steps
    );
    println!(
        "traffic: {} messages, {} moved (requests and replies)\n",
        quiet.messages,
        mib(quiet.bytes)
    );
}

/// The round-trip latency by request size class, from `latencies` (sorted here).
fn print_latencies(latencies: &mut [Vec<u64>; CLASSES]) {
    println!("round-trip latency by request size (measured, request sent to reply received;");
    println!("  each side is one thread that sleeps until a connection has work and looks only");
    println!("  at those, so a round trip includes the wakes of both threads; with a request in");
    println!("  flight on every connection it also waits behind the others' (Little's law: the");
    println!("  mean is about connections ÷ round trips per second); the transport's own latency");
    println!("  is what `cargo bench -p tierbuf-benches` measures):");
    println!(
        "  {:<28} {:>8} {:>10} {:>10} {:>10} {:>10}",
        "class", "count", "p50", "p99", "p99.9", "max"
    );
    let names = [
        "small (tier 0)",
        "large (up to the top tier)",
        "segmented (past the top)",
    ];
    for (class, samples) in latencies.iter_mut().enumerate() {
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
