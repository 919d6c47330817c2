//! The kv service: one REQUEST frame in, one RESPONSE frame out.
//!
//! Sans-I/O: [`KvService`]'s [`Service::handle`] takes the frame the worker
//! decoded, the time and a reply to append to. It never panics on any
//! input: a batch that cannot be read is refused whole (the worker sends
//! the ERROR frame), and an operation that breaks a bound gets its own
//! error result while the rest of its batch runs.

use std::sync::atomic::Ordering;
use std::sync::{Arc, MutexGuard};

use fabrickv_cluster::slots::key_slot;
use fabrickv_engine::{
    DeleteResult, GetRefResult, LargeValue, Partition, PutCond, PutResult, ValueRef,
    LARGE_VALUE_BYTES_MAX,
};
use fabrickv_transport::{ConnId, Reply};
use fabrickv_types::limits::{BATCH_OPS_MAX, KEY_BYTES_MAX, VALUE_BYTES_MAX};
use fabrickv_types::transfer::Transfers;
use fabrickv_types::{ErrorCode, KeyHash};
use fabrickv_wire::control::ServerInfo;
use fabrickv_wire::{FrameKind, OpCode, PutCondition, RequestIter, ResponseBuilder};

use crate::config::Mode;
use crate::partitions::Partitions;
use crate::service::{wire_refusal, Call, Refusal, Service, StatsList};
use crate::slot_routing::{RoutingCache, SlotRouting};

/// Work the TTL sweep does per run on one partition (see
/// `Partition::sweep`): one unit per chain visited, and the sweep visits
/// only chains that may hold a key with a TTL; one unit per 64 main
/// buckets skipped. At most 1 MiB of index, a fraction of a millisecond;
/// a partition with few keys with a TTL is covered in one run whatever its
/// size, so DBSIZE stops counting them within a few runs. Expired items
/// are never served in between; the sweep gives their memory back.
pub const SWEEP_BUCKETS_PER_RUN: usize = 16384;

/// Most bytes of large values being received at once over every native
/// connection of a server, in bytes (1 GiB: two maximal values). Each
/// connection receives at most one value at a time (PUT_CHUNK), into the
/// value's final buffer, allocated at its first chunk; a first chunk that
/// would take the total over this is answered `RECEIVING_FULL`.
pub const KV_LARGE_RECEIVING_BYTES_MAX: usize = 1 << 30;

/// How long a connection's PUT_CHUNK transfer or GET_CHUNK pin may sit
/// untouched before the sweep frees it, in milliseconds. The service is
/// not told when a connection closes, so this is how the buffer of a
/// client that dropped mid-transfer (and the pin of one that stopped
/// reading) is given back.
pub const KV_LARGE_IDLE_MS: u64 = 5_000;

/// Longest a GET_CHUNK pin lives, from the GET that made it, in
/// milliseconds, however the client reads: reads do not extend it, so a
/// client reading one small chunk every few seconds cannot keep a replaced
/// value alive (it counts in the large budget while pinned, see
/// `fabrickv_engine`'s `large`). 60 s reads a maximal 512 MiB value at
/// under 9 MB/s; a GET_CHUNK after it is answered `TIMEOUT`, and the
/// client GETs the value again (a fresh pin) if it wants it.
pub const KV_LARGE_PIN_MS: u64 = 60_000;

const _: () = assert!(KV_LARGE_RECEIVING_BYTES_MAX >= LARGE_VALUE_BYTES_MAX);

/// Smallest GET_CHUNK piece sent from the pinned value's own memory after
/// its reply frame (`Reply::append_shared`: over tcp a vectored or
/// spliced write) instead of copied into the reply, in bytes: below it
/// the copy costs less than queueing the part (an allocation and a slice
/// of the write). The tcp port splices parts from the same size
/// (`SPLICE_PART_BYTES_MIN`).
pub const KV_PIECE_SENT_AFTER_BYTES_MIN: usize = 32 << 10;

/// A GET_CHUNK piece sent after its reply frame from the pinned value's
/// own memory; the clone keeps the buffer alive until it is sent.
struct PieceAfter {
    value: LargeValue,
    range: std::ops::Range<usize>,
}

impl AsRef<[u8]> for PieceAfter {
    fn as_ref(&self) -> &[u8] {
        &self.value[self.range.clone()]
    }
}

/// A share of the server's [`KV_LARGE_RECEIVING_BYTES_MAX`], given back
/// when dropped (on every path: stored, refused, replaced, swept).
struct Reservation {
    parts: Arc<Partitions>,
    bytes: usize,
}

impl Reservation {
    fn take(parts: &Arc<Partitions>, bytes: usize) -> Option<Reservation> {
        parts
            .kv_large_receiving
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |cur| {
                cur.checked_add(bytes)
                    .filter(|&n| n <= KV_LARGE_RECEIVING_BYTES_MAX)
            })
            .ok()?;
        Some(Reservation {
            parts: Arc::clone(parts),
            bytes,
        })
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        self.parts
            .kv_large_receiving
            .fetch_sub(self.bytes, Ordering::AcqRel);
    }
}

/// A large value being received on one connection.
struct Receiving {
    key: Box<[u8]>,
    transfer: u64,
    /// The value's final buffer: its capacity is the value's length, its
    /// length the bytes received so far (the next piece's offset). Pieces
    /// are appended, so no byte of it is written twice: zeroing 512 MiB
    /// first would cost as much as copying the pieces in.
    buf: Vec<u8>,
    /// The value's length in bytes.
    total: usize,
    _share: Reservation,
}

/// A large value one connection is reading with GET_CHUNK: a reference to
/// the stored buffer, so a PUT or DELETE of the key meanwhile does not
/// change what the reader gets (it reads the value as it was at its GET).
struct Pinned {
    tag: u64,
    /// The value; `None` once the pin outlived [`KV_LARGE_PIN_MS`] (the
    /// entry stays a while, so that the client's next GET_CHUNK learns
    /// why: `TIMEOUT`, not `NO_SUCH_TRANSFER`).
    value: Option<LargeValue>,
}

