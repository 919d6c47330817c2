//! The copy's control payloads, carried in SHARD frames (ops CHECKPOINT,
//! START, STATUS, END; the layout is in the module above).

use std::ops::Bound;

use fabrickv_types::{Digest, ErrorCode};

use super::{
    put_digest, put_key, CopyState, ProtoError, Reader, COPY_BOUNDARY_BYTES_MAX, COPY_RANGES_MAX,
    COPY_STREAMS_MAX,
};

fn read_boundaries<'a>(r: &mut Reader<'a>, n: u32) -> Result<Vec<&'a [u8]>, ProtoError> {
    if n >= COPY_RANGES_MAX {
        return Err(ProtoError("more boundaries than COPY_RANGES_MAX"));
    }
    let mut v = Vec::with_capacity(n as usize);
    let mut total = 0usize;
    for _ in 0..n {
        let k = r.key()?;
        total += k.len();
        if total > COPY_BOUNDARY_BYTES_MAX {
            return Err(ProtoError("boundaries exceed COPY_BOUNDARY_BYTES_MAX"));
        }
        if v.last().is_some_and(|last: &&[u8]| *last >= k) {
            return Err(ProtoError("boundaries do not ascend"));
        }
        v.push(k);
    }
    Ok(v)
}

/// The bounds of range `r` of a copy split at `boundaries` (the lower
/// bounds of ranges 1..), so that source and target cut ranges alike.
pub fn range_bounds(boundaries: &[Vec<u8>], r: usize) -> (Bound<&[u8]>, Bound<&[u8]>) {
    let from = r
        .checked_sub(1)
        .and_then(|i| boundaries.get(i))
        .map_or(Bound::Unbounded, |b| Bound::Included(b.as_slice()));
    let to = boundaries
        .get(r)
        .map_or(Bound::Unbounded, |b| Bound::Excluded(b.as_slice()));
    (from, to)
}

/// A CHECKPOINT request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckpointRequest<'a> {
    /// Ranges wanted.
    pub ranges: u32,
    /// Lower bounds of ranges 1.. (empty: the source splits).
    pub boundaries: Vec<&'a [u8]>,
}

impl<'a> CheckpointRequest<'a> {
    /// Appends the payload.
    pub fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.ranges.to_le_bytes());
        out.extend_from_slice(&(self.boundaries.len() as u32).to_le_bytes());
        for b in &self.boundaries {
            put_key(out, b);
        }
    }

    /// Reads a payload.
    pub fn decode(b: &'a [u8]) -> Result<Self, ProtoError> {
        let mut r = Reader::new(b);
        let ranges = r.u32("ranges")?;
        if ranges == 0 || ranges > COPY_RANGES_MAX {
            return Err(ProtoError("ranges must be 1..=COPY_RANGES_MAX"));
        }
        let n = r.u32("boundaries")?;
        if n != 0 && n != ranges - 1 {
            return Err(ProtoError("boundaries must be 0 or ranges - 1"));
        }
        let boundaries = read_boundaries(&mut r, n)?;
        r.end()?;
        Ok(CheckpointRequest { ranges, boundaries })
    }
}

/// A CHECKPOINT reply: the copy run it opened and where its data streams
/// connect.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CheckpointReply {
    /// The run's id.
    pub run_id: u64,
    /// The secret a data stream's opening must carry.
    pub token: u64,
    /// The TCP port of the data streams (on the server's host).
    pub data_port: u16,
}

impl CheckpointReply {
    /// Appends the payload.
    pub fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.run_id.to_le_bytes());
        out.extend_from_slice(&self.token.to_le_bytes());
        out.extend_from_slice(&self.data_port.to_le_bytes());
        out.extend_from_slice(&[0u8; 6]);
    }

    /// Reads a payload.
    pub fn decode(b: &[u8]) -> Result<Self, ProtoError> {
        let mut r = Reader::new(b);
        let run_id = r.u64("run id")?;
        let token = r.u64("token")?;
        let data_port = r.u16("data port")?;
        r.zero(6)?;
        r.end()?;
        Ok(CheckpointReply {
            run_id,
            token,
            data_port,
        })
    }
}

/// Where one range resumes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResumePoint {
    /// The range.
    pub range: u32,
    /// The range was written to its end: skip it.
    pub done: bool,
    /// The sequence number of the range's next frame.
    pub next_seq: u64,
    /// The digest of the pairs the target holds durably.
    pub digest: Digest,
    /// The last key the target holds durably; the range resumes after it.
    pub after: Vec<u8>,
}

/// A START request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StartRequest {
    /// The run.
    pub run_id: u64,
    /// Its token.
    pub token: u64,
    /// Data streams the target will open.
    pub streams: u16,
    /// Ranges that do not start from their beginning.
    pub resume: Vec<ResumePoint>,
}

