//! Helpers shared by the server's integration tests.
//!
//! - [`TestServer`]: a real server per test, on the transport the test is
//!   instantiated for, with a unique address (inproc) or a free loopback
//!   port (tcp);
//! - [`transport_tests!`]: writes each test body once and instantiates it
//!   per transport, as the transport conformance suite does;
//! - raw frame plumbing ([`request`], [`recv_n`], [`parse_reply`]) for tests
//!   that bypass the client to pipeline by hand or send hostile bytes;
//! - [`wait_for`]: awaits a condition with a deadline, so that no test
//!   relies on a fixed sleep.

// Each test binary uses a different subset of these helpers.
#![allow(dead_code)]

pub mod etcd;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use fabrickv_client::Client;
use fabrickv_server::{Mode, Server, ServerConfig, ServerHandle};
use fabrickv_transport::{Endpoint, TransportError};
use fabrickv_types::ErrorCode;
use fabrickv_wire::control::decode_error;
use fabrickv_wire::{decode_frame, FrameKind, RequestBuilder, ResponseIter};

/// How long any single step of a test may take before it counts as hung.
pub const TIMEOUT: Duration = Duration::from_secs(5);

/// Engine memory of a default test server, in bytes: 32 MiB per worker with
/// two workers, enough for the largest value (1 MiB) in either mode.
pub const MEMORY_BYTES: u64 = 64 << 20;

/// Embedding pool of a test server with tables, in bytes (lazily backed).
pub const PS_POOL_BYTES: u64 = 32 << 20;

/// KV-cache pool of a test server with the cache, in bytes.
pub const CACHE_POOL_BYTES: usize = 32 << 20;

/// Gives `cfg` small embedding and cache pools, so that a test starting
/// several servers with every face needs neither locked memory nor GiBs.
#[allow(dead_code)] // Not every test binary serves tables and the cache.
pub fn small_pools(cfg: &mut ServerConfig) {
    cfg.ps = fabrickv_server::ps::PsConfig {
        pool_bytes: PS_POOL_BYTES,
        pool: fabrickv_engine::PoolOptions::default(),
        tables: Vec::new(),
    };
    cfg.cache.store = fabrickv_cache::CacheConfig {
        pool_bytes: CACHE_POOL_BYTES,
        ..fabrickv_cache::CacheConfig::default()
    };
}

/// Which transport a test runs over.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    /// In-process channels.
    Inproc,
    /// Loopback tcp.
    Tcp,
    /// Shared memory between processes (here: threads of one process).
    Shm,
}

static INPROC_NAMES: AtomicU32 = AtomicU32::new(0);

impl Transport {
    /// A fresh address to listen on: a unique inproc name, or a free
    /// loopback port (never any other interface).
    pub fn listen_addr(self) -> String {
        match self {
            Transport::Inproc => format!(
                "inproc://server-it-{}-{}",
                std::process::id(),
                INPROC_NAMES.fetch_add(1, Ordering::Relaxed)
            ),
            Transport::Tcp => "tcp://127.0.0.1:0".to_string(),
            Transport::Shm => {
                fabrickv_transport_shm::install();
                format!(
                    "shm://server-it-{}-{}",
                    std::process::id(),
                    INPROC_NAMES.fetch_add(1, Ordering::Relaxed)
                )
            }
        }
    }
}

/// A running server for one test.
pub struct TestServer {
    /// The resolved address clients connect to.
    pub addr: String,
    /// The transport it listens on.
    pub transport: Transport,
    /// Worker threads.
    pub workers: u16,
    handle: ServerHandle,
}

impl TestServer {
    /// Starts a server with `workers` workers and `memory_bytes` of engine
    /// memory over all of them.
    pub fn start(t: Transport, workers: usize, mode: Mode, memory_bytes: u64) -> TestServer {
        TestServer::start_with(t, workers, mode, memory_bytes, |_| {})
    }

    /// Starts a server whose configuration `edit` adjusts first (to turn
    /// on the RESP front-end, for one).
    pub fn start_with(
        t: Transport,
        workers: usize,
        mode: Mode,
        memory_bytes: u64,
        edit: impl FnOnce(&mut ServerConfig),
    ) -> TestServer {
        let mut cfg = ServerConfig {
            listen: t.listen_addr(),
            workers: Some(workers),
            mode,
            memory_bytes,
            log_level: "warn".to_string(),
            ..ServerConfig::default()
        };
        edit(&mut cfg);
        let handle = Server::start(&cfg).expect("server starts");
        TestServer {
            addr: handle.addr().to_string(),
            transport: t,
            workers: workers as u16,
            handle,
        }
    }

