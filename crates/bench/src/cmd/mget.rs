//! `fabrickv bench mget`: what a batched read costs the client's CPU per
//! key, `mget` (one `Vec` per value) beside `mget_into` (values decoded
//! into one reused `MgetBuf`).
//!
//! A server in this process with one worker pinned to `--server-cpu`;
//! the calling thread pinned to `--client-cpu`. Each round times a run of
//! calls of each API in turn (which goes first rotates), reading the
//! calling thread's CPU time (`/proc/thread-self/schedstat`) before and
//! after, so that only the client's work is counted, not the server's nor
//! the time spent waiting for it. Before each run every key group is read
//! once, unmeasured, and checked against what was stored.
//!
//! A third API, `mget-before`, is the body `mget` had before (an
//! `Outcome` with its own `Vec` per key, from `execute`), so the saving is
//! measured against today's and yesterday's `mget` in the same run.
//!
//! Printed as a table of CPU ns per key (median of the rounds, and the
//! range), keys per second of wall time, and the ratios mget_into/mget
//! and mget_into/mget-before (the median of the rounds' ratios, as the
//! APIs of a round ran back to back, and their range); with `--json`, one JSON line per API and one
//! per ratio.

use std::time::Instant;

use clap::Args;
use fabrickv_client::{BatchOp, Client, Kv, MgetBuf};
use fabrickv_server::{Mode, Server, ServerConfig};
use fabrickv_types::ErrorCode;

use crate::cpu::thread_cpu_ns;
use crate::report::{print_table, BenchResult};

#[derive(Args)]
pub struct MgetArgs {
    /// Transports to measure, comma separated: tcp, shm.
    #[arg(long, default_value = "tcp,shm")]
    transports: String,
    /// Keys per call.
    #[arg(long, default_value_t = 96)]
    keys: usize,
    /// Value size in bytes.
    #[arg(long, default_value_t = 64)]
    value_size: usize,
    /// Distinct key groups the calls cycle through (keys x groups keys
    /// are stored).
    #[arg(long, default_value_t = 64)]
    groups: usize,
    /// Calls per API and round.
    #[arg(long, default_value_t = 2000)]
    calls: usize,
    /// Rounds; the APIs take turns within each.
    #[arg(long, default_value_t = 15)]
    rounds: usize,
    /// CPU the server's worker is pinned to.
    #[arg(long, default_value_t = 0)]
    server_cpu: usize,
    /// CPU the calling (measured) thread is pinned to.
    #[arg(long, default_value_t = 1)]
    client_cpu: usize,
    /// Print one JSON object per result as well.
    #[arg(long)]
    json: bool,
}

/// The APIs measured: `mget` and `mget_into` as they are, and
/// `mget-before`, the body `mget` had before `mget_into` (`execute`, one
/// `Outcome` with its own `Vec` per key, then a `Vec` of those values),
/// so that the saving is measured against it in the same run too.
const APIS: [&str; 3] = ["mget", "mget_into", "mget-before"];

/// What one API cost in one round.
#[derive(Debug, Clone, Copy)]
struct Run {
    /// CPU time of the calling thread per key, nanoseconds.
    cpu_ns_per_key: f64,
    /// Keys read per second of wall time.
    keys_per_s: f64,
}

fn listen_addr(transport: &str) -> Result<String, String> {
    match transport {
        "tcp" => Ok("tcp://127.0.0.1:0".into()),
        "shm" => Ok(format!("shm://fkv-bench-mget-{}", std::process::id())),
        t => Err(format!("unknown transport {t:?}: expected tcp or shm")),
    }
}

/// The value stored under key `k` of group `g`.
fn value(a: &MgetArgs, g: usize, k: usize) -> Vec<u8> {
    let seed = (g * a.keys + k) as u32;
    (0..a.value_size)
        .map(|i| (seed.wrapping_mul(2_654_435_761) ^ i as u32).to_le_bytes()[1])
        .collect()
}

/// Reads every group once with each API and checks each value; returns
/// how many were wrong.
fn check(c: &mut Client, a: &MgetArgs, groups: &[Vec<Vec<u8>>], buf: &mut MgetBuf) -> u64 {
    let mut wrong = 0;
    for (g, keys) in groups.iter().enumerate() {
        let old = c.mget(keys);
        let new = c.mget_into(keys, buf);
        for k in 0..keys.len() {
            let want = value(a, g, k);
            let o = old.as_ref().ok().and_then(|v| v[k].as_deref());
            let n = new.as_ref().ok().and_then(|()| buf.get(k));
            wrong += u64::from(o != Some(&want[..])) + u64::from(n != Some(&want[..]));
        }
    }
    wrong
}

