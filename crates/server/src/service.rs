//! The request layer's contract, as the services of this crate name it:
//! the [`Service`] trait, what a call is handed, the clock and the refusal
//! helpers, all defined in `fabrickv_rpc::service` and re-exported here so
//! each service imports them from one place of its own crate.

pub use fabrickv_rpc::service::{
    decode_or_refuse, refuse, request_id_of, serve_one, wire_refusal, Call, Clock, Refusal,
    Service, StatsList, WorkerView,
};
