//! Registered memory: the [`Registrar`] that allocates and registers it, the [`Region`]
//! that owns it, and [`HostRegistrar`], the registrar for host memory used by software
//! providers and tests, with [`SharedHostRegion`] for memory another process can map.
//!
//! # Invariants
//!
//! - A region owns its memory: the bytes `[base, base + len)` stay mapped and registered
//!   for as long as the region value lives, and are deregistered and unmapped exactly once,
//!   when it is dropped.
//! - A shared region is private memory until it is first exposed; only then is its memory
//!   file made (see `shared`), so a region no peer sees holds no file descriptor.
//! - A shared region's memory file is sealed against shrinking and growing before anyone
//!   else can see it, so every process that maps its whole length can touch every byte of
//!   that mapping for as long as it keeps it (no `SIGBUS` from a truncated file).
//! - A [`HostRegistrar`]'s remote keys are unique among its live regions.
//! - A region is charged to the registrar's [`MemoryBudget`] for the memory it maps and
//!   locks, not the bytes asked for: whole pages (whole huge pages with
//!   [`HugePages::Explicit`]), for as long as it lives. A budget's cap therefore bounds
//!   what is pinned, however small the regions.

mod shared;

use std::fmt;
use std::ptr::NonNull;
use std::sync::Mutex;

use crate::budget::{MemoryBudget, Reservation};
use crate::error::PoolError;

pub use shared::SharedHostRegion;

/// The keys through which a provider and its peer reach a registered region.
///
/// ```
/// use tierbuf_pool::RegionKeys;
/// let keys = RegionKeys { local_key: None, remote_key: 7, remote_addr: 0x1000 };
/// assert_eq!(keys.remote_key, 7);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RegionKeys {
    /// The key the owner uses in its own work requests, where the provider has one.
    pub local_key: Option<u32>,
    /// The key a peer names to reach the region.
    pub remote_key: u32,
    /// The address a peer names for the region's first byte.
    pub remote_addr: u64,
}

/// Memory that is allocated, registered, and owned: dropping it deregisters and frees it.
///
/// # Safety
///
/// Implementors guarantee that [`Region::base`] points to [`Region::len`] bytes that are
/// valid for reads and writes, never move, and are accessed by nothing but through this
/// region's pointer (and the provider's hardware on its behalf) for as long as the value
/// lives. Callers that hand these bytes to several owners must make the owners' ranges
/// disjoint.
#[allow(clippy::len_without_is_empty)] // a region is never empty
pub unsafe trait Region: Send + Sync + fmt::Debug {
    /// The first byte of the region.
    fn base(&self) -> NonNull<u8>;
    /// The region's length in bytes; never zero.
    fn len(&self) -> usize;
    /// The region's keys.
    fn keys(&self) -> RegionKeys;

    /// Whether another process may reach the region's memory outside the provider's
    /// requests, for as long as it likes: an shm peer that was handed the memory file
    /// keeps its mapping whatever this side does. Such a region must never serve another
    /// peer; a reservoir deregisters it instead of keeping it as a spare. Regions a peer
    /// reaches only through posted requests (host memory, verbs memory regions behind
    /// queue pairs that refuse remote access) say `false`, the default.
    fn exposed_to_peer(&self) -> bool {
        false
    }
}

/// Allocates and registers regions.
///
/// A registrar allocates the memory it registers, so that what a region pins is what it
/// charged to its [`MemoryBudget`].
pub trait Registrar: Send + Sync + fmt::Debug {
    /// Allocates and registers `len` bytes aligned to `align` (a power of two).
    fn register(&self, len: usize, align: usize) -> Result<Box<dyn Region>, PoolError>;

    /// The budget this registrar charges.
    fn budget(&self) -> &MemoryBudget;
}

/// Whether a [`HostRegistrar`] backs regions with huge pages.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum HugePages {
    /// Base pages only.
    #[default]
    Off,
    /// Ask for transparent huge pages (`madvise(MADV_HUGEPAGE)`); the kernel uses them
    /// where it can and base pages elsewhere.
    Transparent,
    /// Explicit huge pages (`MAP_HUGETLB`); registration fails with
    /// [`PoolError::HugePagesUnavailable`] when none are reserved.
    Explicit,
}

