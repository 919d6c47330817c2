//! The acceptor thread: accepts unix sockets, feeds their handshakes to
//! the shared table (`fabrickv_transport::handshake`), creates each
//! accepted connection's shared memory and hands it to its worker.

use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

use fabrickv_transport::handshake::{CompactOpening, Handshakes, Limits, Verdict};
use fabrickv_transport::idle::IdleBoard;
use fabrickv_transport::{timespec, Acceptor, Result, Waker};
use fabrickv_types::ErrorCode;
use rustix::event::epoll;

use crate::ctl::{self, SHM_OPENING};
use crate::mem::Mapping;
use crate::port::{Handoff, NewConn};
use crate::ring::CONN_SHM_BYTES;
use crate::{SHM_CONNECTIONS_MAX, SOCKET_NAME_PREFIX};

const LISTENER: u64 = u64::MAX;
const WAKER: u64 = u64::MAX - 1;

/// Most readiness events handled per epoll call.
const EVENTS_PER_WAIT: usize = 256;

pub(crate) struct ShmAcceptor {
    listener: UnixListener,
    /// Name given to each connection's memfd (shows in /proc/PID/maps).
    memfd_name: String,
    epoll: OwnedFd,
    waker: Arc<OwnedFd>,
    handoffs: Vec<Handoff>,
    /// Connections open over all workers.
    open: Arc<AtomicUsize>,
    /// The handshakes waiting for their opening (and proof).
    table: Handshakes<UnixStream, CompactOpening>,
    /// Users whose processes may connect: the server's own, then those
    /// the operator allowed.
    allowed_uids: Vec<u32>,
    /// At the cap, asks the longest-idle connection to make way.
    idle: Arc<IdleBoard>,
}

impl ShmAcceptor {
    pub(crate) fn new(
        listener: UnixListener,
        name: &str,
        handoffs: Vec<Handoff>,
        open: Arc<AtomicUsize>,
        idle: Arc<IdleBoard>,
        opts: &fabrickv_transport::ListenOptions,
    ) -> Result<Self> {
        let ep = epoll::create(epoll::CreateFlags::CLOEXEC).map_err(io::Error::from)?;
        let waker = Arc::new(ctl::eventfd()?);
        epoll::add(
            &ep,
            &listener,
            epoll::EventData::new_u64(LISTENER),
            epoll::EventFlags::IN,
        )
        .map_err(io::Error::from)?;
        epoll::add(
            &ep,
            &*waker,
            epoll::EventData::new_u64(WAKER),
            epoll::EventFlags::IN,
        )
        .map_err(io::Error::from)?;
        let limits = Limits::with_conns_max(SHM_CONNECTIONS_MAX);
        Ok(ShmAcceptor {
            listener,
            memfd_name: format!("{SOCKET_NAME_PREFIX}{name}"),
            epoll: ep,
            waker,
            table: Handshakes::new(SHM_OPENING, limits, handoffs.len())
                .with_secret(opts.secret.clone())
                .with_throttle(opts.throttle.clone()),
            handoffs,
            open,
            allowed_uids: std::iter::once(rustix::process::getuid().as_raw())
                .chain(opts.shm_allow_uids.iter().copied())
                .collect(),
            idle,
        })
    }

