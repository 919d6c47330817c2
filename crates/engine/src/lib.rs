//! FabricKV's storage engine: one MICA-style partition per worker.
//!
//! A [`Partition`] is owned by exactly one worker thread, so it has no
//! locks and no atomics. It does no I/O and reads no clock: every operation
//! takes the current time as `now_ms`, so tests drive it with simulated
//! time. After [`Partition::new`] the hot path (get, put, delete,
//! set_expiry, sweep) never allocates for values up to 1 MiB; a large value
//! (see `large`) is its own allocation, made by the caller.
//!
//! Layout, one concern per file (as MICA's `ltable_impl/`):
//! - `index`: the bucketized hash index: cache-line buckets
//!   of tagged slots, lossy in cache mode, chained into a preallocated
//!   overflow pool in store mode; with one-bit-per-bucket summaries of
//!   which chains hold entries, and which may hold items with a TTL.
//! - `item`: the item layout in the pool (header, key, value).
//! - `log`: cache-mode storage, a circular log that evicts FIFO and keeps
//!   the counters exact by walking what it overwrites.
//! - `alloc`: store-mode storage, a slab allocator with size classes,
//!   pages and per-page free lists; pages move between classes.
//! - `reassign`: store mode's emptying of a page for another class
//!   (relocating its items), on a write's demand or in the sweep.
//! - `large`: values over 1 MiB (up to 512 MiB), each one reference-counted
//!   heap buffer named by a small stub item, with their own budget.
//! - `partition`: the mode-generic core (lookup, unlink) shared by the
//!   operations.
//! - `get`, `put`, `delete`, `expire`, `sweep`: one file per operation,
//!   each returning a small result enum.
//! - `scan`: walking the occupied chains (SCAN, KEYS) and FLUSHDB.
//! - `watch`: the per-partition modification counters behind WATCH.
//! - `stats`: the counters.
//!
//! [`Partition`] itself only validates its configuration and dispatches to
//! the core of its mode.

use std::fmt;

use fabrickv_types::KeyHash;

mod alloc;
mod delete;
mod expire;
mod get;
mod index;
mod item;
mod journal;
mod large;
mod log;
mod partition;
mod pool;
mod put;
mod reassign;
mod scan;
mod stats;
mod sweep;
mod watch;

#[cfg(test)]
mod tests;
#[cfg(test)]
mod testutil;

pub use alloc::{
    page_bytes_for_pool, AUTOMOVE_FREE_PAGES_MIN, AUTOMOVE_PAGES_PER_SWEEP, PAGES_PER_POOL_MIN,
    PAGE_BYTES_MAX, PAGE_BYTES_MIN, REFUSAL_SLACK_PAGES_PER_CLASS, SIZE_CLASSES_MAX,
    SIZE_CLASS_BYTES_MIN, SIZE_CLASS_GROWTH_DEN, SIZE_CLASS_GROWTH_NUM,
};
pub use delete::DeleteResult;
pub use get::{GetRefResult, GetResult, ItemView};
pub use index::{
    default_index_buckets, ASSUMED_ITEM_BYTES, BUCKET_BYTES, INDEX_BUCKETS_MAX, INDEX_BUCKETS_MIN,
    ITEM_SLOTS_PER_BUCKET, OFFSET_BITS, OVERFLOW_BUCKETS_DIVISOR, OVERFLOW_BUCKETS_MIN,
    SLOTS_PER_BUCKET, SUMMARY_BUCKETS_PER_WORD, SUMMARY_BYTES_MAX,
};
pub use item::{
    is_expired, item_bytes, ItemMeta, ITEM_ALIGN_BYTES, ITEM_BYTES_MAX, ITEM_HEADER_BYTES,
    ITEM_META_BYTES,
};
pub use journal::{Journal, JournalSeq, Noted};
pub use large::{LargeValue, ValueRef, LARGE_VALUE_BYTES_MAX, LARGE_VALUE_BYTES_MIN};
pub use pool::{PoolError, PoolMemory, PoolOptions, HUGE_PAGE_SHIFT};
pub use put::{PutCond, PutResult};
pub use scan::{ScanBudget, ScanItem, ScanItems, ScanMore, ScanVisit, SlotFilter};
pub use stats::PartitionStats;
pub use watch::WATCH_VERSION_SLOTS;

