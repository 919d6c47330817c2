//! The server under attack (memcached's `t/malicious-commands.t`): a real
//! server receives hostile bytes on many connections while a well-behaved
//! client keeps working.
//!
//! What must hold:
//! - every hostile message with intact transport framing gets an ERROR
//!   frame, or per-operation error results, with the stable code for what
//!   is wrong with it, and its connection keeps working;
//! - corrupt transport framing closes that connection and no other;
//! - half-sent messages and handshakes hold nothing that others need;
//! - the server stays up and data written before the attack is intact.

#[macro_use]
mod common;

use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use fabrickv_client::{Client, Kv};
use fabrickv_transport::inproc::InprocEndpoint;
use fabrickv_transport::tcp::TcpEndpoint;
use fabrickv_transport::Endpoint;
use fabrickv_transport_shm::ShmEndpoint;
use fabrickv_types::limits::{
    BATCH_OPS_MAX, FRAME_BODY_BYTES_MAX, FRAME_HEADER_BYTES, HANDSHAKES_PENDING_MAX, KEY_BYTES_MAX,
    MESSAGE_BYTES_MAX, TTL_MS_MAX, VALUE_BYTES_MAX,
};
use fabrickv_types::ErrorCode;
use fabrickv_wire::{PutCondition, MAGIC};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use common::{
    keys_of_worker, parse_reply, recv_n, request, stat, stat_per_worker, stats, value_of, wait_for,
    Reply, TestServer, Transport, TIMEOUT,
};

/// What the server must answer to one hostile message.
#[derive(Debug, Clone)]
enum Expect {
    /// An ERROR frame with this code, echoing this request id.
    Refused(ErrorCode, u64),
    /// A RESPONSE to this request id with these per-operation results.
    Results(u64, Vec<(ErrorCode, Vec<u8>)>),
}

/// One hostile message and the answer it must get.
#[derive(Debug, Clone)]
struct Case {
    /// What is wrong with the message, for assertion messages.
    name: String,
    /// The message, sent as one transport message.
    msg: Vec<u8>,
    /// The answer it must get.
    expect: Expect,
}

/// Checks one reply against what was expected of it.
fn check(case: &str, worker: u16, reply: &[u8], expect: &Expect) {
    let (id, w, got) = parse_reply(reply);
    let (want_id, want) = match expect {
        Expect::Refused(code, id) => (*id, Reply::Refused(*code)),
        Expect::Results(id, results) => (*id, Reply::Results(results.clone())),
    };
    assert_eq!(got, want, "{case}: wrong answer");
    assert_eq!(id, want_id, "{case}: wrong request id");
    assert_eq!(w, worker, "{case}: answered by the wrong worker");
}

/// A key stored before the attack, which hostile frames read back next to
/// their bad operations to show those had no effect.
struct Known {
    /// A key the target worker owns, stored before the attack.
    key: Vec<u8>,
    /// Its value.
    value: Vec<u8>,
    /// A key another worker owns (misrouting), if there is another worker.
    foreign: Option<Vec<u8>>,
}

fn set_u16(msg: &mut [u8], at: usize, v: u16) {
    msg[at..at + 2].copy_from_slice(&v.to_le_bytes());
}

fn set_u32(msg: &mut [u8], at: usize, v: u32) {
    msg[at..at + 4].copy_from_slice(&v.to_le_bytes());
}

/// Recomputes the body checksum after the body was edited, so that the
/// frame gets past the checksum to the check the test is aimed at.
fn reseal(msg: &mut [u8]) {
    let crc = fabrickv_wire::checksum::crc32c(&msg[FRAME_HEADER_BYTES..]);
    set_u32(msg, 20, crc);
    set_u32(msg, 16, (msg.len() - FRAME_HEADER_BYTES) as u32);
}

/// The request id the server can read from a message whose header may be
/// broken: bytes 8..16 if the message has them, else 0.
fn readable_id(msg: &[u8]) -> u64 {
    msg.get(8..16)
        .map_or(0, |b| u64::from_le_bytes(b.try_into().expect("8 bytes")))
}

/// Random bytes that do not start with the frame magic.
fn random_message(rng: &mut StdRng) -> Vec<u8> {
    let mut msg = vec![0u8; rng.gen_range(1..=300)];
    rng.fill(&mut msg[..]);
    if msg.len() >= 2 && msg[..2] == MAGIC.to_le_bytes() {
        msg[0] ^= 0xFF;
    }
    msg
}

