//! What the parser returns: a [`Parse`] outcome, the [`Command`] it
//! found, and the meta commands' [`Meta`] and [`MetaFlags`].

/// What [`parse`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Parse<'a> {
    /// No complete command yet: at least this many bytes (in all, from the
    /// start of the input) are needed.
    Incomplete {
        /// Total bytes needed before parsing again.
        need: usize,
    },
    /// A complete command, or a refusal, taking `consumed` bytes.
    Complete {
        /// Bytes of the input this command took.
        consumed: usize,
        /// The command.
        cmd: Command<'a>,
    },
}

/// How a storage command combines with what is stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoreMode {
    /// `set`: always.
    Set,
    /// `add`: only if absent.
    Add,
    /// `replace`: only if present.
    Replace,
    /// `append`: after the stored value, if present.
    Append,
    /// `prepend`: before the stored value, if present.
    Prepend,
    /// `cas`: only if the stored CAS value is the one given.
    Cas,
}

/// A refused command: the reply, and what to do after it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Refusal {
    /// The reply line, without CRLF.
    pub reply: &'static str,
    /// Bytes that follow the consumed ones and must be discarded unread
    /// (the data of a storage command refused for its size).
    pub swallow: usize,
    /// The reply is not sent (`noreply`, or a close without a reply).
    pub noreply: bool,
    /// The stream cannot be trusted any more: close once replied.
    pub close: bool,
    /// The refused line goes on past the bytes consumed (a retrieval line
    /// longer than [`MC_KEYS_LINE_BYTES_MAX`]): discard through its newline.
    pub skip_line: bool,
}

/// One command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command<'a> {
    /// `get`/`gets` (`cas`) of the space-separated `keys`.
    Get {
        /// The keys, space-separated (see [`keys`]); each at most
        /// [`MC_KEY_BYTES_MAX`] bytes.
        keys: &'a [u8],
        /// `gets`: with CAS values.
        cas: bool,
        /// The line goes on past these keys: read the rest with
        /// [`keys_piece`] (a line over [`MC_KEYS_LINE_BYTES_MAX`]).
        more: bool,
    },
    /// `gat`/`gats`: get and touch.
    Gat {
        /// The new expiry time.
        exptime: i64,
        /// The keys, space-separated (see [`keys`]); may be none.
        keys: &'a [u8],
        /// `gats`: with CAS values.
        cas: bool,
        /// The line goes on past these keys (see [`Command::Get`]).
        more: bool,
    },
    /// `set`, `add`, `replace`, `append`, `prepend`, `cas`.
    Store(Storage<'a>),
    /// `delete`.
    Delete {
        /// The key.
        key: &'a [u8],
        /// No reply.
        noreply: bool,
    },
    /// `incr` (`incr` true) or `decr`.
    Arith {
        /// incr or decr.
        incr: bool,
        /// The key.
        key: &'a [u8],
        /// The amount.
        delta: u64,
        /// No reply.
        noreply: bool,
    },
    /// `touch`.
    Touch {
        /// The key.
        key: &'a [u8],
        /// The new expiry time.
        exptime: i64,
        /// No reply.
        noreply: bool,
    },
    /// `flush_all [delay]`.
    FlushAll {
        /// Seconds (or a unix time) before the flush takes effect.
        delay: i64,
        /// No reply.
        noreply: bool,
    },
    /// `version`.
    Version,
    /// `verbosity`.
    Verbosity {
        /// No reply.
        noreply: bool,
    },
    /// `stats [group]`.
    Stats {
        /// The group asked for, if any.
        group: Option<&'a [u8]>,
    },
    /// `quit`.
    Quit,
    /// A meta command.
    Meta(Meta<'a>),
    /// `mn`.
    MetaNoop,
    /// A storage command (`set`, ..., `ms`) whose data is over
    /// [`MC_VALUE_BYTES_MAX`]: answered [`TOO_LARGE`] and its data
    /// swallowed. memcached also removes the key's old value when the
    /// command is `set` or `ms` (so a failed write never leaves a stale
    /// value readable).
    TooLarge {
        /// The key as sent (base64 when `base64`).
        key: &'a [u8],
        /// The key is base64 (`ms ... b`).
        base64: bool,
        /// Remove the key's old value (`set`, `ms`).
        unlink: bool,
        /// Bytes that follow, to discard unread: the data and its CRLF.
        swallow: usize,
        /// No reply (`noreply`).
        noreply: bool,
    },
    /// A refused line.
    Refused(Refusal),
}

/// A storage command (`set`, `add`, `replace`, `append`, `prepend`,
/// `cas`): what [`Command::Store`] carries, taken whole by the server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Storage<'a> {
    /// How it combines.
    pub mode: StoreMode,
    /// The key.
    pub key: &'a [u8],
    /// The client flags.
    pub flags: u32,
    /// The expiry time as given.
    pub exptime: i64,
    /// The value.
    pub data: &'a [u8],
    /// `cas`: the CAS value to compare.
    pub cas_unique: u64,
    /// No reply.
    pub noreply: bool,
}

/// Which meta command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MetaKind {
    /// `mg`.
    Get,
    /// `ms`.
    Set,
    /// `md`.
    Delete,
    /// `ma`.
    Arith,
}

/// A meta command: its key, its flags (parsed and, for echoing in order,
/// raw), and an `ms`'s data.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Meta<'a> {
    /// Which command.
    pub kind: MetaKind,
    /// The key as sent (base64 when `flags.base64`).
    pub key: &'a [u8],
    /// The flags.
    pub flags: MetaFlags<'a>,
    /// `ms`: the value.
    pub data: &'a [u8],
}

/// The flags of a meta command, parsed. Return flags are echoed in the
/// order of `raw`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct MetaFlags<'a> {
    /// The flag tokens as sent, space-separated.
    pub raw: &'a [u8],
    /// `b`: the key is base64.
    pub base64: bool,
    /// `q`: quiet.
    pub quiet: bool,
    /// `v`: return the value.
    pub value: bool,
    /// `O`: opaque token to echo.
    pub opaque: Option<&'a [u8]>,
    /// `T`: new TTL (seconds as in exptime).
    pub ttl: Option<i64>,
    /// `F`: client flags to store.
    pub client_flags: Option<u32>,
    /// `C`: CAS value to compare.
    pub compare_cas: Option<u64>,
    /// `E`: the CAS value to give the item written (`ms`, `ma`).
    pub new_cas: Option<u64>,
    /// `M`: mode character.
    pub mode: Option<u8>,
    /// `N`: vivify on miss with this TTL (`ma`).
    pub vivify: Option<i64>,
    /// `J`: initial value for a vivified `ma`.
    pub initial: Option<u64>,
    /// `D`: `ma` delta.
    pub delta: Option<u64>,
}
