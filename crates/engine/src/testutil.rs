//! Helpers shared by the unit tests.

use fabrickv_types::KeyHash;

use crate::{GetResult, LargeValue, Mode, Partition, PartitionConfig, PutCond, PutResult};

/// Both modes, for tests that must hold in each.
pub fn both_modes() -> [Mode; 2] {
    [Mode::Cache, Mode::Store]
}

/// The real hash of a key.
pub fn h(key: &[u8]) -> KeyHash {
    KeyHash::of(key)
}

/// A partition with a pool big enough that small tests never fill it.
pub fn small(mode: Mode) -> Partition {
    sized(mode, 256 << 10, None)
}

/// A partition of a given pool size and bucket count.
pub fn sized(mode: Mode, pool_bytes: usize, index_buckets: Option<usize>) -> Partition {
    Partition::new(&PartitionConfig {
        mode,
        pool_bytes,
        index_buckets,
        memory: Default::default(),
    })
    .expect("valid config")
}

/// Asserts that `key` reads, at `now_ms`, as `value` expiring at
/// `expire_at_ms`.
#[track_caller]
pub fn assert_found(p: &mut Partition, key: &[u8], now_ms: u64, value: &[u8], expire_at_ms: u64) {
    assert_eq!(
        p.get(h(key), key, now_ms),
        GetResult::Found {
            value,
            expire_at_ms
        }
    );
}

/// Stores `value` under `key` with no condition at time 0, expiring at
/// `expire_at_ms`, and asserts that it is stored.
#[track_caller]
pub fn put_ok(p: &mut Partition, key: &[u8], value: &[u8], expire_at_ms: u64) {
    assert_eq!(
        p.put(h(key), key, value, expire_at_ms, PutCond::Always, 0),
        PutResult::Stored
    );
}

/// Stores the large `value` under `key` with no condition, no expiry,
/// at time 0.
pub fn put_large(p: &mut Partition, key: &[u8], value: LargeValue) -> PutResult {
    p.put_large(h(key), key, value, 0, PutCond::Always, 0)
}
