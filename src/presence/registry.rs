//! The session registry: uid -> its sessions (one per device), kept consistent with the ring.
//!
//! Three structures, each sharded so no frame takes a global lock:
//! - `sessions`, a `DashMap` from uid to one of its sessions, the one that leads its list;
//! - `others`, a `DashMap` from uid to the rest of its sessions, present only while a uid
//!   holds more than one (`--max-devices` above 1): with one device per uid, a uid costs
//!   what it cost before devices existed;
//! - `rings`, [`RING_SHARDS`] shards behind their own mutexes, a uid always in the same one,
//!   each shard a ring per timeout class (`class_rings.rs`); each of a uid's sessions has its
//!   own entry in the ring of its class, so each expires on its own, after its own timeout.
//!
//! Invariant: a live session is in its uid's list and in its ring together, except between
//! the sweep that takes it out of the ring and [`Registry::finish_expired`], which then ends
//! it and forgets it. Everything that changes a uid's sessions holds its `sessions` entry,
//! then takes `others`, then the ring shard, then (to log an event) the event log's lock; the
//! per-frame path takes only the ring shard, and only when the tick changed.
//!
//! The uid's entry is also where its user-level transitions are decided: a login that finds
//! no live session is the uid's `user_online`, and an ending that leaves none is its
//! `user_offline` (marked on the session, logged after its `offline`). An ending that only
//! makes room for a new login of the uid (a relogin of the same device, or the least
//! recently active of `--max-devices` sessions) is no user-level transition.
//!
//! With an offline grace (`--offline-grace`, a gateway alone), an ending that leaves a uid
//! with no session holds the uid in its grace (`grace.rs`) instead of marking its
//! `user_offline`; a login within the grace takes it out again and is no `user_online`, and
//! a grace that runs out logs the `user_offline` on its own ([`Registry::finish_graces`]).
//! Each of the three holds the uid's entry, which is what makes that `user_offline` exactly
//! once.
//!
//! Callers pass the tick their frame was read on, from the [`crate::Clock`]. A shard whose
//! cursor trails that tick (the ticker has not run yet, or the process stalled) is moved up
//! to it first, so a frame read just after a tick boundary counts on the new tick, never on
//! the old one: that is what keeps every silence above `timeout - tick`.

use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

#[cfg(test)]
use bytes::Bytes;
use dashmap::mapref::entry::Entry;
use dashmap::DashMap;
use foldhash::fast::RandomState;

use crate::config::TimeoutClasses;
use crate::metrics::Metrics;
use crate::presence::class_rings::ClassRings;
use crate::presence::clock::{unix_ms, Clock};
use crate::presence::events::{EventId, EventLog};
use crate::presence::expiries::Expiries;
use crate::presence::grace::Graces;
use crate::presence::ring::Touch;
use crate::presence::session::{Ending, Traits};
use crate::presence::shards::{self, lock};
use crate::presence::watch::UserState;
use crate::presence::{Outboxes, Push, Pushed, Reach, Session, Subscriptions};
use crate::proto::{CloseReason, Device};

/// Ring shards. Touches on different shards never contend, and a sweep holds one shard at a
/// time, so a mass expiry stalls touches on 1/64 of the uids for one chunk at most.
const RING_SHARDS: usize = 64;

/// Whether a frame's activity found its session still online.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Touched {
    /// The session is online; its deadline now counts from this tick.
    Alive,
    /// The session is over (expired, kicked or closed); the frame is dropped.
    Gone,
}

/// A live session and the tick it was last heard on, as presence reports it.
#[derive(Debug, Clone)]
pub struct Sighting {
    pub session: Arc<Session>,
    pub last_heard_tick: u64,
}

/// A uid's entry in `sessions`, held while its sessions change.
type Held<'a> = Entry<'a, u64, Arc<Session>>;

/// The gateway's shared state of who is online; see the module documentation.
#[derive(Debug)]
pub struct Registry {
    sessions: DashMap<u64, Arc<Session>, RandomState>,
    /// A uid's sessions after the one in `sessions`, oldest login first; only while it has
    /// more than one.
    others: DashMap<u64, Vec<Arc<Session>>, RandomState>,
    rings: Box<[Mutex<ClassRings>]>,
    classes: TimeoutClasses,
    /// Sessions a uid may hold at once (`--max-devices`).
    max_devices: usize,
    events: Arc<EventLog>,
    /// Pushes waiting for their connections.
    outboxes: Outboxes,
    /// MQTT sessions' topic filters: which pushes they take.
    subscriptions: Subscriptions,
    metrics: Arc<Metrics>,
    /// uids whose last session ended within the offline grace; `None` without one (or in a
    /// cluster, whose graces live in its store).
    graces: Option<Graces>,
    /// When sessions' tokens expire (`--enforce-token-expiry`); `None` when not enforced.
    expiries: Option<Expiries>,
    /// Next session id. Starts at a random value, so ids from two gateways, or two runs of
    /// one, do not collide in a backend that pairs online and offline events.
    next_session: AtomicU64,
    /// Makes the next sweep panic: a bug injected, for tests of what survives one.
    #[cfg(test)]
    fail_sweeps: std::sync::atomic::AtomicBool,
}

/// How often a page of online uids is read again when uids moved between a session and an
/// offline grace while it was read: each read costs a pass over the uids, and a move needs a
/// login or an ending of that very uid during the pass, so more than a few in a row means
/// a storm of them, and the last read is answered.
const ONLINE_PAGE_READS: usize = 8;

// === impl Registry ===

impl Registry {
    /// An empty registry whose sessions expire `window` ticks after their last activity
    /// (one timeout class), one session per uid, logging session events to `events`.
    pub fn new(window: u64, events: Arc<EventLog>, metrics: Arc<Metrics>) -> Registry {
        Registry::with_devices(window, 1, events, metrics)
    }

    /// The same, with up to `max_devices` sessions per uid (at least 1).
    pub fn with_devices(window: u64, max_devices: usize, events: Arc<EventLog>, metrics: Arc<Metrics>) -> Registry {
        let classes =
            TimeoutClasses::single(std::time::Duration::from_millis(window), std::time::Duration::from_millis(1));
        Registry::with_classes(classes, max_devices, events, metrics)
    }

