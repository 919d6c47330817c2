//! [`ShardBackend`] on fjall 3: one database per shard directory, the
//! pairs in one keyspace with key-value separation from
//! [`KV_SEPARATION_BYTES_MIN`], uncompressed (the copier's values are
//! uncompressible, and compressing them would only cost CPU).

use std::ops::Bound;
use std::path::{Path, PathBuf};

use fjall::{
    AbstractTree, CompressionType, Database, Keyspace, KeyspaceCreateOptions, KvSeparationOptions,
    PersistMode, Readable, Snapshot,
};
use lsm_tree::ValueType;

use crate::blob_scan::{BlobHandle, BlobReader};

use crate::{
    check_write, Durability, PairIter, PairVisitor, Result, ShardBackend, ShardSnapshot,
    StorageError, Write, KV_SEPARATION_BYTES_MIN,
};

/// The keyspace that holds a shard's pairs.
const DATA_KEYSPACE: &str = "data";

/// Folder of a keyspace's blob files, under the keyspace's own (lsm-tree's
/// layout: each file is named by its id).
const BLOBS_DIR: &str = "blobs";

/// Every key is stored behind this byte: fjall refuses the empty key,
/// which is a valid key of a shard (the RocksDB shard replicator FabricKV replaces lost it). One
/// constant byte in front keeps the order of the keys.
const KEY_TAG: u8 = b'k';

/// The stored form of `key`.
fn stored(key: &[u8]) -> Vec<u8> {
    let mut k = Vec::with_capacity(key.len() + 1);
    k.push(KEY_TAG);
    k.extend_from_slice(key);
    k
}

/// The user's key of a stored one.
fn user_key(stored: &[u8]) -> Result<&[u8]> {
    match stored.split_first() {
        Some((&KEY_TAG, key)) => Ok(key),
        _ => Err(StorageError::NotAShard(
            "a stored key without its tag: not a FabricKV shard".to_string(),
        )),
    }
}

/// Block cache of a shard, in bytes, unless [`ShardOptions`] says
/// otherwise: reads of a copy stream through once, so a large cache
/// would only hold what is not read again.
pub const SHARD_CACHE_BYTES_DEFAULT: u64 = 64 << 20;

/// Permission bits of a shard's directory: its owner's only, as a
/// database keeps its data directory. fjall creates its files with the
/// process's umask (usually group and world readable); inside a directory
/// of these bits no other user can reach them, whatever their own bits.
pub const SHARD_DIR_MODE: u32 = 0o700;

/// Permission bits of the files in a shard made here: read and write for
/// the owner only.
pub const SHARD_FILE_MODE: u32 = 0o600;

/// The group and other permission bits, which a shard's tree never keeps.
const GROUP_OTHER_BITS: u32 = 0o077;

/// Creates the directory `path` for a new shard, owner-only
/// ([`SHARD_DIR_MODE`]); missing parents are created as `mkdir -p` would
/// (they are not the shard's to restrict). An existing directory is made
/// owner-only too: it is about to hold a shard.
pub fn create_private_dir(path: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent)?;
    }
    match std::fs::DirBuilder::new().mode(SHARD_DIR_MODE).create(path) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && path.is_dir() => {}
        Err(e) => return Err(e),
    }
    // The umask may have taken bits off the mode asked for (never added
    // any); an existing directory has whatever it had.
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(SHARD_DIR_MODE))
}

/// Takes the group and other bits off every directory and file under
/// `path` (and `path` itself), so that what fjall created with the
/// process's umask is its owner's only. Links are not followed.
pub fn restrict_to_owner(path: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    walk(path, |p, meta| {
        let mode = meta.permissions().mode() & 0o7777;
        if mode & GROUP_OTHER_BITS != 0 {
            std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode & !GROUP_OTHER_BITS))?;
        }
        Ok(())
    })
}

/// The directories under `path` (itself included) that group or others
/// may enter or list, for tests and for the warning about an existing
/// shard that is open to other users. Links are not followed.
pub fn dirs_open_to_others(path: &Path) -> std::io::Result<Vec<PathBuf>> {
    use std::os::unix::fs::PermissionsExt;
    let mut open = Vec::new();
    walk(path, |p, meta| {
        if meta.is_dir() && meta.permissions().mode() & GROUP_OTHER_BITS != 0 {
            open.push(p.to_path_buf());
        }
        Ok(())
    })?;
    Ok(open)
}

