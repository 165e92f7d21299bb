//! Completion queues: a bounded queue of completions, and the arming rules of
//! `ibv_req_notify_cq` (one notification per arming; `solicited_only` waits for a solicited
//! receive or any error completion, IBTA Vol 1 §11.4.2.2).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use parking_lot::{Mutex, RwLock};

use super::events::{event_type, AsyncSink, ChannelSink};

/// `enum ibv_wc_opcode`.
pub mod wc_opcode {
    pub const SEND: u32 = 0;
    pub const RDMA_WRITE: u32 = 1;
    pub const RDMA_READ: u32 = 2;
    pub const COMP_SWAP: u32 = 3;
    pub const FETCH_ADD: u32 = 4;
    pub const BIND_MW: u32 = 5;
    pub const LOCAL_INV: u32 = 6;
    pub const RECV: u32 = 128;
    pub const RECV_RDMA_WITH_IMM: u32 = 129;
}

/// `enum ibv_wc_status` values uiw produces.
pub mod wc_status {
    pub const SUCCESS: u32 = 0;
    pub const LOC_LEN_ERR: u32 = 1;
    pub const LOC_QP_OP_ERR: u32 = 2;
    pub const LOC_PROT_ERR: u32 = 4;
    pub const WR_FLUSH_ERR: u32 = 5;
    pub const REM_ACCESS_ERR: u32 = 10;
    pub const REM_OP_ERR: u32 = 11;
    pub const GENERAL_ERR: u32 = 21;
}

/// `enum ibv_wc_flags`.
pub mod wc_flags {
    pub const WITH_IMM: u32 = 1 << 1;
    pub const WITH_INV: u32 = 1 << 3;
}

/// One work completion, field for field what `struct ibv_wc` reports.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Completion {
    pub wr_id: u64,
    pub status: u32,
    pub opcode: u32,
    pub vendor_err: u32,
    pub byte_len: u32,
    /// Immediate data (network order, as `ibv_wc.imm_data`) or the invalidated rkey.
    pub imm_or_inv: u32,
    pub qp_num: u32,
    pub wc_flags: u32,
    /// A receive completion of a message sent with the Solicited Event bit.
    pub solicited: bool,
}

/// A queued completion, and whether a poll batch must end before it (see [`Cq`]).
#[derive(Debug, Clone, Copy)]
struct Entry {
    c: Completion,
    new_batch: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Arming {
    Disarmed,
    Next,
    Solicited,
}

/// The queue behind one `ibv_cq`.
///
/// A QP's flushed WRs never come out of one poll together with its completions that came
/// before them: the first flush queued behind a QP's own completions starts a new batch
/// (`ibv_poll_cq` returns what precedes it, the next poll the flushes). When a peer closes,
/// the QP fails at once, and an application reaping its last completions in a batch —
/// `ibv_rc_pingpong` polls two at a time and gives up at the first non-success — must find
/// only those; the flushes are there for the next poll. Returning fewer completions than
/// queued is what `ibv_poll_cq` may always do.
#[derive(Debug)]
pub struct Cq {
    capacity: usize,
    entries: VecDeque<Entry>,
    arming: Arming,
    overflowed: bool,
}

/// What the caller must do after a push.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pushed {
    /// Queued; nobody to tell.
    Queued,
    /// Queued, and the CQ was armed for it: write a completion event to its channel.
    Notify,
    /// The CQ is full: the completion is lost, the CQ is in error (raise `IBV_EVENT_CQ_ERR`).
    Overflow,
}

impl Cq {
    pub fn new(capacity: usize) -> Cq {
        Cq { capacity, entries: VecDeque::with_capacity(capacity.min(4096)), arming: Arming::Disarmed, overflowed: false }
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    pub fn overflowed(&self) -> bool {
        self.overflowed
    }

    pub fn push(&mut self, c: Completion) -> Pushed {
        if self.overflowed || self.entries.len() >= self.capacity {
            self.overflowed = true;
            return Pushed::Overflow;
        }
        let fire = match self.arming {
            Arming::Disarmed => false,
            Arming::Next => true,
            Arming::Solicited => c.solicited || c.status != wc_status::SUCCESS,
        };
        let new_batch = c.status == wc_status::WR_FLUSH_ERR && self.follows_own_completion(c.qp_num);
        self.entries.push_back(Entry { c, new_batch });
        if fire {
            self.arming = Arming::Disarmed;
            Pushed::Notify
        } else {
            Pushed::Queued
        }
    }

    /// Whether the last completion of QP `qpn` queued is one of its own (not a flush): a flush
    /// queued now starts a new batch. Looks back only to the QP's last entry, which during a
    /// run of flushes is the last one queued.
    fn follows_own_completion(&self, qpn: u32) -> bool {
        self.entries.iter().rev().find(|e| e.c.qp_num == qpn).is_some_and(|e| e.c.status != wc_status::WR_FLUSH_ERR)
    }

    /// The next completion, whatever the batches.
    pub fn pop(&mut self) -> Option<Completion> {
        self.entries.pop_front().map(|e| e.c)
    }

    /// The next completion of a poll that has already taken `taken` of them: `None` when the
    /// queue is empty or the batch ends here (see [`Cq`]).
    pub fn pop_batch(&mut self, taken: usize) -> Option<Completion> {
        if taken > 0 && self.entries.front()?.new_batch {
            return None;
        }
        self.pop()
    }

    /// Whether a completion event is requested (the application sleeps, or is about to, on the
    /// completion channel: its polls claim no QP, see `lease`).
    pub fn armed(&self) -> bool {
        self.arming != Arming::Disarmed
    }

    /// `ibv_req_notify_cq`: arm for the next (or next solicited) completion. A stronger arming
    /// (any completion) is not weakened by a later `solicited_only` request.
    pub fn arm(&mut self, solicited_only: bool) {
        self.arming = match (self.arming, solicited_only) {
            (Arming::Next, _) | (_, false) => Arming::Next,
            _ => Arming::Solicited,
        };
    }

    /// `ibv_resize_cq`: grow or shrink; refuses to drop queued completions (EINVAL, as rxe).
    pub fn resize(&mut self, capacity: usize) -> Result<(), super::error::Error> {
        if capacity < self.entries.len() {
            return Err(super::error::Error::Invalid);
        }
        self.capacity = capacity;
        Ok(())
    }

    /// Removes every completion of a QP that is being destroyed.
    pub fn purge_qp(&mut self, qp_num: u32) {
        self.entries.retain(|e| e.c.qp_num != qp_num);
    }
}

/// What the thread that drives a QP from a poll means to do next (see `lease`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Poller {
    /// It keeps polling: it takes the QP over from the progress thread.
    Claims,
    /// It polls on: a lease it holds is renewed, none is claimed.
    Renews,
    /// It is about to sleep on the completion channel: no lease.
    Sleeps,
}

