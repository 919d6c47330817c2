//! Reading a scan's separated values from the blob files in large reads.
//!
//! fjall resolves each separated value on its own: one `pread` of the blob,
//! its checksum, and a block-cache lookup and insert. A full scan of a
//! shard of 256-byte values spent half its time in those `pread`s. A range
//! scan visits keys in order, and a blob file holds its values in key
//! order (flushes, compactions and bulk loads all write them sorted), so
//! the values a scan needs from one file lie one after another. This
//! reader keeps a window of each blob file in memory and refills it with
//! one read that grows while the scan moves forward through the file, so
//! a sequential scan pays one system call per window instead of one per
//! value. The pages it has read are dropped behind it
//! (`POSIX_FADV_DONTNEED`): a scan reads each value once.
//!
//! It reads lsm-tree 3.1's blob layout, which the crate does not export;
//! the workspace pins that version. Every blob is checked as the engine
//! checks it (magic, key, xxh3-128 of key and value), so a layout change
//! or a damaged file is an error, never a wrong value. A compressed blob
//! is not decoded here: [`BlobReader::value`] says so and the caller asks
//! the engine for it.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use crate::{Result, StorageError, SHARD_VALUE_BYTES_MAX};

/// Magic bytes that open every blob.
const BLOB_MAGIC: &[u8; 4] = b"BLOB";

/// Bytes of a blob's header: magic 4, checksum 16, sequence number 8, key
/// length 2, value length 4, stored value length 4; the key and the
/// stored value follow.
const BLOB_HEADER_BYTES: usize = 4 + 16 + 8 + 2 + 4 + 4;

/// First read of a file, and of a file the scan jumped backwards in, in
/// bytes.
const BLOB_READAHEAD_BYTES_MIN: usize = 16 << 10;

/// Largest window kept for one blob file, in bytes: each forward refill
/// doubles the read up to this.
const BLOB_READAHEAD_BYTES_MAX: usize = 512 << 10;

/// Blob files a reader keeps open with a window (the least recently used
/// is dropped beyond this), so one reader holds at most
/// `BLOB_FILES_OPEN_MAX * BLOB_READAHEAD_BYTES_MAX` bytes of windows.
const BLOB_FILES_OPEN_MAX: usize = 16;

/// Where a separated value lives: the index's entry for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct BlobHandle {
    /// The blob file's id (its name in the blobs folder).
    pub file: u64,
    /// Offset of the blob's header in the file.
    pub offset: u64,
    /// Bytes of the value as stored.
    pub stored_len: u32,
    /// Bytes of the value.
    pub len: u32,
}

/// Reads an unsigned LEB128 varint of at most `max_bytes` bytes.
fn varint(buf: &mut &[u8], max_bytes: usize) -> Option<u64> {
    let mut v = 0u64;
    for i in 0..max_bytes {
        let (&b, rest) = buf.split_first()?;
        *buf = rest;
        v |= u64::from(b & 0x7f) << (7 * i);
        if b & 0x80 == 0 {
            return Some(v);
        }
    }
    None
}

impl BlobHandle {
    /// Decodes an index entry's value: varints of the offset, the file id,
    /// the stored length and the value's length.
    pub fn decode(raw: &[u8]) -> Result<BlobHandle> {
        let mut buf = raw;
        let handle = (|| {
            let offset = varint(&mut buf, 10)?;
            let file = varint(&mut buf, 10)?;
            let stored_len = u32::try_from(varint(&mut buf, 5)?).ok()?;
            let len = u32::try_from(varint(&mut buf, 5)?).ok()?;
            Some(BlobHandle {
                file,
                offset,
                stored_len,
                len,
            })
        })();
        handle.ok_or_else(|| {
            StorageError::Engine(format!(
                "an index entry that is not a blob handle ({} bytes)",
                raw.len()
            ))
        })
    }

    /// Bytes of the whole blob for a key of `key_len` bytes.
    fn blob_bytes(&self, key_len: usize) -> usize {
        BLOB_HEADER_BYTES + key_len + self.stored_len as usize
    }
}

/// One open blob file and the bytes of it read last.
struct Window {
    file_id: u64,
    file: File,
    /// File offset of `buf[0]`.
    start: u64,
    /// Bytes of `buf` read from the file (it is only grown, so a refill
    /// does not zero it again).
    valid: usize,
    buf: Vec<u8>,
    /// Bytes of the next refill.
    readahead: usize,
    /// When it was last used, for eviction.
    used: u64,
}

