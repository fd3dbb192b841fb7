//! A set of byte ranges, kept merged: the free space of a block group.

use std::collections::BTreeMap;

/// Disjoint, non-adjacent half-open ranges `[start, end)`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RangeSet {
    map: BTreeMap<u64, u64>,
    /// Bytes in `map`, kept as ranges come and go: every change to a tree
    /// asks how much metadata space is free, and summing the ranges of a
    /// fragmented filesystem each time would cost as much as the change.
    total: u64,
}

impl RangeSet {
    /// An empty set.
    pub fn new() -> Self {
        Self::default()
    }

    /// Add `[start, start + len)`, merging with neighbours. Returns false
    /// (and changes nothing) if any byte of it is already in the set, or
    /// if the range runs past the end of the address space (damaged
    /// metadata: no real range does).
    pub fn insert(&mut self, start: u64, len: u64) -> bool {
        if len == 0 {
            return true;
        }
        let mut lo = start;
        let Some(mut hi) = start.checked_add(len) else {
            return false;
        };
        if let Some((&s, &e)) = self.map.range(..=start).next_back() {
            if e > start {
                return false;
            }
            if e == start {
                lo = s;
            }
        }
        if let Some((&s, &e)) = self.map.range(start..).next() {
            if s < hi {
                return false;
            }
            if s == hi {
                hi = e;
                self.map.remove(&s);
            }
        }
        self.map.insert(lo, hi);
        self.total += len;
        true
    }

    /// Remove `[start, start + len)`; returns false (and changes nothing)
    /// unless all of it is in the set (never so for a range past the end
    /// of the address space).
    pub fn remove(&mut self, start: u64, len: u64) -> bool {
        if len == 0 {
            return true;
        }
        let Some(end) = start.checked_add(len) else {
            return false;
        };
        let Some((&s, &e)) = self.map.range(..=start).next_back() else {
            return false;
        };
        if e < end {
            return false;
        }
        self.map.remove(&s);
        if s < start {
            self.map.insert(s, start);
        }
        if end < e {
            self.map.insert(end, e);
        }
        self.total -= len;
        true
    }

    /// Whether all of `[start, start + len)` is in the set (never for a
    /// range past the end of the address space).
    pub fn contains(&self, start: u64, len: u64) -> bool {
        let Some(end) = start.checked_add(len) else {
            return false;
        };
        self.map
            .range(..=start)
            .next_back()
            .is_some_and(|(_, &e)| e >= end)
    }

    /// The first `align`-aligned start at or after `from` where `len` bytes
    /// are free, searching to the end and then wrapping to the beginning.
    pub fn find(&self, len: u64, align: u64, from: u64) -> Option<u64> {
        let fit = |s: u64, e: u64| {
            let a = s.div_ceil(align).checked_mul(align)?;
            (a.checked_add(len)? <= e).then_some(a)
        };
        let first = self
            .map
            .range(..=from)
            .next_back()
            .and_then(|(_, &e)| fit(from, e));
        first
            .or_else(|| self.map.range(from..).find_map(|(&s, &e)| fit(s, e)))
            .or_else(|| self.map.range(..from).find_map(|(&s, &e)| fit(s, e)))
    }

    /// The largest range, as (start, len).
    pub fn largest(&self) -> Option<(u64, u64)> {
        self.map
            .iter()
            .map(|(&s, &e)| (s, e - s))
            .max_by_key(|&(s, l)| (l, u64::MAX - s))
    }

    /// Total bytes in the set.
    pub fn total(&self) -> u64 {
        self.total
    }

    /// The ranges as (start, len), in order.
    pub fn iter(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.map.iter().map(|(&s, &e)| (s, e - s))
    }

    /// Number of ranges.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// Whether the set is empty.
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merge_split_and_find() {
        let mut s = RangeSet::new();
        assert!(s.insert(0, 100));
        assert!(s.insert(200, 100));
        assert!(s.insert(100, 100));
        assert_eq!(s.iter().collect::<Vec<_>>(), vec![(0, 300)]);
        assert!(!s.insert(50, 10));
        assert!(s.remove(100, 50));
        assert_eq!(s.iter().collect::<Vec<_>>(), vec![(0, 100), (150, 150)]);
        assert!(!s.remove(90, 20));
        assert_eq!(s.find(120, 1, 0), Some(150));
        assert_eq!(s.find(10, 64, 0), Some(0));
        assert_eq!(s.find(10, 64, 20), Some(64));
        assert_eq!(s.find(40, 64, 20), Some(192));
        assert_eq!(s.find(10, 1, 299), Some(0));
        assert_eq!(s.total(), 250);
        assert_eq!(s.largest(), Some((150, 150)));
        assert!(s.contains(160, 10) && !s.contains(90, 70));
    }

    #[test]
    fn total_follows_every_insert_and_remove() {
        let mut s = RangeSet::new();
        let mut x: u64 = 0x2545_f491_4f6c_dd1d;
        for _ in 0..20_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let (start, len) = ((x >> 8) % 4096, (x >> 40) % 64);
            // Refused changes (overlaps, ranges not all in the set) must
            // leave the total alone too.
            if x & 1 == 0 {
                s.insert(start, len);
            } else {
                s.remove(start, len);
            }
            assert_eq!(s.total(), s.iter().map(|(_, l)| l).sum::<u64>());
        }
        assert!(s.total() > 0 && s.len() > 10, "the walk left {s:?}");
    }

    /// Ranges past the end of the address space come only from damaged
    /// metadata: they are refused and change nothing.
    #[test]
    fn ranges_past_the_address_space_are_refused() {
        let mut s = RangeSet::new();
        assert!(s.insert(1000, 1000));
        let before = s.clone();
        assert!(!s.insert(u64::MAX - 10, 20));
        assert!(!s.remove(u64::MAX - 10, 20));
        assert!(!s.remove(1500, u64::MAX));
        assert_eq!(s, before);
        assert!(!s.contains(1500, u64::MAX));
        assert_eq!(s.find(u64::MAX, 1, 0), None);
        assert_eq!(s.find(10, 1 << 63, 1 << 63), None);
    }
}
