//! The GETs of a [`CacheClient`]: one-sided into the registered buffer, or
//! inline in chunks that land in place, pinned to one generation of the
//! value and read again when it changes in between.

use std::time::{Duration, Instant};

use fabrickv_transport::{Landed, RemoteRegion};
use fabrickv_types::limits::CACHE_CHUNK_BYTES_MAX;
use fabrickv_types::ErrorCode;
use fabrickv_wire::cache::{encode_get, RegionSlice, GET_REPLY_HEAD_BYTES};

use super::reply::{get_reply, Bad, ChunkReply, ChunkSink};
use super::{
    too_small, CacheClient, Chunks, Placed, CACHE_GET_RETRY_PAUSE_US_MAX, CACHE_GET_RETRY_WINDOW_MS,
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
    pub(super) fn get_many_inline(
        &mut self,
        buf: &mut [u8],
        items: &[(&[u8], usize)],
    ) -> Result<Vec<Result<Option<Placed>>>> {
        for &(k, _) in items {
            self.post(|b, id, w| {
                encode_get(b, id, w, k, 0, 0, CACHE_CHUNK_BYTES_MAX as u64, None)
            })?;
        }
        self.sessions.flush()?;
        let deadline = self.sessions.deadline();
        let mut firsts = Vec::with_capacity(items.len());
        let mut whole = std::mem::take(&mut self.whole);
        let mut fatal = None;
        for &(_, off) in items {
            let mut sink = ChunkSink::new(&mut buf[off..], std::mem::take(&mut whole));
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

    pub(super) fn get_many_one_sided(
        &mut self,
        r: RemoteRegion,
        items: &[(&[u8], usize)],
    ) -> Result<Vec<Result<Option<Placed>>>> {
        let region = region_bytes(&r);
        for &(k, off) in items {
            let dest = RegionSlice {
                region,
                offset: off as u64,
                len: (self.buffer_bytes - off) as u64,
            };
            self.post(|b, id, w| encode_get(b, id, w, k, 0, 0, 0, Some(&dest)))?;
        }
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
