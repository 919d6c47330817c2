//! Store-mode value storage: a slab allocator inside the pool.
//!
//! The pool is cut into pages of `page_bytes`. Item sizes are rounded up to
//! size classes that grow by [`SIZE_CLASS_GROWTH_NUM`]/[`SIZE_CLASS_GROWTH_DEN`]
//! (×1.25) from [`SIZE_CLASS_BYTES_MIN`] up to the largest item a page can
//! hold, so no item wastes more than about a fifth of its chunk. A page is
//! given to a class the first time the class has no free chunk, and is
//! carved into chunks lazily (a bump pointer), so untouched pages of the
//! lazily zeroed pool are never faulted in. A freed chunk goes onto its
//! class's free list, linked through the chunk's first word, and is the
//! first to be reused.
//!
//! Pages are never taken back from a class (as in memcached without slab
//! rebalancing): a store whose value sizes shift over time may report
//! `InsufficientSpace` while another class still has free chunks.

use crate::item::{self, ITEM_ALIGN_BYTES, ITEM_BYTES_MAX};
use crate::partition::Storage;
use crate::pool::PoolMemory;

/// Largest page, in bytes: one x86-64 huge page, which also holds the
/// largest item ([`ITEM_BYTES_MAX`]).
pub const PAGE_BYTES_MAX: usize = 2 << 20;

/// Smallest page, in bytes: enough for an item with a maximal key.
pub const PAGE_BYTES_MIN: usize = 4 << 10;

/// A pool is cut into at least this many pages when it is small, so that
/// several size classes can get a page each.
pub const PAGES_PER_POOL_MIN: usize = 16;

/// Smallest chunk, in bytes: a header and an 8-byte key.
pub const SIZE_CLASS_BYTES_MIN: usize = 32;

/// Numerator of the growth factor between consecutive size classes.
pub const SIZE_CLASS_GROWTH_NUM: usize = 5;

/// Denominator of the growth factor between consecutive size classes.
pub const SIZE_CLASS_GROWTH_DEN: usize = 4;

/// Most size classes any page size can produce.
pub const SIZE_CLASSES_MAX: usize = 64;

/// Marks the end of a free list.
const FREE_LIST_END: u64 = u64::MAX;

const _: () = assert!(PAGE_BYTES_MAX.is_power_of_two() && PAGE_BYTES_MIN.is_power_of_two());
const _: () = assert!(
    PAGE_BYTES_MAX >= ITEM_BYTES_MAX,
    "a page holds the largest item"
);
const _: () = assert!(
    PAGE_BYTES_MIN >= item::item_bytes(fabrickv_types::limits::KEY_BYTES_MAX, 0),
    "any key fits in the smallest page"
);
const _: () = assert!(
    SIZE_CLASS_BYTES_MIN >= 8,
    "a free chunk holds its free-list link"
);
const _: () = assert!(SIZE_CLASS_BYTES_MIN >= item::ITEM_HEADER_BYTES);
const _: () = assert!(item::align_down(SIZE_CLASS_BYTES_MIN) == SIZE_CLASS_BYTES_MIN);
const _: () = assert!(SIZE_CLASS_GROWTH_NUM > SIZE_CLASS_GROWTH_DEN);
const _: () = assert!(size_class_count(PAGE_BYTES_MAX) <= SIZE_CLASSES_MAX);
const _: () = assert!(
    SIZE_CLASSES_MAX <= u8::MAX as usize,
    "page owners are kept in a u8"
);

/// Chunk size of the class after one of `chunk_bytes`.
const fn next_class_bytes(chunk_bytes: usize) -> usize {
    let grown = chunk_bytes * SIZE_CLASS_GROWTH_NUM / SIZE_CLASS_GROWTH_DEN;
    let grown = if grown > chunk_bytes + ITEM_ALIGN_BYTES {
        grown
    } else {
        chunk_bytes + ITEM_ALIGN_BYTES
    };
    item::align_up(grown)
}

