//! Forwarding in an etcd cluster: memcached clients place keys by their
//! own hash, so a command for a key of a hash slot another server leads
//! is sent on to that server's memcache peer front end (loops of its
//! own that never forward, `memcache_net::McPeerConn`), as memcached's
//! proxy does, and its answer passed back in order.
//!
//! A forwarded command is sent as received, followed by `mn`: whatever
//! the owner answers before `MN` is the command's answer, so `noreply`
//! and quiet meta commands (which answer nothing, or only on a miss) need
//! no case of their own. A forward holds the connection's front-end
//! thread for the owner's round trip, within [`MC_FORWARD_TIMEOUT_MS`].

use std::borrow::Cow;
use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use fabrickv_cluster::slots::key_slot;
use fabrickv_memcache::{MC_LINE_BYTES_MAX, MC_VALUE_BYTES_MAX};

use crate::slot_routing::{OpenedAt, RoutingCache, SlotRouting};

/// Longest wait to connect to, write to or read from the owner of a key,
/// in milliseconds; past it the command is answered `SERVER_ERROR` and
/// the connection to that owner dropped.
pub const MC_FORWARD_TIMEOUT_MS: u64 = 2_000;

/// Longest a command waits for its slot's group to be handed over to
/// another server (a move) before it is answered as the map then says,
/// in milliseconds.
pub const MC_HANDOVER_WAIT_MS: u64 = 2_000;

/// How often a forwarded command its owner refused (the two servers'
/// maps disagree for a moment: one's watch is ahead of the other's) is
/// sent again, in milliseconds, within [`MC_HANDOVER_WAIT_MS`].
pub const MC_REFUSED_RETRY_MS: u64 = 1;

/// How a peer front end begins its answer to a forwarded command for a
/// slot it does not lead: the forwarder recognises it, and sends the
/// command again once the maps agree. The peer answers it even to a
/// quiet command (the forwarder then passes nothing on), since the
/// command did not run.
const REFUSED_FORWARD: &[u8] = b"SERVER_ERROR not forwarded again: ";

/// Most owners one client connection keeps a forwarding connection to.
/// An etcd cluster has at most `CLUSTER_SERVERS_MAX` servers; past this
/// many the least useful (any) is closed first.
pub const MC_FORWARD_CONNS_MAX: usize = 64;

/// Most bytes one forwarded answer may hold: one value and its header
/// line, or a retrieval's values (a forwarded retrieval asks for one key).
pub const MC_FORWARD_REPLY_BYTES_MAX: usize = MC_VALUE_BYTES_MAX + 2 * MC_LINE_BYTES_MAX;

/// A client connection's view of the slot map and its connections to the
/// owners it forwarded to.
#[derive(Default)]
pub(crate) struct Forwarder {
    view: RoutingCache,
    conns: HashMap<String, BufReader<TcpStream>>,
    /// A connection of the peer front end: commands were forwarded here
    /// once and are not forwarded again.
    answering_only: bool,
    /// A client connection: the map epoch it was opened under.
    pub(super) opened: Option<OpenedAt>,
}

/// Where [`Forwarder::elsewhere`] left a command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Placed {
    /// It runs here.
    Here,
    /// It is this server's, but came on a client connection opened before
    /// this server took the key's slot over (see `OpenedAt`): a write so
    /// placed is not run and the connection is closed.
    HereTooLate,
    /// Sent on to its slot's server, the answer (or `SERVER_ERROR`)
    /// appended.
    Sent,
}

/// Where a command for a key goes.
enum Owner {
    /// This server serves it; `too_late` as in [`Placed::HereTooLate`].
    Here { too_late: bool },
    /// Another server's memcache front end, at this address.
    At(String),
    /// Another server that cannot be forwarded to now: why.
    Unreachable(String),
}

/// Why a forward failed (said in the `SERVER_ERROR` line).
type Why = String;

impl Forwarder {
    /// The forwarder of a peer front-end connection (see
    /// `memcache_net::McPeerConn`).
    pub(crate) fn answering_only() -> Forwarder {
        Forwarder {
            answering_only: true,
            ..Forwarder::default()
        }
    }

    /// Whether the server follows a slot map (else every key is served
    /// here): one atomic load while the map is unchanged.
    #[inline]
    pub(crate) fn follows(&mut self, routing: &SlotRouting) -> bool {
        self.view.current(routing).is_some()
    }

