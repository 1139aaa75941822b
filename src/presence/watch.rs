//! Watch lists: which sessions of this node watch which uids, and each watched uid's state
//! as its watchers were last told.
//!
//! Pure: snapshots, stream events and the sessions' WATCH, UNWATCH and closes in, the
//! PRESENCE entries each watcher is owed out (into [`Owed`]); no IO, no clock, no lock. Its
//! one owner is the fan-out task (`fanout.rs`), which feeds it the event stream in order and
//! the requests between batches.
//!
//! Exactly once per transition, in stream order: a uid first watched gets its state from a
//! snapshot read at a known position of the stream (`through`); the stream's events of that
//! uid up to it are in the snapshot already and are skipped. An event after it that leaves
//! the state as it is (the `offline` of a session whose ending the snapshot already saw,
//! logged a moment later) is skipped too: user events alternate per uid, so such an event is
//! the one the snapshot told. A watched uid costs one map entry and a watcher one list
//! entry; a transition of a uid nobody here watches costs one map lookup.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use foldhash::fast::RandomState;

use crate::presence::events::{Event, EventId, What};
use crate::presence::owed::Owed;
use crate::presence::Session;
use crate::proto::{PresenceEntry, PresenceKind};

/// A user's presence as a watcher sees it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct UserState {
    pub online: bool,
    /// When this state began (unix ms), where known; 0 for a uid never seen.
    pub at_ms: u64,
    /// The user's status while online (empty: none).
    pub status: Arc<str>,
    /// For an offline user, when it was last online (unix ms), if remembered.
    pub last_seen_ms: Option<u64>,
}

impl UserState {
    /// What a watcher is told of a uid it may not watch, exactly as of a uid that never
    /// logged in: presence cannot be probed.
    pub fn nobody() -> UserState {
        UserState::default()
    }

    /// This state as a PRESENCE entry for `uid`.
    pub fn entry(&self, uid: u64) -> PresenceEntry {
        PresenceEntry {
            uid,
            online: self.online,
            at_ms: self.at_ms,
            status: self.status.to_string(),
            last_seen_ms: if self.online { None } else { self.last_seen_ms },
        }
    }

    /// The state after `what` happened at `at_ms`, if `what` changes what a watcher sees.
    /// A user event that leaves the state where it was is the one a snapshot already told
    /// (see the module documentation); a status that is already the user's is no change.
    fn after(&self, what: &What, at_ms: u64) -> Option<UserState> {
        match what {
            // An online stretch begins with no status: a status is set by a session of it.
            What::UserOnline if !self.online => {
                Some(UserState { online: true, at_ms, status: Arc::from(""), last_seen_ms: None })
            }
            What::UserOffline { ended_ms, .. } if self.online => {
                Some(UserState { online: false, at_ms, status: Arc::from(""), last_seen_ms: Some(*ended_ms) })
            }
            What::Status { status } if self.online && *status != self.status => {
                Some(UserState { status: status.clone(), at_ms, ..self.clone() })
            }
            _ => None,
        }
    }
}

/// `uids` sorted, each once: a WATCH or UNWATCH may repeat a uid, and a list holds it once.
pub(crate) fn distinct(mut uids: Vec<u64>) -> Vec<u64> {
    uids.sort_unstable();
    uids.dedup();
    uids
}

/// A watched uid: its state as its watchers were last told, the stream position it is known
/// through, and the sessions here that watch it.
#[derive(Debug)]
struct Watched {
    state: UserState,
    through: EventId,
    watchers: Vec<u64>,
}

/// A session's watch list.
#[derive(Debug)]
struct List {
    session: Arc<Session>,
    uids: HashSet<u64, RandomState>,
}

/// The index; see the module documentation.
#[derive(Debug, Default)]
pub struct WatchIndex {
    /// Watched uid -> its state and watchers.
    watched: HashMap<u64, Watched, RandomState>,
    /// Session id -> its list.
    lists: HashMap<u64, List, RandomState>,
    /// Watch entries: the lists' lengths summed.
    entries: usize,
    /// Entries owed in resyncs so far (each a watcher's whole list), for the metrics, which
    /// count entries of every kind alike.
    resynced: u64,
}

/// What one WATCH added: how many uids the list grew by.
pub type Added = usize;

// === impl WatchIndex ===

impl WatchIndex {
    /// Whether nobody watches anything: the fan-out then follows no stream.
    pub fn is_empty(&self) -> bool {
        self.lists.is_empty()
    }

