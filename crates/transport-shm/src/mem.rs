//! Shared mappings of memfd files: the only module with `unsafe` code.
//!
//! A [`Mapping`] is a `MAP_SHARED` view of a sealed memfd. Both processes
//! of a connection map the same file, so every access here may race with
//! the peer. The rules that keep that sound for *this* process:
//! - words the two sides coordinate on (ring heads and tails, lengths,
//!   wait flags) are read and written only as atomics;
//! - bulk bytes are copied with `copy_nonoverlapping` or lent out as
//!   `&[u8]`; any bit pattern is a valid `u8`, and every offset is bounds
//!   checked against the mapping's length here, so a peer that scribbles
//!   on shared memory can change the *values* this side sees but can never
//!   make it touch memory outside the mapping;
//! - the file is sealed against shrinking before the peer sees it (and the
//!   seal is checked on files received from a peer), so the mapping can
//!   never lose its pages under us (no `SIGBUS`).

use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, AtomicU64};

use rustix::fs::{MemfdFlags, SealFlags};
use rustix::mm::{MapFlags, ProtFlags};

/// A shared read-write mapping of a whole memfd.
pub(crate) struct Mapping {
    /// First byte of the mapping; page aligned.
    ptr: NonNull<u8>,
    /// Bytes mapped.
    len: usize,
}

// SAFETY: the mapping is plain memory owned by this value; it has no
// thread affinity. Shared access goes through `&self` methods that use
// atomics or raw copies, which are as thread-safe as the memory itself
// (the peer process races with us anyway; see the module docs).
unsafe impl Send for Mapping {}
// SAFETY: as above; `&Mapping` hands out only atomics, copies and `&[u8]`.
unsafe impl Sync for Mapping {}

impl Mapping {
    /// Creates a memfd of `len` bytes (zeroed), seals its size, and maps it.
    /// Returns the mapping and the file, to send to the peer.
    pub(crate) fn create(name: &str, len: usize) -> io::Result<(Mapping, OwnedFd)> {
        let len = len.max(1);
        let fd = rustix::fs::memfd_create(name, MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING)?;
        rustix::fs::ftruncate(&fd, len as u64)?;
        rustix::fs::fcntl_add_seals(&fd, SealFlags::SHRINK | SealFlags::GROW | SealFlags::SEAL)?;
        let m = Mapping::map(fd.as_fd(), len)?;
        Ok((m, fd))
    }

