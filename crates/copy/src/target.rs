//! The target side of a copy: pulls a shard from a server into a local
//! directory.
//!
//! The control runs over the native protocol (SHARD frames): CHECKPOINT,
//! STATUS until the checkpoint is split, START, STATUS while streaming,
//! END. Each data stream has a receiver thread (reads frames, checks each
//! range's sequence and running digest) and a writer thread (bulk-loads
//! the pairs as tables with no journal), joined by a bounded queue. Every
//! `durable_every_bytes` of a range, at a frame boundary, the writer ends
//! its load (tables written and synced) and records the range's position
//! (next sequence, running digest, last key) in the progress file, synced:
//! that is where `--resume` continues after a crash. When every range has
//! ended, the shard is synced and, unless told otherwise, scanned whole:
//! its digest must equal the sum of the ranges' digests the source sent.

use std::io::{Read, Write as _};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crossbeam_channel::{bounded, Receiver, RecvTimeoutError, Sender};
use fabrickv_client::ShardClient;
use fabrickv_storage::{Digest, FjallShard, ShardBackend, ShardOptions, StorageError};
use fabrickv_types::ErrorCode;
use fabrickv_wire::shard::ShardOp;
use serde::{Deserialize, Serialize};

use crate::proto::{
    decode_abort, encode_session, range_bounds, CheckpointReply, CheckpointRequest, CopyState,
    FrameHeader, FrameKind, Hello, Pairs, ResumePoint, StartRequest, Status, COPY_RANGES_MAX,
    COPY_STREAMS_MAX, FRAME_HEADER_BYTES,
};
use crate::source::{COPY_LOG_INTERVAL_MS, COPY_QUEUE_FRAMES};
use crate::{data_host, lock};

/// The file in the target directory that records a copy's progress.
pub const COPY_PROGRESS_FILE: &str = "fabrickv-copy.progress";

/// Bytes of a range a writer loads before it makes them durable and
/// records the position (the granularity of `--resume`).
pub const COPY_DURABLE_BYTES_DEFAULT: u64 = 256 << 20;

/// Ranges a copy is split into unless told otherwise.
pub const COPY_RANGES_DEFAULT: u32 = 16;

/// Parallel streams unless told otherwise.
pub const COPY_PARALLELISM_DEFAULT: u16 = 2;

/// How often the target asks the source for its status while waiting for
/// the split, in milliseconds.
pub const COPY_SPLIT_POLL_MS: u64 = 20;

/// How often the target asks the source for its status while streaming,
/// in milliseconds (a source that failed says so here).
pub const COPY_STATUS_POLL_MS: u64 = 500;

/// Block cache of the target shard while copying, in bytes: none. The
/// writer never reads back what it wrote, and the verification scan reads
/// each value once, so a cache only costs: fjall inserts every value it
/// reads from a blob file, evicting another (the served shard's cache is
/// none for the same reason, `SERVED_SHARD_CACHE_BYTES`).
pub const COPY_TARGET_CACHE_BYTES: u64 = 0;

/// What to copy, from where, to where, how.
#[derive(Debug, Clone)]
pub struct CopyOptions {
    /// The source server's native address.
    pub from: String,
    /// The shard's name on the source.
    pub shard: String,
    /// The target directory.
    pub to: PathBuf,
    /// Ranges to split the shard into.
    pub ranges: u32,
    /// Data streams (parallel range iterators on the source, receivers and
    /// writers here).
    pub parallelism: u16,
    /// Continue an interrupted copy from each range's last durable
    /// position; without it an interrupted copy starts over.
    pub resume: bool,
    /// Bound on connecting (control and data).
    pub connect_timeout: Duration,
    /// Bound on each control op, and on silence of a data stream.
    pub op_timeout: Duration,
    /// See [`COPY_DURABLE_BYTES_DEFAULT`].
    pub durable_every_bytes: u64,
    /// Scan the copy at the end and compare its digest with the source's.
    pub verify: bool,
    /// Leave the copy's pages in the page cache after each durable load.
    /// Off by default, as RocksDB's bulk file writer invalidates the pages
    /// it writes: a bulk copy otherwise fills memory with pages nobody
    /// reads until the verification, evicting everything else the machine
    /// caches, and the verification then checks the cache, not the disk.
    pub keep_cached: bool,
}

