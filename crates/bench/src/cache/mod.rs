//! `fabrickv bench cache`: the KV-cache read benchmark (large values with
//! a TTL, written once, then read by several threads at once) and its
//! peer, redis-server, driven the same way.
//!
//! Every value is a function of its key's index and of the byte position
//! ([`fill_value`]), so each read is checked whole where it landed
//! ([`check_value`]): a stale, torn, misplaced or foreign value fails the
//! run instead of being counted as a fast read. The check costs one pass
//! over the bytes the read brought in, so it is part of the read rate,
//! for FabricKV and Redis alike.
//!
//! The phases are generic over a [`ValueSink`] (writes) and a
//! [`ValueSource`] (reads): [`CacheClient`](fabrickv_client::CacheClient) implements both over FabricKV's
//! native data plane, [`RespClient`] over the Redis protocol, so the two
//! systems are measured by the same loops.
//!
//! Layout: [`values`] (keys and checked values), [`source`] (what the
//! phases read and write, and FabricKV's client as both), [`phases`] (the
//! runner), [`stats`] (the report's figures), [`server`] (a started
//! FabricKV server), [`resp`] (the Redis client), [`redis`] (the peer).

use std::time::Duration;

pub mod phases;
pub mod redis;
pub mod resp;
pub mod server;
pub mod source;
pub mod stats;
pub mod values;

pub use phases::{run_readers, single_gets, write_all, ReadOpts, ReadResult, WriteResult};
pub use redis::{redis_peer, RedisPeer, RedisReads};
pub use resp::{Reply, RespClient, RESP_BULK_BYTES_MAX};
pub use server::{pool_bytes_for, spawn_server, CacheServer, POOL_BYTES_MIN};
pub use source::{connect_cache, connect_reader, OnValue, ValueSink, ValueSource};
pub use stats::{format_bytes, mb_per_s, LatencyStats};
pub use values::{check_value, fill_value, key_name, key_names};

/// Per-call timeout of the benchmark's clients (FabricKV and Redis): long
/// enough for a 64 MB value over loopback on a busy machine, short enough
/// that a hung server fails the run.
pub const CACHE_BENCH_TIMEOUT: Duration = Duration::from_secs(10);

/// Random single GETs of kv-bench's latency analysis.
pub const LATENCY_SAMPLES: u64 = 100;
