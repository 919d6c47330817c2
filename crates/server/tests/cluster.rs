//! The cluster clients end to end: three real servers per test, keys
//! sharded by jump consistent hash, every test once per transport.
//!
//! - kv: a batch split over the servers comes back in request order and
//!   matches a one-server reference; the keys really are spread;
//! - ps: a table spans the servers; pulled rows land at their keys'
//!   positions; pushes apply where the rows live;
//! - cache: values are put and read through their owners' clients;
//! - a server that goes down fails only the calls that need it, with an
//!   error naming it, within the timeout, and is picked up again once a
//!   server listens at its address;
//! - a cluster joined through the memcached registry.

#[macro_use]
mod common;

use std::time::{Duration, Instant};

use fabrickv_client::Kv;
use fabrickv_client::{
    BatchOp, Client, ClientError, ClusterCache, ClusterClient, ClusterOptions, ClusterPs,
    Optimizer, PsClient, TableSpec,
};
use fabrickv_cluster::local::LocalMemcached;
use fabrickv_cluster::{Cluster, Registration, Registry, ServerDesc};
use fabrickv_server::Mode;
use fabrickv_types::ErrorCode;
use fabrickv_wire::ps::{init_vector, Missing};
use fabrickv_wire::PutCondition;

use common::{small_pools, value_of, wait_for, TestServer, Transport, MEMORY_BYTES, TIMEOUT};

/// Servers per test cluster.
const SERVERS: usize = 3;

/// Receive buffer of each cache client, in bytes.
const CACHE_BUFFER_BYTES: usize = 2 << 20;

/// The short timeout of the down-server test.
const SHORT_TIMEOUT: Duration = Duration::from_secs(1);

/// How late past the timeout a failure may come on a loaded test machine.
const LATE_MARGIN: Duration = Duration::from_secs(2);

/// A server with kv, embedding tables and the cache, listening at `listen`
/// if given (to restart one at a dead one's address).
fn server_at(t: Transport, listen: Option<&str>) -> TestServer {
    TestServer::start_with(t, 2, Mode::Store, MEMORY_BYTES, |c| {
        if let Some(a) = listen {
            c.listen = a.to_string();
        }
        small_pools(c);
    })
}

fn servers(t: Transport) -> Vec<TestServer> {
    (0..SERVERS).map(|_| server_at(t, None)).collect()
}

fn cluster_of(servers: &[TestServer]) -> Cluster {
    let addrs: Vec<&str> = servers.iter().map(|s| s.addr.as_str()).collect();
    Cluster::of_addrs("it", &addrs).expect("a valid cluster")
}

fn opts(timeout: Duration) -> ClusterOptions {
    ClusterOptions {
        transport: None,
        timeout,
        ..Default::default()
    }
}

fn kv(servers: &[TestServer]) -> ClusterClient {
    ClusterClient::connect(&cluster_of(servers), opts(TIMEOUT)).expect("cluster client connects")
}

fn key(i: usize) -> Vec<u8> {
    format!("ck-{i}").into_bytes()
}

fn items_of(s: &TestServer) -> u64 {
    common::stat(&mut s.client(), "items")
}

