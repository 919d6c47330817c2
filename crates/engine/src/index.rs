//! The bucketized hash index (MICA's "lossy" and "lossless" index).
//!
//! The index is an array of power-of-two many buckets of one cache line
//! each. A bucket holds [`ITEM_SLOTS_PER_BUCKET`] slots, each a u64 packing a
//! 16-bit tag (never 0) and a 48-bit item offset, plus one link word. A
//! lookup touches one cache line to reject most non-matching keys by tag and
//! then reads only the items whose tag matches. A partition of a cluster
//! server may instead tag entries with the key's hash slot and two bits
//! of the hash ([`slot_tag`]), so that a walk for some slots' keys tells
//! them apart by the index alone.
//!
//! Cache mode never chains: when a bucket is full the caller replaces a slot
//! (the index is lossy). Store mode must never lose an entry, so a full
//! bucket links to an overflow bucket taken from a preallocated pool placed
//! after the main buckets; the link word holds the overflow bucket's index
//! (0 = none, which is never an overflow index because overflow buckets come
//! after at least one main bucket). Overflow buckets that become empty are
//! unlinked and returned to the pool, so a long-running store does not leak
//! them.
//!
//! Beside the buckets the index keeps two summaries of one bit per main
//! bucket, so that walks over the whole index (SCAN, KEYS, the TTL sweep)
//! skip what holds nothing for them with one word test per
//! [`SUMMARY_BUCKETS_PER_WORD`] buckets instead of one cache line per
//! bucket:
//! - `occupied`: the bucket's chain may hold an entry. Set when an entry
//!   enters an empty slot of a main bucket or the chain grows (a read of
//!   the word first, so a bit already set costs no write); cleared by the
//!   walks that find the chain empty (SCAN, KEYS, FLUSHDB), not by the
//!   delete that empties it: clearing it there cost DELETE 24% in the
//!   engine's `hot_path` test (1 Mi keys, the summary's line a miss each
//!   time), and a stale bit costs one bucket read, once, in a later walk.
//! - `volatile`: the chain may hold an item with an expiry time. Set by
//!   the engine when it writes such an item; cleared only by the sweep
//!   when it finds none there, so it may be stale in the safe direction.
//!
//! Together they cost 2 bits per 64-byte bucket (1/256 of the index).

use fabrickv_types::KeyHash;

/// Words in one bucket: one 64-byte cache line of u64s.
pub const SLOTS_PER_BUCKET: usize = 8;

/// Slots of a bucket that point at items; the last word is the link.
pub const ITEM_SLOTS_PER_BUCKET: usize = SLOTS_PER_BUCKET - 1;

/// Word of a bucket that holds the index of the next (overflow) bucket.
const LINK_SLOT: usize = SLOTS_PER_BUCKET - 1;

/// Size of one bucket in bytes: exactly one cache line.
pub const BUCKET_BYTES: usize = 64;

/// Bits of a slot that hold the item offset.
pub const OFFSET_BITS: u32 = 48;

/// Mask of the offset bits of a slot.
pub const OFFSET_MASK: u64 = (1 << OFFSET_BITS) - 1;

/// Fewest main buckets an index has, so that tiny pools still spread keys.
pub const INDEX_BUCKETS_MIN: usize = 16;

/// Most main buckets an index may have (16 GiB of index); bucket indices,
/// overflow included, must fit the u32 link arithmetic.
pub const INDEX_BUCKETS_MAX: usize = 1 << 28;

/// Item size assumed when deriving the bucket count from the pool size, in
/// bytes (MICA's sizing rule: small keys and values dominate).
pub const ASSUMED_ITEM_BYTES: usize = 64;

/// Store mode allocates one overflow bucket per this many main buckets.
pub const OVERFLOW_BUCKETS_DIVISOR: usize = 8;

/// Fewest overflow buckets in store mode, so small indexes can chain too.
pub const OVERFLOW_BUCKETS_MIN: usize = 4;

/// Main buckets one summary word covers (one bit each).
pub const SUMMARY_BUCKETS_PER_WORD: usize = 64;

