//! A raw-frame transport with the shape of the kernel's: `connect`/`listen`/`accept` giving
//! streams that implement `std::io::Read` and `Write`, a progress thread that keeps the TCP
//! running (ACKs, retransmissions, passive opens) while nobody reads or writes. The
//! provider's `--transport xdp|packet` devices hold one per netdev and use its streams
//! without blocking ([`crate::nonblock`]); it is built on the public `Host`/`Stack` API only.
//!
//! One lock guards the host. Readers and writers take it, do their turn of the stack
//! (`Host::poll`) themselves — an application thread waiting for data polls the rings
//! directly — and sleep on a condition variable that the progress thread signals after every
//! turn that moved something; the progress thread sleeps in epoll on the socket and on a
//! timerfd, outside the lock. Whoever turns the stack arms the timerfd when the stack's next
//! deadline (a retransmission, TIME-WAIT) is earlier than the one it is armed for, so a
//! deadline set by a writer is kept without waking anyone, and an idle transport sleeps
//! with no periodic wake-up.
//!
//! [`Transport::open_driven`] starts no thread: the caller's event loop (the provider's
//! progress thread) waits on [`Transport::fds`] itself and calls [`Transport::turn`], so a
//! frame that arrives is handled by the thread that waits for it, with no hop through a
//! thread of this crate.

use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::os::fd::RawFd;
use std::net::{Ipv4Addr, SocketAddrV4};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, MutexGuard};
use uiw_kabi::sys::{Epoll, TimerFd, EPOLL_IN};
use uiw_utcp::{Config, Handle, StackConfig, State};

use crate::afpacket::PacketSocket;
use crate::eventfd::EventFd;
use crate::nonblock::Watch;
use crate::guard::RstGuard;
use crate::probe::Kind;
use crate::xdp::XskSocket;
use crate::{neigh, FrameIo, Host, Iface};

pub(crate) type Dyn = Host<Box<dyn FrameIo>>;

/// How many readable streams [`Transport::take_readable`] keeps for a caller that never asks
/// (beyond that, the oldest are dropped: their eventfds fired all the same).
pub const READABLE_KEPT: usize = 256;

/// How soon a turn retries a frame the driver had no room for (its TX ring or socket
/// buffer full): the kernel frees room without telling.
const TX_RETRY: Duration = Duration::from_micros(200);

pub(crate) struct Shared {
    pub(crate) host: parking_lot::Mutex<Dyn>,
    /// Connections whose stream was dropped: removed from the stack once CLOSED (lock
    /// order: `host`, then `orphans`).
    pub(crate) orphans: Mutex<Vec<Handle>>,
    moved: Condvar,
    /// Threads blocked in `wait` on `moved` (counted under the host lock): a turn with none
    /// skips `notify_all`, which is a futex system call whether anyone waits or not.
    waiters: AtomicUsize,
    stop: AtomicBool,
    /// The driver's descriptor (the XSK or packet socket): readable when frames arrive.
    fd: i32,
    /// Readable when the stack's next deadline has come (see the module doc).
    timer: TimerFd,
    /// The deadline `timer` is armed for (changed under the host lock).
    armed: Mutex<Option<Instant>>,
    /// Streams used without blocking (see [`crate::nonblock`]): what their readiness
    /// descriptor waits for (lock order: `host`, then `watches`).
    pub(crate) watches: Mutex<HashMap<Handle, Watch>>,
    /// The non-blocking listeners' readiness descriptors, by port.
    pub(crate) listen_ev: Mutex<HashMap<u16, Arc<EventFd>>>,
    /// The port range steered to this transport (local ports of connections it opens).
    pub(crate) ports: (u16, u16),
    pub(crate) next_port: AtomicU32,
    /// Keeps the kernel from answering the steered flows (with the ports steered beyond
    /// `ports`, see `FrameIo::steer`).
    pub(crate) guard: RstGuard,
    /// The driver leaves the kernel a copy of every frame (AF_PACKET): a steered port needs
    /// the guard too. The XDP program redirects steered frames before the kernel sees them.
    pub(crate) kernel_sees_frames: bool,
    /// Ports outside `ports` steered so far (they stay steered until the transport closes).
    pub(crate) steered: Mutex<std::collections::HashSet<u16>>,
    /// The readiness descriptors of the streams a turn found readable (or changed) since
    /// [`Transport::take_readable`] last took them (see there).
    pub(crate) readable: Mutex<Vec<RawFd>>,
}

