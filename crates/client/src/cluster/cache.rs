//! The KV cache across a cluster.
//!
//! One [`CacheClient`] per server, each with its own receive buffer
//! (registered with that server where the transport can: a server can
//! write one-sided only into a region registered on its own connection,
//! so one buffer cannot serve several servers). Values therefore land in
//! the buffer of the client of the server that owns the key:
//! [`ClusterCache::get_at`] and [`ClusterCache::get_many_at`] say which
//! server's buffer ([`ClusterPlaced::server`], read with
//! [`ClusterCache::buffer`]); [`ClusterCache::get_into`] and
//! [`ClusterCache::get`] copy the value out to the caller. A client of a
//! cluster of `n` servers thus holds `n` buffers of `buffer_bytes`.
//!
//! In a cluster registered in etcd (`follow_slots`, or `join` of an
//! `etcd://` URL) a key's owner is its slot's primary. The cache keeps one
//! copy: a value cached on a server that dies is gone (a cache miss, to be
//! recomputed), and a call that meets a failed server or a moved slot is
//! sent again to the slot's new primary once the map names it.

use std::time::{Duration, Instant};

use fabrickv_cluster::etcd::EtcdRegistry;
use fabrickv_cluster::slots::{key_slot, SlotMap};
use fabrickv_cluster::{server_of_key, Cluster, Directory, Registry};
use fabrickv_types::limits::CACHE_BATCH_KEYS_MAX;
use fabrickv_types::ErrorCode;
use fabrickv_wire::cache::CacheOp;

use super::slots::{SlotFollow, FAILOVER_WAIT_MS};
use super::{cluster_of, lookup, ClusterOf, ClusterOptions, Members};
use crate::cache::{CacheClient, Placed};
use crate::{ClientError, Result};

/// A value read into one server's client buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClusterPlaced {
    /// The server that owns the key: the value is in its client's buffer
    /// ([`ClusterCache::buffer`]).
    pub server: u32,
    /// Where in that buffer, and the value's metadata.
    pub placed: Placed,
}

/// A KV-cache client of a whole cluster: every key goes to the server that
/// owns it, through that server's [`CacheClient`].
pub struct ClusterCache {
    m: Members<CacheClient>,
    /// The slot map, in a cluster registered in etcd.
    slots: Option<Box<SlotFollow>>,
}

impl std::fmt::Debug for ClusterCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClusterCache")
            .field("cluster", &self.m.cluster)
            .field("servers", &self.m.size())
            .finish()
    }
}

impl From<Members<CacheClient>> for ClusterCache {
    fn from(m: Members<CacheClient>) -> Self {
        ClusterCache { m, slots: None }
    }
}

cluster_of!(ClusterCache, CacheClient);

impl ClusterCache {
    /// Connects to every registered server of `cluster` (as
    /// [`super::ClusterClient::connect`] does), each client with a receive
    /// buffer of `buffer_bytes`.
    pub fn connect(
        cluster: &Cluster,
        opts: ClusterOptions,
        buffer_bytes: usize,
    ) -> Result<ClusterCache> {
        ClusterCache::connect_cluster(cluster, &opts, buffer_bytes)
    }

    /// Looks the cluster up in the registry and connects to it (as
    /// [`super::ClusterClient::join`] does).
    pub fn join(
        registry_url: &str,
        name: &str,
        opts: ClusterOptions,
        buffer_bytes: usize,
    ) -> Result<ClusterCache> {
        if fabrickv_cluster::etcd::is_etcd_url(registry_url) {
            let (cluster, map, reg) = super::lookup_etcd(registry_url, name, opts.timeout)?;
            return Ok(ClusterCache::connect(&cluster, opts, buffer_bytes)?.follow_slots(reg, map));
        }
        let (cluster, reg) = lookup(registry_url, name, opts.timeout)?;
        Ok(ClusterCache::connect(&cluster, opts, buffer_bytes)?.follow(reg))
    }

    /// Routes by the slot map `map` of the etcd cluster at `registry`, and
    /// follows its changes and its servers' descriptors there (as
    /// [`super::ClusterClient::follow_slots`]).
    pub fn follow_slots(self, registry: EtcdRegistry, map: SlotMap) -> ClusterCache {
        let mut c = self.following(Some(Directory::Etcd(Box::new(registry.clone()))));
        c.slots = Some(Box::new(SlotFollow::start(registry, map)));
        c
    }