/// Every kind of hostile message with intact transport framing, aimed at
/// `worker`. `big` adds the one that carries a 1 MiB value.
fn catalogue(worker: u16, known: &Known, next_id: &mut u64, big: bool) -> Vec<Case> {
    let mut cases = Vec::new();
    let mut id = || {
        *next_id += 1;
        *next_id
    };
    let sample = |id: u64| {
        request(id, worker, |b| {
            b.put(b"sample", b"value", 0, PutCondition::Always)
                .get(b"sample");
        })
    };
    let mut refused = |name: &str, code: ErrorCode, edit: &dyn Fn(&mut Vec<u8>), id: u64| {
        let mut msg = sample(id);
        edit(&mut msg);
        cases.push(Case {
            name: name.to_string(),
            expect: Expect::Refused(code, readable_id(&msg)),
            msg,
        });
    };
    use ErrorCode as E;
    refused("two bytes", E::Malformed, &|m| m.truncate(2), id());
    refused(
        "header cut at 20 bytes",
        E::Malformed,
        &|m| m.truncate(20),
        id(),
    );
    refused(
        "header only",
        E::Malformed,
        &|m| m.truncate(FRAME_HEADER_BYTES),
        id(),
    );
    refused(
        "one byte short",
        E::Malformed,
        &|m| {
            m.pop();
        },
        id(),
    );
    refused(
        "cut mid-body",
        E::Malformed,
        &|m| m.truncate(FRAME_HEADER_BYTES + 20),
        id(),
    );
    refused("one byte too many", E::Malformed, &|m| m.push(0), id());
    refused("bad magic", E::Malformed, &|m| m[0] ^= 0xFF, id());
    refused("version 0", E::UnsupportedVersion, &|m| m[2] = 0, id());
    refused("version 2", E::UnsupportedVersion, &|m| m[2] = 2, id());
    for kind in [0u8, 16, 255] {
        refused(
            &format!("frame kind {kind}"),
            E::UnknownOpcode,
            &|m| m[3] = kind,
            id(),
        );
    }
    for (kind, name) in [
        (2u8, "HelloReply"),
        (4, "Response"),
        (6, "StatsReply"),
        (7, "Error"),
        (9, "PsReply"),
        (11, "CacheReply"),
        (13, "ShardReply"),
        (15, "PartitionsReply"),
    ] {
        refused(
            &format!("a {name} sent as a request"),
            E::UnknownOpcode,
            &|m| m[3] = kind,
            id(),
        );
    }
    refused(
        "a kv batch relabelled as a partitions request",
        E::Malformed,
        &|m| m[3] = 14,
        id(),
    );
    refused(
        "a kv batch relabelled as an embedding request",
        E::Malformed,
        &|m| m[3] = 8,
        id(),
    );
    refused(
        "a kv batch relabelled as a cache request",
        E::Malformed,
        &|m| m[3] = 10,
        id(),
    );
    refused("reserved flags set", E::Malformed, &|m| m[4] = 1, id());
    // The header's last word is no longer reserved: it carries a cluster
    // client's map epoch, which a server without a map does not check.
    let over = (BATCH_OPS_MAX + 1) as u16;
    refused(
        "op count over the bound",
        E::BatchTooLarge,
        &|m| set_u16(m, 6, over),
        id(),
    );
    refused(
        "op count 65535",
        E::BatchTooLarge,
        &|m| set_u16(m, 6, u16::MAX),
        id(),
    );
    refused(
        "body_len u32::MAX",
        E::FrameTooLarge,
        &|m| set_u32(m, 16, u32::MAX),
        id(),
    );
    let past = (FRAME_BODY_BYTES_MAX + 1) as u32;
    refused(
        "body_len over the bound",
        E::FrameTooLarge,
        &|m| set_u32(m, 16, past),
        id(),
    );
    refused(
        "body_len past the message",
        E::Malformed,
        &|m| {
            let n = u32::from_le_bytes([m[16], m[17], m[18], m[19]]);
            set_u32(m, 16, n + 100);
        },
        id(),
    );
    refused(
        "body byte flipped",
        E::BadChecksum,
        &|m| {
            let last = m.len() - 1;
            m[last] ^= 1;
        },
        id(),
    );
    refused("checksum flipped", E::BadChecksum, &|m| m[20] ^= 1, id());
    refused(
        "op count one too many",
        E::Malformed,
        &|m| set_u16(m, 6, 3),
        id(),
    );
    refused(
        "op count one too few",
        E::Malformed,
        &|m| set_u16(m, 6, 1),
        id(),
    );
    refused(
        "op count 0 with a body",
        E::Malformed,
        &|m| set_u16(m, 6, 0),
        id(),
    );
    refused(
        "key_len overruns the body",
        E::Malformed,
        &|m| {
            set_u16(m, FRAME_HEADER_BYTES + 2, 1000);
            reseal(m);
        },
        id(),
    );
    refused(
        "value_len u32::MAX",
        E::Malformed,
        &|m| {
            set_u32(m, FRAME_HEADER_BYTES + 4, u32::MAX);
            reseal(m);
        },
        id(),
    );
    refused(
        "op header cut short",
        E::Malformed,
        &|m| {
            m.truncate(FRAME_HEADER_BYTES + 10);
            set_u16(m, 6, 1);
            reseal(m);
        },
        id(),
    );
    let n = id();
    let msg = request(n, worker, |b| {
        for _ in 0..=BATCH_OPS_MAX {
            b.get(&known.key);
        }
    });
    cases.push(Case {
        name: "a real frame of 513 operations".into(),
        expect: Expect::Refused(E::BatchTooLarge, n),
        msg,
    });
    let n = id();
    let mut msg = sample(n);
    let half = FRAME_HEADER_BYTES + (msg.len() - FRAME_HEADER_BYTES) / 2;
    msg[half..].fill(0xA5);
    cases.push(Case {
        name: "random body under a valid header".into(),
        expect: Expect::Refused(E::BadChecksum, n),
        msg,
    });

    // Frames that parse: each bad operation gets its own code, and the GET
    // of a stored key that ends every frame still answers. Bad PUTs aim at
    // that key, so one wrongly applied would show in the GET.
    let ok_get = (E::Ok, known.value.clone());
    let none = Vec::new();
    let mut results =
        |name: &str, ops: &dyn Fn(&mut fabrickv_wire::RequestBuilder<'_>), codes: &[ErrorCode]| {
            let n = id();
            let msg = request(n, worker, |b| {
                ops(b);
                b.get(&known.key);
            });
            let mut want: Vec<_> = codes.iter().map(|&c| (c, none.clone())).collect();
            want.push(ok_get.clone());
            cases.push(Case {
                name: name.to_string(),
                expect: Expect::Results(n, want),
                msg,
            });
        };
    let k = known.key.as_slice();
    results(
        "unknown opcodes",
        &|b| {
            for op in [0u8, 6, 99, 255] {
                b.raw(op, 0, k, b"", 0);
            }
        },
        &[E::UnknownOpcode; 4],
    );
    results(
        "keys of 251 bytes, 65535 bytes and none",
        &|b| {
            b.get(&[b'k'; KEY_BYTES_MAX + 1])
                .put(
                    &vec![b'k'; usize::from(u16::MAX)],
                    b"v",
                    0,
                    PutCondition::Always,
                )
                .get(b"");
        },
        &[E::KeyTooLong; 3],
    );
    results(
        "TTLs over the bound",
        &|b| {
            b.put(k, b"bad ttl", TTL_MS_MAX + 1, PutCondition::Always)
                .put(k, b"bad ttl", u64::MAX, PutCondition::Always);
        },
        &[E::TtlTooLarge; 2],
    );
    results(
        "unknown flags",
        &|b| {
            b.raw(2, 3, k, b"bad flags", 0)
                .raw(2, 0x80, k, b"bad flags", 0);
        },
        &[E::Malformed; 2],
    );
    results(
        "GET and DELETE with PUT fields",
        &|b| {
            b.raw(1, 0, k, b"value on a get", 0)
                .raw(1, 1, k, b"", 0)
                .raw(3, 0, k, b"", 5000);
        },
        &[E::Malformed; 3],
    );
    results("empty request", &|_| {}, &[]);
    if let Some(foreign) = &known.foreign {
        // Served under the partition's lock, counted as misrouted (a
        // DELETE of an absent key, so that nothing is stored).
        results(
            "misrouted key",
            &|b| {
                b.delete(foreign);
            },
            &[E::NotFound],
        );
    }
    if big {
        results(
            "value one byte over the bound",
            &|b| {
                b.put(k, &vec![7u8; VALUE_BYTES_MAX + 1], 0, PutCondition::Always);
            },
            &[E::ValueTooLarge],
        );
    }
    cases
}

