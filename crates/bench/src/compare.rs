//! `fabrickv bench compare`: FabricKV beside redis-server and memcached,
//! same machine, same run, same pinning.
//!
//! Every server is a child process pinned to the server CPU and every load
//! generator runs on the client CPU. Each system gets the same workloads:
//! GET and SET of 16-byte keys (`key:` and 12 digits, redis-benchmark's
//! `-r` keys) with fixed-size values at several pipeline depths, and
//! multi-gets of several sizes. Throughput, latency and the server
//! process's CPU time (user + system, from `/proc`) are recorded, so the
//! table can say both how fast and how cheaply each system served.
//!
//! Who drives what: redis-benchmark loads every RESP server (Redis and
//! FabricKV's RESP front-end) with the same arguments; memcached is loaded
//! by FabricKV's memcached text-protocol generator ([`crate::memcache`]),
//! and so is FabricKV's memcache front end (`--memcache`), so that the two
//! meet the same load;
//! FabricKV's native protocol (tcp, shm) by its own generator
//! ([`crate::kv`]), a pipeline depth P being frames of P operations. Before
//! measuring, every key is stored and read back through each server's own
//! protocol, so GETs hit and values are the right size.
//!
//! The SCAN row (RESP servers only) walks the preloaded keyspace with
//! SCAN at one COUNT, from cursor 0 until the cursor comes back 0, on one
//! connection, right after the preload (so the keyspace is exactly the
//! preloaded keys), again and again for the case's duration: it reports
//! the calls one full iteration takes and the median iteration's time,
//! and counts a preloaded key the iteration did not return as a wrong
//! value (SCAN guarantees every key present throughout).

use std::collections::HashSet;
use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use fabrickv_client::Client;

use crate::cpu::CpuMeter;
use crate::keys::{check_value, fill_value};
use crate::kv::{self, KvOpts};
use crate::load::Shape;
use crate::memcache::{self, key_of, McOp, McOpts};
use crate::paced::{self, PacedOpts};
use crate::peers::{self, free_port, pinned, spawn_server, spawn_until, Child};
use crate::report::{print_table, BenchResult};

/// Keys per MSET when preloading a RESP server.
const RESP_PRELOAD_KEYS_PER_MSET: u64 = 100;

/// MSET commands in flight while preloading a RESP server.
const RESP_PRELOAD_PIPELINE: usize = 32;

/// Requests of the calibration run that sizes each redis-benchmark run to
/// the asked duration (redis-benchmark counts requests, not seconds).
const CALIBRATION_REQUESTS: u64 = 20_000;

/// Largest request count given to redis-benchmark.
const REDIS_BENCHMARK_REQUESTS_MAX: u64 = 500_000_000;

/// The paced case has its own generator and runs on RESP servers only.
const PACED_ONLY_RESP: &str = "the paced case runs on RESP servers, with its own generator";

/// The SCAN case has its own client and runs on RESP servers only.
const SCAN_ONLY_RESP: &str = "the SCAN case runs on RESP servers, with its own client";

/// Most SCAN calls one iteration may take before the case fails (a
/// server whose cursor never comes back to 0).
const SCAN_CALLS_PER_ITERATION_MAX: u64 = 100_000_000;

/// A system under comparison.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum System {
    /// redis-server, loaded by redis-benchmark.
    Redis,
    /// memcached (one worker thread), loaded by FabricKV's memcached generator.
    Memcached,
    /// FabricKV's RESP front-end, loaded by redis-benchmark.
    FabricResp,
    /// FabricKV's memcache front end, loaded by the memcached generator.
    FabricMemcache,
    /// FabricKV's native protocol over tcp.
    FabricTcp,
    /// FabricKV's native protocol over shared memory.
    FabricShm,
}

impl System {
    /// Every system, in table order.
    pub const ALL: [System; 6] = [
        System::Redis,
        System::Memcached,
        System::FabricResp,
        System::FabricMemcache,
        System::FabricTcp,
        System::FabricShm,
    ];

