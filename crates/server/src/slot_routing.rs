//! Which slots this server serves: its view of the cluster's slot map.
//!
//! A server started with an etcd registry learns the map from etcd's
//! watch (`cli/src/cluster_cmd.rs` installs each new view here); any other
//! server has no map and serves every key it is sent. The front ends ask
//! through a [`RoutingCache`] once per command: one atomic load while nothing
//! changed, and a clone of the current [`Routing`] only after a change, so
//! a connection keeps its own `Arc` and the common path takes no lock.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

use fabrickv_cluster::etcd::{ClusterView, EtcdRegistry, WatchHandle};
use fabrickv_cluster::slots::{SlotMap, SlotRoutes};
use fabrickv_cluster::ServerDesc;

use crate::service::Clock;

/// Until when, in engine milliseconds, a replicating server may serve:
/// extended by the heartbeats the failover controller answers
/// (`replication::lease`), read by [`Routing::serves`].
#[derive(Debug, Default)]
pub struct Lease {
    until_ms: AtomicU64,
}

impl Lease {
    /// Whether the lease holds at engine time `now_ms`.
    #[inline]
    pub fn valid(&self, now_ms: u64) -> bool {
        now_ms < self.until_ms.load(Ordering::Acquire)
    }

    /// Extends the lease to `until_ms` (never shortens it).
    pub(crate) fn extend(&self, until_ms: u64) {
        self.until_ms.fetch_max(until_ms, Ordering::AcqRel);
    }
}

/// The server's current view of the cluster, shared by its front ends.
#[derive(Default)]
pub struct SlotRouting {
    /// Bumped by every [`SlotRouting::install`]; 0 while there is no map.
    version: AtomicU64,
    current: RwLock<Option<Arc<Routing>>>,
    /// This server run's incarnation in a cluster keeping several copies
    /// (0 otherwise): it holds the map's roles only when the map names
    /// this incarnation.
    incarnation: AtomicU64,
    /// The lease a replicating server serves under, and its clock.
    lease: std::sync::OnceLock<(Arc<Lease>, Clock)>,
    /// Groups this server is committing the hand-over of.
    closing: Arc<Closing>,
    /// Every thread that runs commands, which a hand-over waits out
    /// after the map (or the closing of reads) changed.
    quiescence: Arc<fabrickv_rpc::quiesce::Quiescence>,
}

/// The groups whose hand-over this server (their primary) is about to
/// commit, by number (group numbers never change): reads of their slots,
/// served while only writes stop, stop too from here until the map
/// naming the new owner is installed.
#[derive(Debug, Default)]
pub struct Closing {
    /// Whether any group is closing: one load on the read path otherwise.
    any: std::sync::atomic::AtomicBool,
    groups: std::sync::Mutex<Vec<usize>>,
}

impl Closing {
    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<usize>> {
        self.groups.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Closes group `group` to reads.
    pub fn close(&self, group: usize) {
        let mut g = self.lock();
        if !g.contains(&group) {
            g.push(group);
        }
        self.any.store(true, Ordering::Release);
    }

    /// Keeps only the groups `map` still shows `me` handing over.
    fn keep_handing_over(&self, map: &SlotMap, me: u32) {
        let mut g = self.lock();
        g.retain(|&i| {
            map.groups
                .get(i)
                .is_some_and(|x| x.primary == me && x.handing_over())
        });
        self.any.store(!g.is_empty(), Ordering::Release);
    }

    #[inline]
    fn holds(&self, group: usize) -> bool {
        self.any.load(Ordering::Acquire) && self.lock().contains(&group)
    }
}

/// One view of the cluster: the map at one epoch, its dense index, and
/// where each server is.
pub struct Routing {
    /// This server's id.
    pub me: u32,
    /// The cluster's name.
    pub cluster: String,
    /// The map.
    pub map: SlotMap,
    /// The map's group of each slot.
    pub routes: SlotRoutes,
    /// Each server's descriptor, by id (`None`: not registered now).
    pub servers: Vec<Option<ServerDesc>>,
    /// Where the failover controller takes heartbeats, if one leads.
    pub controller: Option<String>,
    /// Whether this server run holds the roles the map gives its id: in
    /// a cluster of one copy always; otherwise once the controller has
    /// stamped this run's incarnation (a restarted server's old roles are
    /// not its own).
    pub active: bool,
    /// The groups whose hand-over this server is committing.
    closing: Arc<Closing>,
    /// In a cluster of several copies, the lease without which this
    /// server serves nothing, and the clock it is read on.
    lease: Option<(Arc<Lease>, Clock)>,
}

/// Where a command's keys must be served, seen from this server.
#[derive(Debug, PartialEq, Eq)]
pub enum Route {
    /// Here.
    Here,
    /// At the slot's primary (its RESP address when it is registered).
    Moved { slot: u16, to: Option<String> },
    /// The keys hash to different slots, which one command cannot span.
    CrossSlot,
    /// The slot's group is being handed to another server (a move):
    /// nothing runs on it for a moment; try again (Redis's TRYAGAIN).
    TryAgain { slot: u16 },
}

impl SlotRouting {
    /// A server's routing before any map: it serves every key.
    pub fn new() -> Arc<SlotRouting> {
        Arc::new(SlotRouting::default())
    }

