//! One open device context and the verbs objects created on it. Everything here is plain safe
//! Rust: the FFI layer turns C pointers into these objects and back.

use std::collections::{HashMap, VecDeque};
use std::fs::File;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;

use super::cq::{Completion, Cq, Pushed};
use super::device::DeviceInfo;
use super::events::{event_type, AsyncSink, ChannelSink};
use super::limits::DeviceLimits;
use super::mr::MrTable;
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
    pub mrs: MrTable,
    async_sink: Arc<AsyncSink>,
    next_handle: AtomicU32,
    next_qpn: AtomicU32,
    counts: Mutex<Counts>,
    /// Completion channels created through the command fd: read fd → write end.
    channels: Mutex<HashMap<i32, Arc<ChannelSink>>>,
}

impl Context {
    pub fn new(device: Arc<DeviceInfo>, limits: DeviceLimits, async_pipe: File) -> Context {
        Context {
            mrs: MrTable::new(limits.max_mr as usize),
            device,
            limits,
            async_sink: Arc::new(AsyncSink::new(async_pipe)),
            next_handle: AtomicU32::new(1),
            next_qpn: AtomicU32::new(1),
            counts: Mutex::new(Counts::default()),
            channels: Mutex::new(HashMap::new()),
        }
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

    /// Fails with `EBUSY` while regions, QPs or SRQs still use the PD, as the kernel does.
    pub fn dealloc_pd(&self, pd: u32) -> Result<(), i32> {
        let mut c = self.counts.lock();
        let users = c.pds.get(&pd).copied().ok_or(libc::EINVAL)?;
        if users > 0 || self.mrs.count_in_pd(pd) > 0 {
            return Err(libc::EBUSY);
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
        let cap = qp_state::validate_create(&spec.cap, spec.qp_type, spec.srq.is_some(), &self.limits)
            .map_err(|e| e.errno())?;
        let mut c = self.counts.lock();
        if c.qps >= self.limits.max_qp as usize {
            return Err(libc::ENOMEM);
        }
        c.qps += 1;
        drop(c);
        self.pd_ref(spec.pd, 1);
        spec.send_cq.users.fetch_add(1, Ordering::AcqRel);
        spec.recv_cq.users.fetch_add(1, Ordering::AcqRel);
        if let Some(s) = &spec.srq {
            s.users.fetch_add(1, Ordering::AcqRel);
        }
        let qpn = self.next_qpn.fetch_add(1, Ordering::Relaxed) & 0x00ff_ffff;
        Ok(Arc::new(Qp {
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
            inner: Mutex::new(QpInner { attrs: qp_state::init_attrs_from_create(&cap), sq: VecDeque::new(), rq: VecDeque::new() }),
        }))
    }

    pub fn destroy_qp(&self, qp: &Qp) {
        // Like the kernel: outstanding WRs vanish without completions, and the QP's
        // completions still queued in its CQs are discarded.
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
}

impl CqObj {
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
    pub sq: VecDeque<SendWqe>,
    pub rq: VecDeque<RecvWqe>,
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
    pub inner: Mutex<QpInner>,
}

impl Qp {
    pub fn state(&self) -> QpState {
        self.inner.lock().attrs.qp_state
    }

    /// `ibv_modify_qp`: validates against the RC state machine, applies, and performs what the
    /// transition implies (flush on ERR, empty queues on RESET).
    pub fn modify(&self, req: &QpAttrs, mask: u32, limits: &DeviceLimits) -> Result<(), qp_state::ModifyError> {
        let mut inner = self.inner.lock();
        let t = qp_state::validate_modify(&inner.attrs, req, mask, limits)?;
        qp_state::apply(&mut inner.attrs, req, mask);
        match t.to {
            QpState::Err => {
                let flushed = self.flush_locked(&mut inner);
                drop(inner);
                self.deliver(flushed);
            }
            QpState::Reset => {
                inner.sq.clear();
                inner.rq.clear();
                inner.attrs = qp_state::init_attrs_from_create(&self.cap);
            }
            _ => {}
        }
        Ok(())
    }

    /// Moves the QP to ERROR from the inside (fatal error, peer Terminate, lost connection):
    /// every outstanding WR is flushed and `IBV_EVENT_QP_FATAL` is raised.
    pub fn fail(&self) {
        let mut inner = self.inner.lock();
        if inner.attrs.qp_state == QpState::Err {
            return;
        }
        inner.attrs.qp_state = QpState::Err;
        let flushed = self.flush_locked(&mut inner);
        drop(inner);
        self.deliver(flushed);
        self.async_sink.raise(self.handle.load(Ordering::Acquire), event_type::QP_FATAL, &self.async_events_reported);
    }

    fn flush_locked(&self, inner: &mut QpInner) -> (Vec<Completion>, Vec<Completion>) {
        let sends = inner.sq.drain(..).map(|w| w.flushed(self.qpn)).collect();
        let recvs = inner.rq.drain(..).map(|w| w.flushed(self.qpn)).collect();
        (sends, recvs)
    }

    fn deliver(&self, (sends, recvs): (Vec<Completion>, Vec<Completion>)) {
        for c in sends {
            self.send_cq.push(c);
        }
        for c in recvs {
            self.recv_cq.push(c);
        }
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
        if inner.rq.len() >= self.cap.max_recv_wr as usize {
            return Err(PostError::QueueFull);
        }
        inner.rq.push_back(wqe);
        Ok(())
    }

    /// `ibv_post_send` for one WR: checks it as the kernel's providers do at post time. In ERROR
    /// the WR completes at once, flushed; before RTS it is refused (EINVAL).
    pub fn post_send(&self, wqe: SendWqe) -> Result<(), PostError> {
        use super::wr::{opcode, send_flags, Payload};
        if wqe.opcode > opcode::SEND_WITH_INV {
            return Err(PostError::BadOpcode);
        }
        match &wqe.payload {
            Payload::Sges(s) if s.len() > self.cap.max_send_sge as usize => return Err(PostError::TooManySges),
            Payload::Inline(b) if b.len() > self.cap.max_inline_data as usize => return Err(PostError::InlineTooLong),
            _ => {}
        }
        let _ = send_flags::SIGNALED;
        let inner = self.inner.lock();
        match inner.attrs.qp_state {
            QpState::Err => {
                drop(inner);
                self.send_cq.push(wqe.flushed(self.qpn));
                Ok(())
            }
            QpState::Rts | QpState::Sqd => {
                if inner.sq.len() >= self.cap.max_send_wr as usize {
                    return Err(PostError::QueueFull);
                }
                // The data path (issue "Data path") is not there yet: refuse rather than queue
                // work that would never complete.
                Err(PostError::Unsupported)
            }
            _ => Err(PostError::BadState),
        }
    }
}
