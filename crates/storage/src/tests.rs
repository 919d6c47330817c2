//! The storage tests: a conformance suite every [`ShardBackend`] passes
//! (`backend_tests!` runs each of its tests against [`FjallShard`] and
//! [`MemShard`]), then the fjall backend's own (reopening, blob files,
//! page-cache advice).

use std::ops::Bound;
use std::path::Path;

use crate::gen::GenSpec;
use crate::{
    digest_of, Digest, Durability, FjallShard, MemShard, ShardBackend, ShardOptions, ShardSnapshot,
    StorageError, Write, SHARD_KEY_BYTES_MAX,
};

fn open(dir: &Path) -> FjallShard {
    FjallShard::open(dir, &ShardOptions::default()).expect("open shard")
}

/// Runs each named conformance test (a function generic over the backend,
/// given a way to make an empty shard in a directory) against every
/// backend, each as a test of its own.
macro_rules! backend_tests {
    ($($name:ident),* $(,)?) => {
        mod fjall {
            $(
                #[test]
                fn $name() {
                    super::$name(&|dir| super::open(dir));
                }
            )*
        }
        mod mem {
            $(
                #[test]
                fn $name() {
                    super::$name(&|_| super::MemShard::new());
                }
            )*
        }
    };
}

backend_tests!(
    a_snapshot_does_not_see_later_writes,
    an_oversized_key_is_refused_and_nothing_of_its_batch_is_written,
    a_generated_shard_loads_in_order_and_its_digest_is_the_specs,
    scan_each_keeps_to_its_bounds_stops_when_told_and_sizes_values,
);

fn scan_each_keeps_to_its_bounds_stops_when_told_and_sizes_values<S: ShardBackend>(
    new: &dyn Fn(&Path) -> S,
) {
    let dir = tempfile::tempdir().expect("tempdir");
    let s = new(dir.path());
    let pairs: Vec<(Vec<u8>, Vec<u8>)> = (0..50u8)
        .map(|i| (vec![b'k', i], vec![i; usize::from(i) * 10]))
        .chain([(Vec::new(), b"the empty key".to_vec())])
        .collect();
    let writes: Vec<Write<'_>> = pairs.iter().map(|(k, v)| Write::Put(k, v)).collect();
    s.write(&writes, Durability::Sync).expect("write");
    let snap = s.snapshot();
    let visit = |from: Bound<&[u8]>, to: Bound<&[u8]>, stop_after: usize| {
        let mut seen = Vec::new();
        snap.scan_each(from, to, &mut |k, v| {
            seen.push((k.to_vec(), v.to_vec()));
            Ok(seen.len() < stop_after)
        })
        .expect("scan_each");
        seen
    };
    let all = visit(Bound::Unbounded, Bound::Unbounded, usize::MAX);
    assert_eq!(all.len(), pairs.len());
    assert_eq!(all[0].0, b"".to_vec(), "the empty key sorts first");
    let mid = visit(
        Bound::Included(&[b'k', 10][..]),
        Bound::Excluded(&[b'k', 20][..]),
        usize::MAX,
    );
    assert_eq!(mid.len(), 10);
    assert_eq!(mid[0], (vec![b'k', 10], vec![10u8; 100]));
    let scanned: Vec<_> = snap
        .scan(
            Bound::Included(&[b'k', 10][..]),
            Bound::Excluded(&[b'k', 20][..]),
        )
        .map(|p| p.expect("pair"))
        .collect();
    assert_eq!(scanned, mid, "scan and scan_each agree");
    assert_eq!(visit(Bound::Unbounded, Bound::Unbounded, 3).len(), 3);
    assert_eq!(snap.value_size(&[b'k', 7]).expect("size"), Some(70));
    assert_eq!(snap.value_size(b"absent").expect("size"), None);
    assert_eq!(digest_of(snap.as_ref()).expect("digest").pairs, 51);
}

