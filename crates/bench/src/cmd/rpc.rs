//! `fabrickv bench rpc`: flags, server placement and the comparison rows.

use std::io::{BufRead, BufReader, Read};
use std::process::{Command, Stdio};
use std::time::Duration;

use clap::Args;
use fabrickv_rpc::worker::POLL_BURST_MSGS;
use fabrickv_rpc::LoopKnobs;

use super::cpu_list;
use crate::baseline;
use crate::report::{print_table, BenchResult, LatencySummary, RPC_TABLE_HEADER};
use crate::rpc::{echo_server, run_case, Affinity, RpcOpts};

#[derive(Args)]
pub struct RpcArgs {
    /// inproc, tcp, shm or fabric.
    #[arg(long, default_value = "tcp")]
    transport: String,
    /// libfabric provider for --transport fabric (tcp;ofi_rxm, shm, udp;ofi_rxd, verbs, efa).
    #[arg(long, default_value = "tcp;ofi_rxm")]
    provider: String,
    /// Message size on the wire, frame header included (bytes).
    #[arg(long, default_value_t = 64)]
    msg_size: usize,
    /// Server threads (workers).
    #[arg(long, default_value_t = 1)]
    server_threads: usize,
    /// Client threads of the throughput run.
    #[arg(long, default_value_t = 1)]
    client_threads: usize,
    /// Requests in flight per client thread in the throughput run.
    #[arg(long, default_value_t = 32)]
    in_flight: usize,
    /// random (each request to a random worker) or modulo (client id % workers).
    #[arg(long, default_value = "modulo")]
    affinity: Affinity,
    #[command(flatten)]
    knobs: KnobArgs,
    /// Seconds per run.
    #[arg(long, default_value_t = 5.0)]
    duration: f64,
    /// Seconds between interim rows (0 for only the final rows).
    #[arg(long, default_value_t = 2.0)]
    report_every: f64,
    /// Runs to do: latency, throughput or both (comma separated).
    #[arg(long, default_value = "latency,throughput")]
    runs: String,
    /// Start the server as a child process pinned to these CPUs (e.g. 0).
    #[arg(long)]
    server_cpus: Option<String>,
    /// Pin client threads to these CPUs (e.g. 1).
    #[arg(long)]
    client_cpus: Option<String>,
    /// Also measure the raw TCP ping-pong, tonic gRPC unary and (fabric) raw libfabric rows.
    #[arg(long)]
    compare: bool,
    /// Print one JSON object per result as well.
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
pub struct RpcServerArgs {
    /// Address to listen on, with its scheme.
    #[arg(long)]
    listen: String,
    /// Server threads.
    #[arg(long, default_value_t = 1)]
    threads: usize,
    #[command(flatten)]
    knobs: KnobArgs,
}

/// The worker loop's knobs, given to `bench rpc` and passed on to the
/// `bench rpc-server` child it starts. The defaults are the server's own.
#[derive(Args, Clone, Copy)]
pub struct KnobArgs {
    /// Messages a worker takes per poll (batched receive); 1 disables batching.
    #[arg(long, default_value_t = POLL_BURST_MSGS)]
    poll_burst: usize,
    /// Flush the replies of a poll burst together (doorbell batching).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    batched_send: bool,
}

impl KnobArgs {
    /// The loop knobs these flags set.
    fn knobs(self) -> LoopKnobs {
        LoopKnobs {
            poll_burst: self.poll_burst,
            batched_send: self.batched_send,
        }
    }

