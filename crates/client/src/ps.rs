//! The embedding (parameter server) client: PetPS's pull, push and
//! outstanding-request API over one connection.
//!
//! A [`PsClient`] owns one connection to one server worker (any worker
//! serves any key of a table). Where the transport can register memory
//! (shm, fabric), it registers a receive region once and every pull names
//! a slot of it: the server writes the vectors there one-sided and then
//! sends a short reply. Elsewhere (tcp, inproc) the vectors travel in the
//! reply and are landed into the destination by the client (the tcp
//! emulation of a one-sided write). Either way the *reply message* is what
//! completes a request, never a marker inside the data, so no stored value
//! can look like a completion (PetPS's magic-word scheme could).
//!
//! Several pulls may be outstanding ([`PsClient::pull_async`]); each has a
//! [`PullId`] the caller can poll ([`PsClient::is_done`]), wait on
//! ([`PsClient::wait`]) or cancel ([`PsClient::cancel`]). A pull larger
//! than one request (`PS_KEYS_PER_REQUEST_MAX` keys, or a frame's worth of
//! vectors) is split into several requests and completes when all have.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::AtomicUsize;
use std::time::{Duration, Instant};

use fabrickv_transport::{Endpoint, RemoteRegion, TransportError};
use fabrickv_types::ErrorCode;
use fabrickv_wire::control::decode_error;
use fabrickv_wire::ps::{
    bitmap_bytes, decode_desc, decode_list, decode_reply, encode_create, encode_list, encode_open,
    encode_pull, encode_push, pull_keys_per_frame, push_keys_per_frame, PsOp, PullDest, PushMode,
    TableDesc, TableSpec,
};
use fabrickv_wire::{decode_frame, FrameKind};

use crate::{ClientError, Result, DEFAULT_TIMEOUT};

/// Bytes of the receive region a client registers for one-sided pulls
/// (64 MiB: 16 outstanding pulls of 512 vectors of 8 KiB). Pages are
/// touched only as pulls use them. A pull that finds no room travels
/// inline instead.
pub const PS_REGION_BYTES: usize = 64 << 20;

/// Alignment of each pull's slot in the region, in bytes (a cache line).
pub const PS_SLOT_ALIGN_BYTES: usize = 64;

/// Most pulls one client keeps outstanding; `pull_async` beyond this
/// first completes the oldest.
pub const PS_OUTSTANDING_PULLS_MAX: usize = 256;

const _: () = assert!(
    cfg!(target_endian = "little"),
    "vectors are little-endian f32"
);

/// Picks the worker of each new client, round robin over the process.
static NEXT_WORKER: AtomicUsize = AtomicUsize::new(0);

/// Identifies an outstanding pull.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PullId(u64);

impl PullId {
    /// The id as a number (for logs and foreign bindings).
    pub fn get(self) -> u64 {
        self.0
    }

    /// An id from [`PullId::get`].
    pub fn from_raw(v: u64) -> PullId {
        PullId(v)
    }
}

/// A completed pull: `keys.len() x dim` floats in request order, and which
/// keys the table held (absent keys got the table's missing-key policy).
#[derive(Debug, Clone, PartialEq)]
pub struct Pulled {
    /// The vectors, row-major.
    pub values: Vec<f32>,
    /// Per key: whether the table held it.
    pub found: Vec<bool>,
}

/// First-fit allocator of slots in the receive region.
#[derive(Debug)]
struct SlotAlloc {
    /// Free extents (offset, length), sorted by offset, never adjacent.
    free: Vec<(usize, usize)>,
}

impl SlotAlloc {
    fn new(len: usize) -> SlotAlloc {
        SlotAlloc {
            free: vec![(0, len)],
        }
    }

    fn alloc(&mut self, len: usize) -> Option<usize> {
        let len = len.div_ceil(PS_SLOT_ALIGN_BYTES) * PS_SLOT_ALIGN_BYTES;
        let i = self.free.iter().position(|&(_, l)| l >= len)?;
        let (off, l) = self.free[i];
        if l == len {
            self.free.remove(i);
        } else {
            self.free[i] = (off + len, l - len);
        }
        Some(off)
    }

