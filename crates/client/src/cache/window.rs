//! Where in the receive buffer each read of a pipelined batch lands
//! ([`super::CacheClient::get_many_each`]): a first-in first-out ring
//! over the first `len` bytes of the buffer. Replies come back in the
//! order their requests went out, so places are freed in the order they
//! were taken, and a place freed (its value copied out) is taken again by
//! a later key of the batch while the server is still writing the ones
//! between. No I/O here: the ring is plain arithmetic, tested on its own.
//!
//! A place is one contiguous run of bytes. When the run a key needs does
//! not fit before the end of the ring it starts again at offset 0 (a lap),
//! leaving the end unused until the ring empties past it.

use std::collections::VecDeque;

/// The places taken in a ring of `len` bytes, oldest first.
#[derive(Debug)]
pub(super) struct Window {
    /// Bytes of the ring: the places lie in `0..len`.
    len: usize,
    /// The places taken and not yet freed, oldest first: (offset, bytes,
    /// whether this place began a lap at offset 0).
    taken: VecDeque<(usize, usize, bool)>,
    /// Where the newest place ends: the next place starts here, or at 0.
    head: usize,
    /// Whether the newest places lie on a later lap than the oldest: the
    /// free bytes are then `head..oldest`, else `head..len` and
    /// `0..oldest`.
    lapped: bool,
}

impl Window {
    /// An empty ring of `len` bytes.
    pub(super) fn new(len: usize) -> Window {
        Window {
            len,
            taken: VecDeque::new(),
            head: 0,
            lapped: false,
        }
    }

    /// Places taken and not yet freed.
    pub(super) fn taken(&self) -> usize {
        self.taken.len()
    }

    /// Takes a place of `bytes`: its offset, or `None` while the places
    /// taken leave no run that long (a place of at most the ring's length
    /// always fits an empty ring).
    pub(super) fn take(&mut self, bytes: usize) -> Option<usize> {
        let Some(&(oldest, _, _)) = self.taken.front() else {
            if bytes > self.len {
                return None;
            }
            self.head = bytes;
            self.lapped = false;
            self.taken.push_back((0, bytes, false));
            return Some(0);
        };
        let (offset, lap) = if self.lapped {
            if self.head + bytes > oldest {
                return None;
            }
            (self.head, false)
        } else if self.head + bytes <= self.len {
            (self.head, false)
        } else if bytes <= oldest {
            (0, true)
        } else {
            return None;
        };
        self.lapped |= lap;
        self.head = offset + bytes;
        self.taken.push_back((offset, bytes, lap));
        Some(offset)
    }

    /// Frees the oldest place; its (offset, bytes).
    pub(super) fn free(&mut self) -> Option<(usize, usize)> {
        let (offset, bytes, _) = self.taken.pop_front()?;
        match self.taken.front_mut() {
            None => {
                self.head = 0;
                self.lapped = false;
            }
            // The oldest place now begins the newest lap: every place
            // taken lies on one lap again.
            Some(front) if front.2 => {
                front.2 = false;
                self.lapped = false;
            }
            Some(_) => {}
        }
        Some((offset, bytes))
    }
}

#[cfg(test)]
mod tests {
    use super::Window;

    /// Whether two places overlap (empty places overlap nothing).
    fn overlap(a: (usize, usize), b: (usize, usize)) -> bool {
        a.1 > 0 && b.1 > 0 && a.0 < b.0 + b.1 && b.0 < a.0 + a.1
    }

    #[test]
    fn places_are_taken_in_order_and_lap_to_zero() {
        let mut w = Window::new(10);
        assert_eq!(w.take(4), Some(0));
        assert_eq!(w.take(4), Some(4));
        // 2 bytes left at the end; 3 do not fit there, nor before the oldest.
        assert_eq!(w.take(3), None);
        assert_eq!(w.free(), Some((0, 4)));
        // Now 0..4 is free: the lap starts there.
        assert_eq!(w.take(3), Some(0));
        assert_eq!(w.take(1), Some(3));
        assert_eq!(w.take(1), None);
        assert_eq!(w.free(), Some((4, 4)));
        assert_eq!(w.take(6), Some(4));
        assert_eq!(w.taken(), 3);
    }

    #[test]
    fn an_empty_ring_takes_any_place_up_to_its_length() {
        let mut w = Window::new(8);
        assert_eq!(w.take(9), None);
        assert_eq!(w.take(8), Some(0));
        assert_eq!(w.take(1), None);
        assert_eq!(w.free(), Some((0, 8)));
        assert_eq!(w.free(), None);
        assert_eq!(w.take(8), Some(0));
    }

    /// Against a model: places taken and not freed never overlap, each
    /// lies inside the ring, and an empty ring takes anything that fits.
    #[test]
    fn places_in_use_never_overlap() {
        let mut seed = 0x9e37_79b9_7f4a_7c15_u64;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        for len in [1usize, 7, 64, 1000] {
            let mut w = Window::new(len);
            let mut live: std::collections::VecDeque<(usize, usize)> = Default::default();
            for _ in 0..20_000 {
                if next() % 3 == 0 || live.is_empty() {
                    let bytes = (next() % (len as u64 + 1)) as usize;
                    let empty = live.is_empty();
                    match w.take(bytes) {
                        Some(off) => {
                            assert!(off + bytes <= len);
                            for &p in &live {
                                assert!(!overlap(p, (off, bytes)), "{p:?} and {off}+{bytes}");
                            }
                            live.push_back((off, bytes));
                        }
                        None => assert!(!empty, "an empty ring refused {bytes} of {len}"),
                    }
                } else {
                    assert_eq!(w.free(), live.pop_front());
                }
                assert_eq!(w.taken(), live.len());
            }
        }
    }
}
