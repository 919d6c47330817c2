//! `fabrickv.Client`: the key-value client for Python.
//!
//! A thin wrapper over [`fabrickv_client::Client`]: keys and values are
//! `bytes`, borrowed (not copied) on the way in; every call that touches
//! the network runs with the GIL released. The Rust client takes `&mut`,
//! so it sits behind a mutex: one `Client` may be shared by threads, whose
//! calls then take turns (open one `Client` per thread to run them in
//! parallel).
//!
//! The embedding-table methods (`create_table`, `table`, `tables`) live
//! here because PyO3 allows one method block per class; each hands off to
//! [`crate::ps`], which owns the table client.

use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use fabrickv_client::{Client as RustClient, Kv};
use fabrickv_wire::control::ServerInfo;
use fabrickv_wire::ps::TableSpec;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict};

use crate::ps::{self, PsConn, Table};

/// Adds `Client` to the module.
pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Client>()
}

/// A connection to a FabricKV server: one connection per server worker,
/// each key sent to the worker that owns it.
///
/// `Client(addr, timeout=5.0)`: `addr` is `HOST:PORT`, `tcp://HOST:PORT`
/// or `shm://NAME`; `timeout` (seconds) bounds connecting and each call.
/// `create_table`/`table` give embedding tables (`fabrickv.Table`), served
/// over one more connection made on the first table call.
#[pyclass(module = "fabrickv", name = "Client", frozen)]
pub(crate) struct Client {
    /// The address as given, for `addr` and `repr`.
    addr: String,
    /// The per-call timeout, as given.
    timeout: Duration,
    /// The server's shape and limits, learnt when connecting; kept so that
    /// `info()` needs neither the lock nor the network.
    info: ServerInfo,
    /// The Rust client; `None` once closed. A mutex because Python may call
    /// from several threads while the Rust client needs `&mut`.
    inner: Mutex<Option<RustClient>>,
    /// Set by `close()`, read by `closed` and `repr` without the lock, so
    /// that they never wait for a call in flight on another thread.
    closed: AtomicBool,
    /// The embedding-table client, connected on the first table call and
    /// shared with the `Table`s and pull handles this client hands out.
    ps: Arc<PsConn>,
}

impl Client {
    /// `create_table`'s work once its arguments are checked.
    fn create_table_of(&self, py: Python<'_>, spec: &TableSpec) -> PyResult<Table> {
        ps::create_table(py, &self.ps, spec)
    }

    /// Runs `f` on the Rust client with the GIL released.
    fn call<T, F>(&self, py: Python<'_>, f: F) -> PyResult<T>
    where
        T: Send,
        F: FnOnce(&mut RustClient) -> fabrickv_client::Result<T> + Send,
    {
        crate::call_locked(py, &self.inner, f)
    }
}

fn checkpoint_dict<'py>(
    py: Python<'py>,
    st: &fabrickv_client::CheckpointStatus,
) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("dir", &st.dir)?;
    d.set_item("generation", st.generation)?;
    d.set_item("last_save", st.last_ok_unix_s)?;
    d.set_item("saving", st.saving)?;
    d.set_item("finished", st.finished)?;
    d.set_item("error", st.error.as_deref())?;
    Ok(d)
}

/// The values of an `mget` as Python sees them: bytes, None when absent,
/// each made straight from the buffer the client decoded them into (no
/// `Vec` per value on the way).
pub(crate) fn buf_to_py<'py>(
    py: Python<'py>,
    buf: &fabrickv_client::MgetBuf,
) -> Vec<Option<Bound<'py, PyBytes>>> {
    buf.iter().map(|v| v.map(|v| PyBytes::new(py, v))).collect()
}

/// The pairs of an `mput`: `[(key, value), ...]`, `{key: value}`, or
/// `keys, values`.
pub(crate) fn pairs_of<'py>(
    items: &Bound<'py, PyAny>,
    values: Option<Vec<Bound<'py, PyBytes>>>,
) -> PyResult<Vec<(Bound<'py, PyBytes>, Bound<'py, PyBytes>)>> {
    match values {
        Some(values) => {
            let keys: Vec<Bound<'py, PyBytes>> = items.extract()?;
            if keys.len() != values.len() {
                return Err(PyValueError::new_err(format!(
                    "mput: {} keys but {} values",
                    keys.len(),
                    values.len()
                )));
            }
            Ok(keys.into_iter().zip(values).collect())
        }
        None => match items.cast::<PyDict>() {
            Ok(d) => d
                .iter()
                .map(|(k, v)| Ok((k.extract()?, v.extract()?)))
                .collect(),
            Err(_) => items.extract(),
        },
    }
}

/// Borrowed slices of `pairs`, as the Rust clients take them.
pub(crate) fn pair_slices<'a>(
    pairs: &'a [(Bound<'_, PyBytes>, Bound<'_, PyBytes>)],
) -> Vec<(&'a [u8], &'a [u8])> {
    pairs
        .iter()
        .map(|(k, v)| (k.as_bytes(), v.as_bytes()))
        .collect()
}

