//! The request layer's behaviour as a suite every transport runs (feature
//! `testsuite`): workers of [`crate::worker`] with the echo and STATS
//! services, reached through client [`Sessions`], every message a frame of
//! `fabrickv-wire`. Each check takes a function that makes a fresh listen
//! address; [`rpc_suite!`] instantiates them all as tests.

use std::time::{Duration, Instant};

use fabrickv_transport::connect;
use fabrickv_types::ErrorCode;
use fabrickv_wire::control::{decode_error, decode_stats_reply, encode_stats_request};
use fabrickv_wire::echo::{decode_echo_reply, encode_echo, encode_echo_reply};
use fabrickv_wire::ps::encode_open;
use fabrickv_wire::{decode_frame, FrameKind};

use crate::session::Sent;
use crate::{
    EchoService, LoopKnobs, RpcError, Service, Serving, Session, Sessions, StatsService, Worker,
};

/// How long any one wait of the suite may take: generous, for a loaded
/// machine.
const TIMEOUT: Duration = Duration::from_secs(20);

fn server(addr: &str, workers: usize, knobs: LoopKnobs) -> Serving {
    Serving::start(addr, workers, knobs, |id| {
        let services: [Box<dyn Service>; 2] = [Box::new(EchoService), Box::new(StatsService)];
        Worker::new(id).with(services)
    })
    .expect("start")
}

/// One session per worker of `s`, `credits` requests in flight each.
fn client<T>(s: &Serving, workers: u16, credits: usize) -> Sessions<T> {
    let sessions = (0..workers)
        .map(|w| Session::new(connect(s.addr(), w, TIMEOUT).expect("connect"), w))
        .collect();
    Sessions::new(sessions, credits, TIMEOUT)
}

/// A reply as the suite checks it.
struct Got {
    kind: FrameKind,
    worker: u16,
    /// The refusal's code, for an ERROR frame.
    error: Option<ErrorCode>,
    /// The body, of an ECHO_REPLY as the wire reads it.
    body: Vec<u8>,
}

/// Waits for `n` replies on session `s`, each completed against the
/// oldest request in flight (replies come back in request order).
fn collect<T>(c: &mut Sessions<T>, s: usize, n: usize, mut on: impl FnMut(Sent<T>, Got)) {
    let deadline = Instant::now() + TIMEOUT;
    let mut got = 0;
    while got < n {
        got += c
            .receive(s, deadline, |m, sent| {
                let f = decode_frame(m).expect("a reply frame");
                let reply = Got {
                    kind: f.header.kind,
                    worker: f.header.worker,
                    error: decode_error(&f).ok().map(|(code, _)| code),
                    body: decode_echo_reply(&f).unwrap_or_default().to_vec(),
                };
                on(sent, reply);
                Ok(())
            })
            .expect("every reply, in order, before the deadline");
    }
}

/// Posts one ECHO of `payload` on session `s`, tagged `tag`.
fn echo<T>(c: &mut Sessions<T>, s: usize, tag: T, payload: &[u8]) -> Result<u64, RpcError> {
    c.post(s, tag, |b, id, w| encode_echo(b, id, w, payload))
}

/// Suite check; see the module docs.
pub fn echo_round_trip(addr: &dyn Fn() -> String) {
    let s = server(&addr(), 1, LoopKnobs::default());
    let mut c = client::<()>(&s, 1, 4);
    let big = vec![7u8; 100_000];
    for payload in [&b"hello"[..], b"", &big] {
        echo(&mut c, 0, (), payload).expect("post");
        c.flush().expect("flush");
        collect(&mut c, 0, 1, |_, got| {
            assert_eq!((got.kind, got.worker), (FrameKind::EchoReply, 0));
            assert_eq!(got.body, payload, "{}-byte payload", payload.len());
        });
    }
}

