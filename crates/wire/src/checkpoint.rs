//! The bytes of a checkpoint file, sans-I/O (fuzzed by
//! `fuzz_targets/checkpoint_file.rs`); the server's `checkpoint` module
//! writes and loads them.
//!
//! A checkpoint is a directory of files, one per engine partition (kv
//! keys) and one per embedding-pool shard (table rows), and a manifest
//! naming them, renamed into place last. Each file is:
//! - a [`FileHeader`] of [`HEADER_BYTES`] (magic, format version, what
//!   the file holds, its index and count, the checkpoint's generation and
//!   time), ending in the CRC-32C of the bytes before it;
//! - frames, each one replication `Batch` message exactly as
//!   [`crate::repl::BatchBuf::seal`] makes it (the records a walk of the
//!   partition read: the same `Put`, `Del`, `FlushPartition`, `PsTable`,
//!   `PsRow` and `PsDel` a backup applies), followed by the CRC-32C of the
//!   message; the batch's `epoch` is the generation and its `seq` the
//!   frame's number, so a frame of another checkpoint or out of place is
//!   refused;
//! - a [`Trailer`]: a length word no message can have, the frame and
//!   record counts, the CRC-32C of the frames' CRCs in order (the
//!   *chain*, which the manifest repeats) and the trailer's own CRC-32C.
//!
//! A file cut short lacks its trailer; a torn write fails a frame's CRC;
//! a file of another checkpoint fails the generation; a newer format
//! fails the version. The loader checks each frame before applying it.

use crate::checksum::crc32c;
use crate::repl::{self, Message, Records, REPL_MESSAGE_BYTES_MAX};

/// The first bytes of every checkpoint file.
pub const MAGIC: [u8; 8] = *b"FKVCKPT\0";

/// The file format this build writes and the newest it reads.
pub const FORMAT_VERSION: u32 = 1;

/// Bytes of a file's header.
pub const HEADER_BYTES: usize = 48;

/// Bytes of a file's trailer.
pub const TRAILER_BYTES: usize = 32;

/// The length word that starts a trailer where a frame would start: no
/// message is this long.
pub const TRAILER_MARK: u32 = u32::MAX;

const TRAILER_MAGIC: [u8; 8] = *b"FKVEND\0\0";

const _: () = assert!(REPL_MESSAGE_BYTES_MAX < TRAILER_MARK as usize);

/// What a file holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileKind {
    /// One engine partition's keys.
    Kv,
    /// One embedding-pool shard's rows (and the tables they belong to).
    Embedding,
    /// The KV cache's entries (`--checkpoint-cache`).
    Cache,
}

impl FileKind {
    fn code(self) -> u8 {
        match self {
            FileKind::Kv => 1,
            FileKind::Embedding => 2,
            FileKind::Cache => 3,
        }
    }
}

/// A file's header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileHeader {
    /// The format version the file was written in.
    pub version: u32,
    /// What it holds.
    pub kind: FileKind,
    /// Which partition (or shard) of `count`.
    pub index: u32,
    /// Partitions (or shards) the saving server had.
    pub count: u32,
    /// The checkpoint's generation (unique per save of a server).
    pub generation: u64,
    /// When the save began, in Unix milliseconds.
    pub created_unix_ms: u64,
}

/// Why bytes are not (this part of) a checkpoint file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Bad {
    /// Not a checkpoint file at all.
    Foreign,
    /// Written by a newer format than this build reads.
    NewerVersion(u32),
    /// Damaged or cut short: what is wrong.
    Corrupt(&'static str),
}

impl std::fmt::Display for Bad {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Bad::Foreign => write!(f, "not a FabricKV checkpoint file"),
            Bad::NewerVersion(v) => write!(
                f,
                "written in checkpoint format {v}, newer than this build reads ({FORMAT_VERSION})"
            ),
            Bad::Corrupt(why) => write!(f, "damaged: {why}"),
        }
    }
}

impl std::error::Error for Bad {}

impl FileHeader {
    /// The header's bytes.
    pub fn encode(&self) -> [u8; HEADER_BYTES] {
        let mut b = [0u8; HEADER_BYTES];
        b[0..8].copy_from_slice(&MAGIC);
        b[8..12].copy_from_slice(&self.version.to_le_bytes());
        b[12] = self.kind.code();
        b[16..20].copy_from_slice(&self.index.to_le_bytes());
        b[20..24].copy_from_slice(&self.count.to_le_bytes());
        b[24..32].copy_from_slice(&self.generation.to_le_bytes());
        b[32..40].copy_from_slice(&self.created_unix_ms.to_le_bytes());
        let crc = crc32c(&b[..HEADER_BYTES - 4]);
        b[HEADER_BYTES - 4..].copy_from_slice(&crc.to_le_bytes());
        b
    }

