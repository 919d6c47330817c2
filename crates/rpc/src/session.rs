//! The connection layer every FabricKV client stands on: sessions, request
//! ids, requests in flight, credits, deadlines, and the one reply loop.
//!
//! In this workspace a *session* is one client connection to one server
//! worker together with its queue of requests in flight ([`Session`]);
//! a [`Sessions`] is one client's set of them. It owns, in one place for
//! every client of this workspace (the kv, ps, cache and shard clients of
//! `fabrickv-client`, and `fabrickv bench rpc`'s echo clients):
//!
//! - request ids: one counter over all of a client's sessions, so an id
//!   names one request of the client whichever connection it went out on;
//! - requests in flight: per session, in send order, each with a tag the
//!   caller chooses (the kv client's positions in a batch, the ps
//!   client's pull, an RPC's send time and deadline). The transport keeps
//!   a connection's messages in order and a server worker answers its
//!   requests in the order they came, so replies come back in request
//!   order: [`Session::complete`] checks that;
//! - credits: a bound on a session's requests in flight, past which
//!   [`Sessions::post`] refuses (`NoCredits`) instead of queueing without
//!   limit;
//! - deadlines: [`Session::wait_until`] waits for a reply no later than a
//!   deadline and says `Timeout` once it has passed;
//! - the reply loop, for a client whose message format implements
//!   [`Framing`]: [`Sessions::call`] (post one request, wait for its
//!   reply), [`Sessions::collect`] (every reply awaited on a session, in
//!   order, each handed to a closure), [`Sessions::wait_for`] (until one
//!   request is answered, handing on the others' replies),
//!   [`Sessions::receive_split`] (one reply landed in the caller's
//!   buffer), all over [`Sessions::receive`].
//!
//! **Late replies.** A request whose caller stops waiting (its deadline
//! passed, or the call failed before its reply came) stays in flight,
//! marked *given up*. The connection stays open: its reply still comes,
//! in order, and the next receive on that session reads it and drops it
//! by its request id, before any later request's reply is handed to its
//! caller. So a call after a timeout always gets its own reply, never the
//! late one, and no connection is dropped for a slow server. A session
//! whose every request in flight is given up counts as quiet for the
//! redial below. (A ps pull waited for past its deadline is not given up:
//! the pull stays the caller's, to wait for again or cancel.)
//!
//! **Retries.** This layer sends a request once and never again by
//! itself: a request that timed out may have been applied (a PUT, a
//! durable shard write), and sending it again could apply it twice. What
//! it does repeat is the connect: a session the server closed while
//! quiet (an idle timeout, an eviction at its connection cap) is dialled
//! again before its next request ([`Session::set_redial`]), which loses
//! and repeats nothing. Every client sets it, except on a connection with
//! registered memory (a new connection would not have the regions). A
//! client asks again only where the server's answer says that nothing
//! was done (`REPLY_FULL`, a value that changed between its chunks);
//! that is the client's protocol, not a retry of this layer.
//!
//! It knows no message format beyond [`Framing::reply_id`]: the caller
//! builds each message (given the id and the worker to name in it) and
//! decodes each reply, so the native wire frames (`fabrickv-wire`) travel
//! through it unchanged. Which worker a key or a thread goes to is
//! [`crate::placement`]'s.
//!
//! Nothing here allocates per request beyond the in-flight queue's
//! amortised growth; the loops are generic over the caller's closures
//! and format (monomorphised), so the only dynamic dispatch is the
//! transport's, one call per message, as before.

use std::collections::VecDeque;
use std::marker::PhantomData;
use std::time::{Duration, Instant};

use fabrickv_transport::{Dial, Endpoint, Landed, SplitSink};

use crate::RpcError;

/// A request in flight: its id and the caller's tag.
#[derive(Debug)]
pub struct Sent<T> {
    /// The request id the message carries.
    pub id: u64,
    /// What the caller needs to apply the reply.
    pub tag: T,
    /// The caller stopped waiting for it (its deadline passed, or the
    /// call failed first): its reply is read and dropped on arrival.
    given_up: bool,
}

/// A session's requests in flight, oldest first: replies come back in
/// this order.
pub struct InFlight<T> {
    /// The requests, oldest first.
    q: VecDeque<Sent<T>>,
    /// How many of them are given up: when it equals the length, no
    /// caller waits on the connection, so it may be dialled again.
    given_up: usize,
}

impl<T> InFlight<T> {
    /// Requests in flight.
    #[inline]
    pub fn len(&self) -> usize {
        self.q.len()
    }

