//! Checkpoints of the in-memory keyspace and the embedding tables, saved
//! while the server serves and loaded before it listens.
//!
//! - **A cut per partition without a fork.** A save walks each engine
//!   partition (kv partitions and embedding-pool shards alike) in index
//!   order, a chunk of buckets per hold of its lock, writing each key's
//!   state as it finds it. Meanwhile the partition notes every key
//!   written ([`Partition::begin_cut`]). A key written in a bucket the
//!   walk has not reached yet needs nothing: the walk will read it as it
//!   is then. A key written behind the walk is read again later and
//!   written after its first record, so in the file each key's *last*
//!   record is its state at the moment the walk ends, under the lock:
//!   the partition's cut. Writes after the cut are not in the file. The
//!   extra memory is the keys written behind the walk, at most
//!   [`CUT_BEHIND_KEYS_MAX`] before they are read again and dropped, not
//!   a copy of the data. Each key read again adds a record to the file,
//!   so a walk that writes outrun reads the rest of its partition in one
//!   hold (`Walk::losing`): the file stays within about twice the
//!   partition's records.
//! - **Files.** One file per partition and per shard
//!   (`fabrickv_wire::checkpoint` has the format: a checked header,
//!   frames of replication records each with its CRC, a trailer), written
//!   in parallel by one thread per worker, then synced. The last step is
//!   the rename of `MANIFEST`, which lists every file with its length and
//!   checksum chain, into the checkpoint's directory: a save that dies
//!   before it leaves no manifest, and the previous checkpoint is the
//!   newest.
//! - **The KV cache** (with `--checkpoint-cache`) is one store behind
//!   one lock, and its values never change once committed: its cut is
//!   the newest generation committed when the save begins, and the walk
//!   leases, a chunk per hold of the lock, every value of that
//!   generation or older still there when the walk passes
//!   ([`CacheStore::snapshot_from`]). A value replaced or evicted before
//!   the walk reaches it is not in the file: a cache may drop any value.
//! - **Restore.** Before the server listens, a checkpoint's files are
//!   checked against the manifest (length, header, trailer) and then
//!   loaded in parallel, every frame checked before it is applied. A
//!   damaged, cut-short, foreign or newer-format file stops the start
//!   with an error naming it: a server never serves a half-loaded
//!   checkpoint.

use std::collections::HashSet;
use std::fs::{self, File};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use fabrickv_cache::CacheStore;
use fabrickv_engine::{Partition, ScanBudget, ScanItem, ValueRef};
use fabrickv_types::KeyHash;
use fabrickv_wire::checkpoint::{
    self as format, Bad, FileHeader, FileKind, Next, Trailer, FORMAT_VERSION, HEADER_BYTES,
    TRAILER_BYTES,
};
use fabrickv_wire::checksum::crc32c;
use fabrickv_wire::repl::{BatchBuf, Record};
use serde::{Deserialize, Serialize};

use crate::partitions::Partitions;
use crate::ps::replica::{RowState, PS_MARKER_TABLE_BIT};
use crate::ps::PsStore;
use crate::replication::{
    append_state, read_state, store_key_record, store_table_record, TableIds, UnixClock,
};

/// Bytes of records a save gathers before it writes them as one frame.
pub const CHECKPOINT_FRAME_BYTES_TARGET: usize = 1 << 20;

/// Index entries a save's walk reads per hold of a partition's lock when
/// no request waits for it (keys written behind the walk are read again
/// in chunks of the same size).
pub const CUT_SCAN_ENTRIES: usize = 512;

/// Entries a save's walk reads in one hold of a kv partition's lock
/// before it lets a request waiting for the lock have it (at the next
/// chain's end): the longest a request waits on a save, and the least
/// progress a walk makes per hold under steady requests.
pub const CUT_YIELD_AFTER_ENTRIES: usize = 16;

/// Holds of a partition's lock the end of a walk may take reading again
/// the keys written behind it, letting requests in between, before it
/// reads the rest in one hold and takes the cut: so a save ends even
/// when requests write faster than the walk reads.
pub const CUT_FINISH_HOLDS_MAX: u32 = 64;

/// The nice value of a save's threads where the idle scheduling class is
/// refused: a save runs beside the workers without taking their cores.
pub const CHECKPOINT_NICE: i32 = 10;

/// The share of the time, in percent, below which a save thread counts
/// its cores as busy with something else (requests, mostly): it got the
/// core for less than this share of the time it spent building a frame.
pub const CHECKPOINT_CONTENDED_BELOW_CPU_PERCENT: u128 = 90;

/// The share of the time, in percent, a save works while the server
/// serves: after each frame it rests long enough to keep to it. Working
/// half the time still cost a one-connection writer about a third of its
/// rate here, a third of the time 26-35%, a quarter 26-30%
/// (`docs/benchmarks.md`): past that the save's cost is not its cores.
pub const CHECKPOINT_BUSY_WORK_PERCENT: u32 = 25;
const _: () = assert!(CHECKPOINT_BUSY_WORK_PERCENT > 0 && CHECKPOINT_BUSY_WORK_PERCENT <= 100);

/// The longest a save thread rests after one frame, milliseconds.
pub const CHECKPOINT_REST_MAX_MS: u64 = 40;

/// KV-cache values a save leases per hold of the cache's lock.
pub const CACHE_SCAN_ENTRIES: usize = 256;

/// Keys written behind a save's walk that it holds before reading them
/// again (and forgetting them): the bound on a save's extra memory per
/// partition being walked, besides one frame.
pub const CUT_BEHIND_KEYS_MAX: usize = 16_384;

/// Keys a save's walk of one partition reads again (written behind it)
/// before it may judge that the writes are outrunning it: below this a
/// partition's re-reads never end its walk early.
pub const CUT_REREAD_FLOOR_KEYS: u64 = CUT_BEHIND_KEYS_MAX as u64;

/// Checkpoints a periodic save keeps by default (`--checkpoint-keep`).
pub const CHECKPOINT_KEEP_DEFAULT: usize = 2;

/// The manifest's name in a checkpoint's directory.
pub const MANIFEST: &str = "MANIFEST";

/// How a checkpoint's directory under the checkpoint root begins; the
/// rest is its generation, zero-padded so that names sort by age.
const DIR_PREFIX: &str = "ckpt-";

/// What the manifest says it is.
const MANIFEST_FORMAT: &str = "fabrickv-checkpoint";

