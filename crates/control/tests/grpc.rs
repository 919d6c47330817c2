//! The control plane end to end: a real server on loopback, a fake store
//! behind it, and the blocking client in front.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use fabrickv_control::pb::kv_cache_server::KvCache;
use fabrickv_control::{
    connect_async, pb, BackendError, Bytes, CacheBackend, CacheService, Caller, ClientOptions,
    ClientRange, ControlClient, ControlServer, Fetched, GetDest, GetItem, Got, Placed, PutItem,
    PutSource, Registered, Registration, StatsSnapshot,
};
use fabrickv_types::limits::{
    CACHE_BATCH_KEYS_MAX, CACHE_HEARTBEAT_TIMEOUT_MS, CACHE_KEY_BYTES_MAX, CACHE_VALUE_BYTES_MAX,
};
use fabrickv_types::ErrorCode;
use tonic::Code;

/// A registered client of the fake: its receive buffer stands in for the
/// memory a data-plane transport would reach.
struct FakeClient {
    buffer: Vec<u8>,
}

#[derive(Default)]
struct State {
    values: HashMap<Vec<u8>, (Bytes, Option<Instant>)>,
    clients: HashMap<u64, FakeClient>,
    next_client_id: u64,
    /// The `offset` argument of the last `get_to_client`, to check that an
    /// absent offset stays absent all the way.
    last_placement_offset: Option<Option<u64>>,
}

/// An in-memory store with honest semantics, counting every call so that
/// tests can tell whether a request reached it.
#[derive(Default)]
struct Fake {
    state: Mutex<State>,
    calls: AtomicU64,
}

impl Fake {
    fn state(&self) -> MutexGuard<'_, State> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        self.state.lock().expect("fake state poisoned")
    }

    fn calls(&self) -> u64 {
        self.calls.load(Ordering::SeqCst)
    }

    /// Stores a value without going through a call (and without copying).
    fn preload(&self, key: &[u8], value: Bytes) {
        self.state
            .lock()
            .expect("fake state poisoned")
            .values
            .insert(key.to_vec(), (value, None));
    }

    fn client_bytes(&self, id: u64, offset: usize, len: usize) -> Vec<u8> {
        let state = self.state.lock().expect("fake state poisoned");
        state.clients[&id].buffer[offset..offset + len].to_vec()
    }

    fn fill_client(&self, id: u64, offset: usize, data: &[u8]) {
        let mut state = self.state.lock().expect("fake state poisoned");
        let buffer = &mut state.clients.get_mut(&id).expect("no such client").buffer;
        buffer[offset..offset + data.len()].copy_from_slice(data);
    }
}

fn no_client(id: u64) -> BackendError {
    BackendError::new(
        ErrorCode::NoSuchClient,
        format!("client {id} is not registered"),
    )
}

fn expires_in(deadline: Option<Instant>) -> u64 {
    deadline.map_or(0, |d| {
        u64::try_from(d.saturating_duration_since(Instant::now()).as_millis()).unwrap_or(u64::MAX)
    })
}

fn live(entry: &(Bytes, Option<Instant>)) -> bool {
    entry.1.is_none_or(|d| d > Instant::now())
}

fn deadline(ttl_ms: u64) -> Option<Instant> {
    (ttl_ms > 0).then(|| Instant::now() + Duration::from_millis(ttl_ms))
}

impl CacheBackend for Fake {
    fn put(&self, key: &[u8], value: &[u8], ttl_ms: u64) -> Result<(), BackendError> {
        let entry = (Bytes::copy_from_slice(value), deadline(ttl_ms));
        self.state().values.insert(key.to_vec(), entry);
        Ok(())
    }

    fn put_from_client(
        &self,
        key: &[u8],
        from: ClientRange,
        ttl_ms: u64,
    ) -> Result<(), BackendError> {
        let mut state = self.state();
        let client = state
            .clients
            .get(&from.client_id)
            .ok_or(no_client(from.client_id))?;
        let (start, end) = (from.offset as usize, (from.offset + from.len) as usize);
        if end > client.buffer.len() {
            return Err(BackendError::new(
                ErrorCode::BufferTooSmall,
                "the range is outside the client's buffer",
            ));
        }
        let value = Bytes::copy_from_slice(&client.buffer[start..end]);
        state.values.insert(key.to_vec(), (value, deadline(ttl_ms)));
        Ok(())
    }