    /// Whether no request is in flight.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.q.is_empty()
    }

    /// The oldest request in flight: the one the next reply answers.
    #[inline]
    pub fn front(&self) -> Option<&Sent<T>> {
        self.q.front()
    }

    /// Takes the oldest request off the queue (it was answered, or it is
    /// given up).
    #[inline]
    pub fn pop(&mut self) -> Option<Sent<T>> {
        let s = self.q.pop_front()?;
        if s.given_up {
            self.given_up -= 1;
        }
        Some(s)
    }

    /// Every request in flight, oldest first.
    pub fn iter(&self) -> impl Iterator<Item = &Sent<T>> {
        self.q.iter()
    }

    /// Requests in flight that no caller waits for any more.
    #[inline]
    pub fn given_up(&self) -> usize {
        self.given_up
    }

    /// Whether every request in flight is given up (or none is in
    /// flight): nobody waits on the connection.
    #[inline]
    fn all_given_up(&self) -> bool {
        self.given_up == self.q.len()
    }

    /// Gives request `id` up, if it is in flight: its reply is dropped on
    /// arrival.
    pub fn give_up(&mut self, id: u64) {
        // Ids grow in send order: a binary search finds it.
        if let Ok(i) = self.q.binary_search_by_key(&id, |s| s.id) {
            let s = &mut self.q[i];
            if !s.given_up {
                s.given_up = true;
                self.given_up += 1;
            }
        }
    }

    /// Gives every request in flight up.
    pub fn give_up_all(&mut self) {
        for s in &mut self.q {
            s.given_up = true;
        }
        self.given_up = self.q.len();
    }

    /// Whether request `id` (posted on this session) is still in flight.
    #[inline]
    pub fn holds(&self, id: u64) -> bool {
        self.q.front().is_some_and(|s| s.id <= id) && self.q.back().is_some_and(|s| s.id >= id)
    }

    /// Takes the request a reply carrying `got` answers, under the
    /// late-reply policy of this layer: it must be the oldest in flight
    /// (`OutOfOrder` otherwise); `None` when that request was given up
    /// (the reply is dropped).
    #[inline]
    pub fn take_reply(&mut self, got: u64) -> Result<Option<Sent<T>>, RpcError> {
        let sent = self.complete(got)?;
        Ok((!sent.given_up).then_some(sent))
    }

    /// Takes the request a reply carrying request id `got` answers. Replies
    /// come back in request order, so it must be the oldest in flight; a
    /// reply to anything else means the connection is out of step.
    #[inline]
    pub fn complete(&mut self, got: u64) -> Result<Sent<T>, RpcError> {
        let expected = self.q.front().map(|s| s.id);
        if expected == Some(got) {
            if let Some(s) = self.pop() {
                return Ok(s);
            }
        }
        Err(RpcError::OutOfOrder { got, expected })
    }
}

/// One connection to one server worker, with its requests in flight.
pub struct Session<T> {
    /// The transport connection.
    ep: Box<dyn Endpoint>,
    /// The worker `ep` is bound to (named in every request header).
    worker: u16,
    /// Requests sent and not yet answered.
    q: InFlight<T>,
    /// Messages posted since the last flush.
    unflushed: bool,
    /// Where and how to dial this session's worker again when the server
    /// has closed a quiet connection (an idle timeout, an eviction at its
    /// connection cap); `None`: never.
    redial: Option<(String, Dial)>,
    /// When the last request went out with nothing else in flight.
    last_post: Instant,
}

/// How long a session must have sent nothing before its next request
/// first checks that the server has not closed the connection, in ms: a
/// busy session never pays the check; a quiet one pays a few system
/// calls once.
pub const REDIAL_CHECK_AFTER_MS: u64 = 1_000;

impl<T> std::fmt::Debug for Session<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("worker", &self.worker)
            .field("in_flight", &self.q.len())
            .finish()
    }
}

impl<T> Session<T> {
    /// A session over `ep`, connected to `worker`.
    pub fn new(ep: Box<dyn Endpoint>, worker: u16) -> Session<T> {
        Session {
            ep,
            worker,
            q: InFlight {
                q: VecDeque::new(),
                given_up: 0,
            },
            unflushed: false,
            redial: None,
            last_post: Instant::now(),
        }
    }

