//! The verification at the end of a copy: the target shard is scanned
//! whole, range by range on several threads, and each range's digest must
//! equal the one the source sent for it (its END_OF_RANGE frame's running
//! digest, recorded in the progress file).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use fabrickv_storage::ShardBackend;
use fabrickv_types::{Digest, ErrorCode};
use fabrickv_wire::copy::range_bounds;

use crate::error::{err, storage, CopyError};
use crate::lock;

/// Scans `shard` by the ranges `boundaries` cut, `threads` at once, and
/// compares each range's digest with `wanted` (the source's); the first
/// range that differs is the error, with both sides' counts.
pub(crate) fn verify<S: ShardBackend>(
    shard: &S,
    boundaries: &[Vec<u8>],
    wanted: &[Digest],
    threads: usize,
) -> Result<(), CopyError> {
    let got = scan_ranges(shard, boundaries, threads)?;
    match (0..got.len()).find(|&r| wanted.get(r) != Some(&got[r])) {
        None if got.len() == wanted.len() => Ok(()),
        None => Err(err(
            ErrorCode::Internal,
            format!(
                "the copy has {} ranges, the source sent {}",
                got.len(),
                wanted.len()
            ),
        )),
        Some(r) => {
            let want = wanted.get(r).copied().unwrap_or_default();
            Err(err(
                ErrorCode::BadChecksum,
                format!(
                    "range {r} of the copy holds {} pairs, {} bytes, digest {}; the source sent {} pairs, {} bytes, digest {}",
                    got[r].pairs,
                    got[r].bytes,
                    got[r].hex(),
                    want.pairs,
                    want.bytes,
                    want.hex()
                ),
            ))
        }
    }
}

/// The digest of each range of `shard` (bounds as the copy's), scanned
/// by `threads` threads at once (the whole copy is read back).
fn scan_ranges<S: ShardBackend>(
    shard: &S,
    boundaries: &[Vec<u8>],
    threads: usize,
) -> Result<Vec<Digest>, CopyError> {
    let snap = shard.snapshot();
    let n = boundaries.len() + 1;
    let next = AtomicU64::new(0);
    let out: Mutex<Vec<Option<Result<Digest, CopyError>>>> = Mutex::new(vec![None; n]);
    std::thread::scope(|scope| {
        for _ in 0..threads.clamp(1, n) {
            scope.spawn(|| loop {
                let r = next.fetch_add(1, Ordering::Relaxed) as usize;
                if r >= n {
                    return;
                }
                let (from, to) = range_bounds(boundaries, r);
                let mut d = Digest::default();
                let res = snap
                    .scan_each(from, to, &mut |k, v| {
                        d.add(k, v);
                        Ok(true)
                    })
                    .map(|()| d)
                    .map_err(|e| storage(&format!("scanning range {r} of the copy"), e));
                lock(&out)[r] = Some(res);
            });
        }
    });
    let results = out.into_inner().unwrap_or_else(|p| p.into_inner());
    results
        .into_iter()
        .map(|r| r.unwrap_or_else(|| Err(err(ErrorCode::Internal, "a range was not scanned"))))
        .collect()
}
