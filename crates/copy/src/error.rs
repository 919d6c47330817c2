//! Why a copy failed: one error type with a stable code, and the
//! conversions from the storage engine's and the control client's errors.

use fabrickv_storage::StorageError;
use fabrickv_types::ErrorCode;

/// Why a copy failed: a stable code and what happened.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{} (code {}): {message}", code.name(), code.as_u16())]
pub struct CopyError {
    /// The stable code.
    pub code: ErrorCode,
    /// What happened.
    pub message: String,
}

pub(crate) fn err(code: ErrorCode, message: impl Into<String>) -> CopyError {
    CopyError {
        code,
        message: message.into(),
    }
}

pub(crate) fn storage(what: &str, e: StorageError) -> CopyError {
    let text = e.to_string();
    // A full disk is the one storage failure a user can act on at once.
    let code = if text.contains("No space left") || text.contains("os error 28") {
        ErrorCode::InsufficientSpace
    } else {
        ErrorCode::StorageFailed
    };
    err(code, format!("{what}: {text}"))
}

pub(crate) fn client(what: &str, e: fabrickv_client::ClientError) -> CopyError {
    err(e.code(), format!("{what}: {e}"))
}
