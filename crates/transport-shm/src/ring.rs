//! A connection's shared memory and its two single-producer,
//! single-consumer rings (sans-I/O apart from the mapping itself).
//!
//! ```text
//! offset 0        header page: per ring, four words on lines of their own
//!                   head       (consumer writes: bytes consumed)
//!                   tail       (producer writes: bytes published)
//!                   cons_wait  (consumer is about to sleep: wake it on publish)
//!                   prod_wait  (producer waits for room: wake it on consume)
//! HEADER_BYTES    ring 0 data: client -> server
//! +RING_BYTES     ring 1 data: server -> client
//! ```
//!
//! Head and tail are byte counts that only grow (u64, never wrap in
//! practice); the position in the ring is the count modulo `RING_BYTES`.
//! A record is `[u32 length][u32 zero][payload][padding to 8 bytes]`; a
//! length of `WRAP` says "the rest of the ring is skipped". The producer
//! writes records past the published tail, where the consumer does not
//! look, and publishes a whole batch with one release store of the tail;
//! the consumer reads with an acquire load of the tail and releases what
//! it consumed with one release store of the head.
//!
//! Everything read from shared memory is validated before use: a peer that
//! writes garbage makes [`Corrupt`] come back, never an out-of-bounds access.

use std::sync::atomic::{fence, Ordering};

use fabrickv_types::limits::MESSAGE_BYTES_MAX;

use crate::mem::Mapping;

/// Bytes of each ring's data area (4 MiB).
pub const RING_BYTES: usize = 4 << 20;

/// Bytes of the header page that holds the rings' control words.
pub const HEADER_BYTES: usize = 4096;

/// Bytes of one connection's shared memory: header and two rings.
pub const CONN_SHM_BYTES: usize = HEADER_BYTES + 2 * RING_BYTES;

/// Distance between control words, in bytes: two cache lines, so that
/// neither false sharing nor the adjacent-line prefetcher couples a word
/// the consumer writes with one the producer writes.
const WORD_STRIDE_BYTES: usize = 128;

/// Bytes of a record's header (length and padding word).
pub const RECORD_HEADER_BYTES: usize = 8;

/// Records start on multiples of this many bytes.
const RECORD_ALIGN_BYTES: usize = 8;

/// Length word that marks the rest of the ring as skipped.
const WRAP: u32 = u32::MAX;

const _: () = assert!(
    RING_BYTES >= 2 * record_bytes(MESSAGE_BYTES_MAX),
    "a ring must hold the largest message wherever its free space starts"
);
const _: () = assert!(RING_BYTES % RECORD_ALIGN_BYTES == 0);
const _: () = assert!(MESSAGE_BYTES_MAX < WRAP as usize);
const _: () = assert!(8 * WORD_STRIDE_BYTES <= HEADER_BYTES);

/// Bytes a message of `len` bytes takes in a ring.
pub const fn record_bytes(len: usize) -> usize {
    RECORD_HEADER_BYTES + len.div_ceil(RECORD_ALIGN_BYTES) * RECORD_ALIGN_BYTES
}

/// The peer wrote something impossible into shared memory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Corrupt(pub String);

/// Which ring.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dir {
    /// Client to server: requests.
    ToServer = 0,
    /// Server to client: replies.
    ToClient = 1,
}

/// Where one ring's words and data live in the mapping.
#[derive(Debug, Clone, Copy)]
struct Layout {
    head: usize,
    tail: usize,
    cons_wait: usize,
    prod_wait: usize,
    data: usize,
}

impl Layout {
    const fn of(dir: Dir) -> Layout {
        let base = dir as usize * 4 * WORD_STRIDE_BYTES;
        Layout {
            head: base,
            tail: base + WORD_STRIDE_BYTES,
            cons_wait: base + 2 * WORD_STRIDE_BYTES,
            prod_wait: base + 3 * WORD_STRIDE_BYTES,
            data: HEADER_BYTES + dir as usize * RING_BYTES,
        }
    }
}

/// Sets a wait flag (the caller then fences and re-checks).
fn arm(m: &Mapping, off: usize) {
    m.u32_at(off).store(1, Ordering::SeqCst);
}

/// Clears a wait flag.
fn disarm(m: &Mapping, off: usize) {
    m.u32_at(off).store(0, Ordering::Relaxed);
}

/// Takes a wait flag: true if the other side asked to be woken (and will
/// be, by the caller). Call after a `SeqCst` fence that follows the store
/// the other side may be waiting for.
#[inline]
fn take(m: &Mapping, off: usize) -> bool {
    let w = m.u32_at(off);
    w.load(Ordering::Relaxed) != 0 && w.swap(0, Ordering::Relaxed) != 0
}

/// Full fence between a publishing store and the load of a wait flag (and
/// between arming a flag and re-checking), so that of two sides racing to
/// sleep and publish, at least one sees the other.
#[inline]
pub fn fence_seqcst() {
    fence(Ordering::SeqCst);
}

