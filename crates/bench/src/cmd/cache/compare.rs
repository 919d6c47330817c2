//! `fabrickv bench cache --compare`: redis-server's GETs of the same keys
//! and values, one raw TCP stream and (shm, fabric) single-thread memcpy,
//! measured beside FabricKV's read phase, in `--rounds` alternating
//! rounds; the comparison table and the targets.

use std::time::Duration;

use serde_json::{json, Value};

use super::{in_flight, CacheArgs, Run};
use crate::cache::{self, format_bytes, mb_per_s, LatencyStats, ReadOpts, ReadResult};
use crate::cmd::cpu_list;
use crate::{limits, median_by, ratio};

/// How long each physical limit of `--compare` is measured: long enough
/// for a steady rate (each also runs a short warm-up first), short next
/// to the reads it is held against.
const LIMIT_DURATION: Duration = Duration::from_secs(1);

/// Over tcp, read bytes/s must reach this share of one raw TCP stream.
const TCP_VS_RAW_TARGET: f64 = 0.9;
/// Over tcp, read bytes/s must reach this multiple of Redis GET's.
const TCP_VS_REDIS_TARGET: f64 = 1.0;
/// Over shm or fabric, read bytes/s must reach this multiple of Redis GET's.
const SHM_VS_REDIS_TARGET: f64 = 4.0;

