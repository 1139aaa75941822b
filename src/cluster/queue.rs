//! The session changes waiting to reach Redis, in the order they happened.
//!
//! The event log pushes here under its own lock, so the order is the order of the events,
//! and a push never waits for Redis: the per-frame path never touches the network. The
//! writer takes batches off the front.
//!
//! Bounded: while Redis is unreachable the queue grows until [`Queue::capacity`], and then
//! compacts instead of dropping what matters. Data events go first (a realtime channel's
//! data is worthless hours late), then sessions that began and ended while Redis was away
//! (their online and offline cancel out: Redis never saw them, and nobody is told either).
//! What remains is at most a login per live session and an end per session Redis knows:
//! twice the connections at most, so the ends that keep Redis honest are never dropped.

use std::collections::{HashSet, VecDeque};
use std::sync::{Mutex, MutexGuard, PoisonError};

use bytes::Bytes;
use tokio::sync::Notify;

use crate::client::CloseReason;

/// One session change.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Op {
    /// A LOGIN succeeded.
    Online { uid: u64, session: u64, since_ms: u64, at_ms: u64 },
    /// A session that has or may have been in Redis ended.
    Offline { uid: u64, session: u64, reason: CloseReason, at_ms: u64 },
    /// A DATA frame.
    Data { uid: u64, session: u64, payload: Bytes, at_ms: u64 },
}

// === impl Op ===

impl Op {
    fn session(&self) -> u64 {
        match self {
            Op::Online { session, .. } | Op::Offline { session, .. } | Op::Data { session, .. } => *session,
        }
    }
}

/// The queue; see the module documentation.
#[derive(Debug)]
pub(crate) struct Queue {
    ops: Mutex<VecDeque<Op>>,
    ready: Notify,
    capacity: usize,
}

/// What one compaction removed.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Compacted {
    pub data: usize,
    pub sessions: usize,
}

// === impl Queue ===

impl Queue {
    /// A queue that compacts beyond `capacity` changes.
    pub(crate) fn new(capacity: usize) -> Queue {
        Queue { ops: Mutex::new(VecDeque::new()), ready: Notify::new(), capacity: capacity.max(1) }
    }

    /// Appends `op`; returns the depth after it and what a compaction removed, if one ran.
    pub(crate) fn push(&self, op: Op) -> (usize, Option<Compacted>) {
        let mut ops = self.lock();
        ops.push_back(op);
        let compacted = (ops.len() > self.capacity).then(|| compact(&mut ops));
        let depth = ops.len();
        drop(ops);
        self.ready.notify_one();
        (depth, compacted)
    }

    /// Takes up to `max` changes from the front.
    pub(crate) fn take(&self, max: usize) -> Vec<Op> {
        let mut ops = self.lock();
        let n = ops.len().min(max);
        ops.drain(..n).collect()
    }

    /// Changes waiting now.
    pub(crate) fn len(&self) -> usize {
        self.lock().len()
    }

    /// Resolves once a change may be waiting.
    pub(crate) async fn ready(&self) {
        self.ready.notified().await
    }

    /// The most changes held before compacting.
    pub(crate) fn capacity(&self) -> usize {
        self.capacity
    }

    fn lock(&self) -> MutexGuard<'_, VecDeque<Op>> {
        self.ops.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Drops data events, then the online and offline of each session whose online is still
/// waiting here (Redis never saw it begin, so it need not see it end).
fn compact(ops: &mut VecDeque<Op>) -> Compacted {
    let before = ops.len();
    ops.retain(|op| !matches!(op, Op::Data { .. }));
    let data = before - ops.len();
    let unseen: HashSet<u64> = ops.iter().filter(|op| matches!(op, Op::Online { .. })).map(Op::session).collect();
    let ended: HashSet<u64> = ops
        .iter()
        .filter(|op| matches!(op, Op::Offline { .. }))
        .map(Op::session)
        .filter(|s| unseen.contains(s))
        .collect();
    let mid = ops.len();
    ops.retain(|op| !ended.contains(&op.session()));
    Compacted { data, sessions: (mid - ops.len()) / 2 }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn online(uid: u64, session: u64) -> Op {
        Op::Online { uid, session, since_ms: 0, at_ms: 0 }
    }

    fn offline(uid: u64, session: u64) -> Op {
        Op::Offline { uid, session, reason: CloseReason::Logout, at_ms: 0 }
    }

    #[test]
    fn compaction_keeps_every_end_redis_needs_and_every_live_login() {
        let q = Queue::new(5);
        // Session 1 reached Redis before the outage: only its end is here.
        assert_eq!(q.push(offline(1, 1)), (1, None));
        q.push(online(2, 2));
        q.push(Op::Data { uid: 2, session: 2, payload: Bytes::from_static(b"x"), at_ms: 0 });
        q.push(offline(2, 2));
        q.push(online(3, 3));
        let (depth, compacted) = q.push(online(4, 4));
        assert_eq!((depth, compacted), (3, Some(Compacted { data: 1, sessions: 1 })));
        assert_eq!(q.take(10), vec![offline(1, 1), online(3, 3), online(4, 4)]);
    }

    #[test]
    fn batches_come_off_the_front_in_order() {
        let q = Queue::new(100);
        q.push(online(1, 1));
        q.push(online(2, 2));
        q.push(online(3, 3));
        assert_eq!(q.take(2), vec![online(1, 1), online(2, 2)]);
        assert_eq!(q.take(10), vec![online(3, 3)]);
        assert_eq!(q.len(), 0);
    }
}
