//! The resume state: the progress file in the target directory, which
//! records what was copied from where and each range's durable position
//! (next sequence, running digest, last key), and the preparation of the
//! directory before a copy (empty, resume, or refuse).

use std::io::Write as _;
use std::path::{Path, PathBuf};

use fabrickv_types::{Digest, ErrorCode};
use fabrickv_wire::copy::ResumePoint;
use serde::{Deserialize, Serialize};

use crate::error::{err, CopyError};
use crate::options::CopyOptions;

/// The file in the target directory that records a copy's progress.
pub const COPY_PROGRESS_FILE: &str = "fabrickv-copy.progress";

/// A range's durable position, as the progress file keeps it.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub(crate) struct RangeProgress {
    /// The range was loaded to its end.
    pub(crate) done: bool,
    /// The sequence number of the range's next frame.
    pub(crate) next_seq: u64,
    /// Pairs of the range durable here.
    pub(crate) pairs: u64,
    /// Their key and value bytes.
    pub(crate) bytes: u64,
    /// The digest sum, 32 hex digits.
    pub(crate) sum: String,
    /// The last durable key, hex.
    pub(crate) after: String,
}

impl RangeProgress {
    pub(crate) fn digest(&self) -> Result<Digest, CopyError> {
        let sum = u128::from_str_radix(&self.sum, 16)
            .map_err(|_| err(ErrorCode::Malformed, "progress file: a bad digest"))?;
        Ok(Digest {
            pairs: self.pairs,
            bytes: self.bytes,
            sum,
        })
    }

    pub(crate) fn set(&mut self, next_seq: u64, d: &Digest, after: &[u8], done: bool) {
        self.next_seq = next_seq;
        self.pairs = d.pairs;
        self.bytes = d.bytes;
        self.sum = format!("{:032x}", d.sum);
        self.after = hex(after);
        self.done = done;
    }
}

/// The progress file: what was copied from where, and each range's
/// durable position.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Progress {
    /// `PROGRESS_VERSION`: a file of another layout is refused.
    pub(crate) version: u32,
    /// The source's address (a resume may come from another).
    pub(crate) from: String,
    /// The shard's name on the source (a resume must name the same).
    pub(crate) shard: String,
    /// Lower bounds of ranges 1.., hex.
    pub(crate) boundaries: Vec<String>,
    /// Each range's durable position (empty until the split is known).
    pub(crate) ranges: Vec<RangeProgress>,
    /// The copy was verified (or finished unverified) to its end.
    pub(crate) complete: bool,
}

/// Version of the progress file's layout.
pub(crate) const PROGRESS_VERSION: u32 = 1;

pub(crate) fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

pub(crate) fn unhex(s: &str) -> Result<Vec<u8>, CopyError> {
    let bad = || err(ErrorCode::Malformed, "progress file: bad hex");
    if !s.len().is_multiple_of(2) {
        return Err(bad());
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2).ok_or_else(bad)?, 16).map_err(|_| bad()))
        .collect()
}

impl Progress {
    pub(crate) fn path(dir: &Path) -> PathBuf {
        dir.join(COPY_PROGRESS_FILE)
    }

    pub(crate) fn load(dir: &Path) -> Result<Option<Progress>, CopyError> {
        let text = match std::fs::read_to_string(Self::path(dir)) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(err(ErrorCode::StorageFailed, format!("progress file: {e}"))),
        };
        let p: Progress = serde_json::from_str(&text)
            .map_err(|e| err(ErrorCode::Malformed, format!("progress file: {e}")))?;
        let split = p.ranges.len() == p.boundaries.len() + 1;
        let unsplit = p.ranges.is_empty() && p.boundaries.is_empty();
        if p.version != PROGRESS_VERSION || !(split || unsplit) {
            return Err(err(
                ErrorCode::Malformed,
                "progress file of another version",
            ));
        }
        Ok(Some(p))
    }

    /// Writes the file durably: a temporary file, synced, renamed over the
    /// old one, and the directory synced, so a crash leaves the old or the
    /// new file whole.
    pub(crate) fn save(&self, dir: &Path) -> Result<(), CopyError> {
        let io = |e: std::io::Error| err(ErrorCode::StorageFailed, format!("progress file: {e}"));
        let tmp = dir.join(format!("{COPY_PROGRESS_FILE}.tmp"));
        let text = serde_json::to_vec(self).map_err(|e| err(ErrorCode::Internal, e.to_string()))?;
        let mut f = {
            use std::os::unix::fs::OpenOptionsExt;
            std::fs::OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .mode(fabrickv_storage::SHARD_FILE_MODE)
                .open(&tmp)
                .map_err(io)?
        };
        f.write_all(&text).map_err(io)?;
        f.sync_all().map_err(io)?;
        std::fs::rename(&tmp, Self::path(dir)).map_err(io)?;
        std::fs::File::open(dir)
            .and_then(|d| d.sync_all())
            .map_err(io)
    }

    pub(crate) fn boundaries(&self) -> Result<Vec<Vec<u8>>, CopyError> {
        self.boundaries.iter().map(|b| unhex(b)).collect()
    }

    pub(crate) fn resume_points(&self) -> Result<Vec<ResumePoint>, CopyError> {
        let mut v = Vec::new();
        for (r, p) in self.ranges.iter().enumerate() {
            if p.done || p.pairs > 0 {
                v.push(ResumePoint {
                    range: r as u32,
                    done: p.done,
                    next_seq: p.next_seq,
                    digest: p.digest()?,
                    after: unhex(&p.after)?,
                });
            }
        }
        Ok(v)
    }
}

