//! The session changes waiting to reach Redis, in the order they happened.
//!
//! The event log pushes here under its own lock, so the order is the order of the events,
//! and a push never waits for Redis: the per-frame path never touches the network. The
//! writer takes batches off the front.
//!
//! Bounded twice: by the bytes its changes carry (`--redis-queue-bytes`: DATA payloads and
//! topics, MQTT wills, JWT claims; past it the oldest data events go, nothing else), and by
//! count: while Redis is unreachable the
//! queue grows until [`Queue::capacity`], and then compacts instead of dropping what
//! matters. Data events go first (a realtime channel's
//! data is worthless hours late), then sessions that began and ended while Redis was away
//! (their online and offline cancel out: Redis never saw them, and nobody is told either).
//! What remains is at most a login per live session and an end per session Redis knows:
//! twice the connections at most, so the ends that keep Redis honest are never dropped.
//! The wills and claims those carry are never dropped either: what they hold past the byte
//! bound, once no data is left to shed, is bounded by that count (a session's will and
//! claims at most twice).
//!
//! Dropped data events are counted, and the next batch tells Redis how many: the stream
//! skips that many event numbers, so every consumer sees a gap of exactly that size.

use std::collections::{HashSet, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use bytes::Bytes;
use tokio::sync::Notify;

use crate::presence::{Claims, Origin, Will};
use crate::proto::{CloseReason, Device};

/// One session change.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Op {
    /// A LOGIN succeeded on `device` (`None` for the default one); `first` when its uid had
    /// no session here: its `user_online` follows unless it took the uid over from another
    /// node.
    Online {
        uid: u64,
        session: u64,
        device: Device,
        first: bool,
        since_ms: u64,
        at_ms: u64,
        claims: Option<Arc<Claims>>,
        /// Its door and client address, for its online event.
        origin: Origin,
        /// Its timeout (its class's), in milliseconds, for its online event.
        timeout_ms: u32,
        /// Only its route again (a session Redis holds whose route it lost): never announced
        /// again, as a login elsewhere may have ended it meanwhile.
        reroute: bool,
    },
    /// A session that has or may have been in Redis ended; `last` when it left its uid with
    /// no session here.
    /// An MQTT session's will rides along.
    Offline {
        uid: u64,
        session: u64,
        device: Device,
        reason: CloseReason,
        last: bool,
        will: Option<Box<Will>>,
        at_ms: u64,
    },
    /// An MQTT session's will, kept in Redis while the session lives, for an ending its node
    /// does not log (a takeover from another node, a reaping).
    Will { uid: u64, session: u64, device: Device, will: Box<Will>, at_ms: u64 },
    /// A DATA frame of the session on `device` (an MQTT PUBLISH: with its topic).
    Data { uid: u64, session: u64, device: Device, payload: Bytes, topic: Option<Box<str>>, at_ms: u64 },
    /// A STATUS of the session on `device`: its user's status becomes `status` (empty:
    /// none), logged only while the session is held (issue 52).
    Status { uid: u64, session: u64, device: Device, status: Arc<str>, at_ms: u64 },
    /// A session this node ended, whose end Redis applied and then lost in a failover: Redis
    /// holds it again. It goes without an event (its `offline` went out once); a reconcile
    /// sends it.
    Forget { uid: u64, session: u64, device: Device },
    /// This member's hash is current again: the end of a reconcile, behind its changes.
    Verified,
}

// === impl Op ===

impl Op {
    fn session(&self) -> Option<u64> {
        match self {
            Op::Online { session, .. }
            | Op::Offline { session, .. }
            | Op::Will { session, .. }
            | Op::Data { session, .. }
            | Op::Status { session, .. }
            | Op::Forget { session, .. } => Some(*session),
            Op::Verified => None,
        }
    }

    /// Bytes this change carries beyond its fixed part, counted against
    /// `--redis-queue-bytes`: a DATA frame's payload and topic, an MQTT will's topic and
    /// payload, a JWT's claims (shared with the live session, and counted all the same: the
    /// change may outlive it).
    fn held_bytes(&self) -> usize {
        let will = |will: &Will| std::mem::size_of::<Will>() + will.topic.len() + will.payload.len();
        match self {
            Op::Data { payload, topic, .. } => payload.len() + topic.as_ref().map_or(0, |t| t.len()),
            Op::Online { claims, .. } => claims.as_ref().map_or(0, |c| c.as_json().len()),
            Op::Offline { will: w, .. } => w.as_deref().map_or(0, will),
            Op::Will { will: w, .. } => will(w),
            Op::Status { status, .. } => status.len(),
            Op::Forget { .. } | Op::Verified => 0,
        }
    }
}

