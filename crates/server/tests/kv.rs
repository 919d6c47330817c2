//! What a user of FabricKV relies on, checked end to end: a real server,
//! the real client, and every test run once per transport.

#[macro_use]
mod common;

use std::collections::BTreeMap;
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use fabrickv_client::{BatchOp, Client, Kv};
use fabrickv_server::Mode;
use fabrickv_types::limits::{KEY_BYTES_MAX, LARGE_VALUE_BYTES_MAX, TTL_MS_MAX, VALUE_BYTES_MAX};
use fabrickv_types::ErrorCode;
use fabrickv_wire::PutCondition;

use common::{
    keys_of_worker, parse_reply, recv_n, request, stat, stat_per_worker, stats, value_of, wait_for,
    Reply, TestServer, Transport, TIMEOUT,
};

fn put_get_round_trip(t: Transport) {
    let s = TestServer::default_on(t);
    let mut c = s.client();
    let pairs: [(&[u8], &[u8]); 3] = [
        (b"alpha", b"one"),
        (b"beta", b"two, a little longer"),
        (b"\x00bin\xff", b"\x00\x01\x02\xff"),
    ];
    for (k, v) in pairs {
        c.put(k, v).expect("put");
    }
    for (k, v) in pairs {
        assert_eq!(c.get(k).expect("get").as_deref(), Some(v), "key {k:?}");
    }
    s.shutdown();
}

fn get_of_a_missing_key_is_none(t: Transport) {
    let s = TestServer::default_on(t);
    let mut c = s.client();
    assert_eq!(c.get(b"never-written").expect("get"), None);
    c.put(b"written", b"v").expect("put");
    assert_eq!(c.get(b"never-written").expect("get"), None);
    assert_eq!(c.get(b"written").expect("get").as_deref(), Some(&b"v"[..]));
    s.shutdown();
}

fn delete_returns_true_then_false(t: Transport) {
    let s = TestServer::default_on(t);
    let mut c = s.client();
    c.put(b"doomed", b"v").expect("put");
    c.put(b"bystander", b"w").expect("put");
    assert!(
        c.delete(b"doomed").expect("delete"),
        "first delete finds it"
    );
    assert_eq!(c.get(b"doomed").expect("get"), None);
    assert!(
        !c.delete(b"doomed").expect("delete"),
        "second delete finds nothing"
    );
    assert!(!c.delete(b"never-written").expect("delete"));
    assert_eq!(
        c.get(b"bystander").expect("get").as_deref(),
        Some(&b"w"[..])
    );
    s.shutdown();
}

fn overwrite_replaces_the_value(t: Transport) {
    let s = TestServer::default_on(t);
    let mut c = s.client();
    // Grow, shrink and grow again, so the value moves between size classes.
    for (round, len) in [10usize, 5000, 3, 70_000, 0, 12].into_iter().enumerate() {
        let v = value_of(round as u64, len);
        c.put(b"key", &v).expect("put");
        assert_eq!(c.get(b"key").expect("get"), Some(v), "round {round}");
    }
    let st = stats(&mut c);
    assert_eq!((st["items"], st["puts"]), (1, 6));
    assert_eq!(st["bytes"], 3 + 12, "key plus the last value");
    s.shutdown();
}

