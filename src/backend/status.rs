//! The status page: one HTML page built into the binary (no build step, no CDN, no
//! framework), and the JSON summary it polls.
//!
//! The summary reads only gauges and counters the metrics already keep (the silence picture
//! is refreshed once a tick by the ticker), so a hundred open pages cost a hundred small
//! reads a second and nothing on the per-frame path. The page's event tail follows
//! `/v1/events`, served beside it with the API's token check.

use std::sync::Arc;

use axum::extract::State;
use axum::http::header;
use axum::response::{Html, IntoResponse};
use axum::Json;
use serde_json::{json, Map, Value};
use tokio::time::Instant;

use crate::client::CloseReason;
use crate::gateway::Gateway;

/// The page, as written in `status.html`.
const PAGE: &str = include_str!("status.html");

/// `GET /`: the page.
pub(crate) async fn page() -> impl IntoResponse {
    ([(header::CACHE_CONTROL, "no-cache")], Html(PAGE))
}

/// `GET /status.json`: what the page shows, read off the metrics.
pub(crate) async fn summary(State(gateway): State<Arc<Gateway>>) -> Json<Value> {
    let metrics = &gateway.metrics;
    let config = &gateway.config;
    let online = metrics.online_users.get();
    // Each node of a cluster (this one alone otherwise), from the directory.
    let nodes: Vec<Value> = match gateway.directory.online().await {
        Ok(count) => count
            .nodes
            .iter()
            .map(|n| json!({ "node": n.node, "online": n.online, "connections": n.connections }))
            .collect(),
        Err(_) => vec![json!({ "node": config.node_id, "online": online })],
    };
    let closes: Map<String, Value> =
        CloseReason::ALL.iter().map(|&r| (r.label().to_string(), Value::from(metrics.closed_count(r)))).collect();
    Json(json!({
        "node": config.node_id,
        "version": env!("CARGO_PKG_VERSION"),
        "uptime_ms": Instant::now().saturating_duration_since(gateway.clock.instant_of(0)).as_millis() as u64,
        "timeout_ms": config.timeout_ms(),
        "tick_ms": config.tick_ms(),
        "max_connections": config.max_connections,
        "online": online,
        "connections": metrics.connections_open.get(),
        "silence": metrics.silence(),
        "closes": closes,
        "api_token_required": config.api_token.is_some(),
        "nodes": nodes,
    }))
}
