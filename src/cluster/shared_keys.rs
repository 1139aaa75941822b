//! The JWT keys fetched by URL, as the cluster shares them: the last JWKS document any
//! node fetched, under one key of its own (spread to whichever shard holds it, never the
//! control slot's, which carries every login), and the one refetch an unknown `kid` may
//! ask for per interval, a key that expires (`SET NX PX`).

use std::sync::Arc;
use std::time::Duration;

use futures_util::future::BoxFuture;
use futures_util::FutureExt;

use crate::cluster::keys;
use crate::cluster::shared::Cluster;
use crate::cluster::store::StoreError;
use crate::presence::{DirectoryError, SharedKeys};

/// The cluster's shared JWKS document.
#[derive(Debug)]
pub(crate) struct ClusterKeys {
    cluster: Arc<Cluster>,
}

impl ClusterKeys {
    pub(crate) fn new(cluster: Arc<Cluster>) -> ClusterKeys {
        ClusterKeys { cluster }
    }

    /// One command, answered.
    async fn ask<T: redis::FromRedisValue>(&self, cmd: redis::Cmd) -> Result<T, StoreError> {
        self.cluster.call(1, |mut conn| async move { cmd.query_async(&mut conn).await.map_err(StoreError::from) }).await
    }
}

/// Publishes a document unless the one there was fetched later. KEYS: the document's hash.
/// ARGV: url, document, fetched at (unix ms).
const PUBLISH: &str = r#"
local at = tonumber(redis.call('HGET', KEYS[1], 'fetched_ms') or '0')
if redis.call('HGET', KEYS[1], 'url') == ARGV[1] and at >= tonumber(ARGV[3]) then return 0 end
redis.call('HSET', KEYS[1], 'url', ARGV[1], 'document', ARGV[2], 'fetched_ms', ARGV[3])
return 1
"#;

impl SharedKeys for ClusterKeys {
    fn latest(&self, url: &str) -> BoxFuture<'_, Result<Option<(String, u64)>, DirectoryError>> {
        let url = url.to_string();
        async move {
            let mut cmd = redis::cmd("HMGET");
            cmd.arg(keys::JWKS).arg("url").arg("document").arg("fetched_ms");
            let (from, document, at): (Option<String>, Option<String>, Option<u64>) = self.ask(cmd).await?;
            Ok(match (from, document, at) {
                (Some(from), Some(document), Some(at)) if from == url => Some((document, at)),
                _ => None,
            })
        }
        .boxed()
    }

    fn publish(&self, url: &str, document: &str, fetched_ms: u64) -> BoxFuture<'_, Result<(), DirectoryError>> {
        let mut cmd = redis::cmd("EVAL");
        cmd.arg(PUBLISH).arg(1).arg(keys::JWKS).arg(url).arg(document).arg(fetched_ms);
        async move {
            let _: i64 = self.ask(cmd).await?;
            Ok(())
        }
        .boxed()
    }

    fn claim_refetch(&self, interval: Duration) -> BoxFuture<'_, Result<bool, DirectoryError>> {
        let mut cmd = redis::cmd("SET");
        let ms = interval.as_millis().max(1) as u64;
        cmd.arg(keys::JWKS_REFETCH).arg(self.cluster.member().to_string()).arg("NX").arg("PX").arg(ms);
        async move {
            let taken: Option<String> = self.ask(cmd).await?;
            Ok(taken.is_some())
        }
        .boxed()
    }
}
