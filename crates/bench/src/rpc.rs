//! `fabrickv bench rpc`: echo RPCs over any transport, reported in the
//! original RPC benchmark's table (name, ops/s, fast, ave, p50, p99) every few seconds and
//! at the end, for a latency run (one request in flight) and a throughput
//! run (many client threads, many requests in flight each).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use fabrickv_rpc::{
    Affinity, Handlers, RpcClient, RpcClientConfig, RpcServer, RpcStatus, ServerKnobs,
    RPC_HEADER_BYTES,
};
use hdrhistogram::Histogram;

use crate::report::{
    latency_histogram, print_table, BenchResult, LatencySummary, RPC_TABLE_HEADER,
};

/// The echo request type the benchmark server registers.
pub const ECHO: u16 = 1;

/// How often a client thread hands its samples to the reporter, in ms.
const MERGE_INTERVAL_MS: u64 = 50;

/// How long a client thread busy-polls before blocking, in microseconds.
pub const CLIENT_SPIN_US: u64 = 200;

/// What to run.
#[derive(Debug, Clone)]
pub struct RpcOpts {
    /// Server address; the transport is its scheme (`tcp://`, `shm://`, ...).
    pub addr: String,
    /// Server threads (the client needs the count to spread requests).
    pub server_threads: usize,
    /// Client threads of the throughput run.
    pub client_threads: usize,
    /// Requests in flight per client thread in the throughput run.
    pub in_flight: usize,
    /// Message size on the wire (RPC header included), bytes.
    pub msg_size: usize,
    /// Server thread choice.
    pub affinity: Affinity,
    /// Measured time per run.
    pub duration: Duration,
    /// Seconds between interim rows (0: only the final row).
    pub report_every: Duration,
    /// CPUs for client threads, round robin.
    pub client_cpus: Vec<usize>,
    /// Reply slot bytes each client offers for out-of-line responses (0: none).
    pub reply_slot_bytes: usize,
    /// Labels for the JSON (`transport`, knobs), copied into `params`.
    pub labels: serde_json::Value,
}

/// An echo server with the given knobs, in this process.
pub fn echo_server(addr: &str, threads: usize, knobs: ServerKnobs) -> Result<RpcServer, String> {
    let mut h = Handlers::new();
    h.register(ECHO, |req, out| {
        out.extend_from_slice(req);
        Ok(())
    })
    .map_err(|e| e.to_string())?;
    RpcServer::start(addr, threads, Arc::new(h), knobs).map_err(|e| e.to_string())
}

/// Samples shared by the client threads of one run.
struct Shared {
    interval: Mutex<Histogram<u64>>,
    total: Mutex<Histogram<u64>>,
    errors: Mutex<Vec<String>>,
    stop: AtomicBool,
}

