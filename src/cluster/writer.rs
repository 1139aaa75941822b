//! The writer: takes this node's session changes to Redis in batches, and reconciles after
//! Redis was away.
//!
//! A batch is two steps whatever its size: the routes (one small script per uid, sent
//! together on the multiplexed connection), then one `APPLY` script on the control slot
//! that updates this member's session hash and appends the events. A batch of ends only,
//! on a single Redis, goes as one pipeline: one round trip for a whole tick's expiries.
//! Routes change before events, so presence never shows a uid online after its offline
//! event. Each change has a number, and `APPLY` skips the numbers it has already applied:
//! a failed batch is sent again under the same numbers, and a lost reply never duplicates
//! an event. After a timeout the batch is sent again cut in half (down to [`MIN_BATCH`]),
//! and batches grow back while Redis answers quickly: a Redis too slow to take a whole
//! batch within the response deadline still takes the queue in smaller pieces, where a
//! batch sent whole again and again would never get through.
//!
//! A batch counts as written once `APPLY` answered and (with `--redis-min-replicas N`)
//! `WAIT` says N replicas hold it. `APPLY` answering "fenced" means this member was reaped:
//! the node rejoins under a new name and the batch goes again under it (its routes move
//! to the new name), so every login the node welcomed reaches the stream.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use redis::Value;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::cluster::ended::Ended;
use crate::cluster::queue::{cut, Op, Taken};
use crate::cluster::shared::{evalsha, Cluster};
use crate::cluster::store::StoreError;
use crate::cluster::{keys, membership};
use crate::presence::{Session, Will};
use crate::proto::CloseReason;

/// Most changes in one batch: a mass expiry of this many uids still goes in one batch,
/// and one script call stays well under a second of Redis time.
const MAX_BATCH: usize = 16_384;

/// How long the writer waits after the first change of a batch for more to join it, so
/// a burst of logins costs a few round trips, not one each.
const BATCH_LINGER: Duration = Duration::from_millis(2);

/// Pauses between retries of a batch while Redis is away, doubling up to the last.
const RETRY_BACKOFF: [Duration; 4] =
    [Duration::from_millis(50), Duration::from_millis(200), Duration::from_millis(500), Duration::from_secs(1)];

/// How long one `WAIT` for `--redis-min-replicas` may hold the command connection (every
/// call of this node queues behind it): short, and tried again while replicas lag.
const REPLICA_WAIT: Duration = Duration::from_millis(100);

/// How long Redis answers every call promptly after an outage or a slow spell before the
/// writer reconciles: a few lease renewals' worth, so one prompt answer in an overload does
/// not start one.
const RECONCILE_SETTLE: Duration = Duration::from_secs(2);

/// Least time between two reconciles after outages or slow spells: a Redis that keeps
/// timing out under load would otherwise be read back a node's every session each time it
/// recovers for a moment. Lost writes reconcile at once, whenever they are seen.
const RECONCILE_EVERY: Duration = Duration::from_secs(60);

/// Route reads one call of a reconcile carries, as `HSCAN`'s count: each call stays far
/// inside the response deadline however many sessions the node holds.
const RECONCILE_STEP: usize = 1000;

/// How often an idle writer checks whether a reconcile is due.
const IDLE_CHECK: Duration = Duration::from_millis(500);

/// Fewest changes a batch is cut to after timeouts: a batch this small fits within the
/// response deadline on any Redis that answers at all.
const MIN_BATCH: usize = 64;

/// A batch answered within this lets the next one be twice as big (up to [`MAX_BATCH`]):
/// a quarter of the response deadline leaves room for Redis to slow down fourfold before
/// a batch of that size times out.
const FAST_ENOUGH: Duration = Duration::from_millis(crate::cluster::store::RESPONSE_TIMEOUT.as_millis() as u64 / 4);

/// What the writer remembers between batches.
///
/// Every change the writer takes gets a number, growing for the whole run, across
/// members. A batch is a run of consecutive numbers, and `APPLY` keeps the member's highest
/// number applied: a batch sent again, whole or cut shorter after a timeout, skips the
/// changes Redis already has, even when a longer send it gave up on ran after all.
#[derive(Debug, Default)]
struct Progress {
    /// The number the next change taken gets.
    next: u64,
    /// The member the last batch was applied under, and that batch's last number: `APPLY`
    /// compares it with its applied marker to notice writes Redis lost.
    member: Option<Arc<str>>,
    prev: u64,
}

/// The changes taken off the queue and not yet in Redis, sent from the front in batches of
/// at most `size`.
#[derive(Debug, Default)]
struct Held {
    taken: Taken,
    /// How many of `taken.ops` are in Redis.
    done: usize,
    /// The number of the first change of `taken.ops`.
    first: u64,
    /// The most changes the next batch sends: halved after a timeout, doubled after a batch
    /// answered within [`FAST_ENOUGH`]. A batch a slow Redis cannot answer in time is never
    /// sent again whole: it would time out again, and the abandoned sends would still load
    /// Redis.
    size: usize,
}

// === impl Held ===

impl Held {
    fn is_empty(&self) -> bool {
        self.done == self.taken.ops.len() && self.taken.dropped == 0
    }

