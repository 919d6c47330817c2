//! The cache service without sockets: frames in, replies out.

use super::*;
use fabrickv_types::limits::CACHE_HEARTBEAT_TIMEOUT_MS;
use fabrickv_wire::cache::{decode_reply, encode_get, encode_key_op, encode_put_chunk};
use fabrickv_wire::{decode_frame, FrameKind};

const NOW: u64 = 1;

fn service() -> CacheService {
    let shared = CacheShared::new(CacheConfig {
        pool_bytes: 8 << 20,
        ..CacheConfig::default()
    })
    .expect("store");
    CacheService::new(0, shared, None)
}

fn call(s: &mut CacheService, conn: ConnId, req: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    crate::service::serve_one(s, 0, conn, req, &mut out, NOW);
    out
}

fn status(out: &[u8]) -> ErrorCode {
    let f = decode_frame(out).expect("frame");
    if f.header.kind == FrameKind::Error {
        return ErrorCode::from_u16(f.header.status).unwrap_or(ErrorCode::Internal);
    }
    decode_reply(&f).expect("reply").status
}

#[test]
fn chunked_puts_are_invisible_until_whole_and_bound_to_their_connection() {
    let mut s = service();
    let mut req = Vec::new();
    encode_put_chunk(&mut req, 1, 0, b"k", 7, 0, 6, 0, b"abc");
    assert_eq!(status(&call(&mut s, 1, &req)), ErrorCode::Ok);
    req.clear();
    encode_key_op(&mut req, 2, 0, CacheOp::Exists, b"k");
    assert_eq!(
        status(&call(&mut s, 1, &req)),
        ErrorCode::NotFound,
        "half a value is not visible"
    );
    // The same transfer id on another connection is another transfer.
    req.clear();
    encode_put_chunk(&mut req, 3, 0, b"k", 7, 0, 6, 3, b"def");
    assert_eq!(status(&call(&mut s, 2, &req)), ErrorCode::NotFound);
    // A chunk that skips ahead is refused and drops the transfer.
    req.clear();
    encode_put_chunk(&mut req, 4, 0, b"k", 7, 0, 6, 4, b"ef");
    assert_eq!(status(&call(&mut s, 1, &req)), ErrorCode::Malformed);
    req.clear();
    encode_put_chunk(&mut req, 5, 0, b"k", 7, 0, 6, 3, b"def");
    assert_eq!(status(&call(&mut s, 1, &req)), ErrorCode::NotFound);
    // In order, it lands whole.
    for (i, (off, chunk)) in [(0u64, &b"abc"[..]), (3, &b"def"[..])].iter().enumerate() {
        req.clear();
        encode_put_chunk(&mut req, 10 + i as u64, 0, b"k", 8, 0, 6, *off, chunk);
        assert_eq!(status(&call(&mut s, 1, &req)), ErrorCode::Ok);
    }
    req.clear();
    encode_get(&mut req, 20, 0, b"k", 0, 0, 100, None);
    let out = call(&mut s, 1, &req);
    let f = decode_frame(&out).expect("frame");
    assert_eq!(decode_reply(&f).expect("reply").data, b"abcdef");
}

#[test]
fn abandoned_chunked_puts_are_dropped_at_their_deadline() {
    let mut s = service();
    let mut req = Vec::new();
    encode_put_chunk(&mut req, 1, 0, b"k", 1, 0, 1 << 20, 0, &[1; 1000]);
    assert_eq!(status(&call(&mut s, 1, &req)), ErrorCode::Ok);
    let used = s.shared.store().stats().used_bytes;
    assert!(used >= 1 << 20, "the transfer holds its space");
    s.sweep(NOW + CACHE_PENDING_PUT_TIMEOUT_MS + 1);
    assert_eq!(s.shared.store().stats().used_bytes, 0, "and gives it back");
    assert_eq!(s.shared.counters.puts_abandoned.load(Ordering::Relaxed), 1);
}

#[test]
fn registrations_lapse_without_heartbeats() {
    let s = service();
    let id = s
        .shared
        .register(0, vec!["a".into()], 1 << 20, NOW)
        .expect("register");
    assert_eq!(
        s.shared.heartbeat(id, NOW + 1000),
        Ok(CACHE_HEARTBEAT_TIMEOUT_MS)
    );
    s.shared.sweep(NOW + 1000 + CACHE_HEARTBEAT_TIMEOUT_MS - 1);
    assert_eq!(s.shared.client_count(), 1);
    s.shared.sweep(NOW + 1000 + CACHE_HEARTBEAT_TIMEOUT_MS);
    assert_eq!(s.shared.client_count(), 0);
    assert_eq!(
        s.shared.heartbeat(id, NOW).map_err(|e| e.0),
        Err(ErrorCode::NoSuchClient)
    );
}
