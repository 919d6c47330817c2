//! The KV-cache client: large values with TTL, read into a receive buffer
//! the client registered with the server.
//!
//! A [`CacheClient`] owns one connection to one server worker (any worker
//! serves any key) and a receive buffer of `buffer_bytes`. Where the
//! transport registers memory (shm, fabric) the buffer *is* the registered
//! region: a GET names a slice of it and the server writes the value there
//! one-sided, after checking that it fits, then replies. Elsewhere (tcp,
//! inproc) the buffer is local memory and the value travels in chunks of
//! at most `CACHE_CHUNK_BYTES_MAX`, all requested at once and each tagged
//! with the value's generation, so a value replaced mid-transfer is
//! detected and read again instead of being stitched from two versions.
//!
//! [`CacheClient::get_at`] places a value at an offset of the buffer (the
//! "response location" of the KV-cache service this one replaces: where
//! the caller wants the value put); [`CacheClient::get_into`] reads into
//! any caller slice; [`CacheClient::get_many_at`] pipelines a batch, and
//! [`CacheClient::get_many_each`] streams one through a small ring of the
//! buffer, handing each value over as it lands.
//!
//! Layout: this file holds the client, its connection and the calls of
//! one request each; [`get`] the GETs (one-sided, or inline in chunks);
//! [`window`] the ring of the buffer a streamed batch reads into;
//! [`reply`] how replies are decoded and checked, and the sink that lands
//! inline chunks in place. Request ids, the requests in flight and their
//! order, the credits, the waits and the late-reply policy are the
//! request layer's (`fabrickv_rpc::Sessions`).

mod get;
mod registered;
mod reply;
mod window;

pub use registered::CACHE_REGISTERED_BUFFERS_MAX;

use std::time::Duration;

use fabrickv_rpc::placement::Turns;
use fabrickv_transport::{Endpoint, RemoteRegion};
use fabrickv_types::limits::{
    CACHE_BATCH_KEYS_MAX, CACHE_CHUNK_BYTES_MAX, CACHE_KEY_BYTES_MAX, CACHE_VALUE_BYTES_MAX,
    TTL_MS_MAX,
};
use fabrickv_types::ErrorCode;
use fabrickv_wire::cache::{
    decode_reply, encode_bind, encode_key_op, encode_put_chunk, encode_put_from_region, CacheOp,
    RegionSlice,
};

use crate::conn::{self, protocol, region_bytes, Conn, Connected, Workers};
use crate::{ClientError, Result, DEFAULT_TIMEOUT};
use reply::{put_reply, reply_frame, Bad};

/// Default receive buffer of a client, in bytes (64, the `--buffer-mb`
/// default of the KV-cache service this one replaces).
pub const CACHE_BUFFER_BYTES_DEFAULT: usize = 64 << 20;

/// How long, in milliseconds, a GET keeps reading a value again while it
/// is replaced between chunks. Bounded by time, not by a count: a reader
/// racing a burst of writes to one hot key outlasts the burst however
/// busy the machine is, and a key rewritten without pause gets a clear
/// `VALUE_CHANGED` rather than a read that spins until its deadline.
pub const CACHE_GET_RETRY_WINDOW_MS: u64 = 5_000;

/// Longest pause, in microseconds, between two reads of a value that
/// keeps changing: the pause doubles from 50 µs up to this, so a burst of
/// writes finishes instead of being raced by the reader.
pub const CACHE_GET_RETRY_PAUSE_US_MAX: u64 = 10_000;

/// Bytes of the receive buffer a pipelined batch read
/// ([`CacheClient::get_many_each`]) reads into at once, in a ring reused
/// as values are handed over. Small enough that the ring stays in the
/// last-level cache the server's CPU and the reader's share (32 MiB on
/// the 2-CPU EPYC VM this project develops on, where the reader copies
/// each value out right after the server wrote it), large enough to keep
/// several values of a KV-cache layer block (256 KiB) in flight so the
/// server never waits for the reader.
pub const CACHE_PIPELINE_WINDOW_BYTES: usize = 2 << 20;

