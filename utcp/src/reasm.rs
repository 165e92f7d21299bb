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
    /// start offset → when a segment last touched the piece (`clock`): the SACK blocks are
    /// reported most recent first (RFC 2018 §4).
    stamps: BTreeMap<u64, u64>,
    clock: u64,
    bytes: usize,
}

impl Reassembly {
    /// Bytes held.
    pub fn len(&self) -> usize {
        self.bytes
    }

    pub fn is_empty(&self) -> bool {
        self.pieces.is_empty()
    }

    /// Keep `data` starting at offset `at`, dropping what is already held. Returns the
    /// first part of it that was held already (a duplicate, for a D-SACK: RFC 2883 §4).
    pub fn insert(&mut self, at: u64, data: &[u8]) -> Option<(u64, u64)> {
        let end = at + data.len() as u64;
        if data.is_empty() {
            return None;
        }
        let held = self.overlapping(at, end).last().map(|(s, e)| (s.max(at), e.min(end)));
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
        // Every piece the segment covers, new or already held (a duplicate too: the first
        // block names the data of the segment that drew the ACK), becomes the most recent.
        self.clock += 1;
        let touched: Vec<u64> = self.overlapping(at, end).map(|(s, _)| s).collect();
        for s in touched {
            self.stamps.insert(s, self.clock);
        }
        held
    }

    /// The pieces held that overlap `[at, end)`, as (start, end), highest first.
    fn overlapping(&self, at: u64, end: u64) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.pieces.range(..end).rev().map(|(&s, v)| (s, s + v.len() as u64)).take_while(move |&(_, e)| e > at)
    }

    /// Take every byte contiguous from `next` on (pieces below `next` are dropped).
    pub fn pop_contiguous(&mut self, next: u64, out: &mut impl Extend<u8>) -> u64 {
        let mut next = next;
        while let Some((&s, _)) = self.pieces.first_key_value() {
            if s > next {
                break;
            }
            let v = self.pieces.remove(&s).unwrap_or_default();
            self.stamps.remove(&s);
            self.bytes -= v.len();
            let e = s + v.len() as u64;
            if e > next {
                out.extend(v[(next - s) as usize..].iter().copied());
                next = e;
            }
        }
        next
    }

    /// How many contiguous ranges are held (what [`Reassembly::ranges`] would list, uncapped),
    /// without building or ordering them.
    pub fn range_count(&self) -> usize {
        let mut n = 0;
        let mut end = None;
        for (&s, v) in &self.pieces {
            if end != Some(s) {
                n += 1;
            }
            end = Some(s + v.len() as u64);
        }
        n
    }

    /// Contiguous ranges held, at most `n`, the most recently received first and then in the
    /// order they were last added to (RFC 2018 §4: the first block holds the segment that
    /// drew the ACK, the others repeat the most recently reported). Ascending order after the
    /// first would report the lowest ranges over and over while a fourth, newer one is never
    /// seen: a Linux sender then takes its segments for lost (RACK) and sends them again.
    pub fn ranges(&self, n: usize) -> Vec<(u64, u64)> {
        // (start, end, most recent stamp of its pieces)
        let mut all: Vec<(u64, u64, u64)> = Vec::new();
        for (&s, v) in &self.pieces {
            let e = s + v.len() as u64;
            let t = self.stamps.get(&s).copied().unwrap_or(0);
            match all.last_mut() {
                Some(l) if l.1 == s => {
                    l.1 = e;
                    l.2 = l.2.max(t);
                }
                _ => all.push((s, e, t)),
            }
        }
        all.sort_by(|a, b| b.2.cmp(&a.2));
        all.into_iter().take(n).map(|(s, e, _)| (s, e)).collect()
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
        // The most recently received block first (RFC 2018 §4).
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

    /// Four ranges, three blocks: the one not reported is the one longest untouched, never a
    /// range that is still growing (the fourth, above the three lowest, was left out when the
    /// blocks after the first were the lowest ranges — and a Linux sender retransmitted all
    /// of its segments).
    #[test]
    fn blocks_after_the_first_are_the_most_recently_added() {
        let mut r = Reassembly::default();
        for at in [10, 30, 50, 70] {
            assert_eq!(r.insert(at, b"0123456789"), None);
        }
        assert_eq!(r.ranges(3), vec![(70, 80), (50, 60), (30, 40)]);
        // The range at 70 keeps growing: it stays first, the next most recent follow.
        r.insert(80, b"abcde");
        assert_eq!(r.ranges(3), vec![(70, 85), (50, 60), (30, 40)]);
        // A segment into the lowest range: it comes first, and the oldest left drops out.
        r.insert(20, b"xy");
        assert_eq!(r.ranges(3), vec![(10, 22), (70, 85), (50, 60)]);
        // A duplicate counts as received: the first block names it.
        assert_eq!(r.insert(52, b"23"), Some((52, 54)));
        assert_eq!(r.ranges(3), vec![(50, 60), (10, 22), (70, 85)]);
        // Ranges that merge take the most recent stamp of their pieces; the first held part
        // of a segment that overlaps two pieces is the lower.
        assert_eq!(r.insert(35, b"abcdefghijklmnop"), Some((35, 40)));
        assert_eq!(r.ranges(3), vec![(30, 60), (10, 22), (70, 85)]);
        assert_eq!(r.range_count(), 3);
        r.insert(90, b"z");
        assert_eq!(r.range_count(), r.ranges(usize::MAX).len());
    }
}
