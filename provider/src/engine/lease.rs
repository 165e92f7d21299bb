//! Who drives a QP's stream (issue 9's ownership lease): the progress thread, or an
//! application thread that polls the QP's CQ.
//!
//! An application that polls an empty CQ serves the CQ's QPs itself (`CqObj::drive`). While
//! it does, waking the progress thread for every arrival only makes two threads contend for
//! one stream — on a machine with few cores the progress thread preempts the very thread that
//! would have served the data. So a thread that keeps polling *claims* the QP for
//! [`LEASE_US`]: its polls have found the CQ empty for [`CLAIM_AFTER_US`] in a row, or it posts
//! a second WR since its last poll (a stream of posts, whose doorbells then wait for that
//! poller's next poll: `Qp::defer_doorbell`). A single poll never claims: `ib_write_lat` polls
//! once for its send completion and then spins on memory. The claimed QP's socket leaves the
//! progress thread's epoll set (one `epoll_ctl`, on the claim only), and later polls
//! renew the lease with one clock read and one atomic store. The lease is handed back
//! when the application arms the CQ's completion channel (`ibv_req_notify_cq`: it is about to
//! sleep), when the stream goes, or when the application stops polling: the progress thread
//! looks at a lease when it is due, takes the QP back if it was not renewed, and serves what
//! arrived meanwhile (re-arming the socket raises its pending readiness at once).
//!
//! No poll is ever needed for data to be served: a QP nobody polls is never leased, so a target
//! that spins on memory gets its data from the progress thread as soon as it arrives.
//!
//! A thread asleep in `ibv_get_cq_event` (the launcher's `read()` of a completion channel,
//! `ffi::read_channel`) is woken by the arrivals on the streams of the channel's QPs and
//! serves them itself (`events::EventQueue::wait_fd`). While it sleeps the progress thread need
//! not hear of them too: each such sleep *holds* the QP ([`Lease::reader_sleeps`]: the socket
//! leaves the progress thread's set, and no check is due), and the last sleeper to wake hands
//! it back ([`Lease::reader_woke`]). Both threads used to wake for every arrival and race for
//! the stream; the progress thread mostly won and then woke the reader through the channel —
//! two wake-ups in a row (`ib_send_lat -e`: 439 of 3000 messages served by the waiting
//! thread, 36.2 µs typical half round trip; with the hold 2998 of 3000, 29.2 µs). A sleeper
//! that never wakes (its thread cancelled in `ibv_get_cq_event`) is forgotten at the next
//! hand-back ([`Lease::hand_back`] asks whether each sleeper still exists).
//!
//! Out of the set, not merely disarmed: a socket in an epoll set has the set's callback on its
//! wait queue, and every arrival (and every acknowledgement) runs it inside the peer's
//! `sendmsg` (loopback) or the softirq, under the socket's lock — while the poller's `recv`
//! waits for that lock. A busy-polling TCP ping-pong on loopback with a second thread asleep
//! in `epoll_wait` on the socket for `EPOLLOUT | EPOLLET` only: 4.07–4.31 µs half round trip
//! against 3.90–4.16 with none (5 alternating pairs). The set takes the socket back for room
//! to send only while a leased stream is full ([`Lease::track_room`]): the poller may give its
//! CPU away then, and the progress thread sends the bytes when the socket takes them.
//!
//! The checks of a lease that keeps being renewed back off from [`LEASE_US`] to
//! [`CHECK_MAX_US`]: a thread that stops polling without arming a channel leaves its QP's
//! arrivals waiting at most that long. The progress thread sleeps until the next check on a
//! timer of its epoll set (the lease alarm), which the pollers themselves push on while every
//! lease is fresh ([`Lease::alarm_view`], [`alarm_ahead`]; at most every
//! [`ALARM_PUSH_EVERY_US`], a `timerfd_settime` by whichever poller comes first), as does a
//! poller inside a long transmit pass between its `sendmsg`s (`datapath::Holder`: an MPI
//! rank's poll that answers a window of 1 MiB Read Requests sends for milliseconds): a thread
//! that polls without pause (an SPDK reactor, an MPI rank) costs the progress thread no
//! wake-up at all. A check that woke it instead took 1,000 wake-ups a second, each preempting
//! a polling thread on a machine whose CPUs they all hold: Open MPI's 1 MiB stream over
//! `ofi_rxm` (two ranks on two vCPUs) had the sending rank's progress thread at 11–17 % of a
//! CPU and 850–1,100 involuntary switches a second of each rank, against 3 % and 50–100 with
//! the alarm pushed away; the `ib_read_lat` requester's progress thread, 945 wake-ups a second
//! against none.
#![forbid(unsafe_code)]

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use parking_lot::Mutex;

