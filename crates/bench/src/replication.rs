//! `fabrickv bench replication`: what keeping a second copy costs, beside
//! Redis's nearest equivalent, and how fast a killed primary's slots are
//! served again.
//!
//! - **Cost.** The same three-server cluster in etcd (server processes,
//!   one worker each) once with one copy of each slot and once with two
//!   (and a failover controller): RESP clients, each with one write in
//!   flight, SET keys of server 0's slots on server 0, then GET them,
//!   then mix the two (one SET in ten, as a cache in front of a database
//!   sees): the GETs' latencies there say what a second copy costs a
//!   read made while writes replicate.
//!   Beside it, redis-server with one replica, each SET followed by
//!   `WAIT 1 0` (acknowledged once the replica has it: the nearest Redis
//!   has to a synchronous acknowledgement), at the same client depth;
//!   and, for reference, the same Redis pair without `WAIT` (Redis's
//!   default, asynchronous replication: a failover may lose what was
//!   acknowledged), which bounds what any synchronous copy can reach on
//!   the same client and loopback. Configurations alternate over
//!   `rounds`, and each one's latencies and rates are summed over its
//!   rounds.
//! - **Failover.** In the two-copy cluster, the primary of slot 0's group
//!   is killed with SIGKILL and a client writes a key of that slot to
//!   whichever server will take it (following `-MOVED`), timing from the
//!   kill to the first `+OK`; the killed server is started again and
//!   waits to be back in sync before the next kill.

use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use fabrickv_cluster::etcd::EtcdRegistry;
use fabrickv_cluster::local::LocalEtcd;
use fabrickv_cluster::slots::{key_slot, SlotMap};
use hdrhistogram::Histogram;

use crate::peers::{free_port, spawn_redis_with, spawn_server, spawn_until, Child};
use crate::report::BenchResult;

/// Servers of the benchmarked cluster.
const SERVERS: u32 = 3;

/// Longest wait for a cluster to settle (servers stamped, a killed server
/// back in sync), in seconds.
const SETTLE_S: u64 = 60;

/// Longest wait for one answer of a server, in milliseconds.
const IO_TIMEOUT_MS: u64 = 2_000;

/// What to run.
#[derive(Debug, Clone)]
pub struct ReplOpts {
    /// Client connections, one write in flight each.
    pub clients: usize,
    /// Seconds of each measured run.
    pub duration: Duration,
    /// Distinct keys (all of server 0's slots).
    pub keys: usize,
    /// Value length in bytes.
    pub value_size: usize,
    /// Alternating rounds of the cost runs.
    pub rounds: usize,
    /// Primaries killed for the failover figures.
    pub kills: usize,
}

/// One server process of the cluster, restartable on its ports.
pub(crate) struct Node {
    pub(crate) id: u32,
    /// Its native port and its RESP port.
    pub(crate) native: u16,
    pub(crate) resp: u16,
    args: Vec<String>,
    child: Option<Child>,
}

impl Node {
    fn start(&mut self) -> Result<(), String> {
        let exe = std::env::current_exe().map_err(|e| e.to_string())?;
        let mut cmd = Command::new(exe);
        cmd.args(&self.args);
        self.child = Some(spawn_server(
            cmd,
            &format!("server {}", self.id),
            self.resp,
        )?);
        Ok(())
    }

    fn kill(&mut self) {
        // Child's drop is SIGKILL and a wait.
        self.child = None;
    }
}

/// A running cluster of [`SERVERS`] servers keeping `replicas` copies.
pub(crate) struct Cluster {
    pub(crate) nodes: Vec<Node>,
    pub(crate) registry: EtcdRegistry,
    /// Its name in etcd.
    pub(crate) name: String,
    _controller: Option<Child>,
}

/// The shape of a cluster to start.
pub(crate) struct Shape {
    /// Copies of each slot.
    pub(crate) replicas: u8,
    /// Server processes (ids `0..servers`).
    pub(crate) servers: u32,
    /// Servers of the first map (the rest register and wait to be added).
    pub(crate) size: u32,
    /// Each server's `--memory`.
    pub(crate) memory: String,
}

impl Cluster {
    fn start(etcd: &LocalEtcd, replicas: u8) -> Result<Cluster, String> {
        Cluster::start_shaped(
            etcd,
            &Shape {
                replicas,
                servers: SERVERS,
                size: SERVERS,
                memory: "256MB".into(),
            },
        )
    }