    /// The flags that give a `bench rpc-server` child these knobs.
    fn child_args(self) -> Vec<String> {
        vec![
            "--poll-burst".to_string(),
            self.poll_burst.to_string(),
            "--batched-send".to_string(),
            self.batched_send.to_string(),
        ]
    }
}

fn secs(v: f64, what: &str) -> Result<Duration, String> {
    if v.is_finite() && v >= 0.0 {
        Ok(Duration::from_secs_f64(v))
    } else {
        Err(format!("--{what} must be a non-negative number of seconds"))
    }
}

/// The listen address for a transport, on loopback.
fn listen_addr(transport: &str, provider: &str) -> Result<String, String> {
    Ok(match transport {
        "inproc" => format!("inproc://bench-rpc-{}", std::process::id()),
        "tcp" => "tcp://127.0.0.1:0".into(),
        "shm" => format!("shm://fabrickv-bench-{}", std::process::id()),
        "fabric" => format!("fabric://{provider}/127.0.0.1:0"),
        t => {
            return Err(format!(
                "unknown transport {t:?}: expected inproc, tcp, shm or fabric"
            ))
        }
    })
}

/// Serves echo requests until stdin closes (the parent exits or drops us).
pub fn serve(a: RpcServerArgs) -> Result<(), String> {
    let knobs = a.knobs.knobs();
    let server = echo_server(&a.listen, a.threads, knobs)?;
    println!("listening {}", server.addr());
    let mut sink = Vec::new();
    let _ = std::io::stdin().read_to_end(&mut sink);
    server.shutdown();
    Ok(())
}

/// A child echo server; dropping it closes its stdin, which stops it.
struct ChildServer {
    child: std::process::Child,
}

impl Drop for ChildServer {
    fn drop(&mut self) {
        drop(self.child.stdin.take());
        let _ = self.child.wait();
    }
}

fn spawn_server(a: &RpcArgs, listen: &str, cpus: &str) -> Result<(ChildServer, String), String> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let mut child = Command::new("taskset")
        .arg("-c")
        .arg(cpus)
        .arg(exe)
        .args([
            "bench",
            "rpc-server",
            "--listen",
            listen,
            "--threads",
            &a.server_threads.to_string(),
        ])
        .args(a.knobs.child_args())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot start the rpc server: {e}"))?;
    let stdout = child.stdout.take().ok_or("no stdout")?;
    let guard = ChildServer { child };
    let mut line = String::new();
    BufReader::new(stdout)
        .read_line(&mut line)
        .map_err(|e| e.to_string())?;
    let addr = line
        .strip_prefix("listening ")
        .map(|s| s.trim().to_string());
    addr.map(|a| (guard, a))
        .ok_or_else(|| format!("the rpc server did not start: {line:?}"))
}

pub fn run(a: RpcArgs) -> Result<(), String> {
    let duration = secs(a.duration, "duration")?;
    let listen = listen_addr(&a.transport, &a.provider)?;
    let knobs = a.knobs.knobs();
    let client_cpus = cpu_list(&a.client_cpus)?;
    // This thread stays unpinned: the comparison rows start threads that
    // inherit its affinity and must not all land on one CPU.
    let (_child, _local, addr) = match (&a.server_cpus, a.transport.as_str()) {
        (Some(cpus), t) if t != "inproc" => {
            let (child, addr) = spawn_server(&a, &listen, cpus)?;
            (Some(child), None, addr)
        }
        _ => {
            let s = echo_server(&listen, a.server_threads, knobs)?;
            let addr = s.addr().to_string();
            (None, Some(s), addr)
        }
    };
    let opts = RpcOpts {
        addr,
        server_threads: a.server_threads,
        client_threads: a.client_threads,
        in_flight: a.in_flight,
        msg_size: a.msg_size,
        affinity: a.affinity,
        duration,
        report_every: secs(a.report_every, "report-every")?,
        client_cpus,
        labels: serde_json::json!({
            "transport": a.transport,
            "provider": if a.transport == "fabric" { a.provider.clone() } else { String::new() },
            "poll_burst": a.knobs.poll_burst,
            "batched_send": a.knobs.batched_send,
        }),
    };
    let mut results: Vec<BenchResult> = Vec::new();
    for run in a.runs.split(',').map(str::trim) {
        let r = match run {
            "latency" => run_case(&opts, &format!("{} latency", a.transport), 1, 1)?,
            "throughput" => run_case(
                &opts,
                &format!("{} throughput", a.transport),
                a.client_threads,
                a.in_flight,
            )?,
            other => {
                return Err(format!(
                    "unknown run {other:?}: expected latency or throughput"
                ))
            }
        };
        results.push(r);
    }
    if a.compare {
        let server_cpu = cpu_list(&a.server_cpus)?.first().copied();
        let client_cpu = opts.client_cpus.first().copied();
        results.extend(compare_rows(
            &a.transport,
            &a.provider,
            a.msg_size,
            duration,
            a.in_flight,
            server_cpu,
            client_cpu,
        )?);
    }
    println!(
        "final ({} B messages, {} server threads):",
        a.msg_size, a.server_threads
    );
    let rows: Vec<Vec<String>> = results
        .iter()
        .map(|r| {
            let s = LatencySummary::from_result(r).unwrap_or(LatencySummary {
                ops_per_s: r.ops_per_s,
                fast_us: 0.0,
                ave_us: 0.0,
                p50_us: r.p50_us,
                p99_us: r.p99_us,
            });
            let name = if r.system == "fabrickv" {
                r.case.clone()
            } else {
                format!("{} ({})", r.system, r.case)
            };
            s.row(&name)
        })
        .collect();
    print_table(&RPC_TABLE_HEADER, &rows);
    if a.json {
        for r in &results {
            println!("{}", r.json());
        }
    }
    Ok(())
}

