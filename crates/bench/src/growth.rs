//! `fabrickv bench growth`: a fourth server added to a cluster of three in
//! etcd while a writer and a reader keep going, as `fabrickv cluster add`
//! does it (the slots planned, split out, streamed, handed over).
//!
//! Measured against what the issue names, each in the same run:
//! - the share of the keys that moved (the new server's keys over all;
//!   an even share is a quarter, the target at most a quarter plus 5%);
//! - the move's rate (the moved keys' bytes over the time from the commit
//!   to the last group handed over) against `fabrickv copy`'s rate for
//!   the same bytes, run as `fabrickv bench copy` right after (target at
//!   least 0.5x);
//! - acknowledged writes lost: every key is read at the end and must hold
//!   the last version acknowledged for it (or the one after, when the
//!   last write failed and its outcome is unknown); the target is none;
//! - the reader's p99 latency while slots move against before (target at
//!   most 3x).

use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use fabrickv_client::{Client, ClusterClient, ClusterOptions, Kv};
use fabrickv_cluster::local::LocalEtcd;
use hdrhistogram::Histogram;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use crate::replication::{Cluster, Shape};

/// Servers of the cluster before the move; one more is started to be added.
const SERVERS_BEFORE: u32 = 3;

/// Keys per load call.
const LOAD_BATCH: usize = 256;

/// Longest a move may take before the run fails, in seconds.
const MOVE_TIMEOUT_S: u64 = 600;

/// How often the bench looks whether the watch saw the move end, in
/// milliseconds (the end's time is the watch's, not this check's).
const MOVE_END_CHECK_MS: u64 = 20;

/// Each client call's timeout, in seconds.
const CALL_TIMEOUT_S: u64 = 10;

/// Bytes of a key (`g` and a zero-padded index).
pub const KEY_BYTES: usize = 11;

/// The largest share of the keys adding a 4th server to 3 may move.
pub const MOVED_SHARE_MAX: f64 = 0.25 + 0.05;
/// The least the move's rate may be against `fabrickv copy`'s.
pub const RATE_VS_COPY_MIN: f64 = 0.5;
/// The most the reader's p99 during the move may be against before it.
pub const READ_P99_RATIO_MAX: f64 = 3.0;

/// What to run.
#[derive(Debug, Clone)]
pub struct GrowthOpts {
    pub keys: u64,
    pub value_size: usize,
    pub replicas: u8,
    /// Seconds the reader and writer run before the move (the baseline).
    pub steady: Duration,
    /// Measure `fabrickv copy` for the same bytes.
    pub compare_copy: bool,
}

/// The figures of one run.
#[derive(Debug, Clone)]
pub struct GrowthReport {
    pub keys: u64,
    pub moved_keys: u64,
    pub moved_bytes: u64,
    pub move_seconds: f64,
    pub copy_mb_per_s: Option<f64>,
    pub writes: u64,
    pub unknown_writes: u64,
    pub lost: u64,
    pub reads_before: u64,
    pub reads_during: u64,
    pub read_errors: u64,
    pub p99_before_us: f64,
    pub p99_during_us: f64,
    pub replicas: u8,
}

fn key(i: u64) -> Vec<u8> {
    format!("g{i:010}").into_bytes()
}

/// Key `i`'s value at version `v`: the version, then bytes drawn from
/// both (uncompressible, and telling every version apart).
fn value(i: u64, v: u64, len: usize) -> Vec<u8> {
    let mut out = vec![0u8; len.max(8)];
    out[..8].copy_from_slice(&v.to_le_bytes());
    SmallRng::seed_from_u64(i.rotate_left(20) ^ v).fill(&mut out[8..]);
    out
}

fn version_of(v: &[u8]) -> Option<u64> {
    v.get(..8)
        .map(|b| u64::from_le_bytes(b.try_into().unwrap_or([0; 8])))
}

fn opts() -> ClusterOptions {
    ClusterOptions {
        timeout: Duration::from_secs(CALL_TIMEOUT_S),
        ..Default::default()
    }
}