/// The queue; see the module documentation.
#[derive(Debug)]
pub(crate) struct Queue {
    inner: Mutex<Inner>,
    ready: Notify,
    capacity: usize,
    max_bytes: usize,
    /// The position of the last change Redis has (its batch applied): a data event at or
    /// below it is in the shared stream, unless `APPLY` named its session as dropped.
    applied: AtomicU64,
}

#[derive(Debug, Default)]
struct Inner {
    ops: VecDeque<Op>,
    /// Bytes the changes held carry ([`Op::held_bytes`]).
    bytes: usize,
    /// Data events dropped since the last batch was taken.
    dropped: u64,
    /// Changes ever pushed: the position of the newest.
    pushed: u64,
    /// `(uid, session)` of sessions whose data events were dropped here since the last batch
    /// was taken: their clients may have been told the data was taken, so they are ended.
    lost: Vec<(u64, u64)>,
}

/// A batch taken off the queue.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Taken {
    pub ops: Vec<Op>,
    /// Data events dropped before these changes, which the stream skips.
    pub dropped: u64,
    /// The position of the last change taken.
    pub through: u64,
    /// Sessions whose data events were dropped before these changes.
    pub lost: Vec<(u64, u64)>,
}

/// What [`Queue::enqueue`] did.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Queued {
    /// Changes held after it.
    pub depth: usize,
    /// Bytes they carry ([`Op::held_bytes`]).
    pub bytes: usize,
    /// What a compaction removed, if one ran.
    pub compacted: Option<Compacted>,
    /// The change's position (see [`Queue::applied_through`]).
    pub position: u64,
}

/// What one compaction removed.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Compacted {
    /// Data events, and statuses a later one of their session replaced: the stream skips
    /// them, and its consumers see the gap.
    pub data: usize,
    pub sessions: usize,
}

// === impl Queue ===

impl Queue {
    /// A queue that compacts beyond `capacity` changes and drops data once its changes carry
    /// more than `max_bytes`.
    pub(crate) fn new(capacity: usize, max_bytes: usize) -> Queue {
        let applied = AtomicU64::new(0);
        Queue { inner: Mutex::default(), ready: Notify::new(), capacity: capacity.max(1), max_bytes, applied }
    }

    /// Appends `op`; see [`Queued`].
    pub(crate) fn enqueue(&self, op: Op) -> Queued {
        let mut inner = self.lock();
        inner.bytes += op.held_bytes();
        inner.pushed += 1;
        let position = inner.pushed;
        inner.ops.push_back(op);
        let mut compacted = None;
        if inner.ops.len() > self.capacity {
            compacted = Some(compact(&mut inner));
        } else if inner.bytes > self.max_bytes {
            compacted = Some(shed_data(&mut inner, self.max_bytes / 2));
        }
        if let Some(c) = &compacted {
            inner.dropped += c.data as u64;
        }
        let (depth, bytes) = (inner.ops.len(), inner.bytes);
        drop(inner);
        self.ready.notify_one();
        Queued { depth, bytes, compacted, position }
    }

    /// The position through which Redis has every change (batches applied in order).
    pub(crate) fn applied_through(&self) -> u64 {
        self.applied.load(Ordering::Acquire)
    }

    /// Records that Redis has every change through `position`.
    pub(crate) fn applied(&self, position: u64) {
        self.applied.fetch_max(position, Ordering::AcqRel);
    }

    /// Takes up to `max` changes from the front, with the count of data events dropped
    /// before them; never the first of a login's changes without the rest (see [`cut`]),
    /// unless nothing else waits.
    pub(crate) fn take(&self, max: usize) -> Taken {
        let mut inner = self.lock();
        // Cut as if more followed: a login's end may be here while its login is not yet.
        let n = cut(inner.ops.make_contiguous(), max, false);
        let ops: Vec<Op> = inner.ops.drain(..n).collect();
        inner.bytes -= ops.iter().map(Op::held_bytes).sum::<usize>();
        let through = inner.pushed - inner.ops.len() as u64;
        Taken { ops, dropped: std::mem::take(&mut inner.dropped), through, lost: std::mem::take(&mut inner.lost) }
    }

