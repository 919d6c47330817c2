//! Idle native connections are closed after `idle_timeout_secs`: before,
//! a connection that finished its handshake could stay silent forever, so
//! `CONNECTIONS_MAX` idle sockets locked every new client out. A
//! connection that keeps asking is never idle.

use std::time::{Duration, Instant};

use fabrickv_client::{Client, Kv};
use fabrickv_server::Mode;
use fabrickv_transport::conformance_idle::{
    an_asking_connection_stays_while_a_silent_one_goes, closed, CLOSE_WITHIN,
};

#[allow(unused_macros)]
mod common;
use common::{TestServer, Transport, MEMORY_BYTES, TIMEOUT};

/// The idle timeout of these tests' servers, in seconds.
const IDLE_SECS: u64 = 1;

fn server(t: Transport) -> TestServer {
    TestServer::start_with(t, 2, Mode::Store, MEMORY_BYTES, |c| {
        c.idle_timeout_secs = IDLE_SECS;
    })
}

fn a_silent_connection_is_closed_after_the_idle_timeout(t: Transport) {
    let s = server(t);
    let mut ep = s.endpoint(0);
    let opened = Instant::now();
    while !closed(&mut *ep) {
        assert!(
            opened.elapsed() < CLOSE_WITHIN,
            "an idle connection is still open after {CLOSE_WITHIN:?}"
        );
    }
    assert!(
        opened.elapsed() >= Duration::from_secs(IDLE_SECS),
        "closed after {:?}, before the idle timeout",
        opened.elapsed()
    );
    s.shutdown();
}

fn a_connection_that_keeps_asking_is_not_idle(t: Transport) {
    let s = server(t);
    let mut c = Client::connect_with_timeout(&s.addr, TIMEOUT).expect("connect");
    c.put(b"k", b"v").expect("put");
    let mut silent = s.endpoint(1);
    an_asking_connection_stays_while_a_silent_one_goes(
        Duration::from_secs(IDLE_SECS),
        &mut *silent,
        || c.get(b"k").expect("an active client stays connected") == Some(b"v".to_vec()),
    );
    s.shutdown();
}

fn idle_timeout_0_keeps_silent_connections(t: Transport) {
    let s = TestServer::start_with(t, 1, Mode::Store, MEMORY_BYTES, |c| {
        c.idle_timeout_secs = 0;
    });
    let mut ep = s.endpoint(0);
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(3 * IDLE_SECS) {
        assert!(!closed(&mut *ep), "closed with the idle timeout off");
    }
    s.shutdown();
}

mod tcp {
    use crate::common::Transport;

    #[test]
    fn a_silent_connection_is_closed_after_the_idle_timeout() {
        super::a_silent_connection_is_closed_after_the_idle_timeout(Transport::Tcp)
    }
    #[test]
    fn a_connection_that_keeps_asking_is_not_idle() {
        super::a_connection_that_keeps_asking_is_not_idle(Transport::Tcp)
    }
    #[test]
    fn idle_timeout_0_keeps_silent_connections() {
        super::idle_timeout_0_keeps_silent_connections(Transport::Tcp)
    }
    #[test]
    fn a_client_closed_as_idle_dials_again() {
        super::a_client_closed_as_idle_dials_again(Transport::Tcp)
    }
}

mod shm {
    use crate::common::Transport;

    #[test]
    fn a_silent_connection_is_closed_after_the_idle_timeout() {
        super::a_silent_connection_is_closed_after_the_idle_timeout(Transport::Shm)
    }
    #[test]
    fn a_connection_that_keeps_asking_is_not_idle() {
        super::a_connection_that_keeps_asking_is_not_idle(Transport::Shm)
    }
    #[test]
    fn idle_timeout_0_keeps_silent_connections() {
        super::idle_timeout_0_keeps_silent_connections(Transport::Shm)
    }
    #[test]
    fn a_client_closed_as_idle_dials_again() {
        super::a_client_closed_as_idle_dials_again(Transport::Shm)
    }
}

/// A client whose connection the server closed as idle dials again before
/// its next request: the caller sees no error and nothing is lost.
fn a_client_closed_as_idle_dials_again(t: Transport) {
    let s = server(t);
    let mut c = Client::connect_with_timeout(&s.addr, TIMEOUT).expect("connect");
    c.put(b"k", b"v").expect("put");
    // Silent endpoints opened after the client's last request: once the
    // server has closed the second, opened after the first was closed
    // (so after the client's activity was last noted, which the server
    // does at its idle checks), it has closed the client's connections.
    let start = Instant::now();
    for _ in 0..2 {
        let mut later = s.endpoint(1);
        while !closed(&mut *later) {
            assert!(
                start.elapsed() < CLOSE_WITHIN,
                "the silent connection stayed"
            );
        }
    }
    for _ in 0..3 {
        assert_eq!(
            c.get(b"k").expect("a client closed as idle dials again"),
            Some(b"v".to_vec())
        );
    }
    c.put(b"k2", b"v2").expect("put after the redial");
    s.shutdown();
}
