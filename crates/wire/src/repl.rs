//! What a primary sends its followers and what they answer: the bytes of
//! the replication stream, sans-I/O (fuzzed by
//! `fuzz_targets/repl_records.rs`); the server's `replication` module
//! sends and applies them.
//!
//! The stream is a TCP connection from primary to follower carrying
//! messages, each a little-endian `u32` length and that many bytes:
//! - the follower's `Challenge` (a nonce), the primary's `Hello` (its id,
//!   and a proof of the cluster secret over the nonce), then
//! - `Batch`es from the primary, each answered by one `Ack`.
//!
//! A batch holds records of key *states*, in the order the primary read
//! them: `Put` (the key's value, absolute expiry in Unix milliseconds and
//! memcache meta), `Del` (the key is absent), `FlushPartition` (every key
//! that was in one of the primary's partitions is gone) and `StreamBegin`
//! (the follower drops what it holds of some slot ranges, before the
//! primary streams them to it). Embedding tables ride the same batches:
//! `PsTable` (the sender's id of a table and its shape, before the first
//! row of that table in a batch), `PsRow` (a row's stored state, vector
//! and optimizer state, or a push's retry marker) and `PsDel` (the row is
//! absent). Applying a record overwrites, so applying one twice changes
//! nothing.

use fabrickv_types::limits::{
    CACHE_KEY_BYTES_MAX, CACHE_VALUE_BYTES_MAX, KEY_BYTES_MAX, LARGE_VALUE_BYTES_MAX,
};

/// Bytes of the follower's challenge nonce (the cluster secret's
/// `NONCE_BYTES`).
pub const NONCE_BYTES: usize = 32;

/// Bytes of the primary's proof (the cluster secret's `PROOF_BYTES`).
pub const PROOF_BYTES: usize = 32;

/// Redis Cluster's hash slots: a slot range names slots below this.
pub const HASH_SLOTS: u16 = 16_384;

/// An inclusive run of hash slots.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SlotRange {
    /// The first slot.
    pub first: u16,
    /// The last slot.
    pub last: u16,
}

impl SlotRange {
    /// Whether `slot` is in the range.
    pub fn contains(&self, slot: u16) -> bool {
        (self.first..=self.last).contains(&slot)
    }
}

/// Largest message either side accepts, in bytes: one record with a value
/// of the engine's largest (512 MiB), and room for its framing.
pub const REPL_MESSAGE_BYTES_MAX: usize = LARGE_VALUE_BYTES_MAX + (64 << 10);

/// Bytes of records a primary puts in one batch before it starts another
/// (one record may pass it alone).
pub const REPL_BATCH_BYTES_TARGET: usize = 4 << 20;

/// Longest embedding row a `PsRow` carries, in bytes: the largest
/// vector with Adagrad's accumulator beside it.
pub const PS_ROW_BYTES_MAX: usize = fabrickv_types::limits::PS_DIM_MAX * 4 * 2;

/// Most slot ranges one `StreamBegin` may name.
pub const STREAM_RANGES_MAX: usize = 1024;

/// What a replication MAC or proof is made for.
pub const REPL_PROOF_CONTEXT: &[u8] = b"fabrickv replication v1";

const KIND_CHALLENGE: u8 = 1;
const KIND_HELLO: u8 = 2;
const KIND_BATCH: u8 = 3;
const KIND_ACK: u8 = 4;

const REC_PUT: u8 = 1;
const REC_DEL: u8 = 2;
const REC_FLUSH_PARTITION: u8 = 3;
const REC_STREAM_BEGIN: u8 = 4;
const REC_PS_TABLE: u8 = 5;
const REC_PS_ROW: u8 = 6;
const REC_PS_DEL: u8 = 7;
const REC_CACHE_ENTRY: u8 = 8;

/// A follower's answer to a batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AckStatus {
    /// Every record was applied.
    Applied,
    /// Nothing was applied: in the follower's map, at a newer epoch than
    /// the batch's, the sender is not the primary of some record's slot
    /// (it was deposed), or the follower holds no copy of it.
    Refused,
}