/// Most bytes the two summaries of one index take: 2 bits per main
/// bucket, 64 MiB beside the 16 GiB of the largest index (1/256 of it),
/// allocated once with the index.
pub const SUMMARY_BYTES_MAX: usize = INDEX_BUCKETS_MAX / SUMMARY_BUCKETS_PER_WORD * 8 * 2;

const _: () = assert!(SUMMARY_BUCKETS_PER_WORD == u64::BITS as usize);
const _: () = assert!(SUMMARY_BYTES_MAX * 256 == INDEX_BUCKETS_MAX * BUCKET_BYTES);

/// One bucket: a cache line of slots.
#[derive(Debug, Clone, Copy)]
#[repr(C, align(64))]
pub(crate) struct Bucket {
    /// Item slots (tag << 48 | offset, 0 = empty) and the link word.
    slots: [u64; SLOTS_PER_BUCKET],
}

const _: () = assert!(std::mem::size_of::<Bucket>() == BUCKET_BYTES);
const _: () = assert!(std::mem::align_of::<Bucket>() == BUCKET_BYTES);
const _: () = assert!(SLOTS_PER_BUCKET * 8 == BUCKET_BYTES);
const _: () = assert!(
    OFFSET_BITS + 16 == 64,
    "a slot is a 16-bit tag and an offset"
);
const _: () = assert!(INDEX_BUCKETS_MIN.is_power_of_two() && INDEX_BUCKETS_MAX.is_power_of_two());
const _: () = assert!(
    INDEX_BUCKETS_MAX + INDEX_BUCKETS_MAX / OVERFLOW_BUCKETS_DIVISOR + OVERFLOW_BUCKETS_MIN
        <= u32::MAX as usize
);

/// Where a slot is: (bucket index, slot index within the bucket).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SlotRef {
    /// Bucket index, main or overflow.
    pub bucket: usize,
    /// Slot within the bucket, below [`ITEM_SLOTS_PER_BUCKET`].
    pub slot: usize,
}

/// Packs a tag and an offset into a slot word.
#[inline]
pub(crate) fn pack(tag: u16, offset: u64) -> u64 {
    debug_assert!(tag != 0);
    (u64::from(tag) << OFFSET_BITS) | (offset & OFFSET_MASK)
}

/// The tag of a slot word.
#[inline]
pub(crate) fn tag_of(entry: u64) -> u16 {
    (entry >> OFFSET_BITS) as u16
}

/// The offset of a slot word.
#[inline]
pub(crate) fn offset_of(entry: u64) -> u64 {
    entry & OFFSET_MASK
}

/// Bits of a slot tag taken from the key hash, below the key's cluster
/// slot: keys of one slot still differ in their tags, so a lookup in a
/// bucket holding several of them reads about a quarter of those items,
/// not all.
pub const SLOT_TAG_HASH_BITS: u32 = 2;

const _: () = assert!(
    (fabrickv_types::slot::SLOTS as u32) << SLOT_TAG_HASH_BITS == 1 << 16,
    "a slot tag is a whole slot and the hash bits, in 16 bits"
);

/// The tag of a key in a partition that keeps slot tags: its cluster slot
/// above [`SLOT_TAG_HASH_BITS`] bits of its hash; never zero (slot 0 with
/// hash bits 0 takes 1, which still names slot 0).
#[inline]
pub(crate) fn slot_tag(slot: u16, hash: KeyHash) -> u16 {
    let low = (hash.0 as u16) & ((1 << SLOT_TAG_HASH_BITS) - 1);
    ((slot << SLOT_TAG_HASH_BITS) | low).max(1)
}

/// The cluster slot a slot tag names.
#[inline]
pub(crate) fn slot_of_tag(tag: u16) -> u16 {
    tag >> SLOT_TAG_HASH_BITS
}

/// Bucket count derived from the pool size: one slot per assumed item,
/// [`ITEM_SLOTS_PER_BUCKET`] per bucket, rounded up to a power of two.
pub fn default_index_buckets(pool_bytes: usize) -> usize {
    (pool_bytes / (ASSUMED_ITEM_BYTES * ITEM_SLOTS_PER_BUCKET))
        .max(1)
        .next_power_of_two()
        .clamp(INDEX_BUCKETS_MIN, INDEX_BUCKETS_MAX)
}

