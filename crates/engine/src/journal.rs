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
//! waiting to be shipped, with one atomic load per partition, and whether
//! a read of one key may show a write not yet replicated, with two more.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use fabrickv_types::KeyHash;

/// Sets of keys (by the low bits of their hash) for which a partition's
/// journal remembers the newest write: a read of a key whose set has no
/// write in flight need not wait for replication, whatever the rest of
/// the partition is doing. 256 sets cost 2 KiB per partition; with a few
/// writes in flight, about one read in a hundred finds its set busy by
/// chance.
pub const JOURNAL_KEY_SETS: usize = 256;

/// The count of writes noted in one partition's journal, and how many of
/// them every follower has applied, published for threads outside its
/// lock; and, per set of keys, the count at the newest write there.
#[derive(Debug)]
pub struct JournalSeq {
    noted: AtomicU64,
    replicated: AtomicU64,
    /// Per set of keys ([`JournalSeq::set_of`]), the write count at the
    /// newest write of a key in it (0: none).
    newest: [AtomicU64; JOURNAL_KEY_SETS],
    /// The write count at the newest flush, which touched every key.
    flushed: AtomicU64,
}

impl Default for JournalSeq {
    fn default() -> JournalSeq {
        JournalSeq {
            noted: AtomicU64::new(0),
            replicated: AtomicU64::new(0),
            newest: std::array::from_fn(|_| AtomicU64::new(0)),
            flushed: AtomicU64::new(0),
        }
    }
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

    /// The set of keys `hash` is in: the hash's low bits, which do not
    /// choose the partition (its high bits do).
    #[inline]
    fn set_of(hash: KeyHash) -> usize {
        (hash.0 as usize) % JOURNAL_KEY_SETS
    }

    /// Whether every write noted so far of a key in `hash`'s set (and
    /// every flush) is applied everywhere: a read of that key made before
    /// this call shows nothing a failover could take back, even while
    /// other keys of the partition have writes in flight. The newest
    /// write's count is read before the replicated count, so a write a
    /// read saw (noted under the lock the read took after it) is never
    /// missed.
    #[inline]
    pub fn key_settled(&self, hash: KeyHash) -> bool {
        let newest = self.newest[Self::set_of(hash)].load(Ordering::Acquire);
        let newest = newest.max(self.flushed.load(Ordering::Acquire));
        newest <= self.replicated()
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

    /// Notes a write of `key` (whose hash is `hash`).
    #[inline]
    pub(crate) fn note(&mut self, hash: KeyHash, key: &[u8]) {
        if self.paused {
            return;
        }
        let len = key.len().min(usize::from(u8::MAX));
        self.noted.keys.push(len as u8);
        self.noted.keys.extend_from_slice(&key[..len]);
        self.bump();
        self.seq.newest[JournalSeq::set_of(hash)].store(self.count, Ordering::Release);
    }

    /// Notes that every key of the partition is gone.
    pub(crate) fn note_flush(&mut self) {
        if self.paused {
            return;
        }
        self.noted.keys.clear();
        self.noted.flushed = true;
        self.bump();
        self.seq.flushed.store(self.count, Ordering::Release);
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
        j.note(KeyHash::of(b"a"), b"a");
        j.note(KeyHash::of(b"bb"), b"bb");
        j.note(KeyHash::of(b"a"), b"a");
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
        j.note(KeyHash::of(b"a"), b"a");
        j.note(KeyHash::of(b"b"), b"b");
        assert!(!seq.settled());
        seq.mark_replicated(1);
        assert!(!seq.settled(), "one of two");
        seq.mark_replicated(2);
        assert!(seq.settled());
        seq.mark_replicated(1);
        assert_eq!(seq.replicated(), 2, "never goes back");
        j.note(KeyHash::of(b"c"), b"c");
        assert!(!seq.settled());
    }

    /// A key is settled once the newest write of its set is replicated,
    /// whatever the other sets' writes; a flush unsettles every key.
    #[test]
    fn a_key_is_settled_once_its_sets_newest_write_is_replicated() {
        let mut j = Journal::new();
        let seq = j.seq();
        // Two keys of different sets, and one sharing the first's set.
        let keys: Vec<Vec<u8>> = (0..)
            .map(|i: u32| format!("k{i}").into_bytes())
            .take(4096)
            .collect();
        let set = |k: &[u8]| JournalSeq::set_of(KeyHash::of(k));
        let a = &keys[0];
        let b = keys.iter().find(|k| set(k) != set(a)).expect("another set");
        let twin = keys[1..]
            .iter()
            .find(|k| set(k) == set(a))
            .expect("the same set");
        let settled = |k: &[u8]| seq.key_settled(KeyHash::of(k));
        assert!(settled(a) && settled(b), "nothing written");
        j.note(KeyHash::of(a), a);
        assert!(!settled(a), "its write is in flight");
        assert!(!settled(twin), "a write of its set is in flight");
        assert!(settled(b), "another set's key");
        j.note(KeyHash::of(b), b);
        seq.mark_replicated(1);
        assert!(settled(a) && settled(twin), "the write of a replicated");
        assert!(!settled(b), "b's write (the second) is not");
        seq.mark_replicated(2);
        assert!(settled(b));
        j.note_flush();
        assert!(!settled(a) && !settled(b), "a flush touches every key");
        seq.mark_replicated(3);
        assert!(settled(a) && settled(b));
    }

    #[test]
    fn a_flush_drops_earlier_keys_and_pausing_notes_nothing() {
        let mut j = Journal::new();
        j.note(KeyHash::of(b"old"), b"old");
        j.note_flush();
        j.note(KeyHash::of(b"new"), b"new");
        j.set_paused(true);
        j.note(KeyHash::of(b"applied"), b"applied");
        j.note_flush();
        let n = j.take(Vec::new());
        assert!(n.flushed);
        assert_eq!(n.iter().collect::<Vec<_>>(), [&b"new"[..]]);
        assert_eq!(n.seq, 3);
    }
}