/// One message of the stream.
#[derive(Debug, PartialEq, Eq)]
pub enum Message<'a> {
    /// Follower to primary, first: prove the cluster secret over this.
    Challenge { nonce: [u8; NONCE_BYTES] },
    /// Primary to follower: who it is and its proof (zeros without a
    /// secret).
    Hello { id: u32, proof: [u8; PROOF_BYTES] },
    /// Primary to follower: records to apply, at the primary's `epoch`.
    Batch {
        epoch: u64,
        seq: u64,
        records: Records<'a>,
    },
    /// Follower to primary: the answer to batch `seq`, with the
    /// follower's epoch.
    Ack {
        seq: u64,
        status: AckStatus,
        epoch: u64,
    },
}

/// One record of a batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Record<'a> {
    /// The key holds this.
    Put {
        key: &'a [u8],
        value: &'a [u8],
        /// Absolute expiry in Unix milliseconds; 0: none.
        expire_unix_ms: u64,
        /// memcache's CAS value and flags, if the item has them.
        meta: Option<(u64, u32)>,
    },
    /// The key is absent.
    Del { key: &'a [u8] },
    /// Every key of the primary's partition `index` of `count` is gone.
    FlushPartition { count: u32, index: u32 },
    /// The follower drops every key it holds in these ranges: the
    /// primary streams them next.
    StreamBegin { ranges: Vec<SlotRange> },
    /// The sender's table `id` has this shape (a CREATE body, checked:
    /// [`crate::ps::decode_create`] accepts it); rows of `id` that follow
    /// in the batch belong to it.
    PsTable { id: u32, spec: &'a [u8] },
    /// Row `key` of table `table` (the sender's id) holds `value` (the
    /// stored state).
    PsRow {
        table: u32,
        key: u64,
        value: &'a [u8],
        /// Absolute expiry in Unix milliseconds; 0: none.
        expire_unix_ms: u64,
    },
    /// Row `key` of table `table` is absent.
    PsDel { table: u32, key: u64 },
    /// A KV-cache entry (checkpoints only: the cache is not replicated).
    /// Its key may be longer than a kv key's (up to
    /// `CACHE_KEY_BYTES_MAX`).
    CacheEntry {
        key: &'a [u8],
        value: &'a [u8],
        /// Absolute expiry in Unix milliseconds; 0: none.
        expire_unix_ms: u64,
    },
}

impl Record<'_> {
    /// The record's key, for those of one key.
    pub fn key(&self) -> Option<&[u8]> {
        match self {
            Record::Put { key, .. } | Record::Del { key } => Some(key),
            _ => None,
        }
    }
}

/// A batch's records, parsed lazily from its bytes (checked whole by
/// [`decode`] first, so iterating cannot fail).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Records<'a> {
    bytes: &'a [u8],
    count: u32,
}

impl<'a> Records<'a> {
    /// How many records the batch holds.
    pub fn len(&self) -> usize {
        self.count as usize
    }

    /// Whether it holds none.
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// The records, in order.
    pub fn iter(&self) -> impl Iterator<Item = Record<'a>> + 'a {
        let mut r = Reader(self.bytes);
        (0..self.count).map_while(move |_| record(&mut r).ok())
    }
}

/// Why bytes are not a message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Malformed(pub &'static str);

struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], Malformed> {
        if self.0.len() < n {
            return Err(Malformed("truncated"));
        }
        let (a, b) = self.0.split_at(n);
        self.0 = b;
        Ok(a)
    }
    fn u8(&mut self) -> Result<u8, Malformed> {
        Ok(self.take(1)?[0])
    }
    fn u16(&mut self) -> Result<u16, Malformed> {
        let mut w = [0u8; 2];
        w.copy_from_slice(self.take(2)?);
        Ok(u16::from_le_bytes(w))
    }
    fn u32(&mut self) -> Result<u32, Malformed> {
        let mut w = [0u8; 4];
        w.copy_from_slice(self.take(4)?);
        Ok(u32::from_le_bytes(w))
    }
    fn u64(&mut self) -> Result<u64, Malformed> {
        let mut w = [0u8; 8];
        w.copy_from_slice(self.take(8)?);
        Ok(u64::from_le_bytes(w))
    }
    fn key(&mut self) -> Result<&'a [u8], Malformed> {
        let len = usize::from(self.u8()?);
        if len == 0 || len > KEY_BYTES_MAX {
            return Err(Malformed("bad key length"));
        }
        self.take(len)
    }
}

