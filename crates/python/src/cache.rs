//! `fabrickv.CacheClient`: the KV-cache client for Python.
//!
//! A thin wrapper over [`fabrickv_client::CacheClient`], whose values are
//! large (tensor blocks, up to 64 MiB) and are read through a receive
//! buffer the client owns: over shm the server writes a value there
//! one-sided, over tcp the client lands its inline chunks there. The
//! Python reads copy from that buffer straight into what the caller gets:
//! the `bytes` of `get`, or the caller's own buffer in `get_into` and
//! `get_many_into`. One copy, and no intermediate `Vec`.
//!
//! Buffers. Values and outputs are any object with the buffer protocol
//! (`bytes`, `bytearray`, `memoryview`, numpy arrays of any dtype, ...)
//! whose memory is C-contiguous; they are seen as flat bytes through
//! `numpy.frombuffer(obj, uint8)`, which views the memory in place (no
//! copy), refuses non-contiguous memory, and keeps the buffer exported for
//! as long as the view lives, so a `bytearray` cannot be resized under the
//! call. A float16 tensor block is thus stored and read as its raw bytes,
//! in the machine's byte order. `bytes` values skip numpy and are borrowed
//! as they are.
//!
//! Locking and the GIL. The Rust client needs `&mut` and its receive
//! buffer is reused by every read, so the client sits behind a mutex that
//! a read holds from its request until its copy out of the buffer is done.
//! The mutex is taken with the GIL released (`lock_py_attached`), the
//! network wait runs with the GIL released (`Python::detach`), and the
//! copy into a Python-owned buffer runs with the GIL held: no other Python
//! thread can then read or resize what is being written, and each output
//! is borrowed mutably on its own, in turn, so outputs that share memory
//! never become two `&mut` at once. Values being stored, on the other
//! hand, are read with the GIL released, as numpy's own functions read
//! their inputs: a thread that writes to a value while it is being stored
//! gets an unspecified mix stored, never a crash.
//!
//! Holding the mutex while re-taking the GIL cannot deadlock: no thread
//! ever waits for the mutex with the GIL held.

use std::sync::atomic::AtomicBool;
use std::sync::Mutex;
use std::time::Duration;

use fabrickv_client::cache::{CacheClient as RustCacheClient, CacheClientOptions, Placed};
use fabrickv_client::ClientError;
use fabrickv_types::limits::{CACHE_BATCH_KEYS_MAX, CACHE_CLIENT_BUFFER_BYTES_MAX};
use fabrickv_types::ErrorCode;
use numpy::{PyArray1, PyArrayMethods, PyReadonlyArray1, PyUntypedArrayMethods};
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::sync::{MutexExt, PyOnceLock};
use pyo3::types::{PyBytes, PyString};

use crate::{error, to_py_err, ttl_of};

/// Adds `CacheClient` to the module.
pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<CacheClient>()
}

/// Bytes in the `MB` of `buffer_mb`.
const MIB: usize = 1 << 20;

/// `numpy.frombuffer`, looked up once.
static FROMBUFFER: PyOnceLock<Py<PyAny>> = PyOnceLock::new();

/// The name of `obj`'s type, for error messages.
fn type_name(obj: &Bound<'_, PyAny>) -> String {
    obj.get_type()
        .name()
        .map_or_else(|_| "?".to_string(), |n| n.to_string())
}

/// A key's bytes: `bytes` as they are, `str` as its UTF-8 encoding (so
/// `"k"` and `b"k"` name the same entry).
pub(crate) fn key_of<'a>(obj: &'a Bound<'_, PyAny>) -> PyResult<&'a [u8]> {
    if let Ok(b) = obj.cast::<PyBytes>() {
        return Ok(b.as_bytes());
    }
    if let Ok(s) = obj.cast::<PyString>() {
        return Ok(s.to_str()?.as_bytes());
    }
    Err(PyTypeError::new_err(format!(
        "a key must be bytes or str, not {}",
        type_name(obj)
    )))
}

