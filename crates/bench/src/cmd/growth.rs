//! `fabrickv bench growth`: flags, and the check of the run.

use std::time::Duration;

use crate::growth::{self, GrowthOpts};

/// Flags of `fabrickv bench growth`.
#[derive(clap::Args)]
pub struct GrowthArgs {
    /// Keys in the cluster before the move.
    #[arg(long, default_value_t = 400_000)]
    keys: u64,
    /// Value length in bytes (at least 8).
    #[arg(long, default_value_t = 1024)]
    value_size: usize,
    /// Copies of each slot (1 to 3).
    #[arg(long, default_value_t = 1)]
    replicas: u8,
    /// Seconds the reader and writer run before the move.
    #[arg(long, default_value_t = 2.0)]
    steady: f64,
    /// Also run `fabrickv bench copy` on the same bytes, the rate the
    /// move's is judged against.
    #[arg(long)]
    compare: bool,
    /// Also print one JSON line.
    #[arg(long)]
    json: bool,
}

/// Runs it; fails if an acknowledged write was lost.
pub fn run(a: &GrowthArgs) -> Result<(), String> {
    if !(a.steady.is_finite() && a.steady > 0.0) {
        return Err(format!("--steady must be positive, not {}", a.steady));
    }
    if !(1..=3).contains(&a.replicas) {
        return Err(format!("--replicas is 1 to 3, not {}", a.replicas));
    }
    let r = growth::run(&GrowthOpts {
        keys: a.keys,
        value_size: a.value_size,
        replicas: a.replicas,
        steady: Duration::from_secs_f64(a.steady),
        compare_copy: a.compare,
    })?;
    r.print();
    if a.json {
        println!("{}", r.json());
    }
    if r.lost > 0 {
        return Err(format!("{} acknowledged writes were lost", r.lost));
    }
    Ok(())
}