    fn get(&self, key: &[u8]) -> Result<Option<Fetched>, BackendError> {
        let state = self.state();
        Ok(state.values.get(key).filter(|e| live(e)).map(|e| Fetched {
            value: e.0.clone(),
            expires_in_ms: expires_in(e.1),
        }))
    }

    fn get_to_client(
        &self,
        key: &[u8],
        client_id: u64,
        offset: Option<u64>,
    ) -> Result<Option<Placed>, BackendError> {
        let mut state = self.state();
        state.last_placement_offset = Some(offset);
        let state = &mut *state;
        let client = state
            .clients
            .get_mut(&client_id)
            .ok_or(no_client(client_id))?;
        let Some((value, d)) = state.values.get(key).filter(|e| live(e)) else {
            return Ok(None);
        };
        let at = offset.unwrap_or(0) as usize;
        if at + value.len() > client.buffer.len() {
            return Err(BackendError::new(
                ErrorCode::BufferTooSmall,
                format!(
                    "{} bytes do not fit at offset {at} of a {}-byte buffer",
                    value.len(),
                    client.buffer.len()
                ),
            ));
        }
        client.buffer[at..at + value.len()].copy_from_slice(value);
        Ok(Some(Placed {
            offset: at as u64,
            length: value.len() as u64,
            expires_in_ms: expires_in(*d),
        }))
    }

    fn delete(&self, key: &[u8]) -> Result<bool, BackendError> {
        Ok(self.state().values.remove(key).is_some_and(|e| live(&e)))
    }

    fn exists(&self, key: &[u8]) -> Result<bool, BackendError> {
        Ok(self.state().values.get(key).is_some_and(live))
    }

    fn register(&self, _caller: &Caller, r: Registration) -> Result<Registered, BackendError> {
        let mut state = self.state();
        let client_id = if r.client_id == 0 {
            state.next_client_id += 1;
            state.next_client_id + 1000
        } else {
            r.client_id
        };
        let buffer = vec![0; usize::try_from(r.receive_buffer_bytes).unwrap_or(0)];
        state.clients.insert(client_id, FakeClient { buffer });
        Ok(Registered {
            client_id,
            heartbeat_interval_ms: CACHE_HEARTBEAT_TIMEOUT_MS / 3,
            heartbeat_timeout_ms: CACHE_HEARTBEAT_TIMEOUT_MS,
            data_plane: vec!["shm:/fabrickv-test".into()],
        })
    }

    fn heartbeat(&self, _caller: &Caller, client_id: u64) -> Result<u64, BackendError> {
        if self.state().clients.contains_key(&client_id) {
            Ok(CACHE_HEARTBEAT_TIMEOUT_MS)
        } else {
            Err(no_client(client_id))
        }
    }

    fn unregister(&self, _caller: &Caller, client_id: u64) -> Result<bool, BackendError> {
        Ok(self.state().clients.remove(&client_id).is_some())
    }

    fn stats(&self) -> StatsSnapshot {
        let state = self.state();
        StatsSnapshot {
            counters: vec![
                ("keys".into(), state.values.len() as u64),
                ("clients".into(), state.clients.len() as u64),
            ],
            fragmentation: 0.25,
        }
    }
}

/// IPv6 loopback when the machine has it, IPv4 loopback otherwise.
fn loopback_any_port() -> SocketAddr {
    let v6: SocketAddr = "[::1]:0".parse().expect("literal address");
    if std::net::TcpListener::bind(v6).is_ok() {
        v6
    } else {
        "127.0.0.1:0".parse().expect("literal address")
    }
}

struct Harness {
    fake: Arc<Fake>,
    server: ControlServer,
    client: ControlClient,
}

fn start() -> Harness {
    let fake = Arc::new(Fake::default());
    let server = ControlServer::start(loopback_any_port(), fake.clone(), None)
        .expect("server starts on loopback");
    assert_ne!(server.local_addr().port(), 0, "the bound port is reported");
    let client = ControlClient::connect(&server.local_addr().to_string()).expect("client connects");
    Harness {
        fake,
        server,
        client,
    }
}

