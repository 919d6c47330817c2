//! The primary's part in moving slots to another server
//! (`fabrickv_cluster::moves`): handing a group over once its new owner
//! is in sync, and letting go of the keys of slots this server no longer
//! holds any copy of.

use std::sync::atomic::Ordering;
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::sync::Weak;
use std::time::{Duration, Instant};

use fabrickv_cluster::slots::{key_slot, SlotMap, SLOTS};
use fabrickv_rpc::gate::Settle;
use fabrickv_rpc::quiesce::{Grace, Quiescence};
use fabrickv_types::KeyHash;

use super::{Replicator, REPL_TICK_MS};
use crate::partitions::{Partitions, BACKGROUND_HOLD_ITEMS_MIN};
use fabrickv_engine::SlotFilter;

/// Longest each of a hand-over's two waits lasts, in milliseconds: for
/// the commands that found the group served just before the map changed
/// (before the last round), and for the reads that found it open just
/// before reads closed (before the commit, so that none is answered from
/// here once the new owner may have taken a write). Each ends as soon as
/// every request thread has left the turn it was in when it saw the
/// change ([`Quiescence`]): commands run in microseconds, so that is
/// usually at once. This bound is for a thread stuck in one turn (a very
/// long command, or descheduled for this long); a write applied after it
/// is caught by the fence (the server restarts and rejoins), not lost.
pub const HANDOVER_GRACE_MAX_MS: u64 = 2_000;

/// Index entries read per hold of a partition's lock while letting
/// slots go.
const RELEASE_SCAN_ENTRIES: usize = 4096;

/// Keys deleted per hold of a partition's lock while letting slots go.
const RELEASE_DELETE_KEYS: usize = 256;

/// Share of one core, in percent, that letting go of the keys of slots a
/// server no longer holds may take. It is memory given back, never
/// urgent, and comes just as a move's hand-over does, with the rest of
/// the move still streaming: flat out it took a core from serving for
/// tens of milliseconds, and every read in the cluster slowed (1.2 to
/// 1.5 ms on average, against 40 us, in `bench growth`).
pub const RELEASE_CORE_PERCENT: u32 = 25;

/// Work, in microseconds, a paced background pass does between sleeps.
const RELEASE_BURST_US: u64 = 500;

/// A group this server leads that is handing over.
#[derive(Debug)]
pub(super) struct Handover {
    /// Where it stands.
    step: HandoverStep,
    /// When the current step began.
    since: Instant,
    /// When this server first saw the group handing over.
    began: Instant,
}

/// The steps of a hand-over, in order.
#[derive(Debug)]
enum HandoverStep {
    /// Waiting out the commands that found the group served before the
    /// map changed.
    Quiescing(Grace),
    /// The round taken after them; once it completes every write made to
    /// the group is on every copy.
    Round(u64),
    /// Reads of the group are closed here; waiting out those that found
    /// it open.
    Closing(Grace),
    /// Every read that found the group open has run: the hand-over is
    /// committed next (again at each tick until a swap wins).
    Ready,
    /// The hand-over is committed: nothing is left to do until the watch
    /// installs the map naming the new owner (etcd is not read again).
    Committed,
}

impl Handover {
    fn begin(q: &Quiescence) -> Handover {
        let now = Instant::now();
        Handover {
            step: HandoverStep::Quiescing(q.begin()),
            since: now,
            began: now,
        }
    }

    /// Whether it waits for its round to complete (which then wakes the
    /// replicator's thread).
    pub(super) fn awaits_round(&self) -> bool {
        matches!(self.step, HandoverStep::Round(_))
    }

    /// Whether it waits out a grace.
    fn in_grace(&self) -> bool {
        matches!(
            self.step,
            HandoverStep::Quiescing(_) | HandoverStep::Closing(_)
        )
    }

    fn go(&mut self, step: HandoverStep) {
        self.step = step;
        self.since = Instant::now();
    }

