//! The slot map of a cluster registered in etcd.
//!
//! Keys are placed as Redis Cluster places them, so that Redis cluster
//! clients route by themselves: a key's slot is CRC16 (XMODEM) of the key,
//! or of its `{hash tag}` when it has a non-empty one, modulo [`SLOTS`].
//! The map assigns slots, in ranges, to replica groups: a primary and up
//! to two backups. Every change of the map bumps its `epoch`, and the map
//! is only ever changed by a compare-and-swap in etcd, so two servers that
//! agree on an epoch agree on every owner.
//!
//! The map is data (JSON in etcd); [`SlotRoutes`] is its dense index, one
//! group number per slot, which is what a request looks up.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::CLUSTER_SERVERS_MAX;

pub use fabrickv_types::slot::{crc16, hash_tag, key_slot, SLOTS};

/// Most copies of a slot (a primary and two backups).
pub const REPLICAS_MAX: u8 = 3;

/// The most servers a group moving to another server names (see
/// `crate::moves`): its copies and the server it moves to.
pub const MOVING_GROUP_SERVERS_MAX: usize = REPLICAS_MAX as usize + 1;

/// The slot of a u64 key (embedding table rows): its little-endian bytes
/// placed as any other key, so a client in any language computes it the
/// same way.
#[inline]
pub fn slot_of_u64(key: u64) -> u16 {
    crc16(&key.to_le_bytes()) % SLOTS
}

/// An inclusive range of slots.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct SlotRange {
    /// The first slot of the range.
    pub first: u16,
    /// The last slot of the range (inclusive, as CLUSTER SLOTS counts).
    pub last: u16,
}

impl SlotRange {
    /// Slots the range holds.
    pub fn count(&self) -> u32 {
        u32::from(self.last) - u32::from(self.first) + 1
    }

    /// Whether the range holds `slot`.
    pub fn contains(&self, slot: u16) -> bool {
        (self.first..=self.last).contains(&slot)
    }
}

/// The servers holding some ranges of slots: the primary serves them and
/// orders their writes; every backup applies each write before it is
/// acknowledged.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplicaGroup {
    /// The slots the group holds.
    pub ranges: Vec<SlotRange>,
    /// The server that serves the slots.
    pub primary: u32,
    /// Servers holding an up-to-date copy: the in-sync set, each of
    /// which applies a write before the primary acknowledges it, and
    /// from which a new primary is chosen.
    #[serde(default)]
    pub backups: Vec<u32>,
    /// Servers being brought up to date (the group's slots streamed to
    /// them, then every write as to a backup); the primary moves each to
    /// `backups` once it has everything.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub joining: Vec<u32>,
    /// The epoch at which the current primary took the group over: a
    /// batch of writes its primary built at an older epoch (before a
    /// failover and a later return) is refused by the backups.
    #[serde(default)]
    pub since: u64,
    /// The server the group's slots are moving to (`fabrickv cluster
    /// add`, `remove`, `rebalance`; see [`crate::moves`]): it joins, and
    /// once it is in sync the primary hands the group over to it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub moving_to: Option<u32>,
}

impl ReplicaGroup {
    /// The primary, then the backups.
    pub fn servers(&self) -> impl Iterator<Item = u32> + '_ {
        std::iter::once(self.primary).chain(self.backups.iter().copied())
    }

    /// Every server the primary ships writes to: backups, then joiners.
    pub fn followers(&self) -> impl Iterator<Item = u32> + '_ {
        self.backups.iter().chain(self.joining.iter()).copied()
    }

    /// Whether `server` holds any copy of the group, in sync or not.
    pub fn holds(&self, server: u32) -> bool {
        self.primary == server || self.followers().any(|s| s == server)
    }
}

/// Which servers hold which slots, at one epoch.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SlotMap {
    /// Bumped by every change; a server refuses work from an older one.
    pub epoch: u64,
    /// Servers in the cluster (ids `0..size`).
    pub size: u32,
    /// Copies the cluster keeps of each slot when every server is up.
    pub replicas: u8,
    /// The groups; together their ranges cover every slot once.
    pub groups: Vec<ReplicaGroup>,
    /// Which run of each server the map's roles belong to, by id: the
    /// random incarnation a server process draws at start, stamped here by
    /// the failover controller once it hears from that run (0: not yet). A
    /// server restarted with empty memory has another incarnation, so it
    /// serves none of the roles its previous run held until the
    /// controller has moved them and brought it back as a joiner.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub incarnations: Vec<u64>,
}