    /// Runs `f` on the client of `key`'s server; in a cluster with a slot
    /// map, a failure or a refusal for a moved slot waits for the map to
    /// move on and runs it again at the new owner (every cache operation
    /// may run twice: a put overwrites). Returns the server it ran on.
    fn on_owner<T>(
        &mut self,
        key: &[u8],
        mut f: impl FnMut(&mut CacheClient) -> Result<T>,
    ) -> Result<(u32, T)> {
        super::slots::follow_map(&mut self.slots, &mut self.m);
        let deadline = Instant::now() + Duration::from_millis(FAILOVER_WAIT_MS);
        loop {
            let s = self.server_of(key);
            match self.m.with(s as usize, &mut f) {
                Ok(t) => return Ok((s, t)),
                Err(e) if self.rerouted(&e, deadline) => {}
                Err(e) => return Err(e),
            }
        }
    }

    /// Whether a call that failed with `e` goes again, once the map allows.
    fn rerouted(&mut self, e: &ClientError, deadline: Instant) -> bool {
        super::slots::reroute(&mut self.slots, &mut self.m, e, deadline)
    }

    /// Keeps `registry` to find servers that come back elsewhere (as
    /// [`super::ClusterClient::follow`]).
    pub fn follow(self, registry: Registry) -> ClusterCache {
        self.following(Some(registry.into()))
    }

    /// The number of servers, up or down.
    pub fn size(&self) -> u32 {
        self.servers()
    }

    /// The server that owns `key`: its slot's primary in a cluster with a
    /// slot map, its jump-hash bucket otherwise.
    #[inline]
    pub fn server_of(&self, key: &[u8]) -> u32 {
        match &self.slots {
            Some(f) => f.primary_of_slot(key_slot(key)),
            None => server_of_key(key, self.m.size()),
        }
    }

    /// Whether server `id` is connected now.
    pub fn is_up(&self, id: u32) -> bool {
        self.server_up(id)
    }

    /// The client of server `id` (connecting if it is down).
    pub fn client(&mut self, id: u32) -> Result<&mut CacheClient> {
        self.server_client(id)
    }

    /// The receive buffer of server `id`'s client, where
    /// [`ClusterCache::get_at`] places that server's values.
    pub fn buffer(&mut self, id: u32) -> Result<&mut [u8]> {
        self.client(id)?.buffer()
    }

    /// Stores `value` under `key` on its server, with a time to live
    /// (`None` = forever); returns the value's generation.
    pub fn put(&mut self, key: &[u8], value: &[u8], ttl: Option<Duration>) -> Result<u64> {
        Ok(self.on_owner(key, |c| c.put(key, value, ttl))?.1)
    }

    /// Stores each `(key, value)` on its key's server, all with the same
    /// time to live; one result per item, in order (its generation, or
    /// its own refusal). Every item is checked before anything is sent.
    /// The batch is split by server and each server's part is a
    /// pipelined [`CacheClient::put_many`] (a round trip per round of
    /// values, not per value), the parts one server after another. Items
    /// refused because their slot moved (`WRONG_SERVER`), and the parts
    /// of a server that failed, go again once the map has moved on (a
    /// value stored twice is left as written); if it does not in time,
    /// a failed server fails the call, and a moved item gets its refusal.
    pub fn put_many(
        &mut self,
        items: &[(&[u8], &[u8])],
        ttl: Option<Duration>,
    ) -> Result<Vec<Result<u64>>> {
        crate::cache::check_put_items(items)?;
        super::slots::follow_map(&mut self.slots, &mut self.m);
        let deadline = Instant::now() + Duration::from_millis(FAILOVER_WAIT_MS);
        let mut out: Vec<Option<Result<u64>>> = (0..items.len()).map(|_| None).collect();
        let mut pending: Vec<usize> = (0..items.len()).collect();
        while !pending.is_empty() {
            let mut parts: Vec<Vec<usize>> = vec![Vec::new(); self.m.size() as usize];
            for &i in &pending {
                parts[self.server_of(items[i].0) as usize].push(i);
            }
            let mut again: Vec<usize> = Vec::new();
            // A server that failed, else the first item refused as moved.
            let mut down: Option<ClientError> = None;
            let mut moved: Option<ClientError> = None;
            for (s, part) in parts.iter().enumerate().filter(|(_, p)| !p.is_empty()) {
                if down.is_some() {
                    again.extend(part);
                    continue;
                }
                let batch: Vec<(&[u8], &[u8])> = part.iter().map(|&i| items[i]).collect();
                match self.m.with(s, |c| c.put_many(&batch, ttl)) {
                    Ok(results) => {
                        for (r, &i) in results.into_iter().zip(part) {
                            match r {
                                Err(e) if e.code() == ErrorCode::WrongServer => {
                                    again.push(i);
                                    moved.get_or_insert(e);
                                }
                                r => out[i] = Some(r),
                            }
                        }
                    }
                    Err(e) => {
                        again.extend(part);
                        down = Some(e);
                    }
                }
            }
            let Some(why) = down.or(moved) else {
                break;
            };
            if !self.rerouted(&why, deadline) {
                if why.code() != ErrorCode::WrongServer {
                    return Err(why);
                }
                for &i in &again {
                    out[i] = Some(Err(ClientError::Server {
                        code: ErrorCode::WrongServer,
                        message: "the key's slot moved and the map did not follow in time".into(),
                    }));
                }
                break;
            }
            again.sort_unstable();
            pending = again;
        }
        out.into_iter()
            .map(|o| o.ok_or_else(|| ClientError::Protocol("an item got no result".into())))
            .collect()
    }