/// The index: main buckets followed by the overflow pool.
pub(crate) struct Index {
    /// Main buckets, then overflow buckets; allocated once at start-up.
    buckets: Vec<Bucket>,
    /// Number of main buckets (a power of two).
    main_count: usize,
    /// `main_count - 1`, applied to the hash's bucket bits.
    mask: u64,
    /// Head of the free overflow bucket list, chained through link words;
    /// 0 = empty.
    free_overflow: usize,
    /// Overflow buckets currently on the free list.
    free_overflow_count: usize,
    /// One bit per main bucket: its chain holds an entry (see the module
    /// header).
    occupied: Vec<u64>,
    /// One bit per main bucket: its chain may hold an item with an expiry
    /// time (see the module header).
    volatile: Vec<u64>,
}

/// Which summary of the index a walk follows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Summary {
    /// Main buckets whose chain holds an entry.
    Occupied,
    /// Main buckets whose chain may hold an item with an expiry time.
    Volatile,
}

/// Where a walk over a summary got to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Marked {
    /// This main bucket (at or after the start) has its bit set.
    At(usize),
    /// No bit is set from the start to the end of the index.
    End,
    /// The word budget ran out; no bit is set from the start up to this
    /// main bucket.
    Later(usize),
}

impl Index {
    /// An empty index with `main_count` main buckets (a power of two) and
    /// `overflow_count` overflow buckets.
    pub fn new(main_count: usize, overflow_count: usize) -> Index {
        assert!(main_count.is_power_of_two() && main_count <= INDEX_BUCKETS_MAX);
        let empty = Bucket {
            slots: [0; SLOTS_PER_BUCKET],
        };
        let total = main_count + overflow_count;
        let mut buckets: Vec<Bucket> = Vec::with_capacity(total);
        // Before the first write faults a page in: buckets are read at
        // random, one per lookup, and on 4 KiB pages nearly every lookup of
        // a large index would miss the TLB as well as the cache.
        advise_huge_pages(
            buckets.as_mut_ptr().cast::<u8>(),
            total * std::mem::size_of::<Bucket>(),
        );
        buckets.resize(total, empty);
        // Chain every overflow bucket onto the free list.
        let mut free_overflow = 0;
        for b in (main_count..main_count + overflow_count).rev() {
            buckets[b].slots[LINK_SLOT] = free_overflow as u64;
            free_overflow = b;
        }
        let words = main_count.div_ceil(SUMMARY_BUCKETS_PER_WORD);
        Index {
            buckets,
            main_count,
            mask: (main_count - 1) as u64,
            free_overflow,
            free_overflow_count: overflow_count,
            occupied: vec![0; words],
            volatile: vec![0; words],
        }
    }

    /// Number of main buckets.
    #[inline]
    pub fn main_count(&self) -> usize {
        self.main_count
    }

    /// The main bucket of a hash.
    #[inline]
    pub fn main_bucket(&self, hash: KeyHash) -> usize {
        (hash.bucket_bits() & self.mask) as usize
    }

    /// Asks the CPU to start loading the main bucket of `hash`, so that a
    /// batch can overlap its cache misses (MICA's prefetch pass).
    #[inline]
    pub fn prefetch(&self, hash: KeyHash) {
        let bucket = &self.buckets[self.main_bucket(hash)];
        prefetch_line(bucket as *const Bucket as *const i8);
    }

    /// Starts loading main bucket `main`'s line, without waiting.
    #[inline]
    pub fn prefetch_main(&self, main: usize) {
        if let Some(bucket) = self.buckets.get(main) {
            prefetch_line(bucket as *const Bucket as *const i8);
        }
    }

    /// The slot word at `at`.
    #[inline]
    pub fn entry(&self, at: SlotRef) -> u64 {
        self.buckets[at.bucket].slots[at.slot]
    }

