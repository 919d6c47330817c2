//! Splitting a copy's checkpoint into ranges of about equal bytes, on a
//! thread of its own (a pass over the keys, seconds on a large shard).

use std::time::Instant;

use fabrickv_storage::ShardSnapshot;
use fabrickv_types::ErrorCode;
use fabrickv_wire::copy::COPY_BOUNDARY_BYTES_MAX;

use super::{lock, CopyRun, SAMPLES_PER_RANGE};

/// Splits the run's snapshot into ranges (or takes the given ones)
/// and makes the run ready.
pub(super) fn split(s: &CopyRun, wanted: u32, given: Option<Vec<Vec<u8>>>) {
    let t = Instant::now();
    let result = match given {
        Some(b) => Ok((b, 0)),
        None => balanced_boundaries(s.snapshot.as_ref(), wanted, lock(&s.inner).pairs_estimate),
    };
    match result {
        Ok((boundaries, bytes)) => {
            let mut i = lock(&s.inner);
            i.ranges = boundaries.len() as u32 + 1;
            i.bytes_estimate = bytes;
            tracing::info!(
                run = s.id,
                ranges = i.ranges,
                ms = t.elapsed().as_millis() as u64,
                "copy checkpoint split"
            );
            i.boundaries = Some(boundaries);
        }
        Err(e) => s.fail(
            ErrorCode::StorageFailed,
            format!("splitting the checkpoint: {e}"),
        ),
    }
}

/// Lower bounds of ranges 1.. that split the snapshot into `wanted` ranges
/// of about equal bytes, and the estimated bytes of the shard. Each of
/// `wanted x SAMPLES_PER_RANGE` key samples (taken evenly by count) stands
/// for the pairs up to the next one, weighed by its own key and value size
/// (read from the index, not the blob files).
fn balanced_boundaries(
    snap: &dyn ShardSnapshot,
    wanted: u32,
    pairs_estimate: u64,
) -> fabrickv_storage::Result<(Vec<Vec<u8>>, u64)> {
    let samples = snap.sample_keys(wanted as usize * SAMPLES_PER_RANGE)?;
    if samples.is_empty() {
        return Ok((Vec::new(), 0));
    }
    let per_sample = (pairs_estimate as f64 / samples.len() as f64).max(1.0);
    let mut weights = Vec::with_capacity(samples.len());
    for k in &samples {
        let v = u64::from(snap.value_size(k)?.unwrap_or(0));
        weights.push((k.len() as u64 + v) as f64 * per_sample);
    }
    let total: f64 = weights.iter().sum();
    let mut boundaries: Vec<Vec<u8>> = Vec::new();
    let mut cum = 0.0;
    let mut next = 1u32;
    let mut bytes = 0usize;
    for (k, w) in samples.iter().zip(&weights) {
        // A boundary is the key where the bytes before it reach the next
        // share; the first sample is the shard's first key, never a bound.
        if next < wanted && cum >= total * f64::from(next) / f64::from(wanted) {
            if boundaries.last().is_none_or(|b| b < k) && bytes + k.len() <= COPY_BOUNDARY_BYTES_MAX
            {
                bytes += k.len();
                boundaries.push(k.clone());
            }
            while next < wanted && cum >= total * f64::from(next) / f64::from(wanted) {
                next += 1;
            }
        }
        cum += w;
    }
    Ok((boundaries, total as u64))
}
