//! The shared transport conformance suite, once per libfabric provider.

fn addr(provider: &str) -> String {
    fabrickv_transport_fabric::install();
    format!("fabric://{provider}/127.0.0.1:0")
}

fabrickv_transport::conformance_suite!(shm, || crate::addr("shm"));
fabrickv_transport::conformance_suite!(tcp_rxm, || crate::addr("tcp;ofi_rxm"));
