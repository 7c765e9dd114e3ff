//! `tierbuf demo`: many connection pairs carrying an RPC-like mix (mostly small requests,
//! now and then a large one, rarely one past the top tier), then a report of what tiering
//! registered against a static top-tier configuration, the tier changes seen, the traffic
//! moved and its latency.
//!
//! On the loopback provider both sides of every connection live in this process, one
//! thread each; on the shm provider this process runs the clients and a second process of
//! this program the servers (see [`shm`]); on the verbs provider the two sides run on two
//! machines with RDMA devices, the one given `--listen` running the servers and the one
//! given `--peer` the clients (see `demo/verbs.rs`, built with the `verbs` feature).
//!
//! Every figure printed is measured in the run, except the static configuration's memory,
//! which is computed from the ladder (and labelled so).

pub(crate) mod shm;
#[cfg(feature = "verbs")]
mod verbs;

/// `--provider verbs` in a build without the `verbs` feature.
#[cfg(not(feature = "verbs"))]
mod verbs {
    use super::{DemoArgs, DemoError};

    /// Refuses the run, saying how to build a program that can make it.
    pub(super) fn run(_: &DemoArgs) -> Result<(), DemoError> {
        Err(
            "--provider verbs needs tierbuf built with the verbs feature: install the \
             build dependencies (`apt-get install cmake libclang1-14 libclang-common-14-dev \
             libibverbs-dev`, see docs/verbs.md), then rebuild with `cargo build --release \
             -p tierbuf-examples --features verbs`"
                .into(),
        )
    }
}

use std::ffi::OsString;
use std::io::{IoSlice, IsTerminal};
use std::ops::Add;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use clap::builder::PossibleValuesParser;
use clap::error::ErrorKind;
use clap::{Args, ValueEnum};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};
use tierbuf_pool::{BudgetConfig, MemlockPolicy, MemoryBudget};
use tierbuf_tiers::Reservoir;
use tierbuf_tiers::ladder::{PRESET_NAMES, TierLadder};
use tierbuf_transport::connection::{Connection, ConnectionConfig, ConnectionCore, SendError};
use tierbuf_transport::{Endpoint, LoopbackProvider, MAX_QUEUE_DEPTH, Provider};

/// The providers the demo can run on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum ProviderKind {
    /// In-process, both sides in this process (no RDMA hardware needed).
    Loopback,
    /// Shared memory between two processes: this process runs the clients, a second
    /// process of this program the servers (Linux; no RDMA hardware needed).
    Shm,
    /// RDMA devices on two machines (a build with the `verbs` feature): with `--device`,
    /// and `--listen` on the side that runs the servers, `--peer` on the one that runs the
    /// clients.
    Verbs,
}

impl ProviderKind {
    /// The provider's name, as `--provider` spells it.
    fn name(self) -> &'static str {
        match self {
            ProviderKind::Loopback => "loopback",
            ProviderKind::Shm => "shm",
            ProviderKind::Verbs => "verbs",
        }
    }
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
    #[arg(
        long,
        value_enum,
        default_value_t = ProviderKind::Loopback,
        requires_if("verbs", "device"),
        requires_if("verbs", "role")
    )]
    provider: ProviderKind,
    /// With `--provider verbs`: the RDMA device, as `ibv_devices` lists it.
    #[arg(long, value_name = "NAME")]
    device: Option<String>,
    /// With `--provider verbs`: route by this entry of the device's GID table (RoCE; see
    /// docs/verbs.md). Both sides must route the same way.
    #[arg(long, value_name = "INDEX", requires = "device")]
    gid_index: Option<u32>,
    /// With `--provider verbs`: run the servers, for the side given `--peer`, taking its
    /// control connection at ADDR (HOST:PORT) and its RDMA connections on a port this side
    /// picks. Give both sides the same demo flags.
    #[arg(long, value_name = "ADDR", group = "role")]
    listen: Option<String>,
    /// With `--provider verbs`: run the clients against the side listening at ADDR
    /// (HOST:PORT), and print the report.
    #[arg(long, value_name = "ADDR", group = "role")]
    peer: Option<String>,
    /// Seed of the message sizes.
    #[arg(long, default_value_t = 1)]
    seed: u64,
}

