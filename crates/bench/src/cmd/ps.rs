//! `fabrickv bench ps`: PetPS's benchmark (throughput lines, thread x batch
//! matrix, multi-client sums) and the comparison the targets name:
//! the same pull over tcp beside Redis MGET and a raw TCP exchange of the
//! same bytes, and over shm beside single-thread memcpy.

use std::time::Duration;

use clap::Args;
use fabrickv_wire::ps::{bitmap_bytes, PS_PREFIX_BYTES, PULL_DEST_BYTES, PULL_FIXED_BYTES};

use super::sweep::{check_counts, child_args, Sweep, SweepArgs};
use super::{cpu_list, duration_of};
use crate::ps::{self as bench_ps, KeyDist, LoadOpts, LoadResult};
use crate::ps_report::{self, ClientsRow, MatrixRow, Status};
use crate::{limits, median_by, ratio};

/// Thread counts of the matrix (PetPS's sweep).
pub const MATRIX_THREADS: [usize; 4] = [1, 2, 4, 8];

/// Batch sizes of the matrix (PetPS's sweep).
pub const MATRIX_BATCHES: [usize; 4] = [1, 10, 50, 100];

/// Keys per pull in the comparison (the 100 keys).
pub const COMPARE_BATCH: usize = 100;

/// Bytes of a frame header.
const FRAME_HEADER: usize = fabrickv_types::limits::FRAME_HEADER_BYTES;

#[derive(Args)]
pub struct PsArgs {
    /// Server with the table loaded already; without it a server is
    /// started as a child process (pinned with --server-cpus) and loaded.
    #[arg(long)]
    server: Option<String>,
    /// Transport of a started server: tcp, shm or fabric.
    #[arg(long, default_value = "tcp")]
    transport: String,
    /// libfabric provider for --transport fabric.
    #[arg(long, default_value = "shm")]
    provider: String,
    /// Workers of a started server.
    #[arg(long, default_value_t = 1)]
    server_workers: usize,
    /// CPUs of a started server (and of Redis and the raw peers' server side).
    #[arg(long)]
    server_cpus: Option<String>,
    /// CPUs of the client threads.
    #[arg(long)]
    client_cpus: Option<String>,
    /// Client threads (PetPS --thread_num).
    #[arg(long, default_value_t = 1)]
    thread_num: usize,
    /// Keys per pull (PetPS --batch_read_count).
    #[arg(long, default_value_t = 100)]
    batch_read_count: usize,
    /// Keys loaded, in millions (PetPS KEY_SPACE_M).
    #[arg(long, default_value_t = 1.0)]
    key_space_m: f64,
    /// Value size in bytes (4 x dim).
    #[arg(long, default_value_t = 512)]
    value_size: u32,
    /// Pulls outstanding per thread (PetPS ASYNC_REQ).
    #[arg(long, default_value_t = 4)]
    async_req: usize,
    /// Key distribution: uniform, zipf (0.99) or zipf:S.
    #[arg(long, default_value = "uniform")]
    dist: String,
    /// Seconds measured per run.
    #[arg(long, default_value_t = 10.0)]
    duration: f64,
    /// Run PetPS's matrix (threads 1/2/4/8 x batch 1/10/50/100) and print its table.
    #[arg(long)]
    matrix: bool,
    /// Run this many client processes at once (e.g. 2,4,8), released together
    /// by a barrier in a memcached registry (--registry, or one started for the
    /// sweep), and sum their figures.
    #[arg(long, value_delimiter = ',')]
    clients: Vec<usize>,
    /// Also measure the peers and limits of the targets: Redis MGET and raw
    /// TCP for tcp, memcpy for shm (starts its own servers per transport).
    #[arg(long)]
    compare: bool,
    /// With --compare: measure FabricKV's pulls and the peers and limits
    /// this many times, taking turns (both servers stay loaded), and judge
    /// the targets by the median of the rounds' ratios, so that the
    /// machine's drift falls on every side alike. The table above the
    /// rounds shows the first.
    #[arg(long, default_value_t = 1)]
    rounds: usize,
    /// Skip loading the table (it is loaded already at --server).
    #[arg(long)]
    no_load: bool,
    /// Check every pulled vector (full) or not at all (none: times the bare
    /// client; results cannot PASS).
    #[arg(long, default_value = "full", value_parser = ["full", "none"])]
    verify: String,
    /// Print one JSON line per result too.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    sweep: SweepArgs,
}