/// A checkpoint's table of contents, renamed into place last.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Manifest {
    /// Always `fabrickv-checkpoint`.
    pub format: String,
    /// The file format ([`FORMAT_VERSION`]).
    pub version: u32,
    /// The save's generation (its files carry it).
    pub generation: u64,
    /// When the save began and ended, in Unix milliseconds.
    pub created_unix_ms: u64,
    pub finished_unix_ms: u64,
    /// The saving server's kv partitions and embedding-pool shards.
    pub partitions: u32,
    pub shards: u32,
    /// Every file of the checkpoint.
    pub files: Vec<FileEntry>,
}

/// One file as the manifest lists it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct FileEntry {
    pub name: String,
    /// `kv`, `embedding` or `cache`.
    pub kind: String,
    pub index: u32,
    pub bytes: u64,
    pub frames: u64,
    pub records: u64,
    /// The CRC-32C chain of its frames (the trailer's).
    pub chain: u32,
}

impl Manifest {
    /// Records in every file: keys and rows, repeats of keys written
    /// during the save included.
    pub fn records(&self) -> u64 {
        self.files.iter().map(|f| f.records).sum()
    }

    /// Bytes of every file.
    pub fn bytes(&self) -> u64 {
        self.files.iter().map(|f| f.bytes).sum()
    }
}

/// Why a save or restore failed.
#[derive(Debug)]
pub enum CheckpointError {
    /// Another save is running.
    Busy,
    /// No checkpoint directory was configured or named.
    NoDir,
    /// A directory a client named is outside the checkpoint root.
    Outside(PathBuf),
    /// No checkpoint was found where one was asked for.
    Missing(PathBuf),
    /// Reading or writing a file failed.
    Io(PathBuf, std::io::Error),
    /// A file is not a good checkpoint file.
    Bad(PathBuf, Bad),
    /// A checkpoint that does not fit this server.
    Mismatch(PathBuf, String),
}

impl std::fmt::Display for CheckpointError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CheckpointError::Busy => write!(f, "a checkpoint save is already running"),
            CheckpointError::NoDir => write!(
                f,
                "no checkpoint directory: start the server with --checkpoint-dir DIR"
            ),
            CheckpointError::Outside(p) => write!(
                f,
                "{} is outside the server's checkpoint directory (--checkpoint-dir)",
                p.display()
            ),
            CheckpointError::Missing(p) => write!(f, "no checkpoint in {}", p.display()),
            CheckpointError::Io(p, e) => write!(f, "{}: {e}", p.display()),
            CheckpointError::Bad(p, b) => write!(f, "{}: {b}", p.display()),
            CheckpointError::Mismatch(p, why) => write!(f, "{}: {why}", p.display()),
        }
    }
}

impl std::error::Error for CheckpointError {}

impl CheckpointError {
    /// The stable code a native client is answered with.
    pub fn code(&self) -> fabrickv_types::ErrorCode {
        use fabrickv_types::ErrorCode;
        match self {
            CheckpointError::Busy => ErrorCode::SaveInProgress,
            CheckpointError::NoDir | CheckpointError::Outside(_) => ErrorCode::CheckpointRefused,
            CheckpointError::Missing(_) => ErrorCode::NotFound,
            CheckpointError::Io(..) => ErrorCode::StorageFailed,
            CheckpointError::Bad(..) | CheckpointError::Mismatch(..) => ErrorCode::Malformed,
        }
    }
}

fn io_at(p: &Path) -> impl FnOnce(std::io::Error) -> CheckpointError + '_ {
    move |e| CheckpointError::Io(p.to_path_buf(), e)
}

/// What a save wrote or a restore loaded.
#[derive(Debug, Clone)]
pub struct Summary {
    /// The checkpoint's directory.
    pub dir: PathBuf,
    pub manifest: Manifest,
    pub elapsed: Duration,
}

/// The outcome of the last save, for LASTSAVE and INFO.
#[derive(Debug, Default)]
struct SaveState {
    running: bool,
    /// Unix seconds of the last save that completed.
    last_ok_unix_s: u64,
    last_error: Option<String>,
    last_generation: u64,
    /// The last good save's directory.
    last_dir: Option<PathBuf>,
    /// Saves finished since start, well or not.
    finished: u64,
}

/// One engine partition a save walks or a restore fills.
#[derive(Debug, Clone, Copy)]
enum Job {
    Kv(usize),
    Shard(usize),
    /// The KV cache (one store, one file).
    Cache,
}

impl Job {
    fn kind(self) -> FileKind {
        match self {
            Job::Kv(_) => FileKind::Kv,
            Job::Shard(_) => FileKind::Embedding,
            Job::Cache => FileKind::Cache,
        }
    }

    fn index(self) -> usize {
        match self {
            Job::Kv(i) | Job::Shard(i) => i,
            Job::Cache => 0,
        }
    }

    fn file_name(self) -> String {
        match self {
            Job::Kv(i) => format!("kv-{i:05}.fkv"),
            Job::Shard(i) => format!("embedding-{i:05}.fkv"),
            Job::Cache => "cache-00000.fkv".into(),
        }
    }
}

/// Puts the calling thread in Linux's idle scheduling class
/// (`SCHED_IDLE`): it runs on what the workers leave, and a worker waking
/// takes the core at once (a lower nice value alone still lets a save
/// thread finish its slice first, which a worker answering one request
/// at a time pays on every request). Where that is refused, the thread
/// runs at nice [`CHECKPOINT_NICE`]; where that is too, as it is.
#[allow(unsafe_code)]
fn yield_to_serving() {
    let param = libc::sched_param { sched_priority: 0 };
    // SAFETY: sched_setscheduler only reads `param`, a live local, and
    // with pid 0 changes the calling thread alone.
    let rc = unsafe { libc::sched_setscheduler(0, libc::SCHED_IDLE, &param) };
    if rc == 0 {
        return;
    }
    let tid = rustix::thread::gettid();
    if let Err(e) = rustix::process::setpriority_process(Some(tid), CHECKPOINT_NICE) {
        tracing::debug!("checkpoint thread keeps its priority: {e}");
    }
}

/// Puts the calling thread back in the normal scheduling class; false
/// where that is refused (leaving the idle class needs `CAP_SYS_NICE`, or
/// an `RLIMIT_NICE` that allows nice 0) or it was not in the idle class.
#[allow(unsafe_code)]
fn leave_idle_class() -> bool {
    // SAFETY: sched_getscheduler only reads the calling thread's policy.
    if unsafe { libc::sched_getscheduler(0) } != libc::SCHED_IDLE {
        return false;
    }
    let param = libc::sched_param { sched_priority: 0 };
    // SAFETY: sched_setscheduler only reads `param`, a live local, and
    // with pid 0 changes the calling thread alone.
    unsafe { libc::sched_setscheduler(0, libc::SCHED_OTHER, &param) == 0 }
}

