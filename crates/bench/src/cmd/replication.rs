//! `fabrickv bench replication`: flags, and the check of the run.

use std::time::Duration;

use crate::replication::{self, ReplOpts};

/// Flags of `fabrickv bench replication`.
#[derive(clap::Args)]
pub struct ReplicationArgs {
    /// Client connections, each with one write (or read) in flight.
    #[arg(long, default_value_t = 8)]
    clients: usize,
    /// Seconds of each measured run.
    #[arg(long, default_value_t = 2.0)]
    duration: f64,
    /// Distinct keys written and read (all of one server's slots).
    #[arg(long, default_value_t = 10_000)]
    keys: usize,
    /// Value length in bytes.
    #[arg(long, default_value_t = 64)]
    value_size: usize,
    /// Alternating rounds of each configuration (figures summed).
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// Primaries killed (SIGKILL) for the failover figures.
    #[arg(long, default_value_t = 30)]
    kills: usize,
    /// Also print one JSON line per result.
    #[arg(long)]
    json: bool,
}

/// Runs it; fails if a write or read was refused.
pub fn run(a: &ReplicationArgs) -> Result<(), String> {
    if !(a.duration.is_finite() && a.duration > 0.0) {
        return Err(format!("--duration must be positive, not {}", a.duration));
    }
    let o = ReplOpts {
        clients: a.clients.max(1),
        duration: Duration::from_secs_f64(a.duration),
        keys: a.keys,
        value_size: a.value_size,
        rounds: a.rounds,
        kills: a.kills,
    };
    let r = replication::run(&o)?;
    r.print();
    if a.json {
        for l in r.json_lines() {
            println!("{l}");
        }
    }
    let refused: u64 = r.rows.iter().map(|x| x.wrong_values).sum();
    if refused > 0 {
        return Err(format!("{refused} operations were refused"));
    }
    Ok(())
}
