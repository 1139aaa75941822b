//! The session registry: uid -> current session, kept consistent with the ring.
//!
//! Two structures, each sharded so no frame takes a global lock:
//! - `sessions`, a `DashMap` from uid to the session that owns it now;
//! - `rings`, [`RING_SHARDS`] rings behind their own mutexes, a uid always in the same one.
//!
//! Invariant: a live uid is in `sessions` and in its ring together, except between the sweep
//! that takes it out of the ring and [`Registry::finish_expired`], which then ends and removes
//! the session. Everything that changes both takes the `sessions` entry first, then the ring
//! shard, then (to log an event) the event log's lock; the per-frame path takes only the ring
//! shard, and only when the tick changed.
//!
//! Callers pass the tick their frame was read on, from the [`crate::Clock`]. A shard whose
//! cursor trails that tick (the ticker has not run yet, or the process stalled) is moved up
//! to it first, so a frame read just after a tick boundary counts on the new tick, never on
//! the old one: that is what keeps every silence above `timeout - tick`.

use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use bytes::Bytes;
use dashmap::mapref::entry::Entry;
use dashmap::DashMap;
use foldhash::fast::RandomState;

use crate::metrics::Metrics;
use crate::presence::clock::unix_ms;
use crate::presence::events::EventLog;
use crate::presence::ring::{Ring, Touch};
use crate::presence::{Outboxes, Pushed, Session};
use crate::proto::CloseReason;

/// Ring shards. Touches on different shards never contend, and a sweep holds one shard at a
/// time, so a mass expiry stalls touches on 1/64 of the uids for one chunk at most.
const RING_SHARDS: usize = 64;

/// Whether a frame's activity found its session still online.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Liveness {
    /// The session is online; its deadline now counts from this tick.
    Alive,
    /// The session is over (expired, kicked or closed); the frame is dropped.
    Gone,
}

/// A live session and the tick its uid was last heard on, as presence reports it.
#[derive(Debug, Clone)]
pub struct Sighting {
    pub session: Arc<Session>,
    pub last_heard_tick: u64,
}

/// The gateway's shared state of who is online; see the module documentation.
#[derive(Debug)]
pub struct Registry {
    sessions: DashMap<u64, Arc<Session>, RandomState>,
    rings: Box<[Mutex<Ring>]>,
    window: u64,
    events: Arc<EventLog>,
    /// Pushes waiting for their connections.
    outboxes: Outboxes,
    metrics: Arc<Metrics>,
    /// Next session id. Starts at a random value, so ids from two gateways, or two runs of
    /// one, do not collide in a backend that pairs online and offline events.
    next_session: AtomicU64,
    /// Makes the next sweep panic: a bug injected, for tests of what survives one.
    #[cfg(test)]
    fail_sweeps: std::sync::atomic::AtomicBool,
}

// === impl Registry ===

