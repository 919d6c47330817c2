//! `fabrickv bench herd`: HERD's workload and table, in one process or as
//! a sweep of client processes (`--clients`) whose figures are summed.

use clap::Args;

use super::sweep::{check_counts, child_args, Sweep, SweepArgs};
use super::{cpu_list, duration_of};
use crate::herd::{self, HerdOpts};
use crate::kv;
use crate::report::BenchResult;

#[derive(Args)]
pub struct HerdArgs {
    /// Worker counts to measure, one row each (HERD's "Cores"), e.g. 1,2 or 1-4.
    #[arg(long, default_value = "1")]
    workers: String,
    /// Keys per worker (HERD_NUM_KEYS, a HERD worker's partition; the
    /// server spreads them over its own partitions).
    #[arg(long, default_value_t = 100_000)]
    keys_per_partition: u64,
    /// Value size in bytes (keys are 16 bytes).
    #[arg(long, default_value_t = 32)]
    value_size: usize,
    /// Percentage of PUTs (HERD's update_percentage).
    #[arg(long, default_value_t = 5)]
    update_percentage: u32,
    /// Operations per request frame of the batched client.
    #[arg(long, default_value_t = 16)]
    batch: usize,
    /// Request frames in flight per connection.
    #[arg(long, default_value_t = 8)]
    in_flight: usize,
    /// Client threads.
    #[arg(long, default_value_t = 1)]
    threads: usize,
    /// Measured seconds of each run.
    #[arg(long, default_value_t = 5.0)]
    duration: f64,
    /// tcp, shm, inproc or fabric.
    #[arg(long, default_value = "tcp")]
    transport: String,
    /// libfabric provider for --transport fabric.
    #[arg(long, default_value = "shm")]
    provider: String,
    /// Start each server as a process pinned to these CPUs (e.g. 0).
    #[arg(long)]
    server_cpus: Option<String>,
    /// Pin client threads to these CPUs (e.g. 1).
    #[arg(long)]
    client_cpus: Option<String>,
    /// Print one JSON object per result as well as the table.
    #[arg(long)]
    json: bool,
    /// Run each load as this many client processes at once (e.g. 2,4,8),
    /// released together by a barrier in a memcached registry (--registry,
    /// or one started for the sweep), and sum their figures; a row per
    /// worker count and client count.
    #[arg(long, value_delimiter = ',')]
    clients: Vec<usize>,
    /// The preloaded server a client process of a sweep loads.
    #[arg(long, hide = true, requires = "child")]
    server: Option<String>,
    #[command(flatten)]
    sweep: SweepArgs,
}

/// Runs `bench herd`; fails if a row did not pass.
pub fn run(a: HerdArgs) -> Result<(), String> {
    let duration = duration_of(a.duration)?;
    let client_cpus = cpu_list(&a.client_cpus)?;
    if let Some(&id) = client_cpus.first() {
        crate::pin_current_thread(id);
    }
    let opts = HerdOpts {
        workers: cpu_list(&Some(a.workers.clone()))
            .map_err(|_| format!("bad --workers {}", a.workers))?,
        keys_per_partition: a.keys_per_partition,
        value_size: a.value_size,
        update_percent: a.update_percentage.min(100),
        batch: a.batch,
        in_flight: a.in_flight,
        threads: a.threads,
        duration,
        transport: a.transport.clone(),
        provider: a.provider.clone(),
        server_cpus: a.server_cpus.clone(),
        client_cpus,
    };
    if a.sweep.child {
        return herd_child(&a, &opts);
    }
    let rows = if a.clients.is_empty() {
        herd::run(&opts)?
    } else {
        check_counts(&a.clients)?;
        let sweep = Sweep::start(&a.sweep, "herd")?;
        herd::run_clients(&opts, &a.clients, &mut |s| herd_clients(&a, &sweep, s))?
    };
    herd::print(&opts, &rows);
    if a.json {
        for r in &rows {
            println!("{}", r.batched.json());
            println!("{}", r.non_batched.json());
        }
    }
    match rows.iter().find(|r| !r.status.passed()) {
        Some(r) => Err(format!(
            "cores {} clients {}: {}",
            r.cores,
            r.clients.unwrap_or(1),
            r.status.cell()
        )),
        None => Ok(()),
    }
}

/// One client process of `bench herd --clients`: the load of one step
/// against the parent's preloaded server, started at the barrier.
fn herd_child(a: &HerdArgs, opts: &HerdOpts) -> Result<(), String> {
    let server = a
        .server
        .as_deref()
        .ok_or("a client of a sweep needs --server")?;
    let &[cores] = opts.workers.as_slice() else {
        return Err("a client of a sweep needs one --workers count".into());
    };
    let mut gate = a.sweep.gate()?;
    let r = kv::run_gated(&opts.kv_opts(server, cores, a.batch), &mut || gate.pass())?;
    let v = serde_json::to_value(&r).map_err(|e| e.to_string())?;
    println!("{}", gate.line(v));
    Ok(())
}

/// Runs one step of `bench herd --clients` as client processes and sums
/// their results.
fn herd_clients(
    a: &HerdArgs,
    sweep: &Sweep,
    s: &herd::Step,
) -> Result<(BenchResult, Option<String>), String> {
    let n = s.clients.unwrap_or(1);
    let args = child_args(
        &["bench", "herd", "--server", s.addr],
        &[
            ("--workers", s.cores.to_string()),
            ("--batch", s.batch.to_string()),
            ("--keys-per-partition", a.keys_per_partition.to_string()),
            ("--value-size", a.value_size.to_string()),
            ("--update-percentage", a.update_percentage.to_string()),
            ("--in-flight", a.in_flight.to_string()),
            ("--threads", a.threads.to_string()),
            ("--duration", a.duration.to_string()),
        ],
        a.client_cpus.as_deref(),
    );
    let c = sweep.run(&format!("w{}-n{n}-b{}", s.cores, s.batch), n, &args)?;
    let parts = c
        .lines
        .iter()
        .map(|v| serde_json::from_value(v.clone()))
        .collect::<Result<Vec<BenchResult>, _>>()
        .map_err(|e| format!("a client's result: {e}"))?;
    let mut r = BenchResult::sum("herd", &parts);
    r.params["start_skew_ms"] = c.start_skew_ms.into();
    Ok((r, c.failure))
}
