//! The expiry commands on the in-memory kv: EXPIRE and PEXPIRE (with
//! NX, XX, GT and LT), PERSIST, TTL and PTTL.

use fabrickv_engine::{DeleteResult, GetResult};
use fabrickv_resp::reply as resp;
use fabrickv_types::KeyHash;

use super::args::{check_key, expiry_at, int_arg, Args, NOT_INTEGER};
use super::exec::Exec;
use super::table::{lower, COMMAND_NAME_BYTES_MAX};

impl Exec<'_> {
    /// EXPIRE and PEXPIRE (`unit_ms` 1000 or 1), with NX, XX, GT and LT.
    pub(super) fn expire(&mut self, a: Args<'_>, unit_ms: u64, out: &mut Vec<u8>) {
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
