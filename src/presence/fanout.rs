//! The presence fan-out: one task that follows the event stream while anybody here watches
//! anything, and owes each watcher the changes of the uids it watches (`watch.rs`), and
//! the handle connections reach it through ([`Watches`]).
//!
//! One task owns the index, so a WATCH, an UNWATCH, a close and the stream's events are
//! taken in one order, with no lock between them: a WATCH's snapshot is exact at the
//! position the task has read to (or, for a uid nobody watched, at the position its
//! snapshot was read at), and every change after it follows in stream order. The stream is
//! the one consumers read (this process's log, or a cluster's stream), so a watcher sees
//! what a backend following `/v1/events` sees, in the same order; a gap in it is answered
//! with a resync of every watcher's list, never a silent hole.
//!
//! Connections never wait for the task: a WATCH is counted against the bounds at once,
//! here, and its snapshot arrives as the session's wake-up, as a push does.
//!
//! Under `--watch-policy listed` the task also decides whom a session may watch, from the
//! token's list and the backend's (`watch_lists.rs`), which in a cluster live in Redis: a
//! WATCH is checked against the lists as they stand when the task takes it, and a list
//! that shrinks (on any node) is checked again for every session of its user here, so a
//! WATCH and a change of the list are taken in one order too.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use dashmap::DashMap;
use foldhash::fast::RandomState;
use futures_util::stream::BoxStream;
use futures_util::StreamExt;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::metrics::Metrics;
use crate::presence::directory::Directory;
use crate::presence::events::{Batch, EventId};
use crate::presence::owed::Owed;
use crate::presence::watch::{distinct, UserState, WatchIndex};
use crate::presence::watch_lists::WatchLists;
use crate::presence::Session;
use crate::proto::Frame;

/// How long the fan-out waits before it asks again for snapshots the directory could not
/// give (a cluster's store out of reach): watchers wait for their answer meanwhile rather
/// than be told a state nobody read.
const SNAPSHOT_RETRY: Duration = Duration::from_millis(500);

/// Why a WATCH was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum WatchRefused {
    /// The session's list would pass `--max-watch`.
    #[error("WATCH refused: a watch list of more than {max} uids (--max-watch)")]
    Session { max: usize },
    /// This node's watch entries would pass `--max-watch-entries`.
    #[error("WATCH refused: this node holds its most watch entries, {max} (--max-watch-entries)")]
    Node { max: usize },
    /// Watch lists are off (`--watch-policy none`).
    #[error("WATCH refused: watch lists are off (--watch-policy none)")]
    Off,
}

/// What a connection (or the API) asks of the fan-out.
enum Request {
    Watch { session: Arc<Session>, uids: Vec<u64> },
    Unwatch { session: u64, uids: Vec<u64> },
    Close { session: u64 },
    Revoke { user: u64 },
}

/// A watching session's share of the bounds: uids on its list, and uids its WATCHes asked
/// for that the fan-out has not taken yet.
#[derive(Debug, Default, Clone, Copy)]
struct Budget {
    listed: usize,
    asked: usize,
}

/// The connections' handle; see the module documentation.
#[derive(Debug)]
pub struct Watches {
    requests: mpsc::UnboundedSender<Request>,
    owed: Owed,
    /// Session id -> its budget, for every session that watched since it logged in.
    budgets: DashMap<u64, Budget, RandomState>,
    /// Watch entries held or asked for, over all sessions.
    reserved: AtomicUsize,
    max_watch: usize,
    max_entries: usize,
}

impl std::fmt::Debug for Request {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Request::Watch { session, uids } => write!(f, "Watch({}, {} uids)", session.id(), uids.len()),
            Request::Unwatch { session, uids } => write!(f, "Unwatch({session}, {} uids)", uids.len()),
            Request::Close { session } => write!(f, "Close({session})"),
            Request::Revoke { user } => write!(f, "Revoke({user})"),
        }
    }
}

