//! The server side of every transport's connection handshake, sans-I/O,
//! and the client's reading of the answer.
//!
//! Each transport (tcp, shm, fabric) opens a connection with a hello from
//! the client that names the worker it wants, and an answer from the
//! server with a status (an [`ErrorCode`]) and the worker count. The
//! formats differ ([`HelloFormat`]: the 8-byte [`CompactHello`] of tcp and
//! shm, the variable-length hello of fabric), the rules do not:
//! - at most [`Limits::pending_max`] handshakes wait at once; a new one
//!   evicts the one that has waited longest, so sockets that connect and
//!   stay silent cannot lock out a client that sends its hello at once;
//! - each must finish by its deadline ([`Limits::timeout`]);
//! - a connection is refused at once when [`Limits::conns_max`] are open;
//! - a hello is judged in one order: not a hello of this format or
//!   version (`UNSUPPORTED_VERSION`), a worker the server lacks
//!   (`NO_SUCH_WORKER`), no room or a hello the format finds unusable
//!   (`UNAVAILABLE`), else accepted.
//!
//! [`Handshakes`] holds those rules in the quinn-proto style: the acceptor
//! does the I/O (accept, read, write, hand-off) and feeds the table what
//! it read and the time; the table answers with a [`Step`]. It stores
//! each pending socket as an opaque `T` so that one table is the only
//! record of what is pending, but never reads or writes it.
//!
//! Each pending handshake is in a [`Stage`]. A server without a secret
//! judges the hello ([`Stage::Hello`]) and is done. A server with one
//! (`fabrickv_auth::Secret`) goes on, for every transport alike, to
//! [`Stage::Proof`]: after a hello it would accept, it sends a
//! [`Challenge`] (a fresh random nonce), and the client must answer with
//! HMAC-SHA256(secret, nonce) before the transport's own answer is
//! written. The secret never crosses the wire, a recorded proof is worth
//! nothing for the next nonce, and a client that fails is refused with
//! `AUTH_FAILED` before any request of it is read. The table writes the
//! challenge itself ([`Handshakes::readable`]), so acceptors are the same
//! with and without a secret.
//!
//! Failed proofs are counted per source address and server-wide by the
//! server's one [`SharedThrottle`] (shared with RESP and gRPC): a source
//! past its allowance is refused `AUTH_THROTTLED`, its proof unjudged,
//! both when its hello arrives (no challenge is made) and when its proof
//! does (others from the same source may have failed meanwhile). A source
//! that never failed is never refused, so a client holding the secret
//! costs one uncontended lock per connect, on the connect path only.
//!
//! ```text
//! client -> server:  hello (the transport's)
//! server -> client:  "FKC" version(u8=1) status(u16=AUTH_REQUIRED) reserved(u16) nonce(32)
//! client -> server:  proof(32)
//! server -> client:  answer (the transport's), status OK or AUTH_FAILED
//! ```

use std::time::{Duration, Instant};

use fabrickv_auth::throttle::{SharedThrottle, Source};
use fabrickv_auth::{Secret, NONCE_BYTES, PROOF_BYTES};
use fabrickv_types::ErrorCode;

use crate::{Result, TransportError};

/// What a handshake proof is an HMAC of, besides the nonce: it names the
/// use, so that a proof made here is worth nothing anywhere else the
/// secret is used.
pub const PROOF_CONTEXT: &[u8] = b"fabrickv handshake v1";

/// First bytes of a [`Challenge`]: told apart from every transport's
/// answer ("FKV", "FKS", "FKVF") by the third byte.
const CHALLENGE_MAGIC: [u8; 3] = *b"FKC";

/// Version of the challenge message.
const CHALLENGE_VERSION: u8 = 1;

/// Bytes of the challenge before its nonce: as many as a compact answer,
/// so that a client reading one of those first can tell which came.
pub const CHALLENGE_HEAD_BYTES: usize = 8;

/// Bytes of a whole [`Challenge`].
pub const CHALLENGE_BYTES: usize = CHALLENGE_HEAD_BYTES + NONCE_BYTES;

