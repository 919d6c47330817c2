//! `fabrickv bench cluster`: flags, and the check of the run.

use std::time::Duration;

use crate::cluster::{self, ClusterOpts};

/// Flags of `fabrickv bench cluster`.
#[derive(clap::Args)]
pub struct ClusterBenchArgs {
    /// Servers of the cluster (all in this process, sharing its cores).
    #[arg(long, default_value_t = 3)]
    servers: usize,
    /// Workers of each cluster server.
    #[arg(long, default_value_t = 1)]
    cluster_workers: usize,
    /// Workers of the one server it is compared with (the same cores).
    #[arg(long, default_value_t = 2)]
    single_workers: usize,
    /// tcp or shm.
    #[arg(long, default_value = "tcp")]
    transport: String,
    /// Client threads of the throughput run.
    #[arg(long, default_value_t = 4)]
    threads: usize,
    /// GETs per call in the throughput run.
    #[arg(long, default_value_t = 96)]
    batch: usize,
    /// Keys per multi-get in the latency run.
    #[arg(long, default_value_t = 100)]
    mget: usize,
    /// Distinct keys, stored before measuring.
    #[arg(long, default_value_t = 100_000)]
    keys: u64,
    /// Key length in bytes.
    #[arg(long, default_value_t = 16)]
    key_size: usize,
    /// Value length in bytes.
    #[arg(long, default_value_t = 32)]
    value_size: usize,
    /// Seconds of each throughput and latency run.
    #[arg(long, default_value_t = 1.0)]
    duration: f64,
    /// Alternating runs of each configuration (their figures are summed).
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// Joins through the registry to time.
    #[arg(long, default_value_t = 20)]
    joins: usize,
    /// Also print one JSON line per result.
    #[arg(long)]
    json: bool,
}

/// Runs it; fails if any read came back wrong.
pub fn run(a: &ClusterBenchArgs) -> Result<(), String> {
    if !(a.duration.is_finite() && a.duration > 0.0) {
        return Err(format!("--duration must be positive, not {}", a.duration));
    }
    let o = ClusterOpts {
        servers: a.servers,
        cluster_workers: a.cluster_workers,
        single_workers: a.single_workers,
        transport: a.transport.clone(),
        threads: a.threads,
        batch: a.batch,
        mget: a.mget,
        keys: a.keys,
        key_size: a.key_size,
        value_size: a.value_size,
        duration: Duration::from_secs_f64(a.duration),
        rounds: a.rounds,
        joins: a.joins,
    };
    let r = cluster::run(&o)?;
    r.print(&o);
    if a.json {
        for l in r.json_lines() {
            println!("{l}");
        }
    }
    if r.wrong() > 0 {
        return Err(format!("{} reads came back wrong", r.wrong()));
    }
    Ok(())
}
