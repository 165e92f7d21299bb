//! Connection management for ids on uiw devices: addresses and devices, the application's
//! TCP listen/connect, and the translation of the provider's connection callbacks into
//! rdma_cm events with the kernel's (drivers/infiniband/core/cma.c, cma_iw_handler) types
//! and statuses. No `unsafe`: C structs and libc are reached through cid/sys/verbs/uiwcm.
//!
//! Locking: `Id::st` before a channel's queue lock; no lock is held while calling into the
//! provider (its callbacks take these locks), and the last reference to a provider
//! connection (`Target`) is never dropped on the provider's callback thread: ids drop their
//! `Target` in `destroy`, on the application's thread.
#![forbid(unsafe_code)]

use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock, Weak};
use std::time::Duration;

use crate::abi::rdma_cm_event_type as ev;
use crate::channel::Channel;
use crate::cid::{CChan, CId, QpInitAttr};
use crate::order::{self, Ticket};
use crate::sys;
use crate::uiwcm::{self, Conn};
use crate::verbs::{self, Ctx};

/// `UIW_RDMACM_DEBUG=1`: trace connection management on stderr.
pub fn debug_on() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| std::env::var_os("UIW_RDMACM_DEBUG").is_some_and(|v| v != "0"))
}

macro_rules! debug {
    ($($a:tt)*) => {
        if debug_on() {
            // One write per line: `eprintln!` writes its pieces one by one to the unbuffered
            // stream, and the lines of processes that share it (mpirun's ranks) interleaved.
            let line = format!("uiw-rdmacm[{}]: {}\n", std::process::id(), format!($($a)*));
            let _ = std::io::Write::write_all(&mut std::io::stderr(), line.as_bytes());
        }
    };
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn err(e: i32) -> io::Error {
    io::Error::from_raw_os_error(e)
}

// ---------------------------------------------------------------------------------------
// Devices

/// A uiw device: its context (opened once, like librdmacm's), the IP addresses in its GID
/// table, and the limits rdma_cm needs.
pub struct Device {
    pub ctx: Ctx,
    pub name: String,
    pub addrs: Vec<IpAddr>,
    pub pd: usize,
    pub port: u8,
    pub max_ird: u8,
    pub max_ord: u8,
    /// Its streams go over a userspace transport (`uiw up --transport xdp|packet`): rdma_cm
    /// listens and connects through the provider (uiw_cm.h v2), not with kernel sockets.
    pub in_engine: bool,
}

/// The IP address a GID holds: IPv4-mapped GIDs are IPv4 addresses.
pub fn gid_ip(gid: &[u8; 16]) -> Option<IpAddr> {
    let v6 = Ipv6Addr::from(*gid);
    if v6.is_unspecified() {
        return None;
    }
    Some(match v6.to_ipv4_mapped() {
        Some(v4) => IpAddr::V4(v4),
        None => IpAddr::V6(v6),
    })
}

/// IPv4-mapped IPv6 addresses are their IPv4 address.
pub fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map(IpAddr::V4).unwrap_or(ip),
        v4 => v4,
    }
}

/// Is this the name of a device published by `uiw` (`uiw_<netdev>`)?
/// Whether a uiw device published on this host carries its streams over a userspace
/// transport (`uiw up --transport xdp|packet`: its sysfs directory's `uiw/transport`). Read
/// from the published files, without opening a device: a listener that finds none listens on
/// its kernel socket at once (see [`Id::listen`]).
fn raw_transport_published() -> bool {
    let Ok(dir) = std::fs::read_dir("/sys/class/infiniband") else { return false };
    dir.flatten()
        .filter(|e| is_uiw_name(&e.file_name().to_string_lossy()))
        .filter_map(|e| std::fs::read_to_string(e.path().join("uiw/transport")).ok())
        .any(|t| !matches!(t.trim(), "" | "tcp"))
}

pub fn is_uiw_name(name: &str) -> bool {
    name.starts_with("uiw_")
}

/// Is this the path of the uiw provider?
pub fn is_uiw_provider(path: &str) -> bool {
    let f = path.rsplit('/').next().unwrap_or(path);
    f.starts_with("libuiw")
}

/// The uiw devices of this process (opened on first use and kept open).
pub fn devices() -> &'static [Arc<Device>] {
    static DEVS: OnceLock<Vec<Arc<Device>>> = OnceLock::new();
    DEVS.get_or_init(|| {
        let mut out = Vec::new();
        for (ctx, name) in verbs::open_devices(is_uiw_name) {
            if !ctx
                .provider_path()
                .map(|p| is_uiw_provider(&p))
                .unwrap_or(false)
            {
                continue; // a device named uiw_* that another provider serves: not ours
            }
            let (ports, ird, ord) = ctx.limits().unwrap_or((1, 0, 0));
            let mut addrs = Vec::new();
            for p in 1..=ports.max(1) {
                for g in ctx.gids(p) {
                    if let Some(ip) = gid_ip(&g) {
                        if !addrs.contains(&ip) {
                            addrs.push(ip);
                        }
                    }
                }
            }
            let clamp = |v: i32| v.clamp(0, 255) as u8;
            let in_engine = uiwcm::Api::for_ctx(ctx).map(|a| a.in_engine(ctx)).unwrap_or(false);
            out.push(Arc::new(Device {
                ctx,
                name,
                addrs,
                pd: ctx.alloc_pd(),
                port: 1,
                max_ird: clamp(ird),
                max_ord: clamp(ord),
                in_engine,
            }));
        }
        out
    })
}

/// The uiw device whose GID table holds `ip`. A loopback address no device holds goes to the
/// first device, as the kernel's cma_bind_loopback binds it to the first active device.
pub fn device_for_ip(ip: IpAddr) -> Option<Arc<Device>> {
    let ip = canonical(ip);
    devices()
        .iter()
        .find(|d| d.addrs.contains(&ip))
        .or_else(|| {
            if ip.is_loopback() {
                devices().first()
            } else {
                None
            }
        })
        .cloned()
}

// ---------------------------------------------------------------------------------------
// IRD/ORD (rdma_conn_param.responder_resources / initiator_depth)

/// RDMA_MAX_RESP_RES / RDMA_MAX_INIT_DEPTH: "as many as the device allows".
pub const MAX_DEPTH: u8 = 0xff;

/// The value to use for a requested depth: `MAX_DEPTH` means `default`; more than the
/// device's `max` is EINVAL (librdmacm's ucma_valid_param, TCP port space only).
pub fn pick_depth(requested: Option<u8>, default: u8, max: u8, check: bool) -> io::Result<u8> {
    match requested {
        None | Some(MAX_DEPTH) => Ok(default.min(max)),
        Some(v) if check && v > max => Err(err(libc::EINVAL)),
        Some(v) => Ok(v),
    }
}

