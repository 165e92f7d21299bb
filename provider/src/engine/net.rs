//! The process's transport: one listening TCP port, the QP number space, and the progress
//! thread that serves every QP's socket (so a passive RDMA Write/Read target that never calls
//! into libibverbs still places data and answers Reads). Addressing: see [`super::transport`].

use std::collections::{HashMap, HashSet, VecDeque};
use std::io::{self, Write};
use std::net::{Ipv4Addr, SocketAddrV4};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use parking_lot::{Mutex, RwLock};
use uiw_kabi::sys::{Epoll, TimerFd, EPOLL_IN, EPOLL_SOCKET_EDGE};
use uiw_wire::conn::{Connection, Role};

use super::clock::earliest;
use super::cm::{CmConn, CmListen, CmStatus};
use super::device::{gid_ipv4, DeviceInfo, TransportKind};
use super::lease::{AlarmView, Arming, Check};
use super::spin::{self, Spin};
use super::transport::kernel::KernelTcp;
use super::transport::raw::RawTcp;
use super::transport::{config, now_ms, now_us, Closing, Connector, Listener, Pending, QpHello, Stream, DEFAULT_PORT_BASE, INDEXES, SLOTS};
use super::user_memory::UserMemory;

/// What the progress thread made of a QP.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Progress {
    /// Served; nothing more now.
    Done,
    /// Served, and more input is waiting (receive budget used up).
    More,
}

/// What the progress thread needs of a QP (implemented by the QP): the transport sits below the QPs
/// it serves and knows them only through this.
pub trait Endpoint: Send + Sync {
    fn qpn(&self) -> u32;
    /// Serve the QP's stream (readiness reported for it; `hup`: the peer hung up;
    /// `writable`: the socket has room again, see `Stream::signals_writable`).
    fn progress(&self, hup: bool, writable: bool) -> Progress;
    /// A stream whose MPA Request names this QP; given back if the QP does not take it.
    #[allow(clippy::result_large_err)] // the stream goes back to the caller, to be rejected
    fn offer(&self, net: &Net, hello: QpHello, p: Pending) -> Result<(), Pending>;
    /// Timers (MPA deadlines) due at `now`.
    fn handle_timeout(&self, now: u64);
    /// When the QP next needs [`Endpoint::handle_timeout`] (engine ms), if ever.
    fn next_timeout(&self) -> Option<u64>;
    /// An application thread's lease on the QP is due (engine µs): kept, or handed back to
    /// the progress thread (see `lease`).
    fn lease_check(&self, now_us: u64) -> Check;
    /// The QP this one connects to (`dest_qp_num`), once it has one (RTR and later).
    fn dest_qpn(&self) -> Option<u32>;
    /// A QP of this process just sent on the stream to this one: serve it now, from the
    /// sender's thread (see `Qp::local_peer`).
    fn peer_sent(&self);
    /// Serve the stream now from an application thread that is not its poller, unless
    /// another thread is at it (see [`Net::serve_leased`]).
    fn serve_aside(&self);
    /// A thread waiting on a completion channel of the QP's CQs was woken by the stream:
    /// it serves the stream as the progress thread does on readiness (news a thread holding
    /// the QP must serve before it lets go, not a poll: while the sleep held the QP, nobody
    /// else heard of the arrival), counted apart.
    fn serve_for_reader(&self);
    /// A thread reading a completion channel whose reader serves this QP goes to sleep.
    fn reader_sleeps(&self);
    /// That thread woke and goes back to the application.
    fn reader_woke(&self);
    /// When its lease was last renewed (engine µs, see `lease`).
    fn lease_renewed_at(&self) -> u64;
    /// How its lease stands at `now` (engine µs) for a push of the lease alarm
    /// ([`Net::push_lease_alarm`]).
    fn lease_alarm_view(&self, now_us: u64) -> AlarmView;
    /// The progress thread is about to read the stream itself poll after poll (a spin
    /// window): the socket leaves its set, if the QP is free and its stream a socket's
    /// (`Lease::spin_out`). Returns whether it did.
    fn spin_out(&self) -> bool;
    /// That spin ends: the socket comes back (`Lease::spin_in`).
    fn spin_in(&self);
    /// Whether a doorbell of the QP waits for its poller's next poll (`Qp::defer_doorbell`).
    fn doorbell_waits(&self) -> bool;
    /// In a forked child: let go of the parent's stream (close this process's descriptor
    /// only — no shutdown, which would end the parent's connection) without waiting for a
    /// lock another thread of the parent held when it forked.
    fn abandon(&self);
    /// A paced stream's deadline came (see `pace`): its wake-up mark comes down, and the
    /// progress thread serves it next. `false`: another thread holds the QP; ask again soon.
    fn pace_due(&self) -> bool;
}

/// Accepted streams that may wait for their MPA Request at once (see [`Net::make_room`]).
const MAX_PENDING: usize = 64;

/// How long the listeners rest after `accept` ran out of file descriptors.
const ACCEPT_PAUSE_MS: u64 = 100;

/// How long a closing stream may take to deliver its last bytes and see the peer's FIN.
const LINGER_MS: u64 = 2_000;

/// A failed QP's stream on its way out (see [`Net::linger`]).
struct Lingering {
    stream: Box<dyn Stream>,
    bytes: Vec<u8>,
    sent: usize,
    fin: bool,
    deadline: u64,
}

/// A stream waiting for its MPA Request, and its rdma_cm connection if it has one.
type Waiting = (Pending, Option<Arc<CmConn>>);

/// Readiness flags that mean the peer hung up (FIN or reset).
const EPOLL_HUP_FLAGS: u32 = (libc::EPOLLRDHUP | libc::EPOLLHUP | libc::EPOLLERR) as u32;

const TOKEN_LISTENER: u64 = 0;
const TOKEN_WAKE: u64 = 1;
const TOKEN_LEASE_ALARM: u64 = 2;
const KIND_QP: u64 = 1 << 32;
const KIND_PENDING: u64 = 2 << 32;
const KIND_CLOSING: u64 = 3 << 32;
/// A raw-frame transport's socket or timer (index into `Net::raw_turn`).
const KIND_RAW: u64 = 4 << 32;
/// An rdma_cm listener of the device's transport (see `Net::cm_listen`).
const KIND_CM_LISTEN: u64 = 5 << 32;
const KIND_MASK: u64 = 0xffff_ffff << 32;

/// The progress thread's doorbell: a socket pair whose read end is in its epoll set
/// (level-triggered: it wakes until the wakes are drained).
struct Waker {
    tx: UnixStream,
    rx: UnixStream,
}

impl Waker {
    fn new() -> io::Result<Waker> {
        let (tx, rx) = UnixStream::pair()?;
        tx.set_nonblocking(true)?;
        Ok(Waker { tx, rx })
    }

    /// Never blocks. The progress thread wakes itself too (adopting or parking a stream,
    /// refusing one, a QP's new deadline found while serving it), and a stream socket holds
    /// only a few hundred one-byte writes (each is a buffer of its own): a blocking write into
    /// a full waker would stop the progress thread for good, as only it drains the waker. A
    /// full waker already has a wake pending, so nothing is lost by skipping the write.
    fn wake(&self) {
        let _ = (&self.tx).write(b"w");
    }

    /// Takes every pending wake (the progress thread, woken).
    fn drain(&self) {
        let mut b = [0u8; 256];
        while matches!(uiw_kabi::sys::recv_dontwait(&self.rx, &mut b), Ok(n) if n == b.len()) {}
    }
}

