//! One conformance suite for every transport (feature `conformance`).
//!
//! Each check is a function taking the address to listen on; a transport's
//! test file instantiates all of them with [`crate::conformance_suite!`], giving a
//! function that makes a fresh address per test (`tcp://127.0.0.1:0`,
//! `inproc://unique`, `shm://unique`, ...). Transports from other crates
//! register their scheme with [`crate::register_scheme`] first.
//!
//! The one-sided checks (`one_sided_*`, `reply_*`) run in full on every
//! transport whose [`Capabilities`] report one-sided access (shm, fabric
//! with `FI_RMA`); on the others they check that the capabilities are
//! honest (the calls they deny fail with `Unsupported`).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::{
    connect, connect_with, listen_with, Capabilities, Dial, Endpoint, ListenOptions,
    MessageHandler, PortStats, RemoteRegion, TransportError, Waker, WorkerPort,
};
use fabrickv_types::limits::MESSAGE_BYTES_MAX;

const TIMEOUT: Duration = Duration::from_secs(10);

/// A server running one thread per worker port (each returning a `T`
/// when stopped) and the acceptor on a thread of its own.
struct Server<T> {
    addr: String,
    stop: Arc<AtomicBool>,
    wakers: Vec<Waker>,
    threads: Vec<JoinHandle<T>>,
    acceptor: Option<JoinHandle<()>>,
}

impl<T: Send + 'static> Server<T> {
    /// Listens on `addr` with `workers` ports, each run by
    /// `worker(index, port, stop)` on its own thread.
    fn start<W>(addr: &str, workers: usize, worker: W) -> Server<T>
    where
        W: Fn(usize, Box<dyn WorkerPort>, &AtomicBool) -> T + Clone + Send + 'static,
    {
        Server::start_with(addr, &ListenOptions::workers(workers), worker)
    }

    /// As [`Server::start`], listening as `opts` say.
    fn start_with<W>(addr: &str, opts: &ListenOptions, worker: W) -> Server<T>
    where
        W: Fn(usize, Box<dyn WorkerPort>, &AtomicBool) -> T + Clone + Send + 'static,
    {
        let l = listen_with(addr, opts).expect("listen");
        let stop = Arc::new(AtomicBool::new(false));
        let mut wakers = vec![l.acceptor.waker()];
        let mut threads = Vec::new();
        for (w, port) in l.ports.into_iter().enumerate() {
            wakers.push(port.waker());
            let stop = stop.clone();
            let worker = worker.clone();
            threads.push(std::thread::spawn(move || worker(w, port, &stop)));
        }
        let mut acceptor = l.acceptor;
        let s = stop.clone();
        let acceptor = Some(std::thread::spawn(move || {
            acceptor.run(&s).expect("acceptor")
        }));
        Server {
            addr: l.local_addr,
            stop,
            wakers,
            threads,
            acceptor,
        }
    }

    /// Stops every thread; returns what each worker returned.
    fn stop(mut self) -> Vec<T> {
        self.stop.store(true, Ordering::Release);
        for w in &self.wakers {
            w.wake();
        }
        let _ = self.acceptor.take().map(|a| a.join());
        self.threads
            .drain(..)
            .map(|t| t.join().expect("worker"))
            .collect()
    }
}

/// Runs `handler` over `port` until `stop` is set.
fn serve(port: &mut dyn WorkerPort, stop: &AtomicBool, handler: &mut MessageHandler<'_>) {
    while !stop.load(Ordering::Acquire) {
        let n = port.poll(64, handler).expect("poll");
        port.flush().expect("flush");
        if n == 0 {
            port.wait(Duration::from_millis(50)).expect("wait");
        }
    }
}

/// A server whose workers answer each message with `[worker] ++ message`.
struct EchoServer;

impl EchoServer {
    fn start(addr: &str, workers: usize) -> Server<PortStats> {
        EchoServer::start_with(addr, &ListenOptions::workers(workers))
    }

