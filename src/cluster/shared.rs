//! What every cluster task shares: this node's member name and the fence around it, the
//! connection to Redis and how healthy it is, and the one way scripts are called.
//!
//! The writer, the membership task, the inbox and the stream reader all use this file and
//! never each other, so the arrows point one way: `node` starts them, they use `shared`.
//!
//! The fence: a member that was reaped (cut off from Redis for longer than its lease) may
//! never change Redis again under that name. Every script that writes under a member
//! checks the member's reaped marker atomically and answers "fenced" instead; whoever
//! meets that answer calls [`Cluster::rejoin`], which is idempotent: the node takes a new
//! member name once and ends every session it held under the old one.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError, RwLock};
use std::time::Duration;

use futures_util::future::try_join_all;
use redis::{Cmd, Script, Value};
use tokio::sync::{oneshot, watch};
use tokio::time::Instant;

use crate::cluster::keys;
use crate::cluster::queue::Queue;
use crate::cluster::scripts::Scripts;
use crate::cluster::store::{Conn, Store, StoreError, Trouble};
use crate::config::RedisTarget;
use crate::metrics::Metrics;
use crate::presence::{Clock, EventId, Located, Push, Reach, Registry};
use crate::proto::{CloseReason, Device};

/// A Redis call slower than this counts as Redis being away: a paused or overloaded Redis
/// must not look healthy to the reaper, which would then reap nodes that only waited.
const SLOW_CALL: Duration = Duration::from_millis(500);

/// What the cluster needs to know of this gateway's settings.
#[derive(Debug, Clone)]
pub(crate) struct Settings {
    pub node: String,
    pub lease: Duration,
    pub tick: Duration,
    /// Most events the shared stream keeps (`--event-log-capacity`).
    pub stream_cap: usize,
    /// Most bytes the shared stream keeps (`--event-log-bytes`).
    pub stream_bytes: usize,
    /// Bytes of pushes a client may leave unread (`Config::max_queued_bytes`).
    pub max_queued: usize,
    /// Replicas that must hold a batch before it counts as written
    /// (`--redis-min-replicas`); 0 does not wait.
    pub min_replicas: u32,
    /// Sessions one uid may hold across the cluster (`--max-devices`): every node must be
    /// started with the same.
    pub max_devices: usize,
    /// The topic a push names none (`--mqtt-push-topic`): every node must be started with
    /// the same.
    pub push_topic: Arc<str>,
    /// How long a uid's `user_offline` waits after its last session across the cluster
    /// ended (`--offline-grace`): every node must be started with the same.
    pub offline_grace: Duration,
    /// How long Redis keeps a uid's last-seen time (`--last-seen-ttl`).
    pub last_seen_ttl: Duration,
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
    registry: Arc<Registry>,
    /// The clock of the registry's ring.
    clock: Clock,
    pub(crate) health: Health,
    /// The stream epoch the scripts last answered with; 0 before the first answer.
    epoch: AtomicU64,
    /// The highest event number the scripts answered with, and the epoch it belongs to:
    /// every batch sends it, and a stream whose number is lower in the same epoch lost
    /// writes (see `APPLY`).
    high_water: Mutex<HighWater>,
    /// Requests to other nodes waiting for their replies, by request id.
    pub(crate) awaiting: Mutex<HashMap<u64, oneshot::Sender<Vec<u8>>>>,
    next_request: AtomicU64,
    /// The newest event id the blocking reader has seen: consumers wait on it.
    pub(crate) tail: watch::Sender<EventId>,
    /// What a change of a user's watch list made through another node calls (the fan-out's
    /// check of that user's sessions here), once the composition root has wired it.
    list_changed: OnceLock<ListChanged>,
    /// The member whose lease Redis took last (`LEASE`): the writer sends nothing under a
    /// member before it is listed (`writer.rs`, `write_one`).
    leased_as: Mutex<Option<Arc<str>>>,
    /// The member the writer's last batch was applied under, and that batch's last number:
    /// the lease compares it with the member's applied marker each tick.
    applied_as: Mutex<Option<(Arc<str>, u64)>>,
}

/// Called with the user whose watch list changed.
pub(crate) type ListChanged = Arc<dyn Fn(u64) + Send + Sync>;

/// The highest event number a script answered with within one stream epoch.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct HighWater {
    pub epoch: u64,
    pub n: u64,
}

impl HighWater {
    /// The epoch as a script takes it: empty for none.
    pub(crate) fn epoch_arg(&self) -> String {
        if self.epoch == 0 {
            String::new()
        } else {
            self.epoch.to_string()
        }
    }
}

impl std::fmt::Debug for Cluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cluster").field("target", &self.target).field("member", &self.member()).finish()
    }
}

// === impl Cluster ===

