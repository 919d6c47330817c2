//! The data streams of one copy: connecting them (each with its opening),
//! then per stream a receiver thread (`receive`: reads and checks frames)
//! and a writer thread (`load`: bulk-loads them), joined by a bounded
//! queue, while the calling thread watches: progress events, rate samples,
//! and the source's status.

use std::io::Write as _;
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::{bounded, Receiver, RecvTimeoutError};
use fabrickv_client::ShardClient;
use fabrickv_storage::ShardBackend;
use fabrickv_types::ErrorCode;
use fabrickv_wire::copy::{data_host, CheckpointReply, CopyState, StartRequest, StreamOpening};

use crate::control::{source_failed, status};
use crate::error::{err, CopyError};
use crate::load::write;
use crate::lock;
use crate::options::{CopyOptions, COPY_STATUS_POLL_MS};
use crate::receive::receive;
use crate::report::Event;
use crate::shared::{Item, Shared};

/// Frames queued between a stream's receiver and its writer: enough that
/// the socket is read while the writer loads, few enough that memory stays
/// a few MiB per stream (frames are about `COPY_FRAME_PAYLOAD_BYTES`).
pub const COPY_QUEUE_FRAMES: usize = 4;

/// How often the copy samples its rate and logs a line, in milliseconds.
pub const COPY_SAMPLE_INTERVAL_MS: u64 = 1_000;

/// Runs the data streams to the end; returns the rate samples.
pub(crate) fn stream<S: ShardBackend>(
    opts: &CopyOptions,
    shard: &S,
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
        let opening = StreamOpening {
            run_id: cp.run_id,
            token: cp.token,
            stream: u32::from(i),
        };
        s.write_all(&opening.encode())
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
            && (dt >= Duration::from_millis(COPY_SAMPLE_INTERVAL_MS / 5) || samples.is_empty());
        if dt >= Duration::from_millis(COPY_SAMPLE_INTERVAL_MS) || tail {
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
            let st = status(ctl, cp.run_id)?;
            if matches!(st.state, CopyState::Error | CopyState::Stopped) {
                return Err(source_failed(&st));
            }
        }
    }
}