fn mput_mget_mdelete_across_workers(t: Transport) {
    const KEYS: usize = 2000;
    let s = TestServer::start(t, 3, Mode::Store, 96 << 20);
    let mut c = s.client();
    let keys: Vec<Vec<u8>> = (0..KEYS)
        .map(|i| format!("multi-{i}").into_bytes())
        .collect();
    let values: Vec<Vec<u8>> = (0..KEYS).map(|i| value_of(i as u64, i % 300)).collect();
    let mut per_worker = vec![0u64; 3];
    for k in &keys {
        per_worker[usize::from(c.worker_of(k))] += 1;
    }
    assert!(
        per_worker.iter().all(|&n| n > 0),
        "keys must spread over every worker: {per_worker:?}"
    );

    let items: Vec<(&[u8], &[u8])> = keys
        .iter()
        .zip(&values)
        .map(|(k, v)| (k.as_slice(), v.as_slice()))
        .collect();
    c.mput(&items, None).expect("mput");
    assert_eq!(stat_per_worker(&mut c, "items"), per_worker);

    // Absent keys interleaved: each result must land at its own position.
    let mut asked: Vec<Vec<u8>> = Vec::new();
    let mut expect: Vec<Option<Vec<u8>>> = Vec::new();
    for (i, (k, v)) in keys.iter().zip(&values).enumerate() {
        asked.push(k.clone());
        expect.push(Some(v.clone()));
        if i % 20 == 7 {
            asked.push(format!("absent-{i}").into_bytes());
            expect.push(None);
        }
    }
    let got = c.mget(&asked).expect("mget");
    assert_eq!(got.len(), expect.len());
    for (i, (g, e)) in got.iter().zip(&expect).enumerate() {
        assert_eq!(g, e, "mget result {i} (key {:?})", asked[i]);
    }

    // Delete every other key, plus absent ones.
    let mut doomed: Vec<Vec<u8>> = Vec::new();
    let mut expect_deleted = Vec::new();
    for (i, k) in keys.iter().enumerate() {
        let even = i % 2 != 1;
        if even {
            doomed.push(k.clone());
            expect_deleted.push(true);
        }
        if i % 100 == 1 {
            doomed.push(format!("absent-{i}").into_bytes());
            expect_deleted.push(false);
        }
    }
    assert_eq!(c.mdelete(&doomed).expect("mdelete"), expect_deleted);
    let got = c.mget(&keys).expect("mget after mdelete");
    for (i, g) in got.iter().enumerate() {
        let e = (i % 2 == 1).then(|| values[i].clone());
        assert_eq!(g, &e, "key {i} after mdelete");
    }
    assert_eq!(stat(&mut c, "items"), (KEYS / 2) as u64);
    s.shutdown();
}

fn values_of_zero_and_max_bytes(t: Transport) {
    let s = TestServer::default_on(t);
    let mut c = s.client();
    let max = c.info().value_bytes_max as usize;
    assert_eq!(
        max, VALUE_BYTES_MAX,
        "32 MiB per worker holds the largest value"
    );

    c.put(b"empty", b"").expect("put an empty value");
    assert_eq!(
        c.get(b"empty").expect("get"),
        Some(Vec::new()),
        "an empty value is present, not absent"
    );

    let long_key = vec![b'k'; KEY_BYTES_MAX];
    let big = value_of(7, max);
    c.put(&long_key, &big).expect("put the largest value");
    c.put(b"b", &value_of(8, max))
        .expect("largest value, short key");
    assert!(c.get(&long_key).expect("get") == Some(big.clone()));
    assert!(c.get(b"b").expect("get") == Some(value_of(8, max)));

    // One byte over a frame's value travels in chunks, as a large value.
    let over = value_of(9, max + 1);
    c.put(b"c", &over).expect("one byte over a frame's value");
    assert!(c.get(b"c").expect("get") == Some(over));
    let err = c
        .put(&long_key, &vec![0u8; LARGE_VALUE_BYTES_MAX + 1])
        .expect_err("one byte over the largest value");
    assert_eq!(err.code(), ErrorCode::ValueTooLarge, "{err}");
    assert!(
        c.get(&long_key).expect("get") == Some(big),
        "a refused put leaves the old value"
    );
    s.shutdown();
}

fn value_bytes_max_is_exact_on_small_pools(t: Transport) {
    for mode in [Mode::Store, Mode::Cache] {
        // The least memory a worker may have: the engine's largest item is
        // then below the protocol's bound, and the server must say so.
        let s = TestServer::start(t, 1, mode, 1 << 20);
        let mut c = s.client();
        let max = c.info().value_bytes_max as usize;
        assert!(
            max < VALUE_BYTES_MAX,
            "{mode:?}: a 1 MiB pool cannot hold a 1 MiB value, yet the server reports {max}"
        );
        let key = vec![b'm'; KEY_BYTES_MAX];
        let v = value_of(1, max);
        c.put(&key, &v)
            .unwrap_or_else(|e| panic!("{mode:?}: a value of the reported maximum {max}: {e}"));
        assert!(c.get(&key).expect("get") == Some(v), "{mode:?}");
        let err = c
            .put(&key, &value_of(2, max + 1))
            .expect_err("one byte over the reported maximum");
        assert_eq!(err.code(), ErrorCode::ValueTooLarge, "{mode:?}: {err}");
        s.shutdown();
    }
}