    /// Starts the default server: two workers, store mode, [`MEMORY_BYTES`].
    pub fn default_on(t: Transport) -> TestServer {
        TestServer::start(t, 2, Mode::Store, MEMORY_BYTES)
    }

    /// A connected client.
    pub fn client(&self) -> Client {
        Client::connect_with_timeout(&self.addr, TIMEOUT).expect("client connects")
    }

    /// A raw connection to one worker, for frames built by hand.
    pub fn endpoint(&self, worker: u16) -> Box<dyn Endpoint> {
        fabrickv_transport::connect(&self.addr, worker, TIMEOUT).expect("endpoint connects")
    }

    /// The tcp address without its scheme (tcp servers only).
    pub fn tcp_socket_addr(&self) -> &str {
        self.addr
            .strip_prefix("tcp://")
            .expect("a tcp server's address starts with tcp://")
    }

    /// The inproc listener name (inproc servers only).
    pub fn inproc_name(&self) -> &str {
        self.addr
            .strip_prefix("inproc://")
            .expect("an inproc server's address starts with inproc://")
    }

    /// The shm listener name (shm servers only).
    pub fn shm_name(&self) -> &str {
        self.addr
            .strip_prefix("shm://")
            .expect("an shm server's address starts with shm://")
    }

    /// Where the RESP front-end listens (servers started with it on).
    pub fn resp_addr(&self) -> &str {
        self.handle
            .resp_addr()
            .expect("the server was started with its RESP front-end on")
    }

    /// Where the gRPC control plane listens (servers started with it on).
    pub fn grpc_addr(&self) -> String {
        self.handle
            .grpc_addr()
            .expect("the server was started with gRPC on")
            .to_string()
    }

    /// The server's partitions and their table (moves without a client).
    pub fn partitions(&self) -> &std::sync::Arc<fabrickv_server::partitions::Partitions> {
        self.handle.partitions()
    }

    /// Which hash slots the server serves (a cluster's slot map).
    pub fn slot_routing(&self) -> &std::sync::Arc<fabrickv_server::slot_routing::SlotRouting> {
        self.handle.slot_routing()
    }

    /// The running server.
    pub fn handle(&self) -> &ServerHandle {
        &self.handle
    }

    /// Stops the server and waits for its threads.
    pub fn shutdown(self) {
        self.handle.shutdown();
    }
}

