//! The payloads of the persistent-shard data ops (GET, PUT, DELETE), which
//! follow the shard prefix and name of [`crate::shard`].
//!
//! Every request payload is a batch: an 8-byte batch header, then `count`
//! entries back to back, with no padding (keys and values are opaque
//! bytes; nothing is aligned for a reader that copies them out anyway).
//!
//! ```text
//! batch header:  u32 count     1..=SHARD_BATCH_KEYS_MAX
//!                u32 reserved  must be 0
//! GET, DELETE:   count x { u32 key_len, key }
//! PUT:           count x { u32 key_len, u32 value_len, key, value }
//! ```
//!
//! A key is 0..=[`SHARD_DATA_KEY_BYTES_MAX`] bytes (the empty key is a
//! key, as in the shard itself), a value 0..=[`SHARD_DATA_VALUE_BYTES_MAX`]
//! bytes. The payload must end exactly after the last entry.
//!
//! A PUT is applied as one atomic batch in entry order (a key given twice
//! ends with its last value) and a DELETE as another; the server replies
//! only once the batch's journal is synced to the disk, so an
//! acknowledged write survives a crash. Their replies carry no payload:
//! the frame's status is `OK`, or the code that refused the whole batch
//! (nothing of a refused batch is written). Deleting an absent key is not
//! an error and is not reported: a delete is a blind tombstone write in
//! the shard's LSM tree, which knowing would cost a read per key.
//!
//! A GET's reply (status `OK`) has one result per key, in request order:
//!
//! ```text
//! batch header:  u32 count     = the request's count
//!                u32 reserved  0
//! count x { u16 code, u16 reserved (0), u32 value_len, value }
//! ```
//!
//! with `code`, per key: `OK` (the value follows), `NOT_FOUND`,
//! `REPLY_FULL` (the value did not fit in this reply frame: ask for the
//! key again in another request; the first key of a request always fits)
//! or `VALUE_TOO_LARGE` (the shard holds a value larger than
//! [`SHARD_DATA_VALUE_BYTES_MAX`], written by another path, which no
//! frame can carry). Only `OK` carries value bytes.
//!
//! Refusals of a whole request use the shard reply's status and message:
//! `BATCH_TOO_LARGE` (more than [`SHARD_BATCH_KEYS_MAX`] entries),
//! `KEY_TOO_LONG`, `VALUE_TOO_LARGE`, `MALFORMED` (lengths that disagree
//! with the payload, a count of 0, reserved bytes set).
//!
//! Decoding never allocates and never panics: [`decode_keys`],
//! [`decode_pairs`] and [`decode_get_reply`] walk the whole payload once,
//! checking every length against the bytes left and its bound, and return
//! views whose iterators borrow the frame.

use std::fmt;

use fabrickv_types::limits::{
    BATCH_OPS_MAX, FRAME_BODY_BYTES_MAX, SHARD_KEY_BYTES_MAX, SHARD_NAME_BYTES_MAX,
};
use fabrickv_types::ErrorCode;

use crate::shard::{encode_request, ShardOp, SHARD_PREFIX_BYTES};
use crate::{le_u16, le_u32};

/// Most keys (or pairs) one data request carries: the native batch bound,
/// so a shard batch costs the server no more bookkeeping than a kv one.
pub const SHARD_BATCH_KEYS_MAX: usize = BATCH_OPS_MAX;

/// Longest key a data op carries, in bytes: the shard's own bound, so
/// every stored key can be named on the wire.
pub const SHARD_DATA_KEY_BYTES_MAX: usize = SHARD_KEY_BYTES_MAX;

/// Bytes of the batch header every data payload starts with.
pub const BATCH_HEADER_BYTES: usize = 8;

/// Bytes before each key of a GET or DELETE (its length).
pub const KEY_ENTRY_HEADER_BYTES: usize = 4;

/// Bytes before each pair of a PUT (key length, value length).
pub const PAIR_ENTRY_HEADER_BYTES: usize = 8;

/// Bytes before each result of a GET reply (code, reserved, value length).
pub const RESULT_ENTRY_HEADER_BYTES: usize = 8;