fn kv_batches_split_and_merge_in_request_order(t: Transport) {
    let ss = servers(t);
    let mut c = kv(&ss);
    assert_eq!(c.size(), SERVERS as u32);
    let reference = server_at(t, None);
    let mut r =
        ClusterClient::connect(&cluster_of(std::slice::from_ref(&reference)), opts(TIMEOUT))
            .expect("one-server reference connects");

    let items: Vec<(Vec<u8>, Vec<u8>)> = (0..1000)
        .map(|i| (key(i), value_of(i as u64, 1 + i % 300)))
        .collect();
    c.mput(&items, None).expect("mput");
    r.mput(&items, None).expect("reference mput");
    let keys: Vec<Vec<u8>> = items.iter().map(|(k, _)| k.clone()).collect();
    let got = c.mget(&keys).expect("mget");
    for (i, g) in got.iter().enumerate() {
        assert_eq!(g.as_deref(), Some(&items[i].1[..]), "key {i}");
    }

    // Every server holds exactly the keys the hash gives it, and each
    // holds some.
    let mut per = [0u64; SERVERS];
    for k in &keys {
        per[c.server_of(k) as usize] += 1;
    }
    for (s, srv) in ss.iter().enumerate() {
        assert!(per[s] > 200, "server {s} owns only {} of 1000 keys", per[s]);
        assert_eq!(items_of(srv), per[s], "items on server {s}");
    }
    let k0 = &keys[7];
    let owner = c.server_of(k0) as usize;
    assert_eq!(
        ss[owner].client().get(k0).expect("direct get").as_deref(),
        Some(&items[7].1[..])
    );
    let other = (owner + 1) % SERVERS;
    assert_eq!(ss[other].client().get(k0).expect("direct get"), None);

    // Values too large to share a reply frame: GETs answered REPLY_FULL
    // are sent again, on every server, and still merge in order.
    let big: Vec<(Vec<u8>, Vec<u8>)> = (0..24)
        .map(|i| {
            (
                format!("big-{i}").into_bytes(),
                value_of(5000 + i, 300 << 10),
            )
        })
        .collect();
    c.mput(&big, None).expect("big mput");
    r.mput(&big, None).expect("reference big mput");
    let big_keys: Vec<&[u8]> = big.iter().rev().map(|(k, _)| &k[..]).collect();
    let got = c.mget(&big_keys).expect("big mget");
    for (g, (_, v)) in got.iter().zip(big.iter().rev()) {
        assert_eq!(g.as_deref(), Some(&v[..]));
    }

    // A mixed batch: the same outcomes, in the same order, as one server.
    let absent = b"never-stored".to_vec();
    let fresh = b"fresh-key".to_vec();
    let mut ops = Vec::new();
    for i in (0..1000).step_by(7) {
        ops.push(BatchOp::Get { key: &keys[i] });
        if i % 3 == 0 {
            ops.push(BatchOp::Delete { key: &keys[i + 1] });
            ops.push(BatchOp::Get { key: &keys[i + 1] });
        }
        if i % 5 == 0 {
            ops.push(BatchOp::Put {
                key: &keys[i + 2],
                value: b"replaced",
                ttl_ms: 0,
                cond: PutCondition::IfPresent,
            });
        }
    }
    ops.push(BatchOp::Get { key: &absent });
    ops.push(BatchOp::Put {
        key: &fresh,
        value: b"v",
        ttl_ms: 0,
        cond: PutCondition::IfAbsent,
    });
    ops.push(BatchOp::Put {
        key: &fresh,
        value: b"w",
        ttl_ms: 0,
        cond: PutCondition::IfAbsent,
    });
    ops.push(BatchOp::Get { key: &fresh });
    let got = c.execute(&ops).expect("mixed batch");
    let want = r.execute(&ops).expect("reference batch");
    assert_eq!(got.len(), ops.len());
    assert_eq!(got, want, "the cluster answers as one server does");
    assert_eq!(got.last().map(|o| &o.value[..]), Some(&b"v"[..]));

    // mdelete: per key whether it was there, in order.
    let del: Vec<&[u8]> = (0..1000).step_by(3).map(|i| &keys[i][..]).collect();
    assert_eq!(
        c.mdelete(&del).expect("mdelete"),
        r.mdelete(&del).expect("reference mdelete")
    );
    assert_eq!(c.mget(&del).expect("mget"), vec![None; del.len()]);
    let total: u64 = ss.iter().map(items_of).sum();
    assert_eq!(total, items_of(&reference));

    // Single-key calls and TTL.
    assert!(c
        .put_with(b"cond", b"1", None, PutCondition::IfAbsent)
        .expect("put_with"));
    assert!(!c
        .put_with(b"cond", b"2", None, PutCondition::IfAbsent)
        .expect("put_with"));
    assert_eq!(c.get(b"cond").expect("get"), Some(b"1".to_vec()));
    assert!(c.delete(b"cond").expect("delete"));
    assert!(!c.delete(b"cond").expect("delete"));
    c.put_ttl(b"short", b"x", Some(Duration::from_millis(50)))
        .expect("put_ttl");
    c.put_ttl(b"long", b"y", Some(Duration::from_secs(600)))
        .expect("put_ttl");
    wait_for("the 50 ms key to expire", TIMEOUT, || {
        c.get(b"short").expect("get").is_none()
    });
    assert_eq!(c.get(b"long").expect("get"), Some(b"y".to_vec()));

    // Stats come per server.
    let stats = c.stats();
    assert_eq!(stats.len(), SERVERS);
    for s in stats {
        assert!(s.expect("stats").contains_key("items"));
    }
    for s in ss {
        s.shutdown();
    }
    reference.shutdown();
}

