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
//! - [`sweep`]: the client processes of `bench ps --clients` and `bench
//!   herd --clients`, released together at a registry barrier.
//!
//! The binary installs every transport it was built with before it
//! dispatches here, so addresses of every scheme it knows resolve.

use std::time::Duration;

pub mod auth;
pub mod bigvalue;
pub mod cache;
pub mod cluster;
pub mod compare;
pub mod copy;
pub mod herd;
pub mod kv;
pub mod mget;
pub mod partition_move;
pub mod ps;
pub mod rpc;
pub mod slabs;
pub mod sweep;

/// The CPUs of a `--server-cpus` or `--client-cpus` flag (taskset
/// syntax); none when the flag is absent.
pub fn cpu_list(s: &Option<String>) -> Result<Vec<usize>, String> {
    s.as_deref()
        .map_or(Ok(Vec::new()), fabrickv_types::cpus::parse_cpu_list)
}

/// A `--duration` in seconds as a duration; it must be positive.
fn duration_of(seconds: f64) -> Result<Duration, String> {
    if !(seconds.is_finite() && seconds > 0.0) {
        return Err("--duration must be a positive number of seconds".into());
    }
    Ok(Duration::from_secs_f64(seconds))
}
