//! [`TransportBuilder`]: what a transport is built from, checked once; [`Transport`]: the
//! result, which makes connections.

use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};
use tierbuf_pool::{BudgetConfig, MemoryBudget};
use tierbuf_tiers::Reservoir;
use tierbuf_tiers::ladder::TierLadder;

use super::error::SetupError;
use super::{ConnectionOf, Kind, OpenFiles};
use crate::connection::{Connection, ConnectionConfig, ConnectionCore, DataPath};
use crate::provider::Provider;

/// Where the ladder comes from.
#[derive(Debug)]
enum LadderChoice {
    Preset(String),
    File(PathBuf),
    Value(Arc<TierLadder>),
}

/// Settings of a [`Transport`] of provider kind `K`, checked by
/// [`TransportBuilder::build`]. Made by [`Transport::loopback`], [`Transport::shm`] or
/// `Transport::verbs` (feature `verbs`).
///
/// ```
/// use std::time::Duration;
/// use tierbuf_tiers::ladder::TierLadder;
/// use tierbuf_transport::Transport;
/// let node = Transport::loopback()
///     .ladder(TierLadder::preset("storage")?)
///     .budget_bytes(256 << 20)
///     .demote_after(Duration::from_millis(300))
///     .reservoir_regions(1)
///     .build()?;
/// assert_eq!(node.ladder().policy().demote_after(), Duration::from_millis(300));
/// assert_eq!(node.queue_depth(), 32 + 16);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug)]
pub struct TransportBuilder<K: Kind> {
    kind: K,
    ladder: LadderChoice,
    budget: Option<MemoryBudget>,
    demote_after: Option<Duration>,
    hysteresis: Option<Duration>,
    reservoir_regions: Option<usize>,
    connections: Option<usize>,
    data_path: DataPath,
}

impl<K: Kind> TransportBuilder<K> {
    /// Settings for `kind`: the `rpc` preset and a budget from the system's limits until
    /// told otherwise.
    pub(super) fn new(kind: K) -> TransportBuilder<K> {
        TransportBuilder {
            kind,
            ladder: LadderChoice::Preset("rpc".to_owned()),
            budget: None,
            demote_after: None,
            hysteresis: None,
            reservoir_regions: None,
            connections: None,
            data_path: DataPath::default(),
        }
    }

    /// The provider kind's own settings, for its builder methods.
    pub(super) fn kind_mut(&mut self) -> &mut K {
        &mut self.kind
    }

    /// The ready-made ladder `name` (one of
    /// [`PRESET_NAMES`](tierbuf_tiers::ladder::PRESET_NAMES)); `rpc` unless another ladder
    /// is given. An unknown name fails the build with [`SetupError::UnknownPreset`].
    pub fn ladder_preset(mut self, name: &str) -> TransportBuilder<K> {
        self.ladder = LadderChoice::Preset(name.to_owned());
        self
    }

    /// The ladder in the TOML file at `path` (`tierbuf ladder check` checks one); a file
    /// that cannot be read or is not a valid ladder fails the build with
    /// [`SetupError::LadderFile`].
    pub fn ladder_file(mut self, path: impl Into<PathBuf>) -> TransportBuilder<K> {
        self.ladder = LadderChoice::File(path.into());
        self
    }

    /// This ladder.
    pub fn ladder(mut self, ladder: impl Into<Arc<TierLadder>>) -> TransportBuilder<K> {
        self.ladder = LadderChoice::Value(ladder.into());
        self
    }

    /// A budget of `bytes` for all the memory the transport registers.
    pub fn budget_bytes(mut self, bytes: u64) -> TransportBuilder<K> {
        self.budget = Some(MemoryBudget::with_cap(bytes));
        self
    }

    /// This budget (shared with whatever else is charged to it). Unless one is given, the
    /// budget is made from the system's limits (`MemoryBudget::from_system`: half of
    /// physical memory, and `RLIMIT_MEMLOCK` on verbs, which pins what it registers).
    pub fn budget(mut self, budget: MemoryBudget) -> TransportBuilder<K> {
        self.budget = Some(budget);
        self
    }

    /// Replaces the ladder's idle time before a connection steps down a tier.
    pub fn demote_after(mut self, demote_after: Duration) -> TransportBuilder<K> {
        self.demote_after = Some(demote_after);
        self
    }

    /// Replaces the ladder's minimum time on a tier before a connection steps down.
    pub fn hysteresis(mut self, hysteresis: Duration) -> TransportBuilder<K> {
        self.hysteresis = Some(hysteresis);
        self
    }

    /// Replaces how many spare registered regions of each tier the reservoir keeps (and
    /// the build fills) for promotions.
    pub fn reservoir_regions(mut self, regions: usize) -> TransportBuilder<K> {
        self.reservoir_regions = Some(regions);
        self
    }

