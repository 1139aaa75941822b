//! Following the cluster's event stream: `/v1/events` on any node reads one Redis Stream,
//! with the stream's ids as event ids.
//!
//! Each consumer reads with `XRANGE` from its own position, in batches, and waits for news
//! on the local signal the inbox reader raises (one blocking read per node, however many
//! consumers). Ids are `<ms>-<n>` with `n` counting every event ever logged, so a consumer
//! whose position was trimmed away learns exactly how many it missed.
//!
//! When Redis lost writes, `n` may count again from a lower number, and a new epoch entry
//! marks where the stream's history broke: a consumer meeting either gets a `gap` with
//! `earlier_stream` (how many it missed is unknown), never a silent hole.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures_util::stream::{self, BoxStream, StreamExt};
use redis::Value;

use crate::cluster::keys;
use crate::cluster::shared::Cluster;
use crate::cluster::store::StoreError;
use crate::presence::{within_batch_budget, Batch, Claims, Event, EventId, Origin, What, Will, READ_BATCH};
use crate::proto::{CloseReason, Device, EventKind};

/// How long a consumer waits for the signal before it reads anyway: the signal's reader
/// may itself be reconnecting.
const POLL_FALLBACK: Duration = Duration::from_secs(1);

/// Entries a consumer's first read asks Redis for. Redis cannot bound a reply in bytes, so
/// each consumer adapts its count: what fitted the batch budget last time, doubling (up to
/// [`READ_BATCH`]) while everything fits. A first read of the largest DATA frames then
/// holds a few MiB for a moment, not a thousand frames.
const FIRST_READ: usize = 64;

