//! A safe wrapper over the few libfabric objects FabricKV uses: one RDM
//! endpoint with its fabric, domain, completion queue and address vector
//! ([`Node`]), and the registered memory it sends from, receives into and
//! exposes for one-sided access ([`Slab`], [`Region`]).
//!
//! Every call into `sys` lives in this file. The rules that make the rest
//! of the crate safe:
//! - all memory handed to the provider (receive slots, send slots, RMA
//!   staging, exposed regions) and every operation context is owned by the
//!   [`Node`] that posted it, never moves (boxed slices) and is freed only
//!   after the endpoint is closed (see `Drop for Node`);
//! - operations are posted by slot index, so a caller cannot hand the
//!   provider a buffer that dies before the operation completes;
//! - a [`Node`] is used by one thread at a time (`FI_THREAD_DOMAIN`).

use std::collections::VecDeque;
use std::ffi::{c_void, CStr, CString};
use std::io;
use std::os::fd::RawFd;
use std::ptr;
use std::time::{Duration, Instant};

use fabrickv_transport::{Capabilities, RemoteRegion, Result, TransportError};

use crate::sys;

/// The libfabric API version this crate is written against (1.17).
const API_VERSION: u32 = (sys::FI_MAJOR_VERSION << 16) | sys::FI_MINOR_VERSION;

/// `FI_ADDR_UNSPEC` (a cast macro bindgen cannot translate).
pub const ADDR_UNSPEC: u64 = u64::MAX;

/// Completion-queue entries; sized above every operation one endpoint can
/// have outstanding (receive slots + send slots + RMA staging) so the
/// queue never overruns.
const CQ_ENTRIES: usize = 16 * 1024;

/// Completions read by one `fi_cq_read` call.
pub const CQ_BURST: usize = 32;

/// Longest endpoint name (`fi_getname`) accepted, in bytes.
pub const NAME_BYTES_MAX: usize = 256;

/// Bytes of each RMA staging slot: one-sided transfers of user data are
/// copied through registered memory in pieces of this size.
pub const RMA_STAGING_BYTES: usize = 256 * 1024;

/// RMA staging slots in flight at once per endpoint.
const RMA_STAGING_SLOTS: usize = 4;

/// What an operation context's tag says about the operation.
const KIND_RECV: u64 = 1;
const KIND_SEND: u64 = 2;
const KIND_RMA: u64 = 3;

fn tag(kind: u64, slab: usize, slot: usize) -> u64 {
    kind << 56 | (slab as u64) << 32 | slot as u64
}

fn untag(t: u64) -> (u64, usize, usize) {
    (
        t >> 56,
        ((t >> 32) & 0xff_ffff) as usize,
        (t & 0xffff_ffff) as usize,
    )
}

/// The text of a libfabric error code (positive `FI_E*` / errno value).
pub fn strerror(code: i32) -> String {
    // SAFETY: fi_strerror returns a pointer to a static string for any code.
    let p = unsafe { sys::fi_strerror(code.abs()) };
    if p.is_null() {
        return format!("error {code}");
    }
    // SAFETY: non-null pointers from fi_strerror are NUL-terminated statics.
    unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
}

/// Turns a negative libfabric return into a transport error naming the call.
fn fail(what: &str, ret: i64) -> TransportError {
    let code = ret.unsigned_abs() as i32;
    let kind = match code as u32 {
        sys::FI_ECONNREFUSED | sys::FI_ECONNRESET | sys::FI_ENOTCONN | sys::FI_ECONNABORTED => {
            return TransportError::Closed
        }
        sys::FI_ETIMEDOUT => return TransportError::Timeout,
        _ => io::ErrorKind::Other,
    };
    TransportError::Io(io::Error::new(
        kind,
        format!("libfabric {what}: {} (-{code})", strerror(code)),
    ))
}

