//! The dashboard and the alert rules only name metrics a running gateway exports, and the
//! dashboard has every panel an operator expects.

mod common;

use std::collections::BTreeSet;

use common::{dashboard_queries, short_config, TestServer};

/// Metric names in a PromQL expression: identifiers of our own and the process collector's.
fn metric_names(expr: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let bytes = expr.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        let starts = |p: &str| expr[i..].starts_with(p) && (i == 0 || !is_ident(bytes[i - 1]));
        if starts("idlegate_") || starts("process_") {
            let end = expr[i..].find(|c: char| !is_ident(c as u8)).map_or(expr.len(), |n| i + n);
            names.insert(expr[i..end].to_string());
            i = end;
        } else {
            i += 1;
        }
    }
    names
}

fn is_ident(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_'
}

#[tokio::test]
async fn every_metric_the_dashboard_and_alerts_name_is_exported() {
    let mut server = TestServer::start(short_config()).await;
    // API request counters are labelled by route and code, so they appear with a request.
    assert_eq!(common::http_get(server.api, "/v1/online").await.0, 200);
    let (_, body) = server.admin_get("/metrics").await;
    let exported: BTreeSet<&str> =
        body.lines().filter(|l| !l.starts_with('#')).filter_map(|l| l.split(['{', ' ']).next()).collect();

    let alerts = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/grafana/alerts.yml")).unwrap();
    let mut named = metric_names(&alerts);
    for (title, expr) in dashboard_queries() {
        let names = metric_names(&expr);
        assert!(!names.is_empty(), "panel {title:?} queries no idlegate metric: {expr}");
        named.extend(names);
    }
    for name in &named {
        assert!(exported.contains(name.as_str()), "{name} is queried but not exported");
    }
    // The metric list, so a rename cannot slip through unnoticed.
    for required in [
        "idlegate_online_users",
        "idlegate_online_sessions",
        "idlegate_connections_open",
        "idlegate_connections_accepted_total",
        "idlegate_connections_closed_total",
        "idlegate_logins_total",
        "idlegate_frames_received_total",
        "idlegate_ring_expired_total",
        "idlegate_ring_tracked_uids",
        "idlegate_ring_silence_uids",
        "idlegate_ring_sweep_duration_seconds_bucket",
        "idlegate_ring_expired_per_sweep_bucket",
        "idlegate_ring_tick_lag_seconds_bucket",
        "idlegate_build_info",
        "process_resident_memory_bytes",
        "process_cpu_seconds_total",
        "process_open_fds",
        "idlegate_pushes_total",
        "idlegate_events_total",
        "idlegate_event_log_events",
        "idlegate_event_log_bytes",
        "idlegate_event_consumers",
        "idlegate_api_requests_total",
        "idlegate_connections_shed_total",
        "idlegate_pending_logins",
        "idlegate_handshakes_total",
        "idlegate_handshake_duration_seconds_bucket",
        "idlegate_tls_reloads_total",
        "idlegate_tls_cert_expiry_timestamp_seconds",
        "idlegate_webhook_requests_total",
        "idlegate_webhook_events_total",
        "idlegate_webhook_lag_seconds",
        "idlegate_webhook_backlog_events",
    ] {
        assert!(exported.contains(required), "{required} is not exported");
    }
    server.shutdown().await;
}

#[test]
fn dashboard_has_the_panels_operators_need() {
    let queries = dashboard_queries();
    let all = queries.iter().map(|(_, e)| e.as_str()).collect::<Vec<_>>().join("\n");
    for needle in [
        "sum(idlegate_online_users",
        "sum by (instance, transport) (idlegate_connections_open",
        "sum by (transport, result) (rate(idlegate_handshakes_total",
        "rate(idlegate_logins_total",
        "sum by (reason) (rate(idlegate_connections_closed_total",
        "sum by (age_seconds) (idlegate_ring_silence_uids",
        "idlegate_ring_expired_per_sweep_bucket",
        "histogram_quantile(0.5, sum by (le) (rate(idlegate_ring_sweep_duration_seconds_bucket",
        "histogram_quantile(0.99, sum by (le) (rate(idlegate_ring_sweep_duration_seconds_bucket",
        "histogram_quantile(0.99, sum by (le, instance) (rate(idlegate_ring_tick_lag_seconds_bucket",
        "sum by (kind) (rate(idlegate_frames_received_total",
        "process_resident_memory_bytes",
        "rate(process_cpu_seconds_total",
        "sum by (result) (rate(idlegate_pushes_total",
        "sum by (type) (rate(idlegate_events_total",
        "rate(idlegate_api_requests_total",
        "sum by (why) (rate(idlegate_connections_shed_total",
    ] {
        assert!(all.contains(needle), "no panel queries {needle}");
    }
    assert!(queries.iter().all(|(_, e)| e.contains("instance=~\"$instance\"")), "every query honours $instance");
}

#[test]
fn metric_names_are_found_in_expressions() {
    let names = metric_names("sum(rate(idlegate_logins_total{a=\"b\"}[1m])) / process_open_fds");
    assert_eq!(names.into_iter().collect::<Vec<_>>(), ["idlegate_logins_total", "process_open_fds"]);
}
