//! The exported C API of librdmacm.so.1 (rdma_cma.h, rdma-core 44): argument checking,
//! C struct plumbing, sync-id handling and forwarding; the work is in cm.rs (uiw ids) and
//! fwd.rs (ids of other devices). Errors are `-1` with errno, as librdmacm returns them;
//! pointers that are not ours give EINVAL instead of a crash. FFI surface: each `unsafe`
//! block has a `// SAFETY:` line.
#![allow(clippy::missing_safety_doc)]

use std::collections::HashMap;
use std::ffi::{c_char, c_int, c_void};
use std::io;
use std::net::SocketAddr;
use std::ptr;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use crate::abi::{self, rdma_cm_event_type as ev};
use crate::cm::{self, Chan, Id, State};
use crate::fwd::{self, sysfn, SysId};
use crate::sys;
use crate::verbs::{self, Qp};

type Cid = *mut abi::rdma_cm_id;

fn fail(e: i32) -> c_int {
    sys::set_errno(e);
    -1
}

fn io_fail(e: io::Error) -> c_int {
    fail(e.raw_os_error().unwrap_or(libc::EIO))
}

/// Run `f`, turning a panic into EIO: nothing unwinds into the application.
fn guard(f: impl FnOnce() -> c_int) -> c_int {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).unwrap_or_else(|_| fail(libc::EIO))
}

fn lock<T>(m: &'static OnceLock<Mutex<T>>) -> MutexGuard<'static, T>
where
    T: Default,
{
    m.get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner())
}

fn id_of(p: Cid) -> Result<Arc<Id>, c_int> {
    cm::lookup(p as usize).ok_or_else(|| fail(libc::EINVAL))
}

/// A forwarded id's system id.
fn fwd_of(i: &Id) -> Option<SysId> {
    let st = i.st();
    (st.state == State::Forwarded).then_some(st.fwd).flatten()
}

/// Which implementation serves a call on an id: the one forward-or-handle decision of the
/// drop-in. An id is uiw's until an address shows it belongs to another device; from then
/// on (`State::Forwarded`) every call goes to the system librdmacm through its twin id.
#[derive(Clone, Copy)]
enum Backend {
    /// uiw serves it (cm.rs, the provider's uiw_cm interface).
    Uiw,
    /// The system library serves it, on this id's twin (fwd.rs); `fwd_ret` mirrors the
    /// twin's fields back into ours and keeps its errno.
    System(SysId),
}

impl Backend {
    fn of(i: &Id) -> Backend {
        fwd_of(i).map_or(Backend::Uiw, Backend::System)
    }
}

/// The prologue of every call on an existing id: no panic unwinds into the application, a
/// pointer that is not one of our ids is EINVAL, and `f` gets the id and its backend.
fn on_id(id: Cid, f: impl FnOnce(Arc<Id>, Backend) -> c_int) -> c_int {
    guard(|| match id_of(id) {
        Ok(i) => {
            let to = Backend::of(&i);
            f(i, to)
        }
        Err(r) => r,
    })
}

/// Result of a forwarded call: mirror the system id's fields, keep its errno.
fn fwd_ret(i: &Id, sid: SysId, r: Option<c_int>) -> c_int {
    let e = sys::errno();
    fwd::mirror(i, sid);
    match r {
        Some(v) => {
            sys::set_errno(e);
            v
        }
        None => fail(libc::ENOSYS),
    }
}

/// Put `i` behind a new system id and run `f` on it.
fn forward_now(i: &Arc<Id>, f: impl FnOnce(SysId) -> Option<c_int>) -> c_int {
    let sid = match fwd::attach(i) {
        Ok(s) => s,
        Err(e) => return io_fail(e),
    };
    {
        let mut st = i.st();
        st.state = State::Forwarded;
        st.fwd = Some(sid);
    }
    let r = f(sid);
    fwd_ret(i, sid, r)
}

/// A struct sockaddr the application passed (IPv4 or IPv6 only).
///
/// # Safety
/// `p` is null or points to a sockaddr of the size its family implies.
unsafe fn read_sockaddr(p: *const libc::sockaddr) -> Option<SocketAddr> {
    if p.is_null() {
        return None;
    }
    // SAFETY: the caller guarantees p; sa_family is the first field of every sockaddr.
    let fam = unsafe { (*p).sa_family } as c_int;
    // SAFETY: all-zero is a valid sockaddr_storage.
    let mut ss: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let n = match fam {
        libc::AF_INET => std::mem::size_of::<libc::sockaddr_in>(),
        libc::AF_INET6 => std::mem::size_of::<libc::sockaddr_in6>(),
        _ => return None,
    };
    // SAFETY: the family says p holds n bytes; ss has room for them.
    unsafe { ptr::copy_nonoverlapping(p as *const u8, &mut ss as *mut _ as *mut u8, n) };
    sys::from_storage(&ss)
}

// ---------------------------------------------------------------------------------------
// Events

/// What rdma_get_cm_event hands out: the C event, room for private data, and ours.
#[repr(C)]
struct CEvent {
    ev: abi::rdma_cm_event,
    pdata: [u8; 256],
    inner: Option<cm::Event>,
}

// SAFETY: the pointers in the C event name our ids and the event's own buffer (or a system
// event it owns); the application may use and acknowledge an event from any thread.
unsafe impl Send for CEvent {}

static EVENTS: OnceLock<Mutex<HashMap<usize, Box<CEvent>>>> = OnceLock::new();

/// Turn a queued event into the application's `struct rdma_cm_event`.
fn deliver(e: cm::Event) -> *mut abi::rdma_cm_event {
    let mut b = Box::new(CEvent {
        ev: abi::rdma_cm_event::default(),
        pdata: [0; 256],
        inner: None,
    });
    b.ev.id = e.id.c.ptr();
    b.ev.listen_id = e.listen.as_ref().map_or(ptr::null_mut(), |l| l.c.ptr());
    b.ev.event = e.kind;
    b.ev.status = e.status;
    if let Some(se) = &e.fwd {
        // SAFETY: a live system event (acked when `e` is dropped): its param union, private
        // data pointer included, stays valid as long as ours.
        b.ev.param = unsafe { (*se.0).param };
    } else {
        let n = e.private.len().min(255);
        b.pdata[..n].copy_from_slice(&e.private[..n]);
        let pd = if n > 0 {
            b.pdata.as_ptr() as *const c_void
        } else {
            ptr::null()
        };
        b.ev.param.conn = abi::rdma_conn_param {
            private_data: pd,
            private_data_len: n as u8,
            responder_resources: e.responder_resources,
            initiator_depth: e.initiator_depth,
            ..Default::default()
        };
        if e.kind == ev::RDMA_CM_EVENT_REJECTED {
            // librdmacm moves the QP to ERROR on REJECTED.
            if let Some(qp) = e.id.c.qp() {
                let _ = qp.modify_err();
            }
        }
    }
    e.counted().delivered();
    b.inner = Some(e);
    let p = &mut b.ev as *mut abi::rdma_cm_event;
    lock(&EVENTS).insert(p as usize, b);
    p
}

