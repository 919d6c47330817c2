//! The KV-cache service over libfabric, on each provider: values from one
//! byte to many megabytes round-trip with GETs written one-sided into the
//! client's registered buffer and large PUTs read one-sided from it, a
//! value that does not fit the named slice is refused before any byte is
//! written, and the gRPC control plane places values in a bound buffer.

mod common;

use std::time::Duration;

use fabrickv_cache::CacheConfig;
use fabrickv_client::{CacheClient, CacheClientOptions};
use fabrickv_control::{ControlClient, Registration};
use fabrickv_server::{Server, ServerHandle};
use fabrickv_types::limits::CACHE_CHUNK_BYTES_MAX;
use fabrickv_types::ErrorCode;

/// Receive buffer of a test client.
const BUFFER_BYTES: usize = 8 << 20;

fn serve(provider: &str) -> ServerHandle {
    let mut cfg = common::fabric_config(provider);
    cfg.cache.store = CacheConfig {
        pool_bytes: 64 << 20,
        ..CacheConfig::default()
    };
    cfg.cache.grpc = Some("127.0.0.1:0".into());
    Server::start(&cfg).expect("server starts on fabric")
}

fn value(seed: u64, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (seed.wrapping_mul(97).wrapping_add(i as u64 * 13) % 251) as u8)
        .collect()
}

fn cache_round_trips(provider: &str) {
    let server = serve(provider);
    let mut c = CacheClient::connect_with(
        server.addr(),
        CacheClientOptions {
            buffer_bytes: BUFFER_BYTES,
            timeout: Duration::from_secs(10),
        },
    )
    .expect("connect");
    assert!(c.one_sided(), "fabric registers the receive buffer");
    for (i, len) in [1, 4096, CACHE_CHUNK_BYTES_MAX + 1, 5 << 20]
        .into_iter()
        .enumerate()
    {
        let key = format!("v{i}");
        let v = value(i as u64, len);
        c.put(key.as_bytes(), &v, None).expect("put");
        assert_eq!(c.get(key.as_bytes()).expect("get"), Some(v), "{len} bytes");
    }
    // A slice too small for the value: refused, the buffer untouched.
    let v = value(9, 10_000);
    c.put(b"nine", &v, None).expect("put");
    let tail = BUFFER_BYTES - 16;
    c.buffer().expect("buffer")[tail..].copy_from_slice(&[0xEE; 16]);
    assert_eq!(
        c.get_at(b"nine", tail).expect_err("too small").code(),
        ErrorCode::BufferTooSmall
    );
    assert_eq!(&c.buffer().expect("buffer")[tail..], &[0xEE; 16]);
    let mut small = vec![0u8; 100];
    assert_eq!(
        c.get_into(b"nine", &mut small)
            .expect_err("too small")
            .code(),
        ErrorCode::BufferTooSmall
    );
    assert!(c.delete(b"nine").expect("delete"));
    assert!(!c.exists(b"nine").expect("exists"));

    // gRPC: register, bind this connection's buffer, place a value.
    let g = ControlClient::connect(&server.grpc_addr().expect("gRPC on").to_string())
        .expect("gRPC connects");
    let r = g
        .register(Registration {
            client_id: 0,
            addresses: vec![],
            receive_buffer_bytes: BUFFER_BYTES as u64,
        })
        .expect("register");
    c.bind(r.client_id).expect("bind");
    let id = r.client_id;
    let big = value(3, 5 << 20);
    let w = value(7, 300_000);
    c.buffer().expect("buffer")[6 << 20..][..w.len()].copy_from_slice(&w);
    // The software providers move one-sided data only while the target
    // endpoint makes progress, so the client keeps using its data-plane
    // connection while another thread makes the gRPC calls (as an engine
    // with a receive loop does); hardware providers progress on their own.
    let calls = std::thread::spawn(move || {
        let placed = g.get_to(b"v3", id, Some(1 << 20));
        let too_big = g.get_to(b"v3", id, Some(4 << 20));
        let pulled = g.put_from(b"pulled", id, 6 << 20, 300_000, 0);
        (placed, too_big, pulled)
    });
    while !calls.is_finished() {
        c.exists(b"progress").expect("data-plane round trip");
    }
    let (placed, too_big, pulled) = calls.join().expect("gRPC thread");
    let p = placed.expect("get_to").expect("found");
    assert_eq!((p.offset, p.length), (1 << 20, big.len() as u64));
    assert_eq!(
        &c.buffer().expect("buffer")[1 << 20..][..big.len()],
        &big[..]
    );
    assert_eq!(
        too_big.expect_err("does not fit").code,
        ErrorCode::BufferTooSmall
    );
    pulled.expect("put_from");
    assert_eq!(c.get(b"pulled").expect("get"), Some(w));
    drop(c);
    server.shutdown();
}

#[test]
fn cache_over_shm() {
    cache_round_trips("shm");
}

#[test]
fn cache_over_tcp_rxm() {
    cache_round_trips("tcp;ofi_rxm");
}
