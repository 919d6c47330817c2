//! The Redis Cluster side of the front end: redirection by the slot map
//! and the topology commands cluster clients read.

use super::*;
use crate::slot_routing::{loopback_desc as desc, Routing, SlotRouting};
use fabrickv_cluster::slots::{key_slot, SlotMap};

/// A connection to server `me` of a 3-server cluster keeping `replicas`
/// copies, with servers `down` not registered.
fn member(me: u32, replicas: u8, down: &[u32]) -> (Conn, Arc<SlotRouting>) {
    let slot_routing = SlotRouting::new();
    let servers = (0..3)
        .map(|i| (!down.contains(&i)).then(|| desc(i)))
        .collect();
    let map = SlotMap::initial(3, replicas).expect("map");
    slot_routing.install(Routing::new(me, "t", map, servers));
    let shared = shared_with(1, None).with_slot_routing(slot_routing.clone());
    (Conn::with(shared), slot_routing)
}

/// A key whose slot is in `lo..=hi`.
fn key_in(lo: u16, hi: u16) -> String {
    (0..)
        .map(|i| format!("k{i}"))
        .find(|k| (lo..=hi).contains(&key_slot(k.as_bytes())))
        .expect("a key")
}

#[test]
fn outside_a_cluster_only_keyslot_answers() {
    let mut c = Conn::new(1);
    assert_eq!(c.run(&["CLUSTER", "KEYSLOT", "foo"]), ":12182\r\n");
    assert_eq!(
        c.run(&["CLUSTER", "KEYSLOT", "{user1000}.following"]),
        ":3443\r\n"
    );
    c.expect_err(
        &["CLUSTER", "SLOTS"],
        "This instance has cluster support disabled",
    );
    c.expect_err(&["READONLY"], "This instance has cluster support disabled");
    // Every key is served: no map, no redirection.
    assert_eq!(c.run(&["MSET", "a", "1", "b", "2"]), "+OK\r\n");
}

#[test]
fn a_key_another_server_leads_is_moved_there() {
    let (mut c, _p) = member(0, 1, &[]);
    let mine = key_in(0, 5460);
    let theirs = key_in(10922, 16383);
    assert_eq!(c.run(&["SET", &mine, "v"]), "+OK\r\n");
    let slot = key_slot(theirs.as_bytes());
    assert_eq!(
        c.run(&["SET", &theirs, "v"]),
        format!("-MOVED {slot} 127.0.0.1:8002\r\n")
    );
    assert_eq!(c.run(&["DBSIZE"]), ":1\r\n", "the moved SET stored nothing");
    assert_eq!(
        c.run(&["MGET", &mine, &theirs]),
        "-CROSSSLOT Keys in request don't hash to the same slot\r\n"
    );
    // Keys sharing a hash tag share a slot: served or moved together.
    let tag = format!("{{{mine}}}");
    assert_eq!(
        c.run(&["MSET", &format!("{tag}.a"), "1", &format!("{tag}.b"), "2"]),
        "+OK\r\n"
    );
    // Inside MULTI the redirect is given at queue time and EXEC aborts.
    assert_eq!(c.run(&["MULTI"]), "+OK\r\n");
    assert!(c.run(&["SET", &theirs, "v"]).starts_with("-MOVED"));
    assert!(c.run(&["EXEC"]).starts_with("-EXECABORT"));
}

#[test]
fn a_readonly_connection_reads_the_slots_it_backs_up() {
    // With two copies, server 1 backs up server 0's slots.
    let (mut c, _p) = member(1, 2, &[]);
    let backed = key_in(0, 5460);
    assert!(c.run(&["GET", &backed]).starts_with("-MOVED"));
    assert_eq!(c.run(&["READONLY"]), "+OK\r\n");
    assert_eq!(c.run(&["GET", &backed]), "$-1\r\n", "a replica read");
    assert!(
        c.run(&["SET", &backed, "v"]).starts_with("-MOVED"),
        "writes still go to the primary"
    );
    assert_eq!(c.run(&["READWRITE"]), "+OK\r\n");
    assert!(c.run(&["GET", &backed]).starts_with("-MOVED"));
}

