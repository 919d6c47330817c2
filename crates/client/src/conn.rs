//! How every client of this crate connects and talks to a server, over
//! the request layer of `fabrickv-rpc` ([`fabrickv_rpc::Sessions`]).
//!
//! The kv ([`crate::Client`]), ps, cache and shard clients each hold a
//! [`Sessions`]: it owns their request ids, their requests in flight (in
//! request order, which it checks), their credits and their waits for a
//! deadline; [`fabrickv_rpc::placement`] picks the worker a key or a client
//! goes to. What is here is what they share on top of it: the handshake
//! (HELLO), the connect by turn, the control replies, and the mapping of
//! the layer's errors and the server's refusals to [`ClientError`].

use std::time::{Duration, Instant};

use fabrickv_rpc::placement::Turns;
use fabrickv_rpc::{RpcError, Sessions};
use fabrickv_transport::{Dial, Endpoint};
use fabrickv_types::ErrorCode;
use fabrickv_wire::control::{decode_error, decode_hello_reply, encode_hello, ServerInfo};
use fabrickv_wire::{decode_frame, Frame, FrameKind};

use crate::{ClientError, Result};

/// Most requests one client keeps in flight on one connection (its
/// credits). No call of this crate comes near it (a kv batch of 32 M GETs
/// over one worker would, at `BATCH_OPS_MAX` a frame); it bounds the
/// in-flight queue rather than the pipelining the clients measured.
pub const CONN_REQUESTS_IN_FLIGHT_MAX: usize = 1 << 16;

impl From<RpcError> for ClientError {
    fn from(e: RpcError) -> Self {
        match e {
            RpcError::Transport(e) => ClientError::from(e),
            RpcError::Timeout => ClientError::Timeout,
            RpcError::NoCredits => ClientError::Invalid(
                ErrorCode::BatchTooLarge,
                format!(
                    "more than {CONN_REQUESTS_IN_FLIGHT_MAX} requests in flight on one connection"
                ),
            ),
            RpcError::Invalid(why) => ClientError::Invalid(ErrorCode::Malformed, why),
            e => ClientError::Protocol(e.to_string()),
        }
    }
}

/// A reply that does not follow the protocol, as an error.
pub(crate) fn protocol(e: impl std::fmt::Display) -> ClientError {
    ClientError::Protocol(e.to_string())
}

/// An ERROR frame as the server's refusal (or, if it does not decode, a
/// protocol error).
pub(crate) fn refusal(frame: &Frame<'_>) -> ClientError {
    match decode_error(frame) {
        Ok((code, message)) => ClientError::Server { code, message },
        Err(e) => protocol(e),
    }
}

/// Asks the worker at the other end of `ep` for the server's shape and
/// limits (HELLO). Sent before the connection has a session: a HELLO is
/// request 0, outside every client's ids.
fn hello(ep: &mut dyn Endpoint, timeout: Duration) -> Result<ServerInfo> {
    ep.post_with(&mut |b| encode_hello(b, 0, 0))?;
    ep.flush(timeout)?;
    let deadline = Instant::now() + timeout;
    loop {
        let mut got: Option<Result<ServerInfo>> = None;
        ep.poll(1, &mut |msg| {
            got = Some(control_reply(msg, |f| {
                decode_hello_reply(f).map_err(protocol)
            }))
        })?;
        if let Some(r) = got {
            return r;
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(ClientError::Timeout);
        }
        ep.wait(left)?;
    }
}

/// Connects to worker 0 of `addr` as `dial` says and asks the server's
/// shape (HELLO).
pub(crate) fn connect_hello(addr: &str, dial: &Dial) -> Result<(Box<dyn Endpoint>, ServerInfo)> {
    let mut ep = fabrickv_transport::connect_with(addr, 0, dial)?;
    let info = hello(&mut *ep, dial.timeout)?;
    Ok((ep, info))
}

/// Connects to the worker whose turn `turns` gives (moved on by
/// `offset`): the server's worker count is asked of worker 0, whose
/// connection is kept when the turn is its own. Clients of one kind in
/// one process so spread round robin.
pub(crate) fn connect_in_turn(
    addr: &str,
    dial: &Dial,
    turns: &Turns,
    offset: usize,
) -> Result<(Box<dyn Endpoint>, u16)> {
    let (first, info) = connect_hello(addr, dial)?;
    let worker = turns.next_offset(info.workers, offset);
    if worker == 0 {
        return Ok((first, 0));
    }
    Ok((
        fabrickv_transport::connect_with(addr, worker, dial)?,
        worker,
    ))
}

/// How many workers the server at `addr` runs (asked of worker 0): what a
/// caller placing its threads with `connect_worker` (`PsClient`,
/// `CacheClient`) divides by.
pub fn server_workers(addr: &str, timeout: Duration) -> Result<u16> {
    Ok(connect_hello(addr, &Dial::new(timeout)?)?.1.workers)
}

/// Decodes a control reply with `f`, or the server's refusal.
fn control_reply<T>(msg: &[u8], f: impl FnOnce(&Frame<'_>) -> Result<T>) -> Result<T> {
    match decode_frame(msg) {
        Ok(frame) if frame.header.kind == FrameKind::Error => Err(refusal(&frame)),
        Ok(frame) => f(&frame),
        Err(e) => Err(protocol(e)),
    }
}

/// Posts one control request on session `s` (built by `build`, given its
/// id and worker) and waits for its reply, decoded by `f`.
pub(crate) fn call_control<T, R>(
    sessions: &mut Sessions<T>,
    s: usize,
    tag: T,
    build: impl FnMut(&mut Vec<u8>, u64, u16),
    mut f: impl FnMut(&Frame<'_>) -> Result<R>,
) -> Result<R> {
    sessions.post(s, tag, build)?;
    let timeout = sessions.timeout();
    let deadline = sessions.deadline();
    let session = sessions.session(s);
    session.flush(timeout)?;
    loop {
        let mut got: Option<Result<R>> = None;
        session.poll(1, |msg, q| {
            got = Some(decode_frame(msg).map_err(protocol).and_then(|frame| {
                q.complete(frame.header.request_id)?;
                if frame.header.kind == FrameKind::Error {
                    return Err(refusal(&frame));
                }
                f(&frame)
            }))
        })?;
        if let Some(r) = got {
            return r;
        }
        session.wait_until(deadline)?;
    }
}

/// Registers `len` bytes on `ep` for the server to write one-sided;
/// `None` where the connection's capabilities say it registers no memory
/// (tcp, inproc, fabric without `FI_RMA`), so the caller falls back to a
/// local buffer. A registration that the capabilities promise but that
/// fails is an error, not a fallback.
pub(crate) fn register_if_supported(
    ep: &mut dyn Endpoint,
    len: usize,
) -> Result<Option<fabrickv_transport::RemoteRegion>> {
    if !ep.capabilities().memory_registration {
        return Ok(None);
    }
    Ok(Some(ep.register(len)?))
}

/// A registered region's descriptor as requests carry it (the ps client's
/// pull destinations, the cache client's GET and PUT slices).
pub(crate) fn region_bytes(r: &fabrickv_transport::RemoteRegion) -> [u8; 24] {
    let mut v = Vec::with_capacity(fabrickv_transport::RemoteRegion::ENCODED_BYTES);
    r.encode(&mut v);
    let mut a = [0u8; 24];
    a.copy_from_slice(&v);
    a
}
