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

use fabrickv_transport::{Reply, TransportError, Waker, WorkerPort};

use crate::header::{RpcHeader, RpcStatus};
use crate::{RpcError, REQ_TYPES_MAX};

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

    /// Registers `f` for `req_type`, replacing any earlier handler.
    pub fn register(
        &mut self,
        req_type: u16,
        f: impl Fn(&[u8], &mut Vec<u8>) -> Result<(), ()> + Send + Sync + 'static,
    ) -> Result<&mut Self, RpcError> {
        let slot = self.table.get_mut(usize::from(req_type)).ok_or_else(|| {
            RpcError::Invalid(format!(
                "request type {req_type} is not below {REQ_TYPES_MAX}"
            ))
        })?;
        *slot = Some(Box::new(f));
        Ok(self)
    }

    /// Runs the handler for one request message, appending the whole
    /// response message (header and payload) to `out`.
    #[inline]
    pub fn dispatch(&self, msg: &[u8], out: &mut Vec<u8>) {
        let Some((h, payload)) = RpcHeader::decode(msg).filter(|(h, _)| !h.response) else {
            let id = RpcHeader::request_id_of(msg);
            RpcHeader {
                response: true,
                req_type: 0,
                status: RpcStatus::Malformed,
                request_id: id,
            }
            .encode(out);
            return;
        };
        let at = out.len();
        let mut resp = RpcHeader {
            response: true,
            req_type: h.req_type,
            status: RpcStatus::Ok,
            request_id: h.request_id,
        };
        resp.encode(out);
        match self
            .table
            .get(usize::from(h.req_type))
            .and_then(|s| s.as_ref())
        {
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
        }
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
}

impl Default for ServerKnobs {
    fn default() -> Self {
        ServerKnobs {
            poll_burst: 64,
            batched_send: true,
            idle_spin_us: 100,
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
    let mut handler =
        |_conn: u32, msg: &[u8], reply: &mut dyn Reply| handlers.dispatch(msg, reply.buf());
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