/// The process-wide transport.
pub struct Net {
    epoll: Epoll,
    /// One listening socket per address of the published devices (all on the port of our
    /// slot), or one on 0.0.0.0 when no device has an IPv4 address.
    listeners: Mutex<Vec<(Ipv4Addr, Box<dyn Listener>)>>,
    /// `accept` ran out of file descriptors: the listeners are out of the epoll set until
    /// then (engine ms; 0: not paused), so that a readable listener cannot spin the thread.
    accept_paused_until: AtomicU64,
    pub port_base: u16,
    pub slot: u32,
    qps: RwLock<HashMap<u32, Weak<dyn Endpoint>>>,
    free: Mutex<VecDeque<u32>>,
    /// Streams waiting for their MPA Request, with the rdma_cm connection of those the
    /// librdmacm drop-in handed over (else: our listener, an RTR connection).
    pending: Mutex<HashMap<u64, Waiting>>,
    next_pending: AtomicU64,
    /// Streams of stopped QPs still sending their last bytes (the Terminate) before FIN.
    closing: Mutex<HashMap<u64, Lingering>>,
    /// rdma_cm listeners on userspace transports (`uiw_cm_listen_v2`), by id.
    cm_listeners: Mutex<HashMap<u64, (Box<dyn Listener>, Arc<CmListen>)>>,
    pub user_mem: &'static dyn UserMemory,
    /// QPs an application thread holds (see `lease`): their sockets are out of the epoll
    /// interest, and the progress thread looks at each lease when it is due. Changed only
    /// under the QP's lease lock ([`Net::apply_arming`]), so it mirrors the leases exactly.
    leased: Mutex<HashSet<u32>>,
    /// `leased` at a glance, kept with it: 0 none, `1 << 32 | qpn` that one QP, `2 << 32`
    /// more. Every poll and every doorbell that rings asks whether a QP other than its own is
    /// leased (`serve_leased`), mostly to hear that none is: a load, not the lock.
    leased_glance: AtomicU64,
    /// A lease was claimed: the progress thread must take its deadline.
    lease_news: AtomicBool,
    /// The timer the progress thread sleeps on until the next lease is due, in its epoll set
    /// (token `TOKEN_LEASE_ALARM`), which pollers push on ([`Net::push_lease_alarm`]; see
    /// `lease`). `None` (no timer could be made): the leases' deadline is the progress
    /// thread's `epoll_wait` timeout, and each check wakes it.
    lease_alarm: Option<TimerFd>,
    /// No poller pushes the lease alarm before then (engine µs).
    alarm_push_after: AtomicU64,
    /// A pump took a message in and sent one out on the same stream (a Read Request and its
    /// Response) since the progress thread last looked: the traffic is request and answer,
    /// whose next request the progress thread may wait for by polling (see `spin`).
    /// `1 << 32 | qpn` of the last QP that answered; 0: none.
    answered: AtomicU64,
    /// QPs to be served again (a pump outside the progress thread used up its receive
    /// budget, see [`Net::requeue`]).
    requeued: Mutex<Vec<u32>>,
    /// Paced streams' QPs and when each must be served again (engine µs; see `pace`). The
    /// progress thread's serves add to it ([`Net::pace`]) and its run loop takes from it.
    paced: Mutex<Vec<(u32, u64)>>,
    /// The kernel's TCP: what `--transport tcp` devices' QPs connect over.
    kernel: Arc<dyn Connector>,
    /// The raw-frame transports of `--transport xdp|packet` devices, by netdev; the
    /// progress thread turns each (token `KIND_RAW | index` in `raw_turn`).
    raw: Mutex<HashMap<String, Arc<RawTcp>>>,
    raw_turn: RwLock<Vec<Arc<RawTcp>>>,
    /// Whether `raw_turn` has a transport (set once, with the first): every poll asks
    /// (`serve_fed`), and a process without raw transports answers with a load.
    has_raw: AtomicBool,
    /// The QP each watched stream's readiness descriptor belongs to (see [`Net::serve_fed`]).
    watched: Mutex<HashMap<i32, u32>>,
    /// Leased QPs whose stream is a raw transport's (QPN → index in `raw_turn`), and per
    /// transport how many: while an application thread that polls holds one, it turns the
    /// stack itself, and the transport's socket is out of the progress thread's interest
    /// (one arrival would otherwise wake two threads for one frame). Changed under the QP's
    /// lease lock, with `leased`.
    raw_leases: Mutex<(HashMap<u32, usize>, Vec<usize>)>,
    stop: AtomicBool,
    waker: Waker,
}

/// Why [`Net::acquire`] failed.
#[derive(Debug)]
pub enum AcquireError {
    /// No listening port or progress thread for QP numbers (`EADDRINUSE`, say).
    Start(String),
    /// The device's raw-frame transport could not be opened on its netdev (privileges,
    /// interface, nftables): what to tell, and the error.
    Raw(String, io::Error),
}

impl std::fmt::Display for AcquireError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            AcquireError::Start(s) => f.write_str(s),
            AcquireError::Raw(s, e) => write!(f, "{s}: {e}"),
        }
    }
}

/// The running transport and how many device contexts use it.
struct Running {
    net: Arc<Net>,
    users: usize,
    thread: Option<std::thread::JoinHandle<()>>,
}

static NET: Mutex<Option<Running>> = Mutex::new(None);

thread_local! {
    /// The transport's lock, held by the forking thread across `fork` (see [`fork_prepare`]).
    static FORK_HELD: std::cell::RefCell<Option<parking_lot::MutexGuard<'static, Option<Running>>>> =
        const { std::cell::RefCell::new(None) };
}

/// `pthread_atfork` prepare: the forking thread takes the transport's lock, so that no other
/// thread holds it (half-way through starting or stopping the transport) when the process is
/// copied.
pub fn fork_prepare() {
    let g = NET.lock();
    FORK_HELD.with(|h| *h.borrow_mut() = Some(g));
}

/// `pthread_atfork` parent: nothing changes for the parent.
pub fn fork_parent() {
    FORK_HELD.with(|h| drop(h.borrow_mut().take()));
}

/// `pthread_atfork` child (rdma-core's fork rules: the child may not use the parent's verbs
/// objects, and gets a library it can open devices with anew). The parent's transport has no
/// progress thread here and its listener and streams are the parent's connections: the
/// child closes its copies of their descriptors (never shutting them down) and forgets it,
/// so the child's first device context starts a transport of its own (a new slot, a new
/// progress thread).
pub fn fork_child() {
    FORK_HELD.with(|h| {
        let mut held = h.borrow_mut().take();
        if let Some(r) = held.as_mut().and_then(|g| g.take()) {
            let Running { net, thread, .. } = r;
            // The thread does not exist in the child: neither join nor detach it.
            std::mem::forget(thread);
            net.abandon();
        }
        drop(held);
    });
}

impl Net {
    /// The transport, started by its first user (listener bound, progress thread running).
    /// Each [`Net::acquire`] is paired with a [`Net::release`]; the last release stops it.
    /// `addrs`: the IPv4 addresses of the user's device, which the listener binds (never
    /// 0.0.0.0 while a device has an address: only a peer that can reach the published
    /// address can reach a QP).
    ///
    /// A device whose streams go over a raw-frame transport gets that transport (opened on
    /// its netdev, listening on our slot's port at its address); the kernel listener then
    /// only reserves the slot's port, on 127.0.0.1 (on the netdev's address it would answer
    /// the SYNs that are the raw transport's).
    pub fn acquire(user_mem: &'static dyn UserMemory, device: &DeviceInfo) -> Result<Arc<Net>, AcquireError> {
        let addrs: Vec<Ipv4Addr> = match device.transport {
            TransportKind::Tcp => device.gids.iter().filter_map(gid_ipv4).collect(),
            TransportKind::Xdp | TransportKind::Packet => vec![Ipv4Addr::LOCALHOST],
        };
        let addrs = &addrs[..];
        let mut g = NET.lock();
        if let Some(r) = g.as_mut() {
            r.net.attach_raw(device)?;
            r.users += 1;
            r.net.listen_on(addrs);
            return Ok(r.net.clone());
        }
        let net = Arc::new(Net::start(user_mem, addrs).map_err(AcquireError::Start)?);
        net.attach_raw(device)?;
        let n = net.clone();
        let thread = uiw_kabi::thread::spawn_started("uiw-progress", move || n.run()).map_err(|e| AcquireError::Start(e.to_string()))?;
        // Its CPUs are set before the first QP exists (see `affinity`), so no stream is ever
        // served from the creator's core.
        super::affinity::place_progress_thread(&thread);
        *g = Some(Running { net: net.clone(), users: 1, thread: Some(thread) });
        Ok(net)
    }

