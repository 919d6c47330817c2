//! The KV cache's gRPC control plane against a real server, once per
//! data-plane transport: values put over gRPC are read on the data plane
//! and the other way round, and gRPC Get/Put move values into and out of a
//! client's registered receive buffer where the transport has one (shm).

#[macro_use]
mod common;

use fabrickv_cache::CacheConfig;
use fabrickv_client::CacheClient;
use fabrickv_control::{ControlClient, Registration};
use fabrickv_server::Mode;
use fabrickv_types::ErrorCode;

use common::{TestServer, Transport, MEMORY_BYTES};

/// Cache pool of a test server.
const CACHE_POOL_BYTES: usize = 64 << 20;

/// Receive buffer of a test client.
const BUFFER_BYTES: usize = 4 << 20;

fn server(t: Transport) -> TestServer {
    TestServer::start_with(t, 2, Mode::Store, MEMORY_BYTES, |c| {
        c.cache.store = CacheConfig {
            pool_bytes: CACHE_POOL_BYTES,
            ..CacheConfig::default()
        };
        c.cache.grpc = Some("127.0.0.1:0".to_string());
    })
}

fn data_client(s: &TestServer) -> CacheClient {
    common::cache_client(s, BUFFER_BYTES)
}

fn control(s: &TestServer) -> ControlClient {
    ControlClient::connect(&s.grpc_addr()).expect("gRPC client connects")
}

/// A value whose bytes depend on `seed` and position.
fn value(seed: u64, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (seed.wrapping_mul(131).wrapping_add(i as u64 * 7) % 253) as u8)
        .collect()
}

fn register(g: &ControlClient, s: &TestServer) -> u64 {
    let r = g
        .register(Registration {
            client_id: 0,
            addresses: vec![s.addr.clone()],
            receive_buffer_bytes: BUFFER_BYTES as u64,
        })
        .expect("register");
    assert_ne!(r.client_id, 0, "an id is assigned");
    assert_eq!(
        r.data_plane,
        vec![s.addr.clone()],
        "told where the data plane is"
    );
    assert!(r.heartbeat_interval_ms < r.heartbeat_timeout_ms);
    r.client_id
}

fn grpc_and_data_plane_share_one_store(t: Transport) {
    let s = server(t);
    let g = control(&s);
    let mut c = data_client(&s);
    let big = value(1, 3 << 20);
    g.put(b"from-grpc", big.clone(), 0).expect("gRPC put");
    assert_eq!(c.get(b"from-grpc").expect("get"), Some(big.clone()));
    let small = value(2, 777);
    c.put(b"from-data-plane", &small, None).expect("put");
    let f = g
        .get_inline(b"from-data-plane")
        .expect("gRPC get")
        .expect("found");
    assert_eq!(&f.value[..], &small[..]);
    assert_eq!(f.expires_in_ms, 0, "no ttl");
    assert!(g.exists(b"from-grpc").expect("exists"));
    assert!(g.delete(b"from-grpc").expect("delete"));
    assert!(!g.delete(b"from-grpc").expect("delete again"));
    assert_eq!(c.get(b"from-grpc").expect("get"), None, "deleted for both");
    assert_eq!(g.get_inline(b"never").expect("gRPC get"), None);
    g.put(b"ttl", value(3, 10), 60).expect("put with ttl");
    let f = g.get_inline(b"ttl").expect("get").expect("found");
    assert!(
        f.expires_in_ms > 0 && f.expires_in_ms <= 60_000,
        "{}",
        f.expires_in_ms
    );
    let stats = g.stats().expect("stats");
    let counter = |name: &str| {
        stats
            .counters
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| *v)
            .unwrap_or_else(|| panic!("no counter {name}"))
    };
    assert_eq!(counter("cache_entries"), 2);
    assert!((0.0..=1.0).contains(&stats.fragmentation));
    s.shutdown();
}

