//! What every limit and baseline shares: the bounds on a measured run's
//! length, the warm-up before it, the I/O timeout of its sockets, the
//! argument checks and the one-JSON-object-per-line output.

use std::time::Duration;

use serde::Serialize;

/// Longest measured interval a limit or baseline accepts.
pub const MAX_DURATION: Duration = Duration::from_secs(3600);
/// Unmeasured run before each measurement (connections, allocator, caches).
pub const WARMUP: Duration = Duration::from_millis(100);
/// How long a blocking read or write, a connect, or a server start may take
/// before a limit or baseline gives up with an error instead of hanging.
pub const IO_TIMEOUT: Duration = Duration::from_secs(5);

/// Checks a measured duration against `(0, MAX_DURATION]`.
pub(crate) fn check_duration(duration: Duration) -> Result<(), String> {
    if duration.is_zero() || duration > MAX_DURATION {
        return Err(format!(
            "duration {duration:?} is outside (0, {MAX_DURATION:?}]"
        ));
    }
    Ok(())
}

/// Checks that `v` is in `1..=max`.
pub(crate) fn check_range(name: &str, v: usize, max: usize) -> Result<(), String> {
    if v == 0 || v > max {
        return Err(format!("{name} {v} is outside 1..={max}"));
    }
    Ok(())
}

/// One JSON object: `"bench"` first, then the result's own fields.
#[derive(Serialize)]
struct JsonLine<'a, T: Serialize> {
    /// Which limit or peer.
    bench: &'a str,
    /// The result.
    #[serde(flatten)]
    result: &'a T,
}

pub(crate) fn json_line<T: Serialize>(bench: &str, result: &T) -> String {
    serde_json::to_string(&JsonLine { bench, result })
        .unwrap_or_else(|e| format!("{{\"bench\":\"{bench}\",\"error\":\"{e}\"}}"))
}

/// Divides `n` by `seconds`, zero for an empty interval.
pub(crate) fn per_s(n: f64, seconds: f64) -> f64 {
    if seconds > 0.0 {
        n / seconds
    } else {
        0.0
    }
}

/// What the limits' tests share.
#[cfg(test)]
pub(crate) mod testing {
    use std::time::Duration;

    /// How long each limit runs in tests.
    pub const TEST_RUN: Duration = Duration::from_millis(100);

    /// A positive, finite figure.
    pub fn sane(v: f64) -> bool {
        v.is_finite() && v > 0.0
    }
}
