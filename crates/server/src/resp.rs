//! The Redis-compatible (RESP2) front-end's commands, sans-I/O.
//!
//! [`RespSession::process`] takes the bytes a connection has buffered and
//! the time, executes every complete command at their start against the
//! server's partitions, and appends the replies; the socket loop in
//! `resp_net` only moves bytes. Everything a client can send is bounded by
//! the parser's limits (`fabrickv_resp::limits`) and the constants here,
//! and every refusal is a RESP error whose first word is Redis's own code
//! (`ERR`, `NOAUTH`, `WRONGPASS`, `OOM`) so that clients react as they do
//! with Redis.
//!
//! A RESP client does not steer keys, so each command takes the lock of the
//! partition owning its key; a pipelined run of commands on one partition
//! keeps it for the run (see [`crate::partitions`]). Commands on one key
//! (SET NX/XX, INCR, EXPIRE) are atomic; MSET and DEL over several keys
//! are atomic per key, not across keys (unlike Redis).
//!
//! Database 0 (the default) is the in-memory kv; `SELECT n` for n in
//! 1..=shards makes the n-th persistent shard (`--shard`, in the order
//! given) the connection's database, where the data commands run against
//! the shard (see `shard_db`).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, MutexGuard};
use std::time::Instant;

use fabrickv_engine::{DeleteResult, GetResult, Partition, PutCond, PutResult};
use fabrickv_resp::reply as resp;
use fabrickv_resp::{lowercase, parse_i64, CommandParser, Parse};
use fabrickv_storage::{FjallShard, ShardBackend};
use fabrickv_types::limits::{KEY_BYTES_MAX, TTL_MS_MAX};
use fabrickv_types::KeyHash;

use crate::config::Mode;
use crate::partitions::Partitions;
use crate::shard::Shards;

mod shard_db;

/// Reply bytes a connection may have waiting before it stops executing
/// commands until the client reads them (backpressure), in bytes.
pub const RESP_OUTPUT_SOFT_BYTES: usize = 256 << 10;

/// Largest reply to one command, in bytes: an MGET whose values add up to
/// more is refused rather than buffered.
pub const RESP_REPLY_BYTES_MAX: usize = 32 << 20;

/// Commands (or MGET keys) looked ahead per prefetch round: their index
/// buckets, then their items, are asked of memory before the first of them
/// executes, so a pipeline's cache misses overlap (MICA's prefetch pass).
pub const RESP_PREFETCH_KEYS: usize = 32;

/// Longest command name looked up, in bytes; longer names are unknown.
const COMMAND_NAME_BYTES_MAX: usize = 16;

/// Longest argument quoted back in an "unknown command" error, in bytes.
const ERROR_ARG_QUOTE_BYTES_MAX: usize = 128;

/// Counters shared by every RESP connection of a server.
#[derive(Debug, Default)]
pub struct RespCounters {
    /// Connections accepted since start.
    pub connections_received: AtomicU64,
    /// Connections open now.
    pub connected: AtomicU64,
    /// Connections refused because too many were open.
    pub rejected: AtomicU64,
    /// Commands executed (including those answered with an error).
    pub commands: AtomicU64,
    /// Connections closed for a protocol error.
    pub protocol_errors: AtomicU64,
}

/// What every RESP connection of a server shares.
pub struct RespShared {
    parts: Arc<Partitions>,
    password: Option<Vec<u8>>,
    mode: Mode,
    pool_bytes: u64,
    port: u16,
    started: Instant,
    /// The persistent shards, database n at index n - 1.
    dbs: Vec<Arc<FjallShard>>,
    /// Counters reported by INFO.
    pub counters: RespCounters,
}

impl RespShared {
    /// State for a front-end over `parts`; `password` is Redis's `requirepass`.
    pub fn new(
        parts: Arc<Partitions>,
        password: Option<&str>,
        mode: Mode,
        pool_bytes: u64,
        port: u16,
    ) -> RespShared {
        RespShared {
            parts,
            password: password.map(|p| p.as_bytes().to_vec()),
            mode,
            pool_bytes,
            port,
            started: Instant::now(),
            dbs: Vec::new(),
            counters: RespCounters::default(),
        }
    }

    /// Serves `shards` as databases 1..=n, in the order they were given.
    pub fn with_shards(mut self, shards: &Shards) -> RespShared {
        self.dbs = shards
            .names()
            .iter()
            .filter_map(|n| shards.get(n).cloned())
            .collect();
        self
    }

