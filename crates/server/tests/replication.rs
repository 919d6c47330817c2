//! A cluster keeping two copies of each slot, end to end: three servers
//! in a real etcd with the failover controller, every test once per
//! transport (the clients'; replication itself runs over tcp).
//!
//! - every acknowledged write is on the slot's backup: the primary is
//!   stopped (its heartbeats, its listener and its workers), the
//!   controller fails its slots over, and the same cluster client reads
//!   every key back, small and large, without an error;
//! - a server started again under the same id comes back empty, is
//!   streamed its groups' slots and promoted into their in-sync sets;
//!   stopping the server that had taken over then fails over to it, with
//!   nothing lost;
//! - embedding rows do the same, and a push retried under its request id
//!   at the new primary after a failover is answered, not applied twice.

#[macro_use]
mod common;

use std::time::Duration;

use fabrickv_client::{ClusterCache, ClusterClient, ClusterOptions, ClusterPs, Kv, PsClient};
use fabrickv_cluster::etcd::EtcdRegistry;
use fabrickv_cluster::local::LocalEtcd;
use fabrickv_cluster::slots::slot_of_u64;
use fabrickv_cluster::slots::{key_slot, SlotMap};
use fabrickv_types::ErrorCode;
use fabrickv_wire::ps::{Optimizer, PushId, TableSpec};

use common::etcd::{Controller, Member};
use common::{Transport, TIMEOUT};

/// Generous: failover takes about half a second, but a loaded machine
/// may take seconds to run etcd's watch and the controller.
const SETTLE_WITHIN: Duration = Duration::from_secs(60);

const CLUSTER: &str = "rep";

fn registry(etcd: &LocalEtcd) -> EtcdRegistry {
    common::etcd::registry(etcd, CLUSTER)
}

/// Server `id` of a three-server cluster keeping two copies, joined as
/// `fabrickv serve --replicas 2` joins.
fn member(t: Transport, reg: &EtcdRegistry, id: u32) -> Member {
    common::etcd::member(t, reg, id, &SlotMap::initial(3, 2).expect("map"))
}

/// The map once `done` holds for it.
fn map_when(reg: &EtcdRegistry, what: &str, done: impl Fn(&SlotMap) -> bool) -> SlotMap {
    common::etcd::map_when(reg, what, SETTLE_WITHIN, done)
}

fn key(i: usize) -> Vec<u8> {
    format!("rep-key-{i}").into_bytes()
}

/// The options every test's cluster clients start from.
fn opts() -> ClusterOptions {
    ClusterOptions {
        transport: None,
        timeout: TIMEOUT,
        ..Default::default()
    }
}

/// Writes each key's value: the key followed by `tag`.
fn put_every_key(c: &mut ClusterClient, keys: &[Vec<u8>], tag: &[u8]) {
    let values: Vec<Vec<u8>> = keys.iter().map(|k| [&k[..], tag].concat()).collect();
    let pairs: Vec<(&[u8], &[u8])> = keys
        .iter()
        .zip(&values)
        .map(|(k, v)| (&k[..], &v[..]))
        .collect();
    c.mput(&pairs, None).expect("mput");
}

fn every_key_reads_back(c: &mut ClusterClient, keys: &[Vec<u8>], large: &[u8], tag: &[u8]) {
    let refs: Vec<&[u8]> = keys.iter().map(|k| &k[..]).collect();
    let got = c.mget(&refs).expect("mget");
    for (k, v) in keys.iter().zip(got) {
        let mut want = k.clone();
        want.extend_from_slice(tag);
        assert_eq!(
            v.as_deref(),
            Some(&want[..]),
            "{}",
            String::from_utf8_lossy(k)
        );
    }
    assert_eq!(
        c.get(b"rep-large").expect("large get").as_deref(),
        Some(large)
    );
}

/// etcd, the controller and three members, once every run is stamped
/// (the servers hold their roles and their leases), with that map.
fn three_members(
    t: Transport,
) -> (
    LocalEtcd,
    EtcdRegistry,
    Controller,
    Vec<Option<Member>>,
    SlotMap,
) {
    let etcd = LocalEtcd::start().expect("etcd");
    let reg = registry(&etcd);
    let controller = Controller::start(&etcd, CLUSTER);
    let ms: Vec<Option<Member>> = (0..3).map(|id| Some(member(t, &reg, id))).collect();
    let map = map_when(&reg, "every server stamped", |m| {
        (0..3).all(|id| m.incarnation_of(id) != 0)
    });
    (etcd, reg, controller, ms, map)
}

