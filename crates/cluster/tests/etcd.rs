//! The etcd registry against a real etcd on loopback: registration with a
//! lease, the slot map's create-once and compare-and-swap, the watch, and
//! the MAC that keeps a writer without the secret out.

use std::sync::mpsc;
use std::time::{Duration, Instant};

use fabrickv_auth::Secret;
use fabrickv_cluster::etcd::{ClusterView, EtcdRegistry, WatchHandle, ETCD_IO_TIMEOUT_MS};
use fabrickv_cluster::local::LocalEtcd;
use fabrickv_cluster::slots::SlotMap;
use fabrickv_cluster::ServerDesc;

/// Generous: a loaded 2-core machine may take seconds to run the watch.
const WAIT: Duration = Duration::from_secs(30);

fn desc(id: u32) -> ServerDesc {
    ServerDesc {
        id,
        addrs: vec![format!("tcp://127.0.0.1:{}", 7000 + id)],
        resp: Some(format!("127.0.0.1:{}", 8000 + id)),
        grpc: None,
        memcache: None,
        memcache_peer: None,
        repl: None,
        workers: 2,
        pid: std::process::id(),
    }
}

fn registry(etcd: &LocalEtcd, cluster: &str) -> EtcdRegistry {
    EtcdRegistry::connect(&etcd.url(), cluster)
        .expect("connect")
        .with_secret(None)
}

/// A watch of `reg` and the views it delivers.
fn watch_views(reg: &EtcdRegistry) -> (WatchHandle, mpsc::Receiver<ClusterView>) {
    let (tx, rx) = mpsc::channel();
    let watch = reg.watch(move |v| {
        let _ = tx.send(v);
    });
    (watch, rx)
}

/// Waits for a view the watch delivers that satisfies `ok`.
fn wait_for(rx: &mpsc::Receiver<ClusterView>, ok: impl Fn(&ClusterView) -> bool) -> ClusterView {
    let deadline = Instant::now() + WAIT;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let v = rx
            .recv_timeout(left)
            .expect("the watch delivered no such view in time");
        if ok(&v) {
            return v;
        }
    }
}

#[test]
fn the_map_is_created_once_and_changed_only_by_compare_and_swap() {
    let etcd = LocalEtcd::start().expect("etcd");
    let a = registry(&etcd, "c1");
    let b = registry(&etcd, "c1");
    let first = SlotMap::initial(3, 2).expect("map");
    let (m1, rev1) = a.create_map(&first).expect("create");
    assert_eq!(m1, first);
    // A second server starting with the same shape gets the same map.
    let (m2, rev2) = b.create_map(&first).expect("create again");
    assert_eq!((m2, rev2), (first.clone(), rev1));
    // One started for a bigger cluster (to be added to it) gets the map
    // in force; one keeping another count of copies is told so.
    let (m3, _) = b
        .create_map(&SlotMap::initial(4, 2).expect("map"))
        .expect("another size");
    assert_eq!(m3, first);
    let e = b
        .create_map(&SlotMap::initial(3, 3).expect("map"))
        .expect_err("another copy count");
    assert!(e.to_string().contains("keeps 2 copies of each slot"), "{e}");

    let mut next = first.clone();
    next.epoch += 1;
    next.groups[0].primary = 1;
    next.groups[0].backups = vec![];
    assert!(
        a.swap_map(rev1, &next).expect("swap"),
        "the first swap wins"
    );
    let mut other = first.clone();
    other.epoch += 1;
    assert!(
        !b.swap_map(rev1, &other).expect("swap"),
        "a swap against the old revision loses"
    );
    let (now, _) = b.view().expect("view").map.expect("a map");
    assert_eq!(now, next);
    // Another cluster on the same etcd is separate.
    assert!(registry(&etcd, "c2").view().expect("view").map.is_none());
}

/// Sends `signal` (`STOP`, `CONT`) to process `pid`.
fn signal(pid: u32, signal: &str) {
    let ok = std::process::Command::new("kill")
        .arg(format!("-{signal}"))
        .arg(pid.to_string())
        .status()
        .expect("run kill")
        .success();
    assert!(ok, "kill -{signal} {pid}");
}