/// How long one poll keeps the QP (engine µs).
pub const LEASE_US: u64 = 50;
/// How long a thread must have found its CQ empty before its polls claim the QP: a thread
/// that polls once and then waits by other means never holds it.
pub const CLAIM_AFTER_US: u64 = 20;
/// How long a thread must have found its CQ empty, while one of its QPs' lone RDMA Write waits
/// for the peer's answer (`datapath::answer`), before its polls claim the QP: the thread polls
/// for that completion, and reads the answer itself once it holds the QP. A thread that polls
/// once and then spins on memory — the completion released in that poll, or not — never holds
/// it.
pub const CLAIM_AWAITING_ANSWER_US: u64 = 2;
/// The longest pause between two checks of a lease that keeps being renewed.
pub const CHECK_MAX_US: u64 = 1_000;
/// How often at most a poller pushes the lease alarm on (engine µs): a quarter of the
/// longest check pause, so that a thread that polls at all in that time keeps it from going
/// off.
pub const ALARM_PUSH_EVERY_US: u64 = CHECK_MAX_US / 4;
/// How recently a lease must have been renewed for a push to count it fresh (engine µs):
/// longer than one lease, so that a poller whose CQ holds several QPs, or that spends a while
/// inside one (a 1 MiB `sendmsg`), still pushes; a lease its poller left is then handed back
/// at most this much later than [`CHECK_MAX_US`] after its last renewal.
pub const ALARM_FRESH_US: u64 = CHECK_MAX_US / 2;

/// How a lease stands for a push of the lease alarm ([`Lease::alarm_view`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AlarmView {
    /// Not leased: nothing to check.
    Free,
    /// Renewed within [`ALARM_FRESH_US`] of `now`, held since `since` (engine µs).
    Fresh { since: u64 },
    /// Not renewed for longer (or held by a thread asleep on a channel, whose renewals this
    /// view does not see): its poller may have left it, so the alarm must not be pushed.
    Lapsed,
}

/// How far ahead (engine µs) a push sets the lease alarm when every lease is fresh and the
/// youngest was claimed at `since`: as far as it has been held, between [`LEASE_US`] and
/// [`CHECK_MAX_US`] — the same pause the checks' back-off would have reached, so that a
/// thread that polled briefly and stopped hands its QP back as soon as before.
pub fn alarm_ahead(now: u64, since: u64) -> u64 {
    now.saturating_sub(since).clamp(LEASE_US, CHECK_MAX_US)
}

/// What the progress thread found when a lease was due.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Check {
    /// Still held (renewed since): look again at this time (engine µs).
    HeldUntil(u64),
    /// Held by a thread asleep on a completion channel: nothing to look at until it wakes.
    Asleep,
    /// Not leased (any more): the progress thread drives the stream.
    Free,
}

