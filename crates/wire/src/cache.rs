//! KV-cache frames: the data plane of the LLM KV-cache service.
//!
//! A cache frame uses the common header with kind `Cache` (client to
//! server) or `CacheReply`; `op_count` is 0. Every body starts with a
//! 16-byte prefix:
//!
//! ```text
//! 0  u8  op        CacheOp
//! 1  u8  flags     PUT: bit 0 = value is in the client's region
//!                  GET: bit 0 = write the value into the client's region
//!                  (every other bit must be 0)
//! 2  u16 key_len   1..=CACHE_KEY_BYTES_MAX (0 for BIND)
//! 4  u32 reserved  must be 0
//! 8  u64 tag       PUT: the client's transfer id (chunked puts);
//!                  GET: the generation asked for (0 = whichever is live)
//! ```
//!
//! then, by op:
//!
//! ```text
//! PUT:    u64 ttl_ms, u64 total_len, u64 offset, key,
//!         then either RemoteRegion (24) + u64 region_offset (flag 0: the
//!         server reads total_len bytes from the client's region; offset
//!         must be 0) or the chunk: bytes [offset, offset + chunk) of the
//!         value (the rest of the body)
//! GET:    u64 offset, u64 max_len (largest inline chunk wanted), key,
//!         then, with flag 0, RemoteRegion (24) + u64 region_offset +
//!         u64 slice_len (the destination slice; the value must fit it)
//! DELETE: key
//! EXISTS: key
//! BIND:   u64 client_id, RemoteRegion (24), u64 region_len
//! ```
//!
//! Replies (`CacheReply`; header `status` = the operation's ErrorCode; the
//! prefix repeats op, flags 0, key_len 0 and carries in `tag` the value's
//! generation where one is known):
//!
//! ```text
//! PUT:    u64 received (bytes of the value the server holds so far),
//!         u64 total_len; status OK and received == total_len = committed
//! GET:    u64 total_len, u64 offset, u64 expires_in_ms (0 = never),
//!         then the inline chunk, or nothing when written to the region
//! DELETE, EXISTS: nothing (status OK: it was there; NOT_FOUND: it was not)
//! BIND:   nothing
//! ```
//!
//! Over a transport with one-sided writes a GET is one request and one
//! small reply after the value has landed; otherwise the value comes back
//! in chunks of at most `CACHE_CHUNK_BYTES_MAX`, each asked for with the
//! generation of the first, so a value replaced mid-transfer is reported
//! (`VALUE_CHANGED`) instead of being stitched from two versions.

use fabrickv_types::limits::{
    CACHE_CHUNK_BYTES_MAX, CACHE_KEY_BYTES_MAX, CACHE_VALUE_BYTES_MAX, FRAME_HEADER_BYTES,
};
use fabrickv_types::ErrorCode;

use crate::header::{finish_frame, Frame, FrameHeader, FrameKind, WireError};
use crate::{le_u16, le_u32, le_u64};

mod reply;
mod request;
pub use reply::*;
pub use request::*;

/// Bytes of the prefix every cache body starts with.
pub const CACHE_PREFIX_BYTES: usize = 16;

/// Bytes of a region descriptor on the wire (`RemoteRegion::ENCODED_BYTES`).
pub const REGION_BYTES: usize = 24;

/// Flag bit: the value is in (PUT) or goes to (GET) the client's region.
pub const FLAG_REGION: u8 = 1;

/// Flag bit of a GET into the client's region: the client copies the
/// value out as soon as the reply arrives, so the server writes it with
/// ordinary stores, which leave it in a cache the reader's CPU shares,
/// rather than streaming it past the caches to memory (its default for a
/// large value, best for a value read in place some time later). Refused
/// without [`FLAG_REGION`] and on every other operation.
pub const FLAG_READ_NOW: u8 = 2;

/// A cache operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum CacheOp {
    /// Store a value (whole, in chunks, or read from the client's region).
    Put = 1,
    /// Read a value (into the client's region, or inline in chunks).
    Get = 2,
    /// Remove a key.
    Delete = 3,
    /// Ask whether a key is live.
    Exists = 4,
    /// Tie a gRPC client id to this connection's registered region.
    Bind = 5,
}

impl CacheOp {
    fn from_u8(v: u8) -> Option<CacheOp> {
        Some(match v {
            1 => CacheOp::Put,
            2 => CacheOp::Get,
            3 => CacheOp::Delete,
            4 => CacheOp::Exists,
            5 => CacheOp::Bind,
            _ => return None,
        })
    }
}

/// A slice of a client's registered region.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RegionSlice {
    /// The region descriptor, encoded as `RemoteRegion` encodes it.
    pub region: [u8; REGION_BYTES],
    /// Byte offset of the slice in the region.
    pub offset: u64,
    /// Bytes of the slice (GET: the value must fit; PUT: the value's size).
    pub len: u64,
}

/// A decoded cache request, borrowing the frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CacheRequest<'a> {
    /// PUT.
    Put {
        /// Key.
        key: &'a [u8],
        /// Chunked transfer id chosen by the client (unique per connection).
        transfer: u64,
        /// Time to live in ms (0 = none).
        ttl_ms: u64,
        /// Size of the whole value.
        total_len: u64,
        /// Where this chunk starts in the value.
        offset: u64,
        /// The chunk, or where the whole value is.
        source: PutSource<'a>,
    },
    /// GET.
    Get {
        /// Key.
        key: &'a [u8],
        /// Generation asked for (0 = any).
        generation: u64,
        /// First byte wanted (inline chunks).
        offset: u64,
        /// Most bytes wanted inline.
        max_len: u64,
        /// Where the whole value goes, if one-sided.
        dest: Option<RegionSlice>,
        /// Whether the client reads `dest` at once ([`FLAG_READ_NOW`]).
        read_now: bool,
    },
    /// DELETE.
    Delete {
        /// Key.
        key: &'a [u8],
    },
    /// EXISTS.
    Exists {
        /// Key.
        key: &'a [u8],
    },
    /// BIND.
    Bind {
        /// The id the gRPC RegisterClient returned.
        client_id: u64,
        /// The connection's registered region (offset 0, its length).
        region: RegionSlice,
    },
}

/// Where a PUT's bytes are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PutSource<'a> {
    /// In the frame.
    Inline(&'a [u8]),
    /// In the client's region (`len` = the value's size).
    Region(RegionSlice),
}

#[cfg(test)]
mod tests;
