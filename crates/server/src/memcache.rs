//! The memcached-compatible front end's commands, sans-I/O.
//!
//! [`McConnState::process`] takes the bytes a connection has buffered and the
//! time, executes every complete command against the server's partitions
//! (the keyspace of RESP's database 0 and of the native kv), and appends
//! the replies; the socket loop in `memcache_net` only moves bytes. The
//! parser is `fabrickv_memcache` (its bounds are the line, key and value
//! limits); this module adds the reply bound below.
//!
//! A retrieval line is answered a key at a time and may be left half
//! answered between calls ([`McConnState`]'s `get`): when the replies
//! reach [`MC_OUTPUT_SOFT_BYTES`] (the rest of its keys wait in the input
//! until the replies are written), or when the line is longer than the
//! parser holds (its keys come in pieces as they arrive). So a `get` of
//! any number of keys holds at most a piece of its line and about
//! [`MC_OUTPUT_SOFT_BYTES`] of its replies, as memcached answers a
//! multi-get of any length.
//!
//! Items written here carry their CAS value and 32-bit client flags in
//! the engine item's meta ([`fabrickv_engine::ItemMeta`]); an item written
//! by RESP or the native protocol has none and reads as flags 0, CAS 0.
//! Every command on one key takes its partition's lock once, so `cas`,
//! `add`, `append`, `incr` and the meta commands are atomic per key.
//!
//! `flush_all` invalidates, without walking memory, every item stored
//! through this front end before it (an item whose CAS is older than the
//! flush's mark is treated as absent and deleted when next met); items
//! without a CAS (written by RESP or the native kv) are left alone.
//!
//! Layout: this file holds the shared state and the parse loop; `store`
//! the operations on one key (get, store, arith, touch, delete) shared by
//! both dialects; `text` the classic commands and `stats`; `meta` the meta
//! commands (`mg`, `ms`, `md`, `ma`, `mn`).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use fabrickv_memcache::{self as mc, Command, KeysPiece, Parse};
use fabrickv_types::KeyHash;

use crate::config::Mode;
use crate::partitions::{Partitions, PREFETCH_KEYS_MAX};
use crate::resp::unix_now_ms;
use forward::Placed;
use store::Expiry;

mod forward;
mod meta;
mod store;
mod text;

/// Reply bytes a connection may have waiting before it stops executing
/// commands until the client reads them (backpressure), in bytes. A
/// retrieval stops between two keys there too, so the replies waiting are
/// at most this plus one value.
pub const MC_OUTPUT_SOFT_BYTES: usize = 256 << 10;

/// What `version` answers (and `stats` reports): the memcached release
/// whose protocol this front end speaks, then FabricKV's own version.
/// Clients and tools (memcapable) read the leading memcached version to
/// tell which commands a server has, so it comes first.
pub const MC_VERSION: &str = concat!("1.6.0-fabrickv-", env!("CARGO_PKG_VERSION"));

/// Counters shared by every memcache connection of a server (`stats`).
#[derive(Debug, Default)]
pub struct McCounters {
    /// Connections accepted since start.
    pub connections_received: AtomicU64,
    /// Connections open now.
    pub connected: AtomicU64,
    /// Connections refused because too many were open.
    pub rejected: AtomicU64,
    /// Idle connections closed to make room for a newcomer at the cap.
    pub evicted_idle: AtomicU64,
    /// Commands executed, refusals included.
    pub commands: AtomicU64,
    /// Keys asked for by retrievals (`cmd_get`).
    pub cmd_get: AtomicU64,
    /// Storage commands (`cmd_set`).
    pub cmd_set: AtomicU64,
    /// `flush_all`s.
    pub cmd_flush: AtomicU64,
    /// Touches (`touch`, `gat`).
    pub cmd_touch: AtomicU64,
    /// Retrieved keys found.
    pub get_hits: AtomicU64,
    /// Retrieved keys missing.
    pub get_misses: AtomicU64,
    /// Deletes of a present key.
    pub delete_hits: AtomicU64,
    /// Deletes of a missing key.
    pub delete_misses: AtomicU64,
    /// incr of a present key.
    pub incr_hits: AtomicU64,
    /// incr of a missing key.
    pub incr_misses: AtomicU64,
    /// decr of a present key.
    pub decr_hits: AtomicU64,
    /// decr of a missing key.
    pub decr_misses: AtomicU64,
    /// cas that stored.
    pub cas_hits: AtomicU64,
    /// cas of a missing key.
    pub cas_misses: AtomicU64,
    /// cas refused for a changed item.
    pub cas_badval: AtomicU64,
    /// Touches of a present key.
    pub touch_hits: AtomicU64,
    /// Touches of a missing key.
    pub touch_misses: AtomicU64,
}

