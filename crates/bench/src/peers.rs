//! Peers and limits measured in the same run: starting servers pinned to
//! given CPUs (with `taskset`), waiting for their port, and driving
//! `redis-benchmark`.

use std::net::{TcpListener, TcpStream};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// How long a spawned server may take to open its port.
pub const SERVER_START_TIMEOUT: Duration = Duration::from_secs(10);

/// A child process killed when dropped.
pub struct Child {
    child: std::process::Child,
    /// What it is, for messages.
    pub name: String,
}

impl Child {
    /// The process id. Servers are started as `taskset -c CPUS program`,
    /// and taskset execs the program, so this is the server's own pid (for
    /// [`crate::cpu::CpuMeter`]).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for Child {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A FabricKV server started for a benchmark (`fabrickv serve` as a
/// child process); killed when dropped.
pub struct ServerProcess {
    /// The child process.
    pub child: Child,
    /// Its data-plane address.
    pub addr: String,
}

/// Whether `program` is an executable file on `PATH`: tests that need a
/// peer (redis-server, memcached) skip where it is not installed.
pub fn on_path(program: &str) -> bool {
    std::env::var_os("PATH")
        .is_some_and(|p| std::env::split_paths(&p).any(|d| d.join(program).is_file()))
}

/// A free loopback port (bound then released).
pub fn free_port() -> Result<u16, String> {
    let l = TcpListener::bind("127.0.0.1:0").map_err(|e| e.to_string())?;
    Ok(l.local_addr().map_err(|e| e.to_string())?.port())
}

/// Builds a command, under `taskset -c CPUS` when `cpus` is given.
pub fn pinned(cpus: Option<&str>, program: &str) -> Command {
    match cpus {
        Some(c) => {
            let mut cmd = Command::new("taskset");
            cmd.arg("-c").arg(c).arg(program);
            cmd
        }
        None => Command::new(program),
    }
}

/// Where a `fabrickv serve` started by a benchmark listens: a free
/// loopback port for tcp and fabric (with `provider`), or a shm name
/// unique to this process and `tag`.
pub fn fabrickv_listen_addr(transport: &str, provider: &str, tag: &str) -> Result<String, String> {
    Ok(match transport {
        "tcp" => format!("127.0.0.1:{}", free_port()?),
        "shm" => format!(
            "shm://fkv-bench-{tag}-{}-{}",
            std::process::id(),
            free_port()?
        ),
        "fabric" => format!("fabric://{provider}/127.0.0.1:{}", free_port()?),
        t => return Err(format!("unknown transport {t:?}: tcp, shm or fabric")),
    })
}

/// `fabrickv serve` (this binary) on `addr` with `workers` workers, under
/// `taskset -c CPUS` when `cpus` is given and then with worker i pinned to
/// the i-th CPU of the list (`--worker-cpus`), not left to wander over
/// the set; the caller adds the service's own flags.
pub fn fabrickv_serve(cpus: Option<&str>, addr: &str, workers: usize) -> Result<Command, String> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let mut cmd = pinned(cpus, &exe.to_string_lossy());
    cmd.args(["serve", "--listen", addr, "--workers", &workers.to_string()]);
    if let Some(c) = cpus {
        cmd.args(["--worker-cpus", c]);
    }
    Ok(cmd)
}

/// Starts a server process and waits until it accepts on `port`.
pub fn spawn_server(cmd: Command, name: &str, port: u16) -> Result<Child, String> {
    spawn_until(cmd, name, || {
        TcpStream::connect(("127.0.0.1", port)).is_ok()
    })
    .map_err(|e| format!("{e} (port {port})"))
}