    fn start_with(addr: &str, opts: &ListenOptions) -> Server<PortStats> {
        Server::start_with(addr, opts, |w, mut port, stop| {
            serve(&mut *port, stop, &mut |_, msg, reply| {
                let out = reply.buf();
                out.push(w as u8);
                out.extend_from_slice(msg);
            });
            port.stats()
        })
    }
}

/// Waits for the next message on `ep` (a test helper for transports'
/// own tests too).
pub fn recv_one(ep: &mut dyn Endpoint) -> Vec<u8> {
    let deadline = Instant::now() + TIMEOUT;
    loop {
        let mut got = None;
        ep.poll(1, &mut |m| got = Some(m.to_vec())).expect("poll");
        if let Some(m) = got {
            return m;
        }
        assert!(Instant::now() < deadline, "no reply within {TIMEOUT:?}");
        ep.wait(Duration::from_millis(100)).expect("wait");
    }
}

/// Conformance check; see the module docs.
pub fn round_trip(addr: String) {
    let s = EchoServer::start(&addr, 1);
    let mut ep = connect(&s.addr, 0, TIMEOUT).expect("connect");
    ep.post(b"ping").expect("post");
    ep.flush(TIMEOUT).expect("flush");
    assert_eq!(recv_one(&mut *ep), b"\0ping");
    drop(ep);
    let stats = s.stop();
    assert_eq!(stats[0].msgs_in, 1);
    assert_eq!(stats[0].msgs_out, 1);
}

/// Conformance check: a server with a secret lets in only a client that
/// proves it, and says why it refuses the others with a stable code
/// before reading anything of theirs. `inproc://` is reached only from
/// the server's own process and asks for no secret.
pub fn secret_is_proved_in_the_handshake(addr: String) {
    let secret = |s: &str| fabrickv_auth::Secret::from_bytes(s.as_bytes(), "test").ok();
    let opts = ListenOptions {
        secret: secret("the cluster secret of this test"),
        ..ListenOptions::workers(2)
    };
    let s = EchoServer::start_with(&addr, &opts);
    let dial = |secret| Dial {
        timeout: TIMEOUT,
        secret,
    };
    for worker in 0..2u16 {
        let mut ep = connect_with(&s.addr, worker, &dial(opts.secret.clone())).expect("connect");
        ep.post(b"ping").expect("post");
        ep.flush(TIMEOUT).expect("flush");
        assert_eq!(recv_one(&mut *ep), [&[worker as u8][..], b"ping"].concat());
    }
    let refusals = [
        (
            None,
            fabrickv_types::ErrorCode::AuthRequired,
            "--auth-token-file",
        ),
        (
            secret("another secret, same length!!!"),
            fabrickv_types::ErrorCode::AuthFailed,
            "different secrets",
        ),
    ];
    for (offered, code, words) in refusals {
        match connect_with(&s.addr, 1, &dial(offered)) {
            Err(TransportError::Denied(c, why)) => {
                assert_eq!(c, code, "{why}");
                assert!(why.contains(words), "{why}");
            }
            Err(e) => panic!("expected {code}, got {e}"),
            Ok(_) if s.addr.starts_with("inproc://") => {}
            Ok(_) => panic!("a client without the secret got in"),
        }
    }
    // A client with a secret still reaches a server that asks for none.
    let open = EchoServer::start(&addr_like(&addr), 1);
    let mut ep = connect_with(&open.addr, 0, &dial(opts.secret.clone())).expect("connect");
    ep.post(b"x").expect("post");
    ep.flush(TIMEOUT).expect("flush");
    assert_eq!(recv_one(&mut *ep), b"\0x");
    drop(ep);
    open.stop();
    let stats = s.stop();
    let served: u64 = stats.iter().map(|st| st.msgs_in).sum();
    assert_eq!(served, 2, "only the two proved connections were read");
}