    /// The next batch: at most `size` changes from the front, with the count of data events
    /// dropped before them and their sessions if it is the first. It never ends right after
    /// an end that makes room for a login of the same uid (see [`cut`]).
    fn batch(&self) -> Batch<'_> {
        let rest = &self.taken.ops[self.done..];
        let n = cut(rest, self.size, true);
        let n = match before_end_after_data(&rest[..n]) {
            short if short < n => cut(&rest[..short], short, false),
            _ => n,
        };
        Batch {
            ops: &rest[..n],
            first: self.first + self.done as u64,
            // An empty batch still takes a number: it carries a count of dropped events.
            last: self.first + (self.done + n.max(1)) as u64 - 1,
            // Only the first batch carries it: `written` clears it.
            dropped: self.taken.dropped,
            through: self.taken.through - (rest.len() - n) as u64,
        }
    }

    /// Notes that the batch of `n` changes is in Redis.
    fn written(&mut self, n: usize) {
        self.done += n;
        self.taken.dropped = 0;
        self.taken.lost.clear();
    }
}

/// How many of `ops` come before the first end of a session with data or a will earlier in
/// them: that end goes in the next batch. Its route is marked ended (`ROUTE_END`) before
/// its batch's `APPLY`, and a login elsewhere that replaces the route in between logs the
/// end itself; the session's data, will and status must be in Redis by then, or they would
/// be dropped as those of a session no longer held.
fn before_end_after_data(ops: &[Op]) -> usize {
    let mut busy = HashSet::new();
    for (i, op) in ops.iter().enumerate() {
        match op {
            Op::Data { session, .. } | Op::Will { session, .. } | Op::Status { session, .. } => {
                busy.insert(*session);
            }
            Op::Offline { session, .. } if busy.contains(session) => return i,
            _ => {}
        }
    }
    ops.len()
}

/// One batch: changes numbered `first..=last` (an empty one is numbered `first`).
#[derive(Debug)]
struct Batch<'a> {
    ops: &'a [Op],
    first: u64,
    last: u64,
    /// Data events dropped before these changes, which the stream skips.
    dropped: u64,
    /// The queue position of its last change.
    through: u64,
}

/// How one batch ended.
#[derive(Debug)]
enum Applied {
    /// In Redis; the logins a newer login elsewhere had superseded, to end here, and the
    /// sessions whose data events Redis dropped (taken over meanwhile), to end here too.
    Written { superseded: Vec<(u64, u64)>, dropped: Vec<(u64, u64)> },
    /// The member was reaped: nothing of this try reached Redis but the routes it set.
    /// `applied` is the member's applied marker as the fence fell: an earlier try of the
    /// batch, whose reply was lost, may have applied its changes up to there.
    Fenced { applied: u64 },
}

/// `APPLY`'s answer for a member that was reaped.
const FENCED: i64 = -1;

/// `APPLY`'s answer when its applied marker was behind the member's last batch.
const LOST_WRITES: i64 = 2;

/// `ROUTE_SET`'s answer for a login a newer one superseded.
const SUPERSEDED: &str = "!";

/// Runs until `stop`.
pub(crate) async fn run(cluster: Arc<Cluster>, stop: CancellationToken) {
    let mut progress = Progress { next: 1, ..Progress::default() };
    let mut held = Held { size: MAX_BATCH, ..Held::default() };
    let mut last_reconcile: Option<Instant> = None;
    let mut ended = Ended::default();
    loop {
        if held.is_empty() {
            cluster.health.writing.store(false, Ordering::Release);
            if cluster.queue.is_drained() {
                tokio::select! {
                    _ = cluster.queue.ready() => {}
                    _ = tokio::time::sleep(IDLE_CHECK) => {}
                    _ = stop.cancelled() => return,
                }
            }
            if reconcile_due(&cluster.health, last_reconcile)
                && cluster.health.needs_reconcile.swap(false, Ordering::AcqRel)
            {
                cluster.health.lost_writes.store(false, Ordering::Release);
                last_reconcile = Some(Instant::now());
                if let Err(e) = reconcile(&cluster, &mut ended).await {
                    tracing::warn!(error = %e, "reconcile with Redis failed; trying again");
                    cluster.health.needs_reconcile.store(true, Ordering::Release);
                }
            }
            if cluster.queue.is_drained() {
                continue;
            }
            if cluster.queue.len() < MAX_BATCH {
                tokio::time::sleep(BATCH_LINGER).await;
            }
            cluster.health.writing.store(true, Ordering::Release);
            let taken = cluster.queue.take(MAX_BATCH);
            cluster.metrics.redis_queue_depth.set(cluster.queue.len() as i64);
            cluster.metrics.redis_queue_bytes.set(cluster.queue.bytes() as i64);
            let first = progress.next;
            progress.next += taken.ops.len().max(1) as u64;
            held = Held { taken, done: 0, first, size: held.size };
        }
        if !write_one(&cluster, &mut held, &mut progress, &mut ended, &stop).await {
            cluster.health.writing.store(false, Ordering::Release);
            return;
        }
    }
}