/// Picks the worker of each new client, round robin over the process.
static TURNS: Turns = Turns::new();

/// How a client is set up.
#[derive(Debug, Clone, Copy)]
pub struct CacheClientOptions {
    /// Bytes of the receive buffer.
    pub buffer_bytes: usize,
    /// Timeout of connecting and of each call.
    pub timeout: Duration,
}

impl Default for CacheClientOptions {
    fn default() -> Self {
        CacheClientOptions {
            buffer_bytes: CACHE_BUFFER_BYTES_DEFAULT,
            timeout: DEFAULT_TIMEOUT,
        }
    }
}

/// A value read into the receive buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Placed {
    /// Where it starts in the buffer.
    pub offset: usize,
    /// Its length.
    pub len: usize,
    /// Its generation (changes whenever the key is written).
    pub generation: u64,
    /// Milliseconds until it expires (0 = never).
    pub expires_in_ms: u64,
}

/// What a round of chunk replies said.
struct Chunks {
    /// (total, generation, expires_in_ms) of the first chunk, if present.
    seen: Option<(u64, u64, u64)>,
    /// The chunks came from different versions (or some vanished).
    torn: bool,
}

/// The receive buffer.
enum Buffer {
    /// Registered with the transport: the server writes into it.
    Region(RemoteRegion),
    /// Local memory the client lands inline chunks in.
    Local(Vec<u8>),
}

/// A client of the KV-cache service on one server worker.
pub struct CacheClient {
    /// The one session, to the client's worker: request ids, the requests
    /// in flight, credits, the timeout.
    sessions: Conn<()>,
    /// Where values land.
    buffer: Buffer,
    /// Bytes of `buffer`.
    buffer_bytes: usize,
    /// Numbers the chunked PUTs, so the server tells their chunks apart.
    next_transfer: u64,
    /// Receives GET replies taken whole (refusals, misses, chunks that
    /// do not fit), reused from call to call.
    whole: Vec<u8>,
    /// Buffers the caller registered besides the receive buffer
    /// ([`CacheClient::register_buffer`]).
    registered: Vec<RemoteRegion>,
}

impl std::fmt::Debug for CacheClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CacheClient")
            .field("worker", &self.worker())
            .field("one_sided", &self.one_sided())
            .field("buffer_bytes", &self.buffer_bytes)
            .finish()
    }
}

pub(crate) fn check_key(key: &[u8]) -> Result<()> {
    if key.is_empty() {
        return Err(ClientError::Invalid(
            ErrorCode::Malformed,
            "empty key".into(),
        ));
    }
    if key.len() > CACHE_KEY_BYTES_MAX {
        return Err(ClientError::Invalid(
            ErrorCode::KeyTooLong,
            format!(
                "{} bytes exceed CACHE_KEY_BYTES_MAX ({CACHE_KEY_BYTES_MAX})",
                key.len()
            ),
        ));
    }
    Ok(())
}

impl CacheClient {
    /// Connects to the server at `addr` with the default options.
    pub fn connect(addr: &str) -> Result<CacheClient> {
        CacheClient::connect_with(addr, CacheClientOptions::default())
    }

    /// Connects with `opts`. Clients of one process spread over the
    /// server's workers, round robin.
    pub fn connect_with(addr: &str, opts: CacheClientOptions) -> Result<CacheClient> {
        let c = conn::connect(
            addr,
            opts.timeout,
            Workers::InTurn(&TURNS, 0),
            opts.buffer_bytes,
        )?;
        Ok(CacheClient::of(c, opts))
    }

