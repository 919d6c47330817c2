//! A client that stops reading its replies and then closes is reaped,
//! however full its rings are: before the fix such a
//! connection's socket, eventfds, 8 MiB of shared memory and its slot of
//! `SHM_CONNECTIONS_MAX` stayed until restart, so 256 of them locked every
//! new shm client out.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use fabrickv_transport_shm::{ShmEndpoint, SHM_CONNECTIONS_MAX};

mod common;
use common::unique;

/// Deadline of every step; generous, as the machine may be loaded.
const TIMEOUT: Duration = Duration::from_secs(30);

/// Bytes of each reply: a one-byte request makes the server write this
/// much, so a few dozen requests fill the 4 MiB reply ring.
const REPLY_BYTES: usize = 64 << 10;

/// Requests each connection posts: 8 MiB of replies, more than the reply
/// ring and the port's staging bound (`CONN_SEND_QUEUE_BYTES_MAX`) hold,
/// so the port stops reading the connection.
const REQUESTS_PER_CONN: usize = 128;

/// A one-worker server whose port answers every request with
/// `REPLY_BYTES` and publishes its counters.
struct Server {
    name: String,
    stop: Arc<AtomicBool>,
    open: Arc<AtomicU64>,
    pauses: Arc<AtomicU64>,
    threads: Vec<JoinHandle<()>>,
    wakers: Vec<fabrickv_transport::Waker>,
}

impl Server {
    fn start() -> Server {
        let name = unique("dead");
        let l = fabrickv_transport::listen(&format!("shm://{name}"), 1).expect("listen");
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
                let n = port
                    .poll(64, &mut |_, _, reply| {
                        reply.buf().resize(REPLY_BYTES, 0x5a);
                    })
                    .expect("poll");
                port.flush().expect("flush");
                let st = port.stats();
                o.store(st.conns_open, Ordering::Release);
                p.store(st.backpressure_pauses, Ordering::Release);
                if n == 0 {
                    port.wait(Duration::from_millis(10)).expect("wait");
                }
            }
        }));
        Server {
            name,
            stop,
            open,
            pauses,
            threads,
            wakers,
        }
    }
}

impl Drop for Server {
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

fn wait_for(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + TIMEOUT;
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// Connects, asks for more replies than the server can hold, reads none,
/// and returns once the server has stopped reading the connection.
fn flood_unread(s: &Server, i: usize) -> ShmEndpoint {
    let mut ep = ShmEndpoint::connect(&s.name, 0, TIMEOUT)
        .unwrap_or_else(|e| panic!("client {i} locked out: {e}"));
    let before = s.pauses.load(Ordering::Acquire);
    for _ in 0..REQUESTS_PER_CONN {
        assert!(ep.post_unread(b"r").expect("post"), "request ring full");
    }
    wait_for("the server to stop reading a full connection", || {
        s.pauses.load(Ordering::Acquire) > before
    });
    ep
}

#[test]
fn closed_clients_with_full_reply_rings_are_reaped_and_lock_no_one_out() {
    let s = Server::start();
    // One and a half times the cap, one after another: before the fix
    // the 257th was refused ("256 shm connections open").
    for i in 0..SHM_CONNECTIONS_MAX * 3 / 2 {
        drop(flood_unread(&s, i));
        wait_for("the closed connection to be reaped", || {
            s.open.load(Ordering::Acquire) == 0
        });
    }
    // Many at once, all stuck, then all closed together.
    let stuck: Vec<ShmEndpoint> = (0..SHM_CONNECTIONS_MAX / 4)
        .map(|i| flood_unread(&s, i))
        .collect();
    assert_eq!(s.open.load(Ordering::Acquire), stuck.len() as u64);
    drop(stuck);
    wait_for("every closed connection to be reaped", || {
        s.open.load(Ordering::Acquire) == 0
    });
    // And a well-behaved client still gets in and is answered.
    let mut ep = ShmEndpoint::connect(&s.name, 0, TIMEOUT).expect("a new client");
    assert!(ep.post_unread(b"r").expect("post"));
    let deadline = Instant::now() + TIMEOUT;
    let mut got = 0;
    while got == 0 {
        assert!(Instant::now() < deadline, "no reply");
        got = fabrickv_transport::Endpoint::poll(&mut ep, 1, &mut |m| {
            assert_eq!(m.len(), REPLY_BYTES)
        })
        .expect("poll");
        let _ = fabrickv_transport::Endpoint::wait(&mut ep, Duration::from_millis(10));
    }
}
