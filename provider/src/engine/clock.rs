//! The engine's clock: one monotonic origin per process, read in microseconds (the ownership
//! lease) and milliseconds (the protocol core's deadlines).
//!
//! A poll of a CQ reads it once and holds that reading for everything it does ([`hold`]): the
//! lease it renews, a completion that waits for the peer's answer. A spinning poller read it
//! two or three times a poll, and the readings were 12–16 % of the `ib_write_lat` client's
//! time in user space (`perf`).
#![forbid(unsafe_code)]

use std::cell::Cell;
use std::sync::OnceLock;

thread_local! {
    /// The reading a poll of this thread holds (`None`: none holds one).
    static HELD: Cell<Option<u64>> = const { Cell::new(None) };
}

/// Microseconds on the engine's clock: the reading this thread's poll holds, if one does,
/// else the clock now.
pub fn now_us() -> u64 {
    HELD.with(Cell::get).unwrap_or_else(read_us)
}

/// The clock now, whatever a poll holds: for what a poll does long after its start (a
/// transmit pass that sends for milliseconds, see `datapath::Holder`).
pub fn read_us() -> u64 {
    static START: OnceLock<u64> = OnceLock::new();
    let now = uiw_kabi::sys::monotonic_ns();
    now.saturating_sub(*START.get_or_init(|| now)) / 1000
}

/// Reads the clock and holds the reading for this thread until the guard goes: a poll's
/// time, one reading for all it does (polls take microseconds; a receive burst inside one,
/// a few hundred at most).
pub fn hold() -> (u64, Held) {
    let now = read_us();
    (now, Held(HELD.with(|h| h.replace(Some(now)))))
}

/// Gives the clock back (to the reading held before, for a poll inside a poll).
#[must_use = "the reading is held only while the guard lives"]
pub struct Held(Option<u64>);

impl Drop for Held {
    fn drop(&mut self) {
        HELD.with(|h| h.set(self.0));
    }
}

/// Milliseconds on the engine's clock (the protocol core's `now_ms`).
pub fn now_ms() -> u64 {
    now_us() / 1000
}

/// The earlier of two optional deadlines (`None`: no deadline).
pub fn earliest(a: Option<u64>, b: Option<u64>) -> Option<u64> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

#[cfg(test)]
mod tests {
    use super::{earliest, hold, now_us};

    #[test]
    fn earliest_of_optional_deadlines() {
        assert_eq!(earliest(None, None), None);
        assert_eq!(earliest(Some(5), None), Some(5));
        assert_eq!(earliest(None, Some(7)), Some(7));
        assert_eq!(earliest(Some(9), Some(3)), Some(3));
    }

    #[test]
    fn a_held_reading_stands_until_its_guard_goes() {
        let (t, held) = hold();
        std::thread::sleep(std::time::Duration::from_millis(2));
        assert_eq!(now_us(), t, "held");
        assert!(std::thread::spawn(now_us).join().unwrap() >= t + 2000, "another thread reads the clock");
        drop(held);
        assert!(now_us() >= t + 2000, "given back");
    }
}
