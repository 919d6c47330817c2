//! The embedding parameter server end to end: a real server, the real
//! client, every test once per transport (inline replies over inproc and
//! tcp, one-sided writes into the client's registered region over shm).

#[macro_use]
mod common;

use std::sync::{Arc, Barrier};

use fabrickv_client::{ClientError, Optimizer, PsClient, TableSpec};
use fabrickv_engine::PoolOptions;
use fabrickv_server::ps::{PsConfig, ADAGRAD_EPSILON, ADAGRAD_INITIAL_ACCUMULATOR};
use fabrickv_server::Mode;
use fabrickv_types::limits::PS_KEYS_PER_REQUEST_MAX;
use fabrickv_types::ErrorCode;
use fabrickv_wire::ps::{init_vector, Missing};

use common::{TestServer, Transport, MEMORY_BYTES, TIMEOUT};

/// Embedding pool of a test server, in bytes: small, and lazily backed so
/// parallel tests do not lock memory.
const PS_POOL_BYTES: u64 = 64 << 20;

fn server(t: Transport) -> TestServer {
    TestServer::start_with(t, 2, Mode::Store, MEMORY_BYTES, |c| {
        c.ps = PsConfig {
            pool_bytes: PS_POOL_BYTES,
            pool: PoolOptions::default(),
            tables: Vec::new(),
        };
    })
}

fn ps(s: &TestServer) -> PsClient {
    PsClient::connect_with_timeout(&s.addr, TIMEOUT).expect("ps client connects")
}

fn init(seed: u64, keys: &[u64], dim: usize) -> Vec<f32> {
    let mut v = vec![0f32; keys.len() * dim];
    for (i, k) in keys.iter().enumerate() {
        init_vector(seed, *k, &mut v[i * dim..(i + 1) * dim]);
    }
    v
}

fn transport_is_one_sided_where_it_can_be(t: Transport) {
    let s = server(t);
    let c = ps(&s);
    assert_eq!(c.one_sided(), t == Transport::Shm, "{t:?}");
    s.shutdown();
}

fn a_500_key_pull_lands_in_request_order(t: Transport) {
    let s = server(t);
    let mut c = ps(&s);
    let tab = c.create_table(&TableSpec::new("emb", 128)).expect("create");
    let keys: Vec<u64> = (1..=600).collect();
    let vals = init(3, &keys, 128);
    c.put(&tab, &keys, &vals).expect("put");
    // Reverse order, a repeat and an absent key, more than one request's worth.
    let mut want_keys: Vec<u64> = keys.iter().rev().copied().collect();
    want_keys.push(5);
    want_keys.push(10_000);
    assert!(want_keys.len() > PS_KEYS_PER_REQUEST_MAX);
    let mut out = vec![f32::NAN; want_keys.len() * 128];
    let mut found = vec![false; want_keys.len()];
    let n = c
        .pull_into(&tab, &want_keys, &mut out, Some(&mut found))
        .expect("pull");
    assert_eq!(n, 601);
    for (i, k) in want_keys.iter().enumerate() {
        let row = &out[i * 128..(i + 1) * 128];
        if *k == 10_000 {
            assert!(
                !found[i] && row.iter().all(|x| *x == 0.0),
                "absent key: zeros"
            );
        } else {
            assert!(found[i]);
            assert_eq!(row, &init(3, &[*k], 128)[..], "key {k}");
        }
    }
    s.shutdown();
}

fn several_pulls_in_flight_complete_by_id_and_cancel_frees_them(t: Transport) {
    let s = server(t);
    let mut c = ps(&s);
    let tab = c.create_table(&TableSpec::new("e", 16)).expect("create");
    let keys: Vec<u64> = (0..64).collect();
    c.put(&tab, &keys, &init(0, &keys, 16)).expect("put");
    let ids: Vec<_> = (0..8)
        .map(|i| {
            c.pull_async(&tab, &keys[i * 8..(i + 1) * 8])
                .expect("pull_async")
        })
        .collect();
    c.cancel(ids[3]).expect("cancel");
    assert!(
        c.wait(ids[3]).is_err(),
        "a cancelled pull cannot be waited on"
    );
    // Waiting out of order works; each gets its own keys.
    for i in [7usize, 0, 5, 1, 2, 4, 6] {
        let p = c.wait(ids[i]).expect("wait");
        assert_eq!(p.values, init(0, &keys[i * 8..(i + 1) * 8], 16), "pull {i}");
        assert!(p.found.iter().all(|f| *f));
    }
    // Polling: a pull is done after its reply arrives, without waiting.
    let id = c.pull_async(&tab, &keys[..4]).expect("pull_async");
    common::wait_for("the pull to complete", TIMEOUT, || {
        c.is_done(id).expect("is_done")
    });
    assert_eq!(c.wait(id).expect("wait").values, init(0, &keys[..4], 16));
    // Many rounds reuse the region; nothing leaks.
    for _ in 0..200 {
        let a = c.pull_async(&tab, &keys).expect("pull_async");
        let b = c.pull_async(&tab, &keys).expect("pull_async");
        c.cancel(a).expect("cancel");
        c.wait(b).expect("wait");
    }
    s.shutdown();
}

