//! Saves and restores over real partitions and files: the cut a walk
//! takes while keys change on both sides of it, and every kind of bad
//! checkpoint refused by name.

use std::collections::BTreeMap;

use fabrickv_engine::{
    ItemMeta, LargeValue, Mode as EngineMode, PartitionConfig, PoolOptions, PutCond,
    LARGE_VALUE_BYTES_MIN,
};
use fabrickv_wire::ps::TableSpec;

use super::*;
use crate::ps::PsConfig;
use crate::replication::State;
use crate::service::Clock;

const PARTITIONS: usize = 3;

/// A key's value, expiry (Unix ms, 0: none) and memcache meta.
type KeyState = (Vec<u8>, u64, Option<(u64, u32)>);

struct Server {
    parts: Arc<Partitions>,
    ps: Arc<PsStore>,
    unix: UnixClock,
}

fn server() -> Server {
    let parts = (0..PARTITIONS)
        .map(|_| {
            let mut p = Partition::new(&PartitionConfig {
                mode: EngineMode::Store,
                pool_bytes: 8 << 20,
                index_buckets: None,
                memory: PoolOptions::default(),
            })
            .expect("partition");
            p.set_large_bytes_max(64 << 20);
            p
        })
        .collect();
    let ps = PsStore::new(
        PsConfig {
            pool_bytes: 8 << 20,
            pool: PoolOptions::default(),
            tables: Vec::new(),
        },
        2,
    );
    Server {
        parts: Arc::new(Partitions::new(parts)),
        ps: Arc::new(ps),
        unix: UnixClock::new(Clock::new()),
    }
}

impl Server {
    fn checkpoints(&self, root: Option<&Path>, keep: usize) -> Checkpoints {
        Checkpoints::new(
            self.parts.clone(),
            self.ps.clone(),
            self.unix,
            2,
            root.map(Path::to_path_buf),
            keep,
        )
    }

    fn now(&self) -> u64 {
        self.unix.clock().now_ms()
    }

    fn put(&self, key: &[u8], value: &[u8], ttl_ms: u64) {
        let h = KeyHash::of(key);
        let now = self.now();
        let expire = if ttl_ms == 0 { 0 } else { now + ttl_ms };
        let r = self.parts.lock(self.parts.index_of(h)).put(
            h,
            key,
            value,
            expire,
            PutCond::Always,
            now,
        );
        assert!(matches!(r, fabrickv_engine::PutResult::Stored), "{r:?}");
    }

    fn delete(&self, key: &[u8]) {
        let h = KeyHash::of(key);
        let now = self.now();
        let _ = self.parts.lock(self.parts.index_of(h)).delete(h, key, now);
    }

    /// Every key: its value, expiry (Unix ms, 0: none) and memcache meta.
    fn keys(&self) -> BTreeMap<Vec<u8>, KeyState> {
        let now = self.now();
        let mut out = BTreeMap::new();
        for i in 0..self.parts.len() {
            let mut p = self.parts.lock(i);
            for k in item_keys(&mut p, now) {
                let v = match read_state(&p, &k, now, &self.unix) {
                    State::Put {
                        value,
                        expire_unix_ms,
                        meta,
                    } => (value, expire_unix_ms, meta),
                    State::Large {
                        value,
                        expire_unix_ms,
                    } => (value.as_slice().to_vec(), expire_unix_ms, None),
                    State::Absent => continue,
                };
                out.insert(k, v);
            }
        }
        out
    }

    /// Every embedding row: (table name, key) to its stored bytes.
    fn rows(&self) -> BTreeMap<(String, u64), Vec<u8>> {
        let now = self.now();
        let mut out = BTreeMap::new();
        for s in 0..self.ps.built_shards() {
            self.ps.with_shard(s, |p| {
                for k in item_keys(p, now) {
                    if let Some((t, key, RowState::Present { value, .. })) =
                        PsStore::row_at(p, &k, now)
                    {
                        let name = self
                            .ps
                            .spec_of(t)
                            .map_or_else(|| format!("#{t}"), |s| s.name.clone());
                        out.insert((name, key), value.to_vec());
                    }
                }
            });
        }
        out
    }
}

