//! `fabrickv bench cache`: the KV-cache read benchmark (large values with
//! a TTL, written once, then read by several threads at once) and its
//! peer, redis-server, driven the same way.
//!
//! Every value is a function of its key's index and of the byte position
//! ([`fill_value`]), so each read is checked whole where it landed
//! ([`check_value`]): a stale, torn, misplaced or foreign value fails the
//! run instead of being counted as a fast read. The check costs one pass
//! over the bytes the read brought in, so it is part of the read rate,
//! for FabricKV and Redis alike.
//!
//! The phases are generic over a [`ValueSink`] (writes) and a
//! [`ValueSource`] (reads): [`CacheClient`] implements both over FabricKV's
//! native data plane, [`RespClient`] over the Redis protocol, so the two
//! systems are measured by the same loops.

use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Barrier;
use std::time::{Duration, Instant};

use fabrickv_client::{CacheClient, CacheClientOptions, Placed};
use hdrhistogram::Histogram;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use serde::Serialize;

use crate::peers::{self, Child};
use crate::report::latency_histogram;

/// Per-call timeout of the benchmark's clients (FabricKV and Redis): long
/// enough for a 64 MB value over loopback on a busy machine, short enough
/// that a hung server fails the run.
pub const CACHE_BENCH_TIMEOUT: Duration = Duration::from_secs(10);

/// Random single GETs of the seed's latency analysis.
pub const LATENCY_SAMPLES: u64 = 100;

/// Smallest cache pool given to a started server, bytes: the server's
/// fixed costs stay small next to it even for a handful of keys.
pub const POOL_BYTES_MIN: u64 = 256 << 20;

/// Granule every cached value is rounded up to in the pool (one cache
/// line: `fabrickv_cache`'s block alignment), for sizing the pool.
const POOL_BLOCK_BYTES: u64 = 64;

/// Multiplier that spreads a word's position over all its bytes, so every
/// byte of a value depends on where it sits (the 64-bit golden ratio).
const POSITION_MIX: u64 = 0x9E37_79B9_7F4A_7C15;

/// Mixed into a key index before hashing, so that the values differ from
/// other benchmarks' patterns of the same indices.
const SEED_SALT: u64 = 0xCAC8_E5EE_D000_0000;

/// Bytes of the RESP client's header buffer: far more than any reply
/// header, so one `read` usually brings a whole header and the start of
/// the value.
const RESP_STAGE_BYTES: usize = 4096;

/// Largest bulk reply the RESP client accepts (Redis's own
/// `proto-max-bulk-len` default): a corrupt length fails instead of
/// allocating without bound.
pub const RESP_BULK_BYTES_MAX: usize = 512 << 20;

/// The name of key `index`, as the seed names them.
pub fn key_name(index: u64) -> String {
    format!("key-{index:08}")
}

/// The names of keys `0..n`, as bytes.
pub fn key_names(n: u64) -> Vec<Vec<u8>> {
    (0..n).map(|i| key_name(i).into_bytes()).collect()
}

/// The 64-bit seed of key `index`'s value.
#[inline]
fn value_seed(index: u64) -> u64 {
    fabrickv_wire::ps::splitmix64(index ^ SEED_SALT)
}

/// The little-endian word at word position `word` of a value with `seed`.
#[inline]
fn value_word(seed: u64, word: usize) -> u64 {
    seed ^ (word as u64).wrapping_mul(POSITION_MIX)
}

/// Fills `out` with key `index`'s value: word `j` (bytes `8j..8j+8`,
/// little-endian) is the key's seed xor `j` times a mixing constant; a
/// last partial word is cut short. Written eight bytes at a time, so
/// making a value costs about as much as copying it.
pub fn fill_value(index: u64, out: &mut [u8]) {
    let seed = value_seed(index);
    for (j, c) in out.chunks_mut(8).enumerate() {
        let w = value_word(seed, j).to_le_bytes();
        c.copy_from_slice(&w[..c.len()]);
    }
}

/// The byte at `pos` of key `index`'s value.
fn expected_byte(index: u64, pos: usize) -> u8 {
    value_word(value_seed(index), pos / 8).to_le_bytes()[pos % 8]
}

