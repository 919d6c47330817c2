//! The shared store handle, put slots and leases.
//!
//! Block ownership, the rule that makes the pool's `unsafe` sound:
//! - a block handed out by the allocator for a reservation belongs to its
//!   `PutSlot` alone until the slot commits or drops; only that slot writes
//!   it, through `&mut self`;
//! - once committed, nobody writes the block again;
//! - a committed block is freed only when its entry is unlinked AND its last
//!   `Lease` has dropped, so no reader can still see it when it is handed to
//!   a new writer.
//!
//! Every hand-over goes through the store's mutex (reserve, commit, lease,
//! lease drop), which orders a writer's bytes before any reader's access and
//! a reader's last access before the next writer's.

use std::fmt;
use std::ops::Deref;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use fabrickv_types::limits::{CACHE_KEY_BYTES_MAX, CACHE_VALUE_BYTES_MAX, TTL_MS_MAX};

use crate::alloc::block_bytes;
use crate::pool::Pool;
use crate::state::{LeaseInfo, State};
use crate::{CacheConfig, CacheError, CacheStats};

struct Shared {
    cfg: CacheConfig,
    pool: Pool,
    state: Mutex<State>,
}

impl Shared {
    /// The state, even after a thread panicked while holding the lock: every
    /// update under the lock is plain bookkeeping that cannot panic midway
    /// short of a bug, and leases and slots must be able to give their
    /// blocks back from `Drop` whatever happened elsewhere.
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The in-memory KV-cache store. Cloning is cheap and every clone is the
/// same store; it is shared by data-plane workers and the control runtime.
#[derive(Clone)]
pub struct CacheStore {
    shared: Arc<Shared>,
}

impl fmt::Debug for CacheStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CacheStore")
            .field("cfg", &self.shared.cfg)
            .finish_non_exhaustive()
    }
}

fn check_key(key: &[u8]) -> Result<(), CacheError> {
    if key.is_empty() {
        return Err(CacheError::KeyEmpty);
    }
    if key.len() > CACHE_KEY_BYTES_MAX {
        return Err(CacheError::KeyTooLong);
    }
    Ok(())
}

impl CacheStore {
    /// Validates `cfg` and maps the pool.
    pub fn new(cfg: CacheConfig) -> Result<CacheStore, CacheError> {
        cfg.validate()?;
        let pool = Pool::new(cfg.usable_pool_bytes(), cfg.populate)?;
        let state = State::new(&cfg);
        if pool.len() != state.capacity() {
            return Err(CacheError::Internal(format!(
                "pool of {} bytes for an allocator of {}",
                pool.len(),
                state.capacity()
            )));
        }
        Ok(CacheStore {
            shared: Arc::new(Shared {
                cfg,
                pool,
                state: Mutex::new(state),
            }),
        })
    }

    /// Takes a block for a value of `len` bytes, to be filled outside the
    /// lock and made visible by [`PutSlot::commit`]. Nothing visible
    /// changes until then (except entries evicted or expired to make room).
    ///
    /// `ttl_ms` 0 means no expiry; the deadline counts from the commit,
    /// when the value becomes visible.
    ///
    /// An overwrite needs room for the new value beside the old one, since
    /// the old one stays readable until the commit.
    pub fn reserve(
        &self,
        key: &[u8],
        len: usize,
        ttl_ms: u64,
        now_ms: u64,
    ) -> Result<PutSlot, CacheError> {
        check_key(key)?;
        if len > CACHE_VALUE_BYTES_MAX {
            return Err(CacheError::ValueTooLarge);
        }
        if ttl_ms > TTL_MS_MAX {
            return Err(CacheError::TtlTooLarge);
        }
        let bytes = block_bytes(len)
            .filter(|&b| b <= self.shared.pool.len())
            .ok_or(CacheError::ValueTooLarge)?;
        let offset = self.shared.lock().reserve(bytes, now_ms)?;
        Ok(PutSlot {
            shared: Arc::clone(&self.shared),
            key: Arc::from(key),
            offset,
            block_bytes: bytes,
            len,
            ttl_ms,
            finished: false,
        })
    }