/// The comparison rows of `bench rpc --compare`: physical floors and peers
/// measured in the same run.
///
/// - `tcp-pingpong`: blocking TCP echo of the same size, one in flight;
/// - `tcp-pingpong-spin`: the same with both sides busy-polling
///   non-blocking sockets, as FabricKV's threads do;
/// - `grpc-unary`: tonic unary echo on single-threaded runtimes, with one
///   call in flight and with `in_flight` calls;
/// - `libfabric-raw`: plain fi_send/fi_recv ping-pong on the same provider
///   (builds with the `fabric` feature, for `--transport fabric`).
#[allow(clippy::too_many_arguments)]
fn compare_rows(
    transport: &str,
    provider: &str,
    msg_size: usize,
    duration: Duration,
    in_flight: usize,
    server_cpu: Option<usize>,
    client_cpu: Option<usize>,
) -> Result<Vec<BenchResult>, String> {
    let mut rows = vec![
        baseline::tcp_pingpong(msg_size, duration, server_cpu, client_cpu, false)?,
        baseline::tcp_pingpong(msg_size, duration, server_cpu, client_cpu, true)?,
        baseline::grpc_unary(msg_size, duration, 1, server_cpu, client_cpu)?,
        baseline::grpc_unary(msg_size, duration, in_flight, server_cpu, client_cpu)?,
    ];
    if transport == "fabric" {
        rows.push(raw_fabric_row(provider, msg_size, duration)?);
    }
    Ok(rows)
}

/// The raw libfabric round trip on `provider`, as a result row.
#[cfg(feature = "fabric")]
fn raw_fabric_row(
    provider: &str,
    msg_size: usize,
    duration: Duration,
) -> Result<BenchResult, String> {
    use crate::report::latency_histogram;
    // Size the run from a short probe so it lasts about `duration`.
    let probe = fabrickv_transport_fabric::raw_pingpong(provider, msg_size, 1000)
        .map_err(|e| e.to_string())?;
    let per = probe.iter().sum::<Duration>().as_secs_f64() / probe.len().max(1) as f64;
    let iters = ((duration.as_secs_f64() / per.max(1e-7)) as usize).clamp(1000, 10_000_000);
    let start = std::time::Instant::now();
    let samples = fabrickv_transport_fabric::raw_pingpong(provider, msg_size, iters)
        .map_err(|e| e.to_string())?;
    let seconds = start.elapsed().as_secs_f64();
    let mut h = latency_histogram()?;
    for d in &samples {
        h.saturating_record(d.as_nanos() as u64);
    }
    let s = LatencySummary::from_histogram(&h, samples.iter().sum::<Duration>().as_secs_f64());
    Ok(s.to_result(
        &format!("latency {msg_size}B"),
        "libfabric-raw",
        h.len(),
        seconds,
        0,
        serde_json::json!({ "provider": provider, "msg_size": msg_size }),
    ))
}

#[cfg(not(feature = "fabric"))]
fn raw_fabric_row(
    _provider: &str,
    _msg_size: usize,
    _duration: Duration,
) -> Result<BenchResult, String> {
    Err("this build has no libfabric transport: build with --features fabric".into())
}
