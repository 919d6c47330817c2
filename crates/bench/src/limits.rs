//! Physical limits and peers that `fabrickv bench ps` holds FabricKV's
//! batched pulls against, measured in the same run, on the same CPUs:
//!
//! - [`memcpy_bandwidth`] (`limit.memcpy`): one thread copying chunks from
//!   one buffer into another. Over shm a pull can go no faster than the
//!   copy of its values out of the shared segment, so its pulled bytes/s
//!   are judged against this;
//! - [`tcp_request_response`] (`limit.tcp_reqresp`): raw TCP over loopback,
//!   a server answering each fixed-size request with a prebuilt reply of a
//!   fixed size, requests pipelined: the floor under a pull of the same
//!   request and reply sizes, which no kv server can beat;
//! - [`tcp_stream`] (`limit.tcp_stream`): one-direction bulk TCP, the
//!   single-stream ceiling (iperf3's number) that no reply traffic exceeds;
//! - [`redis_mget`] (`peer.redis_mget`): redis-server answering
//!   redis-benchmark's MGETs of random preloaded keys, the peer a batched
//!   pull is compared with.
//!
//! Every result type has a `json` method giving one JSON object per line
//! with a `"bench"` field naming which of these it is.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::baseline::{IO_TIMEOUT, MAX_DURATION, WARMUP};
use crate::cpu::CpuMeter;
use crate::peers;

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

/// Largest request of [`tcp_request_response`], bytes.
pub const TCP_REQ_BYTES_MAX: usize = 1 << 20;
/// Largest reply of [`tcp_request_response`], bytes.
pub const TCP_RESP_BYTES_MAX: usize = 64 << 20;
/// Most requests [`tcp_request_response`] keeps in flight.
pub const TCP_DEPTH_MAX: usize = 1024;
/// Most request bytes in flight at once, bytes. The client writes its
/// requests with blocking writes while the server may be blocked writing
/// replies the client has not read yet; requests are small enough to sit
/// in the server's receive buffer (Linux gives a loopback socket 128 KiB to
/// start, `tcp_rmem`), so a client write never waits for the server.
pub const TCP_REQ_BYTES_IN_FLIGHT_MAX: usize = 64 << 10;
/// Bytes the reply server asks of one `read`: a burst of requests at once,
/// as a kv server reads.
const TCP_SERVER_READ_BYTES: usize = 64 << 10;
/// Bytes the client asks of one `read`: several replies at once.
const TCP_CLIENT_READ_BYTES: usize = 256 << 10;
/// Bytes of each write (and read) of [`tcp_stream`], as iperf3's
/// large-buffer runs.
pub const TCP_STREAM_WRITE_BYTES: usize = 1 << 20;

/// Most keys in one MGET of [`redis_mget`] (each is a redis-benchmark
/// argument on its command line).
pub const REDIS_MGET_KEYS_MAX: usize = 10_000;
/// Largest value [`redis_mget`] stores, bytes.
pub const REDIS_VALUE_BYTES_MAX: usize = 1 << 20;
/// Most bytes of values [`redis_mget`] preloads into redis-server.
pub const REDIS_PRELOAD_BYTES_MAX: u64 = 4 << 30;
/// Most redis-benchmark connections, and most requests pipelined on each.
pub const REDIS_CONNS_MAX: usize = 1024;
/// Connections [`RedisMgetOpts::new`] gives redis-benchmark, so that the
/// peer is measured near its best rather than a strawman. On the 2-CPU
/// machine (redis-server on CPU 0, redis-benchmark on CPU 1, MGETs of 100
/// keys of 512 B, no pipelining) 16 served the most MGETs/s: with 1000
/// keys, 10 k/s with 1 connection, 30 k/s with 4, 49 k/s with 16 and
/// 42 k/s with 50 (redis-benchmark's default); with 100 000 keys, 13 k/s
/// with 16 against 8 k/s with 50. Fewer connections leave its one thread
/// waiting between requests; more cost it more per request.
pub const REDIS_CONNS_DEFAULT: usize = 16;
/// Fewest requests of the calibration run that sizes the measured
/// redis-benchmark run to the asked duration (redis-benchmark counts
/// requests, not seconds); the run also warms redis-server up.
const REDIS_CALIBRATION_REQUESTS_MIN: u64 = 2_000;
/// Requests of the calibration run per request the load keeps in flight,
/// so that a deep load is still calibrated on a full pipeline.
const REDIS_CALIBRATION_ROUNDS: u64 = 4;
/// Most requests given to one redis-benchmark run.
const REDIS_BENCHMARK_REQUESTS_MAX: u64 = 500_000_000;

