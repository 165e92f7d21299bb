//! The progress thread's bounded busy-poll after traffic (issue 9).
//!
//! A passive RDMA target never calls into the provider: an RDMA Read's responder, or the
//! target of a Send whose application sleeps on a completion channel (qperf), is served by
//! the progress thread only. Woken by `epoll` for every message, that thread pays a wake-up
//! and two context switches per message — measured on a 2-vCPU guest at 4 µs from the wake-up
//! to running plus 4–5 µs of running that is almost all the switch itself
//! (`finish_task_switch`), against 1–2 µs of actual work — which is most of a message's
//! round trip on loopback.
//!
//! So after a message that the thread *answered* — a turn whose pumps took a message in and
//! sent one out on the same stream, as a Read Request draws its Read Response — the thread may
//! poll its `epoll` set without sleeping (timeout 0) for a window (`UIW_PROGRESS_SPIN_US`,
//! default [`SUGGESTED_WINDOW_US`]; 0 turns it off): the next request of a ping-pong, a Read
//! after a Read, usually comes within it and is served with no wake-up. The window is renewed
//! by answered traffic and ends that long after the last answer: a process whose streams go
//! quiet sleeps again within microseconds, and an idle process takes no periodic wake-ups.
//!
//! Only answers open a window. A one-way stream's target (`ib_write_bw`'s, a Send sink) never
//! waits for its next message by polling: there the window took CPU the senders needed —
//! measured on the 2-vCPU development machine, `ib_write_bw -s 65536` lost 10–40 % in three
//! pairs out of three with a window after every message, which is why the window was once
//! opt-in. Answered traffic only: `ib_read_lat -s 8` 12.4–15.7 µs typical against 25.6–31.0
//! without a window, with 64 KiB `ib_write_bw`/`ib_send_bw`/`ib_read_bw` and 64 B
//! `ib_write_bw` unchanged (alternating pairs, `-D 2`).
//!
//! Within a window, most polls read the stream of the QP that answered last themselves (one
//! `recv`, which finds the next request and reads it in the same call) and only every
//! [`SET_LOOK_EVERY`]th looks at the whole `epoll` set: a poll of the set that finds the
//! request still needs the `recv` after it, and a busy-polling TCP ping-pong on loopback whose
//! sides each wait in `epoll_wait(0)` on their socket before reading it took 4.44–4.45 µs half
//! round trip against 3.98–4.10 with the same sockets in an `epoll` set but read with `recv`
//! (3.81–3.93 with no set at all; 4 interleaved rounds of 60,000). Arrivals on the other
//! streams wait at most that many polls longer.
//!
//! While the thread reads that stream itself, its socket is out of the `epoll` set
//! (`Lease::spin_out`), back before the thread sleeps or turns to another stream (`spin_in`,
//! which reports what arrived meanwhile at once): a socket in a set runs the set's callback
//! for every arrival inside the peer's `sendmsg` on loopback, under the socket lock the
//! spinning `recv` takes. The `ib_read_lat` requester's `sendto` of a Read Request took 4.02–4.06
//! µs (median) with the responder's socket out against 4.24–4.25 with it in, and a C
//! ping-pong over TCP whose responder's socket sat in an `epoll` set was 0.2–0.3 µs slower a
//! round trip than one without (8 interleaved rounds).
//!
//! Spinning pays only on a CPU nobody else wants. Before each poll the thread looks at how
//! many threads are runnable on the machine (`/proc/loadavg`'s running count, itself
//! included) against the CPUs it may use: when that exceeds them, a thread is waiting for a
//! CPU that spinning holds, and on a 2-CPU machine whose two application threads spin
//! (ib_write_lat spins on memory on both sides) a spinning progress thread would take one
//! of their CPUs for the whole window. It then sleeps at once and skips the next windows
//! (doubling, up to [`MAX_SKIP`] messages), so that a contended machine pays one look at
//! the run queue per many messages, not one per message. An uncontended one looks at most
//! every [`CROWD_CHECK_US`]: the look is a system call (more, in a guest, than the
//! `epoll_wait` of a poll), and taken before every poll it made a poll three times as long,
//! a message that arrived during it waiting for its end.
#![forbid(unsafe_code)]

/// The window measured (engine µs): long enough for the next Read of an `ib_read_lat`
/// requester or the next message of a ping-pong on loopback.
pub const SUGGESTED_WINDOW_US: u64 = 50;

/// Within a window, one poll in this many looks at the whole `epoll` set; the others read the
/// stream that answered last (see the module's doc).
pub const SET_LOOK_EVERY: u32 = 4;

/// The most windows skipped in a row after spinning was found to take a CPU someone waits
/// for.
pub const MAX_SKIP: u32 = 1024;

/// The longest a spinning thread goes without looking at the run queue (engine µs): a
/// thread that starts waiting for a CPU meanwhile waits at most that long for it.
pub const CROWD_CHECK_US: u64 = 20;

