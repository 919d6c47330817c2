//! The follower side of replication: a listener its primaries connect to,
//! and one thread per primary applying its batches in order.

use std::io::Write;
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use fabrickv_auth::Secret;
use fabrickv_cluster::slots::key_slot;
use fabrickv_types::KeyHash;

use super::{MsgReader, TableIds, UnixClock};
use crate::partitions::Partitions;
use crate::ps::replica::row_slot;
use crate::ps::PsStore;
use crate::slot_routing::{Routing, SlotRouting};
use fabrickv_wire::repl::{self as records, AckStatus, Message, Record, Records};

/// Most primaries' streams a follower serves at once (each a thread): a
/// server follows at most `REPLICAS_MAX - 1` groups' primaries in the
/// initial layout, and a few more while groups fail over.
pub const REPL_STREAMS_MAX: usize = 64;

/// How long a follower whose map is older than a batch waits for its
/// watch to catch up before refusing the batch, in milliseconds.
pub const REPL_MAP_WAIT_MS: u64 = 1_000;

/// How long an idle stream from a primary stays open, in seconds; the
/// primary reconnects when it next has something to send.
pub const REPL_IDLE_SECS: u64 = 600;

/// What applying needs from the server.
#[derive(Clone)]
pub struct Applier {
    pub parts: Arc<Partitions>,
    pub ps: Arc<PsStore>,
    pub cache: Arc<crate::cache::CacheShared>,
    pub routing: Arc<SlotRouting>,
    pub unix: UnixClock,
    pub secret: Option<Secret>,
    /// Where an apply thread runs while it takes a group's stream.
    pub stream_cpus: super::cpus::StreamCpus,
}

/// The running listener; dropping it stops accepting.
pub struct Listener {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
    /// The primaries' streams being served, shut down with the listener
    /// so that a stopped server applies nothing more.
    streams: Arc<std::sync::Mutex<Vec<TcpStream>>>,
}

impl Drop for Listener {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        for s in self
            .streams
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .drain(..)
        {
            let _ = s.shutdown(std::net::Shutdown::Both);
        }
    }
}

impl Listener {
    /// Accepts primaries on `listener`, each served by its own thread.
    pub fn start(listener: TcpListener, applier: Applier) -> std::io::Result<Listener> {
        listener.set_nonblocking(true)?;
        let stop = Arc::new(AtomicBool::new(false));
        let s = stop.clone();
        let open = Arc::new(AtomicUsize::new(0));
        let streams: Arc<std::sync::Mutex<Vec<TcpStream>>> = Arc::default();
        let held = streams.clone();
        let newest = Newest::default();
        let mut accepted = 0u64;
        let thread = std::thread::Builder::new()
            .name("fkv-repl-accept".into())
            .spawn(move || {
                while !s.load(Ordering::Acquire) {
                    match listener.accept() {
                        Ok((stream, _)) => {
                            if open.load(Ordering::Acquire) >= REPL_STREAMS_MAX {
                                tracing::warn!("replication: {REPL_STREAMS_MAX} primaries' streams open; refusing another");
                                continue;
                            }
                            open.fetch_add(1, Ordering::AcqRel);
                            if let Ok(c) = stream.try_clone() {
                                let mut held = held.lock().unwrap_or_else(|p| p.into_inner());
                                // Streams that ended leave their clones:
                                // drop those past the cap's worth.
                                if held.len() >= REPL_STREAMS_MAX {
                                    held.remove(0);
                                }
                                held.push(c);
                            }
                            let (a, o) = (applier.clone(), open.clone());
                            accepted += 1;
                            let (n, generation) = (newest.clone(), accepted);
                            let spawned = std::thread::Builder::new()
                                .name("fkv-repl-apply".into())
                                .spawn(move || {
                                    if let Err(e) = serve(stream, &a, &n, generation) {
                                        tracing::debug!("replication stream ended: {e}");
                                    }
                                    o.fetch_sub(1, Ordering::AcqRel);
                                });
                            if spawned.is_err() {
                                open.fetch_sub(1, Ordering::AcqRel);
                            }
                        }
                        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                            std::thread::sleep(Duration::from_millis(5));
                        }
                        Err(e) => {
                            tracing::warn!("replication listener: {e}");
                            std::thread::sleep(Duration::from_millis(50));
                        }
                    }
                }
            })?;
        Ok(Listener {
            stop,
            thread: Some(thread),
            streams,
        })
    }
}

