//! Connected pairs for the connection tests: providers whose endpoints come in pairs, and
//! connections over them on a ladder, sharing a configuration and a reservoir.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tierbuf_pool::MemoryBudget;
use tierbuf_tiers::Reservoir;
use tierbuf_tiers::ladder::{TierLadder, TierLadderBuilder};
use tierbuf_transport::connection::{Connection, ConnectionConfig, ConnectionCore, DataPath};
use tierbuf_transport::{Endpoint, LoopbackProvider, Provider, ShmProvider};

/// What the connections of a test share, as a transport's do: the configuration for
/// their ladder, and one reservoir on the provider's registrar that every core draws
/// its tiers from.
pub(crate) struct Shared {
    pub(crate) config: Arc<ConnectionConfig>,
    pub(crate) reservoir: Arc<Reservoir>,
}

impl Shared {
    /// The configuration for `ladder`, and a reservoir for it on `provider`.
    #[allow(dead_code)] // Not every test binary takes the default configuration.
    pub(crate) fn new(provider: &impl Provider, ladder: Arc<TierLadder>) -> Shared {
        Shared::with_config(provider, Arc::new(ConnectionConfig::new(ladder).unwrap()))
    }

    /// `config`, and a reservoir of its own for it on `provider`.
    pub(crate) fn with_config(provider: &impl Provider, config: Arc<ConnectionConfig>) -> Shared {
        let reservoir = Arc::new(Reservoir::new(
            provider.registrar(),
            Arc::clone(config.ladder()),
        ));
        Shared { config, reservoir }
    }

    /// A core on the configuration, sending and receiving from the reservoir.
    pub(crate) fn core(&self) -> ConnectionCore {
        ConnectionCore::new(
            Arc::clone(&self.config),
            Arc::clone(&self.reservoir),
            Arc::clone(&self.reservoir),
            Instant::now(),
        )
        .unwrap()
    }

    /// A connection over `endpoint`.
    pub(crate) fn connection<E: Endpoint>(&self, endpoint: E) -> Connection<E> {
        Connection::new(self.core(), endpoint).unwrap()
    }
}

/// A provider whose endpoints come in connected pairs.
pub(crate) trait PairProvider: Provider<Endpoint: 'static + Unpin> {
    /// A provider charging a budget of 1 GiB.
    #[allow(dead_code)] // Not every test binary leaves its provider's budget to this.
    fn make() -> Self;
    /// Two connected endpoints, both queues `depth` deep.
    fn connect_pair(&self, depth: u32) -> (Self::Endpoint, Self::Endpoint);
}

impl PairProvider for LoopbackProvider {
    fn make() -> Self {
        LoopbackProvider::new(MemoryBudget::with_cap(1 << 30))
    }
    fn connect_pair(&self, depth: u32) -> (Self::Endpoint, Self::Endpoint) {
        self.pair(depth, depth).unwrap()
    }
}

impl PairProvider for ShmProvider {
    fn make() -> Self {
        ShmProvider::new(MemoryBudget::with_cap(1 << 30))
    }
    fn connect_pair(&self, depth: u32) -> (Self::Endpoint, Self::Endpoint) {
        self.pair(depth, depth).unwrap()
    }
}

/// Whether the verbs provider cannot be tested here, having said why: it runs on the RDMA
/// device `TIERBUF_VERBS_DEVICE` names (soft-RoCE will do; `.ci/verbs-rxe` runs the tests
/// so). A verbs test returns at once where this is `true`.
#[cfg(feature = "verbs")]
#[allow(dead_code)] // Not every test binary runs on verbs.
pub(crate) fn skipped_without_a_verbs_device() -> bool {
    let missing = !std::env::var("TIERBUF_VERBS_DEVICE").is_ok_and(|name| !name.is_empty());
    if missing {
        println!("skipped: TIERBUF_VERBS_DEVICE names no RDMA device; see docs/verbs.md");
    }
    missing
}

/// The verbs provider on the device `TIERBUF_VERBS_DEVICE` names
/// ([`skipped_without_a_verbs_device`] says whether there is one), with the GID index `TIERBUF_VERBS_GID_INDEX` gives, if any.
#[cfg(feature = "verbs")]
impl PairProvider for tierbuf_transport::verbs::VerbsProvider {
    fn make() -> Self {
        use tierbuf_transport::verbs::{VerbsConfig, VerbsProvider};
        let name = std::env::var("TIERBUF_VERBS_DEVICE").expect("checked before");
        let mut config = VerbsConfig::new(name);
        if let Ok(index) = std::env::var("TIERBUF_VERBS_GID_INDEX") {
            config = config.with_gid_index(index.parse().expect("a GID index"));
        }
        VerbsProvider::open(&config, MemoryBudget::with_cap(1 << 30))
            .unwrap_or_else(|error| panic!("opening {}: {error}", config.device()))
    }
    fn connect_pair(&self, depth: u32) -> (Self::Endpoint, Self::Endpoint) {
        let options = tierbuf_transport::verbs::EndpointOptions {
            send_depth: depth,
            recv_depth: depth,
            ..Default::default()
        };
        self.pair(&options).unwrap()
    }
}