/// Counters of the kv service of one worker. STATS reports them beside
/// the worker's own `frames_refused` (see `fabrickv_rpc::worker`).
#[derive(Debug, Clone, Copy, Default)]
pub struct KvCounters {
    /// Request frames executed.
    pub frames: u64,
    /// Operations executed (or answered with a per-op error).
    pub ops: u64,
    /// Operations for a partition this worker does not own (a client's
    /// table was stale): executed all the same, under the partition's
    /// lock, and the reply carries the WRONG_WORKER hint.
    pub misrouted: u64,
    /// GETs answered REPLY_FULL because their frame's reply had no room.
    pub reply_full: u64,
    /// Operations answered WRONG_SERVER: their hash slot is another
    /// server's in the cluster's slot map (the client's map was old).
    pub wrong_server: u64,
    /// Of those, writes to a slot this server leads, refused because the
    /// client's map predates the takeover ([`Routing::admits_stamp`]): a
    /// request held up in the network, or a client a map behind.
    ///
    /// [`Routing::admits_stamp`]: crate::slot_routing::Routing::admits_stamp
    pub stale_map_writes: u64,
}

/// What executing an operation changes besides its partition: the
/// service's counters and its connections' large-value transfers.
struct OpState {
    counters: KvCounters,
    /// The PUT_CHUNK transfer of each connection that has one (at most
    /// one per connection; idle ones are swept).
    receiving: Transfers<ConnId, Receiving>,
    /// The value each connection reads with GET_CHUNK (at most one per
    /// connection; idle ones are swept). Its clock began at the GET that
    /// pinned it: the pin ends [`KV_LARGE_PIN_MS`] later, however the
    /// client reads.
    pinned: Transfers<ConnId, Pinned>,
    /// The next pin tag (unique per worker, never reused).
    next_tag: u64,
    /// The piece the frame being executed sends after its reply (its last
    /// result is a GET_CHUNK of at least [`KV_PIECE_SENT_AFTER_BYTES_MIN`]).
    piece_after: Option<PieceAfter>,
}

/// Most partitions the kv service locks at once for one frame: a frame's
/// operations run in groups over at most this many partitions (one group,
/// unless the frame spreads wider), each group's locks held together so
/// that all its keys are prefetched before the first lookup.
pub const FRAME_LOCKS_MAX: usize = 8;

/// A partition with no slot in the group being formed (see
/// `KvService::slot_by_part`).
const NO_SLOT: u8 = u8::MAX;

const _: () = assert!(FRAME_LOCKS_MAX < NO_SLOT as usize);

/// The kv service of one worker: it serves the partitions the table gives
/// it uncontended, and any other under that partition's lock.
pub struct KvService {
    id: u16,
    workers: u16,
    parts: Arc<Partitions>,
    mode: Mode,
    /// Counters and per-connection transfers.
    st: OpState,
    /// The key hashes of the frame being executed (kept to reuse its memory).
    hashes: Vec<KeyHash>,
    /// The partition of each key of the frame being executed, likewise.
    indexes: Vec<u32>,
    /// The slot of each key's partition in its group's lock set, likewise.
    slots: Vec<u8>,
    /// By partition: its slot in the group being formed, or [`NO_SLOT`]
    /// (every entry is `NO_SLOT` between groups). Forming a group costs one
    /// load per key here instead of a search of the set, and each key's
    /// slot is kept in `slots`: the searches' exits, taken at random in a
    /// frame spread over several partitions, were mispredicted about once
    /// per key per pass. Measured on one thread (16-key frames of the HERD
    /// mix over 4 partitions): 137-148 ns per operation with the searches,
    /// 122-125 with the table.
    slot_by_part: Box<[u8]>,
    /// The partition the sweep visits next (it walks the partitions this
    /// worker owns, one per run).
    sweep_next: usize,
    /// Which hash slots the server serves, in a cluster with a slot map,
    /// and this worker's copy of the current view.
    routing: Arc<SlotRouting>,
    view: RoutingCache,
}

impl KvService {
    /// The service of worker `id` out of `workers`.
    pub fn new(id: u16, workers: u16, parts: Arc<Partitions>, mode: Mode) -> KvService {
        let slot_by_part = vec![NO_SLOT; parts.len()].into_boxed_slice();
        KvService {
            id,
            workers,
            parts,
            mode,
            st: OpState {
                counters: KvCounters::default(),
                receiving: Transfers::new(),
                pinned: Transfers::new(),
                next_tag: 1,
                piece_after: None,
            },
            hashes: Vec::with_capacity(BATCH_OPS_MAX),
            indexes: Vec::with_capacity(BATCH_OPS_MAX),
            slots: Vec::with_capacity(BATCH_OPS_MAX),
            slot_by_part,
            sweep_next: 0,
            routing: SlotRouting::new(),
            view: RoutingCache::default(),
        }
    }

    /// The same service, serving only the hash slots `routing` gives this
    /// server once a slot map is installed there.
    pub fn with_slot_routing(mut self, routing: Arc<SlotRouting>) -> KvService {
        self.routing = routing;
        self
    }

    /// This service's counters.
    pub fn counters(&self) -> KvCounters {
        self.st.counters
    }

    /// Background work when idle: reclaims expired items in up to
    /// `buckets` index buckets of the next partition this worker owns
    /// (each owned partition in turn); returns how many items it
    /// reclaimed. A partition owned by no one is never left unswept for
    /// long: every partition has an owner.
    pub fn sweep_buckets(&mut self, now_ms: u64, buckets: usize) -> usize {
        let n = self.parts.len();
        for k in 0..n {
            let i = (self.sweep_next + k) % n;
            if self.parts.owner(i) == self.id {
                self.sweep_next = (i + 1) % n;
                // Not a request: a save must not take the sweep's ticks
                // for a busy server.
                return self.parts.lock_background(i).sweep(now_ms, buckets);
            }
        }
        0
    }