/// Largest value a data op carries, in bytes: what a frame body leaves for
/// it in a one-pair PUT to a shard with the longest name and the longest
/// key (about 1012 KiB). Any single pair within the bounds therefore fits
/// one request, and its value one GET reply.
pub const SHARD_DATA_VALUE_BYTES_MAX: usize = FRAME_BODY_BYTES_MAX
    - SHARD_PREFIX_BYTES
    - SHARD_NAME_BYTES_MAX
    - BATCH_HEADER_BYTES
    - PAIR_ENTRY_HEADER_BYTES
    - SHARD_DATA_KEY_BYTES_MAX;

/// Largest payload of a shard reply, in bytes: a frame body less the
/// reply's prefix (replies carry no name).
pub const REPLY_PAYLOAD_BYTES_MAX: usize = FRAME_BODY_BYTES_MAX - SHARD_PREFIX_BYTES;

const _: () = assert!(
    SHARD_DATA_VALUE_BYTES_MAX <= u32::MAX as usize,
    "lengths travel in four bytes"
);
const _: () = assert!(
    SHARD_BATCH_KEYS_MAX <= SHARD_DATA_VALUE_BYTES_MAX,
    "counts travel in four bytes too"
);
const _: () = assert!(
    BATCH_HEADER_BYTES
        + RESULT_ENTRY_HEADER_BYTES * SHARD_BATCH_KEYS_MAX
        + SHARD_DATA_VALUE_BYTES_MAX
        <= REPLY_PAYLOAD_BYTES_MAX,
    "the first key of any GET always fits its reply, so a resent GET makes progress"
);

/// Why a data payload was refused: the stable code and what was wrong.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DataError {
    /// The code sent back (`MALFORMED`, `BATCH_TOO_LARGE`, `KEY_TOO_LONG`,
    /// `VALUE_TOO_LARGE`).
    pub code: ErrorCode,
    /// What was wrong, for the refusal's message.
    pub why: &'static str,
}

impl fmt::Display for DataError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.code.name(), self.why)
    }
}

impl std::error::Error for DataError {}

fn malformed(why: &'static str) -> DataError {
    DataError {
        code: ErrorCode::Malformed,
        why,
    }
}

/// Bytes of a GET or DELETE request payload for `keys`.
pub fn keys_payload_bytes<K: AsRef<[u8]>>(keys: &[K]) -> usize {
    BATCH_HEADER_BYTES
        + keys
            .iter()
            .map(|k| KEY_ENTRY_HEADER_BYTES + k.as_ref().len())
            .sum::<usize>()
}

/// Bytes of a PUT request payload for `pairs`.
pub fn pairs_payload_bytes<K: AsRef<[u8]>, V: AsRef<[u8]>>(pairs: &[(K, V)]) -> usize {
    BATCH_HEADER_BYTES
        + pairs
            .iter()
            .map(|(k, v)| PAIR_ENTRY_HEADER_BYTES + k.as_ref().len() + v.as_ref().len())
            .sum::<usize>()
}

/// Bytes of a request's body before its payload, for a shard named `name`.
pub fn request_overhead_bytes(name: &str) -> usize {
    SHARD_PREFIX_BYTES + name.len()
}

fn put_batch_header(out: &mut Vec<u8>, count: usize) {
    out.extend_from_slice(&(count as u32).to_le_bytes());
    out.extend_from_slice(&0u32.to_le_bytes());
}

fn put_keys<K: AsRef<[u8]>>(out: &mut Vec<u8>, keys: &[K]) {
    out.reserve(keys_payload_bytes(keys));
    put_batch_header(out, keys.len());
    for k in keys {
        let k = k.as_ref();
        out.extend_from_slice(&(k.len() as u32).to_le_bytes());
        out.extend_from_slice(k);
    }
}

