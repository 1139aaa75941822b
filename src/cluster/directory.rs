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

use bytes::Bytes;
use futures_util::future::BoxFuture;
use futures_util::stream::BoxStream;
use futures_util::FutureExt;
use redis::Value;

use crate::cluster::inbox::ask;
use crate::cluster::keys::{self, Route};
use crate::cluster::membership::{liveness, nodes, Liveness};
use crate::cluster::shared::Cluster;
use crate::cluster::store::StoreError;
use crate::presence::{Batch, Directory, DirectoryError, EventId, Located, NodeCount, OnlineCount};
use crate::proto::Device;

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

    /// The routes of `uids`, in order.
    async fn routes(&self, uids: &[u64]) -> Result<Vec<Option<Route>>, StoreError> {
        let cmds: Vec<redis::Cmd> = uids.iter().map(|&uid| redis::Cmd::get(keys::route(uid))).collect();
        let values = self.cluster.send_all(cmds).await?;
        Ok(values
            .into_iter()
            .map(|v| match v {
                Value::BulkString(b) => Route::parse(&String::from_utf8_lossy(&b)),
                _ => None,
            })
            .collect())
    }

    /// For each route, the member it names and whether that member answers, if that
    /// member holds the uid now: this member only if the local registry agrees, another
    /// only while its lease lives.
    async fn owners(&self, uids: &[u64], routes: Vec<Option<Route>>) -> Result<Vec<Option<Owner>>, StoreError> {
        let me = self.cluster.member();
        let others: Vec<String> = routes
            .iter()
            .flatten()
            .filter(|r| *r.member != *me)
            .map(|r| r.member.clone())
            .collect::<std::collections::BTreeSet<_>>()
            .into_iter()
            .collect();
        let leases = liveness(&self.cluster, &others).await?;
        let registry = self.cluster.registry();
        Ok(uids
            .iter()
            .zip(routes)
            .map(|(&uid, route)| {
                let route = route?;
                if *route.member == *me {
                    let held =
                        registry.sessions_of(uid, None).iter().any(|s| keys::session_hex(s.id()) == route.session);
                    held.then_some(Owner { member: route.member, answers: true })
                } else {
                    let i = others.binary_search(&route.member).ok()?;
                    match leases[i] {
                        Liveness::Dead => None,
                        Liveness::Alive => Some(Owner { member: route.member, answers: true }),
                        Liveness::Silent(_) => Some(Owner { member: route.member, answers: false }),
                    }
                }
            })
            .collect())
    }
}

/// The member holding a uid, and whether it is worth asking.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Owner {
    member: String,
    answers: bool,
}

/// Groups `uids` by the member their route names, keeping each uid's index.
/// Only members that answer: a silent one is not asked.
fn by_member(owners: &[Option<Owner>]) -> HashMap<String, Vec<usize>> {
    let mut groups: HashMap<String, Vec<usize>> = HashMap::new();
    for (i, owner) in owners.iter().enumerate() {
        if let Some(Owner { member, answers: true }) = owner {
            groups.entry(member.clone()).or_default().push(i);
        }
    }
    groups
}