fn ack(p: *mut abi::rdma_cm_event) -> c_int {
    let Some(mut b) = lock(&EVENTS).remove(&(p as usize)) else {
        return fail(libc::EINVAL);
    };
    if let Some(e) = b.inner.take() {
        e.counted().acked_one();
        drop(e); // acks a forwarded system event too
    }
    0
}

/// What librdmacm's ucma_complete does for ids without a channel: wait for the event of
/// the call just made and turn its status into the call's result.
fn complete(i: &Arc<Id>) -> c_int {
    if !i.is_sync() {
        return 0;
    }
    let old = i.c.event();
    if old != 0 {
        ack(old as *mut abi::rdma_cm_event);
        i.c.set_event(0);
    }
    let e = match i.chan().q.pop() {
        Ok(e) => e,
        Err(e) => return io_fail(e),
    };
    let (kind, status) = (e.kind, e.status);
    let p = deliver(e);
    i.c.set_event(p as usize);
    if status != 0 {
        if kind == ev::RDMA_CM_EVENT_REJECTED {
            return fail(libc::ECONNREFUSED);
        }
        return fail(status.abs());
    }
    0
}

// ---------------------------------------------------------------------------------------
// Channels and ids

static OWNED_CHANS: OnceLock<Mutex<HashMap<usize, Arc<Chan>>>> = OnceLock::new();

pub extern "C" fn rdma_create_event_channel() -> *mut abi::rdma_event_channel {
    match Chan::new() {
        Ok(c) => {
            let p = c.c.ptr();
            lock(&OWNED_CHANS).insert(p as usize, c);
            p
        }
        Err(e) => {
            io_fail(e);
            ptr::null_mut()
        }
    }
}

pub extern "C" fn rdma_destroy_event_channel(channel: *mut abi::rdma_event_channel) {
    // Ids still on it keep the queue alive; the application's fd closes with the last one.
    lock(&OWNED_CHANS).remove(&(channel as usize));
}

fn create_id(
    channel: *mut abi::rdma_event_channel,
    context: *mut c_void,
    ps: u32,
    qp_type: u32,
) -> Result<Arc<Id>, c_int> {
    let (chan, sync) = if channel.is_null() {
        (Chan::new().map_err(io_fail)?, true)
    } else {
        (
            Chan::lookup(channel as usize).ok_or_else(|| fail(libc::EINVAL))?,
            false,
        )
    };
    Ok(Id::new(chan, sync, context as usize, ps, qp_type))
}

fn qp_type_for(ps: u32) -> u32 {
    use abi::rdma_port_space::*;
    if ps == RDMA_PS_UDP || ps == RDMA_PS_IPOIB {
        abi::ibv_qp_type::IBV_QPT_UD
    } else {
        abi::ibv_qp_type::IBV_QPT_RC
    }
}

pub unsafe extern "C" fn rdma_create_id(
    channel: *mut abi::rdma_event_channel,
    id: *mut Cid,
    context: *mut c_void,
    ps: u32,
) -> c_int {
    guard(|| {
        use abi::rdma_port_space::*;
        if id.is_null() || ![RDMA_PS_TCP, RDMA_PS_UDP, RDMA_PS_IB, RDMA_PS_IPOIB].contains(&ps) {
            return fail(libc::EINVAL);
        }
        match create_id(channel, context, ps, qp_type_for(ps)) {
            Ok(i) => {
                // SAFETY: checked non-null; the application's out pointer.
                unsafe { *id = i.c.ptr() };
                0
            }
            Err(r) => r,
        }
    })
}

pub unsafe extern "C" fn rdma_destroy_id(id: Cid) -> c_int {
    on_id(id, |i, _| {
        let e = i.c.event();
        if e != 0 {
            ack(e as *mut abi::rdma_cm_event);
            i.c.set_event(0);
        }
        let sid = i.st().fwd.take();
        i.destroy();
        if let Some(sid) = sid {
            // SAFETY: the live system id behind ours, destroyed once.
            unsafe { sysfn::rdma_destroy_id(sid.0) };
        }
        0
    })
}

pub unsafe extern "C" fn rdma_bind_addr(id: Cid, addr: *mut libc::sockaddr) -> c_int {
    on_id(id, |i, to| {
        // SAFETY: the application's sockaddr (rdma_bind_addr's contract).
        let Some(a) = (unsafe { read_sockaddr(addr) }) else {
            return fail(libc::EINVAL);
        };
        if let Backend::System(sid) = to {
            // SAFETY: live system id; the application's address.
            return fwd_ret(&i, sid, unsafe { sysfn::rdma_bind_addr(sid.0, addr) });
        }
        match i.bind(a) {
            Ok(true) => 0,
            // SAFETY: as above.
            Ok(false) => forward_now(&i, |sid| unsafe { sysfn::rdma_bind_addr(sid.0, addr) }),
            Err(e) => io_fail(e),
        }
    })
}

pub unsafe extern "C" fn rdma_resolve_addr(
    id: Cid,
    src_addr: *mut libc::sockaddr,
    dst_addr: *mut libc::sockaddr,
    timeout_ms: c_int,
) -> c_int {
    on_id(id, |i, to| {
        // SAFETY: the application's sockaddrs (rdma_resolve_addr's contract).
        let (src, dst) = unsafe { (read_sockaddr(src_addr), read_sockaddr(dst_addr)) };
        let Some(dst) = dst else {
            return fail(libc::EINVAL);
        };
        if !src_addr.is_null() && src.is_none() {
            return fail(libc::EINVAL);
        }
        let r = if let Backend::System(sid) = to {
            // SAFETY: live system id; the application's addresses.
            fwd_ret(&i, sid, unsafe {
                sysfn::rdma_resolve_addr(sid.0, src_addr, dst_addr, timeout_ms)
            })
        } else {
            match i.resolve_addr(src, dst) {
                Ok(true) => 0,
                // SAFETY: as above.
                Ok(false) => forward_now(&i, |sid| unsafe {
                    sysfn::rdma_resolve_addr(sid.0, src_addr, dst_addr, timeout_ms)
                }),
                Err(e) => io_fail(e),
            }
        };
        if r != 0 {
            return r;
        }
        complete(&i)
    })
}

pub unsafe extern "C" fn rdma_resolve_route(id: Cid, timeout_ms: c_int) -> c_int {
    on_id(id, |i, to| {
        let r = if let Backend::System(sid) = to {
            // SAFETY: live system id.
            fwd_ret(&i, sid, unsafe {
                sysfn::rdma_resolve_route(sid.0, timeout_ms)
            })
        } else {
            match i.resolve_route() {
                Ok(()) => 0,
                Err(e) => io_fail(e),
            }
        };
        if r != 0 {
            return r;
        }
        complete(&i)
    })
}

// ---------------------------------------------------------------------------------------
// QPs, CQs, SRQs

