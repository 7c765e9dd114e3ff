//! A key-value store served over tierbuf: a redb database behind PUT / GET / DELETE
//! requests, a client that writes a mixed set of values (16 B to 4 MiB), reads every key
//! back byte for byte and deletes some, and a report of throughput and of registered
//! memory, tiered (the `storage` preset) against a static top tier.
//!
//! ```sh
//! cargo run --release -p tierbuf-examples --example kv                      # shm, two processes
//! cargo run --release -p tierbuf-examples --example kv -- --provider loopback
//! cargo run --release -p tierbuf-examples --example kv -- --plot kv-memory.svg
//! ```
//!
//! Over shm the client runs the server as a second process of this program (the hidden
//! `--serve SOCKET`). The protocol, the library behind this program and the figures are
//! in `docs/services.md`, "Storage: a key-value store".

#[path = "kv/plot.rs"]
mod plot;

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};
use std::time::Duration;

use clap::{Parser, ValueEnum};
use tierbuf_examples::kv::client::{MEDIUM_MAX, Outcome, SMALL_MAX, Workload};
use tierbuf_examples::kv::server::run_shm_server;
use tierbuf_examples::kv::wire::MAX_VALUE_LEN;
use tierbuf_examples::kv::{KvError, LadderChoice, Setup, run};
use tierbuf_examples::with_causes;

/// The provider the client and server talk over.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Provider {
    /// Shared memory, the server in a second process.
    Shm,
    /// In-process loopback, the server on threads of this process.
    Loopback,
}

/// The ladders to run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Ladders {
    /// The `storage` preset, then its top tier alone.
    Both,
    /// The `storage` preset.
    Tiered,
    /// A static top tier: the `storage` preset's 1 MiB tier alone.
    Static,
}

/// A key-value store served over tierbuf, and what it registers.
#[derive(Debug, Parser)]
#[command(name = "kv")]
struct Args {
    /// The provider.
    #[arg(long, value_enum, default_value_t = Provider::Shm)]
    provider: Provider,
    /// The ladders to run and compare.
    #[arg(long, value_enum, default_value_t = Ladders::Both)]
    ladder: Ladders,
    /// Connections, each with its own keys and client thread.
    #[arg(long, default_value_t = 8)]
    connections: usize,
    /// Keys written on each connection.
    #[arg(long, default_value_t = 400)]
    keys: usize,
    /// One key in this many is large: past the 1 MiB top tier, up to --max-value.
    #[arg(long, default_value_t = 50)]
    large_every: usize,
    /// One key in this many is medium: 4 KiB to 1 MiB.
    #[arg(long, default_value_t = 10)]
    medium_every: usize,
    /// The largest value, in bytes.
    #[arg(long, default_value_t = MAX_VALUE_LEN)]
    max_value: usize,
    /// One key in this many is deleted, and checked gone.
    #[arg(long, default_value_t = 4)]
    delete_every: usize,
    /// Milliseconds idle at the end, for the tiers to come down.
    #[arg(long, default_value_t = 1500)]
    idle_ms: u64,
    /// Milliseconds idle before a connection steps down a tier.
    #[arg(long, default_value_t = 300)]
    demote_after_ms: u64,
    /// Least milliseconds on a tier before stepping down.
    #[arg(long, default_value_t = 100)]
    hysteresis_ms: u64,
    /// Chooses the value sizes and bytes.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Writes an SVG plot of registered memory over time, tiered against static, here.
    #[arg(long)]
    plot: Option<PathBuf>,
    /// Runs as the server process of a shm run, listening at this socket (with the
    /// client's --ladder, one of tiered or static, and its other flags).
    #[arg(long, hide = true)]
    serve: Option<PathBuf>,
}

impl Args {
    fn ladders(&self) -> Vec<LadderChoice> {
        match self.ladder {
            Ladders::Both => LadderChoice::ALL.to_vec(),
            Ladders::Tiered => vec![LadderChoice::Tiered],
            Ladders::Static => vec![LadderChoice::Static],
        }
    }

    fn setup(&self, ladder: LadderChoice) -> Setup {
        Setup {
            demote_after: Duration::from_millis(self.demote_after_ms),
            hysteresis: Duration::from_millis(self.hysteresis_ms),
            ..Setup::new(ladder, self.connections)
        }
    }

    fn workload(&self) -> Workload {
        Workload {
            keys: self.keys,
            large_every: self.large_every,
            medium_every: self.medium_every,
            max_value: self.max_value,
            delete_every: self.delete_every,
            idle: Duration::from_millis(self.idle_ms),
            seed: self.seed,
            reply_timeout: Duration::from_secs(30),
        }
    }

    /// The command that runs this program as the server of `ladder`'s run at `socket`.
    fn server_command(&self, ladder: LadderChoice, socket: &Path) -> Result<Command, KvError> {
        let program = std::env::current_exe().map_err(|source| KvError::Process {
            what: "finding this program to start it again".to_owned(),
            source: Some(source),
        })?;
        let mut command = Command::new(program);
        command.arg("--serve").arg(socket).args([
            "--ladder",
            ladder.name(),
            "--connections",
            &self.connections.to_string(),
            "--demote-after-ms",
            &self.demote_after_ms.to_string(),
            "--hysteresis-ms",
            &self.hysteresis_ms.to_string(),
        ]);
        Ok(command)
    }
}

