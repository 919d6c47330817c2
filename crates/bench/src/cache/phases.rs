//! The runner: the write phase, the single GETs of the latency analysis,
//! and the warm-up and measured reads of several reader threads, generic
//! over where the values live, so that FabricKV and Redis are measured by
//! the same loops.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Barrier;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use serde::Serialize;

use super::source::{ValueSink, ValueSource};
use super::values::{check_value, fill_value, key_name};
use crate::limits::check::per_s;
use crate::report::latency_histogram;

/// What the write phase measured.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct WriteResult {
    /// Values written.
    pub keys: u64,
    /// Seconds, making the values included.
    pub seconds: f64,
}

impl WriteResult {
    /// Writes per second.
    pub fn ops_per_s(&self) -> f64 {
        per_s(self.keys as f64, self.seconds)
    }
}

/// Writes key `i` of `keys` with its value of `value_size` bytes, one
/// after the other from this thread, as kv-bench does.
pub fn write_all<S: ValueSink>(
    sink: &mut S,
    keys: &[Vec<u8>],
    value_size: usize,
    ttl: Option<Duration>,
) -> Result<WriteResult, String> {
    let mut value = vec![0u8; value_size];
    let start = Instant::now();
    for (i, k) in keys.iter().enumerate() {
        fill_value(i as u64, &mut value);
        sink.store(k, &value, ttl)
            .map_err(|e| format!("writing {}: {e}", String::from_utf8_lossy(k)))?;
    }
    Ok(WriteResult {
        keys: keys.len() as u64,
        seconds: start.elapsed().as_secs_f64(),
    })
}

/// Reads key `index` from `src` and checks it; the time of the read alone.
fn get_checked<S: ValueSource>(
    src: &mut S,
    keys: &[Vec<u8>],
    index: u64,
    value_size: usize,
) -> Result<Duration, String> {
    let key = keys
        .get(index as usize)
        .ok_or_else(|| format!("key index {index} is past the {} keys", keys.len()))?;
    let t0 = Instant::now();
    let got = src.fetch(key);
    let took = t0.elapsed();
    match got {
        Ok(v) => check_got(index, v, value_size).map(|()| took),
        Err(e) => Err(format!("reading {}: {e}", key_name(index))),
    }
}

/// Checks what a read of key `index` found.
fn check_got(index: u64, got: Option<&[u8]>, value_size: usize) -> Result<(), String> {
    match got {
        Some(v) => check_value(index, v, value_size),
        None => Err(format!(
            "{} is missing (evicted, or expired: is --ttl shorter than the run?)",
            key_name(index)
        )),
    }
}

/// Reads keys `batch` from `src` with all requests in flight at once
/// ([`ValueSource::fetch_batch`]), checking each value as it is handed
/// over; the time of the whole batch, checks included.
fn batch_checked<S: ValueSource>(
    src: &mut S,
    keys: &[Vec<u8>],
    batch: std::ops::Range<u64>,
    value_size: usize,
) -> Result<Duration, String> {
    let names = keys
        .get(batch.start as usize..batch.end as usize)
        .ok_or_else(|| format!("keys {batch:?} are past the {} keys", keys.len()))?;
    let names: Vec<&[u8]> = names.iter().map(Vec::as_slice).collect();
    let t0 = Instant::now();
    src.fetch_batch(&names, value_size, &mut |j, v| {
        check_got(batch.start + j as u64, v, value_size)
    })
    .map_err(|e| format!("reading keys {batch:?}: {e}"))?;
    Ok(t0.elapsed())
}

/// Records a latency in nanoseconds (at least 1, the histogram's floor).
fn record(h: &mut Histogram<u64>, d: Duration) {
    h.saturating_record((d.as_nanos() as u64).max(1));
}

