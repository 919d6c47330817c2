//! `fabrickv.Table` and `fabrickv.PullHandle`: the embedding-table
//! (parameter server) client for Python, over numpy arrays.
//!
//! A thin wrapper over [`PsClient`]. Each Python `Client` owns one
//! [`PsConn`]: a `PsClient` made on first use (same address and timeout as
//! the key-value client) behind a mutex, shared through an `Arc` by every
//! `Table` and `PullHandle` that client hands out. One `PsClient` rather
//! than one per table, so that pulls of several tables pipeline on one
//! connection and a process holds one receive region, not many.
//!
//! Arrays cross without copies where they can: keys are read in place from
//! a contiguous `uint64` array (and vectors from a contiguous `float32`
//! one); pulled vectors are the `Vec<f32>` the transport landed them in
//! (tcp) or copied them into out of the registered region (shm), handed to
//! numpy as the array's own buffer. Anything else is converted by numpy
//! first. Every call that touches the network, and every wait for the
//! mutex, runs with the GIL released.
//!
//! While the GIL is released the call reads the caller's arrays, as numpy's
//! own functions do; another Python thread that writes to those arrays at
//! the same moment gets what numpy would give it: undefined contents.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use fabrickv_client::ps::{PsClient, PullId, Pulled};
use fabrickv_types::ErrorCode;
use fabrickv_wire::ps::{Missing, Optimizer, TableDesc, TableSpec};
use numpy::ndarray::Array2;
use numpy::{
    IntoPyArray, PyArray1, PyArrayDyn, PyArrayMethods, PyReadonlyArray1, PyReadonlyArrayDyn,
    PyUntypedArray, PyUntypedArrayMethods,
};
use pyo3::exceptions::{PyOverflowError, PyTypeError, PyValueError};
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyTuple};

use crate::buffers::{Elem, Kind, Mem};
use crate::error;
use crate::lazy::Lazy;

/// Adds `Table` and `PullHandle` to the module.
pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Table>()?;
    m.add_class::<PullHandle>()
}

/// One Python `Client`'s embedding connection, shared by its tables and
/// pull handles.
pub(crate) struct PsConn {
    /// The client, made on first use with the `Client`'s address and
    /// timeout.
    lazy: Lazy<PsClient>,
    /// Pulls whose handles were dropped while another thread held the
    /// client: the next call cancels them. A drop never waits for the
    /// connection, as it may run inside Python's garbage collector with
    /// the GIL held.
    orphans: Mutex<Vec<PullId>>,
}

impl PsConn {
    /// A connection to `addr`, made when first used.
    pub(crate) fn new(addr: &str, timeout: Duration) -> Arc<PsConn> {
        let addr = addr.to_string();
        Arc::new(PsConn {
            lazy: Lazy::new(Box::new(move || {
                PsClient::connect_with_timeout(&addr, timeout)
            })),
            orphans: Mutex::new(Vec::new()),
        })
    }

