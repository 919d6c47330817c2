//! What the gRPC server needs from the store.
//!
//! The control plane does not know how values are kept or how bytes reach a
//! client's buffer: the store and the data-plane transports do. This trait is
//! the seam between them, so the service can be tested against a fake and the
//! store can be built without tonic.

use fabrickv_types::ErrorCode;
use prost::bytes::Bytes;

/// The store behind the `KvCache` service.
///
/// Every request has already been checked against the limits in
/// `fabrickv_types::limits` (key length, value length, ttl) before a method
/// is called, so implementations need not check them again.
///
/// Methods are synchronous and may block briefly or copy megabytes: the
/// server calls them on tokio's blocking pool, never on the thread that
/// drives the network. Errors carry a stable [`ErrorCode`], which reaches the
/// client unchanged.
pub trait CacheBackend: Send + Sync + 'static {
    /// Stores `value` under `key`, replacing any earlier value. `ttl_ms` is
    /// the time to live in milliseconds; 0 means none.
    fn put(&self, key: &[u8], value: &[u8], ttl_ms: u64) -> Result<(), BackendError>;

    /// Stores under `key` the bytes of `from`, read over the data plane
    /// before this returns. A range outside the buffer is
    /// [`ErrorCode::BufferTooSmall`]; an unknown client is
    /// [`ErrorCode::NoSuchClient`].
    fn put_from_client(
        &self,
        key: &[u8],
        from: ClientRange,
        ttl_ms: u64,
    ) -> Result<(), BackendError>;

    /// Returns the value stored under `key`, or `None` when it is missing or
    /// expired.
    fn get(&self, key: &[u8]) -> Result<Option<Fetched>, BackendError>;

    /// Writes the value stored under `key` into registered client
    /// `client_id`'s receive buffer, at `offset` or, when `None`, at an
    /// offset of the backend's choosing, and says where it went. Returns
    /// `None` when the key is missing (nothing is written). A value that does
    /// not fit is [`ErrorCode::BufferTooSmall`], with nothing written.
    fn get_to_client(
        &self,
        key: &[u8],
        client_id: u64,
        offset: Option<u64>,
    ) -> Result<Option<Placed>, BackendError>;

    /// Removes `key`; returns whether a value was stored under it.
    fn delete(&self, key: &[u8]) -> Result<bool, BackendError>;

    /// Tells whether a live value is stored under `key`.
    fn exists(&self, key: &[u8]) -> Result<bool, BackendError>;

    /// Registers a client for `caller` (or replaces the registration with
    /// the same id) and assigns an id when [`Registration::client_id`] is
    /// 0. A backend may refuse a caller that holds too many registrations,
    /// and a registration that `caller` does not own (then as
    /// [`ErrorCode::NoSuchClient`], as an unknown id).
    fn register(
        &self,
        caller: &Caller,
        registration: Registration,
    ) -> Result<Registered, BackendError>;

    /// Renews `client_id`'s registration; returns the milliseconds until it
    /// lapses. An unknown or lapsed client, or one `caller` may not act
    /// for, is [`ErrorCode::NoSuchClient`].
    fn heartbeat(&self, caller: &Caller, client_id: u64) -> Result<u64, BackendError>;

    /// Releases `client_id`'s registration; returns whether it existed
    /// (and `caller` could act for it).
    fn unregister(&self, caller: &Caller, client_id: u64) -> Result<bool, BackendError>;

    /// The store's counters, read without failing (a stats call is how an
    /// operator finds out what is wrong, so it must not itself error).
    fn stats(&self) -> StatsSnapshot;
}

/// A failed backend call: a stable code for programs, a message for people.
///
/// The service uses the same type for the requests it refuses itself, so
/// that every error, wherever it arose, reaches the client the same way.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{code}: {message}")]
pub struct BackendError {
    /// The stable FabricKV code; it becomes the `fabrickv-code` metadata.
    pub code: ErrorCode,
    /// Detail for a person reading logs; not for matching.
    pub message: String,
}

impl BackendError {
    /// An error with `code` and a message.
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        BackendError {
            code,
            message: message.into(),
        }
    }
}

/// Bytes of a registered client's receive buffer, where
/// [`CacheBackend::put_from_client`] reads a value: a type of its own, so
/// that the three numbers cannot be passed in the wrong order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClientRange {
    /// The registered client whose buffer holds the value.
    pub client_id: u64,
    /// Offset of the value's first byte in that buffer.
    pub offset: u64,
    /// Length of the value in bytes.
    pub len: u64,
}

/// A value returned inline by [`CacheBackend::get`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fetched {
    /// The value. `Bytes` so that a backend holding reference-counted
    /// buffers can hand one out, and the reply can carry it, without a copy.
    pub value: Bytes,
    /// Milliseconds until the entry expires; 0 when it has no ttl.
    pub expires_in_ms: u64,
}

/// Where [`CacheBackend::get_to_client`] wrote a value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Placed {
    /// Offset of the value's first byte in the client's receive buffer.
    pub offset: u64,
    /// Length of the value in bytes.
    pub length: u64,
    /// Milliseconds until the entry expires; 0 when it has no ttl.
    pub expires_in_ms: u64,
}

/// Who made a control-plane call, so that a backend can bind a client's
/// registration to the one who made it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Caller {
    /// The address of the gRPC connection's peer; `None` for a call that
    /// came from no socket (in-process tests).
    pub peer: Option<std::net::SocketAddr>,
}

/// A client announcing itself (the RegisterClient request).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Registration {
    /// The id the client asks for; 0 lets the backend assign one.
    pub client_id: u64,
    /// The client's data-plane addresses and region descriptors, as opaque
    /// strings that only the transports interpret.
    pub addresses: Vec<String>,
    /// Size of the receive buffer the client exposes, in bytes; 0 for none.
    pub receive_buffer_bytes: u64,
}

/// The backend's answer to a [`Registration`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Registered {
    /// The client's id: the requested one, or the assigned one.
    pub client_id: u64,
    /// How often the client should send heartbeats, in milliseconds.
    pub heartbeat_interval_ms: u64,
    /// How long without a heartbeat before the registration lapses, in ms.
    pub heartbeat_timeout_ms: u64,
    /// The server's data-plane addresses, as opaque transport strings.
    pub data_plane: Vec<String>,
}

/// The store's counters at one moment.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct StatsSnapshot {
    /// Counters by name. The names are the backend's; the service passes
    /// them through unchanged.
    pub counters: Vec<(String, u64)>,
    /// Fragmentation of the memory pool, 0.0 (none) to 1.0.
    pub fragmentation: f64,
}