    fn free(&mut self, off: usize, len: usize) {
        let len = len.div_ceil(PS_SLOT_ALIGN_BYTES) * PS_SLOT_ALIGN_BYTES;
        let i = self.free.partition_point(|&(o, _)| o < off);
        self.free.insert(i, (off, len));
        // Merge with the next, then with the previous.
        if i + 1 < self.free.len() && self.free[i].0 + self.free[i].1 == self.free[i + 1].0 {
            self.free[i].1 += self.free[i + 1].1;
            self.free.remove(i + 1);
        }
        if i > 0 && self.free[i - 1].0 + self.free[i - 1].1 == self.free[i].0 {
            self.free[i - 1].1 += self.free[i].1;
            self.free.remove(i);
        }
    }
}

/// Where a pull's vectors land.
#[derive(Debug, Clone, Copy)]
enum Landing {
    /// In the reply, copied by the client into `values`.
    Inline,
    /// One-sided into the region at this offset (whole pull, contiguous).
    Region(usize),
}

/// One outstanding pull.
#[derive(Debug)]
struct PullState {
    dim: usize,
    keys: usize,
    landing: Landing,
    /// Inline landing: the vectors as they arrive.
    values: Vec<f32>,
    found: Vec<bool>,
    requests_left: usize,
    error: Option<ClientError>,
    cancelled: bool,
}

/// A request on the wire, in send order (replies come back in this order).
#[derive(Debug, Clone, Copy)]
enum InFlight {
    /// Part of a pull: its keys start at `first` within the pull.
    Pull { req: u64, pull: u64, first: usize },
    /// Any other request; its reply is stashed for the caller.
    Other { req: u64 },
}

/// A client of the embedding tables on one server worker.
pub struct PsClient {
    ep: Box<dyn Endpoint>,
    worker: u16,
    timeout: Duration,
    next_id: u64,
    region: Option<(RemoteRegion, SlotAlloc)>,
    in_flight: VecDeque<InFlight>,
    pulls: HashMap<u64, PullState>,
    /// Replies to `Other` requests, by request id.
    stashed: HashMap<u64, Result<Vec<u8>>>,
    /// Encoding scratch.
    scratch: Vec<u8>,
}

impl std::fmt::Debug for PsClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PsClient")
            .field("worker", &self.worker)
            .field("one_sided", &self.one_sided())
            .field("outstanding", &self.pulls.len())
            .finish()
    }
}

impl PsClient {
    /// Connects to the server at `addr` with [`DEFAULT_TIMEOUT`].
    pub fn connect(addr: &str) -> Result<PsClient> {
        PsClient::connect_with_timeout(addr, DEFAULT_TIMEOUT)
    }

    /// Connects with a timeout for connecting and for each call. Clients of
    /// one process spread over the server's workers, round robin.
    pub fn connect_with_timeout(addr: &str, timeout: Duration) -> Result<PsClient> {
        let (ep, worker) = crate::connect_in_turn(addr, timeout, &NEXT_WORKER)?;
        PsClient::on_endpoint(ep, worker, timeout)
    }

    /// Connects to worker `worker` of the server at `addr`, whatever the
    /// turn: a client thread pinned beside a pinned worker (the server's
    /// `--worker-cpus`) talks to that worker, and over shm reads what it
    /// pulled from its own core's cache. A worker the server does not have
    /// is refused at the handshake (`UNAVAILABLE`, with the server's
    /// worker count in the message).
    pub fn connect_worker(addr: &str, worker: u16, timeout: Duration) -> Result<PsClient> {
        let ep = fabrickv_transport::connect(addr, worker, timeout)?;
        PsClient::on_endpoint(ep, worker, timeout)
    }

    /// A client over an endpoint already connected to `worker`. Registers
    /// the receive region where the transport can.
    pub fn on_endpoint(
        mut ep: Box<dyn Endpoint>,
        worker: u16,
        timeout: Duration,
    ) -> Result<PsClient> {
        let region = match ep.register(PS_REGION_BYTES) {
            Ok(r) => Some((r, SlotAlloc::new(PS_REGION_BYTES))),
            Err(TransportError::Unsupported(_)) => None,
            Err(e) => return Err(e.into()),
        };
        Ok(PsClient {
            ep,
            worker,
            timeout,
            next_id: 1,
            region,
            in_flight: VecDeque::new(),
            pulls: HashMap::new(),
            stashed: HashMap::new(),
            scratch: Vec::new(),
        })
    }

