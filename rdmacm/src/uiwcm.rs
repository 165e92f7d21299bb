//! The provider's connection-management interface (provider/include/uiw_cm.h, version 1):
//! found with dlsym in the provider that libibverbs loaded for a device, called through
//! safe wrappers. MPA runs in the provider; this side only hands it TCP streams and turns
//! its callbacks into rdma_cm events (cm::on_provider_event). FFI surface.

use std::collections::HashMap;
use std::ffi::c_void;
use std::io;
use std::os::fd::OwnedFd;
use std::sync::{Arc, Mutex, OnceLock};

use crate::abi;
use crate::cm;
use crate::sys;
use crate::verbs::{self, Ctx, Qp};

#[repr(C)]
pub struct RawConn {
    _opaque: [u8; 0],
}

#[repr(C)]
struct RawEvent {
    kind: i32,
    status: i32,
    private_data: *const c_void,
    private_data_len: u16,
    ird: u16,
    ord: u16,
}

type Cb = extern "C" fn(*mut c_void, *mut RawConn, *const RawEvent);
type PassiveFn = unsafe extern "C" fn(*mut abi::ibv_context, i32, Cb, *mut c_void) -> *mut RawConn;
type AcceptFn =
    unsafe extern "C" fn(*mut RawConn, *mut abi::ibv_qp, *const c_void, u16, u16, u16) -> i32;
type RejectFn = unsafe extern "C" fn(*mut RawConn, *const c_void, u16) -> i32;
type ActiveFn = unsafe extern "C" fn(
    *mut abi::ibv_qp,
    i32,
    *const c_void,
    u16,
    u16,
    u16,
    Cb,
    *mut c_void,
) -> *mut RawConn;
type DisconnectFn = unsafe extern "C" fn(*mut RawConn) -> i32;
type ReleaseFn = unsafe extern "C" fn(*mut RawConn);
type TransportFn = unsafe extern "C" fn(*mut abi::ibv_context) -> i32;
type IncomingCb = extern "C" fn(
    *mut c_void,
    *mut RawConn,
    *const libc::sockaddr,
    *const libc::sockaddr,
    *mut Option<Cb>,
    *mut *mut c_void,
) -> i32;
type ListenFn = unsafe extern "C" fn(
    *mut abi::ibv_context,
    *const libc::sockaddr,
    libc::socklen_t,
    IncomingCb,
    *mut c_void,
) -> *mut c_void;
type UnlistenFn = unsafe extern "C" fn(*mut c_void);
type ConnectFn = unsafe extern "C" fn(
    *mut abi::ibv_qp,
    *const libc::sockaddr,
    libc::socklen_t,
    *const c_void,
    u16,
    u16,
    u16,
    Cb,
    *mut c_void,
    *mut libc::sockaddr_storage,
) -> *mut RawConn;

/// uiw_cm.h v2: listen and connect through the device's transport (a provider without
/// them serves kernel-TCP devices only, through v1).
struct V2 {
    transport: TransportFn,
    listen: ListenFn,
    unlisten: UnlistenFn,
    connect: ConnectFn,
}

/// The provider's uiw_cm_*_v1 entry points.
pub struct Api {
    passive: PassiveFn,
    accept: AcceptFn,
    reject: RejectFn,
    active: ActiveFn,
    disconnect: DisconnectFn,
    release: ReleaseFn,
    v2: Option<V2>,
}

/// Event types of uiw_cm.h.
pub const CONNECT_REQUEST: i32 = 1;
pub const ESTABLISHED: i32 = 2;
pub const REJECTED: i32 = 3;
pub const CONNECT_ERROR: i32 = 4;
pub const DISCONNECTED: i32 = 5;

/// A provider callback, copied out of the callback's arguments.
#[derive(Debug, Clone)]
pub struct Event {
    pub kind: i32,
    pub status: i32,
    pub private: Vec<u8>,
    pub ird: u16,
    pub ord: u16,
}

