//! The KV-cache service end to end: a real server, the real client, every
//! test once per transport (inline chunks over inproc and tcp, one-sided
//! writes into the client's registered buffer over shm).

#[macro_use]
mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use fabrickv_cache::CacheConfig;
use fabrickv_client::{CacheClient, CacheClientOptions, ClientError, CACHE_REGISTERED_BUFFERS_MAX};
use fabrickv_server::Mode;
use fabrickv_types::limits::{CACHE_BATCH_KEYS_MAX, CACHE_CHUNK_BYTES_MAX, CACHE_VALUE_BYTES_MAX};
use fabrickv_types::ErrorCode;

use common::{TestServer, Transport, MEMORY_BYTES, TIMEOUT};

/// Cache pool of a test server: room for one maximal value and more,
/// lazily backed so parallel tests cost little.
const CACHE_POOL_BYTES: usize = 160 << 20;

/// Receive buffer of a test client: one maximal value.
const BUFFER_BYTES: usize = CACHE_VALUE_BYTES_MAX;

fn server(t: Transport) -> TestServer {
    TestServer::start_with(t, 2, Mode::Store, MEMORY_BYTES, |c| {
        c.cache.store = CacheConfig {
            pool_bytes: CACHE_POOL_BYTES,
            ..CacheConfig::default()
        };
    })
}

fn client(s: &TestServer) -> CacheClient {
    common::cache_client(s, BUFFER_BYTES)
}

/// A value whose every byte depends on `seed` and its position, so a
/// shifted, truncated or mixed-up value never passes for the right one.
fn value(seed: u64, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| {
            (seed
                .wrapping_mul(31)
                .wrapping_add(i as u64 * 7 + (i as u64 >> 9))
                % 251) as u8
        })
        .collect()
}

fn code(e: ClientError) -> ErrorCode {
    e.code()
}

fn values_round_trip_from_one_byte_to_64_mib(t: Transport) {
    let s = server(t);
    let mut c = client(&s);
    assert_eq!(c.one_sided(), t == Transport::Shm, "{t:?}");
    let sizes = [
        1,
        4096,
        CACHE_CHUNK_BYTES_MAX,
        CACHE_CHUNK_BYTES_MAX + 1,
        3 << 20,
        CACHE_VALUE_BYTES_MAX,
    ];
    for (i, &len) in sizes.iter().enumerate() {
        let key = format!("v{i}");
        let v = value(i as u64, len);
        c.put(key.as_bytes(), &v, None).expect("put");
        assert_eq!(
            c.get(key.as_bytes()).expect("get").as_deref(),
            Some(&v[..]),
            "{len} bytes"
        );
        let mut dst = vec![0u8; len];
        assert_eq!(
            c.get_into(key.as_bytes(), &mut dst).expect("get_into"),
            Some(len)
        );
        assert!(dst == v, "get_into of {len} bytes");
    }
    assert_eq!(c.get(b"absent").expect("get"), None);
    s.shutdown();
}

