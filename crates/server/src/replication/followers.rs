//! A primary's connections to its followers, pipelined: batches are
//! written as rounds are launched, and acknowledgements are read by
//! whichever thread waits for them ([`Replicator::pump`]: a text loop
//! holding replies, a worker in `settle`, else the replicator's own
//! thread), so the one that will send the replies is the one the
//! acknowledgement wakes. Nothing here waits on the network while holding
//! the shipping lock but a write (bounded by the socket's write timeout).
//!
//! What goes wrong (a refusal, a broken or silent connection) is left for
//! the replicator's own thread ([`Replicator::mend_followers`]): it
//! reconnects and sends every unacknowledged batch again, in order, and
//! gives a follower up after [`REPL_FOLLOWER_GIVE_UP_MS`].

use std::collections::VecDeque;
use std::io::Write;
use std::net::TcpStream;
use std::os::fd::BorrowedFd;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use fabrickv_wire::repl::{self as records, AckStatus, Message};

use super::{
    MsgReader, Replicator, Shipper, LEARNER_BATCHES_BEHIND_MAX, REPL_ACK_TIMEOUT_MS,
    REPL_CONNECT_TIMEOUT_MS, REPL_FOLLOWER_GIVE_UP_MS, REPL_RETRY_MS,
};

/// A batch sent to a follower and not yet acknowledged.
struct Unacked {
    seq: u64,
    round: u64,
    msg: Arc<Vec<u8>>,
    /// When it was last written.
    sent: Instant,
}

/// A follower connection's read side.
struct AckSide {
    stream: Arc<TcpStream>,
    reader: MsgReader,
    generation: u64,
}

/// What the replicator's thread must mend about a follower.
enum Trouble {
    /// The connection broke or spoke out of turn.
    Broken,
    /// The follower refused this batch (its map names another primary).
    Refused(Arc<Vec<u8>>),
}

/// One follower of this server's groups: its connection's write half and
/// the batches it has not acknowledged, oldest first.
#[derive(Default)]
pub(super) struct Follower {
    conn: Option<Arc<TcpStream>>,
    /// The connection's read side, taken by one reading thread at a time.
    read: Arc<Mutex<Option<AckSide>>>,
    /// Bumped with every connection: what is read from an older one is
    /// not heeded.
    generation: u64,
    unacked: VecDeque<Unacked>,
    trouble: Option<Trouble>,
    /// Since when it has failed to acknowledge; cleared by an
    /// acknowledgement.
    failing: Option<Instant>,
}

impl Follower {
    /// Whether it has more than [`LEARNER_BATCHES_BEHIND_MAX`] batches
    /// unacknowledged: a joiner that far behind holds replies back.
    pub(super) fn lags(&self) -> bool {
        self.unacked.len() > LEARNER_BATCHES_BEHIND_MAX
    }

    /// Whether every batch of rounds up to `round` was acknowledged.
    pub(super) fn acked_through(&self, round: u64) -> bool {
        self.unacked.front().is_none_or(|u| u.round > round)
    }

    /// Queues a batch of `round` and writes it if the connection is up;
    /// returns whether the replicator's thread must act first (no
    /// connection yet, or it just broke).
    pub(super) fn send(&mut self, seq: u64, round: u64, msg: Vec<u8>) -> bool {
        let msg = Arc::new(msg);
        self.unacked.push_back(Unacked {
            seq,
            round,
            msg: msg.clone(),
            sent: Instant::now(),
        });
        if self.trouble.is_some() {
            return true;
        }
        match self.conn.as_mut() {
            Some(c) => {
                if (&**c).write_all(&msg).is_err() {
                    self.trouble = Some(Trouble::Broken);
                    return true;
                }
                false
            }
            None => true,
        }
    }

    /// Drops the connection with a reset: closed, the kernel would keep
    /// resending unacknowledged batches, and a follower cut off meanwhile
    /// would get them once the link heals, after fresher states (its
    /// follower side also applies only a primary's newest stream). The
    /// connection closes once no reading thread holds it.
    pub(super) fn abort(&mut self) {
        self.generation += 1;
        if let Some(c) = self.conn.take() {
            let s = socket2::SockRef::from(&c);
            let _ = s.set_linger(Some(Duration::ZERO));
            let _ = c.shutdown(std::net::Shutdown::Read);
        }
    }

