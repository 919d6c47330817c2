//! Embedding tables across a cluster.
//!
//! A table exists on every server; each server holds the rows whose keys
//! map to it ([`fabrickv_cluster::server_of_u64`]). A server numbers its
//! tables itself, so one table has a different id on each server: a
//! [`ClusterTable`] is a handle into the [`ClusterPs`] that made it, which
//! keeps one [`TableDesc`] per server connection and creates (or opens)
//! the table on a server when it first needs it there, which is also how a
//! restarted server gets its tables back (empty: its rows are lost with it,
//! and pulls of them follow the table's missing-key policy).
//!
//! In a cluster registered in etcd (`follow_slots`) a row's owner is the
//! primary of its slot ([`fabrickv_cluster::slots::slot_of_u64`]), and the
//! rows are replicated: a call whose server fails or refuses
//! (WRONG_SERVER) waits for the map to move on and sends again what got
//! no answer. A put or push is split by replica group, and each part
//! carries a request id that it keeps across those retries, so a part the
//! old primary applied (and replicated) before it died is answered, not
//! applied again, by the new one.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use fabrickv_cluster::etcd::EtcdRegistry;
use fabrickv_cluster::slots::{slot_of_u64, SlotMap};
use fabrickv_cluster::{server_of_u64, Cluster, Directory, Registry};
use fabrickv_types::ErrorCode;
use fabrickv_wire::ps::{PushId, PushMode, TableDesc, TableSpec};

use super::slots::{SlotFollow, FAILOVER_WAIT_MS};
use super::{cluster_of, lookup, ClusterOf, ClusterOptions, Members, PerServer};
use crate::ps::push_frames;
use crate::ps::{PsClient, PullId, Pulled};
use crate::{ClientError, Result};

/// A server connection of a [`ClusterPs`]: its client and, per table slot
/// of the cluster client, the table's descriptor on that server once
/// created or opened there.
pub struct PsConn {
    /// The server's client.
    ps: PsClient,
    /// Per table slot of the cluster client, the table's descriptor here.
    tables: Vec<Option<TableDesc>>,
}

impl PerServer for PsConn {
    type Options = ();

    fn connect(addr: &str, timeout: Duration, _: &()) -> Result<PsConn> {
        Ok(PsConn {
            ps: PsClient::connect_with_timeout(addr, timeout)?,
            tables: Vec::new(),
        })
    }
}

/// A table of a [`ClusterPs`]. Only meaningful to the client that made
/// it: it names a slot there, and the per-server ids live in the client.
#[derive(Debug, Clone, PartialEq)]
pub struct ClusterTable {
    slot: usize,
    spec: TableSpec,
}

impl ClusterTable {
    /// The table's shape.
    pub fn spec(&self) -> &TableSpec {
        &self.spec
    }

    /// The table's name.
    pub fn name(&self) -> &str {
        &self.spec.name
    }

    /// Floats per vector.
    pub fn dim(&self) -> u32 {
        self.spec.dim
    }
}

/// A table as listed across the cluster.
#[derive(Debug, Clone, PartialEq)]
pub struct ClusterTableInfo {
    /// The table's shape (as the first server that lists it has it).
    pub spec: TableSpec,
    /// Keys stored, over every server that answered.
    pub items: u64,
    /// Keys stored per server; `None` where the server is down or does not
    /// hold the table.
    pub items_per_server: Vec<Option<u64>>,
}

/// One server's share of an outstanding cluster pull.
#[derive(Debug)]
struct PullPart {
    server: usize,
    /// The connection the pull went out on.
    epoch: u64,
    id: PullId,
    /// Positions in the whole pull of this part's keys, in its order;
    /// `None` when the part is the whole pull, in order.
    positions: Option<Vec<usize>>,
}

