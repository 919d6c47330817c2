//! One RESP connection's state (authenticated? which database?) and the
//! command dispatch that reads and changes it: name lookup, the AUTH
//! gate, arity, then the command's own code.

use fabrickv_resp::parse_i64;
use fabrickv_resp::reply as resp;

use super::admin::{command_info, config, info};
use super::args::{int_arg, Args, NOT_INTEGER};
use super::exec::Exec;
use super::table::{lookup, lower, Cmd, COMMAND_NAME_BYTES_MAX};
use super::txn_state::{Txn, Watched};
use super::{shard_db, RespShared};

/// Longest argument quoted back in an "unknown command" error, in bytes.
const ERROR_ARG_QUOTE_BYTES_MAX: usize = 128;

/// What a connection's commands can change about it.
pub(super) struct ConnState {
    /// Whether AUTH succeeded (or no password or secret is set); until
    /// then only AUTH and QUIT run.
    pub(super) authed: bool,
    /// Failed AUTHs on this connection: each makes the next reply wait
    /// longer ([`super::auth_delay_ms`]).
    pub(super) auth_failures: u32,
    /// What CLIENT ID answers.
    pub(super) id: u64,
    /// The selected database: 0 the in-memory kv, n the n-th shard.
    pub(super) db: usize,
    /// The transaction being queued, after MULTI.
    pub(super) multi: Option<Txn>,
    /// The keys WATCH recorded, until EXEC, DISCARD or UNWATCH.
    pub(super) watched: Vec<Watched>,
}

impl ConnState {
    /// A new connection's state: authenticated when no password is set,
    /// on database 0.
    pub(super) fn new(shared: &RespShared, id: u64) -> ConnState {
        ConnState {
            authed: !shared.auth_required(),
            auth_failures: 0,
            id,
            db: 0,
            multi: None,
            watched: Vec::new(),
        }
    }

    /// Runs one parsed command: the AUTH gate, lookup and arity, then the
    /// database (a keyed command on a shard runs there) and the command.
    pub(super) fn command(&mut self, ex: &mut Exec<'_>, a: Args<'_>, out: &mut Vec<u8>) -> After {
        let mut name_buf = [0u8; COMMAND_NAME_BYTES_MAX];
        let name = lower(a.get(0), &mut name_buf);
        if !self.authed && name != b"auth" && name != b"quit" {
            resp::error(out, "NOAUTH Authentication required.");
            return After::Continue;
        }
        let argc = a.len();
        let Some(spec) = lookup(name) else {
            self.txn_error();
            unknown_command(out, a);
            return After::Continue;
        };
        if (spec.arity >= 0 && argc != spec.arity as usize)
            || (spec.arity < 0 && argc < spec.arity.unsigned_abs() as usize)
        {
            self.txn_error();
            resp::error(
                out,
                &format!("ERR wrong number of arguments for '{}' command", spec.name),
            );
            return After::Continue;
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
            Cmd::Client => self.client(a, out),
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
    pub(super) fn auth(&mut self, shared: &RespShared, a: Args<'_>, out: &mut Vec<u8>) -> After {
        if !shared.auth_required() {
            resp::error(
                out,
                "ERR AUTH <password> called without any password configured for the default user. Are you sure your configuration is correct?",
            );
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
        // Both checks run whatever the user, so the time says nothing.
        let accepted = shared.auth_accepts(given);
        if user == b"default" && accepted {
            self.authed = true;
            resp::simple(out, "OK");
            return After::Continue;
        }
        resp::error(
            out,
            "WRONGPASS invalid username-password pair or user is disabled.",
        );
        shared
            .counters
            .auth_failures
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.auth_failures = self.auth_failures.saturating_add(1);
        After::Hold {
            delay_ms: super::auth_delay_ms(self.auth_failures),
        }
    }

    pub(super) fn client(&mut self, a: Args<'_>, out: &mut Vec<u8>) {
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

/// Compares a password without stopping at the first differing byte.
pub(super) fn same_secret(given: &[u8], expected: &[u8]) -> bool {
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
