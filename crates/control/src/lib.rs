//! The gRPC control plane of FabricKV's KV-cache service.
//!
//! The values of an LLM KV cache are large (up to [`CACHE_VALUE_BYTES_MAX`])
//! and are meant to travel over FabricKV's own data-plane transports, written
//! straight into a client's registered receive buffer. What to move, and
//! where, is negotiated here, over gRPC (`fabrickv.cache.v1.KvCache`, see
//! `proto/fabrickv/cache/v1/cache.proto` and `docs/grpc.md`). Clients that have
//! no data-plane transport carry values inline in the gRPC messages instead.
//!
//! Layout:
//! - [`auth`]: the cluster secret as a bearer token, checked on every
//!   call by the server and added to every call by the client.
//! - [`backend`]: the [`CacheBackend`] trait the server calls; the store
//!   itself lives elsewhere and implements it.
//! - [`status`]: how FabricKV's stable [`ErrorCode`]s travel in gRPC statuses.
//! - [`service`]: the `KvCache` implementation, which checks every request
//!   against the limits before the backend sees it.
//! - [`server`]: [`serve`] for callers that own a tokio runtime, and
//!   [`ControlServer`], which runs the server on a thread of its own.
//! - [`client`]: [`ControlClient`], a blocking client.
//! - [`pb`]: the generated messages, async client and server, for callers
//!   that want async or their own tonic setup.
//!
//! [`ErrorCode`]: fabrickv_types::ErrorCode

use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use std::time::Duration;

use fabrickv_types::limits::{CACHE_BATCH_KEYS_MAX, CACHE_KEY_BYTES_MAX, CACHE_VALUE_BYTES_MAX};

pub mod auth;
pub mod backend;
pub mod client;
pub mod server;
pub mod service;
pub mod status;

/// The generated protobuf messages and gRPC stubs of `fabrickv.cache.v1`.
#[allow(
    missing_docs,
    clippy::all,
    clippy::pedantic,
    clippy::unwrap_used,
    unreachable_pub
)]
pub mod pb {
    tonic::include_proto!("fabrickv.cache.v1");

    /// The encoded `FileDescriptorSet` of `cache.proto`, which server
    /// reflection serves so that tools such as grpcurl need no local copy
    /// of the schema.
    pub const FILE_DESCRIPTOR_SET: &[u8] =
        tonic::include_file_descriptor_set!("fabrickv_cache_v1_descriptor");
}

pub use backend::{
    BackendError, CacheBackend, Caller, ClientRange, Fetched, Placed, Registered, Registration,
    StatsSnapshot,
};
pub use client::{
    connect_async, AuthChannel, ClientOptions, ControlClient, ControlError, GetDest, GetItem, Got,
    PutItem, PutSource,
};
pub use pb::kv_cache_client::KvCacheClient;
pub use pb::kv_cache_server::{KvCache, KvCacheServer};
/// The byte buffer values travel in; re-exported so that backends and
/// callers need no direct dependency on the `bytes` crate.
pub use prost::bytes::Bytes;
pub use server::{serve, serve_checked, serve_with_listener, ControlServer, ServeError};
pub use service::CacheService;

/// Where the control plane listens unless told otherwise: IPv6 loopback,
/// port 50051 (the port gRPC examples conventionally use), so that a server
/// started without configuration is not reachable from the network.
pub const DEFAULT_LISTEN_ADDR: SocketAddr = SocketAddr::new(IpAddr::V6(Ipv6Addr::LOCALHOST), 50051);

/// Room for everything in a gRPC message that is not value bytes, in bytes.
///
/// The largest messages are a Put or Get of one maximal value (its key and
/// a few fields beside it) and a batch of [`CACHE_BATCH_KEYS_MAX`] maximal
/// keys (each with its per-item fields and, in replies, a status whose
/// message is at most `ERROR_MESSAGE_BYTES_MAX`). The slack covers the
/// larger of the two with a margin.
pub const GRPC_MESSAGE_SLACK_BYTES: usize = CACHE_BATCH_KEYS_MAX * (CACHE_KEY_BYTES_MAX + 512);

/// Largest gRPC message either side encodes or accepts, in bytes: one
/// maximal value plus [`GRPC_MESSAGE_SLACK_BYTES`].
///
/// tonic's default (4 MiB) is too small for a KV-cache block; an unbounded
/// limit would let one request make the server buffer any amount. Every
/// message that is not rejected by the limits in `fabrickv_types` fits.
pub const GRPC_MESSAGE_BYTES_MAX: usize = CACHE_VALUE_BYTES_MAX + GRPC_MESSAGE_SLACK_BYTES;

/// How long [`ControlClient::connect`] waits for the TCP and HTTP/2
/// handshake before giving up, so that a wrong address fails fast instead
/// of hanging a blocking caller.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// How long one [`ControlClient`] call may take by default, including
/// moving a maximal value over a slow link. A blocking call must end even
/// if the server stops answering.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);

/// HTTP/2 flow-control window per stream, in bytes (both sides).
///
/// The HTTP/2 default of 64 KiB makes a 64 MiB value wait for a thousand
/// window updates; a few MiB lets a large value stream at memory speed on
/// loopback and fill a long fat link.
pub const STREAM_WINDOW_BYTES: u32 = 4 << 20;

/// HTTP/2 flow-control window per connection, in bytes (both sides); twice
/// the stream window so that one large transfer does not starve a small
/// call beside it.
pub const CONNECTION_WINDOW_BYTES: u32 = 2 * STREAM_WINDOW_BYTES;

const _: () = assert!(
    GRPC_MESSAGE_SLACK_BYTES >= CACHE_KEY_BYTES_MAX + 4096,
    "one maximal Put (key, value, fields) fits a message"
);