    /// A user is done: the last one stops the progress thread and closes the listener.
    pub fn release() {
        let mut g = NET.lock();
        let Some(r) = g.as_mut() else { return };
        r.users -= 1;
        if r.users > 0 {
            return;
        }
        let Some(mut r) = g.take() else { return };
        drop(g);
        r.net.stop.store(true, Ordering::Release);
        r.net.waker.wake();
        if let Some(t) = r.thread.take() {
            let _ = t.join();
        }
    }

    fn start(user_mem: &'static dyn UserMemory, addrs: &[Ipv4Addr]) -> Result<Net, String> {
        let base = std::env::var("UIW_PORT_BASE").ok().and_then(|v| v.parse::<u16>().ok()).unwrap_or(DEFAULT_PORT_BASE);
        let mut want: Vec<Ipv4Addr> = Vec::new();
        for a in addrs {
            if !want.contains(a) {
                want.push(*a);
            }
        }
        if want.is_empty() {
            want.push(Ipv4Addr::UNSPECIFIED);
        }
        let mut bound = None;
        for slot in 0..SLOTS {
            let Some(port) = u16::try_from(u32::from(base) + slot).ok() else {
                break;
            };
            // The slot is ours if its port is free on every address.
            let ls: Result<Vec<(Ipv4Addr, Box<dyn Listener>)>, _> =
                want.iter().map(|a| KernelTcp.listen(SocketAddrV4::new(*a, port)).map(|l| (*a, l))).collect();
            if let Ok(ls) = ls {
                bound = Some((ls, slot));
                break;
            }
        }
        let (listeners, slot) =
            bound.ok_or_else(|| format!("no free TCP port in {base}..{} for QP numbers (set UIW_PORT_BASE)", u32::from(base) + SLOTS))?;
        let epoll = Epoll::new().map_err(|e| e.to_string())?;
        for (_, l) in &listeners {
            epoll.add(l.readiness(), TOKEN_LISTENER, EPOLL_IN).map_err(|e| e.to_string())?;
        }
        let waker = Waker::new().map_err(|e| e.to_string())?;
        epoll.add(waker.rx.as_raw_fd(), TOKEN_WAKE, EPOLL_IN).map_err(|e| e.to_string())?;
        // Without a timer, the leases' deadline is a timeout (a wake-up per check).
        let lease_alarm = TimerFd::new().ok().filter(|t| epoll.add(t.fd(), TOKEN_LEASE_ALARM, EPOLL_IN).is_ok());
        Ok(Net {
            epoll,
            listeners: Mutex::new(listeners),
            accept_paused_until: AtomicU64::new(0),
            port_base: base,
            slot,
            qps: RwLock::new(HashMap::new()),
            free: Mutex::new((1..INDEXES).collect()),
            pending: Mutex::new(HashMap::new()),
            next_pending: AtomicU64::new(1),
            closing: Mutex::new(HashMap::new()),
            cm_listeners: Mutex::new(HashMap::new()),
            user_mem,
            leased: Mutex::new(HashSet::new()),
            leased_glance: AtomicU64::new(0),
            lease_news: AtomicBool::new(false),
            lease_alarm,
            alarm_push_after: AtomicU64::new(0),
            answered: AtomicU64::new(0),
            requeued: Mutex::new(Vec::new()),
            paced: Mutex::new(Vec::new()),
            kernel: Arc::new(KernelTcp),
            raw: Mutex::new(HashMap::new()),
            raw_turn: RwLock::new(Vec::new()),
            has_raw: AtomicBool::new(false),
            watched: Mutex::new(HashMap::new()),
            raw_leases: Mutex::new((HashMap::new(), Vec::new())),
            stop: AtomicBool::new(false),
            waker,
        })
    }

    /// A fresh QP number of this process, or `None` when all are in use. The index is drawn at
    /// random from the free ones (RFC 5042 §5: a peer that saw one QP number cannot name the
    /// next).
    pub fn alloc_qpn(&self) -> Option<u32> {
        let mut free = self.free.lock();
        if free.is_empty() {
            return None;
        }
        let k = super::random::below(free.len() as u32) as usize;
        let i = free.swap_remove_back(k)?;
        Some(self.slot << 12 | i)
    }

    pub fn register(&self, qp: &Arc<dyn Endpoint>) {
        self.qps.write().insert(qp.qpn(), Arc::downgrade(qp));
    }

    pub fn unregister(&self, qpn: u32) {
        if self.qps.write().remove(&qpn).is_some() {
            self.free.lock().push_back(qpn & 0xfff);
        }
    }

    pub fn lookup(&self, qpn: u32) -> Option<Arc<dyn Endpoint>> {
        self.qps.read().get(&qpn)?.upgrade()
    }

    /// What opens the streams of `device`'s QPs.
    pub fn connector(&self, device: &DeviceInfo) -> Arc<dyn Connector> {
        match device.transport {
            TransportKind::Tcp => self.kernel.clone(),
            _ => self.raw.lock().get(&device.netdev).map_or_else(|| self.kernel.clone(), |t| t.clone() as Arc<dyn Connector>),
        }
    }

    /// Opens `device`'s raw-frame transport (once per netdev) and listens on it for QP
    /// streams, on our slot's port at the netdev's address.
    fn attach_raw(&self, device: &DeviceInfo) -> Result<(), AcquireError> {
        let kind = match device.transport {
            TransportKind::Tcp => return Ok(()),
            TransportKind::Xdp => uiw_rawnet::probe::Kind::Xdp,
            TransportKind::Packet => uiw_rawnet::probe::Kind::Packet,
        };
        let mut raw = self.raw.lock();
        if raw.contains_key(&device.netdev) {
            return Ok(());
        }
        let hi = (u32::from(self.port_base) + SLOTS - 1).min(0xffff) as u16;
        let t = RawTcp::open(&device.netdev, kind, (self.port_base, hi))
            .map_err(|e| AcquireError::Raw(format!("{}: cannot open the {kind} transport on {}", device.name, device.netdev), e))?;
        let port = self.port_base + self.slot as u16;
        let ip = device.gids.iter().find_map(gid_ipv4).unwrap_or(Ipv4Addr::UNSPECIFIED);
        let l = t.listen(SocketAddrV4::new(ip, port)).map_err(|e| AcquireError::Raw(format!("{}: cannot listen on {ip}:{port} over {kind}", device.name), e))?;
        if self.accept_paused_until.load(Ordering::Acquire) == 0 {
            self.epoll.add(l.readiness(), TOKEN_LISTENER, EPOLL_IN).map_err(|e| AcquireError::Raw(format!("{}: epoll", device.name), e))?;
        }
        self.listeners.lock().push((ip, l));
        crate::uiw_log!(Info, "{}: QP streams go over uiw's TCP on {} ({}), port {port}", device.name, device.netdev, t.driver());
        let t = Arc::new(t);
        // The progress thread waits on the transport's socket and timer itself: an arriving
        // frame wakes the thread that serves the QP, not a thread of the transport's own.
        let mut turn = self.raw_turn.write();
        let tok = KIND_RAW | turn.len() as u64;
        for fd in t.fds() {
            self.epoll.add(fd, tok, EPOLL_IN).map_err(|e| AcquireError::Raw(format!("{}: epoll", device.name), e))?;
        }
        turn.push(t.clone());
        self.has_raw.store(true, Ordering::Release);
        self.raw_leases.lock().1.push(0);
        raw.insert(device.netdev.clone(), t);
        Ok(())
    }

    /// Starts serving a QP's stream on the progress thread.
    pub fn watch(&self, stream: &dyn Stream, qpn: u32) -> io::Result<()> {
        let fd = stream.readiness();
        self.watch_qp_fd(fd, qpn)?;
        self.watched.lock().insert(fd, qpn);
        // Its MPA negotiation has a deadline the progress thread must know of.
        self.wake();
        Ok(())
    }

