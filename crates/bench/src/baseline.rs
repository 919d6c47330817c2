//! Baselines of `fabrickv bench rpc --compare`, measured in the same run as
//! FabricKV's own RPC rows:
//!
//! - [`tcp_pingpong`] (`tcp-pingpong`): a blocking TCP echo of `msg_size`
//!   bytes, one in flight, `TCP_NODELAY`: the physical floor for the `tcp`
//!   transport (target: FabricKV's p50 at most 1.25x this row's);
//! - [`grpc_unary`] (`grpc-unary`): a tonic unary echo call, server and client
//!   each on a single-threaded tokio runtime in its own thread (target:
//!   FabricKV's ops/s at least 10x this row's).
//!
//! Every round trip is recorded in a histogram (ns); [`LatencySummary`] turns
//! one into the RPC framework benchmark's columns (ops/s, fast, ave, p50, p99), and each
//! [`BenchResult`] carries `fast_us` and `ave_us` in its `params`.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;

use crate::limits::check::{check_duration, check_range, IO_TIMEOUT, WARMUP};
use crate::limits::pair::{connect, pattern, run_pair};
#[cfg(test)]
use crate::report::RPC_TABLE_HEADER;
use crate::report::{latency_histogram, BenchResult, LatencySummary};

/// The code generated from `proto/echo.proto`.
#[allow(clippy::all, clippy::pedantic, clippy::unwrap_used, missing_docs)]
pub mod echo_proto {
    tonic::include_proto!("fabrickv.bench.echo");
}

use echo_proto::echo_client::EchoClient;
use echo_proto::echo_server::{Echo, EchoServer};
use echo_proto::Msg;

/// Largest message a baseline sends, bytes (below gRPC's default 4 MiB
/// decode limit).
pub const MAX_MSG_SIZE_BYTES: usize = 1 << 20;
/// Most concurrent calls `grpc_unary` keeps in flight.
pub const MAX_IN_FLIGHT: usize = 1024;
/// Bytes at the start of each request that carry its sequence number, so a
/// stale or mixed-up reply is counted in `wrong_values`.
const STAMP_BYTES: usize = 8;

/// The case name shared by every row of one `rpc` configuration:
/// `latency 64B` with one request in flight, `throughput 64B x32` otherwise.
pub fn rpc_case(msg_size: usize, in_flight: usize) -> String {
    if in_flight <= 1 {
        format!("latency {msg_size}B")
    } else {
        format!("throughput {msg_size}B x{in_flight}")
    }
}

fn check_args(msg_size: usize, duration: Duration, in_flight: usize) -> Result<(), String> {
    if msg_size == 0 || msg_size > MAX_MSG_SIZE_BYTES {
        return Err(format!(
            "message size {msg_size} B is outside 1..={MAX_MSG_SIZE_BYTES} B"
        ));
    }
    check_range("in-flight", in_flight, MAX_IN_FLIGHT)?;
    check_duration(duration)
}

/// Writes `seq` into the first bytes of `buf` (as many as fit).
fn stamp(buf: &mut [u8], seq: u64) {
    let n = buf.len().min(STAMP_BYTES);
    buf[..n].copy_from_slice(&seq.to_le_bytes()[..n]);
}

fn params(
    msg_size: usize,
    in_flight: usize,
    server_cpu: Option<usize>,
    client_cpu: Option<usize>,
) -> serde_json::Value {
    serde_json::json!({
        "msg_size": msg_size,
        "in_flight": in_flight,
        "server_cpu": server_cpu,
        "client_cpu": client_cpu,
        "warmup_s": WARMUP.as_secs_f64(),
    })
}

// ---------------------------------------------------------------------------
// Raw TCP ping-pong
// ---------------------------------------------------------------------------

