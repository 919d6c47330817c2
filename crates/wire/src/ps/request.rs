//! Encoding and decoding of PS requests (CREATE, OPEN, LIST, PULL, PUSH).

use super::*;

pub(super) fn begin(
    out: &mut Vec<u8>,
    kind: FrameKind,
    id: u64,
    worker: u16,
    status: u16,
) -> usize {
    FrameHeader::begin(out, kind, id, worker, status)
}

pub(super) fn prefix(out: &mut Vec<u8>, op: PsOp, table: u32) {
    out.push(op as u8);
    out.extend_from_slice(&[0; 3]);
    out.extend_from_slice(&table.to_le_bytes());
}

/// Appends a CREATE request.
pub fn encode_create(out: &mut Vec<u8>, id: u64, worker: u16, spec: &TableSpec) {
    let s = begin(out, FrameKind::Ps, id, worker, 0);
    prefix(out, PsOp::Create, 0);
    encode_spec(out, spec);
    finish_frame(out, s, 0);
}

/// Bytes of a CREATE body before the table's name.
pub const CREATE_FIXED_BYTES: usize = 20;

/// Appends `spec` as a CREATE body carries it (also how the replication
/// stream names a table's shape).
pub fn encode_spec(out: &mut Vec<u8>, spec: &TableSpec) {
    out.extend_from_slice(&spec.dim.to_le_bytes());
    out.push(spec.optimizer as u8);
    out.push(spec.missing as u8);
    out.extend_from_slice(&(spec.name.len() as u16).to_le_bytes());
    out.extend_from_slice(&spec.lr.to_le_bytes());
    out.extend_from_slice(&spec.seed.to_le_bytes());
    out.extend_from_slice(spec.name.as_bytes());
}

/// Appends an OPEN request.
pub fn encode_open(out: &mut Vec<u8>, id: u64, worker: u16, name: &str) {
    let s = begin(out, FrameKind::Ps, id, worker, 0);
    prefix(out, PsOp::Open, 0);
    out.extend_from_slice(&(name.len() as u16).to_le_bytes());
    out.extend_from_slice(&[0; 2]);
    out.extend_from_slice(name.as_bytes());
    finish_frame(out, s, 0);
}

/// Appends a LIST request.
pub fn encode_list(out: &mut Vec<u8>, id: u64, worker: u16) {
    let s = begin(out, FrameKind::Ps, id, worker, 0);
    prefix(out, PsOp::List, 0);
    finish_frame(out, s, 0);
}

/// Where a PULL's vectors go when they travel one-sided: a region the
/// client registered (its 24-byte descriptor) and an offset in it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PullDest {
    /// The region descriptor, encoded as `RemoteRegion` encodes it.
    pub region: [u8; 24],
    /// Byte offset of the first vector.
    pub offset: u64,
}

/// Appends a PULL request for `keys` (at most `PS_KEYS_PER_REQUEST_MAX`).
pub fn encode_pull(
    out: &mut Vec<u8>,
    id: u64,
    worker: u16,
    table: u32,
    keys: &[u64],
    dest: Option<&PullDest>,
) {
    let s = begin(out, FrameKind::Ps, id, worker, 0);
    prefix(out, PsOp::Pull, table);
    out.extend_from_slice(&u32::from(dest.is_some()).to_le_bytes());
    out.extend_from_slice(&[0; 4]);
    if let Some(d) = dest {
        out.extend_from_slice(&d.region);
        out.extend_from_slice(&d.offset.to_le_bytes());
    }
    put_u64s(out, keys);
    finish_frame(out, s, keys.len() as u16);
}

/// Appends a PUSH request: `values` holds `keys.len() * dim` floats;
/// `request`, if given, lets the server answer a retry of this push
/// without applying it twice.
#[allow(clippy::too_many_arguments)]
pub fn encode_push(
    out: &mut Vec<u8>,
    id: u64,
    worker: u16,
    table: u32,
    mode: PushMode,
    keys: &[u64],
    values: &[f32],
    request: Option<PushId>,
) {
    let s = begin(out, FrameKind::Ps, id, worker, 0);
    prefix(out, PsOp::Push, table);
    out.push(mode as u8);
    out.push(u8::from(request.is_some()));
    out.extend_from_slice(&[0; 6]);
    if let Some(r) = request {
        out.extend_from_slice(&r.client.to_le_bytes());
        out.extend_from_slice(&r.seq.to_le_bytes());
    }
    put_u64s(out, keys);
    put_f32s(out, values);
    finish_frame(out, s, keys.len() as u16);
}

