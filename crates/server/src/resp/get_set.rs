//! The GET and SET variants on the in-memory kv: with an expiry (SETEX,
//! PSETEX, GETEX), only when absent (SETNX, MSETNX), reading and removing
//! (GETDEL) or reading and replacing (GETSET).

use fabrickv_engine::{GetResult, PutCond, PutResult};
use fabrickv_resp::reply as resp;
use fabrickv_resp::reply::Reply;
use fabrickv_types::KeyHash;

use super::args::{check_key, int_arg, Args, NOT_INTEGER};
use super::exec::{put_error, Exec};
use super::table::{
    lower, spec, Spec, COMMAND_NAME_BYTES_MAX, KEY_OW_INSERT, KEY_OW_UPDATE, KEY_RW_DELETE,
    KEY_RW_UPDATE, PAIRS_OW_INSERT,
};

/// What COMMAND reports about the commands in this file (SETEX, PSETEX, SETNX, MSETNX, GETEX, GETDEL, GETSET),
/// with Redis 7's values; `table` gathers every file's into the table.
#[rustfmt::skip]
pub(super) const SPECS: &[Spec] = &[
    spec! { "setex" Setex 4 ["write", "denyoom"] (1, 1, 1) ["@write", "@string", "@slow"] KEY_OW_UPDATE "string" "2.0.0" "O(1)" "Sets a key's value and its expiry in seconds." [] },
    spec! { "psetex" Psetex 4 ["write", "denyoom"] (1, 1, 1) ["@write", "@string", "@slow"] KEY_OW_UPDATE "string" "2.6.0" "O(1)" "Sets a key's value and its expiry in milliseconds." [] },
    spec! { "setnx" Setnx 3 ["write", "denyoom", "fast"] (1, 1, 1) ["@write", "@string", "@fast"] KEY_OW_INSERT "string" "1.0.0" "O(1)" "Sets a key's value only when the key is absent." [] },
    spec! { "msetnx" Msetnx -3 ["write", "denyoom"] (1, -1, 2) ["@write", "@string", "@slow"] PAIRS_OW_INSERT "string" "1.0.1" "O(N) in the keys set" "Sets several keys only when none of them exists." ["request_policy:multi_shard", "response_policy:agg_min"] },
    spec! { "getex" Getex -2 ["write", "fast"] (1, 1, 1) ["@write", "@string", "@fast"] KEY_RW_UPDATE "string" "6.2.0" "O(1)" "Returns a key's value and changes its expiry." [] },
    spec! { "getdel" Getdel 2 ["write", "fast"] (1, 1, 1) ["@write", "@string", "@fast"] KEY_RW_DELETE "string" "6.2.0" "O(1)" "Returns a key's value and deletes the key." [] },
    spec! { "getset" Getset 3 ["write", "denyoom", "fast"] (1, 1, 1) ["@write", "@string", "@fast"] KEY_RW_UPDATE "string" "1.0.0" "O(1)" "Sets a key's value and returns the previous one." [] },
];