/// Whether a reconcile asked for may run now: at once after a sign of lost writes; after
/// an outage or a slow spell once Redis has answered every call promptly for
/// [`RECONCILE_SETTLE`], and at most once every [`RECONCILE_EVERY`]. A reconcile reads
/// every session of the node back (a scan and a route read each): run at every timeout of
/// an overloaded Redis, it would add the most load where there is the least room (the first
/// million-session run made 26 route reads per session).
fn reconcile_due(health: &crate::cluster::shared::Health, last: Option<Instant>) -> bool {
    let spaced = last.is_none_or(|t| t.elapsed() >= RECONCILE_EVERY);
    health.is_up() && (health.lost_writes.load(Ordering::Acquire) || (spaced && health.stable_for(RECONCILE_SETTLE)))
}

/// Writes the next batch of `held`, retrying (smaller after each timeout) until it is in
/// Redis, and notes its ends in `ended`; false if `stop` came first.
async fn write_one(
    cluster: &Arc<Cluster>,
    held: &mut Held,
    progress: &mut Progress,
    ended: &mut Ended,
    stop: &CancellationToken,
) -> bool {
    let member = cluster.member();
    if progress.member.as_deref() != Some(&*member) {
        progress.prev = 0;
    }
    if !cluster.has_leased(&member) {
        // A member's first batch waits for its lease. `MEMBERS` lists a member from its
        // first `LEASE`, and reapers look only there: a node that wrote under a name it
        // never leased and then died would leave sessions no reaper finds, online for good
        // (the model of issue 53 found it: a node fenced, its batch sent again under its
        // new name, and a crash before its next renewal).
        match crate::cluster::membership::refresh(cluster, &member).await {
            Ok(true) => {}
            Ok(false) => {
                cluster.rejoin(&member);
                return true;
            }
            Err(e) => {
                tracing::debug!(error = %e, "a new member's lease before its first batch failed; retrying");
                tokio::select! {
                    _ = tokio::time::sleep(RETRY_BACKOFF[0]) => return true,
                    _ = stop.cancelled() => return false,
                }
            }
        }
    }
    let mut attempt = 0;
    let (outcome, n, through, last) = loop {
        let batch = held.batch();
        let (n, through, last) = (batch.ops.len(), batch.through, batch.last);
        let started = Instant::now();
        let result = apply(cluster, &member, &batch, progress.prev, ended).await;
        match result {
            Ok(outcome) => {
                if started.elapsed() < FAST_ENOUGH {
                    held.size = (held.size * 2).min(MAX_BATCH);
                }
                break (outcome, n, through, last);
            }
            Err(e) => {
                // Only a timeout says the batch may be too big (a refusal would refuse any
                // size), and only a batch bigger than the least says how big is too big.
                if e.is_timeout() && n > MIN_BATCH {
                    held.size = held.size.min(n / 2).max(MIN_BATCH);
                }
                if attempt == 0 {
                    tracing::warn!(error = %e, changes = n, next = held.size, "a batch did not reach Redis; retrying");
                }
            }
        }
        let pause = RETRY_BACKOFF[attempt.min(RETRY_BACKOFF.len() - 1)];
        attempt += 1;
        tokio::select! {
            _ = tokio::time::sleep(pause) => {}
            _ = stop.cancelled() => return false,
        }
    };
    let registry = cluster.registry();
    let ops = &held.taken.ops[held.done..held.done + n];
    // Sessions whose data events did not reach the stream end before the position moves
    // on: a client is never told its data was taken (an MQTT PUBACK waits for the
    // position) when it was not.
    let lost: HashSet<(u64, u64)> = held.taken.lost.iter().copied().collect();
    for (uid, session) in lost {
        registry.end_session(uid, session, CloseReason::ServerFull);
    }
    match outcome {
        Applied::Written { superseded, dropped } => {
            cluster.applied(&member, last);
            progress.member = Some(member);
            progress.prev = last;
            let now = Instant::now();
            for op in ops {
                if let Op::Offline { session, .. } = op {
                    ended.insert(*session, now);
                }
            }
            for (uid, session) in superseded.into_iter().chain(dropped) {
                registry.kick_session(uid, session, None);
            }
        }
        Applied::Fenced { applied } => {
            // What of the batch an earlier try applied (its reply lost, the member reaped
            // before the retry) is in Redis, and the reaper ended its sessions: it counts as
            // written (nemesis gray seed 1: sent again, such a login was announced twice).
            // The rest is not lost: it goes again under the member name the node takes now.
            // Its logins were welcomed, and their clients may have sent data: they are
            // announced under the new name, their data follows, and their ends (every
            // session here ends as the node rejoins) come after it, queued behind. What the
            // rest holds of sessions the reaper already ended (`node_lost`) finds them gone
            // from the new member's hash and logs nothing: each session's `offline` stays
            // exactly one. Its routes under the old name become the new name's as each login
            // is routed again (`ROUTE_SET` knows its own session), keeping what each had
            // replaced: taken back instead, a held session a login had replaced went unnamed
            // (nemesis seed 3 at --max-devices 1).
            let first = held.first + held.done as u64;
            let done = usize::try_from((applied + 1).saturating_sub(first)).unwrap_or(usize::MAX).min(n);
            if done > 0 {
                held.written(done);
            }
            cluster.rejoin(&member);
            return true;
        }
    }
    cluster.queue.applied(through);
    // MQTT sessions that sent data may owe PUBACKs now due.
    for (uid, session) in data_sessions(ops) {
        registry.wake_session(uid, session);
    }
    held.written(n);
    true
}

