//! `fabrickv bench kv`: a GET/PUT mix over the native protocol.
//!
//! Each client thread opens its own [`Client`] (one connection per server
//! worker), keeps `in_flight` request frames outstanding on every
//! connection, each frame carrying `batch` operations on keys owned by
//! that connection's worker, and times every frame from post to reply.
//! Keys are preloaded first; PUTs rewrite a key's own value, so every GET
//! is checked against the value its key must have.

use std::sync::Arc;
use std::time::{Duration, Instant};

use fabrickv_client::{Client, Kv};
use fabrickv_server::{Mode, Server, ServerConfig, ServerHandle};
use fabrickv_types::ErrorCode;
use fabrickv_wire::{decode_frame, FrameKind, ResponseIter};
use hdrhistogram::Histogram;

use crate::keys::{check_value, fill_value, make_key};
use crate::load::{Load, Sent, Shape};
use crate::report::BenchResult;

/// Largest latency the histograms hold, in nanoseconds (60 s); longer
/// samples are clamped to it.
pub const LATENCY_NS_MAX: u64 = 60_000_000_000;

/// What to run.
#[derive(Debug, Clone)]
pub struct KvOpts {
    /// Server to load; `None` starts one in this process on loopback.
    pub server: Option<String>,
    /// Workers of the in-process server.
    pub server_workers: usize,
    /// Client threads.
    pub threads: usize,
    /// Distinct keys.
    pub keys: u64,
    /// Key and value sizes, the GET share, and the frames of the load.
    pub shape: Shape,
    /// Measured time.
    pub duration: Duration,
    /// CPUs to pin client threads to, round robin (none: unpinned).
    pub client_cpus: Vec<usize>,
    /// Store every key before measuring (off when the caller already has).
    pub preload: bool,
}

impl Default for KvOpts {
    fn default() -> Self {
        KvOpts {
            server: None,
            server_workers: 1,
            threads: 1,
            keys: 100_000,
            shape: Shape::default(),
            duration: Duration::from_secs(5),
            client_cpus: Vec::new(),
            preload: true,
        }
    }
}

impl KvOpts {
    /// The case name used in tables and JSON.
    pub fn case(&self) -> String {
        let mix = match self.shape.get_percent {
            100 => "get".to_string(),
            0 => "put".to_string(),
            g => format!("get{g}/put{}", 100 - g),
        };
        format!(
            "{mix} k{} v{} b{}",
            self.shape.key_size, self.shape.value_size, self.shape.batch
        )
    }
}

/// Runs the benchmark and returns its result.
pub fn run(opts: &KvOpts) -> Result<BenchResult, String> {
    run_gated(opts, &mut || Ok(()))
}

