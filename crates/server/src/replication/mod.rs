//! Synchronous replication of the in-memory keyspace in a cluster keeping
//! several copies of each slot (`serve --registry etcd://... --replicas R`).
//!
//! - **What is shipped.** Every partition keeps a journal of the keys its
//!   writes touched (`fabrickv_engine::Journal`), whichever front end
//!   wrote them (native kv, RESP, memcache; single commands, MULTI/EXEC,
//!   large values). A *round* takes each journal under its partition's
//!   lock, reads each key's state there (value, expiry, memcache meta, or
//!   absence) and sends it, in a batch per follower, to the followers of
//!   the key's group (backups and joiners), then waits for every
//!   follower's acknowledgement. A follower applies a batch in order by
//!   overwriting, so a record applied twice (a batch resent after a lost
//!   acknowledgement) changes nothing.
//! - **When a write is acknowledged.** Every reply a server sends passes
//!   its [`FlushGate`] first; armed by replication, the gate waits until
//!   every write noted before the burst's replies were made has been
//!   applied by the followers ([`Replicator::settle`]). The thread that
//!   finds writes unshipped runs the round itself (the first to take the
//!   shipping lock; the others find their writes shipped by it), so a
//!   burst of writes, or the writes of many connections, costs one round
//!   trip. A read waits as well when it may have seen a write not yet
//!   replicated, so no client ever sees a value a failover could take
//!   back.
//! - **Fencing.** A follower applies records only from the server its own
//!   map names primary of their slots; a deposed primary's batch is
//!   refused, so it cannot acknowledge. A server serves only under a lease
//!   from the failover controller (`lease`), and a primary that finds it
//!   was deposed while holding writes it could not replicate stops at once
//!   ([`FENCED_EXIT_CODE`]) rather than answer for them: it is restarted
//!   (by its supervisor) and comes back as a joiner.
//! - **Joiners.** A server the controller adds to a group is streamed the
//!   group's slots by the primary in chunks built by the replicator's
//!   thread, after a record that makes it drop whatever it held of them;
//!   it receives every write from the same round on, so once the last
//!   chunk is acknowledged it is in sync, and the primary moves it into
//!   the group's backups with a compare-and-swap of the map in etcd.
//!   Until then replies do not wait for it (it is no copy a failover
//!   could choose): a stream never sits in front of a reply.

pub mod backup;
pub mod cpus;
mod followers;
pub mod lease;
mod moves;

use std::collections::{HashMap, HashSet, VecDeque};
use std::io::Read;
use std::net::TcpStream;
use std::os::fd::BorrowedFd;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::thread::JoinHandle;
use std::time::Duration;

use fabrickv_auth::Secret;
use fabrickv_cluster::etcd::EtcdRegistry;
use fabrickv_cluster::slots::key_slot;
use fabrickv_engine::{
    ItemMeta, JournalSeq, LargeValue, Partition, PutCond, ValueRef, LARGE_VALUE_BYTES_MIN,
};
use fabrickv_rpc::gate::{FlushGate, Settle};
use fabrickv_types::KeyHash;

use crate::partitions::{Partitions, BACKGROUND_HOLD_ITEMS_MIN};
use crate::ps::replica::{row_slot, RowState, PS_MARKER_TABLE_BIT};
use crate::ps::PsStore;
use crate::service::Clock;
use crate::slot_routing::{Routing, SlotRouting};
use fabrickv_wire::ps::TableSpec;
use fabrickv_wire::repl as records;
use records::{BatchBuf, Record, REPL_MESSAGE_BYTES_MAX};

// The stream's handshake carries the cluster secret's nonce and proof.
const _: () = assert!(records::NONCE_BYTES == fabrickv_auth::NONCE_BYTES);
const _: () = assert!(records::PROOF_BYTES == fabrickv_auth::PROOF_BYTES);

/// How long a primary waits for a follower's acknowledgement before it
/// reconnects and sends the batch again, in milliseconds.
pub const REPL_ACK_TIMEOUT_MS: u64 = 250;

/// Pause between two tries to reach a follower that did not answer, in
/// milliseconds. A follower that stays silent is removed from its groups
/// by the controller, and the primary stops waiting for it.
pub const REPL_RETRY_MS: u64 = 10;

/// How long a primary keeps trying a follower it cannot reach (or that
/// does not answer) before it removes the follower from its groups
/// itself, in milliseconds: the controller does so only for a server
/// silent to *it*, and one cut off from this primary alone must not stop
/// its writes for ever.
pub const REPL_FOLLOWER_GIVE_UP_MS: u64 = 1_000;

/// Longest wait to connect to a follower, in milliseconds.
pub const REPL_CONNECT_TIMEOUT_MS: u64 = 250;

/// Rounds launched and not yet acknowledged by every follower, at most:
/// past this, the next round waits for acknowledgements, so a follower
/// slower than the primary's writers holds at most this many batches in
/// the primary's memory.
pub const REPL_ROUNDS_IN_FLIGHT_MAX: u64 = 16;

/// How often the replicator's own thread looks for work no reply waits
/// on (joiners to stream, silent followers), in milliseconds.
pub const REPL_TICK_MS: u64 = 5;

/// How often the replicator's thread looks again, in microseconds, while
/// a hand-over waits for the request threads to leave their turns: a
/// turn lasts microseconds, and every write to the group waits meanwhile.
pub const HANDOVER_POLL_US: u64 = 100;

/// Index entries a stream's walk for its group's keys examines per hold
/// of a partition's lock ([`Replicator::walk_streams`]); the walking
/// thread gives its core up between holds (`sched_yield`), so a serving
/// thread woken meanwhile waits for one hold, not for the scheduler's
/// slice (milliseconds on a busy machine).
const STREAM_SCAN_ENTRIES: usize = 512;

/// Records a follower applies between two offers of its core
/// (`sched_yield`), for the same reason.
pub const APPLY_YIELD_RECORDS: usize = 64;

/// Bytes of slot contents one stream chunk carries, about. A chunk is
/// built under the shipping lock and applied by the joiner ahead of any
/// write of a round after it, so it is kept small enough that neither
/// wait shows in a reply's latency; several in flight keep the joiner
/// busy.
pub const STREAM_CHUNK_BYTES: usize = 256 << 10;

/// Bytes of slot contents one stream chunk carries, about, while replies
/// wait for this server's rounds (a group it leads has a backup): a
/// chunk is built inside a round, under the shipping lock, by a thread
/// that shares the movement CPUs with the joiner's applies, and the
/// rounds that acknowledgements wait for wait behind it, and with them
/// the requests a worker serves while it waits. With two copies, a
/// read's p99 during a move (`bench growth --replicas 2`) was 7.2-9.0x
/// the one before with [`STREAM_CHUNK_BYTES`], 3.3-6.2x with this;
/// with one copy no reply waits for a round, and smaller chunks only
/// cost the move its rate.
pub const STREAM_CHUNK_BYTES_GATED: usize = 64 << 10;
const _: () = assert!(STREAM_CHUNK_BYTES_GATED <= STREAM_CHUNK_BYTES);

/// Chunks of one stream sent and not yet acknowledged, at most.
pub const STREAM_CHUNKS_IN_FLIGHT: usize = 2;

