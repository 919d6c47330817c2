//! The key-value calls every kv client offers ([`Kv`]), written once over
//! its `execute` (and `execute_into`, which lands GET values in the
//! caller's [`MgetBuf`]): a [`crate::Client`] runs them on one server, a
//! [`crate::ClusterClient`] splits them across a cluster. `get` and `mget`
//! are `mget_into`, so reads have one decode path.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use fabrickv_types::limits::{LARGE_CHUNK_BYTES_MAX, LARGE_VALUE_BYTES_MAX, VALUE_BYTES_MAX};
use fabrickv_types::ErrorCode;
use fabrickv_wire::PutCondition;

use crate::batch::Sink;
use crate::large::{LargeGet, LargePut};
use crate::mget::{large_head, Large};
use crate::{BatchOp, ClientError, MgetBuf, Outcome, Result};

/// Reads, writes and deletes of keys, over a client's batch executor.
///
/// Import it (`use fabrickv_client::Kv;`) to call `get`, `put`, `mget`...
/// on a `Client` or a `ClusterClient`.
pub trait Kv {
    /// Runs any mix of operations; one outcome per operation, in order.
    /// Per-operation errors are outcomes, not `Err`.
    fn execute(&mut self, ops: &[BatchOp<'_>]) -> Result<Vec<Outcome>>;

    /// Reads a key; `None` if it is absent or expired.
    fn get(&mut self, key: &[u8]) -> Result<Option<Vec<u8>>> {
        Ok(self.mget(&[key])?.pop().flatten())
    }

    /// Stores a value with no expiry.
    fn put(&mut self, key: &[u8], value: &[u8]) -> Result<()> {
        self.put_with(key, value, None, PutCondition::Always)
            .map(|_| ())
    }

    /// Stores a value that expires after `ttl`.
    fn put_ttl(&mut self, key: &[u8], value: &[u8], ttl: Option<Duration>) -> Result<()> {
        self.put_with(key, value, ttl, PutCondition::Always)
            .map(|_| ())
    }

    /// Stores a value under a condition; `Ok(false)` if the condition
    /// (absent / present) did not hold.
    fn put_with(
        &mut self,
        key: &[u8],
        value: &[u8],
        ttl: Option<Duration>,
        cond: PutCondition,
    ) -> Result<bool> {
        if value.len() > VALUE_BYTES_MAX {
            return put_large(self, key, value, ttl_ms(ttl), cond);
        }
        let op = BatchOp::Put {
            key,
            value,
            ttl_ms: ttl_ms(ttl),
            cond,
        };
        match self.execute(&[op])?.pop() {
            Some(Outcome {
                code: ErrorCode::Ok,
                ..
            }) => Ok(true),
            Some(Outcome {
                code: ErrorCode::ConditionFailed,
                ..
            }) => Ok(false),
            Some(o) => Err(o.into_error()),
            None => Err(ClientError::Protocol("missing result".into())),
        }
    }

    /// Removes a key; `Ok(false)` if it was not there.
    fn delete(&mut self, key: &[u8]) -> Result<bool> {
        Ok(self.mdelete(&[key])?.pop().unwrap_or(false))
    }

    /// Reads many keys, all in flight at once; results in order. A value
    /// over `VALUE_BYTES_MAX` (answered `LARGE_VALUE`) is then read on its
    /// own, in GET_CHUNK pieces. [`Kv::mget_into`] with a fresh buffer.
    fn mget<K: AsRef<[u8]>>(&mut self, keys: &[K]) -> Result<Vec<Option<Vec<u8>>>> {
        let mut buf = MgetBuf::new();
        self.mget_into(keys, &mut buf)?;
        Ok(buf.into_vecs())
    }

    /// [`Kv::mget`] into the caller's buffer: the values are copied from
    /// the reply frames straight into `buf` (cleared first, its allocation
    /// kept), so a call allocates per frame and never per key, and nothing
    /// at all for values once `buf` has grown to the workload. Values over
    /// `VALUE_BYTES_MAX` are read in GET_CHUNK pieces into `buf` too.
    ///
    /// Fails as `mget` does: with the code of the first key (in `keys`'
    /// order) the server refused. After an error `buf`'s contents are
    /// unspecified.
    fn mget_into<K: AsRef<[u8]>>(&mut self, keys: &[K], buf: &mut MgetBuf) -> Result<()> {
        let ops: Vec<_> = keys
            .iter()
            .map(|k| BatchOp::Get { key: k.as_ref() })
            .collect();
        buf.start(keys.len());
        self.execute_into(&ops, buf)?;
        let refused = buf.finish_batch()?;
        // Large values in key order, up to the first refused key, as
        // `mget` always read them: a failure there is the call's error.
        let stop = refused.map_or(usize::MAX, |(pos, _)| pos);
        let mut i = 0;
        while let Some(l) = buf.large(i).filter(|l| l.pos < stop) {
            read_large(self, keys[l.pos].as_ref(), l, buf)?;
            i += 1;
        }
        match refused {
            Some((_, code)) => Err(ClientError::Server {
                code,
                message: String::new(),
            }),
            None => Ok(()),
        }
    }

    /// Runs a batch of GETs, landing each result in `buf` (by position).
    /// `Client` and `ClusterClient` decode the reply frames straight into
    /// it; this default (for other implementors) lands `execute`'s
    /// outcomes.
    #[doc(hidden)]
    fn execute_into(&mut self, ops: &[BatchOp<'_>], buf: &mut MgetBuf) -> Result<()> {
        for (pos, o) in self.execute(ops)?.into_iter().enumerate() {
            buf.land(pos, o.code, &o.value)?;
        }
        Ok(())
    }

    /// Reads the GET_CHUNK pieces of a pinned large value, appending
    /// them to `value`. `Client` and `ClusterClient` stream them
    /// (`crate::large`); this default (for other implementors) runs them
    /// through `execute`.
    #[doc(hidden)]
    fn read_large_pieces(&mut self, get: &LargeGet<'_>, value: &mut Vec<u8>) -> Result<()> {
        get_large_into(self, get, value)
    }

    /// Sends a large value's PUT_CHUNK pieces; returns the first refused
    /// piece's code, else the last piece's. `Client` and `ClusterClient`
    /// stream them (`crate::large`); this default (for other implementors)
    /// runs them through `execute`.
    #[doc(hidden)]
    fn write_large_pieces(&mut self, put: &LargePut<'_>) -> Result<ErrorCode> {
        put_pieces(self, put)
    }

    /// Stores many values, all in flight at once; fails on the first
    /// refused one (the others have been applied).
    fn mput<K: AsRef<[u8]>, V: AsRef<[u8]>>(
        &mut self,
        items: &[(K, V)],
        ttl: Option<Duration>,
    ) -> Result<()> {
        let ttl_ms = ttl_ms(ttl);
        let ops: Vec<_> = items
            .iter()
            .map(|(k, v)| BatchOp::Put {
                key: k.as_ref(),
                value: v.as_ref(),
                ttl_ms,
                cond: PutCondition::Always,
            })
            .collect();
        for o in self.execute(&ops)? {
            if o.code != ErrorCode::Ok {
                return Err(o.into_error());
            }
        }
        Ok(())
    }

    /// Removes many keys; for each, whether it was there.
    fn mdelete<K: AsRef<[u8]>>(&mut self, keys: &[K]) -> Result<Vec<bool>> {
        let ops: Vec<_> = keys
            .iter()
            .map(|k| BatchOp::Delete { key: k.as_ref() })
            .collect();
        self.execute(&ops)?
            .into_iter()
            .map(|o| match o.code {
                ErrorCode::Ok => Ok(true),
                ErrorCode::NotFound => Ok(false),
                _ => Err(o.into_error()),
            })
            .collect()
    }
}

impl Kv for crate::Client {
    fn read_large_pieces(&mut self, get: &LargeGet<'_>, value: &mut Vec<u8>) -> Result<()> {
        self.read_pieces(get, value)
    }

    fn write_large_pieces(&mut self, put: &LargePut<'_>) -> Result<ErrorCode> {
        self.write_pieces(put)
    }

    fn execute(&mut self, ops: &[BatchOp<'_>]) -> Result<Vec<Outcome>> {
        crate::batch::execute(self, ops)
    }

    fn execute_into(&mut self, ops: &[BatchOp<'_>], buf: &mut MgetBuf) -> Result<()> {
        crate::batch::validate(ops)?;
        crate::batch::refresh_if_stale(self, ops);
        let mut again = std::mem::take(&mut buf.again);
        let r = crate::batch::run_valid(self, ops, buf, &mut again);
        buf.again = again;
        r
    }
}

impl Kv for crate::ClusterClient {
    fn read_large_pieces(&mut self, get: &LargeGet<'_>, value: &mut Vec<u8>) -> Result<()> {
        self.with_reader_of(get.key, |c| c.read_pieces(get, value))
    }

    fn write_large_pieces(&mut self, put: &LargePut<'_>) -> Result<ErrorCode> {
        self.with_server_of(put.key, |c| c.write_pieces(put))
    }

    fn execute(&mut self, ops: &[BatchOp<'_>]) -> Result<Vec<Outcome>> {
        crate::ClusterClient::execute(self, ops)
    }

    fn execute_into(&mut self, ops: &[BatchOp<'_>], buf: &mut MgetBuf) -> Result<()> {
        let mut again = std::mem::take(&mut buf.again);
        let r = self.run(ops, buf, &mut again);
        buf.again = again;
        r
    }
}

/// PUT_CHUNK or GET_CHUNK pieces of one value in flight at once through
/// `execute` (the default pieces path, for a `Kv` that is neither a
/// `Client` nor a `ClusterClient`, which stream theirs).
const EXECUTE_CHUNKS_IN_FLIGHT: usize = 4;

/// Transfer ids of this process's PUT_CHUNK transfers: a connection holds
/// one transfer at a time, so ids only have to differ from the previous.
static NEXT_TRANSFER: AtomicU64 = AtomicU64::new(1);

/// Stores a value over `VALUE_BYTES_MAX` as PUT_CHUNK pieces of at most
/// `LARGE_CHUNK_BYTES_MAX`, in order ([`Kv::write_large_pieces`]); the
/// server stores it (TTL and condition apply then) when the last piece
/// is in.
fn put_large<K: Kv + ?Sized>(
    kv: &mut K,
    key: &[u8],
    value: &[u8],
    ttl_ms: u64,
    cond: PutCondition,
) -> Result<bool> {
    if value.len() > LARGE_VALUE_BYTES_MAX {
        return Err(ClientError::Invalid(
            ErrorCode::ValueTooLarge,
            format!(
                "value of {} bytes exceeds {LARGE_VALUE_BYTES_MAX}",
                value.len()
            ),
        ));
    }
    let put = LargePut {
        key,
        value,
        transfer: NEXT_TRANSFER.fetch_add(1, Ordering::Relaxed),
        ttl_ms,
        cond,
    };
    match kv.write_large_pieces(&put)? {
        ErrorCode::Ok => Ok(true),
        ErrorCode::ConditionFailed => Ok(false),
        code => Err(ClientError::Server {
            code,
            message: String::new(),
        }),
    }
}

/// The PUT_CHUNK pieces of `value` through `execute`, a window of
/// [`EXECUTE_CHUNKS_IN_FLIGHT`] per round trip: the default
/// [`Kv::write_large_pieces`].
fn put_pieces<K: Kv + ?Sized>(kv: &mut K, put: &LargePut<'_>) -> Result<ErrorCode> {
    let total = put.value.len() as u64;
    let ops: Vec<_> = put
        .value
        .chunks(LARGE_CHUNK_BYTES_MAX)
        .enumerate()
        .map(|(i, piece)| BatchOp::PutChunk {
            key: put.key,
            transfer: put.transfer,
            total,
            offset: (i * LARGE_CHUNK_BYTES_MAX) as u64,
            bytes: piece,
            ttl_ms: put.ttl_ms,
            cond: put.cond,
        })
        .collect();
    // A worker runs one connection's frames in order, so they arrive in
    // order.
    for window in ops.chunks(EXECUTE_CHUNKS_IN_FLIGHT) {
        let outcomes = kv.execute(window)?;
        if outcomes.len() != window.len() {
            return Err(ClientError::Protocol("missing result".into()));
        }
        // The first refusal explains the rest (later pieces of a dropped
        // transfer answer NO_SUCH_TRANSFER).
        if let Some(o) = outcomes.into_iter().find(|o| o.code != ErrorCode::Ok) {
            return Ok(o.code);
        }
    }
    Ok(ErrorCode::Ok)
}

/// Reads the large value of key `l.pos` into `buf`. A connection pins one
/// value at a time, so of two keys answered `LARGE_VALUE` on one
/// connection in one batch only the later is still pinned: the earlier's
/// GET_CHUNK is answered `NO_SUCH_TRANSFER`, and the key is read again
/// on its own (a fresh GET, and its pin) once; so is a key one of whose
/// pieces arrived torn (`BAD_CHECKSUM`, see `crate::large`).
fn read_large<K: Kv + ?Sized>(kv: &mut K, key: &[u8], l: Large, buf: &mut MgetBuf) -> Result<()> {
    let start = buf.data().len();
    match kv.read_large_pieces(&LargeGet::of(key, l), buf.data_mut()) {
        Ok(()) => {
            buf.set_span(l.pos, start);
            Ok(())
        }
        Err(e) if matches!(e.code(), ErrorCode::NoSuchTransfer | ErrorCode::BadChecksum) => {
            buf.data_mut().truncate(start);
            let o = kv
                .execute(&[BatchOp::Get { key }])?
                .pop()
                .ok_or_else(|| ClientError::Protocol("missing result".into()))?;
            match o.code {
                ErrorCode::Ok => {
                    buf.data_mut().extend_from_slice(&o.value);
                    buf.set_span(l.pos, start);
                }
                ErrorCode::NotFound => buf.clear_span(l.pos),
                ErrorCode::LargeValue => {
                    let again = large_head(l.pos, &o.value)?;
                    kv.read_large_pieces(&LargeGet::of(key, again), buf.data_mut())?;
                    buf.set_span(l.pos, start);
                }
                _ => return Err(o.into_error()),
            }
            Ok(())
        }
        Err(e) => Err(e),
    }
}

/// Reads the value a GET answered `LARGE_VALUE` for (`total` bytes long,
/// pinned under `tag`) in GET_CHUNK pieces through `execute`, appending it
/// to `value`: the default [`Kv::read_large_pieces`].
fn get_large_into<K: Kv + ?Sized>(
    kv: &mut K,
    get: &LargeGet<'_>,
    value: &mut Vec<u8>,
) -> Result<()> {
    let LargeGet { key, total, tag } = *get;
    let start = value.len();
    value.reserve(total);
    // The server unpins the value once its last piece is read, so the
    // last piece never shares a round with others: a short last piece
    // fits the reply frame beside the first where the pieces between are
    // answered REPLY_FULL, and reading it would unpin them.
    let last = total.saturating_sub(1) / LARGE_CHUNK_BYTES_MAX * LARGE_CHUNK_BYTES_MAX;
    while value.len() - start < total {
        let from = value.len() - start;
        let ops: Vec<_> = (0..EXECUTE_CHUNKS_IN_FLIGHT)
            .map(|i| from + i * LARGE_CHUNK_BYTES_MAX)
            .take_while(|&at| at < total && (at < last || at == from))
            .map(|at| BatchOp::GetChunk {
                key,
                tag,
                offset: at as u64,
                len: (total - at).min(LARGE_CHUNK_BYTES_MAX) as u32,
            })
            .collect();
        let outcomes = kv.execute(&ops)?;
        if outcomes.len() != ops.len() {
            return Err(ClientError::Protocol("missing result".into()));
        }
        for (o, op) in outcomes.into_iter().zip(&ops) {
            let BatchOp::GetChunk { len, .. } = *op else {
                continue;
            };
            if o.code != ErrorCode::Ok {
                return Err(o.into_error());
            }
            if o.value.len() != len as usize {
                return Err(ClientError::Protocol(
                    "GET_CHUNK of the wrong length".into(),
                ));
            }
            value.extend_from_slice(&o.value);
        }
    }
    Ok(())
}

/// A TTL in wire milliseconds: at least 1 ms (0 means none), saturating
/// so that a TTL too large for the wire is refused (`TTL_TOO_LARGE`) by the
/// server rather than wrapped to a short one.
pub(crate) fn ttl_ms(ttl: Option<Duration>) -> u64 {
    ttl.map_or(0, |d| {
        u64::try_from(d.as_millis()).unwrap_or(u64::MAX).max(1)
    })
}
