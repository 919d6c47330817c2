//! The request layer over the transport contract, in the manner of RDMA
//! RPC frameworks (eRPC, and the PetPS parameter server's RPC framework).
//!
//! Layout:
//! - [`session`]: the connection layer every client of this workspace
//!   stands on (the kv, ps, cache and shard clients of `fabrickv-client`
//!   and [`RpcClient`]): sessions bound to one server worker each, request
//!   ids, requests in flight in request order, credits and deadlines;
//! - [`worker`]: which server worker a key, a client or a request goes to;
//! - [`header`]: the 16-byte header every message of [`RpcClient`] and
//!   [`RpcServer`] carries (the native FabricKV frames of `fabrickv-wire`
//!   carry their own, and travel through [`session`] all the same);
//! - [`server`]: a handler table by request type and server threads that
//!   run handlers to completion, with the batching knobs;
//! - [`client`]: [`RpcClient`], sessions with per-request timeouts, reply
//!   slots and client-to-server-thread affinity, over [`session`]
//!   (measured by `fabrickv bench rpc`).
//!
//! The transport gives reliable, ordered messages on connections bound to
//! one server thread; this layer adds request types, matching of replies
//! to requests, flow control and timeouts.

pub mod client;
pub mod header;
pub mod server;
pub mod session;
#[cfg(feature = "testsuite")]
#[allow(clippy::unwrap_used)]
pub mod testsuite;
pub mod worker;

pub use client::{Affinity, Completion, RpcClient, RpcClientConfig};
pub use header::{RpcHeader, RpcStatus, RPC_HEADER_BYTES};
pub use server::{Handler, Handlers, ReplySlots, RpcServer, ServerKnobs};
pub use session::{InFlight, Sent, Session, Sessions};

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
    /// A reply answered a request other than the oldest in flight on its
    /// connection (`expected`, `None` when none was): the connection is
    /// out of step.
    OutOfOrder {
        /// The request id the reply carried.
        got: u64,
        /// The oldest request in flight, if any.
        expected: Option<u64>,
    },
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
            RpcError::OutOfOrder {
                got,
                expected: Some(e),
            } => write!(f, "reply to request {got} where {e} was next"),
            RpcError::OutOfOrder {
                got,
                expected: None,
            } => write!(f, "reply to request {got} with none in flight"),
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