impl Shared {
    /// The stack. `parking_lot`'s lock, not std's: it hands itself to a thread that has waited
    /// half a millisecond. An application thread that polls turns the stack in a tight loop,
    /// taking and releasing this lock every few microseconds, and std's lock lets it take the
    /// lock back before a woken waiter runs: the progress thread was found waiting here while
    /// it held a QP (a pump's send), the polling thread meanwhile finding that QP taken at
    /// every poll.
    pub(crate) fn lock(&self) -> MutexGuard<'_, Dyn> {
        self.host.lock()
    }

    /// One turn of the stack (`Host::poll`) by any thread, under the host lock; then the
    /// timer covers the stack's next deadline.
    pub(crate) fn poll(&self, host: &mut Dyn, budget: usize) -> io::Result<bool> {
        let r = host.poll(budget);
        self.arm(host);
        r
    }

    /// Arms the timerfd for the stack's next deadline if it is earlier than the armed one (a
    /// later or no deadline leaves the arming: it fires for nothing at worst, once).
    fn arm(&self, host: &Dyn) {
        let mut next = host.stack.poll_timeout();
        if host.backlogged() {
            // The driver had no room for a frame: nothing wakes a waiter when it has again.
            let retry = Instant::now() + TX_RETRY;
            next = Some(next.map_or(retry, |t| t.min(retry)));
        }
        let Some(t) = next else { return };
        let mut armed = self.armed.lock().unwrap_or_else(|p| p.into_inner());
        if !armed.is_some_and(|a| t >= a) {
            let _ = self.timer.arm(t.saturating_duration_since(Instant::now()));
            *armed = Some(t);
        }
    }

    /// The progress work: a turn of the stack (frames in, timers, frames out), streams
    /// dropped meanwhile removed once closed, waiters woken. Returns whether it moved
    /// anything (more may be waiting).
    fn turn(&self) -> bool {
        self.turn_with(&|_| false, &mut Vec::new())
    }

    /// [`Shared::turn`], with the streams `quiet` names not signalled but put in `served`
    /// (see [`Transport::turn_serving`]).
    fn turn_with(&self, quiet: &dyn Fn(RawFd) -> bool, served: &mut Vec<RawFd>) -> bool {
        let moved = {
            let mut host = self.lock();
            {
                // The armed deadline has come: disarm, which also takes back an expiry that
                // fired (it stops reporting) or is about to; `poll` below re-arms for the
                // next. A turn before the deadline costs no system call for the timer.
                let mut armed = self.armed.lock().unwrap_or_else(|p| p.into_inner());
                if armed.is_some_and(|a| a <= Instant::now()) {
                    let _ = self.timer.disarm();
                    *armed = None;
                }
            }
            let moved = self.poll(&mut host, 256).unwrap_or(false);
            let mut orphans = self.orphans.lock().unwrap_or_else(|p| p.into_inner());
            orphans.retain(|&h| match host.stack.tcb(h).map(|t| t.state()) {
                Some(State::Closed) | None => {
                    host.stack.remove(h);
                    false
                }
                _ => true,
            });
            drop(orphans);
            crate::nonblock::notify_quiet(&mut host, self, quiet, served);
            moved
        };
        if self.waiters.load(Ordering::Acquire) > 0 {
            self.moved.notify_all();
        }
        moved
    }
}

/// A userspace TCP on one interface, with its progress thread.
pub struct Transport {
    pub(crate) shared: Arc<Shared>,
    progress: Option<JoinHandle<()>>,
    kind: &'static str,
}

fn seed() -> u64 {
    let mut b = [0u8; 8];
    if let Ok(mut f) = std::fs::File::open("/dev/urandom") {
        let _ = f.read_exact(&mut b);
    }
    u64::from_ne_bytes(b) ^ std::process::id() as u64
}

impl Transport {
    /// Open `kind` on interface `ifname` (in the calling thread's namespace), steering
    /// uiw's `ports`, and start the progress thread.
    pub fn open(ifname: &str, kind: Kind, ports: (u16, u16), tcp: Config) -> io::Result<Transport> {
        let mut t = Transport::open_driven(ifname, kind, ports, tcp)?;
        let s = t.shared.clone();
        t.progress = Some(std::thread::Builder::new().name("uiw-rawnet".into()).spawn(move || progress(s))?);
        Ok(t)
    }

