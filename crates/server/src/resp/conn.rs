//! One RESP connection's state (authenticated? which database?) and the
//! command dispatch that reads and changes it: name lookup, the AUTH
//! gate, arity, then the command's own code.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use fabrickv_resp::parse_i64;
use fabrickv_resp::reply::{self as resp, Proto, Reply};

use super::admin::{bgsave, command_info, config, info, lastsave, save, time};
use super::args::{int_arg, quote_arg, quoted, Args, ERROR_ARG_QUOTE_BYTES_MAX, NOT_INTEGER};
use super::clients::{self, ClientEntry, ClientPeer, ClientRegistry};
use super::cluster::{ClusterConn, Gate};
use super::exec::Exec;
use super::table::{lookup_index, lower, spec, Cmd, Spec, COMMAND_NAME_BYTES_MAX, NO_KEYS};
use super::txn_state::{Txn, Watched};
use super::COMMANDS;
use super::{shard_db, RespShared};

/// What COMMAND reports about the commands in this file (PING, ECHO, AUTH, SELECT, QUIT, HELLO),
/// with Redis 7's values; `table` gathers every file's into the table.
#[rustfmt::skip]
pub(super) const SPECS: &[Spec] = &[
    spec! { "ping" Ping -1 ["fast", "sentinel"] (0, 0, 0) ["@fast", "@connection"] NO_KEYS "connection" "1.0.0" "O(1)" "Returns the server's liveliness response." ["request_policy:all_shards", "response_policy:all_succeeded"] },
    spec! { "echo" Echo 2 ["fast"] (0, 0, 0) ["@fast", "@connection"] NO_KEYS "connection" "1.0.0" "O(1)" "Returns the given string." [] },
    spec! { "auth" Auth -2 ["noscript", "loading", "stale", "fast", "no_auth", "sentinel", "allow_busy"] (0, 0, 0) ["@fast", "@connection"] NO_KEYS "connection" "1.0.0" "O(N) where N is the number of passwords defined for the user" "Authenticates the connection." [] },
    spec! { "select" Select 2 ["loading", "stale", "fast"] (0, 0, 0) ["@fast", "@connection"] NO_KEYS "connection" "1.0.0" "O(1)" "Changes the selected database." [] },
    spec! { "quit" Quit -1 ["allow_busy", "noscript", "loading", "stale", "fast", "no_auth"] (0, 0, 0) ["@fast", "@connection"] NO_KEYS "connection" "1.0.0" "O(1)" "Closes the connection." [] },
    spec! { "hello" Hello -1 ["noscript", "loading", "stale", "fast", "no_auth", "sentinel", "allow_busy"] (0, 0, 0) ["@fast", "@connection"] NO_KEYS "connection" "6.0.0" "O(1)" "Handshakes with the Redis server." [] },
];

/// What a connection's commands can change about it.
pub(super) struct ConnState {
    /// Whether AUTH succeeded (or no password or secret is set); until
    /// then only AUTH and QUIT run.
    pub(super) authed: bool,
    /// Failed AUTHs on this connection: each makes the next reply wait
    /// longer ([`super::auth_delay_ms`]).
    pub(super) auth_failures: u32,
    /// Where the connection comes from, as the server's failure throttle
    /// counts it (read only when AUTH is required).
    source: fabrickv_auth::throttle::Source,
    /// What CLIENT ID answers.
    pub(super) id: u64,
    /// The selected database: 0 the in-memory kv, n the n-th shard.
    pub(super) db: usize,
    /// The transaction being queued, after MULTI.
    pub(super) multi: Option<Txn>,
    /// The keys WATCH recorded, until EXEC, DISCARD or UNWATCH.
    pub(super) watched: Vec<Watched>,
    /// The protocol its replies are written in (HELLO changes it).
    pub(super) proto: Proto,
    /// What CLIENT LIST shows of it; listed in `registry` while it lives.
    pub(super) entry: Arc<ClientEntry>,
    registry: Arc<ClientRegistry>,
    /// The table index of the last command looked up (None: unknown).
    pub(super) last: Option<usize>,
    /// The last command was refused before it ran (arity, NOAUTH).
    pub(super) rejected: bool,
    /// Its view of the cluster's slot map, and READONLY.
    pub(super) cluster: ClusterConn,
}