    /// Whether pulls land one-sided in a registered region.
    pub fn one_sided(&self) -> bool {
        self.region.is_some()
    }

    /// The server worker this client talks to.
    pub fn worker(&self) -> u16 {
        self.worker
    }

    fn next_request_id(&mut self) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        id
    }

    /// Sends one request built by `build` and waits for its reply body.
    fn call(&mut self, build: impl FnOnce(&mut Vec<u8>, u64, u16)) -> Result<Vec<u8>> {
        let req = self.next_request_id();
        self.scratch.clear();
        build(&mut self.scratch, req, self.worker);
        let msg = std::mem::take(&mut self.scratch);
        let posted = self.ep.post(&msg);
        self.scratch = msg;
        posted?;
        self.ep.flush(self.timeout)?;
        self.in_flight.push_back(InFlight::Other { req });
        let deadline = Instant::now() + self.timeout;
        loop {
            if let Some(r) = self.stashed.remove(&req) {
                return r;
            }
            self.drive(deadline)?;
        }
    }

    /// Creates a table (or opens it if it exists with the same shape).
    pub fn create_table(&mut self, spec: &TableSpec) -> Result<TableDesc> {
        spec.validate()
            .map_err(|(code, why)| ClientError::Invalid(code, why))?;
        let body = self.call(|b, id, w| encode_create(b, id, w, spec))?;
        desc_of(&body)
    }

    /// Opens an existing table by name.
    pub fn open_table(&mut self, name: &str) -> Result<TableDesc> {
        let body = self.call(|b, id, w| encode_open(b, id, w, name))?;
        desc_of(&body)
    }

    /// Every table, with its item count.
    pub fn tables(&mut self) -> Result<Vec<TableDesc>> {
        let body = self.call(encode_list)?;
        let f = decode_frame(&body).map_err(|e| ClientError::Protocol(e.to_string()))?;
        let r = decode_reply(&f).map_err(|e| ClientError::Protocol(e.to_string()))?;
        decode_list(r.rest).map_err(|e| ClientError::Protocol(e.to_string()))
    }

    /// Starts a pull of `keys` from table `t`; returns at once with an id
    /// to poll, wait on or cancel.
    pub fn pull_async(&mut self, t: &TableDesc, keys: &[u64]) -> Result<PullId> {
        while self.pulls.len() >= PS_OUTSTANDING_PULLS_MAX {
            let oldest = self.pulls.keys().min().copied();
            if let Some(id) = oldest {
                let deadline = Instant::now() + self.timeout;
                while !self.pull_finished(id) {
                    self.drive(deadline)?;
                }
                if self.pulls.get(&id).is_some_and(|p| p.cancelled) {
                    self.pulls.remove(&id);
                }
                break;
            }
        }
        let dim = t.spec.dim as usize;
        let vb = dim * 4;
        let total = keys.len() * vb;
        let landing = match &mut self.region {
            Some((_, alloc)) if total > 0 => {
                alloc.alloc(total).map_or(Landing::Inline, Landing::Region)
            }
            _ => Landing::Inline,
        };
        let pull = self.next_request_id();
        let per = pull_keys_per_frame(t.spec.dim);
        let chunks = keys.len().div_ceil(per).max(1);
        let values = match landing {
            Landing::Inline => vec![0f32; keys.len() * dim],
            Landing::Region(_) => Vec::new(),
        };
        self.pulls.insert(
            pull,
            PullState {
                dim,
                keys: keys.len(),
                landing,
                values,
                found: vec![false; keys.len()],
                requests_left: chunks,
                error: None,
                cancelled: false,
            },
        );
        let region = self.region.as_ref().map(|(r, _)| *r);
        for c in 0..chunks {
            let first = c * per;
            let part = &keys[first.min(keys.len())..(first + per).min(keys.len())];
            let req = self.next_request_id();
            let dest = match (landing, region) {
                (Landing::Region(off), Some(r)) => {
                    let mut enc = Vec::with_capacity(RemoteRegion::ENCODED_BYTES);
                    r.encode(&mut enc);
                    let mut region = [0u8; 24];
                    region.copy_from_slice(&enc);
                    Some(PullDest {
                        region,
                        offset: (off + first * vb) as u64,
                    })
                }
                _ => None,
            };
            let w = self.worker;
            let tid = t.id;
            if let Err(e) = self
                .ep
                .post_with(&mut |b| encode_pull(b, req, w, tid, part, dest.as_ref()))
            {
                self.fail_pull(pull, chunks - c);
                return Err(e.into());
            }
            self.in_flight
                .push_back(InFlight::Pull { req, pull, first });
        }
        self.ep.flush(self.timeout)?;
        Ok(PullId(pull))
    }

    /// A pull whose requests could not all be posted: it completes with an
    /// error once the posted ones are answered.
    fn fail_pull(&mut self, pull: u64, unposted: usize) {
        if let Some(p) = self.pulls.get_mut(&pull) {
            p.requests_left -= unposted;
            p.error = Some(ClientError::Protocol("pull could not be posted".into()));
        }
    }

    fn pull_finished(&self, id: u64) -> bool {
        self.pulls.get(&id).is_none_or(|p| p.requests_left == 0)
    }

    /// Whether pull `id` has completed (PetPS's QueryRPCFinished). Reads
    /// whatever replies have arrived, without blocking.
    pub fn is_done(&mut self, id: PullId) -> Result<bool> {
        self.pump()?;
        match self.pulls.get(&id.0) {
            Some(p) if !p.cancelled => Ok(p.requests_left == 0),
            _ => Err(unknown_pull(id)),
        }
    }

    /// Waits for pull `id` and returns its vectors (PetPS's WaitRPCFinish).
    pub fn wait(&mut self, id: PullId) -> Result<Pulled> {
        self.wait_with(id, |state, region| {
            let values = match (state.landing, region) {
                (Landing::Region(off), Some(bytes)) => {
                    let mut v = vec![0f32; state.keys * state.dim];
                    bytemuck::cast_slice_mut::<f32, u8>(&mut v)
                        .copy_from_slice(&bytes[off..off + state.keys * state.dim * 4]);
                    v
                }
                _ => std::mem::take(&mut state.values),
            };
            Pulled {
                values,
                found: std::mem::take(&mut state.found),
            }
        })
    }

    /// Waits for pull `id` and copies its vectors into `out` (keys x dim
    /// floats); returns how many keys the table held. `found`, if given,
    /// receives the per-key flags.
    pub fn wait_into(
        &mut self,
        id: PullId,
        out: &mut [f32],
        found: Option<&mut [bool]>,
    ) -> Result<usize> {
        self.wait_with(id, |state, region| {
            let n = state.keys * state.dim;
            if out.len() != n {
                return Err(ClientError::Invalid(
                    ErrorCode::BadDimension,
                    format!("output holds {} floats; the pull has {n}", out.len()),
                ));
            }
            match (state.landing, region) {
                (Landing::Region(off), Some(bytes)) => {
                    bytemuck::cast_slice_mut::<f32, u8>(out)
                        .copy_from_slice(&bytes[off..off + n * 4]);
                }
                _ => out.copy_from_slice(&state.values[..n]),
            }
            if let Some(f) = found {
                let m = f.len().min(state.found.len());
                f[..m].copy_from_slice(&state.found[..m]);
            }
            Ok(state.found.iter().filter(|x| **x).count())
        })?
    }

    /// Waits for pull `id`, then lends its vectors (as little-endian f32
    /// bytes, request order) and found flags to `f` without copying them:
    /// in place in the registered region where the pull was one-sided.
    pub fn wait_view<T>(&mut self, id: PullId, f: impl FnOnce(&[u8], &[bool]) -> T) -> Result<T> {
        self.wait_with(id, |state, region| {
            let n = state.keys * state.dim * 4;
            match (state.landing, region) {
                (Landing::Region(off), Some(bytes)) => f(&bytes[off..off + n], &state.found),
                _ => f(bytemuck::cast_slice(&state.values[..]), &state.found),
            }
        })
    }

    fn wait_with<T>(
        &mut self,
        id: PullId,
        f: impl FnOnce(&mut PullState, Option<&[u8]>) -> T,
    ) -> Result<T> {
        match self.pulls.get(&id.0) {
            Some(p) if !p.cancelled => {}
            _ => return Err(unknown_pull(id)),
        }
        let deadline = Instant::now() + self.timeout;
        while !self.pull_finished(id.0) {
            self.drive(deadline)?;
        }
        let mut state = self.pulls.remove(&id.0).ok_or_else(|| unknown_pull(id))?;
        if let Landing::Region(off) = state.landing {
            if let Some((_, alloc)) = &mut self.region {
                alloc.free(off, state.keys * state.dim * 4);
            }
        }
        if let Some(e) = state.error.take() {
            return Err(e);
        }
        let region = match (&self.region, state.landing) {
            (Some((r, _)), Landing::Region(_)) => Some(*r),
            _ => None,
        };
        match region {
            Some(r) => {
                let bytes = self.ep.local_region(&r)?;
                Ok(f(&mut state, Some(bytes)))
            }
            None => Ok(f(&mut state, None)),
        }
    }

    /// Gives up on pull `id` (PetPS's RevokeRPCResource). Its slot of the
    /// region is freed only once the server's reply has arrived, since the
    /// server may still be writing it.
    pub fn cancel(&mut self, id: PullId) -> Result<()> {
        match self.pulls.get_mut(&id.0) {
            Some(p) if !p.cancelled => {
                p.cancelled = true;
                p.values = Vec::new();
            }
            _ => return Err(unknown_pull(id)),
        }
        self.reap(id.0);
        Ok(())
    }

    /// Drops a cancelled pull once all its replies are in.
    fn reap(&mut self, pull: u64) {
        let done = self
            .pulls
            .get(&pull)
            .is_some_and(|p| p.cancelled && p.requests_left == 0);
        if !done {
            return;
        }
        if let Some(p) = self.pulls.remove(&pull) {
            if let (Landing::Region(off), Some((_, alloc))) = (p.landing, &mut self.region) {
                alloc.free(off, p.keys * p.dim * 4);
            }
        }
    }

    /// Pulls `keys` into `out` (`keys.len() * dim` floats); returns how
    /// many keys the table held.
    pub fn pull_into(
        &mut self,
        t: &TableDesc,
        keys: &[u64],
        out: &mut [f32],
        found: Option<&mut [bool]>,
    ) -> Result<usize> {
        check_len(out.len(), keys.len(), t.spec.dim, "output")?;
        let id = self.pull_async(t, keys)?;
        self.wait_into(id, out, found)
    }

    /// Pulls `keys`, returning fresh vectors.
    pub fn pull(&mut self, t: &TableDesc, keys: &[u64]) -> Result<Pulled> {
        let id = self.pull_async(t, keys)?;
        self.wait(id)
    }

    /// Stores `values` (`keys.len() * dim` floats) as the keys' vectors.
    pub fn put(&mut self, t: &TableDesc, keys: &[u64], values: &[f32]) -> Result<()> {
        self.push_mode(t, keys, values, PushMode::Overwrite)
    }

    /// Applies `grads` (`keys.len() * dim` floats) with the table's
    /// optimizer, atomically per key.
    pub fn push(&mut self, t: &TableDesc, keys: &[u64], grads: &[f32]) -> Result<()> {
        self.push_mode(t, keys, grads, PushMode::Gradient)
    }

    fn push_mode(
        &mut self,
        t: &TableDesc,
        keys: &[u64],
        values: &[f32],
        mode: PushMode,
    ) -> Result<()> {
        let pending = self.push_post(t, keys, values, mode)?;
        self.push_collect(pending, Instant::now() + self.timeout)
    }

    /// The post phase of a put or push: posts every frame and flushes,
    /// without waiting for a reply (the cluster client posts to every
    /// server before it collects from any).
    pub(crate) fn push_post(
        &mut self,
        t: &TableDesc,
        keys: &[u64],
        values: &[f32],
        mode: PushMode,
    ) -> Result<PendingPush> {
        check_len(values.len(), keys.len(), t.spec.dim, "values")?;
        let dim = t.spec.dim as usize;
        let per = push_keys_per_frame(t.spec.dim);
        let mut reqs = Vec::with_capacity(keys.len().div_ceil(per));
        for (ci, chunk) in keys.chunks(per).enumerate() {
            let req = self.next_request_id();
            let vals = &values[ci * per * dim..(ci * per + chunk.len()) * dim];
            let (w, tid) = (self.worker, t.id);
            self.ep
                .post_with(&mut |b| encode_push(b, req, w, tid, mode, chunk, vals))?;
            self.in_flight.push_back(InFlight::Other { req });
            reqs.push((req, chunk.len()));
        }
        self.ep.flush(self.timeout)?;
        Ok(PendingPush {
            reqs,
            keys: keys.len(),
        })
    }

    /// The collect phase of a put or push: every reply, by `deadline`;
    /// the first refusal, if any, after all are in.
    pub(crate) fn push_collect(&mut self, pending: PendingPush, deadline: Instant) -> Result<()> {
        let mut first_err = None;
        let mut applied_before = 0usize;
        for (req, n) in pending.reqs {
            let body = loop {
                if let Some(r) = self.stashed.remove(&req) {
                    break r;
                }
                self.drive(deadline)?;
            };
            let outcome = body.and_then(|b| {
                let f = decode_frame(&b).map_err(|e| ClientError::Protocol(e.to_string()))?;
                let r = decode_reply(&f).map_err(|e| ClientError::Protocol(e.to_string()))?;
                let applied = r
                    .rest
                    .get(..4)
                    .map_or(0, |a| u32::from_le_bytes([a[0], a[1], a[2], a[3]]) as usize);
                if r.status == ErrorCode::Ok && applied == n {
                    Ok(())
                } else {
                    Err(ClientError::Server {
                        code: r.status,
                        message: format!(
                            "{} of {} keys applied before the failure",
                            applied_before + applied,
                            pending.keys
                        ),
                    })
                }
            });
            match outcome {
                Ok(()) => applied_before += n,
                Err(e) => {
                    if first_err.is_none() {
                        first_err = Some(e);
                    }
                }
            }
        }
        first_err.map_or(Ok(()), Err)
    }

    /// The per-call timeout.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Handles whatever replies have arrived, in place (no copy), without
    /// blocking; returns how many.
    fn pump(&mut self) -> Result<usize> {
        let mut err = None;
        let mut got = 0;
        let mut st = ReplyState {
            in_flight: &mut self.in_flight,
            pulls: &mut self.pulls,
            stashed: &mut self.stashed,
        };
        self.ep.poll(usize::MAX, &mut |m| {
            got += 1;
            if err.is_none() {
                if let Err(e) = st.on_reply(m) {
                    err = Some(e);
                }
            }
        })?;
        if let Some(e) = err {
            return Err(e);
        }
        if got > 0 {
            self.reap_all();
        }
        Ok(got)
    }

    /// Handles at least one reply, waiting for it until `deadline`.
    fn drive(&mut self, deadline: Instant) -> Result<()> {
        loop {
            if self.pump()? > 0 {
                return Ok(());
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(ClientError::Timeout);
            }
            self.ep.wait(left)?;
        }
    }

    fn reap_all(&mut self) {
        let done: Vec<u64> = self
            .pulls
            .iter()
            .filter(|(_, p)| p.cancelled && p.requests_left == 0)
            .map(|(k, _)| *k)
            .collect();
        for id in done {
            self.reap(id);
        }
    }
}