#[test]
fn writes_survive_reopening_empty_keys_and_blob_values_included() {
    let dir = tempfile::tempdir().expect("tempdir");
    let big = vec![0xABu8; 4000];
    {
        let s = open(dir.path());
        s.write(
            &[
                Write::Put(b"", b"the empty key"),
                Write::Put(b"small", b"v"),
                Write::Put(b"big", &big),
                Write::Put(b"gone", b"x"),
            ],
            Durability::Sync,
        )
        .expect("write");
        s.write(&[Write::Delete(b"gone")], Durability::Sync)
            .expect("delete");
        assert_eq!(
            s.get(b"").expect("get").as_deref(),
            Some(&b"the empty key"[..])
        );
    }
    let s = open(dir.path());
    assert_eq!(
        s.get(b"").expect("get").as_deref(),
        Some(&b"the empty key"[..])
    );
    assert_eq!(s.get(b"small").expect("get").as_deref(), Some(&b"v"[..]));
    assert_eq!(s.get(b"big").expect("get"), Some(big));
    assert_eq!(s.get(b"gone").expect("get"), None);
    let keys: Vec<Vec<u8>> = s
        .snapshot()
        .scan(Bound::Unbounded, Bound::Unbounded)
        .map(|p| p.expect("pair").0)
        .collect();
    assert_eq!(keys, vec![b"".to_vec(), b"big".to_vec(), b"small".to_vec()]);
}

fn a_snapshot_does_not_see_later_writes<S: ShardBackend>(new: &dyn Fn(&Path) -> S) {
    let dir = tempfile::tempdir().expect("tempdir");
    let s = new(dir.path());
    s.write(
        &[Write::Put(b"a", b"1"), Write::Put(b"b", b"2")],
        Durability::Buffered,
    )
    .expect("write");
    let snap = s.snapshot();
    s.write(
        &[
            Write::Put(b"a", b"changed"),
            Write::Put(b"c", b"3"),
            Write::Delete(b"b"),
        ],
        Durability::Buffered,
    )
    .expect("write");
    let seen: Vec<_> = snap
        .scan(Bound::Unbounded, Bound::Unbounded)
        .map(|p| p.expect("pair"))
        .collect();
    assert_eq!(
        seen,
        vec![
            (b"a".to_vec(), b"1".to_vec()),
            (b"b".to_vec(), b"2".to_vec())
        ]
    );
    let from_b: Vec<_> = snap
        .scan(Bound::Excluded(&b"a"[..]), Bound::Unbounded)
        .map(|p| p.expect("pair").0)
        .collect();
    assert_eq!(from_b, vec![b"b".to_vec()]);
}

fn an_oversized_key_is_refused_and_nothing_of_its_batch_is_written<S: ShardBackend>(
    new: &dyn Fn(&Path) -> S,
) {
    let dir = tempfile::tempdir().expect("tempdir");
    let s = new(dir.path());
    let long = vec![b'k'; SHARD_KEY_BYTES_MAX + 1];
    let e = s
        .write(
            &[Write::Put(b"ok", b"v"), Write::Put(&long, b"v")],
            Durability::Sync,
        )
        .expect_err("too long");
    assert!(matches!(e, StorageError::TooLarge(_)), "{e}");
    assert_eq!(s.get(b"ok").expect("get"), None);
}

#[test]
fn the_digest_ignores_order_and_counts_every_pair() {
    let pairs = [(&b"a"[..], &b"1"[..]), (b"b", b"2"), (b"", b"3")];
    let mut fwd = Digest::default();
    pairs.iter().for_each(|(k, v)| fwd.add(k, v));
    let mut rev = Digest::default();
    pairs.iter().rev().for_each(|(k, v)| rev.add(k, v));
    assert_eq!(fwd, rev);
    assert_eq!((fwd.pairs, fwd.bytes), (3, 5));
    // A pair twice is not the same set; nor is a byte moved from the value
    // to the key.
    let mut twice = fwd;
    twice.add(b"a", b"1");
    twice.pairs -= 1;
    twice.bytes -= 2;
    assert_ne!(twice.sum, fwd.sum);
    let mut shifted = Digest::default();
    shifted.add(b"a1", b"");
    let mut plain = Digest::default();
    plain.add(b"a", b"1");
    assert_ne!(shifted.sum, plain.sum);
    // Merging the digests of disjoint parts gives the whole's.
    let mut part1 = Digest::default();
    part1.add(b"a", b"1");
    let mut part2 = Digest::default();
    part2.add(b"b", b"2");
    part2.add(b"", b"3");
    part1.merge(&part2);
    assert_eq!(part1, fwd);
}