/// Stores one key per worker for the hostile frames to read back.
fn known_keys(c: &mut Client, workers: u16) -> Vec<Known> {
    (0..workers)
        .map(|w| {
            let key = keys_of_worker(c, w, 1, "known").remove(0);
            let value = value_of(u64::from(w) + 77, 33);
            c.put(&key, &value).expect("put known key");
            let foreign =
                (workers > 1).then(|| keys_of_worker(c, (w + 1) % workers, 1, "foreign").remove(0));
            Known {
                key,
                value,
                foreign,
            }
        })
        .collect()
}

fn every_hostile_frame_gets_its_own_error_code(t: Transport) {
    let s = TestServer::default_on(t);
    let mut c = s.client();
    let known = known_keys(&mut c, s.workers);
    let mut next_id = 1_000;
    let mut refused = 0;
    for w in 0..s.workers {
        let mut ep = s.endpoint(w);
        let k = &known[usize::from(w)];
        for case in catalogue(w, k, &mut next_id, true) {
            // One at a time, each followed by a good request on the same
            // connection: the connection must survive every one.
            next_id += 1;
            let good = request(next_id, w, |b| {
                b.get(&k.key);
            });
            ep.post(&case.msg).expect("post");
            ep.post(&good).expect("post");
            ep.flush(TIMEOUT).expect("flush");
            let replies = recv_n(&mut *ep, 2);
            check(&case.name, w, &replies[0], &case.expect);
            let after = format!("the good request after {}", case.name);
            check(
                &after,
                w,
                &replies[1],
                &Expect::Results(next_id, vec![(ErrorCode::Ok, k.value.clone())]),
            );
            if matches!(case.expect, Expect::Refused(..)) {
                refused += 1;
            }
        }
    }
    let st = stats(&mut c);
    assert_eq!(
        st["frames_refused"], refused,
        "every refusal is counted once"
    );
    assert_eq!(
        st["items"],
        u64::from(s.workers),
        "no hostile frame stored anything"
    );
    assert_eq!(st["conns_closed_framing"], 0, "intact framing never closes");
    s.shutdown();
}

