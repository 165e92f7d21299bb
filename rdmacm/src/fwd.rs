//! Ids on devices that are not uiw's are handed to the system's librdmacm (the kernel's
//! rdma_cm), loaded by absolute path — our own SONAME would shadow it — with RTLD_DEEPBIND
//! so that its internal calls bind to itself, not to us.
//!
//! The application keeps seeing our `rdma_cm_id`; behind it sits a system id (`SysId`) on a
//! system channel that belongs to the id's channel. A pump thread per such system channel
//! moves the system's events onto our channel (new ids for CONNECT_REQUESTs), and the
//! fields the system library sets (verbs, qp, pd, route, CQs, …) are mirrored into our
//! struct after every forwarded call and event. FFI surface.

use std::collections::HashMap;
use std::ffi::CString;
use std::io;
use std::sync::{Arc, Mutex, OnceLock, Weak};

use crate::abi;
use crate::cm::{self, Chan, Event, Id};

/// Where Debian/Ubuntu (multiarch) install rdma-core's librdmacm; `UIW_SYSTEM_RDMACM`
/// overrides it.
pub const SYSTEM_LIB: &str = "/usr/lib/x86_64-linux-gnu/librdmacm.so.1";

pub struct Lib {
    h: usize,
}

static LIB: OnceLock<Option<Lib>> = OnceLock::new();

/// The system library, if it can be loaded and is not this library.
pub fn lib() -> Option<&'static Lib> {
    LIB.get_or_init(|| {
        let path = std::env::var("UIW_SYSTEM_RDMACM").unwrap_or_else(|_| SYSTEM_LIB.to_string());
        let c = CString::new(path).ok()?;
        // SAFETY: a valid path; the handle is never closed.
        let h = unsafe {
            libc::dlopen(
                c.as_ptr(),
                libc::RTLD_NOW | libc::RTLD_LOCAL | libc::RTLD_DEEPBIND,
            )
        };
        if h.is_null() {
            return None;
        }
        let l = Lib { h: h as usize };
        // Refuse ourselves (installed over the system library, or a symlink to us).
        let theirs = l.sym("rdma_create_id")?;
        let ours = crate::verbs::dl_base(crate::exports::rdma_create_id as *const () as usize);
        if ours.is_some() && crate::verbs::dl_base(theirs) == ours {
            return None;
        }
        Some(l)
    })
    .as_ref()
}

impl Lib {
    pub fn sym(&self, name: &str) -> Option<usize> {
        crate::verbs::dl_sym(self.h, name)
    }
}

/// The address of a system librdmacm function.
pub fn sym(name: &str) -> Option<usize> {
    lib()?.sym(name)
}

/// Typed calls into the system library: `None` when it (or the symbol) is unavailable.
macro_rules! sys_fns {
    ($( fn $name:ident ( $($a:ident : $t:ty),* ) -> $r:ty; )*) => {
        $(
            /// # Safety
            /// The arguments must be valid for the system library's function of this name.
            #[allow(clippy::missing_safety_doc)]
            pub unsafe fn $name($($a: $t),*) -> Option<$r> {
                let f = sym(stringify!($name))?;
                // SAFETY: the symbol is librdmacm's function with this C signature
                // (rdma_cma.h); the caller guarantees the arguments.
                unsafe {
                    let f: unsafe extern "C" fn($($t),*) -> $r = std::mem::transmute(f);
                    Some(f($($a),*))
                }
            }
        )*
    };
}

type P<T> = *mut T;
type Sa = *mut libc::sockaddr;
type V = *mut libc::c_void;

