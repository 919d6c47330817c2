//! `fabrickv.Cluster`, `fabrickv.ClusterTable` and `fabrickv.ClusterCache`:
//! clients of a whole cluster for Python; `fabrickv.barrier` and
//! `fabrickv.lookup`, the registry's rendezvous and map.
//!
//! Thin wrappers over the Rust cluster clients
//! ([`ClusterClient`], [`ClusterPs`], [`RustClusterCache`]), which split
//! each batch by owning server, send every part before awaiting any, and
//! merge the results in request order. All three are connected the same
//! way, through their common trait [`ClusterOf`] ([`connect_to`]). The wrappers follow the
//! single-server ones (`kv.rs`, `ps.rs`, `cache.rs`) and share their
//! helpers: a mutex around each Rust client, every network call and every
//! wait for a mutex with the GIL released, keys and vectors read in place
//! from numpy arrays, pulls landing straight in a numpy array's memory.
//!
//! A call touching a server that is down fails with `fabrickv.Error`
//! (code `UNAVAILABLE` or `TIMEOUT`, within the timeout) whose message
//! names the server (`server 2 (tcp://...)`); calls whose keys all live
//! on other servers go on working, and a restarted server is picked up by
//! the next call that needs it.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use fabrickv_client::cluster::{
    lookup as registry_lookup, lookup_etcd, ClusterCache as RustClusterCache, ClusterClient,
    ClusterOf, ClusterOptions, ClusterPlaced, ClusterPs, ClusterTable as RustClusterTable,
    KvMemberOptions, PerServer,
};
use fabrickv_client::{ClientError, Cluster as ClusterMap, Kv};
use fabrickv_cluster::etcd::is_etcd_url;
use fabrickv_cluster::Registry;
use fabrickv_types::ErrorCode;
use fabrickv_wire::ps::TableSpec;
use numpy::{PyArray2, PyArrayMethods};
use pyo3::exceptions::{PyOverflowError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict};

use crate::cache::{buffer_bytes_of, key_of, CacheOps};
use crate::kv::key_slices;
use crate::lazy::Lazy;
use crate::ps;
use crate::{error, to_py_err};

/// Adds the cluster classes and the registry functions to the module.
pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Cluster>()?;
    m.add_class::<ClusterTable>()?;
    m.add_class::<ClusterCache>()?;
    m.add_function(wrap_pyfunction!(barrier, m)?)?;
    m.add_function(wrap_pyfunction!(lookup, m)?)
}

/// A registry error as `fabrickv.Error` (code `TIMEOUT` for a wait that
/// ran out, `UNAVAILABLE` when memcached cannot be reached).
fn registry_err(e: fabrickv_cluster::RegistryError) -> PyErr {
    to_py_err(ClientError::Registry(e))
}

/// Where a constructor's cluster came from: the map, its options, and
/// the registry it was read from (if so), for the clients to follow.
type MapOf = (ClusterMap, ClusterOptions, Option<Registry>);

/// The cluster map and options named by a constructor's arguments:
/// exactly one of `addrs`, `config` and `registry` (the last looked up
/// with the GIL released, waiting up to `timeout` for every server, and
/// returned so the clients re-read a down server's descriptor there).
fn map_of(
    py: Python<'_>,
    addrs: Option<Vec<String>>,
    config: Option<PathBuf>,
    registry: Option<&str>,
    name: &str,
    transport: Option<String>,
    timeout: f64,
) -> PyResult<MapOf> {
    let timeout = crate::timeout_of(timeout)?;
    let invalid = |e: fabrickv_cluster::ClusterError| error(ErrorCode::Malformed, e.to_string());
    let (map, reg) = match (addrs, config, registry) {
        (Some(addrs), None, None) => (ClusterMap::of_addrs(name, &addrs).map_err(invalid)?, None),
        (None, Some(path), None) => (ClusterMap::from_file(&path).map_err(invalid)?, None),
        (None, None, Some(url)) if is_etcd_url(url) => {
            // The constructors of clusters in etcd take their own path.
            return Err(error(
                ErrorCode::Malformed,
                format!("{url}: a cluster registered in etcd is joined by its slot map"),
            ));
        }
        (None, None, Some(url)) => {
            let (map, reg) = py
                .detach(|| registry_lookup(url, name, timeout))
                .map_err(to_py_err)?;
            (map, Some(reg))
        }
        _ => {
            return Err(PyValueError::new_err(
                "give exactly one of addrs (a list of server addresses), config (a cluster \
                 file) and registry (memcached://HOST:PORT)",
            ))
        }
    };
    let opts = ClusterOptions {
        transport,
        timeout,
        ..Default::default()
    };
    Ok((map, opts, reg))
}

