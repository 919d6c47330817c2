//! RESP2 for FabricKV's Redis-compatible front-end: a command parser and a
//! reply encoder, sitting in the hot path of every Redis client request.
//!
//! # Design
//!
//! **Sans-I/O.** Nothing here touches a socket. The connection owns its
//! receive buffer and hands [`CommandParser::parse`] the unread bytes; the
//! answer says how many bytes one command took ([`Parse::Complete`]) or how
//! many must be buffered before trying again ([`Parse::Incomplete`]). The
//! same code therefore serves any event loop, and tests and fuzzers drive
//! it with plain slices.
//!
//! **Zero-copy.** A parsed command is a list of `(start, len)` spans into
//! the caller's buffer, read back with [`CommandParser::arg`]. Only inline
//! arguments with quotes or escapes differ from their wire bytes; those are
//! rewritten into a scratch buffer the parser owns, and their spans are
//! tagged as pointing there. Both vectors are reused from command to
//! command, so the steady state allocates nothing.
//!
//! **Bounded.** Every length a client announces is checked against
//! [`limits`] as soon as its header is read, and a header line is judged
//! byte by byte, so a hostile or broken client is refused at once instead
//! of being waited for. A command never needs more than
//! [`RESP_COMMAND_BYTES_MAX`] bytes of buffer, whatever its number of
//! arguments, and the parser's own buffers are bounded by [`RESP_ARGS_MAX`]
//! spans (only as many as the bytes allow; room for [`RESP_ARGS_KEPT`] is
//! kept between commands) and [`RESP_INLINE_BYTES_MAX`] scratch bytes. Every error is a [`ProtocolError`] whose text is Redis's;
//! it is fatal for the connection, as in Redis. No input makes it panic.
//!
//! **The `need` hint.** The parser keeps no state between calls: a call
//! that finds an incomplete command starts over on the next call. To keep
//! that cheap, `Incomplete { need }` is a lower bound on the bytes the whole
//! command takes: a known bulk length counts in full, and every argument
//! not yet seen counts as its smallest encoding. A caller that waits for
//! `need` bytes before parsing again re-reads only headers (payloads are
//! skipped by length), so a 1 MiB value arriving in a thousand reads is
//! parsed once, not a thousand times.

pub mod args;
pub mod error;
pub mod limits;
mod parser;
pub mod reply;

#[cfg(test)]
mod proptests;
#[cfg(test)]
mod tests;

pub use args::{eq_ignore_case, lowercase, parse_i64};
pub use error::ProtocolError;
pub use limits::*;
pub use parser::{CommandParser, Parse, ParseLarge};
pub use reply::{Proto, Reply};