fn check(what: &str, ret: i32) -> Result<()> {
    if ret < 0 {
        Err(fail(what, i64::from(ret)))
    } else {
        Ok(())
    }
}

/// What the provider offers, read from its `fi_info`.
#[derive(Debug, Clone)]
pub struct Caps {
    /// The provider's name (`tcp;ofi_rxm`, `shm`, ...).
    pub provider: String,
    /// One-sided read and write (`FI_RMA`) are available.
    pub rma: bool,
    /// Remote addresses are virtual addresses (`FI_MR_VIRT_ADDR`); else
    /// offsets from the region's start.
    pub virt_addr: bool,
    /// Largest send the provider copies at once (`fi_inject`), in bytes.
    pub inject_bytes: usize,
    /// Largest message, in bytes.
    pub max_msg_bytes: usize,
}

/// A provider's `fi_info`, as chosen by [`Info::get`].
struct Info {
    ptr: *mut sys::fi_info,
}

impl Drop for Info {
    fn drop(&mut self) {
        // SAFETY: ptr came from fi_getinfo and is freed once.
        unsafe { sys::fi_freeinfo(self.ptr) }
    }
}

unsafe extern "C" {
    fn strdup(s: *const std::ffi::c_char) -> *mut std::ffi::c_char;
    fn atexit(f: extern "C" fn()) -> std::ffi::c_int;
}

/// Closes every retired endpoint when the process exits normally, so that
/// the `shm` provider unlinks its segments from /dev/shm (it names them
/// there; without `fi_close` they would outlive the process).
extern "C" fn close_retired_at_exit() {
    if let Ok(mut list) = RETIRED.lock() {
        list.clear();
    }
}

impl Info {
    /// Asks for an RDM endpoint of `provider` with `caps`, bound to the
    /// source `node` (an IP address, or a unique name for shm) if given.
    fn get(provider: &str, node: Option<&str>, caps: u64) -> std::result::Result<Info, i32> {
        let prov = CString::new(provider).map_err(|_| sys::FI_EINVAL as i32)?;
        let node_c = node
            .map(CString::new)
            .transpose()
            .map_err(|_| sys::FI_EINVAL as i32)?;
        // SAFETY: fi_allocinfo returns a zeroed fi_info with its attribute
        // structs allocated, or null.
        let hints = unsafe { sys::fi_allocinfo() };
        if hints.is_null() {
            return Err(sys::FI_ENOMEM as i32);
        }
        let mut info: *mut sys::fi_info = ptr::null_mut();
        // SAFETY: hints and its attribute pointers are valid (allocinfo);
        // prov_name must be malloc'd because fi_freeinfo frees it.
        let ret = unsafe {
            (*hints).caps = caps;
            (*hints).mode = sys::FI_CONTEXT | sys::FI_CONTEXT2;
            (*(*hints).ep_attr).type_ = sys::fi_ep_type_FI_EP_RDM;
            (*(*hints).domain_attr).mr_mode = (sys::FI_MR_LOCAL
                | sys::FI_MR_VIRT_ADDR
                | sys::FI_MR_ALLOCATED
                | sys::FI_MR_PROV_KEY) as i32;
            (*(*hints).domain_attr).threading = sys::fi_threading_FI_THREAD_DOMAIN;
            (*(*hints).tx_attr).msg_order = u64::from(sys::FI_ORDER_SAS);
            (*(*hints).rx_attr).msg_order = u64::from(sys::FI_ORDER_SAS);
            (*(*hints).fabric_attr).prov_name = strdup(prov.as_ptr());
            let ret = sys::fi_getinfo(
                API_VERSION,
                node_c.as_ref().map_or(ptr::null(), |n| n.as_ptr()),
                ptr::null(),
                if node_c.is_some() { sys::FI_SOURCE } else { 0 },
                hints,
                &mut info,
            );
            sys::fi_freeinfo(hints);
            ret
        };
        if ret < 0 || info.is_null() {
            return Err(if ret < 0 {
                -ret
            } else {
                sys::FI_ENODATA as i32
            });
        }
        Ok(Info { ptr: info })
    }

