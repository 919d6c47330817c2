//! The in-process mock transport: channels between threads of one process.
//!
//! It keeps the contract (message boundaries, worker binding, bounds on
//! message size, post/flush/poll/wait) with none of the I/O, so service
//! logic can be tested fast and deterministically. Queues are unbounded
//! channels: this transport is for tests, never for untrusted peers.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender, TryRecvError};
use fabrickv_types::limits::MESSAGE_BYTES_MAX;

use crate::{
    Acceptor, ConnId, Endpoint, Listening, MessageHandler, PortStats, Result, TransportError,
    Waker, WorkerPort,
};

/// What a client sends to a worker port.
enum ToServer {
    Open(ConnId, Sender<Vec<u8>>),
    Msg(ConnId, Vec<u8>),
    Close(ConnId),
    Wake,
}

/// Listening names, each with the inbound queue of every worker.
fn registry() -> &'static Mutex<HashMap<String, Vec<Sender<ToServer>>>> {
    static REG: OnceLock<Mutex<HashMap<String, Vec<Sender<ToServer>>>>> = OnceLock::new();
    REG.get_or_init(|| Mutex::new(HashMap::new()))
}

static NEXT_CONN: AtomicU32 = AtomicU32::new(1);

/// Registers `name` with `workers` ports.
pub fn listen(name: &str, workers: usize) -> Result<Listening> {
    let mut reg = registry()
        .lock()
        .map_err(|_| TransportError::Refused("registry poisoned".into()))?;
    if reg.contains_key(name) {
        return Err(TransportError::Refused(format!(
            "inproc://{name} is already listening"
        )));
    }
    let mut senders = Vec::with_capacity(workers);
    let mut ports: Vec<Box<dyn WorkerPort>> = Vec::with_capacity(workers);
    for _ in 0..workers {
        let (tx, rx) = crossbeam_channel::unbounded();
        ports.push(Box::new(InprocPort {
            rx,
            wake_tx: tx.clone(),
            conns: HashMap::new(),
            replies: Vec::new(),
            stashed: None,
            stats: PortStats::default(),
        }));
        senders.push(tx);
    }
    reg.insert(name.to_string(), senders);
    let (stop_tx, stop_rx) = crossbeam_channel::bounded(1);
    Ok(Listening {
        local_addr: format!("inproc://{name}"),
        acceptor: Box::new(InprocAcceptor {
            name: name.to_string(),
            stop_tx,
            stop_rx,
        }),
        ports,
    })
}

/// Nothing to accept in-process; it holds the name until dropped.
struct InprocAcceptor {
    name: String,
    stop_tx: Sender<()>,
    stop_rx: Receiver<()>,
}

impl Acceptor for InprocAcceptor {
    fn run(&mut self, stop: &AtomicBool) -> Result<()> {
        while !stop.load(Ordering::Acquire) {
            // Blocks until woken; the timeout only guards a lost wake-up.
            let _ = self.stop_rx.recv_timeout(Duration::from_secs(1));
        }
        Ok(())
    }

    fn waker(&self) -> Waker {
        let tx = self.stop_tx.clone();
        Waker::new(move || {
            let _ = tx.try_send(());
        })
    }
}

impl Drop for InprocAcceptor {
    fn drop(&mut self) {
        if let Ok(mut reg) = registry().lock() {
            reg.remove(&self.name);
        }
    }
}

struct InprocPort {
    rx: Receiver<ToServer>,
    wake_tx: Sender<ToServer>,
    conns: HashMap<ConnId, Sender<Vec<u8>>>,
    replies: Vec<(ConnId, Vec<u8>)>,
    stashed: Option<ToServer>,
    stats: PortStats,
}

impl InprocPort {
    fn take(&mut self) -> Option<ToServer> {
        if let Some(m) = self.stashed.take() {
            return Some(m);
        }
        self.rx.try_recv().ok()
    }
}

impl WorkerPort for InprocPort {
    fn poll(&mut self, max: usize, handler: &mut MessageHandler<'_>) -> Result<usize> {
        let mut n = 0;
        while n < max {
            let Some(m) = self.take() else { break };
            match m {
                ToServer::Open(id, tx) => {
                    self.conns.insert(id, tx);
                    self.stats.conns_accepted += 1;
                    self.stats.conns_open += 1;
                }
                ToServer::Close(id) => {
                    if self.conns.remove(&id).is_some() {
                        self.stats.conns_open -= 1;
                    }
                }
                ToServer::Msg(id, msg) => {
                    if !self.conns.contains_key(&id) {
                        continue;
                    }
                    if msg.is_empty() || msg.len() > MESSAGE_BYTES_MAX {
                        self.conns.remove(&id);
                        self.stats.conns_open -= 1;
                        self.stats.conns_closed_framing += 1;
                        continue;
                    }
                    n += 1;
                    self.stats.msgs_in += 1;
                    let mut reply = Vec::new();
                    handler(id, &msg, &mut reply);
                    if !reply.is_empty() {
                        self.replies.push((id, reply));
                    }
                }
                ToServer::Wake => {}
            }
        }
        Ok(n)
    }

    fn flush(&mut self) -> Result<()> {
        self.flush_except(&[])
    }

    fn holds_replies(&self) -> bool {
        true
    }

