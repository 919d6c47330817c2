//! The registry of live RESP connections, and the CLIENT command that
//! reads and changes it.
//!
//! Each connection owns one [`ClientEntry`]: what CLIENT LIST shows of it
//! (addresses, name, library, database, times, last command) in fields
//! another connection can read without stopping it. The registry maps ids
//! to entries for CLIENT LIST and CLIENT KILL; it holds at most
//! [`RESP_CLIENTS_MAX`] (the connection cap), and a connection leaves it when
//! it is dropped. A kill sets the entry's flag and wakes the socket loop
//! that owns the connection, which closes it at its next turn.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use fabrickv_resp::parse_i64;
use fabrickv_resp::reply::{self as resp, Proto, Reply};

use super::args::{quoted, Args};
use super::table::{lower, spec, Spec, COMMAND_NAME_BYTES_MAX, NO_KEYS};
use super::COMMANDS;

/// What COMMAND reports about the commands in this file (CLIENT),
/// with Redis 7's values; `table` gathers every file's into the table.
#[rustfmt::skip]
pub(super) const SPECS: &[Spec] = &[
    spec! { "client" Client -2 ["sentinel"] (0, 0, 0) ["@slow"] NO_KEYS "connection" "2.4.0" "Depends on subcommand." "A container for client connection commands." [] },
];

/// Most connections the registry lists at once: the RESP connection cap,
/// so every open connection fits.
pub const RESP_CLIENTS_MAX: usize = fabrickv_types::limits::CONNECTIONS_MAX;

/// Longest client name, library name or library version, in bytes. Redis
/// sets none; this one keeps what the registry holds bounded (three of
/// them for each of [`RESP_CLIENTS_MAX`] connections: 12 MiB at most).
pub const RESP_CLIENT_NAME_BYTES_MAX: usize = 1024;

/// How a kill reaches the socket loop that owns a connection: a flag that
/// says "one of yours was killed", and the loop's waker.
#[derive(Clone)]
pub struct KillNotify {
    /// Set when a connection of the loop is killed; the loop clears it and
    /// looks for its killed connections.
    pub pending: Arc<AtomicBool>,
    /// Wakes the loop from its poll.
    pub waker: Arc<mio::Waker>,
}

/// Where a connection comes from, as the socket loop knows it.
#[derive(Clone, Default)]
pub struct ClientPeer {
    /// The client's address (`ip:port`).
    pub addr: String,
    /// The server address it connected to.
    pub laddr: String,
    /// The socket's file descriptor.
    pub fd: i64,
    /// When it connected (engine milliseconds).
    pub now_ms: u64,
    /// How to wake its loop when it is killed (none in tests).
    pub kill: Option<KillNotify>,
}

/// What a connection sets about itself (CLIENT SETNAME, SETINFO).
#[derive(Debug, Default, Clone)]
struct Names {
    name: String,
    lib_name: String,
    lib_ver: String,
}

/// One connection as CLIENT LIST shows it.
pub struct ClientEntry {
    pub(super) id: u64,
    addr: String,
    laddr: String,
    fd: i64,
    created_ms: u64,
    /// When it last sent a command (engine ms).
    pub(super) active_ms: AtomicU64,
    pub(super) db: AtomicU64,
    proto: AtomicU8,
    /// Its last command: 1 + its place in the table; 0 before the first.
    pub(super) last_cmd: AtomicUsize,
    names: Mutex<Names>,
    killed: AtomicBool,
    kill: Option<KillNotify>,
}

impl ClientEntry {
    pub(super) fn new(id: u64, peer: ClientPeer) -> ClientEntry {
        ClientEntry {
            id,
            addr: peer.addr,
            laddr: peer.laddr,
            fd: peer.fd,
            created_ms: peer.now_ms,
            active_ms: AtomicU64::new(peer.now_ms),
            db: AtomicU64::new(0),
            proto: AtomicU8::new(2),
            last_cmd: AtomicUsize::new(0),
            names: Mutex::new(Names::default()),
            killed: AtomicBool::new(false),
            kill: peer.kill,
        }
    }

    fn names(&self) -> std::sync::MutexGuard<'_, Names> {
        self.names.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether CLIENT KILL closed it.
    pub fn killed(&self) -> bool {
        self.killed.load(Ordering::Acquire)
    }

    pub(super) fn set_proto(&self, proto: Proto) {
        self.proto.store(proto.version() as u8, Ordering::Relaxed);
    }

    /// Marks it killed and wakes its loop.
    fn kill(&self) {
        self.killed.store(true, Ordering::Release);
        if let Some(k) = &self.kill {
            k.pending.store(true, Ordering::Release);
            let _ = k.waker.wake();
        }
    }