fn record<'a>(r: &mut Reader<'a>) -> Result<Record<'a>, Malformed> {
    match r.u8()? {
        REC_PUT => {
            let key = r.key()?;
            let expire_unix_ms = r.u64()?;
            let meta = match r.u8()? {
                0 => None,
                1 => Some((r.u64()?, r.u32()?)),
                _ => return Err(Malformed("bad meta flag")),
            };
            let len = r.u32()? as usize;
            if len > LARGE_VALUE_BYTES_MAX {
                return Err(Malformed("value too long"));
            }
            Ok(Record::Put {
                key,
                value: r.take(len)?,
                expire_unix_ms,
                meta,
            })
        }
        REC_DEL => Ok(Record::Del { key: r.key()? }),
        REC_FLUSH_PARTITION => {
            let count = r.u32()?;
            let index = r.u32()?;
            if count == 0 || index >= count {
                return Err(Malformed("bad partition"));
            }
            Ok(Record::FlushPartition { count, index })
        }
        REC_STREAM_BEGIN => {
            let n = usize::from(r.u16()?);
            if n > STREAM_RANGES_MAX {
                return Err(Malformed("too many ranges"));
            }
            let mut ranges = Vec::with_capacity(n);
            for _ in 0..n {
                let first = r.u16()?;
                let last = r.u16()?;
                if first > last || last >= HASH_SLOTS {
                    return Err(Malformed("bad slot range"));
                }
                ranges.push(SlotRange { first, last });
            }
            Ok(Record::StreamBegin { ranges })
        }
        REC_PS_TABLE => {
            let id = r.u32()?;
            let len = usize::from(r.u16()?);
            let spec = r.take(len)?;
            if spec.len() < crate::ps::CREATE_FIXED_BYTES
                || spec.len() != crate::ps::CREATE_FIXED_BYTES + usize::from(crate::le_u16(spec, 6))
                || crate::ps::decode_create(spec).is_err()
            {
                return Err(Malformed("bad table shape"));
            }
            Ok(Record::PsTable { id, spec })
        }
        REC_PS_ROW => {
            let table = r.u32()?;
            let key = r.u64()?;
            let expire_unix_ms = r.u64()?;
            let len = r.u32()? as usize;
            if len > PS_ROW_BYTES_MAX {
                return Err(Malformed("row too long"));
            }
            Ok(Record::PsRow {
                table,
                key,
                value: r.take(len)?,
                expire_unix_ms,
            })
        }
        REC_PS_DEL => Ok(Record::PsDel {
            table: r.u32()?,
            key: r.u64()?,
        }),
        REC_CACHE_ENTRY => {
            let klen = usize::from(r.u16()?);
            if klen == 0 || klen > CACHE_KEY_BYTES_MAX {
                return Err(Malformed("bad cache key length"));
            }
            let key = r.take(klen)?;
            let expire_unix_ms = r.u64()?;
            let len = r.u32()? as usize;
            if len > CACHE_VALUE_BYTES_MAX {
                return Err(Malformed("cache value too long"));
            }
            Ok(Record::CacheEntry {
                key,
                value: r.take(len)?,
                expire_unix_ms,
            })
        }
        _ => Err(Malformed("unknown record")),
    }
}

