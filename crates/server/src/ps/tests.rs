//! The PS service without sockets: frames in, replies out.

use super::*;
use fabrickv_transport::TransportError;
use fabrickv_types::limits::PS_DIM_MAX;
use fabrickv_wire::control::decode_error;
use fabrickv_wire::ps::{
    decode_desc, decode_list, decode_reply, encode_create, encode_list, encode_open, encode_pull,
    encode_push, PsReply,
};
use fabrickv_wire::ps::{f32s_from_le, init_vector, Missing, Optimizer, TableDesc};
use fabrickv_wire::{decode_frame, FrameKind};

const NOW: u64 = 1;

fn store() -> Arc<PsStore> {
    let cfg = PsConfig {
        pool_bytes: 8 << 20,
        pool: PoolOptions::default(),
        tables: Vec::new(),
    };
    Arc::new(PsStore::new(cfg, 1))
}

fn call(s: &mut PsService, req: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    serve(s, req, &mut out);
    out
}

/// Serves `req` as a worker would (decode, handle, refuse).
fn serve(s: &mut PsService, req: &[u8], reply: &mut dyn Reply) {
    crate::service::serve_one(s, 0, 0, req, reply, NOW);
}

fn reply(out: &[u8]) -> PsReply<'_> {
    let f = decode_frame(out).unwrap();
    if f.header.kind == FrameKind::Error {
        let (code, why) = decode_error(&f).unwrap();
        panic!("error reply {code}: {why}");
    }
    decode_reply(&f).unwrap()
}

fn error_code(out: &[u8]) -> ErrorCode {
    let f = decode_frame(out).unwrap();
    assert_eq!(f.header.kind, FrameKind::Error, "expected an ERROR frame");
    decode_error(&f).unwrap().0
}

fn create(s: &mut PsService, spec: &TableSpec) -> TableDesc {
    let mut req = Vec::new();
    encode_create(&mut req, 1, 0, spec);
    let out = call(s, &req);
    decode_desc(reply(&out).rest).unwrap().0
}

fn vec_of(dim: usize, x: f32) -> Vec<f32> {
    (0..dim).map(|i| x + i as f32).collect()
}

fn push(s: &mut PsService, t: u32, mode: PushMode, keys: &[u64], vals: &[f32]) -> (ErrorCode, u32) {
    let mut req = Vec::new();
    encode_push(&mut req, 2, 0, t, mode, keys, vals, None);
    let out = call(s, &req);
    let r = reply(&out);
    (
        r.status,
        u32::from_le_bytes(r.rest[..4].try_into().unwrap()),
    )
}

/// Pulls inline; returns the vectors and found flags.
fn pull(s: &mut PsService, t: u32, dim: usize, keys: &[u64]) -> (Vec<f32>, Vec<bool>) {
    let mut req = Vec::new();
    encode_pull(&mut req, 3, 0, t, keys, None);
    let out = call(s, &req);
    let r = reply(&out);
    let bm = bitmap_bytes(keys.len());
    let mut v = vec![0f32; keys.len() * dim];
    f32s_from_le(&r.rest[bm..], &mut v);
    assert_eq!(r.rest.len(), bm + keys.len() * dim * 4);
    let found = (0..keys.len())
        .map(|i| r.rest[i / 8] & (1 << (i % 8)) != 0)
        .collect();
    (v, found)
}

#[test]
fn put_then_pull_returns_vectors_in_request_order_with_found_bits() {
    let mut s = PsService::new(0, store());
    let t = create(&mut s, &TableSpec::new("emb", 4));
    assert_eq!(t.id, 1);
    let keys = [10u64, 20, 30];
    let vals: Vec<f32> = keys.iter().flat_map(|k| vec_of(4, *k as f32)).collect();
    assert_eq!(
        push(&mut s, t.id, PushMode::Overwrite, &keys, &vals),
        (ErrorCode::Ok, 3)
    );
    let (v, found) = pull(&mut s, t.id, 4, &[30, 99, 10]);
    assert_eq!(&v[..4], &vec_of(4, 30.0)[..]);
    assert_eq!(&v[4..8], &[0.0; 4], "missing keys are zeros by default");
    assert_eq!(&v[8..], &vec_of(4, 10.0)[..]);
    assert_eq!(found, vec![true, false, true]);
}