    /// Reads `key` into a new vector; `None` if absent.
    pub fn get(&mut self, key: &[u8]) -> Result<Option<Vec<u8>>> {
        Ok(self.on_owner(key, |c| c.get(key))?.1)
    }

    /// Reads `key` into `dst`; returns the value's length, `None` if
    /// absent (see [`CacheClient::get_into`]).
    pub fn get_into(&mut self, key: &[u8], dst: &mut [u8]) -> Result<Option<usize>> {
        Ok(self.on_owner(key, |c| c.get_into(key, dst))?.1)
    }

    /// Reads `key` into its server's client buffer at `offset`; `None` if
    /// absent.
    pub fn get_at(&mut self, key: &[u8], offset: usize) -> Result<Option<ClusterPlaced>> {
        let (server, p) = self.on_owner(key, |c| c.get_at(key, offset))?;
        Ok(p.map(|placed| ClusterPlaced { server, placed }))
    }

    /// Reads each `(key, offset)` into the buffer of the client of the
    /// key's server, at `offset` of that buffer (keys of different servers
    /// may share offsets; keys of one server must not overlap). One result
    /// per key, in order. The batch is split by server and each server's
    /// part is a pipelined [`CacheClient::get_many_at`]; every part is sent
    /// before any reply is read, so the servers work at once. Fails whole
    /// if a server it needs is down (in a cluster with a slot map, once
    /// the map has not moved on in time).
    pub fn get_many_at(
        &mut self,
        items: &[(&[u8], usize)],
    ) -> Result<Vec<Result<Option<ClusterPlaced>>>> {
        super::slots::follow_map(&mut self.slots, &mut self.m);
        let deadline = Instant::now() + Duration::from_millis(FAILOVER_WAIT_MS);
        loop {
            match self.get_many_once(items) {
                Err(e) if self.rerouted(&e, deadline) => {}
                // A moved slot's reads are refused one by one.
                Ok(r)
                    if r.iter()
                        .any(|x| matches!(x, Err(e) if e.code() == ErrorCode::WrongServer))
                        && self.rerouted(
                            &ClientError::Invalid(ErrorCode::WrongServer, String::new()),
                            deadline,
                        ) => {}
                r => return r,
            }
        }
    }

    fn get_many_once(
        &mut self,
        items: &[(&[u8], usize)],
    ) -> Result<Vec<Result<Option<ClusterPlaced>>>> {
        if items.len() > CACHE_BATCH_KEYS_MAX {
            return Err(ClientError::Invalid(
                ErrorCode::BatchTooLarge,
                format!("{} keys exceed CACHE_BATCH_KEYS_MAX", items.len()),
            ));
        }
        let n = self.m.size() as usize;
        let mut parts: Vec<Vec<usize>> = vec![Vec::new(); n];
        for (i, (k, _)) in items.iter().enumerate() {
            parts[self.server_of(k) as usize].push(i);
        }
        for (s, p) in parts.iter().enumerate() {
            if !p.is_empty() {
                self.m.ensure(s)?;
            }
        }
        let mut out: Vec<Option<Result<Option<ClusterPlaced>>>> =
            (0..items.len()).map(|_| None).collect();
        let part_items: Vec<Vec<(&[u8], usize)>> = parts
            .iter()
            .map(|p| p.iter().map(|&i| items[i]).collect())
            .collect();
        let mut got: Vec<Vec<Result<Option<Placed>>>> = (0..n).map(|_| Vec::new()).collect();
        let servers: Vec<usize> = (0..n).filter(|&s| !parts[s].is_empty()).collect();
        self.m.post_then_collect(
            servers.into_iter(),
            true,
            |c, s| c.post_get_many_at(&part_items[s]).map(|()| s),
            |c, s, _deadline| {
                got[s] = c.collect_get_many_at(&part_items[s])?;
                Ok(())
            },
        )?;
        for (s, p) in parts.iter().enumerate() {
            for (r, &i) in std::mem::take(&mut got[s]).into_iter().zip(p) {
                out[i] = Some(r.map(|o| {
                    o.map(|placed| ClusterPlaced {
                        server: s as u32,
                        placed,
                    })
                }));
            }
        }
        out.into_iter()
            .map(|o| o.ok_or_else(|| ClientError::Protocol("a key got no result".into())))
            .collect()
    }