/// Registers page-aligned anonymous host memory, optionally pinned with `mlock`.
///
/// Remote keys are unique among the registrar's live regions, and the remote address is
/// the region's virtual address, as with verbs memory regions. Each region is charged the
/// whole pages it maps.
///
/// ```
/// use tierbuf_pool::{HostRegistrar, MemoryBudget, Registrar, page_size};
/// let registrar = HostRegistrar::new(MemoryBudget::with_cap(1 << 20));
/// let region = registrar.register(8192, 4096)?;
/// assert_eq!(region.len(), 8192);
/// assert_eq!(registrar.budget().in_use(), 8192);
/// let small = registrar.register(100, 64)?;
/// assert_eq!(small.len(), 100);
/// assert_eq!(registrar.budget().in_use(), 8192 + page_size() as u64, "a whole page");
/// drop(small);
/// drop(region);
/// assert_eq!(registrar.budget().in_use(), 0);
/// # Ok::<(), tierbuf_pool::PoolError>(())
/// ```
#[derive(Debug)]
pub struct HostRegistrar {
    budget: MemoryBudget,
    lock_memory: bool,
    huge_pages: HugePages,
    keys: std::sync::Arc<KeyTable>,
}

/// Live remote keys of one registrar. A key is `index << 8 | generation`: the index is
/// unique among live regions, the generation makes a reused index read differently.
#[derive(Debug, Default)]
struct KeyTable {
    live: Mutex<(slab::Slab<()>, u8)>,
}

/// Key indices fit in the 24 high bits of a remote key.
const MAX_LIVE_KEYS: usize = 1 << 24;

impl KeyTable {
    fn issue(&self) -> Result<(usize, u32), PoolError> {
        let mut guard = self
            .live
            .lock()
            .unwrap_or_else(|poison| poison.into_inner());
        let (slab, generation) = &mut *guard;
        if slab.len() >= MAX_LIVE_KEYS {
            return Err(PoolError::KeysExhausted { live: slab.len() });
        }
        let index = slab.insert(());
        *generation = generation.wrapping_add(1);
        // `index < MAX_LIVE_KEYS`, so the shift keeps every bit.
        Ok((index, (index as u32) << 8 | u32::from(*generation)))
    }

    fn retire(&self, index: usize) {
        let mut guard = self
            .live
            .lock()
            .unwrap_or_else(|poison| poison.into_inner());
        guard.0.remove(index);
    }
}

impl HostRegistrar {
    /// A registrar of unpinned base pages charging `budget`.
    pub fn new(budget: MemoryBudget) -> HostRegistrar {
        HostRegistrar {
            budget,
            lock_memory: false,
            huge_pages: HugePages::Off,
            keys: Default::default(),
        }
    }

    /// Pins every region with `mlock` (as a NIC registration would); registration fails
    /// with [`PoolError::Lock`] where `RLIMIT_MEMLOCK` refuses.
    pub fn lock_memory(mut self, lock: bool) -> HostRegistrar {
        self.lock_memory = lock;
        self
    }

    /// Backs regions with huge pages as `huge_pages` says.
    pub fn huge_pages(mut self, huge_pages: HugePages) -> HostRegistrar {
        self.huge_pages = huge_pages;
        self
    }
}

impl HostRegistrar {
    /// Registers `len` bytes aligned to `align` that can later be shared with another
    /// process: [`SharedHostRegion::expose_memory_file`] moves them into a sealed memory
    /// file (`memfd`) whose descriptor can be passed (`SCM_RIGHTS`) to a process that maps
    /// the same bytes. Charged, keyed and pinned as [`Registrar::register`] is; until it
    /// is exposed, the region holds no file descriptor.
    ///
    /// ```
    /// use tierbuf_pool::{HostRegistrar, MemoryBudget, Region, Registrar};
    /// let registrar = HostRegistrar::new(MemoryBudget::with_cap(1 << 20));
    /// let region = registrar.register_shared(5000, 4096)?;
    /// assert_eq!((region.len(), region.file_len()), (5000, 8192));
    /// assert_eq!(registrar.budget().in_use(), 8192, "charged whole pages");
    /// # Ok::<(), tierbuf_pool::PoolError>(())
    /// ```
    pub fn register_shared(&self, len: usize, align: usize) -> Result<SharedHostRegion, PoolError> {
        let region = self.register_host(len, align)?;
        Ok(SharedHostRegion::new(
            region,
            self.huge_pages,
            self.lock_memory,
        ))
    }