/// The producer side of one ring.
#[derive(Debug)]
pub struct Writer {
    at: Layout,
    /// End of what was written, published or not.
    tail: u64,
    /// End of what the consumer may see.
    published: u64,
    /// Last head read from the consumer.
    head: u64,
}

impl Writer {
    /// The producer of ring `dir` of a fresh mapping.
    pub fn new(dir: Dir) -> Writer {
        Writer {
            at: Layout::of(dir),
            tail: 0,
            published: 0,
            head: 0,
        }
    }

    /// Reads the consumer's head and checks it.
    fn refresh_head(&mut self, m: &Mapping) -> Result<(), Corrupt> {
        let h = m.u64_at(self.at.head).load(Ordering::Acquire);
        if h < self.head || h > self.published || h % RECORD_ALIGN_BYTES as u64 != 0 {
            return Err(Corrupt(format!(
                "ring head {h} outside {}..={}",
                self.head, self.published
            )));
        }
        self.head = h;
        Ok(())
    }

    /// The consumer released bytes since the last look (the producer may
    /// have room now).
    pub fn head_moved(&self, m: &Mapping) -> bool {
        m.u64_at(self.at.head).load(Ordering::Acquire) != self.head
    }

    /// Writes `msg` (1..=MESSAGE_BYTES_MAX bytes, checked by the caller) as
    /// an unpublished record; `Ok(false)` if the ring has no room.
    pub fn try_push(&mut self, m: &Mapping, msg: &[u8]) -> Result<bool, Corrupt> {
        debug_assert!(!msg.is_empty() && msg.len() <= MESSAGE_BYTES_MAX);
        let rec = record_bytes(msg.len());
        let pos = (self.tail % RING_BYTES as u64) as usize;
        let skip = if pos + rec > RING_BYTES {
            RING_BYTES - pos
        } else {
            0
        };
        let need = (skip + rec) as u64;
        let ring = RING_BYTES as u64;
        if self.tail - self.head + need > ring {
            self.refresh_head(m)?;
            if self.tail - self.head + need > ring {
                return Ok(false);
            }
        }
        if skip > 0 {
            m.u32_at(self.at.data + pos).store(WRAP, Ordering::Relaxed);
            self.tail += skip as u64;
        }
        let pos = (self.tail % ring) as usize;
        m.u32_at(self.at.data + pos)
            .store(msg.len() as u32, Ordering::Relaxed);
        m.write(self.at.data + pos + RECORD_HEADER_BYTES, msg);
        self.tail += rec as u64;
        Ok(true)
    }

    /// Writes and publishes a record header that claims `len` bytes over
    /// 64 bytes of ring, whatever `len` is: a hostile peer, for tests.
    pub fn publish_bogus(&mut self, m: &Mapping, len: u32) {
        let pos = (self.tail % RING_BYTES as u64) as usize;
        m.u32_at(self.at.data + pos).store(len, Ordering::Relaxed);
        self.tail += 64;
        self.publish(m);
    }

    /// Publishes every record written; false if there was none.
    #[inline]
    pub fn publish(&mut self, m: &Mapping) -> bool {
        if self.tail == self.published {
            return false;
        }
        m.u64_at(self.at.tail).store(self.tail, Ordering::Release);
        self.published = self.tail;
        true
    }

    /// After [`fence_seqcst`]: the consumer asked to be woken.
    #[inline]
    pub fn take_consumer_wait(&self, m: &Mapping) -> bool {
        take(m, self.at.cons_wait)
    }

    /// Asks the consumer to wake this side when it releases room.
    pub fn arm_wait(&self, m: &Mapping) {
        arm(m, self.at.prod_wait);
    }

    /// Withdraws [`Writer::arm_wait`].
    pub fn disarm_wait(&self, m: &Mapping) {
        disarm(m, self.at.prod_wait);
    }
}

/// The consumer side of one ring.
#[derive(Debug)]
pub struct Reader {
    at: Layout,
    /// End of what was consumed (handed out and done with).
    head: u64,
    /// End of what the producer was told is free.
    released: u64,
    /// Last tail read from the producer.
    tail: u64,
}

impl Reader {
    /// The consumer of ring `dir` of a fresh mapping.
    pub fn new(dir: Dir) -> Reader {
        Reader {
            at: Layout::of(dir),
            head: 0,
            released: 0,
            tail: 0,
        }
    }

    /// The producer published something not yet consumed.
    #[inline]
    pub fn has_data(&self, m: &Mapping) -> bool {
        self.head != self.tail || m.u64_at(self.at.tail).load(Ordering::Acquire) != self.head
    }

