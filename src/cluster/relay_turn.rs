//! The webhook relay's turn in Redis: one member at a time holds it (a key with a TTL),
//! and the receiver's acknowledged position sits beside it, on the control slot. The
//! scripts (`TURN_*` in `scripts.rs`) check the holder in the same atomic step as every
//! change, so a member whose turn ran out (paused, cut off) can neither renew it nor move
//! the position.

use std::sync::Arc;
use std::time::Duration;

use futures_util::future::BoxFuture;
use futures_util::FutureExt;
use redis::Script;

use crate::cluster::keys;
use crate::cluster::shared::Cluster;
use crate::cluster::store::StoreError;
use crate::presence::{Acknowledged, DirectoryError, EventId, RelayTurn};

/// The turn of this node's cluster.
#[derive(Debug)]
pub(crate) struct SharedTurn {
    cluster: Arc<Cluster>,
}

impl SharedTurn {
    pub(crate) fn new(cluster: Arc<Cluster>) -> SharedTurn {
        SharedTurn { cluster }
    }

    /// Runs `script` on the control slot with `keys` and `args`.
    async fn eval<T: redis::FromRedisValue>(
        &self,
        script: &Script,
        keys: &[&str],
        args: &[String],
    ) -> Result<T, StoreError> {
        self.cluster
            .call(1, |mut conn| async move {
                let mut invocation = script.prepare_invoke();
                for key in keys {
                    invocation.key(*key);
                }
                for arg in args {
                    invocation.arg(arg);
                }
                Ok(invocation.invoke_async(&mut conn).await?)
            })
            .await
    }
}

impl RelayTurn for SharedTurn {
    fn hold(&self, ttl: Duration) -> BoxFuture<'_, Result<bool, DirectoryError>> {
        async move {
            let args = [self.cluster.member().to_string(), ttl.as_millis().to_string()];
            let held: i64 = self.eval(&self.cluster.scripts.turn_hold, &[keys::RELAY_TURN], &args).await?;
            Ok(held == 1)
        }
        .boxed()
    }

    fn acknowledged(&self) -> BoxFuture<'_, Result<Acknowledged, DirectoryError>> {
        async move {
            let keys = [keys::RELAY_ACKED, keys::EVENTS_LAST, keys::RELAY_SENDING];
            let seen = self.cluster.high_water();
            let args = if seen.epoch == 0 {
                [String::new(), String::new()]
            } else {
                [seen.epoch.to_string(), seen.n.to_string()]
            };
            let (at, recorded_now, sending, sign): (String, i64, String, String) =
                self.eval(&self.cluster.scripts.turn_from, &keys, &args).await?;
            let after = at
                .parse()
                .map_err(|()| DirectoryError::Unavailable(format!("the relay's position {at:?} is no event id")))?;
            // Anything else than an id past the position is no batch to send again.
            let sending = sending.parse::<EventId>().ok().filter(|s| *s > after);
            let rewound = sign == "rewound";
            if rewound {
                self.cluster.lost_writes("the event stream's number went back below what this node saw");
            } else if sign == "epoch" {
                tracing::warn!(%after, "webhook: the acknowledged position lies before the stream's current epoch; starting at its marker");
            }
            Ok(Acknowledged { after, recorded_now: recorded_now == 1, sending, rewound })
        }
        .boxed()
    }

    fn acknowledge(&self, through: EventId, ttl: Duration) -> BoxFuture<'_, Result<bool, DirectoryError>> {
        async move {
            let args = [self.cluster.member().to_string(), through.to_string(), ttl.as_millis().to_string()];
            let keys = [keys::RELAY_TURN, keys::RELAY_ACKED, keys::RELAY_SENDING];
            let held: i64 = self.eval(&self.cluster.scripts.turn_ack, &keys, &args).await?;
            Ok(held == 1)
        }
        .boxed()
    }

    fn sending(&self, last: EventId) -> BoxFuture<'_, Result<bool, DirectoryError>> {
        async move {
            let args = [self.cluster.member().to_string(), last.to_string()];
            let keys = [keys::RELAY_TURN, keys::RELAY_SENDING];
            let held: i64 = self.eval(&self.cluster.scripts.turn_send, &keys, &args).await?;
            Ok(held == 1)
        }
        .boxed()
    }

    fn give_up(&self) -> BoxFuture<'_, ()> {
        async move {
            let args = [self.cluster.member().to_string()];
            if let Err(e) = self.eval::<i64>(&self.cluster.scripts.turn_leave, &[keys::RELAY_TURN], &args).await {
                tracing::warn!(error = %e, "could not give the webhook relay's turn up; it runs out by itself");
            }
        }
        .boxed()
    }
}