/// The server's challenge to prove the cluster secret.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Challenge {
    /// The random nonce the proof must cover.
    pub nonce: [u8; NONCE_BYTES],
}

impl Challenge {
    /// The message on the wire.
    pub fn encode(&self) -> [u8; CHALLENGE_BYTES] {
        let mut b = [0u8; CHALLENGE_BYTES];
        b[..3].copy_from_slice(&CHALLENGE_MAGIC);
        b[3] = CHALLENGE_VERSION;
        b[4..6].copy_from_slice(&ErrorCode::AuthRequired.as_u16().to_le_bytes());
        b[CHALLENGE_HEAD_BYTES..].copy_from_slice(&self.nonce);
        b
    }

    /// Whether the first [`CHALLENGE_HEAD_BYTES`] a client read start a
    /// challenge (rather than the transport's answer).
    pub fn is_head(head: &[u8]) -> bool {
        head.len() >= CHALLENGE_HEAD_BYTES
            && head[..3] == CHALLENGE_MAGIC
            && head[3] == CHALLENGE_VERSION
    }
}

/// The client's side of the challenge: if `head` (the first
/// [`CHALLENGE_HEAD_BYTES`] the server sent) starts a challenge, reads
/// its nonce from `stream` and answers with the proof of `secret`;
/// returns whether it did, in which case the transport's answer is still
/// to be read. A challenge to a client without a secret is refused here
/// with `AUTH_REQUIRED` and a message saying where a secret comes from.
pub fn answer_challenge(
    head: &[u8],
    stream: &mut (impl std::io::Read + std::io::Write),
    secret: Option<&Secret>,
) -> Result<bool> {
    if !Challenge::is_head(head) {
        return Ok(false);
    }
    let Some(secret) = secret else {
        return Err(TransportError::Denied(
            ErrorCode::AuthRequired,
            format!(
                "the server requires the cluster secret: pass --auth-token-file FILE or set {}",
                fabrickv_auth::ENV_TOKEN
            ),
        ));
    };
    let mut nonce = [0u8; NONCE_BYTES];
    stream.read_exact(&mut nonce)?;
    stream.write_all(&secret.proof(PROOF_CONTEXT, &nonce))?;
    Ok(true)
}

/// How one transport's hello is laid out on the wire.
pub trait HelloFormat {
    /// The parsed hello.
    type Hello: Send;

    /// Longest hello, in bytes: bounds each pending handshake's buffer.
    const BYTES_MAX: usize;

    /// Bytes the whole hello takes, judged from the `got` bytes read so
    /// far (never fewer than its fixed part): `None` if what is there
    /// cannot start a hello of this format.
    fn wanted(&self, got: &[u8]) -> Option<usize>;

    /// Parses a whole hello; `None` on a format or version mismatch.
    fn decode(&self, bytes: &[u8]) -> Option<Self::Hello>;

    /// The worker the hello asks for.
    fn worker(hello: &Self::Hello) -> u16;

    /// False if the hello asks for something this server cannot give
    /// (fabric: a receive window too small); it is then refused as
    /// `UNAVAILABLE`.
    fn usable(_hello: &Self::Hello) -> bool {
        true
    }
}

/// Bytes of a [`CompactHello`] message, either way.
pub const COMPACT_HELLO_BYTES: usize = 8;

/// Handshake version that [`CompactHello`] speaks.
const COMPACT_HELLO_VERSION: u8 = 1;

/// The 8-byte handshake of the tcp and shm transports, which differ only
/// in their magic:
///
/// ```text
/// client -> server:  MAGIC(3) version(u8=1) worker(u16) reserved(u16=0)
/// server -> client:  MAGIC(3) version(u8=1) status(u16) workers(u16)
/// ```
#[derive(Debug, Clone, Copy)]
pub struct CompactHello {
    /// First bytes of each message ("FKV" for tcp, "FKS" for shm), so a
    /// client that reaches the wrong kind of server is told at once.
    pub magic: [u8; 3],
}

