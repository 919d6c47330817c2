//! Values over `VALUE_BYTES_MAX` over the native protocol, streamed: the
//! PUT_CHUNK or GET_CHUNK pieces of one value go to the key's worker one
//! frame each, [`LARGE_CHUNKS_IN_FLIGHT`] of them in flight, the next
//! posted as each reply comes in, so the connection never waits a round
//! trip between pieces. A GET_CHUNK's reply is received split
//! (`Endpoint::recv_split`): its head into the endpoint's buffer and its
//! piece from the socket straight into its place in the caller's buffer,
//! checked against the frame's checksum once there. A piece thus crosses
//! user space once, in the kernel's copy, as a RESP GET's value does.
//!
//! The pieces of one transfer all travel on one connection, whose worker
//! runs them in order; a reply to a frame of an earlier call given up
//! (timed out, or failed with pieces still in flight) is read and dropped
//! here as `collect` drops it.

use fabrickv_transport::{Landed, SplitSink};
use fabrickv_types::limits::LARGE_CHUNK_BYTES_MAX;
use fabrickv_types::{ErrorCode, KeyHash};
use fabrickv_wire::{
    decode_frame, FrameKind, OneResultHead, PutCondition, RequestBuilder, ResponseIter,
    ONE_RESULT_HEAD_BYTES,
};

use crate::batch::FrameTag;
use crate::conn::{protocol, refusal};
use crate::mget::Large;
use crate::{Client, ClientError, Result};

/// PUT_CHUNK or GET_CHUNK pieces of one value in flight at once (8 MiB):
/// enough that the server always has the next piece's request when it
/// finishes one and the socket buffers never run dry between pieces, few
/// enough that a failed transfer wastes little. A larger window measured
/// no faster on loopback (`fabrickv bench bigvalue`).
pub const LARGE_CHUNKS_IN_FLIGHT: usize = 8;

/// A large value's PUT_CHUNK transfer: what each of its pieces names.
#[derive(Debug, Clone, Copy)]
pub struct LargePut<'a> {
    /// The key the value is stored under.
    pub key: &'a [u8],
    /// The whole value.
    pub value: &'a [u8],
    /// The transfer's id (unique in this process).
    pub transfer: u64,
    /// TTL in wire milliseconds (0: none), applied at the last piece.
    pub ttl_ms: u64,
    /// The condition, applied at the last piece.
    pub cond: PutCondition,
}

/// A value a GET answered `LARGE_VALUE` for: what each of its GET_CHUNK
/// pieces names.
#[derive(Debug, Clone, Copy)]
pub struct LargeGet<'a> {
    /// The key it was read under.
    pub key: &'a [u8],
    /// Its length in bytes.
    pub total: usize,
    /// The pin the server holds it under.
    pub tag: u64,
}

impl<'a> LargeGet<'a> {
    /// The value a batch's `LARGE_VALUE` answer for `key` names.
    pub(crate) fn of(key: &'a [u8], l: Large) -> LargeGet<'a> {
        LargeGet {
            key,
            total: l.total,
            tag: l.tag,
        }
    }
}

/// Where the reply to one piece goes. The layer hands it only replies to
/// requests still awaited (those of an earlier call given up are read and
/// dropped by `Sessions::receive_split`), so every reply it sees is this
/// call's oldest piece; its request id is checked once it has landed.
struct PieceSink<'a> {
    /// The piece's place (empty for a PUT_CHUNK's reply).
    dst: &'a mut [u8],
    /// The head of a reply whose piece was received into `dst`.
    split: Option<OneResultHead>,
    /// The reply taken whole: its request id, and its result's code and
    /// the frame's status, or why it is not a reply.
    whole: Option<(u64, Result<(ErrorCode, u16)>)>,
}