/// Batches a joiner still being streamed may have unacknowledged before
/// replies wait for it as for a backup: a joiner holds no copy a
/// failover could choose, so replies do not wait on it while it keeps
/// up, and this bounds what the primary holds for one that does not.
pub const LEARNER_BATCHES_BEHIND_MAX: usize = 256;

/// Exit status of a primary that was deposed while holding writes it
/// could not replicate (EX_TEMPFAIL): it stops rather than answer for
/// them, and its supervisor restarts it.
pub const FENCED_EXIT_CODE: i32 = 75;

/// Stops the process: a deposed primary with writes it cannot stand
/// behind. Replies still buffered are never sent.
fn fence_exit(why: &str) -> ! {
    tracing::error!("replication: {why}; stopping (exit {FENCED_EXIT_CODE}) to rejoin as a backup");
    eprintln!("fabrickv: replication: {why}; stopping (exit {FENCED_EXIT_CODE})");
    std::process::exit(FENCED_EXIT_CODE)
}

/// A key's state as a record carries it.
pub(crate) enum State {
    Put {
        value: Vec<u8>,
        expire_unix_ms: u64,
        meta: Option<(u64, u32)>,
    },
    Large {
        value: fabrickv_engine::LargeValue,
        expire_unix_ms: u64,
    },
    Absent,
}

/// Converts between engine milliseconds and Unix milliseconds.
#[derive(Debug, Clone, Copy)]
pub struct UnixClock {
    clock: Clock,
    /// Unix ms minus engine ms, read once.
    offset_ms: i64,
}

impl UnixClock {
    /// The offset of `clock`, read now.
    pub fn new(clock: Clock) -> UnixClock {
        let unix = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as i64);
        UnixClock {
            clock,
            offset_ms: unix - clock.now_ms() as i64,
        }
    }

    /// Engine time `ms` (0: no expiry) in Unix ms (0 likewise).
    pub fn to_unix(&self, ms: u64) -> u64 {
        if ms == 0 {
            return 0;
        }
        (ms as i64 + self.offset_ms).max(1) as u64
    }

    /// Unix time `ms` (0: none) in engine ms (0 likewise; a time already
    /// past maps to 1, which is past too).
    pub fn to_engine(&self, ms: u64) -> u64 {
        if ms == 0 {
            return 0;
        }
        (ms as i64 - self.offset_ms).max(1) as u64
    }

    /// The engine clock.
    pub fn clock(&self) -> Clock {
        self.clock
    }
}

/// Reads `key`'s state in `part` at engine time `now_ms`.
pub(crate) fn read_state(part: &Partition, key: &[u8], now_ms: u64, unix: &UnixClock) -> State {
    match part.peek_item(KeyHash::of(key), key, now_ms) {
        None => State::Absent,
        Some(item) => match item.value {
            ValueRef::Large(v) => State::Large {
                value: v.clone(),
                expire_unix_ms: unix.to_unix(item.expire_at_ms),
            },
            ValueRef::Inline(value) => State::Put {
                value: value.to_vec(),
                expire_unix_ms: unix.to_unix(item.expire_at_ms),
                meta: item.meta.map(|m| (m.cas, m.client_flags)),
            },
        },
    }
}

/// Stores a key's shipped (or restored) state in `part`, the key's
/// partition: a `Put` overwrites (one already expired deletes), a `Del`
/// deletes; any other record is not a key's and is ignored here.
pub(crate) fn store_key_record(part: &mut Partition, rec: &Record<'_>, unix: &UnixClock, now: u64) {
    match rec {
        Record::Put {
            key,
            value,
            expire_unix_ms,
            meta,
        } => {
            let hash = KeyHash::of(key);
            let expire = unix.to_engine(*expire_unix_ms);
            if expire != 0 && expire <= now {
                let _ = part.delete(hash, key, now);
                return;
            }
            let done = match meta {
                Some((cas, flags)) => part.put_with_meta(
                    hash,
                    key,
                    value,
                    expire,
                    PutCond::Always,
                    now,
                    ItemMeta {
                        cas: *cas,
                        client_flags: *flags,
                    },
                ),
                None if value.len() >= LARGE_VALUE_BYTES_MIN => part.put_large(
                    hash,
                    key,
                    LargeValue::copy_from(value),
                    expire,
                    PutCond::Always,
                    now,
                ),
                None => part.put(hash, key, value, expire, PutCond::Always, now),
            };
            if !matches!(done, fabrickv_engine::PutResult::Stored) {
                tracing::warn!("a shipped or restored value could not be stored here: {done:?}");
            }
        }
        Record::Del { key } => {
            let _ = part.delete(KeyHash::of(key), key, now);
        }
        _ => {}
    }
}

/// The tables a batch (or a checkpoint file) described: the sender's id
/// of each, and this server's id of it (`None`: it could not be made
/// here, and its rows are not kept).
pub(crate) type TableIds = HashMap<u32, Option<u32>>;

/// Stores an embedding record shipped by a primary or read from a
/// checkpoint: a `PsTable` is adopted by name (noted in `tables`), a
/// `PsRow` or `PsDel` stored in this server's table of that id (or as a
/// push's marker); any other record is ignored here. `from` names the
/// source in what is logged.
pub(crate) fn store_table_record(
    ps: &PsStore,
    unix: &UnixClock,
    rec: &Record<'_>,
    tables: &mut TableIds,
    now: u64,
    from: &dyn std::fmt::Display,
) {
    let (table, key, value, expire_unix_ms) = match rec {
        Record::PsTable { id, spec } => {
            let local = fabrickv_wire::ps::decode_create(spec)
                .map_err(|(_, why)| why)
                .and_then(|spec| ps.adopt_table(&spec))
                .map_err(|e| {
                    tracing::error!(
                        "{from}: table {id} cannot be made here, its rows are not kept: {e}"
                    )
                })
                .ok();
            tables.insert(*id, local);
            return;
        }
        Record::PsRow {
            table,
            key,
            value,
            expire_unix_ms,
        } => (*table, *key, Some(*value), *expire_unix_ms),
        Record::PsDel { table, key } => (*table, *key, None, 0),
        _ => return,
    };
    let local = if table & PS_MARKER_TABLE_BIT != 0 {
        Some(table)
    } else {
        tables.get(&table).copied().flatten()
    };
    let Some(local) = local else {
        return;
    };
    if let Err(e) = ps.apply_row(local, key, value, unix.to_engine(expire_unix_ms), now) {
        tracing::warn!("{from}: an embedding row could not be stored here: {e}");
    }
}

pub(crate) fn append_state(out: &mut BatchBuf, key: &[u8], state: &State) {
    match state {
        State::Put {
            value,
            expire_unix_ms,
            meta,
        } => out.put(key, value, *expire_unix_ms, *meta),
        State::Large {
            value,
            expire_unix_ms,
        } => out.put(key, value.as_slice(), *expire_unix_ms, None),
        State::Absent => out.del(key),
    }
}

/// The tables a round's batches have described so far: a follower
/// numbers its tables itself, so each batch names a table's shape
/// (`PsTable`) before its first row of it.
#[derive(Default)]
struct Tables {
    /// (follower, table) pairs described in this round's batches.
    described: HashSet<(u32, u32)>,
    /// Shapes read so far this round (`None`: no such table).
    specs: HashMap<u32, Option<TableSpec>>,
}