/// Connects a cluster client of any kind to `map`, each server's client
/// with `options`, following `reg` when the map came from a registry.
fn connect_to<C: ClusterOf>(
    map: &ClusterMap,
    opts: &ClusterOptions,
    reg: Option<Registry>,
    options: <C::Server as PerServer>::Options,
) -> fabrickv_client::Result<C> {
    Ok(C::connect_cluster(map, opts, options)?.following(reg.map(Into::into)))
}

/// A server id from Python, checked against the cluster's size.
fn server_id(id: i64, size: u32) -> PyResult<u32> {
    u32::try_from(id)
        .ok()
        .filter(|&i| i < size)
        .ok_or_else(|| PyValueError::new_err(format!("server {id} of a {size}-server cluster")))
}

/// A client of a whole FabricKV cluster: keys and values spread over the
/// servers by jump consistent hash, and embedding tables
/// (`fabrickv.ClusterTable`) whose rows are spread the same way.
///
/// `Cluster(addrs=None, *, config=None, registry=None, name="default",
/// transport=None, timeout=5.0, read_from_replica=False)`: give exactly
/// one of `addrs` (server `i` at `addrs[i]`), `config` (a static cluster
/// file, TOML; its own name wins) or `registry` (`memcached://HOST:PORT`,
/// where the servers of the cluster `name` registered; waits up to
/// `timeout` for all of them; or `etcd://HOST:PORT`, routing by the
/// cluster's slot map). `transport` (`"tcp"`, `"shm"`) picks each
/// server's address of that kind; `timeout` (seconds) bounds connecting
/// and each call. `read_from_replica`, in a cluster keeping several
/// copies of each slot, lets `get`s go to any in-sync copy: reads that
/// accept staleness spread over the replicas.
///
/// A batch is split by server, every part sent before any is awaited, and
/// the results merged in request order. A call needing a down server
/// raises `fabrickv.Error` naming it; the others go on working.
#[pyclass(module = "fabrickv", name = "Cluster", frozen)]
pub(crate) struct Cluster {
    /// The map connected to: name and servers, for `size` and `repr`.
    map: ClusterMap,
    /// The options, as given.
    opts: ClusterOptions,
    /// The Rust kv client; `None` once closed.
    inner: Mutex<Option<ClusterClient>>,
    /// Set by `close()`, read without the lock.
    closed: AtomicBool,
    /// The embedding-table client, connected on the first table call and
    /// shared with the tables.
    ps: Arc<Lazy<ClusterPs>>,
}

