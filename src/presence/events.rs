//! The ordering lock of presence events: every online, offline and data change of this
//! gateway goes through one short lock, never held across IO or while formatting, into a
//! record: this process's own log (`local_log.rs`), or alone in a cluster, the cluster's
//! store through its [`Replicate`] (which only queues).
//!
//! The lock is what makes session events exactly-once and ordered per uid:
//! - an offline event is recorded by whoever reports the ending first ([`EventLog::report_ends`]),
//!   guarded by the session's `reported` flag, which is only touched under this lock;
//! - a login reports the sessions of its uid that ended before it records its own online
//!   event, so a kick reads `offline` (kicked) then `online`;
//! - a uid's user-level transitions ride on the session event that caused them: an online
//!   event that found the uid with no live session is read as `online` then `user_online`,
//!   an offline event that left none as `offline` then `user_offline`. One entry for both,
//!   so the pair is always in order and costs no more memory than the session event alone;
//! - a data event is recorded only while its session is live, checked under this lock, so
//!   no data event follows its session's offline event;
//! - an MQTT session's will is recorded with its online event and told with its offline
//!   one, whatever ends it.
//!
//! Consumers never read through this seam: they follow [`crate::presence::Directory::follow`],
//! a resumable stream of batches that is this process's log alone and the shared stream in
//! a cluster (the event stream, the status page, and anything else that relays events, read
//! there).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use bytes::Bytes;
use futures_util::stream::{self, Stream};
use tokio::sync::Notify;

use crate::metrics::Metrics;
use crate::presence::clock::unix_ms;
use crate::presence::last_seen::LastSeen;
use crate::presence::local_log::{Kept, LocalLog};
use crate::presence::session::PackedOrigin;
use crate::presence::{Claims, Origin, Session};
use crate::proto::{CloseReason, Device, EventKind};

/// Events one read hands a consumer: large enough to amortize the lock, small enough that
/// the lock is held for microseconds.
pub const READ_BATCH: usize = 1024;

/// DATA payload bytes one read hands a consumer (at least one event, whatever its size).
/// A batch becomes one chunk of SSE text (base64 and JSON make it about 1.4 times this),
/// and a consumer holds at most the chunk being written to it: about 1 MiB however slowly
/// it reads, instead of a thousand of the largest frames.
pub const READ_BATCH_BYTES: usize = 512 * 1024;

/// Takes events from the front of `events` while they fit [`READ_BATCH`] and
/// [`READ_BATCH_BYTES`] (always the first one).
pub fn within_batch_budget<E: std::borrow::Borrow<Event>>(events: impl Iterator<Item = E>) -> impl Iterator<Item = E> {
    let mut bytes = 0usize;
    events
        .take(READ_BATCH)
        .enumerate()
        .take_while(move |(i, event)| {
            bytes += event.borrow().what.payload_len();
            *i == 0 || bytes <= READ_BATCH_BYTES
        })
        .map(|(_, event)| event)
}

/// Where an event stands in its log, as `<ms>-<seq>`: the shape of a Redis Stream entry id,
/// so one API serves this process's log and a cluster's stream alike. Here `ms` is when this
/// process started, so an id from an earlier run of the gateway sorts before all of this
/// run's, and `seq` is `2p + 1` for the `p`-th entry of this run's log, or `2p` for its
/// session event when a user-level event follows it under `2p + 1`. Clients treat ids as
/// opaque.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct EventId {
    pub ms: u64,
    pub seq: u64,
}

impl std::fmt::Display for EventId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}-{}", self.ms, self.seq)
    }
}

impl std::str::FromStr for EventId {
    type Err = ();

    fn from_str(text: &str) -> Result<EventId, ()> {
        let (ms, seq) = text.trim().split_once('-').ok_or(())?;
        let number = |s: &str| if s.bytes().all(|b| b.is_ascii_digit()) { s.parse().map_err(|_| ()) } else { Err(()) };
        Ok(EventId { ms: number(ms)?, seq: number(seq)? })
    }
}

/// An MQTT session's will: told in its `offline` event when it ends in any way but a clean
/// DISCONNECT (a logout), once, as MQTT means it; never published to other clients.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Will {
    pub topic: Box<str>,
    pub payload: Bytes,
}