fn pipelined_random_messages_are_each_refused_in_order(t: Transport) {
    const MESSAGES: usize = 500;
    let s = TestServer::default_on(t);
    let mut c = s.client();
    let known = known_keys(&mut c, s.workers);
    let mut rng = StdRng::seed_from_u64(0x5EED);
    let mut ep = s.endpoint(1);
    let msgs: Vec<Vec<u8>> = (0..MESSAGES).map(|_| random_message(&mut rng)).collect();
    for m in &msgs {
        ep.post(m).expect("post");
    }
    let good = request(42, 1, |b| {
        b.get(&known[1].key);
    });
    ep.post(&good).expect("post");
    ep.flush(TIMEOUT).expect("flush");
    let replies = recv_n(&mut *ep, MESSAGES + 1);
    for (i, (m, r)) in msgs.iter().zip(&replies).enumerate() {
        let expect = Expect::Refused(ErrorCode::Malformed, readable_id(m));
        check(
            &format!("random message {i} ({} bytes)", m.len()),
            1,
            r,
            &expect,
        );
    }
    check(
        "the good request after random messages",
        1,
        &replies[MESSAGES],
        &Expect::Results(42, vec![(ErrorCode::Ok, known[1].value.clone())]),
    );
    assert_eq!(
        stat_per_worker(&mut c, "frames_refused"),
        vec![0, MESSAGES as u64]
    );
    s.shutdown();
}

/// Connects to `worker` with a connection that can send broken transport
/// framing: raw stream bytes (tcp) or unchecked messages (inproc).
fn raw_endpoint(s: &TestServer, worker: u16) -> RawEndpoint {
    match s.transport {
        Transport::Tcp => RawEndpoint::Tcp(
            TcpEndpoint::connect(s.tcp_socket_addr(), worker, TIMEOUT).expect("tcp connect"),
        ),
        Transport::Inproc => RawEndpoint::Inproc(
            InprocEndpoint::connect(s.inproc_name(), worker).expect("inproc connect"),
        ),
        Transport::Shm => RawEndpoint::Shm(Box::new(
            ShmEndpoint::connect(s.shm_name(), worker, TIMEOUT).expect("shm connect"),
        )),
    }
}

/// A connection below the [`Endpoint`] contract, one per transport.
enum RawEndpoint {
    /// Can write any bytes to the stream.
    Tcp(TcpEndpoint),
    /// Can send empty or oversized messages.
    Inproc(InprocEndpoint),
    /// Can publish ring records with any length word.
    Shm(Box<ShmEndpoint>),
}

impl RawEndpoint {
    fn endpoint(&mut self) -> &mut dyn Endpoint {
        match self {
            RawEndpoint::Tcp(e) => e,
            RawEndpoint::Inproc(e) => e,
            RawEndpoint::Shm(e) => &mut **e,
        }
    }

    /// Breaks the transport framing in the `variant`-th way. Returns how
    /// many well-framed (garbage) messages went out before the break: the
    /// server refuses each of them before it hangs up.
    fn break_framing(&mut self, variant: usize) -> u64 {
        match self {
            RawEndpoint::Tcp(e) => {
                let bytes: Vec<u8> = match variant % 4 {
                    0 => vec![0xFF; 64],
                    1 => vec![0; 16],
                    2 => {
                        let mut b = ((MESSAGE_BYTES_MAX + 1) as u32).to_le_bytes().to_vec();
                        b.extend_from_slice(&[1; 100]);
                        b
                    }
                    _ => {
                        // A good message, then a corrupt prefix.
                        let mut b = 5u32.to_le_bytes().to_vec();
                        b.extend_from_slice(b"hello");
                        b.extend_from_slice(&u32::MAX.to_le_bytes());
                        b
                    }
                };
                e.write_raw(&bytes).expect("write raw bytes");
                u64::from(variant % 4 == 3)
            }
            RawEndpoint::Inproc(e) => {
                let msg = if variant % 2 == 1 {
                    vec![0; MESSAGE_BYTES_MAX + 1]
                } else {
                    Vec::new()
                };
                e.send_raw(msg).expect("send raw message");
                0
            }
            RawEndpoint::Shm(e) => {
                let len = if variant % 2 == 1 {
                    (MESSAGE_BYTES_MAX + 1) as u32
                } else {
                    0
                };
                e.publish_bogus_record(len);
                0
            }
        }
    }
}

