//! The source side of a shard copy: copy runs inside the server that
//! serves the shard, driven by the copy's control ops (SHARD frames) and
//! feeding its data streams (formats in `fabrickv_wire::copy`). A copy run
//! lasts from its CHECKPOINT to its END; a copy resumed after a crash is a
//! new run.
//!
//! CHECKPOINT takes a consistent snapshot of the shard, binds a TCP port
//! for the data streams, and splits the snapshot into ranges on a thread
//! of its own (a pass over the keys, seconds on a large shard, which must
//! not block a worker); the target polls STATUS until the split is ready.
//! START spawns the run's coordinator: it accepts one connection per
//! stream, then runs per stream a range iterator (packs pairs of one range
//! at a time into frames, each with the range's running digest, and ends
//! the range with an END_OF_RANGE marker) and a sender (writes the frames
//! to the socket), joined by a bounded queue so reading the disk and
//! writing the network overlap and memory stays bounded. Ranges are handed
//! to streams from one queue, so a stream that finishes early takes the
//! next range. END (or every stream failing) stops it all.

//!
//! Layout: this file holds the runs and their control ops; [`split`]
//! cuts a checkpoint into ranges of about equal bytes; [`send`] runs the
//! data streams (accepting them, range iterators, senders).

mod send;
mod split;

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr, TcpListener};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use fabrickv_storage::{ShardBackend, ShardSnapshot};
use fabrickv_types::transfer::TransferClock;
use fabrickv_types::ErrorCode;
use fabrickv_wire::copy::{
    decode_run_id, CheckpointReply, CheckpointRequest, CopyState, ProtoError, StartRequest, Status,
};
use fabrickv_wire::shard::{ShardMessage, ShardOp};

/// Finds a served shard by name.
pub type ShardLookup<'a> = &'a dyn Fn(&str) -> Option<Arc<dyn ShardBackend>>;

/// Copy runs one server keeps at once (each holds a snapshot, which pins
/// the files it reads).
pub const COPY_RUNS_MAX: usize = 16;

/// Key samples taken per range when splitting a checkpoint.
pub const SAMPLES_PER_RANGE: usize = 32;

/// Frames queued between a stream's range iterator and its sender.
pub const COPY_QUEUE_FRAMES: usize = 4;

/// How long START waits for every data stream to connect and send its opening,
/// in milliseconds.
pub const COPY_ACCEPT_TIMEOUT_MS: u64 = 10_000;

/// A data stream whose socket accepts nothing for this long is given up,
/// in milliseconds (the target stopped reading).
pub const COPY_SEND_TIMEOUT_MS: u64 = 30_000;

/// A run not started this long after its checkpoint may be dropped
/// to make room for another, in milliseconds (its target went away
/// between CHECKPOINT and START, and its snapshot pins files).
pub const COPY_START_TIMEOUT_MS: u64 = 60_000;

/// How often a run logs its progress, in milliseconds.
pub const COPY_LOG_INTERVAL_MS: u64 = 1_000;

/// Pairs between two looks at the stop flag while a resumed range's held
/// prefix is read back, so END stops a long check promptly.
pub const COPY_CHECK_STOP_EVERY_PAIRS: u64 = 4096;

type Refusal = (ErrorCode, String);

/// Every copy run of one server.
pub struct CopySources {
    data_host: IpAddr,
    /// The origin of the runs' clocks.
    epoch: Instant,
    runs: Mutex<HashMap<u64, Arc<CopyRun>>>,
    next_id: AtomicU64,
}

/// What a run's control ops change, under its lock.
struct Inner {
    state: CopyState,
    error: ErrorCode,
    message: String,
    ranges: u32,
    boundaries: Option<Vec<Vec<u8>>>,
    pairs_estimate: u64,
    bytes_estimate: u64,
    started: bool,
}

/// One copy run: its checkpoint, its ranges, its streams' counters.
struct CopyRun {
    id: u64,
    /// Began at its CHECKPOINT, in ms of [`CopySources::now_ms`]: a
    /// run not started [`COPY_START_TIMEOUT_MS`] later may be dropped.
    clock: TransferClock,
    token: u64,
    shard: String,
    snapshot: Arc<dyn ShardSnapshot>,
    listener: Mutex<Option<TcpListener>>,
    inner: Mutex<Inner>,
    pairs_sent: AtomicU64,
    bytes_sent: AtomicU64,
    /// Bytes of resumed ranges read back to check what the target holds.
    bytes_checked: AtomicU64,
    ranges_done: AtomicU32,
    stop: AtomicBool,
}