impl SplitSink for PieceSink<'_> {
    fn tail(&mut self, head: &[u8], len: usize) -> Option<&mut [u8]> {
        let h = OneResultHead::parse(head, len)?;
        if h.code != ErrorCode::Ok || h.value_len != self.dst.len() {
            return None;
        }
        self.split = Some(h);
        Some(&mut *self.dst)
    }

    fn whole(&mut self, msg: &[u8]) {
        self.split = None;
        self.whole = Some(match decode_frame(msg) {
            Ok(frame) => (frame.header.request_id, self.take_whole(&frame)),
            Err(e) => (0, Err(protocol(e))),
        });
    }
}

impl PieceSink<'_> {
    /// A reply received whole: checked, its piece (if any) copied into
    /// place. Returns the result's code and the frame's status.
    fn take_whole(&mut self, frame: &fabrickv_wire::Frame<'_>) -> Result<(ErrorCode, u16)> {
        match frame.header.kind {
            FrameKind::Response => {
                let mut results = ResponseIter::new(frame).map_err(protocol)?;
                let (Some(r), None) = (results.next(), results.next()) else {
                    return Err(ClientError::Protocol(
                        "result count differs from operation count".into(),
                    ));
                };
                if r.code() == ErrorCode::Ok {
                    if r.value.len() != self.dst.len() {
                        return Err(ClientError::Protocol(
                            "GET_CHUNK of the wrong length".into(),
                        ));
                    }
                    self.dst.copy_from_slice(r.value);
                }
                Ok((r.code(), frame.header.status))
            }
            FrameKind::Error => Err(refusal(frame)),
            k => Err(ClientError::Protocol(format!("unexpected {k:?} frame"))),
        }
    }
}

impl Client {
    /// The session (worker) a key's pieces travel on.
    fn piece_session(&self, key: &[u8]) -> usize {
        usize::from(self.worker_of_hash(KeyHash::of(key)))
    }

    /// Receives the reply to this call's oldest piece in flight on session
    /// `s`, landing its bytes in `dst`, and returns its code. Replies to
    /// the pieces of an earlier call given up are read and dropped by the
    /// layer first.
    fn recv_piece(&mut self, s: usize, dst: &mut [u8]) -> Result<ErrorCode> {
        let deadline = self.sessions.deadline();
        let mut sink = PieceSink {
            dst,
            split: None,
            whole: None,
        };
        let (code, status) = self.sessions.receive_split(
            s,
            deadline,
            ONE_RESULT_HEAD_BYTES,
            &mut sink,
            |landed, sink, sent| {
                let (id, r) = match (landed, sink.split, sink.whole.take()) {
                    (Landed::Split, Some(h), _) => match h.check(sink.dst) {
                        Ok(()) => (h.header.request_id, (h.code, h.header.status)),
                        // The frame is whole, the piece is not: the server
                        // splices pieces from the value's memory, and a
                        // value freed and its memory reused before the
                        // kernel sent them reads torn. The connection stays
                        // in step; the value is read again (`read_large`).
                        Err(_) => (
                            h.header.request_id,
                            (ErrorCode::BadChecksum, h.header.status),
                        ),
                    },
                    (Landed::Whole, _, Some((id, r))) => (id, r?),
                    _ => return Err(ClientError::Protocol("a piece's reply went astray".into())),
                };
                if id != sent.id {
                    return Err(ClientError::Protocol(format!(
                        "reply {id} where {} was next",
                        sent.id
                    )));
                }
                Ok(r)
            },
        )?;
        self.table_stale |= status == ErrorCode::WrongWorker.as_u16();
        Ok(code)
    }

    /// Gives up the pieces of a failed call still in flight on session
    /// `s`: their replies are read and dropped by the next call's receive.
    fn give_up_pieces(&mut self, s: usize) {
        self.sessions.session(s).queue_mut().give_up_all();
    }

    /// Reads the value a GET answered `LARGE_VALUE` for (`get`) and
    /// appends it to `value`, GET_CHUNK pieces streamed
    /// [`LARGE_CHUNKS_IN_FLIGHT`] at a time; on an error `value` is as it
    /// was. The server unpins the value once its last piece is read; each
    /// piece has a frame of its own, so none is answered `REPLY_FULL` and
    /// they are read in order.
    pub(crate) fn read_pieces(&mut self, get: &LargeGet<'_>, value: &mut Vec<u8>) -> Result<()> {
        let start = value.len();
        let r = self.read_pieces_after(get, value, start);
        if r.is_err() {
            value.truncate(start);
        }
        r
    }