    /// Whether `grace` has passed, or the step has waited
    /// [`HANDOVER_GRACE_MAX_MS`] (with a warning: a request thread was
    /// stuck in one turn that long).
    fn waited_out(grace: &mut Grace, since: Instant, g: usize, what: &str) -> bool {
        if grace.passed() {
            return true;
        }
        let over = since.elapsed() >= Duration::from_millis(HANDOVER_GRACE_MAX_MS);
        if over {
            tracing::warn!(
                "moves: group {g}: a request thread ran one turn over {HANDOVER_GRACE_MAX_MS} ms; handing over without waiting for its {what}"
            );
        }
        over
    }
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
    /// sync: once every command that found it served has run, one more
    /// round, and once it is acknowledged and reads have closed (and those
    /// that found them open have run), the map naming the new owner
    /// (compare-and-swap; a change that lost is tried again at the next
    /// tick).
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
        let quiescence = self.routing.quiescence();
        let mut ready = Vec::new();
        {
            let mut sh = self.lock_ship();
            sh.handovers.retain(|g, _| mine.contains(g));
            for g in mine {
                // Begun once this thread sees the map handing over, so
                // after every request thread's next read sees it too.
                sh.handovers
                    .entry(g)
                    .or_insert_with(|| Handover::begin(quiescence));
                // Each step that can go now goes at once: a grace begun
                // now has usually passed by the next look.
                loop {
                    let room = self.room();
                    let Some(h) = sh.handovers.get_mut(&g) else {
                        break;
                    };
                    let since = h.since;
                    let next = match &mut h.step {
                        HandoverStep::Quiescing(grace) => {
                            if !(room && Handover::waited_out(grace, since, g, "writes")) {
                                break;
                            }
                            None
                        }
                        HandoverStep::Round(round) => {
                            if !self.done(*round) {
                                break;
                            }
                            // Reads stop here only now: every write is on
                            // every copy, the new owner's included.
                            self.routing.closing().close(g);
                            Some(HandoverStep::Closing(quiescence.begin()))
                        }
                        HandoverStep::Closing(grace) => {
                            if !Handover::waited_out(grace, since, g, "reads") {
                                break;
                            }
                            Some(HandoverStep::Ready)
                        }
                        HandoverStep::Ready => {
                            ready.push(g);
                            break;
                        }
                        HandoverStep::Committed => break,
                    };
                    let step = match next {
                        Some(step) => step,
                        None => HandoverStep::Round(self.launch(&mut sh)),
                    };
                    if let Some(h) = sh.handovers.get_mut(&g) {
                        h.go(step);
                    }
                }
            }
            let polling = sh.handovers.values().any(Handover::in_grace);
            self.handover_polling.store(polling, Ordering::Release);
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
                        let mut sh = self.lock_ship();
                        let took = sh
                            .handovers
                            .get(&g)
                            .map_or(0.0, |h| h.began.elapsed().as_secs_f64() * 1e3);
                        tracing::info!(
                            "moves: group {g} handed to server {} at epoch {} ({took:.1} ms after it began handing over)",
                            next.groups[g].primary,
                            next.epoch
                        );
                        if let Some(h) = sh.handovers.get_mut(&g) {
                            h.go(HandoverStep::Committed);
                        }
                    }
                    Ok(false) => {}
                    Err(e) => tracing::warn!("moves: cannot hand group {g} over: {e}"),
                }
            }
        }
    }

    /// Once a map leaves this server no copy of some slots it held, or
    /// no longer has it lead some, hands what it lost to the release
    /// thread ([`Replicator::let_go`]): the replicator's own thread goes
    /// on shipping, streaming and handing over meanwhile.
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
        // The thread outlives the replicator only when the server stops,
        // and nothing is left to let go then.
        let _ = self.release.send(lost);
    }

    /// Drops the keys and rows of slots this server no longer holds a
    /// copy of, and the cached blocks of those it no longer leads (the
    /// cache keeps a block only on its slot's primary, and no client asks
    /// another server for it), all without journaling: the slots are
    /// others' now, and memory follows them. Runs on the release thread,
    /// paced ([`Pace::Background`]).
    pub(super) fn let_go(&self, lost: SlotRoles) {
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
        let dropped = drop_keys(&self.parts, now, Pace::Background, &still_released, |_| {
            true
        });
        self.ps.drop_rows(now, &|s| still_released(s));
        tracing::info!("moves: {dropped} keys of slots this server holds no copy of let go");
    }
}

/// Starts the thread that lets go of what new maps took from this
/// server ([`Replicator::let_go`]), one map's losses at a time, in order;
/// it ends once the replicator stops or is gone.
pub(super) fn spawn_releaser(
    replicator: Weak<Replicator>,
    lost: Receiver<SlotRoles>,
) -> std::io::Result<()> {
    std::thread::Builder::new()
        .name("fkv-release".into())
        .spawn(move || {
            // Letting go is bulk work that no reply waits on.
            if let Some(r) = replicator.upgrade() {
                r.stream_cpus.confine(true);
            }
            loop {
                match lost.recv_timeout(Duration::from_millis(REPL_TICK_MS)) {
                    Ok(l) => match replicator.upgrade() {
                        Some(r) if !r.stopped() => r.let_go(l),
                        _ => return,
                    },
                    Err(RecvTimeoutError::Timeout) => {
                        if replicator.upgrade().is_none_or(|r| r.stopped()) {
                            return;
                        }
                    }
                    Err(RecvTimeoutError::Disconnected) => return,
                }
            }
        })
        .map(drop)
}

/// How [`drop_keys`] spends its time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Pace {
    /// At once: a follower applying its primary's stream, whose next
    /// records must find the slots empty.
    Now,
    /// In the background, at most [`RELEASE_CORE_PERCENT`] of a core.
    Background,
}

