//! The process's transport: one listening TCP port, the QP number space, and the progress
//! thread that serves every QP's socket (so a passive RDMA Write/Read target that never calls
//! into libibverbs still places data and answers Reads).
//!
//! **Addressing without rdma_cm.** A QP number is `slot << 12 | index`: the process listens on
//! `UIW_PORT_BASE + slot` (default base 20000; the first free port of 4096), so a peer that
//! knows our IPv4 address (the GID) and QP number — all perftest and `ibv_rc_pingpong` exchange
//! — knows where to connect. Of the two QPs moved to RTR towards each other, the one with the
//! lower (IPv4 address, QPN) opens the TCP stream and sends the MPA Request; its private data
//! names both QPs ([`QpHello`]), so the listener hands the stream to the right QP, parking it
//! until that QP reaches RTR if it has not yet.

use std::collections::{HashMap, VecDeque};
use std::io::{self, Read, Write};
use std::net::{Ipv4Addr, SocketAddrV4, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock, Weak};
use std::time::{Duration, Instant};

use parking_lot::{Mutex, RwLock};
use uiw_kabi::sys::{Epoll, EPOLL_IN, EPOLL_SOCKET_EDGE};
use uiw_wire::conn::{Config, ConnectRequest, Connection, Event, Role, RxWant};
use uiw_wire::placement::{Access, Memory};
use uiw_wire::TaggedError;

use super::cm::CmConn;
use super::context::{Progress, Qp};
use super::dma::Dma;

/// Default first port of the QP-number port range (`UIW_PORT_BASE`).
pub const DEFAULT_PORT_BASE: u16 = 20000;
/// Ports (slots) a process may take: 12 bits of the 24-bit QPN.
pub const SLOTS: u32 = 4096;
/// QPs per process: the other 12 bits (index 0 is never used).
pub const INDEXES: u32 = 4096;

const TOKEN_LISTENER: u64 = 0;
const TOKEN_WAKE: u64 = 1;
const KIND_QP: u64 = 1 << 32;
const KIND_PENDING: u64 = 2 << 32;
const KIND_MASK: u64 = 0xffff_ffff << 32;

/// Milliseconds on the engine's clock (the protocol core's `now_ms`).
pub fn now_ms() -> u64 {
    static START: OnceLock<Instant> = OnceLock::new();
    START.get_or_init(Instant::now).elapsed().as_millis() as u64
}

/// The MPA private data of an RTR-initiated connection: which QP connects to which.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QpHello {
    /// The QP the stream is for (the responder's).
    pub to_qpn: u32,
    /// The QP that opened it.
    pub from_qpn: u32,
}

impl QpHello {
    const MAGIC: [u8; 4] = *b"uiwQ";
    pub const LEN: usize = 12;

    pub fn encode(&self) -> Vec<u8> {
        let mut v = Self::MAGIC.to_vec();
        v.extend_from_slice(&self.to_qpn.to_be_bytes());
        v.extend_from_slice(&self.from_qpn.to_be_bytes());
        v
    }

    pub fn parse(b: &[u8]) -> Option<QpHello> {
        if b.len() < Self::LEN || b[..4] != Self::MAGIC {
            return None;
        }
        Some(QpHello { to_qpn: u32::from_be_bytes(b[4..8].try_into().ok()?), from_qpn: u32::from_be_bytes(b[8..12].try_into().ok()?) })
    }
}

/// Whether this side opens the stream: the lower (address, QPN) does.
pub fn is_initiator(local: Ipv4Addr, qpn: u32, remote: Ipv4Addr, dest_qpn: u32) -> bool {
    (u32::from(local), qpn) < (u32::from(remote), dest_qpn)
}

/// Where the QP `qpn` of the process at `ip` listens.
pub fn qp_address(ip: Ipv4Addr, qpn: u32, base: u16) -> Option<SocketAddrV4> {
    let port = u32::from(base) + (qpn >> 12);
    (port <= 0xffff && qpn >> 12 < SLOTS).then(|| SocketAddrV4::new(ip, port as u16))
}

/// The protocol settings of a uiw connection (MPA v2, RFC 7306 offered, CRC if `UIW_CRC=1`).
pub fn config(role: Role, ird: u16, ord: u16, private_data: Vec<u8>, mss: usize) -> Config {
    let mut c = Config::new(role);
    c.extensions = true;
    c.crc = std::env::var("UIW_CRC").is_ok_and(|v| v == "1");
    c.ird = ird;
    c.ord = ord;
    c.private_data = private_data;
    c.mss = mss.max(536);
    c.manual_accept = role == Role::Responder;
    c.mpa_timeout_ms = 60_000;
    c
}

