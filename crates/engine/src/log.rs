//! Cache-mode value storage: a circular log over the pool (MICA).
//!
//! Items are appended at the head, named by a logical offset that only
//! grows; the physical position is `logical % capacity`. Appending reuses
//! the oldest bytes, so the log evicts in FIFO order with no per-item
//! bookkeeping besides the item headers. An item never wraps around the end
//! of the pool: if it does not fit before the end, the rest of the pool
//! becomes padding and the item starts at position 0.
//!
//! The log keeps a tail next to the head: everything in `tail..head` has
//! been written and not yet overwritten. Before the head advances over old
//! bytes, the tail walks them record by record (each header gives the
//! record's size), so that an item still indexed when it is overwritten has
//! its slot cleared and is counted as evicted (or expired) exactly once.
//! Deleted and replaced items stay in the log as dead records until the
//! head comes round.
//!
//! Index slots hold the low 48 bits of the logical offset. An offset is
//! turned back into a position by its distance behind the head, computed
//! modulo 2^48, so the index stays correct after the logical offset passes
//! 2^48.

use crate::pool::PoolMemory;
use fabrickv_types::KeyHash;

use crate::index::{pack, OFFSET_MASK};
use crate::item::{self, Header, FLAG_DEAD, FLAG_PADDING, ITEM_BYTES_MAX, ITEM_HEADER_BYTES};
use crate::partition::{Core, Storage};

/// The circular log.
pub(crate) struct Log {
    /// The pool; lazily zeroed by the OS at allocation.
    pool: PoolMemory,
    /// Usable bytes of the pool: its size rounded down to the alignment.
    capacity: usize,
    /// Logical offset of the next append.
    head: u64,
    /// Logical offset of the oldest record not yet walked over.
    tail: u64,
}

/// A record the tail walked over that was still an indexed item.
pub(crate) struct Overwritten {
    /// The item's logical offset.
    logical: u64,
    /// The item's position in the pool (still readable: the head has not
    /// written over it yet).
    pos: usize,
    /// The item's header.
    header: Header,
}

impl Log {
    /// An empty log over a fresh pool of `pool_bytes` bytes.
    pub fn new(pool: PoolMemory) -> Log {
        let pool_bytes = pool.len();
        Log {
            pool,
            capacity: item::align_down(pool_bytes),
            head: 0,
            tail: 0,
        }
    }

    /// Distance, in bytes, from an item's 48-bit offset back to the head.
    #[inline]
    pub fn age(&self, offset: u64) -> u64 {
        ((self.head & OFFSET_MASK).wrapping_sub(offset)) & OFFSET_MASK
    }

    /// Bytes between the head and the tail that are free to append into.
    #[inline]
    fn free_bytes(&self) -> usize {
        self.capacity - (self.head - self.tail) as usize
    }

    /// Padding needed before an item of `size` bytes so it does not wrap.
    #[inline]
    fn pad_before(&self, size: usize) -> usize {
        let at = (self.head % self.capacity as u64) as usize;
        if self.capacity - at < size {
            self.capacity - at
        } else {
            0
        }
    }

    /// Walks the tail over one record. Returns the item if it was a live
    /// (indexed) one; padding and dead items need no more than skipping.
    fn pop_tail(&mut self) -> Option<Overwritten> {
        debug_assert!(self.tail < self.head);
        let at = (self.tail % self.capacity as u64) as usize;
        let to_end = self.capacity - at;
        if to_end < ITEM_HEADER_BYTES {
            // Too short for a padding header: implicit padding.
            self.tail += to_end as u64;
            return None;
        }
        let header = item::read_header(&self.pool, at);
        if header.flags & FLAG_PADDING != 0 {
            self.tail += to_end as u64;
            return None;
        }
        let logical = self.tail;
        self.tail += header.item_bytes() as u64;
        // A record running past the head means the log is corrupt; every
        // count after this would be wrong, so stop here.
        assert!(self.tail <= self.head, "log record overruns the head");
        if header.flags & FLAG_DEAD != 0 {
            return None;
        }
        Some(Overwritten {
            logical,
            pos: at,
            header,
        })
    }

    /// Fills the rest of the pool with padding; the caller made room.
    fn push_padding(&mut self, pad: usize) {
        let at = (self.head % self.capacity as u64) as usize;
        debug_assert_eq!(at + pad, self.capacity);
        if pad >= ITEM_HEADER_BYTES {
            item::write_padding(&mut self.pool, at);
        }
        self.head += pad as u64;
    }

