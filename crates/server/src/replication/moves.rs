//! The primary's part in moving slots to another server
//! (`fabrickv_cluster::moves`): handing a group over once its new owner
//! is in sync, and letting go of the keys of slots this server no longer
//! holds any copy of.

use std::time::{Duration, Instant};

use fabrickv_cluster::slots::{key_slot, SlotMap, SLOTS};
use fabrickv_engine::ScanBudget;
use fabrickv_rpc::gate::Settle;
use fabrickv_types::KeyHash;

use super::Replicator;
use crate::partitions::Partitions;

/// How long a primary waits, once a group it leads is handing over,
/// before it takes its last round of the group's writes, in
/// milliseconds: a command that found the group served just before the
/// map changed is applied within this (it runs in microseconds; this
/// covers a thread descheduled on a busy host). A write applied later
/// still is caught by the fence (the server restarts and rejoins), not
/// lost.
pub const HANDOVER_QUIESCE_MS: u64 = 50;

/// How long a primary, once every write of a group it hands over is on
/// every copy, serves no more reads of the group before it commits the
/// hand-over, in milliseconds: a read that found the group served just
/// before is answered within this, so none is answered from here once
/// the new owner may have taken a write.
pub const HANDOVER_READS_QUIESCE_MS: u64 = 5;

/// Keys read per hold of a partition's lock while letting slots go.
const RELEASE_SCAN_ENTRIES: usize = 4096;

/// A group this server leads that is handing over.
#[derive(Debug, Clone, Copy)]
pub(super) struct Handover {
    /// When this server first saw it handing over.
    since: Instant,
    /// The round taken after the quiet period; once it completes every
    /// write made to the group is on every copy.
    round: Option<u64>,
    /// When reads of the group stopped here, once the round completed.
    closed: Option<Instant>,
    /// The hand-over is committed: nothing is left to do until the watch
    /// installs the map naming the new owner (etcd is not read again).
    committed: bool,
}

/// Per slot, whether a server holds a copy of it and whether it leads
/// it, in one map.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct SlotRoles {
    held: Vec<bool>,
    led: Vec<bool>,
}

impl SlotRoles {
    /// Server `me`'s roles in `map`.
    fn of(map: &SlotMap, me: u32) -> SlotRoles {
        let routes = map.routes();
        let group = |s: u16| &map.groups[routes.group_of(s)];
        SlotRoles {
            held: (0..SLOTS).map(|s| group(s).holds(me)).collect(),
            led: (0..SLOTS).map(|s| group(s).primary == me).collect(),
        }
    }

    /// The slots `self` had in a role that `now` does not.
    fn lost(&self, now: &SlotRoles) -> SlotRoles {
        let gone = |a: &[bool], b: &[bool]| a.iter().zip(b).map(|(x, y)| *x && !y).collect();
        SlotRoles {
            held: gone(&self.held, &now.held),
            led: gone(&self.led, &now.led),
        }
    }
}

impl Replicator {
    /// Hands over each group this server leads whose new owner is in
    /// sync: after [`HANDOVER_QUIESCE_MS`], one more round, and once it
    /// is acknowledged, the map naming the new owner (compare-and-swap;
    /// a change that lost is tried again at the next tick).
    pub(super) fn hand_over(&self) {
        let Some(r) = self.routing.routing() else {
            return;
        };
        let mine: Vec<usize> = r
            .map
            .groups
            .iter()
            .enumerate()
            .filter(|(_, g)| g.primary == self.me && g.handing_over())
            .map(|(i, _)| i)
            .collect();
        let mut ready = Vec::new();
        {
            let mut sh = self.lock_ship();
            sh.handovers.retain(|g, _| mine.contains(g));
            for g in mine {
                let h = *sh.handovers.entry(g).or_insert(Handover {
                    since: Instant::now(),
                    round: None,
                    closed: None,
                    committed: false,
                });
                if h.committed {
                    continue;
                }
                match (h.round, h.closed) {
                    (None, _)
                        if h.since.elapsed() >= Duration::from_millis(HANDOVER_QUIESCE_MS)
                            && self.room() =>
                    {
                        let round = self.launch(&mut sh);
                        if let Some(h) = sh.handovers.get_mut(&g) {
                            h.round = Some(round);
                        }
                    }
                    (Some(round), None) if self.done(round) => {
                        // Reads stop here only now: every write is on
                        // every copy, the new owner's included.
                        self.routing.closing().close(g);
                        if let Some(h) = sh.handovers.get_mut(&g) {
                            h.closed = Some(Instant::now());
                        }
                    }
                    (Some(_), Some(at))
                        if at.elapsed() >= Duration::from_millis(HANDOVER_READS_QUIESCE_MS) =>
                    {
                        ready.push(g)
                    }
                    _ => {}
                }
            }
        }
        for g in ready {
            let view = match self.registry.view() {
                Ok(v) => v,
                Err(e) => {
                    tracing::warn!("moves: cannot read the map to hand group {g} over: {e}");
                    return;
                }
            };
            let Some((map, rev)) = view.map else {
                return;
            };
            // Another change may have come first (a promotion, another
            // group's hand-over): the swap is against the map read now,
            // and a lost swap is tried again at the next tick, reads of
            // the group closed meanwhile.
            // A map in etcd where the group is no longer this server's to
            // hand over (committed, or the move called off) reaches the
            // routing by the watch, which opens or moves its reads then:
            // opening them here, ahead of the watch, would answer reads
            // from a copy the new owner may have moved past.
            if map
                .groups
                .get(g)
                .is_none_or(|x| x.primary != self.me || !x.handing_over())
            {
                continue;
            }
            if let Some(next) = map.handed_over(g) {
                match self.registry.swap_map(rev, &next) {
                    Ok(true) => {
                        tracing::info!(
                            "moves: group {g} handed to server {} at epoch {}",
                            next.groups[g].primary,
                            next.epoch
                        );
                        if let Some(h) = self.lock_ship().handovers.get_mut(&g) {
                            h.committed = true;
                        }
                    }
                    Ok(false) => {}
                    Err(e) => tracing::warn!("moves: cannot hand group {g} over: {e}"),
                }
            }
        }
    }

