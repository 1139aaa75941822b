//! When each uid was last online (`GET /v1/presence/{uid}`'s `last_seen_ms` for an offline
//! uid): the end of its last session, remembered for at most `--last-seen-capacity` uids,
//! the least recently seen forgotten first.
//!
//! A map from uid to the time, and the order the times were written in. Times only grow,
//! so the oldest write is the least recently seen uid: eviction pops the front of the
//! order, skipping writes a later one of the same uid replaced. 52 bytes a uid at the
//! default capacity, 69 when every uid was seen twice (its first write stays in the order
//! until the order is compacted), counted by `examples/last_seen_memory.rs`: the map's
//! power-of-two table is about half full at a million uids.

use std::collections::{HashMap, VecDeque};

/// The remembered uids; see the module documentation.
#[derive(Debug)]
pub struct LastSeen {
    capacity: usize,
    at: HashMap<u64, u64>,
    order: VecDeque<(u64, u64)>,
}

impl LastSeen {
    /// Remembers at most `capacity` uids (0: none).
    pub fn new(capacity: usize) -> LastSeen {
        LastSeen { capacity, at: HashMap::new(), order: VecDeque::new() }
    }

    /// `uid`'s last session ended at `ms` (unix milliseconds).
    pub fn seen(&mut self, uid: u64, ms: u64) {
        if self.capacity == 0 {
            return;
        }
        self.at.insert(uid, ms);
        self.order.push_back((uid, ms));
        while self.at.len() > self.capacity {
            let Some((old, old_ms)) = self.order.pop_front() else { break };
            if self.at.get(&old) == Some(&old_ms) {
                self.at.remove(&old);
            }
        }
        // Writes replaced by later ones of the same uid go once they are as many as the
        // uids: the order never holds more than twice what it remembers.
        if self.order.len() > 2 * self.capacity.max(self.at.len()) {
            let at = &self.at;
            self.order.retain(|(uid, ms)| at.get(uid) == Some(ms));
        }
        debug_assert!(self.at.len() <= self.capacity, "{} uids over {}", self.at.len(), self.capacity);
    }

    /// When `uid` was last seen, if remembered.
    pub fn get(&self, uid: u64) -> Option<u64> {
        self.at.get(&uid).copied()
    }

    /// uids remembered.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.at.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_least_recently_seen_go_first_and_a_uid_seen_again_stays() {
        let mut seen = LastSeen::new(3);
        seen.seen(1, 10);
        seen.seen(2, 20);
        seen.seen(3, 30);
        seen.seen(1, 40);
        seen.seen(4, 50);
        // 2 was the least recently seen; 1 was seen again.
        assert_eq!((seen.get(1), seen.get(2), seen.get(3), seen.get(4)), (Some(40), None, Some(30), Some(50)));
        assert_eq!(seen.len(), 3);
    }

    #[test]
    fn the_order_stays_bounded_however_often_a_uid_is_seen() {
        let mut seen = LastSeen::new(10);
        for ms in 0..10_000 {
            seen.seen(ms % 3, ms);
        }
        assert!(seen.order.len() <= 20, "{}", seen.order.len());
        assert_eq!(seen.get(0), Some(9_999));
        assert_eq!(LastSeen::new(0).get(1), None);
    }
}
