//! The embedding tables' side of replication: which slot a row lies in,
//! the journals of the pool's shards, the states a primary ships, what a
//! follower applies, and the markers that keep a retried push from being
//! applied twice.
//!
//! Rows replicate as kv keys do (`crate::replication`): each shard's
//! journal notes the item keys its writes touched, and a round ships each
//! noted row's stored state (vector and optimizer state) to the followers
//! of the row's slot. A follower numbers its tables itself, so a batch
//! names a table's shape before its rows (`PsTable`), and the follower
//! maps the sender's id to its own, creating the table if it has none.
//!
//! **Retried pushes.** A gradient applied twice is a wrong model, and a
//! client whose push met a failover cannot know whether it was applied.
//! A push carrying a request id (client, seq) leaves a *marker* row: in
//! the table field [`PS_MARKER_TABLE_BIT`] and the slot of the push's
//! first key (so the marker lives, and fails over, with the push's rows),
//! in the key field the client; its value the seq and the push's answer.
//! A retry finds the marker and gets the same answer without applying
//! anything. While replication is on, a push holds the store's *barrier*
//! (shared) from the marker's check to its last row, and a round drains
//! the shards' journals holding it exclusively, so a push's rows and its
//! marker ship in the same round: a backup that takes over holds both or
//! neither.

use std::sync::atomic::Ordering;
use std::sync::{Arc, RwLockReadGuard, RwLockWriteGuard};

use fabrickv_cluster::slots::{slot_of_u64, SLOTS};
use fabrickv_engine::{JournalSeq, Partition, PutCond, ScanBudget};
use fabrickv_types::{ErrorCode, KeyHash};
use fabrickv_wire::ps::{PushId, TableSpec};

use super::push::put_result;
use super::store::{item_hash, item_key, write, PsStore};
use super::PS_ITEM_KEY_BYTES;

/// Set in the table field of a push's marker row; table ids stay far
/// below it (`PS_TABLES_MAX`), so no row of a table is a marker.
pub const PS_MARKER_TABLE_BIT: u32 = 1 << 31;

/// How long a push's marker is kept, in milliseconds: a client retries a
/// push within its failover wait (seconds), so ten minutes is ample, and
/// markers of clients long gone do not accumulate.
pub const PS_PUSH_MARKER_TTL_MS: u64 = 600_000;

/// Bytes of a marker's value: seq (u64), keys applied (u32), status (u16),
/// state (u8: 0 applying, 1 answered), reserved (u8).
const MARKER_BYTES: usize = 16;

/// Index entries a scan examines per visit of a shard.
const ROW_SCAN_ENTRIES: usize = 4096;

/// The slot of row `key` of table `table`: a row's is its key's
/// ([`slot_of_u64`], whatever the table), a marker's is in its table field.
#[inline]
pub fn row_slot(table: u32, key: u64) -> u16 {
    if table & PS_MARKER_TABLE_BIT != 0 {
        (table & !PS_MARKER_TABLE_BIT) as u16 % SLOTS
    } else {
        slot_of_u64(key)
    }
}

/// The table and key of an item key.
#[inline]
fn split_item_key(k: &[u8]) -> Option<(u32, u64)> {
    if k.len() != PS_ITEM_KEY_BYTES {
        return None;
    }
    let mut t = [0u8; 4];
    t.copy_from_slice(&k[..4]);
    let mut key = [0u8; 8];
    key.copy_from_slice(&k[4..]);
    Some((u32::from_le_bytes(t), u64::from_le_bytes(key)))
}

/// A row's state as read for shipping.
pub enum RowState<'a> {
    /// The row holds `value`, expiring at engine time `expire_ms` (0: never).
    Present { value: &'a [u8], expire_ms: u64 },
    /// The row is absent.
    Absent,
}

/// What a marker says about the push it names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Seen {
    /// No push of this client with this first slot is remembered, or only
    /// older ones: apply it.
    New,
    /// This very push was applied; its answer.
    Answered { status: ErrorCode, applied: u32 },
    /// This push is being applied by another worker now.
    Applying,
    /// A later push of the client was applied since: this one is stale.
    Stale,
}

