//! Store mode: moving pages between size classes (memcached's
//! `slab_reassign` and `slab_automove`, without ever dropping an item).
//!
//! Emptying a page relocates each of its items into a free chunk of the
//! same class on another page: the item's bytes are copied whole (header,
//! key, value, meta; a large value's stub names the same large slot, so
//! the value itself never moves) and the one index slot that names the
//! old position is found by the item's hash, tag and offset and rewritten.
//! Items never change main bucket, so scans and the sweep's cursor are
//! unaffected. The emptied page goes back to the slab's free pages.

use fabrickv_types::KeyHash;

use crate::alloc::{Slab, AUTOMOVE_FREE_PAGES_MIN, REFUSAL_SLACK_PAGES_PER_CLASS};
use crate::index::pack;
use crate::item;
use crate::partition::{Core, Storage};

impl Core<Slab> {
    /// A chunk of `class`: from the class's pages, a free page, or else a
    /// page emptied out of another class (bounded work: one page). `None`
    /// only when no other class holds [`REFUSAL_SLACK_PAGES_PER_CLASS`]
    /// pages' worth of free chunks. Items of other classes may have moved
    /// when it returns (`Slab::pages_vacated` tells).
    pub(crate) fn alloc_chunk(&mut self, class: usize) -> Option<usize> {
        if let Some(pos) = self.storage.alloc(class) {
            return Some(pos);
        }
        let page = self
            .storage
            .pick_victim(Some(class), REFUSAL_SLACK_PAGES_PER_CLASS)?;
        self.vacate(page);
        self.storage.alloc(class)
    }

    /// The background mover's step: when no page is free, empties the
    /// emptiest page of the class with the most free bytes among those
    /// with [`AUTOMOVE_FREE_PAGES_MIN`] pages' worth of free chunks, so a
    /// write that needs a page finds one ready. Returns whether it did.
    pub(crate) fn automove(&mut self) -> bool {
        if self.storage.has_free_page() {
            return false;
        }
        match self.storage.pick_victim(None, AUTOMOVE_FREE_PAGES_MIN) {
            Some(page) => self.vacate(page),
            None => false,
        }
    }

    /// Moves every item of `page` to free chunks of its class elsewhere
    /// and gives the page back. Returns false, changing nothing, if they
    /// would not fit.
    fn vacate(&mut self, page: usize) -> bool {
        let Some(v) = self.storage.begin_vacate(page) else {
            return false;
        };
        let mut i = 0;
        let mut src = v.start;
        while src < v.end {
            if !self.storage.is_free_mark(i) {
                self.relocate(src, v.class);
            }
            i += 1;
            src += v.chunk_bytes;
        }
        self.storage.finish_vacate(&v);
        true
    }

    /// Copies the item at `src` into another chunk of `class` and points
    /// its index slot there.
    fn relocate(&mut self, src: usize, class: usize) {
        let header = item::read_header(self.storage.pool(), src);
        let hash = KeyHash(header.hash);
        let main = self.index.main_bucket(hash);
        let tag = self.tag_for(hash, item::key(self.storage.pool(), src, &header));
        let Some(at) = self.index.find_entry(main, pack(tag, src as u64)) else {
            // Every chunk in use is indexed between operations.
            debug_assert!(false, "a live chunk has no index slot");
            return;
        };
        let Some(dst) = self.storage.alloc_for_move(class) else {
            debug_assert!(false, "begin_vacate checked the class has room");
            return;
        };
        let n = header.item_bytes();
        self.storage.pool_mut().copy_within(src..src + n, dst);
        self.index.set(at, pack(tag, dst as u64));
        self.storage.count_relocated();
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use crate::testutil::{h, put_large, put_ok, sized};
    use crate::{
        item_bytes, GetRefResult, ItemMeta, LargeValue, Mode, Partition, PutCond, PutResult,
        ValueRef, LARGE_VALUE_BYTES_MIN,
    };

    /// A small deterministic generator (xorshift64*), so that the tests
    /// are the same on every run.
    struct Rng(u64);

    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
        }

