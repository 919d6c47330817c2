//! One-sided access (fi_read / fi_write on registered memory) through the
//! transport contract, once per provider.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use fabrickv_transport::{connect, listen, Endpoint, RemoteRegion, TransportError, Waker};

const TIMEOUT: Duration = Duration::from_secs(10);
const SERVER_REGION_BYTES: usize = 4096;

/// A one-worker server that answers:
/// - `D`: with its own region's descriptor;
/// - `W` + descriptor + offset(u32) + data: writes data into the client's
///   region through the reply, then replies `ok` (or `err:` + why).
struct Server {
    addr: String,
    stop: Arc<AtomicBool>,
    wakers: Vec<Waker>,
    worker: Option<JoinHandle<Vec<u8>>>,
    acceptor: Option<JoinHandle<()>>,
}

impl Server {
    fn start(addr: &str) -> Server {
        fabrickv_transport_fabric::install();
        let l = listen(addr, 1).expect("listen");
        let stop = Arc::new(AtomicBool::new(false));
        let mut wakers = vec![l.acceptor.waker()];
        let mut port = l.ports.into_iter().next().expect("one port");
        wakers.push(port.waker());
        let s = stop.clone();
        let worker = std::thread::spawn(move || {
            let mine = port.register(SERVER_REGION_BYTES).expect("register");
            while !s.load(Ordering::Acquire) {
                let n = port
                    .poll(16, &mut |_, msg, reply| match msg.first() {
                        Some(b'D') => mine.encode(reply.buf()),
                        Some(b'W') => {
                            let region = RemoteRegion::decode(&msg[1..]).expect("descriptor");
                            let at = 1 + RemoteRegion::ENCODED_BYTES;
                            let off = u32::from_le_bytes(msg[at..at + 4].try_into().expect("4"));
                            let data = &msg[at + 4..];
                            match reply.write_remote(&region, off as usize, data) {
                                Ok(()) => reply.buf().extend_from_slice(b"ok"),
                                Err(e) => {
                                    reply.buf().extend_from_slice(format!("err:{e}").as_bytes())
                                }
                            }
                        }
                        _ => reply.buf().extend_from_slice(b"?"),
                    })
                    .expect("poll");
                port.flush().expect("flush");
                if n == 0 {
                    port.wait(Duration::from_millis(50)).expect("wait");
                }
            }
            port.local_region(&mine).expect("own region").to_vec()
        });
        let mut acceptor = l.acceptor;
        let s = stop.clone();
        let acceptor = Some(std::thread::spawn(move || {
            acceptor.run(&s).expect("acceptor")
        }));
        Server {
            addr: l.local_addr,
            stop,
            wakers,
            worker: Some(worker),
            acceptor,
        }
    }

    /// Stops the server; returns its region's final bytes.
    fn stop(mut self) -> Vec<u8> {
        self.stop.store(true, Ordering::Release);
        for w in &self.wakers {
            w.wake();
        }
        let _ = self.acceptor.take().map(|a| a.join());
        self.worker
            .take()
            .expect("worker")
            .join()
            .expect("worker thread")
    }
}

fn call(ep: &mut dyn Endpoint, msg: &[u8]) -> Vec<u8> {
    ep.post(msg).expect("post");
    ep.flush(TIMEOUT).expect("flush");
    let deadline = Instant::now() + TIMEOUT;
    loop {
        let mut got = None;
        ep.poll(1, &mut |m| got = Some(m.to_vec())).expect("poll");
        if let Some(m) = got {
            return m;
        }
        assert!(Instant::now() < deadline, "no reply");
        ep.wait(Duration::from_millis(20)).expect("wait");
    }
}

fn write_request(region: &RemoteRegion, offset: u32, data: &[u8]) -> Vec<u8> {
    let mut m = vec![b'W'];
    region.encode(&mut m);
    m.extend_from_slice(&offset.to_le_bytes());
    m.extend_from_slice(data);
    m
}