impl Api {
    /// The interface of the provider behind `ctx`, or the reason there is none.
    pub fn for_ctx(ctx: Ctx) -> Result<&'static Api, String> {
        static CACHE: OnceLock<Mutex<HashMap<String, Result<&'static Api, String>>>> =
            OnceLock::new();
        let path = ctx
            .provider_path()
            .ok_or("cannot find the provider's shared object (dladdr)")?;
        let mut c = CACHE
            .get_or_init(Default::default)
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        c.entry(path.clone())
            .or_insert_with(|| Api::load(&path))
            .clone()
    }

    fn load(path: &str) -> Result<&'static Api, String> {
        let h = verbs::dl_noload(path).ok_or_else(|| format!("{path} is not loaded"))?;
        let sym = |n: &str| {
            verbs::dl_sym(h, n)
                .ok_or_else(|| format!("{path} has no {n} (a provider without uiw_cm.h v1)"))
        };
        let (p, a, r, ac, d, rel) = (
            sym("uiw_cm_passive_v1")?,
            sym("uiw_cm_accept_v1")?,
            sym("uiw_cm_reject_v1")?,
            sym("uiw_cm_active_v1")?,
            sym("uiw_cm_disconnect_v1")?,
            sym("uiw_cm_release_v1")?,
        );
        let v2 = match (
            sym("uiw_cm_transport_v2"),
            sym("uiw_cm_listen_v2"),
            sym("uiw_cm_unlisten_v2"),
            sym("uiw_cm_connect_v2"),
        ) {
            // SAFETY: the symbols are the uiw_cm.h v2 functions, whose C signatures the
            // function pointer types above spell out.
            (Ok(t), Ok(l), Ok(u), Ok(c)) => Some(unsafe {
                V2 {
                    transport: std::mem::transmute::<usize, TransportFn>(t),
                    listen: std::mem::transmute::<usize, ListenFn>(l),
                    unlisten: std::mem::transmute::<usize, UnlistenFn>(u),
                    connect: std::mem::transmute::<usize, ConnectFn>(c),
                }
            }),
            _ => None,
        };
        // SAFETY: the symbols are the uiw_cm.h v1 functions, whose C signatures the
        // function pointer types above spell out.
        let api = unsafe {
            Api {
                passive: std::mem::transmute::<usize, PassiveFn>(p),
                accept: std::mem::transmute::<usize, AcceptFn>(a),
                reject: std::mem::transmute::<usize, RejectFn>(r),
                active: std::mem::transmute::<usize, ActiveFn>(ac),
                disconnect: std::mem::transmute::<usize, DisconnectFn>(d),
                release: std::mem::transmute::<usize, ReleaseFn>(rel),
                v2,
            }
        };
        Ok(Box::leak(Box::new(api)))
    }

    /// uiw_cm_passive_v1: the provider takes `fd` and reports to `target`.
    pub fn passive(
        &'static self,
        ctx: Ctx,
        fd: OwnedFd,
        target: &Arc<cm::Target>,
    ) -> io::Result<Conn> {
        let raw = sys::into_raw(fd);
        let user = Arc::as_ptr(target) as *mut c_void;
        // SAFETY: ctx is a live context; the provider owns raw from now on; user stays valid
        // until release (Target releases its Conn before it is freed).
        let c = unsafe { (self.passive)(ctx.ptr(), raw, trampoline, user) };
        Conn::new(self, c)
    }

    /// uiw_cm_active_v1.
    pub fn active(
        &'static self,
        qp: Qp,
        fd: OwnedFd,
        pdata: &[u8],
        ird: u16,
        ord: u16,
        target: &Arc<cm::Target>,
    ) -> io::Result<Conn> {
        let raw = sys::into_raw(fd);
        let user = Arc::as_ptr(target) as *mut c_void;
        let len = pdata.len().min(u16::MAX as usize) as u16;
        // SAFETY: as in passive; pdata is readable for len bytes during the call.
        let c = unsafe {
            (self.active)(
                qp.ptr(),
                raw,
                pdata.as_ptr() as *const c_void,
                len,
                ird,
                ord,
                trampoline,
                user,
            )
        };
        Conn::new(self, c)
    }
}

impl Api {
    /// Whether rdma_cm must listen and connect through the provider for this device
    /// (`uiw_cm_transport_v2`: a userspace transport on raw frames), not with kernel sockets.
    pub fn in_engine(&'static self, ctx: Ctx) -> bool {
        match &self.v2 {
            // SAFETY: ctx is a live context of this provider.
            Some(v2) => (unsafe { (v2.transport)(ctx.ptr()) }) == 1,
            None => false,
        }
    }