impl PsArgs {
    fn dim(&self) -> Result<u32, String> {
        if self.value_size == 0 || !self.value_size.is_multiple_of(4) {
            return Err(format!(
                "--value-size must be a positive multiple of 4 bytes (f32 vectors), not {}",
                self.value_size
            ));
        }
        Ok(self.value_size / 4)
    }

    fn key_space(&self) -> Result<u64, String> {
        let k = (self.key_space_m * 1e6).round();
        if !(k.is_finite() && k >= 1.0) {
            return Err(format!(
                "--key-space-m must give at least one key, not {}",
                self.key_space_m
            ));
        }
        Ok(k as u64)
    }

    fn load_opts(&self, threads: usize, batch: usize) -> Result<LoadOpts, String> {
        let duration = duration_of(self.duration)?;
        Ok(LoadOpts {
            threads,
            batch,
            async_req: self.async_req,
            key_space: self.key_space()?,
            dim: self.dim()?,
            dist: KeyDist::parse(&self.dist)?,
            duration,
            report_every: (!self.sweep.child).then_some(Duration::from_secs(1)),
            client_cpus: cpu_list(&self.client_cpus)?,
            verify: self.verify == "full",
        })
    }
}

/// A server to load: the given one, or a started child.
fn server_for(a: &PsArgs, transport: &str) -> Result<(String, Option<bench_ps::PsServer>), String> {
    if let Some(s) = &a.server {
        return Ok((s.clone(), None));
    }
    let s = bench_ps::spawn_server(
        transport,
        &a.provider,
        a.server_cpus.as_deref(),
        a.server_workers,
        a.key_space()?,
        a.dim()?,
    )?;
    Ok((s.addr.clone(), Some(s)))
}

fn load(a: &PsArgs, addr: &str) -> Result<(), String> {
    if a.no_load {
        return Ok(());
    }
    let n = a.key_space()?;
    let start = std::time::Instant::now();
    bench_ps::load_table(addr, n, a.dim()?, |_| {})?;
    if !a.sweep.child {
        let s = start.elapsed().as_secs_f64();
        eprintln!(
            "loaded {n} keys x {} B in {s:.2} s ({:.3} Mkv/s)",
            a.value_size,
            n as f64 / s / 1e6
        );
    }
    Ok(())
}

pub fn run(a: PsArgs) -> Result<(), String> {
    if !a.clients.is_empty() {
        return run_clients(&a);
    }
    if a.compare {
        return run_compare(&a);
    }
    let (addr, _server) = server_for(&a, &a.transport)?;
    load(&a, &addr)?;
    if a.matrix {
        let mut rows = Vec::new();
        for &t in &MATRIX_THREADS {
            for &b in &MATRIX_BATCHES {
                let o = a.load_opts(t, b)?;
                let o = LoadOpts {
                    report_every: None,
                    ..o
                };
                let r = bench_ps::run_load(&addr, &o)?;
                let row = MatrixRow {
                    thread_num: t,
                    batch_read_count: b,
                    mreq_s: r.mreq_s(),
                    mkv_s: r.mkv_s(),
                    status: Status::from_checks(r.checked, r.wrong),
                };
                eprintln!("{}", ps_report::throughput_line(row.mreq_s, row.mkv_s));
                if a.json {
                    println!("{}", row.json());
                }
                rows.push(row);
            }
        }
        print!("{}", ps_report::matrix_table(&rows));
        return check_rows(rows.iter().map(|r| &r.status));
    }
    let o = a.load_opts(a.thread_num, a.batch_read_count)?;
    let mut gate = a.sweep.gate()?;
    let r = bench_ps::run_load_gated(&addr, &o, &mut || gate.pass())?;
    let status = Status::from_checks(r.checked, r.wrong);
    if a.sweep.child {
        let line = bench_ps::json("client", &o, &r, serde_json::json!({}));
        let v = serde_json::from_str(&line).map_err(|e| e.to_string())?;
        println!("{}", gate.line(v));
        return Ok(());
    }
    println!(
        "final {} ({} pulls, {} keys checked, {})",
        ps_report::throughput_line(r.mreq_s(), r.mkv_s()),
        r.requests,
        r.checked,
        status.cell()
    );
    if a.json {
        println!(
            "{}",
            bench_ps::json(
                "run",
                &o,
                &r,
                serde_json::json!({ "transport": a.transport })
            )
        );
    }
    if !o.verify {
        return Ok(());
    }
    check_rows([&status])
}