    /// Removes `key`; true if it was there.
    pub fn delete(&mut self, key: &[u8]) -> Result<bool> {
        Ok(self.on_owner(key, |c| c.delete(key))?.1)
    }

    /// Whether `key` is live.
    pub fn exists(&mut self, key: &[u8]) -> Result<bool> {
        Ok(self.on_owner(key, |c| c.exists(key))?.1)
    }

    /// Whether each of `keys` is live, in order. The batch is split by
    /// server and every server's part is sent before any is awaited: one
    /// round trip per server for up to `CACHE_BATCH_KEYS_MAX` keys, the
    /// servers working at once; a longer list goes in rounds of that
    /// many. Fails whole if a server it needs is down (in a cluster with
    /// a slot map, once the map has not moved on in time).
    pub fn exists_many(&mut self, keys: &[&[u8]]) -> Result<Vec<bool>> {
        self.key_op_many(CacheOp::Exists, keys)
    }

    /// Removes each of `keys` from its server; for each, in order,
    /// whether it was there. Split and sent as
    /// [`ClusterCache::exists_many`] is; on an error the keys of other
    /// servers may have been removed.
    pub fn delete_many(&mut self, keys: &[&[u8]]) -> Result<Vec<bool>> {
        self.key_op_many(CacheOp::Delete, keys)
    }

    fn key_op_many(&mut self, op: CacheOp, keys: &[&[u8]]) -> Result<Vec<bool>> {
        for k in keys {
            crate::cache::check_key(k)?;
        }
        super::slots::follow_map(&mut self.slots, &mut self.m);
        let deadline = Instant::now() + Duration::from_millis(FAILOVER_WAIT_MS);
        let mut out = Vec::with_capacity(keys.len());
        for round in keys.chunks(CACHE_BATCH_KEYS_MAX) {
            loop {
                match self.key_op_round(op, round) {
                    Ok(flags) => {
                        out.extend(flags);
                        break;
                    }
                    // Both operations may run twice: a second delete of
                    // a key the first removed says it was absent.
                    Err(e) if self.rerouted(&e, deadline) => {}
                    Err(e) => return Err(e),
                }
            }
        }
        Ok(out)
    }

    /// One round of [`ClusterCache::key_op_many`]: every server's part
    /// posted, then every part's replies read, merged in key order.
    fn key_op_round(&mut self, op: CacheOp, keys: &[&[u8]]) -> Result<Vec<bool>> {
        let n = self.m.size() as usize;
        let mut parts: Vec<Vec<&[u8]>> = vec![Vec::new(); n];
        let mut owner = Vec::with_capacity(keys.len());
        for k in keys {
            let s = self.server_of(k) as usize;
            owner.push(s);
            parts[s].push(k);
        }
        let mut flags: Vec<Vec<bool>> = vec![Vec::new(); n];
        let servers: Vec<usize> = (0..n).filter(|&s| !parts[s].is_empty()).collect();
        self.m.post_then_collect(
            servers.into_iter(),
            true,
            |c, s| c.post_key_ops(op, &parts[s]).map(|()| s),
            // `collect` waits by the client's own timeout, which is the
            // cluster's.
            |c, s, _deadline| c.collect_key_ops(&mut flags[s]),
        )?;
        let mut next = vec![0usize; n];
        owner
            .into_iter()
            .map(|s| {
                let flag = flags[s].get(next[s]).copied();
                next[s] += 1;
                flag.ok_or_else(|| ClientError::Protocol("a key got no reply".into()))
            })
            .collect()
    }
}
