//! `fabrickv.CacheClient`: the KV-cache client for Python.
//!
//! A thin wrapper over [`fabrickv_client::CacheClient`], whose values are
//! large (tensor blocks, up to 64 MiB) and are read through a receive
//! buffer the client owns: over shm the server writes a value there
//! one-sided, over tcp the client lands its inline chunks there. The
//! Python reads copy from that buffer straight into what the caller gets:
//! the new numpy array of `get`, or the caller's own buffer in `get_into`
//! and `get_many_into`. One copy, and no intermediate `Vec`.
//!
//! Buffers. Values and outputs are whatever [`crate::buffers::Mem`]
//! sees in place: numpy arrays, any C-contiguous buffer (`bytes`,
//! `bytearray`, `memoryview`), or CPU tensors with `__dlpack__` (torch,
//! bfloat16 included), of any dtype, taken as raw bytes in the machine's
//! byte order. The memory is held (buffer view or DLPack capsule) for the
//! length of the call, so it can be neither freed nor resized under it.
//!
//! Locking and the GIL. The Rust client needs `&mut` and its receive
//! buffer is reused by every read, so the client sits behind a mutex that
//! a read holds from its request until its copy out of the buffer is done.
//! The mutex is taken with the GIL released (`lock_py_attached`); the
//! network wait and the copies, into the caller's memory and out of it,
//! run with the GIL released too (`Python::detach`): a 16 MiB batch of
//! blocks does not stop the other Python threads while it is copied
//! (`get` without `out=` takes the GIL back only to make its array, once
//! the value's length is known). Outputs are
//! filled one after another, each borrowed mutably on its own, so outputs
//! that share memory never become two `&mut` at once. A thread that
//! writes to a value while it is being stored, or reads an output while
//! it is being filled, gets unspecified bytes, never a crash, as with
//! numpy's own functions that release the GIL.
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
use numpy::{PyArray1, PyArrayMethods};
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::sync::MutexExt;
use pyo3::types::{PyBytes, PyInt, PyList, PyString, PyTuple};

use crate::buffers::{type_name, Mem};
use crate::registered::{Lent, RegisteredMemory};
use crate::{error, failure, raise, to_py_err, Failure};

/// Adds `CacheClient` to the module.
pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<CacheClient>()?;
    m.add_class::<RegisteredMemory>()
}

/// Bytes in the `MB` of `buffer_mb`.
const MIB: usize = 1 << 20;

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

