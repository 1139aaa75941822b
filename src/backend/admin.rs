//! The admin HTTP endpoint: liveness, readiness and Prometheus metrics, on its own port so
//! it never competes with client traffic.

use std::sync::Arc;

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::gateway::Gateway;

/// Content type of the Prometheus text exposition format.
const PROMETHEUS_TEXT: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Serves `/healthz`, `/readyz` and `/metrics` on `listener` until `stop` is cancelled.
pub(crate) async fn serve(listener: TcpListener, gateway: Arc<Gateway>, stop: CancellationToken) {
    let app = Router::new()
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .with_state(gateway);
    if let Err(e) = axum::serve(listener, app).with_graceful_shutdown(stop.cancelled_owned()).await {
        tracing::error!(error = %e, "admin endpoint failed");
    }
}

/// 200 while accepting clients, 503 once draining, so a load balancer stops sending new ones.
async fn readyz(State(gateway): State<Arc<Gateway>>) -> impl IntoResponse {
    if gateway.shutdown.is_cancelled() {
        (StatusCode::SERVICE_UNAVAILABLE, "draining\n")
    } else {
        (StatusCode::OK, "ready\n")
    }
}

async fn metrics(State(gateway): State<Arc<Gateway>>) -> impl IntoResponse {
    ([(header::CONTENT_TYPE, PROMETHEUS_TEXT)], gateway.metrics.render())
}