    /// The shard that is database `db` (1-based).
    fn db(&self, db: usize) -> Option<&FjallShard> {
        self.dbs.get(db.checked_sub(1)?).map(|s| s.as_ref())
    }
}

/// What one call to [`RespSession::process`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Processed {
    /// Input bytes consumed (whole commands only).
    pub consumed: usize,
    /// Least number of unconsumed bytes before another command can be
    /// parsed (0: parse again as soon as anything arrives).
    pub need: usize,
    /// The connection must be closed once the replies are written (QUIT, or
    /// a protocol error after which the stream cannot be trusted).
    pub close: bool,
}

/// One RESP connection's protocol state.
pub struct RespSession {
    parser: CommandParser,
    /// A second parser for the prefetch pass, so the first keeps its spans.
    lookahead: CommandParser,
    state: ConnState,
}

/// What a connection's commands can change about it.
struct ConnState {
    authed: bool,
    id: u64,
    /// The selected database: 0 the in-memory kv, n the n-th shard.
    db: usize,
}

impl RespSession {
    /// A new connection; `id` is what CLIENT ID answers.
    pub fn new(shared: &RespShared, id: u64) -> RespSession {
        RespSession {
            parser: CommandParser::new(),
            lookahead: CommandParser::new(),
            state: ConnState {
                authed: shared.password.is_none(),
                id,
                db: 0,
            },
        }
    }

    /// Executes the complete commands at the start of `input`, appending
    /// their replies to `out`; stops early when `out` holds
    /// [`RESP_OUTPUT_SOFT_BYTES`] or more, so the caller writes before
    /// executing more.
    pub fn process(
        &mut self,
        shared: &RespShared,
        input: &[u8],
        out: &mut Vec<u8>,
        now_ms: u64,
    ) -> Processed {
        let mut ex = Exec {
            shared,
            held: None,
            now_ms,
        };
        let mut done = Processed {
            consumed: 0,
            need: 0,
            close: false,
        };
        let mut until_prefetch = 0;
        while done.consumed < input.len() && out.len() < RESP_OUTPUT_SOFT_BYTES {
            let rest = &input[done.consumed..];
            if until_prefetch == 0 {
                // Prefetching helps the in-memory kv only.
                if self.state.db == 0 {
                    self.prefetch(&mut ex, rest);
                }
                until_prefetch = RESP_PREFETCH_KEYS;
            }
            until_prefetch -= 1;
            match self.parser.parse(rest) {
                Ok(Parse::Incomplete { need }) => {
                    done.need = need;
                    break;
                }
                Ok(Parse::Complete { consumed }) => {
                    let cmd = &rest[..consumed];
                    done.consumed += consumed;
                    if self.parser.argc() == 0 {
                        continue;
                    }
                    shared.counters.commands.fetch_add(1, Ordering::Relaxed);
                    let args = Args {
                        parser: &self.parser,
                        buf: cmd,
                    };
                    if self.state.command(&mut ex, args, out) == After::Close {
                        done.close = true;
                        break;
                    }
                }
                Err(e) => {
                    e.write_reply(out);
                    shared
                        .counters
                        .protocol_errors
                        .fetch_add(1, Ordering::Relaxed);
                    done.close = true;
                    break;
                }
            }
        }
        done
    }

    /// Parses ahead up to [`RESP_PREFETCH_KEYS`] complete commands and
    /// prefetches the key (first argument) of each.
    fn prefetch(&mut self, ex: &mut Exec<'_>, input: &[u8]) {
        let mut hashes = [KeyHash(0); RESP_PREFETCH_KEYS];
        let mut n = 0;
        let mut at = 0;
        while n < RESP_PREFETCH_KEYS && at < input.len() {
            let rest = &input[at..];
            match self.lookahead.parse(rest) {
                Ok(Parse::Complete { consumed }) => {
                    if self.lookahead.argc() >= 2 {
                        hashes[n] = KeyHash::of(self.lookahead.arg(rest, 1));
                        n += 1;
                    }
                    at += consumed;
                }
                _ => break,
            }
        }
        // One command alone has nothing to overlap with.
        if n >= 2 {
            ex.prefetch(&hashes[..n]);
        }
    }
}