/// Applies one batch under `member`: routes, then the control slot, then (with
/// `--redis-min-replicas`) waits for the replicas. A login's replaced session of this
/// member whose end is in `ended` is marked as such for `APPLY` (forgotten, not kicked).
async fn apply(
    cluster: &Cluster,
    member: &str,
    batch: &Batch<'_>,
    prev: u64,
    ended: &mut Ended,
) -> Result<Applied, StoreError> {
    let ops = batch.ops;
    let keep_route = routes_to_delete(ops);
    let routes: Vec<redis::Cmd> = ops
        .iter()
        .zip(&keep_route)
        .filter(|(_, keep)| **keep)
        .filter_map(|(op, _)| route_cmd(cluster, member, op))
        .collect();
    let logins = ops.iter().any(|op| matches!(op, Op::Online { .. }));
    let mut replaced_by_login = Vec::new();
    let dels = route_dels(cluster, member, ops, &keep_route);
    let mut deleted = false;
    let answer = if !logins && !cluster.is_redis_cluster() {
        // Ends and data only, on one server: routes, events and the ended routes' deletion
        // in one round trip, in order.
        let mut cmds = routes;
        cmds.push(membership::lease_cmd(cluster, member));
        cmds.push(apply_cmd(cluster, member, batch, prev, &[]));
        let at = cmds.len() - 1;
        cmds.extend(dels.iter().cloned());
        deleted = true;
        let mut answers = cluster.send_all(cmds).await?;
        leased(cluster, member, answers.get_mut(at - 1))?;
        answers.into_iter().nth(at).unwrap_or(Value::Nil)
    } else {
        // Each login's answer: the owner it replaced, `!` if superseded, or nothing.
        let mut answers = cluster.send_all(routes).await?.into_iter();
        let now = Instant::now();
        for (op, keep) in ops.iter().zip(&keep_route) {
            match op {
                Op::Online { .. } => replaced_by_login.push(match answers.next() {
                    Some(Value::BulkString(b)) => mark_ended(&String::from_utf8_lossy(&b), member, ended, now),
                    _ => String::new(),
                }),
                Op::Offline { .. } | Op::Forget { .. } if *keep => {
                    answers.next();
                }
                Op::Offline { .. } | Op::Forget { .. } => {}
                Op::Data { .. } | Op::Will { .. } | Op::Status { .. } | Op::Verified => {}
            }
        }
        let control = apply_cmd(cluster, member, batch, prev, &replaced_by_login);
        // The lease first, in one pipeline on the control slot: in order on a Redis Cluster too.
        let mut answers = cluster.send_control(vec![membership::lease_cmd(cluster, member), control]).await?;
        leased(cluster, member, answers.get_mut(0))?;
        answers.pop().unwrap_or(Value::Nil)
    };
    let logins = logins_of(ops).zip(replaced_by_login.iter().map(String::as_str).chain(std::iter::repeat("")));
    if status_of(&answer).0 == FENCED {
        let applied = answer_text(&answer, 2).parse().unwrap_or(0);
        return Ok(Applied::Fenced { applied });
    }
    let superseded = logins.filter(|(_, x)| *x == SUPERSEDED).map(|(login, _)| login).collect();
    if !deleted && !dels.is_empty() {
        // A mark left behind (Redis went away just now) is harmless: presence reads it as
        // gone, and the uid's next login of the device replaces it.
        if let Err(e) = cluster.send_all(dels).await {
            tracing::debug!(error = %e, "ended routes not deleted; the next login replaces them");
        }
    }
    finish(cluster, &answer).await?;
    cluster.record_seen(&answer_text(&answer, 4)).await;
    Ok(Applied::Written { superseded, dropped: dropped_of(&answer) })
}

/// Acts on the answer of the `LEASE` a batch went behind. A member reaped meanwhile is
/// told by `APPLY`'s own answer (its fence), which the batch acts on.
fn leased(cluster: &Cluster, member: &str, answer: Option<&mut Value>) -> Result<(), StoreError> {
    let answer = answer.map(std::mem::take).unwrap_or(Value::Nil);
    membership::lease_taken(cluster, member, answer).map(|_| ())
}

/// Part `at` of a script's array answer, as text (empty when it has none).
fn answer_text(answer: &Value, at: usize) -> String {
    match answer {
        Value::Array(parts) => match parts.get(at) {
            Some(Value::BulkString(b)) => String::from_utf8_lossy(b).into_owned(),
            _ => String::new(),
        },
        _ => String::new(),
    }
}

/// `replaced` (a login's route answer: `<member>|<session>|<device>` a line) with `~` before
/// each entry of this `member` whose end `ended` holds: Redis may still hold such a session
/// only because a failover lost its end, and `APPLY` forgets it instead of kicking it.
fn mark_ended(replaced: &str, member: &str, ended: &mut Ended, now: Instant) -> String {
    let mut mine = |entry: &str| {
        // An ended route's entry (`=<reason>|<at>|<will>|<member>|...`): its owner follows.
        let owner = match entry.strip_prefix('=') {
            Some(ended) => ended.splitn(4, '|').nth(3)?,
            None => entry,
        };
        let mut parts = owner.splitn(3, '|');
        let (m, session) = (parts.next()?, parts.next()?);
        Some(m == member && ended.contains(u64::from_str_radix(session, 16).ok()?, now))
    };
    let entries: Vec<String> = replaced
        .split('\n')
        .map(|entry| if mine(entry) == Some(true) { format!("~{entry}") } else { entry.to_string() })
        .collect();
    entries.join("\n")
}