/// What must change in the progress thread's epoll set after a lease transition: the
/// socket `fd` leaves the set (`Disarm`), is watched for room to send while leased (`Room`,
/// `on`: its stream is full; off: it leaves the set again), comes back (`Rearm`), or a leased
/// stream went away (`Forget`: the lease ends with no socket to re-arm).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arming {
    Disarm(i32),
    /// As `Disarm`, for a thread asleep on a completion channel: no check is due (the reader
    /// hands the QP back when it wakes).
    DisarmWhileAsleep(i32),
    Room { fd: i32, on: bool },
    Rearm(i32),
    Forget,
    /// The progress thread reads the stream of a free QP itself in a spin window: its socket
    /// leaves the set meanwhile (`SpinOut`) and comes back before the thread sleeps (`SpinIn`,
    /// reporting what arrived meanwhile at once). See `spin`.
    SpinOut(i32),
    SpinIn(i32),
}

#[derive(Debug, Default)]
struct State {
    /// The stream's socket while the progress thread watches it.
    fd: Option<i32>,
    leased: bool,
    /// The threads (ids) asleep on a completion channel that serve this QP (see the module's
    /// doc), once per sleep.
    sleepers: smallvec::SmallVec<[i32; 2]>,
    /// A leased stream's socket is watched for room to send (see `Arming::Room`).
    room: bool,
    /// A free stream's socket is out of the set while the progress thread spins on it (see
    /// `Arming::SpinOut`).
    spun_out: bool,
    /// Pause before the next check (back-off while the lease keeps being renewed).
    check_every: u64,
}

/// A QP's lease. Transitions (claim, hand-back, attach, detach) run under a small lock, so the
/// epoll changes they imply happen in the order of the transitions; renewal is lock-free.
#[derive(Debug, Default)]
pub struct Lease {
    /// Until when the lease is held (engine µs); renewed by every poll.
    until: AtomicU64,
    /// When a poller last claimed it (engine µs).
    claimed_at: AtomicU64,
    /// Fast view of `State::leased`.
    leased: AtomicBool,
    state: Mutex<State>,
}

impl Lease {
    /// Whether an application thread holds the QP now.
    pub fn held(&self) -> bool {
        self.leased.load(Ordering::Acquire)
    }

    /// Whether a thread asleep on a completion channel holds the QP ([`Lease::reader_sleeps`]).
    pub fn sleeping(&self) -> bool {
        self.held() && !self.state.lock().sleepers.is_empty()
    }

    /// When the lease was last renewed (engine µs; 0 if never).
    pub fn renewed_at(&self) -> u64 {
        self.until.load(Ordering::Acquire).saturating_sub(LEASE_US)
    }

    /// A poll found the CQ empty at `now`: the lease is renewed. Returns whether the QP must be
    /// claimed first ([`Lease::claim`]).
    pub fn renew(&self, now: u64) -> bool {
        self.until.store(now + LEASE_US, Ordering::Release);
        !self.leased.load(Ordering::Acquire)
    }

    /// Claims the QP for the polling thread. `Some(Disarm(fd))` when it changed hands (the
    /// caller takes the socket out of the progress thread's interest while `apply` runs under
    /// the lease's lock, and makes the progress thread look at the lease when it is due).
    pub fn claim(&self, apply: impl FnOnce(Arming)) -> bool {
        let mut s = self.state.lock();
        let Some(fd) = s.fd.filter(|_| !s.leased) else { return false };
        s.leased = true;
        // Out of the set already if the progress thread spun on it: the lease keeps it out,
        // and the end of the spin leaves it there.
        s.spun_out = false;
        s.check_every = LEASE_US;
        // The claim follows the renewal that asked for it (`renew`).
        self.claimed_at.store(self.renewed_at(), Ordering::Relaxed);
        self.leased.store(true, Ordering::Release);
        apply(Arming::Disarm(fd));
        true
    }

    /// How the lease stands at `now` for a push of the lease alarm (see the module's doc),
    /// read without its lock: a lease taken or let go meanwhile is seen either way, and the
    /// progress thread's own checks follow every transition (a claim makes it check at once).
    pub fn alarm_view(&self, now: u64) -> AlarmView {
        if !self.held() {
            return AlarmView::Free;
        }
        if self.renewed_at() + ALARM_FRESH_US <= now {
            return AlarmView::Lapsed;
        }
        AlarmView::Fresh { since: self.claimed_at.load(Ordering::Relaxed) }
    }

