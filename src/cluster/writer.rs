//! The writer: takes this node's session changes to Redis in batches, and reconciles after
//! Redis was away.
//!
//! A batch is two steps whatever its size: the routes (one small script per uid, sent
//! together on the multiplexed connection), then one `APPLY` script on the control slot
//! that updates this member's session hash and appends the events. A batch of ends only,
//! on a single Redis, goes as one pipeline: one round trip for a whole tick's expiries.
//! Routes change before events, so presence never shows a uid online after its offline
//! event. A failed batch is retried as it was, under the same number, and `APPLY` skips a
//! number it has already applied: a lost reply never duplicates an event.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use futures_util::future::try_join_all;
use redis::Value;
use tokio_util::sync::CancellationToken;

use crate::client::CloseReason;
use crate::cluster::keys;
use crate::cluster::node::{evalsha, Cluster};
use crate::cluster::queue::Op;
use crate::cluster::store::{Conn, StoreError};

/// Most changes in one batch: a mass expiry of this many uids still goes in one batch,
/// and one script call stays well under a second of Redis time.
const MAX_BATCH: usize = 16_384;

/// How long the writer waits after the first change of a batch for more to join it, so
/// a burst of logins costs a few round trips, not one each.
const BATCH_LINGER: Duration = Duration::from_millis(2);

/// Pauses between retries of a batch while Redis is away, doubling up to the last.
const RETRY_BACKOFF: [Duration; 4] =
    [Duration::from_millis(50), Duration::from_millis(200), Duration::from_millis(500), Duration::from_secs(1)];

/// How often an idle writer checks whether a reconcile is due.
const IDLE_CHECK: Duration = Duration::from_millis(500);

/// Runs until `stop`.
pub(crate) async fn run(cluster: Arc<Cluster>, stop: CancellationToken) {
    let mut seq: u64 = 0;
    loop {
        if cluster.queue.len() == 0 {
            tokio::select! {
                _ = cluster.queue.ready() => {}
                _ = tokio::time::sleep(IDLE_CHECK) => {}
                _ = stop.cancelled() => return,
            }
        }
        if cluster.health.is_up() && cluster.health.needs_reconcile.swap(false, Ordering::AcqRel) {
            if let Err(e) = reconcile(&cluster).await {
                tracing::warn!(error = %e, "reconcile with Redis failed; trying again");
                cluster.health.needs_reconcile.store(true, Ordering::Release);
            }
        }
        if cluster.queue.len() == 0 {
            continue;
        }
        if cluster.queue.len() < MAX_BATCH {
            tokio::time::sleep(BATCH_LINGER).await;
        }
        cluster.health.writing.store(true, Ordering::Release);
        let batch = cluster.queue.take(MAX_BATCH);
        cluster.metrics.redis_queue_depth.set(cluster.queue.len() as i64);
        seq += 1;
        let mut attempt = 0;
        while let Err(e) = apply(&cluster, &batch, seq).await {
            if attempt == 0 {
                tracing::warn!(error = %e, changes = batch.len(), "a batch did not reach Redis; retrying");
            }
            let pause = RETRY_BACKOFF[attempt.min(RETRY_BACKOFF.len() - 1)];
            attempt += 1;
            tokio::select! {
                _ = tokio::time::sleep(pause) => {}
                _ = stop.cancelled() => {
                    cluster.health.writing.store(false, Ordering::Release);
                    return;
                }
            }
        }
        cluster.health.writing.store(false, Ordering::Release);
    }
}

/// Applies one batch: routes, then the control slot.
async fn apply(cluster: &Cluster, batch: &[Op], seq: u64) -> Result<(), StoreError> {
    let member = cluster.member();
    let routes: Vec<redis::Cmd> = batch.iter().filter_map(|op| route_cmd(cluster, &member, op)).collect();
    let logins = batch.iter().any(|op| matches!(op, Op::Online { .. }));
    let single = !cluster.target.is_cluster();
    if !logins && single {
        // Ends and data only, on one server: routes and events in one round trip, in order.
        let control = apply_cmd(cluster, &member, batch, seq, &[]);
        let n = routes.len() as u64 + 1;
        return cluster
            .call(n, |mut conn| async move {
                let mut pipe = redis::pipe();
                for cmd in routes {
                    pipe.add_command(cmd).ignore();
                }
                pipe.add_command(control).ignore();
                pipe.query_async::<()>(&mut conn).await.map_err(StoreError::from)
            })
            .await;
    }
    let replaced: Vec<Value> = if routes.is_empty() {
        Vec::new()
    } else {
        let n = routes.len() as u64;
        cluster.call(n, |conn| send_all(conn, routes, single)).await?
    };
    // Each login's answer: the owner it replaced, if any.
    let mut answers = replaced.into_iter();
    let mut replaced_by_login = Vec::new();
    for op in batch {
        match op {
            Op::Online { .. } => replaced_by_login.push(match answers.next() {
                Some(Value::BulkString(b)) => String::from_utf8_lossy(&b).into_owned(),
                _ => String::new(),
            }),
            Op::Offline { .. } => {
                answers.next();
            }
            Op::Data { .. } => {}
        }
    }
    let control = apply_cmd(cluster, &member, batch, seq, &replaced_by_login);
    cluster
        .call(1, |mut conn| async move { control.query_async::<()>(&mut conn).await.map_err(StoreError::from) })
        .await
}

