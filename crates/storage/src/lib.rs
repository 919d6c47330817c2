//! Persistent shards: one ordered key-value store per directory, behind a
//! backend trait ([`ShardBackend`]) so the copy source, the copy target
//! and the tools do not depend on the engine underneath. The persistent
//! implementation is on fjall 3, an LSM tree with key-value separation, as
//! the RocksDB shards FabricKV's replace were on a RocksDB fork with blob
//! files; [`MemShard`] is the in-memory one that tests run the same
//! conformance suite against (`tests.rs`, `backend_tests!`).
//!
//! What a shard promises:
//! - Writes are atomic per batch, and durable when [`Durability::Sync`]
//!   returns (the write-ahead journal is synced first): a process killed
//!   right after loses nothing it acknowledged.
//! - A [`ShardSnapshot`] is a consistent point-in-time view; writes after
//!   it are not seen by its scans, however long they run.
//! - Any byte string is a key, the empty one included (the RocksDB
//!   replicator dropped empty keys), up to [`SHARD_KEY_BYTES_MAX`].

mod blob_scan;
mod fjall_shard;
pub mod gen;
mod mem_shard;

use std::ops::Bound;

// The digest and the bounds live in `fabrickv-types`, where the wire
// codecs (shard data ops, copy streams) reach them without this crate.
pub use fabrickv_types::digest::{Digest, PairDigest};
pub use fabrickv_types::limits::{SHARD_KEY_BYTES_MAX, SHARD_VALUE_BYTES_MAX};
pub use fjall_shard::{
    create_private_dir, dirs_open_to_others, restrict_to_owner, FjallShard, ShardOptions,
    SHARD_DIR_MODE, SHARD_FILE_MODE,
};
pub use mem_shard::MemShard;

/// Values of this many bytes or more live in blob files beside the tree
/// (key-value separation), so compaction moves only keys and pointers;
/// the RocksDB shards' threshold.
pub const KV_SEPARATION_BYTES_MIN: u32 = 128;

/// What can go wrong in a shard.
#[derive(Debug, thiserror::Error)]
pub enum StorageError {
    /// The engine (or the disk under it) failed.
    #[error("storage engine: {0}")]
    Engine(String),
    /// A file-system operation failed.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// The cause.
        source: std::io::Error,
    },
    /// A key or value outside the shard's bounds.
    #[error("{0}")]
    TooLarge(String),
    /// The directory holds something that is not a shard.
    #[error("{0}")]
    NotAShard(String),
}

impl From<fjall::Error> for StorageError {
    fn from(e: fjall::Error) -> Self {
        StorageError::Engine(e.to_string())
    }
}

impl From<lsm_tree::Error> for StorageError {
    fn from(e: lsm_tree::Error) -> Self {
        StorageError::Engine(e.to_string())
    }
}

/// Result of a shard operation.
pub type Result<T> = std::result::Result<T, StorageError>;

/// How far a write must have gone before the call returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Durability {
    /// The journal is synced to the disk (`fdatasync`): survives a crash
    /// of the process and of the machine. What a server acknowledges.
    Sync,
    /// The journal is handed to the operating system: survives a crash of
    /// the process, not of the machine. For bulk loads that sync at the
    /// end ([`ShardBackend::sync`]).
    Buffered,
}

/// One write of a batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Write<'a> {
    /// Sets `key` to `value`.
    Put(&'a [u8], &'a [u8]),
    /// Removes `key` (absent is fine).
    Delete(&'a [u8]),
}

/// A key-value pair read from a shard.
pub type Pair = (Vec<u8>, Vec<u8>);

/// The pairs a [`ShardSnapshot::scan`] yields, in key order; boxed so
/// that each backend returns its own iterator through the one trait.
pub type PairIter<'a> = Box<dyn Iterator<Item = Result<Pair>> + Send + 'a>;

/// What [`ShardSnapshot::scan_each`] calls with each pair, borrowed;
/// returns false to stop.
pub type PairVisitor<'a> = dyn FnMut(&[u8], &[u8]) -> Result<bool> + 'a;

/// A persistent, ordered key-value store in one directory.
pub trait ShardBackend: Send + Sync {
    /// The value of `key`, if present.
    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>>;