fn register(h: &Harness, buffer: u64) -> u64 {
    h.client
        .register(Registration {
            client_id: 0,
            addresses: vec!["tcp:[::1]:7000".into()],
            receive_buffer_bytes: buffer,
        })
        .expect("register")
        .client_id
}

#[test]
fn put_get_inline_round_trip() {
    let h = start();
    h.client.put(b"block-1", &b"kv"[..], 0).expect("put");
    let got = h
        .client
        .get_inline(b"block-1")
        .expect("get")
        .expect("found");
    assert_eq!(got.value, Bytes::from_static(b"kv"));
    assert_eq!(got.expires_in_ms, 0);

    h.client.put(b"ttl", Vec::from(&b"v"[..]), 60).expect("put");
    let got = h.client.get_inline(b"ttl").expect("get").expect("found");
    assert!(got.expires_in_ms > 50_000 && got.expires_in_ms <= 60_000);

    assert!(h.client.exists(b"block-1").expect("exists"));
    assert!(h.client.delete(b"block-1").expect("delete"));
    assert!(!h.client.delete(b"block-1").expect("delete again"));
    assert!(!h.client.exists(b"block-1").expect("exists"));
    h.server.shutdown().expect("clean shutdown");
}

#[test]
fn maximal_value_round_trips() {
    let h = start();
    let value: Vec<u8> = (0..CACHE_VALUE_BYTES_MAX)
        .map(|i| (i % 251) as u8)
        .collect();
    let value = Bytes::from(value);
    h.client.put(b"big", value.clone(), 0).expect("put 64 MiB");
    let got = h.client.get_inline(b"big").expect("get").expect("found");
    assert_eq!(got.value.len(), CACHE_VALUE_BYTES_MAX);
    assert!(got.value == value, "the 64 MiB value came back changed");
}

#[test]
fn missing_key_is_not_an_error() {
    let h = start();
    assert_eq!(h.client.get_inline(b"nope").expect("get"), None);
    let id = register(&h, 1024);
    assert_eq!(h.client.get_to(b"nope", id, None).expect("get_to"), None);
}

#[test]
fn get_to_client_places_the_value() {
    let h = start();
    let id = register(&h, 64 * 1024);
    let value: Vec<u8> = (0..1000u32).map(|i| i as u8).collect();
    h.client.put(b"k", value.clone(), 0).expect("put");

    let placed = h
        .client
        .get_to(b"k", id, Some(4096))
        .expect("get_to")
        .expect("found");
    assert_eq!(
        placed,
        Placed {
            offset: 4096,
            length: 1000,
            expires_in_ms: 0
        }
    );
    assert_eq!(h.fake.client_bytes(id, 4096, 1000), value);
    assert_eq!(h.fake.state().last_placement_offset, Some(Some(4096)));

    let placed = h
        .client
        .get_to(b"k", id, None)
        .expect("get_to")
        .expect("found");
    assert_eq!(placed.offset, 0);
    assert_eq!(
        h.fake.state().last_placement_offset,
        Some(None),
        "an absent offset must reach the backend as None, not 0"
    );
}

#[test]
fn put_from_client_reads_the_buffer() {
    let h = start();
    let id = register(&h, 8192);
    h.fake.fill_client(id, 100, b"from the client");
    h.client.put_from(b"k", id, 100, 15, 0).expect("put_from");
    let got = h.client.get_inline(b"k").expect("get").expect("found");
    assert_eq!(got.value, Bytes::from_static(b"from the client"));

    let e = h
        .client
        .put_from(b"k", id, 8000, 1000, 0)
        .expect_err("outside");
    assert_eq!(e.code, ErrorCode::BufferTooSmall);
}

#[test]
fn buffer_too_small_arrives_exactly() {
    let h = start();
    let id = register(&h, 1024);
    h.client.put(b"k", vec![1u8; 1000], 0).expect("put");
    let e = h
        .client
        .get_to(b"k", id, Some(100))
        .expect_err("does not fit");
    assert_eq!(e.code, ErrorCode::BufferTooSmall);
    assert_eq!(e.grpc_code, Code::OutOfRange);
    assert!(e.message.contains("do not fit"), "{e}");
    assert!(
        !e.message.contains("BUFFER_TOO_SMALL"),
        "prefix is stripped: {e}"
    );
}

