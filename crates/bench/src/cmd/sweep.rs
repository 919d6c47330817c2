//! Multi-client sweeps, shared by `bench ps --clients` and `bench herd
//! --clients`: the parent starts N client processes of this binary, they
//! meet at a named barrier in a memcached registry (as PetPS's clients
//! meet at memcached barriers), each measures its `--duration` from its
//! release, prints one JSON line, and the parent sums the lines.
//!
//! The barrier's waiters poll its count, starting at 1 ms and doubling up
//! to [`BARRIER_POLL_MAX_MS`], so the clients are released within about
//! that long of the last arrival. Each client reports when it was
//! released (`start_unix_ns`); the parent logs and reports the spread as
//! `start_skew_ms`.

use std::io::Read;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use clap::Args;
use fabrickv_cluster::local::LocalMemcached;
use fabrickv_cluster::registry::BARRIER_POLL_MAX_MS;
use fabrickv_cluster::{check_name, Registry};

/// How long a client waits at the barrier for the others (they start,
/// connect and warm up first), in seconds.
pub const BARRIER_TIMEOUT_S: u64 = 120;

/// How often the parent looks for a client that exited, in milliseconds.
const CHILD_POLL_MS: u64 = 10;

/// Flags of a sweep: the registry (parent and children) and the barrier a
/// child meets the others at.
#[derive(Args, Clone, Debug)]
pub struct SweepArgs {
    /// memcached registry the client processes of --clients meet at
    /// (memcached://HOST:PORT); without it a memcached is started on
    /// loopback for the sweep.
    #[arg(long)]
    pub registry: Option<String>,
    /// Cluster name the sweep's barriers are kept under in the registry.
    #[arg(long, default_value = "bench")]
    pub cluster: String,
    /// Barrier to meet the other clients at before measuring (children of a sweep).
    #[arg(long, hide = true, requires = "registry")]
    pub barrier: Option<String>,
    /// Processes that meet at --barrier.
    #[arg(long, hide = true, default_value_t = 1)]
    pub barrier_count: u64,
    /// Print only the final JSON line (children of a sweep).
    #[arg(long, hide = true)]
    pub child: bool,
}

/// Nanoseconds since the Unix epoch, now.
fn unix_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

/// A child's start gate: the barrier, if it has one, connected before the
/// run so that connecting is not part of the wait.
pub struct Gate {
    barrier: Option<(Registry, String, u64)>,
    /// When the gate let this process go (Unix nanoseconds); 0 before.
    pub started_unix_ns: u64,
}

impl Gate {
    /// Waits at the barrier (if any) and records the release.
    pub fn pass(&mut self) -> Result<(), String> {
        if let Some((registry, name, count)) = &self.barrier {
            registry
                .barrier(name, *count, Duration::from_secs(BARRIER_TIMEOUT_S))
                .map_err(|e| e.to_string())?;
        }
        self.started_unix_ns = unix_ns();
        Ok(())
    }

    /// The JSON line of a child's result with its release time added.
    pub fn line(&self, mut v: serde_json::Value) -> String {
        v["start_unix_ns"] = self.started_unix_ns.into();
        v.to_string()
    }
}

impl SweepArgs {
    /// This process's start gate: the barrier of --barrier, or none.
    pub fn gate(&self) -> Result<Gate, String> {
        let barrier = match (&self.barrier, &self.registry) {
            (Some(name), Some(url)) => {
                let r = Registry::connect(url, &self.cluster).map_err(|e| e.to_string())?;
                Some((r, name.clone(), self.barrier_count))
            }
            (Some(_), None) => return Err("--barrier needs --registry".into()),
            (None, _) => None,
        };
        Ok(Gate {
            barrier,
            started_unix_ns: 0,
        })
    }
}

/// A child's command line: `command` (e.g. `bench ps --server ADDR`),
/// then each flag and its value, then `--client-cpus` when given.
pub fn child_args(
    command: &[&str],
    flags: &[(&str, String)],
    client_cpus: Option<&str>,
) -> Vec<String> {
    let cpus = client_cpus.map(|c| ("--client-cpus", c.to_string()));
    command
        .iter()
        .map(|s| s.to_string())
        .chain(
            flags
                .iter()
                .cloned()
                .chain(cpus)
                .flat_map(|(f, v)| [f.to_string(), v]),
        )
        .collect()
}

