//! The libfabric transport of FabricKV: `fabric://PROVIDER/HOST:PORT`.
//!
//! `PROVIDER` is a libfabric provider (`shm`, `tcp;ofi_rxm`,
//! `udp;ofi_rxd`, `verbs;ofi_rxm`, `efa`, ...); `HOST:PORT` is an
//! out-of-band TCP rendezvous where a client and the server's acceptor
//! swap endpoint names (`fi_getname`) and the handshake (worker, status,
//! worker count, connection id, windows), as RDMA programs swap queue-pair
//! information. The rendezvous socket stays open for the connection's
//! life: its closing is how each side learns that the other is gone (RDM
//! endpoints have no connections to break).
//!
//! Every side uses one reliable-datagram endpoint (`FI_EP_RDM`, `FI_MSG`
//! and, where offered, `FI_RMA`): each server worker owns one endpoint,
//! completion queue and address vector shared by all its clients; each
//! client owns its own. Messages travel in packets (see [`wire`]) with
//! credit-based flow control, so a sender never overruns the receive
//! slots its peer posted.
//!
//! Layout:
//! - [`sys`]: bindgen's raw bindings (build.rs);
//! - `fi`: the safe wrapper; every libfabric call is there;
//! - [`wire`]: packets, credits, reassembly and the handshake (no I/O);
//! - `acceptor`, `port`, `endpoint`: the acceptor thread, a worker's
//!   port, the client endpoint (the shape of the tcp transport's);
//! - [`raw`]: a bare `fi_send`/`fi_recv` ping-pong, the floor to compare
//!   against.
#![allow(unsafe_code)]

mod acceptor;
mod endpoint;
mod fi;
mod port;
pub mod raw;
pub mod sys;
pub mod wire;

use std::sync::atomic::{AtomicU64, Ordering};

use fabrickv_transport::{Endpoint, Listening, Result, TransportError};

pub use endpoint::FabricEndpoint;
pub use raw::raw_pingpong;

/// The address scheme this crate registers.
pub const SCHEME: &str = "fabric";

/// Longest a one-sided transfer may take before it fails, in ms.
pub const RMA_TIMEOUT_MS: u64 = 10_000;

/// How long an idle loop polls the completion queue before it blocks, in
/// microseconds: a reply that comes within this costs no wake-up.
pub const IDLE_SPIN_US: u64 = 200;

/// Longest single sleep of an idle loop whose provider has no wait object
/// (shm), in microseconds: bounds the latency of the first message after
/// an idle period, at a few hundred wake-ups a second.
pub const IDLE_SLEEP_US_MAX: u64 = 1_000;

/// How often a busy loop looks at its rendezvous sockets for closed
/// peers, in ms.
pub const CLOSE_CHECK_INTERVAL_MS: u64 = 5;

/// Longest a closing side waits for its peer to let go of the connection
/// (graceful disconnect over the rendezvous socket), in ms.
pub const DISCONNECT_WAIT_MS: u64 = 200;

/// Makes `fabric://PROVIDER/HOST:PORT` addresses reach this transport
/// through `fabrickv_transport::listen` and `connect`.
pub fn install() {
    fabrickv_transport::register_scheme(SCHEME, listen_scheme, connect_scheme);
}

fn listen_scheme(rest: &str, opts: &fabrickv_transport::ListenOptions) -> Result<Listening> {
    let (provider, host) = parse(rest)?;
    acceptor::listen(provider, host, opts)
}

fn connect_scheme(
    rest: &str,
    worker: u16,
    dial: &fabrickv_transport::Dial,
) -> Result<Box<dyn Endpoint>> {
    let (provider, host) = parse(rest)?;
    Ok(Box::new(FabricEndpoint::connect_with(
        provider, host, worker, dial,
    )?))
}

/// Splits `PROVIDER/HOST:PORT`.
pub fn parse(rest: &str) -> Result<(&str, &str)> {
    match rest.rsplit_once('/') {
        Some((p, h)) if !p.is_empty() && h.contains(':') => Ok((p, h)),
        _ => Err(TransportError::BadAddress(format!(
            "{SCHEME}://{rest} (expected {SCHEME}://PROVIDER/HOST:PORT, e.g. \
             {SCHEME}://tcp;ofi_rxm/127.0.0.1:7500 or {SCHEME}://shm/127.0.0.1:7500)"
        ))),
    }
}

/// True for providers whose endpoints are named rather than bound to an
/// IP address.
fn named_provider(provider: &str) -> bool {
    provider.split(';').next() == Some("shm")
}