    /// [`Client::read_pieces`] into `value[start..]`. The room is
    /// reserved at once (pages the kernel maps as they are written) but
    /// zeroed a piece at a time, just before the piece lands: zeroing a
    /// 512 MiB value before the first GET_CHUNK, on a busy machine, took
    /// longer than the server keeps an untouched pin (`KV_LARGE_IDLE_MS`).
    fn read_pieces_after(
        &mut self,
        get: &LargeGet<'_>,
        value: &mut Vec<u8>,
        start: usize,
    ) -> Result<()> {
        let LargeGet { key, tag, total } = *get;
        let s = self.piece_session(key);
        value.reserve_exact(total);
        let n = total.div_ceil(LARGE_CHUNK_BYTES_MAX);
        // Piece `i`'s offset in the value and its length.
        let piece = |i: usize| {
            let at = i * LARGE_CHUNK_BYTES_MAX;
            (at, (total - at).min(LARGE_CHUNK_BYTES_MAX))
        };
        let mut sent = 0;
        for got in 0..n {
            while sent < n && sent < got + LARGE_CHUNKS_IN_FLIGHT {
                let (at, len) = piece(sent);
                let replica = self.replica_reads;
                self.sessions.post(s, FrameTag::default(), |b, id, w| {
                    let mut r = RequestBuilder::new(b, id, w);
                    if replica {
                        r.get_chunk_any_replica(key, tag, at as u64, len as u32);
                    } else {
                        r.get_chunk(key, tag, at as u64, len as u32);
                    }
                    r.finish();
                })?;
                sent += 1;
            }
            self.sessions.flush()?;
            let (at, len) = piece(got);
            value.resize(start + at + len, 0);
            let code = self.recv_piece(s, &mut value[start + at..])?;
            if code != ErrorCode::Ok {
                // The pieces still in flight are dropped by the next call.
                self.give_up_pieces(s);
                return Err(ClientError::Server {
                    code,
                    message: String::new(),
                });
            }
        }
        Ok(())
    }

    /// Sends a value as the PUT_CHUNK pieces of its transfer, streamed
    /// [`LARGE_CHUNKS_IN_FLIGHT`] at a time; returns the code of the first
    /// piece refused (later pieces of a dropped transfer would answer
    /// `NO_SUCH_TRANSFER`), else the last piece's, which stored the value.
    pub(crate) fn write_pieces(&mut self, put: &LargePut<'_>) -> Result<ErrorCode> {
        let LargePut {
            key,
            value,
            transfer,
            ttl_ms,
            cond,
        } = *put;
        let s = self.piece_session(key);
        let total = value.len() as u64;
        let pieces: Vec<&[u8]> = value.chunks(LARGE_CHUNK_BYTES_MAX).collect();
        let mut sent = 0;
        let mut code = ErrorCode::Ok;
        for got in 0..pieces.len() {
            while sent < pieces.len() && sent < got + LARGE_CHUNKS_IN_FLIGHT {
                let at = (sent * LARGE_CHUNK_BYTES_MAX) as u64;
                let bytes = pieces[sent];
                let epoch = self.map_epoch();
                self.sessions.post(s, FrameTag::default(), |b, id, w| {
                    let mut r = RequestBuilder::new(b, id, w);
                    r.stamp_map_epoch(epoch);
                    r.put_chunk(key, transfer, total, at, bytes, ttl_ms, cond);
                    r.finish();
                })?;
                sent += 1;
            }
            self.sessions.flush()?;
            code = self.recv_piece(s, &mut [])?;
            if code != ErrorCode::Ok {
                // The pieces still in flight are dropped by the next call.
                self.give_up_pieces(s);
                break;
            }
        }
        Ok(code)
    }
}
