//! `fabrickv bench slabs`: how much a store keeps when value sizes shift,
//! FabricKV's store mode beside memcached in the same memory.
//!
//! The workload, the same for both over memcached's text
//! protocol, one connection, sets pipelined [`BATCH`] at a time:
//! 1. fill with values of the first size (64 B) until a write is refused;
//! 2. delete half of those keys, chosen at random (the same keys for both);
//! 3. write values of the second size (4 KiB) until refused;
//! 4. write values of the third size (512 B) until refused.
//!
//! "Refused" ends a phase only once a refused write has been retried for
//! `--retry-ms` without being stored: memcached moves pages in the
//! background (`slab_automove=1`) and may take a moment to have room, and
//! FabricKV is given the same time (its own moves are synchronous, plus
//! a background mover in its sweep).
//!
//! - **fabrickv**: `fabrickv serve --mode store --memory M --workers 1
//!   --memcache ADDR` (this binary, a child process);
//! - **memcached**: `memcached -m M -M -o slab_reassign,slab_automove=1
//!   -t 1`, which refuses (`-M`) instead of evicting.
//!
//! Reported per phase: writes stored, writes refused (keys refused at
//! least once, then stored on a retry or not), live value bytes (from this
//! client's own count of stored sets minus deletes; FabricKV's `bytes`
//! stat, keys plus values, and both servers' `curr_items` are checked
//! against that count), and for FabricKV the largest free fraction of its
//! memory (`fabrickv_slab_free_bytes` / `limit_maxbytes`) seen at a
//! refusal. At the end every live key is read back and compared. A table,
//! and with `--json` one JSON line per system and phase plus one with the
//! ratio of live value bytes, FabricKV over memcached.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use clap::Args;
use rand::rngs::SmallRng;
use rand::seq::SliceRandom;
use rand::SeedableRng;
use serde_json::json;

use crate::memcache::proto::key_of;
use crate::peers::{self, Child};
use crate::report::print_table;

#[derive(Args)]
pub struct SlabsArgs {
    /// Memory of each server, e.g. 64MB (FabricKV's --memory, memcached's -m).
    #[arg(long, default_value = "64MB")]
    memory: String,
    /// Value sizes of the three write phases, in bytes; half of the first
    /// phase's keys are deleted before the second.
    #[arg(long, default_value = "64,4096,512")]
    sizes: String,
    /// How long a refused write is retried before its phase ends, in ms:
    /// memcached's automove frees a page only after a class has stayed
    /// too free over its window (about 30 s), so 10 s is too short for it.
    #[arg(long, default_value_t = 60_000)]
    retry_ms: u64,
    /// Seed of the choice of keys deleted.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Leave memcached out.
    #[arg(long)]
    no_memcached: bool,
    /// CPUs of the servers, taskset syntax.
    #[arg(long)]
    server_cpus: Option<String>,
    /// Print one JSON object per result as well.
    #[arg(long)]
    json: bool,
}

/// Sets sent before their replies are read.
const BATCH: usize = 32;

/// Keys asked for in one `get`.
const GET_KEYS: usize = 32;

/// Pause between retries of a refused write.
const RETRY_PAUSE: Duration = Duration::from_millis(20);

/// How long one reply may take before the run fails.
const IO_TIMEOUT: Duration = Duration::from_secs(30);

/// Bytes of every key (`key:%012d`).
const KEY_BYTES: u64 = 16;

/// One memcached text-protocol connection.
struct Conn {
    r: BufReader<TcpStream>,
    w: TcpStream,
    line: Vec<u8>,
}

impl Conn {
    fn open(port: u16) -> Result<Conn, String> {
        let s = TcpStream::connect(("127.0.0.1", port)).map_err(|e| e.to_string())?;
        s.set_nodelay(true).map_err(|e| e.to_string())?;
        s.set_read_timeout(Some(IO_TIMEOUT))
            .map_err(|e| e.to_string())?;
        let w = s.try_clone().map_err(|e| e.to_string())?;
        Ok(Conn {
            r: BufReader::new(s),
            w,
            line: Vec::new(),
        })
    }

