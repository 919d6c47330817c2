//! The core shared by both modes: an index, value storage and counters.
//!
//! [`Core`] is generic over its [`Storage`] (the cache-mode circular log or
//! the store-mode slab allocator), so lookups, deletes, TTL handling and the
//! sweep are written once and compiled once per mode, with no dynamic
//! dispatch on the hot path.

use fabrickv_types::KeyHash;

use crate::index::{
    offset_of, slot_tag, tag_of, Index, SlotRef, Summary, ITEM_SLOTS_PER_BUCKET, SLOT_TAG_HASH_BITS,
};
use crate::item::{self, Header};
use crate::large::{self, LargeTable, ValueRef};
use crate::stats::PartitionStats;
use crate::watch::Versions;

/// Where items live: maps index offsets to pool positions and takes back
/// the space of items that leave the index.
pub(crate) trait Storage {
    /// The whole pool.
    fn pool(&self) -> &[u8];
    /// The whole pool, writable.
    fn pool_mut(&mut self) -> &mut [u8];
    /// The pool position of the item a slot's 48-bit offset names, or
    /// `None` if that offset no longer names a live record.
    fn resolve(&self, offset: u64) -> Option<usize>;
    /// Takes back the item at `pos`, which the index no longer references.
    fn release(&mut self, pos: usize);
    /// Largest item this storage can hold, in bytes.
    fn max_item_bytes(&self) -> usize;
}

/// An indexed item found by a lookup.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Hit {
    /// The index slot that references the item.
    pub at: SlotRef,
    /// The item's position in the pool.
    pub pos: usize,
    /// The item's header, as read during the lookup.
    pub header: Header,
}

/// One partition of one mode.
pub(crate) struct Core<S> {
    /// The hash index.
    pub index: Index,
    /// Value storage (log or slabs).
    pub storage: S,
    /// Counters; `pool_bytes` is fixed at start-up.
    pub stats: PartitionStats,
    /// Next main bucket the background sweep visits.
    pub sweep_cursor: usize,
    /// Modification counters by key hash (WATCH); every change bumps one.
    pub versions: Versions,
    /// The large values the index's stub items name.
    pub large: LargeTable,
    /// Whether index entries are tagged with their key's cluster slot
    /// ([`crate::index::slot_tag`]) instead of the hash's low bits, so
    /// that a walk for some slots' keys skips the others without reading
    /// their items. Store mode only.
    pub slot_tags: bool,
}

impl<S: Storage> Core<S> {
    /// An empty partition.
    pub fn new(index: Index, storage: S, pool_bytes: usize) -> Core<S> {
        Core {
            index,
            storage,
            stats: PartitionStats {
                pool_bytes: pool_bytes as u64,
                ..PartitionStats::default()
            },
            sweep_cursor: 0,
            versions: Versions::new(),
            large: LargeTable::new(pool_bytes as u64),
            slot_tags: false,
        }
    }

    /// The tag this key's index entry carries.
    #[inline]
    pub fn tag_for(&self, hash: KeyHash, key: &[u8]) -> u16 {
        if self.slot_tags {
            slot_tag(fabrickv_types::slot::key_slot(key), hash)
        } else {
            hash.tag()
        }
    }

    /// Which bits of a tag a prefetch that knows only the hash can match,
    /// and what they must be: all of [`KeyHash::tag`], or a slot tag's
    /// hash bits (a prefetch of a quarter of the bucket's items, about,
    /// rather than of none).
    #[inline]
    fn hash_tag_bits(&self, hash: KeyHash) -> (u16, u16) {
        if self.slot_tags {
            let mask = (1 << SLOT_TAG_HASH_BITS) - 1;
            (mask, hash.0 as u16 & mask)
        } else {
            (u16::MAX, hash.tag())
        }
    }

