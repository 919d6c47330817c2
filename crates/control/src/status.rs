//! How FabricKV's stable error codes travel in gRPC statuses.
//!
//! gRPC has 17 status codes and FabricKV has more, finer ones
//! (`BUFFER_TOO_SMALL` and `KEY_TOO_LONG` are both "invalid argument"-like,
//! but a client reacts to them differently). So each status carries both: the
//! nearest [`tonic::Code`], for generic gRPC tooling and retry policies, and
//! the exact FabricKV code in the metadata ([`CODE_METADATA_KEY`],
//! [`CODE_NAME_METADATA_KEY`]) and at the start of the message, for programs
//! and people. [`ControlClient`](crate::ControlClient) reads the metadata back
//! and falls back to [`code_from_grpc`] only for statuses that no FabricKV
//! server produced (transport failures, tonic's own size limits).

use fabrickv_types::limits::ERROR_MESSAGE_BYTES_MAX;
use fabrickv_types::ErrorCode;
use tonic::metadata::{MetadataMap, MetadataValue};
use tonic::{Code, Status};

use crate::backend::BackendError;
use crate::pb;

/// Metadata key of the FabricKV code number, in decimal (e.g. `24`).
pub const CODE_METADATA_KEY: &str = "fabrickv-code";

/// Metadata key of the FabricKV code's stable name (e.g. `BUFFER_TOO_SMALL`).
pub const CODE_NAME_METADATA_KEY: &str = "fabrickv-code-name";

/// The gRPC code nearest to a FabricKV code.
///
/// The choice follows the gRPC status-code guide: bad input is
/// `INVALID_ARGUMENT`, input that is valid but out of the target's range is
/// `OUT_OF_RANGE`, state the caller must fix first (a lapsed registration) is
/// `FAILED_PRECONDITION`, and a concurrency conflict worth retrying from the
/// top is `ABORTED`.
pub fn grpc_code(code: ErrorCode) -> Code {
    match code {
        ErrorCode::Ok => Code::Ok,
        ErrorCode::NotFound => Code::NotFound,
        ErrorCode::InsufficientSpace => Code::ResourceExhausted,
        ErrorCode::KeyTooLong => Code::InvalidArgument,
        ErrorCode::ValueTooLarge => Code::InvalidArgument,
        ErrorCode::UnknownOpcode => Code::Unimplemented,
        ErrorCode::BatchTooLarge => Code::InvalidArgument,
        ErrorCode::FrameTooLarge => Code::ResourceExhausted,
        ErrorCode::Malformed => Code::InvalidArgument,
        ErrorCode::UnsupportedVersion => Code::Unimplemented,
        ErrorCode::BadChecksum => Code::DataLoss,
        ErrorCode::WrongWorker => Code::FailedPrecondition,
        ErrorCode::TtlTooLarge => Code::InvalidArgument,
        ErrorCode::ConditionFailed => Code::FailedPrecondition,
        ErrorCode::Unavailable => Code::Unavailable,
        ErrorCode::WrongType => Code::FailedPrecondition,
        ErrorCode::Timeout => Code::DeadlineExceeded,
        ErrorCode::Internal => Code::Internal,
        ErrorCode::NoSuchWorker => Code::NotFound,
        ErrorCode::ReplyFull => Code::ResourceExhausted,
        ErrorCode::NoSuchTable => Code::NotFound,
        ErrorCode::TableExists => Code::AlreadyExists,
        ErrorCode::BadDimension => Code::InvalidArgument,
        ErrorCode::PoolUnavailable => Code::ResourceExhausted,
        ErrorCode::BufferTooSmall => Code::OutOfRange,
        ErrorCode::NoSuchClient => Code::FailedPrecondition,
        ErrorCode::ValueChanged => Code::Aborted,
        ErrorCode::NoSuchShard => Code::NotFound,
        ErrorCode::StorageFailed => Code::Internal,
        ErrorCode::NoSuchCopy => Code::NotFound,
        ErrorCode::CopyState => Code::FailedPrecondition,
        ErrorCode::SourceChanged => Code::FailedPrecondition,
        ErrorCode::AuthRequired | ErrorCode::AuthFailed => Code::Unauthenticated,
        ErrorCode::PeerNotAllowed => Code::PermissionDenied,
        // The value is there but larger than one reply: read it in chunks.
        ErrorCode::LargeValue => Code::OutOfRange,
        ErrorCode::NoSuchTransfer => Code::FailedPrecondition,
        ErrorCode::ChunkOutOfOrder => Code::Aborted,
        ErrorCode::ReceivingFull => Code::ResourceExhausted,
        ErrorCode::AuthThrottled => Code::ResourceExhausted,
        // Another server serves the key now: ask it (gRPC's "the system
        // is not in a state for this here").
        ErrorCode::WrongServer => Code::FailedPrecondition,
        ErrorCode::SaveInProgress => Code::Unavailable,
        ErrorCode::CheckpointRefused => Code::PermissionDenied,
        // A code added to fabrickv-types after this table was written: the
        // metadata still names it exactly; the gRPC code just says so.
        _ => Code::Unknown,
    }
}

