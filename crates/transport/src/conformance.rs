//! One conformance suite for every transport (feature `conformance`).
//!
//! Each check is a function taking the address to listen on; a transport's
//! test file instantiates all of them with [`conformance_suite!`], giving a
//! function that makes a fresh address per test (`tcp://127.0.0.1:0`,
//! `inproc://unique`, `shm://unique`, ...). Transports from other crates
//! register their scheme with [`crate::register_scheme`] first.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::{connect, listen, Endpoint, PortStats, TransportError, Waker};
use fabrickv_types::limits::MESSAGE_BYTES_MAX;

const TIMEOUT: Duration = Duration::from_secs(10);

/// A server whose workers answer each message with `[worker] ++ message`.
struct EchoServer {
    addr: String,
    stop: Arc<AtomicBool>,
    wakers: Vec<Waker>,
    threads: Vec<JoinHandle<PortStats>>,
    acceptor: Option<JoinHandle<()>>,
}

impl EchoServer {
    fn start(addr: &str, workers: usize) -> EchoServer {
        let l = listen(addr, workers).expect("listen");
        let stop = Arc::new(AtomicBool::new(false));
        let mut wakers = vec![l.acceptor.waker()];
        let mut threads = Vec::new();
        for (w, mut port) in l.ports.into_iter().enumerate() {
            wakers.push(port.waker());
            let stop = stop.clone();
            threads.push(std::thread::spawn(move || {
                while !stop.load(Ordering::Acquire) {
                    let n = port
                        .poll(64, &mut |_, msg, reply| {
                            let out = reply.buf();
                            out.push(w as u8);
                            out.extend_from_slice(msg);
                        })
                        .expect("poll");
                    port.flush().expect("flush");
                    if n == 0 {
                        port.wait(Duration::from_millis(50)).expect("wait");
                    }
                }
                port.stats()
            }));
        }
        let mut acceptor = l.acceptor;
        let s = stop.clone();
        let acceptor = Some(std::thread::spawn(move || {
            acceptor.run(&s).expect("acceptor")
        }));
        EchoServer {
            addr: l.local_addr,
            stop,
            wakers,
            threads,
            acceptor,
        }
    }

    fn stop(mut self) -> Vec<PortStats> {
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

fn recv_one(ep: &mut dyn Endpoint) -> Vec<u8> {
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

/// Instantiates every conformance check as a `#[test]` in a module named
/// `$module`, each listening on a fresh address from `$addr()`.
#[macro_export]
macro_rules! conformance_suite {
    ($module:ident, $addr:expr) => {
        mod $module {
            $crate::conformance_suite!(@tests $addr;
                round_trip,
                pipelined_messages_keep_order,
                connections_bind_to_their_worker,
                unknown_worker_is_refused,
                largest_message_round_trips,
                oversized_and_empty_posts_are_refused,
                many_clients_at_once,
                closed_server_is_reported,
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
