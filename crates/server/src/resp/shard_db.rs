//! The data commands on a persistent shard: RESP's `SELECT n` (n >= 1)
//! makes the n-th `--shard` the connection's database.
//!
//! GET, SET, MGET, MSET, DEL, EXISTS and STRLEN read and write the shard;
//! a write replies only once durable (the shard's journal is synced), as a
//! native PUT does. MSET is one atomic batch, and so is DEL; DEL's count is
//! of the keys present just before the batch (a concurrent writer may
//! change that between the read and the write). A shard stores plain
//! values: commands about expiry or counters, and SET's options, are
//! refused with an error naming the limitation. Keys and values follow
//! the native data ops' bounds, so what RESP writes the native client
//! reads back.
//!
//! These run on the RESP thread of the connection; the partition lock of
//! the in-memory kv is released first, so a disk sync never holds up the
//! kv's other clients.

use std::collections::HashSet;

use fabrickv_resp::reply::{self as resp, Reply};
use fabrickv_storage::{ShardBackend, StorageError, Write};
use fabrickv_wire::shard_data::{SHARD_DATA_KEY_BYTES_MAX, SHARD_DATA_VALUE_BYTES_MAX};

use super::args::{mget_fits, within, Args};
use super::table::{Cmd, Spec};
use super::RESP_REPLY_BYTES_MAX;
use crate::shard::data::{storage_refusal, write};

/// Whether `id` names a command about keys, answered by the database.
pub(super) fn is_keyed(id: Cmd) -> bool {
    matches!(
        id,
        Cmd::Get
            | Cmd::Set
            | Cmd::Mget
            | Cmd::Mset
            | Cmd::Del
            | Cmd::Exists
            | Cmd::Expire
            | Cmd::Pexpire
            | Cmd::Persist
            | Cmd::Ttl
            | Cmd::Pttl
            | Cmd::Incr
            | Cmd::Decr
            | Cmd::Incrby
            | Cmd::Decrby
            | Cmd::Strlen
            | Cmd::Dbsize
    )
}

/// Runs keyed command `spec` on `shard`, database `db`. Generic over the
/// backend, so that MGET's and MSET's per-key calls are static.
pub(super) fn command<S: ShardBackend + ?Sized>(
    shard: &S,
    db: usize,
    spec: &Spec,
    a: Args<'_>,
    out: &mut Reply<'_>,
) {
    let name = spec.name;
    match spec.id {
        Cmd::Get => get(shard, a.get(1), out),
        Cmd::Set => set(shard, db, a, out),
        Cmd::Mget => mget(shard, a, out),
        Cmd::Mset => mset(shard, a, out),
        Cmd::Del => del(shard, a, out),
        Cmd::Exists => exists(shard, a, out),
        Cmd::Strlen => strlen(shard, a.get(1), out),
        Cmd::Expire | Cmd::Pexpire | Cmd::Persist | Cmd::Ttl | Cmd::Pttl => resp::error(
            out,
            &format!("ERR '{name}' is not supported on a persistent shard (db {db}): shard keys do not expire"),
        ),
        Cmd::Incr | Cmd::Decr | Cmd::Incrby | Cmd::Decrby => resp::error(
            out,
            &format!("ERR '{name}' is not supported on a persistent shard (db {db}): shards store plain values, not counters"),
        ),
        Cmd::Dbsize => resp::error(
            out,
            &format!("ERR 'dbsize' is not supported on a persistent shard (db {db}): a shard counts its keys only by a full scan (INFO keyspace shows an estimate)"),
        ),
        _ => resp::error(
            out,
            &format!("ERR '{name}' is not supported on a persistent shard (db {db})"),
        ),
    }
}

fn storage_error(out: &mut Vec<u8>, e: StorageError) {
    let (_, why) = storage_refusal(e);
    resp::error(out, &format!("ERR {why}"));
}

fn check_key(key: &[u8], out: &mut Vec<u8>) -> bool {
    within(key, SHARD_DATA_KEY_BYTES_MAX, "shard", "key", out)
}

fn check_value(value: &[u8], out: &mut Vec<u8>) -> bool {
    within(value, SHARD_DATA_VALUE_BYTES_MAX, "shard", "value", out)
}

/// The value of `key`; `Err(())` once an error reply is written.
fn read<S: ShardBackend + ?Sized>(
    shard: &S,
    key: &[u8],
    out: &mut Vec<u8>,
) -> Result<Option<Vec<u8>>, ()> {
    shard.get(key).map_err(|e| storage_error(out, e))
}