/// `samples` GETs of random keys, one at a time from this thread, each
/// checked; their latencies (ns). kv-bench's latency analysis.
pub fn single_gets<S: ValueSource>(
    src: &mut S,
    keys: &[Vec<u8>],
    value_size: usize,
    samples: u64,
    seed: u64,
) -> Result<Histogram<u64>, String> {
    let mut h = latency_histogram()?;
    if keys.is_empty() {
        return Ok(h);
    }
    let mut rng = SmallRng::seed_from_u64(seed);
    for _ in 0..samples {
        let i = rng.gen_range(0..keys.len() as u64);
        record(&mut h, get_checked(src, keys, i, value_size)?);
    }
    Ok(h)
}

/// How the readers run.
#[derive(Debug, Clone)]
pub struct ReadOpts {
    /// Keys `0..num_keys` were written.
    pub num_keys: u64,
    /// Bytes of every value.
    pub value_size: usize,
    /// Reader threads, each with its own connection.
    pub threads: usize,
    /// Random GETs before measuring, shared out over the threads.
    pub warmup: u64,
    /// Times each thread reads its slice of the keys while measured.
    pub passes: u32,
    /// GETs each reader keeps in flight in the measured phase: its slice
    /// is read in batches of this many keys, all requests sent before the
    /// first reply is read (1: one GET at a time, as kv-bench
    /// of the KV-cache server does).
    pub depth: usize,
    /// CPUs the reader threads are pinned to, round robin (empty: none).
    pub client_cpus: Vec<usize>,
    /// Random-number seed of thread 0's warm-up keys (thread `t` uses
    /// `seed + t`).
    pub seed: u64,
}

/// What the read phase measured.
#[derive(Debug, Clone)]
pub struct ReadResult {
    /// Checked GETs in the measured interval.
    pub gets: u64,
    /// From the first reader's release to the last one's end.
    pub seconds: f64,
    /// Checked GETs of the warm-up.
    pub warmup_gets: u64,
    /// Every measured GET's latency (ns), all threads merged.
    pub latency: Histogram<u64>,
}

impl ReadResult {
    /// GETs per second.
    pub fn ops_per_s(&self) -> f64 {
        per_s(self.gets as f64, self.seconds)
    }

    /// Value bytes read per second.
    pub fn bytes_per_s(&self, value_size: usize) -> f64 {
        per_s(self.gets as f64 * value_size as f64, self.seconds)
    }
}

/// What one reader thread brings back.
struct ReaderOut {
    gets: u64,
    warmup_gets: u64,
    latency: Histogram<u64>,
    /// When this thread was released into the measured reads.
    started: Instant,
    /// When it finished them.
    finished: Instant,
}

/// The warm-up GETs of thread `tid`: its share of `warmup`, the first
/// `warmup % threads` threads taking one more.
fn warmup_share(warmup: u64, threads: usize, tid: usize) -> u64 {
    let t = threads.max(1) as u64;
    warmup / t + u64::from((tid as u64) < warmup % t)
}

/// The keys thread `tid` of `threads` reads in the measured phase: an
/// equal contiguous slice of `0..num_keys`.
fn slice_of(num_keys: u64, threads: usize, tid: usize) -> std::ops::Range<u64> {
    let t = threads.max(1) as u64;
    let tid = tid as u64;
    (num_keys * tid / t)..(num_keys * (tid + 1) / t)
}