    /// Runs `f` on the Rust client with the GIL released, connecting first
    /// if this is the first call.
    pub(crate) fn call<T, F>(&self, py: Python<'_>, f: F) -> PyResult<T>
    where
        T: Send,
        F: FnOnce(&mut PsClient) -> fabrickv_client::Result<T> + Send,
    {
        let before = |client: &mut PsClient| {
            let orphans =
                std::mem::take(&mut *self.orphans.lock().unwrap_or_else(PoisonError::into_inner));
            for id in orphans {
                // Already completed or failed is as good as cancelled.
                let _ = client.cancel(id);
            }
        };
        self.lazy.call_after(py, before, f)
    }

    /// Cancels pull `id` of a handle being dropped, without waiting: now if
    /// the connection is free, else at the next call.
    fn cancel_soon(&self, id: PullId) {
        let now = self.lazy.try_with(|client| {
            let _ = client.cancel(id);
        });
        if now.is_err() {
            self.orphans
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push(id);
        }
    }

    /// Drops the connection (waiting, GIL released, for a call in flight
    /// on another thread); later table calls raise `UNAVAILABLE`.
    pub(crate) fn close(&self, py: Python<'_>) {
        self.lazy.close(py);
    }
}

// `create_table`'s arguments, each checked on its own (the method is
// written once, in `create_table!`, which builds the `TableSpec` from
// these in this order: dim, optimizer, missing, lr).

/// A table's `dim` from Python: a positive integer that fits u32.
pub(crate) fn dim_of(dim: i64) -> PyResult<u32> {
    u32::try_from(dim)
        .map_err(|_| PyValueError::new_err(format!("dim must be a positive integer, not {dim}")))
}

/// A table's optimizer from its name.
pub(crate) fn optimizer_of(optimizer: &str) -> PyResult<Optimizer> {
    Optimizer::parse(optimizer).ok_or_else(|| {
        PyValueError::new_err(format!(
            "unknown optimizer {optimizer:?}: expected \"sgd\" or \"adagrad\""
        ))
    })
}

/// A table's missing-key policy from its name.
pub(crate) fn missing_of(missing: &str) -> PyResult<Missing> {
    Missing::parse(missing).ok_or_else(|| {
        PyValueError::new_err(format!(
            "unknown missing-key policy {missing:?}: expected \"zeros\" or \"init\""
        ))
    })
}

/// A table's learning rate: finite and not negative, as the server keeps
/// it (float32).
pub(crate) fn lr_of(lr: f64) -> PyResult<f32> {
    if !lr.is_finite() || lr < 0.0 {
        return Err(PyValueError::new_err(format!(
            "lr must be a finite number >= 0, not {lr}"
        )));
    }
    Ok(lr as f32)
}

/// `Client.create_table(...)`: creates a table, or opens it if one of that
/// name exists with the same shape.
pub(crate) fn create_table(
    py: Python<'_>,
    conn: &Arc<PsConn>,
    spec: &TableSpec,
) -> PyResult<Table> {
    let desc = conn.call(py, |c| c.create_table(spec))?;
    Ok(Table::new(conn, desc))
}

/// `Client.table(name)`: opens an existing table.
pub(crate) fn open_table(py: Python<'_>, conn: &Arc<PsConn>, name: &str) -> PyResult<Table> {
    let desc = conn.call(py, |c| c.open_table(name))?;
    Ok(Table::new(conn, desc))
}

/// `Client.tables()`: every table as a dict.
pub(crate) fn list_tables<'py>(
    py: Python<'py>,
    conn: &Arc<PsConn>,
) -> PyResult<Vec<Bound<'py, PyDict>>> {
    let tables = conn.call(py, |c| c.tables())?;
    tables.iter().map(|d| desc_dict(py, d)).collect()
}

/// A table's descriptor as `Client.tables()` lists it.
fn desc_dict<'py>(py: Python<'py>, d: &TableDesc) -> PyResult<Bound<'py, PyDict>> {
    let out = spec_dict(py, &d.spec)?;
    out.set_item("id", d.id)?;
    out.set_item("items", d.items)?;
    Ok(out)
}

/// A table's `repr`: the class, the shape and, for a single server's
/// table, its id there.
pub(crate) fn spec_repr(class: &str, s: &TableSpec, id: Option<u32>) -> String {
    let id = id.map_or(String::new(), |i| format!(" id={i}"));
    format!(
        "<fabrickv.{class} name={:?}{id} dim={} optimizer={} lr={} missing={} seed={}>",
        s.name,
        s.dim,
        s.optimizer.name(),
        s.lr,
        s.missing.name(),
        s.seed
    )
}

/// A table's shape as a dict: name, dim, optimizer, lr, missing, seed.
pub(crate) fn spec_dict<'py>(py: Python<'py>, s: &TableSpec) -> PyResult<Bound<'py, PyDict>> {
    let out = PyDict::new(py);
    out.set_item("name", &s.name)?;
    out.set_item("dim", s.dim)?;
    out.set_item("optimizer", s.optimizer.name())?;
    out.set_item("lr", f64::from(s.lr))?;
    out.set_item("missing", s.missing.name())?;
    out.set_item("seed", s.seed)?;
    Ok(out)
}

/// The `numpy` module.
pub(crate) fn numpy_module(py: Python<'_>) -> PyResult<Bound<'_, PyModule>> {
    py.import(intern!(py, "numpy"))
}

/// `a` borrowed read-only as it is, if its memory is one contiguous slice
/// and no other call is writing to it; `None` sends the caller to numpy's
/// conversion instead.
fn borrowed_as_is<'py, T: numpy::Element, D: numpy::ndarray::Dimension>(
    a: &Bound<'py, numpy::PyArray<T, D>>,
) -> Option<numpy::PyReadonlyArray<'py, T, D>> {
    let r = a.try_readonly().ok()?;
    r.as_slice().is_ok().then_some(r)
}

