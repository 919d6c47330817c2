//! Physical limits and peers that `fabrickv bench ps` holds FabricKV's
//! batched pulls against, measured in the same run, on the same CPUs:
//!
//! - [`memcpy_bandwidth`] (`limit.memcpy`): one thread copying chunks from
//!   one buffer into another. Over shm a pull can go no faster than the
//!   copy of its values out of the shared segment, so its pulled bytes/s
//!   are judged against this;
//! - [`tcp_request_response`] (`limit.tcp_reqresp`): raw TCP over loopback,
//!   a server answering each fixed-size request with a prebuilt reply of a
//!   fixed size, requests pipelined: the floor under a pull of the same
//!   request and reply sizes, which no kv server can beat;
//! - [`tcp_stream`] (`limit.tcp_stream`): one-direction bulk TCP, the
//!   single-stream ceiling (iperf3's number) that no reply traffic exceeds;
//! - [`redis_mget`] (`peer.redis_mget`): redis-server answering
//!   redis-benchmark's MGETs of random preloaded keys, the peer a batched
//!   pull is compared with.
//!
//! Every result type has a `json` method giving one JSON object per line
//! with a `"bench"` field naming which of these it is.
//!
//! Layout: [`check`] (bounds, argument checks, JSON lines, shared with the
//! RPC baselines and the split), [`pair`] (two pinned ends of a loopback
//! measurement), [`memcpy`] (memcpy and gather), [`tcp`] (request/response
//! and stream), [`redis`] (MGET).

pub mod check;
pub mod memcpy;
pub mod pair;
pub mod redis;
pub mod tcp;

pub use memcpy::{
    gather_bandwidth, memcpy_bandwidth, GatherRate, MemcpyRate, GATHER_BATCH_MAX,
    GATHER_PREFETCH_DISTANCE, GATHER_PREFETCH_LINES, MEMCPY_CHUNK_BYTES_MAX,
    MEMCPY_WORKING_SET_BYTES_DEFAULT, MEMCPY_WORKING_SET_BYTES_MAX,
};
pub use redis::{
    redis_mget, RedisMgetOpts, RedisMgetRate, REDIS_CONNS_DEFAULT, REDIS_CONNS_MAX,
    REDIS_MGET_KEYS_MAX, REDIS_PRELOAD_BYTES_MAX, REDIS_VALUE_BYTES_MAX,
};
pub use tcp::{
    tcp_request_response, tcp_stream, TcpPattern, TcpRate, TCP_DEPTH_MAX,
    TCP_REQ_BYTES_IN_FLIGHT_MAX, TCP_REQ_BYTES_MAX, TCP_RESP_BYTES_MAX, TCP_STREAM_WRITE_BYTES,
};

/// The CPUs of a two-ended limit (raw TCP) measured beside a server on
/// `server` and clients on `client`: the first server CPU, and the first
/// client CPU other than it. Where client threads share CPUs with workers
/// (`0,1` and `0,1`), the limit still gets both cores instead of both
/// ends on one, which would halve it.
pub fn limit_cpus(server: &[usize], client: &[usize]) -> (Option<usize>, Option<usize>) {
    let s = server.first().copied();
    let c = client
        .iter()
        .copied()
        .find(|&c| Some(c) != s)
        .or(client.first().copied());
    (s, c)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limit_ends_go_on_two_cpus_where_the_lists_allow() {
        assert_eq!(limit_cpus(&[0], &[1]), (Some(0), Some(1)));
        assert_eq!(limit_cpus(&[0, 1], &[0, 1]), (Some(0), Some(1)));
        assert_eq!(limit_cpus(&[0], &[0]), (Some(0), Some(0)));
        assert_eq!(limit_cpus(&[], &[]), (None, None));
        assert_eq!(limit_cpus(&[], &[3, 4]), (None, Some(3)));
    }
}