    /// Makes `routing` the view every front end sees from its next command.
    pub fn install(&self, routing: Routing) {
        let mut cur = self.current.write().unwrap_or_else(|p| p.into_inner());
        *cur = Some(Arc::new(routing));
        self.version.fetch_add(1, Ordering::Release);
    }

    /// The version of the routing installed now (bumped by every install).
    #[inline]
    pub fn version(&self) -> u64 {
        self.version.load(Ordering::Acquire)
    }

    /// The current view, if it is newer than `seen` (the version a caller
    /// cached with its view): `Some` after a change, `None` when `seen` is
    /// still current. Version 0 means no map: every key is served here.
    #[inline]
    pub fn refresh(&self, seen: u64) -> Option<(u64, Option<Arc<Routing>>)> {
        let v = self.version.load(Ordering::Acquire);
        if v == seen {
            return None;
        }
        let cur = self.current.read().unwrap_or_else(|p| p.into_inner());
        Some((v, cur.clone()))
    }

    /// Installs `view`, as server `me` of `cluster` sees it; a view
    /// without a map is skipped (no server has created it yet).
    pub fn install_view(&self, me: u32, cluster: &str, view: ClusterView) {
        if let Some((map, _)) = view.map {
            let epoch = map.epoch;
            let mut r = Routing::new(me, cluster, map, view.servers);
            self.closing.keep_handing_over(&r.map, me);
            r.closing = self.closing.clone();
            let incarnation = self.incarnation();
            r.active = incarnation == 0 || r.map.incarnation_of(me) == incarnation;
            r.controller = view.controller;
            if r.map.replicas > 1 {
                r.lease = self.lease.get().cloned();
            }
            self.install(r);
            tracing::debug!("slot map epoch {epoch} installed");
        }
    }

    /// Installs the cluster's current view from `registry` now, then
    /// every later one its watch delivers, as server `me`, until the
    /// returned handle is dropped.
    pub fn follow(
        self: &Arc<Self>,
        me: u32,
        registry: &EtcdRegistry,
    ) -> Result<WatchHandle, fabrickv_cluster::RegistryError> {
        let cluster = registry.cluster().to_string();
        self.install_view(me, &cluster, registry.view()?);
        let routing = self.clone();
        Ok(registry.watch(move |view| routing.install_view(me, &cluster, view)))
    }

    /// Makes this server serve only while `lease` holds (read on
    /// `clock`), in any map keeping several copies installed from now on.
    pub fn set_lease(&self, lease: Arc<Lease>, clock: Clock) {
        let _ = self.lease.set((lease, clock));
    }

    /// Sets this run's incarnation, before the first view is installed.
    pub fn set_incarnation(&self, incarnation: u64) {
        self.incarnation.store(incarnation, Ordering::Release);
    }

    /// This run's incarnation (0: the server does not replicate).
    pub fn incarnation(&self) -> u64 {
        self.incarnation.load(Ordering::Acquire)
    }

    /// The groups whose hand-over this server is committing.
    pub fn closing(&self) -> &Closing {
        &self.closing
    }

    /// The threads that run commands against this routing: a grace
    /// begun after a change passes once none still runs a command that
    /// read what was before it.
    pub fn quiescence(&self) -> &Arc<fabrickv_rpc::quiesce::Quiescence> {
        &self.quiescence
    }

    /// The current view, if the server has a map.
    pub fn routing(&self) -> Option<Arc<Routing>> {
        self.current
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}

/// The map epoch a client connection was opened under. A request that
/// reaches a primary on a connection older than its leadership of the
/// key's group may have been sent before a failover, to this server as
/// it was then, and been held up in the network since (a cut link
/// delivers what the client's kernel kept resending once it heals): its
/// client was told it failed and may have had it run elsewhere, so
/// running it now would put an old write over newer ones. Such a
/// connection is closed instead, the request not run; a client that
/// is still there reconnects and sends it again.
#[derive(Debug, Clone, Copy)]
pub struct OpenedAt(u64);

impl OpenedAt {
    /// A connection opened now. With no map yet, the server leads no
    /// group by a failover (an initial group's leadership began at the
    /// map's first epoch, 1).
    pub fn now(routing: &SlotRouting) -> OpenedAt {
        OpenedAt(routing.routing().map_or(1, |r| r.map.epoch))
    }

