//! A cluster client's view of an etcd cluster's slot map: which server
//! leads each hash slot, kept current by etcd's watch (no polling), and
//! read again at once when a server answers WRONG_SERVER before the
//! watch has delivered the change.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use fabrickv_cluster::etcd::{EtcdRegistry, WatchHandle};
use fabrickv_cluster::slots::{key_slot, SlotMap, SlotRoutes};
use fabrickv_cluster::ServerDesc;

use crate::{ClientError, Result};

/// Rounds of a batch that met WRONG_SERVER under a map no newer one
/// replaced (each after reading the map again, and waiting for a newer)
/// before the operations still refused keep that answer: more than this
/// means the servers disagree with etcd for longer than a call should
/// wait. Rounds a newer map explains (a failover's or a move's several
/// changes) do not count; [`FAILOVER_WAIT_MS`] bounds them.
pub const WRONG_SERVER_ROUNDS_MAX: usize = 4;

/// How long a call whose server failed or refused it waits for the
/// cluster's map to move on (a failover) before it fails, in milliseconds.
pub const FAILOVER_WAIT_MS: u64 = 5_000;

/// How long a call refused with WRONG_SERVER under the map the server
/// should hold waits for a newer one before it is sent again, in
/// milliseconds: the server's own watch is a moment behind, or it is
/// between roles during a failover.
pub const REFUSED_PAUSE_MS: u64 = 20;

/// How long a call waits before it is sent again to a server that
/// refused it under an older map than the client's (the server's watch
/// is a moment behind), in milliseconds.
pub const BEHIND_PAUSE_MS: u64 = 1;

/// How often a call waiting for a new map looks at what the watch
/// delivered, in milliseconds.
const MAP_WAIT_POLL_MS: u64 = 2;

/// What the watch delivers: a map and the servers' descriptors of the
/// same view.
type Delivered = (SlotMap, Vec<Option<ServerDesc>>);

/// The slot map a client routes by, and the watch that updates it.
pub(crate) struct SlotFollow {
    registry: EtcdRegistry,
    routes: SlotRoutes,
    /// The primary of each group of the map.
    primaries: Vec<u32>,
    /// Each group's in-sync copies, its primary first.
    replicas: Vec<Vec<u32>>,
    /// Mixed into a key's hash to pick the replica it is read from, so
    /// that clients spread the reads of one key over its copies.
    salt: u64,
    epoch: u64,
    /// Servers the map counts (it grows when one is added).
    size: u32,
    /// Whether a group of the map is being handed to another server (a
    /// move): a call refused for it waits for the map that names the
    /// new owner.
    handing_over: bool,
    /// The newest map the watch delivered with the servers' descriptors
    /// of that view, and how many it delivered.
    latest: Arc<Mutex<Option<Delivered>>>,
    /// Descriptors delivered with a map and not yet taken by the client.
    descs: Option<Vec<Option<ServerDesc>>>,
    delivered: Arc<AtomicU64>,
    /// `delivered` when `latest` was last taken.
    seen: u64,
    _watch: WatchHandle,
}

