//! The store's configuration and its bounds.

use crate::alloc::CACHE_BLOCK_ALIGN_BYTES;
use crate::CacheError;

/// Smallest pool accepted, in bytes (one page): below it the watermarks
/// would round to nothing and no real value would fit.
pub const CACHE_POOL_BYTES_MIN: usize = 4096;

/// Largest pool accepted, in bytes (1 TiB): far above any host's DRAM
/// today, low enough that offsets and byte counts never come near
/// overflowing.
pub const CACHE_POOL_BYTES_MAX: usize = 1 << 40;

/// Default pool size, in bytes (1 GiB).
pub const CACHE_POOL_BYTES_DEFAULT: usize = 1 << 30;

/// Default high watermark, as a fraction of the pool.
pub const CACHE_HIGH_WATERMARK_DEFAULT: f64 = 0.90;

/// Default low watermark, as a fraction of the pool.
pub const CACHE_LOW_WATERMARK_DEFAULT: f64 = 0.80;

/// How a [`crate::CacheStore`] is sized and when it evicts.
#[derive(Debug, Clone, PartialEq)]
pub struct CacheConfig {
    /// Bytes of the value pool (rounded down to `CACHE_BLOCK_ALIGN_BYTES`),
    /// in `CACHE_POOL_BYTES_MIN..=CACHE_POOL_BYTES_MAX`.
    pub pool_bytes: usize,
    /// LRU eviction on (a cache); off, a reservation that finds no room
    /// fails with `CacheError::Full` (a store that never drops data).
    pub evict: bool,
    /// Fraction of `pool_bytes` in `0.0..=1.0`: a reservation that would
    /// take the used bytes above it first evicts (with `evict` on), so a
    /// burst of puts finds room without evicting on every put.
    pub high_watermark: f64,
    /// Fraction of `pool_bytes`, at most `high_watermark`: eviction frees
    /// down to it, so it runs in batches rather than one entry per put.
    pub low_watermark: f64,
    /// Fault the pool's pages in at start (steady latency from the first
    /// put, and the memory is known to be there), else lazily.
    pub populate: bool,
}

impl Default for CacheConfig {
    fn default() -> CacheConfig {
        CacheConfig {
            pool_bytes: CACHE_POOL_BYTES_DEFAULT,
            evict: true,
            high_watermark: CACHE_HIGH_WATERMARK_DEFAULT,
            low_watermark: CACHE_LOW_WATERMARK_DEFAULT,
            populate: false,
        }
    }
}

impl CacheConfig {
    /// Checks every field against its bounds.
    pub fn validate(&self) -> Result<(), CacheError> {
        if !(CACHE_POOL_BYTES_MIN..=CACHE_POOL_BYTES_MAX).contains(&self.pool_bytes) {
            return Err(CacheError::InvalidConfig(format!(
                "pool_bytes {} outside {CACHE_POOL_BYTES_MIN}..={CACHE_POOL_BYTES_MAX}",
                self.pool_bytes
            )));
        }
        for (name, w) in [
            ("high_watermark", self.high_watermark),
            ("low_watermark", self.low_watermark),
        ] {
            if !(0.0..=1.0).contains(&w) {
                return Err(CacheError::InvalidConfig(format!(
                    "{name} {w} outside 0.0..=1.0"
                )));
            }
        }
        if self.low_watermark > self.high_watermark {
            return Err(CacheError::InvalidConfig(format!(
                "low_watermark {} above high_watermark {}",
                self.low_watermark, self.high_watermark
            )));
        }
        Ok(())
    }

    /// The pool bytes actually managed: `pool_bytes` rounded down to whole
    /// blocks.
    pub fn usable_pool_bytes(&self) -> usize {
        self.pool_bytes - self.pool_bytes % CACHE_BLOCK_ALIGN_BYTES
    }
}