    /// Whether a request for `slot` on this connection may run, as far
    /// as leadership goes: the slot's group was led by its primary since
    /// before the connection opened.
    #[inline]
    pub fn admits(self, r: &Routing, slot: u16) -> bool {
        r.led_since(slot, self.0)
    }
}

/// A front end's or worker's copy of the current view, taken again only
/// after the routing changed.
#[derive(Default)]
pub struct RoutingCache {
    /// The version of the shared routing `routing` was taken at.
    seen: u64,
    routing: Option<Arc<Routing>>,
}

impl RoutingCache {
    /// The current view, if the server has a map: one atomic load while
    /// nothing changed.
    #[inline]
    pub fn current(&mut self, shared: &SlotRouting) -> Option<&Routing> {
        if let Some((v, r)) = shared.refresh(self.seen) {
            self.seen = v;
            self.routing = r;
        }
        self.routing.as_deref()
    }
}

impl Routing {
    /// A view of `map` from server `me`.
    pub fn new(me: u32, cluster: &str, map: SlotMap, servers: Vec<Option<ServerDesc>>) -> Routing {
        Routing {
            me,
            cluster: cluster.to_string(),
            routes: map.routes(),
            map,
            servers,
            controller: None,
            active: true,
            closing: Arc::default(),
            lease: None,
        }
    }

    /// The descriptor of server `id`, if it is registered.
    pub fn server(&self, id: u32) -> Option<&ServerDesc> {
        self.servers.get(id as usize).and_then(Option::as_ref)
    }

    /// Whether this server may serve `slot`: as its primary, or as any of
    /// its replicas for a read that accepts staleness (`replica_read`).
    /// Nothing is served from a group being handed over (a move): its
    /// primary waits for its last writes to reach every copy.
    #[inline]
    pub fn serves(&self, slot: u16, replica_read: bool) -> bool {
        let g = &self.map.groups[self.routes.group_of(slot)];
        self.active
            && (g.primary == self.me || (replica_read && g.backups.contains(&self.me)))
            && !g.handing_over()
            && self.leased()
    }

    /// Whether a write to `slot` that a cluster client routed by its map
    /// at epoch `stamp` (a native frame's `map_epoch`) may run, as far as
    /// leadership goes: the slot's group was led by its primary since that
    /// epoch or before. A write older than the takeover may have been held
    /// up in the network across a failover and back (see [`OpenedAt`]); a
    /// client that is still there learns the newer map and sends it again.
    /// 0 and `u32::MAX` are no stamp (a plain client; an epoch past the
    /// field).
    #[inline]
    pub fn admits_stamp(&self, slot: u16, stamp: u32) -> bool {
        stamp == 0 || stamp == u32::MAX || self.led_since(slot, u64::from(stamp))
    }

    /// Whether `slot`'s group has been led by its current primary since
    /// `epoch` or before: the one rule both late-request guards
    /// ([`OpenedAt::admits`], [`Routing::admits_stamp`]) apply.
    #[inline]
    fn led_since(&self, slot: u16, epoch: u64) -> bool {
        self.map.groups[self.routes.group_of(slot)].since <= epoch
    }

    /// Whether this server may serve a read of `slot`: as [`Routing::serves`],
    /// except that its primary goes on serving reads while the group is
    /// handed over (no write runs there then, so its copy is the last
    /// word), until it closes the group to commit the hand-over.
    #[inline]
    pub fn serves_read(&self, slot: u16, replica_read: bool) -> bool {
        let gi = self.routes.group_of(slot);
        let g = &self.map.groups[gi];
        let lead = g.primary == self.me && (!g.handing_over() || !self.closing.holds(gi));
        let copy = replica_read && g.backups.contains(&self.me) && !g.handing_over();
        self.active && (lead || copy) && self.leased()
    }

    /// Whether `slot`'s group is being handed over to another server: a
    /// command for it is refused for a moment, to be sent again (to the
    /// new owner once the map names it).
    #[inline]
    pub fn handing_over(&self, slot: u16) -> bool {
        self.map.groups[self.routes.group_of(slot)].handing_over()
    }

    /// Whether the server's lease holds now, where it needs one: read
    /// per command, on a fresh clock, so that a server frozen and resumed
    /// (SIGSTOP) cannot answer from data a successor has moved past.
    #[inline]
    fn leased(&self) -> bool {
        match &self.lease {
            None => true,
            Some((lease, clock)) => lease.valid(clock.now_ms()),
        }
    }

