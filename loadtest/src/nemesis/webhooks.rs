//! The nemesis's webhook receiver: the other way a backend follows the events. Every
//! gateway of the run posts to it (`--webhook-url`); it acknowledges each batch, keeps each
//! event once (deliveries are at least once: a batch in flight when its relay died comes
//! again, with the same ids), and writes them in the order received to `webhooks.jsonl`,
//! which the checker judges as it judges the stream. `start` events are a lone gateway's
//! (docs/API.md) and left out.

use std::collections::HashSet;
use std::io::Write;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use axum::body::Bytes;
use axum::http::StatusCode;
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use super::observe::Seen;

/// What the receiver keeps: the ids delivered, the file, and what the events say is open.
struct Received {
    ids: HashSet<String>,
    out: std::io::BufWriter<std::fs::File>,
}

/// Serves on a loopback port until `stop`; answers its address and the events' open
/// sessions, so the run can wait until the webhooks too have every `offline`.
pub async fn receive(
    out: std::fs::File,
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
            let (seen, received) = (s.clone(), r.clone());
            async move { deliver(&body, &seen, &received) }
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
