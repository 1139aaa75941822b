//! Readiness that tells the truth about Redis (Debian's `redis-server`, on loopback): a
//! node whose `--redis` credentials are refused, or whose ACL user may not run what the
//! gateway needs, answers `/readyz` 503 with the reason and logs a refusal at error level
//! without waiting out a timeout; a node that cannot reach Redis (an outage every node
//! sees) stays ready, serving alone, and says so; each failure is counted by kind in
//! `idlegate_redis_errors_total{kind}`; with the right credentials it is ready.

mod common;

use common::cluster::{cluster_config, eventually};
use common::redis::RedisServer;
use common::{free_addr, TestServer};

/// `/readyz` of `gw` once it says `want` at the start of its body.
async fn readiness(gw: &TestServer, want: &str) -> (u16, String) {
    eventually(&format!("/readyz says {want:?}"), || async { gw.admin_get("/readyz").await.1.starts_with(want) }).await;
    gw.admin_get("/readyz").await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_password_or_acl_says_not_ready_and_an_unreachable_redis_keeps_the_node_ready() {
    let Some(redis) = RedisServer::start().await else { return };
    let addr = redis.url().trim_start_matches("redis://").to_string();
    // An ACL user for the gateway, and one that may only ping.
    redis.cli(&["ACL", "SETUSER", "gateway", "on", ">right-password", "~*", "&*", "+@all"]);
    redis.cli(&[
        "ACL",
        "SETUSER",
        "pinger",
        "on",
        ">pinger-password",
        "~*",
        "-@all",
        "+ping",
        "+hello",
        "+client",
        "+auth",
    ]);

    let wrong = TestServer::start(cluster_config(&format!("redis://gateway:wrong@{addr}"), "wrong")).await;
    let (status, body) = readiness(&wrong, "not ready: Redis refused the credentials in --redis").await;
    assert_eq!(status, 503, "{body}");
    assert!(!body.contains("wrong"), "the password is never said: {body}");
    assert!(wrong.metrics.redis_error_count("auth") > 0);
    assert_eq!(wrong.metrics.redis_error_count("unreachable"), 0, "a refusal is not an outage");

    let weak = TestServer::start(cluster_config(&format!("redis://pinger:pinger-password@{addr}"), "weak")).await;
    let (status, body) =
        readiness(&weak, "not ready: Redis refused a command to the user in --redis (ACL: NOPERM)").await;
    assert_eq!(status, 503, "{body}");
    assert!(weak.metrics.redis_error_count("permission") > 0);

    let nowhere = TestServer::start(cluster_config(&format!("redis://{}", free_addr()), "nowhere")).await;
    // Issue 48: with the one Redis down every node answered 503, and HAProxy refused every
    // new client, though the nodes serve clients without Redis.
    let (status, body) = readiness(&nowhere, "ready, alone: Redis unreachable (--redis)").await;
    assert_eq!(status, 200, "{body}");
    eventually("unreachable counted", || async { nowhere.metrics.redis_error_count("unreachable") > 0 }).await;

    let right = TestServer::start(cluster_config(&format!("redis://gateway:right-password@{addr}"), "right")).await;
    assert_eq!(readiness(&right, "ready").await.0, 200);
}
