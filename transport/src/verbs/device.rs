//! An opened RDMA device: its context, the port its queue pairs go out by, and the one
//! protection domain every region and queue pair of a provider belongs to.
//!
//! # Invariants
//!
//! - `sideway` holds each verbs object's parents by `Arc` (a protection domain its
//!   context, a memory region or queue pair its domain, a completion queue its context
//!   and completion channel), so no object is destroyed while anything made from it
//!   lives, whatever order their owners drop in.
//! - The port is one the device has, and was `ACTIVE` or `ARMED` when the device was
//!   opened; the path MTU, LID and GID kept here are that port's, and every queue pair of
//!   the provider goes out by it.

use std::error::Error;
use std::fmt;
use std::net::Ipv6Addr;
use std::sync::Arc;

use sideway::ibverbs::address::GidType;
use sideway::ibverbs::device::{DeviceInfo, DeviceList};
use sideway::ibverbs::device_context::{DeviceCapabilityFlags, DeviceContext, Mtu, PortState};
use sideway::ibverbs::protection_domain::ProtectionDomain;

use super::error::{VerbsError, select_device};

/// An opened device, shared by a provider, its registrar, its regions and its endpoints.
pub(crate) struct OpenDevice {
    name: String,
    port: u8,
    gid_index: Option<u32>,
    path: PortPath,
    lid: u16,
    path_mtu: Mtu,
    /// The deepest send or receive queue the device takes, with a completion queue as
    /// deep: the least of its `max_qp_wr` and `max_cqe`.
    max_queue_depth: u32,
    /// How exposures are made on this device ([`Exposures`]).
    exposures: Exposures,
    /// The RDMA READs a queue pair has outstanding at once, each way: the least of
    /// [`MAX_READS_IN_FLIGHT`] and the device's `max_qp_rd_atom` and `max_qp_init_rd_atom`.
    reads_in_flight: u8,
    context: Arc<DeviceContext>,
    domain: Arc<ProtectionDomain>,
}

/// The most RDMA READs a queue pair asks to have outstanding at once, as the reader
/// (`max_rd_atomic`) and as the side read (`max_dest_rd_atomic`). Both sides take the same
/// figure, so one never sends more reads than the other serves; a device that serves fewer
/// lowers it on its side.
pub(crate) const MAX_READS_IN_FLIGHT: u8 = 16;

