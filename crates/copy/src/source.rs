//! The source side of a copy: sessions inside the server that serves the
//! shard.
//!
//! CHECKPOINT takes a consistent snapshot of the shard, binds a TCP port
//! for the data streams, and splits the snapshot into ranges on a thread
//! of its own (a pass over the keys, seconds on a large shard, which must
//! not block a worker); the target polls STATUS until the split is ready.
//! START spawns the session's coordinator: it accepts one connection per
//! stream, then runs per stream a range iterator (packs pairs of one range
//! at a time into frames, each with the range's running digest, and ends
//! the range with an END_OF_RANGE marker) and a sender (writes the frames
//! to the socket), joined by a bounded queue so reading the disk and
//! writing the network overlap and memory stays bounded. Ranges are handed
//! to streams from one queue, so a stream that finishes early takes the
//! next range. END (or every stream failing) stops it all.

use std::collections::{HashMap, VecDeque};
use std::io::{Read, Write as _};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::ops::Bound;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crossbeam_channel::{bounded, Receiver, Sender};
use fabrickv_storage::{Digest, ShardBackend, ShardSnapshot};
use fabrickv_types::ErrorCode;
use fabrickv_wire::shard::{ShardMessage, ShardOp};

use crate::lock;
use crate::proto::{
    decode_session, encode_abort, put_pair, range_bounds, CheckpointReply, CheckpointRequest,
    CopyState, FrameHeader, FrameKind, Hello, ResumePoint, StartRequest, Status,
    COPY_BOUNDARY_BYTES_MAX, COPY_FRAME_PAYLOAD_BYTES, FRAME_HEADER_BYTES, HELLO_BYTES,
};

/// Finds a served shard by name.
pub type ShardLookup<'a> = &'a dyn Fn(&str) -> Option<Arc<dyn ShardBackend>>;

/// Copy sessions one server keeps at once (each holds a snapshot, which
/// pins the files it reads).
pub const COPY_SESSIONS_MAX: usize = 16;

/// Key samples taken per range when splitting a checkpoint.
pub const SAMPLES_PER_RANGE: usize = 32;

/// Frames queued between a stream's range iterator and its sender.
pub const COPY_QUEUE_FRAMES: usize = 4;

/// How long START waits for every data stream to connect and say hello,
/// in milliseconds.
pub const COPY_ACCEPT_TIMEOUT_MS: u64 = 10_000;

/// A data stream whose socket accepts nothing for this long is given up,
/// in milliseconds (the target stopped reading).
pub const COPY_SEND_TIMEOUT_MS: u64 = 30_000;

/// A session not started this long after its checkpoint may be dropped
/// to make room for another, in milliseconds (its target went away
/// between CHECKPOINT and START, and its snapshot pins files).
pub const COPY_START_TIMEOUT_MS: u64 = 60_000;

/// How often a session logs its progress, in milliseconds.
pub const COPY_LOG_INTERVAL_MS: u64 = 1_000;

/// Pairs between two looks at the stop flag while a resumed range's held
/// prefix is read back, so END stops a long check promptly.
pub const COPY_CHECK_STOP_EVERY_PAIRS: u64 = 4096;

type Refusal = (ErrorCode, String);

/// Every copy session of one server.
pub struct CopySources {
    data_host: IpAddr,
    sessions: Mutex<HashMap<u64, Arc<Session>>>,
    next_id: AtomicU64,
}

/// What a session's control ops change, under its lock.
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

/// One copy: its checkpoint, its ranges, its streams' counters.
struct Session {
    id: u64,
    created: Instant,
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

impl Session {
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
            tracing::warn!(session = self.id, shard = %self.shard, "copy failed: {why}");
            i.state = CopyState::Error;
            i.error = code;
            i.message = why;
        }
        self.stop.store(true, Ordering::Release);
    }

    /// Whether the session may be dropped to make room: it is over, or
    /// its target never started it.
    fn abandoned(&self) -> bool {
        let i = lock(&self.inner);
        match i.state {
            CopyState::InProgress => false,
            CopyState::Idle => {
                !i.started && self.created.elapsed() >= Duration::from_millis(COPY_START_TIMEOUT_MS)
            }
            CopyState::Done | CopyState::Error | CopyState::Stopped => true,
        }
    }
}

