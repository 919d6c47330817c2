//! `fabrickv bench ps`: PetPS's benchmark client against FabricKV's
//! embedding tables.
//!
//! Each client thread owns a [`PsClient`] (threads spread over the
//! server's workers), keeps `async_req` pulls of `batch_read_count` keys
//! outstanding, and checks every value it reads: the table is loaded with
//! a pattern of which every element is a function of its key and index
//! ([`pattern_bits`]), so a wrong, stale, misplaced or missing vector is
//! caught with one comparison per element. A row is PASS only when values
//! were checked and none was wrong.
//!
//! Keys are uniform over `1..=key_space` or Zipf-distributed (PetPS uses
//! 0.99) with the hottest keys scattered over the key space.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use fabrickv_client::{PsClient, PullId, TableDesc, TableSpec};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use rand_distr::{Distribution, Zipf};

use crate::peers;

/// Name of the table the benchmark loads.
pub const BENCH_TABLE: &str = "bench";

/// Per-call timeout of the benchmark's clients.
pub const BENCH_TIMEOUT: Duration = Duration::from_secs(10);

/// Bytes of pool the spawned server gets per key, beyond the vector
/// (item header, 12-byte item key, slab rounding of up to a quarter).
pub const POOL_OVERHEAD_PER_KEY_BYTES: u64 = 96;

/// Pool the spawned server gets on top of the keys, in bytes.
pub const POOL_SLACK_BYTES: u64 = 64 << 20;

/// How the benchmark picks keys.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum KeyDist {
    /// Uniform over the key space.
    Uniform,
    /// Zipf with this exponent (PetPS: 0.99).
    Zipf(f64),
}

impl KeyDist {
    /// Parses `uniform` or `zipf` / `zipf:0.99`.
    pub fn parse(s: &str) -> Result<KeyDist, String> {
        match s.split_once(':') {
            None if s == "uniform" => Ok(KeyDist::Uniform),
            None if s == "zipf" => Ok(KeyDist::Zipf(0.99)),
            Some(("zipf", e)) => e
                .parse()
                .ok()
                .filter(|x: &f64| *x > 0.0 && x.is_finite())
                .map(KeyDist::Zipf)
                .ok_or_else(|| format!("bad zipf exponent {e:?}")),
            _ => Err(format!(
                "unknown key distribution {s:?}: uniform, zipf or zipf:S"
            )),
        }
    }

    /// The name as parsed.
    pub fn name(&self) -> String {
        match self {
            KeyDist::Uniform => "uniform".into(),
            KeyDist::Zipf(s) => format!("zipf:{s}"),
        }
    }
}

/// One load run.
#[derive(Debug, Clone)]
pub struct LoadOpts {
    /// Client threads.
    pub threads: usize,
    /// Keys per pull.
    pub batch: usize,
    /// Pulls outstanding per thread.
    pub async_req: usize,
    /// Keys `1..=key_space` are loaded.
    pub key_space: u64,
    /// Vector dimension (value size / 4).
    pub dim: u32,
    /// Key distribution.
    pub dist: KeyDist,
    /// Measured time.
    pub duration: Duration,
    /// Print PetPS's throughput line this often (`None`: never).
    pub report_every: Option<Duration>,
    /// CPUs client threads are pinned to, round robin.
    pub client_cpus: Vec<usize>,
    /// Check every pulled vector (the default). Off only to time the bare
    /// client (as the Python comparison does); rows then cannot PASS.
    pub verify: bool,
}

/// What one load run measured.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LoadResult {
    /// Pulls completed in the measured time.
    pub requests: u64,
    /// Keys pulled.
    pub keys: u64,
    /// Seconds measured.
    pub seconds: f64,
    /// Values (vectors) checked.
    pub checked: u64,
    /// Vectors that were wrong or missing.
    pub wrong: u64,
    /// Whether pulls landed one-sided.
    pub one_sided: bool,
}

impl LoadResult {
    /// Millions of pulls per second.
    pub fn mreq_s(&self) -> f64 {
        self.requests as f64 / self.seconds.max(1e-9) / 1e6
    }

    /// Millions of keys per second.
    pub fn mkv_s(&self) -> f64 {
        self.keys as f64 / self.seconds.max(1e-9) / 1e6
    }
}