/// Makes the target directory ready: returns the progress to resume from,
/// if any. Without `resume`, a directory holding an earlier copy (its
/// progress file) is emptied; one holding anything else is refused, so a
/// copy never deletes data it did not write.
pub(crate) fn prepare(opts: &CopyOptions) -> Result<Option<Progress>, CopyError> {
    let dir = &opts.to;
    let io = |e: std::io::Error| err(ErrorCode::StorageFailed, format!("{}: {e}", dir.display()));
    let empty = match std::fs::read_dir(dir) {
        Ok(mut it) => it.next().is_none(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => true,
        Err(e) => return Err(io(e)),
    };
    if empty {
        fabrickv_storage::create_private_dir(dir).map_err(io)?;
        return Ok(None);
    }
    let progress = Progress::load(dir)?;
    let Some(p) = progress else {
        return Err(err(
            ErrorCode::ConditionFailed,
            format!(
                "{} is not empty and holds no copy (no {COPY_PROGRESS_FILE}); give an empty or new directory",
                dir.display()
            ),
        ));
    };
    if opts.resume && p.shard == opts.shard && !p.ranges.is_empty() {
        if p.from != opts.from {
            tracing::info!(
                "resuming a copy of {:?} made from {}, now from {}",
                p.shard,
                p.from,
                opts.from
            );
        }
        return Ok(Some(p));
    }
    if opts.resume {
        tracing::warn!(
            "{} holds no resumable copy of {:?} (it has {:?}, split: {}): starting over",
            dir.display(),
            opts.shard,
            p.shard,
            !p.ranges.is_empty()
        );
    }
    std::fs::remove_dir_all(dir).map_err(io)?;
    fabrickv_storage::create_private_dir(dir).map_err(io)?;
    Ok(None)
}

/// Marks a fresh target directory as a copy's before anything else is
/// written to it, so a copy that fails at any point leaves a directory a
/// rerun recognises (and empties, or resumes).
pub(crate) fn claim(opts: &CopyOptions) -> Result<(), CopyError> {
    Progress {
        version: PROGRESS_VERSION,
        from: opts.from.clone(),
        shard: opts.shard.clone(),
        boundaries: Vec::new(),
        ranges: Vec::new(),
        complete: false,
    }
    .save(&opts.to)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_and_digests_round_trip_through_hex() {
        for key in [&b""[..], b"\x00\xff", b"key"] {
            assert_eq!(unhex(&hex(key)).expect("hex"), key);
        }
        assert!(unhex("abc").is_err(), "odd length");
        assert!(unhex("zz").is_err(), "not hex");
        let mut d = Digest::default();
        d.add(b"", b"the empty key");
        let mut r = RangeProgress::default();
        r.set(7, &d, b"\x01k", false);
        assert_eq!(r.digest().expect("digest"), d);
        assert_eq!(
            (r.next_seq, unhex(&r.after).expect("after")),
            (7, b"\x01k".to_vec())
        );
    }

    #[test]
    fn the_progress_file_round_trips_and_a_torn_one_is_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        assert!(Progress::load(dir.path()).expect("load").is_none());
        let p = Progress {
            version: PROGRESS_VERSION,
            from: "127.0.0.1:7379".into(),
            shard: "s".into(),
            boundaries: vec![hex(b"m")],
            ranges: vec![RangeProgress::default(); 2],
            complete: false,
        };
        p.save(dir.path()).expect("save");
        let back = Progress::load(dir.path()).expect("load").expect("a file");
        assert_eq!(back.boundaries().expect("boundaries"), vec![b"m".to_vec()]);
        assert_eq!(back.ranges, p.ranges);
        assert!(back.resume_points().expect("points").is_empty());
        // Ranges that disagree with the boundaries: another layout.
        let torn = Progress {
            ranges: vec![RangeProgress::default(); 3],
            ..p
        };
        torn.save(dir.path()).expect("save");
        assert!(Progress::load(dir.path()).is_err());
    }
}