/// The raw TCP floor: a blocking echo server thread on `127.0.0.1:0` that
/// reads exactly `msg_size` bytes and writes them back, and one client
/// thread doing `write_all` + `read_exact` of `msg_size`, one in flight,
/// both with `TCP_NODELAY`, pinned to the given CPUs. Every round trip is
/// recorded; system `tcp-pingpong`.
///
/// With `spin`, both sides use non-blocking sockets and busy-poll instead
/// of sleeping in `read` (`tcp-pingpong-spin`): the floor for a transport
/// whose threads busy-poll, without the cross-CPU wake-up of a blocking
/// read in each round trip.
pub fn tcp_pingpong(
    msg_size: usize,
    duration: Duration,
    server_cpu: Option<usize>,
    client_cpu: Option<usize>,
    spin: bool,
) -> Result<BenchResult, String> {
    check_args(msg_size, duration, 1)?;
    let ((), m) = run_pair(
        "tcp-pingpong",
        server_cpu,
        client_cpu,
        move |listener| tcp_echo_server(listener, msg_size, spin),
        move |addr| tcp_client(addr, msg_size, duration, spin),
    )?;
    let s = LatencySummary::from_histogram(&m.hist, m.seconds);
    Ok(s.to_result(
        &rpc_case(msg_size, 1),
        if spin {
            "tcp-pingpong-spin"
        } else {
            "tcp-pingpong"
        },
        m.hist.len(),
        m.seconds,
        m.wrong,
        params(msg_size, 1, server_cpu, client_cpu),
    ))
}

/// What one measured client run gives back.
struct Measured {
    hist: Histogram<u64>,
    seconds: f64,
    wrong: u64,
}

/// Reads exactly `buf.len()` bytes; with `spin`, on a non-blocking socket
/// by busy-polling (giving up after `IO_TIMEOUT`).
fn read_full(s: &mut TcpStream, buf: &mut [u8], spin: bool) -> std::io::Result<()> {
    if !spin {
        return s.read_exact(buf);
    }
    let len = buf.len();
    spin_all(len, std::io::ErrorKind::UnexpectedEof, |at| {
        s.read(&mut buf[at..])
    })
}

/// Writes all of `buf`; with `spin`, busy-polling a non-blocking socket.
fn write_full(s: &mut TcpStream, buf: &[u8], spin: bool) -> std::io::Result<()> {
    if !spin {
        return s.write_all(buf);
    }
    spin_all(buf.len(), std::io::ErrorKind::WriteZero, |at| {
        s.write(&buf[at..])
    })
}

