//! The status page: one HTML page built into the binary (no build step, no CDN, no
//! framework), and the JSON summary it polls.
//!
//! The summary reads only gauges and counters the metrics already keep (the silence picture
//! is refreshed once a tick by the ticker), so a hundred open pages cost a hundred small
//! reads a second and nothing on the per-frame path. Close rates are averaged here over the
//! last 10 s, as `rate()` over `/metrics` would. The page's event tail shows the last 50
//! events at load (`/v1/events?tail=50`), then follows; it is served beside it with the
//! API's token check.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use axum::extract::State;
use axum::http::header;
use axum::response::{Html, IntoResponse};
use axum::Extension;
use axum::Json;
use serde_json::{json, Map, Value};
use tokio::time::Instant;

use crate::config::KeysStatus;
use crate::http::state::State as Shared;
use crate::presence::unix_ms_now;
use crate::proto::{CloseReason, Transport};

/// The window close rates are averaged over: what `rate(...[10s])` over `/metrics` shows.
const RATE_WINDOW: Duration = Duration::from_secs(10);

/// Closes by reason at moments the summary was read, for rates over [`RATE_WINDOW`]
/// computed here rather than by each page from its own polls.
#[derive(Debug, Default)]
pub(crate) struct CloseRates {
    samples: Mutex<VecDeque<(Instant, Vec<u64>)>>,
}

impl CloseRates {
    /// Records `totals` now; returns each one's rate a second since the oldest sample in
    /// the window (0 before there is one).
    fn rates(&self, totals: &[u64]) -> Vec<f64> {
        let now = Instant::now();
        let mut samples = self.samples.lock().unwrap_or_else(PoisonError::into_inner);
        while samples.len() > 1 && samples.front().is_some_and(|(t, _)| now.duration_since(*t) > RATE_WINDOW) {
            samples.pop_front();
        }
        let rates = match samples.front() {
            Some((then, before)) if now.duration_since(*then) >= Duration::from_millis(500) => {
                let secs = now.duration_since(*then).as_secs_f64();
                totals.iter().zip(before).map(|(n, b)| n.saturating_sub(*b) as f64 / secs).collect()
            }
            _ => vec![0.0; totals.len()],
        };
        if samples.back().is_none_or(|(t, _)| now.duration_since(*t) >= Duration::from_millis(500)) {
            samples.push_back((now, totals.to_vec()));
        }
        rates
    }
}

/// The page, as written in `status.html`.
const PAGE: &str = include_str!("status.html");

/// `GET /`: the page.
pub(crate) async fn page() -> impl IntoResponse {
    ([(header::CACHE_CONTROL, "no-cache")], Html(PAGE))
}

/// The `jwt` object of `/status.json`.
fn jwt_status(status: &KeysStatus) -> Value {
    let source = match (status.file_keys > 0, status.url.is_some()) {
        (true, true) => "file+url",
        (false, true) => "url",
        _ => "file",
    };
    let now = unix_ms_now();
    json!({
        "keys": status.keys,
        "source": source,
        "url": status.url,
        "fetched_unix_ms": status.fetched_unix_ms,
        "fetched_age_ms": status.fetched_unix_ms.map(|at| now.saturating_sub(at)),
        "tried_unix_ms": status.tried_unix_ms,
        "last_error": status.last_error,
    })
}

/// `GET /status.json`: what the page shows, read off the metrics.
pub(crate) async fn summary(
    State(shared): State<Arc<Shared>>,
    Extension(rates): Extension<Arc<CloseRates>>,
) -> Json<Value> {
    let metrics = &shared.metrics;
    let config = &shared.settings;
    let online = metrics.online_users.get();
    // Each node of a cluster (this one alone otherwise), from the directory.
    let nodes: Vec<Value> = match shared.directory.online().await {
        Ok(count) => count
            .nodes
            .iter()
            .map(|n| json!({ "node": n.node, "online": n.online, "connections": n.connections }))
            .collect(),
        Err(_) => vec![json!({ "node": config.node_id, "online": online })],
    };
    let totals: Vec<u64> = CloseReason::ALL.iter().map(|&r| metrics.closed_count(r)).collect();
    let per_s = rates.rates(&totals);
    let closes: Map<String, Value> =
        CloseReason::ALL.iter().zip(&totals).map(|(r, &n)| (r.label().to_string(), Value::from(n))).collect();
    let closes_per_s: Map<String, Value> = CloseReason::ALL
        .iter()
        .zip(per_s)
        .map(|(r, rate)| (r.label().to_string(), Value::from((rate * 10.0).round() / 10.0)))
        .collect();
    Json(json!({
        "node": config.node_id,
        "version": env!("CARGO_PKG_VERSION"),
        "uptime_ms": Instant::now().saturating_duration_since(shared.clock.instant_of(0)).as_millis() as u64,
        "timeout_ms": config.timeout_ms,
        "tick_ms": config.tick_ms,
        "max_connections": config.max_connections,
        "online": online,
        "sessions": metrics.online_sessions.get(),
        "max_devices": config.max_devices,
        "connections": metrics.connections_open.get(),
        "connections_by_transport": Transport::ALL
            .iter()
            .map(|t| (t.label().to_string(), Value::from(metrics.open_on(*t))))
            .collect::<Map<String, Value>>(),
        "silence": metrics.silence(),
        // The timeout classes any session is in or expired from.
        "timeout_classes": metrics
            .classes()
            .into_iter()
            .filter(|&(_, sessions, expired)| sessions > 0 || expired > 0)
            .map(|(ms, sessions, expired)| json!({ "timeout_ms": ms, "sessions": sessions, "expired": expired }))
            .collect::<Vec<_>>(),
        "closes": closes,
        "closes_per_s": closes_per_s,
        "api_token_required": config.api_token.is_some(),
        // The age of the oldest event no webhook receiver acknowledged yet; null without one.
        "webhook_lag_ms": config.webhook.then(|| (metrics.webhook_lag_seconds.get() * 1000.0).round() as u64),
        // The JWT keys in use, where from, and how fetching them by URL goes; null without JWT.
        "jwt": config.jwt.as_ref().map(|jwt| jwt_status(&jwt.status())),
        "nodes": nodes,
    }))
}
