//! A conformance check for every transport with a connection cap: at the
//! cap, a newcomer closes the longest-idle connection instead of being
//! refused (before, the cap's worth of idle connections locked every new
//! client out for good). Each transport's test calls
//! [`at_the_cap_the_longest_idle_connection_makes_way`] with its address
//! and its cap. Its one-worker server ([`OneWorker`]) and [`wait_for`]
//! serve transports' own tests of their connections' lives too.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::{ConnId, Endpoint, Reply, Waker};

/// Deadline of every step; generous, as the machine may be loaded.
pub const TIMEOUT: Duration = Duration::from_secs(30);

/// Newcomers let in past the cap, one after another.
const NEWCOMERS: usize = 8;

/// A one-worker server on threads of its own (the acceptor's and the
/// port's) whose port answers through a handler and publishes its
/// counters; dropping it stops and joins both threads. The evict check
/// runs one as an echo server; transports' own tests run others.
pub struct OneWorker {
    /// The address it listens on, as the listener reports it.
    pub addr: String,
    /// The port's `conns_open`, as last published.
    pub open: Arc<AtomicU64>,
    /// The port's `backpressure_pauses`, as last published.
    pub pauses: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
    wakers: Vec<Waker>,
}

impl OneWorker {
    /// Listens on `addr` with one port, which answers each message with
    /// `handler`.
    pub fn start(
        addr: &str,
        mut handler: impl FnMut(ConnId, &[u8], &mut dyn Reply) + Send + 'static,
    ) -> OneWorker {
        let l = crate::listen(addr, 1).expect("listen");
        let stop = Arc::new(AtomicBool::new(false));
        let open = Arc::new(AtomicU64::new(0));
        let pauses = Arc::new(AtomicU64::new(0));
        let mut acceptor = l.acceptor;
        let mut wakers = vec![acceptor.waker()];
        let s = stop.clone();
        let mut threads = vec![std::thread::spawn(move || {
            acceptor.run(&s).expect("acceptor")
        })];
        let mut port = l.ports.into_iter().next().expect("port");
        wakers.push(port.waker());
        let (s, o, p) = (stop.clone(), open.clone(), pauses.clone());
        threads.push(std::thread::spawn(move || {
            while !s.load(Ordering::Acquire) {
                let n = port.poll(64, &mut handler).expect("poll");
                port.flush().expect("flush");
                let st = port.stats();
                o.store(st.conns_open, Ordering::Release);
                p.store(st.backpressure_pauses, Ordering::Release);
                if n == 0 {
                    port.wait(Duration::from_millis(10)).expect("wait");
                }
            }
        }));
        OneWorker {
            addr: l.local_addr,
            open,
            pauses,
            stop,
            threads,
            wakers,
        }
    }
}

impl Drop for OneWorker {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        for w in &self.wakers {
            w.wake();
        }
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// Waits until `cond` holds, failing the test after [`TIMEOUT`] with
/// `what` it was waiting for.
pub fn wait_for(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + TIMEOUT;
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// Sends `msg` and waits for its echo; false if the connection is closed.
fn echo(ep: &mut dyn Endpoint, msg: &[u8]) -> bool {
    if ep.post(msg).is_err() || ep.flush(TIMEOUT).is_err() {
        return false;
    }
    let deadline = Instant::now() + TIMEOUT;
    loop {
        let mut got = None;
        match ep.poll(1, &mut |m| got = Some(m.to_vec())) {
            Err(_) => return false,
            Ok(_) if got.is_some() => return got.as_deref() == Some(msg),
            Ok(_) => {}
        }
        assert!(Instant::now() < deadline, "no echo");
        let _ = ep.wait(Duration::from_millis(10));
    }
}

/// Whether the server has closed `ep`.
fn closed(ep: &mut dyn Endpoint) -> bool {
    if ep.poll(usize::MAX, &mut |_| {}).is_err() {
        return true;
    }
    ep.wait(Duration::from_millis(10)).is_err() || ep.poll(usize::MAX, &mut |_| {}).is_err()
}

/// With `cap` connections open, every newcomer gets in and the
/// longest-idle connection is closed for it; one that just asked stays.
/// The check: a one-worker echo server on `addr`, filled to its
/// transport's connection `cap` with idle connections, lets `NEWCOMERS`
/// newcomers in one after another, each closing the longest-idle one,
/// while a connection in use stays.
pub fn at_the_cap_the_longest_idle_connection_makes_way(addr: &str, cap: usize) {
    let s = OneWorker::start(addr, |_, m, reply| reply.buf().extend_from_slice(m));
    let mut held: Vec<Box<dyn Endpoint>> = (0..cap)
        .map(|i| {
            crate::connect(&s.addr, 0, TIMEOUT)
                .unwrap_or_else(|e| panic!("connection {i} of the cap: {e}"))
        })
        .collect();
    wait_for("every connection to be open", || {
        s.open.load(Ordering::Acquire) == cap as u64
    });
    // The first one asks again: the longest idle is now the second.
    assert!(echo(&mut *held[0], b"still here"));
    let mut refusals = 0;
    for n in 0..NEWCOMERS {
        let deadline = Instant::now() + TIMEOUT;
        let mut ep = loop {
            // A refusal here can only come before the ports have reported
            // their idle connections (twice a second).
            match crate::connect(&s.addr, 0, TIMEOUT) {
                Ok(ep) => break ep,
                Err(e) => {
                    refusals += 1;
                    assert!(Instant::now() < deadline, "newcomer {n} locked out: {e}");
                    std::thread::sleep(Duration::from_millis(50));
                }
            }
        };
        assert!(echo(&mut *ep, b"new"), "newcomer {n} is not answered");
        let evicted = n + 1;
        wait_for("the longest-idle connection to be closed", || {
            closed(&mut *held[evicted])
        });
        held.push(ep);
    }
    assert!(
        echo(&mut *held[0], b"still here"),
        "the active connection was closed"
    );
    assert!(
        s.open.load(Ordering::Acquire) <= cap as u64,
        "over the cap: {}",
        s.open.load(Ordering::Acquire)
    );
    eprintln!("{NEWCOMERS} newcomers past a cap of {cap}: {refusals} refusals first");
}
