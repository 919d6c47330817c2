//! The peer comparison: redis-server holding the same keys and values,
//! read by the same readers over RESP.

use std::time::Duration;

use super::phases::{run_readers, write_all, ReadOpts, ReadResult, WriteResult};
use super::resp::RespClient;
use crate::peers;

/// What the Redis peer measured: the same write, warm-up and reads as
/// FabricKV's, over RESP.
#[derive(Debug, Clone)]
pub struct RedisPeer {
    /// The write phase (SET, one connection).
    pub write: WriteResult,
    /// The read phase (GET, one connection per thread).
    pub read: ReadResult,
}

/// A redis-server holding the benchmark's keys, so that its read phase
/// can run again, taking turns with FabricKV's (`--rounds`); stopped when
/// dropped.
pub struct RedisReads {
    _server: peers::Child,
    port: u16,
    /// The write phase (SET, one connection).
    pub write: WriteResult,
}

impl RedisReads {
    /// Starts redis-server pinned to `server_cpus` and writes the same
    /// keys and values with SET (EX `ttl`).
    pub fn start(
        o: &ReadOpts,
        keys: &[Vec<u8>],
        ttl: Option<Duration>,
        server_cpus: Option<&str>,
    ) -> Result<Self, String> {
        let (server, port) = peers::spawn_redis(server_cpus)?;
        let mut writer = RespClient::connect(port)?;
        let write = write_all(&mut writer, keys, o.value_size, ttl)
            .map_err(|e| format!("redis write phase: {e}"))?;
        Ok(Self {
            _server: server,
            port,
            write,
        })
    }

    /// The same readers as FabricKV's, with GET.
    pub fn read(&self, o: &ReadOpts, keys: &[Vec<u8>]) -> Result<ReadResult, String> {
        let port = self.port;
        run_readers(o, keys, |_| RespClient::connect(port), || {})
            .map_err(|e| format!("redis read phase: {e}"))
    }
}

/// Starts redis-server pinned to `server_cpus`, writes the same keys and
/// values with SET (EX `ttl`), then runs the same readers with GET; the
/// server is stopped before returning.
pub fn redis_peer(
    o: &ReadOpts,
    keys: &[Vec<u8>],
    ttl: Option<Duration>,
    server_cpus: Option<&str>,
) -> Result<RedisPeer, String> {
    let redis = RedisReads::start(o, keys, ttl, server_cpus)?;
    let read = redis.read(o, keys)?;
    Ok(RedisPeer {
        write: redis.write,
        read,
    })
}