    /// The name used in tables, JSON and `--systems`.
    pub fn name(self) -> &'static str {
        match self {
            System::Redis => "redis",
            System::Memcached => "memcached",
            System::FabricResp => "fabrickv-resp",
            System::FabricMemcache => "fabrickv-memcache",
            System::FabricTcp => "fabrickv-tcp",
            System::FabricShm => "fabrickv-shm",
        }
    }

    /// Parses a name from `--systems`.
    pub fn parse(s: &str) -> Result<System, String> {
        System::ALL
            .into_iter()
            .find(|x| x.name() == s)
            .ok_or_else(|| {
                format!(
                    "unknown system {s:?}: expected one of {}",
                    System::ALL.map(System::name).join(", ")
                )
            })
    }
}

/// A workload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Workload {
    /// GETs, this many outstanding per connection.
    Get(usize),
    /// SETs, this many outstanding per connection.
    Set(usize),
    /// Multi-gets of this many keys, one outstanding per connection.
    Mget(usize),
    /// GETs offered at a fixed rate (per second) that leaves the server
    /// partly idle: its CPU per operation when not saturated
    /// ([`crate::paced`]).
    Paced(u64),
    /// Full SCAN iterations of the keyspace at this COUNT (RESP servers).
    Scan(usize),
}

impl Workload {
    /// The name used in tables and JSON.
    pub fn name(self) -> String {
        match self {
            Workload::Get(p) => format!("GET P{p}"),
            Workload::Set(p) => format!("SET P{p}"),
            Workload::Mget(n) => format!("MGET {n}"),
            Workload::Paced(_) => "GET paced".into(),
            Workload::Scan(c) => format!("SCAN COUNT {c}"),
        }
    }

    fn keys_per_request(self) -> usize {
        match self {
            Workload::Mget(n) => n,
            _ => 1,
        }
    }
}

/// What to compare.
#[derive(Debug, Clone)]
pub struct CompareOpts {
    /// Systems, in table order.
    pub systems: Vec<System>,
    /// CPU list every server is pinned to (taskset syntax).
    pub server_cpus: String,
    /// CPU every load generator is pinned to.
    pub client_cpu: usize,
    /// Distinct keys, all preloaded.
    pub keys: u64,
    /// Value size in bytes.
    pub value_size: usize,
    /// Pipeline depths for GET and SET.
    pub depths: Vec<usize>,
    /// Multi-get sizes.
    pub mget: Vec<usize>,
    /// Connections (redis-benchmark `-c`, memcached connections, native frames in flight).
    pub conns: usize,
    /// Measured time per case.
    pub duration: Duration,
    /// GETs per second of the paced case on RESP servers: `Some(0.0)`
    /// for half of Redis's GET P1 rate measured in the same run (or of
    /// the server's own when Redis is not run), `None` for no paced case.
    pub paced_rate: Option<f64>,
    /// COUNT of the SCAN case on RESP servers; `None` for no SCAN case.
    pub scan_count: Option<usize>,
}

impl CompareOpts {
    /// Every workload, in table order.
    pub fn workloads(&self) -> Vec<Workload> {
        let mut w: Vec<Workload> = self.depths.iter().map(|&p| Workload::Get(p)).collect();
        w.extend(self.depths.iter().map(|&p| Workload::Set(p)));
        w.extend(self.mget.iter().map(|&n| Workload::Mget(n)));
        w
    }
}

/// One measured cell of the comparison.
#[derive(Debug, Clone)]
pub struct Row {
    /// The workload.
    pub workload: Workload,
    /// The system.
    pub system: System,
    /// Throughput in keys per second, latencies, and the rest.
    pub result: BenchResult,
    /// CPU-seconds the server process used during the measured run.
    pub server_cpu_s: f64,
}

impl Row {
    /// Server CPU-seconds per million operations (keys).
    pub fn cpu_s_per_mop(&self) -> f64 {
        self.server_cpu_s / (self.result.ops as f64 / 1e6).max(1e-12)
    }

    /// Operations (keys) per server CPU-second.
    pub fn ops_per_cpu_s(&self) -> f64 {
        self.result.ops as f64 / self.server_cpu_s.max(1e-12)
    }
}

