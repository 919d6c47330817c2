//! The commands about the server rather than keys: INFO, CONFIG and
//! COMMAND, answered in Redis's formats.

use std::fmt::Write as _;
use std::sync::atomic::Ordering;

use fabrickv_resp::parse_i64;
use fabrickv_resp::reply::{self as resp, Reply};
use fabrickv_storage::ShardBackend;

use super::args::{quoted, Args};
use super::clients::help;
use super::glob::stringmatch;
use super::table::{key_positions, lookup, lower, spec, Spec, COMMAND_NAME_BYTES_MAX, NO_KEYS};
use super::{RespShared, COMMANDS, REDIS_VERSION};
use crate::config::Mode;

/// What COMMAND reports about the commands in this file (DBSIZE, INFO, CONFIG, COMMAND, TIME,
/// SAVE, BGSAVE, LASTSAVE),
/// with Redis 7's values; `table` gathers every file's into the table.
#[rustfmt::skip]
pub(super) const SPECS: &[Spec] = &[
    spec! { "dbsize" Dbsize 1 ["readonly", "fast"] (0, 0, 0) ["@keyspace", "@read", "@fast"] NO_KEYS "server" "1.0.0" "O(1)" "Returns the number of keys in the database." ["request_policy:all_shards", "response_policy:agg_sum"] },
    spec! { "info" Info -1 ["loading", "stale", "sentinel"] (0, 0, 0) ["@slow", "@dangerous"] NO_KEYS "server" "1.0.0" "O(1)" "Returns information and statistics about the server." ["nondeterministic_output", "request_policy:all_shards", "response_policy:special"] },
    spec! { "config" Config -2 [] (0, 0, 0) ["@slow"] NO_KEYS "server" "2.0.0" "Depends on subcommand." "A container for server configuration commands." [] },
    spec! { "command" Command -1 ["loading", "stale", "sentinel"] (0, 0, 0) ["@slow", "@connection"] NO_KEYS "server" "2.8.13" "O(N) where N is the total number of Redis commands" "Returns detailed information about all commands." ["nondeterministic_output_order"] },
    spec! { "time" Time 1 ["loading", "stale", "fast"] (0, 0, 0) ["@fast"] NO_KEYS "server" "2.6.0" "O(1)" "Returns the server time." ["nondeterministic_output"] },
    spec! { "save" Save 1 ["admin", "noscript", "no_async_loading", "no_multi"] (0, 0, 0) ["@admin", "@slow", "@dangerous"] NO_KEYS "server" "1.0.0" "O(N) where N is the total number of keys in all databases" "Synchronously saves the database(s) to disk." ["request_policy:all_shards", "response_policy:all_succeeded"] },
    spec! { "bgsave" Bgsave -1 ["admin", "noscript", "no_async_loading"] (0, 0, 0) ["@admin", "@slow", "@dangerous"] NO_KEYS "server" "1.0.0" "O(1)" "Asynchronously saves the database(s) to disk." ["request_policy:all_shards", "response_policy:all_succeeded"] },
    spec! { "lastsave" Lastsave 1 ["loading", "stale", "fast"] (0, 0, 0) ["@admin", "@fast", "@dangerous"] NO_KEYS "server" "1.0.0" "O(1)" "Returns the Unix timestamp of the last successful save to disk." ["nondeterministic_output"] },
];

/// Most INFO section names looked at in one call: more are ignored.
const INFO_SECTIONS_MAX: usize = 32;

/// Clock ticks per second of `/proc/self/stat`'s CPU times (Linux's
/// `USER_HZ`, 100 on every architecture it supports).
const PROC_TICKS_PER_S: f64 = 100.0;

/// The `maxmemory-policy` Redis would show for a server in this mode.
pub(super) fn eviction_policy(mode: Mode) -> &'static str {
    match mode {
        Mode::Cache => "allkeys-fifo",
        Mode::Store => "noeviction",
    }
}

