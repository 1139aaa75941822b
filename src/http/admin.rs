//! The admin HTTP endpoint: liveness, readiness, Prometheus metrics and the status page, on
//! its own port so it never competes with client traffic.

use std::sync::Arc;

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::IntoResponse;
use axum::routing::get;
use axum::{Extension, Router};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::http::listener::{Bounded, ADMIN_CONNECTIONS, HTTP_IDLE};
use crate::http::state::State as Shared;
use crate::http::{api, status};

/// Content type of the Prometheus text exposition format.
const PROMETHEUS_TEXT: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Serves `/healthz`, `/readyz`, `/metrics`, and the status page (`/`, `/status.json`, and
/// `/v1/events` with the API's token check) on `listener` until `stop` is cancelled.
pub(crate) async fn serve(listener: TcpListener, shared: Arc<Shared>, stop: CancellationToken) {
    let config = &shared.settings;
    let listener = Bounded::new(listener, ADMIN_CONNECTIONS, HTTP_IDLE).with_tls(config.tls.as_ref(), config.admin_tls);
    let app = Router::new()
        .route("/", get(status::page))
        .route("/status.json", get(status::summary))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .layer(Extension(Arc::new(status::CloseRates::default())))
        .with_state(shared.clone())
        .merge(api::events_router(shared, stop.clone()));

    if let Err(e) = axum::serve(listener, app).with_graceful_shutdown(stop.cancelled_owned()).await {
        tracing::error!(error = %e, "admin endpoint failed");
    }
}

/// 200 while the gateway works; 503 once its ticker has died (nobody would go offline), so
/// a liveness probe restarts it.
async fn healthz(State(shared): State<Arc<Shared>>) -> impl IntoResponse {
    if shared.health.expiry_stopped() {
        (StatusCode::SERVICE_UNAVAILABLE, "expiry stopped: the ticker died\n")
    } else {
        (StatusCode::OK, "ok\n")
    }
}

/// 200 while accepting clients, 503 once draining, so a load balancer stops sending new ones.
/// In a cluster, 503 too while Redis refuses this node (the credentials or the ACL user of
/// `--redis`, an error answer): the reason in the body, so a balancer sends new clients to
/// nodes that work. During an outage of Redis itself (unreachable, replicas behind), which
/// every node sees, the node stays ready and says so in the body: it serves and expires its
/// clients alone and queues their presence changes, and taking every node out of the
/// balancer would refuse every client for nothing.
async fn readyz(State(shared): State<Arc<Shared>>) -> impl IntoResponse {
    if shared.health.expiry_stopped() {
        (StatusCode::SERVICE_UNAVAILABLE, "expiry stopped\n".to_string())
    } else if shared.health.draining.is_cancelled() {
        (StatusCode::SERVICE_UNAVAILABLE, "draining\n".to_string())
    } else if let Some(trouble) = shared.health.store_trouble() {
        let why = trouble.text;
        if trouble.outage {
            (StatusCode::OK, format!("ready, alone: {why}; serving clients, presence changes queued\n"))
        } else {
            let body = format!("not ready: {why}; serving the clients it has, presence changes queued\n");
            (StatusCode::SERVICE_UNAVAILABLE, body)
        }
    } else {
        (StatusCode::OK, "ready\n".to_string())
    }
}

async fn metrics(State(shared): State<Arc<Shared>>) -> impl IntoResponse {
    ([(header::CONTENT_TYPE, PROMETHEUS_TEXT)], shared.metrics.render())
}
