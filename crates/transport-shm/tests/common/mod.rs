//! Helpers shared by this crate's test files.

use std::sync::atomic::{AtomicU32, Ordering};

/// A name for `shm://NAME` unique on this host (the process id keeps
/// test binaries running at once apart); installs the scheme first.
pub fn unique(tag: &str) -> String {
    fabrickv_transport_shm::install();
    static N: AtomicU32 = AtomicU32::new(0);
    format!(
        "{tag}-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}