/// The keys of a batched call, borrowed.
pub(crate) fn keys_of<'a>(keys: &'a [Bound<'_, PyAny>]) -> PyResult<Vec<&'a [u8]>> {
    keys.iter().map(key_of).collect()
}

/// Where in the receive buffer (of `buffer_len` bytes) to read a value
/// meant for an output of `cap` bytes: at the end, so that the slice the
/// server checks the value against is exactly the output's size and a
/// value too large is refused before it is sent (the whole buffer if the
/// output is larger than it).
pub(crate) fn end_offset(buffer_len: usize, cap: usize) -> usize {
    buffer_len - cap.min(buffer_len)
}

/// The failure of a value that does not fit where it was to be read.
fn too_small(message: String) -> Failure {
    (ErrorCode::BufferTooSmall, message)
}

/// The failure of a read, after `context` (which names the call and key
/// where there are several). For a value that does not fit, says which
/// limit it hit, the output's or the receive buffer's; keeps the code.
fn read_failure(context: &str, e: ClientError, cap: usize, buffer_len: usize) -> Failure {
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
    (code, message)
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
/// releases the GIL itself around its network calls and copies. The lock
/// is waited for with the GIL released, so a thread waiting for another's
/// read does not stop every Python thread.
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

/// Runs `f` on the client in `slot` with the lock held and the GIL
/// released throughout (`f` touches no Python object: its inputs and
/// outputs are [`Mem`]s and plain data).
fn detached<C: Send, R: Send>(
    py: Python<'_>,
    slot: &Mutex<Option<C>>,
    f: impl FnOnce(&mut C) -> Result<R, Failure> + Send,
) -> PyResult<R> {
    with_locked(py, slot, |c| py.detach(|| f(c)).map_err(raise))
}

/// What [`CacheOps::read_each`] hands each key's value to: the key's
/// index and its bytes (None if absent) or its failure; false stops the
/// batch.
pub(crate) type Take<'a> = dyn FnMut(usize, fabrickv_client::Result<Option<&[u8]>>) -> bool + 'a;

/// A Rust cache client as the Python classes use it: one server's
/// ([`RustCacheClient`]) or a cluster's, with a receive buffer per
/// server. Every Python cache call is written once over this.
pub(crate) trait CacheOps: Send {
    /// Where a read landed.
    type Placed: Send + Sync;

    /// The length of the receive buffer `key`'s value lands in (finding
    /// it may dial a server).
    fn buffer_len_of(&mut self, key: &[u8]) -> fabrickv_client::Result<usize>;

    /// The server (0 for a single server) whose buffer `key` lands in:
    /// reads of different servers do not share buffer space.
    fn server_of_key(&self, key: &[u8]) -> usize;

    /// Reads each `(key, offset)` into its server's buffer at `offset`,
    /// all in flight at once; one result per key.
    fn place_many(
        &mut self,
        items: &[(&[u8], usize)],
    ) -> fabrickv_client::Result<Vec<fabrickv_client::Result<Option<Self::Placed>>>>;

    /// The bytes of the value where `p` says it landed.
    fn landed(&mut self, p: &Self::Placed) -> fabrickv_client::Result<&[u8]>;

    /// Stores `value` under `key`; its generation.
    fn put_value(
        &mut self,
        key: &[u8],
        value: &[u8],
        ttl: Option<Duration>,
    ) -> fabrickv_client::Result<u64>;

    /// Stores each `(key, value)` with `ttl`, pipelined; one result per
    /// item, in order (a refused item does not stop the others).
    fn put_values(
        &mut self,
        items: &[(&[u8], &[u8])],
        ttl: Option<Duration>,
    ) -> fabrickv_client::Result<Vec<fabrickv_client::Result<u64>>>;

    /// Whether each key is live.
    fn exists_keys(&mut self, keys: &[&[u8]]) -> fabrickv_client::Result<Vec<bool>>;

    /// Removes each key; whether it was there.
    fn delete_keys(&mut self, keys: &[&[u8]]) -> fabrickv_client::Result<Vec<bool>>;

    /// Reads each key of `keys` straight into its place of `places`
    /// (address, bytes) where every place lies in one buffer this client
    /// registered (`CacheClient.register_buffer`): the server writes the
    /// values there itself and nothing is copied here. One result per
    /// key, as [`RustCacheClient::get_many_to`] gives them; `None`, with
    /// nothing sent, where the places are elsewhere (the caller then
    /// reads through the receive buffer). By default always `None`.
    fn read_registered(
        &mut self,
        _keys: &[&[u8]],
        _places: &[(usize, usize)],
    ) -> Option<fabrickv_client::Result<Vec<fabrickv_client::Result<Option<usize>>>>> {
        None
    }

    /// Reads each `(key, room)` (room: the bytes its value may take) and
    /// hands it to `take` in key order: its bytes in a receive buffer,
    /// `None` if absent, or the key's own failure; no key after one for
    /// which `take` returns false is handed over. `buffer_bytes` is each
    /// receive buffer's size. The outer error is the connection's.
    ///
    /// By default in rounds: as many keys as fit their servers' receive
    /// buffers side by side (at most `CACHE_BATCH_KEYS_MAX`) are in
    /// flight at once, each server's packed to end at its buffer's end,
    /// so that the last key's slice is exactly its room (see
    /// [`end_offset`]). An earlier key's slice runs on to the buffer's
    /// end: a value too large for its room may land over later keys'
    /// places in the receive buffer, but `take` sees its true length and
    /// refuses it, and nothing after it is handed over.
    fn read_each(
        &mut self,
        items: &[(&[u8], usize)],
        buffer_bytes: usize,
        take: &mut Take<'_>,
    ) -> fabrickv_client::Result<()> {
        let n = buffer_bytes;
        let servers: Vec<usize> = items.iter().map(|(k, _)| self.server_of_key(k)).collect();
        let mut start = 0;
        let mut used: Vec<usize> = Vec::new();
        let mut round: Vec<(&[u8], usize)> = Vec::new();
        while start < items.len() {
            used.clear();
            let mut end = start;
            while end < items.len() && end - start < CACHE_BATCH_KEYS_MAX {
                let s = servers[end];
                if used.len() <= s {
                    used.resize(s + 1, 0);
                }
                let room = items[end].1.min(n);
                if used[s] > 0 && used[s] + room > n {
                    break;
                }
                used[s] += room;
                end += 1;
            }
            let mut next: Vec<usize> = used.iter().map(|u| n - u).collect();
            round.clear();
            for i in start..end {
                let s = servers[i];
                round.push((items[i].0, next[s]));
                next[s] += items[i].1.min(n);
            }
            let results = self.place_many(&round)?;
            for (i, r) in (start..end).zip(results) {
                let go = match r {
                    Err(e) => take(i, Err(e)),
                    Ok(None) => take(i, Ok(None)),
                    Ok(Some(p)) => {
                        let v = self.landed(&p)?;
                        take(i, Ok(Some(v)))
                    }
                };
                if !go {
                    return Ok(());
                }
            }
            start = end;
        }
        Ok(())
    }
}

impl CacheOps for RustCacheClient {
    type Placed = Placed;

    fn buffer_len_of(&mut self, _key: &[u8]) -> fabrickv_client::Result<usize> {
        Ok(self.buffer_len())
    }

    fn server_of_key(&self, _key: &[u8]) -> usize {
        0
    }

    fn place_many(
        &mut self,
        items: &[(&[u8], usize)],
    ) -> fabrickv_client::Result<Vec<fabrickv_client::Result<Option<Placed>>>> {
        self.get_many_at(items)
    }

    fn landed(&mut self, p: &Placed) -> fabrickv_client::Result<&[u8]> {
        Ok(&self.buffer()?[p.offset..p.offset + p.len])
    }

    fn put_value(
        &mut self,
        key: &[u8],
        value: &[u8],
        ttl: Option<Duration>,
    ) -> fabrickv_client::Result<u64> {
        self.put(key, value, ttl)
    }

    /// Pipelined ([`RustCacheClient::put_many`]): a round trip per round
    /// of values, not per value.
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

    fn read_registered(
        &mut self,
        keys: &[&[u8]],
        places: &[(usize, usize)],
    ) -> Option<fabrickv_client::Result<Vec<fabrickv_client::Result<Option<usize>>>>> {
        for i in 0..self.registered_buffers().len() {
            let r = self.registered_buffers()[i];
            let base = match self.registered(&r) {
                Ok(b) => b.as_ptr() as usize,
                Err(e) => return Some(Err(e)),
            };
            let end = base + r.len as usize;
            let inside = places
                .iter()
                .all(|&(at, len)| at >= base && at.checked_add(len).is_some_and(|e| e <= end));
            if inside {
                let items: Vec<(&[u8], usize, usize)> = keys
                    .iter()
                    .zip(places)
                    .map(|(k, &(at, len))| (*k, at - base, len))
                    .collect();
                return Some(self.get_many_to(&r, &items));
            }
        }
        None
    }

    /// Streamed through a ring of the receive buffer
    /// ([`RustCacheClient::get_many_each`]): over shm each value is copied
    /// out while the server writes the next ones.
    fn read_each(
        &mut self,
        items: &[(&[u8], usize)],
        _buffer_bytes: usize,
        take: &mut Take<'_>,
    ) -> fabrickv_client::Result<()> {
        self.get_many_each(items, take)
    }
}

/// Reads `key` into its receive buffer, placed for an output of `cap`
/// bytes (see [`end_offset`]), and hands the value's bytes to `take`,
/// all with the GIL released; None if absent.
fn read_detached<C: CacheOps, R: Send>(
    c: &mut C,
    key: &[u8],
    cap: usize,
    take: impl FnOnce(&[u8]) -> Result<R, Failure>,
) -> Result<Option<R>, Failure> {
    let n = c.buffer_len_of(key).map_err(failure)?;
    let offset = end_offset(n, cap);
    let mut placed = c
        .place_many(&[(key, offset)])
        .map_err(|e| read_failure("", e, cap, n))?;
    let placed = placed
        .pop()
        .unwrap_or(Ok(None))
        .map_err(|e| read_failure("", e, cap, n))?;
    let Some(p) = placed else {
        return Ok(None);
    };
    let v = c.landed(&p).map_err(failure)?;
    take(v).map(Some)
}

/// Copies `src` to the start of `dst`; a `src` longer than `dst` is
/// refused (`BUFFER_TOO_SMALL`, its message after `context()`, made only
/// then) with nothing written.
fn copy_into(dst: &mut [u8], src: &[u8], context: impl FnOnce() -> String) -> Result<(), Failure> {
    let cap = dst.len();
    let dst = dst.get_mut(..src.len()).ok_or_else(|| {
        too_small(format!(
            "{}a {}-byte value does not fit out ({cap} bytes)",
            context(),
            src.len()
        ))
    })?;
    copy_out(dst, src);
    Ok(())
}

/// Bytes copied at a time by [`copy_out`]: under glibc's
/// `x86_rep_movsb_threshold` (2112 bytes on the 2-CPU EPYC VM this
/// project develops on), so that each piece goes through its vector loop.
/// Copies of that size or more use `rep movsb`, which reading a value the
/// server's CPU has just written into the receive buffer moved about
/// 10 GB/s there; the vector loop, 12.3 GB/s (python/bench_front_door.py's
/// get_many_into, 64 values of 256 KiB over shm).
const COPY_PIECE_BYTES: usize = 2048;

/// Copies a value out of the receive buffer into `dst` (as long as
/// `src`), [`COPY_PIECE_BYTES`] at a time.
fn copy_out(dst: &mut [u8], src: &[u8]) {
    for (d, s) in dst
        .chunks_mut(COPY_PIECE_BYTES)
        .zip(src.chunks(COPY_PIECE_BYTES))
    {
        d.copy_from_slice(s);
    }
}

/// `get(key)` without `out=`: the value in a new numpy array (uint8,
/// 1-D, owning its memory), or None. The value is read into the receive
/// buffer with the GIL released; once its length is known the array is
/// made (`numpy.empty`, so no page is written twice), and the value is
/// copied into it once, with the GIL released again and the client still
/// locked, so that no other read reuses the receive buffer under it.
pub(crate) fn get_array<'py, C: CacheOps>(
    py: Python<'py>,
    slot: &Mutex<Option<C>>,
    key: &Bound<'py, PyAny>,
) -> PyResult<Option<Bound<'py, PyArray1<u8>>>> {
    let key = key_of(key)?;
    with_locked(py, slot, |c| {
        let found = py
            .detach(|| -> Result<_, Failure> {
                let n = c.buffer_len_of(key).map_err(failure)?;
                let mut placed = c
                    .place_many(&[(key, 0)])
                    .map_err(|e| read_failure("", e, n, n))?;
                placed
                    .pop()
                    .unwrap_or(Ok(None))
                    .map_err(|e| read_failure("", e, n, n))
            })
            .map_err(raise)?;
        let Some(p) = found else {
            return Ok(None);
        };
        let array = empty_bytes(py, c.landed(&p).map_err(to_py_err)?.len())?;
        {
            let mut w = array.try_readwrite()?;
            let dst = w
                .as_slice_mut()
                .map_err(|e| PyValueError::new_err(format!("get: {e}")))?;
            py.detach(|| -> Result<(), Failure> {
                copy_out(dst, c.landed(&p).map_err(failure)?);
                Ok(())
            })
            .map_err(raise)?;
        }
        Ok(Some(array))
    })
}