impl CopyRun {
    fn status(&self) -> Status {
        let i = lock(&self.inner);
        Status {
            state: i.state,
            ready: i.boundaries.is_some(),
            error: i.error,
            ranges: i.ranges,
            ranges_done: self.ranges_done.load(Ordering::Relaxed),
            pairs_sent: self.pairs_sent.load(Ordering::Relaxed),
            bytes_sent: self.bytes_sent.load(Ordering::Relaxed),
            pairs_estimate: i.pairs_estimate,
            bytes_estimate: i.bytes_estimate,
            message: i.message.clone(),
            boundaries: i.boundaries.clone().unwrap_or_default(),
        }
    }

    /// Moves to ERROR (unless already finished) and stops every stream.
    fn fail(&self, code: ErrorCode, why: String) {
        let mut i = lock(&self.inner);
        if matches!(i.state, CopyState::Idle | CopyState::InProgress) {
            tracing::warn!(run = self.id, shard = %self.shard, "copy failed: {why}");
            i.state = CopyState::Error;
            i.error = code;
            i.message = why;
        }
        self.stop.store(true, Ordering::Release);
    }

    /// Whether the run may be dropped to make room: it is over, or
    /// its target never started it.
    fn abandoned(&self, now_ms: u64) -> bool {
        let i = lock(&self.inner);
        match i.state {
            CopyState::InProgress => false,
            CopyState::Idle => !i.started && self.clock.outlived(now_ms, COPY_START_TIMEOUT_MS),
            CopyState::Done | CopyState::Error | CopyState::Stopped => true,
        }
    }
}

impl CopySources {
    /// Copy runs whose data streams listen on `data_host`.
    pub fn new(data_host: IpAddr) -> CopySources {
        CopySources {
            data_host,
            epoch: Instant::now(),
            runs: Mutex::new(HashMap::new()),
            next_id: AtomicU64::new(1),
        }
    }

    /// Where data streams listen.
    pub fn data_host(&self) -> IpAddr {
        self.data_host
    }