impl ConnState {
    fn command(&mut self, ex: &mut Exec<'_>, a: Args<'_>, out: &mut Vec<u8>) -> After {
        let mut name_buf = [0u8; COMMAND_NAME_BYTES_MAX];
        let name = lower(a.get(0), &mut name_buf);
        if !self.authed && name != b"auth" && name != b"quit" {
            resp::error(out, "NOAUTH Authentication required.");
            return After::Continue;
        }
        let argc = a.len();
        let Some(spec) = lookup(name) else {
            unknown_command(out, a);
            return After::Continue;
        };
        if (spec.arity >= 0 && argc != spec.arity as usize)
            || (spec.arity < 0 && argc < spec.arity.unsigned_abs() as usize)
        {
            resp::error(
                out,
                &format!("ERR wrong number of arguments for '{}' command", spec.name),
            );
            return After::Continue;
        }
        if self.db != 0 && shard_db::is_keyed(spec.id) {
            if let Some(shard) = ex.shared.db(self.db) {
                // A disk sync must not hold up the kv's other clients.
                ex.held = None;
                shard_db::command(shard, self.db, spec, a, out);
                return After::Continue;
            }
        }
        match spec.id {
            Cmd::Get => ex.get(a.get(1), out),
            Cmd::Set => ex.set(a, out),
            Cmd::Mget => ex.mget(a, out),
            Cmd::Mset => ex.mset(a, out),
            Cmd::Del => ex.del(a, out),
            Cmd::Exists => ex.exists(a, out),
            Cmd::Expire => ex.expire(a, 1000, out),
            Cmd::Pexpire => ex.expire(a, 1, out),
            Cmd::Persist => ex.persist(a.get(1), out),
            Cmd::Ttl => ex.ttl(a.get(1), 1000, out),
            Cmd::Pttl => ex.ttl(a.get(1), 1, out),
            Cmd::Incr => ex.incr_by(a.get(1), Ok(1), out),
            Cmd::Decr => ex.incr_by(a.get(1), Ok(-1), out),
            Cmd::Incrby => ex.incr_by(a.get(1), int_arg(a.get(2)), out),
            Cmd::Decrby => ex.incr_by(
                a.get(1),
                int_arg(a.get(2)).and_then(|d| d.checked_neg().ok_or(NOT_INTEGER)),
                out,
            ),
            Cmd::Strlen => ex.strlen(a.get(1), out),
            Cmd::Ping => match argc {
                1 => resp::simple(out, "PONG"),
                _ => resp::bulk(out, a.get(1)),
            },
            Cmd::Echo => resp::bulk(out, a.get(1)),
            Cmd::Auth => self.auth(ex.shared, a, out),
            Cmd::Select => match parse_i64(a.get(1)) {
                Some(n) if n >= 0 && n as u64 <= ex.shared.dbs.len() as u64 => {
                    self.db = n as usize;
                    resp::simple(out, "OK")
                }
                Some(_) => resp::error(out, "ERR DB index is out of range"),
                None => resp::error(out, NOT_INTEGER),
            },
            Cmd::Dbsize => resp::integer(out, ex.shared.parts.stats().items as i64),
            Cmd::Info => info(ex.shared, a, out),
            Cmd::Config => config(ex.shared, a, out),
            Cmd::Command => command_info(a, out),
            Cmd::Client => self.client(a, out),
            Cmd::Quit => {
                resp::simple(out, "OK");
                return After::Close;
            }
        }
        After::Continue
    }

    fn auth(&mut self, shared: &RespShared, a: Args<'_>, out: &mut Vec<u8>) {
        let Some(password) = &shared.password else {
            resp::error(
                out,
                "ERR AUTH <password> called without any password configured for the default user. Are you sure your configuration is correct?",
            );
            return;
        };
        let (user, given) = match a.len() {
            2 => (&b"default"[..], a.get(1)),
            3 => (a.get(1), a.get(2)),
            _ => {
                resp::error(out, "ERR syntax error");
                return;
            }
        };
        if user == b"default" && same_secret(given, password) {
            self.authed = true;
            resp::simple(out, "OK");
        } else {
            resp::error(
                out,
                "WRONGPASS invalid username-password pair or user is disabled.",
            );
        }
    }

