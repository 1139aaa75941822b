//! One ring per timeout class, sharing one cursor: a shard of the registry.
//!
//! Pure like [`Ring`]: integer ticks and uids in, expired uids out. Each class is the card's
//! ring of `window + 1` slots for its own window, so a session of any class goes offline
//! after more than its timeout minus a tick of silence and at most its timeout. A tick
//! advances every ring (a slot each), and a sweep takes what every ring made overdue: it
//! still costs what it expires, plus a step per class.
//!
//! A class's ring is made with its first session: most shards never hold most classes, and
//! a long class's slots (a 30-minute class at a 1 s tick has 1,801) cost memory only where
//! sessions use it.

use crate::config::Class;
use crate::presence::ring::{Handle, Ring, Touch};

/// The rings of one shard; see the module documentation.
#[derive(Debug)]
pub struct ClassRings {
    /// Each class's window in ticks, shortest first.
    windows: Box<[u64]>,
    /// Each class's ring, once a session of it came here.
    rings: Box<[Option<Ring>]>,
    /// The last tick the cursor reached, every ring's.
    elapsed: u64,
}

impl ClassRings {
    /// Rings for classes of `windows` ticks (shortest first), the cursor on tick 0.
    pub fn new(windows: &[u64]) -> ClassRings {
        debug_assert!(windows.windows(2).all(|w| w[0] < w[1]), "classes shortest first: {windows:?}");
        ClassRings { windows: windows.into(), rings: windows.iter().map(|_| None).collect(), elapsed: 0 }
    }

    /// Makes `class`'s ring now rather than with its first session: the default class's, so
    /// a gateway's first logins do not each allocate a shard's ring.
    pub fn prepare(&mut self, class: Class) {
        let (window, elapsed) = (self.windows[class.index()], self.elapsed);
        self.rings[class.index()].get_or_insert_with(|| Ring::starting_at(window, elapsed));
    }

    /// The last tick the cursor reached.
    pub fn elapsed(&self) -> u64 {
        self.elapsed
    }

    /// Files `uid` in `class` as touched on tick `now`: a login.
    pub fn insert(&mut self, class: Class, uid: u64, now: u64) -> Handle {
        let (window, elapsed) = (self.windows[class.index()], self.elapsed);
        self.rings[class.index()].get_or_insert_with(|| Ring::starting_at(window, elapsed)).insert(uid, now)
    }

    /// Marks activity of `uid` of `class`, held by `handle`, on tick `now`.
    pub fn touch(&mut self, class: Class, handle: Handle, uid: u64, now: u64) -> Touch {
        match self.rings[class.index()].as_mut() {
            Some(ring) => ring.touch(handle, uid, now),
            None => Touch::NotTracked,
        }
    }

    /// Stops tracking `uid` of `class`; returns whether it was tracked.
    pub fn remove(&mut self, class: Class, handle: Handle, uid: u64) -> bool {
        self.rings[class.index()].as_mut().is_some_and(|ring| ring.remove(handle, uid))
    }

    /// True when `handle` still holds `uid` in `class` (live or overdue).
    pub fn contains(&self, class: Class, handle: Handle, uid: u64) -> bool {
        self.rings[class.index()].as_ref().is_some_and(|ring| ring.contains(handle, uid))
    }

    /// The tick `uid` was last heard on, if `handle` still holds it in `class`: its deadline
    /// less its class's window. Comparable across classes, unlike deadlines.
    pub fn last_heard(&self, class: Class, handle: Handle, uid: u64) -> Option<u64> {
        let ring = self.rings[class.index()].as_ref()?;
        ring.deadline(handle, uid).map(|d| d.saturating_sub(ring.window()))
    }

    /// Moves every ring's cursor to tick `to` (a ring already there stays).
    pub fn advance(&mut self, to: u64) {
        if to <= self.elapsed {
            return;
        }
        for ring in self.rings.iter_mut().flatten() {
            ring.advance(to);
        }
        self.elapsed = to;
    }

    /// Takes up to `max` overdue uids, of every class, into `out`; returns how many.
    pub fn expire(&mut self, max: usize, out: &mut Vec<u64>) -> usize {
        let mut taken = 0;
        for ring in self.rings.iter_mut().flatten() {
            if taken == max {
                break;
            }
            taken += ring.expire(max - taken, out);
        }
        taken
    }

    /// Uids in `class`'s ring, overdue ones included.
    pub fn len_of(&self, class: Class) -> usize {
        self.rings[class.index()].as_ref().map_or(0, Ring::len)
    }

    /// Uids in every ring, overdue ones included.
    pub fn len(&self) -> usize {
        self.rings.iter().flatten().map(Ring::len).sum()
    }

    /// True when no ring tracks a uid.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The uids of `class` that fall due `ticks` ticks from now, each with its handle,
    /// appended to `out`. Costs what it finds.
    pub fn due_in_each(&self, class: Class, ticks: u64, out: &mut Vec<(u64, Handle)>) {
        if let Some(ring) = &self.rings[class.index()] {
            ring.due_in_each(ticks, out);
        }
    }