impl Drop for ConnState {
    fn drop(&mut self) {
        self.registry.remove(self.entry.id);
    }
}

impl ConnState {
    /// A new connection's state: authenticated when no password is set,
    /// on database 0.
    pub(super) fn new(shared: &RespShared, id: u64, peer: ClientPeer) -> ConnState {
        let source = if shared.auth_required() {
            fabrickv_auth::throttle::Source::of(peer.addr.parse().ok())
        } else {
            fabrickv_auth::throttle::Source::Unknown
        };
        let entry = Arc::new(ClientEntry::new(id, peer));
        // A connection past the registry's bound still works; it is only
        // missing from CLIENT LIST and out of CLIENT KILL's reach.
        if !shared.clients.add(entry.clone()) {
            tracing::debug!("client registry full: connection {id} is not listed");
        }
        ConnState {
            authed: !shared.auth_required(),
            auth_failures: 0,
            source,
            id,
            db: 0,
            multi: None,
            watched: Vec::new(),
            proto: Proto::Resp2,
            entry,
            registry: shared.clients.clone(),
            last: None,
            rejected: false,
            cluster: ClusterConn::new(shared),
        }
    }

    /// Runs one parsed command: the AUTH gate, lookup and arity, then the
    /// database (a keyed command on a shard runs there) and the command.
    pub(super) fn command(&mut self, ex: &mut Exec<'_>, a: Args<'_>, out: &mut Reply<'_>) -> After {
        let mut name_buf = [0u8; COMMAND_NAME_BYTES_MAX];
        let name = lower(a.get(0), &mut name_buf);
        self.last = lookup_index(name);
        self.rejected = false;
        if let Some(i) = self.last {
            self.entry.last_cmd.store(i + 1, Ordering::Relaxed);
        }
        if !self.authed && name != b"auth" && name != b"quit" && name != b"hello" {
            self.rejected = true;
            resp::error(out, "NOAUTH Authentication required.");
            return After::Continue;
        }
        let argc = a.len();
        let Some(spec) = self.last.and_then(|i| COMMANDS.get(i)) else {
            self.txn_error();
            unknown_command(out, a);
            return After::Continue;
        };
        // PING takes at most one argument, though its arity is -1.
        let ping_extra = matches!(spec.id, Cmd::Ping) && argc > 2;
        if ping_extra
            || (spec.arity >= 0 && argc != spec.arity as usize)
            || (spec.arity < 0 && argc < spec.arity.unsigned_abs() as usize)
        {
            self.txn_error();
            self.rejected = true;
            resp::error(
                out,
                &format!("ERR wrong number of arguments for '{}' command", spec.name),
            );
            return After::Continue;
        }
        // A key another server serves is redirected before anything,
        // MULTI's queue included, as Redis Cluster does.
        match self.cluster.gate(self.db, ex.shared, spec, a, out) {
            Gate::Run => {}
            Gate::Refused => {
                self.txn_error();
                self.rejected = true;
                return After::Continue;
            }
            Gate::Close => return After::Close,
        }
        if let Some(after) = self.txn_gate(ex, spec, a, out) {
            return after;
        }
        if self.db != 0 && kv_only(spec.id) {
            resp::error(
                out,
                &format!(
                    "ERR {} is not supported on a persistent shard database; SELECT 0 first",
                    spec.name.to_uppercase()
                ),
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
            Cmd::Auth => return self.auth(ex.shared, a, out),
            Cmd::Select => match parse_i64(a.get(1)) {
                Some(n) if n >= 0 && n as u64 <= ex.shared.dbs.len() as u64 => {
                    self.db = n as usize;
                    self.entry.db.store(n as u64, Ordering::Relaxed);
                    resp::simple(out, "OK")
                }
                Some(_) => resp::error(out, "ERR DB index is out of range"),
                None => resp::error(out, NOT_INTEGER),
            },
            Cmd::Dbsize => resp::integer(out, ex.items() as i64),
            Cmd::Info => {
                // INFO locks every partition in turn for its counters.
                ex.held = None;
                info(ex.shared, a, out)
            }
            Cmd::Config => config(ex.shared, a, out),
            Cmd::Command => command_info(a, out),
            Cmd::Client => {
                clients::client(&self.registry, &self.entry, a, ex.now_ms, out);
                // CLIENT KILL ... SKIPME no may have named this connection.
                if self.entry.killed() {
                    return After::Close;
                }
            }
            Cmd::Hello => return self.hello(ex.shared, a, out),
            Cmd::Time => time(out),
            Cmd::Save => {
                // The walk takes every partition's lock in turn.
                ex.held = None;
                save(ex.shared, out)
            }
            Cmd::Bgsave => bgsave(ex.shared, out),
            Cmd::Lastsave => lastsave(ex.shared, out),
            Cmd::Cluster => self.cluster.command(ex.shared, a, out),
            Cmd::Readonly | Cmd::Readwrite | Cmd::Asking => {
                self.cluster.mode(ex.shared, spec.id, out)
            }
            Cmd::Quit => {
                resp::simple(out, "OK");
                return After::Close;
            }
            id => ex.more(id, a, out),
        }
        After::Continue
    }

    /// AUTH [default] PASSWORD: the RESP password if one is set, else the
    /// cluster secret. A wrong one is counted and holds the connection's
    /// replies for a delay that doubles with each failure on it.
    ///
    /// With no password set it answers as Redis 7 does: more than two
    /// arguments is a syntax error, one is the "without any password"
    /// error, and two (user and password) is Redis's passwordless
    /// `default` user, which takes any password (as HELLO ... AUTH does).
    pub(super) fn auth(&mut self, shared: &RespShared, a: Args<'_>, out: &mut Reply<'_>) -> After {
        if !shared.auth_required() {
            match a.len() {
                2 => resp::error(
                    out,
                    "ERR AUTH <password> called without any password configured for the default user. Are you sure your configuration is correct?",
                ),
                3 if a.get(1) == b"default" => resp::simple(out, "OK"),
                3 => resp::error(
                    out,
                    "WRONGPASS invalid username-password pair or user is disabled.",
                ),
                _ => resp::error(out, "ERR syntax error"),
            }
            return After::Continue;
        }
        let (user, given) = match a.len() {
            2 => (&b"default"[..], a.get(1)),
            3 => (a.get(1), a.get(2)),
            _ => {
                resp::error(out, "ERR syntax error");
                return After::Continue;
            }
        };
        match self.check_password(shared, user, given, out) {
            Ok(()) => {
                resp::simple(out, "OK");
                After::Continue
            }
            Err(hold) => hold,
        }
    }

    /// The AUTH check that AUTH and HELLO ... AUTH share: on success the
    /// connection is authenticated and nothing is written; on failure the
    /// WRONGPASS reply is written, counted (on the connection, and per
    /// source in the server's throttle), and the delay returned. While the
    /// throttle refuses the connection's source, the password is not
    /// judged at all: `-AUTH_THROTTLED` is answered at once.
    fn check_password(
        &mut self,
        shared: &RespShared,
        user: &[u8],
        given: &[u8],
        out: &mut Reply<'_>,
    ) -> Result<(), After> {
        if let Err(t) = shared.throttle.check(self.source) {
            resp::error(out, &format!("AUTH_THROTTLED {t}"));
            return Err(After::Continue);
        }
        // Both checks run whatever the user, so the time says nothing.
        let accepted = shared.auth_accepts(given);
        if user == b"default" && accepted {
            self.authed = true;
            return Ok(());
        }
        resp::error(
            out,
            "WRONGPASS invalid username-password pair or user is disabled.",
        );
        shared.throttle.failed(self.source);
        shared
            .counters
            .auth_failures
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.auth_failures = self.auth_failures.saturating_add(1);
        Err(After::Hold {
            delay_ms: super::auth_delay_ms(self.auth_failures),
        })
    }

    /// HELLO [protover [AUTH username password] [SETNAME clientname]]:
    /// authenticates (as AUTH does), names the connection, switches its
    /// protocol, and answers with what the server is, as Redis does.
    fn hello(&mut self, shared: &RespShared, a: Args<'_>, out: &mut Reply<'_>) -> After {
        let mut proto = None;
        let mut next = 1;
        if a.len() >= 2 {
            match parse_i64(a.get(1)) {
                Some(2) => proto = Some(Proto::Resp2),
                Some(3) => proto = Some(Proto::Resp3),
                Some(_) => {
                    resp::error(out, "NOPROTO unsupported protocol version");
                    return After::Continue;
                }
                None => {
                    resp::error(
                        out,
                        "ERR Protocol version is not an integer or out of range",
                    );
                    return After::Continue;
                }
            }
            next = 2;
        }
        let mut auth = None;
        let mut name = None;
        while next < a.len() {
            let more = a.len() - 1 - next;
            let mut buf = [0u8; COMMAND_NAME_BYTES_MAX];
            match lower(a.get(next), &mut buf) {
                b"auth" if more >= 2 => {
                    auth = Some((a.get(next + 1), a.get(next + 2)));
                    next += 3;
                }
                b"setname" if more >= 1 => {
                    name = Some(a.get(next + 1));
                    next += 2;
                }
                _ => {
                    let opt = a.get(next);
                    let shown = quoted(opt);
                    resp::error(out, &format!("ERR Syntax error in HELLO option '{shown}'"));
                    return After::Continue;
                }
            }
        }
        if let Some((user, pass)) = auth {
            // With no password set every connection is open already, and
            // Redis's passwordless default user takes any password.
            if shared.auth_required() {
                if let Err(hold) = self.check_password(shared, user, pass, out) {
                    return hold;
                }
            } else if user != b"default" {
                resp::error(
                    out,
                    "WRONGPASS invalid username-password pair or user is disabled.",
                );
                return After::Continue;
            }
        }
        if !self.authed {
            resp::error(
                out,
                "NOAUTH HELLO must be called with the client already authenticated, otherwise the HELLO <proto> AUTH <user> <pass> option can be used to authenticate the client and select the RESP protocol version at the same time",
            );
            return After::Continue;
        }
        if let Some(name) = name {
            if let Err(e) = self.entry.set_name(name) {
                resp::error(out, e);
                return After::Continue;
            }
        }
        if let Some(p) = proto {
            self.proto = p;
            self.entry.set_proto(p);
            out.set_proto(p);
        }
        out.map_header(7);
        resp::bulk(out, b"server");
        resp::bulk(out, b"redis");
        resp::bulk(out, b"version");
        resp::bulk(out, super::REDIS_VERSION.as_bytes());
        resp::bulk(out, b"proto");
        resp::integer(out, self.proto.version());
        resp::bulk(out, b"id");
        resp::integer(out, self.id as i64);
        resp::bulk(out, b"mode");
        resp::bulk(out, b"standalone");
        resp::bulk(out, b"role");
        resp::bulk(out, b"master");
        resp::bulk(out, b"modules");
        resp::array_header(out, 0);
        After::Continue
    }
}

/// Whether `id` is one of the commands that only the in-memory kv
/// (database 0) answers; on a shard database they are refused.
fn kv_only(id: Cmd) -> bool {
    matches!(
        id,
        Cmd::Flushdb
            | Cmd::Flushall
            | Cmd::Setex
            | Cmd::Psetex
            | Cmd::Setnx
            | Cmd::Msetnx
            | Cmd::Getex
            | Cmd::Getdel
            | Cmd::Getset
            | Cmd::Append
            | Cmd::Getrange
            | Cmd::Substr
            | Cmd::Setrange
            | Cmd::Incrbyfloat
            | Cmd::Lcs
            | Cmd::Expireat
            | Cmd::Pexpireat
            | Cmd::Expiretime
            | Cmd::Pexpiretime
            | Cmd::Touch
            | Cmd::Unlink
            | Cmd::Type
            | Cmd::Rename
            | Cmd::Renamenx
            | Cmd::Copy
            | Cmd::Keys
            | Cmd::Scan
            | Cmd::Randomkey
    )
}

/// Whether the connection goes on after a command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum After {
    Continue,
    Close,
    /// Send nothing more, and run nothing more, for `delay_ms` (a failed
    /// AUTH).
    Hold {
        delay_ms: u64,
    },
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