    /// The shape a HELLO reply announces: workers, partitions and limits,
    /// the value bound lowered to what a partition can hold (all are the
    /// same size).
    pub fn server_info(&self) -> ServerInfo {
        ServerInfo {
            workers: self.workers,
            partitions: self.parts.len() as u32,
            store_mode: self.mode == Mode::Store,
            key_bytes_max: KEY_BYTES_MAX as u32,
            value_bytes_max: VALUE_BYTES_MAX.min(self.parts.lock(0).max_item_value_bytes()) as u32,
            batch_ops_max: BATCH_OPS_MAX as u32,
        }
    }

    /// Frees the transfers and pins idle for over [`KV_LARGE_IDLE_MS`],
    /// and the values of pins past [`KV_LARGE_PIN_MS`] (their entries go
    /// [`KV_LARGE_IDLE_MS`] after that).
    pub fn sweep_large(&mut self, now_ms: u64) {
        self.st.receiving.sweep(now_ms, KV_LARGE_IDLE_MS);
        self.st.pinned.sweep_with(|clock, p| {
            if clock.outlived(now_ms, KV_LARGE_PIN_MS) {
                p.value = None;
                return now_ms.saturating_sub(clock.since_ms())
                    <= KV_LARGE_PIN_MS + KV_LARGE_IDLE_MS;
            }
            !clock.idle(now_ms, KV_LARGE_IDLE_MS)
        });
    }

    fn execute(
        &mut self,
        conn: ConnId,
        ops: RequestIter<'_>,
        id: u64,
        out: &mut Vec<u8>,
        now_ms: u64,
    ) {
        self.st.counters.frames += 1;
        let mut rb = ResponseBuilder::new(out, id, self.id);
        // In a cluster with a slot map, a frame holding a key of a slot
        // served elsewhere takes the checked path; without a map this is
        // one atomic load.
        let stamp = ops.map_epoch();
        let foreign = self
            .view
            .current(&self.routing)
            .is_some_and(|r| ops.clone().any(|op| !serves_op(r, &op, stamp)));
        let misrouted = if foreign {
            self.execute_routed(conn, ops, &mut rb, now_ms)
        } else if ops.len() == 1 {
            self.execute_one(conn, ops, &mut rb, now_ms)
        } else {
            let misrouted = self.execute_groups(conn, ops.clone(), &mut rb, now_ms);
            self.note_settled_gets(ops);
            misrouted
        };
        if misrouted {
            // Every result stands; the client's table is stale.
            rb.set_status(ErrorCode::WrongWorker);
        }
        match &self.st.piece_after {
            Some(p) => {
                rb.finish_before_value(p.range.len(), fabrickv_wire::checksum::crc32c(p.as_ref()))
            }
            None => rb.finish(),
        }
    }

    /// After [`KvService::execute_groups`] ran `ops` on a server that
    /// replicates: a frame of GETs only, each of a key whose every write
    /// every follower has applied, shows nothing a failover could take
    /// back, and its reply need not wait for a round (as a lone GET's,
    /// in `execute_one`). The hashes are the frame's, left by
    /// `execute_groups`.
    #[inline]
    fn note_settled_gets(&self, mut ops: RequestIter<'_>) {
        if !self.parts.replicates() {
            return;
        }
        let gets = ops.all(|op| op.opcode == OpCode::Get as u8);
        if gets && self.hashes.iter().all(|&h| self.parts.key_settled(h)) {
            fabrickv_rpc::gate::reply_settled();
        }
    }

    /// A frame of one operation (HERD's non-batched requests, every
    /// client's single GET or PUT): one partition locked, no group to
    /// form, nothing to prefetch ahead of the lookup. Returns whether the
    /// partition is another worker's.
    #[inline(always)]
    fn execute_one(
        &mut self,
        conn: ConnId,
        mut ops: RequestIter<'_>,
        rb: &mut ResponseBuilder<'_>,
        now_ms: u64,
    ) -> bool {
        let Some(op) = ops.next() else {
            return false;
        };
        let (misrouted, hash) = self.run_alone(conn, &op, 0, rb, now_ms);
        // A lone GET of a key whose every write (of its set of keys) every
        // follower has applied shows nothing a failover could take back:
        // its reply need not wait for other keys' writes to replicate.
        if op.opcode == OpCode::Get as u8 && self.parts.key_settled(hash) {
            fabrickv_rpc::gate::reply_settled();
        }
        misrouted
    }

    /// Runs one operation alone under its partition's lock, `after`
    /// results still to come in the frame. Returns whether the partition
    /// is another worker's, and the key's hash.
    #[inline(always)]
    fn run_alone(
        &mut self,
        conn: ConnId,
        op: &fabrickv_wire::Op<'_>,
        after: usize,
        rb: &mut ResponseBuilder<'_>,
        now_ms: u64,
    ) -> (bool, KeyHash) {
        let hash = KeyHash::of(op.key);
        let p = self.parts.index_of(hash);
        let mut g = self.parts.lock(p);
        let misrouted = self.parts.owner(p) != self.id;
        execute_op(
            &mut self.st,
            &self.parts,
            &mut g,
            conn,
            op,
            hash,
            after,
            rb,
            now_ms,
        );
        let m = u64::from(misrouted);
        self.st.counters.misrouted += m;
        self.parts.count(p, &g, 1, m);
        (misrouted, hash)
    }