pub mod sysfn {
    use super::*;
    sys_fns! {
        fn rdma_create_event_channel() -> P<abi::rdma_event_channel>;
        fn rdma_create_id(c: P<abi::rdma_event_channel>, id: P<P<abi::rdma_cm_id>>, ctx: V, ps: u32) -> i32;
        fn rdma_destroy_id(id: P<abi::rdma_cm_id>) -> i32;
        fn rdma_bind_addr(id: P<abi::rdma_cm_id>, a: Sa) -> i32;
        fn rdma_resolve_addr(id: P<abi::rdma_cm_id>, s: Sa, d: Sa, t: i32) -> i32;
        fn rdma_resolve_route(id: P<abi::rdma_cm_id>, t: i32) -> i32;
        fn rdma_create_qp_ex(id: P<abi::rdma_cm_id>, a: P<abi::ibv_qp_init_attr_ex>) -> i32;
        fn rdma_destroy_qp(id: P<abi::rdma_cm_id>) -> ();
        fn rdma_create_srq_ex(id: P<abi::rdma_cm_id>, a: P<abi::ibv_srq_init_attr_ex>) -> i32;
        fn rdma_destroy_srq(id: P<abi::rdma_cm_id>) -> ();
        fn rdma_connect(id: P<abi::rdma_cm_id>, p: P<abi::rdma_conn_param>) -> i32;
        fn rdma_listen(id: P<abi::rdma_cm_id>, b: i32) -> i32;
        fn rdma_accept(id: P<abi::rdma_cm_id>, p: P<abi::rdma_conn_param>) -> i32;
        fn rdma_reject(id: P<abi::rdma_cm_id>, d: *const libc::c_void, l: u8) -> i32;
        fn rdma_reject_ece(id: P<abi::rdma_cm_id>, d: *const libc::c_void, l: u8) -> i32;
        fn rdma_notify(id: P<abi::rdma_cm_id>, e: u32) -> i32;
        fn rdma_disconnect(id: P<abi::rdma_cm_id>) -> i32;
        fn rdma_join_multicast(id: P<abi::rdma_cm_id>, a: Sa, c: V) -> i32;
        fn rdma_join_multicast_ex(id: P<abi::rdma_cm_id>, a: P<abi::rdma_cm_join_mc_attr_ex>, c: V) -> i32;
        fn rdma_leave_multicast(id: P<abi::rdma_cm_id>, a: Sa) -> i32;
        fn rdma_get_cm_event(c: P<abi::rdma_event_channel>, e: P<P<abi::rdma_cm_event>>) -> i32;
        fn rdma_ack_cm_event(e: P<abi::rdma_cm_event>) -> i32;
        fn rdma_set_option(id: P<abi::rdma_cm_id>, l: i32, n: i32, v: V, len: usize) -> i32;
        fn rdma_migrate_id(id: P<abi::rdma_cm_id>, c: P<abi::rdma_event_channel>) -> i32;
        fn rdma_establish(id: P<abi::rdma_cm_id>) -> i32;
        fn rdma_init_qp_attr(id: P<abi::rdma_cm_id>, a: P<abi::ibv_qp_attr>, m: P<i32>) -> i32;
        fn rdma_set_local_ece(id: P<abi::rdma_cm_id>, e: P<abi::ibv_ece>) -> i32;
        fn rdma_get_remote_ece(id: P<abi::rdma_cm_id>, e: P<abi::ibv_ece>) -> i32;
        fn rdma_get_devices(n: P<i32>) -> P<P<abi::ibv_context>>;
        fn rdma_free_devices(l: P<P<abi::ibv_context>>) -> ();
    }
}

/// A system library id behind one of ours.
#[derive(Clone, Copy)]
pub struct SysId(pub *mut abi::rdma_cm_id);
// SAFETY: rdma_cm ids are used from any thread by design; the system library owns it.
unsafe impl Send for SysId {}
// SAFETY: as above.
unsafe impl Sync for SysId {}

/// A system library event, acknowledged there when dropped (with ours, or when purged).
pub struct SysEvent(pub *mut abi::rdma_cm_event);
// SAFETY: an event may be acknowledged from any thread.
unsafe impl Send for SysEvent {}

impl Drop for SysEvent {
    fn drop(&mut self) {
        // SAFETY: an unacknowledged event of the system library, acked once.
        unsafe { sysfn::rdma_ack_cm_event(self.0) };
    }
}

static CHANS: OnceLock<Mutex<HashMap<usize, usize>>> = OnceLock::new();