/// Deletes, without journaling, every key of `parts` of a slot `slots`
/// takes that `and_key` picks too; returns how many. Walks each
/// partition in short holds of its lock, deleting what each hold found
/// under the next few (asking `slots` and `and_key` again there: what
/// they pick may have changed since the walk), and gives the lock up
/// early to a request waiting for it: a
/// server letting a quarter of its keys go after a move would otherwise
/// hold a partition for tens of milliseconds, every read of it waiting.
pub(crate) fn drop_keys(
    parts: &Partitions,
    now: u64,
    pace: Pace,
    slots: &SlotFilter<'_>,
    and_key: impl Fn(&[u8]) -> bool,
) -> usize {
    let doomed = |k: &[u8]| slots(key_slot(k)) && and_key(k);
    let mut n = 0;
    let mut pacer = Pacer::new(pace);
    for p in 0..parts.len() {
        let mut from = Some(0);
        while let Some(bucket) = from {
            let mut keys: Vec<Vec<u8>> = Vec::new();
            // The walk takes only `slots`' keys.
            from =
                parts.scan_background(p, bucket, now, RELEASE_SCAN_ENTRIES, slots, &mut |k, _| {
                    if and_key(k) {
                        keys.push(k.to_vec());
                    }
                });
            pacer.breathe();
            let mut left = &keys[..];
            while !left.is_empty() {
                let mut done = 0;
                parts.lock_background(p).unjournaled(|part| {
                    for k in left.iter().take(RELEASE_DELETE_KEYS) {
                        done += 1;
                        if doomed(k)
                            && part.delete(KeyHash::of(k), k, now)
                                == fabrickv_engine::DeleteResult::Deleted
                        {
                            n += 1;
                        }
                        if done >= BACKGROUND_HOLD_ITEMS_MIN && parts.wanted(p) {
                            break;
                        }
                    }
                });
                left = &left[done..];
                pacer.breathe();
            }
        }
    }
    n
}

/// Keeps a background pass to its share of a core: after each
/// [`RELEASE_BURST_US`] of work it sleeps what makes that work
/// [`RELEASE_CORE_PERCENT`] of the time, so that it never holds a core
/// long from the workers (or from a move still under way), and without
/// the priority inversion a lower scheduling priority would risk: a
/// thread descheduled while it holds a partition's lock keeps every
/// request of that partition waiting.
struct Pacer {
    pace: Pace,
    since: Instant,
}

impl Pacer {
    fn new(pace: Pace) -> Pacer {
        Pacer {
            pace,
            since: Instant::now(),
        }
    }

    /// Called between two holds: gives the core up, and sleeps when the
    /// burst is spent.
    fn breathe(&mut self) {
        match self.pace {
            Pace::Now => std::thread::yield_now(),
            Pace::Background => {
                let worked = self.since.elapsed();
                if worked >= Duration::from_micros(RELEASE_BURST_US) {
                    let rest = worked * (100 - RELEASE_CORE_PERCENT) / RELEASE_CORE_PERCENT;
                    std::thread::sleep(rest);
                    self.since = Instant::now();
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fabrickv_engine::{Mode, Partition, PartitionConfig, PutCond, PutResult};

    /// Store-mode partitions holding `keys` keys, spread by their hashes.
    fn filled(partitions: u32, keys: u32) -> Partitions {
        let mut parts: Vec<Partition> = (0..partitions)
            .map(|_| {
                Partition::new(&PartitionConfig {
                    mode: Mode::Store,
                    pool_bytes: 8 << 20,
                    index_buckets: None,
                    memory: Default::default(),
                })
                .expect("partition")
            })
            .collect();
        for i in 0..keys {
            let k = format!("k{i}").into_bytes();
            let h = KeyHash::of(&k);
            let p = &mut parts[h.partition(partitions) as usize];
            let put = p.put(h, &k, b"v", 0, PutCond::Always, 0);
            assert!(matches!(put, PutResult::Stored), "{put:?}");
        }
        Partitions::new(parts)
    }

    /// Every doomed key goes and every other stays, at either pace, with
    /// slot tags or without, over more keys than one hold scans or
    /// deletes.
    #[test]
    fn drop_keys_deletes_exactly_the_doomed_keys_in_short_holds() {
        const KEYS: u32 = 20_000;
        const _: () = assert!(KEYS as usize > RELEASE_SCAN_ENTRIES * 2);
        for (pace, tagged) in [Pace::Now, Pace::Background]
            .into_iter()
            .flat_map(|p| [(p, false), (p, true)])
        {
            let parts = filled(2, KEYS);
            if tagged {
                for p in 0..parts.len() {
                    assert!(parts.lock(p).use_slot_tags());
                }
            }
            let slots = |s: u16| s.is_multiple_of(4);
            let doomed = |k: &[u8]| slots(key_slot(k));
            let want = (0..KEYS)
                .filter(|i| doomed(format!("k{i}").as_bytes()))
                .count();
            assert_eq!(
                drop_keys(&parts, 0, pace, &slots, |_| true),
                want,
                "{pace:?}"
            );
            for i in 0..KEYS {
                let k = format!("k{i}").into_bytes();
                let h = KeyHash::of(&k);
                let mut p = parts.lock(h.partition(2) as usize);
                let found = matches!(p.get(h, &k, 0), fabrickv_engine::GetResult::Found { .. });
                assert_eq!(found, !doomed(&k), "key {i} at {pace:?}, tags {tagged}");
            }
        }
    }
}
