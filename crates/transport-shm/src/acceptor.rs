//! The acceptor thread: accepts unix sockets, runs their handshakes,
//! creates each connection's shared memory and hands it to its worker.

use std::io::{self, Read};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use fabrickv_transport::{Acceptor, Result, Waker};
use fabrickv_types::limits::{HANDSHAKES_PENDING_MAX, HANDSHAKE_TIMEOUT_MS};
use fabrickv_types::ErrorCode;
use rustix::event::epoll;

use crate::ctl::{self, decode_handshake, encode_handshake, HANDSHAKE_BYTES};
use crate::mem::Mapping;
use crate::port::{Handoff, NewConn};
use crate::ring::CONN_SHM_BYTES;
use crate::{SHM_CONNECTIONS_MAX, SOCKET_NAME_PREFIX};

const LISTENER: u64 = u64::MAX;
const WAKER: u64 = u64::MAX - 1;

/// Most readiness events handled per epoll call.
const EVENTS_PER_WAIT: usize = 256;

/// A socket whose handshake has not arrived in full.
struct Pending {
    stream: UnixStream,
    buf: [u8; HANDSHAKE_BYTES],
    got: usize,
    deadline: Instant,
}

pub(crate) struct ShmAcceptor {
    listener: UnixListener,
    /// Name given to each connection's memfd (shows in /proc/PID/maps).
    memfd_name: String,
    epoll: OwnedFd,
    waker: Arc<OwnedFd>,
    handoffs: Vec<Handoff>,
    /// Connections open over all workers.
    open: Arc<AtomicUsize>,
    pending: Vec<Option<Pending>>,
}

impl ShmAcceptor {
    pub(crate) fn new(
        listener: UnixListener,
        name: &str,
        handoffs: Vec<Handoff>,
        open: Arc<AtomicUsize>,
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
        Ok(ShmAcceptor {
            listener,
            memfd_name: format!("{SOCKET_NAME_PREFIX}{name}"),
            epoll: ep,
            waker,
            handoffs,
            open,
            pending: Vec::new(),
        })
    }

    fn accept_all(&mut self) {
        loop {
            match self.listener.accept() {
                Ok((stream, _)) => {
                    if self.open.load(Ordering::Acquire) >= SHM_CONNECTIONS_MAX {
                        tracing::warn!(
                            "refusing a connection: {SHM_CONNECTIONS_MAX} shm connections open"
                        );
                        continue;
                    }
                    let live = self.pending.iter().filter(|p| p.is_some()).count();
                    if live >= HANDSHAKES_PENDING_MAX {
                        // Sockets that connect and stay silent cannot lock
                        // out a client that sends its handshake at once.
                        if let Some(oldest) = (0..self.pending.len())
                            .filter_map(|i| self.pending[i].as_ref().map(|p| (p.deadline, i)))
                            .min()
                            .map(|(_, i)| i)
                        {
                            self.drop_pending(oldest);
                        }
                    }
                    if stream.set_nonblocking(true).is_err() {
                        continue;
                    }
                    let slot = self
                        .pending
                        .iter()
                        .position(|p| p.is_none())
                        .unwrap_or_else(|| {
                            self.pending.push(None);
                            self.pending.len() - 1
                        });
                    if epoll::add(
                        &self.epoll,
                        &stream,
                        epoll::EventData::new_u64(slot as u64),
                        epoll::EventFlags::IN,
                    )
                    .is_err()
                    {
                        continue;
                    }
                    self.pending[slot] = Some(Pending {
                        stream,
                        buf: [0; HANDSHAKE_BYTES],
                        got: 0,
                        deadline: Instant::now() + Duration::from_millis(HANDSHAKE_TIMEOUT_MS),
                    });
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

    /// Reads what the handshake has sent; completes or drops it.
    fn advance(&mut self, slot: usize) {
        let Some(p) = self.pending.get_mut(slot).and_then(|p| p.as_mut()) else {
            return;
        };
        loop {
            match p.stream.read(&mut p.buf[p.got..]) {
                Ok(0) => return self.drop_pending(slot),
                Ok(n) => {
                    p.got += n;
                    if p.got == HANDSHAKE_BYTES {
                        return self.complete(slot);
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => return self.drop_pending(slot),
            }
        }
    }

    fn drop_pending(&mut self, slot: usize) {
        if let Some(p) = self.pending[slot].take() {
            let _ = epoll::delete(&self.epoll, &p.stream);
        }
    }

    /// The shared memory and eventfds of a new connection.
    fn resources(&self) -> io::Result<(Mapping, OwnedFd, OwnedFd, OwnedFd)> {
        let (map, memfd) = Mapping::create(&self.memfd_name, CONN_SHM_BYTES)?;
        Ok((map, memfd, ctl::eventfd()?, ctl::eventfd()?))
    }

    fn complete(&mut self, slot: usize) {
        let Some(p) = self.pending[slot].take() else {
            return;
        };
        let _ = epoll::delete(&self.epoll, &p.stream);
        let workers = self.handoffs.len() as u16;
        let req = decode_handshake(&p.buf);
        let mut status = match req {
            None => ErrorCode::UnsupportedVersion,
            Some((w, _)) if usize::from(w) >= self.handoffs.len() => ErrorCode::NoSuchWorker,
            Some(_) if self.open.load(Ordering::Acquire) >= SHM_CONNECTIONS_MAX => {
                ErrorCode::Unavailable
            }
            Some(_) => ErrorCode::Ok,
        };
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
        let reply = encode_handshake(status.as_u16(), workers);
        let Some((map, memfd, ev_server, ev_client)) = res else {
            // A fresh socket's send buffer is empty, so 8 bytes always fit.
            let _ = ctl::send_with_fds(p.stream.as_fd(), &reply, &[]);
            return;
        };
        let fds = [memfd.as_fd(), ev_server.as_fd(), ev_client.as_fd()];
        if let Err(e) = ctl::send_with_fds(p.stream.as_fd(), &reply, &fds) {
            tracing::debug!("handshake reply failed: {e}");
            return;
        }
        drop(memfd);
        let worker = req.map(|(w, _)| usize::from(w)).unwrap_or(0);
        self.open.fetch_add(1, Ordering::AcqRel);
        let conn = NewConn {
            sock: p.stream,
            map,
            ev_server,
            ev_client,
        };
        if self.handoffs[worker].hand(conn).is_err() {
            self.open.fetch_sub(1, Ordering::AcqRel);
        }
    }

    fn expire(&mut self, now: Instant) -> Option<Duration> {
        let mut next: Option<Duration> = None;
        for slot in 0..self.pending.len() {
            let Some(deadline) = self.pending[slot].as_ref().map(|p| p.deadline) else {
                continue;
            };
            if deadline <= now {
                tracing::debug!("closing a connection that did not finish its handshake in time");
                self.drop_pending(slot);
            } else {
                let left = deadline - now;
                next = Some(next.map_or(left, |n| n.min(left)));
            }
        }
        next
    }
}

/// `d` as a timespec for epoll/poll.
pub(crate) fn timespec(d: Duration) -> rustix::event::Timespec {
    rustix::event::Timespec {
        tv_sec: d.as_secs().min(i64::MAX as u64) as i64,
        tv_nsec: i64::from(d.subsec_nanos()),
    }
}

impl Acceptor for ShmAcceptor {
    fn run(&mut self, stop: &AtomicBool) -> Result<()> {
        let mut buf = [std::mem::MaybeUninit::<epoll::Event>::uninit(); EVENTS_PER_WAIT];
        while !stop.load(Ordering::Acquire) {
            let timeout = self.expire(Instant::now()).map(timespec);
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
