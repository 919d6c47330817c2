//! `fabrickv bench checkpoint`: what a checkpoint costs a serving server
//! and how fast one comes back, beside the disk it lands on and, with
//! `--compare`, beside Redis's RDB on the kv part.
//!
//! Every figure is judged against a peer measured in the same run:
//!
//! - **The disk.** `dd` writes the data set's size (direct I/O, fsync at
//!   the end) into the run's directory and reads it back (direct I/O);
//!   the time is taken here, not parsed from dd. A save is judged against
//!   the write rate, a restore against the read rate.
//! - **A save.** `fabrickv serve` (this binary) is loaded with kv keys and
//!   embedding rows, then saves with nothing else running: seconds, and
//!   bytes of the checkpoint's files.
//! - **Serving during a save.** One writer (its own connection, batches of
//!   [`WRITE_BATCH_OPS`] overwrites of random existing keys with the same
//!   values) runs alone for `load_seconds`, then again while a second save
//!   runs; its rate over the save is judged against its rate alone. The
//!   server's RSS is read every [`RSS_SAMPLE_MS`] during that save: the
//!   peak less the RSS just before is the save's extra memory, judged
//!   against the data set's bytes.
//! - **A restore.** The server is stopped (SIGTERM), the checkpoint's
//!   files are dropped from the page cache, and a server started with
//!   `--restore` is timed until it accepts connections. Then
//!   [`SPOT_CHECKS`] random keys and rows are read back and compared.
//! - **Redis (`--compare`).** The same kv keys and values in redis-server
//!   (BGSAVE; restart from dump.rdb) and in a FabricKV server holding only
//!   them, each put through the same steps: so that the two hold equal
//!   data.
//!
//! Values are pseudo-random bytes derived from their key: checkable after
//! a restore, and not compressible (Redis compresses RDB strings with LZF
//! by default; a repeating pattern would measure LZF, not the save). The
//! writer writes each key's own value again, so what a restore must read
//! back does not depend on where the save's cut fell.
//!
//! A missed target is reported, not an error: the run fails only when a
//! step fails or a value read back is wrong.

use std::fs::{self, File, OpenOptions};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use fabrickv_client::{BatchOp, Client, Kv, PsClient};
use fabrickv_types::ErrorCode;
use fabrickv_wire::PutCondition;
use rand::rngs::SmallRng;
use rand::{Rng, RngCore, SeedableRng};

use crate::keys::herd_key;
use crate::peers::{free_port, on_path, spawn_redis_with, Child};
use crate::report::{print_table, rate};

/// Key length of the kv data set, bytes (HERD's 16-byte hashes).
pub const KEY_BYTES: usize = 16;

/// Bytes of an embedding row's key (a u64), counted in the data set.
const ROW_KEY_BYTES: u64 = 8;

/// Keys per call while loading the kv data set (4 MiB of 1 KiB values).
const LOAD_BATCH_KEYS: u64 = 4096;

/// SETs per write while loading Redis (replies read after each write).
const RESP_LOAD_PIPELINE: u64 = 256;

/// Overwrites per call of the writer (PUTs in one batch, SETs in one
/// pipelined write).
pub const WRITE_BATCH_OPS: usize = 16;

/// How often a server's RSS is read during a save, milliseconds.
pub const RSS_SAMPLE_MS: u64 = 10;

/// How often Redis's `INFO persistence` is read while it saves or loads,
/// milliseconds.
const INFO_POLL_MS: u64 = 10;

/// How often a starting server's port is tried, milliseconds: the
/// resolution of the restore time.
const START_POLL_MS: u64 = 5;

/// Longest wait for one save, seconds.
const SAVE_WAIT_S: u64 = 3600;

/// Longest wait for a server to start (a restore included), seconds: a
/// restore of a large data set from a slow disk takes minutes, far past
/// `peers::SERVER_START_TIMEOUT`.
const START_TIMEOUT_S: u64 = 1800;

/// Longest wait for a server told to stop (SIGTERM, SHUTDOWN) to exit,
/// seconds.
const STOP_TIMEOUT_S: u64 = 120;

/// Per-call timeout of the benchmark's clients, seconds (a load call
/// carries MiBs; Redis answers INFO late while it loads).
const CALL_TIMEOUT_S: u64 = 60;

/// Keys (and rows) read back and compared after each restore.
pub const SPOT_CHECKS: usize = 1000;

/// Rows per pull of the spot check.
const SPOT_PULL_KEYS: usize = 500;

/// A save shorter than this, milliseconds, is noted: the writer's rate
/// over it covers few batches.
const SHORT_SAVE_MS: u64 = 1000;

/// A restore whose time is at least this share, in percent, of a start
/// without a checkpoint is noted: its rate then mostly measures the start.
const EMPTY_START_NOTED_PERCENT: f64 = 10.0;

/// Smallest dd transfer, MiB.
const DD_MIB_MIN: u64 = 64;

/// Bytes in a MiB (dd's `bs=1M`).
const MIB: u64 = 1 << 20;

/// Engine memory (`--memory`) per byte of kv data, as NUM / DEN: items
/// round up to their size class (up to a quarter) and the index takes its
/// share of the same memory.
const KV_MEMORY_NUM: u64 = 8;
/// See [`KV_MEMORY_NUM`].
const KV_MEMORY_DEN: u64 = 5;

/// Smallest engine memory given to a server, bytes.
const KV_MEMORY_MIN_BYTES: u64 = 64 << 20;

/// The statfs magic of tmpfs: its files are memory, so neither direct I/O
/// nor dropping the page cache applies.
const TMPFS_MAGIC: u64 = 0x0102_1994;

/// Seed of the values' byte streams (mixed with the key number).
const VALUE_SEED: u64 = 0x6b76_2d63_6b70_7400;

/// Seed of the spot checks' key draws.
const SPOT_SEED: u64 = 0x5e1ec7;

/// Seed of the writer's key draws.
const WRITER_SEED: u64 = 0x3717e5;

/// Target: a save's write rate over dd's, at least.
pub const SAVE_VS_DISK_MIN: f64 = 0.5;
/// Target: the writer's rate during a save over its rate alone, at least.
pub const SERVING_DURING_SAVE_MIN: f64 = 0.7;
/// Target: a save's extra RSS as a fraction of the data set, at most.
pub const EXTRA_MEMORY_FRACTION_MAX: f64 = 0.10;
/// Target: a restore's read rate over dd's, at least.
pub const RESTORE_VS_DISK_MIN: f64 = 0.5;

/// What to run.
#[derive(Debug, Clone)]
pub struct CkptOpts {
    /// Embedding rows (keys `1..=embedding_keys` of one table); 0: none.
    pub embedding_keys: u64,
    /// Floats per row.
    pub dim: u32,
    /// Keys of the kv data set (at least one).
    pub kv_keys: u64,
    /// Value length of the kv data set, bytes.
    pub value_size: usize,
    /// Server worker threads.
    pub workers: usize,
    /// The run's own directory (fresh, absolute): checkpoints, dd's file,
    /// the RDB and the servers' logs go here.
    pub dir: PathBuf,
    /// How long the writer runs without a save.
    pub load_seconds: Duration,
    /// Also the kv part beside redis-server.
    pub compare: bool,
}

impl CkptOpts {
    /// Bytes of the kv data set (keys and values).
    pub fn kv_bytes(&self) -> u64 {
        self.kv_keys * (KEY_BYTES + self.value_size) as u64
    }

    /// Bytes of the embedding rows (keys and floats).
    pub fn row_bytes(&self) -> u64 {
        self.embedding_keys * (ROW_KEY_BYTES + u64::from(self.dim) * 4)
    }