// === impl Watches ===

impl Watches {
    /// The handle, and the task that serves it: a list holds at most `max_watch` uids, the
    /// node at most `max_entries` watch entries, and a watcher is owed at most `max_owed`
    /// bytes of changes before they become a resync. The task follows `directory`'s stream.
    /// Under `--watch-policy listed`, `lists` says whom a session may watch (`None`: anyone).
    pub fn new(
        max_watch: usize,
        max_entries: usize,
        max_owed: usize,
        directory: Arc<dyn Directory>,
        lists: Option<Arc<WatchLists>>,
        metrics: Arc<Metrics>,
    ) -> (Arc<Watches>, FanOut) {
        let (requests, receiver) = mpsc::unbounded_channel();
        let watches = Arc::new(Watches {
            requests,
            owed: Owed::default(),
            budgets: DashMap::default(),
            reserved: AtomicUsize::new(0),
            max_watch,
            max_entries,
        });
        let fan_out = FanOut {
            requests: receiver,
            watches: watches.clone(),
            directory,
            lists,
            index: WatchIndex::default(),
            max_owed,
            metrics,
            resynced: 0,
        };
        (watches, fan_out)
    }

    /// `session` watches `uids` (sorted, without repeats) too; those the policy does not
    /// let it watch are answered as uids that never logged in. Refused, with nothing
    /// changed, if its list or the node would pass their bounds; a WATCH counts all its
    /// uids, ones it may not watch too, against both bounds until the task has taken it, so
    /// a bound tells nothing of who is listed.
    pub fn watch(&self, session: &Arc<Session>, uids: Vec<u64>) -> Result<(), WatchRefused> {
        let (asked, entries) = (uids.len(), uids.len());
        {
            let mut budget = self.budgets.entry(session.id()).or_default();
            if budget.listed + budget.asked + asked > self.max_watch {
                return Err(WatchRefused::Session { max: self.max_watch });
            }
            let max = self.max_entries;
            self.reserved
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |held| {
                    (held + entries <= max).then_some(held + entries)
                })
                .map_err(|_| WatchRefused::Node { max })?;
            budget.asked += asked;
        }
        // The task lives as long as the gateway; after it, nobody reads what is owed.
        let _ = self.requests.send(Request::Watch { session: session.clone(), uids });
        Ok(())
    }

    /// `session` no longer watches `uids` (in any order, repeats allowed).
    pub fn unwatch(&self, session: &Session, uids: Vec<u64>) {
        if self.budgets.contains_key(&session.id()) {
            let _ = self.requests.send(Request::Unwatch { session: session.id(), uids: distinct(uids) });
        }
    }

    /// `session`'s connection closed: its list and whatever it is owed go.
    pub fn closed(&self, session: &Session) {
        if self.budgets.remove(&session.id()).is_some() {
            let _ = self.requests.send(Request::Close { session: session.id() });
            self.owed.forget(session.id());
        }
    }

    /// The backend's list for `user` changed (here, or on another node of a cluster): its
    /// sessions here stop watching what the lists no longer allow, each such uid told as a
    /// uid that never logged in.
    pub fn revoke(&self, user: u64) {
        let _ = self.requests.send(Request::Revoke { user });
    }

    /// Takes what `session` is owed, as PRESENCE frames.
    pub fn take(&self, session: &Session) -> Vec<Frame> {
        self.owed.take(session)
    }

    /// The fan-out took a WATCH of `asked` uids for `session`, whose list holds `listed`
    /// now; `unused` of the entries it reserved were not needed (uids listed already).
    fn settle(&self, session: u64, asked: usize, listed: usize, unused: usize) {
        if let Some(mut budget) = self.budgets.get_mut(&session) {
            budget.asked -= asked.min(budget.asked);
            budget.listed = listed;
        }
        self.reserved.fetch_sub(unused, Ordering::Relaxed);
    }

    /// `session`'s list lost `removed` entries and holds `listed` now.
    fn released(&self, session: u64, listed: usize, removed: usize) {
        if let Some(mut budget) = self.budgets.get_mut(&session) {
            budget.listed = listed;
        }
        self.reserved.fetch_sub(removed, Ordering::Relaxed);
    }
}

