//! The embedding tables and their pool, shared by every worker: table
//! creation (which builds the pool), lookup by name and id, the item key
//! and hash of a table's key, and the store-wide counters STATS reports.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, RwLock, RwLockReadGuard, RwLockWriteGuard};

use fabrickv_engine::{Partition, PartitionConfig};
use fabrickv_types::limits::PS_TABLES_MAX;
use fabrickv_types::{ErrorCode, KeyHash};
use fabrickv_wire::ps::{TableDesc, TableSpec};

use super::{
    MemoryBudget, PsConfig, PS_ITEM_KEY_BYTES, PS_SHARDS_PER_WORKER, PS_SHARD_POOL_BYTES_MIN,
};
use crate::service::Refusal;

/// One table.
pub(super) struct Table {
    /// Its id on the wire (1-based, never reused).
    pub(super) id: u32,
    /// Its shape, as created.
    pub(super) spec: TableSpec,
    /// Keys stored, counted as pushes add them.
    pub(super) items: AtomicU64,
}

impl Table {
    /// What OPEN, CREATE and LIST answer about it.
    pub(super) fn desc(&self) -> TableDesc {
        TableDesc {
            id: self.id,
            spec: self.spec.clone(),
            items: self.items.load(Ordering::Relaxed),
        }
    }

    /// Bytes of the vector as pulled.
    pub(super) fn vector_bytes(&self) -> usize {
        self.spec.dim as usize * 4
    }

    /// Bytes of the stored value (vector plus optimizer state).
    pub(super) fn state_bytes(&self) -> usize {
        self.vector_bytes() * self.spec.optimizer.state_per_element()
    }
}

/// Counters over all workers, reported by STATS as `ps_*`.
#[derive(Debug, Default)]
pub(super) struct Counters {
    /// Pull requests served.
    pub(super) pulls: AtomicU64,
    /// Keys pulled.
    pub(super) pull_keys: AtomicU64,
    /// Keys pulled that were absent.
    pub(super) pull_misses: AtomicU64,
    /// Push requests served.
    pub(super) pushes: AtomicU64,
    /// Keys a push applied.
    pub(super) push_keys: AtomicU64,
    /// Bytes pulls wrote one-sided into clients' regions.
    pub(super) one_sided_bytes: AtomicU64,
}

/// The replication state of a store: whether journals are on, and the
/// barrier between pushes and rounds.
#[derive(Default)]
pub(super) struct ReplicaState {
    /// Set once replication starts: the pool's shards keep journals.
    pub(super) journaled: std::sync::atomic::AtomicBool,
    /// Held shared by a push with a request id while replication is on,
    /// exclusively by a round draining the shards' journals.
    pub(super) barrier: RwLock<()>,
    /// The shards' journal counts, once the replicator took them
    /// ([`PsStore::journal_seqs`]): what a pull reads to tell whether its
    /// rows are settled.
    pub(super) seqs: OnceLock<Box<[Arc<fabrickv_engine::JournalSeq>]>>,
}

/// The embedding tables and their pool, shared by every worker.
pub struct PsStore {
    cfg: PsConfig,
    shard_count: usize,
    shards: OnceLock<Box<[RwLock<Partition>]>>,
    /// Tables by id - 1.
    tables: RwLock<Vec<Arc<Table>>>,
    /// Serialises table creation and pool construction.
    create: Mutex<()>,
    /// What the process may lock and the host has free, read when the
    /// pool is about to be built (tests give their own).
    budget: fn() -> MemoryBudget,
    /// What the handlers of every worker count.
    pub(super) counters: Counters,
    /// Journals and the push barrier, once replication starts.
    replica: ReplicaState,
}

impl PsStore {
    /// A store for a server with `workers` workers; the pool is built by
    /// the first table.
    pub fn new(cfg: PsConfig, workers: usize) -> PsStore {
        PsStore {
            cfg,
            shard_count: (workers * PS_SHARDS_PER_WORKER).max(1),
            shards: OnceLock::new(),
            tables: RwLock::new(Vec::new()),
            create: Mutex::new(()),
            budget: MemoryBudget::of_this_process,
            counters: Counters::default(),
            replica: Default::default(),
        }
    }

    /// The replication state.
    pub(super) fn replica(&self) -> &ReplicaState {
        &self.replica
    }

    /// Whether the shards keep journals (replication is on).
    pub(super) fn journaled(&self) -> bool {
        self.replica.journaled.load(Ordering::Acquire)
    }

    /// The shards the pool has, or will have once built.
    pub fn shard_count(&self) -> usize {
        self.shard_count
    }

    /// The same store, reading its memory budget from `budget`.
    #[cfg(test)]
    pub(super) fn with_budget(mut self, budget: fn() -> MemoryBudget) -> PsStore {
        self.budget = budget;
        self
    }

