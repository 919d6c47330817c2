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
//!
//! Layout: this file holds the client, its connection and how replies are
//! routed ([`ReplyState`]); [`pull`] the pulls and their waits; [`push`]
//! puts and pushes; [`slots`] the allocator of the receive region;
//! [`preload`] the bulk load and check of a key range (`fabrickv ps
//! preload`). Request ids, the requests in flight and their order, the
//! credits, the waits and the reply loop are the request layer's
//! (`fabrickv_rpc::Sessions`); every reply goes through one router
//! (`ReplyState::on_reply`). A call (`open_table`, a push) that times
//! out gives its requests up, and their late replies are dropped; a pull
//! waited for past its deadline is not given up: it stays outstanding,
//! to wait for again or cancel.

mod preload;
mod pull;
mod push;
pub(crate) use push::push_frames;
mod slots;

pub use preload::{
    preload, put_range, verify, VerifyReport, PS_LOAD_BATCH_KEYS, PS_LOAD_WINDOW,
    VERIFY_FAILURES_LISTED,
};
use slots::SlotAlloc;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use fabrickv_rpc::placement::Turns;
use fabrickv_rpc::Sent;
use fabrickv_transport::{Endpoint, RemoteRegion};
use fabrickv_types::ErrorCode;
use fabrickv_wire::ps::{
    bitmap_bytes, decode_desc, decode_list, decode_reply, encode_create, encode_list, encode_open,
    PsOp, TableDesc, TableSpec,
};
use fabrickv_wire::{decode_frame, FrameKind};

use crate::conn::{self, protocol, refusal, Conn, Connected, Workers};
use crate::{ClientError, Result, DEFAULT_TIMEOUT};

/// Bytes of the receive region a client registers for one-sided pulls
/// (64 MiB: 16 outstanding pulls of 512 vectors of 8 KiB). Pages are
/// touched only as pulls use them. A pull that finds no room travels
/// inline instead.
pub const PS_REGION_BYTES: usize = 64 << 20;

/// Longest a table CREATE is waited for, in milliseconds (10 minutes),
/// whatever the per-call timeout. The first CREATE builds the embedding
/// pool before it answers: it maps, zeroes, faults in and locks every
/// byte (`--dram-pool-gb`), which took over 8 s for 2 GiB on a loaded
/// 2-core host, so minutes for a large pool. A client that gave up after
/// the usual 5 s timed out while the table was created anyway.
pub const PS_CREATE_WAIT_MS: u64 = 600_000;

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
static TURNS: Turns = Turns::new();

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