    pub fn unwatch(&self, stream: &dyn Stream) {
        let fd = stream.readiness();
        self.watched.lock().remove(&fd);
        let _ = self.epoll.delete(fd);
    }

    /// Serves, from an application thread whose polls turn a raw transport's stack, the QPs
    /// (other than `skip`) whose streams the stack's turns fed since it last looked. Their
    /// eventfds fired too, but the progress thread is only being woken, while the polling
    /// thread may already be returning what its own QP read in the same turn: bytes that
    /// arrived earlier on another stream (perftest's credit Write, sent before its rdma_cm
    /// handshake) must not be placed after that. Kernel sockets need none of this: the
    /// application thread never reads their neighbours' bytes.
    ///
    /// Inlined down to the look at whether any raw transport runs (never, on kernel
    /// sockets): every poll of a spinning application asks (see [`Net::serve_leased`]).
    #[inline]
    pub fn serve_fed(&self, skip: &dyn Fn(u32) -> bool) {
        if self.has_raw.load(Ordering::Acquire) {
            self.serve_fed_raw(skip);
        }
    }

    #[inline(never)]
    fn serve_fed_raw(&self, skip: &dyn Fn(u32) -> bool) {
        let mut fds = Vec::new();
        for t in self.raw_turn.read().iter() {
            t.take_readable(&mut fds);
        }
        if fds.is_empty() {
            return;
        }
        let qpns: Vec<u32> = {
            let watched = self.watched.lock();
            fds.iter().filter_map(|fd| watched.get(fd).copied()).filter(|&q| !skip(q)).collect()
        };
        for qp in qpns.into_iter().filter_map(|q| self.lookup(q)) {
            qp.serve_aside();
        }
    }

    /// A lease transition of QP `qpn` (called under its lease lock): its socket leaves the
    /// epoll interest in arrivals (only room to send after a full socket, a hang-up or an
    /// error still report) or comes back — which raises at once whatever readiness built up
    /// meanwhile, so nothing that arrived during the lease waits for another arrival.
    ///
    /// A leased socket still reports `EPOLLOUT`: the kernel raises it only after a send found
    /// the socket full (and once as the interest changes), so the progress thread is woken
    /// for a leased QP only when a stream the poller could not write to has room again — the
    /// wait a blocking `send` would sleep through — and the poller stops retrying the full
    /// socket meanwhile (`Stream::signals_writable`).
    pub fn apply_arming(&self, qpn: u32, a: Arming) {
        let token = KIND_QP | u64::from(qpn);
        match a {
            Arming::Disarm(fd) | Arming::DisarmWhileAsleep(fd) => {
                let _ = self.epoll.delete(fd);
                self.raw_lease_start(qpn, fd);
                self.lease_set(|l| l.insert(qpn));
                // A poller's lease is checked when due; a sleeper hands the QP back as it wakes.
                if matches!(a, Arming::Disarm(_)) {
                    self.lease_news.store(true, Ordering::Release);
                    self.wake();
                }
            }
            Arming::Room { fd, on: true } => {
                // Reported at once if the socket takes bytes already.
                let room = (libc::EPOLLOUT | libc::EPOLLET) as u32;
                let _ = self.epoll.add(fd, token, room).or_else(|_| self.epoll.modify(fd, token, room));
            }
            Arming::Room { fd, on: false } => {
                let _ = self.epoll.delete(fd);
            }
            Arming::Rearm(fd) => {
                // Back with its pending readiness reported at once (arrivals while leased).
                let _ = self.watch_qp_fd(fd, qpn);
                self.raw_lease_end(qpn);
                self.lease_set(|l| l.remove(&qpn));
            }
            Arming::Forget => {
                self.raw_lease_end(qpn);
                self.lease_set(|l| l.remove(&qpn));
            }
            Arming::SpinOut(fd) => {
                let _ = self.epoll.delete(fd);
            }
            Arming::SpinIn(fd) => {
                let _ = self.watch_qp_fd(fd, qpn);
            }
        }
    }

    /// QP `qpn`'s stream readiness `fd` in the progress thread's set (added, or its interest
    /// restored if it is there): every readiness change, edge-triggered; what is pending
    /// already is reported at once.
    fn watch_qp_fd(&self, fd: i32, qpn: u32) -> io::Result<()> {
        let token = KIND_QP | u64::from(qpn);
        self.epoll.add(fd, token, EPOLL_SOCKET_EDGE).or_else(|_| self.epoll.modify(fd, token, EPOLL_SOCKET_EDGE))
    }

    /// Changes the set of leased QPs, and its glance with it.
    fn lease_set(&self, change: impl FnOnce(&mut HashSet<u32>) -> bool) {
        let mut leased = self.leased.lock();
        change(&mut leased);
        let glance = match leased.len() {
            0 => 0,
            1 => 1 << 32 | u64::from(leased.iter().next().copied().unwrap_or(0)),
            _ => 2 << 32,
        };
        self.leased_glance.store(glance, Ordering::Release);
    }

    /// Serves the leased QPs (see `lease`) that `skip` does not name and `due` picks, from
    /// the calling application thread. A leased stream's arrivals wake nobody: its poller
    /// reads them at its next poll of the QP's CQ — but a poller that moved on to another CQ
    /// (perftest's client, from its data QPs' send CQ to the rdma_cm handshake's) reads them
    /// only once the progress thread finds the lease lapsed, up to [`super::lease::CHECK_MAX_US`]
    /// later; and a doorbell left waiting for that poll rings as late, after WRs the
    /// application posted later to other QPs. A poll of another CQ and a doorbell that rings
    /// at once serve such QPs first, so that placement and the wire keep the application's
    /// order (an RNIC places a Write as it arrives and rings doorbells as they are written).
    ///
    /// Inlined down to the glance at the leases, which settles the common cases (nothing
    /// leased; only the caller's own QP): a poll that read a message and the post that
    /// answers it each ask, between the `recv` and the `send` of a ping-pong, and the
    /// call's frame (the collecting path's registers saved and restored) cost more than the
    /// glance.
    #[inline]
    pub fn serve_leased(&self, skip: &dyn Fn(u32) -> bool, due: &dyn Fn(&dyn Endpoint) -> bool) {
        match self.leased_glance.load(Ordering::Acquire) {
            0 => {}
            g if g >> 32 == 1 && skip(g as u32) => {}
            _ => self.serve_leased_others(skip, due),
        }
    }

    #[inline(never)]
    fn serve_leased_others(&self, skip: &dyn Fn(u32) -> bool, due: &dyn Fn(&dyn Endpoint) -> bool) {
        let qpns: Vec<u32> = {
            let leased = self.leased.lock();
            if leased.iter().all(|&q| skip(q)) {
                return;
            }
            leased.iter().copied().filter(|&q| !skip(q)).collect()
        };
        for qp in qpns.into_iter().filter_map(|q| self.lookup(q)) {
            if due(&*qp) {
                qp.serve_aside();
            }
        }
    }

    /// QP `qpn`, whose stream signals on `fd`, was claimed: if the stream is a raw
    /// transport's, that transport's socket leaves the progress thread's interest while any
    /// of its QPs is leased. The polling thread's turns receive every frame (the other
    /// streams' readiness is signalled as ever), the timer stays armed, and a lease that
    /// lapses brings the socket back ([`Net::raw_lease_end`]).
    fn raw_lease_start(&self, qpn: u32, fd: i32) {
        let turn = self.raw_turn.read();
        let Some(idx) = turn.iter().position(|t| t.owns_readiness(fd)) else { return };
        let mut l = self.raw_leases.lock();
        if l.0.insert(qpn, idx).is_none() {
            l.1[idx] += 1;
            if l.1[idx] == 1 {
                let _ = self.epoll.modify(turn[idx].fds()[0], KIND_RAW | idx as u64, 0);
            }
        }
    }