/// Calls `visit` on `path` and on everything below it, links neither
/// followed nor visited. What goes below the root between its listing
/// and its turn (fjall's background work replaces journals and tables)
/// is skipped: it needs nothing any more.
fn walk(
    path: &Path,
    mut visit: impl FnMut(&Path, &std::fs::Metadata) -> std::io::Result<()>,
) -> std::io::Result<()> {
    let mut todo = vec![path.to_path_buf()];
    while let Some(p) = todo.pop() {
        let r = (|| -> std::io::Result<()> {
            let meta = std::fs::symlink_metadata(&p)?;
            if meta.file_type().is_symlink() {
                return Ok(());
            }
            visit(&p, &meta)?;
            if meta.is_dir() {
                for entry in std::fs::read_dir(&p)? {
                    todo.push(entry?.path());
                }
            }
            Ok(())
        })();
        match r {
            Err(e) if p != path && e.kind() == std::io::ErrorKind::NotFound => {}
            r => r?,
        }
    }
    Ok(())
}

/// Whether `path` is missing or an empty directory: a shard made there
/// is a new one.
fn is_new(path: &Path) -> bool {
    match std::fs::read_dir(path) {
        Ok(mut d) => d.next().is_none(),
        Err(e) => e.kind() == std::io::ErrorKind::NotFound,
    }
}

/// How a shard is opened.
#[derive(Debug, Clone)]
pub struct ShardOptions {
    /// Block cache, in bytes.
    pub cache_bytes: u64,
    /// Create the directory and an empty shard if there is none.
    pub create: bool,
}

impl Default for ShardOptions {
    fn default() -> Self {
        ShardOptions {
            cache_bytes: SHARD_CACHE_BYTES_DEFAULT,
            create: true,
        }
    }
}

/// A shard stored by fjall in one directory.
pub struct FjallShard {
    db: Database,
    data: Keyspace,
    path: PathBuf,
    /// Files [`FjallShard::drop_cached_pages`] advised, with their length
    /// then.
    advised: std::sync::Mutex<std::collections::HashMap<PathBuf, u64>>,
}

fn keyspace_options() -> KeyspaceCreateOptions {
    KeyspaceCreateOptions::default().with_kv_separation(Some(
        KvSeparationOptions::default()
            .separation_threshold(KV_SEPARATION_BYTES_MIN)
            .compression(CompressionType::None),
    ))
}

impl FjallShard {
    /// Opens the shard in `path` (creating it when `opts.create`). A new
    /// shard (no directory, or an empty one) is its owner's only: the
    /// directory [`SHARD_DIR_MODE`], and what fjall creates in it at
    /// opening stripped of group and other bits.
    pub fn open(path: impl AsRef<Path>, opts: &ShardOptions) -> Result<FjallShard> {
        let path = path.as_ref().to_path_buf();
        let io = |what: &str, source| StorageError::Io {
            what: format!("{what} {}", path.display()),
            source,
        };
        match std::fs::metadata(&path) {
            Ok(m) if !m.is_dir() => {
                return Err(StorageError::NotAShard(format!(
                    "{} is not a directory",
                    path.display()
                )))
            }
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && opts.create => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(StorageError::NotAShard(format!(
                    "no shard at {}",
                    path.display()
                )))
            }
            Err(source) => {
                return Err(StorageError::Io {
                    what: format!("reading {}", path.display()),
                    source,
                })
            }
        }
        let new = opts.create && is_new(&path);
        if new {
            create_private_dir(&path).map_err(|e| io("creating", e))?;
        }
        let db = Database::builder(&path)
            .cache_size(opts.cache_bytes)
            .open()?;
        let data = db.keyspace(DATA_KEYSPACE, keyspace_options)?;
        if new {
            restrict_to_owner(&path).map_err(|e| io("restricting", e))?;
        } else if let Ok(m) = std::fs::metadata(&path) {
            use std::os::unix::fs::PermissionsExt;
            let mode = m.permissions().mode() & 0o777;
            if mode & GROUP_OTHER_BITS != 0 {
                // An existing shard's bits are its operator's choice (a
                // backup user may read it); said, not changed.
                tracing::warn!(
                    "shard directory {} is open to other users (mode {mode:o}); \
                     `chmod {SHARD_DIR_MODE:o}` it unless that is meant",
                    path.display()
                );
            }
        }
        Ok(FjallShard {
            db,
            data,
            path,
            advised: std::sync::Mutex::default(),
        })
    }

    /// The shard's directory.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

