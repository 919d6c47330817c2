//! Shard copy, pulled by the target (the seed's XDP-Rocks replicator, with
//! what it got wrong fixed: empty keys copy, a crash resumes, the result is
//! verified).
//!
//! - [`proto`]: the control payloads (in SHARD frames) and the data
//!   streams' frames;
//! - [`source`]: copy sessions inside a server that serves the shard:
//!   a consistent checkpoint split into ranges, range iterators feeding
//!   bounded queues, one TCP data stream per parallel range;
//! - [`target`]: `fabrickv copy`: checks every frame, bulk-loads each
//!   range without a journal, records durable positions for `--resume`,
//!   verifies the copy's digest;
//! - [`plot`]: the PNG of the copy rate over time;
//! - [`pipe`]: the raw pipe (TCP socket into a file) the copy is measured
//!   against.

pub mod pipe;
pub mod plot;
pub mod proto;
pub mod source;
pub mod target;