    fn caps(&self) -> Caps {
        // SAFETY: a fi_info from fi_getinfo has valid attribute pointers;
        // prov_name is a NUL-terminated string or null.
        unsafe {
            let i = &*self.ptr;
            let fab = &*i.fabric_attr;
            let provider = if fab.prov_name.is_null() {
                String::new()
            } else {
                CStr::from_ptr(fab.prov_name).to_string_lossy().into_owned()
            };
            let mr_mode = (*i.domain_attr).mr_mode as u32;
            Caps {
                provider,
                rma: i.caps & u64::from(sys::FI_RMA) != 0,
                virt_addr: mr_mode & sys::FI_MR_VIRT_ADDR != 0,
                inject_bytes: (*i.tx_attr).inject_size,
                max_msg_bytes: (*i.ep_attr).max_msg_size,
            }
        }
    }
}

/// Chooses the provider's fi_info: messages and RMA if it has both, else
/// messages only (reported in the log); a clear error if the provider is
/// not there at all.
fn choose(provider: &str, node: Option<&str>) -> Result<Info> {
    let msg = u64::from(sys::FI_MSG);
    let rma = u64::from(sys::FI_RMA);
    let tries: [(Option<&str>, u64); 4] = [
        (node, msg | rma),
        (node, msg),
        (None, msg | rma),
        (None, msg),
    ];
    let mut last = sys::FI_ENODATA as i32;
    for (i, (node, caps)) in tries.iter().enumerate() {
        if i >= 2 && node.is_none() && tries[0].0.is_none() {
            break;
        }
        match Info::get(provider, *node, *caps) {
            Ok(info) => {
                if *caps & rma == 0 {
                    tracing::warn!(
                        "libfabric provider {provider:?} offers no FI_RMA with these \
                         settings: messages only, one-sided access unsupported"
                    );
                }
                if i >= 2 {
                    tracing::warn!(
                        "libfabric provider {provider:?} refused source address {:?}; \
                         letting it choose",
                        tries[0].0
                    );
                }
                return Ok(info);
            }
            Err(e) => last = e,
        }
    }
    Err(TransportError::Io(io::Error::new(
        io::ErrorKind::NotFound,
        format!(
            "libfabric provider {provider:?} is not available for reliable datagram \
             endpoints (FI_EP_RDM, FI_MSG) on this host: {} (-{last}); list the \
             providers with `fi_info -l` (Debian package libfabric-bin)",
            strerror(last)
        ),
    )))
}

/// A completion the owner of a [`Node`] must act on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event {
    /// A packet of `len` bytes arrived in receive slot `slot` of slab `slab`.
    Recv {
        slab: usize,
        slot: usize,
        len: usize,
    },
    /// A receive failed; its slot must be posted again.
    RecvFailed { slab: usize, slot: usize },
    /// A send to `dest` failed; the peer is gone or unreachable.
    SendFailed { dest: u64, err: i32 },
}

/// An operation context: the provider's scratch space (`FI_CONTEXT2`
/// mode) followed by our tag. The provider hands its address back in the
/// completion.
#[repr(C)]
struct OpCtx {
    fi: sys::fi_context2,
    tag: u64,
}

/// Registered memory cut into equal slots, each with its own context.
pub struct Slab {
    mem: Box<[u8]>,
    slot_bytes: usize,
    mr: *mut sys::fid_mr,
    desc: *mut c_void,
    ctxs: Box<[OpCtx]>,
}

impl Slab {
    /// Bytes of slot `i`.
    pub fn slot(&self, i: usize, len: usize) -> &[u8] {
        let start = i * self.slot_bytes;
        &self.mem[start..start + len.min(self.slot_bytes)]
    }