/// `numpy.asarray(obj)`, with the `numpy` module for the steps after it.
fn asarray<'py>(obj: &Bound<'py, PyAny>) -> PyResult<(Bound<'py, PyModule>, Bound<'py, PyAny>)> {
    let py = obj.py();
    let np = numpy_module(py)?;
    let arr = np.call_method1(intern!(py, "asarray"), (obj,))?;
    Ok((np, arr))
}

/// `arr` as a C-contiguous, aligned array of numpy type `dtype` (named
/// as numpy names it), converted by `numpy.require` if it is not one yet,
/// and borrowed read-only.
fn required<'py, T: numpy::Element, D: numpy::ndarray::Dimension>(
    np: &Bound<'py, PyModule>,
    arr: Bound<'py, PyAny>,
    dtype: &Bound<'py, pyo3::types::PyString>,
) -> PyResult<numpy::PyReadonlyArray<'py, T, D>> {
    let arr = np.call_method1(intern!(np.py(), "require"), (arr, np.getattr(dtype)?, "CA"))?;
    let a = arr.cast_into::<numpy::PyArray<T, D>>()?;
    Ok(a.try_readonly()?)
}

/// `(2, 3)` for a shape, as numpy prints it.
fn shape_text(shape: &[usize]) -> String {
    match shape {
        [one] => format!("({one},)"),
        _ => {
            let dims: Vec<String> = shape.iter().map(ToString::to_string).collect();
            format!("({})", dims.join(", "))
        }
    }
}

/// The keys of a call as a contiguous `uint64` array, borrowed as it is
/// when it already is one, otherwise converted by numpy. Refuses what is
/// not a 1-D sequence of integers (TypeError) and negative or too large
/// keys (ValueError).
pub(crate) fn keys_of<'py>(obj: &Bound<'py, PyAny>) -> PyResult<PyReadonlyArray1<'py, u64>> {
    if let Ok(a) = obj.cast::<PyArray1<u64>>() {
        if a.is_c_contiguous() {
            if let Some(r) = borrowed_as_is(a) {
                return Ok(r);
            }
        }
    }
    let py = obj.py();
    // A tensor with `__dlpack__` (torch, jax) is viewed by numpy in
    // place; `asarray` alone would not see one without `__array__`.
    let foreign = obj.cast::<PyUntypedArray>().is_err() && !obj.is_instance_of::<PyList>();
    let (np, arr) = if foreign && obj.hasattr(intern!(py, "__dlpack__"))? {
        let np = numpy_module(py)?;
        let arr = np.call_method1(intern!(py, "from_dlpack"), (obj,))?;
        (np, arr)
    } else {
        asarray(obj)?
    };
    let shape: Vec<usize> = arr.getattr(intern!(py, "shape"))?.extract()?;
    if shape.len() != 1 {
        return Err(PyValueError::new_err(format!(
            "keys must be a 1-D array of integers, got shape {}",
            shape_text(&shape)
        )));
    }
    let mut dtype = arr.getattr(intern!(py, "dtype"))?;
    let mut kind: String = dtype.getattr(intern!(py, "kind"))?.extract()?;
    // numpy turns a list mixing keys beyond 2**63 with smaller ones into
    // float64, losing bits: a list that is not integer as a whole is read
    // key by key instead (which refuses real floats).
    let is_ndarray = obj.is_instance(&np.getattr(intern!(py, "ndarray"))?)?;
    let arr = if kind == "f" && !is_ndarray {
        let arr = np.call_method1(intern!(py, "array"), (obj, intern!(py, "object")))?;
        dtype = arr.getattr(intern!(py, "dtype"))?;
        kind = "O".to_string();
        arr
    } else {
        arr
    };
    let arr = match kind.as_str() {
        // `np.asarray([])` is float64: an empty list is no keys, whatever
        // its type.
        _ if shape[0] == 0 => PyArray1::<u64>::zeros(py, 0, false).into_any(),
        "u" => arr,
        "i" => {
            let min: i64 = arr.call_method0(intern!(py, "min"))?.extract()?;
            if min < 0 {
                return Err(PyValueError::new_err(format!(
                    "keys must be non-negative, got {min}"
                )));
            }
            arr
        }
        // Python ints numpy could not fit one integer type (say -1 beside
        // 2**63): each one must fit u64 on its own.
        "O" => {
            let mut keys = Vec::with_capacity(shape[0]);
            for item in arr.try_iter()? {
                let item = item?;
                let key = item.extract::<u64>().map_err(|e| {
                    if e.is_instance_of::<PyOverflowError>(py) {
                        PyValueError::new_err(format!("key {item} is outside 0..2**64"))
                    } else {
                        let type_name = item
                            .get_type()
                            .name()
                            .map_or_else(|_| "?".to_string(), |n| n.to_string());
                        PyTypeError::new_err(format!(
                            "keys must be integers, got {type_name} {item}"
                        ))
                    }
                })?;
                keys.push(key);
            }
            PyArray1::from_vec(py, keys).into_any()
        }
        _ => {
            return Err(PyTypeError::new_err(format!(
                "keys must be integers, got dtype {dtype}"
            )))
        }
    };
    required(&np, arr, intern!(py, "uint64"))
}