/// A QP as the CQs it completes into see it: `ibv_poll_cq` on an empty CQ drives it.
pub trait PolledQp: Send + Sync {
    fn qpn(&self) -> u32;
    /// Serve the QP's stream here unless another thread is at it; the polling thread may take
    /// the QP over from the progress thread for a while (see `lease`). Returns whether the
    /// stream's buffer is full (its last send said `WouldBlock`): nothing more can be sent on
    /// it until the peer reads.
    /// `now`: the poll's reading of the engine clock (µs). `input_quiet`: a look at the
    /// stream's descriptor just now found nothing to read (see [`PolledQp::input_probe`]), so
    /// this serve need not `recv` to learn it.
    fn try_progress(&self, poller: Poller, now: u64, input_quiet: bool) -> bool;
    /// The descriptor whose readability tells whether the stream has input — a kernel
    /// socket's — while the QP is leased to a poller (out of the progress thread's epoll set,
    /// nobody else reads it on readiness); `None` otherwise. A poll that drives several such
    /// QPs looks at all of them with one `poll` and lets the quiet ones skip their `recv`.
    fn input_probe(&self) -> Option<i32>;
    /// The application is going to sleep on the CQ's channel: the progress thread takes the
    /// QP back (and reports a completion that waited for the answer: nobody polls for it).
    fn hand_back(&self);
    /// A lone RDMA Write's completion waits for the peer's answer (see `datapath::answer`).
    fn awaits_answer(&self) -> bool;
    /// A poll of this CQ drove its QPs (`own`): other QPs are served from it too — those whose
    /// raw streams its stack turns fed, and, when `renewed_before` is not 0 (a poll that found
    /// nothing), the QPs of other CQs leased to a poller whose lease was renewed before
    /// `renewed_before` (the CQ's previous poll: their poller has moved on to this CQ).
    fn serve_others(&self, own: &dyn Fn(u32) -> bool, renewed_before: u64);
    /// The application took a completion of this QP that [`delivered`] says the peer has: if
    /// the QP at the other end is one of this process's, it places what it was sent before
    /// the poll returns (see `Qp::local_peer`).
    fn delivered(&self);
    /// The QP's stream is up and its peer is known not to be one of this process's QPs (see
    /// `Qp::local_peer`): [`PolledQp::delivered`] has nothing to do for it, now or later.
    fn peer_elsewhere(&self) -> bool;
}

impl std::fmt::Debug for dyn PolledQp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "QP 0x{:06x}", self.qpn())
    }
}

/// The most QPs of one CQ whose input one poll looks at together (see [`input_quiet`]).
const QUIET_LOOK_MAX: usize = uiw_kabi::sys::POLL_QUIET_MAX;

/// For a poll that found the CQ empty and drives its QPs: which of them certainly have nothing
/// to read now. Without this, each QP's serve made a `recv` that only said `EAGAIN` — an SPDK
/// target's poll group puts its admin and I/O queues on one CQ, and every empty poll of it
/// made two (a `recv` that finds nothing costs about 0.48 µs here, a `poll` of two sockets
/// 0.56, of four 0.59). With fewer than two QPs to look at a `recv` is as cheap as the look,
/// and nothing is looked at. Input that arrives between the look and the serve is read by the
/// next poll (the look is level-triggered), or by the progress thread once the lease lapses.
fn input_quiet(qps: &[Arc<dyn PolledQp>]) -> [bool; QUIET_LOOK_MAX] {
    let mut quiet = [false; QUIET_LOOK_MAX];
    if qps.len() < 2 {
        return quiet;
    }
    let mut fds = [-1i32; QUIET_LOOK_MAX];
    let mut at = [usize::MAX; QUIET_LOOK_MAX];
    let mut n = 0;
    for (i, qp) in qps.iter().enumerate().take(QUIET_LOOK_MAX) {
        if let Some(fd) = qp.input_probe() {
            fds[n] = fd;
            at[n] = i;
            n += 1;
        }
    }
    if n < 2 {
        return quiet;
    }
    let mut looked = [false; QUIET_LOOK_MAX];
    uiw_kabi::sys::poll_quiet(&fds[..n], &mut looked[..n]);
    for k in 0..n {
        quiet[at[k]] = looked[k];
    }
    quiet
}