/// Each primary's newest stream, by the order streams were accepted in.
/// A primary opens a stream only after dropping its last one, but what
/// it sent on the dropped one can still arrive: a link cut mid-batch
/// delivers the kernel's resends once it heals, after the primary gave
/// the batch up and may have streamed this server fresher states since.
/// Only the newest stream of a primary is applied.
#[derive(Clone, Default)]
struct Newest(Arc<std::sync::Mutex<std::collections::HashMap<u32, u64>>>);

impl Newest {
    fn note(&self, sender: u32, generation: u64) {
        let mut m = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let g = m.entry(sender).or_insert(generation);
        *g = (*g).max(generation);
    }

    fn is_newest(&self, sender: u32, generation: u64) -> bool {
        let m = self.0.lock().unwrap_or_else(|p| p.into_inner());
        m.get(&sender) == Some(&generation)
    }
}

/// Serves one primary's stream (the `generation`th accepted): challenge,
/// proof, then batches, while it is that primary's newest.
fn serve(
    mut stream: TcpStream,
    a: &Applier,
    newest: &Newest,
    generation: u64,
) -> std::io::Result<()> {
    stream.set_nonblocking(false)?;
    stream.set_nodelay(true)?;
    stream.set_read_timeout(Some(Duration::from_millis(
        fabrickv_types::limits::HANDSHAKE_TIMEOUT_MS,
    )))?;
    let nonce = fabrickv_auth::nonce();
    let mut out = Vec::new();
    records::challenge(&mut out, &nonce);
    stream.write_all(&out)?;
    out.clear();
    let mut reader = MsgReader::default();
    let sender = match records::decode(reader.next(&mut stream)?) {
        Ok(Message::Hello { id, proof }) => {
            if let Some(s) = &a.secret {
                if !s.verify_proof(records::REPL_PROOF_CONTEXT, &nonce, &proof) {
                    tracing::warn!("replication: a primary's proof of the secret is wrong");
                    return Ok(());
                }
            }
            id
        }
        _ => return Ok(()),
    };
    newest.note(sender, generation);
    stream.set_read_timeout(Some(Duration::from_secs(REPL_IDLE_SECS)))?;
    loop {
        let body = reader.next(&mut stream)?;
        let (epoch, seq, recs) = match records::decode(body) {
            Ok(Message::Batch {
                epoch,
                seq,
                records,
            }) => (epoch, seq, records),
            _ => {
                tracing::warn!("replication: server {sender} sent something not a batch");
                return Ok(());
            }
        };
        if !newest.is_newest(sender, generation) {
            tracing::warn!(
                "replication: a batch came late on a stream server {sender} replaced; not applied"
            );
            return Ok(());
        }
        let (status, mine) = apply_batch(a, sender, epoch, recs);
        records::ack(&mut out, seq, status, mine);
        // Batches the primary pipelined arrive together: their
        // acknowledgements leave together, in one write.
        if !reader.has_whole() {
            stream.write_all(&out)?;
            out.clear();
        }
    }
}

/// Whether every record of the batch comes from its slot's primary, as
/// `r` says, and falls in a group this server follows.
fn acceptable(r: &Routing, sender: u32, epoch: u64, recs: &Records<'_>) -> bool {
    let me = r.me;
    // Built by the group's primary during its current leadership: a batch
    // from before a failover (the sender deposed, then back in charge)
    // carries states the group has since moved past.
    let follows = |g: &fabrickv_cluster::slots::ReplicaGroup| {
        g.primary == sender && epoch >= g.since && g.followers().any(|s| s == me)
    };
    r.active
        && recs.iter().all(|rec| match record_slot(&rec) {
            Some(s) => follows(&r.map.groups[r.routes.group_of(s)]),
            None => r.map.groups.iter().any(follows),
        })
}

/// The slot of a record of one key or row.
fn record_slot(rec: &Record<'_>) -> Option<u16> {
    match rec {
        Record::Put { key, .. } | Record::Del { key } => Some(key_slot(key)),
        Record::PsRow { table, key, .. } | Record::PsDel { table, key } => {
            Some(row_slot(*table, *key))
        }
        _ => None,
    }
}

