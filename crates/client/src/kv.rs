//! The key-value calls every kv client offers ([`Kv`]), written once over
//! its `execute`: a [`crate::Client`] runs them on one server, a
//! [`crate::ClusterClient`] splits them across a cluster.

use std::time::Duration;

use fabrickv_types::ErrorCode;
use fabrickv_wire::PutCondition;

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

    /// Reads many keys, all in flight at once; results in order.
    fn mget<K: AsRef<[u8]>>(&mut self, keys: &[K]) -> Result<Vec<Option<Vec<u8>>>> {
        let ops: Vec<_> = keys
            .iter()
            .map(|k| BatchOp::Get { key: k.as_ref() })
            .collect();
        self.execute(&ops)?
            .into_iter()
            .map(|o| match o.code {
                ErrorCode::Ok => Ok(Some(o.value)),
                ErrorCode::NotFound => Ok(None),
                _ => Err(o.into_error()),
            })
            .collect()
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

/// A TTL in wire milliseconds: at least 1 ms (0 means none), saturating
/// so that a TTL too large for the wire is refused (`TTL_TOO_LARGE`) by the
/// server rather than wrapped to a short one.
pub(crate) fn ttl_ms(ttl: Option<Duration>) -> u64 {
    ttl.map_or(0, |d| {
        u64::try_from(d.as_millis()).unwrap_or(u64::MAX).max(1)
    })
}
