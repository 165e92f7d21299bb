//! One open device context and the verbs objects created on it. Everything here is plain safe
//! Rust: the FFI layer turns C pointers into these objects and back.

use std::collections::HashMap;
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use parking_lot::Mutex;
use uiw_wire::conn::{Connection, Role};

use super::cq::{Completion, Cq, Pushed};
use super::device::{gid_ipv4, DeviceInfo};
use super::dma::Dma;
use super::events::{event_type, AsyncSink, ChannelSink};
use super::limits::DeviceLimits;
use super::cm::CmConn;
use super::link::{DataPath, Env, Fatal, Link, Notice};
use super::mr::MrTable;
use super::net::{self, Net, Pending, QpHello};
use super::qp_state::{self, QpAttrs, QpState};
use super::srq::Srq;
use super::wr::{PostError, RecvWqe, SendWqe};

/// Counts of live objects, for the device limits and for `EBUSY` on teardown.
#[derive(Debug, Default)]
struct Counts {
    pds: HashMap<u32, usize>,
    cqs: usize,
    qps: usize,
    srqs: usize,
}

#[derive(Debug)]
pub struct Context {
    pub device: Arc<DeviceInfo>,
    pub limits: DeviceLimits,
    pub mrs: Arc<MrTable>,
    async_sink: Arc<AsyncSink>,
    next_handle: AtomicU32,
    dma: &'static dyn Dma,
    /// The process's transport, taken by this context's first QP.
    net: Mutex<Option<Arc<Net>>>,
    counts: Mutex<Counts>,
    /// Completion channels created through the command fd: read fd → write end.
    channels: Mutex<HashMap<i32, Arc<ChannelSink>>>,
}

impl std::fmt::Debug for dyn Dma {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Dma")
    }
}

impl Context {
    /// `dma` is how the data path reaches application memory (see [`super::dma`]).
    pub fn new(device: Arc<DeviceInfo>, limits: DeviceLimits, async_sink: AsyncSink, dma: &'static dyn Dma) -> Context {
        Context {
            mrs: Arc::new(MrTable::new(limits.max_mr as usize)),
            device,
            limits,
            async_sink: Arc::new(async_sink),
            next_handle: AtomicU32::new(1),
            dma,
            net: Mutex::new(None),
            counts: Mutex::new(Counts::default()),
            channels: Mutex::new(HashMap::new()),
        }
    }

    fn net(&self) -> Result<Arc<Net>, i32> {
        let mut n = self.net.lock();
        if let Some(net) = n.as_ref() {
            return Ok(net.clone());
        }
        let net = Net::acquire(self.dma).map_err(|e| {
            eprintln!("uiw: cannot create a QP: {e}");
            libc::EADDRINUSE
        })?;
        *n = Some(net.clone());
        Ok(net)
    }

    /// `uiw_cm_passive_v1`: a stream the librdmacm drop-in accepted; its MPA Request is
    /// reported through `cm`.
    pub fn cm_passive(&self, sock: TcpStream, cm: Arc<CmConn>) -> Result<(), i32> {
        let net = self.net()?;
        net.cm_passive(sock, cm).map_err(|e| e.raw_os_error().unwrap_or(libc::EIO))
    }

    // ---- protection domains ----

    pub fn alloc_pd(&self) -> Result<u32, i32> {
        let mut c = self.counts.lock();
        if c.pds.len() >= self.limits.max_pd as usize {
            return Err(libc::ENOMEM);
        }
        let h = self.next_handle.fetch_add(1, Ordering::Relaxed);
        c.pds.insert(h, 0);
        Ok(h)
    }

    /// Fails with `EBUSY` while QPs or SRQs still use the PD, as the kernel does. Memory
    /// regions still registered under it are deregistered with it, where the kernel would
    /// refuse: perftest 4.5's send tests leak their credit MR unless run with `-R` (a mode no
    /// kernel iWARP device could run them in), and with no QP left in the PD nothing can reach
    /// those regions any more.
    pub fn dealloc_pd(&self, pd: u32) -> Result<(), i32> {
        let mut c = self.counts.lock();
        let users = c.pds.get(&pd).copied().ok_or(libc::EINVAL)?;
        if users > 0 {
            if std::env::var_os("UIW_DEBUG").is_some() {
                eprintln!("uiw: ibv_dealloc_pd: EBUSY, still used by {users} QP/SRQ(s)");
            }
            return Err(libc::EBUSY);
        }
        let orphans = self.mrs.deregister_pd(pd);
        if orphans > 0 && std::env::var_os("UIW_DEBUG").is_some() {
            eprintln!("uiw: ibv_dealloc_pd: deregistered {orphans} memory region(s) the application left in it");
        }
        c.pds.remove(&pd);
        Ok(())
    }