/// Redis GET and the physical limits beside FabricKV's read phase, the
/// table, and the targets.
#[allow(clippy::too_many_arguments)]
pub(super) fn compare(
    a: &CacheArgs,
    r: &Run,
    o: &ReadOpts,
    keys: &[Vec<u8>],
    ttl: Option<Duration>,
    one_sided: bool,
    ours: &ReadResult,
    mut ours_again: impl FnMut() -> Result<ReadResult, String>,
) -> Result<(), String> {
    let client_cpu = o.client_cpus.first().copied();
    let (server_cpu, raw_client_cpu) =
        limits::limit_cpus(&cpu_list(&a.server_cpus)?, &o.client_cpus);
    println!("\n=== Comparison ===");
    println!(
        "redis-server GET: same keys, values, TTL, {} threads x {} pass(es){}, each value checked...",
        o.threads,
        o.passes,
        in_flight(o.depth)
    );
    let redis_server = cache::RedisReads::start(o, keys, ttl, a.server_cpus.as_deref())?;
    let redis = cache::RedisPeer {
        write: redis_server.write,
        read: redis_server.read(o, keys)?,
    };
    println!(
        "{}, {:.1} s...",
        if r.transport == "tcp" {
            "raw TCP stream"
        } else {
            "raw TCP stream and single-thread memcpy, each"
        },
        LIMIT_DURATION.as_secs_f64()
    );
    let limits_now = || -> Result<(limits::TcpRate, Option<limits::MemcpyRate>), String> {
        let raw = limits::tcp_stream(LIMIT_DURATION, server_cpu, raw_client_cpu)?;
        let memcpy = if r.transport == "tcp" {
            None
        } else {
            Some(limits::memcpy_bandwidth(
                r.value_size,
                limits::MEMCPY_WORKING_SET_BYTES_DEFAULT,
                LIMIT_DURATION,
                client_cpu,
            )?)
        };
        Ok((raw, memcpy))
    };
    let (raw, memcpy) = limits_now()?;

    let vs = r.value_size;
    let ours_bps = ours.bytes_per_s(vs);
    let redis_bps = redis.read.bytes_per_s(vs);
    let ours_lat = LatencyStats::of(&ours.latency);
    let redis_lat = LatencyStats::of(&redis.read.latency);
    let mut rounds = vec![Round {
        ours: ours_bps,
        redis: redis_bps,
        raw: raw.bytes_per_s,
        memcpy: memcpy.as_ref().map(|m| m.bytes_per_s),
    }];
    if a.rounds > 1 {
        println!(
            "{} more alternating rounds: fabrickv, redis GET, the limits...",
            a.rounds - 1
        );
    }
    for _ in 1..a.rounds {
        let ours = ours_again()?.bytes_per_s(vs);
        let redis = redis_server.read(o, keys)?.bytes_per_s(vs);
        let (raw, memcpy) = limits_now()?;
        rounds.push(Round {
            ours,
            redis,
            raw: raw.bytes_per_s,
            memcpy: memcpy.map(|m| m.bytes_per_s),
        });
    }
    drop(redis_server);
    // `rounds` holds at least the first round, so each median exists.
    let vs_redis = median_by(&rounds, |x| Some(ratio(x.ours, x.redis))).unwrap_or(0.0);
    let vs_raw = median_by(&rounds, |x| Some(ratio(x.ours, x.raw))).unwrap_or(0.0);
    let vs_memcpy = median_by(&rounds, |x| x.memcpy.map(|m| ratio(x.ours, m)));
    let mode = if one_sided {
        "one-sided"
    } else {
        "inline chunks"
    };

    println!(
        "\n{} keys x {}, {} readers x {} pass(es){}; MB = 2^20 bytes; latencies of GETs under load",
        r.num_keys,
        format_bytes(vs as f64),
        o.threads,
        o.passes,
        in_flight(o.depth)
    );
    println!("| case | ops/s | MB/s | p50 us | p99 us | ratio |");
    println!("|---|---|---|---|---|---|");
    println!(
        "| fabrickv {} ({mode}) | {:.0} | {:.2} | {:.1} | {:.1} | - |",
        r.transport,
        ours.ops_per_s(),
        mb_per_s(ours_bps),
        ours_lat.p50_us,
        ours_lat.p99_us
    );
    println!(
        "| redis GET | {:.0} | {:.2} | {:.1} | {:.1} | fabrickv/redis {:.2}x |",
        redis.read.ops_per_s(),
        mb_per_s(redis_bps),
        redis_lat.p50_us,
        redis_lat.p99_us,
        ratio(ours_bps, redis_bps)
    );
    println!(
        "| raw tcp stream | - | {:.2} | - | - | fabrickv/raw-tcp {:.2}x |",
        mb_per_s(raw.bytes_per_s),
        ratio(ours_bps, raw.bytes_per_s)
    );
    if let Some(m) = &memcpy {
        let x = ratio(ours_bps, m.bytes_per_s);
        println!(
            "| memcpy {} chunks | - | {:.2} | - | - | fabrickv/memcpy {x:.2}x |",
            format_bytes(vs as f64),
            mb_per_s(m.bytes_per_s)
        );
    }

    let judged = if rounds.len() > 1 {
        print!("{}", rounds_table(&rounds));
        format!(", median of {} rounds", rounds.len())
    } else {
        String::new()
    };
    let verdict = |ok: bool| if ok { "MET" } else { "MISSED" };
    let (target, met) = if r.transport == "tcp" {
        let raw_ok = vs_raw >= TCP_VS_RAW_TARGET;
        let redis_ok = vs_redis >= TCP_VS_REDIS_TARGET;
        println!(
            "Target (tcp{judged}): read bytes/s >= {TCP_VS_RAW_TARGET:.1}x raw TCP stream ({vs_raw:.2}x: {}) and >= {TCP_VS_REDIS_TARGET:.1}x Redis GET ({vs_redis:.2}x: {}): {}",
            verdict(raw_ok),
            verdict(redis_ok),
            verdict(raw_ok && redis_ok)
        );
        (
            format!(
                ">= {TCP_VS_RAW_TARGET:.1}x raw tcp stream and >= {TCP_VS_REDIS_TARGET:.1}x redis"
            ),
            raw_ok && redis_ok,
        )
    } else {
        let ok = vs_redis >= SHM_VS_REDIS_TARGET;
        println!(
            "Target ({}{judged}): read bytes/s >= {SHM_VS_REDIS_TARGET:.1}x Redis GET ({vs_redis:.2}x): {}",
            r.transport,
            verdict(ok)
        );
        println!(
            "p99 under load: fabrickv {} {:.1} us vs Redis {:.1} us ({:.2}x of Redis's)",
            r.transport,
            ours_lat.p99_us,
            redis_lat.p99_us,
            ratio(ours_lat.p99_us, redis_lat.p99_us)
        );
        (format!(">= {SHM_VS_REDIS_TARGET:.1}x redis"), ok)
    };

    if r.json {
        let stats = serde_json::to_value(redis_lat).unwrap_or(Value::Null);
        let mut peer = json!({
            "seconds": redis.read.seconds,
            "ops": redis.read.gets,
            "ops_per_s": redis.read.ops_per_s(),
            "bytes_per_s": redis_bps,
            "read_passes": o.passes,
            "checked": redis.read.gets + redis.read.warmup_gets,
            "write_seconds": redis.write.seconds,
            "write_ops_per_s": redis.write.ops_per_s(),
            "ttl_s": a.ttl,
            "server_cpus": a.server_cpus,
            "client_cpus": a.client_cpus,
        });
        if let (Some(m), Value::Object(s)) = (peer.as_object_mut(), stats) {
            m.extend(s);
        }
        println!("{}", r.line("peer.redis_get", "read", peer));
        println!("{}", raw.json());
        if let Some(m) = &memcpy {
            println!("{}", m.json());
        }
        println!(
            "{}",
            r.line(
                "cache",
                "compare",
                json!({
                    "one_sided": one_sided,
                    "read_passes": o.passes,
                    "fabrickv_bytes_per_s": ours_bps,
                    "fabrickv_ops_per_s": ours.ops_per_s(),
                    "fabrickv_p50_us": ours_lat.p50_us,
                    "fabrickv_p99_us": ours_lat.p99_us,
                    "redis_bytes_per_s": redis_bps,
                    "redis_ops_per_s": redis.read.ops_per_s(),
                    "redis_p50_us": redis_lat.p50_us,
                    "redis_p99_us": redis_lat.p99_us,
                    "raw_tcp_bytes_per_s": raw.bytes_per_s,
                    "memcpy_bytes_per_s": memcpy.as_ref().map(|m| m.bytes_per_s),
                    "vs_redis": vs_redis,
                    "vs_raw_tcp": vs_raw,
                    "vs_memcpy": vs_memcpy,
                    "p99_vs_redis": ratio(ours_lat.p99_us, redis_lat.p99_us),
                    "rounds": rounds.len(),
                    "rounds_bytes_per_s": rounds
                        .iter()
                        .map(|x| json!({
                            "fabrickv": x.ours,
                            "redis": x.redis,
                            "raw_tcp": x.raw,
                            "memcpy": x.memcpy,
                        }))
                        .collect::<Vec<_>>(),
                    "target": target,
                    "target_met": met,
                })
            )
        );
    }
    Ok(())
}

