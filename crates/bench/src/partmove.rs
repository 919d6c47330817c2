//! `fabrickv bench partition-move`: what moving partitions between workers
//! costs the clients of a loaded server.
//!
//! A server of `workers` workers and `partitions` partitions is started in
//! this process and preloaded. Client threads load it as `bench kv` does
//! (pipelined frames of `batch` operations, `in_flight` frames per
//! connection, every GET's value checked), steering each frame to a
//! worker by the partition table they hold; a reply carrying the
//! WRONG_WORKER hint makes the thread fetch the table again (over a
//! second client, so the frames in flight on the first are not
//! disturbed). The run has three phases: steady, moving (one partition
//! moved to another worker every `move_every`), steady again. Each
//! frame's latency is recorded in the window (`window`, 100 ms by
//! default) and the phase in which its reply came.

use std::sync::{Arc, Barrier, OnceLock};
use std::time::{Duration, Instant};

use fabrickv_client::Client;
use fabrickv_server::{Mode, Server, ServerConfig};
use fabrickv_types::ErrorCode;
use fabrickv_wire::{decode_frame, FrameKind, ResponseIter};
use hdrhistogram::Histogram;

use crate::keys::{check_value, make_key};
use crate::kv::{preload_keys, LATENCY_NS_MAX};
use crate::load::{Load, Sent, Shape};
use crate::report::BenchResult;

/// The phases of a run, in order.
pub const PHASES: [&str; 3] = ["before", "moving", "after"];

/// Most latency windows one run records (an hour of 100 ms windows).
pub const WINDOWS_MAX: usize = 36_000;

/// What to run.
#[derive(Debug, Clone)]
pub struct MoveOpts {
    /// `tcp` or `shm`.
    pub transport: String,
    /// Workers of the server.
    pub workers: usize,
    /// Partitions of the server.
    pub partitions: usize,
    /// Client threads.
    pub threads: usize,
    /// Distinct keys, preloaded.
    pub keys: u64,
    /// Key and value sizes, the GET share, and the frames of the load.
    pub shape: Shape,
    /// Length of each steady phase (before and after the moves).
    pub steady: Duration,
    /// Length of the phase in which partitions move.
    pub moving: Duration,
    /// Time between two moves.
    pub move_every: Duration,
    /// Length of a latency window.
    pub window: Duration,
}

impl Default for MoveOpts {
    fn default() -> Self {
        MoveOpts {
            transport: "tcp".into(),
            workers: 2,
            partitions: 8,
            threads: 2,
            keys: 100_000,
            shape: Shape::default(),
            steady: Duration::from_secs(2),
            moving: Duration::from_secs(2),
            move_every: Duration::from_millis(50),
            window: Duration::from_millis(100),
        }
    }
}

/// One latency window of the whole run (every client thread).
#[derive(Debug, Clone)]
pub struct Window {
    /// Its start, from the start of the run, in milliseconds.
    pub start_ms: u64,
    /// The phase it falls in (index into [`PHASES`]).
    pub phase: usize,
    /// Operations answered in it.
    pub ops: u64,
    /// Median frame latency, microseconds.
    pub p50_us: f64,
    /// 99th percentile frame latency, microseconds.
    pub p99_us: f64,
}

/// The whole run: one result per phase, the windows, and the totals.
#[derive(Debug)]
pub struct MoveReport {
    /// One result per phase, in [`PHASES`] order.
    pub phases: Vec<BenchResult>,
    /// Every window, in time order.
    pub windows: Vec<Window>,
    /// Moves made.
    pub moves: u64,
    /// Operations the clients saw fail or read wrong (must be 0).
    pub errors: u64,
}

impl MoveReport {
    /// p99 while partitions move over p99 before (the target is
    /// at most 3).
    pub fn p99_ratio(&self) -> f64 {
        self.phases[1].p99_us / self.phases[0].p99_us.max(1e-9)
    }

    /// p99 after the moves over p99 before: two steady phases, so this is
    /// what noise alone does to the ratio on the machine at the time.
    pub fn p99_noise_ratio(&self) -> f64 {
        self.phases[2].p99_us / self.phases[0].p99_us.max(1e-9)
    }
}