/// Whether a completion tells the application that the peer has what the WR carried: a
/// successful Send or RDMA Write (RFC 5040 completes them once the stream took the bytes). A
/// program that polls one and then reads the target (rdma-core's own tests do, with both QPs
/// in one process) must find the bytes there.
pub fn delivered(c: &Completion) -> bool {
    c.status == wc_status::SUCCESS && matches!(c.opcode, wc_opcode::SEND | wc_opcode::RDMA_WRITE)
}

/// A completion queue and where its events go.
#[derive(Debug)]
pub struct CqObj {
    /// The application's `ibv_cq*`, which completion events carry.
    pub handle: AtomicU64,
    /// The queue: taken with [`CqObj::lock_q`], which keeps [`CqObj::len`] in step.
    q: Mutex<Cq>,
    /// How many completions `q` holds, as of the last time its lock was let go: a poll asks
    /// whether the queue is empty without taking the lock (two locked instructions on every
    /// poll of a spinning application).
    len: AtomicUsize,
    pub channel: Option<Arc<ChannelSink>>,
    pub(crate) async_sink: Arc<AsyncSink>,
    pub comp_events_reported: AtomicU32,
    pub async_events_reported: AtomicU32,
    /// QPs using this CQ (destroy fails with EBUSY while any do).
    pub(crate) users: AtomicU32,
    /// The same QPs, for progress driven by `ibv_poll_cq`. Held, not weak: a poll drives them
    /// under the read lock without taking a reference to each (an upgrade and a drop, with
    /// the lock's own two, were four locked instructions on every poll); `ibv_destroy_qp`
    /// takes its QP out ([`CqObj::remove_qp`]) before the QP goes.
    qps: RwLock<Vec<Arc<dyn PolledQp>>>,
    /// When (engine µs) a poll that finds completions next renews the QPs' leases (see
    /// `lease`): a poller that keeps finding completions drives its QPs too, at most every
    /// half lease.
    pub(crate) renew_at: AtomicU64,
    /// A doorbell of one of the QPs waits for the next poll of this CQ (see `Qp::post_send`).
    /// When polls began to find the CQ empty while one of its QPs' lone Write waits for the
    /// answer (engine µs; 0: none is waiting, or a poll returned completions since).
    awaiting_since: AtomicU64,
    pub(crate) deferred: AtomicBool,
    /// Polls so far: a QP tells by it whether the application polled since its last post.
    pub(crate) polls: AtomicU64,
    /// Since when (engine µs) every poll found the CQ empty (0: the last one did not).
    pub(crate) empty_since: AtomicU64,
    /// When (engine µs) the CQ was last polled.
    pub(crate) polled_at: AtomicU64,
    /// `q`'s [`Cq::armed`], written with it under its lock: every poll asks, and a poll of a
    /// CQ nobody arms need not take the lock to hear so.
    armed: AtomicBool,
    /// Completions queued so far, counted under `q`'s lock (see [`CqObj::still_empty`]).
    queued: AtomicU64,
    /// Every QP in `qps` has its peer in another process ([`PolledQp::peer_elsewhere`]):
    /// a poll that reports a Send or Write has no QP of ours to place it (see
    /// [`CqObj::delivered`]). Written under `qps`' lock; a QP that joins clears it.
    peers_elsewhere: AtomicBool,
}

impl CqObj {
    /// A CQ of `capacity` entries, its events to `channel` (if any) and `async_sink`.
    pub fn new(capacity: usize, channel: Option<Arc<ChannelSink>>, async_sink: Arc<AsyncSink>) -> CqObj {
        CqObj {
            handle: AtomicU64::new(0),
            q: Mutex::new(Cq::new(capacity)),
            len: AtomicUsize::new(0),
            channel,
            async_sink,
            comp_events_reported: AtomicU32::new(0),
            async_events_reported: AtomicU32::new(0),
            users: AtomicU32::new(0),
            qps: RwLock::new(Vec::new()),
            renew_at: AtomicU64::new(0),
            deferred: AtomicBool::new(false),
            awaiting_since: AtomicU64::new(0),
            polls: AtomicU64::new(0),
            empty_since: AtomicU64::new(0),
            polled_at: AtomicU64::new(0),
            armed: AtomicBool::new(false),
            queued: AtomicU64::new(0),
            peers_elsewhere: AtomicBool::new(false),
        }
    }

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
    /// `ibv_poll_cq` (and `ibv_start_poll`) is about to take completions; `empty`: there are
    /// none. An empty CQ drives its QPs (below); so does a CQ with completions when a doorbell
    /// waits for this poll, or every half lease (the poller keeps its QPs' leases, so doorbells
    /// posted between its polls go out together at the next).
    pub fn polling(&self, empty: bool) {
        // A load and a store, not a locked add: pollers of one CQ racing each other may lose
        // an increment, but the count still moves, and whether it moved since a post is all a
        // QP asks of it (`Qp::defer_doorbell`).
        self.polls.store(self.polls.load(Ordering::Relaxed).wrapping_add(1), Ordering::Relaxed);
        super::affinity::note_app_cpu();
        let (now, _held) = super::clock::hold();
        // A load and a store, not an exchange: pollers of one CQ racing each other only blur
        // when "the previous poll" was (see `Qp::serve_others`).
        let previous = self.polled_at.load(Ordering::Relaxed);
        self.polled_at.store(now, Ordering::Relaxed);
        if empty {
            // A claim takes a streak of empty polls: a thread that polls once for its own
            // send completion and then waits by other means (ib_write_lat spins on memory)
            // must not hold the QP away from the progress thread.
            let since = match self.empty_since.load(Ordering::Relaxed) {
                0 => {
                    self.empty_since.store(now.max(1), Ordering::Relaxed);
                    now
                }
                t => t,
            };
            let claim = now.saturating_sub(since) >= super::lease::CLAIM_AFTER_US;
            if self.drive(if claim { Poller::Claims } else { Poller::Renews }, now, previous, true) {
                // Nothing to reap and no stream to write to: the poller gives its CPU to
                // whoever waits for it (on a machine with few cores, the thread that reads what
                // these streams carry — the progress thread of the peer — is the one thread
                // that can make room). A `send` that found the socket full would sleep here;
                // a poll must return, and `sched_yield` returns at once when nobody waits.
                std::thread::yield_now();
            }
            return;
        }
        self.empty_since.store(0, Ordering::Relaxed);
        if super::flag::take(&self.deferred) || now >= self.renew_at.load(Ordering::Relaxed) {
            let _ = self.drive(Poller::Renews, now, 0, false);
        }
    }

