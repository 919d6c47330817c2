//! The layout of one item in the pool, shared by both modes.
//!
//! ```text
//! offset  size  field
//!      0     8  key hash (u64 LE): lets the cache-mode log walk find the
//!               index slot of an item it overwrites, without rehashing
//!      8     8  expire_at_ms (u64 LE, 0 = no TTL)
//!     16     4  value length in bytes (u32 LE)
//!     20     1  key length in bytes
//!     21     1  flags (DEAD, PADDING, LARGE, META)
//!     22     2  reserved, zero
//!     24     .  key bytes, then value bytes, then zero padding up to
//!               ITEM_ALIGN_BYTES
//!      .    16  only with FLAG_META: the item's meta (see below)
//! ```
//!
//! An item written with [`ItemMeta`] (the memcached front end's CAS value
//! and 32-bit client flags) carries [`ITEM_META_BYTES`] more after its
//! padded key and value: CAS (u64 LE), client flags (u32 LE), 4 zero
//! bytes. Items written without it (the native kv, RESP) have the layout
//! and size they always had.
//!
//! Every item starts at a multiple of [`ITEM_ALIGN_BYTES`] in the pool, so
//! headers never straddle a cache line more than they must and the log walk
//! can step from item to item by size alone.

use fabrickv_types::limits::{KEY_BYTES_MAX, VALUE_BYTES_MAX};

/// Alignment of every item in the pool, in bytes: one u64, so that header
/// words are naturally aligned and sizes round to whole words.
pub const ITEM_ALIGN_BYTES: usize = 8;

/// Size of the item header, in bytes.
pub const ITEM_HEADER_BYTES: usize = 24;

/// Largest item any partition could hold, in bytes: a maximal key and a
/// maximal value with their header, rounded up to the alignment.
pub const ITEM_BYTES_MAX: usize = item_bytes(KEY_BYTES_MAX, VALUE_BYTES_MAX);

/// Bytes an item's [`ItemMeta`] adds to it, when it has one: CAS (8),
/// client flags (4) and 4 bytes of padding, a multiple of the alignment.
pub const ITEM_META_BYTES: usize = 16;

const HASH_AT: usize = 0;
const EXPIRE_AT: usize = 8;
const VALUE_LEN_AT: usize = 16;
const KEY_LEN_AT: usize = 20;
const FLAGS_AT: usize = 21;

/// Flag: the item is no longer indexed (deleted, replaced, dropped by the
/// lossy index or reclaimed as expired). Only the cache-mode log keeps dead
/// items around; the flag stops the log walk from counting them twice.
pub(crate) const FLAG_DEAD: u8 = 1;

/// Flag: this record is not an item but filler up to the end of the log,
/// written so that no item ever wraps around the end of the pool.
pub(crate) const FLAG_PADDING: u8 = 2;

/// Flag: the item is the stub of a large value (see `large`): its 8-byte
/// inline value names the value's slot in the partition's large table.
pub(crate) const FLAG_LARGE: u8 = 4;

/// Flag: the item carries [`ITEM_META_BYTES`] of [`ItemMeta`] after its
/// padded key and value. Not a state: live items may have it.
pub(crate) const FLAG_META: u8 = 8;

/// What a memcached client stores beside a value: the item's CAS value
/// (unique per write, given by the caller) and its opaque client flags.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ItemMeta {
    /// The compare-and-swap value of this version of the item.
    pub cas: u64,
    /// The client's 32-bit flags, returned as stored.
    pub client_flags: u32,
}

const _: () = assert!(ITEM_ALIGN_BYTES.is_power_of_two());
const _: () = assert!(align_down(ITEM_HEADER_BYTES) == ITEM_HEADER_BYTES);
const _: () = assert!(FLAGS_AT < ITEM_HEADER_BYTES);
const _: () = assert!(align_down(ITEM_META_BYTES) == ITEM_META_BYTES);
const _: () = assert!(
    KEY_BYTES_MAX <= u8::MAX as usize,
    "key length is kept in one byte"
);
const _: () = assert!(
    VALUE_BYTES_MAX <= u32::MAX as usize,
    "value length is kept in four bytes"
);

/// Rounds `n` up to a multiple of [`ITEM_ALIGN_BYTES`].
#[inline]
pub(crate) const fn align_up(n: usize) -> usize {
    (n + ITEM_ALIGN_BYTES - 1) & !(ITEM_ALIGN_BYTES - 1)
}

/// Rounds `n` down to a multiple of [`ITEM_ALIGN_BYTES`].
#[inline]
pub(crate) const fn align_down(n: usize) -> usize {
    n & !(ITEM_ALIGN_BYTES - 1)
}