    /// A frame holding keys of hash slots this server does not serve: each
    /// of those is answered WRONG_SERVER and not run, each other one runs
    /// alone under its partition's lock. Rare (a client whose slot map is
    /// older than the server's), so it is kept simple.
    #[cold]
    fn execute_routed(
        &mut self,
        conn: ConnId,
        ops: RequestIter<'_>,
        rb: &mut ResponseBuilder<'_>,
        now_ms: u64,
    ) -> bool {
        let total = ops.len();
        let stamp = ops.map_epoch();
        let mut misrouted = false;
        for op in ops {
            let route = self.view.current(&self.routing);
            let here = route.is_none_or(|r| serves_op(r, &op, stamp));
            if !here {
                if route.is_some_and(|r| serves_op(r, &op, 0)) {
                    // Served here, but the group changed hands after the
                    // client's map: a late write, or a client behind.
                    self.st.counters.stale_map_writes += 1;
                }
                // The epoch of the map this server refused under: a
                // client holding a newer one knows this server is behind
                // (its watch a moment late) and sends again shortly.
                let epoch = route.map_or(0, |r| r.map.epoch);
                self.st.counters.ops += 1;
                self.st.counters.wrong_server += 1;
                rb.result(ErrorCode::WrongServer, &epoch.to_le_bytes());
                continue;
            }
            let after = total - rb.len() - 1;
            misrouted |= self.run_alone(conn, &op, after, rb, now_ms).0;
        }
        misrouted
    }

