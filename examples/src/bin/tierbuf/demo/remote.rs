//! What the runs whose two sides are in two processes share, the shm and the verbs runs
//! alike: the line channels between the process that runs the clients and prints the
//! report and the one that runs the servers ([`PeerLines`], [`ClientLines`]), and each
//! process's part of the run once every connection is made ([`remote_clients`],
//! [`remote_servers`]).

use std::time::{Duration, Instant};

use tierbuf_pool::MemoryBudget;
use tierbuf_tiers::Reservoir;
use tierbuf_transport::Endpoint;

use super::DemoError;
use super::args::DemoArgs;
use super::figures::{Figures, decode, encode};
use super::report::{PeerFigures, Report, report};
use super::setup::{Setup, Side};
use super::traffic::{QUIET_POLL, quiet_deadline, run_clients, serve, timed_traffic};

/// The line channel to the process that runs the servers: the shm peer's standard
/// streams, or the verbs control connection.
pub(super) trait PeerLines {
    /// How long [`PeerLines::next_line`] waits for a line.
    const PATIENCE: Duration;
    /// The other process's lines, read on a thread of their own
    /// ([`read_lines`](tierbuf_examples::process::read_lines)).
    fn lines(&self) -> &std::sync::mpsc::Receiver<String>;
    /// The error for the other process saying nothing for [`PeerLines::PATIENCE`].
    fn silent(&self) -> DemoError;
    /// The error for lines that ended: the other process is gone.
    fn gone(&mut self) -> DemoError;
    /// The error for a line that does not belong where it came.
    fn unexpected(&self, line: &str) -> DemoError;
    /// Asks the other process for its figures (its `report` line).
    fn ask_for_report(&mut self) -> Result<(), DemoError>;

    /// Waits for the next line.
    fn next_line(&mut self) -> Result<String, DemoError> {
        use std::sync::mpsc::RecvTimeoutError;
        match self.lines().recv_timeout(Self::PATIENCE) {
            Ok(line) => Ok(line),
            Err(RecvTimeoutError::Timeout) => Err(self.silent()),
            Err(RecvTimeoutError::Disconnected) => Err(self.gone()),
        }
    }

    /// The next line, if one has come.
    fn try_line(&mut self) -> Result<Option<String>, DemoError> {
        use std::sync::mpsc::TryRecvError;
        match self.lines().try_recv() {
            Ok(line) => Ok(Some(line)),
            Err(TryRecvError::Empty) => Ok(None),
            Err(TryRecvError::Disconnected) => Err(self.gone()),
        }
    }

    /// Asks for the other process's figures and waits for them.
    fn report(&mut self) -> Result<Figures, DemoError> {
        self.ask_for_report()?;
        loop {
            let line = self.next_line()?;
            if line == "quiet" {
                continue;
            }
            return match line.strip_prefix("report ") {
                Some(fields) => decode(fields),
                None => Err(self.unexpected(&line)),
            };
        }
    }
}

/// The clients' side of a run whose servers are in another process, once every
/// connection is made: the traffic, then the quiet phase, until this process and the
/// other (which says `quiet` on `peer`) are both back where they started or the deadline
/// passes; then the report, with the other process's figures and `placement` as the
/// header line saying where each side ran.
pub(super) fn remote_clients<E: Endpoint>(
    args: &DemoArgs,
    setup: &Setup,
    budget: &MemoryBudget,
    reservoir: &Reservoir,
    clients: &mut Side<E>,
    peer: &mut impl PeerLines,
    placement: String,
) -> Result<(), DemoError> {
    let at_start = budget.in_use();
    budget.reset_peak();
    let (latencies, elapsed) = timed_traffic(args, setup, |sizes, bar| {
        run_clients(clients, args.messages, sizes, bar)
    })?;
    let peak = budget.peak();

    let busy_tier_steps = clients.totals()?.send_tier_sum;
    // Quiet: as on loopback, until both processes are back where they started.
    let deadline = quiet_deadline(args);
    let mut quiet = false;
    while Instant::now() < deadline && (!quiet || budget.in_use() > at_start) {
        clients.progress()?;
        if !quiet {
            quiet = match peer.try_line()? {
                None => false,
                Some(line) if line == "quiet" => true,
                Some(other) => return Err(peer.unexpected(&other)),
            };
        }
        std::thread::sleep(QUIET_POLL);
    }
    let here = Figures::after_quiet(
        at_start,
        peak,
        budget,
        reservoir.spare_bytes(),
        busy_tier_steps,
        clients.totals()?,
    );
    let figures = peer.report()?;
    report(Report {
        setup,
        args,
        elapsed,
        here,
        peer: Some(PeerFigures { placement, figures }),
        latencies,
    });
    Ok(())
}

/// The line channel to the process that runs the clients: the shm peer's standard
/// streams, or the verbs control connection.
pub(super) trait ClientLines {
    /// Whether the clients' process has asked for this side's figures; never waits.
    fn report_asked(&mut self) -> Result<bool, DemoError>;
    /// Sends `line` to the clients' process.
    fn tell(&mut self, line: &str) -> Result<(), DemoError>;
}

/// The servers' side of a run whose clients are in another process, once every
/// connection is made: serves the requests, then keeps the connections progressing (the
/// clients step down only with this side's answers), says `quiet` once this process is
/// back where it started, and sends its figures when the clients ask for them.
pub(super) fn remote_servers<E: Endpoint>(
    messages: usize,
    servers: &mut Side<E>,
    budget: &MemoryBudget,
    reservoir: &Reservoir,
    clients: &mut impl ClientLines,
) -> Result<(), DemoError> {
    let at_start = budget.in_use();
    budget.reset_peak();
    serve(servers, messages)?;
    let peak = budget.peak();
    let busy_tier_steps = servers.totals()?.send_tier_sum;
    let mut quiet = false;
    while !clients.report_asked()? {
        servers.progress()?;
        if !quiet && budget.in_use() <= at_start {
            clients.tell("quiet")?;
            quiet = true;
        }
        std::thread::sleep(QUIET_POLL);
    }
    let figures = Figures::after_quiet(
        at_start,
        peak,
        budget,
        reservoir.spare_bytes(),
        busy_tier_steps,
        servers.totals()?,
    );
    clients.tell(&format!("report {}", encode(&figures)))
}