    /// Reads one reply line, without its `\r\n`.
    fn read_line(&mut self) -> Result<&[u8], String> {
        self.line.clear();
        self.r
            .read_until(b'\n', &mut self.line)
            .map_err(|e| format!("reading a reply: {e}"))?;
        if !self.line.ends_with(b"\r\n") {
            return Err("connection closed mid-reply".into());
        }
        self.line.truncate(self.line.len() - 2);
        Ok(&self.line)
    }

    /// Sets key `id` to [`value_of`]`(id, size)` for each of `ids`, in one
    /// write; whether each was stored (`false`: refused with
    /// `SERVER_ERROR`).
    fn set_many(&mut self, ids: &[u64], size: usize) -> Result<Vec<bool>, String> {
        let mut out = Vec::with_capacity(ids.len() * (size + 48));
        let mut key = Vec::new();
        for &id in ids {
            key_of(id, &mut key);
            out.extend_from_slice(b"set ");
            out.extend_from_slice(&key);
            out.extend_from_slice(format!(" 0 0 {size}\r\n").as_bytes());
            out.extend_from_slice(&value_of(id, size));
            out.extend_from_slice(b"\r\n");
        }
        self.w.write_all(&out).map_err(|e| e.to_string())?;
        let mut stored = Vec::with_capacity(ids.len());
        for _ in ids {
            let l = self.read_line()?;
            if l == b"STORED" {
                stored.push(true);
            } else if l.starts_with(b"SERVER_ERROR") {
                stored.push(false);
            } else {
                return Err(format!("set: {}", String::from_utf8_lossy(l)));
            }
        }
        Ok(stored)
    }

    /// Deletes the keys of `ids`; each must have been there.
    fn delete_many(&mut self, ids: &[u64]) -> Result<(), String> {
        let mut out = Vec::new();
        let mut key = Vec::new();
        for &id in ids {
            key_of(id, &mut key);
            out.extend_from_slice(b"delete ");
            out.extend_from_slice(&key);
            out.extend_from_slice(b"\r\n");
        }
        self.w.write_all(&out).map_err(|e| e.to_string())?;
        for _ in ids {
            let l = self.read_line()?;
            if l != b"DELETED" {
                return Err(format!("delete: {}", String::from_utf8_lossy(l)));
            }
        }
        Ok(())
    }

    /// Reads back the keys of `ids` (of `sizes`); how many are missing or
    /// hold another value.
    fn check_many(&mut self, ids: &[(u64, usize)]) -> Result<u64, String> {
        let mut out = b"get".to_vec();
        let mut key = Vec::new();
        for &(id, _) in ids {
            key_of(id, &mut key);
            out.push(b' ');
            out.extend_from_slice(&key);
        }
        out.extend_from_slice(b"\r\n");
        self.w.write_all(&out).map_err(|e| e.to_string())?;
        let mut found = std::collections::HashMap::new();
        loop {
            let l = self.read_line()?.to_vec();
            if l == b"END" {
                break;
            }
            let f: Vec<&[u8]> = l.split(|&b| b == b' ').collect();
            if f.len() < 4 || f[0] != b"VALUE" {
                return Err(format!("get: {}", String::from_utf8_lossy(&l)));
            }
            let n: usize = std::str::from_utf8(f[3])
                .ok()
                .and_then(|s| s.parse().ok())
                .ok_or("get: bad length")?;
            let mut data = vec![0u8; n + 2];
            self.r.read_exact(&mut data).map_err(|e| e.to_string())?;
            data.truncate(n);
            found.insert(f[1].to_vec(), data);
        }
        let mut wrong = 0;
        for &(id, size) in ids {
            key_of(id, &mut key);
            if found.get(&key) != Some(&value_of(id, size)) {
                wrong += 1;
            }
        }
        Ok(wrong)
    }

    /// `stats`: the value of each `STAT name value` line.
    fn stats(&mut self) -> Result<std::collections::HashMap<String, String>, String> {
        self.w.write_all(b"stats\r\n").map_err(|e| e.to_string())?;
        let mut m = std::collections::HashMap::new();
        loop {
            let l = String::from_utf8_lossy(self.read_line()?).into_owned();
            if l == "END" {
                return Ok(m);
            }
            let mut f = l.splitn(3, ' ');
            if let (Some("STAT"), Some(k), Some(v)) = (f.next(), f.next(), f.next()) {
                m.insert(k.to_string(), v.to_string());
            }
        }
    }