fn a_generated_shard_loads_in_order_and_its_digest_is_the_specs<S: ShardBackend>(
    new: &dyn Fn(&Path) -> S,
) {
    let dir = tempfile::tempdir().expect("tempdir");
    let spec = GenSpec::for_size(2000 * 272, 16, 256, 7);
    assert_eq!(spec.pairs, 2000);
    let s = new(dir.path());
    let mut want = Digest::default();
    let mut k = vec![0u8; 16];
    let mut i = 0;
    let loaded = s
        .load(|key, value| {
            if i == spec.pairs {
                return Ok(false);
            }
            key.resize(16, 0);
            value.resize(256, 0);
            spec.key(i, key);
            spec.value(i, value);
            want.add(key, value);
            i += 1;
            Ok(true)
        })
        .expect("keys ascend");
    assert_eq!(loaded, spec.pairs);
    let snap = s.snapshot();
    assert_eq!(digest_of(snap.as_ref()).expect("digest"), want);
    // Another seed, other contents.
    let other = GenSpec { seed: 8, ..spec };
    let mut k2 = vec![0u8; 16];
    other.key(5, &mut k2);
    spec.key(5, &mut k);
    assert_eq!(
        k[..8],
        k2[..8],
        "the ascending prefix is the seed's to share"
    );
    assert_ne!(k, k2);
    // Samples: bounded, ascending, drawn from the shard.
    let samples = snap.sample_keys(10).expect("sample");
    assert_eq!(samples.len(), 10);
    assert!(samples.windows(2).all(|w| w[0] < w[1]));
    for key in &samples {
        assert!(s.get(key).expect("get").is_some());
    }
    // A load refuses keys out of order, and shows none of its pairs.
    let dir2 = tempfile::tempdir().expect("tempdir");
    let s2 = new(dir2.path());
    let mut order = [&b"b"[..], b"a"].into_iter();
    let e = s2.load(|key, value| {
        let Some(k) = order.next() else {
            return Ok(false);
        };
        key.clear();
        key.extend_from_slice(k);
        value.clear();
        value.push(1);
        Ok(true)
    });
    assert!(e.is_err());
    assert_eq!(s2.get(b"b").expect("get"), None);
}

/// The permission bits of `path`.
fn mode_of(path: &Path) -> u32 {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).expect("stat").permissions().mode() & 0o7777
}

/// Regression: a new shard's directory and the directories
/// fjall made in it were group and world readable (0755 under the usual
/// umask), so any user of the host could read every pair.
#[test]
fn a_new_shard_is_its_owners_only() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().expect("tempdir");
    // A parent others may enter, as /srv or /var/lib are.
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755))
        .expect("chmod parent");
    for path in [dir.path().join("new"), dir.path().join("a/b/nested")] {
        let s = open(&path);
        s.write(&[Write::Put(b"k", b"v")], Durability::Sync)
            .expect("write");
        assert_eq!(mode_of(&path), crate::SHARD_DIR_MODE, "{}", path.display());
        assert_eq!(
            crate::dirs_open_to_others(&path).expect("walk"),
            Vec::<std::path::PathBuf>::new()
        );
    }
    // An existing empty directory given for a new shard is made private.
    let empty = dir.path().join("empty");
    std::fs::create_dir(&empty).expect("mkdir");
    std::fs::set_permissions(&empty, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    drop(open(&empty));
    assert_eq!(mode_of(&empty), crate::SHARD_DIR_MODE);
    // The parents are not the shard's: left as mkdir -p makes them.
    assert_eq!(mode_of(dir.path()), 0o755);
}

/// Regression: `shard gen` left its files and directories
/// readable by every user.
#[test]
fn a_generated_shard_is_its_owners_only() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("g");
    let spec = GenSpec::for_size(64 << 10, 8, 100, 1);
    crate::gen::generate(&path, &spec, &mut |_| {}).expect("generate");
    assert_eq!(mode_of(&path), crate::SHARD_DIR_MODE);
    let mut todo = vec![path.clone()];
    let mut files = 0;
    while let Some(p) = todo.pop() {
        let mode = mode_of(&p);
        assert_eq!(mode & 0o077, 0, "{} has mode {mode:o}", p.display());
        if p.is_dir() {
            todo.extend(
                std::fs::read_dir(&p)
                    .expect("ls")
                    .map(|e| e.expect("entry").path()),
            );
        } else {
            files += 1;
        }
    }
    assert!(files > 0, "the walk saw the shard's files");
}

#[test]
fn opening_a_file_or_a_missing_shard_without_create_is_an_error() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("f");
    std::fs::write(&file, b"x").expect("write");
    assert!(matches!(
        FjallShard::open(&file, &ShardOptions::default()),
        Err(StorageError::NotAShard(_))
    ));
    let missing = dir.path().join("none");
    let opts = ShardOptions {
        create: false,
        ..ShardOptions::default()
    };
    assert!(matches!(
        FjallShard::open(&missing, &opts),
        Err(StorageError::NotAShard(_))
    ));
}