/// Refuses (ValueError) a `shape` other than `(n, dim)` or `(n * dim,)`
/// for the vectors of `n` keys; `what` names them.
fn check_shape(what: &str, shape: &[usize], n: usize, dim: usize) -> PyResult<()> {
    let fits = matches!(shape, [rows, cols] if *rows == n && *cols == dim)
        || matches!(shape, [len] if *len == n * dim);
    if fits {
        Ok(())
    } else {
        Err(PyValueError::new_err(format!(
            "{what}: expected shape ({n}, {dim}) or ({},) for {n} keys of dim {dim}, got {}",
            n * dim,
            shape_text(shape)
        )))
    }
}

/// Where a pull of `n` keys of dimension `dim` lands when the caller
/// gives `out`: writable C-contiguous memory holding float32 (a numpy
/// array, a memoryview of one, a DLPack tensor such as torch's) of shape
/// `(n, dim)` or `(n * dim,)`, or raw bytes (bytearray, uint8 array) of
/// exactly `n * dim * 4` bytes. Anything else is refused (TypeError or
/// ValueError) before anything is asked of the server.
pub(crate) fn out_mem(out: &Bound<'_, PyAny>, n: usize, dim: usize) -> PyResult<Mem> {
    let m = Mem::output(out, "out")?;
    let elem = m.elem();
    if elem == Elem::F32 {
        check_shape("out", m.shape(), n, dim)?;
    } else if elem.is_byte() {
        let want = n * dim * 4;
        if m.len() != want {
            return Err(PyValueError::new_err(format!(
                "out: {n} keys of dim {dim} need {want} bytes of float32, got {} bytes",
                m.len()
            )));
        }
    } else {
        return Err(PyTypeError::new_err(format!(
            "out must hold float32 (or be raw bytes), got {}",
            elem.name()
        )));
    }
    Ok(m)
}

/// A pull's result as Python sees it: `values` alone, or `(values,
/// found)` with the bool array of which keys the table held.
pub(crate) fn with_found<'py>(
    py: Python<'py>,
    values: Bound<'py, PyAny>,
    found: Option<Vec<bool>>,
) -> PyResult<Bound<'py, PyAny>> {
    match found {
        None => Ok(values),
        Some(found) => {
            let found = PyArray1::from_vec(py, found).into_any();
            Ok(PyTuple::new(py, [values, found])?.into_any())
        }
    }
}

/// Reads the keys of a put or push and `len(keys) x dim` floats (`what`
/// names them in errors) and hands both to `send`.
pub(crate) fn with_vectors<T>(
    keys: &Bound<'_, PyAny>,
    values: &Bound<'_, PyAny>,
    what: &str,
    dim: usize,
    send: impl FnOnce(&[u64], &[f32]) -> PyResult<T>,
) -> PyResult<T> {
    let keys = keys_of(keys)?;
    let keys = slice_of(&keys)?;
    let values = floats_of(values, what, keys.len(), dim)?;
    send(keys, values.as_slice(what)?)
}

