//! The pool allocator: segregated fit over offsets, with immediate
//! coalescing.
//!
//! Values are large (KiB to MiB) and live for seconds to hours, so what
//! matters is that freed space comes back as big contiguous blocks, not a
//! nanosecond fast path. The design is TLSF-like:
//! - every block is a multiple of [`CACHE_BLOCK_ALIGN_BYTES`] and starts at
//!   a multiple of it, so every value starts on its own cache line and no two
//!   values share one (no false sharing between a writer and a reader);
//! - free blocks are filed in size classes: one class per power of two,
//!   split into [`SIZE_CLASS_SUBDIVISIONS`] linear sub-classes, so a class
//!   never spans more than 1/8 of its size and the first fitting block is
//!   never much larger than asked;
//! - the address-ordered map of free blocks lives outside the pool, so a
//!   freed block finds its free neighbours in O(log n) and is merged with
//!   them at once; the pool memory holds only value bytes (a value can be
//!   DMA'd or mapped without headers in the way).
//!
//! The allocator knows only offsets and lengths; it never touches the pool.

use std::collections::{BTreeMap, BTreeSet};

/// Alignment and granularity of every block, in bytes: one cache line.
pub const CACHE_BLOCK_ALIGN_BYTES: usize = 64;

/// log2 of [`SIZE_CLASS_SUBDIVISIONS`].
pub const SIZE_CLASS_SUBDIVISIONS_LOG2: u32 = 3;

/// Linear sub-classes per power-of-two range of block sizes (8): the most a
/// block found in the first non-empty larger class can exceed the request
/// by is one sub-class width, 1/8 of the range.
pub const SIZE_CLASS_SUBDIVISIONS: usize = 1 << SIZE_CLASS_SUBDIVISIONS_LOG2;

/// Bits per word of the non-empty-class bitmap.
const BITMAP_WORD_BITS: usize = u64::BITS as usize;

/// Rounds a value length up to the block that holds it, in bytes: a
/// multiple of [`CACHE_BLOCK_ALIGN_BYTES`], at least one granule (so even an
/// empty value owns a distinct block and a distinct offset). `None` when the
/// rounding overflows, which no length below the pool size can do.
pub fn block_bytes(value_len: usize) -> Option<usize> {
    let granules = value_len.div_ceil(CACHE_BLOCK_ALIGN_BYTES).max(1);
    granules.checked_mul(CACHE_BLOCK_ALIGN_BYTES)
}

/// The size class of a block of `granules` granules (at least 1).
///
/// Below `2 * SIZE_CLASS_SUBDIVISIONS` granules each size has its own class
/// (the sub-class width would be under one granule); above, class
/// `(log2 - SUBDIV_LOG2 + 1) * SUBDIV + sub` where `sub` is the next
/// `SUBDIV_LOG2` bits below the top one. Classes are ordered as sizes are:
/// a larger size never has a smaller class.
fn class_of(granules: usize) -> usize {
    if granules < SIZE_CLASS_SUBDIVISIONS {
        return granules;
    }
    let log2 = usize::BITS - 1 - granules.leading_zeros();
    let shift = log2 - SIZE_CLASS_SUBDIVISIONS_LOG2;
    let sub = (granules >> shift) & (SIZE_CLASS_SUBDIVISIONS - 1);
    (shift as usize + 1) * SIZE_CLASS_SUBDIVISIONS + sub
}

/// Free space of the pool, by address and by size class.
#[derive(Debug)]
pub(crate) struct Allocator {
    /// Bytes under management, a multiple of `CACHE_BLOCK_ALIGN_BYTES`.
    capacity: usize,
    /// Free blocks by offset: the address order that coalescing needs.
    free_by_offset: BTreeMap<usize, usize>,
    /// Free blocks of each class as `(len, offset)`: the smallest fitting
    /// block of a class is one range query away, and among equal sizes the
    /// lowest address wins (keeping the pool's high end free longer).
    classes: Vec<BTreeSet<(usize, usize)>>,
    /// One bit per class, set while the class holds a block, so the next
    /// non-empty larger class is found by scanning words, not sets.
    nonempty: Vec<u64>,
    /// Sum of the free blocks' lengths.
    free_bytes: usize,
}