#[test]
fn status_metadata_carries_the_code() {
    let h = start();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let target = h.server.local_addr().to_string();
    let status = runtime
        .block_on(async {
            let mut client = connect_async(&target, &ClientOptions::default())
                .await
                .expect("connect");
            client
                .heartbeat(pb::HeartbeatRequest { client_id: 77 })
                .await
        })
        .expect_err("unknown client");
    assert_eq!(status.code(), Code::FailedPrecondition);
    let md = status.metadata();
    assert_eq!(
        md.get("fabrickv-code").and_then(|v| v.to_str().ok()),
        Some("25")
    );
    assert_eq!(
        md.get("fabrickv-code-name").and_then(|v| v.to_str().ok()),
        Some("NO_SUCH_CLIENT")
    );
    assert!(status.message().starts_with("NO_SUCH_CLIENT (code 25): "));
}

#[test]
fn over_limit_requests_never_reach_the_backend() {
    let h = start();
    let before = h.fake.calls();

    let long_key = vec![b'k'; CACHE_KEY_BYTES_MAX + 1];
    let e = h
        .client
        .put(&long_key, &b"v"[..], 0)
        .expect_err("key too long");
    assert_eq!(e.code, ErrorCode::KeyTooLong);
    assert_eq!(e.grpc_code, Code::InvalidArgument);
    assert_eq!(
        h.client.get_inline(&long_key).expect_err("get").code,
        ErrorCode::KeyTooLong
    );
    assert_eq!(
        h.client.get_inline(b"").expect_err("empty").code,
        ErrorCode::KeyTooLong
    );
    assert_eq!(
        h.client.delete(&long_key).expect_err("delete").code,
        ErrorCode::KeyTooLong
    );
    assert_eq!(
        h.client.exists(&long_key).expect_err("exists").code,
        ErrorCode::KeyTooLong
    );

    let e = h
        .client
        .put(b"k", vec![0u8; CACHE_VALUE_BYTES_MAX + 1], 0)
        .expect_err("value too large");
    assert_eq!(e.code, ErrorCode::ValueTooLarge);
    let e = h
        .client
        .put_from(b"k", 1, 0, CACHE_VALUE_BYTES_MAX as u64 + 1, 0)
        .expect_err("location too large");
    assert_eq!(e.code, ErrorCode::ValueTooLarge);

    let e = h.client.put(b"k", &b"v"[..], u64::MAX).expect_err("ttl");
    assert_eq!(e.code, ErrorCode::TtlTooLarge);

    let e = h
        .client
        .batch_delete((0..=CACHE_BATCH_KEYS_MAX).map(|i| i.to_le_bytes()))
        .expect_err("batch too large");
    assert_eq!(e.code, ErrorCode::BatchTooLarge);

    assert_eq!(
        h.fake.calls(),
        before,
        "a refused request reached the backend"
    );
}