    fn stat(&mut self, name: &str) -> Result<u64, String> {
        self.stats()?
            .get(name)
            .and_then(|v| v.parse().ok())
            .ok_or_else(|| format!("no stat {name}"))
    }
}

/// The value of key `id` with `size` bytes: differs from key to key.
fn value_of(id: u64, size: usize) -> Vec<u8> {
    let seed = id.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    (0..size)
        .map(|i| b'a' + ((seed >> ((i % 8) * 8)) as u8 ^ i as u8) % 26)
        .collect()
}

/// What one phase did on one system.
#[derive(Debug, Clone)]
struct Phase {
    name: String,
    /// Writes stored (or keys deleted, for the delete phase).
    stored: u64,
    /// Keys refused at least once.
    refused: u64,
    /// Refused writes retried without success when the phase ended.
    given_up: u64,
    /// Live value bytes after the phase (this client's count).
    value_bytes: u64,
    /// Live items after the phase.
    items: u64,
    /// FabricKV: free fraction of its memory at each refusal seen.
    free_at_refusal: Vec<f64>,
    /// Whether the server's counters agreed with this client's.
    counters_agree: bool,
}

impl Phase {
    /// A phase with nothing counted yet.
    fn new(name: &str) -> Phase {
        Phase {
            name: name.into(),
            stored: 0,
            refused: 0,
            given_up: 0,
            value_bytes: 0,
            items: 0,
            free_at_refusal: Vec::new(),
            counters_agree: true,
        }
    }
}

/// One system under test.
struct Sys {
    name: &'static str,
    conn: Conn,
    /// Memory given, bytes.
    memory: u64,
    _child: Child,
}

impl Sys {
    fn is_fabrickv(&self) -> bool {
        self.name == "fabrickv"
    }

    /// The free fraction of FabricKV's memory now (none for memcached).
    fn free_fraction(&mut self) -> Result<Option<f64>, String> {
        if !self.is_fabrickv() {
            return Ok(None);
        }
        let free = self.conn.stat("fabrickv_slab_free_bytes")?;
        Ok(Some(free as f64 / self.memory as f64))
    }
}

/// Live keys: (key number, value size).
type Live = Vec<(u64, usize)>;

fn fill(
    sys: &mut Sys,
    name: &str,
    size: usize,
    next_id: &mut u64,
    live: &mut Live,
    retry: Duration,
) -> Result<Phase, String> {
    let mut p = Phase::new(name);
    'phase: loop {
        let ids: Vec<u64> = (*next_id..*next_id + BATCH as u64).collect();
        *next_id += BATCH as u64;
        let ok = sys.conn.set_many(&ids, size)?;
        let mut pending = Vec::new();
        for (&id, stored) in ids.iter().zip(ok) {
            if stored {
                live.push((id, size));
                p.stored += 1;
            } else {
                pending.push(id);
            }
        }
        if pending.is_empty() {
            continue;
        }
        p.refused += pending.len() as u64;
        if let Some(f) = sys.free_fraction()? {
            p.free_at_refusal.push(f);
        }
        // Retry the refused keys, in order, for at most `retry` each.
        pending.reverse();
        let mut deadline = Instant::now() + retry;
        while let Some(&id) = pending.last() {
            if sys.conn.set_many(&[id], size)?[0] {
                live.push((id, size));
                p.stored += 1;
                pending.pop();
                deadline = Instant::now() + retry;
                continue;
            }
            if Instant::now() >= deadline {
                p.given_up = pending.len() as u64;
                if let Some(f) = sys.free_fraction()? {
                    p.free_at_refusal.push(f);
                }
                break 'phase;
            }
            std::thread::sleep(RETRY_PAUSE);
        }
    }
    finish(sys, &mut p, live)?;
    Ok(p)
}

/// Fills in the phase's totals and checks the server's counters.
fn finish(sys: &mut Sys, p: &mut Phase, live: &Live) -> Result<(), String> {
    p.value_bytes = live.iter().map(|&(_, s)| s as u64).sum();
    p.items = live.len() as u64;
    let st = sys.conn.stats()?;
    let get = |k: &str| st.get(k).and_then(|v| v.parse::<u64>().ok());
    p.counters_agree = get("curr_items") == Some(p.items);
    if sys.is_fabrickv() {
        p.counters_agree &= get("bytes") == Some(p.value_bytes + p.items * KEY_BYTES);
    }
    Ok(())
}