/// The median of `v` (the mean of the middle two for an even count); 0
/// for none.
pub fn median(mut v: Vec<f64>) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// What one client thread counted.
struct Counts {
    /// Latency of each frame, by window of its reply.
    windows: Vec<Histogram<u64>>,
    /// Operations answered, by window.
    ops: Vec<u64>,
    /// Operations in frames that came back with the hint, by phase.
    misrouted: [u64; 3],
    /// Tables fetched after a hint, by phase.
    refreshes: [u64; 3],
    /// Operations answered with an error code, or reading a wrong value,
    /// by phase.
    errors: [u64; 3],
}

/// The phase of instant `at` of a run started at `t0`.
fn phase_of(o: &MoveOpts, t0: Instant, at: Instant) -> usize {
    let d = at.saturating_duration_since(t0);
    if d < o.steady {
        0
    } else if d < o.steady + o.moving {
        1
    } else {
        2
    }
}

/// Runs the benchmark.
pub fn run(o: &MoveOpts) -> Result<MoveReport, String> {
    if o.workers < 2 || o.partitions < o.workers || o.threads == 0 || o.shape.batch == 0 {
        return Err(
            "partition-move needs 2+ workers, at least as many partitions, \
                    and 1+ threads and batch"
                .into(),
        );
    }
    if o.window.is_zero() || o.move_every.is_zero() {
        return Err("--window-ms and --move-every-ms must be positive".into());
    }
    let total = o.steady * 2 + o.moving;
    let windows = (total.as_nanos() / o.window.as_nanos()) as usize + 1;
    if windows > WINDOWS_MAX {
        return Err(format!("at most {WINDOWS_MAX} windows per run"));
    }
    let listen = match o.transport.as_str() {
        "tcp" => "tcp://127.0.0.1:0".to_string(),
        "shm" => format!("shm://fkv-bench-partmove-{}", std::process::id()),
        t => return Err(format!("partition-move runs over tcp or shm, not {t:?}")),
    };
    let item = o.shape.key_size + o.shape.value_size + 64;
    // Each partition gets at least 32 MiB, so no write is refused.
    let memory = ((o.keys as usize * item * 3) as u64).max(o.partitions as u64 * (32 << 20));
    let server = Server::start(&ServerConfig {
        listen,
        workers: Some(o.workers),
        partitions: Some(o.partitions),
        mode: Mode::Store,
        memory_bytes: memory,
        log_level: "warn".into(),
        ..ServerConfig::default()
    })
    .map_err(|e| e.to_string())?;
    let addr = server.addr().to_string();
    let mut admin = Client::connect(&addr).map_err(|e| format!("connecting to {addr}: {e}"))?;
    preload_keys(&mut admin, o.keys, o.shape.key_size, o.shape.value_size)?;
    let mut key = Vec::new();
    let part_of: Vec<u32> = (0..o.keys)
        .map(|i| {
            make_key(i, o.shape.key_size, &mut key);
            admin.partition_of(&key)
        })
        .collect();
    let part_of = Arc::new(part_of);
    let t0: Arc<OnceLock<Instant>> = Arc::new(OnceLock::new());
    let go = Arc::new(Barrier::new(o.threads + 1));
    let threads: Vec<_> = (0..o.threads)
        .map(|t| {
            let (o, addr, part_of, t0, go) = (
                o.clone(),
                addr.clone(),
                part_of.clone(),
                t0.clone(),
                go.clone(),
            );
            std::thread::spawn(move || {
                let conns = Client::connect(&addr)
                    .and_then(|c| Ok((c, Client::connect(&addr)?)))
                    .map_err(|e| format!("connecting to {addr}: {e}"));
                go.wait();
                let (client, ctl) = conns?;
                let t0 = *t0.get().ok_or("the run never started")?;
                client_thread(t, &o, client, ctl, &part_of, t0, windows)
            })
        })
        .collect();
    let start = Instant::now();
    let _ = t0.set(start);
    go.wait();
    // The mover: after the first steady phase, one partition every
    // `move_every` to the next worker, round the partitions.
    let mut moves = 0u64;
    std::thread::sleep(o.steady);
    let moving_end = start + o.steady + o.moving;
    let mut next = Instant::now();
    while Instant::now() < moving_end {
        let p = (moves % o.partitions as u64) as u32;
        let t = admin
            .partition_table()
            .map_err(|e| format!("reading the table: {e}"))?;
        let to = (t.owners[p as usize] + 1) % o.workers as u16;
        admin
            .move_partition(p, to)
            .map_err(|e| format!("moving partition {p}: {e}"))?;
        moves += 1;
        next += o.move_every;
        let now = Instant::now();
        if next > now {
            std::thread::sleep(next.min(moving_end) - now);
        }
    }
    let mut all: Vec<Counts> = Vec::with_capacity(o.threads);
    let mut failure = None;
    for t in threads {
        match t.join() {
            Ok(Ok(c)) => all.push(c),
            Ok(Err(e)) => failure = failure.or(Some(e)),
            Err(_) => failure = failure.or(Some("client thread panicked".to_string())),
        }
    }
    if let Some(e) = failure {
        return Err(e);
    }
    drop(admin);
    server.shutdown();
    summarize(o, &all, moves, windows)
}