fn keys_of_1_and_250_bytes_work_251_is_refused(t: Transport) {
    let s = TestServer::default_on(t);
    let mut c = s.client();
    let short = b"x".to_vec();
    let long = value_of(3, KEY_BYTES_MAX);
    c.put(&short, b"short key").expect("1-byte key");
    c.put(&long, b"long key").expect("250-byte key");
    assert_eq!(
        c.get(&short).expect("get").as_deref(),
        Some(&b"short key"[..])
    );
    assert_eq!(
        c.get(&long).expect("get").as_deref(),
        Some(&b"long key"[..])
    );
    // A 250-byte key that differs from another only in its last byte.
    let mut near = long.clone();
    near[KEY_BYTES_MAX - 1] ^= 1;
    assert_eq!(c.get(&near).expect("get"), None);

    let too_long = vec![b'k'; KEY_BYTES_MAX + 1];
    let err = c.put(&too_long, b"v").expect_err("251-byte key");
    assert_eq!(err.code(), ErrorCode::KeyTooLong, "{err}");
    let err = c.get(&too_long).expect_err("251-byte key");
    assert_eq!(err.code(), ErrorCode::KeyTooLong, "{err}");
    let err = c.put(b"", b"v").expect_err("empty key");
    assert_eq!(err.code(), ErrorCode::KeyTooLong, "{err}");
    s.shutdown();
}

fn ttl_expires_short_keys_and_keeps_long_ones(t: Transport) {
    // The server's clock ticks in milliseconds and is read once per burst.
    const CLOCK_SLACK: Duration = Duration::from_millis(10);
    const SHORT: Duration = Duration::from_millis(150);
    let s = TestServer::default_on(t);
    let mut c = s.client();
    c.put_ttl(b"long", b"stays", Some(Duration::from_secs(3600)))
        .expect("put long ttl");
    c.put(b"forever", b"no ttl").expect("put");
    let t0 = Instant::now();
    c.put_ttl(b"short", b"goes", Some(SHORT))
        .expect("put short ttl");
    let mut lived = Duration::ZERO;
    wait_for("the short-TTL key to expire", TIMEOUT, || {
        let got = c.get(b"short").expect("get");
        let answered = t0.elapsed();
        match got {
            Some(v) => {
                assert_eq!(v, b"goes");
                false
            }
            None => {
                lived = answered;
                true
            }
        }
    });
    assert!(
        lived + CLOCK_SLACK >= SHORT,
        "expired after {lived:?}, before its TTL of {SHORT:?}"
    );
    assert_eq!(c.get(b"long").expect("get").as_deref(), Some(&b"stays"[..]));
    assert_eq!(
        c.get(b"forever").expect("get").as_deref(),
        Some(&b"no ttl"[..])
    );
    let st = stats(&mut c);
    assert_eq!(st["items"], 2, "the expired item is reclaimed");
    assert_eq!(st["expired"], 1);
    s.shutdown();
}

fn sweep_reclaims_expired_keys_nobody_reads(t: Transport) {
    const SHORT_LIVED: usize = 200;
    // Small pools have small indexes, which the sweep covers quickly.
    let s = TestServer::start(t, 2, Mode::Store, 4 << 20);
    let mut c = s.client();
    let short: Vec<(Vec<u8>, Vec<u8>)> = (0..SHORT_LIVED)
        .map(|i| (format!("brief-{i}").into_bytes(), value_of(i as u64, 40)))
        .collect();
    c.mput(&short, Some(Duration::from_millis(50)))
        .expect("mput short ttl");
    let keep: Vec<(Vec<u8>, Vec<u8>)> = (0..5)
        .map(|i| (format!("keep-{i}").into_bytes(), value_of(1000 + i, 40)))
        .collect();
    c.mput(&keep, None).expect("mput");
    wait_for("the sweep to reclaim every expired item", TIMEOUT, || {
        let st = stats(&mut c);
        st["items"] == keep.len() as u64 && st["expired"] == SHORT_LIVED as u64
    });
    let keys: Vec<&[u8]> = short.iter().map(|(k, _)| k.as_slice()).collect();
    assert!(c.mget(&keys).expect("mget").iter().all(Option::is_none));
    for (k, v) in &keep {
        assert_eq!(c.get(k).expect("get").as_ref(), Some(v));
    }
    let st = stats(&mut c);
    assert_eq!(
        (st["expired"], st["misses"]),
        (SHORT_LIVED as u64, SHORT_LIVED as u64),
        "reclaimed items are counted once and then simply absent"
    );
    s.shutdown();
}

