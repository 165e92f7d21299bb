//! Safe handles over the libibverbs objects the connection manager uses: opened device
//! contexts (kept open for the life of the process, as librdmacm does) and QPs. FFI
//! surface: every `unsafe` block has a `// SAFETY:` line.

use std::ffi::{CStr, CString};
use std::io;
use std::ptr::NonNull;

use crate::abi;

/// An opened device context. Contexts are opened once and never closed, so the pointer
/// stays valid for the life of the process.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Ctx(NonNull<abi::ibv_context>);

// SAFETY: an ibv_context is used from any thread by libibverbs' design; ours is never freed.
unsafe impl Send for Ctx {}
// SAFETY: as above.
unsafe impl Sync for Ctx {}

impl Ctx {
    pub fn ptr(self) -> *mut abi::ibv_context {
        self.0.as_ptr()
    }

    /// The shared object implementing this context's provider (dladdr of its post_send).
    pub fn provider_path(self) -> Option<String> {
        // SAFETY: the context is valid (see the type); the helper only reads ctx->ops.
        let f = unsafe { abi::uiw_rdmacm_post_send_fn(self.ptr()) };
        if f.is_null() {
            return None;
        }
        // SAFETY: all-zero Dl_info is valid; dladdr fills it.
        let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
        // SAFETY: f is a code address; info is writable.
        if unsafe { libc::dladdr(f as *const libc::c_void, &mut info) } == 0
            || info.dli_fname.is_null()
        {
            return None;
        }
        // SAFETY: dladdr returned a NUL-terminated path owned by the loader.
        Some(
            unsafe { CStr::from_ptr(info.dli_fname) }
                .to_string_lossy()
                .into_owned(),
        )
    }

    /// (phys_port_cnt, max_qp_rd_atom, max_qp_init_rd_atom)
    pub fn limits(self) -> io::Result<(u8, i32, i32)> {
        let mut a = abi::ibv_device_attr::default();
        // SAFETY: valid context, writable attr.
        let r = unsafe { abi::ibv_query_device(self.ptr(), &mut a) };
        if r != 0 {
            return Err(io::Error::from_raw_os_error(r));
        }
        Ok((a.phys_port_cnt, a.max_qp_rd_atom, a.max_qp_init_rd_atom))
    }

    /// The GID table of `port`.
    pub fn gids(self, port: u8) -> Vec<[u8; 16]> {
        let mut pa = abi::ibv_port_attr::default();
        // SAFETY: valid context, writable attr.
        if unsafe { abi::uiw_rdmacm_query_port(self.ptr(), port, &mut pa) } != 0 {
            return Vec::new();
        }
        let mut out = Vec::new();
        for i in 0..pa.gid_tbl_len.clamp(0, 256) {
            let mut g = abi::ibv_gid::default();
            // SAFETY: valid context, writable gid.
            if unsafe { abi::ibv_query_gid(self.ptr(), port, i, &mut g) } == 0 {
                // SAFETY: every bit pattern of the union is a valid [u8; 16].
                out.push(unsafe { g.raw });
            }
        }
        out
    }
}

/// Open every device whose name `want` accepts; the others are left alone.
pub fn open_devices(want: impl Fn(&str) -> bool) -> Vec<(Ctx, String)> {
    let mut n: i32 = 0;
    // SAFETY: n is writable; the list is freed below.
    let list = unsafe { abi::ibv_get_device_list(&mut n) };
    if list.is_null() {
        return Vec::new();
    }
    let mut out = Vec::new();
    for i in 0..n.max(0) as usize {
        // SAFETY: the list has n entries.
        let dev = unsafe { *list.add(i) };
        if dev.is_null() {
            continue;
        }
        // SAFETY: dev is a device from the list; its name is NUL-terminated.
        let name_p = unsafe { abi::ibv_get_device_name(dev) };
        if name_p.is_null() {
            continue;
        }
        // SAFETY: as above.
        let name = unsafe { CStr::from_ptr(name_p) }
            .to_string_lossy()
            .into_owned();
        if !want(&name) {
            continue;
        }
        // SAFETY: dev is valid until the list is freed; the context outlives it.
        if let Some(ctx) = NonNull::new(unsafe { abi::ibv_open_device(dev) }) {
            out.push((Ctx(ctx), name));
        }
    }
    // SAFETY: list came from ibv_get_device_list; opened contexts stay valid.
    unsafe { abi::ibv_free_device_list(list) };
    out
}

/// A QP the application created (through rdma_create_qp or itself).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Qp(NonNull<abi::ibv_qp>);

// SAFETY: QPs are thread-safe libibverbs objects; the application keeps this one alive
// while its rdma_cm_id uses it (rdma_cm's contract).
unsafe impl Send for Qp {}
// SAFETY: as above.
unsafe impl Sync for Qp {}