impl Cluster {
    /// A kv client of the cluster `name` registered in etcd at `url`,
    /// routing by its slot map (GIL released while it connects).
    fn join_etcd(
        py: Python<'_>,
        url: &str,
        name: &str,
        transport: Option<String>,
        timeout: f64,
        read_from_replica: bool,
    ) -> PyResult<Cluster> {
        let opts = ClusterOptions {
            transport,
            timeout: crate::timeout_of(timeout)?,
            read_from_replica,
        };
        let (map, client, slots, reg) = py
            .detach(|| {
                let (map, slots, reg) = lookup_etcd(url, name, opts.timeout)?;
                let c = ClusterClient::connect(&map, opts.clone())?
                    .follow_slots(reg.clone(), slots.clone());
                Ok::<_, ClientError>((map, c, slots, reg))
            })
            .map_err(to_py_err)?;
        // The tables' client routes by the same map, and follows it itself.
        let (ps_map, ps_opts) = (map.clone(), opts.clone());
        Ok(Cluster::of(
            map,
            opts,
            client,
            Box::new(move || {
                Ok(ClusterPs::connect(&ps_map, ps_opts.clone())?
                    .follow_slots(reg.clone(), slots.clone()))
            }),
        ))
    }

    /// A cluster of `map`, its kv client connected, its tables' client
    /// connected by `ps` on the first table call.
    fn of(
        map: ClusterMap,
        opts: ClusterOptions,
        client: ClusterClient,
        ps: Box<dyn Fn() -> fabrickv_client::Result<ClusterPs> + Send + Sync>,
    ) -> Cluster {
        Cluster {
            map,
            opts,
            inner: Mutex::new(Some(client)),
            closed: AtomicBool::new(false),
            ps: Arc::new(Lazy::new(ps)),
        }
    }

    /// Runs `f` on the Rust client with the GIL released.
    fn call<T, F>(&self, py: Python<'_>, f: F) -> PyResult<T>
    where
        T: Send,
        F: FnOnce(&mut ClusterClient) -> fabrickv_client::Result<T> + Send,
    {
        crate::call_locked(py, &self.inner, f)
    }

    /// `create_table`'s work once its arguments are checked.
    fn create_table_of(&self, py: Python<'_>, spec: &TableSpec) -> PyResult<ClusterTable> {
        let t = self.ps.call(py, |c| c.create_table(spec))?;
        Ok(self.table_of(t))
    }

    fn table_of(&self, t: RustClusterTable) -> ClusterTable {
        ClusterTable {
            conn: Arc::clone(&self.ps),
            table: t,
        }
    }
}

kv_calls!(
    Cluster,
    "each server's keys travel to it at once, all servers in parallel.",
    "On an error the values of other servers (and around a refused one) may be stored."
);
closable_client!(
    Cluster,
    "Closes every connection (the tables' too); later calls raise \
     `fabrickv.Error` (`UNAVAILABLE`). Closing twice is harmless.",
    also = ps
);
create_table!(
    Cluster,
    ClusterTable,
    "Creates an embedding table on every server (or opens it where one \
     of that name exists with the same shape); arguments as \
     `Client.create_table`. A server down now gets it when first needed."
);

#[pymethods]
impl Cluster {
    /// Resolves the map and connects to every server (GIL released).
    #[new]
    #[pyo3(signature = (addrs = None, *, config = None, registry = None, name = "default", transport = None, timeout = 5.0, read_from_replica = false))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        addrs: Option<Vec<String>>,
        config: Option<PathBuf>,
        registry: Option<&str>,
        name: &str,
        transport: Option<String>,
        timeout: f64,
        read_from_replica: bool,
    ) -> PyResult<Self> {
        if let Some(url) = registry.filter(|u| is_etcd_url(u)) {
            return Cluster::join_etcd(py, url, name, transport, timeout, read_from_replica);
        }
        let (map, mut opts, reg) = map_of(py, addrs, config, registry, name, transport, timeout)?;
        // Only a slot map names replicas: without one every read goes to
        // the key's one server whatever this says.
        opts.read_from_replica = read_from_replica;
        let kv_reg = reg.clone();
        let client = py
            .detach(|| {
                let member = KvMemberOptions::new(read_from_replica);
                connect_to::<ClusterClient>(&map, &opts, kv_reg, member)
            })
            .map_err(to_py_err)?;
        let (ps_map, ps_opts) = (map.clone(), opts.clone());
        Ok(Cluster::of(
            map,
            opts,
            client,
            Box::new(move || connect_to::<ClusterPs>(&ps_map, &ps_opts, reg.clone(), ())),
        ))
    }

