//! `tierbuf demo --provider loopback`: both sides of every connection in this process,
//! the clients on this thread and the servers on another, and the report of both.

use std::time::Instant;

use tierbuf_transport::Transport;

use super::DemoError;
use super::args::DemoArgs;
use super::figures::Figures;
use super::report::{Report, report};
use super::setup::{Setup, Side, check_returned};
use super::traffic::{QUIET_POLL, quiet_deadline, run_clients, serve, timed_traffic};

/// The run on the loopback provider: clients on this thread, servers on another.
pub(super) fn run(args: &DemoArgs) -> Result<(), DemoError> {
    let (setup, transport) = Setup::build(args, Transport::loopback())?;
    let setup = &setup;
    let budget = transport.budget().clone();
    let listener = transport.listen("demo")?;
    let mut clients = Side::with_capacity(args.connections);
    let mut servers = Side::with_capacity(args.connections);
    for _ in 0..args.connections {
        clients.push(transport.connect("demo")?);
        servers.push(listener.accept()?);
    }
    drop(listener);
    let at_start = budget.in_use();

    budget.reset_peak();
    let (latencies, elapsed) = timed_traffic(args, setup, |sizes, bar| {
        let (client_result, server_result) = std::thread::scope(|scope| {
            let server = scope.spawn(|| serve(&mut servers, args.messages));
            let client = run_clients(&mut clients, args.messages, sizes, bar);
            (client, server.join())
        });
        let latencies = client_result?;
        server_result.map_err(|_| "the server thread panicked")??;
        Ok(latencies)
    })?;
    let peak = budget.peak();

    let busy_tier_steps = (clients.totals()? + servers.totals()?).send_tier_sum;
    // Quiet: keep progressing until every connection has stepped back down and its old
    // tiers are retired (memory back where it started), or the deadline passes.
    let deadline = quiet_deadline(args);
    while Instant::now() < deadline && budget.in_use() > at_start {
        clients.progress()?;
        servers.progress()?;
        std::thread::sleep(QUIET_POLL);
    }
    let here = Figures::after_quiet(
        at_start,
        peak,
        &budget,
        transport.reservoir().spare_bytes(),
        busy_tier_steps,
        clients.totals()? + servers.totals()?,
    );

    report(Report {
        setup,
        args,
        elapsed,
        here,
        peer: None,
        latencies,
    });
    drop((clients, servers, transport));
    check_returned(&budget)
}
