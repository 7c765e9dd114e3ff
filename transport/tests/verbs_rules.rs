//! The verbs rules, checked on the verbs provider: the same rules the loopback and shm
//! providers keep, on the RDMA device `TIERBUF_VERBS_DEVICE` names (soft-RoCE will do:
//! `rdma link add rxe0 type rxe netdev eth0`; `.ci/verbs-rxe` runs them so in a guest).
//!
//! ```text
//! TIERBUF_VERBS_DEVICE=rxe0 cargo test -p tierbuf-transport --features verbs --test verbs_rules
//! ```
//!
//! Without the variable each rule prints why it skips and passes. `TIERBUF_VERBS_GID_INDEX`
//! picks a GID entry, as for `verbs_device`; `TIERBUF_VERBS_EXPOSURES=registrations` makes
//! exposures with a registration each instead of memory windows (the fallback for devices
//! without type 2 windows), whose keys any connection of the provider can use:
//! `another_connections_key_is_refused` does not hold there (`docs/threats.md`).
#![cfg(feature = "verbs")]

mod provider_rules;

use provider_rules::TestProvider;
use tierbuf_pool::MemoryBudget;
use tierbuf_transport::verbs::{EndpointOptions, Exposures, VerbsConfig, VerbsProvider};

const DEVICE_VARIABLE: &str = "TIERBUF_VERBS_DEVICE";
const GID_INDEX_VARIABLE: &str = "TIERBUF_VERBS_GID_INDEX";
const EXPOSURES_VARIABLE: &str = "TIERBUF_VERBS_EXPOSURES";

impl TestProvider for VerbsProvider {
    const DEREGISTRATION_UNDER_A_REQUEST_UNDEFINED: Option<&'static str> = Some(
        "verbs leaves deregistering memory a posted request names undefined; soft-RoCE \
         failed the send with LOC_QP_OP_ERR in one run and left it uncompleted for 60 s in \
         another. Connections never do it: a tier retires only once every slot is back",
    );
    /// A send of at most the queue pair's `max_inline_data` bytes is copied into its work
    /// request as it is posted, then waits for the peer's receive as any send.
    const COPIED_SENDS_WAIT_FOR_A_RECEIVE: bool = true;

    fn unavailable() -> Option<String> {
        match std::env::var(DEVICE_VARIABLE) {
            Ok(name) if !name.is_empty() => None,
            _ => Some(format!(
                "{DEVICE_VARIABLE} names no RDMA device; see docs/verbs.md for soft-RoCE"
            )),
        }
    }

    /// The provider on the device `TIERBUF_VERBS_DEVICE` names: with the variable set, a
    /// device that does not open fails the rule.
    fn with_budget(budget: MemoryBudget) -> VerbsProvider {
        let name = std::env::var(DEVICE_VARIABLE).expect("checked by `unavailable`");
        let mut config = VerbsConfig::new(name);
        if let Ok(index) = std::env::var(GID_INDEX_VARIABLE) {
            let index = index
                .parse()
                .unwrap_or_else(|_| panic!("{GID_INDEX_VARIABLE}={index:?} is not a number"));
            config = config.with_gid_index(index);
        }
        match std::env::var(EXPOSURES_VARIABLE).as_deref() {
            Err(_) | Ok("windows") => {}
            Ok("registrations") => config = config.with_exposures(Exposures::Registrations),
            Ok(other) => {
                panic!("{EXPOSURES_VARIABLE}={other:?} is neither windows nor registrations")
            }
        }
        VerbsProvider::open(&config, budget)
            .unwrap_or_else(|error| panic!("opening {}: {error}", config.device()))
    }

    fn connect_pair(&self, send_depth: u32, recv_depth: u32) -> (Self::Endpoint, Self::Endpoint) {
        let options = EndpointOptions {
            send_depth,
            recv_depth,
            ..EndpointOptions::default()
        };
        self.pair(&options).unwrap()
    }
}

provider_rules!(VerbsProvider);
