//! The acceptor thread: accepts sockets and runs their handshakes.

use std::io::{self, Read, Write};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use fabrickv_types::limits::{CONNECTIONS_MAX, HANDSHAKES_PENDING_MAX, HANDSHAKE_TIMEOUT_MS};
use fabrickv_types::ErrorCode;
use mio::net::{TcpListener, TcpStream};
use mio::{Events, Interest, Poll, Token};

use super::port::Handoff;
use super::{decode_handshake, encode_handshake, HANDSHAKE_BYTES};
use crate::{Acceptor, Result, Waker};

const LISTENER: Token = Token(0);
const WAKER: Token = Token(1);
const FIRST_PENDING: usize = 2;

/// Most readiness events handled per epoll call.
const EVENTS_PER_POLL: usize = 256;

struct Pending {
    stream: TcpStream,
    buf: [u8; HANDSHAKE_BYTES],
    got: usize,
    deadline: Instant,
}

pub(super) struct TcpAcceptor {
    listener: TcpListener,
    poll: Poll,
    waker: Arc<mio::Waker>,
    handoffs: Vec<Handoff>,
    open: Arc<AtomicUsize>,
    pending: Vec<Option<Pending>>,
}

impl TcpAcceptor {
    pub(super) fn new(
        mut listener: TcpListener,
        handoffs: Vec<Handoff>,
        open: Arc<AtomicUsize>,
    ) -> Result<Self> {
        let poll = Poll::new()?;
        poll.registry()
            .register(&mut listener, LISTENER, Interest::READABLE)?;
        let waker = Arc::new(mio::Waker::new(poll.registry(), WAKER)?);
        Ok(TcpAcceptor {
            listener,
            poll,
            waker,
            handoffs,
            open,
            pending: Vec::new(),
        })
    }

    fn accept_all(&mut self) {
        loop {
            match self.listener.accept() {
                Ok((mut stream, _)) => {
                    if self.open.load(Ordering::Acquire) >= CONNECTIONS_MAX {
                        // Over a bound: refuse by closing at once.
                        tracing::warn!("refusing a connection: {CONNECTIONS_MAX} connections open");
                        continue;
                    }
                    let live = self.pending.iter().filter(|p| p.is_some()).count();
                    if live >= HANDSHAKES_PENDING_MAX {
                        // Make room by dropping the handshake that has waited
                        // longest: sockets that connect and stay silent cannot
                        // lock out a client that sends its handshake at once.
                        if let Some(oldest) = (0..self.pending.len())
                            .filter_map(|i| self.pending[i].as_ref().map(|p| (p.deadline, i)))
                            .min()
                            .map(|(_, i)| i)
                        {
                            tracing::debug!(
                                "dropping the oldest pending handshake to admit a new one"
                            );
                            self.drop_pending(oldest);
                        }
                    }
                    let _ = stream.set_nodelay(true);
                    let slot = self
                        .pending
                        .iter()
                        .position(|p| p.is_none())
                        .unwrap_or_else(|| {
                            self.pending.push(None);
                            self.pending.len() - 1
                        });
                    if self
                        .poll
                        .registry()
                        .register(&mut stream, Token(FIRST_PENDING + slot), Interest::READABLE)
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
        if let Some(mut p) = self.pending[slot].take() {
            let _ = self.poll.registry().deregister(&mut p.stream);
        }
    }

    fn complete(&mut self, slot: usize) {
        let Some(mut p) = self.pending[slot].take() else {
            return;
        };
        let _ = self.poll.registry().deregister(&mut p.stream);
        let workers = self.handoffs.len() as u16;
        let status = match decode_handshake(&p.buf) {
            None => ErrorCode::UnsupportedVersion,
            Some((w, _)) if usize::from(w) >= self.handoffs.len() => ErrorCode::NoSuchWorker,
            Some(_) if self.open.load(Ordering::Acquire) >= CONNECTIONS_MAX => {
                ErrorCode::Unavailable
            }
            Some(_) => ErrorCode::Ok,
        };
        // A fresh socket's send buffer is empty, so 8 bytes always fit.
        let _ = p.stream.write(&encode_handshake(status.as_u16(), workers));
        if status != ErrorCode::Ok {
            return;
        }
        let worker = decode_handshake(&p.buf)
            .map(|(w, _)| usize::from(w))
            .unwrap_or(0);
        self.open.fetch_add(1, Ordering::AcqRel);
        if let Err(stream) = self.handoffs[worker].hand(p.stream) {
            self.open.fetch_sub(1, Ordering::AcqRel);
            drop(stream);
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

impl Acceptor for TcpAcceptor {
    fn run(&mut self, stop: &AtomicBool) -> Result<()> {
        let mut events = Events::with_capacity(EVENTS_PER_POLL);
        while !stop.load(Ordering::Acquire) {
            let timeout = self.expire(Instant::now());
            if let Err(e) = self.poll.poll(&mut events, timeout) {
                if e.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(e.into());
            }
            for ev in events.iter() {
                match ev.token() {
                    LISTENER => self.accept_all(),
                    WAKER => {}
                    Token(t) => self.advance(t - FIRST_PENDING),
                }
            }
        }
        Ok(())
    }

    fn waker(&self) -> Waker {
        let w = self.waker.clone();
        Waker::new(move || {
            let _ = w.wake();
        })
    }
}
