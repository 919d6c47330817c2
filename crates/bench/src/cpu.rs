//! CPU time of a server process, read from `/proc`, so a comparison can
//! say what a peer's throughput cost in CPU-seconds and not only in wall
//! seconds (a server that spins on an idle core looks free by wall time).
//!
//! Precision: the first field of `/proc/PID/task/TID/schedstat` is the time
//! thread TID has spent on a CPU, in nanoseconds, as the scheduler itself
//! counts it; `/proc/PID/stat`'s utime + stime is in clock ticks (10 ms).
//! So the per-thread schedstat sum is read first, and `stat` only where
//! the kernel has no schedstat (built without `CONFIG_SCHED_INFO`).
//!
//! Caveat: the schedstat sum covers the threads alive when it is read. A
//! thread that exits inside a measured interval takes its time with it, so
//! the interval undercounts (or reads zero, see [`CpuMeter`]). The servers
//! measured here (redis-server, memcached, `fabrickv serve`) start their
//! threads at startup and keep them while they serve, so the sum over an
//! interval of serving is complete. `stat` keeps exited threads' time, but
//! only to the tick.

use std::time::Instant;

/// Clock ticks per second of `/proc/PID/stat` (`USER_HZ`). Linux fixes it
/// at 100 for user space on every architecture FabricKV builds for,
/// whatever the kernel's internal HZ, so it is not asked of `sysconf`
/// (which would need libc).
pub const CLK_TCK: u64 = 100;

/// Total CPU time (user + system) of all threads of process `pid`, in
/// nanoseconds: the sum of its threads' schedstat run times, or, without
/// schedstat, utime + stime from `/proc/PID/stat`.
pub fn process_cpu_ns(pid: u32) -> Result<u64, String> {
    match schedstat_ns(pid)? {
        Some(ns) => Ok(ns),
        None => stat_ns(pid),
    }
}

/// CPU time (user + system) the calling thread has spent so far, in
/// nanoseconds: the first field of `/proc/thread-self/schedstat`, or
/// utime + stime of `/proc/thread-self/stat` (to the tick) without it.
/// `bench mget` reads it around a run of calls, so that only the client's
/// own work is counted, not the server's nor the waits.
pub fn thread_cpu_ns() -> Result<u64, String> {
    let path = "/proc/thread-self/schedstat";
    if let Ok(text) = std::fs::read_to_string(path) {
        return parse_schedstat(&text).ok_or_else(|| format!("unexpected {path}: {text:?}"));
    }
    let path = "/proc/thread-self/stat";
    let text = std::fs::read_to_string(path).map_err(|e| format!("cannot read {path}: {e}"))?;
    let ticks = parse_stat_ticks(&text).ok_or_else(|| format!("unexpected {path}: {text:?}"))?;
    Ok(ticks.saturating_mul(1_000_000_000 / CLK_TCK))
}

/// The sum of the first schedstat field over the threads of `pid`; `None`
/// when no thread has a readable schedstat (a kernel without it).
fn schedstat_ns(pid: u32) -> Result<Option<u64>, String> {
    let dir = format!("/proc/{pid}/task");
    let tasks = std::fs::read_dir(&dir).map_err(|e| format!("cannot list {dir}: {e}"))?;
    let mut total = 0u64;
    let mut seen = false;
    for task in tasks {
        let Ok(task) = task else { continue };
        let path = task.path().join("schedstat");
        // A thread may exit between the listing and the read: skip it, as
        // the listing would have had it been taken a moment later.
        let Ok(text) = std::fs::read_to_string(&path) else {
            continue;
        };
        let ns = parse_schedstat(&text)
            .ok_or_else(|| format!("unexpected {}: {text:?}", path.display()))?;
        total = total.saturating_add(ns);
        seen = true;
    }
    Ok(seen.then_some(total))
}

/// utime + stime of `pid` from `/proc/PID/stat`, in nanoseconds.
fn stat_ns(pid: u32) -> Result<u64, String> {
    let path = format!("/proc/{pid}/stat");
    let text = std::fs::read_to_string(&path).map_err(|e| format!("cannot read {path}: {e}"))?;
    let ticks = parse_stat_ticks(&text).ok_or_else(|| format!("unexpected {path}: {text:?}"))?;
    Ok(ticks.saturating_mul(1_000_000_000 / CLK_TCK))
}

/// The first field of a schedstat line (`run_ns wait_ns timeslices`).
fn parse_schedstat(text: &str) -> Option<u64> {
    text.split_whitespace().next()?.parse().ok()
}

/// utime + stime, in ticks, from a `/proc/PID/stat` line.
fn parse_stat_ticks(text: &str) -> Option<u64> {
    let (utime, stime) = parse_stat_split(text)?;
    Some(utime.saturating_add(stime))
}

/// utime and stime, in ticks, from a `/proc/PID/stat` line. The command
/// name (field 2) is in parentheses and may itself hold spaces and `)`, so
/// the fields are counted from the last `)`: after it come state (field
/// 3) ... utime (field 14) and stime (field 15).
fn parse_stat_split(text: &str) -> Option<(u64, u64)> {
    let rest = &text[text.rfind(')')? + 1..];
    let mut fields = rest.split_whitespace().skip(11);
    let utime: u64 = fields.next()?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    Some((utime, stime))
}

