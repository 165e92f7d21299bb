//! The C structures applications see — `struct rdma_cm_id`, `struct rdma_event_channel` —
//! owned by their Rust objects at stable addresses, with safe accessors. The application
//! reads (and may write) these structs at any time, so they are only ever accessed through
//! raw pointers, field by field. FFI surface.

use std::net::SocketAddr;
use std::ptr;

use crate::abi;
use crate::sys;
use crate::verbs::{Ctx, Qp};

/// A heap `struct rdma_cm_id`, freed when dropped.
pub struct CId(*mut abi::rdma_cm_id);

// SAFETY: the struct is plain data shared with the application, which also uses it from
// any thread; every access is a single-field raw read or write.
unsafe impl Send for CId {}
// SAFETY: as above.
unsafe impl Sync for CId {}

macro_rules! field {
    ($s:expr, $f:ident) => {
        ptr::addr_of_mut!((*$s.0).$f)
    };
}

impl CId {
    pub fn new(
        channel: *mut abi::rdma_event_channel,
        context: usize,
        ps: u32,
        qp_type: u32,
    ) -> CId {
        let b = Box::new(abi::rdma_cm_id {
            channel,
            context: context as *mut libc::c_void,
            ps,
            qp_type,
            ..Default::default()
        });
        CId(Box::into_raw(b))
    }

    pub fn ptr(&self) -> *mut abi::rdma_cm_id {
        self.0
    }

    pub fn set_channel(&self, c: *mut abi::rdma_event_channel) {
        // SAFETY: self.0 is live until Drop; single-field write.
        unsafe { field!(self, channel).write_volatile(c) }
    }
    pub fn context(&self) -> usize {
        // SAFETY: as above; single-field read.
        unsafe { field!(self, context).read_volatile() as usize }
    }
    pub fn set_device(&self, ctx: Option<Ctx>, pd: usize, port: u8) {
        // SAFETY: as above.
        unsafe {
            field!(self, verbs).write_volatile(ctx.map_or(ptr::null_mut(), |c| c.ptr()));
            if field!(self, pd).read_volatile().is_null() {
                field!(self, pd).write_volatile(pd as *mut abi::ibv_pd);
            }
            field!(self, port_num).write_volatile(port);
        }
    }
    pub fn qp(&self) -> Option<Qp> {
        // SAFETY: as above.
        Qp::new(unsafe { field!(self, qp).read_volatile() })
    }
    pub fn ps(&self) -> u32 {
        // SAFETY: as above.
        unsafe { field!(self, ps).read_volatile() }
    }
    pub fn qp_type(&self) -> u32 {
        // SAFETY: as above.
        unsafe { field!(self, qp_type).read_volatile() }
    }
    /// `id->event` (sync ids: the last event of a synchronous call).
    pub fn event(&self) -> usize {
        // SAFETY: as above.
        unsafe { field!(self, event).read_volatile() as usize }
    }
    pub fn set_event(&self, e: usize) {
        // SAFETY: as above.
        unsafe { field!(self, event).write_volatile(e as *mut abi::rdma_cm_event) }
    }
    /// Copy what the system librdmacm set in its id `sys` (a forwarded id) into ours.
    ///
    /// # Safety
    /// `sys` must be a live rdma_cm_id of the system library.
    pub unsafe fn mirror_from(&self, sys: *const abi::rdma_cm_id) {
        // SAFETY: the caller guarantees sys; ours is live.
        unsafe {
            let s = &*sys;
            field!(self, verbs).write_volatile(s.verbs);
            field!(self, qp).write_volatile(s.qp);
            ptr::addr_of_mut!((*self.0).route).write_volatile(s.route);
            field!(self, port_num).write_volatile(s.port_num);
            field!(self, send_cq_channel).write_volatile(s.send_cq_channel);
            field!(self, send_cq).write_volatile(s.send_cq);
            field!(self, recv_cq_channel).write_volatile(s.recv_cq_channel);
            field!(self, recv_cq).write_volatile(s.recv_cq);
            field!(self, srq).write_volatile(s.srq);
            field!(self, pd).write_volatile(s.pd);
        }
    }
    fn route_addr(&self) -> *mut abi::rdma_addr {
        // SAFETY: address computation inside the live struct.
        unsafe { ptr::addr_of_mut!((*self.0).route.addr) }
    }
    /// Store `a` in route.addr.src_addr (None clears it).
    pub fn set_src(&self, a: Option<SocketAddr>) {
        // SAFETY: src_storage is a sockaddr_storage inside the live struct.
        unsafe {
            write_storage(
                ptr::addr_of_mut!((*self.route_addr()).__bindgen_anon_1)
                    as *mut libc::sockaddr_storage,
                a,
            )
        }
    }
    pub fn set_dst(&self, a: Option<SocketAddr>) {
        // SAFETY: dst_storage is a sockaddr_storage inside the live struct.
        unsafe {
            write_storage(
                ptr::addr_of_mut!((*self.route_addr()).__bindgen_anon_2)
                    as *mut libc::sockaddr_storage,
                a,
            )
        }
    }
    pub fn src(&self) -> Option<SocketAddr> {
        // SAFETY: as in set_src.
        unsafe {
            read_storage(ptr::addr_of!((*self.route_addr()).__bindgen_anon_1)
                as *const libc::sockaddr_storage)
        }
    }
    pub fn dst(&self) -> Option<SocketAddr> {
        // SAFETY: as in set_dst.
        unsafe {
            read_storage(ptr::addr_of!((*self.route_addr()).__bindgen_anon_2)
                as *const libc::sockaddr_storage)
        }
    }
}

