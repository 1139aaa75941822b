//! This node's cluster tasks: started together, stopped together, and a clean leave.
//!
//! The local registry and ring stay the truth for this node's clients; Redis holds a copy
//! for the others to read, written behind the per-frame path by the writer. This file
//! starts the writer, the lease and reaper, and the inbox reader, and is the only one that
//! knows all three; they share [`crate::cluster::shared`] and nothing of each other.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use futures_util::future::BoxFuture;

use crate::cluster::directory::ClusterDirectory;
use crate::cluster::keys;
use crate::cluster::queue::{Op, Queue};
use crate::cluster::relay_turn::SharedTurn;
use crate::cluster::shared::{Cluster, Settings};
use crate::cluster::shared_keys::ClusterKeys;
use crate::cluster::watch_lists::ClusterLists;
use crate::config::RedisTarget;
use crate::metrics::Metrics;
use crate::presence::{Backplane, Clock, Directory, Registry, RelayTurn, Replicate, SharedKeys, StoreTrouble};
use crate::presence::{ListStore, Session, Will};
use crate::proto::CloseReason;

/// How often `leave` looks whether the writer has finished.
const LEAVE_POLL: Duration = Duration::from_millis(10);

/// The longest a Redis Cluster may leave every call unanswered before the node opens its
/// connections anew: a few response timeouts, so an outage costs a reopen attempt every
/// few seconds at most.
const REOPEN_AFTER_MAX: Duration = Duration::from_secs(5);

/// How long no call may get an answer before the connections are opened anew: half the
/// lease, so that a client that stays wedged while the cluster answers everyone else (its
/// slot refresh hung after a failover, a restart or a slow link: nemesis seeds 1 and 9 on a
/// Redis Cluster) is replaced while the lease still holds; never under two ticks, since
/// the lease is refreshed once a tick and one slow refresh is no wedge.
fn reopen_after(lease: Duration, tick: Duration) -> Duration {
    (lease / 2).max(2 * tick).min(REOPEN_AFTER_MAX)
}

// === impl Cluster ===

impl Cluster {
    /// Runs the cluster's tasks until `stop`: connecting, the writer, the lease and
    /// reaper, and the inbox reader.
    pub(crate) async fn run(self: Arc<Self>, stop: CancellationToken) {
        let connect = async {
            let redis = self.target.redacted().to_string();
            let failed = |e: &crate::cluster::store::StoreError, retry_in: Duration| {
                tracing::debug!(%redis, error = %e, ?retry_in, "connecting to Redis failed; retrying");
                self.health.failed(e, &self.metrics, &redis);
            };
            self.store.connect(&self.target, failed).await;
            self.health.opened();
            self.load_scripts().await;
        };
        tokio::select! {
            _ = connect => {}
            _ = stop.cancelled() => return,
        }
        tokio::join!(
            crate::cluster::writer::run(self.clone(), stop.clone()),
            crate::cluster::membership::run(self.clone(), stop.clone()),
            crate::cluster::inbox::run(self.clone(), stop.clone()),
            self.reopen_when_stuck(stop.clone()),
        );
    }

    /// With a Redis Cluster: opens the connections anew whenever no call has got an answer
    /// for [`reopen_after`] (and again as often while none does). The lease is refreshed
    /// every tick, so there is always a call to answer; a wedged client shows as calls that
    /// hang, long before any of them fails.
    async fn reopen_when_stuck(&self, stop: CancellationToken) {
        if !self.target.is_cluster() {
            return;
        }
        let after = reopen_after(self.settings.lease, self.settings.tick);
        let mut last: Option<Instant> = None;
        loop {
            tokio::select! {
                _ = tokio::time::sleep(after / 5) => {}
                _ = stop.cancelled() => return,
            }
            let quiet = self.health.quiet_for().is_some_and(|d| d >= after);
            if !quiet || last.is_some_and(|t| t.elapsed() < after) {
                continue;
            }
            last = Some(Instant::now());
            self.metrics.redis_reopens.inc();
            match self.store.reopen(&self.target).await {
                Ok(()) => {
                    tracing::warn!(?after, "no call to the Redis Cluster got an answer: opened new connections")
                }
                Err(e) => tracing::debug!(error = %e, "opening new connections to the Redis Cluster failed"),
            }
        }
    }

