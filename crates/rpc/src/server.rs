//! Server side: handlers by request type, run to completion on the server
//! thread that received the request.
//!
//! Each server thread owns one transport worker port. A burst: poll up to
//! `poll_burst` messages, run each one's handler, append its response;
//! with `batched_send` the responses of the whole burst leave in one flush
//! (one syscall per connection, or one ring publish: the analogue of RDMA
//! doorbell batching), without it every response is flushed on its own.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use std::collections::HashMap;

use fabrickv_transport::{RemoteRegion, Reply, TransportError, Waker, WorkerPort};

use crate::header::{RpcHeader, RpcStatus, NO_SLOT};
use crate::{RpcError, REQ_TYPES_MAX, REQ_TYPE_SESSION};

/// Most sessions with reply slots one server thread remembers.
pub const SESSIONS_PER_THREAD_MAX: usize = fabrickv_types::limits::CONNECTIONS_MAX;

/// A request handler: the request payload in, the response payload
/// appended to `out`; an `Err` answers `HandlerError` with no payload.
pub type Handler = dyn Fn(&[u8], &mut Vec<u8>) -> Result<(), ()> + Send + Sync;

/// The table of handlers, by request type.
pub struct Handlers {
    table: Vec<Option<Box<Handler>>>,
}

impl Default for Handlers {
    fn default() -> Self {
        Handlers::new()
    }
}

impl Handlers {
    /// An empty table.
    pub fn new() -> Handlers {
        Handlers {
            table: (0..REQ_TYPES_MAX).map(|_| None).collect(),
        }
    }

    /// Registers `f` for `req_type`, replacing any earlier handler. Type 0
    /// is reserved for session set-up.
    pub fn register(
        &mut self,
        req_type: u16,
        f: impl Fn(&[u8], &mut Vec<u8>) -> Result<(), ()> + Send + Sync + 'static,
    ) -> Result<&mut Self, RpcError> {
        if req_type == REQ_TYPE_SESSION {
            return Err(RpcError::Invalid(
                "request type 0 is reserved for session set-up".into(),
            ));
        }
        let slot = self.table.get_mut(usize::from(req_type)).ok_or_else(|| {
            RpcError::Invalid(format!(
                "request type {req_type} is not below {REQ_TYPES_MAX}"
            ))
        })?;
        *slot = Some(Box::new(f));
        Ok(self)
    }

    /// Runs the handler for one request message and builds its response
    /// in `reply`. A response whose payload exceeds `inline_max` bytes goes
    /// out of line when the client offered a reply slot: the payload is
    /// written one-sided into the client's slot and the message carries
    /// only its length.
    #[inline]
    pub fn dispatch(
        &self,
        msg: &[u8],
        reply: &mut dyn Reply,
        session: Option<&ReplySlots>,
        inline_max: usize,
    ) {
        let out = reply.buf();
        let Some((h, payload)) = RpcHeader::decode(msg).filter(|(h, _)| !h.response) else {
            let id = RpcHeader::request_id_of(msg);
            RpcHeader::response_to(0, id, RpcStatus::Malformed).encode(out);
            return;
        };
        let at = out.len();
        let mut resp = RpcHeader::response_to(h.req_type, h.request_id, RpcStatus::Ok);
        resp.encode(out);
        let body = out.len();
        let handler = match h.req_type {
            REQ_TYPE_SESSION => None,
            t => self.table.get(usize::from(t)).and_then(|s| s.as_ref()),
        };
        match handler {
            None => resp.status = RpcStatus::NoHandler,
            Some(f) => {
                if f(payload, out).is_err() {
                    resp.status = RpcStatus::HandlerError;
                }
            }
        }
        if resp.status != RpcStatus::Ok {
            out.truncate(at);
            resp.encode(out);
            return;
        }
        let len = out.len() - body;
        let Some(slots) =
            session.filter(|s| len > inline_max && h.slot != NO_SLOT && len <= s.slot_bytes)
        else {
            return;
        };
        if usize::from(h.slot) >= slots.slots {
            return;
        }
        // Out of line: the payload into the client's slot, then a short message.
        let data = out[body..].to_vec();
        out.truncate(at);
        let written =
            reply.write_remote(&slots.region, usize::from(h.slot) * slots.slot_bytes, &data);
        if written.is_ok() {
            resp.slot = h.slot;
            resp.out_of_line = true;
            let out = reply.buf();
            resp.encode(out);
            out.extend_from_slice(&(len as u32).to_le_bytes());
        } else {
            let out = reply.buf();
            resp.encode(out);
            out.extend_from_slice(&data);
        }
    }
}

/// A client's reply slots on one connection: where out-of-line responses
/// go, as set up by its session request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReplySlots {
    /// The client's registered region.
    pub region: RemoteRegion,
    /// Bytes per slot.
    pub slot_bytes: usize,
    /// Number of slots.
    pub slots: usize,
}

impl ReplySlots {
    /// Bytes of the session request's payload.
    pub const ENCODED_BYTES: usize = RemoteRegion::ENCODED_BYTES + 8;

    /// Appends the session request payload.
    pub fn encode(&self, out: &mut Vec<u8>) {
        self.region.encode(out);
        out.extend_from_slice(&(self.slot_bytes as u32).to_le_bytes());
        out.extend_from_slice(&(self.slots as u32).to_le_bytes());
    }

    /// Reads a session request payload, checking that the slots fit the region.
    pub fn decode(b: &[u8]) -> Option<ReplySlots> {
        if b.len() != Self::ENCODED_BYTES {
            return None;
        }
        let region = RemoteRegion::decode(b)?;
        let word = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]) as usize;
        let (slot_bytes, slots) = (word(24), word(28));
        let fits = slot_bytes
            .checked_mul(slots)
            .is_some_and(|n| n as u64 <= region.len);
        (fits && slots <= usize::from(NO_SLOT)).then_some(ReplySlots {
            region,
            slot_bytes,
            slots,
        })
    }
}

