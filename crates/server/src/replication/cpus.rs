//! The CPUs a server's data movement runs on (`serve --stream-cpus`).
//!
//! Moving slots is bulk work: an old owner walks its index and ships
//! chunks, the new owner applies them, and the old owner later lets the
//! moved keys go. Left to the scheduler, those threads take every core
//! they can, and the requests served meanwhile wait behind them: on a
//! two-core host a read's p99 during a move was 4-6x the one before it,
//! and it was 1-2x once the movement ran on one core (the scheduler then
//! keeps the serving threads on the others). Redis confines its
//! background work the same way (`bgsave_cpulist`, `bio_cpulist`).
//!
//! A thread is confined only while it moves data: a primary's replicator
//! while it streams to a joiner, a joiner's apply thread while it takes a
//! group's stream, and the thread releasing moved keys. Steady-state
//! replication (a backup applying its primary's writes) runs anywhere, as
//! it is on the path of every acknowledgement.

use std::cell::Cell;

/// The highest CPU number a set may name, exclusive: the size of the
/// kernel's fixed `cpu_set_t` (`CPU_SETSIZE`, 1024 CPUs).
pub const CPU_SET_CPUS_MAX: usize = rustix::thread::CpuSet::MAX_CPU;

/// Which CPUs the data-movement threads run on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamCpus {
    /// The CPUs a confined thread runs on; empty: not confined.
    confined: Vec<usize>,
    /// The CPUs the process may run on, given back to a thread when its
    /// movement ends.
    allowed: Vec<usize>,
}

thread_local! {
    /// Whether this thread is confined now: the affinity is set only
    /// when this changes, not on every call.
    static CONFINED: Cell<bool> = const { Cell::new(false) };
}

impl StreamCpus {
    /// No confinement: movement runs wherever the scheduler puts it.
    pub fn anywhere() -> StreamCpus {
        StreamCpus {
            confined: Vec::new(),
            allowed: Vec::new(),
        }
    }

    /// The default for a process that may run on `allowed`: its last CPU
    /// when it has two or more (movement then takes at most one core from
    /// serving), none with one.
    pub fn auto(allowed: &[usize]) -> StreamCpus {
        match allowed.last() {
            Some(&last) if allowed.len() >= 2 => StreamCpus {
                confined: vec![last],
                allowed: allowed.to_vec(),
            },
            _ => StreamCpus::anywhere(),
        }
    }

    /// Reads `--stream-cpus`: `auto` ([`StreamCpus::auto`]), `any` (no
    /// confinement), or a CPU list as Linux writes one (`3`, `2-3`,
    /// `0,4-5`), every CPU of it one the process may run on (`allowed`).
    pub fn parse(spec: &str, allowed: &[usize]) -> Result<StreamCpus, String> {
        match spec.trim() {
            "auto" => return Ok(StreamCpus::auto(allowed)),
            "any" => return Ok(StreamCpus::anywhere()),
            _ => {}
        }
        let mut confined = Vec::new();
        for part in spec.split(',').map(str::trim) {
            let (lo, hi) = match part.split_once('-') {
                Some((lo, hi)) => (cpu_number(lo, spec)?, cpu_number(hi, spec)?),
                None => {
                    let c = cpu_number(part, spec)?;
                    (c, c)
                }
            };
            if lo > hi {
                return Err(format!(
                    "--stream-cpus {spec:?}: the range {part:?} runs backwards"
                ));
            }
            confined.extend(lo..=hi);
        }
        confined.sort_unstable();
        confined.dedup();
        if let Some(c) = confined.iter().find(|c| !allowed.contains(c)) {
            return Err(format!(
                "--stream-cpus {spec:?}: this process may not run on CPU {c} (it may on {allowed:?})"
            ));
        }
        Ok(StreamCpus {
            confined,
            allowed: allowed.to_vec(),
        })
    }

    /// The CPUs a confined thread runs on (empty: none is confined).
    pub fn cpus(&self) -> &[usize] {
        &self.confined
    }