/// Every item key stored in `p` and live at `now`.
fn item_keys(p: &mut Partition, now: u64) -> Vec<Vec<u8>> {
    let mut keys = Vec::new();
    let mut at = Some(0);
    while let Some(b) = at {
        let mut budget = ScanBudget {
            entries: usize::MAX,
            words: usize::MAX,
        };
        at = p.scan_from(b, now, &mut budget, &mut |k, _, _| {
            keys.push(k.to_vec());
            true
        });
    }
    keys
}

#[test]
fn a_save_restores_values_ttls_meta_large_values_and_tables() {
    let dir = tempfile::tempdir().expect("tempdir");
    let a = server();
    for i in 0..5_000u32 {
        a.put(format!("key:{i}").as_bytes(), &i.to_le_bytes().repeat(8), 0);
    }
    a.put(b"ttl", b"expires later", 3_600_000);
    let big = vec![7u8; LARGE_VALUE_BYTES_MIN + 12_345];
    {
        let h = KeyHash::of(b"large");
        let now = a.now();
        let mut p = a.parts.lock(a.parts.index_of(h));
        let r = p.put_large(
            h,
            b"large",
            LargeValue::copy_from(&big),
            0,
            PutCond::Always,
            now,
        );
        assert!(matches!(r, fabrickv_engine::PutResult::Stored), "{r:?}");
        let h = KeyHash::of(b"mc");
        let mut p2 = if a.parts.index_of(h) == a.parts.index_of(KeyHash::of(b"large")) {
            p
        } else {
            drop(p);
            a.parts.lock(a.parts.index_of(h))
        };
        let r = p2.put_with_meta(
            h,
            b"mc",
            b"memcached",
            0,
            PutCond::Always,
            now,
            ItemMeta {
                cas: 42,
                client_flags: 9,
            },
        );
        assert!(matches!(r, fabrickv_engine::PutResult::Stored), "{r:?}");
    }
    let t = a.ps.create(&TableSpec::new("emb", 4)).expect("table").id;
    let now = a.now();
    for k in 0..2_000u64 {
        let row: Vec<u8> = (0..4)
            .flat_map(|j| ((k * 4 + j) as f32).to_le_bytes())
            .collect();
        a.ps.apply_row(t, k, Some(&row), 0, now).expect("row");
    }
    let saved = a
        .checkpoints(Some(dir.path()), 2)
        .save(dir.path())
        .expect("save");
    assert_eq!(saved.manifest.partitions as usize, PARTITIONS);
    assert!(saved.manifest.shards > 0);
    assert!(saved.dir.join(MANIFEST).is_file());

    let b = server();
    let got = b
        .checkpoints(None, 0)
        .restore(dir.path(), true)
        .expect("restore")
        .expect("a checkpoint");
    assert_eq!(got.manifest.generation, saved.manifest.generation);
    let (ka, kb) = (a.keys(), b.keys());
    for k in [&b"ttl"[..], b"large", b"mc"] {
        assert!(
            ka.contains_key(k),
            "{:?} missing",
            String::from_utf8_lossy(k)
        );
    }
    assert_eq!(ka.len(), 5_003);
    assert_eq!(ka, kb, "every key, TTL and meta back");
    assert_eq!(kb[&b"large"[..]].0, big);
    assert_eq!(kb[&b"mc"[..]].2, Some((42, 9)));
    assert!(kb[&b"ttl"[..]].1 > 0, "the TTL is kept as a time");
    assert_eq!(a.rows().len(), 2_000);
    assert_eq!(a.rows(), b.rows(), "every row back, under its table's name");
}

fn cache_store() -> CacheStore {
    CacheStore::new(fabrickv_cache::CacheConfig {
        pool_bytes: 8 << 20,
        ..fabrickv_cache::CacheConfig::default()
    })
    .expect("cache")
}