impl Exec<'_> {
    /// The engine time of the expiry argument `n` in units of `unit_ms`
    /// (SET EX/PX/EXAT/PXAT, SETEX, PSETEX, GETEX): relative to now, or
    /// with `absolute` a Unix time; a time already past is `now` (the key
    /// expires at once). `None` where Redis's `getExpireMillisecondsOrReply`
    /// answers "invalid expire time": `n` not above 0, or a time in
    /// milliseconds that does not fit an `i64`. Any time that fits is
    /// kept exactly (the engine's `u64` holds it), so PEXPIRETIME reads
    /// back what was set.
    pub(super) fn expiry_at(&self, n: i64, unit_ms: u64, absolute: bool) -> Option<u64> {
        if n <= 0 {
            return None;
        }
        let ms = n.checked_mul(unit_ms as i64)?;
        let unix_now = self.unix_ms as i64;
        let unix_at = if absolute {
            ms
        } else {
            ms.checked_add(unix_now)?
        };
        if unix_at <= unix_now {
            return Some(self.now_ms);
        }
        Some(self.now_ms + (unix_at - unix_now) as u64)
    }

    /// Stores `value` under `key` with expiry `at` (0: none); `OK` or the
    /// engine's refusal.
    fn store(&mut self, key: &[u8], value: &[u8], at: u64, out: &mut Vec<u8>) {
        let now = self.now_ms;
        let h = KeyHash::of(key);
        match self.part(h).put(h, key, value, at, PutCond::Always, now) {
            PutResult::Stored => resp::simple(out, "OK"),
            r => put_error(out, r),
        }
    }

    /// SETEX and PSETEX key amount value.
    pub(super) fn setex(&mut self, a: Args<'_>, unit_ms: u64, name: &str, out: &mut Vec<u8>) {
        let key = a.get(1);
        if !check_key(key, out) {
            return;
        }
        let Ok(n) = int_arg(a.get(2)) else {
            return resp::error(out, NOT_INTEGER);
        };
        let Some(at) = self.expiry_at(n, unit_ms, false) else {
            return resp::error(out, &format!("ERR invalid expire time in '{name}' command"));
        };
        self.store(key, a.get(3), at, out);
    }

    /// SETNX key value: 1 if stored, 0 if the key existed.
    pub(super) fn setnx(&mut self, a: Args<'_>, out: &mut Vec<u8>) {
        let key = a.get(1);
        if !check_key(key, out) {
            return;
        }
        let now = self.now_ms;
        let h = KeyHash::of(key);
        match self
            .part(h)
            .put(h, key, a.get(2), 0, PutCond::IfAbsent, now)
        {
            PutResult::Stored => resp::integer(out, 1),
            PutResult::ConditionFailed => resp::integer(out, 0),
            r => put_error(out, r),
        }
    }

    /// MSETNX: every key's partition locked together; nothing is written
    /// if any key exists, and a store that fills up half way takes back
    /// what it wrote (the keys were all absent).
    pub(super) fn msetnx(&mut self, a: Args<'_>, out: &mut Vec<u8>) {
        if a.len().is_multiple_of(2) {
            return resp::error(out, "ERR wrong number of arguments for 'msetnx' command");
        }
        for i in (1..a.len()).step_by(2) {
            if !check_key(a.get(i), out) {
                return;
            }
        }
        self.lock_keys((1..a.len()).step_by(2).map(|i| a.get(i)));
        let r = self.msetnx_locked(a);
        self.unlock_many();
        match r {
            Ok(set) => resp::integer(out, i64::from(set)),
            Err(r) => put_error(out, r),
        }
    }

    fn msetnx_locked(&mut self, a: Args<'_>) -> Result<bool, PutResult> {
        if (1..a.len()).step_by(2).any(|i| self.present(a.get(i))) {
            return Ok(false);
        }
        let now = self.now_ms;
        for i in (1..a.len()).step_by(2) {
            let (key, value) = (a.get(i), a.get(i + 1));
            let h = KeyHash::of(key);
            let r = self.part(h).put(h, key, value, 0, PutCond::Always, now);
            if r != PutResult::Stored {
                for j in (1..i).step_by(2) {
                    let k = a.get(j);
                    let hk = KeyHash::of(k);
                    let _ = self.part(hk).delete(hk, k, now);
                }
                return Err(r);
            }
        }
        Ok(true)
    }

    /// GETEX key [EX s | PX ms | EXAT t | PXAT t | PERSIST].
    pub(super) fn getex(&mut self, a: Args<'_>, out: &mut Reply<'_>) {
        let key = a.get(1);
        if !check_key(key, out) {
            return;
        }
        // None: leave the expiry; Some(0): persist; Some(at): expire at.
        let mut change: Option<u64> = None;
        let mut opt = [0u8; COMMAND_NAME_BYTES_MAX];
        match a.len() {
            2 => {}
            3 if lower(a.get(2), &mut opt) == b"persist" => change = Some(0),
            4 => {
                let (unit, absolute) = match lower(a.get(2), &mut opt) {
                    b"ex" => (1000, false),
                    b"px" => (1, false),
                    b"exat" => (1000, true),
                    b"pxat" => (1, true),
                    _ => return resp::error(out, "ERR syntax error"),
                };
                let Ok(n) = int_arg(a.get(3)) else {
                    return resp::error(out, NOT_INTEGER);
                };
                match self.expiry_at(n, unit, absolute) {
                    Some(at) => change = Some(at),
                    None => return resp::error(out, "ERR invalid expire time in 'getex' command"),
                }
            }
            _ => return resp::error(out, "ERR syntax error"),
        }
        let after = match change {
            Some(at) if at != 0 && at <= self.now_ms => AfterGet::Delete,
            Some(at) => AfterGet::ExpireAt(at),
            None => AfterGet::Keep,
        };
        self.get_then(key, after, out);
    }

    /// GETDEL key: the value, and the key deleted.
    pub(super) fn getdel(&mut self, key: &[u8], out: &mut Reply<'_>) {
        if !check_key(key, out) {
            return;
        }
        self.get_then(key, AfterGet::Delete, out);
    }

    /// Replies with `key`'s value (null when absent) and, when it was
    /// there, does `after` to it under the same lock.
    fn get_then(&mut self, key: &[u8], after: AfterGet, out: &mut Reply<'_>) {
        let now = self.now_ms;
        let h = KeyHash::of(key);
        let p = self.part(h);
        match p.get(h, key, now) {
            GetResult::Found { value, .. } => resp::bulk(out, value),
            GetResult::NotFound => return out.null(),
        }
        match after {
            AfterGet::Keep => {}
            AfterGet::ExpireAt(at) => {
                let _ = p.set_expiry(h, key, at, now);
            }
            AfterGet::Delete => {
                let _ = p.delete(h, key, now);
            }
        }
    }

    /// GETSET key value: SET key value GET (the expiry is dropped).
    pub(super) fn getset(&mut self, a: Args<'_>, out: &mut Reply<'_>) {
        let key = a.get(1);
        if !check_key(key, out) {
            return;
        }
        let now = self.now_ms;
        let h = KeyHash::of(key);
        let mark = out.len();
        let p = self.part(h);
        match p.get(h, key, now) {
            GetResult::Found { value, .. } => resp::bulk(out, value),
            GetResult::NotFound => out.null(),
        }
        let r = p.put(h, key, a.get(2), 0, PutCond::Always, now);
        if r != PutResult::Stored {
            out.truncate(mark);
            put_error(out, r);
        }
    }
}

/// What GETEX and GETDEL do to a key after replying with its value.
enum AfterGet {
    /// Leave it as it is.
    Keep,
    /// Expire it at this engine time in ms (0: never, as PERSIST asks).
    ExpireAt(u64),
    /// Delete it (GETDEL, or an expiry already past).
    Delete,
}
