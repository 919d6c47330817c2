//! The in-memory store of FabricKV's KV-cache service (the role of
//! Mooncake Store or LMCache): large values (attention KV blocks, 1 byte to
//! `CACHE_VALUE_BYTES_MAX`) under long keys, with TTL, LRU eviction at a
//! high watermark, and read leases.
//!
//! Why it is shaped this way:
//! - Values are MiB-sized, so copying them under a lock would serialize
//!   every worker. The lock protects only bookkeeping; bytes are written
//!   through a [`PutSlot`] (reserve, fill, commit) and read through a
//!   [`Lease`], both outside the lock.
//! - A reader may be halfway through sending a value when it is deleted,
//!   replaced or evicted. A lease keeps the block allocated and untouched
//!   until it drops; the key itself is unlinked at once, so new readers see
//!   the new state.
//! - Values live in one anonymous mapping managed by a segregated-fit
//!   allocator with coalescing (`alloc`), not in per-value heap
//!   allocations: the pool is sized once, can be faulted in and backed by
//!   huge pages, and fragmentation is measured rather than left to malloc.
//! - It is sans-I/O: no threads, no clock. Time comes in as `now_ms`, a
//!   monotonic millisecond clock of the caller's choosing, so TTL behaviour
//!   is deterministic under test.
//!
//! Layout:
//! - `config`: [`CacheConfig`] and its bounds.
//! - `alloc`: the pool allocator (offsets only).
//! - `copy`: [`copy_to_reader`], non-temporal copies of large values into
//!   a reader's buffer.
//! - `pool`: the mapping, and the two `unsafe` ways into it.
//! - `state`: everything under the lock (index, records, LRU, deadlines).
//! - `store`: [`CacheStore`], [`PutSlot`], [`Lease`] and the block
//!   ownership rule that makes the `unsafe` sound.

mod alloc;
mod config;
mod copy;
mod error;
mod pool;
mod state;
mod stats;
mod store;

#[cfg(test)]
mod tests;

pub use alloc::{
    block_bytes, CACHE_BLOCK_ALIGN_BYTES, SIZE_CLASS_SUBDIVISIONS, SIZE_CLASS_SUBDIVISIONS_LOG2,
};
pub use config::{
    CacheConfig, CACHE_HIGH_WATERMARK_DEFAULT, CACHE_LOW_WATERMARK_DEFAULT,
    CACHE_POOL_BYTES_DEFAULT, CACHE_POOL_BYTES_MAX, CACHE_POOL_BYTES_MIN,
};
pub use copy::{copy_to_reader, STREAMING_COPY_BYTES_MIN};
pub use error::CacheError;
pub use pool::PAGE_BYTES;
pub use state::{DEADLINE_HEAP_SLACK_ENTRIES, DEADLINE_HEAP_STALE_FACTOR};
pub use stats::CacheStats;
pub use store::{CacheStore, Lease, PutSlot, SnapshotChunk};