/// Checks a measured duration against `(0, MAX_DURATION]`.
pub(crate) fn check_duration(duration: Duration) -> Result<(), String> {
    if duration.is_zero() || duration > MAX_DURATION {
        return Err(format!(
            "duration {duration:?} is outside (0, {MAX_DURATION:?}]"
        ));
    }
    Ok(())
}

/// Checks that `v` is in `1..=max`.
pub(crate) fn check_range(name: &str, v: usize, max: usize) -> Result<(), String> {
    if v == 0 || v > max {
        return Err(format!("{name} {v} is outside 1..={max}"));
    }
    Ok(())
}

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

/// One JSON object: `"bench"` first, then the result's own fields.
#[derive(Serialize)]
struct JsonLine<'a, T: Serialize> {
    /// Which limit or peer.
    bench: &'a str,
    /// The result.
    #[serde(flatten)]
    result: &'a T,
}

pub(crate) fn json_line<T: Serialize>(bench: &str, result: &T) -> String {
    serde_json::to_string(&JsonLine { bench, result })
        .unwrap_or_else(|e| format!("{{\"bench\":\"{bench}\",\"error\":\"{e}\"}}"))
}

/// Divides `n` by `seconds`, zero for an empty interval.
pub(crate) fn per_s(n: f64, seconds: f64) -> f64 {
    if seconds > 0.0 {
        n / seconds
    } else {
        0.0
    }
}

// ---------------------------------------------------------------------------
// memcpy
// ---------------------------------------------------------------------------

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

// ---------------------------------------------------------------------------
// random gather
// ---------------------------------------------------------------------------

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

// ---------------------------------------------------------------------------
// Raw TCP
// ---------------------------------------------------------------------------

/// Which traffic a [`TcpRate`] measured.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TcpPattern {
    /// Pipelined requests, each answered by a fixed-size reply.
    RequestResponse,
    /// One-direction bulk stream.
    Stream,
}

impl TcpPattern {
    /// The `"bench"` name of its JSON line.
    pub fn bench(self) -> &'static str {
        match self {
            TcpPattern::RequestResponse => "limit.tcp_reqresp",
            TcpPattern::Stream => "limit.tcp_stream",
        }
    }
}

/// What [`tcp_request_response`] or [`tcp_stream`] measured.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TcpRate {
    /// Which of the two; named by the JSON line's `"bench"`.
    #[serde(skip)]
    pub pattern: TcpPattern,
    /// Bytes of each request (0 for the stream).
    pub req_bytes: usize,
    /// Bytes of each reply's payload; for the stream, of each write.
    pub resp_bytes: usize,
    /// Requests kept in flight (0 for the stream).
    pub depth: usize,
    /// Replies received whole in the measured interval; for the stream,
    /// the bytes received in writes' worth (`bytes / resp_bytes`, rounded
    /// down).
    pub responses: u64,
    /// Payload bytes received in the measured interval: for replies,
    /// `responses x resp_bytes` (whole replies only).
    pub bytes: u64,
    /// Length of the measured interval, seconds.
    pub seconds: f64,
    /// Replies (stream: writes' worth) per second.
    pub responses_per_s: f64,
    /// Payload bytes received per second.
    pub bytes_per_s: f64,
    /// The CPU of the replying (stream: sending) thread.
    pub server_cpu: Option<usize>,
    /// The CPU of the requesting (stream: receiving) thread.
    pub client_cpu: Option<usize>,
}

impl TcpRate {
    /// Payload bandwidth in GB/s (10^9 bytes per second).
    pub fn gb_per_s(&self) -> f64 {
        self.bytes_per_s / 1e9
    }

    /// The JSON line (`"bench":"limit.tcp_reqresp"` or
    /// `"limit.tcp_stream"`).
    pub fn json(&self) -> String {
        json_line(self.pattern.bench(), self)
    }
}