/// Reads the values a scan visits, a window per blob file.
pub(crate) struct BlobReader {
    dir: PathBuf,
    windows: Vec<Window>,
    /// A value larger than a window is read here, and freed when the
    /// next value fits a window.
    large: Vec<u8>,
    clock: u64,
}

impl BlobReader {
    /// A reader of the blob files in `dir`.
    pub fn new(dir: PathBuf) -> BlobReader {
        BlobReader {
            dir,
            windows: Vec::new(),
            large: Vec::new(),
            clock: 0,
        }
    }

    /// The value of `key` stored at `handle`, checked; `None` when the blob
    /// is compressed (the engine decodes it).
    pub fn value(&mut self, key: &[u8], handle: &BlobHandle) -> Result<Option<&[u8]>> {
        if handle.stored_len as usize > SHARD_VALUE_BYTES_MAX {
            // No shard stores such a value: a damaged index, and reading
            // it would allocate what the handle claims.
            return Err(StorageError::Engine(format!(
                "blob file {} at offset {}: a handle claims {} bytes",
                handle.file, handle.offset, handle.stored_len
            )));
        }
        let need = handle.blob_bytes(key.len());
        let blob: &[u8] = if need > BLOB_READAHEAD_BYTES_MAX {
            self.read_large(handle, need)?
        } else {
            if self.large.capacity() > 0 {
                self.large = Vec::new();
            }
            self.read_windowed(handle, need)?
        };
        parse(blob, key, handle)
    }

    fn read_large(&mut self, handle: &BlobHandle, need: usize) -> Result<&[u8]> {
        let w = window(&mut self.windows, &mut self.clock, &self.dir, handle.file)?;
        self.large.resize(need, 0);
        let got = read_full(&w.file, &mut self.large, handle.offset)
            .map_err(|source| io_error(&self.dir, handle, source))?;
        if got < need {
            return Err(truncated(handle));
        }
        if let Some(len) = std::num::NonZeroU64::new(got as u64) {
            // Read once, as a window is (see `Window::drop_behind`).
            let _ = rustix::fs::fadvise(
                &w.file,
                handle.offset,
                Some(len),
                rustix::fs::Advice::DontNeed,
            );
        }
        Ok(&self.large)
    }

    fn read_windowed(&mut self, handle: &BlobHandle, need: usize) -> Result<&[u8]> {
        let w = window(&mut self.windows, &mut self.clock, &self.dir, handle.file)?;
        let end = w.start + w.valid as u64;
        let inside = handle.offset >= w.start && handle.offset.saturating_add(need as u64) <= end;
        if !inside {
            // Forward of the window: the scan is moving through the file,
            // read further ahead next time; anywhere else, start small.
            w.readahead = if handle.offset >= w.start && w.valid > 0 {
                (w.readahead * 2).min(BLOB_READAHEAD_BYTES_MAX)
            } else {
                BLOB_READAHEAD_BYTES_MIN
            };
            w.drop_behind();
            let len = w.readahead.max(need);
            if w.buf.len() < len {
                w.buf.resize(len, 0);
            }
            let got = read_full(&w.file, &mut w.buf[..len], handle.offset)
                .map_err(|source| io_error(&self.dir, handle, source))?;
            w.start = handle.offset;
            w.valid = got;
            if got < need {
                return Err(truncated(handle));
            }
        }
        let at = (handle.offset - w.start) as usize;
        Ok(&w.buf[at..at + need])
    }
}

impl Window {
    /// Tells the kernel that the bytes of the window will not be read
    /// again, so their pages are the first to go: a scan reads each blob
    /// once, and on a shard larger than memory the pages it leaves behind
    /// would push out the ones still ahead of it and everything else
    /// (a 10 GB copy beside its target ran 10-15% faster with this).
    fn drop_behind(&mut self) {
        if let Some(len) = std::num::NonZeroU64::new(self.valid as u64) {
            // Advice only: if the kernel declines, the pages stay cached.
            let _ = rustix::fs::fadvise(
                &self.file,
                self.start,
                Some(len),
                rustix::fs::Advice::DontNeed,
            );
        }
        self.valid = 0;
    }
}