    /// A cluster of `shape`, once every server of the first map holds its
    /// roles and serves.
    pub(crate) fn start_shaped(etcd: &LocalEtcd, shape: &Shape) -> Result<Cluster, String> {
        let replicas = shape.replicas;
        let name = format!("bench-r{replicas}-{}-{}", shape.servers, std::process::id());
        let url = etcd.url();
        let registry = EtcdRegistry::connect(&url, &name).map_err(|e| e.to_string())?;
        let controller = if replicas > 1 {
            let exe = std::env::current_exe().map_err(|e| e.to_string())?;
            let mut cmd = Command::new(exe);
            cmd.args([
                "cluster",
                "controller",
                "--registry",
                &url,
                "--cluster",
                &name,
            ]);
            let r = registry.clone();
            Some(spawn_until(cmd, "controller", || {
                r.view().is_ok_and(|v| v.controller.is_some())
            })?)
        } else {
            None
        };
        let mut nodes = Vec::new();
        for id in 0..shape.servers {
            let (native, resp) = (free_port()?, free_port()?);
            let args: Vec<String> = [
                "serve",
                "--listen",
                &format!("127.0.0.1:{native}"),
                "--resp",
                &format!("127.0.0.1:{resp}"),
                "--workers",
                "1",
                "--memory",
                &shape.memory,
                "--grpc",
                "off",
                "--log-level",
                "error",
                "--registry",
                &url,
                "--cluster",
                &name,
                "--id",
                &id.to_string(),
                "--cluster-size",
                &shape.size.to_string(),
                "--replicas",
                &replicas.to_string(),
            ]
            .iter()
            .map(|s| s.to_string())
            .collect();
            let mut n = Node {
                id,
                native,
                resp,
                args,
                child: None,
            };
            n.start()?;
            nodes.push(n);
        }
        let c = Cluster {
            nodes,
            registry,
            name,
            _controller: controller,
        };
        c.wait_map("every server in its groups", |m| {
            m.groups.len() == shape.size as usize
                && m.groups
                    .iter()
                    .all(|g| g.backups.len() + 1 == usize::from(replicas))
                && (replicas == 1 || (0..shape.servers).all(|i| m.incarnation_of(i) != 0))
        })?;
        // Served: stamped, holding its lease, following the map.
        let deadline = Instant::now() + Duration::from_secs(SETTLE_S);
        let mut cmd = Vec::new();
        Resp::encode(&mut cmd, &[b"SET", b"repl:ready", b"1"]);
        let mut last = String::new();
        loop {
            if let Ok(mut conn) = Resp::connect(c.resp_of(0), Duration::from_millis(IO_TIMEOUT_MS))
            {
                if conn.w.write_all(&cmd).is_ok() {
                    if let Ok(r) = conn.reply() {
                        if r == "+OK" || r.starts_with("-MOVED") {
                            break;
                        }
                        last = r.to_string();
                    }
                }
            }
            if Instant::now() > deadline {
                return Err(format!("server 0 never served a write: {last}"));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        Ok(c)
    }

    pub(crate) fn map(&self) -> Option<SlotMap> {
        self.registry.view().ok()?.map.map(|(m, _)| m)
    }

    pub(crate) fn wait_map(
        &self,
        what: &str,
        done: impl Fn(&SlotMap) -> bool,
    ) -> Result<SlotMap, String> {
        let deadline = Instant::now() + Duration::from_secs(SETTLE_S);
        loop {
            if let Some(m) = self.map().filter(|m| done(m)) {
                return Ok(m);
            }
            if Instant::now() > deadline {
                return Err(format!("the cluster never showed {what}"));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    fn resp_of(&self, id: u32) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.nodes[id as usize].resp))
    }
}

/// A RESP connection that sends commands and reads one reply each.
struct Resp {
    w: TcpStream,
    r: BufReader<TcpStream>,
    line: String,
}

impl Resp {
    fn connect(addr: SocketAddr, timeout: Duration) -> std::io::Result<Resp> {
        let w = TcpStream::connect_timeout(&addr, timeout)?;
        w.set_nodelay(true)?;
        w.set_read_timeout(Some(timeout))?;
        let r = BufReader::new(w.try_clone()?);
        Ok(Resp {
            w,
            r,
            line: String::new(),
        })
    }

    /// Appends a command to `out`.
    fn encode(out: &mut Vec<u8>, args: &[&[u8]]) {
        out.extend_from_slice(format!("*{}\r\n", args.len()).as_bytes());
        for a in args {
            out.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
            out.extend_from_slice(a);
            out.extend_from_slice(b"\r\n");
        }
    }

    /// Reads one reply; returns its first line (the bulk's bytes are
    /// read and dropped).
    fn reply(&mut self) -> std::io::Result<&str> {
        self.line.clear();
        self.r.read_line(&mut self.line)?;
        if let Some(n) = self.line.strip_prefix('$') {
            let n: i64 = n.trim().parse().unwrap_or(-1);
            if n >= 0 {
                let mut skip = vec![0u8; n as usize + 2];
                std::io::Read::read_exact(&mut self.r, &mut skip)?;
            }
        }
        Ok(self.line.trim_end())
    }
}

/// Keys of slot group 0 (slots `0..=last`), `n` of them.
fn keys_of_group0(n: usize, last: u16) -> Vec<Vec<u8>> {
    (0u64..)
        .map(|i| format!("repl:{i}").into_bytes())
        .filter(|k| key_slot(k) <= last)
        .take(n)
        .collect()
}

/// What a load run adds up: latencies and operations over rounds.
struct Tally {
    hist: Histogram<u64>,
    ops: u64,
    seconds: f64,
    errors: u64,
}

impl Tally {
    fn new() -> Result<Tally, String> {
        Ok(Tally {
            hist: Histogram::new(3).map_err(|e| e.to_string())?,
            ops: 0,
            seconds: 0.0,
            errors: 0,
        })
    }

    fn result(&self, case: &str, system: &str, o: &ReplOpts) -> BenchResult {
        BenchResult {
            bench: "replication".into(),
            case: case.into(),
            system: system.into(),
            ops_per_s: if self.seconds > 0.0 {
                self.ops as f64 / self.seconds
            } else {
                0.0
            },
            p50_us: self.hist.value_at_quantile(0.5) as f64 / 1e3,
            p99_us: self.hist.value_at_quantile(0.99) as f64 / 1e3,
            ops: self.ops,
            seconds: self.seconds,
            wrong_values: self.errors,
            params: serde_json::json!({
                "clients": o.clients,
                "value_size": o.value_size,
                "keys": o.keys,
                "rounds": o.rounds,
            }),
        }
    }
}

/// One client thread's latencies, operations and refusals.
type ClientTally = (Histogram<u64>, u64, u64);

/// What a load run sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mix {
    /// SETs only.
    Sets,
    /// GETs only.
    Gets,
    /// GETs, with every [`MIXED_SET_EVERY`]th command of a connection a
    /// SET; only the GETs' latencies are recorded (every command counts
    /// in the rate).
    Mixed,
}

/// One command in this many of a mixed load's connections is a SET (the
/// read-mostly shape of a cache in front of a database).
const MIXED_SET_EVERY: usize = 10;

/// `o.clients` connections to `addr`, each sending one command (or, with
/// `wait`, a SET and a `WAIT 1 0` in one write) at a time, for
/// `o.duration`, as `mix` says.
fn load(
    addr: SocketAddr,
    keys: &[Vec<u8>],
    o: &ReplOpts,
    mix: Mix,
    wait: bool,
    t: &mut Tally,
) -> Result<(), String> {
    let stop = Arc::new(AtomicBool::new(false));
    let value = vec![b'v'; o.value_size];
    let began = Instant::now();
    let results: Vec<Result<ClientTally, String>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..o.clients)
            .map(|c| {
                let (stop, value) = (stop.clone(), &value);
                s.spawn(move || -> Result<ClientTally, String> {
                    let mut conn = Resp::connect(addr, Duration::from_millis(IO_TIMEOUT_MS))
                        .map_err(|e| format!("{addr}: {e}"))?;
                    let mut h = Histogram::new(3).map_err(|e| e.to_string())?;
                    let (mut ops, mut errors) = (0u64, 0u64);
                    let mut buf = Vec::with_capacity(256 + value.len());
                    let mut i = c;
                    let mut n = 0usize;
                    while !stop.load(Ordering::Relaxed) {
                        let key = &keys[i % keys.len()];
                        i += o.clients;
                        let set = match mix {
                            Mix::Sets => true,
                            Mix::Gets => false,
                            Mix::Mixed => (n + c).is_multiple_of(MIXED_SET_EVERY),
                        };
                        n += 1;
                        buf.clear();
                        if set {
                            Resp::encode(&mut buf, &[b"SET", key, value]);
                            if wait {
                                Resp::encode(&mut buf, &[b"WAIT", b"1", b"0"]);
                            }
                        } else {
                            Resp::encode(&mut buf, &[b"GET", key]);
                        }
                        let t0 = Instant::now();
                        conn.w
                            .write_all(&buf)
                            .map_err(|e| format!("{addr}: send: {e}"))?;
                        let ok = {
                            let first = conn.reply().map_err(|e| format!("{addr}: reply: {e}"))?;
                            if first.starts_with('-') && errors == 0 {
                                eprintln!("bench replication: {addr} answered {first}");
                            }
                            !first.starts_with('-')
                        };
                        let ok = if set && wait {
                            let second = conn
                                .reply()
                                .map_err(|e| format!("{addr}: WAIT reply: {e}"))?;
                            ok && second == ":1"
                        } else {
                            ok
                        };
                        if !(set && mix == Mix::Mixed) {
                            let _ = h.record(t0.elapsed().as_nanos() as u64);
                        }
                        ops += 1;
                        errors += u64::from(!ok);
                    }
                    Ok((h, ops, errors))
                })
            })
            .collect();
        std::thread::sleep(o.duration);
        stop.store(true, Ordering::Relaxed);
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err("a client thread panicked".into()))
            })
            .collect()
    });
    t.seconds += began.elapsed().as_secs_f64();
    for r in results {
        let (h, ops, errors) = r?;
        let _ = t.hist.add(&h);
        t.ops += ops;
        t.errors += errors;
    }
    Ok(())
}