/// Checks the client counts of `--clients`.
pub fn check_counts(counts: &[usize]) -> Result<(), String> {
    if counts.contains(&0) {
        return Err("--clients counts must be at least 1".into());
    }
    Ok(())
}

/// The parent of a sweep: the registry its children meet at.
pub struct Sweep {
    _local: Option<LocalMemcached>,
    registry: String,
    cluster: String,
    exe: PathBuf,
    tag: String,
}

/// What the N clients of one step printed.
pub struct Clients {
    /// Each client's JSON line, in spawn order (only when all succeeded).
    pub lines: Vec<serde_json::Value>,
    /// Why the step failed: a client exited with an error or printed no
    /// result.
    pub failure: Option<String>,
    /// Last release minus first, in milliseconds.
    pub start_skew_ms: f64,
}

impl Clients {
    /// The sum of a number field of every line.
    pub fn sum(&self, key: &str) -> f64 {
        // Folded from +0.0: an empty f64 sum is -0.0, printed "-0.0000".
        self.lines
            .iter()
            .filter_map(|v| v[key].as_f64())
            .fold(0.0, |a, b| a + b)
    }

    /// The sum of a count field of every line.
    pub fn sum_u64(&self, key: &str) -> u64 {
        self.lines.iter().filter_map(|v| v[key].as_u64()).sum()
    }
}

impl Sweep {
    /// Connects to `--registry` or starts a memcached on loopback. `bench`
    /// names the sweep's barriers (with this process's id).
    pub fn start(a: &SweepArgs, bench: &str) -> Result<Sweep, String> {
        check_name("cluster", &a.cluster)?;
        let (local, registry) = match &a.registry {
            Some(url) => (None, url.clone()),
            None => {
                let m = LocalMemcached::start()?;
                let url = m.url();
                (Some(m), url)
            }
        };
        // Fail here, not in every child, when the registry is unreachable.
        Registry::connect(&registry, &a.cluster).map_err(|e| e.to_string())?;
        eprintln!(
            "clients meet at barriers in {registry} (cluster {}); released within about {BARRIER_POLL_MAX_MS} ms of the last arrival",
            a.cluster
        );
        Ok(Sweep {
            _local: local,
            registry,
            cluster: a.cluster.clone(),
            exe: std::env::current_exe().map_err(|e| e.to_string())?,
            tag: format!("{bench}-{}", std::process::id()),
        })
    }

    /// Runs `n` clients of this binary with `args` (the benchmark's child
    /// command line), meeting at a barrier named after `step`, and returns
    /// their lines. When one client fails the others are stopped.
    pub fn run(&self, step: &str, n: usize, args: &[String]) -> Result<Clients, String> {
        let barrier = format!("{}-{step}", self.tag);
        check_name("barrier", &barrier)?;
        let mut children = Vec::with_capacity(n);
        for _ in 0..n {
            let mut cmd = Command::new(&self.exe);
            cmd.args(args)
                .args(["--child", "--registry", &self.registry])
                .args(["--cluster", &self.cluster, "--barrier", &barrier])
                .args(["--barrier-count", &n.to_string()])
                .stdin(Stdio::null())
                .stdout(Stdio::piped());
            match cmd.spawn() {
                Ok(c) => children.push(Running::new(c)),
                Err(e) => {
                    stop_all(&mut children);
                    return Err(format!("cannot start a client: {e}"));
                }
            }
        }
        let failure = wait_all(&mut children);
        let mut lines = Vec::with_capacity(n);
        let mut failure = failure.map(|(i, why)| format!("client {i} {why}"));
        for (i, c) in children.into_iter().enumerate() {
            let out = c.output();
            if failure.is_some() {
                continue;
            }
            let last = out.lines().last().unwrap_or_default();
            match serde_json::from_str::<serde_json::Value>(last) {
                Ok(v) if v["start_unix_ns"].as_u64().is_some() => lines.push(v),
                _ => failure = Some(format!("client {i} printed no result")),
            }
        }
        if failure.is_some() {
            lines.clear();
        }
        let starts = lines.iter().filter_map(|v| v["start_unix_ns"].as_u64());
        let (first, last) = starts.fold((u64::MAX, 0), |(a, b), s| (a.min(s), b.max(s)));
        let start_skew_ms = last.saturating_sub(first) as f64 / 1e6;
        match &failure {
            None => eprintln!(
                "{n} client(s) at barrier {barrier}: measured starts within {start_skew_ms:.3} ms"
            ),
            Some(f) => eprintln!("{n} client(s) at barrier {barrier}: {f}"),
        }
        Ok(Clients {
            lines,
            failure,
            start_skew_ms,
        })
    }
}

