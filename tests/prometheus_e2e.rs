//! End to end with a real Prometheus (Debian's `prometheus` package): it scrapes a gateway
//! every second while clients log in, ping, and fall silent. Through Prometheus's query API:
//! the online sum reaches N, every dashboard query parses and returns series under load,
//! every alert rule evaluates, and the online sum returns to 0 once the clients are expired.
//!
//! On a machine without Prometheus the test skips with a message; under CI (`CI` set) it
//! fails instead, so CI can never pass without running it.

mod common;

use std::net::SocketAddr;
use std::process::Stdio;
use std::time::Duration;

use common::{dashboard_queries, find_on_path, free_addr, http_get, skip_without, Client, TestServer};
use idlegate::Config;
use idlegate_proto::{CloseReason, Frame};
use tokio::time::{sleep, Instant};
use tokio_util::sync::CancellationToken;

const CLIENTS: u64 = 40;
/// How long each wait on Prometheus may take: scrapes are 1 s apart, rates need two of them.
const WAIT: Duration = Duration::from_secs(60);

/// Runs an instant query; `Err` carries Prometheus's error (a query that does not parse).
async fn query(prom: SocketAddr, expr: &str) -> Result<Vec<serde_json::Value>, String> {
    let encoded: String = form_urlencoded::byte_serialize(expr.as_bytes()).collect();
    let (status, body) = http_get(prom, &format!("/api/v1/query?query={encoded}")).await;
    let json: serde_json::Value =
        serde_json::from_str(&body).map_err(|e| format!("HTTP {status}, not JSON ({e}): {body}"))?;
    if json["status"] != "success" {
        return Err(format!("{}: {}", json["errorType"], json["error"]));
    }
    Ok(json["data"]["result"].as_array().cloned().unwrap_or_default())
}

/// The single value of a scalar-like query, if it has one series.
async fn value(prom: SocketAddr, expr: &str) -> Option<f64> {
    let result = query(prom, expr).await.ok()?;
    result.first()?["value"][1].as_str()?.parse().ok()
}