/// The figures of one run.
pub struct ReplReport {
    /// Writes and reads: FabricKV with one copy, with two, and Redis with
    /// a replica.
    pub rows: Vec<BenchResult>,
    /// Milliseconds from each kill to the first write served.
    pub failovers_ms: Vec<f64>,
}

impl ReplReport {
    fn row(&self, case: &str, system: &str) -> Option<&BenchResult> {
        self.rows
            .iter()
            .find(|r| r.case == case && r.system == system)
    }

    /// `a / b` of the named rows' field.
    fn ratio(&self, case: &str, a: &str, b: &str, f: fn(&BenchResult) -> f64) -> f64 {
        match (self.row(case, a), self.row(case, b)) {
            (Some(x), Some(y)) if f(y) > 0.0 => f(x) / f(y),
            _ => 0.0,
        }
    }

    fn failover_quantile(&self, q: f64) -> f64 {
        let mut v = self.failovers_ms.clone();
        v.sort_by(f64::total_cmp);
        if v.is_empty() {
            return 0.0;
        }
        v[((v.len() - 1) as f64 * q).round() as usize]
    }

    /// The seeds' table, then the ratios the issue names.
    pub fn print(&self) {
        println!(
            "{:<8} {:<28} {:>12} {:>10} {:>10} {:>8}",
            "op", "system", "ops/s", "p50 us", "p99 us", "errors"
        );
        for r in &self.rows {
            println!(
                "{:<8} {:<28} {:>12.0} {:>10.1} {:>10.1} {:>8}",
                r.case, r.system, r.ops_per_s, r.p50_us, r.p99_us, r.wrong_values
            );
        }
        let ops = |r: &BenchResult| r.ops_per_s;
        let p50 = |r: &BenchResult| r.p50_us;
        println!(
            "R=2 / R=1: write p50 {:.2}x (target <= 1.5x), write throughput {:.2}x (>= 0.6x), read throughput {:.2}x",
            self.ratio("set", FKV_R2, FKV_R1, p50),
            self.ratio("set", FKV_R2, FKV_R1, ops),
            self.ratio("get", FKV_R2, FKV_R1, ops),
        );
        println!(
            "R=2 / R=1 with one SET in {MIXED_SET_EVERY}: GET p50 {:.2}x, GET p99 {:.2}x, throughput {:.2}x",
            self.ratio(MIXED_CASE, FKV_R2, FKV_R1, p50),
            self.ratio(MIXED_CASE, FKV_R2, FKV_R1, |r| r.p99_us),
            self.ratio(MIXED_CASE, FKV_R2, FKV_R1, ops),
        );
        println!(
            "R=2 / Redis+replica WAIT 1 0: write throughput {:.2}x (target >= 2x), write p50 {:.2}x",
            self.ratio("set", FKV_R2, REDIS_WAIT, ops),
            self.ratio("set", FKV_R2, REDIS_WAIT, p50),
        );
        println!(
            "R=2 / Redis+replica without WAIT (asynchronous: a failover may lose acknowledged writes): write throughput {:.2}x, write p50 {:.2}x; Redis WAIT / without: {:.2}x",
            self.ratio("set", FKV_R2, REDIS_ASYNC, ops),
            self.ratio("set", FKV_R2, REDIS_ASYNC, p50),
            self.ratio("set", REDIS_WAIT, REDIS_ASYNC, ops),
        );
        if !self.failovers_ms.is_empty() {
            println!(
                "failover (kill -9 to first write served), {} kills: p50 {:.0} ms (target <= 1000), max {:.0} ms (<= 2000)",
                self.failovers_ms.len(),
                self.failover_quantile(0.5),
                self.failover_quantile(1.0),
            );
        }
    }