    /// Receive and transmit for the CQ's QPs right here, without waiting for the progress
    /// thread to be scheduled (skipping QPs another thread is serving).
    ///
    /// A CQ nobody armed is polled by a thread that keeps polling: it may claim its QPs, and
    /// renews the leases it holds (see `lease`). An armed CQ's poller is about to sleep on the
    /// channel: it claims nothing.
    /// `now`: the poll's reading of the engine clock (µs); `empty`: the poll found the CQ empty.
    ///
    /// Returns whether the poll can do nothing now: the CQ has QPs, every one's stream is full
    /// (see [`PolledQp::try_progress`]), and still nothing was completed.
    fn drive(&self, poller: Poller, now: u64, previous: u64, empty: bool) -> bool {
        let poller = if self.armed.load(Ordering::Relaxed) { Poller::Sleeps } else { poller };
        self.renew_at.store(now + super::lease::LEASE_US / 2, Ordering::Relaxed);
        // Recursive: a writer waiting (a QP being created or destroyed) does not stop a
        // poll that is already driving, whatever it calls.
        let qps = self.qps.read_recursive();
        // A poller that keeps waiting for a Write's completion that waits for the answer reads
        // the answer itself: it takes the QP after a short run of empty polls (see `reaped`).
        let poller = match poller {
            Poller::Renews if empty && qps.iter().any(|q| q.awaits_answer()) => {
                let since = match self.awaiting_since.load(Ordering::Relaxed) {
                    0 => {
                        self.awaiting_since.store(now.max(1), Ordering::Relaxed);
                        now
                    }
                    t => t,
                };
                if now.saturating_sub(since) >= super::lease::CLAIM_AWAITING_ANSWER_US {
                    Poller::Claims
                } else {
                    Poller::Renews
                }
            }
            p => p,
        };
        let quiet = if empty { input_quiet(&qps) } else { [false; QUIET_LOOK_MAX] };
        let mut full = !qps.is_empty();
        for (i, qp) in qps.iter().enumerate() {
            full &= qp.try_progress(poller, now, quiet.get(i).copied().unwrap_or(false));
        }
        if let Some(qp) = qps.first() {
            qp.serve_others(&|n| qps.iter().any(|q| q.qpn() == n), previous);
        }
        full && self.lock_q().is_empty()
    }

    /// A poll returned completions: a run of polls waiting for a completion that waits for
    /// the answer ends there, though the poll found the CQ empty when it began (its drive
    /// released the completion: see `datapath::answer`). The next wait starts a new run.
    pub fn reaped(&self) {
        self.awaiting_since.store(0, Ordering::Relaxed);
    }

    /// `ibv_req_notify_cq`: the application will sleep until a completion event, so the
    /// progress thread must serve the CQ's QPs from now on.
    pub fn arm(&self, solicited_only: bool) {
        let mut q = self.lock_q();
        q.arm(solicited_only);
        self.armed.store(true, Ordering::Relaxed);
        drop(q);
        for qp in self.qps.read_recursive().iter() {
            qp.hand_back();
        }
    }

    /// `ibv_poll_cq` and `ibv_start_poll` are about to take completions: drives the QPs when
    /// the queue is empty ([`CqObj::polling`]), and says whether there may be completions to
    /// take — not when the queue was empty and nothing was queued since.
    pub fn poll_begins(&self) -> bool {
        let (empty, queued) = self.emptiness();
        self.polling(empty);
        !(empty && self.still_empty(queued))
    }

    /// Whether the queue is empty now, and how many completions were queued so far (for
    /// [`CqObj::still_empty`]). Read without the queue's lock: the count first, so that a
    /// completion queued meanwhile makes the queue look either not empty, or empty with the
    /// count moved on (`still_empty` then sends the poll on to the queue) — never empty with
    /// the count from before it.
    fn emptiness(&self) -> (bool, u64) {
        let queued = self.queued.load(Ordering::Acquire);
        (self.len.load(Ordering::Acquire) == 0, queued)
    }