/// Checks that `bytes` is key `index`'s value of `len` bytes; the error
/// names the key, the first wrong byte, what it held and what was due.
///
/// The differences of all words are ORed with no early exit, so that the
/// loop vectorizes: the check must cost far less than the read it checks.
/// Only a failed check walks the bytes again to say where.
pub fn check_value(index: u64, bytes: &[u8], len: usize) -> Result<(), String> {
    if bytes.len() != len {
        return Err(format!(
            "{}: read {} bytes, expected {len}",
            key_name(index),
            bytes.len()
        ));
    }
    let seed = value_seed(index);
    let words = bytes.chunks_exact(8);
    let tail = words.remainder();
    // Word j is due to hold `value_word(seed, j)`, `seed ^ j * POSITION_MIX`:
    // the product is kept as a running sum (the same value, mod 2^64), so
    // the loop is loads, xors, ors and adds, which vectorize on any x86-64
    // (a 64-bit multiply per word does not, without AVX-512).
    let mut diff = 0u64;
    let mut mix = 0u64;
    for c in words {
        let w = u64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]);
        diff |= w ^ seed ^ mix;
        mix = mix.wrapping_add(POSITION_MIX);
    }
    let tail_at = len - tail.len();
    for (k, b) in tail.iter().enumerate() {
        diff |= u64::from(b ^ expected_byte(index, tail_at + k));
    }
    if diff == 0 {
        return Ok(());
    }
    let (pos, got) = bytes
        .iter()
        .enumerate()
        .find(|(p, b)| **b != expected_byte(index, *p))
        .map_or((0, 0), |(p, b)| (p, *b));
    Err(format!(
        "{}: byte {pos} of {len} is {got:#04x}, expected {:#04x}",
        key_name(index),
        expected_byte(index, pos)
    ))
}

/// Something values can be written to.
pub trait ValueSink {
    /// Stores `value` under `key`, expiring after `ttl` (`None`: never).
    fn store(&mut self, key: &[u8], value: &[u8], ttl: Option<Duration>) -> Result<(), String>;
}

/// What a batch read hands each value (or `None`: absent) to, with its
/// position in the batch.
pub type OnValue<'a> = dyn FnMut(usize, Option<&[u8]>) -> Result<(), String> + 'a;

/// Something values can be read from, into memory it owns.
pub trait ValueSource {
    /// Reads `key`; the value as it landed (no copy beyond the one the
    /// protocol makes), or `None` if the key is absent.
    fn fetch(&mut self, key: &[u8]) -> Result<Option<&[u8]>, String>;

    /// Reads every key of `keys` with all requests in flight at once and
    /// hands each value (or `None`) to `each` with its position, in order.
    /// A slot must hold `slot_bytes` (the value size), so each value can
    /// land in a place of its own. One after the other by default.
    fn fetch_batch(
        &mut self,
        keys: &[&[u8]],
        slot_bytes: usize,
        each: &mut OnValue<'_>,
    ) -> Result<(), String> {
        let _ = slot_bytes;
        for (i, k) in keys.iter().enumerate() {
            each(i, self.fetch(k)?)?;
        }
        Ok(())
    }
}

impl ValueSink for CacheClient {
    fn store(&mut self, key: &[u8], value: &[u8], ttl: Option<Duration>) -> Result<(), String> {
        self.put(key, value, ttl)
            .map(|_| ())
            .map_err(|e| e.to_string())
    }
}

impl ValueSource for CacheClient {
    /// `get_at(key, 0)`: over shm and fabric the server writes the value
    /// into the registered receive buffer, over tcp the client lands the
    /// inline chunks there; either way it is checked where it lies.
    fn fetch(&mut self, key: &[u8]) -> Result<Option<&[u8]>, String> {
        let Some(p) = self.get_at(key, 0).map_err(|e| e.to_string())? else {
            return Ok(None);
        };
        let buf = self.buffer().map_err(|e| e.to_string())?;
        placed(buf, &p).map(Some)
    }

