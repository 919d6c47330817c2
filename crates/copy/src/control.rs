//! The copy's control ops that more than one step asks: the run's
//! STATUS, and the error a source's failed status becomes.

use fabrickv_client::ShardClient;
use fabrickv_wire::copy::{encode_run_id, Status};
use fabrickv_wire::shard::ShardOp;

use crate::error::{client, err, printable, CopyError};

pub(crate) fn status(ctl: &mut ShardClient, run_id: u64) -> Result<Status, CopyError> {
    let b = ctl
        .copy_control(ShardOp::CopyStatus, "", |b| encode_run_id(b, run_id))
        .map_err(|e| client("STATUS", e))?;
    Status::decode(&b).map_err(|e| err(e.code(), e.to_string()))
}

pub(crate) fn source_failed(st: &Status) -> CopyError {
    err(
        st.error,
        format!(
            "the source reports {}: {}",
            st.state.name(),
            printable(&st.message)
        ),
    )
}

#[cfg(test)]
mod tests {
    use fabrickv_types::ErrorCode;
    use fabrickv_wire::copy::{CopyState, Status};

    use super::source_failed;

    #[test]
    fn a_source_status_message_is_shown_with_its_control_characters_escaped() {
        let st = Status {
            state: CopyState::Error,
            ready: false,
            error: ErrorCode::StorageFailed,
            ranges: 0,
            ranges_done: 0,
            pairs_sent: 0,
            bytes_sent: 0,
            pairs_estimate: 0,
            bytes_estimate: 0,
            message: "read failed\u{1b}[2J\u{1b}[1;1Hcopy DONE".into(),
            boundaries: Vec::new(),
        };
        let shown = source_failed(&st).to_string();
        assert!(!shown.chars().any(char::is_control), "{shown:?}");
        assert!(shown.contains("read failed\\u{1b}[2J"), "{shown}");
    }
}