impl SlotFollow {
    /// Routes by `map` and follows its changes in `registry`.
    pub(crate) fn start(registry: EtcdRegistry, map: SlotMap) -> SlotFollow {
        let latest = Arc::new(Mutex::new(None));
        let delivered = Arc::new(AtomicU64::new(0));
        let watch = {
            let (latest, delivered) = (latest.clone(), delivered.clone());
            registry.watch(move |view| {
                if let Some((map, _)) = view.map {
                    *latest.lock().unwrap_or_else(|p| p.into_inner()) = Some((map, view.servers));
                    delivered.fetch_add(1, Ordering::Release);
                }
            })
        };
        let mut f = SlotFollow {
            registry,
            routes: map.routes(),
            primaries: Vec::new(),
            replicas: Vec::new(),
            salt: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos() as u64)
                ^ u64::from(std::process::id()).rotate_left(32),
            epoch: 0,
            size: 0,
            handing_over: false,
            latest,
            descs: None,
            delivered,
            seen: 0,
            _watch: watch,
        };
        f.adopt(map);
        f
    }

    /// The server leading `key`'s slot.
    #[inline]
    pub(crate) fn server_of(&self, key: &[u8]) -> u32 {
        self.primaries[self.routes.group_of(key_slot(key))]
    }

    /// The server leading `slot`.
    #[inline]
    pub(crate) fn primary_of_slot(&self, slot: u16) -> u32 {
        self.primaries[self.routes.group_of(slot)]
    }

    /// The replica group holding `slot`.
    #[inline]
    pub(crate) fn group_of_slot(&self, slot: u16) -> usize {
        self.routes.group_of(slot)
    }

    /// The copy of `key`'s slot (hash `hash`) a read that accepts
    /// staleness goes to: the same for a key as long as the map holds, so
    /// that the pieces of a large value come from where its GET went.
    #[inline]
    pub(crate) fn reader_of(&self, key: &[u8], hash: u64) -> u32 {
        let copies = &self.replicas[self.routes.group_of(key_slot(key))];
        let mixed = (hash ^ self.salt).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 32;
        copies[(mixed % copies.len() as u64) as usize]
    }

    /// The epoch of the map routed by.
    pub(crate) fn epoch(&self) -> u64 {
        self.epoch
    }

    /// Takes the newest map the watch delivered, if any came since the
    /// last call: one atomic load otherwise.
    #[inline]
    pub(crate) fn update(&mut self) {
        let d = self.delivered.load(Ordering::Acquire);
        if d == self.seen {
            return;
        }
        self.seen = d;
        let latest = self.latest.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some((map, descs)) = latest {
            self.adopt(map);
            self.descs = Some(descs);
        }
    }

    /// Waits until the watch delivers a map newer than epoch `than`, or
    /// `deadline` passes; returns whether one came. A failover commits a
    /// new map within about a second of a primary's death
    /// (`fabrickv_cluster::heartbeat::DEAD_AFTER_MS` and a transaction).
    pub(crate) fn wait_newer(&mut self, than: u64, deadline: std::time::Instant) -> bool {
        loop {
            self.update();
            if self.epoch > than {
                return true;
            }
            if std::time::Instant::now() >= deadline {
                return false;
            }
            std::thread::sleep(std::time::Duration::from_millis(MAP_WAIT_POLL_MS));
        }
    }

    /// The servers' descriptors the watch delivered since the last call:
    /// a server restarted at another address is found there.
    pub(crate) fn take_descs(&mut self) -> Option<Vec<Option<ServerDesc>>> {
        self.descs.take()
    }

    /// Reads the map from etcd now: a server said WRONG_SERVER, so its
    /// map is newer than this one and the watch has not caught up yet.
    pub(crate) fn reload(&mut self) -> Result<()> {
        let view = self.registry.view().map_err(ClientError::Registry)?;
        if let Some((map, _)) = view.map {
            self.adopt(map);
            self.descs = Some(view.servers);
        }
        Ok(())
    }

    /// After a call failed with `e`: waits (until `deadline`) for the map
    /// that makes sending it again worthwhile, and says whether to. A
    /// failed server waits for a newer map (a failover). WRONG_SERVER
    /// reads the map again; if it had not changed, the refusing server is
    /// behind this client or between roles, and the call goes again after
    /// a short wait for a newer map ([`REFUSED_PAUSE_MS`]; while a
    /// group is handed over, until the next map), until `deadline`. Calls that change nothing or carry request ids are safe
    /// to send again; the callers are those.
    pub(crate) fn reroute(&mut self, e: &ClientError, deadline: std::time::Instant) -> bool {
        let epoch = self.epoch;
        if e.code() == fabrickv_types::ErrorCode::WrongServer {
            if self.reload().is_ok() && self.epoch == epoch {
                // A group handed over waits for its new owner's map; a
                // server behind the client, a moment.
                let pause = if self.handing_over {
                    deadline
                } else {
                    std::time::Instant::now() + std::time::Duration::from_millis(REFUSED_PAUSE_MS)
                };
                self.wait_newer(epoch, pause.min(deadline));
            }
            std::time::Instant::now() < deadline
        } else if e.is_transport() {
            self.wait_newer(epoch, deadline)
        } else {
            false
        }
    }

    /// Routes by `map` unless it is older than the one routed by.
    fn adopt(&mut self, map: SlotMap) {
        if map.epoch < self.epoch {
            return;
        }
        self.routes = map.routes();
        self.primaries = map.groups.iter().map(|g| g.primary).collect();
        self.replicas = map
            .groups
            .iter()
            .map(|g| {
                std::iter::once(g.primary)
                    .chain(g.backups.iter().copied())
                    .collect()
            })
            .collect();
        self.epoch = map.epoch;
        self.size = map.size;
        self.handing_over = map.groups.iter().any(|g| g.handing_over());
    }
}

/// Takes what the etcd watch delivered since the last call, if the client
/// follows a slot map: the map, and servers' new addresses for `m`.
#[inline]
pub(crate) fn follow_map<C: super::PerServer>(
    slots: &mut Option<Box<SlotFollow>>,
    m: &mut super::Members<C>,
) {
    if let Some(f) = slots {
        f.update();
        // A server added to the cluster gets a place before any key
        // routes to it (its address comes with the descriptors).
        m.grow_to(f.size as usize);
        if let Some(descs) = f.take_descs() {
            m.adopt_descs(&descs);
        }
    }
}

/// After a call failed with `e`: whether to send it again, once the map
/// allows ([`SlotFollow::reroute`]), having taken that map; never without
/// a slot map.
pub(crate) fn reroute<C: super::PerServer>(
    slots: &mut Option<Box<SlotFollow>>,
    m: &mut super::Members<C>,
    e: &ClientError,
    deadline: std::time::Instant,
) -> bool {
    let again = slots.as_mut().is_some_and(|f| f.reroute(e, deadline));
    if again {
        follow_map(slots, m);
    }
    again
}