    /// Sets its name (empty: none) if `name` is a valid one.
    pub(super) fn set_name(&self, name: &[u8]) -> Result<(), &'static str> {
        if !valid_name(name) {
            return Err("ERR Client names cannot contain spaces, newlines or special characters.");
        }
        if name.len() > RESP_CLIENT_NAME_BYTES_MAX {
            return Err(NAME_TOO_LONG);
        }
        self.names().name = String::from_utf8_lossy(name).into_owned();
        Ok(())
    }

    /// Its CLIENT LIST line, newline included.
    fn line(&self, now_ms: u64, s: &mut String) {
        let names = self.names().clone();
        let cmd = match self.last_cmd.load(Ordering::Relaxed) {
            0 => "NULL",
            i => COMMANDS.get(i - 1).map_or("NULL", |c| c.name),
        };
        let _ = writeln!(
            s,
            "id={} addr={} laddr={} fd={} name={} age={} idle={} flags=N db={} sub=0 psub=0 ssub=0 multi=-1 qbuf=0 qbuf-free=0 argv-mem=0 multi-mem=0 rbs=0 rbp=0 obl=0 oll=0 omem=0 tot-mem=0 events=r cmd={} user=default redir=-1 resp={} lib-name={} lib-ver={}",
            self.id,
            self.addr,
            self.laddr,
            self.fd,
            names.name,
            now_ms.saturating_sub(self.created_ms) / 1000,
            now_ms.saturating_sub(self.active_ms.load(Ordering::Relaxed)) / 1000,
            self.db.load(Ordering::Relaxed),
            cmd,
            self.proto.load(Ordering::Relaxed),
            names.lib_name,
            names.lib_ver,
        );
    }
}

/// The error for a name or library info past [`RESP_CLIENT_NAME_BYTES_MAX`].
const NAME_TOO_LONG: &str = "ERR client names and library info are at most 1024 bytes";

const _: () = assert!(
    RESP_CLIENT_NAME_BYTES_MAX == 1024,
    "NAME_TOO_LONG says 1024"
);

/// Redis's rule for client names and library info: printable ASCII
/// without spaces (`!` to `~`).
fn valid_name(s: &[u8]) -> bool {
    s.iter().all(|&b| (b'!'..=b'~').contains(&b))
}

/// Every live connection's entry, by id.
#[derive(Default)]
pub struct ClientRegistry {
    clients: Mutex<BTreeMap<u64, Arc<ClientEntry>>>,
}

impl ClientRegistry {
    fn map(&self) -> std::sync::MutexGuard<'_, BTreeMap<u64, Arc<ClientEntry>>> {
        self.clients.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Lists `entry`; false (and not listed) when the registry is full.
    pub(super) fn add(&self, entry: Arc<ClientEntry>) -> bool {
        let mut map = self.map();
        if map.len() >= RESP_CLIENTS_MAX {
            return false;
        }
        map.insert(entry.id, entry);
        true
    }

    pub(super) fn remove(&self, id: u64) {
        self.map().remove(&id);
    }

    /// The entries, in id order.
    fn snapshot(&self) -> Vec<Arc<ClientEntry>> {
        self.map().values().cloned().collect()
    }

    /// Connections listed now.
    pub fn len(&self) -> usize {
        self.map().len()
    }

    /// Whether none is listed.
    pub fn is_empty(&self) -> bool {
        self.map().is_empty()
    }
}

/// `ERR wrong number of arguments for 'client|sub' command`.
fn sub_arity(out: &mut Reply<'_>, sub: &str) {
    resp::error(
        out,
        &format!("ERR wrong number of arguments for 'client|{sub}' command"),
    );
}

/// The subcommands and their arity, as Redis counts them (CLIENT and the
/// subcommand included; negative: at least).
const SUBCOMMANDS: &[(&str, i32)] = &[
    ("id", 2),
    ("getname", 2),
    ("setname", 3),
    ("info", 2),
    ("list", -2),
    ("kill", -3),
    ("setinfo", 4),
    ("no-evict", 3),
    ("no-touch", 3),
    ("help", 2),
];

