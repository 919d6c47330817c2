//! The conformance suite (src/conformance.rs) over this crate's transports.

use std::sync::atomic::{AtomicU32, Ordering};

static NAMES: AtomicU32 = AtomicU32::new(0);

fn inproc_addr() -> String {
    format!(
        "inproc://conformance-{}",
        NAMES.fetch_add(1, Ordering::Relaxed)
    )
}

fn tcp_addr() -> String {
    "tcp://127.0.0.1:0".to_string()
}

fabrickv_transport::conformance_suite!(inproc, super::inproc_addr);
fabrickv_transport::conformance_suite!(tcp, super::tcp_addr);
