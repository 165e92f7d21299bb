//! Receive-side reassembly of out-of-order segments (RFC 9293 §3.10.7.4, "segment text"),
//! and the SACK blocks that describe it (RFC 2018 §4).
//!
//! Offsets are absolute stream offsets (`u64`), so the map never sees sequence wrap; the
//! connection converts to and from sequence numbers.

use std::collections::BTreeMap;

/// Out-of-order data held above the next expected byte.
#[derive(Debug, Default)]
pub struct Reassembly {
    /// start offset → bytes; pieces never overlap.
    pieces: BTreeMap<u64, Vec<u8>>,
    bytes: usize,
    /// Offset range of the piece most recently added (first SACK block, RFC 2018 §4).
    last: Option<(u64, u64)>,
}

impl Reassembly {
    /// Bytes held.
    pub fn len(&self) -> usize {
        self.bytes
    }

    pub fn is_empty(&self) -> bool {
        self.pieces.is_empty()
    }

    /// Keep `data` starting at offset `at`, dropping what is already held.
    pub fn insert(&mut self, at: u64, data: &[u8]) {
        let end = at + data.len() as u64;
        if data.is_empty() {
            return;
        }
        // Find the gaps in [at, end) not covered by existing pieces.
        let mut cursor = at;
        let mut gaps = Vec::new();
        let first = self.pieces.range(..=at).next_back().map(|(&s, v)| (s, s + v.len() as u64));
        if let Some((_, e)) = first {
            if e > cursor {
                cursor = e.min(end);
            }
        }
        for (&s, v) in self.pieces.range(at..end) {
            if s > cursor {
                gaps.push((cursor, s));
            }
            cursor = cursor.max(s + v.len() as u64);
        }
        if cursor < end {
            gaps.push((cursor, end));
        }
        for (s, e) in gaps {
            let piece = data[(s - at) as usize..(e - at) as usize].to_vec();
            self.bytes += piece.len();
            self.pieces.insert(s, piece);
        }
        self.last = Some((at, end));
    }

    /// Take every byte contiguous from `next` on (pieces below `next` are dropped).
    pub fn pop_contiguous(&mut self, next: u64, out: &mut impl Extend<u8>) -> u64 {
        let mut next = next;
        while let Some((&s, _)) = self.pieces.first_key_value() {
            if s > next {
                break;
            }
            let v = self.pieces.remove(&s).unwrap_or_default();
            self.bytes -= v.len();
            let e = s + v.len() as u64;
            if e > next {
                out.extend(v[(next - s) as usize..].iter().copied());
                next = e;
            }
        }
        if matches!(self.last, Some((_, e)) if e <= next) {
            self.last = None;
        }
        next
    }

    /// Contiguous ranges held, most recently received first, then ascending; at most `n`.
    pub fn ranges(&self, n: usize) -> Vec<(u64, u64)> {
        let mut all: Vec<(u64, u64)> = Vec::new();
        for (&s, v) in &self.pieces {
            let e = s + v.len() as u64;
            match all.last_mut() {
                Some(l) if l.1 == s => l.1 = e,
                _ => all.push((s, e)),
            }
        }
        if let Some((ls, _)) = self.last {
            if let Some(i) = all.iter().position(|&(s, e)| s <= ls && ls < e) {
                let r = all.remove(i);
                all.insert(0, r);
            }
        }
        all.truncate(n);
        all
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overlaps_and_gaps() {
        let mut r = Reassembly::default();
        r.insert(10, b"klmno");
        r.insert(12, b"mnopqr"); // overlaps the tail
        r.insert(5, b"fghijkl"); // overlaps the head
        r.insert(30, b"XY");
        // The most recently received block first (RFC 2018 §4), then ascending.
        assert_eq!(r.ranges(3), vec![(30, 32), (5, 18)]);
        assert_eq!(r.ranges(1), vec![(30, 32)]);
        let mut out = Vec::new();
        assert_eq!(r.pop_contiguous(0, &mut out), 0);
        assert!(out.is_empty());
        assert_eq!(r.pop_contiguous(7, &mut out), 18);
        assert_eq!(out, b"hijklmnopqr");
        assert_eq!(r.len(), 2);
        r.insert(30, b"XYZ");
        assert_eq!(r.ranges(3), vec![(30, 33)]);
        assert_eq!(r.len(), 3);
    }
}