/// The FabricKV code to assume for a status that carries none.
///
/// Such statuses come from tonic, hyper or a proxy, not from a FabricKV
/// server, so the table models what those produce: tonic reports an
/// over-limit message as `OUT_OF_RANGE` (hence `FRAME_TOO_LARGE`, not
/// `BUFFER_TOO_SMALL`), an expired client-side timeout as `CANCELLED`, and
/// an unreachable server as `UNAVAILABLE`.
pub fn code_from_grpc(code: Code) -> ErrorCode {
    match code {
        Code::Ok => ErrorCode::Ok,
        Code::Cancelled | Code::DeadlineExceeded => ErrorCode::Timeout,
        Code::InvalidArgument => ErrorCode::Malformed,
        Code::NotFound => ErrorCode::NotFound,
        Code::AlreadyExists | Code::FailedPrecondition => ErrorCode::ConditionFailed,
        Code::ResourceExhausted | Code::OutOfRange => ErrorCode::FrameTooLarge,
        Code::Aborted => ErrorCode::ValueChanged,
        Code::Unimplemented => ErrorCode::UnknownOpcode,
        Code::Unavailable => ErrorCode::Unavailable,
        Code::DataLoss => ErrorCode::BadChecksum,
        Code::Unknown | Code::PermissionDenied | Code::Internal | Code::Unauthenticated => {
            ErrorCode::Internal
        }
    }
}

/// Builds the status for a FabricKV error: nearest gRPC code, exact code in
/// the metadata, and a message of the form `NAME (code N): detail`.
pub fn to_status(code: ErrorCode, detail: &str) -> Status {
    let mut metadata = MetadataMap::new();
    metadata.insert(CODE_METADATA_KEY, MetadataValue::from(code.as_u16()));
    metadata.insert(
        CODE_NAME_METADATA_KEY,
        MetadataValue::from_static(code.name()),
    );
    Status::with_metadata(grpc_code(code), format!("{code}: {detail}"), metadata)
}

impl From<BackendError> for Status {
    fn from(e: BackendError) -> Status {
        to_status(e.code, &e.message)
    }
}

/// Reads the FabricKV code a status carries, falling back when it carries
/// none or one this build does not know (from a newer server): a status
/// caused by a connection failure is [`ErrorCode::Unavailable`] whatever
/// gRPC code tonic gave it (it reports some broken connections as INTERNAL
/// or UNKNOWN), anything else goes through [`code_from_grpc`].
pub fn code_of(status: &Status) -> ErrorCode {
    let exact = status
        .metadata()
        .get(CODE_METADATA_KEY)
        .and_then(|v| v.to_str().ok())
        .and_then(|s| s.parse::<u16>().ok())
        .and_then(ErrorCode::from_u16);
    match exact {
        Some(code) => code,
        None if is_connection_failure(status) => ErrorCode::Unavailable,
        None => code_from_grpc(status.code()),
    }
}