    fn register_host(&self, len: usize, align: usize) -> Result<HostRegion, PoolError> {
        if len == 0 {
            return Err(PoolError::ZeroLength);
        }
        if !align.is_power_of_two() {
            return Err(PoolError::AlignmentNotPowerOfTwo { align });
        }
        let mapped = len
            .checked_next_multiple_of(mapping_granule(self.huge_pages))
            .ok_or(PoolError::SizeOverflow {
                slot_size: len,
                slot_count: 1,
            })?;
        let reservation = self.budget.reserve(mapped as u64)?;
        let mapping = Mapping::new(len, align, self.huge_pages)?;
        debug_assert_eq!(mapping.rounded, mapped, "charged what is mapped");
        if self.lock_memory {
            // SAFETY: `mapping` owns `[base, base + len)`, mapped and not yet shared.
            unsafe { rustix::mm::mlock(mapping.base.as_ptr().cast(), len) }.map_err(|errno| {
                PoolError::Lock {
                    len,
                    source: errno.into(),
                }
            })?;
        }
        let (key_index, remote_key) = self.keys.issue()?;
        let region = HostRegion {
            keys: RegionKeys {
                local_key: Some(remote_key),
                remote_key,
                remote_addr: mapping.base.as_ptr() as u64,
            },
            mapping,
            len,
            key_index,
            key_table: std::sync::Arc::clone(&self.keys),
            _reservation: reservation,
        };
        Ok(region)
    }
}

impl Registrar for HostRegistrar {
    fn register(&self, len: usize, align: usize) -> Result<Box<dyn Region>, PoolError> {
        let region = self.register_host(len, align)?;
        Ok(Box::new(region))
    }

    fn budget(&self) -> &MemoryBudget {
        &self.budget
    }
}

/// The system's default huge page size (`Hugepagesize` in `/proc/meminfo`), 2 MiB where
/// it cannot be read.
fn huge_page_size() -> usize {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|meminfo| {
            let line = meminfo.lines().find(|l| l.starts_with("Hugepagesize:"))?;
            let kib: usize = line.split_whitespace().nth(1)?.parse().ok()?;
            kib.checked_mul(1024)
        })
        .unwrap_or(2 << 20)
}

/// The unit a region's memory is mapped (and locked, and charged) in.
fn mapping_granule(huge_pages: HugePages) -> usize {
    match huge_pages {
        // `munmap` of a hugetlb mapping needs a length in whole huge pages.
        HugePages::Explicit => huge_page_size(),
        _ => rustix::param::page_size(),
    }
}

/// A mapping of anonymous private memory (part of which a shared region may later
/// replace with a mapping of its memory file), unmapped on drop.
#[derive(Debug)]
struct Mapping {
    /// The aligned first byte handed out.
    base: NonNull<u8>,
    /// What `mmap` returned, and its length, for `munmap`.
    map_start: NonNull<u8>,
    map_len: usize,
    /// Bytes mapped from `base` on: the length rounded up to whole pages.
    rounded: usize,
}

