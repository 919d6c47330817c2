//! The value pool: one anonymous mapping that holds every value's bytes.
//!
//! Values are written by put slots and read by leases outside the store's
//! lock, from several threads at once, each on its own block. Rust's
//! borrow rules cannot express "disjoint ranges handed out and taken back
//! at run time by an allocator", so the pool is a raw mapping and the two
//! ways into it are `unsafe fn`s whose contract is exactly the store's
//! block ownership rule (see `store.rs`).

use crate::alloc::CACHE_BLOCK_ALIGN_BYTES;
use crate::CacheError;

/// Bytes of a base page: the stride at which `populate` touches the pool.
pub const PAGE_BYTES: usize = 4096;

/// The pool's memory.
#[derive(Debug)]
pub(crate) struct Pool {
    map: memmap2::MmapRaw,
}

impl Pool {
    /// Maps `bytes` of anonymous, zeroed memory, asking for transparent huge
    /// pages (fewer TLB misses when multi-MiB values are copied), and with
    /// `populate` faults every page in now so the first puts pay no faults.
    pub fn new(bytes: usize, populate: bool) -> Result<Pool, CacheError> {
        let mut map = memmap2::MmapOptions::new()
            .len(bytes)
            .map_anon()
            .map_err(|e| CacheError::Internal(format!("cannot map a {bytes}-byte pool: {e}")))?;
        // Advice only, given before any page is faulted in so the kernel can
        // back the range with huge pages from the start; a kernel without
        // THP in `madvise` mode ignores or refuses it, and the pool works
        // the same with base pages, so a refusal is not an error.
        let _ = map.advise(memmap2::Advice::HugePage);
        if populate {
            // Touching (rather than MAP_POPULATE) so that the huge page
            // advice above applies to the faults.
            for page in map.chunks_mut(PAGE_BYTES) {
                if let Some(b) = page.first_mut() {
                    *b = 0;
                }
            }
        }
        Ok(Pool {
            map: memmap2::MmapRaw::from(map),
        })
    }

    /// The pool's length in bytes.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// Whether `offset..offset + len` lies inside the pool.
    fn in_bounds(&self, offset: usize, len: usize) -> bool {
        offset
            .checked_add(len)
            .is_some_and(|end| end <= self.map.len())
    }

    /// The bytes `offset..offset + len`, or an empty slice when the range is
    /// not inside the pool (a store bug; reading nothing is safer than
    /// reading out of bounds).
    ///
    /// # Safety
    /// No `&mut` to any byte of the range may exist or be created while the
    /// returned slice lives: the range must belong to a committed entry
    /// (which nobody writes) held by a lease (so it is not freed and handed
    /// to a writer).
    #[allow(unsafe_code)]
    pub unsafe fn bytes(&self, offset: usize, len: usize) -> &[u8] {
        if !self.in_bounds(offset, len) {
            return &[];
        }
        debug_assert_eq!(offset % CACHE_BLOCK_ALIGN_BYTES, 0);
        // SAFETY: the range is inside the mapping (checked above), which
        // stays mapped while `self` lives; its bytes are initialized (an
        // anonymous mapping starts zeroed); and the caller guarantees no
        // writer of the range while the slice lives.
        unsafe { std::slice::from_raw_parts(self.map.as_ptr().add(offset), len) }
    }

    /// The bytes `offset..offset + len` for writing, or an empty slice when
    /// the range is not inside the pool.
    ///
    /// # Safety
    /// No other reference to any byte of the range may exist or be created
    /// while the returned slice lives: the range must be a block allocated
    /// to exactly one put slot, which is the only caller for that range.
    #[allow(unsafe_code)]
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn bytes_mut(&self, offset: usize, len: usize) -> &mut [u8] {
        if !self.in_bounds(offset, len) {
            return &mut [];
        }
        debug_assert_eq!(offset % CACHE_BLOCK_ALIGN_BYTES, 0);
        // SAFETY: in bounds and initialized as in `bytes`; the pointer comes
        // from the mapping (not from a shared reference), and the caller
        // guarantees the range is exclusively its own while the slice lives.
        unsafe { std::slice::from_raw_parts_mut(self.map.as_mut_ptr().add(offset), len) }
    }
}
