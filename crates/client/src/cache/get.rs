//! The GETs of a [`CacheClient`]: one-sided into the registered buffer, or
//! inline in chunks that land in place, pinned to one generation of the
//! value and read again when it changes in between.

use std::time::{Duration, Instant};

use fabrickv_transport::{Landed, RemoteRegion};
use fabrickv_types::limits::{CACHE_BATCH_KEYS_MAX, CACHE_CHUNK_BYTES_MAX};
use fabrickv_types::ErrorCode;
use fabrickv_wire::cache::{encode_get, encode_get_read_now, RegionSlice, GET_REPLY_HEAD_BYTES};

use super::reply::{get_reply, reply_frame, Bad, ChunkReply, ChunkSink};
use super::window::Window;
use super::{
    check_key, too_small, Buffer, CacheClient, Chunks, Placed, CACHE_GET_RETRY_PAUSE_US_MAX,
    CACHE_GET_RETRY_WINDOW_MS, CACHE_PIPELINE_WINDOW_BYTES,
};
use crate::conn::region_bytes;
use crate::{ClientError, Result};

impl CacheClient {
    /// [`CacheClient::get_many_at`] with inline chunks: the first chunk
    /// of every key is asked for at once and each lands at its key's
    /// offset in `buf` as its reply is read, so a batch of values of up to
    /// one chunk costs one round trip. A value of several chunks then has
    /// the rest asked for at once, pinned to the generation its first
    /// chunk reported; one that changed in between is read again whole.
    /// Each `(key, offset, end)` lands in `buf[offset..end]`: a value
    /// longer is refused (`BUFFER_TOO_SMALL`) with nothing written past
    /// `end`.
    pub(super) fn get_many_inline(
        &mut self,
        buf: &mut [u8],
        items: &[(&[u8], usize, usize)],
    ) -> Result<Vec<Result<Option<Placed>>>> {
        self.post_inline_firsts(items.iter().map(|&(k, _, _)| k))?;
        self.collect_inline(buf, items)
    }