impl Allocator {
    /// An allocator over `capacity` bytes (rounded down to the block
    /// granularity), all of it one free block.
    pub fn new(capacity: usize) -> Allocator {
        let capacity = capacity - capacity % CACHE_BLOCK_ALIGN_BYTES;
        let class_count = class_of((capacity / CACHE_BLOCK_ALIGN_BYTES).max(1)) + 1;
        let mut a = Allocator {
            capacity,
            free_by_offset: BTreeMap::new(),
            classes: (0..class_count).map(|_| BTreeSet::new()).collect(),
            nonempty: vec![0; class_count.div_ceil(BITMAP_WORD_BITS)],
            free_bytes: 0,
        };
        if capacity > 0 {
            a.insert_free(0, capacity);
        }
        a
    }

    /// Bytes under management.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Bytes in free blocks.
    pub fn free_bytes(&self) -> usize {
        self.free_bytes
    }

    /// Bytes in allocated blocks.
    pub fn used_bytes(&self) -> usize {
        self.capacity - self.free_bytes
    }

    /// How many free blocks there are (1 for an empty pool: coalescing
    /// leaves no two free blocks side by side).
    pub fn free_blocks(&self) -> usize {
        self.free_by_offset.len()
    }

    /// The largest free block, in bytes: the biggest value that can be
    /// placed without freeing anything.
    pub fn largest_free(&self) -> usize {
        self.classes
            .iter()
            .rev()
            .find_map(|c| c.last())
            .map_or(0, |&(len, _)| len)
    }

    /// Takes a block of exactly `bytes` (a result of [`block_bytes`]) and
    /// returns its offset, or `None` when no free block is large enough.
    ///
    /// Searches the request's own class for its smallest block that fits,
    /// then takes the smallest block of the first non-empty larger class;
    /// what is left over goes back as a free block right after the taken one.
    pub fn alloc(&mut self, bytes: usize) -> Option<usize> {
        if bytes == 0 || !bytes.is_multiple_of(CACHE_BLOCK_ALIGN_BYTES) || bytes > self.capacity {
            return None;
        }
        let class = class_of(bytes / CACHE_BLOCK_ALIGN_BYTES);
        let own = self
            .classes
            .get(class)
            .and_then(|c| c.range((bytes, 0)..).next().copied());
        let (len, offset) = match own {
            Some(found) => found,
            None => {
                let larger = self.next_nonempty(class + 1)?;
                self.classes.get(larger)?.first().copied()?
            }
        };
        self.remove_free(offset, len);
        if len > bytes {
            self.insert_free(offset + bytes, len - bytes);
        }
        Some(offset)
    }

    /// Gives back the block at `offset` of `bytes`, merging it with free
    /// neighbours. Returns false, changing nothing, when the block is not a
    /// valid allocated block (out of the pool, misaligned, or overlapping
    /// free space: a double free), which is a bug of the caller.
    #[must_use]
    pub fn free(&mut self, offset: usize, bytes: usize) -> bool {
        let Some(end) = offset.checked_add(bytes) else {
            return false;
        };
        if bytes == 0
            || end > self.capacity
            || !offset.is_multiple_of(CACHE_BLOCK_ALIGN_BYTES)
            || !bytes.is_multiple_of(CACHE_BLOCK_ALIGN_BYTES)
        {
            return false;
        }
        let before = self
            .free_by_offset
            .range(..=offset)
            .next_back()
            .map(|(&o, &l)| (o, l));
        let after = self
            .free_by_offset
            .range(offset..)
            .next()
            .map(|(&o, &l)| (o, l));
        if before.is_some_and(|(o, l)| o + l > offset) || after.is_some_and(|(o, _)| o < end) {
            return false;
        }
        let mut start = offset;
        let mut len = bytes;
        if let Some((o, l)) = before.filter(|&(o, l)| o + l == offset) {
            self.remove_free(o, l);
            start = o;
            len += l;
        }
        if let Some((o, l)) = after.filter(|&(o, _)| o == end) {
            self.remove_free(o, l);
            len += l;
        }
        self.insert_free(start, len);
        true
    }