/// How a device's endpoints let their peer reach exposed memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exposures {
    /// A type 2 memory window per exposure, bound to the connection's queue pair: its key
    /// works on that queue pair alone. Chosen where the device has type 2 windows
    /// (`IBV_DEVICE_MEM_WINDOW_TYPE_2A` or `_2B` in `device_cap_flags`, and a nonzero
    /// `max_mw`), unless the configuration asks for registrations
    /// ([`VerbsConfig::with_exposures`](super::VerbsConfig::with_exposures)).
    Windows,
    /// A memory registration with remote rights per exposure, over the exposed range
    /// only: its key works on every queue pair of the provider's protection domain, so it
    /// is kept from other connections' peers only by not being told to them
    /// (`docs/threats.md`).
    Registrations,
}
impl OpenDevice {
    /// Opens the device named `name`, checks that it has port `port` and that the port is
    /// up, picks the GID index to route by ([`routing_gid_index`], `requested_gid_index`
    /// if given) and allocates the protection domain.
    pub(crate) fn open(
        name: &str,
        port_number: u8,
        requested_gid_index: Option<u32>,
        requested_exposures: Exposures,
    ) -> Result<OpenDevice, VerbsError> {
        let list = DeviceList::new().map_err(|source| VerbsError::DevicesUnavailable {
            source: Box::new(source),
        })?;
        let names: Vec<String> = list.iter().map(|device| device.name()).collect();
        let index = select_device(&names, name)?;
        let device = list.get(index).ok_or_else(|| VerbsError::DeviceNotFound {
            name: name.to_owned(),
            found: names.clone(),
        })?;
        let context = device
            .open()
            .map_err(|source| device_error(name, "opening the device (ibv_open_device)", source))?;
        let attributes = context.query_device().map_err(|source| {
            device_error(name, "querying the device (ibv_query_device)", source)
        })?;
        let ports = attributes.phys_port_cnt();
        let max_queue_depth = attributes
            .max_qp_wr()
            .min(attributes.max_cqe())
            .try_into()
            .unwrap_or(0);
        let type_2_windows = attributes.device_cap_flags().intersects(
            DeviceCapabilityFlags::MemoryWindowType2A | DeviceCapabilityFlags::MemoryWindowType2B,
        ) && attributes.max_mw() > 0;
        let exposures = if type_2_windows {
            requested_exposures
        } else {
            Exposures::Registrations
        };
        let reads_in_flight = attributes
            .max_qp_rd_atom()
            .min(attributes.max_qp_init_rd_atom())
            .clamp(0, i32::from(MAX_READS_IN_FLIGHT)) as u8;
        if !(1..=ports).contains(&port_number) {
            return Err(VerbsError::PortOutOfRange {
                device: name.to_owned(),
                port: port_number,
                ports,
            });
        }
        let port = context
            .query_port(port_number)
            .map_err(|source| device_error(name, "querying the port (ibv_query_port)", source))?;
        let state = port.port_state();
        if !matches!(state, PortState::Active | PortState::Armed) {
            return Err(VerbsError::PortDown {
                device: name.to_owned(),
                port: port_number,
                state: format!("{state:?}"),
            });
        }
        let gid_table: Vec<_> = context
            .query_gid_table()
            .map_err(|source| {
                device_error(name, "reading the GID table (ibv_query_gid_table)", source)
            })?
            .into_iter()
            .filter(|entry| entry.port_num() == u32::from(port_number))
            .collect();
        let gid_entries: Vec<GidTableEntry> = gid_table
            .iter()
            .map(|entry| GidTableEntry {
                gid_index: entry.gid_index(),
                kind: GidKind::of(entry.gid_type()),
                ipv4_mapped: Ipv6Addr::from(entry.gid()).to_ipv4_mapped().is_some(),
            })
            .collect();
        let gid_index =
            routing_gid_index(&gid_entries, requested_gid_index).map_err(|entries| {
                VerbsError::GidIndexOutOfRange {
                    device: name.to_owned(),
                    port: port_number,
                    gid_index: requested_gid_index.unwrap_or_default(),
                    entries,
                }
            })?;
        let path_mtu = port.active_mtu();
        let path = PortPath {
            device: name.to_owned(),
            port: port_number,
            gid: gid_index.and_then(|index| {
                let entry = gid_table.iter().find(|entry| entry.gid_index() == index)?;
                Some(RoutingGid {
                    index,
                    value: Ipv6Addr::from(entry.gid()),
                    kind: GidKind::of(entry.gid_type()),
                })
            }),
            active_mtu: mtu_bytes(path_mtu),
        };
        let domain = context.alloc_pd().map_err(|source| {
            device_error(
                name,
                "allocating the protection domain (ibv_alloc_pd)",
                source,
            )
        })?;
        Ok(OpenDevice {
            name: name.to_owned(),
            port: port_number,
            gid_index,
            path,
            lid: port.lid(),
            path_mtu,
            max_queue_depth,
            exposures,
            reads_in_flight,
            context,
            domain,
        })
    }

    /// How exposures are made on this device.
    pub(crate) fn exposures(&self) -> Exposures {
        self.exposures
    }

    /// The RDMA READs a queue pair has outstanding at once, each way.
    pub(crate) fn reads_in_flight(&self) -> u8 {
        self.reads_in_flight
    }

    /// The deepest send or receive queue the device takes (its `max_qp_wr` and `max_cqe`).
    pub(crate) fn max_queue_depth(&self) -> u32 {
        self.max_queue_depth
    }

    /// The device's name.
    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    /// The port every queue pair goes out by.
    pub(crate) fn port(&self) -> u8 {
        self.port
    }

    /// The GID index queue pairs route by, if any (RoCE).
    pub(crate) fn gid_index(&self) -> Option<u32> {
        self.gid_index
    }