    /// Overwrites the slot word at `at` with an entry (never 0: a slot is
    /// emptied with [`Index::clear`]). An entry that fills an empty slot
    /// of a main bucket marks the bucket occupied; overflow buckets are
    /// filled only through [`Index::insert`], which marks their main
    /// bucket. Overwriting an entry leaves the summary alone, so a
    /// rewrite in place touches no line but the bucket's.
    #[inline]
    pub fn set(&mut self, at: SlotRef, entry: u64) {
        debug_assert!(at.slot < ITEM_SLOTS_PER_BUCKET);
        debug_assert!(entry != 0, "a slot is emptied with clear");
        let slot = &mut self.buckets[at.bucket].slots[at.slot];
        let was_empty = *slot == 0;
        *slot = entry;
        if was_empty && at.bucket < self.main_count {
            self.mark(Summary::Occupied, at.bucket);
        }
    }

    /// Empties the slot at `at` of the chain of main bucket `main` and
    /// returns the overflow buckets left empty to the pool. Both summary
    /// bits stay (see the module header): the walks clear them.
    #[inline]
    pub fn clear(&mut self, at: SlotRef, main: usize) {
        debug_assert!(at.slot < ITEM_SLOTS_PER_BUCKET);
        self.buckets[at.bucket].slots[at.slot] = 0;
        self.compact(main);
    }

    /// Clears `main`'s bit in the occupied summary (a walk found its chain
    /// empty).
    #[inline]
    pub fn unmark_occupied(&mut self, main: usize) {
        let (w, bit) = summary_bit(main);
        self.occupied[w] &= !bit;
    }

    /// Sets `main`'s bit in `summary`.
    #[inline]
    pub fn mark(&mut self, summary: Summary, main: usize) {
        let (w, bit) = summary_bit(main);
        let words = match summary {
            Summary::Occupied => &mut self.occupied,
            Summary::Volatile => &mut self.volatile,
        };
        // Reads before writing: a bit already set leaves the line clean.
        if words[w] & bit == 0 {
            words[w] |= bit;
        }
    }

    /// Clears `main`'s bit in the volatile summary (the sweep found no
    /// item with an expiry time left in its chain).
    #[inline]
    pub fn unmark_volatile(&mut self, main: usize) {
        let (w, bit) = summary_bit(main);
        self.volatile[w] &= !bit;
    }

    /// Whether `main`'s bit is set in `summary` (tests check the
    /// summaries against the chains).
    #[cfg(test)]
    pub fn is_marked(&self, summary: Summary, main: usize) -> bool {
        let (w, bit) = summary_bit(main);
        let words = match summary {
            Summary::Occupied => &self.occupied,
            Summary::Volatile => &self.volatile,
        };
        words[w] & bit != 0
    }

    /// The first main bucket at or after `from` marked in `summary`.
    /// Each summary word tested takes one from `words_left`; when none is
    /// left before a mark is found the walk stops with [`Marked::Later`],
    /// naming where to resume.
    pub fn next_marked(&self, summary: Summary, from: usize, words_left: &mut usize) -> Marked {
        if from >= self.main_count {
            return Marked::End;
        }
        let words = match summary {
            Summary::Occupied => &self.occupied,
            Summary::Volatile => &self.volatile,
        };
        let mut w = from / SUMMARY_BUCKETS_PER_WORD;
        // Bits below `from` in its word are not asked about.
        let mut bits = words[w] & (!0u64 << (from % SUMMARY_BUCKETS_PER_WORD));
        loop {
            if *words_left == 0 {
                return Marked::Later((w * SUMMARY_BUCKETS_PER_WORD).max(from));
            }
            *words_left -= 1;
            if bits != 0 {
                let b = w * SUMMARY_BUCKETS_PER_WORD + bits.trailing_zeros() as usize;
                // The last word's bits past main_count are never set.
                debug_assert!(b < self.main_count);
                return Marked::At(b);
            }
            w += 1;
            if w >= words.len() {
                return Marked::End;
            }
            bits = words[w];
        }
    }

    /// The bucket chained after `bucket`, if any.
    #[inline]
    pub fn next(&self, bucket: usize) -> Option<usize> {
        match self.buckets[bucket].slots[LINK_SLOT] {
            0 => None,
            b => Some(b as usize),
        }
    }

