//! `fabrickv`: the Python extension module.
//!
//! Layout: this file has the module's init (which installs the transports
//! beyond tcp, so that `shm://NAME` addresses connect, as the `fabrickv`
//! binary does at start), the one exception class [`Error`] and the helpers
//! that turn Rust errors into it; [`kv`] has the key-value `Client` (with
//! its table methods), [`ps`] the embedding `Table` and its pulls, [`cache`]
//! the KV-cache `CacheClient` (values into caller-provided buffers). Each
//! further file registers its classes from [`fabrickv`] through its own
//! `register` function.
//!
//! Every network call releases the GIL (`Python::detach`), so other Python
//! threads run while one waits on the server.

mod cache;
mod kv;
mod ps;

use fabrickv_client::ClientError;
use fabrickv_types::ErrorCode;
use pyo3::exceptions::PyException;
use pyo3::prelude::*;

pyo3::create_exception!(
    fabrickv,
    Error,
    PyException,
    "A FabricKV call failed. `code` is the stable error-code name (for example \
     \"VALUE_TOO_LARGE\", \"TIMEOUT\", \"UNAVAILABLE\"); the message says why."
);

/// The Python exception for a failed client call: `fabrickv.Error` with the
/// error's stable code name in `.code` and its Display as the message.
pub(crate) fn to_py_err(e: ClientError) -> PyErr {
    error(e.code(), e.to_string())
}

/// A `fabrickv.Error` with `code` and `message`.
pub(crate) fn error(code: ErrorCode, message: impl Into<String>) -> PyErr {
    let message = message.into();
    Python::attach(|py| {
        let made = py
            .get_type::<Error>()
            .call1((message.as_str(),))
            .and_then(|exc| {
                exc.setattr("code", code.name())?;
                Ok(PyErr::from_value(exc))
            });
        // Building the exception fails only if Python is out of memory or
        // the class was tampered with; raise that failure instead.
        made.unwrap_or_else(|e| e)
    })
}

/// FabricKV client: `fabrickv.Client(addr)` for keys and values and its
/// embedding tables (`fabrickv.Table`, numpy arrays), `fabrickv.Error`
/// (with a stable `.code`) for every failed call.
//
// The module's init: the exception, then each file's classes.
#[pymodule]
fn fabrickv(m: &Bound<'_, PyModule>) -> PyResult<()> {
    fabrickv_transport_shm::install();
    let py = m.py();
    let error = py.get_type::<Error>();
    // Instances raised by this module carry their own `code`; the class
    // attribute makes `.code` readable on any instance (None if unknown).
    error.setattr("code", py.None())?;
    m.add("Error", error)?;
    kv::register(m)?;
    ps::register(m)?;
    cache::register(m)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
