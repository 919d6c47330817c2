//! A FabricKV server started for the benchmark, with a cache pool sized
//! for its keys.

use std::time::Duration;

use fabrickv_client::{CacheClient, CacheClientOptions};

use crate::peers::{self, ServerProcess};

/// Smallest cache pool given to a started server, bytes: the server's
/// fixed costs stay small next to it even for a handful of keys.
pub const POOL_BYTES_MIN: u64 = 256 << 20;

/// Granule every cached value is rounded up to in the pool (one cache
/// line: `fabrickv_cache`'s block alignment), for sizing the pool.
const POOL_BLOCK_BYTES: u64 = 64;

/// Cache pool for `num_keys` values of `value_size` bytes: their blocks
/// plus a quarter, so the pool stays under the eviction watermark (0.9)
/// and no key is evicted while it is read; at least [`POOL_BYTES_MIN`].
pub fn pool_bytes_for(num_keys: u64, value_size: usize) -> u64 {
    let block = (value_size as u64).div_ceil(POOL_BLOCK_BYTES).max(1) * POOL_BLOCK_BYTES;
    num_keys
        .saturating_mul(block)
        .saturating_mul(5)
        .div_ceil(4)
        .max(POOL_BYTES_MIN)
}

/// A FabricKV server started for the cache benchmark.
pub type CacheServer = ServerProcess;

/// Starts `fabrickv serve` (this binary) on loopback with `transport`
/// (tcp, shm, or fabric with `provider`), pinned to `cpus` (worker i to
/// the i-th CPU of the list), with a cache
/// pool of `pool_bytes` and no gRPC control plane (the benchmark needs
/// none, and the default gRPC port may be another server's). Ready once
/// a cache client can connect.
pub fn spawn_server(
    transport: &str,
    provider: &str,
    cpus: Option<&str>,
    workers: usize,
    pool_bytes: u64,
) -> Result<CacheServer, String> {
    let addr = peers::fabrickv_listen_addr(transport, provider, "cache")?;
    let mut cmd = peers::fabrickv_serve(cpus, &addr, workers)?;
    cmd.args(["--memory", "64MB", "--log-level", "warn", "--grpc", "off"])
        .args(["--cache-memory", &pool_bytes.to_string()]);
    let probe = addr.clone();
    let child = peers::spawn_until(cmd, "fabrickv", || {
        CacheClient::connect_with(
            &probe,
            CacheClientOptions {
                buffer_bytes: 4096,
                timeout: Duration::from_millis(200),
            },
        )
        .is_ok()
    })?;
    Ok(CacheServer { child, addr })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pool_holds_every_value_below_the_watermark() {
        assert_eq!(pool_bytes_for(10, 100), POOL_BYTES_MIN);
        assert_eq!(pool_bytes_for(4096, 1 << 20), 5 << 30);
    }
}