/// Runs `server` on a listener of `127.0.0.1:0` in one thread and `client`,
/// given its address, in another, each pinned to its CPU; their results.
///
/// When the client fails before it connects, one connection is opened and
/// closed so that the server's `accept` returns and its thread ends.
pub(crate) fn run_pair<S, C, A, B>(
    name: &str,
    server_cpu: Option<usize>,
    client_cpu: Option<usize>,
    server: S,
    client: C,
) -> Result<(A, B), String>
where
    S: FnOnce(TcpListener) -> Result<A, String> + Send + 'static,
    C: FnOnce(SocketAddr) -> Result<B, String> + Send + 'static,
    A: Send + 'static,
    B: Send + 'static,
{
    let listener = TcpListener::bind("127.0.0.1:0").map_err(|e| format!("bind: {e}"))?;
    let addr = listener.local_addr().map_err(|e| e.to_string())?;
    let server = crate::spawn_pinned(&format!("{name}-server"), server_cpu, move || {
        server(listener)
    })?;
    let client = crate::spawn_pinned(&format!("{name}-client"), client_cpu, move || client(addr));
    let measured = match client {
        Ok(c) => c
            .join()
            .map_err(|_| format!("{name} client thread panicked"))
            .and_then(|r| r),
        Err(e) => Err(e),
    };
    if measured.is_err() {
        let _ = TcpStream::connect_timeout(&addr, IO_TIMEOUT);
    }
    let served = server
        .join()
        .map_err(|_| format!("{name} server thread panicked"))
        .and_then(|r| r);
    let m = measured?;
    Ok((served?, m))
}

/// Accepts one connection and sets it up: `TCP_NODELAY`, timeouts.
fn accept_one(listener: &TcpListener) -> Result<TcpStream, String> {
    let (s, _) = listener.accept().map_err(|e| format!("accept: {e}"))?;
    set_up(&s)?;
    Ok(s)
}

/// Connects to `addr` and sets the socket up like [`accept_one`].
fn connect(addr: SocketAddr) -> Result<TcpStream, String> {
    let s = TcpStream::connect_timeout(&addr, IO_TIMEOUT).map_err(|e| format!("connect: {e}"))?;
    set_up(&s)?;
    Ok(s)
}

/// `TCP_NODELAY`, and read and write timeouts of [`IO_TIMEOUT`] so that a
/// stuck peer is an error, not a hang.
pub(crate) fn set_up(s: &TcpStream) -> Result<(), String> {
    s.set_nodelay(true).map_err(|e| e.to_string())?;
    s.set_read_timeout(Some(IO_TIMEOUT))
        .map_err(|e| e.to_string())?;
    s.set_write_timeout(Some(IO_TIMEOUT))
        .map_err(|e| e.to_string())
}

/// A fixed byte pattern of `n` bytes, so payloads are not all zeros.
pub(crate) fn pattern(n: usize) -> Vec<u8> {
    (0..n).map(|i| (i % 251) as u8).collect()
}

/// The raw TCP floor for a pull: over `127.0.0.1`, a server thread reads
/// requests of `req_bytes` (as many as one read of 64 KiB brings) and
/// answers each with a plain `write_all` of a prebuilt `resp_bytes` reply;
/// the client thread writes `depth` requests, then one more for every
/// reply it has read whole, reading several replies per read. Both sockets
/// have `TCP_NODELAY`; each thread is pinned to its CPU.
///
/// [`WARMUP`] runs unmeasured, then `duration` is measured; the client
/// then reads the replies still in flight. The replies the server wrote
/// must be the replies the client read, or the run is an error.
///
/// `depth x req_bytes` is bounded by [`TCP_REQ_BYTES_IN_FLIGHT_MAX`] so the
/// blocking client never waits on a server that waits on the client.
pub fn tcp_request_response(
    req_bytes: usize,
    resp_bytes: usize,
    depth: usize,
    duration: Duration,
    server_cpu: Option<usize>,
    client_cpu: Option<usize>,
) -> Result<TcpRate, String> {
    check_range("request size", req_bytes, TCP_REQ_BYTES_MAX)?;
    check_range("reply size", resp_bytes, TCP_RESP_BYTES_MAX)?;
    check_range("depth", depth, TCP_DEPTH_MAX)?;
    if depth * req_bytes > TCP_REQ_BYTES_IN_FLIGHT_MAX {
        return Err(format!(
            "{depth} requests of {req_bytes} B in flight exceed {TCP_REQ_BYTES_IN_FLIGHT_MAX} B"
        ));
    }
    check_duration(duration)?;
    let (served, m) = run_pair(
        "tcp-reqresp",
        server_cpu,
        client_cpu,
        move |l| reply_server(&l, req_bytes, resp_bytes),
        move |addr| reqresp_client(addr, req_bytes, resp_bytes, depth, duration),
    )?;
    if served != m.total {
        return Err(format!(
            "the server wrote {served} replies but the client read {}",
            m.total
        ));
    }
    Ok(TcpRate {
        pattern: TcpPattern::RequestResponse,
        req_bytes,
        resp_bytes,
        depth,
        responses: m.count,
        bytes: m.count * resp_bytes as u64,
        seconds: m.seconds,
        responses_per_s: per_s(m.count as f64, m.seconds),
        bytes_per_s: per_s((m.count * resp_bytes as u64) as f64, m.seconds),
        server_cpu,
        client_cpu,
    })
}

