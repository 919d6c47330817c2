//! The meta commands: `mg`, `ms`, `md`, `ma` (`mn` is answered by the
//! connection state). `E` on `ms` and `ma` gives the written item the caller's CAS
//! value instead of a fresh one. Return flags (`O`, `k`, `b`, `c`, `f`, `s`, `t`) are echoed
//! in the order the request gave them. Quiet mode (`q`) hides `EN` for
//! `mg`, `HD` for `ms`, and `HD` and `NF` for `md` and `ma`. As in
//! memcached, `t` reports the TTL as it stands where `t` is in the
//! request (before a `T` that follows it), and an `ms` that stores
//! nothing reports `c0`.

use std::sync::atomic::Ordering;

use fabrickv_memcache::{self as mc, Meta, MetaKind, StoreMode, MC_BASE64_KEY_BYTES_MAX};

use super::store::{self, ttl_secs, Arith, ArithReq, Expiry, Info, Outcome, StoreReq};
use super::{line, push_u64, McConnState, McShared};

/// What a return flag reports.
#[derive(Default, Clone, Copy)]
struct Report {
    info: Option<Info>,
    size: Option<usize>,
    /// The expiry (engine ms, 0: none) a `T` flag gave the item: a `t`
    /// after the `T` reports it, one before reports `info`'s.
    touched: Option<u64>,
}

/// The key a command names: `key` itself, or decoded into `buf` when
/// base64; `None` when it does not decode.
pub(super) fn decoded_key<'a>(
    key: &'a [u8],
    base64: bool,
    buf: &'a mut [u8; MC_BASE64_KEY_BYTES_MAX],
) -> Option<&'a [u8]> {
    if !base64 {
        return Some(key);
    }
    match mc::base64_decode(key, buf) {
        Some(n) if n > 0 => Some(&buf[..n]),
        _ => None,
    }
}

/// Appends the return flags the request asked for, in its order.
fn flags(out: &mut Vec<u8>, m: &Meta<'_>, r: Report, now: u64) {
    let mut expire_at_ms = r.info.map_or(0, |i| i.expire_at_ms);
    for tok in mc::keys(m.flags.raw) {
        let arg = &tok[1..];
        match tok[0] {
            b'T' => {
                if let Some(t) = r.touched {
                    expire_at_ms = t;
                }
            }
            b'O' => {
                out.extend_from_slice(b" O");
                out.extend_from_slice(arg);
            }
            b'k' => {
                out.extend_from_slice(b" k");
                out.extend_from_slice(m.key);
            }
            b'b' if m.flags.raw.split(|&b| b == b' ').any(|t| t == b"k") => {
                out.extend_from_slice(b" b")
            }
            b'c' | b'f' | b't' => {
                if let Some(i) = r.info {
                    out.push(b' ');
                    out.push(tok[0]);
                    match tok[0] {
                        b'c' => push_u64(out, i.cas),
                        b'f' => push_u64(out, u64::from(i.flags)),
                        _ => match ttl_secs(expire_at_ms, now) {
                            -1 => out.extend_from_slice(b"-1"),
                            t => push_u64(out, t as u64),
                        },
                    }
                }
            }
            b's' => {
                if let Some(s) = r.size {
                    out.extend_from_slice(b" s");
                    push_u64(out, s as u64);
                }
            }
            _ => {}
        }
    }
}

/// Writes a status line (`HD`, `EN`, ...) with the return flags.
fn status(out: &mut Vec<u8>, code: &str, m: &Meta<'_>, r: Report, now: u64) {
    out.extend_from_slice(code.as_bytes());
    flags(out, m, r, now);
    out.extend_from_slice(b"\r\n");
}

