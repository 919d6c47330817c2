//! Vocabulary shared by every FabricKV crate.
//!
//! Layout:
//! - [`limits`]: every bound of the system as a named constant with its unit,
//!   checked against each other at compile time.
//! - [`code`]: the stable error codes that cross the wire.
//! - [`hash`]: the key hash and the mapping from a hash to a partition, used
//!   identically by clients (to steer) and servers (to verify ownership).
//! - [`slot`]: a key's cluster slot (Redis Cluster's CRC16 placement).
//! - [`size`]: parsing of human sizes such as `64MB`.
//! - [`cpus`]: parsing of CPU lists such as `0,2-3`.
//! - [`digest`]: the order-independent digest of a set of key-value pairs
//!   that `shard checksum` prints and both ends of a shard copy compute.
//!
//! This crate has no I/O and no dependency on any other FabricKV crate, so
//! that everything else can depend on it.

pub mod code;
pub mod cpus;
pub mod digest;
pub mod hash;
pub mod limits;
pub mod size;
pub mod slot;
pub mod transfer;

pub use code::ErrorCode;
pub use digest::{Digest, PairDigest};
pub use hash::KeyHash;