/// Runs the benchmark.
pub fn run(o: &GrowthOpts) -> Result<GrowthReport, String> {
    if o.keys == 0 || o.value_size < 8 {
        return Err("--keys must be at least 1 and --value-size at least 8".into());
    }
    let etcd = LocalEtcd::start().map_err(|e| format!("etcd: {e}"))?;
    let data = o.keys * (KEY_BYTES + o.value_size) as u64;
    // Room for all of the data on one server and then some: after the
    // move a server holds a quarter, before it a third.
    let memory = format!("{}MB", (data * 2 / (1 << 20)).max(256));
    let cluster = Cluster::start_shaped(
        &etcd,
        &Shape {
            replicas: o.replicas,
            servers: SERVERS_BEFORE + 1,
            size: SERVERS_BEFORE,
            memory,
        },
    )?;
    let url = etcd.url();
    let mut c = ClusterClient::join(&url, &cluster.name, opts()).map_err(|e| e.to_string())?;
    for first in (0..o.keys).step_by(LOAD_BATCH) {
        let last = (first + LOAD_BATCH as u64).min(o.keys);
        let pairs: Vec<(Vec<u8>, Vec<u8>)> = (first..last)
            .map(|i| (key(i), value(i, 0, o.value_size)))
            .collect();
        let refs: Vec<(&[u8], &[u8])> = pairs.iter().map(|(k, v)| (&k[..], &v[..])).collect();
        c.mput(&refs, None).map_err(|e| format!("load: {e}"))?;
    }

    // The writer and the reader, each its own cluster client. The phase
    // says which histogram a read's latency goes to.
    let acked: Arc<Vec<AtomicU64>> = Arc::new((0..o.keys).map(|_| AtomicU64::new(0)).collect());
    let unknown: Arc<Mutex<Vec<(u64, u64)>>> = Arc::new(Mutex::new(Vec::new()));
    let stop = Arc::new(AtomicBool::new(false));
    let phase = Arc::new(AtomicU8::new(0));
    let writer = {
        let (acked, unknown, stop, url, name) = (
            acked.clone(),
            unknown.clone(),
            stop.clone(),
            url.clone(),
            cluster.name.clone(),
        );
        let (keys, size) = (o.keys, o.value_size);
        std::thread::spawn(move || -> Result<u64, String> {
            let mut w = ClusterClient::join(&url, &name, opts()).map_err(|e| e.to_string())?;
            let mut rng = SmallRng::seed_from_u64(0x9e0);
            let mut n = 0;
            while !stop.load(Ordering::Acquire) {
                let i = rng.gen_range(0..keys);
                let v = acked[i as usize].load(Ordering::Acquire) + 1;
                match w.put(&key(i), &value(i, v, size)) {
                    Ok(()) => acked[i as usize].store(v, Ordering::Release),
                    Err(_) => unknown.lock().map_err(|e| e.to_string())?.push((i, v)),
                }
                n += 1;
            }
            Ok(n)
        })
    };
    let reader = {
        let (stop, phase, url, name) = (
            stop.clone(),
            phase.clone(),
            url.clone(),
            cluster.name.clone(),
        );
        let keys = o.keys;
        std::thread::spawn(move || -> Result<(Vec<Histogram<u64>>, u64), String> {
            let mut r = ClusterClient::join(&url, &name, opts()).map_err(|e| e.to_string())?;
            let mut hists = vec![
                Histogram::<u64>::new(3).map_err(|e| e.to_string())?,
                Histogram::<u64>::new(3).map_err(|e| e.to_string())?,
                Histogram::<u64>::new(3).map_err(|e| e.to_string())?,
            ];
            let mut errors = 0;
            let mut rng = SmallRng::seed_from_u64(0x7ead);
            while !stop.load(Ordering::Acquire) {
                let i = rng.gen_range(0..keys);
                let at = Instant::now();
                let p = usize::from(phase.load(Ordering::Acquire)).min(2);
                match r.get(&key(i)) {
                    Ok(Some(_)) => {
                        let _ = hists[p].record(at.elapsed().as_nanos() as u64);
                    }
                    _ => errors += 1,
                }
            }
            Ok((hists, errors))
        })
    };
    std::thread::sleep(o.steady);

    // What `fabrickv cluster add --id 3` commits.
    phase.store(1, Ordering::Release);
    let began = Instant::now();
    let (map, rev) = cluster
        .registry
        .view()
        .map_err(|e| e.to_string())?
        .map
        .ok_or("no slot map")?;
    let plan = map.plan_add(SERVERS_BEFORE);
    let next = map.with_moves(&plan)?;
    if !cluster
        .registry
        .swap_map(rev, &next)
        .map_err(|e| e.to_string())?
    {
        return Err("the map changed while the move was committed".into());
    }
    // The end of the move comes from the etcd watch, as clients and
    // servers learn it: polling etcd every few milliseconds would take
    // CPU from the move and the reader being measured.
    let done: Arc<OnceLock<Instant>> = Arc::new(OnceLock::new());
    let committed = next.epoch;
    let watch = {
        let done = done.clone();
        cluster.registry.watch(move |view| {
            if view
                .map
                .is_some_and(|(m, _)| m.epoch > committed && !m.moving())
            {
                done.get_or_init(Instant::now);
            }
        })
    };
    let deadline = began + Duration::from_secs(MOVE_TIMEOUT_S);
    let ended = loop {
        if let Some(&at) = done.get() {
            break at;
        }
        if Instant::now() > deadline {
            return Err(format!("the move took over {MOVE_TIMEOUT_S} s"));
        }
        std::thread::sleep(Duration::from_millis(MOVE_END_CHECK_MS));
    };
    drop(watch);
    let move_seconds = ended.duration_since(began).as_secs_f64();
    phase.store(2, Ordering::Release);
    std::thread::sleep(Duration::from_millis(200));
    stop.store(true, Ordering::Release);
    let writes = writer.join().map_err(|_| "the writer panicked")??;
    let (hists, read_errors) = reader.join().map_err(|_| "the reader panicked")??;

    // Every key holds its last acknowledged version, or the one after it
    // when that write's outcome is unknown.
    let unknown = unknown.lock().map_err(|e| e.to_string())?.clone();
    let mut lost = 0u64;
    for first in (0..o.keys).step_by(LOAD_BATCH) {
        let last = (first + LOAD_BATCH as u64).min(o.keys);
        let ks: Vec<Vec<u8>> = (first..last).map(key).collect();
        let refs: Vec<&[u8]> = ks.iter().map(|k| &k[..]).collect();
        let got = c.mget(&refs).map_err(|e| format!("final read: {e}"))?;
        for (i, v) in (first..last).zip(got) {
            let want = acked[i as usize].load(Ordering::Acquire);
            let ok = match v.as_deref().and_then(|b| Some((b, version_of(b)?))) {
                Some((b, have)) => {
                    (have == want || unknown.contains(&(i, have)))
                        && b == &value(i, have, o.value_size)[..]
                }
                None => false,
            };
            if !ok {
                lost += 1;
            }
        }
    }
    let items = |n: &crate::replication::Node| -> Result<u64, String> {
        let mut cl =
            Client::connect(&format!("127.0.0.1:{}", n.native)).map_err(|e| e.to_string())?;
        Ok(cl
            .stats()
            .map_err(|e| e.to_string())?
            .get("items")
            .copied()
            .unwrap_or(0))
    };
    let moved_keys = items(&cluster.nodes[SERVERS_BEFORE as usize])?;
    let moved_bytes = moved_keys * (KEY_BYTES + o.value_size) as u64;
    drop(c);
    drop(cluster);
    let copy_mb_per_s = if o.compare_copy {
        Some(copy_rate(moved_bytes, o.value_size)?)
    } else {
        None
    };
    let p99 = |h: &Histogram<u64>| h.value_at_quantile(0.99) as f64 / 1e3;
    Ok(GrowthReport {
        keys: o.keys,
        moved_keys,
        moved_bytes,
        move_seconds,
        copy_mb_per_s,
        writes,
        unknown_writes: unknown.len() as u64,
        lost,
        reads_before: hists[0].len(),
        reads_during: hists[1].len(),
        read_errors,
        p99_before_us: p99(&hists[0]),
        p99_during_us: p99(&hists[1]),
        replicas: o.replicas,
    })
}

