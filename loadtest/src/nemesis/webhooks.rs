//! The nemesis's webhook receiver: the other way a backend follows the events. Every
//! gateway of the run posts to it (`--webhook-url`); it acknowledges each batch, keeps each
//! event once (deliveries are at least once: a batch in flight when its relay died comes
//! again, with the same ids), and writes them in the order received to `webhooks.jsonl`,
//! which the checker judges as it judges the stream. `start` events are a lone gateway's
//! (docs/API.md) and left out.
//!
//! Under a `slow_receiver` fault it answers as a struggling backend would (issue 49): each
//! request, by a draw from the fault's seed, is answered late (0.2 to 15 s, then taken), or
//! with 500 after up to 2 s, or with a response cut off after its head, or never (held
//! until the relay gives up). What is not answered 204 is not taken: the relay must send it
//! again, and the checker still finds every event, in order.
//!
//! Every request is also written to `webhook-requests.jsonl` as it ends: when it came and
//! ended (ms since the run's start), its `webhook-id`, the ids of its first and last events
//! and how many it held, and how it was answered (`taken`, `error`, `cut`, `never`, or
//! `dropped` when the relay gave up first), with its end by the wall clock too
//! (`done_unix_ms`, for weighing it against the stream's ids). The checker judges that
//! timeline (issue 49, promise 4).

use std::collections::HashSet;
use std::io::Write;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use super::observe::Seen;
use super::schedule::SplitMix64;

/// How long a request the receiver never answers is held: past any relay's timeout.
const NEVER: Duration = Duration::from_secs(120);

/// The receiver's state of health: `Some(seed)` while a `slow_receiver` fault lasts.
#[derive(Default)]
pub struct Health {
    slow: Mutex<Option<u64>>,
    requests: AtomicU64,
    /// The run's start, which the request log's times count from.
    started: std::sync::OnceLock<tokio::time::Instant>,
}

impl Health {
    /// The run starts now: the request log's times count from here.
    pub fn start(&self, at: tokio::time::Instant) {
        let _ = self.started.set(at);
    }

    fn now_ms(&self) -> u64 {
        self.started.get().map_or(0, |s| s.elapsed().as_millis() as u64)
    }

    pub fn set(&self, slow: Option<u64>) {
        *self.slow.lock().unwrap_or_else(|e| e.into_inner()) = slow;
    }

    /// How this request is answered, drawn from the fault's seed and the request's number.
    fn draw(&self) -> Answer {
        let Some(seed) = *self.slow.lock().unwrap_or_else(|e| e.into_inner()) else { return Answer::Now };
        let mut rng = SplitMix64::new(seed ^ self.requests.fetch_add(1, Ordering::Relaxed));
        match rng.between(0, 99) {
            0..=54 => Answer::Late(Duration::from_millis(rng.between(200, 15_000))),
            55..=74 => Answer::Error(Duration::from_millis(rng.between(0, 2_000))),
            75..=89 => Answer::Cut,
            _ => Answer::Never,
        }
    }
}

/// How one request is answered.
enum Answer {
    Now,
    Late(Duration),
    Error(Duration),
    Cut,
    Never,
}

/// What the receiver keeps: the ids delivered, the file, and what the events say is open.
struct Received {
    ids: HashSet<String>,
    out: std::io::BufWriter<std::fs::File>,
    requests: std::io::BufWriter<std::fs::File>,
}

/// One request as the log has it, written when it ends however it ends (dropped with its
/// connection included: the write is in `Drop`).
struct Request {
    received: Arc<Mutex<Received>>,
    health: Arc<Health>,
    at_ms: u64,
    id: String,
    first: String,
    last: String,
    events: usize,
    answer: &'static str,
}

impl Drop for Request {
    fn drop(&mut self) {
        let line = serde_json::json!({
            "at_ms": self.at_ms,
            "done_ms": self.health.now_ms(),
            // The same moment by the wall clock: the stream's ids are Redis's unix ms, and
            // the progress check (promise 4) weighs the two against each other.
            "done_unix_ms": unix_ms(),
            "webhook_id": self.id,
            "first": self.first,
            "last": self.last,
            "events": self.events,
            "answer": self.answer,
        });
        let mut received = self.received.lock().unwrap_or_else(|e| e.into_inner());
        let _ = writeln!(received.requests, "{line}");
    }
}

/// Now, in unix ms, by the machine's clock (Redis's, on the same machine).
fn unix_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