impl Mapping {
    /// Maps at least `len` bytes aligned to `align`.
    fn new(len: usize, align: usize, huge_pages: HugePages) -> Result<Mapping, PoolError> {
        use rustix::mm::{MapFlags, ProtFlags};
        let page = mapping_granule(huge_pages);
        let overflow = || PoolError::SizeOverflow {
            slot_size: len,
            slot_count: 1,
        };
        let rounded = len.checked_next_multiple_of(page).ok_or_else(overflow)?;
        // Over-map by `align - page` when the alignment passes the page size, then skip to
        // the first aligned byte.
        let slack = align.saturating_sub(page);
        let map_len = rounded.checked_add(slack).ok_or_else(overflow)?;
        let mut flags = MapFlags::PRIVATE;
        if huge_pages == HugePages::Explicit {
            flags |= MapFlags::HUGETLB;
        }
        let map_error = |errno: rustix::io::Errno| match huge_pages {
            HugePages::Explicit => PoolError::HugePagesUnavailable {
                len,
                source: errno.into(),
            },
            _ => PoolError::Map {
                len,
                source: errno.into(),
            },
        };
        // SAFETY: a fresh anonymous mapping at an address of the kernel's choosing aliases
        // nothing.
        let start = unsafe {
            rustix::mm::mmap_anonymous(
                std::ptr::null_mut(),
                map_len,
                ProtFlags::READ | ProtFlags::WRITE,
                flags,
            )
        }
        .map_err(map_error)?;
        let map_start = NonNull::new(start.cast::<u8>()).ok_or_else(|| PoolError::Map {
            len,
            source: std::io::Error::other("mmap returned a null mapping"),
        })?;
        let offset = (map_start.as_ptr() as usize).wrapping_neg() & (align - 1);
        // SAFETY: `offset <= slack`, so `base .. base + rounded` lies inside the mapping.
        let base = unsafe { map_start.add(offset) };
        let mapping = Mapping {
            base,
            map_start,
            map_len,
            rounded,
        };
        // SAFETY: `base .. base + rounded` lies inside the mapping just made, which this
        // value owns.
        unsafe { advise_huge_pages(base, rounded, huge_pages) };
        Ok(mapping)
    }
}

/// Asks for transparent huge pages on `[base, base + len)` when `huge_pages` says so.
///
/// # Safety
///
/// The range must be memory the caller owns; the advice changes no contents.
unsafe fn advise_huge_pages(base: NonNull<u8>, len: usize, huge_pages: HugePages) {
    if huge_pages == HugePages::Transparent {
        // SAFETY: the caller owns the range. A kernel without transparent huge pages
        // refuses the advice, and base pages are the documented fallback, so the refusal
        // is not an error.
        let _ = unsafe {
            rustix::mm::madvise(base.as_ptr().cast(), len, rustix::mm::Advice::LinuxHugepage)
        };
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: `map_start..map_start + map_len` is exactly what `mmap` returned, and
        // the region that owned it is being dropped, so no reference into it remains.
        // munmap of a mapping we own cannot fail for reasons we could act on.
        let _ = unsafe { rustix::mm::munmap(self.map_start.as_ptr().cast(), self.map_len) };
    }
}

/// A region registered by a [`HostRegistrar`].
#[derive(Debug)]
struct HostRegion {
    // Field order is drop order: unmap, then free the key, then return the budget.
    mapping: Mapping,
    len: usize,
    keys: RegionKeys,
    key_index: usize,
    key_table: std::sync::Arc<KeyTable>,
    _reservation: Reservation,
}

impl Drop for HostRegion {
    fn drop(&mut self) {
        self.key_table.retire(self.key_index);
    }
}

// SAFETY: the region is an exclusive owner of its mapping; the raw pointers it holds are
// not tied to any thread, and every shared access to the bytes goes through `base()`
// under the contract of `Region`.
unsafe impl Send for HostRegion {}
// SAFETY: `&HostRegion` exposes only the pointer value, the length and the keys.
unsafe impl Sync for HostRegion {}

// SAFETY: `base` points into a live private mapping of at least `len` bytes that this
// value owns and unmaps only on drop; mappings never move.
unsafe impl Region for HostRegion {
    fn base(&self) -> NonNull<u8> {
        self.mapping.base
    }

    fn len(&self) -> usize {
        self.len
    }

    fn keys(&self) -> RegionKeys {
        self.keys
    }
}

// SAFETY: a box owns its region and hands out the region's own base, length and keys,
// so the region's promise carries over unchanged.
unsafe impl<R: Region + ?Sized> Region for Box<R> {
    fn base(&self) -> NonNull<u8> {
        (**self).base()
    }

    fn len(&self) -> usize {
        (**self).len()
    }

    fn keys(&self) -> RegionKeys {
        (**self).keys()
    }