/// librdmacm's ucma_destroy_cqs.
///
/// # Safety
/// `id` is one of our live ids.
unsafe fn destroy_cqs(id: Cid) {
    // SAFETY: the caller guarantees id; the CQs and channels are the ones we created.
    unsafe {
        if (*id).qp_type == abi::ibv_qp_type::IBV_QPT_XRC_RECV && !(*id).srq.is_null() {
            return;
        }
        if !(*id).recv_cq.is_null() {
            abi::ibv_destroy_cq((*id).recv_cq);
            if !(*id).send_cq.is_null() && (*id).send_cq != (*id).recv_cq {
                abi::ibv_destroy_cq((*id).send_cq);
                (*id).send_cq = ptr::null_mut();
            }
            (*id).recv_cq = ptr::null_mut();
        }
        if !(*id).recv_cq_channel.is_null() {
            abi::ibv_destroy_comp_channel((*id).recv_cq_channel);
            if !(*id).send_cq_channel.is_null() && (*id).send_cq_channel != (*id).recv_cq_channel {
                abi::ibv_destroy_comp_channel((*id).send_cq_channel);
                (*id).send_cq_channel = ptr::null_mut();
            }
            (*id).recv_cq_channel = ptr::null_mut();
        }
    }
}

/// librdmacm's ucma_create_cqs: CQs (each with a completion channel) of these sizes.
///
/// # Safety
/// `id` is one of our live ids with a device.
unsafe fn create_cqs(id: Cid, send: u32, recv: u32) -> c_int {
    // SAFETY: the caller guarantees id and id->verbs.
    unsafe {
        let verbs = (*id).verbs;
        if recv != 0 {
            (*id).recv_cq_channel = abi::ibv_create_comp_channel(verbs);
            if !(*id).recv_cq_channel.is_null() {
                (*id).recv_cq = abi::ibv_create_cq(
                    verbs,
                    recv as c_int,
                    id as *mut c_void,
                    (*id).recv_cq_channel,
                    0,
                );
            }
            if (*id).recv_cq.is_null() {
                destroy_cqs(id);
                return -1;
            }
        }
        if send != 0 {
            (*id).send_cq_channel = abi::ibv_create_comp_channel(verbs);
            if !(*id).send_cq_channel.is_null() {
                (*id).send_cq = abi::ibv_create_cq(
                    verbs,
                    send as c_int,
                    id as *mut c_void,
                    (*id).send_cq_channel,
                    0,
                );
            }
            if (*id).send_cq.is_null() {
                destroy_cqs(id);
                return -1;
            }
        }
    }
    0
}

pub unsafe extern "C" fn rdma_create_qp_ex(id: Cid, attr: *mut abi::ibv_qp_init_attr_ex) -> c_int {
    on_id(id, |i, to| {
        if attr.is_null() {
            return fail(libc::EINVAL);
        }
        if let Backend::System(sid) = to {
            // SAFETY: live system id; the application's attributes.
            return fwd_ret(&i, sid, unsafe { sysfn::rdma_create_qp_ex(sid.0, attr) });
        }
        // SAFETY: id is ours and live (looked up); attr is the application's (non-null).
        unsafe { create_qp_ex(&i, id, &mut *attr) }
    })
}

/// librdmacm's rdma_create_qp_ex for a uiw id, QP to INIT as the kernel's ucma does.
///
/// # Safety
/// `id` is `i`'s C struct.
unsafe fn create_qp_ex(i: &Arc<Id>, id: Cid, a: &mut abi::ibv_qp_init_attr_ex) -> c_int {
    use abi::ibv_qp_init_attr_mask::IBV_QP_INIT_ATTR_PD;
    // SAFETY: the caller guarantees id; every access is a field of our struct or of the
    // application's objects it points to.
    unsafe {
        if !(*id).qp.is_null() || (*id).verbs.is_null() {
            return fail(libc::EINVAL);
        }
        if a.comp_mask & IBV_QP_INIT_ATTR_PD == 0 || a.pd.is_null() {
            a.comp_mask |= IBV_QP_INIT_ATTR_PD;
            a.pd = (*id).pd;
        } else if (*a.pd).context != (*id).verbs {
            return fail(libc::EINVAL);
        }
        if a.pd.is_null() {
            return fail(libc::EINVAL);
        }
        if (!(*id).recv_cq.is_null() && !a.recv_cq.is_null() && (*id).recv_cq != a.recv_cq)
            || (!(*id).send_cq.is_null() && !a.send_cq.is_null() && (*id).send_cq != a.send_cq)
        {
            return fail(libc::EINVAL);
        }
        let send = if !a.send_cq.is_null() || !(*id).send_cq.is_null() {
            0
        } else {
            a.cap.max_send_wr
        };
        let recv = if !a.recv_cq.is_null() || !(*id).recv_cq.is_null() {
            0
        } else {
            a.cap.max_recv_wr
        };
        if create_cqs(id, send, recv) != 0 {
            return -1;
        }
        if a.send_cq.is_null() {
            a.send_cq = (*id).send_cq;
        }
        if a.recv_cq.is_null() {
            a.recv_cq = (*id).recv_cq;
        }
        if !(*id).srq.is_null() && a.srq.is_null() {
            a.srq = (*id).srq;
        }
        let qp = abi::uiw_rdmacm_create_qp_ex((*id).verbs, a);
        let Some(q) = Qp::new(qp) else {
            let e = sys::errno();
            destroy_cqs(id);
            return fail(if e == 0 { libc::ENOMEM } else { e });
        };
        if q.qp_type() != abi::ibv_qp_type::IBV_QPT_UD {
            let port = if (*id).port_num == 0 {
                1
            } else {
                (*id).port_num
            };
            if let Err(e) = q.modify_init(port) {
                abi::ibv_destroy_qp(qp);
                destroy_cqs(id);
                return io_fail(e);
            }
        }
        (*id).pd = (*qp).pd;
        (*id).qp = qp;
    }
    let _ = i;
    0
}

pub unsafe extern "C" fn rdma_create_qp(
    id: Cid,
    pd: *mut abi::ibv_pd,
    qp_init_attr: *mut abi::ibv_qp_init_attr,
) -> c_int {
    guard(|| {
        if qp_init_attr.is_null() || cm::lookup(id as usize).is_none() {
            return fail(libc::EINVAL);
        }
        let mut ex = abi::ibv_qp_init_attr_ex::default();
        let n = std::mem::size_of::<abi::ibv_qp_init_attr>();
        // SAFETY: ibv_qp_init_attr is the prefix of ibv_qp_init_attr_ex (verbs.h), and
        // qp_init_attr is the application's, non-null.
        unsafe {
            ptr::copy_nonoverlapping(qp_init_attr as *const u8, &mut ex as *mut _ as *mut u8, n);
            ex.comp_mask = abi::ibv_qp_init_attr_mask::IBV_QP_INIT_ATTR_PD;
            ex.pd = if pd.is_null() { (*id).pd } else { pd };
            let r = rdma_create_qp_ex(id, &mut ex);
            ptr::copy_nonoverlapping(&ex as *const _ as *const u8, qp_init_attr as *mut u8, n);
            r
        }
    })
}

pub unsafe extern "C" fn rdma_destroy_qp(id: Cid) {
    guard(|| {
        let Ok(i) = cm::lookup(id as usize).ok_or(()) else {
            return 0;
        };
        if let Backend::System(sid) = Backend::of(&i) {
            // SAFETY: live system id.
            unsafe { sysfn::rdma_destroy_qp(sid.0) };
            fwd::mirror(&i, sid);
            return 0;
        }
        // SAFETY: our live id; its QP and CQs are the application's through us.
        unsafe {
            if !(*id).qp.is_null() {
                abi::ibv_destroy_qp((*id).qp);
            }
            (*id).qp = ptr::null_mut();
            destroy_cqs(id);
        }
        0
    });
}