/// Moves `len` bytes with `op` (a read or write of the rest, given the
/// bytes done so far) on a non-blocking socket, busy-polling while it
/// would block, giving up after `IO_TIMEOUT`; an `op` that moves nothing
/// fails with `zero` (the peer closed).
fn spin_all(
    len: usize,
    zero: std::io::ErrorKind,
    mut op: impl FnMut(usize) -> std::io::Result<usize>,
) -> std::io::Result<()> {
    let deadline = Instant::now() + IO_TIMEOUT;
    let mut at = 0;
    while at < len {
        match op(at) {
            Ok(0) => return Err(zero.into()),
            Ok(n) => at += n,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                if Instant::now() > deadline {
                    return Err(std::io::ErrorKind::TimedOut.into());
                }
                std::hint::spin_loop();
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

fn tcp_echo_server(listener: TcpListener, msg_size: usize, spin: bool) -> Result<(), String> {
    let (mut s, _) = listener.accept().map_err(|e| format!("accept: {e}"))?;
    s.set_nodelay(true).map_err(|e| e.to_string())?;
    s.set_nonblocking(spin).map_err(|e| e.to_string())?;
    let mut buf = vec![0u8; msg_size];
    loop {
        match read_full(&mut s, &mut buf, spin) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(()),
            Err(e) => return Err(format!("tcp server read: {e}")),
        }
        write_full(&mut s, &buf, spin).map_err(|e| format!("tcp server write: {e}"))?;
    }
}

fn tcp_client(
    addr: SocketAddr,
    msg_size: usize,
    duration: Duration,
    spin: bool,
) -> Result<Measured, String> {
    let mut s = connect(addr)?;
    s.set_nonblocking(spin).map_err(|e| e.to_string())?;
    let mut req = pattern(msg_size);
    let mut resp = vec![0u8; msg_size];
    let mut seq = 0u64;
    let mut run = |span: Duration| -> Result<Measured, String> {
        let mut hist = latency_histogram()?;
        let mut wrong = 0u64;
        let start = Instant::now();
        let deadline = start + span;
        let mut now = start;
        while now < deadline {
            seq += 1;
            stamp(&mut req, seq);
            let t0 = Instant::now();
            write_full(&mut s, &req, spin).map_err(|e| format!("tcp client write: {e}"))?;
            read_full(&mut s, &mut resp, spin).map_err(|e| format!("tcp client read: {e}"))?;
            now = Instant::now();
            hist.saturating_record(now.duration_since(t0).as_nanos() as u64);
            if resp != req {
                wrong += 1;
            }
        }
        Ok(Measured {
            hist,
            seconds: now.duration_since(start).as_secs_f64(),
            wrong,
        })
    };
    run(WARMUP)?;
    run(duration)
}

// ---------------------------------------------------------------------------
// tonic gRPC unary
// ---------------------------------------------------------------------------

/// The echo service: answers each call with its request.
#[derive(Debug, Default)]
struct EchoService;

#[tonic::async_trait]
impl Echo for EchoService {
    async fn call(
        &self,
        request: tonic::Request<Msg>,
    ) -> Result<tonic::Response<Msg>, tonic::Status> {
        Ok(tonic::Response::new(request.into_inner()))
    }
}

/// A tonic echo server on a current-thread runtime in its own thread.
pub struct GrpcEchoServer {
    /// Where it listens (`127.0.0.1`, a free port).
    pub addr: SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<JoinHandle<Result<(), String>>>,
}

impl GrpcEchoServer {
    /// Starts the server on `127.0.0.1:0`, its thread pinned to `cpu`.
    pub fn start(cpu: Option<usize>) -> Result<Self, String> {
        let (addr_tx, addr_rx) = mpsc::channel::<Result<SocketAddr, String>>();
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::Builder::new()
            .name("grpc-echo-server".into())
            .spawn(move || grpc_server_thread(cpu, addr_tx, stop_rx))
            .map_err(|e| format!("cannot start the grpc server thread: {e}"))?;
        let mut server = GrpcEchoServer {
            addr: SocketAddr::from(([127, 0, 0, 1], 0)),
            stop: Some(stop_tx),
            thread: Some(thread),
        };
        match addr_rx.recv_timeout(IO_TIMEOUT) {
            Ok(Ok(addr)) => {
                server.addr = addr;
                Ok(server)
            }
            Ok(Err(e)) => Err(e),
            Err(_) => Err(format!("grpc server did not start within {IO_TIMEOUT:?}")),
        }
    }

    /// Stops the server (in-flight connections are dropped) and reports
    /// any error it hit while serving.
    pub fn stop(mut self) -> Result<(), String> {
        self.shutdown()
    }

    fn shutdown(&mut self) -> Result<(), String> {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        match self.thread.take() {
            Some(t) => t
                .join()
                .map_err(|_| "grpc server thread panicked".to_string())?,
            None => Ok(()),
        }
    }
}

impl Drop for GrpcEchoServer {
    fn drop(&mut self) {
        let _ = self.shutdown();
    }
}

fn current_thread_runtime() -> Result<tokio::runtime::Runtime, String> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("tokio runtime: {e}"))
}

fn grpc_server_thread(
    cpu: Option<usize>,
    addr_tx: mpsc::Sender<Result<SocketAddr, String>>,
    stop_rx: tokio::sync::oneshot::Receiver<()>,
) -> Result<(), String> {
    if let Some(id) = cpu {
        crate::pin_current_thread(id);
    }
    let rt = match current_thread_runtime() {
        Ok(rt) => rt,
        Err(e) => {
            let _ = addr_tx.send(Err(e.clone()));
            return Err(e);
        }
    };
    rt.block_on(async move {
        let bound = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .and_then(|l| Ok((l.local_addr()?, l)));
        let (addr, listener) = match bound {
            Ok(b) => b,
            Err(e) => {
                let e = format!("grpc server bind: {e}");
                let _ = addr_tx.send(Err(e.clone()));
                return Err(e);
            }
        };
        let incoming =
            tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true));
        let serving = tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(EchoServer::new(EchoService))
                .serve_with_incoming(incoming),
        );
        let _ = addr_tx.send(Ok(addr));
        // Either the stop signal or the sender's drop ends serving.
        let _ = stop_rx.await;
        if serving.is_finished() {
            match serving.await {
                Ok(Ok(())) => Ok(()),
                Ok(Err(e)) => Err(format!("grpc server: {e}")),
                Err(e) => Err(format!("grpc server task: {e}")),
            }
        } else {
            serving.abort();
            Ok(())
        }
    })
}

