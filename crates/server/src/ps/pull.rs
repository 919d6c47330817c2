//! A pull's copy of vectors out of the pool: a software pipeline of
//! prefetches over the request's keys, and what an absent key returns.

use std::sync::{RwLock, RwLockReadGuard};

use fabrickv_engine::{item_bytes, Partition};
use fabrickv_types::KeyHash;
use fabrickv_wire::ps::{init_vector, Missing};

use super::push::{key_of_slice, store_f32s};
use super::store::{read, Table};
use super::PS_ITEM_KEY_BYTES;

/// How many keys ahead of the copy each prefetch stage runs in [`gather`]:
/// bucket loads run `2 * PULL_PREFETCH_DISTANCE_KEYS` ahead, item loads
/// `PULL_PREFETCH_DISTANCE_KEYS` ahead. Far enough that a DRAM miss (about
/// 100 ns) is over when the copy reaches the key, near enough that the
/// lines in flight stay in L1 (16 keys x 9 lines of a 512-byte vector fit).
pub(super) const PULL_PREFETCH_DISTANCE_KEYS: usize = 6;

/// Cache lines (`BUCKET_BYTES` each) of an item, from its header, that
/// [`gather`] prefetches; the core's stream prefetcher, started by them,
/// brings the rest of the value. Prefetching every line of a 512-byte
/// vector (9 lines) filled the core's miss buffers, so the prefetch
/// instructions themselves stalled (most of gather's samples in `perf
/// annotate`): A/B here, pulls of 100 x 512 B from 1 M keys over shm ran
/// 2-24% faster with 4 lines, in each of 8 interleaved pairs.
pub(super) const PULL_PREFETCH_ITEM_LINES: usize = 4;

/// Copies the vectors of `keys` (in request order) into `dest`, sets the
/// found bits and fills absent keys by the table's policy. Returns the
/// number of absent keys.
///
/// A software pipeline over the keys: while key `i` is copied, the item
/// (header, key and value, whose size every key of a table shares) of key
/// `i + D` and the bucket of key `i + 2D` are loading, so the memory system
/// always has misses in flight and no pass waits for a whole batch.
pub(super) fn gather(
    t: &Table,
    shards: &[RwLock<Partition>],
    keys: &[([u8; PS_ITEM_KEY_BYTES], KeyHash)],
    shard_of: &[u32],
    dest: &mut [u8],
    found: &mut [u64],
    now_ms: u64,
) -> u64 {
    const D: usize = PULL_PREFETCH_DISTANCE_KEYS;
    let vb = t.vector_bytes();
    let state = t.state_bytes();
    let span = item_bytes(PS_ITEM_KEY_BYTES, state)
        .min(PULL_PREFETCH_ITEM_LINES * fabrickv_engine::BUCKET_BYTES);
    let n = keys.len();
    // The read lock of every shard the pull touches, taken once, in shard
    // order: writers hold one lock at a time and never wait while holding
    // one, so ascending order cannot deadlock.
    let mut used = vec![false; shards.len()];
    for &s in shard_of {
        used[s as usize] = true;
    }
    let guards: Vec<Option<RwLockReadGuard<'_, Partition>>> = shards
        .iter()
        .zip(&used)
        .map(|(shard, &u)| u.then(|| read(shard)))
        .collect();
    let mut misses = 0;
    for step in 0..n + 2 * D {
        if step < n {
            if let Some(p) = guards[shard_of[step] as usize].as_deref() {
                p.prefetch(keys[step].1);
            }
        }
        if let Some(i) = step.checked_sub(D).filter(|&i| i < n) {
            if let Some(p) = guards[shard_of[i] as usize].as_deref() {
                p.prefetch_item_span(keys[i].1, span);
            }
        }
        let Some(i) = step.checked_sub(2 * D) else {
            continue;
        };
        let (k, h) = &keys[i];
        let v = guards[shard_of[i] as usize]
            .as_deref()
            .and_then(|p| p.peek(*h, k, now_ms))
            .filter(|v| v.len() == state);
        let out = &mut dest[i * vb..(i + 1) * vb];
        match v {
            Some(v) => {
                out.copy_from_slice(&v[..vb]);
                found[i / 64] |= 1 << (i % 64);
            }
            None => {
                misses += 1;
                fill_missing(t, key_of_slice(k), out);
            }
        }
    }
    misses
}

/// What a pull returns for an absent key.
pub(super) fn fill_missing(t: &Table, key: u64, out: &mut [u8]) {
    match t.spec.missing {
        Missing::Zeros => out.fill(0),
        Missing::Init => {
            let mut v = vec![0f32; t.spec.dim as usize];
            init_vector(t.spec.seed, key, &mut v);
            store_f32s(&v, out);
        }
    }
}

pub(super) fn write_bitmap(out: &mut [u8], found: &[u64]) {
    for (o, w) in out.chunks_exact_mut(8).zip(found) {
        o.copy_from_slice(&w.to_le_bytes());
    }
}