    fn client(&mut self, a: Args<'_>, out: &mut Vec<u8>) {
        let mut sub = [0u8; COMMAND_NAME_BYTES_MAX];
        match lower(a.get(1), &mut sub) {
            b"setname" | b"setinfo" => resp::simple(out, "OK"),
            b"getname" => resp::null_bulk(out),
            b"id" => resp::integer(out, self.id as i64),
            _ => resp::error(
                out,
                "ERR unknown CLIENT subcommand (FabricKV answers ID, GETNAME, SETNAME, SETINFO)",
            ),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum After {
    Continue,
    Close,
}

/// The arguments of one parsed command.
#[derive(Clone, Copy)]
struct Args<'a> {
    parser: &'a CommandParser,
    buf: &'a [u8],
}

impl<'a> Args<'a> {
    fn len(&self) -> usize {
        self.parser.argc()
    }

    fn get(&self, i: usize) -> &'a [u8] {
        self.parser.arg(self.buf, i)
    }
}

#[derive(Debug, Clone, Copy)]
enum Cmd {
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
}

/// A command's name and arity as Redis counts it (the name included;
/// negative: at least that many).
struct Spec {
    name: &'static str,
    id: Cmd,
    arity: i32,
}

/// Every command the front-end answers, in the order COMMAND COUNT counts them.
const COMMANDS: &[Spec] = &[
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
];

fn lookup(name: &[u8]) -> Option<&'static Spec> {
    // The two hot commands first; the rest are rare enough for a scan.
    match name {
        b"get" => Some(&COMMANDS[0]),
        b"set" => Some(&COMMANDS[1]),
        _ => COMMANDS.iter().find(|s| s.name.as_bytes() == name),
    }
}

/// `s` lowercased into `buf`, or empty when too long to be a name we know.
fn lower<'b>(s: &[u8], buf: &'b mut [u8; COMMAND_NAME_BYTES_MAX]) -> &'b [u8] {
    lowercase(s, buf).unwrap_or(b"")
}

/// The `maxmemory-policy` Redis would show for a server in this mode.
fn eviction_policy(mode: Mode) -> &'static str {
    match mode {
        Mode::Cache => "allkeys-fifo",
        Mode::Store => "noeviction",
    }
}

/// Compares a password without stopping at the first differing byte.
fn same_secret(given: &[u8], expected: &[u8]) -> bool {
    let mut diff = given.len() ^ expected.len();
    for (i, e) in expected.iter().enumerate() {
        diff |= usize::from(given.get(i).copied().unwrap_or(0) ^ e);
    }
    diff == 0
}

fn unknown_command(out: &mut Vec<u8>, a: Args<'_>) {
    let mut msg = String::from("ERR unknown command '");
    quote_arg(&mut msg, a.get(0));
    msg.push_str("', with args beginning with: ");
    for i in 1..a.len() {
        msg.push('\'');
        quote_arg(&mut msg, a.get(i));
        msg.push_str("' ");
        if msg.len() > 4 * ERROR_ARG_QUOTE_BYTES_MAX {
            break;
        }
    }
    resp::error(out, &msg);
}

fn quote_arg(msg: &mut String, arg: &[u8]) {
    let cut = &arg[..arg.len().min(ERROR_ARG_QUOTE_BYTES_MAX)];
    msg.push_str(&String::from_utf8_lossy(cut));
}

const NOT_INTEGER: &str = "ERR value is not an integer or out of range";

fn int_arg(s: &[u8]) -> Result<i64, &'static str> {
    parse_i64(s).ok_or(NOT_INTEGER)
}

/// Relative expiry in `unit_ms` units to an absolute engine time, checked
/// against [`TTL_MS_MAX`].
fn expiry_at(now_ms: u64, amount: i64, unit_ms: u64) -> Option<u64> {
    let ms = u64::try_from(amount).ok()?.checked_mul(unit_ms)?;
    (ms > 0 && ms <= TTL_MS_MAX).then(|| now_ms + ms)
}

fn check_key(key: &[u8], out: &mut Vec<u8>) -> bool {
    within(key, KEY_BYTES_MAX, "FabricKV", "key", out)
}

/// Whether `bytes` (a `what` of a `whose` store) is at most `max` bytes;
/// otherwise the error reply that says so is written to `out`.
fn within(bytes: &[u8], max: usize, whose: &str, what: &str, out: &mut Vec<u8>) -> bool {
    if bytes.len() > max {
        let n = bytes.len();
        resp::error(
            out,
            &format!("ERR {what} is {n} bytes; {whose} {what}s are at most {max} bytes"),
        );
        return false;
    }
    true
}

/// Whether the MGET reply begun at `mark` in `out` is still within
/// [`RESP_REPLY_BYTES_MAX`]; otherwise it is replaced by the error reply
/// that says so.
fn mget_fits(out: &mut Vec<u8>, mark: usize) -> bool {
    if out.len() - mark > RESP_REPLY_BYTES_MAX {
        out.truncate(mark);
        resp::error(
            out,
            &format!(
                "ERR MGET reply would exceed {RESP_REPLY_BYTES_MAX} bytes; ask for fewer keys"
            ),
        );
        return false;
    }
    true
}