/// On a server that replicates, a pull's reply need not wait for a round
/// ([`fabrickv_rpc::gate::reply_settled`]) only while no row it read has
/// a write of its set of keys in flight, and never before the replicator
/// took the shards' counts (nothing says then what followers have).
#[test]
fn a_pull_is_settled_only_while_no_push_of_its_rows_is_in_flight() {
    use fabrickv_rpc::gate::{request_begins, request_is_settled};
    let st = store();
    let mut s = PsService::new(0, st.clone());
    let t = create(&mut s, &TableSpec::new("emb", 4));
    st.enable_journals();
    let settled = |s: &mut PsService, keys: &[u64]| {
        request_begins();
        pull(s, t.id, 4, keys);
        request_is_settled()
    };
    assert!(!settled(&mut s, &[1]), "the counts are not taken yet");
    let seqs = st.journal_seqs().expect("the pool keeps journals");
    assert!(settled(&mut s, &[1]), "nothing written");
    assert_eq!(
        push(&mut s, t.id, PushMode::Overwrite, &[1], &vec_of(4, 1.0)),
        (ErrorCode::Ok, 1)
    );
    assert!(!settled(&mut s, &[1]), "its push is in flight");
    let quiet = (2u64..)
        .find(|&k| {
            let h = item_hash(t.id, k);
            seqs[h.partition(seqs.len() as u32) as usize].key_settled(h)
        })
        .expect("a row of another set");
    assert!(settled(&mut s, &[quiet]), "a row of another set");
    assert!(!settled(&mut s, &[quiet, 1]), "one row's push in flight");
    for q in &seqs {
        q.mark_replicated(q.get());
    }
    assert!(settled(&mut s, &[quiet, 1]), "the push is replicated");
}

#[test]
fn missing_keys_can_return_the_initializer() {
    let mut s = PsService::new(0, store());
    let spec = TableSpec {
        missing: Missing::Init,
        seed: 5,
        ..TableSpec::new("init", 8)
    };
    let t = create(&mut s, &spec);
    let (v, found) = pull(&mut s, t.id, 8, &[7]);
    let mut want = vec![0f32; 8];
    init_vector(5, 7, &mut want);
    assert_eq!(v, want);
    assert_eq!(
        found,
        vec![false],
        "an initialized vector is still reported absent"
    );
    assert_eq!(s.store.list()[0].items, 0, "a pull inserts nothing");
}

#[test]
fn sgd_and_adagrad_apply_gradients_atomically_per_key() {
    let mut s = PsService::new(0, store());
    let sgd = create(
        &mut s,
        &TableSpec {
            lr: 0.5,
            ..TableSpec::new("sgd", 2)
        },
    );
    push(&mut s, sgd.id, PushMode::Overwrite, &[1], &[1.0, 2.0]);
    push(
        &mut s,
        sgd.id,
        PushMode::Gradient,
        &[1, 1],
        &[2.0, 2.0, 2.0, 2.0],
    );
    assert_eq!(
        pull(&mut s, sgd.id, 2, &[1]).0,
        vec![-1.0, 0.0],
        "two steps of 0.5 * 2"
    );

    let ada = create(
        &mut s,
        &TableSpec {
            optimizer: Optimizer::Adagrad,
            lr: 1.0,
            ..TableSpec::new("ada", 1)
        },
    );
    push(&mut s, ada.id, PushMode::Overwrite, &[1], &[0.0]);
    push(&mut s, ada.id, PushMode::Gradient, &[1], &[3.0]);
    let acc = ADAGRAD_INITIAL_ACCUMULATOR + 9.0;
    let want = -3.0 / (acc.sqrt() + ADAGRAD_EPSILON);
    let got = pull(&mut s, ada.id, 1, &[1]).0[0];
    assert!((got - want).abs() < 1e-6, "{got} vs {want}");

    // A gradient on an absent key starts from the initializer.
    push(&mut s, sgd.id, PushMode::Gradient, &[9], &[1.0, 1.0]);
    let mut init = vec![0f32; 2];
    init_vector(0, 9, &mut init);
    let (v, found) = pull(&mut s, sgd.id, 2, &[9]);
    assert_eq!(v, vec![init[0] - 0.5, init[1] - 0.5]);
    assert_eq!(found, vec![true]);
}