    /// Removes many keys; for each, in order, whether it was there.
    fn mdelete(&self, py: Python<'_>, keys: Vec<Bound<'_, PyBytes>>) -> PyResult<Vec<bool>> {
        let slices = key_slices(&keys);
        self.call(py, |c| c.mdelete(&slices))
    }

    /// Each server's counters (summed over its workers), in server order;
    /// None for a server that cannot be reached now.
    fn stats(&self, py: Python<'_>) -> PyResult<Vec<Option<BTreeMap<String, u64>>>> {
        let all = self.call(py, |c| Ok(c.stats()))?;
        Ok(all.into_iter().map(Result::ok).collect())
    }

    /// The server that owns `key`: bytes for the key-value calls, an
    /// integer (0..2**64) for the embedding tables.
    fn server_of(&self, key: &Bound<'_, PyAny>) -> PyResult<u32> {
        if let Ok(b) = key.cast::<PyBytes>() {
            let bytes = b.as_bytes();
            return self.call(key.py(), |c| Ok(c.server_of(bytes)));
        }
        match key.extract::<u64>() {
            Ok(k) => self.call(key.py(), |c| Ok(c.server_of_u64(k))),
            Err(e) if e.is_instance_of::<PyOverflowError>(key.py()) => Err(PyValueError::new_err(
                format!("key {key} is outside 0..2**64"),
            )),
            Err(_) => Err(PyTypeError::new_err(
                "a key is bytes (key-value) or an integer (tables)",
            )),
        }
    }

    /// Whether server `id` is connected now (a down one is tried again by
    /// the next call that needs it).
    fn is_up(&self, py: Python<'_>, id: i64) -> PyResult<bool> {
        let id = server_id(id, self.map.size())?;
        self.call(py, |c| Ok(c.server_up(id)))
    }

    /// The address used for server `id`, or None if it has none.
    fn addr(&self, py: Python<'_>, id: i64) -> PyResult<Option<String>> {
        let id = server_id(id, self.map.size())?;
        self.call(py, |c| Ok(c.server_addr(id).map(str::to_string)))
    }

    /// Opens the existing table `name` (its shape read from the first
    /// server that answers); `fabrickv.Error` with code `NO_SUCH_TABLE` if
    /// there is none.
    fn table(&self, py: Python<'_>, name: &str) -> PyResult<ClusterTable> {
        let t = self.ps.call(py, |c| c.open_table(name))?;
        Ok(self.table_of(t))
    }

    /// Every table any server holds, as a dict: name, dim, optimizer, lr,
    /// missing, seed, items (over the servers that answered) and
    /// items_per_server (None where down or without the table).
    fn tables<'py>(&self, py: Python<'py>) -> PyResult<Vec<Bound<'py, PyDict>>> {
        let tables = self.ps.call(py, |c| c.tables())?;
        tables
            .iter()
            .map(|t| {
                let d = ps::spec_dict(py, &t.spec)?;
                d.set_item("items", t.items)?;
                d.set_item("items_per_server", &t.items_per_server)?;
                Ok(d)
            })
            .collect()
    }

    /// The number of servers, up or down.
    #[getter]
    fn size(&self) -> u32 {
        self.map.size()
    }

    /// The cluster's name.
    #[getter]
    fn name(&self) -> &str {
        &self.map.name
    }

    /// The per-call timeout in seconds.
    #[getter]
    fn timeout(&self) -> f64 {
        self.opts.timeout.as_secs_f64()
    }

    fn __len__(&self) -> usize {
        self.map.servers.len()
    }

    fn __repr__(&self) -> String {
        format!(
            "<fabrickv.Cluster name={:?} servers={} timeout={}s{}>",
            self.map.name,
            self.map.size(),
            self.opts.timeout.as_secs_f64(),
            self.closed_mark()
        )
    }
}

