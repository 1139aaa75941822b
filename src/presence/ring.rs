//! The sliding slot ring: which uid falls due on which tick.
//!
//! A pure data structure in the spirit of tokio's timer wheel: it knows integer ticks and
//! uids, nothing of clocks, sockets or tasks. `window` is the timeout in ticks; the ring has
//! `window + 1` slots and a uid touched on tick `t` is filed under deadline `t + window`, in
//! slot `deadline % slots`. That slot is the one just behind the cursor, the last one the
//! cursor reaches, so a uid expires `window` ticks after its last touch.
//!
//! Expiry is two steps, so that a late ticker can read what clients sent during a stall
//! before anything goes offline:
//!
//! 1. [`Ring::advance`] moves the cursor; every slot it passes becomes an *overdue* bucket.
//!    This is O(slots passed), never O(uids).
//! 2. [`Ring::expire`] takes overdue uids out, in chunks, and hands them to the caller.
//!
//! A [`Ring::touch`] between the two steps still rescues an overdue uid. A ticker that runs
//! on time calls both back to back.

use std::collections::VecDeque;

use foldhash::fast::RandomState;
use hashbrown::HashMap;

/// Sliding slot ring; see the module documentation.
#[derive(Debug)]
pub struct Ring {
    /// Ticks a silent uid survives: the timeout divided by the tick.
    window: u64,
    /// The last tick the cursor reached. Live deadlines lie in `elapsed + 1 ..= elapsed + slots`.
    elapsed: u64,
    /// `window + 1` slots; `slots[d % len]` holds the uids whose deadline is `d`.
    slots: Box<[Vec<u64>]>,
    /// Buckets the cursor has passed but [`Ring::expire`] has not emptied yet, as
    /// `(deadline, uids)`, oldest first; empty buckets are dropped at once. Usually empty;
    /// it only fills between an `advance` and the `expire` calls that follow it.
    overdue: VecDeque<(u64, Vec<u64>)>,
    /// Number of uids in `overdue`, so [`Ring::overdue_len`] is O(1).
    overdue_len: usize,
    /// uid -> where it is filed, packed by [`Pos`].
    index: HashMap<u64, Pos, RandomState>,
    /// Emptied bucket vectors kept for reuse, so a steady ticker does not allocate.
    spare: Vec<Vec<u64>>,
}

/// Where a uid is filed: the low 32 bits of its deadline and its index in that bucket.
///
/// 32 bits of deadline are enough: every deadline in the ring lies within `slots` plus the
/// overdue span of `elapsed`, far less than 2^32 ticks, and [`Ring::deadline_of`] restores
/// the full value. Packing keeps an index entry at 16 bytes with its key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Pos(u64);

// === impl Pos ===

impl Pos {
    fn new(deadline: u64, at: usize) -> Pos {
        debug_assert!(at <= u32::MAX as usize, "bucket index {at} overflows u32");
        Pos((deadline as u32 as u64) << 32 | at as u64)
    }

    fn deadline_low(self) -> u32 {
        (self.0 >> 32) as u32
    }

    fn at(self) -> usize {
        (self.0 & u32::MAX as u64) as usize
    }
}

/// Restores a full deadline from the 32 bits [`Pos`] keeps, counting back from `newest`, the
/// newest deadline the ring can hold.
fn restore_deadline(newest: u64, pos: Pos) -> u64 {
    let back = (newest as u32).wrapping_sub(pos.deadline_low());
    newest - u64::from(back)
}

/// What [`Ring::touch`] did, so callers can count ring work and notice swept uids.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Touch {
    /// The uid was already filed under the deadline this touch asks for.
    Unchanged,
    /// The uid moved to a later deadline (from a live slot or an overdue bucket).
    Moved,
    /// The uid is not in the ring: it was never inserted, was removed, or was expired.
    NotTracked,
}

// === impl Ring ===

impl Ring {
    /// A ring for a timeout of `window` ticks, its cursor on tick 0.
    ///
    /// # Panics
    /// If `window` is zero: a uid would be due on the tick it was touched.
    pub fn new(window: u64) -> Ring {
        assert!(window >= 1, "a ring needs a window of at least one tick");
        let slots = (0..=window).map(|_| Vec::new()).collect();
        Ring {
            window,
            elapsed: 0,
            slots,
            overdue: VecDeque::new(),
            overdue_len: 0,
            index: HashMap::default(),
            spare: Vec::new(),
        }
    }