fn put_error(out: &mut Vec<u8>, r: PutResult) {
    match r {
        PutResult::InsufficientSpace => resp::error(
            out,
            "OOM command not allowed when used memory > 'maxmemory'.",
        ),
        PutResult::TooLarge => resp::error(out, "ERR value is too large for this server"),
        PutResult::Stored | PutResult::ConditionFailed => resp::null_bulk(out),
    }
}

/// Execution context of one `process` call: the partition lock it holds.
struct Exec<'a> {
    shared: &'a RespShared,
    held: Option<(usize, MutexGuard<'a, Partition>)>,
    now_ms: u64,
}

impl<'a> Exec<'a> {
    /// The partition owning `hash`, locked (reusing the lock already held
    /// when it is the same partition; never holding two).
    fn part(&mut self, hash: KeyHash) -> &mut Partition {
        let i = self.shared.parts.index_of(hash);
        if self.held.as_ref().is_none_or(|(h, _)| *h != i) {
            self.held = None;
            self.held = Some((i, self.shared.parts.lock(i)));
        }
        match &mut self.held {
            Some((_, g)) => g,
            None => unreachable!("a lock was just taken"),
        }
    }

    /// Both prefetch stages for a run of keys: every bucket, then every
    /// item the buckets name.
    fn prefetch(&mut self, hashes: &[KeyHash]) {
        for &h in hashes {
            self.part(h).prefetch(h);
        }
        for &h in hashes {
            self.part(h).prefetch_item(h);
        }
    }

    fn get(&mut self, key: &[u8], out: &mut Vec<u8>) {
        if !check_key(key, out) {
            return;
        }
        let now = self.now_ms;
        let h = KeyHash::of(key);
        match self.part(h).get(h, key, now) {
            GetResult::Found { value, .. } => resp::bulk(out, value),
            GetResult::NotFound => resp::null_bulk(out),
        }
    }

    fn strlen(&mut self, key: &[u8], out: &mut Vec<u8>) {
        if !check_key(key, out) {
            return;
        }
        let now = self.now_ms;
        let h = KeyHash::of(key);
        match self.part(h).get(h, key, now) {
            GetResult::Found { value, .. } => resp::integer(out, value.len() as i64),
            GetResult::NotFound => resp::integer(out, 0),
        }
    }

    fn set(&mut self, a: Args<'_>, out: &mut Vec<u8>) {
        let (key, value) = (a.get(1), a.get(2));
        if !check_key(key, out) {
            return;
        }
        let mut expire: Option<u64> = None;
        let mut cond = PutCond::Always;
        let mut keep_ttl = false;
        let mut get_old = false;
        let mut i = 3;
        let mut opt = [0u8; COMMAND_NAME_BYTES_MAX];
        while i < a.len() {
            let unit = match lower(a.get(i), &mut opt) {
                b"nx" if cond == PutCond::Always => {
                    cond = PutCond::IfAbsent;
                    None
                }
                b"xx" if cond == PutCond::Always => {
                    cond = PutCond::IfPresent;
                    None
                }
                b"keepttl" if expire.is_none() => {
                    keep_ttl = true;
                    None
                }
                b"get" => {
                    get_old = true;
                    None
                }
                b"ex" if expire.is_none() && !keep_ttl && i + 1 < a.len() => Some(1000),
                b"px" if expire.is_none() && !keep_ttl && i + 1 < a.len() => Some(1),
                _ => return resp::error(out, "ERR syntax error"),
            };
            if let Some(unit) = unit {
                i += 1;
                let Ok(n) = int_arg(a.get(i)) else {
                    return resp::error(out, NOT_INTEGER);
                };
                match expiry_at(self.now_ms, n, unit) {
                    Some(at) => expire = Some(at),
                    None => return resp::error(out, "ERR invalid expire time in 'set' command"),
                }
            }
            i += 1;
        }
        let now = self.now_ms;
        let h = KeyHash::of(key);
        let mark = out.len();
        let p = self.part(h);
        let mut old_ttl = 0;
        if get_old || keep_ttl {
            match p.get(h, key, now) {
                GetResult::Found {
                    value: old,
                    expire_at_ms,
                } => {
                    if get_old {
                        resp::bulk(out, old);
                    }
                    old_ttl = expire_at_ms;
                }
                GetResult::NotFound if get_old => resp::null_bulk(out),
                GetResult::NotFound => {}
            }
        }
        let at = match (expire, keep_ttl) {
            (Some(at), _) => at,
            (None, true) => old_ttl,
            (None, false) => 0,
        };
        match p.put(h, key, value, at, cond, now) {
            PutResult::Stored if !get_old => resp::simple(out, "OK"),
            PutResult::Stored | PutResult::ConditionFailed if get_old => {}
            PutResult::ConditionFailed => resp::null_bulk(out),
            r => {
                out.truncate(mark);
                put_error(out, r);
            }
        }
    }

