//! Moving slots between servers while they serve: growing a cluster
//! (`fabrickv cluster add`), shrinking it (`cluster remove`) and evening
//! it out (`cluster rebalance`).
//!
//! A move reuses what a returning replica already goes through. The
//! slots leaving a group are split out into a group of their own, led by
//! the same primary with the same backups, with the new owner *joining*
//! it and named its `moving_to`. The primary streams the joiner the
//! slots and then ships it every write, synchronously, as to a backup;
//! once the joiner has everything the primary promotes it (as it
//! promotes any joiner), and the group is *handing over*: the primary
//! runs no more commands on its slots, waits until every write it made
//! has reached every copy, and then commits the map in which the new
//! owner leads ([`SlotMap::handed_over`]). Clients refused meanwhile
//! retry, and follow the new map from the watch. No write is lost: every
//! acknowledged write is on every in-sync copy, the new owner among them,
//! before the owner changes; and no write runs twice, as the old primary
//! runs none once the handing over begins.
//!
//! Group numbers never change during a move (new groups are appended,
//! and a group whose every slot leaves moves whole), because a primary's
//! streams to its joiners name their group by number.

use std::collections::BTreeMap;

use crate::slots::{ReplicaGroup, SlotMap, SlotRange, SLOTS};
use crate::CLUSTER_SERVERS_MAX;

/// One planned move: these slots go to server `to`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Move {
    /// The slots, as ranges in slot order.
    pub slots: Vec<SlotRange>,
    /// Their new primary.
    pub to: u32,
}

impl Move {
    /// Slots the move carries.
    pub fn count(&self) -> u32 {
        self.slots.iter().map(SlotRange::count).sum()
    }
}

/// Ranges in slot order from a per-slot selection.
fn runs(selected: &[bool]) -> Vec<SlotRange> {
    let mut out = Vec::new();
    let mut start: Option<u16> = None;
    for (s, &on) in selected.iter().enumerate() {
        match (on, start) {
            (true, None) => start = Some(s as u16),
            (false, Some(first)) => {
                out.push(SlotRange {
                    first,
                    last: s as u16 - 1,
                });
                start = None;
            }
            _ => {}
        }
    }
    if let Some(first) = start {
        out.push(SlotRange {
            first,
            last: SLOTS - 1,
        });
    }
    out
}

fn mark(ranges: &[SlotRange]) -> Vec<bool> {
    let mut on = vec![false; usize::from(SLOTS)];
    for r in ranges {
        for s in r.first..=r.last.min(SLOTS - 1) {
            on[usize::from(s)] = true;
        }
    }
    on
}

impl ReplicaGroup {
    /// Whether the group is being handed over: the server it moves to
    /// has every write (it is in the in-sync set), so its primary runs
    /// nothing more on the group's slots until the map names the new
    /// owner.
    pub fn handing_over(&self) -> bool {
        self.moving_to.is_some_and(|to| self.backups.contains(&to))
    }
}

impl SlotMap {
    /// Whether any group is moving.
    pub fn moving(&self) -> bool {
        self.groups.iter().any(|g| g.moving_to.is_some())
    }