    /// The queue, locked; [`CqObj::len`] follows what the holder leaves in it.
    pub fn lock_q(&self) -> CqGuard<'_> {
        CqGuard { q: self.q.lock(), len: &self.len }
    }

    /// Whether a queue found empty when `queued` completions had been queued has had none
    /// queued since: a poll that found it empty and drove the QPs (`polling`) to no effect
    /// returns without taking the lock again — one lock fewer on every empty poll of a
    /// spinning application.
    fn still_empty(&self, queued: u64) -> bool {
        self.queued.load(Ordering::Acquire) == queued
    }

    /// The engine clock now if a thread polls this CQ for its completions — one polled it
    /// lately and it is not armed for an event —, else `None` (see `datapath::answer`).
    pub fn poller_clock(&self) -> Option<u64> {
        let now = super::clock::now_us();
        (self.polled_lately(now) && !self.armed.load(Ordering::Relaxed)).then_some(now)
    }

    /// Whether a thread polled this CQ within the last [`super::lease::CHECK_MAX_US`]: it is
    /// a thread that polls, and likely to poll again. Not one lease (50 µs): an application
    /// that posts bursts to several QPs between two polls (perftest `-q 4`) spends longer than
    /// that posting, and its later bursts then rang one `sendmsg` per WR (0.09 M msg/s against
    /// 0.43 with one QP). A doorbell that waits on a poller that stops polling still waits at
    /// most until its lease lapses.
    pub fn polled_lately(&self, now: u64) -> bool {
        now.saturating_sub(self.polled_at.load(Ordering::Relaxed)) < super::lease::CHECK_MAX_US
    }

    /// A poll took a completion of QP `qpn` that [`delivered`] says the peer has (called with
    /// the CQ's queue let go: the peer may complete into this CQ).
    ///
    /// Once every QP of the CQ is known to talk to another process, that is a load: a poll
    /// that returned a Send's or Write's completion took the QP list's lock and a reference
    /// to each QP (four locked instructions) to learn, each time, that there was nothing to do.
    pub fn delivered(&self, qpn: u32) {
        if self.peers_elsewhere.load(Ordering::Relaxed) {
            return;
        }
        let qp = self.qps.read_recursive().iter().find(|q| q.qpn() == qpn).cloned();
        if let Some(qp) = qp {
            // Finds out, the first time, where the peer is.
            qp.delivered();
        }
        let qps = self.qps.read_recursive();
        if qps.iter().all(|q| q.peer_elsewhere()) {
            self.peers_elsewhere.store(true, Ordering::Relaxed);
        }
    }

    /// A QP completes into this CQ from now on: polls drive it, and learn where its peer is.
    pub fn add_qp(&self, qp: Arc<dyn PolledQp>) {
        let mut qps = self.qps.write();
        qps.push(qp);
        self.peers_elsewhere.store(false, Ordering::Relaxed);
    }

    /// QP `qpn` is being destroyed: polls no longer drive it, and the CQ lets go of it.
    pub fn remove_qp(&self, qpn: u32) {
        self.qps.write().retain(|q| q.qpn() != qpn);
    }

    pub fn push(&self, c: Completion) {
        let mut q = self.lock_q();
        let pushed = q.push(c);
        self.queued.store(self.queued.load(Ordering::Relaxed).wrapping_add(1), Ordering::Release);
        if pushed == Pushed::Notify {
            self.armed.store(q.armed(), Ordering::Relaxed);
        }
        drop(q);
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

/// [`CqObj`]'s queue, locked ([`CqObj::lock_q`]). Letting it go publishes the queue's length
/// for the polls that look without the lock.
pub struct CqGuard<'a> {
    q: parking_lot::MutexGuard<'a, Cq>,
    len: &'a AtomicUsize,
}

impl std::ops::Deref for CqGuard<'_> {
    type Target = Cq;
    fn deref(&self) -> &Cq {
        &self.q
    }
}

impl std::ops::DerefMut for CqGuard<'_> {
    fn deref_mut(&mut self) -> &mut Cq {
        &mut self.q
    }
}

