//! The expiry commands on the in-memory kv: EXPIRE, PEXPIRE, EXPIREAT
//! and PEXPIREAT (with NX, XX, GT and LT), EXPIRETIME, PEXPIRETIME,
//! PERSIST, TTL and PTTL.

use fabrickv_engine::{DeleteResult, GetResult};
use fabrickv_resp::reply as resp;
use fabrickv_types::KeyHash;

use super::args::{check_key, int_arg, Args, NOT_INTEGER};
use super::exec::Exec;
use super::table::{lower, spec, Spec, COMMAND_NAME_BYTES_MAX, KEY_RO, KEY_RW_UPDATE};

/// What COMMAND reports about the commands in this file (EXPIRE, PEXPIRE, PERSIST, TTL, PTTL, EXPIREAT, PEXPIREAT, EXPIRETIME, PEXPIRETIME),
/// with Redis 7's values; `table` gathers every file's into the table.
#[rustfmt::skip]
pub(super) const SPECS: &[Spec] = &[
    spec! { "expire" Expire -3 ["write", "fast"] (1, 1, 1) ["@keyspace", "@write", "@fast"] KEY_RW_UPDATE "generic" "1.0.0" "O(1)" "Sets the expiration time of a key in seconds." [] },
    spec! { "pexpire" Pexpire -3 ["write", "fast"] (1, 1, 1) ["@keyspace", "@write", "@fast"] KEY_RW_UPDATE "generic" "2.6.0" "O(1)" "Sets the expiration time of a key in milliseconds." [] },
    spec! { "persist" Persist 2 ["write", "fast"] (1, 1, 1) ["@keyspace", "@write", "@fast"] KEY_RW_UPDATE "generic" "2.2.0" "O(1)" "Removes the expiration time of a key." [] },
    spec! { "ttl" Ttl 2 ["readonly", "fast"] (1, 1, 1) ["@keyspace", "@read", "@fast"] KEY_RO "generic" "1.0.0" "O(1)" "Returns the expiration time in seconds of a key." ["nondeterministic_output"] },
    spec! { "pttl" Pttl 2 ["readonly", "fast"] (1, 1, 1) ["@keyspace", "@read", "@fast"] KEY_RO "generic" "2.6.0" "O(1)" "Returns the expiration time in milliseconds of a key." ["nondeterministic_output"] },
    spec! { "expireat" Expireat -3 ["write", "fast"] (1, 1, 1) ["@keyspace", "@write", "@fast"] KEY_RW_UPDATE "generic" "1.2.0" "O(1)" "Sets a key's expiry to a Unix time in seconds." [] },
    spec! { "pexpireat" Pexpireat -3 ["write", "fast"] (1, 1, 1) ["@keyspace", "@write", "@fast"] KEY_RW_UPDATE "generic" "2.6.0" "O(1)" "Sets a key's expiry to a Unix time in milliseconds." [] },
    spec! { "expiretime" Expiretime 2 ["readonly", "fast"] (1, 1, 1) ["@keyspace", "@read", "@fast"] KEY_RO "generic" "7.0.0" "O(1)" "Returns a key's expiry as a Unix time in seconds." [] },
    spec! { "pexpiretime" Pexpiretime 2 ["readonly", "fast"] (1, 1, 1) ["@keyspace", "@read", "@fast"] KEY_RO "generic" "7.0.0" "O(1)" "Returns a key's expiry as a Unix time in milliseconds." [] },
];