impl SlotMap {
    /// The first map of a cluster of `size` servers keeping `replicas`
    /// copies: one group per server, server `i` the primary of the `i`th
    /// of `size` equal runs of slots and a backup of the runs of the
    /// `replicas - 1` servers before it (chained declustering), so that
    /// every server leads an equal share and the load of a failed
    /// primary's share falls on one neighbour.
    pub fn initial(size: u32, replicas: u8) -> Result<SlotMap, String> {
        check_shape(size, replicas)?;
        let slots = u32::from(SLOTS);
        let groups = (0..size)
            .map(|i| ReplicaGroup {
                ranges: vec![SlotRange {
                    first: (i * slots / size) as u16,
                    last: ((i + 1) * slots / size - 1) as u16,
                }],
                primary: i,
                backups: (1..u32::from(replicas)).map(|b| (i + b) % size).collect(),
                joining: Vec::new(),
                since: 1,
                moving_to: None,
            })
            .collect();
        Ok(SlotMap {
            epoch: 1,
            size,
            replicas,
            groups,
            incarnations: Vec::new(),
        })
    }

    /// The incarnation the map gives server `id` (0: none stamped).
    pub fn incarnation_of(&self, id: u32) -> u64 {
        self.incarnations.get(id as usize).copied().unwrap_or(0)
    }

    /// This map at the next epoch with `id`'s incarnation set to
    /// `incarnation`, every role it held dropped when the incarnation
    /// changes (a new run holds nothing yet); `None` if it is already so.
    pub fn stamped(&self, id: u32, incarnation: u64) -> Option<SlotMap> {
        let old = self.incarnation_of(id);
        if old == incarnation {
            return None;
        }
        let mut next = if old == 0 {
            self.clone()
        } else {
            self.without(id).unwrap_or_else(|| self.clone())
        };
        if next.incarnations.len() <= id as usize {
            next.incarnations.resize(id as usize + 1, 0);
        }
        next.incarnations[id as usize] = incarnation;
        next.epoch = self.epoch + 1;
        Some(next)
    }

    /// This map at the next epoch without server `id` in any group: where
    /// it was primary, its first backup takes over; a group whose only
    /// copy it held keeps it (there is no one to fail over to, and its
    /// slots answer an error until it is back). `None` if `id` held no
    /// role that can be given up.
    pub fn without(&self, id: u32) -> Option<SlotMap> {
        let mut next = self.clone();
        let mut changed = false;
        for g in &mut next.groups {
            let before = (g.backups.len(), g.joining.len());
            g.backups.retain(|&s| s != id);
            g.joining.retain(|&s| s != id);
            changed |= before != (g.backups.len(), g.joining.len());
            if g.primary == id && !g.backups.is_empty() {
                g.primary = g.backups.remove(0);
                g.since = self.epoch + 1;
                changed = true;
            }
            // A move to the server gone is off; one whose target now
            // leads is done.
            if g.moving_to == Some(id) || g.moving_to == Some(g.primary) {
                g.moving_to = None;
                changed = true;
            }
        }
        changed.then(|| {
            next.epoch = self.epoch + 1;
            next
        })
    }

    /// This map at the next epoch without `follower` among the backups
    /// and joiners of the groups `primary` leads: what a primary commits
    /// when it cannot reach a follower (the follower can then not be made
    /// primary of them, so acknowledging without it loses nothing). `None`
    /// if it follows none of them.
    pub fn without_follower(&self, primary: u32, follower: u32) -> Option<SlotMap> {
        let mut next = self.clone();
        let mut changed = false;
        for g in next.groups.iter_mut().filter(|g| g.primary == primary) {
            let before = g.backups.len() + g.joining.len();
            g.backups.retain(|&s| s != follower);
            g.joining.retain(|&s| s != follower);
            changed |= before != g.backups.len() + g.joining.len();
            if g.moving_to == Some(follower) {
                g.moving_to = None;
            }
        }
        changed.then(|| {
            next.epoch = self.epoch + 1;
            next
        })
    }

    /// This map at the next epoch with `id` joining every group that
    /// misses a copy and that `id` belongs to in the initial layout (the
    /// group led at first by `id` and those of the `replicas - 1` servers
    /// before it); `None` if none does.
    pub fn with_joiner(&self, id: u32) -> Option<SlotMap> {
        let mut next = self.clone();
        let mut changed = false;
        let size = self.size;
        for (i, g) in next.groups.iter_mut().enumerate() {
            let home = (0..u32::from(self.replicas)).any(|b| (i as u32 + b) % size == id);
            let copies = 1 + g.backups.len() + g.joining.len();
            if home && !g.holds(id) && copies < usize::from(self.replicas) {
                g.joining.push(id);
                changed = true;
            }
        }
        changed.then(|| {
            next.epoch = self.epoch + 1;
            next
        })
    }