/// Appends `v` little-endian.
pub fn put_u64s(out: &mut Vec<u8>, v: &[u64]) {
    out.reserve(v.len() * 8);
    for k in v {
        out.extend_from_slice(&k.to_le_bytes());
    }
}

/// Appends `v` little-endian.
pub fn put_f32s(out: &mut Vec<u8>, v: &[f32]) {
    out.reserve(v.len() * 4);
    for x in v {
        out.extend_from_slice(&x.to_le_bytes());
    }
}

/// Copies little-endian f32 bytes into `out` (same element count).
#[inline]
pub fn f32s_from_le(bytes: &[u8], out: &mut [f32]) {
    for (o, c) in out.iter_mut().zip(bytes.chunks_exact(4)) {
        *o = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
    }
}

/// A decoded PS request, borrowing the frame.
#[derive(Debug, Clone, Copy)]
pub enum PsRequest<'a> {
    /// CREATE.
    Create(&'a [u8]),
    /// OPEN by name (UTF-8 checked).
    Open(&'a str),
    /// LIST.
    List,
    /// PULL.
    Pull {
        /// Table id.
        table: u32,
        /// Keys, 8 bytes each, little-endian.
        keys: &'a [u8],
        /// One-sided destination, if any.
        dest: Option<PullDest>,
    },
    /// PUSH.
    Push {
        /// Table id.
        table: u32,
        /// How to write.
        mode: PushMode,
        /// Keys, 8 bytes each.
        keys: &'a [u8],
        /// The rest of the body: `n * dim` floats, checked against the
        /// table's dimension by the server (the codec does not know it).
        values: &'a [u8],
        /// The push's identity across retries, if the client gave one.
        request: Option<PushId>,
    },
}

/// Names a push across retries: a client picks `client` at random once
/// and numbers its pushes; a server that applied a push answers a retry
/// of it (same client, same seq) without applying it again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PushId {
    /// Random per client.
    pub client: u64,
    /// Increasing per client.
    pub seq: u64,
}

