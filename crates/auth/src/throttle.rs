//! Throttling failed authentication, server-wide and per source, for
//! every front end (the native handshake of tcp, shm and fabric, RESP
//! `AUTH`/`HELLO AUTH`, the gRPC bearer token) alike.
//!
//! A per-connection limit does not stop guessing: 400 parallel
//! connections made 2,856 RESP `AUTH` guesses a second, the native
//! handshake took 2,258 wrong proofs a second and gRPC 1,407, with no
//! back-off. So one [`Throttle`] per server counts failures:
//!
//! - **per source** (an IPv4 address, an IPv6 /64, since one host is
//!   handed a whole /64; or the local user of an shm peer): a source may
//!   fail [`SOURCE_FAILURES_BURST`] times at once, then once per
//!   [`SOURCE_FAILURE_INTERVAL_MS`]; past that, its attempts are refused
//!   at once, unjudged, until its allowance comes back;
//! - **server-wide**: over all sources, [`SERVER_FAILURES_BURST`] at once,
//!   then one per [`SERVER_FAILURE_INTERVAL_MS`]. While that is spent, a
//!   source that failed within [`SOURCE_MEMORY_MS`] is refused at once, so
//!   that many addresses each spending their own allowance still meet a
//!   bound; a source with no recent failure is still judged.
//!
//! A refused attempt is not judged at all: its guess, right or wrong,
//! teaches the guesser nothing, and costs the server no HMAC. A client
//! that holds the secret never fails, so it is never in the table and
//! never waits: neither an attacker elsewhere nor a server-wide flood
//! slows it (one that shares its source with a guesser is refused with
//! the guesser while that source is throttled; that is the price of
//! counting per source).
//!
//! The rates use the generic cell rate algorithm: each source keeps one
//! instant, the time its allowance would be whole again (`due`); a
//! failure pushes it one interval later, and a source whose `due` is
//! more than a burst less one interval ahead of now is throttled. The logic takes
//! `now` as an argument and does no I/O, so it is tested without sleeps;
//! [`SharedThrottle`] is the one a server's front ends share.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Failures one source may make at once before it is throttled: room for
/// a mistyped password and a client retrying with the wrong file a few
/// times, far too few to guess a secret.
pub const SOURCE_FAILURES_BURST: u32 = 10;
/// Past its burst, a source may fail once per this many milliseconds (one
/// guess a second: at most 86,400 a day against a 128-bit secret).
pub const SOURCE_FAILURE_INTERVAL_MS: u64 = 1_000;
/// Failures over all sources at once before the server-wide limit acts.
pub const SERVER_FAILURES_BURST: u32 = 100;
/// Past its burst, the server as a whole takes one failure per this many
/// milliseconds (20 a second) before it refuses sources that failed
/// recently.
pub const SERVER_FAILURE_INTERVAL_MS: u64 = 50;
/// How long a source's last failure is remembered, in milliseconds: while
/// the server-wide allowance is spent, a source that failed this recently
/// is refused at once (10 minutes).
pub const SOURCE_MEMORY_MS: u64 = 10 * 60 * 1_000;
/// Most sources remembered at once. Each entry is a key and two instants
/// (about 64 bytes with the map's overhead), so the table stays under
/// 1 MiB whatever a flood of addresses does; when full, the source whose
/// last failure is oldest is forgotten.
pub const SOURCES_MAX: usize = 16_384;

/// Where an authentication attempt comes from, as the throttle counts it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Source {
    /// An IPv4 address, or the first 64 bits of an IPv6 one (an IPv4
    /// address mapped into IPv6 counts as the IPv4 address).
    Ip(IpAddr),
    /// A local user (uid), for transports without addresses (shm).
    User(u32),
    /// The front end could not tell: all such attempts share one source.
    Unknown,
}

impl Source {
    /// The source of a peer at `ip`.
    pub fn ip(ip: IpAddr) -> Source {
        match ip {
            IpAddr::V4(v4) => Source::Ip(IpAddr::V4(v4)),
            IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
                Some(v4) => Source::Ip(IpAddr::V4(v4)),
                None => {
                    let prefix = u128::from(v6) & !((1u128 << 64) - 1);
                    Source::Ip(IpAddr::V6(prefix.into()))
                }
            },
        }
    }

    /// The source of a peer at `addr`, if there is one.
    pub fn of(addr: Option<std::net::SocketAddr>) -> Source {
        addr.map_or(Source::Unknown, |a| Source::ip(a.ip()))
    }
}