/// `obj`'s memory as a flat uint8 array viewing it in place. `what` names
/// the argument in errors: TypeError for an object without the buffer
/// protocol, ValueError for memory that is not C-contiguous.
fn bytes_view<'py>(obj: &Bound<'py, PyAny>, what: &str) -> PyResult<Bound<'py, PyArray1<u8>>> {
    let py = obj.py();
    let frombuffer = FROMBUFFER.import(py, "numpy", "frombuffer")?;
    let view = frombuffer
        .call1((obj, numpy::dtype::<u8>(py)))
        .map_err(|e| {
            let why = e.value(py).to_string();
            if e.is_instance_of::<PyTypeError>(py) {
                PyTypeError::new_err(format!(
                    "{what} must support the buffer protocol (bytes, bytearray, memoryview, \
                     numpy array), not {}: {why}",
                    type_name(obj)
                ))
            } else {
                PyValueError::new_err(format!(
                    "{what} must be one C-contiguous block of memory: {why}"
                ))
            }
        })?;
    Ok(view.cast_into::<PyArray1<u8>>()?)
}

/// A value to store, borrowed for the length of the call.
pub(crate) enum Value<'py> {
    /// `bytes`: immutable, read as it is.
    Bytes(Bound<'py, PyBytes>),
    /// Any other buffer, through its uint8 view.
    Buffer(PyReadonlyArray1<'py, u8>),
}

impl Value<'_> {
    pub(crate) fn of<'py>(obj: &Bound<'py, PyAny>) -> PyResult<Value<'py>> {
        if let Ok(b) = obj.cast::<PyBytes>() {
            return Ok(Value::Bytes(b.clone()));
        }
        let view = bytes_view(obj, "a value")?;
        Ok(Value::Buffer(view.try_readonly()?))
    }

    pub(crate) fn as_slice(&self) -> PyResult<&[u8]> {
        match self {
            Value::Bytes(b) => Ok(b.as_bytes()),
            // `frombuffer` views are contiguous; this only guards that.
            Value::Buffer(a) => a
                .as_slice()
                .map_err(|e| PyValueError::new_err(format!("a value: {e}"))),
        }
    }
}

/// An output buffer: its uint8 view, checked writable now so that a
/// read-only output is refused before anything is asked of the server.
pub(crate) fn out_of<'py>(obj: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyArray1<u8>>> {
    let view = bytes_view(obj, "out")?;
    if view.try_readwrite().is_err() {
        return Err(PyTypeError::new_err(format!(
            "out must be a writable buffer; this {} is read-only",
            type_name(obj)
        )));
    }
    Ok(view)
}

/// Copies `src` to the start of `out`, with the GIL held (see the module
/// doc). A `src` longer than `out` is refused (`BUFFER_TOO_SMALL`) with
/// nothing written.
pub(crate) fn copy_out(out: &Bound<'_, PyArray1<u8>>, src: &[u8]) -> PyResult<()> {
    let mut w = out.try_readwrite()?;
    let dst = w
        .as_slice_mut()
        .map_err(|e| PyValueError::new_err(format!("out: {e}")))?;
    let cap = dst.len();
    let dst = dst.get_mut(..src.len()).ok_or_else(|| {
        too_small(format!(
            "a {}-byte value does not fit out ({cap} bytes)",
            src.len()
        ))
    })?;
    dst.copy_from_slice(src);
    Ok(())
}

/// The error of a value that does not fit where it was to be read.
fn too_small(message: String) -> PyErr {
    error(ErrorCode::BufferTooSmall, message)
}

/// Where in the receive buffer (of `buffer_len` bytes) to read a value
/// meant for an output of `cap` bytes: at the end, so that the slice the
/// server checks the value against is exactly the output's size and a
/// value too large is refused before it is sent (the whole buffer if the
/// output is larger than it).
pub(crate) fn end_offset(buffer_len: usize, cap: usize) -> usize {
    buffer_len - cap.min(buffer_len)
}

/// The error of a read, after `context` (which names the call and key
/// where there are several). For a value that does not fit, says which
/// limit it hit, the output's or the receive buffer's; keeps the code.
pub(crate) fn read_error(context: &str, e: ClientError, cap: usize, buffer_len: usize) -> PyErr {
    let code = e.code();
    let message = if code != ErrorCode::BufferTooSmall {
        format!("{context}{e}")
    } else if cap > buffer_len {
        format!(
            "{context}the value is larger than the {buffer_len}-byte receive buffer \
             (raise buffer_mb): {e}"
        )
    } else {
        format!("{context}the value does not fit out ({cap} bytes): {e}")
    };
    error(code, message)
}

