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
//! (SET NX/XX, INCR, EXPIRE) are atomic; a command over keys of several
//! partitions (MGET, MSET, MSETNX, DEL, RENAME, COPY) takes all their
//! locks at once, in ascending order, and EXEC takes every partition's,
//! so these are atomic across partitions as in Redis (see `txn`).
//!
//! Database 0 (the default) is the in-memory kv; `SELECT n` for n in
//! 1..=shards makes the n-th persistent shard (`--shard`, in the order
//! given) the connection's database, where the data commands run against
//! the shard (see `shard_db`).
//!
//! Layout, one concern per file (as mini-redis has a file per command):
//! this file holds the shared state and the session's parse loop;
//! `conn` the connection's state and the dispatch of one command; `table`
//! the command table; `args` a command's arguments and their bounds;
//! `exec` the partition locks a run of commands holds; `strings`,
//! `strings2`, `expiry` and `keyspace` the kv's commands; `glob` Redis's
//! patterns; `txn` MULTI, EXEC and WATCH; `admin` INFO, CONFIG and
//! COMMAND; `shard_db` the commands on a persistent shard.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use fabrickv_resp::{CommandParser, Parse, Reply};
use fabrickv_storage::FjallShard;
use fabrickv_types::KeyHash;

use crate::config::Mode;
use crate::partitions::Partitions;
use crate::shard::Shards;

use args::Args;
use conn::{After, ConnState};
use exec::Exec;

mod admin;
mod args;
mod clients;
mod conn;
mod exec;
mod expiry;
mod glob;
mod keyspace;
mod shard_db;
mod stats;
mod strings;
mod strings2;
mod table;
mod txn;
mod txn_state;

pub use clients::{
    ClientPeer, ClientRegistry, KillNotify, RESP_CLIENTS_MAX, RESP_CLIENT_NAME_BYTES_MAX,
};
pub use stats::RESP_ERROR_CODES_MAX;

/// The Redis version the front end says it is (INFO, HELLO): the
/// release whose commands and replies it follows.
pub const REDIS_VERSION: &str = "7.2.0";

/// Reply bytes a connection may have waiting before it stops executing
/// commands until the client reads them (backpressure), in bytes.
pub const RESP_OUTPUT_SOFT_BYTES: usize = 256 << 10;

/// Largest reply to one command, in bytes: an MGET whose values add up to
/// more is refused rather than buffered.
pub const RESP_REPLY_BYTES_MAX: usize = 32 << 20;

/// Delay before the reply to a connection's first failed AUTH, in
/// milliseconds; each further failure on the connection doubles it (up to
/// [`RESP_AUTH_DELAY_MAX_MS`]). A guesser on one connection gets at most
/// a few tries a second instead of the hundred thousand a pipeline allows.
pub const RESP_AUTH_DELAY_BASE_MS: u64 = 100;

/// Longest delay a failed AUTH costs its connection, in milliseconds:
/// bounded so that an honest client with a stale password is not shut out
/// for long once it is fixed (it reconnects and starts again from the base).
pub const RESP_AUTH_DELAY_MAX_MS: u64 = 5_000;

/// The delay of a connection's `failures`-th failed AUTH (from 1):
/// `RESP_AUTH_DELAY_BASE_MS * 2^(failures-1)`, at most
/// [`RESP_AUTH_DELAY_MAX_MS`].
pub fn auth_delay_ms(failures: u32) -> u64 {
    let doublings = failures.saturating_sub(1).min(u64::BITS - 1);
    RESP_AUTH_DELAY_BASE_MS
        .checked_shl(doublings)
        .unwrap_or(u64::MAX)
        .min(RESP_AUTH_DELAY_MAX_MS)
}

/// Commands (or MGET keys) looked ahead per prefetch round: their index
/// buckets, then their items, are asked of memory before the first of them
/// executes, so a pipeline's cache misses overlap (MICA's prefetch pass).
pub const RESP_PREFETCH_KEYS: usize = 32;