#[test]
fn the_topology_commands_describe_the_map() {
    let (mut c, p) = member(0, 2, &[2]);
    let slots = c.run(&["CLUSTER", "SLOTS"]);
    // Three ranges, each with a primary and a backup.
    assert!(
        slots.starts_with("*3\r\n*4\r\n:0\r\n:5460\r\n*3\r\n$9\r\n127.0.0.1\r\n:8000\r\n"),
        "{slots}"
    );
    let info = c.run(&["CLUSTER", "INFO"]);
    assert!(
        info.contains("cluster_state:fail"),
        "server 2 leads slots and is down: {info}"
    );
    assert!(info.contains("cluster_slots_fail:5462"), "{info}");
    assert!(info.contains("cluster_current_epoch:1"), "{info}");
    let myid = c.run(&["CLUSTER", "MYID"]);
    assert_eq!(myid.len(), "$40\r\n".len() + 40 + 2, "{myid}");
    let nodes = c.run(&["CLUSTER", "NODES"]);
    assert!(
        nodes.contains("127.0.0.1:8000@0 myself,master - 0 0 1 connected 0-5460"),
        "{nodes}"
    );
    assert!(nodes.contains(":0@0 master,fail"), "{nodes}");
    let shards = c.run(&["CLUSTER", "SHARDS"]);
    assert!(
        shards.contains("$4\r\nrole\r\n$7\r\nreplica\r\n"),
        "{shards}"
    );
    // A new map is seen from the next command on.
    let mut map = SlotMap::initial(3, 2).expect("map");
    map.epoch = 2;
    map.groups[2].primary = 0;
    map.groups[2].backups = vec![1];
    p.install(Routing::new(
        0,
        "t",
        map,
        vec![Some(desc(0)), Some(desc(1)), None],
    ));
    let info = c.run(&["CLUSTER", "INFO"]);
    assert!(
        info.contains("cluster_state:ok") && info.contains("cluster_current_epoch:2"),
        "{info}"
    );
    assert_eq!(
        c.run(&["SET", &key_in(10922, 16383), "v"]),
        "+OK\r\n",
        "server 0 leads them now"
    );
    c.expect_err(
        &["CLUSTER", "NOPE"],
        "unknown subcommand 'NOPE'. Try CLUSTER HELP.",
    );
}

/// A write reaching a new primary on a connection opened before its
/// takeover may have been sent to it before a failover and held up in the
/// network since: the connection is closed and nothing runs. Connections
/// opened since, and keys the server led all along, are served.
#[test]
fn a_connection_older_than_a_takeover_is_closed_before_it_writes() {
    let (mut c, p) = member(0, 2, &[]);
    let mine = key_in(0, 5460);
    let taken = key_in(10922, 16383);
    // Server 2 fails; server 0, its group's backup, leads it from epoch 2.
    let map = SlotMap::initial(3, 2)
        .expect("map")
        .without(2)
        .expect("a failover");
    assert_eq!((map.groups[2].primary, map.groups[2].since), (0, 2));
    p.install(Routing::new(
        0,
        "t",
        map,
        vec![Some(desc(0)), Some(desc(1)), None],
    ));
    assert_eq!(c.run(&["SET", &mine, "v"]), "+OK\r\n");
    let (out, closed) = c.feed(&cmd(&[b"SET", taken.as_bytes(), b"late"]));
    assert!(
        closed && out.is_empty(),
        "closed: {closed}, replied {out:?}"
    );
    c.state = RespConnState::new(&c.shared, 2);
    assert_eq!(
        c.run(&["GET", &taken]),
        "$-1\r\n",
        "the late write did not run"
    );
    assert_eq!(c.run(&["SET", &taken, "v"]), "+OK\r\n");
    assert_eq!(c.run(&["GET", &taken]), "$1\r\nv\r\n");
}