/// The receive buffer's bytes from `buffer_mb` (MiB), checked against
/// the largest buffer a client may have.
pub(crate) fn buffer_bytes_of(buffer_mb: i64) -> PyResult<usize> {
    let mb_max = CACHE_CLIENT_BUFFER_BYTES_MAX / MIB as u64;
    u64::try_from(buffer_mb)
        .ok()
        .filter(|mb| (1..=mb_max).contains(mb))
        .and_then(|mb| usize::try_from(mb).ok())
        .map(|mb| mb * MIB)
        .ok_or_else(|| {
            PyValueError::new_err(format!(
                "buffer_mb must be an integer in 1..={mb_max}, not {buffer_mb}"
            ))
        })
}

/// Runs `f` with the client in `slot` locked and the GIL held; `f`
/// releases the GIL itself around its network calls. The lock is waited
/// for with the GIL released, so a thread waiting for another's read does
/// not stop every Python thread.
pub(crate) fn with_locked<C, R>(
    py: Python<'_>,
    slot: &Mutex<Option<C>>,
    f: impl FnOnce(&mut C) -> PyResult<R>,
) -> PyResult<R> {
    let mut guard = slot.lock_py_attached(py).map_err(|_| {
        error(
            ErrorCode::Internal,
            "an earlier call on this client panicked; open a new client",
        )
    })?;
    let client = guard
        .as_mut()
        .ok_or_else(|| error(ErrorCode::Unavailable, "the client is closed"))?;
    f(client)
}

/// Runs `op` on `key` (checked as every key is) with the client in `slot`
/// locked and the GIL released: the calls that take a key and nothing
/// more (`delete`, `exists`).
pub(crate) fn on_key<C: Send, R: Send>(
    py: Python<'_>,
    slot: &Mutex<Option<C>>,
    key: &Bound<'_, PyAny>,
    op: impl FnOnce(&mut C, &[u8]) -> fabrickv_client::Result<R> + Send,
) -> PyResult<R> {
    let key = key_of(key)?;
    with_locked(py, slot, |c| py.detach(|| op(c, key)).map_err(to_py_err))
}

/// A client of the server's KV cache: large values (up to 64 MiB, say a
/// layer block of attention keys and values) with an optional time to
/// live, read through a receive buffer of `buffer_mb` MiB.
///
/// `CacheClient(addr, buffer_mb=64, timeout=5.0)`: `addr` is `HOST:PORT`,
/// `tcp://HOST:PORT` or `shm://NAME`; over shm the server writes values
/// into the receive buffer itself (`one_sided`). `buffer_mb` bounds the
/// largest value this client can read; `timeout` (seconds) bounds
/// connecting and each call. Values and outputs are any C-contiguous
/// buffer (bytes, bytearray, memoryview, numpy arrays of any dtype), taken
/// as raw bytes; keys are bytes or str (UTF-8), at most 1024 bytes.
///
/// One client may be shared by threads, whose calls then take turns (open
/// one per thread to run them in parallel).
#[pyclass(module = "fabrickv", name = "CacheClient", frozen)]
pub(crate) struct CacheClient {
    /// The address as given, for `addr` and `repr`.
    addr: String,
    /// The per-call timeout, as given.
    timeout: Duration,
    /// Bytes of the receive buffer; kept so that the getters need no lock.
    buffer_bytes: usize,
    /// Whether values land one-sided; kept for the same reason.
    one_sided: bool,
    /// The Rust client; `None` once closed. A mutex because Python threads
    /// may share the client while the Rust one needs `&mut`, and because a
    /// read's value sits in the shared receive buffer until copied out.
    inner: Mutex<Option<RustCacheClient>>,
    /// Set by `close()`, read by `closed` and `repr` without the lock, so
    /// that they never wait for a call in flight on another thread.
    closed: AtomicBool,
}

/// A Rust cache client whose reads land in a receive buffer: one
/// server's, or a cluster's with a buffer per server. [`read`], the one
/// read path of `get` and `get_into`, needs no more of it.
pub(crate) trait BufferedReads: Send {
    /// Where a read landed.
    type Placed: Send;

    /// The length of the receive buffer `key`'s value lands in (with the
    /// GIL released where finding it may dial a server).
    fn buffer_len_of(&mut self, py: Python<'_>, key: &[u8]) -> PyResult<usize>;

    /// Reads `key` into that buffer at `offset`; `None` if absent.
    fn place(&mut self, key: &[u8], offset: usize)
        -> fabrickv_client::Result<Option<Self::Placed>>;

    /// The bytes of the value where `p` says it landed.
    fn landed(&mut self, p: &Self::Placed) -> PyResult<&[u8]>;
}

impl BufferedReads for RustCacheClient {
    type Placed = Placed;

