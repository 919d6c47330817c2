//! Round-trip latency of 64-byte messages: a bare libfabric ping-pong
//! (`fi_send`/`fi_recv`, busy polling) against the same through FabricKV's
//! `Endpoint`/`WorkerPort`, per provider.
//!
//! ```text
//! cargo run --release -p fabrickv-transport-fabric --example fabric_pingpong -- [ITERS] [PROVIDER...]
//! ```
//!
//! Defaults: 20000 round trips on `shm` and `tcp;ofi_rxm`.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use fabrickv_transport::{connect, listen, TransportError};

const MSG_BYTES: usize = 64;
const WARMUP: usize = 1000;
const TIMEOUT: Duration = Duration::from_secs(10);

fn percentile(sorted: &[Duration], p: f64) -> f64 {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i].as_secs_f64() * 1e6
}

fn framework(provider: &str, iters: usize) -> Result<Vec<Duration>, TransportError> {
    let l = listen(&format!("fabric://{provider}/127.0.0.1:0"), 1)?;
    let stop = Arc::new(AtomicBool::new(false));
    let mut port = l.ports.into_iter().next().ok_or(TransportError::Closed)?;
    let port_waker = port.waker();
    let s = stop.clone();
    let worker = std::thread::spawn(move || {
        while !s.load(Ordering::Acquire) {
            let n = port
                .poll(32, &mut |_, msg, reply| reply.buf().extend_from_slice(msg))
                .unwrap_or(0);
            let _ = port.flush();
            if n == 0 {
                let _ = port.wait(Duration::from_millis(10));
            }
        }
    });
    let mut acceptor = l.acceptor;
    let acc_waker = acceptor.waker();
    let s = stop.clone();
    let acc = std::thread::spawn(move || {
        let _ = acceptor.run(&s);
    });
    let result = (|| {
        let mut ep = connect(&l.local_addr, 0, TIMEOUT)?;
        let msg = [0x42u8; MSG_BYTES];
        let mut times = Vec::with_capacity(iters);
        for i in 0..WARMUP + iters {
            let t = Instant::now();
            ep.post(&msg)?;
            ep.flush(TIMEOUT)?;
            let mut got = false;
            while !got {
                ep.poll(1, &mut |m| got = m.len() == MSG_BYTES)?;
                if !got {
                    ep.wait(TIMEOUT)?;
                }
            }
            if i >= WARMUP {
                times.push(t.elapsed());
            }
        }
        Ok(times)
    })();
    stop.store(true, Ordering::Release);
    port_waker.wake();
    acc_waker.wake();
    let _ = worker.join();
    let _ = acc.join();
    result
}

fn main() {
    fabrickv_transport_fabric::install();
    let mut args = std::env::args().skip(1);
    let iters: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(20_000);
    let mut providers: Vec<String> = args.collect();
    if providers.is_empty() {
        providers = vec!["shm".into(), "tcp;ofi_rxm".into()];
    }
    println!("{MSG_BYTES}-byte round trips, {iters} timed after warm-up, in microseconds");
    println!(
        "{:<14} {:<22} {:>8} {:>8} {:>8}",
        "provider", "path", "p50", "p99", "p50/raw"
    );
    for p in &providers {
        let raw = match fabrickv_transport_fabric::raw_pingpong(p, MSG_BYTES, iters) {
            Ok(mut t) => {
                t.sort();
                t
            }
            Err(e) => {
                println!("{p:<14} raw libfabric: {e}");
                continue;
            }
        };
        let raw50 = percentile(&raw, 0.5);
        println!(
            "{:<14} {:<22} {:>8.2} {:>8.2} {:>8.2}",
            p,
            "raw libfabric",
            raw50,
            percentile(&raw, 0.99),
            1.0
        );
        match framework(p, iters) {
            Ok(mut t) => {
                t.sort();
                let p50 = percentile(&t, 0.5);
                println!(
                    "{:<14} {:<22} {:>8.2} {:>8.2} {:>8.2}",
                    p,
                    "Endpoint/WorkerPort",
                    p50,
                    percentile(&t, 0.99),
                    p50 / raw50
                );
            }
            Err(e) => println!("{p:<14} Endpoint/WorkerPort: {e}"),
        }
    }
}