/// Borrowed slices of `keys`.
pub(crate) fn key_slices<'a>(keys: &'a [Bound<'_, PyBytes>]) -> Vec<&'a [u8]> {
    keys.iter().map(|k| k.as_bytes()).collect()
}

kv_calls!(
    Client,
    "the keys travel pipelined to every worker at once.",
    "On an error the values before and after the refused one may have been stored."
);
closable_client!(
    Client,
    "Closes the connections (the embedding tables' too); later calls \
     raise `fabrickv.Error` (`UNAVAILABLE`). Closing twice is harmless.",
    also = ps
);
create_table!(
    Client,
    Table,
    "Creates an embedding table of `dim` float32 per key (or opens the \
     table of that name if it exists with the same shape). `optimizer` \
     is \"sgd\" or \"adagrad\", `lr` its learning rate, `missing` what pulls \
     of absent keys return (\"zeros\" or \"init\", the deterministic \
     initializer seeded by `seed`)."
);
addr_and_timeout!(Client);

#[pymethods]
impl Client {
    /// Connects (with the GIL released) and learns the server's shape.
    #[new]
    #[pyo3(signature = (addr, timeout = 5.0))]
    fn new(py: Python<'_>, addr: &str, timeout: f64) -> PyResult<Self> {
        let timeout = crate::timeout_of(timeout)?;
        let client = py
            .detach(|| RustClient::connect_with_timeout(addr, timeout))
            .map_err(crate::to_py_err)?;
        Ok(Client {
            addr: addr.to_string(),
            timeout,
            info: client.info(),
            inner: Mutex::new(Some(client)),
            closed: AtomicBool::new(false),
            ps: PsConn::new(addr, timeout),
        })
    }

    /// The server's counters summed over its workers (hits, misses,
    /// items, bytes, ...), name to count.
    fn stats(&self, py: Python<'_>) -> PyResult<std::collections::BTreeMap<String, u64>> {
        self.call(py, |c| c.stats())
    }

    /// The server's shape and limits, as learnt when connecting: workers,
    /// partitions, mode, key_bytes_max, value_bytes_max, batch_ops_max,
    /// and this client's timeout (seconds).
    fn info<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let i = &self.info;
        let d = PyDict::new(py);
        d.set_item("workers", i.workers)?;
        d.set_item("partitions", i.partitions)?;
        d.set_item("mode", if i.store_mode { "store" } else { "cache" })?;
        d.set_item("key_bytes_max", i.key_bytes_max)?;
        d.set_item("value_bytes_max", i.value_bytes_max)?;
        d.set_item("batch_ops_max", i.batch_ops_max)?;
        d.set_item("timeout", self.timeout.as_secs_f64())?;
        Ok(d)
    }

    /// Has the server save a checkpoint of its memory (keys, embedding
    /// tables, its KV cache if started with --checkpoint-cache) while it
    /// serves, into `to` under its --checkpoint-dir (None: the directory
    /// itself), and waits up to `wait` seconds for it. Returns the status
    /// after the save (see `checkpoint_status`); `fabrickv.Error` with
    /// code CHECKPOINT_REFUSED (no directory, or `to` outside it),
    /// SAVE_IN_PROGRESS, STORAGE_FAILED or TIMEOUT.
    #[pyo3(signature = (to = None, wait = 3600.0))]
    fn checkpoint_save<'py>(
        &self,
        py: Python<'py>,
        to: Option<&str>,
        wait: f64,
    ) -> PyResult<Bound<'py, PyDict>> {
        let wait = crate::timeout_of(wait)?;
        let st = self.call(py, |c| c.checkpoint_save(to, wait))?;
        checkpoint_dict(py, &st)
    }

    /// The server's checkpoint status as a dict: dir and generation of
    /// the last good save, last_save (Unix seconds, 0: none), saving,
    /// finished (saves finished since start) and error (the last
    /// failure's message, or None).
    fn checkpoint_status<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let st = self.call(py, |c| c.checkpoint_status())?;
        checkpoint_dict(py, &st)
    }

    /// Opens the existing table `name`; `fabrickv.Error` with code
    /// `NO_SUCH_TABLE` if there is none.
    fn table(&self, py: Python<'_>, name: &str) -> PyResult<Table> {
        ps::open_table(py, &self.ps, name)
    }

    /// Every embedding table as a dict: name, id, dim, optimizer, lr,
    /// missing, seed and items (keys stored now).
    fn tables<'py>(&self, py: Python<'py>) -> PyResult<Vec<Bound<'py, PyDict>>> {
        ps::list_tables(py, &self.ps)
    }

    fn __repr__(&self) -> String {
        format!(
            "<fabrickv.Client addr={:?} workers={} timeout={}s{}>",
            self.addr,
            self.info.workers,
            self.timeout.as_secs_f64(),
            self.closed_mark()
        )
    }
}
