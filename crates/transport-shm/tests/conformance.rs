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

/// The one-sided checks of the suite run in full only where the
/// capabilities report one-sided access; shm always has it, and replies
/// lend the client's memory in place.
#[test]
fn shm_reports_one_sided_access_and_remote_views() {
    let l = fabrickv_transport::listen(&shm_addr(), 1).expect("listen");
    assert_eq!(
        l.ports[0].capabilities(),
        fabrickv_transport_shm::SHM_CAPABILITIES
    );
    assert!(l.ports[0].capabilities().one_sided());
    assert!(l.ports[0].capabilities().remote_view);
}
