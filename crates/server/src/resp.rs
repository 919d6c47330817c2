//! The Redis-compatible (RESP2) front-end's commands, sans-I/O.
//!
//! [`RespConnState::process`] takes the bytes a connection has buffered and
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
//! this file holds the shared state and the connection's parse loop;
//! `conn` the connection's state and the dispatch of one command; `table`
//! the command table's types and lookup (each command file keeps its own
//! commands' `SPECS`, gathered here into [`COMMANDS`]); `args` a command's
//! arguments and their bounds; `exec` the partition locks a run of
//! commands holds; `strings`, `get_set`, `numbers`, `value_edit`,
//! `expiry` and `keyspace` the kv's commands; `glob` Redis's
//! patterns; `txn` MULTI, EXEC and WATCH; `admin` INFO, CONFIG and
//! COMMAND; `shard_db` the commands on a persistent shard.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Instant;

use fabrickv_engine::LargeValue;
use fabrickv_resp::{CommandParser, Parse, ParseLarge, Reply};
use fabrickv_storage::FjallShard;
use fabrickv_types::KeyHash;

use crate::config::Mode;
use crate::partitions::Partitions;
use crate::shard::Shards;

use args::Args;
use conn::{After, ConnState};
use exec::Exec;
use fabrickv_resp::reply as resp;

mod admin;
mod args;
mod clients;
mod cluster;
mod conn;
mod exec;
mod expiry;
mod get_set;
mod glob;
mod keyspace;
mod numbers;
mod shard_db;
mod stats;
mod strings;
mod table;
mod txn;
mod txn_state;
mod value_edit;

pub use clients::{
    ClientPeer, ClientRegistry, KillNotify, RESP_CLIENTS_MAX, RESP_CLIENT_NAME_BYTES_MAX,
};
pub use stats::{RespCounters, RESP_ERROR_CODES_MAX};

/// The Redis version the front end says it is (INFO, HELLO): the
/// release whose commands and replies it follows.
pub const REDIS_VERSION: &str = "7.2.0";

/// Reply bytes a connection may have waiting before it stops executing
/// commands until the client reads them (backpressure), in bytes.
pub const RESP_OUTPUT_SOFT_BYTES: usize = 256 << 10;

/// Largest reply to one command, in bytes copied into the output buffer:
/// an MGET whose inline values (1 MiB at most each) add up to more is
/// refused rather than buffered. Large values in a reply are not copied
/// but referenced ([`LargeReply`]), so they do not count here; a reply
/// refers to at most [`RESP_REPLY_LARGE_VALUES_MAX`] of them.
pub const RESP_REPLY_BYTES_MAX: usize = 32 << 20;

/// Most large values one reply refers to: one per key of the longest MGET
/// the parser accepts (its arguments are bounded by the per-command byte
/// cap, `RESP_COMMAND_BYTES_MAX`, not by a count). The values are the
/// store's own buffers (a reference each), so a reply pins at most this
/// many buffers, and only until it is written.
pub const RESP_REPLY_LARGE_VALUES_MAX: usize = fabrickv_resp::RESP_ARGS_MAX;

/// Most bytes of large values being received at once over every RESP
/// connection of a server, in bytes (1 GiB: two maximal values, or 64
/// LMCache chunks of 16 MiB). Each connection receives at most one large
/// value at a time, into the value's final buffer; a value that would take
/// the total over this is read and dropped, and its command answered with
/// an error, rather than buffered.
pub const RESP_LARGE_RECEIVING_BYTES_MAX: usize = 1 << 30;