    /// Posts and sends the request of each key's first chunk: the first
    /// half of [`CacheClient::get_many_inline`].
    pub(super) fn post_inline_firsts<'k>(
        &mut self,
        keys: impl Iterator<Item = &'k [u8]>,
    ) -> Result<()> {
        for k in keys {
            self.post(|b, id, w| {
                encode_get(b, id, w, k, 0, 0, CACHE_CHUNK_BYTES_MAX as u64, None)
            })?;
        }
        Ok(self.sessions.flush()?)
    }

    /// The second half of [`CacheClient::get_many_inline`]: lands the
    /// first chunks as their replies come, then reads the rest of each
    /// value longer than one chunk.
    pub(super) fn collect_inline(
        &mut self,
        buf: &mut [u8],
        items: &[(&[u8], usize, usize)],
    ) -> Result<Vec<Result<Option<Placed>>>> {
        let deadline = self.sessions.deadline();
        let mut firsts = Vec::with_capacity(items.len());
        let mut whole = std::mem::take(&mut self.whole);
        let mut fatal = None;
        for &(_, off, end) in items {
            let mut sink = ChunkSink::new(&mut buf[off..end], std::mem::take(&mut whole));
            let r = self.recv_chunk(&mut sink, deadline);
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
        for (first, &(k, off, end)) in firsts.into_iter().zip(items) {
            let dst = &mut buf[off..end];
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

    /// Receives the reply to the oldest request awaited through `sink`
    /// (`Sessions::receive_split`: replies to requests given up before it
    /// are dropped, never landed). The outer error ends the call (every
    /// request in flight is then given up); the inner one is this
    /// request's own (the replies after it are still read).
    fn recv_chunk(&mut self, sink: &mut ChunkSink<'_>, deadline: Instant) -> Result<ChunkReply> {
        self.sessions.receive_split(
            0,
            deadline,
            GET_REPLY_HEAD_BYTES,
            sink,
            |landed, sink, sent| {
                let r = match landed {
                    Landed::Split => sink.split_reply(Some(sent.id)),
                    Landed::Whole => sink.whole_reply(Some(sent.id)),
                };
                match r {
                    Ok(r) => Ok(r),
                    Err(Bad::Fatal(e)) => Err(e),
                    Err(Bad::Refused(e)) => Ok(Err(e)),
                }
            },
        )
    }

    /// Reads each `(key, room)` and hands its value to `take` in key
    /// order, as it lands: `take(i, r)` gets key `i`'s bytes (`None` if
    /// absent) or its own refusal (`BUFFER_TOO_SMALL` for a value larger
    /// than `room` or than the receive buffer: the server checks the size
    /// before it writes anything). The bytes are lent from the receive
    /// buffer until `take` returns. When `take` returns false no later
    /// key is handed to it (the requests in flight are still read, so
    /// the connection stays in step); the outer error is the
    /// connection's.
    ///
    /// Over a registered region the batch is a pipeline: the reads go
    /// into a ring of at most [`CACHE_PIPELINE_WINDOW_BYTES`] of the
    /// buffer (or the largest `room`, if larger), and as soon as a value
    /// is handed over its place is asked for again by a later key. So
    /// while `take` copies one value out the server writes the next ones,
    /// on another CPU, and the ring stays small enough to stay in the
    /// caches both share; one round trip is paid for the whole batch, not
    /// one per key. The wait for each reply is bounded by the timeout.
    /// Elsewhere the values land inline in rounds that fill the buffer
    /// (as [`CacheClient::get_many_at`] lands them) and are handed over
    /// after each round.
    pub fn get_many_each(
        &mut self,
        items: &[(&[u8], usize)],
        mut take: impl FnMut(usize, Result<Option<&[u8]>>) -> bool,
    ) -> Result<()> {
        for (k, _) in items {
            check_key(k)?;
        }
        match self.buffer {
            Buffer::Region(r) => self.each_one_sided(r, items, &mut take),
            Buffer::Local(_) => self.each_in_rounds(items, &mut take),
        }
    }

    /// [`CacheClient::get_many_each`] over a registered region: the
    /// pipeline.
    fn each_one_sided(
        &mut self,
        r: RemoteRegion,
        items: &[(&[u8], usize)],
        take: &mut impl FnMut(usize, Result<Option<&[u8]>>) -> bool,
    ) -> Result<()> {
        let region = region_bytes(&r);
        let n = self.buffer_bytes;
        let largest = items
            .iter()
            .map(|&(_, room)| room.min(n))
            .max()
            .unwrap_or(0);
        let mut window = Window::new(CACHE_PIPELINE_WINDOW_BYTES.max(largest).min(n));
        let mut posted = 0;
        let mut handed = 0;
        let mut stopped = false;
        // Each reply as it is read: (total bytes, or None if absent) or
        // the key's refusal; drained after every receive.
        let mut replies: Vec<Result<Option<u64>>> = Vec::new();
        while handed < items.len() {
            while !stopped && posted < items.len() && window.taken() < CACHE_BATCH_KEYS_MAX {
                let (key, room) = items[posted];
                let room = room.min(n);
                let Some(offset) = window.take(room) else {
                    break;
                };
                let dest = RegionSlice {
                    region,
                    offset: offset as u64,
                    len: room as u64,
                };
                self.post(|b, id, w| encode_get_read_now(b, id, w, key, &dest))?;
                posted += 1;
            }
            if window.taken() == 0 {
                break;
            }
            self.sessions.flush()?;
            let deadline = self.sessions.deadline();
            replies.clear();
            let got = self.sessions.receive(0, deadline, |m, sent| {
                match reply_frame(m, Some(sent.id)) {
                    Ok(f) => replies.push(get_reply(&f).map(|g| g.map(|g| g.0))),
                    Err(Bad::Refused(e)) => replies.push(Err(e)),
                    Err(Bad::Fatal(e)) => return Err(e),
                }
                Ok(())
            });
            if let Err(e) = got {
                self.sessions.session(0).queue_mut().give_up_all();
                return Err(e);
            }
            for r in replies.drain(..) {
                let (offset, room) = window
                    .free()
                    .ok_or_else(|| ClientError::Protocol("a reply to no read".into()))?;
                let i = handed;
                handed += 1;
                if stopped {
                    continue;
                }
                let r = match r {
                    Ok(Some(total)) if total > room as u64 => Err(ClientError::Protocol(format!(
                        "the server placed {total} bytes in a {room}-byte slice"
                    ))),
                    r => r,
                };
                let buffer = self.buffer()?;
                let value = r.map(|o| o.map(|total| &buffer[offset..offset + total as usize]));
                stopped = !take(i, value);
            }
        }
        Ok(())
    }

    /// [`CacheClient::get_many_each`] without a registered region: as
    /// many keys as fit the buffer side by side, each in exactly `room`
    /// bytes, are read at once, then handed over.
    fn each_in_rounds(
        &mut self,
        items: &[(&[u8], usize)],
        take: &mut impl FnMut(usize, Result<Option<&[u8]>>) -> bool,
    ) -> Result<()> {
        let n = self.buffer_bytes;
        let mut start = 0;
        let mut round: Vec<(&[u8], usize, usize)> = Vec::new();
        while start < items.len() {
            let mut used = 0;
            let mut end = start;
            while end < items.len() && end - start < CACHE_BATCH_KEYS_MAX {
                let room = items[end].1.min(n);
                if end > start && used + room > n {
                    break;
                }
                used += room;
                end += 1;
            }
            round.clear();
            let mut offset = 0;
            for &(key, room) in &items[start..end] {
                let room = room.min(n);
                round.push((key, offset, offset + room));
                offset += room;
            }
            let mut buf = match std::mem::replace(&mut self.buffer, Buffer::Local(Vec::new())) {
                Buffer::Local(v) => v,
                Buffer::Region(r) => {
                    self.buffer = Buffer::Region(r);
                    return Err(ClientError::Protocol("buffer changed kind".into()));
                }
            };
            let placed = self.get_many_inline(&mut buf, &round);
            self.buffer = Buffer::Local(buf);
            let placed = placed?;
            let buffer = self.buffer()?;
            for (i, p) in (start..end).zip(placed) {
                let value = p.map(|o| o.map(|p| &buffer[p.offset..p.offset + p.len]));
                if !take(i, value) {
                    return Ok(());
                }
            }
            start = end;
        }
        Ok(())
    }

    /// Posts and sends a one-sided GET of each `(key, offset)` into the
    /// region `r`, its slice running from `offset` to the buffer's end.
    pub(super) fn post_one_sided(
        &mut self,
        r: RemoteRegion,
        items: &[(&[u8], usize)],
    ) -> Result<()> {
        let region = region_bytes(&r);
        for &(k, off) in items {
            let dest = RegionSlice {
                region,
                offset: off as u64,
                len: (self.buffer_bytes - off) as u64,
            };
            self.post(|b, id, w| encode_get(b, id, w, k, 0, 0, 0, Some(&dest)))?;
        }
        Ok(self.sessions.flush()?)
    }

    /// Reads the replies to [`CacheClient::post_one_sided`] of `items`.
    pub(super) fn collect_one_sided(
        &mut self,
        items: &[(&[u8], usize)],
    ) -> Result<Vec<Result<Option<Placed>>>> {
        let mut out: Vec<Result<Option<Placed>>> = Vec::with_capacity(items.len());
        self.collect(|i, f| {
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
    pub(super) fn get_inline(
        &mut self,
        key: &[u8],
        dst: &mut [u8],
        guess: usize,
    ) -> Result<Option<Placed>> {
        let started = Instant::now();
        let window = Duration::from_millis(CACHE_GET_RETRY_WINDOW_MS);
        let mut pause_us = 0u64;
        let mut reads = 0u64;
        loop {
            if reads > 0 {
                if started.elapsed() >= window {
                    break;
                }
                pause_us = (pause_us * 2).clamp(50, CACHE_GET_RETRY_PAUSE_US_MAX);
                std::thread::sleep(Duration::from_micros(pause_us));
            }
            reads += 1;
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
            message: format!(
                "the value changed during {reads} reads in a row over {} ms",
                started.elapsed().as_millis()
            ),
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
        let n = chunks.len();
        for c in chunks {
            let off = (c * CACHE_CHUNK_BYTES_MAX) as u64;
            self.post(|b, id, w| {
                encode_get(b, id, w, key, gen, off, CACHE_CHUNK_BYTES_MAX as u64, None)
            })?;
        }
        self.sessions.flush()?;
        let deadline = self.sessions.deadline();
        let mut out = Chunks {
            seen: None,
            torn: false,
        };
        let mut absent = 0;
        let mut first_err: Option<ClientError> = None;
        let mut sink = ChunkSink::new(dst, std::mem::take(&mut self.whole));
        let mut fatal: Option<ClientError> = None;
        for _ in 0..n {
            let r = match self.recv_chunk(&mut sink, deadline) {
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
}
