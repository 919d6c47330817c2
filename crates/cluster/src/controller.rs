//! The failover controller of a replicated cluster
//! (`fabrickv cluster controller`).
//!
//! Candidates campaign in an etcd election (so several may run, and one
//! leads; a standby takes over when the leader's etcd lease lapses, and a
//! leader that finds its lease lapsed stops acting and campaigns again). The
//! leader takes every server's heartbeats ([`crate::heartbeat`]) and
//! changes the slot map, always by compare-and-swap on its revision:
//! - a server run it hears from for the first time is *stamped*: its
//!   incarnation is written into the map, and a different incarnation
//!   than the map's (the process restarted, empty) first drops every role
//!   the old run held;
//! - a server silent for [`DEAD_AFTER_MS`] is removed from every group,
//!   each group it led taken over by its first backup (whose copy is
//!   complete: replication is synchronous);
//! - a live server missing from a group it belongs to is added to it as a
//!   *joiner*; the group's primary streams it the slots and promotes it
//!   into the in-sync set itself.
//!
//! The controller grants a lease only to a run whose incarnation the map
//! holds and which has seen the map's current epoch, so a deposed primary
//! cannot get a lease back before it knows it was deposed. One change is
//! made at a time: the next waits until the watch has shown the last.

use std::net::UdpSocket;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use fabrickv_auth::Secret;

use crate::etcd::{ClusterView, EtcdRegistry, Leadership};
use crate::heartbeat::{Beat, BeatKind, DEAD_AFTER_MS, HEARTBEAT_BYTES};
use crate::slots::SlotMap;
use crate::RegistryError;

/// How often the leader looks for silent servers and changes to make,
/// in milliseconds (also its longest wait for a heartbeat).
pub const CONTROLLER_TICK_MS: u64 = 5;

/// A gap between two of the leader's ticks past which it concludes it
/// was not running, in milliseconds (its tick is
/// [`CONTROLLER_TICK_MS`]).
pub const CONTROLLER_STALL_MS: u64 = 100;

/// How long a server the map has never stamped (one that has not served
/// since the cluster was made) may stay silent before its groups fail
/// over, in milliseconds. Servers of a new cluster start a moment apart;
/// failing over one that is still starting would leave another server
/// leading two groups for good, while waiting costs its slots at most
/// this long if it never comes.
pub const UNSTAMPED_GRACE_MS: u64 = 10_000;

/// How long a controller that lost its lease waits between failed
/// campaigns, in milliseconds.
pub const CONTROLLER_RECAMPAIGN_MS: u64 = 200;

/// Longest wait for the watch to show a change the controller made
/// before it makes another, in milliseconds.
pub const CHANGE_SETTLE_MS: u64 = 1_000;

/// What the leader knows of one server.
#[derive(Debug, Clone, Copy)]
struct Heard {
    /// When its last beat arrived.
    at: Instant,
    /// The incarnation that beat carried (0: never heard).
    incarnation: u64,
}

/// One map change the leader decided, for its log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    /// A server run's incarnation written into the map.
    Stamped { id: u32, incarnation: u64 },
    /// A silent server removed from every group.
    FailedOver { id: u32, silent_ms: u64 },
    /// A server added to groups as a joiner.
    Joining { id: u32 },
}

/// The leader's decisions, apart from its sockets and etcd (so that they
/// can be tested on a simulated clock).
#[derive(Debug)]
pub struct Decider {
    heard: Vec<Heard>,
    /// Before this, nobody is declared dead: a new leader first gives
    /// every server one full silence period to be heard.
    grace_until: Instant,
}

impl Decider {
    /// A leader elected at `now`.
    pub fn new(now: Instant) -> Decider {
        Decider {
            heard: Vec::new(),
            grace_until: now + Duration::from_millis(DEAD_AFTER_MS),
        }
    }

    /// Records beat `b` arriving at `now` and says whether to grant it a
    /// lease under `map`.
    pub fn on_beat(&mut self, b: &Beat, map: Option<&SlotMap>, now: Instant) -> bool {
        let Some(map) = map else {
            return false;
        };
        // A server past the map's size is one started to be added
        // (`fabrickv cluster add`): it is stamped like the others, so that
        // it can take the streams of the slots moved to it.
        if b.id >= crate::CLUSTER_SERVERS_MAX {
            return false;
        }
        let i = b.id as usize;
        if self.heard.len() <= i {
            self.heard.resize(
                i + 1,
                Heard {
                    at: now,
                    incarnation: 0,
                },
            );
        }
        self.heard[i] = Heard {
            at: now,
            incarnation: b.incarnation,
        };
        map.incarnation_of(b.id) == b.incarnation && b.epoch >= map.epoch
    }

