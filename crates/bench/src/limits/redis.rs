//! The Redis peer of a batched pull: redis-server answering
//! redis-benchmark's MGETs of random preloaded keys ([`redis_mget`],
//! `peer.redis_mget`).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use serde::Serialize;

use super::check::{check_duration, check_range, json_line};
use super::pair::set_up;
use crate::cpu::CpuMeter;
use crate::peers;

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
    use crate::limits::check::testing::sane;
    use crate::peers::on_path;

    #[test]
    fn redis_mget_refuses_out_of_bounds_arguments() {
        let d = Duration::from_millis(10);
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
