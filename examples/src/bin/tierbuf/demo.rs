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
//!
//! # Where each part lives
//!
//! - [`args`]: the flags, and the providers they can name.
//! - [`setup`]: what both sides of every connection agree on, the sides of connections
//!   made from it, this process's memory budget and open-file limit.
//! - [`loopback`], [`shm`], [`verbs`]: the run on each provider; [`remote`]: what the shm
//!   and verbs runs share, their two sides being in two processes.
//! - [`traffic`]: the requests and replies each side sends, and the pacing of the quiet
//!   phase after them; [`messages`]: their sizes and bytes.
//! - [`figures`]: what each process measures, and the text form in which the servers'
//!   process hands its figures over; [`report`]: the report printed from them.

use tierbuf_examples::with_causes;

mod args;
mod figures;
mod loopback;
mod messages;
mod remote;
mod report;
mod setup;
pub(crate) mod shm;
mod traffic;
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
             build dependencies (`apt-get install cmake libclang1-14 libclang-common-14-dev`) \
             and, to run it, rdma-core's `libibverbs1 ibverbs-providers` (see \
             docs/verbs.md), then rebuild with `cargo build --release -p tierbuf-examples \
             --features verbs`"
                .into(),
        )
    }
}

use std::process::ExitCode;

pub(crate) use args::DemoArgs;
use args::ProviderKind;

/// Runs the demo; the report goes to stdout, an error to stderr. A usage error exits as
/// clap's do.
pub(crate) fn run(args: DemoArgs) -> ExitCode {
    if let Err(error) = args.check_verbs_flags() {
        error.exit();
    }
    match demo(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("tierbuf demo: {}", with_causes(&*error));
            ExitCode::FAILURE
        }
    }
}

type DemoError = Box<dyn std::error::Error + Send + Sync>;

fn demo(args: &DemoArgs) -> Result<(), DemoError> {
    match args.provider {
        ProviderKind::Loopback => loopback::run(args),
        ProviderKind::Shm => shm::run(args),
        ProviderKind::Verbs => verbs::run(args),
    }
}

#[cfg(test)]
mod tests {
    use tierbuf_examples::with_causes;

    #[test]
    fn an_error_is_reported_with_every_cause_under_it() {
        let error = tierbuf_transport::TransportError::Provider {
            provider: "shm",
            operation: "sending a bootstrap record",
            source: std::io::Error::from(std::io::ErrorKind::BrokenPipe),
        };
        assert_eq!(
            with_causes(&error),
            "the shm provider failed in sending a bootstrap record: broken pipe"
        );
    }
}