    /// Whether every size the run computes from the options (data set,
    /// engine memory, embedding pool) fits a u64.
    pub fn sizes_fit(&self) -> bool {
        let kv = self
            .kv_keys
            .checked_mul((KEY_BYTES + self.value_size) as u64)
            .and_then(|b| b.checked_mul(KV_MEMORY_NUM));
        let rows = self.embedding_keys.checked_mul(
            (u64::from(self.dim) * 4 + crate::ps::POOL_OVERHEAD_PER_KEY_BYTES + ROW_KEY_BYTES) * 5,
        );
        kv.zip(rows).and_then(|(k, r)| k.checked_add(r)).is_some()
    }

    /// Engine memory for `kv_bytes` of kv data.
    fn memory_bytes(kv_bytes: u64) -> u64 {
        (kv_bytes / KV_MEMORY_DEN * KV_MEMORY_NUM).max(KV_MEMORY_MIN_BYTES)
    }

    /// The embedding pool for the rows, MiB: what `bench ps` gives a
    /// server per key (item header, slab rounding) and its slack.
    fn pool_mib(&self) -> u64 {
        let bytes = self.embedding_keys
            * (u64::from(self.dim) * 4 + crate::ps::POOL_OVERHEAD_PER_KEY_BYTES)
            * 5
            / 4
            + crate::ps::POOL_SLACK_BYTES;
        bytes.div_ceil(MIB)
    }
}

/// Which way a figure should go for its target.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Target {
    /// The ratio must be at least this.
    AtLeast(f64),
    /// The ratio must be at most this.
    AtMost(f64),
}

impl Target {
    fn met(self, v: f64) -> bool {
        match self {
            Target::AtLeast(t) => v >= t,
            Target::AtMost(t) => v <= t,
        }
    }

    fn text(self) -> String {
        match self {
            Target::AtLeast(t) => format!(">= {t}"),
            Target::AtMost(t) => format!("<= {t}"),
        }
    }
}

/// A figure set against its peer's.
#[derive(Debug, Clone, PartialEq)]
pub struct Ratio {
    /// Its JSON field (`ratio_vs_disk`, `ratio_vs_redis`, ...).
    pub field: &'static str,
    /// The ratio.
    pub value: f64,
    /// What it is a ratio to, for the table (`dd write`, `redis time`).
    pub of: String,
    /// The target, where it names one.
    pub target: Option<Target>,
}

/// A rate, of bytes or of operations.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Rate {
    /// Bytes per second.
    Bytes(f64),
    /// Operations per second.
    Ops(f64),
}

/// One result: a line of the table and one JSON line.
#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    /// What was measured (`save`, `restore`, `kv save vs redis`, ...).
    pub case: String,
    /// Who (`fabrickv`, `redis`, `dd`, ...).
    pub system: String,
    /// Seconds it took, where a time is the figure.
    pub seconds: Option<f64>,
    /// Bytes it moved or took.
    pub bytes: Option<u64>,
    /// Its rate.
    pub rate: Option<Rate>,
    /// Against its peer.
    pub ratio: Option<Ratio>,
    /// Said beside it (how it was measured, where that differs).
    pub note: Option<String>,
    /// More figures, for the JSON line only.
    pub extra: serde_json::Value,
}

impl Row {
    fn new(case: &str, system: &str) -> Row {
        Row {
            case: case.into(),
            system: system.into(),
            seconds: None,
            bytes: None,
            rate: None,
            ratio: None,
            note: None,
            extra: serde_json::json!({}),
        }
    }

    fn seconds(mut self, d: Duration) -> Row {
        self.seconds = Some(d.as_secs_f64());
        self
    }

    fn bytes(mut self, b: u64) -> Row {
        self.bytes = Some(b);
        self
    }

    fn rate(mut self, r: Rate) -> Row {
        self.rate = Some(r);
        self
    }

    fn ratio(mut self, field: &'static str, value: f64, of: &str, target: Option<Target>) -> Row {
        self.ratio = Some(Ratio {
            field,
            value,
            of: of.into(),
            target,
        });
        self
    }

    fn note(mut self, n: Option<String>) -> Row {
        self.note = n;
        self
    }

    fn extra(mut self, v: serde_json::Value) -> Row {
        self.extra = v;
        self
    }

    /// Whether it has a target and missed it.
    pub fn missed(&self) -> bool {
        self.ratio
            .as_ref()
            .is_some_and(|r| r.target.is_some_and(|t| !t.met(r.value)))
    }

    /// The JSON line.
    pub fn json(&self) -> String {
        let mut v = serde_json::json!({
            "bench": "checkpoint",
            "case": self.case,
            "system": self.system,
        });
        if let Some(s) = self.seconds {
            v["seconds"] = s.into();
        }
        if let Some(b) = self.bytes {
            v["bytes"] = b.into();
        }
        match self.rate {
            Some(Rate::Bytes(r)) => v["bytes_per_s"] = r.into(),
            Some(Rate::Ops(r)) => v["ops_per_s"] = r.into(),
            None => {}
        }
        if let Some(r) = &self.ratio {
            v[r.field] = r.value.into();
            if let Some(t) = r.target {
                v["target"] = t.text().into();
                v["met"] = t.met(r.value).into();
            }
        }
        if let Some(n) = &self.note {
            v["note"] = n.clone().into();
        }
        if let (Some(o), Some(extra)) = (v.as_object_mut(), self.extra.as_object()) {
            for (k, x) in extra {
                o.insert(k.clone(), x.clone());
            }
        }
        v.to_string()
    }
}

/// Formats a byte count as `1.23 GiB`, `45.6 MiB`, `7.8 KiB` or `12 B`.
pub fn fmt_bytes(b: u64) -> String {
    let v = b as f64;
    if v >= (1u64 << 30) as f64 {
        format!("{:.2} GiB", v / (1u64 << 30) as f64)
    } else if v >= MIB as f64 {
        format!("{:.1} MiB", v / MIB as f64)
    } else if v >= 1024.0 {
        format!("{:.1} KiB", v / 1024.0)
    } else {
        format!("{b} B")
    }
}

/// The figures of one run.
pub struct CkptReport {
    /// Every result, in the order measured.
    pub rows: Vec<Row>,
}

impl CkptReport {
    /// The table, then each row's note.
    pub fn print(&self) {
        let cells: Vec<Vec<String>> = self
            .rows
            .iter()
            .map(|r| {
                let ratio = r.ratio.as_ref().map_or("-".into(), |x| {
                    if x.field == "extra_fraction_of_data" {
                        format!("{:.2}% of {}", x.value * 100.0, x.of)
                    } else if x.value > 0.0 && x.value < 0.01 {
                        format!("{:.4}x {}", x.value, x.of)
                    } else {
                        format!("{:.2}x {}", x.value, x.of)
                    }
                });
                let target = match r.ratio.as_ref().and_then(|x| x.target.map(|t| (x, t))) {
                    Some((x, t)) if x.field == "extra_fraction_of_data" => {
                        let pct = match t {
                            Target::AtLeast(v) => format!(">= {}%", v * 100.0),
                            Target::AtMost(v) => format!("<= {}%", v * 100.0),
                        };
                        if r.missed() {
                            format!("{pct} MISSED")
                        } else {
                            pct
                        }
                    }
                    Some((_, t)) if r.missed() => format!("{}x MISSED", t.text()),
                    Some((_, t)) => format!("{}x", t.text()),
                    None => "-".into(),
                };
                vec![
                    r.case.clone(),
                    r.system.clone(),
                    r.seconds.map_or("-".into(), |s| format!("{s:.3} s")),
                    r.bytes.map_or("-".into(), fmt_bytes),
                    match r.rate {
                        Some(Rate::Bytes(b)) => format!("{}/s", fmt_bytes(b as u64)),
                        Some(Rate::Ops(o)) => format!("{} ops/s", rate(o)),
                        None => "-".into(),
                    },
                    ratio,
                    target,
                ]
            })
            .collect();
        print_table(
            &["case", "system", "time", "size", "rate", "ratio", "target"],
            &cells,
        );
        for r in &self.rows {
            if let Some(n) = &r.note {
                println!("- {} ({}): {n}", r.case, r.system);
            }
        }
    }