/// A put or push whose frames are posted: request ids with their key
/// counts, and the keys in all.
#[derive(Debug)]
pub(crate) struct PendingPush {
    reqs: Vec<(u64, usize)>,
    keys: usize,
}

/// The parts of a client that replies update.
struct ReplyState<'a> {
    in_flight: &'a mut VecDeque<InFlight>,
    pulls: &'a mut HashMap<u64, PullState>,
    stashed: &'a mut HashMap<u64, Result<Vec<u8>>>,
}

impl ReplyState<'_> {
    fn on_reply(&mut self, m: &[u8]) -> Result<()> {
        let frame = decode_frame(m).map_err(|e| ClientError::Protocol(e.to_string()))?;
        let Some(next) = self.in_flight.pop_front() else {
            return Err(ClientError::Protocol("a reply to no request".into()));
        };
        let (req, pull) = match next {
            InFlight::Pull { req, pull, first } => (req, Some((pull, first))),
            InFlight::Other { req } => (req, None),
        };
        if frame.header.request_id != req {
            return Err(ClientError::Protocol(format!(
                "reply {} out of order (expected {req})",
                frame.header.request_id
            )));
        }
        let server_error = |frame: &fabrickv_wire::Frame<'_>| match decode_error(frame) {
            Ok((code, message)) => ClientError::Server { code, message },
            Err(e) => ClientError::Protocol(e.to_string()),
        };
        let Some((pull, first)) = pull else {
            let r = if frame.header.kind == FrameKind::Error {
                Err(server_error(&frame))
            } else {
                Ok(m.to_vec())
            };
            self.stashed.insert(req, r);
            return Ok(());
        };
        let Some(p) = self.pulls.get_mut(&pull) else {
            return Err(ClientError::Protocol("a reply to an unknown pull".into()));
        };
        p.requests_left -= 1;
        if p.cancelled {
            return Ok(());
        }
        if frame.header.kind == FrameKind::Error {
            p.error.get_or_insert(server_error(&frame));
            return Ok(());
        }
        let r = decode_reply(&frame).map_err(|e| ClientError::Protocol(e.to_string()))?;
        let n = r.n;
        let bm = bitmap_bytes(n);
        let inline = matches!(p.landing, Landing::Inline);
        let want = bm + if inline { n * p.dim * 4 } else { 0 };
        if r.op != PsOp::Pull || r.rest.len() != want || first + n > p.keys {
            p.error.get_or_insert(ClientError::Protocol(
                "pull reply of the wrong shape".into(),
            ));
            return Ok(());
        }
        for i in 0..n {
            p.found[first + i] = r.rest[i / 8] & (1 << (i % 8)) != 0;
        }
        if inline {
            let dst = &mut p.values[first * p.dim..(first + n) * p.dim];
            bytemuck::cast_slice_mut::<f32, u8>(dst).copy_from_slice(&r.rest[bm..]);
        }
        Ok(())
    }
}

