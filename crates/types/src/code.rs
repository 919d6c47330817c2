//! Stable error codes that cross the wire.
//!
//! The numeric value of each code is part of the protocol (see
//! `docs/protocol.md`): codes are never renumbered or reused, only added.

use std::fmt;

/// Outcome of one operation or one frame, as carried on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u16)]
#[non_exhaustive]
pub enum ErrorCode {
    /// The operation succeeded.
    Ok = 0,
    /// The key is not stored (or has expired).
    NotFound = 1,
    /// Store mode is full: nothing was evicted and nothing was written.
    InsufficientSpace = 2,
    /// The key is empty or longer than `KEY_BYTES_MAX`.
    KeyTooLong = 3,
    /// The value is longer than `VALUE_BYTES_MAX` or than the engine can hold.
    ValueTooLarge = 4,
    /// The operation or frame opcode is unknown to this server.
    UnknownOpcode = 5,
    /// The frame carries more than `BATCH_OPS_MAX` operations.
    BatchTooLarge = 6,
    /// The frame is longer than `FRAME_BYTES_MAX`.
    FrameTooLarge = 7,
    /// The frame is well delimited but its contents do not parse.
    Malformed = 8,
    /// The frame's protocol version is not spoken by this server.
    UnsupportedVersion = 9,
    /// The frame's checksum does not match its contents.
    BadChecksum = 10,
    /// The key belongs to another worker; the client must re-steer it.
    WrongWorker = 11,
    /// The time-to-live is larger than `TTL_SECS_MAX`.
    TtlTooLarge = 12,
    /// A conditional write (if-absent / if-present) did not apply.
    ConditionFailed = 13,
    /// The server is shutting down or over a connection bound.
    Unavailable = 14,
    /// The stored value is not of the type the operation needs.
    WrongType = 15,
    /// The request did not complete before its deadline (client side), or
    /// a GET_CHUNK named a pin past its deadline (the server's
    /// `KV_LARGE_PIN_MS` from the GET that made it): GET the value again.
    Timeout = 16,
    /// The server hit a bug; the request had no effect.
    Internal = 17,
    /// The handshake asked for a worker that does not exist.
    NoSuchWorker = 18,
    /// The reply frame had no room left for this GET's value; the
    /// operation had no effect and should be sent again in another frame
    /// (the client does this by itself).
    ReplyFull = 19,
    /// The embedding table named or numbered in the request does not exist.
    NoSuchTable = 20,
    /// An embedding table with this name exists already with another shape.
    TableExists = 21,
    /// A vector's length (or a table's dimension) does not match the table,
    /// or is outside `PS_DIM_MAX`.
    BadDimension = 22,
    /// The embedding pool could not be had (size, mlock, hugepages), or has
    /// no room for another table.
    PoolUnavailable = 23,
    /// A value does not fit the destination slice it was asked to land in
    /// (checked before any byte is written).
    BufferTooSmall = 24,
    /// The client id names no live registration (never registered, or
    /// released after its heartbeats stopped).
    NoSuchClient = 25,
    /// A cache entry was replaced or removed while a chunked transfer of it
    /// was under way; the transfer must start again.
    ValueChanged = 26,
    /// The server serves no persistent shard of that name.
    NoSuchShard = 27,
    /// The persistent store (or the disk under it) failed; the operation
    /// did not happen.
    StorageFailed = 28,
    /// No copy run has that id (never created, ended, or the source
    /// restarted).
    NoSuchCopy = 29,
    /// The copy run is not in a state that allows this operation
    /// (START twice, START before its checkpoint is ready).
    CopyState = 30,
    /// A resumed copy found that the source shard changed, since the
    /// earlier run, among the pairs the target already holds: continuing
    /// would mix two points in time, so the copy must start over.
    SourceChanged = 31,
    /// The server requires the cluster secret and the client offered
    /// none (it has no `--auth-token-file` or `FABRICKV_AUTH_TOKEN`).
    AuthRequired = 32,
    /// The client's proof of the cluster secret was wrong: the two sides
    /// hold different secrets.
    AuthFailed = 33,
    /// The peer is not allowed in whatever it proves: a shared-memory
    /// client running as another user than the server (or its allow-list).
    PeerNotAllowed = 34,
    /// A native GET found a value too large for one frame (over
    /// `VALUE_BYTES_MAX`): the result carries its total length and a pin
    /// tag, and the client reads it with GET_CHUNK operations.
    LargeValue = 35,
    /// A chunk named a transfer (PUT_CHUNK) or a pinned value (GET_CHUNK)
    /// this connection does not have: never started, finished, replaced by
    /// a newer one, or freed after idling.
    NoSuchTransfer = 36,
    /// A PUT_CHUNK did not start where the transfer's previous chunk ended
    /// (or named another key or total); the transfer is dropped.
    ChunkOutOfOrder = 37,
    /// Receiving the value would take the server's bytes of large values
    /// being received over its bound; try again later.
    ReceivingFull = 38,
    /// Too many failed authentications came from this client's address
    /// (or, server-wide, from addresses that failed recently): the
    /// attempt was refused without being judged; retry later.
    AuthThrottled = 39,
    /// The key's slot is served by another server at the cluster's
    /// current epoch (the client's slot map is older than the server's):
    /// nothing was done. Read the map again and send it to the slot's
    /// primary (the cluster client does this by itself).
    WrongServer = 40,
    /// A checkpoint save is already running: nothing new was started.
    /// Wait for it (its outcome is in the status) and ask again.
    SaveInProgress = 41,
    /// No checkpoint can be written there: the server has no checkpoint
    /// directory (`--checkpoint-dir`), or the one named is outside it.
    CheckpointRefused = 42,
}