    /// This map at the next epoch with `moves` begun (see the module's
    /// doc): each move's slots split out of their groups into groups of
    /// their own, the new owner joining them. Slots the new owner leads
    /// already stay. A server id at or past the map's size grows it.
    /// Refused if a slot is in a group already moving, or a move names no
    /// slots or an impossible server.
    pub fn with_moves(&self, moves: &[Move]) -> Result<SlotMap, String> {
        let mut next = self.clone();
        let mut routes = self.routes();
        for m in moves {
            if m.to >= CLUSTER_SERVERS_MAX {
                return Err(format!("server {} is past the cluster's limit", m.to));
            }
            next.size = next.size.max(m.to + 1);
            let wanted = mark(&m.slots);
            // Per source group, the slots of the move it holds.
            let mut by_group: BTreeMap<usize, Vec<bool>> = BTreeMap::new();
            for s in 0..SLOTS {
                if wanted[usize::from(s)] {
                    let g = routes.group_of(s);
                    by_group
                        .entry(g)
                        .or_insert_with(|| vec![false; usize::from(SLOTS)])[usize::from(s)] = true;
                }
            }
            for (gi, leaving) in by_group {
                let g = &next.groups[gi];
                if g.moving_to.is_some() {
                    return Err(format!(
                        "slots {} are moving already; wait for that move to end",
                        fmt_ranges(&runs(&leaving))
                    ));
                }
                if g.primary == m.to {
                    continue;
                }
                let all = mark(&g.ranges);
                let staying: Vec<bool> = all.iter().zip(&leaving).map(|(a, l)| *a && !l).collect();
                let mut moved = g.clone();
                moved.ranges = runs(&leaving);
                moved.moving_to = Some(m.to);
                if !moved.holds(m.to) {
                    moved.joining.push(m.to);
                }
                if staying.iter().any(|&b| b) {
                    next.groups[gi].ranges = runs(&staying);
                    next.groups.push(moved);
                } else {
                    next.groups[gi] = moved;
                }
            }
            routes = next.routes();
        }
        if next == *self {
            return Err("nothing to move: every slot named is led by its target already".into());
        }
        next.epoch = self.epoch + 1;
        next.validate()?;
        Ok(next)
    }

    /// This map at the next epoch with group `group` handed to the server
    /// it moves to, once that server is in sync: it leads, since this
    /// epoch; the old primary stays as a backup when the cluster keeps
    /// more copies than the group has left, and copies beyond the
    /// cluster's count are let go, the old primary's first. `None` if
    /// the group is not handing over.
    pub fn handed_over(&self, group: usize) -> Option<SlotMap> {
        let g = self.groups.get(group)?;
        let to = g.moving_to?;
        if !g.backups.contains(&to) {
            return None;
        }
        let mut next = self.clone();
        let h = &mut next.groups[group];
        let old = h.primary;
        h.backups.retain(|&s| s != to);
        h.backups.push(old);
        h.backups.truncate(usize::from(self.replicas) - 1);
        h.primary = to;
        h.moving_to = None;
        h.since = self.epoch + 1;
        next.epoch = self.epoch + 1;
        Some(next)
    }

    /// The moves that give server `id` (new, or leading less than its
    /// share) an even share of the slots: what `fabrickv cluster add`
    /// commits. Slots come from the servers leading the most, from the
    /// end of what each leads.
    pub fn plan_add(&self, id: u32) -> Vec<Move> {
        let mut members = self.members();
        if !members.contains(&id) {
            members.push(id);
        }
        self.plan_even(&members)
    }

    /// The moves that take every slot server `id` leads to the others,
    /// evenly (`fabrickv cluster remove`). Its backup copies are replaced
    /// by [`SlotMap::without_copies_on`] once it leads nothing.
    pub fn plan_remove(&self, id: u32) -> Vec<Move> {
        let members: Vec<u32> = self.members().into_iter().filter(|&s| s != id).collect();
        self.plan_even(&members)
    }

    /// The moves that even out the slots led per server among the servers
    /// holding copies now (`fabrickv cluster rebalance`).
    pub fn plan_rebalance(&self) -> Vec<Move> {
        self.plan_even(&self.members())
    }

    /// Servers holding any copy of any slot, in id order.
    pub fn members(&self) -> Vec<u32> {
        let mut m: Vec<u32> = self
            .groups
            .iter()
            .flat_map(|g| g.servers().chain(g.joining.iter().copied()))
            .collect();
        m.sort_unstable();
        m.dedup();
        m
    }

