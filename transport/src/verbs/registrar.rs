//! The verbs provider's memory registration: [`VerbsRegistrar`] allocates and registers
//! memory regions through `ibverbs` and records them by remote key, and each endpoint's
//! [`RegionCache`] resolves the buffers it is given to those regions.
//!
//! # Invariants
//!
//! How regions are shared between their owner and the endpoints that post them:
//!
//! - Every region is one `Arc<Registered>` holding the `ibverbs` `MemoryRegion`. The
//!   owner's [`VerbsRegion`] holds one strong reference; a post holds another only for
//!   the length of the call. The provider's table and the endpoints' caches hold weak
//!   references, so the memory is deregistered and freed exactly once, when the last
//!   strong reference drops — normally the owner's, at the latest when a post in
//!   progress returns.
//! - `ibverbs` 0.9 posts through `&mut MemoryRegion`, so the memory region sits behind
//!   a mutex and every post takes it for the length of the call: no two `&mut` to one
//!   `MemoryRegion` exist, even when endpoints on two threads post from one region.
//!   The lock is uncontended unless two threads post from one region at the same instant.
//! - The owner reaches the bytes only through the base pointer taken once at
//!   registration; the provider reaches them only by naming them to the device. The one
//!   other reference ever formed is the whole-region `&[u8]` that `ibverbs` 0.9 builds
//!   inside `post_send`/`post_receive` to take the address of the posted range; no byte
//!   is read or written through it.
//! - `Registered::live` is cleared, and the table entry removed, when the owner drops the
//!   region; from then on resolving its key fails. Requests the device still holds for
//!   it complete with a protection error once it is deregistered, as verbs defines, and
//!   the device no longer touches its memory.
//! - The device's remote keys are unique among its registered regions, and a region
//!   removes its table entry before it is deregistered, so the table never maps a key to
//!   a region other than the one the device knows by that key.
//! - Every `MemoryRegion` holds the `Arc<OpenDevice>` of its protection domain and is
//!   dropped before it (field order), so the domain outlives its regions.

use std::collections::HashMap;
use std::ops::Range;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};

use ibverbs::MemoryRegion;
use tierbuf_pool::{MemoryBudget, PoolError, Region, RegionKeys, Registrar, Reservation};

use super::device::{OpenDevice, lock};
use crate::error::PostError;
use crate::provider::BufferRef;

/// A region registered with the device, shared by its owner and posts in progress.
pub(crate) struct Registered {
    /// Declared first: deregistered before the reservation and the device are let go.
    memory: Mutex<MemoryRegion<u8>>,
    /// The region handed out: `len` bytes from `base`, which lies `offset` bytes into
    /// `memory`'s allocation, aligned as asked.
    base: RegionBase,
    offset: usize,
    len: usize,
    keys: RegionKeys,
    live: AtomicBool,
    _reservation: Reservation,
    _device: Arc<OpenDevice>,
}

/// The first byte of a region's aligned part.
#[derive(Debug, Clone, Copy)]
struct RegionBase(NonNull<u8>);

// SAFETY: the pointer is only an address into the memory region's allocation, which the
// same `Registered` owns and which stays put while it lives; reading the pointer value
// from any thread is harmless, and the bytes are reached only as the module invariants say.
unsafe impl Send for RegionBase {}
// SAFETY: as for `Send`: `&RegionBase` exposes only the pointer value.
unsafe impl Sync for RegionBase {}

impl Registered {
    fn is_live(&self) -> bool {
        self.live.load(Ordering::Acquire)
    }

    /// Locks the memory region for one post.
    pub(crate) fn memory(&self) -> MutexGuard<'_, MemoryRegion<u8>> {
        lock(&self.memory)
    }
}

impl std::fmt::Debug for Registered {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registered")
            .field("keys", &self.keys)
            .field("len", &self.len)
            .field("live", &self.is_live())
            .finish_non_exhaustive()
    }
}

/// Live regions of one provider by remote key.
#[derive(Debug, Default)]
pub(crate) struct RegionTable {
    by_key: Mutex<HashMap<u32, Weak<Registered>>>,
}

impl RegionTable {
    fn lock(&self) -> MutexGuard<'_, HashMap<u32, Weak<Registered>>> {
        // Every critical section leaves the map consistent before anything can panic.
        self.by_key
            .lock()
            .unwrap_or_else(|poison| poison.into_inner())
    }

    fn find(&self, remote_key: u32) -> Option<Arc<Registered>> {
        self.lock()
            .get(&remote_key)
            .and_then(Weak::upgrade)
            .filter(|registered| registered.is_live())
    }
}

/// Registers memory with an RDMA device for the verbs provider: `ibverbs` allocates it
/// (it registers only memory it allocates), the registrar charges it to a
/// [`MemoryBudget`] and records it by remote key so that endpoints can check every
/// buffer they are given.
///
/// A region of `len` bytes aligned to `align` registers `len + align - 1` bytes (the
/// allocation has no alignment of its own) and charges those to the budget.
///
/// ```no_run
/// use tierbuf_pool::{MemoryBudget, SlotPool};
/// use tierbuf_transport::Provider;
/// use tierbuf_transport::verbs::{VerbsConfig, VerbsProvider};
/// let provider = VerbsProvider::open(&VerbsConfig::new("rxe0"), MemoryBudget::with_cap(64 << 20))?;
/// let pool = SlotPool::new(&*provider.registrar(), 4096, 16)?;
/// assert!(provider.registrar().budget().in_use() >= 16 * 4096);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug)]
pub struct VerbsRegistrar {
    device: Arc<OpenDevice>,
    budget: MemoryBudget,
    table: Arc<RegionTable>,
}

