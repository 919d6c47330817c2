//! Behaviour a user of the store relies on, end to end through the public
//! API (plus the internal invariant check after each scenario).

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;

use fabrickv_types::limits::{CACHE_KEY_BYTES_MAX, CACHE_VALUE_BYTES_MAX, TTL_MS_MAX};
use fabrickv_types::ErrorCode;
use proptest::prelude::*;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::*;

const KIB: usize = 1024;
const MIB: usize = 1024 * KIB;

fn store_with(pool_bytes: usize, evict: bool) -> CacheStore {
    CacheStore::new(CacheConfig {
        pool_bytes,
        evict,
        ..CacheConfig::default()
    })
    .expect("store")
}

fn check(store: &CacheStore) {
    if let Err(e) = store.check() {
        panic!("invariant broken: {e}");
    }
}

/// A well-mixed 64-bit function (splitmix64's finalizer).
fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// `len` bytes determined by `seed`, generated a word at a time so that
/// multi-MiB values stay cheap in debug builds.
fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut v = Vec::with_capacity(len + 8);
    let mut j = 0u64;
    while v.len() < len {
        v.extend_from_slice(&mix(seed ^ j.wrapping_mul(0x1000_0000_01b3)).to_le_bytes());
        j += 1;
    }
    v.truncate(len);
    v
}

fn key(i: usize) -> Vec<u8> {
    format!("key-{i}").into_bytes()
}

fn put(store: &CacheStore, k: &[u8], v: &[u8], ttl_ms: u64, now_ms: u64) -> u64 {
    let mut slot = store.reserve(k, v.len(), ttl_ms, now_ms).expect("reserve");
    slot.bytes_mut().copy_from_slice(v);
    slot.commit(now_ms).expect("commit")
}

#[test]
fn types_are_shareable_across_threads() {
    fn send_sync_static<T: Send + Sync + 'static>() {}
    fn send_static<T: Send + 'static>() {}
    send_sync_static::<CacheStore>();
    send_sync_static::<Lease>();
    send_static::<PutSlot>();
}

#[test]
fn default_config_is_one_gib_evicting_at_ninety_to_eighty_percent() {
    let c = CacheConfig::default();
    assert_eq!(c.pool_bytes, 1 << 30);
    assert!(c.evict);
    assert_eq!((c.high_watermark, c.low_watermark), (0.90, 0.80));
    assert!(!c.populate);
    assert_eq!(c.validate(), Ok(()));
}

#[test]
fn bad_configs_are_refused_with_the_reason() {
    let ok = CacheConfig {
        pool_bytes: 64 * KIB,
        ..CacheConfig::default()
    };
    let bad = [
        CacheConfig {
            pool_bytes: CACHE_POOL_BYTES_MIN - 1,
            ..ok.clone()
        },
        CacheConfig {
            pool_bytes: CACHE_POOL_BYTES_MAX + 1,
            ..ok.clone()
        },
        CacheConfig {
            high_watermark: 1.5,
            ..ok.clone()
        },
        CacheConfig {
            low_watermark: f64::NAN,
            ..ok.clone()
        },
        CacheConfig {
            high_watermark: 0.5,
            low_watermark: 0.6,
            ..ok.clone()
        },
    ];
    for cfg in bad {
        match CacheStore::new(cfg.clone()) {
            Err(e @ CacheError::InvalidConfig(_)) => assert!(!e.to_string().is_empty()),
            other => panic!("{cfg:?} gave {other:?}"),
        }
    }
    // A pool that is not a whole number of blocks is rounded down.
    let s = CacheStore::new(CacheConfig {
        pool_bytes: 64 * KIB + 100,
        populate: true,
        ..ok
    })
    .expect("store");
    assert_eq!(s.stats().pool_bytes, (64 * KIB + 64) as u64);
    assert_eq!(s.config().pool_bytes, 64 * KIB + 100);
}

#[test]
fn values_of_every_size_round_trip() {
    let s = store_with(4 * MIB, true);
    for (i, len) in [0, 1, 4 * KIB, MIB].into_iter().enumerate() {
        let v = pattern(i as u64, len);
        s.put(&key(i), &v, 0, 0).expect("put");
        let l = s.get(&key(i), 0).expect("stored");
        assert_eq!(&l[..], &v[..], "len {len}");
        assert_eq!(l.expires_at_ms(), 0);
    }
    check(&s);
}