/// Prefix of every shm endpoint name this process makes (the provider
/// names its segment `/dev/shm/<name>:<ep>:<ctx>`).
const SHM_NAME_PREFIX: &str = "fkv-";

/// Where the `shm` provider keeps its segments.
const SHM_DIR: &str = "/dev/shm";

/// The source "node" to open an endpoint on: a fresh name for shm (each
/// shm endpoint needs its own, or two in one process collide), else the
/// IP address of the local interface that reaches the peer.
///
/// A shm name is `fkv-PID-NONCE-N`. The process id alone is not enough: a
/// process killed with SIGKILL never closes its endpoints, its segment
/// stays in /dev/shm, and a later process given the same id would fail
/// `fi_enable` with EBUSY on the leftover name. The nonce (random per
/// process) keeps names apart; [`sweep_dead_shm_segments`] removes the
/// leftovers so they do not pile up.
fn source_node(provider: &str, local_ip: std::net::IpAddr) -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    static NONCE: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    if named_provider(provider) {
        let nonce = *NONCE.get_or_init(|| {
            sweep_dead_shm_segments(std::path::Path::new(SHM_DIR));
            process_nonce()
        });
        format!(
            "{SHM_NAME_PREFIX}{}-{nonce:x}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        )
    } else {
        local_ip.to_string()
    }
}

/// A random number for this process: std's hasher keys are seeded from
/// the OS's random source, which is all a name nonce needs.
fn process_nonce() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u32(std::process::id());
    h.finish() & 0xffff_ffff_ffff
}

/// Unlinks the shm segments of FabricKV processes that no longer run (a
/// segment's name starts with its owner's process id). Unlinking only
/// drops the name: a peer that still maps the segment keeps its memory.
/// A segment whose id now belongs to another live process is left alone.
fn sweep_dead_shm_segments(dir: &std::path::Path) -> usize {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    let mut removed = 0;
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = name
            .to_str()
            .and_then(|n| n.strip_prefix(SHM_NAME_PREFIX))
            .and_then(|rest| rest.split('-').next())
            .and_then(|pid| pid.parse::<u32>().ok())
        else {
            continue;
        };
        let alive = std::path::Path::new("/proc").join(pid.to_string()).exists();
        if !alive && std::fs::remove_file(entry.path()).is_ok() {
            removed += 1;
        }
    }
    removed
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_addresses() {
        assert_eq!(
            parse("tcp;ofi_rxm/127.0.0.1:7500").ok(),
            Some(("tcp;ofi_rxm", "127.0.0.1:7500"))
        );
        assert_eq!(parse("shm/[::1]:1").ok(), Some(("shm", "[::1]:1")));
        for bad in ["127.0.0.1:1", "/127.0.0.1:1", "shm/", "shm/host"] {
            assert!(parse(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn shm_names_are_unique_and_carry_the_process_id() {
        let a = source_node("shm", std::net::Ipv4Addr::LOCALHOST.into());
        let b = source_node("shm", std::net::Ipv4Addr::LOCALHOST.into());
        assert_ne!(a, b);
        let own = format!("{SHM_NAME_PREFIX}{}-", std::process::id());
        assert!(a.starts_with(&own) && b.starts_with(&own), "{a} {b}");
        // More than the process id: a reused id must not meet a leftover.
        assert!(a.len() > own.len() + 2, "{a}");
        assert_eq!(
            source_node("tcp", std::net::Ipv4Addr::LOCALHOST.into()),
            "127.0.0.1"
        );
    }

    #[test]
    fn sweep_removes_only_segments_of_dead_processes() {
        let dir = std::env::temp_dir().join(format!("fkv-sweep-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("test dir");
        // A process that has exited, so its id names no live process.
        let mut child = std::process::Command::new("true")
            .spawn()
            .expect("spawn true");
        let dead = child.id();
        child.wait().expect("wait true");
        let live = std::process::id();
        let names = [
            format!("{SHM_NAME_PREFIX}{dead}-0:0:0"),
            format!("{SHM_NAME_PREFIX}{dead}-ab12-3:0:0"),
            format!("{SHM_NAME_PREFIX}{live}-cd34-0:0:0"),
            "fkv-notapid-0:0:0".to_string(),
            "someone-else".to_string(),
        ];
        for n in &names {
            std::fs::write(dir.join(n), b"x").expect("segment file");
        }
        assert_eq!(sweep_dead_shm_segments(&dir), 2);
        for n in &names[2..] {
            assert!(dir.join(n).exists(), "{n} was removed");
        }
        std::fs::remove_dir_all(&dir).expect("remove test dir");
    }
}
