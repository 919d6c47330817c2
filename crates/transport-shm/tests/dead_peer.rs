//! A client that stops reading its replies and then closes is reaped,
//! however full its rings are: before the fix such a
//! connection's socket, eventfds, 8 MiB of shared memory and its slot of
//! `SHM_CONNECTIONS_MAX` stayed until restart, so 256 of them locked every
//! new shm client out.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use fabrickv_transport::conformance_evict::{wait_for, OneWorker, TIMEOUT};
use fabrickv_transport_shm::{ShmEndpoint, SHM_CONNECTIONS_MAX};

mod common;
use common::unique;

/// Bytes of each reply: a one-byte request makes the server write this
/// much, so a few dozen requests fill the 4 MiB reply ring.
const REPLY_BYTES: usize = 64 << 10;

/// Requests each connection posts: 8 MiB of replies, more than the reply
/// ring and the port's staging bound (`CONN_SEND_QUEUE_BYTES_MAX`) hold,
/// so the port stops reading the connection.
const REQUESTS_PER_CONN: usize = 128;

/// A one-worker server on `shm://NAME` whose port answers every request
/// with `REPLY_BYTES` and publishes its counters; returns it and `NAME`.
fn start() -> (OneWorker, String) {
    let name = unique("dead");
    let s = OneWorker::start(&format!("shm://{name}"), |_, _, reply| {
        reply.buf().resize(REPLY_BYTES, 0x5a);
    });
    (s, name)
}

/// Connects, asks for more replies than the server can hold, reads none,
/// and returns once the server has stopped reading the connection.
fn flood_unread(s: &OneWorker, name: &str, i: usize) -> ShmEndpoint {
    let mut ep = ShmEndpoint::connect(name, 0, TIMEOUT)
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
    let (s, name) = start();
    // One and a half times the cap, one after another: before the fix
    // the 257th was refused ("256 shm connections open").
    for i in 0..SHM_CONNECTIONS_MAX * 3 / 2 {
        drop(flood_unread(&s, &name, i));
        wait_for("the closed connection to be reaped", || {
            s.open.load(Ordering::Acquire) == 0
        });
    }
    // Many at once, all stuck, then all closed together.
    let stuck: Vec<ShmEndpoint> = (0..SHM_CONNECTIONS_MAX / 4)
        .map(|i| flood_unread(&s, &name, i))
        .collect();
    assert_eq!(s.open.load(Ordering::Acquire), stuck.len() as u64);
    drop(stuck);
    wait_for("every closed connection to be reaped", || {
        s.open.load(Ordering::Acquire) == 0
    });
    // And a well-behaved client still gets in and is answered.
    let mut ep = ShmEndpoint::connect(&name, 0, TIMEOUT).expect("a new client");
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
