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
//! Out of the set, not merely disarmed: a socket in an epoll set has the set's callback on its
//! wait queue, and every arrival (and every acknowledgement) runs it inside the peer's
//! `sendmsg` (loopback) or the softirq, under the socket's lock — while the poller's `recv`
//! waits for that lock. A busy-polling TCP ping-pong on loopback with a second thread asleep
//! in `epoll_wait` on the socket for `EPOLLOUT | EPOLLET` only: 4.07–4.31 µs half round trip
//! against 3.90–4.16 with none (5 alternating pairs). The set takes the socket back for room
//! to send only while a leased stream is full ([`Lease::track_room`]): the poller may give its
//! CPU away then, and the progress thread sends the bytes when the socket takes them.
//!
//! The cost of a lease that is kept for long is one progress-thread wake-up per check; the
//! checks of a lease that keeps being renewed back off from [`LEASE_US`] to [`CHECK_MAX_US`],
//! so a thread that polls without pause (an SPDK reactor) costs the progress thread about a
//! thousand wake-ups a second, and a thread that stops polling without arming a channel
//! leaves its QP's arrivals waiting at most that long.
#![forbid(unsafe_code)]

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use parking_lot::Mutex;

/// How long one poll keeps the QP (engine µs).
pub const LEASE_US: u64 = 50;
/// How long a thread must have found its CQ empty before its polls claim the QP: a thread
/// that polls once and then waits by other means never holds it.
pub const CLAIM_AFTER_US: u64 = 20;
/// The longest pause between two checks of a lease that keeps being renewed.
pub const CHECK_MAX_US: u64 = 1_000;

/// What the progress thread found when a lease was due.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Check {
    /// Still held (renewed since): look again at this time (engine µs).
    HeldUntil(u64),
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
    Room { fd: i32, on: bool },
    Rearm(i32),
    Forget,
}

#[derive(Debug, Default)]
struct State {
    /// The stream's socket while the progress thread watches it.
    fd: Option<i32>,
    leased: bool,
    /// A leased stream's socket is watched for room to send (see `Arming::Room`).
    room: bool,
    /// Pause before the next check (back-off while the lease keeps being renewed).
    check_every: u64,
}

/// A QP's lease. Transitions (claim, hand-back, attach, detach) run under a small lock, so the
/// epoll changes they imply happen in the order of the transitions; renewal is lock-free.
#[derive(Debug, Default)]
pub struct Lease {
    /// Until when the lease is held (engine µs); renewed by every poll.
    until: AtomicU64,
    /// Fast view of `State::leased`.
    leased: AtomicBool,
    state: Mutex<State>,
}

impl Lease {
    /// Whether an application thread holds the QP now.
    pub fn held(&self) -> bool {
        self.leased.load(Ordering::Acquire)
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
        s.check_every = LEASE_US;
        self.leased.store(true, Ordering::Release);
        apply(Arming::Disarm(fd));
        true
    }

    /// The progress thread's look at a due lease (at `now`): kept if renewed since, else
    /// handed back (`apply(Rearm(fd))` under the lock).
    pub fn check(&self, now: u64, apply: impl FnOnce(Arming)) -> Check {
        let mut s = self.state.lock();
        if !s.leased {
            return Check::Free;
        }
        let until = self.until.load(Ordering::Acquire);
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
    /// the QP back at once.
    pub fn hand_back(&self, apply: impl FnOnce(Arming)) -> bool {
        let mut s = self.state.lock();
        if !s.leased {
            return false;
        }
        self.until.store(0, Ordering::Release);
        self.release_locked(&mut s, apply);
        true
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

    /// The stream's socket leaves the progress thread: the lease ends (`apply(Forget)` if it
    /// was held) and no later hand-back can touch the descriptor, which may be closed and its
    /// number reused.
    pub fn detach(&self, apply: impl FnOnce(Arming)) {
        let mut s = self.state.lock();
        s.fd = None;
        s.room = false;
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
        assert_eq!(l.check(150, |a| log.borrow_mut().push(a)), Check::HeldUntil(200));
        // Not renewed past its end: handed back.
        assert_eq!(l.check(171, |a| log.borrow_mut().push(a)), Check::Free);
        assert!(!l.held());
        assert_eq!(*log.borrow(), vec![Arming::Disarm(7), Arming::Rearm(7)]);
        // Free stays free.
        assert_eq!(l.check(500, |_| panic!("no change")), Check::Free);
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
            let Check::HeldUntil(at) = l.check(now, |_| {}) else { panic!("renewed lease released") };
            gaps.push(at - now);
            now = at;
        }
        assert_eq!(gaps, vec![50, 100, 200, 400, 800, 1000, 1000, 1000]);
        // Claimed anew after a release, the checks start short again.
        assert_eq!(l.check(now + CHECK_MAX_US, |_| {}), Check::Free);
        l.renew(now);
        l.claim(|_| {});
        l.renew(now + 10);
        assert_eq!(l.check(now + 10, |_| {}), Check::HeldUntil(now + 60));
    }

    #[test]
    fn hand_back_rearms_at_once() {
        let log = RefCell::new(Vec::new());
        let l = Lease::default();
        l.attach(5);
        l.renew(0);
        l.claim(|a| log.borrow_mut().push(a));
        assert!(l.hand_back(|a| log.borrow_mut().push(a)));
        assert!(!l.held());
        assert!(!l.hand_back(|_| panic!("not leased")));
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
        assert!(!l.hand_back(|_| panic!("a detached socket is never re-armed")));
        assert_eq!(l.check(1_000_000, |_| panic!("a detached socket is never re-armed")), Check::Free);
        assert!(!l.claim(|_| panic!("nothing to claim")));
        l.track_room(&AtomicBool::new(true), |_| panic!("a detached socket is never watched"));
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
        assert!(l.hand_back(push));
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
