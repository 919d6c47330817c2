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
//! seed's "response location"); [`CacheClient::get_into`] reads into any
//! caller slice; [`CacheClient::get_many_at`] pipelines a batch.

use std::sync::atomic::AtomicUsize;
use std::time::{Duration, Instant};

use fabrickv_transport::{Endpoint, Landed, RemoteRegion, SplitSink, TransportError};
use fabrickv_types::limits::{
    CACHE_BATCH_KEYS_MAX, CACHE_CHUNK_BYTES_MAX, CACHE_KEY_BYTES_MAX, CACHE_VALUE_BYTES_MAX,
    TTL_MS_MAX,
};
use fabrickv_types::ErrorCode;
use fabrickv_wire::cache::{
    decode_reply, decode_split_get_reply, encode_bind, encode_get, encode_key_op, encode_put_chunk,
    encode_put_from_region, peek_get_reply_head, CacheOp, RegionSlice, GET_REPLY_HEAD_BYTES,
};
use fabrickv_wire::control::decode_error;
use fabrickv_wire::{decode_frame, FrameHeader, FrameKind, WireError};

use crate::{ClientError, Result, DEFAULT_TIMEOUT};

/// Default receive buffer of a client, in bytes (the seed's `--buffer-mb`
/// default of 64).
pub const CACHE_BUFFER_BYTES_DEFAULT: usize = 64 << 20;

/// Times a GET is retried when its value is replaced between chunks.
pub const CACHE_GET_RETRIES_MAX: usize = 8;

/// Picks the worker of each new client, round robin over the process.
static NEXT_WORKER: AtomicUsize = AtomicUsize::new(0);

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
    ep: Box<dyn Endpoint>,
    worker: u16,
    timeout: Duration,
    next_id: u64,
    buffer: Buffer,
    buffer_bytes: usize,
    next_transfer: u64,
    scratch: Vec<u8>,
    /// Receives GET replies taken whole (refusals, misses, chunks that
    /// do not fit), reused from call to call.
    whole: Vec<u8>,
}

impl std::fmt::Debug for CacheClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CacheClient")
            .field("worker", &self.worker)
            .field("one_sided", &self.one_sided())
            .field("buffer_bytes", &self.buffer_bytes)
            .finish()
    }
}

fn protocol(e: impl std::fmt::Display) -> ClientError {
    ClientError::Protocol(e.to_string())
}