    /// The lease of QP `qpn` ended: the last one of a raw transport's brings its socket back
    /// (level-triggered: frames that wait are reported at once).
    fn raw_lease_end(&self, qpn: u32) {
        let mut l = self.raw_leases.lock();
        let Some(idx) = l.0.remove(&qpn) else { return };
        l.1[idx] -= 1;
        if l.1[idx] == 0 {
            if let Some(t) = self.raw_turn.read().get(idx) {
                let _ = self.epoll.modify(t.fds()[0], KIND_RAW | idx as u64, EPOLL_IN);
            }
        }
    }

    /// Whether the stream that signals on `fd` is a raw transport's: its frames reach it only
    /// through the turns of that transport's stack.
    pub fn raw_stream(&self, fd: i32) -> bool {
        self.raw_turn.read().iter().any(|t| t.owns_readiness(fd))
    }

    /// A poller renewed its lease at `now` (engine µs): if every lease is fresh, the lease
    /// alarm goes off no sooner than [`super::lease::alarm_ahead`] from now, and the progress
    /// thread sleeps on (see `lease`). At most one push per
    /// [`super::lease::ALARM_PUSH_EVERY_US`], by whichever poller comes first; a lease found
    /// lapsed leaves the alarm as the progress thread set it, to go off and check.
    ///
    /// A claim that races the push may see its first check later than its back-off would
    /// have put it, never later than [`super::lease::CHECK_MAX_US`] from the push.
    pub fn push_lease_alarm(&self, now: u64) {
        let Some(alarm) = &self.lease_alarm else { return };
        let after = self.alarm_push_after.load(Ordering::Relaxed);
        if now < after || self.stop.load(Ordering::Relaxed) {
            return;
        }
        let next = now + super::lease::ALARM_PUSH_EVERY_US;
        if self.alarm_push_after.compare_exchange(after, next, Ordering::Relaxed, Ordering::Relaxed).is_err() {
            // Another poller pushes.
            return;
        }
        let qpns: Vec<u32> = self.leased.lock().iter().copied().collect();
        let mut youngest: Option<u64> = None;
        for qpn in qpns {
            match self.lookup(qpn).map(|qp| qp.lease_alarm_view(now)) {
                Some(AlarmView::Lapsed) => return,
                Some(AlarmView::Fresh { since }) => youngest = Some(youngest.map_or(since, |y| y.max(since))),
                Some(AlarmView::Free) | None => {}
            }
        }
        if let Some(since) = youngest {
            let _ = alarm.arm(Duration::from_micros(super::lease::alarm_ahead(now, since)));
        }
    }

    /// The progress thread's lease deadline is `next` (engine µs; `None`: no lease to check):
    /// the alarm is set for it. Returns the deadline its `epoll_wait` must time out at for the
    /// leases — none with an alarm.
    fn set_lease_alarm(&self, now: u64, next: Option<u64>) -> Option<u64> {
        let Some(alarm) = &self.lease_alarm else { return next };
        let set = match next {
            Some(t) => alarm.arm(Duration::from_micros(t.saturating_sub(now))),
            None => alarm.disarm(),
        };
        // A timer that cannot be set: the deadline as a timeout, as without one.
        set.err().and(next)
    }

    /// Looks at the leases (due or new) at `now` (engine µs): the QPs handed back are queued
    /// to be served at once; returns when the next lease is due.
    fn check_leases(&self, now: u64, ready: &mut VecDeque<(u64, u32)>) -> Option<u64> {
        let qpns: Vec<u32> = self.leased.lock().iter().copied().collect();
        let mut next: Option<u64> = None;
        for qpn in qpns {
            let Some(qp) = self.lookup(qpn) else {
                self.raw_lease_end(qpn);
                self.lease_set(|l| l.remove(&qpn));
                continue;
            };
            match qp.lease_check(now) {
                Check::HeldUntil(t) => next = earliest(next, Some(t)),
                Check::Asleep => {}
                Check::Free => {
                    let tok = KIND_QP | u64::from(qpn);
                    if !ready.iter().any(|r| r.0 == tok) {
                        ready.push_back((tok, 0));
                    }
                }
            }
        }
        next
    }

    /// The progress thread. It sleeps in `epoll_wait` until a socket is ready or a stream's
    /// deadline (MPA negotiation) is due: an idle process takes no periodic wake-ups.
    fn run(self: Arc<Net>) {
        let mut evs = Vec::with_capacity(64);
        let mut ready: VecDeque<(u64, u32)> = VecDeque::new();
        // When the next deadline is due (engine ms); None: no stream needs the clock.
        let mut next_due: Option<u64> = None;
        // When the next application lease is due (engine µs; see `lease`), if the lease alarm
        // does not tell (no timer).
        let mut next_lease: Option<u64> = None;
        // Polls without sleeping for a few µs after answered traffic (see `spin`).
        let mut spin = Spin::from_env();
        // The QP that answered last: within a window, most polls read its stream itself
        // (see `spin::Spin::looks_at_set`).
        let mut hot: Option<u32> = None;
        // The QP whose socket is out of the set while this thread spins on its stream (see
        // `spin`).
        let mut spun_out: Option<u32> = None;
        // Read inside a window, every `spin::CROWD_CHECK_US` (see `spin::crowded`); none with
        // the window off.
        let mut loadavg = if spin.enabled() { std::fs::File::open("/proc/loadavg").ok() } else { None };
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        // Keeps this thread off the CPU the application polls on (see `affinity`).
        let mut dodge = super::affinity::Dodge::from_env();
        // The engine clock, read once a turn, after its serves: a turn of a spinning thread
        // (a poll that finds nothing) is a system call and little else, and three more clock
        // reads made it a fifth longer. The next turn's wait is computed from this reading.
        let mut now = now_us();
        while !self.stop.load(Ordering::Acquire) {
            evs.clear();
            let mut polled = false;
            let mut alarm_rang = false;
            let timeout = if !ready.is_empty() {
                Some(Duration::ZERO)
            } else if spin.enabled() && spin.poll(now, || spin::crowded(&mut loadavg, cpus)) {
                polled = true;
                Some(Duration::ZERO)
            } else {
                let due = next_due.map(|t| t.saturating_mul(1000));
                let paced = self.paced.lock().iter().map(|e| e.1).min();
                earliest(earliest(due, next_lease), paced).map(|t| Duration::from_micros(t.saturating_sub(now)))
            };
            let direct = match hot {
                Some(q) if polled && !spin.looks_at_set() => Some(q),
                _ => None,
            };
            // The spun-out socket comes back before a wait that may sleep (reporting what came
            // meanwhile), or when another stream is the hot one.
            if let Some(q) = spun_out.filter(|&q| timeout != Some(Duration::ZERO) || hot != Some(q)) {
                if let Some(qp) = self.lookup(q) {
                    qp.spin_in();
                }
                spun_out = None;
            }
            if let Some(q) = direct.filter(|&q| spun_out != Some(q)) {
                if self.lookup(q).is_some_and(|qp| qp.spin_out()) {
                    spun_out = Some(q);
                }
            }
            if let Some(q) = direct {
                match self.lookup(q) {
                    Some(qp) if qp.progress(false, false) == Progress::More => ready.push_back((KIND_QP | u64::from(q), 0)),
                    Some(_) => {}
                    None => hot = None,
                }
            } else if self.epoll.wait_for(&mut evs, timeout).is_err() {
                std::thread::sleep(Duration::from_millis(10));
            }
            let qp_traffic = !evs.is_empty();
            let qp_events = dodge.is_some() && evs.iter().any(|&(tok, _)| tok & KIND_MASK == KIND_QP);
            for &(tok, flags) in &evs {
                match ready.iter_mut().find(|r| r.0 == tok) {
                    Some(r) => r.1 |= flags,
                    None => ready.push_back((tok, flags)),
                }
            }
            self.take_requeued(&mut ready);
            for _ in 0..ready.len() {
                let Some((tok, flags)) = ready.pop_front() else { break };
                let more = match tok & KIND_MASK {
                    KIND_QP => self.lookup(tok as u32).is_some_and(|qp| {
                        let hup = flags & EPOLL_HUP_FLAGS != 0;
                        let writable = flags & libc::EPOLLOUT as u32 != 0;
                        qp.progress(hup, writable) == Progress::More
                    }),
                    KIND_PENDING => {
                        self.serve_pending(tok & !KIND_MASK);
                        false
                    }
                    KIND_CLOSING => {
                        self.serve_closing(tok & !KIND_MASK, now_ms());
                        false
                    }
                    KIND_RAW => {
                        // Level-triggered: what this turn leaves in the ring reports again.
                        let t = self.raw_turn.read().get((tok & !KIND_MASK) as usize).cloned();
                        if let Some(t) = t {
                            self.turn_and_serve(&t, &mut ready);
                        }
                        false
                    }
                    KIND_CM_LISTEN => {
                        self.cm_accept_all(tok & !KIND_MASK);
                        false
                    }
                    _ if tok == TOKEN_LISTENER => {
                        self.accept_all();
                        next_due = Some(0);
                        false
                    }
                    _ if tok == TOKEN_LEASE_ALARM => {
                        // The leases are checked below; setting the alarm again there takes
                        // back its expiry.
                        alarm_rang = true;
                        false
                    }
                    _ => {
                        // Woken: a stream with a deadline may have started.
                        self.waker.drain();
                        next_due = Some(0);
                        false
                    }
                };
                if more {
                    ready.push_back((tok, 0));
                }
            }
            now = now_us();
            if let Some(d) = dodge.as_mut().filter(|_| qp_events) {
                d.turn(now);
            }
            // Only a turn that answered something opens a window (see `spin`).
            let answered = match self.answered.load(Ordering::Relaxed) {
                0 => None,
                _ => Some(self.answered.swap(0, Ordering::Relaxed)).filter(|&a| a != 0).map(|a| a as u32),
            };
            // A read of the hot stream that answered is traffic this thread served, as an
            // event of the set would have been.
            let served_hot = direct.is_some() && answered == direct;
            if (qp_traffic || served_hot) && spin.enabled() {
                spin.turn(now, polled, answered.is_some());
            }
            hot = answered.or(hot);
            let now_ms = now / 1000;
            if next_due.is_some_and(|t| t <= now_ms) {
                next_due = self.sweep(now_ms);
            }
            // Leases last, after the waker was read: a claim sets `lease_news` before it
            // writes the waker, so news whose wake-up byte this turn consumed is seen here
            // (looked at before the read, it could be missed, and the thread would sleep
            // with a lease nobody checks). QPs handed back are served on the next turn.
            if super::flag::take(&self.lease_news) || alarm_rang || next_lease.is_some_and(|t| t <= now) {
                let next = self.check_leases(now, &mut ready);
                next_lease = self.set_lease_alarm(now, next);
            }
            // Paced streams whose deadline came are served on the next turn (see `pace`).
            self.serve_paced(now, &mut ready);
        }
    }

