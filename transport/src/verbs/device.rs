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

use std::ffi::CStr;
use std::fmt;
use std::io;
use std::net::Ipv6Addr;
use std::sync::{Mutex, MutexGuard};

use ibverbs::{Context, Gid, MemoryRegion, ProtectionDomain, ibv_gid_type};

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
    path: PortPath,
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
                ipv4_mapped: gid_address(&entry.gid).to_ipv4_mapped().is_some(),
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
        let path = PortPath {
            device: name.to_owned(),
            port: PORT,
            gid: gid_index.and_then(|index| {
                let entry = context.gid_table().get(index as usize)?;
                Some(RoutingGid {
                    index,
                    value: gid_address(&entry.gid),
                    kind: GidKind::of(entry.gid_type),
                })
            }),
            // Only what the path says: a port whose MTU cannot be read still carries
            // traffic (the queue pairs take the MTU themselves).
            active_mtu: active_mtu(name).unwrap_or_else(|error| {
                tracing::warn!(device = name, %error, "reading the port's active MTU failed");
                None
            }),
        };
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
            path,
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

    /// The device, port, GID and MTU the queue pairs go out by.
    pub(crate) fn path(&self) -> &PortPath {
        &self.path
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

/// The port every queue pair uses: `ibverbs` 0.9 opens port 1 and no other.
const PORT: u8 = 1;

/// Where a provider's queue pairs go out: the device and port, the GID entry they route
/// by (RoCE; none on InfiniBand, which routes by LID) and the port's active MTU, which
/// they take as their path MTU. Its `Display` is one line for reports and logs.
///
/// ```no_run
/// use tierbuf_pool::MemoryBudget;
/// use tierbuf_transport::verbs::{VerbsConfig, VerbsProvider};
/// let provider = VerbsProvider::open(&VerbsConfig::new("rxe0"), MemoryBudget::with_cap(1 << 20))?;
/// // device rxe0 port 1, GID index 1 ::ffff:10.0.2.15 (RoCE v2), MTU 1024
/// println!("{}", provider.path());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct PortPath {
    /// The device's name.
    pub device: String,
    /// The port number.
    pub port: u8,
    /// The GID entry the queue pairs route by, if any.
    pub gid: Option<RoutingGid>,
    /// The port's active MTU in bytes, where the port could be queried.
    pub active_mtu: Option<u32>,
}

impl fmt::Display for PortPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "device {} port {}, ", self.device, self.port)?;
        match &self.gid {
            Some(gid) => write!(f, "GID index {} {} ({})", gid.index, gid.value, gid.kind)?,
            None => f.write_str("routed by LID (no GID)")?,
        }
        match self.active_mtu {
            Some(mtu) => write!(f, ", MTU {mtu}"),
            None => f.write_str(", MTU unknown"),
        }
    }
}

/// A GID table entry queue pairs route by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct RoutingGid {
    /// Its index in the port's GID table.
    pub index: u32,
    /// The GID, as the IPv6 address it is (an IPv4 one shows as `::ffff:a.b.c.d`).
    pub value: Ipv6Addr,
    /// How it is carried.
    pub kind: GidKind,
}

/// How a GID's traffic is carried (`ibv_gid_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum GidKind {
    /// InfiniBand.
    InfiniBand,
    /// RoCE v1: InfiniBand's network layer over Ethernet.
    RoceV1,
    /// RoCE v2: over UDP/IP.
    RoceV2,
    /// A type this build does not know.
    Other(ibv_gid_type),
}

impl GidKind {
    fn of(gid_type: ibv_gid_type) -> GidKind {
        match gid_type {
            GID_TYPE_IB => GidKind::InfiniBand,
            GID_TYPE_ROCE_V1 => GidKind::RoceV1,
            GID_TYPE_ROCE_V2 => GidKind::RoceV2,
            other => GidKind::Other(other),
        }
    }
}

impl fmt::Display for GidKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            GidKind::InfiniBand => f.write_str("InfiniBand"),
            GidKind::RoceV1 => f.write_str("RoCE v1"),
            GidKind::RoceV2 => f.write_str("RoCE v2"),
            GidKind::Other(other) => write!(f, "GID type {other}"),
        }
    }
}

/// The 16 bytes of `gid` as an IPv6 address.
fn gid_address(gid: &Gid) -> Ipv6Addr {
    Ipv6Addr::from((u128::from(gid.subnet_prefix()) << 64) | u128::from(gid.interface_id()))
}