// ---------------------------------------------------------------------------------------
// Channels and events

/// An event channel: its C struct (`{ int fd }`) and its queue.
pub struct Chan {
    pub q: Channel<Event>,
    pub c: CChan,
}

static CHANS: OnceLock<Mutex<HashMap<usize, Weak<Chan>>>> = OnceLock::new();

impl Chan {
    /// A new channel, findable by the address of its C struct while it lives.
    pub fn new() -> io::Result<Arc<Chan>> {
        let q = Channel::new()?;
        let c = CChan::new(q.fd());
        let ch = Arc::new(Chan { q, c });
        let mut m = lock(CHANS.get_or_init(Default::default));
        m.retain(|_, w| w.strong_count() > 0);
        m.insert(ch.c.ptr() as usize, Arc::downgrade(&ch));
        Ok(ch)
    }

    /// The live channel whose C struct is at `p`.
    pub fn lookup(p: usize) -> Option<Arc<Chan>> {
        lock(CHANS.get_or_init(Default::default))
            .get(&p)
            .and_then(Weak::upgrade)
    }
}

/// A queued rdma_cm event.
pub struct Event {
    /// `rdma_cm_event.id` (for CONNECT_REQUEST the new id).
    pub id: Arc<Id>,
    /// `rdma_cm_event.listen_id` (CONNECT_REQUEST only); the event counts on it.
    pub listen: Option<Arc<Id>>,
    pub kind: u32,
    pub status: i32,
    pub private: Vec<u8>,
    pub initiator_depth: u8,
    pub responder_resources: u8,
    /// A forwarded event of the system librdmacm, acknowledged with this one.
    pub fwd: Option<crate::fwd::SysEvent>,
}

impl Event {
    pub fn new(id: &Arc<Id>, kind: u32, status: i32) -> Event {
        Event {
            id: id.clone(),
            listen: None,
            kind,
            status,
            private: Vec::new(),
            initiator_depth: 0,
            responder_resources: 0,
            fwd: None,
        }
    }
    /// The id whose acknowledgement count this event is part of.
    pub fn counted(&self) -> &Arc<Id> {
        self.listen.as_ref().unwrap_or(&self.id)
    }
}

/// The rdma_cm event for a failed TCP connect or MPA exchange, as cma_iw_handler maps an
/// IW_CM_EVENT_CONNECT_REPLY status: refused/reset → REJECTED, timeout → UNREACHABLE,
/// anything else → CONNECT_ERROR; the status is the negative errno.
pub fn connect_failure(errno: i32) -> (u32, i32) {
    let e = errno.abs();
    match e {
        libc::ECONNREFUSED | libc::ECONNRESET => (ev::RDMA_CM_EVENT_REJECTED, -e),
        libc::ETIMEDOUT => (ev::RDMA_CM_EVENT_UNREACHABLE, -e),
        libc::EHOSTUNREACH | libc::ENETUNREACH => (ev::RDMA_CM_EVENT_UNREACHABLE, -libc::ETIMEDOUT),
        0 => (ev::RDMA_CM_EVENT_CONNECT_ERROR, -libc::EIO),
        _ => (ev::RDMA_CM_EVENT_CONNECT_ERROR, -e),
    }
}

pub fn event_name(kind: u32) -> &'static str {
    match kind {
        ev::RDMA_CM_EVENT_ADDR_RESOLVED => "RDMA_CM_EVENT_ADDR_RESOLVED",
        ev::RDMA_CM_EVENT_ADDR_ERROR => "RDMA_CM_EVENT_ADDR_ERROR",
        ev::RDMA_CM_EVENT_ROUTE_RESOLVED => "RDMA_CM_EVENT_ROUTE_RESOLVED",
        ev::RDMA_CM_EVENT_ROUTE_ERROR => "RDMA_CM_EVENT_ROUTE_ERROR",
        ev::RDMA_CM_EVENT_CONNECT_REQUEST => "RDMA_CM_EVENT_CONNECT_REQUEST",
        ev::RDMA_CM_EVENT_CONNECT_RESPONSE => "RDMA_CM_EVENT_CONNECT_RESPONSE",
        ev::RDMA_CM_EVENT_CONNECT_ERROR => "RDMA_CM_EVENT_CONNECT_ERROR",
        ev::RDMA_CM_EVENT_UNREACHABLE => "RDMA_CM_EVENT_UNREACHABLE",
        ev::RDMA_CM_EVENT_REJECTED => "RDMA_CM_EVENT_REJECTED",
        ev::RDMA_CM_EVENT_ESTABLISHED => "RDMA_CM_EVENT_ESTABLISHED",
        ev::RDMA_CM_EVENT_DISCONNECTED => "RDMA_CM_EVENT_DISCONNECTED",
        ev::RDMA_CM_EVENT_DEVICE_REMOVAL => "RDMA_CM_EVENT_DEVICE_REMOVAL",
        ev::RDMA_CM_EVENT_MULTICAST_JOIN => "RDMA_CM_EVENT_MULTICAST_JOIN",
        ev::RDMA_CM_EVENT_MULTICAST_ERROR => "RDMA_CM_EVENT_MULTICAST_ERROR",
        ev::RDMA_CM_EVENT_ADDR_CHANGE => "RDMA_CM_EVENT_ADDR_CHANGE",
        ev::RDMA_CM_EVENT_TIMEWAIT_EXIT => "RDMA_CM_EVENT_TIMEWAIT_EXIT",
        _ => "UNKNOWN EVENT",
    }
}

// ---------------------------------------------------------------------------------------
// Ids

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum State {
    Idle,
    Bound,
    AddrResolved,
    RouteResolved,
    Listen,
    /// rdma_connect: TCP connect, then MPA in the provider.
    Connect,
    /// A CONNECT_REQUEST id, not yet accepted or rejected.
    ConnReq,
    Accepting,
    Rejected,
    Established,
    Disconnecting,
    Disconnected,
    /// A connection attempt failed (REJECTED, UNREACHABLE, CONNECT_ERROR).
    Failed,
    /// Handled by the system librdmacm (see fwd.rs).
    Forwarded,
}

