//! Idle fabric connections are closed after `idle_timeout_secs`, as tcp
//! and shm ones are (server/tests/idle.rs): a connection silent that long
//! with nothing in flight, never one that keeps asking.

use std::time::Duration;

use fabrickv_client::{Client, Kv};
use fabrickv_server::Server;
use fabrickv_transport::conformance_idle::an_asking_connection_stays_while_a_silent_one_goes;

mod common;

/// The idle timeout of these tests' servers, in seconds.
const IDLE_SECS: u64 = 1;

const TIMEOUT: Duration = Duration::from_secs(10);

#[test]
fn a_silent_fabric_connection_is_closed_and_an_active_one_is_not() {
    let mut cfg = common::fabric_config("tcp;ofi_rxm");
    cfg.idle_timeout_secs = IDLE_SECS;
    let server = Server::start(&cfg).expect("server starts on fabric");
    let mut c = Client::connect_with_timeout(server.addr(), TIMEOUT).expect("connect");
    c.put(b"k", b"v").expect("put");
    let mut silent = fabrickv_transport::connect(server.addr(), 1, TIMEOUT).expect("connect");
    an_asking_connection_stays_while_a_silent_one_goes(
        Duration::from_secs(IDLE_SECS),
        &mut *silent,
        || c.get(b"k").expect("an active client stays connected") == Some(b"v".to_vec()),
    );
    drop(c);
    server.shutdown();
}
