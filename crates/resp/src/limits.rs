//! Every bound of the RESP front-end, as a named constant whose name ends
//! in its unit.
//!
//! The parser checks a length against these as soon as its header is read,
//! before it waits for the bytes it announces, so a client can neither make
//! the server buffer without end nor make it hold a command it would refuse.

/// Largest bulk argument, in bytes: 512 MiB, Redis's `proto-max-bulk-len`.
/// A bulk this long is never buffered with its command: a parser that
/// takes large bulks ([`crate::CommandParser::parse_large`]) hands any bulk
/// of [`RESP_LARGE_BULK_BYTES_MIN`] bytes or more to its caller to receive
/// into the value's own buffer, and a plain parser refuses a command over
/// [`RESP_COMMAND_BYTES_MAX`].
pub const RESP_BULK_BYTES_MAX: usize = 512 << 20;

/// Shortest bulk that [`crate::CommandParser::parse_large`] hands to its
/// caller instead of waiting for it in the receive buffer, in bytes: one
/// more than the 1 MiB a value inline in the engine's pool holds (the
/// engine keeps longer values as separate large objects, so the buffer the
/// bulk is read into becomes the stored value).
pub const RESP_LARGE_BULK_BYTES_MIN: usize = (1 << 20) + 1;

/// Most arguments in one command: as many as the smallest arguments
/// (`$0\r\n\r\n`, [`RESP_BULK_WIRE_BYTES_MIN`] bytes) that fit in
/// [`RESP_COMMAND_BYTES_MAX`]. It is not a bound of its own: the byte
/// bound is the per-command cap (Redis takes up to 2^31 arguments, so an
/// MSET of 10,001 pairs or an MGET of 100,000 keys must fit), and a
/// larger `*N` is refused as too big a command as soon as it is read.
pub const RESP_ARGS_MAX: usize = RESP_COMMAND_BYTES_MAX / RESP_BULK_WIRE_BYTES_MIN;

/// Arguments whose spans a parser keeps room for between commands: a
/// command with more grows the span buffer (8 bytes an argument, so at
/// most `RESP_ARGS_MAX * 8` bytes, 4/3 of [`RESP_COMMAND_BYTES_MAX`]) and
/// the parser gives the excess back before it parses the next command.
/// Ordinary commands, far below this, parse without allocating.
pub const RESP_ARGS_KEPT: usize = 1 + 2 * 1024;

/// Longest inline command line, in bytes, not counting its line ending
/// (Redis's `PROTO_INLINE_MAX_SIZE`).
pub const RESP_INLINE_BYTES_MAX: usize = 64 * 1024;

/// Most bytes one command may take in the receive buffer, headers
/// included (a large bulk received into a buffer of its own does not
/// count). The per-argument and per-count bounds alone would allow far
/// more; this is what keeps a connection's receive buffer small.
pub const RESP_COMMAND_BYTES_MAX: usize = 8 << 20;

/// Most characters (sign and digits) in the number of a `*N` or `$N`
/// header. Twenty holds every `i64`; a longer number is refused at once
/// instead of being waited for.
pub const RESP_LENGTH_DIGITS_MAX: usize = 20;

/// Fewest bytes a multibulk argument can take on the wire (`$0\r\n\r\n`).
/// The `need` hint counts this for every argument not yet seen.
pub const RESP_BULK_WIRE_BYTES_MIN: usize = 6;

/// Most arguments in one command from a connection that has not yet
/// authenticated when a password is required (Redis's bound, so AUTH,
/// HELLO with AUTH and SETNAME, and QUIT fit): a larger `*N` is refused
/// as soon as its header is read.
pub const RESP_UNAUTH_ARGS_MAX: usize = 10;

/// Largest bulk argument from a connection that has not yet authenticated
/// when a password is required, in bytes (Redis's bound).
pub const RESP_UNAUTH_BULK_BYTES_MAX: usize = 16 * 1024;

const _: () = assert!(RESP_LARGE_BULK_BYTES_MIN < RESP_COMMAND_BYTES_MAX);
const _: () = assert!(RESP_UNAUTH_ARGS_MAX <= RESP_ARGS_KEPT && RESP_ARGS_KEPT <= RESP_ARGS_MAX);
const _: () = assert!(
    RESP_INLINE_BYTES_MAX / 2 < RESP_ARGS_MAX,
    "an inline line cannot hold more arguments than a multibulk command"
);
const _: () = assert!(RESP_LARGE_BULK_BYTES_MIN <= RESP_BULK_BYTES_MAX);