/// `mget` as it was before `mget_into` (for values up to
/// `VALUE_BYTES_MAX`, all the benchmark stores): `execute` makes one
/// `Outcome`, with its own `Vec`, per key.
fn mget_before(c: &mut Client, keys: &[Vec<u8>]) -> Result<Vec<Option<Vec<u8>>>, String> {
    let ops: Vec<_> = keys.iter().map(|k| BatchOp::Get { key: k }).collect();
    let outcomes = c.execute(&ops).map_err(|e| e.to_string())?;
    let mut values = Vec::with_capacity(outcomes.len());
    for o in outcomes {
        values.push(match o.code {
            ErrorCode::Ok => Some(o.value),
            ErrorCode::NotFound => None,
            code => return Err(format!("mget-before: {code}")),
        });
    }
    Ok(values)
}

/// `calls` calls of one API, cycling through the groups.
fn timed(
    c: &mut Client,
    api: &str,
    calls: usize,
    groups: &[Vec<Vec<u8>>],
    buf: &mut MgetBuf,
) -> Result<Run, String> {
    let keys_per_call = groups.first().map_or(0, Vec::len);
    let mut bytes = 0usize;
    let wall = Instant::now();
    let cpu = thread_cpu_ns()?;
    for i in 0..calls {
        let keys = &groups[i % groups.len()];
        match api {
            "mget" => {
                let v = c.mget(keys).map_err(|e| e.to_string())?;
                bytes += v.iter().flatten().map(Vec::len).sum::<usize>();
            }
            "mget_into" => {
                c.mget_into(keys, buf).map_err(|e| e.to_string())?;
                bytes += buf.data().len();
            }
            _ => {
                let v = mget_before(c, keys)?;
                bytes += v.iter().flatten().map(Vec::len).sum::<usize>();
            }
        }
    }
    let cpu_ns = thread_cpu_ns()?.saturating_sub(cpu);
    let seconds = wall.elapsed().as_secs_f64();
    let keys = (calls * keys_per_call) as f64;
    if bytes == 0 && keys > 0.0 {
        return Err(format!("{api}: every value came back empty"));
    }
    Ok(Run {
        cpu_ns_per_key: cpu_ns as f64 / keys.max(1.0),
        keys_per_s: keys / seconds.max(1e-9),
    })
}

/// What [`measure`] found: each API's runs, the ratios mget_into/mget and
/// mget_into/mget-before of each round, and how many values read back wrong.
type Measured = ([Vec<Run>; 3], Vec<[f64; 2]>, u64);

/// Connects to `addr`, stores every group, then runs the rounds.
fn measure(a: &MgetArgs, addr: &str) -> Result<Measured, String> {
    let mut c = Client::connect(addr).map_err(|e| e.to_string())?;
    let groups: Vec<Vec<Vec<u8>>> = (0..a.groups)
        .map(|g| {
            (0..a.keys)
                .map(|k| format!("bench:mget:{g}:{k}").into_bytes())
                .collect()
        })
        .collect();
    for (g, keys) in groups.iter().enumerate() {
        let items: Vec<(&[u8], Vec<u8>)> = keys
            .iter()
            .enumerate()
            .map(|(k, key)| (&key[..], value(a, g, k)))
            .collect();
        c.mput(&items, None).map_err(|e| e.to_string())?;
    }
    let mut buf = MgetBuf::new();
    let mut runs: [Vec<Run>; 3] = [Vec::new(), Vec::new(), Vec::new()];
    let mut round_ratios = Vec::new();
    let mut wrong = 0;
    for r in 0..a.rounds {
        // Alternate which goes first, so neither always runs warm.
        let mut order = [0, 1, 2];
        order.rotate_left(r % 3);
        let mut this = [None, None, None];
        for i in order {
            wrong += check(&mut c, a, &groups, &mut buf);
            let run = timed(&mut c, APIS[i], a.calls, &groups, &mut buf)?;
            this[i] = Some(run);
            runs[i].push(run);
        }
        if let [Some(old), Some(new), Some(before)] = this {
            round_ratios.push([
                new.cpu_ns_per_key / old.cpu_ns_per_key.max(1e-9),
                new.cpu_ns_per_key / before.cpu_ns_per_key.max(1e-9),
            ]);
        }
    }
    Ok((runs, round_ratios, wrong))
}