#[test]
fn a_largest_value_round_trips_in_a_pool_sized_for_it() {
    let s = store_with(CACHE_VALUE_BYTES_MAX + PAGE_BYTES, true);
    let v = pattern(64, CACHE_VALUE_BYTES_MAX);
    s.put(b"big", &v, 0, 0).expect("put");
    let l = s.get(b"big", 0).expect("stored");
    assert_eq!(l.len(), CACHE_VALUE_BYTES_MAX);
    assert!(l[..] == v[..]);
    drop(l);
    assert!(s.delete(b"big", 0));
    assert_eq!(s.stats().free_bytes, s.stats().pool_bytes);
}

#[test]
fn blocks_are_cache_line_rounded_and_accounted() {
    let s = store_with(64 * KIB, false);
    s.put(b"a", b"x", 0, 0).expect("put");
    s.put(b"b", &[7; 65], 0, 0).expect("put");
    let st = s.stats();
    assert_eq!(st.entries, 2);
    assert_eq!(st.value_bytes, 66);
    assert_eq!(st.used_bytes, (CACHE_BLOCK_ALIGN_BYTES * 3) as u64);
    assert_eq!(st.free_bytes + st.used_bytes, st.pool_bytes);
    assert_eq!(st.puts, 2);
}

#[test]
fn overwrite_shows_the_new_value_under_a_new_generation() {
    let s = store_with(64 * KIB, false);
    let g1 = put(&s, b"k", b"first", 0, 0);
    let g2 = put(&s, b"k", b"second value", 0, 0);
    assert!(g2 > g1);
    let l = s.get(b"k", 0).expect("stored");
    assert_eq!(&l[..], b"second value");
    assert_eq!(l.generation(), g2);
    assert_eq!(s.stats().entries, 1);
    assert_eq!(s.stats().value_bytes, 12);
    drop(l);
    check(&s);
}

#[test]
fn generations_increase_across_keys_and_are_never_reused() {
    let s = store_with(64 * KIB, false);
    let mut last = 0;
    for i in 0..50 {
        let g = put(&s, &key(i % 7), &[i as u8; 10], 0, 0);
        assert!(g > last, "generation {g} after {last}");
        last = g;
        if i % 3 == 0 {
            s.delete(&key(i % 7), 0);
        }
    }
}

#[test]
fn a_lease_keeps_reading_the_old_bytes_through_overwrite_and_delete() {
    let s = store_with(64 * KIB, false);
    let old = pattern(1, 32 * KIB);
    let g1 = put(&s, b"a", &old, 0, 0);
    let lease = s.get(b"a", 0).expect("stored");

    let new = pattern(2, 8 * KIB);
    let g2 = put(&s, b"a", &new, 0, 0);
    assert_eq!(&s.get(b"a", 0).expect("stored")[..], &new[..]);
    assert!(lease[..] == old[..], "overwrite touched a leased value");
    assert_eq!(lease.generation(), g1);
    assert!(matches!(
        s.lease_if(b"a", g1, 0),
        Err(CacheError::ValueChanged)
    ));
    assert_eq!(
        s.lease_if(b"a", g2, 0).expect("same value").generation(),
        g2
    );

    assert!(s.delete(b"a", 0));
    assert!(s.get(b"a", 0).is_none());
    assert!(matches!(s.lease_if(b"a", g2, 0), Err(CacheError::NotFound)));
    assert!(lease[..] == old[..], "delete touched a leased value");

    let st = s.stats();
    assert_eq!(st.entries, 0);
    assert_eq!(st.leased_entries, 1);
    assert_eq!(st.pending_free_bytes, (32 * KIB) as u64);

    // The old block is not reused while leased: 32 KiB are held, so 48 KiB
    // do not fit, while another value written meanwhile leaves it intact.
    assert_eq!(s.put(b"b", &[1; 48 * KIB], 0, 0), Err(CacheError::Full));
    s.put(b"c", &pattern(3, 16 * KIB), 0, 0)
        .expect("fits beside");
    assert!(lease[..] == old[..]);
    check(&s);

    drop(lease);
    let st = s.stats();
    assert_eq!((st.leased_entries, st.pending_free_bytes), (0, 0));
    assert!(s.delete(b"c", 0));
    s.put(b"b", &[1; 48 * KIB], 0, 0)
        .expect("the block came back when the lease dropped");
    check(&s);
}

