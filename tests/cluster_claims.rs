//! `--jwt-claims-to-events` across a cluster: a session's claims ride in its `online` and in
//! whichever `offline` ends it, whoever writes that (its own node, a login on another node
//! taking its device over, the reaper of its dead node), and in presence answers asked of
//! another node. Tokens are PyJWT's (`tests/data/jwt/series.py`), Redis is Debian's.

mod common;

use std::time::Duration;

use common::cluster::*;
use common::jwt::{claims, mint};
use common::redis::RedisServer;
use common::*;
use idlegate::{Config, JwtAuth, JwtRules};
use idlegate_proto::Frame;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claims_ride_in_every_event_of_a_session_whoever_writes_it() {
    let dir = tempfile::tempdir().unwrap();
    let Some(tokens) = mint(dir.path(), 1, &[601, 602, 603]) else { return };
    let Some(redis) = RedisServer::start().await else { return };
    let secret = dir.path().join("secret.txt");
    let rules = JwtRules { claims_to_events: vec!["name".into(), "org".into()], ..JwtRules::default() };
    let jwt = JwtAuth::load(None, Some(&secret), rules).unwrap();
    let a = TestServer::start(Config { jwt: Some(jwt), ..cluster_config(&redis.url(), "a") }).await;
    wait_ready(&a).await;
    let secret = secret.display().to_string();
    let flags = ["--timeout", "10s", "--jwt-secret-file", &secret, "--jwt-claims-to-events", "name,org"];
    let (mut b, b_listen) = node_b_process(&redis.url(), &flags).await;
    let (_, mut sse) = Sse::open(a.api, "/v1/events?types=online,offline", &[]).await;

    let mut on_b = Vec::new();
    for uid in [601, 602, 603] {
        let mut client = Client::connect(b_listen).await;
        let welcome = client.login_with(uid, tokens[&uid][0].as_bytes()).await;
        assert!(matches!(welcome, Frame::Welcome { .. }), "{welcome:?}");
        let online = sse.expect("online", uid).await;
        assert_eq!((online.data["node"].as_str(), &online.data["claims"]), (Some("b"), &claims(uid)));
        on_b.push(client);
    }
    // Asked of node a, answered by node b through its inbox.
    eventually("a sees 601 on b", || async { presence(&a, 601).await["node"] == "b" }).await;
    assert_eq!(presence(&a, 601).await["sessions"][0]["claims"], claims(601));

    // 602 logs in again on a: the takeover's offline, written by the login's batch, has the
    // claims of b's session; the new session's online has its own.
    let mut again = Client::connect(a.addr).await;
    assert!(matches!(again.login_with(602, tokens[&602][0].as_bytes()).await, Frame::Welcome { .. }));
    let kicked = sse.expect("offline", 602).await;
    assert_eq!((kicked.data["reason"].as_str(), &kicked.data["claims"]), (Some("kicked"), &claims(602)));
    let back = sse.expect("online", 602).await;
    assert_eq!((back.data["node"].as_str(), &back.data["claims"]), (Some("a"), &claims(602)));

    // Node b dies: the reaper's node_lost offline events carry the claims.
    b.kill().unwrap();
    b.wait().unwrap();
    for uid in [601, 603] {
        let lost = sse.expect("offline", uid).await;
        assert_eq!((lost.data["reason"].as_str(), &lost.data["claims"]), (Some("node_lost"), &claims(uid)));
    }
    // What Redis keeps of claims is the live sessions' alone: 602 on a.
    eventually("the reaper cleared b's keys", || async {
        redis.cli(&["KEYS", "{idlegate}:claims:*"]).lines().count() == 1
    })
    .await;
    drop(again);
    let gone = sse.expect("offline", 602).await;
    assert_eq!(gone.data["claims"], claims(602));
    tokio::time::sleep(Duration::from_millis(300)).await;
    let left = redis.cli(&["KEYS", "{idlegate}:claims:*"]);
    let held: usize = left.lines().map(|key| redis.cli(&["HLEN", key]).trim().parse::<usize>().unwrap_or(0)).sum();
    assert_eq!(held, 0, "claims of ended sessions are deleted with them: {left}");
}