fn get_at_places_values_and_checks_the_slice_first(t: Transport) {
    let s = server(t);
    let mut c = client(&s);
    let v = value(5, 200_000);
    c.put(b"k", &v, None).expect("put");
    let at = 1000;
    let p = c.get_at(b"k", at).expect("get_at").expect("present");
    assert_eq!((p.offset, p.len), (at, v.len()));
    assert!(c.buffer().expect("buffer")[at..at + v.len()] == v[..]);
    // Too close to the end of the buffer: refused before any byte moves.
    let tail = BUFFER_BYTES - 100;
    c.buffer().expect("buffer")[tail..].fill(0xEE);
    let e = c.get_at(b"k", tail).expect_err("does not fit");
    assert_eq!(code(e), ErrorCode::BufferTooSmall);
    assert!(c.buffer().expect("buffer")[tail..]
        .iter()
        .all(|&b| b == 0xEE));
    let mut small = vec![0u8; 10];
    let e = c.get_into(b"k", &mut small).expect_err("does not fit");
    assert_eq!(code(e), ErrorCode::BufferTooSmall);
    // A batch: every value at its own offset, all in flight together.
    let keys: Vec<String> = (0..8).map(|i| format!("b{i}")).collect();
    for (i, k) in keys.iter().enumerate() {
        c.put(k.as_bytes(), &value(100 + i as u64, 70_000), None)
            .expect("put");
    }
    let items: Vec<(&[u8], usize)> = keys
        .iter()
        .enumerate()
        .map(|(i, k)| (k.as_bytes(), i * 70_000))
        .chain([
            (&b"nope"[..], 8 * 70_000),
            (&b"big"[..], 9 * 70_000),
            (&b"k"[..], tail),
        ])
        .collect();
    // One value of several chunks among them, and one that does not fit
    // its slice (refused alone, nothing written, the rest unaffected).
    let big = value(77, CACHE_CHUNK_BYTES_MAX + 12_345);
    c.put(b"big", &big, None).expect("put");
    let got = c.get_many_at(&items).expect("batch");
    assert_eq!(got.len(), 11);
    assert!(matches!(got[8], Ok(None)));
    let p = got[9].as_ref().expect("ok").expect("present");
    assert_eq!((p.offset, p.len), (9 * 70_000, big.len()));
    assert!(c.buffer().expect("buffer")[p.offset..p.offset + p.len] == big[..]);
    let e = got[10].as_ref().expect_err("does not fit");
    assert_eq!(e.code(), ErrorCode::BufferTooSmall);
    assert!(c.buffer().expect("buffer")[tail..]
        .iter()
        .all(|&b| b == 0xEE));
    for (i, r) in got.iter().take(8).enumerate() {
        let p = r.as_ref().expect("ok").expect("present");
        assert_eq!(p.offset, i * 70_000);
        let want = value(100 + i as u64, 70_000);
        assert!(c.buffer().expect("buffer")[p.offset..p.offset + p.len] == want[..]);
    }
    s.shutdown();
}

fn ttl_expires_actively_without_any_read(t: Transport) {
    let s = server(t);
    let mut c = client(&s);
    c.put(b"short", b"gone soon", Some(Duration::from_millis(30)))
        .expect("put");
    c.put(b"long", b"stays", Some(Duration::from_secs(3600)))
        .expect("put");
    let mut kv = s.client();
    // No read of "short" happens until the sweep has removed it.
    common::wait_for("active expiry", Duration::from_secs(5), || {
        common::stat(&mut kv, "cache_expirations") >= 1
    });
    assert_eq!(common::stat(&mut kv, "cache_entries"), 1);
    assert_eq!(c.get(b"short").expect("get"), None);
    let p = c.get_at(b"long", 0).expect("get").expect("present");
    assert!(p.expires_in_ms > 3_500_000 && p.expires_in_ms <= 3_600_000);
    s.shutdown();
}

fn delete_exists_and_overwrite(t: Transport) {
    let s = server(t);
    let mut c = client(&s);
    assert!(!c.exists(b"k").expect("exists"));
    let g1 = c.put(b"k", b"one", None).expect("put");
    assert!(c.exists(b"k").expect("exists"));
    let g2 = c.put(b"k", &value(2, 900_000), None).expect("overwrite");
    assert!(g2 > g1, "a write gives a new generation");
    assert_eq!(c.get(b"k").expect("get"), Some(value(2, 900_000)));
    assert!(c.delete(b"k").expect("delete"));
    assert!(!c.delete(b"k").expect("delete again"));
    assert!(!c.exists(b"k").expect("exists"));
    let e = c.put(&[b'k'; 1025], b"v", None).expect_err("key too long");
    assert_eq!(code(e), ErrorCode::KeyTooLong);
    s.shutdown();
}

fn readers_never_see_a_value_mixed_from_two_writes(t: Transport) {
    let s = server(t);
    let len = 3 * CACHE_CHUNK_BYTES_MAX + 17;
    let a = vec![0xAAu8; len];
    let b = vec![0xBBu8; len];
    client(&s).put(b"hot", &a, None).expect("put");
    let stop = Arc::new(AtomicBool::new(false));
    let readers: Vec<_> = (0..2)
        .map(|_| {
            let mut c = client(&s);
            let stop = stop.clone();
            std::thread::spawn(move || {
                let mut dst = vec![0u8; len];
                let mut reads = 0;
                while !stop.load(Ordering::Relaxed) || reads < 20 {
                    let n = c.get_into(b"hot", &mut dst).expect("get").expect("present");
                    assert_eq!(n, len);
                    let first = dst[0];
                    assert!(first == 0xAA || first == 0xBB);
                    assert!(dst.iter().all(|&x| x == first), "a torn value");
                    reads += 1;
                }
            })
        })
        .collect();
    let mut w = client(&s);
    for i in 0..60 {
        w.put(b"hot", if i % 2 == 0 { &b } else { &a }, None)
            .expect("put");
    }
    stop.store(true, Ordering::Relaxed);
    for r in readers {
        r.join().expect("reader");
    }
    s.shutdown();
}