/// Where a log in a cluster replicates its session changes instead of keeping them: called
/// under the log's lock, in event order, so it must only queue, never wait.
pub trait Replicate: Send + Sync + std::fmt::Debug {
    /// A session logged in (the first of its uid on this node when `first`).
    fn online(&self, session: &Session, first: bool, at_ms: u64);
    /// A session ended with `reason` (the last of its uid on this node when `last`).
    fn offline(&self, session: &Session, reason: CloseReason, last: bool, will: Option<&Will>, at_ms: u64);
    /// A live session sent a DATA frame (an MQTT PUBLISH: on `topic`); returns its position
    /// among the changes the replica takes to its store (see [`Replicate::durable_through`]).
    fn data(&self, session: &Session, payload: &Bytes, topic: Option<&str>, at_ms: u64) -> u64;
    /// The position through which the store has every change: a data event at or below it
    /// is in the shared stream, unless its session was ended for losing it.
    fn durable_through(&self) -> u64;
    /// A live MQTT session's will, for an ending this node may not live to log.
    fn will(&self, session: &Session, will: &Will, at_ms: u64);
    /// A live session's user set its status (empty: cleared it).
    fn status(&self, session: &Session, status: &Arc<str>, at_ms: u64);
    /// A live session the store holds, whose route it lost: pointed at it again, never
    /// announced again (a login elsewhere may have ended it meanwhile).
    fn reroute(&self, session: &Session, at_ms: u64);
}

/// One event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    /// Its place in the log; see [`EventId`].
    pub id: EventId,
    /// Unix milliseconds when it was logged.
    pub at_ms: u64,
    pub uid: u64,
    pub what: What,
}

/// What happened to the uid.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum What {
    /// A LOGIN succeeded, on `device` (`None` for the default one); on `node`, or on this
    /// one when `None`; with its token's `claims` (`--jwt-claims-to-events`), if any, and
    /// its door and client address where known. `superseded` (in a cluster): a login on
    /// another node had taken its place before this event was logged, so it comes after that
    /// login's `online`, and its `offline` follows as soon as its node ends it; a consumer
    /// counting a uid's devices in stream order leaves it out. `timeout_ms`: the session's
    /// timeout (its class's; 0 where unknown: an event of a node from before timeout
    /// classes).
    Online {
        session: u64,
        device: Device,
        node: Option<Arc<str>>,
        claims: Option<Arc<Claims>>,
        origin: Origin,
        superseded: bool,
        timeout_ms: u32,
    },
    /// A logged-in session ended (an MQTT session with a will: told here, unless it
    /// logged out), with the claims its online event carried.
    Offline { session: u64, device: Device, reason: CloseReason, will: Option<Arc<Will>>, claims: Option<Arc<Claims>> },
    /// The uid went from no session to one.
    UserOnline,
    /// The uid's last session ended, for `reason`, at `ended_ms`: when this event was
    /// logged, or earlier by the offline grace (`--offline-grace`) it waited out.
    UserOffline { reason: CloseReason, ended_ms: u64 },
    /// The client sent a DATA frame with this payload (an MQTT PUBLISH: on this topic).
    Data { payload: Bytes, topic: Option<Arc<str>> },
    /// The user set its status to this text (empty: cleared it). A status lasts until it is
    /// set again or the user goes offline: a `user_offline` clears it without an event of
    /// its own.
    Status { status: Arc<str> },
}

// === impl What ===

impl What {
    /// Its kind: the SSE event name and `?types=` word.
    pub fn kind(&self) -> EventKind {
        match self {
            What::Online { .. } => EventKind::Online,
            What::Offline { .. } => EventKind::Offline,
            What::UserOnline => EventKind::UserOnline,
            What::UserOffline { .. } => EventKind::UserOffline,
            What::Data { .. } => EventKind::Data,
            What::Status { .. } => EventKind::Status,
        }
    }