    /// The progress thread's look at a due lease (at `now`): kept if renewed since, or if an
    /// application thread is inside the QP right now (`in_use`), else handed back
    /// (`apply(Rearm(fd))` under the lock).
    ///
    /// A poll renews the lease when it starts and then serves the stream until the socket is
    /// empty (or up to 1 MiB: `qp::APP_RX_BUDGETS`): receiving a 1 MiB Read Response that is
    /// still arriving takes longer than a lease. Handed back in the middle of that poll, the stream went back to the progress
    /// thread's set and every later segment woke it — to find the QP held by the poll — on
    /// the CPU the poller needed (Open MPI's 1 MiB stream over libfabric's `ofi_rxm`, whose
    /// receiver Reads each message: 22 K wake-ups/s of the receiver's progress thread, each
    /// preempting the receiving rank). A poll that has not returned has not stopped polling.
    pub fn check(&self, now: u64, in_use: bool, apply: impl FnOnce(Arming)) -> Check {
        let mut s = self.state.lock();
        if !s.leased {
            return Check::Free;
        }
        if !s.sleepers.is_empty() {
            return Check::Asleep;
        }
        let until = match self.until.load(Ordering::Acquire) {
            t if t <= now && in_use => now + LEASE_US,
            t => t,
        };
        if until > now {
            // Renewed: back off, so that a thread that polls for long costs few wake-ups.
            let at = until.max(now + s.check_every);
            s.check_every = (s.check_every * 2).min(CHECK_MAX_US);
            return Check::HeldUntil(at);
        }
        self.release_locked(&mut s, apply);
        Check::Free
    }

    /// The application is about to sleep on a completion channel: the progress thread takes
    /// the QP back at once — unless a thread asleep on a channel holds it (that one serves the
    /// QP's arrivals). Sleepers that no longer exist (`alive`: a thread cancelled while
    /// asleep in `ibv_get_cq_event` never woke to hand the QP back) are forgotten first.
    pub fn hand_back(&self, alive: impl Fn(i32) -> bool, apply: impl FnOnce(Arming)) -> bool {
        let mut s = self.state.lock();
        if !s.leased {
            return false;
        }
        if !s.sleepers.is_empty() {
            s.sleepers.retain(|t| alive(*t));
            if !s.sleepers.is_empty() {
                return false;
            }
        }
        self.until.store(0, Ordering::Release);
        self.release_locked(&mut s, apply);
        true
    }

    /// Thread `tid` goes to sleep on a completion channel whose reader serves this QP: the QP
    /// is held until the last such thread wakes (`apply(DisarmWhileAsleep(fd))` if it was
    /// free; a poller's lease it finds is kept, and ends with the sleep) — unless the stream
    /// cannot be held by a sleeper (`holdable(fd)`: a raw transport's, whose frames only the
    /// progress thread's turns would receive meanwhile).
    pub fn reader_sleeps(&self, tid: i32, holdable: impl FnOnce(i32) -> bool, apply: impl FnOnce(Arming)) {
        let mut s = self.state.lock();
        let Some(fd) = s.fd.filter(|&fd| holdable(fd)) else { return };
        s.sleepers.push(tid);
        if s.leased {
            return;
        }
        s.spun_out = false;
        s.leased = true;
        self.leased.store(true, Ordering::Release);
        apply(Arming::DisarmWhileAsleep(fd));
    }

    /// Thread `tid`, which slept on a completion channel ([`Lease::reader_sleeps`]), goes back
    /// to the application: the last sleeper hands the QP back (`apply(Rearm(fd))`).
    pub fn reader_woke(&self, tid: i32, apply: impl FnOnce(Arming)) {
        let mut s = self.state.lock();
        let Some(i) = s.sleepers.iter().position(|&t| t == tid) else { return };
        s.sleepers.swap_remove(i);
        if s.sleepers.is_empty() && s.leased {
            self.release_locked(&mut s, apply);
        }
    }

