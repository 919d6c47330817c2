//! The replies memcached gives to refused input, word for word.

/// `ERROR`: an unknown command.
pub const ERROR: &str = "ERROR";
/// A line that is not what its command takes.
pub const BAD_FORMAT: &str = "CLIENT_ERROR bad command line format";
/// A value not followed by CRLF where its length says.
pub const BAD_CHUNK: &str = "CLIENT_ERROR bad data chunk";
/// A value over [`MC_VALUE_BYTES_MAX`] (or the engine's room).
pub const TOO_LARGE: &str = "SERVER_ERROR object too large for cache";
/// A store-mode pool with no room left.
pub const NO_MEMORY: &str = "SERVER_ERROR out of memory storing object";
/// incr/decr of a value that is not a decimal number.
pub const NON_NUMERIC: &str = "CLIENT_ERROR cannot increment or decrement non-numeric value";
/// incr/decr whose delta is not a number.
pub const BAD_DELTA: &str = "CLIENT_ERROR invalid numeric delta argument";
/// A line longer than its bound.
pub const LINE_TOO_LONG: &str = "CLIENT_ERROR line too long";
/// A meta flag this server does not support, or a malformed one.
pub const INVALID_FLAG: &str = "CLIENT_ERROR invalid flag";
/// A meta mode this command does not have.
pub const INVALID_MODE: &str = "CLIENT_ERROR invalid mode for ms STORE";
/// A key over [`MC_KEY_BYTES_MAX`] or, base64, not decodable.
pub const KEY_TOO_LONG: &str = "CLIENT_ERROR bad command line format";
/// An expiry time that is not a number (`touch`, `gat`, `flush_all`).
pub const INVALID_EXPTIME: &str = "CLIENT_ERROR invalid exptime argument";
/// `delete` with a second word other than `0` or `noreply`.
pub const DELETE_USAGE: &str =
    "CLIENT_ERROR bad command line format.  Usage: delete <key> [noreply]";
/// `stats cachedump` with fewer than two arguments.
pub const BAD_LINE: &str = "CLIENT_ERROR bad command line";
/// `stats cachedump` of a class id at or over [`MC_SLAB_CLASSES_MAX`].
pub const ILLEGAL_SLAB_ID: &str = "CLIENT_ERROR Illegal slab id";