fn acknowledged_writes_survive_failovers_and_a_rejoin(t: Transport) {
    let (etcd, reg, _controller, mut ms, map) = three_members(t);
    assert_eq!(map.groups[0].primary, 0);
    assert_eq!(map.groups[0].backups, [1]);
    let mut c = ClusterClient::join(&etcd.url(), CLUSTER, opts()).expect("joins");
    let keys: Vec<Vec<u8>> = (0..300).map(key).collect();
    put_every_key(&mut c, &keys, b"-v1");
    // A large value (over 1 MiB) travels as one record.
    let large: Vec<u8> = (0..(3 << 20)).map(|i| (i % 251) as u8).collect();
    c.put(b"rep-large", &large).expect("large put");
    every_key_reads_back(&mut c, &keys, &large, b"-v1");

    // Server 0 dies: its slots fail over to server 1, which has them all.
    ms[0].take().expect("server 0").kill();
    let map = map_when(&reg, "server 0's slots failed over", |m| {
        m.groups[0].primary == 1
    });
    assert!(map.groups.iter().all(|g| !g.backups.contains(&0)));
    every_key_reads_back(&mut c, &keys, &large, b"-v1");

    // Written while server 0 is away, then it comes back empty: it is
    // streamed its groups' slots (and these writes) and promoted.
    put_every_key(&mut c, &keys, b"-v2");
    ms[0] = Some(member(t, &reg, 0));
    map_when(&reg, "server 0 back in sync in its groups", |m| {
        m.groups[0].backups.contains(&0) && m.groups[2].backups.contains(&0)
    });

    // Server 1, now leading groups 0 and 1, dies: group 0 fails over to
    // the server that was streamed it.
    ms[1].take().expect("server 1").kill();
    map_when(&reg, "server 1's slots failed over", |m| {
        m.groups[0].primary == 0 && m.groups[1].primary == 2
    });
    every_key_reads_back(&mut c, &keys, &large, b"-v2");
    drop(c);
    for m in ms.into_iter().flatten() {
        m.kill();
    }
}

/// With no writes at all, a server that comes back is still streamed
/// its groups' slots and promoted, and again after it dies and comes back
/// a second time: nothing but the replicator's tick launches a round in
/// an idle cluster. (The build before `185e75a` passes this too: the
/// stale streams that left a rejoined server joining for ever needed the
/// interleaving of chaos seed 613510404, three servers' streams to two
/// joiners.)
fn an_idle_cluster_streams_a_server_that_comes_back_twice(t: Transport) {
    let (etcd, reg, _controller, mut ms, map) = three_members(t);
    assert_eq!(map.groups[0].backups, [1]);
    let mut c = ClusterClient::join(&etcd.url(), CLUSTER, opts()).expect("joins");
    let keys: Vec<Vec<u8>> = (0..200).map(key).collect();
    put_every_key(&mut c, &keys, b"-idle");
    let back_in_sync = |m: &SlotMap| {
        m.groups
            .iter()
            .filter(|g| g.primary != 1)
            .filter(|g| g.backups.contains(&1) || g.joining.contains(&1))
            .count()
            == 2
            && m.groups.iter().all(|g| !g.joining.contains(&1))
    };
    for round in 0..2 {
        ms[1].take().expect("server 1").kill();
        map_when(
            &reg,
            &format!("server 1 out of every group ({round})"),
            |m| {
                m.groups
                    .iter()
                    .all(|g| g.primary != 1 && !g.backups.contains(&1) && !g.joining.contains(&1))
            },
        );
        ms[1] = Some(member(t, &reg, 1));
        map_when(
            &reg,
            &format!("server 1 streamed and promoted ({round})"),
            back_in_sync,
        );
    }
    // Server 1 holds every key of the slots it backs: stopping their
    // primary, server 0, fails group 0 over to it, nothing lost.
    ms[0].take().expect("server 0").kill();
    map_when(&reg, "server 0's slots failed over", |m| {
        m.groups[0].primary == 1
    });
    let refs: Vec<&[u8]> = keys.iter().map(|k| &k[..]).collect();
    for (k, v) in keys.iter().zip(c.mget(&refs).expect("mget")) {
        assert_eq!(
            v,
            Some([&k[..], b"-idle"].concat()),
            "{}",
            String::from_utf8_lossy(k)
        );
    }
    drop(c);
    for m in ms.into_iter().flatten() {
        m.kill();
    }
}

/// Each server's count of GETs served.
fn gets_served(c: &mut ClusterClient) -> Vec<u64> {
    c.stats()
        .into_iter()
        .map(|s| s.expect("stats").get("gets").copied().unwrap_or(0))
        .collect()
}

/// Replicated writes are no client's reads: a primary reading the keys
/// it ships to its backups counts no GET in STATS.
fn replicated_writes_count_no_gets(t: Transport) {
    let (etcd, _reg, _controller, ms, _map) = three_members(t);
    let mut c = ClusterClient::join(&etcd.url(), CLUSTER, opts()).expect("joins");
    let keys: Vec<Vec<u8>> = (0..200).map(key).collect();
    let before = gets_served(&mut c);
    put_every_key(&mut c, &keys, b"-w1");
    for k in keys.iter().take(50) {
        c.put(k, b"one at a time").expect("put");
    }
    assert_eq!(gets_served(&mut c), before, "writes only, no GET");
    drop(c);
    for m in ms.into_iter().flatten() {
        m.kill();
    }
}