/// CLIENT HELP.
const CLIENT_HELP: &[&str] = &[
    "CLIENT <subcommand> [<arg> [value] [opt] ...]. Subcommands are:",
    "ID",
    "    The id of this connection.",
    "GETNAME | SETNAME <name>",
    "    Read or set this connection's name (printable, no spaces).",
    "INFO",
    "    This connection, as a CLIENT LIST line.",
    "LIST [TYPE normal] [ID <id> ...]",
    "    Every connection, one line each.",
    "KILL <ip:port> | KILL [ID <id>] [ADDR <ip:port>] [LADDR <ip:port>] [USER default] [TYPE normal] [MAXAGE <s>] [SKIPME yes|no]",
    "    Close the connections that match.",
    "SETINFO LIB-NAME|LIB-VER <value>",
    "    Record the client library's name or version.",
    "NO-EVICT on|off | NO-TOUCH on|off",
    "    Accepted; FabricKV changes nothing for them.",
    "HELP",
    "    This text.",
];

/// Writes a HELP reply: one status line per entry.
pub(super) fn help(out: &mut Reply<'_>, lines: &[&str]) {
    resp::array_header(out, lines.len());
    for l in lines {
        resp::simple(out, l);
    }
}

/// CLIENT ID | GETNAME | SETNAME | INFO | LIST | KILL | SETINFO |
/// NO-EVICT | NO-TOUCH.
pub(super) fn client(
    reg: &ClientRegistry,
    me: &ClientEntry,
    a: Args<'_>,
    now_ms: u64,
    out: &mut Reply<'_>,
) {
    let mut buf = [0u8; COMMAND_NAME_BYTES_MAX];
    let sub = lower(a.get(1), &mut buf);
    let Some(&(name, arity)) = SUBCOMMANDS.iter().find(|(n, _)| n.as_bytes() == sub) else {
        let shown = quoted(a.get(1));
        return resp::error(
            out,
            &format!("ERR unknown subcommand '{shown}'. Try CLIENT HELP."),
        );
    };
    let argc = a.len();
    if (arity >= 0 && argc != arity as usize) || (arity < 0 && argc < arity.unsigned_abs() as usize)
    {
        return sub_arity(out, name);
    }
    match name {
        "id" => resp::integer(out, me.id as i64),
        "getname" => {
            let n = me.names().name.clone();
            if n.is_empty() {
                out.null()
            } else {
                resp::bulk(out, n.as_bytes())
            }
        }
        "setname" => match me.set_name(a.get(2)) {
            Ok(()) => resp::simple(out, "OK"),
            Err(e) => resp::error(out, e),
        },
        "setinfo" => {
            let mut abuf = [0u8; COMMAND_NAME_BYTES_MAX];
            let attr = lower(a.get(2), &mut abuf);
            let value = a.get(3);
            let which = match attr {
                b"lib-name" => "lib-name",
                b"lib-ver" => "lib-ver",
                _ => {
                    let shown = quoted(a.get(2));
                    return resp::error(out, &format!("ERR Unrecognized option '{shown}'"));
                }
            };
            if !valid_name(value) {
                return resp::error(
                    out,
                    &format!("ERR {which} cannot contain spaces, newlines or special characters."),
                );
            }
            if value.len() > RESP_CLIENT_NAME_BYTES_MAX {
                return resp::error(out, NAME_TOO_LONG);
            }
            let v = String::from_utf8_lossy(value).into_owned();
            let mut names = me.names();
            if which == "lib-name" {
                names.lib_name = v;
            } else {
                names.lib_ver = v;
            }
            drop(names);
            resp::simple(out, "OK")
        }
        "no-evict" | "no-touch" => {
            let mut vbuf = [0u8; COMMAND_NAME_BYTES_MAX];
            match lower(a.get(2), &mut vbuf) {
                b"on" | b"off" => resp::simple(out, "OK"),
                _ => resp::error(out, "ERR syntax error"),
            }
        }
        "info" => {
            let mut s = String::new();
            me.line(now_ms, &mut s);
            out.verbatim_text(s.as_bytes());
        }
        "list" => list(reg, a, now_ms, out),
        "help" => help(out, CLIENT_HELP),
        _ => kill(reg, me, a, out),
    }
}

/// CLIENT LIST [TYPE type] [ID id ...].
fn list(reg: &ClientRegistry, a: Args<'_>, now_ms: u64, out: &mut Reply<'_>) {
    let mut ids: Option<Vec<u64>> = None;
    let mut normal_only = true;
    let mut i = 2;
    while i < a.len() {
        let mut kbuf = [0u8; COMMAND_NAME_BYTES_MAX];
        match lower(a.get(i), &mut kbuf) {
            b"type" if i + 1 < a.len() => {
                let mut tbuf = [0u8; COMMAND_NAME_BYTES_MAX];
                match lower(a.get(i + 1), &mut tbuf) {
                    b"normal" => normal_only = true,
                    b"master" | b"replica" | b"slave" | b"pubsub" => normal_only = false,
                    _ => {
                        let shown = quoted(a.get(i + 1));
                        return resp::error(out, &format!("ERR Unknown client type '{shown}'"));
                    }
                }
                i += 2;
            }
            b"id" if i + 1 < a.len() => {
                let mut v = Vec::new();
                i += 1;
                while i < a.len() {
                    match parse_i64(a.get(i)) {
                        Some(n) if n > 0 => v.push(n as u64),
                        _ => return resp::error(out, "ERR Invalid client ID"),
                    }
                    i += 1;
                }
                ids = Some(v);
            }
            _ => return resp::error(out, "ERR syntax error"),
        }
    }
    let mut s = String::new();
    if normal_only {
        for e in reg.snapshot() {
            if ids.as_ref().is_none_or(|v| v.contains(&e.id)) {
                e.line(now_ms, &mut s);
            }
        }
    }
    out.verbatim_text(s.as_bytes());
}

