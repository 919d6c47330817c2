//! The operations on one key that both dialects share. Each takes the
//! owning partition's lock once, so its check and its write are atomic.

use std::sync::MutexGuard;

use fabrickv_engine::{ItemMeta, ItemView, Partition, PutCond, PutResult};
use fabrickv_memcache::{deadline_ms, StoreMode, MC_RELATIVE_EXPTIME_SECS_MAX};
use fabrickv_types::KeyHash;

use super::{unix_now_ms, McShared};

/// An expiry as a command gives it, resolved against the time now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Expiry {
    /// Never expires.
    Never,
    /// Expires at this engine time.
    At(u64),
    /// Already expired (a negative or past time): the key goes.
    Gone,
}

impl Expiry {
    /// memcached's reading of an exptime at `now_ms`.
    pub fn of(exptime: i64, now_ms: u64) -> Expiry {
        // The wall clock is read only for an absolute time.
        let unix = if exptime > MC_RELATIVE_EXPTIME_SECS_MAX {
            unix_now_ms()
        } else {
            0
        };
        match deadline_ms(exptime, now_ms, unix) {
            None => Expiry::Never,
            Some(0) => Expiry::Gone,
            Some(t) => Expiry::At(t),
        }
    }

    fn engine_ms(self) -> u64 {
        match self {
            Expiry::At(t) => t,
            _ => 0,
        }
    }
}

/// The TTL in seconds memcached reports for an item expiring at `at`
/// (-1: never).
pub(super) fn ttl_secs(at: u64, now_ms: u64) -> i64 {
    if at == 0 {
        -1
    } else {
        (at.saturating_sub(now_ms).div_ceil(1000)) as i64
    }
}

/// A key and the lock of its partition.
pub(super) struct Locked<'a> {
    pub p: MutexGuard<'a, Partition>,
    pub hash: KeyHash,
    pub key: &'a [u8],
}

impl McShared {
    /// Locks the partition owning `key`.
    pub(super) fn lock<'a>(&'a self, key: &'a [u8]) -> Locked<'a> {
        let hash = KeyHash::of(key);
        Locked {
            p: self.parts.lock(self.parts.index_of(hash)),
            hash,
            key,
        }
    }
}

/// The parts of an item a command looks at besides its value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Info {
    pub cas: u64,
    pub flags: u32,
    pub expire_at_ms: u64,
}

fn info(v: &ItemView<'_>) -> Info {
    let m = v.meta.unwrap_or_default();
    Info {
        cas: m.cas,
        flags: m.client_flags,
        expire_at_ms: v.expire_at_ms,
    }
}

impl Locked<'_> {
    /// Runs `f` on the live item, if any; an item a flush invalidated is
    /// deleted and reads as absent.
    pub fn read<R>(
        &mut self,
        sh: &McShared,
        now: u64,
        f: impl FnOnce(Info, &[u8]) -> R,
    ) -> Option<R> {
        match self.p.get_item(self.hash, self.key, now) {
            None => return None,
            Some(v) => {
                let i = info(&v);
                if !sh.flushed(i.cas) {
                    return Some(f(i, v.value));
                }
            }
        }
        let _ = self.p.delete(self.hash, self.key, now);
        None
    }

    /// Writes `value` with a fresh CAS (or `given`); returns it, or the
    /// refusal.
    pub fn write(
        &mut self,
        sh: &McShared,
        value: &[u8],
        flags: u32,
        exp: Expiry,
        given: Option<u64>,
        now: u64,
    ) -> Result<u64, Outcome> {
        let cas = given.unwrap_or_else(|| sh.new_cas());
        if exp == Expiry::Gone {
            let _ = self.p.delete(self.hash, self.key, now);
            return Ok(cas);
        }
        let meta = ItemMeta {
            cas,
            client_flags: flags,
        };
        match self.p.put_with_meta(
            self.hash,
            self.key,
            value,
            exp.engine_ms(),
            PutCond::Always,
            now,
            meta,
        ) {
            PutResult::Stored => Ok(cas),
            PutResult::TooLarge => Err(Outcome::TooLarge),
            PutResult::InsufficientSpace => Err(Outcome::NoMemory),
            PutResult::ConditionFailed => Err(Outcome::NotStored),
        }
    }

    /// Sets the expiry of the live item; false if there is none.
    pub fn touch(&mut self, sh: &McShared, exp: Expiry, now: u64) -> bool {
        if self.read(sh, now, |_, _| ()).is_none() {
            return false;
        }
        match exp {
            Expiry::Gone => {
                let _ = self.p.delete(self.hash, self.key, now);
                true
            }
            e => self.p.set_expiry(self.hash, self.key, e.engine_ms(), now),
        }
    }
}