pub struct St {
    pub chan: Arc<Chan>,
    pub sync: bool,
    pub dev: Option<Arc<Device>>,
    pub state: State,
    /// The bound socket (rdma_bind_addr / rdma_resolve_addr) or the listener.
    sock: Option<Arc<OwnedFd>>,
    /// `sock`'s port was picked by the system, not asked for (port 0): `connect` may take
    /// another one (see `connect_thread`).
    port_picked: bool,
    /// The provider's listeners of a listening id on devices with a userspace transport
    /// (uiw_cm_listen_v2): one for its device, or one per such device for a wildcard.
    engine_listeners: Vec<uiwcm::Listener>,
    target: Option<Arc<Target>>,
    pending: Vec<Arc<Target>>,
    pub reuseaddr: bool,
    pub afonly: Option<bool>,
    /// rdma_create_ep's ai_connect: sent before the private data of rdma_connect.
    pub connect_pdata: Vec<u8>,
    /// rdma_create_ep's QP attributes for the ids rdma_get_request returns.
    pub qp_init: Option<QpInitAttr>,
    /// From the CONNECT_REQUEST: the initiator's IRD and ORD.
    pub peer_ird: u8,
    pub peer_ord: u8,
    pub destroyed: bool,
    cancel: Arc<AtomicBool>,
    pub fwd: Option<crate::fwd::SysId>,
}

/// An rdma_cm_id.
pub struct Id {
    pub c: CId,
    st: Mutex<St>,
    acks: Mutex<(u64, u64)>,
    acked: Condvar,
}

static IDS: OnceLock<Mutex<HashMap<usize, Arc<Id>>>> = OnceLock::new();

fn ids() -> MutexGuard<'static, HashMap<usize, Arc<Id>>> {
    lock(IDS.get_or_init(Default::default))
}

/// The live id whose C struct is at `p` (None for anything else: never trust a pointer).
pub fn lookup(p: usize) -> Option<Arc<Id>> {
    ids().get(&p).cloned()
}

impl Id {
    pub fn new(chan: Arc<Chan>, sync: bool, context: usize, ps: u32, qp_type: u32) -> Arc<Id> {
        let c = CId::new(chan.c.ptr(), context, ps, qp_type);
        let id = Arc::new(Id {
            c,
            st: Mutex::new(St {
                chan,
                sync,
                dev: None,
                state: State::Idle,
                sock: None,
                port_picked: false,
                engine_listeners: Vec::new(),
                target: None,
                pending: Vec::new(),
                reuseaddr: false,
                afonly: None,
                connect_pdata: Vec::new(),
                qp_init: None,
                peer_ird: 0,
                peer_ord: 0,
                destroyed: false,
                cancel: Arc::new(AtomicBool::new(false)),
                fwd: None,
            }),
            acks: Mutex::new((0, 0)),
            acked: Condvar::new(),
        });
        ids().insert(id.c.ptr() as usize, id.clone());
        id
    }

