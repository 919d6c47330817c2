//! `limit.tcp_split`: the floor under a sharded call over loopback TCP.
//!
//! A call of `batch` GETs that a client splits over `parts` server threads
//! costs, whatever the servers do with the keys, one request and one reply
//! per part: a `send`, a `recv`, the loopback TCP path and a wake-up on each
//! side. On a machine where clients and servers share few cores that cost
//! is most of a small call's CPU, so the share of one server's throughput a
//! cluster can keep is bounded by how the number of parts grows, not by
//! anything a key-value store does.
//!
//! [`tcp_split`] measures exactly that with nothing else: `parts` server
//! threads, each running one `mio` loop over its connections (as a
//! FabricKV worker does) and answering every request of its part's size
//! with a prebuilt reply of its part's size; `threads` client threads, each
//! connected to every server thread, writing one request to each and then
//! reading the replies in turn, one call in flight (as the cluster client
//! does). Requests and replies have the byte sizes of FabricKV's own GET
//! frames. The ratio of this figure at the cluster's part count to the one
//! at the single server's is the most a sharded store could keep over TCP
//! on these cores if keys cost nothing; `fabrickv bench cluster` prints it
//! beside its own ratio.

use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use fabrickv_types::limits::{FRAME_HEADER_BYTES, OP_HEADER_BYTES, RESULT_HEADER_BYTES};
use mio::net::TcpStream as MioStream;
use mio::{Events, Interest, Poll, Token};
use serde::Serialize;

use crate::limits::check::{check_duration, check_range, json_line, per_s, IO_TIMEOUT};
use crate::limits::pair::{pattern, set_up};

/// Most server threads (parts of a call) [`tcp_split`] runs.
pub const SPLIT_PARTS_MAX: usize = 64;
/// Most client threads [`tcp_split`] runs.
pub const SPLIT_THREADS_MAX: usize = 256;
/// Most keys of one call of [`tcp_split`] (bounds every request and reply).
pub const SPLIT_BATCH_MAX: usize = 1 << 16;
/// Largest key or value a [`tcp_split`] call describes, bytes.
pub const SPLIT_ITEM_BYTES_MAX: usize = 1 << 20;
/// Bytes a server thread asks of one `read`.
const SPLIT_SERVER_READ_BYTES: usize = 64 << 10;

/// What to run.
#[derive(Debug, Clone)]
pub struct SplitOpts {
    /// Server threads, one per part of a call.
    pub parts: usize,
    /// Client threads, each with one call in flight.
    pub threads: usize,
    /// GETs per call, spread evenly over the parts.
    pub batch: usize,
    /// Key length, bytes (sets the request sizes).
    pub key_size: usize,
    /// Value length, bytes (sets the reply sizes).
    pub value_size: usize,
    /// Measured time.
    pub duration: Duration,
}

/// What [`tcp_split`] measured.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SplitRate {
    /// Server threads (parts of a call).
    pub parts: usize,
    /// Client threads.
    pub threads: usize,
    /// Keys per call.
    pub batch: usize,
    /// Calls answered whole (every part) in the measured interval.
    pub calls: u64,
    /// Length of the measured interval, seconds (the slowest client's).
    pub seconds: f64,
    /// `calls x batch / seconds`.
    pub keys_per_s: f64,
}

impl SplitRate {
    /// The JSON line (`"bench":"limit.tcp_split"`).
    pub fn json(&self) -> String {
        json_line("limit.tcp_split", self)
    }

    /// Adds another run of the same split: calls and time summed.
    pub fn add(&mut self, other: &SplitRate) {
        self.calls += other.calls;
        self.seconds += other.seconds;
        self.keys_per_s = keys_per_s(self.calls, self.batch, self.seconds);
    }
}

fn keys_per_s(calls: u64, batch: usize, seconds: f64) -> f64 {
    per_s((calls * batch as u64) as f64, seconds)
}

/// Keys of part `p` when `batch` keys are spread evenly over `parts`.
fn part_keys(batch: usize, parts: usize, p: usize) -> usize {
    batch / parts + usize::from(p < batch % parts)
}

/// Bytes of a GET request frame of `n` keys of `key_size` bytes.
fn request_bytes(n: usize, key_size: usize) -> usize {
    FRAME_HEADER_BYTES + n * (OP_HEADER_BYTES + key_size)
}

/// Bytes of the reply frame to it, every key a hit of `value_size` bytes.
fn reply_bytes(n: usize, value_size: usize) -> usize {
    FRAME_HEADER_BYTES + n * (RESULT_HEADER_BYTES + value_size)
}