/// Why an attempt is refused unjudged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Throttled {
    /// When the source may try again, at the earliest.
    pub retry_after: Duration,
    /// True when the server-wide allowance is what is spent (the source's
    /// own is not).
    pub server_wide: bool,
}

impl std::fmt::Display for Throttled {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "too many failed authentications {}; retry in {} ms",
            if self.server_wide {
                "on this server"
            } else {
                "from this address"
            },
            self.retry_after.as_millis().max(1)
        )
    }
}

/// The rates a [`Throttle`] enforces; [`Limits::default`] is the named
/// constants above. Tests use others.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// [`SOURCE_FAILURES_BURST`].
    pub source_burst: u32,
    /// [`SOURCE_FAILURE_INTERVAL_MS`].
    pub source_interval: Duration,
    /// [`SERVER_FAILURES_BURST`].
    pub server_burst: u32,
    /// [`SERVER_FAILURE_INTERVAL_MS`].
    pub server_interval: Duration,
    /// [`SOURCE_MEMORY_MS`].
    pub memory: Duration,
    /// [`SOURCES_MAX`].
    pub sources_max: usize,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            source_burst: SOURCE_FAILURES_BURST,
            source_interval: Duration::from_millis(SOURCE_FAILURE_INTERVAL_MS),
            server_burst: SERVER_FAILURES_BURST,
            server_interval: Duration::from_millis(SERVER_FAILURE_INTERVAL_MS),
            memory: Duration::from_millis(SOURCE_MEMORY_MS),
            sources_max: SOURCES_MAX,
        }
    }
}

/// What the throttle remembers of one source.
#[derive(Debug, Clone, Copy)]
struct Entry {
    /// When the source's allowance is whole again (see the module docs).
    due: Instant,
    /// Its last failure: it is forgotten [`Limits::memory`] after this,
    /// and the oldest goes first when the table is full.
    last: Instant,
}

/// The failure counts of one server; see the module docs.
#[derive(Debug)]
pub struct Throttle {
    limits: Limits,
    /// Sources that failed within `limits.memory`, at most
    /// `limits.sources_max`.
    sources: HashMap<Source, Entry>,
    /// When the server-wide allowance is whole again (`None`: it is).
    server_due: Option<Instant>,
}

impl Default for Throttle {
    fn default() -> Throttle {
        Throttle::new(Limits::default())
    }
}

/// How far `due` is ahead of `now` (zero once passed).
fn ahead(due: Instant, now: Instant) -> Duration {
    due.saturating_duration_since(now)
}

impl Throttle {
    /// A throttle that enforces `limits`.
    pub fn new(limits: Limits) -> Throttle {
        assert!(
            limits.source_burst > 0 && limits.server_burst > 0 && limits.sources_max > 0,
            "a throttle must let a first attempt through"
        );
        Throttle {
            limits,
            sources: HashMap::new(),
            server_due: None,
        }
    }

    /// Whether an attempt from `src` at `now` may be judged: `Ok`, or
    /// refused without judging it. Call it before checking a proof or a
    /// password, and [`Throttle::failed`] when it was wrong.
    pub fn check(&mut self, src: Source, now: Instant) -> Result<(), Throttled> {
        let l = self.limits;
        let Some(e) = self.sources.get(&src).copied() else {
            // Never failed (or forgotten): always judged.
            return Ok(());
        };
        if now.saturating_duration_since(e.last) >= l.memory {
            self.sources.remove(&src);
            return Ok(());
        }
        // A burst of failures at one instant puts `due` a burst of
        // intervals ahead; past a burst less one, the next is refused.
        let tolerance = l.source_interval * (l.source_burst - 1);
        let source_ahead = ahead(e.due, now);
        if source_ahead > tolerance {
            return Err(Throttled {
                retry_after: source_ahead - tolerance,
                server_wide: false,
            });
        }
        let server_tolerance = l.server_interval * (l.server_burst - 1);
        let server_ahead = self.server_due.map_or(Duration::ZERO, |d| ahead(d, now));
        if server_ahead > server_tolerance {
            return Err(Throttled {
                retry_after: server_ahead - server_tolerance,
                server_wide: true,
            });
        }
        Ok(())
    }