/// Appends a GET request for `keys` of shard `name`. The encoder trusts
/// its caller with the bounds (the client checks them; the server checks
/// them again on decode).
pub fn encode_get<K: AsRef<[u8]>>(
    out: &mut Vec<u8>,
    request_id: u64,
    worker: u16,
    name: &str,
    keys: &[K],
) {
    encode_request(out, request_id, worker, ShardOp::Get, name, |b| {
        put_keys(b, keys)
    });
}

/// Appends a DELETE request for `keys` of shard `name`.
pub fn encode_delete<K: AsRef<[u8]>>(
    out: &mut Vec<u8>,
    request_id: u64,
    worker: u16,
    name: &str,
    keys: &[K],
) {
    encode_request(out, request_id, worker, ShardOp::Delete, name, |b| {
        put_keys(b, keys)
    });
}

/// Appends a PUT request writing `pairs` to shard `name`.
pub fn encode_put<K: AsRef<[u8]>, V: AsRef<[u8]>>(
    out: &mut Vec<u8>,
    request_id: u64,
    worker: u16,
    name: &str,
    pairs: &[(K, V)],
) {
    encode_request(out, request_id, worker, ShardOp::Put, name, |b| {
        b.reserve(pairs_payload_bytes(pairs));
        put_batch_header(b, pairs.len());
        for (k, v) in pairs {
            let (k, v) = (k.as_ref(), v.as_ref());
            b.extend_from_slice(&(k.len() as u32).to_le_bytes());
            b.extend_from_slice(&(v.len() as u32).to_le_bytes());
            b.extend_from_slice(k);
            b.extend_from_slice(v);
        }
    });
}

/// Reads the batch header: the entry count and where entries start.
fn batch_header(payload: &[u8]) -> Result<usize, DataError> {
    if payload.len() < BATCH_HEADER_BYTES {
        return Err(malformed("payload shorter than its batch header"));
    }
    if le_u32(payload, 4) != 0 {
        return Err(malformed("reserved bytes of the batch header are set"));
    }
    let count = le_u32(payload, 0) as usize;
    if count == 0 {
        return Err(malformed("a batch names no key"));
    }
    if count > SHARD_BATCH_KEYS_MAX {
        return Err(DataError {
            code: ErrorCode::BatchTooLarge,
            why: "more entries than SHARD_BATCH_KEYS_MAX",
        });
    }
    Ok(count)
}

/// Reads one entry at `at` of `b`: its key, its value (PUT) and where the
/// next entry starts.
fn entry(b: &[u8], at: usize, pair: bool) -> Result<(&[u8], &[u8], usize), DataError> {
    let head = if pair {
        PAIR_ENTRY_HEADER_BYTES
    } else {
        KEY_ENTRY_HEADER_BYTES
    };
    if b.len().saturating_sub(at) < head {
        return Err(malformed("entry header runs past the payload"));
    }
    let key_len = le_u32(b, at) as usize;
    let value_len = if pair { le_u32(b, at + 4) as usize } else { 0 };
    if key_len > SHARD_DATA_KEY_BYTES_MAX {
        return Err(DataError {
            code: ErrorCode::KeyTooLong,
            why: "a key is longer than SHARD_DATA_KEY_BYTES_MAX",
        });
    }
    if value_len > SHARD_DATA_VALUE_BYTES_MAX {
        return Err(DataError {
            code: ErrorCode::ValueTooLarge,
            why: "a value is larger than SHARD_DATA_VALUE_BYTES_MAX",
        });
    }
    // Both lengths are bounded above, so these sums cannot overflow.
    let key_at = at + head;
    let value_at = key_at + key_len;
    let next = value_at + value_len;
    if next > b.len() {
        return Err(malformed("an entry runs past the payload"));
    }
    Ok((&b[key_at..value_at], &b[value_at..next], next))
}

/// Walks every entry once; returns the count.
fn validate(payload: &[u8], pair: bool) -> Result<usize, DataError> {
    let count = batch_header(payload)?;
    let mut at = BATCH_HEADER_BYTES;
    for _ in 0..count {
        at = entry(payload, at, pair)?.2;
    }
    if at != payload.len() {
        return Err(malformed("bytes after the last entry"));
    }
    Ok(count)
}

