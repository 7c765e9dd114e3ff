//! `tierbuf`: the command-line program of tierbuf.
//!
//! - `tierbuf ladder check FILE`: validate a ladder file and print its memory table.
//! - `tierbuf ladder show (--preset NAME | FILE)`: print a ladder as a ladder file, with its
//!   memory table.
//!
//! Exit status: 0 on success, 1 when a ladder is invalid or cannot be read or printed,
//! 2 for a usage error.

mod ladder;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// Tiered, pre-registered RDMA buffer pools.
#[derive(Debug, Parser)]
#[command(name = "tierbuf", version)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Check and show tier ladders.
    #[command(subcommand)]
    Ladder(ladder::LadderCommand),
}

fn main() -> ExitCode {
    match Cli::parse().command {
        Command::Ladder(command) => ladder::run(command),
    }
}