/// `(uid, session)` of the sessions with data events in `ops`, each once (a set: a batch
/// holds up to [`MAX_BATCH`] of them).
fn data_sessions(ops: &[Op]) -> std::collections::HashSet<(u64, u64)> {
    ops.iter()
        .filter_map(|op| match op {
            Op::Data { uid, session, .. } => Some((*uid, *session)),
            _ => None,
        })
        .collect()
}

/// `APPLY`'s third answer: the `uid:session` (hex) pairs whose data events it dropped.
fn dropped_of(answer: &Value) -> Vec<(u64, u64)> {
    answer_text(answer, 2)
        .split(',')
        .filter_map(|pair| {
            let (uid, session) = pair.split_once(':')?;
            Some((uid.parse().ok()?, u64::from_str_radix(session, 16).ok()?))
        })
        .collect()
}

/// Per op, whether its route step runs: every one but the route deletion of a session a
/// later login of the batch replaces on the same device. That login's `ROUTE_SET` moves the
/// route over it, so the route never goes empty between the two: a login of the device on
/// another node, routed in that gap, would find nothing to replace and be logged online
/// before this session's `offline`.
fn routes_to_delete(ops: &[Op]) -> Vec<bool> {
    let mut last_login: HashMap<(u64, &str), usize> = HashMap::new();
    for (i, op) in ops.iter().enumerate() {
        if let Op::Online { uid, device, .. } = op {
            last_login.insert((*uid, device.as_str()), i);
        }
    }
    ops.iter()
        .enumerate()
        .map(|(i, op)| match op {
            Op::Offline { uid, device, last: false, .. } => {
                last_login.get(&(*uid, device.as_str())).is_none_or(|&login| login < i)
            }
            _ => true,
        })
        .collect()
}

/// `(uid, session)` of each login in `ops`, in order.
fn logins_of(ops: &[Op]) -> impl Iterator<Item = (u64, u64)> + '_ {
    ops.iter().filter_map(|op| match op {
        Op::Online { uid, session, .. } => Some((*uid, *session)),
        _ => None,
    })
}

/// `APPLY`'s `{status, epoch}`.
fn status_of(answer: &Value) -> (i64, u64) {
    let Value::Array(parts) = answer else { return (0, 0) };
    let status = match parts.first() {
        Some(Value::Int(n)) => *n,
        _ => 0,
    };
    (status, parts.get(1).map_or(0, keys::epoch_of))
}

/// `APPLY`'s fourth answer: the stream's last event number.
fn number_of(answer: &Value) -> u64 {
    match answer {
        Value::Array(parts) => parts.get(3).map_or(0, keys::epoch_of),
        _ => 0,
    }
}

/// After an applied batch: notes signs of lost writes, then waits for
/// `--redis-min-replicas` replicas to hold it.
async fn finish(cluster: &Cluster, answer: &Value) -> Result<(), StoreError> {
    let (status, epoch) = status_of(answer);
    if status == LOST_WRITES {
        cluster.lost_writes("the applied marker or the stream's number was behind what this node saw");
    }
    cluster.saw_epoch(epoch);
    cluster.saw_number(epoch, number_of(answer));
    let want = cluster.settings.min_replicas;
    if want == 0 {
        return Ok(());
    }
    let acked: i64 = cluster
        .call(1, |mut conn| async move {
            redis::cmd("WAIT")
                .arg(want)
                .arg(REPLICA_WAIT.as_millis() as u64)
                .query_async(&mut conn)
                .await
                .map_err(StoreError::from)
        })
        .await?;
    if acked < i64::from(want) {
        cluster.metrics.redis_replica_waits.inc();
        return Err(StoreError::Replicas { acked, want });
    }
    Ok(())
}

/// The route step of `op`, if it has one.
fn route_cmd(cluster: &Cluster, member: &str, op: &Op) -> Option<redis::Cmd> {
    match op {
        Op::Online { uid, session, device, since_ms, .. } => {
            let mut cmd = evalsha(&cluster.scripts.route_set, &[&keys::route(*uid)]);
            cmd.arg(format!("{member}|{}", keys::session_hex(*session))).arg(*since_ms).arg(member);
            cmd.arg(device.as_str()).arg(cluster.settings.max_devices);
            Some(cmd)
        }
        // Marked, not deleted: deleted once its `offline` is logged (`route_dels`).
        Op::Offline { uid, session, reason, will, at_ms, .. } => {
            let mut cmd = evalsha(&cluster.scripts.route_end, &[&keys::route(*uid)]);
            cmd.arg(keys::owner_prefix(member, &keys::session_hex(*session)));
            cmd.arg(reason.label()).arg(*at_ms).arg(if will.is_some() { "1" } else { "0" });
            Some(cmd)
        }
        // Its `offline` went out long ago.
        Op::Forget { uid, session, .. } => Some(route_del(cluster, member, *uid, *session)),
        Op::Data { .. } | Op::Will { .. } | Op::Status { .. } | Op::Verified => None,
    }
}