fn put_with_conditions(t: Transport) {
    let s = TestServer::default_on(t);
    let mut c = s.client();
    let put = |c: &mut Client, k: &[u8], v: &[u8], cond| {
        c.put_with(k, v, None, cond).expect("conditional put")
    };
    assert!(!put(&mut c, b"k", b"1", PutCondition::IfPresent));
    assert_eq!(
        c.get(b"k").expect("get"),
        None,
        "IfPresent on absent stores nothing"
    );
    assert!(put(&mut c, b"k", b"2", PutCondition::IfAbsent));
    assert_eq!(c.get(b"k").expect("get").as_deref(), Some(&b"2"[..]));
    assert!(!put(&mut c, b"k", b"3", PutCondition::IfAbsent));
    assert_eq!(
        c.get(b"k").expect("get").as_deref(),
        Some(&b"2"[..]),
        "IfAbsent on present changes nothing"
    );
    assert!(put(&mut c, b"k", b"4", PutCondition::IfPresent));
    assert_eq!(c.get(b"k").expect("get").as_deref(), Some(&b"4"[..]));
    assert!(c.delete(b"k").expect("delete"));
    assert!(!put(&mut c, b"k", b"5", PutCondition::IfPresent));
    assert!(put(&mut c, b"k", b"6", PutCondition::IfAbsent));
    assert_eq!(c.get(b"k").expect("get").as_deref(), Some(&b"6"[..]));
    s.shutdown();
}

fn store_mode_full_refuses_writes_and_keeps_data(t: Transport) {
    let s = TestServer::start(t, 1, Mode::Store, 2 << 20);
    let mut c = s.client();
    let small: Vec<(Vec<u8>, Vec<u8>)> = (0..50)
        .map(|i| (format!("early-{i}").into_bytes(), value_of(i, 100)))
        .collect();
    c.mput(&small, None).expect("mput early data");

    // Fill with 4000-byte values, 32 per call, until the store says full.
    let mut stored: Vec<(Vec<u8>, Vec<u8>)> = Vec::new();
    let mut refused = None;
    'fill: for round in 0..200u64 {
        let batch: Vec<(Vec<u8>, Vec<u8>)> = (0..32)
            .map(|i| {
                let n = round * 32 + i;
                (format!("fill-{n}").into_bytes(), value_of(10_000 + n, 4000))
            })
            .collect();
        let ops: Vec<BatchOp<'_>> = batch
            .iter()
            .map(|(k, v)| BatchOp::Put {
                key: k,
                value: v,
                ttl_ms: 0,
                cond: PutCondition::Always,
            })
            .collect();
        let outcomes = c.execute(&ops).expect("execute");
        for (o, kv) in outcomes.into_iter().zip(batch) {
            match o.code {
                ErrorCode::Ok => stored.push(kv),
                ErrorCode::InsufficientSpace => {
                    refused = Some(kv.0);
                    break 'fill;
                }
                other => panic!("filling the store: unexpected {other}"),
            }
        }
    }
    let refused = refused.expect("a 2 MiB store fills up within 25 MB of puts");
    assert!(
        stored.len() > 300,
        "only {} values of 4000 bytes fit in 2 MiB",
        stored.len()
    );
    let err = c
        .put(&refused, &value_of(1, 4000))
        .expect_err("the store is still full");
    assert_eq!(err.code(), ErrorCode::InsufficientSpace, "{err}");
    assert_eq!(
        c.get(&refused).expect("get"),
        None,
        "a refused put stores nothing"
    );

    // Everything acknowledged before is intact.
    for (k, v) in small.iter().chain(&stored) {
        assert!(
            c.get(k).expect("get").as_ref() == Some(v),
            "key {:?} lost or corrupted in a full store",
            String::from_utf8_lossy(k)
        );
    }
    assert_eq!(stat(&mut c, "items"), (small.len() + stored.len()) as u64);
    assert_eq!(stat(&mut c, "evictions"), 0, "a store never evicts");

    // Deleting makes room again.
    let (gone, _) = stored.pop().expect("something was stored");
    assert!(c.delete(&gone).expect("delete"));
    let v = value_of(2, 4000);
    c.put(&refused, &v).expect("room after a delete");
    assert_eq!(c.get(&refused).expect("get"), Some(v));
    s.shutdown();
}

