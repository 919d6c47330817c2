//! The connection counters ([`RespCounters`]), and the per-command and
//! per-error counters for INFO's `commandstats` and `errorstats` sections.
//!
//! The hot path touches none of the shared counters: a connection counts its
//! commands in a small local table ([`LocalStats`]) and adds it to the
//! shared relaxed atomics ([`CommandStats`]) once per `process` call, so a
//! pipeline of a hundred GETs costs one atomic add per counter, not a
//! hundred. Time is read twice per `process` call, not per command (a
//! clock read per command cost a pipelined GET about 3% of its CPU); the
//! call's time is shared out evenly among the commands it ran, so a
//! command's `usec` is exact for a pipeline of one kind of command and an
//! even share otherwise. Error replies are rare and counted by code in a map behind a
//! mutex, bounded by [`RESP_ERROR_CODES_MAX`] as Redis bounds it.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use super::table::COMMANDS_MAX;
use super::COMMANDS;

/// Counters shared by every RESP connection of a server.
#[derive(Debug, Default)]
pub struct RespCounters {
    /// Connections accepted since start.
    pub connections_received: AtomicU64,
    /// Connections open now.
    pub connected: AtomicU64,
    /// Connections refused because too many were open.
    pub rejected: AtomicU64,
    /// Idle connections closed to make room for a newcomer at the cap.
    pub evicted_idle: AtomicU64,
    /// Commands executed (including those answered with an error).
    pub commands: AtomicU64,
    /// Connections closed for a protocol error.
    pub protocol_errors: AtomicU64,
    /// AUTH attempts refused (a wrong password or secret), as Redis's ACL
    /// log counts them (`acl_access_denied_auth` in INFO): a climbing
    /// count is someone guessing.
    pub auth_failures: AtomicU64,
}

impl RespCounters {
    /// CONFIG RESETSTAT: the counters of events back to zero (not those
    /// of state, such as the connections open now).
    pub(super) fn reset(&self) {
        for c in [
            &self.connections_received,
            &self.rejected,
            &self.evicted_idle,
            &self.commands,
            &self.protocol_errors,
            &self.auth_failures,
        ] {
            c.store(0, Ordering::Relaxed);
        }
    }
}

/// Distinct error codes counted in `errorstats`; replies with a code not
/// yet seen once this many are tracked are counted in
/// `total_error_replies` only (Redis's bound is the same).
pub const RESP_ERROR_CODES_MAX: usize = 128;

/// Longest error code kept, in bytes: the first word of an error reply.
const ERROR_CODE_BYTES_MAX: usize = 32;

/// One command's counters.
#[derive(Debug, Default)]
struct CmdCounters {
    calls: AtomicU64,
    nanos: AtomicU64,
    rejected: AtomicU64,
    failed: AtomicU64,
}

/// The counters of every command and error code, shared by every
/// connection of a server.
#[derive(Debug)]
pub(super) struct CommandStats {
    per: [CmdCounters; COMMANDS_MAX],
    /// Error replies by code (`ERR`, `WRONGTYPE`, ...).
    errors: Mutex<BTreeMap<String, u64>>,
    /// Every error reply, counted or not by code.
    pub(super) error_replies: AtomicU64,
}

impl Default for CommandStats {
    fn default() -> Self {
        CommandStats {
            per: std::array::from_fn(|_| CmdCounters::default()),
            errors: Mutex::new(BTreeMap::new()),
            error_replies: AtomicU64::new(0),
        }
    }
}

impl CommandStats {
    /// Counts one error reply whose text (without its `-`) is `message`.
    pub(super) fn error(&self, message: &[u8]) {
        self.error_replies.fetch_add(1, Ordering::Relaxed);
        let end = message
            .iter()
            .position(|&b| b == b' ' || b == b'\r' || b == b'\n')
            .unwrap_or(message.len())
            .min(ERROR_CODE_BYTES_MAX);
        let code = String::from_utf8_lossy(&message[..end]);
        let mut errors = self.errors.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(n) = errors.get_mut(code.as_ref()) {
            *n += 1;
        } else if errors.len() < RESP_ERROR_CODES_MAX {
            errors.insert(code.into_owned(), 1);
        }
    }

    /// Adds a connection's local counts and clears them; `nanos` is the time
    /// the commands counted took together, shared out evenly.
    pub(super) fn flush(&self, local: &mut LocalStats, nanos: u64) {
        if local.dirty == 0 {
            return;
        }
        let per_call = nanos.checked_div(local.calls).unwrap_or(0);
        let mut dirty = local.dirty;
        while dirty != 0 {
            let i = dirty.trailing_zeros() as usize;
            dirty &= dirty - 1;
            let (Some(l), Some(c)) = (local.per.get(i), self.per.get(i)) else {
                continue;
            };
            c.calls.fetch_add(l.calls, Ordering::Relaxed);
            c.nanos
                .fetch_add(l.calls.saturating_mul(per_call), Ordering::Relaxed);
            c.rejected.fetch_add(l.rejected, Ordering::Relaxed);
            c.failed.fetch_add(l.failed, Ordering::Relaxed);
        }
        local.clear();
    }

