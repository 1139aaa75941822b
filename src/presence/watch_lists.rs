//! Whom each user may watch under `--watch-policy listed`: the lists its backend put
//! (`PUT /v1/watchlists/{uid}`), and the lists the sessions' tokens carried
//! (`--jwt-watch-claim`). Presence is private: a uid on neither list reads as a uid that
//! never logged in.
//!
//! The backend's lists live in a [`ListStore`]: this process's memory for a gateway alone
//! ([`LocalLists`]), Redis for a cluster (`cluster/watch_lists.rs`), where every node
//! answers the same and a change made through one node reaches the watchers of all. A
//! token's list lives with its session, here.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use dashmap::DashMap;
use foldhash::fast::RandomState;
use futures_util::future::BoxFuture;
use futures_util::FutureExt;

/// Why a list was refused, or could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ListError {
    /// One list holds at most `--max-watch` uids.
    #[error("a list of {got} uids; at most {max} (--max-watch)")]
    TooLong { got: usize, max: usize },
    /// This node holds at most `--max-watch-entries` listed uids over all lists.
    #[error("this node holds {held} listed uids and takes at most {max} (--max-watch-entries)")]
    NodeFull { held: usize, max: usize },
    /// The shared store is out of reach; the request can be retried.
    #[error("watch lists unavailable: {0}")]
    Unavailable(String),
}

/// Where the backend's lists live; see the module documentation.
pub trait ListStore: Send + Sync + std::fmt::Debug {
    /// The backend's list for `user` (sorted, without repeats), replacing any it had; returns
    /// the list as kept.
    fn put(&self, user: u64, uids: Vec<u64>) -> BoxFuture<'_, Result<Arc<[u64]>, ListError>>;
    /// The backend's list for `user`, if it put one.
    fn get(&self, user: u64) -> BoxFuture<'_, Result<Option<Arc<[u64]>>, ListError>>;
    /// Drops the backend's list for `user`; whether it had one.
    fn delete(&self, user: u64) -> BoxFuture<'_, Result<bool, ListError>>;
    /// For each of `uids`, whether `user`'s list holds it.
    fn listed<'a>(&'a self, user: u64, uids: &'a [u64]) -> BoxFuture<'a, Result<Vec<bool>, ListError>>;
    /// uids listed over all lists, when this process holds them (`None`: a shared store's).
    fn entries(&self) -> Option<usize>;
}

/// The backend's lists in this process: a gateway alone.
#[derive(Debug)]
pub struct LocalLists {
    /// User -> the uids its backend listed, sorted, without repeats.
    lists: DashMap<u64, Arc<[u64]>, RandomState>,
    /// uids in `lists`, summed.
    entries: AtomicUsize,
    max_list: usize,
    max_entries: usize,
}

impl LocalLists {
    /// No lists; one holds at most `max_list` uids, all of them at most `max_entries`.
    pub fn new(max_list: usize, max_entries: usize) -> LocalLists {
        LocalLists { lists: DashMap::default(), entries: AtomicUsize::new(0), max_list, max_entries }
    }

    fn put_now(&self, user: u64, uids: Vec<u64>) -> Result<Arc<[u64]>, ListError> {
        let uids = crate::presence::distinct(uids);
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

    fn delete_now(&self, user: u64) -> bool {
        match self.lists.remove(&user) {
            Some((_, list)) => {
                self.entries.fetch_sub(list.len(), Ordering::Relaxed);
                true
            }
            None => false,
        }
    }
}

impl ListStore for LocalLists {
    fn put(&self, user: u64, uids: Vec<u64>) -> BoxFuture<'_, Result<Arc<[u64]>, ListError>> {
        std::future::ready(self.put_now(user, uids)).boxed()
    }

    fn get(&self, user: u64) -> BoxFuture<'_, Result<Option<Arc<[u64]>>, ListError>> {
        std::future::ready(Ok(self.lists.get(&user).map(|list| list.clone()))).boxed()
    }

    fn delete(&self, user: u64) -> BoxFuture<'_, Result<bool, ListError>> {
        std::future::ready(Ok(self.delete_now(user))).boxed()
    }

    fn listed<'a>(&'a self, user: u64, uids: &'a [u64]) -> BoxFuture<'a, Result<Vec<bool>, ListError>> {
        let list = self.lists.get(&user).map(|list| list.clone());
        let listed = uids.iter().map(|uid| list.as_ref().is_some_and(|list| list.binary_search(uid).is_ok()));
        std::future::ready(Ok(listed.collect())).boxed()
    }

    fn entries(&self) -> Option<usize> {
        Some(self.entries.load(Ordering::Relaxed))
    }
}