    fn mget(&mut self, a: Args<'_>, out: &mut Vec<u8>) {
        let mark = out.len();
        resp::array_header(out, a.len() - 1);
        let now = self.now_ms;
        for i in 1..a.len() {
            if (i - 1).is_multiple_of(RESP_PREFETCH_KEYS) && a.len() > 2 {
                let end = (i + RESP_PREFETCH_KEYS).min(a.len());
                let mut hashes = [KeyHash(0); RESP_PREFETCH_KEYS];
                for (h, j) in hashes.iter_mut().zip(i..end) {
                    *h = KeyHash::of(a.get(j));
                }
                self.prefetch(&hashes[..end - i]);
            }
            let key = a.get(i);
            if key.len() > KEY_BYTES_MAX {
                resp::null_bulk(out);
                continue;
            }
            let h = KeyHash::of(key);
            match self.part(h).get(h, key, now) {
                GetResult::Found { value, .. } => resp::bulk(out, value),
                GetResult::NotFound => resp::null_bulk(out),
            }
            if !mget_fits(out, mark) {
                return;
            }
        }
    }

    fn mset(&mut self, a: Args<'_>, out: &mut Vec<u8>) {
        if a.len().is_multiple_of(2) {
            return resp::error(out, "ERR wrong number of arguments for 'mset' command");
        }
        // Every key checked before any is written, so bad input writes nothing.
        for i in (1..a.len()).step_by(2) {
            if !check_key(a.get(i), out) {
                return;
            }
        }
        let now = self.now_ms;
        for i in (1..a.len()).step_by(2) {
            let (key, value) = (a.get(i), a.get(i + 1));
            let h = KeyHash::of(key);
            let r = self.part(h).put(h, key, value, 0, PutCond::Always, now);
            if r != PutResult::Stored {
                return put_error(out, r);
            }
        }
        resp::simple(out, "OK");
    }

    fn del(&mut self, a: Args<'_>, out: &mut Vec<u8>) {
        let now = self.now_ms;
        let mut n = 0;
        for i in 1..a.len() {
            let key = a.get(i);
            if key.len() > KEY_BYTES_MAX {
                continue;
            }
            let h = KeyHash::of(key);
            if self.part(h).delete(h, key, now) == DeleteResult::Deleted {
                n += 1;
            }
        }
        resp::integer(out, n);
    }

    fn exists(&mut self, a: Args<'_>, out: &mut Vec<u8>) {
        let now = self.now_ms;
        let mut n = 0;
        for i in 1..a.len() {
            let key = a.get(i);
            if key.len() > KEY_BYTES_MAX {
                continue;
            }
            let h = KeyHash::of(key);
            if matches!(self.part(h).get(h, key, now), GetResult::Found { .. }) {
                n += 1;
            }
        }
        resp::integer(out, n);
    }

    /// EXPIRE and PEXPIRE (`unit_ms` 1000 or 1), with NX, XX, GT and LT.
    fn expire(&mut self, a: Args<'_>, unit_ms: u64, out: &mut Vec<u8>) {
        let key = a.get(1);
        if !check_key(key, out) {
            return;
        }
        let Ok(n) = int_arg(a.get(2)) else {
            return resp::error(out, NOT_INTEGER);
        };
        let mut flag = [0u8; COMMAND_NAME_BYTES_MAX];
        let flag = match a.len() {
            3 => &b""[..],
            4 => lower(a.get(3), &mut flag),
            _ => return resp::error(out, "ERR syntax error"),
        };
        if !matches!(flag, b"" | b"nx" | b"xx" | b"gt" | b"lt") {
            return resp::error(
                out,
                &format!(
                    "ERR Unsupported option {}",
                    String::from_utf8_lossy(a.get(3))
                ),
            );
        }
        let now = self.now_ms;
        let h = KeyHash::of(key);
        // A time in the past deletes the key, as in Redis.
        let at = if n <= 0 {
            None
        } else {
            match expiry_at(now, n, unit_ms) {
                Some(at) => Some(at),
                None => return resp::error(out, "ERR invalid expire time in 'expire' command"),
            }
        };
        let p = self.part(h);
        let current = match p.get(h, key, now) {
            GetResult::Found { expire_at_ms, .. } => expire_at_ms,
            GetResult::NotFound => return resp::integer(out, 0),
        };
        // No TTL counts as an infinite one for GT and LT.
        let new = at.unwrap_or(now);
        let allowed = match flag {
            b"nx" => current == 0,
            b"xx" => current != 0,
            b"gt" => current != 0 && new > current,
            b"lt" => current == 0 || new < current,
            _ => true,
        };
        if !allowed {
            return resp::integer(out, 0);
        }
        let applied = match at {
            Some(at) => p.set_expiry(h, key, at, now),
            None => p.delete(h, key, now) == DeleteResult::Deleted,
        };
        resp::integer(out, i64::from(applied));
    }