    fn pd_ref(&self, pd: u32, delta: isize) {
        if let Some(n) = self.counts.lock().pds.get_mut(&pd) {
            *n = n.saturating_add_signed(delta);
        }
    }

    // ---- completion channels ----

    pub fn add_channel(&self, read_fd: i32, sink: ChannelSink) {
        self.channels.lock().insert(read_fd, Arc::new(sink));
    }

    pub fn channel(&self, read_fd: i32) -> Option<Arc<ChannelSink>> {
        self.channels.lock().get(&read_fd).cloned()
    }

    // ---- CQs ----

    pub fn create_cq(&self, cqe: i32, channel: Option<Arc<ChannelSink>>) -> Result<Arc<CqObj>, i32> {
        if cqe < 1 || cqe as u32 > self.limits.max_cqe {
            return Err(libc::EINVAL);
        }
        let mut c = self.counts.lock();
        if c.cqs >= self.limits.max_cq as usize {
            return Err(libc::ENOMEM);
        }
        c.cqs += 1;
        Ok(Arc::new(CqObj {
            handle: AtomicU64::new(0),
            q: Mutex::new(Cq::new(cqe as usize)),
            channel,
            async_sink: self.async_sink.clone(),
            comp_events_reported: AtomicU32::new(0),
            async_events_reported: AtomicU32::new(0),
            users: AtomicU32::new(0),
            qps: Mutex::new(Vec::new()),
        }))
    }

    pub fn destroy_cq(&self, cq: &CqObj) -> Result<(), i32> {
        if cq.users.load(Ordering::Acquire) > 0 {
            return Err(libc::EBUSY);
        }
        self.counts.lock().cqs -= 1;
        Ok(())
    }

    // ---- SRQs ----

    pub fn create_srq(&self, pd: u32, max_wr: u32, max_sge: u32, limit: u32) -> Result<Arc<SrqObj>, i32> {
        if max_wr == 0 || max_wr > self.limits.max_srq_wr || max_sge > self.limits.max_srq_sge || limit > max_wr {
            return Err(libc::EINVAL);
        }
        let mut c = self.counts.lock();
        if c.srqs >= self.limits.max_srq as usize {
            return Err(libc::ENOMEM);
        }
        c.srqs += 1;
        drop(c);
        self.pd_ref(pd, 1);
        let mut srq = Srq::new(max_wr, max_sge.max(1));
        srq.limit = limit;
        Ok(Arc::new(SrqObj {
            handle: AtomicU64::new(0),
            pd,
            inner: Mutex::new(srq),
            async_sink: self.async_sink.clone(),
            async_events_reported: AtomicU32::new(0),
            users: AtomicU32::new(0),
        }))
    }

    pub fn destroy_srq(&self, srq: &SrqObj) -> Result<(), i32> {
        if srq.users.load(Ordering::Acquire) > 0 {
            return Err(libc::EBUSY);
        }
        self.counts.lock().srqs -= 1;
        self.pd_ref(srq.pd, -1);
        Ok(())
    }

    // ---- QPs ----

    pub fn create_qp(&self, spec: QpSpec) -> Result<Arc<Qp>, i32> {
        let cap = qp_state::validate_create(&spec.cap, spec.qp_type, spec.srq.is_some(), &self.limits).map_err(|e| e.errno())?;
        let net = self.net()?;
        let mut c = self.counts.lock();
        if c.qps >= self.limits.max_qp as usize {
            return Err(libc::ENOMEM);
        }
        let qpn = net.alloc_qpn().ok_or(libc::ENOMEM)?;
        c.qps += 1;
        drop(c);
        self.pd_ref(spec.pd, 1);
        spec.send_cq.users.fetch_add(1, Ordering::AcqRel);
        spec.recv_cq.users.fetch_add(1, Ordering::AcqRel);
        if let Some(s) = &spec.srq {
            s.users.fetch_add(1, Ordering::AcqRel);
        }
        let qp = Arc::new(Qp {
            qpn,
            pd: spec.pd,
            sq_sig_all: spec.sq_sig_all,
            cap,
            send_cq: spec.send_cq,
            recv_cq: spec.recv_cq,
            srq: spec.srq,
            handle: AtomicU64::new(0),
            async_sink: self.async_sink.clone(),
            async_events_reported: AtomicU32::new(0),
            mrs: self.mrs.clone(),
            device: self.device.clone(),
            net: net.clone(),
            destroyed: AtomicBool::new(false),
            polled_ms: AtomicU64::new(0),
            inner: Mutex::new(QpInner { attrs: qp_state::init_attrs_from_create(&cap), dp: DataPath::default(), parked: None, cm: None }),
        });
        qp.send_cq.qps.lock().push(Arc::downgrade(&qp));
        if !Arc::ptr_eq(&qp.send_cq, &qp.recv_cq) {
            qp.recv_cq.qps.lock().push(Arc::downgrade(&qp));
        }
        net.register(&qp);
        Ok(qp)
    }