    /// The next message as (offset in the mapping, length), without
    /// consuming it; `None` if the ring is empty.
    pub fn peek(&mut self, m: &Mapping) -> Result<Option<(usize, usize)>, Corrupt> {
        let ring = RING_BYTES as u64;
        loop {
            if self.head == self.tail {
                let t = m.u64_at(self.at.tail).load(Ordering::Acquire);
                if t < self.tail || t - self.released > ring || t % RECORD_ALIGN_BYTES as u64 != 0 {
                    return Err(Corrupt(format!(
                        "ring tail {t} outside {}..={}",
                        self.tail,
                        self.released + ring
                    )));
                }
                self.tail = t;
                if t == self.head {
                    return Ok(None);
                }
            }
            let pos = (self.head % ring) as usize;
            let avail = self.tail - self.head;
            let len = m.u32_at(self.at.data + pos).load(Ordering::Relaxed);
            if len == WRAP {
                let skip = (RING_BYTES - pos) as u64;
                if pos == 0 || skip > avail {
                    return Err(Corrupt(format!("bad wrap marker at ring offset {pos}")));
                }
                self.head += skip;
                continue;
            }
            let len = len as usize;
            if len == 0 || len > MESSAGE_BYTES_MAX {
                return Err(Corrupt(format!("record length {len}")));
            }
            let rec = record_bytes(len);
            if pos + rec > RING_BYTES || rec as u64 > avail {
                return Err(Corrupt(format!(
                    "record of {len} bytes at ring offset {pos} overruns the published data"
                )));
            }
            return Ok(Some((self.at.data + pos + RECORD_HEADER_BYTES, len)));
        }
    }

    /// Consumes the message [`Reader::peek`] returned (of `len` bytes).
    #[inline]
    pub fn advance(&mut self, len: usize) {
        self.head += record_bytes(len) as u64;
    }

    /// Tells the producer that everything consumed is free; false if
    /// nothing was.
    #[inline]
    pub fn release(&mut self, m: &Mapping) -> bool {
        if self.head == self.released {
            return false;
        }
        m.u64_at(self.at.head).store(self.head, Ordering::Release);
        self.released = self.head;
        true
    }

    /// After [`fence_seqcst`]: the producer waits for room and asked to be
    /// woken.
    #[inline]
    pub fn take_producer_wait(&self, m: &Mapping) -> bool {
        take(m, self.at.prod_wait)
    }

    /// Asks the producer to wake this side when it publishes.
    pub fn arm_wait(&self, m: &Mapping) {
        arm(m, self.at.cons_wait);
    }

    /// Withdraws [`Reader::arm_wait`].
    pub fn disarm_wait(&self, m: &Mapping) {
        disarm(m, self.at.cons_wait);
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn mapping() -> Mapping {
        Mapping::create("ring-test", CONN_SHM_BYTES).unwrap().0
    }

    #[test]
    fn records_wrap_and_keep_order() {
        let m = mapping();
        let (mut w, mut r) = (Writer::new(Dir::ToServer), Reader::new(Dir::ToServer));
        let msg = vec![7u8; 300_001];
        let mut sent = 0u32;
        let mut got = 0u32;
        for _ in 0..200 {
            while w
                .try_push(&m, &[&sent.to_le_bytes()[..], &msg].concat())
                .unwrap()
            {
                sent += 1;
            }
            assert_eq!(
                r.peek(&m).unwrap(),
                None,
                "unpublished records are invisible"
            );
            w.publish(&m);
            while let Some((off, len)) = r.peek(&m).unwrap() {
                let b = m.slice(off, len);
                assert_eq!(b[..4], got.to_le_bytes());
                assert_eq!(len, 300_005);
                r.advance(len);
                got += 1;
            }
            r.release(&m);
        }
        assert_eq!(sent, got);
        assert!(sent > 2000);
    }

    #[test]
    fn garbage_is_reported_not_followed() {
        let m = mapping();
        let at = Layout::of(Dir::ToClient);
        let mut r = Reader::new(Dir::ToClient);
        m.u64_at(at.tail).store(u64::MAX - 7, Ordering::Release);
        assert!(r.peek(&m).is_err(), "tail beyond the ring");
        let mut r = Reader::new(Dir::ToClient);
        m.u64_at(at.tail).store(64, Ordering::Release);
        m.u32_at(at.data).store(u32::MAX - 1, Ordering::Relaxed);
        assert!(r.peek(&m).is_err(), "oversized length");
        let mut r = Reader::new(Dir::ToClient);
        m.u32_at(at.data).store(100, Ordering::Relaxed);
        assert!(
            r.peek(&m).is_err(),
            "record longer than the published bytes"
        );
        let mut r = Reader::new(Dir::ToClient);
        m.u32_at(at.data).store(WRAP, Ordering::Relaxed);
        assert!(r.peek(&m).is_err(), "wrap marker at the ring start");
        let mut w = Writer::new(Dir::ToClient);
        m.u64_at(at.head).store(8, Ordering::Release);
        let big = vec![1; MESSAGE_BYTES_MAX];
        let pushes: Vec<_> = (0..5).map(|_| w.try_push(&m, &big)).collect();
        assert!(pushes.iter().any(|p| p.is_err()), "head beyond tail");
    }
}