    /// As [`Transport::open`], without a progress thread: the caller waits until one of
    /// [`Transport::fds`] is readable (level-triggered: frames wait in the ring, or a
    /// deadline has come) and then calls [`Transport::turn`]. Its streams are meant for
    /// non-blocking use ([`crate::nonblock`]): a blocking read or write turns the stack
    /// itself, but waits for others' turns in short sleeps.
    pub fn open_driven(ifname: &str, kind: Kind, ports: (u16, u16), tcp: Config) -> io::Result<Transport> {
        let iface = Iface::lookup(ifname)?;
        let guard = RstGuard::install(ifname, iface.ip, ports)?;
        let io: Box<dyn FrameIo> = match kind {
            Kind::Xdp => Box::new(XskSocket::open(&iface, ports)?),
            Kind::Packet => Box::new(PacketSocket::open(&iface, ports)?),
        };
        let name = io.kind();
        let fd = io.fd();
        // A driver that carries less than the interface's MTU (AF_XDP without multi-buffer)
        // gets a stack whose MSS fits: the peer's segments then fit too.
        let mtu = io.max_mtu().map_or(iface.mtu, |m| m.min(iface.mtu));
        let cfg = StackConfig { mac: iface.mac, ip: iface.ip, mtu, tcp, seed: seed() };
        let first = seed() as u32;
        let shared = Arc::new(Shared {
            host: parking_lot::Mutex::new(Host::new(cfg, io)),
            orphans: Mutex::new(Vec::new()),
            moved: Condvar::new(),
            waiters: AtomicUsize::new(0),
            stop: AtomicBool::new(false),
            fd,
            timer: TimerFd::new()?,
            armed: Mutex::new(None),
            watches: Mutex::new(HashMap::new()),
            listen_ev: Mutex::new(HashMap::new()),
            ports,
            next_port: AtomicU32::new(first),
            guard,
            kernel_sees_frames: kind == Kind::Packet,
            steered: Mutex::new(std::collections::HashSet::new()),
            readable: Mutex::new(Vec::new()),
        });
        Ok(Transport { shared, progress: None, kind: name })
    }

    /// What a driven transport's caller waits on, readable (level) until [`Transport::turn`]
    /// has done the work: the driver's socket (frames arrived) and the timer (a deadline).
    pub fn fds(&self) -> [RawFd; 2] {
        [self.shared.fd, self.shared.timer.fd()]
    }

    /// The progress work of a driven transport: frames in, timers, frames out; the
    /// readiness of the non-blocking streams and listener signalled. Returns whether it
    /// moved anything.
    pub fn turn(&self) -> bool {
        self.shared.turn()
    }

    /// [`Transport::turn`] for a caller that serves streams itself: a stream whose readiness
    /// descriptor `quiet` names is not signalled when the turn has news for it (arrivals,
    /// room to write, a changed connection state); its descriptor goes to `served`, and the
    /// caller must serve it (read and write until `WouldBlock`) as if the descriptor had
    /// fired. The provider's progress thread, which waits on the descriptors, saves the
    /// eventfd write and the second `epoll_wait` per arrival this way.
    pub fn turn_serving(&self, quiet: &dyn Fn(RawFd) -> bool, served: &mut Vec<RawFd>) -> bool {
        self.shared.turn_with(quiet, served)
    }

    /// Whether `fd` is the readiness descriptor of one of this transport's non-blocking
    /// streams.
    pub fn owns_readiness(&self, fd: RawFd) -> bool {
        crate::nonblock::owns(&self.shared, fd)
    }

    /// Moves into `out` the readiness descriptors of the streams that stack turns made
    /// readable (or whose connection changed state) since the last call. Their eventfds fired
    /// as well, but a thread that turned the stack itself — an application thread that polls
    /// one stream — learns here which *other* streams its turn fed, and can serve them before
    /// it reports what it read: what arrived first is then placed first, across streams, as
    /// an RNIC places it (perftest's credit Write on one QP ahead of its rdma_cm handshake on
    /// another). At most [`READABLE_KEPT`] are kept for a caller that never asks.
    pub fn take_readable(&self, out: &mut Vec<RawFd>) {
        out.append(&mut self.shared.readable.lock().unwrap_or_else(|p| p.into_inner()));
    }

    /// Frames received so far (by whichever thread turned the stack).
    pub fn rx_frames(&self) -> u64 {
        self.shared.lock().stats.rx_frames
    }

    /// The MTU the stack uses: the interface's, or less if the driver carries less
    /// ([`FrameIo::max_mtu`]). The MSS it announces is this − 40.
    pub fn mtu(&self) -> usize {
        self.shared.lock().stack.max_frame() - uiw_utcp::packet::ETH_HDR
    }

