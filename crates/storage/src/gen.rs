//! Deterministic shard contents for `fabrickv shard gen` and the copy
//! benchmarks: pair `i` of `n` is the same for a given seed on every
//! machine, so two runs can be compared by digest alone. [`generate`]
//! writes such a shard; both commands call it, each with its own way of
//! showing progress.
//!
//! Keys ascend with `i` (so a shard is bulk-loaded without a journal) and
//! are spread over the whole key space: the first 8 bytes are `i` times
//! `2^64 / n` (big-endian), the rest a hash of the seed and `i`. Values are
//! pseudo-random bytes, uncompressible as the RocksDB shard replicator's
//! benchmark values were (`GenSpec::seed` is the generator's seed).

use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Instant;

use crate::{FjallShard, ShardBackend, ShardOptions, StorageError};

/// Smallest key `shard gen` makes, in bytes: the 8-byte ascending prefix.
pub const GEN_KEY_BYTES_MIN: usize = 8;

/// Pairs written between two calls of [`generate`]'s progress callback:
/// often enough for a progress bar, rare enough to cost nothing per pair.
pub const GEN_PROGRESS_PAIRS: u64 = 4096;

/// A fast 64-bit mixer (splitmix64's finaliser).
#[inline]
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// What `shard gen` makes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GenSpec {
    /// Pairs.
    pub pairs: u64,
    /// Bytes of every key (at least [`GEN_KEY_BYTES_MIN`]).
    pub key_bytes: usize,
    /// Bytes of every value.
    pub value_bytes: usize,
    /// Seed of the contents.
    pub seed: u64,
}

impl GenSpec {
    /// The pairs of about `size_bytes` of keys and values.
    pub fn for_size(size_bytes: u64, key_bytes: usize, value_bytes: usize, seed: u64) -> GenSpec {
        let per = (key_bytes + value_bytes).max(1) as u64;
        GenSpec {
            pairs: size_bytes / per,
            key_bytes,
            value_bytes,
            seed,
        }
    }

    /// Writes key `i` into `out` (of `key_bytes`).
    pub fn key(&self, i: u64, out: &mut [u8]) {
        let stride = (u64::MAX / self.pairs.max(1)).max(1);
        out[..8].copy_from_slice(&i.wrapping_mul(stride).to_be_bytes());
        fill(mix(self.seed ^ mix(i)), &mut out[8..]);
    }

    /// Writes value `i` into `out` (of `value_bytes`).
    pub fn value(&self, i: u64, out: &mut [u8]) {
        fill(
            mix(self.seed.rotate_left(17) ^ i.wrapping_mul(0x9e37_79b9_7f4a_7c15)),
            out,
        );
    }
}

/// Fills `out` with a pseudo-random stream from `state` (xorshift-style
/// steps of splitmix64, eight bytes at a time).
fn fill(mut state: u64, out: &mut [u8]) {
    for c in out.chunks_mut(8) {
        state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let w = mix(state).to_le_bytes();
        c.copy_from_slice(&w[..c.len()]);
    }
}

/// Why [`generate`] made no shard. The messages are the ones `shard gen`
/// prints.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum GenError {
    /// The directory already holds something; a generated shard is
    /// always new, so that its digest is the spec's alone.
    #[error("{} is not empty: shard gen makes a new shard", .0.display())]
    NotEmpty(PathBuf),
    /// The shard could not be created.
    #[error("{}: {source}", path.display())]
    Open {
        /// The shard's directory.
        path: PathBuf,
        /// The cause.
        source: StorageError,
    },
    /// Writing the pairs failed.
    #[error("writing {}: {source}", path.display())]
    Write {
        /// The shard's directory.
        path: PathBuf,
        /// The cause.
        source: StorageError,
    },
}

/// What [`generate`] made; its `Display` is the line `shard gen` prints
/// after "shard gen: ".
#[derive(Debug, Clone, PartialEq)]
pub struct Generated {
    /// What was asked for.
    pub spec: GenSpec,
    /// Pairs written.
    pub pairs: u64,
    /// Seconds the load took (opening the shard not counted).
    pub secs: f64,
    /// Bytes the shard takes on disk afterwards.
    pub disk_bytes: u64,
    /// The shard's directory.
    pub path: PathBuf,
}