fn bind_needs_a_registered_client(t: Transport) {
    let s = server(t);
    let mut c = client(&s);
    match c.bind(12345) {
        Err(e) if t == Transport::Shm => assert_eq!(code(e), ErrorCode::NoSuchClient),
        Err(e) => assert_eq!(code(e), ErrorCode::Unavailable, "no region to bind"),
        Ok(()) => panic!("bound an unregistered client"),
    }
    s.shutdown();
}

/// A reader can be put on the worker of its choosing (beside a pinned
/// worker); the pool is shared, so each worker serves what another stored,
/// and a worker the server lacks is refused with the server's count.
fn a_reader_on_a_chosen_worker_gets_what_another_stored(t: Transport) {
    let s = server(t);
    let opts = || CacheClientOptions {
        buffer_bytes: 1 << 20,
        timeout: TIMEOUT,
    };
    assert_eq!(
        fabrickv_client::server_workers(&s.addr, TIMEOUT).expect("hello"),
        2
    );
    let mut w0 = CacheClient::connect_worker(&s.addr, 0, opts()).expect("worker 0");
    let mut w1 = CacheClient::connect_worker(&s.addr, 1, opts()).expect("worker 1");
    assert_eq!((w0.worker(), w1.worker()), (0, 1));
    w0.put(b"chosen", &value(5, 70_000), None)
        .expect("put on worker 0");
    assert_eq!(
        w1.get(b"chosen").expect("get on worker 1"),
        Some(value(5, 70_000))
    );
    common::assert_no_worker_2_of_2(CacheClient::connect_worker(&s.addr, 2, opts()));
    s.shutdown();
}

/// `exists_many` and `delete_many` answer per key in request order, over
/// more keys than one round of requests in flight (`CACHE_BATCH_KEYS_MAX`),
/// and check every key before sending any.
fn exists_many_and_delete_many_answer_each_key_in_order(t: Transport) {
    let s = server(t);
    let mut c = client(&s);
    let n = CACHE_BATCH_KEYS_MAX + 300;
    let keys: Vec<Vec<u8>> = (0..n).map(|i| format!("many-{i}").into_bytes()).collect();
    let refs: Vec<&[u8]> = keys.iter().map(Vec::as_slice).collect();
    for k in refs.iter().step_by(3) {
        c.put(k, b"v", None).expect("put");
    }
    let want: Vec<bool> = (0..n).map(|i| i % 3 == 0).collect();
    assert_eq!(c.exists_many(&refs).expect("exists_many"), want);
    assert_eq!(c.exists_many(&[]).expect("no keys"), Vec::<bool>::new());
    assert_eq!(c.delete_many(&refs).expect("delete_many"), want);
    assert_eq!(c.exists_many(&refs).expect("exists_many"), vec![false; n]);
    let long = vec![b'k'; 1025];
    let e = c
        .exists_many(&[b"fine".as_slice(), &long])
        .expect_err("key too long");
    assert_eq!(code(e), ErrorCode::KeyTooLong);
    // The refusal sent nothing: the connection is still in step.
    c.put(b"after", b"v", None).expect("put");
    assert_eq!(
        c.exists_many(&[b"after".as_slice()]).expect("exists"),
        [true]
    );
    s.shutdown();
}

