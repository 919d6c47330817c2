//! The hot path of a [`Core`]: sending a packet (`fi_inject` or a send
//! slot), reading completions, and the wait object an idle loop blocks
//! on. Every message of every connection goes through these calls.

use super::*;

/// Largest packet sent with `fi_inject` from a stack buffer, in bytes.
const INJECT_STACK_BYTES: usize = 4096;

impl Core {
    /// Sends `parts` concatenated as one packet to `dest`. Copies into a
    /// send slot, or lets the provider copy (`fi_inject`) if small enough.
    /// Returns false if the provider's queue is full (progress and retry).
    pub fn send(&mut self, dest: u64, parts: &[&[u8]]) -> Result<bool> {
        let len: usize = parts.iter().map(|p| p.len()).sum();
        debug_assert!(len <= self.tx.slot_bytes);
        if self.use_inject && len <= self.caps.inject_bytes && len <= INJECT_STACK_BYTES {
            let mut buf = [0u8; INJECT_STACK_BYTES];
            let mut at = 0;
            for p in parts {
                buf[at..at + p.len()].copy_from_slice(p);
                at += p.len();
            }
            // SAFETY: fi_inject copies the buffer before returning.
            let ret = unsafe { sys::fi_inject(self.ep, buf.as_ptr().cast(), len, dest) };
            return self.sent(ret, "fi_inject");
        }
        let Some(slot) = self.tx_free.pop() else {
            self.progress()?;
            return Ok(false);
        };
        let buf = self.tx.slot_mut(slot);
        let mut at = 0;
        for p in parts {
            buf[at..at + p.len()].copy_from_slice(p);
            at += p.len();
        }
        let ptr = buf.as_mut_ptr();
        let ctx: *mut OpCtx = &mut self.tx.ctxs[slot];
        // SAFETY: the send slot and context are owned by this Node and stay
        // busy (off the free list) until the completion returns them.
        let ret = unsafe { sys::fi_send(self.ep, ptr.cast(), len, self.tx.desc, dest, ctx.cast()) };
        if ret < 0 {
            self.tx_free.push(slot);
        } else {
            self.tx_dest[slot] = dest;
        }
        self.sent(ret, "fi_send")
    }

    fn sent(&mut self, ret: isize, what: &str) -> Result<bool> {
        if ret == -(sys::FI_EAGAIN as isize) {
            self.progress()?;
            return Ok(false);
        }
        if ret < 0 {
            return Err(fail(what, ret as i64));
        }
        Ok(true)
    }

    /// Reads a burst of completions: receives become [`Event`]s, send slots
    /// return to the free list, RMA slots are marked done. Returns how many
    /// completions were read.
    pub fn progress(&mut self) -> Result<usize> {
        let mut entries = [sys::fi_cq_msg_entry {
            op_context: ptr::null_mut(),
            flags: 0,
            len: 0,
        }; CQ_BURST];
        // SAFETY: entries has room for CQ_BURST msg-format entries.
        let ret = unsafe { sys::fi_cq_read(self.cq, entries.as_mut_ptr().cast(), CQ_BURST) };
        if ret == -(sys::FI_EAGAIN as isize) {
            return Ok(0);
        }
        if ret == -(sys::FI_EAVAIL as isize) {
            self.read_error()?;
            return Ok(1);
        }
        if ret < 0 {
            return Err(fail("fi_cq_read", ret as i64));
        }
        for e in &entries[..ret as usize] {
            // SAFETY: every context we post is an OpCtx owned by this Node.
            let t = unsafe { (*e.op_context.cast::<OpCtx>()).tag };
            self.complete(t, e.len, None);
        }
        Ok(ret as usize)
    }

    fn complete(&mut self, t: u64, len: usize, err: Option<i32>) {
        let (kind, slab, slot) = untag(t);
        match kind {
            KIND_RECV => match err {
                None => self.events.push_back(Event::Recv { slab, slot, len }),
                Some(e) if e as u32 == sys::FI_ECANCELED => {}
                Some(e) => {
                    tracing::warn!("receive failed: {}; reposting", strerror(e));
                    self.events.push_back(Event::RecvFailed { slab, slot });
                }
            },
            KIND_SEND => {
                self.tx_free.push(slot);
                let dest = std::mem::replace(&mut self.tx_dest[slot], ADDR_UNSPEC);
                if let Some(err) = err {
                    self.events.push_back(Event::SendFailed { dest, err });
                }
            }
            KIND_RMA => {
                if let Some(b) = self.rma_busy.get_mut(slot) {
                    *b = false;
                }
                if err.is_some() {
                    self.rma_err = err;
                }
            }
            _ => {}
        }
    }

    fn read_error(&mut self) -> Result<()> {
        let mut e = sys::fi_cq_err_entry::default();
        // SAFETY: e is a valid error entry to fill.
        let ret = unsafe { sys::fi_cq_readerr(self.cq, &mut e, 0) };
        if ret < 0 {
            return Ok(());
        }
        let mut text = [0 as std::ffi::c_char; 128];
        // SAFETY: text is a valid buffer; the call writes a NUL-terminated
        // string into it or returns a static one.
        let prov = unsafe {
            let p = sys::fi_cq_strerror(
                self.cq,
                e.prov_errno,
                e.err_data,
                text.as_mut_ptr(),
                text.len(),
            );
            if p.is_null() {
                String::new()
            } else {
                CStr::from_ptr(p).to_string_lossy().into_owned()
            }
        };
        if e.err as u32 != sys::FI_ECANCELED {
            tracing::debug!("completion error: {} (provider: {prov})", strerror(e.err));
        }
        if e.op_context.is_null() {
            return Err(fail("completion", -i64::from(e.err)));
        }
        // SAFETY: every context we post is an OpCtx owned by this Node.
        let t = unsafe { (*e.op_context.cast::<OpCtx>()).tag };
        self.complete(t, e.len, Some(e.err));
        Ok(())
    }

    /// Whether a send to `dest` from a send slot has not completed yet.
    /// The provider still holds its peer then: the `shm` provider takes
    /// the peer region's lock when the peer's answer to the send comes
    /// back, so `dest` must stay in the address vector until then.
    pub fn sending_to(&self, dest: u64) -> bool {
        self.tx_dest.contains(&dest)
    }

    /// The completion queue's wait descriptor, if the provider has one.
    pub fn wait_fd(&self) -> Option<RawFd> {
        self.wait_fd
    }

    /// True if it is safe to block on [`Node::wait_fd`] now (nothing is
    /// pending inside the provider).
    pub fn trywait(&mut self) -> bool {
        if self.wait_fd.is_none() {
            return false;
        }
        // SAFETY: the fids are live objects of this fabric.
        let mut fids = [unsafe { &mut (*self.cq).fid as *mut sys::fid }];
        // SAFETY: as above; fids has one entry.
        unsafe { sys::fi_trywait(self.fabric, fids.as_mut_ptr(), 1) == 0 }
    }
}