/// The task; see the module documentation.
pub struct FanOut {
    requests: mpsc::UnboundedReceiver<Request>,
    watches: Arc<Watches>,
    directory: Arc<dyn Directory>,
    /// Whom a session may watch, under `--watch-policy listed`.
    lists: Option<Arc<WatchLists>>,
    index: WatchIndex,
    max_owed: usize,
    metrics: Arc<Metrics>,
    /// Resync entries counted in the metrics so far.
    resynced: u64,
}

impl std::fmt::Debug for FanOut {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FanOut").field("entries", &self.index.entries()).finish_non_exhaustive()
    }
}

// === impl FanOut ===

impl FanOut {
    /// Serves WATCHes and follows the stream while anything is watched, until `shutdown`.
    pub async fn run(mut self, shutdown: CancellationToken) {
        let mut stream: Option<BoxStream<'static, Batch>> = None;
        loop {
            let next = async {
                match stream.as_mut() {
                    Some(stream) => stream.next().await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                biased;
                () = shutdown.cancelled() => return,
                request = self.requests.recv() => {
                    let Some(mut request) = request else { return };
                    loop {
                        let watch = matches!(request, Request::Watch { .. });
                        if stream.is_none() && watch {
                            stream = Some(self.follow().await);
                        }
                        self.handle(request).await;
                        if watch {
                            // A snapshot is held in its watcher's queue until the watcher's
                            // connection writes it: the connections run before the next
                            // WATCH. Otherwise a backlog of WATCHes (one that formed while
                            // the first snapshots were read from a shared store, or a
                            // reconnect storm's) is answered in one go, and every snapshot
                            // is held at the same moment: on three nodes, 60 B more a watch
                            // entry of RSS than alone (docs/BENCHMARKS.md, section 16).
                            tokio::task::yield_now().await;
                        }
                        match self.requests.try_recv() {
                            Ok(more) => request = more,
                            Err(_) => break,
                        }
                    }
                    if self.index.is_empty() {
                        // Nobody watches: the log is no longer followed, and costs its
                        // writers nothing for it.
                        stream = None;
                    }
                }
                batch = next => match batch {
                    Some(batch) => self.apply(batch).await,
                    None => {
                        // The stream does not end while the gateway runs; if it did, what
                        // came after is unknown: follow it again from now, and resync.
                        stream = Some(self.follow().await);
                        self.resync_all().await;
                    }
                },
            }
            self.gauges();
        }
    }

    /// The stream from now: its position is read before any snapshot, so each snapshot is
    /// at or after it.
    async fn follow(&self) -> BoxStream<'static, Batch> {
        loop {
            match self.directory.recent(0).await {
                Ok(at) => return self.directory.follow(Some(at)),
                Err(e) => {
                    tracing::warn!(error = %e, "watch lists: the event stream's position is out of reach; retrying");
                    tokio::time::sleep(SNAPSHOT_RETRY).await;
                }
            }
        }
    }

    async fn handle(&mut self, request: Request) {
        let owed = &self.watches.owed;
        match request {
            Request::Watch { session, uids } => {
                let asked = uids.len();
                let (uids, hidden) = self.split(&session, uids).await;
                let fresh = self.snapshots(&self.index.unknown(&uids)).await;
                let added = self.index.watch(&session, &uids, &hidden, fresh, owed);
                self.metrics.presence_snapshots.inc_by(asked as u64);
                let listed = self.index.list_len(session.id());
                self.watches.settle(session.id(), asked, listed, asked - added);
            }
            Request::Unwatch { session, uids } => {
                let removed = self.index.unwatch(session, &uids);
                self.watches.released(session, self.index.list_len(session), removed);
            }
            Request::Close { session } => {
                let removed = self.index.close(session);
                self.watches.released(session, 0, removed);
            }
            Request::Revoke { user } => self.recheck(Some(user)).await,
        }
    }

