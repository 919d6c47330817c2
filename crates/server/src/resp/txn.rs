//! Transactions: MULTI, EXEC, DISCARD, WATCH and UNWATCH.
//!
//! After MULTI a connection's commands are checked (name, arity) and
//! queued, as their bytes, instead of run; EXEC locks every partition in
//! ascending order (the order every multi-partition lock is taken in, so
//! two never wait on each other), checks the watched keys, runs the queue
//! and only then lets go, so no other client, RESP or native, sees part
//! of a transaction. A queue-time error makes EXEC answer EXECABORT.
//!
//! WATCH records each key's modification counter ([`Partition::key_version`],
//! which every write, delete, expiry and eviction bumps in the engine)
//! and, for a key with an expiry, when it expires. EXEC aborts with a
//! null array if any counter moved or a watched key's time ran out. Keys
//! sharing a counter can abort a transaction that need not have aborted
//! (see `fabrickv_engine::WATCH_VERSION_SLOTS`), never the reverse.
//!
//! Transactions run on database 0 (the in-memory kv) only.
//!
//! [`Partition::key_version`]: fabrickv_engine::Partition::key_version

use fabrickv_engine::GetResult;
use fabrickv_resp::reply as resp;
use fabrickv_resp::reply::Reply;
use fabrickv_resp::{CommandParser, Parse};
use fabrickv_types::KeyHash;

use super::args::{storable_key, Args};
use super::conn::{After, ConnState};
use super::exec::Exec;
use super::table::{spec, Cmd, Spec, KEYS_RO, NO_KEYS};
use super::txn_state::{Txn, Watched};

/// What COMMAND reports about the commands in this file (MULTI, EXEC, DISCARD, WATCH, UNWATCH),
/// with Redis 7's values; `table` gathers every file's into the table.
#[rustfmt::skip]
pub(super) const SPECS: &[Spec] = &[
    spec! { "multi" Multi 1 ["noscript", "loading", "stale", "fast", "allow_busy"] (0, 0, 0) ["@fast", "@transaction"] NO_KEYS "transactions" "1.2.0" "O(1)" "Starts a transaction." [] },
    spec! { "exec" Exec 1 ["noscript", "loading", "stale", "skip_slowlog"] (0, 0, 0) ["@slow", "@transaction"] NO_KEYS "transactions" "1.2.0" "The sum of the queued commands'" "Runs the commands queued since MULTI, all at once." [] },
    spec! { "discard" Discard 1 ["noscript", "loading", "stale", "fast", "allow_busy"] (0, 0, 0) ["@fast", "@transaction"] NO_KEYS "transactions" "2.0.0" "O(N) in the queued commands" "Drops the commands queued since MULTI." [] },
    spec! { "watch" Watch -2 ["noscript", "loading", "stale", "fast", "allow_busy"] (1, -1, 1) ["@fast", "@transaction"] KEYS_RO "transactions" "2.2.0" "O(1) per key" "Makes the next EXEC fail if any of these keys changes first." [] },
    spec! { "unwatch" Unwatch 1 ["noscript", "loading", "stale", "fast", "allow_busy"] (0, 0, 0) ["@fast", "@transaction"] NO_KEYS "transactions" "2.2.0" "O(1)" "Forgets every key WATCH recorded." [] },
];

/// Most commands one transaction may queue; one more discards it.
pub(super) const TXN_QUEUED_COMMANDS_MAX: usize = 100_000;

/// Most bytes of commands one transaction may queue, in bytes; more
/// discards it.
pub(super) const TXN_QUEUED_BYTES_MAX: usize = 64 << 20;

/// Most keys one connection may watch at once; more are refused.
pub(super) const WATCHED_KEYS_MAX: usize = 10_000;

impl ConnState {
    /// Marks the open transaction (if any) as failed at queue time.
    pub(super) fn txn_error(&mut self) {
        if let Some(t) = &mut self.multi {
            t.dirty = true;
        }
    }