    /// The SSE event name and `?types=` word.
    pub fn name(&self) -> &'static str {
        self.kind().name()
    }

    /// Payload bytes a consumer is sent for this event.
    pub fn payload_len(&self) -> usize {
        match self {
            What::Data { payload, topic } => payload.len() + topic.as_ref().map_or(0, |t| t.len()),
            What::Status { status } => status.len(),
            _ => 0,
        }
    }
}

/// What a consumer reads next.
#[derive(Debug)]
pub struct Batch {
    /// Events the consumer asked for that the log no longer holds (0 when none).
    pub missed: u64,
    /// The position asked for predates this process: events of an earlier run are gone.
    pub earlier_process: bool,
    /// The shared stream lost events after the position asked for (Redis lost writes: it
    /// restarted empty, or failed over to a replica that lagged); how many is unknown.
    pub earlier_stream: bool,
    /// The position just before the first event returned, for the gap's own id.
    pub gap_id: EventId,
    pub events: Vec<Event>,
}

impl Batch {
    /// Whether the consumer is told of a gap before these events.
    pub fn has_gap(&self) -> bool {
        self.missed > 0 || self.earlier_process || self.earlier_stream
    }

    /// The gap's size as a consumer reads it: a number when it is known, `null` when part of
    /// it lies in an earlier run of the gateway or in writes Redis lost, which nobody
    /// counted.
    pub fn missed_json(&self) -> String {
        if self.earlier_process || self.earlier_stream {
            "null".to_string()
        } else {
            self.missed.to_string()
        }
    }
}

/// The log; see the module documentation.
#[derive(Debug)]
pub struct EventLog {
    inner: Mutex<Ordered>,
    appended: Notify,
    consumers: AtomicUsize,
    /// When this process's log began: the `ms` of every id it hands out.
    boot_ms: u64,
    metrics: Arc<Metrics>,
    /// Set in a cluster: how far its store has every change (the changes themselves go
    /// through the record, under the lock; this needs none).
    replica: Option<Arc<dyn Replicate>>,
    /// When each uid that went offline here was last online (`--last-seen-capacity`):
    /// written as its `user_offline` is, read by presence answers, under a lock of its own.
    last_seen: Mutex<LastSeen>,
}

/// What the lock guards: the record the changes go into, in order, and the wills of live
/// MQTT sessions (by session id), taken by their offline change.
#[derive(Debug)]
struct Ordered {
    record: Box<dyn Record>,
    wills: std::collections::HashMap<u64, Box<Will>>,
    /// Each online user's status, where it set one: changed with its status event, and
    /// cleared with its `user_offline`, so a snapshot read under this lock agrees with the
    /// log's position.
    statuses: std::collections::HashMap<u64, Arc<str>>,
}

/// Where the ordering lock puts each session change, in order and under the lock: this
/// process's own log ([`LocalLog`]), or a cluster's store through its [`Replicate`]. One
/// of the two, chosen when the log is built; the lock decides what happens (exactly once,
/// in order), the record only keeps or forwards it.
trait Record: Send + std::fmt::Debug {
    /// A session logged in (the first live one of its uid when `first`).
    fn online(&mut self, at_ms: u64, session: &Session, first: bool);
    /// A session ended with `reason` (its uid's last live one when `last`), telling `will`.
    fn offline(&mut self, at_ms: u64, session: &Session, reason: CloseReason, last: bool, will: Option<Box<Will>>);
    /// A live session's will, for an ending this process may not live to record; the lock
    /// keeps it too, for the offline change.
    fn will(&mut self, _at_ms: u64, _session: &Session, _will: &Will) {}
    /// A live session's DATA (an MQTT PUBLISH: on `topic`); returns the position it is
    /// durable at (0: at once).
    fn data(&mut self, at_ms: u64, session: &Session, payload: Bytes, topic: Option<&str>) -> u64;
    /// A live session's user set its status (empty: cleared it).
    fn status(&mut self, at_ms: u64, session: &Session, status: &Arc<str>);
    /// A uid's offline grace ran out: its `user_offline`, for the session that ended at
    /// `ended_ms`. Only this process's own log holds graces (a cluster's are in its store).
    fn grace_over(&mut self, _at_ms: u64, _uid: u64, _reason: CloseReason, _ended_ms: u64) {
        debug_assert!(false, "a cluster's graces run out in its store");
    }
    /// Announces a live session again, after the store lost it; false where nothing can be
    /// lost.
    fn reassert(&mut self, _at_ms: u64, _session: &Session) -> bool {
        false
    }
    /// Points the store's route at a live session again; false where nothing can be lost.
    fn reroute(&mut self, _at_ms: u64, _session: &Session) -> bool {
        false
    }
    /// The log consumers read here, if the events live in this process.
    fn local(&self) -> Option<&LocalLog> {
        None
    }
}