    /// How a message past the ladder's top tier travels: read by the peer from this
    /// side's exposed copy ([`DataPath::OneSided`], the default) or in segments
    /// ([`DataPath::TwoSided`]). See `docs/protocol.md`, "Rendezvous".
    ///
    /// ```
    /// use tierbuf_transport::Transport;
    /// use tierbuf_transport::connection::DataPath;
    /// let node = Transport::loopback().budget_bytes(64 << 20).data_path(DataPath::TwoSided).build()?;
    /// assert_eq!(node.config().data_path(), DataPath::TwoSided);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn data_path(mut self, data_path: DataPath) -> TransportBuilder<K> {
        self.data_path = data_path;
        self
    }

    /// Prepares this process for `connections` connections at once: raises the soft
    /// open-file limit up to the hard limit where the provider holds files per
    /// connection (shm, verbs), and fails the build when even the hard limit cannot hold
    /// them ([`SetupError::OpenFiles`]); on verbs, checks that `RLIMIT_MEMLOCK` lets them
    /// pin what they may need.
    pub fn connections(mut self, connections: usize) -> TransportBuilder<K> {
        self.connections = Some(connections);
        self
    }

    /// Checks the settings, opens the provider and fills the reservoir.
    ///
    /// # Errors
    ///
    /// The first check that fails, in this order: the ladder
    /// ([`SetupError::UnknownPreset`], [`SetupError::LadderFile`], [`SetupError::Ladder`]
    /// for the overrides, [`SetupError::Config`]), its queue depth
    /// ([`SetupError::QueueTooDeep`]), the budget ([`SetupError::Budget`],
    /// [`SetupError::BudgetTooSmall`]), the limits for the connections expected
    /// ([`SetupError::OpenFiles`], [`SetupError::RaiseOpenFiles`], the verbs memlock
    /// check); then opening the provider, its queue depth again where the opened
    /// provider takes less (an RDMA device's `max_qp_wr`, [`SetupError::QueueTooDeep`]),
    /// and filling the reservoir ([`SetupError::Reservoir`]).
    pub fn build(self) -> Result<Transport<K>, SetupError> {
        let ladder = Arc::new(self.load_ladder()?);
        let config = ConnectionConfig::new(Arc::clone(&ladder))?.with_data_path(self.data_path);
        let depth = config.queue_depth();
        check_depth::<K>(depth, self.kind.max_depth())?;
        let budget = match self.budget {
            Some(budget) => budget,
            None => MemoryBudget::from_system(BudgetConfig {
                memlock: K::MEMLOCK,
                ..BudgetConfig::default()
            })
            .map_err(|source| SetupError::Budget { source })?,
        };
        let needed = least_budget(&ladder);
        if budget.cap() < needed {
            return Err(SetupError::BudgetTooSmall {
                cap: budget.cap(),
                needed,
            });
        }
        if let Some(connections) = self.connections {
            if let Some(files) = self.kind.open_files() {
                open_files_for(K::NAME, connections, files)?;
            }
            self.kind.check_connections(&ladder, connections)?;
        }
        let provider = self.kind.open(&budget)?;
        check_depth::<K>(depth, self.kind.opened_max_depth(&provider))?;
        let reservoir = Arc::new(Reservoir::new(provider.registrar(), Arc::clone(&ladder)));
        reservoir
            .fill()
            .map_err(|source| SetupError::Reservoir { source })?;
        Ok(Transport {
            shared: Arc::new(Shared {
                kind: self.kind,
                provider,
                budget,
                config: Arc::new(config),
                reservoir,
            }),
        })
    }

    /// The ladder chosen, with the overrides applied.
    fn load_ladder(&self) -> Result<TierLadder, SetupError> {
        let ladder = match &self.ladder {
            LadderChoice::Preset(name) => {
                TierLadder::preset(name).map_err(|source| SetupError::UnknownPreset {
                    name: name.clone(),
                    source,
                })?
            }
            LadderChoice::File(path) => {
                TierLadder::from_file(path).map_err(|source| SetupError::LadderFile {
                    path: path.clone(),
                    source,
                })?
            }
            LadderChoice::Value(ladder) => TierLadder::clone(ladder),
        };
        if self.demote_after.is_none()
            && self.hysteresis.is_none()
            && self.reservoir_regions.is_none()
        {
            return Ok(ladder);
        }
        let policy = ladder.policy();
        let mut builder = TierLadder::builder()
            .policy(*policy)
            .demote_after(self.demote_after.unwrap_or(policy.demote_after()))
            .hysteresis(self.hysteresis.unwrap_or(policy.hysteresis()))
            .reservoir_regions(self.reservoir_regions.unwrap_or(policy.reservoir_regions()));
        for spec in ladder.tiers() {
            builder = builder.tier(
                spec.slot_size(),
                spec.slot_count(),
                spec.promote_threshold(),
            );
        }
        builder
            .build()
            .map_err(|source| SetupError::Ladder { source })
    }
}

/// The least budget a transport on `ladder` works in: the reservoir's spare regions and
/// one connection's send and receive regions of the smallest tier, each in whole pages.
fn least_budget(ladder: &TierLadder) -> u64 {
    let page = tierbuf_pool::page_size() as u64;
    let pages = |len: usize| (len as u64).div_ceil(page) * page;
    let spares = ladder.policy().reservoir_regions() as u64;
    let reservoir: u64 = ladder
        .tiers()
        .iter()
        .map(|spec| spares * pages(spec.region_len()))
        .sum();
    reservoir + 2 * pages(ladder.tiers()[0].region_len())
}