fn init(seed: u64, keys: &[u64], dim: usize) -> Vec<f32> {
    let mut v = vec![0f32; keys.len() * dim];
    for (i, k) in keys.iter().enumerate() {
        init_vector(seed, *k, &mut v[i * dim..(i + 1) * dim]);
    }
    v
}

fn ps_tables_span_the_cluster(t: Transport) {
    let ss = servers(t);
    let mut c = ClusterPs::connect(&cluster_of(&ss), opts(TIMEOUT)).expect("ps connects");
    let dim = 16;
    let tab = c
        .create_table(&TableSpec {
            lr: 0.5,
            ..TableSpec::new("emb", dim as u32)
        })
        .expect("create");
    let keys: Vec<u64> = (1..=600).collect();
    let vals = init(9, &keys, dim);
    c.put(&tab, &keys, &vals).expect("put");

    let tables = c.tables().expect("tables");
    let info = tables
        .iter()
        .find(|i| i.spec.name == "emb")
        .expect("listed");
    assert_eq!(info.items, 600);
    for (s, n) in info.items_per_server.iter().enumerate() {
        let n = n.expect("every server is up");
        assert!(n > 100, "server {s} holds only {n} of 600 rows");
    }

    // Reversed, with absent keys mixed in: rows land at their positions,
    // absent ones follow the table's policy (zeros).
    let mut ask: Vec<u64> = keys.iter().rev().copied().collect();
    ask.insert(10, 10_001);
    ask.push(10_002);
    let mut out = vec![f32::NAN; ask.len() * dim];
    let mut found = vec![false; ask.len()];
    let held = c
        .pull_into(&tab, &ask, &mut out, Some(&mut found))
        .expect("pull");
    assert_eq!(held, 600);
    for (i, k) in ask.iter().enumerate() {
        let row = &out[i * dim..(i + 1) * dim];
        if *k > 600 {
            assert!(!found[i]);
            assert!(row.iter().all(|x| *x == 0.0), "missing key {k}");
        } else {
            assert!(found[i]);
            let j = (*k - 1) as usize;
            assert_eq!(row, &vals[j * dim..(j + 1) * dim], "key {k}");
        }
    }

    // A row lives on its owner only.
    let k = 42u64;
    let owner = c.server_of(k) as usize;
    let mut direct = PsClient::connect_with_timeout(&ss[owner].addr, TIMEOUT).expect("ps");
    let dt = direct.open_table("emb").expect("open on the owner");
    let p = direct.pull(&dt, &[k]).expect("direct pull");
    assert_eq!(p.found, vec![true]);
    let mut other =
        PsClient::connect_with_timeout(&ss[(owner + 1) % SERVERS].addr, TIMEOUT).expect("ps");
    let ot = other.open_table("emb").expect("open elsewhere");
    assert_eq!(other.pull(&ot, &[k]).expect("pull").found, vec![false]);

    // SGD: v -= lr * g, applied where each row lives.
    let grads = vec![1.0f32; keys.len() * dim];
    c.push(&tab, &keys, &grads).expect("push");
    let pulled = c.pull(&tab, &keys).expect("pull after push");
    for (g, w) in pulled.values.iter().zip(&vals) {
        assert!((g - (w - 0.5)).abs() < 1e-6, "{g} vs {}", w - 0.5);
    }
    assert!(pulled.found.iter().all(|f| *f));

    // Async: two pulls in flight, waited in reverse.
    let a = c.pull_async(&tab, &keys[..300]).expect("pull a");
    let b = c.pull_async(&tab, &keys[300..]).expect("pull b");
    let mut ob = vec![0f32; 300 * dim];
    let mut oa = vec![0f32; 300 * dim];
    assert_eq!(c.wait_into(b, &mut ob, None).expect("wait b"), 300);
    assert_eq!(c.wait_into(a, &mut oa, None).expect("wait a"), 300);
    assert_eq!(&oa[..], &pulled.values[..300 * dim]);
    assert_eq!(&ob[..], &pulled.values[300 * dim..]);

    // A table whose missing rows are the initializer's, opened by name.
    c.create_table(&TableSpec {
        missing: Missing::Init,
        optimizer: Optimizer::Sgd,
        seed: 77,
        ..TableSpec::new("init", 8)
    })
    .expect("create init table");
    let it = c.open_table("init").expect("open by name");
    assert_eq!(it.spec().missing, Missing::Init);
    let ask: Vec<u64> = (1000..1100).collect();
    let p = c.pull(&it, &ask).expect("pull absent");
    assert_eq!(p.values, init(77, &ask, 8));
    assert!(p.found.iter().all(|f| !*f));
    for s in ss {
        s.shutdown();
    }
}