/// A change whose answer is lost (etcd stopped past the request timeout,
/// as a starved etcd is) is reported as it came out, not as a timeout;
/// the same call made again answers the same; and a change that lost,
/// answered late, is told it lost.
#[test]
fn a_map_change_answered_late_reports_whether_it_committed() {
    let etcd = LocalEtcd::start().expect("etcd");
    let reg = registry(&etcd, "late");
    let (first, rev) = reg
        .create_map(&SlotMap::initial(3, 1).expect("map"))
        .expect("create");
    let mut next = first.clone();
    next.epoch += 1;
    next.groups[0].primary = 1;
    let mut other = first.clone();
    other.epoch += 1;
    // Stopped for longer than one request may take: the swap's first
    // answer is lost whatever the machine's load.
    let stopped = Duration::from_millis(ETCD_IO_TIMEOUT_MS + 500);
    let late = |map: &SlotMap| {
        let pid = etcd.pid();
        signal(pid, "STOP");
        let resume = std::thread::spawn(move || {
            std::thread::sleep(stopped);
            signal(pid, "CONT");
        });
        let began = Instant::now();
        let swapped = reg.swap_map(rev, map);
        resume.join().expect("resume etcd");
        assert!(
            began.elapsed() >= Duration::from_millis(ETCD_IO_TIMEOUT_MS),
            "the answer came while etcd was stopped"
        );
        swapped.expect("the outcome is found out")
    };
    assert!(late(&next), "the late change committed");
    assert_eq!(reg.view().expect("view").map.expect("a map").0, next);
    assert!(
        reg.swap_map(rev, &next).expect("swap again"),
        "the same call again is told it committed"
    );
    assert!(!late(&other), "a late change against the old map lost");
    assert!(!reg.swap_map(rev, &other).expect("swap again"));
    assert_eq!(reg.view().expect("view").map.expect("a map").0, next);
}

#[test]
fn a_registration_is_seen_by_the_watch_and_leaves_when_dropped() {
    let etcd = LocalEtcd::start().expect("etcd");
    let reg = registry(&etcd, "w");
    let (_watch, rx) = watch_views(&reg);
    let r0 = registry(&etcd, "w").register(&desc(0)).expect("register 0");
    let r2 = registry(&etcd, "w").register(&desc(2)).expect("register 2");
    let v = wait_for(&rx, |v| v.server(0).is_some() && v.server(2).is_some());
    assert_eq!(v.server(0), Some(&desc(0)));
    assert_eq!(v.server(2), Some(&desc(2)));
    assert!(v.server(1).is_none());
    reg.create_map(&SlotMap::initial(3, 1).expect("map"))
        .expect("create");
    wait_for(&rx, |v| v.map.is_some());
    drop(r2);
    let v = wait_for(&rx, |v| v.server(2).is_none());
    assert!(v.server(0).is_some(), "server 0 is still registered");
    drop(r0);
}

/// One watch, many changes in a row: the last map is delivered (the
/// watch stays open across changes, reading the view again for each
/// event newer than what it delivered).
#[test]
fn a_watch_follows_many_map_changes_to_the_last() {
    let etcd = LocalEtcd::start().expect("etcd");
    let reg = registry(&etcd, "m");
    let (_watch, rx) = watch_views(&reg);
    let (mut map, mut rev) = reg
        .create_map(&SlotMap::initial(3, 1).expect("map"))
        .expect("create");
    for _ in 0..20 {
        let mut next = map.clone();
        next.epoch += 1;
        assert!(reg.swap_map(rev, &next).expect("swap"), "no other writer");
        (map, rev) = reg.view().expect("view").map.expect("a map");
    }
    let last = map.epoch;
    let v = wait_for(&rx, |v| {
        v.map.as_ref().is_some_and(|(m, _)| m.epoch == last)
    });
    assert_eq!(v.map.map(|(m, _)| m), Some(map));
}