impl Record for LocalLog {
    fn online(&mut self, at_ms: u64, session: &Session, first: bool) {
        self.append(
            at_ms,
            session.uid(),
            Kept::Online {
                session: session.id(),
                device: session.device().clone(),
                first,
                timeout_ms: session.timeout_ms(),
                claims: session.claims().cloned(),
                origin: Some(session.origin())
                    .filter(|o| *o != Origin::default())
                    .map(|o| Box::new(PackedOrigin::pack(o))),
            },
        );
    }

    fn offline(&mut self, at_ms: u64, session: &Session, reason: CloseReason, last: bool, will: Option<Box<Will>>) {
        let (session_id, device, claims) = (session.id(), session.device().clone(), session.claims().cloned());
        let kept = Kept::Offline { session: session_id, device, reason, last, will, claims };
        self.append(at_ms, session.uid(), kept);
    }

    fn data(&mut self, at_ms: u64, session: &Session, payload: Bytes, topic: Option<&str>) -> u64 {
        self.append(at_ms, session.uid(), Kept::data(payload, topic));
        0
    }

    fn grace_over(&mut self, at_ms: u64, uid: u64, reason: CloseReason, ended_ms: u64) {
        self.append(at_ms, uid, Kept::UserOffline { reason, ended_ms });
    }

    fn status(&mut self, at_ms: u64, session: &Session, status: &Arc<str>) {
        self.append(at_ms, session.uid(), Kept::Status { status: status.clone() });
    }

    fn local(&self) -> Option<&LocalLog> {
        Some(self)
    }
}

/// A cluster's store as the record: every change handed to its replica.
#[derive(Debug)]
struct Replicated(Arc<dyn Replicate>);

impl Record for Replicated {
    fn online(&mut self, at_ms: u64, session: &Session, first: bool) {
        self.0.online(session, first, at_ms);
    }

    fn offline(&mut self, at_ms: u64, session: &Session, reason: CloseReason, last: bool, will: Option<Box<Will>>) {
        self.0.offline(session, reason, last, will.as_deref(), at_ms);
    }

    fn will(&mut self, at_ms: u64, session: &Session, will: &Will) {
        self.0.will(session, will, at_ms);
    }

    fn data(&mut self, at_ms: u64, session: &Session, payload: Bytes, topic: Option<&str>) -> u64 {
        self.0.data(session, &payload, topic, at_ms)
    }

    fn status(&mut self, at_ms: u64, session: &Session, status: &Arc<str>) {
        self.0.status(session, status, at_ms);
    }

    fn reassert(&mut self, at_ms: u64, session: &Session) -> bool {
        // Redis lost it: with one session per uid across the cluster, the uid has none
        // there, so the announcement is its `user_online` too.
        self.0.online(session, true, at_ms);
        true
    }

    fn reroute(&mut self, at_ms: u64, session: &Session) -> bool {
        self.0.reroute(session, at_ms);
        true
    }
}

// === impl EventLog ===

impl EventLog {
    /// An empty log holding at most `capacity` events and `max_bytes` of payload.
    pub fn new(capacity: usize, max_bytes: usize, metrics: Arc<Metrics>) -> EventLog {
        let record = Box::new(LocalLog::new(capacity, max_bytes));
        EventLog {
            inner: Mutex::new(Ordered { record, wills: Default::default(), statuses: Default::default() }),
            appended: Notify::new(),
            consumers: AtomicUsize::new(0),
            boot_ms: unix_ms(),
            metrics,
            replica: None,
            last_seen: Mutex::new(LastSeen::new(crate::config::DEFAULT_LAST_SEEN_CAPACITY)),
        }
    }