fn kind_name(k: FileKind) -> &'static str {
    match k {
        FileKind::Kv => "kv",
        FileKind::Embedding => "embedding",
        FileKind::Cache => "cache",
    }
}

/// A server's checkpoints: saves on request or on a timer, and the
/// restore at start.
pub struct Checkpoints {
    parts: Arc<Partitions>,
    ps: Arc<PsStore>,
    unix: UnixClock,
    /// Threads a save or restore uses (the server's workers).
    threads: usize,
    /// `--checkpoint-dir`: where saves go, and the only place a client
    /// may name.
    root: Option<PathBuf>,
    /// Checkpoints kept under the root after a save (0: all).
    keep: usize,
    /// The KV cache: restored when a checkpoint has it, saved only with
    /// `save_cache` (`--checkpoint-cache`).
    cache: Option<CacheStore>,
    save_cache: bool,
    state: Mutex<SaveState>,
}

impl std::fmt::Debug for Checkpoints {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Checkpoints")
            .field("root", &self.root)
            .field("keep", &self.keep)
            .finish()
    }
}

impl Checkpoints {
    /// Checkpoints of `parts` and `ps`, saved under `root` if set.
    pub fn new(
        parts: Arc<Partitions>,
        ps: Arc<PsStore>,
        unix: UnixClock,
        threads: usize,
        root: Option<PathBuf>,
        keep: usize,
    ) -> Checkpoints {
        Checkpoints {
            parts,
            ps,
            unix,
            threads: threads.max(1),
            root,
            keep,
            cache: None,
            save_cache: false,
            state: Mutex::new(SaveState::default()),
        }
    }

    /// Restores the KV cache `store` from checkpoints that hold it, and
    /// with `save` (`--checkpoint-cache`) saves it too.
    pub fn with_cache(mut self, store: CacheStore, save: bool) -> Checkpoints {
        self.cache = Some(store);
        self.save_cache = save;
        self
    }

    fn lock_state(&self) -> std::sync::MutexGuard<'_, SaveState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Unix seconds of the last completed save (0: none yet): LASTSAVE.
    pub fn last_save_unix_s(&self) -> u64 {
        self.lock_state().last_ok_unix_s
    }

    /// Whether a save is running now.
    pub fn saving(&self) -> bool {
        self.lock_state().running
    }

    /// Why the last save failed, if it did.
    pub fn last_error(&self) -> Option<String> {
        self.lock_state().last_error.clone()
    }

    /// The directory a save named `to` goes under: the checkpoint root,
    /// or a directory inside it (a relative `to` is taken from the root).
    /// A client may not make the server write anywhere else.
    pub fn resolve(&self, to: Option<&str>) -> Result<PathBuf, CheckpointError> {
        let root = self.root.as_ref().ok_or(CheckpointError::NoDir)?;
        let Some(to) = to.filter(|t| !t.is_empty()) else {
            return Ok(root.clone());
        };
        let p = Path::new(to);
        let p = if p.is_absolute() {
            p.to_path_buf()
        } else {
            root.join(p)
        };
        let inside = p
            .components()
            .all(|c| !matches!(c, std::path::Component::ParentDir))
            && p.starts_with(root);
        if !inside {
            return Err(CheckpointError::Outside(p));
        }
        Ok(p)
    }

    /// The status a CHECKPOINT reply carries.
    pub fn status(&self) -> fabrickv_wire::control::CheckpointStatus {
        let st = self.lock_state();
        fabrickv_wire::control::CheckpointStatus {
            finished: st.finished,
            last_ok_unix_s: st.last_ok_unix_s,
            generation: st.last_generation,
            saving: st.running,
            dir: st
                .last_dir
                .as_ref()
                .map(|d| d.display().to_string())
                .unwrap_or_default(),
            error: st.last_error.clone(),
        }
    }

    /// Marks a save as running, unless one already is.
    fn claim(&self) -> Result<(), CheckpointError> {
        let mut st = self.lock_state();
        if st.running {
            return Err(CheckpointError::Busy);
        }
        st.running = true;
        Ok(())
    }

    /// Saves a checkpoint under `root` now (SAVE, `checkpoint save`).
    pub fn save(&self, root: &Path) -> Result<Summary, CheckpointError> {
        self.claim()?;
        self.save_claimed(root)
    }

    /// Runs a save already claimed, and records how it went.
    fn save_claimed(&self, root: &Path) -> Result<Summary, CheckpointError> {
        let r = self.save_into(root);
        let mut st = self.lock_state();
        st.running = false;
        st.finished += 1;
        match &r {
            Ok(s) => {
                st.last_ok_unix_s = s.manifest.finished_unix_ms / 1000;
                st.last_error = None;
                st.last_generation = s.manifest.generation;
                st.last_dir = Some(s.dir.clone());
            }
            Err(e) => st.last_error = Some(e.to_string()),
        }
        r
    }

    /// Starts a save under `root` on a thread of its own (BGSAVE,
    /// `checkpoint save`). The save counts as running from before this
    /// returns, so a status read just after shows it.
    pub fn save_in_background(self: &Arc<Self>, root: PathBuf) -> Result<(), CheckpointError> {
        self.claim()?;
        let me = self.clone();
        let spawned = std::thread::Builder::new()
            .name("fkv-checkpoint".into())
            .spawn(move || match me.save_claimed(&root) {
                Ok(s) => tracing::info!(
                    dir = %s.dir.display(),
                    records = s.manifest.records(),
                    bytes = s.manifest.bytes(),
                    ms = s.elapsed.as_millis() as u64,
                    "checkpoint saved"
                ),
                Err(e) => tracing::error!("checkpoint save failed: {e}"),
            });
        if let Err(e) = spawned {
            self.lock_state().running = false;
            return Err(CheckpointError::Io(
                PathBuf::from("fkv-checkpoint thread"),
                e,
            ));
        }
        Ok(())
    }

    /// Saves under the root every `every` until `stop` is set.
    pub fn start_periodic(
        self: &Arc<Self>,
        every: Duration,
        stop: Arc<AtomicBool>,
    ) -> std::io::Result<std::thread::JoinHandle<()>> {
        let me = self.clone();
        std::thread::Builder::new()
            .name("fkv-checkpoint-timer".into())
            .spawn(move || {
                let Some(root) = me.root.clone() else {
                    return;
                };
                let mut next = Instant::now() + every;
                while !stop.load(Ordering::Acquire) {
                    if Instant::now() < next {
                        std::thread::sleep(Duration::from_millis(100));
                        continue;
                    }
                    match me.save(&root) {
                        Ok(s) => tracing::info!(
                            dir = %s.dir.display(),
                            records = s.manifest.records(),
                            ms = s.elapsed.as_millis() as u64,
                            "periodic checkpoint saved"
                        ),
                        Err(CheckpointError::Busy) => {}
                        Err(e) => tracing::error!("periodic checkpoint failed: {e}"),
                    }
                    next = Instant::now() + every;
                }
            })
    }

