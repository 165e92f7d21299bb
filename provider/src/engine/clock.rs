//! The engine's clock: one monotonic origin per process, read in microseconds (the ownership
//! lease) and milliseconds (the protocol core's deadlines).
#![forbid(unsafe_code)]

use std::sync::OnceLock;
use std::time::Instant;

/// Microseconds on the engine's clock.
pub fn now_us() -> u64 {
    static START: OnceLock<Instant> = OnceLock::new();
    START.get_or_init(Instant::now).elapsed().as_micros() as u64
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
    use super::earliest;

    #[test]
    fn earliest_of_optional_deadlines() {
        assert_eq!(earliest(None, None), None);
        assert_eq!(earliest(Some(5), None), Some(5));
        assert_eq!(earliest(None, Some(7)), Some(7));
        assert_eq!(earliest(Some(9), Some(3)), Some(3));
    }
}
