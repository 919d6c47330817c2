//! [`MgetBuf`]: the caller's buffer a batched read lands its values in
//! ([`crate::Kv::mget_into`]), so that a warm client reads any number of
//! keys with no allocation per key.
//!
//! Values are copied from the reply frames straight into one byte buffer
//! (`data`), and each key gets a span of it (or none, when absent). Both
//! are cleared, not freed, at the start of the next call: once they have
//! grown to a workload's size, reading more keys allocates nothing.
//!
//! Results arrive per worker, not in key order, so spans are ranges
//! rather than lengths; a value over `VALUE_BYTES_MAX` (answered
//! `LARGE_VALUE`) is read in GET_CHUNK pieces after the batch, and its
//! bytes follow the small values'.

use std::ops::Range;

use fabrickv_types::limits::LARGE_VALUE_BYTES_MAX;
use fabrickv_types::ErrorCode;
use fabrickv_wire::LARGE_RESULT_BYTES;

use crate::batch::Sink;
use crate::{ClientError, Result};

/// The values of a batched read, in the caller's hands between calls:
/// one byte buffer and, per key, the span of it that holds its value.
///
/// ```no_run
/// use fabrickv_client::{Client, Kv, MgetBuf};
/// # fn main() -> fabrickv_client::Result<()> {
/// let mut c = Client::connect("tcp://127.0.0.1:7379")?;
/// let mut buf = MgetBuf::new();
/// c.mget_into(&[b"a", b"b"], &mut buf)?;
/// for (i, v) in buf.iter().enumerate() {
///     println!("{i}: {:?}", v.map(<[u8]>::len));
/// }
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Default, Clone)]
pub struct MgetBuf {
    /// Every value found, back to back (spans say where each is).
    data: Vec<u8>,
    /// Per key, in the caller's order: where its value is in `data`, or
    /// `None` when the key is absent.
    spans: Vec<Option<Range<usize>>>,
    /// Keys answered `LARGE_VALUE` in this call, read after the batch.
    large: Vec<Large>,
    /// Positions answered `REPLY_FULL` and not yet sent again.
    full: Vec<usize>,
    /// Scratch of the executor: the positions it sends again.
    pub(crate) again: Vec<usize>,
    /// Results landed in this call (`REPLY_FULL` ones not counted), so a
    /// key left without one is told from an absent key.
    answered: usize,
    /// The first key (by position) the server refused, and its code: the
    /// call's error, as `mget` reports it.
    refused: Option<(usize, ErrorCode)>,
}

/// A key answered `LARGE_VALUE`: its position, the value's length and the
/// pin tag its GET_CHUNK pieces name.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Large {
    /// The key's position in the call.
    pub(crate) pos: usize,
    /// The value's length, in bytes (at most `LARGE_VALUE_BYTES_MAX`).
    pub(crate) total: usize,
    /// The pin tag of the answer.
    pub(crate) tag: u64,
}

impl MgetBuf {
    /// An empty buffer; it grows on first use and is reused after.
    pub fn new() -> MgetBuf {
        MgetBuf::default()
    }

    /// A buffer with room for `keys` keys and `bytes` bytes of values.
    pub fn with_capacity(keys: usize, bytes: usize) -> MgetBuf {
        MgetBuf {
            data: Vec::with_capacity(bytes),
            spans: Vec::with_capacity(keys),
            ..MgetBuf::default()
        }
    }

    /// The number of keys of the last call.
    pub fn len(&self) -> usize {
        self.spans.len()
    }

    /// Whether the last call had no keys.
    pub fn is_empty(&self) -> bool {
        self.spans.is_empty()
    }

    /// The value of key `i` of the last call; `None` if it was absent (or
    /// `i` is out of range).
    #[inline]
    pub fn get(&self, i: usize) -> Option<&[u8]> {
        let span = self.spans.get(i)?.clone()?;
        self.data.get(span)
    }