/// The element `i` of key `key`'s benchmark vector, as bits: a hash of the
/// key mixed with the index, kept a finite float.
#[inline]
pub fn pattern_bits(key: u64, i: usize) -> u32 {
    let h = fabrickv_wire::ps::splitmix64(key) as u32;
    (h ^ (i as u32).wrapping_mul(0x9E37_79B9)) & 0x3FFF_FFFF
}

/// Fills `out` with `key`'s benchmark vector.
pub fn pattern(key: u64, out: &mut [f32]) {
    for (i, o) in out.iter_mut().enumerate() {
        *o = f32::from_bits(pattern_bits(key, i));
    }
}

/// Whether `bytes` (little-endian f32s) are `key`'s benchmark vector.
#[inline]
fn pattern_ok(key: u64, bytes: &[u8]) -> bool {
    let h = fabrickv_wire::ps::splitmix64(key) as u32;
    let want = |i: usize| (h ^ (i as u32).wrapping_mul(0x9E37_79B9)) & 0x3FFF_FFFF;
    // OR of the differences, with no early exit, so the loop vectorizes:
    // the check must cost less than the pull it checks.
    let diff = match bytemuck::try_cast_slice::<u8, u32>(bytes) {
        Ok(words) => words
            .iter()
            .enumerate()
            .fold(0, |acc, (i, w)| acc | (u32::from_le(*w) ^ want(i))),
        Err(_) => bytes.chunks_exact(4).enumerate().fold(0, |acc, (i, c)| {
            acc | (u32::from_le_bytes([c[0], c[1], c[2], c[3]]) ^ want(i))
        }),
    };
    diff == 0 && bytes.len().is_multiple_of(4)
}

/// Creates the benchmark table and loads keys `1..=key_space` with the
/// pattern, `progress` told the keys done.
pub fn load_table(
    addr: &str,
    key_space: u64,
    dim: u32,
    mut progress: impl FnMut(u64),
) -> Result<TableDesc, String> {
    let mut c = PsClient::connect_with_timeout(addr, BENCH_TIMEOUT)
        .map_err(|e| format!("cannot connect to {addr}: {e}"))?;
    let t = c
        .create_table(&TableSpec::new(BENCH_TABLE, dim))
        .map_err(|e| e.to_string())?;
    fabrickv_client::ps::put_range(&mut c, &t, 1..=key_space, pattern, &mut progress)
        .map_err(|e| e.to_string())?;
    Ok(t)
}

/// Key picker of one thread.
struct Keys {
    rng: SmallRng,
    zipf: Option<Zipf<f64>>,
    space: u64,
}

impl Keys {
    fn new(seed: u64, space: u64, dist: KeyDist) -> Result<Keys, String> {
        let zipf = match dist {
            KeyDist::Uniform => None,
            KeyDist::Zipf(s) => Some(Zipf::new(space, s).map_err(|e| e.to_string())?),
        };
        Ok(Keys {
            rng: SmallRng::seed_from_u64(seed),
            zipf,
            space,
        })
    }

    #[inline]
    fn next(&mut self) -> u64 {
        match &self.zipf {
            None => self.rng.gen_range(1..=self.space),
            Some(z) => {
                // Rank 1 is the hottest; scatter ranks over the key space so
                // hot keys do not share index buckets.
                let rank = z.sample(&mut self.rng) as u64;
                (fabrickv_wire::ps::splitmix64(rank) % self.space) + 1
            }
        }
    }
}

/// Counters of one thread, on their own cache line.
#[repr(align(128))]
#[derive(Default)]
struct ThreadCounters {
    requests: AtomicU64,
    keys: AtomicU64,
    checked: AtomicU64,
    wrong: AtomicU64,
}

/// Runs the load against a loaded table at `addr`.
pub fn run_load(addr: &str, o: &LoadOpts) -> Result<LoadResult, String> {
    run_load_gated(addr, o, &mut || Ok(()))
}