/// Answers every whole request with `resp_bytes` until the client closes;
/// the number of replies written.
fn reply_server(
    listener: &TcpListener,
    req_bytes: usize,
    resp_bytes: usize,
) -> Result<u64, String> {
    let mut s = accept_one(listener)?;
    let reply = pattern(resp_bytes);
    let mut buf = vec![0u8; TCP_SERVER_READ_BYTES];
    // Bytes of a request whose rest has not arrived yet.
    let mut partial = 0usize;
    let mut replies = 0u64;
    loop {
        let n = match s.read(&mut buf) {
            Ok(0) if partial == 0 => return Ok(replies),
            Ok(0) => return Err(format!("a request was cut short after {partial} B")),
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(format!("tcp server read: {e}")),
        };
        partial += n;
        for _ in 0..partial / req_bytes {
            s.write_all(&reply)
                .map_err(|e| format!("tcp server write: {e}"))?;
            replies += 1;
        }
        partial %= req_bytes;
    }
}

/// What one measuring client saw.
struct Window {
    /// Units (replies, bytes) completed in the measured interval.
    count: u64,
    /// Length of the measured interval, seconds.
    seconds: f64,
    /// Units completed over the whole connection, warm-up and drain too.
    total: u64,
}

/// Marks the measured interval inside a run: it opens at the first
/// observation after the warm-up and closes at the first one `duration`
/// after that.
struct Clock {
    warm_until: Instant,
    duration: Duration,
    opened: Option<(Instant, u64)>,
}

impl Clock {
    fn start(duration: Duration) -> Self {
        Clock {
            warm_until: Instant::now() + WARMUP,
            duration,
            opened: None,
        }
    }

    /// Observes `done` units completed so far; the finished window once
    /// the measured interval is over.
    fn observe(&mut self, done: u64) -> Option<Window> {
        let now = Instant::now();
        match self.opened {
            None => {
                if now >= self.warm_until {
                    self.opened = Some((now, done));
                }
                None
            }
            Some((t0, d0)) => {
                let elapsed = now.duration_since(t0);
                (elapsed >= self.duration).then(|| Window {
                    count: done - d0,
                    seconds: elapsed.as_secs_f64(),
                    total: done,
                })
            }
        }
    }
}

fn reqresp_client(
    addr: SocketAddr,
    req_bytes: usize,
    resp_bytes: usize,
    depth: usize,
    duration: Duration,
) -> Result<Window, String> {
    let mut s = connect(addr)?;
    let requests = pattern(depth * req_bytes);
    let mut buf = vec![0u8; TCP_CLIENT_READ_BYTES];
    let mut clock = Clock::start(duration);
    s.write_all(&requests)
        .map_err(|e| format!("tcp client write: {e}"))?;
    let mut sent = depth as u64;
    let mut done = 0u64;
    // Bytes of the reply being received.
    let mut partial = 0usize;
    let mut measured = None;
    while done < sent {
        let n = match s.read(&mut buf) {
            Ok(0) => return Err("the tcp server closed the connection".into()),
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(format!("tcp client read: {e}")),
        };
        partial += n;
        let whole = partial / resp_bytes;
        partial %= resp_bytes;
        done += whole as u64;
        if done > sent {
            return Err(format!("{done} replies to {sent} requests"));
        }
        if measured.is_none() {
            measured = clock.observe(done);
            if measured.is_none() && whole > 0 {
                s.write_all(&requests[..whole * req_bytes])
                    .map_err(|e| format!("tcp client write: {e}"))?;
                sent += whole as u64;
            }
        }
    }
    if partial != 0 {
        return Err(format!("{partial} B arrived after the last reply"));
    }
    s.shutdown(Shutdown::Write).map_err(|e| e.to_string())?;
    measured
        .map(|w| Window { total: done, ..w })
        .ok_or_else(|| "the run ended before its measured interval".into())
}

/// The CPUs of a two-ended limit (raw TCP) measured beside a server on
/// `server` and clients on `client`: the first server CPU, and the first
/// client CPU other than it. Where client threads share CPUs with workers
/// (`0,1` and `0,1`), the limit still gets both cores instead of both
/// ends on one, which would halve it.
pub fn limit_cpus(server: &[usize], client: &[usize]) -> (Option<usize>, Option<usize>) {
    let s = server.first().copied();
    let c = client
        .iter()
        .copied()
        .find(|&c| Some(c) != s)
        .or(client.first().copied());
    (s, c)
}