fn run_system(
    sys: &mut Sys,
    sizes: &[usize],
    seed: u64,
    retry: Duration,
) -> Result<(Vec<Phase>, u64), String> {
    let mut live = Live::new();
    let mut next_id = 0;
    let mut phases = Vec::new();
    let first = fill(
        sys,
        &format!("{} B", sizes[0]),
        sizes[0],
        &mut next_id,
        &mut live,
        retry,
    )?;
    phases.push(first);
    // Delete half of the keys at random (a seeded shuffle, so both systems
    // lose the same ones).
    live.shuffle(&mut SmallRng::seed_from_u64(seed));
    let gone: Vec<u64> = live.drain(..live.len() / 2).map(|(id, _)| id).collect();
    for chunk in gone.chunks(BATCH) {
        sys.conn.delete_many(chunk)?;
    }
    let mut del = Phase {
        stored: gone.len() as u64,
        ..Phase::new("delete half")
    };
    finish(sys, &mut del, &live)?;
    phases.push(del);
    for &size in &sizes[1..] {
        let p = fill(
            sys,
            &format!("{size} B"),
            size,
            &mut next_id,
            &mut live,
            retry,
        )?;
        phases.push(p);
    }
    let mut wrong = 0;
    for chunk in live.chunks(GET_KEYS) {
        wrong += sys.conn.check_many(chunk)?;
    }
    Ok((phases, wrong))
}

fn spawn_fabrickv(cpus: Option<&str>, memory: &str) -> Result<(Child, u16), String> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let port = peers::free_port()?;
    let mc = peers::free_port()?;
    let mut cmd = peers::pinned(cpus, &exe.to_string_lossy());
    cmd.args(["serve", "--listen", &format!("127.0.0.1:{port}")]);
    cmd.args(["--workers", "1", "--mode", "store", "--memory", memory]);
    cmd.args(["--memcache", &format!("127.0.0.1:{mc}")]);
    cmd.args(["--log-level", "warn", "--grpc", "off"]);
    let c = peers::spawn_server(cmd, "fabrickv", mc)?;
    Ok((c, mc))
}

fn spawn_memcached(cpus: Option<&str>, memory_mb: u64) -> Result<(Child, u16), String> {
    let port = peers::free_port()?;
    let mut cmd = peers::pinned(cpus, "memcached");
    cmd.args([
        "-p",
        &port.to_string(),
        "-l",
        "127.0.0.1",
        "-U",
        "0",
        "-t",
        "1",
    ]);
    cmd.args(["-m", &memory_mb.to_string(), "-M"]);
    cmd.args(["-o", "slab_reassign,slab_automove=1"]);
    if fabrickv_cluster::local::effective_uid() == Some(0) {
        cmd.args(["-u", "root"]);
    }
    let c = peers::spawn_server(cmd, "memcached", port)?;
    Ok((c, port))
}

fn pct(f: f64) -> String {
    format!("{:.2}%", f * 100.0)
}

