//! Store-mode value storage: a slab allocator inside the pool that moves
//! pages between size classes.
//!
//! The pool is cut into pages of `page_bytes`. Item sizes are rounded up to
//! size classes that grow by [`SIZE_CLASS_GROWTH_NUM`]/[`SIZE_CLASS_GROWTH_DEN`]
//! (×1.25) from [`SIZE_CLASS_BYTES_MIN`] up to the largest item a page can
//! hold, so no item wastes more than about a fifth of its chunk. A page is
//! given to a class when the class has no free chunk, and is carved into
//! chunks lazily (a bump pointer), so untouched pages of the lazily zeroed
//! pool are never faulted in. Each page keeps its own free list (linked
//! through the chunks' first words) and count of live chunks; a class
//! chains its pages that have free chunks, so a freed chunk is the first
//! to be reused.
//!
//! Pages go back (as memcached's `slab_reassign`/`slab_automove` do, but
//! without ever dropping an item):
//! - a page whose last item leaves goes back to the free pages at once,
//!   for any class;
//! - a write whose class has no free chunk, when no page is free, empties
//!   a page of another class first (`reassign.rs`): the class with the
//!   most free bytes among those with at least
//!   [`REFUSAL_SLACK_PAGES_PER_CLASS`] pages' worth of free chunks gives
//!   its emptiest page, whose items are copied byte for byte (flags, TTL,
//!   meta, large-value stubs) into the class's free chunks elsewhere and
//!   their index slots rewritten. Bounded work: one page per write. So a
//!   write is refused only while the pool's free bytes are less than its
//!   chunk plus [`REFUSAL_SLACK_PAGES_PER_CLASS`] pages per other class
//!   holding pages (the index, whose chains and overflow pool can fill,
//!   and the large-value budget refuse apart from this);
//! - the background sweep empties, when no page is free, at most
//!   [`AUTOMOVE_PAGES_PER_SWEEP`] page of a class holding at least
//!   [`AUTOMOVE_FREE_PAGES_MIN`] pages' worth of free chunks, so that a
//!   page is ready before a write needs one.

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

/// Marks an empty free list.
const FREE_LIST_END: u64 = u64::MAX;

/// Marks the end of a page list, or no page.
const NO_PAGE: u32 = u32::MAX;

/// Owner of a page that no class holds (it is on the free-page stack).
const NO_CLASS: u8 = u8::MAX;

/// The refusal bound, in pages per size class: a store-mode write is
/// refused only while every other class that holds pages has less than
/// this many pages' worth of free chunks (a class with that much can
/// always empty its emptiest page into its other free chunks). So at a
/// refusal the pool's free bytes ([`Slab::free_bytes`]) are less than the
/// write's chunk plus this many `page_bytes` per other class holding
/// pages: for a workload of `k` value sizes, under `k - 1` pages.
pub const REFUSAL_SLACK_PAGES_PER_CLASS: usize = 1;

/// The background mover empties a page of a class only when the class
/// has at least this many pages' worth of free chunks, in pages: enough
/// that what it frees will not be wanted back by the same class at once.
pub const AUTOMOVE_FREE_PAGES_MIN: usize = 2;

/// Most pages the background mover empties per sweep (so one sweep
/// relocates at most one page of items).
pub const AUTOMOVE_PAGES_PER_SWEEP: usize = 1;

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
    SIZE_CLASSES_MAX < NO_CLASS as usize,
    "page owners are kept in a u8, NO_CLASS apart"
);
const _: () = assert!(REFUSAL_SLACK_PAGES_PER_CLASS >= 1);
const _: () = assert!(AUTOMOVE_FREE_PAGES_MIN >= REFUSAL_SLACK_PAGES_PER_CLASS);
const _: () = assert!(
    (crate::POOL_BYTES_MAX / PAGE_BYTES_MAX) < NO_PAGE as usize,
    "page numbers fit a u32"
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
    /// Chunks one page holds.
    chunks_per_page: usize,
    /// Pages the class holds.
    pages: usize,
    /// Chunks of the class that hold an item; the others of its pages
    /// (`pages * chunks_per_page - live`) are free or not yet carved.
    live: usize,
    /// First of the class's pages whose free list is not empty, chained
    /// through `Page::next`; [`NO_PAGE`] if none.
    partial_head: u32,
    /// The page being carved, or [`NO_PAGE`].
    carve_page: u32,
    /// Next never-used chunk in `carve_page`.
    carve_pos: usize,
    /// End of the last whole chunk of `carve_page`.
    carve_end: usize,
}