    /// One [`CacheClient::get_many_at`]: key `i` lands at `i * slot_bytes`
    /// of the receive buffer and is checked there.
    fn fetch_batch(
        &mut self,
        keys: &[&[u8]],
        slot_bytes: usize,
        each: &mut OnValue<'_>,
    ) -> Result<(), String> {
        let items: Vec<(&[u8], usize)> = keys
            .iter()
            .enumerate()
            .map(|(i, k)| (*k, i * slot_bytes))
            .collect();
        let got = self.get_many_at(&items).map_err(|e| e.to_string())?;
        let buf = self.buffer().map_err(|e| e.to_string())?;
        for (i, r) in got.into_iter().enumerate() {
            let Some(p) = r.map_err(|e| e.to_string())? else {
                each(i, None)?;
                continue;
            };
            each(i, Some(placed(buf, &p)?))?;
        }
        Ok(())
    }
}

/// The bytes of the receive buffer `buf` where a GET placed its value.
fn placed<'a>(buf: &'a [u8], p: &Placed) -> Result<&'a [u8], String> {
    buf.get(p.offset..p.offset.saturating_add(p.len))
        .ok_or_else(|| {
            format!(
                "the server placed {} bytes at {} of a {}-byte buffer",
                p.len,
                p.offset,
                buf.len()
            )
        })
}

/// Connects a [`CacheClient`] with a receive buffer of `buffer_bytes`.
pub fn connect_cache(addr: &str, buffer_bytes: usize) -> Result<CacheClient, String> {
    CacheClient::connect_with(
        addr,
        CacheClientOptions {
            buffer_bytes,
            timeout: CACHE_BENCH_TIMEOUT,
        },
    )
    .map_err(|e| format!("cannot connect to {addr}: {e}"))
}

/// Connects reader `tid` to its worker ([`crate::worker_of_thread`]).
pub fn connect_reader(
    addr: &str,
    buffer_bytes: usize,
    tid: usize,
    workers: u16,
) -> Result<CacheClient, String> {
    let worker = crate::worker_of_thread(tid, workers);
    CacheClient::connect_worker(
        addr,
        worker,
        CacheClientOptions {
            buffer_bytes,
            timeout: CACHE_BENCH_TIMEOUT,
        },
    )
    .map_err(|e| format!("cannot connect to {addr} (worker {worker}): {e}"))
}

// ---------------------------------------------------------------------------
// Phases
// ---------------------------------------------------------------------------

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
/// after the other from this thread, as the seed does.
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
/// checked; their latencies (ns). The seed's latency analysis.
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
    /// first reply is read (1: one GET at a time, as the seed).
    pub depth: usize,
    /// CPUs the reader threads are pinned to, round robin (empty: none).
    pub client_cpus: Vec<usize>,
    /// Seed of thread 0's warm-up keys (thread `t` uses `seed + t`).
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

// ---------------------------------------------------------------------------
// Latency figures
// ---------------------------------------------------------------------------

/// The seed's latency statistics of a histogram of nanoseconds, in
/// microseconds.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct LatencyStats {
    /// GETs measured.
    pub samples: u64,
    /// Fastest.
    pub min_us: f64,
    /// Median.
    pub p50_us: f64,
    /// Mean.
    pub avg_us: f64,
    /// 95th percentile.
    pub p95_us: f64,
    /// 99th percentile.
    pub p99_us: f64,
    /// Slowest.
    pub max_us: f64,
}

impl LatencyStats {
    /// The figures of `h` (all zero when it is empty).
    pub fn of(h: &Histogram<u64>) -> LatencyStats {
        if h.is_empty() {
            return LatencyStats {
                samples: 0,
                min_us: 0.0,
                p50_us: 0.0,
                avg_us: 0.0,
                p95_us: 0.0,
                p99_us: 0.0,
                max_us: 0.0,
            };
        }
        let us = |ns: u64| ns as f64 / 1e3;
        LatencyStats {
            samples: h.len(),
            min_us: us(h.min()),
            p50_us: us(h.value_at_quantile(0.50)),
            avg_us: h.mean() / 1e3,
            p95_us: us(h.value_at_quantile(0.95)),
            p99_us: us(h.value_at_quantile(0.99)),
            max_us: us(h.max()),
        }
    }

