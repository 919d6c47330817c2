//! `fabrickv bench herd`: HERD's workload and table.
//!
//! For each worker count, a server with that many workers is started (in
//! this process, or as a child process pinned with `taskset`), each worker
//! owning a partition of `keys_per_partition` 16-byte keys (hashes of
//! integers, as HERD's), preloaded; then the same client load runs twice:
//! batched (`batch` operations per request frame, HERD's doorbell-batched
//! clients) and non-batched (one operation per frame). Every GET's value is
//! checked. With `--clients`, each run is N client processes instead,
//! released together by a barrier, their figures summed into the table
//! (which gains Clients and Status columns). Each worker's own counters,
//! read before and after a run, give the per-worker line HERD's workers
//! print: IOPS, average batch size, and lookup-fail rate.

use std::fmt::Write as _;
use std::time::Duration;

use fabrickv_client::Client;
use fabrickv_server::{Mode, Server, ServerConfig, ServerHandle};

use crate::kv::{self, KvOpts};
use crate::load::Shape;
use crate::peers::{free_port, pinned, spawn_until, Child};
use crate::ps_report::Status;
use crate::report::BenchResult;

/// What to run.
#[derive(Debug, Clone)]
pub struct HerdOpts {
    /// Worker counts to measure, one table row each (HERD's "Cores").
    pub workers: Vec<usize>,
    /// Keys per worker (HERD_NUM_KEYS, a HERD worker's partition; the
    /// server spreads them over its own partitions).
    pub keys_per_partition: u64,
    /// Value size in bytes (HERD_VALUE_SIZE); keys are 16 bytes.
    pub value_size: usize,
    /// Share of PUTs, in percent (HERD's update_percentage).
    pub update_percent: u32,
    /// Operations per frame of the batched client.
    pub batch: usize,
    /// Request frames in flight per connection.
    pub in_flight: usize,
    /// Client threads.
    pub threads: usize,
    /// Measured time of each run.
    pub duration: Duration,
    /// tcp, shm, inproc or fabric.
    pub transport: String,
    /// libfabric provider when the transport is fabric.
    pub provider: String,
    /// Start the server as a child process pinned to these CPUs.
    pub server_cpus: Option<String>,
    /// CPUs for client threads.
    pub client_cpus: Vec<usize>,
}

/// One worker's line: HERD's per-worker report.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct WorkerLine {
    /// Worker id.
    pub worker: usize,
    /// Operations this worker executed per second.
    pub iops: f64,
    /// Operations per request frame it received.
    pub avg_batch: f64,
    /// GETs that found no value, as a fraction of GETs.
    pub lookup_fail_rate: f64,
}

/// One row of HERD's table.
#[derive(Debug, Clone)]
pub struct HerdRow {
    /// Worker threads of the server.
    pub cores: usize,
    /// Client processes whose figures the row sums (`--clients`); `None`
    /// when this process ran the load itself.
    pub clients: Option<usize>,
    /// The batched client's result.
    pub batched: BenchResult,
    /// The non-batched client's result.
    pub non_batched: BenchResult,
    /// Per-worker lines of the batched run.
    pub batched_workers: Vec<WorkerLine>,
    /// Per-worker lines of the non-batched run.
    pub non_batched_workers: Vec<WorkerLine>,
    /// PASS when both runs checked GET values and none was wrong (and,
    /// with clients, every client succeeded).
    pub status: Status,
}

/// One measured load of a row: the server, its worker count, the client
/// processes (`None`: this process) and the operations per frame.
#[derive(Debug, Clone, Copy)]
pub struct Step<'a> {
    /// The server's address.
    pub addr: &'a str,
    /// Its workers.
    pub cores: usize,
    /// Client processes of a sweep.
    pub clients: Option<usize>,
    /// Operations per request frame.
    pub batch: usize,
}

/// Runs one step: its result (summed over the clients of a sweep) and,
/// when a client failed, why. `Err` stops the whole run.
pub type Load<'a> = dyn FnMut(&Step) -> Result<(BenchResult, Option<String>), String> + 'a;