async fn wait_for_value(prom: SocketAddr, expr: &str, want: f64) {
    let deadline = Instant::now() + WAIT;
    let mut last = None;
    while Instant::now() < deadline {
        last = value(prom, expr).await;
        if last == Some(want) {
            return;
        }
        sleep(Duration::from_millis(250)).await;
    }
    panic!("{expr} never reached {want}; last {last:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prometheus_sees_users_come_and_go_and_every_dashboard_query_works() {
    let Some(prometheus) = find_on_path(&["prometheus"]) else {
        return skip_without("prometheus", "apt-get install prometheus");
    };

    let config = Config {
        timeout: Duration::from_secs(3),
        tick: Duration::from_millis(100),
        login_timeout: Duration::from_secs(5),
        ..Config::default()
    };
    let mut server = TestServer::start(config).await;

    let dir = tempfile::tempdir().unwrap();
    let alerts = concat!(env!("CARGO_MANIFEST_DIR"), "/grafana/alerts.yml");
    let prom_config = dir.path().join("prometheus.yml");
    std::fs::write(
        &prom_config,
        format!(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nrule_files:\n  - {alerts}\n\
             scrape_configs:\n  - job_name: idlegate\n    static_configs:\n      - targets: ['{}']\n",
            server.admin
        ),
    )
    .unwrap();
    let prom = free_addr();
    let log = std::fs::File::create(dir.path().join("prometheus.log")).unwrap();
    let mut child = tokio::process::Command::new(&prometheus)
        .arg(format!("--config.file={}", prom_config.display()))
        .arg(format!("--storage.tsdb.path={}", dir.path().join("data").display()))
        .arg(format!("--web.listen-address={prom}"))
        .stdout(Stdio::null())
        .stderr(log)
        .kill_on_drop(true)
        .spawn()
        .expect("prometheus starts");

    let deadline = Instant::now() + WAIT;
    while tokio::net::TcpStream::connect(prom).await.is_err() || http_get(prom, "/-/ready").await.0 != 200 {
        assert!(Instant::now() < deadline, "prometheus never got ready; see its log");
        sleep(Duration::from_millis(200)).await;
    }

    // N clients log in and keep pinging well inside the timeout.
    let stop_pinging = CancellationToken::new();
    let mut clients = Vec::new();
    for uid in 0..CLIENTS {
        let mut c = Client::connect(server.addr).await;
        assert!(matches!(c.login(uid).await, Frame::Welcome { .. }));
        let stop = stop_pinging.clone();
        clients.push(tokio::spawn(async move {
            while !stop.is_cancelled() {
                c.send(Frame::Data(bytes::Bytes::from_static(b"d"))).await;
                c.send(Frame::Ping(bytes::Bytes::from_static(b"p"))).await;
                // Pushes from the backend below may come before the PONG.
                loop {
                    match c.recv().await {
                        Some(Frame::Pong(_)) => break,
                        Some(Frame::Push(_)) => {}
                        other => panic!("expected PONG or PUSH, got {other:?}"),
                    }
                }
                sleep(Duration::from_millis(500)).await;
            }
            c
        }));
    }
    // A backend pushes to everyone while they ping, and follows the events.
    let api = server.api;
    let pushing = stop_pinging.clone();
    let pusher = tokio::spawn(async move {
        let uids: Vec<u64> = (0..CLIENTS).collect();
        let body = serde_json::json!({ "uids": uids, "payload": "aGk=" }).to_string();
        while !pushing.is_cancelled() {
            assert_eq!(common::http(api, "POST", "/v1/push", &[], &body).await.0, 200);
            sleep(Duration::from_millis(300)).await;
        }
    });
    let (status, _events) = common::Sse::open(server.api, "/v1/events", &[]).await;
    assert_eq!(status, 200);
    wait_for_value(prom, "sum(idlegate_online_users)", CLIENTS as f64).await;

    // Every dashboard query parses and, under this load, returns at least one series.
    let mut pending = dashboard_queries();
    let deadline = Instant::now() + WAIT;
    while !pending.is_empty() {
        let mut still = Vec::new();
        for (title, expr) in pending {
            let expr_here = expr.replace("$instance", ".*");
            match query(prom, &expr_here).await {
                Err(e) => panic!("panel {title:?}: query does not run: {e}\n{expr}"),
                Ok(series) if series.is_empty() => still.push((title, expr)),
                Ok(_) => {}
            }
        }
        pending = still;
        assert!(Instant::now() < deadline || pending.is_empty(), "queries returning no series: {pending:#?}");
        sleep(Duration::from_millis(500)).await;
    }

    // The alert rules are valid for promtool and evaluate without error in Prometheus.
    if let Some(promtool) = find_on_path(&["promtool"]) {
        let out = std::process::Command::new(promtool).args(["check", "rules", alerts]).output().unwrap();
        assert!(out.status.success(), "promtool: {}", String::from_utf8_lossy(&out.stdout));
    } else {
        assert!(std::env::var_os("CI").is_none(), "promtool comes with the prometheus package");
    }
    let deadline = Instant::now() + WAIT;
    loop {
        let (_, body) = http_get(prom, "/api/v1/rules").await;
        let json: serde_json::Value = serde_json::from_str(&body).expect("rules API answers JSON");
        let rules: Vec<&serde_json::Value> = json["data"]["groups"]
            .as_array()
            .into_iter()
            .flatten()
            .flat_map(|g| g["rules"].as_array())
            .flatten()
            .collect();
        assert!(!rules.is_empty(), "prometheus loaded no alert rules");
        let bad: Vec<_> = rules.iter().filter(|r| r["health"] != "ok").map(|r| (&r["name"], &r["lastError"])).collect();
        if bad.is_empty() {
            break;
        }
        assert!(Instant::now() < deadline, "alert rules not evaluating: {bad:?}");
        sleep(Duration::from_millis(500)).await;
    }

    // Everybody falls silent; the gateway expires them and Prometheus sees 0 online.
    stop_pinging.cancel();
    pusher.await.unwrap();
    for task in clients {
        let mut c = task.await.unwrap();
        // Pushes still queued arrive first; they do not keep anyone alive.
        loop {
            match c.recv().await {
                Some(Frame::Push(_)) => {}
                Some(Frame::Bye { reason, .. }) => {
                    assert_eq!(reason, CloseReason::IdleTimeout);
                    break;
                }
                other => panic!("expected BYE(idle_timeout), got {other:?}"),
            }
        }
    }
    wait_for_value(prom, "sum(idlegate_online_users)", 0.0).await;
    wait_for_value(prom, "sum(idlegate_ring_tracked_uids)", 0.0).await;
    wait_for_value(prom, "sum(idlegate_connections_closed_total{reason=\"idle_timeout\"})", CLIENTS as f64).await;

    let _ = child.kill().await;
    server.shutdown().await;
}