impl StartRequest {
    /// Appends the payload.
    pub fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.run_id.to_le_bytes());
        out.extend_from_slice(&self.token.to_le_bytes());
        out.extend_from_slice(&self.streams.to_le_bytes());
        out.extend_from_slice(&0u16.to_le_bytes());
        out.extend_from_slice(&(self.resume.len() as u32).to_le_bytes());
        for p in &self.resume {
            out.extend_from_slice(&p.range.to_le_bytes());
            out.push(u8::from(p.done));
            out.extend_from_slice(&[0u8; 3]);
            out.extend_from_slice(&p.next_seq.to_le_bytes());
            put_digest(out, &p.digest);
            put_key(out, &p.after);
        }
    }

    /// Reads a payload.
    pub fn decode(b: &[u8]) -> Result<Self, ProtoError> {
        let mut r = Reader::new(b);
        let run_id = r.u64("run id")?;
        let token = r.u64("token")?;
        let streams = r.u16("streams")?;
        if streams == 0 || streams > COPY_STREAMS_MAX {
            return Err(ProtoError("streams must be 1..=COPY_STREAMS_MAX"));
        }
        r.zero(2)?;
        let n = r.u32("resume entries")?;
        if n > COPY_RANGES_MAX {
            return Err(ProtoError("more resume entries than COPY_RANGES_MAX"));
        }
        let mut resume = Vec::with_capacity(n as usize);
        for _ in 0..n {
            let range = r.u32("range")?;
            let done = match r.u8("done")? {
                0 => false,
                1 => true,
                _ => return Err(ProtoError("done is not 0 or 1")),
            };
            r.zero(3)?;
            let next_seq = r.u64("next seq")?;
            let digest = r.digest()?;
            let after = r.key()?.to_vec();
            resume.push(ResumePoint {
                range,
                done,
                next_seq,
                digest,
                after,
            });
        }
        r.end()?;
        Ok(StartRequest {
            run_id,
            token,
            streams,
            resume,
        })
    }
}

/// Appends a STATUS or END request (the run id).
pub fn encode_run_id(out: &mut Vec<u8>, run_id: u64) {
    out.extend_from_slice(&run_id.to_le_bytes());
}

/// Reads a STATUS or END request.
pub fn decode_run_id(b: &[u8]) -> Result<u64, ProtoError> {
    let mut r = Reader::new(b);
    let id = r.u64("run id")?;
    r.end()?;
    Ok(id)
}

/// A copy run's state and counters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Status {
    /// Where the run is.
    pub state: CopyState,
    /// Whether the checkpoint is split (`boundaries` is then set).
    pub ready: bool,
    /// Why it failed (`Ok` unless ERROR).
    pub error: ErrorCode,
    /// Ranges of the checkpoint.
    pub ranges: u32,
    /// Ranges sent to their end.
    pub ranges_done: u32,
    /// Pairs sent so far.
    pub pairs_sent: u64,
    /// Key and value bytes sent so far.
    pub bytes_sent: u64,
    /// Pairs in the shard, estimated.
    pub pairs_estimate: u64,
    /// Key and value bytes in the shard, estimated from the samples.
    pub bytes_estimate: u64,
    /// What went wrong, or empty.
    pub message: String,
    /// Lower bounds of ranges 1.. once `ready`.
    pub boundaries: Vec<Vec<u8>>,
}

impl Status {
    /// Appends the payload.
    pub fn encode(&self, out: &mut Vec<u8>) {
        out.push(self.state as u8);
        out.push(u8::from(self.ready));
        out.extend_from_slice(&self.error.as_u16().to_le_bytes());
        out.extend_from_slice(&self.ranges.to_le_bytes());
        out.extend_from_slice(&self.ranges_done.to_le_bytes());
        let msg = &self.message.as_bytes()[..self.message.len().min(1024)];
        out.extend_from_slice(&(msg.len() as u32).to_le_bytes());
        for v in [
            self.pairs_sent,
            self.bytes_sent,
            self.pairs_estimate,
            self.bytes_estimate,
        ] {
            out.extend_from_slice(&v.to_le_bytes());
        }
        out.extend_from_slice(msg);
        if self.ready {
            out.extend_from_slice(&(self.boundaries.len() as u32).to_le_bytes());
            for b in &self.boundaries {
                put_key(out, b);
            }
        }
    }

    /// Reads a payload.
    pub fn decode(b: &[u8]) -> Result<Self, ProtoError> {
        let mut r = Reader::new(b);
        let state = CopyState::from_u8(r.u8("state")?).ok_or(ProtoError("unknown state"))?;
        let ready = r.u8("ready")? != 0;
        let error = ErrorCode::from_u16(r.u16("error")?).unwrap_or(ErrorCode::Internal);
        let ranges = r.u32("ranges")?;
        let ranges_done = r.u32("ranges done")?;
        let msg_len = r.u32("message length")? as usize;
        let pairs_sent = r.u64("pairs")?;
        let bytes_sent = r.u64("bytes")?;
        let pairs_estimate = r.u64("pairs estimate")?;
        let bytes_estimate = r.u64("bytes estimate")?;
        let message = String::from_utf8_lossy(r.take(msg_len, "message")?).into_owned();
        let boundaries = if ready {
            let n = r.u32("boundaries")?;
            read_boundaries(&mut r, n)?
                .into_iter()
                .map(<[u8]>::to_vec)
                .collect()
        } else {
            Vec::new()
        };
        r.end()?;
        Ok(Status {
            state,
            ready,
            error,
            ranges,
            ranges_done,
            pairs_sent,
            bytes_sent,
            pairs_estimate,
            bytes_estimate,
            message,
            boundaries,
        })
    }
}