fn pushes_apply_sgd_and_adagrad_per_key(t: Transport) {
    let s = server(t);
    let mut c = ps(&s);
    let sgd = c
        .create_table(&TableSpec {
            lr: 0.25,
            ..TableSpec::new("sgd", 4)
        })
        .expect("create");
    c.put(&sgd, &[1, 2], &[1.0; 8]).expect("put");
    c.push(&sgd, &[1, 2, 1], &[1.0; 12]).expect("push");
    let p = c.pull(&sgd, &[1, 2]).expect("pull");
    assert_eq!(&p.values[..4], &[0.5; 4], "key 1 got two steps");
    assert_eq!(&p.values[4..], &[0.75; 4], "key 2 got one");

    let ada = c
        .create_table(&TableSpec {
            optimizer: Optimizer::Adagrad,
            lr: 0.5,
            ..TableSpec::new("ada", 2)
        })
        .expect("create");
    c.put(&ada, &[7], &[0.0, 0.0]).expect("put");
    c.push(&ada, &[7], &[2.0, -2.0]).expect("push");
    let w = -0.5 * 2.0 / ((ADAGRAD_INITIAL_ACCUMULATOR + 4.0).sqrt() + ADAGRAD_EPSILON);
    let got = c.pull(&ada, &[7]).expect("pull").values;
    assert!(
        (got[0] - w).abs() < 1e-6 && (got[1] + w).abs() < 1e-6,
        "{got:?}"
    );
    s.shutdown();
}

fn concurrent_pushers_lose_no_update(t: Transport) {
    let s = Arc::new(server(t));
    let mut c = ps(&s);
    let tab = c
        .create_table(&TableSpec {
            lr: 1.0,
            ..TableSpec::new("hot", 8)
        })
        .expect("create");
    c.put(&tab, &[42], &[0.0; 8]).expect("put");
    let threads = 4;
    let pushes = 250;
    let barrier = Arc::new(Barrier::new(threads));
    let hs: Vec<_> = (0..threads)
        .map(|_| {
            let (s, b, tab) = (s.clone(), barrier.clone(), tab.clone());
            std::thread::spawn(move || {
                let mut c = ps(&s);
                b.wait();
                for _ in 0..pushes {
                    // A gradient of -1 adds exactly 1 to every element.
                    c.push(&tab, &[42], &[-1.0; 8]).expect("push");
                }
            })
        })
        .collect();
    for h in hs {
        h.join().expect("pusher");
    }
    let v = c.pull(&tab, &[42]).expect("pull").values;
    assert_eq!(
        v,
        vec![(threads * pushes) as f32; 8],
        "every update applied once"
    );
    if let Ok(s) = Arc::try_unwrap(s) {
        s.shutdown();
    }
}

fn tables_are_shared_by_name_and_refuse_bad_shapes(t: Transport) {
    let s = server(t);
    let mut a = ps(&s);
    let mut b = ps(&s);
    let spec = TableSpec {
        missing: Missing::Init,
        seed: 9,
        ..TableSpec::new("shared", 3)
    };
    let ta = a.create_table(&spec).expect("create");
    let tb = b.open_table("shared").expect("open");
    assert_eq!(ta.id, tb.id);
    a.put(&ta, &[1], &[1.0, 2.0, 3.0]).expect("put");
    assert_eq!(b.pull(&tb, &[1]).expect("pull").values, vec![1.0, 2.0, 3.0]);
    let p = b.pull(&tb, &[2]).expect("pull");
    assert_eq!(
        (p.values, p.found),
        (init(9, &[2], 3), vec![false]),
        "initializer for absent"
    );
    fn err<T>(r: Result<T, ClientError>) -> Option<ErrorCode> {
        r.err().map(|e| e.code())
    }
    assert_eq!(err(a.open_table("nope")), Some(ErrorCode::NoSuchTable));
    assert_eq!(
        err(a.create_table(&TableSpec::new("shared", 4))),
        Some(ErrorCode::TableExists)
    );
    assert_eq!(
        err(a.put(&ta, &[1, 2], &[0.0; 3])),
        Some(ErrorCode::BadDimension),
        "refused before sending"
    );
    let tables = b.tables().expect("list");
    assert_eq!(tables.len(), 1);
    assert_eq!(tables[0].items, 1);
    s.shutdown();
}

