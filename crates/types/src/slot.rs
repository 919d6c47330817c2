//! Where a key belongs in a cluster: its slot, placed as Redis Cluster
//! places keys, so that Redis cluster clients route by themselves. A
//! key's slot is CRC16 (XMODEM) of the key, or of its `{hash tag}` when it
//! has a non-empty one, modulo [`SLOTS`].
//!
//! It lives here, beside the key hash, because the engine uses it too: a
//! cluster server's partitions keep each key's slot in its index entry's
//! tag, so that a walk for the keys of some slots reads the index and not
//! every item (see `fabrickv_engine::Partition::use_slot_tags`).

/// Slots in the key space: Redis Cluster's count, which its clients assume.
pub const SLOTS: u16 = 16_384;

/// CRC16-CCITT (XMODEM: polynomial 0x1021, initial value 0, no
/// reflection), a byte at a time, computed once at compile time.
const CRC16_TABLE: [u16; 256] = {
    let mut table = [0u16; 256];
    let mut i = 0;
    while i < 256 {
        let mut crc = (i as u16) << 8;
        let mut bit = 0;
        while bit < 8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
            bit += 1;
        }
        table[i] = crc;
        i += 1;
    }
    table
};

/// CRC16 (XMODEM) of `data`, the checksum Redis Cluster places keys by.
#[inline]
pub fn crc16(data: &[u8]) -> u16 {
    data.iter().fold(0u16, |crc, &b| {
        (crc << 8) ^ CRC16_TABLE[usize::from((crc >> 8) as u8 ^ b)]
    })
}

/// The part of `key` that places it: the bytes between the first `{` and
/// the first `}` after it when there are any, else the whole key. Keys
/// that share a tag (`{user1}.name`, `{user1}.mail`) share a slot, so a
/// multi-key command over them is served by one server.
#[inline]
pub fn hash_tag(key: &[u8]) -> &[u8] {
    if let Some(open) = key.iter().position(|&b| b == b'{') {
        let rest = &key[open + 1..];
        if let Some(close) = rest.iter().position(|&b| b == b'}') {
            if close > 0 {
                return &rest[..close];
            }
        }
    }
    key
}

/// The slot of a byte-string key (kv, RESP, memcache and cache keys).
#[inline]
pub fn key_slot(key: &[u8]) -> u16 {
    crc16(hash_tag(key)) % SLOTS
}