    pub fn st(&self) -> MutexGuard<'_, St> {
        lock(&self.st)
    }

    pub fn ptr(&self) -> usize {
        self.c.ptr() as usize
    }

    fn set_device(&self, dev: &Arc<Device>) {
        self.c.set_device(Some(dev.ctx), dev.pd, dev.port);
    }

    /// Queue an event on the id's channel (nothing once it is destroyed).
    pub fn push(&self, e: Event) {
        let st = self.st();
        if st.destroyed {
            return;
        }
        st.chan.q.push(e);
    }

    /// An event counted on this id was handed to the application.
    pub fn delivered(&self) {
        lock(&self.acks).0 += 1;
    }

    /// An event counted on this id was acknowledged.
    pub fn acked_one(&self) {
        let mut a = lock(&self.acks);
        a.1 += 1;
        self.acked.notify_all();
    }

    /// Block until every delivered event of this id is acknowledged.
    pub fn wait_acks(&self) {
        let mut a = lock(&self.acks);
        while a.1 < a.0 {
            a = self.acked.wait(a).unwrap_or_else(|e| e.into_inner());
        }
    }

    // --- addresses -------------------------------------------------------------------

    /// A TCP socket bound to `a`. `reuse`: SO_REUSEADDR, which the kernel's siw sets on its
    /// listening sockets: a new listener may take a port that accepted connections of an
    /// earlier, destroyed listener still use (perftest -R listens twice on its port).
    fn new_socket(st: &St, a: &SocketAddr, reuse: bool) -> io::Result<OwnedFd> {
        let s = sys::tcp_socket(a.is_ipv6())?;
        if st.reuseaddr || reuse {
            sys::set_reuseaddr(&s, true)?;
        }
        if a.is_ipv6() {
            if let Some(v) = st.afonly {
                sys::set_v6only(&s, v)?;
            }
        }
        sys::bind(&s, a)?;
        Ok(s)
    }

    /// rdma_bind_addr. `Ok(false)`: the address is on no uiw device (forward it).
    pub fn bind(&self, a: SocketAddr) -> io::Result<bool> {
        let mut st = self.st();
        if st.state != State::Idle {
            return Err(err(libc::EINVAL));
        }
        let dev = if a.ip().is_unspecified() {
            None
        } else {
            match device_for_ip(a.ip()) {
                Some(d) => Some(d),
                None => return Ok(false),
            }
        };
        let s = Self::new_socket(&st, &a, true)?;
        let local = sys::local_addr(&s)?;
        st.sock = Some(Arc::new(s));
        st.port_picked = a.port() == 0;
        if let Some(d) = &dev {
            self.set_device(d);
        }
        st.dev = dev;
        st.state = State::Bound;
        self.c.set_src(Some(local));
        Ok(true)
    }

    /// rdma_resolve_addr: pick the source address and device; ADDR_RESOLVED follows.
    /// `Ok(false)`: the source is on no uiw device (forward it).
    pub fn resolve_addr(
        self: &Arc<Self>,
        src: Option<SocketAddr>,
        dst: SocketAddr,
    ) -> io::Result<bool> {
        let mut dst = dst;
        if dst.ip().is_unspecified() {
            // The kernel resolves the any address to loopback.
            dst.set_ip(if dst.is_ipv4() {
                Ipv4Addr::LOCALHOST.into()
            } else {
                Ipv6Addr::LOCALHOST.into()
            });
        }
        let mut st = self.st();
        match st.state {
            State::Idle | State::Bound => {}
            _ => return Err(err(libc::EINVAL)),
        }
        let bound = st.sock.as_ref().and_then(|s| sys::local_addr(s).ok());
        let src_ip = match (
            src.filter(|s| !s.ip().is_unspecified()),
            bound.filter(|b| !b.ip().is_unspecified()),
        ) {
            (Some(s), _) => s.ip(),
            (None, Some(b)) => b.ip(),
            (None, None) => match sys::route_source(canonical(dst.ip())) {
                Ok(ip) => ip,
                Err(_) => {
                    drop(st);
                    self.push(Event::new(
                        self,
                        ev::RDMA_CM_EVENT_ADDR_ERROR,
                        -libc::EHOSTUNREACH,
                    ));
                    return Ok(true);
                }
            },
        };
        let Some(dev) = device_for_ip(src_ip) else {
            return Ok(false);
        };
        if st.sock.is_none() || bound.map(|b| b.ip().is_unspecified()).unwrap_or(true) {
            let port = src
                .map(|s| s.port())
                .or(bound.map(|b| b.port()))
                .unwrap_or(0);
            let mut a = SocketAddr::new(canonical(src_ip), port);
            if dst.is_ipv6() && a.is_ipv4() {
                a = SocketAddr::new(src_ip, port);
            }
            st.sock = None; // a wildcard-bound socket is replaced by one on the source
            let s = Self::new_socket(&st, &a, port != 0)?;
            st.sock = Some(Arc::new(s));
            st.port_picked = port == 0;
        }
        let local = st.sock.as_ref().map(|s| sys::local_addr(s)).transpose()?;
        self.set_device(&dev);
        st.dev = Some(dev);
        st.state = State::AddrResolved;
        self.c.set_src(local);
        self.c.set_dst(Some(dst));
        drop(st);
        self.push(Event::new(self, ev::RDMA_CM_EVENT_ADDR_RESOLVED, 0));
        Ok(true)
    }

    /// rdma_resolve_route: iWARP has no path records; ROUTE_RESOLVED follows.
    pub fn resolve_route(self: &Arc<Self>) -> io::Result<()> {
        let mut st = self.st();
        if st.state != State::AddrResolved {
            return Err(err(libc::EINVAL));
        }
        st.state = State::RouteResolved;
        drop(st);
        self.push(Event::new(self, ev::RDMA_CM_EVENT_ROUTE_RESOLVED, 0));
        Ok(())
    }

    // --- passive side ----------------------------------------------------------------

    /// rdma_listen: TCP listen on the bound address; each connection is handed to the
    /// provider, whose MPA Request becomes a CONNECT_REQUEST.
    pub fn listen(self: &Arc<Self>, backlog: i32) -> io::Result<()> {
        let mut st = self.st();
        match st.state {
            State::Bound => {}
            State::Idle => {
                let any = SocketAddr::new(Ipv4Addr::UNSPECIFIED.into(), 0);
                let s = Self::new_socket(&st, &any, true)?;
                self.c.set_src(Some(sys::local_addr(&s)?));
                st.sock = Some(Arc::new(s));
                st.state = State::Bound;
            }
            State::Listen => return Ok(()),
            _ => return Err(err(libc::EINVAL)),
        }
        let sock = st.sock.clone().ok_or_else(|| err(libc::EINVAL))?;
        let backlog = if backlog <= 0 { 1024 } else { backlog };
        // A device whose streams go over a userspace transport is listened on through the
        // provider (its peers' segments never reach a kernel socket: the XDP program
        // redirects them, the transport's nftables guard drops the AF_PACKET copies before
        // the kernel's TCP). For a listener bound to such a device the kernel socket listens
        // all the same, unserved: it holds the port against other listeners, as rdma_cm's
        // port space does, and shows in `ss -l` as a kernel rdma_cm listener would. A
        // wildcard listener on a host with such devices listens on each of them as well
        // (best effort: the kernel's devices are served whatever becomes of these). Either
        // way the provider's listeners, and with them the steering of the port, come first:
        // a peer that connects as soon as the port shows would otherwise reach the kernel's
        // socket before the port is steered to the raw transport, and be refused. With
        // kernel-TCP devices only, the kernel socket listens at once, as before the raw
        // transports existed (a peer told the port may connect the moment this returns).
        let bound_in_engine = matches!(&st.dev, Some(d) if d.in_engine);
        if bound_in_engine {
            let dev = st.dev.clone().ok_or_else(|| err(libc::EINVAL))?;
            let local = sys::local_addr(&sock)?;
            let l = self.engine_listen(&dev, SocketAddr::new(canonical(local.ip()), local.port()))?;
            st.engine_listeners.push(l);
        } else if st.dev.is_none() && raw_transport_published() {
            let port = sys::local_addr(&sock)?.port();
            for d in devices().iter().filter(|d| d.in_engine) {
                for ip in d.addrs.iter().copied().filter(IpAddr::is_ipv4) {
                    if let Ok(l) = self.engine_listen(d, SocketAddr::new(ip, port)) {
                        st.engine_listeners.push(l);
                    }
                }
            }
        }
        if let Err(e) = sys::listen(&sock, backlog) {
            // Dropped after our lock: closing waits for an incoming callback in flight,
            // which takes it.
            let ls = std::mem::take(&mut st.engine_listeners);
            drop(st);
            drop(ls);
            return Err(e);
        }
        st.state = State::Listen;
        drop(st);
        if !bound_in_engine {
            // The kernel socket serves the kernel-TCP devices: our accept loop.
            let me = Arc::downgrade(self);
            uiw_kabi::thread::spawn_started("uiw-rdmacm-listen", move || accept_loop(me, sock))
                .map_err(|_| err(libc::ENOMEM))?;
        }
        Ok(())
    }

    /// uiw_cm_listen_v2 on `at` through device `d`'s transport, for this id.
    fn engine_listen(self: &Arc<Self>, d: &Device, at: SocketAddr) -> io::Result<uiwcm::Listener> {
        let r = uiwcm::Api::for_ctx(d.ctx)
            .map_err(|_| err(libc::ENOSYS))
            .and_then(|api| api.listen(d.ctx, &at, Arc::downgrade(self)));
        debug!("id {:#x}: listen on {at} through {}: {:?}", self.ptr(), d.name, r.as_ref().err());
        r
    }

    /// A connection the provider accepted on one of our listeners (uiw_cm_listen_v2; on its
    /// progress thread): as [`Id::on_accept`], with the provider's connection handle, made
    /// by `conn` only if we take it. Returns the Target the connection's events go to.
    pub fn on_incoming(
        self: &Arc<Self>,
        local: SocketAddr,
        remote: SocketAddr,
        conn: impl FnOnce(&'static uiwcm::Api) -> Conn,
    ) -> Option<*const Target> {
        debug!("listener {:#x}: incoming {remote} -> {local}", self.ptr());
        let dev = match self.st().dev.clone() {
            Some(d) => d,
            None => device_for_ip(local.ip())?,
        };
        let api = uiwcm::Api::for_ctx(dev.ctx).ok()?;
        let t = Arc::new(Target::new(Arc::downgrade(self), Weak::new(), dev, local, remote));
        {
            let mut st = self.st();
            if st.destroyed || st.state != State::Listen {
                return None;
            }
            st.pending.retain(|p| !p.dead.load(Ordering::Relaxed));
            st.pending.push(t.clone());
        }
        let _ = t.conn.set(conn(api));
        t.arm();
        Some(Arc::as_ptr(&t))
    }

    fn on_accept(self: &Arc<Self>, fd: OwnedFd) {
        let (Ok(local), Ok(remote)) = (sys::local_addr(&fd), sys::peer_addr(&fd)) else {
            return;
        };
        debug!("listener {:#x}: accepted {remote} -> {local}", self.ptr());
        let dev = match self.st().dev.clone() {
            Some(d) => d,
            None => match device_for_ip(local.ip()) {
                Some(d) => d,
                None => return, // arrived on an address no uiw device holds: close it
            },
        };
        let Ok(api) = uiwcm::Api::for_ctx(dev.ctx) else {
            return;
        };
        let t = Arc::new(Target::new(
            Arc::downgrade(self),
            Weak::new(),
            dev.clone(),
            local,
            remote,
        ));
        {
            let mut st = self.st();
            if st.destroyed || st.state != State::Listen {
                debug!(
                    "listener {:#x}: closing {remote}: listener gone",
                    self.ptr()
                );
                return;
            }
            st.pending.retain(|p| !p.dead.load(Ordering::Relaxed));
            st.pending.push(t.clone());
        }
        match api.passive(dev.ctx, fd, &t) {
            Ok(c) => {
                let _ = t.conn.set(c);
                t.arm();
            }
            Err(e) => {
                debug!("listener {:#x}: uiw_cm_passive_v1 failed: {e}", self.ptr());
                self.st().pending.retain(|p| !Arc::ptr_eq(p, &t))
            }
        }
    }

    /// The CONNECT_REQUEST of `t` arrived: a new id for it, and the event on our channel.
    fn connect_request(self: &Arc<Self>, t: &Target, e: uiwcm::Event) {
        // A sync listener's ids get their own channel (librdmacm migrates them to one).
        let sync = self.st().sync;
        let own = if sync {
            match Chan::new() {
                Ok(c) => Some(c),
                Err(_) => {
                    t.dead.store(true, Ordering::Relaxed); // the listener thread reaps it
                    return;
                }
            }
        } else {
            None
        };
        let mut st = self.st();
        if st.destroyed || st.state != State::Listen {
            return;
        }
        let Some(i) = st
            .pending
            .iter()
            .position(|p| std::ptr::eq(Arc::as_ptr(p), t))
        else {
            return;
        };
        let target = st.pending.remove(i);
        let chan = own.unwrap_or_else(|| st.chan.clone());
        let nid = Id::new(chan, sync, self.c.context(), self.c.ps(), self.c.qp_type());
        {
            let mut ns = nid.st();
            ns.dev = Some(t.dev.clone());
            ns.state = State::ConnReq;
            ns.peer_ird = e.ird.min(255) as u8;
            ns.peer_ord = e.ord.min(255) as u8;
            // The new id owns the connection from now on (and drops it in destroy).
            ns.target = Some(target);
        }
        nid.set_device(&t.dev);
        nid.c.set_src(Some(t.local));
        nid.c.set_dst(Some(t.remote));
        *lock(&t.id) = Arc::downgrade(&nid);
        let mut evt = Event::new(&nid, ev::RDMA_CM_EVENT_CONNECT_REQUEST, 0);
        evt.listen = Some(self.clone());
        evt.private = e.private;
        // cma's iw_conn_req_handler: initiator_depth = ird, responder_resources = ord
        evt.initiator_depth = e.ird.min(255) as u8;
        evt.responder_resources = e.ord.min(255) as u8;
        st.chan.q.push(evt);
    }

    /// rdma_accept (qp: the id's QP; ird/ord already picked).
    pub fn accept(&self, pdata: &[u8], ird: u8, ord: u8) -> io::Result<()> {
        let qp = self.c.qp().ok_or_else(|| err(libc::EINVAL))?;
        let t = {
            let mut st = self.st();
            if st.state != State::ConnReq {
                return Err(err(libc::EINVAL));
            }
            st.state = State::Accepting;
            st.target.clone().ok_or_else(|| err(libc::EINVAL))?
        };
        let r = match t.conn.get() {
            Some(c) => c.accept(qp, pdata, ird as u16, ord as u16),
            None => Err(err(libc::EINVAL)),
        };
        if r.is_err() {
            self.st().state = State::ConnReq;
        }
        r
    }

    /// rdma_reject: an MPA Reply with the R bit and our private data.
    pub fn reject(&self, pdata: &[u8]) -> io::Result<()> {
        let t = {
            let mut st = self.st();
            if st.state != State::ConnReq {
                return Err(err(libc::EINVAL));
            }
            st.state = State::Rejected;
            st.target.clone().ok_or_else(|| err(libc::EINVAL))?
        };
        let r = t
            .conn
            .get()
            .map(|c| c.reject(pdata))
            .unwrap_or_else(|| Err(err(libc::EINVAL)));
        r
    }

    // --- active side -----------------------------------------------------------------

    /// rdma_connect: TCP connect from the resolved source, then MPA in the provider;
    /// ESTABLISHED / REJECTED / UNREACHABLE / CONNECT_ERROR follows.
    pub fn connect(self: &Arc<Self>, pdata: Vec<u8>, ird: u8, ord: u8) -> io::Result<()> {
        let qp = self.c.qp().ok_or_else(|| err(libc::EINVAL))?;
        let (sock, port_picked, dst, dev, cancel) = {
            let mut st = self.st();
            if st.state != State::RouteResolved {
                return Err(err(libc::EINVAL));
            }
            let dev = st.dev.clone().ok_or_else(|| err(libc::EINVAL))?;
            if qp.context() != dev.ctx.ptr() {
                return Err(err(libc::EINVAL));
            }
            let dst = self.c.dst().ok_or_else(|| err(libc::EINVAL))?;
            let sock = st.sock.take().ok_or_else(|| err(libc::EINVAL))?;
            st.state = State::Connect;
            (sock, st.port_picked, dst, dev, st.cancel.clone())
        };
        let me = Arc::downgrade(self);
        // The connect leaves after the application's earlier ones to this destination (see
        // `order`); the thread waits for its turn.
        let turn = Ticket::take(dst);
        if dev.in_engine {
            // The provider opens the stream through the device's transport, from a port of
            // its own: the bound kernel socket has done its part (the source address).
            drop(sock);
            uiw_kabi::thread::spawn_started("uiw-rdmacm-connect", move || {
                engine_connect_thread(me, turn, dst, dev, qp, pdata, ird, ord)
            })
            .map_err(|_| err(libc::ENOMEM))?;
            return Ok(());
        }
        let sock = Arc::try_unwrap(sock).map_err(|_| err(libc::EBUSY))?;
        uiw_kabi::thread::spawn_started("uiw-rdmacm-connect", move || {
            connect_thread(me, turn, sock, port_picked, dst, dev, qp, pdata, ird, ord, cancel)
        })
        .map_err(|_| err(libc::ENOMEM))?;
        Ok(())
    }

    fn connect_failed(self: &Arc<Self>, errno: i32) {
        let (kind, status) = connect_failure(errno);
        {
            let mut st = self.st();
            if st.destroyed {
                return;
            }
            st.state = State::Failed;
        }
        if kind == ev::RDMA_CM_EVENT_REJECTED {
            if let Some(qp) = self.c.qp() {
                let _ = qp.modify_err();
            }
        }
        self.push(Event::new(self, kind, status));
    }

    // --- either side -----------------------------------------------------------------

    /// rdma_disconnect.
    pub fn disconnect(&self) -> io::Result<()> {
        let t = {
            let mut st = self.st();
            match st.state {
                State::Established | State::Accepting => {}
                State::Connect if st.target.is_some() => {}
                State::Disconnecting | State::Disconnected => return Ok(()),
                _ => return Err(err(libc::EINVAL)),
            }
            st.state = State::Disconnecting;
            st.target.clone().ok_or_else(|| err(libc::EINVAL))?
        };
        let r = t
            .conn
            .get()
            .map(|c| c.disconnect())
            .unwrap_or_else(|| Err(err(libc::EINVAL)));
        r
    }

    /// rdma_destroy_id's work: stop everything, drop undelivered events, then wait until the
    /// application acknowledged every event it got. The caller acked `id->event` first.
    pub fn destroy(self: &Arc<Self>) {
        let (target, sock, pending, chan, state, listeners) = {
            let mut st = self.st();
            st.destroyed = true;
            st.cancel.store(true, Ordering::SeqCst);
            (
                st.target.take(),
                st.sock.take(),
                std::mem::take(&mut st.pending),
                st.chan.clone(),
                st.state,
                std::mem::take(&mut st.engine_listeners),
            )
        };
        // Without our lock: closing waits for an incoming callback in flight, which takes it.
        drop(listeners);
        if let Some(s) = &sock {
            sys::shutdown(s); // wakes the accept loop
        }
        if let Some(t) = target {
            if let Some(c) = t.conn.get() {
                match state {
                    // The kernel's iw_destroy_cm_id rejects an unanswered request and
                    // aborts a live connection.
                    State::ConnReq => drop(c.reject(&[])),
                    State::Accepting | State::Established | State::Connect => drop(c.disconnect()),
                    _ => {}
                }
            }
            drop(t); // releases the provider connection: no callback after this
        }
        drop(pending);
        let me = Arc::as_ptr(self);
        let mine = |e: &Event| Arc::as_ptr(&e.id) == me || e.listen.as_ref().map(Arc::as_ptr) == Some(me);
        // An event thread may have seen the channel readable for one of these events and be
        // on its way to rdma_get_cm_event: taking the token back now would leave that call
        // blocked for good (rping since rdma-core v57 polls its channel in a thread and joins
        // that thread after rdma_destroy_id). When another thread reads this channel, give it
        // a bounded moment to take them; what it takes, wait_acks below waits for.
        if chan.q.read_by_another_thread() {
            let until = std::time::Instant::now() + Duration::from_millis(200);
            while chan.q.any(mine) && std::time::Instant::now() < until {
                std::thread::sleep(Duration::from_millis(1));
            }
        }
        let purged = chan.q.remove_where(mine);
        for e in purged {
            if e.kind == ev::RDMA_CM_EVENT_CONNECT_REQUEST && !Arc::ptr_eq(&e.id, self) {
                e.id.destroy(); // the application never saw it
            }
        }
        self.wait_acks();
        ids().remove(&self.ptr());
    }

    /// rdma_migrate_id: later events (and queued ones) go to `chan`.
    pub fn migrate(self: &Arc<Self>, chan: Arc<Chan>, sync: bool) {
        let old = {
            let mut st = self.st();
            let old = std::mem::replace(&mut st.chan, chan.clone());
            st.sync = sync;
            self.c.set_channel(chan.c.ptr());
            old
        };
        let me = Arc::as_ptr(self);
        for e in old.q.remove_where(|e| Arc::as_ptr(e.counted()) == me) {
            chan.q.push(e);
        }
        self.wait_acks();
    }

    pub fn is_sync(&self) -> bool {
        self.st().sync
    }
    pub fn chan(&self) -> Arc<Chan> {
        self.st().chan.clone()
    }
}

