//! The exported connection-management interface for the librdmacm drop-in:
//! `provider/include/uiw_cm.h` (versions 1 and 2). The logic is `crate::engine::cm` and the QP's
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
use crate::engine::cm::{CmConn, CmEvent, CmListen, CmStatus};

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
    start_handle(cb, user, |c| start(sock, c))
}

/// A new connection handle reporting to `cb`/`user`, given out only if `start` succeeds;
/// otherwise errno is set and NULL returned.
fn start_handle(cb: UiwCmCb, user: *mut c_void, start: impl FnOnce(&Arc<CmConn>) -> Result<(), i32>) -> *mut c_void {
    let slot = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let c = CmConn::new(callback(cb, user, slot.clone()));
    let h = into_handle(c.clone(), &slot);
    match start(&c) {
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

// ---- version 2: listen and connect through the device's transport ----

/// `uiw_cm_incoming_cb`.
pub type UiwCmIncomingCb = unsafe extern "C" fn(
    user: *mut c_void,
    conn: *mut c_void,
    local: *const libc::sockaddr,
    remote: *const libc::sockaddr,
    cb: *mut Option<UiwCmCb>,
    conn_user: *mut *mut c_void,
) -> c_int;

/// An IPv4 address from a `struct sockaddr` of `len` bytes (IPv4-mapped IPv6 included).
///
/// # Safety
/// `sa` is null or points at `len` readable bytes.
unsafe fn sockaddr_v4(sa: *const libc::sockaddr, len: libc::socklen_t) -> Option<std::net::SocketAddrV4> {
    if sa.is_null() || (len as usize) < core::mem::size_of::<libc::sa_family_t>() {
        return None;
    }
    match c_int::from((*sa).sa_family) {
        libc::AF_INET if len as usize >= core::mem::size_of::<libc::sockaddr_in>() => {
            let sin = &*(sa as *const libc::sockaddr_in);
            Some(std::net::SocketAddrV4::new(sin.sin_addr.s_addr.to_ne_bytes().into(), u16::from_be(sin.sin_port)))
        }
        libc::AF_INET6 if len as usize >= core::mem::size_of::<libc::sockaddr_in6>() => {
            let sin6 = &*(sa as *const libc::sockaddr_in6);
            let ip = std::net::Ipv6Addr::from(sin6.sin6_addr.s6_addr).to_ipv4_mapped()?;
            Some(std::net::SocketAddrV4::new(ip, u16::from_be(sin6.sin6_port)))
        }
        _ => None,
    }
}

/// A `sockaddr_in` for an address (IPv4 only: the raw transports are IPv4).
fn sockaddr_in(a: std::net::SocketAddr) -> libc::sockaddr_in {
    let (ip, port) = match a {
        std::net::SocketAddr::V4(v4) => (*v4.ip(), v4.port()),
        std::net::SocketAddr::V6(v6) => (v6.ip().to_ipv4_mapped().unwrap_or(std::net::Ipv4Addr::UNSPECIFIED), v6.port()),
    };
    libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: port.to_be(),
        sin_addr: libc::in_addr { s_addr: u32::from_ne_bytes(ip.octets()) },
        sin_zero: [0; 8],
    }
}

/// `uiw_cm_transport_v2`: 1 when rdma_cm must listen and connect through the engine
/// (`uiw_cm_listen_v2` / `uiw_cm_connect_v2`), 0 when it hands the engine kernel sockets.
#[no_mangle]
pub unsafe extern "C" fn uiw_cm_transport_v2(ctx: *mut ibv_context) -> c_int {
    guard(-1, || {
        if ctx.is_null() {
            set_errno(libc::EINVAL);
            return -1;
        }
        // SAFETY: ctx is one of our contexts.
        c_int::from(unsafe { engine(ctx) }.cm_in_engine())
    })
}

/// A listener handle: the transport and the listener's id in it.
struct ListenHandle {
    net: Arc<crate::engine::net::Net>,
    id: u64,
}

/// `uiw_cm_listen_v2`.
#[no_mangle]
pub unsafe extern "C" fn uiw_cm_listen_v2(
    ctx: *mut ibv_context,
    addr: *const libc::sockaddr,
    len: libc::socklen_t,
    incoming: Option<UiwCmIncomingCb>,
    user: *mut c_void,
) -> *mut c_void {
    guard(ptr::null_mut(), || {
        // SAFETY: addr points at len bytes (uiw_cm.h).
        let (Some(incoming), Some(at), false) = (incoming, unsafe { sockaddr_v4(addr, len) }, ctx.is_null()) else {
            set_errno(libc::EINVAL);
            return ptr::null_mut();
        };
        let user = user as usize;
        let on_incoming = move |local: std::net::SocketAddr, remote: std::net::SocketAddr| -> Option<Arc<CmConn>> {
            let slot = Arc::new(std::sync::atomic::AtomicUsize::new(0));
            let target: Arc<std::sync::OnceLock<(UiwCmCb, usize)>> = Arc::new(std::sync::OnceLock::new());
            let t = target.clone();
            let c = CmConn::new(callback_late(t, slot.clone()));
            let h = into_handle(c.clone(), &slot);
            let (l, r) = (sockaddr_in(local), sockaddr_in(remote));
            let mut cb: Option<UiwCmCb> = None;
            let mut conn_user: *mut c_void = ptr::null_mut();
            // SAFETY: the drop-in's callback with its user pointer, our new handle (its to
            // release once it takes it), addresses and out-pointers valid during the call.
            let r = unsafe {
                incoming(user as *mut c_void, h, &l as *const _ as *const libc::sockaddr, &r as *const _ as *const libc::sockaddr, &mut cb, &mut conn_user)
            };
            match (r, cb) {
                (0, Some(cb)) => {
                    let _ = target.set((cb, conn_user as usize));
                    Some(c)
                }
                _ => {
                    // Refused: the handle was not taken.
                    // SAFETY: h was made by into_handle above and the drop-in did not keep it.
                    drop(unsafe { Box::from_raw(h as *mut Arc<CmConn>) });
                    None
                }
            }
        };
        // SAFETY: ctx is one of our contexts.
        match unsafe { engine(ctx) }.cm_listen(at, CmListen::new(Box::new(on_incoming))) {
            Ok((net, id)) => Box::into_raw(Box::new(ListenHandle { net, id })) as *mut c_void,
            Err(e) => {
                set_errno(e.errno());
                ptr::null_mut()
            }
        }
    })
}

/// `uiw_cm_unlisten_v2`.
#[no_mangle]
pub unsafe extern "C" fn uiw_cm_unlisten_v2(l: *mut c_void) {
    guard((), || {
        if l.is_null() {
            return;
        }
        // SAFETY: l is a live listener handle, closed exactly once (uiw_cm.h).
        let h = unsafe { Box::from_raw(l as *mut ListenHandle) };
        h.net.cm_unlisten(h.id);
    })
}

/// [`callback`] for a connection whose C callback is known only once the drop-in took it
/// (set before any event can be reported).
fn callback_late(target: Arc<std::sync::OnceLock<(UiwCmCb, usize)>>, conn: Arc<std::sync::atomic::AtomicUsize>) -> crate::engine::cm::CmCallback {
    Box::new(move |ev: &CmEvent<'_>| {
        if let Some(&(cb, user)) = target.get() {
            callback(cb, user as *mut c_void, conn.clone())(ev);
        }
    })
}