#[test]
fn tables_are_created_once_opened_by_name_and_listed() {
    let mut s = PsService::new(0, store());
    let a = create(&mut s, &TableSpec::new("a", 4));
    assert_eq!(
        create(&mut s, &TableSpec::new("a", 4)).id,
        a.id,
        "same shape: same table"
    );
    let mut req = Vec::new();
    encode_create(&mut req, 1, 0, &TableSpec::new("a", 8));
    assert_eq!(error_code(&call(&mut s, &req)), ErrorCode::TableExists);
    req.clear();
    encode_open(&mut req, 1, 0, "a");
    assert_eq!(
        decode_desc(reply(&call(&mut s, &req)).rest).unwrap().0.id,
        a.id
    );
    req.clear();
    encode_open(&mut req, 1, 0, "nope");
    assert_eq!(error_code(&call(&mut s, &req)), ErrorCode::NoSuchTable);
    create(&mut s, &TableSpec::new("b", 2));
    req.clear();
    encode_list(&mut req, 1, 0);
    let names: Vec<_> = decode_list(reply(&call(&mut s, &req)).rest)
        .unwrap()
        .into_iter()
        .map(|d| d.spec.name)
        .collect();
    assert_eq!(names, vec!["a", "b"]);
}

#[test]
fn bad_requests_get_stable_codes_and_change_nothing() {
    let mut s = PsService::new(0, store());
    let t = create(&mut s, &TableSpec::new("t", 4));
    push(&mut s, t.id, PushMode::Overwrite, &[1], &[1.0; 4]);
    let mut req = Vec::new();
    // Wrong dimension: 3 floats for a 4-wide table.
    encode_push(
        &mut req,
        1,
        0,
        t.id,
        PushMode::Overwrite,
        &[1],
        &[9.0; 3],
        None,
    );
    let code = error_code(&call(&mut s, &req));
    assert!(
        matches!(code, ErrorCode::BadDimension | ErrorCode::Malformed),
        "{code}"
    );
    // Unknown table.
    req.clear();
    encode_pull(&mut req, 1, 0, 77, &[1], None);
    assert_eq!(error_code(&call(&mut s, &req)), ErrorCode::NoSuchTable);
    // Bad dimension at creation.
    req.clear();
    encode_create(
        &mut req,
        1,
        0,
        &TableSpec::new("huge", PS_DIM_MAX as u32 + 1),
    );
    assert_eq!(error_code(&call(&mut s, &req)), ErrorCode::BadDimension);
    // Garbage.
    assert_eq!(
        error_code(&call(&mut s, b"garbage that is not a frame at all..")),
        ErrorCode::Malformed
    );
    assert_eq!(
        pull(&mut s, t.id, 4, &[1]).0,
        vec![1.0; 4],
        "nothing changed"
    );
}

#[test]
fn a_full_pool_reports_the_applied_prefix() {
    let mut s = PsService::new(0, store());
    let t = create(&mut s, &TableSpec::new("big", 4096));
    // 8 MiB pool, 16 KiB vectors: it fills after a few hundred keys.
    let mut applied_total = 0;
    let mut status = ErrorCode::Ok;
    let mut next = 0u64;
    while status == ErrorCode::Ok {
        let keys: Vec<u64> = (next..next + 50).collect();
        let vals = vec![1.5f32; 50 * 4096];
        let (st, applied) = push(&mut s, t.id, PushMode::Overwrite, &keys, &vals);
        status = st;
        applied_total += applied;
        next += 50;
        assert!(next < 10_000, "an 8 MiB pool cannot hold this much");
    }
    assert_eq!(status, ErrorCode::InsufficientSpace);
    assert_eq!(s.store.list()[0].items, u64::from(applied_total));
    let (v, found) = pull(&mut s, t.id, 4096, &[0, u64::from(applied_total) - 1]);
    assert_eq!(found, vec![true, true]);
    assert!(v.iter().all(|x| *x == 1.5));
}