/// What every memcache connection of a server shares.
pub struct McShared {
    parts: Arc<Partitions>,
    mode: Mode,
    pool_bytes: u64,
    threads: usize,
    started: Instant,
    /// The next CAS value to give (never 0: 0 is "no CAS" in the protocol).
    next_cas: AtomicU64,
    /// Items whose CAS is below this are flushed (0: no flush yet).
    flush_below_cas: AtomicU64,
    /// A delayed `flush_all` takes effect at this engine time (0: none).
    flush_at_ms: AtomicU64,
    /// Counters reported by `stats`.
    pub counters: McCounters,
    /// What every RESP and memcache connection buffers, and its cap.
    pub(crate) client_memory: Arc<crate::text_socket::ClientMemory>,
    /// Which hash slots this server serves, in an etcd cluster.
    pub(crate) slot_routing: Arc<crate::slot_routing::SlotRouting>,
}

impl McShared {
    /// State for a front end over `parts` served by `threads` loops.
    pub fn new(parts: Arc<Partitions>, mode: Mode, pool_bytes: u64, threads: usize) -> McShared {
        McShared {
            parts,
            mode,
            pool_bytes,
            threads,
            started: Instant::now(),
            next_cas: AtomicU64::new(1),
            flush_below_cas: AtomicU64::new(0),
            flush_at_ms: AtomicU64::new(0),
            counters: McCounters::default(),
            client_memory: Arc::new(crate::text_socket::ClientMemory::new(0)),
            slot_routing: crate::slot_routing::SlotRouting::new(),
        }
    }

    /// The server's slot routing, shared with its other front ends.
    pub(crate) fn with_slot_routing(
        mut self,
        slot_routing: Arc<crate::slot_routing::SlotRouting>,
    ) -> McShared {
        self.slot_routing = slot_routing;
        self
    }

    /// Shares the server's account of what connections buffer.
    pub(crate) fn with_client_memory(
        mut self,
        mem: Arc<crate::text_socket::ClientMemory>,
    ) -> McShared {
        self.client_memory = mem;
        self
    }

    /// A fresh CAS value.
    fn new_cas(&self) -> u64 {
        self.next_cas.fetch_add(1, Ordering::Relaxed)
    }

    /// Invalidates every item stored before now.
    fn flush_now(&self) {
        let mark = self.next_cas.fetch_add(1, Ordering::Relaxed) + 1;
        self.flush_below_cas.fetch_max(mark, Ordering::Relaxed);
    }

    /// Applies a delayed flush whose time has come.
    fn apply_due_flush(&self, now_ms: u64) {
        let at = self.flush_at_ms.load(Ordering::Relaxed);
        if at != 0
            && at <= now_ms
            && self
                .flush_at_ms
                .compare_exchange(at, 0, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            self.flush_now();
        }
    }

    /// Whether an item with this CAS was flushed.
    #[inline]
    fn flushed(&self, cas: u64) -> bool {
        cas != 0 && cas < self.flush_below_cas.load(Ordering::Relaxed)
    }
}

/// What one call to [`McConnState::process`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Processed {
    /// Input bytes consumed.
    pub consumed: usize,
    /// Least number of unconsumed bytes before another command can be
    /// parsed (0: parse again as soon as anything arrives).
    pub need: usize,
    /// Close the connection once the replies are written.
    pub close: bool,
}