/// Sets up a stream socket as the data path wants it: non-blocking, no Nagle.
pub fn prepare(s: &TcpStream) -> io::Result<usize> {
    s.set_nonblocking(true)?;
    s.set_nodelay(true)?;
    Ok(uiw_kabi::sys::tcp_maxseg(s).unwrap_or(1460) as usize)
}

/// A stream accepted by the listener whose MPA Request has not been matched to a QP yet.
pub struct Pending {
    pub conn: Connection,
    pub sock: TcpStream,
    stage: Vec<u8>,
    /// Handed over by the librdmacm drop-in (else: our listener, an RTR connection).
    cm: Option<Arc<CmConn>>,
}

impl Pending {
    /// Rejects the stream's Request (MPA Reply with R=1 and `private_data`, best effort) and
    /// closes it (closing also takes it out of the progress thread's epoll set).
    pub fn reject(mut self, private_data: &[u8]) {
        let _ = self.conn.reject(private_data);
        let mut out = Vec::new();
        while let Some(uiw_wire::conn::Tx::Bytes(b)) = self.conn.next_tx() {
            out.extend_from_slice(&b);
        }
        let _ = self.sock.set_nonblocking(false);
        let _ = self.sock.set_write_timeout(Some(Duration::from_millis(200)));
        let _ = self.sock.write_all(&out);
        let _ = self.sock.shutdown(std::net::Shutdown::Both);
    }

    /// Reads the MPA Request; `Some(Ok(request))` once it has arrived, `Some(Err(()))` if the
    /// stream failed.
    fn read_request(&mut self) -> Option<Result<ConnectRequest, ()>> {
        loop {
            while let Some(ev) = self.conn.poll_event() {
                match ev {
                    Event::ConnectRequest(r) => return Some(Ok(r)),
                    Event::Failed(_) | Event::Rejected { .. } | Event::Terminated { .. } | Event::Closed => return Some(Err(())),
                    _ => {}
                }
            }
            let n = match self.conn.rx_want() {
                RxWant::Bytes(n) => n,
                RxWant::Wait => return None,
                _ => return Some(Err(())),
            };
            self.stage.resize(n, 0);
            match self.sock.read(&mut self.stage[..n]) {
                Ok(0) => return Some(Err(())),
                Ok(k) => {
                    let chunk = self.stage[..k].to_vec();
                    self.conn.rx_bytes(&chunk, &mut NoMemory);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return None,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => return Some(Err(())),
            }
        }
    }
}

/// No memory is reachable before a stream belongs to a QP.
struct NoMemory;

impl Memory for NoMemory {
    fn check_tagged(&self, _: u32, _: u64, _: u32, _: Access) -> Result<(), TaggedError> {
        Err(TaggedError::InvalidStag)
    }
}

/// The process-wide transport.
pub struct Net {
    epoll: Epoll,
    listener: TcpListener,
    pub port_base: u16,
    pub slot: u32,
    qps: RwLock<HashMap<u32, Weak<Qp>>>,
    free: Mutex<VecDeque<u32>>,
    pending: Mutex<HashMap<u64, Pending>>,
    next_pending: AtomicU64,
    pub dma: &'static dyn Dma,
    stop: AtomicBool,
    waker: (UnixStream, UnixStream),
}

/// The running transport and how many device contexts use it.
struct Running {
    net: Arc<Net>,
    users: usize,
    thread: Option<std::thread::JoinHandle<()>>,
}

static NET: Mutex<Option<Running>> = Mutex::new(None);

impl Net {
    /// The transport, started by its first user (listener bound, progress thread running).
    /// Each [`Net::acquire`] is paired with a [`Net::release`]; the last release stops it.
    pub fn acquire(dma: &'static dyn Dma) -> Result<Arc<Net>, String> {
        let mut g = NET.lock();
        if let Some(r) = g.as_mut() {
            r.users += 1;
            return Ok(r.net.clone());
        }
        let net = Arc::new(Net::start(dma)?);
        let n = net.clone();
        let thread = std::thread::Builder::new().name("uiw-progress".into()).spawn(move || n.run()).map_err(|e| e.to_string())?;
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
        let _ = (&r.net.waker.0).write_all(b"x");
        if let Some(t) = r.thread.take() {
            let _ = t.join();
        }
    }