    /// The occupied slots of the chain of main bucket `main`, in order,
    /// with their entries. For the walks that visit every item of a
    /// chain (SCAN, FLUSHDB, the sweep, `check`); a lookup stops at its
    /// tag instead.
    #[inline]
    pub fn chain(&self, main: usize) -> Chain<'_> {
        Chain {
            index: self,
            bucket: Some(main),
            slot: 0,
        }
    }

    /// The first empty slot in the chain starting at main bucket `main`.
    pub fn find_empty(&self, main: usize) -> Option<SlotRef> {
        let mut bucket = Some(main);
        while let Some(b) = bucket {
            if let Some(slot) = self.buckets[b].slots[..ITEM_SLOTS_PER_BUCKET]
                .iter()
                .position(|&e| e == 0)
            {
                return Some(SlotRef { bucket: b, slot });
            }
            bucket = self.next(b);
        }
        None
    }

    /// The slot in the chain of `main` whose entry has this tag and offset.
    pub fn find_entry(&self, main: usize, entry: u64) -> Option<SlotRef> {
        let mut bucket = Some(main);
        while let Some(b) = bucket {
            if let Some(slot) = self.buckets[b].slots[..ITEM_SLOTS_PER_BUCKET]
                .iter()
                .position(|&e| e == entry)
            {
                return Some(SlotRef { bucket: b, slot });
            }
            bucket = self.next(b);
        }
        None
    }

    /// Whether [`Index::insert`] into the chain of `main` would succeed.
    pub fn can_insert(&self, main: usize) -> bool {
        self.free_overflow_count > 0 || self.find_empty(main).is_some()
    }

    /// Stores `entry` in an empty slot of the chain of `main`, linking an
    /// overflow bucket if the chain is full. Returns `None`, changing
    /// nothing, when the chain is full and the overflow pool is empty.
    pub fn insert(&mut self, main: usize, entry: u64) -> Option<SlotRef> {
        debug_assert!(entry != 0);
        if let Some(at) = self.find_empty(main) {
            self.set(at, entry);
            return Some(at);
        }
        if self.free_overflow == 0 {
            return None;
        }
        let fresh = self.free_overflow;
        self.free_overflow = self.buckets[fresh].slots[LINK_SLOT] as usize;
        self.free_overflow_count -= 1;
        self.buckets[fresh].slots = [0; SLOTS_PER_BUCKET];
        let mut last = main;
        while let Some(b) = self.next(last) {
            last = b;
        }
        self.buckets[last].slots[LINK_SLOT] = fresh as u64;
        let at = SlotRef {
            bucket: fresh,
            slot: 0,
        };
        self.buckets[fresh].slots[0] = entry;
        self.mark(Summary::Occupied, main);
        Some(at)
    }

    /// Unlinks every empty overflow bucket from the chain of `main` and
    /// returns it to the overflow pool.
    fn compact(&mut self, main: usize) {
        let mut prev = main;
        while let Some(cur) = self.next(prev) {
            let slots = &self.buckets[cur].slots;
            if slots[..ITEM_SLOTS_PER_BUCKET].iter().all(|&e| e == 0) {
                let after = slots[LINK_SLOT];
                self.buckets[prev].slots[LINK_SLOT] = after;
                self.buckets[cur].slots[LINK_SLOT] = self.free_overflow as u64;
                self.free_overflow = cur;
                self.free_overflow_count += 1;
            } else {
                prev = cur;
            }
        }
    }

    /// Every non-empty item slot of every bucket reachable from a main
    /// bucket; used by tests to recount.
    #[cfg(test)]
    pub fn all_entries(&self) -> Vec<(SlotRef, u64)> {
        (0..self.main_count)
            .flat_map(|main| self.chain(main))
            .collect()
    }

    /// Overflow buckets on the free list (tests check none leak).
    #[cfg(test)]
    pub fn free_overflow_count(&self) -> usize {
        self.free_overflow_count
    }
}

/// The summary word of main bucket `main` and its bit there.
#[inline]
fn summary_bit(main: usize) -> (usize, u64) {
    (
        main / SUMMARY_BUCKETS_PER_WORD,
        1 << (main % SUMMARY_BUCKETS_PER_WORD),
    )
}