impl Drop for BlobReader {
    fn drop(&mut self) {
        for w in &mut self.windows {
            w.drop_behind();
        }
    }
}

/// The window of blob file `id` in `windows`, opening the file in `dir`
/// (and dropping the least recently used window) if it has none.
fn window<'w>(
    windows: &'w mut Vec<Window>,
    clock: &mut u64,
    dir: &Path,
    id: u64,
) -> Result<&'w mut Window> {
    *clock += 1;
    let i = match windows.iter().position(|w| w.file_id == id) {
        Some(i) => i,
        None => {
            let path = dir.join(id.to_string());
            let file = File::open(&path).map_err(|source| StorageError::Io {
                what: format!("opening blob file {}", path.display()),
                source,
            })?;
            let w = Window {
                file_id: id,
                file,
                start: 0,
                valid: 0,
                buf: Vec::new(),
                readahead: BLOB_READAHEAD_BYTES_MIN,
                used: *clock,
            };
            if windows.len() >= BLOB_FILES_OPEN_MAX {
                let lru = (0..windows.len())
                    .min_by_key(|&i| windows[i].used)
                    .unwrap_or(0);
                windows[lru].drop_behind();
                windows[lru] = w;
                lru
            } else {
                windows.push(w);
                windows.len() - 1
            }
        }
    };
    let w = &mut windows[i];
    w.used = *clock;
    Ok(w)
}

fn io_error(dir: &Path, handle: &BlobHandle, source: std::io::Error) -> StorageError {
    StorageError::Io {
        what: format!(
            "reading blob file {}",
            dir.join(handle.file.to_string()).display()
        ),
        source,
    }
}