/// One client thread: the `bench kv` loop, steered by the table.
fn client_thread(
    t: usize,
    o: &MoveOpts,
    mut client: Client,
    mut ctl: Client,
    part_of: &[u32],
    t0: Instant,
    windows: usize,
) -> Result<Counts, String> {
    let workers = o.workers;
    let mut c = Counts {
        windows: Vec::with_capacity(windows),
        ops: vec![0; windows],
        misrouted: [0; 3],
        refreshes: [0; 3],
        errors: [0; 3],
    };
    for _ in 0..windows {
        c.windows
            .push(Histogram::new_with_bounds(1, LATENCY_NS_MAX, 3).map_err(|e| e.to_string())?);
    }
    let mut owned: Vec<Vec<u64>> = vec![Vec::new(); workers];
    let steer = |owners: &[u16], owned: &mut Vec<Vec<u64>>| {
        for o in owned.iter_mut() {
            o.clear();
        }
        for (i, &p) in part_of.iter().enumerate() {
            owned[usize::from(owners[p as usize])].push(i as u64);
        }
    };
    let table = ctl.partition_table().map_err(|e| e.to_string())?;
    steer(&table.owners, &mut owned);
    let mut load = Load::new(workers, 0x9A27 ^ t as u64, o.shape, client.timeout());
    let end = t0 + o.steady * 2 + o.moving;
    loop {
        let sending = Instant::now() < end;
        let mut stale = false;
        if sending {
            load.post(&mut client, &owned)?;
        }
        let progressed = load.poll(&mut client, |msg, sent| {
            let now = Instant::now();
            let win = ((now.saturating_duration_since(t0).as_nanos() / o.window.as_nanos())
                as usize)
                .min(windows - 1);
            c.windows[win].saturating_record(sent.at.elapsed().as_nanos() as u64);
            c.ops[win] += sent.ops.len() as u64;
            let (bad, hint) = check(msg, sent, o.shape.value_size)?;
            let phase = phase_of(o, t0, now);
            c.errors[phase] += bad;
            if hint {
                c.misrouted[phase] += sent.ops.len() as u64;
                stale = true;
            }
            Ok(())
        })?;
        if stale && sending {
            let table = ctl.partition_table().map_err(|e| e.to_string())?;
            steer(&table.owners, &mut owned);
            c.refreshes[phase_of(o, t0, Instant::now())] += 1;
        }
        if !sending && load.is_drained() {
            break;
        }
        load.pause(&mut client, progressed)?;
    }
    Ok(c)
}

