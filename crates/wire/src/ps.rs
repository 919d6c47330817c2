//! Embedding-table (parameter server) frames: PS requests and their replies.
//!
//! A PS frame uses the common header with kind `Ps` (client to server) or
//! `PsReply`. Every body starts with an 8-byte prefix:
//!
//! ```text
//! 0 u8  op        PsOp
//! 1 u8[3] reserved, must be 0
//! 4 u32 table     table id (PULL, PUSH), 0 otherwise
//! ```
//!
//! then, by op (header `op_count` = number of keys for PULL and PUSH, 0
//! otherwise):
//!
//! ```text
//! CREATE: u32 dim, u8 optimizer, u8 missing, u16 name_len, f32 lr,
//!         u64 seed, name (UTF-8, 1..=PS_TABLE_NAME_BYTES_MAX)
//! OPEN:   u16 name_len, u16 reserved, name
//! LIST:   nothing
//! PULL:   u32 flags (bit 0: one-sided destination follows), u32 reserved,
//!         [RemoteRegion (24 bytes), u64 offset], u64 key x op_count
//! PUSH:   u8 mode (0 overwrite, 1 gradient), u8[7] reserved,
//!         u64 key x op_count, f32 x (op_count x dim)
//! ```
//!
//! Replies (`PsReply`, header `status` = the frame's ErrorCode; a refused
//! frame is an ERROR frame instead):
//!
//! ```text
//! CREATE, OPEN: one TableDesc
//! LIST:         u32 count, u32 reserved, TableDesc x count
//! PULL:         found bitmap (ceil(n/8) bytes, padded to a multiple of 8),
//!               then, unless the request named a one-sided destination,
//!               the n vectors (n x dim f32) in request order
//! PUSH:         u32 applied (keys written, a prefix of the request), u32 reserved
//! TableDesc:    u32 id, u32 dim, u8 optimizer, u8 missing, u16 name_len,
//!               f32 lr, u64 seed, u64 items, name
//! ```
//!
//! Floats travel as little-endian IEEE-754 `f32`. The reply to a PULL is
//! what completes it (a message after the one-sided write), so no value a
//! table can hold is mistaken for a completion mark.

use fabrickv_types::limits::{
    FRAME_BODY_BYTES_MAX, PS_DIM_MAX, PS_KEYS_PER_REQUEST_MAX, PS_TABLES_MAX,
    PS_TABLE_NAME_BYTES_MAX,
};
use fabrickv_types::ErrorCode;

use crate::header::{finish_frame, Frame, FrameHeader, FrameKind, WireError};
use crate::{le_u16, le_u32, le_u64};

/// Bytes of the prefix every PS body starts with.
pub const PS_PREFIX_BYTES: usize = 8;

/// Bytes of a PULL's fixed part after the prefix (flags, reserved).
pub const PULL_FIXED_BYTES: usize = 8;

/// Bytes of a PULL's one-sided destination (region descriptor, offset).
pub const PULL_DEST_BYTES: usize = 32;

/// Bytes of a PUSH's fixed part after the prefix (mode, reserved).
pub const PUSH_FIXED_BYTES: usize = 8;

/// Bytes of a TableDesc before its name.
pub const TABLE_DESC_FIXED_BYTES: usize = 32;

/// Half-width of the deterministic initializer's range: initial weights
/// are uniform in `[-INIT_RANGE, INIT_RANGE)`, small as embedding
/// initializers are.
pub const INIT_RANGE: f32 = 0.01;

/// A PS operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum PsOp {
    /// Create a table (or open it if it exists with the same shape).
    Create = 1,
    /// Look a table up by name.
    Open = 2,
    /// Describe every table.
    List = 3,
    /// Read vectors.
    Pull = 4,
    /// Write vectors or apply gradients.
    Push = 5,
}

impl PsOp {
    fn from_u8(v: u8) -> Option<PsOp> {
        Some(match v {
            1 => PsOp::Create,
            2 => PsOp::Open,
            3 => PsOp::List,
            4 => PsOp::Pull,
            5 => PsOp::Push,
            _ => return None,
        })
    }
}