    fn buffer_len_of(&mut self, _py: Python<'_>, _key: &[u8]) -> PyResult<usize> {
        Ok(self.buffer_len())
    }

    fn place(&mut self, key: &[u8], offset: usize) -> fabrickv_client::Result<Option<Placed>> {
        self.get_at(key, offset)
    }

    fn landed(&mut self, p: &Placed) -> PyResult<&[u8]> {
        let buf = self.buffer().map_err(to_py_err)?;
        Ok(&buf[p.offset..p.offset + p.len])
    }
}

/// Reads `key` into the receive buffer of the client in `slot`, placed for
/// an output of `cap` bytes (see [`end_offset`]), and hands the value's
/// bytes to `take` with the GIL held and the client locked; None if absent.
pub(crate) fn read<C: BufferedReads, R>(
    py: Python<'_>,
    slot: &Mutex<Option<C>>,
    key: &[u8],
    cap: usize,
    take: impl FnOnce(&[u8]) -> PyResult<R>,
) -> PyResult<Option<R>> {
    with_locked(py, slot, |c| {
        let n = c.buffer_len_of(py, key)?;
        let offset = end_offset(n, cap);
        let placed = py
            .detach(|| c.place(key, offset))
            .map_err(|e| read_error("", e, cap, n))?;
        let Some(p) = placed else {
            return Ok(None);
        };
        take(c.landed(&p)?).map(Some)
    })
}

cache_reads!(
    CacheClient,
    "The value of `key` as bytes, or None if it is absent or expired. \
     `fabrickv.Error` with code `BUFFER_TOO_SMALL` if it is larger than \
     the receive buffer.",
    "Reads the value of `key` into `out` (any writable C-contiguous \
     buffer: bytearray, numpy array of any dtype, memoryview), from its \
     first byte on; returns the value's length in bytes, or None if the \
     key is absent (`out` untouched). A value larger than `out` raises \
     `fabrickv.Error` with code `BUFFER_TOO_SMALL` and leaves `out` \
     untouched: the server checks the size before sending anything."
);
closable_client!(
    CacheClient,
    "Closes the connection and frees the receive buffer; later calls \
     raise `fabrickv.Error` (`UNAVAILABLE`). Closing twice is harmless."
);
addr_and_timeout!(CacheClient);
cache_writes!(CacheClient, "");

#[pymethods]
impl CacheClient {
    /// Connects (with the GIL released) and sets up the receive buffer:
    /// registered with the server where the transport allows (shm).
    #[new]
    #[pyo3(signature = (addr, buffer_mb = 64, timeout = 5.0))]
    fn new(py: Python<'_>, addr: &str, buffer_mb: i64, timeout: f64) -> PyResult<Self> {
        let buffer_bytes = buffer_bytes_of(buffer_mb)?;
        let timeout = crate::timeout_of(timeout)?;
        let opts = CacheClientOptions {
            buffer_bytes,
            timeout,
        };
        let client = py
            .detach(|| RustCacheClient::connect_with(addr, opts))
            .map_err(to_py_err)?;
        Ok(CacheClient {
            addr: addr.to_string(),
            timeout,
            buffer_bytes: client.buffer_len(),
            one_sided: client.one_sided(),
            inner: Mutex::new(Some(client)),
            closed: AtomicBool::new(false),
        })
    }

    /// Stores each `(key, value)` of `items` in order, all with the same
    /// `ttl`; returns their generations. On an error the items before the
    /// failing one are stored; the error names the failing item's index.
    #[pyo3(signature = (items, ttl = None))]
    fn put_many(
        &self,
        py: Python<'_>,
        items: Vec<(Bound<'_, PyAny>, Bound<'_, PyAny>)>,
        ttl: Option<f64>,
    ) -> PyResult<Vec<u64>> {
        let ttl = ttl_of(ttl)?;
        let keys: Vec<&[u8]> = items
            .iter()
            .map(|(k, _)| key_of(k))
            .collect::<PyResult<_>>()?;
        let values: Vec<Value<'_>> = items
            .iter()
            .map(|(_, v)| Value::of(v))
            .collect::<PyResult<_>>()?;
        let values: Vec<&[u8]> = values
            .iter()
            .map(Value::as_slice)
            .collect::<PyResult<_>>()?;
        with_locked(py, &self.inner, |c| {
            py.detach(|| {
                let mut generations = Vec::with_capacity(keys.len());
                for (i, (key, value)) in keys.iter().zip(&values).enumerate() {
                    match c.put(key, value, ttl) {
                        Ok(g) => generations.push(g),
                        Err(e) => return Err((i, e)),
                    }
                }
                Ok(generations)
            })
            .map_err(|(i, e)| error(e.code(), format!("put_many item {i}: {e}")))
        })
    }