/// Parses one message body (without its length), checking every record
/// of a batch before returning it.
pub fn decode(body: &[u8]) -> Result<Message<'_>, Malformed> {
    let mut r = Reader(body);
    let msg = match r.u8()? {
        KIND_CHALLENGE => {
            let mut nonce = [0u8; NONCE_BYTES];
            nonce.copy_from_slice(r.take(NONCE_BYTES)?);
            Message::Challenge { nonce }
        }
        KIND_HELLO => {
            let id = r.u32()?;
            let mut proof = [0u8; PROOF_BYTES];
            proof.copy_from_slice(r.take(PROOF_BYTES)?);
            Message::Hello { id, proof }
        }
        KIND_BATCH => {
            let epoch = r.u64()?;
            let seq = r.u64()?;
            let count = r.u32()?;
            let bytes = r.0;
            let mut check = Reader(bytes);
            for _ in 0..count {
                record(&mut check)?;
            }
            if !check.0.is_empty() {
                return Err(Malformed("bytes after the records"));
            }
            r.0 = &[];
            Message::Batch {
                epoch,
                seq,
                records: Records { bytes, count },
            }
        }
        KIND_ACK => {
            let seq = r.u64()?;
            let status = match r.u8()? {
                0 => AckStatus::Applied,
                1 => AckStatus::Refused,
                _ => return Err(Malformed("bad ack status")),
            };
            Message::Ack {
                seq,
                status,
                epoch: r.u64()?,
            }
        }
        _ => return Err(Malformed("unknown message")),
    };
    if !r.0.is_empty() {
        return Err(Malformed("bytes after the message"));
    }
    Ok(msg)
}

/// Starts a message of `kind` in `out` (its length filled by [`finish`]).
fn begin(out: &mut Vec<u8>, kind: u8) -> usize {
    let at = out.len();
    out.extend_from_slice(&[0; 4]);
    out.push(kind);
    at
}

/// Fills in the length of the message begun at `at`.
fn finish(out: &mut [u8], at: usize) {
    let len = (out.len() - at - 4) as u32;
    out[at..at + 4].copy_from_slice(&len.to_le_bytes());
}

/// Appends a whole `Challenge`.
pub fn challenge(out: &mut Vec<u8>, nonce: &[u8; NONCE_BYTES]) {
    let at = begin(out, KIND_CHALLENGE);
    out.extend_from_slice(nonce);
    finish(out, at);
}

/// Appends a whole `Hello`.
pub fn hello(out: &mut Vec<u8>, id: u32, proof: &[u8; PROOF_BYTES]) {
    let at = begin(out, KIND_HELLO);
    out.extend_from_slice(&id.to_le_bytes());
    out.extend_from_slice(proof);
    finish(out, at);
}

/// Appends a whole `Ack`.
pub fn ack(out: &mut Vec<u8>, seq: u64, status: AckStatus, epoch: u64) {
    let at = begin(out, KIND_ACK);
    out.extend_from_slice(&seq.to_le_bytes());
    out.push(match status {
        AckStatus::Applied => 0,
        AckStatus::Refused => 1,
    });
    out.extend_from_slice(&epoch.to_le_bytes());
    finish(out, at);
}

/// A batch being built: records are appended, then [`BatchBuf::seal`]
/// gives the message's bytes.
#[derive(Debug, Default)]
pub struct BatchBuf {
    bytes: Vec<u8>,
    count: u32,
}

/// Bytes before a batch's records: length, kind, epoch, seq, count.
const BATCH_HEAD_BYTES: usize = 4 + 1 + 8 + 8 + 4;

impl BatchBuf {
    /// Whether no record was appended.
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// Records so far.
    pub fn len(&self) -> u32 {
        self.count
    }

    /// Bytes of records so far.
    pub fn bytes(&self) -> usize {
        self.bytes.len().saturating_sub(BATCH_HEAD_BYTES)
    }

    fn head(&mut self) {
        if self.bytes.is_empty() {
            self.bytes.resize(BATCH_HEAD_BYTES, 0);
        }
        self.count += 1;
    }

    /// Appends a `Put`.
    pub fn put(&mut self, key: &[u8], value: &[u8], expire_unix_ms: u64, meta: Option<(u64, u32)>) {
        self.head();
        let b = &mut self.bytes;
        b.push(REC_PUT);
        b.push(key.len() as u8);
        b.extend_from_slice(key);
        b.extend_from_slice(&expire_unix_ms.to_le_bytes());
        match meta {
            None => b.push(0),
            Some((cas, flags)) => {
                b.push(1);
                b.extend_from_slice(&cas.to_le_bytes());
                b.extend_from_slice(&flags.to_le_bytes());
            }
        }
        b.extend_from_slice(&(value.len() as u32).to_le_bytes());
        b.extend_from_slice(value);
    }