impl Tables {
    /// Appends row `key` of `table` in `state` to follower `f`'s batch
    /// `buf`, after the table's shape if the batch lacks it.
    #[allow(clippy::too_many_arguments)]
    fn append(
        &mut self,
        ps: &PsStore,
        unix: &UnixClock,
        buf: &mut BatchBuf,
        f: u32,
        table: u32,
        key: u64,
        state: &RowState<'_>,
    ) {
        if table & PS_MARKER_TABLE_BIT == 0 {
            let Some(spec) = self.specs.entry(table).or_insert_with(|| ps.spec_of(table)) else {
                // No such table: a follower could not place the row.
                return;
            };
            if self.described.insert((f, table)) {
                buf.ps_table(table, spec);
            }
        }
        match state {
            RowState::Present { value, expire_ms } => {
                buf.ps_row(table, key, value, unix.to_unix(*expire_ms))
            }
            RowState::Absent => buf.ps_del(table, key),
        }
    }
}

/// Appends the record that begins stream `st` (its joiner drops what it
/// held of the group's slots) and marks it begun.
fn stream_begin(st: &mut Stream, r: &Routing, out: &mut BatchBuf) {
    if let Some(g) = r.map.groups.get(st.group) {
        let ranges: Vec<records::SlotRange> = g
            .ranges
            .iter()
            .map(|r| records::SlotRange {
                first: r.first,
                last: r.last,
            })
            .collect();
        out.stream_begin(&ranges);
        st.begun = true;
    }
}

/// A joiner being streamed a group's slots.
#[derive(Debug)]
struct Stream {
    /// Tells this stream from a later one of the same group and joiner.
    id: u64,
    group: usize,
    joiner: u32,
    begun: bool,
    /// Where the walk goes on: a kv partition (then the pool's shards,
    /// numbered after them) and a bucket in it.
    partition: usize,
    bucket: usize,
    /// Keys of the group the walk found and no chunk carried yet, by kv
    /// partition ([`Replicator::walk_streams`]; their states are read
    /// when a chunk carries them).
    found: Vec<(usize, Vec<Vec<u8>>)>,
    /// The round carrying the walk's last chunk, once sent.
    last_round: Option<u64>,
    /// Rounds carrying this stream's chunks the joiner has not
    /// acknowledged yet, oldest first.
    chunks: VecDeque<u64>,
    /// The joiner acknowledged the last chunk: it holds every slot's
    /// contents, and replies wait for it from round `complete` on (every
    /// round before it is on it once it acknowledges that one).
    complete: Option<u64>,
}

impl Stream {
    /// Whether another chunk may be sent now.
    fn wants_chunk(&self) -> bool {
        self.last_round.is_none() && self.chunks.len() < STREAM_CHUNKS_IN_FLIGHT
    }

    /// Whether the kv partitions' walk must find more keys before the
    /// next chunk can be sent.
    fn wants_walk(&self, partitions: usize) -> bool {
        self.begun && self.wants_chunk() && self.found.is_empty() && self.partition < partitions
    }

    /// Whether the joiner holds everything a failover may need of it:
    /// it acknowledged its last chunk and every batch of the rounds
    /// before it began to count in replies (those after wait for it).
    fn in_sync(&self, follower: Option<&followers::Follower>) -> bool {
        self.complete
            .is_some_and(|from| follower.is_none_or(|fo| fo.acked_through(from)))
    }
}

/// A round sent and not yet acknowledged by every follower.
struct InFlight {
    round: u64,
    /// Each partition the round drained, and its journal's count then.
    drained: Vec<(usize, u64)>,
    /// Followers whose acknowledgement of the round's batch is awaited.
    awaiting: Vec<u32>,
}

/// The state of shipping, behind the replicator's shipping lock, which is
/// never held across a wait on the network (writes aside).
#[derive(Default)]
struct Shipper {
    spare: Vec<u8>,
    followers: HashMap<u32, followers::Follower>,
    batch_seq: u64,
    streams: Vec<Stream>,
    /// The last stream's id.
    stream_ids: u64,
    /// Rounds launched and not yet complete, oldest first.
    in_flight: VecDeque<InFlight>,
    /// Groups this server leads that are handing over, by number.
    handovers: HashMap<usize, moves::Handover>,
    /// The slots this server held a copy of and those it led, and the
    /// epoch of that map.
    held: Option<(u64, moves::SlotRoles)>,
}

/// The primary side of replication, shared by every thread that replies.
pub struct Replicator {
    me: u32,
    secret: Option<Secret>,
    parts: Arc<Partitions>,
    /// The kv partitions' journal counts.
    seqs: Box<[Arc<JournalSeq>]>,
    /// The embedding tables, whose pool's shards journal too once built.
    ps: Arc<PsStore>,
    /// The KV cache, whose blocks live only on their slots' primaries.
    cache: Arc<crate::cache::CacheShared>,
    /// The pool's shards' journal counts, once the pool exists.
    ps_seqs: OnceLock<Box<[Arc<JournalSeq>]>>,
    /// Per journal, the count some launched round drained.
    launched: Box<[AtomicU64]>,
    routing: Arc<SlotRouting>,
    unix: UnixClock,
    registry: EtcdRegistry,
    ship: Mutex<Shipper>,
    /// Rounds launched and rounds complete (the ticket counters; rounds
    /// complete in order), and the highest ticket handed out.
    rounds_started: AtomicU64,
    rounds_done: AtomicU64,
    wanted: AtomicU64,
    /// Woken after rounds complete.
    gate: Arc<FlushGate>,
    /// Where a worker blocked in [`Settle::settle`] waits.
    done_lock: Mutex<()>,
    done_cv: Condvar,
    /// Set when the server stops.
    stop: AtomicBool,
    /// What each new map took from this server, for the release thread
    /// ([`moves::spawn_releaser`]).
    release: std::sync::mpsc::Sender<moves::SlotRoles>,
    /// Threads waiting in [`Replicator::pump`] now.
    pumping: AtomicUsize,
    /// The replicator's own thread, unparked when it has work.
    thread: std::sync::OnceLock<std::thread::Thread>,
    /// Whether a group this server leads has followers, as of routing
    /// version `followers_seen` (`u64::MAX`: not worked out yet).
    followers: AtomicBool,
    followers_seen: AtomicU64,
    /// Whether a joiner's rounds hold replies back ([`Replicator::gates`]).
    joiners_gate: AtomicBool,
    /// Whether a stream has chunks to send or to be acknowledged: the
    /// replicator's thread then waits on the followers' sockets, not a
    /// tick.
    streaming: AtomicBool,
    /// Whether a hand-over waits out a grace ([`moves`]): the thread then
    /// looks again after [`HANDOVER_POLL_US`], not a tick.
    handover_polling: AtomicBool,
    /// Where its thread runs while a stream is under way, and the
    /// release thread always ([`cpus`]).
    stream_cpus: cpus::StreamCpus,
}

