//! The verbs provider's errors: opening a device, checking limits, connecting.

use std::error::Error;

use crate::error::QueueKind;

use super::handshake::HandshakeError;

/// What went wrong opening a device, planning memory, or connecting an endpoint. Each
/// message says what to check or change.
///
/// ```
/// use tierbuf_pool::MemoryBudget;
/// use tierbuf_transport::verbs::{VerbsConfig, VerbsError, VerbsProvider};
/// match VerbsProvider::open(&VerbsConfig::new("no-such-device"), MemoryBudget::with_cap(1 << 20)) {
///     Err(VerbsError::DevicesUnavailable { .. } | VerbsError::NoDevices) => {} // no RDMA here
///     Err(VerbsError::DeviceNotFound { found, .. }) => println!("devices here: {found:?}"),
///     other => panic!("{other:?}"),
/// }
/// ```
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum VerbsError {
    /// The RDMA devices could not even be listed: libibverbs is not installed, or the
    /// kernel has no RDMA support loaded.
    #[error(
        "no RDMA devices can be listed ({source}): libibverbs.so.1 cannot be loaded \
         (install rdma-core's `libibverbs1` and `ibverbs-providers`), or this kernel has \
         no InfiniBand/RDMA support loaded or /dev/infiniband is missing; load the NIC's \
         RDMA driver, or for soft-RoCE run `modprobe rdma_rxe` and `rdma link add rxe0 \
         type rxe netdev eth0`"
    )]
    DevicesUnavailable {
        /// The error `ibv_get_device_list` reported (or that libibverbs could not be
        /// loaded).
        #[source]
        source: Box<dyn Error + Send + Sync>,
    },
    /// The kernel supports RDMA but no device is present.
    #[error(
        "no RDMA devices found: check `ibv_devices` or `rdma link`; for soft-RoCE run \
         `rdma link add rxe0 type rxe netdev eth0`"
    )]
    NoDevices,
    /// No device has the name asked for.
    #[error("no RDMA device is named {name:?}; devices found: {}", found.join(", "))]
    DeviceNotFound {
        /// The name asked for.
        name: String,
        /// The names of the devices present.
        found: Vec<String>,
    },
    /// The device has no port of the number asked for.
    #[error(
        "RDMA device {device:?} has no port {port}: its ports are 1 to {ports} \
         (`ibv_devinfo -d {device}` lists them)"
    )]
    PortOutOfRange {
        /// The device.
        device: String,
        /// The port asked for.
        port: u8,
        /// The device's ports (`phys_port_cnt`).
        ports: u8,
    },
    /// The port the provider goes out by is not up.
    #[error(
        "port {port} of RDMA device {device:?} is {state}, not ACTIVE or ARMED: check the \
         link with `ibv_devinfo -d {device}` (state PORT_ACTIVE), the cable or the netdev \
         under a soft-RoCE device, and the subnet manager on InfiniBand"
    )]
    PortDown {
        /// The device.
        device: String,
        /// The port.
        port: u8,
        /// The state the port is in, as `ibv_query_port` gave it.
        state: String,
    },
    /// The GID index asked for (RoCE) is not a valid entry of the port's GID table.
    #[error(
        "GID index {gid_index} is not a valid entry of the GID table of {device:?} port \
         {port} ({entries} valid entries); list them with `ibv_devinfo -v -d {device}` \
         (RoCE v2 entries usually sit at odd indices), or leave the index unset to take \
         the first IPv4-mapped RoCE v2 entry"
    )]
    GidIndexOutOfRange {
        /// The device.
        device: String,
        /// The port.
        port: u8,
        /// The index asked for.
        gid_index: u32,
        /// The valid entries of the port's GID table.
        entries: usize,
    },
    /// One side routes by GID (RoCE) and the other by LID (InfiniBand).
    #[error(
        "this side routes by {} and the peer by {}: on RoCE both sides must set a GID \
         index, on InfiniBand neither needs one",
        routing(*local_has_gid),
        routing(*peer_has_gid)
    )]
    RoutingMismatch {
        /// Whether this side sent a GID.
        local_has_gid: bool,
        /// Whether the peer sent a GID.
        peer_has_gid: bool,
    },
    /// A verbs call on the device failed.
    #[error("RDMA device {device:?} failed in {operation}")]
    Device {
        /// The device.
        device: String,
        /// The verbs call and what it was for.
        operation: &'static str,
        /// The error the call reported.
        #[source]
        source: Box<dyn Error + Send + Sync>,
    },
    /// A queue depth outside what the provider takes was asked for.
    #[error("a {queue} queue depth of {depth} is outside 1..={max}")]
    InvalidDepth {
        /// Which queue.
        queue: QueueKind,
        /// The depth asked for.
        depth: u32,
        /// The deepest queue the provider takes.
        max: u32,
    },
    /// A queue depth past what the device takes: its `max_qp_wr` or its `max_cqe`
    /// (`ibv_devinfo -v`). The caller's to lower.
    #[error(
        "RDMA device {device:?} takes {queue} queues of at most {max} work requests \
         (the least of its max_qp_wr and max_cqe), not {depth}: ask for fewer"
    )]
    DepthPastDevice {
        /// The device.
        device: String,
        /// Which queue.
        queue: QueueKind,
        /// The depth asked for.
        depth: u32,
        /// The deepest queue the device takes.
        max: u32,
    },
    /// The memory a plan may pin passes `RLIMIT_MEMLOCK`.
    #[error(
        "the plan may pin {required} bytes but RLIMIT_MEMLOCK allows {limit}: raise the \
         limit (`ulimit -l unlimited`, `LimitMEMLOCK=infinity` in a systemd unit, \
         `--ulimit memlock=-1` for a container), run with CAP_IPC_LOCK, or plan fewer \
         connections or smaller tiers"
    )]
    MemlockTooLow {
        /// Bytes the plan may pin.
        required: u128,
        /// The limit in bytes.
        limit: u64,
    },
    /// The connection handshake with the peer failed.
    #[error("the connection handshake failed")]
    Handshake(#[from] HandshakeError),
}