    /// Appends a `Del`.
    pub fn del(&mut self, key: &[u8]) {
        self.head();
        self.bytes.push(REC_DEL);
        self.bytes.push(key.len() as u8);
        self.bytes.extend_from_slice(key);
    }

    /// Appends a `FlushPartition`.
    pub fn flush_partition(&mut self, count: u32, index: u32) {
        self.head();
        self.bytes.push(REC_FLUSH_PARTITION);
        self.bytes.extend_from_slice(&count.to_le_bytes());
        self.bytes.extend_from_slice(&index.to_le_bytes());
    }

    /// Appends a `StreamBegin` (at most [`STREAM_RANGES_MAX`] ranges).
    pub fn stream_begin(&mut self, ranges: &[SlotRange]) {
        self.head();
        let ranges = &ranges[..ranges.len().min(STREAM_RANGES_MAX)];
        self.bytes.push(REC_STREAM_BEGIN);
        self.bytes
            .extend_from_slice(&(ranges.len() as u16).to_le_bytes());
        for r in ranges {
            self.bytes.extend_from_slice(&r.first.to_le_bytes());
            self.bytes.extend_from_slice(&r.last.to_le_bytes());
        }
    }

    /// Appends a `PsTable`: `spec` as a CREATE body
    /// ([`crate::ps::encode_spec`]).
    pub fn ps_table(&mut self, id: u32, spec: &crate::ps::TableSpec) {
        self.head();
        self.bytes.push(REC_PS_TABLE);
        self.bytes.extend_from_slice(&id.to_le_bytes());
        let at = self.bytes.len();
        self.bytes.extend_from_slice(&[0, 0]);
        crate::ps::encode_spec(&mut self.bytes, spec);
        let len = (self.bytes.len() - at - 2) as u16;
        self.bytes[at..at + 2].copy_from_slice(&len.to_le_bytes());
    }

    /// Appends a `PsRow`.
    pub fn ps_row(&mut self, table: u32, key: u64, value: &[u8], expire_unix_ms: u64) {
        self.head();
        let b = &mut self.bytes;
        b.push(REC_PS_ROW);
        b.extend_from_slice(&table.to_le_bytes());
        b.extend_from_slice(&key.to_le_bytes());
        b.extend_from_slice(&expire_unix_ms.to_le_bytes());
        b.extend_from_slice(&(value.len() as u32).to_le_bytes());
        b.extend_from_slice(value);
    }

    /// Appends a `PsDel`.
    pub fn ps_del(&mut self, table: u32, key: u64) {
        self.head();
        self.bytes.push(REC_PS_DEL);
        self.bytes.extend_from_slice(&table.to_le_bytes());
        self.bytes.extend_from_slice(&key.to_le_bytes());
    }

    /// Appends a `CacheEntry` (a key of 1 to `CACHE_KEY_BYTES_MAX` bytes,
    /// a value of at most `CACHE_VALUE_BYTES_MAX`, as the cache holds).
    pub fn cache_entry(&mut self, key: &[u8], value: &[u8], expire_unix_ms: u64) {
        self.head();
        let b = &mut self.bytes;
        b.push(REC_CACHE_ENTRY);
        b.extend_from_slice(&(key.len() as u16).to_le_bytes());
        b.extend_from_slice(key);
        b.extend_from_slice(&expire_unix_ms.to_le_bytes());
        b.extend_from_slice(&(value.len() as u32).to_le_bytes());
        b.extend_from_slice(value);
    }

