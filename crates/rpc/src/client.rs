//! Client side: the RPC client over [`crate::session`], with per-request
//! timeouts and reply slots.
//!
//! A client holds one session per server thread it talks to. Each session
//! has `credits` slots: a request takes one when sent and gives it back
//! when its response (or its timeout) completes it, so a client can never
//! have more than `credits` requests in flight per session. Requests are
//! queued with `call_async`, sent together with `flush` (one syscall or
//! ring publish per session), and completed by `poll`. Responses on one
//! session arrive in request order; a response whose request already
//! timed out is dropped. Ids, the queues, credits and waits are the
//! session layer's, the same the FabricKV clients use.

use std::time::{Duration, Instant};

use fabrickv_transport::RemoteRegion;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use crate::header::{RpcHeader, RpcStatus, NO_SLOT};
use crate::server::ReplySlots;
use crate::session::{Session, Sessions};
use crate::{RpcError, REQ_TYPES_MAX, REQ_TYPE_SESSION, SESSION_CREDITS_MAX};

/// Which server thread a request goes to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Affinity {
    /// Each request to a random server thread (the placement eRPC's
    /// benchmarks call ThroughputB).
    Random,
    /// Every request to server thread `client_id % server_threads`
    /// (eRPC's ThroughputC): one session, no sharing of server threads
    /// between a client's requests.
    Modulo,
}

impl std::str::FromStr for Affinity {
    type Err = String;

    fn from_str(s: &str) -> Result<Affinity, String> {
        match s {
            "random" => Ok(Affinity::Random),
            "modulo" => Ok(Affinity::Modulo),
            _ => Err(format!("unknown affinity {s:?}: expected random or modulo")),
        }
    }
}

/// How a client behaves.
#[derive(Debug, Clone)]
pub struct RpcClientConfig {
    /// Requests in flight per session, at most `SESSION_CREDITS_MAX`.
    pub credits: usize,
    /// Per-request deadline.
    pub timeout: Duration,
    /// Server thread choice.
    pub affinity: Affinity,
    /// This client's number, for `Affinity::Modulo` and for seeding the
    /// random choice of `Affinity::Random`.
    pub client_id: usize,
    /// Bytes of each reply slot the client offers for out-of-line
    /// responses (one slot per credit, in memory registered with the
    /// transport); 0 offers none. Transports without one-sided access
    /// always answer inline.
    pub reply_slot_bytes: usize,
}

impl Default for RpcClientConfig {
    fn default() -> Self {
        RpcClientConfig {
            credits: 32,
            timeout: Duration::from_secs(5),
            affinity: Affinity::Modulo,
            client_id: 0,
            reply_slot_bytes: 0,
        }
    }
}

/// A finished request.
#[derive(Debug)]
pub struct Completion<'a> {
    /// The id `call_async` returned.
    pub request_id: u64,
    /// `Ok`, a server refusal, or `Timeout`.
    pub status: RpcStatus,
    /// The response payload (empty unless `Ok`).
    pub payload: &'a [u8],
    /// From `call_async` to completion.
    pub latency: Duration,
}

/// What a request in flight needs for its completion (its tag in the
/// session layer).
struct Pending {
    sent: Instant,
    deadline: Instant,
    /// Reply slot offered with the request, or `NO_SLOT`.
    slot: u16,
}

/// A session's reply slots, for out-of-line responses.
#[derive(Default)]
struct Slots {
    /// The registered region holding this session's reply slots.
    region: Option<RemoteRegion>,
    /// Bytes per reply slot.
    slot_bytes: usize,
    /// Reply slots not held by a request in flight.
    free: Vec<u16>,
}

/// An out-of-line response seen during a poll, read from its slot after.
struct OutOfLine {
    id: u64,
    slot: u16,
    len: usize,
    latency: Duration,
}

/// Registers a session's reply slots and tells the server about them, with
/// one blocking session request. A transport without memory registration
/// leaves the session inline-only.
fn offer_reply_slots(
    s: &mut Session<Pending>,
    slots_of: &mut Slots,
    cfg: &RpcClientConfig,
) -> Result<(), RpcError> {
    let slots = cfg.credits.min(usize::from(NO_SLOT));
    let ep = s.endpoint();
    if !ep.capabilities().memory_registration {
        return Ok(());
    }
    let region = ep.register(slots * cfg.reply_slot_bytes)?;
    let offer = ReplySlots {
        region,
        slot_bytes: cfg.reply_slot_bytes,
        slots,
    };
    ep.post_with(&mut |b| {
        RpcHeader {
            response: false,
            req_type: REQ_TYPE_SESSION,
            status: RpcStatus::Ok,
            request_id: 0,
            slot: NO_SLOT,
            out_of_line: false,
        }
        .encode(b);
        offer.encode(b);
    })?;
    ep.flush(cfg.timeout)?;
    let deadline = Instant::now() + cfg.timeout;
    loop {
        let mut answer = None;
        s.poll(1, |msg, _| {
            answer = RpcHeader::decode(msg).map(|(h, _)| h.status)
        })?;
        match answer {
            Some(RpcStatus::Ok) => break,
            Some(status) => return Err(RpcError::Status(status)),
            None => s.wait_until(deadline)?,
        }
    }
    slots_of.region = Some(region);
    slots_of.slot_bytes = cfg.reply_slot_bytes;
    slots_of.free = (0..slots as u16).rev().collect();
    Ok(())
}