    /// Parses and checks a header.
    pub fn decode(b: &[u8]) -> Result<FileHeader, Bad> {
        if b.len() < HEADER_BYTES || b[0..8] != MAGIC {
            return Err(Bad::Foreign);
        }
        let version = u32_at(b, 8);
        if version > FORMAT_VERSION {
            return Err(Bad::NewerVersion(version));
        }
        if crc32c(&b[..HEADER_BYTES - 4]) != u32_at(b, HEADER_BYTES - 4) {
            return Err(Bad::Corrupt("header checksum"));
        }
        if version == 0 {
            return Err(Bad::Corrupt("format version 0"));
        }
        let kind = match b[12] {
            1 => FileKind::Kv,
            2 => FileKind::Embedding,
            3 => FileKind::Cache,
            _ => return Err(Bad::Corrupt("unknown file kind")),
        };
        let (index, count) = (u32_at(b, 16), u32_at(b, 20));
        if count == 0 || index >= count {
            return Err(Bad::Corrupt("partition index out of range"));
        }
        Ok(FileHeader {
            version,
            kind,
            index,
            count,
            generation: u64_at(b, 24),
            created_unix_ms: u64_at(b, 32),
        })
    }
}

/// A file's closing counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Trailer {
    /// Frames before it.
    pub frames: u64,
    /// Records in them.
    pub records: u64,
    /// The CRC-32C of the frames' CRCs, in order.
    pub chain: u32,
}

impl Trailer {
    /// The trailer's bytes.
    pub fn encode(&self) -> [u8; TRAILER_BYTES] {
        let mut b = [0u8; TRAILER_BYTES];
        b[0..4].copy_from_slice(&TRAILER_MARK.to_le_bytes());
        b[4..12].copy_from_slice(&TRAILER_MAGIC);
        b[12..20].copy_from_slice(&self.frames.to_le_bytes());
        b[20..28].copy_from_slice(&self.records.to_le_bytes());
        let crc = crc32c(&b[..28]) ^ self.chain;
        b[28..32].copy_from_slice(&crc.to_le_bytes());
        // The chain is not stored apart: the last word holds the
        // trailer's own CRC folded with it, so a reader that knows the
        // chain (from the frames, or the manifest) checks both at once.
        b
    }

    /// Parses a trailer whose frames' chain is `chain`: refused unless
    /// the bytes are a trailer for exactly that chain.
    pub fn decode(b: &[u8], chain: u32) -> Result<Trailer, Bad> {
        if b.len() != TRAILER_BYTES || u32_at(b, 0) != TRAILER_MARK || b[4..12] != TRAILER_MAGIC {
            return Err(Bad::Corrupt("no trailer (cut short?)"));
        }
        if crc32c(&b[..28]) ^ chain != u32_at(b, 28) {
            return Err(Bad::Corrupt("trailer does not match the frames"));
        }
        Ok(Trailer {
            frames: u64_at(b, 12),
            records: u64_at(b, 20),
            chain,
        })
    }
}

/// Folds one frame's CRC into a chain.
pub fn chain_next(chain: u32, frame_crc: u32) -> u32 {
    let mut b = [0u8; 8];
    b[..4].copy_from_slice(&chain.to_le_bytes());
    b[4..].copy_from_slice(&frame_crc.to_le_bytes());
    crc32c(&b)
}

/// What the word at a frame's start says comes next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Next {
    /// A frame: a message of this many bytes after the word, then its
    /// 4-byte CRC.
    Frame(usize),
    /// The trailer ([`TRAILER_BYTES`] from the word on).
    Trailer,
}

/// Reads the length word at a frame's start.
pub fn next(word: [u8; 4]) -> Result<Next, Bad> {
    let len = u32::from_le_bytes(word);
    if len == TRAILER_MARK {
        return Ok(Next::Trailer);
    }
    let len = len as usize;
    if len == 0 || len + 4 > REPL_MESSAGE_BYTES_MAX {
        return Err(Bad::Corrupt("frame length out of range"));
    }
    Ok(Next::Frame(len))
}

