//! A queue pair: its attributes and state (RC, `ibv_modify_qp`), its data path, the stream
//! that carries it (opened at RTR or handed over by rdma_cm), and who drives it.

use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;
use uiw_wire::conn::{Connection, Role, State as WireState};

use super::cm::{CmConn, CmQp, CmStatus};
use super::cq::{CqObj, PolledQp, Poller};
use super::datapath::{DataPath, Env, Fatal, Holder, Link, Notice};
use super::device::{gid_ipv4, DeviceInfo, TransportKind};
use super::error::{Error, Result};
use super::events::{event_type, AsyncSink};
use super::clock::earliest;
use super::lease::{AlarmView, Arming, Check, Lease};
use super::limits::{DeviceLimits, MAX_QP_INIT_RD_ATOM};
use super::mr::MrTable;
use super::net::{Endpoint, Net, Progress};
use super::qp_state::{self, QpAttrs, QpState};
use super::srq::SrqObj;
use super::stats::QpStats;
use super::transport::kernel::KernelStream;
use super::transport::{config, is_initiator, now_ms, now_us, qp_address, Expected, Pending, QpHello, Stream, Verdict};
use super::wr::{PostError, RecvWqe, SendWqe};

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
    /// Streams that named this QP before it could decide on them (before RTR, or before RTS
    /// when the opener gave only its `rq_psn`): at most [`MAX_PARKED`], the oldest dropped.
    pub(crate) parked: Vec<(Pending, QpHello)>,
    /// This QP opens the stream, once in RTS (when it knows its `sq_psn`, the stronger proof)
    /// or at this time (engine clock) if it is left in RTR — unless its peer opens first (see
    /// [`Qp::open_early`]).
    pub(crate) open_at: Option<u64>,
    /// The stream was opened by this QP though its peer is the opener ([`Qp::open_early`]):
    /// until MPA completes on it, a stream from the peer that proves itself replaces it, and
    /// its failure (the peer refused it, having opened its own) only drops it.
    pub(crate) provisional: bool,
    /// rdma_cm connection this QP belongs to (the librdmacm drop-in).
    pub(crate) cm: Option<Arc<CmConn>>,
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
    pub(crate) async_sink: Arc<AsyncSink>,
    pub async_events_reported: AtomicU32,
    pub(crate) mrs: Arc<MrTable>,
    pub(crate) device: Arc<DeviceInfo>,
    pub(crate) net: Arc<Net>,
    pub(crate) destroyed: AtomicBool,
    /// The stream has news (readiness) for whichever thread holds the QP: it serves the
    /// stream again before it lets go (see [`Qp::serve`]).
    pub(crate) kick: AtomicBool,
    /// An application poll found the QP taken: the holder pumps once more for it before it
    /// lets go, but only once per hold (see [`Qp::try_progress`]).
    pub(crate) polled: AtomicBool,
    /// The progress thread's sweep found a deadline of the QP's that may be due while another
    /// thread held the QP: that thread handles it before it lets go (see [`Qp::handle_timeout`]).
    pub(crate) timer: AtomicBool,
    /// The QP at the other end of the stream when it is one of this process's (two QPs
    /// connected to each other in one program, as rdma-core's own tests connect them), found
    /// once the stream is up; `None` for a peer elsewhere (see [`Qp::local_peer`]).
    pub(crate) local_peer: std::sync::OnceLock<Option<std::sync::Weak<dyn Endpoint>>>,
    /// The progress thread saw the peer hang up (EPOLLRDHUP/EPOLLHUP): the next pump reads
    /// to the end of the stream.
    pub(crate) hup: AtomicBool,
    /// The progress thread saw the socket take bytes again (EPOLLOUT): the next pump sends
    /// (`DataPath::writable`).
    pub(crate) writable: AtomicBool,
    /// The stream's buffer was full at the end of the last pump (`DataPath::tx_blocked`): a
    /// poll of the QP's CQ that finds nothing can do nothing for it either (`CqObj::drive`).
    pub(crate) tx_full: AtomicBool,
    /// A lone RDMA Write's completion waits for the peer's answer (`datapath::answer`): polls
    /// of its CQ that keep finding nothing claim the QP, to read the answer themselves.
    pub(crate) awaits_answer: AtomicBool,
    /// A wait for an answer ended without one: the poller hands the QP back (it will wait by
    /// other means, and the progress thread must serve the answer).
    pub(crate) answer_gave_up: AtomicBool,
    /// The stream's descriptor when its readability tells whether input waits (a kernel
    /// socket, `Stream::readiness_is_input`); -1 otherwise or with no stream (see
    /// `PolledQp::input_probe`). Read without the QP's lock: a stream closed meanwhile, its
    /// number reused, makes one look report another descriptor — at worst a serve skips one
    /// `recv` whose input the next poll reads.
    pub(crate) input_fd: AtomicI32,
    /// Counters `uiw stat` reads (see `stats`).
    pub(crate) stats: QpStats,
    /// Whether an application thread that polls drives the stream instead of the progress
    /// thread (see `lease`).
    pub(crate) lease: Lease,
    /// The polls of the QP's CQs counted at the last post (see [`Qp::defer_doorbell`]).
    pub(crate) polls_at_post: AtomicU64,
    /// Payload bytes of the posted chain whose doorbell has not rung yet (see
    /// [`DEFER_MAX_BYTES`]).
    pub(crate) chain_bytes: AtomicU64,
    /// A doorbell waits for the poller's next poll (see [`Qp::defer_doorbell`]); cleared by
    /// the pump that sends what it left queued.
    pub(crate) doorbell_waits: AtomicBool,
    pub inner: Mutex<QpInner>,
}

/// A post (or posted chain) carrying more payload than this rings its doorbell at once, never
/// waiting for the next poll (`Qp::defer_doorbell`): waiting saves it no system call (it is a
/// `sendmsg` of its own size anyway) and leaves the socket idle meanwhile — 1 MiB Writes lost
/// a third of their bandwidth to it.
const DEFER_MAX_BYTES: u64 = 16 << 10;

/// Streams a QP keeps waiting for its decision (a peer that connects early, strangers).
const MAX_PARKED: usize = 4;

/// How long an opening QP left in RTR waits for RTS before it connects with its `rq_psn` as
/// the only proof (perftest's send-test server stays in RTR) — unless its peer's stream,
/// opened at the peer's RTS (`Qp::open_early`), comes first, as it does when the peer is the
/// side that sends.
const OPEN_WAIT_MS: u64 = 200;

impl std::fmt::Debug for Net {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Net(slot {})", self.slot)
    }
}

/// How many receive budgets (`datapath::RX_BUDGET`) an application thread reads in one call
/// before it returns, leaving the rest to its next poll or to the progress thread (see
/// `Qp::serve_held`): 1 MiB, an MPI rendezvous message. With one budget per call Open MPI's
/// 1 MiB stream over `ofi_rxm` lost 5–8 % in four interleaved pairs out of four; with four,
/// 1.00–1.34× the unbounded serve in five.
const APP_RX_BUDGETS: u32 = 4;

impl Qp {
    /// Async events the application read for this QP.
    pub fn async_events_to_ack(&self) -> u32 {
        self.async_sink.settle(self.handle.load(Ordering::Acquire), &self.async_events_reported)
    }

    pub fn state(&self) -> QpState {
        let s = self.inner.lock().attrs.qp_state;
        self.settle();
        s
    }

    /// The current attributes (`ibv_query_qp`).
    pub fn attrs(&self) -> QpAttrs {
        let a = self.inner.lock().attrs;
        self.settle();
        a
    }

    /// After releasing the QP: serve the stream if news came while we held it, and handle the
    /// deadlines the sweep found due meanwhile (the thread that brought either found the QP
    /// taken and left it to us).
    fn settle(&self) {
        std::sync::atomic::fence(Ordering::SeqCst);
        if self.kick.load(Ordering::SeqCst) || self.timer.load(Ordering::SeqCst) {
            if let Some(inner) = self.inner.try_lock() {
                self.serve_held(inner, false);
            }
        }
    }

    /// Serves the QP's stream now, for a thread that has news for it: the progress thread on
    /// readiness, a thread that let go of the QP while news was up (`settle`). Never waits for
    /// a thread that holds the QP: that thread serves the stream again before it lets go
    /// (`kick`, then `settle`), so no arrival waits for a timer. Returns `More` when the
    /// receive budget ran out with input left (the progress thread comes back to it after the
    /// other QPs).
    ///
    /// `rotate`: the progress thread, which comes back to a QP whose receive budget ran out
    /// after the other QPs. An application thread reads up to [`APP_RX_BUDGETS`] budgets and
    /// returns `More` too: the rest is for the poller's next poll, or for the progress
    /// thread — except when a thread asleep on a completion channel holds the QP, for which
    /// it serves on (letting go of the QP between budgets, so that a thread posting to it
    /// gets in).
    pub fn serve(&self, rotate: bool) -> Progress {
        self.kick.store(true, Ordering::SeqCst);
        std::sync::atomic::fence(Ordering::SeqCst);
        match self.inner.try_lock() {
            Some(inner) => self.serve_held(inner, rotate),
            None => Progress::Done,
        }
    }

