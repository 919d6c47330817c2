//! A snapshot of the store's occupancy and counters.

/// A snapshot of the store, taken under its lock so the numbers agree with
/// each other. Byte counts are of the pool; counters run since creation.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CacheStats {
    /// Keys with a visible value.
    pub entries: u64,
    /// Bytes of the pool under management (`pool_bytes` rounded down to
    /// whole blocks).
    pub pool_bytes: u64,
    /// Bytes in allocated blocks, rounding included: visible values,
    /// uncommitted reservations and unlinked values still leased.
    pub used_bytes: u64,
    /// Sum of the visible values' lengths (what clients stored).
    pub value_bytes: u64,
    /// Bytes in free blocks (`pool_bytes - used_bytes`).
    pub free_bytes: u64,
    /// The largest free block: the biggest value placeable without freeing.
    pub largest_free_bytes: u64,
    /// `1 - largest_free_bytes / free_bytes`, 0 when nothing is free: 0 is
    /// one contiguous free block, near 1 is free space in useless crumbs.
    pub fragmentation: f64,
    /// Free blocks (1 for an empty pool).
    pub free_blocks: u64,
    /// Entries (visible or unlinked) held by at least one lease.
    pub leased_entries: u64,
    /// Bytes of unlinked entries waiting for their last lease to drop.
    pub pending_free_bytes: u64,
    /// Bytes held by reservations not yet committed or dropped.
    pub reserved_bytes: u64,
    /// Gets that found a live value.
    pub hits: u64,
    /// Gets that found nothing (or an expired value).
    pub misses: u64,
    /// Committed values.
    pub puts: u64,
    /// Deletes that removed a live value.
    pub deletes: u64,
    /// Entries removed by LRU eviction.
    pub evictions: u64,
    /// Entries removed because their TTL had passed (lazily or by `expire`).
    pub expirations: u64,
    /// Reservations refused with `CacheError::Full`.
    pub full_errors: u64,
}