fn cache_spans_the_cluster(t: Transport) {
    let ss = servers(t);
    let mut c = ClusterCache::connect(&cluster_of(&ss), opts(TIMEOUT), CACHE_BUFFER_BYTES)
        .expect("cache connects");
    let sizes = [1usize, 100, 4096, 600 << 10];
    let keys: Vec<Vec<u8>> = (0..40).map(|i| format!("cache-{i}").into_bytes()).collect();
    let vals: Vec<Vec<u8>> = (0..40)
        .map(|i| value_of(i as u64, sizes[i % sizes.len()]))
        .collect();
    let mut per = [0; SERVERS];
    // Half one by one, half in one batch split over the servers.
    for (k, v) in keys.iter().zip(&vals).take(20) {
        c.put(k, v, None).expect("put");
    }
    let batch: Vec<(&[u8], &[u8])> = keys
        .iter()
        .zip(&vals)
        .skip(20)
        .map(|(k, v)| (&k[..], &v[..]))
        .collect();
    let stored = c.put_many(&batch, None).expect("put_many");
    assert_eq!(stored.len(), batch.len());
    assert!(stored.iter().all(Result::is_ok), "{stored:?}");
    for k in &keys {
        per[c.server_of(k) as usize] += 1;
    }
    assert!(per.iter().all(|n| *n > 0), "keys on every server: {per:?}");
    for (k, v) in keys.iter().zip(&vals) {
        assert_eq!(c.get(k).expect("get").as_deref(), Some(&v[..]));
        let mut dst = vec![0u8; 1 << 20];
        let n = c.get_into(k, &mut dst).expect("get_into").expect("present");
        assert_eq!(&dst[..n], &v[..]);
        let p = c.get_at(k, 64).expect("get_at").expect("present");
        assert_eq!(p.server, c.server_of(k));
        let buf = c.buffer(p.server).expect("buffer");
        assert_eq!(
            &buf[p.placed.offset..p.placed.offset + p.placed.len],
            &v[..]
        );
    }
    // A batch: small values, each at its own offset of its owner's buffer.
    let small: Vec<usize> = (0..40).filter(|i| vals[*i].len() <= 4096).collect();
    let items: Vec<(&[u8], usize)> = small
        .iter()
        .enumerate()
        .map(|(j, &i)| (&keys[i][..], j * 4096))
        .chain(std::iter::once((&b"cache-absent"[..], 0)))
        .collect();
    let got = c.get_many_at(&items).expect("get_many_at");
    assert_eq!(got.len(), items.len());
    for (j, &i) in small.iter().enumerate() {
        let p = got[j].as_ref().expect("ok").expect("present");
        assert_eq!(p.server, c.server_of(&keys[i]));
        assert_eq!(p.placed.offset, j * 4096);
        let buf = c.buffer(p.server).expect("buffer");
        assert_eq!(
            &buf[p.placed.offset..p.placed.offset + p.placed.len],
            &vals[i][..]
        );
    }
    assert_eq!(*got.last().expect("last").as_ref().expect("ok"), None);

    // The batched key operations: every server's part at once, the
    // answers merged in request order.
    let refs: Vec<&[u8]> = keys
        .iter()
        .map(Vec::as_slice)
        .chain(std::iter::once(&b"cache-absent"[..]))
        .collect();
    let mut want = vec![true; keys.len()];
    want.push(false);
    assert_eq!(c.exists_many(&refs).expect("exists_many"), want);

    assert!(c.exists(&keys[3]).expect("exists"));
    assert!(c.delete(&keys[3]).expect("delete"));
    assert!(!c.exists(&keys[3]).expect("exists"));
    want[3] = false;
    assert_eq!(c.exists_many(&refs).expect("exists_many"), want);
    assert_eq!(c.get(&keys[3]).expect("get"), None);
    for s in ss {
        s.shutdown();
    }
}