/// Runs every system on every workload.
pub fn run(opts: &CompareOpts) -> Result<Vec<Row>, String> {
    if opts.keys == 0 || opts.conns == 0 || opts.value_size == 0 {
        return Err("--keys, --conns and --value-size must be at least 1".into());
    }
    if opts.depths.contains(&0) || opts.mget.contains(&0) || opts.scan_count == Some(0) {
        return Err("pipeline depths and multi-get sizes must be at least 1".into());
    }
    crate::pin_current_thread(opts.client_cpu);
    let mut rows = Vec::new();
    for &system in &opts.systems {
        let mut r = match system {
            System::Redis => {
                let (server, port) = peers::spawn_redis(Some(&opts.server_cpus))?;
                resp_system(system, &server, port, opts, &rows)?
            }
            System::FabricResp => {
                let port = free_port()?;
                let mut cmd = fabrickv_command(opts)?;
                cmd.args(["--listen", "127.0.0.1:0", "--resp"])
                    .arg(format!("127.0.0.1:{port}"));
                let server = spawn_server(cmd, "fabrickv", port)?;
                resp_system(system, &server, port, opts, &rows)?
            }
            System::Memcached => {
                let (server, port) = peers::spawn_memcached(Some(&opts.server_cpus))?;
                memcache_system(System::Memcached, &server, port, opts)?
            }
            System::FabricMemcache => {
                let port = free_port()?;
                let mut cmd = fabrickv_command(opts)?;
                cmd.args(["--listen", "127.0.0.1:0", "--memcache"])
                    .arg(format!("127.0.0.1:{port}"));
                let server = spawn_server(cmd, "fabrickv", port)?;
                memcache_system(System::FabricMemcache, &server, port, opts)?
            }
            System::FabricTcp => {
                let addr = format!("127.0.0.1:{}", free_port()?);
                native_system(system, &addr, opts)?
            }
            System::FabricShm => {
                let addr = format!("shm://fkv-compare-{}", std::process::id());
                native_system(system, &addr, opts)?
            }
        };
        rows.append(&mut r);
    }
    Ok(rows)
}

fn fabrickv_command(opts: &CompareOpts) -> Result<std::process::Command, String> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let mut cmd = pinned(Some(&opts.server_cpus), &exe.to_string_lossy());
    // No gRPC: the default address may be another server's, and a taken
    // address is a start-up error.
    cmd.args([
        "serve",
        "--workers",
        "1",
        "--log-level",
        "warn",
        "--grpc",
        "off",
    ])
    .args(["--memory", &memory_for(opts).to_string()]);
    Ok(cmd)
}

/// Engine memory for the data set: twice its items, at least 32 MiB. The
/// engine sizes its index by its memory, so a pool far larger than the
/// data would spread the keys over a cold index.
fn memory_for(opts: &CompareOpts) -> u64 {
    let item = 16 + opts.value_size as u64 + 64;
    (opts.keys * item * 2).max(32 << 20)
}

/// Runs `f`, `workload` on `system`, metering the CPU of the server
/// process `pid`, and returns its row: every row of the run is a
/// `compare` result named by its workload and system, whichever client
/// measured it.
fn measure<F>(pid: u32, workload: Workload, system: System, f: F) -> Result<Row, String>
where
    F: FnOnce() -> Result<BenchResult, String>,
{
    let meter = CpuMeter::start(pid)?;
    let mut result = f()?;
    if let Some(share) = meter.kernel_share()? {
        result.params["server_kernel_share"] = share.into();
    }
    result.bench = "compare".into();
    result.case = workload.name();
    result.system = system.name().into();
    Ok(Row {
        workload,
        system,
        result,
        server_cpu_s: meter.elapsed_cpu_s()?,
    })
}

