//! The request layer's behaviour as a suite every transport runs (feature
//! `testsuite`): workers of [`crate::worker`] with the echo and STATS
//! services, reached through client [`Sessions`], every message a frame of
//! `fabrickv-wire`. Each check takes a function that makes a fresh listen
//! address; [`rpc_suite!`] instantiates them all as tests.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use fabrickv_transport::connect;
use fabrickv_types::ErrorCode;
use fabrickv_wire::control::{
    decode_error, decode_stats_reply, encode_hello, encode_stats_request,
};
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

/// A service of HELLO whose every reply is settled
/// ([`crate::gate::reply_settled`]), as a kv GET of a partition with no
/// write in flight is; its reply is an ECHO_REPLY of "read".
pub struct SettledReads;

impl Service for SettledReads {
    fn kinds(&self) -> &'static [FrameKind] {
        &[FrameKind::Hello]
    }

    fn handle(
        &mut self,
        call: &crate::Call<'_>,
        reply: &mut dyn fabrickv_transport::Reply,
    ) -> Result<(), crate::service::Refusal> {
        crate::gate::reply_settled();
        encode_echo_reply(reply.buf(), call.id(), 0, b"read");
        Ok(())
    }
}

/// A replicator stand-in: every ticket names the next round (the writes
/// so far), and rounds complete only when the check says so
/// ([`Rounds::complete`]) or when a worker that cannot hold replies
/// waits for them.
#[derive(Default)]
pub struct Rounds {
    /// The round the last ticket named.
    pub next: AtomicU64,
    /// Rounds done so far.
    pub done: AtomicU64,
    /// Times a worker waited ([`crate::gate::Settle::settle`]).
    pub waits: AtomicU64,
}

impl Rounds {
    /// Completes every round a ticket named so far.
    pub fn complete(&self) {
        self.done
            .store(self.next.load(Ordering::Acquire), Ordering::Release);
    }
}

impl crate::gate::Settle for Rounds {
    fn settle(&self) {
        self.waits.fetch_add(1, Ordering::AcqRel);
        self.complete();
    }

    fn ticket(&self) -> Option<u64> {
        Some(self.next.fetch_add(1, Ordering::AcqRel) + 1)
    }

    fn done(&self, ticket: u64) -> bool {
        self.done.load(Ordering::Acquire) >= ticket
    }

    fn wait(&self, _also: Option<std::os::fd::BorrowedFd<'_>>, _timeout: Duration) -> bool {
        false
    }
}

/// Suite check; see the module docs. A reply that waits for replication
/// holds back its own connection only: another connection's settled
/// reply leaves meanwhile, and the held one once its round is done. On a
/// port that cannot hold replies the worker waits for the round instead.
pub fn a_held_reply_holds_back_its_connection_only(addr: &dyn Fn() -> String) {
    let rounds = Arc::new(Rounds::default());
    let gate = crate::gate::FlushGate::new();
    gate.arm(rounds.clone());
    let g = gate.clone();
    let s = Serving::start(&addr(), 1, LoopKnobs::default(), move |id| {
        let services: [Box<dyn Service>; 2] = [Box::new(EchoService), Box::new(SettledReads)];
        Ok(Worker::new(id).with(services)?.with_gate(g.clone()))
    })
    .expect("start");
    let mut a = client::<()>(&s, 1, 4);
    let mut b = client::<()>(&s, 1, 4);
    // A's ECHO stands for a write: its reply waits for a round.
    echo(&mut a, 0, (), b"write").expect("post");
    a.flush().expect("flush");
    let deadline = Instant::now() + TIMEOUT;
    while rounds.next.load(Ordering::Acquire) == 0 && rounds.waits.load(Ordering::Acquire) == 0 {
        assert!(Instant::now() < deadline, "the write was never handled");
        std::thread::sleep(Duration::from_millis(1));
    }
    if rounds.waits.load(Ordering::Acquire) > 0 {
        // This port cannot hold replies: the worker waited, then sent.
        collect(&mut a, 0, 1, |_, got| assert_eq!(got.body, b"write"));
        return;
    }
    let released = Arc::new(AtomicBool::new(false));
    let reader = {
        let released = released.clone();
        std::thread::spawn(move || {
            collect(&mut a, 0, 1, |_, got| {
                assert_eq!(got.body, b"write");
                assert!(
                    released.load(Ordering::Acquire),
                    "a reply went before its round was done"
                );
            });
        })
    };
    for _ in 0..3 {
        b.post(0, (), encode_hello).expect("post");
        b.flush().expect("flush");
        collect(&mut b, 0, 1, |_, got| assert_eq!(got.body, b"read"));
    }
    released.store(true, Ordering::Release);
    rounds.complete();
    gate.wake_waiters();
    reader
        .join()
        .expect("the held reply, once its round was done");
}

/// Instantiates every check of the request layer as a `#[test]` in module
/// `$module`, each listening on a fresh address from `$addr()`.
#[macro_export]
macro_rules! rpc_suite {
    ($module:ident, $addr:expr) => {
        mod $module {
            $crate::rpc_suite!(@tests $addr; echo_round_trip, many_outstanding_complete_in_order_with_their_payloads, credits_bound_requests_in_flight, unregistered_kinds_are_refused_and_counted, each_session_is_served_by_its_worker, a_held_reply_holds_back_its_connection_only);
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