impl Generated {
    /// Bytes of keys and values written.
    pub fn bytes(&self) -> u64 {
        self.pairs * (self.spec.key_bytes + self.spec.value_bytes) as u64
    }
}

impl fmt::Display for Generated {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mb = self.bytes() as f64 / 1e6;
        write!(
            f,
            "{} pairs ({} B keys, {} B values, seed {}), {:.1} MB in {:.1} s ({:.1} MB/s), {:.1} MB on disk at {}",
            self.pairs,
            self.spec.key_bytes,
            self.spec.value_bytes,
            self.spec.seed,
            mb,
            self.secs,
            mb / self.secs.max(1e-9),
            self.disk_bytes as f64 / 1e6,
            self.path.display()
        )
    }
}

/// Writes the shard `spec` describes at `path`, which must be new or
/// empty, with one bulk load. `progress` is called with the bytes of keys
/// and values written so far every [`GEN_PROGRESS_PAIRS`] pairs (the
/// total is `spec.pairs * (key_bytes + value_bytes)`).
pub fn generate(
    path: &Path,
    spec: &GenSpec,
    progress: &mut dyn FnMut(u64),
) -> Result<Generated, GenError> {
    let nonempty = std::fs::read_dir(path)
        .map(|mut d| d.next().is_some())
        .unwrap_or(false);
    if nonempty {
        return Err(GenError::NotEmpty(path.to_path_buf()));
    }
    let shard =
        FjallShard::open(path, &ShardOptions::default()).map_err(|source| GenError::Open {
            path: path.to_path_buf(),
            source,
        })?;
    let per = (spec.key_bytes + spec.value_bytes) as u64;
    let started = Instant::now();
    let mut i = 0u64;
    let pairs = shard
        .load(|key, value| {
            if i == spec.pairs {
                return Ok(false);
            }
            key.resize(spec.key_bytes, 0);
            value.resize(spec.value_bytes, 0);
            spec.key(i, key);
            spec.value(i, value);
            i += 1;
            if i.is_multiple_of(GEN_PROGRESS_PAIRS) {
                progress(i * per);
            }
            Ok(true)
        })
        .map_err(|source| GenError::Write {
            path: path.to_path_buf(),
            source,
        })?;
    let disk_bytes = shard.disk_bytes();
    // Closed first (fjall writes on closing), then what fjall wrote got
    // the process's umask: a shard is its owner's only.
    drop(shard);
    crate::restrict_to_owner(path).map_err(|source| GenError::Write {
        path: path.to_path_buf(),
        source: StorageError::Io {
            what: format!("restricting {}", path.display()),
            source,
        },
    })?;
    Ok(Generated {
        spec: *spec,
        pairs,
        secs: started.elapsed().as_secs_f64(),
        disk_bytes,
        path: path.to_path_buf(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generates_the_spec_and_refuses_a_directory_in_use() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("s");
        let spec = GenSpec::for_size(3 * GEN_PROGRESS_PAIRS * 24, 8, 16, 7);
        let mut shown = Vec::new();
        let made = generate(&path, &spec, &mut |b| shown.push(b)).expect("generate");
        assert_eq!(made.pairs, spec.pairs);
        assert_eq!(made.bytes(), spec.pairs * 24);
        let per_call = GEN_PROGRESS_PAIRS * 24;
        assert_eq!(shown, vec![per_call, 2 * per_call, 3 * per_call]);
        assert!(made.to_string().starts_with(&format!(
            "{} pairs (8 B keys, 16 B values, seed 7), ",
            spec.pairs
        )));

        let again = generate(&path, &spec, &mut |_| {}).expect_err("directory in use");
        assert!(matches!(again, GenError::NotEmpty(_)), "{again}");
        assert_eq!(
            again.to_string(),
            format!(
                "{} is not empty: shard gen makes a new shard",
                path.display()
            )
        );
    }
}