    /// The whole message for epoch `epoch`, batch `seq`; the buffer is
    /// left empty for the next batch.
    pub fn seal(&mut self, epoch: u64, seq: u64) -> Vec<u8> {
        let mut b = std::mem::take(&mut self.bytes);
        if b.is_empty() {
            b.resize(BATCH_HEAD_BYTES, 0);
        }
        let len = (b.len() - 4) as u32;
        b[0..4].copy_from_slice(&len.to_le_bytes());
        b[4] = KIND_BATCH;
        b[5..13].copy_from_slice(&epoch.to_le_bytes());
        b[13..21].copy_from_slice(&seq.to_le_bytes());
        b[21..25].copy_from_slice(&self.count.to_le_bytes());
        self.count = 0;
        b
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn a_batch_round_trips() {
        let mut b = BatchBuf::default();
        b.put(b"k", b"v", 0, None);
        b.put(b"m", b"vv", 12345, Some((7, 9)));
        b.del(b"gone");
        b.flush_partition(8, 3);
        b.stream_begin(&[SlotRange { first: 0, last: 99 }]);
        let spec = crate::ps::TableSpec::new("emb", 4);
        b.ps_table(3, &spec);
        b.ps_row(3, u64::MAX, &[1, 2, 3, 4], 99);
        b.ps_del(3, 5);
        let long_key = vec![b'c'; CACHE_KEY_BYTES_MAX];
        b.cache_entry(&long_key, b"block", 77);
        let msg = b.seal(5, 42);
        assert!(b.is_empty());
        let Message::Batch {
            epoch,
            seq,
            records,
        } = decode(&msg[4..]).unwrap()
        else {
            panic!("a batch");
        };
        assert_eq!((epoch, seq, records.len()), (5, 42, 9));
        let all: Vec<Record<'_>> = records.iter().collect();
        assert_eq!(
            all[1],
            Record::Put {
                key: b"m",
                value: b"vv",
                expire_unix_ms: 12345,
                meta: Some((7, 9))
            }
        );
        assert_eq!(all[2], Record::Del { key: b"gone" });
        assert_eq!(all[3], Record::FlushPartition { count: 8, index: 3 });
        assert_eq!(
            all[4],
            Record::StreamBegin {
                ranges: vec![SlotRange { first: 0, last: 99 }]
            }
        );
        let Record::PsTable { id: 3, spec: bytes } = all[5] else {
            panic!("a table: {:?}", all[5]);
        };
        assert_eq!(crate::ps::decode_create(bytes), Ok(spec));
        assert_eq!(
            all[6],
            Record::PsRow {
                table: 3,
                key: u64::MAX,
                value: &[1, 2, 3, 4],
                expire_unix_ms: 99
            }
        );
        assert_eq!(all[7], Record::PsDel { table: 3, key: 5 });
        assert_eq!(
            all[8],
            Record::CacheEntry {
                key: &long_key,
                value: b"block",
                expire_unix_ms: 77
            }
        );
        // A cache key one byte over its bound is refused.
        let mut b = BatchBuf::default();
        b.cache_entry(&vec![b'c'; CACHE_KEY_BYTES_MAX + 1], b"v", 0);
        let msg = b.seal(1, 1);
        assert!(decode(&msg[4..]).is_err());
    }

    #[test]
    fn control_messages_round_trip_and_junk_is_refused() {
        let mut out = Vec::new();
        ack(&mut out, 9, AckStatus::Refused, 4);
        assert_eq!(
            decode(&out[4..]),
            Ok(Message::Ack {
                seq: 9,
                status: AckStatus::Refused,
                epoch: 4
            })
        );
        out.clear();
        hello(&mut out, 3, &[1; PROOF_BYTES]);
        assert!(matches!(
            decode(&out[4..]),
            Ok(Message::Hello { id: 3, .. })
        ));
        assert!(decode(&[]).is_err());
        assert!(decode(&[9]).is_err());
        let mut b = BatchBuf::default();
        b.put(b"k", b"v", 0, None);
        let mut msg = b.seal(1, 1);
        msg.push(0);
        assert!(decode(&msg[4..]).is_err(), "trailing bytes");
        let mut msg = b.seal(1, 1);
        msg[21] = 3; // claims three records, holds none
        assert!(decode(&msg[4..]).is_err());
    }
}
