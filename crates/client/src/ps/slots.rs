//! The first-fit allocator of a ps client's receive region: each pull that
//! lands one-sided takes a slot of it and gives it back when waited on (or,
//! if cancelled, once its replies are in).

use super::PS_SLOT_ALIGN_BYTES;

/// First-fit allocator of slots in the receive region.
#[derive(Debug)]
pub(super) struct SlotAlloc {
    /// Free extents (offset, length), sorted by offset, never adjacent.
    free: Vec<(usize, usize)>,
}

impl SlotAlloc {
    pub(super) fn new(len: usize) -> SlotAlloc {
        SlotAlloc {
            free: vec![(0, len)],
        }
    }

    pub(super) fn alloc(&mut self, len: usize) -> Option<usize> {
        let len = len.div_ceil(PS_SLOT_ALIGN_BYTES) * PS_SLOT_ALIGN_BYTES;
        let i = self.free.iter().position(|&(_, l)| l >= len)?;
        let (off, l) = self.free[i];
        if l == len {
            self.free.remove(i);
        } else {
            self.free[i] = (off + len, l - len);
        }
        Some(off)
    }

    pub(super) fn free(&mut self, off: usize, len: usize) {
        let len = len.div_ceil(PS_SLOT_ALIGN_BYTES) * PS_SLOT_ALIGN_BYTES;
        let i = self.free.partition_point(|&(o, _)| o < off);
        self.free.insert(i, (off, len));
        // Merge with the next, then with the previous.
        if i + 1 < self.free.len() && self.free[i].0 + self.free[i].1 == self.free[i + 1].0 {
            self.free[i].1 += self.free[i + 1].1;
            self.free.remove(i + 1);
        }
        if i > 0 && self.free[i - 1].0 + self.free[i - 1].1 == self.free[i].0 {
            self.free[i - 1].1 += self.free[i].1;
            self.free.remove(i);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_are_reused_and_merged() {
        let mut a = SlotAlloc::new(1024);
        let x = a.alloc(100).expect("room");
        let y = a.alloc(100).expect("room");
        let z = a.alloc(100).expect("room");
        assert_eq!((x, y, z), (0, 128, 256));
        a.free(y, 100);
        a.free(x, 100);
        assert_eq!(a.alloc(200), Some(0), "freed neighbours merge");
        a.free(0, 200);
        a.free(z, 100);
        assert_eq!(a.free, vec![(0, 1024)], "everything merges back");
        assert_eq!(a.alloc(2048), None);
    }
}
