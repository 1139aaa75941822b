//! Following the cluster's event stream: `/v1/events` on any node reads one Redis Stream,
//! with the stream's ids as event ids.
//!
//! Each consumer reads with `XRANGE` from its own position, in batches, and waits for news
//! on the local signal the inbox reader raises (one blocking read per node, however many
//! consumers). Ids are `<ms>-<n>` with `n` counting every event ever logged, so a consumer
//! whose position was trimmed away learns exactly how many it missed.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures_util::stream::{self, BoxStream, StreamExt};
use redis::Value;

use crate::client::CloseReason;
use crate::cluster::inbox::newest_event;
use crate::cluster::keys;
use crate::cluster::node::Cluster;
use crate::cluster::store::StoreError;
use crate::presence::{Batch, Event, EventId, What, READ_BATCH};

/// How long a consumer waits for the signal before it reads anyway: the signal's reader
/// may itself be reconnecting.
const POLL_FALLBACK: Duration = Duration::from_secs(1);

/// Every event after `after` the stream still holds (or, with `None`, every event from now
/// on), then the live tail, in batches.
pub(crate) fn follow(cluster: Arc<Cluster>, after: Option<EventId>) -> BoxStream<'static, Batch> {
    let tail = cluster.tail.subscribe();
    cluster.metrics.event_consumers.inc();
    let guard = ConsumerGuard(cluster.clone());
    stream::unfold((guard, tail, after), |(guard, mut tail, mut cursor)| async move {
        let cluster = &guard.0;
        loop {
            let from = match cursor {
                Some(id) => id,
                None => match newest_event(cluster).await.map(|id| id.parse::<EventId>()) {
                    Ok(Ok(id)) => {
                        cursor = Some(id);
                        id
                    }
                    _ => {
                        tokio::time::sleep(POLL_FALLBACK).await;
                        continue;
                    }
                },
            };
            tail.mark_unchanged();
            match read(cluster, from).await {
                Ok(batch) if !batch.events.is_empty() => {
                    let last = batch.events.last().map(|e| e.id);
                    return Some((batch, (guard, tail, last)));
                }
                Ok(_) => {}
                Err(e) => tracing::debug!(error = %e, "reading the event stream failed"),
            }
            let _ = tokio::time::timeout(POLL_FALLBACK, tail.changed()).await;
        }
    })
    .boxed()
}

/// Keeps `idlegate_event_consumers` right while a consumer follows.
struct ConsumerGuard(Arc<Cluster>);

impl Drop for ConsumerGuard {
    fn drop(&mut self) {
        self.0.metrics.event_consumers.dec();
    }
}

/// The next batch after `after`.
async fn read(cluster: &Cluster, after: EventId) -> Result<Batch, StoreError> {
    let entries: Vec<(String, Vec<(String, Value)>)> = cluster
        .call(1, |mut conn| async move {
            redis::cmd("XRANGE")
                .arg(keys::EVENTS)
                .arg(format!("({after}"))
                .arg("+")
                .arg("COUNT")
                .arg(READ_BATCH)
                .query_async(&mut conn)
                .await
                .map_err(StoreError::from)
        })
        .await?;
    let events: Vec<Event> = entries.into_iter().filter_map(|(id, fields)| parse(&id, fields)).collect();
    let (missed, gap_id) = match events.first() {
        Some(first) if first.id.seq > after.seq + 1 => {
            (first.id.seq - after.seq - 1, EventId { ms: first.id.ms, seq: first.id.seq - 1 })
        }
        _ => (0, after),
    };
    Ok(Batch { missed, earlier_process: false, gap_id, events })
}

/// One stream entry as an event; `None` for an entry this version does not understand.
fn parse(id: &str, fields: Vec<(String, Value)>) -> Option<Event> {
    let id: EventId = id.parse().ok()?;
    let mut kind = None;
    let (mut uid, mut session, mut at_ms) = (None, None, 0);
    let (mut reason, mut node, mut payload) = (None, None, None);
    for (name, value) in fields {
        let Value::BulkString(bytes) = value else { continue };
        let text = || String::from_utf8_lossy(&bytes).into_owned();
        match name.as_str() {
            "t" => kind = Some(text()),
            "uid" => uid = text().parse::<u64>().ok(),
            "s" => session = u64::from_str_radix(&text(), 16).ok(),
            "at" => at_ms = text().parse().unwrap_or(0),
            "r" => reason = CloseReason::from_label(&text()),
            "node" => node = Some(Arc::<str>::from(text())),
            "p" => payload = Some(Bytes::from(bytes)),
            _ => {}
        }
    }
    let what = match kind.as_deref()? {
        "online" => What::Online { session: session?, node },
        "offline" => What::Offline { session: session?, reason: reason? },
        "data" => What::Data(payload.unwrap_or_default()),
        _ => return None,
    };
    Some(Event { id, at_ms, uid: uid?, what })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bulk(s: &str) -> Value {
        Value::BulkString(s.as_bytes().to_vec())
    }

    #[test]
    fn stream_entries_become_events() {
        let online = vec![
            ("t".into(), bulk("online")),
            ("uid".into(), bulk("42")),
            ("s".into(), bulk("00000000000000ff")),
            ("node".into(), bulk("a")),
            ("at".into(), bulk("7")),
        ];
        let event = parse("5-9", online).unwrap();
        assert_eq!(event.id, EventId { ms: 5, seq: 9 });
        assert_eq!(event.what, What::Online { session: 255, node: Some("a".into()) });
        let lost = vec![
            ("t".into(), bulk("offline")),
            ("uid".into(), bulk("42")),
            ("s".into(), bulk("ff")),
            ("r".into(), bulk("node_lost")),
        ];
        assert_eq!(parse("5-10", lost).unwrap().what, What::Offline { session: 255, reason: CloseReason::NodeLost });
        assert!(parse("5-11", vec![("t".into(), bulk("other"))]).is_none());
    }
}
