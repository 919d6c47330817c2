//! The handshake table's tests: every rule with no sockets and no sleeps.

#![allow(clippy::unwrap_used)]

use super::*;
use crate::TransportError;

const TCP: CompactOpening = CompactOpening { magic: *b"FKV" };

fn limits() -> Limits {
    Limits {
        pending_max: 3,
        timeout: Duration::from_secs(5),
        conns_max: 10,
    }
}

/// Feeds `bytes` to `slot` in pieces of `chunk` bytes; returns the
/// last step.
fn feed<F: OpeningFormat>(
    t: &mut Handshakes<u32, F>,
    slot: usize,
    bytes: &[u8],
    chunk: usize,
    open: usize,
) -> Step<u32, F::Opening> {
    let mut at = 0;
    loop {
        let (_, space) = t.read_space(slot).expect("pending");
        let n = space.len().min(chunk).min(bytes.len() - at);
        space[..n].copy_from_slice(&bytes[at..at + n]);
        at += n;
        match t.received(slot, n, open) {
            Step::Read if at < bytes.len() => {}
            step => return step,
        }
    }
}

fn admitted<T: std::fmt::Debug>(a: Admission<T>) -> (usize, Option<T>) {
    match a {
        Admission::Pending { slot, evicted } => (slot, evicted),
        Admission::Refused(io) => panic!("refused {io:?}"),
    }
}

#[test]
fn good_opening_is_accepted_byte_by_byte() {
    let mut t = Handshakes::new(TCP, limits(), 2);
    let (slot, _) = admitted(t.admit(7, Instant::now(), 0));
    assert_eq!(t.stage(slot), Some(Stage::Opening));
    match feed(&mut t, slot, &TCP.encode(1, 0), 1, 0) {
        Step::Done(
            7,
            Verdict::Accept {
                worker: 1,
                opening: 1,
            },
        ) => {}
        s => panic!("{s:?}"),
    }
    assert_eq!(t.pending(), 0);
}

#[test]
fn bad_openings_are_refused_with_their_code() {
    let mut t = Handshakes::new(TCP, limits(), 2);
    let now = Instant::now();
    let cases: [(&[u8], usize, ErrorCode, usize); 4] = [
        (b"HTTP/1.1", 0, ErrorCode::UnsupportedVersion, 0),
        (
            &[b'F', b'K', b'V', 2, 0, 0, 0, 0],
            0,
            ErrorCode::UnsupportedVersion,
            0,
        ),
        (&TCP.encode(2, 0), 0, ErrorCode::NoSuchWorker, 0),
        (&TCP.encode(1, 0), 10, ErrorCode::Unavailable, 1),
    ];
    for (bytes, open, code, worker) in cases {
        let (slot, _) = admitted(t.admit(0, now, 0));
        match feed(&mut t, slot, bytes, 8, open) {
            Step::Done(_, v) => assert_eq!(v, Verdict::Refuse { code, worker }),
            s => panic!("{s:?}"),
        }
    }
}

#[test]
fn the_answer_names_worker_code_and_count() {
    assert!(check_answer(0, 0, 1).is_ok());
    match check_answer(2, ErrorCode::NoSuchWorker.as_u16(), 2) {
        Err(TransportError::Refused(why)) => {
            assert_eq!(why, "worker 2: NO_SUCH_WORKER (server has 2 workers)")
        }
        r => panic!("{r:?}"),
    }
    assert_eq!(TCP.fields(&TCP.encode(3, 4)), Some((3, 4)));
    let shm = CompactOpening { magic: *b"FKS" };
    assert_eq!(shm.fields(&TCP.encode(3, 4)), None);
}