/// Deletes `member`'s route of `session` of `uid`, whatever its device, if it still names it.
fn route_del(cluster: &Cluster, member: &str, uid: u64, session: u64) -> redis::Cmd {
    let mut cmd = evalsha(&cluster.scripts.route_del, &[&keys::route(uid)]);
    cmd.arg(keys::owner_prefix(member, &keys::session_hex(session)));
    cmd
}

/// The deletions of the routes `ops` marked ended (`ROUTE_END`), for once `APPLY` logged
/// their `offline`.
fn route_dels(cluster: &Cluster, member: &str, ops: &[Op], keep_route: &[bool]) -> Vec<redis::Cmd> {
    ops.iter()
        .zip(keep_route)
        .filter_map(|(op, keep)| match op {
            Op::Offline { uid, session, .. } if *keep => Some(route_del(cluster, member, *uid, *session)),
            _ => None,
        })
        .collect()
}

/// The `APPLY` call for `batch`; `replaced` has one entry per login, in order.
fn apply_cmd(cluster: &Cluster, member: &str, batch: &Batch<'_>, prev: u64, replaced: &[String]) -> redis::Cmd {
    let (sessions, applied, reaped) = (keys::sessions(member), keys::applied(member), keys::reaped(member));
    let (wills, claims, verified) = (keys::wills(member), keys::claims(member), keys::verified(member));
    let keys = [
        &*sessions,
        keys::EVENTS,
        keys::EVENTS_LAST,
        &applied,
        &reaped,
        keys::USERS,
        &wills,
        keys::GRACE,
        keys::GRACE_WHY,
        &claims,
        &verified,
    ];
    let mut cmd = evalsha(&cluster.scripts.apply, &keys);
    cmd.arg(member).arg(&cluster.settings.node).arg(batch.last).arg(prev);
    cmd.arg(cluster.settings.stream_cap).arg(cluster.settings.stream_bytes).arg(batch.dropped);
    cmd.arg(cluster.settings.offline_grace.as_millis() as u64);
    cmd.arg(cluster.settings.last_seen_ttl.as_millis() as u64);
    cmd.arg(batch.first);
    let seen = cluster.high_water();
    cmd.arg(seen.epoch_arg()).arg(seen.n).arg(cluster.settings.max_devices);
    let mut replaced = replaced.iter();
    for op in batch.ops {
        match op {
            Op::Online { uid, session, device, first, at_ms, claims, origin, timeout_ms, reroute, .. } => {
                let x = replaced.next().map(String::as_str).unwrap_or("");
                let kind = match (reroute, first) {
                    (true, _) => "R",
                    (false, true) => "L1",
                    (false, false) => "L",
                };
                // The timeout, claims and origin ride in the kind's argument, after "L|", as a
                // will does after "E|": the script's six arguments a change are full.
                let claims = claims.as_ref().map_or("", |claims| claims.as_json());
                let kind = format!("{kind}|{timeout_ms}|{claims}|{origin}");
                cmd.arg(kind).arg(*uid).arg(keys::session_hex(*session)).arg(x).arg(*at_ms).arg(device.as_str());
            }
            Op::Offline { uid, session, device, reason, last, will, at_ms } => {
                let kind = if *last { "E1" } else { "E" };
                let s = keys::session_hex(*session);
                cmd.arg(with_will(kind, will.as_deref()))
                    .arg(*uid)
                    .arg(s)
                    .arg(reason.label())
                    .arg(*at_ms)
                    .arg(device.as_str());
            }
            Op::Will { uid, session, device, will, at_ms } => {
                let s = keys::session_hex(*session);
                cmd.arg(with_will("W", Some(will))).arg(*uid).arg(s).arg("").arg(*at_ms).arg(device.as_str());
            }
            Op::Data { uid, session, device, payload, topic, at_ms } => {
                let s = keys::session_hex(*session);
                // A topic rides in the kind's argument, after "D|": the script's six
                // arguments a change are full.
                let kind = match topic {
                    Some(topic) => format!("D|{topic}"),
                    None => "D".to_string(),
                };
                cmd.arg(kind).arg(*uid).arg(s).arg(payload.as_ref()).arg(*at_ms).arg(device.as_str());
            }
            Op::Status { uid, session, device, status, at_ms } => {
                let s = keys::session_hex(*session);
                cmd.arg("S").arg(*uid).arg(s).arg(status.as_bytes()).arg(*at_ms).arg(device.as_str());
            }
            Op::Forget { uid, session, device } => {
                let s = keys::session_hex(*session);
                cmd.arg("F").arg(*uid).arg(s).arg("").arg(0).arg(device.as_str());
            }
            Op::Verified => {
                cmd.arg("V").arg("").arg("").arg("").arg(0).arg("");
            }
        }
    }
    cmd
}

