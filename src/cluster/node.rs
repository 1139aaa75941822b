//! This node's place in the cluster: its member name, its connection to Redis and how
//! healthy that is, and the tasks that keep Redis in step with the local truth.
//!
//! The local registry and ring stay the truth for this node's clients; Redis holds a copy
//! for the others to read, written behind the per-frame path by [`crate::cluster::writer`].

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError, RwLock};
use std::time::Duration;

use bytes::Bytes;
use redis::{Cmd, Script};
use tokio::sync::{oneshot, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::backend::Metrics;
use crate::client::{CloseReason, Session};
use crate::cluster::keys;
use crate::cluster::queue::{Op, Queue};
use crate::cluster::scripts::Scripts;
use crate::cluster::store::{Conn, RedisTarget, Store, StoreError};
use crate::presence::{Clock, EventId, EventSink, Registry};

/// A Redis call slower than this counts as Redis being away: a paused or overloaded Redis
/// must not look healthy to the reaper, which would then reap nodes that only waited.
const SLOW_CALL: Duration = Duration::from_millis(500);

/// What the cluster needs to know of this gateway's settings.
#[derive(Debug, Clone)]
pub(crate) struct Settings {
    pub node: String,
    pub lease: Duration,
    pub tick: Duration,
    /// Approximate cap of the event stream (`--event-log-capacity`).
    pub stream_cap: usize,
    /// Bytes of pushes a client may leave unread (`Config::max_queued_bytes`).
    pub max_queued: usize,
}

/// This node in the cluster; see the module documentation.
pub(crate) struct Cluster {
    pub(crate) target: RedisTarget,
    pub(crate) store: Store,
    pub(crate) scripts: Scripts,
    pub(crate) queue: Arc<Queue>,
    pub(crate) settings: Settings,
    pub(crate) metrics: Arc<Metrics>,
    member: RwLock<Arc<str>>,
    registry: OnceLock<(Arc<Registry>, Clock)>,
    pub(crate) health: Health,
    /// Requests to other nodes waiting for their replies, by request id.
    pub(crate) pending: Mutex<HashMap<u64, oneshot::Sender<Vec<u8>>>>,
    pub(crate) next_request: AtomicU64,
    /// The newest event id the blocking reader has seen: consumers wait on it.
    pub(crate) tail: watch::Sender<EventId>,
}

impl std::fmt::Debug for Cluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cluster").field("target", &self.target).field("member", &self.member()).finish()
    }
}

// === impl Cluster ===

impl Cluster {
    pub(crate) fn new(
        target: RedisTarget,
        settings: Settings,
        metrics: Arc<Metrics>,
        queue_capacity: usize,
    ) -> Cluster {
        let member = keys::new_member(&settings.node);
        Cluster {
            target,
            store: Store::default(),
            scripts: Scripts::new(),
            queue: Arc::new(Queue::new(queue_capacity)),
            settings,
            metrics,
            member: RwLock::new(member.into()),
            registry: OnceLock::new(),
            health: Health::default(),
            pending: Mutex::new(HashMap::new()),
            next_request: AtomicU64::new(u64::from(keys::rand_u32()) << 32),
            tail: watch::Sender::new(EventId { ms: 0, seq: 0 }),
        }
    }

    /// Hands the cluster the registry it mirrors and the clock of its ring; once, before
    /// it runs.
    pub(crate) fn attach(&self, registry: Arc<Registry>, clock: Clock) {
        let _ = self.registry.set((registry, clock));
    }

    pub(crate) fn registry(&self) -> &Arc<Registry> {
        &self.registry.get().expect("the cluster is attached to its registry before it runs").0
    }

    /// Hands one PUSH of `payload` to each of `uids` held here; for each, whether it was
    /// handed over. What a push through this node and a push request from another do.
    pub(crate) fn push_here(&self, uids: impl IntoIterator<Item = u64>, payload: &Bytes) -> Vec<bool> {
        let registry = self.registry();
        uids.into_iter().map(|uid| registry.push(uid, payload, self.settings.max_queued)).collect()
    }

