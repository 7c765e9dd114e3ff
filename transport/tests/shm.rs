//! The verbs rules, checked on the shared-memory provider with both endpoints in this
//! process; `shm_processes` runs it across two.

mod provider_rules;

use provider_rules::TestProvider;
use tierbuf_pool::MemoryBudget;
use tierbuf_transport::ShmProvider;

impl TestProvider for ShmProvider {
    fn with_budget(budget: MemoryBudget) -> ShmProvider {
        ShmProvider::new(budget)
    }

    fn connect_pair(&self, send_depth: u32, recv_depth: u32) -> (Self::Endpoint, Self::Endpoint) {
        self.pair(send_depth, recv_depth).unwrap()
    }
}

provider_rules!(ShmProvider);