impl CompactHello {
    /// Encodes a message: (worker, 0) from a client, (status, workers)
    /// from a server.
    pub fn encode(&self, first: u16, second: u16) -> [u8; COMPACT_HELLO_BYTES] {
        let mut b = [0u8; COMPACT_HELLO_BYTES];
        b[..3].copy_from_slice(&self.magic);
        b[3] = COMPACT_HELLO_VERSION;
        b[4..6].copy_from_slice(&first.to_le_bytes());
        b[6..8].copy_from_slice(&second.to_le_bytes());
        b
    }

    /// Parses a message into its two 16-bit fields; `None` on another
    /// magic or version.
    pub fn fields(&self, b: &[u8]) -> Option<(u16, u16)> {
        if b.len() != COMPACT_HELLO_BYTES || b[..3] != self.magic || b[3] != COMPACT_HELLO_VERSION {
            return None;
        }
        Some((
            u16::from_le_bytes([b[4], b[5]]),
            u16::from_le_bytes([b[6], b[7]]),
        ))
    }
}

impl HelloFormat for CompactHello {
    /// The worker asked for.
    type Hello = u16;

    const BYTES_MAX: usize = COMPACT_HELLO_BYTES;

    fn wanted(&self, _got: &[u8]) -> Option<usize> {
        Some(COMPACT_HELLO_BYTES)
    }

    fn decode(&self, bytes: &[u8]) -> Option<u16> {
        self.fields(bytes).map(|(worker, _)| worker)
    }

    fn worker(hello: &u16) -> u16 {
        *hello
    }
}

/// Checks a server's answer on the client: `Ok` if `status` accepts,
/// else the refusal every transport words alike (the worker asked for,
/// the stable code's name and the worker count), which tests and
/// operators match on.
pub fn check_answer(worker: u16, status: u16, workers: u16) -> Result<()> {
    if status == ErrorCode::Ok.as_u16() {
        return Ok(());
    }
    match ErrorCode::from_u16(status) {
        Some(code @ ErrorCode::AuthFailed) => {
            return Err(TransportError::Denied(
                code,
                "the server refused this client's proof of the cluster secret: \
                 the two hold different secrets"
                    .into(),
            ))
        }
        Some(code @ ErrorCode::AuthThrottled) => {
            return Err(TransportError::Denied(
                code,
                "the server refuses authentication from this address for now: too many \
                 failed proofs came from it; retry later"
                    .into(),
            ))
        }
        Some(code @ ErrorCode::PeerNotAllowed) => {
            return Err(TransportError::Denied(
                code,
                "the server does not admit this user to its shared memory".into(),
            ))
        }
        _ => {}
    }
    let name = ErrorCode::from_u16(status).map_or("unknown", |c| c.name());
    Err(refusal(worker, name, usize::from(workers)))
}

/// The refusal of a connection to `worker`, named by its code's `name`,
/// by a server of `workers` workers: one wording for every transport.
pub fn refusal(worker: u16, name: &str, workers: usize) -> TransportError {
    TransportError::Refused(format!(
        "worker {worker}: {name} (server has {workers} workers)"
    ))
}

/// The bounds a [`Handshakes`] table enforces.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Most handshakes pending at once.
    pub pending_max: usize,
    /// Longest a handshake may take from accept to its last byte.
    pub timeout: Duration,
    /// Most connections open at once over all workers: at this count new
    /// sockets are closed at once, and a hello is refused `UNAVAILABLE`.
    pub conns_max: usize,
}

impl Limits {
    /// The workspace-wide limits with `conns_max` connections (the shm
    /// transport accepts fewer than tcp, for its shared memory).
    pub fn with_conns_max(conns_max: usize) -> Limits {
        use fabrickv_types::limits::{HANDSHAKES_PENDING_MAX, HANDSHAKE_TIMEOUT_MS};
        Limits {
            pending_max: HANDSHAKES_PENDING_MAX,
            timeout: Duration::from_millis(HANDSHAKE_TIMEOUT_MS),
            conns_max,
        }
    }
}