    /// The progress thread's turn of raw transport `t`: the QP streams the turn has news for
    /// are served right here, not signalled through their eventfds to be found by the next
    /// `epoll_wait` — an arrival for a passive target costs one wake-up and no eventfd write.
    /// A QP whose budget ran out goes back on `ready`. Streams that are not QPs' (pending MPA
    /// negotiations, closing streams) are signalled as ever.
    fn turn_and_serve(&self, t: &RawTcp, ready: &mut VecDeque<(u64, u32)>) {
        let mut served = Vec::new();
        let qpns: Vec<u32> = {
            let watched = self.watched.lock();
            t.turn_serving(&|fd| watched.contains_key(&fd), &mut served);
            served.iter().filter_map(|fd| watched.get(fd).copied()).collect()
        };
        for qpn in qpns {
            // As if its descriptor had fired: arrivals, or room after a send found none.
            if self.lookup(qpn).is_some_and(|qp| qp.progress(false, true) == Progress::More) {
                let tok = KIND_QP | u64::from(qpn);
                if !ready.iter().any(|r| r.0 == tok) {
                    ready.push_back((tok, 0));
                }
            }
        }
    }

    /// QP `qpn`'s stream is paced (see `pace`): serve it again at `at` (engine µs) whatever
    /// came. Called by the progress thread's own serves; a new entry also wakes the thread,
    /// so that a caller elsewhere cannot leave it asleep past the deadline.
    pub fn pace(&self, qpn: u32, at: u64) {
        let mut p = self.paced.lock();
        match p.iter_mut().find(|e| e.0 == qpn) {
            Some(e) => e.1 = at,
            None => {
                p.push((qpn, at));
                drop(p);
                self.wake();
            }
        }
    }

    /// The paced streams due at `now` come down and are queued to be served (one whose QP
    /// another thread holds is asked again a deadline later).
    fn serve_paced(&self, now: u64, ready: &mut VecDeque<(u64, u32)>) {
        let due: Vec<u32> = {
            let mut p = self.paced.lock();
            let due = p.iter().filter(|e| e.1 <= now).map(|e| e.0).collect();
            p.retain(|e| e.1 > now);
            due
        };
        for qpn in due {
            let Some(qp) = self.lookup(qpn) else { continue };
            if qp.pace_due() {
                let tok = KIND_QP | u64::from(qpn);
                if !ready.iter().any(|r| r.0 == tok) {
                    ready.push_back((tok, 0));
                }
            } else {
                self.pace(qpn, now + super::pace::DEADLINE_US);
            }
        }
    }

    /// QP `qpn` has input left that no readiness event will report (a pump stopped at its
    /// receive budget): the progress thread serves it on its next turn, after the QPs
    /// already queued.
    pub fn requeue(&self, qpn: u32) {
        self.requeued.lock().push(qpn);
        self.wake();
    }

    /// Moves the requeued QPs to the progress thread's queue (once each).
    fn take_requeued(&self, ready: &mut VecDeque<(u64, u32)>) {
        for qpn in self.requeued.lock().drain(..) {
            let tok = KIND_QP | u64::from(qpn);
            if !ready.iter().any(|r| r.0 == tok) {
                ready.push_back((tok, 0));
            }
        }
    }

    /// Wakes the progress thread so that it looks at the streams' deadlines again.
    pub fn wake(&self) {
        self.waker.wake();
    }

    /// A pump answered a message on QP `qpn`'s stream (see `answered`).
    pub fn note_answered(&self, qpn: u32) {
        self.answered.store(1 << 32 | u64::from(qpn), Ordering::Relaxed);
    }

    /// The child's side of [`fork_child`]: closes this process's copies of every descriptor
    /// of the parent's transport that safe code owns, skipping what a parent thread held
    /// locked at the fork.
    fn abandon(&self) {
        self.stop.store(true, Ordering::Release);
        if let Some(mut l) = self.listeners.try_lock() {
            l.clear();
        }
        // A raw transport (its stack, its lock, its XDP link) is the parent's: dropping it
        // here would take a lock a parent thread may have held at the fork.
        if let Some(mut r) = self.raw.try_lock() {
            for (_, t) in r.drain() {
                std::mem::forget(t);
            }
        }
        if let Some(mut r) = self.raw_turn.try_write() {
            for t in r.drain(..) {
                std::mem::forget(t);
            }
        }
        if let Some(mut p) = self.pending.try_lock() {
            for (_, (p, _)) in p.drain() {
                p.stream.abandon();
            }
        }
        if let Some(mut c) = self.closing.try_lock() {
            for (_, l) in c.drain() {
                l.stream.abandon();
            }
        }
        // A raw listener belongs to the parent's stack (forgotten above).
        if let Some(mut c) = self.cm_listeners.try_lock() {
            for (_, l) in c.drain() {
                std::mem::forget(l);
            }
        }
        let qps: Vec<Arc<dyn Endpoint>> = match self.qps.try_read() {
            Some(q) => q.values().filter_map(Weak::upgrade).collect(),
            None => Vec::new(),
        };
        for qp in qps {
            qp.abandon();
        }
    }

