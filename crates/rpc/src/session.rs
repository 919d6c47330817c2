//! The connection layer every FabricKV client stands on: sessions, request
//! ids, requests in flight, credits and deadlines.
//!
//! A [`Sessions`] is one client's set of connections ([`Session`]s), each
//! bound to one server worker (thread). It owns, in one place for every
//! client of this workspace (the kv, ps, cache and shard clients of
//! `fabrickv-client`, and [`crate::RpcClient`]):
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
//!   deadline and says `Timeout` once it has passed.
//!
//! It does not know any message format: the caller builds each message
//! (given the id and the worker to name in it) and reads each reply's
//! request id itself, so the native wire frames (`fabrickv-wire`) and the
//! RPC header ([`crate::header`]) both travel through it unchanged.
//! Which worker a key or a thread goes to is [`crate::worker`]'s.
//!
//! Nothing here allocates per request beyond the in-flight queue's
//! amortised growth, and the only dynamic dispatch is the transport's, one
//! call per message, as before.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use fabrickv_transport::{Dial, Endpoint};

use crate::RpcError;

/// A request in flight: its id and the caller's tag.
#[derive(Debug)]
pub struct Sent<T> {
    /// The request id the message carries.
    pub id: u64,
    /// What the caller needs to apply the reply.
    pub tag: T,
}

/// A session's requests in flight, oldest first: replies come back in
/// this order.
pub struct InFlight<T>(VecDeque<Sent<T>>);

impl<T> InFlight<T> {
    /// Requests in flight.
    #[inline]
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether no request is in flight.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The oldest request in flight: the one the next reply answers.
    #[inline]
    pub fn front(&self) -> Option<&Sent<T>> {
        self.0.front()
    }

    /// Takes the oldest request off the queue (it was answered, or it is
    /// given up).
    #[inline]
    pub fn pop(&mut self) -> Option<Sent<T>> {
        self.0.pop_front()
    }

    /// Every request in flight, oldest first.
    pub fn iter(&self) -> impl Iterator<Item = &Sent<T>> {
        self.0.iter()
    }

    /// Takes the request a reply carrying request id `got` answers. Replies
    /// come back in request order, so it must be the oldest in flight; a
    /// reply to anything else means the connection is out of step.
    #[inline]
    pub fn complete(&mut self, got: u64) -> Result<Sent<T>, RpcError> {
        let expected = self.0.front().map(|s| s.id);
        if expected == Some(got) {
            if let Some(s) = self.0.pop_front() {
                return Ok(s);
            }
        }
        Err(RpcError::OutOfOrder { got, expected })
    }

    /// [`InFlight::complete`] for a client that gives requests up at their
    /// deadline but leaves them on the queue: the requests older than
    /// `got` were given up and are handed to `given_up`; `None` when `got`
    /// is older than every request still in flight (a late reply to one
    /// already dropped).
    pub fn complete_after_given_up(
        &mut self,
        got: u64,
        mut given_up: impl FnMut(Sent<T>),
    ) -> Option<Sent<T>> {
        while self.0.front().is_some_and(|s| s.id < got) {
            if let Some(s) = self.0.pop_front() {
                given_up(s);
            }
        }
        match self.0.front() {
            Some(s) if s.id == got => self.0.pop_front(),
            _ => None,
        }
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
            q: InFlight(VecDeque::new()),
            unflushed: false,
            redial: None,
            last_post: Instant::now(),
        }
    }

    /// Lets the session dial `addr` again as `dial` says when the server
    /// closed the connection while it was quiet (nothing in flight, so no
    /// request is lost or sent twice).
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
        if !self.q.is_empty()
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

    /// The connection and the requests in flight together, for a reader
    /// that receives on the one and completes on the other (a split
    /// receive).
    #[inline]
    pub fn parts(&mut self) -> (&mut dyn Endpoint, &mut InFlight<T>) {
        (&mut *self.ep, &mut self.q)
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

    /// Hands up to `max` received messages to `on_msg`, with the requests
    /// in flight to complete them against, without blocking; returns how
    /// many.
    #[inline]
    pub fn poll(
        &mut self,
        max: usize,
        mut on_msg: impl FnMut(&[u8], &mut InFlight<T>),
    ) -> Result<usize, RpcError> {
        let q = &mut self.q;
        Ok(self.ep.poll(max, &mut |m| on_msg(m, q))?)
    }

    /// Sends what was posted since the last flush, if anything.
    pub fn flush(&mut self, timeout: Duration) -> Result<(), RpcError> {
        if self.unflushed {
            self.ep.flush(timeout)?;
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

/// One client's sessions, its request ids and its credits.
pub struct Sessions<T> {
    /// The sessions, by the caller's numbering (the kv client's is by
    /// worker; the RPC client's by its choice of server threads).
    sessions: Vec<Session<T>>,
    /// The next request id (ids start at 1: 0 is the control requests').
    next_id: u64,
    /// Most requests in flight per session.
    credits: usize,
    /// The per-call timeout: how long a flush may block, and what callers
    /// add to now for a deadline.
    timeout: Duration,
}

impl<T> std::fmt::Debug for Sessions<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sessions")
            .field("sessions", &self.sessions)
            .field("credits", &self.credits)
            .field("timeout", &self.timeout)
            .finish()
    }
}

impl<T> Sessions<T> {
    /// Sessions over connections already made, each with `credits`
    /// requests in flight at most.
    pub fn new(sessions: Vec<Session<T>>, credits: usize, timeout: Duration) -> Sessions<T> {
        assert!(credits > 0, "a session needs at least one credit");
        Sessions {
            sessions,
            next_id: 1,
            credits,
            timeout,
        }
    }

    /// One session, to `worker` over `ep`.
    pub fn one(ep: Box<dyn Endpoint>, worker: u16, credits: usize, timeout: Duration) -> Self {
        Sessions::new(vec![Session::new(ep, worker)], credits, timeout)
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
        if session.q.is_empty() && session.redial.is_some() {
            session.redial_if_closed()?;
            session.last_post = Instant::now();
        }
        let worker = session.worker;
        session
            .ep
            .post_with(&mut |b| build(b, &mut tag, id, worker))?;
        self.next_id += 1;
        session.q.0.push_back(Sent { id, tag });
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

    #[test]
    fn replies_to_given_up_requests_are_skipped() {
        let mut s: Sessions<u8> = Sessions::one(Box::new(Sink(0)), 0, 8, Duration::from_secs(1));
        for t in 0..3 {
            s.post(0, t, |_, _, _| {}).unwrap();
        }
        let mut dropped = Vec::new();
        let got = s
            .session(0)
            .queue_mut()
            .complete_after_given_up(3, |d| dropped.push(d.tag));
        assert_eq!(got.map(|g| g.tag), Some(2));
        assert_eq!(dropped, vec![0, 1]);
        assert!(s
            .session(0)
            .queue_mut()
            .complete_after_given_up(1, |_| {})
            .is_none());
    }
}
