//! Connected pairs for the tests of waiting (`readiness`, `senders`, `tokio_connection`)
//! and of a peer's close (`peer_close`):
//! providers whose endpoints come in pairs, and connections over them on a ladder.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tierbuf_pool::MemoryBudget;
use tierbuf_tiers::Reservoir;
use tierbuf_tiers::ladder::TierLadder;
use tierbuf_transport::connection::{Connection, ConnectionConfig, ConnectionCore};
use tierbuf_transport::{Endpoint, LoopbackProvider, Provider, ShmProvider};

/// A provider whose endpoints come in connected pairs.
pub(crate) trait PairProvider: Provider<Endpoint: 'static + Unpin> {
    /// A provider charging a budget of 1 GiB.
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
    let config = Arc::new(ConnectionConfig::new(Arc::new(ladder)).unwrap());
    let reservoir = Arc::new(Reservoir::new(
        provider.registrar(),
        Arc::clone(config.ladder()),
    ));
    let (a, b) = provider.connect_pair(config.queue_depth());
    let core = || {
        ConnectionCore::new(
            Arc::clone(&config),
            Arc::clone(&reservoir),
            Arc::clone(&reservoir),
            Instant::now(),
        )
        .unwrap()
    };
    (
        Connection::new(core(), wrap(a)).unwrap(),
        Connection::new(core(), b).unwrap(),
    )
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
