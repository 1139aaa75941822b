//! The webhook relay's turn in Redis: one member at a time holds it (a key with a TTL),
//! and the receiver's acknowledged position sits beside it, on the control slot. The
//! scripts (`TURN_*` in `scripts.rs`) check the holder in the same atomic step as every
//! change, so a member whose turn ran out (paused, cut off) can neither renew it nor move
//! the position.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::future::BoxFuture;
use futures_util::FutureExt;
use redis::Script;
use tokio::time::Instant;

use crate::cluster::keys;
use crate::cluster::shared::Cluster;
use crate::cluster::store::StoreError;
use crate::presence::{Acknowledged, DirectoryError, EventId, RelayTurn};

/// How much of a renewal's TTL it may spend on its way to Redis before Redis refuses it: a
/// quarter, half of the round trip within which the relay confirms a renewal (half the
/// TTL), so a renewal the relay cannot confirm on a link slow both ways never holds the
/// turn either.
const LATE_SHARE: u32 = 4;

/// The turn of this node's cluster.
#[derive(Debug)]
pub(crate) struct SharedTurn {
    cluster: Arc<Cluster>,
    /// Redis's clock as this node last heard it: when the answer came, and Redis's unix ms
    /// as it answered. The renewal's deadline is set by it, never by this node's own wall
    /// clock (which may be far off): an answer that came late only makes it earlier, as
    /// Redis's time has moved on since.
    heard: Mutex<Option<(Instant, u64)>>,
}

impl SharedTurn {
    pub(crate) fn new(cluster: Arc<Cluster>) -> SharedTurn {
        SharedTurn { cluster, heard: Mutex::new(None) }
    }

    /// The deadline for a renewal of `ttl` sent now, by Redis's clock (0: none yet).
    fn deadline(&self, ttl: Duration) -> u64 {
        let heard = *self.heard.lock().unwrap_or_else(|e| e.into_inner());
        heard.map_or(0, |(at, redis_ms)| redis_ms + (at.elapsed() + ttl / LATE_SHARE).as_millis() as u64)
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
            let deadline = self.deadline(ttl);
            let args = [self.cluster.member().to_string(), ttl.as_millis().to_string(), deadline.to_string()];
            let (held, redis_ms): (i64, u64) =
                self.eval(&self.cluster.scripts.turn_hold, &[keys::RELAY_TURN], &args).await?;
            *self.heard.lock().unwrap_or_else(|e| e.into_inner()) = Some((Instant::now(), redis_ms));
            match held {
                1 => Ok(true),
                0 => Ok(false),
                _ => Err(DirectoryError::Unavailable(
                    "the relay turn's renewal reached Redis past its deadline (a slow link)".into(),
                )),
            }
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