#[test]
fn several_leases_of_one_entry_free_it_only_when_the_last_drops() {
    let s = store_with(16 * KIB, false);
    s.put(b"a", &[9; 8 * KIB], 0, 0).expect("put");
    let l1 = s.get(b"a", 0).expect("stored");
    let l2 = s.get(b"a", 0).expect("stored");
    assert_eq!(s.stats().leased_entries, 1);
    assert!(s.delete(b"a", 0));
    drop(l1);
    assert_eq!(s.stats().pending_free_bytes, (8 * KIB) as u64);
    // A lease also outlives every handle of the store.
    let observer = s.clone();
    drop(s);
    assert!(l2.iter().all(|&b| b == 9));
    drop(l2);
    assert_eq!(observer.stats().used_bytes, 0);
    check(&observer);
}

#[test]
fn ttl_entries_vanish_by_active_expiry_earliest_first() {
    let s = store_with(64 * KIB, true);
    s.put(b"late", b"3", 30, 0).expect("put");
    s.put(b"early", b"1", 10, 0).expect("put");
    s.put(b"mid", b"2", 20, 0).expect("put");
    s.put(b"forever", b"0", 0, 0).expect("put");
    assert_eq!(s.get(b"early", 5).expect("live").expires_at_ms(), 10);

    assert_eq!(s.expire(9, 100), 0, "nothing is due yet");
    assert_eq!(s.expire(100, 2), 2, "bounded by max_entries");
    // No get ran: the two earliest deadlines went, the latest stayed.
    assert!(!s.exists(b"early", 0));
    assert!(!s.exists(b"mid", 0));
    assert!(s.exists(b"late", 0));
    assert_eq!(s.stats().expirations, 2);
    assert_eq!(s.expire(100, 100), 1);
    assert_eq!(s.expire(u64::MAX, 100), 0, "no TTL, no expiry");
    let st = s.stats();
    assert_eq!((st.entries, st.expirations), (1, 3));
    assert!(s.exists(b"forever", u64::MAX));
    check(&s);
}

#[test]
fn reads_treat_an_expired_value_as_absent_and_reclaim_it() {
    let s = store_with(64 * KIB, true);
    let g = put(&s, b"k", b"v", 10, 100);
    assert!(s.exists(b"k", 109));
    assert!(
        s.get(b"k", 110).is_none(),
        "deadline is now + ttl, from commit"
    );
    assert!(!s.exists(b"k", 110));
    assert!(matches!(
        s.lease_if(b"k", g, 110),
        Err(CacheError::NotFound)
    ));
    assert!(!s.delete(b"k", 110));
    let st = s.stats();
    assert_eq!((st.entries, st.used_bytes, st.expirations), (0, 0, 1));
    assert_eq!((st.hits, st.misses), (0, 1));
    assert_eq!(s.expire(1000, 10), 0, "already reclaimed");
    check(&s);
}

#[test]
fn expired_entries_make_room_even_with_eviction_off() {
    let s = store_with(16 * KIB, false);
    for i in 0..4 {
        s.put(&key(i), &[1; 4 * KIB], 10, 0).expect("put");
    }
    assert_eq!(s.put(b"new", &[2; 4 * KIB], 0, 5), Err(CacheError::Full));
    s.put(b"new", &[2; 4 * KIB], 0, 10)
        .expect("expired values gave room");
    let st = s.stats();
    assert_eq!((st.expirations, st.evictions), (1, 0));
    check(&s);
}

#[test]
fn the_deadline_heap_stays_bounded_under_overwrites() {
    let s = store_with(64 * KIB, true);
    for i in 0..5000u64 {
        s.put(b"k", b"v", 1_000_000, i).expect("put");
    }
    assert!(s.deadline_items() <= DEADLINE_HEAP_SLACK_ENTRIES + 1);
    assert_eq!(s.expire(2_000_000, 10), 1);
    check(&s);
}

