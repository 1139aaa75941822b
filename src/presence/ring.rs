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
//!
//! Where a uid is filed lives in a slab of entries, one per tracked uid, addressed by a
//! [`Handle`] that [`Ring::insert`] returns and the caller keeps (the gateway keeps it in the
//! session). A touch goes straight to its entry: no hash lookup, no index beside the ring.
//! Each bucket is a vector of handles; an entry knows its bucket (by deadline) and its place
//! in it, so moving a uid is a push onto the new bucket and a `swap_remove` from the old one,
//! fixing the place of the one handle that moved. A sweep walks its buckets in order and
//! reads each entry once, independent reads the CPU overlaps. 16 bytes an entry and 4 a
//! bucket place: about 20 bytes per tracked uid, with the slab grown by an eighth at a time.

use std::collections::VecDeque;

/// Room, in handles, that spare bucket vectors may always hold together; above it, at most
/// twice the tracked uids (see `Ring::spare_room_allowed`).
const SPARE_ROOM_MIN: usize = 1024;

/// Where a tracked uid's entry is; returned by [`Ring::insert`] and passed back by the
/// caller on every later call about that uid.
///
/// A handle stays valid until its uid is removed or expired; then its entry is reused for
/// another insert. Calls check that the entry still holds the uid they name, so a stale
/// handle finds nothing rather than another uid. What they cannot tell apart is a handle
/// of an earlier insert of the *same* uid whose entry that uid got again: callers must
/// retire a uid's handle before inserting the uid anew (the registry ends a session before
/// it files the uid's next login).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Handle(u32);

impl Handle {
    /// A handle that never names an entry: for a session not in any ring.
    pub const NONE: Handle = Handle(u32::MAX);
}

/// `Entry::at` of a free entry; its `deadline` then holds the next free entry.
const FREE: u32 = u32::MAX;

/// End of the free list.
const NIL: u32 = u32::MAX;

/// Smallest growth of the slab, in entries. Small, because the registry keeps 64 rings,
/// whose first slabs alone would otherwise cost every connection (docs/BENCHMARKS.md). Past
/// 512 entries the eighth is larger anyway.
const MIN_GROWTH: usize = 64;

/// One tracked uid: which bucket holds its handle (by the low 32 bits of its deadline;
/// [`restore_deadline`] gives back the full value) and where in it.
///
/// 32 bits of deadline are enough: every deadline in the ring lies within `slots` plus the
/// overdue span of `elapsed`, far less than 2^32 ticks.
#[derive(Debug, Clone, Copy)]
struct Entry {
    uid: u64,
    deadline: u32,
    at: u32,
}

/// Marks `handle`'s entry free and makes it the head of the free list that starts at `free`.
/// A free function, so a sweep can call it while it holds a bucket of the same ring.
fn put_on_free_list(entries: &mut [Entry], free: &mut u32, handle: u32) {
    entries[handle as usize] = Entry { uid: 0, deadline: *free, at: FREE };
    *free = handle;
}

/// Restores a full deadline from its low 32 bits, counting back from `newest`, the newest
/// deadline the ring can hold.
fn restore_deadline(newest: u64, low: u32) -> u64 {
    let back = (newest as u32).wrapping_sub(low);
    newest - u64::from(back)
}

/// What [`Ring::touch`] did, so callers can count ring work and notice swept uids.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Touch {
    /// The uid was already filed under the deadline this touch asks for.
    Unchanged,
    /// The uid moved to a later deadline (from a live slot or an overdue bucket).
    Moved,
    /// The handle does not hold this uid: it was removed or expired.
    NotTracked,
}