/// Every workload on one RESP server (`before`: the rows of the systems
/// measured earlier in the run, where the paced case finds Redis's rate).
fn resp_system(
    system: System,
    server: &Child,
    port: u16,
    opts: &CompareOpts,
    before: &[Row],
) -> Result<Vec<Row>, String> {
    resp_preload(port, opts.keys, opts.value_size)?;
    let mut rows = Vec::new();
    if let Some(count) = opts.scan_count {
        rows.push(measure(
            server.pid(),
            Workload::Scan(count),
            system,
            || scan_case(system, port, count, opts),
        )?);
    }
    for w in opts.workloads() {
        rows.push(redis_benchmark_case(system, server.pid(), port, w, opts)?);
    }
    if let Some(rate) = opts.paced_rate {
        let get_p1 = |rows: &[Row], s: System| {
            rows.iter()
                .find(|r| r.system == s && r.workload == Workload::Get(1))
                .map(|r| r.result.ops_per_s)
        };
        let rate = if rate > 0.0 {
            Some(rate)
        } else {
            get_p1(before, System::Redis)
                .or_else(|| get_p1(&rows, system))
                .map(|r| r / 2.0)
        };
        if let Some(rate) = rate {
            // The SET cases wrote redis-benchmark's values: store the
            // checkable ones again so every paced reply is checked.
            resp_preload(port, opts.keys, opts.value_size)?;
            let po = PacedOpts {
                port,
                rate,
                keys: opts.keys,
                value_size: opts.value_size,
                duration: opts.duration,
            };
            let mut row = measure(server.pid(), Workload::Paced(rate as u64), system, || {
                paced::run(&po)
            })?;
            row.result.params["server_busy"] =
                (row.server_cpu_s / row.result.seconds.max(1e-9)).into();
            rows.push(row);
        }
    }
    Ok(rows)
}

fn redis_benchmark_case(
    system: System,
    pid: u32,
    port: u16,
    w: Workload,
    opts: &CompareOpts,
) -> Result<Row, String> {
    let mut args: Vec<String> = vec![
        "-c".into(),
        opts.conns.to_string(),
        "-r".into(),
        opts.keys.to_string(),
        "-d".into(),
        opts.value_size.to_string(),
    ];
    match w {
        Workload::Get(p) => args.extend(["-t".into(), "get".into(), "-P".into(), p.to_string()]),
        Workload::Set(p) => args.extend(["-t".into(), "set".into(), "-P".into(), p.to_string()]),
        Workload::Mget(n) => {
            args.extend(["-P".into(), "1".into(), "MGET".into()]);
            args.extend((0..n).map(|_| "key:__rand_int__".to_string()));
        }
        Workload::Paced(_) => return Err(PACED_ONLY_RESP.into()),
        Workload::Scan(_) => return Err(SCAN_ONLY_RESP.into()),
    }
    let cpu = opts.client_cpu.to_string();
    let with_n = |n: u64| {
        let mut a = vec!["-n".to_string(), n.to_string()];
        a.extend(args.iter().cloned());
        a
    };
    // Size the run to the asked duration from a short calibration run.
    let t = Instant::now();
    peers::redis_benchmark(Some(&cpu), port, &with_n(CALIBRATION_REQUESTS))?;
    let per_s = CALIBRATION_REQUESTS as f64 / t.elapsed().as_secs_f64().max(1e-6);
    let n = ((per_s * opts.duration.as_secs_f64()) as u64)
        .clamp(CALIBRATION_REQUESTS, REDIS_BENCHMARK_REQUESTS_MAX);
    let full = with_n(n);
    measure(pid, w, system, || {
        let t = Instant::now();
        let rows = peers::redis_benchmark(Some(&cpu), port, &full)?;
        let seconds = t.elapsed().as_secs_f64();
        let row = rows.first().ok_or("redis-benchmark printed no result")?;
        let kpr = w.keys_per_request() as f64;
        Ok(BenchResult {
            bench: "compare".into(),
            case: w.name(),
            system: system.name().into(),
            ops_per_s: row.rps * kpr,
            p50_us: row.p50_us,
            p99_us: row.p99_us,
            ops: n * w.keys_per_request() as u64,
            seconds,
            wrong_values: 0,
            params: serde_json::json!({
                "tool": "redis-benchmark", "requests_per_s": row.rps,
                "args": full.join(" "), "latency": "per pipeline batch (redis-benchmark)",
            }),
        })
    })
}

