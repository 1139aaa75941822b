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
}

impl Health {
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
}

/// Serves on a loopback port until `stop`; answers its address and the events' open
/// sessions, so the run can wait until the webhooks too have every `offline`.
pub async fn receive(
    out: std::fs::File,
    health: Arc<Health>,
    stop: CancellationToken,
) -> Result<(SocketAddr, Arc<Seen>, tokio::task::JoinHandle<()>), String> {
    let listener =
        tokio::net::TcpListener::bind("127.0.0.1:0").await.map_err(|e| format!("a webhook receiver: {e}"))?;
    let addr = listener.local_addr().map_err(|e| format!("a webhook receiver: {e}"))?;
    let seen = Arc::new(Seen::default());
    let received = Arc::new(Mutex::new(Received { ids: HashSet::new(), out: std::io::BufWriter::new(out) }));
    let (s, r) = (seen.clone(), received.clone());
    let app = axum::Router::new().route(
        "/hook",
        axum::routing::post(move |body: Bytes| {
            let (seen, received, health) = (s.clone(), r.clone(), health.clone());
            async move {
                // A request the relay gave up on is dropped with its connection, before it
                // is taken.
                match health.draw() {
                    Answer::Now => deliver(&body, &seen, &received).into_response(),
                    Answer::Late(after) => {
                        tokio::time::sleep(after).await;
                        deliver(&body, &seen, &received).into_response()
                    }
                    Answer::Error(after) => {
                        tokio::time::sleep(after).await;
                        StatusCode::INTERNAL_SERVER_ERROR.into_response()
                    }
                    Answer::Cut => cut(),
                    Answer::Never => {
                        tokio::time::sleep(NEVER).await;
                        StatusCode::SERVICE_UNAVAILABLE.into_response()
                    }
                }
            }
        }),
    );
    let task = tokio::spawn(async move {
        let _ = axum::serve(listener, app).with_graceful_shutdown(stop.cancelled_owned()).await;
        let _ = received.lock().unwrap_or_else(|e| e.into_inner()).out.flush();
    });
    Ok((addr, seen, task))
}

/// One delivery: its new events written, 204; a body that is not a batch, 400 (the relay
/// would retry it forever, and the run's checker would miss it: the file says so).
fn deliver(body: &[u8], seen: &Seen, received: &Mutex<Received>) -> StatusCode {
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
    StatusCode::NO_CONTENT
}

/// A response whose body breaks off after its head: the connection is closed mid-answer.
/// Its status is an error, so that a relay reading the status alone still sends again.
fn cut() -> Response {
    let broken = futures_util::stream::once(async { Err::<Bytes, _>(std::io::Error::other("cut by the nemesis")) });
    let mut response = Response::new(Body::from_stream(broken));
    *response.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
    response
}
