//! How verbs work-completion statuses (`ibv_wc_status`) map to [`CompletionStatus`].

use ibverbs::ibv_wc_status;

use crate::provider::CompletionStatus;

/// The [`CompletionStatus`] of a work completion with verbs status `status`.
///
/// Statuses with a variant of their own map to it. Of the rest, errors of the local
/// buffer map to [`CompletionStatus::LocalProtectionError`], a peer that does not answer
/// to [`CompletionStatus::RetryExceeded`], and every other failure (remote access,
/// responder and fatal errors, statuses of features a reliable-connected queue pair
/// without shared receive queues never uses, values unknown to this build) to
/// [`CompletionStatus::RemoteOperationError`]: a request that was not carried out and
/// broke the connection. `docs/verbs.md` has the full table.
///
/// ```
/// use ibverbs::ibv_wc_status;
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
        IBV_WC_REM_INV_REQ_ERR => CompletionStatus::RemoteInvalidRequest,
        IBV_WC_RETRY_EXC_ERR | IBV_WC_RNR_RETRY_EXC_ERR | IBV_WC_RESP_TIMEOUT_ERR => {
            CompletionStatus::RetryExceeded
        }
        IBV_WC_WR_FLUSH_ERR => CompletionStatus::Flushed,
        _ => CompletionStatus::RemoteOperationError,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ibv_wc_status::*;

    /// Every status `verbs.h` defines, with the status it must map to.
    const TABLE: [(ibv_wc_status::Type, CompletionStatus); 24] = [
        (IBV_WC_SUCCESS, CompletionStatus::Success),
        (IBV_WC_LOC_LEN_ERR, CompletionStatus::LocalLengthError),
        (IBV_WC_LOC_QP_OP_ERR, CompletionStatus::RemoteOperationError),
        (
            IBV_WC_LOC_EEC_OP_ERR,
            CompletionStatus::RemoteOperationError,
        ),
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
        (
            IBV_WC_REM_ACCESS_ERR,
            CompletionStatus::RemoteOperationError,
        ),
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