/// The keys of a decoded GET or DELETE, borrowing the frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Keys<'a> {
    count: usize,
    payload: &'a [u8],
}

impl<'a> Keys<'a> {
    /// How many keys.
    pub fn len(&self) -> usize {
        self.count
    }

    /// Whether there are none (never, once decoded).
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// The keys, in request order.
    pub fn iter(&self) -> KeyIter<'a> {
        KeyIter {
            payload: self.payload,
            at: BATCH_HEADER_BYTES,
            left: self.count,
        }
    }
}

/// Iterator over [`Keys`].
#[derive(Debug, Clone)]
pub struct KeyIter<'a> {
    payload: &'a [u8],
    at: usize,
    left: usize,
}

impl<'a> Iterator for KeyIter<'a> {
    type Item = &'a [u8];

    fn next(&mut self) -> Option<&'a [u8]> {
        if self.left == 0 {
            return None;
        }
        let (key, _, next) = entry(self.payload, self.at, false).ok()?;
        self.left -= 1;
        self.at = next;
        Some(key)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (self.left, Some(self.left))
    }
}

/// The pairs of a decoded PUT, borrowing the frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pairs<'a> {
    count: usize,
    payload: &'a [u8],
}

impl<'a> Pairs<'a> {
    /// How many pairs.
    pub fn len(&self) -> usize {
        self.count
    }

    /// Whether there are none (never, once decoded).
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// The pairs, in request order.
    pub fn iter(&self) -> PairIter<'a> {
        PairIter {
            payload: self.payload,
            at: BATCH_HEADER_BYTES,
            left: self.count,
        }
    }
}

/// Iterator over [`Pairs`]: (key, value).
#[derive(Debug, Clone)]
pub struct PairIter<'a> {
    payload: &'a [u8],
    at: usize,
    left: usize,
}

impl<'a> Iterator for PairIter<'a> {
    type Item = (&'a [u8], &'a [u8]);

    fn next(&mut self) -> Option<(&'a [u8], &'a [u8])> {
        if self.left == 0 {
            return None;
        }
        let (key, value, next) = entry(self.payload, self.at, true).ok()?;
        self.left -= 1;
        self.at = next;
        Some((key, value))
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (self.left, Some(self.left))
    }
}

/// Reads the payload of a GET or DELETE request, checking every entry.
pub fn decode_keys(payload: &[u8]) -> Result<Keys<'_>, DataError> {
    let count = validate(payload, false)?;
    Ok(Keys { count, payload })
}

/// Reads the payload of a PUT request, checking every entry.
pub fn decode_pairs(payload: &[u8]) -> Result<Pairs<'_>, DataError> {
    let count = validate(payload, true)?;
    Ok(Pairs { count, payload })
}

/// Writes a GET reply's payload, one result per key in order, keeping
/// room for the results still to come so the reply never outgrows a
/// frame: a value that does not fit is answered `REPLY_FULL`.
#[derive(Debug)]
pub struct GetReplyWriter {
    start: usize,
    count: usize,
    written: usize,
}

impl GetReplyWriter {
    /// Starts the payload of a reply to `count` keys at the end of `out`.
    pub fn begin(out: &mut Vec<u8>, count: usize) -> GetReplyWriter {
        let start = out.len();
        put_batch_header(out, count);
        GetReplyWriter {
            start,
            count,
            written: 0,
        }
    }

    /// Whether a value of `len` bytes fits as the next result, with room
    /// left for a bare result header for every key after it.
    pub fn fits(&self, out: &[u8], len: usize) -> bool {
        let used = out.len() - self.start;
        let after = self.count.saturating_sub(self.written + 1);
        used + RESULT_ENTRY_HEADER_BYTES * (1 + after) + len <= REPLY_PAYLOAD_BYTES_MAX
    }

    /// Appends the next result: `value` is written only when `code` is OK.
    pub fn push(&mut self, out: &mut Vec<u8>, code: ErrorCode, value: &[u8]) {
        let value = if code == ErrorCode::Ok { value } else { &[] };
        out.extend_from_slice(&code.as_u16().to_le_bytes());
        out.extend_from_slice(&0u16.to_le_bytes());
        out.extend_from_slice(&(value.len() as u32).to_le_bytes());
        out.extend_from_slice(value);
        self.written += 1;
    }