/// The single-stream ceiling: over `127.0.0.1`, a sender thread (pinned to
/// `server_cpu`) writes [`TCP_STREAM_WRITE_BYTES`] buffers back to back
/// while a receiver thread (pinned to `client_cpu`) reads into a buffer of
/// the same size, [`WARMUP`] unmeasured, then `duration` measured; bytes
/// received per second. The bytes the sender wrote must be the bytes the
/// receiver read.
pub fn tcp_stream(
    duration: Duration,
    server_cpu: Option<usize>,
    client_cpu: Option<usize>,
) -> Result<TcpRate, String> {
    check_duration(duration)?;
    let stop = Arc::new(AtomicBool::new(false));
    let stop_rx = Arc::clone(&stop);
    let (sent, m) = run_pair(
        "tcp-stream",
        server_cpu,
        client_cpu,
        move |l| stream_sender(&l, &stop),
        move |addr| stream_receiver(addr, duration, &stop_rx),
    )?;
    if sent != m.total {
        return Err(format!(
            "the sender wrote {sent} B but the receiver read {} B",
            m.total
        ));
    }
    let write = TCP_STREAM_WRITE_BYTES as u64;
    Ok(TcpRate {
        pattern: TcpPattern::Stream,
        req_bytes: 0,
        resp_bytes: TCP_STREAM_WRITE_BYTES,
        depth: 0,
        responses: m.count / write,
        bytes: m.count,
        seconds: m.seconds,
        responses_per_s: per_s(m.count as f64 / write as f64, m.seconds),
        bytes_per_s: per_s(m.count as f64, m.seconds),
        server_cpu,
        client_cpu,
    })
}

/// Writes buffers until `stop` is set; the bytes written.
fn stream_sender(listener: &TcpListener, stop: &AtomicBool) -> Result<u64, String> {
    let mut s = accept_one(listener)?;
    let buf = pattern(TCP_STREAM_WRITE_BYTES);
    let mut sent = 0u64;
    while !stop.load(Ordering::Acquire) {
        s.write_all(&buf)
            .map_err(|e| format!("tcp stream write: {e}"))?;
        sent += buf.len() as u64;
    }
    Ok(sent)
}

/// Reads for the warm-up and `duration`, then sets `stop` and reads what
/// is still on its way until the sender closes.
fn stream_receiver(
    addr: SocketAddr,
    duration: Duration,
    stop: &AtomicBool,
) -> Result<Window, String> {
    let mut s = connect(addr)?;
    let mut buf = vec![0u8; TCP_STREAM_WRITE_BYTES];
    let mut clock = Clock::start(duration);
    let mut received = 0u64;
    let mut measured = None;
    loop {
        let n = match s.read(&mut buf) {
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(format!("tcp stream read: {e}")),
        };
        if n == 0 {
            break;
        }
        received += n as u64;
        if measured.is_none() {
            measured = clock.observe(received);
            if measured.is_some() {
                stop.store(true, Ordering::Release);
            }
        }
    }
    measured
        .map(|w| Window {
            total: received,
            ..w
        })
        .ok_or_else(|| "the sender closed before the measured interval ended".into())
}

// ---------------------------------------------------------------------------
// Redis MGET
// ---------------------------------------------------------------------------

/// What [`redis_mget`] runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RedisMgetOpts {
    /// Keys named by each MGET (random, from the whole keyspace).
    pub keys_per_mget: usize,
    /// Bytes of every value.
    pub value_bytes: usize,
    /// Keys `key:000000000000` up to `keyspace - 1`, all preloaded (the
    /// keys redis-benchmark's `-r keyspace` makes of `__rand_int__`).
    pub keyspace: u64,
    /// How long the measured run should last (sized from a calibration
    /// run; redis-benchmark counts requests, not seconds).
    pub duration: Duration,
    /// MGETs in flight per connection (redis-benchmark `-P`).
    pub pipeline: usize,
    /// Connections (redis-benchmark `-c`).
    pub conns: usize,
    /// CPUs redis-server is pinned to (taskset syntax).
    pub server_cpus: Option<String>,
    /// CPUs redis-benchmark is pinned to (taskset syntax).
    pub client_cpus: Option<String>,
}

