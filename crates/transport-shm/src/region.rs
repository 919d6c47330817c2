//! Registered regions: memfds that the peer maps for one-sided access.
//!
//! A region's descriptor is `{addr: region id, len, key: random u64}`. The
//! owner sends the memfd over the connection's unix socket *before* the
//! descriptor can travel in any message, so by the time a peer acts on a
//! descriptor the file is already queued on its socket: a peer that meets
//! an unknown id drains its socket first ([`PeerLink::access`]).

use std::collections::HashMap;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use fabrickv_transport::{RemoteRegion, Result, TransportError};

use crate::ctl::{ControlReader, RegionAnnounce};
use crate::mem::Mapping;

/// Largest region one side may register, in bytes (1 GiB).
pub const REGION_BYTES_MAX: usize = 1 << 30;

/// Most regions one side registers (a client per endpoint, a server per
/// worker port).
pub const REGIONS_MAX: usize = 256;

/// Most regions one peer may announce on one connection; a peer that
/// announces more is dropped.
pub const PEER_REGIONS_MAX: usize = REGIONS_MAX;

/// A region this side registered.
pub struct LocalRegion {
    /// What the peer is told.
    pub desc: RemoteRegion,
    /// The memory.
    map: Mapping,
    /// The file, kept to announce the region to peers that connect later.
    fd: OwnedFd,
}

impl LocalRegion {
    /// The file to pass to a peer.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

/// The regions one side registered.
#[derive(Default)]
pub struct LocalRegions {
    /// Registered regions by id.
    regions: HashMap<u64, LocalRegion>,
    /// Id of the next registration.
    next_id: u64,
}

fn random_key() -> Result<u64> {
    let mut b = [0u8; 8];
    rustix::rand::getrandom(&mut b, rustix::rand::GetRandomFlags::empty())
        .map_err(|e| TransportError::Io(e.into()))?;
    Ok(u64::from_le_bytes(b))
}

impl LocalRegions {
    /// Creates and maps a zeroed region of `len` bytes.
    pub fn register(&mut self, len: usize) -> Result<&LocalRegion> {
        if len > REGION_BYTES_MAX {
            return Err(TransportError::BadRegion(format!(
                "{len} bytes exceed the region bound of {REGION_BYTES_MAX}"
            )));
        }
        if self.regions.len() >= REGIONS_MAX {
            return Err(TransportError::BadRegion(format!(
                "{REGIONS_MAX} regions are registered already"
            )));
        }
        let (map, fd) = Mapping::create("fabrickv-shm-region", len)?;
        self.next_id += 1;
        let desc = RemoteRegion {
            addr: self.next_id,
            len: len as u64,
            key: random_key()?,
        };
        let r = self
            .regions
            .entry(desc.addr)
            .or_insert(LocalRegion { desc, map, fd });
        Ok(r)
    }

    /// Every registered region.
    pub fn iter(&self) -> impl Iterator<Item = &LocalRegion> {
        self.regions.values()
    }

    /// The owner's view of region `r`.
    pub fn view(&mut self, r: &RemoteRegion) -> Result<&mut [u8]> {
        match self.regions.get_mut(&r.addr) {
            Some(l) if l.desc.key == r.key => {
                let len = l.desc.len as usize;
                Ok(&mut l.map.bytes_mut()[..len])
            }
            _ => Err(TransportError::BadRegion(format!(
                "region {} with this key is not registered here",
                r.addr
            ))),
        }
    }
}

/// A region the peer registered, mapped here.
struct PeerRegion {
    /// Its length and key as announced.
    desc: RemoteRegion,
    /// The memory.
    map: Mapping,
}

/// The regions the peer of one connection announced.
#[derive(Default)]
struct PeerRegions {
    /// Announced regions by id.
    regions: HashMap<u64, PeerRegion>,
}

impl PeerRegions {
    /// Maps a region the peer announced.
    pub fn adopt(&mut self, a: RegionAnnounce) -> Result<()> {
        let d = a.region;
        if d.len > REGION_BYTES_MAX as u64 || self.regions.len() >= PEER_REGIONS_MAX {
            return Err(TransportError::Framing(format!(
                "peer announced a region of {} bytes or more than {PEER_REGIONS_MAX} regions",
                d.len
            )));
        }
        let map = Mapping::open(a.fd.as_fd(), d.len as usize)
            .map_err(|e| TransportError::Framing(format!("peer region unusable: {e}")))?;
        self.regions.insert(d.addr, PeerRegion { desc: d, map });
        Ok(())
    }