impl ErrorCode {
    /// Every code, in numeric order; used by tests and documentation.
    pub const ALL: [ErrorCode; 43] = [
        ErrorCode::Ok,
        ErrorCode::NotFound,
        ErrorCode::InsufficientSpace,
        ErrorCode::KeyTooLong,
        ErrorCode::ValueTooLarge,
        ErrorCode::UnknownOpcode,
        ErrorCode::BatchTooLarge,
        ErrorCode::FrameTooLarge,
        ErrorCode::Malformed,
        ErrorCode::UnsupportedVersion,
        ErrorCode::BadChecksum,
        ErrorCode::WrongWorker,
        ErrorCode::TtlTooLarge,
        ErrorCode::ConditionFailed,
        ErrorCode::Unavailable,
        ErrorCode::WrongType,
        ErrorCode::Timeout,
        ErrorCode::Internal,
        ErrorCode::NoSuchWorker,
        ErrorCode::ReplyFull,
        ErrorCode::NoSuchTable,
        ErrorCode::TableExists,
        ErrorCode::BadDimension,
        ErrorCode::PoolUnavailable,
        ErrorCode::BufferTooSmall,
        ErrorCode::NoSuchClient,
        ErrorCode::ValueChanged,
        ErrorCode::NoSuchShard,
        ErrorCode::StorageFailed,
        ErrorCode::NoSuchCopy,
        ErrorCode::CopyState,
        ErrorCode::SourceChanged,
        ErrorCode::AuthRequired,
        ErrorCode::AuthFailed,
        ErrorCode::PeerNotAllowed,
        ErrorCode::LargeValue,
        ErrorCode::NoSuchTransfer,
        ErrorCode::ChunkOutOfOrder,
        ErrorCode::ReceivingFull,
        ErrorCode::AuthThrottled,
        ErrorCode::WrongServer,
        ErrorCode::SaveInProgress,
        ErrorCode::CheckpointRefused,
    ];

    /// The code as it travels on the wire.
    pub fn as_u16(self) -> u16 {
        self as u16
    }

    /// Parses a wire code; unknown codes (from a newer server) map to `None`.
    pub fn from_u16(v: u16) -> Option<ErrorCode> {
        Self::ALL.get(usize::from(v)).copied()
    }

