//! The exported connection-management interface for the librdmacm drop-in:
//! `provider/include/uiw_cm.h` (version 1). The logic is `crate::engine::cm` and the QP's
//! `cm_*` methods; this is only the C surface.

use core::ffi::{c_int, c_void};
use core::ptr;
use std::net::TcpStream;
use std::os::fd::FromRawFd;
use std::sync::Arc;

use uiw_kabi::verbs::{ibv_context, ibv_qp};

use super::qp::qp_obj;
use super::{engine, guard, set_errno};
use super::errno::Errno;
use crate::engine::cm::{CmConn, CmEvent, CmStatus};

/// `struct uiw_cm_event`.
#[repr(C)]
pub struct UiwCmEvent {
    pub kind: c_int,
    pub status: c_int,
    pub private_data: *const c_void,
    pub private_data_len: u16,
    pub ird: u16,
    pub ord: u16,
}

/// `uiw_cm_cb`.
pub type UiwCmCb = unsafe extern "C" fn(user: *mut c_void, conn: *mut c_void, ev: *const UiwCmEvent);

/// The engine callback that calls the drop-in's C callback. `conn` is filled in once the
/// handle exists (events cannot come before the handle is returned: the stream is handed to
/// the progress thread after).
fn callback(cb: UiwCmCb, user: *mut c_void, conn: Arc<std::sync::atomic::AtomicUsize>) -> crate::engine::cm::CmCallback {
    let user = user as usize;
    Box::new(move |ev: &CmEvent<'_>| {
        let e = UiwCmEvent {
            kind: ev.kind as c_int,
            status: ev.status.errno(),
            private_data: ev.private_data.as_ptr() as *const c_void,
            private_data_len: ev.private_data.len().min(u16::MAX as usize) as u16,
            ird: ev.ird,
            ord: ev.ord,
        };
        let c = conn.load(std::sync::atomic::Ordering::Acquire) as *mut c_void;
        // SAFETY: the drop-in's callback with its own user pointer, our handle and an event
        // valid for the duration of the call (uiw_cm.h).
        unsafe { cb(user as *mut c_void, c, &e) };
    })
}

/// # Safety
/// `p` is a handle from `uiw_cm_passive_v1` / `uiw_cm_active_v1` not yet released.
unsafe fn conn<'a>(p: *mut c_void) -> &'a Arc<CmConn> {
    &*(p as *const Arc<CmConn>)
}

fn into_handle(c: Arc<CmConn>, slot: &std::sync::atomic::AtomicUsize) -> *mut c_void {
    let h = Box::into_raw(Box::new(c)) as *mut c_void;
    slot.store(h as usize, std::sync::atomic::Ordering::Release);
    h
}

/// # Safety
/// `data` points at `len` readable bytes (or `len` is 0).
unsafe fn bytes<'a>(data: *const c_void, len: u16) -> &'a [u8] {
    if data.is_null() || len == 0 {
        &[]
    } else {
        core::slice::from_raw_parts(data as *const u8, len as usize)
    }
}

/// The common part of `uiw_cm_passive_v1` / `uiw_cm_active_v1`: takes ownership of `fd`,
/// makes the connection and its handle, and runs `start` with them; on failure the handle is
/// dropped (no callback can have run: the stream reaches the progress thread in `start`) and
/// NULL + errno is returned.
fn open(fd: c_int, cb: Option<UiwCmCb>, user: *mut c_void, valid: bool, start: impl FnOnce(TcpStream, &Arc<CmConn>) -> Result<(), i32>) -> *mut c_void {
    if fd < 0 {
        set_errno(libc::EBADF);
        return ptr::null_mut();
    }
    // SAFETY: the caller hands us ownership of fd (uiw_cm.h), also on failure.
    let sock = unsafe { TcpStream::from_raw_fd(fd) };
    let (Some(cb), true) = (cb, valid) else {
        set_errno(libc::EINVAL);
        return ptr::null_mut();
    };
    let slot = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let c = CmConn::new(callback(cb, user, slot.clone()));
    let h = into_handle(c.clone(), &slot);
    match start(sock, &c) {
        Ok(()) => h,
        Err(e) => {
            // SAFETY: h was just made by into_handle and not given out.
            drop(unsafe { Box::from_raw(h as *mut Arc<CmConn>) });
            set_errno(e);
            ptr::null_mut()
        }
    }
}