    /// Milliseconds since these runs' origin: their clocks' time.
    fn now_ms(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    /// Runs one control op; appends the reply payload to `out`.
    pub fn control(
        &self,
        msg: &ShardMessage<'_>,
        shards: ShardLookup<'_>,
        out: &mut Vec<u8>,
    ) -> Result<(), Refusal> {
        let malformed = |e: ProtoError| (e.code(), e.to_string());
        match msg.op {
            ShardOp::CopyCheckpoint => {
                let req = CheckpointRequest::decode(msg.payload).map_err(malformed)?;
                let shard = shards(msg.name).ok_or_else(|| {
                    (
                        ErrorCode::NoSuchShard,
                        format!("no shard named {:?} is served here", msg.name),
                    )
                })?;
                self.checkpoint(msg.name, shard.as_ref(), &req)?.encode(out);
                Ok(())
            }
            ShardOp::CopyStart => {
                let req = StartRequest::decode(msg.payload).map_err(malformed)?;
                let s = self.run(req.run_id)?;
                start(&s, req)?;
                Ok(())
            }
            ShardOp::CopyStatus => {
                let id = decode_run_id(msg.payload).map_err(malformed)?;
                self.run(id)?.status().encode(out);
                Ok(())
            }
            ShardOp::CopyEnd => {
                let id = decode_run_id(msg.payload).map_err(malformed)?;
                let s = lock(&self.runs).remove(&id).ok_or_else(|| no_run(id))?;
                {
                    let mut i = lock(&s.inner);
                    if matches!(i.state, CopyState::Idle | CopyState::InProgress) {
                        i.state = CopyState::Stopped;
                    }
                }
                s.stop.store(true, Ordering::Release);
                tracing::info!(run = id, shard = %s.shard, "copy run ended");
                s.status().encode(out);
                Ok(())
            }
            op => Err((ErrorCode::UnknownOpcode, format!("{op:?} is not a copy op"))),
        }
    }

    fn run(&self, id: u64) -> Result<Arc<CopyRun>, Refusal> {
        lock(&self.runs).get(&id).cloned().ok_or_else(|| no_run(id))
    }

    fn checkpoint(
        &self,
        name: &str,
        shard: &dyn ShardBackend,
        req: &CheckpointRequest<'_>,
    ) -> Result<CheckpointReply, Refusal> {
        let mut runs = lock(&self.runs);
        if runs.len() >= COPY_RUNS_MAX {
            // Runs their targets never ended or never started make room
            // first.
            let now_ms = self.now_ms();
            runs.retain(|_, s| {
                let drop = s.abandoned(now_ms);
                if drop {
                    s.stop.store(true, Ordering::Release);
                }
                !drop
            });
        }
        if runs.len() >= COPY_RUNS_MAX {
            return Err((
                ErrorCode::Unavailable,
                format!("{COPY_RUNS_MAX} copy runs are open (COPY_RUNS_MAX)"),
            ));
        }
        let listener = TcpListener::bind(SocketAddr::new(self.data_host, 0)).map_err(|e| {
            (
                ErrorCode::Unavailable,
                format!("cannot listen for data streams on {}: {e}", self.data_host),
            )
        })?;
        let data_port = listener
            .local_addr()
            .map_err(|e| (ErrorCode::Unavailable, e.to_string()))?
            .port();
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let given: Option<Vec<Vec<u8>>> = if req.boundaries.is_empty() && req.ranges > 1 {
            None
        } else {
            Some(req.boundaries.iter().map(|b| b.to_vec()).collect())
        };
        let run = Arc::new(CopyRun {
            id,
            clock: TransferClock::start(self.now_ms()),
            token: rand::random(),
            shard: name.to_string(),
            snapshot: Arc::from(shard.snapshot()),
            listener: Mutex::new(Some(listener)),
            inner: Mutex::new(Inner {
                state: CopyState::Idle,
                error: ErrorCode::Ok,
                message: String::new(),
                ranges: req.ranges,
                boundaries: None,
                pairs_estimate: shard.approximate_len(),
                bytes_estimate: 0,
                started: false,
            }),
            pairs_sent: AtomicU64::new(0),
            bytes_sent: AtomicU64::new(0),
            bytes_checked: AtomicU64::new(0),
            ranges_done: AtomicU32::new(0),
            stop: AtomicBool::new(false),
        });
        let reply = CheckpointReply {
            run_id: id,
            token: run.token,
            data_port,
        };
        let s = run.clone();
        let wanted = req.ranges;
        std::thread::Builder::new()
            .name(format!("fkv-copy-split-{id}"))
            .spawn(move || split::split(&s, wanted, given))
            .map_err(|e| {
                (
                    ErrorCode::Unavailable,
                    format!("cannot start a thread: {e}"),
                )
            })?;
        runs.insert(id, run);
        tracing::info!(
            run = id,
            shard = name,
            ranges = req.ranges,
            port = data_port,
            "copy checkpoint created"
        );
        Ok(reply)
    }
}

fn no_run(id: u64) -> Refusal {
    (
        ErrorCode::NoSuchCopy,
        format!("no copy run {id} (ended, or the source restarted)"),
    )
}

/// START: checks the run and spawns its coordinator.
fn start(s: &Arc<CopyRun>, req: StartRequest) -> Result<(), Refusal> {
    if req.token != s.token {
        return Err((
            ErrorCode::Malformed,
            "the token does not match the run's".into(),
        ));
    }
    let boundaries = {
        let mut i = lock(&s.inner);
        let Some(b) = i.boundaries.clone() else {
            return Err((
                ErrorCode::CopyState,
                format!(
                    "copy run {} is {} and its checkpoint is not split yet",
                    s.id,
                    i.state.name()
                ),
            ));
        };
        if i.started || i.state != CopyState::Idle {
            return Err((
                ErrorCode::CopyState,
                format!("copy run {} is {}, not IDLE", s.id, i.state.name()),
            ));
        }
        if let Some(p) = req.resume.iter().find(|p| p.range >= i.ranges) {
            return Err((
                ErrorCode::Malformed,
                format!("resume point for range {} of {}", p.range, i.ranges),
            ));
        }
        i.started = true;
        i.state = CopyState::InProgress;
        b
    };
    let listener = lock(&s.listener).take().ok_or_else(|| {
        (
            ErrorCode::CopyState,
            "the run's data port is gone".to_string(),
        )
    })?;
    let s = s.clone();
    std::thread::Builder::new()
        .name(format!("fkv-copy-{}", s.id))
        .spawn(move || send::coordinate(&s, listener, req, boundaries))
        .map_err(|e| {
            (
                ErrorCode::Unavailable,
                format!("cannot start a thread: {e}"),
            )
        })?;
    Ok(())
}

/// Locks `m`; a panicked holder left plain data behind, still usable.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}