    fn slot_mut(&mut self, i: usize) -> &mut [u8] {
        let start = i * self.slot_bytes;
        &mut self.mem[start..start + self.slot_bytes]
    }
}

/// A region registered for one-sided access by peers.
struct Region {
    mem: Box<[u8]>,
    mr: *mut sys::fid_mr,
    key: u64,
    /// Address peers use for the first byte.
    addr: u64,
}

/// One RDM endpoint and everything it owns: the receive slabs apart from
/// the rest, so that the bytes of a received packet can be lent out while
/// the endpoint sends or writes one-sided.
pub struct Node {
    /// Receive slabs (slot contexts tagged `KIND_RECV`).
    pub rx: Vec<Slab>,
    /// The endpoint and everything else it owns.
    pub core: Core,
}

/// The endpoint, its queues, and the memory it sends and writes from.
pub struct Core {
    info: Info,
    fabric: *mut sys::fid_fabric,
    domain: *mut sys::fid_domain,
    cq: *mut sys::fid_cq,
    av: *mut sys::fid_av,
    ep: *mut sys::fid_ep,
    /// The completion queue's wait file descriptor, if the provider has one.
    wait_fd: Option<RawFd>,
    /// What the provider offers.
    pub caps: Caps,
    /// This endpoint's name, for peers' address vectors.
    pub name: Vec<u8>,
    /// Send slots and the free list over them.
    tx: Slab,
    tx_free: Vec<usize>,
    /// Where each busy send slot is going, to name the peer on failure.
    tx_dest: Vec<u64>,
    /// RMA staging slots; `rma_busy[i]` until the operation completes.
    rma: Option<Slab>,
    rma_busy: Vec<bool>,
    rma_err: Option<i32>,
    /// Regions peers may access.
    regions: Vec<Region>,
    next_key: u64,
    /// Completions read but not yet taken by the owner.
    pub events: VecDeque<Event>,
    /// Small packets go by `fi_inject` (no send completion to reap); the
    /// raw baseline turns this off to measure plain `fi_send`.
    pub use_inject: bool,
}

// SAFETY: a Node's libfabric objects are used by one thread at a time
// (domain threading FI_THREAD_DOMAIN); moving the whole Node to another
// thread is allowed by that model. Slabs hold only owned memory and
// handles that belong to the Node.
unsafe impl Send for Core {}

/// How long a closed `shm` endpoint is kept open before it is really
/// closed, in milliseconds.
///
/// libfabric 1.17's `shm` provider lets peers in one process reach into each
/// other's memory directly; closing an endpoint while a peer in the same
/// process is still polling its completion queue makes that peer fault
/// (upstream issues ofiwg/libfabric#7405 and #8493). Peers notice a closed
/// connection within milliseconds (`CLOSE_CHECK_INTERVAL_MS`), so an
/// endpoint that outlives its connection by this long is safe to close.
pub const SHM_RETIRE_MS: u64 = 2_000;

/// Endpoints waiting out [`SHM_RETIRE_MS`], oldest first.
static RETIRED: std::sync::Mutex<Vec<(std::time::Instant, Node)>> =
    std::sync::Mutex::new(Vec::new());

/// Closes `node`: at once for most providers, after [`SHM_RETIRE_MS`] for
/// `shm`. Retired endpoints whose time is up are closed on each call, so
/// at most the endpoints closed in the last [`SHM_RETIRE_MS`] are held.
pub fn retire(node: Node) {
    static AT_EXIT: std::sync::Once = std::sync::Once::new();
    AT_EXIT.call_once(|| {
        // SAFETY: registers a plain extern "C" function with no arguments,
        // which is what atexit(3) takes; it may run at most once.
        let rc = unsafe { atexit(close_retired_at_exit) };
        if rc != 0 {
            tracing::warn!(
                "cannot register the exit hook: retired shm endpoints may be left in /dev/shm"
            );
        }
    });
    let now = std::time::Instant::now();
    let Ok(mut list) = RETIRED.lock() else {
        drop(node);
        return;
    };
    let due = list.iter().take_while(|(t, _)| *t <= now).count();
    let expired: Vec<_> = list.drain(..due).collect();
    if node.core.caps.provider == "shm" {
        list.push((now + std::time::Duration::from_millis(SHM_RETIRE_MS), node));
    } else {
        drop(node);
    }
    drop(list);
    drop(expired);
}
// SAFETY: as above.
unsafe impl Send for Slab {}