    /// One JSON line per result.
    pub fn json_lines(&self) -> Vec<String> {
        self.rows.iter().map(Row::json).collect()
    }
}

/// What dd measured.
struct Disk {
    bytes: u64,
    write: Duration,
    read: Duration,
    /// Why a figure is not direct I/O, if one is not.
    write_note: Option<String>,
    read_note: Option<String>,
}

impl Disk {
    fn write_rate(&self) -> f64 {
        crate::ratio(self.bytes as f64, self.write.as_secs_f64())
    }

    fn read_rate(&self) -> f64 {
        crate::ratio(self.bytes as f64, self.read.as_secs_f64())
    }
}

/// Runs dd with `args`, timed here; its stderr when it fails.
fn dd(args: &[String]) -> Result<Duration, String> {
    let began = Instant::now();
    let out = Command::new("dd")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("cannot run dd: {e}"))?;
    let took = began.elapsed();
    if out.status.success() {
        Ok(took)
    } else {
        Err(String::from_utf8_lossy(&out.stderr).trim().to_string())
    }
}

/// Writes `mib` MiB of pseudo-random bytes to `path` (untimed): dd's
/// source. Zeros would flatter the disk: a virtual disk may store a block
/// of zeros as nothing and read it back without touching the device
/// (here reading back a file of zeros went 1.6x faster than one of
/// random bytes), while a checkpoint's bytes are anything but zeros.
fn random_source(path: &Path, mib: u64) -> Result<(), String> {
    let f = File::create(path).map_err(|e| format!("cannot create {}: {e}", path.display()))?;
    let mut w = std::io::BufWriter::new(f);
    let mut block = vec![0u8; MIB as usize];
    for i in 0..mib {
        kv_value(i.rotate_left(32), &mut block);
        w.write_all(&block)
            .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    }
    w.flush()
        .map_err(|e| format!("cannot write {}: {e}", path.display()))
}

/// dd's write (direct, fsync) and read (direct) of `mib` MiB of
/// pseudo-random bytes in `dir`, falling back to buffered I/O where
/// direct I/O is refused (tmpfs).
fn disk_rates(dir: &Path, mib: u64) -> Result<Disk, String> {
    let file = dir.join("dd.bin");
    let source = dir.join("dd-source.bin");
    random_source(&source, mib)?;
    let src = format!("if={}", source.display());
    let of = format!("of={}", file.display());
    let inf = format!("if={}", file.display());
    let count = format!("count={mib}");
    let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
    let (write, write_note) = match dd(&s(&[
        &src,
        &of,
        "bs=1M",
        &count,
        "oflag=direct",
        "conv=fsync",
    ])) {
        Ok(t) => (t, None),
        Err(why) => {
            let t = dd(&s(&[&src, &of, "bs=1M", &count, "conv=fsync"]))
                .map_err(|e| format!("dd write failed: {e}"))?;
            (
                t,
                Some(format!(
                    "buffered: dd refused oflag=direct here ({why}); fsync at the end"
                )),
            )
        }
    };
    let (read, read_note) = match dd(&s(&[&inf, "of=/dev/null", "bs=1M", "iflag=direct"])) {
        Ok(t) => (t, None),
        Err(why) => {
            drop_from_page_cache(&file)?;
            let t = dd(&s(&[&inf, "of=/dev/null", "bs=1M"]))
                .map_err(|e| format!("dd read failed: {e}"))?;
            (
                t,
                Some(format!(
                    "buffered: dd refused iflag=direct here ({why}); page cache dropped first"
                )),
            )
        }
    };
    for f in [&file, &source] {
        fs::remove_file(f).map_err(|e| format!("cannot remove {}: {e}", f.display()))?;
    }
    Ok(Disk {
        bytes: mib * MIB,
        write,
        read,
        write_note,
        read_note,
    })
}

/// Whether `dir` is on tmpfs.
fn on_tmpfs(dir: &Path) -> bool {
    rustix::fs::statfs(dir).is_ok_and(|s| s.f_type as u64 == TMPFS_MAGIC)
}

/// Syncs `file` and drops its pages from the page cache, so that the next
/// read of it comes from the disk.
fn drop_from_page_cache(file: &Path) -> Result<(), String> {
    let f = File::open(file).map_err(|e| format!("cannot open {}: {e}", file.display()))?;
    f.sync_all()
        .map_err(|e| format!("cannot sync {}: {e}", file.display()))?;
    rustix::fs::fadvise(&f, 0, None, rustix::fs::Advice::DontNeed)
        .map_err(|e| format!("cannot drop {} from the page cache: {e}", file.display()))
}

/// [`drop_from_page_cache`] for every file under `dir`; returns the
/// files' bytes.
fn drop_tree_from_page_cache(dir: &Path) -> Result<u64, String> {
    let mut bytes = 0;
    let rd = fs::read_dir(dir).map_err(|e| format!("cannot list {}: {e}", dir.display()))?;
    for e in rd {
        let e = e.map_err(|e| e.to_string())?;
        let p = e.path();
        let t = e.file_type().map_err(|e| e.to_string())?;
        if t.is_dir() {
            bytes += drop_tree_from_page_cache(&p)?;
        } else if t.is_file() {
            drop_from_page_cache(&p)?;
            bytes += e.metadata().map_err(|e| e.to_string())?.len();
        }
    }
    Ok(bytes)
}

/// Bytes of the files in `dir` (not below it): a checkpoint's size.
fn dir_bytes(dir: &Path) -> Result<u64, String> {
    let mut bytes = 0;
    for e in fs::read_dir(dir).map_err(|e| format!("cannot list {}: {e}", dir.display()))? {
        let m = e.and_then(|e| e.metadata()).map_err(|e| e.to_string())?;
        if m.is_file() {
            bytes += m.len();
        }
    }
    Ok(bytes)
}

/// Value number `i` of the kv data set: pseudo-random bytes from `i`.
pub fn kv_value(i: u64, out: &mut [u8]) {
    SmallRng::seed_from_u64(i ^ VALUE_SEED).fill_bytes(out);
}

/// Whether `v` is value number `i` of length `len`.
fn kv_value_ok(i: u64, len: usize, v: &[u8], scratch: &mut Vec<u8>) -> bool {
    scratch.resize(len, 0);
    kv_value(i, scratch);
    v == &scratch[..]
}

/// A process's resident memory, bytes (`VmRSS`); 0 once it is gone.
fn rss_of(pid: u32) -> u64 {
    fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        })
        .map_or(0, |kb| kb * 1024)
}

/// The children of process `pid` (from each process's `stat`).
fn children_of(pid: u32) -> Vec<u32> {
    let Ok(rd) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    rd.filter_map(|e| e.ok())
        .filter_map(|e| e.file_name().to_str().and_then(|n| n.parse::<u32>().ok()))
        .filter(|&p| {
            fs::read_to_string(format!("/proc/{p}/stat"))
                .ok()
                .and_then(|s| {
                    // After the command's closing parenthesis: state, ppid.
                    let rest = &s[s.rfind(')')? + 1..];
                    rest.split_whitespace().nth(1)?.parse::<u32>().ok()
                })
                == Some(pid)
        })
        .collect()
}