    /// The device, port, GID and MTU the queue pairs go out by.
    pub(crate) fn path(&self) -> &PortPath {
        &self.path
    }

    /// The port's local identifier (InfiniBand; 0 on RoCE).
    pub(crate) fn lid(&self) -> u16 {
        self.lid
    }

    /// The MTU queue pairs take as their path MTU: the port's active MTU.
    pub(crate) fn path_mtu(&self) -> Mtu {
        self.path_mtu
    }

    /// The device context.
    pub(crate) fn context(&self) -> &Arc<DeviceContext> {
        &self.context
    }

    /// The protection domain of every region and queue pair of this device's provider.
    pub(crate) fn domain(&self) -> &Arc<ProtectionDomain> {
        &self.domain
    }

    /// A device error of `operation`.
    pub(crate) fn error(
        &self,
        operation: &'static str,
        source: impl Into<Box<dyn Error + Send + Sync>>,
    ) -> VerbsError {
        device_error(&self.name, operation, source)
    }
}

impl std::fmt::Debug for OpenDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OpenDevice")
            .field("name", &self.name)
            .field("gid_index", &self.gid_index)
            .field("exposures", &self.exposures)
            .finish_non_exhaustive()
    }
}

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
    /// The port's active MTU in bytes.
    pub active_mtu: u32,
}

impl fmt::Display for PortPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "device {} port {}, ", self.device, self.port)?;
        match &self.gid {
            Some(gid) => write!(f, "GID index {} {} ({})", gid.index, gid.value, gid.kind)?,
            None => f.write_str("routed by LID (no GID)")?,
        }
        write!(f, ", MTU {}", self.active_mtu)
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
}

impl GidKind {
    fn of(gid_type: GidType) -> GidKind {
        match gid_type {
            GidType::InfiniBand => GidKind::InfiniBand,
            GidType::RoceV1 => GidKind::RoceV1,
            GidType::RoceV2 => GidKind::RoceV2,
        }
    }
}

impl fmt::Display for GidKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            GidKind::InfiniBand => "InfiniBand",
            GidKind::RoceV1 => "RoCE v1",
            GidKind::RoceV2 => "RoCE v2",
        })
    }
}

/// The bytes of an MTU.
fn mtu_bytes(mtu: Mtu) -> u32 {
    match mtu {
        Mtu::Mtu256 => 256,
        Mtu::Mtu512 => 512,
        Mtu::Mtu1024 => 1024,
        Mtu::Mtu2048 => 2048,
        Mtu::Mtu4096 => 4096,
    }
}

/// What routing needs to know of one valid entry of a port's GID table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct GidTableEntry {
    pub(crate) gid_index: u32,
    pub(crate) kind: GidKind,
    /// Whether the GID is an IPv4 address (`::ffff:a.b.c.d`).
    pub(crate) ipv4_mapped: bool,
}

/// The GID index queue pairs route by, given the port's valid GID entries and the index
/// asked for, if any.
///
/// An index asked for must be one of the valid entries; otherwise it is refused with the
/// number of valid entries. With no index asked for, the first IPv4-mapped RoCE v2 entry
/// is taken, else the first RoCE v2 entry, else the first RoCE v1 entry (RoCE needs a
/// GID), else none: InfiniBand routes by LID.
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
    match requested {
        Some(gid_index) if entries.iter().any(|entry| entry.gid_index == gid_index) => {
            Ok(Some(gid_index))
        }
        Some(_) => Err(entries.len()),
        None => {
            let preferences: [fn(&GidTableEntry) -> bool; 3] = [
                |entry| entry.kind == GidKind::RoceV2 && entry.ipv4_mapped,
                |entry| entry.kind == GidKind::RoceV2,
                |entry| entry.kind == GidKind::RoceV1,
            ];
            Ok(preferences.iter().find_map(|wanted| {
                entries
                    .iter()
                    .find(|entry| wanted(entry))
                    .map(|entry| entry.gid_index)
            }))
        }
    }
}