    /// Counts a failed attempt from `src` at `now`.
    pub fn failed(&mut self, src: Source, now: Instant) {
        let l = self.limits;
        let server_due = self.server_due.map_or(now, |d| d.max(now)) + l.server_interval;
        // Never more than the burst ahead: sources that never failed are
        // judged and counted even while it is spent, and a flood of them
        // must not keep the server spent long after it stops.
        self.server_due = Some(server_due.min(now + l.server_interval * l.server_burst));
        if !self.sources.contains_key(&src) && self.sources.len() >= l.sources_max {
            self.forget(now);
        }
        let e = self.sources.entry(src).or_insert(Entry {
            due: now,
            last: now,
        });
        // A source refused unjudged is not counted again (it was not
        // judged), so `due` never runs more than a burst ahead of now.
        e.due = e.due.max(now) + l.source_interval;
        e.last = e.last.max(now);
    }

    /// Makes room for one source: drops those forgotten by now, else the
    /// one whose last failure is oldest.
    fn forget(&mut self, now: Instant) {
        let memory = self.limits.memory;
        self.sources
            .retain(|_, e| now.saturating_duration_since(e.last) < memory);
        if self.sources.len() >= self.limits.sources_max {
            let oldest = self
                .sources
                .iter()
                .min_by_key(|(_, e)| e.last)
                .map(|(k, _)| *k);
            if let Some(k) = oldest {
                self.sources.remove(&k);
            }
        }
    }

    /// Sources remembered now (for tests and stats).
    pub fn sources(&self) -> usize {
        self.sources.len()
    }
}

/// One [`Throttle`] shared by every front end of a server. While no
/// source has failed recently (the usual case) a check reads one atomic
/// flag and takes no lock, so gRPC, which checks its token on every call,
/// pays nothing per call; otherwise the lock is taken once per check.
#[derive(Debug, Clone, Default)]
pub struct SharedThrottle(Arc<Shared>);

#[derive(Debug, Default)]
struct Shared {
    throttle: Mutex<Throttle>,
    /// Whether the table may hold a source: set by every failure, cleared
    /// by a check that finds the table empty.
    remembers: AtomicBool,
}

impl SharedThrottle {
    /// A shared throttle that enforces `limits`.
    pub fn new(limits: Limits) -> SharedThrottle {
        SharedThrottle(Arc::new(Shared {
            throttle: Mutex::new(Throttle::new(limits)),
            remembers: AtomicBool::new(false),
        }))
    }

    fn with<R>(&self, f: impl FnOnce(&mut Throttle) -> R) -> R {
        // A panic while holding the lock leaves counts that are still
        // counts: go on with them.
        let mut t = self.0.throttle.lock().unwrap_or_else(|p| p.into_inner());
        f(&mut t)
    }

    /// [`Throttle::check`] at the current time.
    pub fn check(&self, src: Source) -> Result<(), Throttled> {
        self.check_at(src, Instant::now())
    }

    /// [`Throttle::check`].
    pub fn check_at(&self, src: Source, now: Instant) -> Result<(), Throttled> {
        if !self.0.remembers.load(Ordering::Acquire) {
            return Ok(());
        }
        self.with(|t| {
            let r = t.check(src, now);
            if t.sources() == 0 {
                self.0.remembers.store(false, Ordering::Release);
            }
            r
        })
    }

    /// [`Throttle::failed`] at the current time.
    pub fn failed(&self, src: Source) {
        self.failed_at(src, Instant::now())
    }

    /// [`Throttle::failed`].
    pub fn failed_at(&self, src: Source, now: Instant) {
        self.with(|t| {
            t.failed(src, now);
            self.0.remembers.store(true, Ordering::Release);
        })
    }