fn check_key(key: &[u8]) -> Result<()> {
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
        let (ep, worker) = crate::connect_in_turn(addr, opts.timeout, &NEXT_WORKER)?;
        CacheClient::on_endpoint(ep, worker, opts)
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
        let ep = fabrickv_transport::connect(addr, worker, opts.timeout)?;
        CacheClient::on_endpoint(ep, worker, opts)
    }

    /// A client over an endpoint already connected to `worker`; registers
    /// the receive buffer where the transport can.
    pub fn on_endpoint(
        mut ep: Box<dyn Endpoint>,
        worker: u16,
        opts: CacheClientOptions,
    ) -> Result<CacheClient> {
        let buffer = match ep.register(opts.buffer_bytes) {
            Ok(r) => Buffer::Region(r),
            Err(TransportError::Unsupported(_)) => Buffer::Local(vec![0; opts.buffer_bytes]),
            Err(e) => return Err(e.into()),
        };
        Ok(CacheClient {
            ep,
            worker,
            timeout: opts.timeout,
            next_id: 1,
            buffer,
            buffer_bytes: opts.buffer_bytes,
            next_transfer: 1,
            scratch: Vec::new(),
            whole: Vec::new(),
        })
    }

    /// Whether values land one-sided in a registered region.
    pub fn one_sided(&self) -> bool {
        matches!(self.buffer, Buffer::Region(_))
    }

    /// The server worker this client talks to.
    pub fn worker(&self) -> u16 {
        self.worker
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
                Ok(self.ep.local_region(&r)?)
            }
            Buffer::Local(v) => Ok(v),
        }
    }

    fn next_request_id(&mut self) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        id
    }

    /// Posts one message built by `build`; returns its request id.
    fn post(&mut self, build: impl FnOnce(&mut Vec<u8>, u64, u16)) -> Result<u64> {
        let id = self.next_request_id();
        self.scratch.clear();
        build(&mut self.scratch, id, self.worker);
        let msg = std::mem::take(&mut self.scratch);
        let posted = self.ep.post(&msg);
        self.scratch = msg;
        posted?;
        Ok(id)
    }

    /// Waits for the replies of `ids` (posted in this order, replies come
    /// back in it), handing each to `on_reply` in place (no copy out of
    /// the transport's buffer). A reply out of order or undecodable ends
    /// the call; an error of one reply is returned after the rest are in.
    fn collect(
        &mut self,
        ids: &[u64],
        mut on_reply: impl FnMut(usize, &fabrickv_wire::Frame<'_>) -> Result<()>,
    ) -> Result<()> {
        self.ep.flush(self.timeout)?;
        let deadline = Instant::now() + self.timeout;
        let mut next = 0;
        let mut first_err: Option<ClientError> = None;
        let mut fatal: Option<ClientError> = None;
        while next < ids.len() {
            let n = self.ep.poll(ids.len() - next, &mut |m| {
                if fatal.is_some() {
                    return;
                }
                match reply_frame(m, ids[next]) {
                    Ok(frame) => {
                        if let Err(e) = on_reply(next, &frame) {
                            first_err.get_or_insert(e);
                        }
                    }
                    Err(Fatal(e)) => fatal = Some(e),
                    Err(Refused(e)) => {
                        first_err.get_or_insert(e);
                    }
                }
                next += 1;
            })?;
            if let Some(e) = fatal {
                return Err(e);
            }
            if n == 0 {
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return Err(ClientError::Timeout);
                }
                self.ep.wait(left)?;
            }
        }
        first_err.map_or(Ok(()), Err)
    }

    /// Stores `value` under `key` with a time to live (`None` = forever);
    /// returns the value's generation.
    pub fn put(&mut self, key: &[u8], value: &[u8], ttl: Option<Duration>) -> Result<u64> {
        check_key(key)?;
        if value.len() > CACHE_VALUE_BYTES_MAX {
            return Err(ClientError::Invalid(
                ErrorCode::ValueTooLarge,
                format!("{} bytes exceed CACHE_VALUE_BYTES_MAX", value.len()),
            ));
        }
        let ttl_ms = match ttl {
            None => 0,
            Some(d) => {
                let ms = d.as_millis().max(1);
                if ms > u128::from(TTL_MS_MAX) {
                    return Err(ClientError::Invalid(
                        ErrorCode::TtlTooLarge,
                        format!("{ms} ms"),
                    ));
                }
                ms as u64
            }
        };
        let total = value.len() as u64;
        // A whole value in the registered region: one request, and the
        // server reads it one-sided.
        if let Buffer::Region(r) = self.buffer {
            if value.len() <= self.buffer_bytes && value.len() > CACHE_CHUNK_BYTES_MAX {
                self.buffer()?[..value.len()].copy_from_slice(value);
                let src = RegionSlice {
                    region: encode_region(&r),
                    offset: 0,
                    len: total,
                };
                let id =
                    self.post(|b, id, w| encode_put_from_region(b, id, w, key, ttl_ms, &src))?;
                let mut generation = 0;
                self.collect(&[id], |_, f| {
                    generation = put_reply(f, total)?;
                    Ok(())
                })?;
                return Ok(generation);
            }
        }
        let transfer = self.next_transfer;
        self.next_transfer += 1;
        let mut ids = Vec::with_capacity(value.len().div_ceil(CACHE_CHUNK_BYTES_MAX).max(1));
        let mut offset = 0;
        loop {
            let end = (offset + CACHE_CHUNK_BYTES_MAX).min(value.len());
            let chunk = &value[offset..end];
            ids.push(self.post(|b, id, w| {
                encode_put_chunk(b, id, w, key, transfer, ttl_ms, total, offset as u64, chunk)
            })?);
            offset = end;
            if offset >= value.len() {
                break;
            }
        }
        let last = ids.len() - 1;
        let mut generation = 0;
        self.collect(&ids, |i, f| {
            let g = put_reply(f, total)?;
            if i == last {
                generation = g;
            }
            Ok(())
        })?;
        Ok(generation)
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
            Buffer::Region(r) => self.get_many_one_sided(r, items),
            Buffer::Local(_) => {
                let mut buf = match std::mem::replace(&mut self.buffer, Buffer::Local(Vec::new())) {
                    Buffer::Local(v) => v,
                    Buffer::Region(r) => {
                        self.buffer = Buffer::Region(r);
                        return Err(ClientError::Protocol("buffer changed kind".into()));
                    }
                };
                let out = self.get_many_inline(&mut buf, items);
                self.buffer = Buffer::Local(buf);
                out
            }
        }
    }

    /// [`CacheClient::get_many_at`] with inline chunks: the first chunk
    /// of every key is asked for at once and each lands at its key's
    /// offset in `buf` as its reply is read, so a batch of values of up to
    /// one chunk costs one round trip. A value of several chunks then has
    /// the rest asked for at once, pinned to the generation its first
    /// chunk reported; one that changed in between is read again whole.
    fn get_many_inline(
        &mut self,
        buf: &mut [u8],
        items: &[(&[u8], usize)],
    ) -> Result<Vec<Result<Option<Placed>>>> {
        let mut ids = Vec::with_capacity(items.len());
        for &(k, _) in items {
            ids.push(self.post(|b, id, w| {
                encode_get(b, id, w, k, 0, 0, CACHE_CHUNK_BYTES_MAX as u64, None)
            })?);
        }
        self.ep.flush(self.timeout)?;
        let deadline = Instant::now() + self.timeout;
        let mut firsts = Vec::with_capacity(items.len());
        let mut whole = std::mem::take(&mut self.whole);
        let mut fatal = None;
        for (&id, &(_, off)) in ids.iter().zip(items) {
            let mut sink = ChunkSink::new(&mut buf[off..], std::mem::take(&mut whole));
            let r = self.recv_chunk(&mut sink, id, deadline);
            whole = sink.whole;
            match r {
                Ok(r) => firsts.push(r),
                Err(e) => {
                    fatal = Some(e);
                    break;
                }
            }
        }
        self.whole = whole;
        if let Some(e) = fatal {
            return Err(e);
        }
        let mut out = Vec::with_capacity(items.len());
        for (first, &(k, off)) in firsts.into_iter().zip(items) {
            let dst = &mut buf[off..];
            let placed = |total: u64, generation: u64, expires_in_ms: u64| Placed {
                offset: off,
                len: total as usize,
                generation,
                expires_in_ms,
            };
            let again = |c: &mut CacheClient, dst: &mut [u8]| {
                c.get_inline(k, dst, CACHE_CHUNK_BYTES_MAX)
                    .map(|p| p.map(|p| Placed { offset: off, ..p }))
            };
            out.push(match first {
                Ok(None) => Ok(None),
                Ok(Some((total, _, _))) if total as usize > dst.len() => {
                    Err(too_small(total, dst.len()))
                }
                Ok(Some((total, gen, exp))) if total as usize > CACHE_CHUNK_BYTES_MAX => {
                    let all = (total as usize).div_ceil(CACHE_CHUNK_BYTES_MAX);
                    match self.get_chunks(k, dst, gen, 1..all) {
                        Ok(rest) if !rest.torn && rest.seen.is_some() => {
                            Ok(Some(placed(total, gen, exp)))
                        }
                        Ok(_) => again(self, dst),
                        Err(e) => Err(e),
                    }
                }
                Ok(Some((total, gen, exp))) => Ok(Some(placed(total, gen, exp))),
                // Replaced or removed between chunks: read it again.
                Err(e) if matches!(e.code(), ErrorCode::ValueChanged) => again(self, dst),
                Err(e) => Err(e),
            });
        }
        Ok(out)
    }

    /// Receives the reply to `id` through `sink`. The outer error means the
    /// connection cannot be trusted further; the inner one is this
    /// request's own (the replies after it are still read).
    fn recv_chunk(
        &mut self,
        sink: &mut ChunkSink<'_>,
        id: u64,
        deadline: Instant,
    ) -> Result<ChunkReply> {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(ClientError::Timeout);
        }
        let r = match self.ep.recv_split(GET_REPLY_HEAD_BYTES, left, sink)? {
            Landed::Split => sink.split_reply(id),
            Landed::Whole => sink.whole_reply(id),
        };
        match r {
            Ok(r) => Ok(r),
            Err(Fatal(e)) => Err(e),
            Err(Refused(e)) => Ok(Err(e)),
        }
    }

    fn get_many_one_sided(
        &mut self,
        r: RemoteRegion,
        items: &[(&[u8], usize)],
    ) -> Result<Vec<Result<Option<Placed>>>> {
        let region = encode_region(&r);
        let mut ids = Vec::with_capacity(items.len());
        for &(k, off) in items {
            let dest = RegionSlice {
                region,
                offset: off as u64,
                len: (self.buffer_bytes - off) as u64,
            };
            ids.push(self.post(|b, id, w| encode_get(b, id, w, k, 0, 0, 0, Some(&dest)))?);
        }
        let mut out: Vec<Result<Option<Placed>>> = Vec::with_capacity(items.len());
        self.collect(&ids, |i, f| {
            out.push(get_reply(f).map(|g| {
                g.map(|(total, gen, exp, _, _)| Placed {
                    offset: items[i].1,
                    len: total as usize,
                    generation: gen,
                    expires_in_ms: exp,
                })
            }));
            Ok(())
        })?;
        Ok(out)
    }

    /// Reads a value inline into `dst`: the chunks covering the first
    /// `guess` bytes are asked for at once; if the value is longer, the
    /// rest are asked for at once too, pinned to the generation the first
    /// replies reported. Retries when the value changes in between.
    fn get_inline(&mut self, key: &[u8], dst: &mut [u8], guess: usize) -> Result<Option<Placed>> {
        for _ in 0..CACHE_GET_RETRIES_MAX {
            let first = guess
                .clamp(1, dst.len().max(1))
                .div_ceil(CACHE_CHUNK_BYTES_MAX);
            let r = self.get_chunks(key, dst, 0, 0..first)?;
            let Some((total, gen, exp)) = r.seen else {
                if r.torn {
                    continue;
                }
                return Ok(None);
            };
            if r.torn {
                continue;
            }
            if total as usize > dst.len() {
                return Err(too_small(total, dst.len()));
            }
            let all = (total as usize).div_ceil(CACHE_CHUNK_BYTES_MAX);
            if all > first {
                let rest = self.get_chunks(key, dst, gen, first..all)?;
                if rest.torn || rest.seen.is_none() {
                    continue;
                }
            }
            return Ok(Some(Placed {
                offset: 0,
                len: total as usize,
                generation: gen,
                expires_in_ms: exp,
            }));
        }
        Err(ClientError::Server {
            code: ErrorCode::ValueChanged,
            message: format!("the value changed during {CACHE_GET_RETRIES_MAX} reads in a row"),
        })
    }

    /// Asks for chunks `chunks` of `key` (generation `gen`, 0 = any) at
    /// once and lands them in `dst`. Each reply is received split: its
    /// head first, then its chunk straight into its place in `dst` (over
    /// tcp, from the socket with no staging copy), checked (checksum,
    /// order, shape) once it is there.
    fn get_chunks(
        &mut self,
        key: &[u8],
        dst: &mut [u8],
        gen: u64,
        chunks: std::ops::Range<usize>,
    ) -> Result<Chunks> {
        let mut ids = Vec::with_capacity(chunks.len());
        for c in chunks {
            let off = (c * CACHE_CHUNK_BYTES_MAX) as u64;
            ids.push(self.post(|b, id, w| {
                encode_get(b, id, w, key, gen, off, CACHE_CHUNK_BYTES_MAX as u64, None)
            })?);
        }
        self.ep.flush(self.timeout)?;
        let deadline = Instant::now() + self.timeout;
        let mut out = Chunks {
            seen: None,
            torn: false,
        };
        let mut absent = 0;
        let mut first_err: Option<ClientError> = None;
        let mut sink = ChunkSink::new(dst, std::mem::take(&mut self.whole));
        let mut fatal: Option<ClientError> = None;
        for &id in &ids {
            let r = match self.recv_chunk(&mut sink, id, deadline) {
                Ok(r) => r,
                Err(e) => {
                    fatal = Some(e);
                    break;
                }
            };
            match r {
                Ok(None) => absent += 1,
                Ok(Some((total, g, exp))) => match out.seen {
                    None => out.seen = Some((total, g, exp)),
                    Some((_, seen, _)) if seen != g => out.torn = true,
                    Some(_) => {}
                },
                Err(e) => {
                    first_err.get_or_insert(e);
                }
            }
        }
        self.whole = std::mem::take(&mut sink.whole);
        if let Some(e) = fatal {
            return Err(e);
        }
        match first_err {
            None => {}
            // Replaced or removed after the first chunk: read it again.
            Some(e) if matches!(e.code(), ErrorCode::ValueChanged) => out.torn = true,
            Some(e) => return Err(e),
        }
        if absent > 0 && (out.seen.is_some() || gen != 0) {
            out.torn = true;
            out.seen = None;
        }
        Ok(out)
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

    fn key_op(&mut self, op: CacheOp, key: &[u8]) -> Result<bool> {
        check_key(key)?;
        let id = self.post(|b, id, w| encode_key_op(b, id, w, op, key))?;
        let mut found = false;
        self.collect(&[id], |_, f| {
            let r = decode_reply(f).map_err(protocol)?;
            found = match r.status {
                ErrorCode::Ok => true,
                ErrorCode::NotFound => false,
                code => {
                    return Err(ClientError::Server {
                        code,
                        message: String::new(),
                    })
                }
            };
            Ok(())
        })?;
        Ok(found)
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
            region: encode_region(&r),
            offset: 0,
            len: self.buffer_bytes as u64,
        };
        let id = self.post(|b, id, w| encode_bind(b, id, w, client_id, &slice))?;
        self.collect(&[id], |_, f| {
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

/// `BUFFER_TOO_SMALL`: a value of `total` bytes and `room` bytes for it.
fn too_small(total: u64, room: usize) -> ClientError {
    ClientError::Server {
        code: ErrorCode::BufferTooSmall,
        message: format!("a {total}-byte value does not fit {room} bytes"),
    }
}

fn encode_region(r: &RemoteRegion) -> [u8; 24] {
    let mut v = Vec::with_capacity(RemoteRegion::ENCODED_BYTES);
    r.encode(&mut v);
    let mut a = [0u8; 24];
    a.copy_from_slice(&v);
    a
}

/// A PUT reply: the generation once the value is whole.
fn put_reply(f: &fabrickv_wire::Frame<'_>, total: u64) -> Result<u64> {
    let r = decode_reply(f).map_err(protocol)?;
    if r.status != ErrorCode::Ok {
        return Err(ClientError::Server {
            code: r.status,
            message: String::new(),
        });
    }
    if r.op != CacheOp::Put || r.b != total {
        return Err(protocol("PUT reply of the wrong shape"));
    }
    Ok(r.generation)
}

/// A GET reply: `None` if absent, else (total, generation, expires_in_ms,
/// chunk offset, inline chunk).
#[allow(clippy::type_complexity)]
fn get_reply<'a>(f: &fabrickv_wire::Frame<'a>) -> Result<Option<(u64, u64, u64, u64, &'a [u8])>> {
    let r = decode_reply(f).map_err(protocol)?;
    match r.status {
        ErrorCode::Ok if r.op == CacheOp::Get => {
            Ok(Some((r.a, r.generation, r.expires_in_ms, r.b, r.data)))
        }
        ErrorCode::Ok => Err(protocol("GET reply of the wrong shape")),
        ErrorCode::NotFound => Ok(None),
        ErrorCode::BufferTooSmall => Err(ClientError::Server {
            code: ErrorCode::BufferTooSmall,
            message: format!("the {}-byte value does not fit the slice", r.a),
        }),
        code => Err(ClientError::Server {
            code,
            message: String::new(),
        }),
    }
}

/// Why a reply could not be used.
enum Bad {
    /// The connection cannot be trusted further (a reply out of order or
    /// undecodable): the call ends.
    Fatal(ClientError),
    /// The server refused the request whole (an ERROR frame); the
    /// replies after it are still read.
    Refused(ClientError),
}

use Bad::{Fatal, Refused};

/// Replies come back in the order their requests went out; one that
/// does not answer `id` means the stream cannot be trusted.
fn check_order(got: u64, id: u64) -> std::result::Result<(), Bad> {
    if got == id {
        return Ok(());
    }
    Err(Fatal(protocol(format!(
        "reply {got} out of order (expected {id})"
    ))))
}

/// Decodes a reply message that must answer request `id`.
fn reply_frame(m: &[u8], id: u64) -> std::result::Result<fabrickv_wire::Frame<'_>, Bad> {
    let frame = decode_frame(m).map_err(|e| Fatal(protocol(e)))?;
    check_order(frame.header.request_id, id)?;
    if frame.header.kind == FrameKind::Error {
        return Err(Refused(match decode_error(&frame) {
            Ok((code, message)) => ClientError::Server { code, message },
            Err(e) => protocol(e),
        }));
    }
    Ok(frame)
}

/// A GET chunk reply as [`CacheClient::get_chunks`] uses it: `None` if
/// absent, else (total, generation, expires_in_ms).
type ChunkReply = Result<Option<(u64, u64, u64)>>;

/// Lands the inline chunks of GET replies in the caller's slice: a reply
/// whose head says it is a chunk of a value that fits gets its chunk
/// read straight into place; anything else is taken whole.
struct ChunkSink<'d> {
    dst: &'d mut [u8],
    /// The head of the message split last.
    head: [u8; GET_REPLY_HEAD_BYTES],
    /// Where that message's chunk landed in `dst`, and its length.
    at: usize,
    len: usize,
    /// The message taken whole last.
    whole: Vec<u8>,
}

