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

/// At the connection cap a newcomer gets in by closing a connection that
/// has been silent the longest, one that never authenticated before one
/// that did; a silent authenticated client keeps its connection.
#[test]
fn at_the_cap_a_silent_unauthenticated_connection_makes_way() {
    use fabrickv_server::{RESP_CONNECTIONS_MAX, RESP_EVICT_IDLE_MIN_MS};
    const SECRET: &str = "the-secret-of-the-resp-cap-test";
    // One RESP thread takes connections in the order they arrive: with
    // two, a newcomer could be counted before another thread counted the
    // last silent connection, get in below the cap, and leave that one
    // refused (the cross-thread eviction has its own unit tests in
    // `fabrickv_transport::idle`).
    let s = TestServer::start_with(Transport::Tcp, 1, Mode::Store, MEMORY_BYTES, |c| {
        c.resp = Some("127.0.0.1:0".into());
        c.auth = fabrickv_auth::Secret::from_bytes(SECRET.as_bytes(), "test").ok();
    });
    let auth = |c: &mut TcpStream| {
        c.write_all(format!("AUTH {SECRET}\r\n").as_bytes())
            .expect("send");
        let mut buf = [0u8; 5];
        c.set_read_timeout(Some(Duration::from_secs(10)))
            .expect("timeout");
        c.read_exact(&mut buf).expect("reply");
        assert_eq!(&buf, b"+OK\r\n");
    };
    let mut kept = connect(&s);
    auth(&mut kept);
    let silent: Vec<TcpStream> = (1..RESP_CONNECTIONS_MAX).map(|_| connect(&s)).collect();
    for c in &silent {
        c.set_nonblocking(true).expect("nonblocking");
    }
    // Once all of them, the authenticated one too, have been silent long
    // enough to be closed, a newcomer gets in; the server must close an
    // unauthenticated one for it. Until then newcomers are refused.
    let deadline = Instant::now() + CLOSE_WITHIN;
    let mut newcomers = Vec::new();
    while newcomers.len() < 4 {
        let mut c = connect(&s);
        c.write_all(format!("AUTH {SECRET}\r\n").as_bytes())
            .expect("send");
        c.set_read_timeout(Some(Duration::from_secs(10)))
            .expect("timeout");
        let mut first = [0u8; 1];
        c.read_exact(&mut first).expect("a reply");
        if first[0] == b'+' {
            let mut rest = [0u8; 4];
            c.read_exact(&mut rest).expect("reply");
            assert_eq!(&rest, b"OK\r\n");
            ping(&mut c);
            newcomers.push(c);
        } else {
            assert!(
                Instant::now() < deadline,
                "newcomers still refused at the cap"
            );
            std::thread::sleep(Duration::from_millis(RESP_EVICT_IDLE_MIN_MS / 10));
        }
    }
    ping(&mut kept);
    // A closed socket reads end-of-file (or a reset); an open one has
    // nothing to read.
    let is_closed = |mut c: &TcpStream| match c.read(&mut [0u8; 16]) {
        Ok(0) => true,
        Ok(_) => panic!("a silent connection was sent something"),
        Err(e) => e.kind() != ErrorKind::WouldBlock,
    };
    let deadline = Instant::now() + CLOSE_WITHIN;
    let mut gone = 0;
    while gone < 4 {
        gone = silent.iter().filter(|c| is_closed(c)).count();
        assert!(
            Instant::now() < deadline,
            "{gone} of 4 evicted connections seen closed"
        );
    }
    assert_eq!(gone, 4, "more connections were closed than newcomers came");
}
