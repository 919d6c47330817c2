//! Why a cache operation did not happen.

use std::fmt;

use fabrickv_types::limits::{CACHE_KEY_BYTES_MAX, CACHE_VALUE_BYTES_MAX, TTL_MS_MAX};
use fabrickv_types::ErrorCode;

/// Why a cache operation did not happen. Every error leaves the store as it
/// was: no partial value is ever visible.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CacheError {
    /// The key is longer than `CACHE_KEY_BYTES_MAX`.
    KeyTooLong,
    /// The key is empty (no client can mean it; it usually is a bug).
    KeyEmpty,
    /// The value is longer than `CACHE_VALUE_BYTES_MAX` or than the pool.
    ValueTooLarge,
    /// The time-to-live is longer than `TTL_MS_MAX`.
    TtlTooLarge,
    /// No block of the value's size could be had: eviction is off, or
    /// everything evictable is leased or already evicted.
    Full,
    /// The key is not stored (or has expired).
    NotFound,
    /// The key now holds another value than the generation asked for: a
    /// chunked read must start again.
    ValueChanged,
    /// The configuration is out of its bounds (store creation only).
    InvalidConfig(String),
    /// The operating system refused the pool, or the store broke an
    /// invariant of its own.
    Internal(String),
}

impl CacheError {
    /// The wire code of this error.
    pub fn code(&self) -> ErrorCode {
        match self {
            CacheError::KeyTooLong => ErrorCode::KeyTooLong,
            CacheError::KeyEmpty => ErrorCode::Malformed,
            CacheError::ValueTooLarge => ErrorCode::ValueTooLarge,
            CacheError::TtlTooLarge => ErrorCode::TtlTooLarge,
            CacheError::Full => ErrorCode::InsufficientSpace,
            CacheError::NotFound => ErrorCode::NotFound,
            CacheError::ValueChanged => ErrorCode::ValueChanged,
            CacheError::InvalidConfig(_) => ErrorCode::Malformed,
            CacheError::Internal(_) => ErrorCode::Internal,
        }
    }
}

impl fmt::Display for CacheError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CacheError::KeyTooLong => {
                write!(f, "key longer than {CACHE_KEY_BYTES_MAX} bytes")
            }
            CacheError::KeyEmpty => f.write_str("empty key"),
            CacheError::ValueTooLarge => write!(
                f,
                "value longer than {CACHE_VALUE_BYTES_MAX} bytes or than the cache pool"
            ),
            CacheError::TtlTooLarge => write!(f, "ttl longer than {TTL_MS_MAX} ms"),
            CacheError::Full => {
                f.write_str("cache pool full: no room and nothing evictable (or eviction off)")
            }
            CacheError::NotFound => f.write_str("key not found"),
            CacheError::ValueChanged => {
                f.write_str("value replaced or removed during the transfer")
            }
            CacheError::InvalidConfig(why) => write!(f, "invalid cache config: {why}"),
            CacheError::Internal(why) => write!(f, "cache internal error: {why}"),
        }
    }
}

impl std::error::Error for CacheError {}
