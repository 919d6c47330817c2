//! GET on the KV cache: written one-sided into a slice of the client's
//! region after a size check, or returned inline in chunks pinned to the
//! value's generation (a large chunk sent from the leased value itself,
//! its checksum computed once per value and chunk).

use std::collections::HashMap;
use std::sync::atomic::Ordering;

use fabrickv_cache::Lease;
use fabrickv_transport::Reply;
use fabrickv_types::limits::CACHE_CHUNK_BYTES_MAX;
use fabrickv_types::ErrorCode;
use fabrickv_wire::cache::{GetReplyWriter, RegionSlice};

use super::{refusal, region_of, CacheService};
use crate::service::Refusal;

impl CacheService {
    #[allow(clippy::too_many_arguments)]
    pub(super) fn get(
        &mut self,
        id: u64,
        key: &[u8],
        generation: u64,
        offset: u64,
        max_len: u64,
        dest: Option<RegionSlice>,
        read_now: bool,
        reply: &mut dyn Reply,
        now_ms: u64,
    ) -> Result<(), Refusal> {
        let store = self.shared.store();
        let lease: Lease = if generation == 0 {
            store
                .get(key, now_ms)
                .ok_or_else(|| (ErrorCode::NotFound, "no such key".to_string()))?
        } else {
            store.lease_if(key, generation, now_ms).map_err(refusal)?
        };
        let total = lease.len() as u64;
        let expires_in = match lease.expires_at_ms() {
            0 => 0,
            at => at.saturating_sub(now_ms).max(1),
        };
        let gen = lease.generation();
        match dest {
            Some(d) => {
                let region = region_of(&d)?;
                if total > d.len {
                    // Checked before any byte moves: the value does not fit
                    // the slice the client named.
                    self.shared
                        .counters
                        .buffer_too_small
                        .fetch_add(1, Ordering::Relaxed);
                    let w = GetReplyWriter::begin(
                        reply.buf(),
                        id,
                        self.worker,
                        ErrorCode::BufferTooSmall,
                        gen,
                        total,
                        0,
                        expires_in,
                    );
                    w.finish(reply.buf());
                    return Ok(());
                }
                let at = d.offset as usize;
                region
                    .check(at, d.len as usize)
                    .map_err(|e| (ErrorCode::Malformed, e.to_string()))?;
                let one_sided = |e: fabrickv_transport::TransportError| {
                    (
                        ErrorCode::Malformed,
                        format!("one-sided write refused: {e}"),
                    )
                };
                match reply
                    .remote_mut(&region, at, lease.len())
                    .map_err(one_sided)?
                {
                    // A reader that copies the value out at once finds it
                    // in the cache this CPU shares with it (`FLAG_READ_NOW`;
                    // measured with python/bench_front_door.py's
                    // get_many_into, 64 values of 256 KiB streamed through
                    // a 2 MiB ring: 2.2 GB/s streamed, 11 GB/s cached).
                    Some(view) if read_now => view.copy_from_slice(&lease),
                    Some(view) => fabrickv_cache::copy_to_reader(view, &lease),
                    None => reply.write_remote(&region, at, &lease).map_err(one_sided)?,
                }
                self.shared
                    .counters
                    .one_sided_out_bytes
                    .fetch_add(total, Ordering::Relaxed);
                let w = GetReplyWriter::begin(
                    reply.buf(),
                    id,
                    self.worker,
                    ErrorCode::Ok,
                    gen,
                    total,
                    0,
                    expires_in,
                );
                w.finish(reply.buf());
            }
            None => {
                let start = offset.min(total) as usize;
                let want = max_len.min(CACHE_CHUNK_BYTES_MAX as u64) as usize;
                let end = (start + want).min(lease.len());
                let out = reply.buf();
                let w = GetReplyWriter::begin(
                    out,
                    id,
                    self.worker,
                    ErrorCode::Ok,
                    gen,
                    total,
                    start as u64,
                    expires_in,
                );
                if end - start < CACHE_SHARED_CHUNK_BYTES_MIN {
                    out.extend_from_slice(&lease[start..end]);
                    w.finish(out);
                } else {
                    // The chunk goes out from the leased value itself (a
                    // vectored write over tcp), not copied into the reply;
                    // the transport holds the lease until it is sent. Its
                    // checksum is computed once per value and chunk.
                    let crc = self.chunk_crcs.of(gen, start..end, &lease[start..end]);
                    w.finish_before(out, end - start, crc);
                    reply.append_shared(Box::new(LeasedChunk {
                        lease,
                        range: start..end,
                    }));
                }
                self.shared
                    .counters
                    .inline_out_bytes
                    .fetch_add((end - start) as u64, Ordering::Relaxed);
            }
        }
        Ok(())
    }
}

/// Smallest inline GET chunk sent from the leased value instead of copied
/// into the reply, in bytes: below it the copy costs less than queueing
/// the lease (an allocation and a slice of the vectored write).
pub const CACHE_SHARED_CHUNK_BYTES_MIN: usize = 16 << 10;

/// Checksums of chunks one worker keeps, in entries (about 40 bytes each:
/// 2.5 MiB at most per worker). Only chunks of at least
/// `CACHE_SHARED_CHUNK_BYTES_MIN` are kept, so the entries cover at least
/// 1 GiB of values; when full the table starts over.
pub const CACHE_CHUNK_CRCS_MAX: usize = 1 << 16;

/// CRC-32C of inline GET chunks by (generation, start, end). A
/// generation names one committed value, unique and never reused, and a
/// value never changes once committed, so an entry is never stale: a value
/// read many times (the KV-cache pattern) is checksummed once, and each
/// reply's checksum is the header's combined with it
/// (`wire::cache::crc32c_concat`), which leaves the worker no pass over
/// the value at all.
#[derive(Default)]
pub(super) struct ChunkCrcs {
    crcs: HashMap<(u64, usize, usize), u32>,
}

impl ChunkCrcs {
    /// The checksum of `bytes`, chunk `range` of generation `gen`.
    fn of(&mut self, gen: u64, range: std::ops::Range<usize>, bytes: &[u8]) -> u32 {
        let key = (gen, range.start, range.end);
        if let Some(&crc) = self.crcs.get(&key) {
            return crc;
        }
        if self.crcs.len() >= CACHE_CHUNK_CRCS_MAX {
            self.crcs.clear();
        }
        let crc = fabrickv_wire::cache::chunk_crc(bytes);
        self.crcs.insert(key, crc);
        crc
    }
}

/// A chunk of a leased value that a reply sends from the value's memory;
/// the lease keeps the bytes intact until the transport drops this.
pub(super) struct LeasedChunk {
    lease: Lease,
    range: std::ops::Range<usize>,
}

impl AsRef<[u8]> for LeasedChunk {
    fn as_ref(&self) -> &[u8] {
        &self.lease[self.range.clone()]
    }
}