impl PsStore {
    /// The shards' journal counts, once the pool exists and keeps journals
    /// (kept, so that pulls can read them too).
    pub fn journal_seqs(&self) -> Option<Vec<Arc<JournalSeq>>> {
        if !self.journaled() {
            return None;
        }
        let shards = self.shards()?;
        let seqs = self.replica().seqs.get_or_init(|| {
            shards
                .iter()
                .map(|s| write(s).enable_journal())
                .collect::<Vec<_>>()
                .into_boxed_slice()
        });
        Some(seqs.to_vec())
    }

    /// Whether a pull of rows hashed `hashes` (in shards `shard_of`), read
    /// before this call, may be answered without waiting for replication:
    /// every write of each row's set of keys in its shard is applied by
    /// every follower (`JournalSeq::key_settled`); always, where the pool
    /// keeps no journals. Not before the replicator has taken the shards'
    /// counts: until then, nothing says what the followers have.
    pub(super) fn rows_settled(
        &self,
        hashes: impl Iterator<Item = KeyHash>,
        shard_of: &[u32],
    ) -> bool {
        if !self.journaled() {
            return true;
        }
        let Some(seqs) = self.replica().seqs.get() else {
            return false;
        };
        hashes
            .zip(shard_of)
            .all(|(h, &s)| seqs.get(s as usize).is_some_and(|q| q.key_settled(h)))
    }

