//! The cluster's answers to the backend API: the same [`Directory`] as a lone gateway's,
//! read from Redis, so a backend cannot tell one node from several except that answers
//! name the node.
//!
//! A route counts only while its member holds a lease: a dead node's uids look offline
//! from the moment its lease runs out, before the reaper has even begun. Routes naming
//! this member are checked against the local registry, which is exact.
//!
//! A member that holds a lease but has not refreshed it for a couple of ticks is silent
//! (dead, or cut off from Redis, and soon reaped): its uids still count as online, but it
//! is not asked anything. Its uids' presence has no `silent_ms` (nobody who could tell is
//! reachable), pushes to them count as not sent, and a kick answers 503: no `kicked` is
//! ever logged for a client that was not told.

use std::collections::HashMap;
use std::sync::Arc;

use futures_util::future::BoxFuture;
use futures_util::stream::BoxStream;
use futures_util::FutureExt;

use crate::cluster::inbox::{ask, parse_reach};
use crate::cluster::keys::{self, Route};
use crate::cluster::membership::{liveness, nodes, Liveness};
use crate::cluster::shared::Cluster;
use crate::cluster::store::StoreError;
use crate::presence::{
    decode_cursor, encode_cursor, Batch, Claims, Directory, DirectoryError, EventId, Located, NodeCount, OnlineCount,
    Origin, Push, Reach, UidPage, UserState,
};
use crate::proto::Device;

/// The smallest `COUNT` a page's `HSCAN` asks for: a page of a few uids still walks the
/// hash in steps worth a round trip.
const MIN_SCAN_COUNT: usize = 100;

impl From<StoreError> for DirectoryError {
    fn from(e: StoreError) -> DirectoryError {
        DirectoryError::Unavailable(e.to_string())
    }
}

/// The directory of a gateway in a cluster.
#[derive(Debug, Clone)]
pub(crate) struct ClusterDirectory {
    cluster: Arc<Cluster>,
}

// === impl ClusterDirectory ===

impl ClusterDirectory {
    pub(crate) fn new(cluster: Arc<Cluster>) -> ClusterDirectory {
        ClusterDirectory { cluster }
    }

    /// What `member`'s lease says now.
    async fn liveness(&self, member: &str) -> Result<Liveness, StoreError> {
        Ok(liveness(&self.cluster, &[member.to_string()]).await?.pop().unwrap_or(Liveness::Dead))
    }

    /// The routes of `uids`, in order: each uid's sessions, by device.
    async fn routes(&self, uids: &[u64]) -> Result<Vec<Vec<(Device, Route)>>, StoreError> {
        let cmds: Vec<redis::Cmd> = uids.iter().map(|&uid| redis::Cmd::hgetall(keys::route(uid))).collect();
        let values = self.cluster.send_all(cmds).await?;
        let routes: Vec<Vec<(Device, Route)>> = values
            .into_iter()
            .map(|v| {
                let fields: HashMap<String, String> = redis::from_redis_value(v).unwrap_or_default();
                let mut routes: Vec<(Device, Route)> = fields
                    .into_iter()
                    .filter_map(|(device, value)| Some((device.parse().ok()?, Route::parse(&value)?)))
                    // An ended route's `offline` is logged or on its way: the uid is not there.
                    .filter(|(_, route)| !route.ended)
                    .collect();
                // Oldest login first, as a lone gateway lists a uid's sessions.
                routes.sort_by(|a, b| (a.1.since_ms, &a.1.session).cmp(&(b.1.since_ms, &b.1.session)));
                routes
            })
            .collect();
        Ok(routes)
    }

    /// The routes of `uids` whose sessions presence may list: those the member's hash holds.
    /// Pushes and kicks go by the routes alone: a session welcomed a moment ago is reached
    /// before its `APPLY`.
    async fn present_routes(&self, uids: &[u64]) -> Result<Vec<Vec<(Device, Route)>>, StoreError> {
        let routes = self.routes(uids).await?;
        self.held(uids, routes).await
    }