    fn persist(&mut self, key: &[u8], out: &mut Vec<u8>) {
        if !check_key(key, out) {
            return;
        }
        let now = self.now_ms;
        let h = KeyHash::of(key);
        let p = self.part(h);
        let had = matches!(p.get(h, key, now), GetResult::Found { expire_at_ms, .. } if expire_at_ms != 0);
        let removed = had && p.set_expiry(h, key, 0, now);
        resp::integer(out, i64::from(removed));
    }

    /// TTL and PTTL: -2 absent, -1 no expiry, else the time left, rounded
    /// to the nearest unit as Redis does.
    fn ttl(&mut self, key: &[u8], unit_ms: u64, out: &mut Vec<u8>) {
        if !check_key(key, out) {
            return;
        }
        let now = self.now_ms;
        let h = KeyHash::of(key);
        let v = match self.part(h).get(h, key, now) {
            GetResult::NotFound => -2,
            GetResult::Found {
                expire_at_ms: 0, ..
            } => -1,
            GetResult::Found { expire_at_ms, .. } => {
                let left = expire_at_ms.saturating_sub(now);
                ((left + unit_ms / 2) / unit_ms) as i64
            }
        };
        resp::integer(out, v);
    }

    fn incr_by(&mut self, key: &[u8], delta: Result<i64, &'static str>, out: &mut Vec<u8>) {
        if !check_key(key, out) {
            return;
        }
        let delta = match delta {
            Ok(d) => d,
            Err(e) => return resp::error(out, e),
        };
        let now = self.now_ms;
        let h = KeyHash::of(key);
        let p = self.part(h);
        let (current, ttl) = match p.get(h, key, now) {
            GetResult::Found {
                value,
                expire_at_ms,
            } => match parse_i64(value) {
                Some(v) => (v, expire_at_ms),
                None => return resp::error(out, NOT_INTEGER),
            },
            GetResult::NotFound => (0, 0),
        };
        let Some(next) = current.checked_add(delta) else {
            return resp::error(out, "ERR increment or decrement would overflow");
        };
        let digits = next.to_string();
        match p.put(h, key, digits.as_bytes(), ttl, PutCond::Always, now) {
            PutResult::Stored => resp::integer(out, next),
            r => put_error(out, r),
        }
    }
}

fn info(shared: &RespShared, a: Args<'_>, out: &mut Vec<u8>) {
    let mut section = [0u8; COMMAND_NAME_BYTES_MAX];
    let want = if a.len() > 1 {
        lower(a.get(1), &mut section)
    } else {
        b"default"
    };
    let all = matches!(want, b"default" | b"all" | b"everything");
    let e = shared.parts.stats();
    let c = &shared.counters;
    let mut s = String::new();
    let mut add = |name: &[u8], body: String| {
        if all || want == name {
            if !s.is_empty() {
                s.push_str("\r\n");
            }
            s.push_str(&body);
        }
    };
    add(
        b"server",
        format!(
            "# Server\r\nredis_version:7.0.0\r\nfabrickv_version:{}\r\nredis_mode:standalone\r\nos:{}\r\narch_bits:64\r\nprocess_id:{}\r\ntcp_port:{}\r\nuptime_in_seconds:{}\r\n",
            env!("CARGO_PKG_VERSION"),
            std::env::consts::OS,
            std::process::id(),
            shared.port,
            shared.started.elapsed().as_secs(),
        ),
    );
    add(
        b"clients",
        format!(
            "# Clients\r\nconnected_clients:{}\r\n",
            c.connected.load(Ordering::Relaxed)
        ),
    );
    let policy = eviction_policy(shared.mode);
    add(
        b"memory",
        format!(
            "# Memory\r\nused_memory:{}\r\nmaxmemory:{}\r\nmaxmemory_policy:{policy}\r\n",
            e.bytes, shared.pool_bytes
        ),
    );
    add(
        b"stats",
        format!(
            "# Stats\r\ntotal_connections_received:{}\r\ntotal_commands_processed:{}\r\nrejected_connections:{}\r\nexpired_keys:{}\r\nevicted_keys:{}\r\nkeyspace_hits:{}\r\nkeyspace_misses:{}\r\ntotal_error_replies_protocol:{}\r\n",
            c.connections_received.load(Ordering::Relaxed),
            c.commands.load(Ordering::Relaxed),
            c.rejected.load(Ordering::Relaxed),
            e.expired,
            e.evictions,
            e.hits,
            e.misses,
            c.protocol_errors.load(Ordering::Relaxed),
        ),
    );
    let mut keyspace = format!("# Keyspace\r\ndb0:keys={}\r\n", e.items);
    for (i, shard) in shared.dbs.iter().enumerate() {
        // An estimate: a shard counts its pairs exactly only by a scan.
        keyspace.push_str(&format!("db{}:keys={}\r\n", i + 1, shard.approximate_len()));
    }
    add(b"keyspace", keyspace);
    resp::bulk(out, s.as_bytes());
}