    /// Claims `size` bytes at the head; the caller made room.
    fn push(&mut self, size: usize) -> (u64, usize) {
        let logical = self.head;
        let at = (logical % self.capacity as u64) as usize;
        debug_assert!(at + size <= self.capacity && size <= self.free_bytes());
        self.head += size as u64;
        (logical, at)
    }

    /// Records in the window, for tests: (logical, header) of each item.
    #[cfg(test)]
    pub fn window(&self) -> Vec<(u64, Header)> {
        let mut out = Vec::new();
        let mut cur = self.tail;
        while cur < self.head {
            let at = (cur % self.capacity as u64) as usize;
            let to_end = self.capacity - at;
            if to_end < ITEM_HEADER_BYTES {
                cur += to_end as u64;
                continue;
            }
            let h = item::read_header(&self.pool, at);
            if h.flags & FLAG_PADDING != 0 {
                cur += to_end as u64;
                continue;
            }
            out.push((cur, h));
            cur += h.item_bytes() as u64;
        }
        assert_eq!(cur, self.head, "records tile the window exactly");
        out
    }
}

impl Storage for Log {
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
        let age = self.age(offset);
        if age == 0 || age > self.head - self.tail {
            return None;
        }
        Some(((self.head - age) % self.capacity as u64) as usize)
    }

    #[inline]
    fn release(&mut self, pos: usize) {
        // The bytes stay until the head comes round; the flag stops the
        // tail walk from counting the item again.
        item::add_flags(&mut self.pool, pos, FLAG_DEAD);
    }

    fn max_item_bytes(&self) -> usize {
        self.capacity.min(ITEM_BYTES_MAX)
    }
}

impl Core<Log> {
    /// Claims `size` bytes at the head of the log, walking the tail over
    /// whatever the new bytes overwrite. Returns (logical offset, position).
    pub(crate) fn log_append(&mut self, size: usize, now_ms: u64) -> (u64, usize) {
        debug_assert!(size <= self.storage.max_item_bytes());
        let pad = self.storage.pad_before(size);
        if pad > 0 {
            self.log_make_room(pad, now_ms);
            self.storage.push_padding(pad);
        }
        self.log_make_room(size, now_ms);
        self.storage.push(size)
    }

    /// Walks the tail until `size` bytes are free at the head.
    fn log_make_room(&mut self, size: usize, now_ms: u64) {
        while self.storage.free_bytes() < size {
            if let Some(gone) = self.storage.pop_tail() {
                self.retire_overwritten(&gone, now_ms);
            }
        }
    }

    /// Drops an indexed item the log is about to overwrite from the index
    /// and the counters.
    fn retire_overwritten(&mut self, gone: &Overwritten, now_ms: u64) {
        let hash = KeyHash(gone.header.hash);
        let entry = pack(hash.tag(), gone.logical & OFFSET_MASK);
        let main = self.index.main_bucket(hash);
        match self.index.find_entry(main, entry) {
            Some(at) => {
                self.versions.bump(hash);
                self.index.clear(at, main);
            }
            None => debug_assert!(false, "live log item is not indexed"),
        }
        self.uncount(gone.pos, &gone.header);
        if gone.header.is_expired(now_ms) {
            self.stats.expired += 1;
        } else {
            self.stats.evictions += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resolve_tracks_the_window() {
        let mut log = Log::new(crate::pool::heap(1024));
        let (l0, p0) = log.push(100 & !7);
        assert_eq!((l0, p0), (0, 0));
        assert_eq!(log.resolve(0), Some(0));
        // An offset at or past the head is not a record.
        assert_eq!(log.resolve(log.head & OFFSET_MASK), None);
        assert_eq!(log.resolve(5000), None);
    }

    #[test]
    fn age_wraps_modulo_offset_bits() {
        let mut log = Log::new(crate::pool::heap(1024));
        log.head = (1 << 48) + 16;
        log.tail = log.head - 512;
        // Logical (1 << 48) - 8 is stored as (1 << 48) - 8 in a slot.
        let logical: u64 = (1 << 48) - 8;
        assert_eq!(log.age(logical & OFFSET_MASK), 24);
        assert_eq!(
            log.resolve(logical & OFFSET_MASK),
            Some((logical % 1024) as usize)
        );
    }

    #[test]
    fn padding_keeps_items_whole() {
        let mut log = Log::new(crate::pool::heap(1000));
        assert_eq!(log.capacity, 1000);
        let (_, p) = log.push(984);
        assert_eq!(p, 0);
        log.tail = log.head; // pretend everything was walked
                             // 16 bytes remain: too short for a header, so padding is implicit.
        assert_eq!(log.pad_before(24), 16);
        log.push_padding(16);
        let (l, p) = log.push(24);
        assert_eq!((l, p), (1000, 0));
    }
}
