//! The posted WRs of one work queue, by the id the data path gives each one.
//!
//! Ids are handed out in posting order, one queue's after another, and a queue's WRs leave it
//! in that order too: RDMAP completes a send queue in order (RFC 5040 §5.5) and a Send
//! consumes the oldest receive (RFC 5041 §5.4: the Queue's MSN). So the table is a ring of
//! slots indexed by `id - base`: posting appends, taking the oldest pops the front, a lookup
//! is an index — no tree to rebalance, no hash, and nothing moved but the slot itself. (A
//! `BTreeMap` of these entries, each a few hundred bytes, spent its time shifting them
//! inside its nodes: 3 % of a 64-byte `ib_send_bw`'s requester in `memmove` alone.)
//!
//! A WR taken out of order (one that fails at post time) leaves an empty slot until every
//! older WR is gone: the ring spans the WRs still posted, never more than those between the
//! oldest one and the newest.
#![forbid(unsafe_code)]

use std::collections::VecDeque;

/// The WRs of one work queue (see the module).
#[derive(Debug)]
pub struct WrTable<T> {
    /// The id of `slots[0]`.
    base: u64,
    slots: VecDeque<Option<T>>,
    /// Slots that hold a WR.
    live: usize,
}

impl<T> Default for WrTable<T> {
    fn default() -> Self {
        // Ids start at 1, as the data path's did (0 reads as "none" in a debugger).
        WrTable { base: 1, slots: VecDeque::new(), live: 0 }
    }
}

impl<T> WrTable<T> {
    /// Posts `e`; returns its id, one above the previous WR's.
    pub fn insert(&mut self, e: T) -> u64 {
        let id = self.base + self.slots.len() as u64;
        self.slots.push_back(Some(e));
        self.live += 1;
        id
    }

    /// The id the next [`WrTable::insert`] returns.
    pub fn next_id(&self) -> u64 {
        self.base + self.slots.len() as u64
    }

    /// Gives the next id to a WR that is done as it is posted (`DataPath::post_direct`), with
    /// no slot: ids stay one per posted WR. Only while the table is empty.
    pub fn pass(&mut self) {
        debug_assert!(self.slots.is_empty(), "a WR passes only an empty queue");
        if self.slots.is_empty() {
            self.base += 1;
        }
    }

    fn index(&self, id: u64) -> Option<usize> {
        let i = id.checked_sub(self.base)?;
        usize::try_from(i).ok().filter(|&i| i < self.slots.len())
    }

    /// The id in the table whose bits under `mask` (a low mask, `2^k - 1`) are `low`: unique
    /// while fewer than `mask + 1` ids span the table. `None` when no slot has such an id.
    pub fn id_ending(&self, low: u64, mask: u64) -> Option<u64> {
        debug_assert!(mask.wrapping_add(1).is_power_of_two() && low & !mask == 0);
        // The first id from `base` on that ends so.
        let id = self.base + (low.wrapping_sub(self.base) & mask);
        self.index(id).map(|_| id)
    }

    pub fn get(&self, id: u64) -> Option<&T> {
        self.slots.get(self.index(id)?)?.as_ref()
    }

    pub fn get_mut(&mut self, id: u64) -> Option<&mut T> {
        let i = self.index(id)?;
        self.slots.get_mut(i)?.as_mut()
    }

    /// Takes WR `id` out; the slots of WRs already gone before the oldest left are dropped.
    pub fn remove(&mut self, id: u64) -> Option<T> {
        let i = self.index(id)?;
        // The oldest (the usual case: queues complete in order) leaves with its slot, moved
        // once; taking it out first and then popping the empty slot moved the slot twice.
        let e = if i == 0 {
            self.base += 1;
            self.slots.pop_front()??
        } else {
            self.slots.get_mut(i)?.take()?
        };
        self.live -= 1;
        while let Some(None) = self.slots.front() {
            self.slots.pop_front();
            self.base += 1;
        }
        Some(e)
    }

    /// WRs posted and not taken out.
    pub fn len(&self) -> usize {
        self.live
    }

    pub fn is_empty(&self) -> bool {
        self.live == 0
    }

    /// The WRs in posting order.
    pub fn iter(&self) -> impl Iterator<Item = (u64, &T)> {
        let base = self.base;
        self.slots.iter().enumerate().filter_map(move |(i, s)| s.as_ref().map(|e| (base + i as u64, e)))
    }

