//! GET, PUT and DELETE on a served shard (payloads in
//! `fabrickv_wire::shard_data`).
//!
//! A data op runs on the worker thread that received its frame, to the
//! end: a PUT or DELETE returns only after the shard's journal is synced
//! (`Durability::Sync`), so the reply the worker sends next is an
//! acknowledgement of a durable write. Every entry is decoded and checked
//! before anything is written, so a refused batch writes nothing.

use fabrickv_storage::{Durability, ShardBackend, StorageError, Write};
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
/// Generic over the backend, so that the per-key calls of a batch are
/// static (and inlined) for the backend a server serves.
pub(crate) fn execute<S: ShardBackend + ?Sized>(
    shard: &S,
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
pub(crate) fn write<S: ShardBackend + ?Sized>(
    shard: &S,
    writes: &[Write<'_>],
) -> Result<(), Refusal> {
    shard
        .write(writes, Durability::Sync)
        .map_err(storage_refusal)
}

#[cfg(test)]
mod tests {
    //! The data ops against the in-memory backend: they need only the
    //! `ShardBackend` trait, not fjall.

    use fabrickv_storage::MemShard;
    use fabrickv_types::ErrorCode;
    use fabrickv_wire::decode_frame;
    use fabrickv_wire::shard::decode_request;
    use fabrickv_wire::shard_data::{decode_get_reply, encode_delete, encode_get, encode_put};

    use super::execute;

    /// Runs the request that `encode` appends against `shard`; the reply
    /// payload.
    fn run(shard: &MemShard, encode: impl FnOnce(&mut Vec<u8>)) -> Vec<u8> {
        let mut msg = Vec::new();
        encode(&mut msg);
        let frame = decode_frame(&msg).expect("frame");
        let req = decode_request(&frame).expect("request");
        let mut out = Vec::new();
        execute(shard, &req, &mut out).expect("op runs");
        out
    }

    #[test]
    fn put_get_delete_on_an_in_memory_shard() {
        let shard = MemShard::new();
        run(&shard, |b| {
            encode_put(b, 1, 0, "s", &[(b"k1", b"v1"), (b"k2", b"v2")])
        });
        run(&shard, |b| encode_delete(b, 2, 0, "s", &[b"k2"]));
        let got = run(&shard, |b| encode_get(b, 3, 0, "s", &[b"k1", b"k2"]));
        let results = decode_get_reply(&got).expect("get reply");
        let r: Vec<(ErrorCode, &[u8])> = results.iter().map(|r| (r.code, r.value)).collect();
        assert_eq!(
            r,
            vec![(ErrorCode::Ok, &b"v1"[..]), (ErrorCode::NotFound, &b""[..])]
        );
    }
}
