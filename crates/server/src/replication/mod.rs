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
//!   group's slots by the primary, a chunk per round, after a record that
//!   makes it drop whatever it held of them; it receives every write from
//!   the same round on, so once the last chunk is acknowledged it is in
//!   sync, and the primary moves it into the group's backups with a
//!   compare-and-swap of the map in etcd.

pub mod backup;
pub mod lease;

use std::collections::{HashMap, HashSet};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use fabrickv_auth::Secret;
use fabrickv_cluster::etcd::EtcdRegistry;
use fabrickv_cluster::slots::key_slot;
use fabrickv_engine::{GetRefResult, JournalSeq, Partition, ScanBudget, ValueRef};
use fabrickv_rpc::gate::{FlushGate, Settle};
use fabrickv_types::KeyHash;

use crate::partitions::Partitions;
use crate::service::Clock;
use crate::slot_routing::{Routing, SlotRouting};
use fabrickv_wire::repl as records;
use records::{AckStatus, BatchBuf, Message, REPL_BATCH_BYTES_TARGET, REPL_MESSAGE_BYTES_MAX};

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

/// How often the replicator's own thread looks for work no reply waits
/// on (joiners to stream), in milliseconds.
pub const REPL_TICK_MS: u64 = 5;

/// Index entries one stream chunk examines per partition visit.
const STREAM_SCAN_ENTRIES: usize = 4096;

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
enum State {
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
fn read_state(part: &mut Partition, key: &[u8], now_ms: u64, unix: &UnixClock) -> State {
    let hash = KeyHash::of(key);
    match part.get_ref(hash, key, now_ms) {
        GetRefResult::NotFound => return State::Absent,
        GetRefResult::Found {
            value: ValueRef::Large(v),
            expire_at_ms,
        } => {
            return State::Large {
                value: v.clone(),
                expire_unix_ms: unix.to_unix(expire_at_ms),
            }
        }
        GetRefResult::Found { .. } => {}
    }
    match part.get_item(hash, key, now_ms) {
        Some(item) => State::Put {
            value: item.value.to_vec(),
            expire_unix_ms: unix.to_unix(item.expire_at_ms),
            meta: item.meta.map(|m| (m.cas, m.client_flags)),
        },
        None => State::Absent,
    }
}

fn append_state(out: &mut BatchBuf, key: &[u8], state: &State) {
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

/// A joiner being streamed a group's slots.
#[derive(Debug)]
struct Stream {
    group: usize,
    joiner: u32,
    begun: bool,
    partition: usize,
    bucket: usize,
    /// Every partition was walked in a round now acknowledged.
    complete: bool,
}

/// A connection to one follower.
struct FollowerConn {
    stream: TcpStream,
    reader: MsgReader,
}

impl FollowerConn {
    /// Drops a connection whose batch went unacknowledged with a reset:
    /// closed, the kernel would keep resending the batch, and a follower
    /// cut off meanwhile would get it once the link heals, after fresher
    /// states (its follower side also applies only a primary's newest
    /// stream).
    fn abort(self) {
        let _ = socket2::SockRef::from(&self.stream).set_linger(Some(Duration::ZERO));
    }
}

/// The state of shipping, behind the replicator's shipping lock.
#[derive(Default)]
struct Shipper {
    spare: Vec<u8>,
    conns: HashMap<u32, FollowerConn>,
    batch_seq: u64,
    streams: Vec<Stream>,
}

/// The primary side of replication, shared by every thread that replies.
pub struct Replicator {
    me: u32,
    secret: Option<Secret>,
    parts: Arc<Partitions>,
    seqs: Box<[Arc<JournalSeq>]>,
    acked: Box<[AtomicU64]>,
    routing: Arc<SlotRouting>,
    unix: UnixClock,
    registry: EtcdRegistry,
    ship: Mutex<Shipper>,
    /// Rounds begun and rounds finished (the ticket counters), and the
    /// highest ticket handed out.
    rounds_started: AtomicU64,
    rounds_done: AtomicU64,
    wanted: AtomicU64,
    /// Woken after every round.
    gate: Arc<FlushGate>,
    /// The replicator's own thread, unparked when a ticket is taken.
    thread: std::sync::OnceLock<std::thread::Thread>,
}

impl Settle for Replicator {
    fn ticket(&self) -> Option<u64> {
        if !self.pending() {
            return None;
        }
        // Any round that starts from now on drains every journal, and so
        // covers the writes made before this call.
        let t = self.rounds_started.load(Ordering::Acquire) + 1;
        // No round in flight: run one here, as `settle` would (a thread
        // handing it to another and being woken after cost more than the
        // round). One in flight: the caller serves its other connections
        // and comes back when woken after it.
        match self.ship.try_lock() {
            Ok(mut sh) => {
                self.round(&mut sh);
                None
            }
            Err(std::sync::TryLockError::Poisoned(p)) => {
                self.round(&mut p.into_inner());
                None
            }
            Err(std::sync::TryLockError::WouldBlock) => {
                // The round in flight may cover these writes or not: the
                // replicator's thread runs one more after it either way,
                // so the ticket is honoured even if nothing is left to
                // ship by then.
                self.wanted.fetch_max(t, Ordering::AcqRel);
                if let Some(th) = self.thread.get() {
                    th.unpark();
                }
                Some(t)
            }
        }
    }

    fn done(&self, ticket: u64) -> bool {
        self.rounds_done.load(Ordering::Acquire) >= ticket
    }

    fn settle(&self) {
        let n = self.seqs.len();
        if !self.pending() {
            return;
        }
        let targets: Vec<u64> = self.seqs.iter().map(|s| s.get()).collect();
        let done =
            |r: &Replicator| (0..n).all(|p| r.acked[p].load(Ordering::Acquire) >= targets[p]);
        while !done(self) {
            let mut sh = self.ship.lock().unwrap_or_else(|p| p.into_inner());
            if done(self) {
                break;
            }
            self.round(&mut sh);
        }
    }
}

impl Replicator {
    /// Whether any partition holds writes its followers have not applied.
    fn pending(&self) -> bool {
        (0..self.seqs.len()).any(|p| self.seqs[p].get() > self.acked[p].load(Ordering::Acquire))
    }

    /// One round ([`Replicator::ship`]), counted for tickets, then the
    /// loops holding replies on tickets are woken.
    fn round(&self, sh: &mut Shipper) {
        let n = self.rounds_started.fetch_add(1, Ordering::AcqRel) + 1;
        self.ship(sh);
        self.rounds_done.store(n, Ordering::Release);
        self.gate.wake_waiters();
    }

    /// Streams chunks to joiners, drains every journal, sends each
    /// follower its batch and waits until all have applied theirs.
    fn ship(&self, sh: &mut Shipper) {
        let Some(r) = self.routing.routing() else {
            // No map, no followers: nothing to wait for.
            for p in 0..self.seqs.len() {
                self.acked[p].fetch_max(self.seqs[p].get(), Ordering::AcqRel);
            }
            return;
        };
        let now = self.unix.clock().now_ms();
        let mut out: HashMap<u32, BatchBuf> = HashMap::new();
        self.follow_joiners(sh, &r);
        for st in sh.streams.iter_mut().filter(|s| !s.complete) {
            let buf = out.entry(st.joiner).or_default();
            self.stream_chunk(st, &r, buf, now);
        }
        let mut drained: Vec<(usize, u64)> = Vec::new();
        let mut foreign = false;
        for p in 0..self.seqs.len() {
            if self.seqs[p].get() <= self.acked[p].load(Ordering::Acquire) {
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
                let state = read_state(&mut part, key, now, &self.unix);
                for f in g.followers() {
                    append_state(out.entry(f).or_default(), key, &state);
                }
            }
            drop(seen);
            drop(part);
            drained.push((p, noted.seq));
            sh.spare = noted.keys;
        }
        if foreign {
            fence_exit("writes were made to slots this server no longer leads");
        }
        let epoch = r.map.epoch;
        let mut sent: Vec<(u32, Vec<u8>)> = Vec::with_capacity(out.len());
        for (f, mut buf) in out {
            if buf.is_empty() {
                continue;
            }
            sh.batch_seq += 1;
            sent.push((f, buf.seal(epoch, sh.batch_seq)));
        }
        self.deliver(sh, sent);
        for (p, seq) in drained {
            self.acked[p].fetch_max(seq, Ordering::AcqRel);
        }
        for st in sh.streams.iter_mut() {
            if st.begun && st.partition >= self.seqs.len() {
                st.complete = true;
            }
        }
        self.promote_complete(sh);
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
                    sh.streams.push(Stream {
                        group: gi,
                        joiner: j,
                        begun: false,
                        partition: 0,
                        bucket: 0,
                        complete: false,
                    });
                }
            }
        }
    }

    /// Appends the next chunk of a stream to its joiner's batch: the
    /// states of the group's keys, up to about a batch's worth.
    fn stream_chunk(&self, st: &mut Stream, r: &Routing, out: &mut BatchBuf, now: u64) {
        let Some(g) = r.map.groups.get(st.group) else {
            return;
        };
        if !st.begun {
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
        let ours = |key: &[u8]| r.routes.group_of(key_slot(key)) == st.group;
        while st.partition < self.seqs.len() && out.bytes() < REPL_BATCH_BYTES_TARGET {
            let mut part = self.parts.lock(st.partition);
            let mut keys: Vec<Vec<u8>> = Vec::new();
            let mut budget = ScanBudget {
                entries: STREAM_SCAN_ENTRIES,
                words: STREAM_SCAN_ENTRIES,
            };
            let next = part.scan_from(st.bucket, now, &mut budget, &mut |k, _, _| {
                if ours(k) {
                    keys.push(k.to_vec());
                }
                true
            });
            for k in &keys {
                let state = read_state(&mut part, k, now, &self.unix);
                append_state(out, k, &state);
            }
            match next {
                Some(b) => st.bucket = b,
                None => {
                    st.partition += 1;
                    st.bucket = 0;
                }
            }
        }
    }

    /// Moves every joiner whose stream completed into its group's
    /// backups, by compare-and-swap of the map in etcd (the watch then
    /// ends the stream).
    fn promote_complete(&self, sh: &mut Shipper) {
        for st in sh.streams.iter().filter(|s| s.complete) {
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
            if let Some(next) = map.promoted(st.group, st.joiner) {
                match self.registry.swap_map(rev, &next) {
                    Ok(true) => tracing::info!(
                        "replication: server {} in sync for group {} at epoch {}",
                        st.joiner,
                        st.group,
                        next.epoch
                    ),
                    Ok(false) => {}
                    Err(e) => tracing::warn!("replication: cannot promote a joiner: {e}"),
                }
            }
        }
    }

    /// Sends each follower its batch and waits until every one applied
    /// it: a follower that does not answer is tried again until it
    /// answers or the map no longer makes it a follower of this server.
    fn deliver(&self, sh: &mut Shipper, mut batches: Vec<(u32, Vec<u8>)>) {
        let mut failing: HashMap<u32, Instant> = HashMap::new();
        while !batches.is_empty() {
            let mut failed = Vec::new();
            let mut waiting = Vec::new();
            for (f, msg) in batches {
                match self.send(sh, f, &msg) {
                    Ok(()) => waiting.push((f, msg)),
                    Err(_) => failed.push((f, msg)),
                }
            }
            for (f, msg) in waiting {
                match self.await_ack(sh, f) {
                    Ok(AckStatus::Applied) => {}
                    Ok(AckStatus::Refused) => {
                        self.after_refusal(f, &msg);
                        failed.push((f, msg));
                    }
                    Err(_) => failed.push((f, msg)),
                }
            }
            batches = Vec::new();
            for (f, msg) in failed {
                if let Some(c) = sh.conns.remove(&f) {
                    c.abort();
                }
                let since = *failing.entry(f).or_insert_with(Instant::now);
                if since.elapsed() >= Duration::from_millis(REPL_FOLLOWER_GIVE_UP_MS) {
                    self.drop_follower(f);
                }
                if self.still_follows(f) {
                    batches.push((f, msg));
                } else {
                    // What it missed is gone with the batch: a joiner
                    // added again starts its stream afresh.
                    sh.streams.retain(|st| st.joiner != f);
                }
            }
            if !batches.is_empty() {
                std::thread::sleep(Duration::from_millis(REPL_RETRY_MS));
            }
        }
    }

    /// Removes follower `f`, unreachable for [`REPL_FOLLOWER_GIVE_UP_MS`],
    /// from the groups this server leads, by compare-and-swap of the map
    /// (the controller brings it back as a joiner once it is reachable).
    /// If the map says this server leads nothing any more, the change
    /// fails and the caller's writes wait for the deposition to show.
    fn drop_follower(&self, f: u32) {
        let Ok(view) = self.registry.view() else {
            return;
        };
        let Some((map, rev)) = view.map else {
            return;
        };
        if let Some(next) = map.without_follower(self.me, f) {
            if let Ok(true) = self.registry.swap_map(rev, &next) {
                tracing::warn!(
                    "replication: follower {f} unreachable for {REPL_FOLLOWER_GIVE_UP_MS} ms; removed from this server's groups at epoch {}",
                    next.epoch
                );
                // Wait for the watch to show it, so that the retry loop
                // sees the follower gone.
                let deadline = Instant::now() + Duration::from_millis(REPL_FOLLOWER_GIVE_UP_MS);
                while Instant::now() < deadline && self.still_follows(f) {
                    std::thread::sleep(Duration::from_millis(REPL_RETRY_MS));
                }
            }
        }
    }

    /// Whether `f` follows a group this server leads, in the current map.
    fn still_follows(&self, f: u32) -> bool {
        self.routing.routing().is_some_and(|r| {
            r.map
                .groups
                .iter()
                .any(|g| g.primary == self.me && g.followers().any(|s| s == f))
        })
    }

    /// A follower refused a batch: its map, newer than this server's,
    /// names another primary. Once this server's map shows that too, the
    /// writes it holds cannot be acknowledged by anyone.
    fn after_refusal(&self, f: u32, msg: &[u8]) {
        tracing::warn!("replication: follower {f} refused a batch");
        let built = match msg.get(4..).map(records::decode) {
            Some(Ok(Message::Batch { epoch, .. })) => epoch,
            _ => 0,
        };
        let deadline = Instant::now() + Duration::from_millis(REPL_ACK_TIMEOUT_MS * 4);
        while Instant::now() < deadline {
            if let Some(r) = self.routing.routing() {
                // Deposed, or deposed and put back in charge since the
                // batch was built: its writes can be acknowledged by no
                // one.
                let regained = r
                    .map
                    .groups
                    .iter()
                    .any(|g| g.primary == self.me && g.since > built);
                if !r.active || r.map.led_by(self.me).is_empty() || regained {
                    fence_exit("a follower refused this server's writes: it was deposed");
                }
            }
            std::thread::sleep(Duration::from_millis(REPL_RETRY_MS));
        }
    }

    fn send(&self, sh: &mut Shipper, f: u32, msg: &[u8]) -> std::io::Result<()> {
        let conn = match sh.conns.entry(f) {
            std::collections::hash_map::Entry::Occupied(o) => o.into_mut(),
            std::collections::hash_map::Entry::Vacant(v) => v.insert(self.connect(f)?),
        };
        conn.stream.write_all(msg)
    }

    fn await_ack(&self, sh: &mut Shipper, f: u32) -> std::io::Result<AckStatus> {
        let conn = sh
            .conns
            .get_mut(&f)
            .ok_or_else(|| std::io::Error::other("no connection"))?;
        let body = conn.reader.next(&mut conn.stream)?;
        match records::decode(body) {
            Ok(Message::Ack { status, .. }) => Ok(status),
            _ => Err(std::io::Error::other("not an acknowledgement")),
        }
    }

    /// Opens the stream to follower `f` and proves the cluster secret.
    fn connect(&self, f: u32) -> std::io::Result<FollowerConn> {
        let addr = self
            .routing
            .routing()
            .and_then(|r| r.server(f).and_then(|d| d.repl.clone()))
            .ok_or_else(|| {
                std::io::Error::other(format!("server {f} has no replication address"))
            })?;
        let sock: std::net::SocketAddr = addr
            .parse()
            .map_err(|e| std::io::Error::other(format!("{addr}: {e}")))?;
        let mut stream =
            TcpStream::connect_timeout(&sock, Duration::from_millis(REPL_CONNECT_TIMEOUT_MS))?;
        stream.set_nodelay(true)?;
        stream.set_read_timeout(Some(Duration::from_millis(REPL_ACK_TIMEOUT_MS)))?;
        let mut reader = MsgReader::default();
        let nonce = match records::decode(reader.next(&mut stream)?) {
            Ok(Message::Challenge { nonce }) => nonce,
            _ => return Err(std::io::Error::other("no challenge")),
        };
        let proof = self
            .secret
            .as_ref()
            .map_or([0; fabrickv_auth::PROOF_BYTES], |s| {
                s.proof(records::REPL_PROOF_CONTEXT, &nonce)
            });
        let mut hello = Vec::new();
        records::hello(&mut hello, self.me, &proof);
        stream.write_all(&hello)?;
        Ok(FollowerConn { stream, reader })
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
    /// Reads until `n` bytes past `start` are buffered.
    fn fill(&mut self, stream: &mut TcpStream, n: usize) -> std::io::Result<()> {
        if self.start + n > self.buf.len() {
            // Move what is left to the front, and make room.
            self.buf.copy_within(self.start..self.end, 0);
            self.end -= self.start;
            self.start = 0;
            let want = n.max(READ_CHUNK_BYTES);
            if self.buf.len() < want {
                self.buf.resize(want, 0);
            }
        }
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
        let mut len = [0u8; 4];
        len.copy_from_slice(&self.buf[self.start..self.start + 4]);
        let len = u32::from_le_bytes(len) as usize;
        if len > REPL_MESSAGE_BYTES_MAX {
            return Err(std::io::Error::other(format!(
                "a replication message of {len} bytes; at most {REPL_MESSAGE_BYTES_MAX}"
            )));
        }
        self.fill(stream, 4 + len)?;
        let body = self.start + 4..self.start + 4 + len;
        self.start += 4 + len;
        Ok(&self.buf[body])
    }
}

/// A server's replication while it runs: the replicator armed in its
/// gate, its heartbeats, the listener its primaries ship to, and the
/// replicator's own thread. Dropping it stops the threads.
pub struct Replication {
    // Held for the server's life (the gate and the thread hold it too).
    _replicator: Arc<Replicator>,
    _heartbeats: lease::Heartbeats,
    _backup: backup::Listener,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Drop for Replication {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// What replication needs from the server.
pub struct ReplicationParts {
    pub parts: Arc<Partitions>,
    pub routing: Arc<SlotRouting>,
    pub gate: Arc<FlushGate>,
    pub clock: Clock,
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
        .map(|p| server.parts.lock(p).enable_journal())
        .collect();
    let unix = UnixClock::new(server.clock);
    let lease = Arc::new(crate::slot_routing::Lease::default());
    server.routing.set_lease(lease.clone(), server.clock);
    let backup = backup::Listener::start(
        listener,
        backup::Applier {
            parts: server.parts.clone(),
            routing: server.routing.clone(),
            unix,
            secret: secret.clone(),
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
    let replicator = Arc::new(Replicator {
        me,
        secret,
        parts: server.parts.clone(),
        acked: seqs.iter().map(|s| AtomicU64::new(s.get())).collect(),
        seqs,
        routing: server.routing.clone(),
        unix,
        registry,
        ship: Mutex::new(Shipper::default()),
        rounds_started: AtomicU64::new(0),
        rounds_done: AtomicU64::new(0),
        wanted: AtomicU64::new(0),
        gate: server.gate.clone(),
        thread: std::sync::OnceLock::new(),
    });
    server.gate.arm(replicator.clone());
    let stop = Arc::new(AtomicBool::new(false));
    let (r, s) = (replicator.clone(), stop.clone());
    let thread = std::thread::Builder::new()
        .name("fkv-replicator".into())
        .spawn(move || {
            while !s.load(Ordering::Acquire) {
                // Unparked by a ticket; otherwise a tick, for joiners'
                // streams and writes no reply waits on.
                std::thread::park_timeout(Duration::from_millis(REPL_TICK_MS));
                loop {
                    let streaming = r.routing.routing().is_some_and(|v| {
                        v.map
                            .groups
                            .iter()
                            .any(|g| g.primary == r.me && !g.joining.is_empty())
                    });
                    let owed =
                        r.rounds_done.load(Ordering::Acquire) < r.wanted.load(Ordering::Acquire);
                    if !streaming && !owed && !r.pending() {
                        break;
                    }
                    let mut sh = r.ship.lock().unwrap_or_else(|p| p.into_inner());
                    r.round(&mut sh);
                    if streaming {
                        break;
                    }
                }
            }
        })?;
    let _ = replicator.thread.set(thread.thread().clone());
    Ok(Replication {
        _replicator: replicator,
        _heartbeats: heartbeats,
        _backup: backup,
        stop,
        thread: Some(thread),
    })
}