/// What a CLIENT KILL matches.
#[derive(Default)]
struct KillFilter {
    id: Option<u64>,
    addr: Option<Vec<u8>>,
    laddr: Option<Vec<u8>>,
    /// Only clients of this type: `Some(false)` for a type FabricKV has
    /// none of (master, replica, pubsub).
    normal: Option<bool>,
    max_age_s: Option<u64>,
    skip_me: bool,
}

/// CLIENT KILL ip:port, or CLIENT KILL with filters (ID, ADDR, LADDR,
/// USER, TYPE, MAXAGE, SKIPME).
fn kill(reg: &ClientRegistry, me: &ClientEntry, a: Args<'_>, out: &mut Reply<'_>) {
    if a.len() == 3 {
        // The old form: one address, answered OK or an error, and the
        // caller may name itself.
        let addr = a.get(2);
        // One already killed (its loop has yet to close it) is gone.
        match reg
            .snapshot()
            .iter()
            .find(|e| !e.killed() && e.addr.as_bytes() == addr)
        {
            Some(e) => {
                e.kill();
                resp::simple(out, "OK")
            }
            None => resp::error(out, "ERR No such client"),
        }
        return;
    }
    if !a.len().is_multiple_of(2) {
        return resp::error(out, "ERR syntax error");
    }
    let mut f = KillFilter {
        skip_me: true,
        ..KillFilter::default()
    };
    for i in (2..a.len()).step_by(2) {
        let value = a.get(i + 1);
        let mut kbuf = [0u8; COMMAND_NAME_BYTES_MAX];
        match lower(a.get(i), &mut kbuf) {
            b"id" => match parse_i64(value) {
                Some(n) if n > 0 => f.id = Some(n as u64),
                _ => return resp::error(out, "ERR client-id should be greater than 0"),
            },
            b"addr" => f.addr = Some(value.to_vec()),
            b"laddr" => f.laddr = Some(value.to_vec()),
            b"user" => {
                if value != b"default" {
                    let shown = quoted(value);
                    return resp::error(out, &format!("ERR No such user '{shown}'"));
                }
            }
            b"type" => {
                let mut tbuf = [0u8; COMMAND_NAME_BYTES_MAX];
                f.normal = Some(match lower(value, &mut tbuf) {
                    b"normal" => true,
                    b"master" | b"replica" | b"slave" | b"pubsub" => false,
                    _ => {
                        let shown = quoted(value);
                        return resp::error(out, &format!("ERR Unknown client type '{shown}'"));
                    }
                });
            }
            b"maxage" => match parse_i64(value) {
                Some(n) if n > 0 => f.max_age_s = Some(n as u64),
                _ => return resp::error(out, "ERR syntax error"),
            },
            b"skipme" => {
                let mut vbuf = [0u8; COMMAND_NAME_BYTES_MAX];
                f.skip_me = match lower(value, &mut vbuf) {
                    b"yes" => true,
                    b"no" => false,
                    _ => return resp::error(out, "ERR syntax error"),
                };
            }
            _ => return resp::error(out, "ERR syntax error"),
        }
    }
    let now_ms = me.active_ms.load(Ordering::Relaxed);
    let mut killed = 0;
    for e in reg.snapshot() {
        let matches = !e.killed()
            && f.id.is_none_or(|id| e.id == id)
            && f.addr.as_ref().is_none_or(|x| e.addr.as_bytes() == x)
            && f.laddr.as_ref().is_none_or(|x| e.laddr.as_bytes() == x)
            && f.normal.unwrap_or(true)
            && f.max_age_s
                .is_none_or(|m| now_ms.saturating_sub(e.created_ms) / 1000 >= m)
            && !(f.skip_me && e.id == me.id);
        if matches {
            e.kill();
            killed += 1;
        }
    }
    resp::integer(out, killed);
}