impl DemoArgs {
    /// Refuses the verbs provider's own flags with another provider (clap checks that the
    /// verbs provider has what it needs).
    fn check_verbs_flags(&self) -> Result<(), clap::Error> {
        if self.provider == ProviderKind::Verbs {
            return Ok(());
        }
        let given: Vec<&str> = [
            ("--device", self.device.is_some()),
            ("--gid-index", self.gid_index.is_some()),
            ("--listen", self.listen.is_some()),
            ("--peer", self.peer.is_some()),
        ]
        .into_iter()
        .filter_map(|(flag, set)| set.then_some(flag))
        .collect();
        let (flags, verb) = match given.split_last() {
            Some((last, [])) => (last.to_string(), "goes"),
            Some((last, others)) => (format!("{} and {last}", others.join(", ")), "go"),
            None => return Ok(()),
        };
        Err(clap::Error::raw(
            ErrorKind::ArgumentConflict,
            format!(
                "{flags} {verb} only with --provider verbs, not with --provider {}\n",
                self.provider.name()
            ),
        ))
    }

    /// Flags that parse back into these arguments (those of the verbs provider aside).
    fn flags(&self) -> Vec<OsString> {
        let mut flags: Vec<OsString> = match &self.ladder {
            Some(path) => vec!["--ladder".into(), path.into()],
            None => vec!["--preset".into(), self.preset.as_str().into()],
        };
        for (flag, value) in [
            ("--connections", self.connections.to_string()),
            ("--messages", self.messages.to_string()),
            ("--large-every", self.large_every.to_string()),
            (
                "--demote-after",
                humantime::format_duration(self.demote_after).to_string(),
            ),
            (
                "--hysteresis",
                humantime::format_duration(self.hysteresis).to_string(),
            ),
            ("--provider", self.provider.name().to_owned()),
            ("--seed", self.seed.to_string()),
        ] {
            flags.push(flag.into());
            flags.push(value.into());
        }
        flags
    }
}

/// Size classes of the latency report, by the tier a message fits whole.
const CLASSES: usize = 3;

/// How long the quiet phase sleeps between two rounds of progress.
const QUIET_POLL: Duration = Duration::from_millis(5);

/// Runs the demo; the report goes to stdout, an error to stderr. A usage error exits as
/// clap's do.
pub(crate) fn run(args: DemoArgs) -> ExitCode {
    if let Err(error) = args.check_verbs_flags() {
        error.exit();
    }
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
    match args.provider {
        ProviderKind::Loopback => loopback(args, &Setup::new(args, MAX_QUEUE_DEPTH)?),
        ProviderKind::Shm => shm::run(args),
        ProviderKind::Verbs => verbs::run(args),
    }
}

/// What both sides of every connection agree on.
#[derive(Debug)]
struct Setup {
    /// The ladder's name in the report.
    name: String,
    /// The ladder, with the demo's demotion timing.
    ladder: Arc<TierLadder>,
    config: Arc<ConnectionConfig>,
    /// The send and receive queue depth of every endpoint.
    depth: u32,
}

impl Setup {
    /// The setup `args` ask for, on a provider whose queues are at most `max_depth` deep.
    fn new(args: &DemoArgs, max_depth: u32) -> Result<Setup, DemoError> {
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
        let largest_count = ladder
            .tiers()
            .iter()
            .map(|t| t.slot_count())
            .max()
            .unwrap_or(1);
        let depth = u32::try_from(2 * largest_count + 8)
            .ok()
            .filter(|&depth| depth <= max_depth)
            .ok_or_else(|| {
                format!(
                    "the ladder's slot counts pass the {} queue depth ({max_depth})",
                    args.provider.name()
                )
            })?;
        Ok(Setup {
            name,
            ladder,
            config,
            depth,
        })
    }

    /// A reservoir for one process's (or one side's) connections, filled.
    fn reservoir(&self, provider: &impl Provider) -> Result<Arc<Reservoir>, DemoError> {
        let reservoir = Arc::new(Reservoir::new(
            provider.registrar(),
            Arc::clone(&self.ladder),
        ));
        reservoir.fill()?;
        Ok(reservoir)
    }

    /// A side of `count` connections over the endpoints `connect` makes, connection `i`
    /// over endpoint `connect(i)`, their tiers drawn from `reservoir`.
    fn connect_side<E: Endpoint>(
        &self,
        reservoir: &Arc<Reservoir>,
        count: usize,
        mut connect: impl FnMut(usize) -> Result<E, DemoError>,
    ) -> Result<Side<E>, DemoError> {
        let now = Instant::now();
        let mut side = Side::with_capacity(count);
        for index in 0..count {
            let endpoint = connect(index)?;
            side.connections
                .push(self.connection(reservoir, endpoint, now)?);
        }
        Ok(side)
    }