/// `uiw_cm_connect_v2`.
#[no_mangle]
pub unsafe extern "C" fn uiw_cm_connect_v2(
    qp: *mut ibv_qp,
    dst: *const libc::sockaddr,
    dst_len: libc::socklen_t,
    pd: *const c_void,
    len: u16,
    ird: u16,
    ord: u16,
    cb: Option<UiwCmCb>,
    user: *mut c_void,
    local: *mut libc::sockaddr_storage,
) -> *mut c_void {
    guard(ptr::null_mut(), || {
        // SAFETY: dst points at dst_len bytes (uiw_cm.h).
        let (Some(cb), Some(to), false) = (cb, unsafe { sockaddr_v4(dst, dst_len) }, qp.is_null()) else {
            set_errno(libc::EINVAL);
            return ptr::null_mut();
        };
        start_handle(cb, user, |c| {
            // SAFETY: qp is one of our QPs; pd the caller's bytes.
            let (q, data) = unsafe { (qp_obj(qp), bytes(pd, len)) };
            let a = q.cm_connect_to(c, to, data, ird, ord).map_err(|e| e.errno())?;
            if let (Some(a), false) = (a, local.is_null()) {
                // SAFETY: local points at a writable sockaddr_storage, larger than and
                // aligned for a sockaddr_in.
                unsafe { ptr::write(local as *mut libc::sockaddr_in, sockaddr_in(a)) };
            }
            Ok(())
        })
    })
}
