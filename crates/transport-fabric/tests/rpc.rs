//! The RPC behaviour suite over libfabric, once per provider.

fn addr(provider: &str) -> String {
    fabrickv_transport_fabric::install();
    format!("fabric://{provider}/127.0.0.1:0")
}

fabrickv_rpc::rpc_suite!(shm, || crate::addr("shm"));
fabrickv_rpc::rpc_suite!(tcp_rxm, || crate::addr("tcp;ofi_rxm"));