/// Checks one reply: how many operations failed or read a wrong value,
/// and whether it carries the WRONG_WORKER hint.
fn check(msg: &[u8], sent: &Sent, value_size: usize) -> Result<(u64, bool), String> {
    let f = decode_frame(msg).map_err(|e| format!("bad reply: {e}"))?;
    if f.header.request_id != sent.id || f.header.kind != FrameKind::Response {
        return Err(format!(
            "unexpected reply {:?} to request {}",
            f.header, sent.id
        ));
    }
    let hint = f.header.status == ErrorCode::WrongWorker.as_u16();
    let results = ResponseIter::new(&f).map_err(|e| format!("bad reply: {e}"))?;
    let mut bad = 0;
    for (r, &(i, is_get)) in results.zip(&sent.ops) {
        match (r.code(), is_get) {
            (ErrorCode::Ok, true) if check_value(i, value_size, r.value) => {}
            (ErrorCode::Ok, false) => {}
            _ => bad += 1,
        }
    }
    Ok((bad, hint))
}

/// Adds up the threads' windows into phases.
fn summarize(
    o: &MoveOpts,
    all: &[Counts],
    moves: u64,
    windows: usize,
) -> Result<MoveReport, String> {
    let new = || Histogram::<u64>::new_with_bounds(1, LATENCY_NS_MAX, 3);
    let mut phase_hist = [
        new().map_err(|e| e.to_string())?,
        new().map_err(|e| e.to_string())?,
        new().map_err(|e| e.to_string())?,
    ];
    let mut phase_ops = [0u64; 3];
    let mut phase_worst = [0f64; 3];
    let mut out = Vec::with_capacity(windows);
    let win_ms = o.window.as_millis() as u64;
    let steady_ms = o.steady.as_millis() as u64;
    let moving_ms = o.moving.as_millis() as u64;
    for w in 0..windows {
        let start_ms = w as u64 * win_ms;
        // A window belongs to the phase it starts in; one that straddles
        // a boundary is left out of both phases' worst window.
        let phase = if start_ms < steady_ms {
            0
        } else if start_ms < steady_ms + moving_ms {
            1
        } else {
            2
        };
        let straddles = [steady_ms, steady_ms + moving_ms]
            .iter()
            .any(|&b| start_ms < b && b < start_ms + win_ms);
        let mut h = new().map_err(|e| e.to_string())?;
        let mut ops = 0;
        for c in all {
            h.add(&c.windows[w]).map_err(|e| e.to_string())?;
            ops += c.ops[w];
        }
        if h.is_empty() {
            continue;
        }
        phase_hist[phase].add(&h).map_err(|e| e.to_string())?;
        phase_ops[phase] += ops;
        let p99 = h.value_at_quantile(0.99) as f64 / 1e3;
        if !straddles {
            phase_worst[phase] = phase_worst[phase].max(p99);
        }
        out.push(Window {
            start_ms,
            phase,
            ops,
            p50_us: h.value_at_quantile(0.50) as f64 / 1e3,
            p99_us: p99,
        });
    }
    let errors: u64 = all.iter().map(|c| c.errors.iter().sum::<u64>()).sum();
    let seconds = [o.steady, o.moving, o.steady].map(|d| d.as_secs_f64());
    let phases = (0..3)
        .map(|p| BenchResult {
            bench: "partition-move".into(),
            case: PHASES[p].into(),
            system: "fabrickv".into(),
            ops_per_s: phase_ops[p] as f64 / seconds[p].max(1e-9),
            p50_us: phase_hist[p].value_at_quantile(0.50) as f64 / 1e3,
            p99_us: phase_hist[p].value_at_quantile(0.99) as f64 / 1e3,
            ops: phase_ops[p],
            seconds: seconds[p],
            wrong_values: all.iter().map(|c| c.errors[p]).sum(),
            params: serde_json::json!({
                "transport": o.transport, "workers": o.workers, "partitions": o.partitions,
                "threads": o.threads, "keys": o.keys, "key_size": o.shape.key_size,
                "value_size": o.shape.value_size, "get_percent": o.shape.get_percent, "batch": o.shape.batch,
                "in_flight": o.shape.in_flight, "window_ms": win_ms,
                "move_every_ms": o.move_every.as_millis() as u64,
                "moves": if p == 1 { moves } else { 0 },
                "worst_window_p99_us": phase_worst[p],
                "misrouted_ops": all.iter().map(|c| c.misrouted[p]).sum::<u64>(),
                "table_refreshes": all.iter().map(|c| c.refreshes[p]).sum::<u64>(),
            }),
        })
        .collect();
    Ok(MoveReport {
        phases,
        windows: out,
        moves,
        errors,
    })
}