const _: () = assert!(
    fabrickv_resp::RESP_LARGE_BULK_BYTES_MIN == fabrickv_engine::LARGE_VALUE_BYTES_MIN,
    "a bulk received on its own is exactly a value the engine keeps as a large object"
);
const _: () = assert!(fabrickv_resp::RESP_BULK_BYTES_MAX == fabrickv_engine::LARGE_VALUE_BYTES_MAX);
const _: () = assert!(RESP_LARGE_RECEIVING_BYTES_MAX >= fabrickv_resp::RESP_BULK_BYTES_MAX);

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
    /// Failed AUTHs per source and server-wide, shared with the server's
    /// other front ends.
    throttle: fabrickv_auth::throttle::SharedThrottle,
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
    /// Bytes of large values being received now, over every connection
    /// (at most [`RESP_LARGE_RECEIVING_BYTES_MAX`]).
    large_receiving: Arc<AtomicUsize>,
    /// The address the RESP listener was told to bind (CONFIG GET bind),
    /// without its port; `None` when not known (tests).
    bind: Option<String>,
    /// Unix milliseconds minus engine milliseconds, fixed at the first
    /// command (see [`RespShared::unix_ms_at`]).
    unix_offset_ms: OnceLock<i64>,
    /// What every RESP and memcache connection buffers, and its cap
    /// (INFO's clients and stats sections).
    pub(crate) client_memory: Arc<crate::text_socket::ClientMemory>,
    /// Longest a reply holding large values may wait to be written, in
    /// ms, before its connection is closed (`RESP_LARGE_REPLY_MS` unless
    /// configured; 0: no bound).
    pub(crate) large_reply_ms: u64,
    /// Which slots this server serves, when it is in a slot-map cluster.
    pub(crate) slot_routing: Arc<crate::slot_routing::SlotRouting>,
    /// The server's checkpoints (SAVE, BGSAVE, LASTSAVE, INFO).
    pub(crate) checkpoints: Option<Arc<crate::checkpoint::Checkpoints>>,
}

/// A share of [`RESP_LARGE_RECEIVING_BYTES_MAX`] held while a large value
/// is received and until its command runs; given back when dropped (a
/// client that disconnects halfway included).
pub(crate) struct Receiving {
    total: Arc<AtomicUsize>,
    bytes: usize,
}

impl Drop for Receiving {
    fn drop(&mut self) {
        self.total.fetch_sub(self.bytes, Ordering::AcqRel);
    }
}

/// A large value in a reply: its bytes go to the socket right after the
/// first `at` bytes of the connection's output buffer, straight from the
/// store's buffer (no copy).
pub(crate) struct LargeReply {
    pub(crate) at: usize,
    pub(crate) value: LargeValue,
}

/// The large values the replies in a connection's output buffer refer to,
/// in order.
#[derive(Default)]
pub(crate) struct LargeReplies {
    pub(crate) queue: VecDeque<LargeReply>,
    /// Sum of the queued values' lengths, in bytes.
    pub(crate) bytes: usize,
}

impl LargeReplies {
    /// Queues `value` to follow the first `at` bytes of the output.
    pub(crate) fn push(&mut self, at: usize, value: LargeValue) {
        self.bytes += value.len();
        self.queue.push_back(LargeReply { at, value });
    }

    /// Drops the first queued value (written out).
    pub(crate) fn pop(&mut self) {
        if let Some(r) = self.queue.pop_front() {
            self.bytes -= r.value.len();
        }
    }
}

/// Where [`RespConnState::process`] stopped at a large bulk, in offsets into
/// the input it was given (see [`ParseLarge::LargeBulk`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LargeBulkAt {
    /// Offset of the bulk's `$`.
    pub header_at: usize,
    /// Offset of its first payload byte.
    pub data_at: usize,
    /// Payload bytes.
    pub len: usize,
    /// Argument index in its command.
    pub arg: usize,
}