    fn flush_except(&mut self, held: &[ConnId]) -> Result<()> {
        // With nothing held the queue keeps its buffer.
        let mut kept = Vec::new();
        for (id, reply) in self.replies.drain(..) {
            if held.binary_search(&id).is_ok() {
                kept.push((id, reply));
            } else if let Some(tx) = self.conns.get(&id) {
                self.stats.msgs_out += 1;
                let _ = tx.send(reply);
            }
        }
        if !kept.is_empty() {
            self.replies = kept;
        }
        Ok(())
    }

    fn wait(&mut self, timeout: Duration) -> Result<()> {
        if self.stashed.is_none() {
            match self.rx.recv_timeout(timeout) {
                Ok(m) => self.stashed = Some(m),
                Err(RecvTimeoutError::Timeout | RecvTimeoutError::Disconnected) => {}
            }
        }
        Ok(())
    }

    fn waker(&self) -> Waker {
        let tx = self.wake_tx.clone();
        Waker::new(move || {
            let _ = tx.send(ToServer::Wake);
        })
    }

    fn stats(&self) -> PortStats {
        self.stats
    }
}

/// Most bytes an [`InprocEndpoint`] reserves for a message before building
/// it (64 KiB): larger messages grow as they are built.
pub const MESSAGE_RESERVE_BYTES_MAX: usize = 64 << 10;

/// The client side of an in-process connection.
pub struct InprocEndpoint {
    id: ConnId,
    tx: Sender<ToServer>,
    rx: Receiver<Vec<u8>>,
    queued: Vec<Vec<u8>>,
    received: std::collections::VecDeque<Vec<u8>>,
    closed: bool,
    /// The largest message posted so far, up to
    /// [`MESSAGE_RESERVE_BYTES_MAX`]: each message (handed over to the
    /// server, so never reused) is allocated at that size, once, rather
    /// than grown by doubling as it is built, so a warm client allocates
    /// once per frame whatever the frame holds.
    msg_bytes_hint: usize,
}

impl InprocEndpoint {
    /// Connects to worker `worker` of the listener named `name`.
    pub fn connect(name: &str, worker: u16) -> Result<InprocEndpoint> {
        let reg = registry()
            .lock()
            .map_err(|_| TransportError::Refused("registry poisoned".into()))?;
        let workers = reg.get(name).ok_or_else(|| {
            TransportError::Refused(format!("nothing listens on inproc://{name}"))
        })?;
        let tx = workers
            .get(usize::from(worker))
            .ok_or_else(|| {
                crate::handshake::refusal(
                    worker,
                    fabrickv_types::ErrorCode::NoSuchWorker.name(),
                    workers.len(),
                )
            })?
            .clone();
        let id = NEXT_CONN.fetch_add(1, Ordering::Relaxed);
        let (reply_tx, rx) = crossbeam_channel::unbounded();
        tx.send(ToServer::Open(id, reply_tx))
            .map_err(|_| TransportError::Closed)?;
        Ok(InprocEndpoint {
            id,
            tx,
            rx,
            queued: Vec::new(),
            received: std::collections::VecDeque::new(),
            closed: false,
            msg_bytes_hint: 0,
        })
    }

    /// Sends raw bytes as one message with no checks, for bad-input tests.
    pub fn send_raw(&mut self, msg: Vec<u8>) -> Result<()> {
        self.tx
            .send(ToServer::Msg(self.id, msg))
            .map_err(|_| TransportError::Closed)
    }

    fn drain(&mut self) {
        loop {
            match self.rx.try_recv() {
                Ok(m) => self.received.push_back(m),
                Err(TryRecvError::Empty) => break,
                Err(TryRecvError::Disconnected) => {
                    self.closed = true;
                    break;
                }
            }
        }
    }
}

impl Endpoint for InprocEndpoint {
    fn post_with(&mut self, build: &mut dyn FnMut(&mut Vec<u8>)) -> Result<()> {
        let mut msg = Vec::with_capacity(self.msg_bytes_hint);
        build(&mut msg);
        if msg.is_empty() || msg.len() > MESSAGE_BYTES_MAX {
            return Err(TransportError::MessageTooLarge(msg.len()));
        }
        self.msg_bytes_hint = self
            .msg_bytes_hint
            .max(msg.len().min(MESSAGE_RESERVE_BYTES_MAX));
        self.queued.push(msg);
        Ok(())
    }

    fn flush(&mut self, _timeout: Duration) -> Result<()> {
        for m in self.queued.drain(..) {
            self.tx
                .send(ToServer::Msg(self.id, m))
                .map_err(|_| TransportError::Closed)?;
        }
        Ok(())
    }

    fn poll(&mut self, max: usize, on_msg: &mut dyn FnMut(&[u8])) -> Result<usize> {
        self.drain();
        let mut n = 0;
        while n < max {
            let Some(m) = self.received.pop_front() else {
                break;
            };
            on_msg(&m);
            n += 1;
        }
        if n == 0 && self.closed {
            return Err(TransportError::Closed);
        }
        Ok(n)
    }

    fn wait(&mut self, timeout: Duration) -> Result<()> {
        if !self.received.is_empty() {
            return Ok(());
        }
        match self.rx.recv_timeout(timeout) {
            Ok(m) => self.received.push_back(m),
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => self.closed = true,
        }
        Ok(())
    }
}

impl Drop for InprocEndpoint {
    fn drop(&mut self) {
        let _ = self.tx.send(ToServer::Close(self.id));
    }
}
