//! The shared conformance suite, run against the shm transport.

mod common;

/// A fresh `shm://` address per test (unique within this host).
fn shm_addr() -> String {
    format!("shm://{}", common::unique("conformance"))
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