/// 64 KiB pool of 4 KiB values: high watermark 0.9 is 14.4 values, low 0.8
/// is 12.8, so the 15th value evicts down to 11 + itself.
#[test]
fn eviction_past_the_high_watermark_removes_least_recently_used_first() {
    let s = store_with(64 * KIB, true);
    for i in 0..14 {
        s.put(&key(i), &pattern(i as u64, 4 * KIB), 0, 0)
            .expect("put");
    }
    assert_eq!(s.stats().evictions, 0, "below the high watermark");
    drop(s.get(&key(0), 0)); // key 0 is now the most recently used
    assert!(s.exists(&key(1), 0)); // exists is no use: key 1 stays LRU
    s.put(&key(14), &pattern(14, 4 * KIB), 0, 0).expect("put");

    let st = s.stats();
    assert_eq!(st.evictions, 3);
    assert!(st.used_bytes as f64 <= 0.9 * st.pool_bytes as f64);
    for i in 1..=3 {
        assert!(!s.exists(&key(i), 0), "key {i} was least recently used");
    }
    for i in (0..1).chain(4..15) {
        let l = s.get(&key(i), 0).expect("survivor");
        assert!(l[..] == pattern(i as u64, 4 * KIB)[..]);
    }
    check(&s);
}

#[test]
fn with_eviction_off_a_full_pool_refuses_and_changes_nothing() {
    let s = store_with(64 * KIB, false);
    let mut i = 0;
    let err = loop {
        match s.put(&key(i), &pattern(i as u64, 4 * KIB), 0, 0) {
            Ok(()) => i += 1,
            Err(e) => break e,
        }
    };
    assert_eq!(i, 16, "a full pool, no watermark, when eviction is off");
    assert_eq!(err, CacheError::Full);
    assert_eq!(err.code(), ErrorCode::InsufficientSpace);
    // An overwrite needs room beside the old value: refused too.
    assert_eq!(s.put(&key(3), b"x", 0, 0), Err(CacheError::Full));
    let st = s.stats();
    assert_eq!(
        (st.entries, st.puts, st.full_errors, st.evictions),
        (16, 16, 2, 0)
    );
    for i in 0..16 {
        assert!(s.get(&key(i), 0).expect("kept")[..] == pattern(i as u64, 4 * KIB)[..]);
    }
    check(&s);
}

#[test]
fn leased_entries_are_not_evicted() {
    let s = store_with(64 * KIB, true);
    for i in 0..14 {
        s.put(&key(i), &pattern(i as u64, 4 * KIB), 0, 0)
            .expect("put");
    }
    let lease = s.get(&key(0), 0).expect("stored");
    for i in 1..14 {
        drop(s.get(&key(i), 0)); // key 0 becomes the LRU entry
    }
    for i in 14..60 {
        s.put(&key(i), &pattern(i as u64, 4 * KIB), 0, 0)
            .expect("put");
    }
    assert!(s.stats().evictions >= 40);
    assert!(s.exists(&key(0), 0), "leased, so skipped by eviction");
    assert!(lease[..] == pattern(0, 4 * KIB)[..]);
    drop(lease);
    for i in 60..64 {
        s.put(&key(i), &pattern(i as u64, 4 * KIB), 0, 0)
            .expect("put");
    }
    assert!(!s.exists(&key(0), 0), "evicted once the lease dropped");
    check(&s);
}

#[test]
fn when_everything_is_leased_eviction_gives_up_with_full() {
    let s = store_with(16 * KIB, true);
    let leases: Vec<_> = (0..4)
        .map(|i| {
            s.put(&key(i), &[i as u8; 4 * KIB], 0, 0).expect("put");
            s.get(&key(i), 0).expect("stored")
        })
        .collect();
    assert_eq!(s.put(b"more", &[0; 4 * KIB], 0, 0), Err(CacheError::Full));
    assert_eq!(s.stats().entries, 4);
    drop(leases);
    s.put(b"more", &[0; 4 * KIB], 0, 0).expect("evicts now");
    check(&s);
}

