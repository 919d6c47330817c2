//! Growing a cluster in etcd while it serves: a fourth server is added to
//! three, keeping one copy of each slot and keeping two. A writer runs
//! through the whole move; afterwards every key holds the last value
//! acknowledged for it, the new server leads a quarter of the slots and
//! holds about a quarter of the keys, and (with one copy) the servers the
//! slots left no longer hold them; KV cache blocks of the moved slots are
//! let go by their old owners, the others still read. Every test once per transport (the
//! clients'; streams run over tcp).

#[macro_use]
mod common;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use fabrickv_client::{ClusterCache, ClusterClient, ClusterOptions, Kv};
use fabrickv_cluster::etcd::EtcdRegistry;
use fabrickv_cluster::local::LocalEtcd;
use fabrickv_cluster::slots::{key_slot, SlotMap, SlotRange, SLOTS};

use common::etcd::{swap_map, Controller, Member};
use common::{stat, wait_for, Transport, TIMEOUT};

/// Generous: a move takes well under a second here, but a loaded
/// machine may take seconds to run etcd's watch and the streams.
const SETTLE_WITHIN: Duration = Duration::from_secs(60);

const CLUSTER: &str = "grow";

/// Keys written before the move (and overwritten during it).
const KEYS: usize = 2_000;

fn registry(etcd: &LocalEtcd) -> EtcdRegistry {
    common::etcd::registry(etcd, CLUSTER)
}

/// Server `id` of a cluster begun with three servers keeping `replicas`
/// copies.
fn member(t: Transport, reg: &EtcdRegistry, id: u32, replicas: u8) -> Member {
    common::etcd::member(t, reg, id, &SlotMap::initial(3, replicas).expect("map"))
}

fn map_when(reg: &EtcdRegistry, what: &str, done: impl Fn(&SlotMap) -> bool) -> SlotMap {
    common::etcd::map_when(reg, what, SETTLE_WITHIN, done)
}

fn key(i: usize) -> Vec<u8> {
    format!("grow-key-{i}").into_bytes()
}

/// KV cache blocks put before the move.
const BLOCKS: usize = 200;

/// A cache client's receive buffer.
const CACHE_BUFFER_BYTES: usize = 1 << 20;

fn block(i: usize) -> Vec<u8> {
    format!("grow-block-{i}").into_bytes()
}

fn opts() -> ClusterOptions {
    ClusterOptions {
        transport: None,
        timeout: TIMEOUT,
        ..Default::default()
    }
}