    /// uiw_cm_listen_v2 on `at`: every connection accepted goes to `target`'s
    /// `cm::on_incoming`, until the returned listener is dropped.
    pub fn listen(&'static self, ctx: Ctx, at: &std::net::SocketAddr, target: std::sync::Weak<cm::Id>) -> io::Result<Listener> {
        let v2 = self.v2.as_ref().ok_or_else(|| io::Error::from_raw_os_error(libc::ENOSYS))?;
        let (ss, len) = sys::to_storage(at);
        let user = Box::into_raw(Box::new(target));
        // SAFETY: ctx is live; ss is a sockaddr of len bytes; user stays valid until the
        // listener is closed (Listener::drop frees it after uiw_cm_unlisten_v2).
        let l = unsafe {
            (v2.listen)(
                ctx.ptr(),
                &ss as *const _ as *const libc::sockaddr,
                len,
                incoming,
                user as *mut c_void,
            )
        };
        if l.is_null() {
            let e = sys::errno();
            // SAFETY: the provider refused: it keeps no copy of user.
            drop(unsafe { Box::from_raw(user) });
            return Err(io::Error::from_raw_os_error(if e == 0 { libc::EIO } else { e }));
        }
        Ok(Listener { unlisten: v2.unlisten, raw: l, user })
    }

    /// uiw_cm_connect_v2: the stream to `dst` opened through the QP's device's transport;
    /// also returns the stream's local address.
    #[allow(clippy::too_many_arguments)]
    pub fn connect(
        &'static self,
        qp: Qp,
        dst: &std::net::SocketAddr,
        pdata: &[u8],
        ird: u16,
        ord: u16,
        target: &Arc<cm::Target>,
    ) -> io::Result<(Conn, Option<std::net::SocketAddr>)> {
        let v2 = self.v2.as_ref().ok_or_else(|| io::Error::from_raw_os_error(libc::ENOSYS))?;
        let (ss, len) = sys::to_storage(dst);
        let user = Arc::as_ptr(target) as *mut c_void;
        let plen = pdata.len().min(u16::MAX as usize) as u16;
        // SAFETY: all-zero sockaddr_storage is valid.
        let mut local: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
        // SAFETY: as in active; ss is a sockaddr of len bytes, local a writable storage.
        let c = unsafe {
            (v2.connect)(
                qp.ptr(),
                &ss as *const _ as *const libc::sockaddr,
                len,
                pdata.as_ptr() as *const c_void,
                plen,
                ird,
                ord,
                trampoline,
                user,
                &mut local,
            )
        };
        let c = Conn::new(self, c)?;
        Ok((c, sys::from_storage(&local)))
    }
}

/// A provider listener (uiw_cm_listen_v2), closed when dropped.
pub struct Listener {
    unlisten: UnlistenFn,
    raw: *mut c_void,
    user: *mut std::sync::Weak<cm::Id>,
}

// SAFETY: uiw_cm.h functions may be called from any thread; the handle and the user box are
// only freed by our Drop.
unsafe impl Send for Listener {}
// SAFETY: as above.
unsafe impl Sync for Listener {}

impl Drop for Listener {
    fn drop(&mut self) {
        // SAFETY: a live listener, closed once; after it returns no incoming callback runs,
        // so the user box can go.
        unsafe {
            (self.unlisten)(self.raw);
            drop(Box::from_raw(self.user));
        }
    }
}

