//! The memory behind a partition's pool, and the DRAM knobs of PetPS.
//!
//! By default a pool is a zeroed heap allocation: the OS hands out zero
//! pages lazily, so untouched parts of a large pool cost nothing. A server
//! that wants its memory resident and predictable (a parameter server
//! holding every embedding, as PetPS does) asks for an anonymous mapping
//! instead, with any of:
//! - `populate`: fault every page in at start (by touching each page, so
//!   that transparent huge pages, asked for with `madvise`, can back it),
//!   so the first pass over the data pays no page faults;
//! - `lock`: `mlock` the pool, so it is never swapped out;
//! - `zero`: write every byte once at start (PetPS's memset), which also
//!   faults pages in where `MAP_POPULATE` is not honoured;
//! - `hugepages`: back the pool with 2 MiB pages (`MAP_HUGETLB`), fewer TLB
//!   misses for random lookups; needs pages reserved in
//!   `/proc/sys/vm/nr_hugepages`.
//!
//! Each failure names the knob that caused it and the way out.

use std::fmt;
use std::ops::{Deref, DerefMut};

/// Bytes of a base page, the stride of the populate pass.
pub const PAGE_BYTES: usize = 4096;

/// log2 of the huge page size asked for with `hugepages` (2 MiB).
pub const HUGE_PAGE_SHIFT: u8 = 21;

/// How a pool's memory is obtained.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct PoolOptions {
    /// Back the pool with 2 MiB huge pages.
    pub hugepages: bool,
    /// Fault every page in when the pool is created.
    pub populate: bool,
    /// Lock the pool in RAM.
    pub lock: bool,
    /// Write zeros over the whole pool when it is created.
    pub zero: bool,
}

impl PoolOptions {
    /// Whether any knob asks for more than a lazily zeroed allocation.
    pub fn is_lazy(&self) -> bool {
        *self == PoolOptions::default()
    }
}

/// Why a pool's memory could not be had.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolError(pub String);

impl fmt::Display for PoolError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for PoolError {}

enum Backing {
    Heap(Vec<u8>),
    Mapped(memmap2::MmapMut),
}

/// A pool's bytes: zeroed, exactly the length asked for.
pub struct PoolMemory {
    backing: Backing,
}

impl fmt::Debug for PoolMemory {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = match self.backing {
            Backing::Heap(_) => "heap",
            Backing::Mapped(_) => "mapped",
        };
        write!(f, "PoolMemory({kind}, {} bytes)", self.len())
    }
}

impl PoolMemory {
    /// Obtains `bytes` zeroed bytes as `opts` asks.
    pub fn new(bytes: usize, opts: &PoolOptions) -> Result<PoolMemory, PoolError> {
        if opts.is_lazy() {
            return Ok(PoolMemory {
                backing: Backing::Heap(vec![0; bytes]),
            });
        }
        let mut o = memmap2::MmapOptions::new();
        o.len(bytes.max(1));
        if opts.hugepages {
            o.huge(Some(HUGE_PAGE_SHIFT));
        }
        let mut map = o.map_anon().map_err(|e| {
            if opts.hugepages {
                PoolError(format!(
                    "cannot map {bytes} bytes of 2 MiB huge pages: {e} (reserve pages in \
                     /proc/sys/vm/nr_hugepages, or drop the hugepages option)"
                ))
            } else {
                PoolError(format!("cannot map {bytes} bytes: {e}"))
            }
        })?;
        if !opts.hugepages {
            // Transparent huge pages where the kernel offers them on
            // request (`madvise` mode): a pool read at random then misses
            // the TLB far less. Advice only; a kernel without THP ignores
            // it. Given before any page is faulted in, which is why
            // populate is done by touching below and not by MAP_POPULATE.
            let _ = map.advise(memmap2::Advice::HugePage);
        }
        if opts.populate && !opts.zero {
            for page in map.chunks_mut(PAGE_BYTES) {
                page[0] = 0;
            }
        }
        if opts.lock {
            map.lock().map_err(|e| {
                PoolError(format!(
                    "cannot lock {bytes} bytes in RAM: {e} (raise `ulimit -l` / \
                     RLIMIT_MEMLOCK, or skip mlock)"
                ))
            })?;
        }
        if opts.zero {
            map.fill(0);
        }
        Ok(PoolMemory {
            backing: Backing::Mapped(map),
        })
    }
}

impl Deref for PoolMemory {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        match &self.backing {
            Backing::Heap(v) => v,
            Backing::Mapped(m) => m,
        }
    }
}

impl DerefMut for PoolMemory {
    fn deref_mut(&mut self) -> &mut [u8] {
        match &mut self.backing {
            Backing::Heap(v) => v,
            Backing::Mapped(m) => m,
        }
    }
}

/// A lazily zeroed pool of `bytes`, for tests.
#[cfg(test)]
pub(crate) fn heap(bytes: usize) -> PoolMemory {
    PoolMemory {
        backing: Backing::Heap(vec![0; bytes]),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_knob_gives_zeroed_memory_of_the_asked_length() {
        for (populate, lock, zero) in [
            (false, false, false),
            (true, false, false),
            (false, false, true),
            (true, true, true),
        ] {
            let opts = PoolOptions {
                hugepages: false,
                populate,
                lock,
                zero,
            };
            let mut m = match PoolMemory::new(1 << 20, &opts) {
                Ok(m) => m,
                // mlock can be refused by RLIMIT_MEMLOCK; that refusal must
                // name its cause.
                Err(e) if lock => {
                    assert!(e.0.contains("lock"), "{e}");
                    continue;
                }
                Err(e) => panic!("{opts:?}: {e}"),
            };
            assert_eq!(m.len(), 1 << 20);
            assert!(m.iter().all(|b| *b == 0));
            m[12345] = 7;
            assert_eq!(m[12345], 7);
        }
    }

    #[test]
    fn hugepages_succeed_or_say_how_to_get_them() {
        let opts = PoolOptions {
            hugepages: true,
            ..PoolOptions::default()
        };
        match PoolMemory::new(4 << 20, &opts) {
            Ok(m) => assert_eq!(m.len(), 4 << 20),
            Err(e) => assert!(e.0.contains("nr_hugepages"), "{e}"),
        }
    }
}
