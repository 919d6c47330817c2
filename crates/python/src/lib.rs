//! `fabrickv`: the Python extension module.
//!
//! Layout: this file has the module's init (which installs the transports
//! beyond tcp, so that `shm://NAME` addresses connect, as the `fabrickv`
//! binary does at start), the one exception class [`Error`] and the helpers
//! that turn Rust errors into it; [`kv`] has the key-value `Client` (with
//! its table methods), [`ps`] the embedding `Table` and its pulls, [`cache`]
//! the KV-cache `CacheClient` (values into caller-provided buffers),
//! [`cluster`] the clients of a whole cluster (`Cluster`, `ClusterTable`,
//! `ClusterCache`) and the registry's `barrier` and `lookup`, [`lazy`]
//! the embedding connection made on first use that `Client` and `Cluster`
//! share with their tables, and [`macros`] the methods several of those classes share (closing and
//! `with`, `addr` and `timeout`, the kv calls of `Client` and `Cluster`,
//! their `create_table`, the cache writes, the table writes), written once. Each
//! further file registers its classes from [`fabrickv`] through its own
//! `register` function.
//!
//! Every network call releases the GIL (`Python::detach`), so other Python
//! threads run while one waits on the server.

#[macro_use]
mod macros;

// The one place this crate reads raw caller memory (buffer views and
// DLPack tensors); its header states the soundness rules.
#[allow(unsafe_code)]
mod buffers;
mod cache;
mod cluster;
mod kv;
mod lazy;
mod ps;
// Arrays over memory the transport registered; its header states why
// no array outlives that memory.
#[allow(unsafe_code)]
mod registered;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use fabrickv_client::ClientError;
use fabrickv_types::ErrorCode;
use pyo3::exceptions::{PyException, PyValueError};
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

/// Why a call made with the GIL released failed: a code and the words,
/// turned into a `fabrickv.Error` once the GIL is held again.
pub(crate) type Failure = (ErrorCode, String);

/// A client error as a [`Failure`], which crosses back to the GIL.
pub(crate) fn failure(e: ClientError) -> Failure {
    (e.code(), e.to_string())
}

/// The `fabrickv.Error` of a [`Failure`].
pub(crate) fn raise((code, message): Failure) -> PyErr {
    error(code, message)
}

/// Runs `f` with the GIL released on the Rust client in `slot` (`None`
/// once closed). The lock is taken with the GIL released too: a thread
/// waiting for another thread's call must not stop every other Python
/// thread.
pub(crate) fn call_locked<C, T, F>(py: Python<'_>, slot: &Mutex<Option<C>>, f: F) -> PyResult<T>
where
    C: Send,
    T: Send,
    F: FnOnce(&mut C) -> fabrickv_client::Result<T> + Send,
{
    py.detach(|| -> Result<T, Failure> {
        let mut guard = slot.lock().map_err(|_| {
            (
                ErrorCode::Internal,
                "an earlier call on this client panicked; open a new client".to_string(),
            )
        })?;
        let client = guard
            .as_mut()
            .ok_or_else(|| (ErrorCode::Unavailable, "the client is closed".to_string()))?;
        f(client).map_err(failure)
    })
    .map_err(raise)
}

/// Closes the client in `slot`: sets `closed` (read by `closed` and
/// `repr` without the lock, so that they never wait for a call in flight),
/// then takes the client out, waiting with the GIL released for a call in
/// flight on another thread, and drops it (closing its connections) with
/// the GIL still released. A client poisoned by a panic is closed all the
/// same; closing twice is harmless.
pub(crate) fn close_slot<C: Send>(py: Python<'_>, slot: &Mutex<Option<C>>, closed: &AtomicBool) {
    closed.store(true, Ordering::Release);
    py.detach(|| drop(slot.lock().unwrap_or_else(PoisonError::into_inner).take()));
}

/// A timeout in seconds from Python: a positive, finite number.
pub(crate) fn timeout_of(timeout: f64) -> PyResult<Duration> {
    if !(timeout.is_finite() && timeout > 0.0) {
        return Err(PyValueError::new_err(format!(
            "timeout must be a positive number of seconds, not {timeout}"
        )));
    }
    Duration::try_from_secs_f64(timeout)
        .map_err(|e| PyValueError::new_err(format!("timeout {timeout} s: {e}")))
}

/// A TTL in seconds from Python as a duration; `None` is no expiry.
pub(crate) fn ttl_of(ttl: Option<f64>) -> PyResult<Option<Duration>> {
    match ttl {
        None => Ok(None),
        Some(s) if s.is_finite() && s > 0.0 => Duration::try_from_secs_f64(s)
            .map(Some)
            .map_err(|e| PyValueError::new_err(format!("ttl {s} s: {e}"))),
        Some(s) => Err(PyValueError::new_err(format!(
            "ttl must be a positive number of seconds or None, not {s}"
        ))),
    }
}

/// FabricKV client: `fabrickv.Client(addr)` for keys and values and its
/// embedding tables (`fabrickv.Table`, numpy arrays), `fabrickv.Error`
/// (with a stable `.code`) for every failed call.
//
// The module's init: the exception, then each file's classes.
/// Makes every connection this process opens from now on prove the
/// cluster secret held in the file at `path` (chmod 600), as the CLI's
/// `--auth-token-file` does; `None` goes back to the environment
/// (`FABRICKV_AUTH_TOKEN`, or the file `FABRICKV_AUTH_TOKEN_FILE` names),
/// which is what a process uses when it never calls this. The secret
/// itself is never an argument: it would sit in scripts and histories.
#[pyfunction]
#[pyo3(signature = (path))]
fn set_auth_token_file(path: Option<std::path::PathBuf>) -> PyResult<()> {
    let secret = match path {
        Some(p) => Some(
            fabrickv_auth::Secret::from_file(&p)
                .map_err(|e| error(ErrorCode::AuthRequired, e.to_string()))?,
        ),
        None => {
            fabrickv_auth::clear_client_secret();
            return Ok(());
        }
    };
    fabrickv_auth::set_client_secret(secret);
    Ok(())
}

/// The native part of the `fabrickv` package, `fabrickv._native`; the
/// package's `__init__.py` re-exports every name.
#[pymodule]
#[pyo3(name = "_native")]
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
    cluster::register(m)?;
    m.add_function(wrap_pyfunction!(set_auth_token_file, m)?)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
