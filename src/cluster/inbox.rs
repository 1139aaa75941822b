//! The inbox: a Redis Stream per member through which other nodes reach this one.
//!
//! What arrives: `kick` (a newer login elsewhere ended one of this node's sessions; its
//! offline event is already logged), `push`, `locate` and `end` requests (`end`: the API on
//! another node kicks a session held here, which this node ends and logs like any kick
//! of its own, so no `kicked` is ever logged that its client did not get), `watchlist` (a
//! backend changed a user's watch list through another node), and `reply` to this node's
//! own requests. A stream rather than pub/sub: what
//! is sent while this node's connection blips waits for it instead of being lost.
//!
//! One blocking `XREAD` serves both this inbox and the event stream's tail (both live on
//! the control slot), so one connection per node follows everything, and event consumers
//! wait on a local signal instead of each holding a blocking read. The tail is read only
//! while this node has event consumers: otherwise every node would wake for, and carry,
//! every event of the cluster (docs/BENCHMARKS.md has the XREADs Redis served in the
//! 57,000-client run before and after).

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use redis::streams::{StreamId, StreamReadOptions, StreamReadReply};
use redis::{AsyncCommands, Value};
use tokio_util::sync::CancellationToken;

use crate::cluster::keys;
use crate::cluster::shared::Cluster;
use crate::cluster::store::{StoreError, BLOCK};
use crate::cluster::stream::recent;
use crate::presence::{EventId, Push, Reach};

/// Entries one read takes from the inbox and the event stream.
const READ_COUNT: usize = 1024;

/// How long a request waits for another node's reply: a live node answers in a
/// millisecond on loopback; one that does not within this is as good as gone. Below the
/// 3 s the API promises for an answer about a uid on a node that stopped answering.
pub(crate) const REQUEST_TIMEOUT: Duration = Duration::from_secs(2);

/// Cap of an inbox: a node that stops reading cannot fill Redis.
pub(crate) const INBOX_CAP: usize = 100_000;

/// Runs until `stop`.
pub(crate) async fn run(cluster: Arc<Cluster>, stop: CancellationToken) {
    let mut member = cluster.member();
    let mut inbox_last = "0-0".to_string();
    let mut events_last: Option<String> = None;
    loop {
        if stop.is_cancelled() {
            return;
        }
        if cluster.member() != member {
            member = cluster.member();
            inbox_last = "0-0".to_string();
        }
        // A consumer that arrives while the read waits on the inbox alone catches up from
        // the stream by itself, and waits at most BLOCK for its first live signal.
        let events_from = if cluster.tail.receiver_count() == 0 {
            events_last = None;
            None
        } else {
            match &events_last {
                Some(id) => Some(id.clone()),
                None => match recent(&cluster, 0).await.map(|id| id.to_string()) {
                    Ok(id) => {
                        // Events logged before this position never come through the
                        // read: consumers waiting since before it re-read now instead.
                        cluster.tail.send_modify(|_| {});
                        events_last = Some(id.clone());
                        Some(id)
                    }
                    Err(_) => {
                        pause(&stop).await;
                        continue;
                    }
                },
            }
        };
        let Ok(mut conn) = cluster.store.blocking() else {
            pause(&stop).await;
            continue;
        };
        let options = StreamReadOptions::default().count(READ_COUNT).block(BLOCK.as_millis() as usize);
        let inbox = keys::inbox(&member);
        let (streams, positions) = match &events_from {
            Some(from) => (vec![inbox.as_str(), keys::EVENTS], vec![inbox_last.as_str(), from.as_str()]),
            None => (vec![inbox.as_str()], vec![inbox_last.as_str()]),
        };
        let read = tokio::select! {
            read = conn.xread_options::<_, _, StreamReadReply>(&streams, &positions, &options) => read,
            _ = stop.cancelled() => return,
        };
        let reply = match read {
            Ok(reply) => reply,
            Err(e) => {
                tracing::debug!(error = %e, "reading the inbox failed");
                pause(&stop).await;
                continue;
            }
        };
        for stream in reply.keys {
            let Some(last) = stream.ids.last().map(|e| e.id.clone()) else { continue };
            if stream.key == inbox {
                for entry in &stream.ids {
                    handle(&cluster, &member, entry).await;
                }
                trim(&cluster, &inbox, &last).await;
                inbox_last = last;
            } else {
                if let Ok(id) = last.parse::<EventId>() {
                    cluster.tail.send_replace(id);
                }
                events_last = Some(last);
            }
        }
    }
}