    /// `(since_ms, silent_ms)` of `uid`'s session on this node, if it has one.
    pub(crate) fn locate_here(&self, uid: u64) -> Option<(u64, u64)> {
        let (registry, clock) = self.registry.get()?;
        let sighting = registry.sighting(uid)?;
        Some((sighting.session.since_ms(), clock.since(sighting.last_heard_tick).as_millis() as u64))
    }

    /// This run's member name.
    pub(crate) fn member(&self) -> Arc<str> {
        self.member.read().unwrap_or_else(PoisonError::into_inner).clone()
    }

    /// Takes a new member name: the old one was reaped while this node was cut off.
    pub(crate) fn renew_member(&self) -> Arc<str> {
        let fresh: Arc<str> = keys::new_member(&self.settings.node).into();
        *self.member.write().unwrap_or_else(PoisonError::into_inner) = fresh.clone();
        fresh
    }

    /// The sink the event log forwards session changes to.
    pub(crate) fn sink(self: &Arc<Self>) -> Arc<dyn EventSink> {
        Arc::new(Forward { queue: self.queue.clone(), metrics: self.metrics.clone() })
    }

    /// The command connection, timing and counting the call `f` makes with it.
    pub(crate) async fn call<T, F, Fut>(&self, commands: u64, f: F) -> Result<T, StoreError>
    where
        F: FnOnce(Conn) -> Fut,
        Fut: std::future::Future<Output = Result<T, StoreError>>,
    {
        let conn = self.store.conn()?;
        let started = Instant::now();
        let result = f(conn).await;
        let took = started.elapsed();
        self.metrics.redis_round_trips.inc();
        self.metrics.redis_commands.inc_by(commands);
        self.metrics.redis_rtt.observe(took.as_secs_f64());
        match &result {
            Ok(_) => self.health.ok(took, &self.metrics),
            Err(StoreError::NotConnected) => {}
            Err(e) => {
                self.health.failed(&self.metrics);
                tracing::debug!(error = %e, "redis call failed");
            }
        }
        if let Err(StoreError::Redis(e)) = &result {
            if e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) {
                self.load_scripts().await;
            }
        }
        result
    }

    /// Loads every script on every master, so pipelines can call them by hash.
    pub(crate) async fn load_scripts(&self) {
        let Ok(mut conn) = self.store.conn() else { return };
        for script in self.scripts.all() {
            if let Err(e) = script.load_async(&mut conn).await {
                tracing::warn!(error = %e, "loading a script into Redis failed");
            }
        }
    }

    /// Runs the cluster's tasks until `stop`: connecting, the writer, the lease and
    /// reaper, and the inbox reader.
    pub(crate) async fn run(self: Arc<Self>, stop: CancellationToken) {
        let connect = async {
            self.store.connect(&self.target).await;
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
        );
    }

    /// On a clean shutdown, after every session ended: waits (up to `within`) for the
    /// writer to take every change to Redis, then leaves the cluster, so this node's uids
    /// go offline at once with reason `shutdown` instead of at the end of its lease.
    pub(crate) async fn leave(&self, within: Duration) {
        let deadline = Instant::now() + within;
        while (self.queue.len() > 0 || self.health.writing.load(Ordering::Acquire)) && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let left = self.queue.len();
        if left > 0 {
            tracing::warn!(left, "leaving the cluster with session changes Redis never got");
        }
        let member = self.member();
        let result = self
            .call(4, |mut conn| async move {
                let mut pipe = redis::pipe();
                pipe.srem(keys::MEMBERS, &*member)
                    .del(keys::lease(&member))
                    .del(keys::inbox(&member))
                    .del(keys::applied(&member))
                    .del(keys::taken(&member));
                pipe.query_async::<()>(&mut conn).await.map_err(StoreError::from)
            })
            .await;
        match result {
            Ok(()) => tracing::info!(member = %self.member(), "left the cluster"),
            Err(e) => tracing::warn!(error = %e, "could not leave the cluster; the lease will run out"),
        }
    }

    /// Runs `script`, one of those that end sessions of `member` and log their events: its
    /// keys are the member's sessions, the stream, its last id, then `extra`; its arguments
    /// `args`, then the stream's cap and the time now.
    pub(crate) async fn end_sessions<T: redis::FromRedisValue + Send>(
        &self,
        script: &Script,
        member: &str,
        extra: Option<String>,
        args: Vec<String>,
    ) -> Result<T, StoreError> {
        let sessions = keys::sessions(member);
        let cap = self.settings.stream_cap;
        self.call(1, |mut conn| async move {
            let mut call = script.key(sessions);
            call.key(keys::EVENTS).key(keys::EVENTS_LAST);
            if let Some(extra) = extra {
                call.key(extra);
            }
            for arg in args {
                call.arg(arg);
            }
            call.arg(cap).arg(crate::presence::unix_ms_now()).invoke_async(&mut conn).await.map_err(StoreError::from)
        })
        .await
    }

    /// A request id for [`crate::cluster::inbox`].
    pub(crate) fn request_id(&self) -> u64 {
        self.next_request.fetch_add(1, Ordering::Relaxed)
    }
}

