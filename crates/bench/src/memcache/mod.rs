//! A memcached load generator speaking the text protocol, for memcached's
//! side of `fabrickv bench compare`.
//!
//! memcached has no redis-benchmark of its own, so FabricKV's generator
//! loads it, shaped like redis-benchmark so that the two peers' numbers sit
//! side by side: `conns` connections driven by one client thread (one event
//! loop over non-blocking sockets), `pipeline` requests outstanding on
//! each, uniformly random keys `key:%012d` (the keys `redis-benchmark -r`
//! makes), for a fixed time, every request timed from its write to its
//! reply. Values are [`fill_value`] bytes: text-protocol values are length
//! prefixed, so any byte is fine, and every GET is checked.
//!
//! Like redis-benchmark with `-P`, each connection writes a batch of
//! `pipeline` requests in one write and waits for all of their replies
//! before writing the next batch; each request's latency runs from its
//! batch's write to its own reply.
//!
//! [`proto`] holds the keys and the reply parser; this module, the
//! connections, the event loop and the preload.

pub mod proto;

use std::collections::VecDeque;
use std::io::{ErrorKind, Read, Write};
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use mio::net::TcpStream;
use mio::{Events, Interest, Poll, Token};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

pub use proto::{
    key_number, key_of, parse_reply, McReply, KEY_DIGITS, KEY_PREFIX, MAX_LINE_BYTES,
    MAX_VALUE_BYTES,
};
use proto::{lossy, push_key};

use crate::keys::{check_value, fill_value};
use crate::kv::LATENCY_NS_MAX;
use crate::report::BenchResult;

/// Largest reply buffered per connection, bytes: one `VALUE` line and its
/// data. Replies are consumed as they complete, so a connection's read
/// buffer never needs to hold more than the one reply still arriving.
pub const MAX_REPLY_BYTES: usize = MAX_LINE_BYTES + MAX_VALUE_BYTES + 2;
/// Initial read buffer per connection, bytes; it grows, up to
/// [`MAX_REPLY_BYTES`], only for a reply that does not fit.
pub const READ_CHUNK_BYTES: usize = 64 << 10;
/// How long a run may go without any reply before it is called stuck.
pub const REPLY_TIMEOUT: Duration = Duration::from_secs(10);
/// Longest single wait for socket events, so that the end of the run is
/// noticed on time and a stall is noticed at all.
const POLL_TICK: Duration = Duration::from_millis(50);
/// Bytes of `set` commands preloading writes at once.
const PRELOAD_CHUNK_BYTES: usize = 256 << 10;

/// Which requests to send.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum McOp {
    /// `get KEY`.
    Get,
    /// `set KEY 0 0 LEN` with the key's value (a rewrite of the same value,
    /// so GETs stay checkable).
    Set,
    /// `get K1 K2 ... Kn`: n keys in one request.
    MultiGet(usize),
}

impl McOp {
    /// The name used in case names and params: `get`, `set`, `mget10`.
    pub fn name(&self) -> String {
        match self {
            McOp::Get => "get".into(),
            McOp::Set => "set".into(),
            McOp::MultiGet(n) => format!("mget{n}"),
        }
    }

    /// Keys one request names (counted as operations).
    pub fn keys_per_request(&self) -> usize {
        match self {
            McOp::MultiGet(n) => *n,
            McOp::Get | McOp::Set => 1,
        }
    }
}

/// What to run.
#[derive(Debug, Clone)]
pub struct McOpts {
    /// memcached's address, `host:port`.
    pub addr: String,
    /// The request sent.
    pub op: McOp,
    /// Connections, all driven by the one client thread.
    pub conns: usize,
    /// Requests outstanding per connection.
    pub pipeline: usize,
    /// Distinct keys (numbers `0..keys`); they must have been preloaded.
    pub keys: u64,
    /// Value length in bytes.
    pub value_size: usize,
    /// Measured time (replies still due at its end are awaited and count).
    pub duration: Duration,
    /// CPU to pin the client thread to (none: unpinned).
    pub client_cpu: Option<usize>,
}

impl Default for McOpts {
    fn default() -> Self {
        McOpts {
            addr: "127.0.0.1:11211".into(),
            op: McOp::Get,
            conns: 50,
            pipeline: 1,
            keys: 100_000,
            value_size: 32,
            duration: Duration::from_secs(5),
            client_cpu: None,
        }
    }
}

impl McOpts {
    /// The case name used in tables and JSON: `get p16`, `mget10 p1`.
    pub fn case(&self) -> String {
        format!("{} p{}", self.op.name(), self.pipeline)
    }
}

