//! Whole-partition tests: configuration, filling a store, overrunning a
//! cache, and randomized comparison with a `HashMap` model.

use std::collections::HashMap;

use proptest::prelude::*;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::item::is_expired;
use crate::testutil::{h, put_ok, sized};
use crate::{
    DeleteResult, EngineError, GetResult, Mode, Partition, PartitionConfig, PutCond, PutResult,
    ScanBudget, POOL_BYTES_MAX, POOL_BYTES_MIN,
};

/// A value that names its key and version, so a wrong value is detected.
fn value_for(key: u32, version: u32, len: usize) -> Vec<u8> {
    let seed = key.wrapping_mul(0x9e37_79b9) ^ version.wrapping_mul(0x85eb_ca6b);
    (0..len)
        .map(|i| (seed.wrapping_add(i as u32).wrapping_mul(2_654_435_761) >> 24) as u8)
        .collect()
}

#[test]
fn config_is_validated() {
    let cfg = |mode, pool_bytes, index_buckets| PartitionConfig {
        mode,
        pool_bytes,
        index_buckets,
        memory: Default::default(),
    };
    for mode in [Mode::Cache, Mode::Store] {
        assert!(matches!(
            Partition::new(&cfg(mode, POOL_BYTES_MIN - 1, None)),
            Err(EngineError::PoolTooSmall { .. })
        ));
        assert!(matches!(
            Partition::new(&cfg(mode, POOL_BYTES_MAX + 1, None)),
            Err(EngineError::PoolTooLarge { .. })
        ));
        for bad in [0, 3, 100] {
            let err = Partition::new(&cfg(mode, POOL_BYTES_MIN, Some(bad)));
            assert!(
                matches!(err, Err(EngineError::BadIndexBuckets { .. })),
                "{bad}"
            );
        }
        let p = Partition::new(&cfg(mode, POOL_BYTES_MIN, Some(1))).expect("one bucket is fine");
        assert_eq!((p.mode(), p.index_buckets()), (mode, 1));
        assert_eq!(p.stats().pool_bytes, POOL_BYTES_MIN as u64);
    }
    let msg = EngineError::PoolTooSmall {
        pool_bytes: 1,
        min_bytes: 2,
    }
    .to_string();
    assert!(msg.contains("below the minimum"), "{msg}");
}

#[test]
fn store_fills_up_keeps_everything_and_reuses_freed_space() {
    let mut p = sized(Mode::Store, 1 << 20, None);
    let mut rng = StdRng::seed_from_u64(7);
    let mut acked: HashMap<u32, usize> = HashMap::new();
    let mut refusals = 0;
    let mut key = 0u32;
    // Keep going past the first refusal: other size classes may still fit.
    while refusals < 200 {
        let len = rng.gen_range(0..2000);
        let k = key.to_le_bytes();
        match p.put(h(&k), &k, &value_for(key, 0, len), 0, PutCond::Always, 0) {
            PutResult::Stored => {
                acked.insert(key, len);
            }
            PutResult::InsufficientSpace => refusals += 1,
            other => panic!("unexpected {other:?}"),
        }
        key += 1;
    }
    assert!(
        acked.len() > 400,
        "a 1 MiB store holds hundreds of ~1 KB items"
    );
    let check_all =
        |p: &mut Partition, acked: &HashMap<u32, usize>, version: &HashMap<u32, u32>| {
            for (&k, &len) in acked {
                let v = value_for(k, version.get(&k).copied().unwrap_or(0), len);
                assert_eq!(
                    p.get(h(&k.to_le_bytes()), &k.to_le_bytes(), 0),
                    GetResult::Found {
                        value: &v,
                        expire_at_ms: 0
                    },
                    "key {k}"
                );
            }
        };
    check_all(&mut p, &acked, &HashMap::new());
    let s = p.stats();
    assert_eq!(s.items, acked.len() as u64);
    assert_eq!(s.bytes, acked.values().map(|&l| 4 + l as u64).sum::<u64>());
    assert_eq!(s.evictions, 0);
    p.check();

    // Delete every third item, then write other values of the same sizes
    // under the same keys: only the freed chunks can hold them.
    let mut deleted: Vec<(u32, usize)> = acked
        .iter()
        .map(|(&k, &l)| (k, l))
        .filter(|(k, _)| k % 3 == 0)
        .collect();
    deleted.sort_unstable();
    for &(k, _) in &deleted {
        assert_eq!(
            p.delete(h(&k.to_le_bytes()), &k.to_le_bytes(), 0),
            DeleteResult::Deleted
        );
        acked.remove(&k);
    }
    check_all(&mut p, &acked, &HashMap::new());
    let mut version = HashMap::new();
    for &(k, len) in &deleted {
        let kb = k.to_le_bytes();
        assert_eq!(
            p.put(h(&kb), &kb, &value_for(k, 1, len), 0, PutCond::Always, 0),
            PutResult::Stored,
            "freed chunk of key {k} is reused"
        );
        acked.insert(k, len);
        version.insert(k, 1);
    }
    check_all(&mut p, &acked, &version);
    p.check();
}