/// The sections `INFO` (and `INFO default`) shows, in Redis's order.
const DEFAULT_SECTIONS: &[&str] = &[
    "server",
    "clients",
    "memory",
    "persistence",
    "stats",
    "replication",
    "cpu",
    "modules",
    "errorstats",
    "cluster",
    "keyspace",
];

/// Which sections an INFO call asked for.
struct Wanted {
    names: Vec<Vec<u8>>,
    all: bool,
    default: bool,
}

impl Wanted {
    fn from(a: Args<'_>) -> Wanted {
        let mut w = Wanted {
            names: Vec::new(),
            all: false,
            default: a.len() == 1,
        };
        for i in 1..a.len().min(1 + INFO_SECTIONS_MAX) {
            let name = a.get(i).to_ascii_lowercase();
            match name.as_slice() {
                // FabricKV has no modules, so `everything` is `all`.
                b"all" | b"everything" => w.all = true,
                b"default" => w.default = true,
                _ => w.names.push(name),
            }
        }
        w
    }

    fn wants(&self, section: &str) -> bool {
        self.all
            || (self.default && DEFAULT_SECTIONS.contains(&section))
            || self.names.iter().any(|n| n == section.as_bytes())
    }
}

/// User and system CPU seconds of this process, from `/proc/self/stat`
/// (what `getrusage` reports); zeros where it cannot be read.
fn cpu_seconds() -> (f64, f64) {
    let Ok(stat) = std::fs::read_to_string("/proc/self/stat") else {
        return (0.0, 0.0);
    };
    // The command name may hold spaces; the fields follow its ')'.
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of the line, 12 and 13 here.
    let tick = |i: usize| {
        fields
            .get(i)
            .and_then(|f| f.parse::<u64>().ok())
            .map_or(0.0, |t| t as f64 / PROC_TICKS_PER_S)
    };
    (tick(11), tick(12))
}

