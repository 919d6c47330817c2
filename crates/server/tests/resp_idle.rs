//! `resp_idle_timeout_secs` (`--resp-idle-timeout`, Redis's `timeout`):
//! off by default, as in Redis; when set, a RESP connection silent that
//! long with no command pending is closed, one that keeps asking is not.

use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use fabrickv_server::Mode;

#[allow(unused_macros)]
mod common;
use common::{TestServer, Transport, MEMORY_BYTES};

/// The idle timeout of these tests' servers, in seconds.
const IDLE_SECS: u64 = 1;

/// How long a test waits for the server to close an idle connection: many
/// times the timeout, for a loaded machine.
const CLOSE_WITHIN: Duration = Duration::from_secs(30);

fn server(idle_secs: u64) -> TestServer {
    TestServer::start_with(Transport::Tcp, 2, Mode::Store, MEMORY_BYTES, |c| {
        c.resp = Some("127.0.0.1:0".into());
        c.resp_idle_timeout_secs = idle_secs;
    })
}

fn connect(s: &TestServer) -> TcpStream {
    let c = TcpStream::connect(s.resp_addr()).expect("connects");
    c.set_read_timeout(Some(Duration::from_millis(100)))
        .expect("timeout");
    c
}

fn ping(c: &mut TcpStream) {
    c.write_all(b"PING\r\n").expect("send");
    let mut buf = [0u8; 7];
    c.set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    c.read_exact(&mut buf).expect("reply");
    assert_eq!(&buf, b"+PONG\r\n");
    c.set_read_timeout(Some(Duration::from_millis(100)))
        .expect("timeout");
}

/// Whether the server has closed `c` (end-of-file or reset).
fn closed(c: &mut TcpStream) -> bool {
    let mut buf = [0u8; 64];
    match c.read(&mut buf) {
        Ok(0) => true,
        Ok(_) => panic!("unexpected bytes from an idle connection"),
        Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => false,
        Err(_) => true,
    }
}

#[test]
fn a_silent_resp_connection_is_closed_and_an_active_one_is_not() {
    let s = server(IDLE_SECS);
    let mut active = connect(&s);
    let mut silent = connect(&s);
    ping(&mut silent);
    let start = Instant::now();
    // Three timeouts long, a command every fifth of one.
    while start.elapsed() < Duration::from_secs(3 * IDLE_SECS) {
        ping(&mut active);
        std::thread::sleep(Duration::from_millis(IDLE_SECS * 1000 / 5));
    }
    while !closed(&mut silent) {
        assert!(
            start.elapsed() < CLOSE_WITHIN,
            "the silent connection stayed"
        );
    }
    ping(&mut active);
    s.shutdown();
}

#[test]
fn resp_connections_have_no_idle_timeout_by_default() {
    let s = server(0);
    let mut silent = connect(&s);
    ping(&mut silent);
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(3 * IDLE_SECS) {
        assert!(!closed(&mut silent), "closed with the idle timeout off");
    }
    ping(&mut silent);
    s.shutdown();
}