    /// Once a map leaves this server no copy of some slots it held,
    /// drops their keys and rows, and once it no longer leads some slots,
    /// their cached blocks (the cache keeps a block only on its slot's
    /// primary, and no client asks another server for it), all without
    /// journaling: the slots are others' now, and memory follows them.
    pub(super) fn release_dropped(&self) {
        let Some(r) = self.routing.routing() else {
            return;
        };
        let lost = {
            let mut sh = self.lock_ship();
            if sh.held.as_ref().is_some_and(|(e, _)| *e == r.map.epoch) {
                return;
            }
            let now = SlotRoles::of(&r.map, self.me);
            let before = sh.held.replace((r.map.epoch, now.clone()));
            let Some((_, before)) = before else {
                return;
            };
            before.lost(&now)
        };
        let now = self.unix.clock().now_ms();
        if lost.led.iter().any(|&b| b) {
            // Slots led again meanwhile keep their blocks (the map read
            // once: the pass holds the cache's lock).
            let r = self.routing.routing();
            let still_lost = |slot: u16| {
                lost.led[usize::from(slot)]
                    && r.as_ref()
                        .is_none_or(|r| r.map.groups[r.routes.group_of(slot)].primary != self.me)
            };
            let dropped = self
                .cache
                .store()
                .delete_where(&|k| still_lost(key_slot(k)));
            tracing::info!(
                "moves: {dropped} cached blocks of slots this server no longer leads let go"
            );
        }
        if !lost.held.iter().any(|&b| b) {
            return;
        }
        // Slots held again meanwhile (a new stream begun) are kept: the
        // map is read afresh for each partition.
        let still_released = |slot: u16| {
            lost.held[usize::from(slot)]
                && self
                    .routing
                    .routing()
                    .is_none_or(|r| !r.map.groups[r.routes.group_of(slot)].holds(self.me))
        };
        let dropped = drop_keys(&self.parts, now, |k| still_released(key_slot(k)));
        self.ps.drop_rows(now, &|s| still_released(s));
        tracing::info!("moves: {dropped} keys of slots this server holds no copy of let go");
    }
}

/// Deletes, without journaling, every key of `parts` that `doomed`
/// picks; returns how many. Reads a chunk of keys per hold of each
/// partition's lock, then deletes them under one more, asking `doomed`
/// again there (what it picks may have changed since the scan).
pub(crate) fn drop_keys(parts: &Partitions, now: u64, doomed: impl Fn(&[u8]) -> bool) -> usize {
    let mut n = 0;
    for p in 0..parts.len() {
        let mut keys: Vec<Vec<u8>> = Vec::new();
        let mut bucket = 0;
        loop {
            let next = parts.lock(p).unjournaled(|part| {
                let mut budget = ScanBudget {
                    entries: RELEASE_SCAN_ENTRIES,
                    words: RELEASE_SCAN_ENTRIES,
                };
                part.scan_from(bucket, now, &mut budget, &mut |k, _, _| {
                    if doomed(k) {
                        keys.push(k.to_vec());
                    }
                    true
                })
            });
            match next {
                Some(b) => bucket = b,
                None => break,
            }
        }
        parts.lock(p).unjournaled(|part| {
            for k in keys.iter().filter(|k| doomed(k)) {
                if part.delete(KeyHash::of(k), k, now) == fabrickv_engine::DeleteResult::Deleted {
                    n += 1;
                }
            }
        });
    }
    n
}