/// The bytes of an `ibv_mtu` value, `None` for a value `verbs.h` does not define.
fn mtu_bytes(mtu: ibverbs_sys::ibv_mtu) -> Option<u32> {
    (1..=5).contains(&mtu).then(|| 128 << mtu)
}

/// The active MTU of port [`PORT`] of device `name`, through a context of its own:
/// `ibverbs` queries the port when it opens a device and keeps the answer private.
fn active_mtu(name: &str) -> io::Result<Option<u32>> {
    let mut count = 0;
    // SAFETY: `count` is a valid place for the number of devices; the list returned is
    // freed below, after the last use of any device pointer from it.
    let list = unsafe { ibverbs_sys::ibv_get_device_list(&mut count) };
    if list.is_null() {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a non-null list holds `count` device pointers (then a null one).
    let devices = unsafe { std::slice::from_raw_parts(list, count.max(0) as usize) };
    let found = devices.iter().copied().find(|&device| {
        // SAFETY: `device` comes from the live list; the name it returns is a C string
        // owned by the device, read before the list is freed.
        let device_name = unsafe { ibverbs_sys::ibv_get_device_name(device) };
        // SAFETY: non-null, it is a NUL-terminated string (see above).
        !device_name.is_null()
            && unsafe { CStr::from_ptr(device_name) }.to_bytes() == name.as_bytes()
    });
    let result = match found {
        None => Ok(None),
        Some(device) => {
            // SAFETY: `device` is a device of the live list.
            let context = unsafe { ibverbs_sys::ibv_open_device(device) };
            if context.is_null() {
                Err(io::Error::last_os_error())
            } else {
                let mut attributes = ibverbs_sys::ibv_port_attr::default();
                // SAFETY: `context` is open; libibverbs' exported `ibv_query_port` fills
                // the compat prefix of `ibv_port_attr`, which holds `active_mtu` (the
                // `ibverbs` crate calls it the same way). The context is closed once.
                let queried = unsafe {
                    let queried = ibverbs_sys::ibv_query_port(
                        context,
                        PORT,
                        (&mut attributes as *mut ibverbs_sys::ibv_port_attr).cast(),
                    );
                    ibverbs_sys::ibv_close_device(context);
                    queried
                };
                match queried {
                    0 => Ok(mtu_bytes(attributes.active_mtu)),
                    errno => Err(io::Error::from_raw_os_error(errno)),
                }
            }
        }
    };
    // SAFETY: `list` came from `ibv_get_device_list` and is freed once; no pointer from it
    // is used after this.
    unsafe { ibverbs_sys::ibv_free_device_list(list) };
    result
}

/// `IBV_GID_TYPE_IB` of `verbs.h`.
const GID_TYPE_IB: ibv_gid_type = 0;
/// `IBV_GID_TYPE_ROCE_V1` of `verbs.h` (`ibverbs` 0.9 re-exports the type, not its values).
const GID_TYPE_ROCE_V1: ibv_gid_type = 1;
/// `IBV_GID_TYPE_ROCE_V2` of `verbs.h`.
const GID_TYPE_ROCE_V2: ibv_gid_type = 2;

/// What routing needs to know of one valid entry of a port's GID table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct GidTableEntry {
    pub(crate) gid_index: u32,
    pub(crate) gid_type: ibv_gid_type,
    /// Whether the GID is an IPv4 address (`::ffff:a.b.c.d`).
    pub(crate) ipv4_mapped: bool,
}