    /// One JSON line per result.
    pub fn json_lines(&self) -> Vec<String> {
        let mut v: Vec<String> = self.rows.iter().map(BenchResult::json).collect();
        if !self.failovers_ms.is_empty() {
            v.push(
                serde_json::json!({
                    "bench": "replication",
                    "case": "failover",
                    "system": FKV_R2,
                    "kills": self.failovers_ms.len(),
                    "p50_ms": self.failover_quantile(0.5),
                    "max_ms": self.failover_quantile(1.0),
                    "each_ms": self.failovers_ms,
                })
                .to_string(),
            );
        }
        v
    }
}

/// The case of the mixed load's rows: its rate counts every command, its
/// latencies are the GETs'.
const MIXED_CASE: &str = "get+set";

const FKV_R1: &str = "fabrickv R=1";
const FKV_R2: &str = "fabrickv R=2";
const REDIS_WAIT: &str = "redis+replica WAIT 1 0";
/// Redis's default: the replica is sent each write after the client is
/// answered, so a failover may lose acknowledged writes.
const REDIS_ASYNC: &str = "redis+replica, async";

/// Runs the benchmark.
pub fn run(o: &ReplOpts) -> Result<ReplReport, String> {
    let etcd = LocalEtcd::start().map_err(|e| format!("etcd: {e}"))?;
    let one = Cluster::start(&etcd, 1)?;
    let mut two = Cluster::start(&etcd, 2)?;
    let last = two
        .map()
        .and_then(|m| {
            m.groups
                .first()
                .and_then(|g| g.ranges.first())
                .map(|r| r.last)
        })
        .ok_or("no slot map")?;
    let keys = keys_of_group0(o.keys.max(1), last);
    // The full sync writes an RDB file in each server's directory: a
    // temporary one, not the working directory.
    let dir = std::env::temp_dir();
    let dir = dir.to_string_lossy();
    let (_redis, redis_port) = spawn_redis_with(None, &["--dir", &dir])?;
    let (_replica, replica_port) = spawn_redis_with(None, &["--dir", &dir])?;
    let redis = SocketAddr::from(([127, 0, 0, 1], redis_port));
    let mut rc = Resp::connect(
        SocketAddr::from(([127, 0, 0, 1], replica_port)),
        Duration::from_millis(IO_TIMEOUT_MS),
    )
    .map_err(|e| e.to_string())?;
    let mut cmd = Vec::new();
    Resp::encode(
        &mut cmd,
        &[
            b"REPLICAOF",
            b"127.0.0.1",
            redis_port.to_string().as_bytes(),
        ],
    );
    rc.w.write_all(&cmd).map_err(|e| e.to_string())?;
    rc.reply().map_err(|e| e.to_string())?;
    wait_replica_online(redis)?;

    // Each cluster's writes go to the primary of the keys' group.
    let primary = |c: &Cluster| c.map().map_or(0, |m| m.groups[0].primary);
    // (name, address, SET followed by WAIT, runs the GET-only load). The
    // last, Redis without WAIT, is a reference for what the synchronous
    // systems pay: its GETs are the row before's, so it runs no GET load.
    let systems = [
        (FKV_R1, one.resp_of(primary(&one)), false, true),
        (FKV_R2, two.resp_of(primary(&two)), false, true),
        (REDIS_WAIT, redis, true, true),
        (REDIS_ASYNC, redis, false, false),
    ];
    // One tally per system for each load.
    let tallies = || {
        systems
            .iter()
            .map(|_| Tally::new())
            .collect::<Result<Vec<_>, _>>()
    };
    let (mut sets, mut gets, mut mixed) = (tallies()?, tallies()?, tallies()?);
    for _ in 0..o.rounds.max(1) {
        for (i, (_, addr, wait, reads)) in systems.iter().enumerate() {
            load(*addr, &keys, o, Mix::Sets, *wait, &mut sets[i])?;
            if *reads {
                load(*addr, &keys, o, Mix::Gets, false, &mut gets[i])?;
            }
            load(*addr, &keys, o, Mix::Mixed, *wait, &mut mixed[i])?;
        }
    }
    let mut rows = Vec::new();
    for (i, (name, _, _, reads)) in systems.iter().enumerate() {
        rows.push(sets[i].result("set", name, o));
        if *reads {
            rows.push(gets[i].result("get", name, o));
        }
        rows.push(mixed[i].result(MIXED_CASE, name, o));
    }
    drop(one);
    let failovers_ms = failovers(&mut two, &keys[0], o.kills)?;
    Ok(ReplReport { rows, failovers_ms })
}

