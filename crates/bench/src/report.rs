//! Results: box tables in the style of the benchmarks FabricKV's follow
//! (HERD's, PetPS's, kv-bench's and the RPC framework benchmark's) and JSON
//! lines.

use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};

use crate::cache::stats::LatencyStats;

/// One measured result. `system` is `fabrickv`, or the peer or physical
/// limit measured in the same run (`redis`, `memcached`, `tcp-pingpong`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct BenchResult {
    /// Which benchmark (`kv`, `rpc`, ...).
    pub bench: String,
    /// Which workload within it (`get b16`, ...).
    pub case: String,
    /// What was measured.
    pub system: String,
    /// Operations (requests, or keys for batched reads) per second.
    pub ops_per_s: f64,
    /// Median latency of one request frame, microseconds.
    pub p50_us: f64,
    /// 99th percentile latency of one request frame, microseconds.
    pub p99_us: f64,
    /// Operations completed in the measured interval.
    pub ops: u64,
    /// Length of the measured interval, seconds.
    pub seconds: f64,
    /// Reads whose value did not match what was written (must be 0).
    pub wrong_values: u64,
    /// How the case was configured, for reproduction.
    pub params: serde_json::Value,
}

impl BenchResult {
    /// The JSON line for this result.
    pub fn json(&self) -> String {
        serde_json::to_string(self).unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}"))
    }

    /// The results of client processes that ran at once, as one: rates,
    /// operations, wrong values and `params.checked` summed; the longest
    /// interval; the worst client's p50 and p99 (latencies do not add);
    /// the first client's other params, with `clients` set. No parts (their
    /// step failed) sum to a zero result of `bench`.
    pub fn sum(bench: &str, parts: &[BenchResult]) -> BenchResult {
        let zero = BenchResult {
            bench: bench.into(),
            case: String::new(),
            system: "fabrickv".into(),
            ops_per_s: 0.0,
            p50_us: 0.0,
            p99_us: 0.0,
            ops: 0,
            seconds: 0.0,
            wrong_values: 0,
            params: serde_json::json!({}),
        };
        let mut out = match parts.first() {
            Some(f) => BenchResult {
                bench: f.bench.clone(),
                case: f.case.clone(),
                system: f.system.clone(),
                params: f.params.clone(),
                ..zero
            },
            None => zero,
        };
        let mut checked = 0;
        for p in parts {
            out.ops_per_s += p.ops_per_s;
            out.p50_us = out.p50_us.max(p.p50_us);
            out.p99_us = out.p99_us.max(p.p99_us);
            out.ops += p.ops;
            out.seconds = out.seconds.max(p.seconds);
            out.wrong_values += p.wrong_values;
            checked += p.params["checked"].as_u64().unwrap_or(0);
        }
        out.params["checked"] = checked.into();
        out.params["clients"] = parts.len().into();
        out
    }
}

/// Formats an operation rate as `12.34M`, `567.89K` or `123`.
pub fn rate(v: f64) -> String {
    if v >= 1e6 {
        format!("{:.2}M", v / 1e6)
    } else if v >= 1e3 {
        format!("{:.2}K", v / 1e3)
    } else {
        format!("{v:.0}")
    }
}

/// Formats microseconds as `1.23us` or `456.00ns`.
pub fn micros(v: f64) -> String {
    if v < 1.0 {
        format!("{:.2}ns", v * 1e3)
    } else {
        format!("{v:.2}us")
    }
}

/// Prints a box table: header row, then rows, each cell padded to 12.
pub fn print_table(header: &[&str], rows: &[Vec<String>]) {
    let widths: Vec<usize> = (0..header.len())
        .map(|i| {
            rows.iter()
                .map(|r| r.get(i).map_or(0, |c| c.len()))
                .chain([header[i].len(), 10])
                .max()
                .unwrap_or(10)
        })
        .collect();
    let rule: String = widths
        .iter()
        .map(|w| format!("+{}", "-".repeat(w + 2)))
        .collect::<String>()
        + "+";
    let line = |cells: Vec<&str>| -> String {
        cells
            .iter()
            .zip(&widths)
            .map(|(c, w)| format!("| {c:<w$} "))
            .collect::<String>()
            + "|"
    };
    println!("{rule}");
    println!("{}", line(header.to_vec()));
    println!("{rule}");
    for r in rows {
        println!("{}", line(r.iter().map(String::as_str).collect()));
    }
    println!("{rule}");
}

/// Prints results of key-value benchmarks as a table (Mops, p50, p99) and
/// ratios of each peer row against the `fabrickv` row of the same case.
pub fn print_kv_table(results: &[BenchResult]) {
    let rows: Vec<Vec<String>> = results
        .iter()
        .map(|r| {
            let base = results
                .iter()
                .find(|b| b.case == r.case && b.system == "fabrickv");
            let ratio = match base {
                Some(b) if r.system != "fabrickv" && r.ops_per_s > 0.0 => {
                    format!("{:.2}x", b.ops_per_s / r.ops_per_s)
                }
                _ => "-".into(),
            };
            vec![
                r.case.clone(),
                r.system.clone(),
                format!("{:.3}", r.ops_per_s / 1e6),
                micros(r.p50_us),
                micros(r.p99_us),
                ratio,
            ]
        })
        .collect();
    print_table(
        &["case", "system", "Mops", "p50", "p99", "fabrickv/x"],
        &rows,
    );
}

/// Largest latency the histograms hold, nanoseconds (larger ones saturate).
pub const HISTOGRAM_MAX_NS: u64 = 60_000_000_000;
/// Significant decimal digits the histograms keep.
pub const HISTOGRAM_SIGFIG: u8 = 3;

