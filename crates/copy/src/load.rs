//! A data stream's writer: bulk-loads the frames of each range as tables
//! with no journal, and every `durable_every_bytes` of a range (at a frame
//! boundary) and at its end makes the load durable and records the
//! range's position in the progress file, where `--resume` continues.

use std::sync::atomic::Ordering;

use crossbeam_channel::{Receiver, Sender};
use fabrickv_storage::ShardBackend;
use fabrickv_types::{Digest, ErrorCode};
use fabrickv_wire::copy::Pairs;

use crate::error::{err, storage, CopyError};
use crate::lock;
use crate::progress::unhex;
use crate::shared::{Item, Shared};

/// A stream's writer: bulk-loads each range's frames, durable every
/// `durable_every` bytes at a frame boundary and at the range's end.
pub(crate) fn write<S: ShardBackend>(
    sh: &Shared,
    shard: &S,
    rx: &Receiver<Item>,
    free: &Sender<Vec<u8>>,
) -> Result<(), CopyError> {
    loop {
        let Ok(first) = rx.recv() else {
            return Ok(());
        };
        let range = first.range;
        // One load: frames of `range` until durable_every bytes or its end.
        let mut cur = Some(first);
        let (mut at, mut loaded, mut frame_bytes) = (0usize, 0u64, 0u64);
        let mut last: Option<(u64, Digest, bool)> = None;
        let mut last_key: Vec<u8> = Vec::new();
        let mut stray: Option<CopyError> = None;
        let result = shard.load(|key, value| loop {
            let Some(item) = cur.as_ref() else {
                return Ok(false);
            };
            if !item.end && at < item.buf.len() {
                // The receiver checked every pair of the frame.
                if let Some(Ok((k, v))) = Pairs::new(&item.buf[at..]).next() {
                    key.clear();
                    key.extend_from_slice(k);
                    value.clear();
                    value.extend_from_slice(v);
                    last_key.clear();
                    last_key.extend_from_slice(k);
                    at += 8 + k.len() + v.len();
                    frame_bytes += (k.len() + v.len()) as u64;
                    return Ok(true);
                }
            }
            // The frame is all loaded.
            let Some(i) = cur.take() else {
                return Ok(false);
            };
            sh.pairs.fetch_add(i.pairs, Ordering::Relaxed);
            sh.bytes.fetch_add(frame_bytes, Ordering::Relaxed);
            loaded += frame_bytes;
            frame_bytes = 0;
            last = Some((i.seq + 1, i.digest, i.end));
            let ended = i.end;
            let _ = free.try_send(i.buf);
            if ended || loaded >= sh.durable_every {
                return Ok(false);
            }
            match rx.recv() {
                Ok(next) if next.range == range => {
                    cur = Some(next);
                    at = 0;
                }
                Ok(next) => {
                    stray = Some(err(
                        ErrorCode::Malformed,
                        format!("range {} began before range {range} ended", next.range),
                    ));
                    return Ok(false);
                }
                Err(_) => return Ok(false),
            }
        });
        result.map_err(|e| storage(&format!("writing range {range}"), e))?;
        if !sh.keep_cached {
            // The load is durable: its pages need not stay cached (see
            // `CopyOptions::keep_cached`).
            shard.drop_cached_pages();
        }
        if let Some(e) = stray {
            return Err(e);
        }
        if let Some((next_seq, digest, end)) = last {
            let mut p = lock(&sh.progress);
            let r = &mut p.ranges[range as usize];
            let after = if digest.pairs > r.pairs {
                last_key.clone()
            } else {
                unhex(&r.after)?
            };
            r.set(next_seq, &digest, &after, end);
            p.save(&sh.dir)?;
        }
        if sh.stop.load(Ordering::Acquire) {
            return Ok(());
        }
    }
}