/// Checks frame number `seq` of a checkpoint of `generation`: `msg` is
/// the whole message (length word included) and `crc` the word after it.
/// Returns its records and its CRC (for the chain).
pub fn frame(
    msg: &[u8],
    crc: [u8; 4],
    generation: u64,
    seq: u64,
) -> Result<(Records<'_>, u32), Bad> {
    let sum = crc32c(msg);
    if sum != u32::from_le_bytes(crc) {
        return Err(Bad::Corrupt("frame checksum"));
    }
    if msg.len() < 4 {
        return Err(Bad::Corrupt("frame too short"));
    }
    match repl::decode(&msg[4..]) {
        Ok(Message::Batch {
            epoch,
            seq: s,
            records,
        }) if epoch == generation && s == seq => Ok((records, sum)),
        Ok(Message::Batch { .. }) => {
            Err(Bad::Corrupt("frame of another checkpoint or out of order"))
        }
        _ => Err(Bad::Corrupt("frame is not a batch of records")),
    }
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    let mut w = [0u8; 4];
    w.copy_from_slice(&b[at..at + 4]);
    u32::from_le_bytes(w)
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut w = [0u8; 8];
    w.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(w)
}

/// Parses a whole file held in memory: header, every frame and the
/// trailer, calling `f` with each frame's records. For tests and the
/// fuzz target; the server streams files the same way.
pub fn parse_file(b: &[u8], f: &mut dyn FnMut(Records<'_>)) -> Result<(FileHeader, Trailer), Bad> {
    let header = FileHeader::decode(b)?;
    let mut at = HEADER_BYTES;
    let (mut chain, mut frames, mut records) = (0u32, 0u64, 0u64);
    loop {
        let word: [u8; 4] = b
            .get(at..at + 4)
            .and_then(|w| w.try_into().ok())
            .ok_or(Bad::Corrupt("cut short"))?;
        match next(word)? {
            Next::Trailer => {
                let t = Trailer::decode(b.get(at..).ok_or(Bad::Corrupt("cut short"))?, chain)?;
                if t.frames != frames || t.records != records {
                    return Err(Bad::Corrupt("trailer counts do not match the frames"));
                }
                return Ok((header, t));
            }
            Next::Frame(len) => {
                let msg = b.get(at..at + 4 + len).ok_or(Bad::Corrupt("cut short"))?;
                let crc: [u8; 4] = b
                    .get(at + 4 + len..at + 8 + len)
                    .and_then(|w| w.try_into().ok())
                    .ok_or(Bad::Corrupt("cut short"))?;
                let (recs, sum) = frame(msg, crc, header.generation, frames)?;
                chain = chain_next(chain, sum);
                frames += 1;
                records += recs.len() as u64;
                f(recs);
                at += 8 + len;
            }
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::repl::{BatchBuf, Record};

    fn file(generation: u64) -> Vec<u8> {
        let h = FileHeader {
            version: FORMAT_VERSION,
            kind: FileKind::Kv,
            index: 2,
            count: 8,
            generation,
            created_unix_ms: 1_700_000_000_000,
        };
        let mut out = h.encode().to_vec();
        let mut t = Trailer::default();
        for seq in 0..3u64 {
            let mut b = BatchBuf::default();
            b.put(format!("k{seq}").as_bytes(), b"value", 0, None);
            b.del(b"gone");
            let msg = b.seal(generation, seq);
            let crc = crc32c(&msg);
            out.extend_from_slice(&msg);
            out.extend_from_slice(&crc.to_le_bytes());
            t.chain = chain_next(t.chain, crc);
            t.frames += 1;
            t.records += 2;
        }
        out.extend_from_slice(&t.encode());
        out
    }

    #[test]
    fn a_file_round_trips() {
        let b = file(7);
        let mut keys = Vec::new();
        let (h, t) = parse_file(&b, &mut |recs| {
            for r in recs.iter() {
                if let Record::Put { key, .. } = r {
                    keys.push(key.to_vec());
                }
            }
        })
        .unwrap();
        assert_eq!((h.index, h.count, h.generation), (2, 8, 7));
        assert_eq!((t.frames, t.records), (3, 6));
        assert_eq!(keys, [b"k0".to_vec(), b"k1".to_vec(), b"k2".to_vec()]);
    }

    #[test]
    fn every_cut_and_every_flipped_byte_is_refused() {
        let b = file(7);
        for cut in 0..b.len() {
            assert!(parse_file(&b[..cut], &mut |_| {}).is_err(), "cut at {cut}");
        }
        for at in 0..b.len() {
            let mut c = b.clone();
            c[at] ^= 0x20;
            assert!(parse_file(&c, &mut |_| {}).is_err(), "flip at {at}");
        }
    }

    #[test]
    fn foreign_and_newer_files_are_named_as_such() {
        assert_eq!(
            parse_file(b"PK\x03\x04 not ours", &mut |_| {}),
            Err(Bad::Foreign)
        );
        let mut b = file(7);
        b[8..12].copy_from_slice(&(FORMAT_VERSION + 1).to_le_bytes());
        assert_eq!(
            parse_file(&b, &mut |_| {}),
            Err(Bad::NewerVersion(FORMAT_VERSION + 1))
        );
    }
}