    /// The driver's frames in several buffers so far ([`FrameIo::multi_buffer`]).
    pub fn multi_buffer(&self) -> crate::MultiBuffer {
        self.shared.lock().io.multi_buffer()
    }

    /// The driver in use ("xdp (native, copy)", "packet").
    pub fn kind(&self) -> &'static str {
        self.kind
    }

    /// Accept connections to `port`.
    pub fn listen(&self, port: u16) {
        self.shared.lock().stack.listen(port);
    }

    /// The next connection to a listening port, waiting up to `timeout`.
    pub fn accept(&self, timeout: Duration) -> io::Result<RawStream> {
        let end = Instant::now() + timeout;
        let mut host = self.shared.lock();
        loop {
            if let Some(h) = host.stack.accept() {
                return Ok(RawStream { shared: self.shared.clone(), h, timeout: None, ev: None });
            }
            host = self.wait(host, end)?;
        }
    }

    /// Open a connection from `local_port` to `remote` (its MAC from the kernel's ARP
    /// table), waiting up to `timeout` for the handshake.
    pub fn connect(&self, local_port: u16, remote: SocketAddrV4, timeout: Duration) -> io::Result<RawStream> {
        let end = Instant::now() + timeout;
        let ip: Ipv4Addr = *remote.ip();
        if self.shared.lock().stack.neighbour(ip).is_none() {
            let mac = neigh::resolve(ip, timeout)?;
            self.shared.lock().stack.set_neighbour(ip, mac);
        }
        let mut host = self.shared.lock();
        let h = host.stack.connect(local_port, remote);
        loop {
            self.shared.poll(&mut host, 64)?;
            match host.stack.tcb(h).map(|t| t.state()) {
                Some(State::Established) => return Ok(RawStream { shared: self.shared.clone(), h, timeout: None, ev: None }),
                Some(State::SynSent) => {}
                _ => {
                    host.stack.remove(h);
                    return Err(io::Error::new(io::ErrorKind::ConnectionRefused, format!("{remote}: connection refused")));
                }
            }
            host = match self.wait(host, end) {
                Ok(g) => g,
                Err(e) => {
                    let mut g = self.shared.lock();
                    if let Some(t) = g.stack.tcb(h) {
                        t.abort();
                    }
                    return Err(e);
                }
            };
        }
    }

    fn wait<'a>(&'a self, host: MutexGuard<'a, Dyn>, end: Instant) -> io::Result<MutexGuard<'a, Dyn>> {
        wait(&self.shared, host, end)
    }
}

fn wait<'a>(shared: &'a Shared, host: MutexGuard<'a, Dyn>, end: Instant) -> io::Result<MutexGuard<'a, Dyn>> {
    let now = Instant::now();
    if now >= end {
        return Err(io::Error::new(io::ErrorKind::TimedOut, "timed out"));
    }
    // Counted while the host lock is held, so a turn that follows sees the waiter; one that
    // ran before it found nothing this waiter's own `poll` (before it waits) did not see.
    shared.waiters.fetch_add(1, Ordering::AcqRel);
    let mut host = host;
    let _ = shared.moved.wait_for(&mut host, (end - now).min(Duration::from_millis(5)));
    shared.waiters.fetch_sub(1, Ordering::AcqRel);
    Ok(host)
}

impl Drop for Transport {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Relaxed);
        // The thread sleeps without a timeout: the timer wakes it to see `stop`. A turn running
        // meanwhile disarms the timer if the deadline it was armed for has come, which may
        // undo this arming after the thread looked at `stop`: arm it again until the thread
        // is gone (a transport whose deadlines were a tail loss probe's, hundreds of
        // microseconds apart, hung here about once in 15 closes).
        if let Some(p) = self.progress.take() {
            while !p.is_finished() {
                let _ = self.shared.timer.arm(Duration::ZERO);
                std::thread::sleep(Duration::from_millis(1));
            }
            let _ = p.join();
        } else {
            let _ = self.shared.timer.arm(Duration::ZERO);
        }
    }
}