    /// The same, remembering when at most `capacity` uids were last online.
    pub fn remembering_last_seen(mut self, capacity: usize) -> EventLog {
        self.last_seen = Mutex::new(LastSeen::new(capacity));
        self
    }

    /// When `uid` was last online (the end of its last session, unix ms), if remembered.
    pub fn last_seen(&self, uid: u64) -> Option<u64> {
        self.last_seen.lock().unwrap_or_else(PoisonError::into_inner).get(uid)
    }

    fn saw(&self, uid: u64, ms: u64) {
        self.last_seen.lock().unwrap_or_else(PoisonError::into_inner).seen(uid, ms);
    }

    /// The same ordering lock, replicating session changes to `replica` instead of keeping
    /// them.
    pub fn replicating_to(mut self, replica: Arc<dyn Replicate>) -> EventLog {
        self.lock().record = Box::new(Replicated(replica.clone()));
        self.replica = Some(replica);
        self
    }

    /// Records the online event of `session` (with `user_online` when `first`: its uid had
    /// no live session), after the offline events of `ended` (sessions of the uid that
    /// ended before it) that nobody recorded yet.
    ///
    /// The session's `will` (MQTT) is kept for its offline event in the same step: between
    /// the login and a later call nothing could stop an ending (a takeover on another node)
    /// from coming first and leaving the offline event without it.
    pub(crate) fn login<'a>(
        &self,
        ended: impl IntoIterator<Item = &'a Session>,
        session: &Session,
        first: bool,
        will: Option<Box<Will>>,
    ) {
        let at_ms = unix_ms();
        let mut inner = self.lock();
        for previous in ended {
            self.record_offline(&mut inner, previous, at_ms);
        }
        inner.record.online(at_ms, session, first);
        self.metrics.event(EventKind::Online);
        if first {
            self.metrics.event(EventKind::UserOnline);
        }
        if let Some(will) = will {
            inner.record.will(at_ms, session, &will);
            inner.wills.insert(session.id(), will);
        }
        self.recorded(inner);
    }

    /// Records the offline event of every ended session not recorded yet, in one batch.
    pub(crate) fn report_ends<'a>(&self, sessions: impl IntoIterator<Item = &'a Session>) {
        let at_ms = unix_ms();
        let mut inner = self.lock();
        let mut any = false;
        for session in sessions {
            any |= self.record_offline(&mut inner, session, at_ms);
        }
        if any {
            self.recorded(inner);
        }
    }

    /// Records a data event for a DATA frame of `session` (an MQTT PUBLISH: with its
    /// `topic`); dropped if the session has ended. Returns `None` if it was dropped, else
    /// the position it is durable at: 0 in this process's own log (at once), or its place
    /// among a cluster's changes, durable once [`EventLog::durable_through`] reaches it.
    pub fn data(&self, session: &Session, payload: Bytes, topic: Option<&str>) -> Option<u64> {
        let at_ms = unix_ms();
        let mut inner = self.lock();
        if !session.is_live() {
            return None;
        }
        let position = inner.record.data(at_ms, session, payload, topic);
        self.metrics.event(EventKind::Data);
        self.recorded(inner);
        Some(position)
    }

    /// Records a status event: `session`'s user set its status to `status` (empty: cleared
    /// it); dropped, returning false, if the session has ended. The caller holds the uid's
    /// entry in the registry, where the status is kept, so the two change in one order.
    pub(crate) fn status(&self, session: &Session, status: &Arc<str>) -> bool {
        let at_ms = unix_ms();
        let mut inner = self.lock();
        if !session.is_live() {
            return false;
        }
        inner.record.status(at_ms, session, status);
        // Kept here for a gateway alone, whose snapshots read it (`status_at`); a cluster's
        // statuses live in Redis, beside the users they belong to.
        if inner.record.local().is_some() {
            if status.is_empty() {
                inner.statuses.remove(&session.uid());
            } else {
                inner.statuses.insert(session.uid(), status.clone());
            }
        }
        self.metrics.event(EventKind::Status);
        self.recorded(inner);
        true
    }

    /// Records the `user_offline` of `uid`, whose offline grace ran out: its last session
    /// ended at `ended_ms` for `reason`. The caller holds the uid's entry in the registry,
    /// which logged that session's offline event before.
    pub(crate) fn grace_over(&self, uid: u64, reason: CloseReason, ended_ms: u64) {
        let at_ms = unix_ms();
        let mut inner = self.lock();
        inner.record.grace_over(at_ms, uid, reason, ended_ms);
        inner.statuses.remove(&uid);
        self.metrics.event(EventKind::UserOffline);
        self.recorded(inner);
        self.saw(uid, ended_ms);
    }

    /// The position through which data events are durable (see [`EventLog::data`]).
    pub fn durable_through(&self) -> u64 {
        self.replica.as_ref().map_or(u64::MAX, |replica| replica.durable_through())
    }

    /// Announces `session` to the replica again, if it is still live: after Redis was away
    /// and lost it. Under the lock, so it cannot land after the session's offline change.
    /// Returns whether it was announced.
    pub fn reassert(&self, session: &Session) -> bool {
        let at_ms = unix_ms();
        let mut inner = self.lock();
        session.is_live() && inner.record.reassert(at_ms, session)
    }

    /// Points the store's route at `session` again, if it is still live: the store holds it
    /// but lost its route. Under the lock, as [`EventLog::reassert`]. Returns whether it did.
    pub fn reroute(&self, session: &Session) -> bool {
        let at_ms = unix_ms();
        let mut inner = self.lock();
        session.is_live() && inner.record.reroute(at_ms, session)
    }

    /// The next events after `after`, at most [`READ_BATCH`]: every event the log still holds
    /// after it. An id from an earlier run reads from this run's start; one from a later run
    /// (a clock stepped back) reads from now. Nothing in a cluster, whose events are read
    /// from its store.
    pub fn read(&self, after: EventId) -> Batch {
        let inner = self.lock();
        match inner.record.local() {
            Some(local) => local.read(after, self.boot_ms),
            None => {
                Batch { missed: 0, earlier_process: false, earlier_stream: false, gap_id: after, events: Vec::new() }
            }
        }
    }

    /// The position `n` entries before the newest, never before the oldest still held.
    pub fn recent(&self, n: usize) -> EventId {
        let seq = self.lock().record.local().map_or(1, |local| local.recent(n));
        self.id(seq)
    }

    /// The newest event's id and `uid`'s status (empty: none), read together: what a
    /// snapshot of the uid tells is as of that position.
    pub(crate) fn status_at(&self, uid: u64) -> (EventId, Arc<str>) {
        let inner = self.lock();
        let seq = inner.record.local().map_or(1, LocalLog::last_seq);
        let status = inner.statuses.get(&uid).cloned().unwrap_or_else(|| Arc::from(""));
        (self.id(seq), status)
    }

    /// Users with a status now.
    pub fn statuses(&self) -> usize {
        self.lock().statuses.len()
    }

    /// The id after the newest event, so a consumer starting "from now" begins after it.
    pub fn last_id(&self) -> EventId {
        let seq = self.lock().record.local().map_or(1, LocalLog::last_seq);
        self.id(seq)
    }

    fn id(&self, seq: u64) -> EventId {
        EventId { ms: self.boot_ms, seq }
    }

    /// Resolves once an event after `id` is in the log.
    pub async fn wait_after(&self, id: EventId) {
        loop {
            let notified = self.appended.notified();
            tokio::pin!(notified);
            // Registered before the check, so an append between the check and the await
            // still wakes us.
            notified.as_mut().enable();
            if self.last_id() > id {
                return;
            }
            notified.await;
        }
    }

    /// Every event after `after` the log still holds (or, with `None`, every event from
    /// now on), then the live tail, in batches; a batch reports what this consumer missed
    /// first. The consumer is counted in `idlegate_event_consumers` while the stream lives.
    pub fn follow(self: &Arc<Self>, after: Option<EventId>) -> impl Stream<Item = Batch> + Send + 'static {
        let guard = self.consumer();
        let cursor = after.unwrap_or_else(|| self.last_id());
        stream::unfold((guard, cursor), |(guard, cursor)| async move {
            loop {
                let batch = guard.log.read(cursor);
                if let Some(last) = batch.events.last().map(|e| e.id) {
                    return Some((batch, (guard, last)));
                }
                if batch.has_gap() {
                    let next = batch.gap_id;
                    return Some((batch, (guard, next)));
                }
                guard.log.wait_after(cursor).await;
            }
        })
    }

    fn consumer(self: &Arc<Self>) -> ConsumerGuard {
        let n = self.consumers.fetch_add(1, Ordering::Relaxed) + 1;
        self.metrics.event_consumers.set(n as i64);
        ConsumerGuard { log: self.clone() }
    }

    /// Events held now.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.lock().record.local().map_or(0, LocalLog::len)
    }

    /// Records the offline change of an ended `session` unless it was recorded already;
    /// returns whether it was recorded now.
    fn record_offline(&self, inner: &mut Ordered, session: &Session, at_ms: u64) -> bool {
        let Some(reason) = session.end_reason() else {
            debug_assert!(false, "offline event for live session {} of uid {}", session.id(), session.uid());
            return false;
        };
        if !session.mark_reported() {
            return false;
        }
        let last = session.was_last();
        // Its will, unless it logged out (a clean DISCONNECT): taken either way.
        let will = inner.wills.remove(&session.id()).filter(|_| reason != CloseReason::Logout);
        inner.record.offline(at_ms, session, reason, last, will);
        self.metrics.event(EventKind::Offline);
        if last {
            inner.statuses.remove(&session.uid());
            self.metrics.event(EventKind::UserOffline);
            self.saw(session.uid(), at_ms);
        }
        true
    }

    /// Releases the lock and, when the events live here, wakes consumers waiting for news.
    fn recorded(&self, inner: MutexGuard<'_, Ordered>) {
        let Some((held, bytes)) = inner.record.local().map(|log| (log.len(), log.bytes())) else { return };
        self.metrics.event_log_events.set(held as i64);
        self.metrics.event_log_bytes.set(bytes as i64);
        drop(inner);
        if self.consumers.load(Ordering::Relaxed) > 0 {
            self.appended.notify_waiters();
        }
    }

    fn lock(&self) -> MutexGuard<'_, Ordered> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Keeps `idlegate_event_consumers` right while a consumer follows the log.
