//! `fabrickv bench auth`: what the cluster secret costs a client. Two
//! servers in this process on each transport, one asking for a secret
//! and one not (the peer), measured in alternation within each round so
//! that drift of a noisy machine falls on both alike:
//!
//! - **connect**: a new client connection, its handshake (with the
//!   challenge and proof where there is a secret), the HELLO, and the
//!   first GET, timed as one;
//! - **get**: GETs on one long-lived connection, where authentication
//!   should cost nothing, as only the handshake pays.
//!
//! Printed as a table of p50/p99 for both servers and their ratio, and
//! one JSON line per result.

use std::time::{Duration, Instant};

use clap::Args;
use fabrickv_auth::Secret;
use fabrickv_client::{Client, Kv};
use fabrickv_server::{Mode, Server, ServerConfig, ServerHandle};
use hdrhistogram::Histogram;

use crate::report::{latency_histogram, micros, print_table, BenchResult, LatencySummary};

#[derive(Args)]
pub struct AuthArgs {
    /// Transports to measure, comma separated: tcp, shm.
    #[arg(long, default_value = "tcp,shm")]
    transports: String,
    /// New connections timed (connect, handshake, HELLO, first GET) per
    /// server and round.
    #[arg(long, default_value_t = 200)]
    connects: usize,
    /// GETs timed on one long-lived connection per server and round.
    #[arg(long, default_value_t = 20_000)]
    gets: usize,
    /// Rounds; the two servers alternate within each.
    #[arg(long, default_value_t = 5)]
    rounds: usize,
    /// Print one JSON object per result as well.
    #[arg(long)]
    json: bool,
}

/// Bytes of the value every GET reads.
const VALUE_BYTES: usize = 64;
/// How long one client call may take before the run fails.
const CALL_TIMEOUT: Duration = Duration::from_secs(5);
const KEY: &[u8] = b"bench:auth";

/// The secret of the secured server (this process's clients prove it).
const SECRET: &[u8] = b"the secret of fabrickv bench auth";

/// One server of the pair, with what was measured against it.
struct Side {
    secured: bool,
    handle: ServerHandle,
    connect: Histogram<u64>,
    get: Histogram<u64>,
}

fn listen_addr(transport: &str, n: usize) -> Result<String, String> {
    match transport {
        "tcp" => Ok("tcp://127.0.0.1:0".into()),
        "shm" => Ok(format!("shm://fkv-bench-auth-{}-{n}", std::process::id())),
        t => Err(format!("unknown transport {t:?}: expected tcp or shm")),
    }
}

fn start(transport: &str, n: usize, secret: Option<Secret>) -> Result<Side, String> {
    let handle = Server::start(&ServerConfig {
        listen: listen_addr(transport, n)?,
        workers: Some(1),
        mode: Mode::Store,
        memory_bytes: 64 << 20,
        log_level: "warn".into(),
        auth: secret.clone(),
        ..ServerConfig::default()
    })
    .map_err(|e| e.to_string())?;
    let mut c =
        Client::connect_with_timeout(handle.addr(), CALL_TIMEOUT).map_err(|e| e.to_string())?;
    c.put(KEY, &[7u8; VALUE_BYTES]).map_err(|e| e.to_string())?;
    Ok(Side {
        secured: secret.is_some(),
        handle,
        connect: latency_histogram()?,
        get: latency_histogram()?,
    })
}

/// One round against `side`: `connects` fresh connections, then `gets`
/// GETs on one.
fn round(side: &mut Side, connects: usize, gets: usize) -> Result<(), String> {
    let addr = side.handle.addr().to_string();
    let err = |e: fabrickv_client::ClientError| format!("{addr}: {e}");
    for _ in 0..connects {
        let t = Instant::now();
        let mut c = Client::connect_with_timeout(&addr, CALL_TIMEOUT).map_err(err)?;
        let v = c.get(KEY).map_err(err)?;
        let ns = t.elapsed().as_nanos() as u64;
        if v.as_deref().map(<[u8]>::len) != Some(VALUE_BYTES) {
            return Err(format!("{addr}: the first GET read {v:?}"));
        }
        side.connect.saturating_record(ns.max(1));
    }
    let mut c = Client::connect_with_timeout(&addr, CALL_TIMEOUT).map_err(err)?;
    for _ in 0..gets {
        let t = Instant::now();
        let v = c.get(KEY).map_err(err)?;
        side.get
            .saturating_record((t.elapsed().as_nanos() as u64).max(1));
        if v.is_none() {
            return Err(format!("{addr}: a GET found nothing"));
        }
    }
    Ok(())
}

fn result(
    transport: &str,
    what: &str,
    side: &Side,
    h: &Histogram<u64>,
    args: &AuthArgs,
) -> BenchResult {
    let s = LatencySummary::from_histogram(h, 0.0);
    BenchResult {
        bench: "auth".into(),
        case: format!("{what} {transport}"),
        system: if side.secured {
            "fabrickv"
        } else {
            "fabrickv-no-secret"
        }
        .into(),
        ops_per_s: if s.ave_us > 0.0 { 1e6 / s.ave_us } else { 0.0 },
        p50_us: s.p50_us,
        p99_us: s.p99_us,
        ops: h.len(),
        seconds: h.mean() * h.len() as f64 / 1e9,
        wrong_values: 0,
        params: serde_json::json!({
            "secret": side.secured,
            "rounds": args.rounds,
            "connects": args.connects,
            "gets": args.gets,
            "value_bytes": VALUE_BYTES,
        }),
    }
}

/// Runs the benchmark; see the module docs.
pub fn run(args: AuthArgs) -> Result<(), String> {
    if args.rounds == 0 || args.connects == 0 || args.gets == 0 {
        return Err("--rounds, --connects and --gets must be at least 1".into());
    }
    let secret = Secret::from_bytes(SECRET, "bench").map_err(|e| e.to_string())?;
    // Every client of this process proves it; the open server never asks.
    fabrickv_auth::set_client_secret(Some(secret.clone()));
    let mut rows = Vec::new();
    let mut results = Vec::new();
    for (n, transport) in args.transports.split(',').map(str::trim).enumerate() {
        let mut sides = [
            start(transport, 2 * n, None)?,
            start(transport, 2 * n + 1, Some(secret.clone()))?,
        ];
        for r in 0..args.rounds {
            // Alternate which goes first, so neither always runs warm.
            let order = if r % 2 == 0 { [0, 1] } else { [1, 0] };
            for i in order {
                round(&mut sides[i], args.connects, args.gets)?;
            }
        }
        for (what, pick) in [
            (
                "connect+get",
                (|s: &Side| &s.connect) as fn(&Side) -> &Histogram<u64>,
            ),
            ("get", |s: &Side| &s.get),
        ] {
            let open = result(transport, what, &sides[0], pick(&sides[0]), &args);
            let secured = result(transport, what, &sides[1], pick(&sides[1]), &args);
            rows.push(vec![
                transport.to_string(),
                what.to_string(),
                micros(open.p50_us),
                micros(open.p99_us),
                micros(secured.p50_us),
                micros(secured.p99_us),
                format!("{:.3}x", secured.p50_us / open.p50_us.max(1e-9)),
            ]);
            results.push(open);
            results.push(secured);
        }
        for s in sides {
            s.handle.shutdown();
        }
    }
    fabrickv_auth::clear_client_secret();
    print_table(
        &[
            "transport",
            "timed",
            "no secret p50",
            "p99",
            "secret p50",
            "p99",
            "secret/none p50",
        ],
        &rows,
    );
    if args.json {
        for r in &results {
            println!("{}", r.json());
        }
    }
    Ok(())
}