/// An outstanding pull across the cluster, from [`ClusterPs::pull_async`].
#[derive(Debug)]
#[must_use = "an outstanding pull holds room in each server's client until it is waited on or cancelled"]
pub struct ClusterPull {
    parts: Vec<PullPart>,
    keys: usize,
    dim: usize,
}

/// An embedding-table client of a whole cluster: one [`PsClient`] per
/// server; pulls, puts and pushes are split by key owner, every part is
/// sent before any is awaited, and pulled rows land straight at their
/// keys' positions in the caller's buffer.
pub struct ClusterPs {
    m: Members<PsConn>,
    /// Table shapes, by slot.
    specs: Vec<TableSpec>,
    /// Scratch for splitting keys and values per server, reused.
    part_keys: Vec<u64>,
    part_vals: Vec<Vec<f32>>,
    /// The slot map, in a cluster registered in etcd.
    slots: Option<Box<SlotFollow>>,
    /// This client's pushes' ids: random per client, then numbered.
    client_id: u64,
    next_seq: u64,
}

/// One replica group's share of a put or push in a cluster with a slot
/// map, and the request id it keeps across retries.
struct GroupPart {
    keys: Vec<u64>,
    vals: Vec<f32>,
    id: PushId,
}

impl std::fmt::Debug for ClusterPs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClusterPs")
            .field("cluster", &self.m.cluster)
            .field("servers", &self.m.size())
            .field("tables", &self.specs.len())
            .finish()
    }
}

impl From<Members<PsConn>> for ClusterPs {
    fn from(m: Members<PsConn>) -> Self {
        ClusterPs {
            m,
            specs: Vec::new(),
            part_keys: Vec::new(),
            part_vals: Vec::new(),
            slots: None,
            client_id: client_id(),
            next_seq: 1,
        }
    }
}

/// A client id for push request ids: random, so that two clients never
/// share one (a collision would make one's push answer the other's).
fn client_id() -> u64 {
    fabrickv_auth::random_u64()
}

cluster_of!(ClusterPs, PsConn);

impl ClusterPs {
    /// Connects to every registered server of `cluster` (as
    /// [`super::ClusterClient::connect`] does).
    pub fn connect(cluster: &Cluster, opts: ClusterOptions) -> Result<ClusterPs> {
        ClusterPs::connect_cluster(cluster, &opts, ())
    }

    /// Looks the cluster up in the registry and connects to it (as
    /// [`super::ClusterClient::join`] does).
    pub fn join(registry_url: &str, name: &str, opts: ClusterOptions) -> Result<ClusterPs> {
        if fabrickv_cluster::etcd::is_etcd_url(registry_url) {
            let (cluster, map, reg) = super::lookup_etcd(registry_url, name, opts.timeout)?;
            return Ok(ClusterPs::connect(&cluster, opts)?.follow_slots(reg, map));
        }
        let (cluster, reg) = lookup(registry_url, name, opts.timeout)?;
        Ok(ClusterPs::connect(&cluster, opts)?.follow(reg))
    }

    /// Keeps `registry` to find servers that come back elsewhere (as
    /// [`super::ClusterClient::follow`]).
    pub fn follow(self, registry: Registry) -> ClusterPs {
        self.following(Some(registry.into()))
    }

    /// Routes by the slot map `map` of the etcd cluster at `registry`, and
    /// follows its changes and its servers' descriptors there (as
    /// [`super::ClusterClient::follow_slots`]).
    pub fn follow_slots(self, registry: EtcdRegistry, map: SlotMap) -> ClusterPs {
        let mut c = self.following(Some(Directory::Etcd(Box::new(registry.clone()))));
        c.slots = Some(Box::new(SlotFollow::start(registry, map)));
        c
    }

    /// The number of servers, up or down.
    pub fn size(&self) -> u32 {
        self.servers()
    }

    /// The server that owns `key`: its slot's primary in a cluster with a
    /// slot map, its jump-hash bucket otherwise.
    #[inline]
    pub fn server_of(&self, key: u64) -> u32 {
        match &self.slots {
            Some(f) => f.primary_of_slot(slot_of_u64(key)),
            None => server_of_u64(key, self.m.size()),
        }
    }

