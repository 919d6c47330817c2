//! The worker's table without sockets: registration, dispatch by kind,
//! refusals, and every registered service's stats, jobs and sweeps.

use std::sync::atomic::AtomicUsize;
use std::sync::Arc;

use fabrickv_wire::control::{
    decode_error, decode_stats_reply, encode_hello, encode_stats_request,
};
use fabrickv_wire::echo::{decode_echo_reply, encode_echo};
use fabrickv_wire::{decode_frame, Frame};

use super::*;
use crate::testsuite::{Rounds, SettledReads};
use crate::EchoService;

/// A service of HELLO that counts what the worker asks of it.
struct Counting {
    name: &'static str,
    sweeps: Arc<AtomicUsize>,
}

impl Service for Counting {
    fn kinds(&self) -> &'static [FrameKind] {
        &[FrameKind::Hello]
    }

    fn handle(&mut self, _call: &Call<'_>, _reply: &mut dyn Reply) -> Result<(), Refusal> {
        Err((ErrorCode::Malformed, "refused on purpose".into()))
    }

    fn stats(&self, out: &mut StatsList) {
        out.push((self.name, 1));
    }

    fn shared_stats(&self, out: &mut StatsList) {
        out.push(("shared", 7));
    }

    fn sweep(&mut self, _now_ms: u64) {
        self.sweeps.fetch_add(1, Ordering::Relaxed);
    }
}

fn worker(id: u16, sweeps: &Arc<AtomicUsize>) -> Worker {
    let services: [Box<dyn Service>; 3] = [
        Box::new(EchoService),
        Box::new(Counting {
            name: "counting",
            sweeps: sweeps.clone(),
        }),
        Box::new(StatsService),
    ];
    Worker::new(id).with(services).expect("register")
}

fn call(w: &mut Worker, msg: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    w.handle(1, msg, &mut out, 1);
    out
}

fn frame(out: &[u8]) -> Frame<'_> {
    decode_frame(out).expect("one reply frame")
}

#[test]
fn a_kind_has_one_service() {
    let mut w = Worker::new(0);
    w.register(Box::new(EchoService)).expect("first");
    assert_eq!(
        w.register(Box::new(EchoService)),
        Err(RegisterError::KindTaken(FrameKind::Echo))
    );
}

#[test]
fn frames_go_to_their_kind_s_service_and_refusals_are_counted() {
    let sweeps = Arc::new(AtomicUsize::new(0));
    let mut w = worker(3, &sweeps);
    let mut req = Vec::new();
    encode_echo(&mut req, 5, 3, b"abc");
    let out = call(&mut w, &req);
    let f = frame(&out);
    assert_eq!((f.header.request_id, f.header.worker), (5, 3));
    assert_eq!(decode_echo_reply(&f).expect("echo reply"), b"abc");
    // A service's refusal, a kind no one registered, broken bytes.
    let mut req = Vec::new();
    encode_hello(&mut req, 6, 3);
    let out = call(&mut w, &req);
    assert_eq!(
        decode_error(&frame(&out)).expect("error").0,
        ErrorCode::Malformed
    );
    let mut req = Vec::new();
    fabrickv_wire::ps::encode_open(&mut req, 7, 3, "t");
    let out = call(&mut w, &req);
    let f = frame(&out);
    assert_eq!(f.header.request_id, 7);
    assert_eq!(decode_error(&f).expect("error").0, ErrorCode::UnknownOpcode);
    req[0] ^= 0xFF;
    let out = call(&mut w, &req);
    assert_eq!(
        frame(&out).header.request_id,
        7,
        "the id of a broken header"
    );
    let list = w.stats_list();
    let refused = list.iter().find(|(k, _)| *k == "frames_refused");
    assert_eq!(refused, Some(&("frames_refused", 3)));
}

#[test]
fn stats_follow_registration_then_worker_then_transport_and_shared_on_worker_0() {
    let sweeps = Arc::new(AtomicUsize::new(0));
    for id in [0u16, 1] {
        let mut w = worker(id, &sweeps);
        w.set_transport_stats(PortStats {
            msgs_in: 4,
            ..PortStats::default()
        });
        let mut req = Vec::new();
        encode_stats_request(&mut req, 9, id);
        let out = call(&mut w, &req);
        let list = decode_stats_reply(&frame(&out)).expect("stats reply");
        let names: Vec<&str> = list.iter().map(|(k, _)| k.as_str()).collect();
        let mut want = vec![
            "counting",
            "frames_refused",
            "conns_accepted",
            "conns_open",
            "conns_closed_framing",
            "conns_closed_timeout",
            "msgs_in",
            "msgs_out",
            "backpressure_pauses",
            "spliced_bytes",
        ];
        if id == 0 {
            want.push("shared");
        }
        assert_eq!(names, want, "worker {id}");
        assert_eq!(list[6].1, 4, "the transport's counters as last recorded");
    }
}