/// Full SCAN iterations at COUNT `count` over the preloaded keyspace (see
/// the module header): `ops` counts the keys returned, `seconds` the
/// whole case; `params` holds the calls of one iteration and the median
/// iteration's time.
fn scan_case(
    system: System,
    port: u16,
    count: usize,
    opts: &CompareOpts,
) -> Result<BenchResult, String> {
    let (mut w, mut r) = resp_connect(port)?;
    let count_arg = count.to_string();
    let mut times = Vec::new();
    let (mut returned, mut missing) = (0u64, 0u64);
    // The calls of the last iteration (every iteration takes as many).
    let mut calls: u64;
    let started = Instant::now();
    loop {
        let t = Instant::now();
        let mut seen: HashSet<Vec<u8>> = HashSet::new();
        let mut cursor = b"0".to_vec();
        let mut n_calls = 0u64;
        loop {
            let mut cmd = b"*4\r\n$4\r\nSCAN\r\n".to_vec();
            for a in [&cursor[..], b"COUNT", count_arg.as_bytes()] {
                cmd.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
                cmd.extend_from_slice(a);
                cmd.extend_from_slice(b"\r\n");
            }
            w.write_all(&cmd).map_err(|e| e.to_string())?;
            n_calls += 1;
            if read_line(&mut r)? != b"*2" {
                return Err("SCAN answered something other than a pair".into());
            }
            cursor = read_bulk(&mut r)?.ok_or("SCAN answered a null cursor")?;
            let head = read_line(&mut r)?;
            let n: usize = head
                .strip_prefix(b"*")
                .and_then(|d| std::str::from_utf8(d).ok())
                .and_then(|d| d.parse().ok())
                .ok_or_else(|| format!("bad SCAN keys {}", String::from_utf8_lossy(&head)))?;
            for _ in 0..n {
                seen.insert(read_bulk(&mut r)?.ok_or("SCAN answered a null key")?);
                returned += 1;
            }
            if cursor == b"0" {
                break;
            }
            if n_calls >= SCAN_CALLS_PER_ITERATION_MAX {
                return Err(format!("SCAN took over {n_calls} calls"));
            }
        }
        times.push(t.elapsed().as_secs_f64());
        calls = n_calls;
        let mut key = Vec::new();
        missing += (0..opts.keys)
            .filter(|&i| {
                key_of(i, &mut key);
                !seen.contains(&key)
            })
            .count() as u64;
        if started.elapsed() >= opts.duration {
            break;
        }
    }
    let seconds = started.elapsed().as_secs_f64();
    times.sort_by(f64::total_cmp);
    let iteration_s = times[times.len() / 2];
    let per_call_us = iteration_s * 1e6 / calls.max(1) as f64;
    Ok(BenchResult {
        bench: "compare".into(),
        case: Workload::Scan(count).name(),
        system: system.name().into(),
        ops_per_s: returned as f64 / seconds.max(1e-9),
        p50_us: per_call_us,
        p99_us: times[times.len() - 1] * 1e6 / calls.max(1) as f64,
        ops: returned,
        seconds,
        wrong_values: missing,
        params: serde_json::json!({
            "tool": "fabrickv bench compare (SCAN client)", "count": count,
            "keys": opts.keys, "calls": calls, "iterations": times.len(),
            "iteration_s": iteration_s,
            "latency": "per SCAN call: p50 of the median iteration, p99 of the slowest",
        }),
    })
}

/// Loads a memcached-protocol server (memcached itself, or FabricKV's
/// memcache front end) with the memcached generator.
fn memcache_system(
    system: System,
    server: &Child,
    port: u16,
    opts: &CompareOpts,
) -> Result<Vec<Row>, String> {
    let addr = format!("127.0.0.1:{port}");
    memcache::preload(&addr, opts.keys, opts.value_size)?;
    let mut rows = Vec::new();
    for w in opts.workloads() {
        let (op, pipeline) = match w {
            Workload::Get(p) => (McOp::Get, p),
            Workload::Set(p) => (McOp::Set, p),
            Workload::Mget(n) => (McOp::MultiGet(n), 1),
            Workload::Paced(_) => return Err(PACED_ONLY_RESP.into()),
            Workload::Scan(_) => return Err(SCAN_ONLY_RESP.into()),
        };
        let mo = McOpts {
            addr: addr.clone(),
            op,
            conns: opts.conns,
            pipeline,
            keys: opts.keys,
            value_size: opts.value_size,
            duration: opts.duration,
            client_cpu: Some(opts.client_cpu),
        };
        let mut row = measure(server.pid(), w, system, || memcache::run(&mo))?;
        row.result.params["latency"] = "per request".into();
        rows.push(row);
    }
    Ok(rows)
}

