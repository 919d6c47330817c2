//! The classic text commands, and `stats`.

use std::sync::atomic::Ordering;

use fabrickv_memcache::{self as mc, Command, StoreMode};

use super::forward::{Forwarder, Placed};
use super::store::{self, Arith, Expiry, Outcome, StoreReq};
use super::{line, push_u64, GetLine, McConnState, McShared, MC_OUTPUT_SOFT_BYTES};

/// Runs a text command (anything but a retrieval, a meta command, a
/// refusal or quit).
pub(super) fn run(
    s: &mut McConnState,
    sh: &McShared,
    cmd: Command<'_>,
    out: &mut Vec<u8>,
    now: u64,
) {
    let c = &sh.counters;
    match cmd {
        Command::Store(st) => {
            let (mode, noreply) = (st.mode, st.noreply);
            c.cmd_set.fetch_add(1, Ordering::Relaxed);
            if !mc::key_ok(st.key) {
                reply(out, noreply, mc::BAD_FORMAT);
                return;
            }
            let req = StoreReq {
                key: st.key,
                data: st.data,
                mode,
                flags: st.flags,
                exptime: st.exptime,
                compare: (mode == StoreMode::Cas).then_some(st.cas_unique),
                new_cas: None,
                unlink_if_refused: mode == StoreMode::Set,
            };
            let o = store::store(sh, &mut s.scratch, &req, now);
            if mode == StoreMode::Cas {
                match o {
                    Outcome::Stored(_) => &c.cas_hits,
                    Outcome::NotFound => &c.cas_misses,
                    _ => &c.cas_badval,
                }
                .fetch_add(1, Ordering::Relaxed);
            }
            let text = match o {
                Outcome::Stored(_) => "STORED",
                Outcome::NotStored => "NOT_STORED",
                Outcome::Exists => "EXISTS",
                Outcome::NotFound => "NOT_FOUND",
                Outcome::TooLarge => mc::TOO_LARGE,
                Outcome::NoMemory => mc::NO_MEMORY,
            };
            reply(out, noreply, text);
        }
        Command::Delete { key, noreply } => {
            let o = store::delete(sh, key, None, now);
            let (counter, text) = match o {
                Outcome::Stored(_) => (&c.delete_hits, "DELETED"),
                _ => (&c.delete_misses, "NOT_FOUND"),
            };
            counter.fetch_add(1, Ordering::Relaxed);
            reply(out, noreply, text);
        }
        Command::Arith {
            incr,
            key,
            delta,
            noreply,
        } => {
            let req = store::ArithReq {
                key,
                incr,
                delta,
                compare: None,
                new_cas: None,
                vivify: None,
            };
            let r = store::arith(sh, &req, now);
            let (hits, misses) = if incr {
                (&c.incr_hits, &c.incr_misses)
            } else {
                (&c.decr_hits, &c.decr_misses)
            };
            match r {
                Arith::Value(v, _) => {
                    hits.fetch_add(1, Ordering::Relaxed);
                    if !noreply {
                        push_u64(out, v);
                        out.extend_from_slice(b"\r\n");
                    }
                }
                Arith::NotFound | Arith::Exists => {
                    misses.fetch_add(1, Ordering::Relaxed);
                    reply(out, noreply, "NOT_FOUND");
                }
                Arith::NonNumeric => reply(out, noreply, mc::NON_NUMERIC),
                Arith::Failed(Outcome::TooLarge) => reply(out, noreply, mc::TOO_LARGE),
                Arith::Failed(_) => reply(out, noreply, mc::NO_MEMORY),
            }
        }
        Command::Touch {
            key,
            exptime,
            noreply,
        } => {
            c.cmd_touch.fetch_add(1, Ordering::Relaxed);
            let mut k = sh.lock(key);
            if k.touch(sh, Expiry::of(exptime, now), now) {
                c.touch_hits.fetch_add(1, Ordering::Relaxed);
                reply(out, noreply, "TOUCHED");
            } else {
                c.touch_misses.fetch_add(1, Ordering::Relaxed);
                reply(out, noreply, "NOT_FOUND");
            }
        }
        Command::FlushAll { delay, noreply } => {
            c.cmd_flush.fetch_add(1, Ordering::Relaxed);
            match Expiry::of(delay, now) {
                Expiry::At(at) => sh.flush_at_ms.store(at, Ordering::Relaxed),
                _ => {
                    sh.flush_at_ms.store(0, Ordering::Relaxed);
                    sh.flush_now();
                }
            }
            reply(out, noreply, "OK");
        }
        Command::Version => {
            out.extend_from_slice(b"VERSION ");
            line(out, super::MC_VERSION);
        }
        Command::Verbosity { noreply } => reply(out, noreply, "OK"),
        Command::Stats { group } => stats(sh, group, out),
        // Dispatched elsewhere.
        Command::Get { .. }
        | Command::Gat { .. }
        | Command::TooLarge { .. }
        | Command::Quit
        | Command::Meta(_)
        | Command::MetaNoop
        | Command::Refused(_) => {}
    }
}

