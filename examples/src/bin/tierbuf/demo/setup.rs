//! What a run sets up before its traffic and checks after it: the [`Setup`] both sides
//! of every connection agree on, the [`Side`]s of connections made from it, this
//! process's memory budget and open-file limit, and the check that every registered byte
//! came back.

use std::ops::Add;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};
use tierbuf_pool::{BudgetConfig, MemlockPolicy, MemoryBudget};
use tierbuf_tiers::Reservoir;
use tierbuf_tiers::ladder::TierLadder;
use tierbuf_transport::connection::{Connection, ConnectionConfig, ConnectionCore};
use tierbuf_transport::{Endpoint, Provider};

use super::DemoError;
use super::args::{DemoArgs, ProviderKind};
use super::figures::Totals;

/// What both sides of every connection agree on.
#[derive(Debug)]
pub(super) struct Setup {
    /// The ladder's name in the report.
    pub(super) name: String,
    /// The ladder, with the demo's demotion timing.
    pub(super) ladder: Arc<TierLadder>,
    config: Arc<ConnectionConfig>,
    /// The send and receive queue depth of every endpoint.
    pub(super) depth: u32,
}

impl Setup {
    /// The setup `args` ask for, on a provider whose queues are at most `max_depth` deep.
    pub(super) fn new(args: &DemoArgs, max_depth: u32) -> Result<Setup, DemoError> {
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
    pub(super) fn reservoir(&self, provider: &impl Provider) -> Result<Arc<Reservoir>, DemoError> {
        let reservoir = Arc::new(Reservoir::new(
            provider.registrar(),
            Arc::clone(&self.ladder),
        ));
        reservoir.fill()?;
        Ok(reservoir)
    }

    /// A side of `count` connections over the endpoints `connect` makes, connection `i`
    /// over endpoint `connect(i)`, their tiers drawn from `reservoir`.
    pub(super) fn connect_side<E: Endpoint>(
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
    pub(super) fn connection<E: Endpoint>(
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
        Ok(Connection::new(core, endpoint)?)
    }
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

/// One client or server side: its connections, connection `i` of one side being the peer
/// of connection `i` of the other.
pub(super) struct Side<E: Endpoint> {
    pub(super) connections: Vec<Connection<E>>,
}

impl<E: Endpoint> Side<E> {
    pub(super) fn with_capacity(count: usize) -> Side<E> {
        Side {
            connections: Vec::with_capacity(count),
        }
    }

    /// One round of progress on every connection.
    pub(super) fn progress(&mut self) -> Result<(), DemoError> {
        for connection in &mut self.connections {
            connection.progress()?;
        }
        Ok(())
    }

    /// The counters of every connection, summed.
    pub(super) fn totals(&self) -> Totals {
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

/// This process's memory budget, bound by RLIMIT_MEMLOCK as `memlock` says: the loopback
/// and shm providers pin nothing and ignore it, the verbs provider pins what it registers.
pub(super) fn budget(memlock: MemlockPolicy) -> Result<MemoryBudget, DemoError> {
    Ok(MemoryBudget::from_system(BudgetConfig {
        memlock,
        ..BudgetConfig::default()
    })?)
}

/// Lets this process hold `connections` connections of up to `per_connection` open files
/// each (`holding` says which, for the error) and `others` more, raising its soft limit up
/// to the hard limit if it must (a process started afterwards inherits it).
pub(super) fn open_files_for(
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

/// Fails unless every registered byte has come back to `budget`.
pub(super) fn check_returned(budget: &MemoryBudget) -> Result<(), DemoError> {
    match budget.in_use() {
        0 => Ok(()),
        left => Err(format!("{left} registered bytes were not returned").into()),
    }
}