/// An embedding table across a cluster: each row lives on the server that
/// owns its key. Made by `Cluster.create_table(...)` or
/// `Cluster.table(name)`; shares its cluster's table connections.
#[pyclass(module = "fabrickv", name = "ClusterTable", frozen)]
pub(crate) struct ClusterTable {
    /// The owning cluster's table client.
    conn: Arc<Lazy<ClusterPs>>,
    /// The table's handle in that client.
    table: RustClusterTable,
}

impl ClusterTable {
    fn dim_usize(&self) -> usize {
        self.table.dim() as usize
    }
}

#[pymethods]
impl ClusterTable {
    /// The vectors of `keys`, shape `(len(keys), dim)`, float32, in request
    /// order, each server's rows landing straight at their keys' places.
    /// With `out` (writable float32 memory of shape `(len(keys), dim)` or
    /// flat: numpy array, memoryview, DLPack tensor; or raw bytes of that
    /// size), they land in `out`, which is returned.
    /// Absent keys get the table's missing-key policy. With
    /// `return_found=True`, `(values, found)`.
    #[pyo3(signature = (keys, out = None, return_found = false))]
    fn pull<'py>(
        &self,
        py: Python<'py>,
        keys: &Bound<'py, PyAny>,
        out: Option<&Bound<'py, PyAny>>,
        return_found: bool,
    ) -> PyResult<Bound<'py, PyAny>> {
        let keys = ps::keys_of(keys)?;
        let keys = ps::slice_of(&keys)?;
        let n = keys.len();
        let dim = self.dim_usize();
        let mut found = return_found.then(|| vec![false; n]);
        let t = &self.table;
        let values = match out {
            Some(out) => {
                let mut mem = ps::out_mem(out, n, dim)?;
                let dst = mem.floats_mut("out")?;
                let f = found.as_deref_mut();
                self.conn.call(py, |c| c.pull_into(t, keys, dst, f))?;
                out.clone()
            }
            None => {
                let values = PyArray2::<f32>::zeros(py, [n, dim], false);
                {
                    let mut w = values.try_readwrite()?;
                    let dst = w
                        .as_slice_mut()
                        .map_err(|e| PyValueError::new_err(format!("pull: {e}")))?;
                    let f = found.as_deref_mut();
                    self.conn.call(py, |c| c.pull_into(t, keys, dst, f))?;
                }
                values.into_any()
            }
        };
        ps::with_found(py, values, found)
    }

    /// The table's shape as a dict: name, dim, optimizer, lr, missing,
    /// seed.
    #[getter]
    fn spec<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        ps::spec_dict(py, self.table.spec())
    }

    /// The table's name.
    #[getter]
    fn name(&self) -> &str {
        self.table.name()
    }

    /// Floats per vector.
    #[getter]
    fn dim(&self) -> u32 {
        self.table.dim()
    }

    /// Keys stored now, over the servers that answer.
    fn __len__(&self, py: Python<'_>) -> PyResult<usize> {
        let tables = self.conn.call(py, |c| c.tables())?;
        let items = tables
            .iter()
            .find(|t| t.spec.name == self.table.name())
            .map_or(0, |t| t.items);
        usize::try_from(items).map_err(|e| PyOverflowError::new_err(e.to_string()))
    }

    fn __repr__(&self) -> String {
        ps::spec_repr("ClusterTable", self.table.spec(), None)
    }
}

table_writes!(ClusterTable, ClusterPs, table: RustClusterTable, " on their servers");