impl Settle for Replicator {
    fn ticket(&self) -> Option<u64> {
        // Nothing to wait for while no group this server leads has a
        // follower (a cluster of one copy, until slots move): its writes
        // are shipped by the replicator's own rounds, if ever needed.
        if !self.unacked() || !self.leads_followers() {
            return None;
        }
        let t = if self.unlaunched() {
            // Launch a round for these writes here (no wait: the loop
            // serves its other connections meanwhile, and the next
            // round may leave before this one is acknowledged). When the
            // shipping lock is busy (a joiner's chunk being built), the
            // replicator's thread launches the next round right after.
            match self.ship.try_lock() {
                Ok(mut sh) => self.launch_for(&mut sh),
                Err(std::sync::TryLockError::Poisoned(p)) => self.launch_for(&mut p.into_inner()),
                Err(std::sync::TryLockError::WouldBlock) => {
                    let next = self.rounds_started.load(Ordering::Acquire) + 1;
                    self.wanted.fetch_max(next, Ordering::AcqRel);
                    self.wake_thread();
                    next
                }
            }
        } else {
            // Every write so far is in a round already launched.
            self.rounds_started.load(Ordering::Acquire)
        };
        (!self.done(t)).then_some(t)
    }

    fn done(&self, ticket: u64) -> bool {
        self.rounds_done.load(Ordering::Acquire) >= ticket
    }

    fn settle(&self) {
        let Some(t) = self.ticket() else {
            return;
        };
        while !self.done(t) {
            // Reads the acknowledgements itself; when none can be read
            // here (a connection being mended), waits to be told.
            if !self.pump(None, Duration::from_millis(REPL_TICK_MS)) {
                let g = self.done_lock.lock().unwrap_or_else(|p| p.into_inner());
                if !self.done(t) {
                    let _ = self
                        .done_cv
                        .wait_timeout(g, Duration::from_millis(REPL_TICK_MS));
                }
            }
        }
    }

    fn wait(&self, also: Option<BorrowedFd<'_>>, timeout: Duration) -> bool {
        self.pump(also, timeout)
    }
}

impl Replicator {
    /// Whether replies wait for some follower: a group this server leads
    /// has a backup in the routing installed now (worked out again only
    /// when the routing changed: one load otherwise), or a joiner counts
    /// as one ([`Replicator::gates`]).
    #[inline]
    fn leads_followers(&self) -> bool {
        let v = self.routing.version();
        if self.followers_seen.load(Ordering::Acquire) != v {
            let me = self.me;
            let any = self.routing.routing().is_some_and(|r| {
                r.map
                    .groups
                    .iter()
                    .any(|g| g.primary == me && !g.backups.is_empty())
            });
            self.followers.store(any, Ordering::Release);
            self.followers_seen.store(v, Ordering::Release);
        }
        self.followers.load(Ordering::Acquire) || self.joiners_gate.load(Ordering::Acquire)
    }

    /// Whether the rounds sent to follower `f` hold replies back: a
    /// backup's do; a joiner's do not while it is being streamed and
    /// keeps up (it is no copy a failover could choose, and a move hands
    /// a group over only after a round it acknowledged), so a move's
    /// stream never sits in front of a reply.
    fn gates(&self, sh: &Shipper, r: &Routing, f: u32) -> bool {
        sh.followers.get(&f).is_some_and(followers::Follower::lags)
            || r.map.groups.iter().enumerate().any(|(gi, g)| {
                g.primary == self.me
                    && (g.backups.contains(&f)
                        || (g.joining.contains(&f)
                            && !sh.streams.iter().any(|st| {
                                st.group == gi && st.joiner == f && st.complete.is_none()
                            })))
            })
    }

    /// Notes, after the streams or the followers changed, whether some
    /// joiner holds replies back and whether a stream has chunks to send
    /// or acknowledge.
    fn note_streams(&self, sh: &Shipper) {
        let gate = sh.streams.iter().any(|st| {
            st.complete.is_some()
                || sh
                    .followers
                    .get(&st.joiner)
                    .is_some_and(followers::Follower::lags)
        });
        self.joiners_gate.store(gate, Ordering::Release);
        let busy = sh
            .streams
            .iter()
            .any(|st| st.wants_chunk() || !st.chunks.is_empty());
        self.streaming.store(busy, Ordering::Release);
    }

    fn lock_ship(&self) -> std::sync::MutexGuard<'_, Shipper> {
        self.ship.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The pool's shards' journal counts: empty until the pool is built.
    #[inline]
    fn ps_seqs(&self) -> &[Arc<JournalSeq>] {
        if let Some(s) = self.ps_seqs.get() {
            return s;
        }
        match self.ps.journal_seqs() {
            Some(v) => self.ps_seqs.get_or_init(|| v.into_boxed_slice()),
            None => &[],
        }
    }

    /// The journals there are now: the kv partitions', then the pool's.
    fn journals(&self) -> usize {
        self.seqs.len() + self.ps_seqs().len()
    }

    /// Journal `i`'s counts: the kv partitions', then the pool's shards'.
    /// Its replicated count is the one every follower has applied, kept
    /// there so that a worker can tell a read of a settled key
    /// ([`Partitions::key_settled`]).
    #[inline]
    fn journal(&self, i: usize) -> &JournalSeq {
        match self.seqs.get(i) {
            Some(s) => s,
            None => &self.ps_seqs()[i - self.seqs.len()],
        }
    }

    /// Journal `i`'s write count.
    #[inline]
    fn seq_at(&self, i: usize) -> u64 {
        self.journal(i).get()
    }

    /// Whether any journal holds writes its followers have not applied.
    fn unacked(&self) -> bool {
        (0..self.journals()).any(|p| !self.journal(p).settled())
    }

    /// Whether any journal holds writes no round has taken yet.
    fn unlaunched(&self) -> bool {
        (0..self.journals()).any(|p| self.seq_at(p) > self.launched[p].load(Ordering::Acquire))
    }

    fn stopped(&self) -> bool {
        self.stop.load(Ordering::Acquire)
    }

    fn wake_thread(&self) {
        if let Some(th) = self.thread.get() {
            th.unpark();
        }
    }

    /// Whether another round may be launched now.
    fn room(&self) -> bool {
        self.rounds_started.load(Ordering::Acquire) - self.rounds_done.load(Ordering::Acquire)
            < REPL_ROUNDS_IN_FLIGHT_MAX
    }

    /// Whether a ticket waits for a round not launched yet.
    fn owed(&self) -> bool {
        self.wanted.load(Ordering::Acquire) > self.rounds_started.load(Ordering::Acquire)
    }

    /// About how many bytes of slot contents a stream chunk carries now
    /// ([`STREAM_CHUNK_BYTES_GATED`] while replies wait for rounds).
    fn chunk_bytes(&self) -> usize {
        if self.leads_followers() {
            STREAM_CHUNK_BYTES_GATED
        } else {
            STREAM_CHUNK_BYTES
        }
    }

    /// Launches the round tickets wait for, if there is room now.
    fn launch_owed(&self, sh: &mut Shipper) {
        if self.owed() && self.room() {
            self.launch(sh);
        }
    }

    /// The round that will cover every write made before this call: one
    /// launched now, or, with [`REPL_ROUNDS_IN_FLIGHT_MAX`] in flight, the
    /// next one, which the replicator's thread launches once room is made.
    fn launch_for(&self, sh: &mut Shipper) -> u64 {
        let started = self.rounds_started.load(Ordering::Acquire);
        if !self.unlaunched() {
            // Another thread's round took them while this one waited.
            return started;
        }
        if self.room() {
            return self.launch(sh);
        }
        // Launched by whichever thread takes the acknowledgement that
        // makes room (or the replicator's thread on its next tick).
        self.wanted.fetch_max(started + 1, Ordering::AcqRel);
        started + 1
    }

