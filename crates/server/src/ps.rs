//! The embedding parameter server (PetPS): named tables of u64 -> f32[dim].
//!
//! All tables share one store-mode pool, cut into [`PS_SHARDS_PER_WORKER`]
//! shards per worker. An item's key is the table id and the u64 key (12
//! bytes), so tables share memory without fixed capacities, and its value
//! is the vector (plus Adagrad's accumulator). Unlike kv, any worker
//! serves any key: a pull of hundreds of keys is one request to one worker
//! (PetPS's shape), which takes each shard's read lock once per request
//! and copies the vectors, in request order, straight into the reply or
//! into the caller's registered buffer (one-sided). Pushes take the shard's
//! write lock per key and update in place, so each key's update is atomic.
//!
//! The pool is built when the first table is created (a server that never
//! serves embeddings pays nothing), with the DRAM knobs of [`PsConfig`].
//! Tables are never dropped: ids are never reused, so a stale id can never
//! read another table's vectors.
//!
//! Sans-I/O like the kv service: [`PsService`]'s [`Service::handle`]
//! takes the decoded frame, a [`Reply`] and the time.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, RwLock, RwLockReadGuard, RwLockWriteGuard};

use fabrickv_engine::{item_bytes, Partition, PartitionConfig, PoolOptions, PutCond, PutResult};
use fabrickv_transport::{RemoteRegion, Reply};
use fabrickv_types::limits::PS_TABLES_MAX;
use fabrickv_types::{ErrorCode, KeyHash};
use fabrickv_wire::ps::{
    bitmap_bytes, decode_create, decode_request, encode_list_reply, encode_push_reply,
    encode_table_reply, f32s_from_le, init_vector, key_at, Missing, Optimizer, PsOp, PsRequest,
    PullDest, PullReplyWriter, PushMode, TableDesc, TableSpec,
};

use crate::service::{wire_refusal, Call, Refusal, Service, StatsList};

/// Shards of the embedding pool per worker: more shards than workers keep
/// two workers' pushes from meeting on one lock.
pub const PS_SHARDS_PER_WORKER: usize = 4;

/// Bytes of an item key: table id (u32) and key (u64), little-endian.
pub const PS_ITEM_KEY_BYTES: usize = 12;

/// Adagrad's epsilon, added to the root of the accumulator.
pub const ADAGRAD_EPSILON: f32 = 1e-10;

/// Adagrad's starting accumulator, per element (TensorFlow's default), so
/// the first steps are not huge.
pub const ADAGRAD_INITIAL_ACCUMULATOR: f32 = 0.1;

/// Default embedding pool, in bytes (1 GiB).
pub const DEFAULT_PS_POOL_BYTES: u64 = 1 << 30;

/// Smallest embedding pool per shard, in bytes.
pub const PS_SHARD_POOL_BYTES_MIN: u64 = 1 << 20;

/// The embedding service's configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct PsConfig {
    /// Size of the embedding pool over all shards, in bytes.
    pub pool_bytes: u64,
    /// How the pool's memory is obtained (PetPS: populate, mlock, zero).
    pub pool: PoolOptions,
    /// Tables created at start-up.
    pub tables: Vec<TableSpec>,
}

impl Default for PsConfig {
    fn default() -> Self {
        PsConfig {
            pool_bytes: DEFAULT_PS_POOL_BYTES,
            pool: PoolOptions {
                hugepages: false,
                populate: true,
                lock: true,
                zero: true,
            },
            tables: Vec::new(),
        }
    }
}

/// One table.
struct Table {
    id: u32,
    spec: TableSpec,
    items: AtomicU64,
}

impl Table {
    fn desc(&self) -> TableDesc {
        TableDesc {
            id: self.id,
            spec: self.spec.clone(),
            items: self.items.load(Ordering::Relaxed),
        }
    }

    /// Bytes of the vector as pulled.
    fn vector_bytes(&self) -> usize {
        self.spec.dim as usize * 4
    }

