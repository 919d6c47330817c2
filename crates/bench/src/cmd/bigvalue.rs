//! `fabrickv bench bigvalue`: GET (and SET) of one large value (16 MiB by
//! default, LMCache's chunk size) over RESP, beside the same bytes over a
//! raw TCP stream, the native kv protocol and redis-server, in the same run.
//!
//! - **fabrickv**: `fabrickv serve --resp` (this binary, a child process,
//!   under `taskset` with `--server-cpus`); its GET writes the value from
//!   the store's own buffer, its SET reads the socket into the value's
//!   final buffer;
//! - **fabrickv-tcp**: the same server's native kv listener over tcp, with
//!   the Rust client (`Kv::get`/`put`): the value travels as PUT_CHUNK /
//!   GET_CHUNK pieces of 1 MiB streamed back to back, the GET's landing
//!   in the client's `MgetBuf`, kept between requests;
//! - **raw-tcp**: a thread of this process that, per request byte, writes
//!   the value with one `write_all` (GET) or reads it into a buffer and
//!   answers one byte (SET): the ceiling of one loopback stream;
//! - **redis**: redis-server 7 with persistence off.
//!
//! One client connection per system, one request at a time, the systems
//! taking turns within each round so a noisy machine's drift falls on all
//! alike. Every GET's bytes are compared with the value (outside the timed
//! part). Printed as a table (GB/s, p50, p99, ratios against raw TCP and
//! Redis) and one JSON line per result.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use clap::Args;

use crate::peers::{self, Child};
use crate::report::{print_table, BenchResult};

#[derive(Args)]
pub struct BigValueArgs {
    /// Value size, e.g. 16MB (at most 512MB).
    #[arg(long, default_value = "16MB")]
    value_size: String,
    /// Timed requests per system and operation in each round.
    #[arg(long, default_value_t = 20)]
    requests: usize,
    /// Rounds; the systems take turns within each.
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// Operations: get, set, or get,set.
    #[arg(long, default_value = "get,set")]
    ops: String,
    /// Leave redis-server out.
    #[arg(long)]
    no_redis: bool,
    /// CPUs of the servers (fabrickv, redis-server, the raw TCP thread is
    /// not pinned), taskset syntax.
    #[arg(long)]
    server_cpus: Option<String>,
    /// Print one JSON object per result as well.
    #[arg(long)]
    json: bool,
}

/// How long one request may take before the run fails.
const IO_TIMEOUT: Duration = Duration::from_secs(60);

/// Largest value this benchmark moves, in bytes (Redis's bulk limit).
const VALUE_BYTES_MAX: usize = 512 << 20;

/// The systems measured, in the order of the table.
const SYSTEMS: [&str; 4] = ["raw-tcp", "fabrickv", "fabrickv-tcp", "redis"];

/// One system's connection: a byte stream (raw TCP, RESP) or the native
/// kv client over tcp (values over 1 MiB travel as PUT_CHUNK / GET_CHUNK),
/// which reads into its own buffer, kept between requests as the
/// streams' `buf` is.
enum Sys {
    Stream(Conn),
    Native(Box<fabrickv_client::Client>, fabrickv_client::MgetBuf),
}

impl Sys {
    fn get(&mut self, buf: &mut [u8]) -> Result<(), String> {
        match self {
            Sys::Stream(c) => c.get(buf),
            Sys::Native(c, got) => {
                fabrickv_client::Kv::mget_into(&mut **c, &[b"chunk"], got)
                    .map_err(|e| e.to_string())?;
                match got.iter().next().flatten() {
                    Some(v) if v.len() == buf.len() => Ok(()),
                    Some(v) => Err(format!("GET read {} bytes", v.len())),
                    None => Err("GET found nothing".into()),
                }
            }
        }
    }

    /// The bytes the last GET read: `buf` for a stream, the client's own
    /// buffer for the native client.
    fn got<'a>(&'a self, buf: &'a [u8]) -> &'a [u8] {
        match self {
            Sys::Stream(_) => buf,
            Sys::Native(_, got) => got.iter().next().flatten().unwrap_or_default(),
        }
    }

    fn set(&mut self, value: &[u8]) -> Result<(), String> {
        match self {
            Sys::Stream(c) => c.set(value),
            Sys::Native(c, _) => {
                fabrickv_client::Kv::put(&mut **c, b"chunk", value).map_err(|e| e.to_string())
            }
        }
    }
}

/// A value of `len` bytes whose bytes depend on their position.
fn value_of(len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| ((i as u32).wrapping_mul(2_654_435_761) >> 24) as u8)
        .collect()
}