/// A second address of the kind of `addr` (a fresh name for named
/// transports, port 0 for the others).
fn addr_like(addr: &str) -> String {
    match addr.rsplit_once("://") {
        Some((scheme, rest)) if !rest.contains(':') => {
            format!("{scheme}://{rest}-second")
        }
        _ => addr.to_string(),
    }
}

/// Conformance check; see the module docs.
pub fn pipelined_messages_keep_order(addr: String) {
    let s = EchoServer::start(&addr, 1);
    let mut ep = connect(&s.addr, 0, TIMEOUT).expect("connect");
    const N: u32 = 5_000;
    for i in 0..N {
        ep.post(&i.to_le_bytes()).expect("post");
    }
    ep.flush(TIMEOUT).expect("flush");
    for i in 0..N {
        let m = recv_one(&mut *ep);
        assert_eq!(m[1..], i.to_le_bytes(), "message {i} out of order");
    }
    drop(ep);
    s.stop();
}

/// Conformance check; see the module docs.
pub fn connections_bind_to_their_worker(addr: String) {
    let s = EchoServer::start(&addr, 3);
    let mut eps: Vec<_> = (0..3u16)
        .map(|w| connect(&s.addr, w, TIMEOUT).expect("connect"))
        .collect();
    for ep in &mut eps {
        ep.post(b"x").expect("post");
        ep.flush(TIMEOUT).expect("flush");
    }
    for (w, ep) in eps.iter_mut().enumerate() {
        assert_eq!(
            recv_one(&mut **ep)[0],
            w as u8,
            "served by the wrong worker"
        );
    }
    drop(eps);
    s.stop();
}

/// Conformance check; see the module docs.
pub fn unknown_worker_is_refused(addr: String) {
    let s = EchoServer::start(&addr, 2);
    match connect(&s.addr, 2, TIMEOUT) {
        // Every transport words it alike: the worker, the stable code and
        // how many workers there are.
        Err(TransportError::Refused(why)) => assert!(
            why.contains("worker 2: NO_SUCH_WORKER (server has 2 workers)"),
            "{why}"
        ),
        Err(e) => panic!("expected a refusal, got {e}"),
        Ok(_) => panic!("connected to a worker that does not exist"),
    }
    s.stop();
}

/// Conformance check; see the module docs.
pub fn largest_message_round_trips(addr: String) {
    let s = EchoServer::start(&addr, 1);
    let mut ep = connect(&s.addr, 0, TIMEOUT).expect("connect");
    let big: Vec<u8> = (0..MESSAGE_BYTES_MAX - 1)
        .map(|i| (i % 251) as u8)
        .collect();
    ep.post(&big).expect("post");
    ep.flush(TIMEOUT).expect("flush");
    let m = recv_one(&mut *ep);
    assert_eq!(m.len(), MESSAGE_BYTES_MAX);
    assert!(m[1..] == big[..], "large message corrupted");
    drop(ep);
    s.stop();
}

/// Conformance check; see the module docs.
pub fn oversized_and_empty_posts_are_refused(addr: String) {
    let s = EchoServer::start(&addr, 1);
    let mut ep = connect(&s.addr, 0, TIMEOUT).expect("connect");
    let big = vec![0u8; MESSAGE_BYTES_MAX + 1];
    assert!(matches!(
        ep.post(&big),
        Err(TransportError::MessageTooLarge(_))
    ));
    assert!(matches!(
        ep.post(b""),
        Err(TransportError::MessageTooLarge(0))
    ));
    // The connection still works after refused posts.
    ep.post(b"ok").expect("post");
    ep.flush(TIMEOUT).expect("flush");
    assert_eq!(recv_one(&mut *ep), b"\0ok");
    drop(ep);
    s.stop();
}