    /// Stores `value` under `key`: reserve, copy, commit.
    pub fn put(
        &self,
        key: &[u8],
        value: &[u8],
        ttl_ms: u64,
        now_ms: u64,
    ) -> Result<(), CacheError> {
        let mut slot = self.reserve(key, value.len(), ttl_ms, now_ms)?;
        slot.bytes_mut().copy_from_slice(value);
        slot.commit(now_ms).map(|_| ())
    }

    fn lease(&self, info: LeaseInfo) -> Lease {
        Lease {
            shared: Arc::clone(&self.shared),
            info,
        }
    }

    /// A lease on the live value of `key`, marking it most recently used.
    /// An expired value is absent (and reclaimed). Counts a hit or a miss.
    pub fn get(&self, key: &[u8], now_ms: u64) -> Option<Lease> {
        let info = self.shared.lock().get(key, now_ms)?;
        Some(self.lease(info))
    }

    /// A lease on the value of `key` only if it still is `generation`: the
    /// next chunk of a transfer started by [`CacheStore::get`] must come
    /// from the same value. `NotFound` when the key is gone or expired,
    /// `ValueChanged` when it holds another value. Marks the entry most
    /// recently used, but counts no hit (the first `get` did).
    pub fn lease_if(&self, key: &[u8], generation: u64, now_ms: u64) -> Result<Lease, CacheError> {
        let info = self.shared.lock().lease_if(key, generation, now_ms)?;
        Ok(self.lease(info))
    }

    /// Removes the live value of `key`; false when there was none. Leases
    /// already taken keep reading it.
    pub fn delete(&self, key: &[u8], now_ms: u64) -> bool {
        self.shared.lock().delete(key, now_ms)
    }

    /// Removes every value whose key `doomed` picks (expired ones too);
    /// returns how many. Leases already taken keep reading theirs. Holds
    /// the store's lock for one pass over the keys: for rare, wholesale
    /// changes (a server handing slots over), not the request path.
    pub fn delete_where(&self, doomed: &dyn Fn(&[u8]) -> bool) -> usize {
        self.shared.lock().delete_where(doomed)
    }

    /// Whether `key` has a live value. Does not count as a use for LRU.
    pub fn exists(&self, key: &[u8], now_ms: u64) -> bool {
        self.shared.lock().exists(key, now_ms)
    }

    /// Active expiry: removes up to `max_entries` entries whose TTL has
    /// passed at `now_ms`, earliest deadline first, without waiting for a
    /// read to find them. Returns how many it removed. The caller bounds
    /// the work per call (and so the lock hold time) with `max_entries`.
    pub fn expire(&self, now_ms: u64, max_entries: usize) -> usize {
        self.shared.lock().expire(now_ms, max_entries)
    }

    /// The generation of the newest value committed so far: a
    /// checkpoint's cut (values committed later are not in it).
    pub fn last_generation(&self) -> u64 {
        self.shared.lock().last_generation()
    }

    /// The next step of a checkpoint's walk: leases, with their keys, on
    /// up to `max` values committed at or before generation `cut` and
    /// live at `now_ms`, from arena slot `from` on; and where to go on
    /// (`None` at the end). One hold of the lock per step; reads nothing
    /// into the LRU order or the counters. A value replaced or removed
    /// before the walk reaches it is not in the checkpoint (a cache may
    /// drop any value at any time; what the checkpoint holds is a value
    /// each of its keys had at the cut).
    pub fn snapshot_from(&self, from: usize, max: usize, cut: u64, now_ms: u64) -> SnapshotChunk {
        let (infos, next) = self.shared.lock().snapshot_from(from, max, cut, now_ms);
        let values = infos
            .into_iter()
            .map(|(k, info)| (k, self.lease(info)))
            .collect();
        SnapshotChunk { values, next }
    }

    /// A consistent snapshot of occupancy and counters.
    pub fn stats(&self) -> CacheStats {
        self.shared.lock().stats()
    }

    /// The configuration the store was built with.
    pub fn config(&self) -> &CacheConfig {
        &self.shared.cfg
    }

    /// Checks every internal invariant. For tests.
    #[cfg(test)]
    pub(crate) fn check(&self) -> Result<(), String> {
        self.shared.lock().check()
    }