    /// Lets the session dial `addr` again as `dial` says when the server
    /// closed the connection while it was quiet (nothing in flight that a
    /// caller waits for, so no request is lost or sent twice).
    /// (Not for a connection with registered memory regions: a new
    /// connection would not have them.)
    pub fn set_redial(&mut self, addr: &str, dial: Dial) {
        self.redial = Some((addr.to_string(), dial));
    }

    /// Before a request on a quiet session: if the server has closed the
    /// connection meanwhile, dials its worker again.
    fn redial_if_closed(&mut self) -> Result<(), RpcError> {
        let Some((addr, dial)) = &self.redial else {
            return Ok(());
        };
        if !self.q.all_given_up()
            || self.last_post.elapsed() < Duration::from_millis(REDIAL_CHECK_AFTER_MS)
            || !self.ep.peer_closed()
        {
            return Ok(());
        }
        tracing::debug!(
            "{addr} closed a quiet connection; dialling worker {} again",
            self.worker
        );
        self.ep = fabrickv_transport::connect_with(addr, self.worker, dial)?;
        self.unflushed = false;
        // The given-up requests' replies cannot come on the new
        // connection; nobody waits for them.
        self.q.q.clear();
        self.q.given_up = 0;
        Ok(())
    }

    /// The worker this session talks to.
    #[inline]
    pub fn worker(&self) -> u16 {
        self.worker
    }

    /// The transport connection, for what this layer does not wrap
    /// (registering memory, reading a registered region).
    #[inline]
    pub fn endpoint(&mut self) -> &mut dyn Endpoint {
        &mut *self.ep
    }

    /// The requests in flight.
    #[inline]
    pub fn queue(&self) -> &InFlight<T> {
        &self.q
    }

    /// The requests in flight, mutably.
    #[inline]
    pub fn queue_mut(&mut self) -> &mut InFlight<T> {
        &mut self.q
    }

    /// Requests in flight.
    #[inline]
    pub fn in_flight(&self) -> usize {
        self.q.len()
    }

    /// Whether no request is in flight.
    #[inline]
    pub fn is_idle(&self) -> bool {
        self.q.is_empty()
    }

    /// Takes the request a reply carrying `got` answers
    /// ([`InFlight::complete`]).
    #[inline]
    pub fn complete(&mut self, got: u64) -> Result<Sent<T>, RpcError> {
        self.q.complete(got)
    }

    /// Sends what was posted since the last flush, if anything. When it
    /// fails, the requests in flight are given up: what was posted may
    /// never have left.
    pub fn flush(&mut self, timeout: Duration) -> Result<(), RpcError> {
        if self.unflushed {
            if let Err(e) = self.ep.flush(timeout) {
                self.q.give_up_all();
                return Err(e.into());
            }
            self.unflushed = false;
        }
        Ok(())
    }

    /// Waits until a reply may have arrived, but not past `deadline`;
    /// `Timeout` once it has passed. A wait returns at once when a reply
    /// is already in (over tcp it is the one `recv` that fetches it).
    #[inline]
    pub fn wait_until(&mut self, deadline: Instant) -> Result<(), RpcError> {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(RpcError::Timeout);
        }
        self.ep.wait(left)?;
        Ok(())
    }
}

/// The one thing this layer reads of a message format: which request a
/// reply answers. The native frames of `fabrickv-wire` implement it in
/// `fabrickv-client`; a format is a type, so the reply loops are
/// compiled for it and read the id with no indirect call.
pub trait Framing {
    /// What the reply loops fail with: the caller's error, which a layer
    /// error ([`RpcError`]) converts into.
    type Error: From<RpcError>;

    /// The request id `msg` answers, or why it names none.
    fn reply_id(msg: &[u8]) -> Result<u64, Self::Error>;
}

/// The native frames of `fabrickv-wire`, whose 32-byte header carries the
/// request id, for a caller whose errors are this layer's (the echo
/// clients of `bench rpc` and the RPC suite; `fabrickv-client` has its own
/// [`Framing`] of the same frames, to report a bad header as its
/// protocol error).
#[derive(Debug)]
pub enum WireFrames {}

impl Framing for WireFrames {
    type Error = RpcError;

    #[inline]
    fn reply_id(msg: &[u8]) -> Result<u64, RpcError> {
        fabrickv_wire::FrameHeader::decode(msg)
            .map(|h| h.request_id)
            .map_err(|e| RpcError::Invalid(format!("a reply that is not a frame: {e}")))
    }
}