use alloc::Slab;
use index::Index;
use large::LARGE_STUB_BYTES;
use log::Log;
use partition::Core;
use put::Put;

/// Smallest pool a partition accepts, in bytes: enough for a cache-mode log
/// of a few hundred small items and for [`PAGES_PER_POOL_MIN`] smallest
/// pages in store mode.
pub const POOL_BYTES_MIN: usize = 64 << 10;

/// Largest pool a partition accepts, in bytes: offsets travel in the
/// index's 48 offset bits, and cache mode tells live from overwritten
/// offsets by their distance modulo 2^48, which needs headroom.
pub const POOL_BYTES_MAX: usize = 1 << (OFFSET_BITS - 1);

const _: () = assert!(POOL_BYTES_MIN >= PAGES_PER_POOL_MIN * PAGE_BYTES_MIN);
const _: () = assert!(POOL_BYTES_MIN >= 2 * item_bytes(fabrickv_types::limits::KEY_BYTES_MAX, 0));
const _: () = assert!(POOL_BYTES_MAX < 1 << OFFSET_BITS);

/// Starts loading every cache line of `bytes` (a value [`Partition::peek`]
/// returned) without waiting, so that a batch can fetch all its values
/// from memory at once before copying any of them.
#[inline]
pub fn prefetch_bytes(bytes: &[u8]) {
    let start = bytes.as_ptr() as usize;
    let end = start + bytes.len();
    let mut line = start & !(BUCKET_BYTES - 1);
    while line < end {
        index::prefetch_line(line as *const i8);
        line += BUCKET_BYTES;
    }
}

/// How a partition treats a full pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Mode {
    /// Circular log and lossy index: a full pool evicts the oldest items
    /// (FIFO); a GET may miss a key that was stored.
    Cache,
    /// Slab allocator and lossless index: never evicts; a full pool answers
    /// `InsufficientSpace`.
    Store,
}

/// How to build a partition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartitionConfig {
    /// Cache or store.
    pub mode: Mode,
    /// Size of the value pool, in bytes (the index comes on top).
    pub pool_bytes: usize,
    /// Number of main index buckets (a power of two); `None` derives it
    /// from `pool_bytes` with [`default_index_buckets`].
    pub index_buckets: Option<usize>,
    /// How the pool's memory is obtained (lazily zeroed heap by default).
    pub memory: PoolOptions,
}

/// Why a partition could not be built.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum EngineError {
    /// `pool_bytes` is below [`POOL_BYTES_MIN`].
    PoolTooSmall {
        /// What was asked for.
        pool_bytes: usize,
        /// The smallest pool accepted.
        min_bytes: usize,
    },
    /// `pool_bytes` is above [`POOL_BYTES_MAX`].
    PoolTooLarge {
        /// What was asked for.
        pool_bytes: usize,
        /// The largest pool accepted.
        max_bytes: usize,
    },
    /// `index_buckets` is zero, not a power of two, or too large.
    BadIndexBuckets {
        /// What was asked for.
        buckets: usize,
        /// The largest count accepted.
        max_buckets: usize,
    },
    /// The pool's memory could not be had as its options ask.
    Pool(PoolError),
}