    /// GETs per second one thread issuing them back to back would make
    /// (`1e6 / avg_us`; 0 without samples).
    pub fn single_thread_ops_per_s(&self) -> f64 {
        per_s(1e6, self.avg_us)
    }

    /// The seed's block: a title line, then one line per figure.
    pub fn block(&self) -> String {
        let line = |name: &str, v: f64| format!("  {name:<7}{v:>10.2} µs\n");
        [
            "Latency statistics (microseconds):\n".to_string(),
            line("Min:", self.min_us),
            line("Median:", self.p50_us),
            line("Avg:", self.avg_us),
            line("P95:", self.p95_us),
            line("P99:", self.p99_us),
            line("Max:", self.max_us),
        ]
        .concat()
    }
}

/// `n / seconds`, zero for an empty interval.
fn per_s(n: f64, seconds: f64) -> f64 {
    if seconds > 0.0 {
        n / seconds
    } else {
        0.0
    }
}

/// Bytes in the seed's style: `512 B`, `64.00 KB`, `1.00 MB`, `2.50 GB`
/// (binary units, as `--value-size` is parsed).
pub fn format_bytes(bytes: f64) -> String {
    const UNITS: [&str; 4] = ["KB", "MB", "GB", "TB"];
    if bytes < 1024.0 {
        return format!("{bytes:.0} B");
    }
    let mut v = bytes / 1024.0;
    let mut unit = 0;
    while v >= 1024.0 && unit + 1 < UNITS.len() {
        v /= 1024.0;
        unit += 1;
    }
    format!("{v:.2} {}", UNITS[unit])
}

/// Bytes per second in MB/s (2^20 bytes), the seed's unit.
pub fn mb_per_s(bytes_per_s: f64) -> f64 {
    bytes_per_s / f64::from(1u32 << 20)
}

// ---------------------------------------------------------------------------
// A FabricKV server to measure
// ---------------------------------------------------------------------------

/// Cache pool for `num_keys` values of `value_size` bytes: their blocks
/// plus a quarter, so the pool stays under the eviction watermark (0.9)
/// and no key is evicted while it is read; at least [`POOL_BYTES_MIN`].
pub fn pool_bytes_for(num_keys: u64, value_size: usize) -> u64 {
    let block = (value_size as u64).div_ceil(POOL_BLOCK_BYTES).max(1) * POOL_BLOCK_BYTES;
    num_keys
        .saturating_mul(block)
        .saturating_mul(5)
        .div_ceil(4)
        .max(POOL_BYTES_MIN)
}

/// A FabricKV server started for the benchmark; killed when dropped.
pub struct CacheServer {
    /// The child process.
    pub child: Child,
    /// Its data-plane address.
    pub addr: String,
}

/// Starts `fabrickv serve` (this binary) on loopback with `transport`
/// (tcp, shm, or fabric with `provider`), pinned to `cpus` (worker i to
/// the i-th CPU of the list), with a cache
/// pool of `pool_bytes` and no gRPC control plane (the benchmark needs
/// none, and the default gRPC port may be another server's). Ready once
/// a cache client can connect.
pub fn spawn_server(
    transport: &str,
    provider: &str,
    cpus: Option<&str>,
    workers: usize,
    pool_bytes: u64,
) -> Result<CacheServer, String> {
    let addr = peers::fabrickv_listen_addr(transport, provider, "cache")?;
    let mut cmd = peers::fabrickv_serve(cpus, &addr, workers)?;
    cmd.args(["--memory", "64MB", "--log-level", "warn", "--grpc", "off"])
        .args(["--cache-memory", &pool_bytes.to_string()]);
    let probe = addr.clone();
    let child = peers::spawn_until(cmd, "fabrickv", || {
        CacheClient::connect_with(
            &probe,
            CacheClientOptions {
                buffer_bytes: 4096,
                timeout: Duration::from_millis(200),
            },
        )
        .is_ok()
    })?;
    Ok(CacheServer { child, addr })
}