    /// Timeout in ticks.
    pub fn window(&self) -> u64 {
        self.window
    }

    /// The last tick the cursor reached.
    pub fn elapsed(&self) -> u64 {
        self.elapsed
    }

    /// Uids in the ring, overdue ones included.
    pub fn len(&self) -> usize {
        self.index.len()
    }

    /// True when no uid is tracked.
    pub fn is_empty(&self) -> bool {
        self.index.is_empty()
    }

    /// Uids the cursor has passed that [`Ring::expire`] has not taken out yet.
    pub fn overdue_len(&self) -> usize {
        self.overdue_len
    }

    /// True when `uid` is tracked (live or overdue).
    pub fn contains(&self, uid: u64) -> bool {
        self.index.contains_key(&uid)
    }

    /// The tick `uid` falls due on, if tracked: its last touch plus the window.
    pub fn deadline(&self, uid: u64) -> Option<u64> {
        self.index.get(&uid).map(|&pos| self.deadline_of(pos))
    }

    /// How many uids fall due `ticks` ticks from now (`1 ..= window + 1`); the silence
    /// picture: those uids have been silent for about `window - ticks` ticks.
    pub fn due_in(&self, ticks: u64) -> usize {
        if ticks == 0 || ticks > self.slot_count() {
            return 0;
        }
        self.slots[self.slot_of(self.elapsed + ticks)].len()
    }

    /// Files `uid` as touched on tick `now`, whether or not it was tracked: a login.
    pub fn insert(&mut self, uid: u64, now: u64) {
        if self.touch(uid, now) == Touch::NotTracked {
            let deadline = self.deadline_for(now);
            let at = self.push(deadline, uid);
            self.index.insert(uid, Pos::new(deadline, at));
        }
        self.debug_check(uid);
    }

    /// Marks activity of a tracked `uid` on tick `now`; an untracked uid stays untracked.
    ///
    /// `now` is the caller's view of the clock and may trail the cursor by a tick (it read
    /// the tick just before the cursor moved); such a touch counts as a touch on `elapsed`.
    pub fn touch(&mut self, uid: u64, now: u64) -> Touch {
        let deadline = self.deadline_for(now);
        let newest = self.newest_deadline();
        let Some(pos) = self.index.get_mut(&uid) else {
            return Touch::NotTracked;
        };
        let old = restore_deadline(newest, *pos);
        if old == deadline {
            return Touch::Unchanged;
        }
        debug_assert!(old < deadline, "uid {uid}: deadline {old} moved back to {deadline}");
        let at = pos.at();
        // File under the new deadline first, updating the index entry in place: one hash
        // lookup for this uid. The new deadline is live, so its slot is never the old bucket.
        let slot = &mut self.slots[(deadline % self.slots.len() as u64) as usize];
        slot.push(uid);
        *pos = Pos::new(deadline, slot.len() - 1);
        self.unlink(old, at);
        self.debug_check(uid);
        Touch::Moved
    }

    /// Stops tracking `uid`; returns whether it was tracked.
    pub fn remove(&mut self, uid: u64) -> bool {
        let Some(pos) = self.index.remove(&uid) else {
            return false;
        };
        self.unlink(self.deadline_of(pos), pos.at());
        true
    }

    /// Moves the cursor to tick `to`, turning every slot it passes into an overdue bucket.
    ///
    /// No slot is skipped however far `to` lies ahead: a late caller still expires every uid
    /// that fell due meanwhile. Costs O(min(to - elapsed, slots)).
    pub fn advance(&mut self, to: u64) {
        debug_assert!(to >= self.elapsed, "ticks only move forward: elapsed={}; to={to}", self.elapsed);
        if to <= self.elapsed {
            return;
        }
        // Only the first `slots` ticks can hold anything: deadlines never lie further out.
        let last_filled = to.min(self.elapsed + self.slot_count());
        for deadline in self.elapsed + 1..=last_filled {
            let slot = self.slot_of(deadline);
            let fresh = self.spare.pop().unwrap_or_default();
            let bucket = std::mem::replace(&mut self.slots[slot], fresh);
            if bucket.is_empty() {
                self.recycle(bucket);
            } else {
                self.overdue_len += bucket.len();
                self.overdue.push_back((deadline, bucket));
            }
        }
        self.elapsed = to;
    }