pub(super) fn info(shared: &RespShared, a: Args<'_>, out: &mut Reply<'_>) {
    let want = Wanted::from(a);
    let e = shared.parts.stats();
    let base = *shared.engine_base.lock().unwrap_or_else(|p| p.into_inner());
    let c = &shared.counters;
    let mut s = String::new();
    let section = |name: &str, s: &mut String, body: &dyn Fn(&mut String)| {
        if want.wants(name) {
            if !s.is_empty() {
                s.push_str("\r\n");
            }
            body(s);
        }
    };
    section("server", &mut s, &|s| {
        let _ = write!(
            s,
            "# Server\r\nredis_version:{REDIS_VERSION}\r\nfabrickv_version:{}\r\nredis_mode:standalone\r\nos:{}\r\narch_bits:64\r\nmultiplexing_api:epoll\r\nprocess_id:{}\r\ntcp_port:{}\r\nuptime_in_seconds:{}\r\nuptime_in_days:{}\r\n",
            env!("CARGO_PKG_VERSION"),
            std::env::consts::OS,
            std::process::id(),
            shared.port,
            shared.started.elapsed().as_secs(),
            shared.started.elapsed().as_secs() / 86_400,
        );
    });
    section("clients", &mut s, &|s| {
        let (max_in, max_out) = shared.client_memory.take_recent_max();
        let _ = write!(
            s,
            "# Clients\r\nconnected_clients:{}\r\ncluster_connections:0\r\nmaxclients:{}\r\nclient_recent_max_input_buffer:{}\r\nclient_recent_max_output_buffer:{}\r\nblocked_clients:0\r\ntracking_clients:0\r\n",
            c.connected.load(Ordering::Relaxed),
            super::RESP_CLIENTS_MAX,
            max_in,
            max_out,
        );
    });
    section("memory", &mut s, &|s| {
        let _ = write!(
            s,
            "# Memory\r\nused_memory:{}\r\nmaxmemory:{}\r\nmaxmemory_policy:{}\r\nmem_clients_normal:{}\r\nmaxmemory_clients:{}\r\nlarge_values:{}\r\nlarge_values_bytes:{}\r\nlarge_values_pinned_bytes:{}\r\nlarge_values_maxbytes:{}\r\nlarge_receiving_bytes:{}\r\nslab_free_bytes:{}\r\nslab_pages_moved:{}\r\nslab_items_relocated:{}\r\n",
            e.bytes,
            shared.pool_bytes,
            eviction_policy(shared.mode),
            shared.client_memory.used_bytes(),
            shared.client_memory.cap_bytes(),
            e.large_values,
            e.large_bytes,
            e.large_pinned_bytes,
            e.large_bytes_max,
            shared.large_receiving_bytes(),
            e.slab_free_bytes,
            e.slab_pages_moved,
            e.slab_items_relocated,
        );
    });
    section("persistence", &mut s, &|s| {
        // Checkpoints stand in for RDB files; there is no AOF.
        let ck = shared.checkpoints.as_deref();
        let _ = write!(
            s,
            "# Persistence\r\nloading:0\r\nasync_loading:0\r\nrdb_bgsave_in_progress:{}\r\nrdb_last_save_time:{}\r\nrdb_last_bgsave_status:{}\r\naof_enabled:0\r\naof_rewrite_in_progress:0\r\n",
            u8::from(ck.is_some_and(|c| c.saving())),
            ck.map_or(0, |c| c.last_save_unix_s()),
            if ck.and_then(|c| c.last_error()).is_some() { "err" } else { "ok" },
        );
    });
    section("stats", &mut s, &|s| {
        let _ = write!(
            s,
            "# Stats\r\ntotal_connections_received:{}\r\ntotal_commands_processed:{}\r\nrejected_connections:{}\r\nexpired_keys:{}\r\nevicted_keys:{}\r\nkeyspace_hits:{}\r\nkeyspace_misses:{}\r\ntotal_error_replies:{}\r\ntotal_error_replies_protocol:{}\r\nacl_access_denied_auth:{}\r\nevicted_idle_clients:{}\r\nevicted_clients:{}\r\n",
            c.connections_received.load(Ordering::Relaxed),
            c.commands.load(Ordering::Relaxed),
            c.rejected.load(Ordering::Relaxed),
            e.expired.saturating_sub(base.expired),
            e.evictions.saturating_sub(base.evictions),
            e.hits.saturating_sub(base.hits),
            e.misses.saturating_sub(base.misses),
            shared.stats.error_replies.load(Ordering::Relaxed),
            c.protocol_errors.load(Ordering::Relaxed),
            c.auth_failures.load(Ordering::Relaxed),
            c.evicted_idle.load(Ordering::Relaxed),
            shared.client_memory.evicted(),
        );
    });
    section("replication", &mut s, &|s| {
        s.push_str(
            "# Replication\r\nrole:master\r\nconnected_slaves:0\r\nmaster_repl_offset:0\r\n",
        );
    });
    section("cpu", &mut s, &|s| {
        let (user, sys) = cpu_seconds();
        let _ = write!(
            s,
            "# CPU\r\nused_cpu_sys:{sys:.6}\r\nused_cpu_user:{user:.6}\r\n"
        );
    });
    section("modules", &mut s, &|s| s.push_str("# Modules\r\n"));
    section("commandstats", &mut s, &|s| {
        s.push_str("# Commandstats\r\n");
        shared.stats.commandstats(s);
    });
    section("errorstats", &mut s, &|s| {
        s.push_str("# Errorstats\r\n");
        shared.stats.errorstats(s);
    });
    section("cluster", &mut s, &|s| {
        s.push_str("# Cluster\r\ncluster_enabled:0\r\n")
    });
    section("keyspace", &mut s, &|s| {
        // FabricKV does not count the keys with a TTL: expires and
        // avg_ttl read 0 (see docs/resp.md).
        let _ = write!(
            s,
            "# Keyspace\r\ndb0:keys={},expires=0,avg_ttl=0\r\n",
            e.items
        );
        for (i, shard) in shared.dbs.iter().enumerate() {
            // An estimate: a shard counts its pairs exactly only by a scan.
            let _ = write!(
                s,
                "db{}:keys={},expires=0,avg_ttl=0\r\n",
                i + 1,
                shard.approximate_len()
            );
        }
    });
    out.verbatim_text(s.as_bytes());
}