/// Conformance check; see the module docs.
pub fn many_clients_at_once(addr: String) {
    let s = EchoServer::start(&addr, 2);
    let threads: Vec<_> = (0..8u32)
        .map(|t| {
            let a = s.addr.clone();
            std::thread::spawn(move || {
                let mut ep = connect(&a, (t % 2) as u16, TIMEOUT).expect("connect");
                for round in 0..50u32 {
                    let tag = (t << 16 | round).to_le_bytes();
                    for _ in 0..4 {
                        ep.post(&tag).expect("post");
                    }
                    ep.flush(TIMEOUT).expect("flush");
                    for _ in 0..4 {
                        assert_eq!(recv_one(&mut *ep)[1..], tag);
                    }
                }
            })
        })
        .collect();
    for t in threads {
        t.join().expect("client thread");
    }
    let stats = s.stop();
    assert_eq!(stats.iter().map(|s| s.msgs_in).sum::<u64>(), 8 * 50 * 4);
    assert_eq!(stats.iter().map(|s| s.conns_accepted).sum::<u64>(), 8);
}

/// Conformance check; see the module docs.
pub fn closed_server_is_reported(addr: String) {
    let s = EchoServer::start(&addr, 1);
    let mut ep = connect(&s.addr, 0, TIMEOUT).expect("connect");
    s.stop();
    let deadline = Instant::now() + TIMEOUT;
    loop {
        match ep.poll(1, &mut |_| {}) {
            Err(TransportError::Closed) => break,
            Err(e) => panic!("expected Closed, got {e}"),
            Ok(_) => {}
        }
        assert!(Instant::now() < deadline, "closure never reported");
        let _ = ep.wait(Duration::from_millis(50));
    }
}

/// Bytes of the region a [`RegionServer`] registers: large enough that a
/// transfer crosses fabric's RMA staging size (256 KiB).
const SERVER_REGION_BYTES: usize = 1 << 20;

/// Bytes of the region a client registers for the server to write.
const CLIENT_REGION_BYTES: usize = 600 * 1024;

/// A [`RegionServer`]'s answer to `D` when its port registers nothing.
const NO_REGION: &[u8] = b"none";

/// The byte at `i` of a [`RegionServer`]'s region before anyone writes.
fn pattern(i: usize) -> u8 {
    (i % 251) as u8
}

/// A one-worker server that registers a region filled with [`pattern`]
/// (where its port can) and answers:
/// - `D`: the region's descriptor ([`NO_REGION`] if it has none);
/// - `W` descriptor(24) offset(u64) data: writes `data` into the client's
///   region through the reply, then replies `ok`, `BadRegion` or
///   `err:` and the error.
///
/// When stopped, its worker returns the region's bytes.
struct RegionServer;

impl RegionServer {
    fn start(addr: &str) -> Server<Vec<u8>> {
        Server::start(addr, 1, |_, mut port, stop| {
            let caps = port.capabilities();
            let region = caps.memory_registration.then(|| {
                let r = port.register(SERVER_REGION_BYTES).expect("register");
                let view = port.local_region(&r).expect("own region");
                for (i, b) in view.iter_mut().enumerate() {
                    *b = pattern(i);
                }
                r
            });
            serve(&mut *port, stop, &mut |_, msg, reply| match msg.first() {
                Some(b'D') => match &region {
                    Some(r) => r.encode(reply.buf()),
                    None => reply.buf().extend_from_slice(NO_REGION),
                },
                Some(b'W') => {
                    let r = RemoteRegion::decode(&msg[1..]).expect("descriptor");
                    let at = 1 + RemoteRegion::ENCODED_BYTES;
                    let off = u64::from_le_bytes(msg[at..at + 8].try_into().expect("offset"));
                    let out = match reply.write_remote(&r, off as usize, &msg[at + 8..]) {
                        Ok(()) => b"ok".to_vec(),
                        Err(TransportError::BadRegion(_)) => b"BadRegion".to_vec(),
                        Err(e) => format!("err:{e}").into_bytes(),
                    };
                    reply.buf().extend_from_slice(&out);
                }
                _ => reply.buf().extend_from_slice(b"?"),
            });
            match region {
                Some(r) => port.local_region(&r).expect("own region").to_vec(),
                None => Vec::new(),
            }
        })
    }
}