#[test]
fn batches_report_per_item() {
    let h = start();
    let long_key = Bytes::from(vec![b'x'; CACHE_KEY_BYTES_MAX + 1]);
    let item = |key: &'static [u8], v: &'static [u8]| PutItem {
        key: Bytes::from_static(key),
        source: PutSource::Value(Bytes::from_static(v)),
        ttl_seconds: 0,
    };
    let before = h.fake.calls();
    let results = h
        .client
        .batch_put(vec![
            item(b"a", b"1"),
            PutItem {
                key: long_key.clone(),
                source: PutSource::Value(Bytes::from_static(b"2")),
                ttl_seconds: 0,
            },
            item(b"c", b"3"),
            PutItem {
                key: Bytes::from_static(b"d"),
                source: PutSource::Client {
                    client_id: 999,
                    offset: 0,
                    length: 1,
                },
                ttl_seconds: 0,
            },
        ])
        .expect("batch_put");
    assert_eq!(results.len(), 4);
    assert!(results[0].is_ok() && results[2].is_ok());
    assert_eq!(
        results[1].as_ref().map_err(|e| e.code),
        Err(ErrorCode::KeyTooLong)
    );
    assert_eq!(
        results[3].as_ref().map_err(|e| e.code),
        Err(ErrorCode::NoSuchClient)
    );
    assert_eq!(
        h.fake.calls() - before,
        3,
        "the long key never reached the backend"
    );

    let id = register(&h, 16);
    let results = h
        .client
        .batch_get(vec![
            GetItem {
                key: Bytes::from_static(b"a"),
                dest: GetDest::Inline,
            },
            GetItem {
                key: Bytes::from_static(b"missing"),
                dest: GetDest::Inline,
            },
            GetItem {
                key: long_key.clone(),
                dest: GetDest::Inline,
            },
            GetItem {
                key: Bytes::from_static(b"c"),
                dest: GetDest::Client {
                    client_id: id,
                    offset: Some(8),
                },
            },
            GetItem {
                key: Bytes::from_static(b"c"),
                dest: GetDest::Client {
                    client_id: id,
                    offset: Some(16),
                },
            },
        ])
        .expect("batch_get");
    assert_eq!(results.len(), 5);
    match &results[0] {
        Ok(Some(Got::Value(f))) => assert_eq!(f.value, Bytes::from_static(b"1")),
        other => panic!("item 0: {other:?}"),
    }
    assert_eq!(results[1], Ok(None));
    assert_eq!(
        results[2].as_ref().map_err(|e| e.code),
        Err(ErrorCode::KeyTooLong)
    );
    assert_eq!(
        results[3],
        Ok(Some(Got::Placed(Placed {
            offset: 8,
            length: 1,
            expires_in_ms: 0
        })))
    );
    assert_eq!(h.fake.client_bytes(id, 8, 1), b"3");
    assert_eq!(
        results[4].as_ref().map_err(|e| e.code),
        Err(ErrorCode::BufferTooSmall)
    );

    let results = h
        .client
        .batch_delete([&b"a"[..], &long_key[..], b"missing", b"c"])
        .expect("batch_delete");
    assert_eq!(
        results
            .iter()
            .map(|r| r.as_ref().map_err(|e| e.code))
            .collect::<Vec<_>>(),
        vec![Ok(&true), Err(ErrorCode::KeyTooLong), Ok(&false), Ok(&true)]
    );
}

#[test]
fn batch_get_replies_stay_within_one_message() {
    // Straight through the service, without a network: the point is the
    // reply budget, not moving 100 MiB over loopback.
    let fake = Arc::new(Fake::default());
    let forty_mib = Bytes::from(vec![7u8; 40 << 20]);
    fake.preload(b"one", forty_mib.clone());
    fake.preload(b"two", forty_mib);
    fake.preload(b"small", Bytes::from_static(b"s"));
    let service = CacheService::new(fake);
    let get = |key: &'static [u8]| pb::GetRequest {
        key: Bytes::from_static(key),
        dest: None,
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let reply = runtime
        .block_on(service.batch_get(tonic::Request::new(pb::BatchGetRequest {
            items: vec![get(b"one"), get(b"two"), get(b"small")],
        })))
        .expect("batch_get")
        .into_inner();
    let codes: Vec<u32> = reply
        .results
        .iter()
        .map(|r| r.status.as_ref().map_or(u32::MAX, |s| s.code))
        .collect();
    let reply_full = u32::from(ErrorCode::ReplyFull.as_u16());
    assert_eq!(
        codes,
        vec![0, reply_full, 0],
        "the second 40 MiB value does not fit"
    );
    assert!(reply.results[1].response.is_none());
}

