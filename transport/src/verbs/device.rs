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

use ibverbs::{Context, MemoryRegion, ProtectionDomain, ibv_gid_type};

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
    /// Opens the device named `name`, picks the GID index to route by
    /// ([`routing_gid_index`], `requested_gid_index` if given) and allocates the
    /// protection domain.
    pub(crate) fn open(
        name: &str,
        requested_gid_index: Option<u32>,
    ) -> Result<OpenDevice, VerbsError> {
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
        let gid_entries: Vec<GidTableEntry> = context
            .gid_table()
            .iter()
            .map(|entry| GidTableEntry {
                gid_index: entry.gid_index,
                gid_type: entry.gid_type,
            })
            .collect();
        let gid_index =
            routing_gid_index(&gid_entries, requested_gid_index).map_err(|entries| {
                VerbsError::GidIndexOutOfRange {
                    device: name.to_owned(),
                    gid_index: requested_gid_index.unwrap_or_default(),
                    entries,
                }
            })?;
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

/// `IBV_GID_TYPE_ROCE_V1` of `verbs.h` (`ibverbs` 0.9 re-exports the type, not its values).
const GID_TYPE_ROCE_V1: ibv_gid_type = 1;
/// `IBV_GID_TYPE_ROCE_V2` of `verbs.h`.
const GID_TYPE_ROCE_V2: ibv_gid_type = 2;

/// What routing needs to know of one valid entry of a port's GID table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct GidTableEntry {
    pub(crate) gid_index: u32,
    pub(crate) gid_type: ibv_gid_type,
}

/// The GID index queue pairs route by, given the port's valid GID entries (as `ibverbs`
/// lists them) and the index asked for, if any.
///
/// `ibverbs` 0.9 looks an index up by its position in the list of valid entries and
/// panics if the entry there has another index, so an index is usable only where the two
/// agree; an unusable one is refused with the number of valid entries. With no index
/// asked for, the first usable RoCE v2 entry is taken, else the first RoCE v1 entry
/// (RoCE needs a GID), else none: InfiniBand routes by LID.
pub(crate) fn routing_gid_index(
    entries: &[GidTableEntry],
    requested: Option<u32>,
) -> Result<Option<u32>, usize> {
    let usable = |position: usize, entry: &GidTableEntry| entry.gid_index as usize == position;
    match requested {
        Some(gid_index) => match entries.get(gid_index as usize) {
            Some(entry) if usable(gid_index as usize, entry) => Ok(Some(gid_index)),
            _ => Err(entries.len()),
        },
        None => Ok([GID_TYPE_ROCE_V2, GID_TYPE_ROCE_V1]
            .iter()
            .find_map(|&wanted| {
                entries
                    .iter()
                    .enumerate()
                    .find(|(position, entry)| usable(*position, entry) && entry.gid_type == wanted)
                    .map(|(_, entry)| entry.gid_index)
            })),
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

#[cfg(test)]
mod tests {
    use super::*;

    const GID_TYPE_IB: ibv_gid_type = 0;

    fn entry(gid_index: u32, gid_type: ibv_gid_type) -> GidTableEntry {
        GidTableEntry {
            gid_index,
            gid_type,
        }
    }

    #[test]
    fn infiniband_routes_by_lid_unless_an_index_is_asked_for() {
        let table = [entry(0, GID_TYPE_IB), entry(1, GID_TYPE_IB)];
        assert_eq!(routing_gid_index(&table, None), Ok(None));
        assert_eq!(routing_gid_index(&table, Some(1)), Ok(Some(1)));
    }

    #[test]
    fn roce_prefers_the_first_v2_entry_then_v1() {
        // A soft-RoCE port: v1 and v2 link-local, then v1 and v2 IPv4-mapped.
        let rxe = [
            entry(0, GID_TYPE_ROCE_V1),
            entry(1, GID_TYPE_ROCE_V2),
            entry(2, GID_TYPE_ROCE_V1),
            entry(3, GID_TYPE_ROCE_V2),
        ];
        assert_eq!(routing_gid_index(&rxe, None), Ok(Some(1)));
        assert_eq!(routing_gid_index(&rxe, Some(3)), Ok(Some(3)));
        let v1_only = [entry(0, GID_TYPE_ROCE_V1)];
        assert_eq!(routing_gid_index(&v1_only, None), Ok(Some(0)));
    }

    #[test]
    fn an_index_past_the_table_or_off_its_position_is_refused() {
        // Index 1 is not valid, so the entry at position 1 has index 2.
        let gapped = [entry(0, GID_TYPE_ROCE_V1), entry(2, GID_TYPE_ROCE_V2)];
        assert_eq!(routing_gid_index(&gapped, Some(1)), Err(2));
        assert_eq!(routing_gid_index(&gapped, Some(2)), Err(2));
        assert_eq!(routing_gid_index(&gapped, Some(7)), Err(2));
        assert_eq!(routing_gid_index(&[], Some(0)), Err(0));
        // Automatic choice skips the misplaced v2 entry and takes the v1 one.
        assert_eq!(routing_gid_index(&gapped, None), Ok(Some(0)));
    }
}
