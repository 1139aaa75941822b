//! The sessions this node ended lately whose end Redis applied: what tells a session a
//! failover brought back from one whose end is still on its way.
//!
//! Redis may lose acknowledged writes: a primary dies and a replica that lagged takes
//! over. Among the lost writes may be ends this node applied, whose `offline` consumers may
//! already have read. The promoted replica still holds those sessions, and only this node
//! knows they ended. A session Redis holds, that this node does not, and that is here was
//! brought back: the writer removes it without an event (`Op::Forget`), where ending it
//! again would log a second `offline`. One that is not here has its end still queued (the
//! queue never drops an end) or ended longer ago than [`KEEP`]: it ends as before.
//!
//! Bounded by age and by count; the writer alone uses it, so it takes no lock.

use std::collections::{HashSet, VecDeque};
use std::time::Duration;

use tokio::time::Instant;

/// How long an applied end is remembered: far beyond any replication lag a failover can
/// lose (Redis drops a replica that lags past `repl-timeout`, 60 s by default, and makes
/// it sync afresh), and the reconcile that follows lost writes runs within seconds.
pub(crate) const KEEP: Duration = Duration::from_secs(600);

/// The most ends remembered: 16 bytes each in the set and 16 in the queue, so at most
/// about 8 MiB, and more than a node of 19,000 sessions ends in ten minutes of churn at
/// 400 ends a second.
pub(crate) const MAX: usize = 1 << 18;

/// See the module documentation.
#[derive(Debug, Default)]
pub(crate) struct Ended {
    ids: HashSet<u64>,
    order: VecDeque<(Instant, u64)>,
}

// === impl Ended ===

impl Ended {
    /// Notes that the end of `session`, applied at `now`, is in Redis.
    pub(crate) fn insert(&mut self, session: u64, now: Instant) {
        if self.ids.insert(session) {
            self.order.push_back((now, session));
        }
        self.prune(now);
    }

    /// Whether `session`'s end was applied within [`KEEP`] of `now` (and not crowded out).
    pub(crate) fn contains(&mut self, session: u64, now: Instant) -> bool {
        self.prune(now);
        self.ids.contains(&session)
    }

    /// How many ends are remembered.
    pub(crate) fn len(&self) -> usize {
        debug_assert_eq!(self.ids.len(), self.order.len());
        self.ids.len()
    }

    fn prune(&mut self, now: Instant) {
        while let Some(&(at, session)) = self.order.front() {
            if self.order.len() <= MAX && now.saturating_duration_since(at) < KEEP {
                break;
            }
            self.order.pop_front();
            self.ids.remove(&session);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn an_end_is_remembered_for_keep_then_forgotten() {
        let mut ended = Ended::default();
        let start = Instant::now();
        ended.insert(7, start);
        ended.insert(7, start);
        assert_eq!(ended.len(), 1, "one entry per session");
        assert!(ended.contains(7, start + KEEP - Duration::from_millis(1)));
        assert!(!ended.contains(8, start));
        assert!(!ended.contains(7, start + KEEP));
        assert_eq!(ended.len(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn the_oldest_go_beyond_the_count() {
        let mut ended = Ended::default();
        let now = Instant::now();
        for session in 0..=MAX as u64 {
            ended.insert(session, now);
        }
        assert_eq!(ended.len(), MAX);
        assert!(!ended.contains(0, now));
        assert!(ended.contains(1, now) && ended.contains(MAX as u64, now));
    }
}