/// A received large argument waiting for its command to complete.
struct LargeArg {
    arg: usize,
    /// The value, or the error reply its command gets instead of running.
    value: Result<LargeValue, String>,
    _receiving: Option<Receiving>,
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
            throttle: fabrickv_auth::throttle::SharedThrottle::default(),
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
            large_receiving: Arc::new(AtomicUsize::new(0)),
            unix_offset_ms: OnceLock::new(),
            bind: None,
            client_memory: Arc::new(crate::text_socket::ClientMemory::new(0)),
            large_reply_ms: crate::config::RESP_LARGE_REPLY_MS,
            slot_routing: crate::slot_routing::SlotRouting::new(),
            checkpoints: None,
        }
    }

    /// The Unix time, in milliseconds, of engine time `now_ms`.
    ///
    /// The engine keeps expiry times on its monotonic clock; EXPIREAT,
    /// SET PXAT and PEXPIRETIME speak Unix time. Converting each with its
    /// own reading of the wall clock made an absolute time come back 1 ms
    /// off whenever the two readings' milliseconds rolled over at
    /// different instants, so the offset between the clocks is read once,
    /// at the first command, and every conversion uses it: an absolute
    /// time then round-trips exactly. The monotonic clock is slewed by NTP
    /// as the wall clock is, so the two only part if the wall clock is
    /// stepped while the server runs; expiry then keeps to the clock the
    /// server started with.
    pub(crate) fn unix_ms_at(&self, now_ms: u64) -> u64 {
        let offset = *self
            .unix_offset_ms
            .get_or_init(|| unix_now_ms() as i64 - now_ms as i64);
        (now_ms as i64).saturating_add(offset).max(0) as u64
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

    /// Reserves `bytes` of [`RESP_LARGE_RECEIVING_BYTES_MAX`] for a large
    /// value about to be received; `None` when that would pass the bound.
    pub(crate) fn reserve_large(&self, bytes: usize) -> Option<Receiving> {
        let total = &self.large_receiving;
        let mut now = total.load(Ordering::Acquire);
        loop {
            let next = now.checked_add(bytes)?;
            if next > RESP_LARGE_RECEIVING_BYTES_MAX {
                return None;
            }
            match total.compare_exchange_weak(now, next, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => {
                    return Some(Receiving {
                        total: total.clone(),
                        bytes,
                    })
                }
                Err(seen) => now = seen,
            }
        }
    }

    /// Bytes of large values being received now (INFO's
    /// `large_receiving_bytes`).
    pub fn large_receiving_bytes(&self) -> usize {
        self.large_receiving.load(Ordering::Acquire)
    }

    /// Asks AUTH for the cluster secret `secret` (unless a RESP password
    /// is set, which then is the only one AUTH accepts).
    pub fn with_secret(mut self, secret: Option<fabrickv_auth::Secret>) -> RespShared {
        self.secret = secret;
        self
    }

    /// Counts failed AUTHs in `throttle` (the server's one).
    pub fn with_throttle(
        mut self,
        throttle: fabrickv_auth::throttle::SharedThrottle,
    ) -> RespShared {
        self.throttle = throttle;
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
            (Some(p), _) => fabrickv_auth::token_matches(p, given),
            (None, Some(s)) => s.matches(given),
            (None, None) => false,
        }
    }

    /// Records the listen address `listen` (`host:port`, `[v6]:port`) so
    /// that CONFIG GET bind answers its host, as Redis answers its own.
    pub fn with_bind(mut self, listen: &str) -> RespShared {
        let host = listen.rsplit_once(':').map_or(listen, |(h, _)| h);
        let host = host.trim_start_matches('[').trim_end_matches(']');
        self.bind = Some(host.to_string());
        self
    }

    /// Shares the server's account of what connections buffer.
    pub(crate) fn with_client_memory(
        mut self,
        mem: Arc<crate::text_socket::ClientMemory>,
    ) -> RespShared {
        self.client_memory = mem;
        self
    }

    /// The server's slot routing, shared with its other front ends.
    pub(crate) fn with_slot_routing(
        mut self,
        slot_routing: Arc<crate::slot_routing::SlotRouting>,
    ) -> RespShared {
        self.slot_routing = slot_routing;
        self
    }

    /// Serves SAVE, BGSAVE and LASTSAVE with `checkpoints`.
    pub fn with_checkpoints(
        mut self,
        checkpoints: Arc<crate::checkpoint::Checkpoints>,
    ) -> RespShared {
        self.checkpoints = Some(checkpoints);
        self
    }

    /// Closes a connection whose reply holding large values waits over
    /// `ms` to be written (0: never).
    pub(crate) fn with_large_reply_ms(mut self, ms: u64) -> RespShared {
        self.large_reply_ms = ms;
        self
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

/// Every command the front-end answers: each file of commands keeps its
/// own commands' metadata beside their handlers, and this gathers them in
/// the order COMMAND COUNT counts them. GET and SET come first, where
/// `table::lookup_index` finds them without a scan.
const GROUPS: &[&[table::Spec]] = &[
    strings::SPECS,
    numbers::SPECS,
    get_set::SPECS,
    value_edit::SPECS,
    expiry::SPECS,
    keyspace::SPECS,
    txn::SPECS,
    conn::SPECS,
    clients::SPECS,
    admin::SPECS,
    cluster::SPECS,
];

/// Commands in [`GROUPS`] together.
const COMMAND_COUNT: usize = {
    let mut n = 0;
    let mut g = 0;
    while g < GROUPS.len() {
        n += GROUPS[g].len();
        g += 1;
    }
    n
};

/// [`GROUPS`] one after another, at compile time.
const COMMANDS_ARRAY: [table::Spec; COMMAND_COUNT] = {
    let mut out = [GROUPS[0][0]; COMMAND_COUNT];
    let (mut i, mut g) = (0, 0);
    while g < GROUPS.len() {
        let mut j = 0;
        while j < GROUPS[g].len() {
            out[i] = GROUPS[g][j];
            i += 1;
            j += 1;
        }
        g += 1;
    }
    out
};

/// Every command the front-end answers, in the order COMMAND COUNT counts
/// them; a command's place here indexes its counters.
const COMMANDS: &[table::Spec] = &COMMANDS_ARRAY;

/// The wall clock as Unix milliseconds (0 if it reads before 1970), for
/// the absolute expiry times of RESP and memcache alike.
pub(crate) fn unix_now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// What one call to [`RespConnState::process`] did.
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
    /// Parsing stopped at a large bulk (offsets into `input`, past
    /// `consumed`): the caller receives it into its own buffer, hands it
    /// over with [`RespConnState::large_received`], and calls again.
    pub large: Option<LargeBulkAt>,
}