/// TIME: the wall clock as Redis answers it, an array of two bulk
/// strings, Unix seconds and the microseconds into that second (clients
/// read it before EXPIREAT or SET PXAT to count from the server's clock).
pub(super) fn time(out: &mut Reply<'_>) {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    resp::array_header(out, 2);
    resp::bulk(out, now.as_secs().to_string().as_bytes());
    resp::bulk(out, now.subsec_micros().to_string().as_bytes());
}

/// SAVE: a checkpoint under `--checkpoint-dir`, answered once it is
/// whole (the connection's loop waits, as Redis's SAVE blocks).
pub(super) fn save(shared: &RespShared, out: &mut Reply<'_>) {
    match checkpoint_root(shared) {
        Ok((ck, root)) => match ck.save(&root) {
            Ok(_) => resp::simple(out, "OK"),
            Err(crate::checkpoint::CheckpointError::Busy) => {
                resp::error(out, "ERR Background save already in progress")
            }
            Err(e) => resp::error(out, &format!("ERR {e}")),
        },
        Err(e) => resp::error(out, &e),
    }
}

/// BGSAVE [SCHEDULE]: a checkpoint on a thread of its own.
pub(super) fn bgsave(shared: &RespShared, out: &mut Reply<'_>) {
    match checkpoint_root(shared) {
        Ok((ck, root)) => match ck.save_in_background(root) {
            Ok(()) => resp::simple(out, "Background saving started"),
            Err(crate::checkpoint::CheckpointError::Busy) => {
                resp::error(out, "ERR Background save already in progress")
            }
            Err(e) => resp::error(out, &format!("ERR {e}")),
        },
        Err(e) => resp::error(out, &e),
    }
}

/// LASTSAVE: Unix seconds of the last checkpoint that completed (0: none).
pub(super) fn lastsave(shared: &RespShared, out: &mut Reply<'_>) {
    let t = shared
        .checkpoints
        .as_ref()
        .map_or(0, |c| c.last_save_unix_s());
    resp::integer(out, t as i64);
}

fn checkpoint_root(
    shared: &RespShared,
) -> Result<
    (
        &std::sync::Arc<crate::checkpoint::Checkpoints>,
        std::path::PathBuf,
    ),
    String,
> {
    let ck = shared
        .checkpoints
        .as_ref()
        .ok_or_else(|| format!("ERR {}", crate::checkpoint::CheckpointError::NoDir))?;
    let root = ck.resolve(None).map_err(|e| format!("ERR {e}"))?;
    Ok((ck, root))
}

/// The parameters CONFIG SET changes while the server runs.
const SETTABLE: &[&str] = &["timeout"];

/// The parameters CONFIG GET shows and CONFIG SET refuses as fixed at
/// start (Redis's "immutable"). `requirepass` is refused too but never
/// shown: Redis would show the password.
const FIXED: &[&str] = &[
    "save",
    "appendonly",
    "databases",
    "maxmemory",
    "maxmemory-policy",
    "maxmemory-clients",
    "port",
    "bind",
    "maxclients",
    "proto-max-bulk-len",
    "notify-keyspace-events",
    "cluster-enabled",
    "requirepass",
];

/// CONFIG HELP.
const CONFIG_HELP: &[&str] = &[
    "CONFIG <subcommand> [<arg> [value] [opt] ...]. Subcommands are:",
    "GET <pattern> [<pattern> ...]",
    "    The settings whose names match a glob pattern, with their values.",
    "SET <parameter> <value> [<parameter> <value> ...]",
    "    Change settings while the server runs (only 'timeout' can be).",
    "RESETSTAT",
    "    Zero INFO's counters, commandstats and errorstats.",
    "HELP",
    "    This text.",
];