    /// The region `r` names, after checking key and bounds of `len` bytes
    /// at `offset`; `None` if the id is unknown.
    fn find(
        &mut self,
        r: &RemoteRegion,
        offset: usize,
        len: usize,
    ) -> Result<Option<&mut Mapping>> {
        let Some(p) = self.regions.get_mut(&r.addr) else {
            return Ok(None);
        };
        if p.desc.key != r.key {
            return Err(TransportError::BadRegion(format!(
                "wrong key for region {}",
                r.addr
            )));
        }
        p.desc.check(offset, len)?;
        Ok(Some(&mut p.map))
    }
}

/// What one side knows of its peer's regions: the control records still
/// arriving on the connection's socket, and the regions they announced.
/// Every one-sided access of either side goes through it.
#[derive(Default)]
pub struct PeerLink {
    /// Partial control records from the socket.
    ctl: ControlReader,
    /// Regions the peer announced.
    regions: PeerRegions,
}

impl PeerLink {
    /// Adopts every region announced on `sock` so far; `Closed` at
    /// end-of-file.
    pub fn drain(&mut self, sock: BorrowedFd<'_>) -> Result<()> {
        let regions = &mut self.regions;
        self.ctl.drain(sock, &mut |a| regions.adopt(a))
    }

    /// The mapping of the peer's region `r` after checking key and bounds;
    /// if `r` is not known yet, first adopts the regions announced on
    /// `sock`.
    fn find(
        &mut self,
        sock: BorrowedFd<'_>,
        r: &RemoteRegion,
        offset: usize,
        len: usize,
    ) -> Result<&mut Mapping> {
        if self.regions.find(r, offset, len)?.is_none() {
            // End-of-file here is not this call's failure: the region may
            // be announced before it, and the caller learns of the closure
            // on its next poll.
            match self.drain(sock) {
                Ok(()) | Err(TransportError::Closed) => {}
                Err(e) => return Err(e),
            }
        }
        self.regions.find(r, offset, len)?.ok_or_else(|| {
            TransportError::BadRegion(format!("the peer registered no region {}", r.addr))
        })
    }

    /// Lends `len` bytes of the peer's region `r` at `offset`.
    pub fn view_mut(
        &mut self,
        sock: BorrowedFd<'_>,
        r: &RemoteRegion,
        offset: usize,
        len: usize,
    ) -> Result<&mut [u8]> {
        Ok(self.find(sock, r, offset, len)?.range_mut(offset, len))
    }

    /// Performs `op` on the peer's region `r` at `offset`.
    pub fn access(
        &mut self,
        sock: BorrowedFd<'_>,
        r: &RemoteRegion,
        offset: usize,
        op: Access<'_>,
    ) -> Result<()> {
        let len = match &op {
            Access::Write(d) => d.len(),
            Access::Read(o) => o.len(),
        };
        let m = self.find(sock, r, offset, len)?;
        match op {
            Access::Write(d) => m.write(offset, d),
            Access::Read(o) => m.read(offset, o),
        }
        Ok(())
    }
}

/// `write_remote` and `read_remote` of a type that holds a connection's
/// `peer: PeerLink` and its unix socket `sock` (owned or borrowed): the
/// server's reply and the client's endpoint alike, so both sides' one-sided
/// access is this one body over [`PeerLink::access`]. Invoked inside the
/// `impl Reply` or `impl Endpoint`.
macro_rules! one_sided_via_peer_link {
    () => {
        fn write_remote(
            &mut self,
            r: &fabrickv_transport::RemoteRegion,
            offset: usize,
            data: &[u8],
        ) -> fabrickv_transport::Result<()> {
            let sock = std::os::fd::AsFd::as_fd(&self.sock);
            let op = $crate::region::Access::Write(data);
            self.peer.access(sock, r, offset, op)
        }

        fn read_remote(
            &mut self,
            r: &fabrickv_transport::RemoteRegion,
            offset: usize,
            out: &mut [u8],
        ) -> fabrickv_transport::Result<()> {
            let sock = std::os::fd::AsFd::as_fd(&self.sock);
            let op = $crate::region::Access::Read(out);
            self.peer.access(sock, r, offset, op)
        }
    };
}
pub(crate) use one_sided_via_peer_link;

/// A one-sided access.
pub enum Access<'a> {
    /// Copy these bytes into the region.
    Write(&'a [u8]),
    /// Copy region bytes into this buffer.
    Read(&'a mut [u8]),
}