/// Sliding slot ring; see the module documentation.
#[derive(Debug)]
pub struct Ring {
    /// Ticks a silent uid survives: the timeout divided by the tick.
    window: u64,
    /// The last tick the cursor reached. Live deadlines lie in `elapsed + 1 ..= elapsed + slots`.
    elapsed: u64,
    /// `window + 1` slots; `slots[d % len]` holds the handles whose deadline is `d`.
    slots: Box<[Vec<u32>]>,
    /// Buckets the cursor has passed but [`Ring::expire`] has not emptied yet, as
    /// `(deadline, handles)`, oldest first; empty buckets are dropped at once. Usually
    /// empty; it only fills between an `advance` and the `expire` calls that follow it.
    overdue: VecDeque<(u64, Vec<u32>)>,
    /// Number of handles in `overdue`, so [`Ring::overdue_len`] is O(1).
    overdue_len: usize,
    /// One entry per handle ever given out; free ones form a list from `free`.
    entries: Vec<Entry>,
    /// First free entry, or [`NIL`].
    free: u32,
    /// Tracked uids.
    len: usize,
    /// Emptied bucket vectors kept for the next bucket that needs room, so a steady ticker
    /// does not allocate (see `grow_from_spare`).
    spare: Vec<Vec<u32>>,
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
            entries: Vec::new(),
            free: NIL,
            len: 0,
            spare: Vec::new(),
        }
    }

    /// A ring for a timeout of `window` ticks, its cursor on tick `elapsed`: one made when
    /// its first uid comes, beside rings that have been moving since tick 0.
    pub fn starting_at(window: u64, elapsed: u64) -> Ring {
        Ring { elapsed, ..Ring::new(window) }
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
        self.len
    }

    /// True when no uid is tracked.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Uids the cursor has passed that [`Ring::expire`] has not taken out yet.
    pub fn overdue_len(&self) -> usize {
        self.overdue_len
    }

    /// True when `handle` still holds `uid` (live or overdue).
    pub fn contains(&self, handle: Handle, uid: u64) -> bool {
        self.entry(handle, uid).is_some()
    }

    /// The tick `uid` falls due on, if `handle` still holds it: its last touch plus the window.
    pub fn deadline(&self, handle: Handle, uid: u64) -> Option<u64> {
        self.entry(handle, uid).map(|e| restore_deadline(self.newest_deadline(), e.deadline))
    }

    /// How many uids fall due `ticks` ticks from now (`1 ..= window + 1`); the silence
    /// picture: those uids have been silent for about `window - ticks` ticks.
    pub fn due_in(&self, ticks: u64) -> usize {
        if ticks == 0 || ticks > self.slot_count() {
            return 0;
        }
        self.slots[self.slot_of(self.elapsed + ticks)].len()
    }

    /// The uids that fall due `ticks` ticks from now (`1 ..= window + 1`), each with its
    /// handle, appended to `out`: those silent for `window - ticks` ticks. Costs what it
    /// finds.
    pub fn due_in_each(&self, ticks: u64, out: &mut Vec<(u64, Handle)>) {
        if ticks == 0 || ticks > self.slot_count() {
            return;
        }
        let bucket = &self.slots[self.slot_of(self.elapsed + ticks)];
        out.extend(bucket.iter().map(|&h| (self.entries[h as usize].uid, Handle(h))));
    }

    /// Files `uid` as touched on tick `now`: a login. The caller keeps the handle for every
    /// later call about this uid, and must not insert a uid it already tracks.
    pub fn insert(&mut self, uid: u64, now: u64) -> Handle {
        let deadline = self.deadline_for(now);
        let handle = self.allocate();
        let at = self.file(deadline, handle);
        self.entries[handle as usize] = Entry { uid, deadline: deadline as u32, at };
        self.len += 1;
        self.debug_check(handle);
        Handle(handle)
    }

    /// Marks activity of `uid`, held by `handle`, on tick `now`.
    ///
    /// `now` is the caller's view of the clock and may trail the cursor by a tick (it read
    /// the tick just before the cursor moved); such a touch counts as a touch on `elapsed`.
    pub fn touch(&mut self, handle: Handle, uid: u64, now: u64) -> Touch {
        let deadline = self.deadline_for(now);
        let newest = self.newest_deadline();
        let Some(entry) = self.entry(handle, uid) else {
            return Touch::NotTracked;
        };
        let old = restore_deadline(newest, entry.deadline);
        if old == deadline {
            return Touch::Unchanged;
        }
        debug_assert!(old < deadline, "uid {uid}: deadline {old} moved back to {deadline}");
        // The new deadline is live, so its slot is never the old bucket.
        let slot = self.slot_of(deadline);
        let bucket = &mut self.slots[slot];
        bucket.push(handle.0);
        let at = (bucket.len() - 1) as u32;
        self.unlink(old, entry.at);
        self.entries[handle.0 as usize] = Entry { uid, deadline: deadline as u32, at };
        self.debug_check(handle.0);
        Touch::Moved
    }

    /// Stops tracking `uid`, held by `handle`; returns whether it was tracked.
    pub fn remove(&mut self, handle: Handle, uid: u64) -> bool {
        let Some(entry) = self.entry(handle, uid) else {
            return false;
        };
        self.unlink(restore_deadline(self.newest_deadline(), entry.deadline), entry.at);
        self.release(handle.0);
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
            // The slot starts over empty: its first push that needs room takes a spare.
            let bucket = std::mem::take(&mut self.slots[slot]);
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
            // Taking from the back leaves every other handle's place in the bucket valid.
            let keep = front.len().saturating_sub(max - taken);
            let deadline = *deadline as u32;
            for &handle in &front[keep..] {
                let entry = self.entries[handle as usize];
                debug_assert!(
                    entry.at != FREE && entry.deadline == deadline,
                    "handle {handle} in overdue bucket {deadline} but filed as {entry:?}"
                );
                out.push(entry.uid);
                put_on_free_list(&mut self.entries, &mut self.free, handle);
            }
            let here = front.len() - keep;
            front.truncate(keep);
            let emptied = front.is_empty();
            taken += here;
            // Counted before the bucket is recycled, which keeps room by the uids left.
            self.overdue_len -= here;
            self.len -= here;
            if emptied {
                self.drop_empty_overdue(0);
            }
        }
        // Fewer uids, less spare room: what an expiry emptied is not kept at its size.
        while self.spare_room() > self.spare_room_allowed() {
            self.spare.pop();
        }
        taken
    }

    /// The entry `handle` names, if it holds `uid`.
    fn entry(&self, handle: Handle, uid: u64) -> Option<Entry> {
        self.entries.get(handle.0 as usize).copied().filter(|e| e.at != FREE && e.uid == uid)
    }

    /// A free entry, from the free list or a grown slab. The slab grows by an
    /// eighth, not by doubling: at 10 M uids doubling would leave up to 160 MB unused.
    fn allocate(&mut self) -> u32 {
        if self.free != NIL {
            let handle = self.free;
            self.free = self.entries[handle as usize].deadline;
            return handle;
        }
        let handle = self.entries.len();
        assert!(handle < FREE as usize, "a ring holds fewer than 2^32 - 1 uids");
        if self.entries.len() == self.entries.capacity() {
            self.entries.reserve_exact((self.entries.len() / 8).max(MIN_GROWTH));
        }
        // A placeholder: the caller fills the entry in once it knows the entry's place.
        self.entries.push(Entry { uid: 0, deadline: 0, at: FREE });
        handle as u32
    }

    /// Stops tracking the uid of `handle`'s entry (already out of its bucket).
    fn release(&mut self, handle: u32) {
        put_on_free_list(&mut self.entries, &mut self.free, handle);
        self.len -= 1;
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
    fn bucket_mut(&mut self, deadline: u64) -> &mut Vec<u32> {
        if deadline > self.elapsed {
            let slot = self.slot_of(deadline);
            &mut self.slots[slot]
        } else {
            let k = self.overdue_at(deadline);
            &mut self.overdue[k].1
        }
    }

    fn file(&mut self, deadline: u64, handle: u32) -> u32 {
        debug_assert!(deadline > self.elapsed, "filing handle {handle} under past deadline {deadline}");
        let slot = self.slot_of(deadline);
        if self.slots[slot].len() == self.slots[slot].capacity() {
            self.grow_from_spare(slot);
        }
        let bucket = &mut self.slots[slot];
        bucket.push(handle);
        (bucket.len() - 1) as u32
    }

    /// Before a full bucket grows, hands it the roomiest spare vector if that one is larger.
    ///
    /// When every client sends every tick, each bucket in turn fills with nearly all uids
    /// while the one before drains. Kept in their slots, drained buckets held room for every
    /// uid in each of the `window + 1` slots; shrunk and grown again instead, they left the
    /// allocator's heap as fragmented (docs/BENCHMARKS.md has both). Handed on, the same two
    /// or three vectors serve every tick.
    fn grow_from_spare(&mut self, slot: usize) {
        let roomiest = self.spare.iter().enumerate().max_by_key(|(_, v)| v.capacity()).map(|(i, v)| (i, v.capacity()));
        let Some((i, room)) = roomiest else {
            return;
        };
        if room <= self.slots[slot].capacity() {
            return;
        }
        let mut roomy = self.spare.swap_remove(i);
        roomy.extend_from_slice(&self.slots[slot]);
        let small = std::mem::replace(&mut self.slots[slot], roomy);
        self.recycle(small);
    }

    /// Takes the handle at `at` out of `deadline`'s bucket, fixing the place of the handle
    /// moved into its place.
    fn unlink(&mut self, deadline: u64, at: u32) {
        let bucket = self.bucket_mut(deadline);
        bucket.swap_remove(at as usize);
        let moved = bucket.get(at as usize).copied();
        let emptied = bucket.is_empty();
        if let Some(moved) = moved {
            self.entries[moved as usize].at = at;
        }
        if deadline > self.elapsed {
            if emptied {
                // Its room goes to whichever bucket fills next.
                let slot = self.slot_of(deadline);
                let drained = std::mem::take(&mut self.slots[slot]);
                self.recycle(drained);
            }
        } else {
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

    /// Room the spare vectors hold together, in handles.
    fn spare_room(&self) -> usize {
        self.spare.iter().map(Vec::capacity).sum()
    }

    /// The most room spare vectors may hold: twice the tracked uids, or [`SPARE_ROOM_MIN`].
    fn spare_room_allowed(&self) -> usize {
        (2 * self.len).max(SPARE_ROOM_MIN)
    }

    /// Keeps an emptied vector for reuse, up to one per slot and within
    /// [`Ring::spare_room_allowed`]: a mass expiry's buckets are freed, not kept at their size.
    fn recycle(&mut self, mut bucket: Vec<u32>) {
        if bucket.capacity() == 0 || self.spare.len() >= self.slots.len() {
            return;
        }
        if self.spare_room() + bucket.capacity() <= self.spare_room_allowed() {
            bucket.clear();
            self.spare.push(bucket);
        }
    }

    /// An entry's bucket holds its handle at its place: "a uid sits in one slot".
    #[cfg(debug_assertions)]
    fn debug_check(&self, handle: u32) {
        let entry = self.entries[handle as usize];
        let deadline = restore_deadline(self.newest_deadline(), entry.deadline);
        let bucket = if deadline > self.elapsed {
            &self.slots[self.slot_of(deadline)]
        } else {
            &self.overdue[self.overdue_at(deadline)].1
        };
        debug_assert_eq!(bucket.get(entry.at as usize), Some(&handle), "uid {} is not where its entry says", entry.uid);
    }

    #[cfg(not(debug_assertions))]
    fn debug_check(&self, _handle: u32) {}
}

#[cfg(test)]
mod tests {
    #[test]
    fn due_in_each_names_the_uids_due_that_many_ticks_ahead() {
        let mut ring = Ring::new(10);
        let a = ring.insert(1, 0);
        let b = ring.insert(2, 0);
        ring.advance(3);
        let c = ring.insert(3, 3);
        let mut out = Vec::new();
        ring.due_in_each(7, &mut out);
        out.sort_by_key(|(uid, _)| *uid);
        assert_eq!(out, [(1, a), (2, b)], "touched on tick 0, due on 10");
        out.clear();
        ring.due_in_each(10, &mut out);
        assert_eq!(out, [(3, c)]);
        ring.touch(a, 1, 3);
        out.clear();
        ring.due_in_each(7, &mut out);
        assert_eq!(out, [(2, b)], "a touch moves it out");
        out.clear();
        ring.due_in_each(0, &mut out);
        ring.due_in_each(12, &mut out);
        assert!(out.is_empty());
    }

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

    /// Room held by every bucket of the ring, in handles.
    fn bucket_room(ring: &Ring) -> usize {
        let buckets = ring.slots.iter().chain(ring.spare.iter()).chain(ring.overdue.iter().map(|(_, b)| b));
        buckets.map(Vec::capacity).sum()
    }

    #[test]
    fn buckets_give_back_their_room_as_uids_move_on() {
        const UIDS: u64 = 10_000;
        let mut ring = Ring::new(30);
        let handles: Vec<Handle> = (0..UIDS).map(|uid| ring.insert(uid, 0)).collect();
        // Every uid active on every tick: each bucket in turn fills with all of them.
        for now in 1..=90 {
            ring.advance(now);
            for (uid, &h) in handles.iter().enumerate() {
                assert_eq!(ring.touch(h, uid as u64, now), Touch::Moved);
            }
        }
        let room = bucket_room(&ring);
        // The bucket filling, the one draining, and one spare, each with room for at most
        // twice the uids (a vector doubles), not one bucket's worth in every slot.
        let bound = 3 * 2 * UIDS as usize;
        assert!(room <= bound, "buckets hold room for {room} handles for {UIDS} uids (bound {bound})");
        // A mass expiry leaves no bucket at its size either.
        ring.advance(200);
        assert_eq!(ring.expire(usize::MAX, &mut Vec::new()), UIDS as usize);
        assert!(bucket_room(&ring) <= SPARE_ROOM_MIN, "{}", bucket_room(&ring));
    }

    #[test]
    fn touch_in_same_tick_does_no_work_and_later_touch_moves() {
        let mut ring = Ring::new(30);
        let h = ring.insert(1, 0);
        assert_eq!(ring.touch(h, 1, 0), Touch::Unchanged);
        ring.advance(1);
        assert_eq!(ring.touch(h, 1, 1), Touch::Moved);
        assert_eq!(ring.deadline(h, 1), Some(31));
        assert_eq!(ring.touch(h, 1, 1), Touch::Unchanged);
        assert_eq!(ring.touch(h, 2, 1), Touch::NotTracked, "the handle holds another uid");
        assert_eq!(ring.touch(Handle::NONE, 1, 1), Touch::NotTracked);
        assert!(!ring.contains(h, 2));
    }

    #[test]
    fn a_stale_handle_finds_nothing_once_its_entry_holds_another_uid() {
        let mut ring = Ring::new(3);
        let old = ring.insert(1, 0);
        assert!(ring.remove(old, 1));
        assert!(!ring.remove(old, 1), "removed twice");
        let new = ring.insert(2, 0);
        assert_eq!(new, old, "the entry is reused");
        assert_eq!(ring.touch(old, 1, 0), Touch::NotTracked);
        assert!(ring.contains(new, 2));
        assert_eq!(ring.len(), 1);
    }

    #[test]
    fn touch_between_advance_and_expire_rescues_an_overdue_uid() {
        let mut ring = Ring::new(3);
        let h1 = ring.insert(1, 0);
        ring.insert(2, 0);
        ring.advance(10);
        assert_eq!(ring.overdue_len(), 2);
        assert_eq!(ring.touch(h1, 1, 10), Touch::Moved);
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
        assert!(ring.is_empty());
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
        let h = ring.insert(1, 0);
        ring.advance(3);
        assert_eq!(ring.touch(h, 1, 2), Touch::Moved);
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
        let h = ring.insert(9, start);
        ring.advance(start + 2);
        assert_eq!(ring.touch(h, 9, start + 2), Touch::Moved);
        ring.advance(start + 4);
        assert!(expire_all(&mut ring).is_empty());
        ring.advance(start + 5);
        assert_eq!(expire_all(&mut ring), vec![9]);
    }

    #[test]
    fn an_entry_stays_sixteen_bytes() {
        // 16 bytes an entry and 4 a bucket place: the footprint goal of 24 bytes per uid.
        assert_eq!(std::mem::size_of::<Entry>(), 16);
    }
}