/// CONFIG GET answers what clients ask at start (redis-benchmark asks for
/// `save` and `appendonly`); CONFIG SET is refused, settings being fixed
/// at start.
fn config(shared: &RespShared, a: Args<'_>, out: &mut Vec<u8>) {
    let mut sub = [0u8; COMMAND_NAME_BYTES_MAX];
    match lower(a.get(1), &mut sub) {
        b"get" if a.len() >= 3 => {
            let policy = eviction_policy(shared.mode);
            let params: [(&str, String); 6] = [
                ("save", String::new()),
                ("appendonly", "no".into()),
                ("databases", (1 + shared.dbs.len()).to_string()),
                ("maxmemory", shared.pool_bytes.to_string()),
                ("maxmemory-policy", policy.into()),
                ("port", shared.port.to_string()),
            ];
            let mut found: Vec<(&str, String)> = Vec::new();
            for i in 2..a.len() {
                let pattern = a.get(i).to_ascii_lowercase();
                for (k, v) in &params {
                    if glob_match(&pattern, k.as_bytes()) && !found.iter().any(|(f, _)| f == k) {
                        found.push((k, v.clone()));
                    }
                }
            }
            resp::array_header(out, found.len() * 2);
            for (k, v) in found {
                resp::bulk(out, k.as_bytes());
                resp::bulk(out, v.as_bytes());
            }
        }
        b"set" => resp::error(
            out,
            "ERR CONFIG SET is not supported: FabricKV's settings are fixed at start",
        ),
        b"resetstat" => resp::simple(out, "OK"),
        _ => resp::error(
            out,
            "ERR unknown CONFIG subcommand or wrong number of arguments (FabricKV answers CONFIG GET)",
        ),
    }
}

fn command_info(a: Args<'_>, out: &mut Vec<u8>) {
    let mut sub = [0u8; COMMAND_NAME_BYTES_MAX];
    match a.len() {
        1 => resp::array_header(out, 0),
        _ => match lower(a.get(1), &mut sub) {
            b"count" => resp::integer(out, COMMANDS.len() as i64),
            // Clients use these for hints only; an empty answer is valid.
            b"docs" | b"info" => resp::array_header(out, 0),
            _ => resp::error(out, "ERR unknown COMMAND subcommand"),
        },
    }
}

/// Redis's glob subset for CONFIG GET: `*`, `?` and literal bytes.
/// Iterative with one backtrack point, so a hostile pattern of many stars
/// costs O(pattern x name), not an exponential search.
fn glob_match(pattern: &[u8], s: &[u8]) -> bool {
    let (mut p, mut i) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while i < s.len() {
        match pattern.get(p) {
            Some(b'*') => {
                star = Some((p, i));
                p += 1;
            }
            Some(&c) if c == b'?' || c == s[i] => {
                p += 1;
                i += 1;
            }
            _ => match star {
                Some((sp, si)) => {
                    p = sp + 1;
                    i = si + 1;
                    star = Some((sp, si + 1));
                }
                None => return false,
            },
        }
    }
    pattern[p.min(pattern.len())..].iter().all(|&c| c == b'*')
}

#[cfg(test)]
mod tests;
