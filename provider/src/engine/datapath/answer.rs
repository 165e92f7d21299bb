//! A lone RDMA Write's completion waits for the peer's answer (issue 9).
//!
//! `ib_write_lat`, qperf's `rc_rdma_write_poll_lat` and many request/response protocols post
//! one RDMA Write, poll its CQ until its completion, and then wait for the peer's answer by
//! other means — spinning on the memory the peer's Write lands in. Completed as soon as the
//! stream took its bytes (RFC 5040 §7.2 allows that; siw does it), the Write's completion
//! sends the application back to its memory at once, and the answer, arriving a round trip
//! later, finds no thread in the provider: the progress thread must be woken for it, and on a
//! machine whose CPUs those spinning applications hold, that wake-up preempts one of them —
//! two context switches per message, most of `ib_write_lat`'s half round trip
//! (see `spin`, `affinity`).
//!
//! So a successful signaled RDMA Write whose completion a thread polls for, and which is the
//! QP's only work request outstanding, is reported once the stream has carried the peer's
//! next message or [`ANSWER_WAIT_US`] later, whichever is first (a completion may come later
//! than the bytes leave; a hardware RNIC reports one once TCP acknowledged them). Meanwhile a
//! thread that keeps polling for it claims the QP (after `lease::CLAIM_AWAITING_ANSWER_US` of
//! empty polls) and reads the stream itself: the answer is placed by the thread that waits for
//! it, and the Write's completion follows in the same poll. A thread that polls once and then
//! spins on memory claims nothing: the QP held by a thread that no longer polls, the answer
//! waited for the lease to lapse (qperf `rc_rdma_write_poll_lat` went from 11 to 350 µs).
//! Measured on the 2-vCPU development machine, `ib_write_lat -s 8` typical 5.5–6.3 µs against
//! 6.9–11.3 without (6 interleaved pairs, median ratio 0.66; mean 6.1 against 12.2 µs), and
//! 1.36× TCP's busy-poll half round trip in session 15's `uiw-bench` run, against 1.86–1.92×.
//!
//! A wait that ends without an answer — a one-way stream, a peer in the same process, an
//! application that polls for each Write — skips the next waits, doubling up to [`MAX_SKIP`]
//! Writes, so that such traffic pays one delayed completion per many; and it hands the QP back
//! to the progress thread (the application will wait by other means). A completion never waits
//! when no thread polls for it: a CQ armed for a completion event, or one nobody polled for a
//! while, has it at once.
#![forbid(unsafe_code)]

/// The longest a lone Write's completion waits for the peer's answer (engine µs): a few
/// loopback round trips, more than a slow one (a peer preempted once) takes.
pub const ANSWER_WAIT_US: u64 = 200;

/// The most waits skipped in a row after waits that ended without an answer.
pub const MAX_SKIP: u32 = 1024;

/// The answer-wait policy of one stream.
#[derive(Debug, Default)]
pub struct AnswerWait {
    /// The completion at the front of the held ones waits since then (engine µs), for the
    /// count of messages received to move past the second figure.
    waiting: Option<(u64, u64)>,
    /// Waits still to skip.
    skip: u32,
    /// How many the next wait without an answer skips.
    backoff: u32,
    /// A wait ended without an answer since [`AnswerWait::take_gave_up`] was last asked.
    gave_up: bool,
}

impl AnswerWait {
    /// A lone Write completed at `now`, `received` messages having arrived so far: whether its
    /// completion waits for the answer.
    pub fn start(&mut self, now: u64, received: u64) -> bool {
        if self.waiting.is_some() {
            return false;
        }
        if self.skip > 0 {
            self.skip -= 1;
            return false;
        }
        self.waiting = Some((now, received));
        true
    }

