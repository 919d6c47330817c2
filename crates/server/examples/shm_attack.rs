//! The shm attacks, against a running `fabrickv serve` on `shm://NAME`,
//! for the before/after figures of `scripts/attack-shm.sh` (see
//! docs/security.md, *Attacks and their defences*):
//!
//! - `dead NAME ROUNDS CONNS`: per round, CONNS connections each ask for
//!   more 1 MiB GET replies than the reply ring and the server's staging
//!   hold, never read one, and close; then a fresh client tries to
//!   connect. Before the fix every such connection stayed open, so after
//!   `SHM_CONNECTIONS_MAX` (256) every new client was refused.
//! - `flip NAME SECS`: SHARD GETs naming a 64-byte non-ASCII shard while
//!   a second thread flips a name byte in the request ring; then checks
//!   that every worker still answers.
//! - `idle ADDR CONNS SECS` (fault 6, any native address): opens CONNS
//!   connections that never send a request, then every second for SECS
//!   seconds tries a fresh client (connect and one PUT), counting refusals,
//!   and reports how many of the idle ones the server has closed.
//!
//! Prints one line per finding; run with `cargo run -p fabrickv-server
//! --example shm_attack -- MODE ...`.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use fabrickv_client::{Client, Kv};
use fabrickv_transport::Endpoint;
use fabrickv_transport_shm::ShmEndpoint;
use fabrickv_wire::RequestBuilder;

const TIMEOUT: Duration = Duration::from_secs(5);

/// The value every GET of the `dead` attack fetches: the largest allowed.
const BIG_VALUE_BYTES: usize = fabrickv_types::limits::VALUE_BYTES_MAX;

/// GETs each `dead` connection posts: 16 MiB of replies, more than the
/// 4 MiB reply ring plus the server's staging bound.
const GETS_PER_CONN: usize = 16;

/// How long a `dead` connection leaves the server to answer before it
/// closes, in milliseconds.
const SETTLE_MS: u64 = 150;

