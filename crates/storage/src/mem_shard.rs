//! An in-memory [`ShardBackend`]: a `BTreeMap` behind a lock, with nothing
//! on disk. It exists so that the conformance suite (`tests.rs`) checks
//! every promise of the trait against a second implementation whose
//! behaviour is obvious, as TiKV runs its engine tests against each engine:
//! a test that passes on [`MemShard`] and fails on [`crate::FjallShard`]
//! points at the engine, not at the test. Tests of code above the trait
//! can use it too, with no directory and no fsync.
//!
//! A snapshot copies the map (`Arc` of a clone): cheap enough for test
//! sizes, and trivially a point-in-time view.

use std::collections::BTreeMap;
use std::ops::Bound;
use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard};

use crate::{
    check_write, Durability, Pair, PairIter, PairVisitor, Result, ShardBackend, ShardSnapshot,
    StorageError, Write,
};

/// The pairs of a [`MemShard`], in key order.
type Map = BTreeMap<Vec<u8>, Vec<u8>>;

/// A shard held in memory; see the module documentation.
#[derive(Debug, Default)]
pub struct MemShard {
    /// The pairs; a write takes the lock for the whole batch, so a batch is
    /// atomic to readers as the trait promises.
    map: RwLock<Map>,
}

impl MemShard {
    /// An empty shard.
    pub fn new() -> MemShard {
        MemShard::default()
    }

    fn read(&self) -> RwLockReadGuard<'_, Map> {
        self.map.read().unwrap_or_else(|p| p.into_inner())
    }

    fn write_lock(&self) -> RwLockWriteGuard<'_, Map> {
        self.map.write().unwrap_or_else(|p| p.into_inner())
    }
}

impl ShardBackend for MemShard {
    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>> {
        Ok(self.read().get(key).cloned())
    }

    fn write(&self, writes: &[Write<'_>], _durability: Durability) -> Result<()> {
        for w in writes {
            check_write(w)?;
        }
        let mut map = self.write_lock();
        for w in writes {
            match *w {
                Write::Put(k, v) => {
                    map.insert(k.to_vec(), v.to_vec());
                }
                Write::Delete(k) => {
                    map.remove(k);
                }
            }
        }
        Ok(())
    }

    fn snapshot(&self) -> Box<dyn ShardSnapshot> {
        Box::new(MemSnapshot(Arc::new(self.read().clone())))
    }

    fn sync(&self) -> Result<()> {
        Ok(())
    }

    fn approximate_len(&self) -> u64 {
        self.read().len() as u64
    }

    fn disk_bytes(&self) -> u64 {
        0
    }

    /// Checks the whole load first, so that a refused load leaves nothing
    /// visible, as the trait promises.
    fn load<F>(&self, mut next: F) -> Result<u64>
    where
        F: FnMut(&mut Vec<u8>, &mut Vec<u8>) -> Result<bool>,
    {
        let mut pairs: Vec<Pair> = Vec::new();
        let (mut key, mut value) = (Vec::new(), Vec::new());
        while next(&mut key, &mut value)? {
            check_write(&Write::Put(&key, &value))?;
            if pairs.last().is_some_and(|(last, _)| *last >= key) {
                return Err(StorageError::Engine(
                    "a bulk load's keys must ascend".to_string(),
                ));
            }
            pairs.push((key.clone(), value.clone()));
        }
        let n = pairs.len() as u64;
        self.write_lock().extend(pairs);
        Ok(n)
    }
}

/// A point-in-time copy of a [`MemShard`]'s pairs.
struct MemSnapshot(Arc<Map>);

impl ShardSnapshot for MemSnapshot {
    fn scan<'a>(&'a self, from: Bound<&[u8]>, to: Bound<&[u8]>) -> PairIter<'a> {
        Box::new(
            self.0
                .range::<[u8], _>((from, to))
                .map(|(k, v)| Ok((k.clone(), v.clone()))),
        )
    }

    fn scan_each(
        &self,
        from: Bound<&[u8]>,
        to: Bound<&[u8]>,
        each: &mut PairVisitor<'_>,
    ) -> Result<()> {
        for (k, v) in self.0.range::<[u8], _>((from, to)) {
            if !each(k, v)? {
                break;
            }
        }
        Ok(())
    }

    fn value_size(&self, key: &[u8]) -> Result<Option<u32>> {
        Ok(self.0.get(key).map(|v| v.len() as u32))
    }

    /// Every `len / n`-th key, the first included, as the fjall backend
    /// spreads its samples by count.
    fn sample_keys(&self, n: usize) -> Result<Vec<Vec<u8>>> {
        if n == 0 || self.0.is_empty() {
            return Ok(Vec::new());
        }
        let step = self.0.len().div_ceil(n).max(1);
        Ok(self.0.keys().step_by(step).take(n).cloned().collect())
    }
}