/// The system channel standing behind our channel `chan` (created with its pump).
fn sys_channel(chan: &Arc<Chan>) -> io::Result<*mut abi::rdma_event_channel> {
    let mut m = CHANS
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    let key = chan.c.ptr() as usize;
    if let Some(&c) = m.get(&key) {
        return Ok(c as *mut abi::rdma_event_channel);
    }
    // SAFETY: no arguments.
    let c = unsafe { sysfn::rdma_create_event_channel() }
        .ok_or_else(|| io::Error::from_raw_os_error(libc::ENODEV))?;
    if c.is_null() {
        return Err(io::Error::last_os_error());
    }
    m.insert(key, c as usize);
    let weak = Arc::downgrade(chan);
    let cv = c as usize;
    uiw_kabi::thread::spawn_started("uiw-rdmacm-fwd", move || pump(weak, cv))
        .map_err(|_| io::Error::from_raw_os_error(libc::ENOMEM))?;
    Ok(c)
}

/// Create the system id behind `id` (on the system channel of its channel).
pub fn attach(id: &Arc<Id>) -> io::Result<SysId> {
    if lib().is_none() {
        return Err(io::Error::from_raw_os_error(libc::ENODEV));
    }
    let chan = id.chan();
    let sc = sys_channel(&chan)?;
    let mut sid: *mut abi::rdma_cm_id = std::ptr::null_mut();
    // SAFETY: a live system channel; sid is writable; the context is our id's address,
    // which the pump uses to find it again.
    let r = unsafe { sysfn::rdma_create_id(sc, &mut sid, id.ptr() as V, id.c.ps()) }
        .ok_or_else(|| io::Error::from_raw_os_error(libc::ENODEV))?;
    if r != 0 || sid.is_null() {
        return Err(io::Error::last_os_error());
    }
    Ok(SysId(sid))
}

/// Move a forwarded id's system id to the system channel of `chan`.
pub fn migrate(sid: SysId, chan: &Arc<Chan>) -> io::Result<()> {
    let sc = sys_channel(chan)?;
    // SAFETY: live system id and channel.
    match unsafe { sysfn::rdma_migrate_id(sid.0, sc) } {
        Some(0) => Ok(()),
        Some(_) => Err(io::Error::last_os_error()),
        None => Err(io::Error::from_raw_os_error(libc::ENODEV)),
    }
}

/// Copy the system id's fields into ours.
pub fn mirror(id: &Id, sid: SysId) {
    // SAFETY: a live system id.
    unsafe { id.c.mirror_from(sid.0) }
}

fn pump(chan: Weak<Chan>, sc: usize) {
    let sc = sc as *mut abi::rdma_event_channel;
    loop {
        let mut e: *mut abi::rdma_cm_event = std::ptr::null_mut();
        // SAFETY: a live system channel; e is writable.
        let r = unsafe { sysfn::rdma_get_cm_event(sc, &mut e) };
        if r != Some(0) || e.is_null() {
            if crate::sys::errno() == libc::EINTR {
                continue;
            }
            return;
        }
        let se = SysEvent(e);
        if chan.upgrade().is_none() {
            return;
        }
        // SAFETY: a live event of the system library, until se is dropped.
        let (sid, lid, kind, status) =
            unsafe { ((*e).id, (*e).listen_id, (*e).event, (*e).status) };
        if kind == abi::rdma_cm_event_type::RDMA_CM_EVENT_CONNECT_REQUEST {
            // SAFETY: listen_id is the system listener, whose context is our listener.
            let Some(l) = (unsafe { lid.as_ref() }).and_then(|l| cm::lookup(l.context as usize))
            else {
                continue;
            };
            let nid = cm::new_forwarded(&l, SysId(sid));
            // SAFETY: sid is the new system id; its context now names our new id.
            unsafe { (*sid).context = nid.ptr() as V };
            mirror(&nid, SysId(sid));
            let mut ev = Event::new(&nid, kind, status);
            ev.listen = Some(l);
            ev.fwd = Some(se);
            // Counted on (and queued for) the listener, like ours.
            let l = ev.listen.clone().unwrap();
            l.push(ev);
            continue;
        }
        // SAFETY: the system id's context is our id's address.
        let Some(id) = (unsafe { sid.as_ref() }).and_then(|s| cm::lookup(s.context as usize))
        else {
            continue;
        };
        mirror(&id, SysId(sid));
        let mut ev = Event::new(&id, kind, status);
        ev.fwd = Some(se);
        id.push(ev);
    }
}