    /// Launches one round: streams chunks to joiners, drains every
    /// journal, and queues (and writes) each follower its batch; returns
    /// the round's number. It completes once every follower it went to
    /// acknowledged it, and every round before it completed.
    fn launch(&self, sh: &mut Shipper) -> u64 {
        self.launch_with(sh, false)
    }

    /// [`Replicator::launch`], with the joiners' next chunks when
    /// `stream` (only the replicator's thread builds them: a worker
    /// launching a round for its replies never does).
    fn launch_with(&self, sh: &mut Shipper, stream: bool) -> u64 {
        let round = self.rounds_started.fetch_add(1, Ordering::AcqRel) + 1;
        let mut flight = InFlight {
            round,
            drained: Vec::new(),
            awaiting: Vec::new(),
        };
        match self.routing.routing() {
            Some(r) => self.send_round(sh, &r, &mut flight, stream),
            // No map, no followers: nothing to wait for.
            None => {
                for p in 0..self.journals() {
                    let seq = self.seq_at(p);
                    self.launched[p].fetch_max(seq, Ordering::AcqRel);
                    flight.drained.push((p, seq));
                }
            }
        }
        sh.in_flight.push_back(flight);
        self.advance(sh);
        self.note_streams(sh);
        round
    }

    /// The work of [`Replicator::launch`] under map `r`: each joiner's
    /// next chunk and every journal's writes, batched per follower and
    /// queued (and written), noted in `flight`.
    fn send_round(&self, sh: &mut Shipper, r: &Routing, flight: &mut InFlight, stream: bool) {
        let round = flight.round;
        let now = self.unix.clock().now_ms();
        let mut out: HashMap<u32, BatchBuf> = HashMap::new();
        let mut tables = Tables::default();
        self.follow_joiners(sh, r);
        for st in sh.streams.iter_mut() {
            // A stream begins in the round that first sees it, ahead of
            // any write of the group that round or later carries.
            if !st.begun {
                stream_begin(st, r, out.entry(st.joiner).or_default());
            }
            if stream && st.wants_chunk() {
                let buf = out.entry(st.joiner).or_default();
                if self.stream_chunk(st, r, buf, &mut tables, now) {
                    st.chunks.push_back(round);
                }
                if st.partition >= self.journals() {
                    // The walk is done: the stream completes with its
                    // newest chunk's acknowledgement, or now if every
                    // chunk was acknowledged (a round without a batch for
                    // the joiner is never acknowledged by it).
                    match st.chunks.back() {
                        Some(&c) => st.last_round = Some(c),
                        None => {
                            st.last_round = Some(round);
                            st.complete = Some(round);
                        }
                    }
                }
            }
        }
        let mut foreign = false;
        for p in 0..self.seqs.len() {
            if self.seqs[p].get() <= self.launched[p].load(Ordering::Acquire) {
                continue;
            }
            let mut part = self.parts.lock(p);
            let spare = std::mem::take(&mut sh.spare);
            let Some(journal) = part.journal_mut() else {
                continue;
            };
            let noted = journal.take(spare);
            if noted.flushed {
                for g in r.map.groups.iter().filter(|g| g.primary == self.me) {
                    for f in g.followers() {
                        out.entry(f)
                            .or_default()
                            .flush_partition(self.seqs.len() as u32, p as u32);
                    }
                }
            }
            let mut seen: HashSet<&[u8]> = HashSet::new();
            for key in noted.iter() {
                if !seen.insert(key) {
                    continue;
                }
                let g = &r.map.groups[r.routes.group_of(key_slot(key))];
                if g.primary != self.me || !r.active {
                    foreign = true;
                    continue;
                }
                if g.followers().next().is_none() {
                    continue;
                }
                let state = read_state(&part, key, now, &self.unix);
                for f in g.followers() {
                    append_state(out.entry(f).or_default(), key, &state);
                }
            }
            drop(seen);
            drop(part);
            self.launched[p].fetch_max(noted.seq, Ordering::AcqRel);
            flight.drained.push((p, noted.seq));
            sh.spare = noted.keys;
        }
        foreign |= self.drain_rows(sh, r, flight, &mut out, &mut tables, now);
        if foreign {
            fence_exit("writes were made to slots this server no longer leads");
        }
        let mut mend = false;
        for (f, mut buf) in out {
            if buf.is_empty() {
                continue;
            }
            sh.batch_seq += 1;
            let msg = buf.seal(r.map.epoch, sh.batch_seq);
            let seq = sh.batch_seq;
            if self.gates(sh, r, f) {
                flight.awaiting.push(f);
            }
            mend |= sh.followers.entry(f).or_default().send(seq, round, msg);
        }
        if mend {
            self.wake_thread();
        }
    }

    /// The embedding rows' part of a round: every pool shard's journal,
    /// drained holding the store's barrier (so that no push is half in
    /// the round), each row's state queued for its group's followers.
    /// Returns whether a row of a slot this server does not lead was
    /// written.
    fn drain_rows(
        &self,
        sh: &mut Shipper,
        r: &Routing,
        flight: &mut InFlight,
        out: &mut HashMap<u32, BatchBuf>,
        tables: &mut Tables,
        now: u64,
    ) -> bool {
        let kv = self.seqs.len();
        let shards = self.ps_seqs().len();
        let due = |j: usize| self.seq_at(kv + j) > self.launched[kv + j].load(Ordering::Acquire);
        if !(0..shards).any(due) {
            return false;
        }
        let mut foreign = false;
        let _barrier = self.ps.drain_barrier();
        for j in (0..shards).filter(|&j| due(j)) {
            let spare = std::mem::take(&mut sh.spare);
            let drained = self.ps.drain(j, spare, now, &mut |table, key, state| {
                let g = &r.map.groups[r.routes.group_of(row_slot(table, key))];
                if g.primary != self.me || !r.active {
                    foreign = true;
                    return;
                }
                for f in g.followers() {
                    let buf = out.entry(f).or_default();
                    tables.append(&self.ps, &self.unix, buf, f, table, key, &state);
                }
            });
            if let Some((seq, keys)) = drained {
                self.launched[kv + j].fetch_max(seq, Ordering::AcqRel);
                flight.drained.push((kv + j, seq));
                sh.spare = keys;
            }
        }
        foreign
    }

    /// Follower `f` acknowledged its batch of `round` (and so every
    /// batch it was sent before).
    fn acked_by(&self, sh: &mut Shipper, f: u32, round: u64) {
        let started = self.rounds_started.load(Ordering::Acquire);
        let mut room = false;
        for st in sh.streams.iter_mut().filter(|st| st.joiner == f) {
            while st.chunks.front().is_some_and(|&c| c <= round) {
                st.chunks.pop_front();
                room = true;
            }
            if st.complete.is_none() && st.last_round.is_some_and(|l| l <= round) {
                // Every round from the next on waits for it too.
                st.complete = Some(started);
            }
        }
        if let Some(r) = sh.in_flight.iter_mut().find(|r| r.round == round) {
            r.awaiting.retain(|&x| x != f);
        }
        self.advance(sh);
        self.note_streams(sh);
        if room {
            self.wake_thread();
        }
    }