    /// Takes what the etcd watch delivered since the last call.
    fn follow_map(&mut self) {
        super::slots::follow_map(&mut self.slots, &mut self.m);
    }

    /// After a call failed with `e`, in a cluster with a slot map: whether
    /// to send it again, once the map allows ([`SlotFollow::reroute`]).
    fn await_reroute(&mut self, e: &ClientError, deadline: Instant) -> bool {
        super::slots::reroute(&mut self.slots, &mut self.m, e, deadline)
    }

    /// Whether server `id` is connected now.
    pub fn is_up(&self, id: u32) -> bool {
        self.server_up(id)
    }

    /// Creates a table on every server (or opens it where it exists with
    /// the same shape). A server that is down now gets it when a call
    /// first needs it there; fails if no server is up, or if a server
    /// refuses (a table of that name with another shape, say).
    pub fn create_table(&mut self, spec: &TableSpec) -> Result<ClusterTable> {
        spec.validate()
            .map_err(|(code, why)| ClientError::Invalid(code, why))?;
        let t = self.create_slot(spec);
        self.on_every_up_server(&t)?;
        Ok(t)
    }

    /// Opens an existing table by name: its shape is read from the first
    /// server that can be reached; every other server opens it (or, if it
    /// lost it, creates it) when a call first needs it there.
    pub fn open_table(&mut self, name: &str) -> Result<ClusterTable> {
        let mut last_err = None;
        for s in 0..self.m.servers.len() {
            match self.m.with(s, |c| c.ps.open_table(name)) {
                Ok(d) => {
                    let t = self.create_slot(&d.spec);
                    if let Ok(c) = self.m.conn(s) {
                        set_desc(c, t.slot, d);
                    }
                    self.on_every_up_server(&t)?;
                    return Ok(t);
                }
                // A refusal (no such table) is the cluster's answer.
                Err(e) if is_refusal_at(&e) => return Err(e),
                Err(e) => last_err = Some(e),
            }
        }
        Err(last_err.unwrap_or_else(|| ClientError::Unavailable("no server is up".into())))
    }

    /// The slot of table `spec.name`, (re)set to `spec`; its descriptors
    /// are cleared, to be fetched again from each server.
    fn create_slot(&mut self, spec: &TableSpec) -> ClusterTable {
        let slot = match self.specs.iter().position(|s| s.name == spec.name) {
            Some(i) => {
                self.specs[i] = spec.clone();
                for m in &mut self.m.servers {
                    if let Some(d) = m.conn.as_mut().and_then(|c| c.tables.get_mut(i)) {
                        *d = None;
                    }
                }
                i
            }
            None => {
                self.specs.push(spec.clone());
                self.specs.len() - 1
            }
        };
        ClusterTable {
            slot,
            spec: spec.clone(),
        }
    }

    /// Makes sure `t` exists on every server that is up (or comes up when
    /// tried); fails on a refusal, or if no server is up.
    fn on_every_up_server(&mut self, t: &ClusterTable) -> Result<()> {
        let mut up = 0;
        let mut first_down = None;
        for s in 0..self.m.servers.len() {
            match self.table_on(s, t) {
                Ok(_) => up += 1,
                Err(e) if is_refusal_at(&e) => return Err(e),
                Err(e) => {
                    first_down.get_or_insert(e);
                }
            }
        }
        match first_down {
            Some(e) if up == 0 => Err(e),
            _ => Ok(()),
        }
    }

    fn check_table(&self, t: &ClusterTable) -> Result<()> {
        match self.specs.get(t.slot) {
            Some(s) if *s == t.spec => Ok(()),
            _ => Err(ClientError::Invalid(
                ErrorCode::NoSuchTable,
                format!(
                    "table {} was not created or opened by this client (or was created again since)",
                    t.spec.name
                ),
            )),
        }
    }

