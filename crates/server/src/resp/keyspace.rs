//! The keyspace commands on the in-memory kv: FLUSHDB and FLUSHALL,
//! TOUCH, UNLINK, TYPE, RENAME, RENAMENX, COPY, KEYS, SCAN and RANDOMKEY;
//! and the dispatch of the string variants, counters, value edits,
//! keyspace and expiry commands (`get_set`, `numbers`, `value_edit`, this
//! file and `expiry`), which `conn` hands here.
//!
//! SCAN's cursor names a partition (bits 32 and up) and a main bucket of
//! its index (the low 32 bits; indexes have at most 2^28). The engine's
//! index never resizes and never moves an item to another main bucket, so
//! walking buckets in plain order returns every key present for the whole
//! iteration at least once, whatever other clients insert or delete.
//!
//! One call examines about COUNT index entries (live or expired, matching
//! MATCH or not), as Redis's COUNT bounds the work and not the reply. The
//! engine's occupancy summary (a bit per main bucket) lets it skip empty
//! buckets 64 at a time, an empty partition costs one check of its item
//! count, and a call goes on into the next partitions until it has
//! examined COUNT entries: a full iteration of N keys at COUNT c takes
//! about N/c calls, and a small keyspace comes back in one.

use fabrickv_engine::{GetResult, PutCond, PutResult, ScanBudget};
use fabrickv_resp::reply as resp;
use fabrickv_resp::reply::Reply;
use fabrickv_types::KeyHash;

use super::args::{check_key, storable_key, Args, NOT_INTEGER};
use super::exec::{put_error, Exec};
use super::glob::{is_literal, stringmatch};
use super::table::{
    lower, spec, Cmd, Spec, COMMAND_NAME_BYTES_MAX, COPY_KEYS, KEYS_RM, KEYS_RO, KEY_RO, MOVE_KEYS,
    MOVE_KEYS_NX, NO_KEYS,
};
use super::RESP_REPLY_BYTES_MAX;

/// What COMMAND reports about the commands in this file (FLUSHDB, FLUSHALL, TOUCH, UNLINK, TYPE, RENAME, RENAMENX, COPY, KEYS, SCAN, RANDOMKEY),
/// with Redis 7's values; `table` gathers every file's into the table.
#[rustfmt::skip]
pub(super) const SPECS: &[Spec] = &[
    spec! { "flushdb" Flushdb -1 ["write"] (0, 0, 0) ["@keyspace", "@write", "@slow", "@dangerous"] NO_KEYS "server" "1.0.0" "O(N) in the keys removed" "Removes every key of the selected database." ["request_policy:all_shards", "response_policy:all_succeeded"] },
    spec! { "flushall" Flushall -1 ["write"] (0, 0, 0) ["@keyspace", "@write", "@slow", "@dangerous"] NO_KEYS "server" "1.0.0" "O(N) in the keys removed" "Removes every key of every in-memory database." ["request_policy:all_shards", "response_policy:all_succeeded"] },
    spec! { "touch" Touch -2 ["readonly", "fast"] (1, -1, 1) ["@keyspace", "@read", "@fast"] KEYS_RO "generic" "3.2.1" "O(N) in the keys given" "Counts the given keys that exist (and marks them used)." ["request_policy:multi_shard", "response_policy:agg_sum"] },
    spec! { "unlink" Unlink -2 ["write", "fast"] (1, -1, 1) ["@keyspace", "@write", "@fast"] KEYS_RM "generic" "4.0.0" "O(N) in the keys given" "Deletes keys." ["request_policy:multi_shard", "response_policy:agg_sum"] },
    spec! { "type" Type 2 ["readonly", "fast"] (1, 1, 1) ["@keyspace", "@read", "@fast"] KEY_RO "generic" "1.0.0" "O(1)" "Returns the type of a key's value." [] },
    spec! { "rename" Rename 3 ["write"] (1, 2, 1) ["@keyspace", "@write", "@slow"] MOVE_KEYS "generic" "1.0.0" "O(1)" "Renames a key, replacing the destination." [] },
    spec! { "renamenx" Renamenx 3 ["write", "fast"] (1, 2, 1) ["@keyspace", "@write", "@fast"] MOVE_KEYS_NX "generic" "1.0.0" "O(1)" "Renames a key only when the new name is free." [] },
    spec! { "copy" Copy -3 ["write", "denyoom"] (1, 2, 1) ["@keyspace", "@write", "@slow"] COPY_KEYS "generic" "6.2.0" "O(1) for a string value" "Copies a key's value to another key." [] },
    spec! { "keys" Keys 2 ["readonly"] (0, 0, 0) ["@keyspace", "@read", "@slow", "@dangerous"] NO_KEYS "generic" "1.0.0" "O(N) in the keys stored" "Returns every key matching a pattern." ["request_policy:all_shards", "nondeterministic_output_order"] },
    spec! { "scan" Scan -2 ["readonly"] (0, 0, 0) ["@keyspace", "@read", "@slow"] NO_KEYS "generic" "2.8.0" "O(1) per call, O(N) for a full iteration" "Iterates over the keys, a few per call." ["nondeterministic_output", "request_policy:special"] },
    spec! { "randomkey" Randomkey 1 ["readonly"] (0, 0, 0) ["@keyspace", "@read", "@slow"] NO_KEYS "generic" "1.0.0" "O(1)" "Returns a key chosen at random." ["request_policy:all_shards", "nondeterministic_output"] },
];