    fn accept_all(&mut self) {
        loop {
            match self.listener.accept() {
                Ok((stream, _)) => {
                    // shm peers have no address: the throttle counts
                    // failures per local user, as the kernel names it.
                    let source = rustix::net::sockopt::socket_peercred(&stream)
                        .map_or(fabrickv_auth::throttle::Source::Unknown, |c| {
                            fabrickv_auth::throttle::Source::User(c.uid.as_raw())
                        });
                    let open = self
                        .idle
                        .fits(self.open.load(Ordering::Acquire), SHM_CONNECTIONS_MAX);
                    let ep = &self.epoll;
                    let unregister = |old: &mut UnixStream| {
                        let _ = epoll::delete(ep, &*old);
                    };
                    let now = Instant::now();
                    let what = "shm connections";
                    let admitted = self
                        .table
                        .admit_or_close(stream, source, now, open, what, unregister);
                    let Some((slot, stream)) = admitted else {
                        continue;
                    };
                    if stream.set_nonblocking(true).is_err()
                        || epoll::add(
                            ep,
                            &*stream,
                            epoll::EventData::new_u64(slot as u64),
                            epoll::EventFlags::IN,
                        )
                        .is_err()
                    {
                        self.table.remove(slot);
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    tracing::warn!("accept failed: {e}");
                    return;
                }
            }
        }
    }

    /// Reads what the handshake has sent and acts on the table's step.
    fn advance(&mut self, slot: usize) {
        let (open, ep, idle) = (&self.open, &self.epoll, &self.idle);
        let judged = self.table.readable(
            slot,
            || idle.fits(open.load(Ordering::Acquire), SHM_CONNECTIONS_MAX),
            |s| {
                let _ = epoll::delete(ep, &*s);
            },
        );
        if let Some((stream, verdict)) = judged {
            self.complete(stream, verdict);
        }
    }

    /// Whether the process at the other end runs as an allowed user, as
    /// the kernel says (`SO_PEERCRED`, fixed at connect, so a peer cannot
    /// lie about it): shared memory is as open as the server's own pages,
    /// so another user is let in only when the operator says so.
    fn peer_allowed(&self, stream: &UnixStream) -> bool {
        match rustix::net::sockopt::socket_peercred(stream) {
            Ok(cred) if self.allowed_uids.contains(&cred.uid.as_raw()) => true,
            Ok(cred) => {
                tracing::warn!(
                    "refusing an shm client of uid {} (pid {}): not the server's user nor allowed",
                    cred.uid.as_raw(),
                    cred.pid.as_raw_nonzero()
                );
                false
            }
            Err(e) => {
                tracing::warn!("refusing an shm client whose credentials cannot be read: {e}");
                false
            }
        }
    }

    /// The shared memory and eventfds of a new connection.
    fn resources(&self) -> io::Result<(Mapping, OwnedFd, OwnedFd, OwnedFd)> {
        let (map, memfd) = Mapping::create(&self.memfd_name, CONN_SHM_BYTES)?;
        Ok((map, memfd, ctl::eventfd()?, ctl::eventfd()?))
    }

    /// Answers a judged opening; on acceptance creates the connection's
    /// shared memory, passes it with the answer and hands the connection
    /// to its worker.
    fn complete(&mut self, stream: UnixStream, verdict: Verdict<u16>) {
        let workers = self.handoffs.len() as u16;
        let (mut status, worker) = verdict.answer();
        if status == ErrorCode::Ok && !self.peer_allowed(&stream) {
            status = ErrorCode::PeerNotAllowed;
        }
        let res = if status == ErrorCode::Ok {
            match self.resources() {
                Ok(r) => Some(r),
                Err(e) => {
                    tracing::warn!("cannot create a connection's shared memory: {e}");
                    status = ErrorCode::Unavailable;
                    None
                }
            }
        } else {
            None
        };
        let reply = SHM_OPENING.encode(status.as_u16(), workers);
        let Some((map, memfd, ev_server, ev_client)) = res else {
            // A fresh socket's send buffer is empty, so 8 bytes always fit.
            let _ = ctl::send_with_fds(stream.as_fd(), &reply, &[]);
            return;
        };
        let fds = [memfd.as_fd(), ev_server.as_fd(), ev_client.as_fd()];
        if let Err(e) = ctl::send_with_fds(stream.as_fd(), &reply, &fds) {
            tracing::debug!("handshake reply failed: {e}");
            return;
        }
        drop(memfd);
        let open = self.open.fetch_add(1, Ordering::AcqRel);
        // Past the cap only because an idle connection makes way.
        self.idle.make_room(open + 1, SHM_CONNECTIONS_MAX + 1);
        let conn = NewConn {
            sock: stream,
            map,
            ev_server,
            ev_client,
        };
        if self.handoffs[worker].hand(conn).is_err() {
            self.open.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

impl Acceptor for ShmAcceptor {
    fn run(&mut self, stop: &AtomicBool) -> Result<()> {
        let mut buf = [std::mem::MaybeUninit::<epoll::Event>::uninit(); EVENTS_PER_WAIT];
        while !stop.load(Ordering::Acquire) {
            let ep = &self.epoll;
            let timeout = self
                .table
                .expire(Instant::now(), |s| {
                    let _ = epoll::delete(ep, &s);
                })
                .map(timespec);
            let tokens: Vec<u64> = match epoll::wait(&self.epoll, &mut buf, timeout.as_ref()) {
                Ok((events, _)) => events.iter().map(|e| e.data.u64()).collect(),
                Err(rustix::io::Errno::INTR) => Vec::new(),
                Err(e) => return Err(io::Error::from(e).into()),
            };
            for t in tokens {
                match t {
                    LISTENER => self.accept_all(),
                    WAKER => ctl::clear(&self.waker),
                    t => self.advance(t as usize),
                }
            }
        }
        Ok(())
    }

    fn waker(&self) -> Waker {
        let w = self.waker.clone();
        Waker::new(move || ctl::signal(&w))
    }
}