    /// Takes up to `max` overdue uids out of the ring into `out`; returns how many.
    ///
    /// Chunking lets the caller release its lock and yield between chunks, so a mass expiry
    /// never stalls the runtime for long. Oldest deadlines go first.
    pub fn expire(&mut self, max: usize, out: &mut Vec<u64>) -> usize {
        let mut taken = 0;
        while taken < max {
            let Some((deadline, front)) = self.overdue.front_mut() else {
                break;
            };
            // Popping from the back leaves every other uid's index in the bucket valid.
            let Some(uid) = front.pop() else {
                self.drop_empty_overdue(0);
                continue;
            };
            let pos = self.index.remove(&uid);
            debug_assert!(
                pos.is_some_and(|p| p.deadline_low() == *deadline as u32),
                "uid {uid} in overdue bucket {deadline} but indexed at {pos:?}"
            );
            out.push(uid);
            taken += 1;
        }
        self.overdue_len -= taken;
        if self.overdue.front().is_some_and(|(_, b)| b.is_empty()) {
            self.drop_empty_overdue(0);
        }
        taken
    }

    fn slot_count(&self) -> u64 {
        self.slots.len() as u64
    }

    fn slot_of(&self, deadline: u64) -> usize {
        (deadline % self.slot_count()) as usize
    }

    /// Deadline for a touch on `now`, clamped into the range the slots can hold.
    fn deadline_for(&self, now: u64) -> u64 {
        debug_assert!(now <= self.elapsed + 1, "touch from the future: now={now}; elapsed={}", self.elapsed);
        now.clamp(self.elapsed, self.elapsed + 1) + self.window
    }

    /// The newest deadline the ring can hold.
    fn newest_deadline(&self) -> u64 {
        self.elapsed + self.slot_count()
    }

    fn deadline_of(&self, pos: Pos) -> u64 {
        restore_deadline(self.newest_deadline(), pos)
    }

    /// Position in `overdue` of the bucket for a passed `deadline`.
    fn overdue_at(&self, deadline: u64) -> usize {
        let k = self.overdue.partition_point(|(d, _)| *d < deadline);
        debug_assert!(
            self.overdue.get(k).is_some_and(|(d, _)| *d == deadline),
            "no overdue bucket for deadline {deadline}"
        );
        k
    }

    /// The bucket holding `deadline`: a live slot, or an overdue bucket once passed.
    fn bucket_mut(&mut self, deadline: u64) -> &mut Vec<u64> {
        if deadline > self.elapsed {
            let slot = self.slot_of(deadline);
            &mut self.slots[slot]
        } else {
            let k = self.overdue_at(deadline);
            &mut self.overdue[k].1
        }
    }

    fn push(&mut self, deadline: u64, uid: u64) -> usize {
        debug_assert!(deadline > self.elapsed, "filing uid {uid} under past deadline {deadline}");
        let bucket = self.bucket_mut(deadline);
        bucket.push(uid);
        bucket.len() - 1
    }

    /// Takes the entry at `at` out of `deadline`'s bucket, re-indexing the uid moved into
    /// its place.
    fn unlink(&mut self, deadline: u64, at: usize) {
        let bucket = self.bucket_mut(deadline);
        bucket.swap_remove(at);
        let moved = bucket.get(at).copied();
        let emptied = bucket.is_empty();
        if let Some(moved) = moved {
            if let Some(pos) = self.index.get_mut(&moved) {
                *pos = Pos::new(deadline, at);
            }
        }
        if deadline <= self.elapsed {
            self.overdue_len -= 1;
            if emptied {
                let k = self.overdue_at(deadline);
                self.drop_empty_overdue(k);
            }
        }
    }

    fn drop_empty_overdue(&mut self, k: usize) {
        if let Some((_, bucket)) = self.overdue.remove(k) {
            debug_assert!(bucket.is_empty(), "dropping an overdue bucket that still holds uids");
            self.recycle(bucket);
        }
    }

    /// Keeps an emptied vector for the next slot the cursor empties, up to one per slot.
    fn recycle(&mut self, bucket: Vec<u64>) {
        if self.spare.len() < self.slots.len() && bucket.capacity() > 0 {
            self.spare.push(bucket);
        }
    }

    #[cfg(debug_assertions)]
    fn debug_check(&self, uid: u64) {
        let pos = self.index[&uid];
        let deadline = self.deadline_of(pos);
        let bucket = if deadline > self.elapsed {
            &self.slots[self.slot_of(deadline)]
        } else {
            &self.overdue[self.overdue_at(deadline)].1
        };
        debug_assert_eq!(bucket.get(pos.at()), Some(&uid), "uid {uid} is not where its index says");
    }

