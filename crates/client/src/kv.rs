//! The key-value calls every kv client offers ([`Kv`]), written once over
//! its `execute`: a [`crate::Client`] runs them on one server, a
//! [`crate::ClusterClient`] splits them across a cluster.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use fabrickv_types::limits::{LARGE_CHUNK_BYTES_MAX, LARGE_VALUE_BYTES_MAX, VALUE_BYTES_MAX};
use fabrickv_types::ErrorCode;
use fabrickv_wire::{PutCondition, LARGE_RESULT_BYTES};

use crate::{BatchOp, ClientError, Outcome, Result};

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
    /// own, in GET_CHUNK pieces.
    fn mget<K: AsRef<[u8]>>(&mut self, keys: &[K]) -> Result<Vec<Option<Vec<u8>>>> {
        let ops: Vec<_> = keys
            .iter()
            .map(|k| BatchOp::Get { key: k.as_ref() })
            .collect();
        let outcomes = self.execute(&ops)?;
        let mut values = Vec::with_capacity(outcomes.len());
        for (o, k) in outcomes.into_iter().zip(keys) {
            values.push(match o.code {
                ErrorCode::Ok => Some(o.value),
                ErrorCode::NotFound => None,
                ErrorCode::LargeValue => Some(get_large(self, k.as_ref(), &o.value)?),
                _ => return Err(o.into_error()),
            });
        }
        Ok(values)
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
    fn execute(&mut self, ops: &[BatchOp<'_>]) -> Result<Vec<Outcome>> {
        crate::batch::execute(self, ops)
    }
}

impl Kv for crate::ClusterClient {
    fn execute(&mut self, ops: &[BatchOp<'_>]) -> Result<Vec<Outcome>> {
        crate::ClusterClient::execute(self, ops)
    }
}

/// PUT_CHUNK or GET_CHUNK pieces of one value in flight at once (4 MiB):
/// the client sends the next while the server copies the last.
pub const LARGE_CHUNKS_IN_FLIGHT: usize = 4;

/// Transfer ids of this process's PUT_CHUNK transfers: a connection holds
/// one transfer at a time, so ids only have to differ from the previous.
static NEXT_TRANSFER: AtomicU64 = AtomicU64::new(1);

/// Stores a value over `VALUE_BYTES_MAX` as PUT_CHUNK pieces of at most
/// `LARGE_CHUNK_BYTES_MAX`, in order, [`LARGE_CHUNKS_IN_FLIGHT`] per round
/// trip; the server
/// stores it (TTL and condition apply then) when the last piece is in.
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
    let transfer = NEXT_TRANSFER.fetch_add(1, Ordering::Relaxed);
    let total = value.len() as u64;
    let ops: Vec<_> = value
        .chunks(LARGE_CHUNK_BYTES_MAX)
        .enumerate()
        .map(|(i, piece)| BatchOp::PutChunk {
            key,
            transfer,
            total,
            offset: (i * LARGE_CHUNK_BYTES_MAX) as u64,
            bytes: piece,
            ttl_ms,
            cond,
        })
        .collect();
    // A window of pieces in flight at once; a worker runs one
    // connection's frames in order, so they arrive in order.
    for window in ops.chunks(LARGE_CHUNKS_IN_FLIGHT) {
        let outcomes = kv.execute(window)?;
        if outcomes.len() != window.len() {
            return Err(ClientError::Protocol("missing result".into()));
        }
        // The first refusal explains the rest (later pieces of a dropped
        // transfer answer NO_SUCH_TRANSFER).
        if let Some(o) = outcomes.into_iter().find(|o| o.code != ErrorCode::Ok) {
            return match o.code {
                ErrorCode::ConditionFailed => Ok(false),
                _ => Err(o.into_error()),
            };
        }
    }
    Ok(true)
}

/// Reads the value a GET answered `LARGE_VALUE` for (`head`: its total
/// length and pin tag) in GET_CHUNK pieces, into one buffer.
fn get_large<K: Kv + ?Sized>(kv: &mut K, key: &[u8], head: &[u8]) -> Result<Vec<u8>> {
    if head.len() != LARGE_RESULT_BYTES {
        return Err(ClientError::Protocol("bad LARGE_VALUE result".into()));
    }
    let le = |b: &[u8]| {
        let mut w = [0u8; 8];
        w.copy_from_slice(b);
        u64::from_le_bytes(w)
    };
    let (total, tag) = (le(&head[..8]), le(&head[8..]));
    if total > LARGE_VALUE_BYTES_MAX as u64 {
        return Err(ClientError::Protocol(format!(
            "LARGE_VALUE of {total} bytes exceeds {LARGE_VALUE_BYTES_MAX}"
        )));
    }
    let total = total as usize;
    let mut value = Vec::with_capacity(total);
    while value.len() < total {
        let ops: Vec<_> = (0..LARGE_CHUNKS_IN_FLIGHT)
            .map(|i| value.len() + i * LARGE_CHUNK_BYTES_MAX)
            .take_while(|&at| at < total)
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
    Ok(value)
}

/// A TTL in wire milliseconds: at least 1 ms (0 means none), saturating
/// so that a TTL too large for the wire is refused (`TTL_TOO_LARGE`) by the
/// server rather than wrapped to a short one.
pub(crate) fn ttl_ms(ttl: Option<Duration>) -> u64 {
    ttl.map_or(0, |d| {
        u64::try_from(d.as_millis()).unwrap_or(u64::MAX).max(1)
    })
}