    /// A short stable name, used in CLI messages and logs.
    pub fn name(self) -> &'static str {
        match self {
            ErrorCode::Ok => "OK",
            ErrorCode::NotFound => "NOT_FOUND",
            ErrorCode::InsufficientSpace => "INSUFFICIENT_SPACE",
            ErrorCode::KeyTooLong => "KEY_TOO_LONG",
            ErrorCode::ValueTooLarge => "VALUE_TOO_LARGE",
            ErrorCode::UnknownOpcode => "UNKNOWN_OPCODE",
            ErrorCode::BatchTooLarge => "BATCH_TOO_LARGE",
            ErrorCode::FrameTooLarge => "FRAME_TOO_LARGE",
            ErrorCode::Malformed => "MALFORMED",
            ErrorCode::UnsupportedVersion => "UNSUPPORTED_VERSION",
            ErrorCode::BadChecksum => "BAD_CHECKSUM",
            ErrorCode::WrongWorker => "WRONG_WORKER",
            ErrorCode::TtlTooLarge => "TTL_TOO_LARGE",
            ErrorCode::ConditionFailed => "CONDITION_FAILED",
            ErrorCode::Unavailable => "UNAVAILABLE",
            ErrorCode::WrongType => "WRONG_TYPE",
            ErrorCode::Timeout => "TIMEOUT",
            ErrorCode::Internal => "INTERNAL",
            ErrorCode::NoSuchWorker => "NO_SUCH_WORKER",
            ErrorCode::ReplyFull => "REPLY_FULL",
            ErrorCode::NoSuchTable => "NO_SUCH_TABLE",
            ErrorCode::TableExists => "TABLE_EXISTS",
            ErrorCode::BadDimension => "BAD_DIMENSION",
            ErrorCode::PoolUnavailable => "POOL_UNAVAILABLE",
            ErrorCode::BufferTooSmall => "BUFFER_TOO_SMALL",
            ErrorCode::NoSuchClient => "NO_SUCH_CLIENT",
            ErrorCode::ValueChanged => "VALUE_CHANGED",
            ErrorCode::NoSuchShard => "NO_SUCH_SHARD",
            ErrorCode::StorageFailed => "STORAGE_FAILED",
            ErrorCode::NoSuchCopy => "NO_SUCH_COPY",
            ErrorCode::CopyState => "COPY_STATE",
            ErrorCode::SourceChanged => "SOURCE_CHANGED",
            ErrorCode::AuthRequired => "AUTH_REQUIRED",
            ErrorCode::AuthFailed => "AUTH_FAILED",
            ErrorCode::PeerNotAllowed => "PEER_NOT_ALLOWED",
            ErrorCode::LargeValue => "LARGE_VALUE",
            ErrorCode::NoSuchTransfer => "NO_SUCH_TRANSFER",
            ErrorCode::ChunkOutOfOrder => "CHUNK_OUT_OF_ORDER",
            ErrorCode::ReceivingFull => "RECEIVING_FULL",
            ErrorCode::AuthThrottled => "AUTH_THROTTLED",
            ErrorCode::WrongServer => "WRONG_SERVER",
            ErrorCode::SaveInProgress => "SAVE_IN_PROGRESS",
            ErrorCode::CheckpointRefused => "CHECKPOINT_REFUSED",
        }
    }
}

impl fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} (code {})", self.name(), self.as_u16())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_round_trip_and_are_dense() {
        for (i, c) in ErrorCode::ALL.iter().enumerate() {
            assert_eq!(usize::from(c.as_u16()), i, "{c:?} is out of place in ALL");
            assert_eq!(ErrorCode::from_u16(c.as_u16()), Some(*c));
        }
        assert_eq!(ErrorCode::from_u16(ErrorCode::ALL.len() as u16), None);
    }

    #[test]
    fn names_are_unique() {
        let mut names: Vec<_> = ErrorCode::ALL.iter().map(|c| c.name()).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), ErrorCode::ALL.len());
    }
}
