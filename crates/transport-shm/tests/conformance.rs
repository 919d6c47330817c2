//! The shared conformance suite, run against the shm transport.

use std::sync::atomic::{AtomicU32, Ordering};

/// A fresh `shm://` address per test (unique within this host).
fn shm_addr() -> String {
    fabrickv_transport_shm::install();
    static N: AtomicU32 = AtomicU32::new(0);
    format!(
        "shm://conformance-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

fabrickv_transport::conformance_suite!(shm, super::shm_addr);
