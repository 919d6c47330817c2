//! The copy's control ops that more than one step asks: the session's
//! STATUS, and the error a source's failed status becomes.

use fabrickv_client::ShardClient;
use fabrickv_wire::copy::{encode_session, Status};
use fabrickv_wire::shard::ShardOp;

use crate::error::{client, err, CopyError};

pub(crate) fn status(ctl: &mut ShardClient, session: u64) -> Result<Status, CopyError> {
    let b = ctl
        .copy_control(ShardOp::CopyStatus, "", |b| encode_session(b, session))
        .map_err(|e| client("STATUS", e))?;
    Status::decode(&b).map_err(|e| err(e.code(), e.to_string()))
}

pub(crate) fn source_failed(st: &Status) -> CopyError {
    err(
        st.error,
        format!("the source reports {}: {}", st.state.name(), st.message),
    )
}