fn cache_mode_overfill_evicts_without_errors(t: Transport) {
    const KEYS: usize = 2000;
    let s = TestServer::start(t, 1, Mode::Cache, 2 << 20);
    let mut c = s.client();
    let data: Vec<(Vec<u8>, Vec<u8>)> = (0..KEYS)
        .map(|i| (format!("c-{i}").into_bytes(), value_of(i as u64, 4000)))
        .collect();
    // 8 MB through a 2 MiB cache, 100 keys per call.
    for chunk in data.chunks(100) {
        c.mput(chunk, None)
            .expect("a cache never refuses for space");
    }
    let st = stats(&mut c);
    assert!(st["evictions"] > 0, "overfilling must evict: {st:?}");
    assert!(st["items"] < KEYS as u64);

    // Read back 100 keys per call, so that no reply frame has to carry
    // more values than fit in one (see `one_mget_of_values_larger_than_a_reply_frame`).
    let mut got: Vec<Option<Vec<u8>>> = Vec::with_capacity(KEYS);
    for chunk in data.chunks(100) {
        let keys: Vec<&[u8]> = chunk.iter().map(|(k, _)| k.as_slice()).collect();
        got.extend(c.mget(&keys).expect("mget"));
    }
    let mut hits = 0u64;
    for (i, g) in got.iter().enumerate() {
        if let Some(v) = g {
            assert!(*v == data[i].1, "key {i}: a hit returned a wrong value");
            hits += 1;
        }
    }
    assert!(
        got[KEYS - 50..].iter().all(Option::is_some),
        "the newest items survive a FIFO eviction"
    );
    let after = stats(&mut c);
    assert_eq!(after["items"], hits, "every counted item can be read");
    assert_eq!((after["hits"], after["misses"]), (hits, KEYS as u64 - hits));
    s.shutdown();
}

fn stats_count_what_the_client_did(t: Transport) {
    let s = TestServer::default_on(t);
    let mut c = s.client();
    let keys: Vec<Vec<u8>> = (0..10).map(|i| format!("s-{i}").into_bytes()).collect();
    for k in &keys {
        c.put(k, b"v").expect("put");
    }
    for k in &keys {
        assert!(c.get(k).expect("get").is_some());
    }
    for i in 0..5 {
        assert!(c
            .get(format!("miss-{i}").as_bytes())
            .expect("get")
            .is_none());
    }
    for k in &keys[..3] {
        assert!(c.delete(k).expect("delete"));
    }
    let st = stats(&mut c);
    assert_eq!(st["puts"], 10);
    assert_eq!((st["gets"], st["hits"], st["misses"]), (15, 10, 5));
    assert_eq!((st["deletes"], st["items"]), (3, 7));
    assert_eq!(
        st["bytes"],
        keys[3..].iter().map(|k| k.len() as u64 + 1).sum::<u64>()
    );
    assert_eq!((st["frames"], st["ops"]), (28, 28), "one frame per call");
    assert_eq!((st["frames_refused"], st["misrouted"]), (0, 0));
    assert_eq!(st["workers"], 2);

    // Each worker counts exactly the keys it owns.
    let mut owned = vec![0u64; 2];
    for k in &keys[3..] {
        owned[usize::from(c.worker_of(k))] += 1;
    }
    assert_eq!(stat_per_worker(&mut c, "items"), owned);
    s.shutdown();
}