/// Sends `msg` and waits for the reply (a test helper for transports'
/// own tests too).
pub fn call(ep: &mut dyn Endpoint, msg: &[u8]) -> Vec<u8> {
    ep.post(msg).expect("post");
    ep.flush(TIMEOUT).expect("flush");
    recv_one(ep)
}

/// The request that makes a [`RegionServer`] write `data` at `offset` of
/// `region`.
fn write_request(region: &RemoteRegion, offset: u64, data: &[u8]) -> Vec<u8> {
    let mut m = vec![b'W'];
    region.encode(&mut m);
    m.extend_from_slice(&offset.to_le_bytes());
    m.extend_from_slice(data);
    m
}

fn is_unsupported<T>(r: crate::Result<T>) -> bool {
    matches!(r, Err(TransportError::Unsupported(_)))
}

fn is_bad_region<T>(r: crate::Result<T>) -> bool {
    matches!(r, Err(TransportError::BadRegion(_)))
}

/// A client of `s`, if its connection reports one-sided access (the
/// checks that need it pass trivially elsewhere).
fn one_sided_client(s: &Server<Vec<u8>>) -> Option<Box<dyn Endpoint>> {
    let ep = connect(&s.addr, 0, TIMEOUT).expect("connect");
    ep.capabilities().one_sided().then_some(ep)
}

/// Conformance check; see the module docs. A transport that reports no
/// one-sided access refuses each such call with `Unsupported`, on both
/// sides; one that reports it has both sides agree.
pub fn capabilities_are_honest(addr: String) {
    let s = RegionServer::start(&addr);
    let mut ep = connect(&s.addr, 0, TIMEOUT).expect("connect");
    let caps = ep.capabilities();
    let served = call(&mut *ep, b"D");
    assert_eq!(
        served == NO_REGION,
        !caps.memory_registration,
        "client and server disagree on registration ({caps:?})"
    );
    let some = RemoteRegion {
        addr: 0,
        len: 64,
        key: 0,
    };
    if !caps.memory_registration {
        assert!(is_unsupported(ep.register(64)));
        assert!(is_unsupported(ep.local_region(&some).map(|_| ())));
        let reply = call(&mut *ep, &write_request(&some, 0, b"x"));
        assert!(reply.starts_with(b"err:"), "{reply:?}");
    }
    if !caps.one_sided_write {
        assert!(is_unsupported(ep.write_remote(&some, 0, b"x")));
    }
    if !caps.one_sided_read {
        assert!(is_unsupported(ep.read_remote(&some, 0, &mut [0; 1])));
    }
    if caps == Capabilities::NONE {
        assert!(!caps.one_sided());
    }
    drop(ep);
    s.stop();
}

/// Conformance check; see the module docs. The client reads the server's
/// region and writes it; the server sees the writes in its own view; a
/// client that connects later reaches the same region; accesses outside
/// it are refused before anything moves.
pub fn one_sided_client_reads_and_writes_the_server_region(addr: String) {
    let s = RegionServer::start(&addr);
    let Some(mut ep) = one_sided_client(&s) else {
        s.stop();
        return;
    };
    let region = RemoteRegion::decode(&call(&mut *ep, b"D")).expect("descriptor");
    assert_eq!(region.len, SERVER_REGION_BYTES as u64);

    // Larger than one RMA staging slot (256 KiB on fabric).
    let mut out = vec![0u8; 300 * 1024];
    ep.read_remote(&region, 100_000, &mut out).expect("read");
    assert!(out
        .iter()
        .enumerate()
        .all(|(i, &b)| b == pattern(100_000 + i)));
    let data: Vec<u8> = (0..1000u32).map(|i| (i % 7) as u8).collect();
    ep.write_remote(&region, 1000, &data).expect("write");
    let mut back = vec![0u8; data.len()];
    ep.read_remote(&region, 1000, &mut back).expect("read back");
    assert_eq!(back, data);

    let end = SERVER_REGION_BYTES;
    assert!(is_bad_region(ep.read_remote(
        &region,
        end - 10,
        &mut [0; 20]
    )));
    assert!(is_bad_region(ep.write_remote(&region, end - 2, b"four")));
    assert!(is_bad_region(ep.write_remote(&region, usize::MAX, b"x")));
    assert!(is_bad_region(ep.read_remote(
        &region,
        usize::MAX,
        &mut [0; 4]
    )));

    let mut late = connect(&s.addr, 0, TIMEOUT).expect("connect");
    assert_eq!(RemoteRegion::decode(&call(&mut *late, b"D")), Some(region));
    let mut back = [0u8; 5];
    late.read_remote(&region, 1000, &mut back)
        .expect("late read");
    assert_eq!(back, data[..5]);

    drop((ep, late));
    let seen = s.stop().remove(0);
    assert_eq!(&seen[1000..2000], &data[..], "the server's view");
    assert_eq!(seen[999], pattern(999));
    assert_eq!(seen[2000], pattern(2000));
}

