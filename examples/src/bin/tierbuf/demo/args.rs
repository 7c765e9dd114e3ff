//! The flags of `tierbuf demo` and the providers it can run on: what clap parses, the
//! check that the verbs provider's own flags come only with it, and the flags that hand
//! the same run to the shm peer process.

use std::ffi::OsString;
use std::path::PathBuf;
use std::time::Duration;

use clap::builder::PossibleValuesParser;
use clap::error::ErrorKind;
use clap::{Args, ValueEnum};
use tierbuf_tiers::ladder::PRESET_NAMES;

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
    pub(super) fn name(self) -> &'static str {
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
    #[arg(long, default_value = "two-tier", value_parser = PossibleValuesParser::new(PRESET_NAMES))]
    pub(super) preset: String,
    /// A ladder file (TOML) instead of a preset.
    #[arg(long)]
    pub(super) ladder: Option<PathBuf>,
    /// Connection pairs.
    #[arg(long, default_value_t = 2000)]
    pub(super) connections: usize,
    /// Requests each client sends (each is answered with a reply of the same size).
    #[arg(long, default_value_t = 20)]
    pub(super) messages: usize,
    /// One request in this many is large (up to the top tier); one in ten of those is past
    /// the top tier and travels segmented.
    #[arg(long, default_value_t = 10)]
    pub(super) large_every: usize,
    /// Overrides the ladder's idle time before demotion, so the run shows demotions.
    #[arg(long, default_value = "300ms", value_parser = humantime::parse_duration)]
    pub(super) demote_after: Duration,
    /// Overrides the ladder's minimum time on a tier before demotion.
    #[arg(long, default_value = "100ms", value_parser = humantime::parse_duration)]
    pub(super) hysteresis: Duration,
    /// The provider.
    #[arg(
        long,
        value_enum,
        default_value_t = ProviderKind::Loopback,
        requires_if("verbs", "device"),
        requires_if("verbs", "role")
    )]
    pub(super) provider: ProviderKind,
    /// With `--provider verbs`: the RDMA device, as `ibv_devices` lists it.
    #[arg(long, value_name = "NAME")]
    pub(super) device: Option<String>,
    /// With `--provider verbs`: go out by this port of the device (1 unless given;
    /// `ibv_devinfo` lists them).
    #[arg(long, value_name = "PORT", requires = "device")]
    pub(super) ib_port: Option<u8>,
    /// With `--provider verbs`: route by this entry of the device's GID table (RoCE; see
    /// docs/verbs.md). Both sides must route the same way.
    #[arg(long, value_name = "INDEX", requires = "device")]
    pub(super) gid_index: Option<u32>,
    /// With `--provider verbs`: run the servers, for the side given `--peer`, taking its
    /// control connection at ADDR (HOST:PORT) and its RDMA connections on a port this side
    /// picks. Give both sides the same demo flags.
    #[arg(long, value_name = "ADDR", group = "role")]
    pub(super) listen: Option<String>,
    /// With `--provider verbs`: run the clients against the side listening at ADDR
    /// (HOST:PORT), and print the report.
    #[arg(long, value_name = "ADDR", group = "role")]
    pub(super) peer: Option<String>,
    /// Seed of the message sizes.
    #[arg(long, default_value_t = 1)]
    pub(super) seed: u64,
}

impl DemoArgs {
    /// Refuses the verbs provider's own flags with another provider (clap checks that the
    /// verbs provider has what it needs).
    pub(super) fn check_verbs_flags(&self) -> Result<(), clap::Error> {
        if self.provider == ProviderKind::Verbs {
            return Ok(());
        }
        let given: Vec<&str> = [
            ("--device", self.device.is_some()),
            ("--ib-port", self.ib_port.is_some()),
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
    pub(super) fn flags(&self) -> Vec<OsString> {
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