    /// The sessions whose login waits here, not yet taken into a batch: Redis has not got
    /// them yet, and will.
    pub(crate) fn queued_logins(&self) -> HashSet<u64> {
        let inner = self.lock();
        let logins = inner.ops.iter().filter_map(|op| match op {
            Op::Online { session, reroute: false, .. } => Some(*session),
            _ => None,
        });
        logins.collect()
    }

    /// Changes waiting now.
    pub(crate) fn len(&self) -> usize {
        self.lock().ops.len()
    }

    /// Whether nothing waits, not even a count of dropped data events to report.
    pub(crate) fn is_drained(&self) -> bool {
        let inner = self.lock();
        inner.ops.is_empty() && inner.dropped == 0
    }

    /// Bytes the changes waiting now carry ([`Op::held_bytes`]).
    pub(crate) fn bytes(&self) -> usize {
        self.lock().bytes
    }

    /// Resolves once a change may be waiting.
    pub(crate) async fn ready(&self) {
        self.ready.notified().await
    }

    /// The most changes held before compacting.
    pub(crate) fn capacity(&self) -> usize {
        self.capacity
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// How many of `ops` a batch of at most `size` changes takes: fewer, if the cut would fall
/// right after an end that makes room for a login (an `offline` that is not its uid's last
/// here, logged together with the login that replaces it). `APPLY` settles such an end with
/// its login only within one batch; apart, they would log a `user_offline` and a
/// `user_online` for a uid that never went offline, and its route would go empty between
/// them. `whole` says `ops` ends where its changes end (nothing of theirs follows). Only
/// when no cut within `size` fits does the batch take more, up to the next fitting cut.
pub(crate) fn cut(ops: &[Op], size: usize, whole: bool) -> usize {
    let makes_room = |op: &Op| matches!(op, Op::Offline { last: false, .. });
    let fits = |k: usize| (whole && k == ops.len()) || !makes_room(&ops[k - 1]);
    let n = ops.len().min(size.max(1));
    if n == 0 {
        return 0;
    }
    let back = (1..=n).rev().find(|&k| fits(k));
    back.or_else(|| (n..=ops.len()).find(|&k| fits(k))).unwrap_or(ops.len())
}

/// Notes the session of a dropped data event `op` (a run of one session's events once;
/// the writer ends each session once whatever the list repeats).
fn note_lost(lost: &mut Vec<(u64, u64)>, op: &Op) {
    if let Op::Data { uid, session, .. } = op {
        if lost.last() != Some(&(*uid, *session)) {
            lost.push((*uid, *session));
        }
    }
}

/// Drops the oldest data events until at most `keep` bytes are held, or no data is left:
/// half the bound, so a stream of large frames sheds in few passes instead of one per
/// frame.
fn shed_data(inner: &mut Inner, keep: usize) -> Compacted {
    let mut data = 0;
    let mut bytes = inner.bytes;
    let lost = &mut inner.lost;
    inner.ops.retain(|op| {
        if bytes <= keep || !matches!(op, Op::Data { .. }) {
            return true;
        }
        bytes -= op.held_bytes();
        data += 1;
        note_lost(lost, op);
        false
    });
    inner.bytes = bytes;
    Compacted { data, sessions: 0 }
}

/// Drops data events and replaced statuses, then the online and offline of each session
/// whose online is still waiting here (Redis never saw it begin, so it need not see it
/// end).
fn compact(inner: &mut Inner) -> Compacted {
    let ops = &mut inner.ops;
    let lost = &mut inner.lost;
    let before = ops.len();
    // A status a later one of the same session replaces goes as data does (the stream
    // skips it, and its consumers see the gap): what its watchers see next is the later
    // one. Marked from the back, so the last of each session's stays.
    let mut later = HashSet::new();
    let superseded: Vec<bool> =
        ops.iter().rev().map(|op| matches!(op, Op::Status { session, .. } if !later.insert(*session))).collect();
    let mut superseded = superseded.into_iter().rev();
    ops.retain(|op| {
        let gone = superseded.next().unwrap_or(false) || matches!(op, Op::Data { .. });
        if gone {
            note_lost(lost, op);
        }
        !gone
    });
    let data = before - ops.len();
    // A reroute's session is in Redis: its end must go.
    let unseen: HashSet<u64> =
        ops.iter().filter(|op| matches!(op, Op::Online { reroute: false, .. })).filter_map(Op::session).collect();
    let ended: HashSet<u64> = ops
        .iter()
        .filter(|op| matches!(op, Op::Offline { .. }))
        .filter_map(Op::session)
        .filter(|s| unseen.contains(s))
        .collect();
    let mid = ops.len();
    ops.retain(|op| op.session().is_none_or(|s| !ended.contains(&s)));
    inner.bytes = ops.iter().map(Op::held_bytes).sum();
    Compacted { data, sessions: (mid - ops.len()) / 2 }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn online(uid: u64, session: u64) -> Op {
        Op::Online {
            uid,
            session,
            device: Device::DEFAULT,
            first: true,
            since_ms: 0,
            at_ms: 0,
            claims: None,
            origin: Origin::default(),
            timeout_ms: 30_000,
            reroute: false,
        }
    }

    fn offline(uid: u64, session: u64) -> Op {
        Op::Offline {
            uid,
            session,
            device: Device::DEFAULT,
            reason: CloseReason::Logout,
            last: true,
            will: None,
            at_ms: 0,
        }
    }

    #[test]
    fn compaction_keeps_each_session_s_last_status_and_skips_the_rest_as_data() {
        let status = |session: u64, text: &str| Op::Status {
            uid: 1,
            session,
            device: Device::DEFAULT,
            status: Arc::from(text),
            at_ms: 0,
        };
        let q = Queue::new(4, usize::MAX);
        q.enqueue(offline(9, 9));
        q.enqueue(status(1, "a"));
        q.enqueue(status(2, "x"));
        q.enqueue(status(1, "b"));
        let queued = q.enqueue(status(1, "c"));
        assert_eq!(queued.compacted, Some(Compacted { data: 2, sessions: 0 }));
        let taken = q.take(10);
        assert_eq!(taken.ops, vec![offline(9, 9), status(2, "x"), status(1, "c")]);
        assert_eq!((taken.dropped, taken.lost), (2, vec![]), "skipped in the stream, no session ended for it");
    }

    #[test]
    fn compaction_keeps_every_end_redis_needs_and_every_live_login() {
        let q = Queue::new(5, usize::MAX);
        // Session 1 reached Redis before the outage: only its end is here.
        assert_eq!(q.enqueue(offline(1, 1)), Queued { depth: 1, bytes: 0, compacted: None, position: 1 });
        q.enqueue(online(2, 2));
        q.enqueue(Op::Data {
            uid: 2,
            session: 2,
            device: Device::DEFAULT,
            payload: Bytes::from_static(b"x"),
            topic: None,
            at_ms: 0,
        });
        q.enqueue(offline(2, 2));
        q.enqueue(online(3, 3));
        let queued = q.enqueue(online(4, 4));
        assert_eq!((queued.depth, queued.compacted), (3, Some(Compacted { data: 1, sessions: 1 })));
        assert_eq!(
            q.take(10),
            Taken { ops: vec![offline(1, 1), online(3, 3), online(4, 4)], dropped: 1, through: 6, lost: vec![(2, 2)] }
        );
        // A reconcile's removals and its closing mark are kept like ends Redis needs.
        let q = Queue::new(2, usize::MAX);
        q.enqueue(Op::Forget { uid: 5, session: 5, device: Device::DEFAULT });
        q.enqueue(Op::Verified);
        let compacted = q.enqueue(online(6, 6)).compacted;
        assert_eq!(compacted, Some(Compacted::default()));
        assert_eq!(q.len(), 3);
    }

    /// A DATA frame of uid 1's session 1: 100 bytes of `n`, on `topic`.
    fn data(n: u8, topic: Option<&str>) -> Op {
        let (payload, topic) = (Bytes::from(vec![n; 100]), topic.map(Into::into));
        Op::Data { uid: 1, session: 1, device: Device::DEFAULT, payload, topic, at_ms: 0 }
    }

    /// An end that makes room for a login of its uid (logged with it).
    fn makes_room(uid: u64, session: u64) -> Op {
        let (device, reason) = (Device::DEFAULT, CloseReason::Kicked);
        Op::Offline { uid, session, device, reason, last: false, will: None, at_ms: 0 }
    }

    #[test]
    fn a_batch_never_ends_between_an_end_and_the_login_it_made_room_for() {
        let ops = [online(1, 1), makes_room(2, 2), online(2, 3), online(4, 4)];
        assert_eq!(cut(&ops, 2, true), 1, "backs off before the end");
        assert_eq!(cut(&ops, 3, true), 3);
        assert_eq!(cut(&ops, 100, true), 4);
        // Nothing fits within the size: the batch takes the end's login too.
        assert_eq!(cut(&ops[1..], 1, true), 2);
        // At the queue's end the login may not be there yet: the end waits for it...
        let q = Queue::new(100, usize::MAX);
        q.enqueue(online(1, 1));
        q.enqueue(makes_room(2, 2));
        assert_eq!(q.take(10).ops, vec![online(1, 1)]);
        // ...unless nothing else waits.
        assert_eq!(q.take(10).ops, vec![makes_room(2, 2)]);
        assert_eq!(cut(&[], 10, false), 0);
    }

    #[test]
    fn batches_come_off_the_front_in_order() {
        let q = Queue::new(100, usize::MAX);
        q.enqueue(online(1, 1));
        q.enqueue(online(2, 2));
        q.enqueue(online(3, 3));
        assert_eq!(q.take(2).ops, vec![online(1, 1), online(2, 2)]);
        assert_eq!(q.take(10).ops, vec![online(3, 3)]);
        assert_eq!(q.len(), 0);
    }

    #[test]
    fn data_beyond_the_byte_bound_goes_first_and_is_counted() {
        let data = |n: u8| data(n, None);
        let q = Queue::new(100, 250);
        q.enqueue(online(1, 1));
        q.enqueue(data(1));
        q.enqueue(data(2));
        let compacted = q.enqueue(data(3)).compacted;
        // 300 bytes > 250: the oldest data goes until at most half the bound is held.
        assert_eq!(compacted, Some(Compacted { data: 2, sessions: 0 }));
        assert_eq!(q.bytes(), 100);
        q.enqueue(offline(1, 1));
        assert_eq!(
            q.take(10),
            Taken { ops: vec![online(1, 1), data(3), offline(1, 1)], dropped: 2, through: 5, lost: vec![(1, 1)] }
        );
        assert!(q.is_drained());
    }

    #[test]
    fn wills_and_claims_count_against_the_byte_bound() {
        let data = |n: u8| data(n, Some("t/1"));
        let will = Box::new(Will { topic: "gone/1".into(), payload: Bytes::from(vec![7; 2_000]) });
        let will_bytes = std::mem::size_of::<Will>() + 6 + 2_000;
        let claims = Arc::new(Claims::from_json(format!(r#"{{"name":"{}"}}"#, "a".repeat(1_000))));
        let claims_bytes = claims.as_json().len();
        let q = Queue::new(100, 4_000);
        let mut login = online(1, 1);
        if let Op::Online { claims: c, .. } = &mut login {
            *c = Some(claims);
        }
        assert_eq!(q.enqueue(login).bytes, claims_bytes);
        q.enqueue(Op::Will { uid: 1, session: 1, device: Device::DEFAULT, will: will.clone(), at_ms: 0 });
        q.enqueue(data(1));
        q.enqueue(data(2));
        assert_eq!(q.bytes(), claims_bytes + will_bytes + 2 * 103);
        // The end's will takes the queue past its bound: the data goes, never a will or a
        // login's claims, though they alone stay past half the bound.
        let (uid, device, reason) = (1, Device::DEFAULT, CloseReason::Disconnect);
        let end = Op::Offline { uid, session: 1, device, reason, last: true, will: Some(will), at_ms: 0 };
        let queued = q.enqueue(end);
        assert_eq!(queued.compacted, Some(Compacted { data: 2, sessions: 0 }));
        assert_eq!(queued.bytes, claims_bytes + 2 * will_bytes);
        assert_eq!(q.take(2).dropped, 2);
        assert_eq!(q.bytes(), will_bytes, "a batch taken takes its bytes");
        // A compaction counts again what it keeps.
        let q = Queue::new(2, usize::MAX);
        q.enqueue(data(1));
        q.enqueue(online(2, 2));
        assert_eq!(q.enqueue(online(3, 3)).bytes, 0);
    }
}