    /// Results written so far.
    pub fn written(&self) -> usize {
        self.written
    }
}

/// One result of a GET reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GetResult<'a> {
    /// `OK`, `NOT_FOUND`, `REPLY_FULL` or `VALUE_TOO_LARGE` (a code this
    /// crate does not know reads as `INTERNAL`).
    pub code: ErrorCode,
    /// The value (empty unless `code` is OK).
    pub value: &'a [u8],
}

/// The results of a decoded GET reply, borrowing the frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GetResults<'a> {
    count: usize,
    payload: &'a [u8],
}

impl<'a> GetResults<'a> {
    /// How many results.
    pub fn len(&self) -> usize {
        self.count
    }

    /// Whether there are none (never, once decoded).
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// The results, in request order.
    pub fn iter(&self) -> GetResultIter<'a> {
        GetResultIter {
            payload: self.payload,
            at: BATCH_HEADER_BYTES,
            left: self.count,
        }
    }
}

/// Iterator over [`GetResults`].
#[derive(Debug, Clone)]
pub struct GetResultIter<'a> {
    payload: &'a [u8],
    at: usize,
    left: usize,
}

fn result_entry(b: &[u8], at: usize) -> Result<(GetResult<'_>, usize), DataError> {
    if b.len().saturating_sub(at) < RESULT_ENTRY_HEADER_BYTES {
        return Err(malformed("result header runs past the payload"));
    }
    if le_u16(b, at + 2) != 0 {
        return Err(malformed("reserved bytes of a result are set"));
    }
    let code = ErrorCode::from_u16(le_u16(b, at)).unwrap_or(ErrorCode::Internal);
    let len = le_u32(b, at + 4) as usize;
    if len > SHARD_DATA_VALUE_BYTES_MAX {
        return Err(malformed(
            "a result is larger than SHARD_DATA_VALUE_BYTES_MAX",
        ));
    }
    if len != 0 && code != ErrorCode::Ok {
        return Err(malformed("a result that is not OK carries a value"));
    }
    let value_at = at + RESULT_ENTRY_HEADER_BYTES;
    let next = value_at + len;
    if next > b.len() {
        return Err(malformed("a result runs past the payload"));
    }
    Ok((
        GetResult {
            code,
            value: &b[value_at..next],
        },
        next,
    ))
}

impl<'a> Iterator for GetResultIter<'a> {
    type Item = GetResult<'a>;

    fn next(&mut self) -> Option<GetResult<'a>> {
        if self.left == 0 {
            return None;
        }
        let (r, next) = result_entry(self.payload, self.at).ok()?;
        self.left -= 1;
        self.at = next;
        Some(r)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (self.left, Some(self.left))
    }
}