/// Asks for transparent huge pages over the whole 2 MiB pages inside
/// `len` bytes at `p` (the kernel's `madvise` THP mode backs only what was
/// asked for). Advice only: failure, or a kernel without THP, changes
/// nothing but speed, so the result is ignored.
pub(crate) fn advise_huge_pages(p: *mut u8, len: usize) {
    const HUGE_PAGE_BYTES: usize = 1 << crate::HUGE_PAGE_SHIFT;
    let start = (p as usize).next_multiple_of(HUGE_PAGE_BYTES);
    let end = (p as usize + len) & !(HUGE_PAGE_BYTES - 1);
    if end <= start {
        return;
    }
    #[cfg(target_os = "linux")]
    #[allow(unsafe_code)]
    // SAFETY: [start, end) lies inside one live allocation of the caller;
    // MADV_HUGEPAGE changes how pages are backed, never their contents or
    // mapping, so no Rust reference into the range is invalidated.
    unsafe {
        libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_HUGEPAGE);
    }
}

/// Prefetches the cache line at `p` into all cache levels. Only the address
/// is used; nothing is read through the pointer.
#[inline(always)]
pub(crate) fn prefetch_line(p: *const i8) {
    #[cfg(target_arch = "x86_64")]
    #[allow(unsafe_code)]
    // SAFETY: SSE is part of the x86_64 baseline, so the instruction exists;
    // PREFETCHT0 is a hint that never faults and reads nothing the program
    // can observe, whatever the address.
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(p);
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = p;
    }
}

/// The occupied slots of one chain ([`Index::chain`]).
pub(crate) struct Chain<'a> {
    /// The index walked.
    index: &'a Index,
    /// The bucket being read; `None` past the chain's end.
    bucket: Option<usize>,
    /// The next slot of `bucket` to read.
    slot: usize,
}

impl Iterator for Chain<'_> {
    type Item = (SlotRef, u64);

    #[inline]
    fn next(&mut self) -> Option<(SlotRef, u64)> {
        loop {
            let bucket = self.bucket?;
            if self.slot == ITEM_SLOTS_PER_BUCKET {
                self.bucket = self.index.next(bucket);
                self.slot = 0;
                continue;
            }
            let at = SlotRef {
                bucket,
                slot: self.slot,
            };
            self.slot += 1;
            let e = self.index.entry(at);
            if e != 0 {
                return Some((at, e));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pack_round_trips() {
        let e = pack(0xabcd, 0x1234_5678_9abc);
        assert_eq!(tag_of(e), 0xabcd);
        assert_eq!(offset_of(e), 0x1234_5678_9abc);
        assert_ne!(pack(1, 0), 0);
    }

    #[test]
    fn default_bucket_count() {
        assert_eq!(default_index_buckets(0), INDEX_BUCKETS_MIN);
        assert_eq!(default_index_buckets(64 << 20), 1 << 18);
        assert!(default_index_buckets(usize::MAX / 2) <= INDEX_BUCKETS_MAX);
    }

    #[test]
    fn chains_into_overflow_and_compacts() {
        let mut ix = Index::new(16, 2);
        let mut placed = Vec::new();
        for i in 1..=(3 * ITEM_SLOTS_PER_BUCKET as u64) {
            let at = ix.insert(3, pack(1, i)).expect("room in chain");
            placed.push(at);
        }
        assert_eq!(ix.free_overflow_count(), 0);
        assert!(!ix.can_insert(3));
        assert_eq!(ix.insert(3, pack(1, 999)), None);
        // Another main bucket still has its own slots.
        assert!(ix.can_insert(4));
        assert_eq!(ix.all_entries().len(), placed.len());
        // Emptying the middle overflow bucket returns it to the pool.
        for at in placed
            .iter()
            .filter(|at| at.bucket == placed[ITEM_SLOTS_PER_BUCKET].bucket)
        {
            ix.clear(*at, 3);
        }
        assert_eq!(ix.free_overflow_count(), 1);
        assert_eq!(ix.all_entries().len(), 2 * ITEM_SLOTS_PER_BUCKET);
        let last = placed[placed.len() - 1];
        assert_eq!(
            ix.find_entry(3, pack(1, 3 * ITEM_SLOTS_PER_BUCKET as u64)),
            Some(last)
        );
        // The freed bucket is reused.
        assert!(ix.insert(3, pack(1, 1000)).is_some());
        assert_eq!(ix.free_overflow_count(), 0);
    }
}