impl Cluster {
    /// The node that mirrors `registry` (whose ring runs on `clock`) to Redis, taking the
    /// changes its event log forwards to `queue` (see [`crate::cluster::Joining`]).
    pub(crate) fn new(
        target: RedisTarget,
        settings: Settings,
        metrics: Arc<Metrics>,
        queue: Arc<Queue>,
        registry: Arc<Registry>,
        clock: Clock,
    ) -> Cluster {
        let member = keys::new_member(&settings.node);
        Cluster {
            target,
            store: Store::default(),
            scripts: Scripts::new(),
            queue,
            settings,
            metrics,
            member: RwLock::new(member.into()),
            registry,
            clock,
            health: Health::default(),
            epoch: AtomicU64::new(0),
            high_water: Mutex::default(),
            awaiting: Mutex::new(HashMap::new()),
            next_request: AtomicU64::new(u64::from(keys::rand_u32()) << 32),
            tail: watch::Sender::new(EventId { ms: 0, seq: 0 }),
            list_changed: OnceLock::new(),
            leased_as: Mutex::new(None),
            applied_as: Mutex::new(None),
        }
    }

    /// The writer's batch through change `last` was applied under `member`.
    pub(crate) fn applied(&self, member: &Arc<str>, last: u64) {
        *self.applied_as.lock().unwrap_or_else(PoisonError::into_inner) = Some((member.clone(), last));
    }

    /// The last change `member` had applied, as far as this node knows (0: none).
    pub(crate) fn applied_through(&self, member: &str) -> u64 {
        match &*self.applied_as.lock().unwrap_or_else(PoisonError::into_inner) {
            Some((m, last)) if **m == *member => *last,
            _ => 0,
        }
    }

    /// Redis took `member`'s lease: it is listed in `MEMBERS`, where reapers look.
    pub(crate) fn leased(&self, member: &str) {
        *self.leased_as.lock().unwrap_or_else(PoisonError::into_inner) = Some(Arc::from(member));
    }

    /// Whether Redis took a lease of `member`.
    pub(crate) fn has_leased(&self, member: &str) -> bool {
        self.leased_as.lock().unwrap_or_else(PoisonError::into_inner).as_deref() == Some(member)
    }

    /// Wires what [`Cluster::watch_list_changed`] calls; the first wiring stays.
    pub(crate) fn on_list_changed(&self, changed: ListChanged) {
        let _ = self.list_changed.set(changed);
    }

    /// A backend changed `user`'s watch list through another node.
    pub(crate) fn watch_list_changed(&self, user: u64) {
        if let Some(changed) = self.list_changed.get() {
            changed(user);
        }
    }

    /// The registry this node mirrors.
    pub(crate) fn registry(&self) -> &Arc<Registry> {
        &self.registry
    }

    /// Whether Redis is a Redis Cluster (commands on several slots cannot share a pipeline).
    pub(crate) fn is_redis_cluster(&self) -> bool {
        self.target.is_cluster()
    }

    /// Hands `push` to the sessions of each of `uids` held here that take it (only those on
    /// `device` when given); for each uid, whom it reached. What a push through this node
    /// and a push request from another do.
    /// The topic of a push that names none (`--mqtt-push-topic`).
    pub(crate) fn push_topic(&self) -> Arc<str> {
        self.settings.push_topic.clone()
    }

    pub(crate) fn push_here(
        &self,
        uids: impl IntoIterator<Item = u64>,
        device: Option<&Device>,
        push: &Push,
    ) -> Vec<Reach> {
        let registry = self.registry();
        uids.into_iter().map(|uid| registry.push(uid, device, push, self.settings.max_queued)).collect()
    }

    /// `uid`'s sessions on this node.
    pub(crate) fn locate_here(&self, uid: u64) -> Vec<Located> {
        let clock = &self.clock;
        self.registry
            .sightings(uid)
            .into_iter()
            .map(|s| Located::here(self.settings.node.to_string(), &s, clock))
            .collect()
    }

    /// This run's member name.
    pub(crate) fn member(&self) -> Arc<str> {
        self.member.read().unwrap_or_else(PoisonError::into_inner).clone()
    }

    /// The member `old` was reaped while this node was cut off: takes a new member name and
    /// ends every session held here with BYE(shutdown) and its retry hint (their offline
    /// events were logged by the reaper as `node_lost`; their clients come back under the
    /// new name). Idempotent: only the first caller for `old` does anything. Returns the
    /// member name to use from now on.
    pub(crate) fn rejoin(&self, old: &str) -> Arc<str> {
        let mut member = self.member.write().unwrap_or_else(PoisonError::into_inner);
        if **member != *old {
            return member.clone();
        }
        let fresh: Arc<str> = keys::new_member(&self.settings.node).into();
        *member = fresh.clone();
        drop(member);
        self.metrics.redis_fenced.inc();
        tracing::error!(
            %old,
            %fresh,
            "this node was reaped while cut off from Redis; ending its sessions and rejoining"
        );
        self.registry().end_all(CloseReason::Shutdown);
        fresh
    }

