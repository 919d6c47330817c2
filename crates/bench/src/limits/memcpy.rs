//! The memory limits of a pull: single-thread memcpy of whole chunks
//! ([`memcpy_bandwidth`], `limit.memcpy`) and single-thread random gather of
//! vectors from memory the size of a table ([`gather_bandwidth`],
//! `limit.gather`).

use std::time::{Duration, Instant};

use serde::Serialize;

use super::check::{check_duration, check_range, json_line, per_s, WARMUP};

/// The working set callers give [`memcpy_bandwidth`] to measure copies
/// that go to DRAM, bytes: larger than any last-level cache it will meet.
pub const MEMCPY_WORKING_SET_BYTES_DEFAULT: usize = 256 << 20;
/// Largest working set [`memcpy_bandwidth`] allocates, bytes.
pub const MEMCPY_WORKING_SET_BYTES_MAX: usize = 4 << 30;
/// Largest chunk [`memcpy_bandwidth`] copies at once, bytes.
pub const MEMCPY_CHUNK_BYTES_MAX: usize = 64 << 20;
/// Bytes copied between two readings of the clock, so that the clock
/// costs nothing next to the copies even for tiny chunks.
const MEMCPY_CLOCK_EVERY_BYTES: usize = 256 << 10;

/// The sizes of a copy limit ([`memcpy_bandwidth`], [`gather_bandwidth`]):
/// a chunk and a working set within their bounds, the working set holding
/// `chunks` chunks (`holds` says what they are, for the error).
fn check_copy_sizes(
    chunk_bytes: usize,
    working_set_bytes: usize,
    chunks: usize,
    holds: &str,
) -> Result<(), String> {
    check_range("chunk size", chunk_bytes, MEMCPY_CHUNK_BYTES_MAX)?;
    check_range(
        "working set",
        working_set_bytes,
        MEMCPY_WORKING_SET_BYTES_MAX,
    )?;
    if working_set_bytes < chunks * chunk_bytes {
        return Err(format!(
            "working set {working_set_bytes} B cannot hold {holds} of {chunk_bytes} B"
        ));
    }
    Ok(())
}

/// What [`memcpy_bandwidth`] measured.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct MemcpyRate {
    /// Bytes of each copy.
    pub chunk_bytes: usize,
    /// Bytes of source and destination together, as asked.
    pub working_set_bytes: usize,
    /// Copies made in the measured interval.
    pub copies: u64,
    /// Bytes copied in the measured interval (`copies x chunk_bytes`).
    pub bytes: u64,
    /// Length of the measured interval, seconds.
    pub seconds: f64,
    /// Bytes copied per second (each byte counted once, not as a read and
    /// a write).
    pub bytes_per_s: f64,
    /// The CPU the copying thread was pinned to.
    pub cpu: Option<usize>,
}

impl MemcpyRate {
    /// Bandwidth in GB/s (10^9 bytes per second).
    pub fn gb_per_s(&self) -> f64 {
        self.bytes_per_s / 1e9
    }

    /// The JSON line (`"bench":"limit.memcpy"`).
    pub fn json(&self) -> String {
        json_line("limit.memcpy", self)
    }
}

/// Single-thread copy bandwidth: one thread (pinned to `cpu` if given)
/// copies `chunk_bytes` at a time from a source buffer into a destination
/// buffer of `working_set_bytes / 2` each, walking through both in order
/// and wrapping, for [`WARMUP`] unmeasured and then `duration`.
///
/// With a working set far larger than the caches
/// ([`MEMCPY_WORKING_SET_BYTES_DEFAULT`]) nearly every byte comes from and
/// goes to DRAM: the bound on a pull that copies values out of memory the
/// cache has not seen. With a small one, the copies stay in cache.
///
/// Both buffers are written before the clock starts, so page faults are
/// not measured; `black_box` on both sides of each copy keeps the compiler
/// from proving the copies useless.
pub fn memcpy_bandwidth(
    chunk_bytes: usize,
    working_set_bytes: usize,
    duration: Duration,
    cpu: Option<usize>,
) -> Result<MemcpyRate, String> {
    check_copy_sizes(
        chunk_bytes,
        working_set_bytes,
        2,
        "a source and a destination chunk",
    )?;
    check_duration(duration)?;
    // The buffers are allocated and first written in the pinned thread,
    // so that their pages sit on the memory node of the copying CPU.
    let (copies, seconds) = crate::run_pinned("memcpy", cpu, move || {
        copy_loop(chunk_bytes, working_set_bytes, duration)
    })?;
    let bytes = copies * chunk_bytes as u64;
    Ok(MemcpyRate {
        chunk_bytes,
        working_set_bytes,
        copies,
        bytes,
        seconds,
        bytes_per_s: per_s(bytes as f64, seconds),
        cpu,
    })
}