/// A reply whose peer region is plain memory: a transport with a mapped
/// view (like shm) when `mapped`, one that must copy otherwise (like
/// fabric).
struct RegionReply {
    buf: Vec<u8>,
    region: RemoteRegion,
    mem: Vec<u8>,
    mapped: bool,
}

impl Reply for RegionReply {
    fn buf(&mut self) -> &mut Vec<u8> {
        &mut self.buf
    }

    fn write_remote(
        &mut self,
        r: &RemoteRegion,
        offset: usize,
        data: &[u8],
    ) -> fabrickv_transport::Result<()> {
        if *r != self.region {
            return Err(TransportError::BadRegion("unknown".into()));
        }
        r.check(offset, data.len())?;
        self.mem[offset..offset + data.len()].copy_from_slice(data);
        Ok(())
    }

    fn remote_mut(
        &mut self,
        r: &RemoteRegion,
        offset: usize,
        len: usize,
    ) -> fabrickv_transport::Result<Option<&mut [u8]>> {
        if !self.mapped {
            return Ok(None);
        }
        if *r != self.region {
            return Err(TransportError::BadRegion("unknown".into()));
        }
        r.check(offset, len)?;
        Ok(Some(&mut self.mem[offset..offset + len]))
    }
}

#[test]
fn one_sided_pulls_land_in_the_region_and_overruns_write_nothing() {
    for mapped in [true, false] {
        let mut s = PsService::new(0, store());
        let t = create(&mut s, &TableSpec::new("os", 2));
        push(
            &mut s,
            t.id,
            PushMode::Overwrite,
            &[1, 2],
            &[1.0, 2.0, 3.0, 4.0],
        );
        let region = RemoteRegion {
            addr: 1,
            len: 64,
            key: 42,
        };
        let mut enc = Vec::new();
        region.encode(&mut enc);
        let mut dest = PullDest {
            region: enc.try_into().unwrap(),
            offset: 8,
        };
        let mut r = RegionReply {
            buf: Vec::new(),
            region,
            mem: vec![0xAA; 64],
            mapped,
        };
        let mut req = Vec::new();
        encode_pull(&mut req, 5, 0, t.id, &[2, 3, 1], Some(&dest));
        serve(&mut s, &req, &mut r);
        let rep = reply(&r.buf);
        assert_eq!(rep.rest.len(), bitmap_bytes(3), "no inline values");
        assert_eq!(rep.rest[0], 0b101);
        let mut v = [0f32; 6];
        f32s_from_le(&r.mem[8..32], &mut v);
        assert_eq!(v, [3.0, 4.0, 0.0, 0.0, 1.0, 2.0]);
        assert!(
            r.mem[..8].iter().chain(&r.mem[32..]).all(|b| *b == 0xAA),
            "nothing outside"
        );

        // 3 vectors of 8 bytes at offset 48 overrun a 64-byte region.
        dest.offset = 48;
        r.buf.clear();
        let before = r.mem.clone();
        req.clear();
        encode_pull(&mut req, 6, 0, t.id, &[2, 3, 1], Some(&dest));
        serve(&mut s, &req, &mut r);
        assert_eq!(error_code(&r.buf), ErrorCode::Malformed);
        assert_eq!(r.mem, before, "an overrun writes nothing");
    }
}

#[test]
fn a_pull_through_a_transport_without_one_sided_writes_is_refused() {
    let mut s = PsService::new(0, store());
    let t = create(&mut s, &TableSpec::new("x", 2));
    let region = RemoteRegion {
        addr: 1,
        len: 64,
        key: 1,
    };
    let mut enc = Vec::new();
    region.encode(&mut enc);
    let dest = PullDest {
        region: enc.try_into().unwrap(),
        offset: 0,
    };
    let mut req = Vec::new();
    encode_pull(&mut req, 1, 0, t.id, &[1], Some(&dest));
    assert_eq!(error_code(&call(&mut s, &req)), ErrorCode::Malformed);
}