    /// This map at the next epoch with joiner `id` of group `group` moved
    /// into its in-sync set; `None` if it is not joining that group.
    pub fn promoted(&self, group: usize, id: u32) -> Option<SlotMap> {
        let g = self.groups.get(group)?;
        if !g.joining.contains(&id) {
            return None;
        }
        let mut next = self.clone();
        let g = &mut next.groups[group];
        g.joining.retain(|&s| s != id);
        g.backups.push(id);
        next.epoch = self.epoch + 1;
        Some(next)
    }

    /// Checks what a map read from etcd must hold before a server or
    /// client acts on it: a sane shape, every slot in exactly one range,
    /// server ids below the size and no server twice in a group.
    pub fn validate(&self) -> Result<(), String> {
        check_shape(self.size, self.replicas)?;
        if self.groups.len() > usize::from(SLOTS) {
            return Err(format!("{} groups; at most {SLOTS}", self.groups.len()));
        }
        let mut seen = vec![false; usize::from(SLOTS)];
        for (g, group) in self.groups.iter().enumerate() {
            let mut servers: Vec<u32> = group
                .servers()
                .chain(group.joining.iter().copied())
                .collect();
            let most = if group.moving_to.is_some() {
                MOVING_GROUP_SERVERS_MAX
            } else {
                usize::from(REPLICAS_MAX)
            };
            if servers.len() > most {
                return Err(format!("group {g} has {} servers", servers.len()));
            }
            if let Some(to) = group.moving_to {
                if to == group.primary || !group.holds(to) {
                    return Err(format!(
                        "group {g} moves to server {to}, which is not joining it"
                    ));
                }
            }
            if let Some(s) = servers.iter().find(|&&s| s >= self.size) {
                return Err(format!(
                    "group {g} names server {s} of a {}-server cluster",
                    self.size
                ));
            }
            servers.sort_unstable();
            if servers.windows(2).any(|w| w[0] == w[1]) {
                return Err(format!("group {g} names a server twice"));
            }
            for r in &group.ranges {
                if r.first > r.last || r.last >= SLOTS {
                    return Err(format!("group {g}: bad range {}-{}", r.first, r.last));
                }
                for s in r.first..=r.last {
                    let slot = &mut seen[usize::from(s)];
                    if *slot {
                        return Err(format!("slot {s} is in two ranges"));
                    }
                    *slot = true;
                }
            }
        }
        if let Some(s) = seen.iter().position(|&b| !b) {
            return Err(format!("slot {s} is in no range"));
        }
        Ok(())
    }

    /// The map as JSON, as etcd stores it.
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }

    /// Parses and validates a map stored as JSON.
    pub fn from_json(text: &[u8]) -> Result<SlotMap, String> {
        let map: SlotMap = serde_json::from_slice(text).map_err(|e| e.to_string())?;
        map.validate()?;
        Ok(map)
    }

    /// The dense index of this map.
    pub fn routes(&self) -> SlotRoutes {
        let mut group_of = vec![0u16; usize::from(SLOTS)].into_boxed_slice();
        for (g, group) in self.groups.iter().enumerate() {
            for r in &group.ranges {
                for s in r.first..=r.last {
                    group_of[usize::from(s)] = g as u16;
                }
            }
        }
        SlotRoutes { group_of }
    }

    /// The slots whose primary is `server`, as ranges in slot order.
    pub fn led_by(&self, server: u32) -> Vec<SlotRange> {
        let mut ranges: Vec<SlotRange> = self
            .groups
            .iter()
            .filter(|g| g.primary == server)
            .flat_map(|g| g.ranges.iter().copied())
            .collect();
        ranges.sort_by_key(|r| r.first);
        ranges
    }
}

fn check_shape(size: u32, replicas: u8) -> Result<(), String> {
    if size == 0 || size > CLUSTER_SERVERS_MAX {
        return Err(format!(
            "a cluster has 1 to {CLUSTER_SERVERS_MAX} servers, not {size}"
        ));
    }
    if replicas == 0 || replicas > REPLICAS_MAX {
        return Err(format!("--replicas is 1 to {REPLICAS_MAX}, not {replicas}"));
    }
    if u32::from(replicas) > size {
        return Err(format!(
            "{replicas} copies of each slot need at least {replicas} servers, not {size}"
        ));
    }
    Ok(())
}

