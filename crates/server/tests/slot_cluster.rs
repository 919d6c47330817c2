//! A cluster registered in etcd, end to end with the native clients:
//! three servers following the slot map from a real etcd, every test once
//! per transport.
//!
//! - the cluster client joins through etcd and routes each key to its
//!   slot's primary; a server refuses a key of another's slot with
//!   WRONG_SERVER and stores nothing;
//! - after a change of the map (a new epoch) the servers and the client
//!   follow it, and writes land on the new primary.

#[macro_use]
mod common;

use std::time::Duration;

use fabrickv_client::{BatchOp, ClusterClient, ClusterOptions, Kv};
use fabrickv_cluster::etcd::{EtcdRegistration, EtcdRegistry, WatchHandle};
use fabrickv_cluster::local::LocalEtcd;
use fabrickv_cluster::slots::{key_slot, SlotMap};
use fabrickv_types::ErrorCode;

use common::{wait_for, TestServer, Transport, TIMEOUT};

/// Generous: a loaded machine may take seconds to run etcd's watch.
const FOLLOW_WITHIN: Duration = Duration::from_secs(30);

/// A server of the etcd cluster: registered, following the map.
struct Member {
    server: TestServer,
    _registration: EtcdRegistration,
    _watch: WatchHandle,
}

fn registry(etcd: &LocalEtcd) -> EtcdRegistry {
    common::etcd::registry(etcd, "sc")
}

/// Three servers in one etcd cluster of one copy per slot.
fn members(t: Transport, etcd: &LocalEtcd) -> Vec<Member> {
    let reg = registry(etcd);
    reg.create_map(&SlotMap::initial(3, 1).expect("map"))
        .expect("map created");
    (0..3u32)
        .map(|id| {
            let server = TestServer::default_on(t);
            let desc = common::etcd::desc(id, &server, None);
            let registration = reg.register(&desc).expect("registered");
            let watch = server.slot_routing().follow(id, &reg).expect("follows");
            Member {
                server,
                _registration: registration,
                _watch: watch,
            }
        })
        .collect()
}

fn epoch_of(m: &Member) -> u64 {
    m.server.slot_routing().routing().map_or(0, |r| r.map.epoch)
}

/// A cluster client of the cluster, routing by its first map.
fn join(etcd: &LocalEtcd) -> ClusterClient {
    let opts = ClusterOptions {
        transport: None,
        timeout: TIMEOUT,
        ..Default::default()
    };
    let c = ClusterClient::join(&etcd.url(), "sc", opts).expect("joins through etcd");
    assert_eq!(c.slot_map_epoch(), Some(1));
    c
}

fn key(i: usize) -> Vec<u8> {
    format!("slot-key-{i}").into_bytes()
}