    /// The primary of `slot`.
    #[inline]
    pub fn primary_of(&self, slot: u16) -> u32 {
        self.map.groups[self.routes.group_of(slot)].primary
    }

    /// The refusal of a request for `slot` where this server does not
    /// serve it: `WRONG_SERVER`, naming the slot's primary.
    pub fn wrong_server(&self, slot: u16) -> crate::service::Refusal {
        (
            fabrickv_types::ErrorCode::WrongServer,
            format!("slot {slot} is served by server {}", self.primary_of(slot)),
        )
    }

    /// Where keys of `slots` (one per key) must go, seen from here.
    pub fn route(&self, mut slots: impl Iterator<Item = u16>, replica_read: bool) -> Route {
        let Some(first) = slots.next() else {
            return Route::Here;
        };
        if slots.any(|s| s != first) {
            return Route::CrossSlot;
        }
        if self.serves(first, replica_read) {
            return Route::Here;
        }
        if self.handing_over(first) {
            return Route::TryAgain { slot: first };
        }
        let to = self
            .server(self.primary_of(first))
            .and_then(|d| d.resp.clone());
        Route::Moved { slot: first, to }
    }
}

/// Server `id`'s descriptor on loopback, ports 7000 + id (native) and 8000
/// + id (RESP), for tests of routing.
#[cfg(test)]
pub(crate) fn loopback_desc(id: u32) -> ServerDesc {
    ServerDesc {
        id,
        addrs: vec![format!("tcp://127.0.0.1:{}", 7000 + id)],
        resp: Some(format!("127.0.0.1:{}", 8000 + id)),
        grpc: None,
        memcache: None,
        memcache_peer: None,
        repl: None,
        workers: 1,
        pid: 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fabrickv_cluster::slots::key_slot;

    #[test]
    fn a_group_handed_over_serves_reads_until_its_primary_closes_it() {
        let map = SlotMap::initial(3, 1).expect("map");
        let plan = map.plan_add(3);
        let moving = map.with_moves(&plan).expect("move");
        let g = moving
            .groups
            .iter()
            .position(|g| g.moving_to.is_some() && g.primary == 0)
            .expect("a group of server 0 moves");
        let handing = moving.promoted(g, 3).expect("the joiner promoted");
        let slot = handing.groups[g].ranges[0].first;
        let servers = (0..4).map(|i| Some(loopback_desc(i))).collect();
        let r = Routing::new(0, "t", handing, servers);
        assert!(!r.serves(slot, false), "no write runs while handing over");
        assert!(r.serves_read(slot, false), "reads go on");
        assert_eq!(r.route([slot].into_iter(), false), Route::TryAgain { slot });
        r.closing.close(g);
        assert!(!r.serves_read(slot, false), "closed for the commit");
        // Another group of the same server is untouched.
        let other = r.map.groups[0].ranges[0].first;
        assert!(r.serves(other, false) && r.serves_read(other, false));
    }

    #[test]
    fn a_key_is_served_by_its_primary_and_moved_elsewhere() {
        let map = SlotMap::initial(3, 2).expect("map");
        let servers = (0..3).map(|i| Some(loopback_desc(i))).collect();
        let r = Routing::new(1, "t", map, servers);
        // Server 1 leads slots 5461..=10922 and backs up 0..=5460.
        assert_eq!(r.route([5461u16].into_iter(), false), Route::Here);
        assert_eq!(
            r.route([0u16].into_iter(), false),
            Route::Moved {
                slot: 0,
                to: Some("127.0.0.1:8000".into())
            }
        );
        assert_eq!(
            r.route([0u16].into_iter(), true),
            Route::Here,
            "a replica read"
        );
        assert_eq!(
            r.route([12000u16].into_iter(), true),
            Route::Moved {
                slot: 12000,
                to: Some("127.0.0.1:8002".into())
            },
            "server 1 holds no copy of server 2's slots"
        );
        let tagged = [key_slot(b"{u}a"), key_slot(b"{u}b")];
        assert!(matches!(
            r.route(tagged.into_iter(), false),
            Route::Here | Route::Moved { .. }
        ));
        assert_eq!(r.route([1u16, 2].into_iter(), false), Route::CrossSlot);
        assert_eq!(r.route(std::iter::empty(), false), Route::Here);
    }

    #[test]
    fn a_view_is_handed_out_once_per_change() {
        let p = SlotRouting::new();
        assert!(p.refresh(0).is_none(), "no map yet: nothing to refresh");
        let map = SlotMap::initial(1, 1).expect("map");
        p.install(Routing::new(0, "t", map, vec![Some(loopback_desc(0))]));
        let (v, r) = p.refresh(0).expect("a change");
        assert!(r.is_some());
        assert!(p.refresh(v).is_none(), "nothing new since");
    }
}