    /// Watch entries (the lists' lengths summed).
    pub fn entries(&self) -> usize {
        self.entries
    }

    /// Entries owed in resyncs so far (a watcher's whole list each time, after it fell
    /// behind or the stream broke).
    pub fn resynced(&self) -> u64 {
        self.resynced
    }

    /// uids watched here.
    pub fn watched_len(&self) -> usize {
        self.watched.len()
    }

    /// How many uids `session_id`'s list holds.
    pub fn list_len(&self, session_id: u64) -> usize {
        self.lists.get(&session_id).map_or(0, |list| list.uids.len())
    }

    /// Which of `uids` nobody here watches yet: they need a snapshot before
    /// [`WatchIndex::watch`].
    pub fn unknown(&self, uids: &[u64]) -> Vec<u64> {
        uids.iter().copied().filter(|uid| !self.watched.contains_key(uid)).collect()
    }

    /// Every uid watched here, for a snapshot of all of them after a gap.
    pub fn watched_uids(&self) -> Vec<u64> {
        self.watched.keys().copied().collect()
    }

    /// `session` watches `uids` too; `fresh` holds a snapshot (state, and the position it is
    /// as of) of each of them nobody watched yet. The session is owed one snapshot of every
    /// uid it asked for, `hidden` ones (which it may not watch) told as [`UserState::nobody`]
    /// and never watched. Returns how many uids its list grew by.
    pub fn watch(
        &mut self,
        session: &Arc<Session>,
        uids: &[u64],
        hidden: &[u64],
        fresh: Vec<(u64, UserState, EventId)>,
        owed: &Owed,
    ) -> Added {
        for (uid, state, through) in fresh {
            // Another WATCH may have added it since its snapshot was asked for: the state
            // held then is the newer one.
            self.watched.entry(uid).or_insert(Watched { state, through, watchers: Vec::new() });
        }
        let id = session.id();
        let list = self.lists.entry(id).or_insert_with(|| List { session: session.clone(), uids: HashSet::default() });
        let mut added = 0;
        let mut entries = Vec::with_capacity(uids.len() + hidden.len());
        for &uid in uids {
            let Some(watched) = self.watched.get_mut(&uid) else {
                debug_assert!(false, "uid {uid} watched with no snapshot");
                continue;
            };
            if list.uids.insert(uid) {
                watched.watchers.push(id);
                added += 1;
            }
            entries.push(watched.state.entry(uid));
        }
        entries.extend(hidden.iter().map(|&uid| UserState::nobody().entry(uid)));
        self.entries += added;
        if list.uids.is_empty() {
            self.lists.remove(&id);
        }
        owed.answer(session, PresenceKind::Snapshot, entries);
        added
    }

    /// `session_id`'s list no longer holds `uids`; returns how many it held.
    pub fn unwatch(&mut self, session_id: u64, uids: &[u64]) -> usize {
        let Some(list) = self.lists.get_mut(&session_id) else { return 0 };
        let mut removed = 0;
        for uid in uids {
            if list.uids.remove(uid) {
                removed += 1;
                forget_watcher(&mut self.watched, *uid, session_id);
            }
        }
        if list.uids.is_empty() {
            self.lists.remove(&session_id);
        }
        self.entries -= removed;
        removed
    }

    /// `session_id` closed: its whole list goes.
    pub fn close(&mut self, session_id: u64) -> usize {
        let Some(list) = self.lists.remove(&session_id) else { return 0 };
        for uid in &list.uids {
            forget_watcher(&mut self.watched, *uid, session_id);
        }
        self.entries -= list.uids.len();
        list.uids.len()
    }

    /// Every list of a session of user `uid` (of every user, for `None`): the session, and
    /// the uids its list holds.
    pub fn lists_of(&self, uid: Option<u64>) -> Vec<(Arc<Session>, Vec<u64>)> {
        let lists = self.lists.values().filter(|list| uid.is_none_or(|uid| list.session.uid() == uid));
        lists.map(|list| (list.session.clone(), list.uids.iter().copied().collect())).collect()
    }

    /// `session_id` may no longer watch `gone`: each leaves its list, and it is owed each
    /// one's state as [`UserState::nobody`]. Returns how many entries its list lost.
    pub fn revoke(&mut self, session_id: u64, gone: &[u64], owed: &Owed) -> usize {
        let Some(session) = self.lists.get(&session_id).map(|list| list.session.clone()) else { return 0 };
        let removed = self.unwatch(session_id, gone);
        for &uid in gone {
            owed.change(&session, UserState::nobody().entry(uid), usize::MAX);
        }
        removed
    }