impl RedisMgetOpts {
    /// An MGET run with no pipelining, [`REDIS_CONNS_DEFAULT`] connections
    /// and no pinning.
    pub fn new(
        keys_per_mget: usize,
        value_bytes: usize,
        keyspace: u64,
        duration: Duration,
    ) -> Self {
        RedisMgetOpts {
            keys_per_mget,
            value_bytes,
            keyspace,
            duration,
            pipeline: 1,
            conns: REDIS_CONNS_DEFAULT,
            server_cpus: None,
            client_cpus: None,
        }
    }
}

/// What [`redis_mget`] measured.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RedisMgetRate {
    /// Keys named by each MGET.
    pub keys_per_mget: usize,
    /// Bytes of every value.
    pub value_bytes: usize,
    /// Distinct keys, all preloaded.
    pub keyspace: u64,
    /// MGETs in flight per connection.
    pub pipeline: usize,
    /// Connections.
    pub conns: usize,
    /// MGETs of the measured run.
    pub requests: u64,
    /// Wall time of the measured run (redis-benchmark's start-up
    /// included), seconds.
    pub seconds: f64,
    /// MGETs per second, as redis-benchmark measured them.
    pub requests_per_s: f64,
    /// Keys per second (`requests_per_s x keys_per_mget`).
    pub keys_per_s: f64,
    /// Value bytes per second (`keys_per_s x value_bytes`).
    pub value_bytes_per_s: f64,
    /// Median MGET latency, microseconds (redis-benchmark's, per request).
    pub p50_us: f64,
    /// 99th percentile MGET latency, microseconds.
    pub p99_us: f64,
    /// CPU-seconds redis-server used during the measured run.
    pub server_cpu_s: f64,
    /// redis-server CPU-seconds per million keys served.
    pub server_cpu_s_per_mkey: f64,
    /// CPUs redis-server was pinned to.
    pub server_cpus: Option<String>,
    /// CPUs redis-benchmark was pinned to.
    pub client_cpus: Option<String>,
    /// The measured run's redis-benchmark arguments, keys abridged.
    pub args: String,
}

impl RedisMgetRate {
    /// The JSON line (`"bench":"peer.redis_mget"`).
    pub fn json(&self) -> String {
        json_line("peer.redis_mget", self)
    }
}

/// The Redis peer of a batched pull: starts redis-server (persistence
/// off, pinned to `server_cpus`), preloads every key of the keyspace with
/// a [`crate::keys::fill_value`] value of `value_bytes` and reads every one
/// back ([`crate::compare::resp_preload`]), then runs redis-benchmark
/// (pinned to `client_cpus`) with `MGET key:__rand_int__ ...` of
/// `keys_per_mget` random keys: once to calibrate, then sized to
/// `duration`. redis-server's CPU time is measured over the measured run,
/// and its `keyspace_misses` must not grow over both runs, so the peer is
/// never measured on misses.
pub fn redis_mget(o: &RedisMgetOpts) -> Result<RedisMgetRate, String> {
    check_range("keys per MGET", o.keys_per_mget, REDIS_MGET_KEYS_MAX)?;
    check_range("value size", o.value_bytes, REDIS_VALUE_BYTES_MAX)?;
    check_range("pipeline", o.pipeline, REDIS_CONNS_MAX)?;
    check_range("connections", o.conns, REDIS_CONNS_MAX)?;
    check_duration(o.duration)?;
    if o.keyspace == 0 || o.keyspace.saturating_mul(o.value_bytes as u64) > REDIS_PRELOAD_BYTES_MAX
    {
        return Err(format!(
            "a keyspace of {} keys of {} B is outside 1 key ..= {REDIS_PRELOAD_BYTES_MAX} B",
            o.keyspace, o.value_bytes
        ));
    }
    let (server, port) = peers::spawn_redis(o.server_cpus.as_deref())?;
    crate::compare::resp_preload(port, o.keyspace, o.value_bytes)?;
    let misses_before = redis_stat(port, "keyspace_misses")?;
    let hits_before = redis_stat(port, "keyspace_hits")?;

    let mut args: Vec<String> = vec![
        "-c".into(),
        o.conns.to_string(),
        "-P".into(),
        o.pipeline.to_string(),
        "-r".into(),
        o.keyspace.to_string(),
        "MGET".into(),
    ];
    args.extend((0..o.keys_per_mget).map(|_| "key:__rand_int__".to_string()));
    let with_n = |n: u64| {
        let mut a = vec!["-n".to_string(), n.to_string()];
        a.extend(args.iter().cloned());
        a
    };
    let client = o.client_cpus.as_deref();
    let calibration = ((o.conns * o.pipeline) as u64 * REDIS_CALIBRATION_ROUNDS)
        .max(REDIS_CALIBRATION_REQUESTS_MIN);
    let t = Instant::now();
    peers::redis_benchmark(client, port, &with_n(calibration))?;
    let calibrated_per_s = calibration as f64 / t.elapsed().as_secs_f64().max(1e-6);
    let n = ((calibrated_per_s * o.duration.as_secs_f64()) as u64)
        .clamp(calibration, REDIS_BENCHMARK_REQUESTS_MAX);

    let meter = CpuMeter::start(server.pid())?;
    let t = Instant::now();
    let rows = peers::redis_benchmark(client, port, &with_n(n))?;
    let seconds = t.elapsed().as_secs_f64();
    let server_cpu_s = meter.elapsed_cpu_s()?;
    let row = rows.first().ok_or("redis-benchmark printed no result")?;

    let misses = redis_stat(port, "keyspace_misses")?.saturating_sub(misses_before);
    if misses != 0 {
        return Err(format!(
            "redis-server missed {misses} keys during the MGETs"
        ));
    }
    let keys = n * o.keys_per_mget as u64;
    let hits = redis_stat(port, "keyspace_hits")?.saturating_sub(hits_before);
    if hits < keys {
        return Err(format!(
            "redis-server found {hits} keys, fewer than the {keys} the MGETs named"
        ));
    }
    drop(server);
    let keys_per_s = row.rps * o.keys_per_mget as f64;
    Ok(RedisMgetRate {
        keys_per_mget: o.keys_per_mget,
        value_bytes: o.value_bytes,
        keyspace: o.keyspace,
        pipeline: o.pipeline,
        conns: o.conns,
        requests: n,
        seconds,
        requests_per_s: row.rps,
        keys_per_s,
        value_bytes_per_s: keys_per_s * o.value_bytes as f64,
        p50_us: row.p50_us,
        p99_us: row.p99_us,
        server_cpu_s,
        server_cpu_s_per_mkey: server_cpu_s / (keys as f64 / 1e6).max(1e-12),
        server_cpus: o.server_cpus.clone(),
        client_cpus: o.client_cpus.clone(),
        args: format!(
            "-n {n} {} MGET key:__rand_int__ x{}",
            args[..args.len() - o.keys_per_mget - 1].join(" "),
            o.keys_per_mget
        ),
    })
}

