//! The unix socket beside each connection's shared memory.
//!
//! It carries the handshake (and with its reply the connection's memfd
//! and eventfds), then control records that pass region descriptors (with
//! the region's memfd), and it is the liveness channel: when a process
//! dies the kernel closes its end, and the peer sees end-of-file.
//!
//! ```text
//! handshake  client -> server:  "FKS" version(u8=1) worker(u16) reserved(u16=0)
//!            server -> client:  "FKS" version(u8=1) status(u16) workers(u16)
//!                               + SCM_RIGHTS [memfd, server eventfd, client eventfd]
//! control    [u32 kind=1][u32 0][u64 region id][u64 len][u64 key] + SCM_RIGHTS [memfd]
//! ```

use std::collections::VecDeque;
use std::io::{self, IoSlice, IoSliceMut};
use std::mem::MaybeUninit;
use std::os::fd::{BorrowedFd, OwnedFd};

use fabrickv_transport::handshake::CompactOpening;
use fabrickv_transport::{RemoteRegion, Result, TransportError};
use rustix::net::{
    RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, SendAncillaryBuffer,
    SendAncillaryMessage, SendFlags,
};

/// The handshake's layout: the compact opening shared with tcp, under a
/// magic of its own so a tcp client cannot mistake this server for its
/// kind.
pub const SHM_OPENING: CompactOpening = CompactOpening { magic: *b"FKS" };

/// Bytes of each handshake message.
pub const HANDSHAKE_BYTES: usize = fabrickv_transport::handshake::COMPACT_OPENING_BYTES;

/// Descriptors the handshake reply carries.
pub const HANDSHAKE_FDS: usize = 3;

/// Bytes of one control record.
pub const CONTROL_RECORD_BYTES: usize = 32;

/// Kind of a control record that passes a region.
const KIND_REGION: u32 = 1;

/// Most control records read per `recvmsg` (the kernel hands over at most
/// one sender's batch of descriptors per call anyway).
const CONTROL_RECORDS_PER_RECV: usize = 8;

/// Most received descriptors held while their record is incomplete.
const CONTROL_FDS_PENDING_MAX: usize = 16;

/// Encodes the control record that passes `r`.
pub fn region_record(r: &RemoteRegion) -> [u8; CONTROL_RECORD_BYTES] {
    let mut b = [0u8; CONTROL_RECORD_BYTES];
    b[..4].copy_from_slice(&KIND_REGION.to_le_bytes());
    b[8..16].copy_from_slice(&r.addr.to_le_bytes());
    b[16..24].copy_from_slice(&r.len.to_le_bytes());
    b[24..32].copy_from_slice(&r.key.to_le_bytes());
    b
}

/// Sends `bytes` with `fds` attached, never blocking: the socket buffer of
/// a connection is nearly always empty, and a peer that lets it fill up
/// with control records it does not read gets `Timeout`.
pub fn send_with_fds(sock: BorrowedFd<'_>, bytes: &[u8], fds: &[BorrowedFd<'_>]) -> Result<()> {
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(HANDSHAKE_FDS))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    if !control.push(SendAncillaryMessage::ScmRights(fds)) {
        return Err(TransportError::Io(io::Error::other(
            "too many descriptors for one message",
        )));
    }
    let flags = SendFlags::DONTWAIT | SendFlags::NOSIGNAL;
    let mut sent = loop {
        match rustix::net::sendmsg(sock, &[IoSlice::new(bytes)], &mut control, flags) {
            Ok(n) => break n,
            Err(rustix::io::Errno::INTR) => {}
            Err(e) => return Err(io::Error::from(e).into()),
        }
    };
    while sent < bytes.len() {
        match rustix::net::send(sock, &bytes[sent..], flags) {
            Ok(n) => sent += n,
            Err(rustix::io::Errno::INTR) => {}
            Err(e) => return Err(io::Error::from(e).into()),
        }
    }
    Ok(())
}

/// One `recvmsg` that also takes descriptors; returns bytes read (0 at
/// end-of-file) and appends received descriptors to `fds`.
pub fn recv_with_fds(
    sock: BorrowedFd<'_>,
    buf: &mut [u8],
    fds: &mut VecDeque<OwnedFd>,
    dontwait: bool,
) -> io::Result<usize> {
    let mut space =
        [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(CONTROL_RECORDS_PER_RECV))];
    let mut control = RecvAncillaryBuffer::new(&mut space);
    let mut flags = RecvFlags::CMSG_CLOEXEC;
    if dontwait {
        flags |= RecvFlags::DONTWAIT;
    }
    let n = loop {
        match rustix::net::recvmsg(sock, &mut [IoSliceMut::new(buf)], &mut control, flags) {
            Ok(r) => break r.bytes,
            Err(rustix::io::Errno::INTR) => {}
            Err(e) => return Err(e.into()),
        }
    };
    for msg in control.drain() {
        if let RecvAncillaryMessage::ScmRights(got) = msg {
            fds.extend(got);
        }
    }
    Ok(n)
}