/// Instantiates each named test body `fn(Transport)` once per transport,
/// in modules `inproc` and `tcp`. Attributes before a name (such as
/// `#[ignore = "bug: ..."]`) go on both instances.
macro_rules! transport_tests {
    ($($(#[$attr:meta])* $test:ident),* $(,)?) => {
        mod inproc {
            $( $(#[$attr])* #[test] fn $test() { super::$test(crate::common::Transport::Inproc) } )*
        }
        mod tcp {
            $( $(#[$attr])* #[test] fn $test() { super::$test(crate::common::Transport::Tcp) } )*
        }
        mod shm {
            $( $(#[$attr])* #[test] fn $test() { super::$test(crate::common::Transport::Shm) } )*
        }
    };
}

/// Polls `cond` until it holds; panics naming `what` if it does not within
/// `within`. The pause between polls only paces the loop; the assertion
/// is the condition itself.
pub fn wait_for(what: &str, within: Duration, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + within;
    loop {
        if cond() {
            return;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Counters summed over every worker.
pub fn stats(c: &mut Client) -> BTreeMap<String, u64> {
    c.stats().expect("stats")
}

/// One counter summed over every worker.
pub fn stat(c: &mut Client, name: &str) -> u64 {
    *stats(c)
        .get(name)
        .unwrap_or_else(|| panic!("the server reports no counter {name:?}"))
}

/// One counter of each worker, in worker order.
pub fn stat_per_worker(c: &mut Client, name: &str) -> Vec<u64> {
    c.stats_per_worker()
        .expect("stats per worker")
        .into_iter()
        .map(|w| {
            w.into_iter()
                .find(|(n, _)| n == name)
                .map(|(_, v)| v)
                .unwrap_or_else(|| panic!("the server reports no counter {name:?}"))
        })
        .collect()
}

/// `n` distinct keys (`{prefix}-{i}`) that `worker` owns.
pub fn keys_of_worker(c: &Client, worker: u16, n: usize, prefix: &str) -> Vec<Vec<u8>> {
    (0u64..)
        .map(|i| format!("{prefix}-{i}").into_bytes())
        .filter(|k| c.worker_of(k) == worker)
        .take(n)
        .collect()
}

/// A value of `len` bytes derived from `seed`, so that any mix-up between
/// two values (or a shifted copy) is visible.
pub fn value_of(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            // xorshift64
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// A request frame built with `build`.
pub fn request(id: u64, worker: u16, build: impl FnOnce(&mut RequestBuilder<'_>)) -> Vec<u8> {
    let mut buf = Vec::new();
    let mut b = RequestBuilder::new(&mut buf, id, worker);
    build(&mut b);
    b.finish();
    buf
}

/// Receives exactly `n` messages, in arrival order, or panics after
/// [`TIMEOUT`].
pub fn recv_n(ep: &mut dyn Endpoint, n: usize) -> Vec<Vec<u8>> {
    let deadline = Instant::now() + TIMEOUT;
    let mut out = Vec::with_capacity(n);
    while out.len() < n {
        ep.poll(n - out.len(), &mut |m| out.push(m.to_vec()))
            .expect("poll");
        if out.len() == n {
            break;
        }
        let left = deadline.saturating_duration_since(Instant::now());
        assert!(
            !left.is_zero(),
            "got {} of {n} replies within {TIMEOUT:?}",
            out.len()
        );
        ep.wait(left.min(Duration::from_millis(100))).expect("wait");
    }
    out
}

/// Waits until the server closes `ep`; panics if it is still open after
/// [`TIMEOUT`]. Messages that arrive before the close are ignored.
pub fn await_closed(ep: &mut dyn Endpoint) {
    let deadline = Instant::now() + TIMEOUT;
    loop {
        match ep.poll(usize::MAX, &mut |_| {}) {
            Err(TransportError::Closed) | Err(TransportError::Io(_)) => return,
            Err(e) => panic!("expected the connection to be closed, got {e}"),
            Ok(_) => {}
        }
        assert!(
            Instant::now() < deadline,
            "the server kept the connection open"
        );
        match ep.wait(Duration::from_millis(50)) {
            Err(TransportError::Closed) | Err(TransportError::Io(_)) => return,
            Err(TransportError::Timeout) | Ok(()) => {}
            Err(e) => panic!("expected the connection to be closed, got {e}"),
        }
    }
}

/// A reply frame, decoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply {
    /// A RESPONSE: one (code, value) per operation.
    Results(Vec<(ErrorCode, Vec<u8>)>),
    /// An ERROR frame: the whole request was refused.
    Refused(ErrorCode),
}

/// Decodes a reply message into (request id, worker, reply); panics if the
/// server sent something that is not a well-formed RESPONSE or ERROR.
pub fn parse_reply(msg: &[u8]) -> (u64, u16, Reply) {
    let frame = decode_frame(msg).expect("the server's reply is a valid frame");
    let h = frame.header;
    let reply = match h.kind {
        FrameKind::Response => Reply::Results(
            ResponseIter::new(&frame)
                .expect("the server's response is well-formed")
                .map(|r| (r.code(), r.value.to_vec()))
                .collect(),
        ),
        FrameKind::Error => {
            let (code, _) = decode_error(&frame).expect("the server's error frame is well-formed");
            Reply::Refused(code)
        }
        k => panic!("expected a RESPONSE or ERROR frame, got {k:?}"),
    };
    (h.request_id, h.worker, reply)
}

/// A KV-cache client of `s` with a receive buffer of `buffer_bytes` and
/// the suite's timeout.
pub fn cache_client(s: &TestServer, buffer_bytes: usize) -> fabrickv_client::CacheClient {
    fabrickv_client::CacheClient::connect_with(
        &s.addr,
        fabrickv_client::CacheClientOptions {
            buffer_bytes,
            timeout: TIMEOUT,
        },
    )
    .expect("cache client connects")
}

/// What connecting to worker 2 of a two-worker server must give: a
/// refusal naming the worker asked for and the count the server has.
pub fn assert_no_worker_2_of_2<T>(connected: Result<T, fabrickv_client::ClientError>) {
    let refused = match connected {
        Ok(_) => panic!("worker 2 of a 2-worker server was accepted"),
        Err(e) => e.to_string(),
    };
    assert!(
        refused.contains("worker 2") && refused.contains("has 2"),
        "unclear refusal: {refused}"
    );
}

/// A blocking RESP connection with a reader for replies.
pub struct Resp {
    pub w: std::net::TcpStream,
    pub r: std::io::BufReader<std::net::TcpStream>,
}

impl Resp {
    pub fn connect(s: &TestServer) -> Resp {
        let w = std::net::TcpStream::connect(s.resp_addr()).expect("connects");
        w.set_read_timeout(Some(TIMEOUT)).expect("timeout");
        w.set_nodelay(true).expect("nodelay");
        let r = std::io::BufReader::new(w.try_clone().expect("clone"));
        Resp { w, r }
    }

    /// A connection for multi-MiB values: a 1 MiB read buffer, and four
    /// times [`TIMEOUT`] to read a reply (a 100 MiB value on a busy
    /// machine).
    pub fn connect_large(s: &TestServer) -> Resp {
        let mut c = Resp::connect(s);
        c.w.set_read_timeout(Some(TIMEOUT * 4)).expect("timeout");
        c.r = std::io::BufReader::with_capacity(1 << 20, c.w.try_clone().expect("clone"));
        c
    }

    pub fn send(&mut self, args: &[&[u8]]) {
        use std::io::Write;
        self.w.write_all(&encode(args)).expect("writes");
    }

    /// One reply line, without its CRLF.
    pub fn line(&mut self) -> String {
        use std::io::BufRead;
        let mut line = Vec::new();
        self.r.read_until(b'\n', &mut line).expect("reads a reply");
        assert!(line.ends_with(b"\r\n"), "reply line {line:?}");
        line.truncate(line.len() - 2);
        String::from_utf8_lossy(&line).into_owned()
    }

    /// A bulk reply's bytes (`None` for a null bulk).
    pub fn bulk(&mut self) -> Option<Vec<u8>> {
        use std::io::Read;
        let head = self.line();
        let n = head
            .strip_prefix('$')
            .unwrap_or_else(|| panic!("bulk header, got {head}"));
        if n == "-1" {
            return None;
        }
        let n: usize = n.parse().expect("length");
        let mut v = vec![0; n + 2];
        self.r.read_exact(&mut v).expect("bulk body");
        assert_eq!(&v[n..], b"\r\n");
        v.truncate(n);
        Some(v)
    }

    /// [`Resp::send`] of byte arguments, and the reply's first line.
    pub fn call_bytes(&mut self, args: &[&[u8]]) -> String {
        self.send(args);
        self.line()
    }

    /// One numeric field of `INFO section`.
    pub fn info_field(&mut self, section: &str, field: &str) -> u64 {
        self.send(&[b"INFO", section.as_bytes()]);
        let text = String::from_utf8(self.bulk().expect("info")).expect("utf-8");
        text.lines()
            .find_map(|l| l.strip_prefix(&format!("{field}:")))
            .unwrap_or_else(|| panic!("{field} in {text}"))
            .trim()
            .parse()
            .expect("number")
    }

    /// [`Resp::send`] of text arguments.
    pub fn send_str(&mut self, args: &[&str]) {
        let a: Vec<&[u8]> = args.iter().map(|s| s.as_bytes()).collect();
        self.send(&a);
    }

    /// One reply, rendered as text (`+OK`, `:1`, `$v`, `nil`, `-ERR ...`,
    /// or `[a,b]` for arrays).
    pub fn reply(&mut self) -> String {
        use std::io::{BufRead, Read};
        let mut line = Vec::new();
        self.r.read_until(b'\n', &mut line).expect("reads a reply");
        assert!(line.ends_with(b"\r\n"), "reply line {line:?}");
        line.truncate(line.len() - 2);
        let text = String::from_utf8_lossy(&line[1..]).into_owned();
        match line.first() {
            Some(b'+') | Some(b'-') | Some(b':') => String::from_utf8_lossy(&line).into_owned(),
            Some(b'$') | Some(b'*') if text == "-1" => "nil".into(),
            Some(b'$') => {
                let n: usize = text.parse().expect("bulk length");
                let mut v = vec![0; n + 2];
                self.r.read_exact(&mut v).expect("bulk body");
                v.truncate(n);
                format!("${}", String::from_utf8_lossy(&v))
            }
            Some(b'*') => {
                let n: usize = text.parse().expect("array length");
                let items: Vec<String> = (0..n).map(|_| self.reply()).collect();
                format!("[{}]", items.join(","))
            }
            _ => panic!("not a RESP reply: {line:?}"),
        }
    }

    pub fn call(&mut self, args: &[&str]) -> String {
        self.send_str(args);
        self.reply()
    }

    /// Whether the server closed the connection (EOF within the timeout).
    pub fn closed(&mut self) -> bool {
        use std::io::Read;
        let mut b = [0u8; 1];
        matches!(self.r.read(&mut b), Ok(0))
    }
}

/// A command as a RESP array of bulk strings.
pub fn encode(args: &[&[u8]]) -> Vec<u8> {
    let mut v = format!("*{}\r\n", args.len()).into_bytes();
    for a in args {
        v.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
        v.extend_from_slice(a);
        v.extend_from_slice(b"\r\n");
    }
    v
}
