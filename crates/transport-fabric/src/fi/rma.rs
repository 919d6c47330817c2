//! One-sided access on a [`Core`]: registering regions peers may read
//! and write, and `fi_write`/`fi_read` of a peer's region through the
//! endpoint's RMA staging memory.

use super::*;

impl Core {
    /// What this endpoint offers: one-sided access if the provider has
    /// `FI_RMA` (and its staging memory could be registered).
    pub fn capabilities(&self) -> Capabilities {
        if self.caps.rma {
            Capabilities::ONE_SIDED
        } else {
            Capabilities::NONE
        }
    }

    /// Registers `len` zeroed bytes for peers to read and write; returns
    /// (addr, key) as peers must use them.
    pub fn register_region(&mut self, len: usize) -> Result<RemoteRegion> {
        if !self.caps.rma {
            return Err(TransportError::Unsupported(
                "one-sided access (this libfabric provider has no FI_RMA)",
            ));
        }
        let mut mem = vec![0u8; len.max(1)].into_boxed_slice();
        let access =
            u64::from(sys::FI_REMOTE_READ | sys::FI_REMOTE_WRITE | sys::FI_READ | sys::FI_WRITE);
        let (mr, key) = self.register(&mut mem, access)?;
        let addr = if self.caps.virt_addr {
            mem.as_ptr() as u64
        } else {
            0
        };
        self.regions.push(Region { mem, mr, key, addr });
        Ok(RemoteRegion {
            addr,
            len: len as u64,
            key,
        })
    }

    /// The bytes of a region this node registered; `BadRegion` naming
    /// `owner` ("endpoint", "port") if it registered no such region.
    pub fn region_mut(&mut self, region: &RemoteRegion, owner: &str) -> Result<&mut [u8]> {
        self.regions
            .iter_mut()
            .find(|r| r.key == region.key && r.addr == region.addr)
            .map(|r| &mut r.mem[..])
            .ok_or_else(|| {
                TransportError::BadRegion(format!("not a region this {owner} registered"))
            })
    }

    /// Writes `data` into `region` of the peer `dest` at `offset` (checked
    /// against the region first; nothing moves if it overruns); returns
    /// once the provider reports the bytes delivered
    /// (`FI_DELIVERY_COMPLETE`), progressing the queue meanwhile, or fails
    /// after `RMA_TIMEOUT_MS`.
    pub fn write(
        &mut self,
        dest: u64,
        region: &RemoteRegion,
        offset: usize,
        data: &[u8],
    ) -> Result<()> {
        region.check(offset, data.len())?;
        self.rma_op(
            dest,
            region.addr + offset as u64,
            region.key,
            data.len(),
            Duration::from_millis(crate::RMA_TIMEOUT_MS),
            |buf, at| {
                buf.copy_from_slice(&data[at..at + buf.len()]);
            },
            None,
        )
    }

    /// Reads `region` of the peer `dest` at `offset` into `out`, as
    /// [`Core::write`] writes.
    pub fn read(
        &mut self,
        dest: u64,
        region: &RemoteRegion,
        offset: usize,
        out: &mut [u8],
    ) -> Result<()> {
        region.check(offset, out.len())?;
        let len = out.len();
        self.rma_op(
            dest,
            region.addr + offset as u64,
            region.key,
            len,
            Duration::from_millis(crate::RMA_TIMEOUT_MS),
            |_, _| {},
            Some(out),
        )
    }

    #[allow(clippy::too_many_arguments)]
    fn rma_op(
        &mut self,
        dest: u64,
        raddr: u64,
        key: u64,
        len: usize,
        timeout: Duration,
        fill: impl Fn(&mut [u8], usize),
        mut read_into: Option<&mut [u8]>,
    ) -> Result<()> {
        if !self.caps.rma || self.rma.is_none() {
            return Err(TransportError::Unsupported(
                "one-sided access (this libfabric provider has no FI_RMA)",
            ));
        }
        let deadline = Instant::now() + timeout;
        let mut at = 0;
        self.rma_err = None;
        while at < len {
            let n = (len - at).min(RMA_STAGING_BYTES);
            // One staging slot at a time keeps the order simple: the piece
            // completes (delivered) before the next starts.
            let slot = 0;
            let Some(stage) = self.rma.as_mut() else {
                return Err(TransportError::Unsupported("one-sided access"));
            };
            fill(&mut stage.slot_mut(slot)[..n], at);
            let buf = stage.slot_mut(slot).as_mut_ptr();
            let mut desc = stage.desc;
            let ctx: *mut OpCtx = &mut stage.ctxs[slot];
            let iov = sys::iovec {
                iov_base: buf.cast(),
                iov_len: n,
            };
            let rma_iov = sys::fi_rma_iov {
                addr: raddr + at as u64,
                len: n,
                key,
            };
            let msg = sys::fi_msg_rma {
                msg_iov: &iov,
                desc: &mut desc,
                iov_count: 1,
                addr: dest,
                rma_iov: &rma_iov,
                rma_iov_count: 1,
                context: ctx.cast(),
                data: 0,
            };
            loop {
                // SAFETY: the staging slot and its context belong to this
                // Node; we wait below for the completion before reusing them
                // (or the endpoint is closed first in Drop).
                let ret = unsafe {
                    if read_into.is_some() {
                        sys::fi_readmsg(self.ep, &msg, u64::from(sys::FI_COMPLETION))
                    } else {
                        sys::fi_writemsg(
                            self.ep,
                            &msg,
                            u64::from(sys::FI_COMPLETION | sys::FI_DELIVERY_COMPLETE),
                        )
                    }
                };
                if ret == -(sys::FI_EAGAIN as isize) {
                    self.progress()?;
                    if Instant::now() >= deadline {
                        return Err(TransportError::Timeout);
                    }
                    continue;
                }
                if ret < 0 {
                    return Err(fail(
                        if read_into.is_some() {
                            "fi_read"
                        } else {
                            "fi_write"
                        },
                        ret as i64,
                    ));
                }
                break;
            }
            self.rma_busy[slot] = true;
            while self.rma_busy[slot] {
                self.progress()?;
                if self.rma_busy[slot] && Instant::now() >= deadline {
                    // The slot stays busy inside the provider: never reuse
                    // it (the memory stays owned until the endpoint closes).
                    self.caps.rma = false;
                    return Err(TransportError::Timeout);
                }
            }
            if let Some(e) = self.rma_err.take() {
                return Err(TransportError::BadRegion(format!(
                    "one-sided {} refused by the provider: {}",
                    if read_into.is_some() { "read" } else { "write" },
                    strerror(e)
                )));
            }
            if let (Some(out), Some(stage)) = (read_into.as_deref_mut(), self.rma.as_ref()) {
                out[at..at + n].copy_from_slice(stage.slot(slot, n));
            }
            at += n;
        }
        Ok(())
    }
}