/// A new uninitialised 1-D uint8 numpy array of `len` bytes
/// (`numpy.empty`): it owns its memory, and nothing writes it before the
/// value is copied in.
fn empty_bytes(py: Python<'_>, len: usize) -> PyResult<Bound<'_, PyArray1<u8>>> {
    let np = crate::ps::numpy_module(py)?;
    let uint8 = np.getattr(intern!(py, "uint8"))?;
    Ok(np
        .call_method1(intern!(py, "empty"), (len, uint8))?
        .cast_into::<PyArray1<u8>>()?)
}

/// `get_into(key, out)`: the value copied into `out` (any writable
/// memory) with the GIL released, or written there by the server when
/// `out` lies in a registered buffer; its length, or None.
pub(crate) fn get_into<C: CacheOps>(
    py: Python<'_>,
    slot: &Mutex<Option<C>>,
    key: &Bound<'_, PyAny>,
    out: &Bound<'_, PyAny>,
) -> PyResult<Option<usize>> {
    let key = key_of(key)?;
    let mut out = Mem::output(out, "out")?;
    let cap = out.len();
    detached(py, slot, |c| {
        let dst = out.bytes_mut().map_err(|_| read_only_failure())?;
        let place = [(dst.as_mut_ptr() as usize, cap)];
        if let Some(r) = c.read_registered(&[key], &place) {
            let n = c.buffer_len_of(key).map_err(failure)?;
            return r
                .map_err(failure)?
                .pop()
                .unwrap_or(Ok(None))
                .map_err(|e| read_failure("", e, cap, n));
        }
        read_detached(c, key, cap, |v| {
            copy_into(dst, v, String::new)?;
            Ok(v.len())
        })
    })
}

fn read_only_failure() -> Failure {
    (ErrorCode::Malformed, "out is read-only".to_string())
}

/// The byte ranges of one buffer holding many values, from `offsets`
/// and `sizes` (one int for all, or one per value): each range inside
/// the buffer of `len` bytes, else ValueError naming the item.
fn slots_of(
    what: &str,
    n: usize,
    len: usize,
    offsets: Vec<usize>,
    sizes: Option<&Bound<'_, PyAny>>,
) -> PyResult<Vec<(usize, usize)>> {
    if offsets.len() != n {
        return Err(PyValueError::new_err(format!(
            "{what}: {n} keys but {} offsets",
            offsets.len()
        )));
    }
    let sizes: Vec<usize> = match sizes {
        None => {
            return Err(PyValueError::new_err(format!(
                "{what}: with offsets, give sizes too (one int for every value, or one per value)"
            )))
        }
        Some(s) if s.is_instance_of::<PyInt>() => vec![s.extract()?; n],
        Some(s) => s.extract()?,
    };
    if sizes.len() != n {
        return Err(PyValueError::new_err(format!(
            "{what}: {n} keys but {} sizes",
            sizes.len()
        )));
    }
    offsets
        .into_iter()
        .zip(sizes)
        .enumerate()
        .map(|(i, (off, size))| match off.checked_add(size) {
            Some(end) if end <= len => Ok((off, size)),
            _ => Err(PyValueError::new_err(format!(
                "{what}: item {i} at offset {off} of {size} bytes runs past the {len}-byte buffer"
            ))),
        })
        .collect()
}

/// The caller's memory of a batch: one buffer per value, or one buffer
/// cut into slots (offset, size).
pub(crate) enum Many {
    /// A buffer per item.
    Each(Vec<Mem>),
    /// One buffer, item `i` in `slots[i]`.
    Slots(Mem, Vec<(usize, usize)>),
}

impl Many {
    /// `bufs` (a list of buffers, or one buffer with `offsets` and
    /// `sizes`) for `n` items, to read (`write` false) or to fill.
    pub(crate) fn of(
        what: &str,
        n: usize,
        bufs: &Bound<'_, PyAny>,
        offsets: Option<Vec<usize>>,
        sizes: Option<&Bound<'_, PyAny>>,
        write: bool,
    ) -> PyResult<Many> {
        let mem = |o: &Bound<'_, PyAny>| {
            if write {
                Mem::output(o, what)
            } else {
                Mem::input(o, what)
            }
        };
        match offsets {
            Some(offsets) => {
                let m = mem(bufs)?;
                let slots = slots_of(what, n, m.len(), offsets, sizes)?;
                Ok(Many::Slots(m, slots))
            }
            None => {
                if sizes.is_some() {
                    return Err(PyValueError::new_err(format!(
                        "{what}: sizes go with offsets (one buffer holding every value)"
                    )));
                }
                if !(bufs.is_instance_of::<PyList>() || bufs.is_instance_of::<PyTuple>()) {
                    return Err(PyTypeError::new_err(format!(
                        "{what}: a list of buffers, or one buffer with offsets= and sizes=, \
                         not {}",
                        type_name(bufs)
                    )));
                }
                let items: Vec<Bound<'_, PyAny>> = bufs.extract()?;
                if items.len() != n {
                    return Err(PyValueError::new_err(format!(
                        "{what}: {n} keys but {} {what}",
                        items.len()
                    )));
                }
                Ok(Many::Each(items.iter().map(mem).collect::<PyResult<_>>()?))
            }
        }
    }

    /// Bytes of item `i`'s place.
    fn cap(&self, i: usize) -> usize {
        match self {
            Many::Each(v) => v[i].len(),
            Many::Slots(_, s) => s[i].1,
        }
    }

    /// Item `i`'s bytes, to read.
    fn get(&self, i: usize) -> &[u8] {
        match self {
            Many::Each(v) => v[i].bytes(),
            Many::Slots(m, s) => &m.bytes()[s[i].0..s[i].0 + s[i].1],
        }
    }

    /// Item `i`'s place, to fill.
    fn get_mut(&mut self, i: usize) -> Result<&mut [u8], Failure> {
        match self {
            Many::Each(v) => v[i].bytes_mut().map_err(|_| read_only_failure()),
            Many::Slots(m, s) => {
                let (off, size) = s[i];
                Ok(&mut m.bytes_mut().map_err(|_| read_only_failure())?[off..off + size])
            }
        }
    }
}