/// Reads the body of a `Ps` frame. Checks everything the codec can know;
/// table ids and dimensions are the server's to check.
pub fn decode_request<'a>(frame: &Frame<'a>) -> Result<PsRequest<'a>, WireError> {
    let b = frame.body;
    if frame.header.kind != FrameKind::Ps || b.len() < PS_PREFIX_BYTES {
        return Err(WireError::Malformed("PS body shorter than its prefix"));
    }
    if b[1..4] != [0, 0, 0] {
        return Err(WireError::ReservedBits);
    }
    let op = PsOp::from_u8(b[0]).ok_or(WireError::Malformed("unknown PS op"))?;
    let table = le_u32(b, 4);
    let n = usize::from(frame.header.op_count);
    let rest = &b[PS_PREFIX_BYTES..];
    if !matches!(op, PsOp::Pull | PsOp::Push) && n != 0 {
        return Err(WireError::Malformed("op count must be 0"));
    }
    match op {
        PsOp::Create => {
            if rest.len() < 20 {
                return Err(WireError::Malformed("CREATE shorter than its fields"));
            }
            let name_len = usize::from(le_u16(rest, 6));
            if rest.len() != 20 + name_len {
                return Err(WireError::Malformed("CREATE name length disagrees"));
            }
            Ok(PsRequest::Create(rest))
        }
        PsOp::Open => {
            if rest.len() < 4 || le_u16(rest, 2) != 0 {
                return Err(WireError::Malformed("OPEN shorter than its fields"));
            }
            let name_len = usize::from(le_u16(rest, 0));
            if rest.len() != 4 + name_len || name_len > PS_TABLE_NAME_BYTES_MAX {
                return Err(WireError::Malformed("OPEN name length disagrees"));
            }
            let name = std::str::from_utf8(&rest[4..])
                .map_err(|_| WireError::Malformed("table name is not UTF-8"))?;
            Ok(PsRequest::Open(name))
        }
        PsOp::List => {
            if !rest.is_empty() {
                return Err(WireError::Malformed("LIST has a body"));
            }
            Ok(PsRequest::List)
        }
        PsOp::Pull => {
            if rest.len() < PULL_FIXED_BYTES || le_u32(rest, 4) != 0 {
                return Err(WireError::Malformed("PULL shorter than its fields"));
            }
            let flags = le_u32(rest, 0);
            if flags > 1 {
                return Err(WireError::ReservedBits);
            }
            let mut at = PULL_FIXED_BYTES;
            let dest = if flags == 1 {
                let d = rest
                    .get(at..at + PULL_DEST_BYTES)
                    .ok_or(WireError::Malformed("PULL destination truncated"))?;
                at += PULL_DEST_BYTES;
                let mut region = [0u8; 24];
                region.copy_from_slice(&d[..24]);
                Some(PullDest {
                    region,
                    offset: le_u64(d, 24),
                })
            } else {
                None
            };
            let keys = &rest[at..];
            if keys.len() != n * 8 {
                return Err(WireError::Malformed("PULL key count disagrees with length"));
            }
            Ok(PsRequest::Pull { table, keys, dest })
        }
        PsOp::Push => {
            if rest.len() < PUSH_FIXED_BYTES || rest[2..8] != [0; 6] {
                return Err(WireError::Malformed("PUSH shorter than its fields"));
            }
            let mode = match rest[0] {
                0 => PushMode::Overwrite,
                1 => PushMode::Gradient,
                _ => return Err(WireError::Malformed("unknown PUSH mode")),
            };
            let (request, at) = match rest[1] {
                0 => (None, PUSH_FIXED_BYTES),
                1 => {
                    let id = rest
                        .get(PUSH_FIXED_BYTES..PUSH_FIXED_BYTES + PUSH_ID_BYTES)
                        .ok_or(WireError::Malformed("PUSH request id truncated"))?;
                    let r = PushId {
                        client: le_u64(id, 0),
                        seq: le_u64(id, 8),
                    };
                    (Some(r), PUSH_FIXED_BYTES + PUSH_ID_BYTES)
                }
                _ => return Err(WireError::ReservedBits),
            };
            let body = &rest[at..];
            if body.len() < n * 8 {
                return Err(WireError::Malformed("PUSH keys truncated"));
            }
            let (keys, values) = body.split_at(n * 8);
            if n == 0 && !values.is_empty() || n > 0 && values.len() % (n * 4) != 0 {
                return Err(WireError::Malformed("PUSH values are not n whole vectors"));
            }
            Ok(PsRequest::Push {
                table,
                mode,
                keys,
                values,
                request,
            })
        }
    }
}

/// Reads a CREATE body into a spec (validated).
pub fn decode_create(rest: &[u8]) -> Result<TableSpec, (ErrorCode, String)> {
    let bad = |why: &str| (ErrorCode::Malformed, why.to_string());
    let optimizer = Optimizer::from_u8(rest[4]).ok_or_else(|| bad("unknown optimizer"))?;
    let missing = Missing::from_u8(rest[5]).ok_or_else(|| bad("unknown missing-key policy"))?;
    let name = std::str::from_utf8(&rest[20..]).map_err(|_| bad("table name is not UTF-8"))?;
    let spec = TableSpec {
        name: name.to_string(),
        dim: le_u32(rest, 0),
        optimizer,
        missing,
        lr: f32::from_le_bytes([rest[8], rest[9], rest[10], rest[11]]),
        seed: le_u64(rest, 12),
    };
    spec.validate()?;
    Ok(spec)
}

/// Reads the i-th little-endian u64 of `keys`.
#[inline]
pub fn key_at(keys: &[u8], i: usize) -> u64 {
    le_u64(keys, i * 8)
}