impl CopyOptions {
    /// Options with the defaults for everything but the three names.
    pub fn new(from: &str, shard: &str, to: &Path) -> CopyOptions {
        CopyOptions {
            from: from.to_string(),
            shard: shard.to_string(),
            to: to.to_path_buf(),
            ranges: COPY_RANGES_DEFAULT,
            parallelism: COPY_PARALLELISM_DEFAULT,
            resume: false,
            connect_timeout: Duration::from_secs(5),
            op_timeout: Duration::from_secs(30),
            durable_every_bytes: COPY_DURABLE_BYTES_DEFAULT,
            verify: true,
            keep_cached: false,
        }
    }
}

/// Why a copy failed: a stable code and what happened.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{} (code {}): {message}", code.name(), code.as_u16())]
pub struct CopyError {
    /// The stable code.
    pub code: ErrorCode,
    /// What happened.
    pub message: String,
}

fn err(code: ErrorCode, message: impl Into<String>) -> CopyError {
    CopyError {
        code,
        message: message.into(),
    }
}

fn storage(what: &str, e: StorageError) -> CopyError {
    let text = e.to_string();
    // A full disk is the one storage failure a user can act on at once.
    let code = if text.contains("No space left") || text.contains("os error 28") {
        ErrorCode::InsufficientSpace
    } else {
        ErrorCode::StorageFailed
    };
    err(code, format!("{what}: {text}"))
}

fn client(what: &str, e: fabrickv_client::ClientError) -> CopyError {
    err(e.code(), format!("{what}: {e}"))
}

/// What a copy reports as it goes.
#[derive(Debug, Clone, Copy)]
pub enum Event<'a> {
    /// Streaming begins.
    Started {
        /// Ranges of the checkpoint.
        ranges: u32,
        /// Ranges already done by an earlier run (resume).
        ranges_done: u32,
        /// The source's estimate of the shard's key and value bytes.
        bytes_estimate: u64,
        /// Bytes already durable from an earlier run (resume).
        bytes_before: u64,
    },
    /// Pairs and bytes written so far (this run).
    Progress {
        /// Pairs.
        pairs: u64,
        /// Key and value bytes.
        bytes: u64,
    },
    /// A line for the log.
    Log(&'a str),
}

/// What a finished copy did.
#[derive(Debug, Clone)]
pub struct CopyReport {
    /// Pairs in the copy (all runs).
    pub pairs: u64,
    /// Key and value bytes in the copy (all runs).
    pub bytes: u64,
    /// Bytes streamed and written by this run.
    pub bytes_this_run: u64,
    /// Seconds from START to every range synced.
    pub copy_secs: f64,
    /// Seconds of the verification scan (0 when off).
    pub verify_secs: f64,
    /// The copy's digest.
    pub digest: Digest,
    /// Ranges of the checkpoint.
    pub ranges: u32,
    /// Ranges an earlier run had finished.
    pub ranges_resumed: u32,
    /// The rate over time: (seconds since START, MB/s over the interval).
    pub samples: Vec<(f64, f64)>,
    /// Whether the scan confirmed the digest.
    pub verified: bool,
}

impl CopyReport {
    /// MB/s (decimal) of this run's bytes over `copy_secs`.
    pub fn mb_per_s(&self) -> f64 {
        self.bytes_this_run as f64 / self.copy_secs.max(1e-9) / 1e6
    }
}

/// A range's durable position, as the progress file keeps it.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
struct RangeProgress {
    done: bool,
    next_seq: u64,
    pairs: u64,
    bytes: u64,
    /// The digest sum, 32 hex digits.
    sum: String,
    /// The last durable key, hex.
    after: String,
}

impl RangeProgress {
    fn digest(&self) -> Result<Digest, CopyError> {
        let sum = u128::from_str_radix(&self.sum, 16)
            .map_err(|_| err(ErrorCode::Malformed, "progress file: a bad digest"))?;
        Ok(Digest {
            pairs: self.pairs,
            bytes: self.bytes,
            sum,
        })
    }

    fn set(&mut self, next_seq: u64, d: &Digest, after: &[u8], done: bool) {
        self.next_seq = next_seq;
        self.pairs = d.pairs;
        self.bytes = d.bytes;
        self.sum = format!("{:032x}", d.sum);
        self.after = hex(after);
        self.done = done;
    }
}

/// The progress file: what was copied from where, and each range's
/// durable position.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Progress {
    version: u32,
    from: String,
    shard: String,
    /// Lower bounds of ranges 1.., hex.
    boundaries: Vec<String>,
    ranges: Vec<RangeProgress>,
    complete: bool,
}