/// One client's sessions, its request ids and its credits; with a
/// [`Framing`] `F`, its reply loops.
pub struct Sessions<T, F = WireFrames> {
    /// The sessions, by the caller's numbering (the kv client's is by
    /// worker; the echo bench's by its choice of server threads).
    sessions: Vec<Session<T>>,
    /// The next request id (ids start at 1: 0 is the control requests').
    next_id: u64,
    /// Most requests in flight per session.
    credits: usize,
    /// The per-call timeout: how long a flush may block, and what callers
    /// add to now for a deadline.
    timeout: Duration,
    /// The message format the reply loops read ids of.
    format: PhantomData<fn() -> F>,
}

impl<T, F> std::fmt::Debug for Sessions<T, F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sessions")
            .field("sessions", &self.sessions)
            .field("credits", &self.credits)
            .field("timeout", &self.timeout)
            .finish()
    }
}

impl<T, F> Sessions<T, F> {
    /// Sessions over connections already made, each with `credits`
    /// requests in flight at most.
    pub fn new(sessions: Vec<Session<T>>, credits: usize, timeout: Duration) -> Sessions<T, F> {
        assert!(credits > 0, "a session needs at least one credit");
        Sessions {
            sessions,
            next_id: 1,
            credits,
            timeout,
            format: PhantomData,
        }
    }

    /// One session, to `worker` over `ep`.
    pub fn one(ep: Box<dyn Endpoint>, worker: u16, credits: usize, timeout: Duration) -> Self {
        Sessions::new(vec![Session::new(ep, worker)], credits, timeout)
    }

    /// Adds a session, numbered `len()` before the call.
    pub fn push(&mut self, session: Session<T>) {
        self.sessions.push(session);
    }

    /// How many sessions there are.
    #[inline]
    pub fn len(&self) -> usize {
        self.sessions.len()
    }

    /// Whether there are none.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.sessions.is_empty()
    }

    /// Session `s`.
    #[inline]
    pub fn session(&mut self, s: usize) -> &mut Session<T> {
        &mut self.sessions[s]
    }

    /// Session `s`, read-only.
    #[inline]
    pub fn get(&self, s: usize) -> &Session<T> {
        &self.sessions[s]
    }

    /// Every session.
    #[inline]
    pub fn all(&mut self) -> &mut [Session<T>] {
        &mut self.sessions
    }

    /// Every session, read-only.
    #[inline]
    pub fn iter(&self) -> std::slice::Iter<'_, Session<T>> {
        self.sessions.iter()
    }

    /// Most requests in flight per session.
    #[inline]
    pub fn credits(&self) -> usize {
        self.credits
    }

    /// The per-call timeout.
    #[inline]
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Sets the per-call timeout.
    pub fn set_timeout(&mut self, timeout: Duration) {
        self.timeout = timeout;
    }

    /// A deadline one timeout from now.
    #[inline]
    pub fn deadline(&self) -> Instant {
        Instant::now() + self.timeout
    }

    /// Requests in flight over every session.
    pub fn in_flight(&self) -> usize {
        self.sessions.iter().map(Session::in_flight).sum()
    }

    /// A fresh request id, for a request this layer does not track (a
    /// load generator's own frames) or a handle that is not a request
    /// (the ps client's pull ids).
    #[inline]
    pub fn next_request_id(&mut self) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        id
    }

    /// Posts one request on session `s`: `build` appends the message,
    /// given its request id and the worker to name. The request is in
    /// flight, tagged `tag`, once this returns its id; it leaves at the
    /// next flush. `NoCredits` when `s` has `credits` requests in flight
    /// already (nothing is posted).
    #[inline]
    pub fn post(
        &mut self,
        s: usize,
        tag: T,
        mut build: impl FnMut(&mut Vec<u8>, u64, u16),
    ) -> Result<u64, RpcError> {
        self.post_tagging(s, tag, |b, _, id, w| build(b, id, w))
    }

    /// [`Sessions::post`] where `build` also fills in the tag as it packs
    /// the message (the kv client records which operations went into a
    /// frame while it packs them).
    #[inline]
    pub fn post_tagging(
        &mut self,
        s: usize,
        mut tag: T,
        mut build: impl FnMut(&mut Vec<u8>, &mut T, u64, u16),
    ) -> Result<u64, RpcError> {
        let credits = self.credits;
        let id = self.next_id;
        let session = &mut self.sessions[s];
        if session.q.len() >= credits {
            return Err(RpcError::NoCredits);
        }
        if session.q.all_given_up() && session.redial.is_some() {
            session.redial_if_closed()?;
            session.last_post = Instant::now();
        }
        let worker = session.worker;
        session
            .ep
            .post_with(&mut |b| build(b, &mut tag, id, worker))?;
        self.next_id += 1;
        session.q.q.push_back(Sent {
            id,
            tag,
            given_up: false,
        });
        session.unflushed = true;
        Ok(id)
    }

    /// Sends what every session posted since its last flush.
    pub fn flush(&mut self) -> Result<(), RpcError> {
        let timeout = self.timeout;
        for s in &mut self.sessions {
            s.flush(timeout)?;
        }
        Ok(())
    }
}