/// Copies for the warm-up, then for `duration`; the measured copies and
/// seconds.
fn copy_loop(chunk: usize, working_set: usize, duration: Duration) -> (u64, f64) {
    let span = (working_set / 2 / chunk) * chunk;
    let src: Vec<u8> = (0..span).map(|i| (i % 251) as u8).collect();
    // `vec![0; n]` maps zero pages lazily; filling faults every page in.
    let mut dst = vec![0u8; span];
    dst.fill(0xA5);
    let per_clock = (MEMCPY_CLOCK_EVERY_BYTES / chunk).max(1);
    let mut at = 0usize;
    let mut run = |span_time: Duration| -> (u64, f64) {
        let start = Instant::now();
        let deadline = start + span_time;
        let mut copies = 0u64;
        let mut now = start;
        while now < deadline {
            for _ in 0..per_clock {
                let from = std::hint::black_box(&src[at..at + chunk]);
                dst[at..at + chunk].copy_from_slice(from);
                std::hint::black_box(&mut dst[at..at + chunk]);
                at += chunk;
                if at == span {
                    at = 0;
                }
            }
            copies += per_clock as u64;
            now = Instant::now();
        }
        (copies, now.duration_since(start).as_secs_f64())
    };
    run(WARMUP);
    run(duration)
}

/// Chunks ahead of the copy that [`gather_bandwidth`] prefetches: far
/// enough for a DRAM miss to be over when the copy gets there.
pub const GATHER_PREFETCH_DISTANCE: usize = 6;
/// Cache lines of 64 bytes at the head of each chunk that
/// [`gather_bandwidth`] prefetches; the stream prefetcher brings the rest.
pub const GATHER_PREFETCH_LINES: usize = 4;
/// Most chunks per batch [`gather_bandwidth`] takes.
pub const GATHER_BATCH_MAX: usize = 1 << 20;
/// Destination batches [`gather_bandwidth`] cycles through, as a client's
/// pulls in flight land in different parts of its buffer.
const GATHER_DEST_BATCHES: usize = 16;

/// What [`gather_bandwidth`] measured.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct GatherRate {
    /// Bytes of each chunk gathered.
    pub chunk_bytes: usize,
    /// Chunks gathered per batch, copied side by side into the destination.
    pub batch: usize,
    /// Bytes of the memory the chunks are taken from.
    pub working_set_bytes: usize,
    /// Chunks gathered in the measured interval.
    pub chunks: u64,
    /// Length of the measured interval, seconds.
    pub seconds: f64,
    /// Bytes gathered per second.
    pub bytes_per_s: f64,
    /// The CPU the gathering thread was pinned to.
    pub cpu: Option<usize>,
}

impl GatherRate {
    /// The JSON line (`"bench":"limit.gather"`).
    pub fn json(&self) -> String {
        json_line("limit.gather", self)
    }
}

/// Single-thread random gather: one thread (pinned to `cpu` if given)
/// copies `batch` chunks of `chunk_bytes`, each from a random place in
/// `working_set_bytes` of memory, side by side into a destination batch,
/// with the chunks [`GATHER_PREFETCH_DISTANCE`] ahead prefetched, for
/// [`WARMUP`] unmeasured and then `duration`.
///
/// This is the copy at the heart of a batched pull with no index, no
/// protocol and no other core: the bound one server thread meets when the
/// values lie at random in DRAM, where memcpy streams. The memory is the
/// kind a server's pool is (an anonymous mapping with transparent huge
/// pages, every page faulted in first), so the TLB treats both alike.
pub fn gather_bandwidth(
    chunk_bytes: usize,
    batch: usize,
    working_set_bytes: usize,
    duration: Duration,
    cpu: Option<usize>,
) -> Result<GatherRate, String> {
    check_copy_sizes(chunk_bytes, working_set_bytes, 1, "a chunk")?;
    check_range("batch", batch, GATHER_BATCH_MAX)?;
    check_duration(duration)?;
    let (chunks, seconds) = crate::run_pinned("gather", cpu, move || {
        gather_loop(chunk_bytes, batch, working_set_bytes, duration)
    })??;
    Ok(GatherRate {
        chunk_bytes,
        batch,
        working_set_bytes,
        chunks,
        seconds,
        bytes_per_s: per_s(chunks as f64 * chunk_bytes as f64, seconds),
        cpu,
    })
}