/// A client process and the thread that reads its standard output.
struct Running {
    child: Child,
    reader: Option<std::thread::JoinHandle<String>>,
    done: bool,
}

impl Running {
    fn new(mut child: Child) -> Running {
        let reader = child.stdout.take().map(|mut out| {
            std::thread::spawn(move || {
                let mut s = String::new();
                let _ = out.read_to_string(&mut s);
                s
            })
        });
        Running {
            child,
            reader,
            done: false,
        }
    }

    /// What it printed (after it exited).
    fn output(mut self) -> String {
        self.reader
            .take()
            .and_then(|r| r.join().ok())
            .unwrap_or_default()
    }
}

/// Kills and reaps clients still running.
fn stop_all(children: &mut [Running]) {
    for c in children.iter_mut().filter(|c| !c.done) {
        let _ = c.child.kill();
        let _ = c.child.wait();
        c.done = true;
    }
}

/// Waits for every client; the first to fail (its index and why) stops
/// the rest, which would otherwise wait at the barrier until it times out.
fn wait_all(children: &mut [Running]) -> Option<(usize, String)> {
    loop {
        let mut running = 0;
        let mut failed = None;
        for (i, c) in children.iter_mut().enumerate().filter(|(_, c)| !c.done) {
            match c.child.try_wait() {
                Ok(Some(status)) => {
                    c.done = true;
                    if !status.success() {
                        failed = Some((i, format!("exited with {status}")));
                        break;
                    }
                }
                Ok(None) => running += 1,
                Err(e) => {
                    failed = Some((i, format!("could not be waited for: {e}")));
                    break;
                }
            }
        }
        if failed.is_some() {
            stop_all(children);
            return failed;
        }
        if running == 0 {
            return None;
        }
        std::thread::sleep(Duration::from_millis(CHILD_POLL_MS));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn child_args_put_flags_after_the_command() {
        let a = child_args(
            &["bench", "ps"],
            &[("--duration", "0.5".into()), ("--dist", "zipf".into())],
            Some("1,3"),
        );
        assert_eq!(
            a,
            [
                "bench",
                "ps",
                "--duration",
                "0.5",
                "--dist",
                "zipf",
                "--client-cpus",
                "1,3"
            ]
        );
        assert_eq!(child_args(&["x"], &[], None), ["x"]);
    }

    #[test]
    fn sums_lines_and_an_empty_sum_is_plus_zero() {
        let c = Clients {
            lines: vec![
                serde_json::json!({ "mkv_s": 1.5, "checked": 10 }),
                serde_json::json!({ "mkv_s": 2.0, "checked": 5 }),
            ],
            failure: None,
            start_skew_ms: 0.0,
        };
        assert_eq!(c.sum("mkv_s"), 3.5);
        assert_eq!(c.sum_u64("checked"), 15);
        let none = Clients {
            lines: Vec::new(),
            failure: Some("client 0 exited".into()),
            start_skew_ms: 0.0,
        };
        assert_eq!(format!("{:.4}", none.sum("mkv_s")), "0.0000");
    }

    #[test]
    fn counts_must_be_positive() {
        assert!(check_counts(&[2, 4, 8]).is_ok());
        assert!(check_counts(&[2, 0]).is_err());
    }
}