/// Where a pending handshake is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    /// Reading the client's hello.
    Hello,
    /// The hello was good and a challenge went out: reading the proof.
    Proof,
}

/// One handshake waiting for bytes.
struct Pending<T, H> {
    /// The acceptor's socket, held here so the table is the one record of
    /// what is pending.
    io: T,
    /// What has arrived; its length is the bytes wanted so far.
    buf: Vec<u8>,
    /// Bytes of `buf` filled.
    got: usize,
    /// When the handshake is dropped if it has not finished.
    deadline: Instant,
    /// What the table waits for.
    stage: Stage,
    /// In [`Stage::Proof`]: the worker and hello a good proof earns, and
    /// the nonce it must cover.
    proving: Option<(usize, H, [u8; NONCE_BYTES])>,
    /// Where it comes from, as the failure throttle counts it.
    source: Source,
    /// When it was admitted: the time the throttle is asked at (the table
    /// reads no clock; a handshake lasts at most [`Limits::timeout`]).
    admitted: Instant,
}

/// What [`Handshakes::admit`] did with a new socket.
#[derive(Debug)]
pub enum Admission<T> {
    /// Too many connections are open: close the socket at once.
    Refused(T),
    /// Pending in `slot`; `evicted` is the handshake dropped to make
    /// room, to deregister and close.
    Pending {
        /// The slot to use as the socket's readiness token.
        slot: usize,
        /// The longest-waiting handshake, dropped for this one.
        evicted: Option<T>,
    },
}

/// The server's decision on a hello.
#[derive(Debug, PartialEq, Eq)]
pub enum Verdict<H> {
    /// Hand the connection to `worker`.
    Accept {
        /// The worker asked for (checked to exist).
        worker: usize,
        /// The whole hello, for what else it carries.
        hello: H,
    },
    /// Answer `code` and close.
    Refuse {
        /// Why, as the stable code sent back.
        code: ErrorCode,
        /// The worker the hello asked for if it exists, else 0 (fabric
        /// names that worker's endpoint in its answer).
        worker: usize,
    },
}

impl<H> Verdict<H> {
    /// The status to answer and the worker to hand the connection to (0
    /// on a refusal, which hands it to none), as the acceptors that
    /// answer with a [`CompactHello`] (tcp, shm) send them.
    pub fn answer(&self) -> (ErrorCode, usize) {
        match *self {
            Verdict::Accept { worker, .. } => (ErrorCode::Ok, worker),
            Verdict::Refuse { code, .. } => (code, 0),
        }
    }
}

/// What the acceptor does after feeding bytes to [`Handshakes::received`].
#[derive(Debug)]
pub enum Step<T, H> {
    /// Keep reading this socket.
    Read,
    /// The peer closed or the socket failed: deregister and close it.
    Drop(T),
    /// The handshake is over (the slot is free): answer as `verdict`
    /// says, then hand over or close.
    Done(T, Verdict<H>),
    /// Write this challenge to the socket, then keep reading (for the
    /// proof).
    Challenge([u8; CHALLENGE_BYTES]),
}

/// The table of pending handshakes of one acceptor; see the module docs.
pub struct Handshakes<T, F: HelloFormat> {
    format: F,
    limits: Limits,
    /// Workers the server has; a hello naming another is refused.
    workers: usize,
    /// Pending handshakes by slot (`None`: free); never longer than
    /// `limits.pending_max`.
    slots: Vec<Option<Pending<T, F::Hello>>>,
    /// The cluster secret each client must prove; `None`: no challenge.
    secret: Option<Secret>,
    /// The server's count of failed authentications (shared by all its
    /// front ends); `None`: failures are not throttled.
    throttle: Option<SharedThrottle>,
}

