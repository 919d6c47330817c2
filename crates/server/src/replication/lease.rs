//! A replicating server's lease, renewed by heartbeats to the cluster's
//! failover controller ([`fabrickv_cluster::heartbeat`] has the protocol
//! and the reasoning behind its timings).

use std::net::UdpSocket;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use fabrickv_auth::Secret;
use fabrickv_cluster::heartbeat::{
    Beat, BeatKind, HEARTBEAT_BYTES, HEARTBEAT_INTERVAL_MS, LEASE_MS,
};

use crate::service::Clock;
use crate::slot_routing::{Lease, SlotRouting};

/// Beats remembered by when they were sent, to date an answer's lease.
const BEATS_REMEMBERED: usize = 64;

/// The heartbeat thread; dropping it stops the beats (and so, within a
/// lease, the server's right to serve).
pub struct Heartbeats {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Drop for Heartbeats {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// What the heartbeat thread needs.
pub struct BeatConfig {
    pub me: u32,
    pub incarnation: u64,
    pub cluster: String,
    pub secret: Option<Secret>,
    pub routing: Arc<SlotRouting>,
    pub lease: Arc<Lease>,
    pub clock: Clock,
}

/// Starts beating to whichever controller the routing names, every
/// [`HEARTBEAT_INTERVAL_MS`].
pub fn start(cfg: BeatConfig) -> std::io::Result<Heartbeats> {
    // Bound to any address, so that a controller in a network namespace
    // or on another host is reached as well as one on loopback; answers
    // are MACed with the cluster secret when there is one.
    let sock = UdpSocket::bind("0.0.0.0:0")?;
    let stop = Arc::new(AtomicBool::new(false));
    let s = stop.clone();
    let thread = std::thread::Builder::new()
        .name("fkv-heartbeat".into())
        .spawn(move || beat_loop(cfg, sock, &s))?;
    Ok(Heartbeats {
        stop,
        thread: Some(thread),
    })
}

fn beat_loop(cfg: BeatConfig, sock: UdpSocket, stop: &AtomicBool) {
    fabrickv_cluster::heartbeat::raise_priority();
    let mut sent: [(u64, Instant); BEATS_REMEMBERED] = [(0, Instant::now()); BEATS_REMEMBERED];
    let mut seq = 0u64;
    let mut buf = [0u8; HEARTBEAT_BYTES + 1];
    let period = Duration::from_millis(HEARTBEAT_INTERVAL_MS);
    let mut next = Instant::now();
    while !stop.load(Ordering::Acquire) {
        let now = Instant::now();
        if now >= next {
            next = now + period;
            if let Some(r) = cfg.routing.routing() {
                if let Some(addr) = r.controller.as_deref() {
                    seq += 1;
                    let beat = Beat {
                        kind: BeatKind::Beat,
                        id: cfg.me,
                        seq,
                        incarnation: cfg.incarnation,
                        epoch: r.map.epoch,
                    };
                    sent[(seq as usize) % BEATS_REMEMBERED] = (seq, Instant::now());
                    let bytes = beat.encode(cfg.secret.as_ref(), &cfg.cluster);
                    if let Err(e) = sock.send_to(&bytes, addr) {
                        tracing::debug!("heartbeat to {addr}: {e}");
                    }
                }
            }
        }
        // Answers, until the next beat is due.
        let wait = next
            .saturating_duration_since(Instant::now())
            .max(Duration::from_millis(1));
        let _ = sock.set_read_timeout(Some(wait));
        if let Ok((n, _)) = sock.recv_from(&mut buf) {
            let Some(a) = Beat::decode(&buf[..n], cfg.secret.as_ref(), &cfg.cluster) else {
                continue;
            };
            if a.kind != BeatKind::Granted || a.id != cfg.me || a.incarnation != cfg.incarnation {
                continue;
            }
            let (s, at) = sent[(a.seq as usize) % BEATS_REMEMBERED];
            if s == a.seq {
                cfg.lease.extend(cfg.clock.ms_at(at) + LEASE_MS);
            }
        }
    }
}