/// COMMAND HELP.
const COMMAND_HELP: &[&str] = &[
    "COMMAND <subcommand> [<arg> [value] [opt] ...]. Subcommands are:",
    "(no subcommand)",
    "    Every command's details.",
    "COUNT",
    "    How many commands there are.",
    "LIST",
    "    Every command's name.",
    "INFO [<command-name> ...]",
    "    The details of the commands named (or of all).",
    "DOCS [<command-name> ...]",
    "    The documentation of the commands named (or of all).",
    "GETKEYS <full-command>",
    "    The keys of a full command.",
    "HELP",
    "    This text.",
];

/// CONFIG GET pattern... | SET parameter value [parameter value ...] |
/// RESETSTAT | HELP.
pub(super) fn config(shared: &RespShared, a: Args<'_>, out: &mut Reply<'_>) {
    let mut sub = [0u8; COMMAND_NAME_BYTES_MAX];
    match lower(a.get(1), &mut sub) {
        b"get" if a.len() >= 3 => config_get(shared, a, out),
        b"get" => resp::error(
            out,
            "ERR wrong number of arguments for 'config|get' command",
        ),
        b"set" if a.len() >= 4 && a.len().is_multiple_of(2) => config_set(shared, a, out),
        b"set" => resp::error(
            out,
            "ERR wrong number of arguments for 'config|set' command",
        ),
        b"resetstat" if a.len() == 2 => {
            shared.reset_stats();
            resp::simple(out, "OK")
        }
        b"help" if a.len() == 2 => help(out, CONFIG_HELP),
        b"resetstat" => resp::error(
            out,
            "ERR wrong number of arguments for 'config|resetstat' command",
        ),
        _ => {
            let arg = a.get(1);
            let shown = quoted(arg);
            resp::error(
                out,
                &format!("ERR unknown subcommand '{shown}'. Try CONFIG HELP."),
            )
        }
    }
}

/// CONFIG GET's parameters: those clients read at start that FabricKV
/// can answer truthfully, each with its value now, in Redis's spelling.
fn config_params(shared: &RespShared) -> Vec<(&'static str, String)> {
    let timeout_ms = shared.idle_timeout_ms.load(Ordering::Relaxed);
    let mut params = vec![
        // Database 0 is in memory only: no snapshots, no append-only file.
        ("save", String::new()),
        ("appendonly", "no".into()),
        // The kv, then one database per persistent shard.
        ("databases", (1 + shared.dbs.len()).to_string()),
        ("maxmemory", shared.pool_bytes.to_string()),
        ("maxmemory-policy", eviction_policy(shared.mode).into()),
        // The server-wide cap on what client connections buffer.
        (
            "maxmemory-clients",
            shared.client_memory.cap_bytes().to_string(),
        ),
        ("port", shared.port.to_string()),
        ("maxclients", super::RESP_CLIENTS_MAX.to_string()),
        ("timeout", timeout_ms.div_ceil(1000).to_string()),
        (
            "proto-max-bulk-len",
            fabrickv_resp::limits::RESP_BULK_BYTES_MAX.to_string(),
        ),
        // No keyspace notifications are sent, and there is no cluster mode.
        ("notify-keyspace-events", String::new()),
        ("cluster-enabled", "no".into()),
    ];
    if let Some(bind) = &shared.bind {
        params.push(("bind", bind.clone()));
    }
    params
}