    /// An empty registry with the timeout classes `classes` (a session not told its class
    /// gets the default) and up to `max_devices` sessions per uid (at least 1).
    pub fn with_classes(
        classes: TimeoutClasses,
        max_devices: usize,
        events: Arc<EventLog>,
        metrics: Arc<Metrics>,
    ) -> Registry {
        let salt = std::hash::RandomState::new().hash_one(unix_ms());
        let windows: Vec<u64> = classes.iter().map(|c| classes.window(c)).collect();
        Registry {
            sessions: DashMap::with_hasher(RandomState::default()),
            others: DashMap::with_hasher(RandomState::default()),
            rings: (0..RING_SHARDS)
                .map(|_| {
                    // The default class's ring from the start: most sessions use it.
                    let mut rings = ClassRings::new(&windows);
                    rings.prepare(classes.default_class());
                    Mutex::new(rings)
                })
                .collect(),
            classes,
            max_devices: max_devices.max(1),
            events,
            outboxes: Outboxes::default(),
            subscriptions: Subscriptions::default(),
            metrics,
            graces: None,
            expiries: None,
            next_session: AtomicU64::new(salt),
            #[cfg(test)]
            fail_sweeps: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// The same, holding each uid's `user_offline` for an offline grace of `ticks` ticks of
    /// `clock` (none when 0).
    pub fn with_offline_grace(mut self, ticks: u64, clock: Clock) -> Registry {
        self.graces = (ticks > 0).then(|| Graces::new(ticks, clock));
        self
    }

    /// The same, ending each session whose token expires (see [`Registry::expire_at`]) on
    /// the tick it does, as `token_expired`.
    pub fn with_token_expiry(mut self) -> Registry {
        self.expiries = Some(Expiries::default());
        self
    }

    /// `session` ends as `token_expired` on tick `tick` (again on a refresh: the new tick
    /// replaces the old), when token expiry is enforced.
    pub fn expire_at(&self, session: &Arc<Session>, tick: u64) {
        if let Some(expiries) = &self.expiries {
            expiries.set(session, tick);
        }
    }

    /// Forgets `session`'s token expiry: its connection closed.
    pub fn forget_expiry(&self, session: &Session) {
        if let Some(expiries) = &self.expiries {
            expiries.forget(session);
        }
    }

    /// Ends up to `max` sessions whose token expired on or before tick `now`, as
    /// `token_expired`; returns how many expiries it took (ended or already over).
    pub fn end_expired_tokens(&self, now: u64, max: usize, scratch: &mut Vec<Arc<Session>>) -> usize {
        let Some(expiries) = &self.expiries else { return 0 };
        let taken = expiries.take_due(now, max, scratch);
        for session in scratch.drain(..) {
            // An ending that came first (a kick, the client's close) keeps its reason.
            self.leave(&session, CloseReason::TokenExpired);
        }
        taken
    }

    /// Sessions whose token expiry is held.
    pub fn token_expiries(&self) -> usize {
        self.expiries.as_ref().map_or(0, Expiries::len)
    }

    /// Number of ring shards, for the ticker's sweep loop.
    pub fn shard_count(&self) -> usize {
        self.rings.len()
    }

    /// The event log this registry reports to.
    pub fn events(&self) -> &Arc<EventLog> {
        &self.events
    }

    /// Logs `uid` in on `device` on tick `now`, placing the new session in the ring. A
    /// session's identity is its `Arc`: an older connection holds a different one, so its
    /// cleanup can never end this session.
    ///
    /// Before the new session is filed, the uid's sessions a sweep already took out of the
    /// ring end as expired; then a live session of the same device ends as kicked, or, if
    /// the uid holds `--max-devices` live sessions, its least recently active one does
    /// (evicted). Their offline events go to the log before this one's online event.
    pub fn login(&self, uid: u64, device: Device, now: u64) -> Arc<Session> {
        self.login_as(uid, device, now, Traits::default())
    }

    /// Logs in an MQTT session, as [`Registry::login`] does: one that takes only the pushes
    /// its subscriptions match.
    pub fn login_subscriber(&self, uid: u64, device: Device, now: u64) -> Arc<Session> {
        self.login_as(uid, device, now, Traits { filters_pushes: true, ..Traits::default() })
    }

    /// Logs in a session that takes only the pushes its subscriptions match
    /// (`filters_pushes`, MQTT) and whose door can ping its client (`pingable`, WebSocket),
    /// with the `will` its offline event tells (MQTT): logged with its online event, so no
    /// ending can come between the two and lose it.
    pub(crate) fn login_as(&self, uid: u64, device: Device, now: u64, traits: Traits) -> Arc<Session> {
        let Traits { filters_pushes, pingable, will, claims, origin, class } = traits;
        let class = class.unwrap_or(self.classes.default_class());
        let id = self.next_session.fetch_add(1, Ordering::Relaxed);
        let since = unix_ms();
        let held = self.sessions.entry(uid);
        let mut list = self.gather(uid, &held);
        let before = list.len();
        let mut ring = self.lock_shard_at(uid, now);
        // Ended first, before anything is filed again: the ring may give the new session
        // the entry a swept one had, and no live session may keep a handle to it.
        let swept: Vec<usize> = (0..list.len()).filter(|&i| list[i].is_live() && !held_by(&ring, &list[i])).collect();
        let live: Vec<usize> = (0..list.len()).filter(|&i| list[i].is_live() && !swept.contains(&i)).collect();
        for (k, &i) in swept.iter().enumerate() {
            let last = live.is_empty() && k + 1 == swept.len();
            self.end_one(&list[i], CloseReason::IdleTimeout, last);
        }
        let same = live.iter().copied().find(|&i| *list[i].device() == device);
        let evicted = match same {
            Some(_) => None,
            None if live.len() >= self.max_devices => {
                // The least recently active: the earliest last touch (deadlines differ by class),
                // the older login on a tie.
                live.iter().copied().min_by_key(|&i| (last_heard(&ring, &list[i]).unwrap_or(0), i))
            }
            None => None,
        };
        if let Some(i) = same.or(evicted) {
            ring.remove(list[i].class(), list[i].handle(), uid);
            list[i].end_as(CloseReason::Kicked, Ending { last: false, evicted: evicted.is_some() });
        }
        let timeout_ms = u32::try_from(self.classes.timeout_ms(class)).unwrap_or(u32::MAX);
        let session = Session::on_device(uid, device, id, since, ring.insert(class, uid, now))
            .in_class(class, timeout_ms)
            .with_claims(claims)
            .with_origin(origin);
        let session = if filters_pushes { session.filtering_pushes() } else { session };
        let session = Arc::new(if pingable { session.pingable() } else { session });
        drop(ring);
        // A uid in its grace (perhaps since the swept ending above) comes back: no
        // user-level transition either way.
        let returned = live.is_empty() && self.graces.as_ref().is_some_and(|graces| graces.take(uid).is_some());
        self.events.login(unreported(&list), &session, live.is_empty() && !returned, will);
        for s in list.iter().filter(|s| !s.is_live()) {
            s.wake();
        }
        list.retain(|s| s.is_live());
        list.push(session.clone());
        self.store(held, uid, list, before);
        self.metrics.logins.inc();
        session
    }

    /// Records activity of `session` on tick `now`; the caller skips this call when it
    /// already touched on `now`, so a frame in the same tick does no ring work.
    pub fn touch(&self, session: &Session, now: u64) -> Touched {
        let mut ring = self.lock_shard_at(session.uid(), now);
        // Checked under the ring lock: a newer login ends this session under the same lock
        // before it files anything again, and a sweep's finish ends it before it lets go of
        // it, so this never touches another session's entry.
        if !session.is_live() {
            return Touched::Gone;
        }
        self.debug_check_held(session);
        match ring.touch(session.class(), session.handle(), session.uid(), now) {
            Touch::NotTracked => Touched::Gone,
            Touch::Moved | Touch::Unchanged => Touched::Alive,
        }
    }

    /// Ends `session` for `reason` (logout, disconnect, an error, a kick, a slow consumer),
    /// logs its offline event and forgets it; returns the reason it actually ended with: an
    /// expiry or a kick that came first wins.
    pub fn leave(&self, session: &Arc<Session>, reason: CloseReason) -> CloseReason {
        let uid = session.uid();
        let held = self.sessions.entry(uid);
        let mut list = self.gather(uid, &held);
        if list.iter().any(|s| Arc::ptr_eq(s, session)) {
            let before = list.len();
            if session.is_live() {
                let mut ring = self.lock_shard(uid);
                // Only a live session's handle names its own entry (see `login`).
                ring.remove(session.class(), session.handle(), uid);
                let last = !list.iter().any(|s| s.is_live() && !Arc::ptr_eq(s, session));
                if self.end_one(session, reason, last) {
                    session.wake();
                }
            }
            self.events.report_ends(unreported(&list));
            list.retain(|s| s.is_live());
            self.store(held, uid, list, before);
        } else {
            drop(held);
            // Already forgotten, which only happens after it ended and was reported.
            session.end(reason);
            self.events.report_ends([&**session]);
        }
        session.end_reason().unwrap_or(reason)
    }

    /// Ends the live sessions of `uid` (only the one on `device` when given) as kicked;
    /// returns how many it ended.
    pub fn kick(&self, uid: u64, device: Option<&Device>) -> usize {
        self.sessions_of(uid, device)
            .iter()
            .filter(|s| self.leave(s, CloseReason::Kicked) == CloseReason::Kicked)
            .count()
    }

    /// Queues `push` for every live session of `uid` (only the one on `device` when given)
    /// that takes it: every session but an MQTT one none of whose subscriptions matches its
    /// topic. Returns whom it reached. A session whose client has let more than
    /// `max_queued` bytes pile up is ended as a slow consumer instead, and is not counted.
    pub fn push(&self, uid: u64, device: Option<&Device>, push: &Push, max_queued: usize) -> Reach {
        let mut reach = Reach::default();
        for session in self.sessions_of(uid, device) {
            if session.filters_pushes() && !self.subscriptions.takes(session.id(), &push.topic, push.payload.len()) {
                reach.unsubscribed += usize::from(session.is_live());
                continue;
            }
            match self.outboxes.push(&session, push, max_queued) {
                Pushed::Queued => reach.sessions += 1,
                Pushed::Ended => {}
                Pushed::Full => {
                    self.leave(&session, CloseReason::SlowConsumer);
                }
            }
        }
        reach
    }

    /// MQTT sessions' topic filters.
    pub fn subscriptions(&self) -> &Subscriptions {
        &self.subscriptions
    }

    /// Ends `uid`'s session `session` as kicked, if it is still live (and on `device` when
    /// given): another node took it over (and logged the offline event), or the API asked
    /// through another node. Returns whether it ended it.
    pub fn kick_session(&self, uid: u64, session: u64, device: Option<&Device>) -> bool {
        self.live_session(uid, session, device)
            .is_some_and(|live| self.leave(&live, CloseReason::Kicked) == CloseReason::Kicked)
    }

    /// Ends `uid`'s session `session` for `reason`, if it is still live.
    pub fn end_session(&self, uid: u64, session: u64, reason: CloseReason) -> bool {
        self.live_session(uid, session, None).is_some_and(|live| self.leave(&live, reason) == reason)
    }

    /// Wakes the connection of `uid`'s session `session`, if it is live and an MQTT one:
    /// acknowledgements it owes may be due (the cluster has its data).
    pub fn wake_session(&self, uid: u64, session: u64) {
        if let Some(live) = self.live_session(uid, session, None).filter(|s| s.filters_pushes()) {
            live.wake();
        }
    }

    /// `uid`'s live session `session` (on `device` when given), if there is one.
    fn live_session(&self, uid: u64, session: u64, device: Option<&Device>) -> Option<Arc<Session>> {
        self.sessions_of(uid, device).into_iter().find(|s| s.id() == session)
    }

    /// Every live session now, for a reconcile with a shared store.
    pub fn live_sessions(&self) -> Vec<Arc<Session>> {
        let leads = self.sessions.iter().map(|e| e.value().clone());
        let rest: Vec<Arc<Session>> = self.others.iter().flat_map(|e| e.value().clone()).collect();
        leads.chain(rest).filter(|s| s.is_live()).collect()
    }

    /// Sets the status of `session`'s user (empty: clears it) and logs its status event;
    /// false, and nothing changes, if the session has ended.
    pub fn set_status(&self, session: &Session, status: Arc<str>) -> bool {
        // Under the uid's entry, as every change a snapshot of it reads.
        let _held = self.sessions.entry(session.uid());
        self.events.status(session, &status)
    }

    /// Takes the pushes queued for `session`, for its connection to write.
    pub fn take_pushes(&self, session: &Session) -> Vec<Push> {
        self.outboxes.take(session)
    }

    /// Up to `limit` uids online as users (a live session, or in their offline grace), the
    /// smallest above `after`, in order: one page of `GET /v1/online/uids`. A uid online
    /// while the page is read is on it if it is in its range: the page is read again when a
    /// uid moved between a session and a grace meanwhile (every such move holds the uid's
    /// entry and counts in [`Graces::moves`]), up to [`ONLINE_PAGE_READS`] times.
    pub fn online_uids(&self, after: Option<u64>, limit: usize) -> Vec<u64> {
        let mut page = Vec::new();
        for _ in 0..ONLINE_PAGE_READS {
            let moves = self.graces.as_ref().map(Graces::moves);
            let mut smallest = std::collections::BinaryHeap::with_capacity(limit + 1);
            let mut consider = |uid: u64| {
                if after.is_none_or(|after| uid > after) {
                    smallest.push(uid);
                    if smallest.len() > limit {
                        smallest.pop();
                    }
                }
            };
            if let Some(graces) = &self.graces {
                graces.uids().into_iter().for_each(&mut consider);
            }
            for lead in self.sessions.iter() {
                // Read without `is_online`: a second look into this map while its shard is
                // read-locked could wait behind a writer that waits on this reader.
                let live = lead.value().is_live()
                    || (self.max_devices > 1
                        && self.others.get(lead.key()).is_some_and(|rest| rest.iter().any(|s| s.is_live())));
                if live {
                    consider(*lead.key());
                }
            }
            page = smallest.into_sorted_vec();
            page.dedup();
            if self.graces.as_ref().map(Graces::moves) == moves {
                break;
            }
        }
        page
    }

    /// Whether `uid` has a live session.
    pub fn is_online(&self, uid: u64) -> bool {
        match self.sessions.get(&uid) {
            Some(lead) if lead.is_live() => true,
            Some(_) if self.max_devices > 1 => {
                self.others.get(&uid).is_some_and(|rest| rest.iter().any(|s| s.is_live()))
            }
            _ => false,
        }
    }

    /// The live sessions of `uid` (only the one on `device` when given), oldest login first.
    pub fn sessions_of(&self, uid: u64, device: Option<&Device>) -> Vec<Arc<Session>> {
        let Some(lead) = self.sessions.get(&uid) else {
            return Vec::new();
        };
        // Read while the lead's shard is read-locked, so no change of the uid is half seen.
        let mut all = self.with_others(uid, &lead);
        drop(lead);
        all.retain(|s| s.is_live() && device.is_none_or(|d| s.device() == d));
        all
    }

    /// The live sessions of `uid`, each with the tick it was last heard on.
    pub fn sightings(&self, uid: u64) -> Vec<Sighting> {
        let sessions = self.sessions_of(uid, None);
        if sessions.is_empty() {
            return Vec::new();
        }
        let ring = self.lock_shard(uid);
        sessions
            .into_iter()
            .filter_map(|session| {
                let last_heard_tick = last_heard(&ring, &session)?;
                Some(Sighting { session, last_heard_tick })
            })
            .collect()
    }

    /// Asks the connections of the sessions that just passed a third of their timeout in
    /// silence to ping their clients, where their doors can (WebSocket): a browser answers
    /// even from a hidden tab whose timers it throttles to once a minute. Returns how many
    /// it asked. Costs what it finds: one ring slot a shard and class.
    pub fn nudge_silent_third(&self) -> usize {
        let mut due = Vec::new();
        let mut asked = 0;
        for class in self.classes.iter() {
            let window = self.classes.window(class);
            let Some(ahead) = window.checked_sub(window / 3 + 1).filter(|&k| k >= 1) else {
                continue;
            };
            for shard in self.rings.iter() {
                lock(shard).due_in_each(class, ahead, &mut due);
                for (uid, handle) in due.drain(..) {
                    let sessions = self.sessions_of(uid, None);
                    asked += sessions
                        .iter()
                        .filter(|s| s.class() == class && s.handle() == handle && s.request_ping())
                        .count();
                }
            }
        }
        asked
    }

    /// Moves every ring's cursor up to tick `to` (shards already there stay). Sessions that
    /// fell due become overdue; a touch still rescues them until they are expired.
    pub fn advance(&self, to: u64) {
        for shard in self.rings.iter() {
            catch_up(&mut lock(shard), to);
        }
        if let Some(graces) = &self.graces {
            graces.advance(to);
        }
    }

    /// Takes up to `max` overdue sessions of ring shard `shard` into `out`, by uid; returns
    /// how many. Holds that shard's lock only for this chunk.
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

    /// Ends the sessions a sweep took out of the ring for `uids`; logs their offline events
    /// as one batch, then forgets them. Returns how many sessions this call ended.
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
    /// by one and logs them all at once: ends the live sessions of `uids` that are no longer
    /// in the ring (a login since then already ended them) and adds them to `ended`. Their
    /// connections are not woken: the caller wakes them (with [`Session::wake`]) once their
    /// offline events are logged.
    ///
    /// End, log, forget, in that order: until a session is forgotten, a new login or an
    /// ending of its uid finds it and logs its offline event first, so events stay in order
    /// per uid, and a frame its connection reads meanwhile finds it ended and is dropped.
    pub fn end_expired(&self, uids: &[u64], ended: &mut Vec<Arc<Session>>) {
        for &uid in uids {
            let held = self.sessions.entry(uid);
            if matches!(held, Entry::Vacant(_)) {
                continue;
            }
            let list = self.gather(uid, &held);
            let ring = self.lock_shard(uid);
            let swept: Vec<&Arc<Session>> = list.iter().filter(|s| s.is_live() && !held_by(&ring, s)).collect();
            let live_left = list.iter().any(|s| s.is_live() && held_by(&ring, s));
            drop(ring);
            for (k, session) in swept.iter().enumerate() {
                let last = !live_left && k + 1 == swept.len();
                if self.end_one(session, CloseReason::IdleTimeout, last) {
                    self.metrics.expired_in_class(session.class().index());
                    ended.push((*session).clone());
                }
            }
        }
    }

    /// The second half: logs the offline events of `ended` as one batch, then forgets them.
    pub fn report_and_forget(&self, ended: &[Arc<Session>]) {
        self.events.report_ends(ended.iter().map(|s| &**s));
        for session in ended {
            self.forget(session);
        }
    }

    /// Ends every session with `reason`, for shutdown, and logs their offline events; their
    /// connections send the BYE.
    pub fn end_all(&self, reason: CloseReason) {
        let uids: Vec<u64> = self.sessions.iter().map(|e| *e.key()).collect();
        for uid in uids {
            let held = self.sessions.entry(uid);
            let list = self.gather(uid, &held);
            let live: Vec<&Arc<Session>> = list.iter().filter(|s| s.is_live()).collect();
            for (k, session) in live.iter().enumerate() {
                if session.end_as(reason, Ending { last: k + 1 == live.len(), evicted: false }) {
                    session.wake();
                }
            }
            self.events.report_ends(unreported(&list));
        }
        // A gateway alone cannot hold a grace past its own life: each uid still in one
        // goes offline now, as its sessions did before it.
        let Some(graces) = &self.graces else { return };
        for uid in graces.uids() {
            let _held = self.sessions.entry(uid);
            if let Some(grace) = graces.take(uid) {
                self.events.grace_over(uid, grace.reason, grace.ended_ms);
            }
        }
    }

    /// Takes up to `max` uids of grace shard `shard` whose offline grace ran out into
    /// `out`; returns how many (0 without a grace). [`Registry::finish_graces`] logs them.
    pub fn expire_graces(&self, shard: usize, max: usize, out: &mut Vec<u64>) -> usize {
        self.graces.as_ref().map_or(0, |graces| graces.expire_chunk(shard, max, out))
    }

    /// Grace shards, for the ticker's sweep (0 without a grace).
    pub fn grace_shard_count(&self) -> usize {
        self.graces.as_ref().map_or(0, Graces::shard_count)
    }

    /// Logs the `user_offline` of each of `uids` whose grace ran out, unless a login came
    /// back first; returns how many it logged.
    pub fn finish_graces(&self, uids: &[u64]) -> usize {
        let Some(graces) = &self.graces else { return 0 };
        let mut logged = 0;
        for &uid in uids {
            let held = self.sessions.entry(uid);
            // The last session's offline event comes first, if its sweep has not logged it
            // yet (a grace outlasts a tick, so it always has: this only keeps it so).
            self.events.report_ends(unreported(&self.gather(uid, &held)));
            if let Some(grace) = graces.take_expired(uid) {
                self.events.grace_over(uid, grace.reason, grace.ended_ms);
                logged += 1;
            }
        }
        logged
    }

    /// `uid`'s presence as a watcher is told it, and the event log's position it is exact
    /// at: read holding the uid's entry, which every login, ending and grace of the uid
    /// holds while it logs, so no event of the uid up to that position is missing from it
    /// and none after it is in it. (An expiry's `offline` is logged just after its entry is
    /// let go: the state already reads offline, and the event, which changes nothing, is
    /// skipped by the watch index.)
    ///
    /// An online user's `at_ms` is its oldest live session's login (in its offline grace,
    /// when its last session ended): the `user_online` itself is not kept.
    pub fn user_state(&self, uid: u64) -> (UserState, EventId) {
        let held = self.sessions.entry(uid);
        let since = self.gather(uid, &held).iter().filter(|s| s.is_live()).map(|s| s.since_ms()).min();
        let grace = self.graces.as_ref().and_then(|graces| graces.of(uid));
        let (position, status) = self.events.status_at(uid);
        drop(held);
        let state = match (since, grace) {
            (Some(at_ms), _) => UserState { online: true, at_ms, status, last_seen_ms: None },
            (None, Some(grace)) => UserState { online: true, at_ms: grace.ended_ms, status, last_seen_ms: None },
            (None, None) => {
                let last_seen_ms = self.events.last_seen(uid);
                UserState { online: false, at_ms: last_seen_ms.unwrap_or(0), status: Arc::from(""), last_seen_ms }
            }
        };
        (state, position)
    }

    /// When `uid`'s offline grace ends (unix ms), while it is in one: it has no session,
    /// and user-level presence still counts it online.
    pub fn grace_until_ms(&self, uid: u64) -> Option<u64> {
        self.graces.as_ref()?.of(uid).map(|grace| grace.until_ms)
    }

    /// uids in their offline grace now.
    pub fn in_grace(&self) -> usize {
        self.graces.as_ref().map_or(0, Graces::len)
    }

    /// uids with a session now.
    pub fn online(&self) -> usize {
        self.sessions.len()
    }

    /// Sessions in the rings, and `by_silence[t]` = sessions silent for `t` ticks, summed
    /// over shards and classes (longer silences in its last entry). Costs a slot read per
    /// shard, class and entry, never a read per session.
    pub fn ring_picture(&self, by_silence: &mut [u64]) -> usize {
        by_silence.fill(0);
        self.rings.iter().map(|shard| lock(shard).silence_picture(by_silence)).sum()
    }

    /// Sessions in the rings of each class, shortest class first, into `out`.
    pub fn sessions_by_class(&self, out: &mut [u64]) {
        out.fill(0);
        for shard in self.rings.iter() {
            let ring = lock(shard);
            for (class, n) in self.classes.iter().zip(out.iter_mut()) {
                *n += ring.len_of(class) as u64;
            }
        }
    }

    /// The timeout classes sessions get.
    pub fn classes(&self) -> &TimeoutClasses {
        &self.classes
    }

    /// Ends `session` for `reason`, as its uid's last live one when `last`; returns whether
    /// this call ended it. The caller holds the uid's entry. With an offline grace, a last
    /// abrupt ending (not a shutdown's, nor one someone chose: [`CloseReason::is_chosen`])
    /// holds the uid in its grace: its offline event then carries no `user_offline`, which
    /// the grace owes instead.
    fn end_one(&self, session: &Session, reason: CloseReason, last: bool) -> bool {
        let graced = last && reason != CloseReason::Shutdown && !reason.is_chosen() && self.graces.is_some();
        let ended = session.end_as(reason, Ending { last: last && !graced, evicted: false });
        if let Some(graces) = self.graces.as_ref().filter(|_| ended && graced) {
            graces.hold(session.uid(), reason, unix_ms());
        }
        ended
    }

    /// The uid's sessions, the lead first, as `held` finds them.
    fn gather(&self, uid: u64, held: &Held<'_>) -> Vec<Arc<Session>> {
        match held {
            Entry::Occupied(lead) => self.with_others(uid, lead.get()),
            Entry::Vacant(_) => Vec::new(),
        }
    }

    /// `lead` and the uid's other sessions; the caller holds the lead's shard of `sessions`.
    fn with_others(&self, uid: u64, lead: &Arc<Session>) -> Vec<Arc<Session>> {
        let mut list = vec![lead.clone()];
        if self.max_devices > 1 {
            if let Some(rest) = self.others.get(&uid) {
                list.extend(rest.iter().cloned());
            }
        }
        list
    }

    /// Writes the uid's sessions back (the first leads), and moves the gauges by what
    /// changed since it held `before` sessions.
    fn store(&self, held: Held<'_>, uid: u64, mut list: Vec<Arc<Session>>, before: usize) {
        debug_assert!(list.len() <= self.max_devices, "uid {uid} holds {} sessions", list.len());
        let after = list.len();
        let rest = if after > 1 { list.split_off(1) } else { Vec::new() };
        // The rest first, while `held` still locks the uid: written after the lead, a lead
        // already let go of would meet the old rest, and another change of the uid would
        // start from that mix.
        if self.max_devices > 1 {
            if rest.is_empty() {
                self.others.remove(&uid);
            } else {
                self.others.insert(uid, rest);
            }
        }
        match (held, list.pop()) {
            (Entry::Occupied(entry), None) => {
                entry.remove();
            }
            (Entry::Occupied(mut entry), Some(lead)) => {
                entry.insert(lead);
            }
            (Entry::Vacant(entry), Some(lead)) => {
                entry.insert(lead);
            }
            (Entry::Vacant(_), None) => {}
        }
        self.metrics.online_sessions.add(after as i64 - before as i64);
        self.metrics.online_users.add(i64::from(after > 0) - i64::from(before > 0));
    }

    /// Forgets `session`, which ended and was reported, unless a login or an ending of its
    /// uid already did.
    fn forget(&self, session: &Arc<Session>) {
        let uid = session.uid();
        let held = self.sessions.entry(uid);
        let mut list = self.gather(uid, &held);
        let before = list.len();
        list.retain(|s| !Arc::ptr_eq(s, session));
        if list.len() != before {
            self.store(held, uid, list, before);
        }
    }

    /// A live session is in its uid's list: whoever replaces or forgets it ends it first.
    /// Checked without waiting (the map's lock comes before the ring's).
    #[cfg(debug_assertions)]
    fn debug_check_held(&self, session: &Session) {
        if let dashmap::try_result::TryResult::Present(lead) = self.sessions.try_get(&session.uid()) {
            if lead.id() == session.id() || !session.is_live() {
                return;
            }
            if let dashmap::try_result::TryResult::Present(rest) = self.others.try_get(&session.uid()) {
                debug_assert!(
                    rest.iter().any(|s| s.id() == session.id()) || !session.is_live(),
                    "uid {}: live session {} touched while its list does not hold it",
                    session.uid(),
                    session.id(),
                );
            }
        }
    }

    #[cfg(not(debug_assertions))]
    fn debug_check_held(&self, _session: &Session) {}

    fn lock_shard(&self, uid: u64) -> MutexGuard<'_, ClassRings> {
        lock(&self.rings[shard_of(uid)])
    }

    /// The uid's ring shard, its cursor moved up to `now` if it trailed.
    fn lock_shard_at(&self, uid: u64, now: u64) -> MutexGuard<'_, ClassRings> {
        let mut ring = self.lock_shard(uid);
        catch_up(&mut ring, now);
        ring
    }
}