fn a_cluster_client_routes_by_the_slot_map(t: Transport) {
    let etcd = LocalEtcd::start().expect("etcd");
    let ms = members(t, &etcd);
    let mut c = join(&etcd);
    let keys: Vec<Vec<u8>> = (0..300).map(key).collect();
    let refs: Vec<&[u8]> = keys.iter().map(|k| &k[..]).collect();
    let pairs: Vec<(&[u8], &[u8])> = refs.iter().map(|k| (*k, *k)).collect();
    c.mput(&pairs, None).expect("mput");
    assert_eq!(
        c.mget(&refs).expect("mget"),
        keys.iter().map(|k| Some(k.clone())).collect::<Vec<_>>()
    );
    // Each key is on its slot's primary; the others refuse it and hold
    // nothing.
    let map = SlotMap::initial(3, 1).expect("map");
    let routes = map.routes();
    let mut owners = [0usize; 3];
    for k in &keys[..30] {
        let owner = map.groups[routes.group_of(key_slot(k))].primary as usize;
        owners[owner] += 1;
        assert_eq!(c.server_of(k) as usize, owner);
        for (i, m) in ms.iter().enumerate() {
            let mut plain = m.server.client();
            let out = plain.execute(&[BatchOp::Get { key: k }]).expect("get");
            if i == owner {
                assert_eq!(out[0].code, ErrorCode::Ok);
            } else {
                assert_eq!(out[0].code, ErrorCode::WrongServer, "server {i}");
                // The refusal names the map it was made under.
                assert_eq!(out[0].value, 1u64.to_le_bytes(), "server {i}");
            }
        }
    }
    assert!(owners.iter().all(|&n| n > 0), "{owners:?}");

    // A new map: server 0 leads server 2's slots too.
    let reg = registry(&etcd);
    let (old, rev) = reg.view().expect("view").map.expect("a map");
    let mut next = old.clone();
    next.epoch = 2;
    next.groups[2].primary = 0;
    assert!(common::etcd::swap_map(&reg, rev, &next));
    wait_for("every server follows epoch 2", FOLLOW_WITHIN, || {
        ms.iter().all(|m| epoch_of(m) == 2)
    });
    let moved: Vec<&[u8]> = refs
        .iter()
        .copied()
        .filter(|k| map.groups[routes.group_of(key_slot(k))].primary == 2)
        .collect();
    assert!(!moved.is_empty());
    // The client was routing by epoch 1: whether its watch or a server's
    // WRONG_SERVER tells it first, the writes land on server 0.
    let fresh: Vec<(&[u8], &[u8])> = moved.iter().map(|k| (*k, b"v2".as_slice())).collect();
    c.mput(&fresh, None).expect("mput after the change");
    assert_eq!(c.slot_map_epoch(), Some(2));
    let mut zero = ms[0].server.client();
    assert_eq!(
        zero.mget(&moved).expect("mget at server 0"),
        vec![Some(b"v2".to_vec()); moved.len()]
    );
    let mut two = ms[2].server.client();
    let out = two
        .execute(&[BatchOp::Get { key: moved[0] }])
        .expect("get at server 2");
    assert_eq!(out[0].code, ErrorCode::WrongServer);
    assert_eq!(out[0].value, 2u64.to_le_bytes());
    drop(ms);
}

/// A cluster client stamps each request with the epoch of the map it
/// routed by, and a primary runs no write stamped before it took the
/// key's group over (a write held up in the network across a failover
/// and back). Here server 0 acts on a map the client has not seen, one
/// where it took group 0 over again at epoch 2: the client's write is
/// refused, and lands once the client follows that map.
fn a_write_stamped_before_its_primarys_takeover_lands_once_the_client_follows(t: Transport) {
    let etcd = LocalEtcd::start().expect("etcd");
    let ms = members(t, &etcd);
    let mut c = join(&etcd);
    let reg = registry(&etcd);
    let (old, rev) = reg.view().expect("view").map.expect("a map");
    let mut next = old.clone();
    next.epoch = 2;
    next.groups[0].since = 2;
    let routes = old.routes();
    let k = (0..)
        .map(key)
        .find(|k| old.groups[routes.group_of(key_slot(k))].primary == 0)
        .expect("a key of server 0");
    let current = ms[0].server.slot_routing().routing().expect("a routing");
    ms[0]
        .server
        .slot_routing()
        .install(fabrickv_server::slot_routing::Routing::new(
            0,
            "sc",
            next.clone(),
            current.servers.clone(),
        ));
    let stale = |m: &Member| {
        m.server
            .client()
            .stats()
            .expect("stats")
            .get("stale_map_writes")
            .copied()
            .unwrap_or(0)
    };
    std::thread::scope(|s| {
        let publish = s.spawn(|| {
            // Only once server 0 has refused the write stamped 1 does the
            // client get to see the map of epoch 2.
            wait_for("server 0 refuses the stale write", FOLLOW_WITHIN, || {
                stale(&ms[0]) >= 1
            });
            assert!(common::etcd::swap_map(&reg, rev, &next));
        });
        c.put(&k, b"landed")
            .expect("the write lands once the client follows epoch 2");
        publish.join().expect("the map was published");
    });
    assert_eq!(c.slot_map_epoch(), Some(2));
    assert_eq!(
        ms[0].server.client().get(&k).expect("get"),
        Some(b"landed".to_vec())
    );
    drop(ms);
}

transport_tests!(
    a_cluster_client_routes_by_the_slot_map,
    a_write_stamped_before_its_primarys_takeover_lands_once_the_client_follows,
);