/// The float32s of a put or push, seen in place.
enum Floats<'py> {
    /// A numpy array (converted by numpy if it had to be).
    Array(PyReadonlyArrayDyn<'py, f32>),
    /// Float32 memory of a buffer or a DLPack tensor.
    Mem(Mem),
}

impl Floats<'_> {
    fn as_slice(&self, what: &str) -> PyResult<&[f32]> {
        match self {
            Floats::Array(a) => slice_of(a),
            Floats::Mem(m) => m.floats(what),
        }
    }
}

/// The vectors (or gradients) of a call for `n` keys of dimension `dim`:
/// a C-contiguous `float32` array of shape `(n, dim)` or `(n * dim,)`,
/// borrowed as it is when it already is one, otherwise converted by numpy
/// (float64 and integer arrays are, other types raise TypeError). A wrong
/// shape raises ValueError naming the expected and the given one.
fn floats_of<'py>(
    obj: &Bound<'py, PyAny>,
    what: &str,
    n: usize,
    dim: usize,
) -> PyResult<Floats<'py>> {
    let check = |shape: &[usize]| check_shape(what, shape, n, dim);
    if let Ok(a) = obj.cast::<PyArrayDyn<f32>>() {
        if a.is_c_contiguous() {
            check(a.shape())?;
            if let Some(r) = borrowed_as_is(a) {
                return Ok(Floats::Array(r));
            }
        }
    }
    let py = obj.py();
    // A float32 tensor or buffer (torch, a memoryview) is read in place;
    // bfloat16 has no numpy type to convert it to. Other types (float64,
    // integers, lists) are converted by numpy below.
    if obj.cast::<PyUntypedArray>().is_err() && !obj.is_instance_of::<PyList>() {
        if let Ok(m) = Mem::input(obj, what) {
            match m.elem() {
                Elem::F32 => {
                    check(m.shape())?;
                    return Ok(Floats::Mem(m));
                }
                e if e.kind == Kind::Bfloat || e.kind == Kind::Float && e.bytes == 2 => {
                    return Err(PyTypeError::new_err(format!(
                        "{what} must be float32, got {}: convert it first (torch: t.float())",
                        e.name()
                    )));
                }
                _ => {}
            }
        }
    }
    let (np, arr) = asarray(obj)?;
    let dtype = arr.getattr(intern!(py, "dtype"))?;
    let kind: String = dtype.getattr(intern!(py, "kind"))?.extract()?;
    if !matches!(kind.as_str(), "f" | "i" | "u") {
        return Err(PyTypeError::new_err(format!(
            "{what} must be float32 (or float64, converted), got dtype {dtype}"
        )));
    }
    let shape: Vec<usize> = arr.getattr(intern!(py, "shape"))?.extract()?;
    check(&shape)?;
    Ok(Floats::Array(required(&np, arr, intern!(py, "float32"))?))
}

/// A borrowed array's elements; the helpers above only return arrays for
/// which this holds.
pub(crate) fn slice_of<'a, T: numpy::Element, D: numpy::ndarray::Dimension>(
    a: &'a numpy::PyReadonlyArray<'_, T, D>,
) -> PyResult<&'a [T]> {
    a.as_slice()
        .map_err(|e| PyValueError::new_err(format!("array is not contiguous: {e}")))
}

/// A completed pull as Python sees it: the `(n, dim)` float32 array, built
/// on the pull's own buffer (no copy), and with `return_found` the bool
/// array of which keys the table held.
fn pulled_to_py(
    py: Python<'_>,
    pulled: Pulled,
    n: usize,
    dim: usize,
    return_found: bool,
) -> PyResult<Bound<'_, PyAny>> {
    let Pulled { values, found } = pulled;
    let values = Array2::from_shape_vec((n, dim), values).map_err(|e| {
        error(
            ErrorCode::Malformed,
            format!("pull returned the wrong number of floats for {n} x {dim}: {e}"),
        )
    })?;
    let values = values.into_pyarray(py).into_any();
    if !return_found {
        return Ok(values);
    }
    let found = PyArray1::from_vec(py, found).into_any();
    Ok(PyTuple::new(py, [values, found])?.into_any())
}