#[test]
fn read_from_stops_at_would_block_and_retries_interrupted() {
    use std::io::{Error, ErrorKind};
    let mut t = Handshakes::new(TCP, limits(), 2);
    let (slot, _) = admitted(t.admit(0, Instant::now(), 0));
    let opening = TCP.encode(1, 0);
    // Three bytes, an interruption, then nothing more for now.
    let mut script: Vec<std::io::Result<&[u8]>> = vec![
        Ok(&opening[..3]),
        Err(Error::from(ErrorKind::Interrupted)),
        Err(Error::from(ErrorKind::WouldBlock)),
    ];
    script.reverse();
    let mut read = |_: &mut u32, buf: &mut [u8]| match script.pop() {
        Some(Ok(b)) => {
            buf[..b.len()].copy_from_slice(b);
            Ok(b.len())
        }
        Some(Err(e)) => Err(e),
        None => Ok(0),
    };
    assert!(matches!(t.read_from(slot, || 0, &mut read), Step::Read));
    let rest = &opening[3..];
    let step = t.read_from(
        slot,
        || 0,
        |_, buf| {
            buf[..rest.len()].copy_from_slice(rest);
            Ok(rest.len())
        },
    );
    assert!(matches!(
        step,
        Step::Done(0, Verdict::Accept { worker: 1, .. })
    ));
    let (slot, _) = admitted(t.admit(5, Instant::now(), 0));
    let step = t.read_from(
        slot,
        || 0,
        |_, _| Err(Error::from(ErrorKind::ConnectionReset)),
    );
    assert!(matches!(step, Step::Drop(5)));
}

#[test]
fn closed_peer_is_dropped() {
    let mut t = Handshakes::new(TCP, limits(), 2);
    let (slot, _) = admitted(t.admit(5, Instant::now(), 0));
    assert!(matches!(feed(&mut t, slot, b"F", 1, 0), Step::Read));
    assert!(matches!(t.received(slot, 0, 0), Step::Drop(5)));
    assert_eq!(t.pending(), 0);
}

#[test]
fn table_is_bounded_and_evicts_the_oldest() {
    let mut t = Handshakes::new(TCP, limits(), 1);
    let t0 = Instant::now();
    for io in 0..3u32 {
        let (_, ev) = admitted(t.admit(io, t0 + Duration::from_millis(u64::from(io)), 0));
        assert_eq!(ev, None);
    }
    let (slot, ev) = admitted(t.admit(3, t0 + Duration::from_millis(9), 0));
    assert_eq!(ev, Some(0), "the longest waiting goes");
    assert_eq!(slot, 0, "its slot is reused");
    assert_eq!(t.pending(), 3);
    assert!(matches!(t.admit(4, t0, 10), Admission::Refused(4)));
}

#[test]
fn deadlines_expire_and_set_the_poll_timeout() {
    let mut t = Handshakes::new(TCP, limits(), 1);
    let t0 = Instant::now();
    assert_eq!(t.expire(t0, |_| panic!("nothing pending")), None);
    admitted(t.admit(1, t0, 0));
    admitted(t.admit(2, t0 + Duration::from_secs(2), 0));
    assert_eq!(
        t.expire(t0 + Duration::from_secs(1), |_| panic!("too early")),
        Some(Duration::from_secs(4))
    );
    let mut closed = Vec::new();
    let next = t.expire(t0 + Duration::from_secs(5), |io| closed.push(io));
    assert_eq!(closed, vec![1]);
    assert_eq!(next, Some(Duration::from_secs(2)));
    t.expire(t0 + Duration::from_secs(60), |io| closed.push(io));
    assert_eq!(closed, vec![1, 2]);
    assert_eq!(t.pending(), 0);
}

/// A variable-length format like fabric's: 4 fixed bytes (worker,
/// name length), then the name.
struct Named;

impl OpeningFormat for Named {
    type Opening = (u16, Vec<u8>);
    const BYTES_MAX: usize = 4 + 8;

    fn wanted(&self, got: &[u8]) -> Option<usize> {
        if got.len() < 4 {
            return Some(4);
        }
        let n = usize::from(u16::from_le_bytes([got[2], got[3]]));
        (n <= 8).then_some(4 + n)
    }