#[derive(Debug)]
struct ConsumerGuard {
    log: Arc<EventLog>,
}

impl Drop for ConsumerGuard {
    fn drop(&mut self) {
        let n = self.log.consumers.fetch_sub(1, Ordering::Relaxed) - 1;
        self.log.metrics.event_consumers.set(n as i64);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;

    fn log(capacity: usize, max_bytes: usize) -> EventLog {
        EventLog::new(capacity, max_bytes, Arc::new(Metrics::new(&Config::default())))
    }

    fn names(batch: &Batch) -> Vec<&'static str> {
        batch.events.iter().map(|e| e.what.name()).collect()
    }

    #[test]
    fn a_session_logs_online_data_offline_once_each_in_order() {
        let log = log(100, 1 << 20);
        let start = log.last_id();
        let s = Session::new(7, 1, 0, crate::presence::Handle::NONE);
        log.login([], &s, true, None);
        assert_eq!(log.data(&s, Bytes::from_static(b"hi"), None), Some(0), "durable at once here");
        s.end(CloseReason::Logout);
        assert_eq!(log.data(&s, Bytes::from_static(b"late"), None), None, "no data after the end");
        log.report_ends([&s]);
        log.report_ends([&s]);
        let batch = log.read(start);
        assert_eq!(names(&batch), ["online", "user_online", "data", "offline"]);
        assert_eq!(batch.missed, 0);
        assert_eq!(
            batch.events[3].what,
            What::Offline {
                session: 1,
                device: Device::DEFAULT,
                reason: CloseReason::Logout,
                will: None,
                claims: None
            }
        );
        assert!(log.read(batch.events[3].id).events.is_empty());
    }