/// The provider's incoming-connection callback (uiw_cm_incoming_cb): the listener's id
/// makes a Target for the connection and takes it.
extern "C" fn incoming(
    user: *mut c_void,
    conn: *mut RawConn,
    local: *const libc::sockaddr,
    remote: *const libc::sockaddr,
    cb: *mut Option<Cb>,
    conn_user: *mut *mut c_void,
) -> i32 {
    if user.is_null() || conn.is_null() || local.is_null() || remote.is_null() || cb.is_null() || conn_user.is_null() {
        return -1;
    }
    // SAFETY: user is the Weak<Id> box of a listener that is still open (freed only after
    // uiw_cm_unlisten_v2, after which no callback runs).
    let id = unsafe { &*(user as *const std::sync::Weak<cm::Id>) };
    // SAFETY: the provider passes sockaddr_in addresses valid during the call.
    let (l, r) = unsafe {
        (
            addr_of(local as *const libc::sockaddr_in),
            addr_of(remote as *const libc::sockaddr_in),
        )
    };
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let lid = id.upgrade()?;
        lid.on_incoming(l, r, |api| Conn { api, raw: conn })
    }));
    match r {
        Ok(Some(t)) => {
            // SAFETY: cb and conn_user are writable out-pointers (uiw_cm.h).
            unsafe {
                *cb = Some(trampoline);
                *conn_user = t as *mut c_void;
            }
            0
        }
        _ => -1,
    }
}

/// # Safety
/// `sin` points at a readable sockaddr_in.
unsafe fn addr_of(sin: *const libc::sockaddr_in) -> std::net::SocketAddr {
    // SAFETY: the caller's promise.
    let sin = unsafe { &*sin };
    std::net::SocketAddr::V4(std::net::SocketAddrV4::new(
        std::net::Ipv4Addr::from(sin.sin_addr.s_addr.to_ne_bytes()),
        u16::from_be(sin.sin_port),
    ))
}

/// One provider connection; released (no callback after) when dropped.
pub struct Conn {
    api: &'static Api,
    raw: *mut RawConn,
}

// SAFETY: uiw_cm.h functions may be called from any thread; the handle is only freed by
// our Drop.
unsafe impl Send for Conn {}
// SAFETY: as above.
unsafe impl Sync for Conn {}

fn errno_result(r: i32) -> io::Result<()> {
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::from_raw_os_error(r.abs()))
    }
}

impl Conn {
    fn new(api: &'static Api, raw: *mut RawConn) -> io::Result<Conn> {
        if raw.is_null() {
            let e = sys::errno();
            return Err(io::Error::from_raw_os_error(if e == 0 {
                libc::EIO
            } else {
                e
            }));
        }
        Ok(Conn { api, raw })
    }

    pub fn accept(&self, qp: Qp, pdata: &[u8], ird: u16, ord: u16) -> io::Result<()> {
        // SAFETY: a live connection; pdata readable during the call.
        errno_result(unsafe {
            (self.api.accept)(
                self.raw,
                qp.ptr(),
                pdata.as_ptr() as *const c_void,
                pdata.len() as u16,
                ird,
                ord,
            )
        })
    }

    pub fn reject(&self, pdata: &[u8]) -> io::Result<()> {
        // SAFETY: a live connection; pdata readable during the call.
        errno_result(unsafe {
            (self.api.reject)(
                self.raw,
                pdata.as_ptr() as *const c_void,
                pdata.len() as u16,
            )
        })
    }

    pub fn disconnect(&self) -> io::Result<()> {
        // SAFETY: a live connection.
        errno_result(unsafe { (self.api.disconnect)(self.raw) })
    }
}

impl Drop for Conn {
    fn drop(&mut self) {
        // SAFETY: a live connection, released exactly once.
        unsafe { (self.api.release)(self.raw) }
    }
}

extern "C" fn trampoline(user: *mut c_void, _conn: *mut RawConn, ev: *const RawEvent) {
    if user.is_null() || ev.is_null() {
        return;
    }
    // SAFETY: the provider passes the event for the duration of the callback.
    let e = unsafe { &*ev };
    let private = if e.private_data.is_null() || e.private_data_len == 0 {
        Vec::new()
    } else {
        // SAFETY: private_data is readable for private_data_len bytes during the callback.
        unsafe {
            std::slice::from_raw_parts(e.private_data as *const u8, e.private_data_len as usize)
        }
        .to_vec()
    };
    let ev = Event {
        kind: e.kind,
        status: e.status,
        private,
        ird: e.ird,
        ord: e.ord,
    };
    // SAFETY: user is Arc::as_ptr of a Target that releases this connection (so that no
    // callback runs any more) before it is freed.
    let target = unsafe { &*(user as *const cm::Target) };
    // Never unwind into the provider.
    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        cm::on_provider_event(target, ev)
    }));
}