    /// On a clean shutdown, after every session ended: waits (up to `within`) for the
    /// writer to take every change to Redis, then leaves the cluster, so this node's uids
    /// go offline at once with reason `shutdown` instead of at the end of its lease.
    ///
    /// If anything is still unwritten at the deadline, the node does not leave: its lease
    /// runs out and the reaper ends every session Redis still holds as `node_lost`. Leaving
    /// then would drop those ends: no reaper looks at a member that left.
    pub(crate) async fn leave(&self, within: Duration) {
        let deadline = Instant::now() + within;
        let settled = || self.queue.is_drained() && !self.health.writing.load(Ordering::Acquire);
        while !settled() && Instant::now() < deadline {
            tokio::time::sleep(LEAVE_POLL).await;
        }
        if !settled() {
            tracing::warn!(
                left = self.queue.len(),
                "changes Redis never got: not leaving the cluster; when the lease runs out the reaper ends \
                 the sessions Redis holds as node_lost"
            );
            return;
        }
        let member = self.member();
        let cmds = vec![
            redis::Cmd::srem(keys::MEMBERS, &*member),
            redis::Cmd::del(keys::lease(&member)),
            redis::Cmd::del(keys::inbox(&member)),
            redis::Cmd::del(keys::applied(&member)),
            redis::Cmd::del(keys::applied_dropped(&member)),
            redis::Cmd::del(keys::verified(&member)),
            redis::Cmd::del(keys::superseded(&member)),
        ];
        let left = tokio::time::timeout_at(deadline.max(Instant::now() + LEAVE_POLL), self.send_control(cmds)).await;
        match left {
            Ok(Ok(_)) => tracing::info!(%member, "left the cluster"),
            Ok(Err(e)) => tracing::warn!(error = %e, "could not leave the cluster; the lease will run out"),
            Err(_) => tracing::warn!("leaving the cluster timed out; the lease will run out"),
        }
    }
}

/// A node before it has a registry: its queue exists first, so the event log can be built
/// forwarding to it, then the registry on that log, then the node on the registry. The
/// composition root (`server.rs`) goes through these steps in this order; nothing is
/// attached later.
#[derive(Debug)]
pub(crate) struct Joining {
    target: RedisTarget,
    settings: Settings,
    metrics: Arc<Metrics>,
    queue: Arc<Queue>,
}

impl Joining {
    /// A node of `target` with a queue of at most `queue_capacity` changes and
    /// `queue_bytes` of data.
    pub(crate) fn new(
        target: RedisTarget,
        settings: Settings,
        metrics: Arc<Metrics>,
        queue_capacity: usize,
        queue_bytes: usize,
    ) -> Joining {
        Joining { target, settings, metrics, queue: Arc::new(Queue::new(queue_capacity, queue_bytes)) }
    }

    /// What the event log replicates session changes to: the queue.
    pub(crate) fn replica(&self) -> Arc<dyn Replicate> {
        Arc::new(Forward { queue: self.queue.clone(), metrics: self.metrics.clone() })
    }

    /// The node, mirroring `registry` (whose ring runs on `clock`) to Redis once it runs.
    pub(crate) fn join(self, registry: Arc<Registry>, clock: Clock) -> Arc<Cluster> {
        Arc::new(Cluster::new(self.target, self.settings, self.metrics, self.queue, registry, clock))
    }
}

