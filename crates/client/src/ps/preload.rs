//! Bulk load and check of a key range of one table, PetPS's preload and
//! `--check_after_preload`: what `fabrickv ps preload` and the benchmarks
//! run before they measure.

use std::collections::VecDeque;

use fabrickv_wire::ps::TableDesc;

use super::{PsClient, PullId};
use crate::Result;

/// Keys per preload or verify request: PetPS's batch size.
pub const PS_LOAD_BATCH_KEYS: usize = 500;

/// Requests a preload keeps in flight.
pub const PS_LOAD_WINDOW: usize = 8;

/// What a verify pass found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct VerifyReport {
    /// Keys checked.
    pub checked: u64,
    /// Keys the table did not hold.
    pub missing: u64,
    /// Keys whose vector differed from the initializer.
    pub wrong: u64,
    /// The first few failing keys, for the report.
    pub first_failures: Vec<u64>,
}

/// Failing keys a [`VerifyReport`] lists.
pub const VERIFY_FAILURES_LISTED: usize = 10;

impl VerifyReport {
    /// Whether every key was there with the expected vector.
    pub fn ok(&self) -> bool {
        self.missing == 0 && self.wrong == 0
    }
}

/// Takes the next at most `max` keys off the front of `rest` (the keys not
/// yet handled, as first and last, inclusive); `None` when none are left.
fn next_chunk(rest: &mut Option<(u64, u64)>, max: usize) -> Option<std::ops::RangeInclusive<u64>> {
    let (from, to) = (*rest)?;
    let last = from + (to - from).min(max as u64 - 1);
    *rest = (last < to).then(|| (last + 1, to));
    Some(from..=last)
}

/// The keys of `keys` as the state [`next_chunk`] takes them from.
fn range_state(keys: &std::ops::RangeInclusive<u64>) -> Option<(u64, u64)> {
    (!keys.is_empty()).then(|| (*keys.start(), *keys.end()))
}

/// Stores, for every key in `keys`, the vector `fill` writes for it,
/// [`PS_LOAD_WINDOW`] requests of [`PS_LOAD_BATCH_KEYS`] at a time, calling
/// `progress` with the keys done so far.
pub fn put_range(
    c: &mut PsClient,
    t: &TableDesc,
    keys: std::ops::RangeInclusive<u64>,
    mut fill: impl FnMut(u64, &mut [f32]),
    mut progress: impl FnMut(u64),
) -> Result<()> {
    let dim = t.spec.dim as usize;
    let mut batch_keys = Vec::with_capacity(PS_LOAD_BATCH_KEYS * PS_LOAD_WINDOW);
    let mut values = Vec::new();
    let mut done = 0u64;
    let mut rest = range_state(&keys);
    while let Some(chunk) = next_chunk(&mut rest, PS_LOAD_BATCH_KEYS * PS_LOAD_WINDOW) {
        batch_keys.clear();
        batch_keys.extend(chunk);
        values.resize(batch_keys.len() * dim, 0.0);
        for (i, k) in batch_keys.iter().enumerate() {
            fill(*k, &mut values[i * dim..(i + 1) * dim]);
        }
        // One call posts every frame of the window before waiting.
        c.put(t, &batch_keys, &values)?;
        done += batch_keys.len() as u64;
        progress(done);
    }
    Ok(())
}

/// Stores the deterministic initial vector of every key in `keys` (PetPS's
/// preload of 1..N), calling `progress` with the keys done so far.
pub fn preload(
    c: &mut PsClient,
    t: &TableDesc,
    keys: std::ops::RangeInclusive<u64>,
    progress: impl FnMut(u64),
) -> Result<()> {
    let seed = t.spec.seed;
    put_range(
        c,
        t,
        keys,
        |k, v| fabrickv_wire::ps::init_vector(seed, k, v),
        progress,
    )
}

/// Pulls every key of `keys` and checks it against the initializer
/// (PetPS's `--check_after_preload`), calling `progress` as it goes.
pub fn verify(
    c: &mut PsClient,
    t: &TableDesc,
    keys: std::ops::RangeInclusive<u64>,
    mut progress: impl FnMut(u64),
) -> Result<VerifyReport> {
    let dim = t.spec.dim as usize;
    let mut report = VerifyReport::default();
    let mut want = vec![0f32; dim];
    // The keys not yet requested, and the pulls in flight with their keys.
    let mut rest = range_state(&keys);
    let mut in_flight: VecDeque<(PullId, Vec<u64>)> = VecDeque::new();
    let issue = |c: &mut PsClient,
                 rest: &mut Option<(u64, u64)>,
                 in_flight: &mut VecDeque<(PullId, Vec<u64>)>|
     -> Result<()> {
        if let Some(chunk) = next_chunk(rest, PS_LOAD_BATCH_KEYS) {
            let b: Vec<u64> = chunk.collect();
            in_flight.push_back((c.pull_async(t, &b)?, b));
        }
        Ok(())
    };
    for _ in 0..PS_LOAD_WINDOW {
        issue(c, &mut rest, &mut in_flight)?;
    }
    while let Some((id, b)) = in_flight.pop_front() {
        c.wait_view(id, |bytes, found| {
            for (i, k) in b.iter().enumerate() {
                report.checked += 1;
                let bad = if !found[i] {
                    report.missing += 1;
                    true
                } else {
                    fabrickv_wire::ps::init_vector(t.spec.seed, *k, &mut want);
                    let got: &[f32] = bytemuck::cast_slice(&bytes[i * dim * 4..(i + 1) * dim * 4]);
                    let wrong = got != &want[..];
                    report.wrong += u64::from(wrong);
                    wrong
                };
                if bad && report.first_failures.len() < VERIFY_FAILURES_LISTED {
                    report.first_failures.push(*k);
                }
            }
        })?;
        progress(report.checked);
        issue(c, &mut rest, &mut in_flight)?;
    }
    Ok(report)
}