    #[cfg(not(debug_assertions))]
    fn debug_check(&self, _uid: u64) {}
}

#[cfg(test)]
mod tests {
    use super::*;

    fn expire_all(ring: &mut Ring) -> Vec<u64> {
        let mut out = Vec::new();
        ring.expire(usize::MAX, &mut out);
        out.sort_unstable();
        out
    }

    #[test]
    fn silent_uid_expires_exactly_window_ticks_after_its_touch() {
        for window in 1..=40 {
            for touched in 0..3 {
                let mut ring = Ring::new(window);
                ring.advance(touched);
                ring.insert(7, touched);
                for t in touched + 1..touched + window {
                    ring.advance(t);
                    assert!(expire_all(&mut ring).is_empty(), "window {window}: early at {t}");
                }
                ring.advance(touched + window);
                assert_eq!(expire_all(&mut ring), vec![7], "window {window}");
                assert!(ring.is_empty());
            }
        }
    }

    #[test]
    fn touch_in_same_tick_does_no_work_and_later_touch_moves() {
        let mut ring = Ring::new(30);
        ring.insert(1, 0);
        assert_eq!(ring.touch(1, 0), Touch::Unchanged);
        ring.advance(1);
        assert_eq!(ring.touch(1, 1), Touch::Moved);
        assert_eq!(ring.deadline(1), Some(31));
        assert_eq!(ring.touch(1, 1), Touch::Unchanged);
        assert_eq!(ring.touch(2, 1), Touch::NotTracked);
        assert!(!ring.contains(2));
    }

    #[test]
    fn touch_between_advance_and_expire_rescues_an_overdue_uid() {
        let mut ring = Ring::new(3);
        ring.insert(1, 0);
        ring.insert(2, 0);
        ring.advance(10);
        assert_eq!(ring.overdue_len(), 2);
        assert_eq!(ring.touch(1, 10), Touch::Moved);
        assert_eq!(ring.overdue_len(), 1);
        assert_eq!(expire_all(&mut ring), vec![2]);
        ring.advance(12);
        assert!(expire_all(&mut ring).is_empty());
        ring.advance(13);
        assert_eq!(expire_all(&mut ring), vec![1]);
    }

    #[test]
    fn expire_respects_the_chunk_size() {
        let mut ring = Ring::new(2);
        for uid in 0..10 {
            ring.insert(uid, 0);
        }
        ring.advance(2);
        let mut out = Vec::new();
        assert_eq!(ring.expire(4, &mut out), 4);
        assert_eq!(ring.expire(4, &mut out), 4);
        assert_eq!(ring.expire(4, &mut out), 2);
        assert_eq!(ring.expire(4, &mut out), 0);
        out.sort_unstable();
        assert_eq!(out, (0..10).collect::<Vec<_>>());
    }

    #[test]
    fn due_in_reads_the_slot_sizes() {
        let mut ring = Ring::new(4);
        ring.insert(1, 0);
        ring.insert(2, 0);
        ring.advance(2);
        ring.insert(3, 2);
        assert_eq!(ring.due_in(2), 2);
        assert_eq!(ring.due_in(4), 1);
        assert_eq!(ring.due_in(1), 0);
        assert_eq!(ring.due_in(0), 0);
        assert_eq!(ring.due_in(99), 0);
    }

    #[test]
    fn stale_touch_counts_as_a_touch_on_the_cursor() {
        let mut ring = Ring::new(5);
        ring.insert(1, 0);
        ring.advance(3);
        assert_eq!(ring.touch(1, 2), Touch::Moved);
        ring.advance(7);
        assert!(expire_all(&mut ring).is_empty());
        ring.advance(8);
        assert_eq!(expire_all(&mut ring), vec![1]);
    }

    #[test]
    fn deadlines_survive_the_32_bit_packing_across_wraparound() {
        let mut ring = Ring::new(3);
        let start = u64::from(u32::MAX) - 2;
        ring.advance(start);
        ring.insert(9, start);
        ring.advance(start + 2);
        assert_eq!(ring.touch(9, start + 2), Touch::Moved);
        ring.advance(start + 4);
        assert!(expire_all(&mut ring).is_empty());
        ring.advance(start + 5);
        assert_eq!(expire_all(&mut ring), vec![9]);
    }
}