fn check(o: &SplitOpts) -> Result<(), String> {
    let bounds = || -> Result<(), String> {
        check_range("parts", o.parts, SPLIT_PARTS_MAX)?;
        check_range("threads", o.threads, SPLIT_THREADS_MAX)?;
        check_range("batch", o.batch, SPLIT_BATCH_MAX)?;
        check_range("key size", o.key_size, SPLIT_ITEM_BYTES_MAX)?;
        check_range("value size", o.value_size, SPLIT_ITEM_BYTES_MAX)?;
        check_duration(o.duration)?;
        if o.batch < o.parts {
            return Err(format!(
                "a batch of {} keys has no key for some of {} parts",
                o.batch, o.parts
            ));
        }
        Ok(())
    };
    bounds().map_err(|e| format!("tcp split: {e}"))
}

/// Request and reply bytes of each part of a call, in part order.
fn part_sizes(o: &SplitOpts) -> Vec<(usize, usize)> {
    (0..o.parts)
        .map(|p| {
            let n = part_keys(o.batch, o.parts, p);
            (request_bytes(n, o.key_size), reply_bytes(n, o.value_size))
        })
        .collect()
}

/// Runs the split: see the module's documentation.
pub fn tcp_split(o: &SplitOpts) -> Result<SplitRate, String> {
    check(o)?;
    let sizes = Arc::new(part_sizes(o));
    let mut addrs = Vec::with_capacity(o.parts);
    let mut servers = Vec::with_capacity(o.parts);
    for (p, &(req, reply)) in sizes.iter().enumerate() {
        let listener = TcpListener::bind("127.0.0.1:0").map_err(|e| format!("bind: {e}"))?;
        addrs.push(listener.local_addr().map_err(|e| e.to_string())?);
        let reply = pattern(reply);
        let conns = o.threads;
        servers.push(
            std::thread::Builder::new()
                .name(format!("split-server-{p}"))
                .spawn(move || split_server(&listener, conns, req, &reply))
                .map_err(|e| e.to_string())?,
        );
    }
    let addrs = Arc::new(addrs);
    let start = Arc::new(Barrier::new(o.threads));
    let clients: Vec<_> = (0..o.threads)
        .map(|t| {
            let (addrs, sizes, start) = (addrs.clone(), sizes.clone(), start.clone());
            let duration = o.duration;
            std::thread::Builder::new()
                .name(format!("split-client-{t}"))
                .spawn(move || split_client(&addrs, &sizes, &start, duration))
                .map_err(|e| e.to_string())
        })
        .collect::<Result<_, _>>()?;
    let (mut calls, mut seconds) = (0u64, 0f64);
    let mut failed = None;
    for c in clients {
        match c.join() {
            Ok(Ok((n, s))) => {
                calls += n;
                seconds = seconds.max(s);
            }
            Ok(Err(e)) => failed = Some(e),
            Err(_) => failed = Some("tcp split: a client thread panicked".into()),
        }
    }
    for s in servers {
        match s.join() {
            Ok(Ok(())) => {}
            Ok(Err(e)) => failed = failed.or(Some(e)),
            Err(_) => failed = failed.or(Some("tcp split: a server thread panicked".into())),
        }
    }
    if let Some(e) = failed {
        return Err(e);
    }
    Ok(SplitRate {
        parts: o.parts,
        threads: o.threads,
        batch: o.batch,
        calls,
        seconds,
        keys_per_s: keys_per_s(calls, o.batch, seconds),
    })
}

/// One client: connects to every server thread, waits for the others, then
/// makes calls (part `p` of `sizes[p]` request and reply bytes) for
/// `duration`; its calls and the time they took. Its sockets close when it
/// returns, which ends the server threads.
fn split_client(
    addrs: &[SocketAddr],
    sizes: &[(usize, usize)],
    start: &Barrier,
    duration: Duration,
) -> Result<(u64, f64), String> {
    let mut conns = Vec::with_capacity(addrs.len());
    for a in addrs {
        let s = TcpStream::connect_timeout(a, IO_TIMEOUT).map_err(|e| format!("connect: {e}"))?;
        set_up(&s)?;
        conns.push(s);
    }
    let biggest = sizes.iter().map(|&(q, r)| q.max(r)).max().unwrap_or(0);
    let mut buf = pattern(biggest);
    start.wait();
    let t0 = Instant::now();
    let mut calls = 0u64;
    while t0.elapsed() < duration {
        for (s, &(req, _)) in conns.iter_mut().zip(sizes) {
            s.write_all(&buf[..req])
                .map_err(|e| format!("tcp split: write: {e}"))?;
        }
        for (s, &(_, reply)) in conns.iter_mut().zip(sizes) {
            s.read_exact(&mut buf[..reply])
                .map_err(|e| format!("tcp split: read: {e}"))?;
        }
        calls += 1;
    }
    Ok((calls, t0.elapsed().as_secs_f64()))
}

/// One connection of a server thread: the bytes of the request being read,
/// and the replies owed (the first from `sent` bytes on).
struct Conn {
    s: MioStream,
    got: usize,
    owed: usize,
    sent: usize,
    open: bool,
}