    /// A frame of several operations, run in groups over at most
    /// [`FRAME_LOCKS_MAX`] partitions each, every group's keys prefetched
    /// before its first lookup. Returns whether any partition was another
    /// worker's. Inlined, as `execute_one` is, so that the response
    /// builder stays in registers: called out of line, through a
    /// reference to it, a 16-operation frame of HERD's mix took about 120
    /// more instructions (callgrind).
    #[inline(always)]
    fn execute_groups(
        &mut self,
        conn: ConnId,
        ops: RequestIter<'_>,
        rb: &mut ResponseBuilder<'_>,
        now_ms: u64,
    ) -> bool {
        // Each key is hashed once, here, and its partition found; execution
        // reuses both.
        self.hashes.clear();
        self.indexes.clear();
        for op in ops.clone() {
            let h = KeyHash::of(op.key);
            self.hashes.push(h);
            self.indexes.push(self.parts.index_of(h) as u32);
        }
        let total = self.hashes.len();
        self.slots.clear();
        self.slots.resize(total, 0);
        let mut ops = ops;
        let mut hint = false;
        let mut start = 0;
        while start < total {
            // A group: the operations from `start` on, over at most
            // FRAME_LOCKS_MAX partitions (the whole frame, unless it
            // spreads wider); `set` holds the partition of each slot, in
            // the order the keys first name them.
            let mut set = [0u32; FRAME_LOCKS_MAX];
            let mut n = 0;
            let mut end = start;
            while end < total {
                let p = self.indexes[end];
                let mut slot = self.slot_by_part[p as usize];
                if slot == NO_SLOT {
                    if n == FRAME_LOCKS_MAX {
                        break;
                    }
                    slot = n as u8;
                    self.slot_by_part[p as usize] = slot;
                    set[n] = p;
                    n += 1;
                }
                self.slots[end] = slot;
                end += 1;
            }
            for &p in &set[..n] {
                self.slot_by_part[p as usize] = NO_SLOT;
            }
            // The group's partitions are locked in ascending order, as
            // RESP's multi-key commands lock theirs, so no two threads
            // wait for each other. Uncontended unless a partition moved or
            // a RESP or memcache thread is on it: the table decides who
            // serves a partition without contention, the lock that it is
            // served correctly.
            let mut order = [0u8; FRAME_LOCKS_MAX];
            for (s, o) in order[..n].iter_mut().enumerate() {
                *o = s as u8;
            }
            order[..n].sort_unstable_by_key(|&s| set[usize::from(s)]);
            let mut guards: [Option<MutexGuard<'_, Partition>>; FRAME_LOCKS_MAX] =
                Default::default();
            let mut misrouted = [false; FRAME_LOCKS_MAX];
            let mut counts = [0u64; FRAME_LOCKS_MAX];
            for &s in &order[..n] {
                let (s, p) = (usize::from(s), set[usize::from(s)] as usize);
                guards[s] = Some(self.parts.lock(p));
                misrouted[s] = self.parts.owner(p) != self.id;
            }
            let (hashes, slots) = (&self.hashes[start..end], &self.slots[start..end]);
            // Prefetch passes: every key's bucket, then every item those
            // buckets name, before the first lookup, so the group's misses
            // overlap (MICA's prefetch).
            for (&h, &s) in hashes.iter().zip(slots) {
                if let Some(g) = &guards[usize::from(s)] {
                    g.prefetch(h);
                }
            }
            for (&h, &s) in hashes.iter().zip(slots) {
                if let Some(g) = &guards[usize::from(s)] {
                    g.prefetch_item(h);
                }
            }
            for (&hash, &s) in hashes.iter().zip(slots) {
                let Some(op) = ops.next() else {
                    break;
                };
                let slot = usize::from(s);
                let Some(partition) = guards[slot].as_deref_mut() else {
                    break;
                };
                counts[slot] += 1;
                // Results still to come after this one, each at least a header.
                let after = total - rb.len() - 1;
                execute_op(
                    &mut self.st,
                    &self.parts,
                    partition,
                    conn,
                    &op,
                    hash,
                    after,
                    rb,
                    now_ms,
                );
            }
            for (s, &p) in set[..n].iter().enumerate() {
                let m = if misrouted[s] { counts[s] } else { 0 };
                self.st.counters.misrouted += m;
                hint |= m > 0;
                if let Some(g) = &guards[s] {
                    self.parts.count(p as usize, g, counts[s], m);
                }
            }
            drop(guards);
            start = end;
        }
        hint
    }

    /// Executes one REQUEST frame into `reply`: [`KvService::execute`],
    /// then a GET_CHUNK piece it left to send after the frame, from the
    /// value's own memory.
    #[inline]
    fn execute_into(
        &mut self,
        conn: ConnId,
        ops: RequestIter<'_>,
        id: u64,
        reply: &mut dyn Reply,
        now_ms: u64,
    ) {
        self.execute(conn, ops, id, reply.buf(), now_ms);
        if let Some(p) = self.st.piece_after.take() {
            reply.append_shared(Box::new(p));
        }
    }

    /// The partitions (shared with every worker and front end).
    pub fn partitions(&self) -> &Arc<Partitions> {
        &self.parts
    }

    /// The engine counters of the partitions this worker owns now,
    /// appended to a STATS reply first.
    pub fn engine_stats(&self, out: &mut StatsList) {
        let mut e = fabrickv_engine::PartitionStats::default();
        for i in 0..self.parts.len() {
            if self.parts.owner(i) == self.id {
                e.add(&self.parts.lock(i).stats());
            }
        }
        out.extend([
            ("gets", e.gets),
            ("hits", e.hits),
            ("misses", e.misses),
            ("puts", e.puts),
            ("deletes", e.deletes),
            ("evictions", e.evictions),
            ("expired", e.expired),
            ("items", e.items),
            ("bytes", e.bytes),
            ("pool_bytes", e.pool_bytes),
            ("index_collisions", e.index_collisions),
            ("slab_pages_moved", e.slab_pages_moved),
            ("slab_items_relocated", e.slab_items_relocated),
            ("slab_free_bytes", e.slab_free_bytes),
        ]);
    }
}

/// Checks and executes one operation on its (locked) partition, appending
/// its result.
#[allow(clippy::too_many_arguments)]
#[inline]
fn execute_op(
    st: &mut OpState,
    parts: &Arc<Partitions>,
    partition: &mut Partition,
    conn: ConnId,
    op: &fabrickv_wire::Op<'_>,
    hash: KeyHash,
    after: usize,
    rb: &mut ResponseBuilder<'_>,
    now_ms: u64,
) {
    st.counters.ops += 1;
    let (code, cond) = match op.check() {
        Ok(c) => c,
        Err(e) => {
            rb.result(e, &[]);
            return;
        }
    };
    match code {
        OpCode::Get => match partition.get_ref(hash, op.key, now_ms) {
            GetRefResult::Found {
                value: ValueRef::Large(v),
                ..
            } => {
                // Too large for any frame: pin it for this
                // connection's GET_CHUNKs and answer its length.
                if !rb.fits(fabrickv_wire::LARGE_RESULT_BYTES, after) {
                    st.counters.reply_full += 1;
                    rb.result(ErrorCode::ReplyFull, &[]);
                    return;
                }
                let tag = st.next_tag;
                st.next_tag += 1;
                let mut r = [0u8; fabrickv_wire::LARGE_RESULT_BYTES];
                r[..8].copy_from_slice(&(v.len() as u64).to_le_bytes());
                r[8..].copy_from_slice(&tag.to_le_bytes());
                st.pinned.open(
                    conn,
                    Pinned {
                        tag,
                        value: Some(v.clone()),
                    },
                    now_ms,
                );
                rb.result(ErrorCode::LargeValue, &r)
            }
            GetRefResult::Found { value, .. } if rb.fits(value.bytes().len(), after) => {
                rb.result(ErrorCode::Ok, value.bytes())
            }
            GetRefResult::Found { .. } => {
                st.counters.reply_full += 1;
                rb.result(ErrorCode::ReplyFull, &[])
            }
            GetRefResult::NotFound => rb.result(ErrorCode::NotFound, &[]),
        },
        OpCode::GetChunk => {
            // `check` passed, so the fields parse.
            let Ok(c) = op.get_chunk() else {
                rb.result(ErrorCode::Malformed, &[]);
                return;
            };
            let (clock, pin) = match st.pinned.get_mut(&conn) {
                Some((clock, p)) if p.tag == c.tag => (clock, p),
                _ => {
                    rb.result(ErrorCode::NoSuchTransfer, &[]);
                    return;
                }
            };
            let value = match &pin.value {
                Some(v) if !clock.outlived(now_ms, KV_LARGE_PIN_MS) => v.clone(),
                _ => {
                    // Past its deadline: the value goes now (if the sweep
                    // has not freed it yet), the answer stays TIMEOUT
                    // until the entry is swept.
                    pin.value = None;
                    rb.result(ErrorCode::Timeout, &[]);
                    return;
                }
            };
            let end = c.offset + u64::from(c.len);
            if end > value.len() as u64 {
                rb.result(ErrorCode::Malformed, &[]);
                return;
            }
            if !rb.fits(c.len as usize, after) {
                st.counters.reply_full += 1;
                rb.result(ErrorCode::ReplyFull, &[]);
                return;
            }
            clock.touch(now_ms);
            // The last piece read unpins the value.
            if end == value.len() as u64 {
                st.pinned.remove(&conn);
            }
            let range = c.offset as usize..end as usize;
            if after == 0 && range.len() >= KV_PIECE_SENT_AFTER_BYTES_MIN {
                // The frame's last result: its piece follows the frame
                // from the value itself, not copied into the reply.
                rb.result_sent_after(ErrorCode::Ok, range.len());
                st.piece_after = Some(PieceAfter { value, range });
                &mut *rb
            } else {
                rb.result(ErrorCode::Ok, &value[range])
            }
        }
        OpCode::PutChunk => {
            let code = put_chunk(
                &mut st.receiving,
                parts,
                conn,
                op,
                hash,
                cond,
                now_ms,
                partition,
            );
            rb.result(code, &[])
        }
        OpCode::Put => {
            let (expire_at, cond) = put_terms(op.ttl_ms, cond, now_ms);
            let code = match partition.put(hash, op.key, op.value, expire_at, cond, now_ms) {
                PutResult::Stored => ErrorCode::Ok,
                PutResult::InsufficientSpace => ErrorCode::InsufficientSpace,
                PutResult::TooLarge => ErrorCode::ValueTooLarge,
                PutResult::ConditionFailed => ErrorCode::ConditionFailed,
            };
            rb.result(code, &[])
        }
        OpCode::Delete => match partition.delete(hash, op.key, now_ms) {
            DeleteResult::Deleted => rb.result(ErrorCode::Ok, &[]),
            DeleteResult::NotFound => rb.result(ErrorCode::NotFound, &[]),
        },
    };
}

/// One PUT_CHUNK: a piece at offset 0 starts a transfer (replacing the
/// connection's earlier one), a piece elsewhere continues the
/// connection's transfer exactly where it stopped, and the last piece
/// stores the value (no copy: the buffer becomes the large object).
#[allow(clippy::too_many_arguments)]
fn put_chunk(
    receiving: &mut Transfers<ConnId, Receiving>,
    parts: &Arc<Partitions>,
    conn: ConnId,
    op: &fabrickv_wire::Op<'_>,
    hash: KeyHash,
    cond: PutCondition,
    now_ms: u64,
    partition: &mut Partition,
) -> ErrorCode {
    let Ok(c) = op.put_chunk() else {
        return ErrorCode::Malformed;
    };
    // `check` bounded total to LARGE_VALUE_BYTES_MAX, so it fits usize.
    let total = c.total as usize;
    if c.offset == 0 {
        // Give the old transfer's share back before taking a new one.
        receiving.remove(&conn);
        let Some(share) = Reservation::take(parts, total) else {
            return ErrorCode::ReceivingFull;
        };
        receiving.open(
            conn,
            Receiving {
                key: op.key.into(),
                transfer: c.transfer,
                buf: Vec::with_capacity(total),
                total,
                _share: share,
            },
            now_ms,
        );
    }
    let Some(r) = receiving.touch(&conn, now_ms) else {
        return ErrorCode::NoSuchTransfer;
    };
    if r.transfer != c.transfer {
        return ErrorCode::NoSuchTransfer;
    }
    if c.offset != r.buf.len() as u64 || r.total != total || *r.key != *op.key {
        receiving.remove(&conn);
        return ErrorCode::ChunkOutOfOrder;
    }
    // `check` bounded offset + length by the total, so the piece fits
    // the room reserved.
    r.buf.extend_from_slice(c.bytes);
    if r.buf.len() < total {
        return ErrorCode::Ok;
    }
    let Some(r) = receiving.remove(&conn) else {
        return ErrorCode::Internal;
    };
    let (expire_at, cond) = put_terms(op.ttl_ms, cond, now_ms);
    let value = LargeValue::from_boxed(r.buf.into_boxed_slice());
    match partition.put_large(hash, op.key, value, expire_at, cond, now_ms) {
        PutResult::Stored => ErrorCode::Ok,
        PutResult::InsufficientSpace => ErrorCode::InsufficientSpace,
        PutResult::TooLarge => ErrorCode::ValueTooLarge,
        PutResult::ConditionFailed => ErrorCode::ConditionFailed,
    }
}

impl Service for KvService {
    fn kinds(&self) -> &'static [FrameKind] {
        &[FrameKind::Request]
    }

