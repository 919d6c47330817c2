//! Requests changed in shared memory while the server reads them (issue
//! 28, fault 2): an shm client can write its request ring at any time, so
//! bytes the server checked could change before they were used. SHARD
//! GETs naming a 64-byte non-ASCII shard, with one name byte flipping,
//! panicked the worker (a `&str` into the ring that was no longer UTF-8)
//! within seconds, and that worker never answered again. Here a peer
//! thread flips random bytes of the requests just published, for every
//! frame kind, while other clients check that every worker keeps
//! answering.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use fabrickv_client::{Client, Kv};
use fabrickv_server::Mode;
use fabrickv_transport::Endpoint;
use fabrickv_transport_shm::{ShmEndpoint, RECORD_HEADER_BYTES, RING_BYTES};
use fabrickv_wire::ps::PushMode;
use fabrickv_wire::{PutCondition, RequestBuilder};

#[allow(unused_macros)]
mod common;
use common::{TestServer, Transport, MEMORY_BYTES, TIMEOUT};

/// How long each frame kind is attacked, in milliseconds.
const ATTACK_PER_KIND_MS: u64 = 1_500;

/// Bytes past the server's head in which the flipper aims: the requests
/// it is reading or about to.
const FLIP_WINDOW_BYTES: usize = 16 << 10;

/// Requests posted on one connection before the attacker opens a fresh
/// one, so that records never wrap and their offsets stay known.
const POSTED_BYTES_PER_CONN_MAX: usize = RING_BYTES / 2;

/// A 64-byte shard or table name of two-byte characters.
fn hostile_name() -> String {
    "é".repeat(32)
}

/// One request frame of each kind the server decodes.
fn frames(worker: u16) -> Vec<(&'static str, Vec<u8>)> {
    let name = hostile_name();
    let kv = |build: &dyn Fn(&mut RequestBuilder<'_>)| {
        let mut buf = Vec::new();
        let mut b = RequestBuilder::new(&mut buf, 7, worker);
        build(&mut b);
        b.finish();
        buf
    };
    let mut out = vec![
        (
            "kv get",
            kv(&|b| {
                b.get(b"key-a").get(name.as_bytes()).get(b"key-b");
            }),
        ),
        (
            "kv put",
            kv(&|b| {
                b.put(name.as_bytes(), b"value", 0, PutCondition::Always)
                    .put(b"k2", &[0xff; 64], 10_000, PutCondition::IfAbsent);
            }),
        ),
        (
            "kv delete",
            kv(&|b| {
                b.delete(name.as_bytes()).delete(b"k2");
            }),
        ),
    ];
    let mut f = Vec::new();
    fabrickv_wire::ps::encode_open(&mut f, 8, worker, &name);
    out.push(("ps open", f));
    let mut f = Vec::new();
    fabrickv_wire::ps::encode_pull(&mut f, 9, worker, 1, &[1, 2, 3], None);
    out.push(("ps pull", f));
    let mut f = Vec::new();
    let values = [0.5f32; 8];
    fabrickv_wire::ps::encode_push(
        &mut f,
        10,
        worker,
        1,
        PushMode::Gradient,
        &[1, 2],
        &values,
        None,
    );
    out.push(("ps push", f));
    let mut f = Vec::new();
    fabrickv_wire::cache::encode_put_chunk(
        &mut f,
        11,
        worker,
        name.as_bytes(),
        1,
        0,
        16,
        0,
        &[1; 16],
    );
    out.push(("cache put", f));
    let mut f = Vec::new();
    fabrickv_wire::cache::encode_get(&mut f, 12, worker, name.as_bytes(), 0, 0, 64, None);
    out.push(("cache get", f));
    let mut f = Vec::new();
    fabrickv_wire::shard_data::encode_get(&mut f, 13, worker, &name, &[b"k".as_slice()]);
    out.push(("shard get", f));
    let mut f = Vec::new();
    fabrickv_wire::shard_data::encode_delete(&mut f, 14, worker, &name, &[b"k".as_slice()]);
    out.push(("shard delete", f));
    let mut f = Vec::new();
    fabrickv_wire::control::encode_hello(&mut f, 15, worker);
    out.push(("hello", f));
    let mut f = Vec::new();
    fabrickv_wire::control::encode_stats_request(&mut f, 16, worker);
    out.push(("stats", f));
    out
}

/// A small xorshift: the flipper needs cheap numbers, not good ones.
fn next(state: &mut u64) -> u64 {
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    *state
}