/// How a storage command ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Outcome {
    /// Stored, with this CAS.
    Stored(u64),
    /// Its condition did not hold (add of a present key, replace, append
    /// or prepend of a missing one).
    NotStored,
    /// A compared CAS differs.
    Exists,
    /// A compared CAS names a missing key.
    NotFound,
    /// Over the engine's room.
    TooLarge,
    /// A full store-mode pool.
    NoMemory,
}

/// A storage command.
pub(super) struct StoreReq<'a> {
    pub key: &'a [u8],
    pub data: &'a [u8],
    pub mode: StoreMode,
    pub flags: u32,
    pub exptime: i64,
    /// CAS to compare (`cas`, `ms C`).
    pub compare: Option<u64>,
    /// CAS to give the new item instead of a fresh one (`ms E`).
    pub new_cas: Option<u64>,
    /// Delete the key's old value when its new one is refused (too large,
    /// or no room): memcached does so for `set` and `ms`, so that a
    /// failed write never leaves a stale value readable.
    pub unlink_if_refused: bool,
}

/// Runs a storage command.
pub(super) fn store(sh: &McShared, scratch: &mut Vec<u8>, r: &StoreReq<'_>, now: u64) -> Outcome {
    let mut k = sh.lock(r.key);
    // A plain set needs not look first.
    if r.mode == StoreMode::Set && r.compare.is_none() {
        return match k.write_req(sh, r, now) {
            Ok(cas) => Outcome::Stored(cas),
            Err(o) => k.refused(r, o, now),
        };
    }
    let joins = matches!(r.mode, StoreMode::Append | StoreMode::Prepend);
    scratch.clear();
    let cur = k.read(sh, now, |i, v| {
        if joins {
            scratch.extend_from_slice(v);
        }
        i
    });
    if let Some(want) = r.compare {
        match cur {
            None => return Outcome::NotFound,
            Some(i) if i.cas != want => return Outcome::Exists,
            Some(_) => {}
        }
    }
    match (r.mode, cur) {
        (StoreMode::Add, Some(_)) => return Outcome::NotStored,
        (StoreMode::Replace | StoreMode::Append | StoreMode::Prepend, None) => {
            return Outcome::NotStored
        }
        _ => {}
    }
    let res = match (r.mode, cur) {
        (StoreMode::Append | StoreMode::Prepend, Some(i)) => {
            if r.mode == StoreMode::Append {
                scratch.extend_from_slice(r.data);
            } else {
                scratch.splice(0..0, r.data.iter().copied());
            }
            let exp = if i.expire_at_ms == 0 {
                Expiry::Never
            } else {
                Expiry::At(i.expire_at_ms)
            };
            k.write(sh, scratch, i.flags, exp, r.new_cas, now)
        }
        _ => k.write_req(sh, r, now),
    };
    if scratch.capacity() > super::MC_OUTPUT_SOFT_BYTES {
        *scratch = Vec::new();
    }
    match res {
        Ok(cas) => Outcome::Stored(cas),
        Err(o) if joins => o,
        Err(o) => k.refused(r, o, now),
    }
}