#[test]
fn a_reservation_dropped_without_commit_leaves_no_trace() {
    let s = store_with(64 * KIB, false);
    let slot = s.reserve(b"k", 32 * KIB, 0, 0).expect("reserve");
    assert_eq!(slot.len(), 32 * KIB);
    assert_eq!(slot.key(), b"k");
    let st = s.stats();
    assert_eq!(
        (st.used_bytes, st.reserved_bytes),
        (32 * KIB as u64, 32 * KIB as u64)
    );
    assert!(!s.exists(b"k", 0), "invisible until commit");
    drop(slot);
    let st = s.stats();
    assert_eq!(
        (st.used_bytes, st.reserved_bytes, st.free_blocks),
        (0, 0, 1)
    );
    assert_eq!((st.entries, st.puts), (0, 0));

    // Over an existing value: the old value and its generation stay.
    let g = put(&s, b"k", b"old", 0, 0);
    let mut slot = s.reserve(b"k", 3, 0, 0).expect("reserve");
    slot.bytes_mut().copy_from_slice(b"new");
    drop(slot);
    let l = s.get(b"k", 0).expect("stored");
    assert_eq!((&l[..], l.generation()), (&b"old"[..], g));
    drop(l);
    check(&s);
}

#[test]
fn freed_space_is_reused_many_times_over() {
    let s = store_with(64 * KIB, false);
    // 100 x 48 KiB through a 64 KiB pool: only reuse makes this fit.
    for i in 0..100 {
        s.put(b"k", &pattern(i, 48 * KIB), 0, 0).expect("put");
        assert!(s.delete(b"k", 0));
    }
    // Overwrites free the replaced block at commit.
    for i in 0..100 {
        s.put(b"k", &pattern(i, 20 * KIB), 0, 0).expect("overwrite");
    }
    assert!(s.get(b"k", 0).expect("stored")[..] == pattern(99, 20 * KIB)[..]);
    check(&s);
}

#[test]
fn deleting_everything_coalesces_back_to_one_block() {
    let s = store_with(MIB, false);
    let sizes = [100, 5000, 64, 70_000, 1, 4096, 33_333, 800];
    for (i, &len) in sizes.iter().cycle().take(40).enumerate() {
        s.put(&key(i), &vec![i as u8; len], 0, 0).expect("put");
    }
    // Delete in an interleaved order, so merges happen on both sides.
    for start in [1, 0, 3, 2] {
        for i in (start..40).step_by(4) {
            assert!(s.delete(&key(i), 0));
        }
        check(&s);
    }
    let st = s.stats();
    assert_eq!(
        (st.free_bytes, st.free_blocks, st.used_bytes),
        (st.pool_bytes, 1, 0)
    );
    assert_eq!(st.fragmentation, 0.0);
}

#[test]
fn fragmentation_is_reported_and_evicting_mode_evicts_through_it() {
    for evict in [false, true] {
        // Watermarks at the top, so only fragmentation can trigger eviction.
        let s = CacheStore::new(CacheConfig {
            pool_bytes: 32 * KIB,
            evict,
            high_watermark: 1.0,
            low_watermark: 1.0,
            populate: false,
        })
        .expect("store");
        for i in 0..8 {
            s.put(&key(i), &[i as u8; 4 * KIB], 0, 0).expect("put");
        }
        for i in [1, 3, 5, 7] {
            assert!(s.delete(&key(i), 0));
        }
        let st = s.stats();
        assert_eq!(
            (st.free_bytes, st.largest_free_bytes),
            (16 * KIB as u64, 4 * KIB as u64)
        );
        assert_eq!(st.free_blocks, 4);
        assert!((st.fragmentation - 0.75).abs() < 1e-9);
        assert!((0.0..1.0).contains(&st.fragmentation));

        // 8 KiB fit in the free bytes, but no hole holds them.
        let r = s.put(b"wide", &[9; 8 * KIB], 0, 0);
        if evict {
            r.expect("evicting the LRU entry merges two holes");
            assert_eq!(s.stats().evictions, 1);
            assert!(!s.exists(&key(0), 0));
        } else {
            assert_eq!(r, Err(CacheError::Full));
            assert_eq!(s.stats().entries, 4);
        }
        check(&s);
    }
}