/// An embedding table on the server: fixed-length float32 vectors by
/// uint64 key, with an optimizer that applies pushed gradients.
///
/// Made by `Client.create_table(...)` or `Client.table(name)`; shares its
/// client's connection (calls from several threads take turns).
#[pyclass(module = "fabrickv", name = "Table", frozen)]
pub(crate) struct Table {
    /// The owning client's embedding connection.
    conn: Arc<PsConn>,
    /// The table as the server described it when opened: its id names it
    /// in every pull and push, its dim sizes the arrays.
    desc: TableDesc,
}

impl Table {
    fn new(conn: &Arc<PsConn>, desc: TableDesc) -> Table {
        Table {
            conn: Arc::clone(conn),
            desc,
        }
    }

    fn dim_usize(&self) -> usize {
        self.desc.spec.dim as usize
    }
}

#[pymethods]
impl Table {
    /// The vectors of `keys`, shape `(len(keys), dim)`, float32, in request
    /// order; absent keys get the table's missing-key policy (zeros or the
    /// initializer). With `return_found=True`, `(values, found)` where
    /// `found[i]` says whether the table held `keys[i]`.
    ///
    /// With `out` (writable float32 memory of shape `(len(keys), dim)` or
    /// flat: a numpy array, a memoryview, a DLPack tensor such as torch's;
    /// or raw bytes of the same size) the vectors land in `out`, which is
    /// returned, with no array made.
    #[pyo3(signature = (keys, out = None, return_found = false))]
    fn pull<'py>(
        &self,
        py: Python<'py>,
        keys: &Bound<'py, PyAny>,
        out: Option<&Bound<'py, PyAny>>,
        return_found: bool,
    ) -> PyResult<Bound<'py, PyAny>> {
        let keys = keys_of(keys)?;
        let slice = slice_of(&keys)?;
        let desc = &self.desc;
        let Some(out) = out else {
            let pulled = self.conn.call(py, |c| c.pull(desc, slice))?;
            return pulled_to_py(py, pulled, slice.len(), self.dim_usize(), return_found);
        };
        let mut mem = out_mem(out, slice.len(), self.dim_usize())?;
        let dst = mem.floats_mut("out")?;
        let mut found = return_found.then(|| vec![false; slice.len()]);
        let f = found.as_deref_mut();
        self.conn.call(py, |c| c.pull_into(desc, slice, dst, f))?;
        drop(mem);
        with_found(py, out.clone(), found)
    }

    /// Starts a pull and returns at once with a `PullHandle`; several may
    /// be outstanding, and waited on in any order.
    #[pyo3(signature = (keys, return_found = false))]
    fn pull_async(
        &self,
        py: Python<'_>,
        keys: &Bound<'_, PyAny>,
        return_found: bool,
    ) -> PyResult<PullHandle> {
        let keys = keys_of(keys)?;
        let slice = slice_of(&keys)?;
        let desc = &self.desc;
        let id = self.conn.call(py, |c| c.pull_async(desc, slice))?;
        Ok(PullHandle {
            conn: Arc::clone(&self.conn),
            table: self.desc.spec.name.clone(),
            keys: slice.len(),
            dim: self.dim_usize(),
            return_found,
            state: Mutex::new(HandleState::Pending(id)),
        })
    }

    /// The table's name.
    #[getter]
    fn name(&self) -> &str {
        &self.desc.spec.name
    }

    /// The server's id of the table.
    #[getter]
    fn id(&self) -> u32 {
        self.desc.id
    }

    /// Floats per vector.
    #[getter]
    fn dim(&self) -> u32 {
        self.desc.spec.dim
    }

    /// `"sgd"` or `"adagrad"`.
    #[getter]
    fn optimizer(&self) -> &'static str {
        self.desc.spec.optimizer.name()
    }

    /// The optimizer's learning rate (a float32 on the server).
    #[getter]
    fn lr(&self) -> f64 {
        f64::from(self.desc.spec.lr)
    }

    /// What pulls of absent keys return: `"zeros"` or `"init"`.
    #[getter]
    fn missing(&self) -> &'static str {
        self.desc.spec.missing.name()
    }

    /// The seed of the table's initializer.
    #[getter]
    fn seed(&self) -> u64 {
        self.desc.spec.seed
    }

    /// Keys stored now (asks the server).
    fn __len__(&self, py: Python<'_>) -> PyResult<usize> {
        let id = self.desc.id;
        let tables = self.conn.call(py, |c| c.tables())?;
        let items = tables
            .iter()
            .find(|d| d.id == id)
            .map(|d| d.items)
            .ok_or_else(|| {
                error(
                    ErrorCode::NoSuchTable,
                    format!("table {:?} is gone", self.desc.spec.name),
                )
            })?;
        usize::try_from(items).map_err(|e| PyOverflowError::new_err(e.to_string()))
    }

    fn __repr__(&self) -> String {
        spec_repr("Table", &self.desc.spec, Some(self.desc.id))
    }
}