/// The lists; see the module documentation.
#[derive(Debug)]
pub struct WatchLists {
    /// The backend's lists.
    store: Arc<dyn ListStore>,
    /// Session id -> the uids its token's claim listed, sorted, without repeats.
    claims: DashMap<u64, Arc<[u64]>, RandomState>,
}

impl WatchLists {
    /// The backend's lists in `store`, and no token's list yet.
    pub fn new(store: Arc<dyn ListStore>) -> WatchLists {
        WatchLists { store, claims: DashMap::default() }
    }

    /// Where the backend's lists live.
    pub fn store(&self) -> &Arc<dyn ListStore> {
        &self.store
    }

    /// For each of `uids`, whether `session` of `user` may watch it: its token's list or the
    /// backend's holds it. The backend's is asked only for uids the token's does not hold.
    pub async fn allowed(&self, user: u64, session: u64, uids: &[u64]) -> Result<Vec<bool>, ListError> {
        let claim = self.claims.get(&session).map(|list| list.clone());
        let by_claim = |uid: &u64| claim.as_ref().is_some_and(|list| list.binary_search(uid).is_ok());
        let mut allowed: Vec<bool> = uids.iter().map(by_claim).collect();
        let ask: Vec<u64> = uids.iter().zip(&allowed).filter(|(_, &by)| !by).map(|(&uid, _)| uid).collect();
        if !ask.is_empty() {
            let mut listed = self.store.listed(user, &ask).await?.into_iter();
            for slot in allowed.iter_mut().filter(|by| !**by) {
                *slot = listed.next().unwrap_or(false);
            }
        }
        Ok(allowed)
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

    fn now<T>(future: BoxFuture<'_, T>) -> T {
        future.now_or_never().expect("a local list answers at once")
    }

    #[test]
    fn a_list_or_a_claim_allows_and_nothing_else_does() {
        let lists = WatchLists::new(Arc::new(LocalLists::new(3, 4)));
        let allowed = |user, session, uid| {
            lists.allowed(user, session, &[uid]).now_or_never().expect("at once").expect("local")[0]
        };
        let store = lists.store().clone();
        assert!(!allowed(1, 10, 7));
        assert_eq!(&*now(store.put(1, vec![8, 7, 7])).unwrap(), &[7, 8]);
        assert!(allowed(1, 10, 7) && allowed(1, 11, 8) && !allowed(2, 20, 7));
        lists.claim(20, vec![7]);
        assert!(allowed(2, 20, 7) && !allowed(2, 21, 7));
        let mixed = lists.allowed(1, 10, &[9, 7, 3]).now_or_never().unwrap().unwrap();
        assert_eq!(mixed, [false, true, false], "in the order asked");
        lists.closed(20);
        assert!(!allowed(2, 20, 7));
        assert_eq!(now(store.put(2, vec![1, 2, 3, 4])), Err(ListError::TooLong { got: 4, max: 3 }));
        assert_eq!(now(store.put(2, vec![1, 2, 3])), Err(ListError::NodeFull { held: 2, max: 4 }));
        assert_eq!(now(store.get(2)), Ok(None), "a refused first list leaves nothing");
        assert_eq!(&*now(store.put(1, vec![1, 2, 3])).unwrap(), &[1, 2, 3], "a list may grow into what it held");
        assert_eq!(store.entries(), Some(3));
        assert!(now(store.delete(1)).unwrap() && !now(store.delete(1)).unwrap());
        assert_eq!((store.entries(), now(store.get(1))), (Some(0), Ok(None)));
        now(store.put(3, vec![5])).unwrap();
        now(store.put(3, vec![])).unwrap();
        assert_eq!((store.entries(), now(store.get(3))), (Some(0), Ok(None)), "an empty list is no list");
    }
}