    /// Applies `writes` atomically (all or none are visible, before and
    /// after a crash), in order, durable as `durability` says.
    fn write(&self, writes: &[Write<'_>], durability: Durability) -> Result<()>;

    /// A consistent point-in-time view for scans.
    fn snapshot(&self) -> Box<dyn ShardSnapshot>;

    /// Makes every write so far durable (journal and data synced).
    fn sync(&self) -> Result<()>;

    /// Pairs in the shard, estimated (exact counts come from a scan).
    fn approximate_len(&self) -> u64;

    /// Bytes the shard takes on disk.
    fn disk_bytes(&self) -> u64;

    /// Bulk-loads pairs in ascending key order into an empty key range:
    /// `next` fills the key and value buffers and returns false when there
    /// are no more. Visible and durable once this returns; returns how many
    /// pairs there were. A key not greater than the one before is an
    /// error, and nothing of the load becomes visible. Generic, not a
    /// trait object's method, so a bulk writer's per-pair call is inlined.
    fn load<F>(&self, next: F) -> Result<u64>
    where
        F: FnMut(&mut Vec<u8>, &mut Vec<u8>) -> Result<bool>,
        Self: Sized;

    /// Tells the backend that what was written so far will not be read
    /// soon, so the pages caching it may go: a bulk writer calls this after
    /// each durable load, so that a copy larger than memory does not evict
    /// everything else the machine caches (and its verification reads the
    /// disk, not the cache). Advice only: nothing fails, and a backend with
    /// no page cache of its own does nothing.
    fn drop_cached_pages(&self) {}
}

/// A point-in-time view of a shard.
pub trait ShardSnapshot: Send + Sync {
    /// The pairs with keys in `(from, to)`, in key order.
    fn scan<'a>(&'a self, from: Bound<&[u8]>, to: Bound<&[u8]>) -> PairIter<'a>;

    /// Calls `each` with every pair with key in `(from, to)`, in key order,
    /// until it returns false; the pairs are borrowed, not copied out (the
    /// copier's range iterators call this for every pair of a shard).
    /// Meant for one pass over much of a shard (copy, verification,
    /// checksum): the fjall backend reads values in large windows and
    /// drops the pages behind it from the page cache, so a scan of a shard
    /// larger than memory does not evict everything else; point reads
    /// (`get`) are for data that is read again.
    fn scan_each(
        &self,
        from: Bound<&[u8]>,
        to: Bound<&[u8]>,
        each: &mut PairVisitor<'_>,
    ) -> Result<()>;

    /// The size of `key`'s value in bytes, if present, read from the key's
    /// index entry (a value in a blob file is not read): weighs key
    /// samples by size.
    fn value_size(&self, key: &[u8]) -> Result<Option<u32>>;

    /// Up to `n` keys spread evenly over the shard in key order, for
    /// splitting it into ranges of similar size (one pass over the keys).
    fn sample_keys(&self, n: usize) -> Result<Vec<Vec<u8>>>;
}

/// Checks a write against the shard's bounds before anything is written.
pub fn check_write(w: &Write<'_>) -> Result<()> {
    let (key, value) = match w {
        Write::Put(k, v) => (*k, Some(*v)),
        Write::Delete(k) => (*k, None),
    };
    if key.len() > SHARD_KEY_BYTES_MAX {
        return Err(StorageError::TooLarge(format!(
            "a {}-byte key exceeds SHARD_KEY_BYTES_MAX ({SHARD_KEY_BYTES_MAX})",
            key.len()
        )));
    }
    if let Some(v) = value.filter(|v| v.len() > SHARD_VALUE_BYTES_MAX) {
        return Err(StorageError::TooLarge(format!(
            "a {}-byte value exceeds SHARD_VALUE_BYTES_MAX ({SHARD_VALUE_BYTES_MAX})",
            v.len()
        )));
    }
    Ok(())
}

/// The digest of every pair of `snap`, in one scan (pairs borrowed, not
/// copied out).
pub fn digest_of(snap: &dyn ShardSnapshot) -> Result<Digest> {
    let mut d = Digest::default();
    snap.scan_each(Bound::Unbounded, Bound::Unbounded, &mut |k, v| {
        d.add(k, v);
        Ok(true)
    })?;
    Ok(d)
}

#[cfg(test)]
mod tests;