/// One memcache connection's protocol state.
#[derive(Default)]
pub struct McConnState {
    /// Bytes still to discard: the data of a storage command refused for
    /// its size, thrown away as it arrives instead of buffered.
    swallow: usize,
    /// Discarding the rest of a refused retrieval line, through its
    /// newline, as it arrives (the line was longer than the parser holds).
    skip_line: bool,
    /// A retrieval line answered in part: the rest of its keys follow in
    /// the input.
    get: Option<GetLine>,
    /// Scratch for values built from a stored one (append, incr).
    scratch: Vec<u8>,
    /// Where keys of other servers' hash slots are sent, in an etcd
    /// cluster.
    forward: forward::Forwarder,
    /// Whether a reply buffered since the output was last written whole
    /// may show a write not yet replicated (anything but a `get`/`gets`
    /// of keys this server holds whose writes are replicated): a
    /// replicating server holds such replies for a round.
    pub(crate) replies_unsettled: bool,
}

/// A retrieval line being answered (see the module header).
#[derive(Debug, Clone, Copy)]
pub(super) struct GetLine {
    /// `gets`/`gats`: with CAS values.
    cas: bool,
    /// `gat`/`gats`: the expiry to give each key found.
    touch: Option<Expiry>,
    /// `gat`/`gats`: the expiry time as sent, for a key forwarded to its
    /// server.
    exptime: i64,
    /// A key was seen, or the command is a `gat` (which may have none):
    /// the line ends with `END`, not `ERROR`.
    answered: bool,
    /// Where the line's replies start in the output, while they are all
    /// still there (this call of `process`): a key refused later in the
    /// line replaces them with the error, as in memcached. A line
    /// streamed over several calls has had some written; they stand.
    out_start: Option<usize>,
}

/// What a command leaves the connection to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum After {
    Continue,
    Close,
}

impl McConnState {
    /// A new connection.
    pub fn new() -> McConnState {
        McConnState::default()
    }

    /// A client's connection, opened under `routing`'s current map: a
    /// write on it to a group this server took over since is not run,
    /// and the connection is closed (see `slot_routing::OpenedAt`).
    pub(crate) fn opened_under(
        mut self,
        routing: &crate::slot_routing::SlotRouting,
    ) -> McConnState {
        self.forward.opened = Some(crate::slot_routing::OpenedAt::now(routing));
        self
    }

    /// A connection another server forwards commands on: it serves the
    /// keys of this server's slots and forwards nothing. Not fenced by
    /// its age: the forwarding server resets a connection it gives up.
    pub(crate) fn forwarded_to() -> McConnState {
        McConnState {
            forward: forward::Forwarder::answering_only(),
            ..McConnState::default()
        }
    }

