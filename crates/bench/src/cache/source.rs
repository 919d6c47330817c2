//! What the phases write to and read from ([`ValueSink`], [`ValueSource`])
//! and FabricKV's cache client as both, connected to a worker.

use std::time::Duration;

use fabrickv_client::{CacheClient, CacheClientOptions, Placed};

use super::CACHE_BENCH_TIMEOUT;

/// Something values can be written to.
pub trait ValueSink {
    /// Stores `value` under `key`, expiring after `ttl` (`None`: never).
    fn store(&mut self, key: &[u8], value: &[u8], ttl: Option<Duration>) -> Result<(), String>;
}

/// What a batch read hands each value (or `None`: absent) to, with its
/// position in the batch.
pub type OnValue<'a> = dyn FnMut(usize, Option<&[u8]>) -> Result<(), String> + 'a;

/// Something values can be read from, into memory it owns.
pub trait ValueSource {
    /// Reads `key`; the value as it landed (no copy beyond the one the
    /// protocol makes), or `None` if the key is absent.
    fn fetch(&mut self, key: &[u8]) -> Result<Option<&[u8]>, String>;

    /// Reads every key of `keys` with all requests in flight at once and
    /// hands each value (or `None`) to `each` with its position, in order.
    /// A slot must hold `slot_bytes` (the value size), so each value can
    /// land in a place of its own. One after the other by default.
    fn fetch_batch(
        &mut self,
        keys: &[&[u8]],
        slot_bytes: usize,
        each: &mut OnValue<'_>,
    ) -> Result<(), String> {
        let _ = slot_bytes;
        for (i, k) in keys.iter().enumerate() {
            each(i, self.fetch(k)?)?;
        }
        Ok(())
    }
}

impl ValueSink for CacheClient {
    fn store(&mut self, key: &[u8], value: &[u8], ttl: Option<Duration>) -> Result<(), String> {
        self.put(key, value, ttl)
            .map(|_| ())
            .map_err(|e| e.to_string())
    }
}

impl ValueSource for CacheClient {
    /// `get_at(key, 0)`: over shm and fabric the server writes the value
    /// into the registered receive buffer, over tcp the client lands the
    /// inline chunks there; either way it is checked where it lies.
    fn fetch(&mut self, key: &[u8]) -> Result<Option<&[u8]>, String> {
        let Some(p) = self.get_at(key, 0).map_err(|e| e.to_string())? else {
            return Ok(None);
        };
        let buf = self.buffer().map_err(|e| e.to_string())?;
        placed(buf, &p).map(Some)
    }

    /// One [`CacheClient::get_many_at`]: key `i` lands at `i * slot_bytes`
    /// of the receive buffer and is checked there.
    fn fetch_batch(
        &mut self,
        keys: &[&[u8]],
        slot_bytes: usize,
        each: &mut OnValue<'_>,
    ) -> Result<(), String> {
        let items: Vec<(&[u8], usize)> = keys
            .iter()
            .enumerate()
            .map(|(i, k)| (*k, i * slot_bytes))
            .collect();
        let got = self.get_many_at(&items).map_err(|e| e.to_string())?;
        let buf = self.buffer().map_err(|e| e.to_string())?;
        for (i, r) in got.into_iter().enumerate() {
            let Some(p) = r.map_err(|e| e.to_string())? else {
                each(i, None)?;
                continue;
            };
            each(i, Some(placed(buf, &p)?))?;
        }
        Ok(())
    }
}

/// The bytes of the receive buffer `buf` where a GET placed its value.
fn placed<'a>(buf: &'a [u8], p: &Placed) -> Result<&'a [u8], String> {
    buf.get(p.offset..p.offset.saturating_add(p.len))
        .ok_or_else(|| {
            format!(
                "the server placed {} bytes at {} of a {}-byte buffer",
                p.len,
                p.offset,
                buf.len()
            )
        })
}

/// Connects a [`CacheClient`] with a receive buffer of `buffer_bytes`.
pub fn connect_cache(addr: &str, buffer_bytes: usize) -> Result<CacheClient, String> {
    CacheClient::connect_with(
        addr,
        CacheClientOptions {
            buffer_bytes,
            timeout: CACHE_BENCH_TIMEOUT,
        },
    )
    .map_err(|e| format!("cannot connect to {addr}: {e}"))
}

/// Connects reader `tid` to its worker ([`crate::worker_of_thread`]).
pub fn connect_reader(
    addr: &str,
    buffer_bytes: usize,
    tid: usize,
    workers: u16,
) -> Result<CacheClient, String> {
    let worker = crate::worker_of_thread(tid, workers);
    CacheClient::connect_worker(
        addr,
        worker,
        CacheClientOptions {
            buffer_bytes,
            timeout: CACHE_BENCH_TIMEOUT,
        },
    )
    .map_err(|e| format!("cannot connect to {addr} (worker {worker}): {e}"))
}