#[test]
fn bad_input_is_refused_with_its_code() {
    let s = store_with(64 * KIB, true);
    let long = vec![b'k'; CACHE_KEY_BYTES_MAX + 1];
    let cases = [
        (
            s.reserve(b"", 1, 0, 0).err(),
            CacheError::KeyEmpty,
            ErrorCode::Malformed,
        ),
        (
            s.reserve(&long, 1, 0, 0).err(),
            CacheError::KeyTooLong,
            ErrorCode::KeyTooLong,
        ),
        (
            s.reserve(b"k", CACHE_VALUE_BYTES_MAX + 1, 0, 0).err(),
            CacheError::ValueTooLarge,
            ErrorCode::ValueTooLarge,
        ),
        (
            s.reserve(b"k", 64 * KIB + 1, 0, 0).err(),
            CacheError::ValueTooLarge,
            ErrorCode::ValueTooLarge,
        ),
        (
            s.reserve(b"k", 1, TTL_MS_MAX + 1, 0).err(),
            CacheError::TtlTooLarge,
            ErrorCode::TtlTooLarge,
        ),
    ];
    for (got, want, code) in cases {
        assert_eq!(got.as_ref().map(|e| e.code()), Some(code));
        assert_eq!(got, Some(want));
    }
    assert_eq!(CacheError::NotFound.code(), ErrorCode::NotFound);
    assert_eq!(CacheError::ValueChanged.code(), ErrorCode::ValueChanged);
    assert_eq!(CacheError::Internal("x".into()).code(), ErrorCode::Internal);
    assert_eq!(s.stats().used_bytes, 0, "refusals reserve nothing");
    // The bounds themselves are accepted.
    let edge = vec![b'k'; CACHE_KEY_BYTES_MAX];
    s.put(&edge, b"v", TTL_MS_MAX, u64::MAX)
        .expect("at the bounds");
    assert!(
        s.exists(&edge, u64::MAX - 1),
        "deadline saturates, never wraps"
    );
    // Reads of impossible keys simply miss.
    assert!(s.get(b"", 0).is_none());
    assert!(!s.exists(&long, 0));
    assert!(!s.delete(b"", 0));
}

#[test]
fn hits_misses_and_deletes_are_counted() {
    let s = store_with(64 * KIB, true);
    s.put(b"a", b"1", 0, 0).expect("put");
    drop(s.get(b"a", 0));
    drop(s.get(b"b", 0));
    assert!(s.delete(b"a", 0));
    assert!(!s.delete(b"a", 0));
    let st = s.stats();
    assert_eq!((st.hits, st.misses, st.deletes, st.puts), (1, 1, 1, 1));
}

#[test]
fn the_keys_a_predicate_picks_are_dropped_and_only_those() {
    let s = store_with(MIB, true);
    for k in [&b"slot-a-1"[..], b"slot-a-2", b"slot-b-1"] {
        s.put(k, b"value", 0, 0).expect("put");
    }
    let held = s.get(b"slot-a-1", 0).expect("a lease");
    assert_eq!(s.delete_where(&|k| k.starts_with(b"slot-a")), 2);
    assert!(!s.exists(b"slot-a-1", 0) && !s.exists(b"slot-a-2", 0));
    assert!(s.exists(b"slot-b-1", 0));
    // A lease taken before keeps reading its value.
    assert_eq!(&held[..], b"value");
    drop(held);
    check(&s);
}

/// A value whose every byte is derived from its key and a nonce written in
/// its first 8 bytes, so a reader can tell a torn or misplaced value.
fn tagged_value(key: usize, nonce: u64, len: usize) -> Vec<u8> {
    let mut v = nonce.to_le_bytes().to_vec();
    v.extend_from_slice(&pattern(mix(key as u64) ^ nonce, len - 8));
    v
}

fn verify_tagged(key: usize, value: &[u8]) -> u64 {
    let Some(head) = value.get(..8) else {
        panic!(
            "value of key {key} shorter than its tag: {} bytes",
            value.len()
        );
    };
    let mut nonce = [0; 8];
    nonce.copy_from_slice(head);
    let nonce = u64::from_le_bytes(nonce);
    assert!(
        value == tagged_value(key, nonce, value.len()),
        "torn or wrong bytes under key {key}"
    );
    nonce
}

