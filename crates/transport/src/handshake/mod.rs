//! The server side of every transport's connection handshake, sans-I/O,
//! and the client's reading of the answer.
//!
//! Each transport (tcp, shm, fabric) opens a connection with an opening from
//! the client that names the worker it wants, and an answer from the
//! server with a status (an [`ErrorCode`]) and the worker count. The
//! formats differ ([`OpeningFormat`]: the 8-byte [`CompactOpening`] of tcp and
//! shm, the variable-length opening of fabric), the rules do not:
//! - at most [`Limits::pending_max`] handshakes wait at once; a new one
//!   evicts the one that has waited longest, so sockets that connect and
//!   stay silent cannot lock out a client that sends its opening at once;
//! - each must finish by its deadline ([`Limits::timeout`]);
//! - a connection is refused at once when [`Limits::conns_max`] are open;
//! - an opening is judged in one order: not an opening of this format or
//!   version (`UNSUPPORTED_VERSION`), a worker the server lacks
//!   (`NO_SUCH_WORKER`), no room or an opening the format finds unusable
//!   (`UNAVAILABLE`), else accepted.
//!
//! [`Handshakes`] holds those rules in the quinn-proto style: the acceptor
//! does the I/O (accept, read, write, hand-off) and feeds the table what
//! it read and the time; the table answers with a [`Step`]. It stores
//! each pending socket as an opaque `T` so that one table is the only
//! record of what is pending, but never reads or writes it.
//!
//! Each pending handshake is in a [`Stage`]. A server without a secret
//! judges the opening ([`Stage::Opening`]) and is done. A server with one
//! (`fabrickv_auth::Secret`) goes on, for every transport alike, to
//! [`Stage::Proof`]: after an opening it would accept, it sends a
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
//! both when its opening arrives (no challenge is made) and when its proof
//! does (others from the same source may have failed meanwhile). A source
//! that never failed is never refused, so a client holding the secret
//! costs one uncontended lock per connect, on the connect path only.
//!
//! ```text
//! client -> server:  opening (the transport's)
//! server -> client:  "FKC" version(u8=1) status(u16=AUTH_REQUIRED) reserved(u16) nonce(32)
//! client -> server:  proof(32)
//! server -> client:  answer (the transport's), status OK or AUTH_FAILED
//! ```

use std::time::{Duration, Instant};

use fabrickv_auth::throttle::{SharedThrottle, Source};
use fabrickv_auth::{Secret, NONCE_BYTES, PROOF_BYTES};
use fabrickv_types::ErrorCode;

mod opening;
pub use opening::*;

/// The bounds a [`Handshakes`] table enforces.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Most handshakes pending at once.
    pub pending_max: usize,
    /// Longest a handshake may take from accept to its last byte.
    pub timeout: Duration,
    /// Most connections open at once over all workers: at this count new
    /// sockets are closed at once, and an opening is refused `UNAVAILABLE`.
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
    /// Reading the client's opening.
    Opening,
    /// The opening was good and a challenge went out: reading the proof.
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
    /// In [`Stage::Proof`]: the worker and opening a good proof earns, and
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

/// The server's decision on an opening.
#[derive(Debug, PartialEq, Eq)]
pub enum Verdict<H> {
    /// Hand the connection to `worker`.
    Accept {
        /// The worker asked for (checked to exist).
        worker: usize,
        /// The whole opening, for what else it carries.
        opening: H,
    },
    /// Answer `code` and close.
    Refuse {
        /// Why, as the stable code sent back.
        code: ErrorCode,
        /// The worker the opening asked for if it exists, else 0 (fabric
        /// names that worker's endpoint in its answer).
        worker: usize,
    },
}

impl<H> Verdict<H> {
    /// The status to answer and the worker to hand the connection to (0
    /// on a refusal, which hands it to none), as the acceptors that
    /// answer with a [`CompactOpening`] (tcp, shm) send them.
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
pub struct Handshakes<T, F: OpeningFormat> {
    format: F,
    limits: Limits,
    /// Workers the server has; an opening naming another is refused.
    workers: usize,
    /// Pending handshakes by slot (`None`: free); never longer than
    /// `limits.pending_max`.
    slots: Vec<Option<Pending<T, F::Opening>>>,
    /// The cluster secret each client must prove; `None`: no challenge.
    secret: Option<Secret>,
    /// The server's count of failed authentications (shared by all its
    /// front ends); `None`: failures are not throttled.
    throttle: Option<SharedThrottle>,
}

impl<T, F: OpeningFormat> Handshakes<T, F> {
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

    /// The opening format, for encoding answers.
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
            stage: Stage::Opening,
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
    pub fn received(&mut self, slot: usize, n: usize, open: usize) -> Step<T, F::Opening> {
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
    ) -> Step<T, F::Opening> {
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
    fn verify(&mut self, slot: usize, open: usize) -> Step<T, F::Opening> {
        let Some(p) = self.slots.get_mut(slot).and_then(|p| p.take()) else {
            return Step::Read;
        };
        let (Some((worker, opening, nonce)), Some(secret)) = (p.proving, self.secret.as_ref())
        else {
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
            Verdict::Accept { worker, opening }
        };
        Step::Done(p.io, verdict)
    }

    /// Judges the whole opening in `slot`: answered (and the slot freed),
    /// or, with a secret, challenged.
    fn decide(&mut self, slot: usize, open: usize) -> Step<T, F::Opening> {
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
                    // An opening this server would accept: now the proof.
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
                    Verdict::Accept { worker, opening: h }
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

impl<T: std::io::Read + std::io::Write, F: OpeningFormat> Handshakes<T, F> {
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
    ) -> Option<(T, Verdict<F::Opening>)> {
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
mod tests;