/// Runs the benchmark with a start gate: every client thread connects,
/// then `gate` is called (a multi-process sweep meets its barrier there),
/// and only when it returns do the threads start their measured load. A
/// gate that fails stops the run before anything is measured.
pub fn run_gated(
    opts: &KvOpts,
    gate: &mut dyn FnMut() -> Result<(), String>,
) -> Result<BenchResult, String> {
    if opts.shape.batch == 0
        || opts.shape.in_flight == 0
        || opts.threads == 0
        || opts.keys == 0
        || opts.shape.key_size == 0
    {
        return Err("batch, in-flight, threads, keys and key size must all be at least 1".into());
    }
    let _embedded: Option<ServerHandle>;
    let addr = match &opts.server {
        Some(a) => {
            _embedded = None;
            a.clone()
        }
        None => {
            let item = opts.shape.key_size + opts.shape.value_size + 64;
            let memory = ((opts.keys as usize * item * 2) as u64).max(64 << 20);
            let h = Server::start(&ServerConfig {
                listen: "127.0.0.1:0".into(),
                workers: Some(opts.server_workers),
                mode: Mode::Store,
                memory_bytes: memory,
                log_level: "warn".into(),
                ..ServerConfig::default()
            })
            .map_err(|e| e.to_string())?;
            let a = h.addr().to_string();
            _embedded = Some(h);
            a
        }
    };
    let mut client = Client::connect(&addr).map_err(|e| format!("connecting to {addr}: {e}"))?;
    let workers = usize::from(client.info().workers);
    // Which keys each worker owns, so each frame goes to one connection.
    let mut by_worker: Vec<Vec<u64>> = vec![Vec::new(); workers];
    let mut key = Vec::new();
    for i in 0..opts.keys {
        make_key(i, opts.shape.key_size, &mut key);
        by_worker[usize::from(client.worker_of(&key))].push(i);
    }
    if opts.preload {
        preload(&mut client, opts)?;
    }
    drop(client);
    let by_worker = Arc::new(by_worker);
    let start = Arc::new(StartLine::new(opts.threads));
    let threads: Vec<_> = (0..opts.threads)
        .map(|t| {
            let opts = opts.clone();
            let addr = addr.clone();
            let by_worker = by_worker.clone();
            let start = start.clone();
            std::thread::spawn(move || client_thread(t, &opts, &addr, &by_worker, &start))
        })
        .collect();
    start.open(gate);
    let mut hist =
        Histogram::<u64>::new_with_bounds(1, LATENCY_NS_MAX, 3).map_err(|e| e.to_string())?;
    let (mut ops, mut checked, mut wrong) = (0u64, 0u64, 0u64);
    let mut seconds = 0f64;
    let mut failure = None;
    for t in threads {
        match t.join() {
            Ok(Ok(r)) => {
                hist.add(&r.hist).map_err(|e| e.to_string())?;
                ops += r.ops;
                checked += r.checked;
                wrong += r.wrong;
                seconds = seconds.max(r.seconds);
            }
            Ok(Err(e)) => failure = failure.or(Some(e)),
            Err(_) => failure = failure.or(Some("client thread panicked".to_string())),
        }
    }
    // The gate's own failure explains the threads' refusal to start.
    start.result()?;
    if let Some(e) = failure {
        return Err(e);
    }
    Ok(BenchResult {
        bench: "kv".into(),
        case: opts.case(),
        system: "fabrickv".into(),
        ops_per_s: ops as f64 / seconds.max(1e-9),
        p50_us: hist.value_at_quantile(0.50) as f64 / 1e3,
        p99_us: hist.value_at_quantile(0.99) as f64 / 1e3,
        ops,
        seconds,
        wrong_values: wrong,
        params: serde_json::json!({
            "threads": opts.threads, "keys": opts.keys, "key_size": opts.shape.key_size,
            "value_size": opts.shape.value_size, "get_percent": opts.shape.get_percent, "batch": opts.shape.batch,
            "in_flight": opts.shape.in_flight, "workers": workers, "transport": transport_of(&addr),
            "checked": checked,
        }),
    })
}

fn transport_of(addr: &str) -> &str {
    addr.split_once("://").map_or("tcp", |(s, _)| s)
}

/// Stores every key of `opts` with its checkable value.
pub fn preload(client: &mut impl Kv, opts: &KvOpts) -> Result<(), String> {
    preload_keys(
        client,
        opts.keys,
        opts.shape.key_size,
        opts.shape.value_size,
    )
}

/// Stores keys `0..keys` (`key_size` bytes each) with their checkable
/// values of `value_size` bytes, a chunk of keys per call.
pub fn preload_keys(
    client: &mut impl Kv,
    keys: u64,
    key_size: usize,
    value_size: usize,
) -> Result<(), String> {
    const PRELOAD_CHUNK_KEYS: u64 = 4096;
    let mut at = 0;
    while at < keys {
        let end = (at + PRELOAD_CHUNK_KEYS).min(keys);
        let items: Vec<(Vec<u8>, Vec<u8>)> = (at..end)
            .map(|i| {
                let mut k = Vec::new();
                make_key(i, key_size, &mut k);
                let mut v = vec![0; value_size];
                fill_value(i, &mut v);
                (k, v)
            })
            .collect();
        client
            .mput(&items, None)
            .map_err(|e| format!("preloading keys: {e}"))?;
        at = end;
    }
    Ok(())
}

struct ThreadResult {
    hist: Histogram<u64>,
    ops: u64,
    /// GETs whose value was checked.
    checked: u64,
    wrong: u64,
    seconds: f64,
}

/// Where client threads wait, connected, for the run's gate to open.
struct StartLine {
    connected: std::sync::Barrier,
    go: std::sync::Barrier,
    gate: std::sync::Mutex<Option<Result<(), String>>>,
}

impl StartLine {
    fn new(threads: usize) -> StartLine {
        StartLine {
            connected: std::sync::Barrier::new(threads + 1),
            go: std::sync::Barrier::new(threads + 1),
            gate: std::sync::Mutex::new(None),
        }
    }

