//! `fabrickv bench partition-move`: a loaded server's partitions moved
//! between its workers, and what the clients saw (`crate::partmove`).

use std::time::Duration;

use clap::Args;

use super::ShapeArgs;
use crate::partmove::{self, MoveOpts};

#[derive(Args)]
pub struct PartitionMoveArgs {
    /// tcp or shm.
    #[arg(long, default_value = "tcp")]
    transport: String,
    /// Workers of the server this command starts.
    #[arg(long, default_value_t = 2)]
    workers: usize,
    /// Partitions of that server.
    #[arg(long, default_value_t = 8)]
    partitions: usize,
    /// Client threads.
    #[arg(long, default_value_t = 2)]
    threads: usize,
    /// Distinct keys, preloaded.
    #[arg(long, default_value_t = 100_000)]
    keys: u64,
    #[command(flatten)]
    pub(super) shape: ShapeArgs,
    /// Seconds of each steady phase (before and after the moves).
    #[arg(long, default_value_t = 3.0)]
    steady: f64,
    /// Seconds of the phase in which partitions move.
    #[arg(long, default_value_t = 3.0)]
    moving: f64,
    /// Milliseconds between two moves.
    #[arg(long, default_value_t = 50)]
    move_every_ms: u64,
    /// Milliseconds of a latency window.
    #[arg(long, default_value_t = 100)]
    window_ms: u64,
    /// Runs of the three phases, each on a fresh server; the verdict is
    /// the median of the runs' p99 ratios (a shared machine's noise moves
    /// one run's p99 by several times).
    #[arg(long, default_value_t = 1)]
    rounds: usize,
    /// Also print every window's p50 and p99.
    #[arg(long)]
    windows: bool,
    /// Print one JSON object per result (and a summary) as well as the table.
    #[arg(long)]
    json: bool,
}

fn seconds(what: &str, s: f64) -> Result<Duration, String> {
    if !(s.is_finite() && s > 0.0) {
        return Err(format!("--{what} must be a positive number of seconds"));
    }
    Ok(Duration::from_secs_f64(s))
}

/// Runs `bench partition-move`; fails if any client saw an error.
pub fn run(a: PartitionMoveArgs) -> Result<(), String> {
    let o = MoveOpts {
        transport: a.transport,
        workers: a.workers,
        partitions: a.partitions,
        threads: a.threads,
        keys: a.keys,
        shape: a.shape.shape(),
        steady: seconds("steady", a.steady)?,
        moving: seconds("moving", a.moving)?,
        move_every: Duration::from_millis(a.move_every_ms),
        window: Duration::from_millis(a.window_ms),
    };
    if a.rounds == 0 {
        return Err("--rounds must be at least 1".into());
    }
    let mut reports = Vec::with_capacity(a.rounds);
    for round in 1..=a.rounds {
        let r = partmove::run(&o)?;
        if a.rounds > 1 {
            println!("round {round} of {}", a.rounds);
        }
        print!("{}", partmove::table(&o, &r));
        if a.windows {
            print!("{}", partmove::windows_table(&r));
        }
        if a.json {
            for p in &r.phases {
                let mut p = p.clone();
                p.params["round"] = round.into();
                println!("{}", p.json());
            }
            println!("{}", partmove::summary_json(&r));
        }
        reports.push(r);
    }
    let errors: u64 = reports.iter().map(|r| r.errors).sum();
    if a.rounds > 1 {
        let ratios: Vec<f64> = reports.iter().map(|r| r.p99_ratio()).collect();
        let noise: Vec<f64> = reports.iter().map(|r| r.p99_noise_ratio()).collect();
        let ops: Vec<f64> = reports
            .iter()
            .map(|r| r.phases.iter().map(|p| p.ops_per_s).sum::<f64>() / 3.0)
            .collect();
        let (ratio, noise_ratio, rate) = (
            partmove::median(ratios.clone()),
            partmove::median(noise),
            partmove::median(ops),
        );
        println!(
            "{} rounds: errors {errors}; median p99 moving / before {ratio:.2}x (rounds: {}); \
             median p99 after / before (noise) {noise_ratio:.2}x; median {:.2} Mops/s",
            a.rounds,
            ratios
                .iter()
                .map(|r| format!("{r:.2}"))
                .collect::<Vec<_>>()
                .join(" "),
            rate / 1e6
        );
        if a.json {
            println!(
                "{}",
                serde_json::json!({
                    "bench": "partition-move", "case": "median", "rounds": a.rounds,
                    "errors": errors, "p99_ratio": ratio, "p99_noise_ratio": noise_ratio,
                    "ops_per_s": rate, "p99_ratios": ratios,
                })
            );
        }
    }
    if errors > 0 {
        return Err(format!("clients saw {errors} errors"));
    }
    Ok(())
}
