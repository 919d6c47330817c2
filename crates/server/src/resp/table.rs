//! The command table: every command the front-end answers, with its
//! name and arity as Redis counts them, and the lookup by name.

use fabrickv_resp::lowercase;

/// Longest command name looked up, in bytes; longer names are unknown.
pub(super) const COMMAND_NAME_BYTES_MAX: usize = 16;

/// The commands, one variant each.
#[derive(Debug, Clone, Copy)]
pub(super) enum Cmd {
    Get,
    Set,
    Mget,
    Mset,
    Del,
    Exists,
    Expire,
    Pexpire,
    Persist,
    Ttl,
    Pttl,
    Incr,
    Decr,
    Incrby,
    Decrby,
    Strlen,
    Ping,
    Echo,
    Auth,
    Select,
    Dbsize,
    Info,
    Config,
    Command,
    Client,
    Quit,
    Flushdb,
    Flushall,
    Setex,
    Psetex,
    Setnx,
    Msetnx,
    Getex,
    Getdel,
    Getset,
    Append,
    Getrange,
    Substr,
    Setrange,
    Incrbyfloat,
    Lcs,
    Expireat,
    Pexpireat,
    Expiretime,
    Pexpiretime,
    Touch,
    Unlink,
    Type,
    Rename,
    Renamenx,
    Copy,
    Keys,
    Scan,
    Randomkey,
    Multi,
    Exec,
    Discard,
    Watch,
    Unwatch,
}

/// A command's name and arity as Redis counts it (the name included;
/// negative: at least that many).
pub(super) struct Spec {
    /// The lowercase name clients send.
    pub(super) name: &'static str,
    /// What runs it.
    pub(super) id: Cmd,
    /// Arguments counted with the name; negative: at least that many.
    pub(super) arity: i32,
}