fn pipelined_frames_are_answered_in_order(t: Transport) {
    const FRAMES: usize = 600;
    let s = TestServer::default_on(t);
    let mut c = s.client();
    let mut sent = Vec::new();
    // Post every frame to every worker before reading any reply.
    for w in 0..s.workers {
        let keys = keys_of_worker(&c, w, FRAMES, "pipe");
        let ids: Vec<u64> = (0..FRAMES).map(|_| c.next_request_id()).collect();
        let ep = c.endpoint(w);
        for (i, (k, id)) in keys.iter().zip(&ids).enumerate() {
            let v = value_of((usize::from(w) * FRAMES + i) as u64, i % 100);
            let msg = request(*id, w, |b| {
                b.put(k, &v, 0, PutCondition::Always).get(k);
            });
            ep.post(&msg).expect("post");
        }
        sent.push((keys, ids));
    }
    for w in 0..s.workers {
        c.endpoint(w).flush(TIMEOUT).expect("flush");
    }
    for (w, (_, ids)) in (0..s.workers).zip(&sent) {
        let replies = recv_n(c.endpoint(w), FRAMES);
        for (i, (m, id)) in replies.iter().zip(ids).enumerate() {
            let v = value_of((usize::from(w) * FRAMES + i) as u64, i % 100);
            assert_eq!(
                parse_reply(m),
                (
                    *id,
                    w,
                    Reply::Results(vec![(ErrorCode::Ok, Vec::new()), (ErrorCode::Ok, v)])
                ),
                "worker {w}, frame {i}"
            );
        }
    }
    // The connections are drained and in step: the client still works.
    for (w, (keys, _)) in (0..s.workers).zip(&sent) {
        let got = c.mget(keys).expect("mget after pipelining");
        for (i, g) in got.into_iter().enumerate() {
            let v = value_of((usize::from(w) * FRAMES + i) as u64, i % 100);
            assert_eq!(g, Some(v));
        }
    }
    s.shutdown();
}

fn misrouted_key_is_served_and_the_reply_hints(t: Transport) {
    let s = TestServer::default_on(t);
    let mut c = s.client();
    let theirs = keys_of_worker(&c, 1, 1, "elsewhere").remove(0);
    let ours = keys_of_worker(&c, 0, 1, "home").remove(0);
    c.put(&ours, b"home value").expect("put");
    let id = c.next_request_id();
    let ep = c.endpoint(0);
    let msg = request(id, 0, |b| {
        b.put(&theirs, b"served anyway", 0, PutCondition::Always)
            .get(&theirs)
            .delete(&theirs)
            .get(&ours);
    });
    ep.post(&msg).expect("post");
    ep.flush(TIMEOUT).expect("flush");
    let reply = recv_n(ep, 1).remove(0);
    let none = Vec::new();
    assert_eq!(
        parse_reply(&reply),
        (
            id,
            0,
            Reply::Results(vec![
                (ErrorCode::Ok, none.clone()),
                (ErrorCode::Ok, b"served anyway".to_vec()),
                (ErrorCode::Ok, none),
                (ErrorCode::Ok, b"home value".to_vec()),
            ])
        ),
        "misrouted operations are executed under their partition's lock"
    );
    let f = fabrickv_wire::decode_frame(&reply).expect("frame");
    assert_eq!(
        f.header.status,
        ErrorCode::WrongWorker.as_u16(),
        "the reply hints that the sender's table is stale"
    );
    assert_eq!(c.get(&theirs).expect("get"), None, "the DELETE ran");
    assert_eq!(stat_per_worker(&mut c, "misrouted"), vec![3, 0]);
    s.shutdown();
}

