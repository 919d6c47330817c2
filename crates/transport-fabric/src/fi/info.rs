//! Choosing a provider: what FabricKV asks of `fi_getinfo` (an RDM
//! endpoint with messages, and RMA where the provider has it) and what
//! it learns from the answer ([`Caps`]).

use super::*;

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
pub(super) struct Info {
    pub(super) ptr: *mut sys::fi_info,
}

impl Drop for Info {
    fn drop(&mut self) {
        // SAFETY: ptr came from fi_getinfo and is freed once.
        unsafe { sys::fi_freeinfo(self.ptr) }
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

    pub(super) fn caps(&self) -> Caps {
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
pub(super) fn choose(provider: &str, node: Option<&str>) -> Result<Info> {
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