/// `fabrickv bench copy`'s rate (MB/s) for a shard of `bytes` of
/// `value_size`-byte values, run as a child of this binary.
fn copy_rate(bytes: u64, value_size: usize) -> Result<f64, String> {
    let dir = std::env::temp_dir().join(format!("fabrickv-bench-growth-{}", std::process::id()));
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let out = Command::new(exe)
        .args([
            "bench",
            "copy",
            "--size",
            &format!("{}MB", (bytes >> 20).max(4)),
            "--value-size",
            &value_size.to_string(),
            "--dir",
            &dir.to_string_lossy(),
            "--clean",
        ])
        .output()
        .map_err(|e| format!("bench copy: {e}"))?;
    let _ = std::fs::remove_dir_all(&dir);
    if !out.status.success() {
        return Err(format!(
            "bench copy failed: {}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .find_map(|v| {
            (v.get("bench")? == "copy")
                .then(|| v.get("mb_per_s").and_then(serde_json::Value::as_f64))
                .flatten()
        })
        .ok_or_else(|| "bench copy printed no mb_per_s".into())
}

impl GrowthReport {
    fn moved_share(&self) -> f64 {
        crate::ratio(self.moved_keys as f64, self.keys as f64)
    }

    fn move_mb_per_s(&self) -> f64 {
        crate::ratio(self.moved_bytes as f64 / 1e6, self.move_seconds)
    }

    fn p99_ratio(&self) -> f64 {
        crate::ratio(self.p99_during_us, self.p99_before_us)
    }

    /// The figures and their targets.
    pub fn print(&self) {
        let mark = |ok: bool| if ok { "" } else { " MISSED" };
        println!(
            "add a 4th server to 3 ({} {}), {} keys of {} B",
            self.replicas,
            if self.replicas == 1 { "copy" } else { "copies" },
            self.keys,
            self.moved_bytes / self.moved_keys.max(1)
        );
        println!(
            "keys moved: {} ({:.1}%; target <= {:.0}%{})",
            self.moved_keys,
            self.moved_share() * 100.0,
            MOVED_SHARE_MAX * 100.0,
            mark(self.moved_share() <= MOVED_SHARE_MAX)
        );
        match self.copy_mb_per_s {
            Some(copy) => println!(
                "move: {:.1} MB in {:.2} s, {:.1} MB/s; fabrickv copy of the same bytes {:.1} MB/s: {:.2}x (target >= {RATE_VS_COPY_MIN}x{})",
                self.moved_bytes as f64 / 1e6,
                self.move_seconds,
                self.move_mb_per_s(),
                copy,
                crate::ratio(self.move_mb_per_s(), copy),
                mark(crate::ratio(self.move_mb_per_s(), copy) >= RATE_VS_COPY_MIN)
            ),
            None => println!(
                "move: {:.1} MB in {:.2} s, {:.1} MB/s",
                self.moved_bytes as f64 / 1e6,
                self.move_seconds,
                self.move_mb_per_s()
            ),
        }
        println!(
            "writes during the run: {} ({} of unknown outcome); acknowledged writes lost: {} (target 0{})",
            self.writes,
            self.unknown_writes,
            self.lost,
            mark(self.lost == 0)
        );
        println!(
            "read p99: {:.0} us before, {:.0} us during the move: {:.2}x (target <= {READ_P99_RATIO_MAX}x{}); {} reads failed",
            self.p99_before_us,
            self.p99_during_us,
            self.p99_ratio(),
            mark(self.p99_ratio() <= READ_P99_RATIO_MAX),
            self.read_errors
        );
    }

    /// One JSON line.
    pub fn json(&self) -> String {
        serde_json::json!({
            "bench": "growth",
            "case": "add 4th server to 3",
            "system": "fabrickv",
            "replicas": self.replicas,
            "keys": self.keys,
            "moved_keys": self.moved_keys,
            "moved_share": self.moved_share(),
            "moved_bytes": self.moved_bytes,
            "move_seconds": self.move_seconds,
            "mb_per_s": self.move_mb_per_s(),
            "copy_mb_per_s": self.copy_mb_per_s,
            "ratio_vs_copy": self.copy_mb_per_s.map(|c| crate::ratio(self.move_mb_per_s(), c)),
            "writes": self.writes,
            "unknown_writes": self.unknown_writes,
            "lost": self.lost,
            "reads_before": self.reads_before,
            "reads_during": self.reads_during,
            "read_errors": self.read_errors,
            "p99_before_us": self.p99_before_us,
            "p99_during_us": self.p99_during_us,
            "p99_ratio": self.p99_ratio(),
        })
        .to_string()
    }
}