fn concurrent_clients_with_disjoint_keys(t: Transport) {
    const THREADS: usize = 4;
    const KEYS: usize = 200;
    let s = TestServer::default_on(t);
    let start = Arc::new(Barrier::new(THREADS));
    let threads: Vec<_> = (0..THREADS)
        .map(|th| {
            let mut c = s.client();
            let start = start.clone();
            std::thread::spawn(move || {
                let key = |i: usize| format!("t{th}-{i}").into_bytes();
                let seed = |i: usize, round: u64| (th * 1_000_000 + i) as u64 * 10 + round;
                let mut model: BTreeMap<Vec<u8>, Vec<u8>> = BTreeMap::new();
                start.wait();
                for i in 0..KEYS {
                    let v = value_of(seed(i, 0), i % 200);
                    c.put(&key(i), &v).expect("put");
                    model.insert(key(i), v);
                }
                for round in 1..4u64 {
                    for i in (0..KEYS).filter(|i| i % 3 == round as usize % 3) {
                        let v = value_of(seed(i, round), (i + 7) % 150);
                        c.put(&key(i), &v).expect("overwrite");
                        model.insert(key(i), v);
                    }
                    for i in (0..KEYS).filter(|i| i % 7 == round as usize) {
                        let was = model.remove(&key(i)).is_some();
                        assert_eq!(c.delete(&key(i)).expect("delete"), was);
                    }
                    let keys: Vec<Vec<u8>> = (0..KEYS).map(key).collect();
                    let got = c.mget(&keys).expect("mget");
                    for (i, (k, g)) in keys.iter().zip(got).enumerate() {
                        assert_eq!(
                            g.as_ref(),
                            model.get(k),
                            "thread {th}, key {i}, round {round}"
                        );
                    }
                }
                model
            })
        })
        .collect();
    let mut expect: BTreeMap<Vec<u8>, Vec<u8>> = BTreeMap::new();
    for th in threads {
        expect.extend(th.join().expect("client thread"));
    }
    let mut c = s.client();
    let keys: Vec<Vec<u8>> = (0..THREADS)
        .flat_map(|th| (0..KEYS).map(move |i| format!("t{th}-{i}").into_bytes()))
        .collect();
    let got = c.mget(&keys).expect("mget");
    for (k, g) in keys.iter().zip(got) {
        assert_eq!(
            g.as_ref(),
            expect.get(k),
            "key {:?}",
            String::from_utf8_lossy(k)
        );
    }
    assert_eq!(stat(&mut c, "items"), expect.len() as u64);
    s.shutdown();
}

fn ttl_over_ten_years_is_refused(t: Transport) {
    let s = TestServer::default_on(t);
    let mut c = s.client();
    let max = Duration::from_millis(TTL_MS_MAX);
    c.put_ttl(b"decade", b"v", Some(max))
        .expect("the longest TTL is accepted");
    assert_eq!(c.get(b"decade").expect("get").as_deref(), Some(&b"v"[..]));
    let err = c
        .put_ttl(b"longer", b"v", Some(max + Duration::from_millis(1)))
        .expect_err("one millisecond over the longest TTL");
    assert_eq!(err.code(), ErrorCode::TtlTooLarge, "{err}");
    assert_eq!(c.get(b"longer").expect("get"), None, "nothing was stored");
    s.shutdown();
}

/// Regression: `ttl_ms` in the client casts the TTL's milliseconds to u64
/// with `as`, so a TTL of 2^64 ms wraps to 0 and becomes 1 ms: the put
/// succeeds and the key is gone at once, where a TTL over the bound is
/// otherwise refused with TtlTooLarge.
fn ttl_beyond_u64_milliseconds_is_refused_not_wrapped(t: Transport) {
    let s = TestServer::default_on(t);
    let mut c = s.client();
    let huge = Duration::from_millis(u64::MAX) + Duration::from_millis(1);
    let r = c.put_ttl(b"k", b"v", Some(huge));
    assert_eq!(
        r.map_err(|e| e.code()).err(),
        Some(ErrorCode::TtlTooLarge),
        "a TTL of 2^64 ms must be refused like any TTL over the bound"
    );
    s.shutdown();
}