    /// Serves the stream while holding the QP: for as long as `kick` is up, once for the polls
    /// that found the QP taken meanwhile (`polled`), and again after letting go if news came
    /// just then (the thread that brought it found the QP taken).
    ///
    /// Polls are answered once per hold, not for as long as they come: an application that
    /// spins on an empty CQ polls during every pump of the holder, and were each poll answered
    /// with another pump, a holder that is the progress thread would serve this QP for as
    /// long as the spinning lasts and never get back to its other streams, listener and
    /// deadlines — a hang when what the application waits for depends on those (the peer QP's
    /// MPA Reply, an accepted stream, a timeout). The one pump after the polls still reads the
    /// stream until it would block (an application thread: at most [`APP_RX_BUDGETS`] receive
    /// budgets) and sends what they left queued (a deferred doorbell);
    /// whatever comes later is news for the progress thread, or for the poller's next poll
    /// when it leases the QP.
    fn serve_held<'a>(&'a self, inner: parking_lot::MutexGuard<'a, QpInner>, rotate: bool) -> Progress {
        self.serve_held_with(inner, rotate, false, false)
    }

    /// [`Qp::serve_held`]; `input_quiet`: the stream had nothing to read a moment ago — the
    /// hold's first pump makes no `recv` (its later ones, for news that came meanwhile, do);
    /// `for_poll`: the hold is a poll's, which pumps at once (it raised no flag to say so).
    fn serve_held_with<'a>(&'a self, mut inner: parking_lot::MutexGuard<'a, QpInner>, rotate: bool, mut input_quiet: bool, mut for_poll: bool) -> Progress {
        let mut polls_answered = for_poll;
        // Receive budgets this call used up (see below).
        let mut budgets = 0;
        loop {
            let mut more = false;
            if super::flag::take(&self.timer) {
                if let Some(f) = self.timeouts_locked(&mut inner, now_ms()) {
                    self.fail_locked(inner, f);
                    return Progress::Done;
                }
            }
            while !more && (std::mem::take(&mut for_poll) || self.news(&mut polls_answered)) {
                match self.pump_locked_with(&mut inner, std::mem::take(&mut input_quiet)) {
                    Some((_, Some(f))) => {
                        self.fail_locked(inner, f);
                        return Progress::Done;
                    }
                    Some((m, None)) => more = m,
                    None => {}
                }
            }
            drop(inner);
            if more {
                if rotate {
                    return Progress::More;
                }
                budgets += 1;
                if budgets >= APP_RX_BUDGETS && !self.lease.sleeping() {
                    // Input is left (the receive budget ran out). An application thread reads
                    // a few budgets per call: a peer that streams faster than it reads must not
                    // keep its `ibv_poll_cq` from returning. A poller's lease: its next poll
                    // reads on (or the progress thread, once the lease lapses: re-arming
                    // raises the socket's pending readiness). A free QP: the progress thread
                    // reads on — its interest is edge-triggered, no new readiness reports
                    // what is left.
                    if !self.lease.held() {
                        self.net.requeue(self.qpn);
                    }
                    return Progress::More;
                }
                // A thread asleep on a completion channel holds the QP, and its wait set is
                // edge-triggered as well: nobody else would read what is left. Serve on.
                self.kick.store(true, Ordering::SeqCst);
            }
            std::sync::atomic::fence(Ordering::SeqCst);
            if !self.kick.load(Ordering::SeqCst) && !self.timer.load(Ordering::SeqCst) {
                return Progress::Done;
            }
            inner = match self.inner.try_lock() {
                Some(i) => i,
                None => return Progress::Done,
            };
        }
    }

    /// Whether the holder pumps again: news is up, or polls came that this hold has not
    /// answered yet (see [`Qp::serve_held`]).
    fn news(&self, polls_answered: &mut bool) -> bool {
        if super::flag::take(&self.kick) {
            return true;
        }
        if !*polls_answered && super::flag::take(&self.polled) {
            *polls_answered = true;
            return true;
        }
        false
    }

    pub(crate) fn env(&self, qp_access: u32) -> Env<'_> {
        Env {
            qpn: self.qpn,
            pd: self.pd,
            sq_sig_all: self.sq_sig_all,
            qp_access,
            mrs: &self.mrs,
            user_mem: self.net.user_mem,
            send_cq: &self.send_cq,
            recv_cq: &self.recv_cq,
            srq: self.srq.as_deref(),
            poller_clock: CqObj::poller_clock,
            poller_now: Default::default(),
            holder: Some(self),
        }
    }

    /// `ibv_modify_qp`: validates against the RC state machine, applies, and performs what the
    /// transition implies (connect on RTR, flush on ERR, empty queues on RESET).
    pub fn modify(&self, req: &QpAttrs, mask: u32, limits: &DeviceLimits) -> std::result::Result<(), qp_state::ModifyError> {
        let r = self.modify_unsettled(req, mask, limits);
        self.settle();
        r
    }

    fn modify_unsettled(&self, req: &QpAttrs, mask: u32, limits: &DeviceLimits) -> std::result::Result<(), qp_state::ModifyError> {
        let mut inner = self.inner.lock();
        let t = qp_state::validate_modify(&inner.attrs, req, mask, limits)?;
        qp_state::apply(&mut inner.attrs, req, mask);
        match t.to {
            QpState::Err if t.state_change => {
                self.stop_locked(&mut inner);
            }
            QpState::Reset => {
                if let Some(l) = inner.dp.link.as_ref() {
                    self.unwatch_link(&*l.stream);
                }
                inner.dp.reset();
                self.tx_full.store(false, Ordering::Relaxed);
                self.drop_parked(&mut inner);
                inner.open_at = None;
                inner.provisional = false;
                inner.attrs = qp_state::init_attrs_from_create(&self.cap);
            }
            _ => {}
        }
        let f = if t.connect {
            self.connect_locked(&mut inner)
        } else if t.start_sq && t.state_change {
            // RTS: an opener connects now with its sq_psn; an acceptor can check the
            // streams that offered only their rq_psn.
            if inner.open_at.take().is_some() {
                self.open_locked(&mut inner)
            } else {
                self.settle_parked(&mut inner);
                self.open_early(&mut inner);
                None
            }
        } else {
            None
        };
        if t.connect || t.start_sq {
            match f {
                Some(f) => self.fail_locked(inner, f),
                // Send the MPA Request, or the Reply to a parked Request, now.
                None => self.serve_locked(inner),
            }
        }
        Ok(())
    }

    /// What this QP expects of the peer that opens its stream, once the application named it.
    fn expected(&self, a: &QpAttrs) -> Option<Expected> {
        let peer = std::net::Ipv4Addr::from(qp_state::gid_to_ipv4(&a.ah.dgid)?);
        let sq_psn = matches!(a.qp_state, QpState::Rts | QpState::Sqd).then_some(a.sq_psn);
        Some(Expected { qpn: self.qpn, peer, dest_qpn: a.dest_qp_num, rq_psn: a.rq_psn, sq_psn })
    }

    /// Whether this QP is the one of the pair that opens the stream (the lower address and
    /// QPN, [`is_initiator`]); `None` while its peer has no IPv4 address.
    fn is_opener(&self, a: &QpAttrs) -> Option<bool> {
        let remote = std::net::Ipv4Addr::from(qp_state::gid_to_ipv4(&a.ah.dgid)?);
        let local = self.device.gids.get(a.ah.sgid_index as usize).and_then(gid_ipv4).unwrap_or(std::net::Ipv4Addr::LOCALHOST);
        Some(is_initiator(local, self.qpn, remote, a.dest_qp_num))
    }

    /// INIT→RTR: the lower (address, QPN) of the two opens the stream (at RTS, or after
    /// [`OPEN_WAIT_MS`] in RTR); the other takes a parked stream that proves to be its peer.
    fn connect_locked(&self, inner: &mut QpInner) -> Option<Fatal> {
        let a = inner.attrs;
        if !self.is_opener(&a)? {
            self.settle_parked(inner);
            return None;
        }
        // The peer may have opened first, at its RTS, while this QP was in INIT (see
        // `open_early`): its stream, parked, is taken if it proves itself. Other streams are
        // strangers'.
        self.settle_parked(inner);
        self.drop_parked(inner);
        if inner.dp.link.is_some() {
            return None;
        }
        if matches!(a.qp_state, QpState::Rts | QpState::Sqd) {
            return self.open_locked(inner);
        }
        inner.open_at = Some(now_ms() + OPEN_WAIT_MS);
        // The progress thread takes the new deadline.
        self.net.wake();
        None
    }

    /// Opens the stream to the peer QP without waiting for TCP: `connect` runs on; its failure
    /// (an unreachable peer) fails the QP later with an async event, as a kernel provider's
    /// connection manager does. The MPA Request goes out as soon as the socket is writable.
    fn open_locked(&self, inner: &mut QpInner) -> Option<Fatal> {
        let a = inner.attrs;
        let remote = std::net::Ipv4Addr::from(qp_state::gid_to_ipv4(&a.ah.dgid)?);
        let Some(addr) = qp_address(remote, a.dest_qp_num, self.net.port_base) else {
            return Some(Fatal::Lost);
        };
        let stream = match self.net.connector(&self.device).connect(addr) {
            Ok(s) => s,
            Err(e) => {
                crate::uiw_log!(Warn, "{}: QP 0x{:06x}: cannot reach QP 0x{:06x} at {addr}: {e}", self.device.name, self.qpn, a.dest_qp_num);
                return Some(Fatal::Lost);
            }
        };
        let mss = stream.mss();
        let sq_psn = matches!(a.qp_state, QpState::Rts | QpState::Sqd).then_some(a.sq_psn);
        let hello = QpHello { to_qpn: a.dest_qp_num, from_qpn: self.qpn, rq_psn: a.rq_psn, sq_psn };
        let cfg = config(Role::Initiator, ird(&a), ord(&a), hello.encode(), mss);
        let link = Link::new(Connection::new(cfg, now_ms()), stream);
        if self.watch_link(&*link.stream).is_err() {
            return Some(Fatal::Lost);
        }
        inner.dp.link = Some(link);
        None
    }

    /// RTR→RTS of the QP that is not the opener, with no stream yet: it opens one itself,
    /// offering both PSNs (its `sq_psn` is the peer's `rq_psn`, which the peer knows from its
    /// RTR on). An opener left in RTR — perftest's bandwidth servers stay there — would
    /// otherwise wait [`OPEN_WAIT_MS`] for an RTS that never comes before it opens, and the
    /// application's first WRs with it. The opener takes this stream if it has not opened its
    /// own yet (`offer`); if it has, it refuses this one, and the opener's stream replaces it
    /// here: whichever way the race goes, one stream remains. `provisional` marks it until MPA
    /// completes.
    fn open_early(&self, inner: &mut QpInner) {
        if inner.dp.link.is_some() || inner.cm.is_some() {
            return;
        }
        let a = inner.attrs;
        if self.is_opener(&a) != Some(false) {
            return;
        }
        // Early is optional: a stream that cannot be opened leaves the QP waiting for the
        // opener's, as before.
        if let Some(f) = self.open_locked(inner) {
            crate::engine::debug::why(format_args!("QP 0x{:06x}: no early stream to QP 0x{:06x} ({f:?}); waiting for its", self.qpn, a.dest_qp_num));
        }
        inner.provisional = inner.dp.link.is_some();
    }

    /// Drops a provisional stream that lost the race (see [`Qp::open_early`]): nothing was
    /// handed to it (WRs go to a stream once MPA completes), so closing it loses nothing.
    fn drop_provisional(&self, inner: &mut QpInner) {
        inner.provisional = false;
        if let Some(l) = inner.dp.link.take() {
            self.unwatch_link(&*l.stream);
        }
        inner.dp.notices.clear();
        self.tx_full.store(false, Ordering::Relaxed);
    }

    /// Refuses a stream (MPA Reply with R=1, then FIN), without blocking.
    fn refuse(&self, p: Pending) {
        self.net.unwatch(&*p.stream);
        self.net.linger(p.rejected(&[]));
    }

    fn drop_parked(&self, inner: &mut QpInner) {
        for (p, _) in std::mem::take(&mut inner.parked) {
            self.refuse(p);
        }
    }

    /// Decides on the parked streams with what this QP knows now: the first that proves to be
    /// the peer becomes the QP's stream, the ones that cannot be are refused, the rest wait.
    fn settle_parked(&self, inner: &mut QpInner) {
        let Some(e) = self.expected(&inner.attrs) else { return };
        for (p, h) in std::mem::take(&mut inner.parked) {
            if inner.dp.link.is_some() {
                self.refuse(p);
                continue;
            }
            match h.verify(peer_ipv4(&p), &e) {
                Verdict::Accept => {
                    if let Err(p) = self.adopt_locked(inner, p) {
                        self.refuse(p);
                    }
                }
                Verdict::Refuse => self.refuse(p),
                Verdict::Undecided => inner.parked.push((p, h)),
            }
        }
    }

    fn park(&self, inner: &mut QpInner, p: Pending, h: QpHello) {
        if inner.parked.len() >= MAX_PARKED {
            let (old, _) = inner.parked.remove(0);
            self.refuse(old);
        }
        let _ = self.net.watch(&*p.stream, self.qpn);
        inner.parked.push((p, h));
    }

    /// A stream the listener matched to this QP (its MPA Request names us). Taken if it proves
    /// to come from the peer the application named ([`QpHello::verify`]), refused if it cannot,
    /// parked if this QP cannot tell yet.
    #[allow(clippy::result_large_err)] // the stream goes back to the caller, to be rejected
    pub fn offer(&self, net: &Net, hello: QpHello, p: Pending) -> std::result::Result<(), Pending> {
        let r = self.offer_unsettled(net, hello, p);
        self.settle();
        r
    }

    #[allow(clippy::result_large_err)] // the stream goes back to the caller, to be rejected
    fn offer_unsettled(&self, _net: &Net, hello: QpHello, p: Pending) -> std::result::Result<(), Pending> {
        let mut inner = self.inner.lock();
        // A provisional stream gives way to the peer's, and an opener waiting in RTR takes the
        // stream its peer opened first (see `open_early`); neither parks what it cannot decide.
        let replaces = inner.provisional && !inner.dp.established();
        let opener = inner.open_at.is_some();
        if self.destroyed.load(Ordering::Acquire) || (inner.dp.link.is_some() && !replaces) {
            return Err(p);
        }
        match inner.attrs.qp_state {
            QpState::Reset | QpState::Init => {
                self.park(&mut inner, p, hello);
                Ok(())
            }
            QpState::Rtr | QpState::Rts | QpState::Sqd => {
                let Some(e) = self.expected(&inner.attrs) else { return Err(p) };
                match hello.verify(peer_ipv4(&p), &e) {
                    Verdict::Accept => {
                        if replaces {
                            self.drop_provisional(&mut inner);
                        }
                        inner.open_at = None;
                        self.adopt_locked(&mut inner, p)?;
                        self.serve_locked(inner);
                        Ok(())
                    }
                    Verdict::Refuse => Err(p),
                    Verdict::Undecided if opener || replaces => Err(p),
                    Verdict::Undecided => {
                        self.park(&mut inner, p, hello);
                        Ok(())
                    }
                }
            }
            _ => Err(p),
        }
    }

    /// Takes a verified stream: MPA Reply with our IRD/ORD, served by the progress thread.
    #[allow(clippy::result_large_err)] // the stream goes back to the caller, to be rejected
    fn adopt_locked(&self, inner: &mut QpInner, mut p: Pending) -> std::result::Result<(), Pending> {
        let a = inner.attrs;
        let sq_psn = matches!(a.qp_state, QpState::Rts | QpState::Sqd).then_some(a.sq_psn);
        let reply = QpHello { to_qpn: a.dest_qp_num, from_qpn: self.qpn, rq_psn: a.rq_psn, sq_psn };
        if p.conn.accept(ird(&a), ord(&a), &reply.encode(), now_ms()).is_err() {
            return Err(p);
        }
        if self.watch_link(&*p.stream).is_err() {
            return Err(p);
        }
        inner.dp.link = Some(Link::new(p.conn, p.stream));
        Ok(())
    }

    /// A poll drives the QP (`CqObj::polling`): serve the stream here unless another thread is
    /// at it. A poller that keeps polling (`Poller::Claims`) takes the QP over from the progress
    /// thread for the lease its polls renew (see `lease`); `Poller::Renews` only renews a lease
    /// already held.
    pub fn try_progress(&self, poller: Poller, now: u64, input_quiet: bool) -> bool {
        match poller {
            Poller::Claims if lease_enabled() => {
                if self.lease.renew(now) {
                    self.lease.claim(|a| self.net.apply_arming(self.qpn, a));
                } else {
                    self.net.push_lease_alarm(now);
                }
            }
            Poller::Renews if self.lease.held() => {
                self.lease.renew(now);
                self.net.push_lease_alarm(now);
            }
            _ => {}
        }
        self.serve_for_poll(input_quiet);
        if super::flag::take(&self.answer_gave_up) {
            // The poll is about to return the completion that waited in vain: the application
            // waits for the answer by other means now (see `datapath::answer`).
            self.hand_back();
        }
        self.tx_full.load(Ordering::Relaxed)
    }

    /// After the progress thread served the stream: paces it, or stops pacing it (see
    /// `engine::pace`). Skipped when an application thread holds the QP now (a raised mark
    /// still has its deadline).
    fn pace_after_serve(&self) {
        use super::pace::{Step, DEADLINE_US, MARK};
        let Some(mut inner) = self.inner.try_lock() else { return };
        let Some(l) = inner.dp.link.as_mut() else { return };
        let c = l.conn.counters();
        match l.pace.served(c.rx_bytes, c.tx_msgs) {
            Step::Raise if l.stream.wake_after(MARK) => self.net.pace(self.qpn, now_us() + DEADLINE_US),
            Step::Raise => {
                // The transport cannot pace: nothing to come back for.
                l.pace.due();
            }
            Step::Keep => self.net.pace(self.qpn, now_us() + DEADLINE_US),
            Step::Lower => {
                l.stream.wake_after(1);
            }
            Step::Nothing => {}
        }
    }

    /// Serves the stream for a thread that polls (this QP's CQ, or another's: see
    /// `Net::serve_leased`). A poll is not news (see `serve_held`): it asks the holder for one
    /// more pump, and serves here only when the QP is free.
    pub fn serve_aside(&self) {
        self.serve_for_poll(false);
    }

    /// [`Qp::serve_aside`] for a poll of the QP's own CQ; `input_quiet`: that poll's look at
    /// the stream's descriptor found nothing to read (see `CqObj::drive`), so the first pump
    /// need not `recv` to learn it.
    fn serve_for_poll(&self, input_quiet: bool) {
        // Free: the poll serves it itself, and pumps at once. Raising `polled` first, as a
        // poll must when another thread holds the QP, cost a locked exchange, a fence and
        // another exchange to take it back, on every poll of a spinning application.
        if let Some(inner) = self.inner.try_lock() {
            self.serve_held_with(inner, false, input_quiet, true);
            return;
        }
        // Held: the holder pumps once more for the poll (`news`); or, if it let go meanwhile
        // without seeing the request, the poll serves after all.
        self.polled.store(true, Ordering::SeqCst);
        std::sync::atomic::fence(Ordering::SeqCst);
        if let Some(inner) = self.inner.try_lock() {
            self.serve_held_with(inner, false, input_quiet, false);
        }
    }

    /// A doorbell rings at once: the doorbells of other QPs that wait for their poller ring
    /// first, so that the wire keeps the order in which the application posted (see
    /// `Net::serve_leased`).
    fn ring_waiting_doorbells(&self) {
        self.net.serve_leased(&|q| q == self.qpn, &|qp| qp.doorbell_waits());
    }

    /// A poll of one of the QP's CQs drove the CQ's own QPs (`own`): the QPs whose raw
    /// streams its stack turns fed are served from it too (`Net::serve_fed`), and, if the
    /// poll found nothing, the leased QPs its poller polled before and no more — those
    /// renewed before `renewed_before` (the CQ's previous poll; 0: none). See
    /// `Net::serve_leased`.
    pub fn serve_others(&self, own: &dyn Fn(u32) -> bool, renewed_before: u64) {
        self.net.serve_fed(own);
        if renewed_before > 0 {
            self.net.serve_leased(own, &|qp| qp.lease_renewed_at() < renewed_before);
        }
    }

    /// The application is going to sleep on a completion channel (or waits for an answer by
    /// other means: `try_progress`): the progress thread serves the stream again.
    pub fn hand_back(&self) {
        let released = self.lease.hand_back(uiw_kabi::sys::thread_alive, |a| self.net.apply_arming(self.qpn, a));
        // Arrivals the progress thread's stack turns took for the QP while it was leased were
        // left to the poller, and a raw transport's turns signal nothing for a QP they serve
        // themselves (`Net::turn_and_serve`); a Write's completion waiting for the answer
        // (`datapath::answer`) has no poller any more — the pump finds the CQ armed and
        // reports it: serve the stream once now.
        if released || self.awaits_answer.load(Ordering::Relaxed) {
            self.net.requeue(self.qpn);
        }
    }

    /// The progress thread serves the stream's socket from now on (it is armed: not leased),
    /// and a thread blocked reading a completion channel of the QP's CQs wakes for its input
    /// too (see `events::EventQueue::wait_fd`).
    fn watch_link(&self, stream: &dyn Stream) -> std::io::Result<()> {
        self.net.watch(stream, self.qpn)?;
        self.lease.attach(stream.readiness());
        self.input_fd.store(if stream.readiness_is_input() { stream.readiness() } else { -1 }, Ordering::Release);
        for ch in self.channels() {
            ch.watch_stream(stream.readiness(), self.qpn);
        }
        Ok(())
    }

    /// The stream's socket leaves the progress thread and the channels' readers, and any
    /// lease on it ends.
    pub(crate) fn unwatch_link(&self, stream: &dyn Stream) {
        self.input_fd.store(-1, Ordering::Release);
        self.lease.detach(|a| self.net.apply_arming(self.qpn, a));
        for ch in self.channels() {
            ch.unwatch_stream(stream.readiness());
        }
        self.net.unwatch(stream);
    }

    /// The completion channels the QP's CQs notify.
    fn channels(&self) -> impl Iterator<Item = &super::events::ChannelSink> {
        [&self.send_cq, &self.recv_cq].into_iter().filter_map(|cq| cq.channel.as_deref())
    }

    fn pump_locked(&self, inner: &mut QpInner) -> Option<(bool, Option<Fatal>)> {
        self.pump_locked_with(inner, false)
    }

    /// [`Qp::pump_locked`]; `input_quiet`: see [`Qp::serve_held_with`].
    fn pump_locked_with(&self, inner: &mut QpInner, input_quiet: bool) -> Option<(bool, Option<Fatal>)> {
        if inner.dp.link.is_none() || inner.attrs.qp_state == QpState::Err {
            return None;
        }
        if super::flag::take(&self.hup) {
            if let Some(l) = inner.dp.link.as_mut() {
                l.peer_hup = true;
            }
        }
        if super::flag::take(&self.writable) {
            inner.dp.writable();
        }
        // This pump sends what waiting doorbells left queued.
        self.doorbell_waits.store(false, Ordering::Relaxed);
        let env = self.env(inner.attrs.qp_access_flags);
        let stalled = inner.dp.link.as_ref().is_some_and(|l| l.conn.rx_stalled());
        let held = inner.dp.link.as_ref().is_some_and(|l| l.conn.tx_held());
        let msgs = |inner: &QpInner| inner.dp.link.as_ref().map_or((0, 0), |l| (l.conn.counters().rx_msgs, l.conn.counters().tx_msgs));
        let before = msgs(inner);
        let r = inner.dp.pump_with(&env, input_quiet);
        self.note_answer_wait(inner);
        let after = msgs(inner);
        if after.0 != before.0 && after.1 != before.1 {
            // Took a message in and sent one out (a Read Response to its Request): an answer.
            self.net.note_answered(self.qpn);
        }
        if inner.provisional {
            if inner.dp.established() {
                inner.provisional = false;
            } else if let (_, Some(f)) = r {
                // The peer refused it (it opened its own stream, which replaces this one when
                // it arrives) or it failed before MPA completed: the QP waits for the peer's.
                crate::engine::debug::why(format_args!("QP 0x{:06x}: the stream opened early ended before MPA ({f:?}); waiting for the peer's", self.qpn));
                self.drop_provisional(inner);
                return Some((false, None));
            }
        }
        let full = inner.dp.tx_blocked();
        self.tx_full.store(full, Ordering::Release);
        if full && self.lease.held() {
            // Leased, the socket is out of the progress thread's set: it must hear of room.
            self.lease.track_room(&self.tx_full, |a| self.net.apply_arming(self.qpn, a));
        }
        self.sync_stats(inner);
        self.after(inner);
        if !stalled && inner.dp.link.as_ref().is_some_and(|l| l.conn.rx_stalled()) {
            // A Send now waits for a receive (wire `rnr_wait_ms`): the progress thread takes
            // the new deadline.
            self.net.wake();
        }
        if !held && inner.dp.link.as_ref().is_some_and(|l| l.conn.tx_held()) {
            // A first FPDU is held for a siw responder: the progress thread releases it.
            self.net.wake();
        }
        Some(r)
    }

    /// Mirrors the data path's wait for an answer (`datapath::answer`) where polls see it.
    fn note_answer_wait(&self, inner: &mut QpInner) {
        let Some(l) = inner.dp.link.as_mut() else { return };
        self.awaits_answer.store(l.awaits_answer(), Ordering::Relaxed);
        if l.answer_gave_up() {
            self.answer_gave_up.store(true, Ordering::Relaxed);
        }
    }

    /// Reports what negotiation produced to connection management (rdma_cm): ESTABLISHED
    /// (the QP moves to RTS, as iw_cm moves it) or REJECTED.
    fn after(&self, inner: &mut QpInner) {
        if inner.dp.notices.is_empty() {
            return;
        }
        for n in std::mem::take(&mut inner.dp.notices) {
            if let Notice::Established(_) = n {
                self.stats.established();
            }
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

    /// The progress thread's sweep: handles the deadlines due (MPA negotiation, `open_at`, the
    /// peer-close grace, the siw first-FPDU hold, the RNR wait). Never waits for a thread that
    /// holds the QP, nor skips them for it: that thread handles them before it lets go (`timer`,
    /// as `kick`). A thread that keeps serving the QP — an application spinning on its CQ,
    /// whose polls pump the stream — would otherwise keep its deadlines waiting for as long as
    /// the sweep happens to find it taken (under valgrind, which switches threads in the
    /// system calls a pump makes, nearly every time).
    pub fn handle_timeout(&self, _now: u64) {
        self.timer.store(true, Ordering::SeqCst);
        std::sync::atomic::fence(Ordering::SeqCst);
        if let Some(inner) = self.inner.try_lock() {
            self.serve_held(inner, false);
        }
    }

    /// Handles the deadlines due at `now`; raises `kick` where the stream must be served now (a
    /// stream just opened, a first FPDU released), which the caller, holding the QP, does.
    fn timeouts_locked(&self, inner: &mut QpInner, now: u64) -> Option<Fatal> {
        if inner.open_at.is_some_and(|t| now >= t) {
            inner.open_at = None;
            let f = self.open_locked(inner);
            // Send the MPA Request as soon as the socket takes it.
            self.kick.store(true, Ordering::SeqCst);
            return f;
        }
        let l = inner.dp.link.as_mut()?;
        if l.conn.poll_timeout().is_some_and(|d| d <= now) {
            let held = l.conn.tx_held();
            l.conn.handle_timeout(now);
            if held && !l.conn.tx_held() {
                // The first FPDU held for a siw responder may go now.
                self.kick.store(true, Ordering::SeqCst);
            }
            let env = self.env(inner.attrs.qp_access_flags);
            return inner.dp.drain_events(&env);
        }
        None
    }

    /// When this QP's stream next needs the clock (engine ms), if it does.
    pub fn next_timeout(&self) -> Option<u64> {
        let Some(inner) = self.inner.try_lock() else {
            // Taken right now: look again soon.
            return Some(now_ms() + 10);
        };
        let t = inner.dp.link.as_ref().and_then(|l| l.conn.poll_timeout());
        let t = earliest(t, inner.open_at);
        drop(inner);
        self.settle();
        t
    }

    /// The QP goes to ERROR from the inside (peer Terminate, lost stream, local WR error): the
    /// stream closes, every outstanding WR is flushed, `IBV_EVENT_QP_FATAL` is raised.
    fn fail_locked(&self, mut inner: parking_lot::MutexGuard<'_, QpInner>, why: Fatal) {
        if inner.attrs.qp_state == QpState::Err {
            return;
        }
        crate::uiw_log!(Warn, "{}: QP 0x{:06x} to ERROR: {why:?}", self.device.name, self.qpn);
        if matches!(why, Fatal::Lost | Fatal::Rejected) {
            self.stats.conn_error();
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
                Fatal::Rejected => CmStatus::Refused,
                Fatal::LocalError => CmStatus::LocalError,
                Fatal::Closed => CmStatus::Ok,
                _ => CmStatus::Reset,
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
    pub fn cm_accept(self: &Arc<Self>, cm: &Arc<CmConn>, private_data: &[u8], ird: u16, ord: u16) -> Result<()> {
        let r = self.cm_accept_unsettled(cm, private_data, ird, ord);
        self.settle();
        r
    }

    fn cm_accept_unsettled(self: &Arc<Self>, cm: &Arc<CmConn>, private_data: &[u8], ird: u16, ord: u16) -> Result<()> {
        let mut inner = self.cm_ready(ird, ord)?;
        let mut p = cm.pending.lock().take().ok_or(Error::Invalid)?;
        // IRD/ORD as the application gave them, 0 included (RFC 6581 allows 0; SPDK's
        // NVMe-oF target accepts with responder_resources 0 and checks it is seen as 0). The
        // wire core raises IRD to 1 only where a Read RTR needs it.
        if p.conn.accept(ird, ord, private_data, now_ms()).is_err() {
            return Err(Error::Invalid);
        }
        // Established at once (no RTR to wait for): report ESTABLISHED before the Reply
        // leaves. Once the Reply is out the peer may connect again at once, and that next
        // CONNECT_REQUEST (the listener's thread, the progress thread) must not reach the
        // application's event channel before this ESTABLISHED: fabtests' fi_multi_ep
        // connects its endpoints one after the other over one EQ and takes anything else
        // for an error (issue 13). The wire's own Established notice follows when the
        // stream is served; CmConn reports ESTABLISHED once.
        let established = match p.conn.state() {
            WireState::Established => p.conn.negotiated().cloned(),
            _ => None,
        };
        self.cm_attach(&mut inner, cm, Link::new(p.conn, p.stream))?;
        if let Some(neg) = established {
            inner.attrs.qp_state = QpState::Rts;
            cm.established(&neg.private_data, neg.ird, neg.ord);
        }
        self.serve_locked(inner);
        Ok(())
    }

    /// `rdma_connect`: MPA Request with `private_data` and our IRD/ORD on `sock` (connected or
    /// connecting); the QP (INIT or RTR) moves to RTS when the Reply accepts.
    pub fn cm_connect(self: &Arc<Self>, cm: &Arc<CmConn>, sock: std::net::TcpStream, private_data: &[u8], ird: u16, ord: u16) -> Result<()> {
        if self.device.transport != TransportKind::Tcp {
            super::transport::cm_refused(&self.device);
            return Err(Error::NotSupported);
        }
        let stream: Box<dyn Stream> = Box::new(KernelStream::prepare(sock)?);
        let r = self.cm_connect_unsettled(cm, stream, private_data, ird, ord);
        self.settle();
        r
    }

    /// `uiw_cm_connect_v2`: `rdma_connect` on a device whose streams go over a userspace
    /// transport — the stream to `to` is opened through the device's [`Connector`] (the
    /// seam the QPs' RTR connects use), then MPA runs as in [`Qp::cm_connect`]. Returns the
    /// stream's local address (rdma_cm's source address and port).
    ///
    /// [`Connector`]: super::transport::Connector
    pub fn cm_connect_to(self: &Arc<Self>, cm: &Arc<CmConn>, to: std::net::SocketAddrV4, private_data: &[u8], ird: u16, ord: u16) -> Result<Option<std::net::SocketAddr>> {
        let stream = self.net.connector(&self.device).connect(to)?;
        let local = stream.local();
        let r = self.cm_connect_unsettled(cm, stream, private_data, ird, ord);
        self.settle();
        r.map(|()| local)
    }

    fn cm_connect_unsettled(self: &Arc<Self>, cm: &Arc<CmConn>, stream: Box<dyn Stream>, private_data: &[u8], ird: u16, ord: u16) -> Result<()> {
        let mut inner = self.cm_ready(ird, ord)?;
        let cfg = config(Role::Initiator, ird, ord, private_data.to_vec(), stream.mss());
        self.cm_attach(&mut inner, cm, Link::new(Connection::new(cfg, now_ms()), stream))?;
        self.serve_locked(inner);
        Ok(())
    }

    /// The QP side of accept/connect: RC in INIT or RTR without a stream (EINVAL otherwise);
    /// records the IRD/ORD the connection is made with.
    fn cm_ready(&self, ird: u16, ord: u16) -> Result<parking_lot::MutexGuard<'_, QpInner>> {
        let mut inner = self.inner.lock();
        if inner.dp.link.is_some() || !matches!(inner.attrs.qp_state, QpState::Init | QpState::Rtr) {
            return Err(Error::Invalid);
        }
        inner.attrs.max_dest_rd_atomic = ird.min(255) as u8;
        inner.attrs.max_rd_atomic = ord.min(255) as u8;
        Ok(inner)
    }

    /// Gives the QP its rdma_cm stream: served by the progress thread, the QP in RTR until MPA
    /// completes (then RTS, see `after`).
    fn cm_attach(self: &Arc<Self>, inner: &mut QpInner, cm: &Arc<CmConn>, link: Link) -> Result<()> {
        self.watch_link(&*link.stream)?;
        inner.cm = Some(cm.clone());
        *cm.qp.lock() = Some(Arc::downgrade(&(self.clone() as Arc<dyn CmQp>)));
        inner.attrs.qp_state = QpState::Rtr;
        inner.dp.link = Some(link);
        Ok(())
    }

    /// `rdma_disconnect`: the QP goes to ERROR (WRs flushed), the stream closes, and
    /// DISCONNECTED is reported.
    pub fn cm_disconnect(&self) {
        self.cm_disconnect_unsettled();
        self.settle();
    }

    fn cm_disconnect_unsettled(&self) {
        let mut inner = self.inner.lock();
        if inner.attrs.qp_state != QpState::Err {
            inner.attrs.qp_state = QpState::Err;
            self.stop_locked(&mut inner);
        }
        let cm = inner.cm.clone();
        drop(inner);
        if let Some(cm) = cm {
            cm.ended(CmStatus::Ok);
        }
    }

    /// Serves the stream now (after attaching it), failing the QP if that fails.
    fn serve_locked(&self, mut inner: parking_lot::MutexGuard<'_, QpInner>) {
        if let Some(f) = self.pump_once(&mut inner) {
            self.fail_locked(inner, f);
        }
    }

    /// One pump outside [`Qp::serve`]'s loop (a verb, a deadline). A pump that used up its
    /// receive budget left input in the socket that no new readiness will report (the epoll
    /// interest is edge-triggered): the QP is queued on the progress thread to be served
    /// again, as the progress thread queues a QP its own serve left with `More`.
    fn pump_once(&self, inner: &mut QpInner) -> Option<Fatal> {
        let (more, f) = self.pump_locked(inner)?;
        if more && f.is_none() {
            self.net.requeue(self.qpn);
        }
        f
    }

    /// Publishes the stream's traffic counters (after it was served, and before it closes).
    pub(crate) fn sync_stats(&self, inner: &mut QpInner) {
        if let Some(l) = inner.dp.link.as_mut() {
            self.stats.sync(&mut l.stats_seen, l.conn.counters());
        }
    }

    /// Closes the stream and flushes everything outstanding.
    fn stop_locked(&self, inner: &mut QpInner) {
        if let Some(l) = inner.dp.link.as_ref() {
            self.unwatch_link(&*l.stream);
        }
        // No stream, nothing full: a poll of a failed QP's CQ has no reason to yield.
        self.tx_full.store(false, Ordering::Relaxed);
        self.sync_stats(inner);
        // What `shutdown` completes as flushed: send WRs still queued or held, receives.
        let held = inner.dp.link.as_ref().map_or(0, |l| l.held_successes());
        self.stats.flushed(held + inner.dp.sq.len() + inner.dp.rq.iter().filter(|(_, e)| !e.from_srq).count());
        let env = self.env(inner.attrs.qp_access_flags);
        if let Some(c) = inner.dp.shutdown(&env, true) {
            self.net.linger(c);
        }
        inner.open_at = None;
        inner.provisional = false;
        self.drop_parked(inner);
    }

    /// `ibv_post_recv` for one WR. A QP with an SRQ takes receives from it only (EINVAL here,
    /// as the kernel's providers). In ERROR the WR completes at once, flushed.
    pub fn post_recv(&self, wqe: RecvWqe) -> std::result::Result<(), PostError> {
        let r = self.post_recv_unsettled(wqe);
        self.settle();
        r
    }

    fn post_recv_unsettled(&self, wqe: RecvWqe) -> std::result::Result<(), PostError> {
        if self.srq.is_some() {
            return Err(PostError::BadState);
        }
        if wqe.sges.len() > self.cap.max_recv_sge as usize {
            return Err(PostError::TooManySges);
        }
        let mut inner = self.inner.lock();
        if inner.attrs.qp_state == QpState::Err {
            drop(inner);
            self.stats.flushed(1);
            self.recv_cq.push(wqe.flushed(self.qpn));
            return Ok(());
        }
        if inner.dp.rq.len() >= self.cap.max_recv_wr as usize {
            return Err(PostError::QueueFull);
        }
        let env = self.env(inner.attrs.qp_access_flags);
        let stalled = inner.dp.link.as_ref().is_some_and(|l| l.conn.rx_stalled());
        if let Some(f) = inner.dp.post_recv(&env, wqe, false) {
            self.fail_locked(inner, f);
            return Ok(());
        }
        // A Send was waiting for this receive (wire `rnr_wait_ms`): read on now, not at the
        // next sweep.
        if stalled {
            if let Some(f) = self.pump_once(&mut inner) {
                self.fail_locked(inner, f);
            }
        }
        Ok(())
    }

    /// A receive was posted to this QP's SRQ ([`SrqObj::posted`]): a Send waiting for one
    /// takes it and reads on now, as [`Qp::post_recv`] does for the QP's own queue.
    pub fn srq_posted(&self) {
        let mut inner = self.inner.lock();
        if inner.dp.link.as_ref().is_some_and(|l| l.conn.rx_stalled()) {
            if let Some((_, Some(f))) = self.pump_locked(&mut inner) {
                self.fail_locked(inner, f);
            } else {
                drop(inner);
            }
            self.settle();
        }
    }

    /// `ibv_post_send` for one WR, or for the last WR of a chain whose others went through
    /// [`Qp::post_send_deferred`]: the chain's doorbell rings here, for all of its bytes,
    /// under the hold that queues this WR. Checked as the kernel's providers check at post
    /// time. In ERROR the WR completes at once, flushed; before RTR it is refused (EINVAL).
    /// Posted before the stream is up, it waits. A chain that stops at a WR that fails needs
    /// [`Qp::doorbell`] for the WRs before it.
    pub fn post_send(&self, wqe: SendWqe) -> std::result::Result<(), PostError> {
        let r = self.post_send_unsettled(wqe, true);
        self.settle();
        if r == Ok(true) {
            self.sent_to_local_peer();
        }
        r.map(|_| ())
    }

    /// One WR of a posted chain: queued, sent when the chain's last WR is posted
    /// ([`Qp::post_send`]) or by [`Qp::doorbell`] (one `sendmsg` for many WRs' FPDUs).
    pub fn post_send_deferred(&self, wqe: SendWqe) -> std::result::Result<(), PostError> {
        let r = self.post_send_unsettled(wqe, false);
        self.settle();
        r.map(|_| ())
    }

    /// The end of a posted chain: sends what it queued.
    pub fn doorbell(&self) {
        let large = self.chain_bytes.swap(0, Ordering::Relaxed) > DEFER_MAX_BYTES;
        let ring = large || !self.defer_doorbell();
        if ring {
            self.ring_waiting_doorbells();
        }
        let mut inner = self.inner.lock();
        let mut rang = false;
        if matches!(inner.attrs.qp_state, QpState::Rtr | QpState::Rts | QpState::Sqd) && ring {
            let env = self.env(inner.attrs.qp_access_flags);
            let f = inner.dp.doorbell(&env);
            self.sync_stats(&mut inner);
            if let Some(f) = f {
                self.fail_locked(inner, f);
                self.settle();
                return;
            }
            rang = inner.dp.established();
        }
        // Let go of the QP before settling: news that came meanwhile is served here.
        drop(inner);
        self.settle();
        if rang {
            self.sent_to_local_peer();
        }
    }

    /// After sending on the stream: a peer QP in this process places what it was sent right
    /// here, on the sender's thread, instead of when the progress thread is next scheduled.
    /// A program that connects two of its own QPs (rdma-core's tests do) then finds a Write's
    /// bytes in the target region once `ibv_post_send` returns — a passive target never polls,
    /// and a progress thread that is runnable but not running left it waiting for up to a
    /// scheduler tick (milliseconds; `examples/c/placement_lag.c`).
    fn sent_to_local_peer(&self) {
        if let Some(peer) = self.local_peer() {
            peer.peer_sent();
        }
    }

    /// The QP at the other end of the stream if it is one of this process's: our
    /// `dest_qp_num` names a QP of ours whose `dest_qp_num` names us, at one of our device's
    /// own addresses. QP numbers are unique on a host (each process allocates in a slot of
    /// its own), so that is the same process. Known once the stream is up; cached.
    fn local_peer(&self) -> Option<Arc<dyn Endpoint>> {
        if let Some(p) = self.local_peer.get() {
            return p.as_ref()?.upgrade();
        }
        let (dest, dgid) = {
            let inner = self.inner.lock();
            if !inner.dp.established() {
                return None;
            }
            (inner.attrs.dest_qp_num, inner.attrs.ah.dgid)
        };
        let peer = Some(dest)
            .filter(|_| self.device.gids.contains(&dgid))
            .and_then(|d| self.net.lookup(d))
            .filter(|p| p.dest_qpn() == Some(self.qpn));
        let _ = self.local_peer.set(peer.as_ref().map(Arc::downgrade));
        peer
    }

    /// Whether a doorbell may wait for the thread that polls the QP's CQs: it polls within
    /// microseconds, and everything posted meanwhile leaves in one `sendmsg` at its next poll
    /// (issue 9: many WRs' FPDUs per system call). The first post after a poll rings at once —
    /// a ping-pong (post, poll, post, poll) never waits; only further posts before the next
    /// poll do (a stream of posts, as a bandwidth or message rate run makes), and only while
    /// a thread polled a CQ of the QP lately (`CqObj::polled_lately`). Such a post claims the QP for the
    /// poller (see `lease`) if it is not claimed yet, so that a doorbell left waiting rings at
    /// the next poll of either CQ, or when the lease lapses or is handed back (the progress
    /// thread serves the QP then): an application that posts twice and then stops polling
    /// waits at most that long.
    fn defer_doorbell(&self) -> bool {
        let mut polls = self.send_cq.polls.load(Ordering::Relaxed);
        if !Arc::ptr_eq(&self.send_cq, &self.recv_cq) {
            polls = polls.wrapping_add(self.recv_cq.polls.load(Ordering::Relaxed));
        }
        // Read, and written only when it changed: no locked exchange on every post.
        let again = self.polls_at_post.load(Ordering::Relaxed) == polls;
        if !again {
            self.polls_at_post.store(polls, Ordering::Relaxed);
        }
        if !again || !lease_enabled() {
            return false;
        }
        if !self.lease.held() {
            let now = now_us();
            if !(self.send_cq.polled_lately(now) || self.recv_cq.polled_lately(now)) {
                return false;
            }
            self.lease.renew(now);
            self.lease.claim(|a| self.net.apply_arming(self.qpn, a));
        }
        let defer = self.lease.held();
        if defer {
            self.doorbell_waits.store(true, Ordering::Relaxed);
            // Whichever of its CQs the application polls sends it.
            self.send_cq.deferred.store(true, Ordering::Release);
            self.recv_cq.deferred.store(true, Ordering::Release);
        }
        defer
    }

    /// Returns whether the doorbell rang (the WR went to the stream, not only to the queue).
    fn post_send_unsettled(&self, wqe: SendWqe, ring: bool) -> std::result::Result<bool, PostError> {
        use super::wr::{opcode, Payload};
        if wqe.opcode > opcode::SEND_WITH_INV || wqe.opcode == opcode::BIND_MW {
            return Err(if wqe.opcode > opcode::SEND_WITH_INV { PostError::BadOpcode } else { PostError::Unsupported });
        }
        match &wqe.payload {
            Payload::Sges(s) if s.len() > self.cap.max_send_sge as usize => return Err(PostError::TooManySges),
            Payload::Inline(b) if b.len() > self.cap.max_inline_data as usize => return Err(PostError::InlineTooLong),
            _ => {}
        }
        let len = wqe.payload.len();
        let chained = !ring;
        // Decided before the QP is taken: a doorbell that rings now rings the waiting ones of
        // other QPs first (see `ring_waiting_doorbells`). The last WR of a chain rings for
        // the chain's bytes, as `doorbell` does.
        let bytes = len + if ring { self.chain_bytes.load(Ordering::Relaxed) } else { 0 };
        let ring = ring && (bytes > DEFER_MAX_BYTES || !self.defer_doorbell());
        if ring {
            self.ring_waiting_doorbells();
        }
        let mut inner = self.inner.lock();
        if !chained {
            // The chain ends here, whatever becomes of this WR.
            self.chain_bytes.store(0, Ordering::Relaxed);
        }
        match inner.attrs.qp_state {
            QpState::Err => {
                drop(inner);
                self.stats.flushed(1);
                self.send_cq.push(wqe.flushed(self.qpn));
                Ok(false)
            }
            // iWARP has no RTR of its own (RFC 5040's QP states: Idle, RTS, Closing,
            // Terminate, Error): the stream is set up at RTR, so sends posted there are queued
            // and go out once it is up. perftest's send tests need it: their server stays in
            // RTR and posts credit Writes.
            QpState::Rtr | QpState::Rts | QpState::Sqd => {
                let env = self.env(inner.attrs.qp_access_flags);
                if chained {
                    self.chain_bytes.fetch_add(len, Ordering::Relaxed);
                }
                let r = inner.dp.post_send(&env, wqe, self.cap.max_send_wr, ring);
                self.note_answer_wait(&mut inner);
                // An idle stream sends at once, from here. A WR inside a chain is counted by
                // the doorbell or the pump that sends it (a chain's every WR published its
                // counters: a tenth of an NVMe-oF target's provider instructions).
                if ring {
                    self.sync_stats(&mut inner);
                }
                if let Some(f) = r? {
                    self.fail_locked(inner, f);
                    return Ok(false);
                }
                Ok(ring && inner.dp.established())
            }
            _ => Err(PostError::BadState),
        }
    }
}

/// `UIW_POLL_LEASE=0`: application polls never take a QP over from the progress thread (the
/// behaviour before the lease; for comparisons).
fn lease_enabled() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var("UIW_POLL_LEASE").map_or(true, |v| v.trim() != "0"))
}