    pub fn destroy_qp(&self, qp: &Qp) {
        // Like the kernel: outstanding WRs vanish without completions, the stream is closed,
        // and the QP's completions still queued in its CQs are discarded.
        qp.net.unregister(qp.qpn);
        qp.destroyed.store(true, Ordering::Release);
        {
            let mut inner = qp.inner.lock();
            if let Some(l) = inner.dp.link.as_ref() {
                qp.net.unwatch(&l.sock);
            }
            let env = qp.env(inner.attrs.qp_access_flags);
            inner.dp.shutdown(&env, false);
            inner.parked = None;
        }
        for cq in [&qp.send_cq, &qp.recv_cq] {
            cq.qps.lock().retain(|w| w.upgrade().is_some_and(|q| q.qpn != qp.qpn));
        }
        qp.send_cq.q.lock().purge_qp(qp.qpn);
        qp.recv_cq.q.lock().purge_qp(qp.qpn);
        qp.send_cq.users.fetch_sub(1, Ordering::AcqRel);
        qp.recv_cq.users.fetch_sub(1, Ordering::AcqRel);
        if let Some(s) = &qp.srq {
            s.users.fetch_sub(1, Ordering::AcqRel);
        }
        self.pd_ref(qp.pd, -1);
        self.counts.lock().qps -= 1;
    }
}

impl Drop for Context {
    fn drop(&mut self) {
        if self.net.get_mut().take().is_some() {
            Net::release();
        }
    }
}

/// A completion queue and where its events go.
#[derive(Debug)]
pub struct CqObj {
    /// The application's `ibv_cq*`, which completion events carry.
    pub handle: AtomicU64,
    pub q: Mutex<Cq>,
    pub channel: Option<Arc<ChannelSink>>,
    async_sink: Arc<AsyncSink>,
    pub comp_events_reported: AtomicU32,
    pub async_events_reported: AtomicU32,
    /// QPs using this CQ (destroy fails with EBUSY while any do).
    users: AtomicU32,
    /// The same QPs, for progress driven by `ibv_poll_cq`.
    qps: Mutex<Vec<Weak<Qp>>>,
}

impl CqObj {
    /// Completion events the application read for this CQ (what its destroy waits to see
    /// acked); unread ones are taken back from the channel.
    pub fn comp_events_to_ack(&self) -> u32 {
        match &self.channel {
            Some(ch) => ch.settle(self.handle.load(Ordering::Acquire), &self.comp_events_reported),
            None => self.comp_events_reported.load(Ordering::Acquire),
        }
    }
    /// Async events the application read for this CQ (what its destroy waits to see acked).
    pub fn async_events_to_ack(&self) -> u32 {
        self.async_sink.settle(self.handle.load(Ordering::Acquire), &self.async_events_reported)
    }
    /// `ibv_poll_cq` on an empty CQ: receive and transmit for its QPs right here, without
    /// waiting for the progress thread to be scheduled (skipping QPs another thread is serving).
    pub fn drive(&self) {
        let qps: Vec<Arc<Qp>> = self.qps.lock().iter().filter_map(Weak::upgrade).collect();
        for qp in qps {
            qp.try_progress();
        }
    }

    pub fn push(&self, c: Completion) {
        let pushed = self.q.lock().push(c);
        let handle = self.handle.load(Ordering::Acquire);
        match pushed {
            Pushed::Queued => {}
            Pushed::Notify => {
                if let Some(ch) = &self.channel {
                    ch.notify(handle, &self.comp_events_reported);
                }
            }
            Pushed::Overflow => self.async_sink.raise(handle, event_type::CQ_ERR, &self.async_events_reported),
        }
    }
}