fn deep_pipeline_of_large_replies_is_throttled_not_lost(t: Transport) {
    const FRAMES: usize = 16;
    let s = TestServer::default_on(t);
    let mut c = s.client();
    let key = keys_of_worker(&c, 1, 1, "wide").remove(0);
    let value = value_of(99, VALUE_BYTES_MAX);
    c.put(&key, &value).expect("put the largest value");
    // 16 MiB of replies asked for at once, none read until all are asked.
    let ids: Vec<u64> = (0..FRAMES).map(|_| c.next_request_id()).collect();
    let ep = c.endpoint(1);
    for id in &ids {
        ep.post(&request(*id, 1, |b| {
            b.get(&key);
        }))
        .expect("post");
    }
    ep.flush(TIMEOUT).expect("flush");
    let replies = recv_n(ep, FRAMES);
    for (i, (m, id)) in replies.iter().zip(&ids).enumerate() {
        let (rid, _, reply) = parse_reply(m);
        assert_eq!(rid, *id, "reply {i} out of order");
        assert!(
            reply == Reply::Results(vec![(ErrorCode::Ok, value.clone())]),
            "reply {i} lost or corrupted"
        );
    }
    if t == Transport::Tcp {
        // Three replies exceed the send queue bound: reading paused.
        assert!(stat(&mut c, "backpressure_pauses") > 0);
    }
    assert_eq!(c.get(&key).expect("get"), Some(value));
    s.shutdown();
}

fn disconnected_clients_release_their_connections(t: Transport) {
    let s = TestServer::default_on(t);
    let mut watcher = s.client();
    wait_for("the watcher's connections", TIMEOUT, || {
        stat(&mut watcher, "conns_open") == 2
    });
    let others: Vec<Client> = (0..5).map(|_| s.client()).collect();
    wait_for("five more clients' connections", TIMEOUT, || {
        stat(&mut watcher, "conns_open") == 12
    });
    drop(others);
    wait_for("the closed connections to be released", TIMEOUT, || {
        stat(&mut watcher, "conns_open") == 2
    });
    assert_eq!(stat(&mut watcher, "conns_accepted"), 12);
    s.shutdown();
}

/// Regression: the client packs a frame of GETs by the size of the
/// request, but the values in the reply can exceed one frame. Over tcp the
/// server drops the oversized reply (the call times out and the
/// connection is out of step); over inproc it is delivered and the client
/// rejects it as FrameTooLarge.
fn one_mget_of_values_larger_than_a_reply_frame(t: Transport) {
    let s = TestServer::default_on(t);
    let mut c = s.client();
    // 300 values of 8000 bytes: about 1.2 MB per worker, more than one
    // frame body (FRAME_BODY_BYTES_MAX) in total, far less than a frame's
    // worth of operations.
    let data: Vec<(Vec<u8>, Vec<u8>)> = (0..300)
        .map(|i| (format!("wide-{i}").into_bytes(), value_of(i, 8000)))
        .collect();
    c.mput(&data, None).expect("mput");
    let keys: Vec<&[u8]> = data.iter().map(|(k, _)| k.as_slice()).collect();
    let got = c.mget(&keys).expect("one mget of 2.4 MB of values");
    for ((_, v), g) in data.iter().zip(got) {
        assert!(g.as_ref() == Some(v));
    }
    // The connections are still in step.
    assert_eq!(c.get(&data[0].0).expect("get"), Some(data[0].1.clone()));
    s.shutdown();
}

transport_tests!(
    put_get_round_trip,
    get_of_a_missing_key_is_none,
    delete_returns_true_then_false,
    overwrite_replaces_the_value,
    mput_mget_mdelete_across_workers,
    values_of_zero_and_max_bytes,
    value_bytes_max_is_exact_on_small_pools,
    keys_of_1_and_250_bytes_work_251_is_refused,
    ttl_expires_short_keys_and_keeps_long_ones,
    sweep_reclaims_expired_keys_nobody_reads,
    put_with_conditions,
    store_mode_full_refuses_writes_and_keeps_data,
    cache_mode_overfill_evicts_without_errors,
    stats_count_what_the_client_did,
    pipelined_frames_are_answered_in_order,
    misrouted_key_is_served_and_the_reply_hints,
    concurrent_clients_with_disjoint_keys,
    ttl_over_ten_years_is_refused,
    deep_pipeline_of_large_replies_is_throttled_not_lost,
    disconnected_clients_release_their_connections,
    ttl_beyond_u64_milliseconds_is_refused_not_wrapped,
    one_mget_of_values_larger_than_a_reply_frame,
);