/// A change's kind with an MQTT will after "|": its topic, 0x00 (which no MQTT topic
/// holds), its payload; the script's six arguments a change are full.
fn with_will(kind: &str, will: Option<&Will>) -> Vec<u8> {
    match will {
        Some(will) => [kind.as_bytes(), b"|", will.topic.as_bytes(), b"\0", &will.payload].concat(),
        None => kind.as_bytes().to_vec(),
    }
}

/// Brings Redis in line with this node's truth after Redis was away: sessions Redis lacks
/// are announced again (online once more only if Redis had lost them), sessions Redis has
/// that this node does not are ended (as `disconnect`: the reason was lost with Redis's
/// copy) or, when `ended` says their end was applied before (a failover lost it), removed
/// without a second `offline`; routes that lost their owner are pointed back at it. Changes
/// go through the queue, behind everything already waiting, so the order of events per uid
/// holds; last goes the mark that this member's hash is current again (`V` in `APPLY`).
async fn reconcile(cluster: &Arc<Cluster>, ended: &mut Ended) -> Result<(), StoreError> {
    let member = cluster.member();
    let held = scan_sessions(cluster, &member).await?;
    let registry = cluster.registry();
    // In this order. A login elsewhere that takes a session over removes it from the hash
    // and sends its kick in one step: after the scan, the session was in the hash; before
    // it, the kick is in the inbox when read here, or was handled (the inbox is trimmed
    // only after its kicks are handled) and the session is no longer live when the live
    // sessions are read next. The other way round, a kick handled between the two reads
    // went unseen, and its session was announced again after its `offline` (nemesis
    // seed 5 at --max-devices 1).
    let kicked = pending_kicks(cluster, &member).await?;
    // Read after the hash: a member reaped before the scan finds its sessions gone from it,
    // and they are not lost but ended (`node_lost`). Announced again here, they went out
    // under the node's new name as it rejoined, each online after its `offline` (the model
    // of issue 53 found it: a node cut off past its lease and reaped reconciled before it
    // learned of the fence). The fence's own path ends them (`Cluster::rejoin`, through the
    // next batch or lease), as after any reaping. One reaped after the scan found its
    // sessions there, and announces none again.
    if fenced(cluster, &member).await? {
        tracing::info!(%member, "not reconciling: this member was reaped; it rejoins");
        return Ok(());
    }
    let live = registry.live_sessions();
    // Read after the live sessions: a session is in the registry only once its login's
    // change is queued (the event log queues it under the uid's entry), and nothing is
    // taken from the queue while this runs, so a live session Redis lacks whose login is
    // still queued was never lost: its login is on its way. Announcing it again put a
    // second `online` behind its own, which a later login of the uid in the same batch
    // could split with a kick (nemesis seed 2 on a Redis Cluster at --max-devices 2, a
    // reconcile after an outage while that outage's logins still waited).
    let queued = cluster.queue.queued_logins();
    let mut announced = 0usize;
    let (mut ending, mut forgotten) = (0usize, 0usize);
    let mut superseded = 0usize;
    let mut routes_checked = Vec::new();
    let mut local: HashMap<String, u64> = HashMap::with_capacity(live.len());
    for session in &live {
        let field = keys::session_field(session.uid(), session.device());
        let in_redis = held.get(&field) == Some(&keys::session_hex(session.id()));
        local.insert(field, session.id());
        if in_redis {
            routes_checked.push(session.clone());
        } else if kicked.contains(&(session.uid(), session.id())) {
            // Not lost: a newer login elsewhere took it over, logged its `offline` and sent
            // the kick that waits in the inbox. Announcing it again would give an `online`
            // after its `offline` (nemesis seed 1); it ends here now, and the kick finds it
            // gone.
            registry.kick_session(session.uid(), session.id(), None);
            superseded += 1;
        } else if queued.contains(&session.id()) {
            // Its login is on its way (above).
        } else if registry.events().reassert(session) {
            announced += 1;
        }
    }
    for (field, hex) in &held {
        let (Ok(session), Some((uid, device))) = (u64::from_str_radix(hex, 16), keys::parse_field(field)) else {
            continue;
        };
        if local.get(field) == Some(&session) {
            continue;
        }
        // Its end was applied: the failover brought it back, and its `offline` went out.
        // Otherwise its end is still queued (ahead of this, so this finds it gone) or lies
        // further back than `ended` remembers: it ends now, once.
        if ended.contains(session, Instant::now()) {
            cluster.queue.enqueue(Op::Forget { uid, session, device });
            forgotten += 1;
        } else {
            let at_ms = crate::presence::unix_ms_now();
            let reason = CloseReason::Disconnect;
            cluster.queue.enqueue(Op::Offline { uid, session, device, reason, last: true, will: None, at_ms });
            ending += 1;
        }
    }
    // Sessions Redis holds: their routes may have been lost or left naming a dead member.
    let mut rerouted = 0usize;
    for (session, route) in routes_checked.iter().zip(read_routes(cluster, &routes_checked).await?) {
        // A route naming another member means a newer login elsewhere, whose batch ends
        // this session; no route (or a garbled or ended one) is pointed back here.
        if route.is_none() && registry.events().reroute(session) {
            rerouted += 1;
        }
    }
    cluster.queue.enqueue(Op::Verified);
    tracing::info!(
        live = live.len(),
        held = held.len(),
        announced,
        ended = ending,
        forgotten,
        remembered = ended.len(),
        rerouted,
        superseded,
        "reconciled with Redis"
    );
    Ok(())
}