/// Largest chunk for a page size: the page, or the largest item.
const fn largest_chunk_bytes(page_bytes: usize) -> usize {
    let cap = if page_bytes < ITEM_BYTES_MAX {
        page_bytes
    } else {
        ITEM_BYTES_MAX
    };
    item::align_down(cap)
}

/// Number of size classes for a page size.
const fn size_class_count(page_bytes: usize) -> usize {
    let largest = largest_chunk_bytes(page_bytes);
    let mut n = 1;
    let mut c = SIZE_CLASS_BYTES_MIN;
    while c < largest {
        c = next_class_bytes(c);
        n += 1;
    }
    n
}

/// Page size for a pool: the pool over [`PAGES_PER_POOL_MIN`], rounded down
/// to a power of two, within the page bounds.
pub fn page_bytes_for_pool(pool_bytes: usize) -> usize {
    let share = (pool_bytes / PAGES_PER_POOL_MIN).max(1);
    let pow2 = 1usize << (usize::BITS - 1 - share.leading_zeros());
    pow2.clamp(PAGE_BYTES_MIN, PAGE_BYTES_MAX)
}

/// One size class.
#[derive(Debug, Clone, Copy)]
struct Class {
    /// Chunk size in bytes.
    chunk_bytes: usize,
    /// First free chunk's position, or [`FREE_LIST_END`].
    free_head: u64,
    /// Next never-used chunk in the class's newest page.
    carve_pos: usize,
    /// End of the class's newest page.
    carve_end: usize,
}

/// The slab allocator and its pool.
pub(crate) struct Slab {
    /// The pool; zeroed (lazily by the OS unless the pool options say otherwise).
    pool: PoolMemory,
    /// Page size in bytes (a power of two).
    page_bytes: usize,
    /// Whole pages in the pool.
    pages_total: usize,
    /// Pages given to a class so far; pages are handed out in order.
    pages_used: usize,
    /// Class of each page given out (index into `classes`).
    page_class: Vec<u8>,
    /// Size classes, smallest first.
    classes: Vec<Class>,
}

impl Slab {
    /// A slab allocator over a fresh pool of `pool_bytes` bytes.
    pub fn new(pool: PoolMemory) -> Slab {
        let pool_bytes = pool.len();
        let page_bytes = page_bytes_for_pool(pool_bytes);
        let pages_total = pool_bytes / page_bytes;
        let largest = largest_chunk_bytes(page_bytes);
        let mut classes = Vec::with_capacity(size_class_count(page_bytes));
        let mut c = SIZE_CLASS_BYTES_MIN;
        loop {
            let chunk_bytes = c.min(largest);
            classes.push(Class {
                chunk_bytes,
                free_head: FREE_LIST_END,
                carve_pos: 0,
                carve_end: 0,
            });
            if chunk_bytes == largest {
                break;
            }
            c = next_class_bytes(c);
        }
        debug_assert_eq!(classes.len(), size_class_count(page_bytes));
        Slab {
            pool,
            page_bytes,
            pages_total,
            pages_used: 0,
            page_class: vec![0; pages_total],
            classes,
        }
    }

    /// The smallest class whose chunks hold `size` bytes.
    #[inline]
    pub fn class_for(&self, size: usize) -> Option<usize> {
        let c = self.classes.partition_point(|c| c.chunk_bytes < size);
        (c < self.classes.len()).then_some(c)
    }

    /// The class of the chunk at `pos`.
    #[inline]
    pub fn class_of(&self, pos: usize) -> usize {
        usize::from(self.page_class[pos / self.page_bytes])
    }

    /// A chunk of class `class`, or `None` if the class has no free chunk
    /// and no page is left to give it.
    pub fn alloc(&mut self, class: usize) -> Option<usize> {
        let c = &mut self.classes[class];
        if c.free_head != FREE_LIST_END {
            let pos = c.free_head as usize;
            c.free_head = item::read_u64(&self.pool, pos);
            return Some(pos);
        }
        if c.carve_pos + c.chunk_bytes <= c.carve_end {
            let pos = c.carve_pos;
            c.carve_pos += c.chunk_bytes;
            return Some(pos);
        }
        if self.pages_used == self.pages_total {
            return None;
        }
        let page = self.pages_used;
        self.pages_used += 1;
        self.page_class[page] = class as u8;
        let pos = page * self.page_bytes;
        c.carve_pos = pos + c.chunk_bytes;
        c.carve_end = pos + self.page_bytes;
        Some(pos)
    }