    /// Judges one attempt from `src`: refused unjudged while throttled,
    /// else `judge` decides, and a `false` from it counts as a failure.
    /// `Ok(true)`: the secret was right.
    pub fn attempt(&self, src: Source, judge: impl FnOnce() -> bool) -> Result<bool, Throttled> {
        self.check(src)?;
        let ok = judge();
        if !ok {
            self.failed(src);
        }
        Ok(ok)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn ip(s: &str) -> Source {
        Source::ip(s.parse().unwrap())
    }

    fn limits() -> Limits {
        Limits {
            source_burst: 3,
            source_interval: Duration::from_secs(1),
            server_burst: 5,
            server_interval: Duration::from_millis(100),
            memory: Duration::from_secs(60),
            sources_max: 4,
        }
    }

    /// Fails `src` until refused; returns how many failures were judged.
    fn fail_until_refused(t: &mut Throttle, src: Source, now: Instant) -> u32 {
        let mut n = 0;
        while t.check(src, now).is_ok() {
            t.failed(src, now);
            n += 1;
            assert!(n < 1000, "never refused");
        }
        n
    }

    #[test]
    fn a_source_gets_its_burst_then_one_failure_per_interval() {
        let mut t = Throttle::new(limits());
        let t0 = Instant::now();
        let a = ip("10.0.0.1");
        assert_eq!(fail_until_refused(&mut t, a, t0), 3);
        let e = t.check(a, t0).unwrap_err();
        assert!(!e.server_wide);
        assert_eq!(e.retry_after, Duration::from_secs(1), "{e:?}");
        // Refused attempts are not counted: one interval later, one more.
        for _ in 0..100 {
            assert!(t.check(a, t0).is_err());
        }
        let t1 = t0 + Duration::from_secs(1);
        assert_eq!(fail_until_refused(&mut t, a, t1), 1);
        // Another source is judged all along.
        assert!(t.check(ip("10.0.0.2"), t1).is_ok());
        // A whole burst comes back after burst intervals.
        assert_eq!(
            fail_until_refused(&mut t, a, t1 + Duration::from_secs(3)),
            3
        );
    }

    #[test]
    fn ipv6_counts_per_64_and_mapped_ipv4_as_ipv4() {
        assert_eq!(ip("2001:db8::1"), ip("2001:db8::ffff:1"));
        assert_ne!(ip("2001:db8::1"), ip("2001:db8:0:1::1"));
        assert_eq!(ip("::ffff:10.0.0.1"), ip("10.0.0.1"));
        let mut t = Throttle::new(limits());
        let now = Instant::now();
        assert_eq!(fail_until_refused(&mut t, ip("2001:db8::1"), now), 3);
        assert!(t.check(ip("2001:db8::2"), now).is_err(), "same /64");
    }

    #[test]
    fn a_spent_server_allowance_refuses_recent_failers_only() {
        let mut t = Throttle::new(Limits {
            sources_max: 100,
            ..limits()
        });
        let now = Instant::now();
        // Five sources fail once each: the server-wide burst is spent.
        for i in 0..5 {
            let s = Source::User(i);
            assert!(t.check(s, now).is_ok());
            t.failed(s, now);
        }
        // Each has failed only once, but the server refuses them...
        let e = t.check(Source::User(0), now).unwrap_err();
        assert!(e.server_wide, "{e:?}");
        // ...and judges a source that never failed (a client holding the
        // secret).
        assert!(t.check(Source::User(99), now).is_ok());
        // It comes back as the server's allowance refills.
        assert!(t
            .check(Source::User(0), now + Duration::from_millis(100))
            .is_ok());
    }

    #[test]
    fn the_table_is_bounded_and_forgets_the_oldest_and_the_stale() {
        let mut t = Throttle::new(Limits {
            server_burst: 1000,
            ..limits()
        });
        let t0 = Instant::now();
        for i in 0..4 {
            t.failed(Source::User(i), t0 + Duration::from_millis(u64::from(i)));
        }
        assert_eq!(t.sources(), 4);
        t.failed(Source::User(10), t0 + Duration::from_millis(10));
        assert_eq!(t.sources(), 4, "bounded");
        assert!(
            !t.sources.contains_key(&Source::User(0)),
            "oldest forgotten"
        );
        // After the memory, an entry is dropped when next seen.
        let later = t0 + Duration::from_secs(61);
        assert_eq!(fail_until_refused(&mut t, Source::User(1), later), 3);
        // The stale ones make room first...
        for i in 20..23 {
            t.failed(Source::User(i), later + Duration::from_millis(u64::from(i)));
        }
        assert_eq!(t.sources(), 4);
        assert!(t.sources.contains_key(&Source::User(1)), "recent kept");
        // ...then the least recent failer.
        t.failed(Source::User(30), later + Duration::from_millis(30));
        assert_eq!(t.sources(), 4);
        assert!(!t.sources.contains_key(&Source::User(1)));
    }

    #[test]
    fn attempt_judges_only_unthrottled_sources_and_counts_wrong_ones() {
        let t = SharedThrottle::new(limits());
        let a = Source::Unknown;
        let mut judged = 0;
        for _ in 0..10 {
            let _ = t.attempt(a, || {
                judged += 1;
                false
            });
        }
        assert_eq!(judged, 3, "past the burst, nothing is judged");
        // A right secret from another source is judged at once.
        assert_eq!(t.attempt(ip("127.0.0.2"), || true), Ok(true));
    }
}