fn reads_that_accept_staleness_spread_over_the_copies(t: Transport) {
    let etcd = LocalEtcd::start().expect("etcd");
    let reg = registry(&etcd);
    let _controller = Controller::start(&etcd, CLUSTER);
    let ms: Vec<Member> = (0..3).map(|id| member(t, &reg, id)).collect();
    map_when(&reg, "every server stamped", |m| {
        (0..3).all(|id| m.incarnation_of(id) != 0)
    });
    let mut writer = ClusterClient::join(&etcd.url(), CLUSTER, opts()).expect("joins");
    let keys: Vec<Vec<u8>> = (0..300).map(key).collect();
    put_every_key(&mut writer, &keys, b"-v1");
    let large: Vec<u8> = (0..(3 << 20)).map(|i| (i % 239) as u8).collect();
    writer.put(b"rep-large", &large).expect("large put");

    // Acknowledged means applied by the backups: a reader that accepts
    // any copy sees every write, the large value's pieces included.
    let mut reader = ClusterClient::join(
        &etcd.url(),
        CLUSTER,
        ClusterOptions {
            read_from_replica: true,
            ..opts()
        },
    )
    .expect("joins");
    every_key_reads_back(&mut reader, &keys, &large, b"-v1");
    for k in &keys {
        let mut want = k.clone();
        want.extend_from_slice(b"-v1");
        assert_eq!(reader.get(k).expect("get").as_deref(), Some(&want[..]));
    }
    // The reads of one group's keys went to both of its copies, and to
    // no other server.
    let map = reg.view().expect("view").map.expect("map").0;
    let routes = map.routes();
    let group = &map.groups[0];
    let (primary, backup) = (group.primary as usize, group.backups[0] as usize);
    let ours: Vec<&Vec<u8>> = keys
        .iter()
        .filter(|k| routes.group_of(key_slot(k)) == 0)
        .collect();
    assert!(ours.len() > 20, "{} keys in group 0", ours.len());
    let before = gets_served(&mut writer);
    for k in &ours {
        assert!(reader.get(k).expect("get").is_some());
    }
    let after = gets_served(&mut writer);
    let served: Vec<u64> = after.iter().zip(&before).map(|(a, b)| a - b).collect();
    assert!(
        served[primary] > 0 && served[backup] > 0,
        "GETs served {served:?} for group 0 (primary {primary}, backup {backup})"
    );
    assert_eq!(
        served[primary] + served[backup],
        ours.len() as u64,
        "GETs served {served:?}: some went to a server holding no copy"
    );
    // Writes still go to the primaries, and the reader sees its own.
    reader.put(b"rep-key-0", b"new").expect("put");
    assert_eq!(
        reader.get(b"rep-key-0").expect("get").as_deref(),
        Some(&b"new"[..])
    );
    assert_eq!(
        writer.get(b"rep-key-0").expect("get").as_deref(),
        Some(&b"new"[..])
    );
    drop((writer, reader));
    for m in ms {
        m.kill();
    }
}

/// Each key's vector as put: the key, then 1, 2, 3.
fn row_of(k: u64) -> [f32; 4] {
    [k as f32, 1.0, 2.0, 3.0]
}

/// Pulls every key and checks its vector is `row_of(k)` minus `less(k)`
/// in each element.
fn every_row_reads_back(
    ps: &mut ClusterPs,
    t: &fabrickv_client::ClusterTable,
    keys: &[u64],
    less: impl Fn(u64) -> f32,
) {
    let got = ps.pull(t, keys).expect("pull");
    assert!(got.found.iter().all(|&f| f), "every row found");
    for (i, &k) in keys.iter().enumerate() {
        let want: Vec<f32> = row_of(k).iter().map(|x| x - less(k)).collect();
        assert_eq!(&got.values[i * 4..(i + 1) * 4], &want[..], "row {k}");
    }
}