/// Keys per preload or verify request: PetPS's batch size.
pub const PS_LOAD_BATCH_KEYS: usize = 500;

/// Requests a preload keeps in flight.
pub const PS_LOAD_WINDOW: usize = 8;

/// What a verify pass found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct VerifyReport {
    /// Keys checked.
    pub checked: u64,
    /// Keys the table did not hold.
    pub missing: u64,
    /// Keys whose vector differed from the initializer.
    pub wrong: u64,
    /// The first few failing keys, for the report.
    pub first_failures: Vec<u64>,
}

/// Failing keys a [`VerifyReport`] lists.
pub const VERIFY_FAILURES_LISTED: usize = 10;

impl VerifyReport {
    /// Whether every key was there with the expected vector.
    pub fn ok(&self) -> bool {
        self.missing == 0 && self.wrong == 0
    }
}

/// Takes the next at most `max` keys off the front of `rest` (the keys not
/// yet handled, as first and last, inclusive); `None` when none are left.
fn next_chunk(rest: &mut Option<(u64, u64)>, max: usize) -> Option<std::ops::RangeInclusive<u64>> {
    let (from, to) = (*rest)?;
    let last = from + (to - from).min(max as u64 - 1);
    *rest = (last < to).then(|| (last + 1, to));
    Some(from..=last)
}