async fn pause(stop: &CancellationToken) {
    tokio::select! {
        _ = tokio::time::sleep(Duration::from_millis(500)) => {}
        _ = stop.cancelled() => {}
    }
}

/// Drops what this node has read from its inbox.
async fn trim(cluster: &Cluster, inbox: &str, last: &str) {
    let Some(next) = next_id(last) else { return };
    let inbox = inbox.to_string();
    let _ = cluster
        .call(1, |mut conn| async move {
            redis::cmd("XTRIM").arg(inbox).arg("MINID").arg(next).query_async::<()>(&mut conn).await?;
            Ok(())
        })
        .await;
}

/// The stream id right after `id`.
fn next_id(id: &str) -> Option<String> {
    let (ms, seq) = id.split_once('-')?;
    Some(format!("{ms}-{}", seq.parse::<u64>().ok()?.checked_add(1)?))
}

fn field<'a>(entry: &'a StreamId, name: &str) -> Option<&'a [u8]> {
    match entry.map.get(name)? {
        Value::BulkString(b) => Some(b),
        _ => None,
    }
}

fn text_field(entry: &StreamId, name: &str) -> Option<String> {
    field(entry, name).map(|b| String::from_utf8_lossy(b).into_owned())
}

fn number_field(entry: &StreamId, name: &str) -> Option<u64> {
    text_field(entry, name)?.parse().ok()
}

/// The `d` field of a request: the device it is limited to, if any.
fn device_field(entry: &StreamId) -> Option<crate::proto::Device> {
    text_field(entry, "d").and_then(|name| name.parse().ok())
}

/// One uid's answer to a push request: `<sessions>`, or `<sessions>:<unsubscribed>` when
/// MQTT sessions there did not take it (`render_reach`); anything unreadable reached none.
pub(crate) fn parse_reach(answer: &str) -> Reach {
    let mut parts = answer.splitn(2, ':');
    let mut next = || parts.next().and_then(|n| n.parse().ok()).unwrap_or(0);
    Reach { sessions: next(), unsubscribed: next() }
}

/// One uid's reach as a push request's answer says it (`parse_reach`).
pub(crate) fn render_reach(reach: &Reach) -> String {
    match reach.unsubscribed {
        0 => reach.sessions.to_string(),
        n => format!("{}:{n}", reach.sessions),
    }
}

/// The `(uid, session)` a `kick` entry ends; None for any other entry.
pub(crate) fn kick_of(entry: &StreamId) -> Option<(u64, u64)> {
    if field(entry, "op") != Some(b"kick") {
        return None;
    }
    let (uid, session) = (number_field(entry, "uid")?, text_field(entry, "s")?);
    Some((uid, u64::from_str_radix(&session, 16).ok()?))
}