    fn insert_free(&mut self, offset: usize, len: usize) {
        let class = class_of(len / CACHE_BLOCK_ALIGN_BYTES);
        self.free_by_offset.insert(offset, len);
        if let Some(set) = self.classes.get_mut(class) {
            set.insert((len, offset));
            if let Some(word) = self.nonempty.get_mut(class / BITMAP_WORD_BITS) {
                *word |= 1 << (class % BITMAP_WORD_BITS);
            }
        }
        self.free_bytes += len;
    }

    fn remove_free(&mut self, offset: usize, len: usize) {
        let class = class_of(len / CACHE_BLOCK_ALIGN_BYTES);
        self.free_by_offset.remove(&offset);
        if let Some(set) = self.classes.get_mut(class) {
            set.remove(&(len, offset));
            if set.is_empty() {
                if let Some(word) = self.nonempty.get_mut(class / BITMAP_WORD_BITS) {
                    *word &= !(1 << (class % BITMAP_WORD_BITS));
                }
            }
        }
        self.free_bytes -= len;
    }

    /// The first non-empty class at or above `from`.
    fn next_nonempty(&self, from: usize) -> Option<usize> {
        let mut word_index = from / BITMAP_WORD_BITS;
        let mut mask = u64::MAX.checked_shl((from % BITMAP_WORD_BITS) as u32)?;
        while let Some(&word) = self.nonempty.get(word_index) {
            let bits = word & mask;
            if bits != 0 {
                return Some(word_index * BITMAP_WORD_BITS + bits.trailing_zeros() as usize);
            }
            word_index += 1;
            mask = u64::MAX;
        }
        None
    }