    /// Connects to worker `worker`, whatever the turn: a reader thread
    /// pinned beside a pinned worker (`--worker-cpus`) talks to that
    /// worker. A worker the server does not have is refused at the
    /// handshake (`UNAVAILABLE`, with the server's worker count).
    pub fn connect_worker(
        addr: &str,
        worker: u16,
        opts: CacheClientOptions,
    ) -> Result<CacheClient> {
        let c = conn::connect(
            addr,
            opts.timeout,
            Workers::Worker(worker),
            opts.buffer_bytes,
        )?;
        Ok(CacheClient::of(c, opts))
    }

    /// A client over an endpoint already connected to `worker`; registers
    /// the receive buffer where the transport can.
    pub fn on_endpoint(
        ep: Box<dyn Endpoint>,
        worker: u16,
        opts: CacheClientOptions,
    ) -> Result<CacheClient> {
        let c = conn::over(ep, worker, opts.timeout, opts.buffer_bytes)?;
        Ok(CacheClient::of(c, opts))
    }

    /// A client over a connection made with its receive buffer
    /// registered, or local memory where the transport registers none.
    fn of(c: Connected<()>, opts: CacheClientOptions) -> CacheClient {
        let buffer = match c.region {
            Some(r) => Buffer::Region(r),
            None => Buffer::Local(vec![0; opts.buffer_bytes]),
        };
        CacheClient {
            sessions: c.sessions,
            buffer,
            buffer_bytes: opts.buffer_bytes,
            next_transfer: 1,
            whole: Vec::new(),
            registered: Vec::new(),
        }
    }

    /// Whether values land one-sided in a registered region.
    pub fn one_sided(&self) -> bool {
        matches!(self.buffer, Buffer::Region(_))
    }

    /// The server worker this client talks to.
    pub fn worker(&self) -> u16 {
        self.sessions.get(0).worker()
    }

    /// Bytes of the receive buffer.
    pub fn buffer_len(&self) -> usize {
        self.buffer_bytes
    }

    /// The registered region's descriptor, if values land one-sided.
    pub fn region(&self) -> Option<RemoteRegion> {
        match self.buffer {
            Buffer::Region(r) => Some(r),
            Buffer::Local(_) => None,
        }
    }

    /// The receive buffer.
    pub fn buffer(&mut self) -> Result<&mut [u8]> {
        match &mut self.buffer {
            Buffer::Region(r) => {
                let r = *r;
                Ok(self.sessions.session(0).endpoint().local_region(&r)?)
            }
            Buffer::Local(v) => Ok(v),
        }
    }

    /// Posts one message built by `build`, given its id and worker.
    fn post(&mut self, build: impl FnOnce(&mut Vec<u8>, u64, u16)) -> Result<u64> {
        let mut build = Some(build);
        Ok(self.sessions.post(0, (), |b, id, w| {
            if let Some(f) = build.take() {
                f(b, id, w);
            }
        })?)
    }

