//! Registered memory handed to Python: `CacheClient.register_buffer`.
//!
//! The memory belongs to the client's connection (the transport maps it
//! for the server, and frees it when the connection goes), while the
//! numpy array over it lives as long as Python keeps it. So the array's
//! base object holds the Python client, and a client that lent memory
//! keeps its Rust client (and with it the connection and the memory)
//! after `close()`, closed to calls, until the Python client itself is
//! freed, which cannot happen while any array over its memory is alive.
//! No array can outlive its memory, whatever the caller closes or drops.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, PoisonError};

use numpy::ndarray::ArrayView1;
use numpy::PyArray1;
use pyo3::prelude::*;

/// The base object of an array over registered memory: it keeps the
/// client that owns the memory alive.
#[pyclass(module = "fabrickv", name = "RegisteredMemory", frozen)]
pub(crate) struct RegisteredMemory {
    /// The Python client whose connection registered the memory.
    owner: Py<PyAny>,
    /// Bytes of the memory.
    nbytes: usize,
}

#[pymethods]
impl RegisteredMemory {
    fn __repr__(&self, py: Python<'_>) -> PyResult<String> {
        Ok(format!(
            "<fabrickv.RegisteredMemory nbytes={} of {}>",
            self.nbytes,
            self.owner.bind(py).repr()?
        ))
    }
}

/// Whether a client lent registered memory to arrays, and where `close()`
/// keeps its Rust client when it did.
pub(crate) struct Lent<C> {
    /// Set by the first `register_buffer`.
    lent: AtomicBool,
    /// The Rust client after `close()`, kept until the Python client is
    /// freed.
    kept: Mutex<Option<C>>,
}

impl<C> Default for Lent<C> {
    fn default() -> Self {
        Lent {
            lent: AtomicBool::new(false),
            kept: Mutex::new(None),
        }
    }
}

impl<C: Send> Lent<C> {
    /// `close()` of a client that lent memory: marks it closed and moves
    /// its Rust client out of `slot` into keeping, so calls see a closed
    /// client while the memory stays mapped; true. False (nothing done)
    /// if it lent none, and the caller closes it as usual.
    pub(crate) fn keep(
        &self,
        py: Python<'_>,
        slot: &Mutex<Option<C>>,
        closed: &AtomicBool,
    ) -> bool {
        if !self.lent.load(Ordering::Acquire) {
            return false;
        }
        closed.store(true, Ordering::Release);
        py.detach(|| {
            let c = slot.lock().unwrap_or_else(PoisonError::into_inner).take();
            if c.is_some() {
                *self.kept.lock().unwrap_or_else(PoisonError::into_inner) = c;
            }
        });
        true
    }

    /// A new 1-D uint8 array over `nbytes` of registered memory at `ptr`,
    /// whose base keeps `owner` (the Python client holding this `Lent`
    /// and the memory) alive.
    pub(crate) fn array<'py>(
        &self,
        owner: &Bound<'py, PyAny>,
        ptr: *mut u8,
        nbytes: usize,
    ) -> PyResult<Bound<'py, PyArray1<u8>>> {
        self.lent.store(true, Ordering::Release);
        let base = Bound::new(
            owner.py(),
            RegisteredMemory {
                owner: owner.clone().unbind(),
                nbytes,
            },
        )?;
        // SAFETY: `ptr` is the first of `nbytes` bytes that the client's
        // connection mapped when it registered them; they stay mapped
        // until its Rust client is dropped. That happens only when the
        // Python client `owner` is freed (`close()` moves it into
        // `kept` once memory is lent, see `keep`), and the array's base
        // holds `owner`, so the memory outlives the array. The view is
        // only read for its shape and pointer.
        let view = unsafe { ArrayView1::from_shape_ptr(nbytes, ptr.cast_const()) };
        // SAFETY: as above; the base is set to `base`, which owns
        // nothing the array points into but keeps its owner alive.
        Ok(unsafe { PyArray1::borrow_from_array(&view, base.into_any()) })
    }
}