fn embedding_rows_survive_a_failover_and_a_retried_push_applies_once(t: Transport) {
    let (etcd, reg, _controller, mut ms, map) = three_members(t);
    let mut ps = ClusterPs::join(&etcd.url(), CLUSTER, opts()).expect("joins");
    let spec = TableSpec {
        optimizer: Optimizer::Sgd,
        lr: 0.5,
        ..TableSpec::new("rep-emb", 4)
    };
    let table = ps.create_table(&spec).expect("table");
    let keys: Vec<u64> = (0..300).collect();
    let rows: Vec<f32> = keys.iter().flat_map(|&k| row_of(k)).collect();
    ps.put(&table, &keys, &rows).expect("put");
    ps.push(&table, &keys, &vec![1.0; keys.len() * 4])
        .expect("push");
    every_row_reads_back(&mut ps, &table, &keys, |_| 0.5);

    // A push sent twice under one request id is applied once.
    let routes = map.routes();
    let k0 = keys
        .iter()
        .copied()
        .find(|&k| routes.group_of(slot_of_u64(k)) == 0)
        .expect("a key of group 0");
    let addr = |ms: &[Option<Member>], i: usize| ms[i].as_ref().expect("up").server.addr.clone();
    let id = PushId {
        client: 0x5EED,
        seq: 1,
    };
    let mut direct = PsClient::connect_with_timeout(&addr(&ms, 0), TIMEOUT).expect("connect");
    let desc = direct.open_table("rep-emb").expect("open");
    for _ in 0..2 {
        direct
            .push_once(&desc, &[k0], &[1.0; 4], id)
            .expect("push once");
    }
    drop(direct);
    let less = |k: u64| if k == k0 { 1.0 } else { 0.5 };
    every_row_reads_back(&mut ps, &table, &keys, less);

    // Server 0 dies: group 0 fails over to server 1, which holds the rows
    // and the push's marker, so the push retried there is answered, not
    // applied again.
    ms[0].take().expect("server 0").kill();
    map_when(&reg, "server 0's slots failed over", |m| {
        m.groups[0].primary == 1
    });
    every_row_reads_back(&mut ps, &table, &keys, less);
    let mut direct = PsClient::connect_with_timeout(&addr(&ms, 1), TIMEOUT).expect("connect");
    let desc = direct.open_table("rep-emb").expect("open");
    direct
        .push_once(&desc, &[k0], &[1.0; 4], id)
        .expect("retried push");
    drop(direct);
    every_row_reads_back(&mut ps, &table, &keys, less);

    // Pushes go on through the cluster client, to the new primaries.
    ps.push(&table, &keys, &vec![0.5; keys.len() * 4])
        .expect("push");
    every_row_reads_back(&mut ps, &table, &keys, |k| less(k) + 0.25);
    drop(ps);
    for m in ms.into_iter().flatten() {
        m.kill();
    }
}

fn cached_value(k: &[u8]) -> Vec<u8> {
    [k, b"-cached"].concat()
}

fn cache_keys_follow_the_slot_map_through_a_failover(t: Transport) {
    let (etcd, reg, _controller, mut ms, map) = three_members(t);
    let mut cc = ClusterCache::join(&etcd.url(), CLUSTER, opts(), 1 << 20).expect("joins");
    let keys: Vec<Vec<u8>> = (0..60).map(|i| format!("cache-{i}").into_bytes()).collect();
    for k in &keys {
        cc.put(k, &cached_value(k), None).expect("put");
    }
    // Each value is on its slot's primary; the other servers send the
    // client there.
    let routes = map.routes();
    let owner = |k: &[u8]| map.groups[routes.group_of(key_slot(k))].primary;
    for k in &keys {
        assert_eq!(cc.server_of(k), owner(k));
        for s in 0..3 {
            let got = cc.client(s).expect("client").get(k);
            if s == owner(k) {
                assert_eq!(got.expect("get"), Some(cached_value(k)));
            } else {
                let e = got.expect_err("another server's key");
                assert_eq!(e.code(), ErrorCode::WrongServer, "{e}");
            }
        }
    }
    assert!((0..3).all(|s| keys.iter().any(|k| owner(k) == s)));

    // Server 0 dies: the cache keeps one copy, so its values are gone (a
    // miss, not an error); every other value reads back, and the same
    // client caches at the new primary.
    ms[0].take().expect("server 0").kill();
    map_when(&reg, "server 0's slots failed over", |m| {
        m.groups[0].primary == 1
    });
    for k in &keys {
        let want = (owner(k) != 0).then(|| cached_value(k));
        assert_eq!(
            cc.get(k).expect("get"),
            want,
            "{}",
            String::from_utf8_lossy(k)
        );
    }
    for k in &keys {
        cc.put(k, &cached_value(k), None).expect("put");
    }
    for k in &keys {
        assert_eq!(cc.get(k).expect("get"), Some(cached_value(k)));
    }
    drop(cc);
    for m in ms.into_iter().flatten() {
        m.kill();
    }
}

transport_tests!(
    acknowledged_writes_survive_failovers_and_a_rejoin,
    an_idle_cluster_streams_a_server_that_comes_back_twice,
    replicated_writes_count_no_gets,
    cache_keys_follow_the_slot_map_through_a_failover,
    reads_that_accept_staleness_spread_over_the_copies,
    embedding_rows_survive_a_failover_and_a_retried_push_applies_once
);