pub unsafe extern "C" fn rdma_create_srq_ex(
    id: Cid,
    attr: *mut abi::ibv_srq_init_attr_ex,
) -> c_int {
    on_id(id, |i, to| {
        if attr.is_null() {
            return fail(libc::EINVAL);
        }
        if let Backend::System(sid) = to {
            // SAFETY: live system id; the application's attributes.
            return fwd_ret(&i, sid, unsafe { sysfn::rdma_create_srq_ex(sid.0, attr) });
        }
        use abi::ibv_srq_init_attr_mask::*;
        // SAFETY: our live id; attr is the application's, non-null.
        unsafe {
            let a = &mut *attr;
            if (*id).verbs.is_null() {
                return fail(libc::EINVAL);
            }
            if a.comp_mask & IBV_SRQ_INIT_ATTR_TYPE == 0 {
                a.comp_mask |= IBV_SRQ_INIT_ATTR_TYPE;
                a.srq_type = abi::ibv_srq_type::IBV_SRQT_BASIC;
            }
            if a.comp_mask & IBV_SRQ_INIT_ATTR_PD == 0 || a.pd.is_null() {
                a.pd = (*id).pd;
                a.comp_mask |= IBV_SRQ_INIT_ATTR_PD;
            }
            if a.srq_type != abi::ibv_srq_type::IBV_SRQT_BASIC {
                return fail(libc::EOPNOTSUPP); // no XRC on iWARP
            }
            if a.comp_mask & IBV_SRQ_INIT_ATTR_CQ == 0 || a.cq.is_null() {
                if create_cqs(id, 0, a.attr.max_wr) != 0 {
                    return -1;
                }
                a.cq = (*id).recv_cq;
                a.comp_mask |= IBV_SRQ_INIT_ATTR_CQ;
            }
            let srq = abi::uiw_rdmacm_create_srq_ex((*id).verbs, a);
            if srq.is_null() {
                let e = sys::errno();
                destroy_cqs(id);
                return fail(if e == 0 { libc::ENOMEM } else { e });
            }
            if (*id).pd.is_null() {
                (*id).pd = a.pd;
            }
            (*id).srq = srq;
        }
        0
    })
}

pub unsafe extern "C" fn rdma_create_srq(
    id: Cid,
    pd: *mut abi::ibv_pd,
    attr: *mut abi::ibv_srq_init_attr,
) -> c_int {
    guard(|| {
        if attr.is_null() {
            return fail(libc::EINVAL);
        }
        use abi::ibv_srq_init_attr_mask::*;
        // SAFETY: attr is the application's, non-null.
        unsafe {
            let mut ex = abi::ibv_srq_init_attr_ex {
                srq_context: (*attr).srq_context,
                attr: (*attr).attr,
                comp_mask: IBV_SRQ_INIT_ATTR_TYPE | IBV_SRQ_INIT_ATTR_PD,
                srq_type: abi::ibv_srq_type::IBV_SRQT_BASIC,
                pd,
                ..Default::default()
            };
            let r = rdma_create_srq_ex(id, &mut ex);
            (*attr).attr = ex.attr;
            r
        }
    })
}

pub unsafe extern "C" fn rdma_destroy_srq(id: Cid) {
    guard(|| {
        let Some(i) = cm::lookup(id as usize) else {
            return 0;
        };
        if let Backend::System(sid) = Backend::of(&i) {
            // SAFETY: live system id.
            unsafe { sysfn::rdma_destroy_srq(sid.0) };
            fwd::mirror(&i, sid);
            return 0;
        }
        // SAFETY: our live id.
        unsafe {
            if !(*id).srq.is_null() {
                abi::ibv_destroy_srq((*id).srq);
            }
            (*id).srq = ptr::null_mut();
            destroy_cqs(id);
        }
        0
    });
}

// ---------------------------------------------------------------------------------------
// Connections

/// The application's private data.
///
/// # Safety
/// `p` is null or readable for `len` bytes.
unsafe fn pdata<'a>(p: *const c_void, len: u8) -> &'a [u8] {
    if p.is_null() || len == 0 {
        &[]
    } else {
        // SAFETY: the caller guarantees p/len.
        unsafe { std::slice::from_raw_parts(p as *const u8, len as usize) }
    }
}

/// librdmacm's ucma_valid_param: depths above the device's limits are EINVAL (TCP only).
fn valid_param(i: &Id, param: Option<&abi::rdma_conn_param>, dev: &cm::Device) -> bool {
    if i.c.ps() != abi::rdma_port_space::RDMA_PS_TCP {
        return true;
    }
    match param {
        None => i.c.qp().is_some(),
        Some(p) => {
            (p.responder_resources == cm::MAX_DEPTH || p.responder_resources <= dev.max_ird)
                && (p.initiator_depth == cm::MAX_DEPTH || p.initiator_depth <= dev.max_ord)
        }
    }
}

pub unsafe extern "C" fn rdma_connect(id: Cid, conn_param: *mut abi::rdma_conn_param) -> c_int {
    on_id(id, |i, to| {
        if let Backend::System(sid) = to {
            // SAFETY: live system id; the application's parameters.
            let r = fwd_ret(&i, sid, unsafe { sysfn::rdma_connect(sid.0, conn_param) });
            return if r != 0 { r } else { complete(&i) };
        }
        // SAFETY: null or the application's parameters.
        let param = unsafe { conn_param.as_ref() };
        let Some(dev) = i.st().dev.clone() else {
            return fail(libc::EINVAL);
        };
        if !valid_param(&i, param, &dev) {
            return fail(libc::EINVAL);
        }
        // The initiator's ORD (initiator_depth) and IRD (responder_resources).
        let ord = cm::pick_depth(
            param.map(|p| p.initiator_depth),
            dev.max_ord,
            dev.max_ord,
            false,
        )
        .unwrap_or(dev.max_ord);
        let ird = cm::pick_depth(
            param.map(|p| p.responder_resources),
            dev.max_ird,
            dev.max_ird,
            false,
        )
        .unwrap_or(dev.max_ird);
        let mut data = std::mem::take(&mut i.st().connect_pdata);
        if let Some(p) = param {
            // SAFETY: the application's private data (rdma_conn_param's contract).
            data.extend_from_slice(unsafe { pdata(p.private_data, p.private_data_len) });
        }
        if let Err(e) = i.connect(data, ird, ord) {
            return io_fail(e);
        }
        complete(&i)
    })
}

pub unsafe extern "C" fn rdma_listen(id: Cid, backlog: c_int) -> c_int {
    on_id(id, |i, to| {
        if let Backend::System(sid) = to {
            // SAFETY: live system id.
            return fwd_ret(&i, sid, unsafe { sysfn::rdma_listen(sid.0, backlog) });
        }
        match i.listen(backlog) {
            Ok(()) => 0,
            Err(e) => io_fail(e),
        }
    })
}

