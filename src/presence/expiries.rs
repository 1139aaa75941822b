//! Token expiries of live sessions (`--enforce-token-expiry`): which session's token runs
//! out on which tick, so the ticker ends it there with `token_expired`.
//!
//! On the tick, not on a timer per session: a session's expiry is an entry in an ordered
//! map keyed by `(tick, session id)`, and each tick takes the entries due from its front,
//! so a tick costs what it ends (plus a lookup per shard), and a session costs one entry
//! whatever its token's lifetime. A refresh moves the entry; the connection's close removes
//! it, so a map holds only live sessions. The frame path never comes here.
//!
//! Sharded by session id so that a login storm's inserts do not queue on one lock.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, Weak};

use crate::presence::shards::{lock, shard_of};
use crate::presence::Session;

/// Shards of the expiry maps: a power of two, as many as the ring has, so that logins on
/// every worker rarely meet on one lock.
const SHARDS: usize = 64;

/// One shard: the due ticks in order, and each session's entry to find it again.
#[derive(Debug, Default)]
struct Shard {
    due: BTreeMap<(u64, u64), Weak<Session>>,
    at: HashMap<u64, u64>,
}

/// The expiries; see the module documentation.
#[derive(Debug)]
pub struct Expiries {
    shards: Box<[Mutex<Shard>]>,
}

impl Default for Expiries {
    fn default() -> Expiries {
        Expiries { shards: (0..SHARDS).map(|_| Mutex::default()).collect() }
    }
}

// === impl Expiries ===

impl Expiries {
    /// `session` ends on tick `tick` unless it is set again (a refresh) or forgotten first.
    pub fn set(&self, session: &Arc<Session>, tick: u64) {
        let id = session.id();
        let mut shard = lock(&self.shards[shard_of(id, SHARDS)]);
        if let Some(old) = shard.at.insert(id, tick) {
            shard.due.remove(&(old, id));
        }
        shard.due.insert((tick, id), Arc::downgrade(session));
        debug_assert_eq!(shard.due.len(), shard.at.len(), "one entry per session");
    }

    /// The tick `session` ends on, if it has an expiry.
    #[cfg(test)]
    pub fn get(&self, session: &Session) -> Option<u64> {
        lock(&self.shards[shard_of(session.id(), SHARDS)]).at.get(&session.id()).copied()
    }

    /// Forgets `session`'s expiry: its connection closed.
    pub fn forget(&self, session: &Session) {
        let id = session.id();
        let mut shard = lock(&self.shards[shard_of(id, SHARDS)]);
        if let Some(tick) = shard.at.remove(&id) {
            shard.due.remove(&(tick, id));
        }
    }

    /// Takes up to `max` sessions due on or before tick `now` into `out` (live or not: the
    /// caller ends those still live); returns how many it took.
    pub fn take_due(&self, now: u64, max: usize, out: &mut Vec<Arc<Session>>) -> usize {
        let mut taken = 0;
        for shard in self.shards.iter() {
            let mut shard = lock(shard);
            while taken < max {
                let Some(entry) = shard.due.first_entry().filter(|e| e.key().0 <= now) else { break };
                let ((_, id), session) = entry.remove_entry();
                shard.at.remove(&id);
                taken += 1;
                out.extend(session.upgrade());
            }
            if taken == max {
                break;
            }
        }
        taken
    }

    /// Sessions with an expiry.
    pub fn len(&self) -> usize {
        self.shards.iter().map(|s| lock(s).at.len()).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::presence::Handle;

    fn session(id: u64) -> Arc<Session> {
        Arc::new(Session::new(id, id, 0, Handle::NONE))
    }

    #[test]
    fn due_sessions_come_out_on_their_tick_and_a_refresh_moves_one() {
        let expiries = Expiries::default();
        let (a, b, c) = (session(1), session(2), session(3));
        expiries.set(&a, 5);
        expiries.set(&b, 5);
        expiries.set(&c, 9);
        let mut out = Vec::new();
        assert_eq!(expiries.take_due(4, 100, &mut out), 0);
        expiries.set(&b, 12);
        assert_eq!(expiries.get(&b), Some(12));
        assert_eq!(expiries.take_due(5, 100, &mut out), 1);
        assert_eq!(out.iter().map(|s| s.id()).collect::<Vec<_>>(), [1]);
        expiries.forget(&c);
        out.clear();
        assert_eq!(expiries.take_due(11, 100, &mut out), 0);
        assert_eq!(expiries.len(), 1);
        assert_eq!(expiries.take_due(12, 100, &mut out), 1);
        assert_eq!(expiries.len(), 0);
    }

    #[test]
    fn a_take_stops_at_its_chunk_and_skips_sessions_gone() {
        let expiries = Expiries::default();
        let kept: Vec<Arc<Session>> = (0..10).map(session).collect();
        for s in &kept {
            expiries.set(s, 1);
        }
        expiries.set(&session(99), 1);
        let mut out = Vec::new();
        assert_eq!(expiries.take_due(1, 4, &mut out), 4);
        assert_eq!(expiries.take_due(1, 100, &mut out), 7);
        assert_eq!(out.len(), 10, "the dropped session is taken but not handed out");
    }
}
