//! The gRPC control plane of the KV-cache service (being written).
