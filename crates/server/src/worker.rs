//! One data-path thread: poll a burst, execute it, flush once, repeat.
//!
//! The request layer: [`Worker::handle`] decodes each frame once, refuses
//! a frame that does not decode (or whose kind no one serves) with one
//! ERROR frame counted in `frames_refused`, answers HELLO and STATS
//! itself, and hands every other frame to the service that owns its kind
//! ([`crate::service`] says what a service is). STATS is assembled here
//! from each service's counters.
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

use fabrickv_transport::{ConnId, PortStats, Reply, WorkerPort};
use fabrickv_types::ErrorCode;
use fabrickv_wire::control::{
    decode_partitions_request, encode_hello_reply, encode_partitions_reply, encode_stats_reply,
};
use fabrickv_wire::FrameKind;

use crate::cache::CacheService;
use crate::kv::KvService;
use crate::ps::PsService;
use crate::service::{decode_or_refuse, refuse, Call, Clock, Service, StatsList};
use crate::shard::ShardService;

pub use crate::kv::SWEEP_BUCKETS_PER_RUN;

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

/// The services a worker dispatches to, by frame kind.
pub struct Services {
    /// Key-value frames (REQUEST).
    pub kv: KvService,
    /// Embedding-table frames (PS).
    pub ps: PsService,
    /// KV-cache frames (CACHE), and the gRPC transfers queued to this worker.
    pub cache: CacheService,
    /// Persistent-shard frames (SHARD: data and copy control).
    pub shard: ShardService,
}

/// The request layer of one worker, without I/O: each message in is
/// decoded once, refused once when it must be, answered here when it
/// asks about the worker (HELLO, STATS), and otherwise handed to the
/// service that owns its kind.
pub struct Worker {
    /// This worker's id, sent in every reply header.
    id: u16,
    /// The services, each held by its type (no virtual call per frame).
    services: Services,
    /// Frames refused whole with an ERROR frame, by any service or here.
    frames_refused: u64,
    /// The worker port's counters as of the current burst, for STATS.
    transport: PortStats,
}

impl Worker {
    /// The request layer of worker `id` over its services.
    pub fn new(id: u16, services: Services) -> Worker {
        Worker {
            id,
            services,
            frames_refused: 0,
            transport: PortStats::default(),
        }
    }

    /// Handles one message from connection `conn`, appending the reply.
    ///
    /// This is the one place every frame passes after it is decoded and
    /// before any service sees it, with its connection and kind at hand:
    /// a per-connection check (has this connection authenticated?) and a
    /// per-op one (a [`Service`] method saying whether a call is
    /// administrative) belong between the decode and the `match`, and a
    /// refusal there is answered and counted like any other.
    #[inline]
    pub fn handle(&mut self, conn: ConnId, msg: &[u8], reply: &mut dyn Reply, now_ms: u64) {
        let Some(frame) = decode_or_refuse(msg, self.id, reply.buf()) else {
            self.frames_refused += 1;
            return;
        };
        let call = Call {
            conn,
            frame,
            now_ms,
        };
        let s = &mut self.services;
        let done = match frame.header.kind {
            FrameKind::Request => s.kv.handle(&call, reply),
            FrameKind::Ps => s.ps.handle(&call, reply),
            FrameKind::Cache => s.cache.handle(&call, reply),
            FrameKind::Shard => s.shard.handle(&call, reply),
            FrameKind::Hello => {
                let info = s.kv.server_info();
                encode_hello_reply(reply.buf(), call.id(), self.id, &info);
                Ok(())
            }
            FrameKind::Stats => {
                let list = self.stats_list();
                encode_stats_reply(reply.buf(), call.id(), self.id, &list);
                Ok(())
            }
            FrameKind::Partitions => partitions(s, &call, self.id, reply),
            other => Err((
                ErrorCode::UnknownOpcode,
                format!("{other:?} is not a request"),
            )),
        };
        if let Err(r) = done {
            self.frames_refused += 1;
            refuse(reply.buf(), call.id(), self.id, &r);
        }
    }

    /// Records the transport's counters, to be reported by STATS.
    pub fn set_transport_stats(&mut self, s: PortStats) {
        self.transport = s;
    }