/// Four threads put (some with a TTL), read (holding some leases a while),
/// delete, expire and abandon reservations over shared keys, with eviction
/// on, in a pool smaller than the data: no reader ever sees torn bytes, bytes of another key, or
/// bytes other than those committed under the lease's generation.
#[test]
fn concurrent_readers_never_see_torn_or_wrong_bytes() {
    const THREADS: u64 = 4;
    const OPS: usize = 1500;
    const KEYS: usize = 48;
    let s = store_with(512 * KIB, true);
    // generation -> (key, nonce) of every committed value.
    let committed: Mutex<HashMap<u64, (usize, u64)>> = Mutex::new(HashMap::new());
    std::thread::scope(|scope| {
        for t in 0..THREADS {
            let s = s.clone();
            let committed = &committed;
            scope.spawn(move || {
                let mut rng = StdRng::seed_from_u64(t);
                let mut held: VecDeque<(usize, Lease)> = VecDeque::new();
                let check_lease = |k: usize, l: &Lease| {
                    let nonce = verify_tagged(k, l);
                    let known = committed
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .get(&l.generation())
                        .copied();
                    if let Some(kn) = known {
                        assert_eq!(kn, (k, nonce), "generation maps to other bytes");
                    }
                };
                for n in 0..OPS {
                    let k = rng.gen_range(0..KEYS);
                    let now = n as u64;
                    match rng.gen_range(0..100) {
                        0..=39 => {
                            let nonce = (t << 32) | n as u64;
                            let v = tagged_value(k, nonce, rng.gen_range(8..32 * KIB));
                            let ttl = if rng.gen_bool(0.2) { 50 } else { 0 };
                            match s.reserve(&key(k), v.len(), ttl, now) {
                                Ok(mut slot) => {
                                    slot.bytes_mut().copy_from_slice(&v);
                                    let g = slot.commit(now).expect("commit");
                                    committed
                                        .lock()
                                        .unwrap_or_else(|e| e.into_inner())
                                        .insert(g, (k, nonce));
                                }
                                // Possible while other threads hold leases.
                                Err(CacheError::Full) => {}
                                Err(e) => panic!("put: {e}"),
                            }
                        }
                        40..=84 => {
                            if let Some(l) = s.get(&key(k), now) {
                                check_lease(k, &l);
                                if let Ok(again) = s.lease_if(&key(k), l.generation(), now) {
                                    assert!(again[..] == l[..]);
                                }
                                held.push_back((k, l));
                                if held.len() > 3 {
                                    if let Some((hk, hl)) = held.pop_front() {
                                        // Re-read after others wrote meanwhile.
                                        check_lease(hk, &hl);
                                    }
                                }
                            }
                        }
                        85..=91 => {
                            s.delete(&key(k), now);
                        }
                        92..=94 => {
                            s.expire(now, 4);
                        }
                        _ => {
                            if let Ok(mut slot) = s.reserve(&key(k), 4 * KIB, 0, now) {
                                slot.bytes_mut().fill(0xEE);
                                // Dropped: never visible.
                            }
                        }
                    }
                }
                for (hk, hl) in held {
                    check_lease(hk, &hl);
                }
            });
        }
    });
    check(&s);
    let st = s.stats();
    assert!(st.evictions > 0, "the pool was meant to overflow");
    assert_eq!(
        (st.leased_entries, st.pending_free_bytes, st.reserved_bytes),
        (0, 0, 0)
    );
    for k in 0..KEYS {
        s.delete(&key(k), 0);
    }
    let st = s.stats();
    assert_eq!((st.used_bytes, st.free_blocks), (0, 1));
}

#[derive(Debug, Clone)]
enum Op {
    Put { key: u8, len: usize, fill: u8 },
    Get(u8),
    Delete(u8),
    Exists(u8),
    Abandon { key: u8, len: usize },
}

