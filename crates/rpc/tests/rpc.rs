//! The RPC suite (src/testsuite.rs) over inproc, tcp and shm.

use std::sync::atomic::{AtomicU32, Ordering};

static NAMES: AtomicU32 = AtomicU32::new(0);

fn inproc_addr() -> String {
    format!(
        "inproc://rpc-test-{}",
        NAMES.fetch_add(1, Ordering::Relaxed)
    )
}

fn tcp_addr() -> String {
    "tcp://127.0.0.1:0".into()
}

fn shm_addr() -> String {
    fabrickv_transport_shm::install();
    format!(
        "shm://rpc-test-{}-{}",
        std::process::id(),
        NAMES.fetch_add(1, Ordering::Relaxed)
    )
}

fabrickv_rpc::rpc_suite!(inproc, super::inproc_addr);
fabrickv_rpc::rpc_suite!(tcp, super::tcp_addr);
fabrickv_rpc::rpc_suite!(shm, super::shm_addr);
