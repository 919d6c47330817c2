//! One data-path thread: poll a burst, execute it, flush once, repeat.
//!
//! Idle back-off: after a burst that found nothing the worker keeps polling
//! for `IDLE_SPIN_US` (a client in a tight request loop is answered without
//! a wake-up), then blocks in the transport's wait so an idle server uses
//! no CPU. Between polls it yields its core (`sched_yield`) rather than
//! spinning in place: when threads outnumber cores (clients and servers
//! on one machine, several servers sharing cores) a pure spin holds the
//! core for a whole time slice while a thread with work waits for it.
//! Measured on this project's 2-core machine: three one-worker servers
//! beside one two-worker server (`fabrickv bench cluster`) went from 0.52
//! to 0.55x to 0.74 to 0.90x the throughput and from 1.8 to 2.1x to 0.9 to
//! 1.1x the 100-key multi-get latency, and `bench herd` with two workers
//! from 2.1 to 3.5 Mops; single-worker figures stayed within the noise.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use fabrickv_transport::WorkerPort;

use fabrickv_wire::FrameKind;

use crate::cache::CacheService;
use crate::kv::{Clock, KvService};
use crate::ps::PsService;
use crate::shard::ShardService;

/// Offset of the kind byte in a frame header.
const FRAME_KIND_AT: usize = 3;

/// Most messages handled per burst before replies are flushed. Small on
/// purpose: a client keeps several frames in flight, and flushing after
/// every few lets it check replies while the rest execute; flushing only
/// after its whole window puts client and server in lock step, each idle
/// while the other works. Measured on this project's 2-core machine (HERD
/// mix, one worker, 8 frames in flight): 4 gave 14.9 Mops over shm and 6.9
/// over tcp; 64 gave 8.4 and 5.2. Each frame already batches up to
/// `BATCH_OPS_MAX` operations, so a flush still carries many.
pub const POLL_BURST_MSGS: usize = 4;

/// How long an idle worker keeps polling before it blocks, in microseconds.
pub const IDLE_SPIN_US: u64 = 100;

/// Longest block in the transport's wait, in milliseconds; bounds how late
/// the TTL sweep runs on an idle server.
pub const IDLE_WAIT_MS: u64 = 200;

/// How often the TTL sweep runs, in milliseconds.
pub const SWEEP_INTERVAL_MS: u64 = 100;

/// Index buckets the TTL sweep visits per run: 1 MiB of index, a fraction
/// of a millisecond. A 64 MiB partition's index (128 Ki buckets) is swept
/// in about a second; a 1 GiB one (4 Mi buckets) in about 25 s when busy
/// and 50 s when idle (runs are then `IDLE_WAIT_MS` apart). Expired items
/// are never served in between; the sweep only gives their memory back.
pub const SWEEP_BUCKETS_PER_RUN: usize = 16384;

/// The services a worker dispatches to, by frame kind.
pub struct Services {
    /// Key-value frames (and HELLO, STATS).
    pub kv: KvService,
    /// Embedding-table frames.
    pub ps: PsService,
    /// KV-cache frames, and the gRPC transfers queued to this worker.
    pub cache: CacheService,
    /// Persistent-shard frames (data and copy control).
    pub shard: ShardService,
}

/// Runs a worker until `stop` is set.
pub fn run(mut port: Box<dyn WorkerPort>, services: Services, clock: Clock, stop: &AtomicBool) {
    let Services {
        mut kv,
        mut ps,
        mut cache,
        mut shard,
    } = services;
    let mut idle_since: Option<Instant> = None;
    let mut last_sweep = clock.now_ms();
    while !stop.load(Ordering::Acquire) {
        let now = clock.now_ms();
        // The service reports the transport's counters in STATS replies.
        kv.set_transport_stats(port.stats());
        let jobs = cache.run_jobs(port.as_mut());
        let handled = match port.poll(POLL_BURST_MSGS, &mut |conn, msg, reply| {
            // The kind byte picks the service; each decodes the whole frame.
            let kind = msg.get(FRAME_KIND_AT).copied();
            if kind == Some(FrameKind::Ps as u8) {
                if ps.handle(msg, reply, now) {
                    kv.count_refused();
                }
            } else if kind == Some(FrameKind::Cache as u8) {
                if cache.handle(conn, msg, reply, now) {
                    kv.count_refused();
                }
            } else if kind == Some(FrameKind::Shard as u8) {
                if shard.handle(msg, reply) {
                    kv.count_refused();
                }
            } else {
                kv.handle(msg, reply.buf(), now)
            }
        }) {
            Ok(n) => n + jobs,
            Err(e) => {
                tracing::error!("worker poll failed: {e}");
                break;
            }
        };
        if let Err(e) = port.flush() {
            tracing::error!("worker flush failed: {e}");
        }
        if now.saturating_sub(last_sweep) >= SWEEP_INTERVAL_MS {
            kv.sweep(now, SWEEP_BUCKETS_PER_RUN);
            cache.sweep(now);
            last_sweep = now;
        }
        if handled > 0 {
            idle_since = None;
            continue;
        }
        let since = *idle_since.get_or_insert_with(Instant::now);
        if since.elapsed() < Duration::from_micros(IDLE_SPIN_US) {
            // Lets a runnable thread have this core; returns at once when
            // there is none.
            std::thread::yield_now();
            continue;
        }
        if let Err(e) = port.wait(Duration::from_millis(IDLE_WAIT_MS)) {
            tracing::error!("worker wait failed: {e}");
            break;
        }
    }
}
