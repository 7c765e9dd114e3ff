//! Registered memory for RDMA buffers: regions that own their registration, lock-free pools
//! of fixed-size slots carved from them, and a process-wide budget of registered bytes.
//!
//! ```
//! use tierbuf_pool::{BudgetConfig, HostRegistrar, MemoryBudget, SlotPool};
//! let budget = MemoryBudget::from_system(BudgetConfig { cap: Some(64 << 20), ..Default::default() })?;
//! let registrar = HostRegistrar::new(budget.clone());
//! let pool = SlotPool::new(&registrar, 512, 16)?;
//! let mut slot = pool.try_acquire().unwrap();
//! slot[..4].copy_from_slice(b"ping");
//! assert_eq!(budget.in_use(), 512 * 16);
//! # Ok::<(), tierbuf_pool::PoolError>(())
//! ```

#![warn(missing_docs)]

mod budget;
mod error;
mod region;
mod slot;
pub mod sync;

pub use budget::{
    BudgetConfig, CapSource, MemlockPolicy, MemoryBudget, Reservation, has_ipc_lock_capability,
    memlock_limit, physical_memory,
};
pub use error::PoolError;
pub use region::{HostRegistrar, HugePages, Region, RegionKeys, Registrar, SharedHostRegion};
pub use slot::{MAX_SLOTS, OwnedSlot, Slot, SlotPool};

/// The system's page size: the alignment [`SlotPool::new`] registers with.
///
/// ```
/// assert!(tierbuf_pool::page_size().is_power_of_two());
/// ```
pub fn page_size() -> usize {
    rustix::param::page_size()
}
