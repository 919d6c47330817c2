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
//! PUSH:   u8 mode (0 overwrite, 1 gradient), u8 flags (bit 0: a
//!         request id follows), u8[6] reserved, [u64 client, u64 seq],
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

mod reply;
mod request;
pub use reply::*;
pub use request::*;

/// Bytes of the prefix every PS body starts with.
pub const PS_PREFIX_BYTES: usize = 8;

/// Bytes of a PULL's fixed part after the prefix (flags, reserved).
pub const PULL_FIXED_BYTES: usize = 8;

/// Bytes of a PULL's one-sided destination (region descriptor, offset).
pub const PULL_DEST_BYTES: usize = 32;

/// Bytes of a PUSH's fixed part after the prefix (mode, reserved).
pub const PUSH_FIXED_BYTES: usize = 8;

/// Bytes of a PUSH's request id (client, seq), when its flag is set.
pub const PUSH_ID_BYTES: usize = 16;

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
mod tests;