/// The IPv4 address a stream comes from (`None` for anything else).
fn peer_ipv4(p: &Pending) -> Option<std::net::Ipv4Addr> {
    match p.stream.peer()? {
        std::net::SocketAddr::V4(a) => Some(*a.ip()),
        std::net::SocketAddr::V6(a) => a.ip().to_ipv4_mapped(),
    }
}

/// The IRD a QP advertises in its MPA Request or Reply (RFC 6581 §9; the Reads and Atomics
/// it answers at once): `max_dest_rd_atomic` as the application set it at RTR, 0 included
/// (a QP given none answers none, as on any RDMA device). The wire core raises it to 1 only
/// where a Read RTR needs it (RFC 6581 §5).
fn ird(a: &QpAttrs) -> u16 {
    u16::from(a.max_dest_rd_atomic)
}

/// The ORD a QP advertises (RFC 6581 §9; the Reads and Atomics it issues at once):
/// `max_rd_atomic` as the application set it, 0 included — once it has, at RTS. A QP that
/// opens or accepts its stream still in RTR (perftest's send-test server) has no ORD yet, and
/// the MPA exchange is not repeated when RTS brings one: it advertises the most RTS may give
/// ([`MAX_QP_INIT_RD_ATOM`]), so the connection never holds the QP below the ORD RTS grants.
/// The peer's IRD bounds it either way (RFC 6581 §9: an ORD is limited by the peer's IRD).
fn ord(a: &QpAttrs) -> u16 {
    match a.qp_state {
        QpState::Rts | QpState::Sqd => u16::from(a.max_rd_atomic),
        _ => MAX_QP_INIT_RD_ATOM as u16,
    }
}