        fn shuffle<T>(&mut self, v: &mut [T]) {
            for i in (1..v.len()).rev() {
                let j = (self.next() % (i as u64 + 1)) as usize;
                v.swap(i, j);
            }
        }
    }

    /// The value stored under key number `id`: `len` bytes that differ
    /// from every other key's.
    fn value_of(id: u64, len: usize) -> Vec<u8> {
        let seed = id.wrapping_mul(0x9e37_79b9_7f4a_7c15);
        (0..len)
            .map(|i| (seed >> ((i % 8) * 8)) as u8 ^ i as u8)
            .collect()
    }

    fn key_of(id: u64) -> [u8; 8] {
        id.to_le_bytes()
    }

    /// Writes values of `len` bytes under fresh keys until one is refused;
    /// checks the refusal against the documented bound and returns how
    /// many were stored.
    fn fill(
        p: &mut Partition,
        next_id: &mut u64,
        len: usize,
        live: &mut HashMap<u64, usize>,
    ) -> usize {
        let mut stored = 0;
        loop {
            let id = *next_id;
            *next_id += 1;
            let k = key_of(id);
            match p.put(h(&k), &k, &value_of(id, len), 0, PutCond::Always, 0) {
                PutResult::Stored => {
                    live.insert(id, len);
                    stored += 1;
                }
                PutResult::InsufficientSpace => {
                    let free = p.stats().slab_free_bytes;
                    let bound = p.refusal_bound_bytes(k.len(), len);
                    assert!(
                        free < bound,
                        "{len}-byte write refused with {free} bytes free (bound {bound})"
                    );
                    return stored;
                }
                other => panic!("unexpected {other:?}"),
            }
        }
    }

    #[test]
    fn shifting_sizes_are_refused_only_when_the_store_is_full() {
        let pool = 4 << 20;
        let mut p = sized(Mode::Store, pool, None);
        let page = p.page_bytes() as u64;
        let mut live = HashMap::new();
        let mut rng = Rng(0x5eed);
        let mut next_id = 0;
        let small = fill(&mut p, &mut next_id, 64, &mut live);
        assert!(small as u64 > (pool as u64 - page) / 104, "the pool filled");
        let mut ids: Vec<u64> = live.keys().copied().collect();
        ids.sort_unstable();
        rng.shuffle(&mut ids);
        for &id in &ids[..ids.len() / 2] {
            let k = key_of(id);
            assert_eq!(p.delete(h(&k), &k, 0), crate::DeleteResult::Deleted);
            live.remove(&id);
        }
        let free_after_delete = p.stats().slab_free_bytes;
        assert!(free_after_delete > pool as u64 / 3);
        let big = fill(&mut p, &mut next_id, 4096, &mut live);
        // Half the pool was freed: all of it but the stranded pages went
        // to 4 KiB values.
        let chunk = p.refusal_bound_bytes(8, 4096) - page;
        assert!(
            big as u64 * chunk >= free_after_delete - 2 * page,
            "{big} 4 KiB values in {free_after_delete} free bytes"
        );
        let mid = fill(&mut p, &mut next_id, 512, &mut live);
        let s = p.stats();
        assert!(s.slab_pages_moved > 0 && s.slab_items_relocated > 0);
        assert!(
            s.slab_free_bytes < 3 * page,
            "{mid} 512 B values; {} bytes left free",
            s.slab_free_bytes
        );
        // Relocation corrupted nothing: every surviving key reads back.
        for (&id, &len) in &live {
            let k = key_of(id);
            crate::testutil::assert_found(&mut p, &k, 0, &value_of(id, len), 0);
        }
        assert_eq!(p.stats().items, live.len() as u64);
        p.check();
    }

    /// What a key was stored as, to read back after relocation.
    #[derive(Debug)]
    enum Kind {
        Plain,
        Ttl(u64),
        Meta(ItemMeta),
        Large,
    }

    #[test]
    fn relocation_keeps_ttl_meta_large_stubs_and_lookups() {
        let mut p = sized(Mode::Store, 1 << 20, None);
        p.set_large_bytes_max(u64::MAX);
        // Four kinds of item, all of one 56-byte chunk class: 8-byte keys
        // with 24-byte values (plain, or with a TTL), 8-byte keys with
        // 8-byte values and meta, and large-value stubs under 24-byte keys.
        let plain = item_bytes(8, 24);
        assert_eq!(plain, crate::item::item_bytes_with(8, 8, true));
        assert_eq!(plain, item_bytes(24, crate::large::LARGE_STUB_BYTES));
        let large_every = 1000;
        let mut kinds: HashMap<Vec<u8>, (u64, Kind)> = HashMap::new();
        let mut id = 0u64;
        loop {
            let short = key_of(id).to_vec();
            let (key, kind, r) = match id % 4 {
                _ if id % large_every == 3 => {
                    let mut key = short.clone();
                    key.resize(24, b'L');
                    let v = LargeValue::copy_from(&value_of(id, LARGE_VALUE_BYTES_MIN));
                    let r = put_large(&mut p, &key, v);
                    (key, Kind::Large, r)
                }
                0 => {
                    let r = p.put(h(&short), &short, &value_of(id, 24), 0, PutCond::Always, 0);
                    (short, Kind::Plain, r)
                }
                1 => {
                    let exp = 1_000_000 + id;
                    let r = p.put(
                        h(&short),
                        &short,
                        &value_of(id, 24),
                        exp,
                        PutCond::Always,
                        0,
                    );
                    (short, Kind::Ttl(exp), r)
                }
                _ => {
                    let m = ItemMeta {
                        cas: id * 7 + 1,
                        client_flags: id as u32 ^ 0xdead_beef,
                    };
                    let k = &short;
                    let r = p.put_with_meta(h(k), k, &value_of(id, 8), 0, PutCond::Always, 0, m);
                    (short, Kind::Meta(m), r)
                }
            };
            match r {
                PutResult::Stored => {
                    kinds.insert(key, (id, kind));
                }
                PutResult::InsufficientSpace => break,
                other => panic!("unexpected {other:?}"),
            }
            id += 1;
        }
        assert!(
            kinds
                .values()
                .filter(|(_, k)| matches!(k, Kind::Large))
                .count()
                >= 10
        );
        // Delete three in four of the others at random, so every page keeps
        // a few items of each kind.
        let mut rng = Rng(7);
        let mut keys: Vec<Vec<u8>> = kinds.keys().cloned().collect();
        keys.sort_unstable();
        rng.shuffle(&mut keys);
        for key in keys
            .iter()
            .filter(|k| k.len() == 8)
            .take(keys.len() * 3 / 4)
        {
            assert_eq!(p.delete(h(key), key, 0), crate::DeleteResult::Deleted);
            kinds.remove(key);
        }
        let before: HashMap<Vec<u8>, usize> = kinds
            .keys()
            .map(|k| (k.clone(), p.position_of(k).expect("stored")))
            .collect();
        // Values of a whole page each take the freed space page by page.
        let big = p.max_item_value_bytes();
        let mut n = 0u64;
        loop {
            let k = (u64::MAX - n).to_le_bytes();
            match p.put(h(&k), &k, &vec![9; big], 0, PutCond::Always, 0) {
                PutResult::Stored => n += 1,
                PutResult::InsufficientSpace => break,
                other => panic!("unexpected {other:?}"),
            }
        }
        assert!(n >= 8, "{n} pages emptied for the big values");
        let s = p.stats();
        assert!(s.slab_items_relocated > 0 && s.slab_pages_moved >= n);
        let mut moved = [0usize; 4];
        for (key, (id, kind)) in &kinds {
            let pos = p.position_of(key).expect("still indexed");
            let i = match kind {
                Kind::Plain => 0,
                Kind::Ttl(_) => 1,
                Kind::Meta(_) => 2,
                Kind::Large => 3,
            };
            moved[i] += usize::from(pos != before[key]);
            let id = *id;
            match kind {
                Kind::Plain => crate::testutil::assert_found(&mut p, key, 0, &value_of(id, 24), 0),
                Kind::Ttl(exp) => {
                    crate::testutil::assert_found(&mut p, key, 0, &value_of(id, 24), *exp);
                    assert_eq!(p.get(h(key), key, *exp), crate::GetResult::NotFound);
                }
                Kind::Meta(m) => {
                    let v = p.get_item(h(key), key, 0).expect("found");
                    assert_eq!((v.value, v.expire_at_ms), (&value_of(id, 8)[..], 0));
                    assert_eq!(v.meta, Some(*m));
                }
                Kind::Large => match p.get_ref(h(key), key, 0) {
                    GetRefResult::Found {
                        value: ValueRef::Large(v),
                        expire_at_ms: 0,
                    } => assert_eq!(&v[..], &value_of(id, LARGE_VALUE_BYTES_MIN)[..]),
                    other => panic!("large value lost: {:?}", other_kind(&other)),
                },
            }
        }
        assert!(
            moved.iter().all(|&m| m > 0),
            "every kind was relocated: {moved:?}"
        );
        p.check();
    }

    fn other_kind(r: &GetRefResult<'_>) -> &'static str {
        match r {
            GetRefResult::Found {
                value: ValueRef::Inline(_),
                ..
            } => "inline",
            GetRefResult::Found { .. } => "large with a TTL",
            GetRefResult::NotFound => "not found",
        }
    }

    #[test]
    fn background_mover_empties_one_page_per_sweep_and_only_when_needed() {
        let mut p = sized(Mode::Store, 1 << 20, None);
        let page = p.page_bytes();
        let per_page = page / item_bytes(8, 64);
        let mut live = HashMap::new();
        let mut next_id = 0;
        let stored = fill(&mut p, &mut next_id, 64, &mut live);
        // A full pool with no free chunk anywhere: nothing to move.
        assert_eq!(p.sweep(0, 0), 0);
        assert_eq!(p.stats().slab_items_relocated, 0);
        let mut rng = Rng(11);
        let mut ids: Vec<u64> = live.keys().copied().collect();
        ids.sort_unstable();
        rng.shuffle(&mut ids);
        // Free two thirds of the items, leaving every page part full.
        for &id in &ids[..stored * 2 / 3] {
            let k = key_of(id);
            assert_eq!(p.delete(h(&k), &k, 0), crate::DeleteResult::Deleted);
            live.remove(&id);
        }
        let mut relocated = p.stats().slab_items_relocated;
        assert_eq!(relocated, 0, "deletes move nothing");
        // One sweep empties one page: at most a page of items moves.
        p.sweep(0, 0);
        let step = p.stats().slab_items_relocated - relocated;
        assert!(step > 0 && step as usize <= per_page, "{step} items moved");
        relocated += step;
        // With a page ready, the next sweep leaves everything alone.
        p.sweep(0, 0);
        assert_eq!(p.stats().slab_items_relocated, relocated);
        // A write of another size takes the ready page without moving
        // anything itself.
        let k = u64::MAX.to_le_bytes();
        let big = vec![3u8; page / 2];
        put_ok(&mut p, &k, &big, 0);
        let s = p.stats();
        assert_eq!((s.slab_items_relocated, s.slab_pages_moved), (relocated, 1));
        // The next sweep prepares the next page, again one page's worth.
        p.sweep(0, 0);
        let step = p.stats().slab_items_relocated - relocated;
        assert!(step > 0 && step as usize <= per_page, "{step} items moved");
        for (&id, &len) in &live {
            let k = key_of(id);
            crate::testutil::assert_found(&mut p, &k, 0, &value_of(id, len), 0);
        }
        p.check();
    }

    #[test]
    fn random_shifting_sizes_match_a_model() {
        let mut p = sized(Mode::Store, 256 << 10, None);
        let mut model: HashMap<u64, Vec<u8>> = HashMap::new();
        let mut rng = Rng(0xfab);
        let sizes = [8usize, 60, 200, 1000, 3000, 9000];
        let mut refused = 0;
        for step in 0..40_000u64 {
            // The favoured sizes shift every 5,000 steps.
            let phase = (step / 5_000) as usize;
            let r = rng.next();
            let size = sizes[(phase + (r % 3) as usize) % sizes.len()];
            let id = (r >> 8) % 3_000;
            let k = key_of(id);
            match (r >> 40) % 10 {
                0..=2 => {
                    let gone = p.delete(h(&k), &k, 0) == crate::DeleteResult::Deleted;
                    assert_eq!(gone, model.remove(&id).is_some());
                }
                3 => {
                    p.sweep(0, 4);
                }
                _ => {
                    let v = value_of(step, size);
                    match p.put(h(&k), &k, &v, 0, PutCond::Always, 0) {
                        PutResult::Stored => {
                            model.insert(id, v);
                        }
                        PutResult::InsufficientSpace => {
                            refused += 1;
                            let free = p.stats().slab_free_bytes;
                            let bound = p.refusal_bound_bytes(k.len(), size);
                            assert!(free < bound, "refused with {free} free (bound {bound})");
                        }
                        other => panic!("unexpected {other:?}"),
                    }
                }
            }
            if step % 2_000 == 0 {
                p.check();
            }
        }
        assert!(refused > 0, "the pool filled");
        assert!(p.stats().slab_items_relocated > 0);
        for (id, v) in &model {
            let k = key_of(*id);
            crate::testutil::assert_found(&mut p, &k, 0, v, 0);
        }
        assert_eq!(p.stats().items, model.len() as u64);
        p.check();
    }
}