/// A new id for a CONNECT_REQUEST the system librdmacm reported on forwarded listener `l`.
pub fn new_forwarded(l: &Arc<Id>, sid: crate::fwd::SysId) -> Arc<Id> {
    let (chan, sync) = {
        let st = l.st();
        (st.chan.clone(), st.sync)
    };
    let chan = if sync {
        Chan::new().unwrap_or(chan)
    } else {
        chan
    };
    let nid = Id::new(chan, sync, l.c.context(), l.c.ps(), l.c.qp_type());
    {
        let mut st = nid.st();
        st.state = State::Forwarded;
        st.fwd = Some(sid);
    }
    nid
}

fn accept_loop(id: Weak<Id>, sock: Arc<OwnedFd>) {
    loop {
        match sys::accept(&sock) {
            Ok(fd) => match id.upgrade() {
                Some(l) => l.on_accept(fd),
                None => return,
            },
            Err(e)
                if matches!(
                    e.raw_os_error(),
                    Some(libc::EINTR) | Some(libc::ECONNABORTED) | Some(libc::EPROTO)
                ) => {}
            Err(e)
                if matches!(
                    e.raw_os_error(),
                    Some(libc::EMFILE)
                        | Some(libc::ENFILE)
                        | Some(libc::ENOBUFS)
                        | Some(libc::ENOMEM)
                ) =>
            {
                std::thread::sleep(Duration::from_millis(50));
            }
            Err(_) => return, // shut down by destroy
        }
        if id.upgrade().map(|l| l.st().destroyed).unwrap_or(true) {
            return;
        }
    }
}