impl HerdOpts {
    /// The kv load of a step against a preloaded server.
    pub fn kv_opts(&self, addr: &str, cores: usize, batch: usize) -> KvOpts {
        KvOpts {
            server: Some(addr.to_string()),
            server_workers: cores,
            threads: self.threads,
            keys: self.keys_per_partition * cores as u64,
            shape: Shape {
                batch,
                in_flight: self.in_flight,
                get_percent: 100 - self.update_percent.min(100),
                key_size: 16,
                value_size: self.value_size,
            },
            duration: self.duration,
            client_cpus: self.client_cpus.clone(),
            preload: false,
        }
    }
}

/// Runs every worker count with the load in this process and returns the
/// rows.
pub fn run(opts: &HerdOpts) -> Result<Vec<HerdRow>, String> {
    run_steps(opts, &[None], &mut |s| {
        Ok((kv::run(&opts.kv_opts(s.addr, s.cores, s.batch))?, None))
    })
}

/// Runs every worker count with each of `clients` client processes,
/// `load` running a step's processes and summing their results.
pub fn run_clients(
    opts: &HerdOpts,
    clients: &[usize],
    load: &mut Load,
) -> Result<Vec<HerdRow>, String> {
    if clients.is_empty() || clients.contains(&0) {
        return Err("--clients must list client counts of at least 1".into());
    }
    if opts.batch == 0 || opts.in_flight == 0 || opts.threads == 0 {
        // Checked here, not in each client process.
        return Err("--batch, --in-flight and --threads must be at least 1".into());
    }
    if opts.transport == "inproc" {
        return Err(
            "--clients runs client processes; inproc servers serve this process only".into(),
        );
    }
    let counts: Vec<Option<usize>> = clients.iter().map(|&n| Some(n)).collect();
    run_steps(opts, &counts, load)
}

fn run_steps(
    opts: &HerdOpts,
    counts: &[Option<usize>],
    load: &mut Load,
) -> Result<Vec<HerdRow>, String> {
    if opts.workers.is_empty() || opts.workers.contains(&0) {
        return Err("--workers must list worker counts of at least 1".into());
    }
    if opts.keys_per_partition == 0 {
        return Err("--keys-per-partition must be at least 1".into());
    }
    let mut rows = Vec::new();
    for (n, &w) in opts.workers.iter().enumerate() {
        let server = HerdServer::start(opts, w, n)?;
        let mut client = Client::connect(&server.addr)
            .map_err(|e| format!("connecting to {}: {e}", server.addr))?;
        kv::preload(&mut client, &opts.kv_opts(&server.addr, w, 1))?;
        for &clients in counts {
            let step = |batch| Step {
                addr: &server.addr,
                cores: w,
                clients,
                batch,
            };
            let (mut batched, batched_failure, batched_workers) =
                measured(&mut client, &mut || load(&step(opts.batch)))?;
            let (mut non_batched, non_batched_failure, non_batched_workers) =
                measured(&mut client, &mut || load(&step(1)))?;
            let who = clients.map_or(String::new(), |c| format!(" clients {c}"));
            for (r, lines) in [
                (&mut batched, &batched_workers),
                (&mut non_batched, &non_batched_workers),
            ] {
                r.bench = "herd".into();
                r.params["cores"] = w.into();
                r.params["keys_per_partition"] = opts.keys_per_partition.into();
                r.params["update_percent"] = opts.update_percent.into();
                r.params["workers_lines"] = serde_json::to_value(lines).unwrap_or_default();
                if let Some(c) = clients {
                    r.params["clients"] = c.into();
                }
            }
            batched.case = format!("cores {w}{who} batched b{}", opts.batch);
            non_batched.case = format!("cores {w}{who} non-batched b1");
            let wrong = batched.wrong_values + non_batched.wrong_values;
            let status = match batched_failure.or(non_batched_failure) {
                Some(f) => Status::Fail(f),
                // Only PUTs: no value to check, none can be wrong.
                None if opts.update_percent >= 100 => Status::from_checks(1, wrong),
                None => Status::from_checks(checked(&batched).min(checked(&non_batched)), wrong),
            };
            rows.push(HerdRow {
                cores: w,
                clients,
                batched,
                non_batched,
                batched_workers,
                non_batched_workers,
                status,
            });
        }
    }
    Ok(rows)
}