/// A KV-cache client of a whole cluster: each key goes to the server that
/// owns it, through a client with its own receive buffer of `buffer_mb`
/// MiB (so a cluster of `n` servers holds `n` buffers).
///
/// `ClusterCache(addrs=None, *, config=None, registry=None,
/// name="default", transport=None, buffer_mb=64, timeout=5.0)`: the
/// cluster as for `fabrickv.Cluster`; values, outputs and keys as for
/// `fabrickv.CacheClient`. In a cluster registered in etcd a key's owner
/// is its slot's primary; the cache keeps one copy, so a value cached on
/// a server that dies reads as absent afterwards (recompute it).
#[pyclass(module = "fabrickv", name = "ClusterCache", frozen)]
pub(crate) struct ClusterCache {
    /// The map connected to.
    map: ClusterMap,
    /// Bytes of each server's receive buffer.
    buffer_bytes: usize,
    /// The Rust client; `None` once closed. A read's value sits in a
    /// receive buffer until copied out, under the lock.
    inner: Mutex<Option<RustClusterCache>>,
    /// Set by `close()`, read without the lock.
    closed: AtomicBool,
}

/// Each value lands in the receive buffer of its server's client.
impl CacheOps for RustClusterCache {
    type Placed = ClusterPlaced;

    fn buffer_len_of(&mut self, key: &[u8]) -> fabrickv_client::Result<usize> {
        let s = self.server_of(key);
        self.server_client(s).map(|c| c.buffer_len())
    }

    fn server_of_key(&self, key: &[u8]) -> usize {
        self.server_of(key) as usize
    }

    fn place_many(
        &mut self,
        items: &[(&[u8], usize)],
    ) -> fabrickv_client::Result<Vec<fabrickv_client::Result<Option<ClusterPlaced>>>> {
        self.get_many_at(items)
    }

    fn landed(&mut self, p: &ClusterPlaced) -> fabrickv_client::Result<&[u8]> {
        let buf = self.buffer(p.server)?;
        Ok(&buf[p.placed.offset..p.placed.offset + p.placed.len])
    }

    fn put_value(
        &mut self,
        key: &[u8],
        value: &[u8],
        ttl: Option<Duration>,
    ) -> fabrickv_client::Result<u64> {
        self.put(key, value, ttl)
    }

    /// Split by server, each part pipelined
    /// ([`RustClusterCache::put_many`]).
    fn put_values(
        &mut self,
        items: &[(&[u8], &[u8])],
        ttl: Option<Duration>,
    ) -> fabrickv_client::Result<Vec<fabrickv_client::Result<u64>>> {
        self.put_many(items, ttl)
    }

    fn exists_keys(&mut self, keys: &[&[u8]]) -> fabrickv_client::Result<Vec<bool>> {
        self.exists_many(keys)
    }

    fn delete_keys(&mut self, keys: &[&[u8]]) -> fabrickv_client::Result<Vec<bool>> {
        self.delete_many(keys)
    }
}

closable_client!(
    ClusterCache,
    "Closes the connections and frees the receive buffers; later calls \
     raise `fabrickv.Error` (`UNAVAILABLE`). Closing twice is harmless."
);
cache_calls!(ClusterCache, " on its server");