#[test]
fn sweeps_run_on_every_service() {
    let sweeps = Arc::new(AtomicUsize::new(0));
    let mut w = worker(0, &sweeps);
    w.sweep(1);
    w.sweep(2);
    assert_eq!(sweeps.load(Ordering::Relaxed), 2);
}

/// One batched burst of `port` at `msgs` messages a poll; how many
/// messages it handled.
fn batched_burst(port: &mut Conns, w: &mut Worker, msgs: usize) -> Option<usize> {
    let knobs = LoopKnobs {
        poll_burst: msgs,
        batched_send: true,
    };
    let b = Burst::of(knobs, port);
    one_burst(port, w, b, 1).ok()
}

/// An ECHO frame that says it carries `ops` operations.
fn echo_of_ops(id: u64, ops: u16) -> Vec<u8> {
    let mut f = Vec::new();
    encode_echo(&mut f, id, 0, b"x");
    f[6..8].copy_from_slice(&ops.to_le_bytes());
    f
}

#[test]
fn a_burst_flushes_after_its_operations_or_when_input_runs_out() {
    let sweeps = Arc::new(AtomicUsize::new(0));
    let mut w = worker(0, &sweeps);
    let mut port = Conns {
        flush_after_ops: 64,
        ..Conns::default()
    };
    // Single-operation frames: one flush per 64 of them, not one per poll
    // of POLL_BURST_MSGS.
    port.queue.extend((0..100).map(|i| (1, echo_of_ops(i, 0))));
    assert_eq!(batched_burst(&mut port, &mut w, POLL_BURST_MSGS), Some(64));
    assert_eq!(batched_burst(&mut port, &mut w, POLL_BURST_MSGS), Some(36));
    assert_eq!(port.flushes, [64, 36]);
    // Frames of 16 operations: four of them make a burst.
    port.flushes.clear();
    port.queue.extend((0..10).map(|i| (1, echo_of_ops(i, 16))));
    assert_eq!(batched_burst(&mut port, &mut w, POLL_BURST_MSGS), Some(4));
    // Batched receive off: one message a burst.
    assert_eq!(batched_burst(&mut port, &mut w, 1), Some(1));
    assert_eq!(port.flushes, [4, 1]);
    // A port that flushes cheaply: one poll a burst.
    port.flushes.clear();
    port.flush_after_ops = 0;
    port.queue.extend((0..10).map(|i| (1, echo_of_ops(i, 0))));
    assert_eq!(batched_burst(&mut port, &mut w, POLL_BURST_MSGS), Some(4));
    assert_eq!(port.flushes, [4]);
}

/// A port that hands out queued messages of several connections and
/// records what each flush sent; it holds replies when `holds`.
#[derive(Default)]
struct Conns {
    holds: bool,
    flush_after_ops: usize,
    queue: std::collections::VecDeque<(ConnId, Vec<u8>)>,
    /// Replies made and not sent, in order: connection and request id.
    queued: Vec<(ConnId, u64)>,
    /// Every reply sent, in order.
    sent: Vec<(ConnId, u64)>,
    /// Replies each flush sent.
    flushes: Vec<usize>,
}

impl WorkerPort for Conns {
    fn poll(
        &mut self,
        max: usize,
        handler: &mut fabrickv_transport::MessageHandler<'_>,
    ) -> fabrickv_transport::Result<usize> {
        let mut n = 0;
        while n < max {
            let Some((conn, msg)) = self.queue.pop_front() else {
                break;
            };
            let mut out = Vec::new();
            handler(conn, &msg, &mut out);
            self.queued.push((conn, frame(&out).header.request_id));
            n += 1;
        }
        Ok(n)
    }

    fn flush(&mut self) -> fabrickv_transport::Result<()> {
        self.flush_except(&[])
    }

    fn holds_replies(&self) -> bool {
        self.holds
    }

    fn flush_except(&mut self, held: &[ConnId]) -> fabrickv_transport::Result<()> {
        let (keep, send): (Vec<_>, Vec<_>) =
            self.queued.drain(..).partition(|(c, _)| held.contains(c));
        self.flushes.push(send.len());
        self.sent.extend(send);
        self.queued = keep;
        Ok(())
    }

    fn wait(&mut self, _timeout: std::time::Duration) -> fabrickv_transport::Result<()> {
        Ok(())
    }

    fn waker(&self) -> fabrickv_transport::Waker {
        fabrickv_transport::Waker::new(|| {})
    }