/// A value of `len` bytes that names its key and version.
fn versioned(key: u32, version: u32, len: usize) -> Vec<u8> {
    let seed = u64::from(key) << 32 | u64::from(version);
    (0..len)
        .map(|i| {
            (seed
                .wrapping_mul(0x9e37_79b9_7f4a_7c15)
                .rotate_left(i as u32 % 64)
                >> 7) as u8
                ^ i as u8
        })
        .collect()
}

fn scan_each_pairs(
    snap: &dyn ShardSnapshot,
    from: Bound<&[u8]>,
    to: Bound<&[u8]>,
) -> Vec<(Vec<u8>, Vec<u8>)> {
    let mut got = Vec::new();
    snap.scan_each(from, to, &mut |k, v| {
        got.push((k.to_vec(), v.to_vec()));
        Ok(true)
    })
    .expect("scan_each");
    got
}

#[test]
fn scan_each_reads_separated_values_as_the_engine_does_across_files_and_versions() {
    use std::collections::BTreeMap;
    let dir = tempfile::tempdir().expect("tempdir");
    let s = open(dir.path());
    let mut model: BTreeMap<Vec<u8>, Vec<u8>> = BTreeMap::new();
    let key = |i: u32| format!("key{i:05}").into_bytes();
    let put = |s: &FjallShard, model: &mut BTreeMap<_, _>, i: u32, version: u32, len: usize| {
        let v = versioned(i, version, len);
        s.write(&[Write::Put(&key(i), &v)], Durability::Buffered)
            .expect("put");
        model.insert(key(i), v);
    };
    // Inline (< 128 bytes), separated, and one larger than a read window.
    for i in 0..600u32 {
        let len = match i % 4 {
            0 => 40,
            1 => 128,
            2 => 300,
            _ => 2000,
        };
        put(&s, &mut model, i, 0, if i == 301 { 700 << 10 } else { len });
    }
    s.flush_for_test();
    // Overwrites into a second blob file: big to small, small to big, big
    // to big of the same size; and deletes.
    for i in (0..600u32).step_by(3) {
        let len = match i % 4 {
            0 => 900,
            1 => 12,
            _ => 300,
        };
        put(&s, &mut model, i, 1, len);
    }
    for i in (1..600u32).step_by(7) {
        s.write(&[Write::Delete(&key(i))], Durability::Buffered)
            .expect("delete");
        model.remove(&key(i));
    }
    s.flush_for_test();
    // Still in the memtable when the snapshot is taken.
    for i in (2..600u32).step_by(11) {
        put(&s, &mut model, i, 2, 300);
    }
    let snap = s.snapshot();
    let want: Vec<(Vec<u8>, Vec<u8>)> = model.clone().into_iter().collect();
    // Later writes, flushes and a compaction must not show.
    for i in (0..600u32).step_by(5) {
        put(&s, &mut model, i, 3, 300);
    }
    s.write(&[Write::Delete(&key(4))], Durability::Buffered)
        .expect("delete");
    model.remove(&key(4));
    s.flush_for_test();
    s.compact_for_test();

    let all = scan_each_pairs(snap.as_ref(), Bound::Unbounded, Bound::Unbounded);
    assert_eq!(all.len(), want.len());
    assert!(all == want, "a full scan differs from the model");
    let engine: Vec<_> = snap
        .scan(Bound::Unbounded, Bound::Unbounded)
        .map(|p| p.expect("pair"))
        .collect();
    assert!(all == engine, "scan_each differs from the engine's scan");
    // Bounded ranges see the same pairs as the engine's.
    let (a, b) = (key(123), key(456));
    let part = scan_each_pairs(snap.as_ref(), Bound::Included(&a), Bound::Excluded(&b));
    let engine_part: Vec<_> = snap
        .scan(Bound::Included(&a), Bound::Excluded(&b))
        .map(|p| p.expect("pair"))
        .collect();
    assert!(!part.is_empty() && part == engine_part);
    // The visitor stops the scan.
    let mut seen = 0;
    snap.scan_each(Bound::Unbounded, Bound::Unbounded, &mut |_, _| {
        seen += 1;
        Ok(seen < 10)
    })
    .expect("scan_each");
    assert_eq!(seen, 10);
    // A fresh snapshot sees the later writes.
    let now = scan_each_pairs(s.snapshot().as_ref(), Bound::Unbounded, Bound::Unbounded);
    assert!(now == model.into_iter().collect::<Vec<_>>());
}

