//! The offline grace (`--offline-grace`) over real sockets: what the event stream and the
//! presence answers say while a uid is in its grace, after a reconnect within it, and once
//! it runs out; alone, and in a cluster on real Redis, where the grace outlives a node
//! killed with SIGKILL and a login on another node cancels it. (The exact ticks are tested
//! under paused time in `src/presence/ticker/grace_tests.rs`.)

mod common;

use std::time::Duration;

use common::cluster::{api_json, cluster_config, eventually, node_b_process, presence, wait_ready};
use common::redis::{assert_paired, RedisServer};
use common::{Client, Sse, TestServer};
use idlegate::Config;
use idlegate_proto::Frame;
use serde_json::{json, Value};

const TICK: Duration = Duration::from_millis(100);
const GRACE: Duration = Duration::from_secs(1);

fn alone() -> Config {
    Config { node_id: "solo".into(), tick: TICK, offline_grace: GRACE, ..Config::default() }
}

/// The next `event` about `uid`, past any other.
async fn until(sse: &mut Sse, event: &str, uid: u64) -> common::SseEvent {
    loop {
        let got = sse.next().await.expect("an event");
        if got.event == event && got.data["uid"].as_u64() == Some(uid) {
            return got;
        }
    }
}

/// The next event that is not about `uid`'s sessions: a user event (or another uid's).
async fn next_user_event(sse: &mut Sse) -> common::SseEvent {
    loop {
        let event = sse.next().await.expect("an event");
        if event.event.starts_with("user_") {
            return event;
        }
    }
}

