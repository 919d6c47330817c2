//! A data stream's receiver: reads each frame, checks its range, its
//! sequence number and every pair against the source's running digest,
//! and queues it for the stream's writer.

use std::io::Read;
use std::net::TcpStream;
use std::sync::atomic::Ordering;

use crossbeam_channel::{Receiver, Sender};
use fabrickv_types::{Digest, ErrorCode};
use fabrickv_wire::copy::{
    decode_abort, DataFrameHeader, DataFrameKind, Pairs, DATA_FRAME_HEADER_BYTES,
};

use crate::error::{err, printable, CopyError};
use crate::lock;
use crate::shared::{Item, Shared};

/// Where a stream's current range stands, on the receiving side.
struct Cursor {
    range: u32,
    next_seq: u64,
    digest: Digest,
}

/// A stream's receiver: reads and checks frames, queues them for the
/// writer.
pub(crate) fn receive(
    sh: &Shared,
    stream: usize,
    mut sock: TcpStream,
    tx: &Sender<Item>,
    free: &Receiver<Vec<u8>>,
) -> Result<(), CopyError> {
    let mut cur: Option<Cursor> = None;
    let mut head = [0u8; DATA_FRAME_HEADER_BYTES];
    loop {
        match read_full(&mut sock, &mut head) {
            Ok(true) => {}
            Ok(false) if cur.is_none() => return Ok(()),
            Ok(false) => {
                return Err(err(
                    ErrorCode::Unavailable,
                    format!("data stream {stream}: the source closed it mid-range"),
                ))
            }
            Err(e) => return Err(stream_error(sh, stream, &e)),
        }
        let h = DataFrameHeader::decode(&head)
            .map_err(|e| err(e.code(), format!("data stream {stream}: {e}")))?;
        let mut buf = free.try_recv().unwrap_or_default();
        buf.resize(h.payload_len as usize, 0);
        if let Err(e) = sock.read_exact(&mut buf) {
            return Err(stream_error(sh, stream, &e));
        }
        if h.kind == DataFrameKind::Abort {
            let (code, why) = decode_abort(&buf);
            return Err(err(
                code,
                format!("the source aborted: {}", printable(&why)),
            ));
        }
        let c = match &mut cur {
            Some(c) if c.range == h.range => c,
            _ => {
                let p = lock(&sh.progress);
                let Some(r) = p.ranges.get(h.range as usize) else {
                    return Err(err(
                        ErrorCode::Malformed,
                        format!("frame of range {} of {}", h.range, p.ranges.len()),
                    ));
                };
                if r.done {
                    return Err(err(
                        ErrorCode::Malformed,
                        format!("frame of range {}, which is done", h.range),
                    ));
                }
                let (next_seq, digest) = if r.pairs > 0 {
                    (r.next_seq, r.digest()?)
                } else {
                    (0, Digest::default())
                };
                cur.insert(Cursor {
                    range: h.range,
                    next_seq,
                    digest,
                })
            }
        };
        if h.seq != c.next_seq {
            return Err(err(
                ErrorCode::Malformed,
                format!(
                    "range {}: frame {} where {} was due",
                    h.range, h.seq, c.next_seq
                ),
            ));
        }
        let mut pairs = 0u64;
        if h.kind == DataFrameKind::Data {
            for pair in Pairs::new(&buf) {
                let (k, v) = pair.map_err(|e| err(e.code(), format!("range {}: {e}", h.range)))?;
                c.digest.add(k, v);
                pairs += 1;
            }
        } else if !buf.is_empty() {
            return Err(err(
                ErrorCode::Malformed,
                "an END_OF_RANGE frame with a payload",
            ));
        }
        if pairs != u64::from(h.pairs) || c.digest != h.digest {
            return Err(err(
                ErrorCode::BadChecksum,
                format!(
                    "range {} frame {}: the pairs received do not match the source's running digest",
                    h.range, h.seq
                ),
            ));
        }
        c.next_seq += 1;
        let end = h.kind == DataFrameKind::EndOfRange;
        let item = Item {
            range: h.range,
            seq: h.seq,
            end,
            digest: h.digest,
            pairs,
            buf,
        };
        if tx.send(item).is_err() {
            return Ok(()); // the writer failed and said why
        }
        if end {
            cur = None;
        }
    }
}

fn stream_error(sh: &Shared, stream: usize, e: &std::io::Error) -> CopyError {
    if sh.stop.load(Ordering::Acquire) {
        return err(ErrorCode::Unavailable, "stopped");
    }
    if matches!(
        e.kind(),
        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
    ) {
        err(
            ErrorCode::Timeout,
            format!("data stream {stream}: nothing from the source within the op timeout"),
        )
    } else {
        err(
            ErrorCode::Unavailable,
            format!("data stream {stream}: connection to the source lost: {e}"),
        )
    }
}

/// Fills `buf`; false at a clean end of stream before its first byte.
fn read_full(sock: &mut TcpStream, buf: &mut [u8]) -> std::io::Result<bool> {
    let mut got = 0;
    while got < buf.len() {
        match sock.read(&mut buf[got..]) {
            Ok(0) if got == 0 => return Ok(false),
            Ok(0) => return Err(std::io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => got += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(true)
}