    /// Items in the deadline heap. For tests.
    #[cfg(test)]
    pub(crate) fn deadline_items(&self) -> usize {
        self.shared.lock().deadline_items()
    }
}

/// A reserved block that the caller fills and then commits. `'static` and
/// `Send`, so a transport can fill it from another thread or across an
/// await. Dropping it without committing gives the block back, leaving no
/// trace.
pub struct PutSlot {
    shared: Arc<Shared>,
    key: Arc<[u8]>,
    offset: usize,
    block_bytes: usize,
    len: usize,
    ttl_ms: u64,
    /// Committed (or given back): `Drop` has nothing left to do.
    finished: bool,
}

impl fmt::Debug for PutSlot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PutSlot")
            .field("key_len", &self.key.len())
            .field("len", &self.len)
            .field("ttl_ms", &self.ttl_ms)
            .finish_non_exhaustive()
    }
}

impl PutSlot {
    /// The value's length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the value is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The key the value will be stored under.
    pub fn key(&self) -> &[u8] {
        &self.key
    }

    /// The value's bytes, exactly `len` of them, to be written in place
    /// (by a copy, a socket read or a DMA). Their initial contents are
    /// unspecified (whatever the block held before).
    #[allow(unsafe_code)]
    pub fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: the block was allocated to this slot alone and is freed or
        // published only by consuming the slot (commit or drop), so nobody
        // else reads or writes it while this `&mut self` borrow lives.
        unsafe { self.shared.pool.bytes_mut(self.offset, self.len) }
    }

    /// Makes the value visible, replacing any previous value of the key
    /// (whose leases keep reading the old bytes). Returns the value's
    /// generation. The TTL counts from `now_ms`.
    pub fn commit(mut self, now_ms: u64) -> Result<u64, CacheError> {
        self.finished = true;
        self.shared.lock().commit(
            &self.key,
            self.offset,
            self.block_bytes,
            self.len,
            self.ttl_ms,
            now_ms,
        )
    }
}

impl Drop for PutSlot {
    fn drop(&mut self) {
        if !self.finished {
            self.shared.lock().cancel(self.offset, self.block_bytes);
        }
    }
}

/// One step of a snapshot's walk ([`CacheStore::snapshot_from`]).
#[derive(Debug)]
pub struct SnapshotChunk {
    /// Each value's key and a lease on its bytes.
    pub values: Vec<(Arc<[u8]>, Lease)>,
    /// The arena slot the next step starts from; `None` at the end.
    pub next: Option<usize>,
}

/// A read lease on one value: derefs to its bytes, which stay intact and
/// allocated while the lease lives, even if the key is deleted, replaced,
/// expired or evicted meanwhile. Copy out and drop it promptly: a leased
/// block cannot be reused, and a leased entry is not evicted.
pub struct Lease {
    shared: Arc<Shared>,
    info: LeaseInfo,
}

impl fmt::Debug for Lease {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Lease")
            .field("generation", &self.info.generation)
            .field("len", &self.info.len)
            .field("expires_at_ms", &self.info.expires_at_ms)
            .finish_non_exhaustive()
    }
}

impl Lease {
    /// The value's generation: unique per committed value, increasing in
    /// commit order, never reused.
    pub fn generation(&self) -> u64 {
        self.info.generation
    }

    /// When the value expires, in the caller's monotonic ms; 0 = never.
    pub fn expires_at_ms(&self) -> u64 {
        self.info.expires_at_ms
    }
}

impl Deref for Lease {
    type Target = [u8];

    #[allow(unsafe_code)]
    fn deref(&self) -> &[u8] {
        // SAFETY: the block belongs to a committed entry, which nobody
        // writes, and this lease keeps it from being freed (and so from
        // reaching a new writer) until the lease drops, which cannot happen
        // while the returned borrow of `self` lives.
        unsafe { self.shared.pool.bytes(self.info.offset, self.info.len) }
    }
}

impl AsRef<[u8]> for Lease {
    fn as_ref(&self) -> &[u8] {
        self
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        self.shared
            .lock()
            .release_lease(self.info.slot, self.info.generation);
    }
}