fn native_system(system: System, addr: &str, opts: &CompareOpts) -> Result<Vec<Row>, String> {
    let mut cmd = fabrickv_command(opts)?;
    cmd.args(["--listen", addr]);
    let ready = || Client::connect_with_timeout(addr, Duration::from_secs(1)).is_ok();
    let server = spawn_until(cmd, "fabrickv", ready)?;
    let base = KvOpts {
        server: Some(addr.to_string()),
        server_workers: 1,
        threads: 1,
        keys: opts.keys,
        shape: Shape {
            batch: 1,
            in_flight: opts.conns,
            get_percent: 100,
            key_size: 16,
            value_size: opts.value_size,
        },
        duration: opts.duration,
        client_cpus: vec![opts.client_cpu],
        preload: false,
    };
    let mut client = Client::connect(addr).map_err(|e| format!("connecting to {addr}: {e}"))?;
    kv::preload(&mut client, &base)?;
    drop(client);
    let mut rows = Vec::new();
    for w in opts.workloads() {
        let (batch, get_percent) = match w {
            Workload::Get(p) => (p, 100),
            Workload::Set(p) => (p, 0),
            Workload::Mget(n) => (n, 100),
            Workload::Paced(_) => return Err(PACED_ONLY_RESP.into()),
            Workload::Scan(_) => return Err(SCAN_ONLY_RESP.into()),
        };
        let o = KvOpts {
            shape: Shape {
                batch,
                get_percent,
                ..base.shape
            },
            ..base.clone()
        };
        let mut row = measure(server.pid(), w, system, || kv::run(&o))?;
        row.result.params["latency"] = "per frame of P operations".into();
        rows.push(row);
    }
    Ok(rows)
}

/// One RESP connection to the server on loopback `port`, as the preload
/// and the SCAN case use it: no Nagle, a read timeout so a silent server
/// fails the run, and the write half beside a buffered read half.
fn resp_connect(port: u16) -> Result<(TcpStream, BufReader<TcpStream>), String> {
    let stream = TcpStream::connect(("127.0.0.1", port)).map_err(|e| e.to_string())?;
    stream.set_nodelay(true).map_err(|e| e.to_string())?;
    stream
        .set_read_timeout(Some(memcache::REPLY_TIMEOUT))
        .map_err(|e| e.to_string())?;
    let w = stream.try_clone().map_err(|e| e.to_string())?;
    Ok((w, BufReader::new(stream)))
}

/// Stores keys `0..keys` (`key:%012d`, values of `fill_value`) with
/// pipelined MSETs, then reads every one back with MGET and checks it.
pub fn resp_preload(port: u16, keys: u64, value_size: usize) -> Result<(), String> {
    let (mut w, mut r) = resp_connect(port)?;
    let chunks: Vec<(u64, u64)> = (0..keys)
        .step_by(RESP_PRELOAD_KEYS_PER_MSET as usize)
        .map(|a| (a, (a + RESP_PRELOAD_KEYS_PER_MSET).min(keys)))
        .collect();
    let mut key = Vec::new();
    let mut value = vec![0u8; value_size];
    for group in chunks.chunks(RESP_PRELOAD_PIPELINE) {
        let mut buf = Vec::new();
        for &(a, b) in group {
            let n = (b - a) as usize;
            buf.extend_from_slice(format!("*{}\r\n$4\r\nMSET\r\n", 1 + 2 * n).as_bytes());
            for i in a..b {
                key_of(i, &mut key);
                fill_value(i, &mut value);
                for part in [&key[..], &value[..]] {
                    buf.extend_from_slice(format!("${}\r\n", part.len()).as_bytes());
                    buf.extend_from_slice(part);
                    buf.extend_from_slice(b"\r\n");
                }
            }
        }
        w.write_all(&buf).map_err(|e| e.to_string())?;
        for _ in group {
            let line = read_line(&mut r)?;
            if line != b"+OK" {
                return Err(format!("MSET answered {}", String::from_utf8_lossy(&line)));
            }
        }
    }
    for &(a, b) in &chunks {
        let mut buf = format!("*{}\r\n$4\r\nMGET\r\n", 1 + b - a).into_bytes();
        for i in a..b {
            key_of(i, &mut key);
            buf.extend_from_slice(format!("${}\r\n", key.len()).as_bytes());
            buf.extend_from_slice(&key);
            buf.extend_from_slice(b"\r\n");
        }
        w.write_all(&buf).map_err(|e| e.to_string())?;
        let head = read_line(&mut r)?;
        if head != format!("*{}", b - a).as_bytes() {
            return Err(format!("MGET answered {}", String::from_utf8_lossy(&head)));
        }
        for i in a..b {
            let v = read_bulk(&mut r)?;
            if !v.as_deref().is_some_and(|v| check_value(i, value_size, v)) {
                return Err(format!("key {i} did not read back as written"));
            }
        }
    }
    Ok(())
}

