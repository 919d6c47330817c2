//! The report's figures: the latency statistics and the byte units of the
//! the output of kv-bench (the Rust KV-cache server's benchmark this one follows).

use hdrhistogram::Histogram;
use serde::Serialize;

use crate::limits::check::per_s;

/// kv-bench's latency statistics of a histogram of nanoseconds, in
/// microseconds.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct LatencyStats {
    /// GETs measured.
    pub samples: u64,
    /// Fastest.
    pub min_us: f64,
    /// Median.
    pub p50_us: f64,
    /// Mean.
    pub avg_us: f64,
    /// 95th percentile.
    pub p95_us: f64,
    /// 99th percentile.
    pub p99_us: f64,
    /// Slowest.
    pub max_us: f64,
}

impl LatencyStats {
    /// The figures of `h` (all zero when it is empty).
    pub fn of(h: &Histogram<u64>) -> LatencyStats {
        if h.is_empty() {
            return LatencyStats {
                samples: 0,
                min_us: 0.0,
                p50_us: 0.0,
                avg_us: 0.0,
                p95_us: 0.0,
                p99_us: 0.0,
                max_us: 0.0,
            };
        }
        let us = |ns: u64| ns as f64 / 1e3;
        LatencyStats {
            samples: h.len(),
            min_us: us(h.min()),
            p50_us: us(h.value_at_quantile(0.50)),
            avg_us: h.mean() / 1e3,
            p95_us: us(h.value_at_quantile(0.95)),
            p99_us: us(h.value_at_quantile(0.99)),
            max_us: us(h.max()),
        }
    }

    /// GETs per second one thread issuing them back to back would make
    /// (`1e6 / avg_us`; 0 without samples).
    pub fn single_thread_ops_per_s(&self) -> f64 {
        per_s(1e6, self.avg_us)
    }

    /// kv-bench's block: a title line, then one line per figure.
    pub fn block(&self) -> String {
        let line = |name: &str, v: f64| format!("  {name:<7}{v:>10.2} µs\n");
        [
            "Latency statistics (microseconds):\n".to_string(),
            line("Min:", self.min_us),
            line("Median:", self.p50_us),
            line("Avg:", self.avg_us),
            line("P95:", self.p95_us),
            line("P99:", self.p99_us),
            line("Max:", self.max_us),
        ]
        .concat()
    }
}

/// Bytes in kv-bench's style: `512 B`, `64.00 KB`, `1.00 MB`, `2.50 GB`
/// (binary units, as `--value-size` is parsed).
pub fn format_bytes(bytes: f64) -> String {
    const UNITS: [&str; 4] = ["KB", "MB", "GB", "TB"];
    if bytes < 1024.0 {
        return format!("{bytes:.0} B");
    }
    let mut v = bytes / 1024.0;
    let mut unit = 0;
    while v >= 1024.0 && unit + 1 < UNITS.len() {
        v /= 1024.0;
        unit += 1;
    }
    format!("{v:.2} {}", UNITS[unit])
}

/// Bytes per second in MB/s (2^20 bytes), kv-bench's unit.
pub fn mb_per_s(bytes_per_s: f64) -> f64 {
    bytes_per_s / f64::from(1u32 << 20)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_print_in_kv_bench_style() {
        assert_eq!(format_bytes(65_536.0), "64.00 KB");
        assert_eq!(format_bytes(512.0), "512 B");
        assert_eq!(format_bytes(64.0 * 1_048_576.0), "64.00 MB");
    }
}