/// Flip sweeps before the flipper aims at another byte of the records.
const SWEEPS_PER_TARGET: u32 = 500;

/// Posts `frame` on fresh connections to `worker` until `stop`, while a
/// second thread keeps flipping one bit of every record among the first
/// `FLIP_WINDOW_BYTES` the server has not released: the same byte of each (the records are all
/// `frame`), chosen at random, so that whichever field it lands in changes
/// again and again while the server checks and uses it.
fn attack(name: &str, worker: u16, frame: &[u8], stop: &AtomicBool, seed: u64) -> u64 {
    let rec = RECORD_HEADER_BYTES + frame.len().div_ceil(8) * 8;
    let mut posted_total = 0;
    while !stop.load(Ordering::Acquire) {
        let Ok(mut ep) = ShmEndpoint::connect(name, worker, TIMEOUT) else {
            std::thread::sleep(Duration::from_millis(5));
            continue;
        };
        let scribbler = ep.scribbler();
        let posted = Arc::new(AtomicUsize::new(0));
        let flipping = Arc::new(AtomicBool::new(true));
        let (p, f) = (posted.clone(), flipping.clone());
        let flipper = std::thread::spawn(move || {
            let mut rng = seed | 1;
            let mut sweeps = 0;
            let (mut at, mut mask) = (0, 0);
            while f.load(Ordering::Relaxed) {
                if sweeps % SWEEPS_PER_TARGET == 0 {
                    let r = next(&mut rng);
                    at = RECORD_HEADER_BYTES + r as usize % (rec - RECORD_HEADER_BYTES);
                    // The top bit half the time: it turns a UTF-8 lead
                    // byte into ASCII and back.
                    mask = if r >> 40 & 1 == 0 {
                        0x80
                    } else {
                        1 << ((r >> 41) % 8)
                    };
                }
                sweeps += 1;
                // The records the server has yet to release: the ones it
                // is reading or about to.
                let start = scribbler.consumed() / rec;
                let end = (p.load(Ordering::Relaxed) / rec).min(start + FLIP_WINDOW_BYTES / rec);
                for k in start..end {
                    scribbler.flip(k * rec + at, mask);
                }
                if start == end {
                    std::hint::spin_loop();
                }
            }
        });
        while !stop.load(Ordering::Acquire)
            && posted.load(Ordering::Relaxed) + rec <= POSTED_BYTES_PER_CONN_MAX
        {
            match ep.post_unread(frame) {
                Ok(true) => {
                    posted.fetch_add(rec, Ordering::Relaxed);
                    posted_total += 1;
                }
                Ok(false) => {}
                Err(_) => break,
            }
            if ep.poll(64, &mut |_| {}).is_err() {
                break;
            }
        }
        flipping.store(false, Ordering::Relaxed);
        flipper.join().expect("flipper");
    }
    posted_total
}

/// Every worker answers a put and a get of a key it owns.
fn every_worker_answers(s: &TestServer, round: usize) {
    let mut c = Client::connect_with_timeout(&s.addr, TIMEOUT).expect("connect");
    for w in 0..s.workers {
        let key = common::keys_of_worker(&c, w, 1, &format!("probe-{round}"))
            .pop()
            .expect("a key");
        c.put(&key, b"v")
            .unwrap_or_else(|e| panic!("worker {w} stopped answering: {e}"));
        assert_eq!(c.get(&key).expect("get").as_deref(), Some(&b"v"[..]));
    }
}

#[test]
fn shm_requests_flipped_while_the_server_parses_them_never_stop_a_worker() {
    let s = TestServer::start(Transport::Shm, 2, Mode::Store, MEMORY_BYTES);
    let name = s.shm_name().to_string();
    every_worker_answers(&s, 0);
    for (round, (kind, _)) in frames(0).iter().enumerate() {
        let stop = Arc::new(AtomicBool::new(false));
        let attackers: Vec<_> = (0..s.workers)
            .map(|w| {
                let (name, stop) = (name.clone(), stop.clone());
                let frame = frames(w).swap_remove(round).1;
                std::thread::spawn(move || attack(&name, w, &frame, &stop, round as u64 + 1))
            })
            .collect();
        let until = Instant::now() + Duration::from_millis(ATTACK_PER_KIND_MS);
        while Instant::now() < until {
            every_worker_answers(&s, round);
        }
        stop.store(true, Ordering::Release);
        let posted: u64 = attackers
            .into_iter()
            .map(|t| t.join().expect("attacker"))
            .sum();
        assert!(posted > 0, "{kind}: no request was posted");
        every_worker_answers(&s, round);
    }
}