fn check_rows<'a>(rows: impl IntoIterator<Item = &'a Status>) -> Result<(), String> {
    for s in rows {
        if !s.passed() {
            return Err(format!("a run did not pass its value checks: {}", s.cell()));
        }
    }
    Ok(())
}

/// Runs N client processes of this binary against one server, released
/// together by a barrier, and sums their figures.
fn run_clients(a: &PsArgs) -> Result<(), String> {
    check_counts(&a.clients)?;
    // The children's flags, checked once here rather than failing in each.
    a.load_opts(a.thread_num, a.batch_read_count)?;
    let (addr, _server) = server_for(a, &a.transport)?;
    load(a, &addr)?;
    let sweep = Sweep::start(&a.sweep, "ps")?;
    let args = child_args(
        &["bench", "ps", "--server", &addr, "--no-load"],
        &[
            ("--thread-num", a.thread_num.to_string()),
            ("--batch-read-count", a.batch_read_count.to_string()),
            ("--key-space-m", a.key_space_m.to_string()),
            ("--value-size", a.value_size.to_string()),
            ("--async-req", a.async_req.to_string()),
            ("--dist", a.dist.clone()),
            ("--duration", a.duration.to_string()),
            ("--verify", a.verify.clone()),
        ],
        a.client_cpus.as_deref(),
    );
    let mut rows = Vec::new();
    let mut failures = Vec::new();
    for &n in &a.clients {
        let c = sweep.run(&format!("n{n}"), n, &args)?;
        failures.extend(c.failure.clone());
        let status = match c.failure.clone() {
            Some(f) => Status::Fail(f),
            None => Status::from_checks(c.sum_u64("checked"), c.sum_u64("wrong")),
        };
        let row = ClientsRow {
            clients: n,
            mreq_s_sum: c.sum("mreq_s"),
            mkv_s_sum: c.sum("mkv_s"),
            status,
            start_skew_ms: c.start_skew_ms,
        };
        if a.json {
            println!("{}", row.json());
        }
        rows.push(row);
    }
    print!("{}", ps_report::clients_table(&rows));
    if let Some(f) = failures.first() {
        return Err(f.clone());
    }
    if a.verify == "none" {
        // Unchecked rows cannot PASS, and are not meant to.
        return Ok(());
    }
    check_rows(rows.iter().map(|r| &r.status))
}

/// Bytes of a PULL request for `n` keys and its reply with `vb`-byte
/// vectors inline: what the raw TCP peer exchanges.
fn pull_wire_bytes(n: usize, vb: usize, one_sided: bool) -> (usize, usize) {
    let dest = if one_sided { PULL_DEST_BYTES } else { 0 };
    let req = FRAME_HEADER + PS_PREFIX_BYTES + PULL_FIXED_BYTES + dest + 8 * n;
    let resp =
        FRAME_HEADER + PS_PREFIX_BYTES + bitmap_bytes(n) + if one_sided { 0 } else { n * vb };
    // Each message carries the transport's 4-byte length prefix.
    (req + 4, resp + 4)
}