fn addr(provider: &str) -> String {
    format!("fabric://{provider}/127.0.0.1:0")
}

/// The client writes the server's region and reads it back; the server
/// sees the bytes in its own view of the region.
pub fn write_then_read_round_trip(provider: &str) {
    let s = Server::start(&addr(provider));
    let mut ep = connect(&s.addr, 0, TIMEOUT).expect("connect");
    let region = RemoteRegion::decode(&call(&mut *ep, b"D")).expect("descriptor");
    assert_eq!(region.len, SERVER_REGION_BYTES as u64);
    let data: Vec<u8> = (0..1000u32).map(|i| (i % 251) as u8).collect();
    ep.write_remote(&region, 100, &data).expect("write_remote");
    let mut back = vec![0u8; data.len()];
    ep.read_remote(&region, 100, &mut back)
        .expect("read_remote");
    assert_eq!(back, data);
    drop(ep);
    let seen = s.stop();
    assert_eq!(
        &seen[100..1100],
        &data[..],
        "the server's view of its region"
    );
    assert!(seen[..100].iter().all(|&b| b == 0));
}

/// A handler's one-sided write into the client's region is in place when
/// the reply that announces it arrives (small and multi-staging sizes).
pub fn reply_write_lands_before_reply(provider: &str) {
    let s = Server::start(&addr(provider));
    let mut ep = connect(&s.addr, 0, TIMEOUT).expect("connect");
    let len = 600 * 1024;
    let region = ep.register(len).expect("register");
    for (round, size) in [(1u8, 64usize), (2, 300 * 1024)] {
        let data = vec![round; size];
        let offset = 4096;
        let reply = call(
            &mut *ep,
            &write_request(&region, offset, &data[..data.len().min(900_000)]),
        );
        assert_eq!(reply, b"ok", "{}", String::from_utf8_lossy(&reply));
        let view = ep.local_region(&region).expect("local_region");
        assert!(
            view[offset as usize..offset as usize + size]
                .iter()
                .all(|&b| b == round),
            "write of {size} bytes not in place when its reply came"
        );
        assert!(view[..offset as usize].iter().all(|&b| b == 0));
    }
    drop(ep);
    s.stop();
}

/// Accesses outside a region are refused before anything moves.
pub fn out_of_bounds_is_refused(provider: &str) {
    let s = Server::start(&addr(provider));
    let mut ep = connect(&s.addr, 0, TIMEOUT).expect("connect");
    let theirs = RemoteRegion::decode(&call(&mut *ep, b"D")).expect("descriptor");
    let end = SERVER_REGION_BYTES - 2;
    assert!(matches!(
        ep.write_remote(&theirs, end, b"four"),
        Err(TransportError::BadRegion(_))
    ));
    let mut out = [0u8; 4];
    assert!(matches!(
        ep.read_remote(&theirs, usize::MAX, &mut out),
        Err(TransportError::BadRegion(_))
    ));
    let mine = ep.register(64).expect("register");
    let reply = call(&mut *ep, &write_request(&mine, 60, b"too long"));
    assert!(
        reply.starts_with(b"err:"),
        "{}",
        String::from_utf8_lossy(&reply)
    );
    assert!(ep
        .local_region(&mine)
        .expect("view")
        .iter()
        .all(|&b| b == 0));
    // The connection still works.
    assert_eq!(call(&mut *ep, &write_request(&mine, 0, b"fits")), b"ok");
    drop(ep);
    s.stop();
}

macro_rules! per_provider {
    ($module:ident, $provider:expr) => {
        mod $module {
            #[test]
            fn write_then_read_round_trip() {
                super::write_then_read_round_trip($provider)
            }
            #[test]
            fn reply_write_lands_before_reply() {
                super::reply_write_lands_before_reply($provider)
            }
            #[test]
            fn out_of_bounds_is_refused() {
                super::out_of_bounds_is_refused($provider)
            }
        }
    };
}

per_provider!(shm, "shm");
per_provider!(tcp_rxm, "tcp;ofi_rxm");
