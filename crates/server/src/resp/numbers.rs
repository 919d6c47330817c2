//! The counters on the in-memory kv: INCR, DECR, INCRBY, DECRBY and
//! INCRBYFLOAT, which read a stored number, add to it and store it back
//! with its expiry kept.

use fabrickv_engine::{GetResult, PutCond, PutResult};
use fabrickv_resp::parse_i64;
use fabrickv_resp::reply as resp;
use fabrickv_types::KeyHash;

use super::args::{check_key, Args, NOT_INTEGER};
use super::exec::{put_error, Exec};
use super::table::{spec, Spec, KEY_RW_UPDATE};

/// What COMMAND reports about the commands in this file (INCR, DECR, INCRBY, DECRBY, INCRBYFLOAT),
/// with Redis 7's values; `table` gathers every file's into the table.
#[rustfmt::skip]
pub(super) const SPECS: &[Spec] = &[
    spec! { "incr" Incr 2 ["write", "denyoom", "fast"] (1, 1, 1) ["@write", "@string", "@fast"] KEY_RW_UPDATE "string" "1.0.0" "O(1)" "Increments the integer value of a key by one. Uses 0 as initial value if the key doesn't exist." [] },
    spec! { "decr" Decr 2 ["write", "denyoom", "fast"] (1, 1, 1) ["@write", "@string", "@fast"] KEY_RW_UPDATE "string" "1.0.0" "O(1)" "Decrements the integer value of a key by one. Uses 0 as initial value if the key doesn't exist." [] },
    spec! { "incrby" Incrby 3 ["write", "denyoom", "fast"] (1, 1, 1) ["@write", "@string", "@fast"] KEY_RW_UPDATE "string" "1.0.0" "O(1)" "Increments the integer value of a key by a number. Uses 0 as initial value if the key doesn't exist." [] },
    spec! { "decrby" Decrby 3 ["write", "denyoom", "fast"] (1, 1, 1) ["@write", "@string", "@fast"] KEY_RW_UPDATE "string" "1.0.0" "O(1)" "Decrements a number from the integer value of a key. Uses 0 as initial value if the key doesn't exist." [] },
    spec! { "incrbyfloat" Incrbyfloat 3 ["write", "denyoom", "fast"] (1, 1, 1) ["@write", "@string", "@fast"] KEY_RW_UPDATE "string" "2.6.0" "O(1)" "Adds a floating-point number to a key's value." [] },
];

/// Longest INCRBYFLOAT operand or stored number read as a float, in bytes
/// (Redis's `MAX_LONG_DOUBLE_CHARS`).
pub(super) const FLOAT_CHARS_MAX: usize = 5 * 1024;

const NOT_FLOAT: &str = "ERR value is not a valid float";

/// Parses a float as Redis's `string2ld` does: the whole argument, no
/// spaces, not NaN.
fn parse_float(s: &[u8]) -> Option<f64> {
    if s.is_empty() || s.len() > FLOAT_CHARS_MAX {
        return None;
    }
    let t = std::str::from_utf8(s).ok()?;
    if t.starts_with(|c: char| c.is_whitespace()) || t.ends_with(|c: char| c.is_whitespace()) {
        return None;
    }
    let v: f64 = t.parse().ok()?;
    (!v.is_nan()).then_some(v)
}

/// A float as INCRBYFLOAT answers it: plain decimal, no exponent, no
/// trailing zeros (Redis's human format), shortest digits that read back
/// to the same value.
pub(super) fn format_float(v: f64) -> String {
    format!("{v}")
}

impl Exec<'_> {
    /// INCR, DECR, INCRBY and DECRBY key: the new value; the expiry is
    /// kept.
    pub(super) fn incr_by(
        &mut self,
        key: &[u8],
        delta: Result<i64, &'static str>,
        out: &mut Vec<u8>,
    ) {
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

    /// INCRBYFLOAT key increment: the new value, as Redis formats it; the
    /// expiry is kept.
    pub(super) fn incrbyfloat(&mut self, a: Args<'_>, out: &mut Vec<u8>) {
        let key = a.get(1);
        if !check_key(key, out) {
            return;
        }
        let Some(incr) = parse_float(a.get(2)) else {
            return resp::error(out, NOT_FLOAT);
        };
        let (current, at) = match self.copy_of(key) {
            Some((v, at)) => match parse_float(&v) {
                Some(f) => (f, at),
                None => return resp::error(out, NOT_FLOAT),
            },
            None => (0.0, 0),
        };
        let next = current + incr;
        if !next.is_finite() {
            return resp::error(out, "ERR increment would produce NaN or Infinity");
        }
        let text = format_float(next);
        let now = self.now_ms;
        let h = KeyHash::of(key);
        match self
            .part(h)
            .put(h, key, text.as_bytes(), at, PutCond::Always, now)
        {
            PutResult::Stored => resp::bulk(out, text.as_bytes()),
            r => put_error(out, r),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn floats_format_as_redis() {
        assert_eq!(format_float(10.5 + 0.1), "10.6");
        assert_eq!(format_float(5.0e3), "5000");
        assert_eq!(format_float(3.0), "3");
        assert_eq!(format_float(-0.25), "-0.25");
        assert_eq!(parse_float(b" 1"), None);
        assert_eq!(parse_float(b"nan"), None);
        assert_eq!(parse_float(b"1e3"), Some(1000.0));
    }
}
