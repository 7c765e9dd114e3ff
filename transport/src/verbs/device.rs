//! An opened RDMA device: its context and the one protection domain every region and
//! queue pair of a provider belongs to.
//!
//! # Invariants
//!
//! - `ibverbs` 0.9 ties a protection domain to its context by a borrow, and destroys
//!   them in `Drop` impls that panic if the device refuses (`EBUSY` while anything
//!   created from them still exists). The context and its protection domain therefore
//!   live together in one [`ContextAndDomain`] cell behind an `Arc`, and everything
//!   created from them (memory regions, completion queues, queue pairs) holds a clone of
//!   that `Arc` and is dropped before it: memory regions and queue pairs are always
//!   destroyed before the domain, and the domain before the context.
//! - The [`OpenDevice::empty_message`] region is a field declared before the cell, so it
//!   is deregistered before the domain is deallocated.

use std::io;
use std::sync::{Mutex, MutexGuard};

use ibverbs::{Context, MemoryRegion, ProtectionDomain};

use super::error::{VerbsError, open_error, select_device};

self_cell::self_cell!(
    /// A device context and the protection domain allocated from it.
    pub(crate) struct ContextAndDomain {
        owner: Context,
        #[covariant]
        dependent: ProtectionDomain,
    }
);

/// An opened device, shared by a provider, its registrar, its regions and its endpoints.
pub(crate) struct OpenDevice {
    /// A one-byte region whose empty range is the source of zero-length sends: a verbs
    /// send names a region even when it carries nothing.
    empty_message: Mutex<MemoryRegion<u8>>,
    name: String,
    gid_index: Option<u32>,
    domain: ContextAndDomain,
}

impl OpenDevice {
    /// Opens the device named `name` and allocates its protection domain; checks
    /// `gid_index` against the device's GID table.
    pub(crate) fn open(name: &str, gid_index: Option<u32>) -> Result<OpenDevice, VerbsError> {
        let list =
            ibverbs::devices().map_err(|source| VerbsError::DevicesUnavailable { source })?;
        let names: Vec<String> = list
            .iter()
            .map(|device| {
                device
                    .name()
                    .map(|name| name.to_string_lossy().into_owned())
                    .unwrap_or_default()
            })
            .collect();
        let index = select_device(&names, name)?;
        let device = list.get(index).ok_or_else(|| VerbsError::DeviceNotFound {
            name: name.to_owned(),
            found: names.clone(),
        })?;
        let context = device.open().map_err(|source| open_error(name, source))?;
        if let Some(gid_index) = gid_index {
            let entries = context.gid_table().len();
            if gid_index as usize >= entries {
                return Err(VerbsError::GidIndexOutOfRange {
                    device: name.to_owned(),
                    gid_index,
                    entries,
                });
            }
        }
        let domain =
            ContextAndDomain::try_new(context, |context| context.alloc_pd()).map_err(|source| {
                device_error(
                    name,
                    "allocating the protection domain (ibv_alloc_pd)",
                    source,
                )
            })?;
        let empty_message = domain
            .borrow_dependent()
            .allocate::<u8>(1)
            .map_err(|source| {
                device_error(
                    name,
                    "registering the empty-message region (ibv_reg_mr)",
                    source,
                )
            })?;
        Ok(OpenDevice {
            empty_message: Mutex::new(empty_message),
            name: name.to_owned(),
            gid_index,
            domain,
        })
    }

    /// The device's name.
    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    /// The GID index queue pairs route by, if any (RoCE).
    pub(crate) fn gid_index(&self) -> Option<u32> {
        self.gid_index
    }

    /// The device context.
    pub(crate) fn context(&self) -> &Context {
        self.domain.borrow_owner()
    }

    /// The protection domain of every region and queue pair of this device's provider.
    pub(crate) fn domain(&self) -> &ProtectionDomain<'_> {
        self.domain.borrow_dependent()
    }

    /// The region zero-length sends name.
    pub(crate) fn empty_message(&self) -> MutexGuard<'_, MemoryRegion<u8>> {
        lock(&self.empty_message)
    }

    /// A device error of `operation`.
    pub(crate) fn error(&self, operation: &'static str, source: io::Error) -> VerbsError {
        device_error(&self.name, operation, source)
    }
}

impl std::fmt::Debug for OpenDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OpenDevice")
            .field("name", &self.name)
            .field("gid_index", &self.gid_index)
            .finish_non_exhaustive()
    }
}

fn device_error(device: &str, operation: &'static str, source: io::Error) -> VerbsError {
    VerbsError::Device {
        device: device.to_owned(),
        operation,
        source,
    }
}

/// Locks a region for posting. Every critical section is one post call, which leaves the
/// region as it found it even if it panics.
pub(crate) fn lock(region: &Mutex<MemoryRegion<u8>>) -> MutexGuard<'_, MemoryRegion<u8>> {
    region.lock().unwrap_or_else(|poison| poison.into_inner())
}