    /// The barrier, exclusively: a round holds it while it drains the
    /// shards' journals.
    pub fn drain_barrier(&self) -> RwLockWriteGuard<'_, ()> {
        self.replica()
            .barrier
            .write()
            .unwrap_or_else(|p| p.into_inner())
    }

    /// The barrier, shared, if replication is on: a push holds it while
    /// it applies.
    pub(super) fn push_barrier(&self) -> Option<RwLockReadGuard<'_, ()>> {
        self.journaled().then(|| {
            self.replica()
                .barrier
                .read()
                .unwrap_or_else(|p| p.into_inner())
        })
    }

    /// Takes shard `shard`'s journal and gives each row noted since the
    /// last take (once, in the order first noted) to `f` with its state
    /// now; returns the journal's count then and the buffer to reuse
    /// (`spare` goes in its place). `None` without a pool or a journal.
    pub fn drain(
        &self,
        shard: usize,
        spare: Vec<u8>,
        now_ms: u64,
        f: &mut dyn FnMut(u32, u64, RowState<'_>),
    ) -> Option<(u64, Vec<u8>)> {
        let shards = self.shards()?;
        let mut p = write(shards.get(shard)?);
        let noted = p.journal_mut()?.take(spare);
        let mut seen = std::collections::HashSet::new();
        for k in noted.iter() {
            if !seen.insert(k) {
                continue;
            }
            if let Some((table, key)) = split_item_key(k) {
                f(table, key, row_state(&mut p, table, key, now_ms));
            }
        }
        drop(seen);
        Some((noted.seq, noted.keys))
    }

    /// Visits shard `shard` from index bucket `bucket`, a bounded number
    /// of entries: each row whose slot `want` picks goes to `f` with its
    /// state. Returns the bucket to go on from, `None` at the shard's end.
    pub fn scan_rows(
        &self,
        shard: usize,
        bucket: usize,
        now_ms: u64,
        want: &dyn Fn(u16) -> bool,
        f: &mut dyn FnMut(u32, u64, RowState<'_>),
    ) -> Option<usize> {
        let shards = self.shards()?;
        let mut p = write(shards.get(shard)?);
        let mut rows = Vec::new();
        let mut budget = ScanBudget {
            entries: ROW_SCAN_ENTRIES,
            words: ROW_SCAN_ENTRIES,
        };
        let next = p.scan_from(bucket, now_ms, &mut budget, &mut |k, _, _| {
            if let Some((table, key)) = split_item_key(k) {
                if want(row_slot(table, key)) {
                    rows.push((table, key));
                }
            }
            true
        });
        for (table, key) in rows {
            f(table, key, row_state(&mut p, table, key, now_ms));
        }
        next
    }

    /// Shards of the embedding pool, 0 before it is built.
    pub fn built_shards(&self) -> usize {
        self.shards().map_or(0, |s| s.len())
    }

    /// Runs `f` on shard `shard` under its lock (`None`: no such shard).
    pub fn with_shard<T>(&self, shard: usize, f: impl FnOnce(&mut Partition) -> T) -> Option<T> {
        let shards = self.shards()?;
        Some(f(&mut write(shards.get(shard)?)))
    }

    /// The table, key and state of the row stored under item key `k` in
    /// shard `p` (`None`: not a row's item key).
    pub fn row_at<'p>(
        p: &'p mut Partition,
        k: &[u8],
        now_ms: u64,
    ) -> Option<(u32, u64, RowState<'p>)> {
        let (table, key) = split_item_key(k)?;
        Some((table, key, row_state(p, table, key, now_ms)))
    }

    /// The table and row key an item key `k` of a shard stands for
    /// (`None`: not a row's item key).
    pub fn row_of_item_key(k: &[u8]) -> Option<(u32, u64)> {
        split_item_key(k)
    }

    /// The hash shard `p` files the item key `k` under (`None`: not a
    /// row's item key).
    pub fn item_hash_of(k: &[u8]) -> Option<fabrickv_types::KeyHash> {
        split_item_key(k).map(|(table, key)| item_hash(table, key))
    }

    /// The shape of table `id`.
    pub fn spec_of(&self, id: u32) -> Option<TableSpec> {
        self.by_id(id).map(|t| t.spec.clone())
    }

    /// A follower's id for a table the primary described: the table of
    /// that name, created if this server has none.
    pub fn adopt_table(&self, spec: &TableSpec) -> Result<u32, String> {
        self.create(spec)
            .map(|d| d.id)
            .map_err(|(code, why)| format!("{code}: {why}"))
    }

    /// Applies a shipped row state: `value` (`None`: absent) as row `key`
    /// of this server's table `table` (or a marker), expiring at engine
    /// time `expire_ms`; with the journal paused, since what a primary
    /// ships is not this server's to ship on.
    pub fn apply_row(
        &self,
        table: u32,
        key: u64,
        value: Option<&[u8]>,
        expire_ms: u64,
        now_ms: u64,
    ) -> Result<(), String> {
        self.ensure_pool()
            .map_err(|(code, why)| format!("{code}: {why}"))?;
        let shards = self.shards().ok_or("no embedding pool")?;
        let h = item_hash(table, key);
        let k = item_key(table, key);
        let mut p = write(&shards[h.partition(shards.len() as u32) as usize]);
        p.unjournaled(|p| match value {
            Some(_) if expire_ms != 0 && expire_ms <= now_ms => {
                let _ = p.delete(h, &k, now_ms);
                Ok(())
            }
            Some(v) => {
                let before = p.item_count();
                put_result(p.put(h, &k, v, expire_ms, PutCond::Always, now_ms))
                    .map_err(|c| format!("{c}"))?;
                if p.item_count() > before && table & PS_MARKER_TABLE_BIT == 0 {
                    if let Some(t) = self.by_id(table) {
                        t.items.fetch_add(1, Ordering::Relaxed);
                    }
                }
                Ok(())
            }
            None => {
                let _ = p.delete(h, &k, now_ms);
                Ok(())
            }
        })
    }

    /// Drops every row (and marker) whose slot `doomed` picks: a joiner
    /// about to be streamed those slots forgets what it held of them.
    pub fn drop_rows(&self, now_ms: u64, doomed: &dyn Fn(u16) -> bool) {
        let Some(shards) = self.shards() else {
            return;
        };
        for (s, shard) in shards.iter().enumerate() {
            let mut rows = Vec::new();
            let mut bucket = 0;
            loop {
                let next = self.scan_rows(s, bucket, now_ms, doomed, &mut |t, k, _| {
                    rows.push((t, k));
                });
                match next {
                    Some(b) => bucket = b,
                    None => break,
                }
            }
            write(shard).unjournaled(|p| {
                for &(t, k) in &rows {
                    let _ = p.delete(item_hash(t, k), &item_key(t, k), now_ms);
                }
            });
        }
    }

    /// What the marker of push `id`, whose first key is `first`, says;
    /// a new push is marked as being applied (before any row changes).
    pub(super) fn check_marker(&self, id: PushId, first: u64, now_ms: u64) -> Seen {
        self.marker(id, first, true, now_ms)
    }

    /// What the marker of push `id` says, changing nothing: for a retry
    /// this server must refuse unless it was applied before.
    pub(super) fn peek_marker(&self, id: PushId, first: u64, now_ms: u64) -> Seen {
        self.marker(id, first, false, now_ms)
    }

    fn marker(&self, id: PushId, first: u64, mark_new: bool, now_ms: u64) -> Seen {
        let Some(shards) = self.shards() else {
            return Seen::New;
        };
        let (_, h, k) = marker_key(id, first);
        let mut p = write(&shards[h.partition(shards.len() as u32) as usize]);
        let seen = match p.get_item(h, &k, now_ms) {
            Some(item) if item.value.len() == MARKER_BYTES => {
                let v = item.value;
                let seq = le_u64(v, 0);
                if seq > id.seq {
                    Seen::Stale
                } else if seq < id.seq {
                    Seen::New
                } else if v[14] == 0 {
                    Seen::Applying
                } else {
                    Seen::Answered {
                        status: ErrorCode::from_u16(u16::from_le_bytes([v[12], v[13]]))
                            .unwrap_or(ErrorCode::Internal),
                        applied: u32::from_le_bytes([v[8], v[9], v[10], v[11]]),
                    }
                }
            }
            _ => Seen::New,
        };
        if mark_new && seen == Seen::New {
            put_marker(&mut p, id, first, None, now_ms);
        }
        seen
    }

    /// Records push `id`'s answer in its marker.
    pub(super) fn answer_marker(
        &self,
        id: PushId,
        first: u64,
        status: ErrorCode,
        applied: u32,
        now_ms: u64,
    ) {
        let Some(shards) = self.shards() else {
            return;
        };
        let (_, h, _) = marker_key(id, first);
        let mut p = write(&shards[h.partition(shards.len() as u32) as usize]);
        put_marker(&mut p, id, first, Some((status, applied)), now_ms);
    }
}