    /// Executes the complete commands at the start of `input`, appending
    /// their replies to `out`; stops early when `out` holds
    /// [`MC_OUTPUT_SOFT_BYTES`] or more, so the caller writes first.
    pub fn process(
        &mut self,
        sh: &McShared,
        input: &[u8],
        out: &mut Vec<u8>,
        now_ms: u64,
    ) -> Processed {
        sh.apply_due_flush(now_ms);
        let mut done = Processed {
            consumed: 0,
            need: 0,
            close: false,
        };
        // Counted once per call, not per command: one atomic add.
        let mut commands = 0;
        // Where the last look-ahead stopped: the commands before it have
        // had their keys prefetched.
        let mut ahead = 0;
        // Replies from an earlier call may have been written since.
        if let Some(g) = &mut self.get {
            g.out_start = None;
        }
        while done.consumed < input.len() && out.len() < MC_OUTPUT_SOFT_BYTES {
            let rest = &input[done.consumed..];
            if self.swallow > 0 {
                let n = self.swallow.min(rest.len());
                self.swallow -= n;
                done.consumed += n;
                continue;
            }
            if self.skip_line {
                match rest.iter().position(|&b| b == b'\n') {
                    Some(nl) => {
                        done.consumed += nl + 1;
                        self.skip_line = false;
                    }
                    None => done.consumed = input.len(),
                }
                continue;
            }
            if let Some(g) = self.get {
                match mc::keys_piece(rest) {
                    KeysPiece::Incomplete { need } => {
                        done.need = need;
                        break;
                    }
                    KeysPiece::Keys {
                        keys,
                        consumed,
                        last,
                    } => {
                        done.consumed +=
                            self.retrieve(sh, g, rest, keys, consumed, last, out, now_ms)
                    }
                    KeysPiece::TooLong { consumed, last } => {
                        self.refuse_line(g, out);
                        self.skip_line = !last;
                        done.consumed += consumed;
                    }
                }
                continue;
            }
            if done.consumed >= ahead {
                ahead = prefetch_ahead(sh, input, done.consumed);
            }
            match mc::parse(rest) {
                Parse::Incomplete { need } => {
                    done.need = need;
                    break;
                }
                Parse::Complete { consumed, cmd } => {
                    commands += 1;
                    let (g, keys, last) = match cmd {
                        Command::Get { keys, cas, more } => {
                            (GetLine::new(cas, None, 0, out), keys, !more)
                        }
                        Command::Gat {
                            exptime,
                            keys,
                            cas,
                            more,
                        } => {
                            let touch = Some(Expiry::of(exptime, now_ms));
                            (GetLine::new(cas, touch, exptime, out), keys, !more)
                        }
                        cmd => {
                            done.consumed += consumed;
                            self.replies_unsettled = true;
                            match self.forwarded(sh, &cmd, &rest[..consumed], out) {
                                Placed::Here => {}
                                Placed::Sent => continue,
                                // A late write is not run (`OpenedAt`).
                                Placed::HereTooLate => {
                                    done.close = true;
                                    break;
                                }
                            }
                            if self.command(sh, cmd, out, now_ms) == After::Close {
                                done.close = true;
                                break;
                            }
                            continue;
                        }
                    };
                    done.consumed += self.retrieve(sh, g, rest, keys, consumed, last, out, now_ms);
                }
            }
        }
        if commands > 0 {
            sh.counters.commands.fetch_add(commands, Ordering::Relaxed);
        }
        done
    }

    /// Answers the `keys` of a retrieval line (`rest` is the input from
    /// where the piece holding them begins, `consumed` that piece's
    /// length): ends the line with `END` once its `last` piece is done.
    /// Returns the input bytes taken: the whole piece, or up to the first
    /// key not answered when the replies filled the output first (the
    /// rest of the line is answered on the next call).
    #[allow(clippy::too_many_arguments)]
    fn retrieve(
        &mut self,
        sh: &McShared,
        mut g: GetLine,
        rest: &[u8],
        keys: &[u8],
        consumed: usize,
        last: bool,
        out: &mut Vec<u8>,
        now: u64,
    ) -> usize {
        let unsettled = &mut self.replies_unsettled;
        if let Some(at) = text::retrieve(sh, &mut self.forward, keys, &mut g, out, now, unsettled) {
            self.get = Some(g);
            // `keys` lies within `rest`.
            return keys.as_ptr() as usize - rest.as_ptr() as usize + at;
        }
        if !last {
            self.get = Some(g);
        } else if g.answered {
            self.get = None;
            out.extend_from_slice(b"END\r\n");
        } else {
            self.get = None;
            line(out, mc::ERROR);
        }
        consumed
    }

    /// Refuses the retrieval line being answered for a key over the
    /// bound: memcached sends only the error, dropping the line's values.
    fn refuse_line(&mut self, g: GetLine, out: &mut Vec<u8>) {
        if let Some(start) = g.out_start {
            out.truncate(start);
        }
        line(out, mc::BAD_FORMAT);
        self.get = None;
    }

    /// Sends a keyed command (`raw`, as received) for a key of another
    /// server's hash slot on to that server and appends its answer, or
    /// says it is this server's.
    fn forwarded(
        &mut self,
        sh: &McShared,
        cmd: &Command<'_>,
        raw: &[u8],
        out: &mut Vec<u8>,
    ) -> Placed {
        if !self.forward.follows(&sh.slot_routing) {
            return Placed::Here;
        }
        let mut buf = [0u8; mc::MC_BASE64_KEY_BYTES_MAX];
        let (key, quiet) = match cmd {
            Command::Store(st) => (st.key, st.noreply),
            Command::Delete { key, noreply }
            | Command::Arith { key, noreply, .. }
            | Command::Touch { key, noreply, .. } => (*key, *noreply),
            Command::Meta(m) => match meta::decoded_key(m.key, m.flags.base64, &mut buf) {
                Some(k) => (k, m.flags.quiet),
                None => return Placed::Here,
            },
            _ => return Placed::Here,
        };
        self.forward
            .elsewhere(&sh.slot_routing, key, quiet, false, out, || raw.into())
    }

