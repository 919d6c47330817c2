//! The FabricKV native protocol: frames that carry batches of operations.
//!
//! Layout:
//! - [`checksum`]: CRC-32C, the checksum of frame bodies and value chunks;
//! - [`header`]: the fixed 32-byte frame header and its validation;
//! - [`request`]: request bodies (a batch of GET/PUT/DELETE operations),
//!   encoded with [`RequestBuilder`] and read with [`RequestIter`];
//! - [`response`]: response bodies (one result per operation, in order);
//! - [`control`]: HELLO, STATS and ERROR frame bodies;
//! - [`echo`]: ECHO frames, bytes sent back unchanged (the request
//!   layer's own measurement, `fabrickv bench rpc`);
//! - [`cache`]: KV-cache data-plane requests and replies (chunked or
//!   one-sided values);
//! - [`ps`]: embedding-table (parameter server) requests and replies, and
//!   the deterministic initializer that preload and checks share;
//! - [`shard`]: persistent-shard requests and replies (data operations and
//!   the copy's control);
//! - [`shard_data`]: the payloads of the shard data ops (batched GET, PUT,
//!   DELETE) and of their replies;
//! - [`copy`]: the shard copy's control payloads (in SHARD frames) and its
//!   data streams' hello and frames, shared by the source (the server's
//!   shard service) and the target (`fabrickv-copy`).
//!
//! Everything here is sans-I/O: functions take byte slices and append to
//! `Vec<u8>`, so the codec is tested and fuzzed without sockets. Decoding
//! never panics on any input and never allocates on a data path (the
//! copy's control payloads, a few per copy, decode into owned values); every length is checked
//! against a bound from [`fabrickv_types::limits`] before it is trusted.
//! The format is specified in `docs/protocol.md`.

pub mod cache;
pub mod checkpoint;
pub mod checksum;
pub mod control;
pub mod copy;
pub mod echo;
#[macro_use]
pub mod header;
pub mod ps;
pub mod repl;
pub mod request;
pub mod response;
pub mod shard;
pub mod shard_data;

pub use header::{decode_frame, Frame, FrameHeader, FrameKind, WireError, MAGIC, VERSION};
pub use request::{
    GetChunk, Op, OpCode, PutChunk, PutCondition, RequestBuilder, RequestIter, FLAG_REPLICA_READ,
    GET_CHUNK_HEAD_BYTES, LARGE_RESULT_BYTES, PUT_CHUNK_HEAD_BYTES,
};
pub use response::{OneResultHead, OpResult, ResponseBuilder, ResponseIter, ONE_RESULT_HEAD_BYTES};

/// Reads a little-endian u16 at `at`; callers have checked the length.
#[inline]
pub(crate) fn le_u16(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

/// Reads a little-endian u32 at `at`; callers have checked the length.
#[inline]
pub(crate) fn le_u32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

/// Reads a little-endian u64 at `at`; callers have checked the length.
#[inline]
pub(crate) fn le_u64(b: &[u8], at: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(a)
}