    /// One side of a connection over `endpoint`, its regions from `reservoir`.
    fn connection<E: Endpoint>(
        &self,
        reservoir: &Arc<Reservoir>,
        endpoint: E,
        now: Instant,
    ) -> Result<Connection<E>, DemoError> {
        let core = ConnectionCore::new(
            Arc::clone(&self.config),
            Arc::clone(reservoir),
            Arc::clone(reservoir),
            now,
        )?;
        Connection::new(core, endpoint).map_err(|e| e.to_string().into())
    }
}

/// This process's memory budget, bound by RLIMIT_MEMLOCK as `memlock` says: the loopback
/// and shm providers pin nothing and ignore it, the verbs provider pins what it registers.
fn budget(memlock: MemlockPolicy) -> Result<MemoryBudget, DemoError> {
    Ok(MemoryBudget::from_system(BudgetConfig {
        memlock,
        ..BudgetConfig::default()
    })?)
}

/// Lets this process hold `connections` connections of up to `per_connection` open files
/// each (`holding` says which, for the error) and `others` more, raising its soft limit up
/// to the hard limit if it must (a process started afterwards inherits it).
fn open_files_for(
    provider: ProviderKind,
    connections: usize,
    per_connection: u64,
    holding: &str,
    others: u64,
) -> Result<(), DemoError> {
    let needed = connections as u64 * per_connection + others;
    let limit = getrlimit(Resource::Nofile);
    let soft = limit.current.unwrap_or(u64::MAX);
    if soft >= needed {
        return Ok(());
    }
    // An unlimited hard limit cannot be the soft one for open files: ask for the need.
    let hard = limit.maximum.unwrap_or(needed);
    setrlimit(
        Resource::Nofile,
        Rlimit {
            current: Some(hard),
            maximum: limit.maximum,
        },
    )
    .map_err(|e| format!("raising the open-file limit from {soft} to {hard}: {e}"))?;
    if hard >= needed {
        return Ok(());
    }
    let fit = hard.saturating_sub(others) / per_connection;
    Err(format!(
        "{connections} connections over {} need up to {needed} open files per process \
         ({holding}), but the limit is {hard}: use --connections {fit} or fewer, or raise \
         the hard limit (ulimit -Hn)",
        provider.name()
    )
    .into())
}

/// The progress bar of the round trips, drawn only on a terminal.
fn progress_bar(args: &DemoArgs) -> Result<ProgressBar, DemoError> {
    let bar = ProgressBar::with_draw_target(
        Some((args.connections * args.messages) as u64),
        if std::io::stdout().is_terminal() {
            ProgressDrawTarget::stdout()
        } else {
            ProgressDrawTarget::hidden()
        },
    );
    bar.set_style(ProgressStyle::with_template(
        "{bar:40} {pos}/{len} round trips {elapsed}",
    )?);
    Ok(bar)
}

/// When the quiet phase gives up waiting for every connection to step back down.
fn quiet_deadline(args: &DemoArgs) -> Instant {
    Instant::now() + (args.demote_after + args.hysteresis) * 3
}

/// Fails unless every registered byte has come back to `budget`.
fn check_returned(budget: &MemoryBudget) -> Result<(), DemoError> {
    match budget.in_use() {
        0 => Ok(()),
        left => Err(format!("{left} registered bytes were not returned").into()),
    }
}

/// The run on the loopback provider: clients on this thread, servers on another.
fn loopback(args: &DemoArgs, setup: &Setup) -> Result<(), DemoError> {
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

    let bar = progress_bar(args)?;
    let sizes = MessageSizes::new(&setup.ladder, args.large_every, args.seed);
    let started = Instant::now();
    let peak = AtomicU64::new(at_start);
    let (client_result, server_result) = std::thread::scope(|scope| {
        let server = scope.spawn(|| serve(&mut servers, args.messages, &budget, &peak));
        let client = run_clients(&mut clients, args.messages, &sizes, &bar, &budget, &peak);
        (client, server.join())
    });
    let latencies = client_result?;
    server_result.map_err(|_| "the server thread panicked")??;
    let elapsed = started.elapsed();
    bar.finish_and_clear();

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

/// Reads `reader` line by line on a thread of its own; the channel closes when the
/// reader ends or fails.
fn read_lines(reader: impl std::io::Read + Send + 'static) -> std::sync::mpsc::Receiver<String> {
    use std::io::BufRead;
    let (sender, lines) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(reader).lines() {
            let Ok(line) = line else { break };
            if sender.send(line).is_err() {
                break;
            }
        }
    });
    lines
}