#[test]
fn client_lifecycle() {
    let h = start();
    let r = h
        .client
        .register(Registration {
            client_id: 0,
            addresses: vec!["tcp:[::1]:7000".into(), "mr:abcd".into()],
            receive_buffer_bytes: 4096,
        })
        .expect("register");
    assert_ne!(r.client_id, 0, "the server assigns an id");
    assert_eq!(r.heartbeat_timeout_ms, CACHE_HEARTBEAT_TIMEOUT_MS);
    assert!(r.heartbeat_interval_ms > 0 && r.heartbeat_interval_ms < r.heartbeat_timeout_ms);
    assert_eq!(r.data_plane, vec!["shm:/fabrickv-test".to_string()]);

    let chosen = h
        .client
        .register(Registration {
            client_id: 42,
            ..Registration::default()
        })
        .expect("register 42");
    assert_eq!(chosen.client_id, 42);

    assert_eq!(
        h.client.heartbeat(r.client_id).expect("heartbeat"),
        CACHE_HEARTBEAT_TIMEOUT_MS
    );
    assert!(h.client.unregister(r.client_id).expect("unregister"));
    assert!(!h.client.unregister(r.client_id).expect("unregister again"));

    let e = h.client.heartbeat(r.client_id).expect_err("gone");
    assert_eq!(e.code, ErrorCode::NoSuchClient);
    assert_eq!(e.grpc_code, Code::FailedPrecondition);
    let e = h
        .client
        .get_to(b"k", 12345, None)
        .expect_err("unknown client");
    assert_eq!(e.code, ErrorCode::NoSuchClient);

    let e = h
        .client
        .register(Registration {
            addresses: vec![String::new(); 65],
            ..Registration::default()
        })
        .expect_err("too many addresses");
    assert_eq!(e.code, ErrorCode::Malformed);
}

#[test]
fn stats_pass_through() {
    let h = start();
    h.client.put(b"k", &b"v"[..], 0).expect("put");
    register(&h, 0);
    let stats = h.client.stats().expect("stats");
    assert_eq!(
        stats.counters,
        vec![("clients".to_string(), 1), ("keys".to_string(), 1)]
    );
    assert!((stats.fragmentation - 0.25).abs() < f64::EPSILON);
}

#[test]
fn reflection_lists_the_service() {
    use fabrickv_control::pb::kv_cache_server::SERVICE_NAME;
    use tonic::codegen::tokio_stream;
    use tonic_reflection::pb::{v1, v1alpha};

    let h = start();
    let uri = format!("http://{}", h.server.local_addr());
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let (v1_names, v1alpha_names) = runtime.block_on(async {
        let channel = tonic::transport::Endpoint::from_shared(uri)
            .expect("uri")
            .connect()
            .await
            .expect("connect");

        let mut client = v1::server_reflection_client::ServerReflectionClient::new(channel.clone());
        let request = v1::ServerReflectionRequest {
            host: String::new(),
            message_request: Some(v1::server_reflection_request::MessageRequest::ListServices(
                String::new(),
            )),
        };
        let mut replies = client
            .server_reflection_info(tokio_stream::once(request))
            .await
            .expect("v1 reflection")
            .into_inner();
        let reply = replies
            .message()
            .await
            .expect("v1 reply")
            .expect("one reply");
        let v1_names: Vec<String> = match reply.message_response {
            Some(v1::server_reflection_response::MessageResponse::ListServicesResponse(l)) => {
                l.service.into_iter().map(|s| s.name).collect()
            }
            other => panic!("unexpected v1 reflection reply {other:?}"),
        };

        let mut client = v1alpha::server_reflection_client::ServerReflectionClient::new(channel);
        let request = v1alpha::ServerReflectionRequest {
            host: String::new(),
            message_request: Some(
                v1alpha::server_reflection_request::MessageRequest::ListServices(String::new()),
            ),
        };
        let mut replies = client
            .server_reflection_info(tokio_stream::once(request))
            .await
            .expect("v1alpha reflection")
            .into_inner();
        let reply = replies
            .message()
            .await
            .expect("v1alpha reply")
            .expect("one reply");
        let v1alpha_names: Vec<String> = match reply.message_response {
            Some(v1alpha::server_reflection_response::MessageResponse::ListServicesResponse(l)) => {
                l.service.into_iter().map(|s| s.name).collect()
            }
            other => panic!("unexpected v1alpha reflection reply {other:?}"),
        };
        (v1_names, v1alpha_names)
    });
    assert_eq!(SERVICE_NAME, "fabrickv.cache.v1.KvCache");
    assert!(v1_names.iter().any(|n| n == SERVICE_NAME), "{v1_names:?}");
    assert!(
        v1alpha_names.iter().any(|n| n == SERVICE_NAME),
        "{v1alpha_names:?}"
    );
}

