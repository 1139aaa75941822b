//! Gateways in a cluster for the tests: a config for loopback, gateways started on one
//! Redis, and the small waits and API calls every cluster test makes.

use std::future::Future;
use std::time::Duration;

use idlegate::{Config, RedisTarget};
use serde_json::Value;

use super::{free_addr, http, http_get, wait_listening, TestServer, PATIENCE};

pub fn cluster_config(url: &str, node: &str) -> Config {
    Config {
        timeout: Duration::from_secs(10),
        tick: Duration::from_millis(100),
        login_timeout: Duration::from_secs(2),
        max_connections: 1_000,
        drain_timeout: Duration::from_secs(2),
        node_id: node.into(),
        redis: Some(RedisTarget::parse(url, false).unwrap()),
        node_lease: Duration::from_secs(1),
        ..Config::default()
    }
}

pub async fn gateways(url: &str, names: &[&str]) -> Vec<TestServer> {
    gateways_with(url, names, Duration::from_secs(10)).await
}

pub async fn gateways_with(url: &str, names: &[&str], timeout: Duration) -> Vec<TestServer> {
    let mut out = Vec::new();
    for name in names {
        let gw = TestServer::start(Config { timeout, ..cluster_config(url, name) }).await;
        wait_ready(&gw).await;
        out.push(gw);
    }
    out
}

/// Waits until the gateway says ready (connected to Redis).
pub async fn wait_ready(gw: &TestServer) {
    eventually("the gateway connects to Redis", || async { gw.admin_get("/readyz").await.1 == "ready\n" }).await;
}

/// Polls `check` until it holds; panics after [`PATIENCE`].
pub async fn eventually<F, Fut>(what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while !check().await {
        assert!(tokio::time::Instant::now() < deadline, "timed out waiting until {what}");
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

pub async fn api_json(gw: &TestServer, method: &str, path: &str, body: &str) -> (u16, Value) {
    let (status, text) = http(gw.api, method, path, &[], body).await;
    (status, serde_json::from_str(&text).unwrap_or(Value::Null))
}

pub async fn presence(gw: &TestServer, uid: u64) -> Value {
    api_json(gw, "GET", &format!("/v1/presence/{uid}"), "").await.1
}

/// Node b as a process of its own, so it can die without a goodbye, with `extra` flags;
/// returns it, ready in the cluster, and its client address.
pub async fn node_b_process(redis: &str, extra: &[&str]) -> (std::process::Child, std::net::SocketAddr) {
    let (listen, admin, api) = (free_addr(), free_addr(), free_addr());
    let b = std::process::Command::new(env!("CARGO_BIN_EXE_idlegate"))
        .args(["serve", "--node-id", "b", "--redis", redis, "--node-lease", "1s", "--tick", "100ms"])
        .args(["--listen", &listen.to_string(), "--admin-listen", &admin.to_string()])
        .args(["--api-listen", &api.to_string()])
        .args(extra)
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    wait_listening(admin).await;
    eventually("node b connects to Redis", || async { http_get(admin, "/readyz").await.1 == "ready\n" }).await;
    (b, listen)
}
