//! Whether the embedding pool can be had, asked before it is built.
//!
//! Building the pool faults in, zeroes and locks every byte of it, and
//! any client may cause it with one CREATE. A pool the process may not
//! lock, or that the host has no room for, must be refused before a page
//! is touched: a failing `mlock` comes after the mapping, and a pool
//! larger than the free memory of a root process (which `RLIMIT_MEMLOCK`
//! does not bound) would push the host into swap or the OOM killer.
//!
//! What is read comes from `/proc` (no system call wrappers needed) and
//! the decision is a pure function of it ([`MemoryBudget::check`]), so it
//! is tested with any limits.

use fabrickv_engine::PoolOptions;
use fabrickv_types::size::format_size;

/// The bit of `CAP_IPC_LOCK` in the capability sets of
/// `/proc/self/status`: a process holding it may lock any amount of
/// memory whatever its `RLIMIT_MEMLOCK`.
pub const CAP_IPC_LOCK_BIT: u32 = 14;

/// Most of the host's available memory (`MemAvailable`) a resident pool
/// may take, in percent: the rest is left to the page cache, the other
/// pools of the server and the host's other processes.
pub const PS_POOL_AVAILABLE_PERCENT_MAX: u64 = 90;

/// What this process may make resident and lock, as read at one time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemoryBudget {
    /// Bytes this process may lock in all (`RLIMIT_MEMLOCK`, soft); `None`
    /// when unbounded (`RLIM_INFINITY`, or `CAP_IPC_LOCK` held).
    pub lock_limit_bytes: Option<u64>,
    /// Bytes this process has locked already (`VmLck`).
    pub locked_bytes: u64,
    /// The host's available memory (`MemAvailable`), `None` if unknown.
    pub available_bytes: Option<u64>,
}

impl MemoryBudget {
    /// The budget of this process now, from `/proc/self/limits`,
    /// `/proc/self/status` and `/proc/meminfo`. What cannot be read is
    /// taken as unbounded: the pool's own build then says what failed.
    pub fn of_this_process() -> MemoryBudget {
        let read = |p: &str| std::fs::read_to_string(p).unwrap_or_default();
        let status = read("/proc/self/status");
        let lock_limit_bytes = if has_capability(&status, CAP_IPC_LOCK_BIT) {
            None
        } else {
            memlock_limit(&read("/proc/self/limits")).unwrap_or(None)
        };
        MemoryBudget {
            lock_limit_bytes,
            locked_bytes: status_kb(&status, "VmLck:").unwrap_or(0),
            available_bytes: status_kb(&read("/proc/meminfo"), "MemAvailable:"),
        }
    }

    /// Refuses a pool of `pool_bytes` obtained as `opts` says when this
    /// budget cannot hold it; the message names the limit and the ways out.
    pub fn check(&self, pool_bytes: u64, opts: &PoolOptions) -> Result<(), String> {
        let pool = format_size(pool_bytes);
        if opts.lock {
            if let Some(limit) = self.lock_limit_bytes {
                let free = limit.saturating_sub(self.locked_bytes);
                if pool_bytes > free {
                    return Err(format!(
                        "locking {pool} needs more than RLIMIT_MEMLOCK allows ({} with {} \
                         locked already); raise `ulimit -l`, give the server CAP_IPC_LOCK, \
                         shrink --dram-pool-gb, or pass --dram-skip-mlock",
                        format_size(limit),
                        format_size(self.locked_bytes)
                    ));
                }
            }
        }
        let resident = opts.lock || opts.populate || opts.zero || opts.hugepages;
        if let (true, Some(available)) = (resident, self.available_bytes) {
            let room = available / 100 * PS_POOL_AVAILABLE_PERCENT_MAX;
            if pool_bytes > room {
                return Err(format!(
                    "{pool} made resident is more than {PS_POOL_AVAILABLE_PERCENT_MAX}% of \
                     the host's available memory ({}); shrink --dram-pool-gb",
                    format_size(available)
                ));
            }
        }
        Ok(())
    }
}