/// One server thread: accepts `conns` connections, then answers every
/// `req` bytes read with `reply` until all of them are closed. A poll that
/// sees nothing for [`IO_TIMEOUT`] is an error (a client died).
fn split_server(
    listener: &TcpListener,
    conns: usize,
    req: usize,
    reply: &[u8],
) -> Result<(), String> {
    let mut poll = Poll::new().map_err(|e| e.to_string())?;
    let mut all = Vec::with_capacity(conns);
    for i in 0..conns {
        let (s, _) = listener.accept().map_err(|e| format!("accept: {e}"))?;
        s.set_nodelay(true).map_err(|e| e.to_string())?;
        s.set_nonblocking(true).map_err(|e| e.to_string())?;
        let mut s = MioStream::from_std(s);
        poll.registry()
            .register(&mut s, Token(i), Interest::READABLE | Interest::WRITABLE)
            .map_err(|e| e.to_string())?;
        all.push(Conn {
            s,
            got: 0,
            owed: 0,
            sent: 0,
            open: true,
        });
    }
    let mut events = Events::with_capacity(conns);
    let mut buf = vec![0u8; SPLIT_SERVER_READ_BYTES];
    let mut open = conns;
    while open > 0 {
        poll.poll(&mut events, Some(IO_TIMEOUT))
            .map_err(|e| e.to_string())?;
        if events.is_empty() {
            return Err(format!("tcp split: no request for {IO_TIMEOUT:?}"));
        }
        for ev in &events {
            let c = all
                .get_mut(ev.token().0)
                .ok_or("tcp split: an event for no connection")?;
            if c.open && !serve(c, req, reply, &mut buf)? {
                c.open = false;
                open -= 1;
            }
        }
    }
    Ok(())
}

/// Reads and answers what a connection has (the poll is edge-triggered,
/// so until `read` would block); false once the client has closed it.
fn serve(c: &mut Conn, req: usize, reply: &[u8], buf: &mut [u8]) -> Result<bool, String> {
    loop {
        while c.owed > 0 {
            match c.s.write(&reply[c.sent..]) {
                Ok(n) => {
                    c.sent += n;
                    if c.sent == reply.len() {
                        c.sent = 0;
                        c.owed -= 1;
                    }
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => return Ok(true),
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => return Err(format!("tcp split: server write: {e}")),
            }
        }
        match c.s.read(buf) {
            Ok(0) => return Ok(false),
            Ok(n) => {
                c.got += n;
                c.owed += c.got / req;
                c.got %= req;
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock => return Ok(true),
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) if e.kind() == ErrorKind::ConnectionReset => return Ok(false),
            Err(e) => return Err(format!("tcp split: server read: {e}")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parts_cover_the_batch() {
        for (batch, parts) in [(96, 2), (96, 3), (100, 3), (5, 5)] {
            let sum: usize = (0..parts).map(|p| part_keys(batch, parts, p)).sum();
            assert_eq!(sum, batch);
            let sizes: Vec<_> = (0..parts).map(|p| part_keys(batch, parts, p)).collect();
            let (lo, hi) = (sizes.iter().min(), sizes.iter().max());
            assert!(
                matches!((lo, hi), (Some(l), Some(h)) if h - l <= 1),
                "{sizes:?}"
            );
        }
    }

    #[test]
    fn frame_sizes_match_the_wire() {
        let (mut req, mut reply) = (Vec::new(), Vec::new());
        let mut q = fabrickv_wire::RequestBuilder::new(&mut req, 1, 0);
        let mut r = fabrickv_wire::ResponseBuilder::new(&mut reply, 1, 0);
        for i in 0..7u8 {
            q.get(&[i; 16]);
            r.result(fabrickv_types::ErrorCode::Ok, &[i; 32]);
        }
        q.finish();
        r.finish();
        assert_eq!(req.len(), request_bytes(7, 16));
        assert_eq!(reply.len(), reply_bytes(7, 32));
    }

    #[test]
    fn a_split_answers_every_call() {
        let o = SplitOpts {
            parts: 3,
            threads: 2,
            batch: 12,
            key_size: 16,
            value_size: 32,
            duration: Duration::from_millis(50),
        };
        let r = tcp_split(&o).expect("the split runs");
        assert!(r.calls > 0, "{r:?}");
        assert!(r.keys_per_s > 0.0);
        assert!(r.json().contains("\"bench\":\"limit.tcp_split\""));
    }

    #[test]
    fn bad_options_are_refused() {
        let good = SplitOpts {
            parts: 3,
            threads: 1,
            batch: 12,
            key_size: 16,
            value_size: 32,
            duration: Duration::from_millis(10),
        };
        for bad in [
            SplitOpts {
                parts: 0,
                ..good.clone()
            },
            SplitOpts {
                batch: 2,
                ..good.clone()
            },
            SplitOpts {
                threads: SPLIT_THREADS_MAX + 1,
                ..good.clone()
            },
            SplitOpts {
                duration: Duration::ZERO,
                ..good.clone()
            },
        ] {
            assert!(tcp_split(&bad).is_err(), "{bad:?}");
        }
    }
}