impl Directory for ClusterDirectory {
    fn locate(&self, uid: u64) -> BoxFuture<'_, Result<Vec<Located>, DirectoryError>> {
        async move {
            let Some(route) = self.routes(&[uid]).await?.pop().flatten() else { return Ok(Vec::new()) };
            let me = self.cluster.member();
            let node = keys::node_of(&route.member).to_string();
            let here = |(device, session, since_ms, silent_ms)| Located {
                node: node.clone(),
                device,
                session,
                since_ms,
                silent_ms: Some(silent_ms),
            };
            if *route.member == *me {
                return Ok(self.cluster.locate_here(uid).into_iter().map(here).collect());
            }
            // What the route alone says: its session, device and silence unknown.
            let by_route = || Located {
                node: node.clone(),
                device: Device::DEFAULT,
                session: u64::from_str_radix(&route.session, 16).unwrap_or(0),
                since_ms: route.since_ms,
                silent_ms: None,
            };
            match self.liveness(&route.member).await? {
                Liveness::Dead => return Ok(Vec::new()),
                Liveness::Silent(_) => return Ok(vec![by_route()]),
                Liveness::Alive => {}
            }
            let uid_text = uid.to_string().into_bytes();
            match ask(&self.cluster, &route.member, "locate", vec![("uid", uid_text)]).await? {
                Some(answer) => Ok(String::from_utf8_lossy(&answer)
                    .lines()
                    .filter_map(|line| {
                        let mut parts = line.splitn(4, ',');
                        let session = u64::from_str_radix(parts.next()?, 16).ok()?;
                        let since_ms = parts.next()?.parse().ok()?;
                        let silent_ms = parts.next()?.parse().ok()?;
                        let device = parts.next().unwrap_or("").parse().unwrap_or_default();
                        Some(here((device, session, since_ms, silent_ms)))
                    })
                    .collect()),
                // Its node holds a lease but did not answer: online by the route, silence
                // unknown.
                None => Ok(vec![by_route()]),
            }
        }
        .boxed()
    }

    fn query<'a>(&'a self, uids: &'a [u64]) -> BoxFuture<'a, Result<Vec<bool>, DirectoryError>> {
        async move {
            if uids.is_empty() {
                return Ok(Vec::new());
            }
            let routes = self.routes(uids).await?;
            Ok(self.owners(uids, routes).await?.into_iter().map(|o| o.is_some()).collect())
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
            Ok(count)
        }
        .boxed()
    }

    fn push<'a>(
        &'a self,
        uids: &'a [u64],
        device: Option<Device>,
        payload: Bytes,
    ) -> BoxFuture<'a, Result<Vec<usize>, DirectoryError>> {
        async move {
            let mut sent = vec![0; uids.len()];
            if uids.is_empty() {
                return Ok(sent);
            }
            let routes = self.routes(uids).await?;
            let owners = self.owners(uids, routes).await?;
            let me = self.cluster.member();
            let asks = by_member(&owners).into_iter().map(|(member, indices)| {
                let payload = payload.clone();
                let me = me.clone();
                async move {
                    if *member == *me {
                        let counts =
                            self.cluster.push_here(indices.iter().map(|&i| uids[i]), device.as_ref(), &payload);
                        return Ok::<_, StoreError>((indices, counts));
                    }
                    let list = indices.iter().map(|&i| uids[i].to_string()).collect::<Vec<_>>().join(",");
                    let mut fields = vec![("uids", list.into_bytes()), ("p", payload.to_vec())];
                    if let Some(device) = device {
                        fields.push(("d", device.as_str().as_bytes().to_vec()));
                    }
                    // No answer in time: nobody can say it was handed over, so it was not.
                    let counts = match ask(&self.cluster, &member, "push", fields).await? {
                        Some(answer) => {
                            String::from_utf8_lossy(&answer).split(',').map(|n| n.parse().unwrap_or(0)).collect()
                        }
                        None => vec![0; indices.len()],
                    };
                    Ok((indices, counts))
                }
            });
            for (indices, counts) in futures_util::future::try_join_all(asks).await? {
                for (i, count) in indices.into_iter().zip(counts) {
                    sent[i] = count;
                }
            }
            Ok(sent)
        }
        .boxed()
    }

    fn kick(&self, uid: u64, device: Option<Device>) -> BoxFuture<'_, Result<usize, DirectoryError>> {
        async move {
            let Some(route) = self.routes(&[uid]).await?.pop().flatten() else { return Ok(0) };
            let me = self.cluster.member();
            if *route.member == *me {
                return Ok(self.cluster.registry().kick(uid, device.as_ref()));
            }
            let node = keys::node_of(&route.member).to_string();
            match self.liveness(&route.member).await? {
                Liveness::Dead => return Ok(0),
                Liveness::Silent(ms) => {
                    return Err(DirectoryError::Unavailable(format!(
                        "node {node} holding uid {uid} has not been heard from for {ms} ms; if it is dead the \
                         session ends as node_lost when its lease runs out"
                    )))
                }
                Liveness::Alive => {}
            }
            // The holding node ends the session itself and logs it like any kick of its own:
            // route, hash and event change together there, and only once its client is told.
            let mut fields = vec![("uid", uid.to_string().into_bytes()), ("s", route.session.clone().into_bytes())];
            if let Some(device) = device {
                fields.push(("d", device.as_str().as_bytes().to_vec()));
            }
            match ask(&self.cluster, &route.member, "end", fields).await? {
                Some(answer) => Ok(usize::from(answer == b"1")),
                None => Err(DirectoryError::Unavailable(format!(
                    "node {node} holding uid {uid} did not answer the kick in time"
                ))),
            }
        }
        .boxed()
    }

    fn recent(&self, n: usize) -> BoxFuture<'_, Result<EventId, DirectoryError>> {
        async move { Ok(crate::cluster::stream::recent(&self.cluster, n).await?) }.boxed()
    }

    fn follow(&self, after: Option<EventId>) -> BoxStream<'static, Batch> {
        crate::cluster::stream::follow(self.cluster.clone(), after)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uids_group_by_the_member_holding_them() {
        let owner = |m: &str, answers| Some(Owner { member: m.into(), answers });
        let groups = by_member(&[owner("a", true), None, owner("b", true), owner("a", true), owner("c", false)]);
        assert_eq!(groups["a"], vec![0, 3]);
        assert_eq!(groups["b"], vec![2]);
        assert_eq!(groups.len(), 2, "a silent member is not asked");
    }
}