#[pymethods]
impl ClusterCache {
    /// Resolves the map and connects to every server (GIL released).
    #[new]
    #[pyo3(signature = (addrs = None, *, config = None, registry = None, name = "default", transport = None, buffer_mb = 64, timeout = 5.0))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        addrs: Option<Vec<String>>,
        config: Option<PathBuf>,
        registry: Option<&str>,
        name: &str,
        transport: Option<String>,
        buffer_mb: i64,
        timeout: f64,
    ) -> PyResult<Self> {
        let buffer_bytes = buffer_bytes_of(buffer_mb)?;
        if let Some(url) = registry.filter(|u| is_etcd_url(u)) {
            // Routed by the cluster's slot map, followed by its watch.
            let opts = ClusterOptions {
                transport,
                timeout: crate::timeout_of(timeout)?,
                ..Default::default()
            };
            let (map, client) = py
                .detach(|| {
                    let (map, slots, reg) = lookup_etcd(url, name, opts.timeout)?;
                    let c = RustClusterCache::connect(&map, opts.clone(), buffer_bytes)?
                        .follow_slots(reg, slots);
                    Ok::<_, ClientError>((map, c))
                })
                .map_err(to_py_err)?;
            return Ok(ClusterCache {
                map,
                buffer_bytes,
                inner: Mutex::new(Some(client)),
                closed: AtomicBool::new(false),
            });
        }
        let (map, opts, reg) = map_of(py, addrs, config, registry, name, transport, timeout)?;
        let client = py
            .detach(|| connect_to::<RustClusterCache>(&map, &opts, reg, buffer_bytes))
            .map_err(to_py_err)?;
        Ok(ClusterCache {
            map,
            buffer_bytes,
            inner: Mutex::new(Some(client)),
            closed: AtomicBool::new(false),
        })
    }

    /// The server that owns `key` (its slot's primary in a cluster
    /// registered in etcd).
    fn server_of(&self, key: &Bound<'_, PyAny>) -> PyResult<u32> {
        let k = key_of(key)?;
        crate::call_locked(key.py(), &self.inner, |c| Ok(c.server_of(k)))
    }

    /// The number of servers, up or down.
    #[getter]
    fn size(&self) -> u32 {
        self.map.size()
    }

    /// Bytes of each server's receive buffer: the largest value read.
    #[getter]
    fn buffer_size(&self) -> usize {
        self.buffer_bytes
    }

    fn __repr__(&self) -> String {
        format!(
            "<fabrickv.ClusterCache name={:?} servers={} buffer_size={}{}>",
            self.map.name,
            self.map.size(),
            self.buffer_bytes,
            self.closed_mark()
        )
    }
}

/// Waits (GIL released) until `count` processes, this one included, have
/// reached the barrier `name` of cluster `cluster` in the registry
/// (`memcached://HOST:PORT`), or `timeout` seconds pass (`fabrickv.Error`,
/// code `TIMEOUT`). Returns this process's arrival order, from 1. A name
/// serves one rendezvous (until it expires, an hour later).
#[pyfunction]
#[pyo3(signature = (registry, name, count, *, cluster = "default", timeout = 60.0))]
fn barrier(
    py: Python<'_>,
    registry: &str,
    name: &str,
    count: u64,
    cluster: &str,
    timeout: f64,
) -> PyResult<u64> {
    let timeout = crate::timeout_of(timeout)?;
    py.detach(|| Registry::connect(registry, cluster)?.barrier(name, count, timeout))
        .map_err(registry_err)
}

/// The servers of cluster `cluster` registered at `registry`
/// (`memcached://HOST:PORT`), waiting up to `wait` seconds for all of
/// them: one entry per server id, a dict (id, addrs, workers, resp, grpc,
/// pid) or None for a server not registered. `fabrickv.Error` if no
/// server is.
#[pyfunction]
#[pyo3(signature = (registry, cluster = "default", wait = 0.0))]
fn lookup<'py>(
    py: Python<'py>,
    registry: &str,
    cluster: &str,
    wait: f64,
) -> PyResult<Vec<Option<Bound<'py, PyDict>>>> {
    let wait = if wait == 0.0 {
        Duration::ZERO
    } else {
        crate::timeout_of(wait)?
    };
    let map = py
        .detach(|| Registry::connect(registry, cluster)?.lookup(wait, true))
        .map_err(registry_err)?;
    map.servers
        .iter()
        .map(|slot| {
            slot.as_ref()
                .map(|d| {
                    let out = PyDict::new(py);
                    out.set_item("id", d.id)?;
                    out.set_item("addrs", &d.addrs)?;
                    out.set_item("workers", d.workers)?;
                    out.set_item("resp", &d.resp)?;
                    out.set_item("grpc", &d.grpc)?;
                    out.set_item("pid", d.pid)?;
                    Ok(out)
                })
                .transpose()
        })
        .collect()
}