/// `get_many_into(keys, outs)`: each value read into its place in
/// `outs` (see [`Many`]) by [`CacheOps::read_each`], all with the GIL
/// released, copied out as it lands; each value's length, None for an
/// absent key (its place untouched). A failure ends the call: earlier
/// places may be filled, later ones are untouched. Where every place lies
/// in one registered buffer of the client, the server writes the values
/// there instead ([`CacheOps::read_registered`]), all keys at once, so on
/// a failure later places may be filled too.
pub(crate) fn get_many_into<C: CacheOps>(
    py: Python<'_>,
    slot: &Mutex<Option<C>>,
    buffer_bytes: usize,
    keys: &[&[u8]],
    mut outs: Many,
) -> PyResult<Vec<Option<usize>>> {
    let n = buffer_bytes;
    detached(py, slot, |c| {
        let places = (0..keys.len())
            .map(|i| outs.get_mut(i).map(|d| (d.as_mut_ptr() as usize, d.len())))
            .collect::<Result<Vec<_>, Failure>>()?;
        if let Some(r) = c.read_registered(keys, &places) {
            let results = r.map_err(|e| (e.code(), format!("get_many_into: {e}")))?;
            return results
                .into_iter()
                .enumerate()
                .map(|(i, r)| {
                    r.map_err(|e| {
                        read_failure(&format!("get_many_into key {i}: "), e, places[i].1, n)
                    })
                })
                .collect();
        }
        let items: Vec<(&[u8], usize)> = keys
            .iter()
            .enumerate()
            .map(|(i, k)| (*k, outs.cap(i)))
            .collect();
        let mut lengths = Vec::with_capacity(keys.len());
        let mut failed: Option<Failure> = None;
        let mut take = |i: usize, r: fabrickv_client::Result<Option<&[u8]>>| {
            let context = || format!("get_many_into key {i}: ");
            let step = match r {
                Err(e) => Err(read_failure(&context(), e, outs.cap(i), n)),
                Ok(None) => Ok(None),
                Ok(Some(v)) => outs
                    .get_mut(i)
                    .and_then(|dst| copy_into(dst, v, context))
                    .map(|()| Some(v.len())),
            };
            match step {
                Ok(len) => {
                    lengths.push(len);
                    true
                }
                Err(f) => {
                    failed = Some(f);
                    false
                }
            }
        };
        c.read_each(&items, n, &mut take)
            .map_err(|e| (e.code(), format!("get_many_into: {e}")))?;
        match failed {
            Some(f) => Err(f),
            None => Ok(lengths),
        }
    })
}

