//! Shard copy, the target side: `fabrickv copy` pulls a shard from a server
//! that serves it into a local directory. It replaces the RocksDB
//! replicator with what that tool got wrong fixed: empty keys copy, a
//! crash resumes, the result is verified.
//!
//! The wire formats are `fabrickv_wire::copy`; the source side is the
//! server's shard service (`fabrickv_server::shard::copy_source`); the
//! target writes through `fabrickv_storage::ShardBackend`.
//!
//! Layout, one concern per module:
//! - [`options`]: what to copy and how ([`CopyOptions`]), and the defaults;
//! - [`report`]: the [`Event`]s a copy reports as it goes and its
//!   [`CopyReport`], with the rate samples a caller may plot;
//! - [`error`]: [`CopyError`], a stable code and what happened;
//! - `run`: one copy run at the source (CHECKPOINT, STATUS, START, END)
//!   and the order of a copy's steps ([`copy`]);
//! - `progress`: the resume state (the progress file) and the preparation
//!   of the target directory;
//! - `control`: the STATUS op and what a failed status means;
//! - `shared`: the state a copy's threads share, and the checked frames a
//!   receiver hands its writer;
//! - `streams`: connecting the data streams and watching them;
//! - `receive`: a stream's receiver, which checks every frame;
//! - `load`: a stream's writer, which bulk-loads and records durable
//!   positions;
//! - `verify`: the final scan against the source's digests.
//!
//! The copy's benchmark (`bench copy`), its raw-pipe floor and its rate
//! plot live in `fabrickv-bench`.

pub mod error;
pub mod options;
pub mod report;

mod control;
mod load;
mod progress;
mod receive;
mod run;
mod shared;
mod streams;
mod verify;

use std::sync::{Mutex, MutexGuard};

pub use error::CopyError;
pub use options::{
    CopyOptions, COPY_DURABLE_BYTES_DEFAULT, COPY_PARALLELISM_DEFAULT, COPY_RANGES_DEFAULT,
    COPY_SPLIT_POLL_MS, COPY_STATUS_POLL_MS, COPY_TARGET_CACHE_BYTES,
};
pub use progress::COPY_PROGRESS_FILE;
pub use report::{CopyReport, Event};
pub use run::copy;
pub use streams::{COPY_QUEUE_FRAMES, COPY_SAMPLE_INTERVAL_MS};

/// Locks `m`; a panicked holder left plain data behind, still usable.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}