/// The reply loop: the one place where a client waits for replies, hands
/// each to the caller in request order, and applies the late-reply
/// policy (see the module documentation).
impl<T, F: Framing> Sessions<T, F> {
    /// Waits on session `s` until a reply has come (no later than
    /// `deadline`: `Timeout` once it has passed), then hands every reply
    /// received, in request order, to `on_reply` with the request it
    /// answers; the replies to requests given up are dropped. Returns how
    /// many were handed (0 when only given-up ones came).
    ///
    /// It waits before it polls: a wait returns at once when a reply is
    /// already in, and over tcp it is the one `recv` that fetches it,
    /// where polling first costs a `recv` that finds nothing for every
    /// reply not yet in (measured with `fabrickv bench cluster`: the kv
    /// client's receives fell from 4.65 to 2 per two-frame call).
    ///
    /// When `on_reply` fails, the replies received with it are still
    /// taken off the queue (unread), so the session stays in step; the
    /// first failure is returned.
    #[inline]
    pub fn receive(
        &mut self,
        s: usize,
        deadline: Instant,
        on_reply: impl FnMut(&[u8], Sent<T>) -> Result<(), F::Error>,
    ) -> Result<usize, F::Error> {
        self.sessions[s].wait_until(deadline)?;
        self.take_replies(s, on_reply)
    }

    /// [`Sessions::receive`] without the wait: hands the replies already
    /// received on session `s`, if any.
    #[inline]
    pub fn take_replies(
        &mut self,
        s: usize,
        mut on_reply: impl FnMut(&[u8], Sent<T>) -> Result<(), F::Error>,
    ) -> Result<usize, F::Error> {
        let session = &mut self.sessions[s];
        let max = session.q.len();
        let q = &mut session.q;
        let mut handed = 0;
        let mut failed: Option<F::Error> = None;
        session
            .ep
            .poll(max, &mut |msg| {
                let sent = match F::reply_id(msg).and_then(|id| Ok(q.take_reply(id)?)) {
                    Ok(Some(sent)) => sent,
                    Ok(None) => return,
                    Err(e) => {
                        failed.get_or_insert(e);
                        return;
                    }
                };
                if failed.is_none() {
                    handed += 1;
                    if let Err(e) = on_reply(msg, sent) {
                        failed = Some(e);
                    }
                }
            })
            .map_err(RpcError::from)?;
        match failed {
            Some(e) => Err(e),
            None => Ok(handed),
        }
    }

    /// Receives on session `s` until request `id` is answered, handing
    /// every reply to `on_reply` (its own and those of older requests
    /// still awaited, such as a ps client's pulls). On a failure
    /// (`Timeout` at `deadline` included) request `id` is given up.
    pub fn wait_for(
        &mut self,
        s: usize,
        id: u64,
        deadline: Instant,
        mut on_reply: impl FnMut(&[u8], Sent<T>) -> Result<(), F::Error>,
    ) -> Result<(), F::Error> {
        while self.sessions[s].q.holds(id) {
            if let Err(e) = self.receive(s, deadline, &mut on_reply) {
                self.sessions[s].q.give_up(id);
                return Err(e);
            }
        }
        Ok(())
    }

