//! Leases and reaping: how the cluster learns that a node died without saying goodbye.
//!
//! Every tick each node refreshes one lease key (`--node-lease` long), not a TTL per uid:
//! one write a tick per node however many uids it holds. A node whose lease ran out is
//! dead: readers treat its routes as offline at once, and exactly one surviving node
//! (whoever sets the reaping key first) takes its sessions out of Redis, logging each one
//! offline as `node_lost`, within the lease plus one tick of the death.
//!
//! A node only reaps after Redis has answered it promptly for a whole lease: when Redis
//! itself was away or paused, every lease may have run out, and the nodes that are alive
//! get that long to renew theirs before anyone is called dead. A node that finds it was
//! reaped (it was cut off from Redis for longer than its lease while the others were not)
//! ends its sessions, whose offline events were already logged, and rejoins as a new
//! member; its clients come back after their retry hint. The batch that met the fence goes
//! again under the new name (see `writer`), so its logins are announced, then ended.
//!
//! Reaping is fenced and resumable: the claim that names the reaper also sets the dead
//! member's reaped marker, after which no script accepts a write under its name; each
//! bounded step logs only the sessions it removed itself and hands their routes to an
//! unroute hash, which any reaper empties before it stops or when it takes over.

use std::sync::Arc;
use std::time::Duration;

use redis::Value;
use tokio_util::sync::CancellationToken;

use crate::cluster::keys;
use crate::cluster::shared::{evalsha, Cluster};
use crate::cluster::store::StoreError;

/// Sessions one reap step looks at: `HSCAN`'s COUNT, so one script call does bounded work
/// (about this many hash buckets) and never blocks Redis for long, however big the hash.
const REAP_STEP: usize = 1000;

/// How long the reaped marker stays: far longer than any partition a node survives.
const REAPED_MARKER_SECS: u64 = 24 * 3600;

/// A member whose lease was last refreshed longer ago than this many ticks is silent:
/// requests to it would only wait out their timeout. A live node refreshes every tick;
/// one more tick covers a slow refresh.
const SILENT_TICKS: u32 = 2;

/// Added to [`SILENT_TICKS`] so a short tick does not call a node silent for one slow
/// round trip.
const SILENT_SLACK: Duration = Duration::from_millis(500);

/// One node as the others see it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct NodeFigures {
    pub member: String,
    pub online: u64,
    pub connections: u64,
}

/// Runs until `stop`: a lease refresh and a look for dead members every tick.
pub(crate) async fn run(cluster: Arc<Cluster>, stop: CancellationToken) {
    let mut every = tokio::time::interval(cluster.settings.tick);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = every.tick() => {}
            _ = stop.cancelled() => return,
        }
        let member = cluster.member();
        match refresh(&cluster, &member).await {
            Ok(true) => {}
            Ok(false) => {
                cluster.rejoin(&member);
                continue;
            }
            Err(e) => {
                tracing::debug!(error = %e, "lease refresh failed");
                continue;
            }
        }
        if !cluster.settings.offline_grace.is_zero() {
            if let Err(e) = release_graces(&cluster).await {
                tracing::warn!(error = %e, "releasing offline graces failed; trying again next tick");
            }
        }
        if cluster.health.stable_for(cluster.settings.lease) {
            if let Err(e) = reap_dead(&cluster, &stop).await {
                tracing::warn!(error = %e, "reaping dead nodes failed; trying again next tick");
            }
        }
    }
}

/// uids one `RELEASE` call logs offline at most: a reconnect storm's graces run out over a
/// few calls, each a short step for Redis.
const RELEASE_STEP: usize = 1000;

/// Logs the `user_offline` of every uid whose offline grace ran out, whichever node began
/// it. Every node runs it every tick: each grace ends exactly once (the script's `ZREM`),
/// within a tick of its end while any node lives.
async fn release_graces(cluster: &Cluster) -> Result<(), StoreError> {
    let script = &cluster.scripts.release;
    loop {
        let (released, epoch): (u64, redis::Value) = cluster
            .call(1, |mut conn| async move {
                let answer = script
                    .key(keys::GRACE)
                    .key(keys::GRACE_WHY)
                    .key(keys::EVENTS)
                    .key(keys::EVENTS_LAST)
                    .key(keys::USERS)
                    .arg(RELEASE_STEP)
                    .arg(cluster.settings.stream_cap)
                    .arg(cluster.settings.stream_bytes)
                    .invoke_async(&mut conn)
                    .await?;
                Ok(answer)
            })
            .await?;
        cluster.saw_epoch(keys::epoch_of(&epoch));
        if released < RELEASE_STEP as u64 {
            return Ok(());
        }
    }
}