impl<T, F: HelloFormat> Handshakes<T, F> {
    /// An empty table for a server of `workers` workers.
    pub fn new(format: F, limits: Limits, workers: usize) -> Self {
        assert!(limits.pending_max > 0, "a table must admit a handshake");
        Handshakes {
            format,
            limits,
            workers,
            slots: Vec::new(),
            secret: None,
            throttle: None,
        }
    }

    /// Counts failed proofs in `throttle` and refuses sources past their
    /// allowance (`AUTH_THROTTLED`); see the module docs.
    pub fn with_throttle(mut self, throttle: Option<SharedThrottle>) -> Self {
        self.throttle = throttle;
        self
    }

    /// Whether the throttle refuses `p`'s source now.
    fn throttled(&self, source: Source, at: Instant) -> bool {
        self.throttle
            .as_ref()
            .is_some_and(|t| t.check_at(source, at).is_err())
    }

    /// Asks every client to prove `secret` (none: no challenge).
    pub fn with_secret(mut self, secret: Option<Secret>) -> Self {
        self.secret = secret;
        self
    }

    /// The hello format, for encoding answers.
    pub fn format(&self) -> &F {
        &self.format
    }

    /// Handshakes pending now.
    pub fn pending(&self) -> usize {
        self.slots.iter().filter(|p| p.is_some()).count()
    }

    /// Takes a freshly accepted socket when `open` connections are open.
    pub fn admit(&mut self, io: T, now: Instant, open: usize) -> Admission<T> {
        self.admit_from(io, Source::Unknown, now, open)
    }

    /// [`Handshakes::admit`] of a socket from `source`.
    pub fn admit_from(&mut self, io: T, source: Source, now: Instant, open: usize) -> Admission<T> {
        if open >= self.limits.conns_max {
            return Admission::Refused(io);
        }
        let mut evicted = None;
        if self.pending() >= self.limits.pending_max {
            let oldest = (0..self.slots.len())
                .filter_map(|i| self.slots[i].as_ref().map(|p| (p.deadline, i)))
                .min()
                .map(|(_, i)| i);
            evicted = oldest.and_then(|i| self.remove(i));
        }
        let slot = match self.slots.iter().position(|p| p.is_none()) {
            Some(s) => s,
            None => {
                self.slots.push(None);
                self.slots.len() - 1
            }
        };
        let want = self
            .format
            .wanted(&[])
            .unwrap_or(F::BYTES_MAX)
            .min(F::BYTES_MAX);
        self.slots[slot] = Some(Pending {
            io,
            buf: vec![0; want],
            got: 0,
            deadline: now + self.limits.timeout,
            stage: Stage::Hello,
            proving: None,
            source,
            admitted: now,
        });
        Admission::Pending { slot, evicted }
    }

    /// [`Handshakes::admit`] as the acceptors use it: a socket refused
    /// because `open` connections are open is closed at once, with a
    /// warning that counts them as `what` ("connections", "shm
    /// connections"); `None` then. Otherwise the handshake evicted for it
    /// (if any) goes to `unregister`, to take it off the acceptor's poller
    /// (it closes when `unregister` returns), and the new socket's slot
    /// and the socket itself come back, to register under that slot.
    pub fn admit_or_close(
        &mut self,
        io: T,
        source: Source,
        now: Instant,
        open: usize,
        what: &str,
        unregister: impl FnOnce(&mut T),
    ) -> Option<(usize, &mut T)> {
        match self.admit_from(io, source, now, open) {
            Admission::Refused(_) => {
                tracing::warn!(
                    "refusing a connection: {} {what} open",
                    self.limits.conns_max
                );
                None
            }
            Admission::Pending { slot, evicted } => {
                if let Some(mut old) = evicted {
                    tracing::debug!("dropping the oldest pending handshake to admit a new one");
                    unregister(&mut old);
                }
                Some((slot, self.io_mut(slot)?))
            }
        }
    }

    /// The socket pending in `slot`, to register or read.
    pub fn io_mut(&mut self, slot: usize) -> Option<&mut T> {
        self.slots.get_mut(slot)?.as_mut().map(|p| &mut p.io)
    }

