//! The RPC layer's behaviour as a suite every transport runs (feature
//! `testsuite`): each check takes a function that makes a fresh listen
//! address; [`rpc_suite!`] instantiates them all as tests.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::{
    Affinity, Handlers, RpcClient, RpcClientConfig, RpcError, RpcServer, RpcStatus, ServerKnobs,
};

const ECHO: u16 = 1;
const WHO: u16 = 2;
const GATED: u16 = 3;
const FAIL: u16 = 4;

/// A gate that GATED handlers wait on, so a test controls when they answer.
type Gate = Arc<(Mutex<bool>, std::sync::Condvar)>;

fn server(addr: &str, threads: usize, knobs: ServerKnobs, gate: Gate) -> RpcServer {
    let mut h = Handlers::new();
    h.register(ECHO, |req, out| {
        out.extend_from_slice(req);
        Ok(())
    })
    .expect("register");
    h.register(WHO, |_, out| {
        // Which server thread ran the handler (threads are named fkv-rpc-N).
        let name = std::thread::current().name().unwrap_or("").to_string();
        out.extend_from_slice(name.as_bytes());
        Ok(())
    })
    .expect("register");
    h.register(GATED, move |req, out| {
        let (lock, cv) = &*gate;
        let mut open = lock.lock().expect("gate");
        while !*open {
            open = cv.wait(open).expect("gate");
        }
        out.extend_from_slice(req);
        Ok(())
    })
    .expect("register");
    h.register(FAIL, |_, _| Err(())).expect("register");
    RpcServer::start(addr, threads, Arc::new(h), knobs).expect("start")
}

fn open_gate() -> Gate {
    Arc::new((Mutex::new(true), std::sync::Condvar::new()))
}

fn client(s: &RpcServer, threads: usize, cfg: RpcClientConfig) -> RpcClient {
    RpcClient::connect(s.addr(), threads, cfg).expect("connect")
}

/// Suite check; see the module docs.
pub fn echo_round_trip(addr: &dyn Fn() -> String) {
    let s = server(&addr(), 1, ServerKnobs::default(), open_gate());
    let mut c = client(&s, 1, RpcClientConfig::default());
    assert_eq!(c.call(ECHO, b"hello").expect("call"), b"hello");
    assert_eq!(c.call(ECHO, b"").expect("empty payload"), b"");
    let big = vec![7u8; 100_000];
    assert_eq!(c.call(ECHO, &big).expect("large payload"), big);
}

/// Suite check; see the module docs.
pub fn many_outstanding_complete_in_order_with_their_payloads(addr: &dyn Fn() -> String) {
    for knobs in [
        ServerKnobs::default(),
        ServerKnobs {
            poll_burst: 1,
            batched_send: false,
            idle_spin_us: 0,
            ..ServerKnobs::default()
        },
        ServerKnobs {
            poll_burst: 32,
            batched_send: false,
            idle_spin_us: 10,
            ..ServerKnobs::default()
        },
    ] {
        let s = server(&addr(), 2, knobs, open_gate());
        let cfg = RpcClientConfig {
            credits: 64,
            affinity: Affinity::Random,
            ..Default::default()
        };
        let mut c = client(&s, 2, cfg);
        let mut expect = std::collections::HashMap::new();
        for i in 0..64u32 {
            let id = c.call_async(ECHO, &i.to_le_bytes()).expect("credit");
            expect.insert(id, i);
        }
        c.flush().expect("flush");
        let deadline = Instant::now() + Duration::from_secs(10);
        while !expect.is_empty() {
            c.poll(&mut |done| {
                assert_eq!(done.status, RpcStatus::Ok);
                let want = expect
                    .remove(&done.request_id)
                    .expect("unknown or repeated completion");
                assert_eq!(done.payload, want.to_le_bytes());
            })
            .expect("poll");
            assert!(
                Instant::now() < deadline,
                "{} requests never completed",
                expect.len()
            );
            c.wait(Duration::from_millis(20)).expect("wait");
        }
        assert_eq!(c.in_flight(), 0);
    }
}

/// Suite check; see the module docs.
pub fn credits_bound_requests_in_flight(addr: &dyn Fn() -> String) {
    let s = server(&addr(), 1, ServerKnobs::default(), open_gate());
    let mut c = client(
        &s,
        1,
        RpcClientConfig {
            credits: 4,
            ..Default::default()
        },
    );
    for _ in 0..4 {
        c.call_async(ECHO, b"x").expect("within credits");
    }
    assert!(matches!(c.call_async(ECHO, b"x"), Err(RpcError::NoCredits)));
    c.flush().expect("flush");
    let mut got = 0;
    let deadline = Instant::now() + Duration::from_secs(10);
    while got < 4 {
        got += c.poll(&mut |_| {}).expect("poll");
        assert!(Instant::now() < deadline);
        c.wait(Duration::from_millis(20)).expect("wait");
    }
    c.call_async(ECHO, b"x")
        .expect("credits come back with completions");
}