impl Qp {
    pub fn new(p: *mut abi::ibv_qp) -> Option<Qp> {
        NonNull::new(p).map(Qp)
    }
    pub fn ptr(self) -> *mut abi::ibv_qp {
        self.0.as_ptr()
    }
    pub fn context(self) -> *mut abi::ibv_context {
        // SAFETY: a live QP (see the type).
        unsafe { (*self.ptr()).context }
    }
    pub fn qp_type(self) -> u32 {
        // SAFETY: a live QP.
        unsafe { (*self.ptr()).qp_type }
    }

    fn modify(self, attr: &mut abi::ibv_qp_attr, mask: u32) -> io::Result<()> {
        // SAFETY: a live QP and a valid attr.
        let r = unsafe { abi::ibv_modify_qp(self.ptr(), attr, mask as i32) };
        if r == 0 {
            Ok(())
        } else {
            Err(io::Error::from_raw_os_error(if r < 0 { -r } else { r }))
        }
    }

    /// RESET → INIT as the kernel's rdma_cm does for an iWARP connection (plus local write,
    /// which iWARP QPs do not check but a verbs provider may).
    pub fn modify_init(self, port: u8) -> io::Result<()> {
        let mut a = init_attr(port);
        self.modify(&mut a, init_mask())
    }

    pub fn modify_err(self) -> io::Result<()> {
        let mut a = abi::ibv_qp_attr {
            qp_state: abi::ibv_qp_state::IBV_QPS_ERR,
            ..Default::default()
        };
        self.modify(&mut a, abi::ibv_qp_attr_mask::IBV_QP_STATE)
    }
}

/// The INIT attributes of an rdma_cm iWARP QP (rdma_init_qp_attr reports the same).
///
/// The kernel's iw_cm grants remote Write and Read (`iw_cm_init_qp_init_attr`): no kernel
/// iWARP device has atomics. uiw serves RFC 7306 atomics, so its QPs also get
/// `REMOTE_ATOMIC`, as the InfiniBand CM grants it with Read (`cm_init_qp_init_attr`);
/// without it qperf's `rc_*_mr`/`ver_rc_*` tests over rdma_cm draw a Terminate. Each
/// region still needs `IBV_ACCESS_REMOTE_ATOMIC` of its own.
pub fn init_attr(port: u8) -> abi::ibv_qp_attr {
    abi::ibv_qp_attr {
        qp_state: abi::ibv_qp_state::IBV_QPS_INIT,
        qp_access_flags: abi::ibv_access_flags::IBV_ACCESS_LOCAL_WRITE
            | abi::ibv_access_flags::IBV_ACCESS_REMOTE_WRITE
            | abi::ibv_access_flags::IBV_ACCESS_REMOTE_READ
            | abi::ibv_access_flags::IBV_ACCESS_REMOTE_ATOMIC,
        pkey_index: 0,
        port_num: port,
        ..Default::default()
    }
}

pub fn init_mask() -> u32 {
    use abi::ibv_qp_attr_mask::*;
    IBV_QP_STATE | IBV_QP_ACCESS_FLAGS | IBV_QP_PKEY_INDEX | IBV_QP_PORT
}

/// `dlopen(path, RTLD_NOW | RTLD_NOLOAD)`: the handle of an already loaded object.
pub fn dl_noload(path: &str) -> Option<usize> {
    let c = CString::new(path).ok()?;
    // SAFETY: valid NUL-terminated path; NOLOAD never loads anything new.
    let h = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_NOLOAD) };
    (!h.is_null()).then_some(h as usize)
}

/// `dlsym(handle, name)` as an address.
pub fn dl_sym(handle: usize, name: &str) -> Option<usize> {
    let c = CString::new(name).ok()?;
    // SAFETY: handle came from dlopen and is never closed.
    let p = unsafe { libc::dlsym(handle as *mut libc::c_void, c.as_ptr()) };
    (!p.is_null()).then_some(p as usize)
}

impl Ctx {
    /// A protection domain for ids on this device (`rdma_cm_id.pd` before the application
    /// picks its own), as librdmacm allocates one per device. 0 on failure.
    pub fn alloc_pd(self) -> usize {
        // SAFETY: valid context; the PD is never freed (it lives as long as the context).
        unsafe { abi::ibv_alloc_pd(self.ptr()) as usize }
    }
}

/// The load address of the shared object holding code address `addr` (dladdr's dli_fbase).
pub fn dl_base(addr: usize) -> Option<usize> {
    // SAFETY: all-zero Dl_info is valid; dladdr only reads the loader's tables.
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    // SAFETY: any address may be asked about; info is writable.
    (unsafe { libc::dladdr(addr as *const libc::c_void, &mut info) } != 0)
        .then_some(info.dli_fbase as usize)
}

/// The device name of a context someone else opened (the system librdmacm's).
pub fn ctx_device_name(ctx: *mut abi::ibv_context) -> Option<String> {
    if ctx.is_null() {
        return None;
    }
    // SAFETY: a live context from the system library's device list.
    let dev = unsafe { (*ctx).device };
    if dev.is_null() {
        return None;
    }
    // SAFETY: a live device; its name is NUL-terminated.
    let p = unsafe { abi::ibv_get_device_name(dev) };
    // SAFETY: as above.
    (!p.is_null()).then(|| unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
}
