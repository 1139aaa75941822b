//! The offline grace (`--offline-grace`) of a gateway that runs alone: uids whose last
//! session ended less than the grace ago, whose `user_offline` waits in case they come back.
//!
//! A phone switching from Wi-Fi to LTE drops its connection and logs in again seconds
//! later; the backend should see no user-level flicker. So an ending that leaves a uid with
//! no session holds the uid here instead of logging its `user_offline`; a login of the uid
//! within the grace takes it out again ([`Graces::take`]), and neither that
//! `user_offline` nor the `user_online` the login would have caused is logged. A grace that
//! runs out is the uid's `user_offline`, logged by the registry under the uid's lock.
//!
//! Expiry is a ring of its own, as for sessions: no timer per uid, and a tick's sweep costs
//! what it expires. Its window is the grace plus one tick, so a grace never runs out before
//! the full grace has passed, and at most one tick after. Every call comes from the
//! registry while it holds the uid's entry, which is what makes the `user_offline` exactly
//! once: the login that cancels and the sweep that ends a grace never both succeed.
//!
//! A cluster holds its graces in Redis instead (`cluster/scripts.rs`), where they outlive
//! the node that ended the session.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard};

use foldhash::fast::RandomState;

use crate::presence::clock::Clock;
use crate::presence::ring::{Handle, Ring};
use crate::presence::shards::{lock, shard_of};
use crate::proto::CloseReason;

/// Shards of the graces. Only endings, logins and the sweep come here, never a frame: a
/// few locks keep a reconnect storm from queueing on one.
const GRACE_SHARDS: usize = 16;

/// A uid in its grace: why and when its last session ended, and when the grace ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Held {
    handle: Handle,
    /// The reason its last session ended, for the `user_offline` it owes.
    pub reason: CloseReason,
    /// Unix milliseconds when its last session ended.
    pub ended_ms: u64,
    /// Unix milliseconds when the grace ends; the sweep logs the `user_offline` within a
    /// tick after it.
    pub until_ms: u64,
}

/// uids in their grace; see the module documentation.
#[derive(Debug)]
pub(crate) struct Graces {
    shards: Box<[Mutex<Shard>]>,
    clock: Clock,
    /// The grace in milliseconds, for `until_ms`.
    grace_ms: u64,
    held: AtomicUsize,
    /// Moves into and out of a grace, ever ([`Graces::moves`]).
    moves: AtomicU64,
}

#[derive(Debug)]
struct Shard {
    ring: Ring,
    held: HashMap<u64, Held, RandomState>,
}

// === impl Graces ===

impl Graces {
    /// Graces of `ticks` ticks (at least 1) on `clock`.
    pub(crate) fn new(ticks: u64, clock: Clock) -> Graces {
        debug_assert!(ticks >= 1, "a grace of no time is no grace");
        let shard = || Mutex::new(Shard { ring: Ring::new(ticks + 1), held: HashMap::default() });
        Graces {
            shards: (0..GRACE_SHARDS).map(|_| shard()).collect(),
            clock,
            grace_ms: clock.ticks(ticks).as_millis() as u64,
            held: AtomicUsize::new(0),
            moves: AtomicU64::new(0),
        }
    }