/// Starts a server process and waits until `ready` says it serves (polled
/// every 20 ms for at most [`SERVER_START_TIMEOUT`]).
pub fn spawn_until(
    mut cmd: Command,
    name: &str,
    mut ready: impl FnMut() -> bool,
) -> Result<Child, String> {
    cmd.stdout(Stdio::null())
        .stderr(Stdio::null())
        .stdin(Stdio::null());
    let child = cmd
        .spawn()
        .map_err(|e| format!("cannot start {name}: {e}"))?;
    let mut c = Child {
        child,
        name: name.to_string(),
    };
    let deadline = Instant::now() + SERVER_START_TIMEOUT;
    loop {
        if ready() {
            return Ok(c);
        }
        if let Ok(Some(status)) = c.child.try_wait() {
            return Err(format!("{name} exited at start with {status}"));
        }
        if Instant::now() > deadline {
            return Err(format!(
                "{name} was not ready within {SERVER_START_TIMEOUT:?}"
            ));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Starts this binary's `serve` on a free loopback port.
pub fn spawn_fabrickv(
    cpus: Option<&str>,
    workers: usize,
    memory: &str,
) -> Result<(Child, String), String> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let port = free_port()?;
    let mut cmd = pinned(cpus, &exe.to_string_lossy());
    cmd.args([
        "serve",
        "--listen",
        &format!("127.0.0.1:{port}"),
        "--workers",
        &workers.to_string(),
    ]);
    // No gRPC: the default address may be another server's, and a taken
    // address is a start-up error.
    cmd.args(["--memory", memory, "--log-level", "warn", "--grpc", "off"]);
    let c = spawn_server(cmd, "fabrickv", port)?;
    Ok((c, format!("127.0.0.1:{port}")))
}

/// Starts redis-server with persistence off on a free loopback port.
pub fn spawn_redis(cpus: Option<&str>) -> Result<(Child, u16), String> {
    spawn_redis_with(cpus, &[])
}

/// [`spawn_redis`] with more arguments (`--dir` for a replica's full
/// sync, which writes a file even with persistence off).
pub fn spawn_redis_with(cpus: Option<&str>, extra: &[&str]) -> Result<(Child, u16), String> {
    let port = free_port()?;
    let mut cmd = pinned(cpus, "redis-server");
    cmd.args([
        "--port",
        &port.to_string(),
        "--bind",
        "127.0.0.1",
        "--save",
        "",
        "--appendonly",
        "no",
    ]);
    cmd.args(extra);
    let c = spawn_server(cmd, "redis-server", port)?;
    Ok((c, port))
}

/// Starts memcached on a free loopback port, UDP off, 1 GiB of item
/// memory and room for 4096 connections.
///
/// It runs one worker thread (`-t 1`): the comparison pins each server to
/// one core, and more workers than cores would only make them take turns.
/// memcached refuses to start as root unless told which user to run as,
/// so `-u root` is passed when this process runs as root.
pub fn spawn_memcached(cpus: Option<&str>) -> Result<(Child, u16), String> {
    let port = free_port()?;
    let mut cmd = pinned(cpus, "memcached");
    cmd.args(["-p", &port.to_string(), "-l", "127.0.0.1", "-U", "0"]);
    cmd.args(["-t", "1", "-m", "1024", "-c", "4096"]);
    // Its background LRU threads would share the one pinned core and take
    // the item locks the worker needs; a cache this small never needs them.
    cmd.args(["-o", "no_lru_crawler,no_lru_maintainer"]);
    if fabrickv_cluster::local::effective_uid() == Some(0) {
        cmd.args(["-u", "root"]);
    }
    let c = spawn_server(cmd, "memcached", port)?;
    Ok((c, port))
}

/// One line of `redis-benchmark --csv`.
#[derive(Debug, Clone, PartialEq)]
pub struct RedisBenchRow {
    /// The test name (`GET`, `SET`, ...).
    pub test: String,
    /// Requests per second.
    pub rps: f64,
    /// Median latency, microseconds.
    pub p50_us: f64,
    /// 99th percentile latency, microseconds.
    pub p99_us: f64,
}

/// Parses `redis-benchmark --csv` output (Redis 7 columns:
/// test, rps, avg, min, p50, p95, p99, max; latencies in ms).
pub fn parse_redis_csv(out: &str) -> Vec<RedisBenchRow> {
    out.lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split(',').map(|s| s.trim().trim_matches('"')).collect();
            if f.len() < 7 {
                return None;
            }
            let num = |i: usize| f[i].parse::<f64>().ok();
            Some(RedisBenchRow {
                test: f[0].to_string(),
                rps: num(1)?,
                p50_us: num(4)? * 1e3,
                p99_us: num(6)? * 1e3,
            })
        })
        .collect()
}

/// Runs `redis-benchmark` with `args` against `port`, pinned to `cpus`.
pub fn redis_benchmark(
    cpus: Option<&str>,
    port: u16,
    args: &[String],
) -> Result<Vec<RedisBenchRow>, String> {
    let mut cmd = pinned(cpus, "redis-benchmark");
    cmd.args(["-h", "127.0.0.1", "-p", &port.to_string(), "--csv"])
        .args(args);
    let out = cmd
        .output()
        .map_err(|e| format!("cannot run redis-benchmark: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "redis-benchmark failed: {}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    let rows = parse_redis_csv(&String::from_utf8_lossy(&out.stdout));
    if rows.is_empty() {
        return Err(format!(
            "redis-benchmark printed no result: {}",
            String::from_utf8_lossy(&out.stdout)
        ));
    }
    Ok(rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_redis_benchmark_csv() {
        let out = "\"test\",\"rps\",\"avg_latency_ms\",\"min_latency_ms\",\"p50_latency_ms\",\"p95_latency_ms\",\"p99_latency_ms\",\"max_latency_ms\"\n\"GET\",\"1234567.50\",\"0.300\",\"0.100\",\"0.279\",\"0.500\",\"0.711\",\"1.000\"\n";
        let rows = parse_redis_csv(out);
        assert_eq!(rows.len(), 1);
        assert_eq!(rows[0].test, "GET");
        assert_eq!(rows[0].rps, 1234567.5);
        assert!((rows[0].p50_us - 279.0).abs() < 1e-9);
        assert!((rows[0].p99_us - 711.0).abs() < 1e-9);
    }

    #[test]
    fn starts_memcached_and_it_answers() {
        use std::io::{BufRead, BufReader, Write};
        if !on_path("memcached") {
            println!("skipping: memcached is not installed (scripts/install-deps.sh)");
            return;
        }
        let (mc, port) = spawn_memcached(None).expect("memcached starts");
        assert!(mc.pid() > 0);
        let mut s = TcpStream::connect(("127.0.0.1", port)).expect("connects");
        s.set_read_timeout(Some(SERVER_START_TIMEOUT))
            .expect("timeout set");
        s.write_all(b"version\r\n").expect("writes");
        let mut line = String::new();
        BufReader::new(&s).read_line(&mut line).expect("reads");
        assert!(line.starts_with("VERSION "), "answered {line:?}");
    }
}