// ---------------------------------------------------------------------------
// Redis (RESP2) client
// ---------------------------------------------------------------------------

/// One RESP2 reply.
#[derive(Debug, PartialEq, Eq)]
pub enum Reply<'a> {
    /// `+text`.
    Simple(String),
    /// `-text`: the server refused the command.
    Error(String),
    /// `:n`.
    Integer(i64),
    /// `$n` and `n` bytes, in the client's value buffer.
    Bulk(&'a [u8]),
    /// `$-1`: no such key.
    Nil,
}

/// A minimal blocking RESP2 client: one command in flight, bulk replies
/// read straight into a value buffer reused from reply to reply.
///
/// A reply's header is found in a small staging buffer; the bytes of the
/// value that came with it are copied out of that, and the rest is read
/// from the socket directly into the value buffer, so a large value costs
/// one copy out of the kernel and no more (what FabricKV's tcp client also
/// pays).
pub struct RespClient<S> {
    io: S,
    stage: Box<[u8]>,
    /// Unconsumed bytes are `stage[lo..hi]`.
    lo: usize,
    hi: usize,
    value: Vec<u8>,
    request: Vec<u8>,
}

impl RespClient<TcpStream> {
    /// Connects to redis-server on `127.0.0.1:port`.
    pub fn connect(port: u16) -> Result<RespClient<TcpStream>, String> {
        let s = TcpStream::connect(("127.0.0.1", port))
            .map_err(|e| format!("cannot connect to redis at 127.0.0.1:{port}: {e}"))?;
        s.set_nodelay(true).map_err(|e| e.to_string())?;
        s.set_read_timeout(Some(CACHE_BENCH_TIMEOUT))
            .map_err(|e| e.to_string())?;
        s.set_write_timeout(Some(CACHE_BENCH_TIMEOUT))
            .map_err(|e| e.to_string())?;
        Ok(RespClient::new(s))
    }
}

impl<S: Read + Write> RespClient<S> {
    /// A client over a connected stream.
    pub fn new(io: S) -> RespClient<S> {
        RespClient {
            io,
            stage: vec![0; RESP_STAGE_BYTES].into_boxed_slice(),
            lo: 0,
            hi: 0,
            value: Vec::new(),
            request: Vec::new(),
        }
    }