impl Registry {
    /// An empty registry whose uids expire `window` ticks after their last activity, logging
    /// session events to `events`.
    pub fn new(window: u64, events: Arc<EventLog>, metrics: Arc<Metrics>) -> Registry {
        let salt = std::hash::RandomState::new().hash_one(unix_ms());
        Registry {
            sessions: DashMap::with_hasher(RandomState::default()),
            rings: (0..RING_SHARDS).map(|_| Mutex::new(Ring::new(window))).collect(),
            window,
            events,
            outboxes: Outboxes::default(),
            metrics,
            next_session: AtomicU64::new(salt),
            #[cfg(test)]
            fail_sweeps: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// Number of ring shards, for the ticker's sweep loop.
    pub fn shard_count(&self) -> usize {
        self.rings.len()
    }

    /// The event log this registry reports to.
    pub fn events(&self) -> &Arc<EventLog> {
        &self.events
    }

    /// Logs `uid` in on tick `now`, placing it in the ring. The session's identity is its
    /// `Arc`: an older connection of the same uid holds a different one, so its cleanup can
    /// never end this session.
    ///
    /// A session the uid already had ends: kicked if it was still in the ring, expired if a
    /// sweep had already taken it out. Its offline event goes to the log before this one's
    /// online event.
    pub fn login(&self, uid: u64, now: u64) -> Arc<Session> {
        let id = self.next_session.fetch_add(1, Ordering::Relaxed);
        let since = unix_ms();
        let session = match self.sessions.entry(uid) {
            Entry::Occupied(mut entry) => {
                let mut ring = self.lock_shard_at(uid, now);
                let previous = entry.get();
                // Ended under the ring lock, so the old connection's next touch sees it, and
                // before the uid is filed anew, so the old handle never names the new entry.
                let tracked = ring.remove(previous.handle(), uid);
                previous.end(if tracked { CloseReason::Kicked } else { CloseReason::IdleTimeout });
                let session = Arc::new(Session::new(uid, id, since, ring.insert(uid, now)));
                drop(ring);
                self.events.login(Some(previous), &session);
                entry.insert(session.clone());
                session
            }
            Entry::Vacant(entry) => {
                let handle = self.lock_shard_at(uid, now).insert(uid, now);
                let session = Arc::new(Session::new(uid, id, since, handle));
                self.events.login(None, &session);
                entry.insert(session.clone());
                self.metrics.online_users.inc();
                session
            }
        };
        self.metrics.logins.inc();
        session
    }

    /// Records activity of `session` on tick `now`; the caller skips this call when it
    /// already touched on `now`, so a frame in the same tick does no ring work.
    pub fn touch(&self, session: &Session, now: u64) -> Liveness {
        let mut ring = self.lock_shard_at(session.uid(), now);
        // Checked under the ring lock: a newer login ends this session under the same lock
        // before it files the uid again, and a sweep's finish ends it before it lets go of
        // the uid, so this never touches another session's entry.
        if !session.is_live() {
            return Liveness::Gone;
        }
        self.debug_check_owner(session);
        match ring.touch(session.handle(), session.uid(), now) {
            Touch::NotTracked => Liveness::Gone,
            Touch::Moved | Touch::Unchanged => Liveness::Alive,
        }
    }

    /// Ends `session` for `reason` (logout, disconnect, an error, a kick, a slow consumer),
    /// logs its offline event and forgets it; returns the reason it actually ended with: an
    /// expiry or a kick that came first wins.
    pub fn leave(&self, session: &Arc<Session>, reason: CloseReason) -> CloseReason {
        match self.sessions.entry(session.uid()) {
            Entry::Occupied(entry) if Arc::ptr_eq(entry.get(), session) => {
                let mut ring = self.lock_shard(session.uid());
                ring.remove(session.handle(), session.uid());
                session.end(reason);
                drop(ring);
                self.events.report_ends([&**session]);
                entry.remove();
                self.metrics.online_users.dec();
            }
            _ => {
                // Already replaced or forgotten, which only happens after it ended; reports
                // the ending if whoever ended it has not yet.
                session.end(reason);
                self.events.report_ends([&**session]);
            }
        }
        session.end_reason().unwrap_or(reason)
    }

    /// Ends the live session of `uid` as kicked; returns false if the uid is offline.
    pub fn kick(&self, uid: u64) -> bool {
        let Some(session) = self.live(uid) else {
            return false;
        };
        self.leave(&session, CloseReason::Kicked) == CloseReason::Kicked
    }

    /// Queues a PUSH of `payload` for `uid`; returns whether it was handed to a live
    /// session. A session whose client has let more than `max_queued` bytes pile up is
    /// ended as a slow consumer instead, and counts as offline.
    pub fn push(&self, uid: u64, payload: &Bytes, max_queued: usize) -> bool {
        let Some(session) = self.live(uid) else {
            return false;
        };
        match self.outboxes.push(&session, payload, max_queued) {
            Pushed::Queued => true,
            Pushed::Ended => false,
            Pushed::Full => {
                self.leave(&session, CloseReason::SlowConsumer);
                false
            }
        }
    }

    /// Ends `uid`'s session `session` as kicked, if it is still the live one: another node
    /// took the uid over (and logged the offline event). Returns whether it ended it.
    pub fn kick_session(&self, uid: u64, session: u64) -> bool {
        match self.live(uid) {
            Some(live) if live.id() == session => self.leave(&live, CloseReason::Kicked) == CloseReason::Kicked,
            _ => false,
        }
    }

    /// Every live session now, for a reconcile with a shared store.
    pub fn live_sessions(&self) -> Vec<Arc<Session>> {
        self.sessions.iter().filter(|e| e.value().is_live()).map(|e| e.value().clone()).collect()
    }

    /// Takes the pushes queued for `session`, for its connection to write.
    pub fn take_pushes(&self, session: &Session) -> Vec<Bytes> {
        self.outboxes.take(session)
    }

    /// The live session of `uid`, if any.
    pub fn live(&self, uid: u64) -> Option<Arc<Session>> {
        self.sessions.get(&uid).map(|s| s.clone()).filter(|s| s.is_live())
    }

    /// The live session of `uid` with the tick it was last heard on.
    pub fn sighting(&self, uid: u64) -> Option<Sighting> {
        let session = self.live(uid)?;
        let deadline = self.lock_shard(uid).deadline(session.handle(), uid)?;
        Some(Sighting { session, last_heard_tick: deadline.saturating_sub(self.window) })
    }

    /// Moves every ring's cursor up to tick `to` (shards already there stay). Uids that fell
    /// due become overdue; a touch still rescues them until they are expired.
    pub fn advance(&self, to: u64) {
        for shard in self.rings.iter() {
            catch_up(&mut lock(shard), to);
        }
    }

    /// Takes up to `max` overdue uids of ring shard `shard` into `out`; returns how many.
    /// Holds that shard's lock only for this chunk.
    pub fn expire_chunk(&self, shard: usize, max: usize, out: &mut Vec<u64>) -> usize {
        #[cfg(test)]
        assert!(!self.fail_sweeps.load(Ordering::Relaxed), "injected sweep failure");
        lock(&self.rings[shard]).expire(max, out)
    }

    /// Makes every later sweep panic, as a bug in it would.
    #[cfg(test)]
    pub(crate) fn poison_for_test(&self) {
        self.fail_sweeps.store(true, Ordering::Relaxed);
    }

    /// Ends the sessions of `uids`, which a sweep took out of the ring, unless a uid logged
    /// in again since; logs their offline events as one batch, then forgets them. Returns
    /// how many sessions this call ended.
    pub fn finish_expired(&self, uids: &[u64]) -> usize {
        let mut ended = Vec::with_capacity(uids.len());
        self.end_expired(uids, &mut ended);
        self.report_and_forget(&ended);
        for session in &ended {
            session.wake();
        }
        ended.len()
    }

    /// The first half of [`Registry::finish_expired`], for a sweep that ends its chunks one
    /// by one and logs them all at once: ends the sessions of `uids` (unless a uid logged in
    /// again since) and adds them to `ended`. Their connections are not woken: the caller
    /// wakes them (with [`Session::wake`]) once their offline events are logged.
    ///
    /// End, log, forget, in that order: until a session is forgotten, a new login of its
    /// uid finds it and logs its offline event first, so events stay in order per uid, and
    /// a frame its connection reads meanwhile finds it ended and is dropped.
    pub fn end_expired(&self, uids: &[u64], ended: &mut Vec<Arc<Session>>) {
        for &uid in uids {
            let Entry::Occupied(entry) = self.sessions.entry(uid) else {
                continue;
            };
            // Back in the ring: the uid logged in again since, and the map holds that
            // session, whose login ended the expired one.
            if self.lock_shard(uid).contains(entry.get().handle(), uid) {
                continue;
            }
            if entry.get().end_unwoken(CloseReason::IdleTimeout) {
                ended.push(entry.get().clone());
            }
        }
    }

    /// The second half: logs the offline events of `ended` as one batch, then forgets them.
    pub fn report_and_forget(&self, ended: &[Arc<Session>]) {
        self.events.report_ends(ended.iter().map(|s| &**s));
        for session in ended {
            if self.sessions.remove_if(&session.uid(), |_, s| Arc::ptr_eq(s, session)).is_some() {
                self.metrics.online_users.dec();
            }
        }
    }

    /// Ends every session with `reason`, for shutdown, in one batch of offline events; their
    /// connections send the BYE.
    pub fn end_all(&self, reason: CloseReason) {
        let ended: Vec<Arc<Session>> =
            self.sessions.iter().filter(|e| e.value().end(reason)).map(|e| e.value().clone()).collect();
        self.events.report_ends(ended.iter().map(|s| &**s));
    }

    /// Sessions online now.
    pub fn online(&self) -> usize {
        self.sessions.len()
    }

    /// uids in the rings, and `due[k - 1]` = uids falling due in `k` ticks, summed over
    /// shards (`due` has `window + 1` entries). Costs O(shards x slots), never O(uids).
    pub fn ring_picture(&self, due: &mut [u64]) -> usize {
        due.fill(0);
        let mut tracked = 0;
        for shard in self.rings.iter() {
            let ring = lock(shard);
            tracked += ring.len();
            for (k, n) in due.iter_mut().enumerate() {
                *n += ring.due_in(k as u64 + 1) as u64;
            }
        }
        tracked
    }

    /// A live session is the one the map holds for its uid: whoever replaces or forgets it
    /// ends it first. Checked without waiting (the map's lock comes before the ring's).
    #[cfg(debug_assertions)]
    fn debug_check_owner(&self, session: &Session) {
        if let dashmap::try_result::TryResult::Present(owner) = self.sessions.try_get(&session.uid()) {
            debug_assert!(
                owner.id() == session.id() || !session.is_live(),
                "uid {}: live session {} touched while the map holds session {}",
                session.uid(),
                session.id(),
                owner.id()
            );
        }
    }

    #[cfg(not(debug_assertions))]
    fn debug_check_owner(&self, _session: &Session) {}

    fn lock_shard(&self, uid: u64) -> MutexGuard<'_, Ring> {
        lock(&self.rings[shard_of(uid)])
    }

    /// The uid's ring shard, its cursor moved up to `now` if it trailed.
    fn lock_shard_at(&self, uid: u64, now: u64) -> MutexGuard<'_, Ring> {
        let mut ring = self.lock_shard(uid);
        catch_up(&mut ring, now);
        ring
    }
}

