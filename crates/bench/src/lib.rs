//! Every benchmark behind `fabrickv bench ...`: the subcommands' flags
//! and runs ([`cmd`]; the binary only parses and calls them), the load
//! generators, and the peers and limits measured beside FabricKV.
//!
//! Layout:
//! - [`report`]: one result type, printed in the box of the benchmark each reproduces
//!   tables and as one JSON object per line (`--json`);
//! - [`keys`]: HERD-style keys (16-byte hashes of integers) and the values
//!   that go with them, so every read can be checked;
//! - [`kv`]: the GET/PUT mix against FabricKV's native protocol;
//! - [`herd`]: HERD's workload and Cores x Batched/Non-batched table;
//! - [`partmove`]: partitions moved between workers under load: latency
//!   per window and phase, errors seen by clients;
//! - [`peers`]: starting and driving peers (redis-server, redis-benchmark)
//!   in the same run, pinned to the same cores, for ratios;
//! - [`memcache`]: a memcached text-protocol load generator shaped like
//!   redis-benchmark, for memcached's side of `bench compare`;
//! - [`cpu`]: a server process's CPU time from `/proc`, for CPU-seconds;
//! - [`compare`]: FabricKV (RESP, native tcp and shm) beside redis-server
//!   and memcached on the same workloads, with server CPU-seconds;
//! - [`limits`]: the bounds `bench ps` and `bench cache` are judged
//!   against, measured in the same run (memcpy bandwidth, raw TCP
//!   request/response and stream rates, redis-server's MGET), and what
//!   they share with [`baseline`] and [`split`] (`limits::check`,
//!   `limits::pair`);
//! - [`ps`]: PetPS's embedding pulls (load, checked pulls, a started
//!   server);
//! - [`ps_report`]: PetPS's output (its throughput line and markdown
//!   tables);
//! - [`cache`]: the KV cache's read benchmark (kv-bench's
//!   phases and latency analysis) beside redis-server GET, a raw TCP
//!   stream and memcpy;
//! - [`baseline`]: the raw TCP ping-pong and gRPC rows of `bench rpc
//!   --compare`; [`rpc`]: the echo RPC load itself;
//! - [`cluster`], [`split`]: what sharding costs, and its raw TCP ceiling;
//! - [`checkpoint`]: a checkpoint's save and restore beside the disk's
//!   rates (dd), the serving and memory a save costs, and Redis's RDB;
//! - [`cmd`]: one module per `fabrickv bench` subcommand, and the client
//!   process sweeps of `--clients`;
//! - [`pipe`]: the raw pipe (a TCP socket into a file) `bench copy`
//!   measures the shard copy against;
//! - [`plot`]: the PNG of a copy's rate over time (`copy --plot`,
//!   `bench copy --plot`).
//!
//! Benchmarks are not tests: they measure. A small run of each is part of
//! `make test` only so that none of them rots.

pub mod baseline;
pub mod cache;
pub mod checkpoint;
pub mod cluster;
pub mod cmd;
pub mod compare;
pub mod cpu;
pub mod growth;
pub mod herd;
pub mod keys;
pub mod kv;
pub mod limits;
pub mod load;
pub mod memcache;
pub mod paced;
pub mod partmove;
pub mod peers;
pub mod pipe;
pub mod plot;
pub mod ps;
pub mod ps_report;
pub mod replication;
pub mod report;
pub mod rpc;
pub mod split;

/// The server worker client thread `tid` talks to: worker `tid` mod the
/// count, so with a server started by `peers::fabrickv_serve` (worker i on
/// the i-th server CPU) and thread t pinned to the t-th client CPU, equal
/// CPU lists put each thread beside its worker.
pub fn worker_of_thread(tid: usize, workers: u16) -> u16 {
    (tid % usize::from(workers.max(1))) as u16
}

/// Pins the calling thread to CPU `id` (no-op where unsupported).
pub fn pin_current_thread(id: usize) {
    core_affinity::set_for_current(core_affinity::CoreId { id });
}

/// Starts `f` on a thread named `name`, pinned to `cpu` if given: the
/// way every measured side of a limit or peer runs, so that what it
/// allocates and touches first lies near the CPU it is measured on.
pub fn spawn_pinned<T: Send + 'static>(
    name: &str,
    cpu: Option<usize>,
    f: impl FnOnce() -> T + Send + 'static,
) -> Result<std::thread::JoinHandle<T>, String> {
    std::thread::Builder::new()
        .name(name.to_string())
        .spawn(move || {
            if let Some(id) = cpu {
                pin_current_thread(id);
            }
            f()
        })
        .map_err(|e| format!("cannot start the {name} thread: {e}"))
}

/// [`spawn_pinned`], then waits for `f`'s result.
pub fn run_pinned<T: Send + 'static>(
    name: &str,
    cpu: Option<usize>,
    f: impl FnOnce() -> T + Send + 'static,
) -> Result<T, String> {
    spawn_pinned(name, cpu, f)?
        .join()
        .map_err(|_| format!("{name} thread panicked"))
}

/// `x / y`, or 0 where `y` is not positive (a peer that measured
/// nothing gives no ratio rather than an infinite one).
pub fn ratio(x: f64, y: f64) -> f64 {
    if y > 0.0 {
        x / y
    } else {
        0.0
    }
}

/// The median of `xs` (the mean of the middle two for an even count; 0
/// for none): the figure of several alternating rounds that one noisy
/// round cannot move.
pub fn median(xs: &[f64]) -> f64 {
    let mut v: Vec<f64> = xs.iter().copied().filter(|x| x.is_finite()).collect();
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(f64::total_cmp);
    let m = v.len() / 2;
    if v.len() % 2 == 1 {
        v[m]
    } else {
        (v[m - 1] + v[m]) / 2.0
    }
}

/// The median of what `f` gives for each of `items`, leaving out the
/// items it gives nothing for; `None` when none is left (a limit a
/// transport does not measure).
pub fn median_by<T>(items: &[T], f: impl Fn(&T) -> Option<f64>) -> Option<f64> {
    let v: Vec<f64> = items.iter().filter_map(f).collect();
    (!v.is_empty()).then(|| median(&v))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_median_is_the_middle_and_ignores_what_is_not_a_number() {
        assert_eq!(median(&[]), 0.0);
        assert_eq!(median(&[3.0]), 3.0);
        assert_eq!(median(&[5.0, 1.0, 3.0]), 3.0);
        assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), 2.5);
        assert_eq!(median(&[f64::NAN, 2.0, 9.0, 1.0]), 2.0);
    }

    #[test]
    fn median_by_leaves_out_what_f_gives_nothing_for() {
        let xs = [(1.0, Some(10.0)), (5.0, None), (3.0, Some(30.0))];
        assert_eq!(median_by(&xs, |x| Some(x.0)), Some(3.0));
        assert_eq!(median_by(&xs, |x| x.1), Some(20.0));
        assert_eq!(median_by(&xs, |_| None), None);
    }
}