fn corrupt_framing_closes_only_that_connection(t: Transport) {
    const BROKEN: usize = 4;
    let s = TestServer::default_on(t);
    let mut c = s.client();
    let known = known_keys(&mut c, s.workers);
    let mut bystander = s.endpoint(0);
    for v in 0..BROKEN {
        let w = (v % 2) as u16;
        let mut raw = raw_endpoint(&s, w);
        let _framed_garbage = raw.break_framing(v);
        common::await_closed(raw.endpoint());
        // A connection to the same worker is untouched.
        let good = request(v as u64, 0, |b| {
            b.get(&known[0].key);
        });
        bystander.post(&good).expect("post");
        bystander.flush(TIMEOUT).expect("flush");
        check(
            "bystander",
            0,
            &recv_n(&mut *bystander, 1)[0],
            &Expect::Results(v as u64, vec![(ErrorCode::Ok, known[0].value.clone())]),
        );
    }
    wait_for("every framing close to be counted", TIMEOUT, || {
        stat(&mut c, "conns_closed_framing") == BROKEN as u64
    });
    assert_eq!(
        c.get(&known[1].key).expect("get"),
        Some(known[1].value.clone())
    );
    s.shutdown();
}

fn hostile_crowd_does_not_disturb_a_good_client(t: Transport) {
    const ATTACKERS: usize = 32;
    const ROUNDS: usize = 12;
    const FRAMING_BREAKERS: usize = 8;
    const SEEDED: usize = 300;
    let s = TestServer::default_on(t);
    let mut c = s.client();
    let known = Arc::new(known_keys(&mut c, s.workers));
    let seeded: Vec<(Vec<u8>, Vec<u8>)> = (0..SEEDED)
        .map(|i| {
            (
                format!("seed-{i}").into_bytes(),
                value_of(i as u64, i % 500),
            )
        })
        .collect();
    c.mput(&seeded, None).expect("seed data");
    let own_keys: Vec<Vec<u8>> = (0..ATTACKERS)
        .map(|a| keys_of_worker(&c, (a % 2) as u16, 1, &format!("attacker{a}")).remove(0))
        .collect();

    let start = Arc::new(Barrier::new(ATTACKERS + FRAMING_BREAKERS + 1));
    let done = Arc::new(AtomicBool::new(false));
    let good = {
        let mut c = s.client();
        let (start, done) = (start.clone(), done.clone());
        std::thread::spawn(move || {
            start.wait();
            let mut rounds = 0u64;
            while !done.load(Ordering::Acquire) || rounds < 20 {
                let k = format!("good-{}", rounds % 50).into_bytes();
                let v = value_of(rounds, (rounds % 300) as usize);
                c.put(&k, &v).expect("good put during the attack");
                assert_eq!(c.get(&k).expect("good get during the attack"), Some(v));
                rounds += 1;
            }
            rounds
        })
    };
    let attackers: Vec<_> = (0..ATTACKERS)
        .map(|a| {
            let w = (a % 2) as u16;
            let mut ep = s.endpoint(w);
            let (start, known) = (start.clone(), known.clone());
            let own = own_keys[a].clone();
            std::thread::spawn(move || {
                let mut rng = StdRng::seed_from_u64(a as u64);
                let mut next_id = (a as u64) << 32;
                let cases = catalogue(w, &known[usize::from(w)], &mut next_id, false);
                let mut refused = 0u64;
                start.wait();
                for round in 0..ROUNDS {
                    let case = &cases[(a + round * 7) % cases.len()];
                    let noise = random_message(&mut rng);
                    next_id += 1;
                    let v = value_of(next_id, round * 10);
                    let good = request(next_id, w, |b| {
                        b.put(&own, &v, 0, PutCondition::Always).get(&own);
                    });
                    ep.post(&noise).expect("post");
                    ep.post(&case.msg).expect("post");
                    ep.post(&good).expect("post");
                    ep.flush(TIMEOUT).expect("flush");
                    let r = recv_n(&mut *ep, 3);
                    let noise_expect = Expect::Refused(ErrorCode::Malformed, readable_id(&noise));
                    check("random noise", w, &r[0], &noise_expect);
                    check(&case.name, w, &r[1], &case.expect);
                    let ok = Expect::Results(
                        next_id,
                        vec![(ErrorCode::Ok, Vec::new()), (ErrorCode::Ok, v)],
                    );
                    check("the attacker's own good request", w, &r[2], &ok);
                    refused += 1 + u64::from(matches!(case.expect, Expect::Refused(..)));
                }
                refused
            })
        })
        .collect();
    let breakers: Vec<_> = (0..FRAMING_BREAKERS)
        .map(|b| {
            let mut raw = raw_endpoint(&s, (b % 2) as u16);
            let start = start.clone();
            std::thread::spawn(move || {
                start.wait();
                let framed_garbage = raw.break_framing(b);
                common::await_closed(raw.endpoint());
                framed_garbage
            })
        })
        .collect();

    let mut refused = 0;
    for a in attackers {
        refused += a.join().expect("attacker thread");
    }
    for b in breakers {
        refused += b.join().expect("framing breaker thread");
    }
    done.store(true, Ordering::Release);
    let rounds = good.join().expect("good client thread");

    // The server is up, counted everything, and lost nothing.
    let mut fresh = s.client();
    wait_for("every framing close to be counted", TIMEOUT, || {
        stat(&mut fresh, "conns_closed_framing") == FRAMING_BREAKERS as u64
    });
    let st = stats(&mut fresh);
    assert_eq!(st["frames_refused"], refused);
    assert_eq!(st["conns_closed_timeout"], 0);
    let keys: Vec<&[u8]> = seeded.iter().map(|(k, _)| k.as_slice()).collect();
    let got = fresh.mget(&keys).expect("mget seeded data");
    for ((k, v), g) in seeded.iter().zip(got) {
        assert!(
            g.as_ref() == Some(v),
            "seeded key {:?} lost or corrupted",
            String::from_utf8_lossy(k)
        );
    }
    for k in &known[..] {
        assert_eq!(fresh.get(&k.key).expect("get"), Some(k.value.clone()));
    }
    // What the good client wrote during the attack is there too: the last
    // value of each of its keys.
    for r in rounds.saturating_sub(50)..rounds {
        let k = format!("good-{}", r % 50).into_bytes();
        let v = value_of(r, (r % 300) as usize);
        assert_eq!(
            fresh.get(&k).expect("get"),
            Some(v),
            "good client's round {r}"
        );
    }
    s.shutdown();
}