    fn save_into(&self, root: &Path) -> Result<Summary, CheckpointError> {
        let started = Instant::now();
        fs::create_dir_all(root).map_err(io_at(root))?;
        let created_unix_ms = unix_now_ms();
        let generation = created_unix_ms.max(self.lock_state().last_generation + 1);
        let dir = root.join(format!("{DIR_PREFIX}{generation:016}"));
        fs::create_dir(&dir).map_err(io_at(&dir))?;
        let partitions = self.parts.len();
        let shards = self.ps.built_shards();
        let cache = self.save_cache && self.cache.is_some();
        let jobs: Vec<Job> = (0..partitions)
            .map(Job::Kv)
            .chain((0..shards).map(Job::Shard))
            .chain(cache.then_some(Job::Cache))
            .collect();
        let next = AtomicUsize::new(0);
        let done: Mutex<Vec<Result<FileEntry, CheckpointError>>> = Mutex::new(Vec::new());
        std::thread::scope(|s| {
            for _ in 0..self.threads.min(jobs.len()) {
                s.spawn(|| {
                    yield_to_serving();
                    loop {
                        let i = next.fetch_add(1, Ordering::AcqRel);
                        let Some(&job) = jobs.get(i) else {
                            return;
                        };
                        let count = match job {
                            Job::Kv(_) => partitions,
                            Job::Shard(_) => shards,
                            Job::Cache => 1,
                        };
                        let head = FileHeader {
                            version: FORMAT_VERSION,
                            kind: job.kind(),
                            index: job.index() as u32,
                            count: count as u32,
                            generation,
                            created_unix_ms,
                        };
                        let r = self.write_file(&dir, job, &head);
                        let failed = r.is_err();
                        done.lock().unwrap_or_else(|p| p.into_inner()).push(r);
                        if failed {
                            // The others stop at their next file.
                            next.store(jobs.len(), Ordering::Release);
                            return;
                        }
                    }
                });
            }
        });
        let mut files = Vec::with_capacity(jobs.len());
        for r in done.into_inner().unwrap_or_else(|p| p.into_inner()) {
            match r {
                Ok(f) => files.push(f),
                Err(e) => {
                    let _ = fs::remove_dir_all(&dir);
                    return Err(e);
                }
            }
        }
        files.sort_by(|a, b| a.name.cmp(&b.name));
        let manifest = Manifest {
            format: MANIFEST_FORMAT.into(),
            version: FORMAT_VERSION,
            generation,
            created_unix_ms,
            finished_unix_ms: unix_now_ms(),
            partitions: partitions as u32,
            shards: shards as u32,
            files,
        };
        let tmp = dir.join(format!("{MANIFEST}.tmp"));
        let body = serde_json::to_vec_pretty(&manifest)
            .map_err(|e| CheckpointError::Io(tmp.clone(), std::io::Error::other(e)))?;
        let write = || -> std::io::Result<()> {
            let mut f = File::create(&tmp)?;
            f.write_all(&body)?;
            f.sync_all()?;
            fs::rename(&tmp, dir.join(MANIFEST))?;
            File::open(&dir)?.sync_all()?;
            File::open(root)?.sync_all()
        };
        if let Err(e) = write() {
            let _ = fs::remove_dir_all(&dir);
            return Err(CheckpointError::Io(tmp, e));
        }
        self.prune(root, &dir);
        Ok(Summary {
            dir,
            manifest,
            elapsed: started.elapsed(),
        })
    }

    /// Removes, under `root`, checkpoints older than the newest
    /// [`Checkpoints::keep`] complete ones, and unfinished saves older
    /// than `newest` (the one just made).
    fn prune(&self, root: &Path, newest: &Path) {
        if self.keep == 0 {
            return;
        }
        let mut dirs = checkpoint_dirs(root);
        dirs.sort();
        dirs.reverse();
        let mut complete = 0;
        for d in dirs {
            if d.as_path() > newest {
                continue;
            }
            let keep = d.join(MANIFEST).is_file() && {
                complete += 1;
                complete <= self.keep
            };
            if !keep {
                if let Err(e) = fs::remove_dir_all(&d) {
                    tracing::warn!("cannot remove old checkpoint {}: {e}", d.display());
                }
            }
        }
    }

    /// Writes `job`'s file into `dir`.
    fn write_file(
        &self,
        dir: &Path,
        job: Job,
        head: &FileHeader,
    ) -> Result<FileEntry, CheckpointError> {
        let name = job.file_name();
        let path = dir.join(&name);
        let mut out = FileOut::create(&path, head).map_err(io_at(&path))?;
        self.walk(job, head.count, &mut out).map_err(|e| match e {
            WalkError::Io(e) => CheckpointError::Io(path.clone(), e),
            WalkError::Cleared => CheckpointError::Mismatch(
                path.clone(),
                "the embedding pool was cleared during the save; save again".into(),
            ),
        })?;
        let trailer = out.trailer;
        out.write(&trailer.encode()).map_err(io_at(&path))?;
        let bytes = out.bytes;
        out.finish().map_err(io_at(&path))?;
        Ok(FileEntry {
            name,
            kind: kind_name(job.kind()).into(),
            index: head.index,
            bytes,
            frames: trailer.frames,
            records: trailer.records,
            chain: trailer.chain,
        })
    }

    /// Runs `f` on `job`'s partition under its lock.
    fn with_part<T>(&self, job: Job, f: impl FnOnce(&mut Partition) -> T) -> Option<T> {
        match job {
            Job::Kv(i) => Some(f(&mut self.parts.lock_background(i))),
            Job::Shard(i) => self.ps.with_shard(i, f),
            Job::Cache => None,
        }
    }

    /// The walk of the KV cache (see the module's doc): every value
    /// committed by the cut and still there when the walk passes.
    fn walk_cache(&self, store: &CacheStore, out: &mut FileOut) -> std::io::Result<()> {
        let cut = store.last_generation();
        let mut buf = BatchBuf::default();
        let mut from = Some(0);
        let mut pace = Pace::start(&self.parts);
        while let Some(at) = from {
            let now = self.unix.clock().now_ms();
            let chunk = store.snapshot_from(at, CACHE_SCAN_ENTRIES, cut, now);
            for (key, lease) in chunk.values {
                let expire = match lease.expires_at_ms() {
                    0 => 0,
                    at => self.unix.to_unix(at),
                };
                buf.cache_entry(&key, &lease, expire);
                if buf.bytes() >= CHECKPOINT_FRAME_BYTES_TARGET {
                    pace.frame_built();
                    out.frame(&mut buf)?;
                    pace.frame_written(&self.parts);
                }
            }
            from = chunk.next;
        }
        out.frame(&mut buf)
    }

