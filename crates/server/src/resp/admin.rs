//! The commands about the server rather than keys: INFO, CONFIG and
//! COMMAND, answered the way Redis clients and tools expect at start.

use std::sync::atomic::Ordering;

use fabrickv_resp::reply as resp;
use fabrickv_storage::ShardBackend;

use super::args::Args;
use super::table::{lower, COMMANDS, COMMAND_NAME_BYTES_MAX};
use super::RespShared;
use crate::config::Mode;

/// The `maxmemory-policy` Redis would show for a server in this mode.
pub(super) fn eviction_policy(mode: Mode) -> &'static str {
    match mode {
        Mode::Cache => "allkeys-fifo",
        Mode::Store => "noeviction",
    }
}

pub(super) fn info(shared: &RespShared, a: Args<'_>, out: &mut Vec<u8>) {
    let mut section = [0u8; COMMAND_NAME_BYTES_MAX];
    let want = if a.len() > 1 {
        lower(a.get(1), &mut section)
    } else {
        b"default"
    };
    let all = matches!(want, b"default" | b"all" | b"everything");
    let e = shared.parts.stats();
    let c = &shared.counters;
    let mut s = String::new();
    let mut add = |name: &[u8], body: String| {
        if all || want == name {
            if !s.is_empty() {
                s.push_str("\r\n");
            }
            s.push_str(&body);
        }
    };
    add(
        b"server",
        format!(
            "# Server\r\nredis_version:7.0.0\r\nfabrickv_version:{}\r\nredis_mode:standalone\r\nos:{}\r\narch_bits:64\r\nprocess_id:{}\r\ntcp_port:{}\r\nuptime_in_seconds:{}\r\n",
            env!("CARGO_PKG_VERSION"),
            std::env::consts::OS,
            std::process::id(),
            shared.port,
            shared.started.elapsed().as_secs(),
        ),
    );
    add(
        b"clients",
        format!(
            "# Clients\r\nconnected_clients:{}\r\n",
            c.connected.load(Ordering::Relaxed)
        ),
    );
    let policy = eviction_policy(shared.mode);
    add(
        b"memory",
        format!(
            "# Memory\r\nused_memory:{}\r\nmaxmemory:{}\r\nmaxmemory_policy:{policy}\r\nlarge_values:{}\r\nlarge_values_bytes:{}\r\nlarge_values_maxbytes:{}\r\nlarge_receiving_bytes:{}\r\n",
            e.bytes,
            shared.pool_bytes,
            e.large_values,
            e.large_bytes,
            e.large_bytes_max,
            shared.large_receiving_bytes()
        ),
    );
    add(
        b"stats",
        format!(
            "# Stats\r\ntotal_connections_received:{}\r\ntotal_commands_processed:{}\r\nrejected_connections:{}\r\nexpired_keys:{}\r\nevicted_keys:{}\r\nkeyspace_hits:{}\r\nkeyspace_misses:{}\r\ntotal_error_replies_protocol:{}\r\nacl_access_denied_auth:{}\r\nevicted_idle_clients:{}\r\n",
            c.connections_received.load(Ordering::Relaxed),
            c.commands.load(Ordering::Relaxed),
            c.rejected.load(Ordering::Relaxed),
            e.expired,
            e.evictions,
            e.hits,
            e.misses,
            c.protocol_errors.load(Ordering::Relaxed),
            c.auth_failures.load(Ordering::Relaxed),
            c.evicted_idle.load(Ordering::Relaxed),
        ),
    );
    let mut keyspace = format!("# Keyspace\r\ndb0:keys={}\r\n", e.items);
    for (i, shard) in shared.dbs.iter().enumerate() {
        // An estimate: a shard counts its pairs exactly only by a scan.
        keyspace.push_str(&format!("db{}:keys={}\r\n", i + 1, shard.approximate_len()));
    }
    add(b"keyspace", keyspace);
    resp::bulk(out, s.as_bytes());
}

/// CONFIG GET answers what clients ask at start (redis-benchmark asks for
/// `save` and `appendonly`); CONFIG SET is refused, settings being fixed
/// at start.
pub(super) fn config(shared: &RespShared, a: Args<'_>, out: &mut Vec<u8>) {
    let mut sub = [0u8; COMMAND_NAME_BYTES_MAX];
    match lower(a.get(1), &mut sub) {
        b"get" if a.len() >= 3 => {
            let policy = eviction_policy(shared.mode);
            let params: [(&str, String); 6] = [
                ("save", String::new()),
                ("appendonly", "no".into()),
                ("databases", (1 + shared.dbs.len()).to_string()),
                ("maxmemory", shared.pool_bytes.to_string()),
                ("maxmemory-policy", policy.into()),
                ("port", shared.port.to_string()),
            ];
            let mut found: Vec<(&str, String)> = Vec::new();
            for i in 2..a.len() {
                let pattern = a.get(i).to_ascii_lowercase();
                for (k, v) in &params {
                    if glob_match(&pattern, k.as_bytes()) && !found.iter().any(|(f, _)| f == k) {
                        found.push((k, v.clone()));
                    }
                }
            }
            resp::array_header(out, found.len() * 2);
            for (k, v) in found {
                resp::bulk(out, k.as_bytes());
                resp::bulk(out, v.as_bytes());
            }
        }
        b"set" => resp::error(
            out,
            "ERR CONFIG SET is not supported: FabricKV's settings are fixed at start",
        ),
        b"resetstat" => resp::simple(out, "OK"),
        _ => resp::error(
            out,
            "ERR unknown CONFIG subcommand or wrong number of arguments (FabricKV answers CONFIG GET)",
        ),
    }
}

pub(super) fn command_info(a: Args<'_>, out: &mut Vec<u8>) {
    let mut sub = [0u8; COMMAND_NAME_BYTES_MAX];
    match a.len() {
        1 => resp::array_header(out, 0),
        _ => match lower(a.get(1), &mut sub) {
            b"count" => resp::integer(out, COMMANDS.len() as i64),
            // Clients use these for hints only; an empty answer is valid.
            b"docs" | b"info" => resp::array_header(out, 0),
            _ => resp::error(out, "ERR unknown COMMAND subcommand"),
        },
    }
}

/// Redis's glob subset for CONFIG GET: `*`, `?` and literal bytes.
/// Iterative with one backtrack point, so a hostile pattern of many stars
/// costs O(pattern x name), not an exponential search.
pub(super) fn glob_match(pattern: &[u8], s: &[u8]) -> bool {
    let (mut p, mut i) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while i < s.len() {
        match pattern.get(p) {
            Some(b'*') => {
                star = Some((p, i));
                p += 1;
            }
            Some(&c) if c == b'?' || c == s[i] => {
                p += 1;
                i += 1;
            }
            _ => match star {
                Some((sp, si)) => {
                    p = sp + 1;
                    i = si + 1;
                    star = Some((sp, si + 1));
                }
                None => return false,
            },
        }
    }
    pattern[p.min(pattern.len())..].iter().all(|&c| c == b'*')
}