/// The report as a table: one line per phase, then the verdict.
pub fn table(o: &MoveOpts, r: &MoveReport) -> String {
    let mut s = format!(
        "partition-move: {} workers, {} partitions, {} client threads over {}, {} ops/frame x {} \
         in flight, {}% GET; {} moves, one every {} ms; {} ms windows\n",
        o.workers,
        o.partitions,
        o.threads,
        o.transport,
        o.shape.batch,
        o.shape.in_flight,
        o.shape.get_percent,
        r.moves,
        o.move_every.as_millis(),
        o.window.as_millis()
    );
    s.push_str(&format!(
        "{:<7} {:>7} {:>8} {:>9} {:>9} {:>16} {:>13} {:>10}\n",
        "phase",
        "seconds",
        "Mops/s",
        "p50 us",
        "p99 us",
        "worst win p99",
        "misrouted ops",
        "refreshes"
    ));
    for p in &r.phases {
        s.push_str(&format!(
            "{:<7} {:>7.1} {:>8.3} {:>9.1} {:>9.1} {:>16.1} {:>13} {:>10}\n",
            p.case,
            p.seconds,
            p.ops_per_s / 1e6,
            p.p50_us,
            p.p99_us,
            p.params["worst_window_p99_us"].as_f64().unwrap_or(0.0),
            p.params["misrouted_ops"].as_u64().unwrap_or(0),
            p.params["table_refreshes"].as_u64().unwrap_or(0),
        ));
    }
    s.push_str(&format!(
        "errors seen by clients: {}; p99 moving / before: {:.2}x (target <= 3x); p99 after / \
         before (no moves, the noise): {:.2}x\n",
        r.errors,
        r.p99_ratio(),
        r.p99_noise_ratio()
    ));
    s
}

/// The windows as a table (`--windows`).
pub fn windows_table(r: &MoveReport) -> String {
    let mut s = format!(
        "{:>8} {:<7} {:>10} {:>9} {:>9}\n",
        "at ms", "phase", "ops", "p50 us", "p99 us"
    );
    for w in &r.windows {
        s.push_str(&format!(
            "{:>8} {:<7} {:>10} {:>9.1} {:>9.1}\n",
            w.start_ms, PHASES[w.phase], w.ops, w.p50_us, w.p99_us
        ));
    }
    s
}

/// The summary JSON line: errors, ratio, moves.
pub fn summary_json(r: &MoveReport) -> String {
    serde_json::json!({
        "bench": "partition-move", "case": "summary", "errors": r.errors, "moves": r.moves,
        "p99_before_us": r.phases[0].p99_us, "p99_moving_us": r.phases[1].p99_us,
        "p99_ratio": r.p99_ratio(), "p99_noise_ratio": r.p99_noise_ratio(),
        "ops_per_s": r.phases.iter().map(|p| p.ops as f64).sum::<f64>()
            / r.phases.iter().map(|p| p.seconds).sum::<f64>().max(1e-9),
    })
    .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tiny_run_moves_partitions_without_errors() {
        let o = MoveOpts {
            keys: 2_000,
            steady: Duration::from_millis(200),
            moving: Duration::from_millis(300),
            move_every: Duration::from_millis(20),
            ..MoveOpts::default()
        };
        let r = run(&o).expect("a run");
        assert_eq!(r.errors, 0);
        assert!(r.moves >= 2, "moves were made: {}", r.moves);
        assert_eq!(r.phases.len(), 3);
        assert!(r.phases.iter().all(|p| p.ops > 0));
        assert!(table(&o, &r).contains("errors seen by clients: 0"));
    }

    #[test]
    fn median_of_odd_even_and_none() {
        assert_eq!(median(vec![3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(vec![4.0, 1.0, 2.0, 3.0]), 2.5);
        assert_eq!(median(Vec::new()), 0.0);
    }
}