/// How a table applies a pushed gradient, atomically per key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Optimizer {
    /// `w -= lr * g`.
    Sgd = 0,
    /// `acc += g * g; w -= lr * g / (sqrt(acc) + ADAGRAD_EPSILON)`, with a
    /// per-element accumulator stored beside the weights.
    Adagrad = 1,
}

impl Optimizer {
    /// Parses a wire byte.
    pub fn from_u8(v: u8) -> Option<Optimizer> {
        match v {
            0 => Some(Optimizer::Sgd),
            1 => Some(Optimizer::Adagrad),
            _ => None,
        }
    }

    /// Parses a name (`sgd`, `adagrad`).
    pub fn parse(s: &str) -> Option<Optimizer> {
        match s.to_ascii_lowercase().as_str() {
            "sgd" => Some(Optimizer::Sgd),
            "adagrad" => Some(Optimizer::Adagrad),
            _ => None,
        }
    }

    /// The name [`Optimizer::parse`] reads.
    pub fn name(self) -> &'static str {
        match self {
            Optimizer::Sgd => "sgd",
            Optimizer::Adagrad => "adagrad",
        }
    }

    /// f32 values stored per element: the weight, plus Adagrad's
    /// accumulator.
    pub fn state_per_element(self) -> usize {
        match self {
            Optimizer::Sgd => 1,
            Optimizer::Adagrad => 2,
        }
    }
}

/// What a pull returns for a key the table does not hold. Either way the
/// found bitmap says which keys were there; nothing is inserted by a pull.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Missing {
    /// A vector of zeros.
    Zeros = 0,
    /// The table's deterministic initializer ([`init_vector`]), the vector
    /// a gradient push would start from.
    Init = 1,
}

impl Missing {
    /// Parses a wire byte.
    pub fn from_u8(v: u8) -> Option<Missing> {
        match v {
            0 => Some(Missing::Zeros),
            1 => Some(Missing::Init),
            _ => None,
        }
    }

    /// Parses a name (`zeros`, `init`).
    pub fn parse(s: &str) -> Option<Missing> {
        match s.to_ascii_lowercase().as_str() {
            "zeros" | "zero" => Some(Missing::Zeros),
            "init" => Some(Missing::Init),
            _ => None,
        }
    }

    /// The name [`Missing::parse`] reads.
    pub fn name(self) -> &'static str {
        match self {
            Missing::Zeros => "zeros",
            Missing::Init => "init",
        }
    }
}

/// How a PUSH writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum PushMode {
    /// Store the vectors as they are (and reset optimizer state).
    Overwrite = 0,
    /// Apply the vectors as gradients with the table's optimizer; a key
    /// not yet stored starts from the initializer.
    Gradient = 1,
}

/// The shape of a table, as created.
#[derive(Debug, Clone, PartialEq)]
pub struct TableSpec {
    /// Unique name.
    pub name: String,
    /// Vector length in f32 elements, 1..=`PS_DIM_MAX`.
    pub dim: u32,
    /// Gradient rule.
    pub optimizer: Optimizer,
    /// What pulls of absent keys return.
    pub missing: Missing,
    /// Learning rate of the optimizer.
    pub lr: f32,
    /// Seed of the deterministic initializer.
    pub seed: u64,
}

impl TableSpec {
    /// A table with SGD at learning rate 0.01, zeros for missing keys, seed 0.
    pub fn new(name: &str, dim: u32) -> TableSpec {
        TableSpec {
            name: name.to_string(),
            dim,
            optimizer: Optimizer::Sgd,
            missing: Missing::Zeros,
            lr: 0.01,
            seed: 0,
        }
    }