/// Reads into all of `buf` from `offset`, stopping early only at the end
/// of the file; returns the bytes read.
fn read_full(file: &File, buf: &mut [u8], offset: u64) -> std::io::Result<usize> {
    let mut got = 0;
    while got < buf.len() {
        match file.read_at(&mut buf[got..], offset.saturating_add(got as u64)) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(got)
}

fn truncated(handle: &BlobHandle) -> StorageError {
    StorageError::Engine(format!(
        "blob file {} ends inside the blob at offset {}",
        handle.file, handle.offset
    ))
}

/// Checks one blob (`blob` is exactly its bytes) against the key and the
/// handle that point at it, and returns its value.
fn parse<'b>(blob: &'b [u8], key: &[u8], handle: &BlobHandle) -> Result<Option<&'b [u8]>> {
    let bad = |what: &str| {
        StorageError::Engine(format!(
            "blob file {} at offset {}: {what}",
            handle.file, handle.offset
        ))
    };
    let (header, rest) = blob.split_at(BLOB_HEADER_BYTES);
    if &header[..4] != BLOB_MAGIC {
        return Err(bad("no blob header"));
    }
    let le32 = |at: usize| {
        u32::from_le_bytes([header[at], header[at + 1], header[at + 2], header[at + 3]])
    };
    let mut checksum = [0u8; 16];
    checksum.copy_from_slice(&header[4..20]);
    let checksum = u128::from_le_bytes(checksum);
    let key_len = usize::from(u16::from_le_bytes([header[28], header[29]]));
    let value_len = le32(30);
    let stored_len = le32(34);
    if key_len != key.len() || stored_len != handle.stored_len {
        return Err(bad("lengths differ from the index's"));
    }
    let (blob_key, stored) = rest.split_at(key_len);
    if blob_key != key {
        return Err(bad("the blob belongs to another key"));
    }
    // The checksum covers the key and the stored value, which lie end to
    // end: one call over both.
    if xxhash_rust::xxh3::xxh3_128(rest) != checksum {
        return Err(bad("checksum mismatch"));
    }
    if value_len != stored_len || value_len != handle.len {
        return Ok(None);
    }
    Ok(Some(stored))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn leb(mut v: u64, out: &mut Vec<u8>) {
        loop {
            let b = (v & 0x7f) as u8;
            v >>= 7;
            if v == 0 {
                out.push(b);
                return;
            }
            out.push(b | 0x80);
        }
    }

    #[test]
    fn handles_decode_and_bad_ones_are_errors() {
        let mut raw = Vec::new();
        for v in [1u64 << 40, 7, 300, 300] {
            leb(v, &mut raw);
        }
        assert_eq!(
            BlobHandle::decode(&raw).ok(),
            Some(BlobHandle {
                file: 7,
                offset: 1 << 40,
                stored_len: 300,
                len: 300
            })
        );
        assert!(BlobHandle::decode(&raw[..raw.len() - 1]).is_err());
        assert!(BlobHandle::decode(&[0xff; 12]).is_err());
        assert!(BlobHandle::decode(&[]).is_err());
    }

    fn blob(key: &[u8], value: &[u8]) -> Vec<u8> {
        let mut h = xxhash_rust::xxh3::Xxh3::new();
        h.update(key);
        h.update(value);
        let mut b = BLOB_MAGIC.to_vec();
        b.extend_from_slice(&h.digest128().to_le_bytes());
        b.extend_from_slice(&9u64.to_le_bytes());
        b.extend_from_slice(&(key.len() as u16).to_le_bytes());
        b.extend_from_slice(&(value.len() as u32).to_le_bytes());
        b.extend_from_slice(&(value.len() as u32).to_le_bytes());
        b.extend_from_slice(key);
        b.extend_from_slice(value);
        b
    }

    #[test]
    fn reads_across_windows_and_refuses_damage() {
        let dir = tempfile::tempdir().expect("tempdir");
        // Values big enough that the file spans several windows, and one
        // larger than any window.
        let mut file = Vec::new();
        let mut handles = Vec::new();
        for i in 0..400u32 {
            let key = i.to_be_bytes();
            let len = if i == 200 {
                BLOB_READAHEAD_BYTES_MAX + 5
            } else {
                3000
            };
            let value = vec![(i % 251) as u8; len];
            let h = BlobHandle {
                file: 3,
                offset: file.len() as u64,
                stored_len: len as u32,
                len: len as u32,
            };
            file.extend_from_slice(&blob(&key, &value));
            handles.push((key, value, h));
        }
        std::fs::write(dir.path().join("3"), &file).expect("write");
        let mut r = BlobReader::new(dir.path().to_path_buf());
        for (key, value, h) in &handles {
            assert_eq!(r.value(key, h).expect("read"), Some(&value[..]));
        }
        // Backwards, too.
        for (key, value, h) in handles.iter().rev().step_by(7) {
            assert_eq!(r.value(key, h).expect("read"), Some(&value[..]));
        }
        let (key, _, h) = &handles[5];
        assert!(r.value(b"another", h).is_err(), "a wrong key must fail");
        let past = BlobHandle {
            offset: file.len() as u64 - 10,
            ..*h
        };
        assert!(r.value(key, &past).is_err(), "a truncated blob must fail");
        let far = BlobHandle {
            offset: u64::MAX - 3,
            ..*h
        };
        assert!(
            r.value(key, &far).is_err(),
            "an offset past any file must fail"
        );
        let huge = BlobHandle {
            stored_len: u32::MAX,
            ..*h
        };
        assert!(
            r.value(key, &huge).is_err(),
            "a claimed 4 GiB value must fail"
        );

        let mut damaged = file.clone();
        let at = h.offset as usize + BLOB_HEADER_BYTES + 4 + 100;
        damaged[at] ^= 1;
        std::fs::write(dir.path().join("4"), &damaged).expect("write");
        let mut r = BlobReader::new(dir.path().to_path_buf());
        let e = r.value(key, &BlobHandle { file: 4, ..*h });
        assert!(
            matches!(&e, Err(StorageError::Engine(m)) if m.contains("checksum")),
            "{:?}",
            e.map(|v| v.map(<[u8]>::len))
        );
        assert!(r.value(key, &BlobHandle { file: 99, ..*h }).is_err());
    }

    #[test]
    fn a_compressed_blob_is_left_to_the_engine() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut b = blob(b"k", &[1; 200]);
        // Claim a larger uncompressed length than is stored.
        b[30..34].copy_from_slice(&500u32.to_le_bytes());
        std::fs::write(dir.path().join("1"), &b).expect("write");
        let mut r = BlobReader::new(dir.path().to_path_buf());
        let h = BlobHandle {
            file: 1,
            offset: 0,
            stored_len: 200,
            len: 500,
        };
        assert_eq!(r.value(b"k", &h).expect("read"), None);
    }
}