    /// The walk of one partition (see the module's doc): every key's
    /// state at the cut, in frames written to `out`.
    fn walk(&self, job: Job, count: u32, out: &mut FileOut) -> Result<(), WalkError> {
        if let (Job::Cache, Some(store)) = (job, &self.cache) {
            return self.walk_cache(store, out).map_err(WalkError::Io);
        }
        let mut w = Walk::new();
        let mut pace = Pace::start(&self.parts);
        self.with_part(job, |p| p.begin_cut());
        let r = loop {
            let finished = self
                .with_part(job, |p| self.walk_step(job, count, p, &mut w))
                .unwrap_or(true);
            if w.cleared {
                break Err(WalkError::Cleared);
            }
            if finished || w.out.buf.bytes() >= CHECKPOINT_FRAME_BYTES_TARGET {
                pace.frame_built();
                if let Err(e) = out.frame(&mut w.out.buf) {
                    break Err(WalkError::Io(e));
                }
                pace.frame_written(&self.parts);
            }
            if finished {
                break Ok(());
            }
        };
        if r.is_err() {
            self.with_part(job, |p| p.end_cut());
        }
        r
    }

    /// One hold of the partition's lock: the keys written since the last
    /// step, then the next chunk of the index, or (at the end) the keys
    /// written behind the walk and the cut. True once the cut is taken.
    fn walk_step(&self, job: Job, count: u32, p: &mut Partition, w: &mut Walk) -> bool {
        let now = self.unix.clock().now_ms();
        if let Some(noted) = p.take_cut(std::mem::take(&mut w.spare)) {
            if noted.flushed {
                // Every key written before the flush is gone, those in
                // the file included.
                w.behind.clear();
                match job {
                    Job::Kv(i) => w.out.buf.flush_partition(count, i as u32),
                    Job::Shard(_) | Job::Cache => w.cleared = true,
                }
            }
            for k in noted.iter() {
                let hash = match job {
                    Job::Kv(_) => Some(KeyHash::of(k)),
                    Job::Shard(_) => PsStore::item_hash_of(k),
                    Job::Cache => None,
                };
                let passed = match (w.cursor, hash) {
                    (Some(c), Some(h)) => p.main_bucket_of(h) < c,
                    _ => true,
                };
                if passed && !w.behind.contains(k) {
                    w.behind.insert(k.to_vec());
                }
            }
            w.spare = noted.keys;
        }
        // A request waiting for a kv partition ends the hold early (the
        // embedding pool's shards have locks of their own, not counted).
        let wanted = || match job {
            Job::Kv(i) => self.parts.wanted(i),
            Job::Shard(_) | Job::Cache => false,
        };
        let Some(c) = w.cursor else {
            w.finishing += 1;
            let last = w.finishing > CUT_FINISH_HOLDS_MAX;
            let chunk = if last { usize::MAX } else { CUT_SCAN_ENTRIES };
            self.emit_behind(job, p, now, w, chunk, &|| !last && wanted());
            if !w.behind.is_empty() {
                return false;
            }
            p.end_cut();
            return true;
        };
        if w.losing() {
            // Writes behind the walk outrun it (a save starved of its
            // cores, or a write rate past what it reads): every key read
            // again is one more record in the file, with no end in sight.
            // The rest of the partition is read in this hold, so the file
            // stays within about twice the partition's data.
            return self.finish_in_one_hold(job, p, now, w, c);
        }
        if w.behind.len() >= CUT_BEHIND_KEYS_MAX {
            w.draining = true;
        }
        if w.draining {
            // Read again a chunk per hold until none is left.
            self.emit_behind(job, p, now, w, CUT_SCAN_ENTRIES, &wanted);
            w.draining = !w.behind.is_empty();
            return false;
        }
        let mut budget = ScanBudget {
            entries: CUT_SCAN_ENTRIES,
            words: CUT_SCAN_ENTRIES,
        };
        let mut read = 0usize;
        let out = &mut w.out;
        w.cursor = p.scan_items_from(c, now, &mut budget, &mut |item| {
            self.emit_item(job, item, out);
            read += 1;
            read < CUT_YIELD_AFTER_ENTRIES || !wanted()
        });
        w.walked += read as u64;
        false
    }

    /// Reads the rest of the partition from bucket `from`, then every key
    /// written behind the walk, in this one hold, and takes the cut: the
    /// bound on a save's file when writes outrun its walk. Requests on the
    /// partition wait out the read (its remaining data, once per save);
    /// the thread leaves the idle scheduling class for it where it may,
    /// so that busy cores do not stretch a hold others wait on.
    fn finish_in_one_hold(
        &self,
        job: Job,
        p: &mut Partition,
        now: u64,
        w: &mut Walk,
        from: usize,
    ) -> bool {
        let began = Instant::now();
        let normal = leave_idle_class();
        let mut budget = ScanBudget {
            entries: usize::MAX,
            words: usize::MAX,
        };
        let out = &mut w.out;
        let mut read = 0u64;
        let mut cursor = Some(from);
        while let Some(c) = cursor {
            cursor = p.scan_items_from(c, now, &mut budget, &mut |item| {
                self.emit_item(job, item, out);
                read += 1;
                true
            });
        }
        w.walked += read;
        w.cursor = None;
        self.emit_behind(job, p, now, w, usize::MAX, &|| false);
        p.end_cut();
        if normal {
            yield_to_serving();
        }
        tracing::warn!(
            partition = ?job,
            read_again = w.reread,
            walked = w.walked,
            held_ms = began.elapsed().as_millis() as u64,
            "a save's walk was outrun by writes behind it; the rest of the partition was read in one hold"
        );
        true
    }

    /// Reads again up to `chunk` of the keys written behind the walk
    /// (fewer once `stop` says a request waits, after
    /// [`CUT_YIELD_AFTER_ENTRIES`]) and forgets them.
    fn emit_behind(
        &self,
        job: Job,
        p: &mut Partition,
        now: u64,
        w: &mut Walk,
        chunk: usize,
        stop: &dyn Fn() -> bool,
    ) {
        let mut read = 0usize;
        let out = &mut w.out;
        w.behind.retain(|k| {
            if read >= chunk || (read >= CUT_YIELD_AFTER_ENTRIES && stop()) {
                return true;
            }
            read += 1;
            self.emit(job, p, k, now, out);
            false
        });
        w.reread += read as u64;
    }