/// Bytes one item with this key and value takes in the pool, header and
/// alignment included.
#[inline]
pub const fn item_bytes(key_len: usize, value_len: usize) -> usize {
    align_up(ITEM_HEADER_BYTES + key_len + value_len)
}

/// Bytes one item with this key and value takes in the pool when it
/// carries an [`ItemMeta`] (`meta`) or not.
#[inline]
pub const fn item_bytes_with(key_len: usize, value_len: usize, meta: bool) -> usize {
    item_bytes(key_len, value_len) + if meta { ITEM_META_BYTES } else { 0 }
}

/// Whether an item with this expiry time is expired at `now_ms`.
#[inline]
pub fn is_expired(expire_at_ms: u64, now_ms: u64) -> bool {
    expire_at_ms != 0 && expire_at_ms <= now_ms
}

/// A decoded item header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Header {
    /// The key hash the item was stored under.
    pub hash: u64,
    /// Absolute expiry time in milliseconds; 0 means none.
    pub expire_at_ms: u64,
    /// Value length in bytes.
    pub value_len: u32,
    /// Key length in bytes.
    pub key_len: u8,
    /// `FLAG_*` bits.
    pub flags: u8,
}

impl Header {
    /// Live key and value bytes of the item, as counted in `stats.bytes`.
    #[inline]
    pub fn kv_bytes(&self) -> u64 {
        u64::from(self.key_len) + u64::from(self.value_len)
    }

    /// Bytes the item occupies in the pool.
    #[inline]
    pub fn item_bytes(&self) -> usize {
        item_bytes_with(
            usize::from(self.key_len),
            self.value_len as usize,
            self.flags & FLAG_META != 0,
        )
    }

    /// Whether these flags mark a live item (not dead, not padding).
    #[cfg(test)]
    pub fn is_live_record(&self) -> bool {
        self.flags & !(FLAG_META | FLAG_LARGE) == 0
    }

    /// Whether the item is the stub of a large value.
    #[inline]
    pub fn is_large(&self) -> bool {
        self.flags & FLAG_LARGE != 0
    }

    /// Whether the item is expired at `now_ms`.
    #[inline]
    pub fn is_expired(&self, now_ms: u64) -> bool {
        is_expired(self.expire_at_ms, now_ms)
    }
}

/// Reads a little-endian u64 at `pos`.
#[inline]
pub(crate) fn read_u64(pool: &[u8], pos: usize) -> u64 {
    let mut b = [0u8; 8];
    b.copy_from_slice(&pool[pos..pos + 8]);
    u64::from_le_bytes(b)
}

/// Writes a little-endian u64 at `pos`.
#[inline]
pub(crate) fn write_u64(pool: &mut [u8], pos: usize, v: u64) {
    pool[pos..pos + 8].copy_from_slice(&v.to_le_bytes());
}

/// Decodes the header of the item at `pos`.
#[inline]
pub(crate) fn read_header(pool: &[u8], pos: usize) -> Header {
    let h = &pool[pos..pos + ITEM_HEADER_BYTES];
    let mut len = [0u8; 4];
    len.copy_from_slice(&h[VALUE_LEN_AT..VALUE_LEN_AT + 4]);
    Header {
        hash: read_u64(h, HASH_AT),
        expire_at_ms: read_u64(h, EXPIRE_AT),
        value_len: u32::from_le_bytes(len),
        key_len: h[KEY_LEN_AT],
        flags: h[FLAGS_AT],
    }
}

/// Writes a whole item at `pos`. The caller has checked that the lengths
/// are within bounds and that `item_bytes(key, value)` bytes are reserved.
pub(crate) fn write(
    pool: &mut [u8],
    pos: usize,
    hash: u64,
    key: &[u8],
    value: &[u8],
    expire_at_ms: u64,
    meta: Option<ItemMeta>,
) {
    debug_assert!(key.len() <= KEY_BYTES_MAX && value.len() <= VALUE_BYTES_MAX);
    let h = &mut pool[pos..pos + ITEM_HEADER_BYTES];
    write_u64(h, HASH_AT, hash);
    write_u64(h, EXPIRE_AT, expire_at_ms);
    h[VALUE_LEN_AT..VALUE_LEN_AT + 4].copy_from_slice(&(value.len() as u32).to_le_bytes());
    h[KEY_LEN_AT] = key.len() as u8;
    h[FLAGS_AT] = if meta.is_some() { FLAG_META } else { 0 };
    h[FLAGS_AT + 1..].fill(0);
    let key_at = pos + ITEM_HEADER_BYTES;
    let value_at = key_at + key.len();
    pool[key_at..value_at].copy_from_slice(key);
    pool[value_at..value_at + value.len()].copy_from_slice(value);
    if let Some(m) = meta {
        let at = pos + item_bytes(key.len(), value.len());
        write_u64(pool, at, m.cas);
        pool[at + 8..at + 12].copy_from_slice(&m.client_flags.to_le_bytes());
        pool[at + 12..at + ITEM_META_BYTES].fill(0);
    }
}