/// Gives a reply slot back to its session (no-op for `NO_SLOT`).
fn release(free: &mut Vec<u16>, slot: u16) {
    if slot != NO_SLOT {
        free.push(slot);
    }
}

/// A client of an RPC server.
pub struct RpcClient {
    /// The sessions, their ids, queues and credits.
    sessions: Sessions<Pending>,
    /// Each session's reply slots, by session.
    slots: Vec<Slots>,
    cfg: RpcClientConfig,
    rng: SmallRng,
    /// Responses that arrived after their request had timed out.
    late_responses: u64,
    /// Responses whose payload came one-sided into a reply slot.
    out_of_line_responses: u64,
}

impl RpcClient {
    /// Connects to a server with `server_threads` threads: one session to
    /// each thread for `Random` affinity, one to `client_id % threads` for
    /// `Modulo`.
    pub fn connect(
        addr: &str,
        server_threads: usize,
        cfg: RpcClientConfig,
    ) -> Result<RpcClient, RpcError> {
        if cfg.credits == 0 || cfg.credits > SESSION_CREDITS_MAX || server_threads == 0 {
            return Err(RpcError::Invalid(format!(
                "credits must be 1..={SESSION_CREDITS_MAX} and server threads at least 1"
            )));
        }
        let targets: Vec<usize> = match cfg.affinity {
            Affinity::Random => (0..server_threads).collect(),
            Affinity::Modulo => vec![crate::worker::modulo(cfg.client_id, server_threads)],
        };
        let mut sessions = Vec::with_capacity(targets.len());
        for t in targets {
            let ep = fabrickv_transport::connect(addr, t as u16, cfg.timeout)?;
            sessions.push(Session::new(ep, t as u16));
        }
        let mut sessions = Sessions::new(sessions, cfg.credits, cfg.timeout);
        let mut slots: Vec<Slots> = (0..sessions.len()).map(|_| Slots::default()).collect();
        if cfg.reply_slot_bytes > 0 {
            for (s, sl) in sessions.all().iter_mut().zip(&mut slots) {
                offer_reply_slots(s, sl, &cfg)?;
            }
        }
        let rng = SmallRng::seed_from_u64(0xC0FFEE ^ cfg.client_id as u64);
        Ok(RpcClient {
            sessions,
            slots,
            cfg,
            rng,
            late_responses: 0,
            out_of_line_responses: 0,
        })
    }

    /// Requests in flight over all sessions.
    pub fn in_flight(&self) -> usize {
        self.sessions.in_flight()
    }

    /// Responses whose payload arrived one-sided in a reply slot.
    pub fn out_of_line_responses(&self) -> u64 {
        self.out_of_line_responses
    }

    /// Whether every session got reply slots (the transport registers
    /// memory and the server accepted them).
    pub fn has_reply_slots(&self) -> bool {
        self.slots.iter().all(|s| s.region.is_some())
    }

    /// Responses dropped because their request had already timed out.
    pub fn late_responses(&self) -> u64 {
        self.late_responses
    }

    /// Queues a request; it leaves at the next [`RpcClient::flush`].
    /// Fails with `NoCredits` when the chosen session is full.
    pub fn call_async(&mut self, req_type: u16, payload: &[u8]) -> Result<u64, RpcError> {
        if usize::from(req_type) >= REQ_TYPES_MAX {
            return Err(RpcError::Invalid(format!(
                "request type {req_type} is not below {REQ_TYPES_MAX}"
            )));
        }
        let s = match self.cfg.affinity {
            Affinity::Modulo => 0,
            Affinity::Random => self.rng.gen_range(0..self.sessions.len()),
        };
        let free = &mut self.slots[s].free;
        let slot = free.pop().unwrap_or(NO_SLOT);
        let now = Instant::now();
        let pending = Pending {
            sent: now,
            deadline: now + self.cfg.timeout,
            slot,
        };
        let posted = self.sessions.post(s, pending, |b, id, _| {
            RpcHeader {
                response: false,
                req_type,
                status: RpcStatus::Ok,
                request_id: id,
                slot,
                out_of_line: false,
            }
            .encode(b);
            b.extend_from_slice(payload);
        });
        if posted.is_err() {
            release(free, slot);
        }
        posted
    }