    /// Where the value of key `i` lies in [`MgetBuf::data`].
    #[inline]
    pub fn span(&self, i: usize) -> Option<Range<usize>> {
        self.spans.get(i)?.clone()
    }

    /// Every value found, back to back, not necessarily in key order.
    pub fn data(&self) -> &[u8] {
        &self.data
    }

    /// The values of the last call, in key order.
    pub fn iter(&self) -> impl ExactSizeIterator<Item = Option<&[u8]>> + '_ {
        self.spans.iter().map(|s| s.clone().map(|r| &self.data[r]))
    }

    /// The values as one `Vec` each (what `mget` returns). A single value
    /// that fills the whole buffer is moved out, not copied.
    pub fn into_vecs(self) -> Vec<Option<Vec<u8>>> {
        if let [Some(r)] = &self.spans[..] {
            if r.start == 0 && r.end == self.data.len() {
                return vec![Some(self.data)];
            }
        }
        self.iter().map(|v| v.map(<[u8]>::to_vec)).collect()
    }

    /// Empties the buffer for a call of `keys` keys (every key absent
    /// until its result lands), keeping what it has allocated.
    pub(crate) fn start(&mut self, keys: usize) {
        self.data.clear();
        self.spans.clear();
        self.spans.resize(keys, None);
        self.large.clear();
        self.full.clear();
        self.answered = 0;
        self.refused = None;
    }

    /// After the batch: every key has its result, or the call fails.
    /// Returns the first refused key (position and code), if any.
    pub(crate) fn finish_batch(&mut self) -> Result<Option<(usize, ErrorCode)>> {
        if self.answered != self.spans.len() {
            return Err(ClientError::Protocol("an operation got no result".into()));
        }
        self.large.sort_unstable_by_key(|l| l.pos);
        Ok(self.refused)
    }

    /// The keys answered `LARGE_VALUE`, by position (after
    /// [`MgetBuf::finish_batch`]).
    pub(crate) fn large(&self, i: usize) -> Option<Large> {
        self.large.get(i).copied()
    }

    /// Appends the bytes of a large value being read, piece by piece.
    pub(crate) fn data_mut(&mut self) -> &mut Vec<u8> {
        &mut self.data
    }

    /// Key `pos`'s value is what `data` holds from `start` on.
    pub(crate) fn set_span(&mut self, pos: usize, start: usize) {
        self.spans[pos] = Some(start..self.data.len());
    }

    /// Key `pos` turned out absent.
    pub(crate) fn clear_span(&mut self, pos: usize) {
        self.spans[pos] = None;
    }
}

impl Sink for MgetBuf {
    #[inline]
    fn land(&mut self, pos: usize, code: ErrorCode, value: &[u8]) -> Result<()> {
        match code {
            ErrorCode::Ok => {
                let start = self.data.len();
                self.data.extend_from_slice(value);
                self.spans[pos] = Some(start..self.data.len());
            }
            ErrorCode::NotFound => self.spans[pos] = None,
            ErrorCode::LargeValue => self.large.push(large_head(pos, value)?),
            ErrorCode::ReplyFull => {
                self.full.push(pos);
                return Ok(());
            }
            code => {
                if !matches!(self.refused, Some((p, _)) if p <= pos) {
                    self.refused = Some((pos, code));
                }
            }
        }
        self.answered += 1;
        Ok(())
    }

    fn reply_full(&mut self, again: &mut Vec<usize>) {
        again.clear();
        std::mem::swap(again, &mut self.full);
    }
}

