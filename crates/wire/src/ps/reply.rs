//! Encoding and decoding of PS replies (table descriptors, pull and push results).

use super::*;

pub(super) fn put_desc(out: &mut Vec<u8>, d: &TableDesc) {
    out.extend_from_slice(&d.id.to_le_bytes());
    out.extend_from_slice(&d.spec.dim.to_le_bytes());
    out.push(d.spec.optimizer as u8);
    out.push(d.spec.missing as u8);
    out.extend_from_slice(&(d.spec.name.len() as u16).to_le_bytes());
    out.extend_from_slice(&d.spec.lr.to_le_bytes());
    out.extend_from_slice(&d.spec.seed.to_le_bytes());
    out.extend_from_slice(&d.items.to_le_bytes());
    out.extend_from_slice(d.spec.name.as_bytes());
}

/// Appends a CREATE/OPEN reply.
pub fn encode_table_reply(out: &mut Vec<u8>, id: u64, worker: u16, op: PsOp, d: &TableDesc) {
    let s = begin(out, FrameKind::PsReply, id, worker, 0);
    prefix(out, op, d.id);
    put_desc(out, d);
    finish_frame(out, s, 0);
}

/// Appends a LIST reply.
pub fn encode_list_reply(out: &mut Vec<u8>, id: u64, worker: u16, tables: &[TableDesc]) {
    let s = begin(out, FrameKind::PsReply, id, worker, 0);
    prefix(out, PsOp::List, 0);
    out.extend_from_slice(&(tables.len() as u32).to_le_bytes());
    out.extend_from_slice(&[0; 4]);
    for d in tables {
        put_desc(out, d);
    }
    finish_frame(out, s, 0);
}

/// Appends a PUSH reply.
pub fn encode_push_reply(
    out: &mut Vec<u8>,
    id: u64,
    worker: u16,
    table: u32,
    status: ErrorCode,
    applied: u32,
) {
    let s = begin(out, FrameKind::PsReply, id, worker, status.as_u16());
    prefix(out, PsOp::Push, table);
    out.extend_from_slice(&applied.to_le_bytes());
    out.extend_from_slice(&[0; 4]);
    finish_frame(out, s, 0);
}

/// A PULL reply being built: the caller writes the bitmap bytes and (if
/// inline) the vectors into the body, then finishes.
#[derive(Debug)]
pub struct PullReplyWriter {
    start: usize,
    n: u16,
}

impl PullReplyWriter {
    /// Appends header, prefix and a zeroed bitmap for `n` keys; returns the
    /// writer and the offset in `out` of the bitmap.
    pub fn begin(
        out: &mut Vec<u8>,
        id: u64,
        worker: u16,
        table: u32,
        n: usize,
    ) -> (PullReplyWriter, usize) {
        let start = begin(out, FrameKind::PsReply, id, worker, 0);
        prefix(out, PsOp::Pull, table);
        let bitmap_at = out.len();
        out.resize(bitmap_at + bitmap_bytes(n), 0);
        (PullReplyWriter { start, n: n as u16 }, bitmap_at)
    }

    /// Patches length and checksum.
    pub fn finish(self, out: &mut [u8]) {
        finish_frame(out, self.start, self.n);
    }
}

/// A decoded PS reply.
#[derive(Debug, Clone, Copy)]
pub struct PsReply<'a> {
    /// Which request kind it answers.
    pub op: PsOp,
    /// The frame's status.
    pub status: ErrorCode,
    /// Table id named in the prefix.
    pub table: u32,
    /// The body after the prefix.
    pub rest: &'a [u8],
    /// Header op_count (PULL: keys).
    pub n: usize,
}

/// Reads the prefix of a `PsReply` frame.
pub fn decode_reply<'a>(frame: &Frame<'a>) -> Result<PsReply<'a>, WireError> {
    let b = frame.body;
    if frame.header.kind != FrameKind::PsReply || b.len() < PS_PREFIX_BYTES {
        return Err(WireError::Malformed("not a PS reply"));
    }
    let op = PsOp::from_u8(b[0]).ok_or(WireError::Malformed("unknown PS op"))?;
    Ok(PsReply {
        op,
        status: ErrorCode::from_u16(frame.header.status).unwrap_or(ErrorCode::Internal),
        table: le_u32(b, 4),
        rest: &b[PS_PREFIX_BYTES..],
        n: usize::from(frame.header.op_count),
    })
}

/// Reads one TableDesc at the start of `b`; returns it and its length.
pub fn decode_desc(b: &[u8]) -> Result<(TableDesc, usize), WireError> {
    if b.len() < TABLE_DESC_FIXED_BYTES {
        return Err(WireError::Malformed("table descriptor truncated"));
    }
    let name_len = usize::from(le_u16(b, 10));
    let end = TABLE_DESC_FIXED_BYTES + name_len;
    let name = b
        .get(TABLE_DESC_FIXED_BYTES..end)
        .and_then(|n| std::str::from_utf8(n).ok())
        .ok_or(WireError::Malformed("table name truncated or not UTF-8"))?;
    let spec = TableSpec {
        name: name.to_string(),
        dim: le_u32(b, 4),
        optimizer: Optimizer::from_u8(b[8]).ok_or(WireError::Malformed("unknown optimizer"))?,
        missing: Missing::from_u8(b[9]).ok_or(WireError::Malformed("unknown missing policy"))?,
        lr: f32::from_le_bytes([b[12], b[13], b[14], b[15]]),
        seed: le_u64(b, 16),
    };
    Ok((
        TableDesc {
            id: le_u32(b, 0),
            spec,
            items: le_u64(b, 24),
        },
        end,
    ))
}

/// Reads a LIST reply's descriptors.
pub fn decode_list(rest: &[u8]) -> Result<Vec<TableDesc>, WireError> {
    if rest.len() < 8 {
        return Err(WireError::Malformed("LIST reply truncated"));
    }
    let count = le_u32(rest, 0) as usize;
    if count > PS_TABLES_MAX {
        return Err(WireError::Malformed("LIST reply names too many tables"));
    }
    let mut at = 8;
    let mut out = Vec::with_capacity(count);
    for _ in 0..count {
        let (d, len) = decode_desc(&rest[at..])?;
        at += len;
        out.push(d);
    }
    if at != rest.len() {
        return Err(WireError::Malformed("LIST reply has trailing bytes"));
    }
    Ok(out)
}