    /// Treats every server as heard at `now`: after the controller itself
    /// did not run for a while, silences it measured are not the servers'.
    pub fn forgive(&mut self, now: Instant) {
        for h in &mut self.heard {
            h.at = now;
        }
    }

    fn heard(&self, id: u32) -> Option<Heard> {
        self.heard.get(id as usize).copied()
    }

    /// The next change to make to `map` at `now`, if any: stamps first,
    /// then failovers, then joiners (only servers `registered` says have a
    /// descriptor a primary can stream to).
    pub fn next_change(
        &self,
        map: &SlotMap,
        now: Instant,
        registered: &dyn Fn(u32) -> bool,
    ) -> Option<(SlotMap, Change)> {
        if map.replicas < 2 {
            // One copy: nothing to fail over to, nothing to stream.
            return None;
        }
        let alive =
            |h: Heard| now.saturating_duration_since(h.at).as_millis() < u128::from(DEAD_AFTER_MS);
        for id in 0..(self.heard.len() as u32).max(map.size) {
            if let Some(h) = self.heard(id).filter(|h| h.incarnation != 0 && alive(*h)) {
                if let Some(next) = map.stamped(id, h.incarnation) {
                    return Some((
                        next,
                        Change::Stamped {
                            id,
                            incarnation: h.incarnation,
                        },
                    ));
                }
            }
        }
        if now >= self.grace_until {
            for id in 0..map.size {
                let silent = match self.heard(id) {
                    Some(h) if h.incarnation != 0 => now.saturating_duration_since(h.at),
                    _ => {
                        now.saturating_duration_since(self.grace_until)
                            + Duration::from_millis(DEAD_AFTER_MS)
                    }
                };
                let dead_after = if map.incarnation_of(id) == 0 {
                    UNSTAMPED_GRACE_MS
                } else {
                    DEAD_AFTER_MS
                };
                if silent.as_millis() < u128::from(dead_after) {
                    continue;
                }
                if let Some(next) = map.without(id) {
                    return Some((
                        next,
                        Change::FailedOver {
                            id,
                            silent_ms: silent.as_millis() as u64,
                        },
                    ));
                }
            }
        }
        for id in 0..map.size {
            let stamped = self
                .heard(id)
                .is_some_and(|h| alive(h) && h.incarnation == map.incarnation_of(id));
            if stamped && registered(id) {
                if let Some(next) = map.with_joiner(id) {
                    return Some((next, Change::Joining { id }));
                }
            }
        }
        None
    }
}

/// Runs a controller candidate for `registry`'s cluster, taking
/// heartbeats on UDP `listen`, until `stop` is set. A leader that loses
/// its etcd lease (its process or etcd starved for a lease's time on a
/// busy machine) stops acting at once, since a standby may lead now, and
/// campaigns again: a cluster whose only controller exited would never
/// fail over again. Only the first campaign's error is returned (etcd
/// unreachable at start); later ones are retried.
pub fn run(
    registry: &EtcdRegistry,
    secret: Option<&Secret>,
    listen: &str,
    stop: &AtomicBool,
) -> Result<(), RegistryError> {
    let sock = UdpSocket::bind(listen)
        .map_err(|e| RegistryError::Invalid(format!("controller: cannot bind {listen}: {e}")))?;
    sock.set_read_timeout(Some(Duration::from_millis(CONTROLLER_TICK_MS)))
        .map_err(|e| RegistryError::Invalid(e.to_string()))?;
    let addr = sock
        .local_addr()
        .map_err(|e| RegistryError::Invalid(e.to_string()))?
        .to_string();
    let cluster = registry.cluster().to_string();
    eprintln!("fabrickv: controller of cluster {cluster}: campaigning (heartbeats on udp {addr})");
    let mut leadership = registry.campaign(&addr)?;
    crate::heartbeat::raise_priority();
    loop {
        eprintln!("fabrickv: controller of cluster {cluster}: elected (Ctrl-C to stop)");
        lead(registry, secret, &sock, &leadership, stop);
        drop(leadership);
        if stop.load(Ordering::Acquire) {
            return Ok(());
        }
        eprintln!(
            "fabrickv: controller of cluster {cluster}: lost its etcd lease \
             (another candidate may lead); campaigning again"
        );
        leadership = loop {
            match registry.campaign(&addr) {
                Ok(l) => break l,
                Err(e) if !stop.load(Ordering::Acquire) => {
                    tracing::warn!("controller: cannot campaign: {e}");
                    std::thread::sleep(Duration::from_millis(CONTROLLER_RECAMPAIGN_MS));
                }
                Err(_) => return Ok(()),
            }
        };
    }
}

