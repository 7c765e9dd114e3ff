//! Whether `RLIMIT_MEMLOCK` lets a ladder's connections register what they may need.
//!
//! Registering memory with a NIC pins its pages, and the kernel charges pinned pages to
//! `RLIMIT_MEMLOCK` unless the process holds `CAP_IPC_LOCK`. A registration past the
//! limit fails deep in the driver with `ENOMEM`; checking the plan up front turns that
//! into an error that says what to change.

use tierbuf_pool::{MemlockPolicy, has_ipc_lock_capability, memlock_limit};
use tierbuf_tiers::ladder::TierLadder;

use super::error::VerbsError;

/// The limits on pinned memory that bind this process.
///
/// ```
/// use tierbuf_transport::verbs::MemlockFacts;
/// let facts = MemlockFacts::current();
/// if facts.ipc_lock {
///     println!("CAP_IPC_LOCK held: RLIMIT_MEMLOCK does not apply");
/// }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemlockFacts {
    /// `RLIMIT_MEMLOCK` in bytes (the soft limit), or `None` when unlimited.
    pub limit: Option<u64>,
    /// Whether the process holds `CAP_IPC_LOCK`, which exempts it from the limit.
    pub ipc_lock: bool,
}

impl MemlockFacts {
    /// This process's limit and capability, read as [`tierbuf_pool::MemoryBudget`] reads
    /// them.
    pub fn current() -> MemlockFacts {
        MemlockFacts {
            limit: memlock_limit(MemlockPolicy::Enforce),
            ipc_lock: has_ipc_lock_capability(),
        }
    }
}

/// Checks that `required` pinned bytes fit under the limit `facts` describe: they do when
/// the process holds `CAP_IPC_LOCK`, when the limit is unlimited, or when `required` is
/// at most the limit. Otherwise [`VerbsError::MemlockTooLow`] says how to raise it.
///
/// ```
/// use tierbuf_transport::verbs::{MemlockFacts, VerbsError, check_memlock};
/// let container = MemlockFacts { limit: Some(64 << 20), ipc_lock: false };
/// assert!(check_memlock(32 << 20, container).is_ok());
/// assert!(matches!(check_memlock(128 << 20, container), Err(VerbsError::MemlockTooLow { .. })));
/// let root = MemlockFacts { ipc_lock: true, ..container };
/// assert!(check_memlock(128 << 20, root).is_ok());
/// ```
pub fn check_memlock(required: u128, facts: MemlockFacts) -> Result<(), VerbsError> {
    match facts.limit {
        Some(limit) if !facts.ipc_lock && required > u128::from(limit) => {
            Err(VerbsError::MemlockTooLow { required, limit })
        }
        _ => Ok(()),
    }
}

/// The bytes one region of `len` bytes pins when the verbs provider registers it.
///
/// The provider registers page-aligned memory it maps itself (through
/// [`tierbuf_pool::HostRegistrar`]), so registration pins the region's length in whole
/// pages: what the memory budget is charged.
///
/// ```
/// use tierbuf_transport::verbs::region_pinned_bytes;
/// assert_eq!(region_pinned_bytes(8192, 4096), 2 * 4096);
/// assert_eq!(region_pinned_bytes(1, 4096), 4096);
/// ```
pub fn region_pinned_bytes(len: usize, page_size: usize) -> u128 {
    (len as u128).next_multiple_of(page_size.max(1) as u128)
}

/// The most bytes `connections` connections of `ladder`, and the ladder's process-wide
/// reserve, can pin through the verbs provider: the shape of
/// [`TierLadder::memory_table`] (one send and one receive region per connection at its
/// tier, and those of the tiers below when the ladder retains replaced tiers; the
/// largest such figure for every connection; plus the reserve), each region counted by
/// [`region_pinned_bytes`].
///
/// ```
/// use tierbuf_tiers::ladder::TierLadder;
/// use tierbuf_transport::verbs::{MemlockFacts, check_memlock, ladder_pinned_bytes};
/// let ladder = TierLadder::preset("two-tier")?;
/// let required = ladder_pinned_bytes(&ladder, 1000, tierbuf_pool::page_size());
/// assert!(required >= ladder.memory_table(1000).rows()[1].all_connections());
/// if let Err(error) = check_memlock(required, MemlockFacts::current()) {
///     eprintln!("{error}");
/// }
/// # Ok::<(), tierbuf_tiers::ladder::LoadError>(())
/// ```
pub fn ladder_pinned_bytes(ladder: &TierLadder, connections: usize, page_size: usize) -> u128 {
    let pinned: Vec<u128> = ladder
        .tiers()
        .iter()
        .map(|spec| region_pinned_bytes(spec.region_len(), page_size))
        .collect();
    let retain_replaced = ladder.policy().retain_replaced();
    let mut held_below = 0;
    let mut worst_per_connection = 0;
    for &region in &pinned {
        let own = 2 * region;
        let at_tier = if retain_replaced {
            held_below + own
        } else {
            own
        };
        held_below += own;
        worst_per_connection = worst_per_connection.max(at_tier);
    }
    let reserve = pinned.iter().sum::<u128>() * ladder.policy().reservoir_regions() as u128;
    worst_per_connection * connections as u128 + reserve
}

