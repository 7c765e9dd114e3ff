//! The verbs provider's memory registration: [`VerbsRegistrar`] allocates and registers
//! memory regions through `ibverbs` and records them by remote key in the providers'
//! shared region table (`crate::registry`), through whose per-endpoint caches posts
//! resolve and check buffers.
//!
//! # Invariants
//!
//! How regions are shared between their owner and the endpoints that post them:
//!
//! - Every region is one `Arc` (the registry's `Registered`) around a [`DeviceMemory`]
//!   holding the `ibverbs` `MemoryRegion`. The owner's handle holds one strong reference;
//!   a post holds another only for the length of the call (the device keeps requests, not
//!   references). The table and the endpoints' caches hold weak references, so the memory
//!   is deregistered and freed exactly once, when the last strong reference drops —
//!   normally the owner's, at the latest when a post in progress returns.
//! - `ibverbs` 0.9 posts through `&mut MemoryRegion`, so the memory region sits behind
//!   a mutex and every post takes it for the length of the call: no two `&mut` to one
//!   `MemoryRegion` exist, even when endpoints on two threads post from one region.
//!   The lock is uncontended unless two threads post from one region at the same instant.
//! - The owner reaches the bytes only through the base pointer taken once at
//!   registration; the provider reaches them only by naming them to the device. The one
//!   other reference ever formed is the whole-region `&[u8]` that `ibverbs` 0.9 builds
//!   inside `post_send`/`post_receive` to take the address of the posted range; no byte
//!   is read or written through it.
//! - When the owner drops the region, the registry marks it dead and removes its table
//!   entry; from then on resolving its key fails. Requests the device still holds for it
//!   complete with a protection error once it is deregistered, as verbs defines, and the
//!   device no longer touches its memory.
//! - The device's remote keys are unique among its registered regions, and a region
//!   leaves the table before it is deregistered, so the table never maps a key to a
//!   region other than the one the device knows by that key.
//! - Every `MemoryRegion` holds the `Arc<OpenDevice>` of its protection domain and is
//!   dropped before it (field order), so the domain outlives its regions.

use std::ops::Range;
use std::ptr::NonNull;
use std::sync::{Arc, Mutex, MutexGuard};

use ibverbs::MemoryRegion;
use tierbuf_pool::{MemoryBudget, PoolError, Region, RegionKeys, Registrar, Reservation};

use super::device::{OpenDevice, lock};
use crate::registry::{RegionTable, Resolved};

/// Memory registered with the device, owned through the registry's `Registered`.
pub(crate) struct DeviceMemory {
    /// Declared first: deregistered before the reservation and the device are let go.
    memory: Mutex<MemoryRegion<u8>>,
    /// The region handed out: `len` bytes from `base`, which lies `offset` bytes into
    /// `memory`'s allocation, aligned as asked.
    base: NonNull<u8>,
    offset: usize,
    len: usize,
    keys: RegionKeys,
    _reservation: Reservation,
    _device: Arc<OpenDevice>,
}

// SAFETY: `base` is only an address into the memory region's allocation, which this value
// owns and which stays put while it lives; the `MemoryRegion` is `Send` and sits behind a
// mutex; the bytes are reached only as the module invariants say.
unsafe impl Send for DeviceMemory {}
// SAFETY: `&DeviceMemory` exposes the pointer value, the length, the keys, and the memory
// region only through its mutex.
unsafe impl Sync for DeviceMemory {}

impl DeviceMemory {
    /// Locks the memory region for one post.
    pub(crate) fn memory(&self) -> MutexGuard<'_, MemoryRegion<u8>> {
        lock(&self.memory)
    }

    /// The range of the memory region's allocation that `resolved` names.
    pub(crate) fn range_of(resolved: &Resolved<DeviceMemory>) -> Range<usize> {
        let start = resolved.region.region().offset + resolved.offset;
        start..start + resolved.len as usize
    }
}

impl std::fmt::Debug for DeviceMemory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceMemory")
            .field("keys", &self.keys)
            .field("len", &self.len)
            .finish_non_exhaustive()
    }
}

// SAFETY: `base` points at `len` bytes inside the memory region's allocation
// (`offset + len <= len + align - 1`), which `ibverbs` allocated as a `Vec<u8>` that
// never reallocates and which lives as long as this value. Nothing but the owner, through
// this pointer, and the device, on the owner's posts, reaches those bytes (module
// invariants).
unsafe impl Region for DeviceMemory {
    fn base(&self) -> NonNull<u8> {
        self.base
    }

    fn len(&self) -> usize {
        self.len
    }

    fn keys(&self) -> RegionKeys {
        self.keys
    }
}

/// Registers memory with an RDMA device for the verbs provider: `ibverbs` allocates it
/// (it registers only memory it allocates), the registrar charges it to a
/// [`MemoryBudget`] and records it by remote key so that endpoints can check every
/// buffer they are given.
///
/// A region of `len` bytes aligned to `align` registers `len + align - 1` bytes (the
/// allocation has no alignment of its own) and charges the budget the pages those can
/// pin: their length in whole pages, and one more.
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
    table: Arc<RegionTable<DeviceMemory>>,
}

impl VerbsRegistrar {
    pub(crate) fn new(device: Arc<OpenDevice>, budget: MemoryBudget) -> VerbsRegistrar {
        VerbsRegistrar {
            device,
            budget,
            table: Arc::new(RegionTable::new()),
        }
    }

    pub(crate) fn table(&self) -> &Arc<RegionTable<DeviceMemory>> {
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
        // `ibv_reg_mr` pins every page the allocation touches: at most its length in
        // whole pages and one more, since `ibverbs` places it wherever the heap does.
        let pinned = registered_len
            .div_ceil(tierbuf_pool::page_size())
            .checked_add(1)
            .and_then(|pages| pages.checked_mul(tierbuf_pool::page_size()))
            .ok_or(PoolError::SizeOverflow {
                slot_size: len,
                slot_count: 1,
            })?;
        let reservation = self.budget.reserve(pinned as u64)?;
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
        Ok(Box::new(self.table.add(DeviceMemory {
            memory: Mutex::new(memory),
            base,
            offset,
            len,
            keys,
            _reservation: reservation,
            _device: Arc::clone(&self.device),
        })))
    }

    fn budget(&self) -> &MemoryBudget {
        &self.budget
    }
}