    /// Whether the configured pool fits what this process may lock and
    /// the host has free now; the server says so at start-up, since a
    /// pool that does not fit refuses every CREATE.
    pub fn check_budget(&self) -> Result<(), String> {
        (self.budget)().check(self.cfg.pool_bytes, &self.cfg.pool)
    }

    /// Checks the configuration without building anything.
    pub fn validate(cfg: &PsConfig, workers: usize) -> Result<(), String> {
        let shards = (workers * PS_SHARDS_PER_WORKER).max(1) as u64;
        if cfg.pool_bytes / shards < PS_SHARD_POOL_BYTES_MIN {
            return Err(format!(
                "embedding pool of {} bytes is below {} bytes per shard ({shards} shards)",
                cfg.pool_bytes, PS_SHARD_POOL_BYTES_MIN
            ));
        }
        for t in &cfg.tables {
            t.validate()
                .map_err(|(_, why)| format!("table {:?}: {why}", t.name))?;
        }
        Ok(())
    }

    /// Creates the configured tables (and so the pool).
    pub fn create_configured(&self) -> Result<(), String> {
        for t in self.cfg.tables.clone() {
            self.create(&t)
                .map_err(|(c, why)| format!("table {:?}: {c}: {why}", t.name))?;
        }
        Ok(())
    }

    /// The pool's shards, once the first table built them.
    pub(super) fn shards(&self) -> Option<&[RwLock<Partition>]> {
        self.shards.get().map(|s| &s[..])
    }

    /// Turns the shards' journals on (replication starts): now, on the
    /// pool's shards if it exists, and for a pool built later. Under the
    /// creation lock, so that a pool being built meanwhile cannot miss it.
    pub fn enable_journals(&self) {
        let _guard = self.create.lock().unwrap_or_else(|p| p.into_inner());
        self.replica.journaled.store(true, Ordering::Release);
        if let Some(shards) = self.shards() {
            for s in shards {
                write(s).enable_journal();
            }
        }
    }

    /// Builds the pool if no table has yet (a follower applying rows or
    /// markers its primary shipped before any table of its own).
    pub(super) fn ensure_pool(&self) -> Result<(), Refusal> {
        if self.shards().is_some() {
            return Ok(());
        }
        let _guard = self.create.lock().unwrap_or_else(|p| p.into_inner());
        self.build_pool()
    }

    /// Builds the pool; called with `create` held.
    fn build_pool(&self) -> Result<(), Refusal> {
        if self.shards.get().is_some() {
            return Ok(());
        }
        // Before a page is touched: one CREATE from any client builds the
        // pool, and a pool that cannot be locked or held must cost nothing
        // to refuse (one CREATE from any client grew the server by 1.3 GB).
        self.check_budget().map_err(|why| {
            (
                ErrorCode::PoolUnavailable,
                format!(
                    "embedding pool of {} unavailable: {why}",
                    fabrickv_types::size::format_size(self.cfg.pool_bytes)
                ),
            )
        })?;
        let per_shard = (self.cfg.pool_bytes / self.shard_count as u64) as usize;
        let mut shards = Vec::with_capacity(self.shard_count);
        for _ in 0..self.shard_count {
            let p = Partition::new(&PartitionConfig {
                mode: fabrickv_engine::Mode::Store,
                pool_bytes: per_shard,
                index_buckets: None,
                memory: self.cfg.pool,
            })
            .map_err(|e| {
                (
                    ErrorCode::PoolUnavailable,
                    format!(
                        "embedding pool of {} bytes unavailable: {e}",
                        self.cfg.pool_bytes
                    ),
                )
            })?;
            shards.push(RwLock::new(p));
        }
        if self.journaled() {
            // Before any row is written: a follower gets every row.
            for s in &mut shards {
                s.get_mut()
                    .unwrap_or_else(|e| e.into_inner())
                    .enable_journal();
            }
        }
        tracing::info!(
            pool = %fabrickv_types::size::format_size(self.cfg.pool_bytes),
            shards = self.shard_count,
            options = ?self.cfg.pool,
            "embedding pool ready"
        );
        let _ = self.shards.set(shards.into_boxed_slice());
        Ok(())
    }