    fn decode(&self, b: &[u8]) -> Option<Self::Opening> {
        Some((u16::from_le_bytes([b[0], b[1]]), b[4..].to_vec()))
    }

    fn worker(h: &Self::Opening) -> u16 {
        h.0
    }

    fn usable(h: &Self::Opening) -> bool {
        !h.1.is_empty()
    }
}

#[test]
fn variable_length_openings_grow_their_buffer_and_stay_bounded() {
    let mut t = Handshakes::new(Named, limits(), 2);
    let now = Instant::now();
    let (slot, _) = admitted(t.admit(1, now, 0));
    match feed(&mut t, slot, &[1, 0, 3, 0, b'a', b'b', b'c'], 2, 0) {
        Step::Done(1, Verdict::Accept { worker: 1, opening }) => {
            assert_eq!(opening.1, b"abc")
        }
        s => panic!("{s:?}"),
    }
    let (slot, _) = admitted(t.admit(2, now, 0));
    match feed(&mut t, slot, &[0, 0, 9, 0], 4, 0) {
        Step::Done(2, v) => assert_eq!(
            v,
            Verdict::Refuse {
                code: ErrorCode::UnsupportedVersion,
                worker: 0
            }
        ),
        s => panic!("{s:?}"),
    }
    let (slot, _) = admitted(t.admit(3, now, 0));
    match feed(&mut t, slot, &[1, 0, 0, 0], 4, 0) {
        Step::Done(3, v) => assert_eq!(
            v,
            Verdict::Refuse {
                code: ErrorCode::Unavailable,
                worker: 1
            }
        ),
        s => panic!("{s:?}"),
    }
}

/// A source past its allowance of failed proofs is refused
/// `AUTH_THROTTLED` unjudged, at its opening (no challenge) and at its
/// proof; a client of another source that holds the secret is
/// challenged and admitted at once.
#[test]
fn failed_proofs_are_throttled_per_source_and_others_get_in() {
    use fabrickv_auth::throttle::{Limits as ThrottleLimits, SharedThrottle};
    let secret = Secret::from_bytes(b"sixteen or more bytes", "test").unwrap();
    let wrong = Secret::from_bytes(b"sixteen or more bytez", "test").unwrap();
    let throttle = SharedThrottle::new(ThrottleLimits {
        source_burst: 2,
        ..ThrottleLimits::default()
    });
    let mut t = Handshakes::new(TCP, limits(), 2)
        .with_secret(Some(secret.clone()))
        .with_throttle(Some(throttle));
    let now = Instant::now();
    let guesser = Source::ip("10.0.0.9".parse().unwrap());
    let client = Source::ip("10.0.0.10".parse().unwrap());
    let try_proof = |t: &mut Handshakes<u32, CompactOpening>, io, src, prover: &Secret| {
        let (slot, _) = admitted(t.admit_from(io, src, now, 0));
        match feed(t, slot, &TCP.encode(1, 0), 8, 0) {
            Step::Challenge(c) => {
                let nonce: [u8; NONCE_BYTES] = c[CHALLENGE_HEAD_BYTES..].try_into().unwrap();
                feed(t, slot, &prover.proof(PROOF_CONTEXT, &nonce), 32, 0)
            }
            step => step,
        }
    };
    let code = |step: Step<u32, u16>| match step {
        Step::Done(_, Verdict::Refuse { code, .. }) => code,
        Step::Done(_, Verdict::Accept { .. }) => ErrorCode::Ok,
        s => panic!("{s:?}"),
    };
    for io in 0..2 {
        assert_eq!(
            code(try_proof(&mut t, io, guesser, &wrong)),
            ErrorCode::AuthFailed
        );
    }
    // Past the burst: refused at the opening, even with the right secret.
    let (slot, _) = admitted(t.admit_from(7, guesser, now, 0));
    assert_eq!(
        code(feed(&mut t, slot, &TCP.encode(1, 0), 8, 0)),
        ErrorCode::AuthThrottled
    );
    assert_eq!(
        code(try_proof(&mut t, 8, guesser, &secret)),
        ErrorCode::AuthThrottled
    );
    // Another source that holds the secret is admitted.
    assert_eq!(code(try_proof(&mut t, 9, client, &secret)), ErrorCode::Ok);
    assert_eq!(t.pending(), 0);
}

