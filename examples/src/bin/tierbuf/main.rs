//! `tierbuf`: the command-line program of tierbuf.
//!
//! - `tierbuf demo`: the main job; see `demo.rs`.
//! - `tierbuf demo-peer`: hidden; the second process of `tierbuf demo --provider shm`, which
//!   the demo starts itself (see `demo/shm.rs`).
//! - `tierbuf ladder check FILE`: validate a ladder file and print its memory table.
//! - `tierbuf ladder show (--preset NAME | FILE)`: print a ladder as a ladder file, with its
//!   memory table.
//!
//! Exit status: 0 on success, 1 when a ladder is invalid or cannot be read or printed,
//! 2 for a usage error.

mod demo;
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
    /// Run many connection pairs (over the loopback provider unless told) and report what
    /// tiering registered against a static top-tier configuration.
    Demo(demo::DemoArgs),
    /// The peer process of `demo --provider shm`, started by the demo.
    #[command(hide = true)]
    DemoPeer(demo::shm::PeerArgs),
    /// Check and show tier ladders.
    #[command(subcommand)]
    Ladder(ladder::LadderCommand),
}

fn main() -> ExitCode {
    match Cli::parse().command {
        Command::Demo(args) => demo::run(args),
        Command::DemoPeer(args) => demo::shm::run_peer(args),
        Command::Ladder(command) => ladder::run(command),
    }
}
