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
//! member; its clients come back after their retry hint.

use redis::Value;
use std::sync::Arc;
use tokio_util::sync::CancellationToken;

use crate::client::CloseReason;
use crate::cluster::keys;
use crate::cluster::node::{evalsha, Cluster};
use crate::cluster::store::StoreError;
use crate::cluster::writer::send_all;

/// Sessions one reap step takes out of a dead member's hash.
const REAP_STEP: usize = 1000;

/// How long the reaped marker stays: far longer than any partition a node survives.
const REAPED_MARKER_SECS: u64 = 24 * 3600;

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
        match refresh(&cluster).await {
            Ok(true) => {}
            Ok(false) => rejoin(&cluster),
            Err(e) => {
                tracing::debug!(error = %e, "lease refresh failed");
                continue;
            }
        }
        if cluster.health.stable_for(cluster.settings.lease) {
            if let Err(e) = reap_dead(&cluster).await {
                tracing::warn!(error = %e, "reaping dead nodes failed; trying again next tick");
            }
        }
    }
}

/// Refreshes this member's lease; false if the member was reaped.
async fn refresh(cluster: &Cluster) -> Result<bool, StoreError> {
    let member = cluster.member();
    let registry = cluster.registry();
    let value = format!("{} {}", registry.online(), cluster.metrics.connections_open.get().max(0));
    let lease_ms = cluster.settings.lease.as_millis() as u64;
    let script = &cluster.scripts.lease;
    cluster
        .call(1, |mut conn| async move {
            let ok: i64 = script
                .key(keys::lease(&member))
                .key(keys::MEMBERS)
                .key(keys::reaped(&member))
                .arg(&*member)
                .arg(value)
                .arg(lease_ms)
                .invoke_async(&mut conn)
                .await?;
            Ok(ok == 1)
        })
        .await
}

/// This member was reaped: its sessions are offline in Redis already. Ends them here too
/// (their ends find nothing to report) and takes a new member name.
fn rejoin(cluster: &Cluster) {
    let old = cluster.member();
    let fresh = cluster.renew_member();
    tracing::error!(
        %old,
        %fresh,
        "this node was reaped while cut off from Redis; ending its sessions and rejoining"
    );
    cluster.registry().end_all(CloseReason::Shutdown);
}

/// Reaps every member whose lease ran out, if this node claims it first.
async fn reap_dead(cluster: &Cluster) -> Result<(), StoreError> {
    let me = cluster.member();
    for figures in nodes(cluster, false).await? {
        if *figures.member == *me {
            continue;
        }
        reap(cluster, &figures.member).await?;
    }
    Ok(())
}

/// Takes `member`'s sessions out of Redis as `node_lost`, unless another node claimed it.
async fn reap(cluster: &Cluster, member: &str) -> Result<(), StoreError> {
    let me = cluster.member();
    let lease_ms = cluster.settings.lease.as_millis() as u64;
    let claim_key = keys::reaping(member);
    let claimed: Option<String> = cluster
        .call(1, |mut conn| async move {
            redis::cmd("SET")
                .arg(claim_key)
                .arg(&*me)
                .arg("NX")
                .arg("PX")
                .arg(lease_ms)
                .query_async(&mut conn)
                .await
                .map_err(StoreError::from)
        })
        .await?;
    if claimed.is_none() {
        return Ok(());
    }
    let marker = keys::reaped(member);
    cluster
        .call(1, |mut conn| async move {
            redis::cmd("SET")
                .arg(marker)
                .arg(1)
                .arg("EX")
                .arg(REAPED_MARKER_SECS)
                .query_async::<()>(&mut conn)
                .await
                .map_err(StoreError::from)
        })
        .await?;
    let mut reaped = 0usize;
    loop {
        let step = vec![REAP_STEP.to_string()];
        let found: Vec<String> = cluster.end_sessions(&cluster.scripts.reap, member, None, step).await?;
        if found.is_empty() {
            break;
        }
        reaped += found.len() / 2;
        let cmds: Vec<redis::Cmd> = found
            .chunks_exact(2)
            .filter_map(|pair| {
                let uid: u64 = pair[0].parse().ok()?;
                let mut cmd = evalsha(&cluster.scripts.route_del, &[&keys::route(uid)]);
                cmd.arg(keys::owner_prefix(member, &pair[1]));
                Some(cmd)
            })
            .collect();
        let single = !cluster.target.is_cluster();
        let n = cmds.len() as u64;
        cluster.call(n, |conn| send_all(conn, cmds, single)).await?;
    }
    let member_owned = member.to_string();
    cluster
        .call(4, |mut conn| async move {
            let mut pipe = redis::pipe();
            pipe.srem(keys::MEMBERS, &member_owned)
                .del(keys::inbox(&member_owned))
                .del(keys::applied(&member_owned))
                .del(keys::taken(&member_owned))
                .del(keys::sessions(&member_owned));
            pipe.query_async::<()>(&mut conn).await.map_err(StoreError::from)
        })
        .await?;
    tracing::warn!(member, reaped, "reaped a node whose lease ran out: its uids are offline as node_lost");
    Ok(())
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
    let n = cmds.len() as u64;
    // All control keys share one slot, so one pipeline serves a cluster too.
    let values = cluster.call(n, |conn| send_all(conn, cmds, true)).await?;
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

/// For `members`, whether each holds a lease, in one round trip.
pub(crate) async fn alive(cluster: &Cluster, members: &[String]) -> Result<Vec<bool>, StoreError> {
    if members.is_empty() {
        return Ok(Vec::new());
    }
    let cmds: Vec<redis::Cmd> = members.iter().map(|m| redis::Cmd::exists(keys::lease(m))).collect();
    let n = cmds.len() as u64;
    let values = cluster.call(n, |conn| send_all(conn, cmds, true)).await?;
    Ok(values.into_iter().map(|v| matches!(v, Value::Int(1))).collect())
}