    /// `uids` (sorted) split into those `session` may watch and those it may not, by the
    /// policy; a store out of reach is asked again, and the watcher waits meanwhile rather
    /// than be told a list nobody read.
    async fn split(&self, session: &Session, uids: Vec<u64>) -> (Vec<u64>, Vec<u64>) {
        let Some(lists) = &self.lists else { return (uids, Vec::new()) };
        loop {
            match lists.allowed(session.uid(), session.id(), &uids).await {
                Ok(allowed) => {
                    let (mut may, mut may_not) = (Vec::new(), Vec::new());
                    for (uid, allowed) in uids.into_iter().zip(allowed) {
                        if allowed {
                            may.push(uid)
                        } else {
                            may_not.push(uid)
                        }
                    }
                    return (may, may_not);
                }
                Err(e) => {
                    tracing::warn!(error = %e, uid = session.uid(), "watch lists: the lists are out of reach; retrying");
                    tokio::time::sleep(SNAPSHOT_RETRY).await;
                }
            }
        }
    }

    /// Each of `uids`' state, with the position it is exact at.
    async fn snapshots(&self, uids: &[u64]) -> Vec<(u64, UserState, EventId)> {
        if uids.is_empty() {
            return Vec::new();
        }
        loop {
            match self.directory.presence_of(uids).await {
                Ok(states) => {
                    debug_assert_eq!(states.len(), uids.len());
                    return uids.iter().zip(states).map(|(&uid, (state, at))| (uid, state, at)).collect();
                }
                Err(e) => {
                    tracing::warn!(error = %e, uids = uids.len(), "watch lists: snapshots out of reach; retrying");
                    tokio::time::sleep(SNAPSHOT_RETRY).await;
                }
            }
        }
    }

    /// A batch of the stream, in order; a gap before it resyncs every watcher first.
    async fn apply(&mut self, batch: Batch) {
        if batch.has_gap() {
            tracing::warn!(missed = %batch.missed_json(), "watch lists: the event stream has a gap; resyncing every watcher");
            self.resync_all().await;
        }
        let owed = &self.watches.owed;
        let mut delivered = 0;
        for event in &batch.events {
            delivered += self.index.apply(event, owed, self.max_owed);
        }
        self.metrics.presence_changes.inc_by(delivered as u64);
    }

    /// The lists of user `user`'s sessions here (every session's, for `None`) checked
    /// against the policy again: each loses what it may no longer watch.
    async fn recheck(&mut self, user: Option<u64>) {
        if self.lists.is_none() {
            return;
        }
        for (session, uids) in self.index.lists_of(user) {
            let gone = self.split(&session, uids).await.1;
            if !gone.is_empty() {
                let removed = self.index.revoke(session.id(), &gone, &self.watches.owed);
                self.watches.released(session.id(), self.index.list_len(session.id()), removed);
            }
        }
    }

    /// A fresh snapshot of every watched uid, and a resync of every watcher's list. The
    /// lists are checked against the policy first: a change of one a gap hid (in a cluster,
    /// a node that could not be told) is taken now.
    async fn resync_all(&mut self) {
        self.recheck(None).await;
        let fresh = self.snapshots(&self.index.watched_uids()).await;
        self.index.resync_all(fresh, &self.watches.owed);
    }

    fn gauges(&mut self) {
        self.metrics.watch_entries.set(self.index.entries() as i64);
        self.metrics.watched_uids.set(self.index.watched_len() as i64);
        let resynced = self.index.resynced();
        self.metrics.presence_resyncs.inc_by(resynced - self.resynced);
        self.resynced = resynced;
    }
}