fn grpc_places_values_in_a_bound_buffer(t: Transport) {
    let s = server(t);
    let g = control(&s);
    let mut c = data_client(&s);
    let id = register(&g, &s);
    let v = value(4, 100_000);
    c.put(b"k", &v, None).expect("put");
    if t != Transport::Shm {
        // No registered memory on this transport: nothing can be bound,
        // and a placement says why instead of writing anywhere.
        assert_eq!(c.bind(id).expect_err("bind").code(), ErrorCode::Unavailable);
        let e = g.get_to(b"k", id, Some(0)).expect_err("placement");
        assert_eq!(e.code, ErrorCode::NoSuchClient, "{e}");
        s.shutdown();
        return;
    }
    c.bind(id).expect("bind");
    // At an offset the client gives.
    let p = g
        .get_to(b"k", id, Some(4096))
        .expect("get_to")
        .expect("found");
    assert_eq!((p.offset, p.length), (4096, v.len() as u64));
    assert_eq!(&c.buffer().expect("buffer")[4096..4096 + v.len()], &v[..]);
    // At offsets the server chooses: consecutive, never overlapping.
    let a = g.get_to(b"k", id, None).expect("get_to").expect("found");
    let b = g.get_to(b"k", id, None).expect("get_to").expect("found");
    assert!(a.offset + a.length <= b.offset, "{a:?} then {b:?}");
    let buf = c.buffer().expect("buffer");
    assert_eq!(&buf[b.offset as usize..][..v.len()], &v[..]);
    // Too big for the rest of the buffer: refused before any byte moves.
    let marker = value(5, 64);
    let at = BUFFER_BYTES - 64;
    c.buffer().expect("buffer")[at..].copy_from_slice(&marker);
    let e = g.get_to(b"k", id, Some(at as u64)).expect_err("overrun");
    assert_eq!(e.code, ErrorCode::BufferTooSmall, "{e}");
    assert_eq!(
        &c.buffer().expect("buffer")[at..],
        &marker[..],
        "nothing written"
    );
    // Missing keys place nothing.
    assert_eq!(g.get_to(b"missing", id, Some(0)).expect("get_to"), None);
    // Put pulled by the server from the client's buffer.
    let w = value(6, 200_000);
    c.buffer().expect("buffer")[1 << 20..][..w.len()].copy_from_slice(&w);
    g.put_from(b"pulled", id, 1 << 20, w.len() as u64, 0)
        .expect("put_from");
    assert_eq!(c.get(b"pulled").expect("get"), Some(w.clone()));
    let e = g
        .put_from(b"over", id, (BUFFER_BYTES - 10) as u64, 11, 0)
        .expect_err("range past the buffer");
    assert_eq!(e.code, ErrorCode::BufferTooSmall, "{e}");
    assert!(!g.exists(b"over").expect("exists"), "nothing stored");
    // Released clients can no longer be written to.
    assert!(g.heartbeat(id).expect("heartbeat") > 0);
    assert!(g.unregister(id).expect("unregister"));
    let e = g.get_to(b"k", id, Some(0)).expect_err("released");
    assert_eq!(e.code, ErrorCode::NoSuchClient, "{e}");
    let e = g.heartbeat(id).expect_err("released");
    assert_eq!(e.code, ErrorCode::NoSuchClient, "{e}");
    s.shutdown();
}

fn unknown_clients_are_refused(t: Transport) {
    let s = server(t);
    let g = control(&s);
    let mut c = data_client(&s);
    c.put(b"k", b"v", None).expect("put");
    let e = g.get_to(b"k", 999, None).expect_err("no such client");
    assert_eq!(e.code, ErrorCode::NoSuchClient, "{e}");
    let e = g.put_from(b"k2", 999, 0, 1, 0).expect_err("no such client");
    assert_eq!(e.code, ErrorCode::NoSuchClient, "{e}");
    assert!(!g.unregister(999).expect("unregister"));
    s.shutdown();
}

/// Regression, over real gRPC connections: ids are
/// not sequential, and a second connection can neither heartbeat nor
/// unregister the first's registration (it is told the id is unknown).
fn a_registration_belongs_to_the_connection_that_made_it(t: Transport) {
    let s = server(t);
    let first = control(&s);
    let second = control(&s);
    let a = register(&first, &s);
    let b = register(&first, &s);
    assert!(a.abs_diff(b) > 1 << 20, "ids {a} and {b} are neighbours");
    let e = second.heartbeat(a).expect_err("not its registration");
    assert_eq!(e.code, ErrorCode::NoSuchClient, "{e}");
    assert!(!second.unregister(a).expect("unregister"));
    let e = second
        .register(Registration {
            client_id: a,
            ..Registration::default()
        })
        .map(|r| r.client_id);
    assert!(
        e.is_ok(),
        "a reconnect from the same host takes its id over"
    );
    assert!(
        first.heartbeat(a).is_err(),
        "and the old connection lets go"
    );
    assert!(second.heartbeat(a).expect("heartbeat") > 0);
    assert!(first.heartbeat(b).expect("heartbeat") > 0);
    assert!(first.unregister(b).expect("unregister"));
    s.shutdown();
}