impl Holder for Qp {
    fn still_sending(&self) {
        // The holder is a poller (a lease) or the progress thread (no lease: nothing to keep);
        // a lease check would keep the QP of a thread inside it anyway.
        if self.lease.held() {
            // The poll's own reading is as old as the pass.
            let now = super::clock::read_us();
            self.lease.renew(now);
            self.net.push_lease_alarm(now);
        }
    }
}

impl Endpoint for Qp {
    fn qpn(&self) -> u32 {
        self.qpn
    }
    fn dest_qpn(&self) -> Option<u32> {
        let a = self.attrs();
        matches!(a.qp_state, QpState::Rtr | QpState::Rts | QpState::Sqd).then_some(a.dest_qp_num)
    }
    fn peer_sent(&self) {
        // A request as a poll's (see `serve_held`), answered by whichever thread holds the QP;
        // taking it waits for that thread at most one pump, so the bytes are placed when this
        // returns.
        self.polled.store(true, Ordering::SeqCst);
        std::sync::atomic::fence(Ordering::SeqCst);
        let inner = self.inner.lock();
        self.serve_held(inner, false);
    }
    fn progress(&self, hup: bool, writable: bool) -> Progress {
        if hup {
            self.hup.store(true, Ordering::Release);
        }
        if writable {
            self.writable.store(true, Ordering::Release);
        }
        if self.lease.held() && !(writable && self.tx_full.load(Ordering::Relaxed)) {
            // An application thread drives the stream (a readiness reported before its claim,
            // or a hang-up): it serves this, or the lease's check hands the QP back. Room on a
            // stream that is no longer full: the socket leaves the set again.
            if writable {
                self.lease.track_room(&self.tx_full, |a| self.net.apply_arming(self.qpn, a));
            }
            return Progress::Done;
        }
        // Room on a leased stream that the poller found full (`Net::apply_arming`): the poller
        // may be off its CPU now (it gives it away while its streams are full, `CqObj::drive`),
        // so the bytes go at once, from here — or from the poller, if it holds the QP (`kick`).
        let r = self.serve(true);
        self.pace_after_serve();
        r
    }
    fn pace_due(&self) -> bool {
        let Some(mut inner) = self.inner.try_lock() else { return false };
        if let Some(l) = inner.dp.link.as_mut() {
            if l.pace.due() {
                l.stream.wake_after(1);
            }
        }
        true
    }
    fn serve_aside(&self) {
        Qp::serve_aside(self)
    }
    fn serve_for_reader(&self) {
        self.stats.reader_served();
        // News, as readiness is for the progress thread (not a poll): the arrival woke this
        // thread alone while its sleep held the QP, so a thread that holds the QP now (one
        // posting to it) must read it before it lets go (`kick`, `settle`).
        Qp::serve(self, false);
    }
    fn reader_sleeps(&self) {
        if lease_enabled() {
            let tid = uiw_kabi::sys::current_tid();
            self.lease.reader_sleeps(tid, |fd| !self.net.raw_stream(fd), |a| self.net.apply_arming(self.qpn, a));
        }
    }
    fn reader_woke(&self) {
        self.lease.reader_woke(uiw_kabi::sys::current_tid(), |a| self.net.apply_arming(self.qpn, a));
    }
    fn lease_renewed_at(&self) -> u64 {
        self.lease.renewed_at()
    }
    fn lease_alarm_view(&self, now_us: u64) -> AlarmView {
        self.lease.alarm_view(now_us)
    }
    fn spin_out(&self) -> bool {
        // A stream whose readiness is its socket's (not a raw transport's).
        self.input_fd.load(Ordering::Acquire) >= 0 && self.lease.spin_out(|a| self.net.apply_arming(self.qpn, a))
    }
    fn spin_in(&self) {
        self.lease.spin_in(|a| self.net.apply_arming(self.qpn, a))
    }
    fn doorbell_waits(&self) -> bool {
        self.doorbell_waits.load(Ordering::Relaxed)
    }
    fn lease_check(&self, now_us: u64) -> Check {
        // The progress thread holds no QP's lock when it checks: a holder is an application
        // thread — a poll still serving, or a post.
        self.lease.check(now_us, self.inner.is_locked(), |a: Arming| self.net.apply_arming(self.qpn, a))
    }
    fn offer(&self, net: &Net, hello: QpHello, p: Pending) -> std::result::Result<(), Pending> {
        Qp::offer(self, net, hello, p)
    }
    fn handle_timeout(&self, now: u64) {
        Qp::handle_timeout(self, now)
    }
    fn next_timeout(&self) -> Option<u64> {
        Qp::next_timeout(self)
    }
    fn abandon(&self) {
        // The child must not use the parent's QPs (rdma-core's fork rules): it only drops its
        // copies of the stream descriptors. Dropping a TcpStream closes; it never shuts down.
        if let Some(mut inner) = self.inner.try_lock() {
            if let Some(l) = inner.dp.link.take() {
                l.stream.abandon();
            }
            for (p, _) in inner.parked.drain(..) {
                p.stream.abandon();
            }
            inner.open_at = None;
            inner.attrs.qp_state = QpState::Err;
        }
    }
}