    /// Returns the chunk at `pos` to its class's free list.
    pub fn free(&mut self, pos: usize) {
        let class = self.class_of(pos);
        let c = &mut self.classes[class];
        let in_page = pos % self.page_bytes;
        debug_assert_eq!(
            in_page / c.chunk_bytes * c.chunk_bytes,
            in_page,
            "not a chunk start"
        );
        item::write_u64(&mut self.pool, pos, c.free_head);
        c.free_head = pos as u64;
    }

    /// Page size in bytes.
    #[cfg(test)]
    pub fn page_bytes(&self) -> usize {
        self.page_bytes
    }
}

impl Storage for Slab {
    #[inline]
    fn pool(&self) -> &[u8] {
        &self.pool
    }

    #[inline]
    fn pool_mut(&mut self) -> &mut [u8] {
        &mut self.pool
    }

    #[inline]
    fn resolve(&self, offset: u64) -> Option<usize> {
        Some(offset as usize)
    }

    #[inline]
    fn release(&mut self, pos: usize) {
        self.free(pos);
    }

    fn max_item_bytes(&self) -> usize {
        self.classes.last().map_or(0, |c| c.chunk_bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes_grow_and_cover_the_largest_item() {
        let s = Slab::new(crate::pool::heap(64 << 20));
        assert_eq!(s.page_bytes(), PAGE_BYTES_MAX);
        assert_eq!(s.max_item_bytes(), ITEM_BYTES_MAX);
        assert_eq!(s.classes[0].chunk_bytes, SIZE_CLASS_BYTES_MIN);
        for w in s.classes.windows(2) {
            assert!(w[1].chunk_bytes > w[0].chunk_bytes);
            assert!(w[1].chunk_bytes <= w[0].chunk_bytes * 5 / 4 + 16);
        }
        assert_eq!(s.class_for(1), Some(0));
        assert_eq!(s.class_for(33), Some(1));
        assert_eq!(s.class_for(ITEM_BYTES_MAX + 1), None);
    }

    #[test]
    fn small_pools_get_small_pages() {
        assert_eq!(page_bytes_for_pool(64 << 10), PAGE_BYTES_MIN);
        assert_eq!(page_bytes_for_pool(1 << 20), 64 << 10);
        assert_eq!(page_bytes_for_pool(1 << 40), PAGE_BYTES_MAX);
        let s = Slab::new(crate::pool::heap(1 << 20));
        assert_eq!(s.max_item_bytes(), 64 << 10);
    }

    #[test]
    fn alloc_reuses_freed_chunks_and_runs_out() {
        let mut s = Slab::new(crate::pool::heap(64 << 10));
        let class = s.class_for(PAGE_BYTES_MIN).expect("class");
        // Class of whole pages: one chunk per page, 16 pages.
        let mut got = Vec::new();
        while let Some(p) = s.alloc(class) {
            got.push(p);
        }
        assert_eq!(got.len(), 16);
        // No page left for another class either.
        assert_eq!(s.alloc(0), None);
        s.free(got[3]);
        assert_eq!(s.alloc(0), None, "a freed chunk belongs to its own class");
        assert_eq!(s.alloc(class), Some(got[3]));
    }

    #[test]
    fn carving_fills_a_page() {
        let mut s = Slab::new(crate::pool::heap(64 << 10));
        let per_page = PAGE_BYTES_MIN / SIZE_CLASS_BYTES_MIN;
        let first: Vec<usize> = (0..per_page).map(|_| s.alloc(0).expect("chunk")).collect();
        assert!(first.iter().all(|&p| p < PAGE_BYTES_MIN));
        assert!(
            s.alloc(0).expect("chunk") >= PAGE_BYTES_MIN,
            "a second page is taken"
        );
    }
}