impl CopySources {
    /// Sessions whose data streams listen on `data_host`.
    pub fn new(data_host: IpAddr) -> CopySources {
        CopySources {
            data_host,
            sessions: Mutex::new(HashMap::new()),
            next_id: AtomicU64::new(1),
        }
    }

    /// Where data streams listen.
    pub fn data_host(&self) -> IpAddr {
        self.data_host
    }

    /// Runs one control op; appends the reply payload to `out`.
    pub fn control(
        &self,
        msg: &ShardMessage<'_>,
        shards: ShardLookup<'_>,
        out: &mut Vec<u8>,
    ) -> Result<(), Refusal> {
        let malformed = |e: crate::proto::ProtoError| (e.code(), e.to_string());
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
                let s = self.session(req.session)?;
                start(&s, req)?;
                Ok(())
            }
            ShardOp::CopyStatus => {
                let id = decode_session(msg.payload).map_err(malformed)?;
                self.session(id)?.status().encode(out);
                Ok(())
            }
            ShardOp::CopyEnd => {
                let id = decode_session(msg.payload).map_err(malformed)?;
                let s = lock(&self.sessions)
                    .remove(&id)
                    .ok_or_else(|| no_session(id))?;
                {
                    let mut i = lock(&s.inner);
                    if matches!(i.state, CopyState::Idle | CopyState::InProgress) {
                        i.state = CopyState::Stopped;
                    }
                }
                s.stop.store(true, Ordering::Release);
                tracing::info!(session = id, shard = %s.shard, "copy session ended");
                s.status().encode(out);
                Ok(())
            }
            op => Err((ErrorCode::UnknownOpcode, format!("{op:?} is not a copy op"))),
        }
    }

    fn session(&self, id: u64) -> Result<Arc<Session>, Refusal> {
        lock(&self.sessions)
            .get(&id)
            .cloned()
            .ok_or_else(|| no_session(id))
    }

    fn checkpoint(
        &self,
        name: &str,
        shard: &dyn ShardBackend,
        req: &CheckpointRequest<'_>,
    ) -> Result<CheckpointReply, Refusal> {
        let mut sessions = lock(&self.sessions);
        if sessions.len() >= COPY_SESSIONS_MAX {
            // Sessions their targets never ended or never started make
            // room first.
            sessions.retain(|_, s| {
                let drop = s.abandoned();
                if drop {
                    s.stop.store(true, Ordering::Release);
                }
                !drop
            });
        }
        if sessions.len() >= COPY_SESSIONS_MAX {
            return Err((
                ErrorCode::Unavailable,
                format!("{COPY_SESSIONS_MAX} copy sessions are open (COPY_SESSIONS_MAX)"),
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
        let session = Arc::new(Session {
            id,
            created: Instant::now(),
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
            session: id,
            token: session.token,
            data_port,
        };
        let s = session.clone();
        let wanted = req.ranges;
        std::thread::Builder::new()
            .name(format!("fkv-copy-split-{id}"))
            .spawn(move || split(&s, wanted, given))
            .map_err(|e| {
                (
                    ErrorCode::Unavailable,
                    format!("cannot start a thread: {e}"),
                )
            })?;
        sessions.insert(id, session);
        tracing::info!(
            session = id,
            shard = name,
            ranges = req.ranges,
            port = data_port,
            "copy checkpoint created"
        );
        Ok(reply)
    }
}

fn no_session(id: u64) -> Refusal {
    (
        ErrorCode::NoSuchCopy,
        format!("no copy session {id} (ended, or the source restarted)"),
    )
}

/// Splits the session's snapshot into ranges (or takes the given ones)
/// and makes the session ready.
fn split(s: &Session, wanted: u32, given: Option<Vec<Vec<u8>>>) {
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
                session = s.id,
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

/// START: checks the session and spawns its coordinator.
fn start(s: &Arc<Session>, req: StartRequest) -> Result<(), Refusal> {
    if req.token != s.token {
        return Err((
            ErrorCode::Malformed,
            "the token does not match the session's".into(),
        ));
    }
    let boundaries = {
        let mut i = lock(&s.inner);
        let Some(b) = i.boundaries.clone() else {
            return Err((
                ErrorCode::CopyState,
                format!(
                    "session {} is {} and its checkpoint is not split yet",
                    s.id,
                    i.state.name()
                ),
            ));
        };
        if i.started || i.state != CopyState::Idle {
            return Err((
                ErrorCode::CopyState,
                format!("session {} is {}, not IDLE", s.id, i.state.name()),
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
            "the session's data port is gone".to_string(),
        )
    })?;
    let s = s.clone();
    std::thread::Builder::new()
        .name(format!("fkv-copy-{}", s.id))
        .spawn(move || coordinate(&s, listener, req, boundaries))
        .map_err(|e| {
            (
                ErrorCode::Unavailable,
                format!("cannot start a thread: {e}"),
            )
        })?;
    Ok(())
}

/// One range to send: its bounds and where it starts.
struct RangeJob {
    range: u32,
    from: Bound<Vec<u8>>,
    to: Bound<Vec<u8>>,
    seq: u64,
    digest: Digest,
    /// What the target already holds of a resumed range, checked against
    /// this snapshot before anything of the range is sent.
    held: Option<Held>,
    /// The target holds the whole range: check it, send nothing.
    done: bool,
}

/// The pairs a target holds of a range from an earlier run: those of the
/// range from its lower bound through the last key held (all of it when
/// the range is done), and their digest as the target computed it.
///
/// The target's running digest continues from `digest`, and its final
/// check compares sums chained from it, so a pair that changed at the
/// source in this part between the two runs would otherwise go unseen:
/// the copy would mix two points in time and still verify.
struct Held {
    from: Bound<Vec<u8>>,
    to: Bound<Vec<u8>>,
    digest: Digest,
}

fn jobs(boundaries: &[Vec<u8>], resume: &[ResumePoint]) -> VecDeque<RangeJob> {
    let by_range: HashMap<u32, &ResumePoint> = resume.iter().map(|p| (p.range, p)).collect();
    let n = boundaries.len() as u32 + 1;
    let mut q = VecDeque::new();
    for r in 0..n {
        let (lower, upper) = range_bounds(boundaries, r as usize);
        let (lower, to) = (lower.map(<[u8]>::to_vec), upper.map(<[u8]>::to_vec));
        let job = match by_range.get(&r) {
            Some(p) if p.done => RangeJob {
                range: r,
                held: Some(Held {
                    from: lower.clone(),
                    to: to.clone(),
                    digest: p.digest,
                }),
                from: lower,
                to,
                seq: p.next_seq,
                digest: p.digest,
                done: true,
            },
            Some(p) if p.digest.pairs > 0 => RangeJob {
                range: r,
                held: Some(Held {
                    from: lower,
                    to: Bound::Included(p.after.clone()),
                    digest: p.digest,
                }),
                from: Bound::Excluded(p.after.clone()),
                to,
                seq: p.next_seq,
                digest: p.digest,
                done: false,
            },
            _ => RangeJob {
                range: r,
                from: lower,
                to,
                seq: 0,
                digest: Digest::default(),
                held: None,
                done: false,
            },
        };
        q.push_back(job);
    }
    q
}

/// Why a range iterator gave up: END (or a failed stream) stopped the
/// session.
fn stopped() -> Refusal {
    (ErrorCode::Unavailable, "the copy was stopped".to_string())
}

/// Reads what the target holds of `range` back from the snapshot and
/// compares digests: a resumed range continues only from a prefix that is
/// still the source's. Costs one read of that prefix at the source (no
/// network, no writes at the target).
fn check_held(s: &Session, range: u32, held: &Held) -> Result<(), Refusal> {
    let mut here = Digest::default();
    let mut halted = false;
    s.snapshot
        .scan_each(bound_ref(&held.from), bound_ref(&held.to), &mut |k, v| {
            here.add(k, v);
            if here.pairs % COPY_CHECK_STOP_EVERY_PAIRS == 0 && s.stop.load(Ordering::Acquire) {
                halted = true;
                return Ok(false);
            }
            Ok(true)
        })
        .map_err(|e| {
            (
                ErrorCode::StorageFailed,
                format!("reading range {range}: {e}"),
            )
        })?;
    if halted {
        return Err(stopped());
    }
    s.bytes_checked.fetch_add(here.bytes, Ordering::Relaxed);
    if here == held.digest {
        return Ok(());
    }
    let t = &held.digest;
    let how = if (here.pairs, here.bytes) == (t.pairs, t.bytes) {
        "the same number of pairs and bytes with other contents".to_string()
    } else {
        format!("{} pairs ({} bytes)", here.pairs, here.bytes)
    };
    Err((
        ErrorCode::SourceChanged,
        format!(
            "range {range} changed at the source since the earlier run: the target holds {} \
             pairs ({} bytes) of it, the source now has {how} there; rerun without --resume \
             to start over",
            t.pairs, t.bytes
        ),
    ))
}

/// A frame ready to send, with what it counts.
struct Outgoing {
    buf: Vec<u8>,
    pairs: u64,
    bytes: u64,
    end_of_range: bool,
}

/// Accepts the streams, runs them, logs progress, and settles the state.
fn coordinate(
    s: &Arc<Session>,
    listener: TcpListener,
    req: StartRequest,
    boundaries: Vec<Vec<u8>>,
) {
    let streams = match accept_streams(s, &listener, req.streams) {
        Ok(v) => v,
        Err(why) => return s.fail(ErrorCode::Timeout, why),
    };
    drop(listener);
    let queue = Arc::new(Mutex::new(jobs(&boundaries, &req.resume)));
    let already_done = req.resume.iter().filter(|p| p.done).count() as u32;
    s.ranges_done.store(already_done, Ordering::Relaxed);
    let t0 = Instant::now();
    tracing::info!(
        session = s.id,
        streams = streams.len(),
        ranges = boundaries.len() + 1,
        "copy streaming"
    );
    let (done_tx, done_rx) = bounded::<()>(streams.len() * 2);
    let mut threads = Vec::new();
    for sock in streams {
        let (tx, rx) = bounded::<Outgoing>(COPY_QUEUE_FRAMES);
        let (free_tx, free_rx) = bounded::<Vec<u8>>(COPY_QUEUE_FRAMES + 2);
        let (s1, q, d1) = (s.clone(), queue.clone(), done_tx.clone());
        threads.push(std::thread::spawn(move || {
            iterate(&s1, &q, &tx, &free_rx);
            drop(d1);
        }));
        let (s2, d2) = (s.clone(), done_tx.clone());
        threads.push(std::thread::spawn(move || {
            send(&s2, sock, &rx, &free_tx);
            drop(d2);
        }));
    }
    drop(done_tx);
    let mut last = (Instant::now(), 0u64);
    loop {
        match done_rx.recv_timeout(Duration::from_millis(COPY_LOG_INTERVAL_MS)) {
            Err(crossbeam_channel::RecvTimeoutError::Disconnected) => break,
            _ => {
                let bytes = s.bytes_sent.load(Ordering::Relaxed);
                let dt = last.0.elapsed().as_secs_f64();
                if dt * 1000.0 >= COPY_LOG_INTERVAL_MS as f64 {
                    tracing::info!(
                        session = s.id,
                        pairs = s.pairs_sent.load(Ordering::Relaxed),
                        bytes,
                        mb_per_s = format!("{:.1}", (bytes - last.1) as f64 / dt / 1e6),
                        "copy progress"
                    );
                    last = (Instant::now(), bytes);
                }
            }
        }
    }
    for t in threads {
        let _ = t.join();
    }
    let secs = t0.elapsed().as_secs_f64();
    let bytes = s.bytes_sent.load(Ordering::Relaxed);
    let mut i = lock(&s.inner);
    if i.state == CopyState::InProgress {
        i.state = CopyState::Done;
    }
    tracing::info!(
        session = s.id,
        state = i.state.name(),
        pairs = s.pairs_sent.load(Ordering::Relaxed),
        bytes,
        bytes_checked = s.bytes_checked.load(Ordering::Relaxed),
        secs = format!("{secs:.2}"),
        mb_per_s = format!("{:.1}", bytes as f64 / secs.max(1e-9) / 1e6),
        "copy finished"
    );
}

fn accept_streams(s: &Session, listener: &TcpListener, n: u16) -> Result<Vec<TcpStream>, String> {
    let deadline = Instant::now() + Duration::from_millis(COPY_ACCEPT_TIMEOUT_MS);
    let mut slots: Vec<Option<TcpStream>> = (0..n).map(|_| None).collect();
    listener
        .set_nonblocking(true)
        .map_err(|e| format!("data port: {e}"))?;
    let mut have = 0;
    while have < usize::from(n) {
        if s.stop.load(Ordering::Acquire) {
            return Err("ended before its streams connected".into());
        }
        if Instant::now() >= deadline {
            return Err(format!(
                "{have} of {n} data streams connected within {COPY_ACCEPT_TIMEOUT_MS} ms"
            ));
        }
        let mut sock = match listener.accept() {
            Ok((sock, _)) => sock,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_millis(2));
                continue;
            }
            Err(e) => return Err(format!("accepting a data stream: {e}")),
        };
        // A connection that is not one of ours is dropped, not fatal.
        let hello = sock
            .set_nonblocking(false)
            .and_then(|()| {
                sock.set_read_timeout(Some(Duration::from_millis(COPY_ACCEPT_TIMEOUT_MS)))
            })
            .and_then(|()| {
                let mut b = [0u8; HELLO_BYTES];
                sock.read_exact(&mut b).map(|()| b)
            });
        let Ok(hello) = hello else { continue };
        let Ok(h) = Hello::decode(&hello) else {
            continue;
        };
        if h.session != s.id || h.token != s.token || h.stream >= u32::from(n) {
            continue;
        }
        let slot = &mut slots[h.stream as usize];
        if slot.is_none() {
            let _ = sock.set_nodelay(true);
            let _ = sock.set_write_timeout(Some(Duration::from_millis(COPY_SEND_TIMEOUT_MS)));
            *slot = Some(sock);
            have += 1;
        }
    }
    Ok(slots.into_iter().flatten().collect())
}

/// A stream's range iterator: takes ranges from the queue until it is
/// empty, packing each into frames.
fn iterate(
    s: &Session,
    queue: &Mutex<VecDeque<RangeJob>>,
    tx: &Sender<Outgoing>,
    free: &Receiver<Vec<u8>>,
) {
    loop {
        let Some(job) = lock(queue).pop_front() else {
            return;
        };
        if let Err((code, why)) = iterate_range(s, job, tx, free) {
            if !s.stop.load(Ordering::Acquire) {
                let mut buf = Vec::new();
                encode_abort(&mut buf, code, &why);
                let h = FrameHeader {
                    kind: FrameKind::Abort,
                    range: 0,
                    pairs: 0,
                    seq: 0,
                    payload_len: buf.len() as u32,
                    digest: Digest::default(),
                };
                let mut frame = h.encode().to_vec();
                frame.extend_from_slice(&buf);
                let _ = tx.send(Outgoing {
                    buf: frame,
                    pairs: 0,
                    bytes: 0,
                    end_of_range: false,
                });
                s.fail(code, why);
            }
            return;
        }
    }
}

fn iterate_range(
    s: &Session,
    job: RangeJob,
    tx: &Sender<Outgoing>,
    free: &Receiver<Vec<u8>>,
) -> Result<(), Refusal> {
    let RangeJob {
        range,
        from,
        to,
        mut seq,
        mut digest,
        held,
        done,
    } = job;
    if let Some(h) = &held {
        check_held(s, range, h)?;
    }
    if done {
        return Ok(());
    }
    let fresh = |free: &Receiver<Vec<u8>>| {
        let mut b = free
            .try_recv()
            .unwrap_or_else(|_| Vec::with_capacity(COPY_FRAME_PAYLOAD_BYTES + FRAME_HEADER_BYTES));
        b.clear();
        b.resize(FRAME_HEADER_BYTES, 0);
        b
    };
    let mut buf = fresh(free);
    let (mut pairs, mut bytes) = (0u64, 0u64);
    let ship = |buf: &mut Vec<u8>,
                kind: FrameKind,
                pairs: &mut u64,
                bytes: &mut u64,
                seq: &mut u64,
                digest: &Digest|
     -> Result<(), Refusal> {
        let h = FrameHeader {
            kind,
            range,
            pairs: *pairs as u32,
            seq: *seq,
            payload_len: (buf.len() - FRAME_HEADER_BYTES) as u32,
            digest: *digest,
        };
        buf[..FRAME_HEADER_BYTES].copy_from_slice(&h.encode());
        let out = Outgoing {
            buf: std::mem::replace(buf, fresh(free)),
            pairs: *pairs,
            bytes: *bytes,
            end_of_range: kind == FrameKind::EndOfRange,
        };
        tx.send(out).map_err(|_| stopped())?;
        *seq += 1;
        *pairs = 0;
        *bytes = 0;
        Ok(())
    };
    let mut failed: Option<Refusal> = None;
    let scanned = s
        .snapshot
        .scan_each(bound_ref(&from), bound_ref(&to), &mut |k, v| {
            put_pair(&mut buf, k, v);
            digest.add(k, v);
            pairs += 1;
            bytes += (k.len() + v.len()) as u64;
            if buf.len() - FRAME_HEADER_BYTES >= COPY_FRAME_PAYLOAD_BYTES {
                if s.stop.load(Ordering::Acquire) {
                    failed = Some(stopped());
                    return Ok(false);
                }
                if let Err(e) = ship(
                    &mut buf,
                    FrameKind::Data,
                    &mut pairs,
                    &mut bytes,
                    &mut seq,
                    &digest,
                ) {
                    failed = Some(e);
                    return Ok(false);
                }
            }
            Ok(true)
        });
    if let Err(e) = scanned {
        return Err((
            ErrorCode::StorageFailed,
            format!("reading range {range}: {e}"),
        ));
    }
    if let Some(e) = failed {
        return Err(e);
    }
    if pairs > 0 {
        ship(
            &mut buf,
            FrameKind::Data,
            &mut pairs,
            &mut bytes,
            &mut seq,
            &digest,
        )?;
    }
    ship(
        &mut buf,
        FrameKind::EndOfRange,
        &mut pairs,
        &mut bytes,
        &mut seq,
        &digest,
    )
}

fn bound_ref(b: &Bound<Vec<u8>>) -> Bound<&[u8]> {
    match b {
        Bound::Included(k) => Bound::Included(k.as_slice()),
        Bound::Excluded(k) => Bound::Excluded(k.as_slice()),
        Bound::Unbounded => Bound::Unbounded,
    }
}

/// A stream's sender: writes queued frames to the socket.
fn send(s: &Session, mut sock: TcpStream, rx: &Receiver<Outgoing>, free: &Sender<Vec<u8>>) {
    for out in rx {
        if let Err(e) = sock.write_all(&out.buf) {
            s.fail(
                ErrorCode::Unavailable,
                format!("data stream to the target failed: {e}"),
            );
            return;
        }
        s.pairs_sent.fetch_add(out.pairs, Ordering::Relaxed);
        s.bytes_sent.fetch_add(out.bytes, Ordering::Relaxed);
        if out.end_of_range {
            s.ranges_done.fetch_add(1, Ordering::Relaxed);
        }
        let _ = free.try_send(out.buf);
    }
    let _ = sock.flush();
}