/// The median and the range of some values.
fn median_min_max(mut v: Vec<f64>) -> (f64, f64, f64) {
    v.sort_by(f64::total_cmp);
    match (v.first(), v.last()) {
        (Some(&lo), Some(&hi)) => (v[v.len() / 2], lo, hi),
        _ => (0.0, 0.0, 0.0),
    }
}

/// Runs the benchmark; see the module docs.
pub fn run(a: MgetArgs) -> Result<(), String> {
    if a.rounds == 0 || a.calls == 0 || a.keys == 0 || a.groups == 0 || a.value_size == 0 {
        return Err(
            "--rounds, --calls, --keys, --groups and --value-size must be at least 1".into(),
        );
    }
    let mut rows = Vec::new();
    let mut results = Vec::new();
    let mut ratios = Vec::new();
    for transport in a.transports.split(',').map(str::trim) {
        let handle = Server::start(&ServerConfig {
            listen: listen_addr(transport)?,
            workers: Some(1),
            worker_cpus: vec![a.server_cpu],
            mode: Mode::Store,
            memory_bytes: 256 << 20,
            log_level: "warn".into(),
            ..ServerConfig::default()
        })
        .map_err(|e| e.to_string())?;
        // The client runs on a thread of its own, pinned: the server's
        // threads (started from this one) keep their own affinity.
        let addr = handle.addr().to_string();
        let measured = std::thread::scope(|s| {
            s.spawn(|| {
                crate::pin_current_thread(a.client_cpu);
                measure(&a, &addr)
            })
            .join()
        });
        handle.shutdown();
        let (runs, round_ratios, wrong) =
            measured.map_err(|_| format!("{transport}: the client thread panicked"))??;
        if wrong != 0 {
            return Err(format!("{transport}: {wrong} values read back wrong"));
        }
        let mut medians = [0.0; 3];
        for (i, api) in APIS.iter().enumerate() {
            let (cpu, lo, hi) = median_min_max(runs[i].iter().map(|r| r.cpu_ns_per_key).collect());
            let (kps, _, _) = median_min_max(runs[i].iter().map(|r| r.keys_per_s).collect());
            medians[i] = cpu;
            rows.push(vec![
                transport.to_string(),
                api.to_string(),
                format!("{cpu:.1}"),
                format!("{lo:.1}-{hi:.1}"),
                format!("{:.2}", kps / 1e6),
            ]);
            results.push(BenchResult {
                bench: "mget".into(),
                case: format!("{api} {transport} k{}", a.keys),
                system: "fabrickv".into(),
                ops_per_s: kps,
                p50_us: 0.0,
                p99_us: 0.0,
                ops: (a.calls * a.keys * a.rounds) as u64,
                seconds: runs[i]
                    .iter()
                    .map(|r| (a.calls * a.keys) as f64 / r.keys_per_s.max(1e-9))
                    .sum(),
                wrong_values: 0,
                params: serde_json::json!({
                    "api": api,
                    "transport": transport,
                    "keys_per_call": a.keys,
                    "value_bytes": a.value_size,
                    "calls": a.calls,
                    "rounds": a.rounds,
                    "client_cpu_ns_per_key": cpu,
                    "client_cpu_ns_per_key_min": lo,
                    "client_cpu_ns_per_key_max": hi,
                }),
            });
        }
        for (j, vs) in [(0, "mget"), (2, "mget-before")] {
            // The median of the rounds' ratios: each round's APIs ran
            // back to back, so drift of a shared machine cancels in it.
            let per_round: Vec<f64> = round_ratios.iter().map(|r| r[j / 2]).collect();
            let (ratio, rlo, rhi) = median_min_max(per_round.clone());
            let of_medians = medians[1] / medians[j].max(1e-9);
            rows.push(vec![
                transport.to_string(),
                format!("mget_into/{vs}"),
                format!("{ratio:.3}x"),
                format!("{rlo:.3}-{rhi:.3}x"),
                String::new(),
            ]);
            ratios.push(serde_json::json!({
                "bench": "mget",
                "case": format!("ratio mget_into/{vs} {transport} k{}", a.keys),
                "transport": transport,
                "keys_per_call": a.keys,
                "value_bytes": a.value_size,
                "ratio_cpu_per_key": ratio,
                "ratio_of_medians": of_medians,
                "ratio_per_round": per_round,
            }));
        }
    }
    print_table(
        &[
            "transport",
            "api",
            "client CPU ns/key (median)",
            "range",
            "M keys/s",
        ],
        &rows,
    );
    if a.json {
        for r in &results {
            println!("{}", r.json());
        }
        for r in &ratios {
            println!("{r}");
        }
    }
    Ok(())
}