impl fmt::Display for SlotMap {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "slot map: epoch {}, {} servers, {} of each slot",
            self.epoch,
            self.size,
            if self.replicas == 1 {
                "1 copy".to_string()
            } else {
                format!("{} copies", self.replicas)
            }
        )?;
        for g in &self.groups {
            let ranges: Vec<String> = g
                .ranges
                .iter()
                .map(|r| format!("{}-{}", r.first, r.last))
                .collect();
            let backups: Vec<String> = g.backups.iter().map(u32::to_string).collect();
            write!(
                f,
                "  slots {:<12} primary {:>4}  backups [{}]",
                ranges.join(","),
                g.primary,
                backups.join(",")
            )?;
            if !g.joining.is_empty() {
                let joining: Vec<String> = g.joining.iter().map(u32::to_string).collect();
                write!(f, "  joining [{}]", joining.join(","))?;
            }
            if let Some(to) = g.moving_to {
                write!(f, "  moving to {to}")?;
            }
            writeln!(f)?;
        }
        Ok(())
    }
}

/// A map's group number for every slot: one load per request.
#[derive(Clone)]
pub struct SlotRoutes {
    group_of: Box<[u16]>,
}

impl SlotRoutes {
    /// The group (an index into the map's `groups`) holding `slot`.
    #[inline]
    pub fn group_of(&self, slot: u16) -> usize {
        usize::from(self.group_of[usize::from(slot % SLOTS)])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Values Redis itself gives (`CLUSTER KEYSLOT`), so that a Redis
    /// cluster client and FabricKV agree on every key's slot.
    #[test]
    fn slots_are_the_ones_redis_cluster_computes() {
        assert_eq!(crc16(b"123456789"), 0x31c3, "the XMODEM check value");
        assert_eq!(key_slot(b"foo"), 12182);
        assert_eq!(key_slot(b"bar"), 5061);
        assert_eq!(key_slot(b"somekey"), 11058);
        assert_eq!(key_slot(b"{user1000}.following"), key_slot(b"user1000"));
        assert_eq!(
            key_slot(b"{user1000}.following"),
            key_slot(b"{user1000}.followers")
        );
        // An empty tag does not count: the whole key is hashed.
        assert_eq!(key_slot(b"{}key"), crc16(b"{}key") % SLOTS);
        // Only the first '{' and the first '}' after it count.
        assert_eq!(key_slot(b"a{b}{c}"), key_slot(b"b"));
        assert_eq!(key_slot(b"}{b}"), key_slot(b"b"));
        assert_eq!(key_slot(b"{no close"), crc16(b"{no close") % SLOTS);
    }

    #[test]
    fn the_first_map_covers_every_slot_and_spreads_primaries_and_backups() {
        for size in [1u32, 2, 3, 5, 7, 64] {
            for replicas in 1..=REPLICAS_MAX.min(size as u8) {
                let map = SlotMap::initial(size, replicas).expect("map");
                map.validate().expect("valid");
                assert_eq!(map.groups.len(), size as usize);
                let led: u32 = (0..size)
                    .map(|s| map.led_by(s).iter().map(SlotRange::count).sum::<u32>())
                    .sum();
                assert_eq!(led, u32::from(SLOTS));
                for g in &map.groups {
                    assert_eq!(g.servers().count(), usize::from(replicas));
                    let share = g.ranges[0].count();
                    let even = u32::from(SLOTS) / size;
                    assert!(share == even || share == even + 1, "{share} vs {even}");
                }
                let back = SlotMap::from_json(map.to_json().as_bytes()).expect("round trip");
                assert_eq!(back, map);
                let routes = map.routes();
                for slot in [0, 1, SLOTS / 2, SLOTS - 1] {
                    let g = &map.groups[routes.group_of(slot)];
                    assert!(g.ranges.iter().any(|r| r.contains(slot)));
                }
            }
        }
    }

    #[test]
    fn a_map_that_breaks_a_rule_is_refused() {
        assert!(
            SlotMap::initial(2, 3).is_err(),
            "three copies on two servers"
        );
        assert!(SlotMap::initial(4, 0).is_err());
        assert!(SlotMap::initial(0, 1).is_err());
        let good = SlotMap::initial(3, 2).expect("map");
        let mut gap = good.clone();
        gap.groups[1].ranges[0].first += 1;
        assert!(gap.validate().expect_err("refused").contains("no range"));
        let mut overlap = good.clone();
        overlap.groups[1].ranges[0].first -= 1;
        assert!(overlap
            .validate()
            .expect_err("refused")
            .contains("two ranges"));
        let mut twice = good.clone();
        twice.groups[0].backups = vec![0];
        assert!(twice.validate().expect_err("refused").contains("twice"));
        let mut stranger = good.clone();
        stranger.groups[0].backups = vec![9];
        assert!(stranger
            .validate()
            .expect_err("refused")
            .contains("server 9"));
        assert!(SlotMap::from_json(b"{\"epoch\":1}").is_err());
        assert!(SlotMap::from_json(b"junk").is_err());
    }
}