/// The keys of `keys` as the state [`next_chunk`] takes them from.
fn range_state(keys: &std::ops::RangeInclusive<u64>) -> Option<(u64, u64)> {
    (!keys.is_empty()).then(|| (*keys.start(), *keys.end()))
}

/// Stores, for every key in `keys`, the vector `fill` writes for it,
/// [`PS_LOAD_WINDOW`] requests of [`PS_LOAD_BATCH_KEYS`] at a time, calling
/// `progress` with the keys done so far.
pub fn put_range(
    c: &mut PsClient,
    t: &TableDesc,
    keys: std::ops::RangeInclusive<u64>,
    mut fill: impl FnMut(u64, &mut [f32]),
    mut progress: impl FnMut(u64),
) -> Result<()> {
    let dim = t.spec.dim as usize;
    let mut batch_keys = Vec::with_capacity(PS_LOAD_BATCH_KEYS * PS_LOAD_WINDOW);
    let mut values = Vec::new();
    let mut done = 0u64;
    let mut rest = range_state(&keys);
    while let Some(chunk) = next_chunk(&mut rest, PS_LOAD_BATCH_KEYS * PS_LOAD_WINDOW) {
        batch_keys.clear();
        batch_keys.extend(chunk);
        values.resize(batch_keys.len() * dim, 0.0);
        for (i, k) in batch_keys.iter().enumerate() {
            fill(*k, &mut values[i * dim..(i + 1) * dim]);
        }
        // One call posts every frame of the window before waiting.
        c.put(t, &batch_keys, &values)?;
        done += batch_keys.len() as u64;
        progress(done);
    }
    Ok(())
}

