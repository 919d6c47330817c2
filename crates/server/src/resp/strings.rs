//! The string commands on the in-memory kv: GET, STRLEN, SET (with NX,
//! XX, EX, PX, KEEPTTL and GET), MGET, MSET, DEL and EXISTS. Their
//! variants are in `get_set`, the counters in `numbers`, the commands on
//! part of a value in `value_edit`.

use fabrickv_engine::{
    DeleteResult, GetRefResult, GetResult, Partition, PutCond, PutResult, ValueRef,
};
use fabrickv_resp::reply::{self as resp, Reply};
use fabrickv_types::KeyHash;

use super::args::{check_key, int_arg, mget_fits, storable_key, Args, NOT_INTEGER};
use super::exec::{put_error, Exec};
use super::table::{
    lower, spec, Spec, COMMAND_NAME_BYTES_MAX, KEYS_RM, KEYS_RO, KEY_RO, KEY_SET, PAIRS_OW,
};
use super::RESP_PREFETCH_KEYS;

/// What COMMAND reports about the commands in this file (GET, SET, MGET, MSET, DEL, EXISTS, STRLEN),
/// with Redis 7's values; `table` gathers every file's into the table.
#[rustfmt::skip]
pub(super) const SPECS: &[Spec] = &[
    spec! { "get" Get 2 ["readonly", "fast"] (1, 1, 1) ["@read", "@string", "@fast"] KEY_RO "string" "1.0.0" "O(1)" "Returns the string value of a key." [] },
    spec! { "set" Set -3 ["write", "denyoom"] (1, 1, 1) ["@write", "@string", "@slow"] KEY_SET "string" "1.0.0" "O(1)" "Sets the string value of a key, ignoring its type. The key is created if it doesn't exist." [] },
    spec! { "mget" Mget -2 ["readonly", "fast"] (1, -1, 1) ["@read", "@string", "@fast"] KEYS_RO "string" "1.0.0" "O(N) where N is the number of keys to retrieve." "Atomically returns the string values of one or more keys." ["request_policy:multi_shard"] },
    spec! { "mset" Mset -3 ["write", "denyoom"] (1, -1, 2) ["@write", "@string", "@slow"] PAIRS_OW "string" "1.0.1" "O(N) where N is the number of keys to set." "Atomically creates or modifies the string values of one or more keys." ["request_policy:multi_shard", "response_policy:all_succeeded"] },
    spec! { "del" Del -2 ["write"] (1, -1, 1) ["@keyspace", "@write", "@slow"] KEYS_RM "generic" "1.0.0" "O(N) where N is the number of keys that will be removed." "Deletes one or more keys." ["request_policy:multi_shard", "response_policy:agg_sum"] },
    spec! { "exists" Exists -2 ["readonly", "fast"] (1, -1, 1) ["@keyspace", "@read", "@fast"] KEYS_RO "generic" "1.0.0" "O(N) where N is the number of keys to check." "Determines whether one or more keys exist." ["request_policy:multi_shard", "response_policy:agg_sum"] },
    spec! { "strlen" Strlen 2 ["readonly", "fast"] (1, 1, 1) ["@read", "@string", "@fast"] KEY_RO "string" "2.2.0" "O(1)" "Returns the length of a string value." [] },
];