    fn stats(&self) -> PortStats {
        PortStats::default()
    }

    fn flush_after_ops(&self) -> usize {
        self.flush_after_ops
    }
}

/// A worker of ECHO (whose replies are not settled, like a write's) and
/// HELLO (settled, like a clean read's) behind an armed gate.
fn gated_worker(rounds: &Arc<Rounds>) -> Worker {
    let gate = crate::gate::FlushGate::new();
    gate.arm(rounds.clone());
    let services: [Box<dyn Service>; 2] = [Box::new(EchoService), Box::new(SettledReads)];
    Worker::new(0)
        .with(services)
        .expect("register")
        .with_gate(gate)
}

/// One batched burst of whatever `port` has queued.
fn conns_burst(port: &mut Conns, w: &mut Worker) {
    let b = Burst::of(LoopKnobs::default(), port);
    one_burst(port, w, b, 1).expect("burst");
}

fn hello(id: u64) -> Vec<u8> {
    let mut f = Vec::new();
    encode_hello(&mut f, id, 0);
    f
}

fn echo(id: u64) -> Vec<u8> {
    let mut f = Vec::new();
    encode_echo(&mut f, id, 0, b"x");
    f
}

#[test]
fn replies_that_wait_for_replication_are_held_per_connection_and_the_others_go() {
    let rounds = Arc::new(Rounds::default());
    let mut w = gated_worker(&rounds);
    let mut port = Conns {
        holds: true,
        ..Conns::default()
    };
    // Connection 1's reply is not settled; connection 2's is.
    port.queue.extend([(1, echo(10)), (2, hello(20))]);
    conns_burst(&mut port, &mut w);
    assert_eq!(port.sent, [(2, 20)], "the settled reply goes at once");
    // A settled reply on a held connection queues behind the held one;
    // other connections are not held up.
    port.queue.extend([(1, hello(11)), (3, hello(30))]);
    conns_burst(&mut port, &mut w);
    assert_eq!(port.sent, [(2, 20), (3, 30)]);
    assert_eq!(port.queued, [(1, 10), (1, 11)]);
    // Once its round is done, the held connection's replies go, in order.
    rounds.complete();
    conns_burst(&mut port, &mut w);
    assert_eq!(port.sent, [(2, 20), (3, 30), (1, 10), (1, 11)]);
    assert_eq!(
        rounds.waits.load(Ordering::Relaxed),
        0,
        "the worker never waited"
    );
    // A connection held for a later write waits for that write's round.
    port.queue.push_back((4, echo(40)));
    conns_burst(&mut port, &mut w);
    port.queue.push_back((4, echo(41)));
    conns_burst(&mut port, &mut w);
    rounds
        .done
        .store(rounds.next.load(Ordering::Acquire) - 1, Ordering::Release);
    conns_burst(&mut port, &mut w);
    assert_eq!(
        port.queued,
        [(4, 40), (4, 41)],
        "the first round is not enough"
    );
    rounds.complete();
    conns_burst(&mut port, &mut w);
    assert!(port.queued.is_empty());
    // Several connections held at once, in any order.
    port.sent.clear();
    port.queue
        .extend([(9, echo(90)), (2, echo(21)), (5, hello(50)), (9, echo(91))]);
    conns_burst(&mut port, &mut w);
    assert_eq!(port.sent, [(5, 50)]);
    assert_eq!(port.queued, [(9, 90), (2, 21), (9, 91)]);
    rounds.complete();
    conns_burst(&mut port, &mut w);
    assert!(port.queued.is_empty());
    assert_eq!(port.sent, [(5, 50), (9, 90), (2, 21), (9, 91)]);
}

#[test]
fn a_port_that_cannot_hold_replies_waits_for_the_gate_before_it_flushes() {
    let rounds = Arc::new(Rounds::default());
    let mut w = gated_worker(&rounds);
    let mut port = Conns::default();
    port.queue.extend([(1, echo(10)), (2, hello(20))]);
    conns_burst(&mut port, &mut w);
    assert_eq!(rounds.waits.load(Ordering::Relaxed), 1);
    assert_eq!(port.sent, [(1, 10), (2, 20)]);
    // A port that holds replies still waits for a burst with a job's
    // replies, whose connections the worker did not see.
    let mut port = Conns {
        holds: true,
        ..Conns::default()
    };
    w.jobs_replied = true;
    port.queue.push_back((2, hello(21)));
    conns_burst(&mut port, &mut w);
    assert_eq!(rounds.waits.load(Ordering::Relaxed), 2);
    assert_eq!(port.sent, [(2, 21)]);
}