#[test]
fn the_pool_is_built_by_the_first_table_with_a_clear_error_when_it_cannot_be() {
    let cfg = PsConfig {
        pool_bytes: 8 << 20,
        pool: PoolOptions {
            hugepages: true,
            ..PoolOptions::default()
        },
        tables: Vec::new(),
    };
    let st = Arc::new(PsStore::new(cfg, 1));
    assert!(st.shards().is_none(), "no pool before the first table");
    match st.create(&TableSpec::new("t", 4)) {
        Ok(_) => assert!(st.shards().is_some()),
        Err((code, why)) => {
            assert_eq!(code, ErrorCode::PoolUnavailable);
            assert!(why.contains("nr_hugepages"), "{why}");
            assert!(st.list().is_empty(), "no table without its pool");
        }
    }
}

/// This process's resident memory (`VmRSS`), in bytes.
fn rss_bytes() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("status");
    let kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|r| r.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .expect("VmRSS");
    kb * 1024
}

/// Regression: one CREATE built, zeroed and locked the
/// whole pool before anything asked whether the process could lock it; as
/// root (no RLIMIT_MEMLOCK) the server's RSS went from 86 MB to 1.4 GB.
/// A pool beyond what may be locked is now refused before a page is
/// touched.
#[test]
fn a_pool_beyond_the_lock_limit_is_refused_before_it_is_built() {
    const POOL_BYTES: u64 = 256 << 20;
    /// RSS the refusal may cost (allocator noise), far below the pool.
    const RSS_GROWTH_BYTES_MAX: u64 = 16 << 20;
    let cfg = PsConfig {
        pool_bytes: POOL_BYTES,
        ..PsConfig::default()
    };
    assert!(cfg.pool.lock, "the default pool is locked");
    let tight = || MemoryBudget {
        lock_limit_bytes: Some(64 << 10),
        locked_bytes: 0,
        available_bytes: None,
    };
    let st = Arc::new(PsStore::new(cfg, 1).with_budget(tight));
    assert!(st.check_budget().is_err(), "said at start-up");
    let before = rss_bytes();
    let (code, why) = st
        .create(&TableSpec::new("t", 4))
        .expect_err("a pool beyond RLIMIT_MEMLOCK");
    let grown = rss_bytes().saturating_sub(before);
    assert_eq!(code, ErrorCode::PoolUnavailable);
    assert!(why.contains("RLIMIT_MEMLOCK"), "{why}");
    assert!(grown < RSS_GROWTH_BYTES_MAX, "RSS grew by {grown} bytes");
    assert!(st.shards().is_none() && st.list().is_empty());
    // Through the service, as a client's CREATE frame.
    let mut svc = PsService::new(0, st.clone());
    let mut req = Vec::new();
    encode_create(&mut req, 1, 0, &TableSpec::new("t2", 4));
    assert_eq!(
        error_code(&call(&mut svc, &req)),
        ErrorCode::PoolUnavailable
    );
    assert!(rss_bytes().saturating_sub(before) < RSS_GROWTH_BYTES_MAX);
}

/// Pulls spanning every shard and pushes to the same keys, from four
/// threads at once: every pull finishes (the shard read locks a pull holds
/// cannot deadlock against writers) and no pulled vector is torn, since a
/// push replaces a key's vector whole under the shard's write lock.
#[test]
fn concurrent_pulls_and_pushes_neither_deadlock_nor_tear_vectors() {
    const DIM: usize = 16;
    const KEYS: u64 = 400;
    const ROUNDS: usize = 300;
    let st = Arc::new(PsStore::new(
        PsConfig {
            pool_bytes: 8 << 20,
            pool: PoolOptions::default(),
            tables: Vec::new(),
        },
        2,
    ));
    let t = create(
        &mut PsService::new(0, st.clone()),
        &TableSpec::new("emb", DIM as u32),
    )
    .id;
    let all: Vec<u64> = (1..=KEYS).collect();
    let mut init = Vec::new();
    for &k in &all {
        init.extend(vec_of(DIM, k as f32 * 1000.0));
    }
    let mut s0 = PsService::new(0, st.clone());
    assert_eq!(
        push(&mut s0, t, PushMode::Overwrite, &all, &init),
        (ErrorCode::Ok, KEYS as u32)
    );
    let threads: Vec<_> = (0..4u16)
        .map(|w| {
            let st = st.clone();
            std::thread::spawn(move || {
                let mut s = PsService::new(w % 2, st);
                let mut x = u64::from(w) + 1;
                for round in 0..ROUNDS {
                    // A different 100-key window each round, reversed
                    // half the time, so pulls lock shards in every mix.
                    x = x
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(1442695040888963407);
                    let start = (x >> 33) % (KEYS - 100);
                    let mut keys: Vec<u64> = (start + 1..=start + 100).collect();
                    if round % 2 == 1 {
                        keys.reverse();
                    }
                    if w < 2 {
                        let (v, found) = pull(&mut s, t, DIM, &keys);
                        assert!(found.iter().all(|&f| f));
                        for vec in v.chunks_exact(DIM) {
                            for (i, &f) in vec.iter().enumerate() {
                                assert_eq!(f, vec[0] + i as f32, "torn vector {vec:?}");
                            }
                        }
                    } else {
                        let vals: Vec<f32> = keys
                            .iter()
                            .flat_map(|&k| vec_of(DIM, (k * 1000 + round as u64) as f32))
                            .collect();
                        assert_eq!(
                            push(&mut s, t, PushMode::Overwrite, &keys, &vals),
                            (ErrorCode::Ok, 100)
                        );
                    }
                }
            })
        })
        .collect();
    for th in threads {
        th.join().expect("a pull or push thread failed");
    }
}