    /// Posts one request on session `s` (built by `build`, given its id
    /// and worker), sends it and waits until `deadline` for its reply,
    /// which `on_reply` turns into the result. Nothing else may be
    /// awaited on the session (a reply to another request that is not
    /// given up is `OutOfOrder`). On a failure the request is given up.
    pub fn call<R>(
        &mut self,
        s: usize,
        tag: T,
        deadline: Instant,
        build: impl FnOnce(&mut Vec<u8>, u64, u16),
        on_reply: impl FnOnce(&[u8], T) -> Result<R, F::Error>,
    ) -> Result<R, F::Error> {
        let mut build = Some(build);
        let id = self.post(s, tag, |b, id, w| {
            if let Some(f) = build.take() {
                f(b, id, w);
            }
        })?;
        let timeout = self.timeout;
        self.sessions[s].flush(timeout)?;
        let mut on_reply = Some(on_reply);
        let mut out: Option<R> = None;
        self.wait_for(s, id, deadline, |msg, sent| {
            match on_reply.take() {
                Some(f) if sent.id == id => out = Some(f(msg, sent.tag)?),
                _ => {
                    return Err(RpcError::OutOfOrder {
                        got: sent.id,
                        expected: Some(id),
                    }
                    .into())
                }
            }
            Ok(())
        })?;
        out.ok_or_else(|| {
            RpcError::OutOfOrder {
                got: id,
                expected: None,
            }
            .into()
        })
    }

    /// Receives on session `s` until none of its requests is awaited
    /// (each answered, or given up: the replies to those are dropped as
    /// they come, here or by a later receive), handing each reply to
    /// `on_reply`. On a failure (`Timeout` at `deadline` included)
    /// every request still in flight on `s` is given up.
    #[inline]
    pub fn collect(
        &mut self,
        s: usize,
        deadline: Instant,
        mut on_reply: impl FnMut(&[u8], Sent<T>) -> Result<(), F::Error>,
    ) -> Result<(), F::Error> {
        while !self.sessions[s].q.all_given_up() {
            if let Err(e) = self.receive(s, deadline, &mut on_reply) {
                self.sessions[s].q.give_up_all();
                return Err(e);
            }
        }
        Ok(())
    }

    /// [`Sessions::collect`] over every session, one after the other.
    /// On a failure every request in flight on every session is given
    /// up.
    #[inline]
    pub fn collect_all(
        &mut self,
        deadline: Instant,
        mut on_reply: impl FnMut(&[u8], Sent<T>) -> Result<(), F::Error>,
    ) -> Result<(), F::Error> {
        for s in 0..self.sessions.len() {
            if let Err(e) = self.collect(s, deadline, &mut on_reply) {
                for session in &mut self.sessions {
                    session.q.give_up_all();
                }
                return Err(e);
            }
        }
        Ok(())
    }

    /// Receives the reply to the oldest request awaited on session `s`
    /// split: its first `head_bytes` shown to `sink`, which may give its
    /// tail a place to land in (a value read straight into the caller's
    /// buffer); then `on_landed` checks what landed, given the request it
    /// answers. The replies to requests given up before it are received
    /// whole and dropped, never shown to `sink`. On a failure (`Timeout`
    /// at `deadline` included) every request in flight on `s` is given
    /// up.
    pub fn receive_split<S: SplitSink, R>(
        &mut self,
        s: usize,
        deadline: Instant,
        head_bytes: usize,
        sink: &mut S,
        on_landed: impl FnOnce(Landed, &mut S, Sent<T>) -> Result<R, F::Error>,
    ) -> Result<R, F::Error> {
        let session = &mut self.sessions[s];
        // The loop runs in a closure so that `?` and `return` end it
        // with the result the failure policy below looks at.
        let r = (|| -> Result<R, F::Error> {
            loop {
                let Some(front) = session.q.front() else {
                    return Err(RpcError::OutOfOrder {
                        got: 0,
                        expected: None,
                    }
                    .into());
                };
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return Err(RpcError::Timeout.into());
                }
                if !front.given_up {
                    let landed = session
                        .ep
                        .recv_split(head_bytes, left, sink)
                        .map_err(RpcError::from)?;
                    let sent = session.q.pop().ok_or(RpcError::OutOfOrder {
                        got: 0,
                        expected: None,
                    })?;
                    return on_landed(landed, sink, sent);
                }
                let mut late = Late::<F>(None);
                session
                    .ep
                    .recv_split(head_bytes, left, &mut late)
                    .map_err(RpcError::from)?;
                let id = late.0.unwrap_or_else(|| F::reply_id(&[]))?;
                session.q.take_reply(id)?;
            }
        })();
        if r.is_err() {
            session.q.give_up_all();
        }
        r
    }
}

/// Takes a late reply whole and reads its request id, so that it is
/// dropped without landing anywhere.
struct Late<F: Framing>(Option<Result<u64, F::Error>>);

impl<F: Framing> SplitSink for Late<F> {
    fn tail(&mut self, _: &[u8], _: usize) -> Option<&mut [u8]> {
        None
    }