fn device_error(
    device: &str,
    operation: &'static str,
    source: impl Into<Box<dyn Error + Send + Sync>>,
) -> VerbsError {
    VerbsError::Device {
        device: device.to_owned(),
        operation,
        source: source.into(),
    }
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
                kind: GidKind::RoceV2,
            }),
            active_mtu: mtu_bytes(Mtu::Mtu1024),
        };
        assert_eq!(
            roce.to_string(),
            "device rxe0 port 1, GID index 1 ::ffff:10.0.2.15 (RoCE v2), MTU 1024"
        );
        let infiniband = PortPath {
            device: "mlx5_0".into(),
            port: 1,
            gid: None,
            active_mtu: mtu_bytes(Mtu::Mtu4096),
        };
        assert_eq!(
            infiniband.to_string(),
            "device mlx5_0 port 1, routed by LID (no GID), MTU 4096"
        );
    }

    #[test]
    fn mtus_are_the_five_verbs_sizes() {
        let bytes: Vec<u32> = [
            Mtu::Mtu256,
            Mtu::Mtu512,
            Mtu::Mtu1024,
            Mtu::Mtu2048,
            Mtu::Mtu4096,
        ]
        .into_iter()
        .map(mtu_bytes)
        .collect();
        assert_eq!(bytes, [256, 512, 1024, 2048, 4096]);
        assert_eq!(GidKind::of(GidType::RoceV1).to_string(), "RoCE v1");
    }

    fn entry(gid_index: u32, kind: GidKind) -> GidTableEntry {
        GidTableEntry {
            gid_index,
            kind,
            ipv4_mapped: false,
        }
    }

    fn ipv4_entry(gid_index: u32, kind: GidKind) -> GidTableEntry {
        GidTableEntry {
            ipv4_mapped: true,
            ..entry(gid_index, kind)
        }
    }

    use GidKind::{InfiniBand, RoceV1, RoceV2};

    #[test]
    fn infiniband_routes_by_lid_unless_an_index_is_asked_for() {
        let table = [entry(0, InfiniBand), entry(1, InfiniBand)];
        assert_eq!(routing_gid_index(&table, None), Ok(None));
        assert_eq!(routing_gid_index(&table, Some(1)), Ok(Some(1)));
    }

    #[test]
    fn roce_prefers_an_ipv4_v2_entry_then_any_v2_then_v1() {
        // A ConnectX port: v1 and v2 link-local, then v1 and v2 IPv4-mapped.
        let port = [
            entry(0, RoceV1),
            entry(1, RoceV2),
            ipv4_entry(2, RoceV1),
            ipv4_entry(3, RoceV2),
        ];
        assert_eq!(routing_gid_index(&port, None), Ok(Some(3)));
        assert_eq!(routing_gid_index(&port, Some(1)), Ok(Some(1)));
        // A soft-RoCE port, all v2: link-local, then IPv4-mapped.
        let rxe = [entry(0, RoceV2), ipv4_entry(1, RoceV2)];
        assert_eq!(routing_gid_index(&rxe, None), Ok(Some(1)));
        // No IPv4 address on the netdev: the link-local v2 entry.
        let ipv6_only = [entry(0, RoceV1), entry(1, RoceV2)];
        assert_eq!(routing_gid_index(&ipv6_only, None), Ok(Some(1)));
        let v1_only = [entry(0, RoceV1), ipv4_entry(1, RoceV1)];
        assert_eq!(routing_gid_index(&v1_only, None), Ok(Some(0)));
    }

    #[test]
    fn an_index_that_is_no_valid_entry_is_refused() {
        // Index 1 is not valid (a gap in the table), index 2 is.
        let gapped = [entry(0, RoceV1), entry(2, RoceV2)];
        assert_eq!(routing_gid_index(&gapped, Some(1)), Err(2));
        assert_eq!(routing_gid_index(&gapped, Some(2)), Ok(Some(2)));
        assert_eq!(routing_gid_index(&gapped, Some(7)), Err(2));
        assert_eq!(routing_gid_index(&[], Some(0)), Err(0));
        assert_eq!(routing_gid_index(&gapped, None), Ok(Some(2)));
    }
}