/// Asserts that `r` failed at server `id` (address `addr`), as a down
/// server fails, and within the short timeout.
fn assert_down<T: std::fmt::Debug>(
    r: Result<T, ClientError>,
    started: Instant,
    id: u32,
    addr: &str,
) {
    let took = started.elapsed();
    let e = r.expect_err("a call needing the dead server fails");
    assert!(
        took < SHORT_TIMEOUT + LATE_MARGIN,
        "failed after {took:?}, past the {SHORT_TIMEOUT:?} timeout"
    );
    let text = e.to_string();
    assert!(
        text.contains(&format!("server {id} ")) && text.contains(addr),
        "the error names the server: {text}"
    );
    assert!(
        matches!(e.code(), ErrorCode::Unavailable | ErrorCode::Timeout),
        "code {:?}: {text}",
        e.code()
    );
    assert!(
        matches!(e, ClientError::AtServer { id: i, .. } if i == id),
        "{e:?}"
    );
}

fn a_down_server_fails_only_its_keys_and_comes_back(t: Transport) {
    let mut ss = servers(t);
    let cluster = cluster_of(&ss);
    let mut c = ClusterClient::connect(&cluster, opts(SHORT_TIMEOUT)).expect("connects");
    let mut ps = ClusterPs::connect(&cluster, opts(SHORT_TIMEOUT)).expect("ps connects");
    let tab = ps.create_table(&TableSpec::new("d", 4)).expect("create");
    let mut cache =
        ClusterCache::connect(&cluster, opts(SHORT_TIMEOUT), CACHE_BUFFER_BYTES).expect("cache");
    let keys: Vec<Vec<u8>> = (0..300).map(key).collect();
    let items: Vec<(&[u8], &[u8])> = keys.iter().map(|k| (&k[..], &b"val"[..])).collect();
    c.mput(&items, None).expect("mput");
    let rows: Vec<u64> = (0..300).collect();
    ps.put(&tab, &rows, &vec![1.0; rows.len() * 4])
        .expect("put rows");

    let dead = 1u32;
    let dead_addr = ss[dead as usize].addr.clone();
    ss.remove(dead as usize).shutdown();
    let live: Vec<&[u8]> = keys
        .iter()
        .filter(|k| c.server_of(k) != dead)
        .map(|k| &k[..])
        .collect();
    let on_dead: Vec<&[u8]> = keys
        .iter()
        .filter(|k| c.server_of(k) == dead)
        .map(|k| &k[..])
        .collect();
    assert!(!live.is_empty() && !on_dead.is_empty());

    // The live servers keep serving.
    assert!(c
        .mget(&live)
        .expect("live keys")
        .iter()
        .all(Option::is_some));
    let live_rows: Vec<u64> = rows
        .iter()
        .copied()
        .filter(|k| ps.server_of(*k) != dead)
        .collect();
    let p = ps.pull(&tab, &live_rows).expect("live rows");
    assert!(p.found.iter().all(|f| *f));

    // A batch needing the dead server fails, naming it, within the
    // timeout: first on the connection it had, then on reconnecting.
    let mixed = [live[0], on_dead[0], live[1]];
    for _ in 0..2 {
        let started = Instant::now();
        assert_down(c.mget(&mixed), started, dead, &dead_addr);
        assert!(!c.is_up(dead));
    }
    let started = Instant::now();
    assert_down(ps.pull(&tab, &rows), started, dead, &dead_addr);
    let started = Instant::now();
    assert_down(ps.pull(&tab, &rows), started, dead, &dead_addr);
    let started = Instant::now();
    assert_down(cache.put(on_dead[0], b"c", None), started, dead, &dead_addr);
    assert!(cache.put(live[0], b"c", None).is_ok());
    // ... and the live ones still answer afterwards.
    assert!(c
        .mget(&live)
        .expect("live keys")
        .iter()
        .all(Option::is_some));
    assert!(ps
        .pull(&tab, &live_rows)
        .expect("live rows")
        .found
        .iter()
        .all(|f| *f));

    // A server listening at the dead one's address again is picked up by
    // the next call that needs it (it starts empty).
    let back = server_at(t, Some(&dead_addr));
    assert_eq!(back.addr, dead_addr);
    assert_eq!(c.get(on_dead[0]).expect("the server is back"), None);
    c.put(on_dead[0], b"again").expect("put");
    assert_eq!(c.get(on_dead[0]).expect("get"), Some(b"again".to_vec()));
    assert!(c.is_up(dead));
    let p = ps.pull(&tab, &rows).expect("every row's server is up");
    for (i, k) in rows.iter().enumerate() {
        assert_eq!(p.found[i], ps.server_of(*k) != dead, "row {k}");
    }
    cache
        .put(on_dead[0], b"c", None)
        .expect("cache put, server back");
    assert_eq!(
        cache.get(on_dead[0]).expect("cache get"),
        Some(b"c".to_vec())
    );
    back.shutdown();
    for s in ss {
        s.shutdown();
    }
}

