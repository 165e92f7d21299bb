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