    /// Server `s`'s connection with table `t` ready on it (connecting
    /// and creating or opening the table there first if needed).
    fn table_on(&mut self, s: usize, t: &ClusterTable) -> Result<&mut PsConn> {
        let ready = self
            .m
            .ensure(s)?
            .tables
            .get(t.slot)
            .is_some_and(Option::is_some);
        if !ready {
            let d = self.m.with(s, |c| c.ps.create_table(&t.spec))?;
            set_desc(self.m.conn(s)?, t.slot, d);
        }
        self.m.conn(s)
    }

    /// Starts a pull of `keys` from `t` on every server that owns some of
    /// them; returns at once. Every owner is connected (and has the table)
    /// before any part is sent.
    pub fn pull_async(&mut self, t: &ClusterTable, keys: &[u64]) -> Result<ClusterPull> {
        self.check_table(t)?;
        self.follow_map();
        let n = self.m.size();
        let dim = t.spec.dim as usize;
        if n == 1 {
            let c = self.table_on(0, t)?;
            let id = c.ps.pull_async(desc(&c.tables, t.slot)?, keys);
            let id = id.map_err(|e| self.m.fail_or_wrap(0, e))?;
            return Ok(ClusterPull {
                parts: vec![PullPart {
                    server: 0,
                    epoch: self.m.servers[0].epoch,
                    id,
                    positions: None,
                }],
                keys: keys.len(),
                dim,
            });
        }
        let mut positions: Vec<Vec<usize>> = vec![Vec::new(); n as usize];
        for (i, &k) in keys.iter().enumerate() {
            positions[self.server_of(k) as usize].push(i);
        }
        for (s, p) in positions.iter().enumerate() {
            if !p.is_empty() {
                self.table_on(s, t)?;
            }
        }
        let mut pull = ClusterPull {
            parts: Vec::with_capacity(positions.iter().filter(|p| !p.is_empty()).count()),
            keys: keys.len(),
            dim,
        };
        for (s, p) in positions.into_iter().enumerate() {
            if p.is_empty() {
                continue;
            }
            self.part_keys.clear();
            self.part_keys.extend(p.iter().map(|&i| keys[i]));
            let c = self.m.conn(s)?;
            let id = c.ps.pull_async(desc(&c.tables, t.slot)?, &self.part_keys);
            match id {
                Ok(id) => pull.parts.push(PullPart {
                    server: s,
                    epoch: self.m.servers[s].epoch,
                    id,
                    positions: Some(p),
                }),
                Err(e) => {
                    let e = self.m.fail_or_wrap(s, e);
                    self.cancel(pull);
                    return Err(e);
                }
            }
        }
        Ok(pull)
    }

    /// Gives up on a pull: each part's room is freed once its server has
    /// answered.
    pub fn cancel(&mut self, pull: ClusterPull) {
        for part in pull.parts {
            if let Some(c) = self.part_conn(&part) {
                // A part its client no longer knows has nothing to free.
                let _ = c.ps.cancel(part.id);
            }
        }
    }

    /// The connection a part went out on, if it is still that one.
    fn part_conn(&mut self, part: &PullPart) -> Option<&mut PsConn> {
        let m = &mut self.m.servers[part.server];
        if m.epoch != part.epoch {
            return None;
        }
        m.conn.as_mut()
    }