fn an_unregistered_slot_is_a_down_server(t: Transport) {
    let ss = servers(t);
    let mut cluster = cluster_of(&ss);
    cluster.servers[2] = None;
    let mut c = ClusterClient::connect(&cluster, opts(SHORT_TIMEOUT)).expect("connects");
    assert!(!c.is_up(2));
    let keys: Vec<Vec<u8>> = (0..100).map(key).collect();
    let (on2, rest): (Vec<&Vec<u8>>, Vec<&Vec<u8>>) =
        keys.iter().partition(|k| c.server_of(k) == 2);
    let items: Vec<(&[u8], &[u8])> = rest.iter().map(|k| (&k[..], &b"v"[..])).collect();
    c.mput(&items, None).expect("keys of registered servers");
    let e = c.get(on2[0]).expect_err("the unregistered server's key");
    assert_eq!(e.code(), ErrorCode::Unavailable);
    assert!(e.to_string().contains("server 2 "), "{e}");
    assert!(e.to_string().contains("not registered"), "{e}");
    for s in ss {
        s.shutdown();
    }
}

fn clients_join_through_the_registry(t: Transport) {
    let mc = match LocalMemcached::start() {
        Ok(m) => m,
        Err(e) => panic!("this test needs memcached: {e}"),
    };
    let ss = servers(t);
    let name = format!("it-join-{t:?}").to_lowercase();
    let regs: Vec<Registration> = ss
        .iter()
        .enumerate()
        .map(|(i, s)| register(&mc.url(), &name, SERVERS, i, s))
        .collect();
    let mut c = ClusterClient::join(&mc.url(), &name, opts(TIMEOUT)).expect("joins");
    assert_eq!(c.size(), SERVERS as u32);
    for i in 0..SERVERS as u32 {
        assert!(c.is_up(i));
        assert_eq!(c.addr(i), Some(ss[i as usize].addr.as_str()));
    }
    let items: Vec<(Vec<u8>, Vec<u8>)> =
        (0..200).map(|i| (key(i), value_of(i as u64, 64))).collect();
    c.mput(&items, None).expect("mput");
    let keys: Vec<&[u8]> = items.iter().map(|(k, _)| &k[..]).collect();
    let got = c.mget(&keys).expect("mget");
    for (g, (_, v)) in got.iter().zip(&items) {
        assert_eq!(g.as_deref(), Some(&v[..]));
    }
    let total: u64 = ss.iter().map(items_of).sum();
    assert_eq!(total, 200);
    let mut cache = ClusterCache::join(&mc.url(), &name, opts(TIMEOUT), CACHE_BUFFER_BYTES)
        .expect("cache joins");
    cache.put(b"k", b"v", None).expect("cache put");
    assert_eq!(cache.get(b"k").expect("cache get"), Some(b"v".to_vec()));
    let mut ps = ClusterPs::join(&mc.url(), &name, opts(TIMEOUT)).expect("ps joins");
    let tab = ps.create_table(&TableSpec::new("j", 2)).expect("create");
    ps.put(&tab, &[1, 2, 3], &[1.0; 6]).expect("put");
    assert_eq!(
        ps.pull(&tab, &[3, 2, 1]).expect("pull").values,
        vec![1.0; 6]
    );
    drop(regs);
    for s in ss {
        s.shutdown();
    }
}

