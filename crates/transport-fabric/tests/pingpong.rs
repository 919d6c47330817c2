//! The raw libfabric ping-pong runs (tiny sizes: benchmarks that never rot)
//! and a missing provider is reported clearly.

#[test]
fn raw_pingpong_runs_on_each_provider() {
    for provider in ["shm", "tcp;ofi_rxm"] {
        let t = fabrickv_transport_fabric::raw_pingpong(provider, 64, 50).expect(provider);
        assert_eq!(t.len(), 50);
        assert!(t.iter().all(|d| !d.is_zero()));
    }
}

#[test]
fn missing_provider_names_itself_and_how_to_list() {
    fabrickv_transport_fabric::install();
    let e = match fabrickv_transport::listen("fabric://no_such_provider/127.0.0.1:0", 1) {
        Err(e) => e.to_string(),
        Ok(_) => panic!("listened on a provider that does not exist"),
    };
    assert!(
        e.contains("no_such_provider") && e.contains("fi_info -l"),
        "{e}"
    );
    let e = fabrickv_transport_fabric::raw_pingpong("no_such_provider", 64, 1)
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(e.contains("no_such_provider"), "{e}");
}

#[test]
fn bad_addresses_are_refused() {
    fabrickv_transport_fabric::install();
    for bad in ["fabric://127.0.0.1:1", "fabric://shm/nohostport"] {
        assert!(
            matches!(
                fabrickv_transport::listen(bad, 1),
                Err(fabrickv_transport::TransportError::BadAddress(_))
            ),
            "{bad}"
        );
    }
}