    /// Another device's addresses: listen there too, on the same port (a QP number names the
    /// port, whatever the address).
    fn listen_on(&self, addrs: &[Ipv4Addr]) {
        let mut ls = self.listeners.lock();
        if ls.iter().any(|(a, _)| a.is_unspecified()) {
            return;
        }
        let port = self.port_base + self.slot as u16;
        for a in addrs {
            if ls.iter().any(|(b, _)| b == a) {
                continue;
            }
            match KernelTcp.listen(SocketAddrV4::new(*a, port)) {
                Ok(l) => {
                    if self.accept_paused_until.load(Ordering::Acquire) == 0 {
                        let _ = self.epoll.add(l.readiness(), TOKEN_LISTENER, EPOLL_IN);
                    }
                    ls.push((*a, l));
                }
                Err(e) => crate::uiw_log!(Warn, "cannot listen on {a}:{port} for QPs: {e}"),
            }
        }
    }

    fn accept_all(&self) {
        let mut accepted = Vec::new();
        let mut exhausted = false;
        for (_, l) in self.listeners.lock().iter() {
            loop {
                match l.accept() {
                    Ok(stream) => accepted.push(stream),
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                    // Out of descriptors (or memory): the connection stays in the backlog and
                    // the listener readable; looking again at once would spin.
                    Err(e) if matches!(e.raw_os_error(), Some(libc::EMFILE | libc::ENFILE | libc::ENOBUFS | libc::ENOMEM)) => {
                        exhausted = true;
                        break;
                    }
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    // ECONNABORTED and the like: that connection is gone, the next may be fine.
                    Err(_) => {}
                }
            }
        }
        if exhausted {
            self.pause_accepting();
        }
        for stream in accepted {
            let conn = Connection::new(config(Role::Responder, 0, 0, Vec::new(), stream.mss()), now_ms());
            let id = self.next_pending.fetch_add(1, Ordering::Relaxed);
            if self.epoll.add(stream.readiness(), KIND_PENDING | id, EPOLL_SOCKET_EDGE).is_err() {
                continue;
            }
            self.make_room();
            self.pending.lock().insert(id, (Pending::new(conn, stream), None));
            self.serve_pending(id);
        }
    }

    /// Takes the listeners out of the epoll set for [`ACCEPT_PAUSE_MS`] (the sweep puts them
    /// back) and drops the oldest stream still waiting for its MPA Request, freeing a
    /// descriptor.
    fn pause_accepting(&self) {
        crate::uiw_log!(Warn, "out of file descriptors: not accepting QP connections for {ACCEPT_PAUSE_MS} ms");
        for (_, l) in self.listeners.lock().iter() {
            let _ = self.epoll.delete(l.readiness());
        }
        self.accept_paused_until.store(now_ms() + ACCEPT_PAUSE_MS, Ordering::Release);
        self.drop_oldest_pending();
        self.wake();
    }

    fn drop_oldest_pending(&self) {
        let mut pending = self.pending.lock();
        let oldest = pending.iter().filter(|(_, (_, cm))| cm.is_none()).map(|(id, _)| *id).min();
        if let Some(id) = oldest {
            if let Some((p, _)) = pending.remove(&id) {
                self.unwatch(&*p.stream);
            }
        }
    }

    /// At most [`MAX_PENDING`] accepted streams wait for their MPA Request: the oldest goes
    /// (a flood of stalled connections cannot take every descriptor).
    fn make_room(&self) {
        let n = self.pending.lock().values().filter(|(_, cm)| cm.is_none()).count();
        if n >= MAX_PENDING {
            self.drop_oldest_pending();
        }
    }

    /// rdma_listen on a device whose streams go over a userspace transport: `l` (a listener of
    /// the device's [`Connector`]) is served by the progress thread, which gives every stream
    /// it accepts to `cm` and, if taken, waits for its MPA Request ([`Net::cm_passive`]).
    /// Returns the id for [`Net::cm_unlisten`].
    pub fn cm_listen(&self, l: Box<dyn Listener>, cm: Arc<CmListen>) -> io::Result<u64> {
        let id = self.next_pending.fetch_add(1, Ordering::Relaxed);
        let fd = l.readiness();
        self.cm_listeners.lock().insert(id, (l, cm));
        if let Err(e) = self.epoll.add(fd, KIND_CM_LISTEN | id, EPOLL_IN) {
            self.cm_listeners.lock().remove(&id);
            return Err(e);
        }
        Ok(id)
    }

    /// Stops an rdma_cm listener: no callback of its [`CmListen`] runs after this returns
    /// (unless called from one: the progress thread may be inside it).
    pub fn cm_unlisten(&self, id: u64) {
        let gone = self.cm_listeners.lock().remove(&id);
        if let Some((l, cm)) = gone {
            let _ = self.epoll.delete(l.readiness());
            cm.release();
        }
    }

    fn cm_accept_all(&self, id: u64) {
        let mut accepted = Vec::new();
        let cm = {
            let ls = self.cm_listeners.lock();
            let Some((l, cm)) = ls.get(&id) else { return };
            loop {
                match l.accept() {
                    Ok(s) => accepted.push(s),
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(_) => break,
                }
            }
            cm.clone()
        };
        for stream in accepted {
            let (Some(local), Some(remote)) = (stream.local(), stream.peer()) else { continue };
            match cm.incoming(local, remote) {
                Some(conn) => {
                    if self.cm_passive(stream, conn.clone()).is_err() {
                        conn.ended(CmStatus::LocalError);
                    }
                }
                None => drop(stream),
            }
        }
    }

    /// A stream the librdmacm drop-in accepted: wait for its MPA Request, then report it.
    pub fn cm_passive(&self, stream: Box<dyn Stream>, cm: Arc<CmConn>) -> io::Result<()> {
        let conn = Connection::new(config(Role::Responder, 0, 0, Vec::new(), stream.mss()), now_ms());
        let id = self.next_pending.fetch_add(1, Ordering::Relaxed);
        let fd = stream.readiness();
        self.pending.lock().insert(id, (Pending::new(conn, stream), Some(cm)));
        if let Err(e) = self.epoll.add(fd, KIND_PENDING | id, EPOLL_SOCKET_EDGE) {
            self.pending.lock().remove(&id);
            return Err(e);
        }
        self.wake();
        Ok(())
    }

    fn serve_pending(&self, id: u64) {
        let Some((mut p, cm)) = self.pending.lock().remove(&id) else {
            return;
        };
        match p.read_request() {
            None => {
                self.pending.lock().insert(id, (p, cm));
            }
            Some(Err(())) => {
                self.unwatch(&*p.stream);
                if let Some(cm) = &cm {
                    cm.ended(CmStatus::Reset);
                }
            }
            Some(Ok(req)) if cm.is_some() => {
                let cm = cm.unwrap();
                let (ird, ord) = req.ird_ord.map(|w| (w.ird, w.ord)).unwrap_or((1, 1));
                *cm.pending.lock() = Some(p);
                cm.connect_request(&req.private_data, ird, ord);
            }
            Some(Ok(req)) => match QpHello::parse(&req.private_data).and_then(|h| self.lookup(h.to_qpn).map(|q| (h, q))) {
                Some((hello, qp)) => {
                    if let Err(p) = qp.offer(self, hello, p) {
                        self.unwatch(&*p.stream);
                        self.linger(p.rejected(&[]));
                    }
                }
                None => {
                    self.unwatch(&*p.stream);
                    self.linger(p.rejected(&[]));
                }
            },
        }
    }

    /// Closes a stopped QP's stream in order, without blocking anybody: `c.bytes` (the end of
    /// the last FPDU, the Terminate) are written as the socket takes them, then FIN, then what
    /// the peer still sends is read and dropped until its FIN (closing with unread data would
    /// reset the connection and could destroy the Terminate in flight) or [`LINGER_MS`].
    pub fn linger(&self, c: Closing) {
        let id = self.next_pending.fetch_add(1, Ordering::Relaxed);
        let fd = c.stream.readiness();
        let l = Lingering { stream: c.stream, bytes: c.bytes, sent: 0, fin: false, deadline: now_ms() + LINGER_MS };
        self.closing.lock().insert(id, l);
        if self.epoll.add(fd, KIND_CLOSING | id, EPOLL_SOCKET_EDGE).is_err() {
            self.closing.lock().remove(&id);
            return;
        }
        self.serve_closing(id, now_ms());
        // The progress thread takes the new deadline.
        self.wake();
    }

