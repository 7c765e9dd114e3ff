//! [`SharedHostRegion`]: host memory that can be handed to one other process.
//!
//! # Invariants
//!
//! - Until it is exposed, a shared region is the private anonymous mapping every host
//!   region is, and holds no file descriptor: a process can keep as many unexposed regions
//!   as its memory allows, whatever its limit of open files.
//! - It is exposed at most once. Exposing makes a sealed memory file of the region's whole
//!   pages, copies into it every page the region had in memory (`mincore`), and maps it
//!   over the region's own addresses (`MAP_FIXED`), so base, length, keys and contents stay
//!   what they were. The file is handed to the caller, who passes it on and closes it; this
//!   side keeps only the mapping.
//! - If mapping the file over the region fails, fresh private memory is mapped there
//!   instead before the error is returned, so `[base, base + len)` stays mapped for the
//!   region's life whatever happens (the region's invariants, in the parent module).

use std::os::fd::{AsFd, OwnedFd};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, Ordering};

use super::{HostRegion, HugePages, Region, RegionKeys, advise_huge_pages};
use crate::error::PoolError;

/// A region registered by [`HostRegistrar::register_shared`](super::HostRegistrar::register_shared):
/// host memory that one other process can be given
/// ([`SharedHostRegion::expose_memory_file`]). Once exposed, another process that maps
/// the file's first [`SharedHostRegion::file_len`] bytes sees the same bytes; dropping
/// the region unmaps them here, frees its key and returns its budget, while another
/// process's mapping keeps the file's pages alive until that process unmaps them.
///
/// Once exposed, the region says so ([`Region::exposed_to_peer`]) for the rest of its
/// life, so that it never serves a second peer.
#[derive(Debug)]
pub struct SharedHostRegion {
    region: HostRegion,
    huge_pages: HugePages,
    locked: bool,
    exposed: AtomicBool,
}

impl SharedHostRegion {
    pub(super) fn new(region: HostRegion, huge_pages: HugePages, locked: bool) -> Self {
        SharedHostRegion {
            region,
            huge_pages,
            locked,
            exposed: AtomicBool::new(false),
        }
    }

    /// Moves the region's bytes into a sealed memory file mapped at the same addresses,
    /// and returns the file, for passing to one other process; the caller closes its copy
    /// once passed. From this call on the region is [exposed to a
    /// peer](Region::exposed_to_peer): whoever receives the file can map the region's
    /// bytes for as long as it likes.
    ///
    /// ```
    /// use tierbuf_pool::{HostRegistrar, MemoryBudget, PoolError, Region};
    /// let registrar = HostRegistrar::new(MemoryBudget::with_cap(1 << 20));
    /// let region = registrar.register_shared(4096, 4096)?;
    /// assert!(!region.exposed_to_peer());
    /// // SAFETY: nothing else touches the region's bytes.
    /// let file = unsafe { region.expose_memory_file() }?;
    /// assert!(region.exposed_to_peer());
    /// assert!(matches!(
    ///     unsafe { region.expose_memory_file() },
    ///     Err(PoolError::AlreadyExposed { .. })
    /// ));
    /// drop(file);
    /// # Ok::<(), PoolError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`PoolError::AlreadyExposed`] on a second call; [`PoolError::Map`] (or
    /// [`PoolError::HugePagesUnavailable`]) when the file cannot be made or mapped, and
    /// [`PoolError::Lock`] when a pinned region cannot be pinned again. After an error the
    /// region still counts as exposed, and its bytes are mapped but may have been lost.
    ///
    /// # Safety
    ///
    /// Nothing may write the region's bytes while this call runs: they are copied into the
    /// file, and a write the copy missed would be lost. Reading them meanwhile is fine.
    pub unsafe fn expose_memory_file(&self) -> Result<OwnedFd, PoolError> {
        if self.exposed.swap(true, Ordering::AcqRel) {
            return Err(PoolError::AlreadyExposed {
                remote_key: self.region.keys.remote_key,
            });
        }
        let base = self.region.mapping.base;
        let len = self.file_len();
        let map_error = |errno: rustix::io::Errno| match self.huge_pages {
            HugePages::Explicit => PoolError::HugePagesUnavailable {
                len,
                source: errno.into(),
            },
            _ => PoolError::Map {
                len,
                source: errno.into(),
            },
        };
        let file = memory_file(len, self.huge_pages).map_err(map_error)?;
        // SAFETY: the region owns `[base, base + len)`, and the caller promises that
        // nothing writes it during this call.
        unsafe { copy_resident_pages(base, len, &file) }.map_err(map_error)?;
        // SAFETY: `[base, base + len)` is the region's own mapping, whose bytes the file
        // now holds; `FIXED` replaces only those pages.
        let mapped = unsafe {
            rustix::mm::mmap(
                base.as_ptr().cast(),
                len,
                rustix::mm::ProtFlags::READ | rustix::mm::ProtFlags::WRITE,
                rustix::mm::MapFlags::SHARED | rustix::mm::MapFlags::FIXED,
                &file,
                0,
            )
        };
        if let Err(errno) = mapped {
            // SAFETY: as above; private memory keeps the range mapped (module invariants).
            // If even that fails, nothing more can be done than to report the first error.
            let _ = unsafe {
                rustix::mm::mmap_anonymous(
                    base.as_ptr().cast(),
                    len,
                    rustix::mm::ProtFlags::READ | rustix::mm::ProtFlags::WRITE,
                    rustix::mm::MapFlags::PRIVATE | rustix::mm::MapFlags::FIXED,
                )
            };
            return Err(map_error(errno));
        }
        // SAFETY: the region owns the range it just mapped again.
        unsafe { advise_huge_pages(base, len, self.huge_pages) };
        if self.locked {
            // SAFETY: the region owns `[base, base + len)`; locking changes no contents.
            unsafe { rustix::mm::mlock(base.as_ptr().cast(), self.region.len) }.map_err(
                |errno| PoolError::Lock {
                    len: self.region.len,
                    source: errno.into(),
                },
            )?;
        }
        Ok(file)
    }