/// Runs the benchmark.
pub fn run(a: SlabsArgs) -> Result<(), String> {
    let memory = fabrickv_types::size::parse_size(&a.memory).map_err(|e| e.to_string())?;
    if memory % (1 << 20) != 0 || memory == 0 {
        return Err("--memory must be a whole number of MiB (memcached's -m)".into());
    }
    let sizes: Vec<usize> = a
        .sizes
        .split(',')
        .map(|s| {
            s.trim()
                .parse::<usize>()
                .map_err(|e| format!("--sizes: {e}"))
        })
        .collect::<Result<_, _>>()?;
    if sizes.len() < 2 || sizes.iter().any(|&s| s == 0 || s > 512 << 10) {
        return Err("--sizes: at least two sizes, each 1 B to 512 KiB".into());
    }
    let retry = Duration::from_millis(a.retry_ms);
    let cpus = a.server_cpus.as_deref();
    let mut systems = Vec::new();
    let (child, port) = spawn_fabrickv(cpus, &a.memory)?;
    systems.push(Sys {
        name: "fabrickv",
        conn: Conn::open(port)?,
        memory,
        _child: child,
    });
    if !a.no_memcached {
        if !peers::on_path("memcached") {
            return Err("memcached is not on PATH (make deps), or pass --no-memcached".into());
        }
        let (child, port) = spawn_memcached(cpus, memory >> 20)?;
        systems.push(Sys {
            name: "memcached",
            conn: Conn::open(port)?,
            memory,
            _child: child,
        });
    }
    let mut rows = Vec::new();
    let mut json_lines = Vec::new();
    let mut finals = Vec::new();
    for sys in &mut systems {
        let started = Instant::now();
        let (phases, wrong) = run_system(sys, &sizes, a.seed, retry)?;
        let seconds = started.elapsed().as_secs_f64();
        let moved = if sys.is_fabrickv() {
            let st = sys.conn.stats()?;
            let g = |k: &str| st.get(k).cloned().unwrap_or_default();
            format!(
                "{} pages, {} items",
                g("slabs_moved"),
                g("slab_reassign_rescues")
            )
        } else {
            let st = sys.conn.stats()?;
            format!(
                "{} pages",
                st.get("slabs_moved").cloned().unwrap_or_default()
            )
        };
        for p in &phases {
            let worst = p
                .free_at_refusal
                .iter()
                .copied()
                .fold(None, |m: Option<f64>, f| Some(m.map_or(f, |m| m.max(f))));
            rows.push(vec![
                sys.name.to_string(),
                p.name.clone(),
                p.stored.to_string(),
                format!("{} ({} given up)", p.refused, p.given_up),
                p.items.to_string(),
                format!("{:.2} MiB", p.value_bytes as f64 / f64::from(1 << 20)),
                worst.map_or("-".into(), pct),
                if p.counters_agree { "yes" } else { "NO" }.into(),
            ]);
            json_lines.push(json!({
                "bench": "slabs",
                "system": sys.name,
                "phase": p.name,
                "memory_bytes": memory,
                "stored": p.stored,
                "refused": p.refused,
                "given_up": p.given_up,
                "items": p.items,
                "value_bytes": p.value_bytes,
                "free_fraction_at_refusals": p.free_at_refusal,
                "free_fraction_at_refusal_max": worst,
                "counters_agree": p.counters_agree,
            }));
        }
        let last = phases.last().map_or(0, |p| p.value_bytes);
        let refusals_over_10pct = phases
            .iter()
            .flat_map(|p| &p.free_at_refusal)
            .filter(|&&f| f > 0.10)
            .count();
        println!(
            "{}: {:.1} s, moved {moved}, {wrong} wrong or missing values at the end",
            sys.name, seconds
        );
        finals.push((sys.name, last, wrong, refusals_over_10pct));
    }
    print_table(
        &[
            "system",
            "phase",
            "stored",
            "refused",
            "items",
            "value bytes",
            "max free at refusal",
            "counters agree",
        ],
        &rows,
    );
    let fkv = finals.iter().find(|f| f.0 == "fabrickv").map_or(0, |f| f.1);
    let mc = finals.iter().find(|f| f.0 == "memcached").map(|f| f.1);
    let ratio = mc.map(|m| fkv as f64 / m.max(1) as f64);
    if let Some(r) = ratio {
        println!("value bytes stored at the end, fabrickv / memcached: {r:.3}");
    }
    let wrong: u64 = finals.iter().map(|f| f.2).sum();
    let over = finals.iter().find(|f| f.0 == "fabrickv").map_or(0, |f| f.3);
    if a.json {
        for l in &json_lines {
            println!("{l}");
        }
        println!(
            "{}",
            json!({
                "bench": "slabs",
                "system": "summary",
                "memory_bytes": memory,
                "sizes": sizes,
                "fabrickv_value_bytes": fkv,
                "memcached_value_bytes": mc,
                "ratio_fabrickv_over_memcached": ratio,
                "fabrickv_refusals_with_over_10pct_free": over,
                "wrong_values": wrong,
            })
        );
    }
    if wrong > 0 {
        return Err(format!("{wrong} values read back wrong or missing"));
    }
    Ok(())
}