#[tokio::test]
async fn alone_a_uid_in_its_grace_is_online_without_sessions_and_its_user_offline_says_when_it_ended() {
    let server = TestServer::start(alone()).await;
    let (_, mut sse) = Sse::open(server.api, "/v1/events", &[]).await;
    let mut c = server.client().await;
    c.login(5).await;
    sse.expect("online", 5).await;
    sse.expect("user_online", 5).await;
    // A disconnect: abrupt, so a reconnect is likely and the grace holds the uid.
    drop(c);
    let offline = sse.expect("offline", 5).await;
    assert_eq!(offline.data["reason"], "disconnect");

    // In its grace: online as a user, no session, and when the grace ends.
    let (status, body) = api_json(&server, "GET", "/v1/presence/5", "").await;
    assert_eq!(status, 200);
    assert_eq!((body["online"].clone(), body["sessions"].clone()), (json!(true), json!([])), "{body}");
    let until = body["grace_until_ms"].as_u64().unwrap_or_else(|| panic!("no grace_until_ms: {body}"));
    let ended = offline.data["at_ms"].as_u64().unwrap();
    assert!(until >= ended + 900 && until <= ended + 1_100, "until {until}, ended {ended}");
    let query = api_json(&server, "POST", "/v1/presence/query", r#"{"uids":[5,6]}"#).await;
    assert_eq!(query, (200, json!({"online": [5], "offline": [6], "last_seen_ms": {}})));
    let online = api_json(&server, "GET", "/v1/online", "").await.1;
    assert_eq!(online["online"], 1, "{online}");

    // Back within the grace: its sessions' events only.
    let mut again = server.client().await;
    again.login(5).await;
    sse.expect("online", 5).await;
    drop(again);
    sse.expect("offline", 5).await;
    // Then the grace runs out: one user_offline, with the last session's reason and end.
    let user = sse.next().await.expect("an event");
    assert_eq!((user.event.as_str(), user.data["uid"].as_u64()), ("user_offline", Some(5)), "{user:?}");
    assert_eq!(user.data["reason"], "disconnect");
    let ended_ms = user.data["ended_ms"].as_u64().expect("ended_ms");
    let at_ms = user.data["at_ms"].as_u64().unwrap();
    assert!(at_ms >= ended_ms + 1_000, "the grace ran out {} ms after the ending", at_ms - ended_ms);
    // Offline, last seen when its last session ended, not when the grace ran out.
    assert_eq!(
        api_json(&server, "GET", "/v1/presence/5", "").await.1,
        json!({"uid": 5, "online": false, "sessions": [], "last_seen_ms": ended_ms})
    );
}

#[tokio::test]
async fn without_a_grace_user_offline_follows_at_once_and_ended_ms_is_its_own_time() {
    let server = TestServer::start(Config { tick: TICK, ..Config::default() }).await;
    let (_, mut sse) = Sse::open(server.api, "/v1/events", &[]).await;
    let mut c = server.client().await;
    c.login(8).await;
    c.send(Frame::Logout).await;
    sse.expect("online", 8).await;
    sse.expect("user_online", 8).await;
    sse.expect("offline", 8).await;
    let user = sse.expect("user_offline", 8).await;
    assert_eq!(user.data["ended_ms"], user.data["at_ms"], "{user:?}");
}

fn cluster_node(url: &str, node: &str) -> Config {
    Config { offline_grace: GRACE, ..cluster_config(url, node) }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_a_cluster_a_login_on_another_node_within_the_grace_is_no_user_event() {
    let Some(redis) = RedisServer::start().await else { return };
    let a = TestServer::start(cluster_node(&redis.url(), "a")).await;
    let b = TestServer::start(cluster_node(&redis.url(), "b")).await;
    wait_ready(&a).await;
    wait_ready(&b).await;
    let (_, mut sse) = Sse::open(a.api, "/v1/events", &[]).await;
    let mut on_a = a.client().await;
    on_a.login(11).await;
    sse.expect("online", 11).await;
    sse.expect("user_online", 11).await;
    drop(on_a);
    sse.expect("offline", 11).await;
    // Every node answers the same while the grace lasts.
    for gw in [&a, &b] {
        let body = presence(gw, 11).await;
        assert_eq!((body["online"].clone(), body["sessions"].clone()), (json!(true), json!([])), "{body}");
        assert!(body["grace_until_ms"].as_u64().is_some(), "{body}");
        let query = api_json(gw, "POST", "/v1/presence/query", r#"{"uids":[11]}"#).await.1;
        assert_eq!(query["online"], json!([11]));
        assert_eq!(api_json(gw, "GET", "/v1/online", "").await.1["online"], 1);
    }
    let mut on_b = b.client().await;
    on_b.login(11).await;
    let online = sse.expect("online", 11).await;
    assert_eq!(online.data["node"], "b");
    assert!(presence(&a, 11).await["grace_until_ms"].is_null());
    drop(on_b);
    sse.expect("offline", 11).await;
    let user = next_user_event(&mut sse).await;
    assert_eq!((user.event.as_str(), user.data["uid"].as_u64()), ("user_offline", Some(11)), "{user:?}");
    assert_eq!(user.data["reason"], "disconnect");
    assert!(user.data["at_ms"].as_u64() >= user.data["ended_ms"].as_u64().map(|e| e + 900));
    let events = redis.events();
    assert_eq!(events.iter().filter(|e| e.kind.starts_with("user_")).count(), 2, "{events:#?}");
    assert_paired(&events);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_a_cluster_the_grace_outlives_the_node_killed_while_it_held_it() {
    let Some(redis) = RedisServer::start().await else { return };
    let a = TestServer::start(cluster_node(&redis.url(), "a")).await;
    wait_ready(&a).await;
    let (_, mut sse) = Sse::open(a.api, "/v1/events", &[]).await;
    let (mut b, listen) = node_b_process(&redis.url(), &["--offline-grace", "1s"]).await;
    // uid 21 left b just before b died: its grace began there. uid 22 was still on b:
    // node_lost, then a grace of its own.
    let mut gone = Client::connect(listen).await;
    gone.login(21).await;
    let mut lost = Client::connect(listen).await;
    lost.login(22).await;
    drop(gone);
    let mut ended = 0;
    while ended < 1 {
        let event = sse.next().await.expect("an event");
        ended += usize::from(event.event == "offline");
    }
    b.kill().unwrap();
    b.wait().unwrap();
    let mut users: Vec<Value> = Vec::new();
    while users.iter().filter(|e| e["type"] == "user_offline").count() < 2 {
        let event = sse.next().await.expect("an event");
        if event.event == "offline" {
            assert_eq!((event.data["uid"].as_u64(), &event.data["reason"]), (Some(22), &json!("node_lost")));
            // node_lost began uid 22's grace: every node answers it, from Redis.
            let body = presence(&a, 22).await;
            assert!(body["grace_until_ms"].as_u64().is_some() || body["online"] == false, "{body}");
        }
        if event.event.starts_with("user_") {
            let mut data = event.data.clone();
            data["type"] = event.event.clone().into();
            users.push(data);
        }
    }
    let reasons: Vec<(u64, String)> =
        users.iter().map(|u| (u["uid"].as_u64().unwrap(), u["reason"].as_str().unwrap().to_string())).collect();
    assert!(reasons.contains(&(21, "disconnect".into())) && reasons.contains(&(22, "node_lost".into())), "{users:?}");
    for u in &users {
        assert_eq!(u["type"], "user_offline", "{users:?}");
        assert!(u["at_ms"].as_u64() >= u["ended_ms"].as_u64().map(|e| e + 900), "{u}");
    }
    // Exactly once, whatever the surviving node's ticks saw.
    tokio::time::sleep(GRACE * 2).await;
    let events = redis.events();
    assert_eq!(events.iter().filter(|e| e.kind == "user_offline").count(), 2, "{events:#?}");
    assert_paired(&events);
    eventually("no uid is left in its grace", || async { redis.cli(&["ZCARD", "{idlegate}:grace"]).trim() == "0" })
        .await;
}

/// Issue 48: a uid kicked through the API stayed online for the whole grace. Endings
/// someone chose (a logout, a kick; an expired token likewise) log `user_offline` at once,
/// alone and in a cluster, with their reason; abrupt ones stay graced (the tests above).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_logout_or_a_kick_ends_the_users_presence_at_once_alone_and_in_a_cluster() {
    let alone = TestServer::start(Config { offline_grace: Duration::from_secs(30), ..alone() }).await;
    let Some(redis) = RedisServer::start().await else { return };
    let node = Config { offline_grace: Duration::from_secs(30), ..cluster_config(&redis.url(), "a") };
    let clustered = TestServer::start(node).await;
    wait_ready(&clustered).await;
    for server in [&alone, &clustered] {
        let (_, mut sse) = Sse::open(server.api, "/v1/events", &[]).await;
        let mut leaving = server.client().await;
        leaving.login(31).await;
        let mut kicked = server.client().await;
        kicked.login(32).await;
        until(&mut sse, "user_online", 31).await;
        until(&mut sse, "user_online", 32).await;
        leaving.send(Frame::Logout).await;
        let user = until(&mut sse, "user_offline", 31).await;
        assert_eq!(user.data["reason"], "logout", "{user:?}");
        // At once: logged when the ending reached the log (in a cluster, by Redis's clock).
        let (ended, at) = (user.data["ended_ms"].as_u64().unwrap(), user.data["at_ms"].as_u64().unwrap());
        assert!(at >= ended && at < ended + 5_000, "not graced: ended {ended}, logged {at}");
        let (status, _) = api_json(server, "DELETE", "/v1/sessions/32", "").await;
        assert!(status < 300, "kick: {status}");
        let user = until(&mut sse, "user_offline", 32).await;
        assert_eq!(user.data["reason"], "kicked", "{user:?}");
        for uid in [31, 32] {
            let body = api_json(server, "GET", &format!("/v1/presence/{uid}"), "").await.1;
            assert_eq!(body["online"], false, "{body}");
            assert!(body["grace_until_ms"].is_null(), "{body}");
        }
    }
}

/// Issue 48, defect 2: user events were stamped with the nodes' clocks but ordered by when
/// they reached Redis. A uid dropped on `a` and logged in on `b` 0.5 s later, while `b`'s
/// link to Redis carried nothing for 3 s: the stream got `user_offline` at +2.0 s (the grace
/// ran out by Redis's clock), then `user_online` stamped +0.5 s, back in time. User events
/// are now stamped with their place in the stream: a uid's `at_ms` never decreases. Nor is
/// the late `online` stamped before the `user_offline` ahead of it (issue 49, promise 3):
/// it keeps the time `b` saw the login unless that is earlier, and here it is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_a_cluster_a_uids_user_events_never_go_back_in_time_when_a_nodes_writes_lag() {
    let Some(redis) = RedisServer::start().await else { return };
    let proxy = common::proxy::Proxy::start(redis.addr).await.unwrap();
    let node = |url: &str, name: &str| Config {
        offline_grace: Duration::from_secs(2),
        node_lease: Duration::from_secs(10),
        ..cluster_config(url, name)
    };
    let a = TestServer::start(node(&redis.url(), "a")).await;
    let b = TestServer::start(node(&proxy.url(), "b")).await;
    wait_ready(&a).await;
    wait_ready(&b).await;
    let (_, mut sse) = Sse::open(a.api, "/v1/events", &[]).await;
    let mut on_a = a.client().await;
    on_a.login(41).await;
    until(&mut sse, "user_online", 41).await;
    // b's link goes quiet; the uid drops on a and comes back on b half a second later.
    proxy.pause();
    drop(on_a);
    until(&mut sse, "offline", 41).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let mut on_b = b.client().await;
    assert!(matches!(on_b.login(41).await, Frame::Welcome { .. }), "b welcomes without Redis");
    let saw_login = common::unix_ms();
    tokio::time::sleep(Duration::from_secs(3)).await;
    proxy.resume();
    let back = until(&mut sse, "online", 41).await;
    let since = back.data["at_ms"].as_u64().unwrap();
    assert!(since >= saw_login, "the online is stamped before b saw the login: {since} vs {saw_login}");
    on_b.send(Frame::Logout).await;
    until(&mut sse, "offline", 41).await;
    eventually("the uid's last user event is logged", || async {
        redis.events().iter().filter(|e| e.uid == 41 && e.kind.starts_with("user_")).count() >= 4
    })
    .await;
    let users: Vec<(String, u64)> = redis
        .events()
        .into_iter()
        .filter(|e| e.uid == 41 && e.kind.starts_with("user_"))
        .map(|e| (e.kind.clone(), e.at_ms))
        .collect();
    let kinds: Vec<&str> = users.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(kinds, ["user_online", "user_offline", "user_online", "user_offline"], "{users:?}");
    assert!(users.windows(2).all(|w| w[0].1 <= w[1].1), "a user event went back in time: {users:?}");
    assert!(since >= users[1].1, "the online ({since}) is stamped before the user_offline ahead of it: {users:?}");
}