fn routing(has_gid: bool) -> &'static str {
    if has_gid { "GID" } else { "LID" }
}

/// The device named `wanted` among `found`, as its position.
pub(crate) fn select_device(found: &[String], wanted: &str) -> Result<usize, VerbsError> {
    if found.is_empty() {
        return Err(VerbsError::NoDevices);
    }
    found
        .iter()
        .position(|name| name == wanted)
        .ok_or_else(|| VerbsError::DeviceNotFound {
            name: wanted.to_owned(),
            found: found.to_vec(),
        })
}

#[cfg(test)]
mod tests {
    use std::io;

    use super::*;

    fn names(list: &[&str]) -> Vec<String> {
        list.iter().map(|name| (*name).to_owned()).collect()
    }

    #[test]
    fn a_device_is_found_by_its_exact_name() {
        let found = names(&["mlx5_0", "mlx5_1", "rxe0"]);
        assert_eq!(select_device(&found, "mlx5_1").unwrap(), 1);
        assert_eq!(select_device(&found, "rxe0").unwrap(), 2);
    }

    #[test]
    fn a_missing_name_lists_the_devices_found() {
        let found = names(&["mlx5_0", "rxe0"]);
        let error = select_device(&found, "mlx5").unwrap_err();
        assert!(
            matches!(&error, VerbsError::DeviceNotFound { name, found: listed } if name == "mlx5" && *listed == found)
        );
        assert_eq!(
            error.to_string(),
            "no RDMA device is named \"mlx5\"; devices found: mlx5_0, rxe0"
        );
    }

    #[test]
    fn no_devices_says_how_to_add_one() {
        let error = select_device(&[], "rxe0").unwrap_err();
        assert!(matches!(error, VerbsError::NoDevices));
        assert!(error.to_string().contains("rdma link add"));
    }

    #[test]
    fn a_port_that_is_not_up_names_its_state_and_how_to_check_it() {
        let down = VerbsError::PortDown {
            device: "rxe0".into(),
            port: 1,
            state: "Down".into(),
        };
        let message = down.to_string();
        assert!(
            message.contains("port 1 of")
                && message.contains("is Down")
                && message.contains("ibv_devinfo -d rxe0"),
            "{message}"
        );
        let missing = VerbsError::PortOutOfRange {
            device: "mlx5_0".into(),
            port: 3,
            ports: 2,
        };
        assert_eq!(
            missing.to_string(),
            "RDMA device \"mlx5_0\" has no port 3: its ports are 1 to 2 (`ibv_devinfo -d \
             mlx5_0` lists them)"
        );
    }

    #[test]
    fn devices_unavailable_explains_kernel_support() {
        let error = VerbsError::DevicesUnavailable {
            source: Box::new(io::Error::from(io::ErrorKind::Unsupported)),
        };
        let message = error.to_string();
        assert!(
            message.contains("kernel")
                && message.contains("rdma_rxe")
                && message.contains("libibverbs1"),
            "{message}"
        );
    }

    #[test]
    fn a_routing_mismatch_says_which_side_lacks_the_gid() {
        let error = VerbsError::RoutingMismatch {
            local_has_gid: false,
            peer_has_gid: true,
        };
        assert_eq!(
            error.to_string(),
            "this side routes by LID and the peer by GID: on RoCE both sides must set a GID \
             index, on InfiniBand neither needs one"
        );
    }
}