/// Refreshes `member`'s lease; false if the member was reaped.
pub(crate) async fn refresh(cluster: &Cluster, member: &str) -> Result<bool, StoreError> {
    let cmd = lease_cmd(cluster, member);
    let answer = cluster.send_control(vec![cmd]).await?.pop().unwrap_or(Value::Nil);
    lease_taken(cluster, member, answer)
}

/// The `LEASE` call for `member`: the lease loop's each tick, and the writer's before each
/// batch, in the same pipeline (`writer.rs`, `apply`). Redis replicates in order, so a
/// replica that holds a batch holds the lease and the membership before it: a failover
/// can never keep a member's sessions and lose the listing that lets a reaper find them
/// (the model of issue 53 found it: a member leased after the replica's copy wrote after
/// the failover and died within the tick, before its lease loop listed it again; its
/// sessions stayed online for good).
pub(crate) fn lease_cmd(cluster: &Cluster, member: &str) -> redis::Cmd {
    let registry = cluster.registry();
    let value = format!("{} {}", registry.online(), cluster.metrics.connections_open.get().max(0));
    let seen = cluster.high_water();
    let (lease, reaped, applied) = (keys::lease(member), keys::reaped(member), keys::applied(member));
    let mut cmd =
        evalsha(&cluster.scripts.lease, &[&lease, keys::MEMBERS, &reaped, keys::EVENTS_LAST, keys::EVENTS, &applied]);
    cmd.arg(member).arg(value).arg(cluster.settings.lease.as_millis() as u64);
    cmd.arg(seen.epoch_arg()).arg(seen.n);
    cmd.arg(cluster.settings.stream_cap).arg(cluster.settings.stream_bytes);
    cmd.arg(cluster.applied_through(member));
    cmd
}

/// Acts on `LEASE`'s answer for `member` (what it tells of the stream and of lost writes);
/// true if Redis took the lease, false if the member was reaped.
pub(crate) fn lease_taken(cluster: &Cluster, member: &str, answer: Value) -> Result<bool, StoreError> {
    let (ok, epoch, n, lost): (i64, Value, u64, i64) =
        redis::from_redis_value(answer).map_err(|e| StoreError::Redis(e.into()))?;
    if lost == 1 {
        cluster.lost_writes("the stream's number or this member's applied marker was behind what this node saw");
    }
    match keys::epoch_of(&epoch) {
        // No epoch: the stream's state is gone (Redis came back empty, or failed over to a
        // replica without it) while this node remembers one.
        0 => cluster.saw_no_epoch(),
        epoch => {
            cluster.saw_epoch(epoch);
            cluster.saw_number(epoch, n);
        }
    }
    if ok == 1 {
        cluster.leased(member);
    }
    Ok(ok == 1)
}

/// Reaps every member whose lease ran out, if this node claims it first.
async fn reap_dead(cluster: &Cluster, stop: &CancellationToken) -> Result<(), StoreError> {
    let me = cluster.member();
    for figures in nodes(cluster, false).await? {
        if *figures.member == *me {
            continue;
        }
        reap(cluster, &figures.member, stop).await?;
    }
    Ok(())
}

/// Claims (or renews this node's claim on) reaping `member`; false if another node holds
/// it or the member renewed its lease.
async fn claim(cluster: &Cluster, member: &str) -> Result<bool, StoreError> {
    let me = cluster.member();
    let lease_ms = cluster.settings.lease.as_millis() as u64;
    let script = &cluster.scripts.claim;
    cluster
        .call(1, |mut conn| async move {
            let held: i64 = script
                .key(keys::lease(member))
                .key(keys::reaping(member))
                .key(keys::reaped(member))
                .key(keys::applied(member))
                .arg(&*me)
                .arg(lease_ms)
                .arg(REAPED_MARKER_SECS)
                .invoke_async(&mut conn)
                .await?;
            Ok(held == 1)
        })
        .await
}