    /// The stage of the handshake in `slot`.
    pub fn stage(&self, slot: usize) -> Option<Stage> {
        self.slots.get(slot)?.as_ref().map(|p| p.stage)
    }

    /// The socket of `slot` and the buffer space its next read fills
    /// (never empty while the slot is pending).
    pub fn read_space(&mut self, slot: usize) -> Option<(&mut T, &mut [u8])> {
        let p = self.slots.get_mut(slot)?.as_mut()?;
        Some((&mut p.io, &mut p.buf[p.got..]))
    }

    /// Frees `slot`; returns its socket to close.
    pub fn remove(&mut self, slot: usize) -> Option<T> {
        self.slots.get_mut(slot)?.take().map(|p| p.io)
    }

    /// Accounts `n` bytes read into [`Handshakes::read_space`] (0: the
    /// peer closed) with `open` connections open, and says what next.
    pub fn received(&mut self, slot: usize, n: usize, open: usize) -> Step<T, F::Hello> {
        let Some(p) = self.slots.get_mut(slot).and_then(|p| p.as_mut()) else {
            return Step::Read;
        };
        if n == 0 {
            return self.remove(slot).map_or(Step::Read, Step::Drop);
        }
        p.got = (p.got + n).min(p.buf.len());
        if p.stage == Stage::Proof {
            return if p.got == p.buf.len() {
                self.verify(slot, open)
            } else {
                Step::Read
            };
        }
        while p.got == p.buf.len() {
            match self.format.wanted(&p.buf) {
                Some(want) if want > p.got && want <= F::BYTES_MAX => p.buf.resize(want, 0),
                Some(want) if want == p.got => return self.decide(slot, open),
                _ => {
                    let refuse = Verdict::Refuse {
                        code: ErrorCode::UnsupportedVersion,
                        worker: 0,
                    };
                    return self
                        .remove(slot)
                        .map_or(Step::Read, |io| Step::Done(io, refuse));
                }
            }
        }
        Step::Read
    }

    /// Reads `slot`'s socket with `read` (a non-blocking `read(2)` into
    /// the space given) until it would block or the handshake moves on,
    /// feeding each read to [`Handshakes::received`] with the count
    /// `open` gives then. A failed read counts as the peer closing. This
    /// is the loop every acceptor ran; the reading itself stays theirs.
    pub fn read_from(
        &mut self,
        slot: usize,
        open: impl Fn() -> usize,
        mut read: impl FnMut(&mut T, &mut [u8]) -> std::io::Result<usize>,
    ) -> Step<T, F::Hello> {
        loop {
            let Some((io, space)) = self.read_space(slot) else {
                return Step::Read;
            };
            let n = match read(io, space) {
                Ok(n) => n,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return Step::Read,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(_) => 0,
            };
            match self.received(slot, n, open()) {
                Step::Read => {}
                step => return step,
            }
        }
    }

    /// Judges a proof: `AUTH_THROTTLED` unjudged if its source is past
    /// its allowance now, else the held verdict if it answers the nonce
    /// (and there is still room), else `AUTH_FAILED`, counted.
    fn verify(&mut self, slot: usize, open: usize) -> Step<T, F::Hello> {
        let Some(p) = self.slots.get_mut(slot).and_then(|p| p.take()) else {
            return Step::Read;
        };
        let (Some((worker, hello, nonce)), Some(secret)) = (p.proving, self.secret.as_ref()) else {
            return Step::Drop(p.io);
        };
        let verdict = if self.throttled(p.source, p.admitted) {
            Verdict::Refuse {
                code: ErrorCode::AuthThrottled,
                worker,
            }
        } else if !secret.verify_proof(PROOF_CONTEXT, &nonce, &p.buf) {
            tracing::debug!("refusing a connection whose proof of the secret is wrong");
            if let Some(t) = &self.throttle {
                t.failed_at(p.source, p.admitted);
            }
            Verdict::Refuse {
                code: ErrorCode::AuthFailed,
                worker,
            }
        } else if open >= self.limits.conns_max {
            Verdict::Refuse {
                code: ErrorCode::Unavailable,
                worker,
            }
        } else {
            Verdict::Accept { worker, hello }
        };
        Step::Done(p.io, verdict)
    }