/// A gradient push under request id `id`; returns the status (the
/// frame's, or the refusal's code) and the keys applied.
fn push_once(
    s: &mut PsService,
    t: u32,
    keys: &[u64],
    grads: &[f32],
    id: PushId,
) -> (ErrorCode, u32) {
    let mut req = Vec::new();
    encode_push(&mut req, 4, 0, t, PushMode::Gradient, keys, grads, Some(id));
    let out = call(s, &req);
    if decode_frame(&out).unwrap().header.kind == FrameKind::Error {
        return (error_code(&out), 0);
    }
    let r = reply(&out);
    (
        r.status,
        u32::from_le_bytes(r.rest[..4].try_into().unwrap()),
    )
}

#[test]
fn a_push_sent_again_under_its_id_is_answered_not_applied() {
    let mut s = PsService::new(0, store());
    let spec = TableSpec {
        optimizer: Optimizer::Sgd,
        lr: 1.0,
        ..TableSpec::new("once", 2)
    };
    let t = create(&mut s, &spec).id;
    push(&mut s, t, PushMode::Overwrite, &[1, 2], &[0.0; 4]);
    let id = PushId { client: 9, seq: 5 };
    for _ in 0..3 {
        assert_eq!(
            push_once(&mut s, t, &[1, 2], &[-1.0; 4], id),
            (ErrorCode::Ok, 2)
        );
    }
    assert_eq!(pull(&mut s, t, 2, &[1, 2]).0, [1.0; 4], "applied once");
    // The client's next push applies; one older than it, arriving late,
    // is refused.
    let next = PushId { client: 9, seq: 6 };
    assert_eq!(
        push_once(&mut s, t, &[1, 2], &[-1.0; 4], next),
        (ErrorCode::Ok, 2)
    );
    assert_eq!(
        push_once(&mut s, t, &[1, 2], &[-1.0; 4], id).0,
        ErrorCode::ConditionFailed
    );
    // Another client's push of the same seq is its own.
    let other = PushId { client: 10, seq: 5 };
    assert_eq!(
        push_once(&mut s, t, &[1, 2], &[-1.0; 4], other),
        (ErrorCode::Ok, 2)
    );
    assert_eq!(pull(&mut s, t, 2, &[1, 2]).0, [3.0; 4]);
}