impl Node {
    /// Opens an endpoint of `provider` with `tx_slots` send slots of
    /// `slot_bytes`, bound to source `node` if given.
    pub fn open(
        provider: &str,
        node: Option<&str>,
        tx_slots: usize,
        slot_bytes: usize,
    ) -> Result<Node> {
        let info = choose(provider, node)?;
        let caps = info.caps();
        if caps.max_msg_bytes < slot_bytes {
            return Err(TransportError::Unsupported(
                "libfabric provider whose largest message is below the packet size",
            ));
        }
        let core = Core {
            info,
            fabric: ptr::null_mut(),
            domain: ptr::null_mut(),
            cq: ptr::null_mut(),
            av: ptr::null_mut(),
            ep: ptr::null_mut(),
            wait_fd: None,
            caps,
            name: Vec::new(),
            tx: Slab {
                mem: Box::new([]),
                slot_bytes,
                mr: ptr::null_mut(),
                desc: ptr::null_mut(),
                ctxs: Box::new([]),
            },
            tx_free: Vec::new(),
            tx_dest: vec![ADDR_UNSPEC; tx_slots],
            rma: None,
            rma_busy: vec![false; RMA_STAGING_SLOTS],
            rma_err: None,
            regions: Vec::new(),
            next_key: 1,
            events: VecDeque::with_capacity(CQ_ENTRIES),
            use_inject: true,
        };
        let mut n = Node {
            rx: Vec::new(),
            core,
        };
        let c = &mut n.core;
        c.open_objects()?;
        tracing::debug!(
            "libfabric endpoint: provider {:?}, wait fd {:?}, inject {} B, max message {} B, \
             rma {}, virtual addresses {}",
            c.caps.provider,
            c.wait_fd,
            c.caps.inject_bytes,
            c.caps.max_msg_bytes,
            c.caps.rma,
            c.caps.virt_addr
        );
        c.tx = c.slab(KIND_SEND, 0, tx_slots, slot_bytes)?;
        c.tx_free = (0..tx_slots).rev().collect();
        if c.caps.rma {
            match c.slab(KIND_RMA, 0, RMA_STAGING_SLOTS, RMA_STAGING_BYTES) {
                Ok(s) => c.rma = Some(s),
                Err(e) => {
                    tracing::warn!("one-sided access off: staging registration failed: {e}");
                    c.caps.rma = false;
                }
            }
        }
        Ok(n)
    }

    /// Adds a receive slab of `slots` slots of `slot_bytes` and posts them
    /// all; returns its index.
    pub fn add_rx_slab(&mut self, slots: usize, slot_bytes: usize) -> Result<usize> {
        let index = self.rx.len();
        let slab = self.core.slab(KIND_RECV, index, slots, slot_bytes)?;
        self.rx.push(slab);
        for i in 0..slots {
            self.post_recv(index, i)?;
        }
        Ok(index)
    }