#[test]
fn the_kv_cache_is_saved_only_when_asked_and_restored_with_its_ttls() {
    let dir = tempfile::tempdir().expect("tempdir");
    let a = server();
    let cache = cache_store();
    let now = a.now();
    let long_key = vec![b'k'; fabrickv_types::limits::CACHE_KEY_BYTES_MAX];
    for i in 0..300u32 {
        let block = vec![i as u8; 4096 + i as usize];
        cache
            .put(format!("block:{i}").as_bytes(), &block, 0, now)
            .expect("put");
    }
    cache
        .put(&long_key, b"long key", 3_600_000, now)
        .expect("put");
    // Without --checkpoint-cache the file is not written.
    let plain = a
        .checkpoints(Some(dir.path()), 0)
        .with_cache(cache.clone(), false);
    let saved = plain.save(&dir.path().join("plain")).expect("save");
    assert!(saved.manifest.files.iter().all(|f| f.kind != "cache"));

    let ck = a
        .checkpoints(Some(dir.path()), 0)
        .with_cache(cache.clone(), true);
    let saved = ck.save(&dir.path().join("with")).expect("save");
    let f = saved
        .manifest
        .files
        .iter()
        .find(|f| f.kind == "cache")
        .expect("a cache file");
    assert_eq!(f.records, 301);

    let b = server();
    let restored = cache_store();
    b.checkpoints(None, 0)
        .with_cache(restored.clone(), false)
        .restore(&saved.dir, true)
        .expect("restore");
    let now = b.now();
    for i in 0..300u32 {
        let got = restored
            .get(format!("block:{i}").as_bytes(), now)
            .expect("restored");
        assert_eq!(&got[..], &vec![i as u8; 4096 + i as usize][..], "{i}");
    }
    let got = restored.get(&long_key, now).expect("the long key");
    assert_eq!(&got[..], b"long key");
    let left = got.expires_at_ms().saturating_sub(now);
    assert!(
        (3_000_000..=3_600_000).contains(&left),
        "the TTL survives as a time: {left} ms left"
    );
    // A server without a cache refuses a checkpoint that has one.
    let e = server()
        .checkpoints(None, 0)
        .restore(&saved.dir, true)
        .expect_err("no cache to restore into");
    assert!(e.to_string().contains("KV cache"), "{e}");
}

/// Partition 0's file of a save in `dir`, for a walk driven by hand.
fn partition_0_file(dir: &Path) -> (PathBuf, FileOut) {
    let head = FileHeader {
        version: FORMAT_VERSION,
        kind: FileKind::Kv,
        index: 0,
        count: PARTITIONS as u32,
        generation: 1,
        created_unix_ms: 1,
    };
    let path = dir.join("kv-00000.fkv");
    let out = FileOut::create(&path, &head).expect("file");
    (path, out)
}

/// What a walk of partition 0 driven by hand left.
struct HandWalk {
    /// Steps taken before the one that took the cut.
    steps: usize,
    walk: Walk,
    /// Partition 0's keys and values at the cut.
    at_cut: BTreeMap<Vec<u8>, Vec<u8>>,
    /// The file replayed, and how many records it holds.
    replay: BTreeMap<Vec<u8>, Vec<u8>>,
    records: usize,
}

/// Walks partition 0 of `a` into a file in `dir`, one step at a time,
/// running `between` (given the steps so far) after each step but the
/// last; then replays the file.
fn walk_partition_0(a: &Server, dir: &Path, mut between: impl FnMut(usize, &Walk)) -> HandWalk {
    let ck = a.checkpoints(Some(dir), 0);
    let (path, mut out) = partition_0_file(dir);
    let mut w = Walk::new();
    let job = Job::Kv(0);
    ck.with_part(job, |p| p.begin_cut());
    let mut steps = 0;
    loop {
        let done = ck
            .with_part(job, |p| ck.walk_step(job, PARTITIONS as u32, p, &mut w))
            .expect("partition");
        out.frame(&mut w.out.buf).expect("frame");
        if done {
            break;
        }
        steps += 1;
        between(steps, &w);
    }
    let at_cut: BTreeMap<_, _> = a
        .keys()
        .into_iter()
        .filter(|(k, _)| a.parts.index_of(KeyHash::of(k)) == 0)
        .map(|(k, v)| (k, v.0))
        .collect();
    // A write after the cut is neither noted nor in the file.
    if let Some(k) = at_cut.keys().next() {
        a.put(k, b"after the cut", 0);
    }
    assert!(
        ck.with_part(job, |p| p.take_cut(Vec::new()).is_none())
            .expect("p"),
        "notes stop at the cut"
    );
    let t = out.trailer;
    out.write(&t.encode()).expect("trailer");
    out.finish().expect("finish");
    let bytes = fs::read(&path).expect("read");
    let mut replay: BTreeMap<Vec<u8>, Vec<u8>> = BTreeMap::new();
    let mut records = 0;
    format::parse_file(&bytes, &mut |recs| {
        for r in recs.iter() {
            records += 1;
            match r {
                Record::Put { key, value, .. } => {
                    replay.insert(key.to_vec(), value.to_vec());
                }
                Record::Del { key } => {
                    replay.remove(key);
                }
                other => panic!("unexpected record {other:?}"),
            }
        }
    })
    .expect("a whole file");
    HandWalk {
        steps,
        walk: w,
        at_cut,
        replay,
        records,
    }
}