/// A streamed batch (`get_many_each`) larger than its ring of the buffer
/// hands every value over in key order, intact, with an absent key as
/// None and a value larger than its room refused alone; a batch stopped
/// early hands nothing after the stop and leaves the connection in step.
fn get_many_each_hands_every_value_over_in_order(t: Transport) {
    let s = server(t);
    let mut c = client(&s);
    // 40 values of 200 KB: four times the 2 MiB ring, so places are
    // taken again while later values are in flight.
    let n = 40;
    let len = 200_000;
    let keys: Vec<String> = (0..n).map(|i| format!("each-{i}")).collect();
    for (i, k) in keys.iter().enumerate() {
        c.put(k.as_bytes(), &value(300 + i as u64, len), None)
            .expect("put");
    }
    let big = value(9, CACHE_CHUNK_BYTES_MAX + 777);
    c.put(b"each-big", &big, None).expect("put");
    let mut items: Vec<(&[u8], usize)> = keys.iter().map(|k| (k.as_bytes(), len)).collect();
    items.insert(5, (b"each-absent", len));
    items.insert(9, (b"each-big", big.len()));
    items.insert(12, (b"each-big", 1000));
    // What was handed over for each key: its index, and its bytes, None
    // or its error's code.
    type Seen = (usize, Result<Option<Vec<u8>>, ErrorCode>);
    let mut seen: Vec<Seen> = Vec::new();
    c.get_many_each(&items, |i, r| {
        seen.push((i, r.map(|v| v.map(<[u8]>::to_vec)).map_err(code)));
        true
    })
    .expect("batch");
    assert_eq!(seen.len(), items.len());
    let mut stored = 0;
    for (at, (i, r)) in seen.iter().enumerate() {
        assert_eq!(*i, at, "handed out of order");
        match at {
            5 => assert_eq!(r, &Ok(None)),
            9 => assert!(r.as_ref().expect("ok").as_deref() == Some(&big[..])),
            12 => assert_eq!(r, &Err(ErrorCode::BufferTooSmall)),
            _ => {
                let want = value(300 + stored, len);
                stored += 1;
                let got = r.as_ref().expect("ok").as_ref().expect("present");
                assert!(got[..] == want[..], "value {at} differs");
            }
        }
    }
    // Stopped after the third value: nothing more is handed over.
    let mut handed = 0;
    c.get_many_each(&items, |_, _| {
        handed += 1;
        handed < 3
    })
    .expect("batch");
    assert_eq!(handed, 3);
    let last = keys[n - 1].as_bytes();
    let mut out = vec![0u8; len];
    assert_eq!(c.get_into(last, &mut out).expect("get"), Some(len));
    assert!(out == value(300 + n as u64 - 1, len));
    s.shutdown();
}

/// `put_many` stores every item of a batch longer than one round of
/// requests in flight, values of one byte and of several chunks alike,
/// each with its own generation, and reads back as `put` would.
fn put_many_stores_every_item_of_a_batch(t: Transport) {
    let s = server(t);
    let mut c = client(&s);
    let small: Vec<(String, Vec<u8>)> = (0..CACHE_BATCH_KEYS_MAX + 76)
        .map(|i| (format!("pm-{i}"), value(i as u64, 1 + i % 300)))
        .collect();
    let large: Vec<(String, Vec<u8>)> = (0..5)
        .map(|i| {
            (
                format!("pm-large-{i}"),
                value(900 + i, CACHE_CHUNK_BYTES_MAX + 1000 * i as usize),
            )
        })
        .collect();
    let items: Vec<(&[u8], &[u8])> = small
        .iter()
        .chain(&large)
        .map(|(k, v)| (k.as_bytes(), v.as_slice()))
        .collect();
    let got = c.put_many(&items, None).expect("put_many");
    assert_eq!(got.len(), items.len());
    let generations: Vec<u64> = got.into_iter().map(|r| r.expect("stored")).collect();
    for (k, v) in small.iter().chain(&large) {
        assert_eq!(
            c.get(k.as_bytes()).expect("get").as_deref(),
            Some(&v[..]),
            "{k}"
        );
    }
    // A rewrite through put_many is a new generation.
    let again = c.put_many(&items[..1], None).expect("put_many");
    assert_ne!(again[0].as_ref().ok(), Some(&generations[0]));
    s.shutdown();
}