fn a_fourth_server_takes_a_quarter_while_writes_go_on(t: Transport, replicas: u8) {
    let etcd = LocalEtcd::start().expect("etcd");
    let reg = registry(&etcd);
    let _controller = (replicas > 1).then(|| Controller::start(&etcd, CLUSTER));
    let mut ms: Vec<Member> = (0..3).map(|id| member(t, &reg, id, replicas)).collect();
    let stamped = |m: &SlotMap, n: u32| replicas == 1 || (0..n).all(|id| m.incarnation_of(id) != 0);
    map_when(&reg, "every server stamped", |m| stamped(m, 3));
    let mut c = ClusterClient::join(&etcd.url(), CLUSTER, opts()).expect("joins");
    let last: Arc<Mutex<HashMap<usize, Vec<u8>>>> = Arc::new(Mutex::new(HashMap::new()));
    for chunk in (0..KEYS).collect::<Vec<_>>().chunks(200) {
        let pairs: Vec<(Vec<u8>, Vec<u8>)> = chunk
            .iter()
            .map(|&i| (key(i), format!("v0-{i}").into_bytes()))
            .collect();
        let refs: Vec<(&[u8], &[u8])> = pairs.iter().map(|(k, v)| (&k[..], &v[..])).collect();
        c.mput(&refs, None).expect("mput");
        let mut l = last.lock().expect("lock");
        for (&i, (_, v)) in chunk.iter().zip(&pairs) {
            l.insert(i, v.clone());
        }
    }

    // KV cache blocks too: a cache keeps a block on its slot's primary
    // only, and a move does not carry blocks (it is a cache).
    let mut cache =
        ClusterCache::join(&etcd.url(), CLUSTER, opts(), CACHE_BUFFER_BYTES).expect("cache joins");
    for i in 0..BLOCKS {
        cache.put(&block(i), &[7u8; 512], None).expect("cache put");
    }

    // The fourth server starts and registers; it holds nothing yet.
    ms.push(member(t, &reg, 3, replicas));
    let before = map_when(&reg, "the fourth server stamped", |m| stamped(m, 4));
    assert_eq!(before.size, 3, "registering does not grow the map");

    // A writer overwrites keys through the whole move; each value it was
    // told is stored is the one to read back.
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let (stop, last, url) = (stop.clone(), last.clone(), etcd.url());
        std::thread::spawn(move || {
            let mut w = ClusterClient::join(&url, CLUSTER, opts()).expect("joins");
            let mut n = 0usize;
            while !stop.load(Ordering::Acquire) {
                let i = (n * 7919) % KEYS;
                let v = format!("w{n}-{i}").into_bytes();
                w.put(&key(i), &v).expect("a write during the move");
                last.lock().expect("lock").insert(i, v);
                n += 1;
            }
            n
        })
    };
    std::thread::sleep(Duration::from_millis(100));
    // What `fabrickv cluster add --id 3` commits.
    let plan = before.plan_add(3);
    let moved_slots: u32 = plan.iter().map(|m| m.count()).sum();
    assert_eq!(moved_slots, u32::from(SLOTS) / 4);
    let (map, rev) = reg.view().expect("view").map.expect("map");
    let begun = map.with_moves(&plan).expect("a valid move");
    assert!(swap_map(&reg, rev, &begun), "the move commits");
    let after = map_when(&reg, "the move carried out", |m| !m.moving() && m.size == 4);
    std::thread::sleep(Duration::from_millis(100));
    stop.store(true, Ordering::Release);
    let writes = writer.join().expect("the writer never failed");
    assert!(writes > 0);

    let led: u32 = after.led_by(3).iter().map(SlotRange::count).sum();
    assert_eq!(led, u32::from(SLOTS) / 4);
    for g in &after.groups {
        assert_eq!(g.servers().count(), usize::from(replicas), "{g:?}");
    }
    // Every acknowledged write is there, through a client that joined
    // before the move and one that joins after it.
    let last = last.lock().expect("lock").clone();
    let mut fresh = ClusterClient::join(&etcd.url(), CLUSTER, opts()).expect("joins");
    for client in [&mut c, &mut fresh] {
        let keys: Vec<Vec<u8>> = (0..KEYS).map(key).collect();
        for chunk in keys.chunks(200) {
            let refs: Vec<&[u8]> = chunk.iter().map(|k| &k[..]).collect();
            let got = client.mget(&refs).expect("mget after the move");
            for (k, v) in chunk.iter().zip(got) {
                let i: usize = String::from_utf8_lossy(&k[9..]).parse().expect("index");
                assert_eq!(v.as_ref(), Some(&last[&i]), "key {i}");
            }
        }
    }
    // About a quarter of the keys moved, and with one copy the servers
    // they left let them go.
    let items = |m: &Member| stat(&mut m.server.client(), "items");
    let on_new = items(&ms[3]);
    assert!(
        on_new as f64 <= KEYS as f64 * 0.30 && on_new as f64 >= KEYS as f64 * 0.20,
        "server 3 holds {on_new} of {KEYS} keys"
    );
    if replicas == 1 {
        wait_for("the old owners let moved keys go", SETTLE_WITHIN, || {
            ms.iter().map(items).sum::<u64>() == KEYS as u64
        });
    }
    // The blocks of the slots the new server took are let go by their old
    // owners; the others stay where they were and are still read.
    let routes = after.routes();
    let kept: Vec<usize> = (0..BLOCKS)
        .filter(|&i| after.groups[routes.group_of(key_slot(&block(i)))].primary != 3)
        .collect();
    assert!(
        kept.len() < BLOCKS && !kept.is_empty(),
        "{} kept",
        kept.len()
    );
    let blocks = |m: &Member| stat(&mut m.server.client(), "cache_entries");
    wait_for("the old owners let moved blocks go", SETTLE_WITHIN, || {
        ms.iter().map(blocks).sum::<u64>() == kept.len() as u64
    });
    assert_eq!(blocks(&ms[3]), 0, "blocks are not moved");
    for &i in &kept {
        assert!(
            cache.get(&block(i)).expect("cache get").is_some(),
            "block {i}"
        );
    }
    // A batch put after the move lands every block on its slot's new
    // primary, moved ones on the new server (refused as moved and sent
    // again there if the client's map had not followed yet).
    let names: Vec<Vec<u8>> = (0..BLOCKS).map(block).collect();
    let fresh = [9u8; 512];
    let items: Vec<(&[u8], &[u8])> = names.iter().map(|k| (&k[..], &fresh[..])).collect();
    for (i, r) in cache
        .put_many(&items, None)
        .expect("cache put_many")
        .into_iter()
        .enumerate()
    {
        r.unwrap_or_else(|e| panic!("block {i}: {e}"));
    }
    assert_eq!(blocks(&ms[3]), (BLOCKS - kept.len()) as u64);
    for k in &names {
        assert_eq!(
            cache.get(k).expect("cache get").as_deref(),
            Some(&fresh[..])
        );
    }
    for m in ms {
        drop(m.replication);
        m.server.shutdown();
    }
}

fn with_one_copy(t: Transport) {
    a_fourth_server_takes_a_quarter_while_writes_go_on(t, 1);
}

fn with_two_copies(t: Transport) {
    a_fourth_server_takes_a_quarter_while_writes_go_on(t, 2);
}

transport_tests!(with_one_copy, with_two_copies);
