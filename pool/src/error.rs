//! The error type of the `pool` crate.

use crate::budget::CapSource;

/// What went wrong while registering memory, carving slots or reserving budget.
///
/// Every argument check of this crate reports through this type; none panics.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PoolError {
    /// A region or reservation of zero bytes was asked for.
    #[error("a registered region must not be empty (asked for 0 bytes)")]
    ZeroLength,
    /// The requested alignment is not a power of two.
    #[error("alignment {align} is not a power of two")]
    AlignmentNotPowerOfTwo {
        /// The alignment asked for.
        align: usize,
    },
    /// A slot size of zero was asked for.
    #[error("slot size must be at least 1 byte")]
    ZeroSlotSize,
    /// A pool of zero slots was asked for.
    #[error("a slot pool needs at least one slot")]
    ZeroSlotCount,
    /// The region's length is not a whole number of slots.
    #[error("slot size {slot_size} does not divide the region length {region_len}")]
    SlotSizeDoesNotDivide {
        /// Length of the region in bytes.
        region_len: usize,
        /// The slot size asked for.
        slot_size: usize,
    },
    /// More slots than a pool can index were asked for.
    #[error("{requested} slots asked for, a pool holds at most {max}")]
    TooManySlots {
        /// Slots asked for.
        requested: usize,
        /// The most a pool can hold.
        max: usize,
    },
    /// `slot_size * slot_count` (or a length rounded up for alignment) overflows `usize`.
    #[error("{slot_size} bytes x {slot_count} slots overflows the address space")]
    SizeOverflow {
        /// The slot size asked for.
        slot_size: usize,
        /// The slot count asked for.
        slot_count: usize,
    },
    /// A reservation would pass the memory budget's cap.
    #[error(
        "registering {requested} bytes would pass the memory budget: {in_use} of {cap} bytes \
         in use (cap set by {limited_by})"
    )]
    BudgetExceeded {
        /// Bytes asked for.
        requested: u64,
        /// Bytes already reserved when the request came.
        in_use: u64,
        /// The budget's cap in bytes.
        cap: u64,
        /// Which limit set the cap.
        limited_by: CapSource,
    },
    /// The fraction of physical memory for a budget is not in `(0, 1]`.
    #[error("physical-memory fraction {fraction} is not in (0, 1]")]
    InvalidFraction {
        /// The fraction given.
        fraction: f64,
    },
    /// Mapping memory failed.
    #[error("mapping {len} bytes failed")]
    Map {
        /// Bytes asked for.
        len: usize,
        /// The operating system's error.
        #[source]
        source: std::io::Error,
    },
    /// Explicit huge pages were asked for and the system could not supply them.
    #[error(
        "no huge pages for {len} bytes (reserve some in /proc/sys/vm/nr_hugepages, \
         or use transparent huge pages)"
    )]
    HugePagesUnavailable {
        /// Bytes asked for.
        len: usize,
        /// The operating system's error.
        #[source]
        source: std::io::Error,
    },
    /// Pinning memory with `mlock` failed (usually `RLIMIT_MEMLOCK`, see `ulimit -l`).
    #[error("pinning {len} bytes with mlock failed; raise `ulimit -l` or lower the budget")]
    Lock {
        /// Bytes asked for.
        len: usize,
        /// The operating system's error.
        #[source]
        source: std::io::Error,
    },
    /// A shared region's memory file was asked for a second time: it is handed out once,
    /// to the one peer the region serves (the caller's mistake).
    #[error(
        "region {remote_key:#x} was already exposed to a peer; its memory file is handed out once"
    )]
    AlreadyExposed {
        /// The region's remote key.
        remote_key: u32,
    },
    /// Every remote key a registrar can hand out is held by a live region.
    #[error("all {live} remote keys of this registrar are held by live regions")]
    KeysExhausted {
        /// Live regions holding keys.
        live: usize,
    },
}
