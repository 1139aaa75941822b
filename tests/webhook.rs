//! Webhooks as a backend receives them (`--webhook-url`): a receiver under Node
//! (`tests/data/webhook/receiver.js`) verifies every request with the Standard Webhooks
//! library (npm `standardwebhooks`), as a backend would, and the test reads what it got.
//! Covered: the `start` first, every event in the log's order and batches, the signature
//! under rotation (two secrets; the receiver holds the older), retries after 500s, hangs,
//! reset connections and refused ones (the same `webhook-id` and body each time, nothing
//! lost, order kept), the `gap` when the relay fell behind the log, and shutdown delivering the
//! `offline(shutdown)` events.
//!
//! Needs Node and the receiver's package (`npm ci` in tests/data/webhook, which `.ci/run`
//! does); skips without them, except under CI.

mod common;

use std::collections::HashSet;
use std::path::Path;
use std::time::Duration;

use common::webhook::{delivered, events, is, ready, secrets, Receiver, INSTALL};
use common::ws::DoorClient;
use common::{short_config, skip_without, TestServer, PATIENCE};
use idlegate::{Config, WebhookConfig};
use idlegate_proto::{Frame, Transport};
use serde_json::Value;

fn config(url: String, secret_file: &Path, edit: impl FnOnce(&mut WebhookConfig)) -> Config {
    let mut webhook = WebhookConfig::new(&url, secret_file).unwrap();
    webhook.linger = Duration::from_millis(20);
    webhook.max_backoff = Duration::from_millis(300);
    webhook.timeout = Duration::from_secs(1);
    edit(&mut webhook);
    Config { timeout: Duration::from_secs(60), webhook: Some(webhook), ..short_config() }
}

async fn login(server: &TestServer, uid: u64) -> DoorClient {
    let mut client = DoorClient::connect(Transport::Tcp, server.addr, None).await;
    client.login(uid).await;
    client
}

