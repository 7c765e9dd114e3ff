//! `tierbuf demo --provider loopback`: both sides of every connection in this process,
//! the clients on this thread and the servers on another, and the report of both.

use std::sync::atomic::AtomicU64;
use std::time::Instant;

use tierbuf_pool::MemlockPolicy;
use tierbuf_transport::{LoopbackProvider, MAX_QUEUE_DEPTH};

use super::DemoError;
use super::args::DemoArgs;
use super::figures::Figures;
use super::report::{Report, report};
use super::setup::{Setup, Side, budget, check_returned};
use super::traffic::{QUIET_POLL, quiet_deadline, run_clients, serve, timed_traffic};

/// The run on the loopback provider: clients on this thread, servers on another.
pub(super) fn run(args: &DemoArgs) -> Result<(), DemoError> {
    let setup = &Setup::new(args, MAX_QUEUE_DEPTH)?;
    let budget = budget(MemlockPolicy::Ignore)?;
    let provider = LoopbackProvider::new(budget.clone());
    let reservoirs = [setup.reservoir(&provider)?, setup.reservoir(&provider)?];
    let now = Instant::now();
    let mut clients = Side::with_capacity(args.connections);
    let mut servers = Side::with_capacity(args.connections);
    for _ in 0..args.connections {
        let (a, b) = provider.pair(setup.depth, setup.depth)?;
        clients
            .connections
            .push(setup.connection(&reservoirs[0], a, now)?);
        servers
            .connections
            .push(setup.connection(&reservoirs[1], b, now)?);
    }
    let at_start = budget.in_use();

    let peak = AtomicU64::new(at_start);
    let (latencies, elapsed) = timed_traffic(args, setup, |sizes, bar| {
        let (client_result, server_result) = std::thread::scope(|scope| {
            let server = scope.spawn(|| serve(&mut servers, args.messages, &budget, &peak));
            let client = run_clients(&mut clients, args.messages, sizes, bar, &budget, &peak);
            (client, server.join())
        });
        let latencies = client_result?;
        server_result.map_err(|_| "the server thread panicked")??;
        Ok(latencies)
    })?;

    let busy_tier_steps = (clients.totals() + servers.totals()).send_tier_sum;
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
        &peak,
        &budget,
        reservoirs.iter().map(|r| r.spare_bytes()).sum(),
        busy_tier_steps,
        clients.totals() + servers.totals(),
    );

    report(Report {
        setup,
        args,
        elapsed,
        here,
        peer: None,
        latencies,
    });
    drop((clients, servers, reservoirs));
    check_returned(&budget)
}
