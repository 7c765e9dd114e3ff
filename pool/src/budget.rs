//! Process-wide accounting of registered bytes.
//!
//! # Invariants
//!
//! - `in_use <= cap` at every instant: a reservation is admitted by one compare-and-swap
//!   that checks the cap and adds the bytes together, so two racing reservations can
//!   never both pass a cap that only one of them fits under.
//! - `in_use` is the sum of the lengths of the live [`Reservation`]s of this budget: a
//!   reservation adds its length once when created and subtracts it once when dropped.
//! - `peak >= in_use` once every reservation admitted has returned from
//!   [`MemoryBudget::reserve`]: an admitted reservation raises `peak` to the total it
//!   made with one `fetch_max`, so a smaller total never overwrites a larger one, and
//!   [`MemoryBudget::reset_peak`] only lowers it to `in_use`.
//!
//! One budget is meant to be shared (it is a cheap handle) by every registrar of a
//! process, so that the cap bounds everything the process registers.

use std::fmt;

use crate::error::PoolError;
use crate::sync::{Arc, AtomicU64, Ordering};

/// Which limit set a budget's cap.
#[derive(Debug, Clone, Copy, PartialEq)]
#[non_exhaustive]
pub enum CapSource {
    /// The cap given in configuration.
    Configured,
    /// A fraction of the machine's physical memory.
    PhysicalMemory {
        /// The fraction of physical memory.
        fraction: f64,
        /// Physical memory in bytes, as `sysinfo` read it.
        physical: u64,
    },
    /// The process's `RLIMIT_MEMLOCK` (`ulimit -l`).
    Memlock,
}

impl fmt::Display for CapSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CapSource::Configured => f.write_str("the configured cap"),
            CapSource::PhysicalMemory { fraction, physical } => write!(
                f,
                "{:.0}% of {physical} bytes of physical memory",
                fraction * 100.0
            ),
            CapSource::Memlock => f.write_str("RLIMIT_MEMLOCK (`ulimit -l`)"),
        }
    }
}

/// Whether a budget is bound by `RLIMIT_MEMLOCK`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum MemlockPolicy {
    /// Bound by the limit unless the process has `CAP_IPC_LOCK` (root has it), which lets
    /// the kernel ignore the limit.
    #[default]
    Auto,
    /// Always bound by the limit, even where the kernel would not enforce it.
    Enforce,
    /// Never bound by the limit.
    Ignore,
}

/// Settings for [`MemoryBudget::from_system`].
///
/// ```
/// use tierbuf_pool::{BudgetConfig, MemlockPolicy};
/// let config = BudgetConfig {
///     cap: Some(64 << 20),
///     physical_fraction: 0.25,
///     memlock: MemlockPolicy::Auto,
/// };
/// assert_eq!(config.cap, Some(64 << 20));
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BudgetConfig {
    /// An explicit cap in bytes, if any.
    pub cap: Option<u64>,
    /// The share of physical memory the budget may use, in `(0, 1]`.
    pub physical_fraction: f64,
    /// Whether `RLIMIT_MEMLOCK` bounds the budget.
    pub memlock: MemlockPolicy,
}

impl Default for BudgetConfig {
    /// No explicit cap, half of physical memory, and `RLIMIT_MEMLOCK` unless bypassed.
    fn default() -> Self {
        BudgetConfig {
            cap: None,
            physical_fraction: 0.5,
            memlock: MemlockPolicy::Auto,
        }
    }
}

#[derive(Debug)]
struct BudgetShared {
    cap: u64,
    limited_by: CapSource,
    in_use: AtomicU64,
    /// The most bytes `in_use` has held since the budget was made or last reset.
    peak: AtomicU64,
}

/// A cap on registered bytes, shared by every registrar that charges it.
///
/// Cloning gives another handle onto the same account.
///
/// ```
/// use tierbuf_pool::{MemoryBudget, PoolError};
/// let budget = MemoryBudget::with_cap(1 << 20);
/// let first = budget.reserve(768 << 10)?;
/// assert!(matches!(budget.reserve(512 << 10), Err(PoolError::BudgetExceeded { .. })));
/// drop(first);
/// assert_eq!(budget.in_use(), 0);
/// # Ok::<(), PoolError>(())
/// ```
#[derive(Debug, Clone)]
pub struct MemoryBudget {
    shared: Arc<BudgetShared>,
}