    /// Runs the transaction commands, and queues any other command while
    /// a transaction is open. `None`: not handled here, run it as usual.
    pub(super) fn txn_gate(
        &mut self,
        ex: &mut Exec<'_>,
        spec: &Spec,
        a: Args<'_>,
        out: &mut Reply<'_>,
    ) -> Option<After> {
        match spec.id {
            Cmd::Multi => {
                if self.multi.is_some() {
                    resp::error(out, "ERR MULTI calls can not be nested");
                } else if self.db != 0 {
                    resp::error(
                        out,
                        "ERR MULTI is not supported on a persistent shard database; SELECT 0 first",
                    );
                } else {
                    self.multi = Some(Txn::default());
                    resp::simple(out, "OK");
                }
            }
            Cmd::Exec => self.exec(ex, out),
            Cmd::Discard => match self.multi.take() {
                Some(_) => {
                    self.watched.clear();
                    resp::simple(out, "OK");
                }
                None => resp::error(out, "ERR DISCARD without MULTI"),
            },
            Cmd::Watch if self.multi.is_some() => {
                resp::error(out, "ERR WATCH inside MULTI is not allowed")
            }
            Cmd::Watch => self.watch(ex, a, out),
            Cmd::Unwatch if self.multi.is_none() => {
                self.watched.clear();
                resp::simple(out, "OK");
            }
            Cmd::Quit => return None,
            _ if self.multi.is_some() => self.queue(spec, a, out),
            _ => return None,
        }
        Some(After::Continue)
    }

    /// Queues one command of an open transaction.
    fn queue(&mut self, spec: &Spec, a: Args<'_>, out: &mut Vec<u8>) {
        if matches!(spec.id, Cmd::Select | Cmd::Auth | Cmd::Info) {
            self.txn_error();
            return resp::error(
                out,
                &format!(
                    "ERR {} is not allowed inside MULTI on FabricKV",
                    spec.name.to_uppercase()
                ),
            );
        }
        let Some(t) = &mut self.multi else {
            return;
        };
        if t.count + 1 > TXN_QUEUED_COMMANDS_MAX
            || t.queued.len() + a.buf.len() > TXN_QUEUED_BYTES_MAX
        {
            self.multi = None;
            self.watched.clear();
            return resp::error(
                out,
                &format!(
                    "ERR transaction discarded: it would queue more than {TXN_QUEUED_COMMANDS_MAX} commands or {TXN_QUEUED_BYTES_MAX} bytes"
                ),
            );
        }
        t.queued.extend_from_slice(a.buf);
        t.count += 1;
        resp::simple(out, "QUEUED");
    }

    /// WATCH key...: records each key's counter and expiry.
    fn watch(&mut self, ex: &mut Exec<'_>, a: Args<'_>, out: &mut Vec<u8>) {
        if self.watched.len() + a.len() - 1 > WATCHED_KEYS_MAX {
            return resp::error(
                out,
                &format!("ERR a connection may watch at most {WATCHED_KEYS_MAX} keys"),
            );
        }
        let now = ex.now_ms;
        for i in 1..a.len() {
            let key = a.get(i);
            let hash = KeyHash::of(key);
            let part = ex.shared.parts.index_of(hash);
            let p = ex.part_at(part);
            // Looked up first: a lookup that reclaims an expired copy
            // bumps the counter, and the watch starts after that.
            let expire_at_ms = if storable_key(key) {
                match p.get(hash, key, now) {
                    GetResult::Found { expire_at_ms, .. } => expire_at_ms,
                    GetResult::NotFound => 0,
                }
            } else {
                0
            };
            let version = p.key_version(hash);
            self.watched.push(Watched {
                part,
                hash,
                version,
                expire_at_ms,
            });
        }
        resp::simple(out, "OK");
    }

    /// EXEC: the queued commands with every partition locked, or a null
    /// array when a watched key changed, or EXECABORT.
    fn exec(&mut self, ex: &mut Exec<'_>, out: &mut Reply<'_>) {
        let Some(t) = self.multi.take() else {
            return resp::error(out, "ERR EXEC without MULTI");
        };
        let watched = std::mem::take(&mut self.watched);
        if t.dirty {
            return resp::error(
                out,
                "EXECABORT Transaction discarded because of previous errors.",
            );
        }
        ex.lock_all();
        ex.in_exec = true;
        let now = ex.now_ms;
        let changed = watched.iter().any(|w| {
            let p = ex.part_at(w.part);
            p.key_version(w.hash) != w.version || (w.expire_at_ms != 0 && w.expire_at_ms <= now)
        });
        if changed {
            out.null_array();
        } else {
            resp::array_header(out, t.count);
            let mut parser = CommandParser::new();
            let mut at = 0;
            while at < t.queued.len() {
                let rest = &t.queued[at..];
                let Ok(Parse::Complete { consumed }) = parser.parse(rest) else {
                    // Every queued command parsed once already.
                    debug_assert!(false, "a queued command no longer parses");
                    break;
                };
                let args = Args {
                    parser: &parser,
                    buf: &rest[..consumed],
                };
                let _ = self.command(ex, args, out);
                at += consumed;
            }
        }
        ex.in_exec = false;
        ex.many.clear();
    }
}
