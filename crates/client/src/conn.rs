//! How every client of this crate connects and talks to a server, over
//! the request layer of `fabrickv-rpc` ([`fabrickv_rpc::Sessions`]).
//!
//! The kv ([`crate::Client`]), ps, cache and shard clients each hold a
//! [`Conn`]: sessions (one connection to one server worker and its
//! requests in flight each) over the native frames ([`Frames`]). The
//! layer owns their request ids, their requests in flight (in request
//! order, which it checks), their credits, their waits for a deadline,
//! the one reply loop and its late-reply and retry rules;
//! [`fabrickv_rpc::placement`] picks the worker a key or a client goes to.
//! What is here is what they share on top of it: the one constructor
//! ([`connect`]: the dial, the HELLO, the choice of workers, the memory
//! registered, the redial), the control calls, and the mapping of the
//! layer's errors and the server's refusals to [`ClientError`].

use std::time::Duration;

use fabrickv_rpc::placement::Turns;
use fabrickv_rpc::session::Framing;
use fabrickv_rpc::{RpcError, Session, Sessions};
use fabrickv_transport::{Dial, Endpoint, RemoteRegion};
use fabrickv_types::ErrorCode;
use fabrickv_wire::control::{decode_error, decode_hello_reply, encode_hello, ServerInfo};
use fabrickv_wire::{decode_frame, Frame, FrameHeader, FrameKind};

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

/// The native frames of `fabrickv-wire`, as the request layer reads
/// them: a reply names its request in its header.
pub(crate) enum Frames {}

impl Framing for Frames {
    type Error = ClientError;

    #[inline]
    fn reply_id(msg: &[u8]) -> Result<u64> {
        FrameHeader::decode(msg)
            .map(|h| h.request_id)
            .map_err(protocol)
    }
}

/// A client's sessions over the native frames.
pub(crate) type Conn<T> = Sessions<T, Frames>;

/// Asks the worker of session `s` for the server's shape and limits
/// (HELLO).
fn hello<T: Default>(sessions: &mut Conn<T>, s: usize) -> Result<ServerInfo> {
    call_control(sessions, s, T::default(), encode_hello, |f| {
        decode_hello_reply(f).map_err(protocol)
    })
}

/// Sessions of one connection, to worker `worker` of `addr`.
fn dial_one<T>(addr: &str, worker: u16, dial: &Dial) -> Result<Conn<T>> {
    let ep = fabrickv_transport::connect_with(addr, worker, dial)?;
    Ok(Sessions::one(
        ep,
        worker,
        CONN_REQUESTS_IN_FLIGHT_MAX,
        dial.timeout,
    ))
}

/// Which server workers a client holds sessions to.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Workers<'t> {
    /// One session per worker, by worker (the kv client's steering).
    Every,
    /// One session, to the worker whose turn `turns` gives (moved on by
    /// `offset`): clients of one kind in one process so spread round
    /// robin. The worker count is asked of worker 0, whose connection is
    /// kept when the turn is its own.
    InTurn(&'t Turns, usize),
    /// One session, to this worker, whatever the turn (a client thread
    /// pinned beside a pinned worker). A worker the server does not have
    /// is refused at the handshake.
    Worker(u16),
}

/// A client's connection, as [`connect`] or [`over`] made it.
pub(crate) struct Connected<T> {
    /// The sessions, by the client's numbering (by worker for
    /// [`Workers::Every`]; one session otherwise).
    pub(crate) sessions: Conn<T>,
    /// The server's shape and limits, where a HELLO was asked
    /// ([`Workers::Every`] and [`Workers::InTurn`]).
    pub(crate) info: Option<ServerInfo>,
    /// The memory registered on session 0 for the server to write and
    /// read one-sided, where asked for and the transport registers.
    pub(crate) region: Option<RemoteRegion>,
}

/// The one way every client of this crate connects: dials `addr` with
/// `timeout` (for connecting and for each call), to the workers `workers`
/// names, registers `region_bytes` of memory on the session where the
/// transport can (0: none), and sets each session to dial again when
/// the server closed it while quiet (not where memory was registered: a
/// new connection would not have the region).
pub(crate) fn connect<T: Default>(
    addr: &str,
    timeout: Duration,
    workers: Workers<'_>,
    region_bytes: usize,
) -> Result<Connected<T>> {
    let dial = Dial::new(timeout)?;
    let (mut sessions, info) = match workers {
        Workers::Every => {
            let mut sessions = dial_one(addr, 0, &dial)?;
            let info = hello(&mut sessions, 0)?;
            for w in 1..info.workers {
                let ep = fabrickv_transport::connect_with(addr, w, &dial)?;
                sessions.push(Session::new(ep, w));
            }
            (sessions, Some(info))
        }
        Workers::InTurn(turns, offset) => {
            let mut sessions = dial_one(addr, 0, &dial)?;
            let info = hello(&mut sessions, 0)?;
            let worker = turns.next_offset(info.workers, offset);
            if worker != 0 {
                sessions = dial_one(addr, worker, &dial)?;
            }
            (sessions, Some(info))
        }
        Workers::Worker(w) => (dial_one(addr, w, &dial)?, None),
    };
    let region = register(&mut sessions, region_bytes)?;
    if region.is_none() {
        for s in sessions.all() {
            s.set_redial(addr, dial.clone());
        }
    }
    Ok(Connected {
        sessions,
        info,
        region,
    })
}

/// [`connect`] over an endpoint already connected to `worker` (the ps
/// and cache clients' `on_endpoint`): no HELLO, and no redial (the
/// address is not known).
pub(crate) fn over<T>(
    ep: Box<dyn Endpoint>,
    worker: u16,
    timeout: Duration,
    region_bytes: usize,
) -> Result<Connected<T>> {
    let mut sessions = Sessions::one(ep, worker, CONN_REQUESTS_IN_FLIGHT_MAX, timeout);
    let region = register(&mut sessions, region_bytes)?;
    Ok(Connected {
        sessions,
        info: None,
        region,
    })
}

/// Registers `bytes` on session 0 where asked (more than 0) and the
/// transport registers memory.
fn register<T>(sessions: &mut Conn<T>, bytes: usize) -> Result<Option<RemoteRegion>> {
    if bytes == 0 {
        return Ok(None);
    }
    register_if_supported(sessions.session(0).endpoint(), bytes)
}

/// How many workers the server at `addr` runs (asked of worker 0): what a
/// caller placing its threads with `connect_worker` (`PsClient`,
/// `CacheClient`) divides by.
pub fn server_workers(addr: &str, timeout: Duration) -> Result<u16> {
    let mut sessions: Conn<()> = dial_one(addr, 0, &Dial::new(timeout)?)?;
    Ok(hello(&mut sessions, 0)?.workers)
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
    sessions: &mut Conn<T>,
    s: usize,
    tag: T,
    build: impl FnOnce(&mut Vec<u8>, u64, u16),
    f: impl FnOnce(&Frame<'_>) -> Result<R>,
) -> Result<R> {
    let deadline = sessions.deadline();
    sessions.call(s, tag, deadline, build, |m, _| control_reply(m, f))
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