fn request(id: u64, worker: u16, build: impl FnOnce(&mut RequestBuilder<'_>)) -> Vec<u8> {
    let mut buf = Vec::new();
    let mut b = RequestBuilder::new(&mut buf, id, worker);
    build(&mut b);
    b.finish();
    buf
}

/// Waits for one reply on `ep`.
fn one_reply(ep: &mut ShmEndpoint) -> bool {
    let deadline = Instant::now() + TIMEOUT;
    while Instant::now() < deadline {
        let mut got = false;
        if ep.poll(1, &mut |_| got = true).is_err() {
            return false;
        }
        if got {
            return true;
        }
        let _ = ep.wait(Duration::from_millis(10));
    }
    false
}

fn dead(name: &str, rounds: usize, conns: usize) {
    let mut c = Client::connect_with_timeout(&format!("shm://{name}"), TIMEOUT).expect("connect");
    let workers = c.info().workers;
    let value = vec![0x5a; BIG_VALUE_BYTES];
    // One key owned by each worker, so that every GET is answered with
    // the whole value.
    let keys: Vec<Vec<u8>> = (0..workers)
        .map(|w| {
            let key = (0u32..)
                .map(|n| format!("big-{n}").into_bytes())
                .find(|k| c.worker_of(k) == w)
                .expect("a key");
            c.put(&key, &value).expect("put");
            key
        })
        .collect();
    drop(c);
    let (mut accepted, mut refused) = (0usize, 0usize);
    let mut first_refusal = None;
    for round in 0..rounds {
        for i in 0..conns {
            let w = (i % workers as usize) as u16;
            match ShmEndpoint::connect(name, w, TIMEOUT) {
                Ok(mut ep) => {
                    accepted += 1;
                    let get = request(i as u64, w, |b| {
                        b.get(&keys[w as usize]);
                    });
                    for _ in 0..GETS_PER_CONN {
                        if !ep.post_unread(&get).unwrap_or(false) {
                            break;
                        }
                    }
                    std::thread::sleep(Duration::from_millis(SETTLE_MS));
                    drop(ep);
                }
                Err(e) => {
                    refused += 1;
                    first_refusal.get_or_insert_with(|| e.to_string());
                }
            }
        }
        println!("round {round}: accepted {accepted} refused {refused} so far");
    }
    if let Some(e) = first_refusal {
        println!("first refusal: {e}");
    }
    let deadline = Instant::now() + TIMEOUT;
    let fresh = loop {
        match ShmEndpoint::connect(name, 0, TIMEOUT) {
            Ok(_) => break "connected".to_string(),
            Err(e) if Instant::now() >= deadline => break format!("refused: {e}"),
            Err(_) => std::thread::sleep(Duration::from_millis(50)),
        }
    };
    println!("dead: accepted {accepted} refused {refused}; a fresh client afterwards: {fresh}");
}

/// A 64-byte shard name of two-byte characters.
fn hostile_name() -> String {
    "é".repeat(32)
}

fn flip(name: &str, secs: u64) {
    let probe = ShmEndpoint::connect(name, 0, TIMEOUT).expect("connect");
    let workers = probe.server_workers();
    drop(probe);
    let stop = Arc::new(AtomicBool::new(false));
    let mut threads = Vec::new();
    for w in 0..workers {
        let (name, stop) = (name.to_string(), stop.clone());
        threads.push(std::thread::spawn(move || {
            let mut frame = Vec::new();
            fabrickv_wire::shard_data::encode_get(&mut frame, 1, w, &hostile_name(), &[b"k"]);
            // The name starts after the frame header and the 8-byte shard
            // head; each record is the same size, so slot k's name sits at
            // a known offset whatever k. Its first byte flips between the
            // lead byte of 'é' and an ASCII 'C' that leaves a stray
            // continuation byte behind it.
            let rec = fabrickv_transport_shm::RECORD_HEADER_BYTES + frame.len().div_ceil(8) * 8;
            let name_at = fabrickv_transport_shm::RECORD_HEADER_BYTES
                + fabrickv_types::limits::FRAME_HEADER_BYTES
                + 8;
            let mut sent = 0u64;
            while !stop.load(Ordering::Acquire) {
                let Ok(mut ep) = ShmEndpoint::connect(&name, w, TIMEOUT) else {
                    std::thread::sleep(Duration::from_millis(10));
                    continue;
                };
                let s = ep.scribbler();
                let flipping = Arc::new(AtomicBool::new(true));
                let f = flipping.clone();
                let flipper = std::thread::spawn(move || {
                    let slots = fabrickv_transport_shm::RING_BYTES / rec;
                    while f.load(Ordering::Relaxed) {
                        for k in 0..slots.min(4096) {
                            s.flip(k * rec + name_at, 0x80);
                        }
                    }
                });
                for _ in 0..2000 {
                    if stop.load(Ordering::Acquire) {
                        break;
                    }
                    match ep.post_unread(&frame) {
                        Ok(true) => sent += 1,
                        Ok(false) => {}
                        Err(_) => break,
                    }
                    if ep.poll(64, &mut |_| {}).is_err() {
                        break;
                    }
                }
                flipping.store(false, Ordering::Relaxed);
                let _ = flipper.join();
            }
            sent
        }));
    }
    std::thread::sleep(Duration::from_secs(secs));
    stop.store(true, Ordering::Release);
    let sent: u64 = threads.into_iter().map(|t| t.join().unwrap_or(0)).sum();
    let mut dead_workers = Vec::new();
    for w in 0..workers {
        let answered = ShmEndpoint::connect(name, w, TIMEOUT).is_ok_and(|mut ep| {
            let mut f = Vec::new();
            fabrickv_wire::control::encode_hello(&mut f, 9, w);
            ep.post(&f).is_ok() && ep.flush(TIMEOUT).is_ok() && one_reply(&mut ep)
        });
        if !answered {
            dead_workers.push(w);
        }
    }
    println!(
        "flip: {sent} SHARD GETs sent over {secs} s; workers not answering afterwards: {dead_workers:?} of {workers}"
    );
}

fn idle(addr: &str, conns: usize, secs: u64) {
    let workers = Client::connect_with_timeout(addr, TIMEOUT)
        .expect("connect")
        .info()
        .workers;
    let mut held = Vec::new();
    let mut refused_idle = 0;
    for i in 0..conns {
        match fabrickv_transport::connect(addr, (i % workers as usize) as u16, TIMEOUT) {
            Ok(ep) => held.push(ep),
            Err(_) => refused_idle += 1,
        }
    }
    println!(
        "idle: {} connections held, {refused_idle} refused",
        held.len()
    );
    let (mut ok, mut refused) = (0, 0);
    let mut first_refusal = None;
    for s in 0..secs {
        std::thread::sleep(Duration::from_secs(1));
        let got_in = Client::connect_with_timeout(addr, TIMEOUT)
            .and_then(|mut c| c.put(format!("fresh-{s}").as_bytes(), b"v"));
        match got_in {
            Ok(()) => ok += 1,
            Err(e) => {
                refused += 1;
                first_refusal.get_or_insert_with(|| e.to_string());
            }
        }
    }
    let mut closed = 0;
    for ep in &mut held {
        if ep.poll(usize::MAX, &mut |_| {}).is_err() {
            closed += 1;
        }
    }
    println!(
        "idle: fresh clients over {secs} s: {ok} served, {refused} refused (first: {}); idle connections closed by the server: {closed} of {}",
        first_refusal.unwrap_or_default(),
        held.len()
    );
}

/// Whether a fresh RESP client at `addr` gets `+PONG` for a PING.
fn resp_ping(addr: &str) -> Result<(), String> {
    use std::io::{Read, Write};
    let mut c = std::net::TcpStream::connect(addr).map_err(|e| e.to_string())?;
    c.set_read_timeout(Some(TIMEOUT))
        .map_err(|e| e.to_string())?;
    c.write_all(b"PING\r\n").map_err(|e| e.to_string())?;
    let mut buf = [0u8; 64];
    let n = c.read(&mut buf).map_err(|e| e.to_string())?;
    match &buf[..n] {
        b"+PONG\r\n" => Ok(()),
        other => Err(String::from_utf8_lossy(other).trim().to_string()),
    }
}

/// `resp-idle ADDR CONNS SECS`: the `idle` attack on the RESP front end.
fn resp_idle(addr: &str, conns: usize, secs: u64) {
    let held: Vec<_> = (0..conns)
        .filter_map(|_| std::net::TcpStream::connect(addr).ok())
        .collect();
    println!("resp-idle: {} sockets held", held.len());
    let (mut ok, mut refused) = (0, 0);
    let mut first_refusal = None;
    for _ in 0..secs {
        std::thread::sleep(Duration::from_secs(1));
        match resp_ping(addr) {
            Ok(()) => ok += 1,
            Err(e) => {
                refused += 1;
                first_refusal.get_or_insert(e);
            }
        }
    }
    println!(
        "resp-idle: fresh clients over {secs} s: {ok} served, {refused} refused (first: {})",
        first_refusal.unwrap_or_default()
    );
    drop(held);
}

fn main() {
    fabrickv_transport_shm::install();
    let args: Vec<String> = std::env::args().skip(1).collect();
    let arg = |i: usize| args.get(i).map(String::as_str).unwrap_or_default();
    let num = |i: usize, d: u64| arg(i).parse().unwrap_or(d);
    match arg(0) {
        "dead" => dead(arg(1), num(2, 2) as usize, num(3, 256) as usize),
        "flip" => flip(arg(1), num(2, 10)),
        "idle" => idle(arg(1), num(2, 4096) as usize, num(3, 10)),
        "resp-idle" => resp_idle(arg(1), num(2, 4096) as usize, num(3, 10)),
        // Exits 0 once the server at a full address accepts a client.
        "probe-addr" => std::process::exit(i32::from(
            Client::connect_with_timeout(arg(1), TIMEOUT).is_err(),
        )),
        // Exits 0 once the server accepts a connection.
        "probe" => std::process::exit(i32::from(ShmEndpoint::connect(arg(1), 0, TIMEOUT).is_err())),
        _ => eprintln!("usage: shm_attack dead NAME [ROUNDS CONNS] | flip NAME [SECS]"),
    }
}