/// Whether the effective capability set in a `/proc/PID/status` text
/// holds capability `bit`.
fn has_capability(status: &str, bit: u32) -> bool {
    status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|hex| u64::from_str_radix(hex.trim(), 16).ok())
        .is_some_and(|caps| caps >> bit & 1 == 1)
}

/// The soft `Max locked memory` limit of a `/proc/PID/limits` text, in
/// bytes: `Some(None)` for unlimited, `None` when the line is missing.
fn memlock_limit(limits: &str) -> Option<Option<u64>> {
    let rest = limits
        .lines()
        .find_map(|l| l.strip_prefix("Max locked memory"))?;
    match rest.split_whitespace().next()? {
        "unlimited" => Some(None),
        n => n.parse().ok().map(Some),
    }
}

/// A `NAME:   N kB` line of `/proc/PID/status` or `/proc/meminfo`, in
/// bytes.
fn status_kb(text: &str, name: &str) -> Option<u64> {
    let rest = text.lines().find_map(|l| l.strip_prefix(name))?;
    let kb: u64 = rest.split_whitespace().next()?.parse().ok()?;
    Some(kb.saturating_mul(1024))
}

#[cfg(test)]
mod tests {
    use super::*;

    const LOCKED: PoolOptions = PoolOptions {
        hugepages: false,
        populate: true,
        lock: true,
        zero: true,
    };

    #[test]
    fn reads_the_limits_capabilities_and_free_memory_from_proc_texts() {
        let limits = "Limit                     Soft Limit           Hard Limit           Units\n\
                      Max locked memory         8388608              8388608              bytes\n";
        assert_eq!(memlock_limit(limits), Some(Some(8 << 20)));
        let unlimited =
            "Max locked memory         unlimited            unlimited            bytes\n";
        assert_eq!(memlock_limit(unlimited), Some(None));
        assert_eq!(memlock_limit("Max open files 1024 1024 files\n"), None);
        let status = "Name:\tx\nVmLck:\t      12 kB\nCapEff:\t000001ffffffffff\n";
        assert!(has_capability(status, CAP_IPC_LOCK_BIT));
        assert!(!has_capability(
            "CapEff:\t0000000000000000\n",
            CAP_IPC_LOCK_BIT
        ));
        assert!(!has_capability("", CAP_IPC_LOCK_BIT));
        assert_eq!(status_kb(status, "VmLck:"), Some(12 << 10));
        assert_eq!(
            status_kb("MemAvailable:   23600780 kB\n", "MemAvailable:"),
            Some(23_600_780 << 10)
        );
        // This process's own budget reads without failing.
        let _ = MemoryBudget::of_this_process();
    }

    #[test]
    fn a_pool_beyond_the_lock_limit_or_free_memory_is_refused() {
        let b = MemoryBudget {
            lock_limit_bytes: Some(64 << 20),
            locked_bytes: 16 << 20,
            available_bytes: Some(1 << 30),
        };
        assert_eq!(b.check(48 << 20, &LOCKED), Ok(()));
        let e = b.check(49 << 20, &LOCKED).expect_err("beyond the limit");
        assert!(
            e.contains("RLIMIT_MEMLOCK") && e.contains("--dram-skip-mlock"),
            "{e}"
        );
        // Not locked: only free memory bounds it.
        let unlocked = PoolOptions {
            lock: false,
            ..LOCKED
        };
        assert_eq!(b.check(512 << 20, &unlocked), Ok(()));
        let e = b.check(1 << 30, &unlocked).expect_err("beyond free memory");
        assert!(e.contains("available memory"), "{e}");
        // Unbounded locking (CAP_IPC_LOCK) is still bounded by free memory.
        let root = MemoryBudget {
            lock_limit_bytes: None,
            ..b
        };
        assert_eq!(root.check(900 << 20, &LOCKED), Ok(()));
        assert!(root.check(1 << 30, &LOCKED).is_err());
        // A lazy pool (pages on first touch) is not checked.
        assert_eq!(root.check(1 << 40, &PoolOptions::default()), Ok(()));
    }
}
