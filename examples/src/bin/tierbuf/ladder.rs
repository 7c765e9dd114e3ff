//! `tierbuf ladder ...`: validate and show tier ladders and what they register.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::Subcommand;
use clap::builder::PossibleValuesParser;
use tierbuf_tiers::ladder::{PRESET_NAMES, TierLadder};

/// How many connections the memory table totals are for, unless told: the brief's example of
/// a server with ten thousand clients.
const DEFAULT_CONNECTIONS: &str = "10000";

#[derive(Debug, Subcommand)]
pub(crate) enum LadderCommand {
    /// Validate a ladder file and print what it registers.
    Check {
        /// The ladder file (TOML).
        file: PathBuf,
        /// Connections to total the memory table for.
        #[arg(long, default_value = DEFAULT_CONNECTIONS)]
        connections: usize,
    },
    /// Print a preset or a ladder file in canonical form, with what it registers.
    #[command(group = clap::ArgGroup::new("source").required(true).args(["preset", "file"]))]
    Show {
        /// A ready-made ladder.
        #[arg(long, value_parser = PossibleValuesParser::new(PRESET_NAMES))]
        preset: Option<String>,
        /// A ladder file (TOML).
        file: Option<PathBuf>,
        /// Connections to total the memory table for.
        #[arg(long, default_value = DEFAULT_CONNECTIONS)]
        connections: usize,
    },
}

/// Runs a ladder command: the report goes to stdout, an error to stderr.
pub(crate) fn run(command: LadderCommand) -> ExitCode {
    let (loaded, connections, show_file) = match command {
        LadderCommand::Check { file, connections } => {
            let loaded = TierLadder::from_file(&file).map(|ladder| {
                (
                    format!(
                        "{}: valid ladder, {} tier(s)\n",
                        file.display(),
                        ladder.len()
                    ),
                    ladder,
                )
            });
            (loaded, connections, false)
        }
        LadderCommand::Show {
            preset,
            file,
            connections,
        } => {
            let loaded = match (preset, file) {
                (Some(name), _) => {
                    TierLadder::preset(&name).map(|ladder| (format!("# preset {name}\n"), ladder))
                }
                (None, Some(file)) => TierLadder::from_file(&file)
                    .map(|ladder| (format!("# from {}\n", file.display()), ladder)),
                (None, None) => unreachable!("clap requires --preset or FILE"),
            };
            (loaded, connections, true)
        }
    };
    let (heading, ladder) = match loaded {
        Ok(loaded) => loaded,
        Err(error) => {
            eprintln!("error: {error}");
            return ExitCode::FAILURE;
        }
    };
    let mut report = heading;
    if show_file {
        report.push_str(&ladder.to_toml_string());
        report.push('\n');
    }
    report.push_str(&ladder.memory_table(connections).to_string());
    match std::io::stdout().lock().write_all(report.as_bytes()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: cannot write the report: {error}");
            ExitCode::FAILURE
        }
    }
}