/// In a cluster with a slot map, gRPC serves only the keys of slots this
/// server leads, as the data plane does: a block put on another server's
/// slot would be a miss for every client that routes by the map.
fn grpc_refuses_a_key_of_another_servers_slot(t: Transport) {
    use fabrickv_cluster::slots::{key_slot, SlotMap};
    use fabrickv_server::slot_routing::Routing;
    let s = server(t);
    let g = control(&s);
    let key_where = |lead: bool| {
        (0..)
            .map(|i| format!("block-{i}"))
            .find(|k| (key_slot(k.as_bytes()) < 8192) == lead)
            .expect("a key")
    };
    let (mine, theirs) = (key_where(true), key_where(false));
    g.put(theirs.as_bytes(), value(4, 64), 0)
        .expect("every key is served before a map");
    // Of two servers, this one (0) leads slots 0..=8191.
    let map = SlotMap::initial(2, 1).expect("map");
    s.slot_routing()
        .install(Routing::new(0, "g", map, vec![None, None]));
    g.put(mine.as_bytes(), value(5, 64), 0)
        .expect("put of its own slot");
    assert!(g.exists(mine.as_bytes()).expect("exists"));
    let refused = g
        .put(theirs.as_bytes(), value(6, 64), 0)
        .expect_err("put of another server's slot");
    assert_eq!(refused.code, ErrorCode::WrongServer, "{refused}");
    assert!(refused.message.contains("server 1"), "{refused}");
    for e in [
        g.get_inline(theirs.as_bytes()).map(|_| ()),
        g.exists(theirs.as_bytes()).map(|_| ()),
        g.delete(theirs.as_bytes()).map(|_| ()),
    ] {
        assert_eq!(e.expect_err("refused").code, ErrorCode::WrongServer);
    }
    s.shutdown();
}

transport_tests!(
    grpc_refuses_a_key_of_another_servers_slot,
    a_registration_belongs_to_the_connection_that_made_it,
    grpc_and_data_plane_share_one_store,
    grpc_places_values_in_a_bound_buffer,
    unknown_clients_are_refused,
);

/// Fault 7 of the attack run: a gRPC address another process holds must
/// stop the server at start (it used to log a warning and start without
/// gRPC, so clients of that address talked to the squatter), whether the
/// address was given on purpose or is the default.
#[test]
fn a_held_grpc_address_is_a_start_up_error() {
    let squatter = std::net::TcpListener::bind("127.0.0.1:0").expect("squat a port");
    let held = squatter.local_addr().expect("addr").to_string();
    let cfg = fabrickv_server::ServerConfig {
        listen: "127.0.0.1:0".to_string(),
        workers: Some(1),
        memory_bytes: MEMORY_BYTES,
        log_level: "warn".to_string(),
        cache: fabrickv_server::cache::CacheSettings {
            store: CacheConfig {
                pool_bytes: CACHE_POOL_BYTES,
                ..CacheConfig::default()
            },
            grpc: Some(held.clone()),
        },
        ..fabrickv_server::ServerConfig::default()
    };
    let msg = match fabrickv_server::Server::start(&cfg) {
        Ok(_) => panic!("the server started beside the process holding {held}"),
        Err(e) => e.to_string(),
    };
    assert!(msg.contains(&held), "the error names the address: {msg}");
    drop(squatter);
}

/// With a cluster secret, the server's gRPC control plane refuses calls
/// without it (AUTH_REQUIRED) or with another (AUTH_FAILED) and serves
/// calls that carry it.
#[test]
fn grpc_needs_the_servers_secret() {
    let secret = fabrickv_auth::Secret::from_bytes(b"server-grpc-secret-0123456789", "test")
        .expect("secret");
    let s = TestServer::start_with(Transport::Tcp, 1, Mode::Store, MEMORY_BYTES, |c| {
        c.cache.grpc = Some("127.0.0.1:0".to_string());
        c.auth = Some(secret.clone());
    });
    let with = |secret| {
        let options = fabrickv_control::ClientOptions {
            secret,
            ..fabrickv_control::ClientOptions::default()
        };
        ControlClient::connect_with(&s.grpc_addr(), &options).expect("connects")
    };
    let e = with(None).put(b"k", &b"v"[..], 0).expect_err("no secret");
    assert_eq!(e.code, ErrorCode::AuthRequired, "{e}");
    let other = fabrickv_auth::Secret::from_bytes(b"another-secret-0123456789", "t").expect("s");
    let e = with(Some(other))
        .put(b"k", &b"v"[..], 0)
        .expect_err("wrong secret");
    assert_eq!(e.code, ErrorCode::AuthFailed, "{e}");
    with(Some(secret))
        .put(b"k", &b"v"[..], 0)
        .expect("the secret works");
}