/// Every command the front-end answers, in the order COMMAND COUNT counts them.
pub(super) const COMMANDS: &[Spec] = &[
    Spec {
        name: "get",
        id: Cmd::Get,
        arity: 2,
    },
    Spec {
        name: "set",
        id: Cmd::Set,
        arity: -3,
    },
    Spec {
        name: "mget",
        id: Cmd::Mget,
        arity: -2,
    },
    Spec {
        name: "mset",
        id: Cmd::Mset,
        arity: -3,
    },
    Spec {
        name: "del",
        id: Cmd::Del,
        arity: -2,
    },
    Spec {
        name: "exists",
        id: Cmd::Exists,
        arity: -2,
    },
    Spec {
        name: "expire",
        id: Cmd::Expire,
        arity: -3,
    },
    Spec {
        name: "pexpire",
        id: Cmd::Pexpire,
        arity: -3,
    },
    Spec {
        name: "persist",
        id: Cmd::Persist,
        arity: 2,
    },
    Spec {
        name: "ttl",
        id: Cmd::Ttl,
        arity: 2,
    },
    Spec {
        name: "pttl",
        id: Cmd::Pttl,
        arity: 2,
    },
    Spec {
        name: "incr",
        id: Cmd::Incr,
        arity: 2,
    },
    Spec {
        name: "decr",
        id: Cmd::Decr,
        arity: 2,
    },
    Spec {
        name: "incrby",
        id: Cmd::Incrby,
        arity: 3,
    },
    Spec {
        name: "decrby",
        id: Cmd::Decrby,
        arity: 3,
    },
    Spec {
        name: "strlen",
        id: Cmd::Strlen,
        arity: 2,
    },
    Spec {
        name: "ping",
        id: Cmd::Ping,
        arity: -1,
    },
    Spec {
        name: "echo",
        id: Cmd::Echo,
        arity: 2,
    },
    Spec {
        name: "auth",
        id: Cmd::Auth,
        arity: -2,
    },
    Spec {
        name: "select",
        id: Cmd::Select,
        arity: 2,
    },
    Spec {
        name: "dbsize",
        id: Cmd::Dbsize,
        arity: 1,
    },
    Spec {
        name: "info",
        id: Cmd::Info,
        arity: -1,
    },
    Spec {
        name: "config",
        id: Cmd::Config,
        arity: -2,
    },
    Spec {
        name: "command",
        id: Cmd::Command,
        arity: -1,
    },
    Spec {
        name: "client",
        id: Cmd::Client,
        arity: -2,
    },
    Spec {
        name: "quit",
        id: Cmd::Quit,
        arity: -1,
    },
    Spec {
        name: "flushdb",
        id: Cmd::Flushdb,
        arity: -1,
    },
    Spec {
        name: "flushall",
        id: Cmd::Flushall,
        arity: -1,
    },
    Spec {
        name: "setex",
        id: Cmd::Setex,
        arity: 4,
    },
    Spec {
        name: "psetex",
        id: Cmd::Psetex,
        arity: 4,
    },
    Spec {
        name: "setnx",
        id: Cmd::Setnx,
        arity: 3,
    },
    Spec {
        name: "msetnx",
        id: Cmd::Msetnx,
        arity: -3,
    },
    Spec {
        name: "getex",
        id: Cmd::Getex,
        arity: -2,
    },
    Spec {
        name: "getdel",
        id: Cmd::Getdel,
        arity: 2,
    },
    Spec {
        name: "getset",
        id: Cmd::Getset,
        arity: 3,
    },
    Spec {
        name: "append",
        id: Cmd::Append,
        arity: 3,
    },
    Spec {
        name: "getrange",
        id: Cmd::Getrange,
        arity: 4,
    },
    Spec {
        name: "substr",
        id: Cmd::Substr,
        arity: 4,
    },
    Spec {
        name: "setrange",
        id: Cmd::Setrange,
        arity: 4,
    },
    Spec {
        name: "incrbyfloat",
        id: Cmd::Incrbyfloat,
        arity: 3,
    },
    Spec {
        name: "lcs",
        id: Cmd::Lcs,
        arity: -3,
    },
    Spec {
        name: "expireat",
        id: Cmd::Expireat,
        arity: -3,
    },
    Spec {
        name: "pexpireat",
        id: Cmd::Pexpireat,
        arity: -3,
    },
    Spec {
        name: "expiretime",
        id: Cmd::Expiretime,
        arity: 2,
    },
    Spec {
        name: "pexpiretime",
        id: Cmd::Pexpiretime,
        arity: 2,
    },
    Spec {
        name: "touch",
        id: Cmd::Touch,
        arity: -2,
    },
    Spec {
        name: "unlink",
        id: Cmd::Unlink,
        arity: -2,
    },
    Spec {
        name: "type",
        id: Cmd::Type,
        arity: 2,
    },
    Spec {
        name: "rename",
        id: Cmd::Rename,
        arity: 3,
    },
    Spec {
        name: "renamenx",
        id: Cmd::Renamenx,
        arity: 3,
    },
    Spec {
        name: "copy",
        id: Cmd::Copy,
        arity: -3,
    },
    Spec {
        name: "keys",
        id: Cmd::Keys,
        arity: 2,
    },
    Spec {
        name: "scan",
        id: Cmd::Scan,
        arity: -2,
    },
    Spec {
        name: "randomkey",
        id: Cmd::Randomkey,
        arity: 1,
    },
    Spec {
        name: "multi",
        id: Cmd::Multi,
        arity: 1,
    },
    Spec {
        name: "exec",
        id: Cmd::Exec,
        arity: 1,
    },
    Spec {
        name: "discard",
        id: Cmd::Discard,
        arity: 1,
    },
    Spec {
        name: "watch",
        id: Cmd::Watch,
        arity: -2,
    },
    Spec {
        name: "unwatch",
        id: Cmd::Unwatch,
        arity: 1,
    },
];

pub(super) fn lookup(name: &[u8]) -> Option<&'static Spec> {
    // The two hot commands first; the rest are rare enough for a scan.
    match name {
        b"get" => Some(&COMMANDS[0]),
        b"set" => Some(&COMMANDS[1]),
        _ => COMMANDS.iter().find(|s| s.name.as_bytes() == name),
    }
}

/// `s` lowercased into `buf`, or empty when too long to be a name we know.
pub(super) fn lower<'b>(s: &[u8], buf: &'b mut [u8; COMMAND_NAME_BYTES_MAX]) -> &'b [u8] {
    lowercase(s, buf).unwrap_or(b"")
}