#[test]
fn a_damaged_blob_file_fails_the_scan_instead_of_returning_a_wrong_value() {
    let dir = tempfile::tempdir().expect("tempdir");
    {
        let s = open(dir.path());
        for i in 0..50u32 {
            let v = versioned(i, 0, 1000);
            s.write(&[Write::Put(&i.to_be_bytes(), &v)], Durability::Buffered)
                .expect("put");
        }
        s.flush_for_test();
    }
    // Flip one byte in the middle of the (only) blob file.
    let mut blob_files = Vec::new();
    let mut stack = vec![dir.path().to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).expect("read_dir").flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else if is_blob_file(&p) {
                blob_files.push(p);
            }
        }
    }
    assert_eq!(blob_files.len(), 1, "{blob_files:?}");
    let mut bytes = std::fs::read(&blob_files[0]).expect("read");
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0x40;
    std::fs::write(&blob_files[0], &bytes).expect("write");
    let s = open(dir.path());
    let e = s
        .snapshot()
        .scan_each(Bound::Unbounded, Bound::Unbounded, &mut |_, _| Ok(true))
        .expect_err("a damaged blob must fail the scan");
    // The scan's own blob reader found it (it names the file and offset).
    assert!(
        matches!(&e, StorageError::Engine(m) if m.contains("blob file") && m.contains("checksum mismatch")),
        "{e}"
    );
}

#[test]
fn a_pair_hashes_as_xxh3_of_key_length_key_and_value_at_every_size() {
    // The stack copy for short pairs must give the streaming definition's
    // value, or digests would change with a pair's size across the limit.
    for (klen, vlen) in [
        (0, 0),
        (16, 128),
        (16, 256),
        (16, 1000),
        (0, 1016),
        (3, 1014),
        (40, 4000),
    ] {
        let key: Vec<u8> = (0..klen).map(|i| i as u8 ^ 0x5a).collect();
        let value: Vec<u8> = (0..vlen).map(|i| (i * 31 % 251) as u8).collect();
        let mut h = xxhash_rust::xxh3::Xxh3::new();
        h.update(&(klen as u64).to_le_bytes());
        h.update(&key);
        h.update(&value);
        assert_eq!(
            crate::PairDigest::of(&key, &value).0,
            h.digest128(),
            "key {klen} B, value {vlen} B"
        );
    }
}

#[test]
fn dropping_cached_pages_keeps_every_pair_and_tracks_each_file_at_its_length() {
    let dir = tempfile::tempdir().expect("tempdir");
    let s = open(dir.path());
    let load = |from: u32, to: u32| {
        let mut i = from;
        s.load(|key, value| {
            if i == to {
                return Ok(false);
            }
            key.clear();
            key.extend_from_slice(&i.to_be_bytes());
            *value = versioned(i, 0, 300);
            i += 1;
            Ok(true)
        })
        .expect("load")
    };
    let blob_files = |advised: &std::collections::HashMap<std::path::PathBuf, u64>| {
        advised.keys().filter(|p| is_blob_file(p)).count()
    };
    load(0, 500);
    let before = digest_of(s.snapshot().as_ref()).expect("digest");
    s.drop_cached_pages();
    let first = s.advised_for_test();
    assert!(
        blob_files(&first) > 0,
        "the blob files are advised: {first:?}"
    );
    for (path, len) in &first {
        assert_eq!(
            std::fs::metadata(path).map(|m| m.len()).ok(),
            Some(*len),
            "{}",
            path.display()
        );
    }
    assert_eq!(digest_of(s.snapshot().as_ref()).expect("digest"), before);
    // A second load adds files; the first load's stay as they were.
    load(500, 900);
    s.drop_cached_pages();
    let second = s.advised_for_test();
    assert!(second.len() > first.len());
    assert!(blob_files(&second) > blob_files(&first));
    let snap = s.snapshot();
    assert_eq!(digest_of(snap.as_ref()).expect("digest").pairs, 900);
    assert_eq!(
        s.get(&899u32.to_be_bytes()).expect("get"),
        Some(versioned(899, 0, 300))
    );
}

/// Whether `p` is one of a shard's blob files (they live in `blobs/`).
fn is_blob_file(p: &std::path::Path) -> bool {
    p.parent().and_then(|d| d.file_name()) == Some("blobs".as_ref())
}