    /// Confines the calling thread to the movement CPUs (`on`) or gives
    /// it the process's CPUs back; a system call only when that changes.
    /// A refusal (a container that changed the process's CPUs since) is
    /// logged and the thread runs on.
    pub fn confine(&self, on: bool) {
        if self.confined.is_empty() || CONFINED.with(Cell::get) == on {
            return;
        }
        CONFINED.with(|c| c.set(on));
        let cpus = if on { &self.confined } else { &self.allowed };
        if let Err(e) = set_thread_cpus(cpus) {
            tracing::info!("replication: cannot set a movement thread's CPUs to {cpus:?}: {e}");
        }
    }
}

fn cpu_number(s: &str, spec: &str) -> Result<usize, String> {
    match s.trim().parse::<usize>() {
        Ok(c) if c < CPU_SET_CPUS_MAX => Ok(c),
        Ok(c) => Err(format!(
            "--stream-cpus {spec:?}: CPU {c} is past the most a set names ({CPU_SET_CPUS_MAX})"
        )),
        Err(_) => Err(format!(
            "--stream-cpus {spec:?}: {s:?} is not a CPU number (auto, any, or a list such as 3 or 2-3,6)"
        )),
    }
}

/// The CPUs the calling thread may run on (the process's, at start).
pub fn allowed_cpus() -> std::io::Result<Vec<usize>> {
    let set = rustix::thread::sched_getaffinity(None)?;
    Ok((0..CPU_SET_CPUS_MAX).filter(|&c| set.is_set(c)).collect())
}

/// Sets the calling thread's CPUs to `cpus` (each below
/// [`CPU_SET_CPUS_MAX`]).
fn set_thread_cpus(cpus: &[usize]) -> std::io::Result<()> {
    let mut set = rustix::thread::CpuSet::new();
    for &c in cpus.iter().filter(|&&c| c < CPU_SET_CPUS_MAX) {
        set.set(c);
    }
    Ok(rustix::thread::sched_setaffinity(None, &set)?)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn the_default_takes_the_last_cpu_of_two_or_more() {
        assert_eq!(StreamCpus::auto(&[0, 1, 2, 3]).cpus(), &[3]);
        assert_eq!(StreamCpus::auto(&[0, 5]).cpus(), &[5]);
        assert!(
            StreamCpus::auto(&[0]).cpus().is_empty(),
            "one CPU: nothing to leave to serving"
        );
        assert!(StreamCpus::auto(&[]).cpus().is_empty());
        assert_eq!(StreamCpus::parse("auto", &[0, 1]).unwrap().cpus(), &[1]);
        assert!(StreamCpus::parse("any", &[0, 1]).unwrap().cpus().is_empty());
    }

    #[test]
    fn cpu_lists_read_as_linux_writes_them() {
        let all: Vec<usize> = (0..8).collect();
        assert_eq!(StreamCpus::parse("3", &all).unwrap().cpus(), &[3]);
        assert_eq!(StreamCpus::parse("2-3", &all).unwrap().cpus(), &[2, 3]);
        assert_eq!(
            StreamCpus::parse("0, 4-5,4", &all).unwrap().cpus(),
            &[0, 4, 5]
        );
        for bad in ["", "x", "3-1", "1-", "-1", "1,,2", "2048"] {
            let e = StreamCpus::parse(bad, &all).unwrap_err();
            assert!(e.contains("--stream-cpus"), "{bad:?}: {e}");
        }
        let e = StreamCpus::parse("9", &all).unwrap_err();
        assert!(e.contains("may not run on CPU 9"), "{e}");
    }

    #[test]
    fn a_confined_thread_runs_on_the_set_and_gets_its_cpus_back() {
        let allowed = allowed_cpus().unwrap();
        let cpus = StreamCpus::auto(&allowed);
        let Some(&last) = cpus.cpus().first() else {
            return; // one CPU: nothing is ever confined
        };
        std::thread::spawn(move || {
            cpus.confine(true);
            assert_eq!(allowed_cpus().unwrap(), vec![last]);
            cpus.confine(true);
            assert_eq!(allowed_cpus().unwrap(), vec![last]);
            cpus.confine(false);
            assert_eq!(allowed_cpus().unwrap(), allowed);
        })
        .join()
        .unwrap();
    }
}