pub unsafe extern "C" fn rdma_get_request(listen: Cid, id: *mut Cid) -> c_int {
    guard(|| {
        let l = match id_of(listen) {
            Ok(i) => i,
            Err(r) => return r,
        };
        if id.is_null() || !l.is_sync() {
            return fail(libc::EINVAL);
        }
        let old = l.c.event();
        if old != 0 {
            ack(old as *mut abi::rdma_cm_event);
            l.c.set_event(0);
        }
        let e = match l.chan().q.pop() {
            Ok(e) => e,
            Err(e) => return io_fail(e),
        };
        let (kind, status, nid) = (e.kind, e.status, e.id.clone());
        let qp_init = l.st().qp_init;
        let p = deliver(e);
        let bad = if kind == ev::RDMA_CM_EVENT_REJECTED {
            Some(libc::ECONNREFUSED)
        } else if status != 0 {
            Some(status.abs())
        } else if kind != ev::RDMA_CM_EVENT_CONNECT_REQUEST {
            Some(libc::EINVAL)
        } else {
            None
        };
        if let Some(err) = bad {
            l.c.set_event(p as usize);
            return fail(err);
        }
        if let Some(mut attr) = qp_init {
            // SAFETY: the new id is ours; listen->pd is what librdmacm passes.
            let r = unsafe { rdma_create_qp(nid.c.ptr(), (*listen).pd, &mut attr.0) };
            if r != 0 {
                let e = sys::errno();
                l.c.set_event(p as usize);
                return fail(e);
            }
        }
        nid.c.set_event(p as usize);
        // SAFETY: checked non-null; the application's out pointer.
        unsafe { *id = nid.c.ptr() };
        0
    })
}

pub unsafe extern "C" fn rdma_accept(id: Cid, conn_param: *mut abi::rdma_conn_param) -> c_int {
    on_id(id, |i, to| {
        if let Backend::System(sid) = to {
            // SAFETY: live system id; the application's parameters.
            let r = fwd_ret(&i, sid, unsafe { sysfn::rdma_accept(sid.0, conn_param) });
            return if r != 0 { r } else { complete(&i) };
        }
        // SAFETY: null or the application's parameters.
        let param = unsafe { conn_param.as_ref() };
        let (dev, peer_ird, peer_ord) = {
            let st = i.st();
            (st.dev.clone(), st.peer_ird, st.peer_ord)
        };
        let Some(dev) = dev else {
            return fail(libc::EINVAL);
        };
        if !valid_param(&i, param, &dev) {
            return fail(libc::EINVAL);
        }
        // Our ORD defaults to what the initiator can take (its IRD), our IRD to its ORD.
        let ord = cm::pick_depth(
            param.map(|p| p.initiator_depth),
            peer_ird,
            dev.max_ord,
            false,
        )
        .unwrap_or(0);
        let ird = cm::pick_depth(
            param.map(|p| p.responder_resources),
            peer_ord,
            dev.max_ird,
            false,
        )
        .unwrap_or(0);
        // SAFETY: the application's private data.
        let data = param
            .map(|p| unsafe { pdata(p.private_data, p.private_data_len) })
            .unwrap_or(&[]);
        if let Err(e) = i.accept(data, ird, ord) {
            if let Some(qp) = i.c.qp() {
                let _ = qp.modify_err();
            }
            return io_fail(e);
        }
        complete(&i)
    })
}

pub unsafe extern "C" fn rdma_reject(
    id: Cid,
    private_data: *const c_void,
    private_data_len: u8,
) -> c_int {
    on_id(id, |i, to| {
        if let Backend::System(sid) = to {
            // SAFETY: live system id; the application's private data.
            return fwd_ret(&i, sid, unsafe {
                sysfn::rdma_reject(sid.0, private_data, private_data_len)
            });
        }
        // SAFETY: the application's private data.
        match i.reject(unsafe { pdata(private_data, private_data_len) }) {
            Ok(()) => 0,
            Err(e) => io_fail(e),
        }
    })
}

pub unsafe extern "C" fn rdma_reject_ece(
    id: Cid,
    private_data: *const c_void,
    private_data_len: u8,
) -> c_int {
    if let Some(i) = cm::lookup(id as usize) {
        if let Backend::System(sid) = Backend::of(&i) {
            // SAFETY: live system id; the application's private data.
            return fwd_ret(&i, sid, unsafe {
                sysfn::rdma_reject_ece(sid.0, private_data, private_data_len)
            });
        }
    }
    // SAFETY: same contract as rdma_reject.
    unsafe { rdma_reject(id, private_data, private_data_len) }
}

pub unsafe extern "C" fn rdma_notify(id: Cid, event: u32) -> c_int {
    on_id(id, |i, to| {
        if let Backend::System(sid) = to {
            // SAFETY: live system id.
            return fwd_ret(&i, sid, unsafe { sysfn::rdma_notify(sid.0, event) });
        }
        0 // iWARP connections are established by MPA, not by a first completion
    })
}

pub unsafe extern "C" fn rdma_disconnect(id: Cid) -> c_int {
    on_id(id, |i, to| {
        if let Backend::System(sid) = to {
            // SAFETY: live system id.
            let r = fwd_ret(&i, sid, unsafe { sysfn::rdma_disconnect(sid.0) });
            return if r != 0 { r } else { complete(&i) };
        }
        match i.disconnect() {
            Ok(()) => complete(&i),
            Err(e) => io_fail(e),
        }
    })
}

pub unsafe extern "C" fn rdma_establish(id: Cid) -> c_int {
    on_id(id, |i, to| {
        if let Backend::System(sid) = to {
            // SAFETY: live system id.
            return fwd_ret(&i, sid, unsafe { sysfn::rdma_establish(sid.0) });
        }
        // QP-less connections (CONNECT_RESPONSE) do not exist on iWARP.
        fail(libc::EINVAL)
    })
}

pub unsafe extern "C" fn rdma_init_qp_attr(
    id: Cid,
    qp_attr: *mut abi::ibv_qp_attr,
    qp_attr_mask: *mut c_int,
) -> c_int {
    on_id(id, |i, to| {
        if qp_attr.is_null() || qp_attr_mask.is_null() {
            return fail(libc::EINVAL);
        }
        if let Backend::System(sid) = to {
            // SAFETY: live system id; the application's out structs.
            return fwd_ret(&i, sid, unsafe {
                sysfn::rdma_init_qp_attr(sid.0, qp_attr, qp_attr_mask)
            });
        }
        use abi::ibv_qp_state::*;
        // SAFETY: the application's structs, non-null.
        unsafe {
            match (*qp_attr).qp_state {
                IBV_QPS_INIT => {
                    let port = if (*id).port_num == 0 {
                        1
                    } else {
                        (*id).port_num
                    };
                    *qp_attr = verbs::init_attr(port);
                    *qp_attr_mask = verbs::init_mask() as c_int;
                }
                // iw_cm_init_qp_attr: RTR and RTS need only the state.
                IBV_QPS_RTR | IBV_QPS_RTS => {
                    *qp_attr_mask = abi::ibv_qp_attr_mask::IBV_QP_STATE as c_int
                }
                _ => return fail(libc::EINVAL),
            }
        }
        0
    })
}

// ---------------------------------------------------------------------------------------
// The event channel