    /// The memory file's length: the region's length rounded up to whole pages. Its
    /// first byte is the region's first byte.
    pub fn file_len(&self) -> usize {
        self.region.mapping.rounded
    }
}

/// A memory file of `len` bytes, sealed so that its length never changes again.
fn memory_file(len: usize, huge_pages: HugePages) -> rustix::io::Result<OwnedFd> {
    use rustix::fs::{MemfdFlags, SealFlags};
    let mut flags = MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING;
    if huge_pages == HugePages::Explicit {
        flags |= MemfdFlags::HUGETLB;
    }
    let memfd = rustix::fs::memfd_create("tierbuf-region", flags)?;
    rustix::fs::ftruncate(&memfd, len as u64)?;
    rustix::fs::fcntl_add_seals(
        &memfd,
        SealFlags::SHRINK | SealFlags::GROW | SealFlags::SEAL,
    )?;
    Ok(memfd)
}

/// Copies every page of `[base, base + len)` that is in memory into the same offset of
/// `file`; a page never touched reads as zeros, as the file's does, and is skipped, so
/// that exposing a fresh region allocates nothing.
///
/// # Safety
///
/// `[base, base + len)` must be mapped, page-aligned and not written during the call;
/// `file` must be at least `len` bytes long.
unsafe fn copy_resident_pages(
    base: NonNull<u8>,
    len: usize,
    file: impl AsFd,
) -> rustix::io::Result<()> {
    let page = rustix::param::page_size();
    let mut resident = vec![0u8; len.div_ceil(page)];
    // SAFETY: the range is mapped and page-aligned, and `resident` has a byte per page.
    if unsafe { libc::mincore(base.as_ptr().cast(), len, resident.as_mut_ptr()) } != 0 {
        return Err(rustix::io::Errno::from_raw_os_error(
            std::io::Error::last_os_error()
                .raw_os_error()
                .unwrap_or(libc::EINVAL),
        ));
    }
    if resident.iter().all(|&state| state & 1 == 0) {
        return Ok(());
    }
    // SAFETY: a fresh shared mapping of the file at an address of the kernel's choosing
    // aliases nothing of ours; it is unmapped below.
    let staging = unsafe {
        rustix::mm::mmap(
            std::ptr::null_mut(),
            len,
            rustix::mm::ProtFlags::READ | rustix::mm::ProtFlags::WRITE,
            rustix::mm::MapFlags::SHARED,
            file,
            0,
        )
    }?;
    let mut index = 0;
    while index < resident.len() {
        if resident[index] & 1 == 0 {
            index += 1;
            continue;
        }
        let run = resident[index..]
            .iter()
            .take_while(|&&state| state & 1 != 0)
            .count();
        let (offset, bytes) = (index * page, (run * page).min(len - index * page));
        // SAFETY: both ranges lie within `len` bytes of their mappings, and the two
        // mappings are distinct.
        unsafe {
            std::ptr::copy_nonoverlapping(
                base.as_ptr().add(offset),
                staging.cast::<u8>().add(offset),
                bytes,
            );
        }
        index += run;
    }
    // SAFETY: exactly what `mmap` returned above; nothing refers into it.
    unsafe { rustix::mm::munmap(staging, len) }
}