/// Runs one case (`threads` clients with `in_flight` requests each) and
/// prints its rows; returns the final result.
pub fn run_case(
    opts: &RpcOpts,
    name: &str,
    threads: usize,
    in_flight: usize,
) -> Result<BenchResult, String> {
    let shared = Arc::new(Shared {
        interval: Mutex::new(latency_histogram()?),
        total: Mutex::new(latency_histogram()?),
        errors: Mutex::new(Vec::new()),
        stop: AtomicBool::new(false),
    });
    let payload = vec![0xA5u8; opts.msg_size.saturating_sub(RPC_HEADER_BYTES)];
    let handles: Vec<_> = (0..threads)
        .map(|t| {
            let (opts, shared, payload) = (opts.clone(), shared.clone(), payload.clone());
            std::thread::spawn(move || {
                if let Err(e) = client_thread(t, &opts, in_flight, &payload, &shared) {
                    if let Ok(mut errs) = shared.errors.lock() {
                        errs.push(e);
                    }
                    shared.stop.store(true, Ordering::Release);
                }
            })
        })
        .collect();
    let start = Instant::now();
    let mut last = start;
    while start.elapsed() < opts.duration && !shared.stop.load(Ordering::Acquire) {
        let step = if opts.report_every.is_zero() {
            opts.duration
        } else {
            opts.report_every
        };
        std::thread::sleep(
            step.min(opts.duration.saturating_sub(start.elapsed()))
                .max(Duration::from_millis(1)),
        );
        if !opts.report_every.is_zero() && start.elapsed() < opts.duration {
            let mut h = shared.interval.lock().map_err(|_| "poisoned")?;
            let s = LatencySummary::from_histogram(&h, last.elapsed().as_secs_f64());
            h.reset();
            last = Instant::now();
            drop(h);
            print_table(
                &RPC_TABLE_HEADER,
                &[s.row(&format!("{name} @{:.0}s", start.elapsed().as_secs_f64()))],
            );
        }
    }
    shared.stop.store(true, Ordering::Release);
    let seconds = start.elapsed().as_secs_f64();
    for h in handles {
        let _ = h.join();
    }
    if let Some(e) = shared.errors.lock().map_err(|_| "poisoned")?.first() {
        return Err(e.clone());
    }
    let total = shared.total.lock().map_err(|_| "poisoned")?;
    let s = LatencySummary::from_histogram(&total, seconds);
    let mut params = opts.labels.clone();
    if let Some(m) = params.as_object_mut() {
        m.insert("fast_us".into(), s.fast_us.into());
        m.insert("ave_us".into(), s.ave_us.into());
        m.insert("client_threads".into(), threads.into());
        m.insert("in_flight".into(), in_flight.into());
        m.insert("server_threads".into(), opts.server_threads.into());
        m.insert("msg_size".into(), opts.msg_size.into());
        m.insert(
            "affinity".into(),
            format!("{:?}", opts.affinity).to_lowercase().into(),
        );
    }
    Ok(BenchResult {
        bench: "rpc".into(),
        case: name.to_string(),
        system: "fabrickv".into(),
        ops_per_s: s.ops_per_s,
        p50_us: s.p50_us,
        p99_us: s.p99_us,
        ops: total.len(),
        seconds,
        wrong_values: 0,
        params,
    })
}

fn client_thread(
    t: usize,
    opts: &RpcOpts,
    in_flight: usize,
    payload: &[u8],
    shared: &Shared,
) -> Result<(), String> {
    if !opts.client_cpus.is_empty() {
        crate::pin_current_thread(opts.client_cpus[t % opts.client_cpus.len()]);
    }
    let cfg = RpcClientConfig {
        credits: in_flight,
        affinity: opts.affinity,
        client_id: t,
        reply_slot_bytes: opts.reply_slot_bytes,
        ..Default::default()
    };
    let mut c =
        RpcClient::connect(&opts.addr, opts.server_threads, cfg).map_err(|e| e.to_string())?;
    let mut local = latency_histogram()?;
    let mut last_merge = Instant::now();
    let mut idle_since: Option<Instant> = None;
    let mut failure: Option<String> = None;
    while !shared.stop.load(Ordering::Acquire) {
        while c.in_flight() < in_flight {
            match c.call_async(ECHO, payload) {
                Ok(_) => {}
                Err(fabrickv_rpc::RpcError::NoCredits) => break,
                Err(e) => return Err(e.to_string()),
            }
        }
        c.flush().map_err(|e| e.to_string())?;
        let n = c
            .poll(&mut |done| {
                if done.status != RpcStatus::Ok || done.payload.len() != payload.len() {
                    failure = Some(format!(
                        "request {} answered {:?}",
                        done.request_id, done.status
                    ));
                }
                local.saturating_record(done.latency.as_nanos() as u64);
            })
            .map_err(|e| e.to_string())?;
        if let Some(f) = failure.take() {
            return Err(f);
        }
        if last_merge.elapsed() >= Duration::from_millis(MERGE_INTERVAL_MS) {
            merge(shared, &mut local)?;
            last_merge = Instant::now();
        }
        if n > 0 {
            idle_since = None;
        } else if idle_since.get_or_insert_with(Instant::now).elapsed()
            >= Duration::from_micros(CLIENT_SPIN_US)
        {
            c.wait(Duration::from_millis(10))
                .map_err(|e| e.to_string())?;
        }
    }
    merge(shared, &mut local)
}

fn merge(shared: &Shared, local: &mut Histogram<u64>) -> Result<(), String> {
    shared
        .interval
        .lock()
        .map_err(|_| "poisoned")?
        .add(&*local)
        .map_err(|e| e.to_string())?;
    shared
        .total
        .lock()
        .map_err(|_| "poisoned")?
        .add(&*local)
        .map_err(|e| e.to_string())?;
    local.reset();
    Ok(())
}
