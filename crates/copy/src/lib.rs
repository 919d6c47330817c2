//! Shard copy, pulled by the target (the seed's XDP-Rocks replicator, with
//! what it got wrong fixed: empty keys copy, a crash resumes, the result is
//! verified).
//!
//! - [`proto`]: the control payloads (in SHARD frames) and the data
//!   streams' frames;
//! - [`source`]: copy sessions inside a server that serves the shard:
//!   a consistent checkpoint split into ranges, range iterators feeding
//!   bounded queues, one TCP data stream per parallel range;
//! - [`target`]: `fabrickv copy`: checks every frame, bulk-loads each
//!   range without a journal, records durable positions for `--resume`,
//!   verifies the copy's digest;
//! - [`plot`]: the PNG of the copy rate over time;
//! - [`pipe`]: the raw pipe (TCP socket into a file) the copy is measured
//!   against.

pub mod pipe;
pub mod plot;
pub mod proto;
pub mod source;
pub mod target;

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::{Mutex, MutexGuard};

/// The host the data streams of a copy use, from a native address: its IP
/// when it has one (`HOST:PORT`, `tcp://HOST:PORT`,
/// `fabric://PROVIDER/HOST:PORT`), else loopback (shm and inproc addresses
/// are local). The source binds its data port there and the target
/// connects there, so both read the address alike.
pub fn data_host(addr: &str) -> IpAddr {
    let bare = addr.split_once("://").map_or(addr, |(_, rest)| rest);
    let bare = bare.rsplit('/').next().unwrap_or(bare);
    bare.parse::<SocketAddr>()
        .map(|a| a.ip())
        .unwrap_or(IpAddr::V4(Ipv4Addr::LOCALHOST))
}

/// Locks `m`; a panicked holder left plain data behind, still usable.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_data_host_is_the_addresss_ip_or_loopback() {
        let ip = |s: &str| s.parse::<IpAddr>().expect("ip");
        assert_eq!(data_host("10.1.2.3:7379"), ip("10.1.2.3"));
        assert_eq!(data_host("tcp://10.1.2.3:7379"), ip("10.1.2.3"));
        assert_eq!(
            data_host("fabric://tcp;ofi_rxm/10.1.2.3:7379"),
            ip("10.1.2.3")
        );
        assert_eq!(data_host("tcp://[::1]:7379"), ip("::1"));
        assert_eq!(data_host("shm://copy-1"), ip("127.0.0.1"));
        assert_eq!(data_host("inproc://x"), ip("127.0.0.1"));
    }
}
