//! TCP sequence-number arithmetic modulo 2^32 (RFC 9293 §3.4).

/// `a < b` in sequence space.
pub fn lt(a: u32, b: u32) -> bool {
    (a.wrapping_sub(b) as i32) < 0
}

/// `a <= b` in sequence space.
pub fn le(a: u32, b: u32) -> bool {
    (a.wrapping_sub(b) as i32) <= 0
}

/// `a > b` in sequence space.
pub fn gt(a: u32, b: u32) -> bool {
    lt(b, a)
}

/// `a >= b` in sequence space.
pub fn ge(a: u32, b: u32) -> bool {
    le(b, a)
}

/// Distance from `a` forward to `b` (`b - a`), for `a <= b`.
pub fn dist(a: u32, b: u32) -> usize {
    b.wrapping_sub(a) as usize
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wraps() {
        assert!(lt(u32::MAX - 1, 3));
        assert!(gt(3, u32::MAX - 1));
        assert!(le(7, 7) && ge(7, 7) && !lt(7, 7));
        assert_eq!(dist(u32::MAX - 1, 3), 5);
    }
}
