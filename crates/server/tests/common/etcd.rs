//! Servers of a cluster in a real etcd, joined as `fabrickv serve
//! --registry etcd://...` joins, and the failover controller, for the
//! tests of replication and of moving slots.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use fabrickv_cluster::etcd::{EtcdRegistration, EtcdRegistry, WatchHandle};
use fabrickv_cluster::local::LocalEtcd;
use fabrickv_cluster::slots::SlotMap;
use fabrickv_cluster::{RegistryError, ServerDesc};
use fabrickv_server::replication::{self, Replication, ReplicationParts};
use fabrickv_server::Mode;

use super::{small_pools, wait_for, TestServer, Transport, MEMORY_BYTES};

/// How long a map swap whose outcome etcd leaves unknown is retried: a
/// starved etcd answers within seconds.
const ETCD_SETTLE_WITHIN: Duration = Duration::from_secs(60);

/// A server of the cluster.
pub struct Member {
    // Dropped in this order: replication stops (heartbeats, the
    // listener), then the watch, the registration and the server.
    pub replication: Replication,
    _watch: WatchHandle,
    _registration: EtcdRegistration,
    pub server: TestServer,
}

impl Member {
    /// Stops the server as a crash would look to the others: no more
    /// heartbeats, replication streams cut, and no more answers.
    pub fn kill(self) {
        let Member {
            replication,
            _watch,
            _registration,
            server,
        } = self;
        drop(replication);
        server.shutdown();
    }
}

/// A registry client of cluster `name` in `etcd`, without a secret.
pub fn registry(etcd: &LocalEtcd, name: &str) -> EtcdRegistry {
    EtcdRegistry::connect(&etcd.url(), name)
        .expect("connect")
        .with_secret(None)
}

/// What test server `server` registers as server `id`, with its
/// replication listener at `repl` (none in a cluster of one copy).
pub fn desc(id: u32, server: &TestServer, repl: Option<String>) -> ServerDesc {
    ServerDesc {
        id,
        addrs: vec![server.addr.clone()],
        resp: None,
        grpc: None,
        memcache: None,
        memcache_peer: None,
        repl,
        workers: u32::from(server.workers),
        pid: std::process::id(),
    }
}

/// Server `id` of the cluster whose first map is `first` (an id past its
/// size registers and waits to be added). A cluster keeping copies draws
/// an incarnation for the run, which the controller stamps.
pub fn member(t: Transport, reg: &EtcdRegistry, id: u32, first: &SlotMap) -> Member {
    let server = TestServer::start_with(t, 2, Mode::Store, MEMORY_BYTES, small_pools);
    let listener = replication::bind("127.0.0.1:0").expect("replication listener");
    let desc = desc(
        id,
        &server,
        Some(listener.local_addr().expect("addr").to_string()),
    );
    let h = server.handle();
    let incarnation = if first.replicas > 1 {
        fabrickv_auth::random_u64() | 1
    } else {
        0
    };
    h.slot_routing().set_incarnation(incarnation);
    let registration = reg.register(&desc).expect("registered");
    reg.create_map(first).expect("map");
    let watch = h.slot_routing().follow(id, reg).expect("follows");
    let replication = replication::start(
        ReplicationParts {
            parts: h.partitions().clone(),
            ps: h.ps_store().clone(),
            cache: h.cache().clone(),
            routing: h.slot_routing().clone(),
            gate: h.gate().clone(),
            clock: h.clock(),
            // The default a server gets (`--stream-cpus auto`).
            stream_cpus: replication::cpus::StreamCpus::auto(
                &replication::cpus::allowed_cpus().expect("this process's CPUs"),
            ),
        },
        id,
        incarnation,
        reg.clone(),
        None,
        listener,
    )
    .expect("replication starts");
    Member {
        replication,
        _watch: watch,
        _registration: registration,
        server,
    }
}

/// The failover controller of cluster `name`, in a thread, until dropped.
pub struct Controller {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Controller {
    pub fn start(etcd: &LocalEtcd, name: &str) -> Controller {
        let reg = registry(etcd, name);
        let stop = Arc::new(AtomicBool::new(false));
        let s = stop.clone();
        let thread = std::thread::spawn(move || {
            fabrickv_cluster::controller::run(&reg, None, "127.0.0.1:0", &s).expect("controller");
        });
        Controller {
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for Controller {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Commits `next` in place of the map at etcd revision `rev`, as
/// `EtcdRegistry::swap_map` does, and says whether it did, asking again
/// while etcd leaves the outcome unknown (starved on a busy machine):
/// the swap answers a repeated call as it would have the first.
pub fn swap_map(reg: &EtcdRegistry, rev: i64, next: &SlotMap) -> bool {
    let deadline = std::time::Instant::now() + ETCD_SETTLE_WITHIN;
    loop {
        match reg.swap_map(rev, next) {
            Ok(swapped) => return swapped,
            Err(RegistryError::Timeout(why)) if std::time::Instant::now() < deadline => {
                eprintln!("test: {why}; again");
            }
            Err(e) => panic!("swap the map: {e}"),
        }
    }
}

/// The map once `done` holds for it, waiting up to `within`.
pub fn map_when(
    reg: &EtcdRegistry,
    what: &str,
    within: Duration,
    done: impl Fn(&SlotMap) -> bool,
) -> SlotMap {
    let mut last = None;
    wait_for(what, within, || {
        last = reg.view().ok().and_then(|v| v.map).map(|(m, _)| m);
        last.as_ref().is_some_and(&done)
    });
    last.expect("a map")
}