/// Applies a batch if the map allows; returns the answer and this
/// server's epoch.
fn apply_batch(a: &Applier, sender: u32, epoch: u64, recs: Records<'_>) -> (AckStatus, u64) {
    let deadline = Instant::now() + Duration::from_millis(REPL_MAP_WAIT_MS);
    let r = loop {
        let Some(r) = a.routing.routing() else {
            return (AckStatus::Refused, 0);
        };
        if acceptable(&r, sender, epoch, &recs) {
            break r;
        }
        // A newer batch than this server's map: the watch is behind.
        if r.map.epoch >= epoch || Instant::now() >= deadline {
            return (AckStatus::Refused, r.map.epoch);
        }
        std::thread::sleep(Duration::from_millis(2));
    };
    // Joining a group of the sender's: this is its stream, bulk work
    // kept off the serving cores until the joiner is in sync.
    a.stream_cpus.confine(
        r.map
            .groups
            .iter()
            .any(|g| g.primary == sender && g.joining.contains(&r.me)),
    );
    let now = a.unix.clock().now_ms();
    let mut tables = TableIds::new();
    for (i, rec) in recs.iter().enumerate() {
        if i > 0 && i % super::APPLY_YIELD_RECORDS == 0 {
            // A stream's chunk is hundreds of records: a serving thread
            // woken meanwhile runs now, not after this thread's slice.
            std::thread::yield_now();
        }
        apply(a, &r, sender, &rec, now, &mut tables);
    }
    (AckStatus::Applied, r.map.epoch)
}

/// Runs `f` on partition `p` with the journal paused
/// ([`fabrickv_engine::Partition::unjournaled`]).
fn on_partition<T>(
    parts: &Partitions,
    p: usize,
    f: impl FnOnce(&mut fabrickv_engine::Partition) -> T,
) -> T {
    parts.lock(p).unjournaled(f)
}

fn apply(a: &Applier, r: &Routing, sender: u32, rec: &Record<'_>, now: u64, tables: &mut TableIds) {
    match rec {
        Record::Put { key, .. } | Record::Del { key } => {
            let p = a.parts.index_of(KeyHash::of(key));
            on_partition(&a.parts, p, |part| {
                super::store_key_record(part, rec, &a.unix, now)
            });
        }
        Record::FlushPartition { count, index } => {
            let senders = |slot: u16| r.map.groups[r.routes.group_of(slot)].primary == sender;
            super::moves::drop_keys(&a.parts, now, super::moves::Pace::Now, &senders, |k| {
                KeyHash::of(k).partition(*count) == *index
            });
        }
        Record::StreamBegin { ranges } => {
            let doomed = |s: u16| ranges.iter().any(|rg| rg.contains(s));
            super::moves::drop_keys(&a.parts, now, super::moves::Pace::Now, &doomed, |_| true);
            a.ps.drop_rows(now, &doomed);
            // The KV cache is one copy, not streamed; but what this server
            // cached for these slots when it last led them is older than
            // what their primary may have cached since, and must not come
            // back if it leads them again.
            a.cache.store().delete_where(&|k| doomed(key_slot(k)));
        }
        // Checkpoints hold cache entries; the cache is one copy, and no
        // primary sends them.
        Record::CacheEntry { .. } => {
            tracing::warn!("server {sender} sent a KV-cache entry to replicate; ignored")
        }
        Record::PsTable { .. } | Record::PsRow { .. } | Record::PsDel { .. } => {
            super::store_table_record(
                &a.ps,
                &a.unix,
                rec,
                tables,
                now,
                &format_args!("replication from server {sender}"),
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Newest;

    #[test]
    fn only_a_primarys_newest_stream_is_applied() {
        let n = Newest::default();
        n.note(1, 3);
        assert!(n.is_newest(1, 3));
        assert!(!n.is_newest(2, 3), "another primary's streams are apart");
        // The primary dropped stream 3 and opened stream 5: what comes
        // late on 3 is not applied.
        n.note(1, 5);
        assert!(!n.is_newest(1, 3) && n.is_newest(1, 5));
        // A stream accepted earlier whose proof came later changes nothing.
        n.note(1, 4);
        assert!(n.is_newest(1, 5) && !n.is_newest(1, 4));
    }
}