/// Stores the deterministic initial vector of every key in `keys` (PetPS's
/// preload of 1..N), calling `progress` with the keys done so far.
pub fn preload(
    c: &mut PsClient,
    t: &TableDesc,
    keys: std::ops::RangeInclusive<u64>,
    progress: impl FnMut(u64),
) -> Result<()> {
    let seed = t.spec.seed;
    put_range(
        c,
        t,
        keys,
        |k, v| fabrickv_wire::ps::init_vector(seed, k, v),
        progress,
    )
}

/// Pulls every key of `keys` and checks it against the initializer
/// (PetPS's `--check_after_preload`), calling `progress` as it goes.
pub fn verify(
    c: &mut PsClient,
    t: &TableDesc,
    keys: std::ops::RangeInclusive<u64>,
    mut progress: impl FnMut(u64),
) -> Result<VerifyReport> {
    let dim = t.spec.dim as usize;
    let mut report = VerifyReport::default();
    let mut want = vec![0f32; dim];
    // The keys not yet requested, and the pulls in flight with their keys.
    let mut rest = range_state(&keys);
    let mut in_flight: VecDeque<(PullId, Vec<u64>)> = VecDeque::new();
    let issue = |c: &mut PsClient,
                 rest: &mut Option<(u64, u64)>,
                 in_flight: &mut VecDeque<(PullId, Vec<u64>)>|
     -> Result<()> {
        if let Some(chunk) = next_chunk(rest, PS_LOAD_BATCH_KEYS) {
            let b: Vec<u64> = chunk.collect();
            in_flight.push_back((c.pull_async(t, &b)?, b));
        }
        Ok(())
    };
    for _ in 0..PS_LOAD_WINDOW {
        issue(c, &mut rest, &mut in_flight)?;
    }
    while let Some((id, b)) = in_flight.pop_front() {
        c.wait_view(id, |bytes, found| {
            for (i, k) in b.iter().enumerate() {
                report.checked += 1;
                let bad = if !found[i] {
                    report.missing += 1;
                    true
                } else {
                    fabrickv_wire::ps::init_vector(t.spec.seed, *k, &mut want);
                    let got: &[f32] = bytemuck::cast_slice(&bytes[i * dim * 4..(i + 1) * dim * 4]);
                    let wrong = got != &want[..];
                    report.wrong += u64::from(wrong);
                    wrong
                };
                if bad && report.first_failures.len() < VERIFY_FAILURES_LISTED {
                    report.first_failures.push(*k);
                }
            }
        })?;
        progress(report.checked);
        issue(c, &mut rest, &mut in_flight)?;
    }
    Ok(report)
}