/// Serves on a loopback port until `stop`; answers its address and the events' open
/// sessions, so the run can wait until the webhooks too have every `offline`.
pub async fn receive(
    out: std::fs::File,
    requests: std::fs::File,
    health: Arc<Health>,
    stop: CancellationToken,
) -> Result<(SocketAddr, Arc<Seen>, tokio::task::JoinHandle<()>), String> {
    let listener =
        tokio::net::TcpListener::bind("127.0.0.1:0").await.map_err(|e| format!("a webhook receiver: {e}"))?;
    let addr = listener.local_addr().map_err(|e| format!("a webhook receiver: {e}"))?;
    let seen = Arc::new(Seen::default());
    let (out, requests) = (std::io::BufWriter::new(out), std::io::BufWriter::new(requests));
    let received = Arc::new(Mutex::new(Received { ids: HashSet::new(), out, requests }));
    let (s, r) = (seen.clone(), received.clone());
    let app = axum::Router::new().route(
        "/hook",
        axum::routing::post(move |headers: axum::http::HeaderMap, body: Bytes| {
            let (seen, received, health) = (s.clone(), r.clone(), health.clone());
            async move {
                let mut request = Request::of(&headers, &body, received.clone(), health.clone());
                // A request the relay gave up on is dropped with its connection, before it
                // is taken.
                match health.draw() {
                    Answer::Now => deliver(&body, &seen, &received, &mut request).into_response(),
                    Answer::Late(after) => {
                        tokio::time::sleep(after).await;
                        deliver(&body, &seen, &received, &mut request).into_response()
                    }
                    Answer::Error(after) => {
                        tokio::time::sleep(after).await;
                        request.answer = "error";
                        StatusCode::INTERNAL_SERVER_ERROR.into_response()
                    }
                    Answer::Cut => {
                        request.answer = "cut";
                        cut()
                    }
                    Answer::Never => {
                        tokio::time::sleep(NEVER).await;
                        request.answer = "never";
                        StatusCode::SERVICE_UNAVAILABLE.into_response()
                    }
                }
            }
        }),
    );
    let task = tokio::spawn(async move {
        let _ = axum::serve(listener, app).with_graceful_shutdown(stop.cancelled_owned()).await;
        let mut received = received.lock().unwrap_or_else(|e| e.into_inner());
        let _ = received.out.flush();
        let _ = received.requests.flush();
    });
    Ok((addr, seen, task))
}

/// One delivery: its new events written, 204; a body that is not a batch, 400 (the relay
/// would retry it forever, and the run's checker would miss it: the file says so).
fn deliver(body: &[u8], seen: &Seen, received: &Mutex<Received>, request: &mut Request) -> StatusCode {
    let Ok(batch) = serde_json::from_slice::<Value>(body) else {
        return StatusCode::BAD_REQUEST;
    };
    let Some(events) = batch["events"].as_array() else {
        return StatusCode::BAD_REQUEST;
    };
    let mut received = received.lock().unwrap_or_else(|e| e.into_inner());
    for event in events {
        let Some(id) = event["id"].as_str() else { continue };
        if event["type"] == "start" || !received.ids.insert(id.to_string()) {
            continue;
        }
        seen.note(event);
        let _ = writeln!(received.out, "{event}");
    }
    request.answer = "taken";
    StatusCode::NO_CONTENT
}

impl Request {
    /// A request as it arrives: `dropped` until it is answered.
    fn of(
        headers: &axum::http::HeaderMap,
        body: &[u8],
        received: Arc<Mutex<Received>>,
        health: Arc<Health>,
    ) -> Request {
        let id = headers.get("webhook-id").and_then(|v| v.to_str().ok()).unwrap_or("").to_string();
        let batch: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
        let events = batch["events"].as_array().map_or(&[][..], Vec::as_slice);
        let id_of = |e: Option<&Value>| e.and_then(|e| e["id"].as_str()).unwrap_or("").to_string();
        let (first, last) = (id_of(events.first()), id_of(events.last()));
        let at_ms = health.now_ms();
        Request { received, health, at_ms, id, first, last, events: events.len(), answer: "dropped" }
    }
}

/// A response whose body breaks off after its head: the connection is closed mid-answer.
/// Its status is an error, so that a relay reading the status alone still sends again.
fn cut() -> Response {
    let broken = futures_util::stream::once(async { Err::<Bytes, _>(std::io::Error::other("cut by the nemesis")) });
    let mut response = Response::new(Body::from_stream(broken));
    *response.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
    response
}