/// The batching knobs of a server thread.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServerKnobs {
    /// Most messages taken per poll (batched receive); 1 disables it.
    pub poll_burst: usize,
    /// Flush the responses of a burst together (true) or each on its own.
    pub batched_send: bool,
    /// How long an idle thread keeps polling before it blocks, in µs.
    pub idle_spin_us: u64,
    /// Largest response payload sent inline in the message, in bytes;
    /// larger ones go one-sided into the client's reply slot when it
    /// offered one (`usize::MAX`: always inline).
    pub inline_max: usize,
}

impl Default for ServerKnobs {
    fn default() -> Self {
        ServerKnobs {
            poll_burst: 64,
            batched_send: true,
            idle_spin_us: 100,
            inline_max: usize::MAX,
        }
    }
}

/// Longest block of an idle server thread, in milliseconds.
pub const IDLE_WAIT_MS: u64 = 200;

/// Runs one server thread's loop on `port` until `stop` is set.
pub fn serve_port(
    port: &mut dyn WorkerPort,
    handlers: &Handlers,
    knobs: ServerKnobs,
    stop: &AtomicBool,
) -> Result<(), TransportError> {
    let burst = knobs.poll_burst.max(1);
    let mut idle_since: Option<Instant> = None;
    // Reply slots by connection, from each client's session request.
    let mut sessions: HashMap<u32, ReplySlots> = HashMap::new();
    let inline_max = knobs.inline_max;
    let mut handler = |conn: u32, msg: &[u8], reply: &mut dyn Reply| {
        let session_request =
            RpcHeader::decode(msg).filter(|(h, _)| !h.response && h.req_type == REQ_TYPE_SESSION);
        if let Some((h, payload)) = session_request {
            let status = match ReplySlots::decode(payload) {
                Some(slots)
                    if sessions.len() < SESSIONS_PER_THREAD_MAX || sessions.contains_key(&conn) =>
                {
                    sessions.insert(conn, slots);
                    RpcStatus::Ok
                }
                _ => RpcStatus::Malformed,
            };
            RpcHeader::response_to(REQ_TYPE_SESSION, h.request_id, status).encode(reply.buf());
            return;
        }
        handlers.dispatch(msg, reply, sessions.get(&conn), inline_max)
    };
    while !stop.load(Ordering::Acquire) {
        let handled = if knobs.batched_send {
            let n = port.poll(burst, &mut handler)?;
            port.flush()?;
            n
        } else {
            let mut n = 0;
            while n < burst {
                let k = port.poll(1, &mut handler)?;
                if k == 0 {
                    break;
                }
                port.flush()?;
                n += k;
            }
            if n == 0 {
                // Replies held back (a full socket, no credits) still leave
                // when no new request came in.
                port.flush()?;
            }
            n
        };
        if handled > 0 {
            idle_since = None;
            continue;
        }
        let since = *idle_since.get_or_insert_with(Instant::now);
        if since.elapsed() < Duration::from_micros(knobs.idle_spin_us) {
            std::hint::spin_loop();
            continue;
        }
        port.wait(Duration::from_millis(IDLE_WAIT_MS))?;
    }
    Ok(())
}

/// A running RPC server: an acceptor thread and one thread per port.
pub struct RpcServer {
    addr: String,
    stop: Arc<AtomicBool>,
    wakers: Vec<Waker>,
    threads: Vec<JoinHandle<()>>,
}

impl RpcServer {
    /// Listens on `addr` with `threads` server threads.
    pub fn start(
        addr: &str,
        threads: usize,
        handlers: Arc<Handlers>,
        knobs: ServerKnobs,
    ) -> Result<RpcServer, RpcError> {
        if threads == 0 {
            return Err(RpcError::Invalid("at least one server thread".into()));
        }
        let l = fabrickv_transport::listen(addr, threads)?;
        let stop = Arc::new(AtomicBool::new(false));
        let mut wakers = vec![l.acceptor.waker()];
        let mut handles = Vec::with_capacity(threads + 1);
        for (i, mut port) in l.ports.into_iter().enumerate() {
            wakers.push(port.waker());
            let (stop, handlers) = (stop.clone(), handlers.clone());
            let t = std::thread::Builder::new()
                .name(format!("fkv-rpc-{i}"))
                .spawn(move || {
                    if let Err(e) = serve_port(&mut *port, &handlers, knobs, &stop) {
                        tracing::error!("rpc server thread {i} stopped: {e}");
                    }
                })
                .map_err(|e| RpcError::Invalid(format!("cannot start a thread: {e}")))?;
            handles.push(t);
        }
        let mut acceptor = l.acceptor;
        let s = stop.clone();
        handles.push(
            std::thread::Builder::new()
                .name("fkv-rpc-acceptor".into())
                .spawn(move || {
                    if let Err(e) = acceptor.run(&s) {
                        tracing::error!("rpc acceptor stopped: {e}");
                    }
                })
                .map_err(|e| RpcError::Invalid(format!("cannot start a thread: {e}")))?,
        );
        Ok(RpcServer {
            addr: l.local_addr,
            stop,
            wakers,
            threads: handles,
        })
    }

    /// The address clients connect to.
    pub fn addr(&self) -> &str {
        &self.addr
    }

    /// Stops every thread and waits for them.
    pub fn shutdown(mut self) {
        self.stop_and_join();
    }

    fn stop_and_join(&mut self) {
        self.stop.store(true, Ordering::Release);
        for w in &self.wakers {
            w.wake();
        }
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

impl Drop for RpcServer {
    fn drop(&mut self) {
        self.stop_and_join();
    }
}