/// Advances `ring` to `to` unless it is there already: the ticker and every connection may
/// move a shard, and whoever comes second has nothing to do.
fn catch_up(ring: &mut Ring, to: u64) {
    if to > ring.elapsed() {
        ring.advance(to);
    }
}

/// Locks a ring shard. A panic elsewhere while holding it cannot leave a ring half-updated
/// in a way later calls trip over (each call restores its invariants before returning), so a
/// poisoned lock is used as is rather than taking the gateway down.
fn lock(shard: &Mutex<Ring>) -> MutexGuard<'_, Ring> {
    shard.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Ring shard of a uid: Fibonacci hashing, so sequential uids spread evenly.
fn shard_of(uid: u64) -> usize {
    const GOLDEN: u64 = 0x9E37_79B9_7F4A_7C15;
    (uid.wrapping_mul(GOLDEN) >> (64 - RING_SHARDS.trailing_zeros())) as usize
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::config::Config;

    fn registry(window: u64) -> Registry {
        let config = Config { timeout: Duration::from_secs(window), ..Config::default() };
        let metrics = Arc::new(Metrics::new(&config));
        let events = Arc::new(EventLog::new(1 << 20, 1 << 30, metrics.clone()));
        Registry::new(window, events, metrics)
    }

    /// Advances to `to` and expires what fell due; returns the uids that went offline.
    fn sweep(reg: &Registry, to: u64) -> Vec<u64> {
        reg.advance(to);
        let mut out = Vec::new();
        for shard in 0..reg.shard_count() {
            reg.expire_chunk(shard, usize::MAX, &mut out);
        }
        reg.finish_expired(&out);
        out.retain(|&uid| reg.live(uid).is_none());
        out.sort_unstable();
        out
    }

    #[test]
    fn shards_spread_sequential_uids() {
        let mut counts = [0usize; RING_SHARDS];
        for uid in 0..64_000 {
            counts[shard_of(uid)] += 1;
        }
        assert!(counts.iter().all(|&c| (900..1100).contains(&c)), "{counts:?}");
    }

    #[test]
    fn login_touch_expire_keep_the_online_gauge_exact() {
        let reg = registry(3);
        let a = reg.login(1, 0);
        let b = reg.login(2, 0);
        assert_eq!(reg.metrics.online_users.get(), 2);
        reg.advance(1);
        assert_eq!(reg.touch(&a, 1), Liveness::Alive);
        assert_eq!(sweep(&reg, 3), vec![2]);
        assert_eq!(b.end_reason(), Some(CloseReason::IdleTimeout));
        assert_eq!(reg.touch(&b, 3), Liveness::Gone);
        assert_eq!(sweep(&reg, 4), vec![1]);
        assert_eq!(reg.metrics.online_users.get(), 0);
        assert_eq!(reg.metrics.logins.get(), 2);
        assert_eq!(reg.online(), 0);
    }

    #[test]
    fn touch_on_a_tick_the_ticker_has_not_reached_counts_on_that_tick() {
        let reg = registry(3);
        let a = reg.login(1, 0);
        let b = reg.login(2, 0);
        // The clock says tick 3 before the ticker ran: uid 1's frame counts on tick 3 and
        // moves its shard, so uid 2 (same shard or not) is due and uid 1 is not.
        assert_eq!(reg.touch(&a, 3), Liveness::Alive);
        assert_eq!(sweep(&reg, 3), vec![2]);
        assert_eq!(b.end_reason(), Some(CloseReason::IdleTimeout));
        assert!(sweep(&reg, 5).is_empty());
        assert_eq!(sweep(&reg, 6), vec![1]);
    }

    #[test]
    fn newer_login_kicks_and_old_cleanup_spares_the_new_session() {
        let reg = registry(3);
        let old = reg.login(5, 0);
        let new = reg.login(5, 0);
        assert_eq!(old.end_reason(), Some(CloseReason::Kicked));
        assert_eq!(reg.touch(&old, 0), Liveness::Gone);
        assert_eq!(reg.leave(&old, CloseReason::Disconnect), CloseReason::Kicked);
        assert_eq!(reg.online(), 1);
        assert_eq!(reg.metrics.online_users.get(), 1);
        assert_eq!(reg.touch(&new, 0), Liveness::Alive);
        assert_eq!(sweep(&reg, 3), vec![5]);
        assert_eq!(new.end_reason(), Some(CloseReason::IdleTimeout));
    }

    /// Sweeps, re-logins and frames of the same few uids race on three threads; touch checks
    /// (in debug builds) that a live session it touches is the one the map holds, which fails
    /// if a sweep forgets a session before it ends it.
    #[test]
    fn sweeps_relogins_and_frames_of_the_same_uids_race_safely() {
        use std::sync::atomic::{AtomicBool, AtomicU64};
        const UIDS: u64 = 8;
        const ROUNDS: u64 = 60_000;
        let reg = Arc::new(registry(1));
        let tick = Arc::new(AtomicU64::new(0));
        let done = Arc::new(AtomicBool::new(false));
        let sessions: Arc<Mutex<Vec<Arc<Session>>>> = Arc::new(Mutex::new(Vec::new()));
        std::thread::scope(|scope| {
            scope.spawn(|| {
                // The ticker: a tick per round, expiring everything one tick old.
                let mut out = Vec::new();
                for t in 1..=ROUNDS {
                    tick.store(t, Ordering::SeqCst);
                    reg.advance(t);
                    for shard in 0..reg.shard_count() {
                        reg.expire_chunk(shard, usize::MAX, &mut out);
                        reg.finish_expired(&out);
                        out.clear();
                    }
                }
                done.store(true, Ordering::SeqCst);
            });
            scope.spawn(|| {
                // Logins, again and again, of the same uids.
                let mut uid = 0;
                while !done.load(Ordering::SeqCst) {
                    let s = reg.login(uid % UIDS, tick.load(Ordering::SeqCst));
                    sessions.lock().unwrap().push(s);
                    uid += 1;
                }
            });
            scope.spawn(|| {
                // Frames on every session ever logged in, the old ones included.
                while !done.load(Ordering::SeqCst) {
                    let all: Vec<Arc<Session>> = sessions.lock().unwrap().iter().rev().take(64).cloned().collect();
                    for s in all {
                        reg.touch(&s, tick.load(Ordering::SeqCst));
                    }
                }
            });
        });
        // Settled: every uid has at most one live session, the one the map holds.
        let all = sessions.lock().unwrap();
        for uid in 0..UIDS {
            let live: Vec<_> = all.iter().filter(|s| s.uid() == uid && s.is_live()).collect();
            assert!(live.len() <= 1, "uid {uid} has {} live sessions", live.len());
            if let Some(s) = live.first() {
                assert_eq!(reg.live(uid).map(|m| m.id()), Some(s.id()));
            }
        }
        assert_eq!(reg.metrics.online_users.get(), reg.online() as i64);
    }

    #[test]
    fn login_after_sweep_before_finish_ends_the_old_session_as_expired() {
        let reg = registry(2);
        let old = reg.login(9, 0);
        reg.advance(2);
        let mut out = Vec::new();
        reg.expire_chunk(shard_of(9), usize::MAX, &mut out);
        assert_eq!(out, vec![9]);
        let new = reg.login(9, 2);
        assert_eq!(old.end_reason(), Some(CloseReason::IdleTimeout));
        assert_eq!(reg.finish_expired(&[9]), 0, "the new session must survive the old sweep");
        assert_eq!(new.end_reason(), None);
        assert_eq!(reg.metrics.online_users.get(), 1);
    }
}