/// The tonic gRPC baseline: a unary echo call of `msg_size` bytes. The
/// server runs on a single-threaded tokio runtime in its own thread on
/// `127.0.0.1:0`; the client runs on another in its own thread and keeps
/// `in_flight` calls outstanding on one HTTP/2 connection (1 for latency).
/// Every call is recorded and its reply checked; system `grpc-unary`.
pub fn grpc_unary(
    msg_size: usize,
    duration: Duration,
    in_flight: usize,
    server_cpu: Option<usize>,
    client_cpu: Option<usize>,
) -> Result<BenchResult, String> {
    check_args(msg_size, duration, in_flight)?;
    let server = GrpcEchoServer::start(server_cpu)?;
    let addr = server.addr;
    let measured = crate::run_pinned(
        "grpc-unary-client",
        client_cpu,
        move || -> Result<Measured, String> {
            let rt = current_thread_runtime()?;
            rt.block_on(grpc_client(addr, msg_size, duration, in_flight))
        },
    )?;
    let served = server.stop();
    let m = measured?;
    served?;
    let s = LatencySummary::from_histogram(&m.hist, m.seconds);
    Ok(s.to_result(
        &rpc_case(msg_size, in_flight),
        "grpc-unary",
        m.hist.len(),
        m.seconds,
        m.wrong,
        params(msg_size, in_flight, server_cpu, client_cpu),
    ))
}

/// Connects a tonic client to `addr` (plain HTTP/2, `TCP_NODELAY`).
pub async fn grpc_connect(
    addr: SocketAddr,
) -> Result<EchoClient<tonic::transport::Channel>, String> {
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .map_err(|e| format!("grpc endpoint: {e}"))?
        .tcp_nodelay(true)
        .connect_timeout(IO_TIMEOUT)
        .connect()
        .await
        .map_err(|e| format!("grpc connect to {addr}: {e}"))?;
    Ok(EchoClient::new(channel))
}

async fn grpc_client(
    addr: SocketAddr,
    msg_size: usize,
    duration: Duration,
    in_flight: usize,
) -> Result<Measured, String> {
    let client = grpc_connect(addr).await?;
    grpc_phase(&client, msg_size, WARMUP, in_flight).await?;
    grpc_phase(&client, msg_size, duration, in_flight).await
}