/// Sends `cmds` together: a pipeline on one server, concurrent commands (each routed to
/// its key's master) on a cluster. Answers come back in order.
pub(crate) async fn send_all(conn: Conn, cmds: Vec<redis::Cmd>, single: bool) -> Result<Vec<Value>, StoreError> {
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

/// The route step of `op`, if it has one.
fn route_cmd(cluster: &Cluster, member: &str, op: &Op) -> Option<redis::Cmd> {
    match op {
        Op::Online { uid, session, since_ms, .. } => {
            let mut cmd = evalsha(&cluster.scripts.route_set, &[&keys::route(*uid)]);
            cmd.arg(format!("{member}|{}", keys::session_hex(*session))).arg(*since_ms);
            Some(cmd)
        }
        Op::Offline { uid, session, .. } => {
            let mut cmd = evalsha(&cluster.scripts.route_del, &[&keys::route(*uid)]);
            cmd.arg(keys::owner_prefix(member, &keys::session_hex(*session)));
            Some(cmd)
        }
        Op::Data { .. } => None,
    }
}

/// The `APPLY` call for `batch`; `replaced` has one entry per login, in order.
fn apply_cmd(cluster: &Cluster, member: &str, batch: &[Op], seq: u64, replaced: &[String]) -> redis::Cmd {
    let (sessions, applied) = (keys::sessions(member), keys::applied(member));
    let mut cmd = evalsha(&cluster.scripts.apply, &[&sessions, keys::EVENTS, keys::EVENTS_LAST, &applied]);
    cmd.arg(member).arg(&cluster.settings.node).arg(seq).arg(cluster.settings.stream_cap);
    let mut replaced = replaced.iter();
    for op in batch {
        match op {
            Op::Online { uid, session, at_ms, .. } => {
                let x = replaced.next().map(String::as_str).unwrap_or("");
                cmd.arg("L").arg(*uid).arg(keys::session_hex(*session)).arg(x).arg(*at_ms);
            }
            Op::Offline { uid, session, reason, at_ms } => {
                cmd.arg("E").arg(*uid).arg(keys::session_hex(*session)).arg(reason.label()).arg(*at_ms);
            }
            Op::Data { uid, session, payload, at_ms } => {
                cmd.arg("D").arg(*uid).arg(keys::session_hex(*session)).arg(payload.as_ref()).arg(*at_ms);
            }
        }
    }
    cmd
}

/// Brings Redis in line with this node's truth after Redis was away: sessions Redis lacks
/// are announced again (online once more only if Redis had lost them), sessions Redis has
/// that this node does not are ended (as `disconnect`: the reason was lost with Redis's
/// copy), and routes that lost their owner are pointed back at it. Changes go through the
/// queue, behind everything already waiting, so the order of events per uid holds.
async fn reconcile(cluster: &Arc<Cluster>) -> Result<(), StoreError> {
    let member = cluster.member();
    let held = scan_sessions(cluster, &member).await?;
    let registry = cluster.registry();
    let live = registry.live_sessions();
    let mut announced = 0usize;
    let mut ended = 0usize;
    let mut routes_checked = Vec::new();
    let mut local: HashMap<u64, u64> = HashMap::with_capacity(live.len());
    for session in &live {
        local.insert(session.uid(), session.id());
        if held.get(&session.uid()) == Some(&keys::session_hex(session.id())) {
            routes_checked.push(session.clone());
        } else if registry.events().reassert(session) {
            announced += 1;
        }
    }
    for (uid, hex) in &held {
        let Ok(session) = u64::from_str_radix(hex, 16) else { continue };
        if local.get(uid) != Some(&session) {
            let at_ms = crate::presence::unix_ms_now();
            cluster.queue.push(Op::Offline { uid: *uid, session, reason: CloseReason::Disconnect, at_ms });
            ended += 1;
        }
    }
    // Sessions Redis holds: their routes may have been lost or left naming a dead member.
    let cmds: Vec<redis::Cmd> = routes_checked.iter().map(|s| redis::Cmd::get(keys::route(s.uid()))).collect();
    let single = !cluster.target.is_cluster();
    let n = cmds.len() as u64;
    let values = if cmds.is_empty() { Vec::new() } else { cluster.call(n, |c| send_all(c, cmds, single)).await? };
    let mut rerouted = 0usize;
    for (session, value) in routes_checked.iter().zip(values) {
        let route = match value {
            Value::BulkString(b) => keys::Route::parse(&String::from_utf8_lossy(&b)),
            _ => None,
        };
        // A route naming another member means a newer login elsewhere, whose batch ends
        // this session; no route (or a garbled one) is pointed back here.
        if route.is_none() && registry.events().reassert(session) {
            rerouted += 1;
        }
    }
    tracing::info!(live = live.len(), held = held.len(), announced, ended, rerouted, "reconciled with Redis");
    Ok(())
}

/// Every entry of `member`'s session hash.
async fn scan_sessions(cluster: &Cluster, member: &str) -> Result<HashMap<u64, String>, StoreError> {
    let key = keys::sessions(member);
    let mut cursor: u64 = 0;
    let mut held = HashMap::new();
    loop {
        let key = key.clone();
        let (next, pairs): (u64, Vec<(u64, String)>) = cluster
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