/// Checks the options a run and a preload share.
fn check_opts(keys: u64, value_size: usize) -> Result<(), String> {
    if keys == 0 {
        return Err("keys must be at least 1".into());
    }
    if value_size > MAX_VALUE_BYTES {
        return Err(format!(
            "value size {value_size} is over the {MAX_VALUE_BYTES} bytes accepted"
        ));
    }
    Ok(())
}

/// Stores every key `0..keys` with its value: pipelined `set ... noreply`
/// commands, then a `get` of the last key as the one round trip that
/// says the sets before it are done (memcached answers a connection's
/// commands in order), and that checks it.
pub fn preload(addr: &str, keys: u64, value_size: usize) -> Result<(), String> {
    check_opts(keys, value_size)?;
    let mut s =
        std::net::TcpStream::connect(addr).map_err(|e| format!("connecting to {addr}: {e}"))?;
    s.set_nodelay(true).map_err(|e| e.to_string())?;
    s.set_read_timeout(Some(REPLY_TIMEOUT))
        .map_err(|e| e.to_string())?;
    s.set_write_timeout(Some(REPLY_TIMEOUT))
        .map_err(|e| e.to_string())?;
    let suffix = format!(" 0 0 {value_size} noreply\r\n");
    let mut value = vec![0u8; value_size];
    let mut buf = Vec::with_capacity(PRELOAD_CHUNK_BYTES + value_size + 64);
    let write = |s: &mut std::net::TcpStream, buf: &mut Vec<u8>| {
        s.write_all(buf)
            .map_err(|e| format!("preloading {addr}: {e}"))?;
        buf.clear();
        Ok::<(), String>(())
    };
    for i in 0..keys {
        buf.extend_from_slice(b"set ");
        push_key(i, &mut buf);
        buf.extend_from_slice(suffix.as_bytes());
        fill_value(i, &mut value);
        buf.extend_from_slice(&value);
        buf.extend_from_slice(b"\r\n");
        if buf.len() >= PRELOAD_CHUNK_BYTES {
            write(&mut s, &mut buf)?;
        }
    }
    let last = keys - 1;
    buf.extend_from_slice(b"get ");
    push_key(last, &mut buf);
    buf.extend_from_slice(b"\r\n");
    write(&mut s, &mut buf)?;

    let mut rbuf = vec![0u8; READ_CHUNK_BYTES];
    let (mut len, mut pos) = (0, 0);
    let mut found = false;
    loop {
        while let Some((reply, used)) = parse_reply(&rbuf[pos..len])? {
            pos += used;
            match reply {
                McReply::Value { key, data, .. } if key_number(key) == Some(last) => {
                    if !check_value(last, value_size, data) {
                        return Err(format!("preloaded key {last} reads back wrong"));
                    }
                    found = true;
                }
                McReply::End if found => return Ok(()),
                McReply::End => return Err(format!("preloaded key {last} is missing")),
                McReply::Error(line) => return Err(format!("memcached answered: {}", lossy(line))),
                other => return Err(format!("unexpected reply while preloading: {other:?}")),
            }
        }
        rbuf.copy_within(pos..len, 0);
        len -= pos;
        pos = 0;
        if len == rbuf.len() {
            if len >= MAX_REPLY_BYTES {
                return Err(format!("reply larger than {MAX_REPLY_BYTES} bytes"));
            }
            rbuf.resize((len * 2).min(MAX_REPLY_BYTES), 0);
        }
        match s.read(&mut rbuf[len..]) {
            Ok(0) => return Err("memcached closed the connection while preloading".into()),
            Ok(n) => len += n,
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return Err(format!("reading from {addr}: {e}")),
        }
    }
}

/// A request written and not yet answered.
struct Pending {
    /// When it was written.
    at: Instant,
    /// How many of its keys (at the front of [`Conn::keys`]) are still
    /// unanswered.
    left: usize,
}

/// What the run has counted so far.
struct Tally {
    hist: Histogram<u64>,
    requests: u64,
    ops: u64,
    wrong: u64,
}

/// One connection and its requests in flight.
struct Conn {
    sock: TcpStream,
    /// Received bytes not yet parsed are `rbuf[..rlen]`.
    rbuf: Vec<u8>,
    rlen: usize,
    /// Requests not yet written are `wbuf[wpos..]`.
    wbuf: Vec<u8>,
    wpos: usize,
    pending: VecDeque<Pending>,
    /// The keys of the requests in `pending`, in order.
    keys: VecDeque<u64>,
}