fn desc_of(body: &[u8]) -> Result<TableDesc> {
    let f = decode_frame(body).map_err(|e| ClientError::Protocol(e.to_string()))?;
    let r = decode_reply(&f).map_err(|e| ClientError::Protocol(e.to_string()))?;
    decode_desc(r.rest)
        .map(|(d, _)| d)
        .map_err(|e| ClientError::Protocol(e.to_string()))
}

fn unknown_pull(id: PullId) -> ClientError {
    ClientError::Invalid(
        ErrorCode::Malformed,
        format!(
            "pull {} is not outstanding (done, cancelled or never started)",
            id.0
        ),
    )
}

fn check_len(got: usize, keys: usize, dim: u32, what: &str) -> Result<()> {
    let want = keys * dim as usize;
    if got != want {
        return Err(ClientError::Invalid(
            ErrorCode::BadDimension,
            format!("{what} holds {got} floats; {keys} keys x dim {dim} need {want}"),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_are_reused_and_merged() {
        let mut a = SlotAlloc::new(1024);
        let x = a.alloc(100).expect("room");
        let y = a.alloc(100).expect("room");
        let z = a.alloc(100).expect("room");
        assert_eq!((x, y, z), (0, 128, 256));
        a.free(y, 100);
        a.free(x, 100);
        assert_eq!(a.alloc(200), Some(0), "freed neighbours merge");
        a.free(0, 200);
        a.free(z, 100);
        assert_eq!(a.free, vec![(0, 1024)], "everything merges back");
        assert_eq!(a.alloc(2048), None);
    }
}