    /// CONFIG RESETSTAT: every counter back to zero.
    pub(super) fn reset(&self) {
        for c in &self.per {
            c.calls.store(0, Ordering::Relaxed);
            c.nanos.store(0, Ordering::Relaxed);
            c.rejected.store(0, Ordering::Relaxed);
            c.failed.store(0, Ordering::Relaxed);
        }
        self.errors
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clear();
        self.error_replies.store(0, Ordering::Relaxed);
    }

    /// INFO's `commandstats` lines, for the commands called at least once
    /// (or refused).
    pub(super) fn commandstats(&self, s: &mut String) {
        use std::fmt::Write;
        for (spec, c) in COMMANDS.iter().zip(&self.per) {
            let calls = c.calls.load(Ordering::Relaxed);
            let rejected = c.rejected.load(Ordering::Relaxed);
            if calls == 0 && rejected == 0 {
                continue;
            }
            let usec = c.nanos.load(Ordering::Relaxed) / 1000;
            let per_call = if calls == 0 {
                0.0
            } else {
                usec as f64 / calls as f64
            };
            let _ = write!(
                s,
                "cmdstat_{}:calls={calls},usec={usec},usec_per_call={per_call:.2},rejected_calls={rejected},failed_calls={}\r\n",
                spec.name,
                c.failed.load(Ordering::Relaxed),
            );
        }
    }

    /// INFO's `errorstats` lines.
    pub(super) fn errorstats(&self, s: &mut String) {
        use std::fmt::Write;
        let errors = self.errors.lock().unwrap_or_else(|e| e.into_inner());
        for (code, n) in errors.iter() {
            let _ = write!(s, "errorstat_{code}:count={n}\r\n");
        }
    }
}

/// One command's counts on one connection between two flushes.
#[derive(Debug, Default, Clone, Copy)]
struct LocalCounts {
    calls: u64,
    rejected: u64,
    failed: u64,
}

/// A connection's counts since its last flush, with a bit per command
/// touched so the flush visits only those.
#[derive(Debug)]
pub(super) struct LocalStats {
    per: [LocalCounts; COMMANDS_MAX],
    dirty: u128,
    /// Calls counted over every command, among which time is shared.
    calls: u64,
}

const _: () = assert!(COMMANDS_MAX <= u128::BITS as usize);

impl Default for LocalStats {
    fn default() -> Self {
        LocalStats {
            per: [LocalCounts::default(); COMMANDS_MAX],
            dirty: 0,
            calls: 0,
        }
    }
}

/// How one call of a command ended, for its counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Outcome {
    /// Ran and answered without an error.
    Ok,
    /// Ran and answered with an error.
    Failed,
    /// Refused before running (arity, authentication).
    Rejected,
}

impl LocalStats {
    /// Counts one call of the command at `index` in the table.
    #[inline]
    pub(super) fn record(&mut self, index: usize, outcome: Outcome) {
        let Some(c) = self.per.get_mut(index) else {
            return;
        };
        self.dirty |= 1 << index;
        match outcome {
            Outcome::Rejected => c.rejected += 1,
            Outcome::Ok | Outcome::Failed => {
                c.calls += 1;
                self.calls += 1;
                if outcome == Outcome::Failed {
                    c.failed += 1;
                }
            }
        }
    }

    fn clear(&mut self) {
        let mut dirty = self.dirty;
        while dirty != 0 {
            let i = dirty.trailing_zeros() as usize;
            dirty &= dirty - 1;
            if let Some(c) = self.per.get_mut(i) {
                *c = LocalCounts::default();
            }
        }
        self.dirty = 0;
        self.calls = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn local_counts_reach_the_shared_ones_on_flush() {
        let shared = CommandStats::default();
        let mut local = LocalStats::default();
        local.record(0, Outcome::Ok);
        local.record(0, Outcome::Failed);
        local.record(2, Outcome::Rejected);
        let mut s = String::new();
        shared.commandstats(&mut s);
        assert!(s.is_empty());
        shared.flush(&mut local, 4_000);
        shared.commandstats(&mut s);
        assert_eq!(
            s,
            "cmdstat_get:calls=2,usec=4,usec_per_call=2.00,rejected_calls=0,failed_calls=1\r\n\
             cmdstat_mget:calls=0,usec=0,usec_per_call=0.00,rejected_calls=1,failed_calls=0\r\n"
        );
        // The local table starts again from zero.
        shared.flush(&mut local, 1_000_000);
        let mut again = String::new();
        shared.commandstats(&mut again);
        assert_eq!(again, s);
        shared.reset();
        let mut none = String::new();
        shared.commandstats(&mut none);
        assert!(none.is_empty());
    }

    #[test]
    fn errors_count_by_code_up_to_the_bound() {
        let stats = CommandStats::default();
        stats.error(b"ERR syntax error");
        stats.error(b"ERR nope");
        stats.error(b"WRONGPASS invalid username-password pair");
        let mut s = String::new();
        stats.errorstats(&mut s);
        assert_eq!(
            s,
            "errorstat_ERR:count=2\r\nerrorstat_WRONGPASS:count=1\r\n"
        );
        for i in 0..2 * RESP_ERROR_CODES_MAX {
            stats.error(format!("E{i} x").as_bytes());
        }
        let mut s = String::new();
        stats.errorstats(&mut s);
        assert_eq!(s.lines().count(), RESP_ERROR_CODES_MAX);
        assert_eq!(
            stats.error_replies.load(Ordering::Relaxed),
            3 + 2 * RESP_ERROR_CODES_MAX as u64
        );
    }
}