    /// Appends the state of the key stored under `k` in `p` to the frame.
    fn emit(&self, job: Job, p: &mut Partition, k: &[u8], now: u64, out: &mut Frame) {
        match job {
            Job::Kv(_) => {
                let state = read_state(p, k, now, &self.unix);
                append_state(&mut out.buf, k, &state);
            }
            Job::Shard(_) => {
                let Some((table, key, state)) = PsStore::row_at(p, k, now) else {
                    return;
                };
                let row = match state {
                    RowState::Present { value, expire_ms } => Some((value, expire_ms)),
                    RowState::Absent => None,
                };
                self.emit_row(table, key, row, out);
            }
            // The cache has a walk of its own (`walk_cache`).
            Job::Cache => {}
        }
    }

    /// Appends `item`, found by the walk, to the frame: its state as
    /// [`Checkpoints::emit`] would read it, without looking it up again.
    fn emit_item(&self, job: Job, item: ScanItem<'_>, out: &mut Frame) {
        let expire = self.unix.to_unix(item.expire_at_ms);
        match job {
            Job::Kv(_) => match item.value {
                ValueRef::Inline(value) => out.buf.put(
                    item.key,
                    value,
                    expire,
                    item.meta.map(|m| (m.cas, m.client_flags)),
                ),
                ValueRef::Large(value) => out.buf.put(item.key, value.as_slice(), expire, None),
            },
            Job::Shard(_) => {
                if let Some((table, key)) = PsStore::row_of_item_key(item.key) {
                    let value = item.value.bytes();
                    self.emit_row(table, key, Some((value, item.expire_at_ms)), out);
                }
            }
            Job::Cache => {}
        }
    }

    /// Appends embedding row `key` of table `table` to the frame: present
    /// with `(value, engine expiry)` or absent; the table's shape first
    /// if this file has not given it.
    fn emit_row(&self, table: u32, key: u64, row: Option<(&[u8], u64)>, out: &mut Frame) {
        if table & PS_MARKER_TABLE_BIT == 0 && !out.described.contains(&table) {
            // A table dropped since has no shape: its rows go too.
            let Some(spec) = self.ps.spec_of(table) else {
                return;
            };
            out.buf.ps_table(table, &spec);
            out.described.insert(table);
        }
        match row {
            Some((value, expire_ms)) => {
                out.buf
                    .ps_row(table, key, value, self.unix.to_unix(expire_ms))
            }
            None => out.buf.ps_del(table, key),
        }
    }

    /// Loads the checkpoint at `from` before the server serves: `from` is
    /// a checkpoint's directory, or a checkpoint root whose newest good
    /// checkpoint is taken. With `required`, finding none is an error (and
    /// so is a bad newest one); without (`--checkpoint-dir` at start), a
    /// root with none starts empty and bad ones are passed over, each
    /// named in a warning.
    pub fn restore(&self, from: &Path, required: bool) -> Result<Option<Summary>, CheckpointError> {
        let started = Instant::now();
        let candidates = if from.join(MANIFEST).is_file() {
            vec![from.to_path_buf()]
        } else {
            let mut d: Vec<PathBuf> = checkpoint_dirs(from)
                .into_iter()
                .filter(|d| d.join(MANIFEST).is_file())
                .collect();
            d.sort();
            d.reverse();
            d
        };
        if candidates.is_empty() {
            return if required {
                Err(CheckpointError::Missing(from.to_path_buf()))
            } else {
                Ok(None)
            };
        }
        for dir in candidates {
            let manifest = match self.check(&dir) {
                Ok(m) => m,
                Err(e) if !required => {
                    tracing::warn!("checkpoint {} passed over: {e}", dir.display());
                    continue;
                }
                Err(e) => return Err(e),
            };
            self.load(&dir, &manifest)?;
            self.lock_state().last_generation = manifest.generation;
            return Ok(Some(Summary {
                dir,
                manifest,
                elapsed: started.elapsed(),
            }));
        }
        Ok(None)
    }

    /// Reads the manifest of `dir` and checks every file's length,
    /// header and trailer against it, before anything is loaded.
    fn check(&self, dir: &Path) -> Result<Manifest, CheckpointError> {
        let mpath = dir.join(MANIFEST);
        let body = fs::read(&mpath).map_err(io_at(&mpath))?;
        let manifest: Manifest = serde_json::from_slice(&body).map_err(|e| {
            CheckpointError::Mismatch(mpath.clone(), format!("not a manifest: {e}"))
        })?;
        if manifest.format != MANIFEST_FORMAT {
            return Err(CheckpointError::Bad(mpath, Bad::Foreign));
        }
        if manifest.version > FORMAT_VERSION {
            return Err(CheckpointError::Bad(
                mpath,
                Bad::NewerVersion(manifest.version),
            ));
        }
        if manifest.partitions as usize != self.parts.len() {
            return Err(CheckpointError::Mismatch(
                mpath,
                format!(
                    "saved with {} partitions, this server has {} (--partitions must match)",
                    manifest.partitions,
                    self.parts.len()
                ),
            ));
        }
        for f in &manifest.files {
            let path = dir.join(&f.name);
            if f.name.contains('/') || f.name.contains("..") {
                return Err(CheckpointError::Bad(
                    mpath,
                    Bad::Corrupt("a file name leaves the directory"),
                ));
            }
            let mut file = File::open(&path).map_err(io_at(&path))?;
            let len = file.metadata().map_err(io_at(&path))?.len();
            if len != f.bytes {
                return Err(CheckpointError::Bad(
                    path,
                    Bad::Corrupt(if len < f.bytes {
                        "cut short"
                    } else {
                        "longer than saved"
                    }),
                ));
            }
            if len < (HEADER_BYTES + TRAILER_BYTES) as u64 {
                return Err(CheckpointError::Bad(path, Bad::Corrupt("cut short")));
            }
            let mut head = [0u8; HEADER_BYTES];
            file.read_exact(&mut head).map_err(io_at(&path))?;
            let h = FileHeader::decode(&head).map_err(|b| CheckpointError::Bad(path.clone(), b))?;
            let expected_count = match h.kind {
                FileKind::Kv => manifest.partitions,
                FileKind::Embedding => manifest.shards,
                FileKind::Cache => 1,
            };
            if h.generation != manifest.generation
                || kind_name(h.kind) != f.kind
                || h.index != f.index
                || h.count != expected_count
            {
                return Err(CheckpointError::Bad(
                    path,
                    Bad::Corrupt(
                        "the header does not match the manifest (a file of another checkpoint?)",
                    ),
                ));
            }
            let mut tail = [0u8; TRAILER_BYTES];
            file.seek(SeekFrom::End(-(TRAILER_BYTES as i64)))
                .and_then(|_| file.read_exact(&mut tail))
                .map_err(io_at(&path))?;
            let t = Trailer::decode(&tail, f.chain)
                .map_err(|b| CheckpointError::Bad(path.clone(), b))?;
            if t.frames != f.frames || t.records != f.records {
                return Err(CheckpointError::Bad(
                    path,
                    Bad::Corrupt("trailer counts differ from the manifest"),
                ));
            }
        }
        Ok(manifest)
    }

