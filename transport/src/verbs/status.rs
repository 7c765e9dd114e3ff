//! How verbs work-completion statuses (`ibv_wc_status`) map to [`CompletionStatus`].

use std::fmt;

use rdma_mummy_sys::ibv_wc_status;

use crate::provider::{CompletionStatus, Opcode};

/// The first error completion of an endpoint, as its device reported it: the status it
/// maps to, and the device's own status and vendor syndrome, which the mapping would
/// otherwise hide ([`VerbsEndpoint::failure`](super::VerbsEndpoint::failure)).
///
/// ```
/// use tierbuf_transport::verbs::ibv_wc_status;
/// use tierbuf_transport::{CompletionStatus, Opcode};
/// use tierbuf_transport::verbs::DeviceFailure;
/// let failure = DeviceFailure::new(1, Opcode::Recv, ibv_wc_status::IBV_WC_LOC_QP_OP_ERR, 0);
/// assert_eq!(failure.status, CompletionStatus::LocalOperationError);
/// assert!(failure.to_string().contains("IBV_WC_LOC_QP_OP_ERR"), "{failure}");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct DeviceFailure {
    /// The failed request's id.
    pub wr_id: u64,
    /// Its queue.
    pub opcode: Opcode,
    /// The device's status (`ibv_wc_status`).
    pub device_status: ibv_wc_status::Type,
    /// The device's vendor syndrome (`vendor_err`); its meaning is the vendor's.
    pub vendor_error: u32,
    /// What [`completion_status`] maps the device's status to.
    pub status: CompletionStatus,
}

impl DeviceFailure {
    /// The failure of request `wr_id` on the queue of `opcode`, with the device's status
    /// and vendor syndrome.
    pub fn new(
        wr_id: u64,
        opcode: Opcode,
        device_status: ibv_wc_status::Type,
        vendor_error: u32,
    ) -> DeviceFailure {
        DeviceFailure {
            wr_id,
            opcode,
            device_status,
            vendor_error,
            status: completion_status(device_status),
        }
    }
}

impl fmt::Display for DeviceFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let queue = match self.opcode {
            Opcode::Send => "send",
            Opcode::Write => "write",
            Opcode::Read => "read",
            Opcode::Recv | Opcode::RecvWithImm(_) => "receive",
        };
        write!(f, "{queue} work request {} failed with ", self.wr_id)?;
        match status_name(self.device_status) {
            Some(name) => f.write_str(name)?,
            None => write!(f, "unknown status {}", self.device_status)?,
        }
        write!(
            f,
            " (vendor error {:#x}), read as {:?}",
            self.vendor_error, self.status
        )
    }
}

/// The [`CompletionStatus`] of a work completion with verbs status `status`.
///
/// Statuses map by what they mean. Those with a variant of their own map to it. Of the
/// rest, errors of the local buffer map to [`CompletionStatus::LocalProtectionError`],
/// a local queue pair's failure to carry out a request as posted (soft-RoCE reports a
/// message longer than its receive so) to [`CompletionStatus::LocalOperationError`], a
/// peer that does not answer to [`CompletionStatus::RetryExceeded`], and every other
/// failure (responder and fatal errors, statuses of features a
/// reliable-connected queue pair without shared receive queues never uses, values
/// unknown to this build) to [`CompletionStatus::RemoteOperationError`]: a request that
/// was not carried out and broke the connection. [`status_name`] keeps the device's own
/// status visible. `docs/verbs.md` has the full table.
///
/// ```
/// use tierbuf_transport::verbs::ibv_wc_status;
/// use tierbuf_transport::CompletionStatus;
/// use tierbuf_transport::verbs::completion_status;
/// assert_eq!(completion_status(ibv_wc_status::IBV_WC_SUCCESS), CompletionStatus::Success);
/// assert_eq!(completion_status(ibv_wc_status::IBV_WC_WR_FLUSH_ERR), CompletionStatus::Flushed);
/// assert_eq!(completion_status(9999), CompletionStatus::RemoteOperationError);
/// ```
pub fn completion_status(status: ibv_wc_status::Type) -> CompletionStatus {
    use ibv_wc_status::*;
    match status {
        IBV_WC_SUCCESS => CompletionStatus::Success,
        IBV_WC_LOC_LEN_ERR => CompletionStatus::LocalLengthError,
        IBV_WC_LOC_PROT_ERR | IBV_WC_LOC_ACCESS_ERR => CompletionStatus::LocalProtectionError,
        IBV_WC_LOC_QP_OP_ERR | IBV_WC_LOC_EEC_OP_ERR => CompletionStatus::LocalOperationError,
        IBV_WC_REM_INV_REQ_ERR => CompletionStatus::RemoteInvalidRequest,
        IBV_WC_REM_ACCESS_ERR => CompletionStatus::RemoteAccessError,
        IBV_WC_RETRY_EXC_ERR | IBV_WC_RNR_RETRY_EXC_ERR | IBV_WC_RESP_TIMEOUT_ERR => {
            CompletionStatus::RetryExceeded
        }
        IBV_WC_WR_FLUSH_ERR => CompletionStatus::Flushed,
        _ => CompletionStatus::RemoteOperationError,
    }
}