#[test]
fn cache_overrun_never_returns_a_wrong_value() {
    let mut p = sized(Mode::Cache, 256 << 10, None);
    let mut rng = StdRng::seed_from_u64(11);
    const KEYS: u32 = 3000;
    let mut latest: HashMap<u32, (u32, usize)> = HashMap::new();
    let mut written = 0usize;
    let mut version = 0u32;
    let mut hits = 0;
    while written < 16 << 20 {
        let k = rng.gen_range(0..KEYS);
        let kb = k.to_le_bytes();
        match rng.gen_range(0..10) {
            0..=5 => {
                let len = if rng.gen_bool(0.1) {
                    rng.gen_range(2000..20_000)
                } else {
                    rng.gen_range(0..600)
                };
                version += 1;
                let r = p.put(
                    h(&kb),
                    &kb,
                    &value_for(k, version, len),
                    0,
                    PutCond::Always,
                    0,
                );
                assert_eq!(r, PutResult::Stored);
                latest.insert(k, (version, len));
                written += len;
            }
            6 => {
                let r = p.delete(h(&kb), &kb, 0);
                let known = latest.remove(&k).is_some();
                assert!(
                    known || r == DeleteResult::NotFound,
                    "deleted a key never written"
                );
                assert_eq!(
                    p.get(h(&kb), &kb, 0),
                    GetResult::NotFound,
                    "deletes take effect"
                );
            }
            _ => match p.get(h(&kb), &kb, 0) {
                GetResult::NotFound => {}
                GetResult::Found { value, .. } => {
                    let (ver, len) = latest
                        .get(&k)
                        .copied()
                        .expect("hit on a key not in the model");
                    assert!(
                        value == value_for(k, ver, len).as_slice(),
                        "stale or foreign value"
                    );
                    hits += 1;
                }
            },
        }
    }
    let s = p.stats();
    assert!(s.evictions > 1000, "{s:?}");
    assert!(hits > 100, "the cache still serves recent keys");
    assert!(s.bytes <= s.pool_bytes);
    p.check();
    // Everything still indexed must be the latest value.
    for k in 0..KEYS {
        let kb = k.to_le_bytes();
        if let GetResult::Found { value, .. } = p.get(h(&kb), &kb, 0) {
            let (ver, len) = latest[&k];
            assert!(value == value_for(k, ver, len).as_slice());
        }
    }
}

#[test]
fn cache_counts_ttl_items_overwritten_by_the_log_as_expired() {
    let mut p = sized(Mode::Cache, POOL_BYTES_MIN, None);
    let v = vec![1u8; 500];
    for k in 0..50u32 {
        let kb = k.to_le_bytes();
        put_ok(&mut p, &kb, &v, 10);
    }
    // At time 20 those are expired; overrunning the log reclaims them.
    for k in 1000..1300u32 {
        let kb = k.to_le_bytes();
        assert_eq!(
            p.put(h(&kb), &kb, &v, 0, PutCond::Always, 20),
            PutResult::Stored
        );
    }
    let s = p.stats();
    assert_eq!(s.expired, 50);
    assert!(s.evictions > 0);
    p.check();
}

/// One operation of the randomized model test.
#[derive(Debug, Clone)]
enum Op {
    Put {
        key: u8,
        len: usize,
        ttl_ms: Option<u64>,
        cond: PutCond,
    },
    Get {
        key: u8,
    },
    Delete {
        key: u8,
    },
    SetExpiry {
        key: u8,
        ttl_ms: Option<u64>,
    },
    Sweep {
        buckets: usize,
    },
    Advance {
        ms: u64,
    },
}

/// Keys of the model test: few, so that operations meet each other.
const MODEL_KEYS: u8 = 16;