/// Keys of `a`'s partition 0, `n` of them named after `tag`.
fn keys_in_0(a: &Server, n: usize, tag: &str) -> Vec<Vec<u8>> {
    (0..)
        .map(|i| format!("{tag}:{i}").into_bytes())
        .filter(|k| a.parts.index_of(KeyHash::of(k)) == 0)
        .take(n)
        .collect()
}

/// Drives one partition's walk by hand, changing keys between its
/// steps: the file must hold exactly the state at the step that ends it.
#[test]
fn the_cut_holds_each_key_as_it_was_when_the_walk_ended() {
    let dir = tempfile::tempdir().expect("tempdir");
    let a = server();
    let old = keys_in_0(&a, 3 * CUT_SCAN_ENTRIES, "old");
    for k in &old {
        a.put(k, b"v0", 0);
    }
    let fresh = keys_in_0(&a, 2_000, "new");
    let done = walk_partition_0(&a, dir.path(), |step, _| {
        // Between steps: every old key rewritten, every fifth deleted,
        // new keys added, on both sides of the cursor.
        for (i, k) in old.iter().enumerate() {
            if i % 5 == 0 {
                a.delete(k);
            } else {
                a.put(k, format!("v{step}").as_bytes(), 0);
            }
        }
        for k in &fresh[..(step * 500).min(fresh.len())] {
            a.put(k, format!("n{step}").as_bytes(), 0);
        }
    });
    assert!(
        done.steps >= 2,
        "the walk took several steps ({})",
        done.steps
    );
    assert_eq!(done.replay.len(), done.at_cut.len());
    assert!(
        done.replay == done.at_cut,
        "the file replays to the partition as it was at the cut"
    );
}

/// Writes behind a walk that outrun it (here: a quarter of the partition
/// rewritten between every two steps) would make every hold read keys
/// again and the file grow without end. Once the walk has read keys again
/// more often than it walked, it reads the rest in one hold: the file
/// stays within about twice the partition's records and still replays to
/// the partition as it was at the cut.
#[test]
fn a_walk_outrun_by_writes_finishes_with_a_bounded_file() {
    let dir = tempfile::tempdir().expect("tempdir");
    let a = server();
    let keys = keys_in_0(&a, 4 * CUT_BEHIND_KEYS_MAX, "hot");
    for k in &keys {
        a.put(k, b"v0", 0);
    }
    let bound = 2 * keys.len() + 2 * CUT_BEHIND_KEYS_MAX;
    let done = walk_partition_0(&a, dir.path(), |step, w| {
        assert!(
            w.walked + w.reread <= bound as u64,
            "{} records after {step} steps and the walk goes on",
            w.walked + w.reread
        );
        for (i, k) in keys.iter().enumerate().skip(step % 4).step_by(4) {
            a.put(k, format!("v{step}-{i}").as_bytes(), 0);
        }
    });
    let w = &done.walk;
    assert!(w.reread > 0 && w.walked > 0, "{} {}", w.reread, w.walked);
    assert!(
        done.records <= bound,
        "{} records for {} keys",
        done.records,
        keys.len()
    );
    assert!(
        done.replay == done.at_cut,
        "the file replays to the partition at the cut"
    );
}