/// `put(key, value, ttl)`: the value read in place with the GIL
/// released; its generation.
pub(crate) fn put<C: CacheOps>(
    py: Python<'_>,
    slot: &Mutex<Option<C>>,
    key: &Bound<'_, PyAny>,
    value: &Bound<'_, PyAny>,
    ttl: Option<f64>,
) -> PyResult<u64> {
    let key = key_of(key)?;
    let value = Mem::input(value, "value")?;
    let ttl = crate::ttl_of(ttl)?;
    detached(py, slot, |c| {
        c.put_value(key, value.bytes(), ttl).map_err(failure)
    })
}

/// Stores each key's value of `values`, all with `ttl`, through
/// [`CacheOps::put_values`] (pipelined; a cluster's batch split by
/// server); their generations. On an error the error names the first
/// failing item's index; the other items may be stored.
pub(crate) fn put_many_of<C: CacheOps>(
    py: Python<'_>,
    slot: &Mutex<Option<C>>,
    keys: &[&[u8]],
    values: &Many,
    ttl: Option<Duration>,
    call: &str,
) -> PyResult<Vec<u64>> {
    detached(py, slot, |c| {
        let items: Vec<(&[u8], &[u8])> = keys
            .iter()
            .enumerate()
            .map(|(i, k)| (*k, values.get(i)))
            .collect();
        let results = c
            .put_values(&items, ttl)
            .map_err(|e| (e.code(), format!("{call}: {e}")))?;
        let mut generations = Vec::with_capacity(keys.len());
        for (i, r) in results.into_iter().enumerate() {
            match r {
                Ok(g) => generations.push(g),
                Err(e) => return Err((e.code(), format!("{call} item {i}: {e}"))),
            }
        }
        if generations.len() != keys.len() {
            return Err((
                ErrorCode::Internal,
                format!(
                    "{call}: {} results for {} items",
                    generations.len(),
                    keys.len()
                ),
            ));
        }
        Ok(generations)
    })
}