/// Leads while `leadership` holds and `stop` is not set: takes beats on
/// `sock`, answers them, and commits the changes the map needs.
fn lead(
    registry: &EtcdRegistry,
    secret: Option<&Secret>,
    sock: &UdpSocket,
    leadership: &Leadership,
    stop: &AtomicBool,
) {
    let cluster = registry.cluster();
    let (tx, rx) = mpsc::channel::<ClusterView>();
    let _watch = registry.watch(move |v| {
        let _ = tx.send(v);
    });
    let mut decider = Decider::new(Instant::now());
    let mut view: Option<ClusterView> = None;
    // The epoch of the last change made, until the watch shows it.
    let mut awaiting: Option<(u64, Instant)> = None;
    let mut last_tick = Instant::now();
    let mut buf = [0u8; HEARTBEAT_BYTES + 1];
    while !stop.load(Ordering::Acquire) {
        if leadership.lost() {
            return;
        }
        while let Ok(v) = rx.try_recv() {
            view = Some(v);
        }
        let map = view.as_ref().and_then(|v| v.map.as_ref());
        match sock.recv_from(&mut buf) {
            Ok((n, from)) => {
                if let Some(b) = Beat::decode(&buf[..n], secret, cluster) {
                    if b.kind == BeatKind::Beat {
                        let grant = decider.on_beat(&b, map.map(|(m, _)| m), Instant::now());
                        let answer = Beat {
                            kind: if grant {
                                BeatKind::Granted
                            } else {
                                BeatKind::Refused
                            },
                            epoch: map.map_or(0, |(m, _)| m.epoch),
                            ..b
                        };
                        let _ = sock.send_to(&answer.encode(secret, cluster), from);
                    }
                }
            }
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) => {}
            Err(e) => tracing::warn!("controller: heartbeat socket: {e}"),
        }
        let gap = last_tick.elapsed();
        if gap < Duration::from_millis(CONTROLLER_TICK_MS) {
            continue;
        }
        last_tick = Instant::now();
        if gap >= Duration::from_millis(CONTROLLER_STALL_MS) {
            // This process was not running (starved, stopped): the
            // silence it would see is its own. Everyone gets a fresh
            // period to be heard.
            tracing::warn!("controller: did not run for {gap:?}; not judging silences now");
            decider.forgive(last_tick);
            continue;
        }
        let Some((map, rev)) = map.cloned() else {
            continue;
        };
        if let Some((epoch, since)) = awaiting {
            if map.epoch < epoch && since.elapsed() < Duration::from_millis(CHANGE_SETTLE_MS) {
                continue;
            }
            awaiting = None;
        }
        let registered = |id: u32| {
            view.as_ref()
                .and_then(|v| v.server(id))
                .is_some_and(|d| d.repl.is_some())
        };
        let Some((next, change)) = decider.next_change(&map, Instant::now(), &registered) else {
            continue;
        };
        let began = Instant::now();
        match registry.swap_map(rev, &next) {
            Ok(true) => {
                eprintln!(
                    "fabrickv: controller: {change:?}: slot map epoch {} committed in {:.1} ms",
                    next.epoch,
                    began.elapsed().as_secs_f64() * 1e3
                );
                awaiting = Some((next.epoch, Instant::now()));
            }
            // Another change won: the watch brings it.
            Ok(false) => awaiting = Some((map.epoch + 1, Instant::now())),
            Err(e) => tracing::warn!("controller: cannot change the slot map: {e}"),
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn beat(id: u32, incarnation: u64, epoch: u64) -> Beat {
        Beat {
            kind: BeatKind::Beat,
            id,
            seq: 1,
            incarnation,
            epoch,
        }
    }

    #[test]
    fn stamps_then_fails_over_a_silent_primary_then_takes_it_back_as_a_joiner() {
        let t0 = Instant::now();
        let mut map = SlotMap::initial(3, 2).unwrap();
        let mut d = Decider::new(t0);
        for id in 0..3 {
            assert!(
                !d.on_beat(&beat(id, 10 + u64::from(id), 1), Some(&map), t0),
                "not stamped yet"
            );
        }
        for id in 0..3 {
            let (next, change) = d.next_change(&map, t0, &|_| true).unwrap();
            assert_eq!(
                change,
                Change::Stamped {
                    id,
                    incarnation: 10 + u64::from(id)
                }
            );
            map = next;
        }
        assert!(d.next_change(&map, t0, &|_| true).is_none(), "settled");
        assert!(
            d.on_beat(&beat(0, 10, map.epoch), Some(&map), t0),
            "stamped and current"
        );
        assert!(
            !d.on_beat(&beat(0, 10, map.epoch - 1), Some(&map), t0),
            "an old map: no lease"
        );
        // Servers 0 and 2 keep beating; 1 falls silent.
        let later = t0 + Duration::from_millis(DEAD_AFTER_MS + 10);
        d.on_beat(&beat(0, 10, map.epoch), Some(&map), later);
        d.on_beat(&beat(2, 12, map.epoch), Some(&map), later);
        let (next, change) = d.next_change(&map, later, &|_| true).unwrap();
        assert!(
            matches!(change, Change::FailedOver { id: 1, .. }),
            "{change:?}"
        );
        assert_eq!(next.groups[1].primary, 2, "its backup leads its slots");
        assert!(next.groups[0].backups.is_empty());
        map = next;
        // It comes back, same run (it was frozen): it joins the groups it belongs to.
        d.on_beat(&beat(1, 11, map.epoch), Some(&map), later);
        let (next, change) = d.next_change(&map, later, &|_| true).unwrap();
        assert_eq!(change, Change::Joining { id: 1 });
        assert_eq!(next.groups[0].joining, [1]);
        assert_eq!(next.groups[1].joining, [1]);
        map = next;
        // A restarted run of server 2 (a new incarnation) loses its roles at once.
        d.on_beat(&beat(2, 99, map.epoch), Some(&map), later);
        let (next, change) = d.next_change(&map, later, &|_| true).unwrap();
        assert_eq!(
            change,
            Change::Stamped {
                id: 2,
                incarnation: 99
            }
        );
        assert!(next
            .groups
            .iter()
            .all(|g| !g.backups.contains(&2) && g.primary != 2 || g.backups.is_empty()));
    }

    #[test]
    fn a_server_still_starting_is_given_time_before_its_groups_fail_over() {
        let t0 = Instant::now();
        let mut map = SlotMap::initial(3, 2).unwrap();
        let mut d = Decider::new(t0);
        for id in 0..2 {
            d.on_beat(&beat(id, 10 + u64::from(id), 1), Some(&map), t0);
            map = d.next_change(&map, t0, &|_| true).unwrap().0;
        }
        // Server 2 has not started: past the usual silence, its groups
        // wait for it.
        let later = t0 + Duration::from_millis(DEAD_AFTER_MS * 4);
        for id in 0..2 {
            d.on_beat(&beat(id, 10 + u64::from(id), map.epoch), Some(&map), later);
        }
        assert!(
            d.next_change(&map, later, &|_| true).is_none(),
            "waits for it"
        );
        // It never comes: after the grace, its slots are led by its backup.
        let much_later = t0 + Duration::from_millis(UNSTAMPED_GRACE_MS + DEAD_AFTER_MS);
        for id in 0..2 {
            d.on_beat(
                &beat(id, 10 + u64::from(id), map.epoch),
                Some(&map),
                much_later,
            );
        }
        let (next, change) = d.next_change(&map, much_later, &|_| true).unwrap();
        assert!(
            matches!(change, Change::FailedOver { id: 2, .. }),
            "{change:?}"
        );
        assert_eq!(next.groups[2].primary, 0);
    }

    #[test]
    fn a_single_copy_cluster_is_left_alone() {
        let t0 = Instant::now();
        let map = SlotMap::initial(3, 1).unwrap();
        let mut d = Decider::new(t0);
        d.on_beat(&beat(0, 5, 1), Some(&map), t0);
        assert!(d
            .next_change(&map, t0 + Duration::from_secs(5), &|_| true)
            .is_none());
    }
}