/// The busy-poll policy of one progress thread.
#[derive(Debug)]
pub struct Spin {
    window_us: u64,
    /// Poll (rather than sleep) until then (engine µs).
    until: u64,
    /// Windows still to skip after contention.
    skip: u32,
    /// How many the next contention skips.
    backoff: u32,
    /// When the run queue was last found uncrowded (engine µs; `None`: not in this window).
    uncrowded_at: Option<u64>,
    /// Polls asked [`Spin::looks_at_set`] so far.
    polls: u32,
}

impl Spin {
    /// A policy with this window (0: never spin).
    pub fn new(window_us: u64) -> Spin {
        Spin { window_us, until: 0, skip: 0, backoff: 0, uncrowded_at: None, polls: 0 }
    }

    /// The window from the environment: `UIW_PROGRESS_SPIN_US` (µs; 0: never spin), unset
    /// [`SUGGESTED_WINDOW_US`].
    pub fn from_env() -> Spin {
        Spin::new(window_from(std::env::var("UIW_PROGRESS_SPIN_US").ok().as_deref()))
    }

    /// Whether this policy ever polls (a window was asked for).
    pub fn enabled(&self) -> bool {
        self.window_us > 0
    }

    /// A turn of the progress thread served messages at `now` (`polled`: found by a poll of
    /// the window, not by a wake-up); `answered`: its pumps sent an answer (see the module).
    /// Only an answer opens or renews the window.
    pub fn turn(&mut self, now: u64, polled: bool, answered: bool) {
        if answered {
            self.traffic(now, polled);
        }
    }

    /// A message was served at `now` (`polled`: found by a poll of the window, not by a
    /// wake-up): the window runs on from here, unless it is being skipped.
    fn traffic(&mut self, now: u64, polled: bool) {
        if self.window_us == 0 {
            return;
        }
        if polled {
            // Spinning caught a message: it pays here; contention starts over.
            self.backoff = 0;
        }
        if self.skip > 0 {
            self.skip -= 1;
            return;
        }
        self.until = now + self.window_us;
    }

    /// Whether the next wait at `now` polls (`true`) or sleeps. `crowded` tells whether a
    /// thread waits for a CPU (see [`crowded`]); it is asked only inside a window.
    /// Within a window it is asked at the window's first poll and then every
    /// [`CROWD_CHECK_US`].
    pub fn poll(&mut self, now: u64, crowded: impl FnOnce() -> bool) -> bool {
        if now >= self.until {
            self.uncrowded_at = None;
            return false;
        }
        if self.uncrowded_at.is_some_and(|t| now.saturating_sub(t) < CROWD_CHECK_US) {
            return true;
        }
        if crowded() {
            self.until = 0;
            self.uncrowded_at = None;
            self.backoff = (self.backoff * 2).clamp(1, MAX_SKIP);
            self.skip = self.backoff;
            return false;
        }
        self.uncrowded_at = Some(now);
        true
    }

    /// For a poll of a window ([`Spin::poll`] said so) that could read the stream that answered
    /// last itself: whether it looks at the whole `epoll` set instead — one poll in
    /// [`SET_LOOK_EVERY`], so that the other streams, the listener and the waker are never
    /// left unlooked at for longer than a few polls.
    pub fn looks_at_set(&mut self) -> bool {
        self.polls = self.polls.wrapping_add(1);
        self.polls % SET_LOOK_EVERY == 0
    }
}

/// The window `UIW_PROGRESS_SPIN_US` asks for (µs): unset or unreadable, the default.
fn window_from(v: Option<&str>) -> u64 {
    v.and_then(|v| v.trim().parse().ok()).unwrap_or(SUGGESTED_WINDOW_US)
}

/// Whether more threads are runnable on the machine than this thread has CPUs: the
/// running count of `/proc/loadavg` (`R/T`, which counts the caller) against `cpus`.
/// Unreadable: crowded (never spin blind).
pub fn crowded(loadavg: &mut Option<std::fs::File>, cpus: usize) -> bool {
    use std::os::unix::fs::FileExt;
    let Some(f) = loadavg.as_mut() else { return true };
    let mut b = [0u8; 128];
    // One pread from the start: a procfs file is generated anew at offset 0.
    let n = match f.read_at(&mut b, 0) {
        Ok(n) => n,
        Err(_) => return true,
    };
    running(&b[..n]).is_none_or(|r| r > cpus)
}