    /// Posts receive slot `slot` of slab `slab` (again).
    pub fn post_recv(&mut self, slab: usize, slot: usize) -> Result<()> {
        let deadline = Instant::now() + Duration::from_secs(1);
        loop {
            let s = &mut self.rx[slab];
            let len = s.slot_bytes;
            let desc = s.desc;
            let buf = s.slot_mut(slot).as_mut_ptr();
            let ctx: *mut OpCtx = &mut s.ctxs[slot];
            // SAFETY: the slot and its context belong to this Node, do not
            // move, and outlive the endpoint (closed first in Drop).
            let ret = unsafe {
                sys::fi_recv(self.core.ep, buf.cast(), len, desc, ADDR_UNSPEC, ctx.cast())
            };
            if ret == -(sys::FI_EAGAIN as isize) && Instant::now() < deadline {
                self.core.progress()?;
                continue;
            }
            if ret < 0 {
                return Err(fail("fi_recv", ret as i64));
            }
            return Ok(());
        }
    }
}

impl Core {
    fn open_objects(&mut self) -> Result<()> {
        // SAFETY: info is a valid fi_info; each out-pointer is written by
        // the call on success and closed in Drop (null ones are skipped).
        unsafe {
            let info = self.info.ptr;
            check(
                "fi_fabric",
                sys::fi_fabric((*info).fabric_attr, &mut self.fabric, ptr::null_mut()),
            )?;
            check(
                "fi_domain",
                sys::fi_domain(self.fabric, info, &mut self.domain, ptr::null_mut()),
            )?;
            let mut cq_attr = sys::fi_cq_attr {
                size: CQ_ENTRIES,
                format: sys::fi_cq_format_FI_CQ_FORMAT_MSG,
                wait_obj: sys::fi_wait_obj_FI_WAIT_FD,
                ..Default::default()
            };
            if sys::fi_cq_open(self.domain, &mut cq_attr, &mut self.cq, ptr::null_mut()) < 0 {
                // No wait object here: the idle loop sleeps in short steps.
                self.cq = ptr::null_mut();
                cq_attr.wait_obj = sys::fi_wait_obj_FI_WAIT_NONE;
                check(
                    "fi_cq_open",
                    sys::fi_cq_open(self.domain, &mut cq_attr, &mut self.cq, ptr::null_mut()),
                )?;
            } else {
                let mut fd: i32 = -1;
                let r = sys::fi_control(
                    &mut (*self.cq).fid,
                    sys::FI_GETWAIT as i32,
                    (&mut fd as *mut i32).cast(),
                );
                if r == 0 && fd >= 0 {
                    self.wait_fd = Some(fd);
                }
            }
            let mut av_attr = sys::fi_av_attr {
                type_: sys::fi_av_type_FI_AV_UNSPEC,
                count: 64,
                ..Default::default()
            };
            check(
                "fi_av_open",
                sys::fi_av_open(self.domain, &mut av_attr, &mut self.av, ptr::null_mut()),
            )?;
            check(
                "fi_endpoint",
                sys::fi_endpoint(self.domain, info, &mut self.ep, ptr::null_mut()),
            )?;
            check(
                "fi_ep_bind(cq)",
                sys::fi_ep_bind(
                    self.ep,
                    &mut (*self.cq).fid,
                    u64::from(sys::FI_TRANSMIT | sys::FI_RECV),
                ),
            )?;
            check(
                "fi_ep_bind(av)",
                sys::fi_ep_bind(self.ep, &mut (*self.av).fid, 0),
            )?;
            check("fi_enable", sys::fi_enable(self.ep))?;
            let mut buf = [0u8; NAME_BYTES_MAX];
            let mut len = buf.len();
            check(
                "fi_getname",
                sys::fi_getname(&mut (*self.ep).fid, buf.as_mut_ptr().cast(), &mut len),
            )?;
            self.name = buf[..len.min(NAME_BYTES_MAX)].to_vec();
        }
        Ok(())
    }

    fn register(&mut self, mem: &mut [u8], access: u64) -> Result<(*mut sys::fid_mr, u64)> {
        let mut mr: *mut sys::fid_mr = ptr::null_mut();
        let key = self.next_key;
        self.next_key += 1;
        // SAFETY: mem is valid for its length; the registration is closed
        // (in Drop) before mem is freed.
        let ret = unsafe {
            sys::fi_mr_reg(
                self.domain,
                mem.as_mut_ptr().cast(),
                mem.len(),
                access,
                0,
                key,
                0,
                &mut mr,
                ptr::null_mut(),
            )
        };
        check("fi_mr_reg", ret)?;
        // SAFETY: mr is a live registration.
        let key = unsafe { sys::fi_mr_key(mr) };
        Ok((mr, key))
    }