/// Whether a status was made from a transport or I/O error on the client's
/// side, rather than sent by a server.
fn is_connection_failure(status: &Status) -> bool {
    let mut source = std::error::Error::source(status);
    while let Some(e) = source {
        if e.is::<tonic::transport::Error>() || e.is::<std::io::Error>() {
            return true;
        }
        source = e.source();
    }
    false
}

/// The detail of a status message, without the `NAME (code N): ` prefix
/// [`to_status`] puts in front (the code travels separately).
pub fn detail_of(status: &Status, code: ErrorCode) -> &str {
    let message = status.message();
    let prefix = format!("{code}: ");
    message.strip_prefix(prefix.as_str()).unwrap_or(message)
}

/// The per-item status of a batch item that succeeded.
pub(crate) fn item_ok() -> pb::ItemStatus {
    pb::ItemStatus {
        code: u32::from(ErrorCode::Ok.as_u16()),
        name: ErrorCode::Ok.name().to_owned(),
        message: String::new(),
    }
}

/// The per-item status of a batch item that failed. The message is cut to
/// `ERROR_MESSAGE_BYTES_MAX` so that a batch reply's size stays bounded by
/// the item count, whatever the backend says.
pub(crate) fn item_err(e: &BackendError) -> pb::ItemStatus {
    pb::ItemStatus {
        code: u32::from(e.code.as_u16()),
        name: e.code.name().to_owned(),
        message: truncate(&e.message, ERROR_MESSAGE_BYTES_MAX).to_owned(),
    }
}

/// The longest prefix of `s` of at most `max` bytes that ends on a
/// character boundary.
fn truncate(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_code_survives_a_status() {
        for code in ErrorCode::ALL {
            if code == ErrorCode::Ok {
                continue;
            }
            let status = to_status(code, "detail");
            assert_eq!(code_of(&status), code);
            assert_eq!(detail_of(&status, code), "detail");
            assert_eq!(status.code(), grpc_code(code));
            assert_ne!(status.code(), Code::Unknown, "{code} has no mapping");
        }
    }

    #[test]
    fn status_metadata_names_the_code() {
        let status = to_status(ErrorCode::BufferTooSmall, "no room");
        let md = status.metadata();
        assert_eq!(
            md.get(CODE_METADATA_KEY).and_then(|v| v.to_str().ok()),
            Some("24")
        );
        assert_eq!(
            md.get(CODE_NAME_METADATA_KEY).and_then(|v| v.to_str().ok()),
            Some("BUFFER_TOO_SMALL")
        );
        assert_eq!(status.code(), Code::OutOfRange);
        assert_eq!(status.message(), "BUFFER_TOO_SMALL (code 24): no room");
    }

    #[test]
    fn statuses_without_metadata_fall_back() {
        let status = Status::out_of_range("decoded message length too large");
        assert_eq!(code_of(&status), ErrorCode::FrameTooLarge);
        assert_eq!(
            detail_of(&status, ErrorCode::FrameTooLarge),
            "decoded message length too large"
        );
        assert_eq!(
            code_of(&Status::unavailable("down")),
            ErrorCode::Unavailable
        );
    }

    #[test]
    fn connection_failures_are_unavailable() {
        let io = std::io::Error::new(std::io::ErrorKind::ConnectionReset, "reset");
        let status = Status::from_error(Box::new(io));
        assert_ne!(status.code(), Code::Unavailable);
        assert_eq!(code_of(&status), ErrorCode::Unavailable);
    }

    #[test]
    fn unknown_metadata_code_falls_back() {
        let mut md = MetadataMap::new();
        md.insert(CODE_METADATA_KEY, MetadataValue::from(9999u16));
        let status = Status::with_metadata(Code::NotFound, "x", md);
        assert_eq!(code_of(&status), ErrorCode::NotFound);
    }

    #[test]
    fn truncate_respects_char_boundaries() {
        assert_eq!(truncate("abc", 5), "abc");
        assert_eq!(truncate("héllo", 2), "h");
        assert_eq!(truncate("héllo", 3), "hé");
    }
}