#[cfg(test)]
mod tests {
    use super::*;
    use tierbuf_tiers::ladder::SLOT_HEADROOM;

    const MIB: u64 = 1 << 20;

    #[test]
    fn a_plan_under_the_limit_passes_and_one_over_it_names_both_figures() {
        let facts = MemlockFacts {
            limit: Some(8 * MIB),
            ipc_lock: false,
        };
        assert!(check_memlock(u128::from(8 * MIB), facts).is_ok());
        let error = check_memlock(u128::from(8 * MIB) + 1, facts).unwrap_err();
        assert!(matches!(
            error,
            VerbsError::MemlockTooLow { required, limit }
                if required == u128::from(8 * MIB) + 1 && limit == 8 * MIB
        ));
        let message = error.to_string();
        assert!(
            message.contains("8388609") && message.contains("8388608"),
            "{message}"
        );
        assert!(message.contains("ulimit -l"), "{message}");
        assert!(message.contains("CAP_IPC_LOCK"), "{message}");
    }

    #[test]
    fn the_capability_or_an_unlimited_limit_admits_anything() {
        let capability = MemlockFacts {
            limit: Some(0),
            ipc_lock: true,
        };
        assert!(check_memlock(u128::MAX, capability).is_ok());
        let unlimited = MemlockFacts {
            limit: None,
            ipc_lock: false,
        };
        assert!(check_memlock(u128::MAX, unlimited).is_ok());
    }

    #[test]
    fn a_zero_limit_refuses_any_pinning() {
        let facts = MemlockFacts {
            limit: Some(0),
            ipc_lock: false,
        };
        assert!(check_memlock(0, facts).is_ok());
        assert!(check_memlock(1, facts).is_err());
    }

    #[test]
    fn the_current_facts_agree_with_the_budget_reading() {
        let facts = MemlockFacts::current();
        assert_eq!(facts.ipc_lock, has_ipc_lock_capability());
        assert_eq!(facts.limit, memlock_limit(MemlockPolicy::Enforce));
        if facts.ipc_lock {
            assert!(check_memlock(u128::MAX, facts).is_ok());
        }
    }

    #[test]
    fn a_region_pins_its_length_in_whole_pages() {
        assert_eq!(region_pinned_bytes(4096, 4096), 4096);
        assert_eq!(region_pinned_bytes(4097, 4096), 2 * 4096);
        assert_eq!(region_pinned_bytes(128 << 10, 4096), 32 * 4096);
    }

    #[test]
    fn ladder_figures_follow_the_memory_table_with_verbs_rounding() {
        // Regions of slots of the tier's size and the ladder's headroom (64 B): 512 B,
        // 3264 B, 12 480 B; each pins its length in whole pages.
        let pages = |count: u128| count * 4096;
        let ladder = TierLadder::builder()
            .tier(64, 4, 64)
            .tier(1024, 3, 1024)
            .tier(4096, 3, 4096)
            .build()
            .unwrap();
        let region = [pages(1), pages(1), pages(4)];
        assert_eq!(ladder_pinned_bytes(&ladder, 10, 4096), 10 * 2 * region[2]);

        let retaining = TierLadder::builder()
            .tier(64, 4, 64)
            .tier(1024, 3, 1024)
            .tier(4096, 3, 4096)
            .retain_replaced(true)
            .reservoir_regions(2)
            .build()
            .unwrap();
        let all: u128 = region.iter().sum();
        assert_eq!(
            ladder_pinned_bytes(&retaining, 10, 4096),
            10 * 2 * all + 2 * all
        );
        let table = retaining.memory_table(10);
        let registered = table.rows()[2].all_connections() + table.reservoir_bytes();
        assert!(ladder_pinned_bytes(&retaining, 10, 4096) >= registered);
    }

    #[test]
    fn the_worst_connection_is_at_the_tier_with_the_longest_region() {
        // Tier 0's region (64 slots of 1 KiB and the headroom) is longer than tier 1's
        // (3 of 4 KiB and the headroom): the worst connection is one at tier 0.
        let ladder = TierLadder::builder()
            .tier(1024, 64, 1024)
            .tier(4096, 3, 4096)
            .build()
            .unwrap();
        let tier0 = region_pinned_bytes(64 * (1024 + SLOT_HEADROOM), 4096);
        assert_eq!(ladder_pinned_bytes(&ladder, 3, 4096), 3 * 2 * tier0);
    }

    #[test]
    fn ten_thousand_two_tier_connections_do_not_fit_a_container_default() {
        let ladder = TierLadder::preset("two-tier").unwrap();
        let required = ladder_pinned_bytes(&ladder, 10_000, 4096);
        let container = MemlockFacts {
            limit: Some(64 * MIB),
            ipc_lock: false,
        };
        assert!(matches!(
            check_memlock(required, container),
            Err(VerbsError::MemlockTooLow { .. })
        ));
    }
}