/// The line channel to the process that runs the servers: the shm peer's standard
/// streams, or the verbs control connection.
trait PeerLines {
    /// How long [`PeerLines::next_line`] waits for a line.
    const PATIENCE: Duration;
    /// The other process's lines, read on a thread of their own ([`read_lines`]).
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
                Some(fields) => shm::decode(fields),
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
fn remote_clients<E: Endpoint>(
    args: &DemoArgs,
    setup: &Setup,
    budget: &MemoryBudget,
    reservoir: &Reservoir,
    clients: &mut Side<E>,
    peer: &mut impl PeerLines,
    placement: String,
) -> Result<(), DemoError> {
    let at_start = budget.in_use();
    let bar = progress_bar(args)?;
    let sizes = MessageSizes::new(&setup.ladder, args.large_every, args.seed);
    let started = Instant::now();
    let peak = AtomicU64::new(at_start);
    let latencies = run_clients(clients, args.messages, &sizes, &bar, budget, &peak)?;
    let elapsed = started.elapsed();
    bar.finish_and_clear();

    let busy_tier_steps = clients.totals().send_tier_sum;
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
        &peak,
        budget,
        reservoir.spare_bytes(),
        busy_tier_steps,
        clients.totals(),
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
trait ClientLines {
    /// Whether the clients' process has asked for this side's figures; never waits.
    fn report_asked(&mut self) -> Result<bool, DemoError>;
    /// Sends `line` to the clients' process.
    fn tell(&mut self, line: &str) -> Result<(), DemoError>;
}

/// The servers' side of a run whose clients are in another process, once every
/// connection is made: serves the requests, then keeps the connections progressing (the
/// clients step down only with this side's answers), says `quiet` once this process is
/// back where it started, and sends its figures when the clients ask for them.
fn remote_servers<E: Endpoint>(
    messages: usize,
    servers: &mut Side<E>,
    budget: &MemoryBudget,
    reservoir: &Reservoir,
    clients: &mut impl ClientLines,
) -> Result<(), DemoError> {
    let at_start = budget.in_use();
    let peak = AtomicU64::new(at_start);
    serve(servers, messages, budget, &peak)?;
    let busy_tier_steps = servers.totals().send_tier_sum;
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
        &peak,
        budget,
        reservoir.spare_bytes(),
        busy_tier_steps,
        servers.totals(),
    );
    clients.tell(&format!("report {}", shm::encode(&figures)))
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
fn offer<E: Endpoint>(connection: &mut Connection<E>, bytes: &[u8]) -> Result<bool, DemoError> {
    match connection.try_send(&[IoSlice::new(bytes)]) {
        Ok(accepted) if accepted == bytes.len() => Ok(true),
        Ok(accepted) => {
            Err(format!("a single-element message was split at {accepted} bytes").into())
        }
        Err(SendError::WouldBlock(_)) => Ok(false),
        Err(error) => Err(error.into()),
    }
}

fn note_peak(budget: &MemoryBudget, peak: &AtomicU64) {
    peak.fetch_max(budget.in_use(), Ordering::Relaxed);
}

/// One client or server side: its connections, connection `i` of one side being the peer
/// of connection `i` of the other.
struct Side<E: Endpoint> {
    connections: Vec<Connection<E>>,
}

impl<E: Endpoint> Side<E> {
    fn with_capacity(count: usize) -> Side<E> {
        Side {
            connections: Vec::with_capacity(count),
        }
    }

    /// One round of progress on every connection.
    fn progress(&mut self) -> Result<(), DemoError> {
        for connection in &mut self.connections {
            connection.progress().map_err(|e| e.to_string())?;
        }
        Ok(())
    }

    /// The counters of every connection, summed.
    fn totals(&self) -> Totals {
        self.connections
            .iter()
            .map(|connection| {
                let stats = connection.stats();
                Totals {
                    promotions: stats.promotions,
                    demotions: stats.demotions,
                    nacks: stats.nacks,
                    messages: stats.messages_sent,
                    bytes: stats.bytes_sent,
                    send_tier_sum: u64::from(stats.send_tier),
                }
            })
            .fold(Totals::default(), Add::add)
    }
}

/// The client side: one request in flight per connection; returns round-trip times in
/// nanoseconds per size class.
fn run_clients<E: Endpoint>(
    side: &mut Side<E>,
    messages: usize,
    sizes: &MessageSizes,
    bar: &ProgressBar,
    budget: &MemoryBudget,
    peak: &AtomicU64,
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
fn serve<E: Endpoint>(
    side: &mut Side<E>,
    messages: usize,
    budget: &MemoryBudget,
    peak: &AtomicU64,
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

/// Counters summed over connections.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct Totals {
    promotions: u64,
    demotions: u64,
    nacks: u64,
    messages: u64,
    bytes: u64,
    /// The send tiers of every connection added up: 0 when all send on tier 0.
    send_tier_sum: u64,
}

impl Add for Totals {
    type Output = Totals;

    fn add(self, other: Totals) -> Totals {
        Totals {
            promotions: self.promotions + other.promotions,
            demotions: self.demotions + other.demotions,
            nacks: self.nacks + other.nacks,
            messages: self.messages + other.messages,
            bytes: self.bytes + other.bytes,
            send_tier_sum: self.send_tier_sum + other.send_tier_sum,
        }
    }
}

/// One process's registered bytes, measured on its budget.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct Registered {
    /// Once every connection was set up.
    at_start: u64,
    /// The most seen during traffic.
    peak: u64,
    /// After the quiet phase.
    quiet: u64,
    /// The reservoirs' spare regions, after the quiet phase.
    reservoir: u64,
}

/// What one process measured of the connection sides it ran.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Figures {
    registered: Registered,
    /// `Totals::send_tier_sum` at the end of traffic.
    busy_tier_steps: u64,
    /// The counters after the quiet phase.
    quiet: Totals,
}

impl Figures {
    /// The figures at the end of the quiet phase: registered memory now against
    /// `at_start` and the traffic's `peak`, the reservoirs' `spare` bytes, and the tier
    /// counters.
    fn after_quiet(
        at_start: u64,
        peak: &AtomicU64,
        budget: &MemoryBudget,
        spare: u64,
        busy_tier_steps: u64,
        quiet: Totals,
    ) -> Figures {
        Figures {
            registered: Registered {
                at_start,
                peak: peak.load(Ordering::Relaxed),
                quiet: budget.in_use(),
                reservoir: spare,
            },
            busy_tier_steps,
            quiet,
        }
    }
}

struct Report<'a> {
    setup: &'a Setup,
    args: &'a DemoArgs,
    elapsed: Duration,
    /// This process's figures: of both sides on loopback, of the clients on shm and verbs.
    here: Figures,
    /// The figures of the process that ran the servers, on shm and verbs.
    peer: Option<PeerFigures>,
    latencies: [Vec<u64>; CLASSES],
}

