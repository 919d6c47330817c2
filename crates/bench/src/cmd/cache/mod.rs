//! `fabrickv bench cache`: kv-bench's KV-cache read benchmark
//! (write the keys, warm up, read them with several threads, time single
//! GETs) in its output format, plus the latency of the GETs under load
//! and, with `--compare` (`compare`), the same reads from redis-server
//! and the physical limits the targets are stated against, all in
//! one run.

mod compare;

use std::time::Duration;

use clap::Args;
use fabrickv_types::limits::{
    CACHE_BATCH_KEYS_MAX, CACHE_CLIENT_BUFFER_BYTES_MAX, CACHE_VALUE_BYTES_MAX,
};
use fabrickv_types::size::parse_size;
use serde_json::{json, Value};

use super::cpu_list;
use crate::cache::{
    self, format_bytes, mb_per_s, LatencyStats, ReadOpts, ReadResult, WriteResult, LATENCY_SAMPLES,
};

/// The rule of kv-bench's box.
const RULE: &str = "==============================================";

#[derive(Args)]
pub struct CacheArgs {
    /// Keys written and read (key-00000000, key-00000001, ...).
    #[arg(long, default_value_t = 1000)]
    num_keys: u64,
    /// Bytes of every value, with an optional B, KB, MB or GB suffix (KB = 1024).
    #[arg(long, default_value = "64KB")]
    value_size: String,
    /// Reader threads, each with its own client and receive buffer.
    #[arg(long, default_value_t = 4)]
    num_threads: usize,
    /// Receive buffer of each client, in MB; must hold a whole value.
    #[arg(long, default_value_t = 64)]
    buffer_mb: usize,
    /// Random GETs before measuring, shared out over the reader threads.
    #[arg(long, default_value_t = 100)]
    warmup: u64,
    /// Time to live of the written values, in seconds (0: none).
    #[arg(long, default_value_t = 300)]
    ttl: u64,
    /// Data-plane address of a running server (127.0.0.1:PORT, shm://NAME,
    /// fabric://...). Without it a server is started on loopback with
    /// --transport, pinned to --server-cpus.
    #[arg(long)]
    server_addr: Option<String>,
    /// Transport of a started server.
    #[arg(long, default_value = "tcp", value_parser = ["tcp", "shm", "fabric"])]
    transport: String,
    /// libfabric provider of a started server with --transport fabric.
    #[arg(long, default_value = "shm")]
    provider: String,
    /// Workers of a started server.
    #[arg(long, default_value_t = 1)]
    server_workers: usize,
    /// First client id (kv-bench numbers its clients from it). The
    /// data plane needs no id, so here it only seeds the readers' random
    /// keys (thread t uses base + t) and is reported.
    #[arg(long, default_value_t = 100)]
    base_client_id: u64,
    /// Times each reader reads its share of the keys (every pass reads
    /// every key once, over all threads); more passes, steadier figures.
    #[arg(long, default_value_t = 1)]
    read_passes: u32,
    /// GETs each reader keeps in flight in the read phase: it reads its
    /// keys in batches of this many, every request sent before the first
    /// reply is read (one `get_many_at`; Redis's GETs pipelined as deep).
    /// 1 is kv-bench's one GET at a time. A batch must fit the buffer.
    #[arg(long, default_value_t = 1)]
    depth: usize,
    /// Also print one JSON line per result.
    #[arg(long)]
    json: bool,
    /// Also measure, in this run, redis-server's GET of the same keys and
    /// values (same threads and passes), one raw TCP stream and, over shm
    /// or fabric, single-thread memcpy; print the table and the targets.
    #[arg(long)]
    compare: bool,
    /// With --compare: measure FabricKV's read phase, Redis's and the
    /// limits this many times, taking turns, and judge the targets by the
    /// median of the rounds' ratios, so that the machine's drift during
    /// the run falls on every side alike. kv-bench's report shows the
    /// first round.
    #[arg(long, default_value_t = 1)]
    rounds: usize,
    /// CPUs of a started server, of redis-server and of the raw stream's
    /// sender (taskset list, e.g. 0).
    #[arg(long)]
    server_cpus: Option<String>,
    /// CPUs of the client threads, round robin (e.g. 1).
    #[arg(long)]
    client_cpus: Option<String>,
}

