//! Response bodies: one result per request operation, in request order.
//!
//! ```text
//! offset size field
//!      0    2 status     ErrorCode of this operation
//!      2    2 reserved   must be 0
//!      4    4 value_len  bytes of value (GET hits only)
//!      8    . value
//! ```

use fabrickv_types::limits::{FRAME_HEADER_BYTES, RESULT_HEADER_BYTES, VALUE_BYTES_MAX};
use fabrickv_types::ErrorCode;

use crate::header::{Entries, Frame, FrameHeader, FrameKind, FrameWriter, WireError};
use crate::{le_u16, le_u32};

/// Bytes of a response frame of one result before its value: the frame
/// header and the result header. A client receives a GET_CHUNK's reply
/// split here, its piece straight from the socket into its place in the
/// caller's buffer ([`OneResultHead`]).
pub const ONE_RESULT_HEAD_BYTES: usize = FRAME_HEADER_BYTES + RESULT_HEADER_BYTES;

/// The head of a response frame holding one result, read before its value
/// has arrived: the frame's checks that need no body bytes are done, the
/// checksum waits for the value ([`OneResultHead::check`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OneResultHead {
    /// The frame's header.
    pub header: FrameHeader,
    /// The result's status.
    pub code: ErrorCode,
    /// Bytes of the result's value, the rest of the message.
    pub value_len: usize,
    /// The result header, which the checksum covers with the value.
    result: [u8; RESULT_HEADER_BYTES],
}

impl OneResultHead {
    /// Parses the first [`ONE_RESULT_HEAD_BYTES`] of a message of
    /// `msg_len` bytes; `None` unless it is a RESPONSE of exactly one
    /// result whose value is the rest of the message.
    pub fn parse(head: &[u8], msg_len: usize) -> Option<OneResultHead> {
        let head = head.get(..ONE_RESULT_HEAD_BYTES)?;
        let header = FrameHeader::decode(head).ok()?;
        let body = msg_len.checked_sub(FRAME_HEADER_BYTES)?;
        let value_len = msg_len - ONE_RESULT_HEAD_BYTES;
        let r = &head[FRAME_HEADER_BYTES..];
        let ok = header.kind == FrameKind::Response
            && header.op_count == 1
            && header.body_len as usize == body
            && le_u16(r, 2) == 0
            && le_u32(r, 4) as usize == value_len
            && value_len <= VALUE_BYTES_MAX;
        let mut result = [0u8; RESULT_HEADER_BYTES];
        result.copy_from_slice(r);
        ok.then(|| OneResultHead {
            header,
            code: ErrorCode::from_u16(le_u16(r, 0)).unwrap_or(ErrorCode::Internal),
            value_len,
            result,
        })
    }

    /// Checks the frame's checksum once its value has arrived.
    pub fn check(&self, value: &[u8]) -> Result<(), WireError> {
        if value.len() != self.value_len {
            return Err(WireError::Truncated);
        }
        if crate::checksum::crc32c_of(&[&self.result, value]) != self.header.checksum {
            return Err(WireError::BadChecksum);
        }
        Ok(())
    }
}

/// One operation's result, borrowing the value from the frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OpResult<'a> {
    /// Raw status; [`OpResult::code`] interprets it.
    pub status: u16,
    /// The value of a GET hit; empty otherwise.
    pub value: &'a [u8],
}

impl OpResult<'_> {
    /// The status as a known code; a code from a newer server reads as
    /// `Internal` so that it is never mistaken for success.
    pub fn code(&self) -> ErrorCode {
        ErrorCode::from_u16(self.status).unwrap_or(ErrorCode::Internal)
    }
}

/// Iterates the results of a structurally valid response frame.
#[derive(Debug, Clone)]
pub struct ResponseIter<'a> {
    entries: Entries<'a>,
}

fn split_result(b: &[u8]) -> Result<(OpResult<'_>, &[u8]), WireError> {
    if b.len() < RESULT_HEADER_BYTES {
        return Err(WireError::Malformed("result header overruns the body"));
    }
    if le_u16(b, 2) != 0 {
        return Err(WireError::ReservedBits);
    }
    let len = le_u32(b, 4) as usize;
    if len > VALUE_BYTES_MAX || b.len() - RESULT_HEADER_BYTES < len {
        return Err(WireError::Malformed("result value overruns the body"));
    }
    let end = RESULT_HEADER_BYTES + len;
    Ok((
        OpResult {
            status: le_u16(b, 0),
            value: &b[RESULT_HEADER_BYTES..end],
        },
        &b[end..],
    ))
}

impl<'a> ResponseIter<'a> {
    /// Checks the structure of a response body and iterates its results.
    pub fn new(frame: &Frame<'a>) -> Result<ResponseIter<'a>, WireError> {
        let entries = Entries::checked(
            frame,
            FrameKind::Response,
            "not a response frame",
            "bytes after the last result",
            split_result,
        )?;
        Ok(ResponseIter { entries })
    }
}

impl<'a> Iterator for ResponseIter<'a> {
    type Item = OpResult<'a>;

    fn next(&mut self) -> Option<OpResult<'a>> {
        self.entries.next(split_result)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let left = self.entries.remaining();
        (left, Some(left))
    }
}

/// Appends a response frame to a buffer, one result at a time.
#[derive(Debug)]
pub struct ResponseBuilder<'b> {
    w: FrameWriter<'b>,
}

frame_builder!(
    ResponseBuilder,
    FrameKind::Response,
    "Starts a response to `request_id` from `worker` at the end of `out`.",
    "Results",
    "result"
);

