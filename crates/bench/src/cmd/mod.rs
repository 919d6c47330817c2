//! The `fabrickv bench ...` subcommands, one module each: its flags (a
//! clap `Args` struct, which the binary only parses and hands over) and
//! its run: starting servers and peers, sweeps of client processes,
//! printing the tables and JSON lines.
//!
//! - [`auth`]: what the cluster secret costs a connection and a GET;
//! - [`bigvalue`]: GET and SET of one large value (16 MiB) over RESP
//!   beside a raw TCP stream and redis-server;
//! - [`kv`], [`herd`], [`compare`], [`ps`], [`cache`], [`copy`], [`rpc`],
//!   [`cluster`]: one per subcommand of the same name;
//! - [`slabs`]: store mode when value sizes shift (fill, delete half,
//!   write other sizes until refused) beside memcached with
//!   `slab_automove=1`, over memcached's text protocol;
//! - [`mget`]: the client's CPU per key of a batched read, `mget`
//!   beside `mget_into` (values decoded into the caller's buffer);
//! - [`partition_move`]: `bench partition-move`;
//! - [`replication`]: what a second copy costs beside Redis with a
//!   replica and `WAIT`, and how fast a killed primary fails over;
//! - [`checkpoint`]: `bench checkpoint`, a checkpoint's save and restore
//!   beside the disk and Redis's BGSAVE and restart;
//! - [`growth`]: `bench growth`, a 4th server added to 3 under load,
//!   beside `fabrickv copy` of the same bytes;
//! - [`sweep`]: the client processes of `bench ps --clients` and `bench
//!   herd --clients`, released together at a registry barrier.
//!
//! The binary installs every transport it was built with before it
//! dispatches here, so addresses of every scheme it knows resolve.

use std::time::Duration;

use clap::Args;

use crate::load::Shape;

pub mod auth;
pub mod bigvalue;
pub mod cache;
pub mod checkpoint;
pub mod cluster;
pub mod compare;
pub mod copy;
pub mod growth;
pub mod herd;
pub mod kv;
pub mod mget;
pub mod partition_move;
pub mod ps;
pub mod replication;
pub mod rpc;
pub mod slabs;
pub mod sweep;

/// The CPUs of a `--server-cpus` or `--client-cpus` flag (taskset
/// syntax); none when the flag is absent.
pub fn cpu_list(s: &Option<String>) -> Result<Vec<usize>, String> {
    s.as_deref()
        .map_or(Ok(Vec::new()), fabrickv_types::cpus::parse_cpu_list)
}

/// The flags of a native kv load's [`Shape`], as `bench kv` and `bench
/// partition-move` take them (HERD's mix by default).
#[derive(Args)]
pub struct ShapeArgs {
    /// Key size in bytes (16 = HERD).
    #[arg(long, default_value_t = 16)]
    key_size: usize,
    /// Value size in bytes.
    #[arg(long, default_value_t = 32)]
    value_size: usize,
    /// Percentage of GETs (the rest are PUTs); HERD uses 95.
    #[arg(long, default_value_t = 95)]
    get_percent: u32,
    /// Operations per request frame (batch depth).
    #[arg(long, default_value_t = 16)]
    batch: usize,
    /// Request frames in flight per connection.
    #[arg(long, default_value_t = 8)]
    in_flight: usize,
}

impl ShapeArgs {
    /// The shape the flags ask for (a GET share over 100% is all GETs).
    pub fn shape(&self) -> Shape {
        Shape {
            batch: self.batch,
            in_flight: self.in_flight,
            get_percent: self.get_percent.min(100),
            key_size: self.key_size,
            value_size: self.value_size,
        }
    }
}

/// A `--duration` in seconds as a duration; it must be positive.
fn duration_of(seconds: f64) -> Result<Duration, String> {
    if !(seconds.is_finite() && seconds > 0.0) {
        return Err("--duration must be a positive number of seconds".into());
    }
    Ok(Duration::from_secs_f64(seconds))
}

#[cfg(test)]
mod tests {
    use clap::{CommandFactory, Parser};

    use super::*;

    /// `bench kv` and `bench partition-move` as the binary parses them.
    #[derive(Parser)]
    enum Bench {
        Kv(kv::KvArgs),
        PartitionMove(partition_move::PartitionMoveArgs),
    }

    fn shape_of(args: &[&str]) -> Shape {
        match Bench::try_parse_from(args).expect("flags parse") {
            Bench::Kv(a) => a.shape.shape(),
            Bench::PartitionMove(a) => a.shape.shape(),
        }
    }

    #[test]
    fn kv_and_partition_move_take_the_same_shape_flags() {
        Bench::command().debug_assert();
        for cmd in ["kv", "partition-move"] {
            assert_eq!(shape_of(&["bench", cmd]), Shape::default(), "{cmd}");
            let flags = [
                "--key-size",
                "20",
                "--value-size",
                "100",
                "--get-percent",
                "150",
                "--batch",
                "4",
                "--in-flight",
                "2",
            ];
            let args: Vec<&str> = ["bench", cmd].into_iter().chain(flags).collect();
            let want = Shape {
                batch: 4,
                in_flight: 2,
                get_percent: 100,
                key_size: 20,
                value_size: 100,
            };
            assert_eq!(shape_of(&args), want, "{cmd}");
        }
    }
}