    /// Sends a command (as an array of bulk strings) and reads its reply.
    pub fn command(&mut self, args: &[&[u8]]) -> Result<Reply<'_>, String> {
        self.request.clear();
        self.push_command(args);
        self.io
            .write_all(&self.request)
            .map_err(|e| format!("redis write: {e}"))?;
        self.read_reply()
    }

    /// Appends a command (an array of bulk strings) to the request.
    fn push_command(&mut self, args: &[&[u8]]) {
        self.request
            .extend_from_slice(format!("*{}\r\n", args.len()).as_bytes());
        for a in args {
            self.request
                .extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
            self.request.extend_from_slice(a);
            self.request.extend_from_slice(b"\r\n");
        }
    }

    /// Reads more bytes into the staging buffer (compacting it first when
    /// its end is reached).
    fn fill(&mut self) -> Result<(), String> {
        if self.lo == self.hi {
            self.lo = 0;
            self.hi = 0;
        } else if self.hi == self.stage.len() {
            self.stage.copy_within(self.lo..self.hi, 0);
            self.hi -= self.lo;
            self.lo = 0;
            if self.hi == self.stage.len() {
                return Err(format!(
                    "a reply header is longer than {RESP_STAGE_BYTES} bytes"
                ));
            }
        }
        loop {
            match self.io.read(&mut self.stage[self.hi..]) {
                Ok(0) => return Err("redis closed the connection mid-reply".into()),
                Ok(n) => {
                    self.hi += n;
                    return Ok(());
                }
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => return Err(format!("redis read: {e}")),
            }
        }
    }

    /// The next line (without its CRLF), consumed from the stage.
    fn line(&mut self) -> Result<String, String> {
        loop {
            let pending = &self.stage[self.lo..self.hi];
            if let Some(p) = pending.windows(2).position(|w| w == b"\r\n") {
                let text = String::from_utf8_lossy(&pending[..p]).into_owned();
                self.lo += p + 2;
                return Ok(text);
            }
            self.fill()?;
        }
    }

    /// Reads one reply.
    pub fn read_reply(&mut self) -> Result<Reply<'_>, String> {
        let line = self.line()?;
        let (kind, rest) = line.split_at(line.len().min(1));
        match kind {
            "+" => Ok(Reply::Simple(rest.to_string())),
            "-" => Ok(Reply::Error(rest.to_string())),
            ":" => rest
                .parse()
                .map(Reply::Integer)
                .map_err(|_| format!("bad integer reply {line:?}")),
            "$" => {
                let n: i64 = rest
                    .parse()
                    .map_err(|_| format!("bad bulk header {line:?}"))?;
                if n < 0 {
                    return Ok(Reply::Nil);
                }
                let n = usize::try_from(n)
                    .ok()
                    .filter(|n| *n <= RESP_BULK_BYTES_MAX)
                    .ok_or_else(|| format!("bulk reply of {n} bytes is too large"))?;
                self.read_bulk(n)?;
                Ok(Reply::Bulk(&self.value[..n]))
            }
            _ => Err(format!("unexpected reply {line:?}")),
        }
    }

    /// Reads `n` value bytes and the CRLF after them into `value[..n]`.
    fn read_bulk(&mut self, n: usize) -> Result<(), String> {
        if self.value.len() < n {
            self.value.resize(n, 0);
        }
        let have = (self.hi - self.lo).min(n);
        self.value[..have].copy_from_slice(&self.stage[self.lo..self.lo + have]);
        self.lo += have;
        if have < n {
            self.io
                .read_exact(&mut self.value[have..n])
                .map_err(|e| format!("redis read: {e}"))?;
        }
        while self.hi - self.lo < 2 {
            self.fill()?;
        }
        if &self.stage[self.lo..self.lo + 2] != b"\r\n" {
            return Err("a bulk reply does not end with CRLF".into());
        }
        self.lo += 2;
        Ok(())
    }
}

impl<S: Read + Write> ValueSink for RespClient<S> {
    /// `SET key value [EX seconds]` (whole seconds, at least one).
    fn store(&mut self, key: &[u8], value: &[u8], ttl: Option<Duration>) -> Result<(), String> {
        let secs = ttl.map(|t| t.as_secs().max(1).to_string());
        let reply = match &secs {
            Some(s) => self.command(&[b"SET", key, value, b"EX", s.as_bytes()])?,
            None => self.command(&[b"SET", key, value])?,
        };
        match reply {
            Reply::Simple(s) if s == "OK" => Ok(()),
            Reply::Error(e) => Err(format!("redis: {e}")),
            r => Err(format!("unexpected SET reply {r:?}")),
        }
    }
}

impl<S: Read + Write> ValueSource for RespClient<S> {
    /// `GET key`, the value in the client's reused buffer.
    fn fetch(&mut self, key: &[u8]) -> Result<Option<&[u8]>, String> {
        let r = self.command(&[b"GET", key])?;
        get_value(r)
    }

    /// The GETs pipelined: all written at once, then the replies read in
    /// order, each checked before the next is read into the same buffer.
    fn fetch_batch(
        &mut self,
        keys: &[&[u8]],
        _slot_bytes: usize,
        each: &mut OnValue<'_>,
    ) -> Result<(), String> {
        self.request.clear();
        for k in keys {
            self.push_command(&[b"GET", k]);
        }
        self.io
            .write_all(&self.request)
            .map_err(|e| format!("redis write: {e}"))?;
        for i in 0..keys.len() {
            let r = self.read_reply()?;
            each(i, get_value(r)?)?;
        }
        Ok(())
    }
}

/// The value of a GET reply (`None`: no such key).
fn get_value(r: Reply<'_>) -> Result<Option<&[u8]>, String> {
    match r {
        Reply::Bulk(v) => Ok(Some(v)),
        Reply::Nil => Ok(None),
        Reply::Error(e) => Err(format!("redis: {e}")),
        r => Err(format!("unexpected GET reply {r:?}")),
    }
}