/// The meta of the item at `pos`, if it carries one.
#[inline]
pub(crate) fn meta(pool: &[u8], pos: usize, h: &Header) -> Option<ItemMeta> {
    if h.flags & FLAG_META == 0 {
        return None;
    }
    let at = pos + item_bytes(usize::from(h.key_len), h.value_len as usize);
    let mut f = [0u8; 4];
    f.copy_from_slice(&pool[at + 8..at + 12]);
    Some(ItemMeta {
        cas: read_u64(pool, at),
        client_flags: u32::from_le_bytes(f),
    })
}

/// Writes a padding record at `pos` (the caller has checked that a whole
/// header fits before the end of the pool).
pub(crate) fn write_padding(pool: &mut [u8], pos: usize) {
    let h = &mut pool[pos..pos + ITEM_HEADER_BYTES];
    h.fill(0);
    h[FLAGS_AT] = FLAG_PADDING;
}

/// The key of the item at `pos`.
#[inline]
pub(crate) fn key<'a>(pool: &'a [u8], pos: usize, h: &Header) -> &'a [u8] {
    let at = pos + ITEM_HEADER_BYTES;
    &pool[at..at + usize::from(h.key_len)]
}

/// The value of the item at `pos`.
#[inline]
pub(crate) fn value<'a>(pool: &'a [u8], pos: usize, h: &Header) -> &'a [u8] {
    let at = pos + ITEM_HEADER_BYTES + usize::from(h.key_len);
    &pool[at..at + h.value_len as usize]
}

/// Rewrites the expiry time of the item at `pos`.
#[inline]
pub(crate) fn set_expire(pool: &mut [u8], pos: usize, expire_at_ms: u64) {
    write_u64(pool, pos + EXPIRE_AT, expire_at_ms);
}

/// Sets flag bits on the item at `pos`.
#[inline]
pub(crate) fn add_flags(pool: &mut [u8], pos: usize, flags: u8) {
    pool[pos + FLAGS_AT] |= flags;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn item_round_trips() {
        let mut pool = vec![0u8; 256];
        write(&mut pool, 8, 0xdead_beef, b"key", b"value!", 77, None);
        let h = read_header(&pool, 8);
        assert_eq!(h.hash, 0xdead_beef);
        assert_eq!(h.expire_at_ms, 77);
        assert_eq!(h.flags, 0);
        assert_eq!(key(&pool, 8, &h), b"key");
        assert_eq!(value(&pool, 8, &h), b"value!");
        assert_eq!(h.kv_bytes(), 9);
        assert_eq!(h.item_bytes(), 40);
        set_expire(&mut pool, 8, 5);
        add_flags(&mut pool, 8, FLAG_DEAD);
        let h = read_header(&pool, 8);
        assert_eq!((h.expire_at_ms, h.flags), (5, FLAG_DEAD));
        assert_eq!(value(&pool, 8, &h), b"value!");
    }

    #[test]
    fn meta_round_trips_after_the_value() {
        let mut pool = vec![0xffu8; 256];
        let m = ItemMeta {
            cas: 0x0102_0304_0506_0708,
            client_flags: 0xdead_beef,
        };
        write(&mut pool, 8, 1, b"key", b"value!", 0, Some(m));
        let h = read_header(&pool, 8);
        assert_eq!(h.flags, FLAG_META);
        assert!(h.is_live_record());
        assert_eq!(h.item_bytes(), 40 + ITEM_META_BYTES);
        assert_eq!(value(&pool, 8, &h), b"value!");
        assert_eq!(meta(&pool, 8, &h), Some(m));
        write(&mut pool, 8, 1, b"key", b"value!", 0, None);
        let h = read_header(&pool, 8);
        assert_eq!((h.flags, h.item_bytes()), (0, 40));
        assert_eq!(meta(&pool, 8, &h), None);
    }

    #[test]
    fn sizes_are_aligned() {
        assert_eq!(item_bytes(0, 0), ITEM_HEADER_BYTES);
        assert_eq!(item_bytes(1, 0), 32);
        assert_eq!(item_bytes(8, 0), 32);
        assert_eq!(item_bytes(8, 1), 40);
        assert_eq!(ITEM_BYTES_MAX % ITEM_ALIGN_BYTES, 0);
    }

    #[test]
    fn expiry_rule() {
        assert!(!is_expired(0, u64::MAX));
        assert!(!is_expired(10, 9));
        assert!(is_expired(10, 10));
        assert!(is_expired(10, 11));
    }
}
