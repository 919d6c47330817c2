//! The engine's hot path on its own, no network: nanoseconds per PUT of a
//! new key, PUT over a live key, GET, and DELETE, in both modes, over a
//! key set far larger than the caches (a random order of 1 Mi keys in a
//! 256 MiB partition). `cargo test --release -p fabrickv-engine --test
//! hot_path -- --ignored --nocapture` prints them; alternate runs of two
//! builds to compare one change (as the index summaries were judged). As a
//! plain test it runs at a tiny size so it never rots.

use std::time::Instant;

use fabrickv_engine::{
    DeleteResult, GetResult, Mode, Partition, PartitionConfig, PutCond, PutResult,
};
use fabrickv_types::KeyHash;

/// Keys of the measured run.
const KEYS_MEASURED: u64 = 1 << 20;

/// Pool of the measured run, in bytes: room for every key in either mode.
const POOL_BYTES_MEASURED: usize = 256 << 20;

/// Keys and pool of the plain (tiny) run.
const KEYS_TINY: u64 = 1 << 10;
const POOL_BYTES_TINY: usize = 4 << 20;

fn key(i: u64) -> [u8; 16] {
    // A multiplicative shuffle so consecutive operations hit unrelated
    // buckets, as a real key stream does.
    let mut k = [0u8; 16];
    k[..8].copy_from_slice(&i.wrapping_mul(0x9e37_79b9_7f4a_7c15).to_le_bytes());
    k[8..].copy_from_slice(b"key:fkv!");
    k
}

/// Runs each phase over `keys` keys; returns ns per operation per phase.
fn phases(mode: Mode, keys: u64, pool_bytes: usize) -> [(&'static str, f64); 4] {
    let mut p = Partition::new(&PartitionConfig {
        mode,
        pool_bytes,
        index_buckets: None,
        memory: Default::default(),
    })
    .expect("partition");
    let value = [7u8; 32];
    let ks: Vec<([u8; 16], KeyHash)> = (0..keys)
        .map(|i| {
            let k = key(i);
            (k, KeyHash::of(&k))
        })
        .collect();
    let time = |f: &mut dyn FnMut()| {
        let t = Instant::now();
        f();
        t.elapsed().as_nanos() as f64 / keys as f64
    };
    let put_new = time(&mut || {
        for (k, h) in &ks {
            assert_eq!(
                p.put(*h, k, &value, 0, PutCond::Always, 0),
                PutResult::Stored
            );
        }
    });
    let put_over = time(&mut || {
        for (k, h) in &ks {
            assert_eq!(
                p.put(*h, k, &value, 0, PutCond::Always, 0),
                PutResult::Stored
            );
        }
    });
    let mut hits = 0u64;
    let get = time(&mut || {
        for (k, h) in &ks {
            hits += u64::from(matches!(p.get(*h, k, 0), GetResult::Found { .. }));
        }
    });
    let mut deleted = 0u64;
    let delete = time(&mut || {
        for (k, h) in &ks {
            deleted += u64::from(p.delete(*h, k, 0) == DeleteResult::Deleted);
        }
    });
    if mode == Mode::Store {
        assert_eq!((hits, deleted), (keys, keys), "store mode keeps every key");
    }
    [
        ("put new", put_new),
        ("put over", put_over),
        ("get", get),
        ("delete", delete),
    ]
}

fn report(keys: u64, pool_bytes: usize) {
    for mode in [Mode::Cache, Mode::Store] {
        let line: Vec<String> = phases(mode, keys, pool_bytes)
            .iter()
            .map(|(name, ns)| format!("{name} {ns:.1} ns"))
            .collect();
        println!("hot_path {mode:?}: {}", line.join(", "));
    }
}

#[test]
fn hot_path_runs_at_a_tiny_size() {
    report(KEYS_TINY, POOL_BYTES_TINY);
}

#[test]
#[ignore = "a measurement: run with --release -- --ignored --nocapture"]
fn hot_path_ns_per_operation() {
    report(KEYS_MEASURED, POOL_BYTES_MEASURED);
}