/// The running count of a `/proc/loadavg` line ("0.52 0.58 0.59 2/345 6789").
fn running(line: &[u8]) -> Option<usize> {
    let s = std::str::from_utf8(line).ok()?;
    let f = s.split_ascii_whitespace().nth(3)?;
    f.split_once('/')?.0.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn polls_only_within_the_window_after_traffic() {
        let mut s = Spin::new(SUGGESTED_WINDOW_US);
        // Nothing served yet: sleep (an idle process never spins).
        assert!(!s.poll(0, || false));
        s.traffic(100, false);
        assert!(s.poll(100, || false));
        assert!(s.poll(149, || false));
        assert!(!s.poll(150, || panic!("outside the window the run queue is not read")));
        // Traffic caught by a poll renews the window.
        s.traffic(120, true);
        assert!(s.poll(169, || false));
        assert!(!s.poll(170, || false));
    }

    /// The run queue is read at a window's first poll, then once per [`CROWD_CHECK_US`], not
    /// before every poll; a window opened anew reads it at its first poll again.
    #[test]
    fn the_run_queue_is_read_every_crowd_check_interval() {
        let mut s = Spin::new(SUGGESTED_WINDOW_US);
        s.traffic(100, false);
        let mut reads = 0;
        for now in 100..150 {
            assert!(s.poll(now, || {
                reads += 1;
                false
            }));
        }
        assert_eq!(reads, 3, "at 100, 120 and 140");
        assert!(!s.poll(150, || panic!("outside the window the run queue is not read")));
        s.traffic(300, false);
        assert!(s.poll(301, || {
            reads += 1;
            false
        }));
        assert_eq!(reads, 4, "a new window reads it at its first poll");
        // Found crowded at a later read: the window ends there.
        assert!(!s.poll(321, || true));
    }

    #[test]
    fn only_an_answer_opens_the_window() {
        let mut s = Spin::new(SUGGESTED_WINDOW_US);
        // A one-way stream's target: served, nothing sent back.
        s.turn(100, false, false);
        assert!(!s.poll(100, || false), "a turn that answered nothing must not poll");
        s.turn(200, false, true);
        assert!(s.poll(200, || false));
        // A turn without an answer inside a window leaves it to end on time.
        s.turn(240, true, false);
        assert!(!s.poll(250, || false));
    }

    #[test]
    fn the_window_is_on_unless_turned_off() {
        assert_eq!(window_from(None), SUGGESTED_WINDOW_US);
        assert_eq!(window_from(Some("0")), 0);
        assert_eq!(window_from(Some(" 20 ")), 20);
        assert_eq!(window_from(Some("x")), SUGGESTED_WINDOW_US);
    }

    #[test]
    fn a_window_looks_at_the_set_every_few_polls() {
        let mut s = Spin::new(SUGGESTED_WINDOW_US);
        let looks: Vec<bool> = (0..3 * SET_LOOK_EVERY).map(|_| s.looks_at_set()).collect();
        assert_eq!(looks.iter().filter(|&&l| l).count(), 3);
        // Never more than SET_LOOK_EVERY - 1 polls in a row without a look.
        assert!(looks.split(|&l| l).all(|run| run.len() < SET_LOOK_EVERY as usize), "{looks:?}");
    }

    #[test]
    fn off_never_polls() {
        let mut s = Spin::new(0);
        s.traffic(10, false);
        assert!(!s.poll(10, || false));
    }

    #[test]
    fn a_crowded_machine_sleeps_and_skips_windows_doubling() {
        let mut s = Spin::new(SUGGESTED_WINDOW_US);
        let mut now = 0;
        let mut skipped = Vec::new();
        for _ in 0..5 {
            s.traffic(now, false);
            assert!(!s.poll(now, || true), "crowded: sleep at once");
            // Count the messages whose window is skipped (no poll, no look at the run queue).
            let mut k = 0;
            loop {
                now += 10;
                s.traffic(now, false);
                if s.poll(now, || false) {
                    break;
                }
                k += 1;
            }
            skipped.push(k);
            assert!(!s.poll(now + 50, || panic!("window over")));
        }
        assert_eq!(skipped, vec![1, 2, 4, 8, 16]);
        // A poll that catches traffic starts the back-off over.
        s.traffic(now, true);
        assert!(!s.poll(now, || true));
        now += 10;
        s.traffic(now, false);
        assert!(!s.poll(now, || false), "one window skipped");
        now += 10;
        s.traffic(now, false);
        assert!(s.poll(now, || false));
    }

    #[test]
    fn backoff_is_bounded() {
        let mut s = Spin::new(SUGGESTED_WINDOW_US);
        for i in 0..5000u64 {
            s.traffic(i, false);
            s.poll(i, || true);
        }
        assert_eq!(s.backoff, MAX_SKIP);
        assert!(s.skip <= MAX_SKIP);
    }

    #[test]
    fn loadavg_running_count() {
        assert_eq!(running(b"0.52 0.58 0.59 2/345 6789\n"), Some(2));
        assert_eq!(running(b"0.00 0.01 0.05 13/1024 1\n"), Some(13));
        assert_eq!(running(b"garbage"), None);
        let mut none = None;
        assert!(crowded(&mut none, 64), "unreadable: never spin");
        let mut f = std::fs::File::open("/proc/loadavg").ok();
        // Some count is read (this thread at least is running).
        assert!(!crowded(&mut f, usize::MAX - 1));
    }
}