/// GET values a result checked (`params.checked`).
fn checked(r: &BenchResult) -> u64 {
    r.params["checked"].as_u64().unwrap_or(0)
}

/// Runs one load and reads each worker's counters around it.
fn measured(
    client: &mut Client,
    load: &mut dyn FnMut() -> Result<(BenchResult, Option<String>), String>,
) -> Result<(BenchResult, Option<String>, Vec<WorkerLine>), String> {
    let before = client.stats_per_worker().map_err(|e| e.to_string())?;
    let (r, failure) = load()?;
    let after = client.stats_per_worker().map_err(|e| e.to_string())?;
    let lines = before
        .iter()
        .zip(&after)
        .enumerate()
        .map(|(worker, (b, a))| {
            let d = |name: &str| counter(a, name).saturating_sub(counter(b, name)) as f64;
            WorkerLine {
                worker,
                iops: d("ops") / r.seconds.max(1e-9),
                avg_batch: d("ops") / d("frames").max(1.0),
                lookup_fail_rate: d("misses") / d("gets").max(1.0),
            }
        })
        .collect();
    Ok((r, failure, lines))
}

fn counter(list: &[(String, u64)], name: &str) -> u64 {
    list.iter().find(|(k, _)| k == name).map_or(0, |(_, v)| *v)
}

/// HERD's table. Rows of client processes (`--clients`) get a Clients
/// column, sums over the processes, and a Status column (their checks):
///
/// ```text
/// All numbers are million operations/sec
/// Cores  Batched  Non-batched
/// 1      12.30    6.69
/// ```
///
/// ```text
/// All numbers are million operations/sec, summed over the client processes
/// Cores  Clients  Batched  Non-batched  Status
/// 1      2        12.30    6.69         PASS
/// ```
pub fn table(rows: &[HerdRow]) -> String {
    let clients = rows.iter().any(|r| r.clients.is_some());
    let mut out = String::from(if clients {
        "All numbers are million operations/sec, summed over the client processes\nCores  Clients  Batched  Non-batched  Status\n"
    } else {
        "All numbers are million operations/sec\nCores  Batched  Non-batched\n"
    });
    for r in rows {
        let (b, nb) = (r.batched.ops_per_s / 1e6, r.non_batched.ops_per_s / 1e6);
        let _ = if clients {
            let n = r.clients.unwrap_or(1);
            writeln!(
                out,
                "{:<6} {n:<8} {b:<8.2} {nb:<12.2} {}",
                r.cores,
                r.status.cell()
            )
        } else {
            writeln!(out, "{:<6} {b:<8.2} {nb:.2}", r.cores)
        };
    }
    out
}

/// Prints HERD's table, then the per-worker lines.
pub fn print(opts: &HerdOpts, rows: &[HerdRow]) {
    println!(
        "HERD: 16-byte keys, {}-byte values, {}% UPDATEs, {} keys per partition, {} transport; batched = {} ops per frame, non-batched = 1; {} frames in flight per connection, {} client thread(s){}",
        opts.value_size,
        opts.update_percent,
        opts.keys_per_partition,
        opts.transport,
        opts.batch,
        opts.in_flight,
        opts.threads,
        if rows.iter().any(|r| r.clients.is_some()) {
            " per client process"
        } else {
            ""
        }
    );
    print!("{}", table(rows));
    for r in rows {
        let who = r.clients.map_or(String::new(), |c| format!(" clients {c}"));
        for (kind, lines) in [
            ("batched", &r.batched_workers),
            ("non-batched", &r.non_batched_workers),
        ] {
            for l in lines {
                println!(
                    "cores {}{who} {kind}: Worker {}: {:.2} M IOPS. Avg batch = {:.2} ops. Lookup fail rate = {:.4}",
                    r.cores,
                    l.worker,
                    l.iops / 1e6,
                    l.avg_batch,
                    l.lookup_fail_rate
                );
            }
        }
    }
}

/// A server for one row: in this process, or a pinned child process.
struct HerdServer {
    addr: String,
    _embedded: Option<ServerHandle>,
    _child: Option<Child>,
}

