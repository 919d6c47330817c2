//! A Rust client made on its first call and shared behind a mutex
//! ([`Lazy`]): the embedding connection of a `fabrickv.Client` (a
//! `PsClient`) and of a `fabrickv.Cluster` (a `ClusterPs`), so that a
//! key-value user pays for no second connection and no receive region.

use std::sync::{Mutex, PoisonError, TryLockError};

use fabrickv_types::ErrorCode;
use pyo3::prelude::*;

use crate::{failure, raise, Failure};

/// Where a lazily made connection stands.
enum LazyState<C> {
    /// No call yet: nothing connected, so a key-value user pays for no
    /// second connection and no receive region.
    Idle,
    /// Connected. Boxed: the state is one per client, so the indirection
    /// costs nothing and keeps `Idle` and `Closed` small.
    Open(Box<C>),
    /// The owning client's `close()` ran; no reconnecting.
    Closed,
}

/// Makes a lazy connection's client on first use.
type Connect<C> = Box<dyn Fn() -> fabrickv_client::Result<C> + Send + Sync>;

/// A client made on its first call and shared behind a mutex (Python
/// threads share it while the Rust client needs `&mut`): the embedding
/// connection of a `Client` (a [`PsClient`]) or of a `Cluster` (a
/// `ClusterPs`).
pub(crate) struct Lazy<C> {
    connect: Connect<C>,
    state: Mutex<LazyState<C>>,
}

impl<C: Send> Lazy<C> {
    /// A connection made by `connect` when first used.
    pub(crate) fn new(connect: Connect<C>) -> Lazy<C> {
        Lazy {
            connect,
            state: Mutex::new(LazyState::Idle),
        }
    }

    /// Runs `f` on the Rust client with the GIL released, connecting first
    /// if this is the first call.
    pub(crate) fn call<T, F>(&self, py: Python<'_>, f: F) -> PyResult<T>
    where
        T: Send,
        F: FnOnce(&mut C) -> fabrickv_client::Result<T> + Send,
    {
        self.call_after(py, |_| {}, f)
    }

    /// As [`Lazy::call`], with `before` run on the client first (under the
    /// same lock).
    pub(crate) fn call_after<T, F>(
        &self,
        py: Python<'_>,
        before: impl FnOnce(&mut C) + Send,
        f: F,
    ) -> PyResult<T>
    where
        T: Send,
        F: FnOnce(&mut C) -> fabrickv_client::Result<T> + Send,
    {
        // The lock is taken with the GIL released too: a thread waiting for
        // another thread's pull must not stop every other Python thread.
        py.detach(|| -> Result<T, Failure> {
            let mut guard = self.state.lock().map_err(|_| {
                (
                    ErrorCode::Internal,
                    "an earlier call on this client panicked; open a new client".to_string(),
                )
            })?;
            if matches!(*guard, LazyState::Idle) {
                // A failed connect leaves the state idle: the next call
                // tries again, as a fresh client would.
                let client = (self.connect)().map_err(failure)?;
                *guard = LazyState::Open(Box::new(client));
            }
            let LazyState::Open(client) = &mut *guard else {
                return Err((ErrorCode::Unavailable, "the client is closed".to_string()));
            };
            before(client);
            f(client).map_err(failure)
        })
        .map_err(raise)
    }

    /// Runs `f` on the client if it is open and free now, without waiting;
    /// `Err(())` if another thread holds it.
    pub(crate) fn try_with(&self, f: impl FnOnce(&mut C)) -> Result<(), ()> {
        match self.state.try_lock() {
            Ok(mut guard) => {
                if let LazyState::Open(client) = &mut *guard {
                    f(client);
                }
                Ok(())
            }
            Err(TryLockError::WouldBlock) => Err(()),
            // A client poisoned by a panic refuses every later call; its
            // pulls die with it.
            Err(TryLockError::Poisoned(_)) => Ok(()),
        }
    }

    /// Drops the connection (waiting, GIL released, for a call in flight
    /// on another thread); later calls raise `UNAVAILABLE`.
    pub(crate) fn close(&self, py: Python<'_>) {
        let old = py.detach(|| {
            std::mem::replace(
                &mut *self.state.lock().unwrap_or_else(PoisonError::into_inner),
                LazyState::Closed,
            )
        });
        drop(old);
    }
}