fn read_line(r: &mut impl BufRead) -> Result<Vec<u8>, String> {
    let mut line = Vec::new();
    r.read_until(b'\n', &mut line)
        .map_err(|e| format!("reading a reply: {e}"))?;
    if !line.ends_with(b"\r\n") {
        return Err("connection closed mid-reply".into());
    }
    line.truncate(line.len() - 2);
    Ok(line)
}

fn read_bulk(r: &mut impl BufRead) -> Result<Option<Vec<u8>>, String> {
    let head = read_line(r)?;
    if head == b"$-1" {
        return Ok(None);
    }
    let len: usize = head
        .strip_prefix(b"$")
        .and_then(|d| std::str::from_utf8(d).ok())
        .and_then(|d| d.parse().ok())
        .ok_or_else(|| format!("bad bulk header {}", String::from_utf8_lossy(&head)))?;
    let mut v = vec![0u8; len + 2];
    r.read_exact(&mut v)
        .map_err(|e| format!("reading a value: {e}"))?;
    v.truncate(len);
    Ok(Some(v))
}

/// Prints the comparison table: one row per workload and system, with
/// ratios against Redis and against memcached on the same workload.
pub fn print(opts: &CompareOpts, rows: &[Row]) {
    println!(
        "compare: {}-byte keys, {}-byte values, {} keys preloaded, {} connections; servers pinned to CPU {}, load generators to CPU {}; {:.1} s per case",
        16,
        opts.value_size,
        opts.keys,
        opts.conns,
        opts.server_cpus,
        opts.client_cpu,
        opts.duration.as_secs_f64()
    );
    println!(
        "load: redis-benchmark for redis and fabrickv-resp; FabricKV's memcached text-protocol generator for memcached and fabrickv-memcache; FabricKV's native generator for fabrickv-tcp/shm (P = operations per frame, {} frames in flight)",
        opts.conns
    );
    println!("Mops counts keys (an MGET of 10 is 10); latency is per request as each tool measures it; CPU is the server process's user+system time during the run; kernel is the system time's share of it");
    let header = [
        "workload",
        "system",
        "Mops",
        "p50",
        "p99",
        "srv CPU-s/Mop",
        "Mops/CPU-s",
        "kernel",
        "x redis",
        "x redis/CPU",
        "x memcached",
        "x mc/CPU",
    ];
    let mut table = Vec::new();
    // In the order first measured; a paced case is one row per system
    // whatever rate each was offered.
    let mut cases: Vec<String> = Vec::new();
    for r in rows
        .iter()
        .filter(|r| !matches!(r.workload, Workload::Scan(_)))
    {
        if !cases.contains(&r.workload.name()) {
            cases.push(r.workload.name());
        }
    }
    for w in cases {
        let redis = rows
            .iter()
            .find(|r| r.workload.name() == w && r.system == System::Redis);
        let memcached = rows
            .iter()
            .find(|r| r.workload.name() == w && r.system == System::Memcached);
        for r in rows.iter().filter(|r| r.workload.name() == w) {
            let against = |base: Option<&Row>, f: fn(&Row) -> f64| {
                base.map_or("-".to_string(), |b| {
                    format!("{:.2}", f(r) / f(b).max(1e-12))
                })
            };
            let vs = |f: fn(&Row) -> f64| against(redis, f);
            let vs_mc = |f: fn(&Row) -> f64| against(memcached, f);
            table.push(vec![
                w.clone(),
                r.system.name().to_string(),
                format!("{:.3}", r.result.ops_per_s / 1e6),
                format!("{:.1}us", r.result.p50_us),
                format!("{:.1}us", r.result.p99_us),
                format!("{:.3}", r.cpu_s_per_mop()),
                format!("{:.3}", r.ops_per_cpu_s() / 1e6),
                r.result.params["server_kernel_share"]
                    .as_f64()
                    .map_or("-".to_string(), |k| format!("{:.0}%", k * 100.0)),
                vs(|x| x.result.ops_per_s),
                vs(Row::ops_per_cpu_s),
                vs_mc(|x| x.result.ops_per_s),
                vs_mc(Row::ops_per_cpu_s),
            ]);
        }
    }
    print_table(&header, &table);
    print_scan(rows);
}