/// Every event after `after` the stream still holds (or, with `None`, every event from now
/// on), then the live tail, in batches.
pub(crate) fn follow(cluster: Arc<Cluster>, after: Option<EventId>) -> BoxStream<'static, Batch> {
    let tail = cluster.tail.subscribe();
    cluster.metrics.event_consumers.inc();
    let guard = ConsumerGuard(cluster.clone());
    stream::unfold((guard, tail, after, FIRST_READ), |(guard, mut tail, mut cursor, mut count)| async move {
        let cluster = &guard.0;
        loop {
            let from = match cursor {
                Some(id) => id,
                None => match recent(cluster, 0).await {
                    Ok(id) => {
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
            match read(cluster, from, count).await {
                Ok((batch, next)) if !batch.events.is_empty() || batch.has_gap() => {
                    let last = batch.events.last().map_or(batch.gap_id, |e| e.id);
                    return Some((batch, (guard, tail, Some(last), next)));
                }
                Ok((_, next)) => count = next,
                Err(e) => tracing::debug!(error = %e, "reading the event stream failed"),
            }
            let _ = tokio::time::timeout(POLL_FALLBACK, tail.changed()).await;
        }
    })
    .boxed()
}

/// The position just before the `n` newest events (`0-0` when the stream holds fewer):
/// with `n` 0, the newest event's id, where a consumer "from now" starts.
pub(crate) async fn recent(cluster: &Cluster, n: usize) -> Result<EventId, StoreError> {
    let top: Vec<(String, Vec<(String, Value)>)> = cluster
        .call(1, |mut conn| async move {
            redis::cmd("XREVRANGE")
                .arg(keys::EVENTS)
                .arg("+")
                .arg("-")
                .arg("COUNT")
                .arg(n + 1)
                .query_async(&mut conn)
                .await
                .map_err(StoreError::from)
        })
        .await?;
    let zero = EventId { ms: 0, seq: 0 };
    if top.len() <= n {
        return Ok(zero);
    }
    Ok(top.last().and_then(|(id, _)| id.parse().ok()).unwrap_or(zero))
}

/// Keeps `idlegate_event_consumers` right while a consumer follows.
struct ConsumerGuard(Arc<Cluster>);

impl Drop for ConsumerGuard {
    fn drop(&mut self) {
        self.0.metrics.event_consumers.dec();
    }
}

/// The next batch after `after`, asking Redis for `count` entries, and the count to ask
/// for next time.
async fn read(cluster: &Cluster, after: EventId, count: usize) -> Result<(Batch, usize), StoreError> {
    let entries: Vec<(String, Vec<(String, Value)>)> = cluster
        .call(1, |mut conn| async move {
            redis::cmd("XRANGE")
                .arg(keys::EVENTS)
                .arg(format!("({after}"))
                .arg("+")
                .arg("COUNT")
                .arg(count)
                .query_async(&mut conn)
                .await
                .map_err(StoreError::from)
        })
        .await?;
    let mut batch = batch_after(after, entries.into_iter().filter_map(|(id, fields)| parse(&id, fields)).collect());
    let fetched = batch.events.len();
    let kept = within_batch_budget(batch.events.iter()).count();
    batch.events.truncate(kept);
    let next = if kept < fetched { kept.max(1) } else { (count * 2).min(READ_BATCH) };
    Ok((batch, next))
}

/// The batch a consumer at `after` gets from `entries`, the stream's next entries.
fn batch_after(mut after: EventId, entries: Vec<Entry>) -> Batch {
    let mut entries = entries.into_iter().peekable();
    // The epochs a stream begins with, read by a consumer that asked for everything: nothing
    // it had is lost. All of them: after Redis restarted empty, two nodes may each begin an
    // epoch before any event, and a consumer from the start (a webhook relay with no
    // acknowledged position) that skipped only the first stopped at the second with nothing
    // to return, and never moved again (nemesis seed 10 on a Redis Cluster).
    if after.seq == 0 {
        while let Some(Entry::Epoch(id)) = entries.peek() {
            after = *id;
            entries.next();
        }
    }
    let mut batch =
        Batch { missed: 0, earlier_process: false, earlier_stream: false, gap_id: after, events: Vec::new() };
    match entries.peek() {
        // A new epoch: the gap is reported at the marker, and resuming goes on after it.
        Some(Entry::Epoch(id)) => {
            batch.earlier_stream = true;
            batch.gap_id = *id;
            return batch;
        }
        // Numbers counted again from lower down: events after `after` were lost.
        Some(Entry::Event(first)) if first.id.seq <= after.seq => {
            batch.earlier_stream = true;
            batch.gap_id = EventId { ms: first.id.ms, seq: first.id.seq - 1 };
        }
        Some(Entry::Event(first)) if first.id.seq > after.seq + 1 => {
            batch.missed = first.id.seq - after.seq - 1;
            batch.gap_id = EventId { ms: first.id.ms, seq: first.id.seq - 1 };
        }
        _ => {}
    }
    // A batch stops before an epoch marker, or before numbers that skip (events dropped on
    // their way to Redis), which the next read reports as a gap at its start.
    for entry in entries {
        match entry {
            Entry::Event(event) => {
                if batch.events.last().is_some_and(|prev: &Event| event.id.seq != prev.id.seq + 1) {
                    break;
                }
                batch.events.push(event);
            }
            Entry::Epoch(_) => break,
        }
    }
    batch
}

/// One stream entry.
#[derive(Debug, PartialEq)]
enum Entry {
    Event(Event),
    /// Where a new epoch began.
    Epoch(EventId),
}

/// One stream entry; `None` for an entry this version does not understand.
fn parse(id: &str, fields: Vec<(String, Value)>) -> Option<Entry> {
    let id: EventId = id.parse().ok()?;
    let mut kind = None;
    let (mut uid, mut session, mut at_ms) = (None, None, 0);
    let (mut reason, mut node, mut payload, mut device) = (None, None, None, None::<Device>);
    let mut ended_ms = None;
    let mut topic = None;
    let (mut will_topic, mut will_payload) = (None, None);
    let mut claims = None;
    let mut origin = Origin::default();
    let mut superseded = false;
    let mut timeout_ms = 0;
    let mut status = None;
    for (name, value) in fields {
        let Value::BulkString(bytes) = value else { continue };
        let text = || String::from_utf8_lossy(&bytes).into_owned();
        match name.as_str() {
            "t" => kind = Some(text()),
            "uid" => uid = text().parse::<u64>().ok(),
            "s" => session = u64::from_str_radix(&text(), 16).ok(),
            "at" => at_ms = text().parse().unwrap_or(0),
            // When the last session ended, on a `user_offline` that waited out a grace.
            "e" => ended_ms = text().parse().ok(),
            "r" => reason = CloseReason::from_label(&text()),
            "node" => node = Some(Arc::<str>::from(text())),
            "p" => payload = Some(Bytes::from(bytes)),
            "tp" => topic = Some(Arc::<str>::from(text())),
            "wt" => will_topic = Some(text().into_boxed_str()),
            "wp" => will_payload = Some(Bytes::from(bytes)),
            // A name Redis holds was checked when its LOGIN was read; anything else reads as
            // the default device rather than losing the event.
            "d" => device = Device::parse(&bytes).ok(),
            // A session's claims, the JSON object its node wrote: anything else is left out
            // rather than written into the events as it is.
            "c" => claims = Claims::parse(&bytes).map(Arc::new),
            // The session's door and client address.
            "o" => origin = Origin::parse(&text()),
            // A login that a login on another node had replaced before it was logged.
            "sp" => superseded = true,
            // The session's timeout, its class's, in milliseconds.
            "tm" => timeout_ms = text().parse().unwrap_or(0),
            // A user's status (issue 52), as its session set it.
            "st" => status = Some(Arc::<str>::from(text())),
            _ => {}
        }
    }
    let kind = kind?;
    if kind == "epoch" {
        return Some(Entry::Epoch(id));
    }
    let what = match kind.parse::<EventKind>() {
        Ok(EventKind::Online) => What::Online {
            session: session?,
            device: device.unwrap_or_default(),
            node,
            claims,
            origin,
            superseded,
            timeout_ms,
        },
        Ok(EventKind::Offline) => {
            let will = will_topic.map(|topic| Arc::new(Will { topic, payload: will_payload.unwrap_or_default() }));
            What::Offline { session: session?, device: device.unwrap_or_default(), reason: reason?, will, claims }
        }
        Ok(EventKind::UserOnline) => What::UserOnline,
        Ok(EventKind::UserOffline) => What::UserOffline { reason: reason?, ended_ms: ended_ms.unwrap_or(at_ms) },
        Ok(EventKind::Data) => What::Data { payload: payload.unwrap_or_default(), topic },
        Ok(EventKind::Status) => What::Status { status: status.unwrap_or_else(|| Arc::from("")) },
        Err(e) => {
            // A newer node's kind this one does not know: skipped, and said.
            tracing::warn!(id = %id, error = %e, "skipping an entry of the shared stream");
            return None;
        }
    };
    Some(Entry::Event(Event { id, at_ms, uid: uid?, what }))
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
            ("tm".into(), bulk("90000")),
            ("at".into(), bulk("7")),
        ];
        let Some(Entry::Event(event)) = parse("5-9", online) else { panic!("an event") };
        assert_eq!(event.id, EventId { ms: 5, seq: 9 });
        assert_eq!(
            event.what,
            What::Online {
                session: 255,
                device: Device::DEFAULT,
                node: Some("a".into()),
                claims: None,
                origin: Origin::default(),
                superseded: false,
                timeout_ms: 90_000
            }
        );
        let lost = vec![
            ("t".into(), bulk("offline")),
            ("uid".into(), bulk("42")),
            ("s".into(), bulk("ff")),
            ("r".into(), bulk("node_lost")),
        ];
        let Some(Entry::Event(event)) = parse("5-10", lost) else { panic!("an event") };
        assert_eq!(
            event.what,
            What::Offline {
                session: 255,
                device: Device::DEFAULT,
                reason: CloseReason::NodeLost,
                will: None,
                claims: None
            }
        );
        let status = vec![("t".into(), bulk("status")), ("uid".into(), bulk("42")), ("st".into(), bulk("away ☕"))];
        let Some(Entry::Event(event)) = parse("5-13", status) else { panic!("an event") };
        assert_eq!((event.uid, event.what), (42, What::Status { status: "away ☕".into() }));
        assert!(parse("5-11", vec![("t".into(), bulk("other"))]).is_none());
        assert_eq!(parse("5-12", vec![("t".into(), bulk("epoch"))]), Some(Entry::Epoch(EventId { ms: 5, seq: 12 })));
    }

    fn event(ms: u64, seq: u64) -> Entry {
        Entry::Event(Event {
            id: EventId { ms, seq },
            at_ms: 0,
            uid: 1,
            what: What::Data { payload: Bytes::new(), topic: None },
        })
    }

    #[test]
    fn gaps_are_exact_and_lost_history_is_never_silent() {
        let at = |ms, seq| EventId { ms, seq };
        // Unbroken.
        let b = batch_after(at(5, 9), vec![event(5, 10), event(6, 11)]);
        assert!(!b.has_gap() && b.events.len() == 2);
        // Trimmed away, or data the node's queue dropped: an exact count.
        let b = batch_after(at(5, 9), vec![event(6, 13)]);
        assert_eq!((b.missed, b.earlier_stream, b.gap_id), (3, false, at(6, 12)));
        // Numbers counted again from lower down (a failover to a lagging replica).
        let b = batch_after(at(5, 9), vec![event(7, 4), event(7, 5)]);
        assert_eq!((b.earlier_stream, b.gap_id, b.events.len()), (true, at(7, 3), 2));
        // A new epoch: reported alone at the marker; the batch before it stops there.
        let b = batch_after(at(5, 9), vec![event(5, 10), Entry::Epoch(at(8, 11)), event(8, 12)]);
        assert_eq!((b.has_gap(), b.events.len()), (false, 1));
        let b = batch_after(at(5, 10), vec![Entry::Epoch(at(8, 11)), event(8, 12)]);
        assert_eq!((b.earlier_stream, b.gap_id, b.events.len()), (true, at(8, 11), 0));
        // Numbers that skip after the first event: the batch stops there, and the next read
        // starts with the gap (which a batch once carried on past, silently).
        let b = batch_after(at(5, 9), vec![event(5, 10), event(6, 14), event(6, 15)]);
        assert_eq!((b.has_gap(), b.events.len()), (false, 1));
        let b = batch_after(at(5, 10), vec![event(6, 14), event(6, 15)]);
        assert_eq!((b.missed, b.gap_id, b.events.len()), (3, at(6, 13), 2));
    }

    /// Nemesis seed 10 on a Redis Cluster at `--max-devices 2`: after Redis restarted empty,
    /// the stream began with two epoch markers; the webhook relay, with no acknowledged
    /// position, followed from `0-0`, skipped the first marker, stopped at the second with
    /// nothing to return, and read the same again for the rest of the run
    /// (`webhook_stalled`, six spells over 150 s).
    #[test]
    fn nemesis_cluster_seed_10_a_stream_that_begins_with_two_epochs_is_read_from_its_start() {
        let at = |ms, seq| EventId { ms, seq };
        let start = at(0, 0);
        let b = batch_after(start, vec![Entry::Epoch(at(8, 1)), Entry::Epoch(at(8, 2)), event(8, 3), event(8, 4)]);
        assert_eq!((b.has_gap(), b.events.len()), (false, 2));
        // Only markers so far: nothing yet, and nothing lost.
        let b = batch_after(start, vec![Entry::Epoch(at(8, 1)), Entry::Epoch(at(8, 2))]);
        assert!(!b.has_gap() && b.events.is_empty());
        // Events dropped on their way to Redis after the markers: counted, as anywhere.
        let b = batch_after(start, vec![Entry::Epoch(at(8, 1)), event(8, 5)]);
        assert_eq!((b.missed, b.gap_id, b.events.len()), (3, at(8, 4), 1));
    }
}