fn op() -> impl Strategy<Value = Op> {
    let key = 0u8..6;
    prop_oneof![
        3 => (key.clone(), 0usize..3000, any::<u8>()).prop_map(|(key, len, fill)| Op::Put { key, len, fill }),
        3 => key.clone().prop_map(Op::Get),
        1 => key.clone().prop_map(Op::Delete),
        1 => key.clone().prop_map(Op::Exists),
        1 => (key, 0usize..3000).prop_map(|(key, len)| Op::Abandon { key, len }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]

    /// With eviction off and room for everything, the store behaves as a
    /// map (plus generations that only grow), keeps every invariant, and
    /// frees the whole pool once everything is deleted.
    #[test]
    fn behaves_like_a_map(ops in proptest::collection::vec(op(), 1..120)) {
        let s = store_with(64 * KIB, false);
        let mut model: HashMap<u8, (Vec<u8>, u64)> = HashMap::new();
        let mut last_generation = 0;
        for op in ops {
            match op {
                Op::Put { key, len, fill } => {
                    let v = vec![fill; len];
                    let g = put(&s, &[b'k', key], &v, 0, 0);
                    prop_assert!(g > last_generation);
                    last_generation = g;
                    model.insert(key, (v, g));
                }
                Op::Get(key) => {
                    let got = s.get(&[b'k', key], 0);
                    let got = got.as_ref().map(|l| (&l[..], l.generation()));
                    let want = model.get(&key).map(|(v, g)| (&v[..], *g));
                    prop_assert_eq!(got, want);
                }
                Op::Delete(key) => {
                    prop_assert_eq!(s.delete(&[b'k', key], 0), model.remove(&key).is_some());
                }
                Op::Exists(key) => {
                    prop_assert_eq!(s.exists(&[b'k', key], 0), model.contains_key(&key));
                }
                Op::Abandon { key, len } => {
                    let mut slot = s.reserve(&[b'k', key], len, 0, 0).expect("room");
                    slot.bytes_mut().fill(0xAB);
                }
            }
            if let Err(e) = s.check() {
                prop_assert!(false, "{}", e);
            }
            let st = s.stats();
            prop_assert_eq!(st.entries, model.len() as u64);
            prop_assert_eq!(st.value_bytes, model.values().map(|(v, _)| v.len() as u64).sum::<u64>());
        }
        for key in model.keys() {
            prop_assert!(s.delete(&[b'k', *key], 0));
        }
        let st = s.stats();
        prop_assert_eq!((st.free_bytes, st.free_blocks), (st.pool_bytes, 1));
    }
}

#[test]
fn a_snapshot_walk_sees_the_values_at_the_cut_and_counts_no_reads() {
    let store = store_with(4 * MIB, true);
    for i in 0..100 {
        put(&store, &key(i), &pattern(i as u64, 100), 0, 1);
    }
    put(&store, b"short", b"lived", 5, 1);
    let cut = store.last_generation();
    let before = store.stats();
    // Changed between two steps of the walk: a value replaced (its old
    // one is not kept), one added after the cut, one deleted.
    let SnapshotChunk {
        values: first,
        mut next,
    } = store.snapshot_from(0, 10, cut, 2);
    assert_eq!(first.len(), 10);
    let mut seen: HashMap<Vec<u8>, Vec<u8>> = first
        .iter()
        .map(|(k, l)| (k.to_vec(), l.to_vec()))
        .collect();
    drop(first);
    put(&store, b"after", b"cut", 0, 2);
    put(&store, &key(99), b"new", 0, 2);
    store.delete(&key(98), 2);
    while let Some(from) = next {
        let chunk = store.snapshot_from(from, 10, cut, 10);
        for (k, l) in &chunk.values {
            assert!(seen.insert(k.to_vec(), l.to_vec()).is_none(), "seen twice");
        }
        next = chunk.next;
    }
    assert!(!seen.contains_key(b"after".as_slice()), "after the cut");
    assert!(!seen.contains_key(b"short".as_slice()), "expired at 10 ms");
    for i in 0..98 {
        assert_eq!(seen[&key(i)], pattern(i as u64, 100), "{i}");
    }
    assert!(!seen.contains_key(&key(98)) && !seen.contains_key(&key(99)));
    // Nothing read counts as a hit, and every lease was given back.
    let after = store.stats();
    assert_eq!((after.hits, after.misses), (before.hits, before.misses));
    check(&store);
}