    /// Waits until every thread has connected, passes `gate`, records its
    /// outcome and lets the threads go.
    fn open(&self, gate: &mut dyn FnMut() -> Result<(), String>) {
        self.connected.wait();
        let outcome = gate();
        *self.gate.lock().unwrap_or_else(|p| p.into_inner()) = Some(outcome);
        self.go.wait();
    }

    /// A connected thread's wait for the gate; `Err` when the gate failed.
    fn wait(&self) -> Result<(), String> {
        self.connected.wait();
        self.go.wait();
        self.result()
    }

    fn result(&self) -> Result<(), String> {
        match &*self.gate.lock().unwrap_or_else(|p| p.into_inner()) {
            Some(Ok(())) => Ok(()),
            Some(Err(e)) => Err(e.clone()),
            None => Err("the start gate never opened".into()),
        }
    }
}

fn client_thread(
    t: usize,
    opts: &KvOpts,
    addr: &str,
    by_worker: &[Vec<u64>],
    start_line: &StartLine,
) -> Result<ThreadResult, String> {
    if !opts.client_cpus.is_empty() {
        let id = opts.client_cpus[t % opts.client_cpus.len()];
        core_affinity::set_for_current(core_affinity::CoreId { id });
    }
    // Every thread reaches the start line, connected or not, so that no
    // other thread waits there for ever.
    let connected = Client::connect(addr).map_err(|e| format!("connecting to {addr}: {e}"));
    start_line.wait()?;
    let mut client = connected?;
    let mut load = Load::new(
        by_worker.len(),
        0x5EED ^ t as u64,
        opts.shape,
        client.timeout(),
    );
    let mut hist =
        Histogram::<u64>::new_with_bounds(1, LATENCY_NS_MAX, 3).map_err(|e| e.to_string())?;
    let (mut ops, mut checked, mut wrong) = (0u64, 0u64, 0u64);
    let start = Instant::now();
    let end = start + opts.duration;
    loop {
        let sending = Instant::now() < end;
        if sending {
            load.post(&mut client, by_worker)?;
        }
        let progressed = load.poll(&mut client, |msg, sent| {
            hist.saturating_record(sent.at.elapsed().as_nanos() as u64);
            wrong += check_reply(msg, sent, opts.shape.value_size)?;
            checked += sent.ops.iter().filter(|&&(_, is_get)| is_get).count() as u64;
            ops += sent.ops.len() as u64;
            Ok(())
        })?;
        if !sending && load.is_drained() {
            break;
        }
        load.pause(&mut client, progressed)?;
    }
    Ok(ThreadResult {
        hist,
        ops,
        checked,
        wrong,
        seconds: start.elapsed().as_secs_f64(),
    })
}

/// Checks one reply; returns how many GETs read a wrong value.
fn check_reply(msg: &[u8], sent: &Sent, value_size: usize) -> Result<u64, String> {
    let f = decode_frame(msg).map_err(|e| format!("bad reply: {e}"))?;
    if f.header.request_id != sent.id || f.header.kind != FrameKind::Response {
        return Err(format!(
            "unexpected reply {:?} to request {}",
            f.header, sent.id
        ));
    }
    let results = ResponseIter::new(&f).map_err(|e| format!("bad reply: {e}"))?;
    let mut wrong = 0;
    for (r, &(i, is_get)) in results.zip(&sent.ops) {
        match (r.code(), is_get) {
            (ErrorCode::Ok, true) if check_value(i, value_size, r.value) => {}
            (ErrorCode::Ok, false) => {}
            (code, _) if code != ErrorCode::Ok && code != ErrorCode::NotFound => {
                return Err(format!("server answered {code}"))
            }
            _ => wrong += 1,
        }
    }
    Ok(wrong)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn small() -> KvOpts {
        KvOpts {
            threads: 2,
            keys: 500,
            duration: Duration::from_millis(100),
            ..KvOpts::default()
        }
    }

    #[test]
    fn the_gate_opens_once_every_thread_is_connected() {
        let mut passed = 0;
        let r = run_gated(&small(), &mut || {
            passed += 1;
            Ok(())
        })
        .expect("a run");
        assert_eq!(passed, 1);
        assert!(r.ops > 0);
        assert_eq!(r.wrong_values, 0);
        assert!(r.params["checked"].as_u64().expect("checked") > 0);
    }

    #[test]
    fn a_failing_gate_stops_the_run() {
        let e = run_gated(&small(), &mut || Err("barrier timed out".into()))
            .expect_err("the gate failed");
        assert_eq!(e, "barrier timed out");
    }
}