pub unsafe extern "C" fn rdma_get_cm_event(
    channel: *mut abi::rdma_event_channel,
    event: *mut *mut abi::rdma_cm_event,
) -> c_int {
    guard(|| {
        if event.is_null() {
            return fail(libc::EINVAL);
        }
        let Some(ch) = Chan::lookup(channel as usize) else {
            return fail(libc::EINVAL);
        };
        match ch.q.pop() {
            Ok(e) => {
                let p = deliver(e);
                // SAFETY: checked non-null; the application's out pointer.
                unsafe { *event = p };
                0
            }
            Err(e) => io_fail(e),
        }
    })
}

pub extern "C" fn rdma_ack_cm_event(event: *mut abi::rdma_cm_event) -> c_int {
    guard(|| {
        if event.is_null() {
            fail(libc::EINVAL)
        } else {
            ack(event)
        }
    })
}

pub extern "C" fn rdma_event_str(event: u32) -> *const c_char {
    static NAMES: OnceLock<Vec<std::ffi::CString>> = OnceLock::new();
    let names = NAMES.get_or_init(|| {
        (0..=16u32)
            .map(|k| std::ffi::CString::new(cm::event_name(k)).unwrap_or_default())
            .collect()
    });
    names[event.min(16) as usize].as_ptr()
}

pub unsafe extern "C" fn rdma_migrate_id(id: Cid, channel: *mut abi::rdma_event_channel) -> c_int {
    on_id(id, |i, to| {
        let was_sync = i.is_sync();
        if was_sync && channel.is_null() {
            return fail(libc::EINVAL);
        }
        let (chan, sync) = if channel.is_null() {
            match Chan::new() {
                Ok(c) => (c, true),
                Err(e) => return io_fail(e),
            }
        } else {
            match Chan::lookup(channel as usize) {
                Some(c) => (c, false),
                None => return fail(libc::EINVAL),
            }
        };
        if let Backend::System(sid) = to {
            if let Err(e) = fwd::migrate(sid, &chan) {
                return io_fail(e);
            }
        }
        if was_sync {
            let e = i.c.event();
            if e != 0 {
                ack(e as *mut abi::rdma_cm_event);
                i.c.set_event(0);
            }
        }
        i.migrate(chan, sync);
        0
    })
}

pub unsafe extern "C" fn rdma_set_option(
    id: Cid,
    level: c_int,
    optname: c_int,
    optval: *mut c_void,
    optlen: usize,
) -> c_int {
    on_id(id, |i, to| {
        if let Backend::System(sid) = to {
            // SAFETY: live system id; the application's option buffer.
            return fwd_ret(&i, sid, unsafe {
                sysfn::rdma_set_option(sid.0, level, optname, optval, optlen)
            });
        }
        if optval.is_null() {
            return fail(libc::EINVAL);
        }
        use abi::*;
        // SAFETY: optval is the application's, non-null, of optlen bytes (checked per option).
        let int = || unsafe { (optval as *const c_int).read_unaligned() };
        match (level as u32, optname as u32) {
            (RDMA_OPTION_ID, RDMA_OPTION_ID_TOS) | (RDMA_OPTION_ID, RDMA_OPTION_ID_ACK_TIMEOUT) => {
                // TOS is the TCP stream's business; there is no ack timeout to set on TCP.
                if optlen != 1 {
                    return fail(libc::EINVAL);
                }
                0
            }
            (RDMA_OPTION_ID, RDMA_OPTION_ID_REUSEADDR)
            | (RDMA_OPTION_ID, RDMA_OPTION_ID_AFONLY) => {
                if optlen != std::mem::size_of::<c_int>() {
                    return fail(libc::EINVAL);
                }
                let mut st = i.st();
                if st.state != State::Idle {
                    return fail(libc::EINVAL);
                }
                if optname as u32 == RDMA_OPTION_ID_REUSEADDR {
                    st.reuseaddr = int() != 0;
                } else {
                    st.afonly = Some(int() != 0);
                }
                0
            }
            // iWARP has no subnet administrator path records.
            (RDMA_OPTION_IB, RDMA_OPTION_IB_PATH) => fail(libc::EINVAL),
            _ => fail(libc::ENOSYS),
        }
    })
}

pub unsafe extern "C" fn rdma_join_multicast(
    id: Cid,
    addr: *mut libc::sockaddr,
    context: *mut c_void,
) -> c_int {
    on_id(id, |i, to| {
        if let Backend::System(sid) = to {
            // SAFETY: live system id; the application's arguments.
            return fwd_ret(&i, sid, unsafe {
                sysfn::rdma_join_multicast(sid.0, addr, context)
            });
        }
        fail(libc::ENOSYS) // iWARP has no multicast
    })
}

pub unsafe extern "C" fn rdma_join_multicast_ex(
    id: Cid,
    attr: *mut abi::rdma_cm_join_mc_attr_ex,
    context: *mut c_void,
) -> c_int {
    on_id(id, |i, to| {
        if let Backend::System(sid) = to {
            // SAFETY: live system id; the application's arguments.
            return fwd_ret(&i, sid, unsafe {
                sysfn::rdma_join_multicast_ex(sid.0, attr, context)
            });
        }
        fail(libc::ENOSYS)
    })
}

pub unsafe extern "C" fn rdma_leave_multicast(id: Cid, addr: *mut libc::sockaddr) -> c_int {
    on_id(id, |i, to| {
        if let Backend::System(sid) = to {
            // SAFETY: live system id; the application's address.
            return fwd_ret(&i, sid, unsafe { sysfn::rdma_leave_multicast(sid.0, addr) });
        }
        fail(libc::EADDRNOTAVAIL)
    })
}

pub unsafe extern "C" fn rdma_set_local_ece(id: Cid, ece: *mut abi::ibv_ece) -> c_int {
    on_id(id, |i, to| {
        if let Backend::System(sid) = to {
            // SAFETY: live system id; the application's struct.
            return fwd_ret(&i, sid, unsafe { sysfn::rdma_set_local_ece(sid.0, ece) });
        }
        // SAFETY: null or the application's struct.
        match unsafe { ece.as_ref() } {
            Some(e) if i.c.qp().is_none() && e.vendor_id != 0 && e.comp_mask == 0 => 0,
            _ => fail(libc::EINVAL),
        }
    })
}

pub unsafe extern "C" fn rdma_get_remote_ece(id: Cid, ece: *mut abi::ibv_ece) -> c_int {
    on_id(id, |i, to| {
        if let Backend::System(sid) = to {
            // SAFETY: live system id; the application's struct.
            return fwd_ret(&i, sid, unsafe { sysfn::rdma_get_remote_ece(sid.0, ece) });
        }
        if ece.is_null() || i.c.qp().is_some() {
            return fail(libc::EINVAL);
        }
        // SAFETY: the application's struct, non-null. MPA carries no ECE.
        unsafe { *ece = abi::ibv_ece::default() };
        0
    })
}

pub unsafe extern "C" fn rdma_get_src_port(id: Cid) -> u16 {
    cm::lookup(id as usize)
        .and_then(|i| i.c.src())
        .map_or(0, |a| a.port().to_be())
}