/// A shared receive queue.
#[derive(Debug)]
pub struct SrqObj {
    pub handle: AtomicU64,
    pub pd: u32,
    pub inner: Mutex<Srq>,
    async_sink: Arc<AsyncSink>,
    pub async_events_reported: AtomicU32,
    users: AtomicU32,
}

impl SrqObj {
    /// Async events the application read for this SRQ.
    pub fn async_events_to_ack(&self) -> u32 {
        self.async_sink.settle(self.handle.load(Ordering::Acquire), &self.async_events_reported)
    }
    /// Returns a WR a failing QP took but did not use.
    pub fn give_back(&self, w: RecvWqe) {
        self.inner.lock().give_back(w);
    }

    /// Takes a receive WR for an incoming Send, raising the limit event if it fires.
    pub fn take(&self) -> Option<RecvWqe> {
        let (w, fired) = self.inner.lock().take()?;
        if fired {
            self.async_sink.raise(self.handle.load(Ordering::Acquire), event_type::SRQ_LIMIT_REACHED, &self.async_events_reported);
        }
        Some(w)
    }
}

/// What `ibv_create_qp` asks for.
pub struct QpSpec {
    pub pd: u32,
    pub qp_type: u32,
    pub cap: qp_state::QpCap,
    pub sq_sig_all: bool,
    pub send_cq: Arc<CqObj>,
    pub recv_cq: Arc<CqObj>,
    pub srq: Option<Arc<SrqObj>>,
}

#[derive(Debug)]
pub struct QpInner {
    pub attrs: QpAttrs,
    pub dp: DataPath,
    /// A stream that arrived for this QP before it reached RTR.
    parked: Option<Pending>,
    /// rdma_cm connection this QP belongs to (the librdmacm drop-in).
    cm: Option<Arc<CmConn>>,
}

impl std::fmt::Debug for Pending {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Pending")
    }
}

/// A queue pair.
#[derive(Debug)]
pub struct Qp {
    pub qpn: u32,
    pub pd: u32,
    pub sq_sig_all: bool,
    /// The capabilities actually granted (reported back by create and query).
    pub cap: qp_state::QpCap,
    pub send_cq: Arc<CqObj>,
    pub recv_cq: Arc<CqObj>,
    pub srq: Option<Arc<SrqObj>>,
    pub handle: AtomicU64,
    async_sink: Arc<AsyncSink>,
    pub async_events_reported: AtomicU32,
    mrs: Arc<MrTable>,
    device: Arc<DeviceInfo>,
    net: Arc<Net>,
    destroyed: AtomicBool,
    /// When an application thread last drove this QP from `ibv_poll_cq` (engine clock, ms).
    polled_ms: AtomicU64,
    pub inner: Mutex<QpInner>,
}

/// How long after reading a peer's FIN its QP goes to ERROR (see `Link::peer_closed`).
const PEER_CLOSE_GRACE_MS: u64 = 100;

/// How long after an application thread last polled the progress thread leaves a QP to it.
const POLLER_GRACE_MS: u64 = 2;

/// What the progress thread made of a QP.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Progress {
    /// Served; nothing more now.
    Done,
    /// Served, and more input is waiting (receive budget used up).
    More,
    /// Left alone (polled by the application, or busy): look again shortly.
    Deferred,
}

impl std::fmt::Debug for Net {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Net(slot {})", self.slot)
    }
}

impl Qp {
    /// Async events the application read for this QP.
    pub fn async_events_to_ack(&self) -> u32 {
        self.async_sink.settle(self.handle.load(Ordering::Acquire), &self.async_events_reported)
    }

    pub fn state(&self) -> QpState {
        self.inner.lock().attrs.qp_state
    }