    /// Adds to `by_silence[t]` the uids silent for `t` ticks, for `t` below its length; the
    /// rest (silent longer, in long classes) to its last entry. Returns the uids tracked.
    /// Costs a slot read per class and entry, never a read per uid.
    pub fn silence_picture(&self, by_silence: &mut [u64]) -> usize {
        let Some(last) = by_silence.len().checked_sub(1) else {
            return self.len();
        };
        let mut tracked = 0;
        for ring in self.rings.iter().flatten() {
            let window = ring.window();
            let mut counted = 0;
            // Due in k ticks (1 ..= window): touched window - k ticks ago; due in window + 1
            // (touched on the tick not yet begun) counts as silence 0, as the ticker's
            // picture always has.
            let ahead = ring.due_in(window + 1);
            counted += ahead;
            by_silence[0] += ahead as u64;
            for silent in 0..=(last as u64).min(window - 1) {
                let n = ring.due_in(window - silent);
                counted += n;
                by_silence[silent as usize] += n as u64;
            }
            let longer = ring.len() - ring.overdue_len() - counted;
            by_silence[last] += longer as u64;
            tracked += ring.len();
        }
        tracked
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::TimeoutClasses;
    use std::time::Duration;

    fn rings() -> (TimeoutClasses, ClassRings) {
        let s = Duration::from_secs(1);
        let classes = TimeoutClasses::new(10 * s, s, 5 * s, 60 * s, &[20 * s], 1_000).unwrap();
        let windows: Vec<u64> = classes.iter().map(|c| classes.window(c)).collect();
        (classes.clone(), ClassRings::new(&windows))
    }

    fn expire_all(r: &mut ClassRings) -> Vec<u64> {
        let mut out = Vec::new();
        r.expire(usize::MAX, &mut out);
        out.sort_unstable();
        out
    }

    #[test]
    fn each_class_expires_its_window_after_the_last_touch() {
        let (classes, mut r) = rings();
        let by_ms = |ms: u64| classes.for_asked(ms, None);
        let (five, ten, sixty) = (by_ms(5_000), by_ms(10_000), by_ms(60_000));
        let a = r.insert(five, 1, 0);
        let _b = r.insert(ten, 2, 0);
        let c = r.insert(sixty, 3, 0);
        r.advance(4);
        assert!(expire_all(&mut r).is_empty());
        r.advance(5);
        assert_eq!(expire_all(&mut r), [1]);
        assert!(!r.contains(five, a, 1));
        r.advance(10);
        assert_eq!(expire_all(&mut r), [2]);
        // A touch moves the deadline by its own class's window.
        assert_eq!(r.touch(sixty, c, 3, 10), Touch::Moved);
        assert_eq!(r.last_heard(sixty, c, 3), Some(10));
        r.advance(69);
        assert!(expire_all(&mut r).is_empty());
        r.advance(70);
        assert_eq!(expire_all(&mut r), [3]);
        assert!(r.is_empty());
    }

    #[test]
    fn a_ring_made_late_starts_at_the_shared_cursor() {
        let (classes, mut r) = rings();
        let twenty = classes.for_asked(20_000, None);
        r.advance(1_000);
        let h = r.insert(twenty, 9, 1_000);
        assert_eq!(r.last_heard(twenty, h, 9), Some(1_000));
        r.advance(1_019);
        assert!(expire_all(&mut r).is_empty());
        r.advance(1_020);
        assert_eq!(expire_all(&mut r), [9]);
    }

    #[test]
    fn handles_of_one_class_name_nothing_in_another() {
        let (classes, mut r) = rings();
        let (five, ten) = (classes.for_asked(5_000, None), classes.for_asked(10_000, None));
        let h = r.insert(five, 1, 0);
        assert!(r.contains(five, h, 1));
        assert!(!r.contains(ten, h, 1));
        assert_eq!(r.touch(ten, h, 1, 0), Touch::NotTracked);
        assert!(!r.remove(ten, h, 1));
        assert!(r.remove(five, h, 1));
    }

    #[test]
    fn the_silence_picture_counts_every_class_by_ticks_of_silence() {
        let (classes, mut r) = rings();
        let (five, sixty) = (classes.for_asked(5_000, None), classes.for_asked(60_000, None));
        r.insert(five, 1, 0);
        r.insert(sixty, 2, 0);
        r.insert(sixty, 3, 0);
        r.advance(3);
        r.insert(sixty, 4, 3);
        // Entries 0..=10: silence up to the 10 s default window, longer in the last.
        let mut by = [0u64; 11];
        assert_eq!(r.silence_picture(&mut by), 4);
        // Touched on tick 0, seen on tick 3: due in window - 3, silent 3 ticks.
        assert_eq!(by.iter().sum::<u64>(), 4);
        assert_eq!(by[0], 1, "the session of tick 3");
        assert_eq!(by[3], 3, "the three of tick 0");
        r.advance(20);
        by.fill(0);
        r.silence_picture(&mut by);
        assert_eq!(by[10], 3, "silent 17 and 20 ticks, beyond the picture: its last entry");
    }
}