/// A request blocked on a partition's lock ends a walk's hold after
/// `CUT_YIELD_AFTER_ENTRIES` (at a chain's end), not after the whole
/// `CUT_SCAN_ENTRIES` chunk it reads when nobody waits.
#[test]
fn a_waiting_request_cuts_a_walks_hold_short() {
    let a = server();
    for i in 0..(4 * CUT_SCAN_ENTRIES) {
        a.put(format!("k{i}").as_bytes(), b"value", 0);
    }
    let ck = a.checkpoints(None, 0);
    let job = Job::Kv(0);
    let records_of_one_step = |w: &mut Walk, p: &mut Partition| {
        let before = u64::from(w.out.buf.len());
        ck.walk_step(job, PARTITIONS as u32, p, w);
        u64::from(w.out.buf.len()) - before
    };
    // Nobody waits: a whole chunk per hold.
    let mut w = Walk::new();
    let alone = {
        let mut g = a.parts.lock(0);
        g.begin_cut();
        records_of_one_step(&mut w, &mut g)
    };
    assert!(
        alone >= CUT_SCAN_ENTRIES as u64 / 2,
        "{alone} records in a hold nobody waited on"
    );
    // A thread blocked on the lock: the hold ends early.
    let mut g = a.parts.lock(0);
    let parts = a.parts.clone();
    let waiter = std::thread::spawn(move || {
        drop(parts.lock(0));
    });
    let deadline = Instant::now() + Duration::from_secs(60);
    while !a.parts.wanted(0) {
        assert!(Instant::now() < deadline, "the waiter never blocked");
        std::thread::yield_now();
    }
    let contended = records_of_one_step(&mut w, &mut g);
    drop(g);
    waiter.join().expect("waiter");
    assert!(
        (CUT_YIELD_AFTER_ENTRIES as u64..CUT_SCAN_ENTRIES as u64 / 4).contains(&contended),
        "{contended} records in a hold a request waited on"
    );
    assert!(
        !a.parts.wanted(0),
        "the waiter is counted out once it has the lock"
    );
    ck.with_part(job, |p| p.end_cut());
}

/// A save rests only while the server serves, about twice as long as a
/// frame took (a third of the time working), and never past the bound.
#[test]
fn a_save_rests_only_when_the_server_is_busy() {
    let frame = Duration::from_millis(3);
    assert_eq!(rest_after(frame, false), Duration::ZERO);
    let rest = rest_after(frame, true);
    let share = frame.as_secs_f64() / (frame + rest).as_secs_f64() * 100.0;
    assert!(
        (share - f64::from(CHECKPOINT_BUSY_WORK_PERCENT)).abs() < 1.0,
        "works {share:.1}% of the time"
    );
    assert_eq!(
        rest_after(Duration::from_secs(1), true),
        Duration::from_millis(CHECKPOINT_REST_MAX_MS)
    );
}

fn saved(dir: &Path) -> Summary {
    let a = server();
    for i in 0..3_000u32 {
        a.put(format!("k{i}").as_bytes(), b"value", 0);
    }
    a.checkpoints(Some(dir), 0).save(dir).expect("save")
}

fn refused(dir: &Path) -> String {
    match server().checkpoints(None, 0).restore(dir, true) {
        Err(e) => e.to_string(),
        Ok(_) => panic!("a bad checkpoint was loaded"),
    }
}