#[cfg(test)]
impl FjallShard {
    /// Writes the memtable out as tables and blob files (tests use it to
    /// put versions of a key in different files).
    pub(crate) fn flush_for_test(&self) {
        self.data.rotate_memtable_and_wait().expect("flush");
    }

    /// The files `drop_cached_pages` advised, with their lengths.
    pub(crate) fn advised_for_test(&self) -> std::collections::HashMap<PathBuf, u64> {
        self.advised.lock().expect("advised").clone()
    }

    /// Merges every table into one, as compaction would in time.
    pub(crate) fn compact_for_test(&self) {
        self.data.major_compact().expect("compact");
    }
}

impl ShardBackend for FjallShard {
    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>> {
        Ok(self.data.get(stored(key))?.map(|v| v.to_vec()))
    }

    fn write(&self, writes: &[Write<'_>], durability: Durability) -> Result<()> {
        for w in writes {
            check_write(w)?;
        }
        let mode = match durability {
            Durability::Sync => PersistMode::SyncData,
            Durability::Buffered => PersistMode::Buffer,
        };
        let mut batch = self.db.batch().durability(Some(mode));
        for w in writes {
            match *w {
                Write::Put(k, v) => batch.insert(&self.data, stored(k), v),
                Write::Delete(k) => batch.remove(&self.data, stored(k)),
            }
        }
        batch.commit()?;
        Ok(())
    }

    fn snapshot(&self) -> Box<dyn ShardSnapshot> {
        Box::new(FjallSnapshot {
            snap: self.db.snapshot(),
            data: self.data.clone(),
        })
    }

    fn sync(&self) -> Result<()> {
        self.db.persist(PersistMode::SyncAll)?;
        Ok(())
    }

    fn approximate_len(&self) -> u64 {
        self.data.approximate_len() as u64
    }

    /// Blocks allocated under the directory (as `du` counts them): the
    /// engine's own figure counts the journal's preallocated length.
    fn disk_bytes(&self) -> u64 {
        allocated_bytes(&self.path)
    }

    /// Writes the pairs as tables directly, with no journal (RocksDB's
    /// external file ingestion with the write-ahead log off, as the
    /// RocksDB shards imported), visible and durable once this returns.
    fn load<F>(&self, mut next: F) -> Result<u64>
    where
        F: FnMut(&mut Vec<u8>, &mut Vec<u8>) -> Result<bool>,
    {
        let mut ingest = self.data.start_ingestion()?;
        let (mut key, mut value, mut last) = (Vec::new(), Vec::new(), Vec::new());
        let mut tagged = vec![KEY_TAG];
        let mut n = 0u64;
        while next(&mut key, &mut value)? {
            check_write(&Write::Put(&key, &value))?;
            if n > 0 && last >= key {
                return Err(StorageError::Engine(
                    "a bulk load's keys must ascend".to_string(),
                ));
            }
            tagged.truncate(1);
            tagged.extend_from_slice(&key);
            ingest.write(tagged.as_slice(), value.as_slice())?;
            std::mem::swap(&mut last, &mut key);
            n += 1;
        }
        ingest.finish()?;
        self.db.persist(PersistMode::SyncAll)?;
        Ok(n)
    }

    /// Advises `DontNeed` on every file of the shard's directory whose
    /// length changed since the last call (files gone since, compacted
    /// away, are forgotten); dirty pages stay, and their writeback starts.
    fn drop_cached_pages(&self) {
        if let Ok(mut advised) = self.advised.lock() {
            let mut now = std::collections::HashMap::new();
            visit_files(&self.path, &mut |path, meta| {
                if !meta.is_file() {
                    return;
                }
                if advised.get(&path) == Some(&meta.len()) {
                    now.insert(path, meta.len());
                } else if let Ok(f) = std::fs::File::open(&path) {
                    let _ = rustix::fs::fadvise(&f, 0, None, rustix::fs::Advice::DontNeed);
                    now.insert(path, meta.len());
                }
            });
            *advised = now;
        }
    }
}

/// A fjall snapshot of a shard's keyspace.
struct FjallSnapshot {
    snap: Snapshot,
    data: Keyspace,
}

impl FjallSnapshot {
    /// The index entries of `range` as of the snapshot, newest version of
    /// each key, tombstones left out: lsm-tree's own range read, with the
    /// version and sequence number fjall's snapshot ranges use (holding
    /// the version keeps the blob files it names on disk), but yielding
    /// each entry's type and raw value, so a separated value is a handle
    /// the caller reads itself, and no per-entry guard is made.
    fn internal_range(
        &self,
        range: &(Bound<Vec<u8>>, Bound<Vec<u8>>),
    ) -> impl Iterator<Item = lsm_tree::Result<lsm_tree::InternalValue>> {
        let seqno = self.snap.seqno();
        let version = self
            .data
            .tree
            .get_version_history_lock()
            .get_version_for_snapshot(seqno);
        lsm_tree::Tree::create_internal_range(version, range, seqno, None)
    }
}

/// The stored form of a bound on user keys.
fn owned(b: Bound<&[u8]>) -> Bound<Vec<u8>> {
    match b {
        Bound::Included(k) => Bound::Included(stored(k)),
        Bound::Excluded(k) => Bound::Excluded(stored(k)),
        Bound::Unbounded => Bound::Unbounded,
    }
}

impl ShardSnapshot for FjallSnapshot {
    fn scan<'a>(&'a self, from: Bound<&[u8]>, to: Bound<&[u8]>) -> PairIter<'a> {
        let iter = self.snap.range(&self.data, (owned(from), owned(to)));
        Box::new(iter.map(|g| {
            let (k, v) = g.into_inner()?;
            Ok((user_key(&k)?.to_vec(), v.to_vec()))
        }))
    }

    /// Visits the pairs of the index as of the snapshot and reads the
    /// separated values with a [`BlobReader`] (large sequential reads)
    /// instead of the engine's read per value; see `blob_scan`.
    fn scan_each(
        &self,
        from: Bound<&[u8]>,
        to: Bound<&[u8]>,
        each: &mut PairVisitor<'_>,
    ) -> Result<()> {
        let range = (owned(from), owned(to));
        let mut blobs = BlobReader::new(self.data.path().join(BLOBS_DIR));
        for item in self.internal_range(&range) {
            let item = item?;
            let stored_key = &item.key.user_key;
            let key = user_key(stored_key)?;
            let more = if item.key.value_type == ValueType::Indirection {
                let handle = BlobHandle::decode(&item.value)?;
                match blobs.value(stored_key, &handle)? {
                    Some(v) => each(key, v)?,
                    None => {
                        let v = self.snap.get(&self.data, stored_key)?.ok_or_else(|| {
                            StorageError::Engine(
                                "a separated value vanished from its snapshot".to_string(),
                            )
                        })?;
                        each(key, &v)?
                    }
                }
            } else {
                each(key, &item.value)?
            };
            if !more {
                break;
            }
        }
        Ok(())
    }

    fn value_size(&self, key: &[u8]) -> Result<Option<u32>> {
        Ok(self.snap.size_of(&self.data, stored(key))?)
    }

    fn sample_keys(&self, n: usize) -> Result<Vec<Vec<u8>>> {
        if n == 0 {
            return Ok(Vec::new());
        }
        // Keys only: with key-value separation the values in blob files
        // are not read. Every `stride`-th key is kept; when more than 2n
        // are kept, every other one is dropped and the stride doubles, so
        // memory stays within 2n keys whatever the shard's size.
        let mut stride = (self.data.approximate_len() / n).max(1);
        let mut kept: Vec<Vec<u8>> = Vec::with_capacity(2 * n + 1);
        let all = (Bound::Unbounded, Bound::Unbounded);
        for (i, item) in self.internal_range(&all).enumerate() {
            let item = item?;
            if i % stride != 0 {
                continue;
            }
            kept.push(user_key(&item.key.user_key)?.to_vec());
            if kept.len() > 2 * n {
                kept = kept.into_iter().step_by(2).collect();
                stride *= 2;
            }
        }
        if kept.len() <= n {
            return Ok(kept);
        }
        let step = kept.len() as f64 / n as f64;
        Ok((0..n)
            .map(|i| kept[((i as f64 * step) as usize).min(kept.len() - 1)].clone())
            .collect())
    }
}

/// Bytes of the blocks allocated to the files under `dir`, recursively
/// (unreadable entries count as 0).
fn allocated_bytes(dir: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    let mut bytes = 0;
    visit_files(dir, &mut |_, m| bytes += m.blocks() * 512);
    bytes
}

/// Calls `f` with the path and metadata (not following links) of every
/// entry under `dir` that is not a directory, recursively; entries that
/// cannot be read are skipped.
fn visit_files(dir: &Path, f: &mut dyn FnMut(PathBuf, &std::fs::Metadata)) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let Ok(meta) = e.metadata() else { continue };
        if meta.is_dir() {
            visit_files(&e.path(), f);
        } else {
            f(e.path(), &meta);
        }
    }
}