/// utime and stime of `pid` (every thread, exited ones included), in ticks.
fn stat_split(pid: u32) -> Result<(u64, u64), String> {
    let path = format!("/proc/{pid}/stat");
    let text = std::fs::read_to_string(&path).map_err(|e| format!("cannot read {path}: {e}"))?;
    parse_stat_split(&text).ok_or_else(|| format!("unexpected {path}: {text:?}"))
}

/// Fewest ticks of CPU an interval must hold before [`CpuMeter::kernel_share`]
/// reports a share: below it the 10 ms tick makes the split too coarse.
pub const KERNEL_SHARE_TICKS_MIN: u64 = 20;

/// CPU time a process spends from a starting point on, for reporting a
/// server's CPU-seconds over a measured interval.
#[derive(Debug, Clone, Copy)]
pub struct CpuMeter {
    /// The process measured.
    pub pid: u32,
    /// Its CPU time at the start, nanoseconds.
    pub start_ns: u64,
    /// When the meter started, for [`CpuMeter::utilization`].
    pub started: Instant,
    /// utime and stime at the start, in ticks, for [`CpuMeter::kernel_share`].
    pub start_split: (u64, u64),
}

impl CpuMeter {
    /// Starts measuring process `pid` now.
    pub fn start(pid: u32) -> Result<Self, String> {
        Ok(CpuMeter {
            pid,
            start_ns: process_cpu_ns(pid)?,
            started: Instant::now(),
            start_split: stat_split(pid)?,
        })
    }

    /// CPU-seconds the process has used since [`CpuMeter::start`] (zero,
    /// not negative, when threads that exited took more time with them
    /// than the others gained).
    pub fn elapsed_cpu_s(&self) -> Result<f64, String> {
        let now = process_cpu_ns(self.pid)?;
        Ok(now.saturating_sub(self.start_ns) as f64 / 1e9)
    }

    /// The part of the CPU time since the start spent in the kernel
    /// (system time: socket calls, the TCP stack, waking up), from 0 to 1;
    /// `None` when the interval holds under [`KERNEL_SHARE_TICKS_MIN`]
    /// ticks. It says how much of a server's cost its own code can change:
    /// two servers with the same kernel path per operation differ at most
    /// by their user-space time.
    pub fn kernel_share(&self) -> Result<Option<f64>, String> {
        let (user, system) = stat_split(self.pid)?;
        let user = user.saturating_sub(self.start_split.0);
        let system = system.saturating_sub(self.start_split.1);
        let total = user + system;
        Ok((total >= KERNEL_SHARE_TICKS_MIN).then(|| system as f64 / total as f64))
    }

    /// CPU-seconds used per wall second since the start (1.0: one core
    /// busy all the time).
    pub fn utilization(&self) -> Result<f64, String> {
        let cpu = self.elapsed_cpu_s()?;
        Ok(cpu / self.started.elapsed().as_secs_f64().max(1e-9))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// Spins the calling thread for a while; returns something so the
    /// work is not optimized away.
    fn burn() -> u64 {
        let mut x = 1u64;
        for j in 0..200_000u64 {
            x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(j));
        }
        x
    }

    #[test]
    fn parses_proc_lines() {
        assert_eq!(parse_schedstat("538391400 572905 60\n"), Some(538391400));
        assert_eq!(parse_schedstat(""), None);
        // A command name holding spaces and a parenthesis.
        let stat = "42 (a b) c) R 1 42 42 0 -1 4194304 2841 6552 9 2 53 7 3 1 20 0 1 0";
        assert_eq!(parse_stat_ticks(stat), Some(60));
        assert_eq!(parse_stat_split(stat), Some((53, 7)));
        assert_eq!(parse_stat_ticks("42 (x) R 1"), None);
    }

    #[test]
    fn the_counter_follows_cpu_burned_by_this_process() {
        let pid = std::process::id();
        let stat0 = stat_ns(pid).expect("stat readable");
        let meter = CpuMeter::start(pid).expect("own process measurable");
        let wall = Instant::now();
        let target = 0.2;
        let mut sink = 0u64;
        // The reading that ended the burn is the one judged: a second
        // reading could lose the time of another test's thread that exited
        // in between (the schedstat sum covers live threads only, see the
        // module's caveat), which says nothing of this burn.
        let mut cpu = meter.elapsed_cpu_s().expect("readable");
        while cpu < target && wall.elapsed() < Duration::from_secs(20) {
            sink ^= burn();
            cpu = meter.elapsed_cpu_s().expect("readable");
        }
        let wall_s = wall.elapsed().as_secs_f64();
        std::hint::black_box(sink);
        assert!(
            cpu >= target,
            "only {cpu} CPU-s after {wall_s} s of burning"
        );
        // Other tests run in this process too, but no process can use more
        // than all of its CPUs for the whole time.
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get()) as f64;
        assert!(
            cpu <= wall_s * cpus + 0.05,
            "{cpu} CPU-s in {wall_s} s on {cpus} CPUs"
        );
        // The tick-based fallback sees the same work, to within ticks.
        let stat_s = stat_ns(pid).expect("stat readable").saturating_sub(stat0) as f64 / 1e9;
        assert!(stat_s >= target / 2.0, "stat saw only {stat_s} CPU-s");
        assert!(meter.utilization().expect("readable") > 0.0);
    }

    #[test]
    fn a_missing_process_is_an_error() {
        // Linux pids are at most 2^22.
        assert!(process_cpu_ns(u32::MAX).is_err());
    }
}
