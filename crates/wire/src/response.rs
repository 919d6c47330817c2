//! Response bodies: one result per request operation, in request order.
//!
//! ```text
//! offset size field
//!      0    2 status     ErrorCode of this operation
//!      2    2 reserved   must be 0
//!      4    4 value_len  bytes of value (GET hits only)
//!      8    . value
//! ```

use fabrickv_types::limits::{RESULT_HEADER_BYTES, VALUE_BYTES_MAX};
use fabrickv_types::ErrorCode;

use crate::header::{Entries, Frame, FrameKind, FrameWriter, WireError};
use crate::{le_u16, le_u32};

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
    fn unknown_status_is_never_success() {
        let r = OpResult {
            status: 60_000,
            value: b"",
        };
        assert_eq!(r.code(), ErrorCode::Internal);
    }
}