const PROGRESS_VERSION: u32 = 1;

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn unhex(s: &str) -> Result<Vec<u8>, CopyError> {
    let bad = || err(ErrorCode::Malformed, "progress file: bad hex");
    if !s.len().is_multiple_of(2) {
        return Err(bad());
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2).ok_or_else(bad)?, 16).map_err(|_| bad()))
        .collect()
}

impl Progress {
    fn path(dir: &Path) -> PathBuf {
        dir.join(COPY_PROGRESS_FILE)
    }

    fn load(dir: &Path) -> Result<Option<Progress>, CopyError> {
        let text = match std::fs::read_to_string(Self::path(dir)) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(err(ErrorCode::StorageFailed, format!("progress file: {e}"))),
        };
        let p: Progress = serde_json::from_str(&text)
            .map_err(|e| err(ErrorCode::Malformed, format!("progress file: {e}")))?;
        let split = p.ranges.len() == p.boundaries.len() + 1;
        let unsplit = p.ranges.is_empty() && p.boundaries.is_empty();
        if p.version != PROGRESS_VERSION || !(split || unsplit) {
            return Err(err(
                ErrorCode::Malformed,
                "progress file of another version",
            ));
        }
        Ok(Some(p))
    }

    /// Writes the file durably: a temporary file, synced, renamed over the
    /// old one, and the directory synced, so a crash leaves the old or the
    /// new file whole.
    fn save(&self, dir: &Path) -> Result<(), CopyError> {
        let io = |e: std::io::Error| err(ErrorCode::StorageFailed, format!("progress file: {e}"));
        let tmp = dir.join(format!("{COPY_PROGRESS_FILE}.tmp"));
        let text = serde_json::to_vec(self).map_err(|e| err(ErrorCode::Internal, e.to_string()))?;
        let mut f = std::fs::File::create(&tmp).map_err(io)?;
        f.write_all(&text).map_err(io)?;
        f.sync_all().map_err(io)?;
        std::fs::rename(&tmp, Self::path(dir)).map_err(io)?;
        std::fs::File::open(dir)
            .and_then(|d| d.sync_all())
            .map_err(io)
    }

    fn boundaries(&self) -> Result<Vec<Vec<u8>>, CopyError> {
        self.boundaries.iter().map(|b| unhex(b)).collect()
    }

    fn resume_points(&self) -> Result<Vec<ResumePoint>, CopyError> {
        let mut v = Vec::new();
        for (r, p) in self.ranges.iter().enumerate() {
            if p.done || p.pairs > 0 {
                v.push(ResumePoint {
                    range: r as u32,
                    done: p.done,
                    next_seq: p.next_seq,
                    digest: p.digest()?,
                    after: unhex(&p.after)?,
                });
            }
        }
        Ok(v)
    }
}