/// A counter of redis-server's `INFO stats` (`keyspace_hits`, ...).
fn redis_stat(port: u16, field: &str) -> Result<u64, String> {
    let s = TcpStream::connect(("127.0.0.1", port)).map_err(|e| format!("connect: {e}"))?;
    set_up(&s)?;
    let mut w = s.try_clone().map_err(|e| e.to_string())?;
    w.write_all(b"*2\r\n$4\r\nINFO\r\n$5\r\nstats\r\n")
        .map_err(|e| format!("INFO: {e}"))?;
    let mut r = BufReader::new(s);
    let mut head = String::new();
    r.read_line(&mut head).map_err(|e| format!("INFO: {e}"))?;
    let len: usize = head
        .trim_end()
        .strip_prefix('$')
        .and_then(|d| d.parse().ok())
        .ok_or_else(|| format!("INFO answered {head:?}"))?;
    let mut body = vec![0u8; len];
    r.read_exact(&mut body).map_err(|e| format!("INFO: {e}"))?;
    parse_info_field(&String::from_utf8_lossy(&body), field)
        .ok_or_else(|| format!("INFO stats has no {field}"))
}

/// The value of `field` in the text of an `INFO` reply (`name:value`
/// lines).
fn parse_info_field(info: &str, field: &str) -> Option<u64> {
    info.lines().find_map(|l| {
        let (name, value) = l.trim_end().split_once(':')?;
        (name == field).then(|| value.parse().ok())?
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// How long each limit runs in tests.
    const TEST_RUN: Duration = Duration::from_millis(100);

    fn sane(v: f64) -> bool {
        v.is_finite() && v > 0.0
    }

    #[test]
    fn limit_ends_go_on_two_cpus_where_the_lists_allow() {
        assert_eq!(limit_cpus(&[0], &[1]), (Some(0), Some(1)));
        assert_eq!(limit_cpus(&[0, 1], &[0, 1]), (Some(0), Some(1)));
        assert_eq!(limit_cpus(&[0], &[0]), (Some(0), Some(0)));
        assert_eq!(limit_cpus(&[], &[]), (None, None));
        assert_eq!(limit_cpus(&[], &[3, 4]), (None, Some(3)));
    }

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
    fn tcp_request_response_counts_whole_replies() {
        let r = tcp_request_response(900, 51_200, 8, TEST_RUN, None, None).expect("runs");
        assert!(sane(r.responses_per_s) && sane(r.bytes_per_s), "{r:?}");
        assert!(r.responses > 0);
        assert_eq!(r.bytes, r.responses * 51_200);
        assert!((r.bytes_per_s - r.responses_per_s * 51_200.0).abs() <= 1e-9 * r.bytes_per_s);
        let v: serde_json::Value = serde_json::from_str(&r.json()).expect("json");
        assert_eq!(v["bench"], "limit.tcp_reqresp");
        assert_eq!(v["depth"], 8);
        assert!(v.get("pattern").is_none());
        // One in flight, replies smaller than requests, odd sizes.
        let r = tcp_request_response(1000, 7, 1, TEST_RUN, None, None).expect("runs");
        assert!(sane(r.responses_per_s), "{r:?}");
        assert_eq!(r.bytes, r.responses * 7);
    }

    #[test]
    fn tcp_stream_measures_bytes() {
        let r = tcp_stream(TEST_RUN, None, None).expect("stream runs");
        assert!(sane(r.bytes_per_s) && sane(r.seconds), "{r:?}");
        assert_eq!(r.responses, r.bytes / TCP_STREAM_WRITE_BYTES as u64);
        let v: serde_json::Value = serde_json::from_str(&r.json()).expect("json");
        assert_eq!(v["bench"], "limit.tcp_stream");
    }

    #[test]
    fn refuses_out_of_bounds_arguments() {
        let d = Duration::from_millis(10);
        assert!(memcpy_bandwidth(0, 1 << 20, d, None).is_err());
        assert!(memcpy_bandwidth(1 << 20, 1 << 20, d, None).is_err());
        assert!(memcpy_bandwidth(64, MEMCPY_WORKING_SET_BYTES_MAX + 1, d, None).is_err());
        assert!(memcpy_bandwidth(64, 1 << 20, Duration::ZERO, None).is_err());
        assert!(tcp_request_response(0, 1, 1, d, None, None).is_err());
        assert!(tcp_request_response(1, 0, 1, d, None, None).is_err());
        assert!(tcp_request_response(1, 1, 0, d, None, None).is_err());
        assert!(tcp_request_response(1000, 1, 100, d, None, None).is_err());
        assert!(tcp_stream(Duration::ZERO, None, None).is_err());
        let mut o = RedisMgetOpts::new(0, 512, 1000, d);
        assert!(redis_mget(&o).is_err());
        o.keys_per_mget = 10;
        o.keyspace = 0;
        assert!(redis_mget(&o).is_err());
    }

    #[test]
    fn reads_info_fields() {
        let info = "# Stats\r\nkeyspace_hits:1234\r\nkeyspace_misses:0\r\nother:x\r\n";
        assert_eq!(parse_info_field(info, "keyspace_hits"), Some(1234));
        assert_eq!(parse_info_field(info, "keyspace_misses"), Some(0));
        assert_eq!(parse_info_field(info, "other"), None);
        assert_eq!(parse_info_field(info, "keyspace"), None);
    }

    /// Whether `program` is an executable file on `PATH`.
    fn on_path(program: &str) -> bool {
        std::env::var_os("PATH")
            .is_some_and(|p| std::env::split_paths(&p).any(|d| d.join(program).is_file()))
    }

    #[test]
    fn redis_mget_measures_hits() {
        if !on_path("redis-server") || !on_path("redis-benchmark") {
            println!("skipping: redis-server is not installed (scripts/install-deps.sh)");
            return;
        }
        let mut o = RedisMgetOpts::new(10, 512, 1000, Duration::from_millis(300));
        o.conns = 4;
        let r = redis_mget(&o).expect("redis MGETs run");
        assert!(sane(r.requests_per_s) && sane(r.seconds), "{r:?}");
        assert!((r.keys_per_s - r.requests_per_s * 10.0).abs() <= 1e-9 * r.keys_per_s);
        assert!((r.value_bytes_per_s - r.keys_per_s * 512.0).abs() <= 1e-9 * r.value_bytes_per_s);
        assert!(r.p50_us > 0.0 && r.p50_us <= r.p99_us, "{r:?}");
        assert!(r.server_cpu_s > 0.0, "{r:?}");
        assert!(r.args.contains("-r 1000"), "{}", r.args);
        let v: serde_json::Value = serde_json::from_str(&r.json()).expect("json");
        assert_eq!(v["bench"], "peer.redis_mget");
        assert_eq!(v["keys_per_mget"], 10);
    }
}