impl<'b> ResponseBuilder<'b> {
    /// Sets the frame-level status of the response. Only
    /// `ErrorCode::WrongWorker` is sent in a RESPONSE: a hint that some
    /// operation was for a partition the answering worker does not own
    /// (every result still stands), so the client refreshes its table.
    pub fn set_status(&mut self, code: ErrorCode) {
        self.w.set_status(code.as_u16());
    }

    /// Whether a result carrying `value_len` bytes fits while leaving room
    /// for `results_after` more empty results within `FRAME_BODY_BYTES_MAX`.
    pub fn fits(&self, value_len: usize, results_after: usize) -> bool {
        self.body_bytes() + RESULT_HEADER_BYTES * (1 + results_after) + value_len
            <= fabrickv_types::limits::FRAME_BODY_BYTES_MAX
    }

    /// Adds one result; `value` is the GET value (empty otherwise).
    pub fn result(&mut self, code: ErrorCode, value: &[u8]) -> &mut Self {
        self.w.out.extend_from_slice(&code.as_u16().to_le_bytes());
        self.w.out.extend_from_slice(&0u16.to_le_bytes());
        self.w
            .out
            .extend_from_slice(&(value.len() as u32).to_le_bytes());
        self.w.out.extend_from_slice(value);
        self.w.entry_done();
        self
    }

    /// Adds a result whose value of `value_len` bytes is not copied into
    /// the frame's buffer but sent right after it from its own memory (a
    /// vectored or spliced write of a large value). It must be the frame's
    /// last result, and the frame is then finished with
    /// [`ResponseBuilder::finish_before_value`].
    pub fn result_sent_after(&mut self, code: ErrorCode, value_len: usize) -> &mut Self {
        self.w.out.extend_from_slice(&code.as_u16().to_le_bytes());
        self.w.out.extend_from_slice(&0u16.to_le_bytes());
        self.w
            .out
            .extend_from_slice(&(value_len as u32).to_le_bytes());
        self.w.entry_done();
        self
    }

    /// Patches the header of a frame whose last result's value
    /// ([`ResponseBuilder::result_sent_after`], `value_len` bytes of
    /// CRC-32C `value_crc`) follows the buffer: body length and checksum
    /// cover it.
    pub fn finish_before_value(self, value_len: usize, value_crc: u32) {
        let (out, start) = self.w.finish_at();
        // Header layout (crate::header): body_len at 16, checksum at 20.
        let body_len = le_u32(out, start + 16) as usize + value_len;
        let crc = crate::cache::crc32c_concat(le_u32(out, start + 20), value_crc, value_len);
        out[start + 16..start + 20].copy_from_slice(&(body_len as u32).to_le_bytes());
        out[start + 20..start + 24].copy_from_slice(&crc.to_le_bytes());
    }
}

impl ExactSizeIterator for ResponseIter<'_> {}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decode_frame;

    #[test]
    fn results_round_trip() {
        let mut buf = Vec::new();
        let mut b = ResponseBuilder::new(&mut buf, 9, 2);
        b.result(ErrorCode::Ok, b"hello")
            .result(ErrorCode::NotFound, b"")
            .result(ErrorCode::Ok, b"");
        b.finish();
        let f = decode_frame(&buf).expect("frame");
        assert_eq!((f.header.request_id, f.header.worker), (9, 2));
        let rs: Vec<_> = ResponseIter::new(&f).expect("structure").collect();
        assert_eq!(rs.len(), 3);
        assert_eq!((rs[0].code(), rs[0].value), (ErrorCode::Ok, &b"hello"[..]));
        assert_eq!(rs[1].code(), ErrorCode::NotFound);
        assert_eq!(rs[2].value, b"");
    }

    #[test]
    fn a_one_result_head_parses_and_checks_its_value() {
        let mut buf = Vec::new();
        let mut b = ResponseBuilder::new(&mut buf, 7, 1);
        b.result(ErrorCode::Ok, b"piece");
        b.finish();
        let h = OneResultHead::parse(&buf, buf.len()).expect("one result");
        assert_eq!(
            (h.header.request_id, h.code, h.value_len),
            (7, ErrorCode::Ok, 5)
        );
        assert_eq!(h.check(&buf[ONE_RESULT_HEAD_BYTES..]), Ok(()));
        assert_eq!(h.check(b"piecE"), Err(WireError::BadChecksum));
        assert_eq!(h.check(b"pie"), Err(WireError::Truncated));
        // A message of another length, or of two results, is not one.
        assert_eq!(OneResultHead::parse(&buf, buf.len() + 1), None);
        let mut two = Vec::new();
        let mut b = ResponseBuilder::new(&mut two, 7, 1);
        b.result(ErrorCode::Ok, b"").result(ErrorCode::Ok, b"");
        b.finish();
        assert_eq!(OneResultHead::parse(&two, two.len()), None);
    }

    #[test]
    fn a_value_sent_after_the_frame_is_covered_by_its_length_and_checksum() {
        let value = vec![7u8; 5000];
        let mut buf = Vec::new();
        let mut b = ResponseBuilder::new(&mut buf, 3, 0);
        b.result(ErrorCode::Ok, b"")
            .result_sent_after(ErrorCode::Ok, value.len());
        b.finish_before_value(value.len(), crate::checksum::crc32c(&value));
        buf.extend_from_slice(&value);
        let f = decode_frame(&buf).expect("frame");
        let rs: Vec<_> = ResponseIter::new(&f).expect("structure").collect();
        assert_eq!(rs.len(), 2);
        assert_eq!(rs[1].value, &value[..]);
    }

    #[test]
    fn unknown_status_is_never_success() {
        let r = OpResult {
            status: 60_000,
            value: b"",
        };
        assert_eq!(r.code(), ErrorCode::Internal);
    }
}