impl Processed {
    /// A protocol error has been answered: the stream cannot be trusted
    /// past it, so the connection closes once the replies are written.
    fn protocol_error(&mut self, shared: &RespShared) {
        shared
            .counters
            .protocol_errors
            .fetch_add(1, Ordering::Relaxed);
        self.close = true;
    }
}

/// One RESP connection's protocol state.
pub struct RespConnState {
    parser: CommandParser,
    /// A second parser for the prefetch pass, so the first keeps its spans.
    lookahead: CommandParser,
    state: ConnState,
    /// Command counts not yet added to the server's.
    stats: stats::LocalStats,
    /// A large argument received for the command being parsed.
    large_in: Option<LargeArg>,
    /// The large values the buffered replies refer to.
    pub(crate) large_out: LargeReplies,
    /// Whether a reply buffered since the output was last written whole
    /// may show a write not yet replicated (anything but a settled read):
    /// a replicating server holds such replies for a round.
    pub(crate) replies_unsettled: bool,
}

impl RespConnState {
    /// Whether the connection has authenticated (or needs not): at the
    /// connection cap, one that has not is closed first.
    pub fn authenticated(&self) -> bool {
        self.state.authed
    }

    /// A new connection; `id` is what CLIENT ID answers.
    pub fn new(shared: &RespShared, id: u64) -> RespConnState {
        Self::connected(shared, id, ClientPeer::default())
    }

    /// A new connection from `peer`, listed in the server's client
    /// registry until it is dropped.
    pub fn connected(shared: &RespShared, id: u64, peer: ClientPeer) -> RespConnState {
        RespConnState {
            parser: CommandParser::new(),
            lookahead: CommandParser::new(),
            state: ConnState::new(shared, id, peer),
            stats: stats::LocalStats::default(),
            large_in: None,
            large_out: LargeReplies::default(),
            replies_unsettled: false,
        }
    }

    /// Bytes the connection holds between commands, counted in the
    /// server's `maxmemory-clients`: its queued transaction.
    pub(crate) fn held_bytes(&self) -> usize {
        self.state.multi.as_ref().map_or(0, |t| t.queued.capacity())
    }

    /// Whether CLIENT KILL closed this connection.
    pub fn killed(&self) -> bool {
        self.state.entry.killed()
    }

    /// Whether a large bulk announced by `process` may be received into a
    /// buffer of its own: the connection must be authenticated, so that
    /// no one makes the server allocate before AUTH.
    pub(crate) fn takes_large(&self) -> bool {
        self.state.authed
    }

