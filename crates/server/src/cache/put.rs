//! PUT on the KV cache: a whole value inline, a value read one-sided
//! from the client's region, or a chunked put held open on its connection
//! (invisible until its last chunk lands).

use std::sync::atomic::Ordering;

use fabrickv_transport::{ConnId, Reply};
use fabrickv_types::ErrorCode;
use fabrickv_wire::cache::{encode_put_reply, PutSource};

use super::{refusal, region_of, CacheService, Pending, CACHE_PENDING_PUTS_MAX};
use crate::service::Refusal;

impl CacheService {
    #[allow(clippy::too_many_arguments)]
    pub(super) fn put(
        &mut self,
        conn: ConnId,
        id: u64,
        key: &[u8],
        transfer: u64,
        ttl_ms: u64,
        total_len: u64,
        offset: u64,
        source: PutSource<'_>,
        reply: &mut dyn Reply,
        now_ms: u64,
    ) -> Result<(), Refusal> {
        let store = self.shared.store();
        let total = total_len as usize;
        // What every accepted chunk is answered with: the generation once
        // the value is whole (0 before), and the bytes received so far.
        let (generation, received) = match source {
            PutSource::Region(src) => {
                let region = region_of(&src)?;
                region
                    .check(src.offset as usize, total)
                    .map_err(|e| (ErrorCode::Malformed, e.to_string()))?;
                let mut slot = store.reserve(key, total, ttl_ms, now_ms).map_err(refusal)?;
                reply
                    .read_remote(&region, src.offset as usize, slot.bytes_mut())
                    .map_err(|e| (ErrorCode::Malformed, format!("one-sided read refused: {e}")))?;
                let generation = slot.commit(now_ms).map_err(refusal)?;
                self.shared
                    .counters
                    .one_sided_in_bytes
                    .fetch_add(total_len, Ordering::Relaxed);
                (generation, total_len)
            }
            PutSource::Inline(chunk) if offset == 0 && chunk.len() == total => {
                let mut slot = store.reserve(key, total, ttl_ms, now_ms).map_err(refusal)?;
                slot.bytes_mut().copy_from_slice(chunk);
                let generation = slot.commit(now_ms).map_err(refusal)?;
                (generation, total_len)
            }
            PutSource::Inline(chunk) if offset == 0 => {
                if self.pending.len() >= CACHE_PENDING_PUTS_MAX {
                    return Err((
                        ErrorCode::Unavailable,
                        format!("{CACHE_PENDING_PUTS_MAX} chunked puts are open on this worker"),
                    ));
                }
                let mut slot = store.reserve(key, total, ttl_ms, now_ms).map_err(refusal)?;
                slot.bytes_mut()[..chunk.len()].copy_from_slice(chunk);
                // A new transfer with a used id replaces the old one, whose
                // space is freed (nothing of it was ever visible).
                self.pending.open(
                    (conn, transfer),
                    Pending {
                        slot,
                        key: key.to_vec(),
                        received: chunk.len() as u64,
                    },
                    now_ms,
                );
                (0, chunk.len() as u64)
            }
            PutSource::Inline(chunk) => {
                let Some(p) = self.pending.touch(&(conn, transfer), now_ms) else {
                    return Err((
                        ErrorCode::NotFound,
                        format!("no chunked put {transfer} is open on this connection"),
                    ));
                };
                if p.key != key || p.slot.len() as u64 != total_len || p.received != offset {
                    // Chunks of one transfer come in order on one
                    // connection; anything else is a broken client. The
                    // transfer is dropped so nothing half-written lands.
                    self.pending.remove(&(conn, transfer));
                    return Err((
                        ErrorCode::Malformed,
                        format!("chunk at {offset} does not continue put {transfer}"),
                    ));
                }
                let at = offset as usize;
                p.slot.bytes_mut()[at..at + chunk.len()].copy_from_slice(chunk);
                p.received += chunk.len() as u64;
                if p.received < total_len {
                    (0, p.received)
                } else {
                    let Some(p) = self.pending.remove(&(conn, transfer)) else {
                        return Err((ErrorCode::Internal, "chunked put vanished".to_string()));
                    };
                    (p.slot.commit(now_ms).map_err(refusal)?, total_len)
                }
            }
        };
        encode_put_reply(
            reply.buf(),
            id,
            self.worker,
            ErrorCode::Ok,
            generation,
            received,
            total_len,
        );
        Ok(())
    }
}