/// The name `verbs.h` gives status `status` (`"IBV_WC_LOC_QP_OP_ERR"`), or `None` for a
/// value this build does not know. Error messages show it next to the mapped status, so
/// the device's own word is never lost.
///
/// ```
/// use tierbuf_transport::verbs::ibv_wc_status;
/// use tierbuf_transport::verbs::status_name;
/// assert_eq!(status_name(ibv_wc_status::IBV_WC_LOC_QP_OP_ERR), Some("IBV_WC_LOC_QP_OP_ERR"));
/// assert_eq!(status_name(9999), None);
/// ```
pub fn status_name(status: ibv_wc_status::Type) -> Option<&'static str> {
    use ibv_wc_status::*;
    Some(match status {
        IBV_WC_SUCCESS => "IBV_WC_SUCCESS",
        IBV_WC_LOC_LEN_ERR => "IBV_WC_LOC_LEN_ERR",
        IBV_WC_LOC_QP_OP_ERR => "IBV_WC_LOC_QP_OP_ERR",
        IBV_WC_LOC_EEC_OP_ERR => "IBV_WC_LOC_EEC_OP_ERR",
        IBV_WC_LOC_PROT_ERR => "IBV_WC_LOC_PROT_ERR",
        IBV_WC_WR_FLUSH_ERR => "IBV_WC_WR_FLUSH_ERR",
        IBV_WC_MW_BIND_ERR => "IBV_WC_MW_BIND_ERR",
        IBV_WC_BAD_RESP_ERR => "IBV_WC_BAD_RESP_ERR",
        IBV_WC_LOC_ACCESS_ERR => "IBV_WC_LOC_ACCESS_ERR",
        IBV_WC_REM_INV_REQ_ERR => "IBV_WC_REM_INV_REQ_ERR",
        IBV_WC_REM_ACCESS_ERR => "IBV_WC_REM_ACCESS_ERR",
        IBV_WC_REM_OP_ERR => "IBV_WC_REM_OP_ERR",
        IBV_WC_RETRY_EXC_ERR => "IBV_WC_RETRY_EXC_ERR",
        IBV_WC_RNR_RETRY_EXC_ERR => "IBV_WC_RNR_RETRY_EXC_ERR",
        IBV_WC_LOC_RDD_VIOL_ERR => "IBV_WC_LOC_RDD_VIOL_ERR",
        IBV_WC_REM_INV_RD_REQ_ERR => "IBV_WC_REM_INV_RD_REQ_ERR",
        IBV_WC_REM_ABORT_ERR => "IBV_WC_REM_ABORT_ERR",
        IBV_WC_INV_EECN_ERR => "IBV_WC_INV_EECN_ERR",
        IBV_WC_INV_EEC_STATE_ERR => "IBV_WC_INV_EEC_STATE_ERR",
        IBV_WC_FATAL_ERR => "IBV_WC_FATAL_ERR",
        IBV_WC_RESP_TIMEOUT_ERR => "IBV_WC_RESP_TIMEOUT_ERR",
        IBV_WC_GENERAL_ERR => "IBV_WC_GENERAL_ERR",
        IBV_WC_TM_ERR => "IBV_WC_TM_ERR",
        IBV_WC_TM_RNDV_INCOMPLETE => "IBV_WC_TM_RNDV_INCOMPLETE",
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use ibv_wc_status::*;

    /// Every status `verbs.h` defines, with the status it must map to.
    const TABLE: [(ibv_wc_status::Type, CompletionStatus); 24] = [
        (IBV_WC_SUCCESS, CompletionStatus::Success),
        (IBV_WC_LOC_LEN_ERR, CompletionStatus::LocalLengthError),
        (IBV_WC_LOC_QP_OP_ERR, CompletionStatus::LocalOperationError),
        (IBV_WC_LOC_EEC_OP_ERR, CompletionStatus::LocalOperationError),
        (IBV_WC_LOC_PROT_ERR, CompletionStatus::LocalProtectionError),
        (IBV_WC_WR_FLUSH_ERR, CompletionStatus::Flushed),
        (IBV_WC_MW_BIND_ERR, CompletionStatus::RemoteOperationError),
        (IBV_WC_BAD_RESP_ERR, CompletionStatus::RemoteOperationError),
        (
            IBV_WC_LOC_ACCESS_ERR,
            CompletionStatus::LocalProtectionError,
        ),
        (
            IBV_WC_REM_INV_REQ_ERR,
            CompletionStatus::RemoteInvalidRequest,
        ),
        (IBV_WC_REM_ACCESS_ERR, CompletionStatus::RemoteAccessError),
        (IBV_WC_REM_OP_ERR, CompletionStatus::RemoteOperationError),
        (IBV_WC_RETRY_EXC_ERR, CompletionStatus::RetryExceeded),
        (IBV_WC_RNR_RETRY_EXC_ERR, CompletionStatus::RetryExceeded),
        (
            IBV_WC_LOC_RDD_VIOL_ERR,
            CompletionStatus::RemoteOperationError,
        ),
        (
            IBV_WC_REM_INV_RD_REQ_ERR,
            CompletionStatus::RemoteOperationError,
        ),
        (IBV_WC_REM_ABORT_ERR, CompletionStatus::RemoteOperationError),
        (IBV_WC_INV_EECN_ERR, CompletionStatus::RemoteOperationError),
        (
            IBV_WC_INV_EEC_STATE_ERR,
            CompletionStatus::RemoteOperationError,
        ),
        (IBV_WC_FATAL_ERR, CompletionStatus::RemoteOperationError),
        (IBV_WC_RESP_TIMEOUT_ERR, CompletionStatus::RetryExceeded),
        (IBV_WC_GENERAL_ERR, CompletionStatus::RemoteOperationError),
        (IBV_WC_TM_ERR, CompletionStatus::RemoteOperationError),
        (
            IBV_WC_TM_RNDV_INCOMPLETE,
            CompletionStatus::RemoteOperationError,
        ),
    ];

    #[test]
    fn every_defined_status_maps_as_the_table_says() {
        for (status, expected) in TABLE {
            assert_eq!(completion_status(status), expected, "status {status}");
        }
    }

    #[test]
    fn the_table_covers_every_status_value_verbs_defines() {
        // verbs.h numbers the statuses 0..=IBV_WC_TM_RNDV_INCOMPLETE without gaps.
        let mut seen: Vec<ibv_wc_status::Type> = TABLE.iter().map(|&(status, _)| status).collect();
        seen.sort_unstable();
        let all: Vec<ibv_wc_status::Type> = (0..=IBV_WC_TM_RNDV_INCOMPLETE).collect();
        assert_eq!(seen, all);
    }

    #[test]
    fn every_defined_status_has_its_name_and_no_other() {
        for (status, _) in TABLE {
            let name = status_name(status).expect("a name");
            assert!(name.starts_with("IBV_WC_"), "{name}");
            let others = TABLE
                .iter()
                .filter(|&&(other, _)| status_name(other) == Some(name))
                .count();
            assert_eq!(others, 1, "{name}");
        }
        assert_eq!(status_name(IBV_WC_TM_RNDV_INCOMPLETE + 1), None);
    }

    #[test]
    fn only_success_is_success_and_unknown_values_are_failures() {
        for status in
            (0..=IBV_WC_TM_RNDV_INCOMPLETE).chain([IBV_WC_TM_RNDV_INCOMPLETE + 1, u32::MAX])
        {
            assert_eq!(
                completion_status(status).is_success(),
                status == IBV_WC_SUCCESS,
                "status {status}"
            );
        }
        assert_eq!(
            completion_status(IBV_WC_TM_RNDV_INCOMPLETE + 1),
            CompletionStatus::RemoteOperationError
        );
    }
}