impl MemoryBudget {
    /// A budget with an explicit cap of `cap` bytes and no other limit.
    pub fn with_cap(cap: u64) -> MemoryBudget {
        MemoryBudget::from_parts(cap, CapSource::Configured)
    }

    /// A budget whose cap is the smallest of the configured cap, the configured fraction
    /// of physical memory, and `RLIMIT_MEMLOCK` as `config.memlock` says.
    ///
    /// ```
    /// use tierbuf_pool::{BudgetConfig, MemoryBudget};
    /// let budget = MemoryBudget::from_system(BudgetConfig::default())?;
    /// assert!(budget.cap() > 0);
    /// # Ok::<(), tierbuf_pool::PoolError>(())
    /// ```
    pub fn from_system(config: BudgetConfig) -> Result<MemoryBudget, PoolError> {
        let fraction = config.physical_fraction;
        if !(fraction > 0.0 && fraction <= 1.0) {
            return Err(PoolError::InvalidFraction { fraction });
        }
        let physical = physical_memory();
        // Truncation is intended: the cap is a whole number of bytes at or below the share.
        let mut best = (
            (physical as f64 * fraction) as u64,
            CapSource::PhysicalMemory { fraction, physical },
        );
        if let Some(cap) = config.cap
            && cap < best.0
        {
            best = (cap, CapSource::Configured);
        }
        if let Some(limit) = memlock_limit(config.memlock)
            && limit < best.0
        {
            best = (limit, CapSource::Memlock);
        }
        Ok(MemoryBudget::from_parts(best.0, best.1))
    }

    fn from_parts(cap: u64, limited_by: CapSource) -> MemoryBudget {
        MemoryBudget {
            shared: Arc::new(BudgetShared {
                cap,
                limited_by,
                in_use: AtomicU64::new(0),
                peak: AtomicU64::new(0),
            }),
        }
    }

    /// The cap in bytes.
    pub fn cap(&self) -> u64 {
        self.shared.cap
    }

    /// Which limit set the cap.
    pub fn limited_by(&self) -> CapSource {
        self.shared.limited_by
    }

    /// Bytes reserved now.
    pub fn in_use(&self) -> u64 {
        self.shared.in_use.load(Ordering::Acquire)
    }

    /// Bytes that can still be reserved now.
    pub fn available(&self) -> u64 {
        self.cap().saturating_sub(self.in_use())
    }

    /// The most bytes reserved at once since the budget was made or
    /// [`MemoryBudget::reset_peak`] last ran: every admitted reservation counts, however
    /// briefly it was held, which a reading of [`MemoryBudget::in_use`] now and then would
    /// miss.
    ///
    /// ```
    /// use tierbuf_pool::MemoryBudget;
    /// let budget = MemoryBudget::with_cap(1 << 20);
    /// let first = budget.reserve(4096)?;
    /// drop(budget.reserve(8192)?);
    /// assert_eq!((budget.in_use(), budget.peak()), (4096, 12288));
    /// drop(first);
    /// assert_eq!(budget.reset_peak(), 12288);
    /// assert_eq!(budget.peak(), 0, "nothing is reserved now");
    /// # Ok::<(), tierbuf_pool::PoolError>(())
    /// ```
    pub fn peak(&self) -> u64 {
        self.shared.peak.load(Ordering::Acquire)
    }

    /// Starts a new peak from the bytes reserved now, and returns the one it ends, so
    /// that a phase of a program (its traffic, say) can be given a peak of its own. A
    /// reservation admitted while this runs counts toward the peak it ends, the one it
    /// starts, or both.
    pub fn reset_peak(&self) -> u64 {
        let ended = self.shared.peak.swap(self.in_use(), Ordering::AcqRel);
        // What was admitted between the reading of `in_use` and the swap is in `in_use`
        // now, if it is still held.
        self.shared.peak.fetch_max(self.in_use(), Ordering::AcqRel);
        ended
    }