/// The raw TCP peer: one thread, one connection at a time.
struct RawServer {
    port: u16,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl RawServer {
    fn start(value: Arc<Vec<u8>>) -> Result<RawServer, String> {
        let l = TcpListener::bind("127.0.0.1:0").map_err(|e| e.to_string())?;
        let port = l.local_addr().map_err(|e| e.to_string())?.port();
        let stop = Arc::new(AtomicBool::new(false));
        let done = stop.clone();
        let thread = std::thread::Builder::new()
            .name("bigvalue-raw".into())
            .spawn(move || {
                let mut sink = vec![0u8; value.len()];
                for s in l.incoming() {
                    if done.load(Ordering::Acquire) {
                        return;
                    }
                    let Ok(mut s) = s else { continue };
                    let _ = s.set_nodelay(true);
                    let mut op = [0u8; 1];
                    while s.read_exact(&mut op).is_ok() {
                        let ok = match op[0] {
                            b'G' => s.write_all(&value).is_ok(),
                            b'S' => s.read_exact(&mut sink).is_ok() && s.write_all(b"+").is_ok(),
                            _ => false,
                        };
                        if !ok {
                            break;
                        }
                    }
                }
            })
            .map_err(|e| e.to_string())?;
        Ok(RawServer {
            port,
            stop,
            thread: Some(thread),
        })
    }
}

impl Drop for RawServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        let _ = TcpStream::connect(("127.0.0.1", self.port));
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// One client connection to a system.
struct Conn {
    w: TcpStream,
    r: BufReader<TcpStream>,
    raw: bool,
}

impl Conn {
    fn connect(port: u16, raw: bool) -> Result<Conn, String> {
        let w = TcpStream::connect(("127.0.0.1", port)).map_err(|e| e.to_string())?;
        w.set_nodelay(true).map_err(|e| e.to_string())?;
        w.set_read_timeout(Some(IO_TIMEOUT))
            .map_err(|e| e.to_string())?;
        let r = BufReader::with_capacity(64 << 10, w.try_clone().map_err(|e| e.to_string())?);
        Ok(Conn { w, r, raw })
    }

    fn line(&mut self) -> Result<Vec<u8>, String> {
        let mut l = Vec::new();
        self.r
            .read_until(b'\n', &mut l)
            .map_err(|e| e.to_string())?;
        Ok(l)
    }

    /// GET of the value into `buf` (its exact length).
    fn get(&mut self, buf: &mut [u8]) -> Result<(), String> {
        let e = |e: std::io::Error| e.to_string();
        if self.raw {
            self.w.write_all(b"G").map_err(e)?;
            return self.r.read_exact(buf).map_err(e);
        }
        self.w
            .write_all(b"*2\r\n$3\r\nGET\r\n$5\r\nchunk\r\n")
            .map_err(e)?;
        let head = self.line()?;
        if head != format!("${}\r\n", buf.len()).as_bytes() {
            return Err(format!("GET answered {:?}", String::from_utf8_lossy(&head)));
        }
        self.r.read_exact(buf).map_err(e)?;
        let mut crlf = [0u8; 2];
        self.r.read_exact(&mut crlf).map_err(e)
    }

    /// SET of `value`.
    fn set(&mut self, value: &[u8]) -> Result<(), String> {
        let e = |e: std::io::Error| e.to_string();
        if self.raw {
            self.w.write_all(b"S").map_err(e)?;
            self.w.write_all(value).map_err(e)?;
            let mut ack = [0u8; 1];
            return self.r.read_exact(&mut ack).map_err(e);
        }
        let head = format!("*3\r\n$3\r\nSET\r\n$5\r\nchunk\r\n${}\r\n", value.len());
        self.w.write_all(head.as_bytes()).map_err(e)?;
        self.w.write_all(value).map_err(e)?;
        self.w.write_all(b"\r\n").map_err(e)?;
        let reply = self.line()?;
        if reply != b"+OK\r\n" {
            return Err(format!(
                "SET answered {:?}",
                String::from_utf8_lossy(&reply)
            ));
        }
        Ok(())
    }
}

/// Timings of one system and operation, in seconds per request.
#[derive(Default)]
struct Samples(Vec<f64>);

impl Samples {
    fn quantile(&self, q: f64) -> f64 {
        let mut v = self.0.clone();
        v.sort_by(f64::total_cmp);
        v.get(((v.len() as f64 - 1.0) * q).round() as usize)
            .copied()
            .unwrap_or(0.0)
    }