    /// Moves that leave each of `members` leading `SLOTS / n` slots (the
    /// first `SLOTS % n` one more); servers outside `members` give away
    /// all they lead.
    fn plan_even(&self, members: &[u32]) -> Vec<Move> {
        if members.is_empty() {
            return Vec::new();
        }
        let n = members.len() as u32;
        let total = u32::from(SLOTS);
        let share = |i: usize| total / n + u32::from((i as u32) < total % n);
        // What each server leads, in slot order.
        let mut led: BTreeMap<u32, Vec<u16>> = BTreeMap::new();
        let routes = self.routes();
        for s in 0..SLOTS {
            let g = &self.groups[routes.group_of(s)];
            led.entry(g.primary).or_default().push(s);
        }
        // Servers leading the most are given the larger shares, so fewer
        // slots move.
        let mut order: Vec<u32> = members.to_vec();
        order.sort_by_key(|s| std::cmp::Reverse(led.get(s).map_or(0, Vec::len)));
        let target: BTreeMap<u32, u32> = order
            .iter()
            .enumerate()
            .map(|(i, &s)| (s, share(i)))
            .collect();
        // Slots given away: from the end of each donor's slots.
        let mut pool: Vec<u16> = Vec::new();
        for (&s, slots) in &mut led {
            let keep = target.get(&s).copied().unwrap_or(0) as usize;
            if slots.len() > keep {
                pool.extend(slots.drain(keep..));
            }
        }
        pool.sort_unstable();
        let mut moves = Vec::new();
        let mut at = 0;
        for &s in members {
            let has = led.get(&s).map_or(0, Vec::len) as u32;
            let want = target[&s].saturating_sub(has) as usize;
            if want == 0 || at >= pool.len() {
                continue;
            }
            let take = &pool[at..(at + want).min(pool.len())];
            at += take.len();
            let mut on = vec![false; usize::from(SLOTS)];
            for &x in take {
                on[usize::from(x)] = true;
            }
            moves.push(Move {
                slots: runs(&on),
                to: s,
            });
        }
        moves
    }

    /// This map at the next epoch with server `id` holding no backup or
    /// joining copy: each such copy is replaced by a joiner chosen among
    /// the other members (the one in the fewest groups), so the group
    /// gets back to the cluster's count once it is streamed. `None` if it
    /// holds none, or still leads a group (move those first).
    pub fn without_copies_on(&self, id: u32) -> Option<SlotMap> {
        if self.groups.iter().any(|g| g.primary == id) {
            return None;
        }
        let others: Vec<u32> = self.members().into_iter().filter(|&s| s != id).collect();
        let mut next = self.clone();
        let mut changed = false;
        for gi in 0..next.groups.len() {
            let g = &next.groups[gi];
            if !g.followers().any(|s| s == id) {
                continue;
            }
            let load = |s: u32| next.groups.iter().filter(|g| g.holds(s)).count();
            let stand_in = others
                .iter()
                .copied()
                .filter(|&s| !g.holds(s))
                .min_by_key(|&s| (load(s), s));
            let g = &mut next.groups[gi];
            g.backups.retain(|&s| s != id);
            g.joining.retain(|&s| s != id);
            if let Some(s) = stand_in {
                g.joining.push(s);
            }
            changed = true;
        }
        changed.then(|| {
            next.epoch = self.epoch + 1;
            next
        })
    }
}