/// The table field, hash and item key of push `id`'s marker.
fn marker_key(id: PushId, first: u64) -> (u32, fabrickv_types::KeyHash, [u8; PS_ITEM_KEY_BYTES]) {
    let t = PS_MARKER_TABLE_BIT | u32::from(slot_of_u64(first));
    (t, item_hash(t, id.client), item_key(t, id.client))
}

/// Stores push `id`'s marker: being applied (`None`), or its answer.
fn put_marker(
    p: &mut Partition,
    id: PushId,
    first: u64,
    answer: Option<(ErrorCode, u32)>,
    now_ms: u64,
) {
    let (_, h, k) = marker_key(id, first);
    let mut v = [0u8; MARKER_BYTES];
    v[..8].copy_from_slice(&id.seq.to_le_bytes());
    if let Some((status, applied)) = answer {
        v[8..12].copy_from_slice(&applied.to_le_bytes());
        v[12..14].copy_from_slice(&(status as u16).to_le_bytes());
        v[14] = 1;
    }
    let expire = now_ms + PS_PUSH_MARKER_TTL_MS;
    if let Err(c) = put_result(p.put(h, &k, &v, expire, PutCond::Always, now_ms)) {
        // The pool is full: the push still applies, and a retry of it
        // after a failover may apply again.
        tracing::warn!("a push's retry marker could not be stored: {c}");
    }
}

fn le_u64(b: &[u8], at: usize) -> u64 {
    let mut w = [0u8; 8];
    w.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(w)
}

/// The state of row `key` of `table` in shard `p`.
fn row_state(p: &mut Partition, table: u32, key: u64, now_ms: u64) -> RowState<'_> {
    match p.get_item(item_hash(table, key), &item_key(table, key), now_ms) {
        Some(item) => RowState::Present {
            value: item.value,
            expire_ms: item.expire_at_ms,
        },
        None => RowState::Absent,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rows_slot_is_its_keys_and_a_markers_is_in_its_table_field() {
        assert_eq!(row_slot(1, 42), slot_of_u64(42));
        assert_eq!(row_slot(7, 42), slot_of_u64(42), "every table alike");
        assert_eq!(row_slot(PS_MARKER_TABLE_BIT | 5000, 42), 5000);
        assert_eq!(row_slot(PS_MARKER_TABLE_BIT | 16_383, 1), 16_383);
    }
}