/// CONFIG GET pattern [pattern ...], as Redis 7: a pattern holding one
/// of `*?[` is a case-insensitive glob (`*`, `?`, `[...]`, `\x`) over the
/// names; any other is one name, matched in any case and answered in the
/// spelling it was asked in (Redis echoes it). A parameter several
/// patterns match is listed once; the reply is a map (RESP3) or a flat
/// array of names and values.
fn config_get(shared: &RespShared, a: Args<'_>, out: &mut Reply<'_>) {
    let params = config_params(shared);
    // Index into `params` and, for a name asked for exactly, its spelling.
    let mut found: Vec<(usize, Option<&[u8]>)> = Vec::new();
    for i in 2..a.len() {
        let asked = a.get(i);
        let pattern = asked.to_ascii_lowercase();
        let is_glob = pattern.iter().any(|c| matches!(c, b'*' | b'?' | b'['));
        for (j, (name, _)) in params.iter().enumerate() {
            let hit = if is_glob {
                stringmatch(&pattern, name.as_bytes())
            } else {
                pattern == name.as_bytes()
            };
            if hit && !found.iter().any(|&(f, _)| f == j) {
                found.push((j, (!is_glob).then_some(asked)));
            }
        }
    }
    out.map_header(found.len());
    for (j, spelled) in found {
        let (name, value) = &params[j];
        resp::bulk(out, spelled.unwrap_or(name.as_bytes()));
        resp::bulk(out, value.as_bytes());
    }
}

/// CONFIG SET checks every pair before it applies any, as Redis does.
fn config_set(shared: &RespShared, a: Args<'_>, out: &mut Reply<'_>) {
    let mut timeout_ms = None;
    for i in (2..a.len()).step_by(2) {
        let name = a.get(i).to_ascii_lowercase();
        let shown = quoted(&name);
        let fail = |out: &mut Reply<'_>, why: &str| {
            resp::error(
                out,
                &format!("ERR CONFIG SET failed (possibly related to argument '{shown}') - {why}"),
            )
        };
        if SETTABLE.contains(&shown.as_str()) {
            // timeout: whole seconds, 0 for none.
            match parse_i64(a.get(i + 1)) {
                Some(n) if n >= 0 => {
                    timeout_ms = Some((n as u64).saturating_mul(1000));
                }
                Some(_) => return fail(out, "argument must be between 0 and 2147483647 inclusive"),
                None => return fail(out, "argument couldn't be parsed into an integer"),
            }
        } else if FIXED.contains(&shown.as_str()) {
            return fail(out, "can't set immutable config");
        } else {
            return fail(out, &format!("Unsupported CONFIG parameter: {shown}"));
        }
    }
    if let Some(ms) = timeout_ms {
        shared.idle_timeout_ms.store(ms, Ordering::Relaxed);
    }
    resp::simple(out, "OK")
}

/// COMMAND | COUNT | LIST | INFO name... | DOCS name... | GETKEYS cmd
/// args...
pub(super) fn command_info(a: Args<'_>, out: &mut Reply<'_>) {
    let mut sub = [0u8; COMMAND_NAME_BYTES_MAX];
    if a.len() == 1 {
        resp::array_header(out, COMMANDS.len());
        for spec in COMMANDS {
            write_info(spec, out);
        }
        return;
    }
    match lower(a.get(1), &mut sub) {
        b"count" if a.len() == 2 => resp::integer(out, COMMANDS.len() as i64),
        b"list" if a.len() == 2 => {
            resp::array_header(out, COMMANDS.len());
            for spec in COMMANDS {
                resp::bulk(out, spec.name.as_bytes());
            }
        }
        b"info" => {
            if a.len() == 2 {
                resp::array_header(out, COMMANDS.len());
                for spec in COMMANDS {
                    write_info(spec, out);
                }
                return;
            }
            resp::array_header(out, a.len() - 2);
            for i in 2..a.len() {
                let mut buf = [0u8; COMMAND_NAME_BYTES_MAX];
                match lookup(lower(a.get(i), &mut buf)) {
                    Some(spec) => write_info(spec, out),
                    // Redis's null: `$-1` in RESP2, `_` in RESP3.
                    None => out.null(),
                }
            }
        }
        b"docs" => {
            let specs: Vec<&Spec> = if a.len() == 2 {
                COMMANDS.iter().collect()
            } else {
                (2..a.len())
                    .filter_map(|i| {
                        let mut buf = [0u8; COMMAND_NAME_BYTES_MAX];
                        lookup(lower(a.get(i), &mut buf))
                    })
                    .collect()
            };
            out.map_header(specs.len());
            for spec in specs {
                resp::bulk(out, spec.name.as_bytes());
                out.map_header(4);
                for (k, v) in [
                    ("summary", spec.summary),
                    ("since", spec.since),
                    ("group", spec.group),
                    ("complexity", spec.complexity),
                ] {
                    resp::bulk(out, k.as_bytes());
                    resp::bulk(out, v.as_bytes());
                }
            }
        }
        b"getkeys" if a.len() >= 3 => getkeys(a, out),
        b"help" if a.len() == 2 => help(out, COMMAND_HELP),
        b"getkeys" => resp::error(
            out,
            "ERR wrong number of arguments for 'command|getkeys' command",
        ),
        _ => {
            let arg = a.get(1);
            let shown = quoted(arg);
            resp::error(
                out,
                &format!("ERR unknown subcommand or wrong number of arguments for '{shown}'. Try COMMAND HELP."),
            )
        }
    }
}