    /// Parses `NAME:DIM[:KEY=VALUE...]` with keys `optimizer` (or `opt`:
    /// sgd, adagrad), `lr`, `missing` (zeros, init) and `seed`, as given
    /// to `fabrickv serve --table` and in configuration files.
    pub fn parse(s: &str) -> Result<TableSpec, String> {
        let mut parts = s.split(':');
        let name = parts.next().unwrap_or_default();
        let dim = parts
            .next()
            .ok_or_else(|| format!("table {s:?}: expected NAME:DIM[:KEY=VALUE...]"))?;
        let dim: u32 = dim
            .parse()
            .map_err(|_| format!("table {s:?}: dimension {dim:?} is not a number"))?;
        let mut spec = TableSpec::new(name, dim);
        for kv in parts {
            let (k, v) = kv
                .split_once('=')
                .ok_or_else(|| format!("table {s:?}: {kv:?} is not KEY=VALUE"))?;
            match k {
                "optimizer" | "opt" => {
                    spec.optimizer = Optimizer::parse(v).ok_or_else(|| {
                        format!("table {s:?}: unknown optimizer {v:?} (sgd, adagrad)")
                    })?
                }
                "lr" => {
                    spec.lr = v
                        .parse()
                        .map_err(|_| format!("table {s:?}: learning rate {v:?} is not a number"))?
                }
                "missing" => {
                    spec.missing = Missing::parse(v).ok_or_else(|| {
                        format!("table {s:?}: unknown missing policy {v:?} (zeros, init)")
                    })?
                }
                "seed" => {
                    spec.seed = v
                        .parse()
                        .map_err(|_| format!("table {s:?}: seed {v:?} is not a number"))?
                }
                _ => {
                    return Err(format!(
                        "table {s:?}: unknown key {k:?} (optimizer, lr, missing, seed)"
                    ))
                }
            }
        }
        spec.validate()
            .map_err(|(_, why)| format!("table {s:?}: {why}"))?;
        Ok(spec)
    }

    /// Bytes of one vector on the wire.
    pub fn vector_bytes(&self) -> usize {
        self.dim as usize * 4
    }

    /// Checks name, dimension and learning rate.
    pub fn validate(&self) -> Result<(), (ErrorCode, String)> {
        if self.name.is_empty() || self.name.len() > PS_TABLE_NAME_BYTES_MAX {
            return Err((
                ErrorCode::Malformed,
                format!(
                    "table name must be 1..={PS_TABLE_NAME_BYTES_MAX} bytes, got {}",
                    self.name.len()
                ),
            ));
        }
        if self.dim == 0 || self.dim as usize > PS_DIM_MAX {
            return Err((
                ErrorCode::BadDimension,
                format!("dimension must be 1..={PS_DIM_MAX}, got {}", self.dim),
            ));
        }
        if !self.lr.is_finite() || self.lr < 0.0 {
            return Err((
                ErrorCode::Malformed,
                format!("learning rate must be finite and >= 0, got {}", self.lr),
            ));
        }
        Ok(())
    }
}

/// A table as the server describes it.
#[derive(Debug, Clone, PartialEq)]
pub struct TableDesc {
    /// Id used by PULL and PUSH.
    pub id: u32,
    /// The table's shape.
    pub spec: TableSpec,
    /// Keys stored now.
    pub items: u64,
}

/// Most keys of one PULL whose vectors fit in an inline reply, for `dim`.
pub fn pull_keys_per_frame(dim: u32) -> usize {
    let per_key = dim as usize * 4;
    // Keep room for the bitmap: one byte per 8 keys, plus padding.
    let fit = (FRAME_BODY_BYTES_MAX - PS_PREFIX_BYTES - 8) / (per_key + 1);
    fit.clamp(1, PS_KEYS_PER_REQUEST_MAX)
}

/// Most keys of one PUSH that fit a request frame, for `dim`.
pub fn push_keys_per_frame(dim: u32) -> usize {
    let per_key = 8 + dim as usize * 4;
    let fit = (FRAME_BODY_BYTES_MAX - PS_PREFIX_BYTES - PUSH_FIXED_BYTES) / per_key;
    fit.clamp(1, PS_KEYS_PER_REQUEST_MAX)
}

/// Bytes of the found bitmap for `n` keys (padded to 8).
pub fn bitmap_bytes(n: usize) -> usize {
    n.div_ceil(64) * 8
}

fn begin(out: &mut Vec<u8>, kind: FrameKind, id: u64, worker: u16, status: u16) -> usize {
    FrameHeader::begin(out, kind, id, worker, status)
}

