//! Unpredictable numbers for identifiers a remote peer must not guess (RFC 5042 §5: STag
//! keys, QP numbers): SipHash-1-3 keyed with the secret random keys std draws from the OS
//! for every `RandomState`, over a counter — a keyed PRF, no file descriptor, no `unsafe`.

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

/// A fresh 64-bit value no peer can predict from the ones it has seen.
pub fn u64() -> u64 {
    static KEYS: OnceLock<RandomState> = OnceLock::new();
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let mut h = KEYS.get_or_init(RandomState::new).build_hasher();
    h.write_u64(COUNTER.fetch_add(1, Ordering::Relaxed));
    h.finish()
}

/// Uniform in `0..n` (`n > 0`; the bias of the modulo is below 2^-40 for `n < 2^24`).
pub fn below(n: u32) -> u32 {
    (u64() % u64::from(n)) as u32
}

#[cfg(test)]
mod tests {
    #[test]
    fn values_differ_and_stay_in_range() {
        let v: Vec<u64> = (0..64).map(|_| super::u64()).collect();
        let mut d = v.clone();
        d.sort_unstable();
        d.dedup();
        assert_eq!(d.len(), v.len());
        assert!((0..1000).all(|_| super::below(10) < 10));
        // Not a counter: consecutive values are not consecutive numbers.
        assert!(v.windows(2).any(|w| w[1].wrapping_sub(w[0]) != 1));
    }
}