    /// `routes` (of `uids`, in order) less those whose member's hash does not hold the
    /// session. The hash is written by the same script that logs the session's events (`APPLY`,
    /// and `REAP` for a dead member's), so it agrees with the stream, where a route may lag:
    /// - a route is deleted after its member was reaped, and until the member notices, its
    ///   node still holds the session (nemesis seed 9 on a Redis Cluster, run again: a node
    ///   reaped a moment before listed sessions whose `node_lost` the consumer had read);
    /// - on a Redis Cluster the routes live on other servers than the hashes and the stream,
    ///   and a failover of one loses writes the others kept: a route whose end (its mark,
    ///   its deletion) was lost names a session whose `offline` the stream has (nemesis
    ///   seed 6 on a Redis Cluster).
    ///
    /// A login whose `APPLY` has not run yet is not listed either, as its `online` is not
    /// in the stream yet.
    async fn held(
        &self,
        uids: &[u64],
        routes: Vec<Vec<(Device, Route)>>,
    ) -> Result<Vec<Vec<(Device, Route)>>, StoreError> {
        let cmds: Vec<redis::Cmd> = uids
            .iter()
            .zip(&routes)
            .flat_map(|(&uid, routes)| {
                routes.iter().map(move |(device, route)| {
                    redis::Cmd::hget(keys::sessions(&route.member), keys::session_field(uid, device))
                })
            })
            .collect();
        if cmds.is_empty() {
            return Ok(routes);
        }
        let mut held = self.cluster.send_control(cmds).await?.into_iter();
        Ok(routes
            .into_iter()
            .map(|routes| {
                routes
                    .into_iter()
                    .filter(|(_, route)| {
                        let session: Option<String> = held.next().and_then(|v| redis::from_redis_value(v).ok());
                        session.as_deref() == Some(route.session.as_str())
                    })
                    .collect()
            })
            .collect())
    }

    /// For each uid, when its offline grace ends (Redis's unix ms), while it is in one.
    async fn graces(&self, uids: &[u64]) -> Result<Vec<Option<u64>>, StoreError> {
        let mut cmd = redis::cmd("ZMSCORE");
        cmd.arg(keys::GRACE).arg(uids);
        let answer = self.cluster.send_control(vec![cmd]).await?;
        let scores: Vec<Option<f64>> =
            answer.into_iter().next().and_then(|v| redis::from_redis_value(v).ok()).unwrap_or_default();
        Ok(uids.iter().enumerate().map(|(i, _)| scores.get(i).copied().flatten().map(|ms| ms as u64)).collect())
    }

    /// For each uid, the members holding its sessions now (each once) and whether they
    /// answer: this member only for sessions its registry holds, another only while its
    /// lease lives.
    async fn owners(&self, uids: &[u64], routes: &[Vec<(Device, Route)>]) -> Result<Vec<Vec<Owner>>, StoreError> {
        let me = self.cluster.member();
        let others: Vec<String> = routes
            .iter()
            .flatten()
            .filter(|(_, r)| *r.member != *me)
            .map(|(_, r)| r.member.clone())
            .collect::<std::collections::BTreeSet<_>>()
            .into_iter()
            .collect();
        let leases = liveness(&self.cluster, &others).await?;
        let registry = self.cluster.registry();
        let owner = |uid: u64, route: &Route| -> Option<Owner> {
            if *route.member == *me {
                let held = registry.sessions_of(uid, None).iter().any(|s| keys::session_hex(s.id()) == route.session);
                return held.then(|| Owner { member: route.member.clone(), answers: true });
            }
            let i = others.binary_search(&route.member).ok()?;
            match leases[i] {
                Liveness::Dead => None,
                Liveness::Alive => Some(Owner { member: route.member.clone(), answers: true }),
                Liveness::Silent(_) => Some(Owner { member: route.member.clone(), answers: false }),
            }
        };
        Ok(uids
            .iter()
            .zip(routes)
            .map(|(&uid, routes)| {
                let mut owners: Vec<Owner> = Vec::new();
                for found in routes.iter().filter_map(|(_, route)| owner(uid, route)) {
                    if !owners.iter().any(|o| o.member == found.member) {
                        owners.push(found);
                    }
                }
                owners
            })
            .collect())
    }
}

/// The member holding sessions of a uid, and whether it is worth asking.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Owner {
    member: String,
    answers: bool,
}

