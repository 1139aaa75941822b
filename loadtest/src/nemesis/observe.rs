//! What the backend sees during a nemesis run: the event stream, read by a consumer that
//! resumes with `Last-Event-ID` on another node whenever its node dies, stops or goes quiet,
//! and presence answers sampled from random nodes. Both are written as the checker reads them
//! (`events.jsonl`, `presence.jsonl`, see verdict.rs).

use std::collections::HashSet;
use std::io::Write;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::StreamExt;
use serde_json::Value;
use tokio::time::{sleep, timeout};
use tokio_util::sync::CancellationToken;

use super::schedule::SplitMix64;

/// A stream silent this long is taken for dead (a stopped node keeps the connection open):
/// longer than the gateway's 15 s keep-alive comment.
const QUIET_LIMIT: Duration = Duration::from_secs(16);

/// How long a (re)connection to `/v1/events` may take.
const CONNECT_PATIENCE: Duration = Duration::from_secs(3);

/// What the consumer has received: the last event's id (presence samples name it) and the
/// sessions still open in what it read (the run is quiet when there are none).
#[derive(Default)]
pub struct Seen {
    pub last_id: Mutex<Option<String>>,
    pub open: Mutex<HashSet<String>>,
    pub resumes: std::sync::atomic::AtomicU64,
}

impl Seen {
    pub fn last_id(&self) -> Option<String> {
        self.last_id.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    pub fn open_sessions(&self) -> usize {
        self.open.lock().unwrap_or_else(|e| e.into_inner()).len()
    }
}

/// Follows `/v1/events` across the nodes' APIs until `stop`, writing every event to `out`.
/// `ready` is told once the first stream is open (the clients wait for it, so the stream
/// holds every session from its start). While `slow` holds `Some(reconnect)` (a
/// `slow_consumer` fault) it reads nothing; then it reads on, or, with `reconnect`, resumes
/// with `Last-Event-ID` on the next node.
pub async fn consume(
    apis: Vec<SocketAddr>,
    seen: Arc<Seen>,
    out: std::fs::File,
    ready: tokio::sync::oneshot::Sender<()>,
    mut slow: tokio::sync::watch::Receiver<Option<bool>>,
    stop: CancellationToken,
) {
    let http =
        reqwest::Client::builder().connect_timeout(CONNECT_PATIENCE).build().expect("a plain HTTP client builds");
    let mut out = std::io::BufWriter::new(out);
    let mut ready = Some(ready);
    let mut turn = 0usize;
    while !stop.is_cancelled() {
        let api = apis[turn % apis.len()];
        turn += 1;
        let mut request = http.get(format!("http://{api}/v1/events"));
        if let Some(id) = seen.last_id() {
            request = request.header("Last-Event-ID", id);
        }
        let response = match timeout(CONNECT_PATIENCE, request.send()).await {
            Ok(Ok(r)) if r.status().is_success() => r,
            _ => {
                sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        if let Some(ready) = ready.take() {
            let _ = ready.send(());
        } else {
            seen.resumes.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        let mut body = response.bytes_stream();
        let mut text = String::new();
        loop {
            let pause = *slow.borrow_and_update();
            if let Some(reconnect) = pause {
                let _ = out.flush();
                tokio::select! {
                    _ = slow.wait_for(Option::is_none) => {}
                    _ = stop.cancelled() => break,
                }
                if reconnect {
                    break;
                }
            }
            let chunk = tokio::select! {
                c = timeout(QUIET_LIMIT, body.next()) => c,
                _ = slow.changed() => continue,
                _ = stop.cancelled() => break,
            };
            let Ok(Some(Ok(chunk))) = chunk else { break };
            text.push_str(&String::from_utf8_lossy(&chunk));
            while let Some(end) = text.find("\n\n") {
                let block: String = text.drain(..end + 2).collect();
                if let Some(line) = event_line(&block) {
                    note(&seen, &line);
                    let _ = writeln!(out, "{line}");
                }
            }
        }
        let _ = out.flush();
    }
    let _ = out.flush();
}

/// One SSE block as a line of `events.jsonl`: `id`, `type` and the data's fields; None for
/// a comment (the keep-alive). The harness's own follower (backend.rs) reads with it too.
pub fn event_line(block: &str) -> Option<Value> {
    let (mut id, mut event, mut data) = ("", "", Value::Null);
    for line in block.lines() {
        if let Some(v) = line.strip_prefix("event: ") {
            event = v;
        } else if let Some(v) = line.strip_prefix("data: ") {
            data = serde_json::from_str(v).unwrap_or(Value::Null);
        } else if let Some(v) = line.strip_prefix("id: ") {
            id = v;
        }
    }
    if event.is_empty() {
        return None;
    }
    let mut line = serde_json::json!({"id": id, "type": event});
    if let (Some(line), Value::Object(fields)) = (line.as_object_mut(), data) {
        line.extend(fields);
    }
    Some(line)
}

impl Seen {
    /// Takes in one event received: its id, and the sessions it opens or ends.
    pub fn note(&self, event: &Value) {
        note(self, event);
    }
}

fn note(seen: &Seen, event: &Value) {
    if let Some(id) = event["id"].as_str().filter(|id| !id.is_empty()) {
        *seen.last_id.lock().unwrap_or_else(|e| e.into_inner()) = Some(id.to_string());
    }
    if let Some(session) = event["session"].as_str() {
        let mut open = seen.open.lock().unwrap_or_else(|e| e.into_inner());
        match event["type"].as_str() {
            Some("online") => {
                open.insert(session.to_string());
            }
            Some("offline") => {
                open.remove(session);
            }
            _ => {}
        }
    }
}

/// Asks a random node for a random uid's presence every [`SAMPLE_EVERY`] until `stop`, and
/// writes `{"uid", "seen", "sessions"}` lines: `seen` is the last event the consumer had
/// received before the question left.
pub async fn sample(
    apis: Vec<SocketAddr>,
    uids: std::ops::Range<u64>,
    seen: Arc<Seen>,
    seed: u64,
    out: std::fs::File,
    stop: CancellationToken,
) {
    let http = reqwest::Client::builder().timeout(CONNECT_PATIENCE).build().expect("a plain HTTP client builds");
    let mut out = std::io::BufWriter::new(out);
    let mut rng = SplitMix64::new(seed ^ 0x5a4d_91e5);
    while !stop.is_cancelled() {
        tokio::select! {
            _ = sleep(SAMPLE_EVERY) => {}
            _ = stop.cancelled() => break,
        }
        let api = *rng.pick(&apis);
        let uid = rng.between(uids.start, uids.end - 1);
        let Some(before) = seen.last_id() else { continue };
        let Ok(response) = http.get(format!("http://{api}/v1/presence/{uid}")).send().await else { continue };
        if !response.status().is_success() {
            continue;
        }
        let Ok(answer) = response.json::<Value>().await else { continue };
        let sessions: Vec<Value> = answer["sessions"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|s| s["session"].as_str().map(Value::from))
            .collect();
        let _ = writeln!(out, "{}", serde_json::json!({"uid": uid, "seen": before, "sessions": sessions}));
    }
    let _ = out.flush();
}

/// How often presence is sampled.
const SAMPLE_EVERY: Duration = Duration::from_millis(100);