/// The preset ladder `name`.
#[allow(dead_code)] // Not every test binary takes a preset.
pub(crate) fn preset(name: &str) -> TierLadder {
    TierLadder::preset(name).unwrap()
}

/// The three tiers most connection tests run on, for each to add its own policy: tier 0
/// carries 240 bytes whole, tier 1 4080, tier 2 65520; longer messages are segmented.
#[allow(dead_code)] // Not every test binary runs on them.
pub(crate) fn three_tiers() -> TierLadderBuilder {
    TierLadder::builder()
        .tier(256, 8, 240)
        .tier(4096, 8, 4080)
        .tier(65536, 4, 65520)
}

/// The `two-tier` ladder's tiers (512 B and 8 KiB), demoting after `demote_after`.
#[allow(dead_code)] // Not every test binary demotes.
pub(crate) fn demoting_ladder(demote_after: Duration) -> TierLadder {
    TierLadder::builder()
        .tier(512, 16, 480)
        .tier(8192, 16, 8192)
        .demote_after(demote_after)
        .hysteresis(demote_after / 2)
        .build()
        .unwrap()
}

/// A connected pair of connections on `ladder`, sharing one reservoir.
#[allow(dead_code)] // Not every test binary takes both ends as they come.
pub(crate) fn connections<P: PairProvider>(
    provider: &P,
    ladder: TierLadder,
) -> (Connection<P::Endpoint>, Connection<P::Endpoint>) {
    connections_wrapping(provider, ladder, |endpoint| endpoint)
}

/// [`connections`], the first over `wrap` of its endpoint.
pub(crate) fn connections_wrapping<P: PairProvider, W: Endpoint>(
    provider: &P,
    ladder: TierLadder,
    wrap: impl FnOnce(P::Endpoint) -> W,
) -> (Connection<W>, Connection<P::Endpoint>) {
    connections_wrapping_on(provider, ladder, DataPath::default(), wrap)
}

/// [`connections`], messages too large for the tier in force going as `data_path` says.
#[allow(dead_code)] // Not every test binary chooses its data path.
pub(crate) fn connections_on<P: PairProvider>(
    provider: &P,
    ladder: TierLadder,
    data_path: DataPath,
) -> (Connection<P::Endpoint>, Connection<P::Endpoint>) {
    connections_wrapping_on(provider, ladder, data_path, |endpoint| endpoint)
}

/// [`connections_wrapping`] on `data_path`.
pub(crate) fn connections_wrapping_on<P: PairProvider, W: Endpoint>(
    provider: &P,
    ladder: TierLadder,
    data_path: DataPath,
    wrap: impl FnOnce(P::Endpoint) -> W,
) -> (Connection<W>, Connection<P::Endpoint>) {
    let config = ConnectionConfig::new(Arc::new(ladder))
        .unwrap()
        .with_data_path(data_path);
    let shared = Shared::with_config(provider, Arc::new(config));
    let (a, b) = provider.connect_pair(shared.config.queue_depth());
    (shared.connection(wrap(a)), shared.connection(b))
}

/// The preset ladder `name`, demoting only after `demote_after`: a test that stalls until
/// a timer of the connection waits that long, so with an hour a lost wake is a hang.
#[allow(dead_code)] // Not every test binary changes a preset's policy.
pub(crate) fn preset_demoting_after(name: &str, demote_after: Duration) -> TierLadder {
    let ladder = preset(name);
    let mut builder = TierLadder::builder()
        .policy(*ladder.policy())
        .demote_after(demote_after);
    for spec in ladder.tiers() {
        builder = builder.tier(
            spec.slot_size(),
            spec.slot_count(),
            spec.promote_threshold(),
        );
    }
    builder.build().unwrap()
}

/// Each of the generic async tests named as a `#[tokio::test]` on two worker threads, in
/// a module per provider (`loopback`, `shm`, and with `verbs;` first also `verbs`, where
/// `TIERBUF_VERBS_DEVICE` names a device), failing if it runs longer than `bound`.
#[allow(unused_macros)] // Not every test binary is async.
macro_rules! tokio_on_each_provider {
    (verbs; within $bound:expr; $($test:ident),* $(,)?) => {
        pairs::tokio_on_each_provider!(within $bound; $($test),*);
        #[cfg(feature = "verbs")]
        pairs::tokio_on_each_provider!(
            @over verbs, tierbuf_transport::verbs::VerbsProvider, pairs::skipped_without_a_verbs_device(), $bound;
            $($test),*
        );
    };
    (within $bound:expr; $($test:ident),* $(,)?) => {
        pairs::tokio_on_each_provider!(@over loopback, tierbuf_transport::LoopbackProvider, false, $bound; $($test),*);
        pairs::tokio_on_each_provider!(@over shm, tierbuf_transport::ShmProvider, false, $bound; $($test),*);
    };
    (@over $module:ident, $provider:ty, $skipped:expr, $bound:expr; $($test:ident),*) => {
        mod $module {
            use super::*;
            $(#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $test() {
                if $skipped {
                    return;
                }
                tokio::time::timeout($bound, super::$test::<$provider>()).await.unwrap();
            })*
        }
    };
}
#[allow(unused_imports)] // Not every test binary is async.
pub(crate) use tokio_on_each_provider;
