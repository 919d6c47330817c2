//! Round-trip latency and pipelined throughput of the shm transport,
//! between two processes.
//!
//! ```text
//! cargo build --release --example shm_pingpong -p fabrickv-transport-shm
//! taskset -c 0 target/release/examples/shm_pingpong server bench &
//! taskset -c 1 target/release/examples/shm_pingpong client bench
//! ```
//!
//! The server is one echo worker; it exits when its client disconnects.
//! The client prints 64-byte round-trip percentiles (one message in
//! flight) and messages per second with `DEPTH` messages in flight.

use std::time::{Duration, Instant};

use fabrickv_transport::Endpoint;

/// Message size, in bytes.
const MSG_BYTES: usize = 64;
/// Round trips measured (after `WARMUP` more).
const ROUND_TRIPS: usize = 200_000;
const WARMUP: usize = 20_000;
/// How long each throughput run lasts.
const THROUGHPUT_SECS: u64 = 2;
const TIMEOUT: Duration = Duration::from_secs(10);

fn main() {
    fabrickv_transport_shm::install();
    let args: Vec<String> = std::env::args().collect();
    let role = args.get(1).map(String::as_str).unwrap_or("");
    let name = args.get(2).cloned().unwrap_or_else(|| "bench".into());
    match role {
        "server" => server(&name),
        "client" => client(&name),
        _ => eprintln!("usage: shm_pingpong server|client NAME"),
    }
}

fn server(name: &str) {
    let l = fabrickv_transport::listen(&format!("shm://{name}"), 1).expect("listen");
    let mut acceptor = l.acceptor;
    std::thread::spawn(move || {
        let stop = std::sync::atomic::AtomicBool::new(false);
        acceptor.run(&stop).expect("acceptor");
    });
    let mut port = l.ports.into_iter().next().expect("one port");
    loop {
        let n = port
            .poll(64, &mut |_, msg, reply| reply.buf().extend_from_slice(msg))
            .expect("poll");
        port.flush().expect("flush");
        let s = port.stats();
        if s.conns_accepted > 0 && s.conns_open == 0 {
            eprintln!("server: {} messages echoed", s.msgs_in);
            return;
        }
        if n == 0 {
            port.wait(Duration::from_millis(100)).expect("wait");
        }
    }
}

fn connect(name: &str) -> Box<dyn Endpoint> {
    let deadline = Instant::now() + TIMEOUT;
    loop {
        match fabrickv_transport::connect(&format!("shm://{name}"), 0, TIMEOUT) {
            Ok(ep) => return ep,
            Err(e) if Instant::now() < deadline => {
                let _ = e;
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(e) => panic!("connect: {e}"),
        }
    }
}

fn client(name: &str) {
    let mut ep = connect(name);
    let msg = [7u8; MSG_BYTES];
    let mut hist = hdrhistogram::Histogram::<u64>::new(3).expect("histogram");
    for i in 0..WARMUP + ROUND_TRIPS {
        let t = Instant::now();
        ep.post(&msg).expect("post");
        ep.flush(TIMEOUT).expect("flush");
        while ep.poll(1, &mut |_| {}).expect("poll") == 0 {}
        if i >= WARMUP {
            hist.record(t.elapsed().as_nanos() as u64).expect("record");
        }
    }
    println!(
        "{{\"bench\":\"shm_pingpong\",\"msg_bytes\":{MSG_BYTES},\"round_trips\":{ROUND_TRIPS},\"rtt_ns_p50\":{},\"rtt_ns_p99\":{},\"rtt_ns_p999\":{},\"rtt_ns_mean\":{:.0}}}",
        hist.value_at_quantile(0.5),
        hist.value_at_quantile(0.99),
        hist.value_at_quantile(0.999),
        hist.mean()
    );
    for depth in [1usize, 8, 32, 128] {
        throughput(&mut *ep, &msg, depth);
    }
}

/// Keeps `depth` messages in flight: each burst of replies is answered by
/// as many new posts and one flush.
fn throughput(ep: &mut dyn Endpoint, msg: &[u8], depth: usize) {
    for _ in 0..depth {
        ep.post(msg).expect("post");
    }
    ep.flush(TIMEOUT).expect("flush");
    let start = Instant::now();
    let end = start + Duration::from_secs(THROUGHPUT_SECS);
    let mut done = 0u64;
    let mut flushes = 0u64;
    while Instant::now() < end {
        let got = ep.poll(depth, &mut |_| {}).expect("poll");
        if got > 0 {
            for _ in 0..got {
                ep.post(msg).expect("post");
            }
            ep.flush(TIMEOUT).expect("flush");
            done += got as u64;
            flushes += 1;
        }
    }
    let secs = start.elapsed().as_secs_f64();
    // Drain what is still in flight.
    let mut left = depth;
    while left > 0 {
        left -= ep.poll(left, &mut |_| {}).expect("poll");
    }
    println!(
        "{{\"bench\":\"shm_throughput\",\"msg_bytes\":{},\"in_flight\":{depth},\"msgs_per_sec\":{:.0},\"msgs_per_flush\":{:.1}}}",
        msg.len(),
        done as f64 / secs,
        done as f64 / flushes.max(1) as f64
    );
}