/// Waits until the metric `name` satisfies `ok`.
async fn eventually(server: &TestServer, name: &str, ok: impl Fn(f64) -> bool) {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let (_, metrics) = common::http_get(server.admin, "/metrics").await;
        if common::sample(&metrics, name).is_some_and(&ok) {
            return;
        }
        assert!(tokio::time::Instant::now() < deadline, "{name}: {:?}", common::sample(&metrics, name));
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_arrive_signed_in_order_and_in_batches_starting_with_start() {
    if !ready() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (_, older, file) = secrets();
    std::fs::write(dir.path().join("secrets"), file).unwrap();
    // The receiver holds the older secret: rotation needs no gap.
    let mut receiver = Receiver::start(0, &older, &[]).await;
    let url = format!("http://127.0.0.1:{}/hook", receiver.port);
    let mut server = TestServer::start(config(url, &dir.path().join("secrets"), |_| {})).await;
    let mut clients = Vec::new();
    for uid in 1..=5 {
        clients.push(login(&server, uid).await);
    }
    clients[0].send(Frame::Logout).await;
    let requests = receiver.until(is("user_offline", 1)).await;
    for request in &requests {
        assert_eq!(request["verified"], true, "{request}");
        assert_eq!(request["signatures"], 2, "one signature per secret: {request}");
        assert_eq!(request["content_type"], "application/json");
        let last = events(request).last().cloned().unwrap();
        assert_eq!(request["id"], last["id"], "webhook-id is the batch's last event's id");
    }
    let events = delivered(&requests);
    assert_eq!(events[0]["type"], "start", "{events:?}");
    assert_eq!(events[0]["node"], "idlegate");
    let kinds: Vec<String> = events[1..].iter().map(|e| format!("{}:{}", e["type"], e["uid"])).collect();
    let expected: Vec<String> = (1..=5)
        .flat_map(|uid| [format!("\"online\":{uid}"), format!("\"user_online\":{uid}")])
        .chain(["\"offline\":1".to_string(), "\"user_offline\":1".to_string()])
        .collect();
    assert_eq!(kinds, expected, "the log's order");
    assert!(requests.len() < events.len(), "batched: {} requests for {} events", requests.len(), events.len());
    let offline = events.iter().find(|e| e["type"] == "offline").unwrap();
    assert_eq!(offline["reason"], "logout");
    assert!(offline["session"].is_string() && offline["at_ms"].is_u64());
    // The receiver prints a request before it answers: the relay counts it a moment later.
    let acknowledged = events.len() as f64;
    eventually(&server, "idlegate_webhook_events_total", |v| v == acknowledged).await;
    eventually(&server, "idlegate_webhook_requests_total{result=\"ok\"}", |v| v == requests.len() as f64).await;
    eventually(&server, "idlegate_webhook_lag_seconds", |v| v == 0.0).await;
    // The status page shows the lag (null without a relay).
    let (_, status) = common::http_get(server.admin, "/status.json").await;
    let status: Value = serde_json::from_str(&status).unwrap();
    assert_eq!(status["webhook_lag_ms"], 0, "{status}");
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_receiver_gets_the_same_batch_again_and_nothing_is_lost_or_reordered() {
    if !ready() {
        return;
    }
    for mode in ["status", "hang"] {
        let dir = tempfile::tempdir().unwrap();
        let (newest, _, file) = secrets();
        std::fs::write(dir.path().join("secrets"), file).unwrap();
        let mut receiver = Receiver::start(0, &newest, &[("FAIL_FIRST", "3"), ("FAIL_MODE", mode)]).await;
        let url = format!("http://127.0.0.1:{}/hook", receiver.port);
        let mut server = TestServer::start(config(url, &dir.path().join("secrets"), |w| w.batch = 3)).await;
        let mut clients = Vec::new();
        for uid in 1..=4 {
            clients.push(login(&server, uid).await);
        }
        let requests = receiver.until(is("user_online", 4)).await;
        // The first batch three times refused, then taken: one id, one body.
        let first: Vec<&Value> = requests.iter().filter(|r| r["id"] == requests[0]["id"]).collect();
        assert_eq!(first.len(), 4, "{mode}: {requests:?}");
        assert!(first.iter().all(|r| r["body"] == first[0]["body"] && r["verified"] == true), "{mode}");
        let events = delivered(&requests);
        let ids: Vec<&str> = events.iter().map(|e| e["id"].as_str().unwrap()).collect();
        let unique: HashSet<&str> = ids.iter().copied().collect();
        assert_eq!(unique.len(), ids.len(), "{mode}: acknowledged once each: {ids:?}");
        let uids: Vec<u64> =
            events.iter().filter(|e| e["type"] == "online").map(|e| e["uid"].as_u64().unwrap()).collect();
        assert_eq!(uids, [1, 2, 3, 4], "{mode}: order kept");
        let (_, metrics) = common::http_get(server.admin, "/metrics").await;
        let label = if mode == "status" { "status" } else { "timeout" };
        let sample = format!("idlegate_webhook_requests_total{{result=\"{label}\"}}");
        assert_eq!(common::sample(&metrics, &sample), Some(3.0), "{mode}: {metrics}");
        server.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_receiver_that_resets_connections_a_while_gets_a_gap_then_everything_in_order() {
    if !ready() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (newest, _, file) = secrets();
    std::fs::write(dir.path().join("secrets"), file).unwrap();
    // While this file exists the receiver resets every connection.
    let hold = dir.path().join("hold");
    std::fs::write(&hold, "").unwrap();
    let mut receiver = Receiver::start(0, &newest, &[("HOLD_FILE", hold.to_str().unwrap())]).await;
    let url = format!("http://127.0.0.1:{}/hook", receiver.port);
    // A log of 16 events: 60 logins (120 events) while deliveries fail leave the relay
    // behind (it read a few before its first attempt; the rest outrun the log).
    let config = Config { event_log_capacity: 16, ..config(url, &dir.path().join("secrets"), |w| w.batch = 4) };
    let mut server = TestServer::start(config).await;
    let mut clients = Vec::new();
    for uid in 1..=60 {
        clients.push(login(&server, uid).await);
    }
    eventually(&server, "idlegate_webhook_requests_total{result=\"connect\"}", |v| v >= 1.0).await;
    std::fs::remove_file(&hold).unwrap();
    let requests = receiver.until(is("user_online", 60)).await;
    assert!(requests.iter().all(|r| r["verified"] == true));
    let events = delivered(&requests);
    assert_eq!(events[0]["type"], "start");
    let gap = events.iter().find(|e| e["type"] == "gap").expect("a gap");
    assert!(gap["missed"].as_u64().unwrap() > 0, "{gap}");
    assert!(gap["id"].is_string());
    // After the gap, the log's order, to the last login.
    let after: Vec<u64> = events
        .iter()
        .skip_while(|e| e["type"] != "gap")
        .filter(|e| e["type"] == "online")
        .map(|e| e["uid"].as_u64().unwrap())
        .collect();
    assert!(after.windows(2).all(|w| w[0] < w[1]) && after.last() == Some(&60), "{after:?}");
    server.shutdown().await;
}

/// An `https://` receiver whose certificate chains to `--webhook-ca-file` is delivered to;
/// one the relay cannot trust gets nothing, and the refusals count as `tls`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn https_receivers_are_verified_against_the_system_roots_and_the_ca_file() {
    if !ready() || common::find_on_path(&["openssl"]).is_none() {
        return skip_without("node, standardwebhooks and openssl", INSTALL);
    }
    let dir = tempfile::tempdir().unwrap();
    let ca = common::tls::TestCa::new(dir.path());
    let (cert, key) = ca.leaf("receiver");
    let (newest, _, file) = secrets();
    std::fs::write(dir.path().join("secrets"), file).unwrap();
    let tls = [("TLS_CERT", cert.as_str()), ("TLS_KEY", key.as_str())];
    for trusted in [true, false] {
        let mut receiver = Receiver::start(0, &newest, &tls).await;
        let url = format!("https://localhost:{}/hook", receiver.port);
        let ca_file = trusted.then(|| std::path::PathBuf::from(&ca.cert));
        let mut server = TestServer::start(config(url, &dir.path().join("secrets"), |w| w.ca_file = ca_file)).await;
        let _client = login(&server, 1).await;
        if trusted {
            let requests = receiver.until(is("user_online", 1)).await;
            assert!(requests.iter().all(|r| r["verified"] == true));
        } else {
            eventually(&server, "idlegate_webhook_requests_total{result=\"tls\"}", |v| v >= 2.0).await;
            eventually(&server, "idlegate_webhook_requests_total{result=\"ok\"}", |v| v == 0.0).await;
        }
        server.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_delivers_the_offline_events_it_causes() {
    if !ready() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (newest, _, file) = secrets();
    std::fs::write(dir.path().join("secrets"), file).unwrap();
    let mut receiver = Receiver::start(0, &newest, &[]).await;
    let url = format!("http://127.0.0.1:{}/hook", receiver.port);
    let mut server = TestServer::start(config(url, &dir.path().join("secrets"), |_| {})).await;
    let _a = login(&server, 1).await;
    let _b = login(&server, 2).await;
    receiver.until(is("user_online", 2)).await;
    server.shutdown().await;
    let requests = receiver.until(|e| e["type"] == "user_offline" && e["reason"] == "shutdown" && e["uid"] == 2).await;
    let ended: Vec<Value> = delivered(&requests).into_iter().filter(|e| e["type"] == "offline").collect();
    assert_eq!(ended.len(), 2, "{ended:?}");
    assert!(ended.iter().all(|e| e["reason"] == "shutdown"));
}

/// Nothing listens at the receiver's port for a while (connections refused, counted as
/// `connect`); once the receiver comes up there, everything arrives, in order, the first
/// batch being the one refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_receiver_that_refuses_connections_a_while_then_gets_everything_in_order() {
    if !ready() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (newest, _, file) = secrets();
    std::fs::write(dir.path().join("secrets"), file).unwrap();
    // A port nothing listens on (as free as every test's loopback port is).
    let port = common::free_addr().port();
    let url = format!("http://127.0.0.1:{port}/hook");
    let mut server = TestServer::start(config(url, &dir.path().join("secrets"), |_| {})).await;
    let mut clients = Vec::new();
    for uid in 1..=5 {
        clients.push(login(&server, uid).await);
    }
    eventually(&server, "idlegate_webhook_requests_total{result=\"connect\"}", |v| v >= 2.0).await;
    let mut receiver = Receiver::start(port, &newest, &[]).await;
    let requests = receiver.until(is("user_online", 5)).await;
    let got = delivered(&requests);
    assert_eq!(got[0]["type"], "start", "{got:?}");
    let online: Vec<u64> = got.iter().filter(|e| e["type"] == "online").map(|e| e["uid"].as_u64().unwrap()).collect();
    assert_eq!(online, [1, 2, 3, 4, 5]);
    assert!(requests.iter().all(|r| r["verified"] == true));
    server.shutdown().await;
}

/// Issue 48: SIGHUP reads `--webhook-secret-file` again (docs/API.md's rotation without a
/// gap), and the logs show neither the URL's credentials nor its query string, while a
/// failed delivery's line says why it failed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_rereads_the_secrets_and_logs_keep_the_urls_credentials_out() {
    if !ready() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (newest, older, _) = secrets();
    let file = dir.path().join("secrets");
    std::fs::write(&file, format!("{older}\n")).unwrap();
    let file = file.to_string_lossy().to_string();
    let mut receiver = Receiver::start(0, &newest, &[]).await;
    let url = format!("http://user:s3cret@127.0.0.1:{}/hook?token=t0ken", receiver.port);
    let gw = common::process::GatewayProcess::start(&["--webhook-url", &url, "--webhook-secret-file", &file]).await;
    let mut first = common::Client::connect(gw.listen).await;
    first.login(1).await;
    let before = receiver.until(is("user_online", 1)).await;
    assert!(before.iter().all(|r| r["verified"] == false), "signed with the older secret only");
    // The newest secret is added, and the gateway told.
    std::fs::write(&file, format!("{newest}\n{older}\n")).unwrap();
    gw.signal("HUP");
    gw.wait_log("webhook secrets read again").await;
    let mut second = common::Client::connect(gw.listen).await;
    second.login(2).await;
    let after = receiver.until(is("user_online", 2)).await;
    assert!(after.iter().all(|r| r["verified"] == true), "{after:?}");

    // A receiver that refuses connections: the log says so, without the secrets.
    let closed = common::free_addr().port();
    let url = format!("http://user:s3cret@127.0.0.1:{closed}/hook?token=t0ken");
    let failing =
        common::process::GatewayProcess::start(&["--webhook-url", &url, "--webhook-secret-file", &file]).await;
    failing.wait_log("delivery failing").await;
    let log = [gw.log(), failing.log()].concat();
    assert!(log.to_lowercase().contains("connection refused"), "{log}");
    assert!(!log.contains("s3cret") && !log.contains("t0ken"), "{log}");
}
