//! More string commands on the in-memory kv: SETEX, PSETEX, SETNX,
//! MSETNX, GETEX, GETDEL, GETSET, APPEND, GETRANGE (SUBSTR), SETRANGE,
//! INCRBYFLOAT and LCS.

use fabrickv_engine::{GetResult, PutCond, PutResult};
use fabrickv_resp::reply as resp;
use fabrickv_resp::reply::Reply;
use fabrickv_types::limits::VALUE_BYTES_MAX;
use fabrickv_types::KeyHash;

use super::args::{check_key, int_arg, Args, NOT_INTEGER};
use super::exec::{put_error, Exec};
use super::table::{lower, COMMAND_NAME_BYTES_MAX};

/// Most cells (first string's length + 1 times the second's + 1) of the
/// table LCS fills, 4 bytes each: 16 MiB, two strings of about 2 KiB.
/// Longer inputs are refused rather than costing seconds and gigabytes.
pub(super) const LCS_CELLS_MAX: usize = 4 << 20;

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
        let now = self.now_ms;
        let h = KeyHash::of(key);
        let p = self.part(h);
        match p.get(h, key, now) {
            GetResult::Found { value, .. } => resp::bulk(out, value),
            GetResult::NotFound => return out.null(),
        }
        match change {
            Some(at) if at != 0 && at <= now => {
                let _ = p.delete(h, key, now);
            }
            Some(at) => {
                let _ = p.set_expiry(h, key, at, now);
            }
            None => {}
        }
    }

    /// GETDEL key: the value, and the key deleted.
    pub(super) fn getdel(&mut self, key: &[u8], out: &mut Reply<'_>) {
        if !check_key(key, out) {
            return;
        }
        let now = self.now_ms;
        let h = KeyHash::of(key);
        let p = self.part(h);
        match p.get(h, key, now) {
            GetResult::Found { value, .. } => resp::bulk(out, value),
            GetResult::NotFound => return out.null(),
        }
        let _ = p.delete(h, key, now);
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

    /// APPEND key value: the new length; the expiry is kept.
    pub(super) fn append(&mut self, a: Args<'_>, out: &mut Vec<u8>) {
        let key = a.get(1);
        if !check_key(key, out) {
            return;
        }
        let (mut value, at) = self.copy_of(key).unwrap_or_default();
        if value.len().saturating_add(a.get(2).len()) > VALUE_BYTES_MAX {
            return resp::error(
                out,
                "ERR string exceeds maximum allowed size (proto-max-bulk-len)",
            );
        }
        value.extend_from_slice(a.get(2));
        let now = self.now_ms;
        let h = KeyHash::of(key);
        match self.part(h).put(h, key, &value, at, PutCond::Always, now) {
            PutResult::Stored => resp::integer(out, value.len() as i64),
            r => put_error(out, r),
        }
    }

    /// GETRANGE (SUBSTR) key start end, with Redis's index rules.
    pub(super) fn getrange(&mut self, a: Args<'_>, out: &mut Vec<u8>) {
        let key = a.get(1);
        let (Ok(start), Ok(end)) = (int_arg(a.get(2)), int_arg(a.get(3))) else {
            return resp::error(out, NOT_INTEGER);
        };
        if !check_key(key, out) {
            return;
        }
        let now = self.now_ms;
        let h = KeyHash::of(key);
        let value = match self.part(h).get(h, key, now) {
            GetResult::Found { value, .. } => value,
            GetResult::NotFound => &[][..],
        };
        let len = value.len() as i64;
        if start < 0 && end < 0 && start > end {
            return resp::bulk(out, b"");
        }
        let mut s = if start < 0 {
            len.saturating_add(start)
        } else {
            start
        };
        let mut e = if end < 0 {
            len.saturating_add(end)
        } else {
            end
        };
        s = s.max(0);
        e = e.max(0);
        if e >= len {
            e = len - 1;
        }
        if len == 0 || s > e {
            return resp::bulk(out, b"");
        }
        resp::bulk(out, &value[s as usize..=e as usize]);
    }

    /// SETRANGE key offset value: overwrites from `offset`, padding with
    /// zero bytes; the new length.
    pub(super) fn setrange(&mut self, a: Args<'_>, out: &mut Vec<u8>) {
        let key = a.get(1);
        if !check_key(key, out) {
            return;
        }
        let Ok(offset) = int_arg(a.get(2)) else {
            return resp::error(out, NOT_INTEGER);
        };
        if offset < 0 {
            return resp::error(out, "ERR offset is out of range");
        }
        let patch = a.get(3);
        let existing = self.copy_of(key);
        if patch.is_empty() {
            let len = existing.map_or(0, |(v, _)| v.len());
            return resp::integer(out, len as i64);
        }
        let end = (offset as u64).saturating_add(patch.len() as u64);
        if end > VALUE_BYTES_MAX as u64 {
            return resp::error(
                out,
                "ERR string exceeds maximum allowed size (proto-max-bulk-len)",
            );
        }
        let (mut value, at) = existing.unwrap_or_default();
        let (offset, end) = (offset as usize, end as usize);
        if value.len() < end {
            value.resize(end, 0);
        }
        value[offset..end].copy_from_slice(patch);
        let now = self.now_ms;
        let h = KeyHash::of(key);
        match self.part(h).put(h, key, &value, at, PutCond::Always, now) {
            PutResult::Stored => resp::integer(out, value.len() as i64),
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

    /// LCS key1 key2 [LEN] [IDX] [MINMATCHLEN n] [WITHMATCHLEN].
    pub(super) fn lcs(&mut self, a: Args<'_>, out: &mut Reply<'_>) {
        let (mut len_only, mut idx, mut with_len) = (false, false, false);
        let mut min_len: i64 = 0;
        let mut i = 3;
        let mut opt = [0u8; COMMAND_NAME_BYTES_MAX];
        while i < a.len() {
            match lower(a.get(i), &mut opt) {
                b"len" => len_only = true,
                b"idx" => idx = true,
                b"withmatchlen" => with_len = true,
                b"minmatchlen" if i + 1 < a.len() => {
                    i += 1;
                    let Ok(n) = int_arg(a.get(i)) else {
                        return resp::error(out, NOT_INTEGER);
                    };
                    min_len = n.max(0);
                }
                _ => return resp::error(out, "ERR syntax error"),
            }
            i += 1;
        }
        if len_only && idx {
            return resp::error(
                out,
                "ERR If you want both the length and indexes, please just use IDX.",
            );
        }
        let (k1, k2) = (a.get(1), a.get(2));
        if !check_key(k1, out) || !check_key(k2, out) {
            return;
        }
        self.lock_keys([k1, k2].into_iter());
        let x = self.copy_of(k1).map(|(v, _)| v).unwrap_or_default();
        let y = self.copy_of(k2).map(|(v, _)| v).unwrap_or_default();
        self.unlock_many();
        let cells = (x.len() + 1).saturating_mul(y.len() + 1);
        if cells > LCS_CELLS_MAX {
            return resp::error(
                out,
                &format!(
                    "ERR LCS of {} and {} bytes needs {cells} cells; FabricKV computes at most {LCS_CELLS_MAX}",
                    x.len(),
                    y.len()
                ),
            );
        }
        lcs_reply(&x, &y, len_only, idx, with_len, min_len as u64, out);
    }
}

/// Fills Redis's LCS table over `a` and `b` and writes the reply.
fn lcs_reply(
    a: &[u8],
    b: &[u8],
    len_only: bool,
    idx: bool,
    with_len: bool,
    min_len: u64,
    out: &mut Reply<'_>,
) {
    let (al, bl) = (a.len(), b.len());
    let w = bl + 1;
    let mut t = vec![0u32; (al + 1) * w];
    for i in 1..=al {
        for j in 1..=bl {
            t[i * w + j] = if a[i - 1] == b[j - 1] {
                t[(i - 1) * w + j - 1] + 1
            } else {
                t[(i - 1) * w + j].max(t[i * w + j - 1])
            };
        }
    }
    let total = t[al * w + bl] as usize;
    if len_only {
        return resp::integer(out, total as i64);
    }
    // Walk back from the end as Redis does, collecting the string and the
    // ranges (last match first).
    let mut result = vec![0u8; total];
    let mut ranges: Vec<[usize; 4]> = Vec::new();
    let (mut i, mut j, mut k) = (al, bl, total);
    let none = al;
    let (mut a_start, mut a_end, mut b_start, mut b_end) = (none, 0, 0, 0);
    while i > 0 && j > 0 {
        let mut emit = false;
        if a[i - 1] == b[j - 1] {
            result[k - 1] = a[i - 1];
            if a_start == none {
                (a_start, a_end, b_start, b_end) = (i - 1, i - 1, j - 1, j - 1);
            } else if a_start == i && b_start == j {
                a_start -= 1;
                b_start -= 1;
            } else {
                emit = true;
            }
            if a_start == 0 || b_start == 0 {
                emit = true;
            }
            k -= 1;
            i -= 1;
            j -= 1;
        } else {
            if t[(i - 1) * w + j] > t[i * w + j - 1] {
                i -= 1;
            } else {
                j -= 1;
            }
            if a_start != none {
                emit = true;
            }
        }
        if emit {
            let match_len = (a_end - a_start + 1) as u64;
            if min_len == 0 || match_len >= min_len {
                ranges.push([a_start, a_end, b_start, b_end]);
            }
            a_start = none;
        }
    }
    if !idx {
        return resp::bulk(out, &result);
    }
    // A map under RESP3, as Redis answers it; a flat array under RESP2.
    out.map_header(2);
    resp::bulk(out, b"matches");
    resp::array_header(out, ranges.len());
    for r in &ranges {
        resp::array_header(out, if with_len { 3 } else { 2 });
        resp::array_header(out, 2);
        resp::integer(out, r[0] as i64);
        resp::integer(out, r[1] as i64);
        resp::array_header(out, 2);
        resp::integer(out, r[2] as i64);
        resp::integer(out, r[3] as i64);
        if with_len {
            resp::integer(out, (r[1] - r[0] + 1) as i64);
        }
    }
    resp::bulk(out, b"len");
    resp::integer(out, total as i64);
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