    /// Hands over the large argument `arg` that `process` stopped at: its
    /// value, or the error reply its command is to get instead of running
    /// (the value was refused and its bytes dropped). `receiving` is held
    /// until the command runs.
    pub(crate) fn large_received(
        &mut self,
        arg: usize,
        value: Result<LargeValue, String>,
        receiving: Option<Receiving>,
    ) {
        self.large_in = Some(LargeArg {
            arg,
            value,
            _receiving: receiving,
        });
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
            unix_ms: shared.unix_ms_at(now_ms),
            many: Vec::new(),
            in_exec: false,
            large_arg: None,
            large_out: std::mem::take(&mut self.large_out),
            read_settled: false,
        };
        let mut done = Processed {
            consumed: 0,
            need: 0,
            close: false,
            hold_until_ms: None,
            large: None,
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
        while done.consumed < input.len() && out.len() + ex.large_out.bytes < RESP_OUTPUT_SOFT_BYTES
        {
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
            match self.parser.parse_large(rest) {
                Ok(ParseLarge::Parse(Parse::Incomplete { need })) => {
                    done.need = need;
                    break;
                }
                Ok(ParseLarge::LargeBulk {
                    header_at,
                    data_at,
                    len,
                    arg,
                }) => {
                    if self.large_in.is_some() {
                        // The one this connection holds is for this
                        // command: a second would be two at once.
                        self.large_in = None;
                        resp::error(
                            &mut out,
                            "ERR Protocol error: one bulk argument over 1 MiB per command",
                        );
                        done.protocol_error(shared);
                        break;
                    }
                    let at = done.consumed;
                    done.large = Some(LargeBulkAt {
                        header_at: at + header_at,
                        data_at: at + data_at,
                        len,
                        arg,
                    });
                    break;
                }
                Ok(ParseLarge::Parse(Parse::Complete { consumed })) => {
                    let cmd = &rest[..consumed];
                    done.consumed += consumed;
                    if self.parser.argc() == 0 {
                        self.large_in = None;
                        continue;
                    }
                    shared.counters.commands.fetch_add(1, Ordering::Relaxed);
                    let args = Args {
                        parser: &self.parser,
                        buf: cmd,
                    };
                    if let Some(large) = self.large_in.take() {
                        if let Some(refusal) = refuse_large(&self.state, args, &large) {
                            // Queued in MULTI, it makes EXEC abort.
                            self.state.txn_error();
                            resp::error(&mut out, &refusal);
                            continue;
                        }
                        ex.large_arg = large.value.ok();
                    }
                    let mark = out.len();
                    ex.read_settled = false;
                    let after = self.state.command(&mut ex, args, &mut out);
                    self.replies_unsettled |= !ex.read_settled;
                    if ex.large_arg.take().is_some() && out.get(mark) != Some(&b'-') {
                        // The command did not take the value: it must not
                        // go on as if it had an empty one. A command that
                        // refused keeps its own answer (a `-MOVED` for
                        // another server's slot, which a cluster client
                        // follows).
                        out.truncate(mark);
                        resp::error(&mut out, LARGE_NOT_TAKEN);
                    }
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
                    done.protocol_error(shared);
                    break;
                }
            }
        }
        let nanos = u64::try_from(started.elapsed().as_nanos()).unwrap_or(u64::MAX);
        shared.stats.flush(&mut self.stats, nanos);
        self.large_out = ex.large_out;
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

/// The reply to a command whose large argument it could not take.
const LARGE_NOT_TAKEN: &str =
    "ERR values over 1 MiB are taken only by SET key value [options] on database 0";

/// Why a command with a received large argument may not run (the error
/// reply), or `None` when it may: only SET takes one, as its value, on
/// the in-memory kv (database 0), from an authenticated connection.
fn refuse_large(state: &ConnState, a: Args<'_>, large: &LargeArg) -> Option<String> {
    if let Err(e) = &large.value {
        return Some(e.clone());
    }
    if !state.authed {
        return Some("NOAUTH Authentication required.".into());
    }
    if state.multi.is_some() {
        return Some("ERR values over 1 MiB cannot be queued in a transaction".into());
    }
    let is_set = fabrickv_resp::eq_ignore_case(a.get(0), b"set");
    if !is_set || large.arg != 2 || state.db != 0 {
        return Some(LARGE_NOT_TAKEN.into());
    }
    None
}

#[cfg(test)]
mod tests;