    /// Checks every internal invariant; a description of the first broken
    /// one. For tests.
    #[cfg(test)]
    pub fn check(&self) -> Result<(), String> {
        let mut sum = 0;
        let mut prev_end: Option<usize> = None;
        let mut blocks = 0;
        for (&o, &l) in &self.free_by_offset {
            if l == 0 || o % CACHE_BLOCK_ALIGN_BYTES != 0 || l % CACHE_BLOCK_ALIGN_BYTES != 0 {
                return Err(format!("bad free block {o}+{l}"));
            }
            if o + l > self.capacity {
                return Err(format!("free block {o}+{l} past the pool"));
            }
            if let Some(e) = prev_end {
                if e >= o {
                    return Err(format!(
                        "free block at {o} touches or overlaps one ending {e}"
                    ));
                }
            }
            let class = class_of(l / CACHE_BLOCK_ALIGN_BYTES);
            if !self.classes[class].contains(&(l, o)) {
                return Err(format!("free block {o}+{l} missing from class {class}"));
            }
            prev_end = Some(o + l);
            sum += l;
            blocks += 1;
        }
        let filed: usize = self.classes.iter().map(BTreeSet::len).sum();
        if filed != blocks {
            return Err(format!(
                "{filed} blocks filed in classes, {blocks} by offset"
            ));
        }
        for (c, set) in self.classes.iter().enumerate() {
            let bit = self.nonempty[c / BITMAP_WORD_BITS] >> (c % BITMAP_WORD_BITS) & 1;
            if (bit == 1) == set.is_empty() {
                return Err(format!("bitmap bit of class {c} is wrong"));
            }
        }
        if sum != self.free_bytes {
            return Err(format!(
                "free bytes {} but blocks sum {sum}",
                self.free_bytes
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const G: usize = CACHE_BLOCK_ALIGN_BYTES;

    #[test]
    fn classes_are_ordered_as_sizes_and_each_spans_at_most_an_eighth() {
        let mut last = 0;
        let mut class_start = 1;
        for g in 1..100_000usize {
            let c = class_of(g);
            assert!(c >= last, "class of {g} went down");
            if c != last {
                class_start = g;
            }
            // A class's sizes differ by less than 1/8 of its smallest
            // member (or are one exact size below 16 granules).
            assert!((g - class_start) * SIZE_CLASS_SUBDIVISIONS <= class_start.max(8));
            last = c;
        }
        // A 1 TiB pool needs a few hundred classes, not thousands.
        assert!(class_of((1usize << 40) / G) < 300);
    }

    #[test]
    fn block_bytes_rounds_up_to_cache_lines() {
        assert_eq!(block_bytes(0), Some(G));
        assert_eq!(block_bytes(1), Some(G));
        assert_eq!(block_bytes(G), Some(G));
        assert_eq!(block_bytes(G + 1), Some(2 * G));
        assert_eq!(block_bytes(usize::MAX), None);
    }

    #[test]
    fn split_blocks_come_back_as_one() {
        let mut a = Allocator::new(64 * G);
        let x = a.alloc(10 * G).expect("room");
        let y = a.alloc(20 * G).expect("room");
        let z = a.alloc(30 * G).expect("room");
        assert_eq!((x, y, z), (0, 10 * G, 30 * G));
        assert_eq!(a.free_bytes(), 4 * G);
        assert!(a.free(y, 20 * G));
        assert_eq!(a.free_blocks(), 2);
        assert!(a.free(x, 10 * G));
        assert_eq!(a.free_blocks(), 2, "x merged with y's hole");
        assert_eq!(a.largest_free(), 30 * G);
        assert!(a.free(z, 30 * G));
        assert_eq!(a.free_blocks(), 1);
        assert_eq!(a.free_bytes(), 64 * G);
        a.check().expect("invariants");
    }

    #[test]
    fn invalid_frees_change_nothing() {
        let mut a = Allocator::new(16 * G);
        let x = a.alloc(4 * G).expect("room");
        assert!(!a.free(x + 1, 4 * G), "misaligned");
        assert!(!a.free(x, 0), "empty");
        assert!(!a.free(8 * G, 4 * G), "already free");
        assert!(!a.free(14 * G, 4 * G), "past the end");
        assert!(!a.free(usize::MAX - 63, 64), "overflowing");
        assert_eq!(a.free_bytes(), 12 * G);
        assert!(a.free(x, 4 * G));
        assert!(!a.free(x, 4 * G), "double free");
        a.check().expect("invariants");
    }

    #[test]
    fn smallest_fitting_block_is_taken() {
        let mut a = Allocator::new(100 * G);
        // Free holes of 3, 9 and 5 granules separated by live blocks.
        let mut live = Vec::new();
        let mut holes = Vec::new();
        for len in [3, 1, 9, 1, 5, 1] {
            let o = a.alloc(len * G).expect("room");
            if len == 1 {
                live.push(o);
            } else {
                holes.push((o, len * G));
            }
        }
        for (o, l) in &holes {
            assert!(a.free(*o, *l));
        }
        assert_eq!(
            a.alloc(4 * G),
            Some(holes[2].0),
            "the 5-hole, not the 9-hole"
        );
        assert_eq!(a.alloc(2 * G), Some(holes[0].0), "the 3-hole");
        a.check().expect("invariants");
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        /// Any sequence of allocations and frees keeps blocks disjoint and
        /// inside the pool, keeps the free structures consistent, and
        /// freeing everything gives back one block of the whole pool.
        #[test]
        fn random_alloc_free_keeps_invariants(
            ops in proptest::collection::vec((any::<bool>(), 1usize..40, any::<prop::sample::Index>()), 1..200)
        ) {
            let cap = 256 * G;
            let mut a = Allocator::new(cap);
            let mut live: Vec<(usize, usize)> = Vec::new();
            for (is_alloc, granules, pick) in ops {
                if is_alloc || live.is_empty() {
                    let bytes = granules * G;
                    let fits = a.largest_free() >= bytes;
                    match a.alloc(bytes) {
                        Some(o) => {
                            prop_assert!(o + bytes <= cap);
                            for &(lo, ll) in &live {
                                prop_assert!(o + bytes <= lo || lo + ll <= o, "overlap");
                            }
                            live.push((o, bytes));
                        }
                        None => prop_assert!(!fits, "a fitting block was missed"),
                    }
                } else {
                    let (o, l) = live.swap_remove(pick.index(live.len()));
                    prop_assert!(a.free(o, l));
                }
                prop_assert_eq!(a.used_bytes(), live.iter().map(|b| b.1).sum::<usize>());
                if let Err(e) = a.check() {
                    prop_assert!(false, "{}", e);
                }
            }
            for (o, l) in live {
                prop_assert!(a.free(o, l));
            }
            prop_assert_eq!(a.free_blocks(), 1);
            prop_assert_eq!(a.free_bytes(), cap);
        }
    }
}