fn main() -> ExitCode {
    let args = Args::parse();
    let side = if args.serve.is_some() {
        "kv server"
    } else {
        "kv"
    };
    match run_args(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("{side}: {}", with_causes(&error));
            ExitCode::FAILURE
        }
    }
}

fn run_args(args: &Args) -> Result<(), KvError> {
    if args.connections == 0 || args.keys == 0 || !(16..=MAX_VALUE_LEN).contains(&args.max_value) {
        return Err(KvError::Process {
            what: format!(
                "--connections and --keys must be at least 1, --max-value from 16 to {MAX_VALUE_LEN}"
            ),
            source: None,
        });
    }
    if let Some(socket) = &args.serve {
        let [ladder] = args.ladders()[..] else {
            return Err(KvError::Process {
                what: "--serve takes --ladder tiered or static".to_owned(),
                source: None,
            });
        };
        return run_shm_server(socket, &args.setup(ladder));
    }
    let workload = args.workload();
    describe(args, &workload);
    let mut runs = Vec::new();
    for ladder in args.ladders() {
        let setup = args.setup(ladder);
        let outcome = match args.provider {
            Provider::Shm => run::over_shm(&setup, &workload, |socket| {
                args.server_command(ladder, socket)
            })?,
            Provider::Loopback => run::over_loopback(&setup, &workload)?,
        };
        report(ladder, &outcome);
        runs.push((ladder, outcome));
    }
    compare(args.provider, &runs);
    if let Some(path) = &args.plot {
        plot::write(path, &runs).map_err(|error| KvError::Process {
            what: format!("writing the plot to {}: {error}", path.display()),
            source: None,
        })?;
        println!("\nplot of registered memory over time: {}", path.display());
    }
    Ok(())
}

/// Says what the run does.
fn describe(args: &Args, workload: &Workload) {
    let (mut small, mut medium, mut large, mut bytes) = (0, 0, 0, 0u64);
    for connection in 0..args.connections {
        for index in 0..workload.keys {
            let len = workload.len(connection, index);
            bytes += len as u64;
            if len <= SMALL_MAX {
                small += 1;
            } else if len <= MEDIUM_MAX {
                medium += 1;
            } else {
                large += 1;
            }
        }
    }
    let placement = match args.provider {
        Provider::Shm => "the server in a second process, over shared memory",
        Provider::Loopback => "the server on threads of this process, over loopback",
    };
    println!(
        "kv: a redb store served over tierbuf, {placement}; {} connections, {} keys each",
        args.connections, workload.keys
    );
    println!(
        "values: {small} small (16 B-4 KiB), {medium} medium (4 KiB-1 MiB), {large} large \
         (1 MiB-{}, segmented), {} in all; every byte read back and checked; one key in {} \
         deleted and checked gone; then {} ms idle",
        mib(workload.max_value as u64),
        mib(bytes),
        workload.delete_every,
        workload.idle.as_millis()
    );
}

/// One run's figures.
fn report(ladder: LadderChoice, outcome: &Outcome) {
    let name = match ladder {
        LadderChoice::Tiered => "tiered: the storage preset (4 KiB, 64 KiB and 1 MiB slots)",
        LadderChoice::Static => "static: the storage preset's top tier alone (1 MiB slots)",
    };
    println!("\n{name}");
    println!(
        "  {:<8} {:>9} {:>9} {:>10} {:>9}",
        "phase", "requests", "seconds", "ops/s", "MB/s"
    );
    for phase in outcome.phases.iter().filter(|phase| phase.ops > 0) {
        println!(
            "  {:<8} {:>9} {:>9.3} {:>10.0} {:>9.1}",
            phase.name,
            phase.ops,
            phase.elapsed().as_secs_f64(),
            phase.ops_per_second(),
            phase.megabytes_per_second()
        );
    }
    println!(
        "  {} promotions and {} demotions on the client side",
        outcome.promotions, outcome.demotions
    );
}

/// Registered memory of every run, side by side.
fn compare(provider: Provider, runs: &[(LadderChoice, Outcome)]) {
    let whose = match provider {
        Provider::Shm => "both processes, added",
        Provider::Loopback => "one process, one budget for both sides",
    };
    println!("\nregistered memory ({whose}), reservoir spares included");
    println!(
        "  {:<8} {:>11} {:>11} {:>11}",
        "ladder", "start", "peak", "after idle"
    );
    for (ladder, outcome) in runs {
        println!(
            "  {:<8} {:>11} {:>11} {:>11}",
            ladder.name(),
            mib(outcome.start()),
            mib(outcome.peak()),
            mib(outcome.after_idle())
        );
    }
}

/// `bytes` in MiB, to one decimal.
fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / f64::from(1 << 20))
}
