//! A started copy run's data streams: accepting them, then per stream a
//! range iterator (packs pairs into frames) and a sender (writes them),
//! joined by a bounded queue.

use std::collections::{HashMap, VecDeque};
use std::io::{Read, Write as _};
use std::net::{TcpListener, TcpStream};
use std::ops::Bound;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crossbeam_channel::{bounded, Receiver, Sender};
use fabrickv_types::{Digest, ErrorCode};
use fabrickv_wire::copy::{
    encode_abort, put_pair, range_bounds, CopyState, DataFrameHeader, DataFrameKind, ResumePoint,
    StartRequest, StreamOpening, COPY_FRAME_PAYLOAD_BYTES, DATA_FRAME_HEADER_BYTES,
    STREAM_OPENING_BYTES,
};

use super::{
    lock, CopyRun, Refusal, COPY_ACCEPT_TIMEOUT_MS, COPY_CHECK_STOP_EVERY_PAIRS,
    COPY_LOG_INTERVAL_MS, COPY_QUEUE_FRAMES, COPY_SEND_TIMEOUT_MS,
};

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
/// run.
fn stopped() -> Refusal {
    (ErrorCode::Unavailable, "the copy was stopped".to_string())
}

/// Reads what the target holds of `range` back from the snapshot and
/// compares digests: a resumed range continues only from a prefix that is
/// still the source's. Costs one read of that prefix at the source (no
/// network, no writes at the target).
fn check_held(s: &CopyRun, range: u32, held: &Held) -> Result<(), Refusal> {
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
pub(super) fn coordinate(
    s: &Arc<CopyRun>,
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
        run = s.id,
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
                        run = s.id,
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
        run = s.id,
        state = i.state.name(),
        pairs = s.pairs_sent.load(Ordering::Relaxed),
        bytes,
        bytes_checked = s.bytes_checked.load(Ordering::Relaxed),
        secs = format!("{secs:.2}"),
        mb_per_s = format!("{:.1}", bytes as f64 / secs.max(1e-9) / 1e6),
        "copy finished"
    );
}

fn accept_streams(s: &CopyRun, listener: &TcpListener, n: u16) -> Result<Vec<TcpStream>, String> {
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
        let opening = sock
            .set_nonblocking(false)
            .and_then(|()| {
                sock.set_read_timeout(Some(Duration::from_millis(COPY_ACCEPT_TIMEOUT_MS)))
            })
            .and_then(|()| {
                let mut b = [0u8; STREAM_OPENING_BYTES];
                sock.read_exact(&mut b).map(|()| b)
            });
        let Ok(opening) = opening else { continue };
        let Ok(h) = StreamOpening::decode(&opening) else {
            continue;
        };
        if h.run_id != s.id || h.token != s.token || h.stream >= u32::from(n) {
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
    s: &CopyRun,
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
                let h = DataFrameHeader {
                    kind: DataFrameKind::Abort,
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
    s: &CopyRun,
    job: RangeJob,
    tx: &Sender<Outgoing>,
    free: &Receiver<Vec<u8>>,
) -> Result<(), Refusal> {
    let RangeJob {
        range,
        from,
        to,
        seq,
        digest,
        held,
        done,
    } = job;
    if let Some(h) = &held {
        check_held(s, range, h)?;
    }
    if done {
        return Ok(());
    }
    let mut frame = Framer {
        range,
        seq,
        digest,
        buf: Vec::new(),
        pairs: 0,
        bytes: 0,
        tx,
        free,
    };
    frame.reset();
    let mut failed: Option<Refusal> = None;
    let scanned = s
        .snapshot
        .scan_each(bound_ref(&from), bound_ref(&to), &mut |k, v| {
            frame.push(k, v);
            if frame.full() {
                if s.stop.load(Ordering::Acquire) {
                    failed = Some(stopped());
                    return Ok(false);
                }
                if let Err(e) = frame.ship(DataFrameKind::Data) {
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
    if frame.pairs > 0 {
        frame.ship(DataFrameKind::Data)?;
    }
    frame.ship(DataFrameKind::EndOfRange)
}

/// The frame a range iterator is filling, and where its range stands.
struct Framer<'q> {
    /// The range being sent.
    range: u32,
    /// The sequence number of the frame being filled.
    seq: u64,
    /// The range's running digest, this frame's pairs included.
    digest: Digest,
    /// Room for the header, then the pairs packed so far.
    buf: Vec<u8>,
    /// Pairs packed in this frame.
    pairs: u64,
    /// Their key and value bytes.
    bytes: u64,
    /// Where full frames go: the stream's sender.
    tx: &'q Sender<Outgoing>,
    /// Buffers the sender is done with, reused so a range allocates none
    /// after the queue's first few frames.
    free: &'q Receiver<Vec<u8>>,
}

impl Framer<'_> {
    /// Starts a new frame in a recycled (or new) buffer.
    fn reset(&mut self) {
        let mut b = self.free.try_recv().unwrap_or_else(|_| {
            Vec::with_capacity(COPY_FRAME_PAYLOAD_BYTES + DATA_FRAME_HEADER_BYTES)
        });
        b.clear();
        b.resize(DATA_FRAME_HEADER_BYTES, 0);
        self.buf = b;
        self.pairs = 0;
        self.bytes = 0;
    }

    /// Packs one pair and adds it to the running digest.
    fn push(&mut self, k: &[u8], v: &[u8]) {
        put_pair(&mut self.buf, k, v);
        self.digest.add(k, v);
        self.pairs += 1;
        self.bytes += (k.len() + v.len()) as u64;
    }

    /// Whether the frame holds `COPY_FRAME_PAYLOAD_BYTES` or more.
    fn full(&self) -> bool {
        self.buf.len() - DATA_FRAME_HEADER_BYTES >= COPY_FRAME_PAYLOAD_BYTES
    }

    /// Writes the header, queues the frame for the sender, starts the next.
    fn ship(&mut self, kind: DataFrameKind) -> Result<(), Refusal> {
        let h = DataFrameHeader {
            kind,
            range: self.range,
            pairs: self.pairs as u32,
            seq: self.seq,
            payload_len: (self.buf.len() - DATA_FRAME_HEADER_BYTES) as u32,
            digest: self.digest,
        };
        self.buf[..DATA_FRAME_HEADER_BYTES].copy_from_slice(&h.encode());
        let out = Outgoing {
            buf: std::mem::take(&mut self.buf),
            pairs: self.pairs,
            bytes: self.bytes,
            end_of_range: kind == DataFrameKind::EndOfRange,
        };
        self.tx.send(out).map_err(|_| stopped())?;
        self.seq += 1;
        self.reset();
        Ok(())
    }
}

fn bound_ref(b: &Bound<Vec<u8>>) -> Bound<&[u8]> {
    match b {
        Bound::Included(k) => Bound::Included(k.as_slice()),
        Bound::Excluded(k) => Bound::Excluded(k.as_slice()),
        Bound::Unbounded => Bound::Unbounded,
    }
}

/// A stream's sender: writes queued frames to the socket.
fn send(s: &CopyRun, mut sock: TcpStream, rx: &Receiver<Outgoing>, free: &Sender<Vec<u8>>) {
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