/// A loaded server for `--compare`, kept up for every round: idle, its
/// workers block in their wait and take no CPU from the other runs.
struct Loaded {
    addr: String,
    _server: Option<bench_ps::PsServer>,
}

impl Loaded {
    fn start(a: &PsArgs, transport: &str) -> Result<Self, String> {
        let (addr, server) = server_for(a, transport)?;
        load(a, &addr)?;
        Ok(Self {
            addr,
            _server: server,
        })
    }

    /// One checked run of the compare load; a wrong value fails it.
    fn run(&self, a: &PsArgs, transport: &str) -> Result<(LoadOpts, LoadResult), String> {
        let o = LoadOpts {
            report_every: None,
            ..a.load_opts(a.thread_num, COMPARE_BATCH)?
        };
        let r = bench_ps::run_load(&self.addr, &o)?;
        let st = Status::from_checks(r.checked, r.wrong);
        if !st.passed() {
            return Err(format!("{transport} run: {}", st.cell()));
        }
        Ok((o, r))
    }
}

/// Keys/s and bytes/s of one round of `--compare`.
#[derive(Debug, Clone, Copy)]
struct PsRound {
    tcp_keys: f64,
    redis_keys: f64,
    raw_keys: f64,
    shm_bytes: f64,
    memcpy_bytes: f64,
    /// Single-thread random gather of the same vectors from memory the
    /// size of the table.
    gather_bytes: f64,
}

impl PsRound {
    /// The tcp target's keys/s: the lower of 1.5x Redis MGET and 0.9x raw.
    fn tcp_target(&self) -> f64 {
        (1.5 * self.redis_keys).min(0.9 * self.raw_keys)
    }
}

/// Every round and the medians of its ratios.
fn ps_rounds_table(rounds: &[PsRound]) -> String {
    let mut t = String::from(
        "\n| round | tcp Mkv/s | redis Mkv/s | raw Mkv/s | tcp/target | shm MB/s | memcpy MB/s | shm/memcpy | gather MB/s | shm/gather |\n|---|---|---|---|---|---|---|---|---|---|\n",
    );
    for (i, r) in rounds.iter().enumerate() {
        t += &format!(
            "| {} | {:.4} | {:.4} | {:.4} | {:.2}x | {:.1} | {:.1} | {:.2} | {:.1} | {:.2} |\n",
            i + 1,
            r.tcp_keys / 1e6,
            r.redis_keys / 1e6,
            r.raw_keys / 1e6,
            ratio(r.tcp_keys, r.tcp_target()),
            r.shm_bytes / 1e6,
            r.memcpy_bytes / 1e6,
            ratio(r.shm_bytes, r.memcpy_bytes),
            r.gather_bytes / 1e6,
            ratio(r.shm_bytes, r.gather_bytes),
        );
    }
    let med = |f: &dyn Fn(&PsRound) -> f64| median_by(rounds, |r| Some(f(r))).unwrap_or(0.0);
    t += &format!(
        "| median | {:.4} | {:.4} | {:.4} | {:.2}x | {:.1} | {:.1} | {:.2} | {:.1} | {:.2} |\n",
        med(&|r| r.tcp_keys) / 1e6,
        med(&|r| r.redis_keys) / 1e6,
        med(&|r| r.raw_keys) / 1e6,
        med(&|r| ratio(r.tcp_keys, r.tcp_target())),
        med(&|r| r.shm_bytes) / 1e6,
        med(&|r| r.memcpy_bytes) / 1e6,
        med(&|r| ratio(r.shm_bytes, r.memcpy_bytes)),
        med(&|r| r.gather_bytes) / 1e6,
        med(&|r| ratio(r.shm_bytes, r.gather_bytes)),
    );
    t
}