/// # Safety
/// `p` must point to a writable sockaddr_storage.
unsafe fn write_storage(p: *mut libc::sockaddr_storage, a: Option<SocketAddr>) {
    let v = match a {
        Some(a) => sys::to_storage(&a).0,
        // SAFETY: all-zero is a valid (AF_UNSPEC) sockaddr_storage.
        None => unsafe { std::mem::zeroed() },
    };
    // SAFETY: the caller guarantees p.
    unsafe { p.write_unaligned(v) }
}

/// # Safety
/// `p` must point to a readable sockaddr_storage.
unsafe fn read_storage(p: *const libc::sockaddr_storage) -> Option<SocketAddr> {
    // SAFETY: the caller guarantees p.
    let v = unsafe { p.read_unaligned() };
    sys::from_storage(&v)
}

impl Drop for CId {
    fn drop(&mut self) {
        // SAFETY: allocated by Box::into_raw in new, freed once.
        drop(unsafe { Box::from_raw(self.0) });
    }
}

/// A heap `struct rdma_event_channel` ({ int fd }), freed when dropped.
pub struct CChan(*mut abi::rdma_event_channel);

// SAFETY: plain data; the fd field is written once at creation.
unsafe impl Send for CChan {}
// SAFETY: as above.
unsafe impl Sync for CChan {}

impl CChan {
    pub fn new(fd: i32) -> CChan {
        CChan(Box::into_raw(Box::new(abi::rdma_event_channel { fd })))
    }
    pub fn ptr(&self) -> *mut abi::rdma_event_channel {
        self.0
    }
}

impl Drop for CChan {
    fn drop(&mut self) {
        // SAFETY: allocated by Box::into_raw in new, freed once.
        drop(unsafe { Box::from_raw(self.0) });
    }
}

/// A copy of an `ibv_qp_init_attr` (rdma_create_ep's, for the QPs of rdma_get_request).
#[derive(Clone, Copy)]
pub struct QpInitAttr(pub abi::ibv_qp_init_attr);
// SAFETY: only copied and handed back to libibverbs on the application's thread; the CQ/SRQ
// pointers in it belong to the application, which keeps them alive (rdma_cm's contract).
unsafe impl Send for QpInitAttr {}