/// A region the peer registered, as its control record announced it.
pub struct RegionAnnounce {
    /// Its descriptor.
    pub region: RemoteRegion,
    /// Its memfd.
    pub fd: OwnedFd,
}

/// Reassembles control records from the socket's byte stream.
#[derive(Default)]
pub struct ControlReader {
    /// Bytes of an incomplete record.
    partial: Vec<u8>,
    /// Descriptors received, oldest first, each for the next record.
    fds: VecDeque<OwnedFd>,
    /// Why the peer's control stream is unusable, once it is.
    broken: Option<String>,
}

impl ControlReader {
    /// Reads whatever the socket holds now, without blocking, handing each
    /// announced region to `on_region`. `Err(Closed)` at end-of-file,
    /// `Err(Framing)` if the peer broke the control protocol.
    pub fn drain(
        &mut self,
        sock: BorrowedFd<'_>,
        on_region: &mut dyn FnMut(RegionAnnounce) -> Result<()>,
    ) -> Result<()> {
        if let Some(why) = &self.broken {
            return Err(TransportError::Framing(why.clone()));
        }
        let r = self.drain_inner(sock, on_region);
        if let Err(TransportError::Framing(why)) = &r {
            self.broken = Some(why.clone());
        }
        r
    }

    fn drain_inner(
        &mut self,
        sock: BorrowedFd<'_>,
        on_region: &mut dyn FnMut(RegionAnnounce) -> Result<()>,
    ) -> Result<()> {
        let mut buf = [0u8; CONTROL_RECORD_BYTES * CONTROL_RECORDS_PER_RECV];
        loop {
            let n = match recv_with_fds(sock, &mut buf, &mut self.fds, true) {
                Ok(0) => return Err(TransportError::Closed),
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
                Err(e) => return Err(e.into()),
            };
            if self.fds.len() > CONTROL_FDS_PENDING_MAX {
                return Err(TransportError::Framing(
                    "peer sent descriptors without control records".into(),
                ));
            }
            self.partial.extend_from_slice(&buf[..n]);
            let whole = self.partial.len() / CONTROL_RECORD_BYTES * CONTROL_RECORD_BYTES;
            for rec in self.partial[..whole].chunks_exact(CONTROL_RECORD_BYTES) {
                let word =
                    |i: usize| u64::from_le_bytes(rec[i..i + 8].try_into().unwrap_or([0; 8]));
                if u32::from_le_bytes([rec[0], rec[1], rec[2], rec[3]]) != KIND_REGION {
                    return Err(TransportError::Framing("unknown control record".into()));
                }
                let fd = self.fds.pop_front().ok_or_else(|| {
                    TransportError::Framing("region record without its descriptor".into())
                })?;
                on_region(RegionAnnounce {
                    region: RemoteRegion {
                        addr: word(8),
                        len: word(16),
                        key: word(24),
                    },
                    fd,
                })?;
            }
            self.partial.drain(..whole);
        }
    }
}

/// Reads a whole handshake reply with its descriptors (blocking, under the
/// socket's receive timeout).
pub fn recv_handshake(sock: BorrowedFd<'_>) -> Result<([u8; HANDSHAKE_BYTES], VecDeque<OwnedFd>)> {
    let mut b = [0u8; HANDSHAKE_BYTES];
    let mut fds = VecDeque::new();
    let mut got = 0;
    while got < HANDSHAKE_BYTES {
        match recv_with_fds(sock, &mut b[got..], &mut fds, false) {
            Ok(0) => return Err(TransportError::Closed),
            Ok(n) => got += n,
            Err(e) => return Err(e.into()),
        }
    }
    Ok((b, fds))
}

/// Writes one 8-byte eventfd increment; a full counter is as good as a
/// wake-up.
#[inline]
pub fn signal(fd: &OwnedFd) {
    let _ = rustix::io::write(fd, &1u64.to_ne_bytes());
}

/// Resets an eventfd's counter (non-blocking).
pub fn clear(fd: &OwnedFd) {
    let mut b = [0u8; 8];
    let _ = rustix::io::read(fd, &mut b);
}

/// A fresh non-blocking eventfd.
pub fn eventfd() -> io::Result<OwnedFd> {
    Ok(rustix::event::eventfd(
        0,
        rustix::event::EventfdFlags::CLOEXEC | rustix::event::EventfdFlags::NONBLOCK,
    )?)
}
