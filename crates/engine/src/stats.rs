//! Per-partition counters.
//!
//! The worker that owns a partition reads them with [`crate::Partition::stats`]
//! and sums partitions for `STATS`; plain integers suffice because a
//! partition is never shared between threads.

/// Counters of one partition. Operation counters only grow; `items` and
/// `bytes` describe what is stored now.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PartitionStats {
    /// GET calls (`hits + misses`).
    pub gets: u64,
    /// GETs that returned a value.
    pub hits: u64,
    /// GETs that found nothing live (absent, evicted or expired).
    pub misses: u64,
    /// PUTs that stored a value.
    pub puts: u64,
    /// DELETEs that removed a live item.
    pub deletes: u64,
    /// Cache mode: live items overwritten by the circular log before they
    /// expired or were deleted. Always 0 in store mode.
    pub evictions: u64,
    /// Items reclaimed because their TTL passed: on access, by the sweep,
    /// or (cache mode) when the log overwrote them.
    pub expired: u64,
    /// Items stored now (indexed, including expired ones not yet reclaimed).
    pub items: u64,
    /// Key plus value bytes of the items stored now.
    pub bytes: u64,
    /// Size of the partition's value pool, in bytes.
    pub pool_bytes: u64,
    /// Cache mode: items dropped from the index because their bucket was
    /// full (MICA's lossy index). Always 0 in store mode.
    pub index_collisions: u64,
    /// Large values (over 1 MiB, outside the pool) stored now; each is
    /// also one of `items`.
    pub large_values: u64,
    /// Bytes of the large values stored now (also counted in `bytes`).
    pub large_bytes: u64,
    /// Bytes of large values no longer stored that a reader still holds
    /// (a RESP reply being written, a GET_CHUNK pin): counted in the
    /// budget with `large_bytes` until the reader lets go.
    pub large_pinned_bytes: u64,
    /// The budget of `large_bytes` plus `large_pinned_bytes`, in bytes.
    pub large_bytes_max: u64,
    /// Store mode: pages of the pool given to a size class other than the
    /// one that last held them (emptied by their last delete or by
    /// relocating their items). Always 0 in cache mode.
    pub slab_pages_moved: u64,
    /// Store mode: items copied to another chunk of their class so that
    /// their page could go to another class. Always 0 in cache mode.
    pub slab_items_relocated: u64,
    /// Store mode: bytes of the pool free for new items (free chunks of
    /// every class and pages no class holds), in bytes. A write is refused
    /// only while this is below its chunk plus
    /// `REFUSAL_SLACK_PAGES_PER_CLASS` pages per other class holding pages.
    /// Always 0 in cache mode, whose log reuses its oldest bytes.
    pub slab_free_bytes: u64,
}

impl PartitionStats {
    /// Adds another partition's counters to these (for per-server totals).
    pub fn add(&mut self, other: &PartitionStats) {
        self.gets += other.gets;
        self.hits += other.hits;
        self.misses += other.misses;
        self.puts += other.puts;
        self.deletes += other.deletes;
        self.evictions += other.evictions;
        self.expired += other.expired;
        self.items += other.items;
        self.bytes += other.bytes;
        self.pool_bytes += other.pool_bytes;
        self.index_collisions += other.index_collisions;
        self.large_values += other.large_values;
        self.large_bytes += other.large_bytes;
        self.large_pinned_bytes += other.large_pinned_bytes;
        self.large_bytes_max += other.large_bytes_max;
        self.slab_pages_moved += other.slab_pages_moved;
        self.slab_items_relocated += other.slab_items_relocated;
        self.slab_free_bytes += other.slab_free_bytes;
    }

    /// Share of GETs that missed, in 0.0..=1.0 (0.0 before any GET).
    pub fn miss_ratio(&self) -> f64 {
        if self.gets == 0 {
            0.0
        } else {
            self.misses as f64 / self.gets as f64
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn add_and_ratio() {
        let a = PartitionStats {
            gets: 4,
            misses: 1,
            items: 2,
            pool_bytes: 10,
            ..Default::default()
        };
        let mut t = PartitionStats::default();
        assert_eq!(t.miss_ratio(), 0.0);
        t.add(&a);
        t.add(&a);
        assert_eq!((t.gets, t.misses, t.items, t.pool_bytes), (8, 2, 4, 20));
        assert_eq!(t.miss_ratio(), 0.25);
    }
}