/// Counters shared by every RESP connection of a server.
#[derive(Debug, Default)]
pub struct RespCounters {
    /// Connections accepted since start.
    pub connections_received: AtomicU64,
    /// Connections open now.
    pub connected: AtomicU64,
    /// Connections refused because too many were open.
    pub rejected: AtomicU64,
    /// Idle connections closed to make room for a newcomer at the cap.
    pub evicted_idle: AtomicU64,
    /// Commands executed (including those answered with an error).
    pub commands: AtomicU64,
    /// Connections closed for a protocol error.
    pub protocol_errors: AtomicU64,
    /// AUTH attempts refused (a wrong password or secret), as Redis's ACL
    /// log counts them (`acl_access_denied_auth` in INFO): a climbing
    /// count is someone guessing.
    pub auth_failures: AtomicU64,
}

impl RespCounters {
    /// CONFIG RESETSTAT: the counters of events back to zero (not those
    /// of state, such as the connections open now).
    fn reset(&self) {
        for c in [
            &self.connections_received,
            &self.rejected,
            &self.evicted_idle,
            &self.commands,
            &self.protocol_errors,
            &self.auth_failures,
        ] {
            c.store(0, Ordering::Relaxed);
        }
    }
}

/// The engine's event counters as INFO last reset them (CONFIG
/// RESETSTAT): INFO shows what has happened since.
#[derive(Debug, Default, Clone, Copy)]
struct EngineBase {
    hits: u64,
    misses: u64,
    expired: u64,
    evictions: u64,
}