    /// Sends every queued request.
    pub fn flush(&mut self) -> Result<(), RpcError> {
        self.sessions.flush()
    }

    /// Completes every request whose response has arrived or whose
    /// deadline has passed; returns how many.
    pub fn poll(&mut self, on_done: &mut dyn FnMut(Completion<'_>)) -> Result<usize, RpcError> {
        let mut done = 0;
        let mut late = 0;
        let mut out_of_line: Vec<OutOfLine> = Vec::new();
        let mut ool = 0;
        for (s, sl) in self.sessions.all().iter_mut().zip(&mut self.slots) {
            if s.is_idle() {
                continue;
            }
            let free_slots = &mut sl.free;
            out_of_line.clear();
            s.poll(usize::MAX, |msg, in_flight| {
                let Some((h, payload)) = RpcHeader::decode(msg).filter(|(h, _)| h.response) else {
                    late += 1;
                    return;
                };
                // Responses come in request order; an older entry still
                // here was completed by its timeout, never by a response.
                let Some(p) = in_flight
                    .complete_after_given_up(h.request_id, |p| release(free_slots, p.tag.slot))
                else {
                    late += 1;
                    return;
                };
                let (latency, slot) = (p.tag.sent.elapsed(), p.tag.slot);
                done += 1;
                if h.out_of_line && h.slot == slot && payload.len() == 4 {
                    let len = u32::from_le_bytes([payload[0], payload[1], payload[2], payload[3]])
                        as usize;
                    out_of_line.push(OutOfLine {
                        id: h.request_id,
                        slot,
                        len,
                        latency,
                    });
                    return;
                }
                release(free_slots, slot);
                let status = if h.out_of_line {
                    RpcStatus::Malformed
                } else {
                    h.status
                };
                on_done(Completion {
                    request_id: h.request_id,
                    status,
                    payload,
                    latency,
                });
            })?;
            for o in out_of_line.drain(..) {
                let start = usize::from(o.slot) * sl.slot_bytes;
                let bytes = match sl.region {
                    Some(r) if o.len <= sl.slot_bytes => s
                        .endpoint()
                        .local_region(&r)
                        .ok()
                        .and_then(|b| b.get(start..start + o.len)),
                    _ => None,
                };
                let (status, payload) = match bytes {
                    Some(b) => (RpcStatus::Ok, b),
                    None => (RpcStatus::Malformed, &[][..]),
                };
                on_done(Completion {
                    request_id: o.id,
                    status,
                    payload,
                    latency: o.latency,
                });
                release(&mut sl.free, o.slot);
                ool += 1;
            }
            let now = Instant::now();
            let q = s.queue_mut();
            while let Some(p) = q.front() {
                if p.tag.deadline > now {
                    break;
                }
                let (id, latency, slot) = (p.id, now - p.tag.sent, p.tag.slot);
                q.pop();
                release(&mut sl.free, slot);
                done += 1;
                on_done(Completion {
                    request_id: id,
                    status: RpcStatus::Timeout,
                    payload: &[],
                    latency,
                });
            }
        }
        self.late_responses += late;
        self.out_of_line_responses += ool;
        Ok(done)
    }

    /// Blocks until a response may have arrived or `timeout` passes.
    pub fn wait(&mut self, timeout: Duration) -> Result<(), RpcError> {
        let oldest = self
            .sessions
            .all()
            .iter_mut()
            .filter_map(|s| s.queue().front().map(|p| p.tag.deadline).map(|d| (d, s)))
            .min_by_key(|(d, _)| *d);
        if let Some((deadline, s)) = oldest {
            let left = deadline.saturating_duration_since(Instant::now());
            s.endpoint()
                .wait(timeout.min(left).max(Duration::from_micros(1)))?;
        }
        Ok(())
    }

    /// One blocking call: send, then wait for its response or its deadline.
    pub fn call(&mut self, req_type: u16, payload: &[u8]) -> Result<Vec<u8>, RpcError> {
        let id = self.call_async(req_type, payload)?;
        self.flush()?;
        loop {
            let mut result: Option<Result<Vec<u8>, RpcError>> = None;
            self.poll(&mut |c| {
                if c.request_id == id {
                    result = Some(match c.status {
                        RpcStatus::Ok => Ok(c.payload.to_vec()),
                        RpcStatus::Timeout => Err(RpcError::Timeout),
                        s => Err(RpcError::Status(s)),
                    });
                }
            })?;
            if let Some(r) = result {
                return r;
            }
            self.wait(self.cfg.timeout)?;
        }
    }
}
