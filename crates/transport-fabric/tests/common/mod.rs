//! What the server tests over libfabric share: the server's configuration
//! on one provider.

use fabrickv_server::{Mode, ServerConfig};

/// A two-worker store-mode server listening on `provider` over loopback,
/// with 64 MiB of memory; installs the fabric transport first, so that
/// the `fabric://` address resolves.
pub fn fabric_config(provider: &str) -> ServerConfig {
    fabrickv_transport_fabric::install();
    ServerConfig {
        listen: format!("fabric://{provider}/127.0.0.1:0"),
        workers: Some(2),
        mode: Mode::Store,
        memory_bytes: 64 << 20,
        log_level: "warn".into(),
        ..ServerConfig::default()
    }
}