impl Drop for CqGuard<'_> {
    fn drop(&mut self) {
        self.len.store(self.q.len(), Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c(wr_id: u64) -> Completion {
        Completion { wr_id, ..Default::default() }
    }

    #[test]
    fn fifo_and_overflow() {
        let mut q = Cq::new(2);
        assert_eq!(q.push(c(1)), Pushed::Queued);
        assert_eq!(q.push(c(2)), Pushed::Queued);
        assert_eq!(q.push(c(3)), Pushed::Overflow);
        assert!(q.overflowed());
        assert_eq!(q.pop().unwrap().wr_id, 1);
        assert_eq!(q.pop().unwrap().wr_id, 2);
        assert_eq!(q.pop(), None);
    }

    #[test]
    fn one_notification_per_arming() {
        let mut q = Cq::new(8);
        assert_eq!(q.push(c(1)), Pushed::Queued);
        q.arm(false);
        assert_eq!(q.push(c(2)), Pushed::Notify);
        assert_eq!(q.push(c(3)), Pushed::Queued);
    }

    #[test]
    fn solicited_arming_waits_for_solicited_or_error() {
        let mut q = Cq::new(8);
        q.arm(true);
        assert_eq!(q.push(c(1)), Pushed::Queued);
        assert_eq!(q.push(Completion { solicited: true, ..c(2) }), Pushed::Notify);
        q.arm(true);
        assert_eq!(q.push(Completion { status: wc_status::WR_FLUSH_ERR, ..c(3) }), Pushed::Notify);
        q.arm(false);
        q.arm(true);
        assert_eq!(q.push(c(4)), Pushed::Notify, "solicited_only must not weaken a pending arming");
    }

    #[test]
    fn a_qps_flushes_start_a_poll_of_their_own() {
        let mut q = Cq::new(16);
        let ok = |wr_id, qp_num| Completion { qp_num, ..c(wr_id) };
        let flush = |wr_id, qp_num| Completion { qp_num, status: wc_status::WR_FLUSH_ERR, ..c(wr_id) };
        // QP 2's flush follows none of its own completions: it needs no batch of its own.
        for e in [ok(1, 7), flush(20, 2), ok(2, 7), flush(3, 7), flush(4, 7), ok(5, 9)] {
            q.push(e);
        }
        let mut polls = Vec::new();
        while !q.is_empty() {
            let batch: Vec<u64> = (0..).map_while(|taken| q.pop_batch(taken)).map(|c| c.wr_id).collect();
            polls.push(batch);
        }
        assert_eq!(polls, vec![vec![1, 20, 2], vec![3, 4, 5]]);
        // A poll of one entry at a time sees every completion, in order.
        for e in [ok(1, 7), flush(2, 7)] {
            q.push(e);
        }
        assert_eq!(q.pop_batch(0).map(|c| c.wr_id), Some(1));
        assert_eq!(q.pop_batch(0).map(|c| c.wr_id), Some(2));
    }

    #[test]
    fn resize_and_purge() {
        let mut q = Cq::new(4);
        q.push(Completion { qp_num: 7, ..c(1) });
        q.push(Completion { qp_num: 8, ..c(2) });
        assert!(matches!(q.resize(1), Err(crate::engine::error::Error::Invalid)));
        q.purge_qp(7);
        assert_eq!(q.len(), 1);
        assert!(q.resize(1).is_ok());
        assert_eq!(q.capacity(), 1);
    }

    /// A fake QP for [`CqObj::drive`]: whether its stream is full, and how often it was driven.
    struct Fake {
        full: bool,
        driven: AtomicU32,
        /// What the last `serve_others` asked for: the poll time before which a lease
        /// must have been renewed, and whether QP 1 (every fake's number) was named as the CQ's own.
        aside: Mutex<Option<(u64, bool)>>,
        /// Whether its lone Write's completion waits for the answer; how the last drive meant
        /// to poll; how often the CQ's arming handed it back (which ends such a wait).
        awaits: AtomicBool,
        last_poller: Mutex<Option<Poller>>,
        handed_back: AtomicU32,
        /// The descriptor it offers for a look at its input, and what the last drive said of
        /// that input (quiet or not).
        probe: Option<i32>,
        last_quiet: Mutex<Option<bool>>,
        /// Whether its peer is known to be another process's; how often a poll asked it to
        /// place what it delivered at a peer of this process.
        elsewhere: AtomicBool,
        asked_delivered: AtomicU32,
    }

    impl Fake {
        fn new(full: bool, probe: Option<i32>) -> Arc<Fake> {
            Arc::new(Fake {
                full,
                driven: AtomicU32::new(0),
                aside: Mutex::new(None),
                awaits: AtomicBool::new(false),
                last_poller: Mutex::new(None),
                handed_back: AtomicU32::new(0),
                probe,
                last_quiet: Mutex::new(None),
                elsewhere: AtomicBool::new(false),
                asked_delivered: AtomicU32::new(0),
            })
        }
    }

    impl PolledQp for Fake {
        fn qpn(&self) -> u32 {
            1
        }
        fn try_progress(&self, poller: Poller, _: u64, input_quiet: bool) -> bool {
            self.driven.fetch_add(1, Ordering::Relaxed);
            *self.last_poller.lock() = Some(poller);
            *self.last_quiet.lock() = Some(input_quiet);
            self.full
        }
        fn input_probe(&self) -> Option<i32> {
            self.probe
        }
        fn hand_back(&self) {
            self.handed_back.fetch_add(1, Ordering::Relaxed);
        }
        fn awaits_answer(&self) -> bool {
            self.awaits.load(Ordering::Relaxed)
        }
        fn serve_others(&self, own: &dyn Fn(u32) -> bool, renewed_before: u64) {
            *self.aside.lock() = Some((renewed_before, own(1)));
        }
        fn delivered(&self) {
            self.asked_delivered.fetch_add(1, Ordering::Relaxed);
        }
        fn peer_elsewhere(&self) -> bool {
            self.elsewhere.load(Ordering::Relaxed)
        }
    }

    fn cq_with(full: &[bool]) -> (CqObj, Vec<Arc<Fake>>) {
        cq_probing(&full.iter().map(|&f| (f, None)).collect::<Vec<_>>())
    }

    /// [`cq_with`], each QP offering a descriptor (or none) for a look at its input.
    fn cq_probing(qps: &[(bool, Option<i32>)]) -> (CqObj, Vec<Arc<Fake>>) {
        let (tx, rx) = std::os::unix::net::UnixStream::pair().unwrap();
        let cq = CqObj::new(8, None, Arc::new(AsyncSink::new(tx, rx, 16)));
        let qps: Vec<Arc<Fake>> = qps.iter().map(|&(f, probe)| Fake::new(f, probe)).collect();
        for q in &qps {
            add(&cq, q);
        }
        (cq, qps)
    }

    fn add(cq: &CqObj, qp: &Arc<Fake>) {
        cq.add_qp(qp.clone());
    }

    /// A poll that took a Send's or Write's completion asks the QP to place it at a peer of
    /// this process until every QP of the CQ is known to talk to another process (then there
    /// is never anything to place: no lock, no walk of the QPs); a QP that joins the CQ makes
    /// polls ask again.
    #[test]
    fn delivery_is_looked_into_until_every_peer_is_known_to_be_elsewhere() {
        let asked = |q: &Fake| q.asked_delivered.load(Ordering::Relaxed);
        let (cq, qps) = cq_with(&[false]);
        cq.delivered(1);
        cq.delivered(1);
        assert_eq!(asked(&qps[0]), 2, "where the peer is is not known yet");
        qps[0].elsewhere.store(true, Ordering::Relaxed);
        cq.delivered(1);
        cq.delivered(1);
        assert_eq!(asked(&qps[0]), 3, "known to be elsewhere after the third poll");
        let late = Fake::new(false, None);
        add(&cq, &late);
        cq.delivered(1);
        assert_eq!(asked(&qps[0]), 4, "a QP joined whose peer is not known yet");
        late.elsewhere.store(true, Ordering::Relaxed);
        cq.delivered(1);
        cq.delivered(1);
        assert_eq!(asked(&qps[0]), 5, "both known to be elsewhere");
    }

    /// A poll that found the queue empty returns without looking again only while nothing was
    /// queued since (`still_empty`): a completion its drive, or another thread, queued
    /// meanwhile is looked for.
    #[test]
    fn an_empty_poll_looks_again_only_if_something_was_queued() {
        let (cq, _qps) = cq_with(&[false]);
        let (empty, queued) = cq.emptiness();
        assert!(empty);
        cq.polling(true);
        assert!(cq.still_empty(queued), "the drive queued nothing");
        cq.push(c(1));
        assert!(!cq.still_empty(queued), "a completion was queued since the look");
        let (empty, queued) = cq.emptiness();
        assert!(!empty);
        assert_eq!(cq.lock_q().pop().map(|c| c.wr_id), Some(1));
        let (empty, after) = cq.emptiness();
        assert!(empty && after == queued && cq.still_empty(after), "taking completions queues none");
        assert!(!cq.poll_begins(), "empty, and the drive queued nothing: nothing to take");
        cq.push(c(2));
        assert!(cq.poll_begins(), "a completion waits");
    }

    /// Polls see the queue's length without its lock as whoever held it left it: a QP's
    /// completions purged at its destroy leave an empty queue, which the next poll drives
    /// the QPs for.
    #[test]
    fn polls_see_the_length_the_queue_was_left_with() {
        let (cq, qps) = cq_with(&[false]);
        cq.push(Completion { qp_num: 7, ..c(1) });
        cq.push(Completion { qp_num: 8, ..c(2) });
        assert!(!cq.emptiness().0);
        cq.lock_q().purge_qp(7);
        assert!(!cq.emptiness().0, "one left");
        cq.lock_q().purge_qp(8);
        assert!(cq.emptiness().0, "purged");
        let before = qps[0].driven.load(Ordering::Relaxed);
        assert!(!cq.poll_begins(), "nothing to take");
        assert_eq!(qps[0].driven.load(Ordering::Relaxed), before + 1, "an empty poll drives the QP");
    }

    /// A QP taken out of the CQ (its destroy) is driven by no poll, and the CQ lets go of it:
    /// the CQ holds its QPs, so a QP left in it would never be freed.
    #[test]
    fn a_removed_qp_is_not_driven_and_not_held() {
        let (cq, qps) = cq_with(&[false]);
        assert!(!cq.poll_begins());
        assert_eq!(qps[0].driven.load(Ordering::Relaxed), 1);
        assert_eq!(Arc::strong_count(&qps[0]), 2, "the test's and the CQ's");
        cq.remove_qp(2);
        assert_eq!(Arc::strong_count(&qps[0]), 2, "another QP's number takes nothing out");
        cq.remove_qp(1);
        assert_eq!(Arc::strong_count(&qps[0]), 1, "the CQ let go");
        assert!(!cq.poll_begins());
        assert_eq!(qps[0].driven.load(Ordering::Relaxed), 1, "not driven after its removal");
    }

    /// Polls read the CQ's arming without its lock: armed by `ibv_req_notify_cq`, disarmed by
    /// the completion that fires the notification, as the queue itself has it.
    #[test]
    fn polls_see_the_arming_the_queue_has() {
        let (cq, _qps) = cq_with(&[false]);
        cq.polling(true);
        assert!(cq.poller_clock().is_some(), "polled, not armed");
        cq.arm(false);
        assert!(cq.poller_clock().is_none(), "armed");
        cq.push(c(1));
        assert!(!cq.lock_q().armed());
        assert!(cq.poller_clock().is_some(), "the notification disarmed it");
    }

    /// A poll that finds the CQ empty looks at the input of its leased kernel-socket QPs with
    /// one `poll` when there are at least two, and tells each serve whether its `recv` would
    /// find nothing; one such QP, a poll that found completions, or a QP that offers no
    /// descriptor (not leased, or a raw transport's) is served as ever.
    #[test]
    fn an_empty_poll_looks_at_several_streams_input_at_once() {
        use std::io::Write;
        use std::os::fd::AsRawFd;
        let (busy, mut busy_peer) = std::os::unix::net::UnixStream::pair().unwrap();
        let (idle, _idle_peer) = std::os::unix::net::UnixStream::pair().unwrap();
        busy_peer.write_all(b"x").unwrap();
        let quiet_of = |qps: &[Arc<Fake>]| qps.iter().map(|q| *q.last_quiet.lock()).collect::<Vec<_>>();

        let (cq, qps) = cq_probing(&[(false, Some(busy.as_raw_fd())), (false, Some(idle.as_raw_fd())), (false, None)]);
        cq.polling(true);
        assert_eq!(quiet_of(&qps), [Some(false), Some(true), Some(false)], "input waits on the first only; the third was not looked at");
        cq.polling(false);
        cq.renew_at.store(0, Ordering::Relaxed);
        cq.polling(false);
        assert_eq!(quiet_of(&qps), [Some(false); 3], "a poll that found completions drives without looking");

        let (cq, qps) = cq_probing(&[(false, Some(idle.as_raw_fd())), (false, None)]);
        cq.polling(true);
        assert_eq!(quiet_of(&qps), [Some(false); 2], "one descriptor to look at: its recv is as cheap as the look");
    }

    /// Polls that keep finding the CQ empty claim a QP whose lone Write's completion waits for
    /// the answer after a short streak (the poller reads the answer itself), where they would
    /// otherwise only renew; arming the CQ ends the wait (nobody polls for it any more).
    #[test]
    fn a_poller_that_keeps_waiting_for_an_answer_claims_and_arming_ends_the_wait() {
        let (cq, qps) = cq_with(&[false]);
        cq.polling(true);
        assert_eq!(*qps[0].last_poller.lock(), Some(Poller::Renews), "the first empty poll only renews");
        qps[0].awaits.store(true, Ordering::Relaxed);
        // (A poll that finds completions ends the run of empty ones the general claim counts.)
        cq.polling(false);
        cq.polling(true);
        assert_eq!(*qps[0].last_poller.lock(), Some(Poller::Renews), "a streak's first poll does not claim");
        std::thread::sleep(std::time::Duration::from_micros(2 * super::super::lease::CLAIM_AWAITING_ANSWER_US));
        cq.polling(true);
        assert_eq!(*qps[0].last_poller.lock(), Some(Poller::Claims), "a poller that keeps waiting claims");
        // A poll that returned completions ends the run (the next empty one starts anew).
        cq.reaped();
        cq.polling(false);
        cq.polling(true);
        assert_eq!(*qps[0].last_poller.lock(), Some(Poller::Renews));
        cq.arm(false);
        assert_eq!(qps[0].handed_back.load(Ordering::Relaxed), 1);
        assert!(cq.poller_clock().is_none(), "an armed CQ has no poller to wait for");
    }

    /// A poll can do nothing (and gives its CPU away) only when every QP it drives has a full
    /// stream and nothing was completed: one QP that can still send, a completion to reap, or
    /// no QP at all keep it polling.
    #[test]
    fn a_poll_is_idle_only_when_every_stream_is_full_and_nothing_completed() {
        let (cq, qps) = cq_with(&[true, true]);
        assert!(cq.drive(Poller::Renews, 1, 0, true), "both streams full, nothing completed");
        assert!(qps.iter().all(|q| q.driven.load(Ordering::Relaxed) == 1), "every QP is driven");
        cq.push(c(1));
        assert!(!cq.drive(Poller::Renews, 2, 0, true), "a completion waits to be reaped");
        let (cq, _qps) = cq_with(&[true, false]);
        assert!(!cq.drive(Poller::Renews, 1, 0, true), "one stream can still take bytes");
        let (cq, _qps) = cq_with(&[]);
        assert!(!cq.drive(Poller::Renews, 1, 0, true), "no QP: nothing says the poll is idle");
    }

    /// An empty poll serves, besides the CQ's own QPs, the leased QPs of other CQs whose lease
    /// was last renewed before this CQ's previous poll — their poller moved on to this CQ
    /// (perftest's client, from its data CQ to the handshake's): placement of what arrives for
    /// them, and doorbells left waiting, do not wait for the lease to lapse.
    #[test]
    fn an_empty_poll_serves_the_leases_its_poller_left_behind() {
        let (cq, qps) = cq_with(&[false]);
        cq.polling(true);
        let first = *qps[0].aside.lock();
        assert_eq!(first.map(|a| a.0), Some(0), "a CQ's first poll has no previous poll: it serves no other lease");
        let before = cq.polled_at.load(Ordering::Relaxed);
        std::thread::sleep(std::time::Duration::from_millis(2));
        cq.polling(true);
        let (renewed_before, own) = qps[0].aside.lock().expect("the second empty poll served no other lease");
        assert_eq!(renewed_before, before, "leases are judged against the CQ's previous poll");
        assert!(own, "the CQ's own QPs are driven, not served aside");
        cq.push(c(1));
        *qps[0].aside.lock() = None;
        cq.polling(false);
        assert!(qps[0].aside.lock().map_or(true, |a| a.0 == 0), "a poll that finds completions serves no other lease");
    }
}