    /// Judges the whole hello in `slot`: answered (and the slot freed),
    /// or, with a secret, challenged.
    fn decide(&mut self, slot: usize, open: usize) -> Step<T, F::Hello> {
        let Some(mut p) = self.slots.get_mut(slot).and_then(|p| p.take()) else {
            return Step::Read;
        };
        let verdict = match self.format.decode(&p.buf) {
            None => Verdict::Refuse {
                code: ErrorCode::UnsupportedVersion,
                worker: 0,
            },
            Some(h) => {
                let worker = usize::from(F::worker(&h));
                if worker >= self.workers {
                    Verdict::Refuse {
                        code: ErrorCode::NoSuchWorker,
                        worker: 0,
                    }
                } else if open >= self.limits.conns_max || !F::usable(&h) {
                    Verdict::Refuse {
                        code: ErrorCode::Unavailable,
                        worker,
                    }
                } else if self.secret.is_some() && self.throttled(p.source, p.admitted) {
                    Verdict::Refuse {
                        code: ErrorCode::AuthThrottled,
                        worker,
                    }
                } else if self.secret.is_some() {
                    // A hello this server would accept: now the proof.
                    let challenge = Challenge {
                        nonce: fabrickv_auth::nonce(),
                    };
                    p.stage = Stage::Proof;
                    p.buf = vec![0; PROOF_BYTES];
                    p.got = 0;
                    p.proving = Some((worker, h, challenge.nonce));
                    self.slots[slot] = Some(p);
                    return Step::Challenge(challenge.encode());
                } else {
                    Verdict::Accept { worker, hello: h }
                }
            }
        };
        Step::Done(p.io, verdict)
    }

    /// Drops every handshake whose deadline has passed at `now`, handing
    /// each socket to `close`; returns how long until the next deadline
    /// (`None`: nothing pending), for the acceptor's poll timeout.
    pub fn expire(&mut self, now: Instant, mut close: impl FnMut(T)) -> Option<Duration> {
        let mut next: Option<Duration> = None;
        for slot in 0..self.slots.len() {
            let Some(deadline) = self.slots[slot].as_ref().map(|p| p.deadline) else {
                continue;
            };
            if deadline <= now {
                tracing::debug!("closing a connection that did not finish its handshake in time");
                if let Some(io) = self.remove(slot) {
                    close(io);
                }
            } else {
                let left = deadline - now;
                next = Some(next.map_or(left, |n| n.min(left)));
            }
        }
        next
    }
}