/// Redis as the backplane: the composition root knows the node only through this.
impl Backplane for Cluster {
    fn run(self: Arc<Self>, stop: CancellationToken) -> BoxFuture<'static, ()> {
        tracing::info!(redis = %self.target.redacted(), member = %self.member(), "joining the cluster");
        Box::pin(Cluster::run(self, stop))
    }

    fn leave(&self, within: Duration) -> BoxFuture<'_, ()> {
        Box::pin(Cluster::leave(self, within))
    }

    fn trouble(&self) -> Option<StoreTrouble> {
        self.health.trouble().map(|trouble| StoreTrouble { text: trouble.text(), outage: trouble.is_outage() })
    }

    fn directory(self: Arc<Self>) -> Arc<dyn Directory> {
        Arc::new(ClusterDirectory::new(self))
    }

    fn relay_turn(self: Arc<Self>) -> Arc<dyn RelayTurn> {
        Arc::new(SharedTurn::new(self))
    }

    fn shared_keys(self: Arc<Self>) -> Arc<dyn SharedKeys> {
        Arc::new(ClusterKeys::new(self))
    }

    fn watch_lists(self: Arc<Self>, max_list: usize, changed: Arc<dyn Fn(u64) + Send + Sync>) -> Arc<dyn ListStore> {
        self.on_list_changed(changed);
        Arc::new(ClusterLists::new(self, max_list))
    }
}

/// Forwards the event log's session changes to the queue.
#[derive(Debug)]
struct Forward {
    queue: Arc<Queue>,
    metrics: Arc<Metrics>,
}

impl Forward {
    fn enqueue(&self, op: Op) -> u64 {
        let queued = self.queue.enqueue(op);
        self.metrics.redis_queue_depth.set(queued.depth as i64);
        self.metrics.redis_queue_bytes.set(queued.bytes as i64);
        if let Some(compacted) = queued.compacted {
            self.metrics.redis_compacted.inc_by((compacted.data + 2 * compacted.sessions) as u64);
            tracing::warn!(
                data_dropped = compacted.data,
                sessions_dropped = compacted.sessions,
                capacity = self.queue.capacity(),
                "Redis queue full: dropped data events (consumers see a gap) and sessions Redis never saw"
            );
        }
        queued.position
    }
}

impl Replicate for Forward {
    fn online(&self, session: &Session, first: bool, at_ms: u64) {
        self.enqueue(login(session, first, at_ms, false));
    }

    fn reroute(&self, session: &Session, at_ms: u64) {
        self.enqueue(login(session, false, at_ms, true));
    }

    fn durable_through(&self) -> u64 {
        self.queue.applied_through()
    }

    fn offline(&self, session: &Session, reason: CloseReason, last: bool, will: Option<&Will>, at_ms: u64) {
        let device = session.device().clone();
        let (uid, id, will) = (session.uid(), session.id(), will.map(|w| Box::new(w.clone())));
        self.enqueue(Op::Offline { uid, session: id, device, reason, last, will, at_ms });
    }

    fn will(&self, session: &Session, will: &Will, at_ms: u64) {
        let device = session.device().clone();
        let (uid, id, will) = (session.uid(), session.id(), Box::new(will.clone()));
        self.enqueue(Op::Will { uid, session: id, device, will, at_ms });
    }

    fn status(&self, session: &Session, status: &Arc<str>, at_ms: u64) {
        let (uid, id, device) = (session.uid(), session.id(), session.device().clone());
        self.enqueue(Op::Status { uid, session: id, device, status: status.clone(), at_ms });
    }

    fn data(&self, session: &Session, payload: &Bytes, topic: Option<&str>, at_ms: u64) -> u64 {
        let device = session.device().clone();
        let (uid, id, payload) = (session.uid(), session.id(), payload.clone());
        self.enqueue(Op::Data { uid, session: id, device, payload, topic: topic.map(Into::into), at_ms })
    }
}

/// The change for `session`'s login (`reroute`: only its route again).
fn login(session: &Session, first: bool, at_ms: u64, reroute: bool) -> Op {
    let (uid, since_ms, device) = (session.uid(), session.since_ms(), session.device().clone());
    let (claims, origin, timeout_ms) = (session.claims().cloned(), session.origin(), session.timeout_ms());
    Op::Online { uid, session: session.id(), device, first, since_ms, at_ms, claims, origin, timeout_ms, reroute }
}