fn reply(out: &mut Vec<u8>, noreply: bool, text: &str) {
    if !noreply {
        line(out, text);
    }
}

/// `get`, `gets`, `gat`, `gats`: one `VALUE` block per live key of
/// `keys` (the line's `END` is the caller's). Stops before a key once the
/// replies reach [`MC_OUTPUT_SOFT_BYTES`], returning where in `keys` that
/// key starts, so that a line of many large values is answered as its
/// replies are written rather than buffered whole; `None` when every key
/// was answered.
pub(super) fn retrieve(
    sh: &McShared,
    fw: &mut Forwarder,
    keys: &[u8],
    g: &mut GetLine,
    out: &mut Vec<u8>,
    now: u64,
    unsettled: &mut bool,
) -> Option<usize> {
    let c = &sh.counters;
    // `gat` writes (each key's expiry).
    *unsettled |= g.touch.is_some();
    for key in mc::keys(keys) {
        if out.len() >= MC_OUTPUT_SOFT_BYTES {
            // `key` lies within `keys`.
            return Some(key.as_ptr() as usize - keys.as_ptr() as usize);
        }
        g.answered = true;
        // A key of another server's slot is asked of it alone; its VALUE
        // block joins this line's (the line's END is ours).
        let forwarded = fw.elsewhere(&sh.slot_routing, key, false, true, out, || {
            let mut one = Vec::with_capacity(key.len() + 32);
            one.extend_from_slice(match (g.touch.is_some(), g.cas) {
                (false, false) => b"get ".as_slice(),
                (false, true) => b"gets ",
                (true, false) => b"gat ",
                (true, true) => b"gats ",
            });
            if g.touch.is_some() {
                one.extend_from_slice(g.exptime.to_string().as_bytes());
                one.push(b' ');
            }
            one.extend_from_slice(key);
            one.extend_from_slice(b"\r\n");
            one.into()
        });
        // Retrievals are not held to the connection's age (`OpenedAt`):
        // a late read harms no one, its client left.
        if forwarded == Placed::Sent {
            *unsettled = true;
            continue;
        }
        c.cmd_get.fetch_add(1, Ordering::Relaxed);
        let mut k = sh.lock(key);
        let hit = k.read(sh, now, |i, v| {
            out.extend_from_slice(b"VALUE ");
            out.extend_from_slice(key);
            out.push(b' ');
            push_u64(out, u64::from(i.flags));
            out.push(b' ');
            push_u64(out, v.len() as u64);
            if g.cas {
                out.push(b' ');
                push_u64(out, i.cas);
            }
            out.extend_from_slice(b"\r\n");
            out.extend_from_slice(v);
            out.extend_from_slice(b"\r\n");
        });
        // Checked after the read: write counts only grow, so settled now
        // means settled for what was read.
        *unsettled |= !sh.parts.key_settled(k.hash);
        if hit.is_some() {
            c.get_hits.fetch_add(1, Ordering::Relaxed);
            if let Some(exp) = g.touch {
                c.cmd_touch.fetch_add(1, Ordering::Relaxed);
                c.touch_hits.fetch_add(1, Ordering::Relaxed);
                k.touch(sh, exp, now);
            }
        } else {
            c.get_misses.fetch_add(1, Ordering::Relaxed);
            if g.touch.is_some() {
                c.cmd_touch.fetch_add(1, Ordering::Relaxed);
                c.touch_misses.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
    None
}

/// Writes a STAT line for each named counter: the counters' fields carry
/// memcached's names, so the name is the field's.
macro_rules! counter_stats {
    ($out:expr, $c:expr, $($name:ident)+) => {
        $(stat($out, stringify!($name), $c.$name.load(Ordering::Relaxed));)+
    };
}

fn stat(out: &mut Vec<u8>, name: &str, v: impl std::fmt::Display) {
    use std::io::Write;
    let _ = write!(out, "STAT {name} {v}\r\n");
}

/// `stats`: memcached's general statistics under memcached's names.
fn stats(sh: &McShared, group: Option<&[u8]>, out: &mut Vec<u8>) {
    match group {
        None => {}
        Some(b"reset") => {
            line(out, "RESET");
            return;
        }
        // Groups this front end keeps no figures for answer an empty
        // list; `cachedump` (its arguments checked by the parser) as
        // memcached does for a class with no items.
        Some(b"settings" | b"items" | b"slabs" | b"sizes" | b"conns" | b"cachedump") => {
            line(out, "END");
            return;
        }
        Some(_) => {
            line(out, "ERROR");
            return;
        }
    }
    let c = &sh.counters;
    let get = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed);
    let e = sh.parts.stats();
    let unix = super::unix_now_ms() / 1000;
    stat(out, "pid", std::process::id());
    stat(out, "uptime", sh.started.elapsed().as_secs());
    stat(out, "time", unix);
    stat(out, "version", super::MC_VERSION);
    stat(out, "pointer_size", usize::BITS);
    stat(out, "curr_connections", get(&c.connected));
    stat(out, "total_connections", get(&c.connections_received));
    stat(out, "rejected_connections", get(&c.rejected));
    counter_stats!(out, c, cmd_get cmd_set cmd_flush cmd_touch get_hits get_misses);
    stat(out, "get_expired", e.expired);
    counter_stats!(out, c,
        delete_misses delete_hits incr_misses incr_hits decr_misses decr_hits
        cas_misses cas_hits cas_badval touch_hits touch_misses);
    stat(out, "threads", sh.threads);
    stat(out, "curr_items", e.items);
    stat(out, "total_items", e.puts);
    stat(out, "bytes", e.bytes);
    stat(out, "limit_maxbytes", sh.pool_bytes);
    stat(out, "evictions", e.evictions + e.index_collisions);
    stat(out, "reclaimed", e.expired);
    // memcached's names for pages moved between slab classes and items
    // moved off a page so that it could go (store mode; 0 in cache mode).
    stat(out, "slabs_moved", e.slab_pages_moved);
    stat(out, "slab_reassign_rescues", e.slab_items_relocated);
    stat(out, "fabrickv_slab_free_bytes", e.slab_free_bytes);
    stat(
        out,
        "fabrickv_mode",
        match sh.mode {
            crate::config::Mode::Cache => "cache",
            crate::config::Mode::Store => "store",
        },
    );
    stat(out, "fabrickv_evicted_idle", get(&c.evicted_idle));
    let m = &sh.client_memory;
    stat(out, "fabrickv_client_memory_bytes", m.used_bytes() as u64);
    stat(out, "fabrickv_maxmemory_clients", m.cap_bytes() as u64);
    stat(out, "fabrickv_evicted_clients", m.evicted());
    stat(out, "fabrickv_commands", get(&c.commands));
    line(out, "END");
}