fn prefix(out: &mut Vec<u8>, op: PsOp, table: u32) {
    out.push(op as u8);
    out.extend_from_slice(&[0; 3]);
    out.extend_from_slice(&table.to_le_bytes());
}

/// Appends a CREATE request.
pub fn encode_create(out: &mut Vec<u8>, id: u64, worker: u16, spec: &TableSpec) {
    let s = begin(out, FrameKind::Ps, id, worker, 0);
    prefix(out, PsOp::Create, 0);
    out.extend_from_slice(&spec.dim.to_le_bytes());
    out.push(spec.optimizer as u8);
    out.push(spec.missing as u8);
    out.extend_from_slice(&(spec.name.len() as u16).to_le_bytes());
    out.extend_from_slice(&spec.lr.to_le_bytes());
    out.extend_from_slice(&spec.seed.to_le_bytes());
    out.extend_from_slice(spec.name.as_bytes());
    finish_frame(out, s, 0);
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

/// Appends a PUSH request: `values` holds `keys.len() * dim` floats.
pub fn encode_push(
    out: &mut Vec<u8>,
    id: u64,
    worker: u16,
    table: u32,
    mode: PushMode,
    keys: &[u64],
    values: &[f32],
) {
    let s = begin(out, FrameKind::Ps, id, worker, 0);
    prefix(out, PsOp::Push, table);
    out.push(mode as u8);
    out.extend_from_slice(&[0; 7]);
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
    },
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
            if rest.len() < PUSH_FIXED_BYTES || rest[1..8] != [0; 7] {
                return Err(WireError::Malformed("PUSH shorter than its fields"));
            }
            let mode = match rest[0] {
                0 => PushMode::Overwrite,
                1 => PushMode::Gradient,
                _ => return Err(WireError::Malformed("unknown PUSH mode")),
            };
            let body = &rest[PUSH_FIXED_BYTES..];
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

fn put_desc(out: &mut Vec<u8>, d: &TableDesc) {
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

/// One step of splitmix64, the generator behind [`init_vector`].
#[inline]
pub fn splitmix64(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The deterministic initial vector of `key` in a table seeded `seed`:
/// uniform in `[-INIT_RANGE, INIT_RANGE)`, the same on every machine, so
/// preload and verification (and benchmarks' checks) agree without
/// storing a copy.
#[inline]
pub fn init_vector(seed: u64, key: u64, out: &mut [f32]) {
    let base = splitmix64(seed ^ splitmix64(key));
    for (i, o) in out.iter_mut().enumerate() {
        let r = splitmix64(base.wrapping_add(i as u64));
        // 24 random bits give every f32 in [0, 1) a uniform spacing.
        let unit = (r >> 40) as f32 * (1.0 / (1u64 << 24) as f32);
        *o = (unit * 2.0 - 1.0) * INIT_RANGE;
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::decode_frame;

    #[test]
    fn create_round_trips() {
        let spec = TableSpec {
            name: "emb".into(),
            dim: 128,
            optimizer: Optimizer::Adagrad,
            missing: Missing::Init,
            lr: 0.5,
            seed: 7,
        };
        let mut out = Vec::new();
        encode_create(&mut out, 9, 1, &spec);
        let f = decode_frame(&out).unwrap();
        let PsRequest::Create(rest) = decode_request(&f).unwrap() else {
            panic!("not a create")
        };
        assert_eq!(decode_create(rest).unwrap(), spec);
    }

    #[test]
    fn pull_and_push_round_trip() {
        let mut out = Vec::new();
        let dest = PullDest {
            region: [3; 24],
            offset: 4096,
        };
        encode_pull(&mut out, 1, 0, 5, &[1, 2, u64::MAX], Some(&dest));
        let f = decode_frame(&out).unwrap();
        match decode_request(&f).unwrap() {
            PsRequest::Pull {
                table,
                keys,
                dest: d,
            } => {
                assert_eq!(table, 5);
                assert_eq!(keys.len(), 24);
                assert_eq!(key_at(keys, 2), u64::MAX);
                assert_eq!(d, Some(dest));
            }
            other => panic!("{other:?}"),
        }
        out.clear();
        encode_push(
            &mut out,
            2,
            0,
            5,
            PushMode::Gradient,
            &[4, 5],
            &[1.0, 2.0, 3.0, 4.0],
        );
        let f = decode_frame(&out).unwrap();
        match decode_request(&f).unwrap() {
            PsRequest::Push {
                mode, keys, values, ..
            } => {
                assert_eq!(mode, PushMode::Gradient);
                assert_eq!(key_at(keys, 1), 5);
                let mut v = [0f32; 4];
                f32s_from_le(values, &mut v);
                assert_eq!(v, [1.0, 2.0, 3.0, 4.0]);
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn refuses_inconsistent_bodies() {
        let mut out = Vec::new();
        encode_pull(&mut out, 1, 0, 5, &[1, 2], None);
        // Claim three keys: the body no longer matches.
        out[6] = 3;
        let body_start = fabrickv_types::limits::FRAME_HEADER_BYTES;
        let crc = crate::checksum::crc32c(&out[body_start..]);
        out[20..24].copy_from_slice(&crc.to_le_bytes());
        assert!(decode_request(&decode_frame(&out).unwrap()).is_err());
        // A push whose values are not whole vectors.
        out.clear();
        encode_push(
            &mut out,
            2,
            0,
            5,
            PushMode::Overwrite,
            &[4, 5],
            &[1.0, 2.0, 3.0],
        );
        assert!(decode_request(&decode_frame(&out).unwrap()).is_err());
    }

    #[test]
    fn descriptors_round_trip() {
        let d = TableDesc {
            id: 3,
            spec: TableSpec::new("t", 4),
            items: 10,
        };
        let mut out = Vec::new();
        encode_list_reply(&mut out, 1, 0, &[d.clone(), d.clone()]);
        let f = decode_frame(&out).unwrap();
        let r = decode_reply(&f).unwrap();
        assert_eq!(decode_list(r.rest).unwrap(), vec![d.clone(), d]);
    }

    #[test]
    fn table_specs_parse_from_text() {
        let s = TableSpec::parse("emb:64:opt=adagrad:lr=0.5:missing=init:seed=3").unwrap();
        assert_eq!(
            s,
            TableSpec {
                name: "emb".into(),
                dim: 64,
                optimizer: Optimizer::Adagrad,
                missing: Missing::Init,
                lr: 0.5,
                seed: 3
            }
        );
        assert_eq!(TableSpec::parse("t:8").unwrap(), TableSpec::new("t", 8));
        for bad in [
            "t",
            "t:x",
            "t:0",
            "t:8:lr",
            "t:8:opt=adam",
            ":8",
            "t:8:color=red",
        ] {
            assert!(TableSpec::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn initializer_is_deterministic_and_in_range() {
        let mut a = [0f32; 64];
        let mut b = [0f32; 64];
        init_vector(1, 42, &mut a);
        init_vector(1, 42, &mut b);
        assert_eq!(a, b);
        init_vector(2, 42, &mut b);
        assert_ne!(a, b, "the seed matters");
        assert!(a.iter().all(|x| (-INIT_RANGE..INIT_RANGE).contains(x)));
        assert!(a.iter().any(|x| *x != a[0]), "elements differ");
    }

    #[test]
    fn frame_capacity_holds_the_vectors() {
        for dim in [1, 128, 1000, PS_DIM_MAX as u32] {
            let n = pull_keys_per_frame(dim);
            assert!(
                PS_PREFIX_BYTES + bitmap_bytes(n) + n * dim as usize * 4 <= FRAME_BODY_BYTES_MAX
            );
            let n = push_keys_per_frame(dim);
            assert!(
                PS_PREFIX_BYTES + PUSH_FIXED_BYTES + n * (8 + dim as usize * 4)
                    <= FRAME_BODY_BYTES_MAX
            );
        }
        assert_eq!(pull_keys_per_frame(128), PS_KEYS_PER_REQUEST_MAX);
    }
}