table_writes!(Table, PsClient, desc: TableDesc, "");

/// Where a `PullHandle` stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum HandleState {
    /// Outstanding (or complete, not yet collected).
    Pending(PullId),
    /// `wait()` returned its vectors.
    Waited,
    /// `cancel()` gave it up.
    Cancelled,
}

/// An outstanding pull from `Table.pull_async`: `done()` polls, `wait()`
/// returns the vectors (or `(values, found)`), `cancel()` gives up. After
/// `wait()` or `cancel()` every method raises `fabrickv.Error` with code
/// `MALFORMED`, as the Rust client does for a pull no longer outstanding.
/// A handle dropped while pending cancels its pull.
#[pyclass(module = "fabrickv", name = "PullHandle", frozen)]
pub(crate) struct PullHandle {
    /// The connection the pull is outstanding on.
    conn: Arc<PsConn>,
    /// The table's name, for `repr`.
    table: String,
    /// Keys pulled: the result's rows.
    keys: usize,
    /// The table's dim: the result's columns.
    dim: usize,
    /// Whether `wait()` also returns the found flags.
    return_found: bool,
    /// A mutex because handles may be shared by threads (the class is
    /// frozen); held only to read or set the state, never over the network.
    state: Mutex<HandleState>,
}

impl PullHandle {
    fn state(&self) -> HandleState {
        *self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn set_state(&self, s: HandleState) {
        *self.state.lock().unwrap_or_else(PoisonError::into_inner) = s;
    }

    /// The pull's id while it is outstanding; the error to raise otherwise.
    fn pending(&self) -> PyResult<PullId> {
        match self.state() {
            HandleState::Pending(id) => Ok(id),
            HandleState::Waited => Err(error(
                ErrorCode::Malformed,
                "this pull was already waited on; its vectors were returned then",
            )),
            HandleState::Cancelled => Err(error(ErrorCode::Malformed, "this pull was cancelled")),
        }
    }
}

#[pymethods]
impl PullHandle {
    /// Whether the pull has completed (reads what replies have arrived,
    /// without blocking).
    fn done(&self, py: Python<'_>) -> PyResult<bool> {
        let id = self.pending()?;
        self.conn.call(py, |c| c.is_done(id))
    }

    /// Waits for the pull (up to the client's timeout) and returns its
    /// vectors, or `(values, found)` if the pull was started with
    /// `return_found=True`. A timeout leaves the pull outstanding: wait
    /// again or cancel.
    fn wait<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let id = self.pending()?;
        // A failure leaves the handle pending: after a timeout the Rust
        // client keeps the pull outstanding (wait again or cancel); after
        // any other failure it reports the pull as no longer outstanding.
        let pulled = self.conn.call(py, |c| c.wait(id))?;
        self.set_state(HandleState::Waited);
        pulled_to_py(py, pulled, self.keys, self.dim, self.return_found)
    }

    /// Gives up on the pull; its vectors are never returned.
    fn cancel(&self, py: Python<'_>) -> PyResult<()> {
        let id = self.pending()?;
        self.set_state(HandleState::Cancelled);
        self.conn.call(py, |c| c.cancel(id))
    }

    /// Keys pulled.
    fn __len__(&self) -> usize {
        self.keys
    }

    fn __repr__(&self) -> String {
        let state = match self.state() {
            HandleState::Pending(_) => "pending",
            HandleState::Waited => "waited",
            HandleState::Cancelled => "cancelled",
        };
        format!(
            "<fabrickv.PullHandle table={:?} keys={} dim={} {state}>",
            self.table, self.keys, self.dim
        )
    }
}

impl Drop for PullHandle {
    fn drop(&mut self) {
        let state = *self.state.get_mut().unwrap_or_else(PoisonError::into_inner);
        if let HandleState::Pending(id) = state {
            self.conn.cancel_soon(id);
        }
    }
}