/// The targets, measured in one run: `--rounds` times, taking
/// turns, judged by the medians.
fn run_compare(a: &PsArgs) -> Result<(), String> {
    if a.rounds == 0 {
        return Err("--rounds must be at least 1".into());
    }
    let dur = Duration::from_secs_f64(a.duration);
    let vb = a.dim()? as usize * 4;
    let client_cpus = cpu_list(&a.client_cpus)?;
    let client_cpu = client_cpus.first().copied();
    let (server_cpu, raw_client_cpu) = limits::limit_cpus(&cpu_list(&a.server_cpus)?, &client_cpus);
    let n = COMPARE_BATCH;
    let (req_b, resp_b) = pull_wire_bytes(n, vb, false);
    let mut ro = limits::RedisMgetOpts::new(n, vb, a.key_space()?.min(1_000_000), dur);
    ro.pipeline = a.async_req;
    ro.conns = a.thread_num;
    ro.server_cpus = a.server_cpus.clone();
    ro.client_cpus = a.client_cpus.clone();

    // The gather limit draws from as much memory as the table's vectors.
    let gather_set = usize::try_from(a.key_space()?)
        .unwrap_or(usize::MAX)
        .saturating_mul(vb)
        .clamp(n * vb, limits::MEMCPY_WORKING_SET_BYTES_MAX);
    let tcp_server = Loaded::start(a, "tcp")?;
    let shm_server = Loaded::start(a, "shm")?;
    let mut rounds = Vec::with_capacity(a.rounds);
    let mut first = None;
    for round in 0..a.rounds {
        if round == 1 {
            eprintln!(
                "{} more alternating rounds: tcp, raw, redis, shm, memcpy...",
                a.rounds - 1
            );
        }
        let (o, tcp) = tcp_server.run(a, "tcp")?;
        let raw = limits::tcp_request_response(
            req_b,
            resp_b,
            a.async_req * a.thread_num,
            dur,
            server_cpu,
            raw_client_cpu,
        )?;
        let redis = limits::redis_mget(&ro)?;
        let (_, shm) = shm_server.run(a, "shm")?;
        let memcpy = limits::memcpy_bandwidth(
            n * vb,
            limits::MEMCPY_WORKING_SET_BYTES_DEFAULT,
            dur,
            client_cpu,
        )?;
        let gather = limits::gather_bandwidth(vb, n, gather_set, dur, server_cpu)?;
        rounds.push(PsRound {
            tcp_keys: tcp.keys as f64 / tcp.seconds,
            redis_keys: redis.keys_per_s,
            // The raw exchange carries the same bytes; its key rate is its
            // reply rate x n.
            raw_keys: raw.responses_per_s * n as f64,
            shm_bytes: shm.keys as f64 * vb as f64 / shm.seconds,
            memcpy_bytes: memcpy.bytes_per_s,
            gather_bytes: gather.bytes_per_s,
        });
        if first.is_none() {
            first = Some((o, tcp, raw, redis, shm, memcpy, gather));
        }
    }
    let Some((o, tcp, raw, redis, shm, memcpy, gather)) = first else {
        return Err("no round ran".into());
    };
    // The table shows the first round; the verdicts are the medians (the
    // first round's ratios when it is the only one).
    let r0 = rounds[0];
    let (keys_tcp, keys_raw, shm_bytes) = (r0.tcp_keys, r0.raw_keys, r0.shm_bytes);
    let tcp_target = r0.tcp_target();
    let med = |f: &dyn Fn(&PsRound) -> f64| median_by(&rounds, |r| Some(f(r))).unwrap_or(0.0);
    let tcp_vs_target = med(&|r| ratio(r.tcp_keys, r.tcp_target()));
    let shm_vs_memcpy = med(&|r| ratio(r.shm_bytes, r.memcpy_bytes));
    let tcp_met = tcp_vs_target >= 1.0;
    let shm_met = shm_vs_memcpy >= 0.5;
    let verdict = |ok: bool| if ok { "MET" } else { "MISSED" };
    println!(
        "pull of {n} keys x {vb} B, {} thread(s), {} outstanding, {} keys, {} ({} s each)",
        a.thread_num,
        a.async_req,
        a.key_space()?,
        a.dist,
        a.duration
    );
    println!("| case | Mkv/s | value MB/s | ratio | target |");
    println!("|---|---|---|---|---|");
    let mb = |keys_s: f64| keys_s * vb as f64 / 1e6;
    println!(
        "| fabrickv tcp | {:.4} | {:.1} | - | >= {:.4} Mkv/s (min of 1.5x Redis, 0.9x raw) {} |",
        keys_tcp / 1e6,
        mb(keys_tcp),
        tcp_target / 1e6,
        verdict(keys_tcp >= tcp_target)
    );
    println!(
        "| redis MGET {n} | {:.4} | {:.1} | fabrickv/redis {:.2}x | 1.5x |",
        redis.keys_per_s / 1e6,
        mb(redis.keys_per_s),
        keys_tcp / redis.keys_per_s
    );
    println!(
        "| raw tcp {req_b} B -> {resp_b} B | {:.4} | {:.1} | fabrickv/raw {:.2} | 0.90 |",
        keys_raw / 1e6,
        mb(keys_raw),
        keys_tcp / keys_raw
    );
    println!(
        "| fabrickv shm (one-sided: {}) | {:.4} | {:.1} | fabrickv/memcpy {:.2} | 0.50 {} |",
        shm.one_sided,
        shm.keys as f64 / shm.seconds / 1e6,
        shm_bytes / 1e6,
        shm_bytes / memcpy.bytes_per_s,
        verdict(shm_bytes >= 0.5 * memcpy.bytes_per_s)
    );
    println!(
        "| memcpy {} B chunks | - | {:.1} | - | - |",
        n * vb,
        memcpy.bytes_per_s / 1e6
    );
    println!(
        "| random gather {n} x {vb} B from {:.1} MB, 1 thread | {:.4} | {:.1} | fabrickv/gather {:.2} | - |",
        gather_set as f64 / 1e6,
        gather.bytes_per_s / vb as f64 / 1e6,
        gather.bytes_per_s / 1e6,
        shm_bytes / gather.bytes_per_s
    );
    if rounds.len() > 1 {
        print!("{}", ps_rounds_table(&rounds));
        println!(
            "Targets, median of {} rounds: tcp {tcp_vs_target:.2}x its target ({}), shm {shm_vs_memcpy:.3} of memcpy, target 0.5 ({})",
            rounds.len(),
            verdict(tcp_met),
            verdict(shm_met)
        );
    }
    if a.json {
        println!(
            "{}",
            bench_ps::json(
                "compare.tcp",
                &o,
                &tcp,
                serde_json::json!({
                    "vs_redis_mget": keys_tcp / redis.keys_per_s,
                    "vs_raw_tcp": keys_tcp / keys_raw,
                    "target_keys_s": tcp_target,
                    "rounds": rounds.len(),
                    "vs_target_median": tcp_vs_target,
                    "target_met": tcp_met,
                })
            )
        );
        println!("{}", raw.json());
        println!("{}", redis.json());
        println!(
            "{}",
            bench_ps::json(
                "compare.shm",
                &o,
                &shm,
                serde_json::json!({
                    "vs_memcpy": shm_bytes / memcpy.bytes_per_s,
                    "rounds": rounds.len(),
                    "vs_memcpy_median": shm_vs_memcpy,
                    "vs_gather": shm_bytes / gather.bytes_per_s,
                    "vs_memcpy_rounds": rounds
                        .iter()
                        .map(|r| ratio(r.shm_bytes, r.memcpy_bytes))
                        .collect::<Vec<_>>(),
                    "target_met": shm_met,
                })
            )
        );
        println!("{}", memcpy.json());
        println!("{}", gather.json());
    }
    Ok(())
}