impl Class {
    /// Free chunks of the class: on free lists or not yet carved.
    #[inline]
    fn free_chunks(&self) -> usize {
        self.pages * self.chunks_per_page - self.live
    }
}

/// Bookkeeping of one page.
#[derive(Debug, Clone, Copy)]
struct Page {
    /// Head of the page's free list, linked through the chunks' first
    /// words; [`FREE_LIST_END`] if empty.
    free: u64,
    /// Chunks that hold an item; a page that drops to 0 goes back to the
    /// free pages.
    live: u32,
    /// Next page in its class's list of pages with free chunks.
    next: u32,
    /// Previous page in that list, so a page can leave it in O(1).
    prev: u32,
    /// The class holding the page ([`NO_CLASS`] while it is free).
    class: u8,
    /// The class that last held the page, to count pages that change
    /// class.
    last_class: u8,
}

/// The live chunks of a page being emptied, as [`Slab::begin_vacate`]
/// found them.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Vacate {
    /// The page.
    pub page: usize,
    /// Its class.
    pub class: usize,
    /// Position of its first chunk.
    pub start: usize,
    /// End of its last carved chunk.
    pub end: usize,
    /// Chunk size in bytes.
    pub chunk_bytes: usize,
}

/// The slab allocator and its pool.
pub(crate) struct Slab {
    /// The pool; zeroed (lazily by the OS unless the pool options say otherwise).
    pool: PoolMemory,
    /// Page size in bytes (a power of two).
    page_bytes: usize,
    /// Whole pages in the pool.
    pages_total: usize,
    /// Pages ever given out; those above were never touched (and so were
    /// never faulted in), and are handed out in order.
    pages_used: usize,
    /// Pages given out before and emptied since, to be given out first.
    free_pages: Vec<u32>,
    /// Bookkeeping of each page.
    pages: Vec<Page>,
    /// Size classes, smallest first.
    classes: Vec<Class>,
    /// Scratch for [`Slab::begin_vacate`]: one bit per chunk of a page,
    /// set when the chunk is free; sized once for the smallest class.
    free_marks: Vec<u64>,
    /// Pages given to a class other than the one that last held them.
    pages_moved: u64,
    /// Pages emptied by relocating their items.
    pages_vacated: u64,
    /// Items copied to another chunk to empty a page.
    items_relocated: u64,
}