impl SplitSink for ChunkSink<'_> {
    fn tail(&mut self, head: &[u8], len: usize) -> Option<&mut [u8]> {
        let h = peek_get_reply_head(head, len).ok()?;
        // Only a chunk that lies inside a value that fits `dst` is placed;
        // the rest (refusals, a value too large) are read whole and
        // decoded as before. The checksum is checked once it has landed.
        if h.status != ErrorCode::Ok || h.total_len > self.dst.len() as u64 {
            return None;
        }
        let end = h.offset.checked_add(h.chunk_len as u64)?;
        if end > h.total_len {
            return None;
        }
        self.head.copy_from_slice(head);
        self.at = h.offset as usize;
        self.len = h.chunk_len;
        Some(&mut self.dst[self.at..end as usize])
    }

    fn whole(&mut self, msg: &[u8]) {
        self.whole.clear();
        self.whole.extend_from_slice(msg);
    }
}

impl<'d> ChunkSink<'d> {
    /// A sink landing chunks in `dst`, taking refused or unplaceable
    /// replies whole into `whole` (a buffer reused from call to call).
    fn new(dst: &'d mut [u8], whole: Vec<u8>) -> ChunkSink<'d> {
        ChunkSink {
            dst,
            head: [0; GET_REPLY_HEAD_BYTES],
            at: 0,
            len: 0,
            whole,
        }
    }

    /// The reply whose chunk landed in place: checked whole now.
    ///
    /// A chunk that fails its checksum in a well-framed reply is this
    /// request's own failure, reported as `VALUE_CHANGED` so that the
    /// callers read the value again: over tcp a server sends large chunks
    /// from the value's memory without a copy, and memory reused before
    /// this reader copied it out arrives changed
    /// (`fabrickv_transport::tcp::SPLICE_PART_BYTES_MIN`).
    fn split_reply(&self, id: u64) -> std::result::Result<ChunkReply, Bad> {
        let chunk = &self.dst[self.at..self.at + self.len];
        match decode_split_get_reply(&self.head, chunk) {
            Ok((header, r)) => {
                check_order(header.request_id, id)?;
                Ok(Ok(Some((r.a, r.generation, r.expires_in_ms))))
            }
            Err(WireError::BadChecksum) => {
                // The head was decoded when the chunk was placed (`tail`).
                let header = FrameHeader::decode(&self.head).map_err(|e| Fatal(protocol(e)))?;
                check_order(header.request_id, id)?;
                Ok(Err(ClientError::Server {
                    code: ErrorCode::ValueChanged,
                    message: "a chunk failed its checksum (changed in flight)".into(),
                }))
            }
            Err(e) => Err(Fatal(protocol(e))),
        }
    }

    /// The reply taken whole: its chunk, if any, copied into place.
    fn whole_reply(&mut self, id: u64) -> std::result::Result<ChunkReply, Bad> {
        let frame = reply_frame(&self.whole, id)?;
        Ok(get_reply(&frame).map(|g| {
            g.map(|(total, gen, exp, off, data)| {
                let at = off as usize;
                if total as usize <= self.dst.len() && at + data.len() <= self.dst.len() {
                    self.dst[at..at + data.len()].copy_from_slice(data);
                }
                (total, gen, exp)
            })
        }))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use fabrickv_transport::SplitSink;
    use fabrickv_wire::cache::GetReplyWriter;

    /// A split GET reply for request `id`: head, then a 40 KiB chunk.
    fn split_reply_for(id: u64, chunk: &[u8]) -> Vec<u8> {
        let mut head = Vec::new();
        let w = GetReplyWriter::begin(&mut head, id, 0, ErrorCode::Ok, 3, chunk.len() as u64, 0, 0);
        w.finish_before(
            &mut head,
            chunk.len(),
            fabrickv_wire::checksum::crc32c(chunk),
        );
        head
    }

    #[test]
    fn a_chunk_changed_in_flight_is_read_again_not_fatal() {
        let chunk: Vec<u8> = (0..40_960u32).map(|i| (i * 7) as u8).collect();
        let head = split_reply_for(9, &chunk);
        let mut dst = vec![0u8; chunk.len()];
        let mut sink = ChunkSink::new(&mut dst, Vec::new());
        let tail = sink.tail(&head, head.len() + chunk.len()).unwrap();
        tail.copy_from_slice(&chunk);
        // Intact: placed and accepted.
        let r = sink.split_reply(9).ok().unwrap().unwrap();
        assert_eq!(r, Some((chunk.len() as u64, 3, 0)));
        // One byte changed after the server checksummed the value (its
        // memory reused while the spliced pages were in flight).
        sink.dst[100] ^= 1;
        match sink.split_reply(9) {
            Ok(Err(e)) => assert_eq!(e.code(), ErrorCode::ValueChanged),
            _ => panic!("a bad chunk must be this request's own error"),
        }
        // Still in order: a reply to another request is fatal either way.
        assert!(matches!(sink.split_reply(10), Err(Fatal(_))));
    }
}