pub unsafe extern "C" fn rdma_get_dst_port(id: Cid) -> u16 {
    cm::lookup(id as usize)
        .and_then(|i| i.c.dst())
        .map_or(0, |a| a.port().to_be())
}

// ---------------------------------------------------------------------------------------
// Devices

static DEV_LISTS: OnceLock<Mutex<HashMap<usize, usize>>> = OnceLock::new();

pub unsafe extern "C" fn rdma_get_devices(num_devices: *mut c_int) -> *mut *mut abi::ibv_context {
    let mut ctxs: Vec<*mut abi::ibv_context> = cm::devices().iter().map(|d| d.ctx.ptr()).collect();
    let mut n: c_int = 0;
    // SAFETY: n is writable; the system list (if any) is freed with rdma_free_devices.
    let sys_list = if fwd::lib().is_some() {
        unsafe { sysfn::rdma_get_devices(&mut n) }.unwrap_or(ptr::null_mut())
    } else {
        ptr::null_mut()
    };
    if !sys_list.is_null() {
        for k in 0..n.max(0) as usize {
            // SAFETY: the system list has n entries.
            let c = unsafe { *sys_list.add(k) };
            // The system library opens uiw devices too: list each device once, ours.
            let dup = verbs::ctx_device_name(c)
                .is_some_and(|n| cm::devices().iter().any(|d| d.name == n));
            if !c.is_null() && !ctxs.contains(&c) && !dup {
                ctxs.push(c);
            }
        }
    }
    // SAFETY: calloc of a NULL-terminated array, freed by rdma_free_devices.
    let arr = unsafe { libc::calloc(ctxs.len() + 1, std::mem::size_of::<*mut abi::ibv_context>()) }
        as *mut *mut abi::ibv_context;
    if arr.is_null() {
        if !sys_list.is_null() {
            // SAFETY: the system's list.
            unsafe { sysfn::rdma_free_devices(sys_list) };
        }
        sys::set_errno(libc::ENOMEM);
        return ptr::null_mut();
    }
    for (k, c) in ctxs.iter().enumerate() {
        // SAFETY: arr has ctxs.len() + 1 entries.
        unsafe { *arr.add(k) = *c };
    }
    lock(&DEV_LISTS).insert(arr as usize, sys_list as usize);
    if !num_devices.is_null() {
        // SAFETY: the application's out pointer, non-null.
        unsafe { *num_devices = ctxs.len() as c_int };
    }
    arr
}

pub unsafe extern "C" fn rdma_free_devices(list: *mut *mut abi::ibv_context) {
    let Some(sys_list) = lock(&DEV_LISTS).remove(&(list as usize)) else {
        return;
    };
    if sys_list != 0 {
        // SAFETY: the system's list from rdma_get_devices.
        unsafe { sysfn::rdma_free_devices(sys_list as *mut *mut abi::ibv_context) };
    }
    // SAFETY: allocated with calloc in rdma_get_devices.
    unsafe { libc::free(list as *mut c_void) };
}

// ---------------------------------------------------------------------------------------
// Addressing: rdma_getaddrinfo (getaddrinfo(3) plus the RDMA fields)

fn copy_out(bytes: &[u8]) -> *mut c_void {
    // SAFETY: malloc of bytes.len() (at least 1) bytes, filled below; freed with free().
    let p = unsafe { libc::malloc(bytes.len().max(1)) };
    if !p.is_null() {
        // SAFETY: p has room for bytes.
        unsafe { ptr::copy_nonoverlapping(bytes.as_ptr(), p as *mut u8, bytes.len()) };
    }
    p
}

pub unsafe extern "C" fn rdma_getaddrinfo(
    node: *const c_char,
    service: *const c_char,
    hints: *const abi::rdma_addrinfo,
    res: *mut *mut abi::rdma_addrinfo,
) -> c_int {
    guard(|| {
        if res.is_null() || (node.is_null() && service.is_null() && hints.is_null()) {
            return fail(libc::EINVAL);
        }
        let nohints = abi::rdma_addrinfo::default();
        // SAFETY: null or the application's hints.
        let h = unsafe { hints.as_ref() }.unwrap_or(&nohints);
        // SAFETY: calloc'd, freed by rdma_freeaddrinfo.
        let rai = unsafe { libc::calloc(1, std::mem::size_of::<abi::rdma_addrinfo>()) }
            as *mut abi::rdma_addrinfo;
        if rai.is_null() {
            return fail(libc::ENOMEM);
        }
        // SAFETY: rai is ours and zeroed; every pointer stored in it is malloc'd.
        let r = unsafe { fill_addrinfo(node, service, h, hints.is_null(), &mut *rai) };
        if r != 0 {
            // SAFETY: ours.
            unsafe { rdma_freeaddrinfo(rai) };
            return r;
        }
        // SAFETY: checked non-null.
        unsafe { *res = rai };
        0
    })
}