/// Runs the warm-up and the measured reads: `o.threads` threads each
/// connect with `connect(thread)`, do their share of `o.warmup` random
/// GETs, and wait; `between` runs (to print that the warm-up is done);
/// then all are released at once and each reads its slice of the keys
/// `o.passes` times, checking every value and timing every GET.
///
/// A thread that fails still meets the others at both barriers (so none
/// waits forever), and tells them to stop; the first error is returned.
pub fn run_readers<S, C>(
    o: &ReadOpts,
    keys: &[Vec<u8>],
    connect: C,
    between: impl FnOnce(),
) -> Result<ReadResult, String>
where
    S: ValueSource,
    C: Fn(usize) -> Result<S, String> + Sync,
{
    if o.threads == 0 || o.passes == 0 {
        return Err("readers and passes must be at least 1".into());
    }
    if keys.len() as u64 != o.num_keys {
        return Err(format!("{} key names for {} keys", keys.len(), o.num_keys));
    }
    let warmed = Barrier::new(o.threads + 1);
    let go = Barrier::new(o.threads + 1);
    let abort = AtomicBool::new(false);
    let (warmed, go, abort, connect) = (&warmed, &go, &abort, &connect);
    std::thread::scope(|scope| {
        let handles: Vec<_> = (0..o.threads)
            .map(|tid| scope.spawn(move || reader(tid, o, keys, connect, abort, warmed, go)))
            .collect();
        warmed.wait();
        if !abort.load(Ordering::Acquire) {
            between();
        }
        go.wait();
        let mut first_err = None;
        let mut result = ReadResult {
            gets: 0,
            seconds: 0.0,
            warmup_gets: 0,
            latency: latency_histogram()?,
        };
        // The interval runs from the first reader's release to the last
        // one's end, as each thread saw them: this thread may be scheduled
        // out while the readers run, so its own clock would be late.
        let mut span: Option<(Instant, Instant)> = None;
        for h in handles {
            match h.join() {
                Ok(Ok(out)) => {
                    result.gets += out.gets;
                    result.warmup_gets += out.warmup_gets;
                    result
                        .latency
                        .add(&out.latency)
                        .map_err(|e| format!("merging latencies: {e:?}"))?;
                    span = Some(match span {
                        None => (out.started, out.finished),
                        Some((s, f)) => (s.min(out.started), f.max(out.finished)),
                    });
                }
                Ok(Err(e)) => {
                    first_err.get_or_insert(e);
                }
                Err(_) => {
                    first_err.get_or_insert_with(|| "a reader thread panicked".to_string());
                }
            }
        }
        if let Some(e) = first_err {
            return Err(e);
        }
        result.seconds = span.map_or(0.0, |(s, f)| f.duration_since(s).as_secs_f64());
        Ok(result)
    })
}

