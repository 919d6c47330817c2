//! `fabrickv bench ...`: which benchmark to run. Each one's flags and its
//! whole run live in `fabrickv_bench::cmd`; this only dispatches.

use clap::Subcommand;
use fabrickv_bench::cmd;

#[derive(Subcommand)]
pub enum BenchCommand {
    /// GET/PUT mix over the native protocol (Mops, p50, p99), optionally beside Redis.
    Kv(cmd::kv::KvArgs),
    /// Partitions moved between workers under load: p50/p99 per 100 ms window before, during and after the moves, errors seen by clients, throughput.
    PartitionMove(cmd::partition_move::PartitionMoveArgs),
    /// HERD's workload and table: Cores x Batched / Non-batched Mops, per-worker lines.
    Herd(cmd::herd::HerdArgs),
    /// FabricKV (RESP, memcache, native tcp, shm) beside redis-server and memcached: Mops, p50/p99, server CPU-s per Mop.
    Compare(cmd::compare::CompareArgs),
    /// PetPS's embedding pulls: throughput lines, thread x batch matrix, multi-client sums, --compare with Redis/raw TCP/memcpy.
    Ps(cmd::ps::PsArgs),
    /// The KV cache's read benchmark: write, warm up, N-thread checked reads, GET latency; --compare with Redis GET, raw TCP, memcpy.
    Cache(cmd::cache::CacheArgs),
    /// The shard copy: a generated shard copied from a server in this process, MB/s beside the raw pipe (TCP into a file) and the RocksDB shard replicator's published rate.
    Copy(cmd::copy::CopyBenchArgs),
    /// What sharding costs: kv throughput and multi-get latency on N servers beside one server on the same cores, and the time a client takes to join through the registry.
    Cluster(cmd::cluster::ClusterBenchArgs),
    /// What a second copy of each slot costs (R=2 against R=1) beside Redis with a replica and WAIT 1 0, and the time from kill -9 of a primary to its keys' first write served.
    Replication(cmd::replication::ReplicationArgs),
    /// A checkpoint of kv keys and embedding rows: save and restore rates beside dd's, the writer's rate and the extra RSS during a save; --compare with Redis BGSAVE and restart on the kv part.
    Checkpoint(cmd::checkpoint::CheckpointBenchArgs),
    /// A 4th server added to 3 in etcd under a writer and a reader: keys moved, the move's rate against fabrickv copy's, acknowledged writes lost, read p99 during the move against before.
    Growth(cmd::growth::GrowthArgs),
    /// Echo RPCs over a transport: the RPC framework benchmark's table (ops/s, fast, ave, p50, p99).
    Rpc(cmd::rpc::RpcArgs),
    /// What the cluster secret costs: connect + first GET and GETs on a long-lived connection, with and without a secret (tcp, shm).
    Auth(cmd::auth::AuthArgs),
    /// GET/SET of one large value (16 MiB) over RESP beside a raw TCP stream of the same bytes and redis-server: GB/s, p50/p99, ratios.
    Bigvalue(cmd::bigvalue::BigValueArgs),
    /// Store mode when value sizes shift (64 B fill, delete half, 4 KiB, 512 B until refused) beside memcached -M with slab_automove=1: value bytes kept, refusals, free memory at each refusal.
    Slabs(cmd::slabs::SlabsArgs),
    /// The client's CPU per key of a 96-key batched read: mget (a Vec per value) beside mget_into (the caller's buffer), and their ratio.
    Mget(cmd::mget::MgetArgs),
    /// The echo server `bench rpc` starts as a pinned child process.
    #[command(hide = true)]
    RpcServer(cmd::rpc::RpcServerArgs),
}

/// Runs one benchmark.
pub fn run(which: BenchCommand) -> Result<(), String> {
    match which {
        BenchCommand::Kv(a) => cmd::kv::run(a),
        BenchCommand::Herd(a) => cmd::herd::run(a),
        BenchCommand::PartitionMove(a) => cmd::partition_move::run(a),
        BenchCommand::Compare(a) => cmd::compare::run(a),
        BenchCommand::Ps(a) => cmd::ps::run(a),
        BenchCommand::Cache(a) => cmd::cache::run(a),
        BenchCommand::Rpc(a) => cmd::rpc::run(a),
        BenchCommand::Copy(a) => cmd::copy::run(a),
        BenchCommand::Cluster(a) => cmd::cluster::run(&a),
        BenchCommand::Replication(a) => cmd::replication::run(&a),
        BenchCommand::Growth(a) => cmd::growth::run(&a),
        BenchCommand::Checkpoint(a) => cmd::checkpoint::run(&a),
        BenchCommand::RpcServer(a) => cmd::rpc::serve(a),
        BenchCommand::Auth(a) => cmd::auth::run(a),
        BenchCommand::Bigvalue(a) => cmd::bigvalue::run(a),
        BenchCommand::Slabs(a) => cmd::slabs::run(a),
        BenchCommand::Mget(a) => cmd::mget::run(a),
    }
}