    /// An event of the stream, in order: each watcher of its uid is owed the change, if it
    /// changes what they see. A watcher owed more than `max_owed` bytes is owed a resync of
    /// its whole list instead. Returns how many watchers it was delivered to.
    pub fn apply(&mut self, event: &Event, owed: &Owed, max_owed: usize) -> usize {
        let Some(watched) = self.watched.get_mut(&event.uid) else { return 0 };
        if event.id <= watched.through {
            return 0;
        }
        watched.through = event.id;
        let Some(next) = watched.state.after(&event.what, event.at_ms) else { return 0 };
        watched.state = next;
        let entry = watched.state.entry(event.uid);
        let mut behind = Vec::new();
        for id in &watched.watchers {
            let Some(list) = self.lists.get(id) else { continue };
            if !owed.change(&list.session, entry.clone(), max_owed) {
                behind.push(*id);
            }
        }
        let delivered = watched.watchers.len();
        for id in behind {
            self.resync(id, owed);
        }
        delivered
    }

    /// After a gap in the stream: every watched uid's state from `fresh` (a snapshot of each,
    /// as of its position), and every watcher owed a resync of its whole list.
    pub fn resync_all(&mut self, fresh: Vec<(u64, UserState, EventId)>, owed: &Owed) {
        for (uid, state, through) in fresh {
            if let Some(watched) = self.watched.get_mut(&uid) {
                watched.state = state;
                watched.through = through;
            }
        }
        let ids: Vec<u64> = self.lists.keys().copied().collect();
        for id in ids {
            self.resync(id, owed);
        }
    }

    /// Owes `session_id` a resync of its whole list, in place of what it was owed.
    fn resync(&mut self, session_id: u64, owed: &Owed) {
        let Some(list) = self.lists.get(&session_id) else { return };
        let entries: Vec<PresenceEntry> =
            list.uids.iter().filter_map(|uid| self.watched.get(uid).map(|watched| watched.state.entry(*uid))).collect();
        self.resynced += entries.len() as u64;
        owed.resync(&list.session, entries);
    }
}