transport_tests!(
    every_hostile_frame_gets_its_own_error_code,
    pipelined_random_messages_are_each_refused_in_order,
    corrupt_framing_closes_only_that_connection,
    hostile_crowd_does_not_disturb_a_good_client,
);

/// Raw tcp, below the client's transport: handshakes and stream bytes.
mod raw_tcp {
    use super::*;

    fn handshake_bytes(magic: &[u8; 3], version: u8, worker: u16) -> [u8; 8] {
        let mut b = [0u8; 8];
        b[..3].copy_from_slice(magic);
        b[3] = version;
        b[4..6].copy_from_slice(&worker.to_le_bytes());
        b
    }

    fn dial(s: &TestServer) -> TcpStream {
        let stream = TcpStream::connect(s.tcp_socket_addr()).expect("tcp connect");
        stream.set_read_timeout(Some(TIMEOUT)).expect("timeout");
        stream.set_nodelay(true).expect("nodelay");
        stream
    }

    /// Sends a handshake; returns the server's (status, workers).
    fn shake(stream: &mut TcpStream, opening: &[u8]) -> (u16, u16) {
        stream.write_all(opening).expect("write handshake");
        let mut r = [0u8; 8];
        stream.read_exact(&mut r).expect("handshake reply");
        assert_eq!(&r[..4], b"FKV\x01", "handshake reply magic and version");
        (
            u16::from_le_bytes([r[4], r[5]]),
            u16::from_le_bytes([r[6], r[7]]),
        )
    }

    fn connect_raw(s: &TestServer, worker: u16) -> TcpStream {
        let mut stream = dial(s);
        assert_eq!(shake(&mut stream, &handshake_bytes(b"FKV", 1, worker)).0, 0);
        stream
    }

    fn framed(msg: &[u8]) -> Vec<u8> {
        let mut b = (msg.len() as u32).to_le_bytes().to_vec();
        b.extend_from_slice(msg);
        b
    }

    fn read_message(stream: &mut TcpStream) -> Vec<u8> {
        let mut len = [0u8; 4];
        stream.read_exact(&mut len).expect("reply length");
        let mut msg = vec![0u8; u32::from_le_bytes(len) as usize];
        stream.read_exact(&mut msg).expect("reply body");
        msg
    }

    /// Reads until the server closes the stream; panics if it does not
    /// within the read timeout.
    fn assert_closed_by_server(stream: &mut TcpStream) {
        let mut buf = [0u8; 256];
        loop {
            match stream.read(&mut buf) {
                Ok(0) => return,
                Ok(_) => {}
                Err(e)
                    if matches!(
                        e.kind(),
                        ErrorKind::ConnectionReset | ErrorKind::ConnectionAborted
                    ) =>
                {
                    return
                }
                Err(e) => panic!("expected the server to close the connection: {e}"),
            }
        }
    }

    /// Whether the server has left `stream` open (nothing to read, no EOF).
    fn still_open(stream: &mut TcpStream) -> bool {
        stream.set_nonblocking(true).expect("nonblocking");
        let mut buf = [0u8; 1];
        let open = matches!(stream.read(&mut buf), Err(e) if e.kind() == ErrorKind::WouldBlock);
        stream.set_nonblocking(false).expect("blocking");
        open
    }