/// Makes the target directory ready: returns the progress to resume from,
/// if any. Without `resume`, a directory holding an earlier copy (its
/// progress file) is emptied; one holding anything else is refused, so a
/// copy never deletes data it did not write.
fn prepare(opts: &CopyOptions) -> Result<Option<Progress>, CopyError> {
    let dir = &opts.to;
    let io = |e: std::io::Error| err(ErrorCode::StorageFailed, format!("{}: {e}", dir.display()));
    let empty = match std::fs::read_dir(dir) {
        Ok(mut it) => it.next().is_none(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => true,
        Err(e) => return Err(io(e)),
    };
    if empty {
        std::fs::create_dir_all(dir).map_err(io)?;
        return Ok(None);
    }
    let progress = Progress::load(dir)?;
    let Some(p) = progress else {
        return Err(err(
            ErrorCode::ConditionFailed,
            format!(
                "{} is not empty and holds no copy (no {COPY_PROGRESS_FILE}); give an empty or new directory",
                dir.display()
            ),
        ));
    };
    if opts.resume && p.shard == opts.shard && !p.ranges.is_empty() {
        if p.from != opts.from {
            tracing::info!(
                "resuming a copy of {:?} made from {}, now from {}",
                p.shard,
                p.from,
                opts.from
            );
        }
        return Ok(Some(p));
    }
    if opts.resume {
        tracing::warn!(
            "{} holds no resumable copy of {:?} (it has {:?}, split: {}): starting over",
            dir.display(),
            opts.shard,
            p.shard,
            !p.ranges.is_empty()
        );
    }
    std::fs::remove_dir_all(dir).map_err(io)?;
    std::fs::create_dir_all(dir).map_err(io)?;
    Ok(None)
}

/// Marks a fresh target directory as a copy's before anything else is
/// written to it, so a copy that fails at any point leaves a directory a
/// rerun recognises (and empties, or resumes).
fn claim(opts: &CopyOptions) -> Result<(), CopyError> {
    Progress {
        version: PROGRESS_VERSION,
        from: opts.from.clone(),
        shard: opts.shard.clone(),
        boundaries: Vec::new(),
        ranges: Vec::new(),
        complete: false,
    }
    .save(&opts.to)
}

/// State the streams share with the control loop.
struct Shared {
    dir: PathBuf,
    progress: Mutex<Progress>,
    pairs: AtomicU64,
    bytes: AtomicU64,
    failure: Mutex<Option<CopyError>>,
    stop: AtomicBool,
    durable_every: u64,
    keep_cached: bool,
}

impl Shared {
    fn fail(&self, e: CopyError) {
        let mut f = lock(&self.failure);
        if f.is_none() {
            *f = Some(e);
        }
        self.stop.store(true, Ordering::Release);
    }

    fn failed(&self) -> Option<CopyError> {
        lock(&self.failure).clone()
    }
}

/// A checked frame on its way from a receiver to its writer.
struct Item {
    range: u32,
    seq: u64,
    end: bool,
    digest: Digest,
    pairs: u64,
    /// The frame's payload.
    buf: Vec<u8>,
}

/// Copies `opts.shard` from `opts.from` into `opts.to`, calling `on_event`
/// as it goes (from this thread only).
pub fn copy(
    opts: &CopyOptions,
    on_event: &mut dyn FnMut(Event<'_>),
) -> Result<CopyReport, CopyError> {
    if opts.ranges == 0 || opts.ranges > COPY_RANGES_MAX {
        return Err(err(
            ErrorCode::Malformed,
            format!("ranges must be 1..={COPY_RANGES_MAX}"),
        ));
    }
    if opts.parallelism == 0 || opts.parallelism > COPY_STREAMS_MAX {
        return Err(err(
            ErrorCode::Malformed,
            format!("parallelism must be 1..={COPY_STREAMS_MAX}"),
        ));
    }
    // The source first: a copy that cannot reach it changes nothing here.
    let mut ctl = ShardClient::connect(&opts.from, opts.connect_timeout)
        .map_err(|e| client(&format!("connecting to {}", opts.from), e))?;
    ctl.set_timeout(opts.op_timeout);
    let resumed = prepare(opts)?;
    if resumed.is_none() {
        claim(opts)?;
    }
    let shard = FjallShard::open(
        &opts.to,
        &ShardOptions {
            cache_bytes: COPY_TARGET_CACHE_BYTES,
            create: true,
        },
    )
    .map_err(|e| storage("opening the target shard", e))?;
    // Checkpoint: a resumed copy asks for the ranges it had.
    let boundaries_had = match &resumed {
        Some(p) => p.boundaries()?,
        None => Vec::new(),
    };
    let ranges_wanted = if resumed.is_some() {
        boundaries_had.len() as u32 + 1
    } else {
        opts.ranges
    };
    let req = CheckpointRequest {
        ranges: ranges_wanted,
        boundaries: boundaries_had.iter().map(Vec::as_slice).collect(),
    };
    let reply = ctl
        .copy_control(ShardOp::CopyCheckpoint, &opts.shard, |b| req.encode(b))
        .map_err(|e| client("CHECKPOINT", e))?;
    let cp = CheckpointReply::decode(&reply).map_err(|e| err(e.code(), e.to_string()))?;
    let result = run_session(opts, &shard, &mut ctl, &cp, resumed, on_event);
    // The session is ended whatever happened; a failure to end it is only
    // logged (the source drops finished sessions when it needs room).
    if let Err(e) = ctl.copy_control(ShardOp::CopyEnd, "", |b| encode_session(b, cp.session)) {
        tracing::debug!("END of copy session {}: {e}", cp.session);
    }
    result
}

fn status(ctl: &mut ShardClient, session: u64) -> Result<Status, CopyError> {
    let b = ctl
        .copy_control(ShardOp::CopyStatus, "", |b| encode_session(b, session))
        .map_err(|e| client("STATUS", e))?;
    Status::decode(&b).map_err(|e| err(e.code(), e.to_string()))
}

fn source_failed(st: &Status) -> CopyError {
    err(
        st.error,
        format!("the source reports {}: {}", st.state.name(), st.message),
    )
}

fn run_session(
    opts: &CopyOptions,
    shard: &FjallShard,
    ctl: &mut ShardClient,
    cp: &CheckpointReply,
    resumed: Option<Progress>,
    on_event: &mut dyn FnMut(Event<'_>),
) -> Result<CopyReport, CopyError> {
    let st = loop {
        let st = status(ctl, cp.session)?;
        if matches!(st.state, CopyState::Error | CopyState::Stopped) {
            return Err(source_failed(&st));
        }
        if st.ready {
            break st;
        }
        std::thread::sleep(Duration::from_millis(COPY_SPLIT_POLL_MS));
    };
    let progress = match resumed {
        Some(p) => {
            if p.boundaries()? != st.boundaries {
                return Err(err(
                    ErrorCode::Internal,
                    "the source split the resumed copy differently",
                ));
            }
            p
        }
        None => {
            let p = Progress {
                version: PROGRESS_VERSION,
                from: opts.from.clone(),
                shard: opts.shard.clone(),
                boundaries: st.boundaries.iter().map(|b| hex(b)).collect(),
                ranges: vec![RangeProgress::default(); st.boundaries.len() + 1],
                complete: false,
            };
            p.save(&opts.to)?;
            p
        }
    };
    let resume = progress.resume_points()?;
    let ranges = progress.ranges.len() as u32;
    let ranges_resumed = progress.ranges.iter().filter(|r| r.done).count() as u32;
    let bytes_before: u64 = progress.ranges.iter().map(|r| r.bytes).sum();
    let all_done = ranges_resumed == ranges;
    let shared = Arc::new(Shared {
        dir: opts.to.clone(),
        progress: Mutex::new(progress),
        pairs: AtomicU64::new(0),
        bytes: AtomicU64::new(0),
        failure: Mutex::new(None),
        stop: AtomicBool::new(false),
        durable_every: opts.durable_every_bytes.max(1),
        keep_cached: opts.keep_cached,
    });
    on_event(Event::Started {
        ranges,
        ranges_done: ranges_resumed,
        bytes_estimate: st.bytes_estimate,
        bytes_before,
    });
    let t0 = Instant::now();
    let mut samples = Vec::new();
    if !all_done {
        let start = StartRequest {
            session: cp.session,
            token: cp.token,
            streams: opts
                .parallelism
                .min(ranges.try_into().unwrap_or(u16::MAX))
                .max(1),
            resume,
        };
        ctl.copy_control(ShardOp::CopyStart, "", |b| start.encode(b))
            .map_err(|e| client("START", e))?;
        samples = stream(opts, shard, ctl, cp, &start, &shared, on_event)?;
    }
    let bytes_this_run = shared.bytes.load(Ordering::Relaxed);
    shard
        .sync()
        .map_err(|e| storage("syncing the target shard", e))?;
    let copy_secs = t0.elapsed().as_secs_f64();
    let mut expected = Digest::default();
    {
        let p = lock(&shared.progress);
        for r in &p.ranges {
            expected.merge(&r.digest()?);
        }
    }
    let tv = Instant::now();
    let verified = if opts.verify {
        on_event(Event::Log("verifying: scanning the copy"));
        let (boundaries, wanted) = {
            let p = lock(&shared.progress);
            let wanted = p
                .ranges
                .iter()
                .map(RangeProgress::digest)
                .collect::<Result<Vec<_>, _>>()?;
            (p.boundaries()?, wanted)
        };
        let got = scan_ranges(shard, &boundaries, usize::from(opts.parallelism))?;
        if let Some(r) = (0..got.len()).find(|&r| got[r] != wanted[r]) {
            return Err(err(
                ErrorCode::BadChecksum,
                format!(
                    "range {r} of the copy holds {} pairs, {} bytes, digest {}; the source sent {} pairs, {} bytes, digest {}",
                    got[r].pairs,
                    got[r].bytes,
                    got[r].hex(),
                    wanted[r].pairs,
                    wanted[r].bytes,
                    wanted[r].hex()
                ),
            ));
        }
        true
    } else {
        false
    };
    let verify_secs = if opts.verify {
        tv.elapsed().as_secs_f64()
    } else {
        0.0
    };
    {
        let mut p = lock(&shared.progress);
        p.complete = true;
        p.save(&opts.to)?;
    }
    Ok(CopyReport {
        pairs: expected.pairs,
        bytes: expected.bytes,
        bytes_this_run,
        copy_secs,
        verify_secs,
        digest: expected,
        ranges,
        ranges_resumed,
        samples,
        verified,
    })
}

/// The digest of each range of `shard` (bounds as the copy's), scanned
/// by `threads` threads at once (the whole copy is read back).
fn scan_ranges(
    shard: &FjallShard,
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

/// Runs the data streams to the end; returns the rate samples.
fn stream(
    opts: &CopyOptions,
    shard: &FjallShard,
    ctl: &mut ShardClient,
    cp: &CheckpointReply,
    start: &StartRequest,
    shared: &Arc<Shared>,
    on_event: &mut dyn FnMut(Event<'_>),
) -> Result<Vec<(f64, f64)>, CopyError> {
    let addr = SocketAddr::new(data_host(&opts.from), cp.data_port);
    let mut socks = Vec::new();
    for i in 0..start.streams {
        let mut s = TcpStream::connect_timeout(&addr, opts.connect_timeout).map_err(|e| {
            err(
                ErrorCode::Unavailable,
                format!("data stream to {addr}: {e}"),
            )
        })?;
        let hello = Hello {
            session: cp.session,
            token: cp.token,
            stream: u32::from(i),
        };
        s.write_all(&hello.encode())
            .and_then(|()| s.set_read_timeout(Some(opts.op_timeout)))
            .map_err(|e| {
                err(
                    ErrorCode::Unavailable,
                    format!("data stream to {addr}: {e}"),
                )
            })?;
        socks.push(s);
    }
    let closers: Vec<TcpStream> = socks.iter().filter_map(|s| s.try_clone().ok()).collect();
    let t0 = Instant::now();
    let result = std::thread::scope(|scope| {
        let (done_tx, done_rx) = bounded::<()>(1);
        for (i, sock) in socks.into_iter().enumerate() {
            let (tx, rx) = bounded::<Item>(COPY_QUEUE_FRAMES);
            let (free_tx, free_rx) = bounded::<Vec<u8>>(COPY_QUEUE_FRAMES + 2);
            let (sh, d) = (shared.clone(), done_tx.clone());
            scope.spawn(move || {
                if let Err(e) = receive(&sh, i, sock, &tx, &free_rx) {
                    sh.fail(e);
                }
                drop(d);
            });
            let (sh, d) = (shared.clone(), done_tx.clone());
            scope.spawn(move || {
                if let Err(e) = write(&sh, shard, &rx, &free_tx) {
                    sh.fail(e);
                }
                drop(d);
            });
        }
        drop(done_tx);
        let result = watch(ctl, cp, shared, &done_rx, t0, on_event);
        if result.is_err() {
            shared.stop.store(true, Ordering::Release);
            for c in &closers {
                let _ = c.shutdown(Shutdown::Both);
            }
        }
        result
    });
    let samples = result?;
    if let Some(e) = shared.failed() {
        return Err(e);
    }
    let p = lock(&shared.progress);
    if let Some(r) = p.ranges.iter().position(|r| !r.done) {
        return Err(err(
            ErrorCode::Unavailable,
            format!("the streams ended with range {r} unfinished"),
        ));
    }
    Ok(samples)
}

/// The control loop while streaming: progress, rate samples and logs
/// every interval, the source's status, until every stream is done.
fn watch(
    ctl: &mut ShardClient,
    cp: &CheckpointReply,
    shared: &Shared,
    done: &Receiver<()>,
    t0: Instant,
    on_event: &mut dyn FnMut(Event<'_>),
) -> Result<Vec<(f64, f64)>, CopyError> {
    let mut samples = Vec::new();
    let mut last_sample = (Instant::now(), 0u64);
    let mut last_status = Instant::now();
    let tick = Duration::from_millis(100);
    loop {
        let finished = matches!(done.recv_timeout(tick), Err(RecvTimeoutError::Disconnected));
        if let Some(e) = shared.failed() {
            return Err(e);
        }
        let bytes = shared.bytes.load(Ordering::Relaxed);
        let pairs = shared.pairs.load(Ordering::Relaxed);
        on_event(Event::Progress { pairs, bytes });
        let dt = last_sample.0.elapsed();
        // The last interval counts when it is long enough to mean a rate.
        // A copy shorter than one interval still gets its one sample.
        let tail = finished
            && (dt >= Duration::from_millis(COPY_LOG_INTERVAL_MS / 5) || samples.is_empty());
        if dt >= Duration::from_millis(COPY_LOG_INTERVAL_MS) || tail {
            let secs = dt.as_secs_f64().max(1e-9);
            let rate = (bytes - last_sample.1) as f64 / secs / 1e6;
            let t = t0.elapsed().as_secs_f64();
            samples.push((t, rate));
            let line = format!(
                "copy: {pairs} pairs, {:.1} MB in {t:.1} s: {rate:.1} MB/s now, {:.1} MB/s overall",
                bytes as f64 / 1e6,
                bytes as f64 / t.max(1e-9) / 1e6
            );
            on_event(Event::Log(&line));
            last_sample = (Instant::now(), bytes);
        }
        if finished {
            return Ok(samples);
        }
        if last_status.elapsed() >= Duration::from_millis(COPY_STATUS_POLL_MS) {
            last_status = Instant::now();
            let st = status(ctl, cp.session)?;
            if matches!(st.state, CopyState::Error | CopyState::Stopped) {
                return Err(source_failed(&st));
            }
        }
    }
}

/// Where a stream's current range stands, on the receiving side.
struct Cursor {
    range: u32,
    next_seq: u64,
    digest: Digest,
}

/// A stream's receiver: reads and checks frames, queues them for the
/// writer.
fn receive(
    sh: &Shared,
    stream: usize,
    mut sock: TcpStream,
    tx: &Sender<Item>,
    free: &Receiver<Vec<u8>>,
) -> Result<(), CopyError> {
    let mut cur: Option<Cursor> = None;
    let mut head = [0u8; FRAME_HEADER_BYTES];
    loop {
        match read_full(&mut sock, &mut head) {
            Ok(true) => {}
            Ok(false) if cur.is_none() => return Ok(()),
            Ok(false) => {
                return Err(err(
                    ErrorCode::Unavailable,
                    format!("data stream {stream}: the source closed it mid-range"),
                ))
            }
            Err(e) => return Err(stream_error(sh, stream, &e)),
        }
        let h = FrameHeader::decode(&head)
            .map_err(|e| err(e.code(), format!("data stream {stream}: {e}")))?;
        let mut buf = free.try_recv().unwrap_or_default();
        buf.resize(h.payload_len as usize, 0);
        if let Err(e) = sock.read_exact(&mut buf) {
            return Err(stream_error(sh, stream, &e));
        }
        if h.kind == FrameKind::Abort {
            let (code, why) = decode_abort(&buf);
            return Err(err(code, format!("the source aborted: {why}")));
        }
        let c = match &mut cur {
            Some(c) if c.range == h.range => c,
            _ => {
                let p = lock(&sh.progress);
                let Some(r) = p.ranges.get(h.range as usize) else {
                    return Err(err(
                        ErrorCode::Malformed,
                        format!("frame of range {} of {}", h.range, p.ranges.len()),
                    ));
                };
                if r.done {
                    return Err(err(
                        ErrorCode::Malformed,
                        format!("frame of range {}, which is done", h.range),
                    ));
                }
                let (next_seq, digest) = if r.pairs > 0 {
                    (r.next_seq, r.digest()?)
                } else {
                    (0, Digest::default())
                };
                cur.insert(Cursor {
                    range: h.range,
                    next_seq,
                    digest,
                })
            }
        };
        if h.seq != c.next_seq {
            return Err(err(
                ErrorCode::Malformed,
                format!(
                    "range {}: frame {} where {} was due",
                    h.range, h.seq, c.next_seq
                ),
            ));
        }
        let mut pairs = 0u64;
        if h.kind == FrameKind::Data {
            for pair in Pairs::new(&buf) {
                let (k, v) = pair.map_err(|e| err(e.code(), format!("range {}: {e}", h.range)))?;
                c.digest.add(k, v);
                pairs += 1;
            }
        } else if !buf.is_empty() {
            return Err(err(
                ErrorCode::Malformed,
                "an END_OF_RANGE frame with a payload",
            ));
        }
        if pairs != u64::from(h.pairs) || c.digest != h.digest {
            return Err(err(
                ErrorCode::BadChecksum,
                format!(
                    "range {} frame {}: the pairs received do not match the source's running digest",
                    h.range, h.seq
                ),
            ));
        }
        c.next_seq += 1;
        let end = h.kind == FrameKind::EndOfRange;
        let item = Item {
            range: h.range,
            seq: h.seq,
            end,
            digest: h.digest,
            pairs,
            buf,
        };
        if tx.send(item).is_err() {
            return Ok(()); // the writer failed and said why
        }
        if end {
            cur = None;
        }
    }
}

fn stream_error(sh: &Shared, stream: usize, e: &std::io::Error) -> CopyError {
    if sh.stop.load(Ordering::Acquire) {
        return err(ErrorCode::Unavailable, "stopped");
    }
    if matches!(
        e.kind(),
        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
    ) {
        err(
            ErrorCode::Timeout,
            format!("data stream {stream}: nothing from the source within the op timeout"),
        )
    } else {
        err(
            ErrorCode::Unavailable,
            format!("data stream {stream}: connection to the source lost: {e}"),
        )
    }
}

/// Fills `buf`; false at a clean end of stream before its first byte.
fn read_full(sock: &mut TcpStream, buf: &mut [u8]) -> std::io::Result<bool> {
    let mut got = 0;
    while got < buf.len() {
        match sock.read(&mut buf[got..]) {
            Ok(0) if got == 0 => return Ok(false),
            Ok(0) => return Err(std::io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => got += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(true)
}

/// A stream's writer: bulk-loads each range's frames, durable every
/// `durable_every` bytes at a frame boundary and at the range's end.
fn write(
    sh: &Shared,
    shard: &FjallShard,
    rx: &Receiver<Item>,
    free: &Sender<Vec<u8>>,
) -> Result<(), CopyError> {
    loop {
        let Ok(first) = rx.recv() else {
            return Ok(());
        };
        let range = first.range;
        // One load: frames of `range` until durable_every bytes or its end.
        let mut cur = Some(first);
        let (mut at, mut loaded, mut frame_bytes) = (0usize, 0u64, 0u64);
        let mut last: Option<(u64, Digest, bool)> = None;
        let mut last_key: Vec<u8> = Vec::new();
        let mut stray: Option<CopyError> = None;
        let result = shard.load(|key, value| loop {
            let Some(item) = cur.as_ref() else {
                return Ok(false);
            };
            if !item.end && at < item.buf.len() {
                // The receiver checked every pair of the frame.
                if let Some(Ok((k, v))) = Pairs::new(&item.buf[at..]).next() {
                    key.clear();
                    key.extend_from_slice(k);
                    value.clear();
                    value.extend_from_slice(v);
                    last_key.clear();
                    last_key.extend_from_slice(k);
                    at += 8 + k.len() + v.len();
                    frame_bytes += (k.len() + v.len()) as u64;
                    return Ok(true);
                }
            }
            // The frame is all loaded.
            let Some(i) = cur.take() else {
                return Ok(false);
            };
            sh.pairs.fetch_add(i.pairs, Ordering::Relaxed);
            sh.bytes.fetch_add(frame_bytes, Ordering::Relaxed);
            loaded += frame_bytes;
            frame_bytes = 0;
            last = Some((i.seq + 1, i.digest, i.end));
            let ended = i.end;
            let _ = free.try_send(i.buf);
            if ended || loaded >= sh.durable_every {
                return Ok(false);
            }
            match rx.recv() {
                Ok(next) if next.range == range => {
                    cur = Some(next);
                    at = 0;
                }
                Ok(next) => {
                    stray = Some(err(
                        ErrorCode::Malformed,
                        format!("range {} began before range {range} ended", next.range),
                    ));
                    return Ok(false);
                }
                Err(_) => return Ok(false),
            }
        });
        result.map_err(|e| storage(&format!("writing range {range}"), e))?;
        if !sh.keep_cached {
            // The load is durable: its pages need not stay cached (see
            // `CopyOptions::keep_cached`).
            shard.drop_cached_pages();
        }
        if let Some(e) = stray {
            return Err(e);
        }
        if let Some((next_seq, digest, end)) = last {
            let mut p = lock(&sh.progress);
            let r = &mut p.ranges[range as usize];
            let after = if digest.pairs > r.pairs {
                last_key.clone()
            } else {
                unhex(&r.after)?
            };
            r.set(next_seq, &digest, &after, end);
            p.save(&sh.dir)?;
        }
        if sh.stop.load(Ordering::Acquire) {
            return Ok(());
        }
    }
}