/// Groups `uids` by the members holding their sessions, keeping each uid's index. Only
/// members that answer: a silent one is not asked.
fn by_member(owners: &[Vec<Owner>]) -> HashMap<String, Vec<usize>> {
    let mut groups: HashMap<String, Vec<usize>> = HashMap::new();
    for (i, owners) in owners.iter().enumerate() {
        for owner in owners.iter().filter(|o| o.answers) {
            groups.entry(owner.member.clone()).or_default().push(i);
        }
    }
    groups
}

impl Directory for ClusterDirectory {
    fn locate(&self, uid: u64) -> BoxFuture<'_, Result<Vec<Located>, DirectoryError>> {
        async move {
            let routes = self.present_routes(&[uid]).await?.pop().unwrap_or_default();
            let me = self.cluster.member();
            let mut members: Vec<&str> = routes.iter().map(|(_, r)| r.member.as_str()).collect();
            members.sort_unstable();
            members.dedup();
            let mut located = Vec::new();
            for member in members {
                let node = keys::node_of(member).to_string();
                if *member == *me {
                    // Only the sessions Redis holds for this member: one the reaper ended
                    // while this node had not noticed yet is gone, as the stream says.
                    let held = |session: u64| {
                        routes.iter().any(|(_, r)| r.member == member && r.session == keys::session_hex(session))
                    };
                    located.extend(self.cluster.locate_here(uid).into_iter().filter(|l| held(l.session)));
                    continue;
                }
                // What the routes alone say: its sessions there, their silence unknown.
                let by_route = || {
                    routes.iter().filter(|(_, r)| r.member == member).map(|(device, r)| Located {
                        node: node.clone(),
                        device: device.clone(),
                        session: u64::from_str_radix(&r.session, 16).unwrap_or(0),
                        since_ms: r.since_ms,
                        silent_ms: None,
                        claims: None,
                        origin: Origin::default(),
                        timeout_ms: None,
                    })
                };
                match self.liveness(member).await? {
                    Liveness::Dead => continue,
                    Liveness::Silent(_) => {
                        located.extend(by_route());
                        continue;
                    }
                    Liveness::Alive => {}
                }
                let uid_text = uid.to_string().into_bytes();
                match ask(&self.cluster, member, "locate", vec![("uid", uid_text)]).await? {
                    Some(answer) => located.extend(String::from_utf8_lossy(&answer).lines().filter_map(|line| {
                        // After the line, a tab and the claims (or nothing), then a tab, the
                        // door, a space and the client's address, then a tab and the timeout
                        // in ms (a node from before timeout classes sends none).
                        let mut parts = line.split('\t');
                        let line = parts.next()?;
                        let claims = parts.next().and_then(|c| Claims::parse(c.as_bytes())).map(Arc::new);
                        let origin = parts.next().map(Origin::parse).unwrap_or_default();
                        let timeout_ms = parts.next().and_then(|t| t.parse::<u32>().ok()).filter(|&t| t > 0);
                        let mut parts = line.splitn(4, ',');
                        let session = u64::from_str_radix(parts.next()?, 16).ok()?;
                        let since_ms = parts.next()?.parse().ok()?;
                        let silent_ms = parts.next()?.parse().ok()?;
                        let device = parts.next().unwrap_or("").parse().unwrap_or_default();
                        let node = node.clone();
                        let silent_ms = Some(silent_ms);
                        Some(Located { node, device, session, since_ms, silent_ms, claims, origin, timeout_ms })
                    })),
                    // Its node holds a lease but did not answer: online by the routes,
                    // silence unknown.
                    None => located.extend(by_route()),
                }
            }
            located.sort_by_key(|l| l.since_ms);
            Ok(located)
        }
        .boxed()
    }

    fn grace_until(&self, uid: u64) -> BoxFuture<'_, Result<Option<u64>, DirectoryError>> {
        async move { Ok(self.graces(&[uid]).await?.pop().flatten()) }.boxed()
    }

    fn last_seen(&self, uid: u64) -> BoxFuture<'_, Result<Option<u64>, DirectoryError>> {
        async move {
            let key = keys::last_seen(uid);
            let at: Option<u64> = self
                .cluster
                .call(1, |mut conn| async move { Ok(redis::cmd("GET").arg(key).query_async(&mut conn).await?) })
                .await?;
            Ok(at)
        }
        .boxed()
    }

    fn last_seen_of<'a>(&'a self, uids: &'a [u64]) -> BoxFuture<'a, Result<Vec<Option<u64>>, DirectoryError>> {
        async move {
            // One pipeline, the keys spread over the cluster's shards.
            let cmds = uids.iter().map(|&uid| redis::Cmd::get(keys::last_seen(uid))).collect();
            let answers = self.cluster.send_all(cmds).await?;
            Ok(answers.into_iter().map(|v| redis::from_redis_value::<Option<u64>>(v).ok().flatten()).collect())
        }
        .boxed()
    }

    fn online_uids<'a>(
        &'a self,
        cursor: Option<&'a str>,
        limit: usize,
    ) -> BoxFuture<'a, Result<UidPage, DirectoryError>> {
        async move {
            let bad = || DirectoryError::BadCursor("not one this gateway handed out");
            // A cursor: the scan's `as_of`, the users hash's scan cursor (`done` once it came
            // back to 0), and the uids the last `HSCAN` gave past the page, handed out first.
            let (as_of, mut scan, mut done, mut rest) = match cursor {
                None => {
                    // Read before the scan begins: every change the scan may miss is after it.
                    let mut cmd = redis::cmd("HMGET");
                    cmd.arg(keys::EVENTS_LAST).arg("ms").arg("n");
                    let answer = self.cluster.send_control(vec![cmd]).await?;
                    let (ms, n): (Option<u64>, Option<u64>) =
                        answer.into_iter().next().map_or(Ok((None, None)), redis::from_redis_value).unwrap_or_default();
                    (EventId { ms: ms.unwrap_or(0), seq: n.unwrap_or(0) }, 0u64, false, Vec::new())
                }
                Some(cursor) => {
                    let f = decode_cursor(cursor, 4)?;
                    let as_of: EventId = f[0].parse().map_err(|()| bad())?;
                    let scan: u64 = f[1].parse().map_err(|_| bad())?;
                    let done = match f[2].as_str() {
                        "0" => false,
                        "1" => true,
                        _ => return Err(bad()),
                    };
                    let rest: Vec<u64> = if f[3].is_empty() {
                        Vec::new()
                    } else {
                        f[3].split(',').map(|u| u.parse().map_err(|_| bad())).collect::<Result<_, _>>()?
                    };
                    (as_of, scan, done, rest)
                }
            };
            let take = rest.len().min(limit);
            let mut uids: Vec<u64> = rest.drain(..take).collect();
            // The users hash holds a field for every uid online as a user (its offline grace
            // included), kept by the scripts that log the stream: `HSCAN` hands out every
            // field present during the whole scan at least once.
            while uids.len() < limit && !done {
                let count = (limit - uids.len()).max(MIN_SCAN_COUNT);
                let mut cmd = redis::cmd("HSCAN");
                cmd.arg(keys::USERS).arg(scan).arg("COUNT").arg(count);
                let answer = self.cluster.send_control(vec![cmd]).await?;
                let (next, fields): (u64, Vec<String>) = answer
                    .into_iter()
                    .next()
                    .map(redis::from_redis_value)
                    .transpose()
                    .map_err(|e| DirectoryError::Unavailable(e.to_string()))?
                    .unwrap_or_default();
                // Field, value, field, value: the values (a uid's sessions) are not needed
                // (`NOVALUES` is Redis 7.4's).
                for uid in fields.iter().step_by(2).filter_map(|f| f.parse::<u64>().ok()) {
                    if uids.len() < limit {
                        uids.push(uid);
                    } else {
                        rest.push(uid);
                    }
                }
                scan = next;
                done = next == 0;
            }
            let cursor = (!done || !rest.is_empty()).then(|| {
                let rest: Vec<String> = rest.iter().map(u64::to_string).collect();
                encode_cursor(&[as_of.to_string(), scan.to_string(), u8::from(done).to_string(), rest.join(",")])
            });
            Ok(UidPage { uids, cursor, as_of })
        }
        .boxed()
    }

    fn query<'a>(&'a self, uids: &'a [u64]) -> BoxFuture<'a, Result<Vec<bool>, DirectoryError>> {
        async move {
            if uids.is_empty() {
                return Ok(Vec::new());
            }
            let routes = self.present_routes(uids).await?;
            let mut online: Vec<bool> = self.owners(uids, &routes).await?.into_iter().map(|o| !o.is_empty()).collect();
            if !self.cluster.settings.offline_grace.is_zero() {
                let graces = self.graces(uids).await?;
                online.iter_mut().zip(graces).for_each(|(on, grace)| *on |= grace.is_some());
            }
            Ok(online)
        }
        .boxed()
    }

    fn online(&self) -> BoxFuture<'_, Result<OnlineCount, DirectoryError>> {
        async move {
            let me = self.cluster.member();
            let registry = self.cluster.registry();
            let local = NodeCount {
                node: self.cluster.settings.node.clone(),
                online: registry.online() as u64,
                connections: self.cluster.metrics.connections_open.get().max(0) as u64,
            };
            let mut count = OnlineCount { online: 0, connections: 0, local: local.clone(), nodes: Vec::new() };
            for figures in nodes(&self.cluster, true).await? {
                let node = if *figures.member == *me {
                    NodeCount { online: figures.online, ..local.clone() }
                } else {
                    NodeCount {
                        node: keys::node_of(&figures.member).to_string(),
                        online: figures.online,
                        connections: figures.connections,
                    }
                };
                count.online += node.online;
                count.connections += node.connections;
                count.nodes.push(node);
            }
            if !self.cluster.settings.offline_grace.is_zero() {
                // uids in their grace belong to no node: the total counts them, no node does.
                let card = self.cluster.send_control(vec![redis::Cmd::zcard(keys::GRACE)]).await?;
                count.online += card.first().and_then(|v| redis::from_redis_value::<u64>(v.clone()).ok()).unwrap_or(0);
            }
            Ok(count)
        }
        .boxed()
    }

    fn push<'a>(
        &'a self,
        uids: &'a [u64],
        device: Option<Device>,
        push: Push,
    ) -> BoxFuture<'a, Result<Vec<Reach>, DirectoryError>> {
        async move {
            let mut sent = vec![Reach::default(); uids.len()];
            if uids.is_empty() {
                return Ok(sent);
            }
            let mut routes = self.routes(uids).await?;
            if let Some(device) = &device {
                for routes in &mut routes {
                    routes.retain(|(d, _)| d == device);
                }
            }
            let device = device.as_ref();
            let owners = self.owners(uids, &routes).await?;
            let me = self.cluster.member();
            let asks = by_member(&owners).into_iter().map(|(member, indices)| {
                let push = &push;
                let me = me.clone();
                async move {
                    if *member == *me {
                        let counts = self.cluster.push_here(indices.iter().map(|&i| uids[i]), device, push);
                        return Ok::<_, StoreError>((indices, counts));
                    }
                    let list = indices.iter().map(|&i| uids[i].to_string()).collect::<Vec<_>>().join(",");
                    let mut fields = vec![
                        ("uids", list.into_bytes()),
                        ("p", push.payload.to_vec()),
                        ("t", push.topic.as_bytes().to_vec()),
                    ];
                    if let Some(device) = device {
                        fields.push(("d", device.as_str().as_bytes().to_vec()));
                    }
                    // No answer in time: nobody can say it was handed over, so it was not.
                    let counts = match ask(&self.cluster, &member, "push", fields).await? {
                        Some(answer) => String::from_utf8_lossy(&answer).split(',').map(parse_reach).collect(),
                        None => vec![Reach::default(); indices.len()],
                    };
                    Ok((indices, counts))
                }
            });
            for (indices, counts) in futures_util::future::try_join_all(asks).await? {
                for (i, reach) in indices.into_iter().zip(counts) {
                    sent[i].sessions += reach.sessions;
                    sent[i].unsubscribed += reach.unsubscribed;
                }
            }
            Ok(sent)
        }
        .boxed()
    }

    fn kick(&self, uid: u64, device: Option<Device>) -> BoxFuture<'_, Result<usize, DirectoryError>> {
        async move {
            let mut routes = self.routes(&[uid]).await?.pop().unwrap_or_default();
            routes.retain(|(d, _)| device.as_ref().is_none_or(|device| d == device));
            let me = self.cluster.member();
            let mut kicked = 0;
            if routes.iter().any(|(_, r)| *r.member == *me) {
                kicked += self.cluster.registry().kick(uid, device.as_ref());
            }
            for (d, route) in routes.iter().filter(|(_, r)| *r.member != *me) {
                let node = keys::node_of(&route.member).to_string();
                match self.liveness(&route.member).await? {
                    Liveness::Dead => continue,
                    Liveness::Silent(ms) => {
                        return Err(DirectoryError::Unavailable(format!(
                            "node {node} holding uid {uid} has not been heard from for {ms} ms; if it is dead the \
                             session ends as node_lost when its lease runs out"
                        )))
                    }
                    Liveness::Alive => {}
                }
                // The holding node ends the session itself and logs it like any kick of its
                // own: route, hash and event change together there, and only once its
                // client is told.
                let mut fields = vec![("uid", uid.to_string().into_bytes()), ("s", route.session.clone().into_bytes())];
                fields.push(("d", d.as_str().as_bytes().to_vec()));
                match ask(&self.cluster, &route.member, "end", fields).await? {
                    Some(answer) => kicked += usize::from(answer == b"1"),
                    None => {
                        return Err(DirectoryError::Unavailable(format!(
                            "node {node} holding uid {uid} did not answer the kick in time"
                        )))
                    }
                }
            }
            Ok(kicked)
        }
        .boxed()
    }

    fn recent(&self, n: usize) -> BoxFuture<'_, Result<EventId, DirectoryError>> {
        async move { Ok(crate::cluster::stream::recent(&self.cluster, n).await?) }.boxed()
    }

    fn follow(&self, after: Option<EventId>) -> BoxStream<'static, Batch> {
        crate::cluster::stream::follow(self.cluster.clone(), after)
    }

    fn presence_of<'a>(&'a self, uids: &'a [u64]) -> BoxFuture<'a, Result<Vec<(UserState, EventId)>, DirectoryError>> {
        async move {
            // The users, their statuses and the stream's position in one step on the control
            // slot (`PRESENCE_OF`); when an offline uid was last seen, from its own key after.
            let keys = [keys::USERS, keys::STATUS, keys::USER_AT, keys::EVENTS_LAST];
            let mut cmd = crate::cluster::shared::evalsha(&self.cluster.scripts.presence_of, &keys);
            for uid in uids {
                cmd.arg(*uid);
            }
            let answer = self.cluster.send_control(vec![cmd]).await?.pop().unwrap_or(redis::Value::Nil);
            let parts: Vec<redis::Value> = redis::from_redis_value(answer).unwrap_or_default();
            if parts.len() != 2 + 3 * uids.len() {
                return Err(DirectoryError::Unavailable(format!("PRESENCE_OF answered {} values", parts.len())));
            }
            let number = |v: &redis::Value| redis::from_redis_value::<u64>(v.clone()).unwrap_or(0);
            let at = EventId { ms: number(&parts[0]), seq: number(&parts[1]) };
            let offline: Vec<u64> = uids
                .iter()
                .zip(parts[2..].chunks(3))
                .filter(|(_, p)| number(&p[0]) == 0)
                .map(|(&uid, _)| uid)
                .collect();
            let seen = if offline.is_empty() { Vec::new() } else { self.last_seen_of(&offline).await? };
            let mut seen = seen.into_iter();
            let states = parts[2..]
                .chunks(3)
                .map(|p| {
                    let state = if number(&p[0]) == 1 {
                        let status: String = redis::from_redis_value(p[2].clone()).unwrap_or_default();
                        UserState { online: true, at_ms: number(&p[1]), status: Arc::from(status), last_seen_ms: None }
                    } else {
                        let last_seen_ms = seen.next().flatten();
                        let at_ms = last_seen_ms.unwrap_or(0);
                        UserState { online: false, at_ms, status: Arc::from(""), last_seen_ms }
                    };
                    (state, at)
                })
                .collect();
            Ok(states)
        }
        .boxed()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uids_group_by_the_members_holding_them() {
        let owner = |m: &str, answers| Owner { member: m.into(), answers };
        let owners =
            [vec![owner("a", true)], vec![], vec![owner("b", true), owner("a", true)], vec![owner("c", false)]];
        let groups = by_member(&owners);
        assert_eq!(groups["a"], vec![0, 2]);
        assert_eq!(groups["b"], vec![2]);
        assert_eq!(groups.len(), 2, "a silent member is not asked");
    }
}