/// One reader thread of [`run_readers`].
fn reader<S, C>(
    tid: usize,
    o: &ReadOpts,
    keys: &[Vec<u8>],
    connect: &C,
    abort: &AtomicBool,
    warmed: &Barrier,
    go: &Barrier,
) -> Result<ReaderOut, String>
where
    S: ValueSource,
    C: Fn(usize) -> Result<S, String>,
{
    if !o.client_cpus.is_empty() {
        crate::pin_current_thread(o.client_cpus[tid % o.client_cpus.len()]);
    }
    // Nothing before the barriers may return early: the others would wait
    // for this thread forever.
    let mut failed: Option<String> = None;
    let mut out = None;
    match (latency_histogram(), connect(tid)) {
        (Ok(latency), Ok(src)) => out = Some((latency, src)),
        (Err(e), _) | (_, Err(e)) => failed = Some(format!("reader {tid}: {e}")),
    }
    let mut warmup_gets = 0;
    if let Some((_, src)) = out.as_mut() {
        let mut rng = SmallRng::seed_from_u64(o.seed.wrapping_add(tid as u64));
        for _ in 0..warmup_share(o.warmup, o.threads, tid) {
            if abort.load(Ordering::Relaxed) || o.num_keys == 0 {
                break;
            }
            let i = rng.gen_range(0..o.num_keys);
            if let Err(e) = get_checked(src, keys, i, o.value_size) {
                failed = Some(format!("warm-up, reader {tid}: {e}"));
                break;
            }
            warmup_gets += 1;
        }
    }
    if failed.is_some() {
        abort.store(true, Ordering::Release);
    }
    warmed.wait();
    go.wait();
    if let Some(e) = failed {
        return Err(e);
    }
    let Some((mut latency, mut src)) = out else {
        return Err(format!("reader {tid} has no connection"));
    };
    let started = Instant::now();
    let mut gets = 0u64;
    let depth = o.depth.max(1) as u64;
    let mine = slice_of(o.num_keys, o.threads, tid);
    'passes: for pass in 0..o.passes {
        let mut at = mine.start;
        while at < mine.end {
            if abort.load(Ordering::Relaxed) {
                break 'passes;
            }
            let batch = at..(at + depth).min(mine.end);
            let n = batch.end - batch.start;
            let took = if depth == 1 {
                get_checked(&mut src, keys, at, o.value_size)
            } else {
                batch_checked(&mut src, keys, batch.clone(), o.value_size)
            };
            match took {
                // Every GET of a batch is counted with the batch's time,
                // an upper bound on each of its own.
                Ok(took) => (0..n).for_each(|_| record(&mut latency, took)),
                Err(e) => {
                    abort.store(true, Ordering::Release);
                    return Err(format!("reader {tid}, pass {}: {e}", pass + 1));
                }
            }
            gets += n;
            at = batch.end;
        }
    }
    Ok(ReaderOut {
        gets,
        warmup_gets,
        latency,
        started,
        finished: Instant::now(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache::values::key_names;

    #[test]
    fn keys_and_work_are_shared_out_whole() {
        let covered: Vec<u64> = (0..3).flat_map(|t| slice_of(10, 3, t)).collect();
        assert_eq!(covered, (0..10).collect::<Vec<_>>());
        let shares: u64 = (0..4).map(|t| warmup_share(10, 4, t)).sum();
        assert_eq!(shares, 10);
        assert_eq!(key_name(7), "key-00000007");
    }

    #[test]
    fn readers_check_every_value_and_fail_on_a_wrong_one() {
        /// A store of the benchmark's values, one key optionally corrupted.
        struct Local {
            values: Vec<Vec<u8>>,
        }
        impl ValueSource for Local {
            fn fetch(&mut self, key: &[u8]) -> Result<Option<&[u8]>, String> {
                let name = String::from_utf8_lossy(key);
                let i: usize = name
                    .trim_start_matches("key-")
                    .parse()
                    .map_err(|_| format!("bad key {name}"))?;
                Ok(self.values.get(i).map(|v| &v[..]))
            }
        }
        let values = |bad: Option<usize>| -> Vec<Vec<u8>> {
            (0..20)
                .map(|i| {
                    let mut v = vec![0u8; 100];
                    fill_value(i as u64, &mut v);
                    if Some(i) == bad {
                        v[50] ^= 1;
                    }
                    v
                })
                .collect()
        };
        // One GET at a time, and batches (the last of a slice short).
        for depth in [1, 4] {
            let o = ReadOpts {
                num_keys: 20,
                value_size: 100,
                threads: 3,
                warmup: 0,
                passes: 2,
                depth,
                client_cpus: Vec::new(),
                seed: 100,
            };
            let keys = key_names(20);
            let mut between = 0;
            let r = run_readers(
                &o,
                &keys,
                |_| {
                    Ok(Local {
                        values: values(None),
                    })
                },
                || between += 1,
            )
            .expect("all values check");
            assert_eq!((r.gets, r.latency.len(), between), (40, 40, 1));
            let e = run_readers(
                &o,
                &keys,
                |_| {
                    Ok(Local {
                        values: values(Some(9)),
                    })
                },
                || {},
            )
            .expect_err("a wrong byte fails the run");
            assert!(e.contains("key-00000009: byte 50 of 100"), "{e}");
            let e = run_readers(
                &o,
                &keys,
                |_| {
                    Ok(Local {
                        values: values(None)[..10].to_vec(),
                    })
                },
                || {},
            )
            .expect_err("a missing key fails the run");
            assert!(e.contains("missing"), "{e}");
        }
    }
}
