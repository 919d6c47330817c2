//! The data streams: the target's opening, then the source's frames (a
//! 64-byte header and a payload of pairs; the layout is in the module
//! above).

use fabrickv_types::limits::{SHARD_KEY_BYTES_MAX, SHARD_VALUE_BYTES_MAX};
use fabrickv_types::{Digest, ErrorCode};

use super::{
    ProtoError, Reader, COPY_FRAME_PAYLOAD_BYTES_MAX, DATA_FRAME_HEADER_BYTES, FRAME_MAGIC,
    STREAM_OPENING_BYTES, STREAM_OPENING_MAGIC, STREAM_VERSION,
};

/// A data stream's opening.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StreamOpening {
    /// The copy run.
    pub run_id: u64,
    /// Its token.
    pub token: u64,
    /// Which stream of the run this is.
    pub stream: u32,
}

impl StreamOpening {
    /// The opening's bytes.
    pub fn encode(&self) -> [u8; STREAM_OPENING_BYTES] {
        let mut b = [0u8; STREAM_OPENING_BYTES];
        b[0..4].copy_from_slice(&STREAM_OPENING_MAGIC.to_le_bytes());
        b[4..8].copy_from_slice(&STREAM_VERSION.to_le_bytes());
        b[8..16].copy_from_slice(&self.run_id.to_le_bytes());
        b[16..24].copy_from_slice(&self.token.to_le_bytes());
        b[24..28].copy_from_slice(&self.stream.to_le_bytes());
        b
    }

    /// Reads an opening.
    pub fn decode(b: &[u8; STREAM_OPENING_BYTES]) -> Result<StreamOpening, ProtoError> {
        let mut r = Reader::new(b);
        if r.u32("magic")? != STREAM_OPENING_MAGIC {
            return Err(ProtoError("not a copy stream opening"));
        }
        if r.u32("version")? != STREAM_VERSION {
            return Err(ProtoError("unsupported copy stream version"));
        }
        let run_id = r.u64("run id")?;
        let token = r.u64("token")?;
        let stream = r.u32("stream")?;
        r.zero(4)?;
        Ok(StreamOpening {
            run_id,
            token,
            stream,
        })
    }
}

/// What a data frame carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum DataFrameKind {
    /// Pairs of a range, in key order.
    Data = 1,
    /// The range is complete; the digest is its total.
    EndOfRange = 2,
    /// The source failed; the payload says why.
    Abort = 3,
}

/// A data frame's header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DataFrameHeader {
    /// What the frame carries.
    pub kind: DataFrameKind,
    /// The range.
    pub range: u32,
    /// Pairs in the payload.
    pub pairs: u32,
    /// The frame's sequence number within its range.
    pub seq: u64,
    /// Bytes after the header.
    pub payload_len: u32,
    /// The range's running digest after this frame.
    pub digest: Digest,
}

impl DataFrameHeader {
    /// The header's bytes.
    pub fn encode(&self) -> [u8; DATA_FRAME_HEADER_BYTES] {
        let mut a = [0u8; DATA_FRAME_HEADER_BYTES];
        a[0..4].copy_from_slice(&FRAME_MAGIC.to_le_bytes());
        a[4] = self.kind as u8;
        a[8..12].copy_from_slice(&self.range.to_le_bytes());
        a[12..16].copy_from_slice(&self.pairs.to_le_bytes());
        a[16..24].copy_from_slice(&self.seq.to_le_bytes());
        a[24..28].copy_from_slice(&self.payload_len.to_le_bytes());
        a[32..40].copy_from_slice(&self.digest.pairs.to_le_bytes());
        a[40..48].copy_from_slice(&self.digest.bytes.to_le_bytes());
        a[48..64].copy_from_slice(&self.digest.sum.to_le_bytes());
        a
    }

    /// Reads and checks a header (the payload length against its bound).
    pub fn decode(b: &[u8; DATA_FRAME_HEADER_BYTES]) -> Result<DataFrameHeader, ProtoError> {
        let mut r = Reader::new(b);
        if r.u32("magic")? != FRAME_MAGIC {
            return Err(ProtoError("not a copy data frame"));
        }
        let kind = match r.u8("kind")? {
            1 => DataFrameKind::Data,
            2 => DataFrameKind::EndOfRange,
            3 => DataFrameKind::Abort,
            _ => return Err(ProtoError("unknown data frame kind")),
        };
        r.zero(3)?;
        let range = r.u32("range")?;
        let pairs = r.u32("pairs")?;
        let seq = r.u64("seq")?;
        let payload_len = r.u32("payload length")?;
        if payload_len as usize > COPY_FRAME_PAYLOAD_BYTES_MAX {
            return Err(ProtoError(
                "payload longer than COPY_FRAME_PAYLOAD_BYTES_MAX",
            ));
        }
        r.zero(4)?;
        let digest = r.digest()?;
        Ok(DataFrameHeader {
            kind,
            range,
            pairs,
            seq,
            payload_len,
            digest,
        })
    }
}

/// Appends one pair to a DATA payload.
pub fn put_pair(out: &mut Vec<u8>, key: &[u8], value: &[u8]) {
    out.extend_from_slice(&(key.len() as u32).to_le_bytes());
    out.extend_from_slice(&(value.len() as u32).to_le_bytes());
    out.extend_from_slice(key);
    out.extend_from_slice(value);
}

/// The pairs of a DATA payload, each checked against the shard's bounds.
pub struct Pairs<'a> {
    r: Reader<'a>,
}

impl<'a> Pairs<'a> {
    /// Iterates `payload`.
    pub fn new(payload: &'a [u8]) -> Self {
        Pairs {
            r: Reader::new(payload),
        }
    }
}

impl<'a> Iterator for Pairs<'a> {
    type Item = Result<(&'a [u8], &'a [u8]), ProtoError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.r.is_empty() {
            return None;
        }
        let pair = (|| {
            let klen = self.r.u32("key length")? as usize;
            let vlen = self.r.u32("value length")? as usize;
            if klen > SHARD_KEY_BYTES_MAX || vlen > SHARD_VALUE_BYTES_MAX {
                return Err(ProtoError("pair beyond the shard's bounds"));
            }
            let k = self.r.take(klen, "key runs past the frame")?;
            let v = self.r.take(vlen, "value runs past the frame")?;
            Ok((k, v))
        })();
        if pair.is_err() {
            // One error ends the payload: nothing after it can be framed.
            self.r.clear();
        }
        Some(pair)
    }
}

/// An ABORT payload: code and message.
pub fn encode_abort(out: &mut Vec<u8>, code: ErrorCode, why: &str) {
    out.extend_from_slice(&code.as_u16().to_le_bytes());
    out.extend_from_slice(&why.as_bytes()[..why.len().min(1024)]);
}

/// Reads an ABORT payload.
pub fn decode_abort(b: &[u8]) -> (ErrorCode, String) {
    let mut r = Reader::new(b);
    let code = r
        .u16("code")
        .ok()
        .and_then(ErrorCode::from_u16)
        .unwrap_or(ErrorCode::Internal);
    (code, String::from_utf8_lossy(r.rest()).into_owned())
}
