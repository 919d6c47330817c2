//! GET, PUT and DELETE on a served shard (payloads in
//! `fabrickv_wire::shard_data`).
//!
//! A data op runs on the worker thread that received its frame, to the
//! end: a PUT or DELETE returns only after the shard's journal is synced
//! (`Durability::Sync`), so the reply the worker sends next is an
//! acknowledgement of a durable write. Every entry is decoded and checked
//! before anything is written, so a refused batch writes nothing.

use fabrickv_storage::{Durability, FjallShard, ShardBackend, StorageError, Write};
use fabrickv_types::ErrorCode;
use fabrickv_wire::shard::{ShardMessage, ShardOp};
use fabrickv_wire::shard_data::{
    decode_keys, decode_pairs, DataError, GetReplyWriter, SHARD_DATA_KEY_BYTES_MAX,
    SHARD_DATA_VALUE_BYTES_MAX,
};

use crate::service::Refusal;

const _: () = assert!(
    SHARD_DATA_KEY_BYTES_MAX == fabrickv_storage::SHARD_KEY_BYTES_MAX,
    "every key a shard stores can be named on the wire, and no other"
);
const _: () = assert!(
    SHARD_DATA_VALUE_BYTES_MAX <= fabrickv_storage::SHARD_VALUE_BYTES_MAX,
    "every value the wire carries can be stored"
);

fn refused(e: DataError) -> Refusal {
    (e.code, e.why.to_string())
}

/// The refusal for a storage error: bounds keep their codes; anything else
/// (the engine, the disk, a full disk) is `STORAGE_FAILED` with the
/// engine's words, and the operation did not happen.
pub(crate) fn storage_refusal(e: StorageError) -> Refusal {
    match e {
        StorageError::TooLarge(why) => (ErrorCode::ValueTooLarge, why),
        e => (
            ErrorCode::StorageFailed,
            format!("shard storage failed: {e}"),
        ),
    }
}

/// Runs one data op against `shard`; appends the reply payload to `out`.
pub(crate) fn execute(
    shard: &FjallShard,
    req: &ShardMessage<'_>,
    out: &mut Vec<u8>,
) -> Result<(), Refusal> {
    match req.op {
        ShardOp::Get => {
            let keys = decode_keys(req.payload).map_err(refused)?;
            let mut w = GetReplyWriter::begin(out, keys.len());
            for key in keys.iter() {
                match shard.get(key).map_err(storage_refusal)? {
                    None => w.push(out, ErrorCode::NotFound, &[]),
                    Some(v) if v.len() > SHARD_DATA_VALUE_BYTES_MAX => {
                        w.push(out, ErrorCode::ValueTooLarge, &[])
                    }
                    Some(v) if w.fits(out, v.len()) => w.push(out, ErrorCode::Ok, &v),
                    Some(_) => w.push(out, ErrorCode::ReplyFull, &[]),
                }
            }
            Ok(())
        }
        ShardOp::Put => {
            let pairs = decode_pairs(req.payload).map_err(refused)?;
            let writes: Vec<Write<'_>> = pairs.iter().map(|(k, v)| Write::Put(k, v)).collect();
            write(shard, &writes)
        }
        ShardOp::Delete => {
            let keys = decode_keys(req.payload).map_err(refused)?;
            let writes: Vec<Write<'_>> = keys.iter().map(Write::Delete).collect();
            write(shard, &writes)
        }
        op => Err((
            ErrorCode::UnknownOpcode,
            format!("shard op {op:?} is not a data op"),
        )),
    }
}

/// Applies `writes` as one atomic batch, durable before it returns.
pub(crate) fn write(shard: &FjallShard, writes: &[Write<'_>]) -> Result<(), Refusal> {
    shard
        .write(writes, Durability::Sync)
        .map_err(storage_refusal)
}