/// The head of a `LARGE_VALUE` answer: the value's length and its pin
/// tag, little-endian, 8 bytes each.
pub(crate) fn large_head(pos: usize, head: &[u8]) -> Result<Large> {
    let (Some(total), Some(tag)) = (head.get(..8), head.get(8..16)) else {
        return Err(ClientError::Protocol("bad LARGE_VALUE result".into()));
    };
    if head.len() != LARGE_RESULT_BYTES {
        return Err(ClientError::Protocol("bad LARGE_VALUE result".into()));
    }
    let le = |b: &[u8]| {
        let mut w = [0u8; 8];
        w.copy_from_slice(b);
        u64::from_le_bytes(w)
    };
    let (total, tag) = (le(total), le(tag));
    if total > LARGE_VALUE_BYTES_MAX as u64 {
        return Err(ClientError::Protocol(format!(
            "LARGE_VALUE of {total} bytes exceeds {LARGE_VALUE_BYTES_MAX}"
        )));
    }
    Ok(Large {
        pos,
        total: total as usize,
        tag,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_land_by_position_and_reuse_keeps_the_allocation() {
        let mut b = MgetBuf::new();
        b.start(3);
        b.land(2, ErrorCode::Ok, b"two").expect("land");
        b.land(0, ErrorCode::Ok, b"zero!").expect("land");
        b.land(1, ErrorCode::NotFound, b"").expect("land");
        assert_eq!(b.finish_batch().expect("all in"), None);
        let got: Vec<_> = b.iter().collect();
        assert_eq!(got, [Some(&b"zero!"[..]), None, Some(&b"two"[..])]);
        let cap = (b.data.capacity(), b.spans.capacity());
        b.start(2);
        b.land(1, ErrorCode::Ok, b"x").expect("land");
        b.land(0, ErrorCode::ReplyFull, b"").expect("land");
        let mut again = Vec::new();
        b.reply_full(&mut again);
        assert_eq!(again, [0]);
        assert!(b.finish_batch().is_err(), "key 0 has no result yet");
        b.land(0, ErrorCode::Ok, b"").expect("land");
        assert_eq!(b.finish_batch().expect("all in"), None);
        assert_eq!(b.get(0), Some(&b""[..]));
        assert_eq!(b.get(1), Some(&b"x"[..]));
        assert_eq!(b.get(2), None);
        assert_eq!((b.data.capacity(), b.spans.capacity()), cap);
    }

    #[test]
    fn the_first_refused_key_by_position_is_the_error() {
        let mut b = MgetBuf::new();
        b.start(4);
        b.land(3, ErrorCode::Ok, b"v").expect("land");
        b.land(2, ErrorCode::Unavailable, b"").expect("land");
        b.land(1, ErrorCode::Malformed, b"").expect("land");
        b.land(0, ErrorCode::NotFound, b"").expect("land");
        assert_eq!(
            b.finish_batch().expect("all in"),
            Some((1, ErrorCode::Malformed))
        );
    }

    #[test]
    fn a_large_head_is_checked() {
        let mut b = MgetBuf::new();
        b.start(1);
        assert!(b.land(0, ErrorCode::LargeValue, &[0; 15]).is_err());
        let mut head = (LARGE_VALUE_BYTES_MAX as u64 + 1).to_le_bytes().to_vec();
        head.extend_from_slice(&7u64.to_le_bytes());
        assert!(b.land(0, ErrorCode::LargeValue, &head).is_err());
        let mut head = 5u64.to_le_bytes().to_vec();
        head.extend_from_slice(&7u64.to_le_bytes());
        b.land(0, ErrorCode::LargeValue, &head).expect("land");
        assert_eq!(b.finish_batch().expect("all in"), None);
        let l = b.large(0).expect("one large");
        assert_eq!((l.pos, l.total, l.tag), (0, 5, 7));
    }

    #[test]
    fn one_value_filling_the_buffer_is_moved_out() {
        let mut b = MgetBuf::new();
        b.start(1);
        b.land(0, ErrorCode::Ok, b"whole").expect("land");
        let ptr = b.data.as_ptr();
        let v = b.into_vecs();
        assert_eq!(v, [Some(b"whole".to_vec())]);
        assert_eq!(v[0].as_ref().map(|v| v.as_ptr()), Some(ptr));
    }
}