/// What every RESP connection of a server shares.
pub struct RespShared {
    parts: Arc<Partitions>,
    /// The RESP password (Redis's `requirepass`); when set, only it opens
    /// a connection.
    password: Option<Vec<u8>>,
    /// The cluster secret, which opens a connection when no separate RESP
    /// password is set (one secret for every front end).
    secret: Option<fabrickv_auth::Secret>,
    mode: Mode,
    pool_bytes: u64,
    port: u16,
    started: Instant,
    /// The persistent shards, database n at index n - 1.
    dbs: Vec<Arc<FjallShard>>,
    /// Counters reported by INFO.
    pub counters: RespCounters,
    /// Per-command and per-error counters (INFO commandstats, errorstats).
    stats: stats::CommandStats,
    /// The engine's counters at the last CONFIG RESETSTAT.
    engine_base: Mutex<EngineBase>,
    /// Every live connection, for CLIENT LIST and CLIENT KILL.
    pub clients: Arc<ClientRegistry>,
    /// Connections silent this long with nothing pending are closed, in
    /// milliseconds; 0 keeps them. Redis's `timeout` (in seconds there),
    /// which CONFIG SET changes while the server runs.
    pub idle_timeout_ms: AtomicU64,
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
            secret: None,
            mode,
            pool_bytes,
            port,
            started: Instant::now(),
            dbs: Vec::new(),
            counters: RespCounters::default(),
            stats: stats::CommandStats::default(),
            engine_base: Mutex::new(EngineBase::default()),
            clients: Arc::new(ClientRegistry::default()),
            idle_timeout_ms: AtomicU64::new(0),
        }
    }

    /// CONFIG RESETSTAT: INFO's event counters, commandstats and
    /// errorstats start again from zero.
    fn reset_stats(&self) {
        self.counters.reset();
        self.stats.reset();
        let e = self.parts.stats();
        *self.engine_base.lock().unwrap_or_else(|p| p.into_inner()) = EngineBase {
            hits: e.hits,
            misses: e.misses,
            expired: e.expired,
            evictions: e.evictions,
        };
    }

    /// Asks AUTH for the cluster secret `secret` (unless a RESP password
    /// is set, which then is the only one AUTH accepts).
    pub fn with_secret(mut self, secret: Option<fabrickv_auth::Secret>) -> RespShared {
        self.secret = secret;
        self
    }

    /// Whether a connection must AUTH before any other command.
    fn auth_required(&self) -> bool {
        self.password.is_some() || self.secret.is_some()
    }

    /// Whether `given` opens a connection: the RESP password when one is
    /// set, else the cluster secret; compared in constant time.
    fn auth_accepts(&self, given: &[u8]) -> bool {
        match (&self.password, &self.secret) {
            (Some(p), _) => conn::same_secret(given, p),
            (None, Some(s)) => s.matches(given),
            (None, None) => false,
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

/// The wall clock as Unix milliseconds (0 if it reads before 1970).
fn unix_now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
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
    /// A failed AUTH: the replies in `out` must not be sent, nor any more
    /// command run, before this time (engine milliseconds). The socket
    /// loop parks the connection instead of sleeping, so its other
    /// connections are served meanwhile.
    pub hold_until_ms: Option<u64>,
}

/// One RESP connection's protocol state.
pub struct RespSession {
    parser: CommandParser,
    /// A second parser for the prefetch pass, so the first keeps its spans.
    lookahead: CommandParser,
    state: ConnState,
    /// Command counts not yet added to the server's.
    stats: stats::LocalStats,
}

impl RespSession {
    /// Whether the connection has authenticated (or needs not): at the
    /// connection cap, one that has not is closed first.
    pub fn authenticated(&self) -> bool {
        self.state.authed
    }

    /// A new connection; `id` is what CLIENT ID answers.
    pub fn new(shared: &RespShared, id: u64) -> RespSession {
        Self::connected(shared, id, ClientPeer::default())
    }

    /// A new connection from `peer`, listed in the server's client
    /// registry until it is dropped.
    pub fn connected(shared: &RespShared, id: u64, peer: ClientPeer) -> RespSession {
        RespSession {
            parser: CommandParser::new(),
            lookahead: CommandParser::new(),
            state: ConnState::new(shared, id, peer),
            stats: stats::LocalStats::default(),
        }
    }

    /// Whether CLIENT KILL closed this connection.
    pub fn killed(&self) -> bool {
        self.state.entry.killed()
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
            unix_ms: unix_now_ms(),
            many: Vec::new(),
            in_exec: false,
        };
        let mut done = Processed {
            consumed: 0,
            need: 0,
            close: false,
            hold_until_ms: None,
        };
        if self.killed() {
            done.close = true;
            return done;
        }
        self.state.entry.active_ms.store(now_ms, Ordering::Relaxed);
        let mut out = Reply::new(out, self.state.proto);
        let mut until_prefetch = 0;
        // Two clock reads per call, not per command: the call's time is
        // shared out evenly among the commands it ran (see `stats`).
        let started = Instant::now();
        while done.consumed < input.len() && out.len() < RESP_OUTPUT_SOFT_BYTES {
            self.parser.set_unauthenticated(!self.state.authed);
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
                    let mark = out.len();
                    let after = self.state.command(&mut ex, args, &mut out);
                    let failed = out.get(mark) == Some(&b'-');
                    if failed {
                        shared.stats.error(out.get(mark + 1..).unwrap_or_default());
                    }
                    if let Some(index) = self.state.last {
                        let outcome = if self.state.rejected {
                            stats::Outcome::Rejected
                        } else if failed {
                            stats::Outcome::Failed
                        } else {
                            stats::Outcome::Ok
                        };
                        self.stats.record(index, outcome);
                    }
                    match after {
                        After::Continue => {}
                        After::Close => {
                            done.close = true;
                            break;
                        }
                        After::Hold { delay_ms } => {
                            done.hold_until_ms = Some(now_ms + delay_ms);
                            break;
                        }
                    }
                }
                Err(e) => {
                    let mark = out.len();
                    e.write_reply(&mut out);
                    shared.stats.error(out.get(mark + 1..).unwrap_or_default());
                    shared
                        .counters
                        .protocol_errors
                        .fetch_add(1, Ordering::Relaxed);
                    done.close = true;
                    break;
                }
            }
        }
        let nanos = u64::try_from(started.elapsed().as_nanos()).unwrap_or(u64::MAX);
        shared.stats.flush(&mut self.stats, nanos);
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

#[cfg(test)]
mod tests;