// SAFETY: the inner host region keeps the promise for `[base, base + len)`: exposure maps
// the same bytes at the same addresses. Another process can reach these bytes only
// through the memory file exposure hands out, and whoever passes it on takes on the
// contract for what that process does with them.
unsafe impl Region for SharedHostRegion {
    fn base(&self) -> NonNull<u8> {
        self.region.base()
    }

    fn len(&self) -> usize {
        self.region.len()
    }

    fn keys(&self) -> RegionKeys {
        self.region.keys()
    }

    fn exposed_to_peer(&self) -> bool {
        self.exposed.load(Ordering::Acquire)
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::super::{HostRegistrar, Registrar};
    use super::*;
    use crate::MemoryBudget;

    fn registrar() -> HostRegistrar {
        HostRegistrar::new(MemoryBudget::with_cap(1 << 30))
    }

    #[test]
    fn exposure_keeps_the_bytes_and_shares_them_through_a_sealed_file() {
        let registrar = registrar();
        for align in [64, 4096, 1 << 21] {
            let region = registrar.register_shared(10_000, align).unwrap();
            let (base, keys) = (region.base(), region.keys());
            assert_eq!(base.as_ptr() as usize % align, 0, "align {align}");
            assert_eq!(region.file_len(), 12_288);
            // Touch the first and last pages only; the middle one stays untouched.
            // SAFETY: the region owns these bytes; nothing else writes them.
            unsafe {
                base.as_ptr().write(0x11);
                base.as_ptr().add(9_999).write(0x22);
            }
            // SAFETY: nothing else touches the region's bytes.
            let file = unsafe { region.expose_memory_file() }.unwrap();
            assert_eq!(
                (region.base(), region.keys()),
                (base, keys),
                "same addresses"
            );
            // SAFETY: the region owns these bytes.
            unsafe {
                assert_eq!(base.as_ptr().read(), 0x11, "the first page kept");
                assert_eq!(base.as_ptr().add(5_000).read(), 0, "the middle page zero");
                assert_eq!(base.as_ptr().add(9_999).read(), 0x22, "the last page kept");
            }
            let stat = rustix::fs::fstat(&file).unwrap();
            assert_eq!(stat.st_size, 12_288);
            assert!(rustix::fs::ftruncate(&file, 4096).is_err(), "sealed");
            // A second mapping of the file sees what the region writes, both ways.
            // SAFETY: a fresh shared mapping of the whole file, unmapped below.
            let other = unsafe {
                rustix::mm::mmap(
                    std::ptr::null_mut(),
                    12_288,
                    rustix::mm::ProtFlags::READ | rustix::mm::ProtFlags::WRITE,
                    rustix::mm::MapFlags::SHARED,
                    &file,
                    0,
                )
            }
            .unwrap()
            .cast::<u8>();
            // SAFETY: the region owns its bytes; `other` maps 12 288 writable bytes.
            unsafe {
                assert_eq!(other.add(9_999).read(), 0x22);
                base.as_ptr().add(100).write(0x5A);
                assert_eq!(other.add(100).read(), 0x5A);
                other.add(200).write(0xA5);
                assert_eq!(base.as_ptr().add(200).read(), 0xA5);
                rustix::mm::munmap(other.cast(), 12_288).unwrap();
            }
            assert_eq!(
                registrar.budget().in_use(),
                12_288,
                "the three pages mapped"
            );
        }
        assert_eq!(registrar.budget().in_use(), 0);
    }

    #[test]
    fn a_pinned_region_is_pinned_again_once_exposed() {
        let registrar = registrar().lock_memory(true);
        let region = match registrar.register_shared(8192, 4096) {
            Ok(region) => region,
            // Where `RLIMIT_MEMLOCK` allows nothing, registering already says so.
            Err(PoolError::Lock { .. }) => return,
            Err(other) => panic!("unexpected error {other}"),
        };
        // SAFETY: nothing else touches the region's bytes.
        let file = unsafe { region.expose_memory_file() }.unwrap();
        // The mapping that holds the region's first byte, as `/proc/self/smaps` shows it.
        let base = region.base().as_ptr() as usize;
        let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
        let holds_base = |line: &&str| {
            let range = line.split_whitespace().next().unwrap_or("");
            let Some((start, end)) = range.split_once('-') else {
                return false;
            };
            let parse = |hex| usize::from_str_radix(hex, 16).ok();
            matches!((parse(start), parse(end)), (Some(start), Some(end)) if start <= base && base < end)
        };
        let entry = smaps
            .lines()
            .skip_while(|line| !holds_base(line))
            .find(|line| line.starts_with("Locked:"))
            .expect("the region's mapping in smaps");
        let locked_kib: usize = entry.split_whitespace().nth(1).unwrap().parse().unwrap();
        assert!(locked_kib >= 8, "both pages locked: {entry}");
        drop(file);
    }
}