/// `EVALSHA` of `script` on `keys` with `args`, for pipelines (scripts are loaded first).
pub(crate) fn evalsha(script: &Script, keys: &[&str]) -> Cmd {
    let mut cmd = redis::cmd("EVALSHA");
    cmd.arg(script.get_hash()).arg(keys.len());
    for key in keys {
        cmd.arg(*key);
    }
    cmd
}

/// Forwards the event log's session changes to the queue.
#[derive(Debug)]
struct Forward {
    queue: Arc<Queue>,
    metrics: Arc<Metrics>,
}

impl Forward {
    fn push(&self, op: Op) {
        let (depth, compacted) = self.queue.push(op);
        self.metrics.redis_queue_depth.set(depth as i64);
        if let Some(compacted) = compacted {
            self.metrics.redis_compacted.inc_by((compacted.data + 2 * compacted.sessions) as u64);
            tracing::warn!(
                data_dropped = compacted.data,
                sessions_dropped = compacted.sessions,
                capacity = self.queue.capacity(),
                "Redis queue full: dropped data events and sessions Redis never saw"
            );
        }
    }
}

impl EventSink for Forward {
    fn online(&self, session: &Session, at_ms: u64) {
        self.push(Op::Online { uid: session.uid(), session: session.id(), since_ms: session.since_ms(), at_ms });
    }

    fn offline(&self, session: &Session, reason: CloseReason, at_ms: u64) {
        self.push(Op::Offline { uid: session.uid(), session: session.id(), reason, at_ms });
    }

    fn data(&self, session: &Session, payload: &Bytes, at_ms: u64) {
        self.push(Op::Data { uid: session.uid(), session: session.id(), payload: payload.clone(), at_ms });
    }
}

/// Whether Redis answers, and since when without a failure or a slow call.
#[derive(Debug, Default)]
pub(crate) struct Health {
    up: AtomicBool,
    healthy_since: Mutex<Option<Instant>>,
    /// Set by a failure, taken by the writer: after Redis comes back the node reconciles.
    pub(crate) needs_reconcile: AtomicBool,
    /// The writer has a batch in flight.
    pub(crate) writing: AtomicBool,
}

// === impl Health ===

impl Health {
    fn ok(&self, took: Duration, metrics: &Metrics) {
        let mut since = self.healthy_since.lock().unwrap_or_else(PoisonError::into_inner);
        if took > SLOW_CALL {
            *since = None;
            return;
        }
        if since.is_none() {
            *since = Some(Instant::now());
        }
        if !self.up.swap(true, Ordering::AcqRel) {
            metrics.redis_up.set(1);
            tracing::info!("Redis answers again");
        }
    }

    fn failed(&self, metrics: &Metrics) {
        metrics.redis_errors.inc();
        *self.healthy_since.lock().unwrap_or_else(PoisonError::into_inner) = None;
        self.needs_reconcile.store(true, Ordering::Release);
        if self.up.swap(false, Ordering::AcqRel) {
            metrics.redis_up.set(0);
            tracing::warn!("Redis unreachable: serving clients alone, queueing presence changes");
        }
    }

    /// Whether the last call to Redis worked.
    pub(crate) fn is_up(&self) -> bool {
        self.up.load(Ordering::Acquire)
    }

    /// Whether Redis has answered every call, promptly, for at least `d`.
    pub(crate) fn stable_for(&self, d: Duration) -> bool {
        self.healthy_since.lock().unwrap_or_else(PoisonError::into_inner).is_some_and(|t| t.elapsed() >= d)
    }
}