/// Connects `sock` to `dst`, giving up when `cancel` is raised; leaves it blocking.
fn connect_stream(sock: &OwnedFd, dst: &SocketAddr, cancel: &AtomicBool) -> io::Result<()> {
    sys::set_nonblocking(sock, true)?;
    if !sys::connect_start(sock, dst)? {
        loop {
            if cancel.load(Ordering::SeqCst) {
                return Err(err(libc::ECANCELED));
            }
            let r = sys::poll1(sock.as_raw_fd(), libc::POLLOUT, 100)?;
            if r != 0 {
                break;
            }
        }
        match sys::take_error(sock)? {
            0 => {}
            e => return Err(err(e)),
        }
    }
    sys::set_nonblocking(sock, false)
}

/// A TCP socket on `local`'s address whose port `connect` picks (see
/// [`sys::set_bind_address_no_port`]).
fn rebound(local: &SocketAddr) -> io::Result<OwnedFd> {
    let s = sys::tcp_socket(local.is_ipv6())?;
    sys::set_bind_address_no_port(&s)?;
    sys::bind(&s, local)?;
    Ok(s)
}

#[allow(clippy::too_many_arguments)]
fn connect_thread(
    id: Weak<Id>,
    turn: Ticket,
    sock: OwnedFd,
    port_picked: bool,
    dst: SocketAddr,
    dev: Arc<Device>,
    qp: verbs::Qp,
    pdata: Vec<u8>,
    ird: u8,
    ord: u8,
    cancel: Arc<AtomicBool>,
) {
    wait_turn(&id, &turn, &dst);
    let mut sock = sock;
    let mut result = connect_stream(&sock, &dst, &cancel);
    if port_picked && result.as_ref().err().and_then(io::Error::raw_os_error) == Some(libc::EADDRNOTAVAIL) {
        // The port the system picked at rdma_resolve_addr (as the kernel's rdma_cm picks one
        // then) has a connection to this same destination still in TIME_WAIT — SPDK's hosts
        // reconnect to one target port many times ("RDMA connect error -99"). Once more from
        // a port `connect` picks, knowing the destination. A port the application asked for
        // is kept, and the error is its.
        result = sys::local_addr(&sock)
            .and_then(|l| rebound(&SocketAddr::new(l.ip(), 0)))
            .and_then(|s| {
                sock = s;
                connect_stream(&sock, &dst, &cancel)
            });
    }
    let Some(me) = id.upgrade() else { return };
    debug!("id {:#x}: TCP connect to {dst}: {:?}", me.ptr(), result);
    if let Err(e) = result {
        if e.raw_os_error() != Some(libc::ECANCELED) {
            me.connect_failed(e.raw_os_error().unwrap_or(libc::EIO));
        }
        return;
    }
    // Where the stream really runs (the kernel reports it in the CONNECT_REPLY).
    me.c.set_src(sys::local_addr(&sock).ok());
    let local = sys::local_addr(&sock).unwrap_or(dst);
    // The provider sends the MPA Request before this returns; then the next connect's turn.
    start_target(me, dev, local, dst, "uiw_cm_active_v1", |api, t| api.active(qp, sock, &pdata, ird as u16, ord as u16, t).map(|c| (c, None)));
    drop(turn);
}