/// What every result line shares.
struct Run {
    transport: String,
    value_size: usize,
    num_keys: u64,
    threads: usize,
    /// GETs in flight per reader.
    depth: usize,
    json: bool,
}

impl Run {
    /// A `"bench":"cache"` JSON object for `case`, with `extra` merged in.
    fn line(&self, bench: &str, case: &str, extra: Value) -> String {
        let mut v = json!({
            "bench": bench,
            "case": case,
            "transport": self.transport,
            "value_size": self.value_size,
            "num_keys": self.num_keys,
            "threads": self.threads,
            "depth": self.depth,
        });
        if let (Some(m), Value::Object(e)) = (v.as_object_mut(), extra) {
            m.extend(e);
        }
        v.to_string()
    }
}

/// How many GETs each reader keeps in flight, for a heading ("" for 1).
fn in_flight(depth: usize) -> String {
    if depth > 1 {
        format!(", {depth} GETs in flight each (Redis pipelined as deep)")
    } else {
        String::new()
    }
}

/// The transport an address names.
fn transport_of(addr: &str) -> &'static str {
    if addr.starts_with("shm://") {
        "shm"
    } else if addr.starts_with("fabric://") {
        "fabric"
    } else {
        "tcp"
    }
}

/// The checked value size and receive-buffer bytes.
fn sizes(a: &CacheArgs) -> Result<(usize, usize), String> {
    let value_size = parse_size(&a.value_size).map_err(|e| format!("--value-size: {e}"))?;
    if value_size == 0 || value_size > CACHE_VALUE_BYTES_MAX as u64 {
        return Err(format!(
            "--value-size {} is outside 1 B..={} (the cache's largest value)",
            a.value_size,
            format_bytes(CACHE_VALUE_BYTES_MAX as f64)
        ));
    }
    let buffer = (a.buffer_mb as u64)
        .checked_mul(1 << 20)
        .filter(|b| *b <= CACHE_CLIENT_BUFFER_BYTES_MAX)
        .ok_or_else(|| {
            format!(
                "--buffer-mb {} exceeds the largest client buffer ({})",
                a.buffer_mb,
                format_bytes(CACHE_CLIENT_BUFFER_BYTES_MAX as f64)
            )
        })?;
    if buffer < value_size {
        return Err(format!(
            "--buffer-mb {} ({}) cannot hold one --value-size {} ({}) value: every GET lands a whole value in the client's receive buffer",
            a.buffer_mb,
            format_bytes(buffer as f64),
            a.value_size,
            format_bytes(value_size as f64)
        ));
    }
    if a.depth == 0 || a.depth > CACHE_BATCH_KEYS_MAX {
        return Err(format!(
            "--depth {} is outside 1..={CACHE_BATCH_KEYS_MAX} (CACHE_BATCH_KEYS_MAX)",
            a.depth
        ));
    }
    if (a.depth as u64).saturating_mul(value_size) > buffer {
        return Err(format!(
            "--depth {} values of {} do not fit --buffer-mb {}: each GET of a batch lands in its own place",
            a.depth,
            format_bytes(value_size as f64),
            a.buffer_mb
        ));
    }
    Ok((value_size as usize, buffer as usize))
}