/// `session_id` no longer watches `uid`; the uid leaves the index with its last watcher.
fn forget_watcher(watched: &mut HashMap<u64, Watched, RandomState>, uid: u64, session_id: u64) {
    let Some(entry) = watched.get_mut(&uid) else { return };
    if let Some(i) = entry.watchers.iter().position(|&id| id == session_id) {
        entry.watchers.swap_remove(i);
    }
    if entry.watchers.is_empty() {
        watched.remove(&uid);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::presence::Handle;
    use crate::proto::{CloseReason, Frame};

    fn session(uid: u64, id: u64) -> Arc<Session> {
        Arc::new(Session::new(uid, id, 0, Handle::NONE))
    }

    fn id(seq: u64) -> EventId {
        EventId { ms: 1, seq }
    }

    fn event(seq: u64, uid: u64, what: What) -> Event {
        Event { id: id(seq), at_ms: 1000 + seq, uid, what }
    }

    fn online(at_ms: u64) -> UserState {
        UserState { online: true, at_ms, status: Arc::from(""), last_seen_ms: None }
    }

    /// A PRESENCE frame's kind and its entries' (uid, online, status).
    type Taken = Vec<(PresenceKind, Vec<(u64, bool, String)>)>;

    fn taken(owed: &Owed, s: &Session) -> Taken {
        owed.take(s)
            .into_iter()
            .map(|frame| match frame {
                Frame::Presence { kind, entries } => {
                    (kind, entries.into_iter().map(|e| (e.uid, e.online, e.status)).collect())
                }
                other => panic!("{other:?}"),
            })
            .collect()
    }

    #[test]
    fn a_watcher_gets_its_snapshot_then_each_transition_once_in_order() {
        let (mut index, owed) = (WatchIndex::default(), Owed::default());
        let watcher = session(1, 10);
        assert_eq!(index.unknown(&[7, 8]), [7, 8]);
        let fresh = vec![(7, online(5), id(4)), (8, UserState::nobody(), id(4))];
        assert_eq!(index.watch(&watcher, &[7, 8], &[9], fresh, &owed), 2);
        assert_eq!(
            taken(&owed, &watcher),
            [(PresenceKind::Snapshot, vec![(7, true, "".into()), (8, false, "".into()), (9, false, "".into())])]
        );
        // Already in the snapshot: skipped.
        assert_eq!(index.apply(&event(3, 7, What::UserOnline), &owed, usize::MAX), 0);
        // The offline of a session the snapshot saw end: no change.
        assert_eq!(
            index.apply(&event(5, 8, What::UserOffline { reason: CloseReason::Logout, ended_ms: 1 }), &owed, 99),
            0
        );
        index.apply(&event(6, 7, What::Status { status: Arc::from("away") }), &owed, usize::MAX);
        index.apply(&event(7, 7, What::Status { status: Arc::from("away") }), &owed, usize::MAX);
        index.apply(&event(8, 7, What::UserOffline { reason: CloseReason::IdleTimeout, ended_ms: 1 }), &owed, 1 << 20);
        index.apply(&event(9, 8, What::UserOnline), &owed, usize::MAX);
        index.apply(&event(10, 9, What::UserOnline), &owed, usize::MAX);
        assert_eq!(
            taken(&owed, &watcher),
            [(PresenceKind::Change, vec![(7, true, "away".into()), (7, false, "".into()), (8, true, "".into())])]
        );
        assert_eq!(index.entries(), 2);
        assert_eq!(index.close(10), 2);
        assert!(index.is_empty() && index.watched_len() == 0 && index.entries() == 0);
    }

    #[test]
    fn a_watcher_owed_too_much_gets_a_resync_of_its_list_instead() {
        let (mut index, owed) = (WatchIndex::default(), Owed::default());
        let slow = session(1, 10);
        index.watch(&slow, &[7, 8], &[], vec![(7, online(1), id(1)), (8, online(1), id(1))], &owed);
        owed.take(&slow);
        let max = 2 * crate::presence::owed::entry_bytes(&online(1).entry(7));
        for seq in 2..10 {
            let what = if seq % 2 == 0 {
                What::UserOffline { reason: CloseReason::Disconnect, ended_ms: seq }
            } else {
                What::UserOnline
            };
            index.apply(&event(seq, 7, what), &owed, max);
        }
        // An offline entry (26 bytes) fits the bound of two online ones (36); the online
        // after it does not, and is a resync instead: four of them over the eight changes,
        // each the whole list of two, counted by entries as the metrics count every kind.
        assert_eq!(index.resynced(), 8);
        let got = taken(&owed, &slow);
        assert_eq!(got.first().map(|f| f.0), Some(PresenceKind::Resync), "{got:?}");
        assert!(got.iter().skip(1).all(|f| f.0 == PresenceKind::Change), "{got:?}");
        // Applied in order, what it was owed ends where the stream did: 7 online (seq 9).
        let mut view = HashMap::new();
        for (_, entries) in &got {
            view.extend(entries.iter().map(|e| (e.0, e.1)));
        }
        assert_eq!(view, HashMap::from([(7, true), (8, true)]));
    }

    #[test]
    fn unwatch_revoke_and_close_leave_nothing_behind() {
        let (mut index, owed) = (WatchIndex::default(), Owed::default());
        let (a, b) = (session(1, 10), session(2, 20));
        index.watch(&a, &[7, 8], &[], vec![(7, online(1), id(1)), (8, online(1), id(1))], &owed);
        index.watch(&b, &[7], &[], vec![], &owed);
        assert_eq!((index.entries(), index.watched_len()), (3, 2));
        assert_eq!(index.unwatch(10, &[8, 99]), 1);
        assert_eq!((index.entries(), index.watched_len()), (2, 1));
        owed.take(&b);
        // User 2 may no longer watch 7: it leaves the list and reads as nobody.
        let lists: Vec<(u64, Vec<u64>)> = index.lists_of(Some(2)).into_iter().map(|(s, uids)| (s.id(), uids)).collect();
        assert_eq!(lists, [(20, vec![7])]);
        assert_eq!(index.revoke(20, &[7], &owed), 1);
        assert_eq!(taken(&owed, &b), [(PresenceKind::Change, vec![(7, false, "".into())])]);
        assert_eq!(index.list_len(20), 0);
        assert_eq!(index.close(10), 1);
        assert!(index.is_empty() && index.watched_len() == 0 && index.entries() == 0);
    }
}