    #[test]
    fn bad_handshakes_are_refused_with_a_status() {
        let s = TestServer::default_on(Transport::Tcp);
        for (opening, want, what) in [
            (
                handshake_bytes(b"XYZ", 1, 0),
                ErrorCode::UnsupportedVersion,
                "bad magic",
            ),
            (
                handshake_bytes(b"FKV", 2, 0),
                ErrorCode::UnsupportedVersion,
                "version 2",
            ),
            (
                handshake_bytes(b"FKV", 1, 2),
                ErrorCode::NoSuchWorker,
                "worker 2 of 2",
            ),
            (
                handshake_bytes(b"FKV", 1, u16::MAX),
                ErrorCode::NoSuchWorker,
                "worker 65535",
            ),
        ] {
            let mut stream = dial(&s);
            let (status, workers) = shake(&mut stream, &opening);
            assert_eq!(ErrorCode::from_u16(status), Some(want), "{what}");
            assert_eq!(workers, 2, "{what}: the reply tells the worker count");
            assert_closed_by_server(&mut stream);
        }
        let mut c = s.client();
        c.put(b"k", b"v").expect("the server still serves");
        s.shutdown();
    }

    #[test]
    fn framed_garbage_and_split_writes_over_a_raw_stream() {
        let s = TestServer::default_on(Transport::Tcp);
        let mut c = s.client();
        let known = known_keys(&mut c, s.workers);
        let mut stream = connect_raw(&s, 0);
        let mut rng = StdRng::seed_from_u64(7);
        let garbage = random_message(&mut rng);
        let good = request(9, 0, |b| {
            b.get(&known[0].key);
        });
        // Garbage and a good request, the stream cut into 1-byte writes.
        let mut bytes = framed(&garbage);
        bytes.extend_from_slice(&framed(&good));
        for b in &bytes {
            stream.write_all(std::slice::from_ref(b)).expect("write");
        }
        let expect = Expect::Refused(ErrorCode::Malformed, readable_id(&garbage));
        check("framed garbage", 0, &read_message(&mut stream), &expect);
        let ok = Expect::Results(9, vec![(ErrorCode::Ok, known[0].value.clone())]);
        check("split good request", 0, &read_message(&mut stream), &ok);

        // The largest message the framing allows, all garbage.
        let mut huge = vec![0u8; MESSAGE_BYTES_MAX];
        rng.fill(&mut huge[..]);
        huge[0] = 0;
        stream.write_all(&framed(&huge)).expect("write");
        let expect = Expect::Refused(ErrorCode::Malformed, readable_id(&huge));
        check(
            "largest garbage message",
            0,
            &read_message(&mut stream),
            &expect,
        );

        // One past it is corrupt framing: the server hangs up.
        stream
            .write_all(&((MESSAGE_BYTES_MAX + 1) as u32).to_le_bytes())
            .expect("write");
        assert_closed_by_server(&mut stream);
        wait_for("the framing close to be counted", TIMEOUT, || {
            stat(&mut c, "conns_closed_framing") == 1
        });
        assert_eq!(
            c.get(&known[0].key).expect("get"),
            Some(known[0].value.clone())
        );
        s.shutdown();
    }

    #[test]
    fn handshake_and_first_request_in_one_write() {
        let s = TestServer::default_on(Transport::Tcp);
        let mut c = s.client();
        let known = known_keys(&mut c, s.workers);
        let mut stream = dial(&s);
        // Bytes that follow the handshake must reach the worker, even
        // though the acceptor reads the handshake.
        let mut bytes = handshake_bytes(b"FKV", 1, 1).to_vec();
        for id in [1, 2] {
            bytes.extend_from_slice(&framed(&request(id, 1, |b| {
                b.get(&known[1].key);
            })));
        }
        stream.write_all(&bytes).expect("write");
        let mut reply = [0u8; 8];
        stream.read_exact(&mut reply).expect("handshake reply");
        assert_eq!(u16::from_le_bytes([reply[4], reply[5]]), 0, "accepted");
        for id in [1, 2] {
            let ok = Expect::Results(id, vec![(ErrorCode::Ok, known[1].value.clone())]);
            check(
                "request sent with the handshake",
                1,
                &read_message(&mut stream),
                &ok,
            );
        }
        s.shutdown();
    }

    /// Regression: a client that sends its last request and half-closes
    /// (`shutdown(SHUT_WR)`) gets its reply but the server never closes
    /// the connection: the data and the FIN arrive on one epoll edge, the
    /// port's short read marks the socket drained, and the EOF behind the
    /// data is never read (`tcp/port.rs`, `c.readable = n == READ_CHUNK_BYTES`).
    /// The connection stays counted in `conns_open` for good.
    #[test]
    fn half_closed_connection_is_answered_then_closed() {
        const CONNS: usize = 4;
        let s = TestServer::default_on(Transport::Tcp);
        let mut c = s.client();
        let known = known_keys(&mut c, s.workers);
        let mut streams: Vec<TcpStream> = (0..CONNS)
            .map(|i| {
                let mut st = connect_raw(&s, 0);
                let msg = framed(&request(i as u64, 0, |b| {
                    b.get(&known[0].key);
                }));
                st.write_all(&msg).expect("write");
                st.shutdown(std::net::Shutdown::Write).expect("half-close");
                st
            })
            .collect();
        for (i, st) in streams.iter_mut().enumerate() {
            let ok = Expect::Results(i as u64, vec![(ErrorCode::Ok, known[0].value.clone())]);
            check(
                "the last request before a half-close",
                0,
                &read_message(st),
                &ok,
            );
            assert_closed_by_server(st);
        }
        wait_for("half-closed connections to be released", TIMEOUT, || {
            stat(&mut c, "conns_open") == 2
        });
        s.shutdown();
    }