    /// Executes one REQUEST frame (the worker sends it no other kind).
    #[inline]
    fn handle(&mut self, call: &Call<'_>, reply: &mut dyn Reply) -> Result<(), Refusal> {
        let ops = RequestIter::new(&call.frame).map_err(wire_refusal)?;
        self.execute_into(call.conn, ops, call.id(), reply, call.now_ms);
        Ok(())
    }

    /// The engine's counters of the partitions this worker owns, then
    /// the protocol's.
    fn stats(&self, out: &mut StatsList) {
        self.engine_stats(out);
        let c = self.st.counters;
        out.extend([
            ("frames", c.frames),
            ("ops", c.ops),
            ("misrouted", c.misrouted),
            ("reply_full", c.reply_full),
            ("wrong_server", c.wrong_server),
            ("stale_map_writes", c.stale_map_writes),
            ("partitions_owned", self.parts.owned_by(self.id) as u64),
        ]);
    }

    fn shared_stats(&self, out: &mut StatsList) {
        out.push((
            "kv_large_receiving_bytes",
            self.parts.kv_large_receiving.load(Ordering::Acquire) as u64,
        ));
        let t = self.parts.table();
        out.push(("partitions", t.owners.len() as u64));
        out.push(("partitions_epoch", t.epoch));
        // Per partition, up to STATS_PARTITIONS_MAX of them (a STATS reply
        // holds BATCH_OPS_MAX entries); the PARTITIONS reply has them all.
        for (i, names) in crate::partitions::STAT_NAMES.iter().enumerate() {
            if i >= t.owners.len() {
                break;
            }
            out.push((names.0, t.ops[i]));
            out.push((names.1, t.misrouted[i]));
        }
    }

    fn sweep(&mut self, now_ms: u64) {
        self.sweep_buckets(now_ms, SWEEP_BUCKETS_PER_RUN);
        self.sweep_large(now_ms);
    }
}

/// Whether this server may run `op` under routing `r`: a read by
/// [`Routing::serves_read`] (reads go on at a primary handing its group
/// over, until it commits), anything else by [`Routing::serves`] and, for
/// a frame stamped with the client's map epoch `stamp`, by
/// [`Routing::admits_stamp`] (a read that ran late does no harm).
#[inline]
fn serves_op(
    r: &crate::slot_routing::Routing,
    op: &fabrickv_wire::request::Op<'_>,
    stamp: u32,
) -> bool {
    let slot = key_slot(op.key);
    let read = matches!(
        OpCode::from_u8(op.opcode),
        Some(OpCode::Get | OpCode::GetChunk)
    );
    if read {
        r.serves_read(slot, op.replica_read())
    } else {
        r.serves(slot, op.replica_read()) && r.admits_stamp(slot, stamp)
    }
}