    fn whole(&mut self, msg: &[u8]) {
        self.0 = Some(F::reply_id(msg));
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use fabrickv_transport::{Result as TResult, TransportError};

    /// An endpoint that takes messages and never answers.
    struct Sink(usize);

    impl Endpoint for Sink {
        fn post_with(&mut self, build: &mut dyn FnMut(&mut Vec<u8>)) -> TResult<()> {
            let mut b = Vec::new();
            build(&mut b);
            self.0 += 1;
            Ok(())
        }
        fn flush(&mut self, _: Duration) -> TResult<()> {
            Ok(())
        }
        fn poll(&mut self, _: usize, _: &mut dyn FnMut(&[u8])) -> TResult<usize> {
            Ok(0)
        }
        fn wait(&mut self, _: Duration) -> TResult<()> {
            Err(TransportError::Timeout)
        }
    }

    #[test]
    fn replies_must_come_in_request_order() {
        let mut s: Sessions<&str> = Sessions::one(Box::new(Sink(0)), 3, 8, Duration::from_secs(1));
        let a = s.post(0, "a", |_, _, w| assert_eq!(w, 3)).unwrap();
        let b = s.post(0, "b", |_, _, _| {}).unwrap();
        assert_eq!((a, b), (1, 2));
        assert!(matches!(
            s.session(0).complete(b),
            Err(RpcError::OutOfOrder {
                got: 2,
                expected: Some(1)
            })
        ));
        assert_eq!(s.session(0).complete(a).unwrap().tag, "a");
        assert_eq!(s.session(0).complete(b).unwrap().tag, "b");
        assert!(s.session(0).complete(b).is_err(), "a reply to nothing");
    }

    #[test]
    fn credits_bound_the_requests_in_flight() {
        let mut s: Sessions<()> = Sessions::one(Box::new(Sink(0)), 0, 2, Duration::from_secs(1));
        s.post(0, (), |_, _, _| {}).unwrap();
        s.post(0, (), |_, _, _| {}).unwrap();
        assert!(matches!(
            s.post(0, (), |_, _, _| {}),
            Err(RpcError::NoCredits)
        ));
        assert_eq!(s.in_flight(), 2);
        s.session(0).complete(1).unwrap();
        assert_eq!(s.post(0, (), |_, _, _| {}).unwrap(), 3, "no id is lost");
    }

    /// What a scripted server holds: requests answered at a flush unless
    /// `hold` is set, then kept until released.
    #[derive(Default)]
    struct Script {
        posted: VecDeque<Vec<u8>>,
        held: VecDeque<Vec<u8>>,
        inbox: VecDeque<Vec<u8>>,
        hold: bool,
    }

    /// An endpoint whose server echoes each request as its reply, as the
    /// shared [`Script`] says.
    struct Echo(std::sync::Arc<std::sync::Mutex<Script>>);

    impl Endpoint for Echo {
        fn post_with(&mut self, build: &mut dyn FnMut(&mut Vec<u8>)) -> TResult<()> {
            let mut b = Vec::new();
            build(&mut b);
            self.0.lock().unwrap().posted.push_back(b);
            Ok(())
        }
        fn flush(&mut self, _: Duration) -> TResult<()> {
            let mut s = self.0.lock().unwrap();
            let posted: Vec<_> = s.posted.drain(..).collect();
            if s.hold {
                s.held.extend(posted);
            } else {
                s.inbox.extend(posted);
            }
            Ok(())
        }
        fn poll(&mut self, max: usize, on: &mut dyn FnMut(&[u8])) -> TResult<usize> {
            let mut n = 0;
            while n < max {
                let Some(m) = self.0.lock().unwrap().inbox.pop_front() else {
                    break;
                };
                on(&m);
                n += 1;
            }
            Ok(n)
        }
        fn wait(&mut self, _: Duration) -> TResult<()> {
            if self.0.lock().unwrap().inbox.is_empty() {
                return Err(TransportError::Timeout);
            }
            Ok(())
        }
    }

    /// Messages whose first 8 bytes are the request id.
    enum Ids {}

    impl Framing for Ids {
        type Error = RpcError;
        fn reply_id(msg: &[u8]) -> Result<u64, RpcError> {
            let id = msg.get(..8).ok_or(RpcError::Invalid("short".into()))?;
            Ok(u64::from_le_bytes(id.try_into().unwrap()))
        }
    }

    type Shared = std::sync::Arc<std::sync::Mutex<Script>>;

    fn echo() -> (Sessions<(), Ids>, Shared) {
        let script = Shared::default();
        let s = Sessions::one(
            Box::new(Echo(script.clone())),
            0,
            8,
            Duration::from_secs(60),
        );
        (s, script)
    }

    /// A request carrying `body` after its id.
    fn with(body: &'static str) -> impl FnMut(&mut Vec<u8>, u64, u16) {
        move |b, id, _| {
            b.extend_from_slice(&id.to_le_bytes());
            b.extend_from_slice(body.as_bytes());
        }
    }

    fn body(m: &[u8], _: ()) -> Result<String, RpcError> {
        Ok(String::from_utf8_lossy(&m[8..]).into_owned())
    }

    /// Releases the replies the server held.
    fn release(script: &Shared) {
        let mut s = script.lock().unwrap();
        s.hold = false;
        let held: Vec<_> = s.held.drain(..).collect();
        s.inbox.extend(held);
    }

    #[test]
    fn a_call_after_a_timeout_gets_its_own_reply_not_the_late_one() {
        let (mut s, script) = echo();
        script.lock().unwrap().hold = true;
        let r = s.call(0, (), Instant::now(), with("first"), body);
        assert!(matches!(r, Err(RpcError::Timeout)), "{r:?}");
        assert_eq!(s.get(0).queue().given_up(), 1);
        // The late reply arrives before the next call's.
        release(&script);
        let r = s.call(0, (), s.deadline(), with("second"), body).unwrap();
        assert_eq!(r, "second");
        assert_eq!(s.in_flight(), 0, "the late reply was read and dropped");
    }

    #[test]
    fn a_collect_that_times_out_gives_its_requests_up() {
        let (mut s, script) = echo();
        script.lock().unwrap().hold = true;
        for b in ["a", "b"] {
            s.post(0, (), with(b)).unwrap();
        }
        s.flush().unwrap();
        let r = s.collect(0, Instant::now(), |_, _| Ok(()));
        assert!(matches!(r, Err(RpcError::Timeout)), "{r:?}");
        release(&script);
        s.post(0, (), with("c")).unwrap();
        s.flush().unwrap();
        let mut got = Vec::new();
        s.collect(0, s.deadline(), |m, _| {
            got.push(body(m, ())?);
            Ok(())
        })
        .unwrap();
        assert_eq!(got, vec!["c".to_string()], "only the awaited reply");
    }

    #[test]
    fn a_failed_reply_leaves_the_session_in_step() {
        let (mut s, _script) = echo();
        for b in ["bad", "x", "y"] {
            s.post(0, (), with(b)).unwrap();
        }
        s.flush().unwrap();
        let r = s.collect(0, s.deadline(), |m, _| match &m[8..] {
            b"bad" => Err(RpcError::Invalid("refused".into())),
            _ => Ok(()),
        });
        assert!(matches!(r, Err(RpcError::Invalid(_))), "{r:?}");
        assert_eq!(s.in_flight(), 0, "the replies after it were taken off");
        assert_eq!(s.call(0, (), s.deadline(), with("z"), body).unwrap(), "z");
    }

    /// A sink that lands any tail in `dst`.
    struct Land {
        dst: Vec<u8>,
        whole: usize,
    }

    impl SplitSink for Land {
        fn tail(&mut self, _: &[u8], len: usize) -> Option<&mut [u8]> {
            self.dst.resize(len - 8, 0);
            Some(&mut self.dst)
        }
        fn whole(&mut self, _: &[u8]) {
            self.whole += 1;
        }
    }

    #[test]
    fn a_late_reply_never_lands_in_a_split_receive() {
        let (mut s, script) = echo();
        script.lock().unwrap().hold = true;
        s.post(0, (), with("late")).unwrap();
        s.flush().unwrap();
        let mut sink = Land {
            dst: Vec::new(),
            whole: 0,
        };
        let r = s.receive_split(0, Instant::now(), 8, &mut sink, |_, _, _| Ok(()));
        assert!(matches!(r, Err(RpcError::Timeout)), "{r:?}");
        release(&script);
        let id = s.post(0, (), with("own")).unwrap();
        s.flush().unwrap();
        let got = s
            .receive_split(0, s.deadline(), 8, &mut sink, |landed, sink, sent| {
                assert!(matches!(landed, Landed::Split));
                Ok((sent.id, sink.dst.clone()))
            })
            .unwrap();
        assert_eq!(got, (id, b"own".to_vec()));
        assert_eq!(sink.whole, 0, "the late reply was not shown to the sink");
        assert_eq!(s.in_flight(), 0);
    }
}