/// Reads the summed RSS of the processes `pids` gives every
/// [`RSS_SAMPLE_MS`] until `stop`; returns the peak and the samples taken.
fn sample_rss(stop: &AtomicBool, mut pids: impl FnMut() -> Vec<u32>) -> (u64, u64) {
    let (mut peak, mut samples) = (0u64, 0u64);
    loop {
        let sum: u64 = pids().into_iter().map(rss_of).sum();
        peak = peak.max(sum);
        samples += 1;
        if stop.load(Ordering::Acquire) {
            return (peak, samples);
        }
        std::thread::sleep(Duration::from_millis(RSS_SAMPLE_MS));
    }
}

/// Overwrites of existing keys, a batch at a time.
trait Writer: Send {
    /// Writes keys `ids` (each with its own value again).
    fn write_batch(&mut self, ids: &[u64]) -> Result<(), String>;
}

/// The writer's operations over an interval.
#[derive(Debug, Clone, Copy, Default)]
struct Served {
    ops: u64,
    seconds: f64,
}

impl Served {
    fn ops_per_s(&self) -> f64 {
        crate::ratio(self.ops as f64, self.seconds)
    }
}

/// Runs `w` on a thread of its own over random keys of `0..keys` while
/// `during` runs; the writer's operations are counted from when `during`
/// begins (after the writer's first batch) to when it returns.
fn with_writer<W: Writer, T>(
    mut w: W,
    keys: u64,
    during: impl FnOnce() -> Result<T, String>,
) -> Result<(Served, T), String> {
    let stop = AtomicBool::new(false);
    let done = AtomicU64::new(0);
    let failed: Mutex<Option<String>> = Mutex::new(None);
    std::thread::scope(|s| {
        let writer = s.spawn(|| {
            let mut rng = SmallRng::seed_from_u64(WRITER_SEED);
            let mut ids = [0u64; WRITE_BATCH_OPS];
            while !stop.load(Ordering::Relaxed) {
                for id in &mut ids {
                    *id = rng.gen_range(0..keys);
                }
                if let Err(e) = w.write_batch(&ids) {
                    *failed.lock().unwrap_or_else(|p| p.into_inner()) = Some(e);
                    break;
                }
                done.fetch_add(WRITE_BATCH_OPS as u64, Ordering::Release);
            }
            // Wakes the wait for the first batch if this one failed.
            stop.store(true, Ordering::Release);
        });
        let r = (|| {
            while done.load(Ordering::Acquire) == 0 && !stop.load(Ordering::Acquire) {
                std::thread::sleep(Duration::from_millis(1));
            }
            if done.load(Ordering::Acquire) == 0 {
                // Its own error, read below, says why.
                return Err("the writer stopped before its first batch".into());
            }
            let (t0, c0) = (Instant::now(), done.load(Ordering::Acquire));
            let out = during()?;
            let served = Served {
                ops: done.load(Ordering::Acquire) - c0,
                seconds: t0.elapsed().as_secs_f64(),
            };
            Ok((served, out))
        })();
        stop.store(true, Ordering::Release);
        let joined = writer.join();
        if let Some(e) = failed.lock().unwrap_or_else(|p| p.into_inner()).take() {
            return Err(format!("the writer failed: {e}"));
        }
        if joined.is_err() {
            return Err("the writer thread panicked".into());
        }
        r
    })
}

/// The figures one system gave.
#[derive(Debug, Default)]
struct Figures {
    /// From spawn to accepting, empty.
    empty_start: Duration,
    /// Loading the kv data set.
    load_kv: Duration,
    /// Loading the embedding rows.
    load_rows: Duration,
    /// A save with nothing else running.
    save: Duration,
    /// Its bytes on disk.
    save_bytes: u64,
    /// The writer alone.
    alone: Served,
    /// The writer during the second save.
    during: Served,
    /// The second save's time.
    busy_save: Duration,
    /// RSS just before the second save, and the peak during it.
    rss_before: u64,
    rss_peak: u64,
    /// RSS samples taken during it.
    rss_samples: u64,
    /// Redis: `rdb_last_cow_size` of the second save.
    cow_bytes: Option<u64>,
    /// From spawn to serving the saved data again.
    restore: Duration,
    /// Bytes the restore read (the checkpoint's files, the RDB).
    restore_bytes: u64,
    /// Keys and rows read back and found right.
    checked_keys: u64,
    checked_rows: u64,
}

impl Figures {
    fn extra_bytes(&self) -> u64 {
        self.rss_peak.saturating_sub(self.rss_before)
    }
}

/// A `fabrickv serve` child of this run: SIGKILLed when dropped, stopped
/// with SIGTERM by [`Server::stop`]. Not [`Child`]: a restore may take
/// minutes, past `peers::SERVER_START_TIMEOUT`, and its stop is the
/// server's own shutdown, waited for.
struct Server {
    child: std::process::Child,
    addr: String,
    log: PathBuf,
}