    /// Waits for `pull` and lands its vectors in `out` (`keys x dim`
    /// floats, the keys' order): each server's rows are copied straight
    /// from where they arrived (its reply, or its registered region) to
    /// their keys' rows of `out`. Returns how many keys the table held;
    /// `found`, if given, receives the per-key flags.
    pub fn wait_into(
        &mut self,
        pull: ClusterPull,
        out: &mut [f32],
        mut found: Option<&mut [bool]>,
    ) -> Result<usize> {
        let n = pull.keys * pull.dim;
        if out.len() != n {
            let e = ClientError::Invalid(
                ErrorCode::BadDimension,
                format!("output holds {} floats; the pull has {n}", out.len()),
            );
            self.cancel(pull);
            return Err(e);
        }
        let vb = pull.dim * 4;
        let mut held = 0;
        let mut first_err = None;
        for part in pull.parts {
            let s = part.server;
            let Some(c) = self.part_conn(&part) else {
                first_err.get_or_insert(self.m.at(
                    s,
                    ClientError::Unavailable(
                        "the connection this pull went out on was lost".into(),
                    ),
                ));
                continue;
            };
            let got = match &part.positions {
                None => c.ps.wait_into(part.id, out, found.as_deref_mut()),
                Some(positions) => {
                    let out_bytes: &mut [u8] = bytemuck::cast_slice_mut(&mut *out);
                    let found = found.as_deref_mut();
                    c.ps.wait_view(part.id, |bytes, f| {
                        scatter(bytes, f, positions, vb, out_bytes, found)
                    })
                }
            };
            match got {
                Ok(h) => held += h,
                Err(e) => {
                    let e = self.m.fail_or_wrap(s, e);
                    first_err.get_or_insert(e);
                }
            }
        }
        first_err.map_or(Ok(held), Err)
    }

    /// Pulls `keys` into `out` (`keys.len() * dim` floats); returns how
    /// many keys the table held.
    pub fn pull_into(
        &mut self,
        t: &ClusterTable,
        keys: &[u64],
        out: &mut [f32],
        found: Option<&mut [bool]>,
    ) -> Result<usize> {
        let want = keys.len() * t.spec.dim as usize;
        if out.len() != want {
            return Err(ClientError::Invalid(
                ErrorCode::BadDimension,
                format!(
                    "output holds {} floats; {} keys x dim {} need {want}",
                    out.len(),
                    keys.len(),
                    t.spec.dim
                ),
            ));
        }
        if self.slots.is_none() {
            let pull = self.pull_async(t, keys)?;
            return self.wait_into(pull, out, found);
        }
        // Reads change nothing: a pull that met a failure or a moved slot
        // is sent again whole once the map has moved on.
        let deadline = Instant::now() + Duration::from_millis(FAILOVER_WAIT_MS);
        let mut found = found;
        loop {
            let r = self
                .pull_async(t, keys)
                .and_then(|pull| self.wait_into(pull, out, found.as_deref_mut()));
            match r {
                Err(e) if self.await_reroute(&e, deadline) => continue,
                r => return r,
            }
        }
    }

    /// Pulls `keys`, returning fresh vectors.
    pub fn pull(&mut self, t: &ClusterTable, keys: &[u64]) -> Result<Pulled> {
        let mut values = vec![0f32; keys.len() * t.spec.dim as usize];
        let mut found = vec![false; keys.len()];
        self.pull_into(t, keys, &mut values, Some(&mut found))?;
        Ok(Pulled { values, found })
    }

    /// Stores `values` (`keys.len() * dim` floats) as the keys' vectors.
    pub fn put(&mut self, t: &ClusterTable, keys: &[u64], values: &[f32]) -> Result<()> {
        self.push_mode(t, keys, values, PushMode::Overwrite)
    }

    /// Applies `grads` (`keys.len() * dim` floats) with the table's
    /// optimizer, atomically per key.
    pub fn push(&mut self, t: &ClusterTable, keys: &[u64], grads: &[f32]) -> Result<()> {
        self.push_mode(t, keys, grads, PushMode::Gradient)
    }