/// The ended sessions of a uid's list whose offline events are not logged yet, in the
/// order they must be: the one whose end left the uid offline (at most one: a later login
/// logs it first) comes last, since `user_offline` closes the uid's events.
fn unreported(list: &[Arc<Session>]) -> impl Iterator<Item = &Session> {
    let unlogged = |last: bool| list.iter().filter(move |s| !s.is_live() && !s.is_reported() && s.was_last() == last);
    unlogged(false).chain(unlogged(true)).map(|s| &**s)
}

/// Advances `ring` to `to` unless it is there already: the ticker and every connection may
/// move a shard, and whoever comes second has nothing to do.
fn catch_up(ring: &mut ClassRings, to: u64) {
    if to > ring.elapsed() {
        ring.advance(to);
    }
}

/// Whether `session`'s entry is still in the ring of its class (not swept).
fn held_by(ring: &ClassRings, session: &Session) -> bool {
    ring.contains(session.class(), session.handle(), session.uid())
}

/// The tick `session` was last heard on, if its ring still holds it.
fn last_heard(ring: &ClassRings, session: &Session) -> Option<u64> {
    ring.last_heard(session.class(), session.handle(), session.uid())
}

/// Ring shard of a uid.
fn shard_of(uid: u64) -> usize {
    shards::shard_of(uid, RING_SHARDS)
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
        out.retain(|&uid| !reg.is_online(uid));
        out.sort_unstable();
        out
    }

    fn registry_with_devices(window: u64, max_devices: usize) -> Registry {
        let config = Config { timeout: Duration::from_secs(window), ..Config::default() };
        let metrics = Arc::new(Metrics::new(&config));
        let events = Arc::new(EventLog::new(1 << 20, 1 << 30, metrics.clone()));
        Registry::with_devices(window, max_devices, events, metrics)
    }

    /// A registry with the classes 5 s to 60 s at a 1 s tick (default 10 s), in ticks.
    fn classed(max_devices: usize) -> (TimeoutClasses, Registry) {
        let s = Duration::from_secs(1);
        let classes = TimeoutClasses::new(10 * s, s, 5 * s, 60 * s, &[], 1_000).expect("classes");
        let config = Config::default();
        let metrics = Arc::new(Metrics::new(&config));
        let events = Arc::new(EventLog::new(1 << 20, 1 << 30, metrics.clone()));
        (classes.clone(), Registry::with_classes(classes, max_devices, events, metrics))
    }

    /// Issue 50: each session goes offline after its own class's timeout, whatever the
    /// others' are.
    #[test]
    fn each_session_expires_after_its_own_class_s_timeout() {
        let (classes, reg) = classed(1);
        let class = |ms: u64| Traits { class: Some(classes.for_asked(ms, None)), ..Traits::default() };
        reg.login_as(1, Device::DEFAULT, 0, class(5_000));
        reg.login_as(2, Device::DEFAULT, 0, class(60_000));
        reg.login(3, Device::DEFAULT, 0);
        assert_eq!(sweep(&reg, 4), Vec::<u64>::new());
        assert_eq!(sweep(&reg, 5), [1]);
        assert_eq!(sweep(&reg, 9), Vec::<u64>::new());
        assert_eq!(sweep(&reg, 10), [3], "the default class, --timeout's");
        assert_eq!(sweep(&reg, 59), Vec::<u64>::new());
        assert_eq!(sweep(&reg, 60), [2]);
    }

    /// Issue 50: at `--max-devices` the session evicted is the least recently heard from,
    /// not the one due first: deadlines of different classes do not compare.
    #[test]
    fn the_least_recently_heard_session_is_evicted_whatever_its_class() {
        let (classes, reg) = classed(2);
        let class = |ms: u64| Traits { class: Some(classes.for_asked(ms, None)), ..Traits::default() };
        let long = reg.login_as(9, "a".parse().unwrap(), 0, class(60_000));
        reg.advance(3);
        let short = reg.login_as(9, "b".parse().unwrap(), 3, class(5_000));
        reg.login(9, "c".parse().unwrap(), 4);
        assert!(!long.is_live(), "heard last on tick 0, though due on tick 60");
        assert!(short.is_live(), "heard on tick 3, though due on tick 8");
    }

    /// An ending that comes right after a login (a takeover from another node, a kick)
    /// still finds the will: it is kept with the online event, not in a later step that
    /// an ending can precede (which lost one will in a hundred-odd racing MQTT logins).
    #[test]
    fn a_will_given_at_login_is_told_however_soon_the_session_ends() {
        let reg = registry(30);
        let will = crate::presence::Will { topic: "gone".into(), payload: Bytes::from_static(b"bye") };
        let traits = Traits { filters_pushes: true, will: Some(Box::new(will.clone())), ..Traits::default() };
        let session = reg.login_as(7, Device::DEFAULT, 1, traits);
        assert_eq!(reg.kick(7, None), 1);
        reg.leave(&session, CloseReason::Kicked);
        let events = reg.events().read(crate::presence::EventId { ms: 0, seq: 0 }).events;
        let told: Vec<_> = events
            .iter()
            .filter_map(|e| match &e.what {
                crate::presence::What::Offline { will, .. } => Some(will.as_deref().cloned()),
                _ => None,
            })
            .collect();
        assert_eq!(told, [Some(will)]);
    }

    fn device(n: u8) -> Device {
        if n == 0 {
            Device::DEFAULT
        } else {
            Device::parse(format!("d{n}").as_bytes()).unwrap()
        }
    }

    #[test]
    fn devices_live_and_expire_on_their_own_and_the_user_events_follow_the_last() {
        let reg = registry_with_devices(3, 2);
        let phone = reg.login(1, device(1), 0);
        let desk = reg.login(1, device(2), 0);
        assert_eq!((reg.metrics.online_users.get(), reg.metrics.online_sessions.get()), (1, 2));
        assert_eq!(reg.touch(&desk, 1), Touched::Alive);
        assert!(sweep(&reg, 3).is_empty(), "the desk keeps the uid online");
        assert_eq!(phone.end_reason(), Some(CloseReason::IdleTimeout));
        assert!(!phone.was_last());
        assert_eq!(reg.sessions_of(1, None).len(), 1);
        assert_eq!(reg.leave(&desk, CloseReason::Logout), CloseReason::Logout);
        assert!(desk.was_last());
        assert_eq!((reg.metrics.online_users.get(), reg.metrics.online_sessions.get()), (0, 0));
    }

    #[test]
    fn a_third_device_evicts_the_least_recently_active_and_a_relogin_only_its_own() {
        let reg = registry_with_devices(5, 2);
        let a = reg.login(1, device(1), 0);
        let b = reg.login(1, device(2), 0);
        reg.touch(&a, 2);
        let c = reg.login(1, device(3), 2);
        assert_eq!((b.end_reason(), b.was_evicted(), b.was_last()), (Some(CloseReason::Kicked), true, false));
        let a2 = reg.login(1, device(1), 3);
        assert_eq!((a.end_reason(), a.was_evicted()), (Some(CloseReason::Kicked), false));
        let live: Vec<u64> = reg.sessions_of(1, None).iter().map(|s| s.id()).collect();
        assert_eq!(live, [c.id(), a2.id()]);
        assert_eq!(reg.kick(1, Some(&device(3))), 1);
        assert_eq!(reg.push(1, None, &push("t"), 1 << 20).sessions, 1);
        assert_eq!(reg.kick(1, None), 1);
        assert!(a2.was_last() && !reg.is_online(1));
    }

    fn push(topic: &str) -> Push {
        Push { topic: Arc::from(topic), payload: Bytes::from_static(b"x") }
    }

    /// An MQTT session takes a push only on a topic it subscribed to, and is not counted
    /// otherwise; the uid's other sessions take every push.
    #[test]
    fn a_subscriber_takes_only_the_topics_it_subscribed_to() {
        let reg = registry_with_devices(5, 3);
        let tcp = reg.login(1, device(1), 0);
        let mqtt = reg.login_subscriber(1, device(2), 0);
        assert!(mqtt.filters_pushes() && !tcp.filters_pushes());
        let reach = reg.push(1, None, &push("idlegate/push"), 1 << 20);
        assert_eq!(reach, Reach { sessions: 1, unsubscribed: 1 });
        reg.subscriptions().subscribe(mqtt.id(), &["idlegate/+".to_string()], 8, u32::MAX);
        assert_eq!(reg.push(1, None, &push("idlegate/push"), 1 << 20), Reach { sessions: 2, unsubscribed: 0 });
        assert_eq!(reg.push(1, None, &push("other"), 1 << 20), Reach { sessions: 1, unsubscribed: 1 });
        assert_eq!(reg.take_pushes(&mqtt).len(), 1, "only the matching push was queued");
        assert_eq!(reg.take_pushes(&tcp).len(), 3);
        assert_eq!(reg.push(1, Some(&device(2)), &push("other"), 1 << 20), Reach { sessions: 0, unsubscribed: 1 });
    }

    /// Two devices of one uid swept in one chunk end together; only the second is the last,
    /// and a login that finds a device swept but not yet finished ends it as expired first.
    #[test]
    fn swept_devices_end_in_order_and_a_login_settles_them_first() {
        let reg = registry_with_devices(2, 3);
        let a = reg.login(4, device(1), 0);
        let b = reg.login(4, device(2), 0);
        reg.advance(2);
        let mut out = Vec::new();
        reg.expire_chunk(shard_of(4), usize::MAX, &mut out);
        assert_eq!(out, [4, 4]);
        // Logged in again before the sweep finished: the ring may hand the new session a
        // swept entry, so the swept sessions must end before it is filed.
        let c = reg.login(4, device(1), 2);
        assert_eq!((a.end_reason(), b.end_reason()), (Some(CloseReason::IdleTimeout), Some(CloseReason::IdleTimeout)));
        assert_eq!([a.was_last(), b.was_last()], [false, true]);
        assert_eq!(reg.finish_expired(&out), 0);
        assert_eq!(reg.touch(&c, 2), Touched::Alive);
        assert_eq!(reg.touch(&a, 2), Touched::Gone);
        assert_eq!(reg.sessions_of(4, None).len(), 1);
    }

    #[derive(Debug, Clone)]
    enum Op {
        Login { uid: u8, device: u8 },
        Touch(u8),
        Leave(u8),
        Kick { uid: u8, device: Option<u8> },
        Tick,
    }

    fn op() -> impl proptest::strategy::Strategy<Value = Op> {
        use proptest::prelude::*;
        prop_oneof![
            4 => (0..3u8, 0..4u8).prop_map(|(uid, device)| Op::Login { uid, device }),
            4 => any::<u8>().prop_map(Op::Touch),
            1 => any::<u8>().prop_map(Op::Leave),
            1 => (0..3u8, proptest::option::of(0..4u8)).prop_map(|(uid, device)| Op::Kick { uid, device }),
            3 => Just(Op::Tick),
        ]
    }

    /// A session as the plain model keeps it.
    #[derive(Debug, Clone)]
    struct Modelled {
        uid: u64,
        device: u8,
        id: u64,
        last: u64,
    }

    proptest::proptest! {
        /// The registry with devices against a plain model: the same live sessions after
        /// every step (the newest login of a device wins; past `max` devices the least
        /// recently active goes; each expires `window` ticks after its last touch), gauges
        /// that agree, and an event log where every session is online once and offline at
        /// most once, and user events mark exactly when a uid came and went.
        #[test]
        fn devices_match_a_plain_model(max in 1..4usize, ops in proptest::collection::vec(op(), 1..120)) {
            const WINDOW: u64 = 3;
            let reg = registry_with_devices(WINDOW, max);
            let start = reg.events().last_id();
            let mut model: Vec<Modelled> = Vec::new();
            let mut all: Vec<Arc<Session>> = Vec::new();
            let mut now = 0;
            for op in ops {
                match op {
                    Op::Login { uid, device: d } => {
                        let uid = u64::from(uid);
                        if let Some(i) = model.iter().position(|m| m.uid == uid && m.device == d) {
                            model.remove(i);
                        } else if model.iter().filter(|m| m.uid == uid).count() >= max {
                            // The least recently active; the older login on a tie.
                            let i = (0..model.len()).filter(|&i| model[i].uid == uid).min_by_key(|&i| (model[i].last, i)).unwrap();
                            model.remove(i);
                        }
                        let s = reg.login(uid, device(d), now);
                        model.push(Modelled { uid, device: d, id: s.id(), last: now });
                        all.push(s);
                    }
                    Op::Touch(pick) if !all.is_empty() => {
                        let s = &all[usize::from(pick) % all.len()];
                        let want = match model.iter_mut().find(|m| m.id == s.id()) {
                            Some(m) => {
                                m.last = now;
                                Touched::Alive
                            }
                            None => Touched::Gone,
                        };
                        proptest::prop_assert_eq!(reg.touch(s, now), want);
                    }
                    Op::Leave(pick) if !all.is_empty() => {
                        let s = all[usize::from(pick) % all.len()].clone();
                        reg.leave(&s, CloseReason::Logout);
                        model.retain(|m| m.id != s.id());
                    }
                    Op::Kick { uid, device: d } => {
                        let uid = u64::from(uid);
                        let hit = |m: &Modelled| m.uid == uid && d.is_none_or(|d| m.device == d);
                        let want = model.iter().filter(|m| hit(m)).count();
                        proptest::prop_assert_eq!(reg.kick(uid, d.map(device).as_ref()), want);
                        model.retain(|m| !hit(m));
                    }
                    Op::Tick => {
                        now += 1;
                        sweep(&reg, now);
                        model.retain(|m| m.last + WINDOW > now);
                    }
                    _ => {}
                }
                for uid in 0..3 {
                    let mut got: Vec<(u64, String)> =
                        reg.sessions_of(uid, None).iter().map(|s| (s.id(), s.device().to_string())).collect();
                    let mut want: Vec<(u64, String)> =
                        model.iter().filter(|m| m.uid == uid).map(|m| (m.id, device(m.device).to_string())).collect();
                    got.sort();
                    want.sort();
                    proptest::prop_assert_eq!(got, want);
                }
                let users = (0..3).filter(|&uid| model.iter().any(|m| m.uid == uid)).count() as i64;
                proptest::prop_assert_eq!(reg.metrics.online_users.get(), users);
                proptest::prop_assert_eq!(reg.metrics.online_sessions.get(), model.len() as i64);
            }
            check_event_log(&reg, start, &model)?;
        }
    }

    /// Every session online once and offline at most once, after its online; per uid, a
    /// `user_online` right after an online that found no session and a `user_offline`
    /// right after the offline that left none, except where a login replaced the session
    /// (its online is the very next event); at the end, online users as the model says.
    fn check_event_log(
        reg: &Registry,
        start: crate::presence::EventId,
        model: &[Modelled],
    ) -> Result<(), proptest::test_runner::TestCaseError> {
        use crate::presence::What;
        let mut events = Vec::new();
        let mut at = start;
        loop {
            let batch = reg.events().read(at);
            let Some(last) = batch.events.last() else { break };
            at = last.id;
            events.extend(batch.events);
        }
        let mut count: std::collections::HashMap<u64, usize> = Default::default();
        let mut user: std::collections::HashMap<u64, bool> = Default::default();
        let mut sessions: std::collections::HashMap<u64, (u32, u32)> = Default::default();
        for (i, e) in events.iter().enumerate() {
            let next = events.get(i + 1).map(|n| (&n.what, n.uid));
            let n = count.entry(e.uid).or_default();
            let online = user.entry(e.uid).or_default();
            match &e.what {
                What::Online { session, .. } => {
                    let entry = sessions.entry(*session).or_default();
                    proptest::prop_assert_eq!(*entry, (0, 0), "online twice or after offline: {:?}", e);
                    entry.0 += 1;
                    let follows = matches!(next, Some((What::UserOnline, uid)) if uid == e.uid);
                    proptest::prop_assert_eq!(follows, !*online, "user_online after {:?}", e);
                    *n += 1;
                    *online = true;
                }
                What::Offline { session, .. } => {
                    let entry = sessions.entry(*session).or_default();
                    proptest::prop_assert_eq!(*entry, (1, 0), "offline without online or twice: {:?}", e);
                    entry.1 += 1;
                    *n -= 1;
                    let follows = matches!(next, Some((What::UserOffline { .. }, uid)) if uid == e.uid);
                    if follows {
                        proptest::prop_assert_eq!(*n, 0, "user_offline with sessions left: {:?}", e);
                        *online = false;
                    } else if *n == 0 {
                        let replaced =
                            matches!(next, Some((What::Online { .. } | What::Offline { .. }, uid)) if uid == e.uid);
                        proptest::prop_assert!(replaced, "the uid's last session ended with no user_offline: {:?}", e);
                    }
                }
                What::UserOnline | What::UserOffline { .. } | What::Data { .. } | What::Status { .. } => {}
            }
        }
        for uid in 0..3 {
            let want = model.iter().any(|m| m.uid == uid);
            proptest::prop_assert_eq!(user.get(&uid).copied().unwrap_or(false), want, "uid {} at the end", uid);
        }
        Ok(())
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
        let a = reg.login(1, Device::DEFAULT, 0);
        let b = reg.login(2, Device::DEFAULT, 0);
        assert_eq!(reg.metrics.online_users.get(), 2);
        reg.advance(1);
        assert_eq!(reg.touch(&a, 1), Touched::Alive);
        assert_eq!(sweep(&reg, 3), vec![2]);
        assert_eq!(b.end_reason(), Some(CloseReason::IdleTimeout));
        assert_eq!(reg.touch(&b, 3), Touched::Gone);
        assert_eq!(sweep(&reg, 4), vec![1]);
        assert_eq!(reg.metrics.online_users.get(), 0);
        assert_eq!(reg.metrics.logins.get(), 2);
        assert_eq!(reg.online(), 0);
    }

    #[test]
    fn touch_on_a_tick_the_ticker_has_not_reached_counts_on_that_tick() {
        let reg = registry(3);
        let a = reg.login(1, Device::DEFAULT, 0);
        let b = reg.login(2, Device::DEFAULT, 0);
        // The clock says tick 3 before the ticker ran: uid 1's frame counts on tick 3 and
        // moves its shard, so uid 2 (same shard or not) is due and uid 1 is not.
        assert_eq!(reg.touch(&a, 3), Touched::Alive);
        assert_eq!(sweep(&reg, 3), vec![2]);
        assert_eq!(b.end_reason(), Some(CloseReason::IdleTimeout));
        assert!(sweep(&reg, 5).is_empty());
        assert_eq!(sweep(&reg, 6), vec![1]);
    }

    #[test]
    fn newer_login_kicks_and_old_cleanup_spares_the_new_session() {
        let reg = registry(3);
        let old = reg.login(5, Device::DEFAULT, 0);
        let new = reg.login(5, Device::DEFAULT, 0);
        assert_eq!(old.end_reason(), Some(CloseReason::Kicked));
        assert_eq!(reg.touch(&old, 0), Touched::Gone);
        assert_eq!(reg.leave(&old, CloseReason::Disconnect), CloseReason::Kicked);
        assert_eq!(reg.online(), 1);
        assert_eq!(reg.metrics.online_users.get(), 1);
        assert_eq!(reg.touch(&new, 0), Touched::Alive);
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
                    let s = reg.login(uid % UIDS, Device::DEFAULT, tick.load(Ordering::SeqCst));
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
                assert_eq!(reg.sessions_of(uid, None).first().map(|m| m.id()), Some(s.id()));
            }
        }
        assert_eq!(reg.metrics.online_users.get(), reg.online() as i64);
    }

    /// Logins of several devices of the same uids, frames on every session ever logged in,
    /// and lookups, on three threads: a touch (in debug builds) and a lookup must always find
    /// a live session in its uid's list, which fails if a change shows the new lead and the
    /// old rest of a list to anyone.
    #[test]
    fn logins_of_many_devices_frames_and_lookups_race_safely() {
        use std::sync::atomic::AtomicBool;
        const UIDS: u64 = 4;
        const LOGINS: u64 = 40_000;
        let reg = Arc::new(registry_with_devices(1_000, 2));
        let done = Arc::new(AtomicBool::new(false));
        let sessions: Arc<Mutex<Vec<Arc<Session>>>> = Arc::new(Mutex::new(Vec::new()));
        std::thread::scope(|scope| {
            scope.spawn(|| {
                for n in 0..LOGINS {
                    let s = reg.login(n % UIDS, device((n / UIDS % 3) as u8), 0);
                    sessions.lock().unwrap().push(s);
                }
                done.store(true, Ordering::SeqCst);
            });
            scope.spawn(|| {
                // Ends on a second writer: a uid's list changes from two threads at once.
                let mut n = 0usize;
                while !done.load(Ordering::SeqCst) {
                    let pick = sessions.lock().unwrap().iter().rev().nth(n % 5).cloned();
                    if let Some(s) = pick {
                        reg.leave(&s, CloseReason::Logout);
                    }
                    n += 1;
                }
            });
            scope.spawn(|| {
                while !done.load(Ordering::SeqCst) {
                    let recent: Vec<Arc<Session>> = sessions.lock().unwrap().iter().rev().take(16).cloned().collect();
                    for s in recent {
                        reg.touch(&s, 0);
                    }
                }
            });
            scope.spawn(|| {
                while !done.load(Ordering::SeqCst) {
                    let recent: Vec<Arc<Session>> = sessions.lock().unwrap().iter().rev().take(8).cloned().collect();
                    for s in recent {
                        // Read together with the liveness: a session live after the lookup was
                        // live during it, so the lookup must have listed it.
                        let listed = reg.sessions_of(s.uid(), None).iter().any(|l| l.id() == s.id());
                        assert!(listed || !s.is_live(), "uid {}: live session {} not listed", s.uid(), s.id());
                    }
                }
            });
        });
        let mut total = 0;
        for uid in 0..UIDS {
            let mut live: Vec<u64> =
                sessions.lock().unwrap().iter().filter(|s| s.uid() == uid && s.is_live()).map(|s| s.id()).collect();
            let mut listed: Vec<u64> = reg.sessions_of(uid, None).iter().map(|s| s.id()).collect();
            live.sort_unstable();
            listed.sort_unstable();
            assert!(live.len() <= 2, "uid {uid} holds {live:?}");
            assert_eq!(listed, live, "uid {uid}");
            total += live.len();
        }
        assert_eq!(reg.metrics.online_sessions.get(), total as i64);
    }

    #[test]
    fn login_after_sweep_before_finish_ends_the_old_session_as_expired() {
        let reg = registry(2);
        let old = reg.login(9, Device::DEFAULT, 0);
        reg.advance(2);
        let mut out = Vec::new();
        reg.expire_chunk(shard_of(9), usize::MAX, &mut out);
        assert_eq!(out, vec![9]);
        let new = reg.login(9, Device::DEFAULT, 2);
        assert_eq!(old.end_reason(), Some(CloseReason::IdleTimeout));
        assert_eq!(reg.finish_expired(&[9]), 0, "the new session must survive the old sweep");
        assert_eq!(new.end_reason(), None);
        assert_eq!(reg.metrics.online_users.get(), 1);
    }
}