    /// Runs every service's queued jobs; returns how many ran.
    pub fn run_jobs(&mut self, port: &mut dyn WorkerPort) -> usize {
        let s = &mut self.services;
        s.kv.run_jobs(port) + s.ps.run_jobs(port) + s.cache.run_jobs(port) + s.shard.run_jobs(port)
    }

    /// Runs every service's periodic work.
    pub fn sweep(&mut self, now_ms: u64) {
        let s = &mut self.services;
        s.kv.sweep(now_ms);
        s.ps.sweep(now_ms);
        s.cache.sweep(now_ms);
        s.shard.sweep(now_ms);
    }

    /// The counters a STATS reply carries, in the order clients know:
    /// the kv engine's, the protocol's, the transport's, then (worker 0
    /// only) the shared stores'.
    pub fn stats_list(&self) -> StatsList {
        let s = &self.services;
        let mut list = StatsList::with_capacity(64);
        s.kv.engine_stats(&mut list);
        let kv = s.kv.counters();
        let t = self.transport;
        list.extend([
            ("frames", kv.frames),
            ("ops", kv.ops),
            ("frames_refused", self.frames_refused),
            ("misrouted", kv.misrouted),
            ("reply_full", kv.reply_full),
            ("conns_accepted", t.conns_accepted),
            ("conns_open", t.conns_open),
            ("conns_closed_framing", t.conns_closed_framing),
            ("conns_closed_timeout", t.conns_closed_timeout),
            ("msgs_in", t.msgs_in),
            ("msgs_out", t.msgs_out),
            ("backpressure_pauses", t.backpressure_pauses),
            ("spliced_bytes", t.spliced_bytes),
            (
                "partitions_owned",
                s.kv.partitions().owned_by(self.id) as u64,
            ),
        ]);
        // The embedding and KV-cache stores are shared: worker 0 alone
        // reports them, so clients that add up workers count them once.
        if self.id == 0 {
            s.kv.shared_stats(&mut list);
            s.ps.shared_stats(&mut list);
            s.cache.shared_stats(&mut list);
            s.shard.shared_stats(&mut list);
        }
        list
    }
}

/// Answers a PARTITIONS frame: moves a partition first if it asks to,
/// then replies with the table. Any worker answers it; the connection
/// proved the server's secret at its handshake, as every administrative
/// frame's does.
fn partitions(
    s: &Services,
    call: &Call<'_>,
    id: u16,
    reply: &mut dyn Reply,
) -> Result<(), crate::service::Refusal> {
    let parts = s.kv.partitions();
    let mv = decode_partitions_request(&call.frame).map_err(crate::service::wire_refusal)?;
    if let Some(m) = mv {
        match parts.move_partition(m.partition, m.worker) {
            Ok(epoch) => tracing::info!(
                partition = m.partition,
                worker = m.worker,
                epoch,
                "partition moved"
            ),
            Err(e @ crate::partitions::MoveError::NoSuchWorker) => {
                return Err((ErrorCode::NoSuchWorker, format!("worker {}: {e}", m.worker)))
            }
            Err(e) => {
                return Err((
                    ErrorCode::Malformed,
                    format!("partition {}: {e}", m.partition),
                ))
            }
        }
    }
    encode_partitions_reply(reply.buf(), call.id(), id, &parts.table());
    Ok(())
}

/// Runs a worker until `stop` is set.
pub fn run(mut port: Box<dyn WorkerPort>, mut worker: Worker, clock: Clock, stop: &AtomicBool) {
    let mut idle_since: Option<Instant> = None;
    let mut last_sweep = clock.now_ms();
    while !stop.load(Ordering::Acquire) {
        let now = clock.now_ms();
        // STATS replies report the transport's counters.
        worker.set_transport_stats(port.stats());
        let jobs = worker.run_jobs(port.as_mut());
        let handled = match port.poll(POLL_BURST_MSGS, &mut |conn, msg, reply| {
            worker.handle(conn, msg, reply, now)
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
            worker.sweep(now);
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

#[cfg(test)]
mod tests;