pub fn run(a: CacheArgs) -> Result<(), String> {
    let (value_size, buffer_bytes) = sizes(&a)?;
    if a.num_keys == 0 || a.num_threads == 0 || a.read_passes == 0 || a.rounds == 0 {
        return Err(
            "--num-keys, --num-threads, --read-passes and --rounds must be at least 1".into(),
        );
    }
    let client_cpus = cpu_list(&a.client_cpus)?;
    // The writer and the single-GET analysis run on this thread: keep it
    // off the server's CPUs too.
    if let Some(&id) = client_cpus.first() {
        crate::pin_current_thread(id);
    }
    let ttl = (a.ttl > 0).then(|| Duration::from_secs(a.ttl));
    let keys = cache::key_names(a.num_keys);
    let server = match &a.server_addr {
        Some(_) => None,
        None => Some(cache::spawn_server(
            &a.transport,
            &a.provider,
            a.server_cpus.as_deref(),
            a.server_workers,
            cache::pool_bytes_for(a.num_keys, value_size),
        )?),
    };
    let addr = match (&a.server_addr, &server) {
        (Some(s), _) => s.clone(),
        (None, Some(s)) => s.addr.clone(),
        (None, None) => return Err("no server to measure".into()),
    };
    let r = Run {
        transport: transport_of(&addr).to_string(),
        value_size,
        num_keys: a.num_keys,
        threads: a.num_threads,
        depth: a.depth,
        json: a.json,
    };
    let workers = fabrickv_client::server_workers(&addr, cache::CACHE_BENCH_TIMEOUT)
        .map_err(|e| format!("cannot connect to {addr}: {e}"))?;
    let mut writer = cache::connect_cache(&addr, buffer_bytes)?;
    let one_sided = writer.one_sided();
    let how = if one_sided {
        "one-sided"
    } else {
        "inline chunks"
    };

    println!("{RULE}");
    println!("KV Cache Read Throughput Benchmark");
    println!("{RULE}");
    println!("Server:       {addr}");
    println!("Keys:         {}", a.num_keys);
    println!("Value size:   {}", format_bytes(value_size as f64));
    println!("Read threads: {}", a.num_threads);
    println!("Buffer/client: {} MB", a.buffer_mb);
    println!("Transport:    {} ({how})", r.transport);
    if a.read_passes > 1 {
        println!("Read passes:  {}", a.read_passes);
    }
    if a.depth > 1 {
        println!("GETs in flight per reader: {}", a.depth);
    }
    println!("{RULE}");

    println!("\n=== Write Phase ===");
    println!(
        "Writing {} keys with {} values...",
        a.num_keys,
        format_bytes(value_size as f64)
    );
    let write = cache::write_all(&mut writer, &keys, value_size, ttl)?;
    println!("Wrote {}/{} keys.", write.keys, a.num_keys);
    println!("Write completed in {:.2}s", write.seconds);
    println!(
        "Write throughput: {:.0} ops/sec, {:.2} MB/s",
        write.ops_per_s(),
        mb_per_s(write.ops_per_s() * value_size as f64)
    );

    println!("\n=== Warmup Phase ===");
    println!(
        "Running {} warmup iterations with {} threads...",
        a.warmup, a.num_threads
    );
    let o = ReadOpts {
        num_keys: a.num_keys,
        value_size,
        threads: a.num_threads,
        warmup: a.warmup,
        passes: a.read_passes,
        depth: a.depth,
        client_cpus,
        seed: a.base_client_id,
    };
    let passes = if a.read_passes > 1 {
        format!(", {} passes", a.read_passes)
    } else {
        String::new()
    };
    let read = cache::run_readers(
        &o,
        &keys,
        |tid| cache::connect_reader(&addr, buffer_bytes, tid, workers),
        || {
            println!("Warmup completed");
            println!("\n=== Read Phase ===");
            println!(
                "Reading {} keys with {} threads{passes}...",
                a.num_keys, a.num_threads
            );
        },
    )?;
    let total = a.num_keys * u64::from(a.read_passes);
    println!("Read {}/{total} keys.", read.gets);
    println!("Read completed in {:.2}s", read.seconds);
    println!(
        "Read throughput: {:.0} ops/sec, {:.2} MB/s",
        read.ops_per_s(),
        mb_per_s(read.bytes_per_s(value_size))
    );

    println!("\n=== Latency Analysis ===");
    println!("Measuring latency for {LATENCY_SAMPLES} random GET operations...");
    let single = LatencyStats::of(&cache::single_gets(
        &mut writer,
        &keys,
        value_size,
        LATENCY_SAMPLES,
        a.base_client_id.wrapping_sub(1),
    )?);
    print!("{}", single.block());
    let loaded = LatencyStats::of(&read.latency);
    println!("\n=== Latency under load ({} readers) ===", a.num_threads);
    println!(
        "{} GETs measured during the read phase, all threads merged:",
        loaded.samples
    );
    print!("{}", loaded.block());

    let speedup = if single.single_thread_ops_per_s() > 0.0 {
        read.ops_per_s() / single.single_thread_ops_per_s()
    } else {
        0.0
    };
    println!("\n=== Summary ===");
    println!(
        "Write: {:.2}s, {:.0} ops/sec",
        write.seconds,
        write.ops_per_s()
    );
    println!(
        "Read:  {:.2}s, {:.0} ops/sec ({speedup:.1}x speedup with {} threads)",
        read.seconds,
        read.ops_per_s(),
        a.num_threads
    );
    println!(
        "Total data transferred: {}",
        format_bytes(read.gets as f64 * value_size as f64)
    );
    println!(
        "Read throughput: {:.2} MB/s",
        mb_per_s(read.bytes_per_s(value_size))
    );
    if r.json {
        print_json(&r, &a, one_sided, &write, &read, &single, &loaded, speedup);
    }
    drop(writer);
    if a.compare {
        // The server stays up for the later rounds' reads: idle, its
        // worker blocks in its wait and takes no CPU, so the peers still
        // get the machine to themselves.
        let again = || {
            cache::run_readers(
                &o,
                &keys,
                |tid| cache::connect_reader(&addr, buffer_bytes, tid, workers),
                || {},
            )
        };
        compare::compare(&a, &r, &o, &keys, ttl, one_sided, &read, again)?;
    }
    drop(server);
    Ok(())
}