impl Slab {
    /// A slab allocator over a fresh pool of `pool_bytes` bytes.
    pub fn new(pool: PoolMemory) -> Slab {
        let pool_bytes = pool.len();
        let page_bytes = page_bytes_for_pool(pool_bytes);
        let pages_total = pool_bytes / page_bytes;
        assert!(pages_total < NO_PAGE as usize, "page numbers fit a u32");
        let largest = largest_chunk_bytes(page_bytes);
        let mut classes = Vec::with_capacity(size_class_count(page_bytes));
        let mut c = SIZE_CLASS_BYTES_MIN;
        loop {
            let chunk_bytes = c.min(largest);
            classes.push(Class {
                chunk_bytes,
                chunks_per_page: page_bytes / chunk_bytes,
                pages: 0,
                live: 0,
                partial_head: NO_PAGE,
                carve_page: NO_PAGE,
                carve_pos: 0,
                carve_end: 0,
            });
            if chunk_bytes == largest {
                break;
            }
            c = next_class_bytes(c);
        }
        debug_assert_eq!(classes.len(), size_class_count(page_bytes));
        let marks = (page_bytes / SIZE_CLASS_BYTES_MIN).div_ceil(64);
        Slab {
            pool,
            page_bytes,
            pages_total,
            pages_used: 0,
            free_pages: Vec::with_capacity(pages_total),
            pages: vec![
                Page {
                    free: FREE_LIST_END,
                    live: 0,
                    next: NO_PAGE,
                    prev: NO_PAGE,
                    class: NO_CLASS,
                    last_class: NO_CLASS,
                };
                pages_total
            ],
            classes,
            free_marks: vec![0; marks],
            pages_moved: 0,
            pages_vacated: 0,
            items_relocated: 0,
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
        usize::from(self.pages[pos / self.page_bytes].class)
    }

    /// A chunk of class `class` from its own pages or a free page, or
    /// `None` if it has no free chunk and no page is free. Taking a page
    /// from another class is the caller's (`reassign`), as it moves items.
    pub fn alloc(&mut self, class: usize) -> Option<usize> {
        if let Some(pos) = self.alloc_within(class) {
            return Some(pos);
        }
        let page = self.take_free_page()?;
        self.give_page(page, class);
        self.alloc_within(class)
    }

    /// A chunk of class `class` from the pages it already holds.
    fn alloc_within(&mut self, class: usize) -> Option<usize> {
        let c = &mut self.classes[class];
        let head = c.partial_head;
        if head != NO_PAGE {
            let page = head as usize;
            let pos = self.pages[page].free as usize;
            let next = item::read_u64(&self.pool, pos);
            self.pages[page].free = next;
            c.live += 1;
            self.pages[page].live += 1;
            if next == FREE_LIST_END {
                self.unlink_partial(page);
            }
            return Some(pos);
        }
        if c.carve_page != NO_PAGE && c.carve_pos + c.chunk_bytes <= c.carve_end {
            let pos = c.carve_pos;
            c.carve_pos += c.chunk_bytes;
            c.live += 1;
            self.pages[c.carve_page as usize].live += 1;
            return Some(pos);
        }
        None
    }

    /// A page no class holds: an emptied one first (already faulted in),
    /// else the next never-touched one.
    fn take_free_page(&mut self) -> Option<usize> {
        if let Some(page) = self.free_pages.pop() {
            return Some(page as usize);
        }
        if self.pages_used == self.pages_total {
            return None;
        }
        self.pages_used += 1;
        Some(self.pages_used - 1)
    }

    /// Gives a free page to `class` as its page to carve. Called only when
    /// the class's carve page is used up, so no chunk is lost.
    fn give_page(&mut self, page: usize, class: usize) {
        let last = self.pages[page].last_class;
        if last != NO_CLASS && usize::from(last) != class {
            self.pages_moved += 1;
        }
        self.pages[page].class = class as u8;
        self.pages[page].last_class = class as u8;
        self.pages[page].live = 0;
        self.pages[page].free = FREE_LIST_END;
        let start = page * self.page_bytes;
        let c = &mut self.classes[class];
        c.pages += 1;
        c.carve_page = page as u32;
        c.carve_pos = start;
        c.carve_end = start + c.chunks_per_page * c.chunk_bytes;
    }

    /// Returns the chunk at `pos` to its page's free list; a page left
    /// with no item goes back to the free pages, for any class.
    pub fn free(&mut self, pos: usize) {
        let page = pos / self.page_bytes;
        let class = usize::from(self.pages[page].class);
        debug_assert!(class < self.classes.len(), "chunk of an unowned page");
        let chunk_bytes = self.classes[class].chunk_bytes;
        debug_assert_eq!(
            (pos % self.page_bytes) % chunk_bytes,
            0,
            "not a chunk start"
        );
        let head = self.pages[page].free;
        item::write_u64(&mut self.pool, pos, head);
        self.pages[page].free = pos as u64;
        if head == FREE_LIST_END {
            self.link_partial(class, page);
        }
        self.classes[class].live -= 1;
        self.pages[page].live -= 1;
        if self.pages[page].live == 0 {
            self.release_page(page);
        }
    }

    /// Takes a page with no item from its class onto the free pages.
    fn release_page(&mut self, page: usize) {
        debug_assert_eq!(self.pages[page].live, 0);
        let class = usize::from(self.pages[page].class);
        if self.pages[page].free != FREE_LIST_END {
            self.unlink_partial(page);
            self.pages[page].free = FREE_LIST_END;
        }
        let c = &mut self.classes[class];
        if c.carve_page == page as u32 {
            c.carve_page = NO_PAGE;
            c.carve_pos = 0;
            c.carve_end = 0;
        }
        c.pages -= 1;
        self.pages[page].class = NO_CLASS;
        self.free_pages.push(page as u32);
    }

    /// Puts `page` at the head of its class's list of pages with free chunks.
    fn link_partial(&mut self, class: usize, page: usize) {
        let c = &mut self.classes[class];
        let head = c.partial_head;
        self.pages[page].prev = NO_PAGE;
        self.pages[page].next = head;
        if head != NO_PAGE {
            self.pages[head as usize].prev = page as u32;
        }
        c.partial_head = page as u32;
    }

    /// Takes `page` out of its class's list of pages with free chunks.
    fn unlink_partial(&mut self, page: usize) {
        let class = usize::from(self.pages[page].class);
        let (prev, next) = (self.pages[page].prev, self.pages[page].next);
        if prev == NO_PAGE {
            self.classes[class].partial_head = next;
        } else {
            self.pages[prev as usize].next = next;
        }
        if next != NO_PAGE {
            self.pages[next as usize].prev = prev;
        }
        self.pages[page].prev = NO_PAGE;
        self.pages[page].next = NO_PAGE;
    }

    /// Whether a page no class holds is left.
    #[inline]
    pub fn has_free_page(&self) -> bool {
        !self.free_pages.is_empty() || self.pages_used < self.pages_total
    }

    /// A page worth emptying for another class: the emptiest page of the
    /// class (other than `except`) with the most free bytes, among classes
    /// with at least `free_pages_min` pages' worth of free chunks. Such a
    /// page's items always fit into its class's other free chunks.
    pub fn pick_victim(&self, except: Option<usize>, free_pages_min: usize) -> Option<usize> {
        let class = (0..self.classes.len())
            .filter(|&c| Some(c) != except)
            .filter(|&c| {
                let cl = &self.classes[c];
                cl.pages > 0 && cl.free_chunks() >= free_pages_min * cl.chunks_per_page
            })
            .max_by_key(|&c| self.classes[c].free_chunks() * self.classes[c].chunk_bytes)?;
        (0..self.pages_used)
            .filter(|&p| usize::from(self.pages[p].class) == class)
            .min_by_key(|&p| self.pages[p].live)
    }

    /// Starts emptying `page`: takes it out of its class's allocation (its
    /// free list and carving), marks its free chunks in `free_marks`, and
    /// says where its live chunks are ([`Slab::is_free_mark`] tells them
    /// apart). `None`, changing nothing, if the class's other free chunks
    /// cannot hold the page's items.
    pub fn begin_vacate(&mut self, page: usize) -> Option<Vacate> {
        let class = usize::from(self.pages[page].class);
        let c = self.classes[class];
        let live = self.pages[page].live as usize;
        let free_here = c.chunks_per_page - live;
        if c.free_chunks() - free_here < live {
            return None;
        }
        let start = page * self.page_bytes;
        let end = if c.carve_page == page as u32 {
            let c = &mut self.classes[class];
            let end = c.carve_pos;
            c.carve_page = NO_PAGE;
            c.carve_pos = 0;
            c.carve_end = 0;
            end
        } else {
            start + c.chunks_per_page * c.chunk_bytes
        };
        let words = c.chunks_per_page.div_ceil(64);
        self.free_marks[..words].fill(0);
        let mut pos = self.pages[page].free;
        let mut walked = 0;
        while pos != FREE_LIST_END && walked < c.chunks_per_page {
            let i = (pos as usize - start) / c.chunk_bytes;
            self.free_marks[i / 64] |= 1 << (i % 64);
            pos = item::read_u64(&self.pool, pos as usize);
            walked += 1;
        }
        debug_assert_eq!(pos, FREE_LIST_END, "a page's free list ends");
        if self.pages[page].free != FREE_LIST_END {
            self.unlink_partial(page);
            self.pages[page].free = FREE_LIST_END;
        }
        Some(Vacate {
            page,
            class,
            start,
            end,
            chunk_bytes: c.chunk_bytes,
        })
    }

    /// Whether chunk `i` of the page being emptied was free.
    #[inline]
    pub fn is_free_mark(&self, i: usize) -> bool {
        self.free_marks[i / 64] & (1 << (i % 64)) != 0
    }

    /// A chunk of `class` for an item being moved off a page being emptied
    /// (which [`Slab::begin_vacate`] took out of the class's allocation);
    /// never takes a new page.
    pub fn alloc_for_move(&mut self, class: usize) -> Option<usize> {
        self.alloc_within(class)
    }

    /// Ends emptying `v.page`, whose items have all moved: it goes back
    /// to the free pages.
    pub fn finish_vacate(&mut self, v: &Vacate) {
        let moved = self.pages[v.page].live as usize;
        self.classes[v.class].live -= moved;
        self.pages[v.page].live = 0;
        self.pages_vacated += 1;
        self.release_page(v.page);
    }

    /// Bytes free for new items: free and uncarved chunks of every class
    /// plus the pages no class holds. The ends of pages too short for a
    /// chunk, and the pool's tail after its last whole page, are not
    /// counted: no item can use them.
    pub fn free_bytes(&self) -> u64 {
        let in_classes: usize = self
            .classes
            .iter()
            .map(|c| c.free_chunks() * c.chunk_bytes)
            .sum();
        let pages = self.free_pages.len() + self.pages_total - self.pages_used;
        (in_classes + pages * self.page_bytes) as u64
    }

    /// Pages given to a class other than the one that last held them.
    #[inline]
    pub fn pages_moved(&self) -> u64 {
        self.pages_moved
    }

    /// Pages emptied by relocating their items (a write compares it
    /// before and after allocating to learn whether items moved).
    #[inline]
    pub fn pages_vacated(&self) -> u64 {
        self.pages_vacated
    }

    /// Items copied to another chunk to empty a page.
    #[inline]
    pub fn items_relocated(&self) -> u64 {
        self.items_relocated
    }

    /// Counts one item moved off a page being emptied.
    #[inline]
    pub fn count_relocated(&mut self) {
        self.items_relocated += 1;
    }

    /// Chunk size of a class, in bytes.
    #[cfg(test)]
    pub fn chunk_bytes(&self, class: usize) -> usize {
        self.classes[class].chunk_bytes
    }

    /// Page size in bytes.
    #[cfg(test)]
    pub fn page_bytes(&self) -> usize {
        self.page_bytes
    }

    /// Classes holding at least one page.
    #[cfg(test)]
    pub fn classes_with_pages(&self) -> impl Iterator<Item = usize> + '_ {
        (0..self.classes.len()).filter(|&c| self.classes[c].pages > 0)
    }

