//! `fabrickv bench rpc`: echo requests over any transport, through the
//! product's own request layer: workers of `fabrickv_rpc::worker` with the
//! echo service registered, ECHO frames of `fabrickv-wire` with their
//! 32-byte header, and client [`Sessions`], as every FabricKV client and
//! server runs. Reported in the RPC table (name, ops/s, fast, ave, p50,
//! p99) every few seconds and at the end, for a latency run (one request
//! in flight) and a throughput run (many client threads, many requests in
//! flight each).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use fabrickv_rpc::placement::modulo;
use fabrickv_rpc::{
    EchoService, LoopKnobs, RpcError, Service, Serving, Session, Sessions, StatsService,
    WireFrames, Worker,
};
use fabrickv_types::limits::FRAME_HEADER_BYTES;
use fabrickv_wire::echo::encode_echo;
use fabrickv_wire::{decode_frame, FrameKind};
use hdrhistogram::Histogram;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use crate::report::{
    latency_histogram, print_table, BenchResult, LatencySummary, RPC_TABLE_HEADER,
};

/// How often a client thread hands its samples to the reporter, in ms.
const MERGE_INTERVAL_MS: u64 = 50;

/// How long a client thread busy-polls before blocking, in microseconds.
pub const CLIENT_SPIN_US: u64 = 200;

/// Longest a client thread waits without any reply before it gives up
/// the run, in milliseconds: far above any round trip on a loaded
/// machine, so only a server that stopped answering reaches it.
pub const CLIENT_STALL_MS: u64 = 10_000;

/// How long one connect may take, in milliseconds.
const CONNECT_TIMEOUT_MS: u64 = 10_000;

/// Which server worker a request goes to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Affinity {
    /// Each request to a random worker (the placement eRPC's benchmarks
    /// call ThroughputB).
    Random,
    /// Every request to worker `client % workers`
    /// ([`fabrickv_rpc::placement::modulo`], eRPC's ThroughputC): one
    /// session, no sharing of workers between a client's requests.
    Modulo,
}

impl std::str::FromStr for Affinity {
    type Err = String;

    fn from_str(s: &str) -> Result<Affinity, String> {
        match s {
            "random" => Ok(Affinity::Random),
            "modulo" => Ok(Affinity::Modulo),
            _ => Err(format!("unknown affinity {s:?}: expected random or modulo")),
        }
    }
}

/// What to run.
#[derive(Debug, Clone)]
pub struct RpcOpts {
    /// Server address; the transport is its scheme (`tcp://`, `shm://`, ...).
    pub addr: String,
    /// Server workers (the client needs the count to spread requests).
    pub server_threads: usize,
    /// Client threads of the throughput run.
    pub client_threads: usize,
    /// Requests in flight per client thread in the throughput run.
    pub in_flight: usize,
    /// Message size on the wire (frame header included), bytes.
    pub msg_size: usize,
    /// Server worker choice.
    pub affinity: Affinity,
    /// Measured time per run.
    pub duration: Duration,
    /// Seconds between interim rows (0: only the final row).
    pub report_every: Duration,
    /// CPUs for client threads, round robin.
    pub client_cpus: Vec<usize>,
    /// Labels for the JSON (`transport`, knobs), copied into `params`.
    pub labels: serde_json::Value,
}

/// Workers with the echo service (and STATS) registered, looping as
/// `knobs` say, in this process.
pub fn echo_server(addr: &str, workers: usize, knobs: LoopKnobs) -> Result<Serving, String> {
    Serving::start(addr, workers, knobs, |id| {
        let services: [Box<dyn Service>; 2] = [Box::new(EchoService), Box::new(StatsService)];
        Worker::new(id).with(services)
    })
    .map_err(|e| e.to_string())
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
    let payload = vec![0xA5u8; opts.msg_size.saturating_sub(FRAME_HEADER_BYTES)];
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

/// The sessions of client thread `t`: one to its worker (`Modulo`), or
/// one to each worker (`Random`).
/// A client thread's sessions, its requests tagged with their send time.
type EchoSessions = Sessions<Instant, WireFrames>;

fn sessions(t: usize, opts: &RpcOpts, credits: usize) -> Result<EchoSessions, String> {
    let workers = opts.server_threads.max(1);
    let chosen: Vec<usize> = match opts.affinity {
        Affinity::Modulo => vec![modulo(t, workers)],
        Affinity::Random => (0..workers).collect(),
    };
    let timeout = Duration::from_millis(CONNECT_TIMEOUT_MS);
    let mut list = Vec::with_capacity(chosen.len());
    for w in chosen {
        let w = u16::try_from(w).map_err(|_| format!("worker {w} is out of range"))?;
        let ep = fabrickv_transport::connect(&opts.addr, w, timeout).map_err(|e| e.to_string())?;
        list.push(Session::new(ep, w));
    }
    Ok(Sessions::new(list, credits, timeout))
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
    let mut c = sessions(t, opts, in_flight)?;
    let mut rng = SmallRng::seed_from_u64(t as u64);
    let mut local = latency_histogram()?;
    let mut last_merge = Instant::now();
    let mut idle_since: Option<Instant> = None;
    let mut last_reply = Instant::now();
    let mut failure: Option<String> = None;
    while !shared.stop.load(Ordering::Acquire) {
        while c.in_flight() < in_flight {
            let s = if c.len() == 1 {
                0
            } else {
                rng.gen_range(0..c.len())
            };
            match c.post(s, Instant::now(), |b, id, w| encode_echo(b, id, w, payload)) {
                Ok(_) => {}
                Err(RpcError::NoCredits) => break,
                Err(e) => return Err(e.to_string()),
            }
        }
        c.flush().map_err(|e| e.to_string())?;
        let mut n = 0;
        for s in 0..c.len() {
            n += c
                .take_replies(s, |m, sent| {
                    let f = decode_frame(m)
                        .map_err(|e| RpcError::Invalid(format!("a bad reply frame: {e}")))?;
                    if f.header.kind != FrameKind::EchoReply || f.body.len() != payload.len() {
                        failure.get_or_insert(format!(
                            "request {} answered with a {:?} of {} bytes",
                            sent.id,
                            f.header.kind,
                            f.body.len()
                        ));
                    } else {
                        local.saturating_record(sent.tag.elapsed().as_nanos() as u64);
                    }
                    Ok(())
                })
                .map_err(|e| e.to_string())?;
        }
        if let Some(f) = failure.take() {
            return Err(f);
        }
        if last_merge.elapsed() >= Duration::from_millis(MERGE_INTERVAL_MS) {
            merge(shared, &mut local)?;
            last_merge = Instant::now();
        }
        if n > 0 {
            idle_since = None;
            last_reply = Instant::now();
        } else if last_reply.elapsed() >= Duration::from_millis(CLIENT_STALL_MS) {
            return Err(format!("no reply for {CLIENT_STALL_MS} ms"));
        } else if idle_since.get_or_insert_with(Instant::now).elapsed()
            >= Duration::from_micros(CLIENT_SPIN_US)
        {
            wait_any(&mut c)?;
        }
    }
    merge(shared, &mut local)
}

/// Blocks briefly on the first session with a request in flight, until a
/// reply may have come.
fn wait_any(c: &mut EchoSessions) -> Result<(), String> {
    let Some(s) = c.all().iter_mut().find(|s| !s.is_idle()) else {
        return Ok(());
    };
    match s.wait_until(Instant::now() + Duration::from_millis(10)) {
        Ok(()) | Err(RpcError::Timeout) => Ok(()),
        Err(e) => Err(e.to_string()),
    }
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