    #[test]
    fn user_events_follow_their_session_events_with_ids_of_their_own() {
        let log = log(100, 1 << 20);
        let start = log.last_id();
        let s = Session::on_device(7, "phone".parse().unwrap(), 1, 0, crate::presence::Handle::NONE);
        log.login([], &s, true, None);
        s.end_as(CloseReason::IdleTimeout, super::super::session::Ending { last: true, evicted: false });
        log.report_ends([&s]);
        let batch = log.read(start);
        assert_eq!(names(&batch), ["online", "user_online", "offline", "user_offline"]);
        let ids: Vec<EventId> = batch.events.iter().map(|e| e.id).collect();
        assert!(ids.windows(2).all(|w| w[0] < w[1]), "{ids:?}");
        assert_eq!(
            batch.events[3].what,
            What::UserOffline { reason: CloseReason::IdleTimeout, ended_ms: batch.events[3].at_ms }
        );
        let phone: Device = "phone".parse().unwrap();
        assert_eq!(
            batch.events[0].what,
            What::Online {
                session: 1,
                device: phone,
                node: None,
                claims: None,
                origin: Origin::default(),
                superseded: false,
                timeout_ms: 0
            }
        );
        // Resuming between the halves of an entry gives the second half first.
        assert_eq!(names(&log.read(ids[0])), ["user_online", "offline", "user_offline"]);
        assert_eq!(names(&log.read(ids[2])), ["user_offline"]);
        assert!(log.read(ids[3]).events.is_empty());
        assert_eq!(log.last_id(), ids[3]);
    }