    /// Sends the requests posted and waits for their replies (replies
    /// come back in the order they were posted, which the request layer
    /// checks), handing each, with its number in posting order, to
    /// `on_reply` in place (no copy out of the transport's buffer). A
    /// reply out of order or undecodable ends the call; an error of one
    /// reply is returned after the rest are in.
    fn collect(
        &mut self,
        mut on_reply: impl FnMut(usize, &fabrickv_wire::Frame<'_>) -> Result<()>,
    ) -> Result<()> {
        self.sessions.flush()?;
        let deadline = self.sessions.deadline();
        let mut next = 0;
        let mut first_err: Option<ClientError> = None;
        self.sessions.collect(0, deadline, |m, sent| {
            let i = next;
            next += 1;
            match reply_frame(m, Some(sent.id)) {
                Ok(frame) => {
                    if let Err(e) = on_reply(i, &frame) {
                        first_err.get_or_insert(e);
                    }
                }
                Err(Bad::Fatal(e)) => return Err(e),
                Err(Bad::Refused(e)) => {
                    first_err.get_or_insert(e);
                }
            }
            Ok(())
        })?;
        first_err.map_or(Ok(()), Err)
    }

    /// As [`CacheClient::collect`], handing every reply to `on_reply` in
    /// posting order: its frame, or the server's refusal of that request.
    fn collect_each(
        &mut self,
        mut on_reply: impl FnMut(Result<&fabrickv_wire::Frame<'_>>),
    ) -> Result<()> {
        self.sessions.flush()?;
        let deadline = self.sessions.deadline();
        self.sessions.collect(0, deadline, |m, sent| {
            match reply_frame(m, Some(sent.id)) {
                Ok(frame) => on_reply(Ok(&frame)),
                Err(Bad::Fatal(e)) => return Err(e),
                Err(Bad::Refused(e)) => on_reply(Err(e)),
            }
            Ok(())
        })
    }

    /// Stores `value` under `key` with a time to live (`None` = forever);
    /// returns the value's generation.
    pub fn put(&mut self, key: &[u8], value: &[u8], ttl: Option<Duration>) -> Result<u64> {
        let mut out = self.put_many(&[(key, value)], ttl)?;
        out.pop()
            .unwrap_or_else(|| Err(ClientError::Protocol("a PUT got no reply".into())))
    }

    /// Stores each `(key, value)`, all with the same time to live; one
    /// result per item, in order (its generation, or its own refusal).
    /// Every item is checked before anything is sent. The PUTs are
    /// pipelined: as many items as fit at once (up to
    /// `CACHE_BATCH_KEYS_MAX` requests, chunks included, and where values
    /// go through the registered region, as many as it holds side by
    /// side) are sent before any reply is read, so a batch costs a round
    /// trip per round, not one per value. A refused item does not stop
    /// the others.
    pub fn put_many(
        &mut self,
        items: &[(&[u8], &[u8])],
        ttl: Option<Duration>,
    ) -> Result<Vec<Result<u64>>> {
        check_put_items(items)?;
        let ttl_ms = ttl_ms_of(ttl)?;
        let mut out = Vec::with_capacity(items.len());
        // Requests of each item of the round, and where in the region its
        // value went (if it did).
        let mut round: Vec<(usize, Option<usize>)> = Vec::new();
        let mut start = 0;
        while start < items.len() {
            round.clear();
            let mut requests = 0;
            let mut region_used = 0;
            let mut end = start;
            while end < items.len() {
                let value = items[end].1;
                let at = match self.buffer {
                    Buffer::Region(_) if self.whole_in_region(value.len()) => {
                        if region_used + value.len() > self.buffer_bytes {
                            break;
                        }
                        region_used += value.len();
                        Some(region_used - value.len())
                    }
                    _ => None,
                };
                let n = match at {
                    Some(_) => 1,
                    None => value.len().div_ceil(CACHE_CHUNK_BYTES_MAX).max(1),
                };
                if end > start && requests + n > CACHE_BATCH_KEYS_MAX {
                    break;
                }
                requests += n;
                round.push((n, at));
                end += 1;
            }
            for (i, &(_, at)) in (start..end).zip(&round) {
                let (key, value) = items[i];
                self.post_put(key, value, ttl_ms, at)?;
            }
            let mut left = 0;
            let mut item = 0;
            let mut generation: Option<Result<u64>> = None;
            let totals: Vec<u64> = items[start..end]
                .iter()
                .map(|(_, v)| v.len() as u64)
                .collect();
            let mut results: Vec<Result<u64>> = Vec::with_capacity(end - start);
            self.collect_each(|f| {
                if left == 0 {
                    left = round[item].0;
                }
                let r = match f {
                    Ok(f) => put_reply(f, totals[item]),
                    Err(e) => Err(e),
                };
                // The last chunk's reply carries the generation; the first
                // refusal of any chunk is the item's result.
                generation = match (generation.take(), r) {
                    (Some(Err(e)), _) => Some(Err(e)),
                    (_, r) => Some(r),
                };
                left -= 1;
                if left == 0 {
                    results.push(generation.take().unwrap_or_else(|| {
                        Err(ClientError::Protocol("a PUT got no reply".into()))
                    }));
                    item += 1;
                }
            })?;
            if results.len() != end - start {
                return Err(ClientError::Protocol("a PUT got no reply".into()));
            }
            out.extend(results);
            start = end;
        }
        Ok(out)
    }

    /// Whether a value of `len` bytes goes whole through the registered
    /// region (one request the server reads one-sided) rather than inline.
    fn whole_in_region(&self, len: usize) -> bool {
        matches!(self.buffer, Buffer::Region(_))
            && len <= self.buffer_bytes
            && len > CACHE_CHUNK_BYTES_MAX
    }

    /// Posts the PUT of `value` under `key`: copied into the region at
    /// `at` and read from there by the server, or inline in chunks.
    fn post_put(&mut self, key: &[u8], value: &[u8], ttl_ms: u64, at: Option<usize>) -> Result<()> {
        let total = value.len() as u64;
        if let (Some(at), Some(r)) = (at, self.region()) {
            self.buffer()?[at..at + value.len()].copy_from_slice(value);
            let src = RegionSlice {
                region: region_bytes(&r),
                offset: at as u64,
                len: total,
            };
            self.post(|b, id, w| encode_put_from_region(b, id, w, key, ttl_ms, &src))?;
            return Ok(());
        }
        let transfer = self.next_transfer;
        self.next_transfer += 1;
        let mut offset = 0;
        loop {
            let end = (offset + CACHE_CHUNK_BYTES_MAX).min(value.len());
            let chunk = &value[offset..end];
            self.post(|b, id, w| {
                encode_put_chunk(b, id, w, key, transfer, ttl_ms, total, offset as u64, chunk)
            })?;
            offset = end;
            if offset >= value.len() {
                return Ok(());
            }
        }
    }

    /// Reads `key` into the receive buffer at `offset`; `None` if absent.
    /// `BUFFER_TOO_SMALL` if the value does not fit from `offset` on
    /// (checked by the server before anything is written).
    pub fn get_at(&mut self, key: &[u8], offset: usize) -> Result<Option<Placed>> {
        let mut out = self.get_many_at(&[(key, offset)])?;
        out.pop().unwrap_or(Ok(None))
    }

    /// Reads each `(key, offset)` into the receive buffer, all requests in
    /// flight at once; one result per key, in order.
    pub fn get_many_at(&mut self, items: &[(&[u8], usize)]) -> Result<Vec<Result<Option<Placed>>>> {
        self.post_get_many_at(items)?;
        self.collect_get_many_at(items)
    }

    /// Checks `items` and sends their GETs as [`CacheClient::get_many_at`]
    /// does, without waiting for any reply: the first half of a batch a
    /// cluster client splits over its servers, so that every server works
    /// on its part at once. Nothing is sent if an item is refused.
    pub(crate) fn post_get_many_at(&mut self, items: &[(&[u8], usize)]) -> Result<()> {
        if items.len() > CACHE_BATCH_KEYS_MAX {
            return Err(ClientError::Invalid(
                ErrorCode::BatchTooLarge,
                format!("{} keys exceed CACHE_BATCH_KEYS_MAX", items.len()),
            ));
        }
        for (k, off) in items {
            check_key(k)?;
            if *off > self.buffer_bytes {
                return Err(ClientError::Invalid(
                    ErrorCode::BufferTooSmall,
                    format!("offset {off} is past the {}-byte buffer", self.buffer_bytes),
                ));
            }
        }
        match self.buffer {
            Buffer::Region(r) => self.post_one_sided(r, items),
            Buffer::Local(_) => self.post_inline_firsts(items.iter().map(|&(k, _)| k)),
        }
    }

    /// Reads the replies to [`CacheClient::post_get_many_at`] of `items`
    /// (the same items): one result per key, in order.
    pub(crate) fn collect_get_many_at(
        &mut self,
        items: &[(&[u8], usize)],
    ) -> Result<Vec<Result<Option<Placed>>>> {
        match self.buffer {
            Buffer::Region(_) => self.collect_one_sided(items),
            Buffer::Local(_) => {
                let mut buf = match std::mem::replace(&mut self.buffer, Buffer::Local(Vec::new())) {
                    Buffer::Local(v) => v,
                    Buffer::Region(r) => {
                        self.buffer = Buffer::Region(r);
                        return Err(ClientError::Protocol("buffer changed kind".into()));
                    }
                };
                let end = buf.len();
                let items: Vec<(&[u8], usize, usize)> =
                    items.iter().map(|&(k, off)| (k, off, end)).collect();
                let out = self.collect_inline(&mut buf, &items);
                self.buffer = Buffer::Local(buf);
                out
            }
        }
    }

    /// Reads `key` into `dst`; returns the value's length, `None` if
    /// absent. Over a registered region the value lands there first and is
    /// copied; use [`CacheClient::get_at`] to read it in place.
    pub fn get_into(&mut self, key: &[u8], dst: &mut [u8]) -> Result<Option<usize>> {
        check_key(key)?;
        match self.buffer {
            Buffer::Local(_) => Ok(self.get_inline(key, dst, dst.len())?.map(|p| p.len)),
            Buffer::Region(_) => {
                let Some(p) = self.get_at(key, 0)? else {
                    return Ok(None);
                };
                if p.len > dst.len() {
                    return Err(too_small(p.len as u64, dst.len()));
                }
                dst[..p.len].copy_from_slice(&self.buffer()?[..p.len]);
                Ok(Some(p.len))
            }
        }
    }

    /// Reads `key` into a new vector; `None` if absent.
    pub fn get(&mut self, key: &[u8]) -> Result<Option<Vec<u8>>> {
        let Some(p) = self.get_at(key, 0)? else {
            return Ok(None);
        };
        Ok(Some(self.buffer()?[p.offset..p.offset + p.len].to_vec()))
    }

    /// Removes `key`; true if it was there.
    pub fn delete(&mut self, key: &[u8]) -> Result<bool> {
        self.key_op(CacheOp::Delete, key)
    }

    /// Whether `key` is live.
    pub fn exists(&mut self, key: &[u8]) -> Result<bool> {
        self.key_op(CacheOp::Exists, key)
    }

    /// Whether each of `keys` is live, in order. The requests of up to
    /// `CACHE_BATCH_KEYS_MAX` keys are in flight at once (one round trip
    /// for such a batch, rather than one per key); a longer list goes in
    /// rounds of that many.
    pub fn exists_many(&mut self, keys: &[&[u8]]) -> Result<Vec<bool>> {
        self.key_op_many(CacheOp::Exists, keys)
    }

    /// Removes each of `keys`; for each, in order, whether it was there.
    /// Pipelined as [`CacheClient::exists_many`] is.
    pub fn delete_many(&mut self, keys: &[&[u8]]) -> Result<Vec<bool>> {
        self.key_op_many(CacheOp::Delete, keys)
    }

    fn key_op(&mut self, op: CacheOp, key: &[u8]) -> Result<bool> {
        let mut out = self.key_op_many(op, &[key])?;
        out.pop()
            .ok_or_else(|| ClientError::Protocol("a key got no reply".into()))
    }

    /// `op` on every key, in rounds of `CACHE_BATCH_KEYS_MAX` requests in
    /// flight at once. Every key is checked before anything is sent.
    fn key_op_many(&mut self, op: CacheOp, keys: &[&[u8]]) -> Result<Vec<bool>> {
        for k in keys {
            check_key(k)?;
        }
        let mut out = Vec::with_capacity(keys.len());
        for round in keys.chunks(CACHE_BATCH_KEYS_MAX) {
            self.post_key_ops(op, round)?;
            self.collect_key_ops(&mut out)?;
        }
        Ok(out)
    }

    /// Posts `op` on each of `keys` (checked by the caller, at most
    /// `CACHE_BATCH_KEYS_MAX` of them) and sends them, without waiting:
    /// the first half of a batch a cluster client splits over its
    /// servers, so that every server works on its part at once.
    pub(crate) fn post_key_ops(&mut self, op: CacheOp, keys: &[&[u8]]) -> Result<()> {
        if keys.len() > CACHE_BATCH_KEYS_MAX {
            return Err(ClientError::Invalid(
                ErrorCode::BatchTooLarge,
                format!("{} keys exceed CACHE_BATCH_KEYS_MAX", keys.len()),
            ));
        }
        for k in keys {
            self.post(|b, id, w| encode_key_op(b, id, w, op, k))?;
        }
        Ok(self.sessions.flush()?)
    }

    /// Reads the replies of the key operations posted by
    /// [`CacheClient::post_key_ops`], appending one flag per key to `out`
    /// (true: the key was there). A refusal of one key is returned once
    /// every reply is in, so the connection stays in step.
    pub(crate) fn collect_key_ops(&mut self, out: &mut Vec<bool>) -> Result<()> {
        self.collect(|_, f| {
            let r = decode_reply(f).map_err(protocol)?;
            let found = match r.status {
                ErrorCode::Ok => true,
                ErrorCode::NotFound => false,
                code => {
                    return Err(ClientError::Server {
                        code,
                        message: String::new(),
                    })
                }
            };
            out.push(found);
            Ok(())
        })
    }

    /// Ties the gRPC client id `client_id` (from RegisterClient) to this
    /// connection's receive buffer, so gRPC Get/Put calls that name the
    /// client place values in it. Needs a registered region.
    pub fn bind(&mut self, client_id: u64) -> Result<()> {
        let Buffer::Region(r) = self.buffer else {
            return Err(ClientError::Invalid(
                ErrorCode::Unavailable,
                "this transport registers no memory; gRPC placements need shm or fabric".into(),
            ));
        };
        let slice = RegionSlice {
            region: region_bytes(&r),
            offset: 0,
            len: self.buffer_bytes as u64,
        };
        self.post(|b, id, w| encode_bind(b, id, w, client_id, &slice))?;
        self.collect(|_, f| {
            let r = decode_reply(f).map_err(protocol)?;
            match r.status {
                ErrorCode::Ok => Ok(()),
                code => Err(ClientError::Server {
                    code,
                    message: String::new(),
                }),
            }
        })
    }
}

/// Refuses a batch of PUTs with a key or a value that no server takes
/// (`KEY_TOO_LONG`, `MALFORMED` for an empty key, `VALUE_TOO_LARGE`),
/// before anything is sent.
pub(crate) fn check_put_items(items: &[(&[u8], &[u8])]) -> Result<()> {
    for (key, value) in items {
        check_key(key)?;
        if value.len() > CACHE_VALUE_BYTES_MAX {
            return Err(ClientError::Invalid(
                ErrorCode::ValueTooLarge,
                format!("{} bytes exceed CACHE_VALUE_BYTES_MAX", value.len()),
            ));
        }
    }
    Ok(())
}

/// A PUT's time to live in milliseconds as the wire carries it (0 =
/// forever; a duration under a millisecond is one); `TTL_TOO_LARGE` past
/// `TTL_MS_MAX`.
fn ttl_ms_of(ttl: Option<Duration>) -> Result<u64> {
    let Some(d) = ttl else {
        return Ok(0);
    };
    let ms = d.as_millis().max(1);
    if ms > u128::from(TTL_MS_MAX) {
        return Err(ClientError::Invalid(
            ErrorCode::TtlTooLarge,
            format!("{ms} ms"),
        ));
    }
    Ok(ms as u64)
}

/// `BUFFER_TOO_SMALL`: a value of `total` bytes and `room` bytes for it.
fn too_small(total: u64, room: usize) -> ClientError {
    ClientError::Server {
        code: ErrorCode::BufferTooSmall,
        message: format!("a {total}-byte value does not fit {room} bytes"),
    }
}