/// Runs a meta command.
pub(super) fn run(s: &mut McConnState, sh: &McShared, m: &Meta<'_>, out: &mut Vec<u8>, now: u64) {
    let mut buf = [0u8; MC_BASE64_KEY_BYTES_MAX];
    let Some(key) = decoded_key(m.key, m.flags.base64, &mut buf) else {
        line(out, mc::BAD_FORMAT);
        return;
    };
    if key.len() > mc::MC_KEY_BYTES_MAX || (!m.flags.base64 && !mc::key_ok(key)) {
        line(out, mc::BAD_FORMAT);
        return;
    }
    let q = m.flags.quiet;
    let c = &sh.counters;
    match m.kind {
        MetaKind::Get => {
            c.cmd_get.fetch_add(1, Ordering::Relaxed);
            let mut k = sh.lock(key);
            let new_exp = m.flags.ttl.map(|t| Expiry::of(t, now));
            let hit = k.read(sh, now, |i, v| {
                let r = Report {
                    info: Some(i),
                    size: Some(v.len()),
                    touched: new_exp.map(expire_at_ms),
                };
                if m.flags.value {
                    out.extend_from_slice(b"VA ");
                    push_u64(out, v.len() as u64);
                    flags(out, m, r, now);
                    out.extend_from_slice(b"\r\n");
                    out.extend_from_slice(v);
                    out.extend_from_slice(b"\r\n");
                } else {
                    status(out, "HD", m, r, now);
                }
            });
            match hit {
                Some(()) => {
                    c.get_hits.fetch_add(1, Ordering::Relaxed);
                    if let Some(e) = new_exp {
                        c.cmd_touch.fetch_add(1, Ordering::Relaxed);
                        k.touch(sh, e, now);
                    }
                }
                None => {
                    c.get_misses.fetch_add(1, Ordering::Relaxed);
                    if !q {
                        status(out, "EN", m, Report::default(), now);
                    }
                }
            }
        }
        MetaKind::Set => {
            c.cmd_set.fetch_add(1, Ordering::Relaxed);
            let mode = match m.flags.mode.map(|b| b.to_ascii_uppercase()) {
                None | Some(b'S') => StoreMode::Set,
                Some(b'E') => StoreMode::Add,
                Some(b'A') => StoreMode::Append,
                Some(b'P') => StoreMode::Prepend,
                _ => StoreMode::Replace,
            };
            let req = StoreReq {
                key,
                data: m.data,
                mode,
                flags: m.flags.client_flags.unwrap_or(0),
                exptime: m.flags.ttl.unwrap_or(0),
                compare: m.flags.compare_cas,
                new_cas: m.flags.new_cas,
                unlink_if_refused: true,
            };
            let o = store::store(sh, &mut s.scratch, &req, now);
            let code = match o {
                Outcome::Stored(cas) => {
                    if !q {
                        let info = Info {
                            cas,
                            flags: req.flags,
                            expire_at_ms: 0,
                        };
                        let r = Report {
                            info: Some(info),
                            ..Report::default()
                        };
                        status(out, "HD", m, r, now);
                    }
                    return;
                }
                Outcome::NotStored => "NS",
                Outcome::Exists => "EX",
                Outcome::NotFound => "NF",
                Outcome::TooLarge => return line(out, mc::TOO_LARGE),
                Outcome::NoMemory => return line(out, mc::NO_MEMORY),
            };
            // Nothing stored: memcached reports the CAS as 0.
            let r = Report {
                info: Some(Info {
                    cas: 0,
                    flags: 0,
                    expire_at_ms: 0,
                }),
                ..Report::default()
            };
            status(out, code, m, r, now);
        }
        MetaKind::Delete => match store::delete(sh, key, m.flags.compare_cas, now) {
            Outcome::Stored(_) => {
                c.delete_hits.fetch_add(1, Ordering::Relaxed);
                if !q {
                    status(out, "HD", m, Report::default(), now);
                }
            }
            Outcome::Exists => status(out, "EX", m, Report::default(), now),
            _ => {
                c.delete_misses.fetch_add(1, Ordering::Relaxed);
                if !q {
                    status(out, "NF", m, Report::default(), now);
                }
            }
        },
        MetaKind::Arith => {
            let incr = !matches!(m.flags.mode, Some(b'D' | b'd' | b'-'));
            let req = ArithReq {
                key,
                incr,
                delta: m.flags.delta.unwrap_or(1),
                compare: m.flags.compare_cas,
                new_cas: m.flags.new_cas,
                vivify: m.flags.vivify.map(|t| (m.flags.initial.unwrap_or(0), t)),
            };
            match store::arith(sh, &req, now) {
                Arith::Value(v, i) => {
                    if incr { &c.incr_hits } else { &c.decr_hits }.fetch_add(1, Ordering::Relaxed);
                    let touched = m.flags.ttl.map(|t| {
                        let e = Expiry::of(t, now);
                        sh.lock(key).touch(sh, e, now);
                        expire_at_ms(e)
                    });
                    let mut digits = Vec::with_capacity(20);
                    push_u64(&mut digits, v);
                    let r = Report {
                        info: Some(i),
                        size: Some(digits.len()),
                        touched,
                    };
                    if m.flags.value {
                        out.extend_from_slice(b"VA ");
                        push_u64(out, digits.len() as u64);
                        flags(out, m, r, now);
                        out.extend_from_slice(b"\r\n");
                        out.extend_from_slice(&digits);
                        out.extend_from_slice(b"\r\n");
                    } else if !q {
                        status(out, "HD", m, r, now);
                    }
                }
                Arith::NotFound => {
                    if incr { &c.incr_misses } else { &c.decr_misses }
                        .fetch_add(1, Ordering::Relaxed);
                    if !q {
                        status(out, "NF", m, Report::default(), now);
                    }
                }
                Arith::Exists => status(out, "EX", m, Report::default(), now),
                Arith::NonNumeric => line(out, mc::NON_NUMERIC),
                Arith::Failed(Outcome::NotStored) => status(out, "NS", m, Report::default(), now),
                Arith::Failed(Outcome::TooLarge) => line(out, mc::TOO_LARGE),
                Arith::Failed(_) => line(out, mc::NO_MEMORY),
            }
        }
    }
}

/// The engine expiry an item has after a touch to `e` (0: none; a touch
/// into the past deletes it).
fn expire_at_ms(e: Expiry) -> u64 {
    match e {
        Expiry::At(t) => t,
        _ => 0,
    }
}
