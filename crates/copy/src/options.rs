//! What a copy is asked to do: [`CopyOptions`] and the defaults the CLI
//! shows.

use std::path::{Path, PathBuf};
use std::time::Duration;

/// Bytes of a range a writer loads before it makes them durable and
/// records the position (the granularity of `--resume`).
pub const COPY_DURABLE_BYTES_DEFAULT: u64 = 256 << 20;

/// Ranges a copy is split into unless told otherwise.
pub const COPY_RANGES_DEFAULT: u32 = 16;

/// Parallel streams unless told otherwise.
pub const COPY_PARALLELISM_DEFAULT: u16 = 2;

/// How often the target asks the source for its status while waiting for
/// the split, in milliseconds.
pub const COPY_SPLIT_POLL_MS: u64 = 20;

/// How often the target asks the source for its status while streaming,
/// in milliseconds (a source that failed says so here).
pub const COPY_STATUS_POLL_MS: u64 = 500;

/// Block cache of the target shard while copying, in bytes: none. The
/// writer never reads back what it wrote, and the verification scan reads
/// each value once, so a cache only costs: fjall inserts every value it
/// reads from a blob file, evicting another (the served shard's cache is
/// none for the same reason, `SERVED_SHARD_CACHE_BYTES`).
pub const COPY_TARGET_CACHE_BYTES: u64 = 0;

/// What to copy, from where, to where, how.
#[derive(Debug, Clone)]
pub struct CopyOptions {
    /// The source server's native address.
    pub from: String,
    /// The shard's name on the source.
    pub shard: String,
    /// The target directory.
    pub to: PathBuf,
    /// Ranges to split the shard into.
    pub ranges: u32,
    /// Data streams (parallel range iterators on the source, receivers and
    /// writers here).
    pub parallelism: u16,
    /// Continue an interrupted copy from each range's last durable
    /// position; without it an interrupted copy starts over.
    pub resume: bool,
    /// Bound on connecting (control and data).
    pub connect_timeout: Duration,
    /// Bound on each control op, and on silence of a data stream.
    pub op_timeout: Duration,
    /// See [`COPY_DURABLE_BYTES_DEFAULT`].
    pub durable_every_bytes: u64,
    /// Scan the copy at the end and compare its digest with the source's.
    pub verify: bool,
    /// Leave the copy's pages in the page cache after each durable load.
    /// Off by default, as RocksDB's bulk file writer invalidates the pages
    /// it writes: a bulk copy otherwise fills memory with pages nobody
    /// reads until the verification, evicting everything else the machine
    /// caches, and the verification then checks the cache, not the disk.
    pub keep_cached: bool,
}

impl CopyOptions {
    /// Options with the defaults for everything but the three names.
    pub fn new(from: &str, shard: &str, to: &Path) -> CopyOptions {
        CopyOptions {
            from: from.to_string(),
            shard: shard.to_string(),
            to: to.to_path_buf(),
            ranges: COPY_RANGES_DEFAULT,
            parallelism: COPY_PARALLELISM_DEFAULT,
            resume: false,
            connect_timeout: Duration::from_secs(5),
            op_timeout: Duration::from_secs(30),
            durable_every_bytes: COPY_DURABLE_BYTES_DEFAULT,
            verify: true,
            keep_cached: false,
        }
    }
}