impl PolledQp for Qp {
    fn qpn(&self) -> u32 {
        self.qpn
    }
    fn try_progress(&self, poller: Poller, now: u64, input_quiet: bool) -> bool {
        Qp::try_progress(self, poller, now, input_quiet)
    }
    fn input_probe(&self) -> Option<i32> {
        let fd = self.input_fd.load(Ordering::Acquire);
        (fd >= 0 && self.lease.held()).then_some(fd)
    }
    fn awaits_answer(&self) -> bool {
        self.awaits_answer.load(Ordering::Relaxed)
    }
    fn hand_back(&self) {
        Qp::hand_back(self)
    }
    fn serve_others(&self, own: &dyn Fn(u32) -> bool, renewed_before: u64) {
        Qp::serve_others(self, own, renewed_before)
    }
    fn delivered(&self) {
        // The WR went out from whichever thread pumped the QP — the progress thread, or a
        // poll that found the stream just established and sent what was queued before it —
        // not necessarily from a post that served the peer (`post_send`).
        self.sent_to_local_peer()
    }
    fn peer_elsewhere(&self) -> bool {
        matches!(self.local_peer.get(), Some(None))
    }
}

impl CmQp for Qp {
    fn cm_disconnect(&self) {
        Qp::cm_disconnect(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::datapath::{DataPath, Env, Link};
    use crate::engine::transport::Pending;
    use uiw_wire::conn::Tx;
    use uiw_wire::mpa::RrFrame;

    use std::io;
    use std::os::fd::RawFd;
    use std::os::unix::net::UnixStream;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::{Arc, Mutex, Weak};

    use super::super::context::Context;
    use super::super::device::DeviceInfo;
    use super::super::events::EventQueue;
    use super::super::limits::DeviceLimits;
    use super::super::net::Endpoint;
    use super::super::qp_state::{mask, qp_type, QpAttrs, QpCap, QpState};
    use super::super::user_memory::{AtomicOperation, Crc32c, IoPart, Pinned, UserMemory};
    use super::super::{access, wr::Sge};
    use super::{now_ms, Qp, QpSpec};

    /// How many polls [`PollDuringPump`] makes before it stops: far more than serving a QP
    /// with nothing to read ever needs.
    const POLLS: usize = 1000;

    /// The socket never takes a byte, and while a QP is set in `qp`, every attempt to send is
    /// accompanied by a poll of it — what an application spinning on an empty CQ in another
    /// thread does while the thread that holds the QP pumps it. No payload is ever placed or
    /// gathered here.
    struct PollDuringPump {
        qp: Mutex<Weak<Qp>>,
        polls: AtomicUsize,
        /// While set, engine-owned bytes (MPA frames) really go out, on this handle of the
        /// stream's socket, for the tests that look at the wire.
        wire: Mutex<Option<std::net::TcpStream>>,
    }

    impl UserMemory for PollDuringPump {
        fn recv(&self, _: RawFd, _: &Pinned, _: &mut [u8]) -> io::Result<usize> {
            Err(io::ErrorKind::WouldBlock.into())
        }
        fn send(&self, _: RawFd, parts: &[IoPart<'_>]) -> io::Result<usize> {
            if let Some(w) = self.wire.lock().unwrap().as_mut() {
                let mut out = Vec::new();
                for p in parts {
                    match p {
                        IoPart::Bytes(b) => out.extend_from_slice(b),
                        IoPart::User(_) => unreachable!("no payload in these tests"),
                    }
                }
                return std::io::Write::write(w, &out);
            }
            let qp = self.qp.lock().unwrap().upgrade();
            if let Some(qp) = qp {
                if self.polls.fetch_add(1, Ordering::SeqCst) < POLLS {
                    qp.try_progress(crate::engine::cq::Poller::Renews, now_us(), false);
                }
            }
            Err(io::ErrorKind::WouldBlock.into())
        }
        fn read(&self, _: &Pinned, _: &mut [u8]) {
            unreachable!("no payload in these tests")
        }
        fn write(&self, _: &Pinned, _: &[u8]) {
            unreachable!("no payload in these tests")
        }
        fn atomic(&self, _: &Pinned, _: AtomicOperation) -> u64 {
            unreachable!("no payload in these tests")
        }
        fn crc32c(&self, _: &Pinned, _: usize, _: &mut Crc32c) {
            unreachable!("no payload in these tests")
        }
    }

    /// The process's transport takes the memory of the first context that opens it: every test
    /// here uses this one, one test at a time ([`ONE_AT_A_TIME`]).
    static MEM: PollDuringPump =
        PollDuringPump { qp: Mutex::new(Weak::new()), polls: AtomicUsize::new(0), wire: Mutex::new(None) };
    static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

    fn loopback() -> [u8; 16] {
        let mut g = [0u8; 16];
        g[10] = 0xff;
        g[11] = 0xff;
        g[12..].copy_from_slice(&[127, 0, 0, 1]);
        g
    }

    /// A context on a device with address 127.0.0.1, and an RC QP in INIT that will open the
    /// stream towards the last QP number of our own slot (a higher number: this QP opens, to
    /// our own listener, which waits for an MPA Request that never comes).
    fn context_and_opener() -> (Context, Arc<Qp>) {
        let (ctx, mut qps) = context_and_qps(1, |qp| qp.qpn & 0xfff != 0xfff);
        (ctx, qps.remove(0))
    }

    /// A context on a device with address 127.0.0.1, and `n` RC QPs in INIT, those that `keep`
    /// accepts (QPs are created until `n` are).
    fn context_and_qps(n: usize, keep: impl Fn(&Qp) -> bool) -> (Context, Vec<Arc<Qp>>) {
        let (app, ours) = UnixStream::pair().unwrap();
        let sink = EventQueue::new(ours, app.try_clone().unwrap(), 16);
        let device = DeviceInfo {
            name: "uiw_unit".into(),
            netdev: "lo".into(),
            node_guid: 0,
            gids: vec![loopback()],
            netdev_mtu: 1500,
            gid_tbl_len: 1,
            // No published tree: its statistics directory cannot be made (see `stats`).
            ibdev_path: "/nonexistent-uiw-unit-test/state/sysfs/class/infiniband/uiw_unit".into(),
            active_speed: 1,
            active_width: 1,
            transport: crate::engine::device::TransportKind::Tcp,
        };
        let ctx = Context::new(Arc::new(device), DeviceLimits::UIW, sink, &MEM);
        let pd = ctx.alloc_pd().unwrap();
        let cq = ctx.create_cq(16, None).unwrap();
        let cap = QpCap { max_send_wr: 4, max_recv_wr: 4, max_send_sge: 1, max_recv_sge: 1, max_inline_data: 0 };
        let spec = || QpSpec { pd, qp_type: qp_type::RC, cap, sq_sig_all: false, send_cq: cq.clone(), recv_cq: cq.clone(), srq: None };
        let mut qps = Vec::new();
        while qps.len() < n {
            let qp = ctx.create_qp(spec()).unwrap();
            if !keep(&qp) {
                ctx.destroy_qp(&qp);
                continue;
            }
            let init = QpAttrs { qp_state: QpState::Init, port_num: 1, ..QpAttrs::default() };
            qp.modify(&init, mask::STATE | mask::PKEY_INDEX | mask::PORT | mask::ACCESS_FLAGS, &ctx.limits).unwrap();
            qps.push(qp);
        }
        (ctx, qps)
    }

    /// INIT → RTR towards `dest` on this host, expecting `rq_psn`.
    fn rtr_to(ctx: &Context, qp: &Qp, dest: u32, rq_psn: u32) {
        let mut rtr = QpAttrs { qp_state: QpState::Rtr, path_mtu: 3, dest_qp_num: dest, rq_psn, max_dest_rd_atomic: 1, ..QpAttrs::default() };
        rtr.ah.is_global = 1;
        rtr.ah.dgid = loopback();
        rtr.ah.hop_limit = 1;
        rtr.ah.port_num = 1;
        let m = mask::STATE | mask::AV | mask::PATH_MTU | mask::DEST_QPN | mask::RQ_PSN | mask::MAX_DEST_RD_ATOMIC | mask::MIN_RNR_TIMER;
        qp.modify(&rtr, m, &ctx.limits).unwrap();
    }

    /// A stream from the peer, in memory (the test plays the peer through `peer`), whose MPA
    /// Request carries `hello`, read as the listener reads it; `fd` stands in for its socket
    /// in the progress thread's epoll.
    fn offered(hello: QpHello, fd: &UnixStream) -> (Pending, crate::engine::transport::memory::MemStream) {
        use crate::engine::transport::memory;
        use std::os::fd::AsRawFd;
        use uiw_wire::conn::Role;
        let (ours, mut theirs) = memory::pair(4096, 1 << 20);
        let mut cfg = config(Role::Initiator, 1, 1, hello.encode(), 1460);
        cfg.first_fpdu_hold_ms = 0;
        let mut peer = Connection::new(cfg, 0);
        while let Some(uiw_wire::conn::Tx::Bytes(b)) = peer.next_tx() {
            let _ = Stream::write(&mut theirs, &b);
        }
        let mut p = Pending::new(Connection::new(config(Role::Responder, 1, 1, Vec::new(), 1460), 0), Box::new(ours.with_readiness(fd.as_raw_fd())));
        assert!(matches!(p.read_request(), Some(Ok(_))), "no MPA Request");
        (p, theirs)
    }

    /// INIT → RTR → RTS towards `dest` on this host.
    fn rts_to(ctx: &Context, qp: &Qp, dest: u32, rq_psn: u32, sq_psn: u32) {
        rtr_to(ctx, qp, dest, rq_psn);
        let rts = QpAttrs { qp_state: QpState::Rts, sq_psn, timeout: 14, retry_cnt: 7, rnr_retry: 7, max_rd_atomic: 1, ..QpAttrs::default() };
        let m = mask::STATE | mask::SQ_PSN | mask::TIMEOUT | mask::RETRY_CNT | mask::RNR_RETRY | mask::MAX_QP_RD_ATOMIC;
        qp.modify(&rts, m, &ctx.limits).unwrap();
    }

    /// perftest's bandwidth servers stay in RTR. An opener left there takes the stream its
    /// peer opened at RTS (`open_early`; the peer's `sq_psn` is the opener's `rq_psn`) instead
    /// of refusing it and waiting `OPEN_WAIT_MS` for an RTS that never comes — with the
    /// client's first WRs (ib_write_bw -n 300 measured 0.09 MB/s in most runs). A stream that
    /// offers only its `rq_psn`, which the opener cannot check in RTR, is refused, not parked.
    #[test]
    fn an_opener_left_in_rtr_takes_the_stream_its_peer_opened() {
        let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
        let (ctx, qp) = context_and_opener();
        rtr_to(&ctx, &qp, qp.qpn | 0xfff, 0x100);
        assert!(qp.inner.lock().open_at.is_some(), "the QP is not the opener: the test tests nothing");
        let (fd, _keep) = UnixStream::pair().unwrap();
        let hello = |sq_psn| QpHello { to_qpn: qp.qpn, from_qpn: qp.qpn | 0xfff, rq_psn: 0x200, sq_psn };
        let (p, _peer) = offered(hello(None), &fd);
        assert!(qp.offer(&qp.net, hello(None), p).is_err(), "an opener parked or took an unproven stream");
        let (p, _peer) = offered(hello(Some(0x101)), &fd);
        assert!(qp.offer(&qp.net, hello(Some(0x101)), p).is_err(), "the opener took a stream with the wrong PSN");
        let (p, _peer) = offered(hello(Some(0x100)), &fd);
        assert!(qp.offer(&qp.net, hello(Some(0x100)), p).is_ok(), "the opener refused its peer's stream");
        let inner = qp.inner.lock();
        assert!(inner.open_at.is_none(), "the opener still means to open a stream of its own");
        assert!(inner.dp.link.is_some());
        assert_eq!(inner.attrs.qp_state, QpState::Rtr);
        drop(inner);
        ctx.destroy_qp(&qp);
    }

    /// A QP that is not the opener (its peer, the first number of its slot, is lower), taken
    /// to RTS: it has opened a stream early, marked provisional. Returns the peer's number.
    fn opened_early(rq_psn: u32, sq_psn: u32) -> (Context, Arc<Qp>, u32) {
        let (ctx, mut qps) = context_and_qps(1, |q| q.qpn & 0xfff != 0);
        let qp = qps.remove(0);
        let opener = qp.qpn & !0xfff;
        rts_to(&ctx, &qp, opener, rq_psn, sq_psn);
        let inner = qp.inner.lock();
        assert!(inner.provisional && inner.dp.link.is_some(), "no stream opened at RTS");
        drop(inner);
        (ctx, qp, opener)
    }

    /// The QP that is not the opener opens a stream at RTS (`open_early`), marked provisional;
    /// the opener's own stream, when it comes (it had opened before ours reached it), takes
    /// its place.
    #[test]
    fn a_stream_opened_early_gives_way_to_the_openers() {
        let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
        let (ctx, qp, opener) = opened_early(0x300, 0x400);
        let (fd, _keep) = UnixStream::pair().unwrap();
        let hello = QpHello { to_qpn: qp.qpn, from_qpn: opener, rq_psn: 0x400, sq_psn: Some(0x300) };
        let (p, _peer) = offered(hello, &fd);
        assert!(qp.offer(&qp.net, hello, p).is_ok(), "the opener's stream was refused");
        let inner = qp.inner.lock();
        assert!(!inner.provisional);
        let local = inner.dp.link.as_ref().unwrap().stream.local().unwrap();
        assert_eq!(local.port(), 2, "the QP kept its own stream ({local}), not the in-memory one");
        drop(inner);
        ctx.destroy_qp(&qp);
    }

    /// The opener refuses a stream opened early when it has its own: the refusal only drops
    /// the provisional stream, the QP stays in RTS for the opener's (no ERROR, no event).
    #[test]
    fn a_refused_early_stream_leaves_the_qp_waiting() {
        use crate::engine::transport::memory;
        use std::os::fd::AsRawFd;
        let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
        let (ctx, qp, opener) = opened_early(0x500, 0x600);
        // Its stream, as if to the opener, in memory.
        let (fd, _keep) = UnixStream::pair().unwrap();
        let (ours, theirs) = memory::pair(4096, 1 << 20);
        {
            let mut inner = qp.inner.lock();
            let old = inner.dp.link.take().unwrap();
            qp.unwatch_link(&*old.stream);
            let a = inner.attrs;
            let hello = QpHello { to_qpn: opener, from_qpn: qp.qpn, rq_psn: a.rq_psn, sq_psn: Some(a.sq_psn) };
            let link = Link::new(Connection::new(config(Role::Initiator, 1, 1, hello.encode(), 1460), now_ms()), Box::new(ours.with_readiness(fd.as_raw_fd())));
            qp.watch_link(&*link.stream).unwrap();
            inner.dp.link = Some(link);
        }
        qp.serve(false);
        let mut p = Pending::new(Connection::new(config(Role::Responder, 1, 1, Vec::new(), 1460), 0), Box::new(theirs));
        assert!(matches!(p.read_request(), Some(Ok(_))), "the early stream sent no MPA Request");
        p.reject(b"");
        qp.serve(false);
        let inner = qp.inner.lock();
        assert_eq!(inner.attrs.qp_state, QpState::Rts, "the refusal failed the QP");
        assert!(inner.dp.link.is_none() && !inner.provisional, "the refused stream was kept");
        drop(inner);
        ctx.destroy_qp(&qp);
    }

    /// INIT → RTR towards the last QP number of our slot: the QP is the opener, and opens at
    /// RTS or when `open_at` is due.
    fn to_rtr(ctx: &Context, qp: &Qp) {
        rtr_to(ctx, qp, qp.qpn | 0xfff, 0);
        assert!(qp.inner.lock().open_at.is_some(), "the QP is not the opener: the test tests nothing");
    }

    /// The hang of `dereg_race` under valgrind ("writes round 0: completions: timed out after
    /// 0 of 16"): the application spins on `ibv_poll_cq` of QP a's empty CQ while the progress
    /// thread holds a. A poll used to raise `kick`, so the holder served a again after every
    /// pump, for as long as the application spun — and it spun because the progress thread,
    /// stuck there, never accepted the stream and sent the peer's MPA Reply.
    ///
    /// Here the thread holding the QP is polled during each of its pumps (see
    /// [`PollDuringPump`]); it must let go of the QP after serving what there is, not serve on
    /// until the poller gives up.
    #[test]
    fn a_poll_during_a_pump_does_not_keep_the_holder_serving() {
        let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
        let (ctx, qp) = context_and_opener();
        to_rtr(&ctx, &qp);
        MEM.polls.store(0, Ordering::SeqCst);
        *MEM.qp.lock().unwrap() = Arc::downgrade(&qp);
        // RTS opens the stream and pumps it (the MPA Request does not go out: every pump
        // tries again, with a poll); then the progress thread's way in, readiness.
        let rts = QpAttrs { qp_state: QpState::Rts, timeout: 14, retry_cnt: 7, rnr_retry: 7, max_rd_atomic: 1, ..QpAttrs::default() };
        let m = mask::STATE | mask::TIMEOUT | mask::RETRY_CNT | mask::RNR_RETRY | mask::SQ_PSN | mask::MAX_QP_RD_ATOMIC;
        qp.modify(&rts, m, &ctx.limits).unwrap();
        // The turn measured below stands in for the progress thread's: the real one must not
        // serve the QP meanwhile (the connect's completion reaches its epoll at any moment, and
        // its serve, or its kick to our turn, is one more pump — 2 to 4 runs in 60 failed so).
        // Out of its set, then time for an event it already took, then that news taken.
        if let Some(l) = qp.inner.lock().dp.link.as_ref() {
            qp.net.unwatch(&*l.stream);
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
        let _ = Endpoint::progress(&*qp, false, false);
        // The progress thread's turn, with an application polling during each of its pumps.
        MEM.polls.store(0, Ordering::SeqCst);
        let _ = Endpoint::progress(&*qp, false, false);
        let polls = MEM.polls.load(Ordering::SeqCst);
        *MEM.qp.lock().unwrap() = Weak::new();

        // One pump for the readiness, one for the polls that came during it; the polls during
        // that one are left to the poller (it takes the QP itself once it is free).
        assert!(polls > 0, "the stream was never pumped: the test did not test anything");
        assert!(
            polls <= 2,
            "the progress thread served the QP again for every poll ({polls} pumps in one turn): a \
             spinning application keeps it there"
        );
        ctx.destroy_qp(&qp);
    }

    /// A deadline that comes due while another thread holds the QP (an application in
    /// `ibv_poll_cq`, `ibv_post_send`…) is handled by that thread when it lets go: it is not
    /// left until the progress thread happens to find the QP free — which, against a thread
    /// that keeps serving it, may be never. The deadline here is `open_at` (an opener left in
    /// RTR opens when it is due).
    #[test]
    fn a_deadline_due_while_the_qp_is_held_is_handled_by_the_holder() {
        let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
        let (ctx, qp) = context_and_opener();
        to_rtr(&ctx, &qp);
        let mut held = qp.inner.lock();
        held.open_at = Some(now_ms());
        // The sweep, on its own thread, finds the deadline due and the QP taken.
        let sweeper = qp.clone();
        std::thread::spawn(move || sweeper.handle_timeout(now_ms())).join().unwrap();
        assert!(held.dp.link.is_none(), "nothing may touch a QP its holder has not let go of");
        // The holder lets go, as every holder does.
        drop(held);
        qp.settle();
        let inner = qp.inner.lock();
        assert!(inner.open_at.is_none() && inner.dp.link.is_some(), "the due deadline was left waiting: the stream was not opened");
        drop(inner);
        ctx.destroy_qp(&qp);
    }

    /// The IRD/ORD words of the MPA Request a QP in `state` with these attributes opens with.
    fn request_ird_ord(state: QpState, max_dest_rd_atomic: u8, max_rd_atomic: u8) -> (u16, u16) {
        let a = QpAttrs { qp_state: state, max_dest_rd_atomic, max_rd_atomic, ..Default::default() };
        let mut c = Connection::new(config(Role::Initiator, ird(&a), ord(&a), b"hello".to_vec(), 1460), 0);
        let Some(Tx::Bytes(req)) = c.next_tx() else { panic!("no MPA Request") };
        let (f, _) = RrFrame::parse(&req).expect("an MPA Request");
        let io = f.ird_ord().expect("revision 2 IRD/ORD words");
        (io.ird, io.ord)
    }

    /// A receive posted for a Send that waited for one: `post_recv` reads on from the socket,
    /// up to its receive budget; what lies beyond (more than the budget was queued, and no
    /// new byte arrives to raise another readiness event) is read by the progress thread,
    /// with no poll and no new arrival. The stream here is in memory, unknown to epoll: only
    /// the QP being queued for the progress thread can get the rest read.
    #[test]
    fn a_pump_that_uses_up_its_budget_leaves_the_rest_to_the_progress_thread() {
        more_than_budgets_queued(1, true, false, |qp, bed| {
            qp.inner.lock().dp.pump(&qp.env(access::REMOTE_WRITE));
            assert!(qp.inner.lock().dp.link.as_ref().unwrap().conn.rx_stalled(), "the Send waits for a receive");
            assert!(!(bed.landed)(), "the last Write landed before its receive was posted");
            qp.post_recv(RecvWqe { wr_id: 9, sges: smallvec::smallvec![Sge { addr: bed.spare, length: 64, lkey: bed.lkey }] }).unwrap();
        });
    }

    /// An application thread that serves a stream (a poll of an empty CQ, a post that found
    /// news) reads a few receive budgets and returns: a peer that streams faster than the
    /// application reads must not keep its `ibv_poll_cq` from returning. The QP is not
    /// leased here, so the progress thread reads the rest (queued: no readiness reports it).
    #[test]
    fn an_application_thread_reads_a_few_budgets_per_call() {
        more_than_budgets_queued(super::APP_RX_BUDGETS as usize, false, false, |qp, _| {
            assert_eq!(qp.serve(false), Progress::More, "the serve read on past its budget");
        });
    }

    /// A poll of the QP's CQ that finds the QP free serves it itself, there and then: what the
    /// stream holds is placed before the poll returns (the stream is in memory, unknown to the
    /// progress thread; nobody else would read it).
    #[test]
    fn a_poll_that_finds_the_qp_free_serves_it() {
        more_than_budgets_queued(0, false, false, |qp, bed| {
            assert!(!(bed.landed)());
            qp.try_progress(crate::engine::cq::Poller::Renews, now_us(), false);
            assert!((bed.landed)(), "the poll left the stream unread");
        });
    }

    /// Two serves of the progress thread that each read a budget of a one-way stream raise its
    /// wake-up mark (see `engine::pace`); what follows — less than the mark, and no readiness
    /// reports it here — is served by the pace's deadline alone, which lowers the mark first.
    /// Without the deadline the last Write would never land.
    #[test]
    fn a_paced_streams_tail_is_served_by_its_deadline() {
        use crate::engine::pace::MARK;
        more_than_budgets_queued(2, false, true, |qp, bed| {
            assert_eq!(Endpoint::progress(&**qp, false, false), Progress::More);
            assert!(bed.marks.lock().unwrap().is_empty(), "one hot serve is no streak");
            assert_eq!(Endpoint::progress(&**qp, false, false), Progress::More);
            // (The deadline may already have come and lowered it again: the thread that runs
            // it is not this one.)
            assert_eq!(bed.marks.lock().unwrap().first(), Some(&MARK), "two hot serves raise the mark");
        });
    }

    /// What [`more_than_budgets_queued`] hands its test: whether the last Write landed, a
    /// registered spare 64 bytes for a receive, and the wake-up marks the QP's stream was asked
    /// for (recorded when the bed was asked for a stream that takes them).
    struct BudgetBed<'a> {
        landed: &'a dyn Fn() -> bool,
        spare: u64,
        lkey: u32,
        marks: &'a std::sync::Mutex<Vec<usize>>,
    }

    /// A QP in RTS whose stream (in memory, unknown to epoll) holds a Send the QP has no
    /// receive for (`send_first`), then more 64 KiB RDMA Writes than `budgets` receive
    /// budgets; `start` has the QP begin reading, and the progress thread must read the rest
    /// — the last Write lands — with no new arrival. `paced`: the QP's stream takes wake-up
    /// marks (`Stream::wake_after`); then the last mark must be 1 (none left raised).
    fn more_than_budgets_queued(budgets: usize, send_first: bool, paced: bool, start: impl FnOnce(&Arc<Qp>, &BudgetBed<'_>)) {
        // The process's transport takes the memory of the first context that opens it.
        let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
        use crate::engine::datapath::testkit::{cq, Arena, BASE};
        use crate::engine::datapath::RX_BUDGET;
        use crate::engine::transport::memory;
        use crate::engine::wr::{opcode, send_flags, Payload};

        const HALF: u64 = 2 << 20;
        const WRITE: usize = 64 << 10;
        let writes = budgets * RX_BUDGET / WRITE + 2;
        assert!(writes * WRITE < HALF as usize);
        let mem: &'static Arena = Box::leak(Box::new(Arena::new(2 * HALF as usize)));
        let (qp_addr, peer_addr) = (BASE, BASE + HALF);
        let (tx, rx) = std::os::unix::net::UnixStream::pair().unwrap();
        let unread = rx.try_clone().unwrap();
        let device = DeviceInfo {
            name: "uiw_qptest".into(),
            netdev: "lo".into(),
            node_guid: 0,
            gids: vec![std::net::Ipv4Addr::LOCALHOST.to_ipv6_mapped().octets()],
            netdev_mtu: 65536,
            gid_tbl_len: 1,
            ibdev_path: "/nonexistent/uiw_qptest".into(),
            active_speed: 1,
            active_width: 1,
            transport: TransportKind::Tcp,
        };
        let ctx = crate::engine::context::Context::new(Arc::new(device), DeviceLimits::UIW, AsyncSink::new(tx, unread, 16), mem);
        let pd = ctx.alloc_pd().unwrap();
        let qcq = ctx.create_cq(64, None).unwrap();
        let cap = qp_state::QpCap { max_send_wr: 16, max_recv_wr: 16, max_send_sge: 1, max_recv_sge: 1, max_inline_data: 0 };
        let spec = QpSpec { pd, qp_type: qp_state::qp_type::RC, cap, sq_sig_all: false, send_cq: qcq.clone(), recv_cq: qcq.clone(), srq: None };
        let qp = ctx.create_qp(spec).unwrap();
        let qmr = ctx.mrs.register(pd, qp_addr, HALF, qp_addr, access::LOCAL_WRITE | access::REMOTE_WRITE).unwrap();

        // The peer: a data path of its own over an in-memory stream that holds everything.
        let peer_mrs = MrTable::new(4);
        let pmr = peer_mrs.register(1, peer_addr, HALF, peer_addr, access::LOCAL_WRITE).unwrap();
        let (pscq, prcq) = (cq(), cq());
        let penv = Env { qpn: 0x1001, pd: 1, sq_sig_all: false, qp_access: 0, mrs: &peer_mrs, user_mem: mem, send_cq: &pscq, recv_cq: &prcq, srq: None, poller_clock: |_| None, poller_now: Default::default(), holder: None };
        let mut peer = DataPath::default();
        let (sa, mut sb) = memory::pair(WRITE, 4 << 20);
        let marks = if paced { sb.record_wake_marks() } else { Default::default() };
        let mut ca = config(Role::Initiator, 4, 4, b"hi".to_vec(), 1460);
        ca.first_fpdu_hold_ms = 0;
        peer.link = Some(Link::new(Connection::new(ca, 0), Box::new(sa)));
        let mut p = Pending::new(Connection::new(config(Role::Responder, 0, 0, Vec::new(), 1460), 0), Box::new(sb));
        let mut asked = false;
        for _ in 0..1000 {
            peer.pump(&penv);
            if p.read_request().is_some() {
                asked = true;
                break;
            }
        }
        assert!(asked, "no MPA Request");
        p.conn.accept(4, 4, b"ok", 0).unwrap();
        {
            let mut inner = qp.inner.lock();
            inner.attrs.qp_state = QpState::Rts;
            inner.attrs.qp_access_flags = access::REMOTE_WRITE;
            inner.dp.link = Some(Link::new(p.conn, p.stream));
        }
        let pump_qp = || {
            let mut inner = qp.inner.lock();
            let env = qp.env(access::REMOTE_WRITE);
            inner.dp.pump(&env)
        };
        for _ in 0..1000 {
            peer.pump(&penv);
            pump_qp();
            if peer.established() && qp.inner.lock().dp.established() {
                break;
            }
        }
        assert!(peer.established(), "MPA did not complete");

        // A Send the QP has no receive for, then more Writes than one pump may read.
        let wqe = |wr_id, op, addr, len, remote| SendWqe {
            wr_id,
            opcode: op,
            flags: send_flags::SIGNALED,
            payload: Payload::Sges(smallvec::smallvec![Sge { addr, length: len as u32, lkey: pmr.stag }]),
            remote_addr: remote,
            rkey: qmr.stag,
            imm_or_inv: 0,
            compare_add: 0,
            swap: 0,
        };
        if send_first {
            assert_eq!(peer.post_send(&penv, wqe(1, opcode::SEND, peer_addr, 4, 0), 64, true).unwrap(), None);
        }
        for i in 0..writes {
            let at = (i * WRITE) as u64;
            mem.set(peer_addr + at, &vec![i as u8 + 1; WRITE]);
            assert_eq!(peer.post_send(&penv, wqe(2 + i as u64, opcode::RDMA_WRITE, peer_addr + at, WRITE, qp_addr + at), 64, true).unwrap(), None);
        }
        for _ in 0..1000 {
            peer.pump(&penv);
        }

        let last = qp_addr + ((writes - 1) * WRITE) as u64;
        let landed = || mem.get(last, WRITE).iter().all(|&b| b == writes as u8);
        start(&qp, &BudgetBed { landed: &landed, spare: qp_addr + HALF - 64, lkey: qmr.stag, marks: &marks });
        // Not a timing assertion: the progress thread reads the rest at once, or never.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        while !landed() || (paced && marks.lock().unwrap().last() != Some(&1)) {
            assert!(std::time::Instant::now() < deadline, "the bytes past the receive budget were never read (marks {:?})", marks.lock().unwrap());
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        ctx.destroy_qp(&qp);
    }

    /// RFC 6581 §9: an opener advertises the QP's own values, 0 included (an application that
    /// set no responder resources, as SPDK does, is seen with IRD 0); one that opens in RTR,
    /// before RTS gave it an ORD, does not cap its Reads at 1.
    #[test]
    fn an_opener_advertises_the_qps_ird_and_ord() {
        assert_eq!(request_ird_ord(QpState::Rts, 0, 0), (0, 0));
        assert_eq!(request_ird_ord(QpState::Rts, 16, 8), (16, 8));
        assert_eq!(request_ird_ord(QpState::Rtr, 0, 0), (0, MAX_QP_INIT_RD_ATOM as u16));
        assert_eq!(request_ird_ord(QpState::Rtr, 4, 0), (4, MAX_QP_INIT_RD_ATOM as u16));
    }

    /// rdma_accept reports ESTABLISHED before the MPA Reply leaves (issue 13, fabtests'
    /// fi_multi_ep -e msg): once the Reply is out the peer may connect again at once, and
    /// that next CONNECT_REQUEST must not reach the application's channel first. The
    /// ESTABLISHED callback here looks at the peer's socket: not a byte of the Reply may
    /// have arrived yet (loopback TCP queues written bytes at the receiver before the write
    /// returns). After the accept the Reply must be there, so the test sees both moments.
    #[test]
    fn accept_reports_established_before_the_reply_leaves() {
        use std::io::{Read, Write};
        use std::net::{TcpListener, TcpStream};
        use std::sync::mpsc;

        use super::super::cm::{CmConn, CmEventKind};
        use uiw_wire::mpa::{encode_rr, FrameKind, IrdOrd, RrFrame};

        let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
        struct Quiet;
        impl Drop for Quiet {
            fn drop(&mut self) {
                *MEM.wire.lock().unwrap_or_else(|e| e.into_inner()) = None;
            }
        }
        let _quiet = Quiet;
        let (ctx, qp) = context_and_opener();
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let mut peer = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (ours, _) = l.accept().unwrap();
        let w = ours.try_clone().unwrap();
        w.set_nonblocking(true).unwrap();
        *MEM.wire.lock().unwrap() = Some(w);
        let probe = peer.try_clone().unwrap();
        probe.set_nonblocking(true).unwrap();
        let (tx, rx) = mpsc::channel::<(CmEventKind, Option<usize>)>();
        let tx = Mutex::new(tx);
        let cm = CmConn::new(Box::new(move |e| {
            // At ESTABLISHED: how many Reply bytes the peer has already received.
            let seen = (e.kind == CmEventKind::Established).then(|| {
                let mut b = [0u8; 64];
                match probe.peek(&mut b) {
                    Ok(n) => n,
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => 0,
                    Err(e) => panic!("peek: {e}"),
                }
            });
            let _ = tx.lock().unwrap().send((e.kind, seen));
        }));
        ctx.cm_passive(ours, cm.clone()).unwrap();
        let mut req = Vec::new();
        encode_rr(FrameKind::Request, 0, 2, Some(IrdOrd { ird: 1, ord: 1, ..Default::default() }), b"", &mut req);
        peer.write_all(&req).unwrap();
        let wait = std::time::Duration::from_secs(30);
        assert_eq!(rx.recv_timeout(wait).unwrap().0, CmEventKind::ConnectRequest);
        qp.cm_accept(&cm, b"", 1, 1).unwrap();
        let (kind, seen) = rx.recv_timeout(wait).unwrap();
        assert_eq!(kind, CmEventKind::Established);
        assert_eq!(seen, Some(0), "the MPA Reply reached the peer before ESTABLISHED was reported");
        // And the Reply did go out (`probe` shares the socket's O_NONBLOCK: clear it).
        peer.set_nonblocking(false).unwrap();
        peer.set_read_timeout(Some(wait)).unwrap();
        let mut got = Vec::new();
        let mut b = [0u8; 256];
        while RrFrame::parse(&got).is_err() {
            let n = peer.read(&mut b).unwrap();
            assert!(n > 0, "the stream closed before the MPA Reply");
            got.extend_from_slice(&b[..n]);
        }
        let (f, _) = RrFrame::parse(&got).unwrap();
        assert!(!f.hdr.reject());
        cm.release();
        ctx.destroy_qp(&qp);
    }
}
