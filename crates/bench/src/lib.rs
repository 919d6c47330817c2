//! The load generators behind `fabrickv bench ...`.
//!
//! Layout:
//! - [`report`]: one result type, printed as the seeds' box tables and as
//!   one JSON object per line (`--json`);
//! - [`keys`]: HERD-style keys (16-byte hashes of integers) and the values
//!   that go with them, so every read can be checked;
//! - [`kv`]: the GET/PUT mix against FabricKV's native protocol;
//! - [`herd`]: HERD's workload and Cores x Batched/Non-batched table;
//! - [`peers`]: starting and driving peers (redis-server, redis-benchmark)
//!   in the same run, pinned to the same cores, for ratios;
//! - [`memcache`]: a memcached text-protocol load generator shaped like
//!   redis-benchmark, for memcached's side of `bench compare`;
//! - [`cpu`]: a server process's CPU time from `/proc`, for CPU-seconds;
//! - [`compare`]: FabricKV (RESP, native tcp and shm) beside redis-server
//!   and memcached on the same workloads, with server CPU-seconds;
//! - [`limits`]: the bounds `bench ps` is judged against, measured in the
//!   same run (memcpy bandwidth, raw TCP request/response and stream
//!   rates, redis-server's MGET);
//! - [`ps_report`]: PetPS's output (its throughput line and markdown
//!   tables);
//! - [`cache`]: the KV cache's read benchmark (the seed's phases and
//!   latency analysis) beside redis-server GET, a raw TCP stream and memcpy.
//!
//! Benchmarks are not tests: they measure. A small run of each is part of
//! `make test` only so that none of them rots.

pub mod baseline;
pub mod cache;
pub mod cluster;
pub mod compare;
pub mod cpu;
pub mod herd;
pub mod keys;
pub mod kv;
pub mod limits;
pub mod memcache;
pub mod peers;
pub mod ps;
pub mod ps_report;
pub mod report;
pub mod rpc;

/// Pins the calling thread to CPU `id` (no-op where unsupported).
pub fn pin_current_thread(id: usize) {
    core_affinity::set_for_current(core_affinity::CoreId { id });
}