/// Registers `s` as server `id` of the `size`-server cluster `name`.
fn register(url: &str, name: &str, size: usize, id: usize, s: &TestServer) -> Registration {
    let desc = ServerDesc {
        id: id as u32,
        addrs: vec![s.addr.clone()],
        resp: None,
        grpc: None,
        memcache: None,
        memcache_peer: None,
        repl: None,
        workers: u32::from(s.workers),
        pid: std::process::id(),
    };
    let reg = Registry::connect(url, name).expect("registry");
    Registration::start(reg, size as u32, desc, 10).expect("registers")
}

/// A client that joined through the registry finds a server that comes
/// back at another address: it reads the descriptor again before it
/// reconnects.
fn a_server_back_elsewhere_is_found_through_the_registry(t: Transport) {
    let mc = LocalMemcached::start().unwrap_or_else(|e| panic!("this test needs memcached: {e}"));
    let mut ss = servers(t);
    let name = format!("it-moved-{t:?}").to_lowercase();
    let mut regs: Vec<Option<Registration>> = ss
        .iter()
        .enumerate()
        .map(|(i, s)| Some(register(&mc.url(), &name, SERVERS, i, s)))
        .collect();
    let mut c = ClusterClient::join(&mc.url(), &name, opts(SHORT_TIMEOUT)).expect("joins");
    let k1 = (0..)
        .map(key)
        .find(|k| c.server_of(k) == 1)
        .expect("a key of server 1");
    c.put(&k1, b"before").expect("put");

    // Server 1 leaves; a new one (a new port, or a new name) takes id 1.
    regs[1] = None;
    let old = ss.remove(1);
    let old_addr = old.addr.clone();
    old.shutdown();
    let moved = server_at(t, None);
    assert_ne!(moved.addr, old_addr, "the replacement listens elsewhere");
    regs[1] = Some(register(&mc.url(), &name, SERVERS, 1, &moved));

    // The old connection fails at most once; then the client follows the
    // registry to the new address.
    wait_for("the client to reach the moved server", TIMEOUT * 2, || {
        c.put(&k1, b"after").is_ok()
    });
    assert_eq!(c.addr(1), Some(moved.addr.as_str()));
    assert_eq!(c.get(&k1).expect("get"), Some(b"after".to_vec()));
    let mut direct = moved.client();
    assert_eq!(
        direct.get(&k1).expect("direct get"),
        Some(b"after".to_vec())
    );
    drop(regs);
}