/// An empty latency histogram (ns) with the module's bounds.
pub fn latency_histogram() -> Result<Histogram<u64>, String> {
    Histogram::new_with_bounds(1, HISTOGRAM_MAX_NS, HISTOGRAM_SIGFIG).map_err(|e| e.to_string())
}

/// The RPC framework benchmark's table header (`name | ops/s | fast | ave | p50 | p99`).
pub const RPC_TABLE_HEADER: [&str; 6] = ["name", "ops/s", "fast", "ave", "p50", "p99"];

/// One row of the RPC framework benchmark's table: throughput and the latency of one
/// request, microseconds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LatencySummary {
    /// Requests per second over the measured interval.
    pub ops_per_s: f64,
    /// Fastest request, microseconds.
    pub fast_us: f64,
    /// Mean request, microseconds.
    pub ave_us: f64,
    /// Median request, microseconds.
    pub p50_us: f64,
    /// 99th percentile request, microseconds.
    pub p99_us: f64,
}

impl LatencySummary {
    /// Summarizes a histogram of request latencies in nanoseconds, recorded
    /// over `seconds` (ops/s is the histogram's count over `seconds`; all
    /// zero for an empty histogram).
    pub fn from_histogram(h: &Histogram<u64>, seconds: f64) -> Self {
        let s = LatencyStats::of(h);
        LatencySummary {
            ops_per_s: if seconds > 0.0 {
                s.samples as f64 / seconds
            } else {
                0.0
            },
            fast_us: s.min_us,
            ave_us: s.avg_us,
            p50_us: s.p50_us,
            p99_us: s.p99_us,
        }
    }

    /// Reads a summary back from a result: ops/s, p50 and p99 from its
    /// fields, fast and ave from `params.fast_us` / `params.ave_us` (`None`
    /// when those are missing).
    pub fn from_result(r: &BenchResult) -> Option<Self> {
        Some(LatencySummary {
            ops_per_s: r.ops_per_s,
            fast_us: r.params.get("fast_us")?.as_f64()?,
            ave_us: r.params.get("ave_us")?.as_f64()?,
            p50_us: r.p50_us,
            p99_us: r.p99_us,
        })
    }

    /// The RPC framework benchmark's table row for this summary, under [`RPC_TABLE_HEADER`].
    pub fn row(&self, name: &str) -> Vec<String> {
        vec![
            name.to_string(),
            rate(self.ops_per_s),
            micros(self.fast_us),
            micros(self.ave_us),
            micros(self.p50_us),
            micros(self.p99_us),
        ]
    }

    /// A `rpc` result with this summary; `fast_us` and `ave_us` are added to
    /// `params` (an object; anything else is replaced by one).
    pub fn to_result(
        &self,
        case: &str,
        system: &str,
        ops: u64,
        seconds: f64,
        wrong_values: u64,
        mut params: serde_json::Value,
    ) -> BenchResult {
        if !params.is_object() {
            params = serde_json::json!({});
        }
        params["fast_us"] = self.fast_us.into();
        params["ave_us"] = self.ave_us.into();
        BenchResult {
            bench: "rpc".into(),
            case: case.into(),
            system: system.into(),
            ops_per_s: self.ops_per_s,
            p50_us: self.p50_us,
            p99_us: self.p99_us,
            ops,
            seconds,
            wrong_values,
            params,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_rates_and_times() {
        assert_eq!(rate(2_270_000.0), "2.27M");
        assert_eq!(rate(323_970.0), "323.97K");
        assert_eq!(micros(0.39), "390.00ns");
        assert_eq!(micros(3.02), "3.02us");
    }

    #[test]
    fn json_has_the_documented_fields() {
        let r = BenchResult {
            bench: "kv".into(),
            case: "get".into(),
            system: "fabrickv".into(),
            ops_per_s: 1.0,
            p50_us: 2.0,
            p99_us: 3.0,
            ops: 4,
            seconds: 1.0,
            wrong_values: 0,
            params: serde_json::json!({}),
        };
        let v: serde_json::Value = serde_json::from_str(&r.json()).expect("valid json");
        for f in ["bench", "case", "system", "ops_per_s", "p50_us", "p99_us"] {
            assert!(v.get(f).is_some(), "missing {f}");
        }
    }

    #[test]
    fn sums_client_results() {
        let part = |ops_per_s: f64, p99_us: f64, wrong_values: u64, checked: u64| BenchResult {
            bench: "herd".into(),
            case: "c".into(),
            system: "fabrickv".into(),
            ops_per_s,
            p50_us: p99_us / 2.0,
            p99_us,
            ops: ops_per_s as u64,
            seconds: p99_us,
            wrong_values,
            params: serde_json::json!({ "checked": checked, "batch": 16 }),
        };
        let s = BenchResult::sum("herd", &[part(1e6, 10.0, 0, 900), part(2e6, 30.0, 1, 1800)]);
        assert_eq!(s.ops_per_s, 3e6);
        assert_eq!(s.ops, 3_000_000);
        assert_eq!((s.p50_us, s.p99_us, s.seconds), (15.0, 30.0, 30.0));
        assert_eq!(s.wrong_values, 1);
        assert_eq!(s.params["checked"], 2700);
        assert_eq!(s.params["clients"], 2);
        assert_eq!(s.params["batch"], 16);
        let none = BenchResult::sum("herd", &[]);
        assert_eq!(
            (
                none.bench.as_str(),
                none.ops,
                none.params["checked"].as_u64()
            ),
            ("herd", 0, Some(0))
        );
        // A client's JSON line reads back.
        let back: BenchResult = serde_json::from_str(&s.json()).expect("round trip");
        assert_eq!(back, s);
    }
}
