//! `fabrickv partitions show|move`: the server's partition table (which
//! worker serves each partition, with each partition's counters), and
//! moving one partition to another worker while the server serves.

use std::process::ExitCode;

use clap::Subcommand;
use fabrickv_client::PartitionTable;

use crate::{connect, ServerArg};

#[derive(Subcommand)]
pub enum PartitionsCommand {
    /// Prints the table: epoch, then per partition its owner, the native
    /// operations executed on it and how many of those were misrouted.
    Show {
        #[command(flatten)]
        server: ServerArg,
    },
    /// Makes --worker serve --partition; prints the new table. Clients
    /// learn of it from their next reply for that partition.
    Move {
        #[command(flatten)]
        server: ServerArg,
        /// The partition (0-based).
        #[arg(long)]
        partition: u32,
        /// Its new owner (0-based worker).
        #[arg(long)]
        worker: u16,
    },
}

/// Runs one `partitions` subcommand.
pub fn run(cmd: PartitionsCommand) -> Result<ExitCode, String> {
    let table = match cmd {
        PartitionsCommand::Show { server } => connect(&server)?
            .partition_table()
            .map_err(|e| format!("partitions: {e}"))?,
        PartitionsCommand::Move {
            server,
            partition,
            worker,
        } => connect(&server)?
            .move_partition(partition, worker)
            .map_err(|e| format!("move partition {partition} to worker {worker}: {e}"))?,
    };
    print!("{}", render(&table));
    Ok(ExitCode::SUCCESS)
}

/// The table as text: one header line, then one line per partition.
fn render(t: &PartitionTable) -> String {
    let mut s = format!(
        "epoch {}  workers {}  partitions {}\n{:>9} {:>6} {:>14} {:>12}\n",
        t.epoch,
        t.workers,
        t.owners.len(),
        "partition",
        "worker",
        "ops",
        "misrouted"
    );
    for (p, owner) in t.owners.iter().enumerate() {
        s.push_str(&format!(
            "{p:>9} {owner:>6} {:>14} {:>12}\n",
            t.ops[p], t.misrouted[p]
        ));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn render_lists_every_partition() {
        let t = PartitionTable {
            epoch: 3,
            workers: 2,
            owners: vec![1, 0],
            ops: vec![10, 20],
            misrouted: vec![1, 0],
        };
        let text = render(&t);
        assert!(text.starts_with("epoch 3  workers 2  partitions 2\n"));
        assert_eq!(text.lines().count(), 4);
        assert!(text
            .lines()
            .nth(2)
            .expect("partition 0")
            .ends_with("1             10            1"));
    }
}