    fn command(&mut self, sh: &McShared, cmd: Command<'_>, out: &mut Vec<u8>, now: u64) -> After {
        match cmd {
            Command::TooLarge {
                key,
                base64,
                unlink,
                swallow,
                noreply,
            } => {
                self.swallow = swallow;
                if unlink {
                    let mut buf = [0u8; mc::MC_BASE64_KEY_BYTES_MAX];
                    if let Some(key) = meta::decoded_key(key, base64, &mut buf) {
                        let _ = store::delete(sh, key, None, now);
                    }
                }
                if !noreply {
                    line(out, mc::TOO_LARGE);
                }
            }
            Command::Refused(r) => {
                self.swallow = r.swallow;
                self.skip_line = r.skip_line;
                if !r.noreply {
                    line(out, r.reply);
                }
                if r.close {
                    return After::Close;
                }
            }
            Command::Quit => return After::Close,
            Command::Meta(m) => meta::run(self, sh, &m, out, now),
            Command::MetaNoop => out.extend_from_slice(b"MN\r\n"),
            other => text::run(self, sh, other, out, now),
        }
        After::Continue
    }
}

/// Parses ahead from `from` (without executing) and prefetches the keys
/// of the commands found, up to [`PREFETCH_KEYS_MAX`]; returns where it
/// stopped, past `from` whenever a whole command was there. Only worth it
/// when a read holds several commands (a pipelining client): with one,
/// nothing is prefetched and the cost is one more parse of it. A refused
/// command ends the look-ahead, since the bytes after it may be a value
/// to skip, not commands; so does the first piece of a retrieval line
/// longer than the parser holds (the rest of the line follows).
fn prefetch_ahead(sh: &McShared, input: &[u8], from: usize) -> usize {
    let mut hashes = [KeyHash(0); PREFETCH_KEYS_MAX];
    let mut n = 0;
    let mut pos = from;
    let mut found = 0;
    while n < PREFETCH_KEYS_MAX && pos < input.len() {
        let Parse::Complete { consumed, cmd } = mc::parse(&input[pos..]) else {
            break;
        };
        pos += consumed;
        found += 1;
        let mut add = |key: &[u8]| {
            if n < PREFETCH_KEYS_MAX {
                hashes[n] = KeyHash::of(key);
                n += 1;
            }
        };
        match cmd {
            // The rest of a line longer than the parser holds is not
            // commands.
            Command::Get { keys, more, .. } | Command::Gat { keys, more, .. } => {
                mc::keys(keys).for_each(add);
                if more {
                    break;
                }
            }
            Command::Store(mc::Storage { key, .. })
            | Command::Delete { key, .. }
            | Command::Arith { key, .. }
            | Command::Touch { key, .. } => add(key),
            Command::Meta(m) if !m.flags.base64 => add(m.key),
            Command::Refused(_) | Command::TooLarge { .. } => break,
            _ => {}
        }
    }
    if found > 1 && n > 0 {
        sh.parts.prefetch(&hashes[..n]);
    }
    pos
}

impl GetLine {
    /// A line whose replies start at the end of `out`.
    fn new(cas: bool, touch: Option<Expiry>, exptime: i64, out: &[u8]) -> GetLine {
        GetLine {
            cas,
            touch,
            exptime,
            answered: touch.is_some(),
            out_start: Some(out.len()),
        }
    }
}

/// Appends `s` and CRLF.
fn line(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(s.as_bytes());
    out.extend_from_slice(b"\r\n");
}

/// Appends the decimal digits of `v`.
fn push_u64(out: &mut Vec<u8>, mut v: u64) {
    let mut buf = [0u8; 20];
    let mut i = buf.len();
    loop {
        i -= 1;
        buf[i] = b'0' + (v % 10) as u8;
        v /= 10;
        if v == 0 {
            break;
        }
    }
    out.extend_from_slice(&buf[i..]);
}

#[cfg(test)]
mod tests;