/// Waits until redis-server at `addr` reports a replica online.
fn wait_replica_online(addr: SocketAddr) -> Result<(), String> {
    let deadline = Instant::now() + Duration::from_secs(SETTLE_S);
    let mut cmd = Vec::new();
    Resp::encode(&mut cmd, &[b"WAIT", b"1", b"100"]);
    while Instant::now() < deadline {
        let mut c =
            Resp::connect(addr, Duration::from_millis(IO_TIMEOUT_MS)).map_err(|e| e.to_string())?;
        c.w.write_all(&cmd).map_err(|e| e.to_string())?;
        if c.reply().map_err(|e| e.to_string())? == ":1" {
            return Ok(());
        }
    }
    Err("the Redis replica never came online".into())
}

/// Kills the primary of `key`'s group `kills` times; each time, the
/// milliseconds until a write of `key` is served.
fn failovers(c: &mut Cluster, key: &[u8], kills: usize) -> Result<Vec<f64>, String> {
    let mut out = Vec::with_capacity(kills);
    let g0 = 0usize;
    for _ in 0..kills {
        let map = c.wait_map("every group with a backup", |m| {
            m.groups
                .iter()
                .all(|g| g.backups.len() == 1 && g.joining.is_empty())
        })?;
        let victim = map.groups[g0].primary;
        let began = Instant::now();
        c.nodes[victim as usize].kill();
        let took = first_write(c, victim, key, began)?;
        out.push(took.as_secs_f64() * 1e3);
        c.nodes[victim as usize].start()?;
    }
    Ok(out)
}