    /// Checks the per-page and per-class bookkeeping against the pages.
    #[cfg(test)]
    pub fn check(&self) {
        let mut pages = vec![0usize; self.classes.len()];
        let mut live = vec![0usize; self.classes.len()];
        for p in 0..self.pages_used {
            let class = self.pages[p].class;
            if class == NO_CLASS {
                assert!(
                    self.free_pages.contains(&(p as u32)),
                    "unowned page is free"
                );
                continue;
            }
            let class = usize::from(class);
            let c = &self.classes[class];
            pages[class] += 1;
            live[class] += self.pages[p].live as usize;
            assert!(self.pages[p].live > 0, "a page with no item is given back");
            let mut n = 0;
            let mut pos = self.pages[p].free;
            while pos != FREE_LIST_END {
                assert_eq!(pos as usize / self.page_bytes, p, "free chunk on its page");
                n += 1;
                pos = item::read_u64(&self.pool, pos as usize);
            }
            let uncarved = if c.carve_page == p as u32 {
                (c.carve_end - c.carve_pos) / c.chunk_bytes
            } else {
                0
            };
            assert_eq!(
                n + uncarved + self.pages[p].live as usize,
                c.chunks_per_page,
                "every chunk is live, free or uncarved"
            );
        }
        for (i, c) in self.classes.iter().enumerate() {
            assert_eq!((c.pages, c.live), (pages[i], live[i]), "class {i} counts");
            let mut p = c.partial_head;
            while p != NO_PAGE {
                assert_eq!(usize::from(self.pages[p as usize].class), i);
                assert_ne!(self.pages[p as usize].free, FREE_LIST_END);
                p = self.pages[p as usize].next;
            }
        }
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
        assert_eq!(s.free_bytes(), 0);
        // A page whose last item leaves is free for any class.
        s.free(got[3]);
        assert_eq!(s.free_bytes(), PAGE_BYTES_MIN as u64);
        assert_eq!(s.alloc(0), Some(got[3]));
        assert_eq!(s.pages_moved(), 1);
        assert_eq!(s.alloc(class), None);
        s.check();
    }

    #[test]
    fn a_freed_chunk_is_reused_first_and_stays_in_its_class() {
        let mut s = Slab::new(crate::pool::heap(64 << 10));
        let a = s.alloc(0).expect("chunk");
        let b = s.alloc(0).expect("chunk");
        s.free(a);
        assert_eq!(s.alloc(0), Some(a));
        s.free(a);
        assert_eq!(s.alloc(1).map(|p| p / PAGE_BYTES_MIN), Some(1), "own page");
        assert_eq!(s.alloc(0), Some(a));
        assert_eq!(s.class_of(b), 0);
        s.check();
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
