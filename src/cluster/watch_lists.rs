//! The backend's watch lists in a cluster (issue 52): a Redis set per user, under a key of
//! its own (spread over a Redis Cluster's shards, never the control slot's), so every node
//! answers the same list. A change made through one node is told to every other member
//! through its inbox (`op=watchlist`), whose fan-out then checks the lists of that user's
//! sessions again; the node that made it checks its own at once.

use std::sync::Arc;

use futures_util::future::BoxFuture;
use futures_util::FutureExt;

use crate::cluster::keys;
use crate::cluster::shared::Cluster;
use crate::cluster::store::StoreError;
use crate::presence::{ListError, ListStore};

/// The cluster's lists; see the module documentation.
#[derive(Debug)]
pub(crate) struct ClusterLists {
    cluster: Arc<Cluster>,
    /// uids one list holds at most (`--max-watch`).
    max_list: usize,
}

impl From<StoreError> for ListError {
    fn from(e: StoreError) -> ListError {
        ListError::Unavailable(e.to_string())
    }
}

/// Replaces a list in one step, so no reader sees it half written. KEYS: the list. ARGV: its
/// uids (none: the list goes). Returns 1.
const REPLACE: &str = r#"
redis.call('DEL', KEYS[1])
for i = 1, #ARGV, 5000 do
  redis.call('SADD', KEYS[1], unpack(ARGV, i, math.min(i + 4999, #ARGV)))
end
return 1
"#;

impl ClusterLists {
    pub(crate) fn new(cluster: Arc<Cluster>, max_list: usize) -> ClusterLists {
        ClusterLists { cluster, max_list }
    }

    /// One command, answered.
    async fn ask<T: redis::FromRedisValue>(&self, cmd: redis::Cmd) -> Result<T, StoreError> {
        self.cluster.call(1, |mut conn| async move { cmd.query_async(&mut conn).await.map_err(StoreError::from) }).await
    }

    /// Tells every other member that `user`'s list changed. One that misses it (its inbox
    /// out of reach) checks every list again when its fan-out next resyncs, after a gap.
    async fn tell_members(&self, user: u64) {
        let me = self.cluster.member();
        let mut cmd = redis::cmd("SMEMBERS");
        cmd.arg(keys::MEMBERS);
        let members: Vec<String> = match self.ask(cmd).await {
            Ok(members) => members,
            Err(e) => {
                tracing::warn!(error = %e, user, "a watch list changed; the other nodes could not be told");
                return;
            }
        };
        let cmds: Vec<redis::Cmd> = members
            .iter()
            .filter(|m| m.as_str() != &*me)
            .map(|m| {
                let mut cmd = redis::cmd("XADD");
                cmd.arg(keys::inbox(m)).arg("MAXLEN").arg("~").arg(crate::cluster::inbox::INBOX_CAP).arg("*");
                cmd.arg("op").arg("watchlist").arg("uid").arg(user);
                cmd
            })
            .collect();
        if !cmds.is_empty() {
            if let Err(e) = self.cluster.send_all(cmds).await {
                tracing::warn!(error = %e, user, "a watch list changed; the other nodes could not be told");
            }
        }
    }
}

impl ListStore for ClusterLists {
    fn put(&self, user: u64, uids: Vec<u64>) -> BoxFuture<'_, Result<Arc<[u64]>, ListError>> {
        async move {
            let uids = crate::presence::distinct(uids);
            if uids.len() > self.max_list {
                return Err(ListError::TooLong { got: uids.len(), max: self.max_list });
            }
            let mut cmd = redis::cmd("EVAL");
            cmd.arg(REPLACE).arg(1).arg(keys::watch_list(user));
            for uid in &uids {
                cmd.arg(*uid);
            }
            let _: i64 = self.ask(cmd).await?;
            self.tell_members(user).await;
            Ok(Arc::from(uids))
        }
        .boxed()
    }

    fn get(&self, user: u64) -> BoxFuture<'_, Result<Option<Arc<[u64]>>, ListError>> {
        async move {
            let mut cmd = redis::cmd("SMEMBERS");
            cmd.arg(keys::watch_list(user));
            let members: Vec<u64> = self.ask(cmd).await?;
            Ok((!members.is_empty()).then(|| Arc::from(crate::presence::distinct(members))))
        }
        .boxed()
    }

    fn delete(&self, user: u64) -> BoxFuture<'_, Result<bool, ListError>> {
        async move {
            let mut cmd = redis::cmd("DEL");
            cmd.arg(keys::watch_list(user));
            let gone: i64 = self.ask(cmd).await?;
            if gone > 0 {
                self.tell_members(user).await;
            }
            Ok(gone > 0)
        }
        .boxed()
    }

    fn listed<'a>(&'a self, user: u64, uids: &'a [u64]) -> BoxFuture<'a, Result<Vec<bool>, ListError>> {
        async move {
            if uids.is_empty() {
                return Ok(Vec::new());
            }
            let mut cmd = redis::cmd("SMISMEMBER");
            cmd.arg(keys::watch_list(user));
            for uid in uids {
                cmd.arg(*uid);
            }
            let listed: Vec<bool> = self.ask(cmd).await?;
            if listed.len() != uids.len() {
                return Err(ListError::Unavailable(format!("SMISMEMBER answered {} of {}", listed.len(), uids.len())));
            }
            Ok(listed)
        }
        .boxed()
    }

    fn entries(&self) -> Option<usize> {
        None
    }
}