    /// Bytes of the stored value (vector plus optimizer state).
    fn state_bytes(&self) -> usize {
        self.vector_bytes() * self.spec.optimizer.state_per_element()
    }
}

/// Counters over all workers.
#[derive(Debug, Default)]
struct Counters {
    pulls: AtomicU64,
    pull_keys: AtomicU64,
    pull_misses: AtomicU64,
    pushes: AtomicU64,
    push_keys: AtomicU64,
    one_sided_bytes: AtomicU64,
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
    counters: Counters,
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
            counters: Counters::default(),
        }
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

    fn shards(&self) -> Option<&[RwLock<Partition>]> {
        self.shards.get().map(|s| &s[..])
    }

    /// Builds the pool; called with `create` held.
    fn build_pool(&self) -> Result<(), Refusal> {
        if self.shards.get().is_some() {
            return Ok(());
        }
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

    fn by_name(&self, name: &str) -> Option<Arc<Table>> {
        self.read_tables()
            .iter()
            .find(|t| t.spec.name == name)
            .cloned()
    }

    fn by_id(&self, id: u32) -> Option<Arc<Table>> {
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

fn read(p: &RwLock<Partition>) -> RwLockReadGuard<'_, Partition> {
    p.read().unwrap_or_else(|e| e.into_inner())
}

fn write(p: &RwLock<Partition>) -> RwLockWriteGuard<'_, Partition> {
    p.write().unwrap_or_else(|e| e.into_inner())
}