/// What the Redis peer measured: the same write, warm-up and reads as
/// FabricKV's, over RESP.
#[derive(Debug, Clone)]
pub struct RedisPeer {
    /// The write phase (SET, one connection).
    pub write: WriteResult,
    /// The read phase (GET, one connection per thread).
    pub read: ReadResult,
}

/// A redis-server holding the benchmark's keys, so that its read phase
/// can run again, taking turns with FabricKV's (`--rounds`); stopped when
/// dropped.
pub struct RedisReads {
    _server: peers::Child,
    port: u16,
    /// The write phase (SET, one connection).
    pub write: WriteResult,
}

impl RedisReads {
    /// Starts redis-server pinned to `server_cpus` and writes the same
    /// keys and values with SET (EX `ttl`).
    pub fn start(
        o: &ReadOpts,
        keys: &[Vec<u8>],
        ttl: Option<Duration>,
        server_cpus: Option<&str>,
    ) -> Result<Self, String> {
        let (server, port) = peers::spawn_redis(server_cpus)?;
        let mut writer = RespClient::connect(port)?;
        let write = write_all(&mut writer, keys, o.value_size, ttl)
            .map_err(|e| format!("redis write phase: {e}"))?;
        Ok(Self {
            _server: server,
            port,
            write,
        })
    }

    /// The same readers as FabricKV's, with GET.
    pub fn read(&self, o: &ReadOpts, keys: &[Vec<u8>]) -> Result<ReadResult, String> {
        let port = self.port;
        run_readers(o, keys, |_| RespClient::connect(port), || {})
            .map_err(|e| format!("redis read phase: {e}"))
    }
}

