//! The execution context of one `process` call over the in-memory kv:
//! the partition lock it holds across a pipelined run, and the prefetch
//! of a run's keys. The commands themselves are in `strings` and `expiry`.

use std::sync::MutexGuard;

use fabrickv_engine::{LargeValue, Partition, PutResult, ValueRef};
use fabrickv_resp::reply as resp;
use fabrickv_types::KeyHash;

use super::{LargeReplies, RespShared};

/// The reply to a write the engine refused (`OOM` when the store is full,
/// as Redis says it).
pub(super) fn put_error(out: &mut Vec<u8>, r: PutResult) {
    match r {
        PutResult::InsufficientSpace => resp::error(
            out,
            "OOM command not allowed when used memory > 'maxmemory'.",
        ),
        PutResult::TooLarge => resp::error(out, "ERR value is too large for this server"),
        PutResult::Stored | PutResult::ConditionFailed => resp::null_bulk(out),
    }
}

/// Execution context of one `process` call: the partition lock it holds.
pub(super) struct Exec<'a> {
    /// The partitions, shards and counters every connection shares.
    pub(super) shared: &'a RespShared,
    /// The partition lock held across a run of commands on one partition
    /// (released before a shard command, which may wait for a disk sync).
    pub(super) held: Option<(usize, MutexGuard<'a, Partition>)>,
    /// The time of the whole `process` call, in engine milliseconds.
    pub(super) now_ms: u64,
    /// The large value received for the running command's argument (only
    /// SET's value), for the command to take.
    pub(super) large_arg: Option<LargeValue>,
    /// The large values the replies written so far refer to.
    pub(super) large_out: LargeReplies,
}

impl<'a> Exec<'a> {
    /// The partition owning `hash`, locked (reusing the lock already held
    /// when it is the same partition; never holding two).
    pub(super) fn part(&mut self, hash: KeyHash) -> &mut Partition {
        let i = self.shared.parts.index_of(hash);
        if self.held.as_ref().is_none_or(|(h, _)| *h != i) {
            self.held = None;
            self.held = Some((i, self.shared.parts.lock(i)));
        }
        match &mut self.held {
            Some((_, g)) => g,
            None => unreachable!("a lock was just taken"),
        }
    }

    /// Writes `value` as a bulk reply: an inline value is copied into
    /// `out`; a large one is referenced, its header and CRLF in `out` and
    /// its bytes queued to be written from the store's own buffer.
    pub(super) fn bulk_value(&mut self, out: &mut Vec<u8>, value: ValueRef<'_>) {
        match value {
            ValueRef::Inline(v) => resp::bulk(out, v),
            ValueRef::Large(v) => {
                out.push(b'$');
                out.extend_from_slice(v.len().to_string().as_bytes());
                out.extend_from_slice(b"\r\n");
                self.large_out.push(out.len(), v.clone());
                out.extend_from_slice(b"\r\n");
            }
        }
    }

    /// Forgets the large values referred to past byte `mark` of the
    /// output (a reply cut back to `mark`).
    pub(super) fn drop_large_after(&mut self, mark: usize) {
        while self.large_out.queue.back().is_some_and(|r| r.at > mark) {
            if let Some(r) = self.large_out.queue.pop_back() {
                self.large_out.bytes -= r.value.len();
            }
        }
    }

    /// Both prefetch stages for a run of keys: every bucket, then every
    /// item the buckets name.
    pub(super) fn prefetch(&mut self, hashes: &[KeyHash]) {
        for &h in hashes {
            self.part(h).prefetch(h);
        }
        for &h in hashes {
            self.part(h).prefetch_item(h);
        }
    }
}
