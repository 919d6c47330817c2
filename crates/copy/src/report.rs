//! What a copy tells its caller: [`Event`]s as it goes, a [`CopyReport`]
//! at the end, with the rate samples a caller may plot (the plot itself is
//! `fabrickv_bench::plot`, so the copy links no drawing library).

use fabrickv_types::Digest;

/// What a copy reports as it goes.
#[derive(Debug, Clone, Copy)]
pub enum Event<'a> {
    /// Streaming begins.
    Started {
        /// Ranges of the checkpoint.
        ranges: u32,
        /// Ranges already done by an earlier run (resume).
        ranges_done: u32,
        /// The source's estimate of the shard's key and value bytes.
        bytes_estimate: u64,
        /// Bytes already durable from an earlier run (resume).
        bytes_before: u64,
    },
    /// Pairs and bytes written so far (this run).
    Progress {
        /// Pairs.
        pairs: u64,
        /// Key and value bytes.
        bytes: u64,
    },
    /// A line for the log.
    Log(&'a str),
}

/// What a finished copy did.
#[derive(Debug, Clone)]
pub struct CopyReport {
    /// Pairs in the copy (all runs).
    pub pairs: u64,
    /// Key and value bytes in the copy (all runs).
    pub bytes: u64,
    /// Bytes streamed and written by this run.
    pub bytes_this_run: u64,
    /// Seconds from START to every range synced.
    pub copy_secs: f64,
    /// Seconds of the verification scan (0 when off).
    pub verify_secs: f64,
    /// The copy's digest.
    pub digest: Digest,
    /// Ranges of the checkpoint.
    pub ranges: u32,
    /// Ranges an earlier run had finished.
    pub ranges_resumed: u32,
    /// The rate over time: (seconds since START, MB/s over the interval).
    pub samples: Vec<(f64, f64)>,
    /// Whether the scan confirmed the digest.
    pub verified: bool,
}

impl CopyReport {
    /// MB/s (decimal) of this run's bytes over `copy_secs`.
    pub fn mb_per_s(&self) -> f64 {
        self.bytes_this_run as f64 / self.copy_secs.max(1e-9) / 1e6
    }
}