/// Writes `key` to any live server, following `-MOVED`, until one
/// answers `+OK`; returns the time since `began`.
fn first_write(c: &Cluster, dead: u32, key: &[u8], began: Instant) -> Result<Duration, String> {
    let mut cmd = Vec::new();
    Resp::encode(&mut cmd, &[b"SET", key, b"after-failover"]);
    let deadline = began + Duration::from_secs(SETTLE_S);
    let live: Vec<u32> = (0..SERVERS).filter(|&i| i != dead).collect();
    let mut turn = 0usize;
    let mut next: Option<SocketAddr> = None;
    while Instant::now() < deadline {
        let addr = next.take().unwrap_or_else(|| {
            turn += 1;
            c.resp_of(live[turn % live.len()])
        });
        let Ok(mut conn) = Resp::connect(addr, Duration::from_millis(100)) else {
            continue;
        };
        if conn.w.write_all(&cmd).is_err() {
            continue;
        }
        match conn.reply() {
            Ok("+OK") => return Ok(began.elapsed()),
            Ok(r) if r.starts_with("-MOVED") => {
                next = r
                    .split_whitespace()
                    .nth(2)
                    .and_then(|a| a.parse().ok())
                    .filter(|a: &SocketAddr| *a != c.resp_of(dead));
                if next.is_none() {
                    std::thread::sleep(Duration::from_millis(1));
                }
            }
            _ => std::thread::sleep(Duration::from_millis(1)),
        }
    }
    Err("no server took the write after the failover".into())
}