    /// Loads every file of a checked checkpoint, in parallel.
    fn load(&self, dir: &Path, manifest: &Manifest) -> Result<(), CheckpointError> {
        let next = AtomicUsize::new(0);
        let failed: Mutex<Option<CheckpointError>> = Mutex::new(None);
        std::thread::scope(|s| {
            for _ in 0..self.threads.min(manifest.files.len()) {
                s.spawn(|| loop {
                    let i = next.fetch_add(1, Ordering::AcqRel);
                    let Some(f) = manifest.files.get(i) else {
                        return;
                    };
                    if let Err(e) = self.load_file(&dir.join(&f.name), f, manifest.generation) {
                        next.store(manifest.files.len(), Ordering::Release);
                        failed
                            .lock()
                            .unwrap_or_else(|p| p.into_inner())
                            .get_or_insert(e);
                        return;
                    }
                });
            }
        });
        match failed.into_inner().unwrap_or_else(|p| p.into_inner()) {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    fn load_file(
        &self,
        path: &Path,
        f: &FileEntry,
        generation: u64,
    ) -> Result<(), CheckpointError> {
        let bad = |b: Bad| CheckpointError::Bad(path.to_path_buf(), b);
        // Read once, front to back, a few blocks ahead of the parse.
        let mut r = direct::DirectReader::open(path).map_err(io_at(path))?;
        let mut head = [0u8; HEADER_BYTES];
        r.read_exact(&mut head).map_err(io_at(path))?;
        let h = FileHeader::decode(&head).map_err(bad)?;
        let mut msg: Vec<u8> = Vec::new();
        let (mut chain, mut frames, mut records) = (0u32, 0u64, 0u64);
        let mut tables = TableIds::new();
        loop {
            let mut word = [0u8; 4];
            r.read_exact(&mut word)
                .map_err(|_| bad(Bad::Corrupt("cut short")))?;
            match format::next(word).map_err(bad)? {
                Next::Trailer => {
                    let mut tail = [0u8; TRAILER_BYTES];
                    tail[..4].copy_from_slice(&word);
                    r.read_exact(&mut tail[4..])
                        .map_err(|_| bad(Bad::Corrupt("cut short")))?;
                    let t = Trailer::decode(&tail, chain).map_err(bad)?;
                    if t.frames != frames || t.records != records || chain != f.chain {
                        return Err(bad(Bad::Corrupt("trailer counts do not match the frames")));
                    }
                    return Ok(());
                }
                Next::Frame(len) => {
                    msg.clear();
                    msg.extend_from_slice(&word);
                    msg.resize(4 + len, 0);
                    let mut crc = [0u8; 4];
                    r.read_exact(&mut msg[4..])
                        .and_then(|_| r.read_exact(&mut crc))
                        .map_err(|_| bad(Bad::Corrupt("cut short")))?;
                    let (recs, sum) = format::frame(&msg, crc, generation, frames).map_err(bad)?;
                    chain = format::chain_next(chain, sum);
                    frames += 1;
                    records += recs.len() as u64;
                    let now = self.unix.clock().now_ms();
                    match h.kind {
                        FileKind::Kv => self.apply_kv(h.index as usize, recs.iter(), now),
                        FileKind::Cache => self
                            .apply_cache(recs.iter(), now)
                            .map_err(|why| CheckpointError::Mismatch(path.to_path_buf(), why))?,
                        FileKind::Embedding => {
                            for rec in recs.iter() {
                                store_table_record(
                                    &self.ps,
                                    &self.unix,
                                    &rec,
                                    &mut tables,
                                    now,
                                    &format_args!("restore of {}", path.display()),
                                );
                            }
                        }
                    }
                }
            }
        }
    }

    /// Stores a cache file's frame. A value already expired is left out;
    /// a cache too small for the rest evicts as it would serving, and one
    /// that does not evict refuses the start.
    fn apply_cache<'a>(
        &self,
        recs: impl Iterator<Item = Record<'a>>,
        now: u64,
    ) -> Result<(), String> {
        let Some(store) = &self.cache else {
            return Err("the checkpoint holds a KV cache and this server has none".into());
        };
        for rec in recs {
            let Record::CacheEntry {
                key,
                value,
                expire_unix_ms,
            } = rec
            else {
                continue;
            };
            let ttl_ms = match expire_unix_ms {
                0 => 0,
                at => match self.unix.to_engine(at).checked_sub(now) {
                    Some(left) if left > 0 => left,
                    _ => continue,
                },
            };
            store
                .put(key, value, ttl_ms, now)
                .map_err(|e| format!("the KV cache cannot take its saved values: {e}"))?;
        }
        Ok(())
    }

    /// Applies a kv file's frame: its partition's lock held once for the
    /// keys that belong to it (all of them, with an equal partition count).
    fn apply_kv<'a>(&self, index: usize, recs: impl Iterator<Item = Record<'a>>, now: u64) {
        let mut part = self.parts.lock(index);
        for rec in recs {
            match &rec {
                Record::Put { key, .. } | Record::Del { key } => {
                    let p = self.parts.index_of(KeyHash::of(key));
                    if p == index {
                        store_key_record(&mut part, &rec, &self.unix, now);
                    } else {
                        store_key_record(&mut self.parts.lock(p), &rec, &self.unix, now);
                    }
                }
                Record::FlushPartition { .. } => {
                    part.flush(now);
                }
                _ => {}
            }
        }
    }
}