    fn serve_closing(&self, id: u64, now: u64) {
        let mut closing = self.closing.lock();
        let Some(l) = closing.get_mut(&id) else { return };
        let done = loop {
            if l.sent < l.bytes.len() {
                match l.stream.write(&l.bytes[l.sent..]) {
                    Ok(n) => {
                        l.sent += n;
                        continue;
                    }
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break now >= l.deadline,
                    Err(_) => break true,
                }
            }
            if !l.fin {
                l.fin = true;
                l.stream.shutdown_write();
            }
            let mut b = [0u8; 4096];
            match l.stream.recv(&mut b) {
                Ok(0) => break true,
                Ok(_) => continue,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break now >= l.deadline,
                Err(_) => break true,
            }
        };
        if done {
            if let Some(l) = closing.remove(&id) {
                let _ = self.epoll.delete(l.stream.readiness());
            }
        }
    }

    /// MPA timeouts of streams still negotiating; returns when the next one is due.
    fn sweep(&self, now: u64) -> Option<u64> {
        let mut next: Option<u64> = None;
        let mut due = |t: Option<u64>| next = earliest(next, t);
        let paused = self.accept_paused_until.load(Ordering::Acquire);
        if paused != 0 {
            if now >= paused {
                self.accept_paused_until.store(0, Ordering::Release);
                for (_, l) in self.listeners.lock().iter() {
                    let _ = self.epoll.add(l.readiness(), TOKEN_LISTENER, EPOLL_IN);
                }
            } else {
                due(Some(paused));
            }
        }
        let ids: Vec<u64> = self.closing.lock().iter().filter(|(_, l)| now >= l.deadline).map(|(id, _)| *id).collect();
        for id in ids {
            self.serve_closing(id, now);
        }
        for l in self.closing.lock().values() {
            due(Some(l.deadline));
        }
        let qps: Vec<Arc<dyn Endpoint>> = self.qps.read().values().filter_map(Weak::upgrade).collect();
        for qp in qps {
            qp.handle_timeout(now);
            due(qp.next_timeout());
        }
        let mut expired = Vec::new();
        {
            let mut pending = self.pending.lock();
            for (id, (p, _)) in pending.iter_mut() {
                if p.conn.poll_timeout().is_some_and(|d| d <= now) {
                    p.conn.handle_timeout(now);
                }
                if p.conn.wants_close() {
                    expired.push(*id);
                } else {
                    due(p.conn.poll_timeout());
                }
            }
            for id in &expired {
                if let Some((p, _)) = pending.remove(id) {
                    self.unwatch(&*p.stream);
                }
            }
        }
        next
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A QP whose pump stopped at its receive budget outside the progress thread is queued
    /// for it once, behind what is queued already, and the thread is woken to take it.
    #[test]
    fn a_requeued_qp_is_served_on_the_next_turn() {
        let mem: &'static crate::engine::datapath::testkit::Arena = Box::leak(Box::new(crate::engine::datapath::testkit::Arena::new(0)));
        let net = Net::start(mem, &[Ipv4Addr::LOCALHOST]).expect("a transport on loopback");
        let mut ready: VecDeque<(u64, u32)> = VecDeque::from([(KIND_QP | 9, 1)]);
        net.requeue(5);
        net.requeue(9);
        net.requeue(5);
        let mut b = [0u8; 1];
        assert_eq!(uiw_kabi::sys::recv_dontwait(&net.waker.rx, &mut b).unwrap(), 1, "the progress thread is woken");
        net.take_requeued(&mut ready);
        assert_eq!(Vec::from(ready.clone()), vec![(KIND_QP | 9, 1), (KIND_QP | 5, 0)]);
        net.take_requeued(&mut ready);
        assert_eq!(ready.len(), 2, "taken once");
    }

    /// Nobody drains the waker here (no progress thread): far more wakes than the socket holds
    /// must still all return, and the waker must still be readable (a wake pending).
    #[test]
    fn wake_never_blocks_when_the_waker_is_full() {
        let w = Waker::new().unwrap();
        let (done, finished) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for _ in 0..10_000 {
                w.wake();
            }
            let _ = done.send(w);
        });
        // Not a timing assertion: the wakes take microseconds; a blocked write never returns.
        let w = finished.recv_timeout(Duration::from_secs(60)).expect("wake() blocked on a full waker");
        let mut b = [0u8; 1];
        assert_eq!(uiw_kabi::sys::recv_dontwait(&w.rx, &mut b).unwrap(), 1, "a wake is pending");
        w.drain();
        assert_eq!(uiw_kabi::sys::recv_dontwait(&w.rx, &mut b).unwrap(), 0, "drain takes every wake");
    }

    /// A leased QP's socket leaves the progress thread's set — but while its stream is full,
    /// the progress thread must still hear when the socket takes bytes again (the poller
    /// stopped offering them), or nobody may send them until the poller is back on its CPU.
    /// Handed back, it reports the arrivals of the lease at once.
    #[test]
    fn a_leased_socket_reports_room_to_send_only_while_full() {
        let mem: &'static crate::engine::datapath::testkit::Arena = Box::leak(Box::new(crate::engine::datapath::testkit::Arena::new(0)));
        let net = Net::start(mem, &[Ipv4Addr::LOCALHOST]).expect("a transport on loopback");
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let ours = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (theirs, _) = l.accept().unwrap();
        let stream = super::super::transport::kernel::KernelStream::prepare(ours).unwrap();
        net.watch(&stream, 7).unwrap();
        let token = KIND_QP | 7;
        let mut evs = Vec::new();
        net.epoll.wait_for(&mut evs, Some(Duration::ZERO)).unwrap();
        let fd = stream.readiness();
        let flags = |evs: &mut Vec<(u64, u32)>| {
            evs.clear();
            net.epoll.wait_for(evs, Some(Duration::ZERO)).unwrap();
            evs.iter().filter(|e| e.0 == token).map(|e| e.1).fold(0, |a, b| a | b)
        };
        net.apply_arming(7, Arming::Disarm(fd));
        // Neither an arrival nor room is reported while leased…
        (&theirs).write_all(b"x").unwrap();
        assert_eq!(flags(&mut evs), 0, "a leased socket woke the progress thread");
        // …but room is while the stream is full.
        net.apply_arming(7, Arming::Room { fd, on: true });
        let f = flags(&mut evs);
        assert_eq!(f & libc::EPOLLIN as u32, 0, "a leased socket's arrivals wake the progress thread");
        assert_ne!(f & libc::EPOLLOUT as u32, 0, "a full leased socket's room to send is not reported");
        net.apply_arming(7, Arming::Room { fd, on: false });
        (&theirs).write_all(b"y").unwrap();
        assert_eq!(flags(&mut evs), 0, "a leased socket with room woke the progress thread");
        // Handed back: what arrived meanwhile is reported.
        net.apply_arming(7, Arming::Rearm(fd));
        assert_ne!(flags(&mut evs) & libc::EPOLLIN as u32, 0, "the lease's arrivals are lost");
        // A reader's sleep takes it out of the set too, with no lease check to schedule: the
        // progress thread is not woken for it.
        net.waker.drain();
        net.apply_arming(7, Arming::DisarmWhileAsleep(fd));
        (&theirs).write_all(b"z").unwrap();
        assert_eq!(flags(&mut evs), 0, "a socket held by a sleeping reader woke the progress thread");
        let mut b = [0u8; 1];
        assert_eq!(uiw_kabi::sys::recv_dontwait(&net.waker.rx, &mut b).unwrap(), 0, "the progress thread was woken for a sleeper's hold");
        drop(theirs);
    }
}
