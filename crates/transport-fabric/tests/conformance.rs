//! The shared transport conformance suite, once per libfabric provider.

fn addr(provider: &str) -> String {
    fabrickv_transport_fabric::install();
    format!("fabric://{provider}/127.0.0.1:0")
}

fabrickv_transport::conformance_suite!(shm, || crate::addr("shm"));
fabrickv_transport::conformance_suite!(tcp_rxm, || crate::addr("tcp;ofi_rxm"));

/// The one-sided checks of the suite run in full only where the
/// capabilities report one-sided access: both providers tested here have
/// `FI_RMA`, so they must, or those checks would pass without running.
#[test]
fn tested_providers_report_one_sided_access() {
    for provider in ["shm", "tcp;ofi_rxm"] {
        let l = fabrickv_transport::listen(&addr(provider), 1).expect("listen");
        for port in &l.ports {
            assert!(port.capabilities().one_sided(), "{provider}");
        }
    }
}