    /// A leased stream's socket is watched for room to send exactly while its stream is full
    /// (`full`, read under the lease's lock, so that a stream found full after a look that
    /// found it not is watched again). No change for a QP that is not leased: an armed socket
    /// reports room anyway.
    pub fn track_room(&self, full: &AtomicBool, apply: impl FnOnce(Arming)) {
        let mut s = self.state.lock();
        let on = full.load(Ordering::Acquire);
        let Some(fd) = s.fd.filter(|_| s.leased && s.room != on) else { return };
        s.room = on;
        apply(Arming::Room { fd, on });
    }

    fn release_locked(&self, s: &mut State, apply: impl FnOnce(Arming)) {
        s.leased = false;
        s.room = false;
        self.leased.store(false, Ordering::Release);
        if let Some(fd) = s.fd {
            apply(Arming::Rearm(fd));
        }
    }

    /// The progress thread watches the stream's socket `fd` (armed) from now on.
    pub fn attach(&self, fd: i32) {
        let mut s = self.state.lock();
        s.fd = Some(fd);
        s.leased = false;
        self.leased.store(false, Ordering::Release);
    }

    /// The progress thread is about to read this free QP's stream itself, poll after poll, in
    /// a spin window (`spin`): its socket leaves the set (`apply(SpinOut(fd))`), so that an
    /// arrival runs no epoll callback inside the peer's `sendmsg` (loopback) under the socket
    /// lock the spinning `recv` waits for. Returns whether it did (not for a leased QP, whose
    /// socket is out already, nor one without a socket).
    pub fn spin_out(&self, apply: impl FnOnce(Arming)) -> bool {
        let mut s = self.state.lock();
        let Some(fd) = s.fd.filter(|_| !s.leased && !s.spun_out) else { return false };
        s.spun_out = true;
        apply(Arming::SpinOut(fd));
        true
    }

    /// The spin on this QP's stream ends (the progress thread is about to sleep, or spins on
    /// another): its socket comes back to the set, reporting at once what arrived meanwhile
    /// (`apply(SpinIn(fd))`) — unless a claim or a sleeping reader took the QP since (their
    /// lease keeps the socket out) or the stream went.
    pub fn spin_in(&self, apply: impl FnOnce(Arming)) {
        let mut s = self.state.lock();
        if !std::mem::take(&mut s.spun_out) {
            return;
        }
        if let Some(fd) = s.fd.filter(|_| !s.leased) {
            apply(Arming::SpinIn(fd));
        }
    }