    /// Stops waiting for follower `f`, which no longer follows this
    /// server: its connection is reset and its rounds complete without it.
    fn forget(&self, sh: &mut Shipper, f: u32) {
        if let Some(mut fo) = sh.followers.remove(&f) {
            fo.abort();
        }
        for r in sh.in_flight.iter_mut() {
            r.awaiting.retain(|&x| x != f);
        }
        sh.streams.retain(|st| st.joiner != f);
        self.advance(sh);
        self.note_streams(sh);
    }

    /// Completes, in order, the rounds every follower acknowledged, and
    /// wakes whoever waits on them.
    fn advance(&self, sh: &mut Shipper) {
        let mut done = None;
        while sh.in_flight.front().is_some_and(|r| r.awaiting.is_empty()) {
            let Some(r) = sh.in_flight.pop_front() else {
                break;
            };
            for (p, seq) in r.drained {
                self.journal(p).mark_replicated(seq);
            }
            self.rounds_done.store(r.round, Ordering::Release);
            done = Some(r.round);
        }
        if done.is_none() {
            return;
        }
        drop(self.done_lock.lock().unwrap_or_else(|p| p.into_inner()));
        self.done_cv.notify_all();
        self.gate.wake_waiters();
        if self.owed() || sh.handovers.values().any(moves::Handover::awaits_round) {
            self.wake_thread();
        }
    }

    /// The replicator thread's turn: mends followers, launches rounds
    /// owed to tickets or to writes no reply waits on, a joiner's next
    /// chunk, and promotes joiners whose stream completed.
    fn service(&self) {
        if self.pumping.load(Ordering::Acquire) == 0 {
            // Rounds no reply waits on (or whose waiter is busy).
            self.pump(None, Duration::ZERO);
        }
        self.mend_followers();
        // A joiner's chunks are paced by its acknowledgements: up to
        // STREAM_CHUNKS_IN_FLIGHT rounds here, and more once they come.
        for _ in 0..STREAM_CHUNKS_IN_FLIGHT + 1 {
            self.walk_streams();
            let owed = self.owed();
            let unlaunched = self.unlaunched();
            let routing = self.routing.routing();
            let mut sh = self.lock_ship();
            // The streams the map asks for now: a joiner added since the
            // last round gets its stream here, not only once a write
            // launches a round (an idle cluster has none), and one
            // promoted or gone is forgotten.
            if let Some(r) = &routing {
                self.follow_joiners(&mut sh, r);
            }
            let kv = self.seqs.len();
            let stream_now = sh.streams.iter().any(|st| {
                !st.begun || (st.wants_chunk() && (!st.found.is_empty() || st.partition >= kv))
            });
            if !self.room() || !(owed || unlaunched || stream_now) {
                break;
            }
            self.launch_with(&mut sh, true);
        }
        self.promote_complete();
        self.hand_over();
        self.release_dropped();
    }

    /// Starts a stream for every joiner of a group this server leads, and
    /// forgets streams whose joiner left or was promoted.
    fn follow_joiners(&self, sh: &mut Shipper, r: &Routing) {
        sh.streams.retain(|st| {
            r.map
                .groups
                .get(st.group)
                .is_some_and(|g| g.primary == self.me && g.joining.contains(&st.joiner))
        });
        if !r.active {
            return;
        }
        for (gi, g) in r.map.groups.iter().enumerate() {
            if g.primary != self.me {
                continue;
            }
            for &j in &g.joining {
                if !sh.streams.iter().any(|s| s.group == gi && s.joiner == j) {
                    tracing::info!("replication: streaming group {gi}'s slots to joiner {j}");
                    sh.stream_ids += 1;
                    let id = sh.stream_ids;
                    sh.streams.push(Stream {
                        id,
                        found: Vec::new(),
                        group: gi,
                        joiner: j,
                        begun: false,
                        partition: 0,
                        bucket: 0,
                        last_round: None,
                        chunks: VecDeque::new(),
                        complete: None,
                    });
                }
            }
        }
    }

    /// Walks the kv partitions for the keys of every stream that needs
    /// more for its next chunk, without the shipping lock (the index walk
    /// is most of a stream's work, and a round for replies must not wait
    /// behind it), giving the core up between partition visits. Only the
    /// keys are taken here: their states are read when a chunk carries
    /// them, under the shipping lock, so a chunk never carries a state
    /// older than a write a round before it shipped. A key written after
    /// the walk passed it was written after its stream began, and reaches
    /// the joiner with the writes.
    fn walk_streams(&self) {
        let kv = self.seqs.len();
        let Some(r) = self.routing.routing() else {
            return;
        };
        let todo: Vec<(u64, usize, usize, usize)> = self
            .lock_ship()
            .streams
            .iter()
            .filter(|st| st.wants_walk(kv))
            .map(|st| (st.id, st.group, st.partition, st.bucket))
            .collect();
        let now = self.unix.clock().now_ms();
        let chunk_bytes = self.chunk_bytes();
        for (id, group, from_partition, from_bucket) in todo {
            let ours = |slot: u16| r.routes.group_of(slot) == group;
            let (mut partition, mut bucket) = (from_partition, from_bucket);
            let mut found: Vec<(usize, Vec<Vec<u8>>)> = Vec::new();
            let mut bytes = 0;
            while partition < kv && bytes < chunk_bytes {
                let mut keys: Vec<Vec<u8>> = Vec::new();
                // A request waiting for the partition ends the hold at
                // the next chain's end.
                let next = self.parts.scan_background(
                    partition,
                    bucket,
                    now,
                    STREAM_SCAN_ENTRIES,
                    &ours,
                    &mut |k, v| {
                        bytes += k.len() + v.len();
                        keys.push(k.to_vec());
                    },
                );
                if !keys.is_empty() {
                    match found.last_mut() {
                        Some((p, ks)) if *p == partition => ks.append(&mut keys),
                        _ => found.push((partition, keys)),
                    }
                }
                match next {
                    Some(b) => bucket = b,
                    None => {
                        partition += 1;
                        bucket = 0;
                    }
                }
                std::thread::yield_now();
            }
            let mut sh = self.lock_ship();
            // The stream may have ended (or begun again) meanwhile.
            if let Some(st) = sh.streams.iter_mut().find(|st| {
                st.id == id && st.partition == from_partition && st.bucket == from_bucket
            }) {
                st.found = found;
                st.partition = partition;
                st.bucket = bucket;
            }
        }
    }