/// Makes requests: the random keys and the bytes of the command.
struct Requests {
    op: McOp,
    keys: u64,
    value_size: usize,
    rng: SmallRng,
    value: Vec<u8>,
    /// `" 0 0 LEN\r\n"`, the tail of every `set` line.
    set_suffix: Vec<u8>,
}

impl Requests {
    fn new(opts: &McOpts) -> Self {
        Requests {
            op: opts.op,
            keys: opts.keys,
            value_size: opts.value_size,
            rng: SmallRng::seed_from_u64(0x6D65_6D63),
            value: vec![0; opts.value_size],
            set_suffix: format!(" 0 0 {}\r\n", opts.value_size).into_bytes(),
        }
    }

    /// Appends one request to `c`'s write buffer and its bookkeeping.
    fn push(&mut self, c: &mut Conn, now: Instant) {
        let n = self.op.keys_per_request();
        match self.op {
            McOp::Get | McOp::MultiGet(_) => {
                c.wbuf.extend_from_slice(b"get");
                for _ in 0..n {
                    let i = self.rng.gen_range(0..self.keys);
                    c.wbuf.push(b' ');
                    push_key(i, &mut c.wbuf);
                    c.keys.push_back(i);
                }
                c.wbuf.extend_from_slice(b"\r\n");
            }
            McOp::Set => {
                let i = self.rng.gen_range(0..self.keys);
                c.wbuf.extend_from_slice(b"set ");
                push_key(i, &mut c.wbuf);
                c.wbuf.extend_from_slice(&self.set_suffix);
                fill_value(i, &mut self.value);
                c.wbuf.extend_from_slice(&self.value);
                c.wbuf.extend_from_slice(b"\r\n");
                c.keys.push_back(i);
            }
        }
        c.pending.push_back(Pending { at: now, left: n });
    }
}

impl Conn {
    /// Once every request of the last batch is answered, writes the next
    /// batch of `pipeline` requests in one write, as redis-benchmark does
    /// with `-P` (so both peers see the same batches); otherwise only
    /// writes what is still unwritten.
    fn refill(&mut self, reqs: &mut Requests, pipeline: usize) -> Result<(), String> {
        if self.pending.is_empty() {
            let now = Instant::now();
            for _ in 0..pipeline {
                reqs.push(self, now);
            }
        }
        self.flush()
    }

    /// Writes the unwritten requests until done or the socket is full (a
    /// writable event resumes it).
    fn flush(&mut self) -> Result<(), String> {
        while self.wpos < self.wbuf.len() {
            match self.sock.write(&self.wbuf[self.wpos..]) {
                Ok(0) => return Err("memcached stopped taking requests".into()),
                Ok(n) => self.wpos += n,
                Err(e) if e.kind() == ErrorKind::WouldBlock => return Ok(()),
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => return Err(format!("writing to memcached: {e}")),
            }
        }
        self.wbuf.clear();
        self.wpos = 0;
        Ok(())
    }