/// Where a pull's vectors land.
#[derive(Debug, Clone, Copy)]
enum Landing {
    /// In the reply, copied by the client into `values`.
    Inline,
    /// In the reply, copied by the client straight into the caller's
    /// slice that [`PsClient::pull_into`] lends the reply loop while it
    /// waits (no `values`: one copy less, and no zeroing).
    Caller,
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

/// What a request in flight is (its tag in the request layer), so that its
/// reply can be applied.
#[derive(Debug, Clone, Copy, Default)]
enum PsReq {
    /// Part of a pull: its keys start at `first` within the pull.
    Pull { pull: u64, first: usize },
    /// Any other request; its reply is stashed for the caller.
    #[default]
    Other,
}

/// A client of the embedding tables on one server worker.
pub struct PsClient {
    /// The one session, to the client's worker: request ids, the requests
    /// in flight (each tagged with what its reply completes), credits.
    sessions: Conn<PsReq>,
    /// The registered receive region and its free slots, where the
    /// transport registers memory.
    region: Option<(RemoteRegion, SlotAlloc)>,
    /// Outstanding pulls, by pull id.
    pulls: HashMap<u64, PullState>,
    /// Replies to `Other` requests, by request id.
    stashed: HashMap<u64, Result<Vec<u8>>>,
}

impl std::fmt::Debug for PsClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PsClient")
            .field("worker", &self.worker())
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
        let c = conn::connect(addr, timeout, Workers::InTurn(&TURNS, 0), PS_REGION_BYTES)?;
        Ok(PsClient::of(c))
    }

    /// Connects to worker `worker` of the server at `addr`, whatever the
    /// turn: a client thread pinned beside a pinned worker (the server's
    /// `--worker-cpus`) talks to that worker, and over shm reads what it
    /// pulled from its own core's cache. A worker the server does not have
    /// is refused at the handshake (`UNAVAILABLE`, with the server's
    /// worker count in the message).
    pub fn connect_worker(addr: &str, worker: u16, timeout: Duration) -> Result<PsClient> {
        let c = conn::connect(addr, timeout, Workers::Worker(worker), PS_REGION_BYTES)?;
        Ok(PsClient::of(c))
    }

    /// A client over an endpoint already connected to `worker`. Registers
    /// the receive region where the transport can.
    pub fn on_endpoint(ep: Box<dyn Endpoint>, worker: u16, timeout: Duration) -> Result<PsClient> {
        Ok(PsClient::of(conn::over(
            ep,
            worker,
            timeout,
            PS_REGION_BYTES,
        )?))
    }

    /// A client over a connection made with its receive region.
    fn of(c: Connected<PsReq>) -> PsClient {
        PsClient {
            sessions: c.sessions,
            region: c.region.map(|r| (r, SlotAlloc::new(PS_REGION_BYTES))),
            pulls: HashMap::new(),
            stashed: HashMap::new(),
        }
    }

    /// Whether pulls land one-sided in a registered region.
    pub fn one_sided(&self) -> bool {
        self.region.is_some()
    }

    /// The server worker this client talks to.
    pub fn worker(&self) -> u16 {
        self.sessions.get(0).worker()
    }

    /// Sends one request built by `build` and waits for its reply body.
    fn call(&mut self, build: impl FnOnce(&mut Vec<u8>, u64, u16)) -> Result<Vec<u8>> {
        let wait = self.timeout();
        self.call_within(wait, build)
    }

    /// [`PsClient::call`], waiting up to `wait` for the reply. The
    /// replies to pulls that come first are applied on the way.
    fn call_within(
        &mut self,
        wait: Duration,
        build: impl FnOnce(&mut Vec<u8>, u64, u16),
    ) -> Result<Vec<u8>> {
        let mut build = Some(build);
        let req = self.sessions.post(0, PsReq::Other, |b, id, w| {
            if let Some(f) = build.take() {
                f(b, id, w);
            }
        })?;
        self.sessions.flush()?;
        self.await_reply(req, Instant::now() + wait)?
    }

    /// Waits until `deadline` for the reply to request `req` (an `Other`),
    /// applying the replies to pulls that come first. The outer error is
    /// the wait's (`req` is then given up); the inner one the reply's own
    /// (the server's refusal).
    fn await_reply(&mut self, req: u64, deadline: Instant) -> Result<Result<Vec<u8>>> {
        let (pulls, stashed) = (&mut self.pulls, &mut self.stashed);
        let r = self.sessions.wait_for(0, req, deadline, |m, sent| {
            ReplyState {
                pulls: &mut *pulls,
                stashed: &mut *stashed,
                caller: None,
            }
            .on_reply(m, sent)
        });
        self.reap_all();
        r?;
        self.stashed
            .remove(&req)
            .ok_or_else(|| protocol("the reply to a call was not kept"))
    }

    /// Creates a table (or opens it if it exists with the same shape),
    /// waiting for the server's answer up to [`PS_CREATE_WAIT_MS`] (or
    /// the per-call timeout, if longer).
    pub fn create_table(&mut self, spec: &TableSpec) -> Result<TableDesc> {
        let wait = Duration::from_millis(PS_CREATE_WAIT_MS).max(self.timeout());
        self.create_table_within(spec, wait)
    }

    /// [`PsClient::create_table`], waiting up to `wait` for the answer.
    pub fn create_table_within(&mut self, spec: &TableSpec, wait: Duration) -> Result<TableDesc> {
        spec.validate()
            .map_err(|(code, why)| ClientError::Invalid(code, why))?;
        let body = self.call_within(wait, |b, id, w| encode_create(b, id, w, spec))?;
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
        let f = decode_frame(&body).map_err(protocol)?;
        let r = decode_reply(&f).map_err(protocol)?;
        decode_list(r.rest).map_err(protocol)
    }
}