    /// Reads each of `keys` into the matching buffer of `outs`, as
    /// `get_into` does; returns each value's length, None for an absent
    /// key (its output untouched). The requests of as many keys as the
    /// receive buffer holds (sized by their outputs) are in flight at once
    /// over shm; over tcp they are read one after another. On an error
    /// (`BUFFER_TOO_SMALL` for a value larger than its output, the output
    /// untouched) the outputs of earlier keys may have been filled, later
    /// ones are untouched; the message names the key's index.
    fn get_many_into(
        &self,
        py: Python<'_>,
        keys: Vec<Bound<'_, PyAny>>,
        outs: Vec<Bound<'_, PyAny>>,
    ) -> PyResult<Vec<Option<usize>>> {
        if keys.len() != outs.len() {
            return Err(PyValueError::new_err(format!(
                "get_many_into: {} keys but {} outs",
                keys.len(),
                outs.len()
            )));
        }
        let keys: Vec<&[u8]> = keys.iter().map(key_of).collect::<PyResult<_>>()?;
        let outs: Vec<Bound<'_, PyArray1<u8>>> =
            outs.iter().map(out_of).collect::<PyResult<_>>()?;
        let caps: Vec<usize> = outs.iter().map(|o| o.len()).collect();
        with_locked(py, &self.inner, |c| {
            let n = c.buffer_len();
            let mut lengths = Vec::with_capacity(keys.len());
            let mut start = 0;
            while start < keys.len() {
                // A round: the next keys whose outputs fit the receive
                // buffer side by side (at least one key, whose output may
                // be larger than the buffer).
                let mut end = start;
                let mut used = 0;
                while end < keys.len() && end - start < CACHE_BATCH_KEYS_MAX {
                    let room = caps[end].min(n);
                    if end > start && used + room > n {
                        break;
                    }
                    used += room;
                    end += 1;
                }
                // Packed to end at the buffer's end, so that the last key's
                // slice is exactly its output's size (see `end_offset`).
                // An earlier key's slice runs on to the buffer's end: a
                // value too large for its output may land over the later
                // keys' places, but it is reported as BUFFER_TOO_SMALL and
                // nothing after it is copied out.
                let mut offset = n - used;
                let mut items = Vec::with_capacity(end - start);
                for i in start..end {
                    items.push((keys[i], offset));
                    offset += caps[i].min(n);
                }
                let results = py
                    .detach(|| c.get_many_at(&items))
                    .map_err(|e| error(e.code(), format!("get_many_into: {e}")))?;
                let buf = c.buffer().map_err(to_py_err)?;
                for (i, r) in (start..end).zip(results) {
                    let placed = r.map_err(|e| {
                        read_error(&format!("get_many_into key {i}: "), e, caps[i], n)
                    })?;
                    match placed {
                        None => lengths.push(None),
                        Some(p) if p.len > caps[i] => {
                            return Err(too_small(format!(
                                "get_many_into key {i}: a {}-byte value does not fit out ({} bytes)",
                                p.len, caps[i]
                            )));
                        }
                        Some(p) => {
                            copy_out(&outs[i], &buf[p.offset..p.offset + p.len])?;
                            lengths.push(Some(p.len));
                        }
                    }
                }
                start = end;
            }
            Ok(lengths)
        })
    }

    /// True if the server writes values into the receive buffer itself
    /// (shm); False if they arrive inline and the client lands them (tcp).
    #[getter]
    fn one_sided(&self) -> bool {
        self.one_sided
    }

    /// Bytes of the receive buffer: the largest value this client reads.
    #[getter]
    fn buffer_size(&self) -> usize {
        self.buffer_bytes
    }

    fn __repr__(&self) -> String {
        format!(
            "<fabrickv.CacheClient addr={:?} buffer_size={} one_sided={} timeout={}s{}>",
            self.addr,
            self.buffer_bytes,
            if self.one_sided { "True" } else { "False" },
            self.timeout.as_secs_f64(),
            self.closed_mark()
        )
    }
}