    /// Regression: connections that never send their handshake fill the
    /// acceptor's HANDSHAKES_PENDING_MAX slots, and every new connection is
    /// then closed unanswered until HANDSHAKE_TIMEOUT_MS frees a slot: a few
    /// hundred idle sockets, renewed every 5 s, lock every new client out
    /// (`tcp/acceptor.rs`, `accept_all`).
    #[test]
    fn new_clients_connect_while_many_handshakes_stall() {
        let s = TestServer::default_on(Transport::Tcp);
        let silent: Vec<TcpStream> = (0..HANDSHAKES_PENDING_MAX + 44).map(|_| dial(&s)).collect();
        let c = Client::connect_with_timeout(&s.addr, TIMEOUT);
        assert!(
            c.is_ok(),
            "a new client was refused while {} connections stalled their handshake: {}",
            silent.len(),
            c.err().map(|e| e.to_string()).unwrap_or_default()
        );
        drop(silent);
        s.shutdown();
    }

    #[test]
    fn slow_loris_connections_do_not_stall_good_clients() {
        const EACH: usize = 8;
        let s = TestServer::default_on(Transport::Tcp);
        // A client from before the attack, to steer the stalled requests.
        let mut early = s.client();
        let loris: Vec<Vec<u8>> = (0..2)
            .map(|w| keys_of_worker(&early, w, 1, "loris").remove(0))
            .collect();
        // Half-sent handshakes, half-sent length prefixes, half-sent messages.
        let mut half_shaken: Vec<TcpStream> = (0..4 * EACH)
            .map(|_| {
                let mut st = dial(&s);
                st.write_all(b"FKV").expect("write");
                st
            })
            .collect();
        let mut half_prefixed: Vec<TcpStream> = (0..EACH)
            .map(|i| {
                let mut st = connect_raw(&s, (i % 2) as u16);
                st.write_all(&[60, 0]).expect("write");
                st
            })
            .collect();
        let partial = |id: u64, w: u16| {
            framed(&request(id, w, |b| {
                b.put(&loris[usize::from(w)], b"finally", 0, PutCondition::Always);
            }))
        };
        let mut half_sent: Vec<TcpStream> = (0..EACH)
            .map(|i| {
                let w = (i % 2) as u16;
                let mut st = connect_raw(&s, w);
                st.write_all(&partial(i as u64, w)[..30]).expect("write");
                st
            })
            .collect();

        // A good client connects after them and is served at once.
        let mut c = s.client();
        let expected_open = (2 * EACH + 4) as u64;
        wait_for("every connection to reach its worker", TIMEOUT, || {
            stat(&mut c, "conns_open") == expected_open
        });
        let began = Instant::now();
        for i in 0..200u64 {
            let k = format!("busy-{i}").into_bytes();
            let v = value_of(i, 64);
            c.put(&k, &v).expect("put while slow connections stall");
            assert_eq!(
                c.get(&k).expect("get while slow connections stall"),
                Some(v)
            );
        }
        let took = began.elapsed();
        assert!(
            took < Duration::from_secs(4),
            "400 requests took {took:?} next to stalled connections"
        );

        // The stalled connections were all still open meanwhile.
        let st = stats(&mut c);
        assert_eq!(st["conns_open"], expected_open);
        assert_eq!(st["conns_closed_timeout"], 0);
        for st in half_shaken
            .iter_mut()
            .chain(&mut half_prefixed)
            .chain(&mut half_sent)
        {
            assert!(still_open(st), "a stalled connection was closed early");
        }

        // Finishing a stalled message gets it answered.
        let w = 1u16;
        let rest = &partial(1, w)[30..];
        half_sent[1].write_all(rest).expect("finish the message");
        let ok = Expect::Results(1, vec![(ErrorCode::Ok, Vec::new())]);
        check(
            "the finished message",
            w,
            &read_message(&mut half_sent[1]),
            &ok,
        );
        assert_eq!(
            early.get(&loris[1]).expect("get").as_deref(),
            Some(&b"finally"[..])
        );
        // Finishing a stalled handshake (version 1, worker 0) gets it accepted.
        let (status, _) = shake(&mut half_shaken[0], &[1, 0, 0, 0, 0]);
        assert_eq!(status, 0, "a slow handshake completes");
        s.shutdown();
    }
}