impl PsClient {
    /// The per-call timeout.
    pub fn timeout(&self) -> Duration {
        self.sessions.timeout()
    }

    /// Handles whatever replies have arrived, in place (no copy), without
    /// blocking; returns how many.
    fn pump(&mut self) -> Result<usize> {
        let (pulls, stashed) = (&mut self.pulls, &mut self.stashed);
        let got = self.sessions.take_replies(0, |m, sent| {
            ReplyState {
                pulls: &mut *pulls,
                stashed: &mut *stashed,
                caller: None,
            }
            .on_reply(m, sent)
        });
        self.reap_all();
        got
    }

    /// Handles the replies that come by `deadline`, waiting for at least
    /// one (`Timeout` past it).
    fn drive(&mut self, deadline: Instant) -> Result<()> {
        self.drive_landing(deadline, None)
    }

    /// [`PsClient::drive`], landing the replies of pull `caller.0` (a
    /// [`Landing::Caller`] pull) in `caller.1`.
    fn drive_landing(
        &mut self,
        deadline: Instant,
        mut caller: Option<(u64, &mut [f32])>,
    ) -> Result<()> {
        let (pulls, stashed) = (&mut self.pulls, &mut self.stashed);
        let r = self.sessions.receive(0, deadline, |m, sent| {
            ReplyState {
                pulls: &mut *pulls,
                stashed: &mut *stashed,
                caller: caller.as_mut().map(|(id, out)| (*id, &mut **out)),
            }
            .on_reply(m, sent)
        });
        self.reap_all();
        r.map(drop)
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

/// The parts of a client that replies update.
struct ReplyState<'a> {
    pulls: &'a mut HashMap<u64, PullState>,
    stashed: &'a mut HashMap<u64, Result<Vec<u8>>>,
    /// The pull landing in its caller's slice ([`Landing::Caller`]), and
    /// that slice, while [`PsClient::pull_into`] waits for it.
    caller: Option<(u64, &'a mut [f32])>,
}

impl ReplyState<'_> {
    /// Applies the reply `m` to the request `sent` it answers: a pull's
    /// part lands in its pull; any other reply is stashed for its caller.
    fn on_reply(&mut self, m: &[u8], sent: Sent<PsReq>) -> Result<()> {
        let frame = decode_frame(m).map_err(protocol)?;
        let req = sent.id;
        let PsReq::Pull { pull, first } = sent.tag else {
            let r = if frame.header.kind == FrameKind::Error {
                Err(refusal(&frame))
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
            p.error.get_or_insert(refusal(&frame));
            return Ok(());
        }
        let r = decode_reply(&frame).map_err(protocol)?;
        let n = r.n;
        let bm = bitmap_bytes(n);
        let inline = matches!(p.landing, Landing::Inline | Landing::Caller);
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
        let values = match (p.landing, &mut self.caller) {
            (Landing::Inline, _) => &mut p.values[..],
            (Landing::Caller, Some((id, out))) if *id == pull => &mut out[..],
            (Landing::Caller, _) => {
                p.error.get_or_insert(ClientError::Protocol(
                    "a pull's reply came with no slice to land in".into(),
                ));
                return Ok(());
            }
            (Landing::Region(_), _) => return Ok(()),
        };
        let dst = &mut values[first * p.dim..(first + n) * p.dim];
        bytemuck::cast_slice_mut::<f32, u8>(dst).copy_from_slice(&r.rest[bm..]);
        Ok(())
    }
}

fn desc_of(body: &[u8]) -> Result<TableDesc> {
    let f = decode_frame(body).map_err(protocol)?;
    let r = decode_reply(&f).map_err(protocol)?;
    decode_desc(r.rest).map(|(d, _)| d).map_err(protocol)
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
