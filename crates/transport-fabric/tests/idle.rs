//! Idle fabric connections are closed after `idle_timeout_secs` (issue
//! 28, fault 6), as tcp and shm ones are (server/tests/idle.rs): a
//! connection silent that long with nothing in flight, never one that
//! keeps asking.

use std::time::{Duration, Instant};

use fabrickv_client::{Client, Kv};
use fabrickv_server::Server;
use fabrickv_transport::{Endpoint, TransportError};

mod common;

/// The idle timeout of these tests' servers, in seconds.
const IDLE_SECS: u64 = 1;

/// How long a test waits for the server to close an idle connection: many
/// times the timeout, for a loaded machine.
const CLOSE_WITHIN: Duration = Duration::from_secs(30);

const TIMEOUT: Duration = Duration::from_secs(10);

/// Whether the server has closed `ep`.
fn closed(ep: &mut dyn Endpoint) -> bool {
    match ep.poll(usize::MAX, &mut |_| {}) {
        Err(TransportError::Closed) | Err(TransportError::Io(_)) => return true,
        Err(e) => panic!("expected the connection to be closed, got {e}"),
        Ok(_) => {}
    }
    matches!(
        ep.wait(Duration::from_millis(50)),
        Err(TransportError::Closed) | Err(TransportError::Io(_))
    )
}

#[test]
fn a_silent_fabric_connection_is_closed_and_an_active_one_is_not() {
    let mut cfg = common::fabric_config("tcp;ofi_rxm");
    cfg.idle_timeout_secs = IDLE_SECS;
    let server = Server::start(&cfg).expect("server starts on fabric");
    let mut c = Client::connect_with_timeout(server.addr(), TIMEOUT).expect("connect");
    c.put(b"k", b"v").expect("put");
    let mut silent = fabrickv_transport::connect(server.addr(), 1, TIMEOUT).expect("connect");
    let start = Instant::now();
    // Three timeouts long, a request every fifth of one.
    while start.elapsed() < Duration::from_secs(3 * IDLE_SECS) {
        assert_eq!(
            c.get(b"k").expect("an active client stays connected"),
            Some(b"v".to_vec())
        );
        std::thread::sleep(Duration::from_millis(IDLE_SECS * 1000 / 5));
    }
    while !closed(&mut *silent) {
        assert!(
            start.elapsed() < CLOSE_WITHIN,
            "the silent connection stayed"
        );
    }
    drop(c);
    server.shutdown();
}
