//! [`Slots`]: an append-only table indexed by a small integer, read without
//! a lock, whose entries never move once set.
//!
//! Tables kept per upstream are indexed by [`UpstreamId`](crate::UpstreamId),
//! and upstreams come and go while the router runs: a table sized once at
//! start would be too short for the upstreams added since. `Slots` grows in
//! segments of doubling size (8, 16, 32, … entries), each allocated when its
//! first entry is set, so an entry is a reference that stays valid for the
//! table's life and a lookup is two atomic loads. An empty table costs a few
//! hundred bytes.

use std::sync::OnceLock;

/// Entries in the first segment; each next one holds twice as many.
const FIRST: usize = 8;
/// Segments, at most: room for `FIRST * (2^SEGMENTS - 1)` entries.
const SEGMENTS: usize = 16;

/// How many entries a table can hold (524,280).
pub const CAPACITY: usize = FIRST * ((1 << SEGMENTS) - 1);

/// An append-only table of `T`, indexed from 0, each entry set at most once.
pub struct Slots<T> {
    segments: [OnceLock<Box<[OnceLock<T>]>>; SEGMENTS],
}

impl<T> Default for Slots<T> {
    fn default() -> Self {
        Slots { segments: std::array::from_fn(|_| OnceLock::new()) }
    }
}

impl<T> Slots<T> {
    /// An empty table.
    pub fn new() -> Self {
        Self::default()
    }

    /// The segment and position within it of entry `index`.
    fn place(index: usize) -> (usize, usize) {
        // Segment k starts at FIRST * (2^k - 1).
        let scaled = index / FIRST + 1;
        let segment = (usize::BITS - 1 - scaled.leading_zeros()) as usize;
        (segment, index - FIRST * ((1 << segment) - 1))
    }

    /// Entry `index`, if set.
    pub fn get(&self, index: usize) -> Option<&T> {
        if index >= CAPACITY {
            return None;
        }
        let (segment, at) = Self::place(index);
        self.segments[segment].get()?[at].get()
    }

    /// Entry `index`, set to `init()` if it was not. Panics if `index` is
    /// [`CAPACITY`] or more (callers bound their indices first).
    pub fn get_or_init(&self, index: usize, init: impl FnOnce() -> T) -> &T {
        assert!(index < CAPACITY, "slot {index} is beyond the table's capacity");
        let (segment, at) = Self::place(index);
        let entries = self.segments[segment]
            .get_or_init(|| (0..FIRST << segment).map(|_| OnceLock::new()).collect::<Vec<_>>().into_boxed_slice());
        entries[at].get_or_init(init)
    }

    /// Sets entry `index` if it was not; `false` if it was (and is kept).
    pub fn set(&self, index: usize, value: T) -> bool {
        let mut value = Some(value);
        self.get_or_init(index, || value.take().expect("taken once"));
        value.is_none()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_are_placed_in_doubling_segments() {
        assert_eq!(Slots::<u8>::place(0), (0, 0));
        assert_eq!(Slots::<u8>::place(7), (0, 7));
        assert_eq!(Slots::<u8>::place(8), (1, 0));
        assert_eq!(Slots::<u8>::place(23), (1, 15));
        assert_eq!(Slots::<u8>::place(24), (2, 0));
        assert_eq!(Slots::<u8>::place(CAPACITY - 1), (SEGMENTS - 1, (FIRST << (SEGMENTS - 1)) - 1));
    }

    #[test]
    fn set_once_and_read_back_without_moving() {
        let slots = Slots::new();
        assert!(slots.get(3).is_none());
        assert!(slots.set(3, "three".to_string()));
        assert!(!slots.set(3, "again".to_string()), "an entry is set once");
        let first: *const String = slots.get(3).unwrap();
        for i in 4..5000 {
            slots.set(i, i.to_string());
        }
        assert_eq!(slots.get(3).unwrap(), "three");
        assert!(std::ptr::eq(first, slots.get(3).unwrap()), "entries never move");
        assert_eq!(slots.get(4999).unwrap(), "4999");
        assert!(slots.get(5000).is_none());
        assert!(slots.get(CAPACITY).is_none());
        assert_eq!(slots.get_or_init(2, || "two".into()), "two");
    }
}