    /// Maps a memfd received from a peer, after checking that it cannot
    /// shrink under us and holds at least `len` bytes.
    pub(crate) fn open(fd: BorrowedFd<'_>, len: usize) -> io::Result<Mapping> {
        let len = len.max(1);
        let seals = rustix::fs::fcntl_get_seals(fd)?;
        if !seals.contains(SealFlags::SHRINK) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "shared memory from the peer is not sealed against shrinking",
            ));
        }
        let st = rustix::fs::fstat(fd)?;
        if (st.st_size as u64) < len as u64 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "shared memory from the peer has {} bytes, {len} expected",
                    st.st_size
                ),
            ));
        }
        Mapping::map(fd, len)
    }

    fn map(fd: BorrowedFd<'_>, len: usize) -> io::Result<Mapping> {
        // SAFETY: a fresh mapping at an address the kernel picks aliases no
        // Rust object; `len` bytes of the file exist (created or checked
        // by the callers) and cannot go away (size sealed).
        let p = unsafe {
            rustix::mm::mmap(
                std::ptr::null_mut(),
                len,
                ProtFlags::READ | ProtFlags::WRITE,
                MapFlags::SHARED,
                fd,
                0,
            )?
        };
        let ptr = NonNull::new(p.cast::<u8>())
            .ok_or_else(|| io::Error::other("mmap returned a null pointer"))?;
        Ok(Mapping { ptr, len })
    }

    /// Panics unless `off..off+len` lies in the mapping. Callers pass
    /// offsets they derived from validated values, so this never fires on
    /// hostile input; it is the last line of defence against a bug.
    #[inline]
    fn check(&self, off: usize, len: usize, align: usize) {
        assert!(
            off.checked_add(len).is_some_and(|end| end <= self.len) && off % align == 0,
            "shared memory access of {len} bytes at {off} outside a mapping of {} bytes",
            self.len
        );
    }

    /// The 64-bit word at `off` (8-byte aligned).
    #[inline]
    pub(crate) fn u64_at(&self, off: usize) -> &AtomicU64 {
        self.check(off, 8, 8);
        // SAFETY: in bounds and aligned (checked; the mapping is page
        // aligned); the memory lives as long as `&self`; `AtomicU64` has
        // the layout of `u64` and every bit pattern is valid.
        unsafe { &*self.ptr.as_ptr().add(off).cast::<AtomicU64>() }
    }

    /// The 32-bit word at `off` (4-byte aligned).
    #[inline]
    pub(crate) fn u32_at(&self, off: usize) -> &AtomicU32 {
        self.check(off, 4, 4);
        // SAFETY: as for `u64_at`.
        unsafe { &*self.ptr.as_ptr().add(off).cast::<AtomicU32>() }
    }

    /// Copies `data` into the mapping at `off`.
    #[inline]
    pub(crate) fn write(&self, off: usize, data: &[u8]) {
        self.check(off, data.len(), 1);
        // SAFETY: the destination is in bounds (checked) and cannot overlap
        // `data`, which is Rust-owned memory or a different part of a
        // mapping that the protocol keeps apart. No `&`-reference to these
        // bytes is live on this side: the ring protocol lends out only
        // records the producer does not write, and region views are
        // `&mut self` borrows of a different `Mapping`.
        unsafe {
            std::ptr::copy_nonoverlapping(data.as_ptr(), self.ptr.as_ptr().add(off), data.len())
        }
    }

    /// Copies bytes at `off` into `out`.
    #[inline]
    pub(crate) fn read(&self, off: usize, out: &mut [u8]) {
        self.check(off, out.len(), 1);
        // SAFETY: the source is in bounds (checked); `out` is an exclusive
        // Rust buffer and so cannot overlap the mapping's bytes.
        unsafe {
            std::ptr::copy_nonoverlapping(self.ptr.as_ptr().add(off), out.as_mut_ptr(), out.len())
        }
    }

    /// Lends `len` bytes at `off` (a received message, read in place).
    #[inline]
    pub(crate) fn slice(&self, off: usize, len: usize) -> &[u8] {
        self.check(off, len, 1);
        // SAFETY: in bounds (checked), alive as long as `&self`. This side
        // does not write these bytes while the borrow lives (they are a
        // published record the consumer has not released); a hostile peer
        // may, which can change the values read but not their validity.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr().add(off), len) }
    }

    /// A mutable view of `len` bytes at `off`, for building a one-sided
    /// write in place.
    #[inline]
    pub(crate) fn range_mut(&mut self, off: usize, len: usize) -> &mut [u8] {
        self.check(off, len, 1);
        // SAFETY: in bounds (checked); `&mut self` excludes every other view
        // through this value for the borrow's lifetime. The peer that
        // registered the region does not touch these bytes until the reply
        // that announces them arrives (the same contract as `write`); a
        // hostile peer may, which can change the bytes but not their
        // validity as plain `u8`s.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr().add(off), len) }
    }

    /// The owner's mutable view of the whole mapping.
    #[inline]
    pub(crate) fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: in bounds by construction; `&mut self` excludes every
        // other view through this value for the borrow's lifetime.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: `ptr`/`len` are exactly what mmap returned, and no borrow
        // of the memory outlives `self`.
        if let Err(e) = unsafe { rustix::mm::munmap(self.ptr.as_ptr().cast(), self.len) } {
            tracing::error!("munmap failed: {e}");
        }
    }
}
