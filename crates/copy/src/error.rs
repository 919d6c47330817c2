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

/// `text` from a peer with its control characters escaped (`\u{1b}` for
/// ESC), so that a source's status or abort message printed to the
/// operator's terminal cannot move the cursor, recolour or retitle it.
pub(crate) fn printable(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if c.is_control() {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    out
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

#[cfg(test)]
mod tests {
    use super::printable;

    #[test]
    fn a_peer_message_reaches_the_terminal_with_its_escapes_escaped() {
        let hostile = "disk full\u{1b}[2J\u{1b}]0;owned\u{7}\r\nfake: DONE";
        let shown = printable(hostile);
        assert!(!shown.chars().any(char::is_control), "{shown:?}");
        assert_eq!(
            shown,
            "disk full\\u{1b}[2J\\u{1b}]0;owned\\u{7}\\r\\nfake: DONE"
        );
        assert_eq!(printable("plain words, é"), "plain words, é");
    }
}