/// Runs the load with a start gate: once every thread has connected and
/// opened the table, `gate` is called (a multi-process sweep meets its
/// barrier there) while the threads warm up, and the measured interval
/// starts when it returns. A gate that fails stops the run.
pub fn run_load_gated(
    addr: &str,
    o: &LoadOpts,
    gate: &mut dyn FnMut() -> Result<(), String>,
) -> Result<LoadResult, String> {
    if o.threads == 0 || o.batch == 0 || o.async_req == 0 || o.key_space == 0 {
        return Err("threads, batch, async requests and key space must be at least 1".into());
    }
    // Thread t on worker t (`worker_of_thread`), pinned to the t-th client CPU.
    let workers = fabrickv_client::server_workers(addr, BENCH_TIMEOUT)
        .map_err(|e| format!("cannot connect to {addr}: {e}"))?;
    let counters: Arc<Vec<ThreadCounters>> =
        Arc::new((0..o.threads).map(|_| ThreadCounters::default()).collect());
    let stop = Arc::new(AtomicBool::new(false));
    let ready = Arc::new(Barrier::new(o.threads + 1));
    let one_sided = Arc::new(AtomicBool::new(false));
    let mut handles = Vec::with_capacity(o.threads);
    for tid in 0..o.threads {
        let (addr, o2) = (addr.to_string(), o.clone());
        let (counters, stop, ready, one_sided) = (
            counters.clone(),
            stop.clone(),
            ready.clone(),
            one_sided.clone(),
        );
        handles.push(std::thread::spawn(move || -> Result<(), String> {
            if !o2.client_cpus.is_empty() {
                crate::pin_current_thread(o2.client_cpus[tid % o2.client_cpus.len()]);
            }
            let setup = (|| {
                let worker = crate::worker_of_thread(tid, workers);
                let mut c = PsClient::connect_worker(&addr, worker, BENCH_TIMEOUT)
                    .map_err(|e| format!("cannot connect to {addr}: {e}"))?;
                let t = c.open_table(BENCH_TABLE).map_err(|e| e.to_string())?;
                one_sided.store(c.one_sided(), Ordering::Relaxed);
                Ok::<_, String>((c, t))
            })();
            ready.wait();
            let (mut c, t) = setup?;
            let mut keys = Keys::new(0xB0B + tid as u64, o2.key_space, o2.dist)?;
            let vb = t.spec.dim as usize * 4;
            let me = &counters[tid];
            let mut outstanding: VecDeque<(PullId, Vec<u64>)> = VecDeque::new();
            let mut spare: Vec<Vec<u64>> = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                while outstanding.len() < o2.async_req {
                    let mut b = spare.pop().unwrap_or_default();
                    b.clear();
                    b.extend((0..o2.batch).map(|_| keys.next()));
                    let id = c.pull_async(&t, &b).map_err(|e| e.to_string())?;
                    outstanding.push_back((id, b));
                }
                let Some((id, b)) = outstanding.pop_front() else {
                    break;
                };
                let verify = o2.verify;
                let wrong = c
                    .wait_view(id, |bytes, found| {
                        if !verify {
                            return 0;
                        }
                        b.iter()
                            .enumerate()
                            .filter(|(i, k)| {
                                !found[*i] || !pattern_ok(**k, &bytes[i * vb..(i + 1) * vb])
                            })
                            .count() as u64
                    })
                    .map_err(|e| e.to_string())?;
                me.requests.fetch_add(1, Ordering::Relaxed);
                me.keys.fetch_add(b.len() as u64, Ordering::Relaxed);
                if verify {
                    me.checked.fetch_add(b.len() as u64, Ordering::Relaxed);
                }
                me.wrong.fetch_add(wrong, Ordering::Relaxed);
                spare.push(b);
            }
            for (id, _) in outstanding {
                let _ = c.cancel(id);
            }
            Ok(())
        }));
    }
    ready.wait();
    if let Err(e) = gate() {
        stop.store(true, Ordering::Relaxed);
        for h in handles {
            let _ = h.join();
        }
        return Err(e);
    }
    let sum = |f: fn(&ThreadCounters) -> &AtomicU64| -> u64 {
        counters.iter().map(|c| f(c).load(Ordering::Relaxed)).sum()
    };
    // Warm-up excluded: measure from here.
    let (r0, k0, c0, w0) = (
        sum(|c| &c.requests),
        sum(|c| &c.keys),
        sum(|c| &c.checked),
        sum(|c| &c.wrong),
    );
    let start = Instant::now();
    let mut last = (start, r0, k0);
    loop {
        let left = o.duration.saturating_sub(start.elapsed());
        if left.is_zero() || handles.iter().all(|h| h.is_finished()) {
            break;
        }
        let step = o.report_every.map_or(left, |e| e.min(left));
        std::thread::sleep(step);
        if o.report_every.is_some() {
            let (r, k) = (sum(|c| &c.requests), sum(|c| &c.keys));
            let dt = last.0.elapsed().as_secs_f64().max(1e-9);
            println!(
                "{}",
                crate::ps_report::throughput_line(
                    (r - last.1) as f64 / dt / 1e6,
                    (k - last.2) as f64 / dt / 1e6
                )
            );
            last = (Instant::now(), r, k);
        }
    }
    let seconds = start.elapsed().as_secs_f64();
    let result = LoadResult {
        requests: sum(|c| &c.requests) - r0,
        keys: sum(|c| &c.keys) - k0,
        seconds,
        checked: sum(|c| &c.checked) - c0,
        wrong: sum(|c| &c.wrong) - w0,
        one_sided: one_sided.load(Ordering::Relaxed),
    };
    stop.store(true, Ordering::Relaxed);
    for h in handles {
        h.join()
            .map_err(|_| "a client thread panicked".to_string())??;
    }
    Ok(result)
}