/// Lets this process hold `connections` connections' open files and the others it needs,
/// raising its soft limit up to the hard limit if it must (a process started afterwards
/// inherits it).
fn open_files_for(
    provider: &'static str,
    connections: usize,
    files: OpenFiles,
) -> Result<(), SetupError> {
    let needed = connections as u64 * files.per_connection + files.others;
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
    .map_err(|errno| SetupError::RaiseOpenFiles {
        from: soft,
        to: hard,
        source: errno.into(),
    })?;
    if hard >= needed {
        return Ok(());
    }
    Err(SetupError::OpenFiles {
        provider,
        connections,
        holding: files.holding,
        needed,
        limit: hard,
        fit: hard.saturating_sub(files.others) / files.per_connection,
    })
}

impl OpenFiles {
    /// `per_connection` files held by each connection (`holding` says which), and
    /// `others` besides.
    pub(super) fn new(per_connection: u64, holding: &'static str, others: u64) -> OpenFiles {
        OpenFiles {
            per_connection,
            holding,
            others,
        }
    }
}

/// What every connection of a transport shares.
pub(super) struct Shared<K: Kind> {
    pub(super) kind: K,
    pub(super) provider: K::Provider,
    budget: MemoryBudget,
    config: Arc<ConnectionConfig>,
    reservoir: Arc<Reservoir>,
}

impl<K: Kind> Shared<K> {
    /// The queue depth of every endpoint, each way.
    pub(super) fn depth(&self) -> u32 {
        self.config.queue_depth()
    }

    /// A connection over `endpoint`, its tiers drawn from the reservoir.
    pub(super) fn connection(&self, endpoint: K::Endpoint) -> Result<ConnectionOf<K>, SetupError> {
        let core = ConnectionCore::new(
            Arc::clone(&self.config),
            Arc::clone(&self.reservoir),
            Arc::clone(&self.reservoir),
            Instant::now(),
        )?;
        let mut connection = Connection::new(core, endpoint)?;
        // A peer gone already fails the first progress: reported here rather than by the
        // connection's first call.
        connection
            .progress()
            .map_err(|source| SetupError::Connection { source })?;
        Ok(connection)
    }
}

/// A built transport of provider kind `K`: the provider, the ladder and the connection
/// configuration checked for it, the memory budget, and the reservoir every connection
/// draws its tiers from. Cloning it shares all of that; it can be sent to other threads.
///
/// `listen`, `connect` and `connect_timeout` are per provider, since each takes its own
/// kind of address: see [`Loopback`](super::Loopback), [`Shm`](super::Shm) and the
/// `Verbs` kind (feature `verbs`).
pub struct Transport<K: Kind> {
    pub(super) shared: Arc<Shared<K>>,
}

impl<K: Kind> Transport<K> {
    /// The ladder every connection runs on (with the builder's overrides).
    pub fn ladder(&self) -> &Arc<TierLadder> {
        self.shared.config.ladder()
    }

    /// The connection configuration both sides of every connection use.
    pub fn config(&self) -> &Arc<ConnectionConfig> {
        &self.shared.config
    }

    /// The send and receive queue depth of every endpoint: what the ladder needs
    /// ([`ConnectionConfig::queue_depth`]).
    pub fn queue_depth(&self) -> u32 {
        self.shared.depth()
    }

    /// The budget all registered memory is charged to.
    ///
    /// ```
    /// use tierbuf_transport::Transport;
    /// let node = Transport::loopback().ladder_preset("two-tier").budget_bytes(1 << 20).build()?;
    /// assert_eq!(node.budget().in_use(), 0); // two-tier keeps no spare regions
    /// let listener = node.listen("svc")?;
    /// let client = node.connect("svc")?;
    /// assert!(node.budget().in_use() > 0);
    /// drop((client, listener));
    /// assert_eq!(node.budget().in_use(), 0);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn budget(&self) -> &MemoryBudget {
        &self.shared.budget
    }

    /// The reservoir of spare registered regions, shared by every connection.
    pub fn reservoir(&self) -> &Arc<Reservoir> {
        &self.shared.reservoir
    }

    /// The provider.
    pub fn provider(&self) -> &K::Provider {
        &self.shared.provider
    }
}

impl<K: Kind> Clone for Transport<K> {
    fn clone(&self) -> Transport<K> {
        Transport {
            shared: Arc::clone(&self.shared),
        }
    }
}

impl<K: Kind> fmt::Debug for Transport<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Transport")
            .field("kind", &self.shared.kind)
            .field("provider", &self.shared.provider)
            .field("queue_depth", &self.shared.depth())
            .field("budget", &self.shared.budget)
            .finish_non_exhaustive()
    }
}

/// Refuses a ladder whose queue `depth` is past `max`, the deepest a `K` endpoint takes.
fn check_depth<K: Kind>(depth: u32, max: u32) -> Result<(), SetupError> {
    if depth > max {
        return Err(SetupError::QueueTooDeep {
            provider: K::NAME,
            needed: depth,
            max,
        });
    }
    Ok(())
}