    /// Sends the command for `key` (built by `command` only then) on to
    /// the server leading the key's slot and appends its answer, or
    /// `SERVER_ERROR` when that server cannot be reached, unless `quiet`;
    /// else says the key is served here. With `strip_end` the answer's
    /// `END` line is left out (a retrieval line ends with its own). A
    /// command the owner refused, its map not this server's, is placed
    /// again (every [`MC_REFUSED_RETRY_MS`], for up to
    /// [`MC_HANDOVER_WAIT_MS`]): it did not run there, and the maps agree
    /// within a watch's delay.
    #[inline]
    pub(crate) fn elsewhere<'c>(
        &mut self,
        routing: &SlotRouting,
        key: &[u8],
        quiet: bool,
        strip_end: bool,
        out: &mut Vec<u8>,
        command: impl FnOnce() -> Cow<'c, [u8]>,
    ) -> Placed {
        let mut command = Some(command);
        let mut cmd: Cow<'c, [u8]> = Cow::Borrowed(&[]);
        let deadline = std::time::Instant::now() + Duration::from_millis(MC_HANDOVER_WAIT_MS);
        loop {
            match self.owner(routing, key) {
                Owner::Here { too_late: false } => return Placed::Here,
                Owner::Here { too_late: true } => return Placed::HereTooLate,
                Owner::At(addr) => {
                    if let Some(f) = command.take() {
                        cmd = f();
                    }
                    let start = out.len();
                    // Runs on another server: this thread is quiet
                    // meanwhile (that server's hand-over may be what the
                    // answer waits for).
                    let refused = fabrickv_rpc::quiesce::paused(|| {
                        self.forward(&addr, &cmd, strip_end, quiet, out)
                    });
                    if !refused {
                        return Placed::Sent;
                    }
                    if std::time::Instant::now() < deadline {
                        out.truncate(start);
                        fabrickv_rpc::quiesce::paused(|| {
                            std::thread::sleep(Duration::from_millis(MC_REFUSED_RETRY_MS));
                        });
                        continue;
                    }
                    if quiet {
                        out.truncate(start);
                    }
                    return Placed::Sent;
                }
                Owner::Unreachable(why) => {
                    // A peer answers even a quiet command, so that its
                    // forwarder knows it did not run.
                    if self.answering_only {
                        out.extend_from_slice(REFUSED_FORWARD);
                        out.extend_from_slice(why.as_bytes());
                        out.extend_from_slice(b"\r\n");
                    } else if !quiet {
                        out.extend_from_slice(b"SERVER_ERROR ");
                        out.extend_from_slice(why.as_bytes());
                        out.extend_from_slice(b"\r\n");
                    }
                    return Placed::Sent;
                }
            }
        }
    }

    /// Where a command for `key` goes: here unless the server follows a
    /// slot map in which another server leads the key's slot.
    #[inline]
    fn owner(&mut self, routing: &SlotRouting, key: &[u8]) -> Owner {
        let slot = key_slot(key);
        // A memcached client cannot be told to try again: while the
        // slot's group is handed over (milliseconds), the command waits,
        // its thread counted as quiet (the hand-over waits for the
        // commands that found the group served, which this one did not).
        let deadline = std::time::Instant::now() + Duration::from_millis(MC_HANDOVER_WAIT_MS);
        while self
            .view
            .current(routing)
            .is_some_and(|r| r.handing_over(slot))
            && std::time::Instant::now() < deadline
        {
            fabrickv_rpc::quiesce::paused(|| std::thread::sleep(Duration::from_millis(1)));
        }
        let Some(r) = self.view.current(routing) else {
            return Owner::Here { too_late: false };
        };
        if r.serves(slot, false) {
            let too_late = self.opened.is_some_and(|o| !o.admits(r, slot));
            return Owner::Here { too_late };
        }
        let id = r.primary_of(slot);
        if self.answering_only {
            // The forwarding server's map is older or newer than ours:
            // its client may retry once the maps agree.
            return Owner::Unreachable(format!(
                "slot {slot} is served by server {id} in this server's map; a forwarded command is not forwarded again"
            ));
        }
        // An older server has no peer front end: its client one serves.
        match r
            .server(id)
            .map(|d| d.memcache_peer.clone().or_else(|| d.memcache.clone()))
        {
            Some(Some(addr)) => Owner::At(addr),
            Some(None) => Owner::Unreachable(format!(
                "slot {slot} is served by server {id}, which has no memcache front end"
            )),
            None => Owner::Unreachable(format!(
                "slot {slot} is served by server {id}, which is not registered"
            )),
        }
    }

    /// Sends `command` (a whole command as received, data included) to
    /// the memcache front end at `addr` and appends its answer to `out`;
    /// with `strip_end`, the `END` line of a retrieval is left out (the
    /// caller ends its own line). On failure appends `SERVER_ERROR` unless
    /// `quiet` (the client asked for no answer) and drops the connection.
    /// Returns whether the owner refused it, not leading the key's slot
    /// in its map (its refusal appended).
    fn forward(
        &mut self,
        addr: &str,
        command: &[u8],
        strip_end: bool,
        quiet: bool,
        out: &mut Vec<u8>,
    ) -> bool {
        let start = out.len();
        let why = match self.exchange(addr, command, strip_end, out) {
            Ok(refused) => return refused,
            Err(why) => why,
        };
        out.truncate(start);
        if let Some(c) = self.conns.remove(addr) {
            // Reset, not closed: the kernel would otherwise deliver the
            // command once a cut link heals, long after its client was
            // told it failed.
            let _ = socket2::SockRef::from(c.get_ref()).set_linger(Some(Duration::ZERO));
        }
        tracing::debug!("memcache forward to {addr}: {why}");
        if !quiet {
            out.extend_from_slice(b"SERVER_ERROR cannot reach the key's server: ");
            out.extend_from_slice(why.as_bytes());
            out.extend_from_slice(b"\r\n");
        }
        false
    }

    fn exchange(
        &mut self,
        addr: &str,
        command: &[u8],
        strip_end: bool,
        out: &mut Vec<u8>,
    ) -> Result<bool, Why> {
        let conn = self.conn(addr)?;
        let s = conn.get_mut();
        s.write_all(command)
            .and_then(|()| s.write_all(b"mn\r\n"))
            .map_err(|e| e.to_string())?;
        let mut taken = 0usize;
        let mut refused = false;
        let mut line = Vec::with_capacity(128);
        loop {
            line.clear();
            let n = conn
                .by_ref()
                .take(MC_LINE_BYTES_MAX as u64 + 2)
                .read_until(b'\n', &mut line)
                .map_err(|e| e.to_string())?;
            if n == 0 || !line.ends_with(b"\r\n") {
                return Err("the answer broke off".into());
            }
            let text = &line[..line.len() - 2];
            if text == b"MN" {
                return Ok(refused);
            }
            refused |= text.starts_with(REFUSED_FORWARD);
            if strip_end && text == b"END" {
                continue;
            }
            // A line announcing a value: the value and its CRLF follow.
            let data = data_length(text)?;
            taken += line.len() + data.map_or(0, |d| d + 2);
            if taken > MC_FORWARD_REPLY_BYTES_MAX {
                return Err("the answer is over the forwarding bound".into());
            }
            out.extend_from_slice(&line);
            if let Some(d) = data {
                let at = out.len();
                out.resize(at + d + 2, 0);
                conn.read_exact(&mut out[at..]).map_err(|e| e.to_string())?;
                if !out.ends_with(b"\r\n") {
                    return Err("a value is not followed by CRLF".into());
                }
            }
        }
    }

    /// The connection to `addr`, opened if there is none.
    fn conn(&mut self, addr: &str) -> Result<&mut BufReader<TcpStream>, Why> {
        if !self.conns.contains_key(addr) {
            if self.conns.len() >= MC_FORWARD_CONNS_MAX {
                self.conns.clear();
            }
            let timeout = Duration::from_millis(MC_FORWARD_TIMEOUT_MS);
            let sa = addr
                .parse()
                .map_err(|_| format!("{addr} is not an address"))?;
            let s = TcpStream::connect_timeout(&sa, timeout).map_err(|e| e.to_string())?;
            s.set_read_timeout(Some(timeout))
                .and_then(|()| s.set_write_timeout(Some(timeout)))
                .and_then(|()| s.set_nodelay(true))
                .map_err(|e| e.to_string())?;
            self.conns.insert(addr.to_string(), BufReader::new(s));
        }
        self.conns
            .get_mut(addr)
            .ok_or_else(|| "no connection".to_string())
    }
}

