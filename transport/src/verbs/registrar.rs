//! The verbs provider's memory registration: [`VerbsRegistrar`] maps memory through the
//! pool's [`HostRegistrar`], registers it with the device for local access only, and
//! records it by remote key in the providers' shared region table (`crate::registry`),
//! through whose per-endpoint caches posts resolve and check buffers.
//!
//! # Invariants
//!
//! How regions are shared between their owner and the endpoints that post them:
//!
//! - Every region is one `Arc` (the registry's `Registered`) around a [`DeviceMemory`]:
//!   the host mapping and the device's memory region over it. The owner's handle holds
//!   one strong reference; a post holds another only for the length of the call (the
//!   device keeps requests, not references). The table and the endpoints' caches hold
//!   weak references, so the memory is deregistered and unmapped exactly once, when the
//!   last strong reference drops: normally the owner's, at the latest when a post in
//!   progress returns.
//! - The memory region is deregistered before its mapping is unmapped (field order), so
//!   the device never holds a registration of memory the process gave back.
//! - Registration grants local write and nothing else: no remote read, write or atomic
//!   right. A peer told a region's address and remote key (a promotion's answer does)
//!   can reach its bytes only by sending into a receive this side posted, or through an
//!   exposure of a range of them to its connection (`Endpoint::expose`), which registers
//!   that range again, with a key of its own, undone at revocation (`super::window`).
//! - An exposure holds a strong reference to its region (which the registry marks exposed
//!   for good), so the region is neither deregistered nor unmapped while the exposure's
//!   registration of its range lives.
//! - The owner reaches the bytes only through the base pointer of the mapping; the
//!   provider reaches them only by naming them to the device, by address and local key.
//! - When the owner drops the region, the registry marks it dead and removes its table
//!   entry; from then on resolving its key fails. Requests the device still holds for it
//!   complete with a protection error once it is deregistered, as verbs defines, and the
//!   device no longer touches its memory.
//! - A region is recorded under its local key (`RegionKeys::remote_key` is the local key
//!   too: a region registered without remote rights has no remote key, and soft-RoCE
//!   reports 0 for every one). The device's local keys are unique among its registered
//!   regions, and a region leaves the table before it is deregistered, so the table never
//!   maps a key to a region other than the one the device knows by that key.

use std::ptr::NonNull;
use std::sync::Arc;

use sideway::ibverbs::AccessFlags;
use sideway::ibverbs::memory_region::MemoryRegion;
use sideway::ibverbs::memory_region::RegisterMemoryRegionErrorKind;
use tierbuf_pool::{HostRegistrar, MemoryBudget, PoolError, Region, RegionKeys, Registrar};

use super::device::OpenDevice;
use crate::registry::{RegionTable, Resolved};

/// Memory registered with the device, owned through the registry's `Registered`.
pub(crate) struct DeviceMemory {
    /// Declared first: deregistered before the mapping is unmapped.
    registration: Arc<MemoryRegion>,
    /// The mapping, charged to the budget in whole pages, every one of which the
    /// registration may pin.
    host: Box<dyn Region>,
    keys: RegionKeys,
}

impl DeviceMemory {
    /// The local key posts name the region's bytes by.
    pub(crate) fn local_key(&self) -> u32 {
        self.registration.lkey()
    }

    /// The address of the first byte `resolved` names.
    pub(crate) fn address_of(resolved: &Resolved<DeviceMemory>) -> u64 {
        resolved.region.region().keys.remote_addr + resolved.offset as u64
    }
}

impl std::fmt::Debug for DeviceMemory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceMemory")
            .field("keys", &self.keys)
            .field("len", &self.host.len())
            .finish_non_exhaustive()
    }
}

// SAFETY: the bytes are the host region's, which keeps `Region`'s promise; the
// registration only lets the device reach them on this side's own posts (module
// invariants), and it is undone before the mapping goes. A peer reaches them otherwise
// only through an exposure, whose caller answers for the bytes (`Endpoint::expose`) and
// which holds the region until its own registration is undone.
unsafe impl Region for DeviceMemory {
    fn base(&self) -> NonNull<u8> {
        self.host.base()
    }

    fn len(&self) -> usize {
        self.host.len()
    }

    fn keys(&self) -> RegionKeys {
        self.keys
    }
}

/// Registers memory with an RDMA device for the verbs provider: maps it through a
/// [`HostRegistrar`] (page-aligned anonymous memory, charged to the [`MemoryBudget`] in
/// the whole pages that registration pins), registers it for local access only (no peer
/// reaches it but through a receive posted or an exposure), and records it by remote key
/// so that endpoints can check every buffer they are given.
///
/// ```no_run
/// use tierbuf_pool::{MemoryBudget, SlotPool};
/// use tierbuf_transport::Provider;
/// use tierbuf_transport::verbs::{VerbsConfig, VerbsProvider};
/// let provider = VerbsProvider::open(&VerbsConfig::new("rxe0"), MemoryBudget::with_cap(64 << 20))?;
/// let pool = SlotPool::new(&*provider.registrar(), 4096, 16)?;
/// assert_eq!(provider.registrar().budget().in_use(), 16 * 4096);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug)]
pub struct VerbsRegistrar {
    device: Arc<OpenDevice>,
    host: HostRegistrar,
    table: Arc<RegionTable<DeviceMemory>>,
}

impl VerbsRegistrar {
    pub(crate) fn new(device: Arc<OpenDevice>, budget: MemoryBudget) -> VerbsRegistrar {
        VerbsRegistrar {
            device,
            host: HostRegistrar::new(budget),
            table: Arc::new(RegionTable::new()),
        }
    }

    pub(crate) fn table(&self) -> &Arc<RegionTable<DeviceMemory>> {
        &self.table
    }
}

impl Registrar for VerbsRegistrar {
    fn register(&self, len: usize, align: usize) -> Result<Box<dyn Region>, PoolError> {
        let host = self.host.register(len, align)?;
        let base = host.base();
        // SAFETY: `[base, base + len)` is the host region's mapping, which lives as long
        // as the registration (it is dropped after it, field order of `DeviceMemory`).
        let registered = unsafe {
            self.device
                .domain()
                .reg_mr(base.as_ptr() as usize, len, AccessFlags::LocalWrite)
        };
        let registration = registered.map_err(|error| PoolError::Lock {
            len,
            source: match error.0 {
                RegisterMemoryRegionErrorKind::Ibverbs(source) => source,
                other => std::io::Error::other(other),
            },
        })?;
        // No remote right, so no remote key: soft-RoCE reports 0 for every such region.
        // The local key, unique among the device's live regions, names the region in the
        // table and to the peer (a promotion's answer), which can do nothing with it.
        let keys = RegionKeys {
            local_key: Some(registration.lkey()),
            remote_key: registration.lkey(),
            remote_addr: base.as_ptr() as u64,
        };
        Ok(Box::new(self.table.add(DeviceMemory {
            registration,
            host,
            keys,
        })))
    }

    fn budget(&self) -> &MemoryBudget {
        self.host.budget()
    }
}