    /// Whether the waiting completion (if any) may be reported now. `poller_clock`: the
    /// engine clock of the thread that polls for it (`None`: no thread polls, it goes at
    /// once), asked only while no answer came; `received`: the messages received so far;
    /// `alone`: no other work request was posted since (one was: the application no longer
    /// just waits).
    pub fn release(&mut self, poller_clock: impl FnOnce() -> Option<u64>, received: u64, alone: bool) -> bool {
        let Some((since, seen)) = self.waiting else { return true };
        if received != seen {
            self.backoff = 0;
            self.waiting = None;
            return true;
        }
        let go = match poller_clock() {
            Some(now) if alone && now.saturating_sub(since) < ANSWER_WAIT_US => false,
            Some(now) if now.saturating_sub(since) >= ANSWER_WAIT_US => {
                self.backoff = (self.backoff * 2).clamp(1, MAX_SKIP);
                self.skip = self.backoff;
                self.gave_up = true;
                true
            }
            _ => true,
        };
        if go {
            self.waiting = None;
        }
        go
    }

    /// Whether a completion waits for the answer now.
    pub fn waiting(&self) -> bool {
        self.waiting.is_some()
    }

    /// Whether a wait ended without an answer since the last call (the poller then hands the
    /// QP back: it will wait for the answer by other means).
    pub fn take_gave_up(&mut self) -> bool {
        std::mem::take(&mut self.gave_up)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_answer_releases_the_completion() {
        let mut a = AnswerWait::default();
        assert!(a.release(|| Some(0), 0, true), "nothing waits: release");
        assert!(a.start(100, 7));
        assert!(a.waiting());
        assert!(!a.release(|| Some(150), 7, true), "no answer yet, within the wait");
        assert!(a.release(|| Some(160), 8, true), "a message arrived");
        assert!(!a.waiting());
        assert!(!a.take_gave_up());
        // Answered: the next Write waits too.
        assert!(a.start(200, 8));
    }

    #[test]
    fn a_wait_without_answer_ends_at_the_bound_and_skips_the_next_waits_doubling() {
        let mut a = AnswerWait::default();
        let mut now = 0;
        let mut skipped = Vec::new();
        for _ in 0..4 {
            assert!(a.start(now, 0));
            assert!(!a.release(|| Some(now + ANSWER_WAIT_US - 1), 0, true));
            assert!(a.release(|| Some(now + ANSWER_WAIT_US), 0, true), "the bound");
            assert!(a.take_gave_up());
            assert!(!a.take_gave_up(), "reported once");
            now += 1000;
            let mut k = 0;
            while !a.start(now, 0) {
                k += 1;
            }
            a.release(|| None, 0, true);
            skipped.push(k);
        }
        assert_eq!(skipped, vec![1, 2, 4, 8]);
        // An answered wait starts the back-off over.
        assert!(a.start(now, 0));
        assert!(a.release(|| Some(now + 1), 1, true));
        assert!(a.start(now + 2, 1));
        assert!(a.release(|| Some(now + 2 + ANSWER_WAIT_US), 1, true));
        assert!(!a.start(now + 500, 1), "one wait skipped");
        assert!(a.start(now + 501, 1));
    }

    #[test]
    fn the_back_off_is_bounded() {
        let mut a = AnswerWait::default();
        for i in 0..100_000u64 {
            if a.start(i * 1000, 0) {
                a.release(|| Some(i * 1000 + ANSWER_WAIT_US), 0, true);
            }
        }
        assert_eq!(a.backoff, MAX_SKIP);
    }

    #[test]
    fn no_poller_or_another_request_releases_at_once() {
        let mut a = AnswerWait::default();
        assert!(a.start(0, 0));
        assert!(a.release(|| None, 0, true), "nobody polls for it");
        assert!(!a.take_gave_up(), "not a wait without answer: no back-off");
        assert!(a.start(10, 0));
        assert!(a.release(|| Some(11), 0, false), "the application posted again");
        assert!(!a.take_gave_up());
        assert!(a.start(20, 0), "no back-off either");
    }

    #[test]
    fn one_wait_at_a_time() {
        let mut a = AnswerWait::default();
        assert!(a.start(0, 0));
        assert!(!a.start(1, 0), "a second completion queues behind the first instead");
    }
}