/// The progress thread of [`Transport::open`]: turn the stack, wake waiters, sleep in epoll
/// on the socket and the timer when nothing moved — with no timeout: a deadline is the
/// timer's, so an idle transport never wakes.
fn progress(s: Arc<Shared>) {
    let ep = match Epoll::new().and_then(|ep| {
        ep.add(s.fd, 0, EPOLL_IN)?;
        ep.add(s.timer.fd(), 1, EPOLL_IN)?;
        Ok(ep)
    }) {
        Ok(ep) => ep,
        Err(e) => {
            eprintln!("uiw-rawnet: progress thread: epoll: {e}");
            return;
        }
    };
    let mut evs = Vec::with_capacity(2);
    while !s.stop.load(Ordering::Relaxed) {
        if s.turn() {
            continue;
        }
        evs.clear();
        let _ = ep.wait_for(&mut evs, None);
    }
}

/// One connection; `Read`/`Write` block (up to the timeout, if set) like a TCP socket's.
pub struct RawStream {
    pub(crate) shared: Arc<Shared>,
    pub(crate) h: Handle,
    timeout: Option<Duration>,
    /// Readiness descriptor of a stream used without blocking (see [`crate::nonblock`]).
    pub(crate) ev: Option<Arc<EventFd>>,
}

impl RawStream {
    pub(crate) fn nonblocking(shared: Arc<Shared>, h: Handle, ev: Arc<EventFd>) -> RawStream {
        RawStream { shared, h, timeout: None, ev: Some(ev) }
    }
}

impl RawStream {
    /// Bound every blocking `read`/`write` (None: wait for ever).
    pub fn set_timeout(&mut self, t: Option<Duration>) {
        self.timeout = t;
    }

    /// Payload bytes per segment toward the peer (for FPDU sizing).
    pub fn mss(&self) -> usize {
        self.shared.lock().stack.tcb(self.h).map_or(536, |t| t.mss())
    }

    fn end(&self) -> Instant {
        Instant::now() + self.timeout.unwrap_or(Duration::from_secs(86_400 * 365))
    }

    /// Close the sending direction (FIN after the queued bytes).
    pub fn shutdown_write(&self) {
        if let Some(t) = self.shared.lock().stack.tcb(self.h) {
            t.close();
        }
    }

    /// Close the sending direction and wait (up to `timeout`) until the peer has
    /// acknowledged every byte and the FIN — what SO_LINGER does for a kernel socket. The
    /// transport must outlive this for the bytes to get there.
    pub fn linger(&self, timeout: Duration) -> io::Result<()> {
        let end = Instant::now() + timeout;
        let mut host = self.shared.lock();
        if let Some(t) = host.stack.tcb(self.h) {
            t.close();
        }
        loop {
            self.shared.poll(&mut host, 64)?;
            let t = host.stack.tcb(self.h).ok_or_else(gone)?;
            match t.state() {
                State::FinWait2 | State::TimeWait | State::Closed if t.send_queued() == 0 => return Ok(()),
                State::Closed => return Err(gone()),
                _ => {}
            }
            host = wait(&self.shared, host, end)?;
        }
    }
}

fn gone() -> io::Error {
    io::Error::new(io::ErrorKind::ConnectionReset, "connection reset")
}

impl Read for RawStream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let end = self.end();
        let mut host = self.shared.lock();
        loop {
            self.shared.poll(&mut host, 64)?;
            let t = host.stack.tcb(self.h).ok_or_else(gone)?;
            let n = t.recv(buf);
            if n > 0 || buf.is_empty() || t.at_eof() {
                return Ok(n);
            }
            if t.state() == State::Closed {
                return Err(gone());
            }
            host = wait(&self.shared, host, end)?;
        }
    }
}

impl Write for RawStream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let end = self.end();
        let mut host = self.shared.lock();
        loop {
            let t = host.stack.tcb(self.h).ok_or_else(gone)?;
            let n = t.send(buf).map_err(|_| io::Error::new(io::ErrorKind::BrokenPipe, "connection closed for sending"))?;
            if n > 0 || buf.is_empty() {
                self.shared.poll(&mut host, 64)?;
                return Ok(n);
            }
            self.shared.poll(&mut host, 64)?;
            host = wait(&self.shared, host, end)?;
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        let mut host = self.shared.lock();
        self.shared.poll(&mut host, 64).map(|_| ())
    }
}

impl Drop for RawStream {
    fn drop(&mut self) {
        let mut host = self.shared.lock();
        if let Some(t) = host.stack.tcb(self.h) {
            t.close();
        }
        self.shared.orphans.lock().unwrap_or_else(|p| p.into_inner()).push(self.h);
        if self.ev.is_some() {
            self.shared.watches.lock().unwrap_or_else(|p| p.into_inner()).remove(&self.h);
        }
    }
}
