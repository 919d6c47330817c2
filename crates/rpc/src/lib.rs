//! An RPC layer over the transport contract, in the manner of RDMA RPC
//! frameworks (eRPC and the seed's framework).
//!
//! Layout:
//! - [`header`]: the 16-byte header every RPC message carries;
//! - [`server`]: a handler table by request type and server threads that
//!   run handlers to completion, with the batching knobs;
//! - [`client`]: sessions with bounded requests in flight (credits),
//!   request ids, per-request timeouts, and client-to-server-thread
//!   affinity.
//!
//! The transport gives reliable, ordered messages on connections bound to
//! one server thread; this layer adds request types, matching of replies
//! to requests, flow control and timeouts.

pub mod client;
pub mod header;
pub mod server;
#[cfg(feature = "testsuite")]
#[allow(clippy::unwrap_used)]
pub mod testsuite;

pub use client::{Affinity, Completion, RpcClient, RpcClientConfig};
pub use header::{RpcHeader, RpcStatus, RPC_HEADER_BYTES};
pub use server::{Handler, Handlers, ReplySlots, RpcServer, ServerKnobs};

use std::fmt;

use fabrickv_transport::TransportError;

/// The request type reserved for session set-up (reply slots).
pub const REQ_TYPE_SESSION: u16 = 0;

/// Most request types a handler table holds (types are `0..REQ_TYPES_MAX`).
pub const REQ_TYPES_MAX: usize = 256;

/// Most requests one session may have in flight.
pub const SESSION_CREDITS_MAX: usize = 4096;

/// Why an RPC call failed.
#[derive(Debug)]
#[non_exhaustive]
pub enum RpcError {
    /// The transport failed.
    Transport(TransportError),
    /// The session has no credit left: poll completions first.
    NoCredits,
    /// No reply before the request's deadline.
    Timeout,
    /// The server answered with a non-OK status.
    Status(RpcStatus),
    /// A bad argument (request type out of range, empty config).
    Invalid(String),
}

impl fmt::Display for RpcError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RpcError::Transport(e) => write!(f, "transport: {e}"),
            RpcError::NoCredits => write!(
                f,
                "no credits left in the session (too many requests in flight)"
            ),
            RpcError::Timeout => write!(f, "request timed out"),
            RpcError::Status(s) => write!(f, "server answered {s:?}"),
            RpcError::Invalid(why) => write!(f, "invalid: {why}"),
        }
    }
}

impl std::error::Error for RpcError {}

impl From<TransportError> for RpcError {
    fn from(e: TransportError) -> Self {
        match e {
            TransportError::Timeout => RpcError::Timeout,
            e => RpcError::Transport(e),
        }
    }
}