impl fmt::Display for EngineError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            EngineError::PoolTooSmall {
                pool_bytes,
                min_bytes,
            } => {
                write!(
                    f,
                    "pool of {pool_bytes} bytes is below the minimum of {min_bytes} bytes"
                )
            }
            EngineError::PoolTooLarge {
                pool_bytes,
                max_bytes,
            } => {
                write!(
                    f,
                    "pool of {pool_bytes} bytes is above the maximum of {max_bytes} bytes"
                )
            }
            EngineError::BadIndexBuckets {
                buckets,
                max_buckets,
            } => write!(
                f,
                "index bucket count {buckets} must be a power of two between 1 and {max_buckets}"
            ),
            EngineError::Pool(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for EngineError {}

/// The core of one mode.
enum Inner {
    /// Cache mode.
    Cache(Core<Log>),
    /// Store mode.
    Store(Core<Slab>),
}

/// One partition: an index and a value pool, owned by one worker.
///
/// It is `Send` (built on one thread, handed to its worker) but has no
/// interior synchronization: one thread uses it at a time.
pub struct Partition {
    /// The mode-specific core; every operation dispatches on it once.
    inner: Inner,
    /// The keys written since the replicator last took them, on a server
    /// that replicates ([`Partition::enable_journal`]); `None` costs the
    /// writes one branch.
    journal: Option<Box<Journal>>,
    /// The keys written since a checkpoint's walk of this partition last
    /// took them, while one walks it ([`Partition::begin_cut`]). Separate
    /// from the replication journal: it is never paused (a backup's
    /// applied writes are in its checkpoints) and taken by another reader.
    cut: Option<Box<Journal>>,
}

const _: fn() = || {
    fn assert_send<T: Send>() {}
    assert_send::<Partition>();
};

/// Runs `$body` with `$core` bound to the core of either mode.
macro_rules! dispatch {
    ($self:expr, $core:ident => $body:expr) => {
        match $self {
            Inner::Cache($core) => $body,
            Inner::Store($core) => $body,
        }
    };
}

impl Partition {
    /// Builds an empty partition, allocating its pool and index. The pool
    /// is requested zeroed, which the OS provides lazily, so untouched
    /// parts of a large pool cost no physical memory.
    pub fn new(cfg: &PartitionConfig) -> Result<Partition, EngineError> {
        if cfg.pool_bytes < POOL_BYTES_MIN {
            return Err(EngineError::PoolTooSmall {
                pool_bytes: cfg.pool_bytes,
                min_bytes: POOL_BYTES_MIN,
            });
        }
        if cfg.pool_bytes > POOL_BYTES_MAX {
            return Err(EngineError::PoolTooLarge {
                pool_bytes: cfg.pool_bytes,
                max_bytes: POOL_BYTES_MAX,
            });
        }
        let buckets = cfg
            .index_buckets
            .unwrap_or_else(|| default_index_buckets(cfg.pool_bytes));
        if !buckets.is_power_of_two() || buckets > INDEX_BUCKETS_MAX {
            return Err(EngineError::BadIndexBuckets {
                buckets,
                max_buckets: INDEX_BUCKETS_MAX,
            });
        }
        let memory = PoolMemory::new(cfg.pool_bytes, &cfg.memory).map_err(EngineError::Pool)?;
        let inner = match cfg.mode {
            Mode::Cache => Inner::Cache(Core::new(
                Index::new(buckets, 0),
                Log::new(memory),
                cfg.pool_bytes,
            )),
            Mode::Store => {
                let overflow = (buckets / OVERFLOW_BUCKETS_DIVISOR).max(OVERFLOW_BUCKETS_MIN);
                Inner::Store(Core::new(
                    Index::new(buckets, overflow),
                    Slab::new(memory),
                    cfg.pool_bytes,
                ))
            }
        };
        Ok(Partition {
            inner,
            journal: None,
            cut: None,
        })
    }

    /// Starts noting every written key in a [`Journal`] (a server that
    /// replicates); returns its published write count. Idempotent.
    pub fn enable_journal(&mut self) -> std::sync::Arc<JournalSeq> {
        self.journal.get_or_insert_with(Default::default).seq()
    }

    /// The journal, if [`Partition::enable_journal`] started one.
    pub fn journal_mut(&mut self) -> Option<&mut Journal> {
        self.journal.as_deref_mut()
    }

    /// Runs `f` with the journal paused: a backup applying what its
    /// primary shipped is not the primary of those keys, and must not
    /// ship them on.
    pub fn unjournaled<T>(&mut self, f: impl FnOnce(&mut Partition) -> T) -> T {
        if let Some(j) = self.journal_mut() {
            j.set_paused(true);
        }
        let t = f(self);
        if let Some(j) = self.journal_mut() {
            j.set_paused(false);
        }
        t
    }

    /// Notes a write of `key` in the journal, if there is one. Noted
    /// before the write is tried, so a refused write ships the key's
    /// unchanged state: harmless, and no outcome has to be read.
    #[inline]
    fn note(&mut self, hash: KeyHash, key: &[u8]) {
        if let Some(j) = &mut self.journal {
            j.note(hash, key);
        }
        if let Some(c) = &mut self.cut {
            c.note(hash, key);
        }
    }

    /// Starts noting written keys for a checkpoint's walk: what the walk
    /// already passed and is written again is found in
    /// [`Partition::take_cut`]. Restarts the notes if a walk was going.
    pub fn begin_cut(&mut self) {
        self.cut = Some(Box::default());
    }

    /// The keys written since the walk began or last took them (and
    /// whether the partition was flushed meanwhile); `None` when no walk
    /// is going. `spare`'s buffer takes their place.
    pub fn take_cut(&mut self, spare: Vec<u8>) -> Option<Noted> {
        self.cut.as_mut().map(|c| c.take(spare))
    }

    /// Stops noting for a checkpoint.
    pub fn end_cut(&mut self) {
        self.cut = None;
    }

    /// The main index bucket `hash` lives in: what a walk by
    /// [`Partition::scan_from`] visits it at.
    pub fn main_bucket_of(&self, hash: KeyHash) -> usize {
        dispatch!(&self.inner, core => core.index.main_bucket(hash))
    }

    /// The partition's mode.
    pub fn mode(&self) -> Mode {
        match self.inner {
            Inner::Cache(_) => Mode::Cache,
            Inner::Store(_) => Mode::Store,
        }
    }

    /// Starts loading the index bucket of `hash` without waiting for it.
    /// Callers with a batch prefetch every key first, then operate, so the
    /// batch's cache misses overlap instead of following one another.
    #[inline]
    pub fn prefetch(&self, hash: KeyHash) {
        dispatch!(&self.inner, core => core.index.prefetch(hash))
    }

    /// Starts loading the item headers `hash` may name, once its bucket is
    /// in cache (call [`Partition::prefetch`] for the whole batch first).
    /// The two stages together hide both cache misses of a lookup.
    #[inline]
    pub fn prefetch_item(&self, hash: KeyHash) {
        dispatch!(&self.inner, core => core.prefetch_item(hash))
    }

    /// [`Partition::prefetch_item`] for `span` bytes from the start of each
    /// candidate item: header, key and value in one round when the value's
    /// size is known ahead ([`item_bytes`]).
    #[inline]
    pub fn prefetch_item_span(&self, hash: KeyHash, span: usize) {
        dispatch!(&self.inner, core => core.prefetch_item_span(hash, span))
    }

    /// Looks `key` up. The value is borrowed from the pool, zero-copy.
    #[inline]
    pub fn get(&mut self, hash: KeyHash, key: &[u8], now_ms: u64) -> GetResult<'_> {
        dispatch!(&mut self.inner, core => core.get(hash, key, now_ms))
    }

    /// Looks `key` up read-only (`&self`): no counter moves and an expired
    /// item is left for the sweep, so readers can share the partition
    /// behind a read lock.
    #[inline]
    pub fn peek(&self, hash: KeyHash, key: &[u8], now_ms: u64) -> Option<&[u8]> {
        dispatch!(&self.inner, core => core.peek(hash, key, now_ms))
    }

    /// [`Partition::peek`] of the whole item (value, large or not, expiry
    /// and meta) in one lookup: what replication ships of a key, read
    /// without counting a GET (a replicated write is no client's read).
    #[inline]
    pub fn peek_item(&self, hash: KeyHash, key: &[u8], now_ms: u64) -> Option<ScanItem<'_>> {
        dispatch!(&self.inner, core => core.peek_item(hash, key, now_ms))
    }

    /// The value of a live `key`, writable in place (same length): an
    /// update with no allocation, for read-modify-write such as an
    /// optimizer step.
    #[inline]
    pub fn value_mut(&mut self, hash: KeyHash, key: &[u8], now_ms: u64) -> Option<&mut [u8]> {
        self.note(hash, key);
        dispatch!(&mut self.inner, core => core.value_mut(hash, key, now_ms))
    }

    /// Stores `value` under `key` if `cond` holds. `expire_at_ms` is an
    /// absolute time on the caller's clock; 0 means no TTL.
    #[inline]
    pub fn put(
        &mut self,
        hash: KeyHash,
        key: &[u8],
        value: &[u8],
        expire_at_ms: u64,
        cond: PutCond,
        now_ms: u64,
    ) -> PutResult {
        if value.len() >= LARGE_VALUE_BYTES_MIN {
            if value.len() > LARGE_VALUE_BYTES_MAX {
                return PutResult::TooLarge;
            }
            let large = LargeValue::copy_from(value);
            return self.put_large(hash, key, large, expire_at_ms, cond, now_ms);
        }
        self.note(hash, key);
        dispatch!(&mut self.inner, core => core.put(Put { hash, key, value, large: None, expire_at_ms, cond, now_ms, meta: None }))
    }

    /// Stores `value` under `key` if `cond` holds, taking the buffer
    /// without copying it when it is a large value (at least
    /// [`LARGE_VALUE_BYTES_MIN`] bytes); a shorter one is copied into the
    /// pool as [`Partition::put`] does. A large value counts against the
    /// large budget ([`Partition::set_large_bytes_max`]), which also holds
    /// the replaced values readers still pin: cache mode evicts the oldest
    /// large values to make room, store mode (or cache mode when pinned
    /// values leave no room) answers `InsufficientSpace`; one longer than
    /// the whole budget or than
    /// [`LARGE_VALUE_BYTES_MAX`] is `TooLarge`.
    pub fn put_large(
        &mut self,
        hash: KeyHash,
        key: &[u8],
        value: LargeValue,
        expire_at_ms: u64,
        cond: PutCond,
        now_ms: u64,
    ) -> PutResult {
        self.note(hash, key);
        if value.len() < LARGE_VALUE_BYTES_MIN {
            return dispatch!(&mut self.inner, core => core.put(Put { hash, key, value: &value, large: None, expire_at_ms, cond, now_ms, meta: None }));
        }
        let large = Some(value);
        dispatch!(&mut self.inner, core => core.put(Put { hash, key, value: &[0; LARGE_STUB_BYTES], large, expire_at_ms, cond, now_ms, meta: None }))
    }

    /// Looks `key` up like [`Partition::get`], telling a large value (a
    /// reference the caller may clone and keep past its lock) from one
    /// borrowed from the pool.
    #[inline]
    pub fn get_ref(&mut self, hash: KeyHash, key: &[u8], now_ms: u64) -> GetRefResult<'_> {
        dispatch!(&mut self.inner, core => core.get_ref(hash, key, now_ms))
    }

    /// Sets the budget of large values, in bytes (by default the pool's
    /// size). Values already held stay; the next large PUT sees the new
    /// budget.
    pub fn set_large_bytes_max(&mut self, bytes: u64) {
        dispatch!(&mut self.inner, core => core.large.bytes_max = bytes)
    }

    /// [`Partition::put`] of an item that carries `meta` (a memcached
    /// client's CAS value and flags), read back by [`Partition::get_item`].
    /// The item takes [`ITEM_META_BYTES`] more of the pool.
    #[allow(clippy::too_many_arguments)]
    #[inline]
    pub fn put_with_meta(
        &mut self,
        hash: KeyHash,
        key: &[u8],
        value: &[u8],
        expire_at_ms: u64,
        cond: PutCond,
        now_ms: u64,
        meta: ItemMeta,
    ) -> PutResult {
        self.note(hash, key);
        dispatch!(&mut self.inner, core => core.put(Put { hash, key, value, large: None, expire_at_ms, cond, now_ms, meta: Some(meta) }))
    }

    /// [`Partition::get`] that also returns the item's meta (`None` for
    /// an item stored without one); counts as a GET.
    #[inline]
    pub fn get_item(&mut self, hash: KeyHash, key: &[u8], now_ms: u64) -> Option<ItemView<'_>> {
        dispatch!(&mut self.inner, core => core.get_item(hash, key, now_ms))
    }

    /// Removes `key`.
    #[inline]
    pub fn delete(&mut self, hash: KeyHash, key: &[u8], now_ms: u64) -> DeleteResult {
        self.note(hash, key);
        dispatch!(&mut self.inner, core => core.delete(hash, key, now_ms))
    }

    /// Sets the expiry time of a live key (EXPIRE; 0 = PERSIST). Returns
    /// false if the key is absent or expired.
    #[inline]
    pub fn set_expiry(
        &mut self,
        hash: KeyHash,
        key: &[u8],
        expire_at_ms: u64,
        now_ms: u64,
    ) -> bool {
        self.note(hash, key);
        dispatch!(&mut self.inner, core => core.set_expiry(hash, key, expire_at_ms, now_ms))
    }

    /// Background TTL sweep (active expiry): reclaims the expired items
    /// of the next chains that may hold an item with a TTL, spending at
    /// most `budget` units of work: one per chain visited and one per
    /// summary word (64 main buckets) tested. The cursor wraps; each main
    /// bucket is covered at most once per call. Returns how many items it
    /// reclaimed.
    ///
    /// In store mode it then runs the background page mover: when no page
    /// is free, it empties at most [`AUTOMOVE_PAGES_PER_SWEEP`] page of a
    /// class holding [`AUTOMOVE_FREE_PAGES_MIN`] pages' worth of free
    /// chunks (counted in `slab_pages_moved` once another class takes it).
    pub fn sweep(&mut self, now_ms: u64, budget: usize) -> usize {
        match &mut self.inner {
            Inner::Cache(core) => core.sweep(now_ms, budget),
            Inner::Store(core) => {
                let reclaimed = core.sweep(now_ms, budget);
                for _ in 0..AUTOMOVE_PAGES_PER_SWEEP {
                    if !core.automove() {
                        break;
                    }
                }
                reclaimed
            }
        }
    }

    /// Calls `f(key, value, expire_at_ms)` for every item live at `now_ms`
    /// in main bucket `main` and its overflow chain (SCAN's step; nothing
    /// when `main` is not below [`Partition::index_buckets`]). Items never
    /// move between main buckets, so visiting each once sees every key
    /// present throughout.
    pub fn scan_bucket(&self, main: usize, now_ms: u64, f: &mut ScanVisit<'_>) {
        dispatch!(&self.inner, core => core.scan_bucket(main, now_ms, f))
    }

    /// SCAN's walk: calls `f(key, value, expire_at_ms)` for every item
    /// live at `now_ms` in the main buckets from `from` on that hold
    /// entries, in bucket order, until `budget` is spent (at the end of a
    /// chain), `f` returns false (at the end of that chain) or the index
    /// ends. Returns the main bucket to resume from, or `None` at the end.
    /// Empty buckets cost one bit of a summary word each (a bucket a
    /// delete emptied costs one entry of `budget`, once). Items never
    /// move between main buckets, so a walk resumed at each returned
    /// bucket sees every key present throughout.
    pub fn scan_from(
        &mut self,
        from: usize,
        now_ms: u64,
        budget: &mut ScanBudget,
        f: &mut ScanMore<'_>,
    ) -> Option<usize> {
        dispatch!(&mut self.inner, core => core.scan_from(from, now_ms, budget, None, f))
    }

    /// [`Partition::scan_from`] over the items of the cluster slots `want`
    /// takes only (the budget still counts every index entry examined).
    /// With slot tags ([`Partition::use_slot_tags`]) the other items are
    /// never read: a walk for the quarter of a server's keys that moves to
    /// a new server reads the index and that quarter, not every item.
    pub fn scan_slots_from(
        &mut self,
        from: usize,
        now_ms: u64,
        budget: &mut ScanBudget,
        want: &SlotFilter<'_>,
        f: &mut ScanMore<'_>,
    ) -> Option<usize> {
        dispatch!(&mut self.inner, core => core.scan_from(from, now_ms, budget, Some(want), f))
    }

    /// Tags every index entry, from now on, with its key's cluster slot
    /// (`fabrickv_types::slot::key_slot`) instead of the key hash's low
    /// 16 bits, retagging the entries already there (one pass over the
    /// items); a server of an etcd cluster does this as it joins, so that
    /// [`Partition::scan_slots_from`] skips other slots' items unread.
    /// Lookups then compute the key's slot (a CRC16 of the key) as well
    /// as its hash, and reject a non-matching entry on a slot and two bits
    /// of the hash instead of sixteen: keys sharing a `{hash tag}` share a
    /// slot, so a bucket full of them costs a lookup a quarter of its
    /// items' reads. Store mode only (a cache-mode partition is never
    /// streamed by slot); returns whether slot tags are on.
    pub fn use_slot_tags(&mut self) -> bool {
        match &mut self.inner {
            Inner::Cache(_) => false,
            Inner::Store(core) => {
                core.retag_by_slot();
                true
            }
        }
    }

    /// [`Partition::scan_from`] handing `f` each item whole (value, large
    /// or not, expiry and meta): a walk that copies items, such as a
    /// checkpoint's, reads each once instead of looking its key up again.
    pub fn scan_items_from(
        &mut self,
        from: usize,
        now_ms: u64,
        budget: &mut ScanBudget,
        f: &mut ScanItems<'_>,
    ) -> Option<usize> {
        dispatch!(&mut self.inner, core => core.scan_items_from(from, now_ms, budget, f))
    }

    /// Removes every item (FLUSHDB); returns how many were live.
    pub fn flush(&mut self, now_ms: u64) -> usize {
        if let Some(j) = &mut self.journal {
            j.note_flush();
        }
        if let Some(c) = &mut self.cut {
            c.note_flush();
        }
        dispatch!(&mut self.inner, core => core.flush(now_ms))
    }

    /// The modification counter of the key of `hash` (WATCH): any change
    /// to the key since an earlier reading changes it (see
    /// [`WATCH_VERSION_SLOTS`] for the keys that share one).
    pub fn key_version(&self, hash: KeyHash) -> u64 {
        dispatch!(&self.inner, core => core.key_version(hash))
    }

    /// Live items, as [`Partition::stats`] counts them, without the rest
    /// of the statistics (some of which walk the slab classes): for a
    /// caller that asks per write.
    #[inline]
    pub fn item_count(&self) -> u64 {
        dispatch!(&self.inner, core => core.stats.items)
    }

    /// The partition's counters.
    pub fn stats(&self) -> PartitionStats {
        let s = dispatch!(&self.inner, core => PartitionStats {
            large_values: core.large.count,
            large_bytes: core.large.bytes,
            large_pinned_bytes: core.large.pinned_bytes(),
            large_bytes_max: core.large.bytes_max,
            ..core.stats
        });
        match &self.inner {
            Inner::Cache(_) => s,
            Inner::Store(core) => PartitionStats {
                slab_pages_moved: core.storage.pages_moved(),
                slab_items_relocated: core.storage.items_relocated(),
                slab_free_bytes: core.storage.free_bytes(),
                ..s
            },
        }
    }

    /// The largest value this partition can ever hold next to a key of
    /// `KEY_BYTES_MAX` bytes; shorter keys leave room for a little more.
    pub fn max_item_value_bytes(&self) -> usize {
        dispatch!(&self.inner, core => core.max_item_value_bytes())
    }

    /// Number of main index buckets.
    pub fn index_buckets(&self) -> usize {
        dispatch!(&self.inner, core => core.index.main_count())
    }

    /// Checks the counters and the index against a full recount, and (cache
    /// mode) that the log's records tile its window and agree with the
    /// index. Panics on any mismatch.
    #[cfg(test)]
    pub(crate) fn check(&self) {
        let s = self.stats();
        let (items, bytes) = dispatch!(&self.inner, core => core.recount());
        assert_eq!(
            (s.items, s.bytes),
            (items, bytes),
            "counters match a recount"
        );
        if let Inner::Store(core) = &self.inner {
            core.storage.check();
        }
        if let Inner::Cache(core) = &self.inner {
            let live = core
                .storage
                .window()
                .iter()
                .filter(|(_, h)| h.is_live_record())
                .count();
            assert_eq!(
                live as u64, items,
                "live log records are exactly the indexed items"
            );
        }
    }

    /// Store mode: the most free bytes ([`PartitionStats::slab_free_bytes`])
    /// a refused write of an item of these lengths may leave: its chunk
    /// plus [`REFUSAL_SLACK_PAGES_PER_CLASS`] pages per other class
    /// holding pages.
    #[cfg(test)]
    pub(crate) fn refusal_bound_bytes(&self, key_len: usize, value_len: usize) -> u64 {
        let Inner::Store(core) = &self.inner else {
            return 0;
        };
        let s = &core.storage;
        let Some(class) = s.class_for(item_bytes(key_len, value_len)) else {
            return 0;
        };
        let others = s.classes_with_pages().filter(|&c| c != class).count();
        (s.chunk_bytes(class) + others * REFUSAL_SLACK_PAGES_PER_CLASS * s.page_bytes()) as u64
    }

    /// Where the item of `key` is in the pool, if it is indexed.
    #[cfg(test)]
    pub(crate) fn position_of(&self, key: &[u8]) -> Option<usize> {
        dispatch!(&self.inner, core => core.find(KeyHash::of(key), key).map(|hit| hit.pos))
    }

    /// Store mode: the page size, in bytes.
    #[cfg(test)]
    pub(crate) fn page_bytes(&self) -> usize {
        match &self.inner {
            Inner::Store(core) => core.storage.page_bytes(),
            Inner::Cache(_) => 0,
        }
    }

    /// Overflow buckets on the free list (store mode).
    #[cfg(test)]
    pub(crate) fn free_overflow_buckets(&self) -> usize {
        dispatch!(&self.inner, core => core.index.free_overflow_count())
    }
}