impl Exec<'_> {
    /// EXPIRE and PEXPIRE (`unit_ms` 1000 or 1), with NX, XX, GT and LT.
    pub(super) fn expire(&mut self, a: Args<'_>, unit_ms: u64, out: &mut Vec<u8>) {
        let name = if unit_ms == 1 { "pexpire" } else { "expire" };
        self.expire_cmd(a, unit_ms, false, name, out);
    }

    /// EXPIRE, PEXPIRE, EXPIREAT and PEXPIREAT key time [NX|XX|GT|LT ...],
    /// as Redis's `expireGenericCommand`: the flags are checked first,
    /// then the time (in Unix milliseconds, overflow refused with the
    /// command's `name`), then the key; a time already past deletes it.
    /// Any time that fits an `i64` of milliseconds is kept exactly, as
    /// Redis keeps it (the engine's `u64` expiry holds it).
    pub(super) fn expire_cmd(
        &mut self,
        a: Args<'_>,
        unit_ms: u64,
        absolute: bool,
        name: &str,
        out: &mut Vec<u8>,
    ) {
        let (mut nx, mut xx, mut gt, mut lt) = (false, false, false, false);
        let mut flag = [0u8; COMMAND_NAME_BYTES_MAX];
        for i in 3..a.len() {
            match lower(a.get(i), &mut flag) {
                b"nx" => nx = true,
                b"xx" => xx = true,
                b"gt" => gt = true,
                b"lt" => lt = true,
                _ => {
                    return resp::error(
                        out,
                        &format!(
                            "ERR Unsupported option {}",
                            String::from_utf8_lossy(a.get(i))
                        ),
                    )
                }
            }
        }
        if nx && (xx || gt || lt) {
            return resp::error(
                out,
                "ERR NX and XX, GT or LT options at the same time are not compatible",
            );
        }
        if gt && lt {
            return resp::error(
                out,
                "ERR GT and LT options at the same time are not compatible",
            );
        }
        let Ok(n) = int_arg(a.get(2)) else {
            return resp::error(out, NOT_INTEGER);
        };
        let invalid = format!("ERR invalid expire time in '{name}' command");
        let unit = unit_ms as i64;
        if n > i64::MAX / unit || n < i64::MIN / unit {
            return resp::error(out, &invalid);
        }
        let base = if absolute { 0 } else { self.unix_ms as i64 };
        let rel = n * unit;
        if rel > i64::MAX - base {
            return resp::error(out, &invalid);
        }
        // The new expiry, in Unix milliseconds.
        let when = rel + base;
        let unix_now = self.unix_ms as i64;
        let expired = when <= unix_now;
        let key = a.get(1);
        if !check_key(key, out) {
            return;
        }
        let now = self.now_ms;
        let h = KeyHash::of(key);
        let current = match self.part(h).get(h, key, now) {
            GetResult::Found {
                expire_at_ms: 0, ..
            } => None,
            GetResult::Found { expire_at_ms, .. } => Some(self.to_unix_ms(expire_at_ms)),
            GetResult::NotFound => return resp::integer(out, 0),
        };
        // No expiry counts as an infinite one for GT and LT.
        let refused = (nx && current.is_some())
            || (xx && current.is_none())
            || (gt && current.is_none_or(|c| when <= c))
            || (lt && current.is_some_and(|c| when >= c));
        if refused {
            return resp::integer(out, 0);
        }
        let p = self.part(h);
        let applied = if expired {
            p.delete(h, key, now) == DeleteResult::Deleted
        } else {
            p.set_expiry(h, key, now + (when - unix_now) as u64, now)
        };
        resp::integer(out, i64::from(applied));
    }

    /// EXPIRETIME and PEXPIRETIME: -2 absent, -1 no expiry, else the Unix
    /// time it expires at (seconds rounded, or milliseconds).
    pub(super) fn expiretime(&mut self, key: &[u8], ms: bool, out: &mut Vec<u8>) {
        if !check_key(key, out) {
            return;
        }
        let now = self.now_ms;
        let h = KeyHash::of(key);
        let at = match self.part(h).get(h, key, now) {
            GetResult::NotFound => return resp::integer(out, -2),
            GetResult::Found {
                expire_at_ms: 0, ..
            } => return resp::integer(out, -1),
            GetResult::Found { expire_at_ms, .. } => expire_at_ms,
        };
        let unix = self.to_unix_ms(at).max(0);
        // Rounded to the nearest second as Redis does, without the
        // overflow `(unix + 500) / 1000` has near `i64::MAX`.
        let secs = unix / 1000 + i64::from(unix % 1000 >= 500);
        resp::integer(out, if ms { unix } else { secs });
    }

    pub(super) fn persist(&mut self, key: &[u8], out: &mut Vec<u8>) {
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
    pub(super) fn ttl(&mut self, key: &[u8], unit_ms: u64, out: &mut Vec<u8>) {
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
}