    /// Appends the next chunk of a stream to its joiner's batch: the
    /// states of the keys the walk found (read now), or past the kv
    /// partitions, of the embedding rows of the group, up to about
    /// [`Replicator::chunk_bytes`]. Returns whether it appended any.
    fn stream_chunk(
        &self,
        st: &mut Stream,
        r: &Routing,
        out: &mut BatchBuf,
        tables: &mut Tables,
        now: u64,
    ) -> bool {
        let before = out.bytes();
        for (p, keys) in std::mem::take(&mut st.found) {
            // A chunk's few hundred keys held the partition for hundreds
            // of microseconds, every request to it waiting: a waiting one
            // has it every BACKGROUND_HOLD_ITEMS_MIN keys. Letting it in
            // mid-chunk is safe under the shipping lock: a write it makes
            // to a key not read yet is in this chunk's state of the key,
            // and ships with the writes as well, read later (no round can
            // take the journals while this one is built).
            let mut part = self.parts.lock_background(p);
            for (i, k) in keys.iter().enumerate() {
                if i % BACKGROUND_HOLD_ITEMS_MIN == 0 && i > 0 && self.parts.wanted(p) {
                    drop(part);
                    part = self.parts.lock_background(p);
                }
                let state = read_state(&part, k, now, &self.unix);
                append_state(out, k, &state);
            }
        }
        // Past the kv partitions, the embedding pool's shards, walked
        // here (under the shipping lock).
        let kv = self.seqs.len();
        let chunk_bytes = before + self.chunk_bytes();
        let ours = |slot: u16| r.routes.group_of(slot) == st.group;
        while st.partition >= kv && st.partition < self.journals() && out.bytes() < chunk_bytes {
            let next = self.ps.scan_rows(
                st.partition - kv,
                st.bucket,
                now,
                &ours,
                &mut |table, key, state| {
                    tables.append(&self.ps, &self.unix, out, st.joiner, table, key, &state);
                },
            );
            match next {
                Some(b) => st.bucket = b,
                None => {
                    st.partition += 1;
                    st.bucket = 0;
                }
            }
        }
        out.bytes() > before
    }

    /// Moves every joiner whose stream completed into its group's
    /// backups, by compare-and-swap of the map in etcd (the watch then
    /// ends the stream).
    fn promote_complete(&self) {
        let complete: Vec<(usize, u32)> = {
            let sh = self.lock_ship();
            sh.streams
                .iter()
                .filter(|s| s.in_sync(sh.followers.get(&s.joiner)))
                .map(|s| (s.group, s.joiner))
                .collect()
        };
        for (group, joiner) in complete {
            let view = match self.registry.view() {
                Ok(v) => v,
                Err(e) => {
                    tracing::warn!("replication: cannot read the map to promote a joiner: {e}");
                    return;
                }
            };
            let Some((map, rev)) = view.map else {
                return;
            };
            if let Some(next) = map.promoted(group, joiner) {
                match self.registry.swap_map(rev, &next) {
                    Ok(true) => tracing::info!(
                        "replication: server {joiner} in sync for group {group} at epoch {}",
                        next.epoch
                    ),
                    Ok(false) => {}
                    Err(e) => tracing::warn!("replication: cannot promote a joiner: {e}"),
                }
            }
        }
    }
}

/// Bytes a message reader asks the socket for at once.
const READ_CHUNK_BYTES: usize = 64 << 10;

/// Reads length-prefixed messages from a stream, as many bytes per read
/// as the socket holds (a message's length and body usually arrive in
/// one read, and so cost one system call).
#[derive(Default)]
pub(crate) struct MsgReader {
    buf: Vec<u8>,
    start: usize,
    end: usize,
}

impl MsgReader {
    /// Makes room for `n` bytes past `start`: what is left moves to the
    /// front, and the buffer grows (to at least a read's worth) if it must.
    fn reserve(&mut self, n: usize) {
        if self.start + n > self.buf.len() {
            self.buf.copy_within(self.start..self.end, 0);
            self.end -= self.start;
            self.start = 0;
            let want = n.max(READ_CHUNK_BYTES);
            if self.buf.len() < want {
                self.buf.resize(want, 0);
            }
        }
    }

    /// Reads until `n` bytes past `start` are buffered.
    fn fill(&mut self, stream: &mut TcpStream, n: usize) -> std::io::Result<()> {
        self.reserve(n);
        while self.end - self.start < n {
            let got = stream.read(&mut self.buf[self.end..])?;
            if got == 0 {
                return Err(std::io::ErrorKind::UnexpectedEof.into());
            }
            self.end += got;
        }
        Ok(())
    }

    /// The next message's body.
    pub(crate) fn next(&mut self, stream: &mut TcpStream) -> std::io::Result<&[u8]> {
        if self.start == self.end {
            self.start = 0;
            self.end = 0;
        }
        self.fill(stream, 4)?;
        let len = self.buffered_len()?;
        self.fill(stream, 4 + len)?;
        let body = self.start + 4..self.start + 4 + len;
        self.start += 4 + len;
        Ok(&self.buf[body])
    }

    /// The length of the message whose 4-byte prefix is buffered.
    fn buffered_len(&self) -> std::io::Result<usize> {
        let mut len = [0u8; 4];
        len.copy_from_slice(&self.buf[self.start..self.start + 4]);
        let len = u32::from_le_bytes(len) as usize;
        if len > REPL_MESSAGE_BYTES_MAX {
            return Err(std::io::Error::other(format!(
                "a replication message of {len} bytes; at most {REPL_MESSAGE_BYTES_MAX}"
            )));
        }
        Ok(len)
    }