/// Starts redis-server pinned to `server_cpus`, writes the same keys and
/// values with SET (EX `ttl`), then runs the same readers with GET; the
/// server is stopped before returning.
pub fn redis_peer(
    o: &ReadOpts,
    keys: &[Vec<u8>],
    ttl: Option<Duration>,
    server_cpus: Option<&str>,
) -> Result<RedisPeer, String> {
    let redis = RedisReads::start(o, keys, ttl, server_cpus)?;
    let read = redis.read(o, keys)?;
    Ok(RedisPeer {
        write: redis.write,
        read,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A stream that hands out its bytes at most `step` at a time (reads
    /// split anywhere, as TCP may split them) and swallows writes.
    struct Trickle {
        data: Vec<u8>,
        at: usize,
        step: usize,
    }

    impl Read for Trickle {
        fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
            let n = self.step.min(buf.len()).min(self.data.len() - self.at);
            buf[..n].copy_from_slice(&self.data[self.at..self.at + n]);
            self.at += n;
            Ok(n)
        }
    }

    impl Write for Trickle {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    fn client(data: &[u8], step: usize) -> RespClient<Trickle> {
        RespClient::new(Trickle {
            data: data.to_vec(),
            at: 0,
            step,
        })
    }

    #[test]
    fn resp_replies_parse_however_the_reads_are_split() {
        let big = vec![7u8; 3 * RESP_STAGE_BYTES + 5];
        let mut wire = Vec::new();
        wire.extend_from_slice(b"+OK\r\n$5\r\nhello\r\n$-1\r\n-ERR wrong type\r\n:42\r\n");
        wire.extend_from_slice(format!("${}\r\n", big.len()).as_bytes());
        wire.extend_from_slice(&big);
        wire.extend_from_slice(b"\r\n$0\r\n\r\n");
        for step in [1, 2, 3, 7, 64, RESP_STAGE_BYTES, usize::MAX] {
            let mut c = client(&wire, step);
            assert_eq!(
                c.read_reply().expect("simple"),
                Reply::Simple("OK".into()),
                "step {step}"
            );
            assert_eq!(c.read_reply().expect("bulk"), Reply::Bulk(b"hello"));
            assert_eq!(c.read_reply().expect("nil"), Reply::Nil);
            assert_eq!(
                c.read_reply().expect("error"),
                Reply::Error("ERR wrong type".into())
            );
            assert_eq!(c.read_reply().expect("integer"), Reply::Integer(42));
            assert_eq!(c.read_reply().expect("big bulk"), Reply::Bulk(&big[..]));
            assert_eq!(c.read_reply().expect("empty bulk"), Reply::Bulk(b""));
            assert!(c.read_reply().is_err(), "the stream has ended");
        }
    }

    #[test]
    fn pipelined_gets_hand_over_each_reply_in_order() {
        for step in [1, 5, usize::MAX] {
            let mut c = client(b"$3\r\nabc\r\n$-1\r\n$2\r\nxy\r\n", step);
            let mut seen = Vec::new();
            c.fetch_batch(&[b"a", b"b", b"c"], 3, &mut |i, v| {
                seen.push((i, v.map(<[u8]>::to_vec)));
                Ok(())
            })
            .expect("three replies");
            assert_eq!(
                seen,
                vec![
                    (0, Some(b"abc".to_vec())),
                    (1, None),
                    (2, Some(b"xy".to_vec()))
                ]
            );
        }
        // A reply missing from the stream is an error, not a short batch.
        let mut c = client(b"$3\r\nabc\r\n", 2);
        assert!(c.fetch_batch(&[b"a", b"b"], 3, &mut |_, _| Ok(())).is_err());
    }

    #[test]
    fn get_maps_nil_and_error_replies() {
        let mut c = client(b"$-1\r\n", 1);
        assert_eq!(c.fetch(b"k").expect("nil is not an error"), None);
        let mut c = client(b"-WRONGTYPE Operation against a key\r\n", 3);
        let e = c.fetch(b"k").expect_err("an error reply fails the GET");
        assert!(e.contains("WRONGTYPE"), "{e}");
        let mut c = client(b"$3\r\nabcXY", 2);
        assert!(c.fetch(b"k").is_err(), "a bulk without its CRLF");
        let mut c = client(b"$99999999999\r\n", 64);
        assert!(c.fetch(b"k").is_err(), "a bulk longer than allowed");
    }

    #[test]
    fn the_value_check_catches_one_flipped_byte() {
        for len in [1, 7, 8, 9, 4096, 65_536 + 3] {
            let mut v = vec![0u8; len];
            fill_value(12, &mut v);
            assert_eq!(check_value(12, &v, len), Ok(()), "len {len}");
            assert!(check_value(13, &v, len).is_err(), "another key's value");
            assert!(check_value(12, &v, len + 1).is_err(), "a short value");
            for pos in [0, len / 2, len - 1] {
                let mut bad = v.clone();
                bad[pos] ^= 0x10;
                let e = check_value(12, &bad, len).expect_err("a flipped byte");
                assert!(e.contains(&format!("byte {pos} of {len}")), "{e}");
                assert!(e.contains("key-00000012"), "{e}");
            }
        }
    }

    #[test]
    fn values_differ_by_position_and_key() {
        let (mut a, mut b) = (vec![0u8; 64], vec![0u8; 64]);
        fill_value(1, &mut a);
        fill_value(2, &mut b);
        assert_ne!(a, b);
        assert_ne!(a[..8], a[8..16], "a value shifted by a word is caught");
    }

    #[test]
    fn keys_and_work_are_shared_out_whole() {
        let covered: Vec<u64> = (0..3).flat_map(|t| slice_of(10, 3, t)).collect();
        assert_eq!(covered, (0..10).collect::<Vec<_>>());
        let shares: u64 = (0..4).map(|t| warmup_share(10, 4, t)).sum();
        assert_eq!(shares, 10);
        assert_eq!(key_name(7), "key-00000007");
    }

    #[test]
    fn sizes_print_in_the_seeds_style() {
        assert_eq!(format_bytes(65_536.0), "64.00 KB");
        assert_eq!(format_bytes(512.0), "512 B");
        assert_eq!(format_bytes(64.0 * 1_048_576.0), "64.00 MB");
        assert_eq!(pool_bytes_for(10, 100), POOL_BYTES_MIN);
        assert_eq!(pool_bytes_for(4096, 1 << 20), 5 << 30);
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
