//! Pacing the progress thread on a hot one-way stream (issue 9).
//!
//! The progress thread sleeps in `epoll_wait` and is woken by every arrival on the streams it
//! serves. On loopback the arrival is processed in the *sender's* `sendmsg` (the receiver's
//! TCP input runs in the sender's softirq), and so is the wake-up: an IPI to the CPU the
//! progress thread sleeps on — in a guest, a VM exit. `ib_write_bw -s 65536` against a passive
//! target: 22.7 K wake-ups a second of the target's progress thread, and 6–7 % of the
//! requester's time (the bottleneck: its thread is at 100 %) in `sock_def_readable`.
//!
//! A stream that keeps bringing a lot and draws nothing back — the progress thread's serves read
//! at least [`HOT_BYTES`] of it [`HOT_STREAK`] times in a row, and the QP sent no message
//! meanwhile — needs no wake-up per segment: the progress thread asks the transport to wake it
//! only once [`MARK`] bytes wait (`Stream::wake_after`, `SO_RCVLOWAT` on a kernel socket) and
//! serves the stream again by a deadline of its own, [`DEADLINE_US`] later, whatever came: a
//! tail shorter than the mark waits at most that long. A serve that reads less, or in which the
//! QP sent something (an answer: a ping-pong, a Read Response), lowers the mark again, and so
//! does every deadline (the thread serves the stream then; if it is still hot the next serve
//! raises the mark again). An application thread that polls reads the socket whatever the mark
//! (a non-blocking `recv` returns what is there).
//!
//! Measured on the 2-vCPU development machine, alternating pairs against the commit before:
//! the target's progress thread 22.7 K → 4.8 K wake-ups/s; `ib_write_bw -s 65536` 1.54× median
//! over 10 pairs (0.47–2.86; mean 2.14 → 2.90 GB/s), `-s 1048576` 1.08–1.61× in 5 of 5;
//! `ib_write_lat`, `ib_send_lat`, `ib_read_lat` at 8 B unchanged (their streams answer).
#![forbid(unsafe_code)]

/// A serve of the progress thread that read at least this much payload is a hot one.
pub const HOT_BYTES: u64 = 64 << 10;
/// Hot serves in a row (with nothing sent) before the mark goes up.
pub const HOT_STREAK: u32 = 2;
/// The bytes that must wait before the transport wakes the progress thread, while raised.
pub const MARK: usize = 256 << 10;
/// The longest a raised stream goes without being served (engine µs).
pub const DEADLINE_US: u64 = 100;

/// What the caller does with the stream after a serve.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// Raise the wake-up mark to [`MARK`] and schedule a serve [`DEADLINE_US`] from now.
    Raise,
    /// The mark stays up: push the deadline to [`DEADLINE_US`] from now.
    Keep,
    /// Lower the mark (wake at every arrival again).
    Lower,
    /// Nothing to change.
    Nothing,
}

/// One stream's pacing state.
#[derive(Debug, Default)]
pub struct Pace {
    /// Payload bytes received and messages sent when last looked at.
    rx_seen: u64,
    tx_seen: u64,
    /// Hot serves in a row.
    streak: u32,
    raised: bool,
}

impl Pace {
    /// The progress thread served the stream; `rx_bytes` and `tx_msgs` are the stream's totals
    /// now.
    pub fn served(&mut self, rx_bytes: u64, tx_msgs: u64) -> Step {
        let read = rx_bytes.wrapping_sub(self.rx_seen);
        let sent = tx_msgs != self.tx_seen;
        self.rx_seen = rx_bytes;
        self.tx_seen = tx_msgs;
        if read >= HOT_BYTES && !sent {
            self.streak = self.streak.saturating_add(1);
        } else {
            self.streak = 0;
        }
        let hot = self.streak >= HOT_STREAK;
        match (self.raised, hot) {
            (false, true) => {
                self.raised = true;
                Step::Raise
            }
            (true, true) => Step::Keep,
            (true, false) => {
                self.raised = false;
                Step::Lower
            }
            (false, false) => Step::Nothing,
        }
    }

    /// The deadline came: whether the mark must come down (it was up). The streak stands:
    /// a stream still hot at the serve that follows goes straight back up.
    pub fn due(&mut self) -> bool {
        std::mem::take(&mut self.raised)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two hot serves raise the mark, more keep it; a cold one lowers it.
    #[test]
    fn a_one_way_stream_is_paced_after_a_streak() {
        let mut p = Pace::default();
        assert_eq!(p.served(HOT_BYTES, 0), Step::Nothing);
        assert_eq!(p.served(2 * HOT_BYTES, 0), Step::Raise);
        assert_eq!(p.served(5 * HOT_BYTES, 0), Step::Keep);
        assert_eq!(p.served(5 * HOT_BYTES + 100, 0), Step::Lower);
        assert_eq!(p.served(5 * HOT_BYTES + 200, 0), Step::Nothing);
    }

    /// A stream on which the QP answers (a ping-pong of 64 KiB Writes, Read Responses) is never
    /// paced: its next message would wait for the deadline.
    #[test]
    fn a_stream_that_answers_is_never_paced() {
        let mut p = Pace::default();
        for i in 1..10u64 {
            assert_eq!(p.served(i * HOT_BYTES, i), Step::Nothing, "serve {i}");
        }
        // Raised, then an answer: down at once.
        let mut p = Pace::default();
        p.served(HOT_BYTES, 0);
        assert_eq!(p.served(2 * HOT_BYTES, 0), Step::Raise);
        assert_eq!(p.served(3 * HOT_BYTES, 1), Step::Lower);
    }

    /// A deadline lowers a raised mark once; the next hot serve raises it again.
    #[test]
    fn a_deadline_lowers_the_mark_and_a_hot_serve_raises_it_again() {
        let mut p = Pace::default();
        assert!(!p.due(), "nothing raised");
        p.served(HOT_BYTES, 0);
        assert_eq!(p.served(2 * HOT_BYTES, 0), Step::Raise);
        assert!(p.due());
        assert!(!p.due(), "lowered once");
        assert_eq!(p.served(3 * HOT_BYTES, 0), Step::Raise);
    }
}