/// Keys of the cache-mode model test: more, so that live items are
/// overwritten by the log before their key is written again (evictions).
const MODEL_KEYS_CACHE: u8 = 48;

fn op_strategy(keys: u8) -> impl Strategy<Value = Op> {
    let key = 0..keys;
    let ttl = prop_oneof![3 => Just(None), 1 => (1u64..200).prop_map(Some)];
    let cond = prop_oneof![
        6 => Just(PutCond::Always),
        1 => Just(PutCond::IfAbsent),
        1 => Just(PutCond::IfPresent)
    ];
    prop_oneof![
        8 => (key.clone(), 0usize..2000, ttl.clone(), cond)
            .prop_map(|(key, len, ttl_ms, cond)| Op::Put { key, len, ttl_ms, cond }),
        6 => key.clone().prop_map(|key| Op::Get { key }),
        2 => key.clone().prop_map(|key| Op::Delete { key }),
        1 => (key, ttl).prop_map(|(key, ttl_ms)| Op::SetExpiry { key, ttl_ms }),
        1 => (0usize..64).prop_map(|buckets| Op::Sweep { buckets }),
        2 => (0u64..60).prop_map(|ms| Op::Advance { ms }),
    ]
}

/// The model: key -> (value, expire_at_ms).
type Model = HashMap<u8, (Vec<u8>, u64)>;

fn model_live(model: &Model, key: u8, now: u64) -> Option<&(Vec<u8>, u64)> {
    model.get(&key).filter(|(_, exp)| !is_expired(*exp, now))
}

fn key_bytes(key: u8) -> Vec<u8> {
    format!("key-{key}").into_bytes()
}

/// Runs `ops` against a partition (of `index_buckets` buckets, or the
/// default) and the model. Store mode must agree
/// exactly; cache mode may forget but never invent or resurrect.
fn run_model(mode: Mode, index_buckets: Option<usize>, ops: &[Op]) {
    run_model_tagged(mode, index_buckets, None, ops);
}