/// `put_many([(key, value), ...], ttl)`.
pub(crate) fn put_many<C: CacheOps>(
    py: Python<'_>,
    slot: &Mutex<Option<C>>,
    items: Vec<(Bound<'_, PyAny>, Bound<'_, PyAny>)>,
    ttl: Option<f64>,
) -> PyResult<Vec<u64>> {
    let ttl = crate::ttl_of(ttl)?;
    let keys: Vec<&[u8]> = items
        .iter()
        .map(|(k, _)| key_of(k))
        .collect::<PyResult<_>>()?;
    let values = Many::Each(
        items
            .iter()
            .map(|(_, v)| Mem::input(v, "value"))
            .collect::<PyResult<_>>()?,
    );
    put_many_of(py, slot, &keys, &values, ttl, "put_many")
}

/// `exists_many`, `delete_many`: one round trip per server for up to
/// `CACHE_BATCH_KEYS_MAX` keys.
pub(crate) fn key_ops<C: CacheOps>(
    py: Python<'_>,
    slot: &Mutex<Option<C>>,
    keys: &[Bound<'_, PyAny>],
    delete: bool,
) -> PyResult<Vec<bool>> {
    let keys = keys_of(keys)?;
    detached(py, slot, |c| {
        if delete {
            c.delete_keys(&keys)
        } else {
            c.exists_keys(&keys)
        }
        .map_err(failure)
    })
}

/// `prefix_hits(keys)`: how many leading keys are live. Asked in rounds
/// of `CACHE_BATCH_KEYS_MAX` keys (one round trip per server each), and
/// no round is asked after one that holds a miss.
pub(crate) fn prefix_hits<C: CacheOps>(
    py: Python<'_>,
    slot: &Mutex<Option<C>>,
    keys: &[Bound<'_, PyAny>],
) -> PyResult<usize> {
    let keys = keys_of(keys)?;
    detached(py, slot, |c| {
        let mut hits = 0;
        for round in keys.chunks(CACHE_BATCH_KEYS_MAX) {
            let flags = c.exists_keys(round).map_err(failure)?;
            let lead = flags.iter().take_while(|f| **f).count();
            hits += lead;
            if lead < round.len() {
                break;
            }
        }
        Ok(hits)
    })
}

/// A client of the server's KV cache: large values (up to 64 MiB, say a
/// layer block of attention keys and values) with an optional time to
/// live, read through a receive buffer of `buffer_mb` MiB.
///
/// `CacheClient(addr, buffer_mb=64, timeout=5.0)`: `addr` is `HOST:PORT`,
/// `tcp://HOST:PORT` or `shm://NAME`; over shm the server writes values
/// into the receive buffer itself (`one_sided`). `buffer_mb` bounds the
/// largest value this client can read; `timeout` (seconds) bounds
/// connecting and each call. Values and outputs are numpy arrays, any
/// C-contiguous buffer (bytes, bytearray, memoryview) or CPU tensors with
/// `__dlpack__` (torch, bfloat16 included), of any dtype, taken as raw
/// bytes; keys are bytes or str (UTF-8), at most 1024 bytes.
///
/// One client may be shared by threads, whose calls then take turns (open
/// one per thread to run them in parallel, or use `AsyncCacheClient`).
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
    /// Whether `register_buffer` lent memory to arrays; where `close()`
    /// then keeps the Rust client.
    lent: Lent<RustCacheClient>,
}

cache_calls!(CacheClient, "");
closable_client!(
    CacheClient,
    "Closes the connection and frees the receive buffer; later calls \
     raise `fabrickv.Error` (`UNAVAILABLE`). Closing twice is harmless. \
     A client that registered buffers keeps its connection, and the \
     memory, until the last array over that memory is freed.",
    lent = lent
);
addr_and_timeout!(CacheClient);

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
            lent: Lent::default(),
        })
    }

    /// A new numpy array (uint8, 1-D, `nbytes` long, zeroed) in memory
    /// registered with the server (shm, fabric): `get_many_into` with
    /// every place inside it has the server write each value there
    /// itself, so nothing is copied on this side (as an RDMA read into a
    /// registered region). View it as any dtype (`arr.view(np.float16)`,
    /// `torch.from_numpy`); slices and views of it count as inside it.
    /// The memory lives as long as any array over it does, even past
    /// `close()`. `fabrickv.Error` with code `UNAVAILABLE` where the
    /// transport registers no memory (tcp): use a plain array there;
    /// `INSUFFICIENT_SPACE` past 64 buffers per client.
    fn register_buffer<'py>(
        slf: &Bound<'py, Self>,
        nbytes: usize,
    ) -> PyResult<Bound<'py, PyArray1<u8>>> {
        let py = slf.py();
        let this = slf.get();
        let (ptr, len) = detached(py, &this.inner, |c| {
            let r = c.register_buffer(nbytes).map_err(failure)?;
            let bytes = c.registered(&r).map_err(failure)?;
            Ok((bytes.as_mut_ptr() as usize, bytes.len()))
        })?;
        this.lent.array(slf.as_any(), ptr as *mut u8, len)
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