/// Gathers for the warm-up, then for `duration`; the measured chunks and
/// seconds.
fn gather_loop(
    chunk: usize,
    batch: usize,
    working_set: usize,
    duration: Duration,
) -> Result<(u64, f64), String> {
    use rand::{rngs::SmallRng, Rng, SeedableRng};
    let opts = fabrickv_engine::PoolOptions {
        populate: true,
        ..Default::default()
    };
    let mut src = fabrickv_engine::PoolMemory::new(working_set, &opts).map_err(|e| e.0)?;
    for (i, b) in src.iter_mut().enumerate() {
        *b = (i % 251) as u8;
    }
    // Chunks start on cache lines, as a pool's items do.
    let stride = chunk.div_ceil(64) * 64;
    let slots = (working_set - chunk) / stride + 1;
    let mut dst = vec![0xA5u8; GATHER_DEST_BATCHES * batch * chunk];
    let mut rng = SmallRng::seed_from_u64(0x6a7e);
    let mut at: Vec<usize> = vec![0; batch];
    let mut round = 0usize;
    let prefetch = GATHER_PREFETCH_LINES * 64;
    let mut run = |span: Duration| -> (u64, f64) {
        let start = Instant::now();
        let deadline = start + span;
        let mut chunks = 0u64;
        let mut now = start;
        while now < deadline {
            for a in at.iter_mut() {
                *a = rng.gen_range(0..slots) * stride;
            }
            let d = &mut dst[(round % GATHER_DEST_BATCHES) * batch * chunk..][..batch * chunk];
            round += 1;
            for step in 0..batch + GATHER_PREFETCH_DISTANCE {
                if let Some(&p) = at.get(step) {
                    fabrickv_engine::prefetch_bytes(&src[p..p + prefetch.min(chunk)]);
                }
                if let Some(i) = step.checked_sub(GATHER_PREFETCH_DISTANCE) {
                    let from = std::hint::black_box(&src[at[i]..at[i] + chunk]);
                    d[i * chunk..(i + 1) * chunk].copy_from_slice(from);
                }
            }
            std::hint::black_box(&mut *d);
            chunks += batch as u64;
            now = Instant::now();
        }
        (chunks, now.duration_since(start).as_secs_f64())
    };
    run(WARMUP);
    Ok(run(duration))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limits::check::testing::{sane, TEST_RUN};

    #[test]
    fn gather_measures_whole_batches_and_refuses_bad_sizes() {
        let g = gather_bandwidth(512, 10, 1 << 20, Duration::from_millis(20), None)
            .expect("a 1 MiB gather runs");
        assert!(g.chunks > 0 && g.chunks.is_multiple_of(10), "{g:?}");
        assert!(g.bytes_per_s > 0.0);
        assert!(g.json().contains("\"bench\":\"limit.gather\""));
        assert!(gather_bandwidth(0, 10, 1 << 20, Duration::from_millis(20), None).is_err());
        assert!(gather_bandwidth(4096, 10, 1024, Duration::from_millis(20), None).is_err());
    }

    #[test]
    fn memcpy_measures_copies() {
        let r = memcpy_bandwidth(4096, 1 << 20, TEST_RUN, None).expect("memcpy runs");
        assert!(sane(r.bytes_per_s) && sane(r.seconds), "{r:?}");
        assert_eq!(r.bytes, r.copies * 4096);
        assert!((r.bytes_per_s - r.bytes as f64 / r.seconds).abs() <= 1e-6 * r.bytes_per_s);
        assert!((r.gb_per_s() * 1e9 - r.bytes_per_s).abs() < 1.0);
        // A chunk not dividing the buffers, pinned to CPU 0.
        let r = memcpy_bandwidth(1000, 64 << 10, TEST_RUN, Some(0)).expect("memcpy runs");
        assert!(sane(r.bytes_per_s), "{r:?}");
        let v: serde_json::Value = serde_json::from_str(&r.json()).expect("json");
        assert_eq!(v["bench"], "limit.memcpy");
        assert_eq!(v["chunk_bytes"], 1000);
        assert_eq!(v["cpu"], 0);
    }

    #[test]
    fn memcpy_refuses_out_of_bounds_arguments() {
        let d = Duration::from_millis(10);
        assert!(memcpy_bandwidth(0, 1 << 20, d, None).is_err());
        assert!(memcpy_bandwidth(1 << 20, 1 << 20, d, None).is_err());
        assert!(memcpy_bandwidth(64, MEMCPY_WORKING_SET_BYTES_MAX + 1, d, None).is_err());
        assert!(memcpy_bandwidth(64, 1 << 20, Duration::ZERO, None).is_err());
    }
}