/// The GID index queue pairs route by, given the port's valid GID entries (as `ibverbs`
/// lists them) and the index asked for, if any.
///
/// `ibverbs` 0.9 looks an index up by its position in the list of valid entries and
/// panics if the entry there has another index, so an index is usable only where the two
/// agree; an unusable one is refused with the number of valid entries. With no index
/// asked for, the first usable IPv4-mapped RoCE v2 entry is taken, else the first usable
/// RoCE v2 entry, else the first RoCE v1 entry (RoCE needs a GID), else none: InfiniBand
/// routes by LID.
///
/// An IPv4-mapped RoCE v2 GID comes first because connecting a queue pair to it
/// (`ibv_modify_qp` to RTR) resolves the peer's Ethernet address by ARP, whose entry the
/// rendezvous over the peer's IPv4 address has just made, and it routes beyond the link;
/// a link-local GID is resolved by IPv6 neighbor discovery, which nothing has warmed and
/// which the kernel gives a second before it fails the transition with `ETIMEDOUT`.
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
        None => {
            let preferences: [fn(&GidTableEntry) -> bool; 3] = [
                |entry| entry.gid_type == GID_TYPE_ROCE_V2 && entry.ipv4_mapped,
                |entry| entry.gid_type == GID_TYPE_ROCE_V2,
                |entry| entry.gid_type == GID_TYPE_ROCE_V1,
            ];
            Ok(preferences.iter().find_map(|wanted| {
                entries
                    .iter()
                    .enumerate()
                    .find(|(position, entry)| usable(*position, entry) && wanted(entry))
                    .map(|(_, entry)| entry.gid_index)
            }))
        }
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

    #[test]
    fn a_path_says_device_port_gid_and_mtu_in_one_line() {
        let roce = PortPath {
            device: "rxe0".into(),
            port: 1,
            gid: Some(RoutingGid {
                index: 1,
                value: "::ffff:10.0.2.15".parse().unwrap(),
                kind: GidKind::of(GID_TYPE_ROCE_V2),
            }),
            active_mtu: mtu_bytes(3),
        };
        assert_eq!(
            roce.to_string(),
            "device rxe0 port 1, GID index 1 ::ffff:10.0.2.15 (RoCE v2), MTU 1024"
        );
        let infiniband = PortPath {
            device: "mlx5_0".into(),
            port: 1,
            gid: None,
            active_mtu: mtu_bytes(5),
        };
        assert_eq!(
            infiniband.to_string(),
            "device mlx5_0 port 1, routed by LID (no GID), MTU 4096"
        );
    }

    #[test]
    fn mtu_values_are_the_five_verbs_defines() {
        let bytes: Vec<Option<u32>> = (0..=6).map(mtu_bytes).collect();
        assert_eq!(
            bytes,
            [
                None,
                Some(256),
                Some(512),
                Some(1024),
                Some(2048),
                Some(4096),
                None
            ]
        );
        assert_eq!(GidKind::of(7).to_string(), "GID type 7");
    }

    fn entry(gid_index: u32, gid_type: ibv_gid_type) -> GidTableEntry {
        GidTableEntry {
            gid_index,
            gid_type,
            ipv4_mapped: false,
        }
    }

    fn ipv4_entry(gid_index: u32, gid_type: ibv_gid_type) -> GidTableEntry {
        GidTableEntry {
            ipv4_mapped: true,
            ..entry(gid_index, gid_type)
        }
    }

    #[test]
    fn infiniband_routes_by_lid_unless_an_index_is_asked_for() {
        let table = [entry(0, GID_TYPE_IB), entry(1, GID_TYPE_IB)];
        assert_eq!(routing_gid_index(&table, None), Ok(None));
        assert_eq!(routing_gid_index(&table, Some(1)), Ok(Some(1)));
    }

    #[test]
    fn roce_prefers_an_ipv4_v2_entry_then_any_v2_then_v1() {
        // A ConnectX port: v1 and v2 link-local, then v1 and v2 IPv4-mapped.
        let port = [
            entry(0, GID_TYPE_ROCE_V1),
            entry(1, GID_TYPE_ROCE_V2),
            ipv4_entry(2, GID_TYPE_ROCE_V1),
            ipv4_entry(3, GID_TYPE_ROCE_V2),
        ];
        assert_eq!(routing_gid_index(&port, None), Ok(Some(3)));
        assert_eq!(routing_gid_index(&port, Some(1)), Ok(Some(1)));
        // A soft-RoCE port, all v2: link-local, then IPv4-mapped.
        let rxe = [entry(0, GID_TYPE_ROCE_V2), ipv4_entry(1, GID_TYPE_ROCE_V2)];
        assert_eq!(routing_gid_index(&rxe, None), Ok(Some(1)));
        // No IPv4 address on the netdev: the link-local v2 entry.
        let ipv6_only = [entry(0, GID_TYPE_ROCE_V1), entry(1, GID_TYPE_ROCE_V2)];
        assert_eq!(routing_gid_index(&ipv6_only, None), Ok(Some(1)));
        let v1_only = [entry(0, GID_TYPE_ROCE_V1), ipv4_entry(1, GID_TYPE_ROCE_V1)];
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