/// Conformance check; see the module docs. A handler's one-sided write
/// into the client's region is in place when the reply that announces it
/// arrives (sizes below and above fabric's RMA staging slot); a write
/// that overruns the region is refused and moves nothing, and the
/// connection lives on.
pub fn one_sided_reply_write_lands_before_the_reply(addr: String) {
    let s = RegionServer::start(&addr);
    let Some(mut ep) = one_sided_client(&s) else {
        s.stop();
        return;
    };
    let mine = ep.register(CLIENT_REGION_BYTES).expect("register");
    assert_eq!(mine.len, CLIENT_REGION_BYTES as u64);
    assert!(ep
        .local_region(&mine)
        .expect("view")
        .iter()
        .all(|&b| b == 0));
    for round in 0..20u64 {
        let data = format!("from the server, round {round}");
        let off = round * 1000;
        assert_eq!(
            call(&mut *ep, &write_request(&mine, off, data.as_bytes())),
            b"ok"
        );
        let view = ep.local_region(&mine).expect("view");
        assert_eq!(
            &view[off as usize..off as usize + data.len()],
            data.as_bytes()
        );
    }
    let (off, big) = (32 * 1024, vec![9u8; 300 * 1024]);
    assert_eq!(call(&mut *ep, &write_request(&mine, off, &big)), b"ok");
    let view = ep.local_region(&mine).expect("view");
    assert!(
        view[off as usize..off as usize + big.len()] == big[..],
        "a large write is not in place when its reply came"
    );

    let end = CLIENT_REGION_BYTES as u64;
    assert_eq!(
        call(&mut *ep, &write_request(&mine, end - 2, b"xyz")),
        b"BadRegion"
    );
    let view = ep.local_region(&mine).expect("view");
    assert!(view[end as usize - 2..].iter().all(|&b| b == 0));
    // The connection still works.
    assert_eq!(
        call(&mut *ep, &write_request(&mine, end - 4, b"fits")),
        b"ok"
    );
    drop(ep);
    s.stop();
}

/// Instantiates every conformance check as a `#[test]` in a module named
/// `$module`, each listening on a fresh address from `$addr()`.
#[macro_export]
macro_rules! conformance_suite {
    ($module:ident, $addr:expr) => {
        mod $module {
            $crate::conformance_suite!(@tests $addr;
                round_trip,
                secret_is_proved_in_the_handshake,
                pipelined_messages_keep_order,
                connections_bind_to_their_worker,
                unknown_worker_is_refused,
                largest_message_round_trips,
                oversized_and_empty_posts_are_refused,
                many_clients_at_once,
                closed_server_is_reported,
                capabilities_are_honest,
                one_sided_client_reads_and_writes_the_server_region,
                one_sided_reply_write_lands_before_the_reply,
            );
        }
    };
    (@tests $addr:expr; $($test:ident),* $(,)?) => {
        $(
            #[test]
            fn $test() {
                $crate::conformance::$test(($addr)())
            }
        )*
    };
}