    /// The value of the item at `pos` with this header: inline in the
    /// pool, or the large value its stub names.
    #[inline]
    pub fn value_of(&self, pos: usize, header: &Header) -> ValueRef<'_> {
        let inline = item::value(self.storage.pool(), pos, header);
        if header.is_large() {
            if let Some(v) = self.large.get(large::slot_of(inline)) {
                return ValueRef::Large(v);
            }
            debug_assert!(false, "stub names an empty large slot");
            return ValueRef::Inline(&[]);
        }
        ValueRef::Inline(inline)
    }

    /// Key plus value bytes of the item at `pos` (the large value's length
    /// for a stub), as `stats.bytes` counts them.
    #[inline]
    pub fn counted_bytes(&self, pos: usize, header: &Header) -> u64 {
        if header.is_large() {
            let inline = item::value(self.storage.pool(), pos, header);
            u64::from(header.key_len) + self.large.len_of(large::slot_of(inline))
        } else {
            header.kv_bytes()
        }
    }

    /// Takes an item that leaves the index out of `bytes` and `items`,
    /// dropping its large value if it has one. Its storage is the
    /// caller's to give back.
    pub fn uncount(&mut self, pos: usize, header: &Header) {
        self.stats.items -= 1;
        self.drop_value(pos, header);
    }

    /// Takes the value of the item at `pos` out of `bytes` (its key too)
    /// and drops its large value if it has one; the item stays counted.
    pub fn drop_value(&mut self, pos: usize, header: &Header) {
        self.stats.bytes -= self.counted_bytes(pos, header);
        if header.is_large() {
            let inline = item::value(self.storage.pool(), pos, header);
            let slot = large::slot_of(inline);
            self.large.remove(slot);
        }
    }

    /// Finds the indexed item with this key, expired or not.
    #[inline]
    pub fn find(&self, hash: KeyHash, key: &[u8]) -> Option<Hit> {
        let tag = self.tag_for(hash, key);
        let pool = self.storage.pool();
        let mut bucket = Some(self.index.main_bucket(hash));
        while let Some(b) = bucket {
            for slot in 0..ITEM_SLOTS_PER_BUCKET {
                let at = SlotRef { bucket: b, slot };
                let e = self.index.entry(at);
                if e == 0 || tag_of(e) != tag {
                    continue;
                }
                let Some(pos) = self.storage.resolve(offset_of(e)) else {
                    debug_assert!(false, "index slot names a dead record");
                    continue;
                };
                let header = item::read_header(pool, pos);
                if item::key(pool, pos, &header) == key {
                    return Some(Hit { at, pos, header });
                }
            }
            bucket = self.index.next(b);
        }
        None
    }

    /// The second stage of a batch prefetch: with the bucket of `hash`
    /// already loaded (by [`Index::prefetch`]), starts loading the item
    /// header of every slot whose tag matches, so the key comparison that
    /// follows finds it in cache. Reads only the index; never faults.
    #[inline]
    pub fn prefetch_item(&self, hash: KeyHash) {
        self.prefetch_item_span(hash, 1);
    }

    /// [`Core::prefetch_item`] for `span` bytes from the item's start
    /// (header, key, value): where every value has one known size (an
    /// embedding table), the value's lines load in the same round as its
    /// header instead of one dependent round later.
    #[inline]
    pub fn prefetch_item_span(&self, hash: KeyHash, span: usize) {
        let (mask, want) = self.hash_tag_bits(hash);
        let pool = self.storage.pool();
        let b = self.index.main_bucket(hash);
        for slot in 0..ITEM_SLOTS_PER_BUCKET {
            let e = self.index.entry(SlotRef { bucket: b, slot });
            if e == 0 || tag_of(e) & mask != want {
                continue;
            }
            if let Some(pos) = self.storage.resolve(offset_of(e)) {
                let end = pool.len().min(pos.saturating_add(span.max(1)));
                if let Some(bytes) = pool.get(pos..end) {
                    crate::prefetch_bytes(bytes);
                }
            }
        }
    }

    /// Finds the item with this key if it is live at `now_ms`; an expired
    /// one met on the way is reclaimed.
    #[inline]
    pub fn find_live(&mut self, hash: KeyHash, key: &[u8], now_ms: u64) -> Option<Hit> {
        let hit = self.find(hash, key)?;
        if hit.header.is_expired(now_ms) {
            self.unlink(&hit);
            self.stats.expired += 1;
            return None;
        }
        Some(hit)
    }

    /// Removes an indexed item: clears its slot, gives its space back and
    /// updates `items` and `bytes`. The caller counts the cause.
    pub fn unlink(&mut self, hit: &Hit) {
        self.versions.bump(KeyHash(hit.header.hash));
        self.index
            .clear(hit.at, self.index.main_bucket(KeyHash(hit.header.hash)));
        self.uncount(hit.pos, &hit.header);
        self.storage.release(hit.pos);
    }

    /// Marks the chain of `hash` volatile when the item written there
    /// now expires (`expire_at_ms` not 0): the sweep visits only chains
    /// marked so.
    #[inline]
    pub fn note_expiry(&mut self, hash: KeyHash, expire_at_ms: u64) {
        if expire_at_ms != 0 {
            let main = self.index.main_bucket(hash);
            self.index.mark(Summary::Volatile, main);
        }
    }

    /// Whether an item of these lengths (with an [`item::ItemMeta`] when
    /// `meta`) fits this partition at all.
    #[inline]
    pub fn fits(&self, key_len: usize, value_len: usize, meta: bool) -> bool {
        key_len <= fabrickv_types::limits::KEY_BYTES_MAX
            && value_len <= fabrickv_types::limits::VALUE_BYTES_MAX
            && item::item_bytes_with(key_len, value_len, meta) <= self.storage.max_item_bytes()
    }

    /// Largest value that fits next to a maximal key.
    pub fn max_item_value_bytes(&self) -> usize {
        let max = self.storage.max_item_bytes();
        (max - item::ITEM_HEADER_BYTES - fabrickv_types::limits::KEY_BYTES_MAX)
            .min(fabrickv_types::limits::VALUE_BYTES_MAX)
    }

    /// Recounts items and live bytes from the index (tests compare this
    /// with the counters).
    #[cfg(test)]
    pub fn recount(&self) -> (u64, u64) {
        let pool = self.storage.pool();
        let mut items = 0;
        let mut bytes = 0;
        for (_, e) in self.index.all_entries() {
            let pos = self
                .storage
                .resolve(offset_of(e))
                .expect("indexed item is live");
            let h = item::read_header(pool, pos);
            assert!(h.is_live_record(), "indexed item is flagged");
            assert_eq!(
                self.tag_for(KeyHash(h.hash), item::key(pool, pos, &h)),
                tag_of(e),
                "slot tag matches item hash"
            );
            items += 1;
            bytes += self.counted_bytes(pos, &h);
        }
        for main in 0..self.index.main_count() {
            let mut held = 0;
            let mut ttl = false;
            for (_, e) in self.index.chain(main) {
                held += 1;
                let pos = self.storage.resolve(offset_of(e)).expect("live");
                ttl |= item::read_header(pool, pos).expire_at_ms != 0;
            }
            assert!(
                held == 0 || self.index.is_marked(Summary::Occupied, main),
                "a chain with an entry is marked occupied (main bucket {main})"
            );
            assert!(
                !ttl || self.index.is_marked(Summary::Volatile, main),
                "a chain with a TTL'd item is marked volatile (main bucket {main})"
            );
        }
        if items > 0 || self.large.count > 0 {
            let stubs = self
                .index
                .all_entries()
                .into_iter()
                .filter(|&(_, e)| {
                    let pos = self.storage.resolve(offset_of(e)).expect("live");
                    item::read_header(pool, pos).is_large()
                })
                .count();
            assert_eq!(stubs as u64, self.large.count, "one stub per large value");
        }
        (items, bytes)
    }
}