/// Reads the payload of a GET reply whose status is OK, checking every
/// result.
pub fn decode_get_reply(payload: &[u8]) -> Result<GetResults<'_>, DataError> {
    let count = batch_header(payload)?;
    let mut at = BATCH_HEADER_BYTES;
    for _ in 0..count {
        at = result_entry(payload, at)?.1;
    }
    if at != payload.len() {
        return Err(malformed("bytes after the last result"));
    }
    Ok(GetResults { count, payload })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decode_frame;
    use crate::shard::decode_request;
    use proptest::prelude::*;

    fn payload_of(frame_bytes: &[u8]) -> (ShardOp, Vec<u8>) {
        let f = decode_frame(frame_bytes).expect("frame");
        let m = decode_request(&f).expect("request");
        (m.op, m.payload.to_vec())
    }

    #[test]
    fn get_and_delete_round_trip_including_the_empty_key() {
        let keys: [&[u8]; 3] = [b"", b"alpha", &[0xff; 300]];
        let mut out = Vec::new();
        encode_get(&mut out, 1, 0, "s", &keys);
        let (op, p) = payload_of(&out);
        assert_eq!(op, ShardOp::Get);
        assert_eq!(p.len(), keys_payload_bytes(&keys));
        let got: Vec<&[u8]> = decode_keys(&p).expect("keys").iter().collect();
        assert_eq!(got, keys);
        out.clear();
        encode_delete(&mut out, 2, 0, "s", &keys[..1]);
        let (op, p) = payload_of(&out);
        assert_eq!(op, ShardOp::Delete);
        assert_eq!(decode_keys(&p).expect("keys").len(), 1);
    }

    #[test]
    fn put_round_trips() {
        let pairs: [(&[u8], &[u8]); 3] = [(b"", b"empty key"), (b"k", b""), (b"k2", &[7; 1000])];
        let mut out = Vec::new();
        encode_put(&mut out, 1, 0, "shard-1", &pairs);
        let (op, p) = payload_of(&out);
        assert_eq!(op, ShardOp::Put);
        assert_eq!(p.len(), pairs_payload_bytes(&pairs));
        let got: Vec<_> = decode_pairs(&p).expect("pairs").iter().collect();
        assert_eq!(got, pairs);
    }

    #[test]
    fn a_maximal_pair_fits_one_frame() {
        let name = "n".repeat(SHARD_NAME_BYTES_MAX);
        let key = vec![1u8; SHARD_DATA_KEY_BYTES_MAX];
        let value = vec![2u8; SHARD_DATA_VALUE_BYTES_MAX];
        let mut out = Vec::new();
        encode_put(&mut out, 1, 0, &name, &[(&key, &value)]);
        let (_, p) = payload_of(&out);
        let got: Vec<_> = decode_pairs(&p).expect("pairs").iter().collect();
        assert_eq!(got, [(&key[..], &value[..])]);
        // One byte more and the frame is refused.
        let value = vec![2u8; SHARD_DATA_VALUE_BYTES_MAX + 1];
        out.clear();
        encode_put(&mut out, 1, 0, &name, &[(&key, &value)]);
        assert!(decode_frame(&out).is_err());
    }

    #[test]
    fn bounds_and_lengths_are_refused_with_their_codes() {
        let code_of = |p: &[u8], pair: bool| {
            if pair {
                decode_pairs(p).map(|_| ()).expect_err("refused").code
            } else {
                decode_keys(p).map(|_| ()).expect_err("refused").code
            }
        };
        let long = vec![0u8; SHARD_DATA_KEY_BYTES_MAX + 1];
        let mut p = Vec::new();
        put_keys(&mut p, &[&b"ok"[..], &long]);
        assert_eq!(code_of(&p, false), ErrorCode::KeyTooLong);
        // A value length over the bound, even without the bytes.
        let mut p = Vec::new();
        put_batch_header(&mut p, 1);
        p.extend_from_slice(&1u32.to_le_bytes());
        p.extend_from_slice(&(SHARD_DATA_VALUE_BYTES_MAX as u32 + 1).to_le_bytes());
        p.push(b'k');
        assert_eq!(code_of(&p, true), ErrorCode::ValueTooLarge);
        // Counts.
        let mut p = Vec::new();
        put_batch_header(&mut p, SHARD_BATCH_KEYS_MAX + 1);
        assert_eq!(code_of(&p, false), ErrorCode::BatchTooLarge);
        let mut p = Vec::new();
        put_batch_header(&mut p, 0);
        assert_eq!(code_of(&p, false), ErrorCode::Malformed);
        // Truncated, trailing bytes, reserved bytes.
        let mut p = Vec::new();
        put_keys(&mut p, &[b"abc"]);
        assert_eq!(code_of(&p[..p.len() - 1], false), ErrorCode::Malformed);
        let mut longer = p.clone();
        longer.push(0);
        assert_eq!(code_of(&longer, false), ErrorCode::Malformed);
        p[5] = 1;
        assert_eq!(code_of(&p, false), ErrorCode::Malformed);
        assert_eq!(code_of(&[1, 0, 0], false), ErrorCode::Malformed);
    }

    #[test]
    fn get_replies_round_trip() {
        let mut out = vec![0xAA; 5];
        let mut w = GetReplyWriter::begin(&mut out, 3);
        assert!(w.fits(&out, 10));
        w.push(&mut out, ErrorCode::Ok, b"value");
        w.push(&mut out, ErrorCode::NotFound, b"ignored");
        w.push(&mut out, ErrorCode::Ok, b"");
        assert_eq!(w.written(), 3);
        let r = decode_get_reply(&out[5..]).expect("reply");
        let got: Vec<_> = r.iter().map(|r| (r.code, r.value)).collect();
        assert_eq!(
            got,
            [
                (ErrorCode::Ok, &b"value"[..]),
                (ErrorCode::NotFound, &b""[..]),
                (ErrorCode::Ok, &b""[..])
            ]
        );
    }

    #[test]
    fn get_reply_writer_keeps_room_for_every_result() {
        let n = SHARD_BATCH_KEYS_MAX;
        let mut out = Vec::new();
        let w = GetReplyWriter::begin(&mut out, n);
        // The first key of a full batch always fits, with the longest value.
        assert!(w.fits(&out, SHARD_DATA_VALUE_BYTES_MAX));
        let room = REPLY_PAYLOAD_BYTES_MAX - BATCH_HEADER_BYTES - n * RESULT_ENTRY_HEADER_BYTES;
        assert!(w.fits(&out, room));
        assert!(!w.fits(&out, room + 1));
    }

    #[test]
    fn bad_get_replies_are_refused() {
        let mut out = Vec::new();
        let mut w = GetReplyWriter::begin(&mut out, 1);
        w.push(&mut out, ErrorCode::Ok, b"v");
        assert!(decode_get_reply(&out[..out.len() - 1]).is_err());
        let mut bad = out.clone();
        bad[8] = ErrorCode::NotFound.as_u16() as u8;
        assert!(decode_get_reply(&bad).is_err(), "NOT_FOUND with a value");
        let mut bad = out.clone();
        bad[10] = 1;
        assert!(decode_get_reply(&bad).is_err(), "reserved bytes");
    }

    proptest! {
        #[test]
        fn any_bytes_decode_without_panicking(p in prop::collection::vec(any::<u8>(), 0..256)) {
            let decoded = [decode_keys(&p).map(|k| (k.len(), k.iter().count())),
                           decode_pairs(&p).map(|k| (k.len(), k.iter().count())),
                           decode_get_reply(&p).map(|k| (k.len(), k.iter().count()))];
            for (len, walked) in decoded.into_iter().flatten() {
                prop_assert!((1..=SHARD_BATCH_KEYS_MAX).contains(&len));
                prop_assert_eq!(len, walked, "the iterator yields every entry");
            }
        }

        #[test]
        fn valid_headers_with_random_entries_never_panic(
            count in 0u32..8,
            tail in prop::collection::vec(any::<u8>(), 0..128),
        ) {
            let mut p = Vec::new();
            put_batch_header(&mut p, count as usize);
            p.extend_from_slice(&tail);
            if let Ok(k) = decode_keys(&p) {
                prop_assert_eq!(k.iter().count(), count as usize);
            }
            if let Ok(k) = decode_pairs(&p) {
                prop_assert_eq!(k.iter().count(), count as usize);
            }
            if let Ok(k) = decode_get_reply(&p) {
                prop_assert_eq!(k.iter().count(), count as usize);
            }
        }

        #[test]
        fn pairs_round_trip(pairs in prop::collection::vec(
            (prop::collection::vec(any::<u8>(), 0..40), prop::collection::vec(any::<u8>(), 0..80)),
            1..20,
        )) {
            let mut out = Vec::new();
            encode_put(&mut out, 9, 1, "p", &pairs);
            let (_, p) = payload_of(&out);
            let got: Vec<(Vec<u8>, Vec<u8>)> = decode_pairs(&p)
                .expect("pairs")
                .iter()
                .map(|(k, v)| (k.to_vec(), v.to_vec()))
                .collect();
            prop_assert_eq!(got, pairs);
        }
    }
}