    /// Reserves `bytes` until the returned reservation is dropped, or fails with
    /// [`PoolError::BudgetExceeded`] naming the cap, the bytes in use and the request.
    pub fn reserve(&self, bytes: u64) -> Result<Reservation, PoolError> {
        if bytes == 0 {
            return Err(PoolError::ZeroLength);
        }
        let shared = &*self.shared;
        #[cfg(loom)]
        if crate::sync::planted::is_planted(crate::sync::planted::Bug::BudgetCheckThenAdd) {
            let in_use = shared.in_use.load(Ordering::Acquire);
            if in_use
                .checked_add(bytes)
                .is_none_or(|total| total > shared.cap)
            {
                return Err(self.exceeded(bytes, in_use));
            }
            let before = shared.in_use.fetch_add(bytes, Ordering::AcqRel);
            self.raise_peak(before + bytes);
            return Ok(Reservation {
                budget: self.clone(),
                bytes,
            });
        }
        let admitted = shared
            .in_use
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |in_use| {
                in_use
                    .checked_add(bytes)
                    .filter(|&total| total <= shared.cap)
            });
        match admitted {
            Ok(before) => {
                self.raise_peak(before + bytes);
                Ok(Reservation {
                    budget: self.clone(),
                    bytes,
                })
            }
            Err(in_use) => Err(self.exceeded(bytes, in_use)),
        }
    }

    /// Raises the peak to `total`, the bytes in use that an admitted reservation made.
    fn raise_peak(&self, total: u64) {
        let peak = &self.shared.peak;
        #[cfg(loom)]
        if crate::sync::planted::is_planted(crate::sync::planted::Bug::BudgetPeakLoadThenStore) {
            if peak.load(Ordering::Acquire) < total {
                peak.store(total, Ordering::Release);
            }
            return;
        }
        peak.fetch_max(total, Ordering::AcqRel);
    }

    fn exceeded(&self, requested: u64, in_use: u64) -> PoolError {
        PoolError::BudgetExceeded {
            requested,
            in_use,
            cap: self.shared.cap,
            limited_by: self.shared.limited_by,
        }
    }
}

/// Bytes held against a [`MemoryBudget`]; given back when dropped.
#[derive(Debug)]
#[must_use = "dropping a reservation gives its bytes back at once"]
pub struct Reservation {
    budget: MemoryBudget,
    bytes: u64,
}

impl Reservation {
    /// The bytes this reservation holds.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// The budget this reservation is charged to.
    pub fn budget(&self) -> &MemoryBudget {
        &self.budget
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        self.budget
            .shared
            .in_use
            .fetch_sub(self.bytes, Ordering::AcqRel);
    }
}

/// Physical memory in bytes as `sysinfo` reads it.
pub fn physical_memory() -> u64 {
    let refresh = sysinfo::RefreshKind::nothing()
        .with_memory(sysinfo::MemoryRefreshKind::nothing().with_ram());
    sysinfo::System::new_with_specifics(refresh).total_memory()
}

/// The `RLIMIT_MEMLOCK` that binds this process under `policy`, or `None` when the limit
/// is unlimited, ignored, or bypassed by `CAP_IPC_LOCK`.
pub fn memlock_limit(policy: MemlockPolicy) -> Option<u64> {
    if policy == MemlockPolicy::Ignore {
        return None;
    }
    let limit = rustix::process::getrlimit(rustix::process::Resource::Memlock).current?;
    if policy == MemlockPolicy::Auto && has_ipc_lock_capability() {
        return None;
    }
    Some(limit)
}