    fn start(dma: &'static dyn Dma) -> Result<Net, String> {
        let base = std::env::var("UIW_PORT_BASE").ok().and_then(|v| v.parse::<u16>().ok()).unwrap_or(DEFAULT_PORT_BASE);
        let mut bound = None;
        for slot in 0..SLOTS {
            let Some(port) = u16::try_from(u32::from(base) + slot).ok() else {
                break;
            };
            if let Ok(l) = TcpListener::bind(SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, port)) {
                bound = Some((l, slot));
                break;
            }
        }
        let (listener, slot) =
            bound.ok_or_else(|| format!("no free TCP port in {base}..{} for QP numbers (set UIW_PORT_BASE)", u32::from(base) + SLOTS))?;
        listener.set_nonblocking(true).map_err(|e| e.to_string())?;
        let epoll = Epoll::new().map_err(|e| e.to_string())?;
        epoll.add(listener.as_raw_fd(), TOKEN_LISTENER, EPOLL_IN).map_err(|e| e.to_string())?;
        let waker = UnixStream::pair().map_err(|e| e.to_string())?;
        epoll.add(waker.1.as_raw_fd(), TOKEN_WAKE, EPOLL_IN).map_err(|e| e.to_string())?;
        Ok(Net {
            epoll,
            listener,
            port_base: base,
            slot,
            qps: RwLock::new(HashMap::new()),
            free: Mutex::new((1..INDEXES).collect()),
            pending: Mutex::new(HashMap::new()),
            next_pending: AtomicU64::new(1),
            dma,
            stop: AtomicBool::new(false),
            waker,
        })
    }

    /// A fresh QP number of this process, or `None` when all are in use.
    pub fn alloc_qpn(&self) -> Option<u32> {
        let i = self.free.lock().pop_front()?;
        Some(self.slot << 12 | i)
    }

    pub fn register(&self, qp: &Arc<Qp>) {
        self.qps.write().insert(qp.qpn, Arc::downgrade(qp));
    }

    pub fn unregister(&self, qpn: u32) {
        if self.qps.write().remove(&qpn).is_some() {
            self.free.lock().push_back(qpn & 0xfff);
        }
    }

    pub fn lookup(&self, qpn: u32) -> Option<Arc<Qp>> {
        self.qps.read().get(&qpn)?.upgrade()
    }

    /// Starts serving a QP's stream on the progress thread.
    pub fn watch(&self, sock: &TcpStream, qpn: u32) -> io::Result<()> {
        let fd = sock.as_raw_fd();
        self.epoll
            .add(fd, KIND_QP | u64::from(qpn), EPOLL_SOCKET_EDGE)
            .or_else(|_| self.epoll.modify(fd, KIND_QP | u64::from(qpn), EPOLL_SOCKET_EDGE))
    }

    pub fn unwatch(&self, sock: &TcpStream) {
        let _ = self.epoll.delete(sock.as_raw_fd());
    }

    fn run(self: Arc<Net>) {
        let mut evs = Vec::with_capacity(64);
        let mut ready: VecDeque<u64> = VecDeque::new();
        let mut deferred: Vec<u64> = Vec::new();
        let mut last_sweep = now_ms();
        while !self.stop.load(Ordering::Acquire) {
            evs.clear();
            let timeout = if !ready.is_empty() {
                0
            } else if !deferred.is_empty() {
                1
            } else {
                100
            };
            if self.epoll.wait(&mut evs, timeout).is_err() {
                std::thread::sleep(Duration::from_millis(10));
            }
            for tok in evs.iter().map(|e| e.0).chain(deferred.drain(..)) {
                if !ready.contains(&tok) {
                    ready.push_back(tok);
                }
            }
            let now = now_ms();
            for _ in 0..ready.len() {
                let Some(tok) = ready.pop_front() else { break };
                let more = match tok & KIND_MASK {
                    KIND_QP => match self.lookup(tok as u32).map(|qp| qp.progress(now)) {
                        Some(Progress::More) => true,
                        Some(Progress::Deferred) => {
                            deferred.push(tok);
                            false
                        }
                        _ => false,
                    },
                    KIND_PENDING => {
                        self.serve_pending(tok & !KIND_MASK);
                        false
                    }
                    _ if tok == TOKEN_LISTENER => {
                        self.accept_all();
                        false
                    }
                    _ => {
                        let mut b = [0u8; 64];
                        let _ = uiw_kabi::sys::recv_dontwait(&self.waker.1, &mut b);
                        false
                    }
                };
                if more {
                    ready.push_back(tok);
                }
            }
            if now.saturating_sub(last_sweep) >= 100 {
                last_sweep = now;
                self.sweep(now);
            }
        }
    }