impl Exec<'_> {
    pub(super) fn get(&mut self, key: &[u8], out: &mut Reply<'_>) {
        if !check_key(key, out) {
            return;
        }
        let now = self.now_ms;
        let h = KeyHash::of(key);
        self.bulk_reply(h, key, now, out);
        // Checked after the read: write counts only grow, so settled now
        // means settled for what was read. A GET inside EXEC is part of a
        // reply that may hold writes.
        if !self.in_exec {
            self.read_settled = self.shared.parts.key_settled(h);
        }
    }

    /// The bulk reply of GET and MGET for one key: a large value is
    /// referenced, not copied.
    fn bulk_reply(&mut self, h: KeyHash, key: &[u8], now: u64, out: &mut Reply<'_>) {
        let large = match self.part(h).get_ref(h, key, now) {
            GetRefResult::Found {
                value: ValueRef::Inline(v),
                ..
            } => return resp::bulk(out, v),
            GetRefResult::Found {
                value: ValueRef::Large(v),
                ..
            } => v.clone(),
            GetRefResult::NotFound => return out.null(),
        };
        self.bulk_value(out, ValueRef::Large(&large));
    }

    pub(super) fn strlen(&mut self, key: &[u8], out: &mut Vec<u8>) {
        if !check_key(key, out) {
            return;
        }
        let now = self.now_ms;
        let h = KeyHash::of(key);
        match self.part(h).get(h, key, now) {
            GetResult::Found { value, .. } => resp::integer(out, value.len() as i64),
            GetResult::NotFound => resp::integer(out, 0),
        }
    }

    pub(super) fn set(&mut self, a: Args<'_>, out: &mut Reply<'_>) {
        let (key, value) = (a.get(1), a.get(2));
        // A value over 1 MiB was received into its own buffer, which the
        // store takes as it is.
        let large = self.large_arg.take();
        if !check_key(key, out) {
            return;
        }
        let mut expire: Option<u64> = None;
        let mut cond = PutCond::Always;
        let mut keep_ttl = false;
        let mut get_old = false;
        let mut i = 3;
        let mut opt = [0u8; COMMAND_NAME_BYTES_MAX];
        while i < a.len() {
            let unit = match lower(a.get(i), &mut opt) {
                b"nx" if cond == PutCond::Always => {
                    cond = PutCond::IfAbsent;
                    None
                }
                b"xx" if cond == PutCond::Always => {
                    cond = PutCond::IfPresent;
                    None
                }
                b"keepttl" if expire.is_none() => {
                    keep_ttl = true;
                    None
                }
                b"get" => {
                    get_old = true;
                    None
                }
                b"ex" if expire.is_none() && !keep_ttl && i + 1 < a.len() => Some((1000, false)),
                b"px" if expire.is_none() && !keep_ttl && i + 1 < a.len() => Some((1, false)),
                b"exat" if expire.is_none() && !keep_ttl && i + 1 < a.len() => Some((1000, true)),
                b"pxat" if expire.is_none() && !keep_ttl && i + 1 < a.len() => Some((1, true)),
                _ => return resp::error(out, "ERR syntax error"),
            };
            if let Some((unit, absolute)) = unit {
                i += 1;
                let Ok(n) = int_arg(a.get(i)) else {
                    return resp::error(out, NOT_INTEGER);
                };
                match self.expiry_at(n, unit, absolute) {
                    Some(at) => expire = Some(at),
                    None => return resp::error(out, "ERR invalid expire time in 'set' command"),
                }
            }
            i += 1;
        }
        let now = self.now_ms;
        let h = KeyHash::of(key);
        let mark = out.len();
        let mut old_ttl = 0;
        if get_old || keep_ttl {
            let old = match self.part(h).get_ref(h, key, now) {
                GetRefResult::Found {
                    value: ValueRef::Large(old),
                    expire_at_ms,
                } => Some((Some(old.clone()), expire_at_ms)),
                GetRefResult::Found {
                    value: ValueRef::Inline(old),
                    expire_at_ms,
                } => {
                    if get_old {
                        resp::bulk(out, old);
                    }
                    Some((None, expire_at_ms))
                }
                GetRefResult::NotFound => None,
            };
            match old {
                Some((large_old, expire_at_ms)) => {
                    if let (true, Some(v)) = (get_old, large_old) {
                        self.bulk_value(out, ValueRef::Large(&v));
                    }
                    old_ttl = expire_at_ms;
                }
                None if get_old => out.null(),
                None => {}
            }
        }
        let at = match (expire, keep_ttl) {
            (Some(at), _) => at,
            (None, true) => old_ttl,
            (None, false) => 0,
        };
        let p = self.part(h);
        let stored = match large {
            Some(v) => p.put_large(h, key, v, at, cond, now),
            None => p.put(h, key, value, at, cond, now),
        };
        match stored {
            PutResult::Stored if !get_old => resp::simple(out, "OK"),
            PutResult::Stored | PutResult::ConditionFailed if get_old => {}
            PutResult::ConditionFailed => out.null(),
            r => {
                out.truncate(mark);
                self.drop_large_after(mark);
                put_error(out, r);
            }
        }
    }

    /// MGET with every key's partition locked together, so that it never
    /// sees half of a write over several partitions (MSET, EXEC). Its
    /// reply is settled, as a GET's, when every key's writes are
    /// replicated, checked after the reads.
    pub(super) fn mget(&mut self, a: Args<'_>, out: &mut Reply<'_>) {
        self.lock_keys((1..a.len()).map(|i| a.get(i)));
        self.mget_locked(a, out);
        self.unlock_many();
        if !self.in_exec {
            let parts = &self.shared.parts;
            // A server that does not replicate hashes no key again.
            self.read_settled = !parts.replicates()
                || (1..a.len()).all(|i| parts.key_settled(KeyHash::of(a.get(i))));
        }
    }

    fn mget_locked(&mut self, a: Args<'_>, out: &mut Reply<'_>) {
        let mark = out.len();
        resp::array_header(out, a.len() - 1);
        let now = self.now_ms;
        for i in 1..a.len() {
            if (i - 1).is_multiple_of(RESP_PREFETCH_KEYS) && a.len() > 2 {
                let end = (i + RESP_PREFETCH_KEYS).min(a.len());
                let mut hashes = [KeyHash(0); RESP_PREFETCH_KEYS];
                for (h, j) in hashes.iter_mut().zip(i..end) {
                    *h = KeyHash::of(a.get(j));
                }
                self.prefetch(&hashes[..end - i]);
            }
            let key = a.get(i);
            if !storable_key(key) {
                out.null();
                continue;
            }
            let h = KeyHash::of(key);
            self.bulk_reply(h, key, now, out);
            if !mget_fits(out, mark) {
                self.drop_large_after(mark);
                return;
            }
        }
    }

    pub(super) fn mset(&mut self, a: Args<'_>, out: &mut Vec<u8>) {
        if a.len().is_multiple_of(2) {
            return resp::error(out, "ERR wrong number of arguments for 'mset' command");
        }
        // Every key checked before any is written, so bad input writes nothing.
        for i in (1..a.len()).step_by(2) {
            if !check_key(a.get(i), out) {
                return;
            }
        }
        let now = self.now_ms;
        self.lock_keys((1..a.len()).step_by(2).map(|i| a.get(i)));
        let mut refused = None;
        for i in (1..a.len()).step_by(2) {
            let (key, value) = (a.get(i), a.get(i + 1));
            let h = KeyHash::of(key);
            let r = self.part(h).put(h, key, value, 0, PutCond::Always, now);
            if r != PutResult::Stored {
                refused = Some(r);
                break;
            }
        }
        self.unlock_many();
        match refused {
            Some(r) => put_error(out, r),
            None => resp::simple(out, "OK"),
        }
    }

    pub(super) fn del(&mut self, a: Args<'_>, out: &mut Vec<u8>) {
        let n = self.count_keys(a, |p, h, key, now| {
            p.delete(h, key, now) == DeleteResult::Deleted
        });
        resp::integer(out, n);
    }

    pub(super) fn exists(&mut self, a: Args<'_>, out: &mut Vec<u8>) {
        let n = self.count_keys(a, |p, h, key, now| {
            matches!(p.get(h, key, now), GetResult::Found { .. })
        });
        resp::integer(out, n);
    }

    /// Runs `hit` on each key of arguments 1.., every key's partition
    /// locked together, and counts
    /// the keys it holds for (DEL's and EXISTS's answer). A key over the
    /// bound cannot be stored, so it counts as absent.
    fn count_keys(
        &mut self,
        a: Args<'_>,
        mut hit: impl FnMut(&mut Partition, KeyHash, &[u8], u64) -> bool,
    ) -> i64 {
        self.lock_keys((1..a.len()).map(|i| a.get(i)));
        let now = self.now_ms;
        let mut n = 0;
        for i in 1..a.len() {
            let key = a.get(i);
            if !storable_key(key) {
                continue;
            }
            let h = KeyHash::of(key);
            if hit(self.part(h), h, key, now) {
                n += 1;
            }
        }
        self.unlock_many();
        n
    }
}