/// The figures of the process that ran the servers, where that is not this one.
struct PeerFigures {
    /// Where the clients and the servers ran, a line of the report's header.
    placement: String,
    figures: Figures,
}

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

fn report(mut r: Report<'_>) {
    let pairs = r.args.connections as u64;
    let endpoints = 2 * pairs;
    let static_per_endpoint = r.setup.ladder.memory_table(1).static_per_connection();
    println!(
        "tierbuf demo: {pairs} connection pairs on {}, ladder {}",
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
    let row = |label: &str, per_process: &[u64]| {
        let total: u64 = per_process.iter().sum();
        let mut columns = vec![format!("{} B", total / endpoints)];
        if split {
            columns.extend(per_process.iter().map(|&bytes| mib(bytes)));
        }
        columns.push(mib(total));
        table_line(label, &columns);
    };
    let tiered = |figure: fn(&Registered) -> u64| -> Vec<u64> {
        processes.iter().map(|p| figure(p) - p.reservoir).collect()
    };
    row("tiered, at start (measured)", &tiered(|p| p.at_start));
    row(
        "tiered, peak during traffic (measured)",
        &tiered(|p| p.peak),
    );
    row(
        "tiered, after the quiet phase (measured)",
        &tiered(|p| p.quiet),
    );
    let static_total = static_per_endpoint * endpoints;
    row(
        "static top tier up front (from the ladder)",
        &processes
            .iter()
            .map(|_| static_total / processes.len() as u64)
            .collect::<Vec<_>>(),
    );
    let reservoirs: Vec<u64> = processes.iter().map(|p| p.reservoir).collect();
    let mut columns = vec![String::new()];
    if split {
        columns.extend(reservoirs.iter().map(|&bytes| mib(bytes)));
    }
    columns.push(mib(reservoirs.iter().sum()));
    table_line(
        if split {
            "reservoir spares (measured, one per process)"
        } else {
            "reservoir spares (measured, shared)"
        },
        &columns,
    );
    if split {
        println!("  (each process measures its own peak; the total adds the two)");
    }
    println!();

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
