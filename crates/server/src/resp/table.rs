//! The command table: every command the front-end answers, with its
//! name and arity as Redis counts them and the metadata COMMAND reports,
//! and the lookup by name.

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
    Hello,
}

/// A command's name and arity as Redis counts it (the name included;
/// negative: at least that many), and what COMMAND INFO and COMMAND DOCS
/// report about it, with Redis 7's values.
pub(super) struct Spec {
    /// The lowercase name clients send.
    pub(super) name: &'static str,
    /// What runs it.
    pub(super) id: Cmd,
    /// Arguments counted with the name; negative: at least that many.
    pub(super) arity: i32,
    /// Command flags (`write`, `readonly`, `fast`, `denyoom`, ...).
    pub(super) flags: &'static [&'static str],
    /// Position of the first key (0: no keys).
    pub(super) first_key: i32,
    /// Position of the last key; negative counts from the end (-1: the
    /// last argument).
    pub(super) last_key: i32,
    /// Distance between keys (2 for MSET's key-value pairs).
    pub(super) step: i32,
    /// ACL categories, with their `@`.
    pub(super) acl: &'static [&'static str],
    /// Redis 7 key specifications.
    pub(super) key_specs: &'static [KeySpec],
    /// COMMAND DOCS: the command's group, the Redis version that added it,
    /// a one-line summary and its time complexity.
    pub(super) group: &'static str,
    pub(super) since: &'static str,
    pub(super) summary: &'static str,
    pub(super) complexity: &'static str,
}

/// A Redis 7 key specification of the one shape FabricKV's commands use:
/// keys found from an index (`begin_search` of type `index`) over a range
/// (`find_keys` of type `range`).
pub(super) struct KeySpec {
    /// Key-spec flags (`RO`, `RW`, `OW`, `RM`, `access`, `update`, ...).
    pub(super) flags: &'static [&'static str],
    /// `begin_search` index: the argument of the first key.
    pub(super) index: i32,
    /// `find_keys` range: the last key, relative to the first (negative:
    /// from the end), the step between keys, and the limit (0: none).
    pub(super) lastkey: i32,
    pub(super) keystep: i32,
    pub(super) limit: i32,
}

/// No keys.
const NO_KEYS: &[KeySpec] = &[];

/// One key at argument 1, read.
const KEY_RO: &[KeySpec] = &[KeySpec {
    flags: &["RO", "access"],
    index: 1,
    lastkey: 0,
    keystep: 1,
    limit: 0,
}];

/// One key at argument 1, read and written (INCR, EXPIRE).
const KEY_RW_UPDATE: &[KeySpec] = &[KeySpec {
    flags: &["RW", "access", "update"],
    index: 1,
    lastkey: 0,
    keystep: 1,
    limit: 0,
}];

/// SET's key: read (for GET) and written.
const KEY_SET: &[KeySpec] = &[KeySpec {
    flags: &["RW", "access", "update", "variable_flags"],
    index: 1,
    lastkey: 0,
    keystep: 1,
    limit: 0,
}];

/// Every argument from 1 a key, read.
const KEYS_RO: &[KeySpec] = &[KeySpec {
    flags: &["RO", "access"],
    index: 1,
    lastkey: -1,
    keystep: 1,
    limit: 0,
}];

/// Every argument from 1 a key, removed.
const KEYS_RM: &[KeySpec] = &[KeySpec {
    flags: &["RM", "delete"],
    index: 1,
    lastkey: -1,
    keystep: 1,
    limit: 0,
}];

/// Key-value pairs from argument 1, keys overwritten.
const PAIRS_OW: &[KeySpec] = &[KeySpec {
    flags: &["OW", "update"],
    index: 1,
    lastkey: -1,
    keystep: 2,
    limit: 0,
}];