/// SCAN's default COUNT, as Redis's.
pub(super) const SCAN_COUNT_DEFAULT: u64 = 10;

/// Most occupancy summary words (64 main buckets each) one SCAN call
/// tests, whatever COUNT asks: bounds the time a call spends over empty
/// buckets (2^16 words, 4 Mi buckets, take tens of microseconds) before it
/// returns a cursor and no keys.
pub(super) const SCAN_SUMMARY_WORDS_MAX: usize = 1 << 16;

/// Key bytes after which one SCAN call stops (at a bucket's end) and
/// returns what it has, in bytes.
pub(super) const SCAN_REPLY_BYTES_MAX: usize = 1 << 20;

/// Most main buckets RANDOMKEY walks from its random start before giving
/// up (a nearly empty but huge index).
pub(super) const RANDOMKEY_BUCKETS_MAX: usize = 1 << 20;

/// Bits of a SCAN cursor that hold the bucket.
const CURSOR_BUCKET_BITS: u32 = 32;

impl Exec<'_> {
    /// The commands added beside the first ones (see `conn`).
    pub(super) fn more(&mut self, id: Cmd, a: Args<'_>, out: &mut Reply<'_>) {
        match id {
            Cmd::Flushdb => self.flush(a, false, out),
            Cmd::Flushall => self.flush(a, true, out),
            Cmd::Setex => self.setex(a, 1000, "setex", out),
            Cmd::Psetex => self.setex(a, 1, "psetex", out),
            Cmd::Setnx => self.setnx(a, out),
            Cmd::Msetnx => self.msetnx(a, out),
            Cmd::Getex => self.getex(a, out),
            Cmd::Getdel => self.getdel(a.get(1), out),
            Cmd::Getset => self.getset(a, out),
            Cmd::Append => self.append(a, out),
            Cmd::Getrange | Cmd::Substr => self.getrange(a, out),
            Cmd::Setrange => self.setrange(a, out),
            Cmd::Incrbyfloat => self.incrbyfloat(a, out),
            Cmd::Lcs => self.lcs(a, out),
            Cmd::Expireat => self.expire_cmd(a, 1000, true, "expireat", out),
            Cmd::Pexpireat => self.expire_cmd(a, 1, true, "pexpireat", out),
            Cmd::Expiretime => self.expiretime(a.get(1), false, out),
            Cmd::Pexpiretime => self.expiretime(a.get(1), true, out),
            Cmd::Touch => self.touch(a, out),
            Cmd::Unlink => self.del(a, out),
            Cmd::Type => self.key_type(a.get(1), out),
            Cmd::Rename => self.rename(a, false, out),
            Cmd::Renamenx => self.rename(a, true, out),
            Cmd::Copy => self.copy(a, out),
            Cmd::Keys => self.keys(a.get(1), out),
            Cmd::Scan => self.scan(a, out),
            Cmd::Randomkey => self.randomkey(out),
            _ => resp::error(out, "ERR command not handled here"),
        }
    }

    /// FLUSHDB and FLUSHALL [ASYNC|SYNC]: both are done at once, every
    /// partition locked. With persistent shards beside the kv, FLUSHALL
    /// (which in Redis erases every database) is refused.
    fn flush(&mut self, a: Args<'_>, all: bool, out: &mut Vec<u8>) {
        let mut opt = [0u8; COMMAND_NAME_BYTES_MAX];
        match a.len() {
            1 => {}
            2 if matches!(lower(a.get(1), &mut opt), b"async" | b"sync") => {}
            _ => return resp::error(out, "ERR syntax error"),
        }
        if all && !self.shared.dbs.is_empty() {
            return resp::error(
                out,
                "ERR FLUSHALL would erase the persistent shards too; FabricKV refuses it (FLUSHDB on DB 0 empties the in-memory kv)",
            );
        }
        let n = self.shared.parts.len();
        let parts: Vec<usize> = (0..n).collect();
        self.lock_many(&parts);
        let now = self.now_ms;
        for i in 0..n {
            let _ = self.part_at(i).flush(now);
        }
        self.unlock_many();
        resp::simple(out, "OK");
    }

    /// TOUCH: how many of the keys exist (duplicates counted each time).
    fn touch(&mut self, a: Args<'_>, out: &mut Vec<u8>) {
        self.exists(a, out);
    }

    /// TYPE: "string" for a key that exists, else "none".
    fn key_type(&mut self, key: &[u8], out: &mut Vec<u8>) {
        if !storable_key(key) {
            return resp::simple(out, "none");
        }
        let now = self.now_ms;
        let h = KeyHash::of(key);
        match self.part(h).get(h, key, now) {
            GetResult::Found { .. } => resp::simple(out, "string"),
            GetResult::NotFound => resp::simple(out, "none"),
        }
    }

    /// The value and expiry time of `key`, copied (or `None`).
    pub(super) fn copy_of(&mut self, key: &[u8]) -> Option<(Vec<u8>, u64)> {
        let now = self.now_ms;
        let h = KeyHash::of(key);
        match self.part(h).get(h, key, now) {
            GetResult::Found {
                value,
                expire_at_ms,
            } => Some((value.to_vec(), expire_at_ms)),
            GetResult::NotFound => None,
        }
    }

    /// Whether `key` exists.
    pub(super) fn present(&mut self, key: &[u8]) -> bool {
        let now = self.now_ms;
        let h = KeyHash::of(key);
        matches!(self.part(h).get(h, key, now), GetResult::Found { .. })
    }

    /// RENAME and RENAMENX: both keys' partitions locked together, so no
    /// client sees the value under both names or neither.
    fn rename(&mut self, a: Args<'_>, nx: bool, out: &mut Vec<u8>) {
        let (src, dst) = (a.get(1), a.get(2));
        if !check_key(src, out) || !check_key(dst, out) {
            return;
        }
        self.lock_keys([src, dst].into_iter());
        self.rename_locked(src, dst, nx, out);
        self.unlock_many();
    }

    fn rename_locked(&mut self, src: &[u8], dst: &[u8], nx: bool, out: &mut Vec<u8>) {
        let Some((value, at)) = self.copy_of(src) else {
            return resp::error(out, "ERR no such key");
        };
        if src == dst {
            return if nx {
                resp::integer(out, 0)
            } else {
                resp::simple(out, "OK")
            };
        }
        if nx && self.present(dst) {
            return resp::integer(out, 0);
        }
        let now = self.now_ms;
        let hd = KeyHash::of(dst);
        match self.part(hd).put(hd, dst, &value, at, PutCond::Always, now) {
            PutResult::Stored => {}
            r => return put_error(out, r),
        }
        let hs = KeyHash::of(src);
        let _ = self.part(hs).delete(hs, src, now);
        if nx {
            resp::integer(out, 1)
        } else {
            resp::simple(out, "OK")
        }
    }

    /// COPY source destination [DB 0] [REPLACE]: only within database 0.
    fn copy(&mut self, a: Args<'_>, out: &mut Vec<u8>) {
        let (src, dst) = (a.get(1), a.get(2));
        let mut replace = false;
        let mut i = 3;
        let mut opt = [0u8; COMMAND_NAME_BYTES_MAX];
        while i < a.len() {
            match lower(a.get(i), &mut opt) {
                b"replace" => replace = true,
                b"db" if i + 1 < a.len() => {
                    i += 1;
                    match fabrickv_resp::parse_i64(a.get(i)) {
                        Some(0) => {}
                        Some(_) => return resp::error(
                            out,
                            "ERR COPY to another database is not supported by FabricKV (DB 0 only)",
                        ),
                        None => return resp::error(out, NOT_INTEGER),
                    }
                }
                _ => return resp::error(out, "ERR syntax error"),
            }
            i += 1;
        }
        if src == dst {
            return resp::error(out, "ERR source and destination objects are the same");
        }
        if !check_key(src, out) || !check_key(dst, out) {
            return;
        }
        self.lock_keys([src, dst].into_iter());
        let done = match self.copy_of(src) {
            None => Ok(false),
            Some(_) if !replace && self.present(dst) => Ok(false),
            Some((value, at)) => {
                let now = self.now_ms;
                let hd = KeyHash::of(dst);
                match self.part(hd).put(hd, dst, &value, at, PutCond::Always, now) {
                    PutResult::Stored => Ok(true),
                    r => Err(r),
                }
            }
        };
        self.unlock_many();
        match done {
            Ok(d) => resp::integer(out, i64::from(d)),
            Err(r) => put_error(out, r),
        }
    }

    /// KEYS pattern: every matching key, partition by partition; refused
    /// when the reply would pass [`RESP_REPLY_BYTES_MAX`].
    fn keys(&mut self, pattern: &[u8], out: &mut Vec<u8>) {
        let now = self.now_ms;
        if is_literal(pattern) {
            let found = storable_key(pattern) && self.present(pattern);
            resp::array_header(out, usize::from(found));
            if found {
                resp::bulk(out, pattern);
            }
            return;
        }
        let mut found: Vec<Vec<u8>> = Vec::new();
        let mut bytes = 0usize;
        for p in 0..self.shared.parts.len() {
            let part = self.part_at(p);
            let mut budget = ScanBudget {
                entries: usize::MAX,
                words: usize::MAX,
            };
            // Stops after the chain where the reply passed its bound.
            let _ = part.scan_from(0, now, &mut budget, &mut |k, _, _| {
                if stringmatch(pattern, k) {
                    bytes += k.len() + 16;
                    found.push(k.to_vec());
                }
                bytes <= RESP_REPLY_BYTES_MAX
            });
            if bytes > RESP_REPLY_BYTES_MAX {
                return resp::error(
                    out,
                    &format!("ERR KEYS reply would exceed {RESP_REPLY_BYTES_MAX} bytes; use SCAN"),
                );
            }
        }
        resp::array_header(out, found.len());
        for k in &found {
            resp::bulk(out, k);
        }
    }

    /// SCAN cursor [MATCH pattern] [COUNT n] [TYPE type].
    fn scan(&mut self, a: Args<'_>, out: &mut Vec<u8>) {
        let Some(cursor) = std::str::from_utf8(a.get(1))
            .ok()
            .and_then(|s| s.parse::<u64>().ok())
        else {
            return resp::error(out, "ERR invalid cursor");
        };
        let mut pattern: Option<&[u8]> = None;
        let mut count = SCAN_COUNT_DEFAULT;
        let mut type_ok = true;
        let mut i = 2;
        let mut opt = [0u8; COMMAND_NAME_BYTES_MAX];
        while i < a.len() {
            if i + 1 >= a.len() {
                return resp::error(out, "ERR syntax error");
            }
            let v = a.get(i + 1);
            match lower(a.get(i), &mut opt) {
                b"match" => pattern = Some(v),
                b"count" => match fabrickv_resp::parse_i64(v) {
                    Some(n) if n >= 1 => count = n as u64,
                    Some(_) => return resp::error(out, "ERR syntax error"),
                    None => return resp::error(out, NOT_INTEGER),
                },
                b"type" => {
                    // Only strings exist here; an unknown type name matches
                    // nothing, as in Redis (which does not refuse it).
                    let mut t = [0u8; COMMAND_NAME_BYTES_MAX];
                    type_ok = lower(v, &mut t) == b"string";
                }
                _ => return resp::error(out, "ERR syntax error"),
            }
            i += 2;
        }
        let n = self.shared.parts.len() as u64;
        let mut p = cursor >> CURSOR_BUCKET_BITS;
        let mut b = (cursor & ((1 << CURSOR_BUCKET_BITS) - 1)) as usize;
        let mut budget = ScanBudget {
            entries: usize::try_from(count).unwrap_or(usize::MAX),
            words: SCAN_SUMMARY_WORDS_MAX,
        };
        let mut keys: Vec<Vec<u8>> = Vec::new();
        let mut bytes = 0usize;
        let now = self.now_ms;
        while p < n && !budget.spent() && bytes < SCAN_REPLY_BYTES_MAX {
            let part = self.part_at(p as usize);
            // An empty partition costs this one check.
            let next = if part.stats().items == 0 {
                None
            } else {
                part.scan_from(b, now, &mut budget, &mut |k, _, _| {
                    if type_ok && pattern.is_none_or(|pat| stringmatch(pat, k)) {
                        bytes += k.len();
                        keys.push(k.to_vec());
                    }
                    bytes < SCAN_REPLY_BYTES_MAX
                })
            };
            match next {
                Some(at) => b = at,
                None => {
                    p += 1;
                    b = 0;
                }
            }
        }
        let next = if p >= n {
            0
        } else {
            (p << CURSOR_BUCKET_BITS) | b as u64
        };
        resp::array_header(out, 2);
        resp::bulk(out, next.to_string().as_bytes());
        resp::array_header(out, keys.len());
        for k in &keys {
            resp::bulk(out, k);
        }
    }

    /// RANDOMKEY: a key from a random bucket onwards, or null when empty.
    fn randomkey(&mut self, out: &mut Reply<'_>) {
        let n = self.shared.parts.len();
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        let r = KeyHash::of(&nanos.to_le_bytes()).0;
        let now = self.now_ms;
        let p0 = (r % n.max(1) as u64) as usize;
        let mut walked = 0;
        for step in 0..n {
            let p = (p0 + step) % n;
            let part = self.part_at(p);
            if part.stats().items == 0 {
                continue;
            }
            let buckets = part.index_buckets();
            let b0 = ((r >> 32) as usize) % buckets;
            for j in 0..buckets {
                if walked >= RANDOMKEY_BUCKETS_MAX {
                    return out.null();
                }
                walked += 1;
                let mut keys: Vec<Vec<u8>> = Vec::new();
                part.scan_bucket((b0 + j) % buckets, now, &mut |k, _, _| {
                    keys.push(k.to_vec())
                });
                if !keys.is_empty() {
                    let pick = (r as usize) % keys.len();
                    return resp::bulk(out, &keys[pick]);
                }
            }
        }
        out.null()
    }
}