    /// Creates a table, or returns the existing one if its shape is the same.
    pub fn create(&self, spec: &TableSpec) -> Result<TableDesc, Refusal> {
        spec.validate()?;
        let _guard = self.create.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(t) = self.by_name(&spec.name) {
            if t.spec == *spec {
                return Ok(t.desc());
            }
            return Err((
                ErrorCode::TableExists,
                format!(
                    "table {:?} exists with dim {}, optimizer {}, lr {}, missing {}, seed {}",
                    spec.name,
                    t.spec.dim,
                    t.spec.optimizer.name(),
                    t.spec.lr,
                    t.spec.missing.name(),
                    t.spec.seed
                ),
            ));
        }
        if self.read_tables().len() >= PS_TABLES_MAX {
            return Err((
                ErrorCode::PoolUnavailable,
                format!("{PS_TABLES_MAX} tables exist already"),
            ));
        }
        self.build_pool()?;
        let mut tables = self.tables.write().unwrap_or_else(|p| p.into_inner());
        let t = Arc::new(Table {
            id: tables.len() as u32 + 1,
            spec: spec.clone(),
            items: AtomicU64::new(0),
        });
        tables.push(t.clone());
        tracing::info!(name = %spec.name, id = t.id, dim = spec.dim, "embedding table created");
        Ok(t.desc())
    }

    fn read_tables(&self) -> RwLockReadGuard<'_, Vec<Arc<Table>>> {
        self.tables.read().unwrap_or_else(|p| p.into_inner())
    }

    /// The table named `name`.
    pub(super) fn by_name(&self, name: &str) -> Option<Arc<Table>> {
        self.read_tables()
            .iter()
            .find(|t| t.spec.name == name)
            .cloned()
    }

    /// The table with id `id`.
    pub(super) fn by_id(&self, id: u32) -> Option<Arc<Table>> {
        let i = (id as usize).checked_sub(1)?;
        self.read_tables().get(i).cloned()
    }

    /// Every table.
    pub fn list(&self) -> Vec<TableDesc> {
        self.read_tables().iter().map(|t| t.desc()).collect()
    }

    /// Store-wide counters, for STATS.
    pub fn stats_list(&self) -> Vec<(&'static str, u64)> {
        let c = &self.counters;
        let (items, bytes) = self.shards().map_or((0, 0), |s| {
            s.iter().fold((0, 0), |(i, b), p| {
                let st = read(p).stats();
                (i + st.items, b + st.bytes)
            })
        });
        vec![
            ("ps_tables", self.read_tables().len() as u64),
            ("ps_items", items),
            ("ps_bytes", bytes),
            (
                "ps_pool_bytes",
                if self.shards().is_some() {
                    self.cfg.pool_bytes
                } else {
                    0
                },
            ),
            ("ps_pulls", c.pulls.load(Ordering::Relaxed)),
            ("ps_pull_keys", c.pull_keys.load(Ordering::Relaxed)),
            ("ps_pull_misses", c.pull_misses.load(Ordering::Relaxed)),
            ("ps_pushes", c.pushes.load(Ordering::Relaxed)),
            ("ps_push_keys", c.push_keys.load(Ordering::Relaxed)),
            (
                "ps_one_sided_bytes",
                c.one_sided_bytes.load(Ordering::Relaxed),
            ),
        ]
    }
}

/// A shard's read lock; a panic while it was held left the partition
/// between two operations, so poisoning is ignored.
pub(super) fn read(p: &RwLock<Partition>) -> RwLockReadGuard<'_, Partition> {
    p.read().unwrap_or_else(|e| e.into_inner())
}

/// A shard's write lock, poisoning ignored as for [`read`].
pub(super) fn write(p: &RwLock<Partition>) -> RwLockWriteGuard<'_, Partition> {
    p.write().unwrap_or_else(|e| e.into_inner())
}

/// The item key of `key` in table `table`.
#[inline]
pub(super) fn item_key(table: u32, key: u64) -> [u8; PS_ITEM_KEY_BYTES] {
    let mut k = [0u8; PS_ITEM_KEY_BYTES];
    k[..4].copy_from_slice(&table.to_le_bytes());
    k[4..].copy_from_slice(&key.to_le_bytes());
    k
}

/// The index hash of `key` in table `table`: splitmix64's mix of the two
/// words, not XXH3 over the 12-byte item key. A pull hashes every key it
/// is sent before it touches memory, and the mix is a handful of
/// multiplies with no length handling. Only this service hashes its
/// items (clients route by their own hash), so the choice is private.
#[inline]
pub(super) fn item_hash(table: u32, key: u64) -> KeyHash {
    // An odd multiple of the table id: a bijection of `key` per table, so
    // keys of one table never share a hash.
    let salt = u64::from(table).wrapping_mul(0xD6E8_FEB8_6659_FD93);
    KeyHash(fabrickv_wire::ps::splitmix64(key ^ salt))
}

/// Table `id` and the pool's shards.
pub(super) fn table_of(
    store: &PsStore,
    id: u32,
) -> Result<(Arc<Table>, &[RwLock<Partition>]), Refusal> {
    let t = store
        .by_id(id)
        .ok_or_else(|| (ErrorCode::NoSuchTable, format!("no table with id {id}")))?;
    let shards = store.shards().ok_or_else(|| {
        (
            ErrorCode::Internal,
            "a table exists without a pool".to_string(),
        )
    })?;
    Ok((t, shards))
}