    fn total(&self) -> f64 {
        self.0.iter().sum()
    }
}

/// Runs the benchmark and prints its table and JSON lines.
pub fn run(a: BigValueArgs) -> Result<(), String> {
    let len = fabrickv_types::size::parse_size(&a.value_size).map_err(|e| e.to_string())? as usize;
    if len == 0 || len > VALUE_BYTES_MAX {
        return Err(format!("--value-size must be 1 to {VALUE_BYTES_MAX} bytes"));
    }
    let ops: Vec<&str> = a.ops.split(',').map(str::trim).collect();
    if ops.iter().any(|o| !matches!(*o, "get" | "set")) {
        return Err("--ops takes get, set or both".into());
    }
    let value = Arc::new(value_of(len));
    let raw = RawServer::start(value.clone())?;
    let cpus = a.server_cpus.as_deref();
    let fkv_port = peers::free_port()?;
    let native_port = peers::free_port()?;
    let native_addr = format!("tcp://127.0.0.1:{native_port}");
    let mut cmd = peers::fabrickv_serve(cpus, &native_addr, 1)?;
    let memory = format!("{}", 64 << 20);
    let large = format!("{}", 2 * len + (64 << 20));
    cmd.args(["--resp", &format!("127.0.0.1:{fkv_port}")]);
    cmd.args(["--memory", &memory, "--large-memory", &large]);
    cmd.args(["--log-level", "warn", "--grpc", "off"]);
    let fkv: Child = peers::spawn_server(cmd, "fabrickv", fkv_port)?;
    let redis = if a.no_redis {
        None
    } else {
        Some(peers::spawn_redis(cpus)?)
    };
    let native = fabrickv_client::Client::connect_with_timeout(&native_addr, IO_TIMEOUT)
        .map_err(|e| format!("connecting to {native_addr}: {e}"))?;
    let mut systems: Vec<(&str, Sys)> = vec![
        ("raw-tcp", Sys::Stream(Conn::connect(raw.port, true)?)),
        ("fabrickv", Sys::Stream(Conn::connect(fkv_port, false)?)),
        (
            "fabrickv-tcp",
            Sys::Native(Box::new(native), fabrickv_client::MgetBuf::new()),
        ),
    ];
    if let Some((_, port)) = &redis {
        systems.push(("redis", Sys::Stream(Conn::connect(*port, false)?)));
    }
    // Store the value once (also a warm-up of each path).
    let mut buf = vec![0u8; len];
    for (name, c) in systems.iter_mut() {
        c.set(&value).map_err(|e| format!("{name}: {e}"))?;
        c.get(&mut buf).map_err(|e| format!("{name}: {e}"))?;
        if c.got(&buf) != &value[..] {
            return Err(format!("{name}: GET read other bytes"));
        }
    }
    let mut samples: Vec<Vec<Samples>> = ops
        .iter()
        .map(|_| systems.iter().map(|_| Samples::default()).collect())
        .collect();
    for _ in 0..a.rounds {
        for (oi, op) in ops.iter().enumerate() {
            for (si, (name, c)) in systems.iter_mut().enumerate() {
                for _ in 0..a.requests {
                    buf.fill(0);
                    let t = Instant::now();
                    match *op {
                        "get" => c.get(&mut buf),
                        _ => c.set(&value),
                    }
                    .map_err(|e| format!("{name} {op}: {e}"))?;
                    samples[oi][si].0.push(t.elapsed().as_secs_f64());
                    if *op == "get" && c.got(&buf) != &value[..] {
                        return Err(format!("{name}: GET read other bytes"));
                    }
                }
            }
        }
    }
    drop(systems);
    drop(fkv);
    drop(redis);
    drop(raw);

    let mut results = Vec::new();
    for (oi, op) in ops.iter().enumerate() {
        let s = &samples[oi];
        let rate = |i: usize| -> f64 {
            let t = s[i].total();
            if t > 0.0 {
                (s[i].0.len() * len) as f64 / t
            } else {
                0.0
            }
        };
        let names: Vec<&str> = SYSTEMS
            .iter()
            .copied()
            .filter(|n| *n != "redis" || !a.no_redis)
            .collect();
        let raw_rate = rate(0);
        let redis_rate = names.iter().position(|n| *n == "redis").map(rate);
        for (i, name) in names.iter().enumerate() {
            let bps = rate(i);
            let n = s[i].0.len();
            let vs_raw = if raw_rate > 0.0 { bps / raw_rate } else { 0.0 };
            let vs_redis = redis_rate.map(|rr| if rr > 0.0 { bps / rr } else { 0.0 });
            let r = BenchResult {
                bench: "bigvalue".into(),
                case: format!("{op} {}", fabrickv_types::size::format_size(len as u64)),
                system: (*name).into(),
                ops_per_s: if s[i].total() > 0.0 {
                    n as f64 / s[i].total()
                } else {
                    0.0
                },
                p50_us: s[i].quantile(0.5) * 1e6,
                p99_us: s[i].quantile(0.99) * 1e6,
                ops: n as u64,
                seconds: s[i].total(),
                wrong_values: 0,
                params: serde_json::json!({
                    "value_bytes": len,
                    "gb_per_s": bps / 1e9,
                    "vs_raw_tcp": vs_raw,
                    "vs_redis": vs_redis,
                    "rounds": a.rounds,
                    "server_cpus": a.server_cpus,
                }),
            };
            results.push(r);
        }
    }
    let rows: Vec<Vec<String>> = results
        .iter()
        .map(|r| {
            let p = |k: &str| r.params.get(k).and_then(|v| v.as_f64());
            vec![
                r.case.clone(),
                r.system.clone(),
                format!("{:.2}", p("gb_per_s").unwrap_or(0.0)),
                format!("{:.2}", r.p50_us / 1e3),
                format!("{:.2}", r.p99_us / 1e3),
                format!("{:.2}x", p("vs_raw_tcp").unwrap_or(0.0)),
                p("vs_redis").map_or("-".into(), |v| format!("{v:.2}x")),
            ]
        })
        .collect();
    print_table(
        &[
            "case",
            "system",
            "GB/s",
            "p50 ms",
            "p99 ms",
            "vs raw TCP",
            "vs Redis",
        ],
        &rows,
    );
    if a.json {
        for r in &results {
            println!("{}", r.json());
        }
    }
    Ok(())
}