    fn exposed_to_peer(&self) -> bool {
        (**self).exposed_to_peer()
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    fn registrar_with_cap(cap: u64) -> HostRegistrar {
        HostRegistrar::new(MemoryBudget::with_cap(cap))
    }

    #[test]
    fn region_is_aligned_writable_and_charged() {
        let registrar = registrar_with_cap(1 << 30);
        for align in [1, 64, 4096, 1 << 16, 1 << 21] {
            let region = registrar.register(10_000, align).unwrap();
            assert_eq!(region.base().as_ptr() as usize % align, 0, "align {align}");
            assert_eq!(region.keys().remote_addr, region.base().as_ptr() as u64);
            // SAFETY: the region owns these 10 000 bytes and nothing else touches them.
            let bytes = unsafe { std::slice::from_raw_parts_mut(region.base().as_ptr(), 10_000) };
            bytes.fill(0xA5);
            assert!(bytes.iter().all(|&b| b == 0xA5));
            assert_eq!(
                registrar.budget().in_use(),
                12_288,
                "the three pages mapped"
            );
        }
        assert_eq!(registrar.budget().in_use(), 0);
    }

    #[test]
    fn a_cap_bounds_the_pages_mapped_however_small_the_regions() {
        let page = rustix::param::page_size();
        let pages = 16;
        let registrar = registrar_with_cap((pages * page) as u64);
        let mut regions = Vec::new();
        let refusal = loop {
            match registrar.register(128, 64) {
                Ok(region) => regions.push(region),
                Err(error) => break error,
            }
            assert!(
                regions.len() <= pages,
                "more regions than the cap has pages"
            );
        };
        assert!(
            matches!(refusal, PoolError::BudgetExceeded { .. }),
            "{refusal}"
        );
        assert_eq!(regions.len(), pages, "one page a region");
        assert_eq!(registrar.budget().in_use(), (pages * page) as u64);
    }

    #[test]
    fn bad_arguments_are_errors() {
        let registrar = registrar_with_cap(1 << 20);
        assert!(matches!(
            registrar.register(0, 4096),
            Err(PoolError::ZeroLength)
        ));
        assert!(matches!(
            registrar.register(4096, 3000),
            Err(PoolError::AlignmentNotPowerOfTwo { align: 3000 })
        ));
        assert!(matches!(
            registrar.register(2 << 20, 4096),
            Err(PoolError::BudgetExceeded { .. })
        ));
        assert!(matches!(
            registrar_with_cap(u64::MAX).register(usize::MAX - 10, 4096),
            Err(PoolError::SizeOverflow { .. })
        ));
        assert_eq!(registrar.budget().in_use(), 0);
    }

    #[test]
    fn keys_are_unique_among_live_regions() {
        let registrar = registrar_with_cap(1 << 30);
        let mut live: Vec<Box<dyn Region>> = Vec::new();
        let mut seen = std::collections::HashSet::new();
        for round in 0..600 {
            live.push(registrar.register(4096, 4096).unwrap());
            if round % 3 == 0 {
                live.remove(round % live.len());
            }
            let keys: std::collections::HashSet<u32> =
                live.iter().map(|r| r.keys().remote_key).collect();
            assert_eq!(keys.len(), live.len(), "duplicate key among live regions");
            seen.extend(keys);
        }
        // Reused indices come back with another generation, so keys differ over time too.
        assert!(seen.len() > live.len());
    }

    #[test]
    fn locked_memory_is_pinned_or_refused_clearly() {
        let registrar = registrar_with_cap(1 << 30).lock_memory(true);
        match registrar.register(1 << 20, 4096) {
            Ok(region) => assert_eq!(region.len(), 1 << 20),
            Err(PoolError::Lock { len, .. }) => assert_eq!(len, 1 << 20),
            Err(other) => panic!("unexpected error {other}"),
        }
        assert_eq!(registrar.budget().in_use(), 0);
    }

    #[test]
    fn huge_pages_are_used_or_refused_clearly() {
        let transparent = registrar_with_cap(1 << 30).huge_pages(HugePages::Transparent);
        let region = transparent.register(4 << 20, 2 << 20).unwrap();
        assert_eq!(region.base().as_ptr() as usize % (2 << 20), 0);
        drop(region);
        let explicit = registrar_with_cap(1 << 30).huge_pages(HugePages::Explicit);
        match explicit.register(2 << 20, 2 << 20) {
            Ok(region) => assert_eq!(region.len(), 2 << 20),
            Err(PoolError::HugePagesUnavailable { len, .. }) => assert_eq!(len, 2 << 20),
            Err(other) => panic!("unexpected error {other}"),
        }
        assert_eq!(explicit.budget().in_use(), 0);
    }
}