/// The engine's terms for a PUT (or a large value's last piece): its
/// absolute expiry in engine ms (0: none) from the request's TTL, and its
/// condition.
fn put_terms(ttl_ms: u64, cond: PutCondition, now_ms: u64) -> (u64, PutCond) {
    let expire_at = if ttl_ms == 0 { 0 } else { now_ms + ttl_ms };
    let cond = match cond {
        PutCondition::Always => PutCond::Always,
        PutCondition::IfAbsent => PutCond::IfAbsent,
        PutCondition::IfPresent => PutCond::IfPresent,
    };
    (expire_at, cond)
}

#[cfg(test)]
mod tests {
    use fabrickv_engine::{Mode as EngineMode, PartitionConfig, PoolOptions};
    use fabrickv_wire::{decode_frame, RequestBuilder, ResponseIter};

    use super::*;

    const CONN: ConnId = 7;
    const MIB: usize = 1 << 20;

    /// A kv service over one store-mode partition with a large budget of
    /// `large_bytes`.
    fn service(large_bytes: u64) -> KvService {
        let mut p = Partition::new(&PartitionConfig {
            mode: EngineMode::Store,
            pool_bytes: 4 << 20,
            index_buckets: None,
            memory: PoolOptions::default(),
        })
        .expect("partition");
        p.set_large_bytes_max(large_bytes);
        KvService::new(0, 1, Arc::new(Partitions::new(vec![p])), Mode::Store)
    }

    /// Runs one request of the operations `build` adds at `now_ms`;
    /// returns the first result.
    fn one(
        kv: &mut KvService,
        now_ms: u64,
        build: impl FnOnce(&mut RequestBuilder<'_>),
    ) -> (ErrorCode, Vec<u8>) {
        one_stamped(kv, now_ms, 0, build)
    }

    /// [`one`], the frame stamped with map epoch `epoch`.
    fn one_stamped(
        kv: &mut KvService,
        now_ms: u64,
        epoch: u64,
        build: impl FnOnce(&mut RequestBuilder<'_>),
    ) -> (ErrorCode, Vec<u8>) {
        let mut req = Vec::new();
        let mut b = RequestBuilder::new(&mut req, 1, 0);
        build(&mut b);
        b.stamp_map_epoch(epoch);
        b.finish();
        let frame = decode_frame(&req).expect("frame");
        let ops = RequestIter::new(&frame).expect("request");
        let mut out = Vec::new();
        kv.execute_into(CONN, ops, 1, &mut out, now_ms);
        let frame = decode_frame(&out).expect("reply frame");
        let r = ResponseIter::new(&frame)
            .expect("response")
            .next()
            .expect("one result");
        (r.code(), r.value.to_vec())
    }

    fn put(kv: &KvService, key: &[u8], len: usize, seed: u8) {
        let v = LargeValue::from_boxed(vec![seed; len].into_boxed_slice());
        let r = kv
            .parts
            .lock(0)
            .put_large(KeyHash::of(key), key, v, 0, PutCond::Always, 0);
        assert_eq!(r, PutResult::Stored);
    }

    fn pinned_bytes(kv: &KvService) -> u64 {
        kv.parts.lock(0).stats().large_pinned_bytes
    }

    /// A key whose hash slot is in `lo..=hi`.
    fn key_in(lo: u16, hi: u16) -> Vec<u8> {
        (0..)
            .map(|i| format!("k{i}").into_bytes())
            .find(|k| (lo..=hi).contains(&key_slot(k)))
            .expect("a key")
    }

    /// A write routed by a map older than its group's takeover may have
    /// waited in the network across a failover and back: it is refused
    /// WRONG_SERVER (naming the server's epoch) and does not run. Reads,
    /// unstamped frames, and writes routed by a map since the takeover
    /// (or to a group led all along) run.
    #[test]
    fn a_write_routed_by_a_map_older_than_its_primarys_takeover_does_not_run() {
        use crate::slot_routing::Routing;
        use fabrickv_cluster::slots::SlotMap;
        // Server 2 failed over: server 0, its backup, leads its slots
        // from epoch 2, and its own from epoch 1.
        let map = SlotMap::initial(3, 2)
            .expect("map")
            .without(2)
            .expect("a failover");
        assert_eq!(
            (map.epoch, map.groups[2].primary, map.groups[2].since),
            (2, 0, 2)
        );
        let routing = SlotRouting::new();
        routing.install(Routing::new(0, "t", map, vec![None, None, None]));
        let mut kv = service(64 << 20).with_slot_routing(routing);
        let (mine, taken) = (key_in(0, 5460), key_in(10922, 16383));
        let put = |key: &[u8]| {
            let key = key.to_vec();
            move |b: &mut RequestBuilder<'_>| {
                b.put(&key, b"v", 0, PutCondition::Always);
            }
        };

        let late = one_stamped(&mut kv, 1, 1, put(&taken));
        assert_eq!(late, (ErrorCode::WrongServer, 2u64.to_le_bytes().to_vec()));
        assert_eq!(kv.st.counters.stale_map_writes, 1);
        let get = |b: &mut RequestBuilder<'_>| {
            b.get(&taken);
        };
        assert_eq!(
            one_stamped(&mut kv, 1, 1, get).0,
            ErrorCode::NotFound,
            "the read runs; the late write did not"
        );
        assert_eq!(one_stamped(&mut kv, 1, 1, put(&mine)).0, ErrorCode::Ok);
        for epoch in [0, 2, 3, u64::from(u32::MAX) + 1] {
            assert_eq!(
                one_stamped(&mut kv, 1, epoch, put(&taken)).0,
                ErrorCode::Ok,
                "stamped {epoch}"
            );
        }
        assert_eq!(kv.st.counters.stale_map_writes, 1);
    }