/// `uiw_cm_passive_v1`.
#[no_mangle]
pub unsafe extern "C" fn uiw_cm_passive_v1(ctx: *mut ibv_context, fd: c_int, cb: Option<UiwCmCb>, user: *mut c_void) -> *mut c_void {
    guard(ptr::null_mut(), || {
        open(fd, cb, user, !ctx.is_null(), |sock, c| {
            // SAFETY: ctx is one of our contexts (the drop-in only passes uiw devices').
            unsafe { engine(ctx) }.cm_passive(sock, c.clone()).map_err(|e| e.errno())
        })
    })
}

/// `uiw_cm_accept_v1`.
#[no_mangle]
pub unsafe extern "C" fn uiw_cm_accept_v1(h: *mut c_void, qp: *mut ibv_qp, pd: *const c_void, len: u16, ird: u16, ord: u16) -> c_int {
    guard(libc::EFAULT, || {
        if h.is_null() || qp.is_null() {
            return libc::EINVAL;
        }
        // SAFETY: h is a live handle, qp one of our QPs, pd the caller's bytes.
        let (c, q, data) = unsafe { (conn(h), qp_obj(qp), bytes(pd, len)) };
        match q.cm_accept(c, data, ird, ord) {
            Ok(()) => 0,
            Err(e) => e.errno(),
        }
    })
}

/// `uiw_cm_reject_v1`.
#[no_mangle]
pub unsafe extern "C" fn uiw_cm_reject_v1(h: *mut c_void, pd: *const c_void, len: u16) -> c_int {
    guard(libc::EFAULT, || {
        if h.is_null() {
            return libc::EINVAL;
        }
        // SAFETY: h is a live handle; pd the caller's bytes.
        let (c, data) = unsafe { (conn(h), bytes(pd, len)) };
        let Some(p) = c.pending.lock().take() else { return libc::EINVAL };
        p.reject(data);
        0
    })
}

/// `uiw_cm_active_v1`.
#[no_mangle]
pub unsafe extern "C" fn uiw_cm_active_v1(
    qp: *mut ibv_qp,
    fd: c_int,
    pd: *const c_void,
    len: u16,
    ird: u16,
    ord: u16,
    cb: Option<UiwCmCb>,
    user: *mut c_void,
) -> *mut c_void {
    guard(ptr::null_mut(), || {
        open(fd, cb, user, !qp.is_null(), |sock, c| {
            // SAFETY: qp is one of our QPs; pd the caller's bytes.
            let (q, data) = unsafe { (qp_obj(qp), bytes(pd, len)) };
            q.cm_connect(c, sock, data, ird, ord).map_err(|e| e.errno())
        })
    })
}

/// `uiw_cm_disconnect_v1`.
#[no_mangle]
pub unsafe extern "C" fn uiw_cm_disconnect_v1(h: *mut c_void) -> c_int {
    guard(libc::EFAULT, || {
        if h.is_null() {
            return libc::EINVAL;
        }
        // SAFETY: h is a live handle.
        let c = unsafe { conn(h) };
        if let Some(p) = c.pending.lock().take() {
            p.reject(&[]);
        }
        let qp = c.qp();
        match qp {
            Some(q) => q.cm_disconnect(),
            None => c.ended(CmStatus::Ok),
        }
        0
    })
}

/// `uiw_cm_release_v1`.
#[no_mangle]
pub unsafe extern "C" fn uiw_cm_release_v1(h: *mut c_void) {
    guard((), || {
        if h.is_null() {
            return;
        }
        // SAFETY: h is a live handle, released exactly once (uiw_cm.h).
        let c = unsafe { Box::from_raw(h as *mut Arc<CmConn>) };
        c.release();
    })
}
