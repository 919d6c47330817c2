//! The commands that work on part of a string value, or on two values,
//! on the in-memory kv: APPEND, GETRANGE (SUBSTR), SETRANGE and LCS.

use fabrickv_engine::{GetResult, PutCond, PutResult};
use fabrickv_resp::reply as resp;
use fabrickv_resp::reply::Reply;
use fabrickv_types::limits::VALUE_BYTES_MAX;
use fabrickv_types::KeyHash;

use super::args::{check_key, int_arg, Args, NOT_INTEGER};
use super::exec::{put_error, Exec};
use super::table::{
    lower, spec, Spec, COMMAND_NAME_BYTES_MAX, KEY_RO, KEY_RW_INSERT, KEY_RW_UPDATE_ONLY,
    TWO_KEYS_RO,
};

/// What COMMAND reports about the commands in this file (APPEND, GETRANGE, SUBSTR, SETRANGE, LCS),
/// with Redis 7's values; `table` gathers every file's into the table.
#[rustfmt::skip]
pub(super) const SPECS: &[Spec] = &[
    spec! { "append" Append 3 ["write", "denyoom", "fast"] (1, 1, 1) ["@write", "@string", "@fast"] KEY_RW_INSERT "string" "2.0.0" "O(1)" "Appends to a key's value, creating the key when absent." [] },
    spec! { "getrange" Getrange 4 ["readonly"] (1, 1, 1) ["@read", "@string", "@slow"] KEY_RO "string" "2.4.0" "O(N) in the bytes returned" "Returns a range of a key's value." [] },
    spec! { "substr" Substr 4 ["readonly"] (1, 1, 1) ["@read", "@string", "@slow"] KEY_RO "string" "1.0.0" "O(N) in the bytes returned" "Returns a range of a key's value (old name of GETRANGE)." [] },
    spec! { "setrange" Setrange 4 ["write", "denyoom"] (1, 1, 1) ["@write", "@string", "@slow"] KEY_RW_UPDATE_ONLY "string" "2.2.0" "O(1) plus the bytes written" "Overwrites part of a key's value from an offset." [] },
    spec! { "lcs" Lcs -3 ["readonly"] (1, 2, 1) ["@read", "@string", "@slow"] TWO_KEYS_RO "string" "7.0.0" "O(N*M) in the two lengths" "Finds the longest common subsequence of two keys' values." [] },
];

/// Most cells (first string's length + 1 times the second's + 1) of the
/// table LCS fills, 4 bytes each: 16 MiB, two strings of about 2 KiB.
/// Longer inputs are refused rather than costing seconds and gigabytes.
pub(super) const LCS_CELLS_MAX: usize = 4 << 20;

impl Exec<'_> {
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
