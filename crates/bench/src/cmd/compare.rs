//! `fabrickv bench compare`: FabricKV (RESP, memcache, native tcp, shm) beside
//! redis-server and memcached on the same workloads.

use clap::Args;

use super::duration_of;
use crate::compare::{self, CompareOpts, System};

#[derive(Args)]
pub struct CompareArgs {
    /// Systems to run: redis, memcached, fabrickv-resp, fabrickv-memcache,
    /// fabrickv-tcp, fabrickv-shm.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "redis,memcached,fabrickv-resp,fabrickv-memcache,fabrickv-tcp,fabrickv-shm"
    )]
    systems: Vec<String>,
    /// CPUs every server is pinned to.
    #[arg(long, default_value = "0")]
    server_cpus: String,
    /// CPU every load generator is pinned to.
    #[arg(long, default_value_t = 1)]
    client_cpu: usize,
    /// Distinct keys, preloaded and checked before measuring.
    #[arg(long, default_value_t = 100_000)]
    keys: u64,
    /// Value size in bytes.
    #[arg(long, default_value_t = 32)]
    value_size: usize,
    /// Pipeline depths of the GET and SET workloads.
    #[arg(long, value_delimiter = ',', default_value = "1,16,64")]
    depths: Vec<usize>,
    /// Multi-get sizes (keys per MGET).
    #[arg(long, value_delimiter = ',', default_value = "10,100")]
    mget: Vec<usize>,
    /// Connections (redis-benchmark -c), or native frames in flight.
    #[arg(long, default_value_t = 50)]
    conns: usize,
    /// Measured seconds per case.
    #[arg(long, default_value_t = 5.0)]
    duration: f64,
    /// GETs per second offered in the paced case (RESP servers): the CPU
    /// each server spends per operation when not saturated. 0: half of
    /// Redis's GET P1 rate measured in the same run; negative: no paced case.
    #[arg(long, default_value_t = 0.0, allow_negative_numbers = true)]
    paced_rate: f64,
    /// COUNT of the SCAN case on RESP servers (full iterations of the
    /// preloaded keys: calls and time per iteration); 0: no SCAN case.
    #[arg(long, default_value_t = 100)]
    scan_count: usize,
    /// Print one JSON object per result as well as the table.
    #[arg(long)]
    json: bool,
}

/// Runs `bench compare`; fails if any read came back wrong.
pub fn run(a: CompareArgs) -> Result<(), String> {
    let duration = duration_of(a.duration)?;
    let opts = CompareOpts {
        systems: a
            .systems
            .iter()
            .map(|s| System::parse(s))
            .collect::<Result<_, _>>()?,
        server_cpus: a.server_cpus,
        client_cpu: a.client_cpu,
        keys: a.keys,
        value_size: a.value_size,
        depths: a.depths,
        mget: a.mget,
        conns: a.conns,
        duration,
        paced_rate: (a.paced_rate >= 0.0).then_some(a.paced_rate),
        scan_count: (a.scan_count > 0).then_some(a.scan_count),
    };
    let rows = compare::run(&opts)?;
    compare::print(&opts, &rows);
    if a.json {
        for r in &rows {
            println!("{}", compare::json(&rows, r));
        }
    }
    if rows.iter().any(|r| r.result.wrong_values > 0) {
        return Err("some reads returned wrong values".into());
    }
    Ok(())
}