/// Suite check; see the module docs.
pub fn many_outstanding_complete_in_order_with_their_payloads(addr: &dyn Fn() -> String) {
    for knobs in [
        LoopKnobs::default(),
        LoopKnobs {
            poll_burst: 1,
            batched_send: false,
        },
        LoopKnobs {
            poll_burst: 32,
            batched_send: false,
        },
    ] {
        let s = server(&addr(), 2, knobs);
        let mut c = client::<u32>(&s, 2, 64);
        let mut posted = [0usize; 2];
        for i in 0..64u32 {
            // Spread over both workers in an irregular pattern.
            let session = ((i * 7 + i / 3) % 2) as usize;
            echo(&mut c, session, i, &i.to_le_bytes()).expect("within credits");
            posted[session] += 1;
        }
        c.flush().expect("flush");
        for (session, &n) in posted.iter().enumerate() {
            collect(&mut c, session, n, |sent, got| {
                assert_eq!(got.kind, FrameKind::EchoReply, "{knobs:?}");
                assert_eq!(got.body, sent.tag.to_le_bytes(), "{knobs:?}");
                assert_eq!(usize::from(got.worker), session, "{knobs:?}");
            });
        }
        assert_eq!(c.in_flight(), 0);
    }
}

/// Suite check; see the module docs.
pub fn credits_bound_requests_in_flight(addr: &dyn Fn() -> String) {
    let s = server(&addr(), 1, LoopKnobs::default());
    let mut c = client::<()>(&s, 1, 4);
    for _ in 0..4 {
        echo(&mut c, 0, (), b"x").expect("within credits");
    }
    assert!(matches!(
        echo(&mut c, 0, (), b"x"),
        Err(RpcError::NoCredits)
    ));
    c.flush().expect("flush");
    collect(&mut c, 0, 4, |_, _| {});
    echo(&mut c, 0, (), b"x").expect("credits come back with replies");
}

/// Suite check; see the module docs.
pub fn unregistered_kinds_are_refused_and_counted(addr: &dyn Fn() -> String) {
    let s = server(&addr(), 1, LoopKnobs::default());
    let mut c = client::<u64>(&s, 1, 4);
    // A kind these workers have no service for, and a reply kind.
    let ps = c
        .post(0, 0, |b, id, w| encode_open(b, id, w, "t"))
        .expect("post");
    let reply_kind = c
        .post(0, 0, |b, id, w| encode_echo_reply(b, id, w, b"x"))
        .expect("post");
    c.flush().expect("flush");
    let mut refused = Vec::new();
    collect(&mut c, 0, 2, |sent, got| {
        assert_eq!(got.kind, FrameKind::Error);
        refused.push((sent.id, got.error));
    });
    let unknown = Some(ErrorCode::UnknownOpcode);
    assert_eq!(refused, [(ps, unknown), (reply_kind, unknown)]);
    assert_eq!(stat(&mut c, "frames_refused"), 2);
    echo(&mut c, 0, 0, b"still served").expect("post");
    c.flush().expect("flush");
    collect(&mut c, 0, 1, |_, got| assert_eq!(got.body, b"still served"));
}

/// One counter of worker 0's STATS reply.
fn stat(c: &mut Sessions<u64>, name: &str) -> u64 {
    let deadline = Instant::now() + TIMEOUT;
    c.call(0, 0, deadline, encode_stats_request, |m, _| {
        let f = decode_frame(m).expect("a reply frame");
        let list = decode_stats_reply(&f).expect("a STATS reply");
        Ok(list.iter().find(|(k, _)| k == name).map(|(_, v)| *v))
    })
    .expect("STATS before the deadline")
    .unwrap_or_else(|| panic!("no {name} in STATS"))
}

/// Suite check; see the module docs.
pub fn each_session_is_served_by_its_worker(addr: &dyn Fn() -> String) {
    let s = server(&addr(), 3, LoopKnobs::default());
    let mut c = client::<()>(&s, 3, 16);
    for session in 0..3 {
        for _ in 0..10 {
            echo(&mut c, session, (), b"who").expect("post");
        }
    }
    c.flush().expect("flush");
    for session in 0..3 {
        collect(&mut c, session, 10, |_, got| {
            assert_eq!(
                usize::from(got.worker),
                session,
                "a reply from another worker"
            );
            assert_eq!(got.body, b"who");
        });
    }
}

/// Instantiates every check of the request layer as a `#[test]` in module
/// `$module`, each listening on a fresh address from `$addr()`.
#[macro_export]
macro_rules! rpc_suite {
    ($module:ident, $addr:expr) => {
        mod $module {
            $crate::rpc_suite!(@tests $addr; echo_round_trip, many_outstanding_complete_in_order_with_their_payloads, credits_bound_requests_in_flight, unregistered_kinds_are_refused_and_counted, each_session_is_served_by_its_worker);
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