impl Server {
    /// Starts `fabrickv serve` for `o`'s data (`rows`: with the embedding
    /// pool) saving under `root`, restoring `restore` first if given;
    /// returns it and the time until it accepted a connection.
    fn start(
        o: &CkptOpts,
        root: &Path,
        rows: bool,
        restore: Option<&Path>,
        log: &Path,
    ) -> Result<(Server, Duration), String> {
        let exe = std::env::current_exe().map_err(|e| e.to_string())?;
        let port = free_port()?;
        let addr = format!("127.0.0.1:{port}");
        let kv_bytes = o.kv_bytes();
        let mut cmd = Command::new(exe);
        cmd.args([
            "serve",
            "--listen",
            &addr,
            "--workers",
            &o.workers.to_string(),
        ])
        // No gRPC: the default address may be another server's.
        .args(["--grpc", "off", "--log-level", "warn"])
        .args(["--memory", &CkptOpts::memory_bytes(kv_bytes).to_string()])
        .arg("--checkpoint-dir")
        .arg(root);
        if rows {
            // Not locked, zeroed or faulted in at creation: the rows'
            // pages are the pool's resident memory, as the kv items are
            // the engine's.
            cmd.args([
                "--dram-pool-gb",
                &(o.pool_mib() as f64 / 1024.0).to_string(),
                "--dram-skip-mlock",
                "--dram-skip-memset",
                "--dram-skip-populate",
            ]);
        }
        if let Some(r) = restore {
            cmd.arg("--restore").arg(r);
        }
        let err = OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .map_err(|e| format!("cannot open {}: {e}", log.display()))?;
        cmd.stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::from(err));
        let began = Instant::now();
        let child = cmd
            .spawn()
            .map_err(|e| format!("cannot start fabrickv serve: {e}"))?;
        let mut s = Server {
            child,
            addr,
            log: log.to_path_buf(),
        };
        let deadline = began + Duration::from_secs(START_TIMEOUT_S);
        loop {
            if TcpStream::connect(("127.0.0.1", port)).is_ok() {
                return Ok((s, began.elapsed()));
            }
            if let Ok(Some(st)) = s.child.try_wait() {
                return Err(format!(
                    "fabrickv serve exited at start with {st}: {}",
                    s.log_tail()
                ));
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "fabrickv serve did not listen within {START_TIMEOUT_S} s"
                ));
            }
            std::thread::sleep(Duration::from_millis(START_POLL_MS));
        }
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The last lines of its log, for an error.
    fn log_tail(&self) -> String {
        let text = fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(5)..].join(" | ")
    }

    /// SIGTERM, and waits for it to exit.
    fn stop(mut self) -> Result<(), String> {
        let pid =
            rustix::process::Pid::from_raw(self.pid() as i32).ok_or("fabrickv serve has no pid")?;
        rustix::process::kill_process(pid, rustix::process::Signal::TERM)
            .map_err(|e| format!("cannot signal fabrickv serve: {e}"))?;
        let deadline = Instant::now() + Duration::from_secs(STOP_TIMEOUT_S);
        loop {
            match self.child.try_wait() {
                Ok(Some(st)) if st.success() => return Ok(()),
                Ok(Some(st)) => {
                    return Err(format!(
                        "fabrickv serve exited with {st} on SIGTERM: {}",
                        self.log_tail()
                    ))
                }
                Ok(None) if Instant::now() > deadline => {
                    return Err(format!(
                        "fabrickv serve did not stop within {STOP_TIMEOUT_S} s of SIGTERM"
                    ))
                }
                Ok(None) => std::thread::sleep(Duration::from_millis(START_POLL_MS)),
                Err(e) => return Err(e.to_string()),
            }
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn call_timeout() -> Duration {
    Duration::from_secs(CALL_TIMEOUT_S)
}

fn connect(addr: &str) -> Result<Client, String> {
    Client::connect_with_timeout(addr, call_timeout())
        .map_err(|e| format!("cannot connect to {addr}: {e}"))
}

/// Stores the kv data set, [`LOAD_BATCH_KEYS`] keys per call.
fn load_kv(c: &mut Client, o: &CkptOpts) -> Result<(), String> {
    let vs = o.value_size;
    let mut keys: Vec<[u8; KEY_BYTES]> = Vec::new();
    let mut values = vec![0u8; LOAD_BATCH_KEYS as usize * vs];
    let mut at = 0;
    while at < o.kv_keys {
        let end = (at + LOAD_BATCH_KEYS).min(o.kv_keys);
        keys.clear();
        for (j, i) in (at..end).enumerate() {
            keys.push(herd_key(i));
            kv_value(i, &mut values[j * vs..(j + 1) * vs]);
        }
        let items: Vec<(&[u8], &[u8])> = keys
            .iter()
            .enumerate()
            .map(|(j, k)| (&k[..], &values[j * vs..(j + 1) * vs]))
            .collect();
        c.mput(&items, None)
            .map_err(|e| format!("loading kv keys {at}..{end}: {e}"))?;
        at = end;
    }
    Ok(())
}

/// FabricKV's writer: PUTs of a batch in one call.
struct FkvWriter {
    c: Client,
    value_size: usize,
    keys: Vec<[u8; KEY_BYTES]>,
    values: Vec<u8>,
}

impl FkvWriter {
    fn new(addr: &str, value_size: usize) -> Result<FkvWriter, String> {
        Ok(FkvWriter {
            c: connect(addr)?,
            value_size,
            keys: Vec::with_capacity(WRITE_BATCH_OPS),
            values: vec![0; WRITE_BATCH_OPS * value_size],
        })
    }
}

impl Writer for FkvWriter {
    fn write_batch(&mut self, ids: &[u64]) -> Result<(), String> {
        let vs = self.value_size;
        self.keys.clear();
        for (j, &i) in ids.iter().enumerate() {
            self.keys.push(herd_key(i));
            kv_value(i, &mut self.values[j * vs..(j + 1) * vs]);
        }
        let ops: Vec<BatchOp<'_>> = self
            .keys
            .iter()
            .enumerate()
            .map(|(j, k)| BatchOp::Put {
                key: k,
                value: &self.values[j * vs..(j + 1) * vs],
                ttl_ms: 0,
                cond: PutCondition::Always,
            })
            .collect();
        for o in self.c.execute(&ops).map_err(|e| e.to_string())? {
            if o.code != ErrorCode::Ok {
                return Err(format!("a PUT was refused: {:?}", o.code));
            }
        }
        Ok(())
    }
}

/// Random key numbers of `0..n` (or `1..=n` with `from_one`) for a spot
/// check, [`SPOT_CHECKS`] of them.
fn spot_ids(n: u64, from_one: bool) -> Vec<u64> {
    let mut rng = SmallRng::seed_from_u64(SPOT_SEED);
    (0..SPOT_CHECKS)
        .map(|_| rng.gen_range(0..n) + u64::from(from_one))
        .collect()
}

/// Reads back [`SPOT_CHECKS`] kv keys (and rows, with `rows`) from the
/// server at `addr`; fails on any wrong or missing one. Returns the keys
/// and rows checked.
fn spot_check_fabrickv(addr: &str, o: &CkptOpts, rows: bool) -> Result<(u64, u64), String> {
    let mut c = connect(addr)?;
    let ids = spot_ids(o.kv_keys, false);
    let keys: Vec<[u8; KEY_BYTES]> = ids.iter().map(|&i| herd_key(i)).collect();
    let got = c
        .mget(&keys)
        .map_err(|e| format!("reading keys back: {e}"))?;
    let mut scratch = Vec::new();
    for (i, v) in ids.iter().zip(&got) {
        match v {
            Some(v) if kv_value_ok(*i, o.value_size, v, &mut scratch) => {}
            Some(_) => return Err(format!("kv key {i} read back a wrong value after restore")),
            None => return Err(format!("kv key {i} is missing after restore")),
        }
    }
    if !rows || o.embedding_keys == 0 {
        return Ok((ids.len() as u64, 0));
    }
    let mut p = PsClient::connect_with_timeout(addr, call_timeout())
        .map_err(|e| format!("cannot connect to {addr}: {e}"))?;
    let t = p
        .open_table(crate::ps::BENCH_TABLE)
        .map_err(|e| format!("the embedding table after restore: {e}"))?;
    let dim = o.dim as usize;
    let mut want = vec![0f32; dim];
    let row_ids = spot_ids(o.embedding_keys, true);
    for chunk in row_ids.chunks(SPOT_PULL_KEYS) {
        let got = p
            .pull(&t, chunk)
            .map_err(|e| format!("pulling rows back: {e}"))?;
        for (j, k) in chunk.iter().enumerate() {
            if !got.found.get(j).copied().unwrap_or(false) {
                return Err(format!("embedding row {k} is missing after restore"));
            }
            crate::ps::pattern(*k, &mut want);
            let row = got.values.get(j * dim..(j + 1) * dim).unwrap_or(&[]);
            if row.len() != dim
                || row
                    .iter()
                    .zip(&want)
                    .any(|(a, b)| a.to_bits() != b.to_bits())
            {
                return Err(format!(
                    "embedding row {k} read back a wrong vector after restore"
                ));
            }
        }
    }
    Ok((ids.len() as u64, row_ids.len() as u64))
}

/// FabricKV through every step: loaded (kv keys, and rows with `rows`),
/// saved idle, the writer alone and during a save (RSS sampled), stopped,
/// restored and spot-checked. `tag` names its files under `o.dir`.
fn fabrickv_run(o: &CkptOpts, tag: &str, rows: bool) -> Result<Figures, String> {
    let root = o.dir.join(tag);
    let log = o.dir.join(format!("{tag}-server.log"));
    let rows = rows && o.embedding_keys > 0;
    let mut f = Figures::default();
    let (srv, empty_start) = Server::start(o, &root, rows, None, &log)?;
    f.empty_start = empty_start;
    let mut c = connect(&srv.addr)?;
    let t = Instant::now();
    load_kv(&mut c, o)?;
    f.load_kv = t.elapsed();
    if rows {
        let t = Instant::now();
        crate::ps::load_table(&srv.addr, o.embedding_keys, o.dim, |_| {})
            .map_err(|e| format!("loading embedding rows: {e}"))?;
        f.load_rows = t.elapsed();
    }
    let save_wait = Duration::from_secs(SAVE_WAIT_S);
    let t = Instant::now();
    let st = c
        .checkpoint_save(None, save_wait)
        .map_err(|e| format!("the idle save: {e}"))?;
    f.save = t.elapsed();
    f.save_bytes = dir_bytes(Path::new(&st.dir))?;

    let (alone, ()) = with_writer(FkvWriter::new(&srv.addr, o.value_size)?, o.kv_keys, || {
        std::thread::sleep(o.load_seconds);
        Ok(())
    })?;
    f.alone = alone;
    let pid = srv.pid();
    let (during, (busy, st, before, (peak, samples))) =
        with_writer(FkvWriter::new(&srv.addr, o.value_size)?, o.kv_keys, || {
            let stop = AtomicBool::new(false);
            std::thread::scope(|s| {
                let before = rss_of(pid);
                let sampler = s.spawn(|| sample_rss(&stop, || vec![pid]));
                let t = Instant::now();
                let st = c.checkpoint_save(None, save_wait);
                let busy = t.elapsed();
                stop.store(true, Ordering::Release);
                let rss = sampler.join().map_err(|_| "the RSS sampler panicked")?;
                let st = st.map_err(|e| format!("the save under load: {e}"))?;
                Ok((busy, st, before, rss))
            })
        })?;
    f.during = during;
    f.busy_save = busy;
    f.rss_before = before;
    f.rss_peak = peak;
    f.rss_samples = samples;

    drop(c);
    srv.stop()?;
    let ckpt = PathBuf::from(&st.dir);
    f.restore_bytes = dir_bytes(&ckpt)?;
    drop_tree_from_page_cache(&root)?;
    let (srv, restore) = Server::start(o, &root, rows, Some(&ckpt), &log)?;
    f.restore = restore;
    let (keys, rows_checked) = spot_check_fabrickv(&srv.addr, o, rows)?;
    f.checked_keys = keys;
    f.checked_rows = rows_checked;
    Ok(f)
}

/// A RESP reply, as far as this benchmark reads them.
#[derive(Debug, PartialEq)]
enum Reply {
    Status(String),
    Error(String),
    Int(i64),
    Bulk(Option<Vec<u8>>),
}

/// A RESP connection: commands appended, sent in one write, replies read
/// in order.
struct Resp {
    w: TcpStream,
    r: BufReader<TcpStream>,
    out: Vec<u8>,
    line: String,
}

impl Resp {
    fn connect(port: u16) -> Result<Resp, String> {
        let w = TcpStream::connect(("127.0.0.1", port))
            .map_err(|e| format!("cannot connect to redis on port {port}: {e}"))?;
        w.set_nodelay(true).map_err(|e| e.to_string())?;
        w.set_read_timeout(Some(call_timeout()))
            .map_err(|e| e.to_string())?;
        let r = BufReader::new(w.try_clone().map_err(|e| e.to_string())?);
        Ok(Resp {
            w,
            r,
            out: Vec::new(),
            line: String::new(),
        })
    }

    /// Appends a command.
    fn push(&mut self, args: &[&[u8]]) {
        self.out
            .extend_from_slice(format!("*{}\r\n", args.len()).as_bytes());
        for a in args {
            self.out
                .extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
            self.out.extend_from_slice(a);
            self.out.extend_from_slice(b"\r\n");
        }
    }

    /// Sends what was appended.
    fn flush(&mut self) -> Result<(), String> {
        self.w
            .write_all(&self.out)
            .map_err(|e| format!("redis write: {e}"))?;
        self.out.clear();
        Ok(())
    }

    fn reply(&mut self) -> Result<Reply, String> {
        self.line.clear();
        let n = self
            .r
            .read_line(&mut self.line)
            .map_err(|e| format!("redis read: {e}"))?;
        if n == 0 {
            return Err("redis closed the connection".into());
        }
        let l = self.line.trim_end();
        let (kind, rest) = l.split_at(l.len().min(1));
        match kind {
            "+" => Ok(Reply::Status(rest.into())),
            "-" => Ok(Reply::Error(rest.into())),
            ":" => rest
                .parse()
                .map(Reply::Int)
                .map_err(|_| format!("bad integer reply {l:?}")),
            "$" => {
                let n: i64 = rest.parse().map_err(|_| format!("bad bulk header {l:?}"))?;
                if n < 0 {
                    return Ok(Reply::Bulk(None));
                }
                let mut v = vec![0u8; n as usize + 2];
                self.r
                    .read_exact(&mut v)
                    .map_err(|e| format!("redis read: {e}"))?;
                v.truncate(n as usize);
                Ok(Reply::Bulk(Some(v)))
            }
            _ => Err(format!("unexpected redis reply {l:?}")),
        }
    }

    fn call(&mut self, args: &[&[u8]]) -> Result<Reply, String> {
        self.push(args);
        self.flush()?;
        self.reply()
    }

    /// `INFO section` as `name:value` pairs.
    fn info(&mut self, section: &str) -> Result<Vec<(String, String)>, String> {
        match self.call(&[b"INFO", section.as_bytes()])? {
            Reply::Bulk(Some(b)) => Ok(String::from_utf8_lossy(&b)
                .lines()
                .filter_map(|l| l.split_once(':'))
                .map(|(k, v)| (k.to_string(), v.trim().to_string()))
                .collect()),
            r => Err(format!("INFO {section} answered {r:?}")),
        }
    }

    fn info_field(&mut self, section: &str, name: &str) -> Result<String, String> {
        self.info(section)?
            .into_iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v)
            .ok_or_else(|| format!("INFO {section} has no {name}"))
    }

    fn dbsize(&mut self) -> Result<i64, String> {
        match self.call(&[b"DBSIZE"])? {
            Reply::Int(n) => Ok(n),
            r => Err(format!("DBSIZE answered {r:?}")),
        }
    }
}

/// `Ok` for `+OK`; the refusal or the unexpected reply otherwise.
fn expect_ok(r: Reply, what: &str) -> Result<(), String> {
    match r {
        Reply::Status(s) if s == "OK" => Ok(()),
        Reply::Error(e) => Err(format!("{what} refused: {e}")),
        r => Err(format!("{what} answered {r:?}")),
    }
}

/// Redis's writer: a batch of SETs in one write.
struct RedisWriter {
    c: Resp,
    value: Vec<u8>,
}

impl Writer for RedisWriter {
    fn write_batch(&mut self, ids: &[u64]) -> Result<(), String> {
        for &i in ids {
            kv_value(i, &mut self.value);
            self.c.push(&[b"SET", &herd_key(i), &self.value]);
        }
        self.c.flush()?;
        for _ in ids {
            expect_ok(self.c.reply()?, "SET")?;
        }
        Ok(())
    }
}

/// Stores the kv data set in Redis, [`RESP_LOAD_PIPELINE`] SETs per write.
fn load_redis(c: &mut Resp, o: &CkptOpts) -> Result<(), String> {
    let mut v = vec![0u8; o.value_size];
    let mut at = 0;
    while at < o.kv_keys {
        let end = (at + RESP_LOAD_PIPELINE).min(o.kv_keys);
        for i in at..end {
            kv_value(i, &mut v);
            c.push(&[b"SET", &herd_key(i), &v]);
        }
        c.flush()?;
        for _ in at..end {
            expect_ok(c.reply()?, "SET")?;
        }
        at = end;
    }
    Ok(())
}

/// BGSAVE, then `INFO persistence` every [`INFO_POLL_MS`] until it ended;
/// fails unless it ended well.
fn bgsave(c: &mut Resp) -> Result<(), String> {
    match c.call(&[b"BGSAVE"])? {
        Reply::Status(_) => {}
        r => return Err(format!("BGSAVE answered {r:?}")),
    }
    let deadline = Instant::now() + Duration::from_secs(SAVE_WAIT_S);
    loop {
        let info = c.info("persistence")?;
        let field = |n: &str| info.iter().find(|(k, _)| k == n).map(|(_, v)| v.as_str());
        if field("rdb_bgsave_in_progress") == Some("0") {
            return match field("rdb_last_bgsave_status") {
                Some("ok") => Ok(()),
                s => Err(format!("BGSAVE ended with rdb_last_bgsave_status {s:?}")),
            };
        }
        if Instant::now() > deadline {
            return Err(format!("BGSAVE did not end within {SAVE_WAIT_S} s"));
        }
        std::thread::sleep(Duration::from_millis(INFO_POLL_MS));
    }
}

/// Starts redis-server on `dir`'s dump.rdb; returns it, its port and the
/// time until it had loaded `keys` keys (0: until it answered).
fn start_redis(dir: &Path, keys: u64) -> Result<(Child, u16, Duration), String> {
    let d = dir.to_string_lossy();
    let began = Instant::now();
    let (child, port) = spawn_redis_with(None, &["--dir", &d, "--dbfilename", "dump.rdb"])?;
    let mut c = Resp::connect(port)?;
    let deadline = began + Duration::from_secs(START_TIMEOUT_S);
    loop {
        if c.info_field("persistence", "loading")? == "0" {
            break;
        }
        if Instant::now() > deadline {
            return Err(format!("redis did not load within {START_TIMEOUT_S} s"));
        }
        std::thread::sleep(Duration::from_millis(INFO_POLL_MS));
    }
    let n = c.dbsize()?;
    let took = began.elapsed();
    if n != keys as i64 {
        return Err(format!(
            "redis holds {n} keys after loading; {keys} were saved"
        ));
    }
    Ok((child, port, took))
}

/// SHUTDOWN NOSAVE, and waits for the connection to close.
fn stop_redis(c: &mut Resp) -> Result<(), String> {
    c.push(&[b"SHUTDOWN", b"NOSAVE"]);
    c.flush()?;
    match c.reply() {
        Err(_) => Ok(()),
        Ok(r) => Err(format!("SHUTDOWN NOSAVE answered {r:?}")),
    }
}

/// Redis through the kv steps: loaded, BGSAVE idle, the writer alone and
/// during a BGSAVE (RSS of the server and its child sampled), restarted
/// from dump.rdb and spot-checked.
fn redis_run(o: &CkptOpts) -> Result<Figures, String> {
    let dir = o.dir.join("redis");
    fs::create_dir_all(&dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    let mut f = Figures::default();
    let (child, port, empty_start) = start_redis(&dir, 0)?;
    f.empty_start = empty_start;
    let mut c = Resp::connect(port)?;
    let t = Instant::now();
    load_redis(&mut c, o)?;
    f.load_kv = t.elapsed();
    let n = c.dbsize()?;
    if n != o.kv_keys as i64 {
        return Err(format!("redis holds {n} keys; {} were set", o.kv_keys));
    }
    let rdb = dir.join("dump.rdb");
    let t = Instant::now();
    bgsave(&mut c)?;
    f.save = t.elapsed();
    f.save_bytes = fs::metadata(&rdb).map_err(|e| e.to_string())?.len();

    let writer = || -> Result<RedisWriter, String> {
        Ok(RedisWriter {
            c: Resp::connect(port)?,
            value: vec![0; o.value_size],
        })
    };
    let (alone, ()) = with_writer(writer()?, o.kv_keys, || {
        std::thread::sleep(o.load_seconds);
        Ok(())
    })?;
    f.alone = alone;
    let pid = child.pid();
    let (during, (busy, before, (peak, samples))) = with_writer(writer()?, o.kv_keys, || {
        let stop = AtomicBool::new(false);
        std::thread::scope(|s| {
            let before = rss_of(pid);
            // The BGSAVE child, once seen, is read until it is gone.
            let sampler = s.spawn(|| {
                let mut kids: Vec<u32> = Vec::new();
                sample_rss(&stop, || {
                    if kids.is_empty() {
                        kids = children_of(pid);
                    }
                    std::iter::once(pid).chain(kids.iter().copied()).collect()
                })
            });
            let t = Instant::now();
            let saved = bgsave(&mut c);
            let busy = t.elapsed();
            stop.store(true, Ordering::Release);
            let rss = sampler.join().map_err(|_| "the RSS sampler panicked")?;
            saved?;
            Ok((busy, before, rss))
        })
    })?;
    f.during = during;
    f.busy_save = busy;
    f.rss_before = before;
    f.rss_peak = peak;
    f.rss_samples = samples;
    f.cow_bytes = c
        .info_field("persistence", "rdb_last_cow_size")?
        .parse()
        .ok();

    stop_redis(&mut c)?;
    drop(child);
    f.restore_bytes = fs::metadata(&rdb).map_err(|e| e.to_string())?.len();
    drop_from_page_cache(&rdb)?;
    let (_child, port, restore) = start_redis(&dir, o.kv_keys)?;
    f.restore = restore;
    let mut c = Resp::connect(port)?;
    let ids = spot_ids(o.kv_keys, false);
    for &i in &ids {
        c.push(&[b"GET", &herd_key(i)]);
    }
    c.flush()?;
    let mut scratch = Vec::new();
    for &i in &ids {
        match c.reply()? {
            Reply::Bulk(Some(v)) if kv_value_ok(i, o.value_size, &v, &mut scratch) => {}
            r => {
                return Err(format!(
                    "redis key {i} did not read back after the restart: {:?}",
                    match r {
                        Reply::Bulk(Some(_)) => "a wrong value".to_string(),
                        r => format!("{r:?}"),
                    }
                ))
            }
        }
    }
    f.checked_keys = ids.len() as u64;
    Ok(f)
}

/// Runs the benchmark.
pub fn run(o: &CkptOpts) -> Result<CkptReport, String> {
    if o.compare && !on_path("redis-server") {
        return Err(
            "--compare needs redis-server on PATH (scripts/install-deps.sh installs it)".into(),
        );
    }
    let data = o.kv_bytes() + o.row_bytes();
    let tmpfs = on_tmpfs(&o.dir);
    let mib = data.div_ceil(MIB).max(DD_MIB_MIN);
    let disk = disk_rates(&o.dir, mib)?;
    let mut rows = vec![
        Row::new("disk write", "dd")
            .seconds(disk.write)
            .bytes(disk.bytes)
            .rate(Rate::Bytes(disk.write_rate()))
            .note(disk.write_note.clone()),
        Row::new("disk read", "dd")
            .seconds(disk.read)
            .bytes(disk.bytes)
            .rate(Rate::Bytes(disk.read_rate()))
            .note(disk.read_note.clone()),
    ];
    let page_cache_note = tmpfs.then(|| {
        "the directory is on tmpfs: its files are memory, the page cache cannot be dropped"
            .to_string()
    });

    let f = fabrickv_run(o, "fkv", true)?;
    let load = f.load_kv + f.load_rows;
    rows.push(
        Row::new("load", "fabrickv")
            .seconds(load)
            .bytes(data)
            .rate(Rate::Bytes(crate::ratio(data as f64, load.as_secs_f64())))
            .extra(serde_json::json!({
                "kv_keys": o.kv_keys,
                "value_size": o.value_size,
                "embedding_keys": o.embedding_keys,
                "dim": o.dim,
                "kv_seconds": f.load_kv.as_secs_f64(),
                "rows_seconds": f.load_rows.as_secs_f64(),
                "empty_start_seconds": f.empty_start.as_secs_f64(),
            })),
    );
    push_system_rows(
        &mut rows,
        "",
        "fabrickv",
        &f,
        data,
        &disk,
        true,
        &page_cache_note,
    );

    if o.compare {
        let k = fabrickv_run(o, "fkv-kv", false)?;
        let r = redis_run(o)?;
        let kv = o.kv_bytes();
        for (name, x) in [("fabrickv", &k), ("redis", &r)] {
            rows.push(
                Row::new("kv load", name)
                    .seconds(x.load_kv)
                    .bytes(kv)
                    .rate(Rate::Bytes(crate::ratio(
                        kv as f64,
                        x.load_kv.as_secs_f64(),
                    ))),
            );
        }
        push_system_rows(
            &mut rows,
            "kv ",
            "fabrickv",
            &k,
            kv,
            &disk,
            false,
            &page_cache_note,
        );
        push_system_rows(
            &mut rows,
            "kv ",
            "redis",
            &r,
            kv,
            &disk,
            false,
            &page_cache_note,
        );
        let vs = |case: &str, a: f64, b: f64, of: &str| {
            Row::new(case, "fabrickv/redis").ratio("ratio_vs_redis", crate::ratio(a, b), of, None)
        };
        rows.push(vs(
            "kv save vs redis",
            k.save.as_secs_f64(),
            r.save.as_secs_f64(),
            "redis time",
        ));
        rows.push(vs(
            "kv serving during save vs redis",
            k.during.ops_per_s(),
            r.during.ops_per_s(),
            "redis ops/s",
        ));
        let mut mem = vs(
            "kv extra memory during save vs redis",
            k.extra_bytes() as f64,
            r.extra_bytes() as f64,
            "redis RSS",
        );
        if let Some(cow) = r.cow_bytes {
            mem.extra = serde_json::json!({
                "ratio_vs_redis_cow": crate::ratio(k.extra_bytes() as f64, cow as f64),
            });
        }
        rows.push(mem);
        rows.push(vs(
            "kv restore vs redis",
            k.restore.as_secs_f64(),
            r.restore.as_secs_f64(),
            "redis time",
        ));
    }
    Ok(CkptReport { rows })
}

/// The rows of one system's save, serving, memory and restore figures;
/// `prefix` starts each case (`kv ` for the comparison). Targets are the
/// issue's, for the main run (`targets`); the comparison's rows carry
/// their ratios without.
#[allow(clippy::too_many_arguments)]
fn push_system_rows(
    rows: &mut Vec<Row>,
    prefix: &str,
    system: &str,
    f: &Figures,
    data: u64,
    disk: &Disk,
    targets: bool,
    page_cache_note: &Option<String>,
) {
    let t = |x: Target| targets.then_some(x);
    let case = |c: &str| format!("{prefix}{c}");
    let save_rate = crate::ratio(f.save_bytes as f64, f.save.as_secs_f64());
    rows.push(
        Row::new(&case("save"), system)
            .seconds(f.save)
            .bytes(f.save_bytes)
            .rate(Rate::Bytes(save_rate))
            .ratio(
                "ratio_vs_disk",
                crate::ratio(save_rate, disk.write_rate()),
                "dd write",
                t(Target::AtLeast(SAVE_VS_DISK_MIN)),
            ),
    );
    rows.push(
        Row::new(&case("serving without save"), system)
            .seconds(Duration::from_secs_f64(f.alone.seconds))
            .rate(Rate::Ops(f.alone.ops_per_s()))
            .extra(serde_json::json!({ "ops": f.alone.ops, "batch": WRITE_BATCH_OPS })),
    );
    let short = f.busy_save < Duration::from_millis(SHORT_SAVE_MS);
    rows.push(
        Row::new(&case("serving during save"), system)
            .seconds(Duration::from_secs_f64(f.during.seconds))
            .rate(Rate::Ops(f.during.ops_per_s()))
            .ratio(
                "ratio_vs_without_save",
                crate::ratio(f.during.ops_per_s(), f.alone.ops_per_s()),
                "without",
                t(Target::AtLeast(SERVING_DURING_SAVE_MIN)),
            )
            .note(short.then(|| {
                format!(
                    "the save took {:.0} ms, under {SHORT_SAVE_MS} ms: the rate covers {} writes",
                    f.busy_save.as_secs_f64() * 1e3,
                    f.during.ops
                )
            }))
            .extra(serde_json::json!({
                "ops": f.during.ops,
                "batch": WRITE_BATCH_OPS,
                "save_seconds": f.busy_save.as_secs_f64(),
            })),
    );
    let mut mem_extra = serde_json::json!({
        "rss_before_bytes": f.rss_before,
        "rss_peak_bytes": f.rss_peak,
        "data_bytes": data,
        "samples": f.rss_samples,
        "sample_ms": RSS_SAMPLE_MS,
    });
    let mut mem_note = None;
    if let Some(cow) = f.cow_bytes {
        mem_extra["cow_bytes"] = cow.into();
        mem_extra["cow_fraction_of_data"] = crate::ratio(cow as f64, data as f64).into();
        mem_note = Some(format!(
            "RSS of the server and its BGSAVE child, whose shared pages count twice; \
             rdb_last_cow_size (pages copied on write) {} = {:.2}% of data",
            fmt_bytes(cow),
            crate::ratio(cow as f64, data as f64) * 100.0
        ));
    }
    rows.push(
        Row::new(&case("extra memory during save"), system)
            .bytes(f.extra_bytes())
            .ratio(
                "extra_fraction_of_data",
                crate::ratio(f.extra_bytes() as f64, data as f64),
                "data",
                t(Target::AtMost(EXTRA_MEMORY_FRACTION_MAX)),
            )
            .note(mem_note)
            .extra(mem_extra),
    );
    let restore_rate = crate::ratio(f.restore_bytes as f64, f.restore.as_secs_f64());
    let start_share = crate::ratio(f.empty_start.as_secs_f64(), f.restore.as_secs_f64()) * 100.0;
    let start_note = (start_share >= EMPTY_START_NOTED_PERCENT).then(|| {
        format!(
            "{start_share:.0}% of it is what a start without a checkpoint takes ({:.0} ms)",
            f.empty_start.as_secs_f64() * 1e3
        )
    });
    let restore_note = match (page_cache_note, start_note) {
        (Some(a), Some(b)) => Some(format!("{a}; {b}")),
        (a, b) => a.clone().or(b),
    };
    rows.push(
        Row::new(&case("restore"), system)
            .seconds(f.restore)
            .bytes(f.restore_bytes)
            .rate(Rate::Bytes(restore_rate))
            .ratio(
                "ratio_vs_disk",
                crate::ratio(restore_rate, disk.read_rate()),
                "dd read",
                t(Target::AtLeast(RESTORE_VS_DISK_MIN)),
            )
            .note(restore_note)
            .extra(serde_json::json!({
                "checked_keys": f.checked_keys,
                "checked_rows": f.checked_rows,
                "empty_start_seconds": f.empty_start.as_secs_f64(),
            })),
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_check_only_against_their_own_key() {
        let mut v = vec![0; 100];
        kv_value(7, &mut v);
        let mut s = Vec::new();
        assert!(kv_value_ok(7, 100, &v, &mut s));
        assert!(!kv_value_ok(8, 100, &v, &mut s));
        v[3] ^= 1;
        assert!(!kv_value_ok(7, 100, &v, &mut s));
    }

    #[test]
    fn a_missed_target_shows_in_the_json_line() {
        let r = Row::new("save", "fabrickv").ratio(
            "ratio_vs_disk",
            0.4,
            "dd write",
            Some(Target::AtLeast(0.5)),
        );
        assert!(r.missed());
        let v: serde_json::Value = serde_json::from_str(&r.json()).expect("valid json");
        assert_eq!(v["bench"], "checkpoint");
        assert_eq!(v["ratio_vs_disk"], 0.4);
        assert_eq!(v["target"], ">= 0.5");
        assert_eq!(v["met"], false);
        let ok = Row::new("x", "y").ratio("f", 0.05, "data", Some(Target::AtMost(0.1)));
        assert!(!ok.missed());
    }

    #[test]
    fn rss_of_this_process_is_read() {
        assert!(rss_of(std::process::id()) > 0);
        assert_eq!(rss_of(u32::MAX), 0);
    }
}