    /// On a server that replicates, a lone GET of a key with no write of
    /// its set of keys in flight tells the worker its reply need not wait
    /// ([`fabrickv_rpc::gate::reply_settled`]), even beside another key's
    /// write in flight in its partition; a GET of the written key, and
    /// every write, does not.
    #[test]
    fn a_get_is_settled_only_while_no_write_of_its_key_is_in_flight() {
        use crate::partitions::journaled;
        use fabrickv_rpc::gate::{request_begins, request_is_settled};
        let (parts, seqs) = journaled::two();
        let mut kv = KvService::new(0, 1, parts.clone(), Mode::Store);
        let a = journaled::key_in(&parts, 0, "k").into_bytes();
        let b = journaled::key_in(&parts, 1, "k").into_bytes();
        let settled = |kv: &mut KvService, key: &[u8], write: bool| {
            request_begins();
            one(kv, 1, |r| {
                if write {
                    r.put(key, b"v", 0, PutCondition::Always);
                } else {
                    r.get(key);
                }
            });
            request_is_settled()
        };
        assert!(settled(&mut kv, &a, false), "nothing written yet");
        assert!(!settled(&mut kv, &a, true), "a write is never settled");
        assert!(!settled(&mut kv, &a, false), "its write is in flight");
        assert!(settled(&mut kv, &b, false), "another partition");
        // A key of the same partition whose set has no write in flight.
        let neighbour = (0..)
            .map(|n| format!("n{n}").into_bytes())
            .find(|k| {
                let h = KeyHash::of(k);
                parts.index_of(h) == 0 && seqs[0].key_settled(h)
            })
            .expect("a key of another set");
        assert!(!seqs[0].settled(), "the partition has a write in flight");
        assert!(settled(&mut kv, &neighbour, false), "another set of keys");
        // Frames of several operations: GETs of settled keys only.
        let frame = |kv: &mut KvService, ops: &[(&[u8], bool)]| {
            request_begins();
            one(kv, 1, |r| {
                for &(key, write) in ops {
                    if write {
                        r.put(key, b"v", 0, PutCondition::Always);
                    } else {
                        r.get(key);
                    }
                }
            });
            request_is_settled()
        };
        assert!(
            frame(&mut kv, &[(&neighbour, false), (&b, false)]),
            "settled keys"
        );
        assert!(
            !frame(&mut kv, &[(&b, false), (&a, false)]),
            "one key with a write in flight"
        );
        seqs[0].mark_replicated(seqs[0].get());
        assert!(settled(&mut kv, &a, false), "the write is replicated");
    }

    #[test]
    fn a_get_chunk_pin_ends_at_its_deadline_however_the_client_reads() {
        let mut kv = service(64 << 20);
        let len = 2 * MIB;
        put(&kv, b"k", len, 1);
        let t0 = 1_000;
        let (code, head) = one(&mut kv, t0, |b| {
            b.get(b"k");
        });
        assert_eq!(code, ErrorCode::LargeValue);
        let tag = u64::from_le_bytes(head[8..16].try_into().expect("tag"));
        // The key is rewritten under the reader: the old buffer is
        // pinned, and counted.
        put(&kv, b"k", len, 2);
        assert_eq!(pinned_bytes(&kv), len as u64);
        // A slow reader: one small chunk well within the idle timeout,
        // again and again; each read leaves the deadline where it was.
        let mut now = t0;
        while now + KV_LARGE_IDLE_MS / 2 < t0 + KV_LARGE_PIN_MS {
            now += KV_LARGE_IDLE_MS / 2;
            kv.sweep_large(now);
            let (code, piece) = one(&mut kv, now, |b| {
                b.get_chunk(b"k", tag, 0, 10);
            });
            assert_eq!((code, piece), (ErrorCode::Ok, vec![1u8; 10]), "at {now}");
        }
        // At the deadline the sweep frees the value, and reads are
        // answered TIMEOUT (stable, not NO_SUCH_TRANSFER) for a while.
        let deadline = t0 + KV_LARGE_PIN_MS;
        kv.sweep_large(deadline);
        assert_eq!(pinned_bytes(&kv), 0);
        let (code, _) = one(&mut kv, deadline, |b| {
            b.get_chunk(b"k", tag, 0, 10);
        });
        assert_eq!(code, ErrorCode::Timeout);
        // Then the entry goes too.
        kv.sweep_large(deadline + KV_LARGE_IDLE_MS + 1);
        let (code, _) = one(&mut kv, deadline + KV_LARGE_IDLE_MS + 1, |b| {
            b.get_chunk(b"k", tag, 0, 10);
        });
        assert_eq!(code, ErrorCode::NoSuchTransfer);
        assert!(kv.st.pinned.is_empty());
    }

    #[test]
    fn a_get_chunk_past_the_deadline_frees_the_value_before_any_sweep() {
        let mut kv = service(64 << 20);
        put(&kv, b"k", 2 * MIB, 1);
        let (code, head) = one(&mut kv, 0, |b| {
            b.get(b"k");
        });
        assert_eq!(code, ErrorCode::LargeValue);
        let tag = u64::from_le_bytes(head[8..16].try_into().expect("tag"));
        put(&kv, b"k", 2 * MIB, 2);
        assert_eq!(pinned_bytes(&kv), (2 * MIB) as u64);
        let (code, _) = one(&mut kv, KV_LARGE_PIN_MS, |b| {
            b.get_chunk(b"k", tag, 0, 10);
        });
        assert_eq!(code, ErrorCode::Timeout);
        assert_eq!(pinned_bytes(&kv), 0);
    }
}
