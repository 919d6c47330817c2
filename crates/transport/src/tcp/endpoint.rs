//! The client side of a tcp connection.
//!
//! The socket stays in blocking mode so that a round trip costs two
//! syscalls (`send`, then a blocking `recv`); non-blocking steps use
//! `MSG_DONTWAIT` per call instead of switching the socket's mode.

use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use rustix::event::{PollFd, PollFlags};
use rustix::net::{RecvFlags, SendFlags};

use super::{decode_handshake, encode_handshake, resolve, HANDSHAKE_BYTES};
use crate::framing::{self, Next, PREFIX_BYTES};
use crate::{Endpoint, Result, TransportError};

/// Bytes asked of each `recv` call.
const RECV_CHUNK_BYTES: usize = 64 * 1024;

/// A connection to one worker of a FabricKV server.
pub struct TcpEndpoint {
    stream: TcpStream,
    inbuf: Vec<u8>,
    in_head: usize,
    out: Vec<u8>,
    out_head: usize,
    /// The receive timeout currently set on the socket, to skip redundant
    /// `setsockopt` calls.
    read_timeout: Option<Duration>,
    /// Workers the server reported in its handshake.
    workers: u16,
}

impl TcpEndpoint {
    /// Connects and binds the connection to `worker`.
    pub fn connect(addr: &str, worker: u16, timeout: Duration) -> Result<TcpEndpoint> {
        let sa = resolve(addr)?;
        let mut stream = TcpStream::connect_timeout(&sa, timeout)?;
        stream.set_nodelay(true)?;
        stream.set_read_timeout(Some(timeout))?;
        stream.set_write_timeout(Some(timeout))?;
        stream.write_all(&encode_handshake(worker, 0))?;
        let mut reply = [0u8; HANDSHAKE_BYTES];
        stream.read_exact(&mut reply)?;
        let (status, workers) = decode_handshake(&reply)
            .ok_or_else(|| TransportError::Refused("the peer is not a FabricKV server".into()))?;
        if status != 0 {
            let name = fabrickv_types::ErrorCode::from_u16(status).map_or("unknown", |c| c.name());
            return Err(TransportError::Refused(format!(
                "worker {worker}: {name} (server has {workers} workers)"
            )));
        }
        Ok(TcpEndpoint {
            stream,
            inbuf: Vec::new(),
            in_head: 0,
            out: Vec::new(),
            out_head: 0,
            read_timeout: Some(timeout),
            workers,
        })
    }

    /// Workers the server said it has.
    pub fn server_workers(&self) -> u16 {
        self.workers
    }

    /// Writes raw bytes to the socket, for tests of hostile input.
    pub fn write_raw(&mut self, bytes: &[u8]) -> Result<()> {
        self.stream.write_all(bytes)?;
        Ok(())
    }

    fn prepare_recv(&mut self) -> usize {
        if self.in_head == self.inbuf.len() {
            self.inbuf.clear();
            self.in_head = 0;
        } else if self.in_head > 0 && self.inbuf.capacity() - self.inbuf.len() < RECV_CHUNK_BYTES {
            self.inbuf.drain(..self.in_head);
            self.in_head = 0;
        }
        let len = self.inbuf.len();
        self.inbuf.resize(len + RECV_CHUNK_BYTES, 0);
        len
    }

    /// One `recv`; `Ok(false)` if nothing was there.
    fn recv_once(&mut self, dontwait: bool) -> Result<bool> {
        let len = self.prepare_recv();
        let r = if dontwait {
            rustix::net::recv(&self.stream, &mut self.inbuf[len..], RecvFlags::DONTWAIT)
                .map(|(n, _)| n)
                .map_err(io::Error::from)
        } else {
            self.stream.read(&mut self.inbuf[len..])
        };
        match r {
            Ok(0) => {
                self.inbuf.truncate(len);
                Err(TransportError::Closed)
            }
            Ok(n) => {
                self.inbuf.truncate(len + n);
                Ok(true)
            }
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock
                        | io::ErrorKind::TimedOut
                        | io::ErrorKind::Interrupted
                ) =>
            {
                self.inbuf.truncate(len);
                Ok(false)
            }
            Err(e) => {
                self.inbuf.truncate(len);
                Err(e.into())
            }
        }
    }

    fn has_message(&self) -> Result<bool> {
        match framing::next(&self.inbuf[self.in_head..]) {
            Next::Message(_) => Ok(true),
            Next::NeedMore(_) => Ok(false),
            Next::Corrupt(n) => Err(TransportError::Framing(format!(
                "server sent a message length of {n}"
            ))),
        }
    }
}

impl Endpoint for TcpEndpoint {
    fn post_with(&mut self, build: &mut dyn FnMut(&mut Vec<u8>)) -> Result<()> {
        let at = framing::begin(&mut self.out);
        build(&mut self.out);
        match framing::finish(&mut self.out, at) {
            Ok(true) => Ok(()),
            Ok(false) => Err(TransportError::MessageTooLarge(0)),
            Err(n) => Err(TransportError::MessageTooLarge(n)),
        }
    }

    fn flush(&mut self, timeout: Duration) -> Result<()> {
        let deadline = Instant::now() + timeout;
        while self.out_head < self.out.len() {
            match rustix::net::send(
                &self.stream,
                &self.out[self.out_head..],
                SendFlags::DONTWAIT | SendFlags::NOSIGNAL,
            ) {
                Ok(n) => self.out_head += n,
                Err(rustix::io::Errno::AGAIN) => {
                    // The server is not taking more: take its replies while waiting,
                    // so that neither side blocks on a full buffer of the other.
                    let left = deadline.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        return Err(TransportError::Timeout);
                    }
                    let mut fds = [PollFd::new(&self.stream, PollFlags::IN | PollFlags::OUT)];
                    let ts = rustix::event::Timespec {
                        tv_sec: left.as_secs() as i64,
                        tv_nsec: i64::from(left.subsec_nanos()),
                    };
                    match rustix::event::poll(&mut fds, Some(&ts)) {
                        Ok(_) | Err(rustix::io::Errno::INTR) => {}
                        Err(e) => return Err(io::Error::from(e).into()),
                    }
                    if fds[0].revents().contains(PollFlags::IN) {
                        self.recv_once(true)?;
                    }
                }
                Err(rustix::io::Errno::INTR) => {}
                Err(e) => return Err(io::Error::from(e).into()),
            }
        }
        self.out.clear();
        self.out_head = 0;
        Ok(())
    }

    fn poll(&mut self, max: usize, on_msg: &mut dyn FnMut(&[u8])) -> Result<usize> {
        if !self.has_message()? {
            self.recv_once(true)?;
        }
        let mut n = 0;
        while n < max {
            match framing::next(&self.inbuf[self.in_head..]) {
                Next::Message(len) => {
                    let start = self.in_head + PREFIX_BYTES;
                    on_msg(&self.inbuf[start..start + len]);
                    self.in_head = start + len;
                    n += 1;
                }
                Next::NeedMore(_) => break,
                Next::Corrupt(len) => {
                    return Err(TransportError::Framing(format!(
                        "server sent a message length of {len}"
                    )))
                }
            }
        }
        Ok(n)
    }

    fn wait(&mut self, timeout: Duration) -> Result<()> {
        if self.has_message()? {
            return Ok(());
        }
        let timeout = timeout.max(Duration::from_micros(1));
        if self.read_timeout != Some(timeout) {
            self.stream.set_read_timeout(Some(timeout))?;
            self.read_timeout = Some(timeout);
        }
        self.recv_once(false)?;
        Ok(())
    }
}