/// Every command the front-end answers, in the order COMMAND COUNT counts them.
pub(super) const COMMANDS: &[Spec] = &[
    Spec {
        name: "get",
        id: Cmd::Get,
        arity: 2,
        flags: &["readonly", "fast"],
        first_key: 1,
        last_key: 1,
        step: 1,
        acl: &["@read", "@string", "@fast"],
        key_specs: KEY_RO,
        group: "string",
        since: "1.0.0",
        summary: "Returns the string value of a key.",
        complexity: "O(1)",
    },
    Spec {
        name: "set",
        id: Cmd::Set,
        arity: -3,
        flags: &["write", "denyoom"],
        first_key: 1,
        last_key: 1,
        step: 1,
        acl: &["@write", "@string", "@slow"],
        key_specs: KEY_SET,
        group: "string",
        since: "1.0.0",
        summary: "Sets the string value of a key, ignoring its type. The key is created if it doesn't exist.",
        complexity: "O(1)",
    },
    Spec {
        name: "mget",
        id: Cmd::Mget,
        arity: -2,
        flags: &["readonly", "fast"],
        first_key: 1,
        last_key: -1,
        step: 1,
        acl: &["@read", "@string", "@fast"],
        key_specs: KEYS_RO,
        group: "string",
        since: "1.0.0",
        summary: "Atomically returns the string values of one or more keys.",
        complexity: "O(N) where N is the number of keys to retrieve.",
    },
    Spec {
        name: "mset",
        id: Cmd::Mset,
        arity: -3,
        flags: &["write", "denyoom"],
        first_key: 1,
        last_key: -1,
        step: 2,
        acl: &["@write", "@string", "@slow"],
        key_specs: PAIRS_OW,
        group: "string",
        since: "1.0.1",
        summary: "Atomically creates or modifies the string values of one or more keys.",
        complexity: "O(N) where N is the number of keys to set.",
    },
    Spec {
        name: "del",
        id: Cmd::Del,
        arity: -2,
        flags: &["write"],
        first_key: 1,
        last_key: -1,
        step: 1,
        acl: &["@keyspace", "@write", "@slow"],
        key_specs: KEYS_RM,
        group: "generic",
        since: "1.0.0",
        summary: "Deletes one or more keys.",
        complexity: "O(N) where N is the number of keys that will be removed.",
    },
    Spec {
        name: "exists",
        id: Cmd::Exists,
        arity: -2,
        flags: &["readonly", "fast"],
        first_key: 1,
        last_key: -1,
        step: 1,
        acl: &["@keyspace", "@read", "@fast"],
        key_specs: KEYS_RO,
        group: "generic",
        since: "1.0.0",
        summary: "Determines whether one or more keys exist.",
        complexity: "O(N) where N is the number of keys to check.",
    },
    Spec {
        name: "expire",
        id: Cmd::Expire,
        arity: -3,
        flags: &["write", "fast"],
        first_key: 1,
        last_key: 1,
        step: 1,
        acl: &["@keyspace", "@write", "@fast"],
        key_specs: KEY_RW_UPDATE,
        group: "generic",
        since: "1.0.0",
        summary: "Sets the expiration time of a key in seconds.",
        complexity: "O(1)",
    },
    Spec {
        name: "pexpire",
        id: Cmd::Pexpire,
        arity: -3,
        flags: &["write", "fast"],
        first_key: 1,
        last_key: 1,
        step: 1,
        acl: &["@keyspace", "@write", "@fast"],
        key_specs: KEY_RW_UPDATE,
        group: "generic",
        since: "2.6.0",
        summary: "Sets the expiration time of a key in milliseconds.",
        complexity: "O(1)",
    },
    Spec {
        name: "persist",
        id: Cmd::Persist,
        arity: 2,
        flags: &["write", "fast"],
        first_key: 1,
        last_key: 1,
        step: 1,
        acl: &["@keyspace", "@write", "@fast"],
        key_specs: KEY_RW_UPDATE,
        group: "generic",
        since: "2.2.0",
        summary: "Removes the expiration time of a key.",
        complexity: "O(1)",
    },
    Spec {
        name: "ttl",
        id: Cmd::Ttl,
        arity: 2,
        flags: &["readonly", "fast"],
        first_key: 1,
        last_key: 1,
        step: 1,
        acl: &["@keyspace", "@read", "@fast"],
        key_specs: KEY_RO,
        group: "generic",
        since: "1.0.0",
        summary: "Returns the expiration time in seconds of a key.",
        complexity: "O(1)",
    },
    Spec {
        name: "pttl",
        id: Cmd::Pttl,
        arity: 2,
        flags: &["readonly", "fast"],
        first_key: 1,
        last_key: 1,
        step: 1,
        acl: &["@keyspace", "@read", "@fast"],
        key_specs: KEY_RO,
        group: "generic",
        since: "2.6.0",
        summary: "Returns the expiration time in milliseconds of a key.",
        complexity: "O(1)",
    },
    Spec {
        name: "incr",
        id: Cmd::Incr,
        arity: 2,
        flags: &["write", "denyoom", "fast"],
        first_key: 1,
        last_key: 1,
        step: 1,
        acl: &["@write", "@string", "@fast"],
        key_specs: KEY_RW_UPDATE,
        group: "string",
        since: "1.0.0",
        summary: "Increments the integer value of a key by one. Uses 0 as initial value if the key doesn't exist.",
        complexity: "O(1)",
    },
    Spec {
        name: "decr",
        id: Cmd::Decr,
        arity: 2,
        flags: &["write", "denyoom", "fast"],
        first_key: 1,
        last_key: 1,
        step: 1,
        acl: &["@write", "@string", "@fast"],
        key_specs: KEY_RW_UPDATE,
        group: "string",
        since: "1.0.0",
        summary: "Decrements the integer value of a key by one. Uses 0 as initial value if the key doesn't exist.",
        complexity: "O(1)",
    },
    Spec {
        name: "incrby",
        id: Cmd::Incrby,
        arity: 3,
        flags: &["write", "denyoom", "fast"],
        first_key: 1,
        last_key: 1,
        step: 1,
        acl: &["@write", "@string", "@fast"],
        key_specs: KEY_RW_UPDATE,
        group: "string",
        since: "1.0.0",
        summary: "Increments the integer value of a key by a number. Uses 0 as initial value if the key doesn't exist.",
        complexity: "O(1)",
    },
    Spec {
        name: "decrby",
        id: Cmd::Decrby,
        arity: 3,
        flags: &["write", "denyoom", "fast"],
        first_key: 1,
        last_key: 1,
        step: 1,
        acl: &["@write", "@string", "@fast"],
        key_specs: KEY_RW_UPDATE,
        group: "string",
        since: "1.0.0",
        summary: "Decrements a number from the integer value of a key. Uses 0 as initial value if the key doesn't exist.",
        complexity: "O(1)",
    },
    Spec {
        name: "strlen",
        id: Cmd::Strlen,
        arity: 2,
        flags: &["readonly", "fast"],
        first_key: 1,
        last_key: 1,
        step: 1,
        acl: &["@read", "@string", "@fast"],
        key_specs: KEY_RO,
        group: "string",
        since: "2.2.0",
        summary: "Returns the length of a string value.",
        complexity: "O(1)",
    },
    Spec {
        name: "ping",
        id: Cmd::Ping,
        arity: -1,
        flags: &["fast", "sentinel"],
        first_key: 0,
        last_key: 0,
        step: 0,
        acl: &["@fast", "@connection"],
        key_specs: NO_KEYS,
        group: "connection",
        since: "1.0.0",
        summary: "Returns the server's liveliness response.",
        complexity: "O(1)",
    },
    Spec {
        name: "echo",
        id: Cmd::Echo,
        arity: 2,
        flags: &["fast"],
        first_key: 0,
        last_key: 0,
        step: 0,
        acl: &["@fast", "@connection"],
        key_specs: NO_KEYS,
        group: "connection",
        since: "1.0.0",
        summary: "Returns the given string.",
        complexity: "O(1)",
    },
    Spec {
        name: "auth",
        id: Cmd::Auth,
        arity: -2,
        flags: &["noscript", "loading", "stale", "fast", "no_auth", "sentinel", "allow_busy"],
        first_key: 0,
        last_key: 0,
        step: 0,
        acl: &["@fast", "@connection"],
        key_specs: NO_KEYS,
        group: "connection",
        since: "1.0.0",
        summary: "Authenticates the connection.",
        complexity: "O(N) where N is the number of passwords defined for the user",
    },
    Spec {
        name: "select",
        id: Cmd::Select,
        arity: 2,
        flags: &["loading", "stale", "fast"],
        first_key: 0,
        last_key: 0,
        step: 0,
        acl: &["@fast", "@connection"],
        key_specs: NO_KEYS,
        group: "connection",
        since: "1.0.0",
        summary: "Changes the selected database.",
        complexity: "O(1)",
    },
    Spec {
        name: "dbsize",
        id: Cmd::Dbsize,
        arity: 1,
        flags: &["readonly", "fast"],
        first_key: 0,
        last_key: 0,
        step: 0,
        acl: &["@keyspace", "@read", "@fast"],
        key_specs: NO_KEYS,
        group: "server",
        since: "1.0.0",
        summary: "Returns the number of keys in the database.",
        complexity: "O(1)",
    },
    Spec {
        name: "info",
        id: Cmd::Info,
        arity: -1,
        flags: &["loading", "stale", "sentinel"],
        first_key: 0,
        last_key: 0,
        step: 0,
        acl: &["@slow", "@dangerous"],
        key_specs: NO_KEYS,
        group: "server",
        since: "1.0.0",
        summary: "Returns information and statistics about the server.",
        complexity: "O(1)",
    },
    Spec {
        name: "config",
        id: Cmd::Config,
        arity: -2,
        flags: &[],
        first_key: 0,
        last_key: 0,
        step: 0,
        acl: &["@slow"],
        key_specs: NO_KEYS,
        group: "server",
        since: "2.0.0",
        summary: "A container for server configuration commands.",
        complexity: "Depends on subcommand.",
    },
    Spec {
        name: "command",
        id: Cmd::Command,
        arity: -1,
        flags: &["loading", "stale", "sentinel"],
        first_key: 0,
        last_key: 0,
        step: 0,
        acl: &["@slow", "@connection"],
        key_specs: NO_KEYS,
        group: "server",
        since: "2.8.13",
        summary: "Returns detailed information about all commands.",
        complexity: "O(N) where N is the total number of Redis commands",
    },
    Spec {
        name: "client",
        id: Cmd::Client,
        arity: -2,
        flags: &["sentinel"],
        first_key: 0,
        last_key: 0,
        step: 0,
        acl: &["@slow"],
        key_specs: NO_KEYS,
        group: "connection",
        since: "2.4.0",
        summary: "A container for client connection commands.",
        complexity: "Depends on subcommand.",
    },
    Spec {
        name: "quit",
        id: Cmd::Quit,
        arity: -1,
        flags: &["allow_busy", "noscript", "loading", "stale", "fast", "no_auth"],
        first_key: 0,
        last_key: 0,
        step: 0,
        acl: &["@fast", "@connection"],
        key_specs: NO_KEYS,
        group: "connection",
        since: "1.0.0",
        summary: "Closes the connection.",
        complexity: "O(1)",
    },
    Spec {
        name: "hello",
        id: Cmd::Hello,
        arity: -1,
        flags: &["noscript", "loading", "stale", "fast", "no_auth", "sentinel", "allow_busy"],
        first_key: 0,
        last_key: 0,
        step: 0,
        acl: &["@fast", "@connection"],
        key_specs: NO_KEYS,
        group: "connection",
        since: "6.0.0",
        summary: "Handshakes with the Redis server.",
        complexity: "O(1)",
    },
];