/// Bytes/s of one alternating round of `--compare --rounds`.
#[derive(Debug, Clone, Copy)]
struct Round {
    ours: f64,
    redis: f64,
    /// One raw TCP stream.
    raw: f64,
    /// Single-thread memcpy (shm and fabric only).
    memcpy: Option<f64>,
}

/// Every round's figures and ratios, then their medians (the ratios the
/// targets are judged by).
fn rounds_table(rounds: &[Round]) -> String {
    let mut t = String::from(
        "\n| round | fabrickv MB/s | redis MB/s | raw tcp MB/s | memcpy MB/s | fabrickv/redis | fabrickv/raw-tcp | fabrickv/memcpy |\n|---|---|---|---|---|---|---|---|\n",
    );
    let mb = |x: Option<f64>| x.map_or("-".to_string(), |v| format!("{:.2}", mb_per_s(v)));
    let x = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.2}x"));
    for (i, r) in rounds.iter().enumerate() {
        t += &format!(
            "| {} | {} | {} | {} | {} | {} | {} | {} |\n",
            i + 1,
            mb(Some(r.ours)),
            mb(Some(r.redis)),
            mb(Some(r.raw)),
            mb(r.memcpy),
            x(Some(ratio(r.ours, r.redis))),
            x(Some(ratio(r.ours, r.raw))),
            x(r.memcpy.map(|m| ratio(r.ours, m))),
        );
    }
    let med = |f: &dyn Fn(&Round) -> Option<f64>| median_by(rounds, f);
    t += &format!(
        "| median | {} | {} | {} | {} | {} | {} | {} |\n",
        mb(med(&|r| Some(r.ours))),
        mb(med(&|r| Some(r.redis))),
        mb(med(&|r| Some(r.raw))),
        mb(med(&|r| r.memcpy)),
        x(med(&|r| Some(ratio(r.ours, r.redis)))),
        x(med(&|r| Some(ratio(r.ours, r.raw)))),
        x(med(&|r| r.memcpy.map(|m| ratio(r.ours, m)))),
    );
    t
}