#[test]
fn with_a_secret_an_entry_written_without_it_is_ignored() {
    let etcd = LocalEtcd::start().expect("etcd");
    let secret = Secret::from_bytes(b"etcd-registry-secret-0123", "test").expect("secret");
    let honest = registry(&etcd, "s").with_secret(Some(secret.clone()));
    let forger = registry(&etcd, "s");
    let _forged = forger.register(&desc(1)).expect("a forger can write");
    let (forged_map, _) = forger
        .create_map(&SlotMap::initial(2, 1).expect("map"))
        .expect("a forger can write a map");
    drop(forged_map);
    let _real = honest.register(&desc(0)).expect("register");
    let v = honest.view().expect("view");
    assert!(v.map.is_none(), "a map without the MAC is ignored");
    let e = honest
        .create_map(&SlotMap::initial(2, 1).expect("map"))
        .expect_err("a forged map is neither trusted nor overwritten");
    assert!(e.to_string().contains("MAC"), "{e}");
    // Descriptors: the forged one is ignored, the real one read.
    let other = registry(&etcd, "s2").with_secret(Some(secret));
    let _r = other.register(&desc(0)).expect("register");
    let _f = registry(&etcd, "s2").register(&desc(1)).expect("forged");
    let v = other.view().expect("view");
    assert!(v.server(0).is_some());
    assert!(
        v.server(1).is_none(),
        "a descriptor without the MAC is ignored"
    );
    assert_eq!(other.server(0).expect("read"), Some(desc(0)));
    assert_eq!(other.server(1).expect("read"), None, "nor read alone");
    assert_eq!(other.server(2).expect("read"), None, "never registered");
}

/// A plain etcd client of `etcd`, outside the registry.
async fn plain_client(etcd: &LocalEtcd) -> etcd_client::Client {
    let endpoint = etcd.url().trim_start_matches("etcd://").to_string();
    etcd_client::Client::connect([endpoint], None)
        .await
        .expect("etcd client")
}

/// The etcd lease behind each controller candidate's election key of
/// cluster `cluster`, read with a plain etcd client.
fn candidate_leases(rt: &tokio::runtime::Runtime, etcd: &LocalEtcd, cluster: &str) -> Vec<i64> {
    rt.block_on(async {
        let mut c = plain_client(etcd).await;
        let prefix = format!("/fabrickv/{cluster}/controller/");
        let got = c
            .get(prefix, Some(etcd_client::GetOptions::new().with_prefix()))
            .await
            .expect("read the election");
        got.kvs().iter().map(|kv| kv.lease()).collect()
    })
}

#[test]
fn a_controller_whose_lease_is_lost_campaigns_again() {
    let etcd = LocalEtcd::start().expect("etcd starts");
    let reg = registry(&etcd, "lease");
    reg.create_map(&SlotMap::initial(3, 2).expect("map"))
        .expect("map");
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let controller = {
        let (reg, stop) = (reg.clone(), stop.clone());
        std::thread::spawn(move || {
            fabrickv_cluster::controller::run(&reg, None, "127.0.0.1:0", &stop)
        })
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let deadline = Instant::now() + WAIT;
    let first = loop {
        if let [lease] = candidate_leases(&rt, &etcd, "lease")[..] {
            break lease;
        }
        assert!(Instant::now() < deadline, "the controller never campaigned");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(reg.view().expect("view").controller.is_some());

    // What a leader starved for a lease's time finds: its lease is gone
    // (here revoked), and with it its election key.
    rt.block_on(async {
        let mut c = plain_client(&etcd).await;
        c.lease_revoke(first).await.expect("revoke");
    });
    let deadline = Instant::now() + WAIT;
    loop {
        let leases = candidate_leases(&rt, &etcd, "lease");
        if leases.len() == 1 && leases[0] != first {
            break;
        }
        assert!(
            !controller.is_finished(),
            "the controller exited: {:?}",
            controller.join()
        );
        assert!(
            Instant::now() < deadline,
            "the controller never campaigned again"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(reg.view().expect("view").controller.is_some());
    stop.store(true, std::sync::atomic::Ordering::Release);
    controller
        .join()
        .expect("no panic")
        .expect("a stopped controller returns Ok");
}