/// Commands in the table at most: per-command counters are indexed by a
/// command's place in it.
pub(super) const COMMANDS_MAX: usize = 64;

const _: () = assert!(COMMANDS.len() <= COMMANDS_MAX);

pub(super) fn lookup(name: &[u8]) -> Option<&'static Spec> {
    lookup_index(name).and_then(|i| COMMANDS.get(i))
}

/// The place in [`COMMANDS`] of the command called `name`.
pub(super) fn lookup_index(name: &[u8]) -> Option<usize> {
    // The two hot commands first; the rest are rare enough for a scan.
    match name {
        b"get" => Some(0),
        b"set" => Some(1),
        _ => COMMANDS.iter().position(|s| s.name.as_bytes() == name),
    }
}

/// The places of the keys in a call of `spec` with `argc` arguments (the
/// name counted), from its first, last and step; empty for a command
/// without keys. Only valid for an `argc` the arity allows.
pub(super) fn key_positions(spec: &Spec, argc: usize) -> Vec<usize> {
    if spec.first_key <= 0 || spec.step <= 0 {
        return Vec::new();
    }
    let last = if spec.last_key < 0 {
        argc as i64 + i64::from(spec.last_key)
    } else {
        i64::from(spec.last_key)
    };
    let (first, step) = (spec.first_key as usize, spec.step as usize);
    let Ok(last) = usize::try_from(last) else {
        return Vec::new();
    };
    (first..=last.min(argc.saturating_sub(1)))
        .step_by(step)
        .collect()
}

/// `s` lowercased into `buf`, or empty when too long to be a name we know.
pub(super) fn lower<'b>(s: &[u8], buf: &'b mut [u8; COMMAND_NAME_BYTES_MAX]) -> &'b [u8] {
    lowercase(s, buf).unwrap_or(b"")
}