    fn slab(&mut self, kind: u64, index: usize, slots: usize, slot_bytes: usize) -> Result<Slab> {
        let mut mem = vec![0u8; slots * slot_bytes].into_boxed_slice();
        let access = u64::from(sys::FI_SEND | sys::FI_RECV | sys::FI_READ | sys::FI_WRITE);
        let (mr, _) = self.register(&mut mem, access)?;
        // SAFETY: mr is a live registration.
        let desc = unsafe { sys::fi_mr_desc(mr) };
        let ctxs = (0..slots)
            .map(|i| OpCtx {
                fi: sys::fi_context2::default(),
                tag: tag(kind, index, i),
            })
            .collect();
        Ok(Slab {
            mem,
            slot_bytes,
            mr,
            desc,
            ctxs,
        })
    }

    /// Inserts a peer's name into the address vector.
    pub fn insert(&mut self, name: &[u8]) -> Result<u64> {
        let mut addr: u64 = ADDR_UNSPEC;
        // SAFETY: name is a valid buffer of a peer's fi_getname output.
        let ret = unsafe {
            sys::fi_av_insert(
                self.av,
                name.as_ptr().cast(),
                1,
                &mut addr,
                0,
                ptr::null_mut(),
            )
        };
        if ret != 1 {
            return Err(fail("fi_av_insert", if ret < 0 { ret.into() } else { -22 }));
        }
        Ok(addr)
    }

    /// Removes a peer from the address vector.
    pub fn remove(&mut self, addr: u64) {
        let mut a = addr;
        // SAFETY: a is an address this AV returned.
        let _ = unsafe { sys::fi_av_remove(self.av, &mut a, 1, 0) };
    }

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
                if let Some(err) = err {
                    let dest = self.tx_dest[slot];
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
    pub fn register_region(&mut self, len: usize) -> Result<(u64, u64)> {
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
        Ok((addr, key))
    }

    /// The bytes of a region this node registered.
    pub fn region_mut(&mut self, addr: u64, key: u64) -> Option<&mut [u8]> {
        self.regions
            .iter_mut()
            .find(|r| r.key == key && r.addr == addr)
            .map(|r| &mut r.mem[..])
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

/// Largest packet sent with `fi_inject` from a stack buffer, in bytes.
const INJECT_STACK_BYTES: usize = 4096;

impl Drop for Node {
    fn drop(&mut self) {
        let c = &mut self.core;
        // SAFETY: each object is closed once, endpoint first so that no
        // operation still references memory or contexts freed after it;
        // null handles (never opened) are skipped.
        unsafe {
            if !c.ep.is_null() {
                sys::fi_close(&mut (*c.ep).fid);
            }
            let mrs = self
                .rx
                .iter()
                .map(|s| s.mr)
                .chain(std::iter::once(c.tx.mr))
                .chain(c.rma.iter().map(|s| s.mr))
                .chain(c.regions.iter().map(|r| r.mr))
                .collect::<Vec<_>>();
            for mr in mrs {
                if !mr.is_null() {
                    sys::fi_close(&mut (*mr).fid);
                }
            }
            if !c.av.is_null() {
                sys::fi_close(&mut (*c.av).fid);
            }
            if !c.cq.is_null() {
                sys::fi_close(&mut (*c.cq).fid);
            }
            if !c.domain.is_null() {
                sys::fi_close(&mut (*c.domain).fid);
            }
            if !c.fabric.is_null() {
                sys::fi_close(&mut (*c.fabric).fid);
            }
        }
    }
}
