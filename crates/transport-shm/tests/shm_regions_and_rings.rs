//! What only the shm transport checks: region keys and ids verified in
//! software (a forged descriptor is refused as `BadRegion` before any
//! memory is touched, and a region stays private to the connection that
//! announced it), and hostile lengths written straight into a ring.
//! One-sided access every transport offers is checked by the shared
//! conformance suite (tests/conformance.rs).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use fabrickv_transport::conformance::call;
use fabrickv_transport::{Endpoint, PortStats, RemoteRegion, TransportError};
use fabrickv_transport_shm::ShmEndpoint;

mod common;
use common::unique;

const TIMEOUT: Duration = Duration::from_secs(10);

/// Bytes of the region the server registers.
const SERVER_REGION_BYTES: usize = 1 << 20;

fn pattern(i: usize) -> u8 {
    (i % 251) as u8
}

/// A one-worker server that registers a region (filled with `pattern`) and
/// answers:
/// - `S`: its region's descriptor;
/// - `W` region(24) offset(u64) data: writes data into the client's region
///   one-sided, then replies `ok` or the error's name.
struct RmaServer {
    name: String,
    stop: Arc<AtomicBool>,
    waker: fabrickv_transport::Waker,
    thread: Option<JoinHandle<(Vec<u8>, PortStats)>>,
    acceptor_waker: fabrickv_transport::Waker,
}

impl RmaServer {
    fn start() -> RmaServer {
        let name = unique("rma");
        let l = fabrickv_transport::listen(&format!("shm://{name}"), 1).expect("listen");
        let mut acceptor = l.acceptor;
        let acceptor_waker = acceptor.waker();
        let stop = Arc::new(AtomicBool::new(false));
        let s = stop.clone();
        std::thread::spawn(move || acceptor.run(&s).expect("acceptor"));
        let mut port = l.ports.into_iter().next().expect("port");
        let waker = port.waker();
        let s = stop.clone();
        let thread = std::thread::spawn(move || {
            let region = port.register(SERVER_REGION_BYTES).expect("register");
            for (i, b) in port
                .local_region(&region)
                .expect("view")
                .iter_mut()
                .enumerate()
            {
                *b = pattern(i);
            }
            while !s.load(Ordering::Acquire) {
                let n = port
                    .poll(64, &mut |_, msg, reply| match msg.first() {
                        Some(b'S') => region.encode(reply.buf()),
                        Some(b'W') => {
                            let r = RemoteRegion::decode(&msg[1..]).expect("descriptor");
                            let off = u64::from_le_bytes(msg[25..33].try_into().expect("offset"));
                            let res = reply.write_remote(&r, off as usize, &msg[33..]);
                            let out: &[u8] = match res {
                                Ok(()) => b"ok",
                                Err(TransportError::BadRegion(_)) => b"BadRegion",
                                Err(_) => b"other",
                            };
                            reply.buf().extend_from_slice(out);
                        }
                        _ => reply.buf().extend_from_slice(b"?"),
                    })
                    .expect("poll");
                port.flush().expect("flush");
                if n == 0 {
                    port.wait(Duration::from_millis(50)).expect("wait");
                }
            }
            let bytes = port.local_region(&region).expect("view").to_vec();
            (bytes, port.stats())
        });
        RmaServer {
            name,
            stop,
            waker,
            thread: Some(thread),
            acceptor_waker,
        }
    }

    fn connect(&self) -> ShmEndpoint {
        ShmEndpoint::connect(&self.name, 0, TIMEOUT).expect("connect")
    }

    fn stop(mut self) -> (Vec<u8>, PortStats) {
        self.stop.store(true, Ordering::Release);
        self.waker.wake();
        self.acceptor_waker.wake();
        self.thread
            .take()
            .expect("running")
            .join()
            .expect("server thread")
    }
}

fn write_request(r: &RemoteRegion, offset: u64, data: &[u8]) -> Vec<u8> {
    let mut m = vec![b'W'];
    r.encode(&mut m);
    m.extend_from_slice(&offset.to_le_bytes());
    m.extend_from_slice(data);
    m
}

fn is_bad_region<T: std::fmt::Debug>(r: Result<T, TransportError>) -> bool {
    matches!(r, Err(TransportError::BadRegion(_)))
}

#[test]
fn forged_descriptors_are_refused_before_any_access() {
    let s = RmaServer::start();
    let mut ep = s.connect();
    let region = RemoteRegion::decode(&call(&mut ep, b"S")).expect("descriptor");
    let bad_key = RemoteRegion {
        key: region.key ^ 1,
        ..region
    };
    assert!(is_bad_region(ep.write_remote(&bad_key, 0, b"x")));
    let bad_id = RemoteRegion {
        addr: region.addr + 99,
        ..region
    };
    assert!(is_bad_region(ep.read_remote(&bad_id, 0, &mut [0; 1])));

    // The server checks the keys of the client's regions alike.
    let mine = ep.register(64 * 1024).expect("register");
    let bad_key = RemoteRegion {
        key: mine.key.wrapping_add(1),
        ..mine
    };
    assert_eq!(
        call(&mut ep, &write_request(&bad_key, 0, b"x")),
        b"BadRegion"
    );
    let wrong_view = ep.local_region(&bad_key);
    assert!(is_bad_region(wrong_view.map(|v| v.len())));
    assert!(ep
        .local_region(&mine)
        .expect("view")
        .iter()
        .all(|&b| b == 0));

    // Regions stay private to their connection.
    let mut other = s.connect();
    assert_eq!(
        call(&mut other, &write_request(&mine, 0, b"x")),
        b"BadRegion"
    );
    drop((ep, other));
    let (bytes, _) = s.stop();
    assert!(
        bytes.iter().enumerate().all(|(i, &b)| b == pattern(i)),
        "nothing moved"
    );
}

#[test]
fn bad_ring_lengths_close_only_that_connection() {
    let s = RmaServer::start();
    let mut good = s.connect();
    for bogus in [
        0u32,
        u32::MAX - 1,
        (fabrickv_types::limits::MESSAGE_BYTES_MAX + 1) as u32,
        4096,
    ] {
        let mut bad = s.connect();
        assert_eq!(call(&mut bad, b"?"), b"?");
        bad.publish_bogus_record(bogus);
        let deadline = Instant::now() + TIMEOUT;
        loop {
            match bad.poll(1, &mut |_| {}) {
                Err(TransportError::Closed) => break,
                Err(e) => panic!("expected Closed, got {e}"),
                Ok(_) => {}
            }
            assert!(Instant::now() < deadline, "bad connection never closed");
            let _ = bad.wait(Duration::from_millis(20));
        }
        assert_eq!(call(&mut good, b"?"), b"?", "other connections live on");
    }
    drop(good);
    let (_, stats) = s.stop();
    assert_eq!(stats.conns_closed_framing, 4);
}
