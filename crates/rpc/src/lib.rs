//! The request layer over the transport contract, in the manner of RDMA
//! RPC frameworks (eRPC, and the PetPS parameter server's RPC framework):
//! one layer for both sides of every FabricKV request.
//!
//! Layout, server side:
//! - [`service`]: what a service is (the [`Service`] trait), what it is
//!   handed ([`Call`]), the clock, and how a refused frame is answered;
//! - [`worker`]: one worker's request layer (decode once, refuse once,
//!   dispatch by kind through the table services register in) and its
//!   run-to-completion loop; the STATS service;
//! - [`echo`]: the echo service, for `fabrickv bench rpc` and the suite;
//! - [`serve`]: workers and an acceptor on an address, for a process that
//!   serves only what it registers (the `fabrickv` server starts its own).
//!
//! Client side:
//! - [`session`]: the connection layer every client of this workspace
//!   stands on: sessions bound to one server worker each, request ids,
//!   requests in flight in request order, credits and deadlines;
//! - [`placement`]: which server worker a key, a client or a request goes
//!   to.
//!
//! Every message is a frame of `fabrickv-wire` with its 32-byte header.
//! The transport gives reliable, ordered messages on connections bound to
//! one server worker; this layer adds request kinds, matching of replies
//! to requests, flow control and timeouts.

pub mod echo;
pub mod gate;
pub mod placement;
pub mod quiesce;
pub mod serve;
pub mod service;
pub mod session;
#[cfg(feature = "testsuite")]
#[allow(clippy::unwrap_used)]
pub mod testsuite;
pub mod worker;

pub use echo::EchoService;
pub use serve::Serving;
pub use service::{Call, Clock, Refusal, Service, StatsList, WorkerView};
pub use session::{InFlight, Sent, Session, Sessions, WireFrames};
pub use worker::{LoopKnobs, RegisterError, StatsService, Worker};

use std::fmt;

use fabrickv_transport::TransportError;

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
    /// A bad argument (no worker to start, a service that cannot be
    /// registered).
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
