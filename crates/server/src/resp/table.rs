//! The command table: every command the front-end answers, with its
//! name and arity as Redis counts them and the metadata COMMAND reports,
//! and the lookup by name.

use fabrickv_resp::lowercase;

use super::COMMANDS;

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
    Hello,
    Time,
    Save,
    Bgsave,
    Lastsave,
    Cluster,
    Readonly,
    Readwrite,
    Asking,
}

/// A command's name and arity as Redis counts it (the name included;
/// negative: at least that many), and what COMMAND INFO and COMMAND DOCS
/// report about it, with Redis 7's values.
#[derive(Clone, Copy)]
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
    /// Redis 7's command tips (COMMAND INFO's eighth field): how a
    /// cluster client routes the command and whether its output is
    /// deterministic.
    pub(super) tips: &'static [&'static str],
}

/// A Redis 7 key specification of the one shape FabricKV's commands use:
/// keys found from an index (`begin_search` of type `index`) over a range
/// (`find_keys` of type `range`).
#[derive(Clone, Copy)]
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

/// One command's [`Spec`] as a row of its file's table, in this order:
/// name, handler, arity, flags, (first key, last key, step), ACL
/// categories, key specs, group, since, complexity, summary, tips. Each
/// command file lists its own commands this way beside their handlers, so
/// that a command's metadata is read in one line.
macro_rules! spec {
    ($name:literal $id:ident $arity:literal [$($flag:literal),*]
     ($first:literal, $last:literal, $step:literal) [$($acl:literal),*] $key_specs:ident
     $group:literal $since:literal $complexity:literal $summary:literal [$($tip:literal),*]) => {
        $crate::resp::table::Spec {
            name: $name,
            id: $crate::resp::table::Cmd::$id,
            arity: $arity,
            flags: &[$($flag),*],
            first_key: $first,
            last_key: $last,
            step: $step,
            acl: &[$($acl),*],
            key_specs: $key_specs,
            group: $group,
            since: $since,
            summary: $summary,
            complexity: $complexity,
            tips: &[$($tip),*],
        }
    };
}
pub(super) use spec;

/// No keys.
pub(super) const NO_KEYS: &[KeySpec] = &[];

/// One key at argument 1, read.
pub(super) const KEY_RO: &[KeySpec] = &[KeySpec {
    flags: &["RO", "access"],
    index: 1,
    lastkey: 0,
    keystep: 1,
    limit: 0,
}];

/// One key at argument 1, read and written (INCR, EXPIRE).
pub(super) const KEY_RW_UPDATE: &[KeySpec] = &[KeySpec {
    flags: &["RW", "access", "update"],
    index: 1,
    lastkey: 0,
    keystep: 1,
    limit: 0,
}];

/// SET's key: read (for GET) and written.
pub(super) const KEY_SET: &[KeySpec] = &[KeySpec {
    flags: &["RW", "access", "update", "variable_flags"],
    index: 1,
    lastkey: 0,
    keystep: 1,
    limit: 0,
}];

/// Every argument from 1 a key, read.
pub(super) const KEYS_RO: &[KeySpec] = &[KeySpec {
    flags: &["RO", "access"],
    index: 1,
    lastkey: -1,
    keystep: 1,
    limit: 0,
}];

/// Every argument from 1 a key, removed.
pub(super) const KEYS_RM: &[KeySpec] = &[KeySpec {
    flags: &["RM", "delete"],
    index: 1,
    lastkey: -1,
    keystep: 1,
    limit: 0,
}];

/// Key-value pairs from argument 1, keys overwritten.
pub(super) const PAIRS_OW: &[KeySpec] = &[KeySpec {
    flags: &["OW", "update"],
    index: 1,
    lastkey: -1,
    keystep: 2,
    limit: 0,
}];

/// One key at argument 1, overwritten (SETEX, PSETEX).
pub(super) const KEY_OW_UPDATE: &[KeySpec] = &[KeySpec {
    flags: &["OW", "update"],
    index: 1,
    lastkey: 0,
    keystep: 1,
    limit: 0,
}];

/// One key at argument 1, written only when absent (SETNX).
pub(super) const KEY_OW_INSERT: &[KeySpec] = &[KeySpec {
    flags: &["OW", "insert"],
    index: 1,
    lastkey: 0,
    keystep: 1,
    limit: 0,
}];

/// One key at argument 1, read and written in place (APPEND).
pub(super) const KEY_RW_INSERT: &[KeySpec] = &[KeySpec {
    flags: &["RW", "insert"],
    index: 1,
    lastkey: 0,
    keystep: 1,
    limit: 0,
}];

/// One key at argument 1, written (SETRANGE).
pub(super) const KEY_RW_UPDATE_ONLY: &[KeySpec] = &[KeySpec {
    flags: &["RW", "update"],
    index: 1,
    lastkey: 0,
    keystep: 1,
    limit: 0,
}];

/// One key at argument 1, read and removed (GETDEL).
pub(super) const KEY_RW_DELETE: &[KeySpec] = &[KeySpec {
    flags: &["RW", "access", "delete"],
    index: 1,
    lastkey: 0,
    keystep: 1,
    limit: 0,
}];

/// Two keys at arguments 1 and 2, read (LCS).
pub(super) const TWO_KEYS_RO: &[KeySpec] = &[KeySpec {
    flags: &["RO", "access"],
    index: 1,
    lastkey: 1,
    keystep: 1,
    limit: 0,
}];

/// Key-value pairs from argument 1, written only when all are absent.
pub(super) const PAIRS_OW_INSERT: &[KeySpec] = &[KeySpec {
    flags: &["OW", "insert"],
    index: 1,
    lastkey: -1,
    keystep: 2,
    limit: 0,
}];

/// A source key moved away and a destination written (RENAME).
pub(super) const MOVE_KEYS: &[KeySpec] = &[
    KeySpec {
        flags: &["RW", "access", "delete"],
        index: 1,
        lastkey: 0,
        keystep: 1,
        limit: 0,
    },
    KeySpec {
        flags: &["OW", "update"],
        index: 2,
        lastkey: 0,
        keystep: 1,
        limit: 0,
    },
];

/// A source key moved away and a destination written if absent (RENAMENX).
pub(super) const MOVE_KEYS_NX: &[KeySpec] = &[
    KeySpec {
        flags: &["RW", "access", "delete"],
        index: 1,
        lastkey: 0,
        keystep: 1,
        limit: 0,
    },
    KeySpec {
        flags: &["OW", "insert"],
        index: 2,
        lastkey: 0,
        keystep: 1,
        limit: 0,
    },
];

/// A source key read and a destination written (COPY).
pub(super) const COPY_KEYS: &[KeySpec] = &[
    KeySpec {
        flags: &["RO", "access"],
        index: 1,
        lastkey: 0,
        keystep: 1,
        limit: 0,
    },
    KeySpec {
        flags: &["OW", "update"],
        index: 2,
        lastkey: 0,
        keystep: 1,
        limit: 0,
    },
];

/// Commands in the table at most: per-command counters are indexed by a
/// command's place in it, and a connection marks the ones it counted in a
/// 128-bit mask. Room for the commands to come, not for many: each
/// connection keeps this many counters.
pub(super) const COMMANDS_MAX: usize = 96;

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