    #[test]
    fn a_login_reports_the_session_it_replaces_first() {
        let log = log(100, 1 << 20);
        let start = log.last_id();
        let old = Session::new(7, 1, 0, crate::presence::Handle::NONE);
        let new = Session::new(7, 2, 0, crate::presence::Handle::NONE);
        log.login([], &old, true, None);
        old.end(CloseReason::Kicked);
        log.login([&old], &new, false, None);
        // The one who ended it reports too late: nothing more.
        log.report_ends([&old]);
        let batch = log.read(start);
        assert_eq!(names(&batch), ["online", "user_online", "offline", "online"]);
    }

    #[test]
    fn dropped_events_show_as_a_gap_of_the_right_size() {
        let log = log(3, 1 << 20);
        let start = log.last_id();
        let s = Session::new(1, 1, 0, crate::presence::Handle::NONE);
        log.login([], &s, true, None);
        for _ in 0..5 {
            log.data(&s, Bytes::from_static(b"x"), None);
        }
        let batch = log.read(start);
        // The n-th entry's id, when no user-level event follows it.
        let at = |n: u64| EventId { seq: start.seq + 2 * n, ..start };
        assert_eq!(batch.missed, 3);
        assert!(!batch.earlier_process);
        assert_eq!(batch.gap_id, at(3));
        assert_eq!(batch.events.len(), 3);
        assert_eq!(batch.events[0].id, at(4));
        // Resuming from inside the held range: no gap.
        assert_eq!(log.read(at(4)).missed, 0);
        // An id from before this process: a gap flagged as such.
        let earlier = log.read(EventId { ms: start.ms - 1, seq: 99 });
        assert!(earlier.earlier_process);
        assert_eq!(earlier.missed, 3);
        // An id from a later process (the clock stepped back): from now.
        let later = log.read(EventId { ms: start.ms + 1, seq: 0 });
        assert_eq!((later.missed, later.events.len()), (0, 0));
        // Ids print and parse as <ms>-<seq>.
        assert_eq!(at(4).to_string().parse::<EventId>(), Ok(at(4)));
        assert!(
            "12".parse::<EventId>().is_err() && "1-x".parse::<EventId>().is_err() && "-1-2".parse::<EventId>().is_err()
        );
    }

    #[test]
    fn payload_bytes_bound_the_log_too() {
        let log = log(1000, 10);
        let s = Session::new(1, 1, 0, crate::presence::Handle::NONE);
        log.login([], &s, true, None);
        for _ in 0..5 {
            log.data(&s, Bytes::from_static(b"abcd"), None);
        }
        assert_eq!(log.len(), 2, "two 4-byte payloads fit in 10 bytes");
    }
}