/// The SCAN calls of one full iteration and its median time, per server,
/// with ratios against Redis (lower is better for both).
fn print_scan(rows: &[Row]) {
    let scans: Vec<&Row> = rows
        .iter()
        .filter(|r| matches!(r.workload, Workload::Scan(_)))
        .collect();
    if scans.is_empty() {
        return;
    }
    println!("SCAN: full iterations of the preloaded keys, cursor 0 to 0, on one connection; calls and time of one iteration (the median's time), server CPU per iteration");
    let header = [
        "workload",
        "system",
        "keys",
        "calls",
        "time",
        "per call",
        "srv CPU/iter",
        "x redis calls",
        "x redis time",
    ];
    let calls = |r: &Row| r.result.params["calls"].as_f64().unwrap_or(0.0);
    let time = |r: &Row| r.result.params["iteration_s"].as_f64().unwrap_or(0.0);
    let iterations = |r: &Row| r.result.params["iterations"].as_f64().unwrap_or(1.0);
    let mut table = Vec::new();
    for r in &scans {
        let redis = scans
            .iter()
            .find(|b| b.workload == r.workload && b.system == System::Redis);
        let vs = |f: &dyn Fn(&Row) -> f64| {
            redis.map_or("-".to_string(), |b| {
                format!("{:.2}", f(r) / f(b).max(1e-12))
            })
        };
        table.push(vec![
            r.workload.name(),
            r.system.name().to_string(),
            r.result.params["keys"].to_string(),
            format!("{:.0}", calls(r)),
            format!("{:.1}ms", time(r) * 1e3),
            format!("{:.1}us", r.result.p50_us),
            format!("{:.2}ms", r.server_cpu_s / iterations(r).max(1.0) * 1e3),
            vs(&calls),
            vs(&time),
        ]);
    }
    print_table(&header, &table);
}

/// The JSON line of a row: its result with the CPU figures and ratios.
pub fn json(rows: &[Row], r: &Row) -> String {
    let mut result = r.result.clone();
    result.params["server_cpu_s"] = r.server_cpu_s.into();
    result.params["cpu_s_per_mop"] = r.cpu_s_per_mop().into();
    result.params["ops_per_cpu_s"] = r.ops_per_cpu_s().into();
    if let Some(b) = rows
        .iter()
        .find(|b| b.workload.name() == r.workload.name() && b.system == System::Redis)
    {
        result.params["vs_redis_throughput"] = (r.result.ops_per_s / b.result.ops_per_s).into();
        result.params["vs_redis_per_cpu"] = (r.ops_per_cpu_s() / b.ops_per_cpu_s()).into();
        if let (Some(c), Some(bc), Some(t), Some(bt)) = (
            r.result.params["calls"].as_f64(),
            b.result.params["calls"].as_f64(),
            r.result.params["iteration_s"].as_f64(),
            b.result.params["iteration_s"].as_f64(),
        ) {
            result.params["vs_redis_calls"] = (c / bc.max(1.0)).into();
            result.params["vs_redis_time"] = (t / bt.max(1e-12)).into();
        }
    }
    if let Some(b) = rows
        .iter()
        .find(|b| b.workload.name() == r.workload.name() && b.system == System::Memcached)
    {
        result.params["vs_memcached_throughput"] = (r.result.ops_per_s / b.result.ops_per_s).into();
        result.params["vs_memcached_per_cpu"] = (r.ops_per_cpu_s() / b.ops_per_cpu_s()).into();
    }
    result.json()
}