/// Takes `member`'s sessions out of Redis as `node_lost` and deletes their routes, unless
/// another node claimed it. Each step renews the claim; a reaper that dies half way leaves
/// the claim to run out, and the next one finishes the routes already logged (the unroute
/// hash) before it goes on.
async fn reap(cluster: &Cluster, member: &str, stop: &CancellationToken) -> Result<(), StoreError> {
    if !claim(cluster, member).await? {
        return Ok(());
    }
    unroute(cluster, member).await?;
    let (mut reaped, mut forgotten) = (0u64, 0u64);
    let mut cursor = "0".to_string();
    loop {
        let (next, left, n, silent) = reap_step(cluster, member, &cursor).await?;
        reaped += n;
        forgotten += silent;
        unroute(cluster, member).await?;
        // The scan is over only when it came round to cursor 0 and the hash is empty: an
        // empty answer alone says nothing (one HSCAN call bounds its work, not its yield).
        if next == "0" && left == 0 {
            break;
        }
        cursor = next;
        if stop.is_cancelled() || !claim(cluster, member).await? {
            tracing::info!(member, reaped, "stopped reaping half way; the next claim finishes it");
            return Ok(());
        }
    }
    let member_owned = member.to_string();
    let cmds = vec![
        redis::Cmd::srem(keys::MEMBERS, &member_owned),
        redis::Cmd::del(keys::inbox(&member_owned)),
        redis::Cmd::del(keys::applied(&member_owned)),
        redis::Cmd::del(keys::applied_dropped(&member_owned)),
        redis::Cmd::del(keys::verified(&member_owned)),
        redis::Cmd::del(keys::sessions(&member_owned)),
        redis::Cmd::del(keys::unroute(&member_owned)),
        redis::Cmd::del(keys::wills(&member_owned)),
        redis::Cmd::del(keys::claims(&member_owned)),
        redis::Cmd::del(keys::superseded(&member_owned)),
        redis::Cmd::del(keys::reaping(&member_owned)),
    ];
    cluster.send_control(cmds).await?;
    cluster.metrics.redis_reaped.inc_by(reaped);
    tracing::warn!(
        member,
        reaped,
        forgotten,
        "reaped a node whose lease ran out: its uids are offline as node_lost (those forgotten without an \
         event: it died before Redis lost writes, see REAP)"
    );
    Ok(())
}

/// One `REAP` call from `cursor`: `(next cursor, sessions left, sessions reaped, of them
/// removed without an event)`.
async fn reap_step(cluster: &Cluster, member: &str, cursor: &str) -> Result<(String, u64, u64, u64), StoreError> {
    let script = &cluster.scripts.reap;
    let seen = cluster.high_water();
    let (next, left, reaped, epoch, silent, seen, n): (String, u64, u64, redis::Value, u64, String, u64) = cluster
        .call(1, |mut conn| async move {
            let answer = script
                .key(keys::sessions(member))
                .key(keys::EVENTS)
                .key(keys::EVENTS_LAST)
                .key(keys::unroute(member))
                .key(keys::USERS)
                .key(keys::wills(member))
                .key(keys::GRACE)
                .key(keys::GRACE_WHY)
                .key(keys::claims(member))
                .key(keys::verified(member))
                .arg(cursor)
                .arg(REAP_STEP)
                .arg(cluster.settings.stream_cap)
                .arg(cluster.settings.stream_bytes)
                .arg(crate::presence::unix_ms_now())
                .arg(cluster.settings.offline_grace.as_millis() as u64)
                .arg(cluster.settings.last_seen_ttl.as_millis() as u64)
                .arg(seen.epoch_arg())
                .arg(seen.n)
                .invoke_async(&mut conn)
                .await?;
            Ok(answer)
        })
        .await?;
    let epoch = keys::epoch_of(&epoch);
    cluster.saw_epoch(epoch);
    cluster.saw_number(epoch, n);
    cluster.record_seen(&seen).await;
    Ok((next, left, reaped, silent))
}