#[test]
fn damaged_short_foreign_and_newer_files_are_refused_by_name() {
    let dir = tempfile::tempdir().expect("tempdir");
    let s = saved(dir.path());
    let file = s.dir.join(&s.manifest.files[1].name);
    let good = fs::read(&file).expect("read");

    // A flipped byte in the middle of a frame.
    let mut torn = good.clone();
    let mid = torn.len() / 2;
    torn[mid] ^= 1;
    fs::write(&file, &torn).expect("write");
    let e = refused(&s.dir);
    assert!(
        e.contains(&s.manifest.files[1].name) && e.contains("checksum"),
        "{e}"
    );

    // Cut short.
    fs::write(&file, &good[..good.len() - 100]).expect("write");
    let e = refused(&s.dir);
    assert!(
        e.contains(&s.manifest.files[1].name) && e.contains("cut short"),
        "{e}"
    );

    // Someone else's file of the same length.
    fs::write(&file, vec![b'x'; good.len()]).expect("write");
    let e = refused(&s.dir);
    assert!(e.contains("not a FabricKV checkpoint file"), "{e}");

    // A newer format.
    let mut newer = good.clone();
    newer[8..12].copy_from_slice(&(FORMAT_VERSION + 1).to_le_bytes());
    fs::write(&file, &newer).expect("write");
    let e = refused(&s.dir);
    assert!(e.contains("newer than this build reads"), "{e}");

    // Restored, it loads again; a server with another partition count is
    // told why it cannot take it.
    fs::write(&file, &good).expect("write");
    assert!(server().checkpoints(None, 0).restore(&s.dir, true).is_ok());
    let mut m: serde_json::Value =
        serde_json::from_slice(&fs::read(s.dir.join(MANIFEST)).expect("manifest")).expect("json");
    m["partitions"] = serde_json::json!(PARTITIONS + 1);
    fs::write(s.dir.join(MANIFEST), serde_json::to_vec(&m).expect("json")).expect("write");
    let e = refused(&s.dir);
    assert!(e.contains("--partitions must match"), "{e}");
}

#[test]
fn a_save_that_died_before_its_manifest_leaves_the_previous_one_newest() {
    let dir = tempfile::tempdir().expect("tempdir");
    let good = saved(dir.path());
    // A later save that died mid-way: files, no manifest.
    let dead = dir
        .path()
        .join(format!("{DIR_PREFIX}{:016}", good.manifest.generation + 1));
    fs::create_dir(&dead).expect("dir");
    fs::write(dead.join("kv-00000.fkv"), b"half").expect("write");
    let got = server()
        .checkpoints(None, 0)
        .restore(dir.path(), true)
        .expect("restore")
        .expect("one");
    assert_eq!(got.dir, good.dir);

    // At start (`--checkpoint-dir`), a newest checkpoint that is damaged
    // is passed over for the one before; asked for by name it is refused.
    let a = server();
    a.put(b"later", b"x", 0);
    let ck = a.checkpoints(Some(dir.path()), 0);
    let newer = ck.save(dir.path()).expect("save");
    fs::write(newer.dir.join(&newer.manifest.files[0].name), b"gone").expect("write");
    let b = server();
    let got = b
        .checkpoints(None, 0)
        .restore(dir.path(), false)
        .expect("restore")
        .expect("one");
    assert_eq!(got.dir, good.dir, "the newest good one");
    assert!(!b.keys().contains_key(&b"later"[..]));
    assert!(refused(dir.path()).contains(&newer.manifest.files[0].name));

    // Saves with keep = 2 leave two complete checkpoints and no
    // unfinished ones.
    let ck = a.checkpoints(Some(dir.path()), 2);
    let last = ck.save(dir.path()).expect("save");
    let left = checkpoint_dirs(dir.path());
    assert_eq!(left.len(), 2, "{left:?}");
    assert!(left.contains(&last.dir) && left.contains(&newer.dir) && !left.contains(&dead));
    assert!(ck.last_save_unix_s() > 0);
}

#[test]
fn a_client_names_only_directories_inside_the_root() {
    let dir = tempfile::tempdir().expect("tempdir");
    let a = server();
    let ck = a.checkpoints(Some(dir.path()), 0);
    assert_eq!(ck.resolve(None).expect("root"), dir.path());
    assert_eq!(
        ck.resolve(Some("nightly")).expect("inside"),
        dir.path().join("nightly")
    );
    assert!(matches!(
        ck.resolve(Some("/etc")),
        Err(CheckpointError::Outside(_))
    ));
    assert!(matches!(
        ck.resolve(Some("../x")),
        Err(CheckpointError::Outside(_))
    ));
    assert!(matches!(
        a.checkpoints(None, 0).resolve(None),
        Err(CheckpointError::NoDir)
    ));
}