    /// Holds `uid`, whose last session just ended for `reason` at `ended_ms`. The caller
    /// holds the uid's entry and knows it has no live session (so no grace either).
    pub(crate) fn hold(&self, uid: u64, reason: CloseReason, ended_ms: u64) {
        let mut shard = self.lock(uid);
        // The cursor never runs ahead of the clock; `max` only keeps that true by
        // construction.
        let now = self.clock.now().max(shard.ring.elapsed());
        if now > shard.ring.elapsed() {
            shard.ring.advance(now);
        }
        let handle = shard.ring.insert(uid, now);
        self.moves.fetch_add(1, Ordering::Release);
        let held = Held { handle, reason, ended_ms, until_ms: ended_ms + self.grace_ms };
        if let Some(earlier) = shard.held.insert(uid, held) {
            // Not reachable: a uid in grace has no session to end. Keep the ring in step.
            debug_assert!(false, "uid {uid} held twice");
            shard.ring.remove(earlier.handle, uid);
        } else {
            self.held.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// The grace `uid` is in, if any.
    pub(crate) fn of(&self, uid: u64) -> Option<Held> {
        self.lock(uid).held.get(&uid).copied()
    }

    /// uids in their grace now.
    pub(crate) fn len(&self) -> usize {
        self.held.load(Ordering::Relaxed)
    }

    /// Shards, for the sweep.
    pub(crate) fn shard_count(&self) -> usize {
        self.shards.len()
    }

    /// Moves every shard's cursor up to tick `to`.
    pub(crate) fn advance(&self, to: u64) {
        for shard in self.shards.iter() {
            let mut shard = lock(shard);
            if to > shard.ring.elapsed() {
                shard.ring.advance(to);
            }
        }
    }

    /// Takes up to `max` uids whose grace ran out on shard `shard` into `out`; returns how
    /// many. Each is still held until [`Graces::take_expired`] ends it.
    pub(crate) fn expire_chunk(&self, shard: usize, max: usize, out: &mut Vec<u64>) -> usize {
        lock(&self.shards[shard]).ring.expire(max, out)
    }

    /// Ends `uid`'s grace if it ran out (the sweep took it out of the ring) and no login
    /// cancelled it since; the caller holds the uid's entry and logs the `user_offline`.
    pub(crate) fn take_expired(&self, uid: u64) -> Option<Held> {
        let mut shard = self.lock(uid);
        let held = *shard.held.get(&uid)?;
        if shard.ring.contains(held.handle, uid) {
            // A newer grace of the uid, begun after a login cancelled the one swept.
            return None;
        }
        shard.held.remove(&uid);
        self.held.fetch_sub(1, Ordering::Relaxed);
        self.moves.fetch_add(1, Ordering::Release);
        Some(held)
    }

    /// Ends `uid`'s grace now, whether it ran out or not: a login came back (no user event
    /// at all), or shutdown (the caller logs the `user_offline`). The caller holds the uid's
    /// entry.
    pub(crate) fn take(&self, uid: u64) -> Option<Held> {
        let mut shard = self.lock(uid);
        let held = shard.held.remove(&uid)?;
        shard.ring.remove(held.handle, uid);
        self.held.fetch_sub(1, Ordering::Relaxed);
        self.moves.fetch_add(1, Ordering::Release);
        Some(held)
    }

    /// How many times a uid came into a grace or left one, ever: a reader of both the
    /// sessions and the graces that sees it unchanged across its reads saw no uid move
    /// between the two (`Registry::online_uids`).
    pub(crate) fn moves(&self) -> u64 {
        self.moves.load(Ordering::Acquire)
    }

    /// Every uid in its grace now.
    pub(crate) fn uids(&self) -> Vec<u64> {
        self.shards.iter().flat_map(|shard| lock(shard).held.keys().copied().collect::<Vec<_>>()).collect()
    }

    fn lock(&self, uid: u64) -> MutexGuard<'_, Shard> {
        lock(&self.shards[shard_of(uid, GRACE_SHARDS)])
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tokio::time::Instant;

    use super::*;

    fn sweep(graces: &Graces, to: u64) -> Vec<u64> {
        graces.advance(to);
        let mut out = Vec::new();
        for shard in 0..graces.shard_count() {
            graces.expire_chunk(shard, usize::MAX, &mut out);
        }
        out.retain(|&uid| graces.take_expired(uid).is_some());
        out
    }

    #[tokio::test(start_paused = true)]
    async fn a_grace_runs_out_after_the_whole_grace_and_within_one_tick_more() {
        let clock = Clock::new(Instant::now(), Duration::from_secs(1));
        let graces = Graces::new(5, clock);
        tokio::time::advance(Duration::from_millis(300)).await;
        graces.hold(7, CloseReason::IdleTimeout, 1_000);
        assert_eq!(graces.of(7).map(|h| h.until_ms), Some(6_000));
        // Ended at 0.3 s: still held through tick 5 (4.7 s later) ...
        assert!(sweep(&graces, 5).is_empty());
        assert_eq!(graces.len(), 1);
        // ... and out on tick 6, 5.7 s after the ending: more than the grace, less than a tick more.
        assert_eq!(sweep(&graces, 6), [7]);
        assert_eq!((graces.len(), graces.of(7)), (0, None));
    }

    #[tokio::test(start_paused = true)]
    async fn a_cancelled_grace_never_runs_out_and_a_newer_one_is_not_taken_for_it() {
        let clock = Clock::new(Instant::now(), Duration::from_secs(1));
        let graces = Graces::new(2, clock);
        graces.hold(7, CloseReason::Logout, 0);
        assert!(graces.take(7).is_some());
        assert!(graces.take(7).is_none(), "once");
        tokio::time::advance(Duration::from_secs(3)).await;
        assert!(sweep(&graces, 3).is_empty());
        // Swept out of the ring, then cancelled by a login before the registry took it, then
        // held again by that session's end: the new grace stays.
        graces.hold(8, CloseReason::Logout, 0);
        tokio::time::advance(Duration::from_secs(3)).await;
        graces.advance(6);
        let mut out = Vec::new();
        for shard in 0..graces.shard_count() {
            graces.expire_chunk(shard, usize::MAX, &mut out);
        }
        assert_eq!(out, [8]);
        assert!(graces.take(8).is_some());
        graces.hold(8, CloseReason::Kicked, 0);
        assert_eq!(graces.take_expired(8), None);
        assert_eq!(graces.of(8).map(|h| h.reason), Some(CloseReason::Kicked));
        assert_eq!(graces.uids(), [8]);
        assert!(graces.take(8).is_some());
        assert_eq!(graces.len(), 0);
    }
}