/// The JSON lines of FabricKV's phases.
#[allow(clippy::too_many_arguments)]
fn print_json(
    r: &Run,
    a: &CacheArgs,
    one_sided: bool,
    write: &WriteResult,
    read: &ReadResult,
    single: &LatencyStats,
    loaded: &LatencyStats,
    speedup: f64,
) {
    let stats = |s: &LatencyStats| serde_json::to_value(s).unwrap_or(Value::Null);
    println!(
        "{}",
        r.line(
            "cache",
            "write",
            json!({
                "seconds": write.seconds,
                "ops": write.keys,
                "ops_per_s": write.ops_per_s(),
                "bytes_per_s": write.ops_per_s() * r.value_size as f64,
                "ttl_s": a.ttl,
            })
        )
    );
    println!(
        "{}",
        r.line(
            "cache",
            "read",
            json!({
                "seconds": read.seconds,
                "ops": read.gets,
                "ops_per_s": read.ops_per_s(),
                "bytes_per_s": read.bytes_per_s(r.value_size),
                "read_passes": a.read_passes,
                "warmup_gets": read.warmup_gets,
                "checked": read.gets + read.warmup_gets,
                "wrong": 0,
                "one_sided": one_sided,
                "buffer_mb": a.buffer_mb,
                "base_client_id": a.base_client_id,
                "speedup": speedup,
            })
        )
    );
    println!("{}", r.line("cache", "latency", stats(single)));
    println!(
        "{}",
        r.line("cache", "read_latency_under_load", stats(loaded))
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: CacheArgs,
    }

    fn parse(args: &[&str]) -> CacheArgs {
        Cli::try_parse_from(std::iter::once("cache").chain(args.iter().copied()))
            .expect("flags parse")
            .args
    }

    #[test]
    fn defaults_are_kv_benchs() {
        let a = parse(&[]);
        assert_eq!(
            (a.num_keys, a.num_threads, a.buffer_mb, a.warmup, a.ttl),
            (1000, 4, 64, 100, 300)
        );
        assert_eq!((a.base_client_id, a.read_passes), (100, 1));
        assert_eq!(sizes(&a), Ok((64 << 10, 64 << 20)));
    }

    #[test]
    fn a_buffer_smaller_than_a_value_is_refused() {
        let a = parse(&["--value-size", "2MB", "--buffer-mb", "1"]);
        let e = sizes(&a).expect_err("refused");
        assert!(e.contains("--buffer-mb 1") && e.contains("2.00 MB"), "{e}");
        assert!(sizes(&parse(&["--value-size", "0"])).is_err());
        assert!(sizes(&parse(&["--value-size", "1GB", "--buffer-mb", "2048"])).is_err());
        assert!(sizes(&parse(&["--value-size", "lots"])).is_err());
    }

    #[test]
    fn the_transport_follows_the_address() {
        assert_eq!(transport_of("127.0.0.1:7379"), "tcp");
        assert_eq!(transport_of("shm://x"), "shm");
        assert_eq!(transport_of("fabric://shm/127.0.0.1:1"), "fabric");
    }
}