    fn env(&self, qp_access: u32) -> Env<'_> {
        Env {
            qpn: self.qpn,
            pd: self.pd,
            sq_sig_all: self.sq_sig_all,
            qp_access,
            mrs: &self.mrs,
            dma: self.net.dma,
            send_cq: &self.send_cq,
            recv_cq: &self.recv_cq,
            srq: self.srq.as_deref(),
        }
    }

    /// `ibv_modify_qp`: validates against the RC state machine, applies, and performs what the
    /// transition implies (connect on RTR, flush on ERR, empty queues on RESET).
    pub fn modify(&self, req: &QpAttrs, mask: u32, limits: &DeviceLimits) -> Result<(), qp_state::ModifyError> {
        let mut inner = self.inner.lock();
        let t = qp_state::validate_modify(&inner.attrs, req, mask, limits)?;
        qp_state::apply(&mut inner.attrs, req, mask);
        match t.to {
            QpState::Err if t.state_change => {
                self.stop_locked(&mut inner);
            }
            QpState::Reset => {
                if let Some(l) = inner.dp.link.as_ref() {
                    self.net.unwatch(&l.sock);
                }
                inner.dp.reset();
                inner.parked = None;
                inner.attrs = qp_state::init_attrs_from_create(&self.cap);
            }
            _ => {}
        }
        if t.connect {
            match self.connect_locked(&mut inner) {
                Some(f) => self.fail_locked(inner, f),
                // Send the MPA Request, or the Reply to a parked Request, now.
                None => self.kick(inner),
            }
        }
        Ok(())
    }

    /// INIT→RTR: open the stream to the peer QP, or take the one it already opened.
    fn connect_locked(&self, inner: &mut QpInner) -> Option<Fatal> {
        let a = inner.attrs;
        let remote = std::net::Ipv4Addr::from(qp_state::gid_to_ipv4(&a.ah.dgid)?);
        let local = self.device.gids.get(a.ah.sgid_index as usize).and_then(gid_ipv4).unwrap_or(std::net::Ipv4Addr::LOCALHOST);
        if !net::is_initiator(local, self.qpn, remote, a.dest_qp_num) {
            if let Some(p) = inner.parked.take() {
                let hello = QpHello { to_qpn: self.qpn, from_qpn: a.dest_qp_num };
                return self.adopt_locked(inner, hello, p).err().map(|_| Fatal::Rejected);
            }
            return None;
        }
        let Some(addr) = net::qp_address(remote, a.dest_qp_num, self.net.port_base) else {
            return Some(Fatal::Lost);
        };
        let sock = match TcpStream::connect_timeout(&addr.into(), Duration::from_secs(5)) {
            Ok(s) => s,
            Err(e) => {
                if std::env::var_os("UIW_DEBUG").is_some() {
                    eprintln!("uiw: QP 0x{:06x}: cannot reach QP 0x{:06x} at {addr}: {e}", self.qpn, a.dest_qp_num);
                }
                return Some(Fatal::Lost);
            }
        };
        let Ok(mss) = net::prepare(&sock) else {
            return Some(Fatal::Lost);
        };
        let hello = QpHello { to_qpn: a.dest_qp_num, from_qpn: self.qpn };
        let cfg = net::config(Role::Initiator, ird(&a), ord(&a), hello.encode(), mss);
        let link = Link::new(Connection::new(cfg, net::now_ms()), sock);
        if self.net.watch(&link.sock, self.qpn).is_err() {
            return Some(Fatal::Lost);
        }
        inner.dp.link = Some(link);
        None
    }

    /// A stream the listener matched to this QP (its MPA Request names us). Taken if we are in
    /// RTR/RTS and expect that peer; parked if we have not reached RTR yet.
    #[allow(clippy::result_large_err)] // the stream goes back to the caller, to be rejected
    pub fn offer(&self, net: &Net, hello: QpHello, p: Pending) -> Result<(), Pending> {
        let mut inner = self.inner.lock();
        if self.destroyed.load(Ordering::Acquire) || inner.dp.link.is_some() {
            return Err(p);
        }
        match inner.attrs.qp_state {
            QpState::Reset | QpState::Init => {
                let _ = net.watch(&p.sock, self.qpn);
                inner.parked = Some(p);
                Ok(())
            }
            QpState::Rtr | QpState::Rts if inner.attrs.dest_qp_num == hello.from_qpn => {
                self.adopt_locked(&mut inner, hello, p)?;
                self.kick(inner);
                Ok(())
            }
            _ => Err(p),
        }
    }

    #[allow(clippy::result_large_err)] // the stream goes back to the caller, to be rejected
    fn adopt_locked(&self, inner: &mut QpInner, hello: QpHello, mut p: Pending) -> Result<(), Pending> {
        if inner.attrs.dest_qp_num != hello.from_qpn {
            return Err(p);
        }
        let a = inner.attrs;
        let reply = QpHello { to_qpn: hello.from_qpn, from_qpn: self.qpn };
        if p.conn.accept(ird(&a), ord(&a), &reply.encode(), net::now_ms()).is_err() {
            return Err(p);
        }
        if self.net.watch(&p.sock, self.qpn).is_err() {
            return Err(p);
        }
        inner.dp.link = Some(Link::new(p.conn, p.sock));
        Ok(())
    }

    /// The progress thread: serve this QP's stream, unless an application thread is polling
    /// it (then that thread receives, and the two do not fight over the QP: a progress thread
    /// preempted while holding the lock would stall a spinning poller for a whole time slice)
    /// or holds the QP right now.
    pub fn progress(&self, now: u64) -> Progress {
        if now.saturating_sub(self.polled_ms.load(Ordering::Relaxed)) < POLLER_GRACE_MS {
            return Progress::Deferred;
        }
        let Some(mut inner) = self.inner.try_lock() else {
            return Progress::Deferred;
        };
        match self.pump_locked(&mut inner) {
            Some((_, Some(f))) => {
                self.fail_locked(inner, f);
                Progress::Done
            }
            Some((true, None)) => Progress::More,
            _ => Progress::Done,
        }
    }

    /// `ibv_poll_cq` found nothing: serve the stream here unless another thread is at it.
    pub fn try_progress(&self) {
        self.polled_ms.store(net::now_ms(), Ordering::Relaxed);
        if let Some(mut inner) = self.inner.try_lock() {
            if let Some((_, Some(f))) = self.pump_locked(&mut inner) {
                self.fail_locked(inner, f);
            }
        }
    }

    fn pump_locked(&self, inner: &mut QpInner) -> Option<(bool, Option<Fatal>)> {
        if inner.dp.link.is_none() || inner.attrs.qp_state == QpState::Err {
            return None;
        }
        if inner.dp.link.as_ref().and_then(|l| l.peer_closed).is_some_and(|t| net::now_ms().saturating_sub(t) >= PEER_CLOSE_GRACE_MS) {
            return Some((false, Some(Fatal::Lost)));
        }
        let env = self.env(inner.attrs.qp_access_flags);
        let r = inner.dp.pump(&env);
        self.after(inner);
        Some(r)
    }

    /// Reports what negotiation produced to connection management (rdma_cm): ESTABLISHED
    /// (the QP moves to RTS, as iw_cm moves it) or REJECTED.
    fn after(&self, inner: &mut QpInner) {
        if inner.dp.notices.is_empty() {
            return;
        }
        for n in std::mem::take(&mut inner.dp.notices) {
            let Some(cm) = inner.cm.clone() else { continue };
            match n {
                Notice::Established(neg) => {
                    if inner.attrs.qp_state == QpState::Rtr {
                        inner.attrs.qp_state = QpState::Rts;
                    }
                    cm.established(&neg.private_data, neg.ird, neg.ord);
                }
                Notice::Rejected(pd) => cm.rejected(&pd),
            }
        }
    }

    /// MPA negotiation deadlines, the QP of a peer that closed its stream, and a periodic look
    /// at the stream (every 100 ms, from the progress thread's sweep).
    pub fn handle_timeout(&self, now: u64) {
        let Some(mut inner) = self.inner.try_lock() else {
            return;
        };
        let Some(l) = inner.dp.link.as_mut() else {
            return;
        };
        if l.peer_closed.is_some_and(|t| now.saturating_sub(t) >= PEER_CLOSE_GRACE_MS) {
            l.conn.handle_eof();
            self.fail_locked(inner, Fatal::Lost);
            return;
        }
        if l.conn.poll_timeout().is_some_and(|d| d <= now) {
            l.conn.handle_timeout(now);
            let env = self.env(inner.attrs.qp_access_flags);
            if let Some(f) = inner.dp.drain_events(&env) {
                self.fail_locked(inner, f);
            }
            return;
        }
        // A pump stops reading at a short read; an end of stream that came with the last
        // bytes raises no new event. Look once in a while, unless an application thread is
        // polling this QP anyway.
        if now.saturating_sub(self.polled_ms.load(Ordering::Relaxed)) >= POLLER_GRACE_MS {
            if let Some((_, Some(f))) = self.pump_locked(&mut inner) {
                self.fail_locked(inner, f);
            }
        }
    }

    /// The QP goes to ERROR from the inside (peer Terminate, lost stream, local WR error): the
    /// stream closes, every outstanding WR is flushed, `IBV_EVENT_QP_FATAL` is raised.
    fn fail_locked(&self, mut inner: parking_lot::MutexGuard<'_, QpInner>, why: Fatal) {
        if inner.attrs.qp_state == QpState::Err {
            return;
        }
        if std::env::var_os("UIW_DEBUG").is_some() {
            eprintln!("uiw: QP 0x{:06x} to ERROR: {why:?}", self.qpn);
        }
        self.after(&mut inner);
        inner.attrs.qp_state = QpState::Err;
        self.stop_locked(&mut inner);
        let cm = inner.cm.clone();
        drop(inner);
        if let Some(cm) = &cm {
            // rdma_cm reports the end of the connection; a lost or refused stream is not a QP
            // error of its own (iw_cm raises no async event for it), a Terminate is.
            cm.ended(match why {
                Fatal::Rejected => libc::ECONNREFUSED,
                Fatal::LocalError => libc::EIO,
                _ => libc::ECONNRESET,
            });
            if !matches!(why, Fatal::Terminated | Fatal::LocalError) {
                return;
            }
        }
        if !self.destroyed.load(Ordering::Acquire) {
            self.async_sink.raise(self.handle.load(Ordering::Acquire), event_type::QP_FATAL, &self.async_events_reported);
        }
    }

    // ---- connection management (the librdmacm drop-in, uiw_cm.h) ----

    /// `rdma_accept`: the stream of a CONNECT_REQUEST becomes this QP's (INIT or RTR); the MPA
    /// Reply carries `private_data` and our IRD/ORD; the QP moves to RTS.
    pub fn cm_accept(self: &Arc<Self>, cm: &Arc<CmConn>, private_data: &[u8], ird: u16, ord: u16) -> Result<(), i32> {
        let mut inner = self.cm_ready(ird, ord)?;
        let mut p = cm.pending.lock().take().ok_or(libc::EINVAL)?;
        if p.conn.accept(ird.max(1), ord.max(1), private_data, net::now_ms()).is_err() {
            return Err(libc::EINVAL);
        }
        self.cm_attach(&mut inner, cm, Link::new(p.conn, p.sock))?;
        self.kick(inner);
        Ok(())
    }

    /// `rdma_connect`: MPA Request with `private_data` and our IRD/ORD on `sock` (connected or
    /// connecting); the QP (INIT or RTR) moves to RTS when the Reply accepts.
    pub fn cm_connect(self: &Arc<Self>, cm: &Arc<CmConn>, sock: TcpStream, private_data: &[u8], ird: u16, ord: u16) -> Result<(), i32> {
        let mut inner = self.cm_ready(ird, ord)?;
        let mss = net::prepare(&sock).map_err(|e| e.raw_os_error().unwrap_or(libc::EIO))?;
        let cfg = net::config(Role::Initiator, ird.max(1), ord.max(1), private_data.to_vec(), mss);
        self.cm_attach(&mut inner, cm, Link::new(Connection::new(cfg, net::now_ms()), sock))?;
        self.kick(inner);
        Ok(())
    }

    /// The QP side of accept/connect: RC in INIT or RTR without a stream (EINVAL otherwise);
    /// records the IRD/ORD the connection is made with.
    fn cm_ready(&self, ird: u16, ord: u16) -> Result<parking_lot::MutexGuard<'_, QpInner>, i32> {
        let mut inner = self.inner.lock();
        if inner.dp.link.is_some() || !matches!(inner.attrs.qp_state, QpState::Init | QpState::Rtr) {
            return Err(libc::EINVAL);
        }
        inner.attrs.max_dest_rd_atomic = ird.min(255) as u8;
        inner.attrs.max_rd_atomic = ord.min(255) as u8;
        Ok(inner)
    }

    /// Gives the QP its rdma_cm stream: served by the progress thread, the QP in RTR until MPA
    /// completes (then RTS, see `after`).
    fn cm_attach(self: &Arc<Self>, inner: &mut QpInner, cm: &Arc<CmConn>, link: Link) -> Result<(), i32> {
        self.net.watch(&link.sock, self.qpn).map_err(|e| e.raw_os_error().unwrap_or(libc::EIO))?;
        inner.cm = Some(cm.clone());
        *cm.qp.lock() = Arc::downgrade(self);
        inner.attrs.qp_state = QpState::Rtr;
        inner.dp.link = Some(link);
        Ok(())
    }

    /// `rdma_disconnect`: the QP goes to ERROR (WRs flushed), the stream closes, and
    /// DISCONNECTED is reported.
    pub fn cm_disconnect(&self) {
        let mut inner = self.inner.lock();
        if inner.attrs.qp_state != QpState::Err {
            inner.attrs.qp_state = QpState::Err;
            self.stop_locked(&mut inner);
        }
        let cm = inner.cm.clone();
        drop(inner);
        if let Some(cm) = cm {
            cm.ended(0);
        }
    }

    /// Serves the stream now (after attaching it), failing the QP if that fails.
    fn kick(&self, mut inner: parking_lot::MutexGuard<'_, QpInner>) {
        if let Some((_, Some(f))) = self.pump_locked(&mut inner) {
            self.fail_locked(inner, f);
        }
    }

    /// Closes the stream and flushes everything outstanding.
    fn stop_locked(&self, inner: &mut QpInner) {
        if let Some(l) = inner.dp.link.as_ref() {
            self.net.unwatch(&l.sock);
        }
        let env = self.env(inner.attrs.qp_access_flags);
        inner.dp.shutdown(&env, true);
        inner.parked = None;
    }

    /// `ibv_post_recv` for one WR. A QP with an SRQ takes receives from it only (EINVAL here,
    /// as the kernel's providers). In ERROR the WR completes at once, flushed.
    pub fn post_recv(&self, wqe: RecvWqe) -> Result<(), PostError> {
        if self.srq.is_some() {
            return Err(PostError::BadState);
        }
        if wqe.sges.len() > self.cap.max_recv_sge as usize {
            return Err(PostError::TooManySges);
        }
        let mut inner = self.inner.lock();
        if inner.attrs.qp_state == QpState::Err {
            drop(inner);
            self.recv_cq.push(wqe.flushed(self.qpn));
            return Ok(());
        }
        if inner.dp.rq.len() >= self.cap.max_recv_wr as usize {
            return Err(PostError::QueueFull);
        }
        let env = self.env(inner.attrs.qp_access_flags);
        if let Some(f) = inner.dp.post_recv(&env, wqe, false) {
            self.fail_locked(inner, f);
        }
        Ok(())
    }

    /// `ibv_post_send` for one WR: checked as the kernel's providers check at post time. In
    /// ERROR the WR completes at once, flushed; before RTR it is refused (EINVAL). Posted before
    /// the stream is up, it waits.
    pub fn post_send(&self, wqe: SendWqe) -> Result<(), PostError> {
        use super::wr::{opcode, Payload};
        if wqe.opcode > opcode::SEND_WITH_INV || matches!(wqe.opcode, opcode::LOCAL_INV | opcode::BIND_MW) {
            return Err(if wqe.opcode > opcode::SEND_WITH_INV { PostError::BadOpcode } else { PostError::Unsupported });
        }
        match &wqe.payload {
            Payload::Sges(s) if s.len() > self.cap.max_send_sge as usize => return Err(PostError::TooManySges),
            Payload::Inline(b) if b.len() > self.cap.max_inline_data as usize => return Err(PostError::InlineTooLong),
            _ => {}
        }
        let mut inner = self.inner.lock();
        match inner.attrs.qp_state {
            QpState::Err => {
                drop(inner);
                self.send_cq.push(wqe.flushed(self.qpn));
                Ok(())
            }
            // iWARP has no RTR of its own (RFC 5040's QP states: Idle, RTS, Closing,
            // Terminate, Error): the stream is set up at RTR, so sends posted there are queued
            // and go out once it is up. perftest's send tests need it: their server stays in
            // RTR and posts credit Writes.
            QpState::Rtr | QpState::Rts | QpState::Sqd => {
                let env = self.env(inner.attrs.qp_access_flags);
                if let Some(f) = inner.dp.post_send(&env, wqe, self.cap.max_send_wr)? {
                    self.fail_locked(inner, f);
                }
                Ok(())
            }
            _ => Err(PostError::BadState),
        }
    }
}

/// Our IRD (inbound Reads we serve at once): `max_dest_rd_atomic`, at least 1.
fn ird(a: &QpAttrs) -> u16 {
    u16::from(a.max_dest_rd_atomic.max(1))
}

/// Our ORD (Reads we issue at once): `max_rd_atomic`, at least 1.
fn ord(a: &QpAttrs) -> u16 {
    u16::from(a.max_rd_atomic.max(1))
}