/// COMMAND GETKEYS cmd args...: the keys of that call, from the table.
fn getkeys(a: Args<'_>, out: &mut Reply<'_>) {
    let mut buf = [0u8; COMMAND_NAME_BYTES_MAX];
    let Some(spec) = lookup(lower(a.get(2), &mut buf)) else {
        return resp::error(out, "ERR Invalid command specified");
    };
    let argc = a.len() - 2;
    if (spec.arity >= 0 && argc != spec.arity as usize)
        || (spec.arity < 0 && argc < spec.arity.unsigned_abs() as usize)
    {
        return resp::error(out, "ERR Invalid number of arguments specified for command");
    }
    let keys = key_positions(spec, argc);
    if keys.is_empty() {
        return resp::error(out, "ERR The command has no key arguments");
    }
    resp::array_header(out, keys.len());
    for k in keys {
        resp::bulk(out, a.get(2 + k));
    }
}

/// One command's COMMAND INFO entry, in Redis 7's shape: name, arity,
/// flags, first key, last key, step, ACL categories, tips, key specs,
/// subcommands.
fn write_info(spec: &Spec, out: &mut Reply<'_>) {
    resp::array_header(out, 10);
    resp::bulk(out, spec.name.as_bytes());
    resp::integer(out, i64::from(spec.arity));
    out.set_header(spec.flags.len());
    for f in spec.flags {
        resp::simple(out, f);
    }
    resp::integer(out, i64::from(spec.first_key));
    resp::integer(out, i64::from(spec.last_key));
    resp::integer(out, i64::from(spec.step));
    out.set_header(spec.acl.len());
    for c in spec.acl {
        resp::simple(out, c);
    }
    // Tips, key specs and subcommands are sets in RESP3, as Redis 7
    // sends them.
    let tips = spec.tips;
    out.set_header(tips.len());
    for t in tips {
        resp::bulk(out, t.as_bytes());
    }
    out.set_header(spec.key_specs.len());
    for ks in spec.key_specs {
        out.map_header(3);
        resp::bulk(out, b"flags");
        out.set_header(ks.flags.len());
        for f in ks.flags {
            resp::simple(out, f);
        }
        resp::bulk(out, b"begin_search");
        out.map_header(2);
        resp::bulk(out, b"type");
        resp::bulk(out, b"index");
        resp::bulk(out, b"spec");
        out.map_header(1);
        resp::bulk(out, b"index");
        resp::integer(out, i64::from(ks.index));
        resp::bulk(out, b"find_keys");
        out.map_header(2);
        resp::bulk(out, b"type");
        resp::bulk(out, b"range");
        resp::bulk(out, b"spec");
        out.map_header(3);
        resp::bulk(out, b"lastkey");
        resp::integer(out, i64::from(ks.lastkey));
        resp::bulk(out, b"keystep");
        resp::integer(out, i64::from(ks.keystep));
        resp::bulk(out, b"limit");
        resp::integer(out, i64::from(ks.limit));
    }
    out.set_header(0);
}