fn get<S: ShardBackend + ?Sized>(shard: &S, key: &[u8], out: &mut Reply<'_>) {
    if !check_key(key, out) {
        return;
    }
    match read(shard, key, out) {
        Ok(Some(v)) if v.len() > RESP_REPLY_BYTES_MAX => resp::error(
            out,
            &format!(
                "ERR value is {} bytes, more than a reply carries ({RESP_REPLY_BYTES_MAX})",
                v.len()
            ),
        ),
        Ok(Some(v)) => resp::bulk(out, &v),
        Ok(None) => out.null(),
        Err(()) => {}
    }
}

fn strlen<S: ShardBackend + ?Sized>(shard: &S, key: &[u8], out: &mut Vec<u8>) {
    if !check_key(key, out) {
        return;
    }
    // On Err the error reply is written already.
    if let Ok(v) = read(shard, key, out) {
        resp::integer(out, v.map_or(0, |v| v.len() as i64));
    }
}

fn set<S: ShardBackend + ?Sized>(shard: &S, db: usize, a: Args<'_>, out: &mut Vec<u8>) {
    if a.len() > 3 {
        return resp::error(
            out,
            &format!("ERR SET options (NX, XX, GET, EX, PX, EXAT, PXAT, KEEPTTL) are not supported on a persistent shard (db {db}): only a plain SET key value"),
        );
    }
    let (key, value) = (a.get(1), a.get(2));
    if !check_key(key, out) || !check_value(value, out) {
        return;
    }
    match write(shard, &[Write::Put(key, value)]) {
        Ok(()) => resp::simple(out, "OK"),
        Err((_, why)) => resp::error(out, &format!("ERR {why}")),
    }
}

fn mget<S: ShardBackend + ?Sized>(shard: &S, a: Args<'_>, out: &mut Reply<'_>) {
    let mark = out.len();
    resp::array_header(out, a.len() - 1);
    for i in 1..a.len() {
        let key = a.get(i);
        if key.len() > SHARD_DATA_KEY_BYTES_MAX {
            out.null();
            continue;
        }
        match shard.get(key) {
            Ok(Some(v)) => resp::bulk(out, &v),
            Ok(None) => out.null(),
            Err(e) => {
                out.truncate(mark);
                return storage_error(out, e);
            }
        }
        if !mget_fits(out, mark) {
            return;
        }
    }
}

fn mset<S: ShardBackend + ?Sized>(shard: &S, a: Args<'_>, out: &mut Vec<u8>) {
    if a.len().is_multiple_of(2) {
        return resp::error(out, "ERR wrong number of arguments for 'mset' command");
    }
    let mut writes = Vec::with_capacity(a.len() / 2);
    // Every pair checked before any is written, so bad input writes nothing.
    for i in (1..a.len()).step_by(2) {
        let (key, value) = (a.get(i), a.get(i + 1));
        if !check_key(key, out) || !check_value(value, out) {
            return;
        }
        writes.push(Write::Put(key, value));
    }
    match write(shard, &writes) {
        Ok(()) => resp::simple(out, "OK"),
        Err((_, why)) => resp::error(out, &format!("ERR {why}")),
    }
}

fn del<S: ShardBackend + ?Sized>(shard: &S, a: Args<'_>, out: &mut Vec<u8>) {
    let mut seen = HashSet::new();
    let mut writes = Vec::with_capacity(a.len() - 1);
    let mut present = 0;
    for i in 1..a.len() {
        let key = a.get(i);
        // A key over the bound cannot be stored, and a key named twice is
        // deleted (and counted) once, as Redis does.
        if key.len() > SHARD_DATA_KEY_BYTES_MAX || !seen.insert(key) {
            continue;
        }
        match read(shard, key, out) {
            Ok(Some(_)) => present += 1,
            Ok(None) => {}
            Err(()) => return,
        }
        // Deleted whether it was seen or not: it is gone after DEL even if
        // another client wrote it since the read.
        writes.push(Write::Delete(key));
    }
    if writes.is_empty() {
        return resp::integer(out, 0);
    }
    match write(shard, &writes) {
        Ok(()) => resp::integer(out, present),
        Err((_, why)) => resp::error(out, &format!("ERR {why}")),
    }
}

fn exists<S: ShardBackend + ?Sized>(shard: &S, a: Args<'_>, out: &mut Vec<u8>) {
    let mut n = 0;
    for i in 1..a.len() {
        let key = a.get(i);
        if key.len() > SHARD_DATA_KEY_BYTES_MAX {
            continue;
        }
        match read(shard, key, out) {
            Ok(Some(_)) => n += 1,
            Ok(None) => {}
            Err(()) => return,
        }
    }
    resp::integer(out, n);
}