/// How a save thread gives way to a busy server. The idle scheduling
/// class alone is not enough here: an idle-class CPU hog cost a
/// one-connection writer two thirds of its rate on this 2-vCPU VM, and a
/// direct-I/O writer of the save's size about a third
/// (`docs/benchmarks.md`): the host sees busy vCPUs and device work
/// whatever the guest's priorities say. So a save thread measures each
/// frame: the CPU time it took to build and the time to write it. When
/// the server served requests meanwhile ([`Partitions::requests_seen`])
/// or the thread got less than [`CHECKPOINT_CONTENDED_BELOW_CPU_PERCENT`]
/// of the time while it built the frame, it rests long enough that it
/// works [`CHECKPOINT_BUSY_WORK_PERCENT`] of the time (each rest at most
/// [`CHECKPOINT_REST_MAX_MS`], see [`rest_after`]); alone it never rests.
struct Pace {
    /// When the current phase (building, then writing) began.
    wall: Instant,
    /// The thread's CPU time then.
    cpu: Duration,
    /// The server's requests seen when the frame's building began.
    requests: u64,
    /// CPU time the frame took to build.
    built_cpu: Duration,
    /// Whether the thread was held off the core while building.
    preempted: bool,
}

impl Pace {
    fn start(parts: &Partitions) -> Pace {
        Pace {
            wall: Instant::now(),
            cpu: thread_cpu_time(),
            requests: parts.requests_seen(),
            built_cpu: Duration::ZERO,
            preempted: false,
        }
    }

    /// Once a frame is built, before it is written: what building took.
    /// Time spent waiting (for the core, or for a partition a request
    /// held) is not the save's work.
    fn frame_built(&mut self) {
        let wall = self.wall.elapsed();
        self.built_cpu = thread_cpu_time().saturating_sub(self.cpu);
        self.preempted = self.built_cpu.as_nanos() * 100
            < wall.as_nanos() * CHECKPOINT_CONTENDED_BELOW_CPU_PERCENT;
        self.wall = Instant::now();
    }

    /// Once the frame is written: rests if the server served or the core
    /// was busy, then measures the next frame.
    fn frame_written(&mut self, parts: &Partitions) {
        let worked = self.built_cpu + self.wall.elapsed();
        let busy = self.preempted || parts.requests_seen() != self.requests;
        let rest = rest_after(worked, busy);
        if !rest.is_zero() {
            std::thread::sleep(rest);
        }
        *self = Pace::start(parts);
    }
}

/// How long a save thread rests after a frame that took `worked`: none
/// when the server is idle (`busy` false), else enough to keep the save
/// to [`CHECKPOINT_BUSY_WORK_PERCENT`] of the time, at most
/// [`CHECKPOINT_REST_MAX_MS`].
fn rest_after(worked: Duration, busy: bool) -> Duration {
    if !busy {
        return Duration::ZERO;
    }
    let rest = worked * (100 - CHECKPOINT_BUSY_WORK_PERCENT) / CHECKPOINT_BUSY_WORK_PERCENT;
    rest.min(Duration::from_millis(CHECKPOINT_REST_MAX_MS))
}

/// CPU time the calling thread has used.
fn thread_cpu_time() -> Duration {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ThreadCPUTime);
    Duration::new(t.tv_sec as u64, t.tv_nsec as u32)
}

/// The state of one partition's walk.
struct Walk {
    /// The next main bucket to read; `None` once every bucket was read.
    cursor: Option<usize>,
    /// Keys written behind the cursor since they were last read.
    behind: HashSet<Vec<u8>>,
    /// The notes' buffer, handed back and forth.
    spare: Vec<u8>,
    /// The frame being gathered.
    out: Frame,
    /// The keys behind are being read again, a chunk per hold, since
    /// they reached [`CUT_BEHIND_KEYS_MAX`].
    draining: bool,
    /// Holds taken since the cursor reached the end.
    finishing: u32,
    /// The partition was flushed where a flush cannot be recorded.
    cleared: bool,
    /// Records of the index walk so far, and of keys read again.
    walked: u64,
    reread: u64,
}

/// The frame a walk gathers, and what it needs to describe rows.
#[derive(Default)]
struct Frame {
    /// The records gathered.
    buf: BatchBuf,
    /// Tables whose shape this file gave already.
    described: HashSet<u32>,
}

impl Walk {
    /// A walk from the first bucket, nothing gathered yet.
    fn new() -> Walk {
        Walk {
            cursor: Some(0),
            behind: HashSet::new(),
            spare: Vec::new(),
            out: Frame::default(),
            draining: false,
            finishing: 0,
            cleared: false,
            walked: 0,
            reread: 0,
        }
    }

    /// Whether writes behind the walk outrun it: it has read keys again
    /// more often than it has read the index (and past
    /// [`CUT_REREAD_FLOOR_KEYS`]), so its file grows faster than it walks.
    fn losing(&self) -> bool {
        self.reread > self.walked.max(CUT_REREAD_FLOOR_KEYS)
    }
}

enum WalkError {
    Io(std::io::Error),
    Cleared,
}

/// A file being written: its frames' running counts.
struct FileOut {
    file: direct::DirectWriter,
    generation: u64,
    trailer: Trailer,
    bytes: u64,
}

impl FileOut {
    /// Creates `path` and writes `head`, the file's header.
    fn create(path: &Path, head: &FileHeader) -> std::io::Result<FileOut> {
        let mut out = FileOut {
            file: direct::DirectWriter::create(path)?,
            generation: head.generation,
            trailer: Trailer::default(),
            bytes: 0,
        };
        out.write(&head.encode())?;
        Ok(out)
    }

    fn write(&mut self, b: &[u8]) -> std::io::Result<()> {
        self.file.write_all(b)?;
        self.bytes += b.len() as u64;
        Ok(())
    }

    /// Writes the rest and syncs the file.
    fn finish(self) -> std::io::Result<()> {
        self.file.finish().map(drop)
    }

    /// Writes what `buf` gathered as the next frame (nothing if empty).
    fn frame(&mut self, buf: &mut BatchBuf) -> std::io::Result<()> {
        if buf.is_empty() {
            return Ok(());
        }
        let records = buf.len();
        let msg = buf.seal(self.generation, self.trailer.frames);
        let crc = crc32c(&msg);
        self.write(&msg)?;
        self.write(&crc.to_le_bytes())?;
        self.trailer.chain = format::chain_next(self.trailer.chain, crc);
        self.trailer.frames += 1;
        self.trailer.records += u64::from(records);
        Ok(())
    }
}

/// The checkpoint directories under `root` (complete or not).
fn checkpoint_dirs(root: &Path) -> Vec<PathBuf> {
    let Ok(rd) = fs::read_dir(root) else {
        return Vec::new();
    };
    rd.filter_map(|e| e.ok())
        .filter(|e| {
            e.file_name()
                .to_str()
                .is_some_and(|n| n.starts_with(DIR_PREFIX))
                && e.path().is_dir()
        })
        .map(|e| e.path())
        .collect()
}

fn unix_now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

mod direct;

#[cfg(test)]
mod tests;