/// Whether this process holds `CAP_IPC_LOCK`, which exempts it from `RLIMIT_MEMLOCK`.
pub fn has_ipc_lock_capability() -> bool {
    rustix::thread::capabilities(None)
        .map(|sets| {
            sets.effective
                .contains(rustix::thread::CapabilitySet::IPC_LOCK)
        })
        .unwrap_or(false)
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn reservation_past_cap_names_cap_use_and_request() {
        let budget = MemoryBudget::with_cap(1000);
        let _held = budget.reserve(600).unwrap();
        let err = budget.reserve(500).unwrap_err();
        match err {
            PoolError::BudgetExceeded {
                requested,
                in_use,
                cap,
                limited_by,
            } => {
                assert_eq!((requested, in_use, cap), (500, 600, 1000));
                assert_eq!(limited_by, CapSource::Configured);
            }
            other => panic!("unexpected error {other:?}"),
        }
        let message = budget.reserve(500).unwrap_err().to_string();
        assert!(message.contains("500") && message.contains("600") && message.contains("1000"));
    }

    #[test]
    fn reservations_return_bytes_on_drop_and_fill_exactly_to_cap() {
        let budget = MemoryBudget::with_cap(100);
        let a = budget.reserve(60).unwrap();
        let b = budget.reserve(40).unwrap();
        assert_eq!(budget.in_use(), 100);
        assert_eq!(budget.available(), 0);
        assert!(budget.reserve(1).is_err());
        drop(a);
        assert_eq!(budget.in_use(), 40);
        drop(b);
        assert_eq!(budget.in_use(), 0);
    }

    #[test]
    fn the_peak_counts_refusals_never_and_a_reset_starts_from_what_is_held() {
        let budget = MemoryBudget::with_cap(100);
        let held = budget.reserve(30).unwrap();
        drop(budget.reserve(50).unwrap());
        assert!(budget.reserve(71).is_err(), "past the cap");
        assert_eq!(budget.peak(), 80, "a refused reservation raises nothing");
        assert_eq!(budget.reset_peak(), 80);
        assert_eq!(budget.peak(), 30, "a new peak starts from what is held");
        let more = budget.reserve(10).unwrap();
        drop(more);
        assert_eq!(budget.peak(), 40);
        drop(held);
        assert_eq!((budget.in_use(), budget.peak()), (0, 40));
    }

    #[test]
    fn zero_and_overflowing_reservations_are_refused() {
        let budget = MemoryBudget::with_cap(u64::MAX);
        assert!(matches!(budget.reserve(0), Err(PoolError::ZeroLength)));
        let _held = budget.reserve(u64::MAX - 1).unwrap();
        assert!(matches!(
            budget.reserve(2),
            Err(PoolError::BudgetExceeded { .. })
        ));
    }

    #[test]
    fn system_cap_is_the_smallest_limit() {
        let tiny = MemoryBudget::from_system(BudgetConfig {
            cap: Some(4096),
            ..BudgetConfig::default()
        })
        .unwrap();
        assert_eq!(tiny.cap(), 4096);
        assert_eq!(tiny.limited_by(), CapSource::Configured);

        let physical = physical_memory();
        assert!(physical > 0);
        let half = MemoryBudget::from_system(BudgetConfig {
            memlock: MemlockPolicy::Ignore,
            ..BudgetConfig::default()
        })
        .unwrap();
        assert_eq!(half.cap(), physical / 2);

        let enforced = MemoryBudget::from_system(BudgetConfig {
            memlock: MemlockPolicy::Enforce,
            ..BudgetConfig::default()
        })
        .unwrap();
        match memlock_limit(MemlockPolicy::Enforce) {
            Some(limit) if limit < physical / 2 => {
                assert_eq!(enforced.cap(), limit);
                assert_eq!(enforced.limited_by(), CapSource::Memlock);
            }
            _ => assert_eq!(enforced.cap(), half.cap()),
        }
    }

    #[test]
    fn auto_memlock_is_bypassed_exactly_when_the_capability_is_held() {
        let enforced = memlock_limit(MemlockPolicy::Enforce);
        let auto = memlock_limit(MemlockPolicy::Auto);
        if has_ipc_lock_capability() {
            assert_eq!(auto, None);
        } else {
            assert_eq!(auto, enforced);
        }
        assert_eq!(memlock_limit(MemlockPolicy::Ignore), None);
    }

    #[test]
    fn fractions_outside_zero_to_one_are_refused() {
        for fraction in [0.0, -0.5, 1.5, f64::NAN] {
            let config = BudgetConfig {
                physical_fraction: fraction,
                ..BudgetConfig::default()
            };
            assert!(matches!(
                MemoryBudget::from_system(config),
                Err(PoolError::InvalidFraction { .. })
            ));
        }
    }
}