/// Suite check; see the module docs.
pub fn requests_time_out_and_late_responses_are_dropped(addr: &dyn Fn() -> String) {
    let gate: Gate = Arc::new((Mutex::new(false), std::sync::Condvar::new()));
    let s = server(&addr(), 1, ServerKnobs::default(), gate.clone());
    let cfg = RpcClientConfig {
        timeout: Duration::from_millis(100),
        ..Default::default()
    };
    let mut c = client(&s, 1, cfg);
    let started = Instant::now();
    match c.call(GATED, b"slow") {
        Err(RpcError::Timeout) => {}
        other => panic!("expected a timeout, got {other:?}"),
    }
    assert!(
        started.elapsed() >= Duration::from_millis(100),
        "timed out early"
    );
    assert_eq!(
        c.in_flight(),
        0,
        "a timed-out request gives its credit back"
    );
    // Let the handler answer: its response must be dropped, and the next
    // call must get its own response, not the stale one.
    {
        let (lock, cv) = &*gate;
        *lock.lock().expect("gate") = true;
        cv.notify_all();
    }
    assert_eq!(
        c.call(ECHO, b"fresh").expect("call after timeout"),
        b"fresh"
    );
    assert_eq!(c.late_responses(), 1);
}

/// Suite check; see the module docs.
pub fn unknown_type_and_handler_errors_have_statuses(addr: &dyn Fn() -> String) {
    let s = server(&addr(), 1, ServerKnobs::default(), open_gate());
    let mut c = client(&s, 1, RpcClientConfig::default());
    assert!(matches!(
        c.call(77, b""),
        Err(RpcError::Status(RpcStatus::NoHandler))
    ));
    assert!(matches!(
        c.call(FAIL, b""),
        Err(RpcError::Status(RpcStatus::HandlerError))
    ));
    assert!(matches!(c.call(9999, b""), Err(RpcError::Invalid(_))));
    assert_eq!(c.call(ECHO, b"still fine").expect("call"), b"still fine");
}

/// Suite check; see the module docs.
pub fn affinity_modulo_pins_a_client_to_one_thread(addr: &dyn Fn() -> String) {
    let s = server(&addr(), 3, ServerKnobs::default(), open_gate());
    for client_id in 0..4usize {
        let cfg = RpcClientConfig {
            affinity: Affinity::Modulo,
            client_id,
            ..Default::default()
        };
        let mut c = client(&s, 3, cfg);
        for _ in 0..10 {
            let who = c.call(WHO, b"").expect("call");
            assert_eq!(who, format!("fkv-rpc-{}", client_id % 3).as_bytes());
        }
    }
}

/// Suite check; see the module docs.
pub fn affinity_random_spreads_over_threads(addr: &dyn Fn() -> String) {
    let s = server(&addr(), 3, ServerKnobs::default(), open_gate());
    let cfg = RpcClientConfig {
        affinity: Affinity::Random,
        ..Default::default()
    };
    let mut c = client(&s, 3, cfg);
    let mut seen = std::collections::HashSet::new();
    for _ in 0..200 {
        seen.insert(c.call(WHO, b"").expect("call"));
    }
    assert_eq!(seen.len(), 3, "random affinity reached only {seen:?}");
}

/// Suite check; see the module docs.
pub fn large_responses_go_out_of_line_into_reply_slots(addr: &dyn Fn() -> String) {
    let knobs = ServerKnobs {
        inline_max: 16,
        ..ServerKnobs::default()
    };
    let s = server(&addr(), 1, knobs, open_gate());
    let cfg = RpcClientConfig {
        credits: 8,
        reply_slot_bytes: 4096,
        ..Default::default()
    };
    let mut c = client(&s, 1, cfg);
    // Inline (small), out of line (fits a slot), inline again (larger than a slot).
    for size in [0usize, 10, 17, 100, 4000, 4096, 8000] {
        let payload: Vec<u8> = (0..size).map(|i| (i * 7 + size) as u8).collect();
        assert_eq!(
            c.call(ECHO, &payload).expect("call"),
            payload,
            "{size}-byte response"
        );
    }
    // Many in flight at once: each response must land in its own slot.
    let mut expect = std::collections::HashMap::new();
    for i in 0..8u8 {
        let payload = vec![i; 1000 + usize::from(i)];
        expect.insert(c.call_async(ECHO, &payload).expect("credit"), payload);
    }
    c.flush().expect("flush");
    let deadline = Instant::now() + Duration::from_secs(10);
    while !expect.is_empty() {
        c.poll(&mut |done| {
            assert_eq!(done.status, RpcStatus::Ok);
            let want = expect.remove(&done.request_id).expect("known request");
            assert_eq!(done.payload, &want[..]);
        })
        .expect("poll");
        assert!(Instant::now() < deadline, "responses missing");
        c.wait(Duration::from_millis(20)).expect("wait");
    }
    // 17, 100, 4000 and 4096 bytes, then the eight of about 1000 bytes.
    let expected = if c.has_reply_slots() { 12 } else { 0 };
    assert_eq!(c.out_of_line_responses(), expected);
}

/// Instantiates every RPC check as a `#[test]` in module `$module`, each
/// listening on a fresh address from `$addr()`.
#[macro_export]
macro_rules! rpc_suite {
    ($module:ident, $addr:expr) => {
        mod $module {
            $crate::rpc_suite!(@tests $addr; echo_round_trip, many_outstanding_complete_in_order_with_their_payloads, credits_bound_requests_in_flight, requests_time_out_and_late_responses_are_dropped, unknown_type_and_handler_errors_have_statuses, affinity_modulo_pins_a_client_to_one_thread, affinity_random_spreads_over_threads, large_responses_go_out_of_line_into_reply_slots);
        }
    };
    (@tests $addr:expr; $($test:ident),* $(,)?) => {
        $(
            #[test]
            fn $test() {
                $crate::testsuite::$test(&$addr)
            }
        )*
    };
}
