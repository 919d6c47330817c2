//! The keys a partition's writes touched since they were last taken:
//! what a replicating server ships to its backups.
//!
//! Replication ships the *state* of each key a write touched (its value,
//! TTL and meta as they are when shipped, or its absence), not the
//! commands: every front end's every mutating command (SET and its
//! variants, INCR, APPEND, SETRANGE, EXPIRE, memcache's `cas` and `incr`,
//! a native PUT or DELETE, a transaction's writes) reduces to "this key
//! now holds this, or nothing", which a backup applies by overwriting,
//! with no command semantics to reproduce and nothing to apply twice.
//! Noting a key costs an append of its bytes to one buffer under the
//! partition's lock the writer already holds; a key written many times
//! before a shipment is shipped once, as it is then.
//!
//! The published count ([`JournalSeq`]) lets threads that never take the
//! lock (a worker about to send its replies) tell whether writes are
//! waiting to be shipped, with one atomic load per partition.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// The count of writes noted in one partition's journal, and how many of
/// them every follower has applied, published for threads outside its
/// lock.
#[derive(Debug, Default)]
pub struct JournalSeq {
    noted: AtomicU64,
    replicated: AtomicU64,
}

impl JournalSeq {
    /// Writes noted so far (monotonic).
    #[inline]
    pub fn get(&self) -> u64 {
        self.noted.load(Ordering::Acquire)
    }

    /// Of those, how many every follower the replies wait for has
    /// applied (monotonic; set by the replicator).
    #[inline]
    pub fn replicated(&self) -> u64 {
        self.replicated.load(Ordering::Acquire)
    }

    /// Records that the first `count` writes are applied everywhere.
    #[inline]
    pub fn mark_replicated(&self, count: u64) {
        self.replicated.fetch_max(count, Ordering::AcqRel);
    }

    /// Whether every write noted so far is applied everywhere: what the
    /// partition holds now could not be taken back by a failover. The
    /// replicated count is read first, so a write noted between the two
    /// loads makes the answer false, never wrongly true.
    #[inline]
    pub fn settled(&self) -> bool {
        let replicated = self.replicated();
        self.get() <= replicated
    }
}

/// What [`Journal::take`] hands the shipper.
#[derive(Debug, Default)]
pub struct Noted {
    /// The keys written, each once per write, as a length byte and the
    /// key (keys are at most `KEY_BYTES_MAX`, 250, bytes).
    pub keys: Vec<u8>,
    /// Whether the partition was flushed (FLUSHDB) since the last take:
    /// every key written before the flush is gone, and `keys` holds only
    /// those written after it.
    pub flushed: bool,
    /// The write count these notes bring the shipper up to.
    pub seq: u64,
}

impl Noted {
    /// The keys, in the order they were noted (repeats included).
    pub fn iter(&self) -> impl Iterator<Item = &[u8]> + '_ {
        let mut at = 0;
        std::iter::from_fn(move || {
            let len = usize::from(*self.keys.get(at)?);
            let key = self.keys.get(at + 1..at + 1 + len)?;
            at += 1 + len;
            Some(key)
        })
    }
}

/// One partition's journal of written keys.
#[derive(Debug, Default)]
pub struct Journal {
    noted: Noted,
    /// Writes noted, also published in `seq`.
    count: u64,
    seq: Arc<JournalSeq>,
    /// While set, writes are not noted: a backup applying what its
    /// primary shipped is not the primary of those keys.
    paused: bool,
}

impl Journal {
    /// An empty journal.
    pub fn new() -> Journal {
        Journal::default()
    }

    /// The published write count, for threads outside the lock.
    pub fn seq(&self) -> Arc<JournalSeq> {
        self.seq.clone()
    }

    /// Notes a write of `key`.
    #[inline]
    pub(crate) fn note(&mut self, key: &[u8]) {
        if self.paused {
            return;
        }
        let len = key.len().min(usize::from(u8::MAX));
        self.noted.keys.push(len as u8);
        self.noted.keys.extend_from_slice(&key[..len]);
        self.bump();
    }

    /// Notes that every key of the partition is gone.
    pub(crate) fn note_flush(&mut self) {
        if self.paused {
            return;
        }
        self.noted.keys.clear();
        self.noted.flushed = true;
        self.bump();
    }

    fn bump(&mut self) {
        self.count += 1;
        self.seq.noted.store(self.count, Ordering::Release);
    }

    /// Hands over what was noted since the last take, leaving `spare`'s
    /// buffer (cleared) in its place so that steady shipping reuses two
    /// buffers rather than allocating.
    pub fn take(&mut self, spare: Vec<u8>) -> Noted {
        let mut keys = spare;
        keys.clear();
        let keys = std::mem::replace(&mut self.noted.keys, keys);
        let flushed = std::mem::take(&mut self.noted.flushed);
        Noted {
            keys,
            flushed,
            seq: self.count,
        }
    }

    /// Stops or resumes noting writes.
    pub fn set_paused(&mut self, paused: bool) {
        self.paused = paused;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn notes_keys_in_order_and_hands_them_over_once() {
        let mut j = Journal::new();
        let seq = j.seq();
        j.note(b"a");
        j.note(b"bb");
        j.note(b"a");
        assert_eq!(seq.get(), 3);
        let n = j.take(Vec::new());
        let keys: Vec<&[u8]> = n.iter().collect();
        assert_eq!(keys, [&b"a"[..], b"bb", b"a"]);
        assert_eq!(n.seq, 3);
        assert!(!n.flushed);
        let again = j.take(n.keys);
        assert_eq!(again.iter().count(), 0, "taken once");
        assert_eq!(again.seq, 3);
    }

    #[test]
    fn a_journal_is_settled_once_every_noted_write_is_replicated() {
        let mut j = Journal::new();
        let seq = j.seq();
        assert!(seq.settled(), "nothing written");
        j.note(b"a");
        j.note(b"b");
        assert!(!seq.settled());
        seq.mark_replicated(1);
        assert!(!seq.settled(), "one of two");
        seq.mark_replicated(2);
        assert!(seq.settled());
        seq.mark_replicated(1);
        assert_eq!(seq.replicated(), 2, "never goes back");
        j.note(b"c");
        assert!(!seq.settled());
    }

    #[test]
    fn a_flush_drops_earlier_keys_and_pausing_notes_nothing() {
        let mut j = Journal::new();
        j.note(b"old");
        j.note_flush();
        j.note(b"new");
        j.set_paused(true);
        j.note(b"applied");
        j.note_flush();
        let n = j.take(Vec::new());
        assert!(n.flushed);
        assert_eq!(n.iter().collect::<Vec<_>>(), [&b"new"[..]]);
        assert_eq!(n.seq, 3);
    }
}