/// # Safety
/// `node`/`service` are null or C strings; `rai` is zeroed.
unsafe fn fill_addrinfo(
    node: *const c_char,
    service: *const c_char,
    h: &abi::rdma_addrinfo,
    no_hints: bool,
    rai: &mut abi::rdma_addrinfo,
) -> c_int {
    use abi::ibv_qp_type::*;
    use abi::rdma_port_space::*;
    use abi::{RAI_NUMERICHOST, RAI_PASSIVE};
    if !node.is_null() || !service.is_null() {
        // librdmacm's ucma_convert_to_ai.
        // SAFETY: all-zero addrinfo is valid.
        let mut ai: libc::addrinfo = unsafe { std::mem::zeroed() };
        if h.ai_flags & RAI_PASSIVE as i32 != 0 {
            ai.ai_flags = libc::AI_PASSIVE;
        }
        if h.ai_flags & RAI_NUMERICHOST as i32 != 0 {
            ai.ai_flags |= libc::AI_NUMERICHOST;
        }
        if h.ai_family != libc::AF_INET
            && h.ai_family != libc::AF_INET6
            && h.ai_family != libc::AF_UNSPEC
        {
            ai.ai_family = libc::AF_UNSPEC; // AF_IB: plain IP resolution
        } else {
            ai.ai_family = h.ai_family;
        }
        ai.ai_socktype = match h.ai_qp_type as u32 {
            IBV_QPT_RC | IBV_QPT_UC | IBV_QPT_XRC_SEND | IBV_QPT_XRC_RECV => libc::SOCK_STREAM,
            IBV_QPT_UD => libc::SOCK_DGRAM,
            _ => 0,
        };
        ai.ai_protocol = match h.ai_port_space as u32 {
            RDMA_PS_TCP => libc::IPPROTO_TCP,
            RDMA_PS_IPOIB | RDMA_PS_UDP => libc::IPPROTO_UDP,
            RDMA_PS_IB if ai.ai_socktype == libc::SOCK_STREAM => libc::IPPROTO_TCP,
            RDMA_PS_IB if ai.ai_socktype == libc::SOCK_DGRAM => libc::IPPROTO_UDP,
            _ => 0,
        };
        let mut out: *mut libc::addrinfo = ptr::null_mut();
        // SAFETY: C strings or null; out is writable; freed below.
        let r = unsafe {
            libc::getaddrinfo(
                node,
                service,
                if no_hints { ptr::null() } else { &ai },
                &mut out,
            )
        };
        if r != 0 {
            return r; // EAI_* as librdmacm returns it
        }
        // SAFETY: getaddrinfo succeeded: out is a valid list.
        let a = unsafe { &*out };
        rai.ai_qp_type = if h.ai_qp_type != 0 {
            h.ai_qp_type
        } else {
            match a.ai_socktype {
                libc::SOCK_STREAM => IBV_QPT_RC as i32,
                libc::SOCK_DGRAM => IBV_QPT_UD as i32,
                _ => 0,
            }
        };
        rai.ai_port_space = if h.ai_port_space != 0 {
            h.ai_port_space
        } else {
            match a.ai_protocol {
                libc::IPPROTO_TCP => RDMA_PS_TCP as i32,
                libc::IPPROTO_UDP => RDMA_PS_UDP as i32,
                _ => 0,
            }
        };
        rai.ai_family = a.ai_family;
        // SAFETY: ai_addr holds ai_addrlen bytes.
        let addr =
            unsafe { std::slice::from_raw_parts(a.ai_addr as *const u8, a.ai_addrlen as usize) };
        let canon = if a.ai_canonname.is_null() {
            ptr::null_mut()
        } else {
            // SAFETY: a C string from getaddrinfo.
            unsafe { libc::strdup(a.ai_canonname) }
        };
        if a.ai_flags & libc::AI_PASSIVE != 0 {
            rai.ai_flags = RAI_PASSIVE as i32;
            rai.ai_src_canonname = canon;
            rai.ai_src_addr = copy_out(addr) as *mut abi::sockaddr;
            rai.ai_src_len = a.ai_addrlen;
        } else {
            rai.ai_dst_canonname = canon;
            rai.ai_dst_addr = copy_out(addr) as *mut abi::sockaddr;
            rai.ai_dst_len = a.ai_addrlen;
        }
        // SAFETY: from getaddrinfo.
        unsafe { libc::freeaddrinfo(out) };
        if rai.ai_src_addr.is_null() && rai.ai_dst_addr.is_null() {
            return fail(libc::ENOMEM);
        }
    } else {
        rai.ai_flags = h.ai_flags;
        rai.ai_family = h.ai_family;
        rai.ai_qp_type = h.ai_qp_type;
        rai.ai_port_space = h.ai_port_space;
        if h.ai_dst_len != 0 && !h.ai_dst_addr.is_null() {
            // SAFETY: the hints' address of ai_dst_len bytes.
            let d = unsafe {
                std::slice::from_raw_parts(h.ai_dst_addr as *const u8, h.ai_dst_len as usize)
            };
            rai.ai_dst_addr = copy_out(d) as *mut abi::sockaddr;
            rai.ai_dst_len = h.ai_dst_len;
        }
    }
    if rai.ai_src_len == 0 && h.ai_src_len != 0 && !h.ai_src_addr.is_null() {
        // SAFETY: the hints' address of ai_src_len bytes.
        let s = unsafe {
            std::slice::from_raw_parts(h.ai_src_addr as *const u8, h.ai_src_len as usize)
        };
        rai.ai_src_addr = copy_out(s) as *mut abi::sockaddr;
        rai.ai_src_len = h.ai_src_len;
    }
    0
}

pub unsafe extern "C" fn rdma_freeaddrinfo(res: *mut abi::rdma_addrinfo) {
    let mut p = res;
    while !p.is_null() {
        // SAFETY: a list from rdma_getaddrinfo: every pointer was malloc'd (or is null).
        unsafe {
            let next = (*p).ai_next;
            libc::free((*p).ai_connect);
            libc::free((*p).ai_route);
            libc::free((*p).ai_src_canonname as *mut c_void);
            libc::free((*p).ai_dst_canonname as *mut c_void);
            libc::free((*p).ai_src_addr as *mut c_void);
            libc::free((*p).ai_dst_addr as *mut c_void);
            libc::free(p as *mut c_void);
            p = next;
        }
    }
}

// ---------------------------------------------------------------------------------------
// Endpoints (rdma_verbs.h's synchronous API)

pub unsafe extern "C" fn rdma_create_ep(
    id: *mut Cid,
    res: *mut abi::rdma_addrinfo,
    pd: *mut abi::ibv_pd,
    qp_init_attr: *mut abi::ibv_qp_init_attr,
) -> c_int {
    guard(|| {
        if id.is_null() || res.is_null() {
            return fail(libc::EINVAL);
        }
        // SAFETY: the application's addrinfo (from rdma_getaddrinfo), non-null.
        let r = unsafe { &*res };
        let i = match create_id(
            ptr::null_mut(),
            ptr::null_mut(),
            r.ai_port_space as u32,
            r.ai_qp_type as u32,
        ) {
            Ok(i) => i,
            Err(e) => return e,
        };
        let cid = i.c.ptr();
        let fail_ep = |ret: c_int| {
            let e = sys::errno();
            // SAFETY: our id, destroyed once.
            unsafe { rdma_destroy_ep(cid) };
            sys::set_errno(e);
            ret
        };
        // SAFETY: the application's pointers as rdma_create_ep documents them.
        unsafe {
            if r.ai_flags & abi::RAI_PASSIVE as i32 != 0 {
                let ret = rdma_bind_addr(cid, r.ai_src_addr as *mut libc::sockaddr);
                if ret != 0 {
                    return fail_ep(ret);
                }
                if !pd.is_null() {
                    (*cid).pd = pd;
                }
                if let Some(a) = qp_init_attr.as_ref() {
                    let mut a = *a;
                    a.qp_type = r.ai_qp_type as u32;
                    i.st().qp_init = Some(crate::cid::QpInitAttr(a));
                }
            } else {
                let ret = rdma_resolve_addr(
                    cid,
                    r.ai_src_addr as *mut libc::sockaddr,
                    r.ai_dst_addr as *mut libc::sockaddr,
                    2000,
                );
                if ret != 0 {
                    return fail_ep(ret);
                }
                let ret = rdma_resolve_route(cid, 2000);
                if ret != 0 {
                    return fail_ep(ret);
                }
                if let Some(a) = qp_init_attr.as_mut() {
                    a.qp_type = r.ai_qp_type as u32;
                    let ret = rdma_create_qp(cid, pd, a);
                    if ret != 0 {
                        return fail_ep(ret);
                    }
                }
                if r.ai_connect_len != 0 && !r.ai_connect.is_null() {
                    let d = std::slice::from_raw_parts(r.ai_connect as *const u8, r.ai_connect_len);
                    i.st().connect_pdata = d.to_vec();
                }
            }
            *id = cid;
        }
        0
    })
}

pub unsafe extern "C" fn rdma_destroy_ep(id: Cid) {
    let Some(i) = cm::lookup(id as usize) else {
        return;
    };
    // SAFETY: our live id.
    unsafe {
        if !(*id).qp.is_null() {
            rdma_destroy_qp(id);
        }
        if !(*id).srq.is_null() {
            rdma_destroy_srq(id);
        }
    }
    i.st().qp_init = None;
    drop(i);
    // SAFETY: our live id.
    unsafe { rdma_destroy_id(id) };
}