fn stats_count_pulls_and_pushes(t: Transport) {
    let s = server(t);
    let mut c = ps(&s);
    let tab = c.create_table(&TableSpec::new("st", 4)).expect("create");
    c.put(&tab, &[1, 2, 3], &[0.5; 12]).expect("put");
    c.pull(&tab, &[1, 2, 9]).expect("pull");
    let mut kv = s.client();
    let st = common::stats(&mut kv);
    assert_eq!(st["ps_tables"], 1);
    assert_eq!(st["ps_items"], 3);
    assert_eq!(st["ps_pulls"], 1);
    assert_eq!(st["ps_pull_keys"], 3);
    assert_eq!(st["ps_pull_misses"], 1);
    assert_eq!(st["ps_push_keys"], 3);
    let one_sided = if t == Transport::Shm { 3 * 16 } else { 0 };
    assert_eq!(st["ps_one_sided_bytes"], one_sided);
    s.shutdown();
}

/// A client can be put on the worker of its choosing (beside a pinned
/// worker); every worker serves every table, and a worker the server lacks
/// is refused with the server's count.
fn a_client_on_a_chosen_worker_reads_what_another_wrote(t: Transport) {
    let s = server(t);
    assert_eq!(
        fabrickv_client::server_workers(&s.addr, TIMEOUT).expect("hello"),
        2
    );
    let mut w0 = PsClient::connect_worker(&s.addr, 0, TIMEOUT).expect("worker 0");
    let mut w1 = PsClient::connect_worker(&s.addr, 1, TIMEOUT).expect("worker 1");
    assert_eq!((w0.worker(), w1.worker()), (0, 1));
    let tab = w0
        .create_table(&TableSpec::new("chosen", 8))
        .expect("create");
    let keys: Vec<u64> = (1..=50).collect();
    let vals = init(11, &keys, 8);
    w0.put(&tab, &keys, &vals).expect("put on worker 0");
    let tab1 = w1.open_table("chosen").expect("open on worker 1");
    let got = w1.pull(&tab1, &keys).expect("pull on worker 1");
    assert_eq!(got.values, vals);
    assert!(got.found.iter().all(|&f| f));
    common::assert_no_worker_2_of_2(PsClient::connect_worker(&s.addr, 2, TIMEOUT));
    s.shutdown();
}

/// A `pull_into` while other pulls are outstanding lands only its own
/// vectors in the caller's slice (over tcp its replies land there
/// straight): the others complete with theirs, whichever call reads them.
fn pull_into_beside_outstanding_pulls_lands_only_its_own(t: Transport) {
    let s = server(t);
    let mut c = ps(&s);
    let tab = c
        .create_table(&TableSpec::new("beside", 16))
        .expect("create");
    let keys: Vec<u64> = (1..=1200).collect();
    c.put(&tab, &keys, &init(7, &keys, 16)).expect("put");
    let early = c.pull_async(&tab, &keys[..700]).expect("pull_async");
    let mut out = vec![f32::NAN; 900 * 16];
    assert_eq!(
        c.pull_into(&tab, &keys[300..], &mut out, None)
            .expect("pull_into"),
        900
    );
    assert!(out == init(7, &keys[300..], 16));
    let late = c.pull_async(&tab, &keys[..5]).expect("pull_async");
    assert!(c.wait(early).expect("early").values == init(7, &keys[..700], 16));
    assert!(c.wait(late).expect("late").values == init(7, &keys[..5], 16));
    s.shutdown();
}

transport_tests!(
    pull_into_beside_outstanding_pulls_lands_only_its_own,
    transport_is_one_sided_where_it_can_be,
    a_client_on_a_chosen_worker_reads_what_another_wrote,
    a_500_key_pull_lands_in_request_order,
    several_pulls_in_flight_complete_by_id_and_cancel_frees_them,
    pushes_apply_sgd_and_adagrad_per_key,
    concurrent_pushers_lose_no_update,
    tables_are_shared_by_name_and_refuse_bad_shapes,
    stats_count_pulls_and_pushes,
);