    /// Splits a put or push by owner (each part's keys and values gathered
    /// contiguous, as a request carries them, into buffers reused from call
    /// to call), posts every part, then collects every part by one
    /// deadline.
    fn push_mode(
        &mut self,
        t: &ClusterTable,
        keys: &[u64],
        values: &[f32],
        mode: PushMode,
    ) -> Result<()> {
        self.check_table(t)?;
        let dim = t.spec.dim as usize;
        if values.len() != keys.len() * dim {
            return Err(ClientError::Invalid(
                ErrorCode::BadDimension,
                format!(
                    "values hold {} floats; {} keys x dim {dim} need {}",
                    values.len(),
                    keys.len(),
                    keys.len() * dim
                ),
            ));
        }
        if self.slots.is_some() {
            return self.push_by_group(t, keys, values, mode);
        }
        let n = self.m.size() as usize;
        if n == 1 {
            let c = self.table_on(0, t)?;
            let d = desc(&c.tables, t.slot)?;
            let timeout = c.ps.timeout();
            let r =
                c.ps.push_post(d, keys, values, mode, None)
                    .and_then(|p| c.ps.push_collect(p, Instant::now() + timeout));
            return r.map_err(|e| self.m.fail_or_wrap(0, e));
        }
        let mut part_keys: Vec<Vec<u64>> = vec![Vec::new(); n];
        self.part_vals.resize_with(n, Vec::new);
        for v in &mut self.part_vals {
            v.clear();
        }
        for (i, &k) in keys.iter().enumerate() {
            let s = server_of_u64(k, n as u32) as usize;
            part_keys[s].push(k);
            self.part_vals[s].extend_from_slice(&values[i * dim..(i + 1) * dim]);
        }
        for (s, k) in part_keys.iter().enumerate() {
            if !k.is_empty() {
                self.table_on(s, t)?;
            }
        }
        let part_vals = &self.part_vals;
        let with_part = (0..n).filter(|&s| !part_keys[s].is_empty());
        self.m.post_then_collect(
            with_part,
            true,
            |c, s| {
                let d = desc(&c.tables, t.slot)?;
                c.ps.push_post(d, &part_keys[s], &part_vals[s], mode, None)
            },
            |c, p, deadline| c.ps.push_collect(p, deadline),
        )
    }

    /// A put or push in a cluster with a slot map: split by replica
    /// group, each part under a request id of its own, and what failed
    /// sent again, same ids, to the group's primary once the map names it.
    fn push_by_group(
        &mut self,
        t: &ClusterTable,
        keys: &[u64],
        values: &[f32],
        mode: PushMode,
    ) -> Result<()> {
        self.follow_map();
        let mut parts = self.group_parts(keys, values, t.spec.dim);
        let deadline = Instant::now() + Duration::from_millis(FAILOVER_WAIT_MS);
        loop {
            let mut failed: Vec<(GroupPart, ClientError)> = Vec::new();
            let mut posted = Vec::with_capacity(parts.len());
            for part in parts {
                let s = self.server_of(part.keys[0]) as usize;
                let sent = self.table_on(s, t).and_then(|c| {
                    let d = desc(&c.tables, t.slot)?;
                    c.ps.push_post(d, &part.keys, &part.vals, mode, Some(part.id))
                });
                match sent {
                    Ok(p) => posted.push((s, part, p)),
                    Err(e) => {
                        let e = self.m.fail_or_wrap(s, e);
                        failed.push((part, e));
                    }
                }
            }
            let collect_by = Instant::now() + self.m.timeout;
            for (s, part, p) in posted {
                if let Err(e) = self
                    .m
                    .conn(s)
                    .and_then(|c| c.ps.push_collect(p, collect_by))
                {
                    let e = self.m.fail_or_wrap(s, e);
                    failed.push((part, e));
                }
            }
            let Some((_, first)) = failed.first() else {
                return Ok(());
            };
            if !self.await_reroute(first, deadline) {
                return Err(failed.swap_remove(0).1);
            }
            parts = Vec::with_capacity(failed.len());
            for (part, e) in failed {
                if e.code() == ErrorCode::WrongServer {
                    // Refused whole, so not applied: split again by the
                    // new map, under new ids.
                    parts.extend(self.group_parts(&part.keys, &part.vals, t.spec.dim));
                } else {
                    parts.push(part);
                }
            }
        }
    }