    /// What must be mended now, if anything: the connection missing while
    /// batches wait, broken, refused, or its oldest batch unacknowledged
    /// for [`REPL_ACK_TIMEOUT_MS`].
    fn needs_mending(&mut self, now: Instant) -> Option<Option<Arc<Vec<u8>>>> {
        match self.trouble.take() {
            Some(Trouble::Refused(msg)) => return Some(Some(msg)),
            Some(Trouble::Broken) => return Some(None),
            None => {}
        }
        let oldest = self.unacked.front()?;
        let silent = now.saturating_duration_since(oldest.sent)
            >= Duration::from_millis(REPL_ACK_TIMEOUT_MS);
        (self.conn.is_none() || silent).then_some(None)
    }
}

impl Replicator {
    /// Mends every follower in trouble (reconnects and resends what it has
    /// not acknowledged; after a refusal, first checks this server was not
    /// deposed), gives up one failing for [`REPL_FOLLOWER_GIVE_UP_MS`], and
    /// forgets followers the map no longer gives this server. Runs on the
    /// replicator's own thread, which may wait here.
    pub(super) fn mend_followers(&self) {
        let now = Instant::now();
        let mut todo = Vec::new();
        {
            let mut sh = self.lock_ship();
            let ids: Vec<u32> = sh.followers.keys().copied().collect();
            for f in ids {
                if !self.still_follows(f) {
                    self.forget(&mut sh, f);
                    continue;
                }
                let Some(fo) = sh.followers.get_mut(&f) else {
                    continue;
                };
                if let Some(refused) = fo.needs_mending(now) {
                    fo.abort();
                    let since = *fo.failing.get_or_insert(now);
                    todo.push((f, refused, since));
                }
            }
        }
        for (f, refused, since) in todo {
            if let Some(msg) = refused {
                self.after_refusal(f, &msg);
            }
            if since.elapsed() >= Duration::from_millis(REPL_FOLLOWER_GIVE_UP_MS) {
                self.drop_follower(f);
            }
            if !self.still_follows(f) {
                // What it missed is gone with its batches: a joiner added
                // again starts its stream afresh.
                let mut sh = self.lock_ship();
                self.forget(&mut sh, f);
                continue;
            }
            match self.connect(f) {
                Ok((stream, reader)) => {
                    let mut sh = self.lock_ship();
                    self.adopt(&mut sh, f, stream, reader);
                }
                Err(e) => tracing::debug!("replication: cannot reach follower {f}: {e}"),
            }
        }
    }

    /// Takes a fresh connection to `f`: resends every batch it has not
    /// acknowledged, in order.
    fn adopt(&self, sh: &mut Shipper, f: u32, stream: TcpStream, reader: MsgReader) {
        let Some(fo) = sh.followers.get_mut(&f) else {
            return;
        };
        fo.abort();
        let stream = Arc::new(stream);
        let now = Instant::now();
        for u in fo.unacked.iter_mut() {
            if (&*stream).write_all(&u.msg).is_err() {
                let _ = socket2::SockRef::from(&*stream).set_linger(Some(Duration::ZERO));
                return;
            }
            u.sent = now;
        }
        // A fresh lock, not the old one: a thread may hold that while it
        // waits for the shipping lock held here.
        fo.read = Arc::new(Mutex::new(Some(AckSide {
            stream: stream.clone(),
            reader,
            generation: fo.generation,
        })));
        fo.conn = Some(stream);
    }