/// Acts on one inbox entry.
async fn handle(cluster: &Cluster, member: &str, entry: &StreamId) {
    let registry = cluster.registry();
    match field(entry, "op") {
        Some(b"kick") => {
            if let Some((uid, session)) = kick_of(entry) {
                registry.kick_session(uid, session, None);
            }
        }
        Some(b"push") => {
            let (Some(from), Some(req), Some(uids)) =
                (text_field(entry, "from"), number_field(entry, "req"), text_field(entry, "uids"))
            else {
                return;
            };
            let payload = Bytes::copy_from_slice(field(entry, "p").unwrap_or_default());
            // From a node that names no topic (one older than topics): the default one.
            let topic = text_field(entry, "t").map_or_else(|| cluster.push_topic(), Arc::from);
            let device = device_field(entry);
            let uids = uids.split(',').filter_map(|u| u.parse::<u64>().ok());
            let sent = cluster.push_here(uids, device.as_ref(), &Push { topic, payload });
            let counts = sent.iter().map(render_reach).collect::<Vec<_>>().join(",");
            reply(cluster, member, &from, req, counts.into_bytes()).await;
        }
        Some(b"locate") => {
            let (Some(from), Some(req), Some(uid)) =
                (text_field(entry, "from"), number_field(entry, "req"), number_field(entry, "uid"))
            else {
                return;
            };
            // One line per session; the device last, since a name may hold commas, then its
            // claims (or nothing) after a tab, which neither a device name nor compact JSON
            // holds, then its origin after another, then its timeout after a third.
            let answer = cluster
                .locate_here(uid)
                .into_iter()
                .map(|l| {
                    let line = format!("{:016x},{},{},{}", l.session, l.since_ms, l.silent_ms.unwrap_or(0), l.device);
                    let claims = l.claims.as_ref().map_or("", |c| c.as_json());
                    format!("{line}\t{claims}\t{}\t{}", l.origin, l.timeout_ms.unwrap_or(0))
                })
                .collect::<Vec<_>>()
                .join("\n");
            reply(cluster, member, &from, req, answer.into_bytes()).await;
        }
        Some(b"end") => {
            let (Some(from), Some(req), Some(uid), Some(session)) = (
                text_field(entry, "from"),
                number_field(entry, "req"),
                number_field(entry, "uid"),
                text_field(entry, "s"),
            ) else {
                return;
            };
            let device = device_field(entry);
            let ended = u64::from_str_radix(&session, 16).is_ok_and(|s| registry.kick_session(uid, s, device.as_ref()));
            reply(cluster, member, &from, req, if ended { b"1".to_vec() } else { b"0".to_vec() }).await;
        }
        Some(b"watchlist") => {
            // A backend changed a user's watch list through another node.
            if let Some(uid) = number_field(entry, "uid") {
                cluster.watch_list_changed(uid);
            }
        }
        Some(b"reply") => {
            let (Some(req), Some(body)) = (number_field(entry, "req"), field(entry, "r")) else { return };
            let waiting = cluster.awaiting.lock().unwrap_or_else(std::sync::PoisonError::into_inner).remove(&req);
            if let Some(waiting) = waiting {
                let _ = waiting.send(body.to_vec());
            }
        }
        _ => tracing::debug!(id = %entry.id, "unknown inbox entry ignored"),
    }
}

async fn reply(cluster: &Cluster, member: &str, to: &str, req: u64, body: Vec<u8>) {
    let inbox = keys::inbox(to);
    let member = member.to_string();
    let _ = cluster
        .call(1, |mut conn| async move {
            redis::cmd("XADD")
                .arg(inbox)
                .arg("MAXLEN")
                .arg("~")
                .arg(INBOX_CAP)
                .arg("*")
                .arg("op")
                .arg("reply")
                .arg("from")
                .arg(member)
                .arg("req")
                .arg(req)
                .arg("r")
                .arg(body)
                .query_async::<()>(&mut conn)
                .await?;
            Ok(())
        })
        .await;
}

/// Sends `to` a request with `fields` and waits for its reply; `None` if none came in
/// [`REQUEST_TIMEOUT`].
pub(crate) async fn ask(
    cluster: &Cluster,
    to: &str,
    op: &str,
    fields: Vec<(&'static str, Vec<u8>)>,
) -> Result<Option<Vec<u8>>, StoreError> {
    let req = cluster.request_id();
    let (tx, rx) = tokio::sync::oneshot::channel();
    cluster.awaiting.lock().unwrap_or_else(std::sync::PoisonError::into_inner).insert(req, tx);
    let inbox = keys::inbox(to);
    let member = cluster.member();
    let op = op.to_string();
    let sent = cluster
        .call(1, |mut conn| async move {
            let mut cmd = redis::cmd("XADD");
            cmd.arg(inbox).arg("MAXLEN").arg("~").arg(INBOX_CAP).arg("*");
            cmd.arg("op").arg(op).arg("from").arg(&*member).arg("req").arg(req);
            for (name, value) in fields {
                cmd.arg(name).arg(value);
            }
            cmd.query_async::<()>(&mut conn).await?;
            Ok(())
        })
        .await;
    let answer = match sent {
        Ok(()) => tokio::time::timeout(REQUEST_TIMEOUT, rx).await.ok().and_then(Result::ok),
        Err(e) => {
            cluster.awaiting.lock().unwrap_or_else(std::sync::PoisonError::into_inner).remove(&req);
            return Err(e);
        }
    };
    cluster.awaiting.lock().unwrap_or_else(std::sync::PoisonError::into_inner).remove(&req);
    Ok(answer)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn next_ids() {
        assert_eq!(next_id("17-4").as_deref(), Some("17-5"));
        assert_eq!(next_id("x"), None);
    }
}