    /// `keys` and their `values` (`dim` floats each) split by the replica
    /// group of their slots, each part with the next request ids.
    fn group_parts(&mut self, keys: &[u64], values: &[f32], dim: u32) -> Vec<GroupPart> {
        let Some(f) = &self.slots else {
            return Vec::new();
        };
        let floats = dim as usize;
        let mut by_group: BTreeMap<usize, (Vec<u64>, Vec<f32>)> = BTreeMap::new();
        for (i, &k) in keys.iter().enumerate() {
            let e = by_group.entry(f.group_of_slot(slot_of_u64(k))).or_default();
            e.0.push(k);
            e.1.extend_from_slice(&values[i * floats..(i + 1) * floats]);
        }
        by_group
            .into_values()
            .map(|(keys, vals)| {
                let id = PushId {
                    client: self.client_id,
                    seq: self.next_seq,
                };
                self.next_seq += push_frames(keys.len(), dim);
                GroupPart { keys, vals, id }
            })
            .collect()
    }

    /// Every table any server holds, by name, with its item counts per
    /// server. Fails only if no server is up.
    pub fn tables(&mut self) -> Result<Vec<ClusterTableInfo>> {
        let n = self.m.servers.len();
        let mut by_name: BTreeMap<String, ClusterTableInfo> = BTreeMap::new();
        let mut up = 0;
        let mut first_err = None;
        for s in 0..n {
            match self.m.with(s, |c| c.ps.tables()) {
                Ok(list) => {
                    up += 1;
                    for d in list {
                        let e = by_name.entry(d.spec.name.clone()).or_insert_with(|| {
                            ClusterTableInfo {
                                spec: d.spec.clone(),
                                items: 0,
                                items_per_server: vec![None; n],
                            }
                        });
                        e.items += d.items;
                        e.items_per_server[s] = Some(d.items);
                    }
                }
                Err(e) => {
                    first_err.get_or_insert(e);
                }
            }
        }
        match first_err {
            Some(e) if up == 0 => Err(e),
            _ => Ok(by_name.into_values().collect()),
        }
    }
}

/// Whether `e` (as a cluster client returns it) is a refusal by a server.
fn is_refusal_at(e: &ClientError) -> bool {
    match e {
        ClientError::AtServer { error, .. } => super::is_refusal(error),
        e => super::is_refusal(e),
    }
}

fn set_desc(c: &mut PsConn, slot: usize, d: TableDesc) {
    if c.tables.len() <= slot {
        c.tables.resize(slot + 1, None);
    }
    c.tables[slot] = Some(d);
}

/// The table's descriptor on the server `c` talks to (made ready by
/// `table_on`).
fn desc(tables: &[Option<TableDesc>], slot: usize) -> Result<&TableDesc> {
    tables
        .get(slot)
        .and_then(Option::as_ref)
        .ok_or_else(|| ClientError::Protocol("table not open on this server".into()))
}

/// Copies one server's rows (`bytes`, its keys' order) and found flags to
/// their keys' `positions` in the whole pull's output; returns how many
/// keys that server held.
fn scatter(
    bytes: &[u8],
    f: &[bool],
    positions: &[usize],
    vb: usize,
    out: &mut [u8],
    mut found: Option<&mut [bool]>,
) -> usize {
    let mut held = 0;
    for (j, &pos) in positions.iter().enumerate() {
        out[pos * vb..(pos + 1) * vb].copy_from_slice(&bytes[j * vb..(j + 1) * vb]);
        let hit = f.get(j).copied().unwrap_or(false);
        if let Some(fd) = found.as_deref_mut() {
            if let Some(x) = fd.get_mut(pos) {
                *x = hit;
            }
        }
        held += usize::from(hit);
    }
    held
}