/// Deletes the routes of the sessions in `member`'s unroute hash (each only if it still
/// names that session) and takes them out of the hash, a bounded step at a time, until
/// the hash is empty.
async fn unroute(cluster: &Cluster, member: &str) -> Result<(), StoreError> {
    let key = keys::unroute(member);
    let mut cursor = "0".to_string();
    loop {
        let scan = redis::cmd("HSCAN").arg(&key).arg(&cursor).arg("COUNT").arg(REAP_STEP).clone();
        let mut answers = cluster.send_control(vec![scan, redis::Cmd::hlen(&key)]).await?.into_iter();
        let (next, pairs): (String, Vec<(String, String)>) = decode(answers.next())?;
        if !pairs.is_empty() {
            let cmds: Vec<redis::Cmd> = pairs
                .iter()
                .filter_map(|(field, session)| {
                    let (uid, _) = keys::parse_field(field)?;
                    let mut cmd = evalsha(&cluster.scripts.route_del, &[&keys::route(uid)]);
                    cmd.arg(keys::owner_prefix(member, session));
                    Some(cmd)
                })
                .collect();
            cluster.send_all(cmds).await?;
            let mut hdel = redis::cmd("HDEL");
            hdel.arg(&key);
            for (uid, _) in &pairs {
                hdel.arg(uid);
            }
            cluster.send_control(vec![hdel]).await?;
        }
        if next == "0" {
            let left: u64 = decode(answers.next())?;
            if left <= (pairs.len() as u64) {
                return Ok(());
            }
        }
        cursor = next;
    }
}

/// The members Redis knows with their figures: with `alive`, those holding a lease (what
/// presence counts); without it, those whose lease ran out (what the reaper takes).
pub(crate) async fn nodes(cluster: &Cluster, alive: bool) -> Result<Vec<NodeFigures>, StoreError> {
    let members: Vec<String> = cluster
        .call(1, |mut conn| async move {
            redis::cmd("SMEMBERS").arg(keys::MEMBERS).query_async(&mut conn).await.map_err(StoreError::from)
        })
        .await?;
    if members.is_empty() {
        return Ok(Vec::new());
    }
    let mut cmds = Vec::with_capacity(members.len() * 2);
    for m in &members {
        cmds.push(redis::Cmd::get(keys::lease(m)));
        cmds.push(redis::Cmd::hlen(keys::sessions(m)));
    }
    let values = cluster.send_control(cmds).await?;
    let mut out = Vec::new();
    for (m, pair) in members.into_iter().zip(values.chunks_exact(2)) {
        let lease = match &pair[0] {
            Value::BulkString(b) => Some(String::from_utf8_lossy(b).into_owned()),
            _ => None,
        };
        if lease.is_some() != alive {
            continue;
        }
        let online = match &pair[1] {
            Value::Int(n) => (*n).max(0) as u64,
            _ => 0,
        };
        let connections = lease.as_deref().and_then(|v| v.split(' ').nth(1)).and_then(|c| c.parse().ok()).unwrap_or(0);
        out.push(NodeFigures { member: m, online, connections });
    }
    out.sort_by(|a, b| a.member.cmp(&b.member));
    Ok(out)
}

/// One answer of a pipeline as `T`.
fn decode<T: redis::FromRedisValue>(value: Option<Value>) -> Result<T, StoreError> {
    redis::from_redis_value(value.unwrap_or(Value::Nil)).map_err(|e| StoreError::Redis(e.into()))
}

/// What a member's lease says about it now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Liveness {
    /// No lease: dead, its uids offline.
    Dead,
    /// It refreshed its lease within the last couple of ticks: it answers requests.
    Alive,
    /// It holds a lease but has not refreshed it for this many ms: probably dead (or cut
    /// off from Redis); asking it would only wait out the request's timeout.
    Silent(u64),
}

/// For `members`, what each one's lease says, in one round trip: how long since each
/// refreshed it, read from its time to live (every node sets it to the same
/// `--node-lease`).
pub(crate) async fn liveness(cluster: &Cluster, members: &[String]) -> Result<Vec<Liveness>, StoreError> {
    if members.is_empty() {
        return Ok(Vec::new());
    }
    let cmds: Vec<redis::Cmd> = members.iter().map(|m| redis::cmd("PTTL").arg(keys::lease(m)).clone()).collect();
    let lease_ms = cluster.settings.lease.as_millis() as i64;
    let silent_after = (cluster.settings.tick * SILENT_TICKS + SILENT_SLACK).as_millis() as i64;
    let values = cluster.send_control(cmds).await?;
    Ok(values
        .into_iter()
        .map(|v| match v {
            Value::Int(left) if left >= 0 => {
                let silent = (lease_ms - left).max(0);
                if silent > silent_after {
                    Liveness::Silent(silent as u64)
                } else {
                    Liveness::Alive
                }
            }
            _ => Liveness::Dead,
        })
        .collect())
}
