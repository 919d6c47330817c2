//! The cache service without sockets: frames in, replies out.

use super::*;
use fabrickv_types::limits::{CACHE_CLIENTS_MAX, CACHE_HEARTBEAT_TIMEOUT_MS};
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
        .register(None, 0, vec!["a".into()], 1 << 20, NOW)
        .expect("register");
    assert_eq!(
        s.shared.heartbeat(None, id, NOW + 1000),
        Ok(CACHE_HEARTBEAT_TIMEOUT_MS)
    );
    s.shared.sweep(NOW + 1000 + CACHE_HEARTBEAT_TIMEOUT_MS - 1);
    assert_eq!(s.shared.client_count(), 1);
    s.shared.sweep(NOW + 1000 + CACHE_HEARTBEAT_TIMEOUT_MS);
    assert_eq!(s.shared.client_count(), 0);
    assert_eq!(
        s.shared.heartbeat(None, id, NOW).map_err(|e| e.0),
        Err(ErrorCode::NoSuchClient)
    );
}

/// A gRPC connection from `host` (a.b.c.d) and `port`.
fn peer(host: [u8; 4], port: u16) -> Option<std::net::SocketAddr> {
    Some(std::net::SocketAddr::from((host, port)))
}

/// Regression: client ids were 2, 3, 4, ..., so any
/// caller could name the others' registrations.
#[test]
fn client_ids_are_random_not_sequential() {
    const IDS: usize = 64;
    let s = service();
    let mut ids: Vec<u64> = (0..IDS)
        .map(|_| {
            s.shared
                .register(None, 0, Vec::new(), 0, NOW)
                .expect("register")
        })
        .collect();
    assert!(ids.iter().all(|&id| id != 0));
    // Spread over the whole 64-bit space: a counter stays tiny.
    assert!(ids.iter().any(|&id| id > 1 << 40), "{ids:?}");
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(ids.len(), IDS, "no id given twice");
    let neighbours = ids.windows(2).filter(|w| w[1] - w[0] < 1 << 20).count();
    assert_eq!(neighbours, 0, "ids close to one another: {ids:?}");
}

/// Regression: any caller could heartbeat, unregister
/// or re-register another client's registration.
#[test]
fn only_the_registering_connection_may_heartbeat_or_unregister() {
    let s = service();
    let sh = &s.shared;
    let a = peer([127, 0, 0, 1], 40_001);
    let b = peer([127, 0, 0, 1], 40_002);
    let far = peer([10, 0, 0, 2], 40_001);
    let id = sh.register(a, 0, Vec::new(), 0, NOW).expect("register");
    let unknown = id ^ 1;
    // Another connection sees the id as unknown: the same code as an id
    // never given, so that ids do not leak.
    for other in [b, far, None] {
        assert_eq!(
            sh.heartbeat(other, id, NOW).map_err(|e| e.0),
            Err(ErrorCode::NoSuchClient)
        );
        assert_eq!(
            sh.heartbeat(other, unknown, NOW).map_err(|e| e.0),
            Err(ErrorCode::NoSuchClient)
        );
        assert!(!sh.unregister(other, id));
        assert!(!sh.unregister(other, unknown));
    }
    // Another host cannot take it over by registering its id, nor can
    // anyone register an id the server did not give.
    assert_eq!(
        sh.register(far, id, Vec::new(), 0, NOW).map_err(|e| e.0),
        Err(ErrorCode::NoSuchClient)
    );
    assert_eq!(
        sh.register(a, unknown, Vec::new(), 0, NOW).map_err(|e| e.0),
        Err(ErrorCode::NoSuchClient)
    );
    assert_eq!(sh.heartbeat(a, id, NOW), Ok(CACHE_HEARTBEAT_TIMEOUT_MS));
    // The owner renews it in place.
    assert_eq!(sh.register(a, id, Vec::new(), 0, NOW), Ok(id));
    // A reconnect from the same host (a new port) presenting the id takes
    // it over; the old connection no longer may act for it.
    assert_eq!(sh.register(b, id, Vec::new(), 0, NOW), Ok(id));
    assert_eq!(
        sh.heartbeat(a, id, NOW).map_err(|e| e.0),
        Err(ErrorCode::NoSuchClient)
    );
    assert_eq!(sh.heartbeat(b, id, NOW), Ok(CACHE_HEARTBEAT_TIMEOUT_MS));
    assert_eq!(sh.client_count(), 1);
    assert!(sh.unregister(b, id));
    assert_eq!(sh.client_count(), 0);
}

/// Regression: 4,095 registrations from one caller
/// filled the table, and every new client was refused until they lapsed.
#[test]
fn one_connection_is_stopped_at_its_bound_while_another_still_registers() {
    let s = service();
    let sh = &s.shared;
    let greedy = peer([127, 0, 0, 1], 40_001);
    let mut mine = Vec::new();
    let refused = loop {
        match sh.register(greedy, 0, Vec::new(), 0, NOW) {
            Ok(id) => mine.push(id),
            Err(e) => break e,
        }
        assert!(mine.len() <= CACHE_CLIENTS_PER_CONN_MAX, "no bound");
    };
    assert_eq!(mine.len(), CACHE_CLIENTS_PER_CONN_MAX);
    assert_eq!(refused.0, ErrorCode::Unavailable, "{}", refused.1);
    // Another connection, of the same host or another, still registers.
    let other = peer([127, 0, 0, 1], 40_002);
    assert!(sh.register(other, 0, Vec::new(), 0, NOW).is_ok());
    assert!(sh
        .register(peer([10, 0, 0, 2], 1), 0, Vec::new(), 0, NOW)
        .is_ok());
    // Renewing one of its own is not a new registration.
    assert_eq!(
        sh.register(greedy, mine[0], Vec::new(), 0, NOW),
        Ok(mine[0])
    );
    // Once it lets one go, it may register again.
    assert!(sh.unregister(greedy, mine[0]));
    assert!(sh.register(greedy, 0, Vec::new(), 0, NOW).is_ok());

    // However many connections one host opens, it holds a quarter of the
    // table at most; another host still registers.
    let host = [10, 0, 0, 9];
    let mut held = 0;
    'ports: for port in 1.. {
        for _ in 0..CACHE_CLIENTS_PER_CONN_MAX {
            match sh.register(peer(host, port), 0, Vec::new(), 0, NOW) {
                Ok(_) => held += 1,
                Err(e) => {
                    assert_eq!(e.0, ErrorCode::Unavailable);
                    break 'ports;
                }
            }
        }
    }
    assert_eq!(held, CACHE_CLIENTS_PER_HOST_MAX);
    assert!(sh.client_count() < CACHE_CLIENTS_MAX);
    assert!(sh
        .register(peer([10, 0, 0, 3], 1), 0, Vec::new(), 0, NOW)
        .is_ok());
}