impl VerbsRegistrar {
    pub(crate) fn new(device: Arc<OpenDevice>, budget: MemoryBudget) -> VerbsRegistrar {
        VerbsRegistrar {
            device,
            budget,
            table: Arc::default(),
        }
    }

    pub(crate) fn table(&self) -> &Arc<RegionTable> {
        &self.table
    }
}

impl Registrar for VerbsRegistrar {
    fn register(&self, len: usize, align: usize) -> Result<Box<dyn Region>, PoolError> {
        if len == 0 {
            return Err(PoolError::ZeroLength);
        }
        if !align.is_power_of_two() {
            return Err(PoolError::AlignmentNotPowerOfTwo { align });
        }
        let registered_len = len.checked_add(align - 1).ok_or(PoolError::SizeOverflow {
            slot_size: len,
            slot_count: 1,
        })?;
        let reservation = self.budget.reserve(registered_len as u64)?;
        let mut memory = self
            .device
            .domain()
            .allocate::<u8>(registered_len)
            .map_err(|source| PoolError::Lock {
                len: registered_len,
                source,
            })?;
        // `align_offset` of a byte pointer to a power of two is below `align`, so the
        // aligned part lies inside the allocation of `len + align - 1` bytes.
        let offset = memory.as_ptr().align_offset(align);
        let base = NonNull::from(&mut memory[offset..]).cast::<u8>();
        let keys = RegionKeys {
            local_key: None,
            remote_key: memory.rkey().key,
            remote_addr: base.as_ptr() as u64,
        };
        let registered = Arc::new(Registered {
            memory: Mutex::new(memory),
            base: RegionBase(base),
            offset,
            len,
            keys,
            live: AtomicBool::new(true),
            _reservation: reservation,
            _device: Arc::clone(&self.device),
        });
        self.table
            .lock()
            .insert(keys.remote_key, Arc::downgrade(&registered));
        Ok(Box::new(VerbsRegion {
            registered,
            table: Arc::clone(&self.table),
        }))
    }

    fn budget(&self) -> &MemoryBudget {
        &self.budget
    }
}

/// A region registered with the device; dropping it deregisters it.
#[derive(Debug)]
struct VerbsRegion {
    registered: Arc<Registered>,
    table: Arc<RegionTable>,
}

impl Drop for VerbsRegion {
    fn drop(&mut self) {
        self.registered.live.store(false, Ordering::Release);
        let remote_key = self.registered.keys.remote_key;
        let mut table = self.table.lock();
        // Remove only this region's entry: the device does not reissue the key while this
        // region is registered, and it is until `registered` drops after this.
        if table
            .get(&remote_key)
            .is_some_and(|weak| std::ptr::eq(weak.as_ptr(), Arc::as_ptr(&self.registered)))
        {
            table.remove(&remote_key);
        }
    }
}

// SAFETY: `base` points at `len` bytes inside the memory region's allocation
// (`offset + len <= len + align - 1`), which `ibverbs` allocated as a `Vec<u8>` that
// never reallocates and which lives until `registered` drops, so no earlier than this
// value. Nothing but the owner, through this pointer, and the device, on the owner's
// posts, reaches those bytes (module invariants).
unsafe impl Region for VerbsRegion {
    fn base(&self) -> NonNull<u8> {
        self.registered.base.0
    }

    fn len(&self) -> usize {
        self.registered.len
    }

    fn keys(&self) -> RegionKeys {
        self.registered.keys
    }
}

/// A checked buffer: its region, held for the post, and its byte range in the region's
/// memory region.
#[derive(Debug)]
pub(crate) struct Resolved {
    pub(crate) region: Arc<Registered>,
    pub(crate) range: Range<usize>,
}

/// An endpoint's memo of the regions it has met, so that resolving a known key takes no
/// table lock.
#[derive(Debug)]
pub(crate) struct RegionCache {
    table: Arc<RegionTable>,
    known: HashMap<u32, Weak<Registered>>,
}

impl RegionCache {
    pub(crate) fn new(table: Arc<RegionTable>) -> RegionCache {
        RegionCache {
            table,
            known: HashMap::new(),
        }
    }

    /// Finds the live region `buffer` names and checks that the buffer lies inside it.
    pub(crate) fn resolve(&mut self, buffer: BufferRef) -> Result<Resolved, PostError> {
        let region = match self
            .known
            .get(&buffer.remote_key)
            .and_then(Weak::upgrade)
            .filter(|registered| registered.is_live())
        {
            Some(region) => region,
            None => self.resolve_slow(buffer.remote_key)?,
        };
        let region_addr = region.keys.remote_addr;
        let region_len = region.len;
        let out_of_bounds = || PostError::OutOfBounds {
            remote_key: buffer.remote_key,
            addr: buffer.addr,
            len: buffer.len,
            region_addr,
            region_len,
        };
        let start = buffer
            .addr
            .checked_sub(region_addr)
            .and_then(|start| usize::try_from(start).ok())
            .ok_or_else(out_of_bounds)?;
        let end = start
            .checked_add(buffer.len as usize)
            .filter(|&end| end <= region_len)
            .ok_or_else(out_of_bounds)?;
        let range = region.offset + start..region.offset + end;
        Ok(Resolved { region, range })
    }

    /// Looks `remote_key` up in the provider's table and remembers it, forgetting regions
    /// that have been deregistered meanwhile.
    #[cold]
    fn resolve_slow(&mut self, remote_key: u32) -> Result<Arc<Registered>, PostError> {
        self.known
            .retain(|_, weak| weak.upgrade().is_some_and(|region| region.is_live()));
        let region = self
            .table
            .find(remote_key)
            .ok_or(PostError::UnknownKey { remote_key })?;
        self.known.insert(remote_key, Arc::downgrade(&region));
        Ok(region)
    }
}