    /// Reads until the socket is drained, handling every complete reply.
    fn read_replies(&mut self, reqs: &Requests, tally: &mut Tally) -> Result<(), String> {
        loop {
            if self.rlen == self.rbuf.len() {
                // Only an incomplete reply is left in a full buffer.
                if self.rbuf.len() >= MAX_REPLY_BYTES {
                    return Err(format!("reply larger than {MAX_REPLY_BYTES} bytes"));
                }
                let grown = (self.rbuf.len() * 2).min(MAX_REPLY_BYTES);
                self.rbuf.resize(grown, 0);
            }
            match self.sock.read(&mut self.rbuf[self.rlen..]) {
                Ok(0) => return Err("memcached closed the connection".into()),
                Ok(n) => {
                    self.rlen += n;
                    self.consume(Instant::now(), reqs, tally)?;
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => return Ok(()),
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => return Err(format!("reading from memcached: {e}")),
            }
        }
    }

    /// Handles the complete replies in the read buffer, all received at
    /// `now`, and keeps the incomplete rest.
    fn consume(&mut self, now: Instant, reqs: &Requests, tally: &mut Tally) -> Result<(), String> {
        let Conn {
            rbuf,
            rlen,
            pending,
            keys,
            ..
        } = self;
        let mut pos = 0;
        while let Some((reply, used)) = parse_reply(&rbuf[pos..*rlen])? {
            on_reply(reply, now, reqs, pending, keys, tally)?;
            pos += used;
        }
        rbuf.copy_within(pos..*rlen, 0);
        *rlen -= pos;
        Ok(())
    }
}

/// Applies one reply item to the oldest request in flight.
fn on_reply(
    reply: McReply<'_>,
    now: Instant,
    reqs: &Requests,
    pending: &mut VecDeque<Pending>,
    keys: &mut VecDeque<u64>,
    tally: &mut Tally,
) -> Result<(), String> {
    let is_get = reqs.op != McOp::Set;
    let Some(front) = pending.front_mut() else {
        return Err(format!("reply with no request outstanding: {reply:?}"));
    };
    match reply {
        McReply::Value { key, data, .. } if is_get => {
            let got = key_number(key)
                .ok_or_else(|| format!("VALUE for a key never asked: {}", lossy(key)))?;
            // memcached answers a multi-key get in the order asked and
            // leaves out the keys it does not hold: those are missing.
            loop {
                let want = match keys.pop_front() {
                    Some(k) if front.left > 0 => k,
                    _ => return Err(format!("VALUE for a key not asked: {}", lossy(key))),
                };
                front.left -= 1;
                if want == got {
                    if !check_value(want, reqs.value_size, data) {
                        tally.wrong += 1;
                    }
                    return Ok(());
                }
                tally.wrong += 1;
            }
        }
        McReply::End if is_get => {
            tally.wrong += front.left as u64;
            keys.drain(..front.left.min(keys.len()));
        }
        McReply::Stored if !is_get => {
            keys.pop_front();
        }
        McReply::Error(line) => return Err(format!("memcached answered: {}", lossy(line))),
        other => return Err(format!("unexpected reply from memcached: {other:?}")),
    }
    // The request is complete.
    if let Some(p) = pending.pop_front() {
        let ns = now.saturating_duration_since(p.at).as_nanos();
        tally
            .hist
            .saturating_record(u64::try_from(ns).unwrap_or(u64::MAX));
    }
    tally.requests += 1;
    tally.ops += reqs.op.keys_per_request() as u64;
    Ok(())
}

/// Runs the load and returns its result. The keys must be preloaded
/// ([`preload`]); a GET of a missing key counts as a wrong value.
pub fn run(opts: &McOpts) -> Result<BenchResult, String> {
    check_opts(opts.keys, opts.value_size)?;
    if opts.conns == 0 || opts.pipeline == 0 || opts.op.keys_per_request() == 0 {
        return Err("connections, pipeline depth and keys per get must all be at least 1".into());
    }
    let thread_opts = opts.clone();
    let cpu = thread_opts.client_cpu;
    let (tally, seconds) = crate::run_pinned("memcache-load", cpu, move || drive(&thread_opts))??;
    let per_s = |n: u64| n as f64 / seconds.max(1e-9);
    let us = |q: f64| tally.hist.value_at_quantile(q) as f64 / 1e3;
    Ok(BenchResult {
        bench: "compare".into(),
        case: opts.case(),
        system: "memcached".into(),
        ops_per_s: per_s(tally.ops),
        p50_us: us(0.50),
        p99_us: us(0.99),
        ops: tally.ops,
        seconds,
        wrong_values: tally.wrong,
        params: serde_json::json!({
            "conns": opts.conns, "pipeline": opts.pipeline, "keys": opts.keys,
            "value_size": opts.value_size, "op": opts.op.name(),
            "keys_per_request": opts.op.keys_per_request(), "requests": tally.requests,
            "requests_per_s": per_s(tally.requests), "client_cpu": opts.client_cpu,
        }),
    })
}

/// The client thread: connects, keeps every connection's window full
/// until the time is up, waits for the last replies. Returns the tally and
/// the seconds from the first request to the last reply.
fn drive(opts: &McOpts) -> Result<(Tally, f64), String> {
    let mut poll = Poll::new().map_err(|e| format!("cannot create a poll: {e}"))?;
    let mut conns = Vec::with_capacity(opts.conns);
    for t in 0..opts.conns {
        let s = std::net::TcpStream::connect(&opts.addr)
            .map_err(|e| format!("connecting to {}: {e}", opts.addr))?;
        s.set_nodelay(true).map_err(|e| e.to_string())?;
        s.set_nonblocking(true).map_err(|e| e.to_string())?;
        let mut sock = TcpStream::from_std(s);
        poll.registry()
            .register(&mut sock, Token(t), Interest::READABLE | Interest::WRITABLE)
            .map_err(|e| e.to_string())?;
        conns.push(Conn {
            sock,
            rbuf: vec![0; READ_CHUNK_BYTES],
            rlen: 0,
            wbuf: Vec::new(),
            wpos: 0,
            pending: VecDeque::with_capacity(opts.pipeline),
            keys: VecDeque::with_capacity(opts.pipeline * opts.op.keys_per_request()),
        });
    }
    let mut reqs = Requests::new(opts);
    let mut tally = Tally {
        hist: Histogram::new_with_bounds(1, LATENCY_NS_MAX, 3).map_err(|e| e.to_string())?,
        requests: 0,
        ops: 0,
        wrong: 0,
    };
    let mut events = Events::with_capacity(1024);
    let start = Instant::now();
    let end = start + opts.duration;
    for c in &mut conns {
        c.refill(&mut reqs, opts.pipeline)?;
    }
    let mut sending = true;
    let mut last_reply = start;
    loop {
        let now = Instant::now();
        sending &= now < end;
        if !sending && conns.iter().all(|c| c.pending.is_empty()) {
            break;
        }
        let wait = if sending {
            (end - now).min(POLL_TICK)
        } else {
            POLL_TICK
        };
        match poll.poll(&mut events, Some(wait)) {
            Ok(()) => {}
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            Err(e) => return Err(format!("polling: {e}")),
        }
        let before = tally.requests;
        for ev in events.iter() {
            let Some(c) = conns.get_mut(ev.token().0) else {
                continue;
            };
            if ev.is_readable() || ev.is_read_closed() || ev.is_error() {
                c.read_replies(&reqs, &mut tally)?;
                if sending {
                    c.refill(&mut reqs, opts.pipeline)?;
                    continue;
                }
            }
            if ev.is_writable() {
                c.flush()?;
            }
        }
        if tally.requests > before {
            last_reply = Instant::now();
        } else if last_reply.elapsed() > REPLY_TIMEOUT {
            return Err(format!("no reply from memcached within {REPLY_TIMEOUT:?}"));
        }
    }
    Ok((tally, start.elapsed().as_secs_f64()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::peers::on_path;
    use crate::peers::spawn_memcached;

    #[test]
    fn loads_a_local_memcached() {
        if !on_path("memcached") {
            println!("skipping: memcached is not installed (scripts/install-deps.sh)");
            return;
        }
        let (_mc, port) = spawn_memcached(None).expect("memcached starts");
        let addr = format!("127.0.0.1:{port}");
        preload(&addr, 1000, 32).expect("preloads");
        let opts = |op| McOpts {
            addr: addr.clone(),
            op,
            conns: 4,
            pipeline: 4,
            keys: 1000,
            value_size: 32,
            duration: Duration::from_millis(300),
            client_cpu: None,
        };
        for op in [McOp::Get, McOp::Set, McOp::MultiGet(10)] {
            let r = run(&opts(op)).expect("runs");
            assert!(r.ops > 0, "{}: no operations", r.case);
            assert_eq!(r.wrong_values, 0, "{}", r.case);
            assert_eq!(r.system, "memcached");
            assert_eq!(r.case, format!("{} p4", op.name()));
            let requests = r.params["requests"].as_u64().expect("requests counted");
            assert_eq!(r.ops, requests * op.keys_per_request() as u64);
        }
        // Keys 1000..2000 were never stored: reading them is wrong.
        let missing = run(&McOpts {
            keys: 2000,
            ..opts(McOp::MultiGet(4))
        })
        .expect("runs");
        assert!(missing.wrong_values > 0, "missing keys went unnoticed");
        // memcached refuses an item over its size limit; the run says so.
        let err = run(&McOpts {
            conns: 1,
            pipeline: 1,
            value_size: MAX_VALUE_BYTES,
            ..opts(McOp::Set)
        })
        .expect_err("an oversized value fails");
        assert!(err.contains("SERVER_ERROR"), "{err}");
    }

    /// The sample behind the module's numbers: get p16 over 50 connections
    /// for 2 s, memcached on CPU 0 and the client on CPU 1. Run with
    /// `cargo test -p fabrickv-bench --release memcache::tests::sample -- --ignored --nocapture`.
    #[test]
    #[ignore = "a measurement, not a test"]
    fn sample_get_p16() {
        let (mc, port) = spawn_memcached(Some("0")).expect("memcached starts");
        let addr = format!("127.0.0.1:{port}");
        preload(&addr, 100_000, 32).expect("preloads");
        let meter = crate::cpu::CpuMeter::start(mc.pid()).expect("measurable");
        let r = run(&McOpts {
            addr,
            op: McOp::Get,
            conns: 50,
            pipeline: 16,
            keys: 100_000,
            value_size: 32,
            duration: Duration::from_secs(2),
            client_cpu: Some(1),
        })
        .expect("runs");
        let cpu = meter.elapsed_cpu_s().expect("measurable");
        println!("{}", r.json());
        println!(
            "memcached CPU: {cpu:.3} s, {:.0} ops per CPU-second",
            r.ops as f64 / cpu
        );
    }
}