impl Locked<'_> {
    /// Writes `r`'s own data, flags and expiry (all but append and
    /// prepend, which write the joined value under the old item's).
    fn write_req(&mut self, sh: &McShared, r: &StoreReq<'_>, now: u64) -> Result<u64, Outcome> {
        self.write(
            sh,
            r.data,
            r.flags,
            Expiry::of(r.exptime, now),
            r.new_cas,
            now,
        )
    }

    /// A write of `r`'s data refused with `o`: deletes the old value if
    /// `r` asks for it.
    fn refused(&mut self, r: &StoreReq<'_>, o: Outcome, now: u64) -> Outcome {
        if r.unlink_if_refused && matches!(o, Outcome::TooLarge | Outcome::NoMemory) {
            let _ = self.p.delete(self.hash, self.key, now);
        }
        o
    }
}

/// How an incr or decr ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Arith {
    /// The new value, its CAS and its expiry time.
    Value(u64, Info),
    NotFound,
    NonNumeric,
    Exists,
    Failed(Outcome),
}

/// An incr or decr.
pub(super) struct ArithReq<'a> {
    pub key: &'a [u8],
    pub incr: bool,
    pub delta: u64,
    pub compare: Option<u64>,
    /// CAS to give the new item instead of a fresh one (`ma E`).
    pub new_cas: Option<u64>,
    /// Create a missing key with this value and expiry (`ma N J`).
    pub vivify: Option<(u64, i64)>,
}

/// The number a stored value holds: decimal digits, trailing spaces
/// allowed (memcached pads a decremented value with them).
fn number(v: &[u8]) -> Option<u64> {
    let end = v.iter().rposition(|&b| b != b' ').map_or(0, |i| i + 1);
    fabrickv_memcache::parse_u64(&v[..end])
}

/// Runs an incr or decr: incr wraps at 2^64, decr stops at 0.
pub(super) fn arith(sh: &McShared, r: &ArithReq<'_>, now: u64) -> Arith {
    let mut k = sh.lock(r.key);
    let cur = k.read(sh, now, |i, v| (i, number(v)));
    let (i, n) = match cur {
        None => {
            let Some((initial, exptime)) = r.vivify else {
                return Arith::NotFound;
            };
            let mut digits = Vec::new();
            super::push_u64(&mut digits, initial);
            let exp = Expiry::of(exptime, now);
            return match k.write(sh, &digits, 0, exp, r.new_cas, now) {
                Ok(cas) => Arith::Value(
                    initial,
                    Info {
                        cas,
                        flags: 0,
                        expire_at_ms: exp.engine_ms(),
                    },
                ),
                Err(o) => Arith::Failed(o),
            };
        }
        Some((i, n)) => (i, n),
    };
    if r.compare.is_some_and(|c| c != i.cas) {
        return Arith::Exists;
    }
    let Some(n) = n else {
        return Arith::NonNumeric;
    };
    let v = if r.incr {
        n.wrapping_add(r.delta)
    } else {
        n.saturating_sub(r.delta)
    };
    let mut digits = Vec::with_capacity(20);
    super::push_u64(&mut digits, v);
    let exp = if i.expire_at_ms == 0 {
        Expiry::Never
    } else {
        Expiry::At(i.expire_at_ms)
    };
    match k.write(sh, &digits, i.flags, exp, r.new_cas, now) {
        Ok(cas) => Arith::Value(v, Info { cas, ..i }),
        Err(o) => Arith::Failed(o),
    }
}

/// Deletes `key` if live (and, with `compare`, if its CAS is that).
pub(super) fn delete(sh: &McShared, key: &[u8], compare: Option<u64>, now: u64) -> Outcome {
    let mut k = sh.lock(key);
    match k.read(sh, now, |i, _| i.cas) {
        None => Outcome::NotFound,
        Some(c) if compare.is_some_and(|w| w != c) => Outcome::Exists,
        Some(_) => {
            let _ = k.p.delete(k.hash, k.key, now);
            Outcome::Stored(0)
        }
    }
}