/// The length of the value an answer line announces: `VALUE key flags
/// bytes [cas]` or `VA bytes flags...`; `None` for a line without one.
fn data_length(line: &[u8]) -> Result<Option<usize>, Why> {
    let mut t = line.split(|&b| b == b' ');
    let field = match t.next() {
        Some(b"VALUE") => t.nth(2),
        Some(b"VA") => t.next(),
        _ => return Ok(None),
    };
    let n = field
        .and_then(|f| std::str::from_utf8(f).ok())
        .and_then(|f| f.parse::<usize>().ok())
        .ok_or("an answer line announces no value length")?;
    if n > MC_VALUE_BYTES_MAX {
        return Err("an answer announces a value over the bound".into());
    }
    Ok(Some(n))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn value_lengths_are_read_from_both_answer_forms() {
        assert_eq!(data_length(b"VALUE k 0 5"), Ok(Some(5)));
        assert_eq!(data_length(b"VALUE k 0 5 77"), Ok(Some(5)));
        assert_eq!(data_length(b"VA 3 t10"), Ok(Some(3)));
        assert_eq!(data_length(b"HD"), Ok(None));
        assert_eq!(data_length(b"STORED"), Ok(None));
        assert!(data_length(b"VALUE k 0").is_err());
        assert!(data_length(b"VA x").is_err());
        assert!(data_length(format!("VA {}", MC_VALUE_BYTES_MAX + 1).as_bytes()).is_err());
    }
}