/// The item key of `key` in table `table`.
#[inline]
fn item_key(table: u32, key: u64) -> [u8; PS_ITEM_KEY_BYTES] {
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
fn item_hash(table: u32, key: u64) -> KeyHash {
    // An odd multiple of the table id: a bijection of `key` per table, so
    // keys of one table never share a hash.
    let salt = u64::from(table).wrapping_mul(0xD6E8_FEB8_6659_FD93);
    KeyHash(fabrickv_wire::ps::splitmix64(key ^ salt))
}

/// The PS service of one worker: per-worker scratch space over the shared
/// store.
pub struct PsService {
    worker: u16,
    store: Arc<PsStore>,
    /// Item keys and hashes of the request being served.
    keys: Vec<([u8; PS_ITEM_KEY_BYTES], KeyHash)>,
    /// Shard of each key.
    shard_of: Vec<u32>,
    /// Vectors staged for a transport without a mapped view (fabric).
    staging: Vec<u8>,
    /// Buffers of a push, reused from key to key.
    scratch: Scratch,
    /// Found bits of a one-sided pull.
    found: Vec<u64>,
}

impl PsService {
    /// The service of worker `worker`.
    pub fn new(worker: u16, store: Arc<PsStore>) -> PsService {
        PsService {
            worker,
            store,
            keys: Vec::new(),
            shard_of: Vec::new(),
            staging: Vec::new(),
            scratch: Scratch::default(),
            found: Vec::new(),
        }
    }

    /// Hashes every key of the request once and finds its shard.
    fn prepare(&mut self, table: u32, keys: &[u8], shards: usize) {
        self.keys.clear();
        self.shard_of.clear();
        for i in 0..keys.len() / 8 {
            let key = key_at(keys, i);
            let k = item_key(table, key);
            let h = item_hash(table, key);
            self.shard_of.push(h.partition(shards as u32));
            self.keys.push((k, h));
        }
    }

    fn pull(
        &mut self,
        id: u64,
        table: u32,
        keys: &[u8],
        dest: Option<PullDest>,
        reply: &mut dyn Reply,
        now_ms: u64,
    ) -> Result<(), Refusal> {
        let store = self.store.clone();
        let (t, shards) = table_of(&store, table)?;
        let n = keys.len() / 8;
        let vb = t.vector_bytes();
        self.prepare(table, keys, shards.len());
        self.found.clear();
        self.found.resize(bitmap_bytes(n) / 8, 0);
        let total = n * vb;
        let misses;
        match dest {
            None => {
                let out = reply.buf();
                let (w, bitmap_at) = PullReplyWriter::begin(out, id, self.worker, table, n);
                let values_at = out.len();
                out.resize(values_at + total, 0);
                misses = gather(
                    &t,
                    shards,
                    &self.keys,
                    &self.shard_of,
                    &mut out[values_at..],
                    &mut self.found,
                    now_ms,
                );
                write_bitmap(&mut out[bitmap_at..], &self.found);
                w.finish(out);
            }
            Some(d) => {
                let region = RemoteRegion::decode(&d.region)
                    .ok_or_else(|| (ErrorCode::Malformed, "bad region".to_string()))?;
                let offset = usize::try_from(d.offset)
                    .map_err(|_| (ErrorCode::Malformed, "offset too large".to_string()))?;
                // Bounds first: an overrun is refused before any byte moves.
                region
                    .check(offset, total)
                    .map_err(|e| (ErrorCode::Malformed, e.to_string()))?;
                let one_sided = |e: fabrickv_transport::TransportError| {
                    (
                        ErrorCode::Malformed,
                        format!("one-sided write refused: {e}"),
                    )
                };
                match reply
                    .remote_mut(&region, offset, total)
                    .map_err(one_sided)?
                {
                    Some(view) => {
                        misses = gather(
                            &t,
                            shards,
                            &self.keys,
                            &self.shard_of,
                            view,
                            &mut self.found,
                            now_ms,
                        );
                    }
                    None => {
                        self.staging.clear();
                        self.staging.resize(total, 0);
                        misses = gather(
                            &t,
                            shards,
                            &self.keys,
                            &self.shard_of,
                            &mut self.staging,
                            &mut self.found,
                            now_ms,
                        );
                        reply
                            .write_remote(&region, offset, &self.staging)
                            .map_err(one_sided)?;
                    }
                }
                store
                    .counters
                    .one_sided_bytes
                    .fetch_add(total as u64, Ordering::Relaxed);
                let out = reply.buf();
                let (w, bitmap_at) = PullReplyWriter::begin(out, id, self.worker, table, n);
                write_bitmap(&mut out[bitmap_at..], &self.found);
                w.finish(out);
            }
        }
        let c = &store.counters;
        c.pulls.fetch_add(1, Ordering::Relaxed);
        c.pull_keys.fetch_add(n as u64, Ordering::Relaxed);
        c.pull_misses.fetch_add(misses, Ordering::Relaxed);
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    fn push(
        &mut self,
        id: u64,
        table: u32,
        mode: PushMode,
        keys: &[u8],
        values: &[u8],
        out: &mut Vec<u8>,
        now_ms: u64,
    ) -> Result<(), Refusal> {
        let store = self.store.clone();
        let (t, shards) = table_of(&store, table)?;
        let n = keys.len() / 8;
        let vb = t.vector_bytes();
        if values.len() != n * vb {
            return Err((
                ErrorCode::BadDimension,
                format!(
                    "{} value bytes for {n} keys of table {:?} (dim {}, {vb} bytes each)",
                    values.len(),
                    t.spec.name,
                    t.spec.dim
                ),
            ));
        }
        self.prepare(table, keys, shards.len());
        let mut applied = 0u32;
        let mut status = ErrorCode::Ok;
        // In request order, so what was applied is a prefix of the request.
        let mut held: Option<(u32, RwLockWriteGuard<'_, Partition>)> = None;
        for (i, (k, h)) in self.keys.iter().enumerate() {
            let s = self.shard_of[i];
            if held.as_ref().is_none_or(|(hs, _)| *hs != s) {
                // Release before taking the next shard: never two locks.
                drop(held.take());
                held = Some((s, write(&shards[s as usize])));
            }
            let Some((_, p)) = held.as_mut() else {
                continue;
            };
            let v = &values[i * vb..(i + 1) * vb];
            let r = match mode {
                PushMode::Overwrite => overwrite(&t, p, *h, k, v, &mut self.scratch, now_ms),
                PushMode::Gradient => apply_gradient(&t, p, *h, k, v, &mut self.scratch, now_ms),
            };
            match r {
                Ok(()) => applied += 1,
                Err(code) => {
                    status = code;
                    break;
                }
            }
        }
        drop(held);
        let c = &store.counters;
        c.pushes.fetch_add(1, Ordering::Relaxed);
        c.push_keys.fetch_add(u64::from(applied), Ordering::Relaxed);
        encode_push_reply(out, id, self.worker, table, status, applied);
        Ok(())
    }
}

impl Service for PsService {
    /// Serves one PS request; every refusal (a bad request, an unknown
    /// table, a pull that cannot be written) refuses the frame whole.
    fn handle(&mut self, call: &Call<'_>, reply: &mut dyn Reply) -> Result<(), Refusal> {
        let id = call.id();
        let now_ms = call.now_ms;
        let req = decode_request(&call.frame).map_err(wire_refusal)?;
        match req {
            PsRequest::Create(body) => decode_create(body)
                .and_then(|spec| self.store.create(&spec))
                .map(|d| encode_table_reply(reply.buf(), id, self.worker, PsOp::Create, &d)),
            PsRequest::Open(name) => match self.store.by_name(name) {
                Some(t) => {
                    encode_table_reply(reply.buf(), id, self.worker, PsOp::Open, &t.desc());
                    Ok(())
                }
                None => Err((ErrorCode::NoSuchTable, format!("no table named {name:?}"))),
            },
            PsRequest::List => {
                encode_list_reply(reply.buf(), id, self.worker, &self.store.list());
                Ok(())
            }
            PsRequest::Pull { table, keys, dest } => {
                self.pull(id, table, keys, dest, reply, now_ms)
            }
            PsRequest::Push {
                table,
                mode,
                keys,
                values,
            } => self.push(id, table, mode, keys, values, reply.buf(), now_ms),
        }
    }

    fn shared_stats(&self, out: &mut StatsList) {
        out.extend(self.store.stats_list());
    }
}

/// Table `id` and the pool's shards.
fn table_of(store: &PsStore, id: u32) -> Result<(Arc<Table>, &[RwLock<Partition>]), Refusal> {
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

/// How many keys ahead of the copy each prefetch stage runs in [`gather`]:
/// bucket loads run `2 * PULL_PREFETCH_DISTANCE_KEYS` ahead, item loads
/// `PULL_PREFETCH_DISTANCE_KEYS` ahead. Far enough that a DRAM miss (about
/// 100 ns) is over when the copy reaches the key, near enough that the
/// lines in flight stay in L1 (16 keys x 9 lines of a 512-byte vector fit).
const PULL_PREFETCH_DISTANCE_KEYS: usize = 6;

/// Cache lines (`BUCKET_BYTES` each) of an item, from its header, that
/// [`gather`] prefetches; the core's stream prefetcher, started by them,
/// brings the rest of the value. Prefetching every line of a 512-byte
/// vector (9 lines) filled the core's miss buffers, so the prefetch
/// instructions themselves stalled (most of gather's samples in `perf
/// annotate`): A/B here, pulls of 100 x 512 B from 1 M keys over shm ran
/// 2-24% faster with 4 lines, in each of 8 interleaved pairs.
const PULL_PREFETCH_ITEM_LINES: usize = 4;

/// Copies the vectors of `keys` (in request order) into `dest`, sets the
/// found bits and fills absent keys by the table's policy. Returns the
/// number of absent keys.
///
/// A software pipeline over the keys: while key `i` is copied, the item
/// (header, key and value, whose size every key of a table shares) of key
/// `i + D` and the bucket of key `i + 2D` are loading, so the memory system
/// always has misses in flight and no pass waits for a whole batch.
fn gather(
    t: &Table,
    shards: &[RwLock<Partition>],
    keys: &[([u8; PS_ITEM_KEY_BYTES], KeyHash)],
    shard_of: &[u32],
    dest: &mut [u8],
    found: &mut [u64],
    now_ms: u64,
) -> u64 {
    const D: usize = PULL_PREFETCH_DISTANCE_KEYS;
    let vb = t.vector_bytes();
    let state = t.state_bytes();
    let span = item_bytes(PS_ITEM_KEY_BYTES, state)
        .min(PULL_PREFETCH_ITEM_LINES * fabrickv_engine::BUCKET_BYTES);
    let n = keys.len();
    // The read lock of every shard the pull touches, taken once, in shard
    // order: writers hold one lock at a time and never wait while holding
    // one, so ascending order cannot deadlock.
    let mut used = vec![false; shards.len()];
    for &s in shard_of {
        used[s as usize] = true;
    }
    let guards: Vec<Option<RwLockReadGuard<'_, Partition>>> = shards
        .iter()
        .zip(&used)
        .map(|(shard, &u)| u.then(|| read(shard)))
        .collect();
    let mut misses = 0;
    for step in 0..n + 2 * D {
        if step < n {
            if let Some(p) = guards[shard_of[step] as usize].as_deref() {
                p.prefetch(keys[step].1);
            }
        }
        if let Some(i) = step.checked_sub(D).filter(|&i| i < n) {
            if let Some(p) = guards[shard_of[i] as usize].as_deref() {
                p.prefetch_item_span(keys[i].1, span);
            }
        }
        let Some(i) = step.checked_sub(2 * D) else {
            continue;
        };
        let (k, h) = &keys[i];
        let v = guards[shard_of[i] as usize]
            .as_deref()
            .and_then(|p| p.peek(*h, k, now_ms))
            .filter(|v| v.len() == state);
        let out = &mut dest[i * vb..(i + 1) * vb];
        match v {
            Some(v) => {
                out.copy_from_slice(&v[..vb]);
                found[i / 64] |= 1 << (i % 64);
            }
            None => {
                misses += 1;
                fill_missing(t, key_of_slice(k), out);
            }
        }
    }
    misses
}

/// What a pull returns for an absent key.
fn fill_missing(t: &Table, key: u64, out: &mut [u8]) {
    match t.spec.missing {
        Missing::Zeros => out.fill(0),
        Missing::Init => {
            let mut v = vec![0f32; t.spec.dim as usize];
            init_vector(t.spec.seed, key, &mut v);
            store_f32s(&v, out);
        }
    }
}

fn write_bitmap(out: &mut [u8], found: &[u64]) {
    for (o, w) in out.chunks_exact_mut(8).zip(found) {
        o.copy_from_slice(&w.to_le_bytes());
    }
}

fn put_result(r: PutResult) -> Result<(), ErrorCode> {
    match r {
        PutResult::Stored => Ok(()),
        PutResult::InsufficientSpace => Err(ErrorCode::InsufficientSpace),
        PutResult::TooLarge => Err(ErrorCode::ValueTooLarge),
        PutResult::ConditionFailed => Err(ErrorCode::Internal),
    }
}

/// Writes `state` (f32s) as little-endian bytes over `out`.
fn store_f32s(state: &[f32], out: &mut [u8]) {
    for (o, x) in out.chunks_exact_mut(4).zip(state) {
        o.copy_from_slice(&x.to_le_bytes());
    }
}

/// The buffers of a push, kept by the service so that no key allocates.
#[derive(Debug, Default)]
struct Scratch {
    /// The key's state as floats: weights, then Adagrad's accumulator.
    state: Vec<f32>,
    /// The key's gradient, decoded.
    grad: Vec<f32>,
    /// The state as stored (little-endian bytes), for a new item.
    bytes: Vec<u8>,
}

impl Scratch {
    /// Encodes `state` into `bytes` and stores it as the key's value.
    fn put_state(&mut self, p: &mut Partition, h: KeyHash, k: &[u8], now_ms: u64) -> PutResult {
        self.bytes.clear();
        self.bytes.resize(self.state.len() * 4, 0);
        store_f32s(&self.state, &mut self.bytes);
        p.put(h, k, &self.bytes, 0, PutCond::Always, now_ms)
    }
}

/// Stores `v` as the key's vector (optimizer state reset).
fn overwrite(
    t: &Table,
    p: &mut Partition,
    h: KeyHash,
    k: &[u8],
    v: &[u8],
    s: &mut Scratch,
    now_ms: u64,
) -> Result<(), ErrorCode> {
    // The partition's item count tells a new key from a replaced one
    // without a second lookup.
    let items_before = p.stats().items;
    let r = match t.spec.optimizer {
        Optimizer::Sgd => p.put(h, k, v, 0, PutCond::Always, now_ms),
        Optimizer::Adagrad => {
            let dim = t.spec.dim as usize;
            s.state.clear();
            s.state.resize(dim * 2, ADAGRAD_INITIAL_ACCUMULATOR);
            f32s_from_le(v, &mut s.state[..dim]);
            s.put_state(p, h, k, now_ms)
        }
    };
    put_result(r)?;
    if p.stats().items > items_before {
        t.items.fetch_add(1, Ordering::Relaxed);
    }
    Ok(())
}

/// Applies gradient `g` to the key's vector with the table's optimizer; an
/// absent key starts from the initializer.
fn apply_gradient(
    t: &Table,
    p: &mut Partition,
    h: KeyHash,
    k: &[u8],
    g: &[u8],
    s: &mut Scratch,
    now_ms: u64,
) -> Result<(), ErrorCode> {
    let dim = t.spec.dim as usize;
    let lr = t.spec.lr;
    s.grad.clear();
    s.grad.resize(dim, 0.0);
    f32s_from_le(g, &mut s.grad);
    let state_len = dim * t.spec.optimizer.state_per_element();
    s.state.clear();
    s.state.resize(state_len, 0.0);
    if let Some(bytes) = p.value_mut(h, k, now_ms) {
        if bytes.len() == state_len * 4 {
            f32s_from_le(bytes, &mut s.state);
            step(t.spec.optimizer, lr, &mut s.state, &s.grad);
            store_f32s(&s.state, bytes);
            return Ok(());
        }
    }
    init_vector(t.spec.seed, key_of_slice(k), &mut s.state[..dim]);
    if t.spec.optimizer == Optimizer::Adagrad {
        s.state[dim..].fill(ADAGRAD_INITIAL_ACCUMULATOR);
    }
    step(t.spec.optimizer, lr, &mut s.state, &s.grad);
    put_result(s.put_state(p, h, k, now_ms))?;
    t.items.fetch_add(1, Ordering::Relaxed);
    Ok(())
}

/// The u64 key inside an item key.
fn key_of_slice(k: &[u8]) -> u64 {
    let mut b = [0u8; 8];
    b.copy_from_slice(&k[4..PS_ITEM_KEY_BYTES]);
    u64::from_le_bytes(b)
}

/// One optimizer step over `state` (weights, then Adagrad's accumulator).
#[inline]
fn step(opt: Optimizer, lr: f32, state: &mut [f32], g: &[f32]) {
    let dim = g.len();
    match opt {
        Optimizer::Sgd => {
            for (w, gi) in state[..dim].iter_mut().zip(g) {
                *w -= lr * gi;
            }
        }
        Optimizer::Adagrad => {
            let (w, acc) = state.split_at_mut(dim);
            for ((wi, ai), gi) in w.iter_mut().zip(acc.iter_mut()).zip(g) {
                *ai += gi * gi;
                *wi -= lr * gi / (ai.sqrt() + ADAGRAD_EPSILON);
            }
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests;