/// [`run_model`], turning slot tags on before op `slot_tags_at` (the
/// entries already there are retagged).
fn run_model_tagged(
    mode: Mode,
    index_buckets: Option<usize>,
    slot_tags_at: Option<usize>,
    ops: &[Op],
) {
    let mut p = sized(mode, POOL_BYTES_MIN, index_buckets);
    let mut model = Model::new();
    let mut now = 1u64;
    let mut version = 0u32;
    for (i, op) in ops.iter().enumerate() {
        if slot_tags_at == Some(i) {
            assert_eq!(p.use_slot_tags(), mode == Mode::Store);
            p.check();
        }
        match *op {
            Op::Put {
                key,
                len,
                ttl_ms,
                cond,
            } => {
                version += 1;
                let value = value_for(u32::from(key), version, len);
                let exp = ttl_ms.map_or(0, |t| now + t);
                let kb = key_bytes(key);
                let live = model_live(&model, key, now).is_some();
                let r = p.put(h(&kb), &kb, &value, exp, cond, now);
                match mode {
                    Mode::Store => {
                        let expected_cond = match cond {
                            PutCond::Always => true,
                            PutCond::IfAbsent => !live,
                            PutCond::IfPresent => live,
                        };
                        if !expected_cond {
                            assert_eq!(r, PutResult::ConditionFailed);
                        } else {
                            assert!(
                                matches!(r, PutResult::Stored | PutResult::InsufficientSpace),
                                "{r:?}"
                            );
                        }
                    }
                    Mode::Cache => {
                        // The cache may have forgotten a key the model has.
                        match (cond, r) {
                            (PutCond::IfAbsent, PutResult::ConditionFailed) => assert!(live),
                            (PutCond::IfPresent, PutResult::Stored) => assert!(live),
                            (_, PutResult::Stored) => {}
                            (PutCond::IfPresent, PutResult::ConditionFailed) => {
                                model.remove(&key);
                            }
                            (_, other) => panic!("cache refused a put: {other:?}"),
                        }
                    }
                }
                if r == PutResult::Stored {
                    model.insert(key, (value, exp));
                }
            }
            Op::Get { key } => {
                let kb = key_bytes(key);
                let r = p.get(h(&kb), &kb, now);
                let expected = model_live(&model, key, now);
                match (r, expected) {
                    (
                        GetResult::Found {
                            value,
                            expire_at_ms,
                        },
                        Some((v, exp)),
                    ) => {
                        assert!(value == v.as_slice(), "wrong value for key {key}");
                        assert_eq!(expire_at_ms, *exp);
                    }
                    (GetResult::NotFound, None) => {}
                    (GetResult::NotFound, Some(_)) if mode == Mode::Cache => {
                        model.remove(&key);
                    }
                    (r, e) => panic!("key {key}: engine {r:?}, model {e:?}"),
                }
            }
            Op::Delete { key } => {
                let kb = key_bytes(key);
                let r = p.delete(h(&kb), &kb, now);
                let live = model_live(&model, key, now).is_some();
                model.remove(&key);
                match (mode, r) {
                    (Mode::Store, r) => assert_eq!(r == DeleteResult::Deleted, live),
                    (Mode::Cache, DeleteResult::Deleted) => assert!(live),
                    (Mode::Cache, DeleteResult::NotFound) => {}
                }
                assert_eq!(p.get(h(&kb), &kb, now), GetResult::NotFound);
            }
            Op::SetExpiry { key, ttl_ms } => {
                let kb = key_bytes(key);
                let exp = ttl_ms.map_or(0, |t| now + t);
                let done = p.set_expiry(h(&kb), &kb, exp, now);
                let live = model_live(&model, key, now).is_some();
                match (mode, done) {
                    (Mode::Store, done) => assert_eq!(done, live),
                    (Mode::Cache, true) => assert!(live),
                    (Mode::Cache, false) => {
                        model.remove(&key);
                    }
                }
                if done {
                    if let Some(entry) = model.get_mut(&key) {
                        entry.1 = exp;
                    }
                }
            }
            Op::Sweep { buckets } => {
                let before = p.stats().items;
                let n = p.sweep(now, buckets);
                assert_eq!(p.stats().items, before - n as u64);
            }
            Op::Advance { ms } => now += ms,
        }
        p.check();
    }

    // A full sweep leaves only live items, which then match the model.
    let _ = p.sweep(now, usize::MAX);
    model.retain(|_, (_, exp)| !is_expired(*exp, now));
    let s = p.stats();
    if mode == Mode::Store {
        assert_eq!(s.items, model.len() as u64);
        let bytes: u64 = model
            .iter()
            .map(|(k, (v, _))| (key_bytes(*k).len() + v.len()) as u64)
            .sum();
        assert_eq!(s.bytes, bytes);
        assert_eq!((s.evictions, s.index_collisions), (0, 0));
    } else {
        assert!(s.items <= model.len() as u64);
    }
    for key in 0..=u8::MAX {
        let kb = key_bytes(key);
        match (p.get(h(&kb), &kb, now), model.get(&key)) {
            (GetResult::Found { value, .. }, Some((v, _))) => assert!(value == v.as_slice()),
            (GetResult::NotFound, None) => {}
            (GetResult::NotFound, Some(_)) if mode == Mode::Cache => {}
            (r, e) => panic!("key {key}: engine {r:?}, model {e:?}"),
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

    #[test]
    fn store_matches_a_hashmap(ops in prop::collection::vec(op_strategy(MODEL_KEYS), 1..500)) {
        run_model(Mode::Store, None, &ops);
    }

    /// One main bucket: most keys live in overflow buckets, which are
    /// linked and unlinked as keys come and go.
    #[test]
    fn store_with_overflow_chains_matches_a_hashmap(
        ops in prop::collection::vec(op_strategy(MODEL_KEYS), 1..500),
    ) {
        run_model(Mode::Store, Some(1), &ops);
    }

    /// Slot tags turned on part way (the entries there retagged), with
    /// few buckets so that chains and tag matches are common.
    #[test]
    fn store_with_slot_tags_matches_a_hashmap(
        ops in prop::collection::vec(op_strategy(MODEL_KEYS), 1..500),
        at in 0usize..500,
        buckets in prop::sample::select(vec![1usize, 4, 64]),
    ) {
        run_model_tagged(Mode::Store, Some(buckets), Some(at.min(ops.len() - 1)), &ops);
    }

    #[test]
    fn cache_never_disagrees_with_a_hashmap(
        ops in prop::collection::vec(op_strategy(MODEL_KEYS_CACHE), 1..500),
    ) {
        run_model(Mode::Cache, None, &ops);
    }

    /// Two buckets for sixteen keys: the lossy index drops entries often.
    #[test]
    fn cache_with_lossy_index_never_disagrees_with_a_hashmap(
        ops in prop::collection::vec(op_strategy(MODEL_KEYS), 1..500),
    ) {
        run_model(Mode::Cache, Some(2), &ops);
    }
}

/// A workload whose value sizes shift over time, in cache mode: a log has no size classes,
/// so no size is ever refused or starved; each write evicts the oldest
/// bytes, whatever their size, and is readable right after.
#[test]
fn cache_mode_never_starves_a_size_when_sizes_shift() {
    let mut p = sized(Mode::Cache, 4 << 20, None);
    let mut id = 0u64;
    for (len, count) in [(64usize, 100_000u64), (4096, 3_000), (512, 20_000)] {
        let value = vec![len as u8; len];
        for _ in 0..count {
            let k = id.to_le_bytes();
            put_ok(&mut p, &k, &value, 0);
            crate::testutil::assert_found(&mut p, &k, 0, &value, 0);
            id += 1;
        }
        if len == 64 {
            // Delete half of what is still held, as the store-mode test does.
            for i in (0..id).step_by(2) {
                let k = i.to_le_bytes();
                let _ = p.delete(h(&k), &k, 0);
            }
        }
    }
    let s = p.stats();
    assert!(s.evictions > 0, "the log came round");
    assert!(
        s.bytes > (4 << 20) / 2,
        "the last sizes fill the log: {} bytes",
        s.bytes
    );
    p.check();
}

/// Every live key whose slot `want` takes, by a walk of
/// [`Partition::scan_slots_from`] in holds of a few entries.
fn keys_in_slots(p: &mut Partition, now: u64, want: &dyn Fn(u16) -> bool) -> Vec<Vec<u8>> {
    let mut keys = Vec::new();
    let mut from = Some(0);
    while let Some(b) = from {
        let mut budget = ScanBudget {
            entries: 5,
            words: usize::MAX,
        };
        from = p.scan_slots_from(b, now, &mut budget, want, &mut |k, _, _| {
            keys.push(k.to_vec());
            true
        });
    }
    keys.sort();
    keys
}

/// A walk for some slots' keys finds exactly those, with slot tags off,
/// on (entries retagged), and after the tagged partition took writes
/// that moved items between size classes; keys sharing a `{hash tag}`
/// (one slot, tags two bits apart) stay apart for lookups.
#[test]
fn slot_walks_find_exactly_their_slots_keys() {
    use fabrickv_types::slot::key_slot;
    for buckets in [Some(128), None] {
        let mut p = sized(Mode::Store, 4 << 20, buckets);
        let keys: Vec<Vec<u8>> = (0..600)
            .map(|i| match i % 3 {
                0 => format!("plain-{i}"),
                1 => format!("{{user7}}.field-{i}"),
                _ => format!("{{u{}}}-{i}", i % 11),
            })
            .map(String::into_bytes)
            .collect();
        for k in &keys {
            put_ok(&mut p, k, b"v1", 0);
        }
        let want = |s: u16| s % 4 == 1 || (5_000..6_000).contains(&s);
        let expect = |keys: &[Vec<u8>]| {
            let mut e: Vec<Vec<u8>> = keys.iter().filter(|k| want(key_slot(k))).cloned().collect();
            e.sort();
            e
        };
        let untagged = keys_in_slots(&mut p, 1, &want);
        assert_eq!(untagged, expect(&keys));
        assert!(p.use_slot_tags());
        p.check();
        assert_eq!(keys_in_slots(&mut p, 1, &want), untagged);
        // Overwrites that change size class, deletes, reads.
        for (i, k) in keys.iter().enumerate() {
            match i % 4 {
                0 => put_ok(&mut p, k, &vec![b'x'; 300 + i], 0),
                1 => assert_eq!(p.delete(h(k), k, 1), DeleteResult::Deleted),
                _ => assert!(matches!(p.get(h(k), k, 1), GetResult::Found { .. })),
            }
        }
        p.check();
        let left: Vec<Vec<u8>> = keys
            .iter()
            .enumerate()
            .filter(|(i, _)| i % 4 != 1)
            .map(|(_, k)| k.clone())
            .collect();
        assert_eq!(keys_in_slots(&mut p, 1, &want), expect(&left));
        for k in &left {
            assert!(
                matches!(p.get(h(k), k, 1), GetResult::Found { .. }),
                "{k:?}"
            );
        }
    }
}
