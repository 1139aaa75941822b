//! Whom each user may watch under `--watch-policy listed`: the lists its backend put
//! (`PUT /v1/watchlists/{uid}`), and the lists the sessions' tokens carried
//! (`--jwt-watch-claim`). Presence is private: a uid on neither list reads as a uid that
//! never logged in.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use dashmap::DashMap;
use foldhash::fast::RandomState;

/// Why a list was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ListError {
    /// One list holds at most `--max-watch` uids.
    #[error("a list of {got} uids; at most {max} (--max-watch)")]
    TooLong { got: usize, max: usize },
    /// This node holds at most `--max-watch-entries` listed uids over all lists.
    #[error("this node holds {held} listed uids and takes at most {max} (--max-watch-entries)")]
    NodeFull { held: usize, max: usize },
}

/// The lists; see the module documentation.
#[derive(Debug)]
pub struct WatchLists {
    /// User -> the uids its backend listed, sorted, without repeats.
    lists: DashMap<u64, Arc<[u64]>, RandomState>,
    /// Session id -> the uids its token's claim listed, sorted, without repeats.
    claims: DashMap<u64, Arc<[u64]>, RandomState>,
    /// uids in `lists`, summed.
    entries: AtomicUsize,
    max_list: usize,
    max_entries: usize,
}

impl WatchLists {
    /// No lists; one holds at most `max_list` uids, all of them at most `max_entries`.
    pub fn new(max_list: usize, max_entries: usize) -> WatchLists {
        WatchLists {
            lists: DashMap::default(),
            claims: DashMap::default(),
            entries: AtomicUsize::new(0),
            max_list,
            max_entries,
        }
    }

    /// Whether `session` of `user` may watch `uid`.
    pub fn allows(&self, user: u64, session: u64, uid: u64) -> bool {
        let listed = |list: &Arc<[u64]>| list.binary_search(&uid).is_ok();
        self.lists.get(&user).is_some_and(|list| listed(&list))
            || self.claims.get(&session).is_some_and(|list| listed(&list))
    }

    /// The backend's list for `user`, replacing any it had; returns the list as kept.
    pub fn put(&self, user: u64, mut uids: Vec<u64>) -> Result<Arc<[u64]>, ListError> {
        uids.sort_unstable();
        uids.dedup();
        if uids.len() > self.max_list {
            return Err(ListError::TooLong { got: uids.len(), max: self.max_list });
        }
        let list: Arc<[u64]> = uids.into();
        let mut entry = self.lists.entry(user).or_insert_with(|| Arc::from([]));
        let (old, new) = (entry.len(), list.len());
        // Counted under the user's entry, so two PUTs of one user never both count its old
        // list; reserved at once, so two users never both take the last room.
        let grow = new.saturating_sub(old);
        let max = self.max_entries;
        if let Err(held) = self
            .entries
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |held| (held + grow <= max).then_some(held + grow))
        {
            let empty = entry.is_empty();
            drop(entry);
            if empty {
                self.lists.remove_if(&user, |_, list| list.is_empty());
            }
            return Err(ListError::NodeFull { held, max });
        }
        self.entries.fetch_sub(old.saturating_sub(new), Ordering::Relaxed);
        *entry = list.clone();
        drop(entry);
        if new == 0 {
            self.lists.remove_if(&user, |_, list| list.is_empty());
        }
        Ok(list)
    }

    /// The backend's list for `user`, if it put one.
    pub fn get(&self, user: u64) -> Option<Arc<[u64]>> {
        self.lists.get(&user).map(|list| list.clone())
    }

    /// Drops the backend's list for `user`; whether it had one.
    pub fn delete(&self, user: u64) -> bool {
        match self.lists.remove(&user) {
            Some((_, list)) => {
                self.entries.fetch_sub(list.len(), Ordering::Relaxed);
                true
            }
            None => false,
        }
    }

    /// uids listed by backends, over all lists.
    pub fn entries(&self) -> usize {
        self.entries.load(Ordering::Relaxed)
    }

    /// `session` may watch the uids its token's claim listed (sorted, without repeats).
    pub fn claim(&self, session: u64, uids: Vec<u64>) {
        self.claims.insert(session, uids.into());
    }

    /// `session` closed: its claim's list goes.
    pub fn closed(&self, session: u64) {
        self.claims.remove(&session);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_list_or_a_claim_allows_and_nothing_else_does() {
        let lists = WatchLists::new(3, 4);
        assert!(!lists.allows(1, 10, 7));
        assert_eq!(&*lists.put(1, vec![8, 7, 7]).unwrap(), &[7, 8]);
        assert!(lists.allows(1, 10, 7) && lists.allows(1, 11, 8) && !lists.allows(2, 20, 7));
        lists.claim(20, vec![7]);
        assert!(lists.allows(2, 20, 7) && !lists.allows(2, 21, 7));
        lists.closed(20);
        assert!(!lists.allows(2, 20, 7));
        assert_eq!(lists.put(2, vec![1, 2, 3, 4]), Err(ListError::TooLong { got: 4, max: 3 }));
        assert_eq!(lists.put(2, vec![1, 2, 3]), Err(ListError::NodeFull { held: 2, max: 4 }));
        assert_eq!(lists.get(2), None, "a refused first list leaves nothing");
        assert_eq!(&*lists.put(1, vec![1, 2, 3]).unwrap(), &[1, 2, 3], "a list may grow into what it held");
        assert_eq!(lists.entries(), 3);
        assert!(lists.delete(1) && !lists.delete(1));
        assert_eq!((lists.entries(), lists.get(1)), (0, None));
        lists.put(3, vec![5]).unwrap();
        lists.put(3, vec![]).unwrap();
        assert_eq!((lists.entries(), lists.get(3)), (0, None), "an empty list is no list");
    }
}
