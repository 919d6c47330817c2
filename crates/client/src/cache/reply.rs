//! How a [`super::CacheClient`] reads its replies: PUT and GET replies
//! decoded, each checked to answer the oldest request in flight, and the
//! sink that lands a GET's inline chunk straight in its place.

use fabrickv_rpc::RpcError;
use fabrickv_transport::SplitSink;
use fabrickv_types::ErrorCode;
use fabrickv_wire::cache::{
    decode_reply, decode_split_get_reply, peek_get_reply_head, CacheOp, GET_REPLY_HEAD_BYTES,
};
use fabrickv_wire::{decode_frame, FrameHeader, FrameKind, WireError};

use crate::conn::{protocol, refusal};
use crate::{ClientError, Result};

/// A PUT reply: the generation once the value is whole.
pub(super) fn put_reply(f: &fabrickv_wire::Frame<'_>, total: u64) -> Result<u64> {
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
pub(super) fn get_reply<'a>(
    f: &fabrickv_wire::Frame<'a>,
) -> Result<Option<(u64, u64, u64, u64, &'a [u8])>> {
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
pub(super) enum Bad {
    /// The connection cannot be trusted further (a reply out of order or
    /// undecodable): the call ends.
    Fatal(ClientError),
    /// The server refused the request whole (an ERROR frame); the
    /// replies after it are still read.
    Refused(ClientError),
}

use Bad::{Fatal, Refused};

/// Replies come back in the order their requests went out; one that
/// does not answer `id`, the oldest request in flight (`None`: none is),
/// means the stream cannot be trusted.
fn check_order(got: u64, id: Option<u64>) -> std::result::Result<(), Bad> {
    if Some(got) == id {
        return Ok(());
    }
    Err(Fatal(RpcError::OutOfOrder { got, expected: id }.into()))
}

/// Decodes a reply message that must answer request `id`, the oldest in
/// flight.
pub(super) fn reply_frame(
    m: &[u8],
    id: Option<u64>,
) -> std::result::Result<fabrickv_wire::Frame<'_>, Bad> {
    let frame = decode_frame(m).map_err(|e| Fatal(protocol(e)))?;
    check_order(frame.header.request_id, id)?;
    if frame.header.kind == FrameKind::Error {
        return Err(Refused(refusal(&frame)));
    }
    Ok(frame)
}

/// A GET chunk reply as [`CacheClient::get_chunks`] uses it: `None` if
/// absent, else (total, generation, expires_in_ms).
pub(super) type ChunkReply = Result<Option<(u64, u64, u64)>>;

/// Lands the inline chunks of GET replies in the caller's slice: a reply
/// whose head says it is a chunk of a value that fits gets its chunk
/// read straight into place; anything else is taken whole.
pub(super) struct ChunkSink<'d> {
    dst: &'d mut [u8],
    /// The head of the message split last.
    head: [u8; GET_REPLY_HEAD_BYTES],
    /// Where that message's chunk landed in `dst`, and its length.
    at: usize,
    len: usize,
    /// The message taken whole last.
    pub(super) whole: Vec<u8>,
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
    pub(super) fn new(dst: &'d mut [u8], whole: Vec<u8>) -> ChunkSink<'d> {
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
    pub(super) fn split_reply(&self, id: Option<u64>) -> std::result::Result<ChunkReply, Bad> {
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
    pub(super) fn whole_reply(&mut self, id: Option<u64>) -> std::result::Result<ChunkReply, Bad> {
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
        let r = sink.split_reply(Some(9)).ok().unwrap().unwrap();
        assert_eq!(r, Some((chunk.len() as u64, 3, 0)));
        // One byte changed after the server checksummed the value (its
        // memory reused while the spliced pages were in flight).
        sink.dst[100] ^= 1;
        match sink.split_reply(Some(9)) {
            Ok(Err(e)) => assert_eq!(e.code(), ErrorCode::ValueChanged),
            _ => panic!("a bad chunk must be this request's own error"),
        }
        // Still in order: a reply to another request is fatal either way.
        assert!(matches!(sink.split_reply(Some(10)), Err(Fatal(_))));
    }
}
