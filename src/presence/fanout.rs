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
use crate::presence::watch::{UserState, WatchIndex};
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
    Watch { session: Arc<Session>, uids: Vec<u64>, hidden: Vec<u64> },
    Unwatch { session: u64, uids: Vec<u64> },
    Close { session: u64 },
    Revoke { user: u64, allowed: Allowed },
}

/// Whether a user's session (by id) may still watch a uid, after its backend's list
/// changed.
pub type Allowed = Arc<dyn Fn(u64, u64) -> bool + Send + Sync>;

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
            Request::Watch { session, uids, hidden } => {
                write!(f, "Watch({}, {} uids, {} hidden)", session.id(), uids.len(), hidden.len())
            }
            Request::Unwatch { session, uids } => write!(f, "Unwatch({session}, {} uids)", uids.len()),
            Request::Close { session } => write!(f, "Close({session})"),
            Request::Revoke { user, .. } => write!(f, "Revoke({user})"),
        }
    }
}

// === impl Watches ===

impl Watches {
    /// The handle, and the task that serves it: a list holds at most `max_watch` uids, the
    /// node at most `max_entries` watch entries, and a watcher is owed at most `max_owed`
    /// bytes of changes before they become a resync. The task follows `directory`'s stream.
    pub fn new(
        max_watch: usize,
        max_entries: usize,
        max_owed: usize,
        directory: Arc<dyn Directory>,
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
            index: WatchIndex::default(),
            max_owed,
            metrics,
            resyncs: 0,
        };
        (watches, fan_out)
    }

    /// `session` watches `uids` (sorted, without repeats) too; `hidden` (which it may not
    /// watch) are answered as uids that never logged in. Refused, with nothing changed, if
    /// its list or the node would pass their bounds; a WATCH counts all its uids, hidden
    /// ones too, against the list's bound, so the bound tells nothing of who is listed.
    pub fn watch(&self, session: &Arc<Session>, uids: Vec<u64>, hidden: Vec<u64>) -> Result<(), WatchRefused> {
        let (asked, entries) = (uids.len() + hidden.len(), uids.len());
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
        let _ = self.requests.send(Request::Watch { session: session.clone(), uids, hidden });
        Ok(())
    }

    /// `session` no longer watches `uids`.
    pub fn unwatch(&self, session: &Session, uids: Vec<u64>) {
        if self.budgets.contains_key(&session.id()) {
            let _ = self.requests.send(Request::Unwatch { session: session.id(), uids });
        }
    }

    /// `session`'s connection closed: its list and whatever it is owed go.
    pub fn closed(&self, session: &Session) {
        if self.budgets.remove(&session.id()).is_some() {
            let _ = self.requests.send(Request::Close { session: session.id() });
            self.owed.forget(session.id());
        }
    }

    /// User `user` may now watch only the uids `allowed` says: its sessions' lists lose the
    /// others, each told as a uid that never logged in.
    pub fn revoke(&self, user: u64, allowed: Allowed) {
        let _ = self.requests.send(Request::Revoke { user, allowed });
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
    index: WatchIndex,
    max_owed: usize,
    metrics: Arc<Metrics>,
    /// Resyncs counted in the metrics so far.
    resyncs: u64,
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
                        if stream.is_none() && matches!(request, Request::Watch { .. }) {
                            stream = Some(self.follow().await);
                        }
                        self.handle(request).await;
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
            Request::Watch { session, uids, hidden } => {
                let fresh = self.snapshots(&self.index.unknown(&uids)).await;
                let added = self.index.watch(&session, &uids, &hidden, fresh, owed);
                self.metrics.presence_snapshots.inc_by((uids.len() + hidden.len()) as u64);
                let listed = self.index.list_len(session.id());
                self.watches.settle(session.id(), uids.len() + hidden.len(), listed, uids.len() - added);
            }
            Request::Unwatch { session, uids } => {
                let removed = self.index.unwatch(session, &uids);
                self.watches.released(session, self.index.list_len(session), removed);
            }
            Request::Close { session } => {
                let removed = self.index.close(session);
                self.watches.released(session, 0, removed);
            }
            Request::Revoke { user, allowed } => {
                for (session, removed) in self.index.revoke(user, &*allowed, owed) {
                    self.watches.released(session, self.index.list_len(session), removed);
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

    /// A fresh snapshot of every watched uid, and a resync of every watcher's list.
    async fn resync_all(&mut self) {
        let fresh = self.snapshots(&self.index.watched_uids()).await;
        self.index.resync_all(fresh, &self.watches.owed);
    }

    fn gauges(&mut self) {
        self.metrics.watch_entries.set(self.index.entries() as i64);
        self.metrics.watched_uids.set(self.index.watched_len() as i64);
        let resyncs = self.index.resyncs();
        self.metrics.presence_resyncs.inc_by(resyncs - self.resyncs);
        self.resyncs = resyncs;
    }
}