    fn accept_all(&self) {
        while let Ok((sock, _)) = self.listener.accept() {
            let Ok(mss) = prepare(&sock) else { continue };
            let conn = Connection::new(config(Role::Responder, 0, 0, Vec::new(), mss), now_ms());
            let id = self.next_pending.fetch_add(1, Ordering::Relaxed);
            if self.epoll.add(sock.as_raw_fd(), KIND_PENDING | id, EPOLL_SOCKET_EDGE).is_err() {
                continue;
            }
            self.pending.lock().insert(id, Pending { conn, sock, stage: Vec::new(), cm: None });
            self.serve_pending(id);
        }
    }

    /// A stream the librdmacm drop-in accepted: wait for its MPA Request, then report it.
    pub fn cm_passive(&self, sock: TcpStream, cm: Arc<CmConn>) -> io::Result<()> {
        let mss = prepare(&sock)?;
        let conn = Connection::new(config(Role::Responder, 0, 0, Vec::new(), mss), now_ms());
        let id = self.next_pending.fetch_add(1, Ordering::Relaxed);
        let fd = sock.as_raw_fd();
        self.pending.lock().insert(id, Pending { conn, sock, stage: Vec::new(), cm: Some(cm) });
        if let Err(e) = self.epoll.add(fd, KIND_PENDING | id, EPOLL_SOCKET_EDGE) {
            self.pending.lock().remove(&id);
            return Err(e);
        }
        Ok(())
    }

    fn serve_pending(&self, id: u64) {
        let Some(mut p) = self.pending.lock().remove(&id) else {
            return;
        };
        match p.read_request() {
            None => {
                self.pending.lock().insert(id, p);
            }
            Some(Err(())) => {
                self.unwatch(&p.sock);
                if let Some(cm) = &p.cm {
                    cm.ended(libc::ECONNRESET);
                }
            }
            Some(Ok(req)) if p.cm.is_some() => {
                let cm = p.cm.clone().unwrap();
                let (ird, ord) = req.ird_ord.map(|w| (w.ird, w.ord)).unwrap_or((1, 1));
                *cm.pending.lock() = Some(p);
                cm.connect_request(&req.private_data, ird, ord);
            }
            Some(Ok(req)) => match QpHello::parse(&req.private_data).and_then(|h| self.lookup(h.to_qpn).map(|q| (h, q))) {
                Some((hello, qp)) => {
                    if let Err(p) = qp.offer(self, hello, p) {
                        self.unwatch(&p.sock);
                        p.reject(&[]);
                    }
                }
                None => {
                    self.unwatch(&p.sock);
                    p.reject(&[]);
                }
            },
        }
    }


    /// MPA timeouts of streams still negotiating.
    fn sweep(&self, now: u64) {
        let qps: Vec<Arc<Qp>> = self.qps.read().values().filter_map(Weak::upgrade).collect();
        for qp in qps {
            qp.handle_timeout(now);
        }
        let mut expired = Vec::new();
        {
            let mut pending = self.pending.lock();
            for (id, p) in pending.iter_mut() {
                p.conn.handle_timeout(now);
                if p.conn.wants_close() {
                    expired.push(*id);
                }
            }
            for id in &expired {
                if let Some(p) = pending.remove(id) {
                    self.unwatch(&p.sock);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hello_round_trip_and_rejects_foreign_data() {
        let h = QpHello { to_qpn: 0x001002, from_qpn: 0x003001 };
        let b = h.encode();
        assert_eq!(b, [b'u', b'i', b'w', b'Q', 0x00, 0x00, 0x10, 0x02, 0x00, 0x00, 0x30, 0x01]);
        assert_eq!(QpHello::parse(&b), Some(h));
        assert_eq!(QpHello::parse(b"uiwX\0\0\0\0\0\0\0\0"), None);
        assert_eq!(QpHello::parse(b"uiwQ"), None);
    }

    #[test]
    fn lower_address_and_qpn_initiates() {
        let lo = Ipv4Addr::LOCALHOST;
        assert!(is_initiator(lo, 0x1001, lo, 0x2001));
        assert!(!is_initiator(lo, 0x2001, lo, 0x1001));
        assert!(is_initiator(Ipv4Addr::new(10, 0, 0, 1), 0x9001, Ipv4Addr::new(10, 0, 0, 2), 0x1001));
    }

    #[test]
    fn qpn_names_the_port() {
        assert_eq!(qp_address(Ipv4Addr::LOCALHOST, 0x003005, 20000), Some(SocketAddrV4::new(Ipv4Addr::LOCALHOST, 20003)));
        assert_eq!(qp_address(Ipv4Addr::LOCALHOST, 0xfff001, 65000), None);
    }
}
