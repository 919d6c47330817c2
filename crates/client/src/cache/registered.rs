//! Buffers the caller registers with the transport so that values land
//! where the caller wants them with no copy on this side: the server
//! writes each value one-sided straight into its place, as an RDMA read
//! into a registered memory region does (and as Mooncake's registered
//! buffers and vLLM's pinned KV blocks expect).
//!
//! The receive buffer is itself such a region, but it is shared by every
//! read of the client, so a value read there must be copied out before
//! the next read reuses the space; a registered buffer belongs to the
//! caller, and a batch read into it ([`CacheClient::get_many_to`]) costs
//! the server's one copy and nothing here.

use fabrickv_transport::RemoteRegion;
use fabrickv_types::limits::CACHE_BATCH_KEYS_MAX;
use fabrickv_types::ErrorCode;
use fabrickv_wire::cache::{encode_get, RegionSlice};

use super::reply::get_reply;
use super::{check_key, CacheClient};
use crate::conn::{self, region_bytes};
use crate::{ClientError, Result};

/// Most buffers one client registers besides its receive buffer. Each is
/// mapped by the server for the life of the connection, so the count is
/// bounded well under the transport's own bound on regions per
/// connection (256 over shm).
pub const CACHE_REGISTERED_BUFFERS_MAX: usize = 64;

impl CacheClient {
    /// Registers `len` bytes (zeroed) with the transport for values to be
    /// read into with [`CacheClient::get_many_to`]; its descriptor. The
    /// memory lives as long as this client: [`CacheClient::registered`]
    /// lends it. `UNAVAILABLE` where the transport registers no memory
    /// (tcp, inproc); `BUFFER_TOO_SMALL` for zero bytes;
    /// `INSUFFICIENT_SPACE` past [`CACHE_REGISTERED_BUFFERS_MAX`] buffers.
    pub fn register_buffer(&mut self, len: usize) -> Result<RemoteRegion> {
        if len == 0 {
            return Err(ClientError::Invalid(
                ErrorCode::BufferTooSmall,
                "a registered buffer needs at least one byte".into(),
            ));
        }
        if self.registered.len() >= CACHE_REGISTERED_BUFFERS_MAX {
            return Err(ClientError::Invalid(
                ErrorCode::InsufficientSpace,
                format!("{CACHE_REGISTERED_BUFFERS_MAX} buffers are registered already"),
            ));
        }
        let ep = self.sessions.session(0).endpoint();
        let Some(r) = conn::register_if_supported(ep, len)? else {
            return Err(ClientError::Invalid(
                ErrorCode::Unavailable,
                "this transport registers no memory; registered buffers need shm or fabric".into(),
            ));
        };
        self.registered.push(r);
        Ok(r)
    }

    /// The buffers registered with [`CacheClient::register_buffer`], in
    /// registration order.
    pub fn registered_buffers(&self) -> &[RemoteRegion] {
        &self.registered
    }

    /// The bytes of a buffer this client registered.
    pub fn registered(&mut self, r: &RemoteRegion) -> Result<&mut [u8]> {
        self.check_registered(r)?;
        let len = r.len as usize;
        let bytes = self.sessions.session(0).endpoint().local_region(r)?;
        Ok(&mut bytes[..len])
    }

    /// `MALFORMED` unless `r` is one of this client's registered buffers.
    fn check_registered(&self, r: &RemoteRegion) -> Result<()> {
        if self.registered.contains(r) {
            Ok(())
        } else {
            Err(ClientError::Invalid(
                ErrorCode::Malformed,
                "not a buffer this client registered".into(),
            ))
        }
    }

    /// Reads each `(key, offset, room)` into registered buffer `r` at
    /// `offset`, in at most `room` bytes: the server writes each value
    /// there itself, so nothing is copied on this side. One result per
    /// key, in order: the value's length, `None` if absent (its place
    /// untouched), or its own refusal (`BUFFER_TOO_SMALL` for a value
    /// larger than `room`, its place untouched: the server checks before
    /// it writes). The batch is pipelined, [`CACHE_BATCH_KEYS_MAX`] keys
    /// in flight at a time; the outer error is the connection's.
    /// Places may overlap; the later key's bytes are then the ones left.
    pub fn get_many_to(
        &mut self,
        r: &RemoteRegion,
        items: &[(&[u8], usize, usize)],
    ) -> Result<Vec<Result<Option<usize>>>> {
        self.check_registered(r)?;
        for (i, &(k, off, room)) in items.iter().enumerate() {
            check_key(k)?;
            match off.checked_add(room) {
                Some(end) if end as u64 <= r.len => {}
                _ => {
                    return Err(ClientError::Invalid(
                        ErrorCode::BufferTooSmall,
                        format!(
                            "item {i} at offset {off} of {room} bytes runs past the \
                             {}-byte registered buffer",
                            r.len
                        ),
                    ))
                }
            }
        }
        let region = region_bytes(r);
        let mut out = Vec::with_capacity(items.len());
        for batch in items.chunks(CACHE_BATCH_KEYS_MAX) {
            for &(k, off, room) in batch {
                let dest = RegionSlice {
                    region,
                    offset: off as u64,
                    len: room as u64,
                };
                self.post(|b, id, w| encode_get(b, id, w, k, 0, 0, 0, Some(&dest)))?;
            }
            self.collect_each(|f| {
                out.push(f.and_then(|f| get_reply(f).map(|g| g.map(|(total, ..)| total as usize))));
            })?;
        }
        Ok(out)
    }
}