    /// Waits up to `timeout` for acknowledgements and takes what came,
    /// returning early once `also` (a loop's own poll descriptor) is
    /// readable. Returns false at once when no connection has a batch
    /// unacknowledged (nothing to wait on here: the caller waits its own
    /// way, and is woken when rounds complete).
    pub(super) fn pump(&self, also: Option<BorrowedFd<'_>>, timeout: Duration) -> bool {
        type Side = (u32, Arc<Mutex<Option<AckSide>>>, Arc<TcpStream>);
        let sides: Vec<Side> = {
            let sh = self.lock_ship();
            sh.followers
                .iter()
                .filter(|(_, fo)| !fo.unacked.is_empty() && fo.trouble.is_none())
                .filter_map(|(&f, fo)| fo.conn.as_ref().map(|c| (f, fo.read.clone(), c.clone())))
                .collect()
        };
        if sides.is_empty() {
            return false;
        }
        use rustix::event::{PollFd, PollFlags};
        let mut fds: Vec<PollFd<'_>> = also
            .into_iter()
            .map(|fd| PollFd::from_borrowed_fd(fd, PollFlags::IN))
            .chain(
                sides
                    .iter()
                    .map(|(_, _, s)| PollFd::new(&**s, PollFlags::IN)),
            )
            .collect();
        let timeout =
            rustix::event::Timespec::try_from(timeout).unwrap_or(rustix::event::Timespec {
                tv_sec: 1,
                tv_nsec: 0,
            });
        self.pumping.fetch_add(1, Ordering::AcqRel);
        let ready = rustix::event::poll(&mut fds, Some(&timeout));
        self.pumping.fetch_sub(1, Ordering::AcqRel);
        if !ready.is_ok_and(|n| n > 0) {
            return true;
        }
        let skip = usize::from(also.is_some());
        for ((f, read, _), fd) in sides.iter().zip(&fds[skip..]) {
            if !fd.revents().is_empty() {
                self.take_acks(*f, read);
            }
        }
        true
    }

    /// Takes every acknowledgement `f`'s connection holds now, unless
    /// another thread is reading it: each completes the follower's oldest
    /// batch. Trouble is left for [`Replicator::mend_followers`].
    fn take_acks(&self, f: u32, read: &Mutex<Option<AckSide>>) {
        let Ok(mut guard) = read.try_lock() else {
            return;
        };
        let Some(side) = guard.as_mut() else {
            return;
        };
        let broken = side.reader.recv_ready(&side.stream).is_err();
        loop {
            let got = match side.reader.buffered() {
                Ok(None) if !broken => return,
                Ok(None) => Err(()),
                Ok(Some(body)) => match records::decode(body) {
                    Ok(Message::Ack { seq, status, .. }) => Ok((seq, status)),
                    _ => Err(()),
                },
                Err(_) => Err(()),
            };
            let mut sh = self.lock_ship();
            let Some(fo) = sh.followers.get_mut(&f) else {
                return;
            };
            if fo.generation != side.generation {
                return;
            }
            let round = match got {
                Ok((seq, AckStatus::Applied)) => match fo.unacked.front() {
                    Some(u) if u.seq == seq => Some(u.round),
                    _ => None,
                },
                Ok((_, AckStatus::Refused)) => {
                    fo.trouble = fo.unacked.front().map(|u| Trouble::Refused(u.msg.clone()));
                    None
                }
                Err(()) => None,
            };
            let Some(round) = round else {
                // Mended afresh by the replicator's thread: what else this
                // connection holds is not heeded.
                fo.trouble.get_or_insert(Trouble::Broken);
                drop(sh);
                *guard = None;
                self.wake_thread();
                return;
            };
            fo.unacked.pop_front();
            fo.failing = None;
            self.acked_by(&mut sh, f, round);
            self.launch_owed(&mut sh);
        }
    }

    /// Opens the stream to follower `f` and proves the cluster secret.
    fn connect(&self, f: u32) -> std::io::Result<(TcpStream, MsgReader)> {
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
        // Bounds the handshake's read; acknowledgements are read without
        // waiting ([`Replicator::take_acks`]).
        stream.set_read_timeout(Some(Duration::from_millis(REPL_ACK_TIMEOUT_MS)))?;
        // A write blocked this long (a follower stopped with its window
        // full) breaks the connection rather than hold the shipping lock.
        stream.set_write_timeout(Some(Duration::from_millis(REPL_ACK_TIMEOUT_MS)))?;
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
        Ok((stream, reader))
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
                // Wait for the watch to show it, so that the follower is
                // forgotten (and its rounds complete without it).
                let deadline = Instant::now() + Duration::from_millis(REPL_FOLLOWER_GIVE_UP_MS);
                while Instant::now() < deadline && self.still_follows(f) {
                    std::thread::sleep(Duration::from_millis(REPL_RETRY_MS));
                }
            }
        }
    }

    /// Whether `f` follows a group this server leads, in the current map.
    pub(super) fn still_follows(&self, f: u32) -> bool {
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
                    super::fence_exit("a follower refused this server's writes: it was deposed");
                }
            }
            std::thread::sleep(Duration::from_millis(REPL_RETRY_MS));
        }
    }
}