    /// The stream's socket leaves the progress thread: the lease ends (`apply(Forget)` if it
    /// was held) and no later hand-back can touch the descriptor, which may be closed and its
    /// number reused.
    pub fn detach(&self, apply: impl FnOnce(Arming)) {
        let mut s = self.state.lock();
        s.fd = None;
        s.room = false;
        s.spun_out = false;
        s.sleepers.clear();
        if s.leased {
            s.leased = false;
            self.leased.store(false, Ordering::Release);
            apply(Arming::Forget);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use std::cell::RefCell;

    /// A spin takes a free QP's socket out of the set and puts it back; a claim meanwhile keeps
    /// it out (the lease's), and the end of the spin leaves it there; a leased QP's socket is
    /// never spun out.
    #[test]
    fn a_spin_takes_a_free_socket_out_and_a_claim_keeps_it_out() {
        let log = RefCell::new(Vec::new());
        let push = |a| log.borrow_mut().push(a);
        let l = Lease::default();
        assert!(!l.spin_out(push), "no socket");
        l.attach(7);
        assert!(l.spin_out(push));
        assert!(!l.spin_out(push), "out already");
        l.spin_in(push);
        l.spin_in(push);
        assert_eq!(*log.borrow(), vec![Arming::SpinOut(7), Arming::SpinIn(7)]);
        log.borrow_mut().clear();
        // Claimed while spun out: the claim's Disarm stands, the spin's end adds nothing.
        assert!(l.spin_out(push));
        assert!(l.renew(100));
        assert!(l.claim(push));
        l.spin_in(push);
        assert!(!l.spin_out(push), "a leased socket is out for the lease");
        assert_eq!(*log.borrow(), vec![Arming::SpinOut(7), Arming::Disarm(7)]);
        log.borrow_mut().clear();
        // Handed back, then spun out, then the stream goes: nothing comes back.
        assert_eq!(l.check(1_000_000, false, push), Check::Free);
        assert!(l.spin_out(push));
        l.detach(push);
        l.spin_in(push);
        assert_eq!(*log.borrow(), vec![Arming::Rearm(7), Arming::SpinOut(7)]);
    }

    /// A push of the lease alarm sees a lease fresh only while it is renewed, held since its
    /// claim; a lapsed one stops the push, a free one does not count.
    #[test]
    fn the_alarm_sees_fresh_lapsed_and_free_leases() {
        let l = Lease::default();
        l.attach(7);
        assert_eq!(l.alarm_view(100), AlarmView::Free);
        assert!(l.renew(100));
        assert!(l.claim(|_| {}));
        assert_eq!(l.alarm_view(120), AlarmView::Fresh { since: 100 });
        // Renewals keep it fresh and keep the claim's time, a while past the lease's end.
        l.renew(400);
        assert_eq!(l.alarm_view(440), AlarmView::Fresh { since: 100 });
        assert_eq!(l.alarm_view(400 + ALARM_FRESH_US - 1), AlarmView::Fresh { since: 100 });
        assert_eq!(l.alarm_view(400 + ALARM_FRESH_US), AlarmView::Lapsed);
        // Handed back: free again.
        assert_eq!(l.check(400 + LEASE_US, false, |_| {}), Check::Free);
        assert_eq!(l.alarm_view(500), AlarmView::Free);
        // A sleeper's hold is not renewed by polls: never pushed past.
        l.reader_sleeps(1, |_| true, |_| {});
        assert_eq!(l.alarm_view(400 + ALARM_FRESH_US), AlarmView::Lapsed);
    }

    /// The alarm is pushed as far ahead as the youngest lease has been held, within the
    /// checks' own bounds.
    #[test]
    fn the_alarm_goes_as_far_ahead_as_the_checks_back_off() {
        assert_eq!(alarm_ahead(1_000, 1_000), LEASE_US);
        assert_eq!(alarm_ahead(1_000, 990), LEASE_US);
        assert_eq!(alarm_ahead(1_000, 700), 300);
        assert_eq!(alarm_ahead(10_000, 1_000), CHECK_MAX_US);
        // A claim time from the future (a racing claim) is no pause at all.
        assert_eq!(alarm_ahead(1_000, 2_000), LEASE_US);
        // A thread that polls at all between two pushes keeps a long-held lease's alarm away.
        assert!(ALARM_PUSH_EVERY_US < alarm_ahead(1_000_000, 0));
    }

    #[test]
    fn no_claim_without_a_stream() {
        let l = Lease::default();
        assert!(l.renew(10));
        assert!(!l.claim(|_| panic!("nothing to disarm")));
        assert!(!l.held());
    }

    #[test]
    fn claim_renew_and_expire() {
        let log = RefCell::new(Vec::new());
        let l = Lease::default();
        l.attach(7);
        assert!(l.renew(100));
        assert!(l.claim(|a| log.borrow_mut().push(a)));
        assert!(l.held());
        // A second claim changes nothing.
        assert!(!l.claim(|a| log.borrow_mut().push(a)));
        // Renewed: no claim needed.
        assert!(!l.renew(120));
        assert_eq!(l.check(150, false, |a| log.borrow_mut().push(a)), Check::HeldUntil(200));
        // Not renewed past its end: handed back.
        assert_eq!(l.check(171, false, |a| log.borrow_mut().push(a)), Check::Free);
        assert!(!l.held());
        assert_eq!(*log.borrow(), vec![Arming::Disarm(7), Arming::Rearm(7)]);
        // Free stays free.
        assert_eq!(l.check(500, false, |_| panic!("no change")), Check::Free);
    }

    #[test]
    fn checks_back_off_while_renewed() {
        let l = Lease::default();
        l.attach(3);
        l.renew(0);
        l.claim(|_| {});
        let mut now = 0;
        let mut gaps = Vec::new();
        for _ in 0..8 {
            l.renew(now);
            let Check::HeldUntil(at) = l.check(now, false, |_| {}) else { panic!("renewed lease released") };
            gaps.push(at - now);
            now = at;
        }
        assert_eq!(gaps, vec![50, 100, 200, 400, 800, 1000, 1000, 1000]);
        // Claimed anew after a release, the checks start short again.
        assert_eq!(l.check(now + CHECK_MAX_US, false, |_| {}), Check::Free);
        l.renew(now);
        l.claim(|_| {});
        l.renew(now + 10);
        assert_eq!(l.check(now + 10, false, |_| {}), Check::HeldUntil(now + 60));
    }

    /// A poll that is still serving the stream (it renewed when it started, a lease ago) has
    /// not stopped polling: the lease is kept; once the poll returned and none followed, it
    /// lapses as ever.
    #[test]
    fn a_poll_still_serving_keeps_the_lease() {
        let (l, log) = claimed(9, 100);
        assert_eq!(l.check(400, true, |a| log.borrow_mut().push(a)), Check::HeldUntil(450));
        assert!(l.held());
        assert_eq!(l.check(450, false, |a| log.borrow_mut().push(a)), Check::Free);
        assert_eq!(*log.borrow(), vec![Arming::Disarm(9), Arming::Rearm(9)]);
    }

    /// A lease on socket `fd` claimed by a poll at `now`, and the log its transitions write.
    fn claimed(fd: i32, now: u64) -> (Lease, RefCell<Vec<Arming>>) {
        let log = RefCell::new(Vec::new());
        let l = Lease::default();
        l.attach(fd);
        l.renew(now);
        l.claim(|a| log.borrow_mut().push(a));
        (l, log)
    }

    #[test]
    fn hand_back_rearms_at_once() {
        let (l, log) = claimed(5, 0);
        assert!(l.hand_back(|_| true, |a| log.borrow_mut().push(a)));
        assert!(!l.held());
        assert!(!l.hand_back(|_| true, |_| panic!("not leased")));
        assert_eq!(*log.borrow(), vec![Arming::Disarm(5), Arming::Rearm(5)]);
    }

    #[test]
    fn detach_forgets_the_socket() {
        let l = Lease::default();
        l.attach(5);
        l.renew(0);
        l.claim(|_| {});
        let log = RefCell::new(Vec::new());
        l.detach(|a| log.borrow_mut().push(a));
        assert_eq!(*log.borrow(), vec![Arming::Forget]);
        assert!(!l.held());
        assert!(!l.hand_back(|_| true, |_| panic!("a detached socket is never re-armed")));
        assert_eq!(l.check(1_000_000, false, |_| panic!("a detached socket is never re-armed")), Check::Free);
        assert!(!l.claim(|_| panic!("nothing to claim")));
        l.track_room(&AtomicBool::new(true), |_| panic!("a detached socket is never watched"));
    }

    /// A thread asleep on a channel holds the QP with no check due, keeps it from a hand-back
    /// (`ibv_req_notify_cq` of another thread), and the last sleeper to wake hands it back.
    #[test]
    fn sleeping_readers_hold_the_qp_until_the_last_wakes() {
        let log = RefCell::new(Vec::new());
        let push = |a| log.borrow_mut().push(a);
        let l = Lease::default();
        l.reader_sleeps(1, |_| true, |_| panic!("no stream: nothing to hold"));
        l.attach(6);
        l.reader_sleeps(1, |_| true, push);
        l.reader_sleeps(2, |_| true, |_| panic!("held already"));
        assert!(l.held());
        assert_eq!(l.check(1_000_000, false, |_| panic!("a sleeper's hold is not checked")), Check::Asleep);
        assert!(!l.hand_back(|_| true, |_| panic!("sleepers serve the QP")));
        l.reader_woke(2, |_| panic!("thread 1 still sleeps"));
        l.reader_woke(3, |_| panic!("thread 3 never slept"));
        l.reader_woke(1, push);
        assert!(!l.held());
        // A poller's lease a reader finds is kept while it sleeps and ends with the sleep.
        l.renew(0);
        l.claim(push);
        l.reader_sleeps(1, |_| true, |_| panic!("held already"));
        assert_eq!(l.check(1_000_000, false, |_| panic!("kept")), Check::Asleep);
        l.reader_woke(1, push);
        assert!(!l.held());
        assert_eq!(*log.borrow(), vec![Arming::DisarmWhileAsleep(6), Arming::Rearm(6), Arming::Disarm(6), Arming::Rearm(6)]);
        // A stream a sleeper cannot hold stays with the progress thread, and no sleep counts.
        l.reader_sleeps(1, |fd| fd != 6, |_| panic!("an unholdable stream was held"));
        assert!(!l.held());
        l.renew(10);
        l.claim(|_| {});
        assert!(l.hand_back(|_| true, |_| {}), "a sleep that held nothing kept a poller's lease from its hand-back");
    }

    /// A sleeper that is gone (cancelled in `ibv_get_cq_event`, it never woke) does not keep
    /// the QP from the progress thread: the next hand-back forgets it.
    #[test]
    fn a_hand_back_forgets_sleepers_that_are_gone() {
        let log = RefCell::new(Vec::new());
        let l = Lease::default();
        l.attach(8);
        l.reader_sleeps(41, |_| true, |a| log.borrow_mut().push(a));
        l.reader_sleeps(42, |_| true, |_| panic!("held already"));
        assert!(!l.hand_back(|t| t == 42, |_| panic!("thread 42 still sleeps")));
        l.reader_woke(42, |a| log.borrow_mut().push(a));
        assert!(!l.held(), "the last live sleeper woke");
        l.reader_sleeps(43, |_| true, |a| log.borrow_mut().push(a));
        assert!(l.hand_back(|_| false, |a| log.borrow_mut().push(a)), "a gone sleeper kept the QP");
        assert!(!l.held());
        assert_eq!(*log.borrow(), vec![Arming::DisarmWhileAsleep(8), Arming::Rearm(8), Arming::DisarmWhileAsleep(8), Arming::Rearm(8)]);
    }

    /// A leased socket is out of the progress thread's set but for room to send, and only
    /// while its stream is full: each change once, none for a socket that is not leased.
    #[test]
    fn room_is_watched_while_a_leased_stream_is_full() {
        let log = RefCell::new(Vec::new());
        let push = |a| log.borrow_mut().push(a);
        let (full, not_full) = (AtomicBool::new(true), AtomicBool::new(false));
        let l = Lease::default();
        l.attach(4);
        l.track_room(&full, |_| panic!("an armed socket reports room anyway"));
        l.renew(0);
        l.claim(push);
        l.track_room(&not_full, |_| panic!("already out of the set"));
        l.track_room(&full, push);
        l.track_room(&full, |_| panic!("already watched"));
        l.track_room(&not_full, push);
        l.track_room(&full, push);
        // Handed back with room watched: re-armed in full, and a new claim starts without.
        assert!(l.hand_back(|_| true, push));
        l.renew(10);
        l.claim(push);
        l.track_room(&full, push);
        l.detach(push);
        assert_eq!(
            *log.borrow(),
            vec![
                Arming::Disarm(4),
                Arming::Room { fd: 4, on: true },
                Arming::Room { fd: 4, on: false },
                Arming::Room { fd: 4, on: true },
                Arming::Rearm(4),
                Arming::Disarm(4),
                Arming::Room { fd: 4, on: true },
                Arming::Forget,
            ]
        );
    }
}
