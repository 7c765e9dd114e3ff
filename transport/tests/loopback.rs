//! The verbs rules, checked on the loopback provider.

mod provider_rules;

use provider_rules::TestProvider;
use tierbuf_pool::MemoryBudget;
use tierbuf_transport::LoopbackProvider;

impl TestProvider for LoopbackProvider {
    fn with_budget(budget: MemoryBudget) -> LoopbackProvider {
        LoopbackProvider::new(budget)
    }

    fn connect_pair(&self, send_depth: u32, recv_depth: u32) -> (Self::Endpoint, Self::Endpoint) {
        self.pair(send_depth, recv_depth).unwrap()
    }
}

provider_rules!(LoopbackProvider);
