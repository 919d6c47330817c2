//! A RESP load at a fixed offered rate: how much CPU a server spends per
//! operation when it is not saturated.
//!
//! redis-benchmark sends as fast as replies come back, so it measures a
//! saturated server. A user's server mostly is not, and a server that
//! polls instead of blocking can look fast saturated while burning its
//! core at any load. This generator sends GETs on a fixed schedule
//! (`rate` per second, spread over `conns` connections, at most one
//! outstanding per connection) from one thread, so the server's CPU time
//! over the run divided by the operations is its cost at that load.
//!
//! Every reply is checked to be the stored value's bulk string (its exact
//! length and bytes), so a server that answers wrongly cannot look cheap.

use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use crate::keys::check_value;
use crate::report::{latency_histogram, BenchResult};

/// Connections a paced run spreads its requests over.
pub const PACED_CONNS: usize = 16;

/// Longest a paced run waits for its last replies after its schedule
/// ends, in seconds.
const DRAIN_TIMEOUT_S: u64 = 10;

/// What a paced run does.
#[derive(Debug, Clone)]
pub struct PacedOpts {
    /// The server's RESP port on loopback.
    pub port: u16,
    /// GETs per second offered.
    pub rate: f64,
    /// Keys `0..keys` are stored (as `resp_preload` stores them).
    pub keys: u64,
    /// Their value size in bytes.
    pub value_size: usize,
    /// Length of the run.
    pub duration: Duration,
}

struct Conn {
    stream: TcpStream,
    /// The key and send time of the outstanding GET, if any.
    outstanding: Option<(u64, Instant)>,
    /// Reply bytes received so far for the outstanding GET.
    reply: Vec<u8>,
}

/// Runs the schedule; the result's `ops_per_s` is what was served, which
/// falls below `rate` only if the server could not keep up.
pub fn run(o: &PacedOpts) -> Result<BenchResult, String> {
    if o.rate <= 0.0 {
        return Err("a paced run needs a positive rate".into());
    }
    let header = format!("${}\r\n", o.value_size);
    let reply_len = header.len() + o.value_size + 2;
    let mut conns = Vec::with_capacity(PACED_CONNS);
    for _ in 0..PACED_CONNS {
        let stream = TcpStream::connect(("127.0.0.1", o.port)).map_err(|e| e.to_string())?;
        stream.set_nodelay(true).map_err(|e| e.to_string())?;
        stream.set_nonblocking(true).map_err(|e| e.to_string())?;
        conns.push(Conn {
            stream,
            outstanding: None,
            reply: Vec::with_capacity(reply_len),
        });
    }
    let mut hist = latency_histogram()?;
    let interval = Duration::from_secs_f64(1.0 / o.rate);
    let start = Instant::now();
    let end = start + o.duration;
    let mut next_send = start;
    let mut sent = 0u64;
    let mut done = 0u64;
    let mut wrong = 0u64;
    let mut late = 0u64;
    let mut buf = vec![0u8; 64 << 10];
    let mut rng = 0x9e37_79b9_7f4a_7c15u64;
    let mut turn = 0usize;
    loop {
        let now = Instant::now();
        if now >= end && conns.iter().all(|c| c.outstanding.is_none()) {
            break;
        }
        if now >= end + Duration::from_secs(DRAIN_TIMEOUT_S) {
            return Err("the server stopped answering".into());
        }
        // Send what the schedule says is due, on free connections.
        while now >= next_send && next_send < end {
            let free = (0..conns.len())
                .map(|k| (turn + k) % conns.len())
                .find(|&i| conns[i].outstanding.is_none());
            let Some(i) = free else {
                // Every connection is waiting: the server is behind.
                late += 1;
                break;
            };
            turn = i + 1;
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            let key = rng % o.keys;
            let cmd = format!("*2\r\n$3\r\nGET\r\n$16\r\nkey:{key:012}\r\n");
            write_all_nonblocking(&mut conns[i].stream, cmd.as_bytes())?;
            conns[i].outstanding = Some((key, next_send));
            sent += 1;
            next_send += interval;
        }
        // Collect replies.
        for c in conns.iter_mut() {
            let Some((key, at)) = c.outstanding else {
                continue;
            };
            match c.stream.read(&mut buf) {
                Ok(0) => return Err("the server closed a connection".into()),
                Ok(n) => c.reply.extend_from_slice(&buf[..n]),
                Err(e) if e.kind() == ErrorKind::WouldBlock => continue,
                Err(e) => return Err(e.to_string()),
            }
            if c.reply.len() > reply_len {
                return Err("a reply longer than the stored value's".into());
            }
            if c.reply.len() == reply_len {
                let ok = c.reply.starts_with(header.as_bytes())
                    && c.reply.ends_with(b"\r\n")
                    && check_value(
                        key,
                        o.value_size,
                        &c.reply[header.len()..header.len() + o.value_size],
                    );
                if !ok {
                    wrong += 1;
                }
                // Latency from the scheduled send, so a server that falls
                // behind shows it (no coordinated omission).
                let us = at.elapsed().as_micros().max(1) as u64;
                let _ = hist.record(us);
                c.reply.clear();
                c.outstanding = None;
                done += 1;
            }
        }
    }
    let seconds = start.elapsed().as_secs_f64();
    Ok(BenchResult {
        bench: "compare".into(),
        case: String::new(),
        system: String::new(),
        ops_per_s: done as f64 / o.duration.as_secs_f64(),
        p50_us: hist.value_at_quantile(0.5) as f64,
        p99_us: hist.value_at_quantile(0.99) as f64,
        ops: done,
        seconds,
        wrong_values: wrong,
        params: serde_json::json!({
            "tool": "paced", "offered_per_s": o.rate, "sent": sent,
            "conns": PACED_CONNS, "late_sends": late,
            "latency": "from the scheduled send",
        }),
    })
}

fn write_all_nonblocking(s: &mut TcpStream, mut bytes: &[u8]) -> Result<(), String> {
    let deadline = Instant::now() + Duration::from_secs(DRAIN_TIMEOUT_S);
    while !bytes.is_empty() {
        match s.write(bytes) {
            Ok(n) => bytes = &bytes[n..],
            Err(e) if e.kind() == ErrorKind::WouldBlock => {
                if Instant::now() > deadline {
                    return Err("the server stopped reading".into());
                }
                std::thread::yield_now();
            }
            Err(e) => return Err(e.to_string()),
        }
    }
    Ok(())
}