    /// Reads what the socket holds now, without waiting (the socket stays
    /// blocking for its writers); an error at the end of the stream.
    fn recv_ready(&mut self, stream: &TcpStream) -> std::io::Result<()> {
        self.reserve(self.end - self.start + READ_CHUNK_BYTES);
        let room = &mut self.buf[self.end..];
        match rustix::net::recv(stream, room, rustix::net::RecvFlags::DONTWAIT) {
            Ok((0, _)) => Err(std::io::ErrorKind::UnexpectedEof.into()),
            Ok((n, _)) => {
                self.end += n;
                Ok(())
            }
            Err(e) if e == rustix::io::Errno::AGAIN || e == rustix::io::Errno::INTR => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    /// Whether a whole message is buffered (the next [`MsgReader::next`]
    /// needs no read).
    pub(crate) fn has_whole(&self) -> bool {
        self.end - self.start >= 4
            && self
                .buffered_len()
                .is_ok_and(|n| self.end - self.start >= 4 + n)
    }

    /// The next message already buffered whole, if any.
    fn buffered(&mut self) -> std::io::Result<Option<&[u8]>> {
        if self.end - self.start < 4 {
            return Ok(None);
        }
        let len = self.buffered_len()?;
        if self.end - self.start < 4 + len {
            return Ok(None);
        }
        let body = self.start + 4..self.start + 4 + len;
        self.start += 4 + len;
        Ok(Some(&self.buf[body]))
    }
}

/// A server's replication while it runs: the replicator armed in its
/// gate, its heartbeats, the listener its primaries ship to, and the
/// replicator's own thread. Dropping it stops the threads.
pub struct Replication {
    // Held for the server's life (the gate and the threads hold it too).
    replicator: Arc<Replicator>,
    _heartbeats: lease::Heartbeats,
    _backup: backup::Listener,
    thread: Option<JoinHandle<()>>,
}

impl Drop for Replication {
    fn drop(&mut self) {
        self.replicator.stop.store(true, Ordering::Release);
        self.replicator.wake_thread();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        // Ends the reader threads; nothing more is sent.
        for fo in self.replicator.lock_ship().followers.values_mut() {
            fo.abort();
        }
    }
}

/// What replication needs from the server.
pub struct ReplicationParts {
    pub parts: Arc<Partitions>,
    pub ps: Arc<PsStore>,
    pub cache: Arc<crate::cache::CacheShared>,
    pub routing: Arc<SlotRouting>,
    pub gate: Arc<FlushGate>,
    pub clock: Clock,
    /// Where slot moves run (`serve --stream-cpus`).
    pub stream_cpus: cpus::StreamCpus,
}

/// Binds the listener a server's primaries ship to (`listen`, a TCP
/// `HOST:PORT`), before the server registers with its address.
pub fn bind(listen: &str) -> std::io::Result<std::net::TcpListener> {
    std::net::TcpListener::bind(listen)
}

/// Starts replication for server `me` of `cluster`: journals on, lease
/// and heartbeats, the follower side on `listener`, and the gate armed.
pub fn start(
    server: ReplicationParts,
    me: u32,
    incarnation: u64,
    registry: EtcdRegistry,
    secret: Option<Secret>,
    listener: std::net::TcpListener,
) -> std::io::Result<Replication> {
    let n = server.parts.len();
    let seqs: Box<[Arc<JournalSeq>]> = (0..n)
        .map(|p| {
            let mut part = server.parts.lock(p);
            // Streams, releases and a joiner's drops walk for some slots'
            // keys: with slot tags they read the index, not every item.
            part.use_slot_tags();
            part.enable_journal()
        })
        .collect();
    server.ps.enable_journals();
    let unix = UnixClock::new(server.clock);
    let lease = Arc::new(crate::slot_routing::Lease::default());
    server.routing.set_lease(lease.clone(), server.clock);
    let backup = backup::Listener::start(
        listener,
        backup::Applier {
            parts: server.parts.clone(),
            ps: server.ps.clone(),
            cache: server.cache.clone(),
            routing: server.routing.clone(),
            unix,
            secret: secret.clone(),
            stream_cpus: server.stream_cpus.clone(),
        },
    )?;
    let heartbeats = lease::start(lease::BeatConfig {
        me,
        incarnation,
        cluster: registry.cluster().to_string(),
        secret: secret.clone(),
        routing: server.routing.clone(),
        lease,
        clock: server.clock,
    })?;
    // Per journal, the count shipped so far: the partitions' now, and 0
    // for the pool's shards, whose journals count from the pool's first
    // write. Writes made before replication started have nothing to wait
    // for.
    for s in seqs.iter() {
        s.mark_replicated(s.get());
    }
    server.parts.set_journals(seqs.clone());
    let launched: Box<[AtomicU64]> = seqs
        .iter()
        .map(|s| AtomicU64::new(s.get()))
        .chain((0..server.ps.shard_count()).map(|_| AtomicU64::new(0)))
        .collect();
    let (release, lost) = std::sync::mpsc::channel();
    let replicator = Arc::new(Replicator {
        me,
        secret,
        parts: server.parts.clone(),
        launched,
        seqs,
        ps: server.ps.clone(),
        cache: server.cache.clone(),
        ps_seqs: OnceLock::new(),
        routing: server.routing.clone(),
        unix,
        registry,
        ship: Mutex::new(Shipper::default()),
        rounds_started: AtomicU64::new(0),
        rounds_done: AtomicU64::new(0),
        wanted: AtomicU64::new(0),
        gate: server.gate.clone(),
        done_lock: Mutex::new(()),
        done_cv: Condvar::new(),
        stop: AtomicBool::new(false),
        release,
        pumping: AtomicUsize::new(0),
        thread: std::sync::OnceLock::new(),
        followers: AtomicBool::new(false),
        followers_seen: AtomicU64::new(u64::MAX),
        joiners_gate: AtomicBool::new(false),
        streaming: AtomicBool::new(false),
        handover_polling: AtomicBool::new(false),
        stream_cpus: server.stream_cpus,
    });
    server.gate.arm(replicator.clone());
    moves::spawn_releaser(Arc::downgrade(&replicator), lost)?;
    let r = replicator.clone();
    let thread = std::thread::Builder::new()
        .name("fkv-replicator".into())
        .spawn(move || {
            while !r.stopped() {
                // Unparked when it has work; otherwise a tick, for silent
                // followers and writes no reply waits on. While a joiner
                // is streamed it waits on the followers' acknowledgements
                // (which no reply may be waiting for) instead.
                let tick = if r.handover_polling.load(Ordering::Acquire) {
                    Duration::from_micros(HANDOVER_POLL_US)
                } else {
                    Duration::from_millis(REPL_TICK_MS)
                };
                let streaming = r.streaming.load(Ordering::Acquire);
                r.stream_cpus.confine(streaming);
                if !(streaming && r.pump(None, tick)) {
                    std::thread::park_timeout(tick);
                }
                r.service();
            }
        })?;
    let _ = replicator.thread.set(thread.thread().clone());
    Ok(Replication {
        replicator,
        _heartbeats: heartbeats,
        _backup: backup,
        thread: Some(thread),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::net::TcpListener;

    /// A connected pair of loopback sockets.
    fn pair() -> (TcpStream, TcpStream) {
        let l = TcpListener::bind("127.0.0.1:0").expect("bind");
        let a = TcpStream::connect(l.local_addr().expect("addr")).expect("connect");
        let (b, _) = l.accept().expect("accept");
        (a, b)
    }

    fn framed(body: &[u8]) -> Vec<u8> {
        let mut m = (body.len() as u32).to_le_bytes().to_vec();
        m.extend_from_slice(body);
        m
    }

    /// Waits (generously) until the reader holds `n` whole messages' bytes.
    fn recv_until(r: &mut MsgReader, s: &TcpStream, bytes: usize) {
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while r.end - r.start < bytes {
            r.recv_ready(s).expect("recv");
            assert!(std::time::Instant::now() < deadline, "bytes never came");
        }
    }

    #[test]
    fn acknowledgements_are_taken_whole_as_they_come_without_waiting() {
        let (mut tx, rx) = pair();
        let mut r = MsgReader::default();
        // Nothing sent: a read that does not wait, and nothing whole.
        r.recv_ready(&rx).expect("recv");
        assert!(r.buffered().expect("buffered").is_none());
        // Two whole messages and the first half of a third.
        let third = framed(b"third message");
        let mut sent = [framed(b"one"), framed(b"two")].concat();
        sent.extend_from_slice(&third[..6]);
        tx.write_all(&sent).expect("write");
        recv_until(&mut r, &rx, sent.len());
        assert!(r.has_whole());
        assert_eq!(r.buffered().expect("buffered"), Some(&b"one"[..]));
        assert_eq!(r.buffered().expect("buffered"), Some(&b"two"[..]));
        assert!(!r.has_whole());
        assert!(r.buffered().expect("buffered").is_none());
        // The rest of the third completes it.
        tx.write_all(&third[6..]).expect("write");
        recv_until(&mut r, &rx, third.len());
        assert_eq!(r.buffered().expect("buffered"), Some(&b"third message"[..]));
        // A length past the bound is an error, not an allocation.
        tx.write_all(&((REPL_MESSAGE_BYTES_MAX as u32) + 1).to_le_bytes())
            .expect("write");
        recv_until(&mut r, &rx, 4);
        assert!(r.buffered().is_err());
        // The end of the stream is reported.
        drop(tx);
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while r.recv_ready(&rx).is_ok() {
            assert!(std::time::Instant::now() < deadline, "no end of stream");
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}