    /// Notes the stream epoch a script answered with. A change means Redis lost the
    /// cluster's state (restarted empty, or failed over to a replica that lacked it): this
    /// node then reconciles its sessions with Redis.
    pub(crate) fn saw_epoch(&self, epoch: u64) {
        if epoch == 0 {
            return;
        }
        let before = self.epoch.swap(epoch, Ordering::AcqRel);
        if before != 0 && before != epoch {
            self.lost_writes("the event stream's epoch changed");
        }
    }

    /// A script answered that the stream's last event number is `n` in `epoch` (0: none).
    /// A lower number than one seen before proves nothing here: answers of concurrent
    /// calls (the lease's, the writer's) arrive in any order. Only a script, comparing
    /// inside Redis (`APPLY`, `REAP`), can tell that the stream went back.
    pub(crate) fn saw_number(&self, epoch: u64, n: u64) {
        let mut mark = self.high_water.lock().unwrap_or_else(PoisonError::into_inner);
        if mark.epoch == epoch {
            mark.n = mark.n.max(n);
        } else {
            *mark = HighWater { epoch, n };
        }
    }

    /// The highest event number seen, and its epoch.
    pub(crate) fn high_water(&self) -> HighWater {
        *self.high_water.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A script found no epoch although this node has seen one: the stream's state is gone.
    pub(crate) fn saw_no_epoch(&self) {
        if self.epoch.swap(0, Ordering::AcqRel) != 0 {
            self.lost_writes("the event stream's epoch is gone");
        }
    }

    /// Redis has lost writes it had acknowledged: reconcile before the next batch.
    pub(crate) fn lost_writes(&self, why: &str) {
        self.metrics.redis_lost_writes.inc();
        tracing::warn!(why, "Redis lost acknowledged writes; reconciling this node's sessions");
        self.health.lost_writes.store(true, Ordering::Release);
        self.health.needs_reconcile.store(true, Ordering::Release);
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
                self.health.failed(e, &self.metrics, &self.target.redacted().to_string());
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

    /// Records when each uid of `seen` (`uid:unix ms`, comma-separated: a script's list of
    /// the uids it took offline) was last seen, each under its own key for
    /// `--last-seen-ttl`, wherever its slot lives. A hint: a failure is logged, and the
    /// script's work stands.
    pub(crate) async fn record_seen(&self, seen: &str) {
        let ttl = (self.settings.last_seen_ttl.as_millis() as u64).max(1);
        let cmds: Vec<redis::Cmd> = seen
            .split(',')
            .filter_map(|pair| {
                let (uid, at) = pair.split_once(':')?;
                let mut cmd = redis::cmd("SET");
                cmd.arg(keys::last_seen(uid.parse().ok()?)).arg(at).arg("PX").arg(ttl);
                Some(cmd)
            })
            .collect();
        if cmds.is_empty() {
            return;
        }
        if let Err(e) = self.send_all(cmds).await {
            tracing::debug!(error = %e, "could not record when uids were last seen");
        }
    }

    /// Sends `cmds` together and returns their answers in order: see [`send_all`].
    pub(crate) async fn send_all(&self, cmds: Vec<Cmd>) -> Result<Vec<Value>, StoreError> {
        if cmds.is_empty() {
            return Ok(Vec::new());
        }
        let n = cmds.len() as u64;
        let single = !self.is_redis_cluster();
        self.call(n, |conn| send_all(conn, cmds, single)).await
    }

    /// Sends control-slot commands as one pipeline: they share a slot even on a cluster.
    pub(crate) async fn send_control(&self, cmds: Vec<Cmd>) -> Result<Vec<Value>, StoreError> {
        let n = cmds.len() as u64;
        self.call(n, |conn| send_all(conn, cmds, true)).await
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

    /// A request id for the inbox.
    pub(crate) fn request_id(&self) -> u64 {
        self.next_request.fetch_add(1, Ordering::Relaxed)
    }
}

/// `EVALSHA` of `script` on `keys`, for pipelines (scripts are loaded first); the caller
/// adds the arguments.
pub(crate) fn evalsha(script: &Script, keys: &[&str]) -> Cmd {
    let mut cmd = redis::cmd("EVALSHA");
    cmd.arg(script.get_hash()).arg(keys.len());
    for key in keys {
        cmd.arg(*key);
    }
    cmd
}

/// Sends `cmds` together: a pipeline on one server, concurrent commands (each routed to
/// its key's master) on a cluster. Answers come back in order.
async fn send_all(conn: Conn, cmds: Vec<Cmd>, single: bool) -> Result<Vec<Value>, StoreError> {
    if single {
        let mut conn = conn;
        let mut pipe = redis::pipe();
        for cmd in cmds {
            pipe.add_command(cmd);
        }
        return pipe.query_async(&mut conn).await.map_err(StoreError::from);
    }
    try_join_all(cmds.into_iter().map(|cmd| {
        let mut conn = conn.clone();
        async move { cmd.query_async::<Value>(&mut conn).await.map_err(StoreError::from) }
    }))
    .await
}

/// Whether Redis answers, and since when without a failure or a slow call.
#[derive(Debug, Default)]
pub(crate) struct Health {
    up: AtomicBool,
    /// The [`Trouble`] of the last failure since Redis last answered (0: none).
    trouble: std::sync::atomic::AtomicU8,
    /// A call failed since the last time Redis answered: the next answer is news.
    was_down: AtomicBool,
    healthy_since: Mutex<Option<Instant>>,
    /// When a call last got an answer (or the connections were opened): a client whose
    /// calls hang shows here long before any of them fails.
    answered_at: Mutex<Option<Instant>>,
    /// Set by a failure or by a sign of lost writes, taken by the writer: it reconciles.
    pub(crate) needs_reconcile: AtomicBool,
    /// Set by a sign of lost writes: the reconcile is due at once, not once Redis is
    /// steady again.
    pub(crate) lost_writes: AtomicBool,
    /// The writer has a batch in flight.
    pub(crate) writing: AtomicBool,
}

// === impl Health ===

impl Health {
    fn ok(&self, took: Duration, metrics: &Metrics) {
        // An answer, however slow: the client is not stuck.
        self.opened();
        let mut since = self.healthy_since.lock().unwrap_or_else(PoisonError::into_inner);
        if took > SLOW_CALL {
            *since = None;
            return;
        }
        if since.is_none() {
            *since = Some(Instant::now());
        }
        self.trouble.store(0, Ordering::Release);
        if !self.up.swap(true, Ordering::AcqRel) {
            metrics.redis_up.set(1);
            // The first answer after connecting is logged by the store as "connected".
            if self.was_down.swap(false, Ordering::AcqRel) {
                tracing::info!("Redis answers again");
            }
        }
    }

    /// A call (or a connection attempt) to `redis` (the target, without its password)
    /// failed with `error`: counted by kind; a refusal (credentials, ACL) is logged at
    /// error level at once, since no wait will fix it, and an outage once, as it begins.
    pub(crate) fn failed(&self, error: &StoreError, metrics: &Metrics, redis: &str) {
        let trouble = error.trouble();
        metrics.redis_error(trouble.label());
        *self.healthy_since.lock().unwrap_or_else(PoisonError::into_inner) = None;
        self.needs_reconcile.store(true, Ordering::Release);
        self.was_down.store(true, Ordering::Release);
        let before = self.trouble.swap(trouble as u8, Ordering::AcqRel);
        let was_up = self.up.swap(false, Ordering::AcqRel);
        if was_up {
            metrics.redis_up.set(0);
        }
        if before == trouble as u8 && !was_up {
            return;
        }
        if trouble.is_refusal() {
            tracing::error!(%redis, %error, "{}: serving clients alone, queueing presence changes", trouble.text());
        } else {
            tracing::warn!(%redis, %error, "{}: serving clients alone, queueing presence changes", trouble.text());
        }
    }

    /// Why Redis cannot be used now, while it cannot.
    pub(crate) fn trouble(&self) -> Option<Trouble> {
        if self.is_up() {
            return None;
        }
        Trouble::from_code(self.trouble.load(Ordering::Acquire)).or(Some(Trouble::Unreachable))
    }

    /// Whether the last call to Redis worked.
    pub(crate) fn is_up(&self) -> bool {
        self.up.load(Ordering::Acquire)
    }

    /// The connections were (re)opened: the time without an answer counts from now.
    pub(crate) fn opened(&self) {
        *self.answered_at.lock().unwrap_or_else(PoisonError::into_inner) = Some(Instant::now());
    }

    /// How long no call has got an answer, since the connections were first opened.
    pub(crate) fn quiet_for(&self) -> Option<Duration> {
        self.answered_at.lock().unwrap_or_else(PoisonError::into_inner).map(|t| t.elapsed())
    }

    /// Whether Redis has answered every call, promptly, for at least `d`.
    pub(crate) fn stable_for(&self, d: Duration) -> bool {
        self.healthy_since.lock().unwrap_or_else(PoisonError::into_inner).is_some_and(|t| t.elapsed() >= d)
    }
}