/// Waits until the earlier connects to `dst` started (see `order`), for the connect of `id`.
fn wait_turn(id: &Weak<Id>, turn: &Ticket, dst: &SocketAddr) {
    if !turn.wait_turn(order::TURN_MAX) {
        if let Some(me) = id.upgrade() {
            debug!("id {:#x}: connect to {dst}: the earlier connects to it still run after {:?}; going ahead", me.ptr(), order::TURN_MAX);
        }
    }
}

/// The provider half of an rdma_connect from `local` to `dst` on `dev`: a target for the
/// connection becomes the id's unless the id was destroyed meanwhile, then `open` hands the
/// QP and its stream to the provider (`what` names the call in the debug log); its events
/// arrive through the target. A failure is the id's `RDMA_CM_EVENT_UNREACHABLE` (see
/// `Id::connect_failed`).
fn start_target(
    me: Arc<Id>,
    dev: Arc<Device>,
    local: SocketAddr,
    dst: SocketAddr,
    what: &str,
    open: impl FnOnce(&'static uiwcm::Api, &Arc<Target>) -> io::Result<(uiwcm::Conn, Option<SocketAddr>)>,
) {
    let api = match uiwcm::Api::for_ctx(dev.ctx) {
        Ok(a) => a,
        Err(_) => return me.connect_failed(libc::ENOSYS),
    };
    let t = Arc::new(Target::new(Weak::new(), Arc::downgrade(&me), dev, local, dst));
    {
        let mut st = me.st();
        if st.destroyed {
            return;
        }
        st.target = Some(t.clone());
    }
    match open(api, &t) {
        Ok((c, local)) => {
            debug!("id {:#x}: {what}: connected through {}, from {local:?}", me.ptr(), t.dev.name);
            if local.is_some() {
                me.c.set_src(local);
            }
            let _ = t.conn.set(c);
            drop(me);
            t.arm();
        }
        Err(e) => {
            debug!("id {:#x}: {what} failed: {e}", me.ptr());
            me.st().target = None;
            me.connect_failed(e.raw_os_error().unwrap_or(libc::EIO));
        }
    }
}

/// rdma_connect on a device whose streams go over a userspace transport: the provider opens
/// the stream (uiw_cm_connect_v2) and sends the MPA Request; its events follow as for
/// [`connect_thread`]'s. A thread, as there: the provider may wait for the peer's MAC.
fn engine_connect_thread(
    id: Weak<Id>,
    turn: Ticket,
    dst: SocketAddr,
    dev: Arc<Device>,
    qp: verbs::Qp,
    pdata: Vec<u8>,
    ird: u8,
    ord: u8,
) {
    wait_turn(&id, &turn, &dst);
    let Some(me) = id.upgrade() else { return };
    let local = me.c.src().unwrap_or(dst);
    // When this returns the provider has sent the SYN and queued the MPA Request behind it:
    // the handshakes, and so the MPA Requests, follow in the order of the connects.
    start_target(me, dev, local, dst, "uiw_cm_connect_v2", |api, t| api.connect(qp, &dst, &pdata, ird as u16, ord as u16, t));
    drop(turn);
}

// ---------------------------------------------------------------------------------------
// Provider connections

/// One provider connection and where its callbacks go. The provider's `user` pointer is
/// the address of this struct, which stays valid until its `Conn` is released (first thing
/// in Drop).
pub struct Target {
    conn: OnceLock<Conn>,
    listener: Weak<Id>,
    id: Mutex<Weak<Id>>,
    /// (armed, events that arrived before the connection handle was stored)
    early: Mutex<(bool, Vec<uiwcm::Event>)>,
    dev: Arc<Device>,
    local: SocketAddr,
    remote: SocketAddr,
    /// Failed before its CONNECT_REQUEST: the listener forgets it.
    dead: AtomicBool,
}

impl Target {
    fn new(
        listener: Weak<Id>,
        id: Weak<Id>,
        dev: Arc<Device>,
        local: SocketAddr,
        remote: SocketAddr,
    ) -> Target {
        Target {
            conn: OnceLock::new(),
            listener,
            id: Mutex::new(id),
            early: Mutex::new((false, Vec::new())),
            dev,
            local,
            remote,
            dead: AtomicBool::new(false),
        }
    }

    /// The connection handle is stored: deliver what arrived before, in order, then let
    /// callbacks through.
    fn arm(self: &Arc<Self>) {
        loop {
            let evs = {
                let mut e = lock(&self.early);
                if e.1.is_empty() {
                    e.0 = true;
                    return;
                }
                std::mem::take(&mut e.1)
            };
            for e in evs {
                self.dispatch(e);
            }
        }
    }

    fn dispatch(&self, e: uiwcm::Event) {
        debug!(
            "provider event {} status {} ird {} ord {} pdata {} ({} -> {})",
            e.kind,
            e.status,
            e.ird,
            e.ord,
            e.private.len(),
            self.local,
            self.remote
        );
        if e.kind == uiwcm::CONNECT_REQUEST {
            if let Some(l) = self.listener.upgrade() {
                l.connect_request(self, e);
            }
            return;
        }
        let Some(id) = lock(&self.id).upgrade() else {
            if e.kind == uiwcm::CONNECT_ERROR || e.kind == uiwcm::DISCONNECTED {
                self.dead.store(true, Ordering::Relaxed);
            }
            return;
        };
        let (kind, status, next) = match e.kind {
            uiwcm::ESTABLISHED => (ev::RDMA_CM_EVENT_ESTABLISHED, 0, State::Established),
            uiwcm::REJECTED => (
                ev::RDMA_CM_EVENT_REJECTED,
                -libc::ECONNREFUSED,
                State::Failed,
            ),
            uiwcm::CONNECT_ERROR => {
                let (k, s) = connect_failure(e.status);
                (k, s, State::Failed)
            }
            uiwcm::DISCONNECTED => (ev::RDMA_CM_EVENT_DISCONNECTED, 0, State::Disconnected),
            _ => return,
        };
        {
            let mut st = id.st();
            if st.destroyed {
                return;
            }
            if next == State::Disconnected && st.state == State::Disconnected {
                return; // one DISCONNECTED per connection
            }
            if next == State::Disconnected
                && matches!(st.state, State::Failed | State::Rejected | State::ConnReq)
            {
                return; // it never was connected
            }
            st.state = next;
        }
        let mut evt = Event::new(&id, kind, status);
        evt.private = e.private;
        if kind == ev::RDMA_CM_EVENT_ESTABLISHED {
            // cma_iw_handler: initiator_depth = ird, responder_resources = ord
            evt.initiator_depth = e.ird.min(255) as u8;
            evt.responder_resources = e.ord.min(255) as u8;
        }
        id.push(evt);
    }
}

impl Drop for Target {
    fn drop(&mut self) {
        drop(self.conn.take()); // uiw_cm_release_v1: no callback after this
    }
}

/// Entry point of the provider's callbacks (uiwcm::trampoline).
pub fn on_provider_event(t: &Target, e: uiwcm::Event) {
    {
        let mut early = lock(&t.early);
        if !early.0 {
            early.1.push(e);
            return;
        }
    }
    t.dispatch(e);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gids_map_to_ips() {
        let mut g = [0u8; 16];
        assert_eq!(gid_ip(&g), None);
        g[10] = 0xff;
        g[11] = 0xff;
        g[12..].copy_from_slice(&[127, 0, 0, 1]);
        assert_eq!(gid_ip(&g), Some(IpAddr::V4(Ipv4Addr::LOCALHOST)));
        let ll: Ipv6Addr = "fe80::1".parse().unwrap();
        assert_eq!(gid_ip(&ll.octets()), Some(IpAddr::V6(ll)));
        let mapped: IpAddr = "::ffff:10.0.0.1".parse().unwrap();
        assert_eq!(canonical(mapped), IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1)));
    }

    #[test]
    fn failures_map_like_cma_iw_handler() {
        assert_eq!(
            connect_failure(libc::ECONNREFUSED),
            (ev::RDMA_CM_EVENT_REJECTED, -libc::ECONNREFUSED)
        );
        assert_eq!(
            connect_failure(-libc::ECONNRESET),
            (ev::RDMA_CM_EVENT_REJECTED, -libc::ECONNRESET)
        );
        assert_eq!(
            connect_failure(libc::ETIMEDOUT),
            (ev::RDMA_CM_EVENT_UNREACHABLE, -libc::ETIMEDOUT)
        );
        assert_eq!(
            connect_failure(libc::EPROTO),
            (ev::RDMA_CM_EVENT_CONNECT_ERROR, -libc::EPROTO)
        );
    }

    #[test]
    fn depths() {
        assert_eq!(pick_depth(None, 16, 16, true).unwrap(), 16);
        assert_eq!(pick_depth(Some(MAX_DEPTH), 4, 16, true).unwrap(), 4);
        assert_eq!(pick_depth(Some(3), 16, 16, true).unwrap(), 3);
        assert!(pick_depth(Some(17), 16, 16, true).is_err());
        assert_eq!(pick_depth(Some(17), 16, 16, false).unwrap(), 17);
    }

    #[test]
    fn names() {
        assert_eq!(
            event_name(ev::RDMA_CM_EVENT_TIMEWAIT_EXIT),
            "RDMA_CM_EVENT_TIMEWAIT_EXIT"
        );
        assert_eq!(event_name(99), "UNKNOWN EVENT");
        assert!(is_uiw_provider("/run/uiw/lib/libuiw-rdmav34.so"));
        assert!(is_uiw_provider("/x/target/debug/libuiw_rdmav34.so"));
        assert!(!is_uiw_provider(
            "/usr/lib/x86_64-linux-gnu/libibverbs/librxe-rdmav34.so"
        ));
    }
}
