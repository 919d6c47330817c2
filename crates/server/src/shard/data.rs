//! GET, PUT and DELETE on a served shard.

use fabrickv_storage::FjallShard;
use fabrickv_types::ErrorCode;
use fabrickv_wire::shard::ShardMessage;

/// Runs one data op against `shard`; appends the reply payload to `out`.
pub(crate) fn execute(
    _shard: &FjallShard,
    req: &ShardMessage<'_>,
    _out: &mut Vec<u8>,
) -> Result<(), (ErrorCode, String)> {
    Err((
        ErrorCode::UnknownOpcode,
        format!("shard op {:?} is not served yet", req.op),
    ))
}
