//! A safe wrapper over the few libfabric objects FabricKV uses: one RDM
//! endpoint with its fabric, domain, completion queue and address vector
//! ([`Node`]), and the registered memory it sends from, receives into and
//! exposes for one-sided access ([`Slab`], [`Region`]).
//!
//! Every call into `sys` lives in this module: this file (objects, their
//! opening and closing), `info` (choosing the provider), `datapath`
//! (sends, completions, waiting: the hot path) and `rma` (registered
//! regions and one-sided transfers). The rules that make the rest
//! of the crate safe:
//! - all memory handed to the provider (receive slots, send slots, RMA
//!   staging, exposed regions) and every operation context is owned by the
//!   [`Node`] that posted it, never moves (boxed slices) and is freed only
//!   after the endpoint is closed (see `Drop for Node`);
//! - operations are posted by slot index, so a caller cannot hand the
//!   provider a buffer that dies before the operation completes;
//! - a [`Node`] is used by one thread at a time (`FI_THREAD_DOMAIN`).

mod datapath;
mod info;
mod rma;

pub use info::Caps;
use info::{choose, Info};

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
    /// Where each busy send slot is going (`ADDR_UNSPEC` when idle), to
    /// name the peer on failure and to keep a peer with sends in flight in
    /// the address vector.
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

    /// Removes a peer from the address vector. The caller makes sure no
    /// send to it is outstanding ([`Core::sending_to`]): the `shm`
    /// provider unmaps the peer's region here, and an outstanding send's
    /// completion would then lock memory that is gone (SIGSEGV in
    /// `pthread_spin_trylock`; `cli --test fabric_shm`).
    pub fn remove(&mut self, addr: u64) {
        let mut a = addr;
        // SAFETY: a is an address this AV returned.
        let _ = unsafe { sys::fi_av_remove(self.av, &mut a, 1, 0) };
    }
}

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