#[test]
fn with_a_secret_a_good_opening_is_challenged_and_only_a_proof_admits() {
    let secret = Secret::from_bytes(b"sixteen or more bytes", "test").unwrap();
    let other = Secret::from_bytes(b"sixteen or more bytez", "test").unwrap();
    let mut t = Handshakes::new(TCP, limits(), 2).with_secret(Some(secret.clone()));
    let now = Instant::now();
    let mut nonces = Vec::new();
    for (io, prover, chunk) in [(1u32, &secret, 32), (2, &other, 32), (3, &secret, 5)] {
        let (slot, _) = admitted(t.admit(io, now, 0));
        let challenge = match feed(&mut t, slot, &TCP.encode(1, 0), 8, 0) {
            Step::Challenge(c) => c,
            s => panic!("{s:?}"),
        };
        assert!(Challenge::is_head(&challenge));
        assert_eq!(t.stage(slot), Some(Stage::Proof));
        let nonce: [u8; NONCE_BYTES] = challenge[CHALLENGE_HEAD_BYTES..].try_into().unwrap();
        nonces.push(nonce);
        let proof = prover.proof(PROOF_CONTEXT, &nonce);
        match (io, feed(&mut t, slot, &proof, chunk, 0)) {
            (1 | 3, Step::Done(got, Verdict::Accept { worker: 1, .. })) => assert_eq!(got, io),
            (2, Step::Done(2, v)) => assert_eq!(
                v,
                Verdict::Refuse {
                    code: ErrorCode::AuthFailed,
                    worker: 1
                }
            ),
            (_, s) => panic!("{io}: {s:?}"),
        }
    }
    nonces.dedup();
    assert_eq!(nonces.len(), 3, "every challenge has its own nonce");
    // An opening that would be refused is refused at once, unchallenged.
    let (slot, _) = admitted(t.admit(4, now, 0));
    assert!(matches!(
        feed(&mut t, slot, &TCP.encode(9, 0), 8, 0),
        Step::Done(
            4,
            Verdict::Refuse {
                code: ErrorCode::NoSuchWorker,
                ..
            }
        )
    ));
    assert_eq!(t.pending(), 0);
}

#[test]
fn a_client_answers_a_challenge_only_with_a_secret() {
    let secret = Secret::from_bytes(b"sixteen or more bytes", "test").unwrap();
    let c = Challenge {
        nonce: [7; NONCE_BYTES],
    }
    .encode();
    // Not a challenge: the transport's answer, left to its reader.
    let mut io = std::io::Cursor::new(Vec::new());
    assert!(!answer_challenge(&TCP.encode(0, 1), &mut io, Some(&secret)).unwrap());
    let mut io = std::io::Cursor::new(c[CHALLENGE_HEAD_BYTES..].to_vec());
    match answer_challenge(&c[..CHALLENGE_HEAD_BYTES], &mut io, None) {
        Err(TransportError::Denied(ErrorCode::AuthRequired, why)) => {
            assert!(why.contains("FABRICKV_AUTH_TOKEN"), "{why}")
        }
        r => panic!("{r:?}"),
    }
    let mut io = std::io::Cursor::new(c[CHALLENGE_HEAD_BYTES..].to_vec());
    assert!(answer_challenge(&c[..CHALLENGE_HEAD_BYTES], &mut io, Some(&secret)).unwrap());
    let written = &io.get_ref()[NONCE_BYTES..];
    assert!(secret.verify_proof(PROOF_CONTEXT, &[7; NONCE_BYTES], written));
}