transport_tests!(
    kv_batches_split_and_merge_in_request_order,
    ps_tables_span_the_cluster,
    cache_spans_the_cluster,
    a_down_server_fails_only_its_keys_and_comes_back,
    an_unregistered_slot_is_a_down_server,
    clients_join_through_the_registry,
    a_server_back_elsewhere_is_found_through_the_registry,
);

/// A plain client and a one-server cluster client answer alike (the
/// cluster client's one-server path skips the split).
#[test]
fn a_one_server_cluster_is_a_plain_client() {
    let s = server_at(Transport::Inproc, None);
    let mut plain: Client = s.client();
    let mut one = ClusterClient::connect(&cluster_of(std::slice::from_ref(&s)), opts(TIMEOUT))
        .expect("connects");
    let items: Vec<(Vec<u8>, Vec<u8>)> =
        (0..100).map(|i| (key(i), value_of(i as u64, 10))).collect();
    one.mput(&items, None).expect("mput");
    let keys: Vec<&[u8]> = items.iter().map(|(k, _)| &k[..]).collect();
    assert_eq!(
        plain.mget(&keys).expect("plain"),
        one.mget(&keys).expect("one")
    );
    s.shutdown();
}

/// A server that accepts connections but never answers (hung, or an
/// address that swallows packets) fails its keys with TIMEOUT, within the
/// timeout, both when the client first connects and when it tries again.
#[test]
fn a_hung_server_times_out_within_the_timeout() {
    let ss: Vec<TestServer> = (0..2).map(|_| server_at(Transport::Tcp, None)).collect();
    // Connections complete in the kernel's backlog; nothing ever reads.
    let hung = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let hung_addr = format!("tcp://{}", hung.local_addr().expect("addr"));
    let cluster = Cluster::of_addrs(
        "it",
        &[ss[0].addr.as_str(), ss[1].addr.as_str(), &hung_addr],
    )
    .expect("cluster");
    let started = Instant::now();
    let mut c = ClusterClient::connect(&cluster, opts(SHORT_TIMEOUT)).expect("connects");
    assert!(started.elapsed() < SHORT_TIMEOUT + LATE_MARGIN);
    assert!(!c.is_up(2));
    let keys: Vec<Vec<u8>> = (0..60).map(key).collect();
    let hung_key = keys
        .iter()
        .find(|k| c.server_of(k) == 2)
        .expect("a key of server 2");
    let live: Vec<&[u8]> = keys
        .iter()
        .filter(|k| c.server_of(k) != 2)
        .map(|k| &k[..])
        .collect();
    assert_eq!(
        c.mget(&live).expect("live servers answer"),
        vec![None; live.len()]
    );
    let started = Instant::now();
    let r = c.mget(&[live[0], &hung_key[..]]);
    assert_down(r, started, 2, &hung_addr);
    drop(hung);
    for s in ss {
        s.shutdown();
    }
}