impl HerdServer {
    fn start(opts: &HerdOpts, workers: usize, n: usize) -> Result<HerdServer, String> {
        let item = 16 + opts.value_size + 64;
        let memory = ((opts.keys_per_partition as usize * workers * item * 2) as u64)
            .max(64 << 20)
            .max(workers as u64 * (8 << 20));
        let child = opts.server_cpus.is_some();
        let port = if child { free_port()? } else { 0 };
        let tag = format!("fkv-herd-{}-{n}", std::process::id());
        let listen = match opts.transport.as_str() {
            "tcp" => format!("127.0.0.1:{port}"),
            "shm" => format!("shm://{tag}"),
            "inproc" if !child => format!("inproc://{tag}"),
            "inproc" => return Err("inproc servers run in this process only".into()),
            "fabric" => format!("fabric://{}/127.0.0.1:{port}", opts.provider),
            t => return Err(format!("unknown transport {t}: tcp, shm, inproc or fabric")),
        };
        if !child {
            let h = Server::start(&ServerConfig {
                listen,
                workers: Some(workers),
                mode: Mode::Store,
                memory_bytes: memory,
                log_level: "warn".into(),
                ..ServerConfig::default()
            })
            .map_err(|e| e.to_string())?;
            return Ok(HerdServer {
                addr: h.addr().to_string(),
                _embedded: Some(h),
                _child: None,
            });
        }
        let exe = std::env::current_exe().map_err(|e| e.to_string())?;
        let mut cmd = pinned(opts.server_cpus.as_deref(), &exe.to_string_lossy());
        cmd.args([
            "serve",
            "--listen",
            &listen,
            "--workers",
            &workers.to_string(),
        ])
        .args(["--memory", &memory.to_string(), "--log-level", "warn"])
        // The benchmark needs no gRPC, and the default address may be
        // another server's (a taken address is a start-up error).
        .args(["--grpc", "off"]);
        // Ready when a client completes its handshake (any transport).
        let ready = || Client::connect_with_timeout(&listen, Duration::from_secs(1)).is_ok();
        let c = spawn_until(cmd, "fabrickv", ready)?;
        Ok(HerdServer {
            addr: listen.clone(),
            _embedded: None,
            _child: Some(c),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(cores: usize, clients: Option<usize>, batched: f64, non_batched: f64) -> HerdRow {
        let r = |ops_per_s| BenchResult {
            bench: "herd".into(),
            case: String::new(),
            system: "fabrickv".into(),
            ops_per_s,
            p50_us: 0.0,
            p99_us: 0.0,
            ops: 0,
            seconds: 1.0,
            wrong_values: 0,
            params: serde_json::json!({}),
        };
        HerdRow {
            cores,
            clients,
            batched: r(batched),
            non_batched: r(non_batched),
            batched_workers: Vec::new(),
            non_batched_workers: Vec::new(),
            status: Status::Pass,
        }
    }

    #[test]
    fn table_matches_herds() {
        // HERD's README: header lines, then Cores, Batched, Non-batched.
        let t = table(&[row(1, None, 12.3e6, 6.69e6), row(2, None, 23.2e6, 12.68e6)]);
        assert_eq!(
            t,
            "All numbers are million operations/sec\nCores  Batched  Non-batched\n1      12.30    6.69\n2      23.20    12.68\n"
        );
    }

    #[test]
    fn clients_table_adds_clients_and_status() {
        let mut failed = row(1, Some(4), 1.0e6, 0.5e6);
        failed.status = Status::Fail("client 2 exited with exit status: 2".into());
        let t = table(&[row(1, Some(2), 12.3e6, 6.69e6), failed]);
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(
            lines[0],
            "All numbers are million operations/sec, summed over the client processes"
        );
        assert_eq!(lines[1], "Cores  Clients  Batched  Non-batched  Status");
        assert_eq!(lines[2], "1      2        12.30    6.69         PASS");
        assert_eq!(
            lines[3],
            "1      4        1.00     0.50         FAIL (client 2 exited with exit status: 2)"
        );
    }
}