/// The `(uid, session)` of every kick waiting in `member`'s inbox: sessions a newer login
/// elsewhere ended, whose `offline` is logged. The inbox is trimmed as it is read, so this
/// is the few kicks of the last moments (at most the inbox's cap).
/// The routes of `sessions`' devices, in order: `None` for none, a garbled one or one
/// that ended. In steps of [`RECONCILE_STEP`].
async fn read_routes(cluster: &Cluster, sessions: &[Arc<Session>]) -> Result<Vec<Option<keys::Route>>, StoreError> {
    let mut routes = Vec::with_capacity(sessions.len());
    for step in sessions.chunks(RECONCILE_STEP) {
        let cmds = step.iter().map(|s| redis::Cmd::hget(keys::route(s.uid()), s.device().as_str())).collect();
        routes.extend(cluster.send_all(cmds).await?.into_iter().map(|value| match value {
            Value::BulkString(b) => keys::Route::parse(&String::from_utf8_lossy(&b)).filter(|r| !r.ended),
            _ => None,
        }));
    }
    Ok(routes)
}

/// Whether `member` was reaped (its fence stands).
async fn fenced(cluster: &Cluster, member: &str) -> Result<bool, StoreError> {
    let key = keys::reaped(member);
    cluster
        .call(1, |mut conn| async move {
            redis::cmd("EXISTS").arg(&key).query_async::<bool>(&mut conn).await.map_err(StoreError::from)
        })
        .await
}

async fn pending_kicks(cluster: &Cluster, member: &str) -> Result<HashSet<(u64, u64)>, StoreError> {
    let inbox = keys::inbox(member);
    let range: redis::streams::StreamRangeReply = cluster
        .call(1, |mut conn| async move {
            redis::cmd("XRANGE").arg(&inbox).arg("-").arg("+").query_async(&mut conn).await.map_err(StoreError::from)
        })
        .await?;
    let kicks = range.ids.iter().filter_map(crate::cluster::inbox::kick_of);
    Ok(kicks.collect())
}

/// Every entry of `member`'s session hash.
async fn scan_sessions(cluster: &Cluster, member: &str) -> Result<HashMap<String, String>, StoreError> {
    let key = keys::sessions(member);
    let mut cursor: u64 = 0;
    let mut held = HashMap::new();
    loop {
        let key = key.clone();
        let (next, pairs): (u64, Vec<(String, String)>) = cluster
            .call(1, |mut conn| async move {
                redis::cmd("HSCAN")
                    .arg(&key)
                    .arg(cursor)
                    .arg("COUNT")
                    .arg(1000)
                    .query_async(&mut conn)
                    .await
                    .map_err(StoreError::from)
            })
            .await?;
        held.extend(pairs);
        if next == 0 {
            return Ok(held);
        }
        cursor = next;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::presence::Origin;
    use crate::proto::Device;

    fn online(uid: u64) -> Op {
        let (device, claims, origin) = (Device::DEFAULT, None, Origin::default());
        Op::Online {
            uid,
            session: uid,
            device,
            first: true,
            since_ms: 0,
            at_ms: 0,
            claims,
            origin,
            timeout_ms: 30_000,
            reroute: false,
        }
    }

    #[tokio::test(start_paused = true)]
    async fn only_this_members_sessions_whose_end_was_applied_are_marked() {
        let mut ended = Ended::default();
        let now = Instant::now();
        ended.insert(0xa, now);
        let chain = "m#1|000000000000000a|\nm#2|000000000000000a|phone\nm#1|000000000000000b|";
        assert_eq!(
            mark_ended(chain, "m#1", &mut ended, now),
            "~m#1|000000000000000a|\nm#2|000000000000000a|phone\nm#1|000000000000000b|"
        );
        assert_eq!(mark_ended("garbled", "m#1", &mut ended, now), "garbled");
    }

    #[test]
    fn cut_batches_keep_their_changes_numbers_and_positions() {
        let taken = Taken { ops: (1..=5).map(online).collect(), dropped: 3, through: 40, lost: vec![(9, 9)] };
        let mut held = Held { taken, done: 0, first: 10, size: 2 };
        let b = held.batch();
        assert_eq!((b.ops.len(), b.first, b.last, b.dropped, b.through), (2, 10, 11, 3, 37));
        held.written(2);
        let b = held.batch();
        // The dropped count and lost sessions went with the first batch.
        assert_eq!((b.ops.len(), b.first, b.last, b.dropped, b.through), (2, 12, 13, 0, 39));
        assert!(held.taken.lost.is_empty());
        held.size = 100;
        held.written(2);
        let b = held.batch();
        assert_eq!((b.ops.len(), b.first, b.last, b.through), (1, 14, 14, 40));
        held.written(1);
        assert!(held.is_empty());
        // A batch of nothing but a count of dropped events still takes a number.
        let held = Held { taken: Taken { dropped: 2, through: 40, ..Taken::default() }, done: 0, first: 15, size: 8 };
        let b = held.batch();
        assert_eq!((b.ops.len(), b.first, b.last, b.dropped), (0, 15, 15, 2));
    }
}