/// Runs `in_flight` tasks, each calling in a loop until `span` has passed.
async fn grpc_phase(
    client: &EchoClient<tonic::transport::Channel>,
    msg_size: usize,
    span: Duration,
    in_flight: usize,
) -> Result<Measured, String> {
    let start = Instant::now();
    let deadline = start + span;
    let mut tasks = tokio::task::JoinSet::new();
    for worker in 0..in_flight {
        let mut c = client.clone();
        tasks.spawn(async move {
            let mut hist = latency_histogram()?;
            let mut wrong = 0u64;
            let mut expected = pattern(msg_size);
            // Distinct sequence numbers across workers.
            let mut seq = (worker as u64) << 40;
            while Instant::now() < deadline {
                seq += 1;
                stamp(&mut expected, seq);
                let req = Msg {
                    payload: expected.clone(),
                };
                let t0 = Instant::now();
                let resp = c.call(req).await.map_err(|e| format!("grpc call: {e}"))?;
                hist.saturating_record(t0.elapsed().as_nanos() as u64);
                if resp.into_inner().payload != expected {
                    wrong += 1;
                }
            }
            Ok::<_, String>((hist, wrong))
        });
    }
    let collect = async {
        let mut hist = latency_histogram()?;
        let mut wrong = 0u64;
        while let Some(joined) = tasks.join_next().await {
            let (h, w) = joined.map_err(|e| format!("grpc client task: {e}"))??;
            hist.add(&h).map_err(|e| e.to_string())?;
            wrong += w;
        }
        Ok::<_, String>((hist, wrong))
    };
    let (hist, wrong) = tokio::time::timeout(span + IO_TIMEOUT, collect)
        .await
        .map_err(|_| format!("grpc calls did not finish within {IO_TIMEOUT:?} of the end"))??;
    Ok(Measured {
        hist,
        seconds: start.elapsed().as_secs_f64(),
        wrong,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// How long each baseline runs in tests.
    const TEST_RUN: Duration = Duration::from_millis(200);

    fn check_sane(r: &BenchResult, system: &str) {
        assert_eq!(r.bench, "rpc");
        assert_eq!(r.system, system);
        assert!(r.ops_per_s > 0.0, "{r:?}");
        assert!(r.ops > 0, "{r:?}");
        assert_eq!(r.wrong_values, 0, "{r:?}");
        let s = LatencySummary::from_result(r).expect("fast_us and ave_us in params");
        assert!(s.fast_us > 0.0, "{s:?}");
        assert!(s.fast_us <= s.p50_us, "{s:?}");
        assert!(s.p50_us <= s.p99_us, "{s:?}");
        assert!(s.fast_us <= s.ave_us, "{s:?}");
        assert_eq!(s.row(system).len(), RPC_TABLE_HEADER.len());
    }

    #[test]
    fn tcp_pingpong_measures_round_trips() {
        let r = tcp_pingpong(64, TEST_RUN, None, None, false).expect("tcp ping-pong runs");
        assert_eq!(r.case, "latency 64B");
        check_sane(&r, "tcp-pingpong");
        let r = tcp_pingpong(64, TEST_RUN, None, None, true).expect("spinning ping-pong runs");
        check_sane(&r, "tcp-pingpong-spin");
    }

    #[test]
    fn grpc_unary_measures_calls() {
        let r = grpc_unary(64, TEST_RUN, 1, None, None).expect("grpc runs");
        assert_eq!(r.case, "latency 64B");
        check_sane(&r, "grpc-unary");
        let r = grpc_unary(64, TEST_RUN, 4, None, None).expect("grpc runs with 4 in flight");
        assert_eq!(r.case, "throughput 64B x4");
        check_sane(&r, "grpc-unary");
    }

    #[test]
    fn grpc_echoes_the_payload() {
        let server = GrpcEchoServer::start(None).expect("server starts");
        let rt = current_thread_runtime().expect("runtime");
        let payload: Vec<u8> = (0..1000u32).map(|i| (i * 7 % 256) as u8).collect();
        let got = rt
            .block_on(async {
                let mut c = grpc_connect(server.addr).await?;
                let resp = c
                    .call(Msg {
                        payload: payload.clone(),
                    })
                    .await
                    .map_err(|e| e.to_string())?;
                Ok::<_, String>(resp.into_inner())
            })
            .expect("call succeeds");
        assert_eq!(
            got,
            Msg {
                payload: payload.clone()
            }
        );
        server.stop().expect("server stops cleanly");
    }

    #[test]
    fn refuses_out_of_bounds_arguments() {
        let d = Duration::from_millis(10);
        assert!(tcp_pingpong(0, d, None, None, false).is_err());
        assert!(tcp_pingpong(MAX_MSG_SIZE_BYTES + 1, d, None, None, false).is_err());
        assert!(tcp_pingpong(64, Duration::ZERO, None, None, false).is_err());
        assert!(grpc_unary(64, d, 0, None, None).is_err());
        assert!(grpc_unary(64, d, MAX_IN_FLIGHT + 1, None, None).is_err());
    }

    #[test]
    fn summary_of_a_known_histogram() {
        let mut h = latency_histogram().expect("histogram");
        for ns in [1_000u64, 2_000, 3_000, 4_000] {
            h.record(ns).expect("in range");
        }
        let s = LatencySummary::from_histogram(&h, 2.0);
        assert_eq!(s.ops_per_s, 2.0);
        assert!((s.fast_us - 1.0).abs() < 0.01, "{s:?}");
        assert!((s.ave_us - 2.5).abs() < 0.01, "{s:?}");
        assert!((s.p50_us - 2.0).abs() < 0.01, "{s:?}");
        assert!((s.p99_us - 4.0).abs() < 0.01, "{s:?}");
        let empty = LatencySummary::from_histogram(&latency_histogram().expect("h"), 1.0);
        assert_eq!(empty.ops_per_s, 0.0);
        let r = s.to_result("latency 64B", "x", 4, 2.0, 0, serde_json::json!({"a": 1}));
        assert_eq!(r.params["a"], 1);
        assert_eq!(LatencySummary::from_result(&r), Some(s));
        assert_eq!(
            s.row("client"),
            ["client", "2", "1.00us", "2.50us", "2.00us", "4.00us"]
        );
    }
}