impl<T: std::io::Read + std::io::Write, F: HelloFormat> Handshakes<T, F> {
    /// What a socket acceptor (tcp, shm) does when `slot`'s socket is
    /// readable: reads it ([`Handshakes::read_from`] with `Read::read`),
    /// hands a socket that is done with (closed by the peer, failed, or
    /// judged) to `unregister` to take it off the acceptor's poller, and
    /// returns a judged one with its verdict, to answer. A dropped socket
    /// closes when `unregister` returns. A challenge is written here and
    /// reading goes on: a fresh socket's send buffer always has room for
    /// its [`CHALLENGE_BYTES`], so a write that does not take it all means
    /// a broken peer, which is dropped.
    pub fn readable(
        &mut self,
        slot: usize,
        open: impl Fn() -> usize,
        mut unregister: impl FnMut(&mut T),
    ) -> Option<(T, Verdict<F::Hello>)> {
        loop {
            match self.read_from(slot, &open, |io, buf| io.read(buf)) {
                Step::Read => return None,
                Step::Drop(mut io) => {
                    unregister(&mut io);
                    return None;
                }
                Step::Done(mut io, verdict) => {
                    unregister(&mut io);
                    return Some((io, verdict));
                }
                Step::Challenge(bytes) => {
                    let sent = self
                        .io_mut(slot)
                        .map(|io| io.write(&bytes).is_ok_and(|n| n == bytes.len()));
                    if sent == Some(false) {
                        if let Some(mut io) = self.remove(slot) {
                            unregister(&mut io);
                        }
                        return None;
                    }
                }
            }
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    const TCP: CompactHello = CompactHello { magic: *b"FKV" };

    fn limits() -> Limits {
        Limits {
            pending_max: 3,
            timeout: Duration::from_secs(5),
            conns_max: 10,
        }
    }

    /// Feeds `bytes` to `slot` in pieces of `chunk` bytes; returns the
    /// last step.
    fn feed<F: HelloFormat>(
        t: &mut Handshakes<u32, F>,
        slot: usize,
        bytes: &[u8],
        chunk: usize,
        open: usize,
    ) -> Step<u32, F::Hello> {
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
    fn good_hello_is_accepted_byte_by_byte() {
        let mut t = Handshakes::new(TCP, limits(), 2);
        let (slot, _) = admitted(t.admit(7, Instant::now(), 0));
        assert_eq!(t.stage(slot), Some(Stage::Hello));
        match feed(&mut t, slot, &TCP.encode(1, 0), 1, 0) {
            Step::Done(
                7,
                Verdict::Accept {
                    worker: 1,
                    hello: 1,
                },
            ) => {}
            s => panic!("{s:?}"),
        }
        assert_eq!(t.pending(), 0);
    }

    #[test]
    fn bad_hellos_are_refused_with_their_code() {
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
        let shm = CompactHello { magic: *b"FKS" };
        assert_eq!(shm.fields(&TCP.encode(3, 4)), None);
    }

    #[test]
    fn read_from_stops_at_would_block_and_retries_interrupted() {
        use std::io::{Error, ErrorKind};
        let mut t = Handshakes::new(TCP, limits(), 2);
        let (slot, _) = admitted(t.admit(0, Instant::now(), 0));
        let hello = TCP.encode(1, 0);
        // Three bytes, an interruption, then nothing more for now.
        let mut script: Vec<std::io::Result<&[u8]>> = vec![
            Ok(&hello[..3]),
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
        let rest = &hello[3..];
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

    impl HelloFormat for Named {
        type Hello = (u16, Vec<u8>);
        const BYTES_MAX: usize = 4 + 8;

        fn wanted(&self, got: &[u8]) -> Option<usize> {
            if got.len() < 4 {
                return Some(4);
            }
            let n = usize::from(u16::from_le_bytes([got[2], got[3]]));
            (n <= 8).then_some(4 + n)
        }

        fn decode(&self, b: &[u8]) -> Option<Self::Hello> {
            Some((u16::from_le_bytes([b[0], b[1]]), b[4..].to_vec()))
        }

        fn worker(h: &Self::Hello) -> u16 {
            h.0
        }

        fn usable(h: &Self::Hello) -> bool {
            !h.1.is_empty()
        }
    }

    #[test]
    fn variable_length_hellos_grow_their_buffer_and_stay_bounded() {
        let mut t = Handshakes::new(Named, limits(), 2);
        let now = Instant::now();
        let (slot, _) = admitted(t.admit(1, now, 0));
        match feed(&mut t, slot, &[1, 0, 3, 0, b'a', b'b', b'c'], 2, 0) {
            Step::Done(1, Verdict::Accept { worker: 1, hello }) => {
                assert_eq!(hello.1, b"abc")
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
    /// `AUTH_THROTTLED` unjudged, at its hello (no challenge) and at its
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
        let try_proof = |t: &mut Handshakes<u32, CompactHello>, io, src, prover: &Secret| {
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
        // Past the burst: refused at the hello, even with the right secret.
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
    fn with_a_secret_a_good_hello_is_challenged_and_only_a_proof_admits() {
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
        // A hello that would be refused is refused at once, unchallenged.
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
}