    /// The WRs in posting order, to change.
    pub fn iter_mut(&mut self) -> impl Iterator<Item = (u64, &mut T)> {
        let base = self.base;
        self.slots.iter_mut().enumerate().filter_map(move |(i, s)| s.as_mut().map(|e| (base + i as u64, e)))
    }

    /// Takes every WR out, in posting order. Ids go on from where they were.
    pub fn take_all(&mut self) -> Vec<T> {
        self.base += self.slots.len() as u64;
        self.live = 0;
        self.slots.drain(..).flatten().collect()
    }

    /// Forgets every WR. Ids go on from where they were.
    pub fn clear(&mut self) {
        self.take_all();
    }
}

#[cfg(test)]
mod tests {
    use super::WrTable;

    #[test]
    fn ids_follow_posting_order_and_lookups_find_each_wr() {
        let mut t = WrTable::default();
        let a = t.insert("a");
        let b = t.insert("b");
        let c = t.insert("c");
        assert_eq!((a, b, c), (1, 2, 3));
        assert_eq!((t.get(a), t.get(b), t.get(c), t.get(4), t.get(0)), (Some(&"a"), Some(&"b"), Some(&"c"), None, None));
        assert_eq!(t.len(), 3);
        assert_eq!(t.next_id(), 4);
    }

    #[test]
    fn taking_the_oldest_releases_its_slot_and_later_ones_stay_addressable() {
        let mut t = WrTable::default();
        let ids: Vec<u64> = (0..5).map(|i| t.insert(i)).collect();
        assert_eq!(t.remove(ids[0]), Some(0));
        assert_eq!(t.remove(ids[0]), None, "a WR is taken once");
        assert_eq!(t.get(ids[0]), None);
        assert_eq!(t.get(ids[4]), Some(&4));
        assert_eq!(t.slots.len(), 4);
        assert_eq!(t.insert(5), 6, "ids never repeat");
    }

    #[test]
    fn a_wr_taken_out_of_order_leaves_a_hole_until_the_older_ones_go() {
        let mut t = WrTable::default();
        let ids: Vec<u64> = (0..4).map(|i| t.insert(i)).collect();
        assert_eq!(t.remove(ids[2]), Some(2));
        assert_eq!(t.len(), 3);
        assert_eq!(t.iter().map(|(id, e)| (id, *e)).collect::<Vec<_>>(), vec![(1, 0), (2, 1), (4, 3)]);
        assert_eq!(t.slots.len(), 4, "the hole stays while older WRs are posted");
        t.remove(ids[0]);
        t.remove(ids[1]);
        assert_eq!(t.slots.len(), 1, "the oldest's departure drops the hole behind it");
        assert_eq!(t.get(ids[3]), Some(&3));
        for (_, e) in t.iter_mut() {
            *e += 10;
        }
        assert_eq!(t.get(ids[3]), Some(&13));
    }

    /// A Read's sink STag carries the low 24 bits of its WR's id: the table finds the id
    /// again across the 24-bit wrap, and nothing for bits no posted WR ends with.
    #[test]
    fn an_id_is_found_by_its_low_bits_across_their_wrap() {
        const MASK: u64 = 0x00ff_ffff;
        let mut t = WrTable::default();
        t.base = MASK - 1;
        let ids: Vec<u64> = (0..4).map(|i| t.insert(i)).collect();
        assert_eq!(ids, vec![MASK - 1, MASK, MASK + 1, MASK + 2]);
        for &id in &ids {
            assert_eq!(t.id_ending(id & MASK, MASK), Some(id));
        }
        assert_eq!(t.id_ending(3, MASK), None, "past the newest");
        assert_eq!(t.id_ending(MASK - 2, MASK), None, "before the oldest");
        t.remove(ids[0]);
        assert_eq!(t.id_ending(ids[0] & MASK, MASK), None, "gone with its WR");
    }

    #[test]
    fn take_all_empties_in_posting_order_and_ids_go_on() {
        let mut t = WrTable::default();
        for i in 0..3 {
            t.insert(i);
        }
        t.remove(2);
        assert_eq!(t.take_all(), vec![0, 2]);
        assert!(t.is_empty());
        assert_eq!(t.get(1), None);
        assert_eq!(t.insert(7), 4);
        assert_eq!(t.get(4), Some(&7));
        t.clear();
        assert_eq!(t.get(4), None);
        assert_eq!(t.insert(8), 5);
    }
}