/// Ranges as `a-b,c-d`.
pub fn fmt_ranges(ranges: &[SlotRange]) -> String {
    let parts: Vec<String> = ranges
        .iter()
        .map(|r| {
            if r.first == r.last {
                r.first.to_string()
            } else {
                format!("{}-{}", r.first, r.last)
            }
        })
        .collect();
    parts.join(",")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn led(map: &SlotMap, id: u32) -> u32 {
        map.led_by(id).iter().map(SlotRange::count).sum()
    }

    /// Runs a plan to its end as the servers would: every joiner
    /// promoted, every group handed over.
    fn finish(mut map: SlotMap) -> SlotMap {
        loop {
            let step = (0..map.groups.len()).find_map(|g| {
                let grp = &map.groups[g];
                match grp.joining.first() {
                    Some(&j) => map.promoted(g, j),
                    None => map.handed_over(g),
                }
            });
            match step {
                Some(next) => {
                    next.validate().expect("every step is a valid map");
                    assert_eq!(next.epoch, map.epoch + 1);
                    map = next;
                }
                None => return map,
            }
        }
    }

    #[test]
    fn adding_a_fourth_server_moves_a_quarter_of_the_slots_to_it() {
        for replicas in 1..=3u8 {
            let map = SlotMap::initial(3, replicas).expect("map");
            let plan = map.plan_add(3);
            let moved: u32 = plan.iter().map(Move::count).sum();
            assert_eq!(moved, u32::from(SLOTS) / 4, "a quarter, no more");
            assert!(plan.iter().all(|m| m.to == 3));
            let begun = map.with_moves(&plan).expect("valid");
            assert_eq!(begun.size, 4);
            assert!(begun.moving());
            // Until the handing over, the old primaries lead every slot.
            assert_eq!(led(&begun, 3), 0);
            let done = finish(begun);
            assert!(!done.moving());
            for id in 0..4 {
                let n = led(&done, id);
                assert!((4095..=4096).contains(&n), "server {id} leads {n}");
            }
            for g in &done.groups {
                assert_eq!(g.servers().count(), usize::from(replicas), "{g:?}");
                assert!(g.joining.is_empty());
            }
        }
    }

    #[test]
    fn removing_a_server_moves_only_its_slots_and_then_its_copies() {
        let map = SlotMap::initial(4, 2).expect("map");
        let before = map.routes();
        let plan = map.plan_remove(2);
        assert_eq!(plan.iter().map(Move::count).sum::<u32>(), led(&map, 2));
        let done = finish(map.with_moves(&plan).expect("valid"));
        assert_eq!(led(&done, 2), 0);
        let after = done.routes();
        for s in 0..SLOTS {
            let (was, now) = (
                map.groups[before.group_of(s)].primary,
                done.groups[after.group_of(s)].primary,
            );
            assert!(was == now || was == 2, "slot {s} moved from {was} to {now}");
        }
        let out = finish(
            done.without_copies_on(2)
                .expect("server 2 backs up a group"),
        );
        assert!(out.groups.iter().all(|g| !g.holds(2)));
        assert!(out
            .groups
            .iter()
            .all(|g| g.servers().count() == 2 && g.joining.is_empty()));
        assert_eq!(out.members(), vec![0, 1, 3]);
        assert!(out.without_copies_on(2).is_none());
    }

    #[test]
    fn rebalance_evens_out_and_a_moving_group_is_not_moved_again() {
        let map = SlotMap::initial(2, 1).expect("map");
        // Server 0 takes almost everything.
        let lopsided = finish(
            map.with_moves(&[Move {
                slots: vec![SlotRange {
                    first: 8192,
                    last: 16_000,
                }],
                to: 0,
            }])
            .expect("valid"),
        );
        assert_eq!(led(&lopsided, 1), 16_383 - 16_000);
        let plan = lopsided.plan_rebalance();
        let begun = lopsided.with_moves(&plan).expect("valid");
        assert!(
            begun.with_moves(&plan).is_err(),
            "the same slots again while they move"
        );
        let even = finish(begun);
        assert_eq!((led(&even, 0), led(&even, 1)), (8192, 8192));
        assert!(even.plan_rebalance().is_empty(), "nothing left to even");
        assert!(
            even.with_moves(&[Move {
                slots: even.led_by(0),
                to: 0
            }])
            .is_err(),
            "moving slots to their own primary"
        );
    }

    #[test]
    fn a_failover_during_a_move_is_a_valid_map() {
        let map = SlotMap::initial(3, 2).expect("map");
        let begun = map.with_moves(&map.plan_add(3)).expect("valid");
        // The target dies while joining: its move is dropped.
        let without_target = begun.without(3).expect("it held roles");
        without_target.validate().expect("valid");
        assert!(!without_target.moving());
        // A source primary dies: its backup leads the moving group on.
        let without_source = begun.without(0).expect("it led");
        without_source.validate().expect("valid");
        assert!(without_source.moving());
    }
}
