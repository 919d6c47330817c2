//! Shard copy, pulled by the target (the seed's XDP-Rocks replicator, with
//! what it got wrong fixed: empty keys copy, a crash resumes, the result is
//! verified).
//!
//! - [`source`]: copy sessions inside a server that serves the shard:
//!   a consistent checkpoint split into ranges, range iterators feeding
//!   bounded queues, one TCP data stream per parallel range.

pub mod pipe;
pub mod plot;
pub mod source;
