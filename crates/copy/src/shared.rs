//! What a copy's threads share: the [`Shared`] state (progress, counters,
//! the first failure) and the checked frames ([`Item`]) a receiver hands
//! its writer.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;

use fabrickv_types::Digest;

use crate::error::CopyError;
use crate::lock;
use crate::progress::Progress;

/// State the streams share with the control loop.
pub(crate) struct Shared {
    /// The target directory, where the progress file is saved.
    pub(crate) dir: PathBuf,
    /// Every range's durable position; each writer saves it after a load.
    pub(crate) progress: Mutex<Progress>,
    /// Pairs written by this run, for progress events.
    pub(crate) pairs: AtomicU64,
    /// Key and value bytes written by this run, for the rate.
    pub(crate) bytes: AtomicU64,
    /// The first failure of any thread: the copy's error.
    pub(crate) failure: Mutex<Option<CopyError>>,
    /// Set on the first failure, so every other thread stops.
    pub(crate) stop: AtomicBool,
    /// `CopyOptions::durable_every_bytes`, at least 1.
    pub(crate) durable_every: u64,
    /// `CopyOptions::keep_cached`.
    pub(crate) keep_cached: bool,
}

impl Shared {
    pub(crate) fn fail(&self, e: CopyError) {
        let mut f = lock(&self.failure);
        if f.is_none() {
            *f = Some(e);
        }
        self.stop.store(true, Ordering::Release);
    }

    pub(crate) fn failed(&self) -> Option<CopyError> {
        lock(&self.failure).clone()
    }
}

/// A checked frame on its way from a receiver to its writer.
pub(crate) struct Item {
    /// The range the frame belongs to.
    pub(crate) range: u32,
    /// Its sequence number in the range.
    pub(crate) seq: u64,
    /// An END_OF_RANGE frame: the range is complete after it.
    pub(crate) end: bool,
    /// The range's running digest after the frame, checked.
    pub(crate) digest: Digest,
    /// Pairs in the payload.
    pub(crate) pairs: u64,
    /// The frame's payload.
    pub(crate) buf: Vec<u8>,
}