#[test]
fn shutdown_releases_the_port_and_clients_see_unavailable() {
    let h = start();
    let addr = h.server.local_addr();
    h.client.put(b"k", &b"v"[..], 0).expect("put");
    h.server.shutdown().expect("clean shutdown");
    let e = h.client.get_inline(b"k").expect_err("server is gone");
    assert_eq!(e.code, ErrorCode::Unavailable, "{e}");
    // The port is free again: a new server can take it.
    let again = ControlServer::start(addr, h.fake, None).expect("rebind the same port");
    drop(again);
}

#[test]
fn connect_to_nothing_fails_fast() {
    // Bind and drop to find a port nobody listens on.
    let addr = std::net::TcpListener::bind(loopback_any_port())
        .and_then(|l| l.local_addr())
        .expect("probe port");
    let started = Instant::now();
    let e = ControlClient::connect(&addr.to_string()).expect_err("nothing listens");
    assert_eq!(e.code, ErrorCode::Unavailable);
    assert!(started.elapsed() < Duration::from_secs(5));
}

#[test]
fn handles_can_be_shared_across_threads() {
    fn shareable<T: Send + Sync>() {}
    shareable::<ControlClient>();
    shareable::<ControlServer>();
}

/// A cluster secret for the authentication tests (printable, so that it
/// can travel as a bearer token).
fn test_secret(text: &str) -> fabrickv_auth::Secret {
    fabrickv_auth::Secret::from_bytes(text.as_bytes(), "test").expect("secret")
}

fn client_with(addr: SocketAddr, secret: Option<fabrickv_auth::Secret>) -> ControlClient {
    let options = ClientOptions {
        secret,
        ..ClientOptions::default()
    };
    ControlClient::connect_with(&addr.to_string(), &options).expect("client connects")
}

#[test]
fn a_secret_guards_every_call_and_the_right_bearer_passes() {
    let secret = test_secret("grpc-test-secret-0123456789");
    let fake = Arc::new(Fake::default());
    let server = ControlServer::start(loopback_any_port(), fake, Some(secret.clone()))
        .expect("server starts");
    let addr = server.local_addr();

    // No environment secret is set in tests: the call carries none.
    let anonymous = client_with(addr, None);
    let e = anonymous.put(b"k", &b"v"[..], 0).expect_err("no bearer");
    assert_eq!(e.code, ErrorCode::AuthRequired, "{e}");
    assert_eq!(e.grpc_code, Code::Unauthenticated);
    let e = anonymous.stats().expect_err("no bearer");
    assert_eq!(e.code, ErrorCode::AuthRequired, "{e}");

    let wrong = client_with(addr, Some(test_secret("not-the-secret-0123456789")));
    let e = wrong.put(b"k", &b"v"[..], 0).expect_err("wrong bearer");
    assert_eq!(e.code, ErrorCode::AuthFailed, "{e}");
    assert_eq!(e.grpc_code, Code::Unauthenticated);

    let right = client_with(addr, Some(secret));
    right.put(b"k", &b"v"[..], 0).expect("put with the secret");
    let got = right.get_inline(b"k").expect("get").expect("found");
    assert_eq!(&got.value[..], b"v");
}

#[test]
fn reflection_is_guarded_too() {
    use tonic::codegen::tokio_stream;
    use tonic_reflection::pb::v1;

    let fake = Arc::new(Fake::default());
    let secret = test_secret("grpc-test-secret-0123456789");
    let server = ControlServer::start(loopback_any_port(), fake, Some(secret)).expect("starts");
    let uri = format!("http://{}", server.local_addr());
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let status = runtime.block_on(async {
        let channel = tonic::transport::Endpoint::from_shared(uri)
            .expect("uri")
            .connect()
            .await
            .expect("connect");
        let mut client = v1::server_reflection_client::ServerReflectionClient::new(channel);
        let request = v1::ServerReflectionRequest {
            host: String::new(),
            message_request: Some(v1::server_reflection_request::MessageRequest::ListServices(
                String::new(),
            )),
        };
        client
            .server_reflection_info(tokio_stream::once(request))
            .await
            .expect_err("reflection without a bearer is refused")
    });
    assert_eq!(status.code(), Code::Unauthenticated);
    assert_eq!(
        fabrickv_control::status::code_of(&status),
        ErrorCode::AuthRequired
    );
    assert!(status.message().starts_with("AUTH_REQUIRED"), "{status:?}");
}
