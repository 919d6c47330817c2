//! The raw TCP limits over loopback: pipelined fixed-size requests and
//! replies ([`tcp_request_response`], `limit.tcp_reqresp`) and one bulk
//! stream ([`tcp_stream`], `limit.tcp_stream`).

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;

use super::check::{check_duration, check_range, json_line, per_s};
use super::pair::{accept_one, connect, pattern, run_pair, Clock, Window};

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

/// The raw TCP floor for a pull: over `127.0.0.1`, a server thread reads
/// requests of `req_bytes` (as many as one read of 64 KiB brings) and
/// answers each with a plain `write_all` of a prebuilt `resp_bytes` reply;
/// the client thread writes `depth` requests, then one more for every
/// reply it has read whole, reading several replies per read. Both sockets
/// have `TCP_NODELAY`; each thread is pinned to its CPU.
///
/// [`WARMUP`](super::check::WARMUP) runs unmeasured, then `duration` is measured; the client
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

/// The single-stream ceiling: over `127.0.0.1`, a sender thread (pinned to
/// `server_cpu`) writes [`TCP_STREAM_WRITE_BYTES`] buffers back to back
/// while a receiver thread (pinned to `client_cpu`) reads into a buffer of
/// the same size, [`WARMUP`](super::check::WARMUP) unmeasured, then `duration` measured; bytes
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limits::check::testing::{sane, TEST_RUN};

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
    fn tcp_refuses_out_of_bounds_arguments() {
        let d = Duration::from_millis(10);
        assert!(tcp_request_response(0, 1, 1, d, None, None).is_err());
        assert!(tcp_request_response(1, 0, 1, d, None, None).is_err());
        assert!(tcp_request_response(1, 1, 0, d, None, None).is_err());
        assert!(tcp_request_response(1000, 1, 100, d, None, None).is_err());
        assert!(tcp_stream(Duration::ZERO, None, None).is_err());
    }
}