#[test]
fn a_follower_keeps_a_pushs_marker_shipped_before_any_table_of_its_own() {
    let primary = store();
    let id = PushId { client: 77, seq: 3 };
    primary.ensure_pool().unwrap();
    assert_eq!(primary.check_marker(id, 42, NOW), replica::Seen::New);
    assert_eq!(primary.check_marker(id, 42, NOW), replica::Seen::Applying);
    primary.answer_marker(id, 42, ErrorCode::Ok, 3, NOW);
    // What a stream would ship: every row of the primary's pool.
    let mut rows = Vec::new();
    for shard in 0..primary.shard_count() {
        let mut bucket = 0;
        loop {
            let next = primary.scan_rows(shard, bucket, NOW, &|_| true, &mut |t, k, st| {
                if let replica::RowState::Present { value, expire_ms } = st {
                    rows.push((t, k, value.to_vec(), expire_ms));
                }
            });
            match next {
                Some(b) => bucket = b,
                None => break,
            }
        }
    }
    assert_eq!(rows.len(), 1, "the marker");
    // The follower has no pool yet: applying builds it.
    let follower = store();
    for (t, k, v, expire) in &rows {
        follower.apply_row(*t, *k, Some(v), *expire, NOW).unwrap();
    }
    assert_eq!(
        follower.check_marker(id, 42, NOW),
        replica::Seen::Answered {
            status: ErrorCode::Ok,
            applied: 3
        }
    );
}

/// Server `me` of a cluster whose map is `map`, every server registered.
fn routed(map: fabrickv_cluster::slots::SlotMap) -> crate::slot_routing::Routing {
    let servers = (0..map.size)
        .map(|i| Some(crate::slot_routing::loopback_desc(i)))
        .collect();
    crate::slot_routing::Routing::new(0, "t", map, servers)
}

/// A u64 key whose slot is in `slots`.
fn key_in(slots: std::ops::RangeInclusive<u16>) -> u64 {
    (1u64..)
        .find(|&k| slots.contains(&slot_of_u64(k)))
        .expect("a key")
}

/// Growth moves slots between groups: a part of a push sent again under
/// its id may now hold keys of two groups. The server leading its first
/// key's slot answers it from its marker if it was applied, and refuses it
/// (for the client to split anew) only if it never was, so a gradient is
/// applied once whatever the map did in between.
#[test]
fn a_push_retried_after_its_keys_changed_groups_is_answered_not_applied_again() {
    use fabrickv_cluster::slots::SlotMap;
    let routing = crate::slot_routing::SlotRouting::new();
    let one = SlotMap::initial(1, 1).expect("map");
    routing.install(routed(one));
    let mut s = PsService::new(0, store()).with_slot_routing(routing.clone());
    let spec = TableSpec {
        optimizer: Optimizer::Sgd,
        lr: 1.0,
        ..TableSpec::new("grown", 1)
    };
    let t = create(&mut s, &spec).id;
    // Of three servers, server 0 leads slots 0..=5460.
    let (mine, moved) = (key_in(0..=5460), key_in(5461..=10922));
    let keys = [mine, moved];
    push(&mut s, t, PushMode::Overwrite, &keys, &[0.0; 2]);
    let applied = PushId { client: 5, seq: 1 };
    assert_eq!(
        push_once(&mut s, t, &keys, &[-1.0; 2], applied),
        (ErrorCode::Ok, 2)
    );
    let mut three = SlotMap::initial(3, 1).expect("map");
    three.epoch = 2;
    routing.install(routed(three));
    assert_eq!(
        push_once(&mut s, t, &keys, &[-1.0; 2], applied),
        (ErrorCode::Ok, 2),
        "answered as it was the first time"
    );
    assert_eq!(pull(&mut s, t, 1, &[mine]).0, [1.0], "applied once");
    // A part never applied is refused whole, and stays refused: a late
    // copy of it finds its marker even once the map gives the slots back.
    let never = PushId { client: 5, seq: 3 };
    assert_eq!(
        push_once(&mut s, t, &keys, &[-1.0; 2], never).0,
        ErrorCode::WrongServer
    );
    let mut back = SlotMap::initial(1, 1).expect("map");
    back.epoch = 3;
    routing.install(routed(back));
    assert_eq!(
        push_once(&mut s, t, &keys, &[-1.0; 2], never),
        (ErrorCode::WrongServer, 0)
    );
    assert_eq!(pull(&mut s, t, 1, &[mine]).0, [1.0], "never applied");
    // A server that does not lead the first key's slot has no say.
    let mut other = SlotMap::initial(3, 1).expect("map");
    other.epoch = 4;
    routing.install(routed(other));
    let fresh = PushId { client: 5, seq: 4 };
    assert_eq!(
        push_once(&mut s, t, &[moved, mine], &[-1.0; 2], fresh).0,
        ErrorCode::WrongServer
    );
}