/// `get_many_to` reads a batch longer than one round of requests in
/// flight straight into a registered buffer, each value at its place,
/// values larger than the receive buffer included; an absent key and a
/// value larger than its place leave the place untouched. Where the
/// transport registers no memory, registering is refused.
fn get_many_to_lands_values_in_a_registered_buffer(t: Transport) {
    let s = server(t);
    let mut c = common::cache_client(&s, 64 << 10);
    if !c.one_sided() {
        let e = c.register_buffer(1 << 20).expect_err("no registration");
        assert_eq!(code(e), ErrorCode::Unavailable);
        s.shutdown();
        return;
    }
    let n = CACHE_BATCH_KEYS_MAX + 30;
    let len = 1000;
    let keys: Vec<String> = (0..n).map(|i| format!("to-{i}")).collect();
    let items: Vec<(&[u8], Vec<u8>)> = keys
        .iter()
        .enumerate()
        .map(|(i, k)| (k.as_bytes(), value(i as u64, len)))
        .collect();
    let puts: Vec<(&[u8], &[u8])> = items.iter().map(|(k, v)| (*k, v.as_slice())).collect();
    for r in c.put_many(&puts, None).expect("put_many") {
        r.expect("stored");
    }
    // Larger than the 64 KiB receive buffer.
    let big = value(7, 300_000);
    c.put(b"to-big", &big, None).expect("put");
    let r = c
        .register_buffer(n * len + big.len() + 2 * len)
        .expect("register");
    assert_eq!(c.registered_buffers(), [r]);
    c.registered(&r).expect("mine").fill(5);
    let mut places: Vec<(&[u8], usize, usize)> = (0..n)
        .map(|i| (keys[n - 1 - i].as_bytes(), i * len, len))
        .collect();
    places.push((b"to-big", n * len, big.len()));
    places.push((b"to-absent", n * len + big.len(), len));
    places.push((keys[0].as_bytes(), n * len + big.len() + len, len - 1));
    let got = c.get_many_to(&r, &places).expect("batch");
    assert_eq!(got.len(), places.len());
    for (i, g) in got[..n].iter().enumerate() {
        assert_eq!(g.as_ref().ok(), Some(&Some(len)), "key {i}");
    }
    assert_eq!(got[n].as_ref().ok(), Some(&Some(big.len())));
    assert_eq!(got[n + 1].as_ref().ok(), Some(&None));
    assert_eq!(
        got[n + 2].as_ref().map_err(|e| e.code()).err(),
        Some(ErrorCode::BufferTooSmall)
    );
    let mem = c.registered(&r).expect("mine").to_vec();
    for i in 0..n {
        assert!(
            mem[i * len..(i + 1) * len] == value((n - 1 - i) as u64, len)[..],
            "{i}"
        );
    }
    assert!(mem[n * len..n * len + big.len()] == big[..]);
    assert!(mem[n * len + big.len()..].iter().all(|&b| b == 5));
    // A place past the buffer is refused before anything is sent, and a
    // buffer this client did not register is refused.
    let past = [(keys[0].as_bytes(), r.len as usize - 10, 11)];
    assert_eq!(
        code(c.get_many_to(&r, &past).expect_err("past")),
        ErrorCode::BufferTooSmall
    );
    let foreign = fabrickv_transport::RemoteRegion {
        key: r.key ^ 1,
        ..r
    };
    assert_eq!(
        code(c.get_many_to(&foreign, &[]).expect_err("foreign")),
        ErrorCode::Malformed
    );
    assert_eq!(c.get(keys[0].as_bytes()).expect("get"), Some(value(0, len)));
    // A client registers at most CACHE_REGISTERED_BUFFERS_MAX buffers.
    for _ in 1..CACHE_REGISTERED_BUFFERS_MAX {
        c.register_buffer(4096).expect("register");
    }
    let e = c.register_buffer(4096).expect_err("past the bound");
    assert_eq!(code(e), ErrorCode::InsufficientSpace);
    assert_eq!(c.registered_buffers().len(), CACHE_REGISTERED_BUFFERS_MAX);
    assert_eq!(c.get(keys[1].as_bytes()).expect("get"), Some(value(1, len)));
    s.shutdown();
}

transport_tests!(
    get_many_to_lands_values_in_a_registered_buffer,
    put_many_stores_every_item_of_a_batch,
    get_many_each_hands_every_value_over_in_order,
    exists_many_and_delete_many_answer_each_key_in_order,
    values_round_trip_from_one_byte_to_64_mib,
    a_reader_on_a_chosen_worker_gets_what_another_stored,
    get_at_places_values_and_checks_the_slice_first,
    ttl_expires_actively_without_any_read,
    delete_exists_and_overwrite,
    readers_never_see_a_value_mixed_from_two_writes,
    bind_needs_a_registered_client,
);