/// A FabricKV server started for the ps benchmark.
pub type PsServer = peers::ServerProcess;

/// Starts `fabrickv serve` (this binary) pinned to `cpus` (worker i to
/// the i-th CPU of the list, round robin), listening on
/// `transport` (tcp, shm, or fabric with `provider`), with an embedding
/// pool sized for `key_space` vectors of `dim` floats.
pub fn spawn_server(
    transport: &str,
    provider: &str,
    cpus: Option<&str>,
    workers: usize,
    key_space: u64,
    dim: u32,
) -> Result<PsServer, String> {
    let addr = peers::fabrickv_listen_addr(transport, provider, "ps")?;
    let pool =
        key_space * (u64::from(dim) * 4 + POOL_OVERHEAD_PER_KEY_BYTES) * 5 / 4 + POOL_SLACK_BYTES;
    let gb = pool as f64 / (1u64 << 30) as f64;
    let mut cmd = peers::fabrickv_serve(cpus, &addr, workers)?;
    // No gRPC: the default address may be another server's, and a taken
    // address is a start-up error.
    cmd.args(["--memory", "64MB", "--log-level", "warn", "--grpc", "off"])
        .args(["--dram-pool-gb", &format!("{gb:.4}")]);
    let probe = addr.clone();
    let child = peers::spawn_until(cmd, "fabrickv", || {
        PsClient::connect_with_timeout(&probe, Duration::from_millis(200)).is_ok()
    })?;
    Ok(PsServer { child, addr })
}

/// The JSON line of one load run.
pub fn json(label: &str, o: &LoadOpts, r: &LoadResult, extra: serde_json::Value) -> String {
    let mut v = serde_json::json!({
        "bench": "ps",
        "case": label,
        "thread_num": o.threads,
        "batch_read_count": o.batch,
        "async_req": o.async_req,
        "key_space": o.key_space,
        "value_size": o.dim * 4,
        "dist": o.dist.name(),
        "seconds": r.seconds,
        "requests": r.requests,
        "keys": r.keys,
        "mreq_s": r.mreq_s(),
        "mkv_s": r.mkv_s(),
        "value_mb_s": r.keys as f64 * f64::from(o.dim) * 4.0 / r.seconds.max(1e-9) / 1e6,
        "checked": r.checked,
        "wrong": r.wrong,
        "one_sided": r.one_sided,
    });
    if let (Some(m), serde_json::Value::Object(e)) = (v.as_object_mut(), extra) {
        m.extend(e);
    }
    v.to_string()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn the_pattern_check_catches_any_changed_element() {
        let mut v = vec![0f32; 128];
        pattern(77, &mut v);
        let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
        assert!(pattern_ok(77, &bytes));
        assert!(!pattern_ok(78, &bytes), "another key's vector");
        let mut bad = bytes.clone();
        bad[127 * 4] ^= 1;
        assert!(!pattern_ok(77, &bad), "one flipped bit");
        assert!(v.iter().all(|x| x.is_finite()));
    }

    #[test]
    fn key_distributions_stay_in_the_key_space() {
        for d in [KeyDist::Uniform, KeyDist::Zipf(0.99)] {
            let mut k = Keys::new(1, 1000, d).unwrap();
            for _ in 0..10_000 {
                let x = k.next();
                assert!((1..=1000).contains(&x), "{x}");
            }
        }
        assert_eq!(KeyDist::parse("zipf").unwrap(), KeyDist::Zipf(0.99));
        assert!(KeyDist::parse("normal").is_err());
    }
}
